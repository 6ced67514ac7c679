//! Flash attention with a few queries (a decode step), the host kernel's dot-product path:
//! query heads grouped over broadcast KV heads (GQA), K read as rows (`[.., T, D]`, its
//! transpose a view) and as K^T stored (`[.., D, T]`), head sizes that are no multiple of the
//! vector width, several key blocks, causal or not; each against the reference interpreter,
//! on both sides of the switch to the tiled path (S = 1 .. 9).

mod common;

use autofusion::{DType, Tensor};
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{Graph, Op};
use autofusion_compiler::{target::Target, GraphBuilder, Options, Unit, Variant};
use std::path::PathBuf;

const KVH: i64 = 2;
const G: i64 = 3;
const D: i64 = 24;
/// 64 + 16 + 8: every chunk width of `af_vaxpy_rows` (64 and 16 lanes, then the tail).
const DV: i64 = 88;

/// `q [kvh, g, S, D]` over `k [kvh, 1, T, D]` and `v [kvh, 1, T, DV]`.
fn grouped(kvh: i64, g_heads: i64) -> Graph {
    let (s, t, c) = (DimExpr::sym("S"), DimExpr::sym("T"), DimExpr::constant);
    let mut g = GraphBuilder::new(&format!("decode_att_{kvh}x{g_heads}"));
    let q = g.param("q", DType::F32, vec![c(kvh), c(g_heads), s, c(D)]);
    let k = g.param("k", DType::F32, vec![c(kvh), c(1), t.clone(), c(D)]);
    let v = g.param("v", DType::F32, vec![c(kvh), c(1), t, c(DV)]);
    let att = Op::Attention { scale: 0.2, causal: true, mask: false };
    let out = g.op(att, &[q, k, v], "att").unwrap();
    g.output(out);
    g.finish().unwrap()
}

/// `q [KVH, G, S, D]` over `k` (`[KVH, 1, T, D]`, or `[KVH, 1, D, T]` when `k_transposed`)
/// and `v [KVH, 1, T, DV]`.
fn attention(causal: bool, k_transposed: bool) -> Graph {
    let (s, t, c) = (DimExpr::sym("S"), DimExpr::sym("T"), DimExpr::constant);
    let name = format!(
        "decode_att_{}{}",
        if causal { "causal" } else { "full" },
        if k_transposed { "_kt" } else { "" }
    );
    let mut g = GraphBuilder::new(&name);
    let q = g.param("q", DType::F32, vec![c(KVH), c(G), s, c(D)]);
    let k = if k_transposed {
        let kt = g.param("k_t", DType::F32, vec![c(KVH), c(1), c(D), t.clone()]);
        g.op(Op::Transpose { perm: vec![0, 1, 3, 2] }, &[kt], "k").unwrap()
    } else {
        g.param("k", DType::F32, vec![c(KVH), c(1), t.clone(), c(D)])
    };
    let v = g.param("v", DType::F32, vec![c(KVH), c(1), t, c(DV)]);
    let att = Op::Attention { scale: 1.0 / (D as f64).sqrt(), causal, mask: false };
    let out = g.op(att, &[q, k, v], "att").unwrap();
    g.output(out);
    g.finish().unwrap()
}

fn inputs(k_transposed: bool, s: usize, t: usize, seed: u64) -> Vec<Tensor> {
    let (kvh, g, d, dv) = (KVH as usize, G as usize, D as usize, DV as usize);
    let k_shape = if k_transposed { [kvh, 1, d, t] } else { [kvh, 1, t, d] };
    vec![
        Tensor::randn(&[kvh, g, s, d], 1.0, seed),
        Tensor::randn(&k_shape, 1.0, seed + 1),
        Tensor::randn(&[kvh, 1, t, dv], 1.0, seed + 2),
    ]
}

#[test]
fn few_queries_over_grouped_kv_heads_match_the_reference() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("decode_attention");
    for causal in [true, false] {
        for k_transposed in [false, true] {
            let graph = attention(causal, k_transposed);
            let opts = Options { opt_level: 3, ..Options::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let built = unit.variant(Variant::Fused, &Target::host());
            assert!(
                built.plan.groups.iter().any(|g| format!("{:?}", g.kind) == "FlashAttention"),
                "{}: planned as one flash kernel",
                graph.name
            );
            let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
            // T past one key block (128) and no multiple of the vector width; S = 1 .. 4 take
            // the dot-product path (at most MR / 2 queries), 9 the tiled one.
            // With two threads the keys of each KV group are split in two ranges; at T = 257
            // and 129 the second range holds only keys the first queries may not see.
            for (s, t) in [
                (1usize, 1usize),
                (1, 300),
                (2, 300),
                (3, 131),
                (4, 260),
                (4, 257),
                (3, 129),
                (9, 300),
            ] {
                let ins = inputs(k_transposed, s, t, (s * 1000 + t) as u64);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = m.reference(&refs).unwrap();
                let got = m.run(&refs).unwrap();
                let what = format!("{}, S = {s}, T = {t}", graph.name);
                common::assert_close(&what, &got, &want);
            }
        }
    }
}

/// The cost model prices a decode step's attention by the bytes the few-queries path reads:
/// K and V once per KV group, so nine query heads over three KV heads move about a third of
/// the bytes of nine heads with their own K and V at a long context, and cost less.
#[test]
fn decode_attention_is_priced_by_the_cache_bytes_it_reads() {
    let flash = |graph: Graph| {
        let hints = [("S", 1), ("T", 4096)].map(|(n, v)| (n.to_string(), v)).to_vec();
        let unit = Unit::from_graph(graph, Options { opt_level: 3, ..Options::default() }).unwrap();
        let rules = unit.lowered.options.rules;
        let p = autofusion_compiler::plan::plan(&unit.graph, 3, rules, &hints, &Target::host());
        let flash = p.groups.iter().find(|g| format!("{:?}", g.kind) == "FlashAttention");
        let c = flash.and_then(|g| g.cost.clone()).expect("a priced flash kernel");
        (c.bytes, c.time_us)
    };
    let ((gqa_bytes, gqa_us), (mha_bytes, mha_us)) = (flash(grouped(3, 3)), flash(grouped(9, 1)));
    let ratio = gqa_bytes / mha_bytes;
    assert!((0.3..0.37).contains(&ratio), "bytes {gqa_bytes} over 3 KV heads, {mha_bytes} over 9");
    assert!(gqa_us < mha_us, "9 heads over 3 KV heads: {gqa_us:.1} us, over 9: {mha_us:.1} us");
}
