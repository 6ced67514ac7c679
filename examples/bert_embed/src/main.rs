//! bert_embed: sentence embeddings from a BERT-family checkpoint on fused kernels.
//!
//!     cargo run --release -p bert_embed -- --model DIR [SENTENCES.txt | -] [--out emb.npy]
//!
//! Reads sentences one per line (from a file, or stdin), embeds them in batches and prints the
//! cosine-similarity matrix; `--out` writes the `[n, hidden]` f32 embeddings as `.npy`.

use autofusion::npy;
use bert_embed::{Encoder, Exec};
use clap::Parser;
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    about = "Sentence embeddings from a BERT-family checkpoint (config.json, model.safetensors, tokenizer.json) on fused kernels"
)]
struct Args {
    /// The model directory (all-MiniLM-L6-v2: `python3 examples/bert_embed/fetch_model.py DIR`).
    #[arg(long)]
    model: PathBuf,
    /// Sentences, one per line; `-` or nothing reads stdin.
    input: Option<PathBuf>,
    /// Write the embeddings, `[n, hidden]` f32, to this `.npy` file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Sentences per batch (padded to the longest in the batch).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..))]
    batch: u64,
    /// Tokens per sentence at most, [CLS] and [SEP] included (sentence-transformers uses 256).
    #[arg(long, default_value_t = 256)]
    max_tokens: usize,
    /// How the graphs run: `fused` (the build's fused kernels), `unfused` (opt_level 0) or
    /// `reference` (the interpreter; slow).
    #[arg(long, default_value = "fused", value_parser = ["fused", "unfused", "reference"])]
    exec: String,
    /// Where the fused kernels run: `cpu`, or `ascend:N` (NPU N; a build with `--features
    /// ascend`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Print the full similarity matrix even for many sentences.
    #[arg(long)]
    all: bool,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn read_sentences(input: Option<&PathBuf>) -> Result<Vec<String>, String> {
    let mut text = String::new();
    match input {
        Some(p) if p.as_os_str() != "-" => {
            text = std::fs::read_to_string(p)
                .map_err(|e| format!("{}: cannot read: {e}", p.display()))?
        }
        _ => {
            std::io::stdin().read_to_string(&mut text).map_err(|e| format!("stdin: {e}"))?;
        }
    }
    Ok(text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect())
}

fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let device = match args.device.split_once(':') {
        _ if args.device == "cpu" => autofusion::Device::Cpu,
        Some(("ascend", n)) => autofusion::Device::Ascend(
            n.parse()
                .map_err(|_| format!("--device {}: `ascend:N` takes a number", args.device))?,
        ),
        _ => return Err(format!("--device {}: `cpu` or `ascend:N`", args.device).into()),
    };
    let exec = match args.exec.as_str() {
        "unfused" => Exec::Unfused,
        "reference" => Exec::Reference,
        _ => Exec::Fused(device),
    };
    let sentences = read_sentences(args.input.as_ref())?;
    let t = Instant::now();
    let encoder = Encoder::load(&args.model, args.max_tokens)?;
    let c = &encoder.config;
    eprintln!(
        "{}: {} layers, hidden {}, {} heads, intermediate {}, vocab {} (loaded in {:.0} ms)",
        args.model.display(),
        c.num_hidden_layers,
        c.hidden_size,
        c.num_attention_heads,
        c.intermediate_size,
        c.vocab_size,
        t.elapsed().as_secs_f64() * 1e3
    );
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let t = Instant::now();
    let emb = encoder.embed(&refs, args.batch as usize, exec)?;
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "embedded {} sentences in {:.1} ms ({:.1} sentences/s; {} on {}, batch {}, {} threads)",
        emb.len(),
        secs * 1e3,
        emb.len() as f64 / secs.max(1e-9),
        args.exec,
        args.device,
        args.batch,
        autofusion::threads()
    );
    if let Some(out) = &args.out {
        let flat: Vec<f32> = emb.iter().flatten().copied().collect();
        npy::write_f32(out, &[emb.len(), c.hidden_size], &flat)
            .map_err(|e| format!("{}: cannot write: {e}", out.display()))?;
        eprintln!("wrote {} ({} x {} f32)", out.display(), emb.len(), c.hidden_size);
    }
    print_similarities(&emb, &sentences, args.all);
    Ok(())
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(1e-12)
}

/// The cosine-similarity matrix (up to 32 sentences, or `--all`); beyond that, each
/// sentence's nearest other sentence.
fn print_similarities(emb: &[Vec<f32>], sentences: &[String], all: bool) {
    let n = emb.len();
    if n <= 32 || all {
        println!("cosine similarity ({n} x {n}):");
        for (i, a) in emb.iter().enumerate() {
            let row: Vec<String> = emb.iter().map(|b| format!("{:6.3}", cosine(a, b))).collect();
            println!("{i:>4} {}", row.join(" "));
        }
        for (i, s) in sentences.iter().enumerate() {
            println!("{i:>4}: {}", s.chars().take(100).collect::<String>());
        }
        return;
    }
    println!("nearest sentence of each ({n} sentences; --all prints the matrix):");
    for (i, a) in emb.iter().enumerate() {
        let best = (0..n)
            .filter(|&j| j != i)
            .map(|j| (cosine(a, &emb[j]), j))
            .max_by(|x, y| x.0.total_cmp(&y.0));
        if let Some((c, j)) = best {
            println!("{i:>5} -> {j:>5} ({c:.3})");
        }
    }
}
