//! Macro diagnostics (trybuild): one topic per file in tests/ui, `.stderr` blessed with
//! `TRYBUILD=overwrite cargo test --test ui` and read by a person.

#[test]
fn ui() {
    // What build.rs would set for a graph named `stale_graph` it compiled from other source.
    std::env::set_var("AUTOFUSION_GRAPH_STALE_GRAPH", "0000000000000000");
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
