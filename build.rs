//! Compiles the fused graphs of this package's examples and tests. The published crate ships
//! neither (see `exclude` in Cargo.toml), so for users this build script does nothing.

fn main() {
    let files: Vec<&str> = ["examples/seed_layer.rs", "tests/layers/mod.rs"]
        .into_iter()
        .filter(|f| std::path::Path::new(f).exists())
        .collect();
    println!("cargo:rerun-if-changed=build.rs");
    if !files.is_empty() {
        autofusion_build::Builder::new().files(files).compile("autofusion_examples");
    }
}
