//! Modelled off-chip traffic of the seed layer: unfused (one kernel per op), fused (the plan at
//! opt_level 3) and compulsory (weights + input + output, each moved once), for a target
//! profile; then a sweep over the sequence length showing how attention traffic grows.
//!
//!     cargo run --release --example traffic -- --d 4096 --heads 32 --seq 2048 --dtype f16 --target ascend910b
//!
//! `--kernels` also lists each fused kernel's bytes and tiling at `--seq`.
//!
//! These are the cost model's byte counts at each kernel's chosen tiling (operand re-reads
//! included), not measurements: first as if each kernel read and wrote HBM, then in launch
//! order with L2 serving what an earlier kernel left in it (`plan::l2`, an LRU model).

use autofusion_compiler::group::match_flash;
use autofusion_compiler::ir::Op;
use autofusion_compiler::plan::{plan, RuleSet};
use autofusion_compiler::target::Target;
use autofusion_compiler::{find_graphs, Unit};
use std::collections::BTreeSet;

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

/// The seed layer of examples/seed_layer.rs at the given sizes and dtype.
fn seed_source(d: usize, heads: usize, dtype: &str, seq: usize) -> String {
    let src = include_str!("seed_layer.rs");
    let start = src.find("#[fused_graph").unwrap();
    let end = start + src[start..].find("\n}\n").unwrap() + 3;
    src[start..end]
        .replace(
            "dims(D = 512, H = 8, F = 2048)",
            &format!("dims(D = {d}, H = {heads}, F = {}), hints(S = {seq})", 4 * d),
        )
        .replace("Tensor<f32,", &format!("Tensor<{dtype},"))
}

struct Traffic {
    unfused: f64,
    fused: f64,
    /// In launch order, with L2 serving what an earlier kernel left in it.
    unfused_l2: f64,
    fused_l2: f64,
    /// The same if every intermediate write reached HBM.
    fused_l2_writes: f64,
    compulsory: f64,
    attention_unfused: f64,
    attention_fused: f64,
    /// Per fused kernel: its first member's name, off-chip GB, L2 GB, tiling.
    kernels: Vec<(String, f64, f64, String)>,
    /// Merges the plan did not take, with the reason.
    rejected: Vec<String>,
}

fn traffic(d: usize, heads: usize, seq: usize, dtype: &str, target: &Target) -> Traffic {
    let src = seed_source(d, heads, dtype, seq);
    let file = syn::parse_file(&src).expect("seed source parses");
    let (f, attr) = find_graphs(&file.items).remove(0);
    let unit = Unit::parse(attr, f).unwrap_or_else(|e| panic!("{}", e.render("seed", &src)));
    let g = &unit.graph;
    let hints = vec![("S".to_string(), seq as i64)];
    let p0 = plan(g, 0, RuleSet::all(), &hints, target);
    let p3 = plan(g, 3, RuleSet::all(), &hints, target);
    let est = |id| {
        let n = g.node(id);
        n.shape.iter().map(|x| x.estimate(&|_| seq as i64)).product::<i64>() as f64
            * n.dtype.size() as f64
    };
    let compulsory: f64 = g.param_nodes().iter().map(|p| est(*p)).sum::<f64>()
        + g.outputs.iter().map(|o| est(*o)).sum::<f64>();
    // Attention = the nodes of the QK^T .. PV pattern.
    let users = g.users();
    let attn: BTreeSet<_> = g
        .ids()
        .filter_map(|id| match_flash(g, &users, id))
        .flat_map(|f| {
            let mut v = f.chain.clone();
            v.extend([f.qk, f.max, f.shift, f.exp, f.sum, f.div, f.pv]);
            v
        })
        .collect();
    let attention_bytes = |p: &autofusion_compiler::plan::Plan| -> f64 {
        p.groups
            .iter()
            .filter(|gr| {
                // (a flash kernel may also hold the copy of its layout store)
                let mut ops = gr.nodes.iter().filter(|n| g.node(**n).op != Op::Copy).peekable();
                ops.peek().is_some() && ops.all(|n| attn.contains(n))
            })
            .filter_map(|gr| gr.cost.as_ref())
            .map(|c| c.bytes)
            .sum()
    };
    assert!(g.nodes.iter().any(|n| n.op == Op::MatMul));
    let kernels = p3
        .groups
        .iter()
        .filter_map(|gr| {
            let c = gr.cost.as_ref()?;
            let ops: Vec<String> = gr.nodes.iter().map(|n| g.node(*n).op.name()).collect();
            let name = format!("{}: {}", g.node(gr.outputs[0]).name, ops.join(" "));
            Some((name, c.bytes / 1e9, c.llc_bytes / 1e9, format!("{:?}", c.tiling)))
        })
        .collect();
    let rejected = p3
        .candidates
        .iter()
        .filter_map(|c| match &c.decision {
            autofusion_compiler::plan::Decision::Rejected { reason, detail } => Some(format!(
                "{} -> {}: {} ({detail}; parts {:.1} us, fused {:.1} us at {:?})",
                g.node(*c.producer.last()?).name,
                c.consumers
                    .iter()
                    .filter_map(|k| Some(g.node(*k.first()?).name.clone()))
                    .collect::<Vec<_>>()
                    .join(", "),
                reason.code(),
                c.parts_us,
                c.fused_us,
                c.tiling
            )),
            _ => None,
        })
        .collect();
    Traffic {
        kernels,
        rejected,
        unfused: p0.bytes,
        fused: p3.bytes,
        unfused_l2: p0.unfused_offchip.bytes,
        fused_l2: p3.offchip.bytes,
        fused_l2_writes: p3.offchip.writes_reach_memory(),
        compulsory,
        attention_unfused: attention_bytes(&p0),
        attention_fused: attention_bytes(&p3),
    }
}

fn main() {
    let d: usize = arg("--d", "4096").parse().expect("--d is a number");
    let heads: usize = arg("--heads", "32").parse().expect("--heads is a number");
    let seq: usize = arg("--seq", "2048").parse().expect("--seq is a number");
    let dtype = arg("--dtype", "f16");
    let tname = arg("--target", "ascend910b");
    if !d.is_multiple_of(heads) || !["f32", "f16", "bf16"].contains(&dtype.as_str()) {
        eprintln!("error: --d must be a multiple of --heads and --dtype one of f32, f16, bf16");
        std::process::exit(2);
    }
    let Some(target) = Target::named(&tname) else {
        eprintln!("error: unknown --target `{tname}` (host, ascend910b)");
        std::process::exit(2);
    };
    println!("seed layer d {d}, {heads} heads, S {seq}, {dtype}, target {tname}");
    println!(
        "{:>6}  {:>12} {:>12} {:>12}   {:>14} {:>14}",
        "S", "unfused GB", "fused GB", "fused, L2", "attn unfused", "attn fused"
    );
    let mut s = 1;
    while s <= 4096 {
        let t = traffic(d, heads, s, &dtype, &target);
        println!(
            "{s:>6}  {:>12.3} {:>12.3} {:>12.3}   {:>11.3} GB {:>11.3} GB",
            t.unfused / 1e9,
            t.fused / 1e9,
            t.fused_l2 / 1e9,
            t.attention_unfused / 1e9,
            t.attention_fused / 1e9
        );
        s *= 4;
    }
    let t = traffic(d, heads, seq, &dtype, &target);
    if std::env::args().any(|a| a == "--kernels") {
        println!("fused kernels at S {seq}: off-chip GB, L2 re-read GB, tiling");
        for (name, hbm, l2, tiling) in &t.kernels {
            println!("  {hbm:>7.3} {l2:>7.3}  {tiling:<40} {name}");
        }
        println!("merges not taken:");
        for r in &t.rejected {
            println!("  {r}");
        }
    }
    println!(
        "traffic: unfused {:.2} GB, fused {:.2} GB, compulsory {:.2} GB (each kernel's reads and writes from HBM)",
        t.unfused / 1e9,
        t.fused / 1e9,
        t.compulsory / 1e9
    );
    println!(
        "traffic with L2 between kernels: unfused {:.2} GB, fused {:.2} GB = {:.2} x compulsory \
         ({:.2} GB if every intermediate write reaches HBM)",
        t.unfused_l2 / 1e9,
        t.fused_l2 / 1e9,
        t.fused_l2 / t.compulsory,
        t.fused_l2_writes / 1e9
    );
}
