//! Helpers shared by the integration tests.
#![allow(dead_code)]

use autofusion::{tolerance, Module, Tensor};
use autofusion_compiler::ir::Graph;

/// Random inputs for every parameter of `g` with the dynamic dims bound to `dims` (in
/// `g.dyn_dims` order). Norm gains are 1 + N(0, 0.1); weights (rank >= 2 from the second
/// parameter on) N(0, 1/sqrt(fan_in)); everything else N(0, 1).
pub fn inputs(g: &Graph, dims: &[i64], seed: u64) -> Vec<Tensor> {
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    g.param_nodes()
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let n = g.node(*id);
            let shape: Vec<usize> =
                n.shape.iter().map(|d| d.eval(&bind).unwrap() as usize).collect();
            let name = &g.params[i];
            let seed = seed * 1000 + i as u64;
            if !n.dtype.is_float() {
                // Ids and masks: 0 and 1, valid for any table and as a mask.
                let v: Vec<i64> =
                    (0..shape.iter().product::<usize>()).map(|k| (k % 3 != 2) as i64).collect();
                return Tensor::from_i64(&shape, v).unwrap().to_dtype(n.dtype).unwrap();
            }
            let t = if name.contains("norm") || name.ends_with("_g") || name == "g" {
                let r = Tensor::randn(&shape, 0.1, seed);
                Tensor::from_f32(&shape, r.to_f32_vec().iter().map(|v| v + 1.0).collect()).unwrap()
            } else if i > 0
                && shape.len() >= 2
                && !matches!(name.as_str(), "cos" | "sin" | "y" | "r")
            {
                Tensor::randn(&shape, 1.0 / (shape[shape.len() - 2] as f32).sqrt(), seed)
            } else {
                Tensor::randn(&shape, 1.0, seed)
            };
            t.to_dtype(n.dtype).unwrap()
        })
        .collect()
}

/// Assert `got` matches `want` within the tolerance of each output's dtype.
pub fn assert_close(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_eq!(got.len(), want.len(), "{what}: number of outputs");
    for (k, (a, b)) in got.iter().zip(want).enumerate() {
        assert_eq!(a.dtype(), b.dtype(), "{what}: output {k} has the reference's dtype");
        let (rtol, atol) = tolerance(b.dtype());
        let err = a.max_abs_diff(b).unwrap();
        assert!(
            a.allclose(b, rtol, atol).unwrap(),
            "{what}: output {k} ({:?} {}) differs from the reference: max abs diff {err:e} (rtol {rtol:e}, atol {atol:e})",
            b.shape(),
            b.dtype()
        );
    }
}

/// The dynamic dims of `g` (in `g.dyn_dims` order) for one test size `s`: every dim is `s`
/// but a batch `B`, which takes a small size that varies with `s` (1 to 4), so that a batched
/// layer at S = 513 does not also run 513 sequences.
pub fn dims_for(g: &Graph, s: i64) -> Vec<i64> {
    g.dyn_dims.iter().map(|d| if d == "B" { s % 4 + 1 } else { s }).collect()
}

/// Fused and unfused modules against the reference at each value of the graph's dynamic dims
/// (`dims_for`).
pub fn check_module(what: &str, m: &Module, values: &[i64]) {
    let g = m.graph();
    for &s in values {
        let dims = dims_for(g, s);
        let ins = inputs(g, &dims, s as u64);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = m.reference(&refs).unwrap();
        let got = m.run(&refs).unwrap();
        assert_close(&format!("{what} at {:?} = {dims:?}", g.dyn_dims), &got, &want);
    }
}

/// Every `#[fused_graph]` of the seed example and tests/layers: (name, item, options).
pub fn layer_graphs() -> Vec<(String, syn::ItemFn, autofusion_compiler::front::Options)> {
    ["examples/seed_layer.rs", "tests/layers/mod.rs"].into_iter().flat_map(graphs_of).collect()
}

/// Every `#[fused_graph]` of one source file: (name, item, options).
pub fn graphs_of(file: &str) -> Vec<(String, syn::ItemFn, autofusion_compiler::front::Options)> {
    let src = std::fs::read_to_string(file).unwrap();
    let parsed = syn::parse_file(&src).unwrap();
    autofusion_compiler::find_graphs(&parsed.items)
        .into_iter()
        .map(|(f, attr)| {
            let options = autofusion_compiler::front::parse_options(attr).unwrap();
            (f.sig.ident.to_string(), f.clone(), options)
        })
        .collect()
}

/// Call `f` on every layer graph (`layer_graphs`), on as many threads as the machine has:
/// the tests that compile every plan of every graph are bound by the C compiler, one graph
/// at a time. Each thread parses the graphs itself (syn's items are not `Send`); a panic in
/// any call fails the caller once every thread has stopped.
pub fn each_layer_graph_in_parallel(
    f: impl Fn(String, syn::ItemFn, autofusion_compiler::front::Options) + Sync,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let count = layer_graphs().len();
    let next = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(count);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut graphs: Vec<_> = layer_graphs().into_iter().map(Some).collect();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((name, item, options)) = graphs.get_mut(i).and_then(Option::take)
                    else {
                        break;
                    };
                    f(name, item, options);
                }
            });
        }
    });
}

/// The host profile the build calibrated for this package (benchmarks plan with it), or the
/// default host figures with a note when there is none yet. The build script caches it under
/// the target dir, wherever that is (`CARGO_TARGET_DIR`, `--target-dir`): found from this
/// executable's path (`<target>/<profile>/deps/<exe>`), then from the environment.
pub fn calibrated_host() -> autofusion_compiler::target::Target {
    let mut dirs: Vec<std::path::PathBuf> = Vec::new();
    if let Ok(exe) = std::env::current_exe() {
        dirs.extend(exe.ancestors().skip(1).take(4).map(|p| p.to_path_buf()));
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        dirs.push(t.into());
    }
    dirs.push(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    for dir in &dirs {
        if let Some(t) = autofusion_compiler::target::cached_host_profile(dir) {
            return t;
        }
    }
    eprintln!(
        "note: no calibrated profile under {} (build the crate first); using host defaults",
        dirs.last().unwrap().display()
    );
    autofusion_compiler::target::Target::host()
}

/// The plans the Ascend tests build of every layer graph: (label, opt_level, rules) for each opt
/// level and at opt level 3 with the opt-in qkv_horizontal too, then each rule alone (at its
/// minimum opt level, at least 2); the pipeline rule is exercised by opt level 3.
pub fn ascend_configs() -> Vec<(String, u8, autofusion_compiler::plan::RuleSet)> {
    use autofusion_compiler::plan::{Rule, RuleSet};
    let mut v: Vec<(String, u8, RuleSet)> =
        (0..=3).map(|o| (format!("opt_level {o}"), o, RuleSet::all())).collect();
    let mut every = RuleSet::all();
    every.insert(Rule::QkvHorizontal);
    v.push(("opt_level 3, every rule and qkv_horizontal".into(), 3, every));
    for r in Rule::ALL.iter().filter(|r| **r != Rule::Pipeline) {
        let (s, level) = r.alone();
        v.push((format!("opt_level {level}, rules = [{}]", s.names().join(", ")), level, s));
    }
    v
}

/// The compiler's twelve random layer-like graphs, each at opt_level 2 and 3:
/// (seed, opt_level, the graph's dump for failure messages, unit).
pub fn random_units() -> Vec<(u64, u8, String, autofusion_compiler::Unit)> {
    let mut out = Vec::new();
    for seed in 0..12u64 {
        let graph = autofusion_compiler::testing::random_graph(seed, 6 + seed as usize % 6);
        for level in [2u8, 3] {
            let opts = autofusion_compiler::Options { opt_level: level, ..Default::default() };
            let unit = autofusion_compiler::Unit::from_graph(graph.clone(), opts).unwrap();
            out.push((seed, level, graph.dump(), unit));
        }
    }
    out
}

/// Generate, compile (`autofusion_build::jit`) and load one variant of `unit` planned for
/// `target`; `dir` holds the library, `flags` go to the C compiler after the defaults.
pub fn load(
    unit: &autofusion_compiler::Unit,
    variant: autofusion_compiler::Variant,
    target: &autofusion_compiler::target::Target,
    dir: &std::path::Path,
    flags: &[&str],
) -> autofusion::Result<Module> {
    load_built(&unit.variant(variant, target), dir, flags)
}

/// Compile and load host code generated for a plan of one's own (`Unit::build_plan`); its
/// symbol must be unique in the process.
pub fn load_built(
    built: &autofusion_compiler::Built,
    dir: &std::path::Path,
    flags: &[&str],
) -> autofusion::Result<Module> {
    let entry = &built.source.entries[0];
    let so = autofusion_build::jit::host_library(&built.source.code, dir, entry, flags)
        .map_err(|msg| autofusion::Error::Module { symbol: entry.clone(), msg })?;
    // SAFETY: the library was just generated and compiled from `built`, `entry` its descriptor.
    unsafe { autofusion_runtime::library::open_host(&so, entry) }
}

/// Compile Ascend C generated for `graph` (`Unit::build` with the Ascend backend) with the
/// toolkit found as a build finds it, into `dir/lib<name>_ascend.so`, and load it.
#[cfg(feature = "ascend")]
pub fn load_ascend_built(
    graph: Graph,
    built: &autofusion_compiler::Built,
    name: &str,
    dir: &std::path::Path,
) -> autofusion::Result<autofusion_runtime::ascend::AscendModule> {
    use autofusion_compiler::codegen::Toolchain;
    let err = |msg: String| autofusion::Error::Module { symbol: name.into(), msg };
    let so = autofusion_build::jit::library(&built.source, Toolchain::Bisheng, dir, name, &[])
        .map_err(err)?;
    let (launch, entry) = (&built.source.entries[0], &built.source.entries[1]);
    // SAFETY: the library was just generated and compiled from `built` for `graph`.
    unsafe { autofusion_runtime::library::open_ascend(&so, graph, launch, entry, name) }
}

/// `load_ascend_built` of one variant of `unit` planned for `target` (normally `ascend910b`).
#[cfg(feature = "ascend")]
pub fn load_ascend(
    unit: &autofusion_compiler::Unit,
    variant: autofusion_compiler::Variant,
    target: &autofusion_compiler::target::Target,
    dir: &std::path::Path,
) -> autofusion::Result<autofusion_runtime::ascend::AscendModule> {
    use autofusion_compiler::codegen::ascend::Ascend;
    let symbol = unit.symbol(variant);
    let built = unit
        .build(&Ascend::new(target.clone()), variant)
        .map_err(|msg| autofusion::Error::Module { symbol: symbol.clone(), msg })?;
    load_ascend_built(unit.graph.clone(), &built, &symbol, dir)
}

/// What a plan's generated kernels depend on: each kernel's kind, members, anchor and outputs,
/// and whether it runs as one pipeline launch. Plans with equal keys generate the same kernels
/// (up to names), so a test that builds every configuration builds each key once.
pub fn plan_key(p: &autofusion_compiler::plan::Plan) -> String {
    let groups: Vec<String> = p
        .groups
        .iter()
        .map(|g| format!("{:?} {:?} {:?} {:?}", g.kind, g.nodes, g.anchor, g.outputs))
        .collect();
    format!("{} | {}", p.pipeline, groups.join(" | "))
}

/// SwiGLU alone: `silu(x Wg) * (x Wu)`, x `[S, 16]`, F 24 (nodes `gate`, `act`, `up`, `h`).
pub fn swiglu_graph() -> autofusion_compiler::ir::Graph {
    use autofusion_compiler::dim::DimExpr;
    use autofusion_compiler::ir::{BinaryOp, DType, UnaryOp};
    let (s, c) = (DimExpr::sym("S"), DimExpr::constant);
    let mut b = autofusion_compiler::GraphBuilder::new("swiglu");
    let x = b.param("x", DType::F32, vec![s, c(16)]);
    let wg = b.param("w_gate", DType::F32, vec![c(16), c(24)]);
    let wu = b.param("w_up", DType::F32, vec![c(16), c(24)]);
    let gate = b.matmul(x, wg, "gate").unwrap();
    let act = b.unary(UnaryOp::Silu, gate, "act").unwrap();
    let up = b.matmul(x, wu, "up").unwrap();
    let h = b.binary(BinaryOp::Mul, act, up, "h").unwrap();
    b.output(h);
    b.finish().unwrap()
}

/// Seed groups for `plan::plan_from`: each `(anchor, members)` a matmul kernel of the named
/// nodes, every other op alone.
pub fn seed_groups(
    g: &autofusion_compiler::ir::Graph,
    kernels: &[(&str, &[&str])],
) -> Vec<autofusion_compiler::plan::Group> {
    use autofusion_compiler::group::GroupKind;
    use autofusion_compiler::ir::{NodeId, Op};
    let id = |name: &str| g.ids().find(|i| g.node(*i).name == name).expect("a node of that name");
    let group = |kind, nodes: Vec<NodeId>, anchor| autofusion_compiler::plan::Group {
        kind,
        nodes,
        anchor,
        rules: Vec::new(),
        outputs: Vec::new(),
        inputs: Vec::new(),
        cost: None,
    };
    let mut taken = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for (anchor, names) in kernels {
        let nodes: Vec<NodeId> = names.iter().map(|n| id(n)).collect();
        taken.extend(nodes.iter().copied());
        out.push(group(GroupKind::MatMul, nodes, Some(id(anchor))));
    }
    for i in g.ids() {
        let op = &g.node(i).op;
        if taken.contains(&i) || matches!(op, Op::Param { .. } | Op::Const { .. }) || op.is_view() {
            continue;
        }
        let kind = if *op == Op::MatMul { GroupKind::MatMul } else { GroupKind::Elementwise };
        out.push(group(kind, vec![i], (*op == Op::MatMul).then_some(i)));
    }
    out
}
