//! Prefill and decode speed of a Llama-architecture decoder at SmolLM2-135M's shapes (30
//! layers, hidden 576, 9 heads over 3 KV heads of 64, intermediate 1536, vocabulary 49152,
//! output tied to the embedding), random weights, through a `Session`: fused (opt_level 3)
//! against opt_level 0, interleaved round by round.
//!
//!     cargo bench --bench llama [-- --quick] [--ctx 0,512] [--prefill 128] [--steps N] [--kernels]
//!
//! Lines, for scripts:
//!
//!     llama f32 prefill S=<n>: fused X tok/s, opt0 Y tok/s
//!     llama f32 decode ctx=<T>: fused X tok/s, opt0 Y tok/s, Z GB/s of W GB/s measured
//!
//! Prefill computes the last position's logits only (`Session::prefill_last`), as generation
//! does. Decode at `ctx = T` times single steps after T tokens are in the cache. GB/s is the
//! fused decode's weight bytes per token (every layer's weights, the norms and the tied
//! output table) times tokens/s, beside this machine's read bandwidth measured here (every
//! pool thread summing its share of a 1 GiB buffer). `--kernels` also prints the median time
//! of each kernel of one layer's decode step at each context (launched one by one).
//! Threads: `AUTOFUSION_THREADS`.

use autofusion::machine::{cpu_features_line, cpu_model, isa_level, read_bandwidth};
use autofusion::session_bench::{decode_line, decode_tok_s, prefill_line, prefill_tok_s, warm};
use autofusion::{Decoder, Module, Session, Tensor};
use autofusion_compiler::{Options, Unit, Variant};
use std::path::PathBuf;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/decoder_graphs/mod.rs"]
mod decoder_graphs;

use decoder_graphs::{decoder_layer, embed_graph_of, head_graph_of, rope_tables, weights, Sizes};

/// SmolLM2-135M.
const SMOL: Sizes = Sizes { d: 576, h: 9, kvh: 3, dh: 64, f: 1536 };
const LAYERS: usize = 30;
const VOCAB: usize = 49152;

/// The three graphs of one variant.
struct Graphs {
    embed: Module,
    layer: Module,
    head: Module,
}

fn load(graph: autofusion_compiler::ir::Graph, level: u8) -> Module {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/autofusion-bench/llama");
    let unit = Unit::from_graph(graph, Options { opt_level: level, ..Options::default() })
        .unwrap_or_else(|e| panic!("{e}"));
    let target = common::calibrated_host();
    common::load(&unit, Variant::Fused, &target, &dir, &["-O3"]).unwrap_or_else(|e| panic!("{e}"))
}

impl Graphs {
    fn new(level: u8) -> Graphs {
        let (d, v) = (SMOL.d, VOCAB as i64);
        Graphs {
            embed: load(embed_graph_of(d, v), level),
            layer: load(decoder_layer(SMOL), level),
            head: load(head_graph_of(d, v, true), level),
        }
    }
}

/// Random weights of the whole model (each layer its own).
struct Weights {
    table: Tensor,
    norm: Tensor,
    cos: Tensor,
    sin: Tensor,
    layers: Vec<Vec<Tensor>>,
}

impl Weights {
    fn new(max_len: usize) -> Weights {
        let d = SMOL.d as usize;
        let (cos, sin) = rope_tables(max_len, SMOL.dh as usize);
        Weights {
            table: Tensor::randn(&[VOCAB, d], 0.02, 1),
            norm: Tensor::from_f32(&[d], vec![1.0; d]).unwrap(),
            cos,
            sin,
            layers: (0..LAYERS).map(|l| weights(SMOL, 100 + 10 * l as u64)).collect(),
        }
    }
    /// Bytes one token reads: every layer's weights, the final norm and the output table.
    fn bytes_per_token(&self) -> usize {
        let layer: usize = self.layers.iter().flatten().map(|t| t.numel() * 4).sum();
        layer + (self.norm.numel() + self.table.numel()) * 4
    }
    fn decoder<'a>(&'a self, g: &'a Graphs) -> Decoder<'a> {
        Decoder {
            embed: &g.embed,
            embed_inputs: vec![&self.table],
            layer: &g.layer,
            layer_inputs: self
                .layers
                .iter()
                .map(|w| [&self.cos, &self.sin].into_iter().chain(w.iter()).collect())
                .collect(),
            head: &g.head,
            head_inputs: vec![&self.norm, &self.table],
        }
    }
}

/// Each kernel of one layer's decode step at position `ctx`, launched one by one.
fn print_kernels(name: &str, g: &Graphs, w: &Weights, ctx: usize, max_len: usize) {
    let shape = [SMOL.kvh as usize, 1, max_len, SMOL.dh as usize];
    let (mut k, mut v) = (
        Tensor::zeros(autofusion::DType::F32, &shape),
        Tensor::zeros(autofusion::DType::F32, &shape),
    );
    let x = Tensor::randn(&[1, SMOL.d as usize], 1.0, 5);
    let mut ins = vec![&x, &w.cos, &w.sin];
    ins.extend(w.layers[0].iter());
    let times = g
        .layer
        .time_kernels_with_state(&ins, &mut [&mut k, &mut v], &[("P", ctx as i64)], 30)
        .unwrap();
    let names = g.layer.kernel_names();
    println!("  {name} layer kernels at ctx={ctx}: {:.1} us in all", times.iter().sum::<f64>());
    for ((kname, ops), t) in names.iter().zip(&times) {
        println!("    {t:8.1} us  {kname}: {ops}");
    }
}

/// The value after `--name`: a comma-separated list of sizes (empty: none), or `default`.
fn list(name: &str, default: &[usize]) -> Vec<usize> {
    let a: Vec<String> = std::env::args().collect();
    match a.iter().position(|x| x == name).and_then(|i| a.get(i + 1)) {
        Some(v) => v.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().expect(name)).collect(),
        None => default.to_vec(),
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 3 } else { 7 };
    let contexts = list("--ctx", if quick { &[0, 512] } else { &[0, 512, 2048] });
    let prefills = list("--prefill", if quick { &[128] } else { &[128, 512] });
    let steps = list("--steps", &[if quick { 4 } else { 8 }])[0];
    // The caches and the RoPE tables share the layer's `T`: one length for both.
    let max_len = (contexts.iter().max().unwrap_or(&0) + steps + 1)
        .max(prefills.iter().max().copied().unwrap_or(0));
    println!(
        "llama bench: {}, {} threads, {} kernels; SmolLM2-135M shapes ({LAYERS} layers, hidden {}, heads {}/{} KV, head dim {}, intermediate {}, vocab {VOCAB}, tied), random f32 weights",
        cpu_model(),
        autofusion::threads(),
        isa_level(),
        SMOL.d,
        SMOL.h,
        SMOL.kvh,
        SMOL.dh,
        SMOL.f
    );
    println!("cpu features: {}", cpu_features_line());
    let w = Weights::new(max_len);
    let variants = [("fused", Graphs::new(3)), ("opt0", Graphs::new(0))];
    let decoders: Vec<Decoder> = variants.iter().map(|(_, g)| w.decoder(g)).collect();
    let mut sessions: Vec<Session> =
        decoders.iter().map(|d| Session::new(d, max_len).unwrap()).collect();
    let bw = read_bandwidth();
    let bytes = w.bytes_per_token() as f64;
    println!(
        "read bandwidth: {bw:.1} GB/s measured; weights read per token: {:.1} MB",
        bytes / 1e6
    );
    warm(&mut sessions, VOCAB).unwrap();
    for &n in &prefills {
        let tps = prefill_tok_s(&mut sessions, n, rounds, VOCAB).unwrap();
        println!("{}", prefill_line("f32", n, &tps));
    }
    for &ctx in &contexts {
        let tps = decode_tok_s(&mut sessions, ctx, steps, rounds, VOCAB).unwrap();
        if std::env::args().any(|a| a == "--kernels") {
            for (name, g) in &variants {
                print_kernels(name, g, &w, ctx, max_len);
            }
        }
        println!("{}", decode_line("f32", ctx, &tps, bytes, bw));
    }
}
