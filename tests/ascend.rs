//! The Ascend path end to end (feature `ascend`): every layer graph planned for `ascend910b`
//! at every opt level and with each rule alone, its Ascend C generated, compiled by the
//! toolkit's bisheng (`-Wall -Werror`), launched through AscendCL with DynamicTiling at
//! several dynamic shapes, and checked against the reference interpreter.
//! Without an NPU: `make -C ascend-sim && ASCEND_HOME_PATH=$PWD/ascend-sim cargo test --features ascend`.
#![cfg(feature = "ascend")]

mod common;

use autofusion::{Device, Tensor};
use autofusion_compiler::front::{parse_options, Options};
use autofusion_compiler::plan::{Rule, RuleSet};
use autofusion_compiler::{find_graphs, target::Target, Unit, Variant};
use std::path::PathBuf;

/// Tails and a single row; 100 spreads rows unevenly over the 48 AIVs.
const SHAPES: [i64; 3] = [1, 7, 100];

fn graphs() -> Vec<(String, syn::ItemFn, Options)> {
    let mut out = Vec::new();
    for file in ["examples/seed_layer.rs", "tests/layers/mod.rs"] {
        let src = std::fs::read_to_string(file).unwrap();
        let parsed = syn::parse_file(&src).unwrap();
        for (f, attr) in find_graphs(&parsed.items) {
            out.push((f.sig.ident.to_string(), f.clone(), parse_options(attr).unwrap()));
        }
    }
    out
}

fn configs() -> Vec<(String, u8, RuleSet)> {
    let mut v: Vec<(String, u8, RuleSet)> = (0..=3).map(|o| (format!("opt_level {o}"), o, RuleSet::all())).collect();
    // qkv_horizontal (opt-in) has no Ascend generator yet: `Unit::variant_ascend` says so.
    for r in Rule::ALL.iter().filter(|r| r.implemented() && !matches!(**r, Rule::Pipeline | Rule::QkvHorizontal)) {
        let mut s = RuleSet::none();
        s.insert(*r);
        v.push((format!("opt_level {}, rules = [{}]", r.min_opt_level().max(2), r.name()), r.min_opt_level().max(2), s));
    }
    v
}

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
    for (name, item, base) in graphs() {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let unit0 = Unit::with_options(base.clone(), &item).unwrap();
        let g = unit0.graph.clone();
        let cases: Vec<(i64, Vec<Tensor>, Vec<Tensor>)> = SHAPES
            .iter()
            .map(|&s| {
                let dims = vec![s; g.dyn_dims.len()];
                let ins = common::inputs(&g, &dims, s as u64 + 17);
                let refs: Vec<&Tensor> = ins.iter().collect();
                let want = autofusion_runtime::reference::run(&g, &refs, &dims).unwrap();
                (s, ins, want)
            })
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for (label, level, rules) in configs() {
            let opts = Options { opt_level: level, rules, ..base.clone() };
            let unit = Unit::with_options(opts, &item).unwrap();
            // Plans that generate the same code are built once.
            let (_, src) = unit.variant_ascend(Variant::Fused, &target).unwrap_or_else(|e| panic!("{name}, {label}: {e}"));
            if !seen.insert(src.code.clone()) {
                continue;
            }
            let sym = format!("{}_{}", unit.symbol(Variant::Fused), seen.len());
            let m = autofusion_runtime::jit::load_ascend_built(g.clone(), &src, &sym, &dir(), false).unwrap_or_else(|e| panic!("{name}, {label}: {e}"));
            for (s, ins, want) in &cases {
                let refs: Vec<&Tensor> = ins.iter().collect();
                let got = m.run(0, &refs).unwrap_or_else(|e| panic!("{name}, {label}, S = {s}: {e}"));
                common::assert_close(&format!("Ascend: {name}, {label}, S = {s}"), &got, want);
            }
            eprintln!("ok: {name}, {label} ({} kernels)", src.kernels.len());
        }
    }
}
