//! Text from a Llama-architecture checkpoint on fused kernels:
//!
//!     cargo run --release -p llama_generate -- --model DIR|FILE.gguf --prompt TEXT \
//!         [--chat] [--max-new-tokens N] [--temperature T --top-k K --top-p P --seed S] \
//!         [--dump-logits FILE.npy] [--opt0]
//!     cargo run --release -p llama_generate -- --model DIR|FILE.gguf --bench [--quick]
//!
//! Greedy unless a temperature is given. The text is streamed to stdout as it is produced;
//! the prefill and decode speeds go to stderr. `--dump-logits` writes the f32 logits of the
//! last prompt position. `--bench` prints the `llama` bench lines (prefill tokens/s at S 128
//! and 512, decode tokens/s with 0, 512 and 2048 tokens in the cache, fused against
//! opt_level 0) for the checkpoint given, so the same file can be timed in other tools.

use autofusion::machine::{cpu_features_line, cpu_model, isa_level, read_bandwidth};
use autofusion::session_bench::{decode_line, decode_tok_s, prefill_line, prefill_tok_s, warm};
use autofusion::Session;
use clap::Parser;
use llama_generate::sample::{Sampler, Sampling};
use llama_generate::{Exec, Model, TextStream, Tokenizer};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(
    about = "Text generation with a Llama-architecture checkpoint (Hugging Face files or GGUF) on fused kernels"
)]
struct Args {
    /// A Hugging Face checkpoint directory (config.json, model.safetensors or its shards,
    /// tokenizer.json) or a GGUF file.
    #[arg(long)]
    model: PathBuf,
    /// The text to continue.
    #[arg(long, required_unless_present = "bench")]
    prompt: Option<String>,
    /// Wrap the prompt as a user turn of a ChatML conversation (`<|im_start|>user ...`), as
    /// SmolLM2 / Qwen instruct models expect.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most (generation also stops at an end-of-sequence token).
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0: greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the fewest most likely tokens whose probability reaches P.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the f32 logits of the last prompt position (`[vocab]`) to this `.npy` file.
    #[arg(long)]
    dump_logits: Option<PathBuf>,
    /// Run the opt_level 0 build (one kernel per op) instead of the fused one.
    #[arg(long)]
    opt0: bool,
    /// Where the fused kernels run: `cpu`, or `ascend:N` (NPU N; a build with `--features
    /// ascend`).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Print the prefill and decode bench lines for this checkpoint instead of generating.
    #[arg(long)]
    bench: bool,
    /// With --bench: fewer rounds, prefill S 128 and contexts 0 and 512 only.
    #[arg(long)]
    quick: bool,
}

fn main() {
    if let Err(e) = run(Args::parse()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

fn run(args: Args) -> AnyResult<()> {
    let sampling = Sampling {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: args.seed,
    };
    sampling.check()?;
    let exec = exec(&args)?;
    let t = Instant::now();
    let (weights, tokenizer) = llama_generate::load(&args.model)?;
    let c = weights.config.clone();
    eprintln!(
        "{}: {}; loaded in {:.2} s",
        args.model.display(),
        c.describe(),
        t.elapsed().as_secs_f64()
    );
    if args.bench {
        let model = Model::new(&weights, bench_max_len(&args, c.max_positions))?;
        drop(weights);
        return bench(&args, &model);
    }
    let prompt = prompt_text(&args, &tokenizer)?;
    let ids = tokenizer.encode(&prompt)?;
    if ids.is_empty() {
        return Err("the prompt encodes to no tokens: give some text".into());
    }
    let max_len = ids.len() + args.max_new_tokens;
    if max_len > c.max_positions {
        return Err(format!(
            "{} prompt tokens + {} new ones exceed the model's {} positions",
            ids.len(),
            args.max_new_tokens,
            c.max_positions
        )
        .into());
    }
    let model = Model::new(&weights, max_len)?;
    drop(weights);
    let decoder = model.decoder(exec)?;
    let mut session = Session::new(&decoder, max_len)?;
    generate(&args, &tokenizer, &mut session, &ids, sampling)
}

/// The build and device `--opt0` and `--device` ask for.
fn exec(args: &Args) -> AnyResult<Exec> {
    match (args.device.split_once(':'), args.opt0) {
        (None, false) if args.device == "cpu" => Ok(Exec::Fused),
        (None, true) if args.device == "cpu" => Ok(Exec::Unfused),
        (Some(("ascend", n)), false) => {
            let n: u32 = n
                .parse()
                .map_err(|_| format!("--device {}: `ascend:N` takes a number", args.device))?;
            #[cfg(feature = "ascend")]
            return Ok(Exec::Ascend(n));
            #[cfg(not(feature = "ascend"))]
            Err(format!("--device ascend:{n}: this build has no Ascend support (build with `--features ascend`)").into())
        }
        (Some(("ascend", _)), true) => Err("--opt0 runs on the host only".into()),
        _ => Err(format!("--device {}: `cpu` or `ascend:N`", args.device).into()),
    }
}

/// The prompt as the model reads it: as given, or a ChatML user turn.
fn prompt_text(args: &Args, tokenizer: &Tokenizer) -> AnyResult<String> {
    let text = args.prompt.clone().unwrap_or_default();
    if !args.chat {
        return Ok(text);
    }
    if tokenizer.token_id("<|im_start|>").is_none() {
        return Err(
            "--chat: this tokenizer has no <|im_start|> token (only ChatML chat is supported)"
                .into(),
        );
    }
    Ok(format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"))
}

/// Prefill, then decode one token at a time, each streamed to stdout as text.
fn generate(
    args: &Args,
    tokenizer: &Tokenizer,
    session: &mut Session,
    ids: &[u32],
    sampling: Sampling,
) -> AnyResult<()> {
    let prompt: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
    let t = Instant::now();
    let mut logits = session.prefill_last(&prompt)?.to_f32_vec();
    let prefill = t.elapsed().as_secs_f64();
    if let Some(path) = &args.dump_logits {
        autofusion::npy::write_f32(path, &[logits.len()], &logits)
            .map_err(|e| format!("{}: cannot write: {e}", path.display()))?;
    }
    let mut sampler = Sampler::new(sampling);
    let mut stream = TextStream::new(tokenizer);
    let mut out = std::io::stdout().lock();
    let t = Instant::now();
    let mut generated = 0;
    while generated < args.max_new_tokens {
        let next = sampler.next(&logits);
        generated += 1;
        if tokenizer.is_eos(next) {
            break;
        }
        write!(out, "{}", stream.push(next)?)?;
        out.flush()?;
        if generated < args.max_new_tokens {
            logits = session.step(next as i64)?.to_f32_vec();
        }
    }
    writeln!(out)?;
    let decode = t.elapsed().as_secs_f64();
    eprintln!(
        "prompt {} tokens: prefill {:.1} ms ({:.1} tok/s); {generated} tokens generated in {:.1} ms ({:.1} tok/s); {} on {}, {} threads, {} kernels",
        ids.len(),
        prefill * 1e3,
        ids.len() as f64 / prefill,
        decode * 1e3,
        generated as f64 / decode,
        if args.opt0 { "opt_level 0" } else { "fused" },
        args.device,
        autofusion::threads(),
        isa_level()
    );
    Ok(())
}

/// The bench's points that fit the model: (prefill lengths, decode contexts).
fn bench_points(args: &Args, max_positions: usize) -> (Vec<usize>, Vec<usize>) {
    let (prefills, contexts): (&[usize], &[usize]) =
        if args.quick { (&[128], &[0, 512]) } else { (&[128, 512], &[0, 512, 2048]) };
    let fits = |n: &&usize| **n + BENCH_STEPS < max_positions;
    (
        prefills.iter().filter(fits).copied().collect(),
        contexts.iter().filter(fits).copied().collect(),
    )
}

const BENCH_STEPS: usize = 8;

fn bench_max_len(args: &Args, max_positions: usize) -> usize {
    let (p, c) = bench_points(args, max_positions);
    p.into_iter().chain(c.into_iter().map(|c| c + BENCH_STEPS + 1)).max().unwrap_or(16).max(16)
}

/// The `llama` bench lines for this checkpoint, fused against opt_level 0.
fn bench(args: &Args, model: &Model) -> AnyResult<()> {
    let c = &model.config;
    println!(
        "llama bench: {}, {} threads, {} kernels; {} ({}), f32 weights",
        cpu_model(),
        autofusion::threads(),
        isa_level(),
        args.model.display(),
        c.describe()
    );
    println!("cpu features: {}", cpu_features_line());
    let decoders = [model.decoder(Exec::Fused)?, model.decoder(Exec::Unfused)?];
    let mut sessions = decoders
        .iter()
        .map(|d| Session::new(d, model.max_len))
        .collect::<autofusion::Result<Vec<_>>>()?;
    let bw = read_bandwidth();
    let bytes = model.weight_bytes_per_token() as f64;
    println!(
        "read bandwidth: {bw:.1} GB/s measured; weights read per token: {:.1} MB",
        bytes / 1e6
    );
    let rounds = if args.quick { 3 } else { 7 };
    let (prefills, contexts) = bench_points(args, c.max_positions);
    warm(&mut sessions, c.vocab)?;
    for n in prefills {
        println!("{}", prefill_line("f32", n, &prefill_tok_s(&mut sessions, n, rounds, c.vocab)?));
    }
    for ctx in contexts {
        let tps = decode_tok_s(&mut sessions, ctx, BENCH_STEPS, rounds, c.vocab)?;
        println!("{}", decode_line("f32", ctx, &tps, bytes, bw));
    }
    Ok(())
}
