//! State in graphs: a decoder layer whose KV caches are parameters it writes in place
//! (`cache_write` at the caller's position `P`), with RoPE at absolute positions, the causal
//! mask offset by `P` and grouped-query attention reading each KV head for its query heads.
//! At every opt level: a prefill and single-token steps match the reference interpreter (and
//! leave the same caches), a prefill of S tokens gives what S single steps give, and a call
//! that would write past the cache is an error that writes nothing.

mod common;

#[path = "decoder_graphs/mod.rs"]
mod decoder_graphs;
#[path = "decoder_graphs/dsl.rs"]
mod dsl;

use autofusion::{Module, Tensor};
use autofusion_compiler::ir::Op;
use autofusion_compiler::{target::Target, Options, Unit, Variant};
use decoder_graphs::{caches, decoder_layer, rope_tables, weights, Sizes, SMALL};
use std::path::PathBuf;

const T: usize = 24;

fn module(level: u8) -> Module {
    module_for(level, &Target::host())
}

fn module_for(level: u8, target: &Target) -> Module {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv_cache");
    let opts = Options { opt_level: level, ..Options::default() };
    let unit = Unit::from_graph(decoder_layer(SMALL), opts).unwrap();
    common::load(&unit, Variant::Fused, target, &dir, &[]).unwrap()
}

/// Rows `from .. from + n` of the token embeddings `x` (`[len, d]`).
fn rows(x: &Tensor, from: usize, n: usize) -> Tensor {
    let d = x.shape()[1];
    let v = x.to_f32_vec()[from * d..(from + n) * d].to_vec();
    Tensor::from_f32(&[n, d], v).unwrap()
}

/// Run `steps` (token counts) one call after another from position 0; returns the outputs
/// of every call, concatenated, and the caches left behind.
fn generate(
    m: &Module,
    z: Sizes,
    x: &Tensor,
    steps: &[usize],
    reference: bool,
) -> (Vec<f32>, [Tensor; 2]) {
    let (cos, sin) = rope_tables(T, z.dh as usize);
    let w = weights(z, 7);
    let (mut kc, mut vc) = caches(z, T);
    let mut out = Vec::new();
    let mut p = 0;
    for &s in steps {
        let xs = rows(x, p, s);
        let mut ins: Vec<&Tensor> = vec![&xs, &cos, &sin];
        ins.extend(w.iter());
        let mut state = [&mut kc, &mut vc];
        let dims = [("P", p as i64)];
        let y = if reference {
            m.reference_with_state(&ins, &mut state, &dims)
        } else {
            m.run_with_state(&ins, &mut state, &dims)
        }
        .unwrap_or_else(|e| panic!("call at P = {p}, S = {s}: {e}"));
        out.extend(y[0].to_f32_vec());
        p += s;
    }
    (out, [kc, vc])
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

#[test]
fn prefill_and_decode_steps_match_the_reference_at_every_opt_level() {
    let z = SMALL;
    let x = Tensor::randn(&[12, z.d as usize], 1.0, 3);
    let steps = [5, 1, 1, 3, 1, 1];
    for level in 0..=3u8 {
        let m = module(level);
        let (got, got_caches) = generate(&m, z, &x, &steps, false);
        let (want, want_caches) = generate(&m, z, &x, &steps, true);
        let what = format!("opt_level {level}");
        let d = max_diff(&got, &want);
        assert!(d <= 1e-4, "{what}: outputs differ from the reference by {d}");
        for (g, w) in got_caches.iter().zip(&want_caches) {
            let d = g.max_abs_diff(w).unwrap();
            assert!(d <= 1e-5, "{what}: caches differ from the reference's by {d}");
        }
        // Rows past the 12 positions written are still zero.
        let k = got_caches[0].to_f32_vec();
        let dh = z.dh as usize;
        for head in 0..z.kvh as usize {
            let tail = &k[(head * T + 12) * dh..(head + 1) * T * dh];
            assert!(tail.iter().all(|v| *v == 0.0), "{what}: rows past P + S untouched");
        }
        eprintln!("{what}: {} kernels, max |fused - reference| = {d:.1e}", m.meta().kernels.len());
    }
}

/// The host profile with launches priced dear and vector work cheap: every merge pays.
fn every_merge_pays() -> Target {
    let host = Target::host();
    Target {
        launch_us: 50.0,
        inline_below_elems: 0,
        vector_flops_per_us: host.vector_flops_per_us * 100.0,
        ..host
    }
}

/// With launches priced dear (a profile where every merge pays) the planner puts each RMSNorm,
/// statistics included, into the projections that read it (duplicated into Q, K and V) and
/// RoPE's rotation into one kernel per projection: those kernels match the reference too.
#[test]
fn norms_fused_into_the_projections_match_the_reference() {
    use autofusion_compiler::ir::Op;
    let z = SMALL;
    let target = every_merge_pays();
    let opts = Options { opt_level: 3, ..Options::default() };
    let unit = Unit::from_graph(decoder_layer(z), opts).unwrap();
    let plan = &unit.variant(Variant::Fused, &target).plan;
    let g = &unit.graph;
    let with_norm = plan
        .groups
        .iter()
        .filter(|grp| {
            grp.nodes.iter().any(|m| g.node(*m).op == Op::MatMul)
                && grp.nodes.iter().any(|m| matches!(g.node(*m).op, Op::Reduce { .. }))
        })
        .count();
    assert!(with_norm >= 3, "Q, K and V (at least) compute their norm: {with_norm} kernels do");
    let m = module_for(3, &target);
    let x = Tensor::randn(&[12, z.d as usize], 1.0, 3);
    let steps = [5, 1, 1, 3, 1, 1];
    let (got, got_caches) = generate(&m, z, &x, &steps, false);
    let (want, want_caches) = generate(&m, z, &x, &steps, true);
    let d = max_diff(&got, &want);
    assert!(d <= 1e-4, "outputs differ from the reference by {d}");
    for (g, w) in got_caches.iter().zip(&want_caches) {
        assert!(g.max_abs_diff(w).unwrap() <= 1e-5, "caches differ from the reference's");
    }
}

/// Under a profile where every merge pays, projections of one normed activation become one
/// horizontal kernel (`qkv_horizontal`) and the RMSNorm, statistics included, the prologue of
/// each of its parts, each part's epilogue with it; the weights are read as stored and
/// transposed. Against the reference.
#[test]
fn a_norm_runs_inside_a_horizontal_kernel_of_projections() {
    use autofusion_compiler::group::GroupKind;
    use autofusion_compiler::plan::{Rule, RuleSet};
    let target = every_merge_pays();
    let mut rules = RuleSet::all();
    rules.insert(Rule::QkvHorizontal);
    let opts = Options { opt_level: 3, rules, ..Options::default() };
    let unit = Unit::from_graph(decoder_graphs::mixed_projections(), opts).unwrap();
    let g = &unit.graph;
    let plan = &unit.variant(Variant::Fused, &target).plan;
    let horizontal: Vec<_> =
        plan.groups.iter().filter(|grp| grp.kind == GroupKind::Horizontal).collect();
    assert_eq!(horizontal.len(), 1, "{:?}", plan.groups);
    let has = |op: fn(&Op) -> bool| horizontal[0].nodes.iter().any(|m| op(&g.node(*m).op));
    assert!(has(|o| *o == Op::MatMul) && has(|o| matches!(o, Op::Reduce { .. })), "{plan:?}");
    // Each projection's epilogue (bias, GELU, SiLU) is in its part: one kernel in all.
    assert_eq!(plan.groups.len(), 1, "{:?}", plan.groups);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv_cache");
    let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
    for s in [1i64, 7, 100] {
        let ins = common::inputs(g, &[s], s as u64 + 5);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = autofusion_runtime::reference::run(g, &refs, &[s]).unwrap();
        common::assert_close(&format!("S = {s}"), &m.run(&refs).unwrap(), &want);
    }
}

/// Decode makes a launch plan per position; the module keeps a bounded number of them.
#[test]
fn a_long_decode_keeps_a_bounded_number_of_plans() {
    let z = SMALL;
    let t = autofusion::__private::PLANS_KEPT + 40;
    let m = module(0);
    let (cos, sin) = rope_tables(t, z.dh as usize);
    let w = weights(z, 7);
    let (mut kc, mut vc) = caches(z, t);
    for p in 0..t {
        let xs = Tensor::randn(&[1, z.d as usize], 1.0, p as u64);
        let mut ins: Vec<&Tensor> = vec![&xs, &cos, &sin];
        ins.extend(w.iter());
        m.run_with_state(&ins, &mut [&mut kc, &mut vc], &[("P", p as i64)]).unwrap();
        assert!(m.plans_held() <= autofusion::__private::PLANS_KEPT, "at P = {p}");
    }
}

#[test]
fn a_prefill_of_s_tokens_equals_s_single_steps() {
    let z = SMALL;
    let x = Tensor::randn(&[9, z.d as usize], 1.0, 5);
    for level in [0u8, 3] {
        let m = module(level);
        let (all, caches_all) = generate(&m, z, &x, &[9], false);
        let (steps, caches_steps) = generate(&m, z, &x, &[1; 9], false);
        let d = max_diff(&all, &steps);
        assert!(d <= 1e-4, "opt_level {level}: prefill vs steps differ by {d}");
        for (a, b) in caches_all.iter().zip(&caches_steps) {
            assert!(a.max_abs_diff(b).unwrap() <= 1e-5, "opt_level {level}: caches");
        }
    }
}

#[test]
fn a_call_past_the_cache_is_an_error_that_writes_nothing() {
    let z = SMALL;
    let m = module(3);
    let (cos, sin) = rope_tables(T, z.dh as usize);
    let w = weights(z, 7);
    let (mut kc, mut vc) = caches(z, T);
    let kc0 = kc.clone();
    let xs = Tensor::randn(&[4, z.d as usize], 1.0, 1);
    let mut ins: Vec<&Tensor> = vec![&xs, &cos, &sin];
    ins.extend(w.iter());
    // 22 + 4 > 24.
    let e = m.run_with_state(&ins, &mut [&mut kc, &mut vc], &[("P", 22)]).unwrap_err().to_string();
    assert!(e.contains("k_cache") && e.contains("22 .. 26") && e.contains("24"), "{e}");
    assert_eq!(kc, kc0, "nothing written");
    // The dims the caller must give, and only those.
    let e = m.run_with_state(&ins, &mut [&mut kc, &mut vc], &[]).unwrap_err().to_string();
    assert!(e.contains("`P` is not given"), "{e}");
    let e = m.run_with_state(&ins, &mut [&mut kc, &mut vc], &[("S", 4)]).unwrap_err().to_string();
    assert!(e.contains("bound from the parameters"), "{e}");
    let e = m.run_with_state(&ins, &mut [&mut kc, &mut vc], &[("P", -1)]).unwrap_err().to_string();
    assert!(e.contains("negative"), "{e}");
    // A stateful graph through `run`.
    let mut all = ins.clone();
    all.extend([&kc0, &kc0]);
    let e = m.run(&all).unwrap_err().to_string();
    assert!(e.contains("run_with_state"), "{e}");
    // Caches too short for the tables: T is bound from both.
    let (mut short_k, mut short_v) = caches(z, T - 1);
    let e = m
        .run_with_state(&ins, &mut [&mut short_k, &mut short_v], &[("P", 0)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("T"), "{e}");
}

/// The same layer written with `#[fused_graph]` (`Cache<..>` parameters, `cache_write`, the
/// position as a `usize` parameter): its typed entry points take the caches `&mut` and the
/// position, and compute what the built graph computes, fused, unfused and in the reference.
#[test]
fn the_dsl_layer_with_caches_runs_through_its_entry_points() {
    let z = SMALL;
    let (cos, sin) = rope_tables(T, z.dh as usize);
    let w = weights(z, 7);
    let x = Tensor::randn(&[8, z.d as usize], 1.0, 9);
    let built = module(3);
    let [(mut k1, mut v1), (mut k2, mut v2), (mut k3, mut v3), (mut k4, mut v4)] =
        [caches(z, T), caches(z, T), caches(z, T), caches(z, T)];
    let mut p = 0;
    for s in [5usize, 1, 2] {
        let xs = rows(&x, p, s);
        let fused = dsl::decoder_kv(
            &xs, &cos, &sin, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &w[8],
            &mut k1, &mut v1, p,
        )
        .unwrap();
        let unfused = dsl::decoder_kv::unfused(
            &xs, &cos, &sin, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &w[8],
            &mut k2, &mut v2, p,
        )
        .unwrap();
        let reference = dsl::decoder_kv::reference(
            &xs, &cos, &sin, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &w[8],
            &mut k3, &mut v3, p,
        )
        .unwrap();
        let mut ins: Vec<&Tensor> = vec![&xs, &cos, &sin];
        ins.extend(w.iter());
        let from_builder =
            built.run_with_state(&ins, &mut [&mut k4, &mut v4], &[("P", p as i64)]).unwrap();
        let at = format!("P = {p}, S = {s}");
        let want = std::slice::from_ref(&reference);
        common::assert_close(&format!("fused, {at}"), std::slice::from_ref(&fused), want);
        common::assert_close(&format!("unfused, {at}"), &[unfused], want);
        common::assert_close(&format!("GraphBuilder's, {at}"), &from_builder, want);
        p += s;
    }
    for (k, v) in [(&k1, &v1), (&k2, &v2), (&k4, &v4)] {
        assert!(k.max_abs_diff(&k3).unwrap() <= 1e-5 && v.max_abs_diff(&v3).unwrap() <= 1e-5);
    }
    // Past the cache: an error from the entry point, nothing written.
    let before = k1.clone();
    let xs = rows(&x, 0, 4);
    let e = dsl::decoder_kv(
        &xs,
        &cos,
        &sin,
        &w[0],
        &w[1],
        &w[2],
        &w[3],
        &w[4],
        &w[5],
        &w[6],
        &w[7],
        &w[8],
        &mut k1,
        &mut v1,
        T - 2,
    )
    .unwrap_err();
    assert!(e.to_string().contains("k_cache"), "{e}");
    assert_eq!(k1, before);
}

/// Caches of other layouts and dtypes (f16 rows, a batch, the last axis), several calls each,
/// at opt_level 0 and 3: outputs and caches equal the reference's.
#[test]
fn cache_writes_of_any_layout_match_the_reference() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv_layouts");
    for graph in decoder_graphs::cache_layouts() {
        for level in [0u8, 3] {
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let m = common::load(&unit, Variant::Fused, &Target::host(), &dir, &[]).unwrap();
            let what = format!("{} at opt_level {level}", graph.name);
            decoder_graphs::check_layout_calls(
                &graph,
                &what,
                |x, c, dims| m.run_with_state(&[x], &mut [c], dims).unwrap(),
                |x, c, dims| m.reference_with_state(&[x], &mut [c], dims).unwrap(),
            );
        }
    }
}

/// A decode step (S = 1) plans at opt_level 3 as one parallel region with attention over the
/// cache as one flash kernel, whatever the position.
#[test]
fn a_decode_step_is_one_parallel_region_at_opt_level_3() {
    let unit =
        Unit::from_graph(decoder_layer(SMALL), Options { opt_level: 3, ..Options::default() })
            .unwrap();
    for p in [0i64, 100, 2000] {
        let hints = [("S", 1), ("T", 4096), ("P", p)].map(|(n, v)| (n.to_string(), v)).to_vec();
        let rules = unit.lowered.options.rules;
        let plan = autofusion_compiler::plan::plan(&unit.graph, 3, rules, &hints, &Target::host());
        assert!(plan.pipeline, "P = {p}: one launch");
        let flash = plan.groups.iter().filter(|g| format!("{:?}", g.kind) == "FlashAttention");
        assert_eq!(flash.count(), 1, "P = {p}: attention as one flash kernel");
    }
}

/// SwiGLU's gate and up projections read the same normalised rows: at opt_level 3 the
/// `sibling_matmul` rule computes both products in one kernel (A packed once, the gate's
/// product never stored), at decode and at prefill, and the layer still matches the
/// reference at both.
#[test]
fn gate_and_up_run_as_one_kernel_at_opt_level_3() {
    let unit =
        Unit::from_graph(decoder_layer(SMALL), Options { opt_level: 3, ..Options::default() })
            .unwrap();
    let g = &unit.graph;
    for s in [1i64, 64] {
        let hints = [("S", s), ("T", 4096), ("P", 100)].map(|(n, v)| (n.to_string(), v)).to_vec();
        let rules = unit.lowered.options.rules;
        let plan = autofusion_compiler::plan::plan(g, 3, rules, &hints, &Target::host());
        let paired = plan.groups.iter().filter(|grp| {
            let matmuls = grp.nodes.iter().filter(|m| g.node(**m).op == Op::MatMul).count();
            format!("{:?}", grp.kind) == "MatMul" && matmuls == 2
        });
        assert_eq!(paired.count(), 1, "S = {s}: gate and up in one matmul kernel");
    }
}

/// SwiGLU whose mul went into up's kernel first (a greedy order a calibration can give):
/// gate's kernel, SiLU included, still joins it as the sibling product (`sibling_matmul`),
/// its epilogue reading gate's product from its own C block. Planned from those two kernels
/// as a seed, one kernel results, matching the reference.
#[test]
fn gate_with_its_activation_joins_the_kernel_up_and_the_mul_formed() {
    use autofusion_compiler::group::GroupKind;
    use autofusion_compiler::plan::{plan_from, Group};
    let unit = Unit::from_graph(common::swiglu_graph(), Options::default()).unwrap();
    let g = &unit.graph;
    let target = every_merge_pays();
    let seed = common::seed_groups(g, &[("gate", &["gate", "act"]), ("up", &["up", "h"])]);
    let rules = unit.lowered.options.rules;
    let plan = plan_from(g, 3, rules, &[], &target, Some(&seed));
    let both: Vec<&Group> = plan
        .groups
        .iter()
        .filter(|grp| grp.nodes.iter().filter(|m| g.node(**m).op == Op::MatMul).count() == 2)
        .collect();
    assert_eq!(both.len(), 1, "{:?}", plan.groups);
    assert_eq!(both[0].kind, GroupKind::MatMul);
    assert_eq!(plan.groups.len(), 1, "{:?}", plan.groups);
    let sym = format!("{}_seeded", unit.symbol(Variant::Fused));
    let host = autofusion_compiler::codegen::host::Host::new(target);
    let built = unit.build_plan(&host, Variant::Fused, plan, &sym).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv_cache");
    let m = common::load_built(&built, &dir, &[]).unwrap();
    for s in [1i64, 6, 40] {
        let ins = common::inputs(g, &[s], s as u64 + 9);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = autofusion_runtime::reference::run(g, &refs, &[s]).unwrap();
        common::assert_close(&format!("S = {s}"), &m.run(&refs).unwrap(), &want);
    }
}

/// RoPE computed in the projection's epilogue, in the natural split of the product
/// (`[S, H, DH]`), stored in the heads-first layout.
#[test]
fn rope_runs_in_the_projection_epilogue() {
    use autofusion_compiler::dim::DimExpr;
    use autofusion_compiler::ir::{BinaryOp, DType};
    use autofusion_compiler::GraphBuilder;
    let (s, c) = (DimExpr::sym("S"), DimExpr::constant);
    let mut b = GraphBuilder::new("rope_epilogue");
    let x = b.param("x", DType::F32, vec![s.clone(), c(16)]);
    let w = b.param("w", DType::F32, vec![c(16), c(32)]);
    let cos = b.param("cos", DType::F32, vec![s.clone(), c(8)]);
    let sin = b.param("sin", DType::F32, vec![s.clone(), c(8)]);
    let q = b.matmul(x, w, "q").unwrap();
    let qh = b.reshape(q, vec![s.clone(), c(4), c(8)], "q_heads").unwrap();
    let qt = b.op(Op::Transpose { perm: vec![1, 0, 2] }, &[qh], "q_t").unwrap();
    let rot = b.op(Op::RotateHalf, &[qt], "q_rot").unwrap();
    let a = b.binary(BinaryOp::Mul, qt, cos, "q_cos").unwrap();
    let r = b.binary(BinaryOp::Mul, rot, sin, "q_sin").unwrap();
    let y = b.binary(BinaryOp::Add, a, r, "q_rope").unwrap();
    b.output(y);
    let graph = b.finish().unwrap();
    let opts = Options { opt_level: 2, ..Options::default() };
    let unit = Unit::from_graph(graph, opts).unwrap();
    let target = every_merge_pays();
    let plan = &unit.variant(Variant::Fused, &target).plan;
    let why: Vec<String> =
        plan.candidates.iter().map(|c| format!("{:?} {:?}", c.rule, c.decision)).collect();
    assert_eq!(plan.groups.len(), 1, "{why:#?}");
    let g = &unit.graph;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kv_cache");
    let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
    for s in [1i64, 5, 33] {
        let ins = common::inputs(g, &[s], s as u64 + 1);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = autofusion_runtime::reference::run(g, &refs, &[s]).unwrap();
        common::assert_close(&format!("S = {s}"), &m.run(&refs).unwrap(), &want);
    }
}

/// Under a profile where every merge pays, RoPE runs in the Q and K projections' epilogues,
/// computed head by head in the natural split of each product, and the new keys (after RoPE)
/// and values go from those epilogues straight to their cache rows: no RoPE, rows or
/// cache-write kernel is left. With and without the horizontal Q/K/V kernel, at head dims
/// 2, 6, 8 and 64 (whole heads per C block: `Work::MatMul::nc_step`), prefill and decode
/// steps and the caches left behind against the reference.
#[test]
fn rope_and_the_cache_writes_run_in_the_projection_epilogues() {
    let target = every_merge_pays();
    let sizes = [
        SMALL,
        Sizes { d: 16, h: 2, kvh: 1, dh: 2, f: 24 },
        Sizes { d: 24, h: 6, kvh: 3, dh: 6, f: 40 },
        Sizes { d: 64, h: 4, kvh: 2, dh: 64, f: 96 },
    ];
    for z in sizes {
        for horizontal in [false, true] {
            let unit = decoder_graphs::rope_in_the_projections(z, horizontal, &target);
            let what = format!("dh {} horizontal {horizontal}", z.dh);
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("rope_epilogue");
            let m = common::load(&unit, Variant::Fused, &target, &dir, &[]).unwrap();
            let x = Tensor::randn(&[12, z.d as usize], 1.0, 3);
            let steps = [5, 1, 1, 3, 1, 1];
            let (got, got_caches) = generate(&m, z, &x, &steps, false);
            let (want, want_caches) = generate(&m, z, &x, &steps, true);
            let d = max_diff(&got, &want);
            assert!(d <= 1e-4, "{what}: outputs differ from the reference by {d}");
            for (g, w) in got_caches.iter().zip(&want_caches) {
                let d = g.max_abs_diff(w).unwrap();
                assert!(d <= 1e-5, "{what}: caches differ from the reference's by {d}");
            }
        }
    }
}
