//! How well the cost model predicts this machine: for every candidate the planner scored on
//! the seed, BERT and Llama layers at three sequence lengths, and on a decode step of a
//! Llama-style layer with a KV cache (SmolLM2-135M's shapes, S = 1 at positions 0, 512 and
//! 2048), build the graph twice (the candidate's parts as separate kernels, and fused), time
//! the kernels involved on the host, and compare with the prediction.
//!
//!     cargo bench --bench planner_accuracy [-- --only decode|layers]
//!
//! Prints one line per candidate, the median relative error of predicted kernel times, the
//! kept fusions that were measurably slower than their parts, and finally
//! `decision accuracy: <k>/<n> (<p>%)` (predicted sign of the benefit = measured sign). Parts
//! and fused builds are timed interleaved, 11 times each; a kernel's time is its minimum over
//! the runs (interference only adds time), and the accuracy with medians is printed too.

use autofusion::Tensor;
use autofusion_compiler::codegen::host::Host;
use autofusion_compiler::group::GroupKind;
use autofusion_compiler::plan::{plan, plan_from, Candidate, Decision, Group, Plan, Rule};
use autofusion_compiler::target::Target;
use autofusion_compiler::{find_graphs, ir::Op, Unit, Variant};
use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/decoder_graphs/mod.rs"]
mod decoder_graphs;

/// What a point's kernels are timed on: a stateless layer's inputs, or a decode step's
/// inputs, its caches and the position.
enum Inputs {
    Plain(Vec<Tensor>),
    Decode { ins: Vec<Tensor>, caches: [Tensor; 2], p: i64 },
}

impl Inputs {
    fn time(&mut self, m: &autofusion::Module) -> Vec<f64> {
        match self {
            Inputs::Plain(ins) => {
                let refs: Vec<&Tensor> = ins.iter().collect();
                m.time_kernels(&refs, 1).unwrap()
            }
            Inputs::Decode { ins, caches: [k, v], p } => {
                let refs: Vec<&Tensor> = ins.iter().collect();
                m.time_kernels_with_state(&refs, &mut [k, v], &[("P", *p)], 1).unwrap()
            }
        }
    }
}

/// One planned and timed point: a unit, the dims it is planned for, a label, its inputs.
struct Point {
    unit: Unit,
    hints: Vec<(String, i64)>,
    label: String,
    inputs: Inputs,
}

/// The layers at S = 16, 128, 512.
fn layer_points() -> Vec<Point> {
    let mut out = Vec::new();
    for u in units() {
        for s in [16i64, 128, 512] {
            let inputs = Inputs::Plain(common::inputs(&u.graph, &[s], 7));
            let hints = vec![("S".to_string(), s)];
            out.push(Point { unit: u.clone(), hints, label: format!("S={s}"), inputs });
        }
    }
    out
}

/// A decode step (S = 1) of the KV-cache layer at SmolLM2-135M's shapes, at three positions.
fn decode_points() -> Vec<Point> {
    use decoder_graphs::{caches, decoder_layer, rope_tables, weights, Sizes};
    let z = Sizes { d: 576, h: 9, kvh: 3, dh: 64, f: 1536 };
    let t = 2049usize;
    let opts = autofusion_compiler::Options { opt_level: 3, ..Default::default() };
    let unit = Unit::from_graph(decoder_layer(z), opts).unwrap();
    let mut out = Vec::new();
    for p in [0i64, 512, 2048] {
        let (cos, sin) = rope_tables(t, z.dh as usize);
        let mut ins = vec![Tensor::randn(&[1, z.d as usize], 1.0, 3), cos, sin];
        ins.extend(weights(z, 11));
        let (k, v) = caches(z, t);
        let hints = [("S", 1), ("T", t as i64), ("P", p)].map(|(n, v)| (n.to_string(), v)).to_vec();
        let inputs = Inputs::Decode { ins, caches: [k, v], p };
        out.push(Point { unit: unit.clone(), hints, label: format!("P={p}"), inputs });
    }
    out
}

fn units() -> Vec<Unit> {
    let mut out = Vec::new();
    for (file, names) in [
        ("examples/seed_layer.rs", &["seed_layer"][..]),
        ("tests/layers/mod.rs", &["bert_layer", "llama_block"][..]),
    ] {
        let src =
            std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        let parsed = syn::parse_file(&src).unwrap();
        for (f, attr) in find_graphs(&parsed.items) {
            if names.contains(&f.sig.ident.to_string().as_str()) {
                let mut o = autofusion_compiler::front::parse_options(attr).unwrap();
                o.opt_level = 3;
                out.push(Unit::with_options(o, f).unwrap());
            }
        }
    }
    out
}

fn kind_of(
    g: &autofusion_compiler::ir::Graph,
    nodes: &BTreeSet<autofusion_compiler::ir::NodeId>,
    rule: Option<Rule>,
) -> (GroupKind, Option<autofusion_compiler::ir::NodeId>) {
    // An attention pattern is a flash kernel whichever rule grew it (flash_attention, or
    // layout_store adding the copy it writes): guessing MatMul from its first matmul built a
    // group no generator can emit (the reduce_max-in-an-epilogue panic of issue 36).
    if let Some(f) = autofusion_compiler::group::flash_parts(g, nodes) {
        return (GroupKind::FlashAttention, Some(f.pv));
    }
    if rule == Some(Rule::FlashAttention) {
        panic!("a flash_attention candidate that is not an attention pattern");
    }
    if let Some(m) = nodes.iter().find(|n| g.node(**n).op == Op::MatMul) {
        return (GroupKind::MatMul, Some(*m));
    }
    if nodes.iter().any(|n| matches!(g.node(*n).op, Op::Concat { .. })) {
        return (GroupKind::Concat, None);
    }
    if nodes.iter().any(|n| matches!(g.node(*n).op, Op::CacheWrite { .. })) {
        return (GroupKind::CacheWrite, None);
    }
    (GroupKind::Elementwise, None)
}

fn group(
    g: &autofusion_compiler::ir::Graph,
    nodes: BTreeSet<autofusion_compiler::ir::NodeId>,
    rule: Option<Rule>,
) -> Group {
    let (kind, anchor) = kind_of(g, &nodes, rule);
    Group {
        kind,
        nodes: nodes.into_iter().collect(),
        anchor,
        rules: Vec::new(),
        outputs: Vec::new(),
        inputs: Vec::new(),
        cost: None,
    }
}

/// A plan holding `groups` and every other op as its own kernel.
fn plan_with(u: &Unit, groups: Vec<Group>, p: &Plan, target: &Target) -> Plan {
    let g = &u.graph;
    let covered: BTreeSet<_> = groups.iter().flat_map(|gr| gr.nodes.iter().copied()).collect();
    let mut all = groups;
    for id in g.ids() {
        let op = &g.node(id).op;
        if !covered.contains(&id)
            && !matches!(op, Op::Param { .. } | Op::Const { .. })
            && !op.is_view()
        {
            all.push(group(g, [id].into_iter().collect(), None));
        }
    }
    plan_from(g, 0, autofusion_compiler::plan::RuleSet::none(), &p.hints, target, Some(&all))
}

struct Ctx<'a> {
    modules: &'a mut HashMap<String, autofusion::Module>,
    n_sym: &'a mut usize,
    dir: &'a PathBuf,
}

impl Ctx<'_> {
    /// Build (or reuse) the module of a plan holding `groups` (and every other op alone).
    fn module_for(
        &mut self,
        u: &Unit,
        groups: Vec<Group>,
        p: &Plan,
        target: &Target,
    ) -> (String, Plan) {
        let g = &u.graph;
        let pl = plan_with(u, groups, p, target);
        let key: Vec<Vec<_>> = pl.groups.iter().map(|gr| gr.nodes.clone()).collect();
        let key = format!("{}:{key:?}", g.name);
        if !self.modules.contains_key(&key) {
            *self.n_sym += 1;
            let sym = format!("af_bench_{}_{}", g.name, self.n_sym);
            let host = Host::new(target.clone());
            let built = u.build_plan(&host, Variant::Fused, pl.clone(), &sym).unwrap();
            let m = common::load_built(&built, self.dir, &["-O3"]).unwrap();
            self.modules.insert(key.clone(), m);
        }
        (key, pl)
    }
}

struct Measured {
    parts_us: f64,
    fused_us: f64,
    kernels: Vec<(String, f64, f64)>,
}

/// A kernel's class for the per-class error summary: its kind, and for rows kernels how many
/// reductions it runs (each adds a pass over the row).
fn class_of(g: &autofusion_compiler::ir::Graph, gr: &Group) -> String {
    let reds = gr.nodes.iter().filter(|n| matches!(g.node(**n).op, Op::Reduce { .. })).count();
    match gr.kind {
        GroupKind::Elementwise if reds > 0 => format!("rows/{reds}red"),
        GroupKind::Elementwise => "elementwise".into(),
        GroupKind::MatMul if gr.nodes.len() > 1 => "matmul+fused".into(),
        k => format!("{k:?}").to_lowercase(),
    }
}

fn main() {
    let target = common::calibrated_host();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/planner_accuracy");
    let reps = 11;
    let mut modules: HashMap<String, autofusion::Module> = HashMap::new();
    let mut n_sym = 0usize;
    let (mut right, mut total, mut right_med) = (0usize, 0usize, 0usize);
    let mut rel_errors: Vec<f64> = Vec::new();
    let mut slower: Vec<String> = Vec::new();
    let mut ratios: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    println!("target: {}", target.sources.join("; "));
    println!(
        "{:<12} {:>6} {:<20} {:>9} {:>9} {:>9} {:>9}  decision  sign",
        "layer", "point", "rule", "pred us", "meas us", "pred fus", "meas fus"
    );
    let args: Vec<String> = std::env::args().collect();
    let only = args.iter().position(|a| a == "--only").and_then(|i| args.get(i + 1)).cloned();
    let mut points = Vec::new();
    if only.as_deref() != Some("decode") {
        points.extend(layer_points());
    }
    if only.as_deref() != Some("layers") {
        points.extend(decode_points());
    }
    for mut pt in points {
        let u = &pt.unit;
        let g = &u.graph;
        let s = &pt.label;
        {
            let p = plan(g, 3, u.lowered.options.rules, &pt.hints, &target);
            let cands: Vec<&Candidate> = p
                .candidates
                .iter()
                .filter(|c| c.fused_us > 0.0 && c.rule.is_some() && c.rule != Some(Rule::Pipeline))
                .collect();
            for c in cands {
                let prod: BTreeSet<_> = c.producer.iter().copied().collect();
                let cons: Vec<BTreeSet<_>> =
                    c.consumers.iter().map(|x| x.iter().copied().collect()).collect();
                let mut parts = vec![prod.clone()];
                parts.extend(cons.iter().cloned());
                let fused: Vec<BTreeSet<_>> = if c.rule == Some(Rule::FlashAttention) {
                    vec![parts.iter().flatten().copied().collect()]
                } else {
                    cons.iter().map(|x| x.union(&prod).copied().collect()).collect()
                };
                let mut ctx = Ctx { modules: &mut modules, n_sym: &mut n_sym, dir: &dir };
                let (kp, pp) = ctx.module_for(
                    u,
                    parts.iter().map(|x| group(g, x.clone(), None)).collect(),
                    &p,
                    &target,
                );
                let (kf, pf) = ctx.module_for(
                    u,
                    fused.iter().map(|x| group(g, x.clone(), c.rule)).collect(),
                    &p,
                    &target,
                );
                // Interleave the two builds so both see the same machine state; medians.
                let (mut tp, mut tf): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (Vec::new(), Vec::new());
                for _ in 0..reps {
                    tp.push(pt.inputs.time(&modules[&kp]));
                    tf.push(pt.inputs.time(&modules[&kf]));
                }
                // Interference on a shared machine only adds time: the minimum estimates a
                // kernel's own time best; the median is reported beside it.
                let stat = |runs: &[Vec<f64>], k: usize, use_min: bool| {
                    let mut v: Vec<f64> = runs.iter().map(|r| r[k]).collect();
                    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
                    if use_min {
                        v[0]
                    } else {
                        v[v.len() / 2]
                    }
                };
                let pick = |pl: &Plan,
                            runs: &[Vec<f64>],
                            want: &[BTreeSet<autofusion_compiler::ir::NodeId>],
                            use_min: bool| {
                    let mut sum = 0.0;
                    let mut ks = Vec::new();
                    for (k, gr) in pl.groups.iter().enumerate() {
                        let nodes: BTreeSet<_> = gr.nodes.iter().copied().collect();
                        if want.contains(&nodes) {
                            let t = stat(runs, k, use_min);
                            sum += t;
                            if let Some(c) = &gr.cost {
                                ks.push((class_of(g, gr), c.time_us, t));
                            }
                        }
                    }
                    (sum, ks)
                };
                let (mp, kp) = pick(&pp, &tp, &parts, true);
                let (mf, kf) = pick(&pf, &tf, &fused, true);
                let (mp_med, _) = pick(&pp, &tp, &parts, false);
                let (mf_med, _) = pick(&pf, &tf, &fused, false);
                right_med += ((c.parts_us - c.fused_us > 0.0) == (mp_med - mf_med > 0.0)) as usize;
                let m = Measured {
                    parts_us: mp,
                    fused_us: mf,
                    kernels: kp.into_iter().chain(kf).collect(),
                };
                let pred = c.parts_us - c.fused_us;
                let meas = m.parts_us - m.fused_us;
                let ok = (pred > 0.0) == (meas > 0.0);
                total += 1;
                right += ok as usize;
                for (class, pk, mk) in &m.kernels {
                    if *mk > 0.0 {
                        rel_errors.push((pk - mk).abs() / mk);
                        ratios.entry(class.clone()).or_default().push(pk / mk);
                    }
                }
                let accepted = matches!(c.decision, Decision::Accepted { .. });
                if accepted && m.fused_us > 1.02 * m.parts_us && m.fused_us - m.parts_us > 2.0 {
                    slower.push(format!(
                        "{} {s} {}: fused {:.1} us > parts {:.1} us",
                        g.name,
                        c.rule.unwrap().name(),
                        m.fused_us,
                        m.parts_us
                    ));
                }
                println!(
                    "{:<12} {:>6} {:<20} {:>9.1} {:>9.1} {:>9.1} {:>9.1}  {:<8}  {}",
                    g.name,
                    s,
                    c.rule.unwrap().name(),
                    c.parts_us,
                    m.parts_us,
                    c.fused_us,
                    m.fused_us,
                    if accepted { "fuse" } else { "keep" },
                    if ok { "ok" } else { "WRONG" }
                );
            }
        }
    }
    rel_errors.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = rel_errors.get(rel_errors.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "median relative error of predicted kernel times: {:.0}% over {} kernels",
        med * 100.0,
        rel_errors.len()
    );
    for (class, r) in &mut ratios {
        r.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("  {class:<14} predicted/measured: median {:.2}, quartiles {:.2}..{:.2} over {} kernels", r[r.len() / 2], r[r.len() / 4], r[3 * r.len() / 4], r.len());
    }
    if slower.is_empty() {
        println!("kept fusions measurably slower than their parts: none");
    } else {
        println!("kept fusions measurably slower than their parts ({}):", slower.len());
        for l in &slower {
            println!("  {l}");
        }
    }
    println!(
        "with medians instead of minima: decision accuracy {right_med}/{total} ({:.1}%)",
        100.0 * right_med as f64 / total.max(1) as f64
    );
    println!(
        "decision accuracy: {right}/{total} ({:.1}%)",
        100.0 * right as f64 / total.max(1) as f64
    );
}
