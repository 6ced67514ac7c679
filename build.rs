//! Compiles the fused graphs of this package's own examples, tests and benches, and only for
//! them: they turn on the `test-graphs` feature through the self dev-dependency in Cargo.toml,
//! which cargo never enables for a crate that depends on autofusion. For users this build
//! script does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TEST_GRAPHS").is_none() {
        return;
    }
    let files: Vec<&str> = ["examples/seed_layer.rs", "tests/layers/mod.rs"]
        .into_iter()
        .filter(|f| std::path::Path::new(f).exists())
        .collect();
    if !files.is_empty() {
        autofusion_build::Builder::new().files(files).compile("autofusion_examples");
    }
}
