//! The `llama_generate` command on the tiny Llama: greedy text from its Hugging Face files and
//! from its GGUF is the text of the tokens transformers chose (`tiny_llama_logits.json`),
//! `--dump-logits` writes the last prompt position's logits, seeded sampling repeats, and bad
//! input is one readable error line and a non-zero exit.

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_llama_generate")).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn want() -> serde_json::Value {
    serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny_llama_logits.json")).unwrap(),
    )
    .unwrap()
}

/// Reads a 1-d little-endian f32 `.npy`.
fn read_npy(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..8], b"\x93NUMPY\x01\x00");
    let header_len = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = std::str::from_utf8(&b[10..10 + header_len]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    b[10 + header_len..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn greedy_text_is_transformers_tokens_from_both_formats() {
    let want = want();
    let prompt = want["prompt_text"].as_str().unwrap();
    let steps: Vec<u32> = want["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_u64().unwrap() as u32)
        .collect();
    // Generation stops at <|im_end|> (id 2); the text is what comes before it.
    let until_eos: Vec<u32> = steps.iter().copied().take_while(|&id| id != 2).collect();
    let tok = llama_generate::Tokenizer::from_hf_dir(&fixtures().join("tiny_llama")).unwrap();
    let text = tok.decode(&until_eos).unwrap();
    let v = want["prompt_logits"].as_array().unwrap();
    let last: Vec<f32> =
        v[v.len() - 1].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let scale = last.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    let dir = std::env::temp_dir().join(format!("llama_cli_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for model in [fixtures().join("tiny_llama"), fixtures().join("tiny_llama.gguf")] {
        for opt0 in [false, true] {
            let npy = dir.join("logits.npy");
            let (m, n) = (model.to_str().unwrap(), npy.to_str().unwrap());
            let mut args = vec![
                "--model",
                m,
                "--prompt",
                prompt,
                "--max-new-tokens",
                "16",
                "--dump-logits",
                n,
            ];
            if opt0 {
                args.push("--opt0");
            }
            let (ok, out, err) = run(&args);
            assert!(ok, "{m}: {err}");
            assert_eq!(out, format!("{text}\n"), "{m}, opt0 {opt0}");
            assert!(err.contains("tok/s"), "{err}");
            let got = read_npy(&npy);
            assert_eq!(got.len(), last.len());
            let diff = got.iter().zip(&last).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(diff <= 1e-4 * scale, "{m}: dumped logits off by {diff}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn seeded_sampling_repeats_and_chat_wraps_the_prompt() {
    let m = fixtures().join("tiny_llama");
    let m = m.to_str().unwrap();
    let args = [
        "--model",
        m,
        "--prompt",
        "Once",
        "--max-new-tokens",
        "12",
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
    ];
    let with_seed = |seed: &str| {
        let mut a = args.to_vec();
        a.extend(["--seed", seed]);
        let (ok, out, err) = run(&a);
        assert!(ok, "{err}");
        out
    };
    assert_eq!(with_seed("5"), with_seed("5"));
    let (ok, _, err) = run(&["--model", m, "--prompt", "hi", "--chat", "--max-new-tokens", "2"]);
    assert!(ok, "{err}");
    // The ChatML turn around "hi": <|im_start|>user, newline, hi, <|im_end|>, newline,
    // <|im_start|>assistant, newline.
    assert!(err.contains("prompt 1"), "{err}");
}

#[test]
fn bad_input_is_one_error_line_and_a_failure() {
    let m = fixtures().join("tiny_llama");
    let m = m.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--model", "/no/such/model.gguf", "--prompt", "x"], "/no/such/model.gguf"),
        (vec!["--model", m, "--prompt", "x", "--top-p", "0"], "top-p"),
        (vec!["--model", m, "--prompt", "x", "--temperature=-1"], "temperature"),
        (
            vec!["--model", m, "--prompt", "x", "--max-new-tokens", "1000"],
            "exceed the model's 128 positions",
        ),
        (vec!["--model", m, "--prompt", ""], "no tokens"),
        (vec!["--model", m], "--prompt"),
        (vec!["--model", m, "--prompt", "x", "--device", "gpu"], "`cpu` or `ascend:N`"),
        (vec!["--model", m, "--prompt", "x", "--device", "ascend:x"], "takes a number"),
    ];
    for (args, want) in cases {
        let (ok, _, err) = run(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
