//! The tiny random Llama (`tests/fixtures/make_tiny_llama.py`) on our kernels against what
//! transformers computed (`tiny_llama_logits.json`): the logits of every prompt position after
//! a prefill, then a greedy decode of 16 tokens step by step, the same tokens and every step's
//! logits within 1e-4 of the largest |logit| (f32), loaded from the Hugging Face files and from
//! the GGUF conversion, fused and at opt_level 0.

use autofusion::Session;
use llama_generate::{Exec, Model, Weights};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let diff = got.iter().zip(want).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(diff <= 1e-4 * scale, "{what}: max |difference| {diff} against max |logit| {scale}");
}

fn argmax(v: &[f32]) -> i64 {
    v.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as i64
}

#[test]
fn prompt_and_greedy_decode_match_transformers_from_both_formats() {
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny_llama_logits.json")).unwrap(),
    )
    .unwrap();
    let prompt: Vec<i64> =
        want["prompt"].as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect();
    let prompt_logits: Vec<f32> =
        want["prompt_logits"].as_array().unwrap().iter().flat_map(floats).collect();
    let steps = want["steps"].as_array().unwrap();
    let sources = [
        ("hf", Weights::from_hf_dir(&fixtures().join("tiny_llama")).unwrap()),
        ("gguf", Weights::from_gguf(&fixtures().join("tiny_llama.gguf")).unwrap()),
    ];
    for (format, weights) in &sources {
        let model = Model::new(weights, 64).unwrap();
        for exec in [Exec::Fused, Exec::Unfused] {
            let dec = model.decoder(exec).unwrap();
            let mut s = Session::new(&dec, model.max_len).unwrap();
            let at = format!("{format}, {exec:?}");
            let logits = s.prefill(&prompt).unwrap().to_f32_vec();
            close(&format!("{at}: prompt logits"), &logits, &prompt_logits);
            let v = weights.config.vocab;
            let mut next = argmax(&logits[logits.len() - v..]);
            for (i, step) in steps.iter().enumerate() {
                assert_eq!(next, step["id"].as_i64().unwrap(), "{at}: greedy token {i}");
                let logits = s.step(next).unwrap().to_f32_vec();
                close(&format!("{at}: step {i}"), &logits, &floats(&step["logits"]));
                next = argmax(&logits);
            }
        }
    }
}
