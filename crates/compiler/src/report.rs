//! Reports of a plan: the summary lines, `report.md`, `plan.json` and DOT graphs.

use crate::dim::shape_str;
use crate::ir::{Graph, Op};
use crate::plan::{describe, Decision, Plan};
use serde_json::json;
use std::fmt::Write;

/// Ops that run as kernels (views, parameters and constants do not).
pub fn kernel_ops(g: &Graph) -> usize {
    g.nodes.iter().filter(|n| !matches!(n.op, Op::Param { .. } | Op::Const { .. }) && !n.op.is_view()).count()
}

/// The seed-style summary (DESIGN.md section 5).
pub fn summary(g: &Graph, plan: &Plan, files: &[String]) -> Vec<String> {
    let ops = kernel_ops(g);
    let fused = plan.groups.iter().filter(|gr| gr.nodes.len() > 1).count();
    vec![
        format!("[INFO] Graph `{}`: found {ops} operators, {} fusion candidates.", g.name, plan.candidates.len()),
        format!(
            "[INFO] Estimated benefit: {:.1} MB memory traffic saved, {} launches saved, {:.3} ms faster.",
            plan.bytes_saved as f64 / 1e6,
            plan.launches_saved,
            plan.benefit_us / 1e3
        ),
        format!("[INFO] Fused {ops} operators into {} kernels ({fused} fused operators).", plan.groups.len()),
        format!("[INFO] Generated fused operator code: {}", files.join(", ")),
    ]
}

pub fn plan_json(g: &Graph, plan: &Plan) -> String {
    let node_names = |ids: &[crate::ir::NodeId]| -> Vec<String> { ids.iter().map(|i| format!("{i} {}", g.node(*i).name)).collect() };
    let groups: Vec<_> = plan
        .groups
        .iter()
        .enumerate()
        .map(|(k, gr)| {
            json!({
                "kernel": k,
                "kind": gr.kind,
                "ops": describe(g, gr),
                "nodes": node_names(&gr.nodes),
                "rules": gr.rules,
                "inputs": node_names(&gr.inputs),
                "outputs": node_names(&gr.outputs),
            })
        })
        .collect();
    let cands: Vec<_> = plan
        .candidates
        .iter()
        .map(|c| {
            let (decision, reason, detail, step) = match &c.decision {
                Decision::Accepted { step } => ("accepted", None, String::new(), Some(*step)),
                Decision::Rejected { reason, detail } => ("rejected", Some(reason.code()), detail.clone(), None),
            };
            json!({
                "rule": c.rule.map(|r| r.name()),
                "producer": node_names(&c.producer),
                "consumers": c.consumers.iter().map(|x| node_names(x)).collect::<Vec<_>>(),
                "bytes_saved": c.bytes_saved,
                "launches_saved": c.launches_saved,
                "recompute_bytes": c.recompute_bytes,
                "benefit_us": (c.benefit_us * 1000.0).round() / 1000.0,
                "onchip_bytes": c.onchip_bytes,
                "decision": decision,
                "step": step,
                "reason": reason,
                "detail": detail,
            })
        })
        .collect();
    let v = json!({
        "graph": g.name,
        "opt_level": plan.opt_level,
        "rules": plan.rules,
        "target": plan.target,
        "hints": plan.hints,
        "kernels": groups,
        "candidates": cands,
        "benefit_us": (plan.benefit_us * 1000.0).round() / 1000.0,
        "bytes_saved": plan.bytes_saved,
        "launches_saved": plan.launches_saved,
    });
    serde_json::to_string_pretty(&v).unwrap() + "\n"
}

pub fn report_md(g: &Graph, plan: &Plan, summary: &[String]) -> String {
    let mut s = format!("# Fusion report: `{}`\n\n", g.name);
    for l in summary {
        let _ = writeln!(s, "    {l}");
    }
    let _ = writeln!(s, "\nopt_level {}, rules: {}, target `{}`; dynamic dims estimated at {}.\n", plan.opt_level, plan.rules.join(", "), plan.target.name,
        if plan.hints.is_empty() { "128".to_string() } else { plan.hints.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ") });
    let not_yet: Vec<&str> = crate::plan::Rule::ALL.iter().filter(|r| !r.implemented() && plan.rules.iter().any(|n| n == r.name())).map(|r| r.name()).collect();
    if !not_yet.is_empty() && plan.opt_level >= 3 {
        let _ = writeln!(s, "Rules enabled but not implemented in this planner version (no groups formed): {}.\n", not_yet.join(", "));
    }
    let _ = writeln!(s, "## Kernels\n\n| kernel | kind | rules | ops | writes |\n|---|---|---|---|---|");
    for (k, gr) in plan.groups.iter().enumerate() {
        let _ = writeln!(
            s,
            "| k{k} | {:?} | {} | {} | {} |",
            gr.kind,
            gr.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "),
            describe(g, gr),
            gr.outputs.iter().map(|o| format!("{} {}", g.node(*o).name, shape_str(&g.node(*o).shape))).collect::<Vec<_>>().join(", ")
        );
    }
    let _ = writeln!(s, "\n## Candidates\n\n| # | rule | producer | consumers | bytes saved | launches | recompute B | benefit us | decision |\n|---|---|---|---|---|---|---|---|---|");
    for (i, c) in plan.candidates.iter().enumerate() {
        let names = |ids: &[crate::ir::NodeId]| ids.iter().map(|i| g.node(*i).name.clone()).collect::<Vec<_>>().join(" ");
        let dec = match &c.decision {
            Decision::Accepted { step } => format!("accepted (step {step})"),
            Decision::Rejected { reason, detail } => format!("rejected: {} ({detail})", reason.code()),
        };
        let _ = writeln!(
            s,
            "| {i} | {} | {} | {} | {} | {} | {} | {:.2} | {dec} |",
            c.rule.map(|r| r.name()).unwrap_or("-"),
            names(&c.producer),
            c.consumers.iter().map(|x| names(x)).collect::<Vec<_>>().join(" / "),
            c.bytes_saved,
            c.launches_saved,
            c.recompute_bytes,
            c.benefit_us
        );
    }
    let _ = writeln!(s, "\n## IR\n\n```\n{}```", g.dump());
    s
}

/// The graph as DOT; with a plan, kernels are clusters.
pub fn dot(g: &Graph, plan: Option<&Plan>) -> String {
    let mut s = format!("digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\", fontsize=10];\n", g.name);
    let label = |i: crate::ir::NodeId| {
        let n = g.node(i);
        format!("{} {}\\n{}{}", i, n.name.replace('"', "'"), n.op.name(), shape_str(&n.shape))
    };
    let mut in_cluster = vec![false; g.nodes.len()];
    if let Some(p) = plan {
        for (k, gr) in p.groups.iter().enumerate() {
            let _ = writeln!(s, "  subgraph cluster_k{k} {{\n    label=\"k{k} {}\"; style=rounded; color=blue;", gr.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join("+"));
            for n in &gr.nodes {
                if !in_cluster[n.idx()] {
                    let _ = writeln!(s, "    n{} [label=\"{}\"];", n.0, label(*n));
                    in_cluster[n.idx()] = true;
                }
            }
            let _ = writeln!(s, "  }}");
        }
    }
    for id in g.ids() {
        if !in_cluster[id.idx()] {
            let style = match g.node(id).op {
                Op::Param { .. } => ", style=filled, fillcolor=lightgrey",
                Op::Const { .. } => ", shape=plaintext",
                _ if g.node(id).op.is_view() => ", style=dashed",
                _ => "",
            };
            let _ = writeln!(s, "  n{} [label=\"{}\"{style}];", id.0, label(id));
        }
        for i in &g.node(id).inputs {
            let _ = writeln!(s, "  n{} -> n{};", i.0, id.0);
        }
    }
    s + "}\n"
}
