//! bert_embed's sentences per second at batch 1, 8 and 32: the fused build, the opt_level 0
//! build and onnxruntime (the model's ONNX export, every graph optimisation, the same thread
//! count) side by side, round by round, on the same token ids.
//!
//!     pip install -r peers/requirements.txt        # numpy, onnx, onnxruntime
//!     pip install torch transformers               # once, to export the model to ONNX
//!     cargo bench -p bert_embed                    # [-- --quick] [--no-ort]
//!
//! The work: the ten sentences of tests/fixtures/bert_embed repeated to 32 (three of them
//! 256 tokens long, the rest 3 to 14), sorted by length and cut into batches as
//! `Encoder::embed` does, so every side pads alike. Tokenization is outside the timing (the
//! same ids go to every side); mean pooling and normalisation are inside (onnxruntime's in
//! numpy). The sides take turns at going first in a round, and whichever of ours follows
//! onnxruntime (and the pause that lets its workers sleep) first runs untimed for 20 ms: a core
//! that has just slept runs slowly for a while. Each line gives medians over the
//! rounds and the ratios of those medians; each side's embeddings are checked against
//! transformers' (fixture) first.
//! The model: all-MiniLM-L6-v2 (`AUTOFUSION_MINILM_DIR`, else fetched into
//! target/models); its export `target/models/all-MiniLM-L6-v2.onnx` is made by
//! peers/export_bert_onnx.py when missing (it needs torch; without it onnxruntime is not run,
//! and the bench says so). `PYTHON` picks the interpreter (default python3).

use autofusion::machine::{cpu_features_line, cpu_model, isa_level};
use bert_embed::{Encoder, Exec, Padded};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

const SENTENCES: usize = 32;
const BATCHES: [usize; 3] = [1, 8, 32];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("AUTOFUSION_MINILM_DIR") {
        return d.into();
    }
    let dir = workspace().join("target/models/all-MiniLM-L6-v2");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fetch_model.py");
    let ok = Command::new(python()).arg(script).arg(&dir).status().is_ok_and(|s| s.success());
    assert!(ok, "cannot fetch all-MiniLM-L6-v2 into {} (set AUTOFUSION_MINILM_DIR)", dir.display());
    dir
}

/// `peers/ort_bert_embed.py serve` on the model's ONNX export.
struct Ort {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    version: String,
}

impl Ort {
    fn start(model: &Path, threads: usize) -> Result<Ort, String> {
        let onnx = model.with_extension("onnx");
        if !onnx.exists() {
            let export = workspace().join("peers/export_bert_onnx.py");
            let out = Command::new(python())
                .arg(&export)
                .arg(model)
                .arg(&onnx)
                .output()
                .map_err(|e| format!("cannot run {}: {e}", python()))?;
            if !out.status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
                return Err(format!(
                    "no ONNX export ({} failed: {last}; it needs torch and transformers)",
                    export.display()
                ));
            }
        }
        let mut child = Command::new(python())
            .arg(workspace().join("peers/ort_bert_embed.py"))
            .args(["serve", "--model"])
            .arg(&onnx)
            .args(["--threads", &threads.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", python()))?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut ort = Ort { child, stdin, stdout, version: String::new() };
        let hello = ort.read()?;
        ort.version = hello["onnxruntime"].as_str().unwrap_or("?").to_string();
        Ok(ort)
    }

    fn read(&mut self) -> Result<serde_json::Value, String> {
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.is_empty() {
            return Err(
                "the onnxruntime peer exited (pip install -r peers/requirements.txt)".into()
            );
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("bad reply `{line}`: {e}"))?;
        match v.get("error") {
            Some(e) => Err(format!("onnxruntime peer: {e}")),
            None => Ok(v),
        }
    }

    fn ask(&mut self, cmd: &str) -> Result<serde_json::Value, String> {
        writeln!(self.stdin, "{cmd}").map_err(|e| e.to_string())?;
        self.stdin.flush().map_err(|e| e.to_string())?;
        self.read()
    }

    /// Hand over the batches (padded ids and masks); returns onnxruntime's embeddings of all.
    fn input(&mut self, batches: &[Padded], path: &Path) -> Result<Vec<f32>, String> {
        let json: Vec<serde_json::Value> = batches
            .iter()
            .map(|p| serde_json::json!({ "ids": rows(p, &p.ids), "mask": rows(p, &p.mask) }))
            .collect();
        std::fs::write(path, serde_json::Value::from(json).to_string())
            .map_err(|e| e.to_string())?;
        self.ask(&format!("input {}", path.display()))?;
        let out = std::fs::read(format!("{}.out", path.display())).map_err(|e| e.to_string())?;
        Ok(out.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
    }

    fn time_round(&mut self) -> Result<f64, String> {
        let v = self.ask("time 1")?;
        v["times_ms"][0].as_f64().map(|ms| ms / 1e3).ok_or_else(|| format!("bad reply {v}"))
    }
}

impl Drop for Ort {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}

/// A padded batch's rows as JSON lists, for the onnxruntime peer.
fn rows(p: &Padded, v: &[i64]) -> Vec<Vec<i64>> {
    v.chunks(p.len.max(1)).map(<[i64]>::to_vec).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "embedding counts differ");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 9 };
    let threads = autofusion::threads();
    let model = model_dir();
    let encoder = Encoder::load(&model, 256).expect("the model loads");
    let c = &encoder.config;
    println!(
        "bert_embed: {} ({} layers, hidden {}, {} heads); {}, {threads} threads, matmul kernels {}",
        model.display(),
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        cpu_model(),
        isa_level()
    );
    println!("cpu features: {}", cpu_features_line());
    let fixture = workspace().join("tests/fixtures/bert_embed");
    let text = std::fs::read_to_string(fixture.join("sentences.txt")).expect("fixture sentences");
    let ten: Vec<&str> = text.lines().collect();
    let bytes = std::fs::read(fixture.join("embeddings.bin")).expect("fixture embeddings");
    let want10: Vec<f32> =
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    let d = c.hidden_size;
    // Sentence i of the work is fixture sentence i % 10; sorted longest first, as `embed` does.
    let mut order: Vec<usize> = (0..SENTENCES).collect();
    let tokens = encoder.tokenize(&order.iter().map(|&i| ten[i % 10]).collect::<Vec<_>>()).unwrap();
    order.sort_by_key(|&i| std::cmp::Reverse(tokens[i].0.len()));
    let want: Vec<f32> = order.iter().flat_map(|&i| want10[(i % 10) * d..][..d].to_vec()).collect();
    let total_tokens: usize = tokens.iter().map(|t| t.0.len()).sum();
    println!("work: {SENTENCES} sentences, {total_tokens} tokens; medians of {rounds} rounds");

    let mut ort = if args.iter().any(|a| a == "--no-ort") {
        None
    } else {
        match Ort::start(&model, threads) {
            Ok(o) => Some(o),
            Err(e) => {
                println!("onnxruntime: not run: {e}");
                None
            }
        }
    };
    let tmp = workspace().join("target/autofusion-bench");
    std::fs::create_dir_all(&tmp).expect("target dir writable");
    let fused = Exec::Fused(autofusion::Device::Cpu);
    for batch in BATCHES {
        let chunks: Vec<Vec<&(Vec<i64>, Vec<i64>)>> =
            order.chunks(batch).map(|ch| ch.iter().map(|&i| &tokens[i]).collect()).collect();
        let run = |exec| -> Vec<f32> {
            chunks.iter().flat_map(|ch| encoder.embed_tokens(ch, exec).unwrap().concat()).collect()
        };
        let run_first = |exec| encoder.embed_tokens(&chunks[0], exec).unwrap();
        // Correctness first, each side against transformers.
        let (ef, e0) = (max_abs_diff(&run(fused), &want), max_abs_diff(&run(Exec::Unfused), &want));
        let mut ort_err = None;
        if let Some(o) = ort.as_mut() {
            let padded: Vec<Padded> = chunks.iter().map(|ch| Padded::new(ch)).collect();
            match o.input(&padded, &tmp.join(format!("bert_embed_b{batch}.json"))) {
                Ok(e) => ort_err = Some(max_abs_diff(&e, &want)),
                Err(e) => println!("onnxruntime failed: {e}"),
            }
        }
        let (mut tf, mut t0, mut to) = (Vec::new(), Vec::new(), Vec::new());
        // The three sides take turns at going first: each leaves its weights in the shared
        // cache for the next (fused and opt0 even share their packed weights), so a fixed order
        // would favour whichever side always follows the other of our two builds.
        let mut warm_up = false;
        for round in 0..rounds {
            for side in (0..3).map(|k| (k + round) % 3) {
                let (exec, times) = match side {
                    0 => (fused, &mut tf),
                    1 => (Exec::Unfused, &mut t0),
                    _ => {
                        if ort_err.is_some() {
                            if let Some(Ok(s)) = ort.as_mut().map(Ort::time_round) {
                                to.push(s);
                            }
                            // Let onnxruntime's spinning workers go to sleep before our next run.
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            warm_up = true;
                        }
                        continue;
                    }
                };
                if warm_up {
                    // Untimed runs first: a core that has just slept runs slowly for a while,
                    // and without them whichever of our sides follows onnxruntime pays for it.
                    let w = Instant::now();
                    while w.elapsed().as_secs_f64() < 0.02 {
                        std::hint::black_box(run_first(exec));
                    }
                    warm_up = false;
                }
                let t = Instant::now();
                std::hint::black_box(run(exec));
                times.push(t.elapsed().as_secs_f64());
            }
        }
        let per_s = |v: &[f64]| SENTENCES as f64 / median(v);
        let (f, o0) = (per_s(&tf), per_s(&t0));
        let ort_part = match (to.is_empty(), ort_err) {
            (false, Some(e)) => {
                let o = per_s(&to);
                format!(
                    ", onnxruntime {o:.1}; fused/opt0 {:.2}x, fused/onnxruntime {:.2}x; max |emb - transformers| fused {ef:.1e}, opt0 {e0:.1e}, onnxruntime {e:.1e}",
                    f / o0,
                    f / o
                )
            }
            _ => format!(
                "; fused/opt0 {:.2}x; max |emb - transformers| fused {ef:.1e}, opt0 {e0:.1e} (onnxruntime not run)",
                f / o0
            ),
        };
        println!("bert_embed batch {batch}: sentences/s fused {f:.1}, opt0 {o0:.1}{ort_part}");
    }
    println!("packed weight copies alive: {:.1} MB", autofusion::packs::live_bytes() as f64 / 1e6);
    if let Some(o) = &ort {
        println!("(onnxruntime {}, {threads} intra-op threads, ORT_ENABLE_ALL)", o.version);
    }
}
