//! The tiny random Llama (`tests/fixtures/make_tiny_llama.py`) on our kernels against what
//! transformers computed (`tiny_llama_logits.json`): the logits of every prompt position after
//! a prefill, then a greedy decode of 16 tokens step by step, the same tokens and every step's
//! logits within 1e-4 of the largest |logit| (f32), loaded from the Hugging Face files and from
//! the GGUF conversion, fused and at opt_level 0 (and on the Ascend device with the `ascend`
//! feature). A prefill of S tokens gives the logits of S single steps, and sessions on 8
//! threads give what one thread gives, bit for bit.

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

/// The host builds, and with `--features ascend` the Ascend C kernels on device 0 (ascend-sim
/// without an NPU: `ASCEND_HOME_PATH=$PWD/ascend-sim cargo test -p llama_generate --features ascend`).
fn execs() -> Vec<Exec> {
    #[allow(unused_mut)]
    let mut e = vec![Exec::Fused, Exec::Unfused];
    #[cfg(feature = "ascend")]
    e.push(Exec::Ascend(0));
    e
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
        for exec in execs() {
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

fn tiny() -> Model {
    Model::new(&Weights::from_hf_dir(&fixtures().join("tiny_llama")).unwrap(), 64).unwrap()
}

#[test]
fn a_prefill_equals_single_steps() {
    let model = tiny();
    let ids: Vec<i64> = (0..23).map(|i| (i * 37 + 5) % 384).collect();
    let v = model.config.vocab;
    for exec in execs() {
        let dec = model.decoder(exec).unwrap();
        let mut whole = Session::new(&dec, model.max_len).unwrap();
        let all = whole.prefill(&ids).unwrap().to_f32_vec();
        let mut steps = Session::new(&dec, model.max_len).unwrap();
        for (i, &id) in ids.iter().enumerate() {
            let got = steps.step(id).unwrap().to_f32_vec();
            close(&format!("{exec:?}: position {i}"), &got, &all[i * v..(i + 1) * v]);
        }
        // Then both continue alike.
        let a = whole.step(7).unwrap().to_f32_vec();
        let b = steps.step(7).unwrap().to_f32_vec();
        close(&format!("{exec:?}: the step after"), &a, &b);
    }
}

#[test]
fn sessions_on_eight_threads_equal_serial() {
    let model = tiny();
    let dec = model.decoder(Exec::Fused).unwrap();
    // Each thread its own prompt length and tokens; each run alone first.
    let run = |t: usize| -> Vec<f32> {
        let mut s = Session::new(&dec, model.max_len).unwrap();
        let prompt: Vec<i64> = (0..3 + 2 * t).map(|i| ((i * 31 + t * 17) % 384) as i64).collect();
        let mut out = s.prefill_last(&prompt).unwrap().to_f32_vec();
        let mut next = argmax(&out);
        for _ in 0..10 {
            let l = s.step(next).unwrap().to_f32_vec();
            next = argmax(&l);
            out.extend(l);
        }
        out
    };
    let serial: Vec<Vec<f32>> = (0..8).map(run).collect();
    for _ in 0..3 {
        let parallel: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8).map(|t| s.spawn(move || run(t))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (t, (a, b)) in serial.iter().zip(&parallel).enumerate() {
            assert!(a == b, "thread {t}: logits differ from the serial run");
        }
    }
}
