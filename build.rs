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
    // An ONNX model built into the tests as a module (`Builder::onnx`): the seed layer as
    // onnxruntime's peer script exports it.
    let onnx = "autofusion-onnx/tests/fixtures/seed_d32.onnx";
    if !files.is_empty() {
        let mut b = autofusion_build::Builder::new();
        b.files(files);
        if std::path::Path::new(onnx).exists() {
            b.onnx(onnx, "seed_onnx");
        }
        b.compile("autofusion_examples");
    }
}
