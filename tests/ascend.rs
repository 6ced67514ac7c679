//! The Ascend path end to end (feature `ascend`): every layer graph planned for `ascend910b`
//! at every opt level and with each rule alone, its Ascend C generated, compiled by the
//! toolkit's bisheng (`-Wall -Werror`), launched through AscendCL with DynamicTiling at
//! several dynamic shapes, and checked against the reference interpreter.
//! Without an NPU: `make -C ascend-sim && ASCEND_HOME_PATH=$PWD/ascend-sim cargo test --features ascend`.
#![cfg(feature = "ascend")]

#[path = "batched_graphs/mod.rs"]
mod batched_graphs;
mod common;
#[path = "decoder_graphs/mod.rs"]
mod decoder_graphs;
#[path = "decoder_graphs/dsl.rs"]
mod dsl;
#[path = "integer_graphs/mod.rs"]
mod integer_graphs;
#[path = "layers/mod.rs"]
mod layers;

use autofusion::{Device, Tensor};
use autofusion_compiler::codegen::ascend::Ascend;
use autofusion_compiler::front::Options;
use autofusion_compiler::{target::Target, Unit, Variant};
use std::path::PathBuf;

/// Tails and a single row; 100 spreads rows unevenly over the 48 AIVs.
const SHAPES: [i64; 3] = [1, 7, 100];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ascend")
}

#[test]
fn device_ascend_is_available() {
    Device::Ascend(0).check().unwrap();
    let e = Device::Ascend(7).check().unwrap_err().to_string();
    assert!(e.contains("Ascend(7)"), "{e}");
}

#[test]
fn every_layer_graph_matches_the_reference_on_ascend() {
    let target = Target::ascend910b();
    let only = std::env::var("AUTOFUSION_TEST_GRAPH").ok();
    for (name, item, base) in common::layer_graphs() {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let unit0 = Unit::with_options(base.clone(), &item).unwrap();
        let g = unit0.graph.clone();
        let cases: Vec<(i64, Vec<Tensor>, Vec<Tensor>)> = SHAPES
            .iter()
            .map(|&s| {
                let dims = common::dims_for(&g, s);
                let ins = common::inputs(&g, &dims, s as u64 + 17);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = autofusion_runtime::reference::run(&g, &refs, &dims).unwrap();
                (s, ins, want)
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        // The token-id layers (integers, gathers, masks) at each opt level only: their kernel
        // kinds are the float layers', whose every rule alone runs here already.
        let token_layers = ["token_embeddings", "encoder_batched", "mean_pool", "int_zoo"];
        for (label, level, rules) in common::ascend_configs() {
            if token_layers.contains(&name.as_str()) && label.contains("rules") {
                continue;
            }
            let opts = Options { opt_level: level, rules, ..base.clone() };
            let unit = Unit::with_options(opts, &item).unwrap();
            // Plans that generate the same kernels are built once.
            let built = unit
                .build(&Ascend::new(target.clone()), Variant::Fused)
                .unwrap_or_else(|e| panic!("{name}, {label}: {e}"));
            if !seen.insert(common::plan_key(&built.plan)) {
                continue;
            }
            let sym = format!("{}_{}", unit.symbol(Variant::Fused), seen.len());
            let m = common::load_ascend_built(g.clone(), &built, &sym, &dir())
                .unwrap_or_else(|e| panic!("{name}, {label}: {e}"));
            for (s, ins, want) in &cases {
                let refs: Vec<&Tensor> = ins.iter().collect();
                let got =
                    m.run(0, &refs).unwrap_or_else(|e| panic!("{name}, {label}, S = {s}: {e}"));
                common::assert_close(&format!("Ascend: {name}, {label}, S = {s}"), &got, want);
            }
            eprintln!("ok: {name}, {label} ({} kernels)", built.plan.groups.len());
        }
    }
}

/// The macro's entry point: the layers this package's build.rs compiled (Ascend C built by
/// autofusion-build with bisheng, linked into this test) run on `Device::Ascend(0)`, weights
/// resident across calls, at several sequence lengths (DynamicTiling per shape).
#[test]
fn macro_layers_run_on_the_ascend_device() {
    let dev = Device::Ascend(0);
    let m = layers::llama_block::module().unwrap();
    let g = m.graph().clone();
    for s in [1i64, 33, 100] {
        let ins = common::inputs(&g, &[s], s as u64);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = m.reference(&refs).unwrap();
        let got = layers::llama_block::ascend_module().unwrap().run(0, &refs).unwrap();
        common::assert_close(&format!("llama_block on Ascend at S = {s}"), &got, &want);
    }
    let a = layers::ffn_f16::module().unwrap();
    let ins = common::inputs(a.graph(), &[7], 3);
    let want = a.reference(&ins.iter().collect::<Vec<_>>()).unwrap();
    let got =
        layers::ffn_f16::run_on(dev, &ins[0], &ins[1], &ins[2], &ins[3], &ins[4], &ins[5]).unwrap();
    common::assert_close("ffn_f16 through run_on(Ascend)", &[got], &want);
    // Runtime errors name the graph and shapes on this device too.
    let bad = Tensor::zeros(ins[0].dtype(), &[7, 3]);
    let e = layers::ffn_f16::run_on(dev, &bad, &ins[1], &ins[2], &ins[3], &ins[4], &ins[5])
        .unwrap_err()
        .to_string();
    assert!(e.contains("ffn_f16") && e.contains("[7, 3]"), "{e}");
}

// The seed layer's ONNX export, built into the tests by build.rs with `Builder::onnx`.
include!(concat!(env!("OUT_DIR"), "/autofusion/seed_onnx.rs"));

/// A model built with `Builder::onnx` runs on the device through its generated module's
/// `run_on`, its weights read from the model file, agreeing with the reference and with what
/// onnxruntime computed.
#[test]
fn an_onnx_model_built_into_the_crate_runs_on_the_ascend_device() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("autofusion-onnx/tests/fixtures");
    let f32s = |f: &str| -> Vec<f32> {
        let b = std::fs::read(dir.join(f)).unwrap();
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    };
    let x = Tensor::from_f32(&[5, 32], f32s("seed_d32.x.bin")).unwrap();
    let ort = Tensor::from_f32(&[5, 32], f32s("seed_d32.y.bin")).unwrap();
    let got = seed_onnx::run_on(Device::Ascend(0), &x).unwrap();
    let want = seed_onnx::reference(&x).unwrap();
    let got = [got];
    common::assert_close("seed_onnx on Ascend vs reference", &got, &[want]);
    common::assert_close("seed_onnx on Ascend vs onnxruntime", &got, &[ort]);
}

/// Random layer-like graphs (the compiler's property-test generator) through the Ascend path
/// at opt_level 2 and 3.
#[test]
fn random_graphs_match_the_reference_on_ascend() {
    let target = Target::ascend910b();
    for (seed, level, src, unit) in common::random_units() {
        let m = common::load_ascend(&unit, Variant::Fused, &target, &dir())
            .unwrap_or_else(|e| panic!("random graph {seed}: {e}\n{src}"));
        for s in [1i64, 13] {
            let ins = common::inputs(m.graph(), &[s], seed + 5);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = m.reference(&refs).unwrap();
            let got = m.run(0, &refs).unwrap_or_else(|e| {
                panic!("random graph {seed} at opt_level {level}, S = {s}: {e}\n{src}")
            });
            common::assert_close(
                &format!("Ascend: random graph {seed} at opt_level {level}, S = {s}:\n{src}"),
                &got,
                &want,
            );
        }
    }
}

/// The fused variant of `unit` for `target`, generated, compiled and loaded under a symbol
/// suffixed with `tag` (`what` names it in a failure).
fn build_and_load(
    unit: &Unit,
    target: &Target,
    tag: &str,
    what: &str,
) -> (autofusion_compiler::Built, autofusion_runtime::ascend::AscendModule) {
    let built = unit
        .build(&Ascend::new(target.clone()), Variant::Fused)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let sym = format!("{}_{tag}", unit.symbol(Variant::Fused));
    let m = common::load_ascend_built(unit.graph.clone(), &built, &sym, &dir())
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    (built, m)
}

/// bert_embed's graphs, every size a dynamic dim, at two sets of sizes each: what the example's
/// `--device ascend:N` runs (its own test does so through a crate built with the feature).
#[test]
fn bert_embed_graphs_of_any_size_match_the_reference_on_ascend() {
    let target = Target::ascend910b();
    let sizes = |d: &str, big: bool| -> i64 {
        match (d, big) {
            ("B", false) => 2,
            ("B", true) => 3,
            ("S", false) => 7,
            ("S", true) => 19,
            ("H", b) => 4 + 2 * b as i64,
            ("DH", b) => 8 + 8 * b as i64,
            ("F", b) => 37 + 60 * b as i64,
            ("D", b) => 32 + 64 * b as i64,
            ("P", _) => 40,
            ("V", _) | ("T", _) => 5,
            (other, _) => panic!("bert_embed graph dim {other} has no test size"),
        }
    };
    for (name, item, base) in common::graphs_of("examples/bert_embed/src/graphs.rs") {
        for level in [0u8, 3] {
            let opts = Options { opt_level: level, ..base.clone() };
            let unit = Unit::with_options(opts, &item).unwrap();
            let what = format!("bert_embed {name} at opt_level {level}");
            let (_, m) = build_and_load(&unit, &target, &format!("bert{level}"), &what);
            let g = &unit.graph;
            for big in [false, true] {
                let dims: Vec<i64> = g.dyn_dims.iter().map(|d| sizes(d, big)).collect();
                let ins = common::inputs(g, &dims, 3 + big as u64);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = autofusion_runtime::reference::run(g, &refs, &dims).unwrap();
                let got = m.run(0, &refs).unwrap_or_else(|e| panic!("{what} at {dims:?}: {e}"));
                common::assert_close(&format!("Ascend: {what} at {dims:?}"), &got, &want);
            }
        }
    }
}

/// A decoder layer with KV caches written in place on the device (cache_write kernels),
/// a prefill then single steps: outputs and caches against the reference at each call.
#[test]
fn a_decoder_with_kv_caches_matches_the_reference_on_ascend() {
    use decoder_graphs::{decoder_layer, SMALL};
    let target = Target::ascend910b();
    let z = SMALL;
    // Launches priced dear: every merge pays, so each RMSNorm runs (statistics included)
    // in the projections that read it, its A rows staged by the vector cores.
    let dear = Target { launch_us: 50.0, inline_below_elems: 0, ..target.clone() };
    for (level, target, tag) in [(0u8, &target, ""), (3, &target, ""), (3, &dear, "n")] {
        let opts = Options { opt_level: level, ..Options::default() };
        let unit = Unit::from_graph(decoder_layer(z), opts).unwrap();
        if !tag.is_empty() {
            let plan = &unit.variant(Variant::Fused, target).plan;
            let g = &unit.graph;
            let normed = plan.groups.iter().filter(|grp| {
                let has = |f: &dyn Fn(&autofusion_compiler::ir::Op) -> bool| {
                    grp.nodes.iter().any(|m| f(&g.node(*m).op))
                };
                has(&|op| *op == autofusion_compiler::ir::Op::MatMul)
                    && has(&|op| matches!(op, autofusion_compiler::ir::Op::Reduce { .. }))
            });
            assert!(normed.count() >= 3, "the norms run in the projections");
        }
        if level == 3 {
            // SwiGLU's gate and up: two products of one kernel (`sibling_matmul`).
            let plan = &unit.variant(Variant::Fused, target).plan;
            let g = &unit.graph;
            let paired = plan.groups.iter().filter(|grp| {
                grp.nodes
                    .iter()
                    .filter(|m| g.node(**m).op == autofusion_compiler::ir::Op::MatMul)
                    .count()
                    == 2
                    && format!("{:?}", grp.kind) == "MatMul"
            });
            assert_eq!(paired.count(), 1, "{tag}: gate and up in one matmul kernel");
        }
        let what = format!("decoder_kv at opt_level {level}{tag}");
        let (_, m) = build_and_load(&unit, target, &format!("kv{level}{tag}"), &what);
        decoder_steps_match_the_reference(&m, z, &what);
    }
}

/// Calls of a decoder layer (`decoder_graphs::decoder_layer(z)`) from position 0 (a prefill
/// of 5, then 1 and 2 tokens) on the device, each output and the caches it leaves against
/// the reference.
fn decoder_steps_match_the_reference(
    m: &autofusion_runtime::ascend::AscendModule,
    z: decoder_graphs::Sizes,
    what: &str,
) {
    use decoder_graphs::{caches, rope_tables, weights};
    let t = 16usize;
    let (cos, sin) = rope_tables(t, z.dh as usize);
    let w = weights(z, 11);
    let x = Tensor::randn(&[8, z.d as usize], 1.0, 2);
    let ((mut kc, mut vc), (mut rk, mut rv)) = (caches(z, t), caches(z, t));
    let mut p = 0usize;
    for s in [5usize, 1, 2] {
        let d = z.d as usize;
        let xs = Tensor::from_f32(&[s, d], x.to_f32_vec()[p * d..(p + s) * d].to_vec()).unwrap();
        let mut ins: Vec<&Tensor> = vec![&xs, &cos, &sin];
        ins.extend(w.iter());
        let dims = [("P", p as i64)];
        let got = m
            .run_with_state(0, &ins, &mut [&mut kc, &mut vc], &dims)
            .unwrap_or_else(|e| panic!("{what} at P = {p}: {e}"));
        let want = m.reference_with_state(&ins, &mut [&mut rk, &mut rv], &dims).unwrap();
        let at = format!("Ascend: {what} at P = {p}, S = {s}");
        common::assert_close(&at, &got, &want);
        common::assert_close(
            &format!("{at}, caches"),
            &[kc.clone(), vc.clone()],
            &[rk.clone(), rv.clone()],
        );
        p += s;
    }
}

/// With launches priced dear, RoPE runs in the Q and K projections' epilogues, head by head
/// in the natural split of each product (the C tile's rows walked one head at a time), and
/// the new keys and values go from the epilogues straight to their cache rows; as parts of
/// a horizontal Q/K/V kernel too. Head dims 6 (a head is not a whole number of 32-byte
/// blocks) and 64, against the reference.
#[test]
fn rope_and_the_cache_writes_run_in_the_projection_epilogues_on_ascend() {
    use decoder_graphs::Sizes;
    let dear = Target { launch_us: 50.0, inline_below_elems: 0, ..Target::ascend910b() };
    let cases = [
        (Sizes { d: 24, h: 6, kvh: 3, dh: 6, f: 40 }, true),
        (Sizes { d: 64, h: 4, kvh: 2, dh: 64, f: 96 }, false),
    ];
    for (z, horizontal) in cases {
        let unit = decoder_graphs::rope_in_the_projections(z, horizontal, &dear);
        let what = format!("decoder_kv dh {} horizontal {horizontal}", z.dh);
        let (_, m) = build_and_load(&unit, &dear, &format!("rope_epi{}", z.dh), &what);
        decoder_steps_match_the_reference(&m, z, &what);
    }
}

/// A decode step over a long cache: few query heads leave most AIVs idle, so DynamicTiling
/// splits the keys into ranges (flash-decoding) whose partial results the kernel merges after
/// `SyncAll`. The plan is checked to split, the step against the reference.
#[test]
fn a_decode_step_over_a_long_cache_splits_its_keys_on_ascend() {
    use decoder_graphs::{decoder_layer, rope_tables, weights, SMALL};
    let target = Target::ascend910b();
    let z = SMALL;
    let t = 1800usize;
    let (cos, sin) = rope_tables(t, z.dh as usize);
    let w = weights(z, 13);
    let opts = Options { opt_level: 3, ..Options::default() };
    let unit = Unit::from_graph(decoder_layer(z), opts).unwrap();
    let (_, m) = build_and_load(&unit, &target, "kvsplit", "decoder_kv split");
    for p in [1100usize, 1700] {
        // A cache already holding `p` rows, as a prefill would have left it.
        let shape = [z.kvh as usize, 1, t, z.dh as usize];
        let rows = |seed: u64| {
            let r = Tensor::randn(&shape, 1.0, seed).to_f32_vec();
            let v: Vec<f32> = r
                .chunks(z.dh as usize)
                .enumerate()
                .flat_map(|(i, c)| c.iter().map(move |x| if i % t < p { *x } else { 0.0 }))
                .collect();
            Tensor::from_f32(&shape, v).unwrap()
        };
        let (mut kc, mut vc) = (rows(21), rows(22));
        let (mut rk, mut rv) = (kc.clone(), vc.clone());
        let x = Tensor::randn(&[1, z.d as usize], 1.0, 23);
        let mut ins: Vec<&Tensor> = vec![&x, &cos, &sin];
        ins.extend(w.iter());
        let dims: Vec<i64> = m
            .graph()
            .dyn_dims
            .iter()
            .map(|d| match d.as_str() {
                "S" => 1,
                "P" => p as i64,
                "T" => t as i64,
                other => panic!("decoder_kv: unexpected dim {other}"),
            })
            .collect();
        let plan = m.shape_plan(&dims).unwrap();
        let splits = plan.launches.iter().map(|l| l.tiling.splits).max().unwrap_or(0);
        assert!(splits >= 2, "P = {p}: the attention's keys are split ({splits})");
        let pd = [("P", p as i64)];
        let got = m.run_with_state(0, &ins, &mut [&mut kc, &mut vc], &pd).unwrap();
        let want = m.reference_with_state(&ins, &mut [&mut rk, &mut rv], &pd).unwrap();
        let at = format!("Ascend: decoder_kv step at P = {p}, {splits} key ranges");
        common::assert_close(&at, &got, &want);
        common::assert_close(&format!("{at}, caches"), &[kc, vc], &[rk, rv]);
    }
}

/// Cache writes of other layouts and dtypes (f16 rows, a batch, the last axis) on the device.
#[test]
fn cache_writes_of_any_layout_match_the_reference_on_ascend() {
    let target = Target::ascend910b();
    for graph in decoder_graphs::cache_layouts() {
        for level in [0u8, 3] {
            let opts = Options { opt_level: level, ..Options::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let what = format!("{} at opt_level {level}", graph.name);
            let (_, m) = build_and_load(&unit, &target, &format!("kvl{level}"), &what);
            decoder_graphs::check_layout_calls(
                &graph,
                &format!("Ascend: {what}"),
                |x, c, dims| m.run_with_state(0, &[x], &mut [c], dims).unwrap(),
                |x, c, dims| m.reference_with_state(&[x], &mut [c], dims).unwrap(),
            );
        }
    }
}

/// A session of a 2-layer decoder on the device (`session::OnDevice` runners: the caches stay
/// on the device between calls): prefill then steps, logits equal to a host session's.
#[test]
fn a_session_runs_on_the_ascend_device() {
    use autofusion::{Decoder, Session};
    use autofusion_runtime::session::OnDevice;
    use decoder_graphs::{decoder_layer, embed_graph, head_graph, rope_tables, weights, SMALL, V};
    let (target, t) = (Target::ascend910b(), 16usize);
    let graphs = [embed_graph(), decoder_layer(SMALL), head_graph()];
    let units: Vec<Unit> = graphs
        .iter()
        .map(|g| {
            Unit::from_graph(g.clone(), Options { opt_level: 3, ..Options::default() }).unwrap()
        })
        .collect();
    let device: Vec<_> =
        units.iter().map(|u| build_and_load(u, &target, "sess", &u.graph.name).1).collect();
    let host: Vec<_> = units
        .iter()
        .map(|u| {
            common::load(
                u,
                Variant::Fused,
                &autofusion_compiler::target::Target::host(),
                &dir(),
                &[],
            )
            .unwrap()
        })
        .collect();
    let (cos, sin) = rope_tables(t, SMALL.dh as usize);
    let table = Tensor::randn(&[V, 32], 1.0, 1);
    let layer_w = [weights(SMALL, 10), weights(SMALL, 20)];
    let norm = Tensor::from_f32(&[32], vec![1.0; 32]).unwrap();
    let w_out = Tensor::randn(&[32, V], 0.2, 2);
    let on: Vec<OnDevice> = device.iter().map(|m| OnDevice { module: m, device: 0 }).collect();
    // The same weights for both: tables, per-layer weights, the head's.
    fn decoder<'a>(
        r: [&'a dyn autofusion::Runner; 3],
        w: &'a [Tensor],
        layers: &'a [Vec<Tensor>],
    ) -> Decoder<'a> {
        Decoder {
            embed: r[0],
            embed_inputs: vec![&w[0]],
            layer: r[1],
            layer_inputs: layers
                .iter()
                .map(|l| [&w[1], &w[2]].into_iter().chain(l.iter()).collect())
                .collect(),
            head: r[2],
            head_inputs: vec![&w[3], &w[4]],
        }
    }
    let w = [table, cos, sin, norm, w_out];
    let dev_dec = decoder([&on[0], &on[1], &on[2]], &w, &layer_w);
    let host_dec = decoder([&host[0], &host[1], &host[2]], &w, &layer_w);
    let (mut a, mut b) = (Session::new(&dev_dec, t).unwrap(), Session::new(&host_dec, t).unwrap());
    let ids = [3i64, 17, 4, 49, 0];
    let (got, want) = (a.prefill(&ids).unwrap(), b.prefill(&ids).unwrap());
    common::assert_close("session prefill on Ascend", &[got], &[want]);
    for id in [8i64, 21, 5] {
        let (got, want) = (a.step(id).unwrap(), b.step(id).unwrap());
        common::assert_close(
            &format!("session step at {} on Ascend", a.position()),
            &[got],
            &[want],
        );
    }
}

/// The DSL decoder with caches through its entry point on the device
/// (`run_on(Device::Ascend(0), .., &mut k_cache, &mut v_cache, p)`), against its reference.
#[test]
fn the_dsl_decoder_with_caches_runs_on_the_ascend_device() {
    use decoder_graphs::{caches, rope_tables, weights, SMALL};
    let (z, t) = (SMALL, 16usize);
    let (cos, sin) = rope_tables(t, z.dh as usize);
    let w = weights(z, 5);
    let ((mut kc, mut vc), (mut rk, mut rv)) = (caches(z, t), caches(z, t));
    let mut p = 0;
    for s in [4usize, 1, 1] {
        let xs = Tensor::randn(&[s, z.d as usize], 1.0, p as u64);
        let got = dsl::decoder_kv::run_on(
            Device::Ascend(0),
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
            &mut kc,
            &mut vc,
            p,
        )
        .unwrap_or_else(|e| panic!("decoder_kv on Ascend at P = {p}: {e}"));
        let want = dsl::decoder_kv::reference(
            &xs, &cos, &sin, &w[0], &w[1], &w[2], &w[3], &w[4], &w[5], &w[6], &w[7], &w[8],
            &mut rk, &mut rv, p,
        )
        .unwrap();
        common::assert_close(&format!("decoder_kv on Ascend at P = {p}"), &[got], &[want]);
        p += s;
    }
    assert!(kc.max_abs_diff(&rk).unwrap() <= 1e-5 && vc.max_abs_diff(&rv).unwrap() <= 1e-5);
}

/// Integer and bool graphs on the vector unit, which carries them in f32 lanes: values below
/// 2^24 (ids, positions, lengths) are exact, so inputs stay within +-1000 (products < 2^24).
#[test]
fn integer_graphs_match_the_reference_on_ascend() {
    let target = Target::ascend910b();
    for graph in [integer_graphs::int_ops(), integer_graphs::hf_masks()] {
        for level in 0..=3u8 {
            let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let name = format!("{} at opt_level {level}", graph.name);
            let (built, m) = build_and_load(&unit, &target, &format!("ints{level}"), &name);
            for s in [1usize, 7, 100] {
                let ins = integer_graphs::inputs(&unit.graph, s, 1000, s as u64 + 9);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let dims = [s as i64];
                let want = autofusion_runtime::reference::run(&unit.graph, &refs, &dims).unwrap();
                let got = m.run(0, &refs).unwrap_or_else(|e| panic!("{name}, S = {s}: {e}"));
                common::assert_close(&format!("Ascend: {name}, S = {s}"), &got, &want);
            }
            eprintln!("ok: {name} ({} kernels)", built.plan.groups.len());
        }
    }
}

/// Gathers on the vector unit: the embedding layer (table rows by `DataCopyPad`, summed and
/// normalised in one kernel) and gathers along other axes (element by element).
#[test]
fn gathers_match_the_reference_on_ascend() {
    let target = Target::ascend910b();
    let graph = integer_graphs::embeddings();
    for level in [0u8, 3] {
        let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let what = format!("{} at opt_level {level}", graph.name);
        let (_, m) = build_and_load(&unit, &target, &format!("gather{level}"), &what);
        for s in [1usize, 7, 100] {
            let ins = integer_graphs::embedding_inputs(&unit.graph, s, s as u64);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = autofusion_runtime::reference::run(&unit.graph, &refs, &[s as i64]).unwrap();
            let got = m.run(0, &refs).unwrap_or_else(|e| panic!("opt_level {level}, S = {s}: {e}"));
            common::assert_close(
                &format!("Ascend: embeddings at opt_level {level}, S = {s}"),
                &got,
                &want,
            );
        }
        // An id outside its table: an error before anything runs.
        let mut ins = integer_graphs::embedding_inputs(&unit.graph, 5, 1);
        ins[0] = Tensor::from_i64(&[5], vec![0, 1, integer_graphs::VOCAB, 2, 3]).unwrap();
        let refs: Vec<&Tensor> = ins.iter().collect();
        let e = m.run(0, &refs).unwrap_err().to_string();
        assert!(e.contains("`input_ids`") && e.contains("`word_embeddings`"), "{e}");
    }
    // Ids a kernel computes: checked in device memory once that kernel is done.
    let graph = integer_graphs::shifted_lookup();
    let table = Tensor::randn(&[10, 8], 1.0, 3);
    let ids = Tensor::from_i64(&[4], vec![1, 2, 3, 4]).unwrap();
    for level in [0u8, 3] {
        let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let what = format!("{} at opt_level {level}", graph.name);
        let (_, m) = build_and_load(&unit, &target, &format!("shifted{level}"), &what);
        let ok = Tensor::from_i64(&[4], vec![0, 5, -1, -14]).unwrap();
        let refs = [&ids, &ok, &table];
        let want = autofusion_runtime::reference::run(&unit.graph, &refs, &[4]).unwrap();
        common::assert_close(
            &format!("shifted, opt_level {level}"),
            &m.run(0, &refs).unwrap(),
            &want,
        );
        let bad = Tensor::from_i64(&[4], vec![0, 5, 7, 0]).unwrap();
        let e = m.run(0, &[&ids, &bad, &table]).unwrap_err().to_string();
        assert!(e.contains("`shifted`") && e.contains("10 at element 2"), "{e}");
    }
}

/// A dynamic batch with padding masks on the vector and cube units: masked (and causal)
/// attention over batch x heads as one flash kernel at opt_level 3, and a whole encoder layer
/// over `[B, S, D]`, against the reference.
#[test]
fn batched_padded_attention_matches_the_reference_on_ascend() {
    let target = Target::ascend910b();
    let graphs = [
        batched_graphs::attention(false, false),
        batched_graphs::attention(true, false),
        batched_graphs::encoder_layer(),
    ];
    for graph in graphs {
        for level in [0u8, 3] {
            let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let name = format!("{} at opt_level {level}", graph.name);
            let (built, m) = build_and_load(&unit, &target, &format!("batch{level}"), &name);
            for (b, s) in [(1usize, 7usize), (3, 33)] {
                let ins = if graph.name == "batched_encoder" {
                    let mut ins = common::inputs(&unit.graph, &[b as i64, s as i64], 5);
                    let mask: Vec<i64> =
                        (0..b).flat_map(|i| (0..s).map(move |j| (j + i < s) as i64)).collect();
                    ins[1] = Tensor::from_i64(&[b, s], mask).unwrap();
                    ins
                } else {
                    batched_graphs::inputs(b, s, 5)
                };
                let refs: Vec<&Tensor> = ins.iter().collect();
                let dims: Vec<i64> = unit
                    .graph
                    .dyn_dims
                    .iter()
                    .map(|d| if d == "B" { b as i64 } else { s as i64 })
                    .collect();
                let want = autofusion_runtime::reference::run(&unit.graph, &refs, &dims).unwrap();
                let got = m.run(0, &refs).unwrap_or_else(|e| panic!("{name}, B = {b}: {e}"));
                common::assert_close(&format!("Ascend: {name}, B = {b}, S = {s}"), &got, &want);
            }
            eprintln!("ok: {name} ({} kernels)", built.plan.groups.len());
        }
    }
}

/// The ONNX fixtures (Hugging Face BERT and Llama layers from both torch exporters, the seed
/// layer, a GELU MLP, exporters' shape arithmetic) imported and planned for `ascend910b` at
/// every opt level, through the Ascend path against the reference: the graphs real exporters
/// write, not only the DSL's (and an embedding model with int64 ids).
#[test]
fn onnx_fixtures_match_the_reference_on_ascend() {
    let target = Target::ascend910b();
    let fixtures =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("autofusion-onnx/tests/fixtures");
    let mut models: Vec<PathBuf> = std::fs::read_dir(&fixtures)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    models.sort();
    assert!(models.len() >= 4, "the fixtures are in {}", fixtures.display());
    for path in models {
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let model = autofusion_onnx::load(&path).unwrap();
        let graph = autofusion_onnx::import(&model, &name).unwrap().graph;
        let mut seen = std::collections::BTreeSet::new();
        for level in 0..=3u8 {
            let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
            let unit = Unit::from_graph(graph.clone(), opts).unwrap();
            let g = &unit.graph;
            let built = unit
                .build(&Ascend::new(target.clone()), Variant::Fused)
                .unwrap_or_else(|e| panic!("{name}, opt_level {level}: {e}"));
            if !seen.insert(common::plan_key(&built.plan)) {
                continue;
            }
            let sym = format!("{}_onnx{level}", unit.symbol(Variant::Fused));
            let m = common::load_ascend_built(g.clone(), &built, &sym, &dir())
                .unwrap_or_else(|e| panic!("{name}, opt_level {level}: {e}"));
            for s in [1i64, 7] {
                let dims = vec![s; g.dyn_dims.len()];
                let ins = common::inputs(g, &dims, s as u64 + 5);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = autofusion_runtime::reference::run(g, &refs, &dims).unwrap();
                let got = m
                    .run(0, &refs)
                    .unwrap_or_else(|e| panic!("{name}, opt_level {level}, S = {s}: {e}"));
                common::assert_close(
                    &format!("Ascend: {name}, opt_level {level}, dims = {s}"),
                    &got,
                    &want,
                );
            }
            eprintln!("ok: {name}, opt_level {level} ({} kernels)", built.plan.groups.len());
        }
    }
}

// Whole Hugging Face models with int64 inputs (export_torch.py), built by build.rs with
// `Builder::onnx`.
include!(concat!(env!("OUT_DIR"), "/autofusion/bert_onnx.rs"));
include!(concat!(env!("OUT_DIR"), "/autofusion/llama_onnx.rs"));

/// BERT and Llama exported whole by torch.onnx run on the device (the masks, positions and
/// index tuples computed from the int64 inputs included) with torch's outputs.
#[test]
fn hugging_face_models_built_into_the_crate_run_on_the_ascend_device() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("autofusion-onnx/tests/fixtures");
    let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
    let ids = |f: &str| Tensor::from_le_bytes(autofusion::DType::I64, &[2, 7], &read(f)).unwrap();
    let out = |f: &str, shape: &[usize]| {
        Tensor::from_le_bytes(autofusion::DType::F32, shape, &read(f)).unwrap()
    };
    let dev = Device::Ascend(0);
    let (i, m, t) =
        (ids("bert_model_dy.in0.bin"), ids("bert_model_dy.in1.bin"), ids("bert_model_dy.in2.bin"));
    let (h, p) = bert_onnx::run_on(dev, &i, &m, &t).unwrap();
    let torch =
        [out("bert_model_dy.out0.bin", &[2, 7, 32]), out("bert_model_dy.out1.bin", &[2, 32])];
    common::assert_close("bert_onnx on Ascend vs torch", &[h, p], &torch);
    let (i, m) = (ids("llama_model_ts.in0.bin"), ids("llama_model_ts.in1.bin"));
    let logits = llama_onnx::run_on(dev, &i, &m).unwrap();
    let torch = [out("llama_model_ts.out0.bin", &[2, 7, 99])];
    common::assert_close("llama_onnx on Ascend vs torch", &[logits], &torch);
}

/// Three projections of one normed activation (`qkv_horizontal`) as one Ascend kernel whose
/// parts need different Matmul objects (B as stored, B transposed: a `[N, K]` weight), each
/// with its own epilogue and the RMSNorm as its prologue (A staged): one kernel in all.
/// Planned under a profile where launches are dear, so every merge pays; in its own launch
/// and inside the opt_level-3 pipeline, against the reference.
#[test]
fn horizontal_projections_of_mixed_layouts_match_the_reference_on_ascend() {
    use autofusion_compiler::group::GroupKind;
    use autofusion_compiler::ir::Op;
    use autofusion_compiler::plan::{Rule, RuleSet};
    let graph = decoder_graphs::mixed_projections();
    let dear = Target { launch_us: 50.0, ..Target::ascend910b() };
    let mut rules = RuleSet::all();
    rules.insert(Rule::QkvHorizontal);
    let mut alone = rules;
    alone.remove(Rule::Pipeline);
    for (label, rules) in [("own launch", alone), ("pipeline", rules)] {
        let opts = autofusion_compiler::Options { opt_level: 3, rules, ..Default::default() };
        let unit = Unit::from_graph(graph.clone(), opts).unwrap();
        let what = format!("mixed projections, {label}");
        let (built, m) =
            build_and_load(&unit, &dear, &format!("hz_{}", rules.names().len()), &what);
        let horizontal: Vec<_> =
            built.plan.groups.iter().filter(|g| g.kind == GroupKind::Horizontal).collect();
        assert_eq!(horizontal.len(), 1, "{what}: {:?}", built.plan.groups);
        // The norm and every part's epilogue are inside: one kernel in all.
        assert_eq!(built.plan.groups.len(), 1, "{what}: {:?}", built.plan.groups);
        let matmuls = horizontal[0].nodes.iter().filter(|n| unit.graph.node(**n).op == Op::MatMul);
        assert_eq!(matmuls.count(), 3, "{what}");
        // B as stored and B transposed take two objects; each part stages its normed A.
        let code = &built.source.code;
        assert!(code.contains("mm1.End();"), "{what}: one Matmul object for every layout");
        assert_eq!(code.matches("stage A (the norm prologue").count(), 3, "{what}");
        for s in [1i64, 7, 100] {
            let ins = common::inputs(&unit.graph, &[s], s as u64 + 5);
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = autofusion_runtime::reference::run(&unit.graph, &refs, &[s]).unwrap();
            let got = m.run(0, &refs).unwrap_or_else(|e| panic!("{what}, S = {s}: {e}"));
            common::assert_close(&format!("Ascend: {what}, S = {s}"), &got, &want);
        }
    }
}

/// SwiGLU whose mul went into up's kernel first: gate's kernel, SiLU included, joins it as
/// the sibling product (`sibling_matmul`), its SiLU computed from the sibling's C tile. The
/// seeded plan is one kernel, against the reference (host twin: `tests/kv_cache.rs`).
#[test]
fn gate_with_its_activation_joins_the_kernel_up_and_the_mul_formed_on_ascend() {
    use autofusion_compiler::plan::plan_from;
    let unit = Unit::from_graph(common::swiglu_graph(), Options::default()).unwrap();
    let g = &unit.graph;
    let dear = Target { launch_us: 50.0, inline_below_elems: 0, ..Target::ascend910b() };
    let seed = common::seed_groups(g, &[("gate", &["gate", "act"]), ("up", &["up", "h"])]);
    let rules = unit.lowered.options.rules;
    let plan = plan_from(g, 3, rules, &[], &dear, Some(&seed));
    assert_eq!(plan.groups.len(), 1, "{:?}", plan.groups);
    let sym = format!("{}_seeded", unit.symbol(Variant::Fused));
    let built = unit.build_plan(&Ascend::new(dear), Variant::Fused, plan, &sym).unwrap();
    let m = common::load_ascend_built(g.clone(), &built, &sym, &dir()).unwrap();
    for s in [1i64, 6, 40] {
        let ins = common::inputs(g, &[s], s as u64 + 9);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = autofusion_runtime::reference::run(g, &refs, &[s]).unwrap();
        let got = m.run(0, &refs).unwrap_or_else(|e| panic!("swiglu, S = {s}: {e}"));
        common::assert_close(&format!("Ascend: seeded swiglu, S = {s}"), &got, &want);
    }
}
