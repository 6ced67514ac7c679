//! A Llama-style decoder layer with a KV cache kept between calls (shared by
//! `tests/kv_cache.rs` and `tests/ascend.rs`): RMSNorm, Q/K/V projections, RoPE at the
//! absolute positions `P .. P + S` (rows of full cos/sin tables), the new keys and values
//! written into the caches at `P` (`cache_write`), grouped-query attention over the first
//! `P + S` cached positions with the causal mask aligned to the bottom-right corner (query i
//! at position P + i sees keys 0 ..= P + i), the output projection, and a SwiGLU MLP.
//! The caches are `[KVH, 1, T, DH]`: the `1` broadcasts each KV head over its G query heads
//! with no copy.
#![allow(dead_code)]

use autofusion::{DType, Tensor};
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{BinaryOp, Graph, Op, UnaryOp};
use autofusion_compiler::GraphBuilder;

/// Sizes of the test layer: hidden, query heads, KV heads, head dim, MLP width.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub d: i64,
    pub h: i64,
    pub kvh: i64,
    pub dh: i64,
    pub f: i64,
}

pub const SMALL: Sizes = Sizes { d: 32, h: 4, kvh: 2, dh: 8, f: 48 };

/// `decoder_layer(z)` at opt_level 3 (with `qkv_horizontal` when `horizontal`), checked to
/// plan for `target` with every RoPE rotation and cache write inside a projection's kernel
/// (matmul or horizontal): no rows or cache-write kernel of their own is left.
pub fn rope_in_the_projections(
    z: Sizes,
    horizontal: bool,
    target: &autofusion_compiler::target::Target,
) -> autofusion_compiler::Unit {
    use autofusion_compiler::group::GroupKind;
    use autofusion_compiler::plan::{Rule, RuleSet};
    let mut rules = RuleSet::all();
    if horizontal {
        rules.insert(Rule::QkvHorizontal);
    }
    let opts = autofusion_compiler::Options { opt_level: 3, rules, ..Default::default() };
    let unit = autofusion_compiler::Unit::from_graph(decoder_layer(z), opts).unwrap();
    let g = &unit.graph;
    let plan = &unit.variant(autofusion_compiler::Variant::Fused, target).plan;
    for grp in &plan.groups {
        let rope_or_write = grp
            .nodes
            .iter()
            .any(|m| matches!(g.node(*m).op, Op::RotateHalf | Op::CacheWrite { .. }));
        let in_projection = matches!(grp.kind, GroupKind::MatMul | GroupKind::Horizontal);
        let merges: Vec<String> = plan
            .candidates
            .iter()
            .filter(|c| {
                c.producer.iter().chain(c.consumers.iter().flatten()).any(|m| grp.nodes.contains(m))
            })
            .map(|c| {
                format!("{:?} {:?} -> {:?}: {:?}", c.rule, c.producer, c.consumers, c.decision)
            })
            .collect();
        assert!(
            !rope_or_write || in_projection,
            "dh {} horizontal {horizontal}: {grp:?} holds RoPE or a cache write\n{merges:#?}",
            z.dh
        );
    }
    unit
}

pub fn decoder_layer(z: Sizes) -> Graph {
    let c = DimExpr::constant;
    layer(LayerShape {
        name: "decoder_kv",
        d: c(z.d),
        kvh: c(z.kvh),
        group: c(z.h / z.kvh),
        dh: c(z.dh),
        f: c(z.f),
        table_rows: DimExpr::sym("T"),
        grouped_w_q: false,
        scale: 1.0 / (z.dh as f64).sqrt(),
    })
}

/// `decoder_layer` with every size a dynamic dim (`D`, `KVH`, `G`, `DH`, `F`; tables of `R`
/// positions, caches of `T`), as a build that runs checkpoints of any shape declares it: the
/// query weight comes in as `[D, KVH, G, DH]`, which binds the group size. The attention scale
/// is a number (`scale`): a checkpoint's loader folds `1 / sqrt(DH)` into the query weight.
pub fn decoder_layer_dyn(scale: f64) -> Graph {
    let sym = DimExpr::sym;
    layer(LayerShape {
        name: "decoder_kv_dyn",
        d: sym("D"),
        kvh: sym("KVH"),
        group: sym("G"),
        dh: sym("DH"),
        f: sym("F"),
        table_rows: sym("R"),
        grouped_w_q: true,
        scale,
    })
}

/// The sizes of a layer as dims (numbers or symbols), how its query weight comes in, and its
/// attention scale.
struct LayerShape {
    name: &'static str,
    d: DimExpr,
    kvh: DimExpr,
    /// Query heads per KV head.
    group: DimExpr,
    dh: DimExpr,
    f: DimExpr,
    /// Rows of the RoPE tables (`T` shares the caches' length).
    table_rows: DimExpr,
    /// The query weight as `[D, KVH, G, DH]` (binds the group) rather than `[D, H * DH]`.
    grouped_w_q: bool,
    scale: f64,
}

fn layer(z: LayerShape) -> Graph {
    let (s, t) = (DimExpr::sym("S"), DimExpr::sym("T"));
    let (d, kvh, dh) = (z.d.clone(), z.kvh.clone(), z.dh.clone());
    let qd = kvh.mul(&z.group).mul(&dh);
    let kd = kvh.mul(&dh);
    let mut g = GraphBuilder::new(z.name);
    let x = g.param("x", DType::F32, vec![s.clone(), d.clone()]);
    let cos = g.param("cos", DType::F32, vec![z.table_rows.clone(), dh.clone()]);
    let sin = g.param("sin", DType::F32, vec![z.table_rows.clone(), dh.clone()]);
    let ln1 = g.param("attn_norm", DType::F32, vec![d.clone()]);
    let wq = if z.grouped_w_q {
        let w = vec![d.clone(), kvh.clone(), z.group.clone(), dh.clone()];
        let w = g.param("w_q", DType::F32, w);
        g.reshape(w, vec![d.clone(), qd.clone()], "w_q2").unwrap()
    } else {
        g.param("w_q", DType::F32, vec![d.clone(), qd.clone()])
    };
    let wk = g.param("w_k", DType::F32, vec![d.clone(), kd.clone()]);
    let wv = g.param("w_v", DType::F32, vec![d.clone(), kd]);
    let wo = g.param("w_o", DType::F32, vec![qd.clone(), d.clone()]);
    let ln2 = g.param("mlp_norm", DType::F32, vec![d.clone()]);
    let wg = g.param("w_gate", DType::F32, vec![d.clone(), z.f.clone()]);
    let wu = g.param("w_up", DType::F32, vec![d.clone(), z.f.clone()]);
    let wd = g.param("w_down", DType::F32, vec![z.f.clone(), d.clone()]);
    let cache = vec![kvh.clone(), DimExpr::constant(1), t, dh.clone()];
    let k_cache = g.state("k_cache", DType::F32, cache.clone());
    let v_cache = g.state("v_cache", DType::F32, cache);
    let p = g.call_dim("P");
    let end = p.add(&s);

    let xn = g.op(Op::RmsNorm { eps: 1e-5 }, &[x, ln1], "xn").unwrap();
    // The tables' rows for positions P .. P + S.
    let cos_s = slice(&mut g, cos, 0, p.clone(), end.clone(), "cos_s");
    let sin_s = slice(&mut g, sin, 0, p.clone(), end.clone(), "sin_s");
    // [S, KVH * per_kv * DH] -> [KVH, per_kv, S, DH]
    let heads = |g: &mut GraphBuilder, w, per_kv: DimExpr, name: &str| {
        let y = g.matmul(xn, w, name).unwrap();
        let y = g.reshape(y, vec![s.clone(), kvh.clone(), per_kv, dh.clone()], name).unwrap();
        g.op(Op::Transpose { perm: vec![1, 2, 0, 3] }, &[y], name).unwrap()
    };
    let one = DimExpr::constant(1);
    let q = heads(&mut g, wq, z.group.clone(), "q");
    let q = g.op(Op::Rope, &[q, cos_s, sin_s], "q_rope").unwrap();
    let k = heads(&mut g, wk, one.clone(), "k");
    let k = g.op(Op::Rope, &[k, cos_s, sin_s], "k_rope").unwrap();
    let v = heads(&mut g, wv, one, "v");
    let k_all = g.cache_write(k_cache, k, 2, p.clone(), "k_all").unwrap();
    let v_all = g.cache_write(v_cache, v, 2, p.clone(), "v_all").unwrap();
    let k_vis = slice(&mut g, k_all, 2, DimExpr::constant(0), end.clone(), "k_vis");
    let v_vis = slice(&mut g, v_all, 2, DimExpr::constant(0), end, "v_vis");
    let att = g
        .op(Op::Attention { scale: z.scale, causal: true, mask: false }, &[q, k_vis, v_vis], "att")
        .unwrap();
    // [KVH, G, S, DH] -> [S, H * DH]
    let att = g.op(Op::Transpose { perm: vec![2, 0, 1, 3] }, &[att], "att_t").unwrap();
    let att = g.op(Op::Copy, &[att], "att_c").unwrap();
    let att = g.reshape(att, vec![s.clone(), qd], "att_r").unwrap();
    let o = g.matmul(att, wo, "o").unwrap();
    let x1 = g.binary(BinaryOp::Add, x, o, "x1").unwrap();
    let xn2 = g.op(Op::RmsNorm { eps: 1e-5 }, &[x1, ln2], "xn2").unwrap();
    let gate = g.matmul(xn2, wg, "gate").unwrap();
    let gate = g.unary(UnaryOp::Silu, gate, "gate_act").unwrap();
    let up = g.matmul(xn2, wu, "up").unwrap();
    let hmid = g.binary(BinaryOp::Mul, gate, up, "h").unwrap();
    let down = g.matmul(hmid, wd, "down").unwrap();
    let out = g.binary(BinaryOp::Add, x1, down, "out").unwrap();
    g.output(out);
    g.finish().unwrap()
}

fn slice(
    g: &mut GraphBuilder,
    x: autofusion_compiler::ir::NodeId,
    axis: usize,
    start: DimExpr,
    end: DimExpr,
    name: &str,
) -> autofusion_compiler::ir::NodeId {
    g.op(Op::Slice { axis, start, end }, &[x], name).unwrap()
}

/// RoPE tables for positions 0 .. t (Hugging Face's rotate-half layout, theta 10000).
pub fn rope_tables(t: usize, dh: usize) -> (Tensor, Tensor) {
    let (mut cos, mut sin) = (Vec::with_capacity(t * dh), Vec::with_capacity(t * dh));
    for pos in 0..t {
        for j in 0..dh {
            let inv = 1.0 / 10000f64.powf((2 * (j % (dh / 2))) as f64 / dh as f64);
            let a = pos as f64 * inv;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (Tensor::from_f32(&[t, dh], cos).unwrap(), Tensor::from_f32(&[t, dh], sin).unwrap())
}

/// The layer's weights (seeded), in parameter order after x, cos and sin.
pub fn weights(z: Sizes, seed: u64) -> Vec<Tensor> {
    let (d, hd, kd, f) =
        (z.d as usize, (z.h * z.dh) as usize, (z.kvh * z.dh) as usize, z.f as usize);
    let norm = |n: usize, s: u64| {
        let r = Tensor::randn(&[n], 0.1, s).to_f32_vec();
        Tensor::from_f32(&[n], r.iter().map(|v| v + 1.0).collect()).unwrap()
    };
    let w = |k: usize, n: usize, s: u64| Tensor::randn(&[k, n], 1.0 / (k as f32).sqrt(), s);
    vec![
        norm(d, seed),
        w(d, hd, seed + 1),
        w(d, kd, seed + 2),
        w(d, kd, seed + 3),
        w(hd, d, seed + 4),
        norm(d, seed + 5),
        w(d, f, seed + 6),
        w(d, f, seed + 7),
        w(f, d, seed + 8),
    ]
}

/// Empty caches of `t` positions.
pub fn caches(z: Sizes, t: usize) -> (Tensor, Tensor) {
    let shape = [z.kvh as usize, 1, t, z.dh as usize];
    let n = shape.iter().product();
    (
        Tensor::from_f32(&shape, vec![0.0; n]).unwrap(),
        Tensor::from_f32(&shape, vec![0.0; n]).unwrap(),
    )
}

/// Cache writes of other layouts and dtypes: `[T, D]` in f16 along axis 0, `[B, T, D]` along
/// axis 1 with a batch, `[D, T]` along the last axis (a transposed write). Each returns the
/// visible rows summed over the cache axis (`[.., 1, D]`), so every row read counts.
pub fn cache_layouts() -> Vec<Graph> {
    let (s, t, b, c) = (DimExpr::sym("S"), DimExpr::sym("T"), DimExpr::sym("B"), DimExpr::constant);
    let f16_rows = layout(
        "cache_f16_rows",
        vec![s.clone(), c(24)],
        vec![t.clone(), c(24)],
        0,
        DType::F16,
        |g, x| g.cast(x, DType::F16, "x16").unwrap(),
    );
    let batched = layout(
        "cache_batched",
        vec![b.clone(), s.clone(), c(20)],
        vec![b, t.clone(), c(20)],
        1,
        DType::F32,
        |g, x| g.unary(UnaryOp::Tanh, x, "y").unwrap(),
    );
    let columns = layout("cache_columns", vec![s, c(12)], vec![c(12), t], 1, DType::F32, |g, x| {
        g.op(Op::Transpose { perm: vec![1, 0] }, &[x], "xt").unwrap()
    });
    vec![f16_rows, batched, columns]
}

/// `x` (`x_shape`, f32) through `new` written into a `cache` of `cache_shape` along `axis` at
/// the caller's `P`; the visible `P + S` positions summed over the axis, in f32.
fn layout(
    name: &str,
    x_shape: Vec<DimExpr>,
    cache_shape: Vec<DimExpr>,
    axis: usize,
    dtype: DType,
    new: impl Fn(&mut GraphBuilder, autofusion_compiler::ir::NodeId) -> autofusion_compiler::ir::NodeId,
) -> Graph {
    let s = DimExpr::sym("S");
    let mut g = GraphBuilder::new(name);
    let x = g.param("x", DType::F32, x_shape);
    let cache = g.state("cache", dtype, cache_shape);
    let p = g.call_dim("P");
    let y = new(&mut g, x);
    let all = g.cache_write(cache, y, axis, p.clone(), "all").unwrap();
    let slice = Op::Slice { axis, start: DimExpr::constant(0), end: p.add(&s) };
    let vis = g.op(slice, &[all], "vis").unwrap();
    let vis = g.cast(vis, DType::F32, "vis32").unwrap();
    let sum = autofusion_compiler::ir::ReduceKind::Sum;
    let out = g.op(Op::Reduce { kind: sum, axis }, &[vis], "sum").unwrap();
    g.output(out);
    g.finish().unwrap()
}

/// Calls of `graph` (one of `cache_layouts`) of 4, 1 and 7 tokens from position 0 through
/// `run` and `reference` (each given x, its own cache and the dims), outputs and caches
/// compared after each call.
pub fn check_layout_calls(
    graph: &Graph,
    what: &str,
    mut run: impl FnMut(&Tensor, &mut Tensor, &[(&str, i64)]) -> Vec<Tensor>,
    mut reference: impl FnMut(&Tensor, &mut Tensor, &[(&str, i64)]) -> Vec<Tensor>,
) {
    let (_, mut cache) = layout_inputs(graph, 3, 1, 17, 0);
    let mut want_cache = cache.clone();
    let mut p = 0;
    for (i, s) in [4usize, 1, 7].into_iter().enumerate() {
        let (x, _) = layout_inputs(graph, 3, s, 17, i as u64);
        let dims = [("P", p as i64)];
        let got = run(&x, &mut cache, &dims);
        let want = reference(&x, &mut want_cache, &dims);
        let at = format!("{what}, P = {p}, S = {s}");
        crate::common::assert_close(&at, &got, &want);
        let caches = |c: &Tensor| vec![c.clone()];
        crate::common::assert_close(&format!("{at}: cache"), &caches(&cache), &caches(&want_cache));
        p += s;
    }
}

/// Calls of a `cache_layouts` graph: (x, the cache at `t` positions) for steps of `sizes`
/// tokens with batch `b` where the graph has one.
pub fn layout_inputs(g: &Graph, b: usize, s: usize, t: usize, seed: u64) -> (Tensor, Tensor) {
    let pn = g.param_nodes();
    let (x, cache) = (g.node(pn[0]), g.node(pn[1]));
    let bind = |d: &str| match d {
        "B" => Some(b as i64),
        "S" => Some(s as i64),
        "T" => Some(t as i64),
        _ => None,
    };
    let shape = |n: &autofusion_compiler::ir::Node| -> Vec<usize> {
        n.shape.iter().map(|d| d.eval(&bind).unwrap() as usize).collect()
    };
    let xs = Tensor::randn(&shape(x), 1.0, seed);
    let cs = shape(cache);
    let zeros = Tensor::from_f32(&cs, vec![0.0; cs.iter().product()]).unwrap();
    (xs, zeros.to_dtype(cache.dtype).unwrap())
}

/// Vocabulary of the session tests' decoder.
pub const V: usize = 50;

/// ids `[S]` -> rows of the table.
pub fn embed_graph() -> Graph {
    embed_graph_of(32, V as i64)
}

/// `[S, D]` -> logits `[S, V]`.
pub fn head_graph() -> Graph {
    head_graph_of(32, V as i64, false)
}

/// ids `[S]` -> rows of a `[v, d]` table.
pub fn embed_graph_of(d: i64, v: i64) -> Graph {
    let mut g = GraphBuilder::new("embed");
    let ids = g.param("ids", DType::I64, vec![DimExpr::sym("S")]);
    let table = g.param("table", DType::F32, vec![DimExpr::constant(v), d.into()]);
    let x = g.op(Op::Gather { axis: 0 }, &[table, ids], "x").unwrap();
    g.output(x);
    g.finish().unwrap()
}

/// `[S, d]` -> RMSNorm -> logits `[S, v]`, by an output weight `[d, v]` or (`tied`) the
/// embedding table `[v, d]` read transposed.
pub fn head_graph_of(d: i64, v: i64, tied: bool) -> Graph {
    let mut g = GraphBuilder::new("head");
    let x = g.param("x", DType::F32, vec![DimExpr::sym("S"), d.into()]);
    let n = g.param("norm", DType::F32, vec![d.into()]);
    let w = if tied {
        let table = g.param("table", DType::F32, vec![DimExpr::constant(v), d.into()]);
        g.op(Op::Transpose { perm: vec![1, 0] }, &[table], "w_out").unwrap()
    } else {
        g.param("w_out", DType::F32, vec![d.into(), DimExpr::constant(v)])
    };
    let h = g.op(Op::RmsNorm { eps: 1e-5 }, &[x, n], "h").unwrap();
    let logits = g.matmul(h, w, "logits").unwrap();
    g.output(logits);
    g.finish().unwrap()
}

/// Three projections of one RMSNorm'd activation whose weights the cube reads in different
/// layouts (`[K, N]` as stored for Q and V, `[N, K]` transposed for K), each with its own
/// epilogue: a horizontal kernel of two Matmul objects when the planner merges them.
pub fn mixed_projections() -> Graph {
    let c = DimExpr::constant;
    let mut b = GraphBuilder::new("mixed_projections");
    let x = b.param("x", DType::F32, vec![DimExpr::sym("S"), c(48)]);
    let gamma = b.param("gamma", DType::F32, vec![c(48)]);
    let wq = b.param("wq", DType::F32, vec![c(48), c(64)]);
    let bq = b.param("bq", DType::F32, vec![c(64)]);
    let wk = b.param("wk", DType::F32, vec![c(40), c(48)]);
    let wv = b.param("wv", DType::F32, vec![c(48), c(24)]);
    let x = b.op(Op::RmsNorm { eps: 1e-5 }, &[x, gamma], "norm").unwrap();
    let q = b.matmul(x, wq, "q").unwrap();
    let q = b.binary(BinaryOp::Add, q, bq, "q_bias").unwrap();
    let wkt = b.op(Op::Transpose { perm: vec![1, 0] }, &[wk], "wk_t").unwrap();
    let k = b.matmul(x, wkt, "k").unwrap();
    let k = b.unary(UnaryOp::Gelu, k, "k_gelu").unwrap();
    let v = b.matmul(x, wv, "v").unwrap();
    let v = b.unary(UnaryOp::Silu, v, "v_silu").unwrap();
    for o in [q, k, v] {
        b.output(o);
    }
    b.finish().unwrap()
}
