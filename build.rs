//! Compiles the fused graphs of this package's own examples, tests and benches, and only for
//! them: they turn on the `test-graphs` feature through the self dev-dependency in Cargo.toml,
//! which cargo never enables for a crate that depends on autofusion. For users this build
//! script does nothing.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_TEST_GRAPHS").is_none() {
        return;
    }
    let files: Vec<&str> =
        ["examples/seed_layer.rs", "tests/layers/mod.rs", "tests/decoder_graphs/dsl.rs"]
            .into_iter()
            .filter(|f| std::path::Path::new(f).exists())
            .collect();
    // ONNX models built into the tests as modules (`Builder::onnx`): the seed layer as
    // onnxruntime's peer script exports it, and two whole models.
    // Whole Hugging Face models with int64 inputs, as torch.onnx exports them
    // (autofusion-onnx/tests/fixtures/export_torch.py): BERT by the dynamo exporter, Llama by
    // the TorchScript one.
    let models = [
        ("autofusion-onnx/tests/fixtures/seed_d32.onnx", "seed_onnx"),
        ("autofusion-onnx/tests/fixtures/bert_model_dy.onnx", "bert_onnx"),
        ("autofusion-onnx/tests/fixtures/llama_model_ts.onnx", "llama_onnx"),
    ];
    if !files.is_empty() {
        let mut b = autofusion_build::Builder::new();
        b.files(files);
        for (model, name) in models {
            if std::path::Path::new(model).exists() {
                b.onnx(model, name);
            }
        }
        b.compile("autofusion_examples");
    }
}
