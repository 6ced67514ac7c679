//! Any bytes as an ONNX model file: loading and importing (partially, as the command does)
//! either succeeds or returns an error; a panic, an abort or an out-of-memory is a bug.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The loader maps a file (tensor data are slices of the mapping): give it one.
    let path = std::env::temp_dir().join(format!("autofusion-fuzz-{}.onnx", std::process::id()));
    if std::fs::write(&path, data).is_err() {
        return;
    }
    if let Ok(model) = autofusion_onnx::load(&path) {
        let _ = autofusion_onnx::import_partial(&model, "fuzz");
    }
});
