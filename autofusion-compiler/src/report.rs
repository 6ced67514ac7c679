//! Reports of a plan: the summary lines, `report.md`, `plan.json` and DOT graphs.

use crate::dim::shape_str;
use crate::ir::{Graph, Op};
use crate::plan::{describe, Decision, Plan};
use serde_json::json;
use std::fmt::Write;

/// The summary lines of the original graph-autofusion tool: operators found, fusion
/// candidates, estimated benefit, operators fused into kernels, generated code.
pub fn summary(g: &Graph, plan: &Plan, files: &[String]) -> Vec<String> {
    let ops = g.kernel_op_count();
    let fused = plan.groups.iter().filter(|gr| gr.nodes.len() > 1).count();
    vec![
        format!("[INFO] Graph `{}`: found {ops} operators, {} fusion candidates.", g.name, plan.candidates.len()),
        format!(
            "[INFO] Estimated benefit: {:.1} MB memory traffic saved, {} launches saved, {:.3} ms faster ({:.3} ms -> {:.3} ms on `{}`).",
            (plan.unfused_bytes - plan.bytes) / 1e6,
            plan.launches_saved,
            plan.benefit_us() / 1e3,
            plan.unfused_us / 1e3,
            plan.total_us / 1e3,
            plan.target.name
        ),
        format!(
            "[INFO] Fused {ops} operators into {} kernels ({fused} of them fuse two or more operators; the others run one operator each).",
            plan.groups.len()
        ),
        if files.is_empty() {
            // The ONNX command writes the kernel source only when asked (`--emit-dir`).
            "[INFO] Generated fused operator code: kept in memory (not written to a file)".into()
        } else {
            format!("[INFO] Generated fused operator code: {}", files.join(", "))
        },
    ]
}

pub fn plan_json(g: &Graph, plan: &Plan) -> String {
    let node_names = |ids: &[crate::ir::NodeId]| -> Vec<String> {
        ids.iter().map(|i| format!("{i} {}", g.node(*i).name)).collect()
    };
    let groups: Vec<_> = plan
        .groups
        .iter()
        .enumerate()
        .map(|(k, gr)| {
            json!({
                "kernel": k,
                "kind": gr.kind,
                "cost": gr.cost,
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
            let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
            json!({
                "rule": c.rule.map(|r| r.name()),
                "producer": node_names(&c.producer),
                "consumers": c.consumers.iter().map(|x| node_names(x)).collect::<Vec<_>>(),
                "parts_us": r3(c.parts_us),
                "fused_us": r3(c.fused_us),
                "benefit_us": r3(c.benefit_us),
                "margin_us": r3(c.margin_us),
                "bytes_saved": c.bytes_saved,
                "bytes_saved_us": r3(c.bytes_saved_us),
                "launches_saved": c.launches_saved,
                "launches_saved_us": r3(c.launches_saved_us),
                "tiling_loss_us": r3(c.tiling_loss_us),
                "recompute_us": r3(c.recompute_us),
                "onchip_bytes": c.onchip.iter().map(|(m, b)| json!({"memory": m, "bytes": b})).collect::<Vec<_>>(),
                "tiling": c.tiling,
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
        "total_us": (plan.total_us * 1000.0).round() / 1000.0,
        "unfused_us": (plan.unfused_us * 1000.0).round() / 1000.0,
        "bytes": plan.bytes,
        "unfused_bytes": plan.unfused_bytes,
        // In launch order, with the shared cache serving what an earlier kernel left in it.
        "offchip_bytes": plan.offchip.bytes.round(),
        "unfused_offchip_bytes": plan.unfused_offchip.bytes.round(),
        "launches_saved": plan.launches_saved,
    });
    serde_json::to_string_pretty(&v).unwrap() + "\n"
}

pub fn report_md(g: &Graph, plan: &Plan, summary: &[String]) -> String {
    let mut s = format!("# Fusion report: `{}`\n\n", g.name);
    for l in summary {
        let _ = writeln!(s, "    {l}");
    }
    // Only the rules that can form groups at this opt level (the others are enabled by name
    // but start at a higher level).
    let applies = |name: &String| {
        crate::plan::Rule::ALL
            .iter()
            .any(|r| r.name() == name.as_str() && r.min_opt_level() <= plan.opt_level)
    };
    let active: Vec<&str> = plan.rules.iter().filter(|n| applies(n)).map(|n| n.as_str()).collect();
    let _ = writeln!(
        s,
        "\nopt_level {}, rules that apply at it: {}, target `{}`; dynamic dims estimated at {}.\n",
        plan.opt_level,
        if active.is_empty() { "none".to_string() } else { active.join(", ") },
        plan.target.name,
        if plan.hints.is_empty() {
            "128".to_string()
        } else {
            plan.hints.iter().map(|(n, v)| format!("{n}={v}")).collect::<Vec<_>>().join(", ")
        }
    );
    let _ = writeln!(s, "Target `{}`: {}.\n", plan.target.name, plan.target.sources.join("; "));
    let _ = writeln!(s, "## Kernels\n\n| kernel | kind | rules | ops | writes | model us | tiling | on chip B |\n|---|---|---|---|---|---|---|---|");
    for (k, gr) in plan.groups.iter().enumerate() {
        let (t, tiling, onchip) = match &gr.cost {
            Some(c) => (
                format!("{:.2}", c.time_us),
                serde_json::to_string(&c.tiling).unwrap_or_default(),
                c.onchip.iter().map(|(m, b)| format!("{m} {b}")).collect::<Vec<_>>().join(", "),
            ),
            None => ("-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            s,
            "| k{k} | {:?} | {} | {} | {} | {t} | {tiling} | {onchip} |",
            gr.kind,
            gr.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join(", "),
            describe(g, gr),
            gr.outputs
                .iter()
                .map(|o| format!("{} {}", g.node(*o).name, shape_str(&g.node(*o).shape)))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let _ = writeln!(s, "\n## Candidates\n\nTimes in microseconds: parts, fused, benefit (= parts - fused) against the margin, and its terms: bytes saved, launches saved, tiling loss, recompute.\n\n| # | rule | producer | consumers | parts | fused | benefit | margin | bytes saved | bytes us | launches us | tiling loss | recompute | on chip B | decision |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (i, c) in plan.candidates.iter().enumerate() {
        let names = |ids: &[crate::ir::NodeId]| {
            ids.iter().map(|i| g.node(*i).name.clone()).collect::<Vec<_>>().join(" ")
        };
        let dec = match &c.decision {
            Decision::Accepted { step } => format!("accepted (step {step})"),
            Decision::Rejected { reason, detail } => {
                format!("rejected: {} ({detail})", reason.code())
            }
        };
        let _ = writeln!(
            s,
            "| {i} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {dec} |",
            c.rule.map(|r| r.name()).unwrap_or("repair"),
            names(&c.producer),
            c.consumers.iter().map(|x| names(x)).collect::<Vec<_>>().join(" / "),
            c.parts_us,
            c.fused_us,
            c.benefit_us,
            c.margin_us,
            c.bytes_saved,
            c.bytes_saved_us,
            c.launches_saved_us,
            c.tiling_loss_us,
            c.recompute_us,
            c.onchip.iter().map(|(m, b)| format!("{m} {b}")).collect::<Vec<_>>().join(", ")
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
            let _ = writeln!(
                s,
                "  subgraph cluster_k{k} {{\n    label=\"k{k} {}\"; style=rounded; color=blue;",
                gr.rules.iter().map(|r| r.name()).collect::<Vec<_>>().join("+")
            );
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
