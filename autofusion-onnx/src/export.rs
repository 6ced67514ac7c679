//! The fused model: each fused kernel of a plan becomes one node of domain `ai.autofusion`
//! whose model-local function holds the original nodes, so the model passes `onnx.checker` and
//! stock onnxruntime runs it (inlining the functions) with the same outputs.
//!
//! A kernel maps back to the ONNX nodes its IR members came from (`line` = node index + 1).
//! Nodes no kernel holds (views, shape arithmetic, constants) join a kernel when everything they
//! read comes from it and everything reading them is in it; otherwise they stay as they are.
//! Kernels that share an ONNX node are one fused node. A fused node that would close a cycle
//! in the ONNX graph is left unfused.

use crate::patterns::Decomposed;
use crate::proto::{
    attribute_type, AttributeProto, FunctionProto, ModelProto, NodeProto, OperatorSetIdProto,
};
use crate::FUSED_DOMAIN;
use autofusion_compiler::ir::Graph;
use autofusion_compiler::plan::Plan;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One fused node of the written model.
#[derive(Debug, Default)]
pub struct FusedNode {
    /// Its op type (and function name).
    pub name: String,
    /// The kernels it stands for (one unless kernels shared an ONNX node).
    pub kernels: Vec<String>,
    /// The rules that fused them.
    pub rules: Vec<String>,
    /// The original nodes its function holds.
    pub members: Vec<String>,
}

/// What happened to the model's nodes.
#[derive(Debug, Default)]
pub struct Fused {
    pub model: ModelProto,
    pub fused: Vec<FusedNode>,
    /// Original nodes left as they were, with why.
    pub left: Vec<(String, String)>,
}

/// Whether the model already holds fused nodes of ours.
pub fn is_fused(m: &ModelProto) -> bool {
    m.graph.as_ref().is_some_and(|g| g.node.iter().any(|n| n.domain == FUSED_DOMAIN))
}

/// The ONNX nodes (by index) each kernel of `plan` holds, closed over the nodes between
/// them: one entry per kernel that holds any, with its kernel index. A node several kernels
/// hold (recomputed in each, or split across them) belongs to the first of them in plan order,
/// which is topological: the others read its output. Joining them instead would put far-apart
/// kernels (every layer's attention reading one computed mask) in one fused node, around the
/// nodes between them, which is a cycle.
fn clusters(
    model: &ModelProto,
    g: &Graph,
    plan: &Plan,
    merged: &[Decomposed],
) -> Vec<(Vec<usize>, BTreeSet<usize>)> {
    let nodes = &model.graph.as_ref().expect("imported model has a graph").node;
    let mut owner: HashMap<usize, usize> = HashMap::new();
    for (gi, gr) in plan.groups.iter().enumerate() {
        for m in &gr.nodes {
            let line = g.node(*m).line as usize;
            if (1..=nodes.len()).contains(&line) {
                owner.entry(line - 1).or_insert(gi);
            }
        }
    }
    // A chain imported as one op belongs with the kernel holding that op.
    for d in merged {
        if let Some(&k) = owner.get(&d.last) {
            for n in &d.nodes {
                owner.entry(*n).or_insert(k);
            }
        }
    }
    let mut of: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for (n, gi) in &owner {
        of.entry(*gi).or_default().insert(*n);
    }
    let mut out: Vec<(Vec<usize>, BTreeSet<usize>)> =
        of.into_iter().map(|(gi, members)| (vec![gi], members)).collect();
    close_over_paths(nodes, &mut out);
    out
}

/// Each cluster takes the unowned nodes on a path from one of its nodes to another (views,
/// shape arithmetic, ops whose IR vanished at import): a fused node must be convex, or the
/// model would have a cycle through them.
fn close_over_paths(nodes: &[NodeProto], out: &mut [(Vec<usize>, BTreeSet<usize>)]) {
    let producer: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().filter(|o| !o.is_empty()).map(move |o| (o.as_str(), i)))
        .collect();
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut pred: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        for p in n.input.iter().filter_map(|x| producer.get(x.as_str())) {
            succ[*p].push(i);
            pred[i].push(*p);
        }
    }
    let mut owned: BTreeSet<usize> = out.iter().flat_map(|c| c.1.iter().copied()).collect();
    for c in out.iter_mut() {
        let (after, before) = (reachable(&c.1, &succ), reachable(&c.1, &pred));
        for i in 0..nodes.len() {
            if after[i] && before[i] && owned.insert(i) {
                c.1.insert(i);
            }
        }
    }
}

/// Which nodes can be reached from `from` through one or more `next` edges.
fn reachable<'a>(from: impl IntoIterator<Item = &'a usize>, next: &[Vec<usize>]) -> Vec<bool> {
    let mut seen = vec![false; next.len()];
    let mut stack: Vec<usize> = from.into_iter().copied().collect();
    while let Some(i) = stack.pop() {
        for &j in &next[i] {
            if !std::mem::replace(&mut seen[j], true) {
                stack.push(j);
            }
        }
    }
    seen
}

/// Whether node `at` depends on itself through `deps`.
fn on_a_cycle(deps: &[Vec<usize>], at: usize) -> bool {
    reachable([&at], deps)[at]
}

fn string_attr(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        r#type: attribute_type::STRING,
        s: v.as_bytes().to_vec(),
        ..Default::default()
    }
}

/// The dependencies of each of `nodes` (the nodes producing its inputs).
fn dependencies(nodes: &[NodeProto], graph_inputs: &BTreeSet<String>) -> Vec<Vec<usize>> {
    let producer: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().filter(|o| !o.is_empty()).map(move |o| (o.as_str(), i)))
        .collect();
    nodes
        .iter()
        .map(|n| {
            n.input
                .iter()
                .filter(|x| !x.is_empty() && !graph_inputs.contains(*x))
                .filter_map(|x| producer.get(x.as_str()).copied())
                .collect()
        })
        .collect()
}

/// Kahn's order of `nodes` by their tensors (stable: the lowest original position first);
/// `None` when they form a cycle.
fn topo_order(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    let mut done = vec![false; deps.len()];
    let mut order = Vec::new();
    while order.len() < deps.len() {
        let next = (0..deps.len()).find(|i| !done[*i] && deps[*i].iter().all(|d| done[*d]))?;
        done[next] = true;
        order.push(next);
    }
    Some(order)
}

/// The model with every fused cluster of `plan` as one `ai.autofusion` node. `kernel_names`
/// names the plan's kernels (as the generated code does); `left_out` says why the importer
/// left nodes out (`Imported::left`); `merged` are the chains it imported as one op.
pub fn fuse(
    model: &ModelProto,
    g: &Graph,
    plan: &Plan,
    kernel_names: &[String],
    left_out: &[(String, String)],
    merged: &[Decomposed],
) -> Fused {
    let graph = model.graph.as_ref().expect("imported model has a graph");
    let nodes = &graph.node;
    let mut cl = clusters(model, g, plan, merged);
    cl.retain(|c| c.1.len() >= 2);
    let mut left_why: BTreeMap<usize, String> = BTreeMap::new();
    let graph_inputs: BTreeSet<String> = graph
        .input
        .iter()
        .map(|i| i.name.clone())
        .chain(graph.initializer.iter().map(|t| t.name.clone()))
        .collect();
    let graph_outputs: BTreeSet<&str> = graph.output.iter().map(|o| o.name.as_str()).collect();
    let default_opsets: Vec<OperatorSetIdProto> =
        model.opset_import.iter().filter(|o| o.domain != FUSED_DOMAIN).cloned().collect();
    loop {
        let owned: BTreeMap<usize, usize> =
            cl.iter().enumerate().flat_map(|(ci, c)| c.1.iter().map(move |n| (*n, ci))).collect();
        // The new node list: each cluster's fused node at its first node's place.
        let mut new_nodes: Vec<NodeProto> = Vec::new();
        let mut functions = Vec::new();
        let mut fused = Vec::new();
        // Where each cluster's fused node is in `new_nodes`.
        let mut fused_at: Vec<(usize, usize)> = Vec::new();
        for (i, n) in nodes.iter().enumerate() {
            let Some(&ci) = owned.get(&i) else {
                new_nodes.push(n.clone());
                continue;
            };
            let (kernels, members) = &cl[ci];
            if *members.iter().next().unwrap() != i {
                continue;
            }
            let inner: Vec<&NodeProto> = members.iter().map(|m| &nodes[*m]).collect();
            let produced: BTreeSet<&str> =
                inner.iter().flat_map(|n| n.output.iter().map(|o| o.as_str())).collect();
            let mut inputs: Vec<String> = Vec::new();
            for x in inner.iter().flat_map(|n| n.input.iter()) {
                if !x.is_empty() && !produced.contains(x.as_str()) && !inputs.contains(x) {
                    inputs.push(x.clone());
                }
            }
            let outputs: Vec<String> = inner
                .iter()
                .flat_map(|n| n.output.iter())
                .filter(|o| {
                    graph_outputs.contains(o.as_str())
                        || nodes
                            .iter()
                            .enumerate()
                            .any(|(j, m)| !members.contains(&j) && m.input.iter().any(|x| x == *o))
                })
                .cloned()
                .collect();
            let knames: Vec<String> = kernels.iter().map(|k| kernel_names[*k].clone()).collect();
            let rules: BTreeSet<String> = kernels
                .iter()
                .flat_map(|k| plan.groups[*k].rules.iter().map(|r| r.name().to_string()))
                .collect();
            let rules: Vec<String> = rules.into_iter().collect();
            let fname = format!("Fused_{}", knames.join("_"));
            fused_at.push((new_nodes.len(), ci));
            functions.push(FunctionProto {
                name: fname.clone(),
                domain: FUSED_DOMAIN.into(),
                input: inputs.clone(),
                output: outputs.clone(),
                attribute: vec!["kernel".into(), "rules".into()],
                node: inner.iter().map(|n| (*n).clone()).collect(),
                doc_string: format!(
                    "autofusion kernel(s) {}: {} original nodes, fused by {}",
                    knames.join(", "),
                    inner.len(),
                    if rules.is_empty() { "-".to_string() } else { rules.join(", ") }
                ),
                opset_import: default_opsets.clone(),
            });
            new_nodes.push(NodeProto {
                input: inputs,
                output: outputs,
                name: fname.to_lowercase(),
                op_type: fname.clone(),
                domain: FUSED_DOMAIN.into(),
                attribute: vec![
                    string_attr("kernel", &knames.join(",")),
                    string_attr("rules", &rules.join(",")),
                ],
                doc_string: String::new(),
            });
            fused.push(FusedNode {
                name: fname,
                kernels: knames,
                rules,
                members: inner.iter().map(|n| n.name.clone()).collect(),
            });
        }
        let deps = dependencies(&new_nodes, &graph_inputs);
        match topo_order(&deps) {
            Some(order) => {
                let mut m = model.clone();
                let gm = m.graph.as_mut().unwrap();
                gm.node = order.into_iter().map(|i| new_nodes[i].clone()).collect();
                m.functions.extend(functions);
                if !fused.is_empty() {
                    m.opset_import
                        .push(OperatorSetIdProto { domain: FUSED_DOMAIN.into(), version: 1 });
                    // Model-local functions need IR version 8.
                    m.ir_version = m.ir_version.max(8);
                }
                let owned_now: BTreeSet<usize> =
                    cl.iter().flat_map(|c| c.1.iter().copied()).collect();
                let left = (0..nodes.len())
                    .filter(|i| !owned_now.contains(i))
                    .map(|i| {
                        let by_importer = left_out
                            .iter()
                            .find(|(n, _)| nodes[i].output.first() == Some(n) || &nodes[i].name == n)
                            .map(|(_, w)| format!("not imported: {w}"));
                        let why = left_why.get(&i).cloned().or(by_importer).unwrap_or_else(|| {
                            "no fused kernel holds it (a view, shape arithmetic, or a kernel of its own)".into()
                        });
                        (nodes[i].name.clone(), why)
                    })
                    .collect();
                return Fused { model: m, fused, left };
            }
            None => {
                // Un-fuse a cluster on a cycle (the last when none is found) and try again:
                // this terminates, as clusters only go.
                let on_cycle = fused_at.iter().find(|(at, _)| on_a_cycle(&deps, *at)).map(|c| c.1);
                let Some(ci) = on_cycle.or(cl.len().checked_sub(1)) else {
                    unreachable!("the original graph is acyclic")
                };
                for n in &cl[ci].1 {
                    left_why.insert(
                        *n,
                        "fusing its kernel would make a cycle in the ONNX graph".into(),
                    );
                }
                cl.remove(ci);
            }
        }
    }
}
