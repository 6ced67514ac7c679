//! Decomposed ops exporters write that the IR has as one op, found on the ONNX graph before
//! import. Today: GELU written out with Erf, as torch.onnx writes `gelu` before opset 20 and
//! Hugging Face models do:
//!
//! ```text
//! d = x / 1.41421 (or x * 0.70711);  e = Erf(d);  a = e + 1
//! y = (x * a) * 0.5        or        y = (x * 0.5) * a
//! ```
//!
//! Every intermediate must be read only by the next step (and be no graph output), so the
//! whole chain can become one `Gelu(x)`. LayerNorm, RMSNorm and SiLU written out need no
//! pattern: their pieces are IR ops and the planner fuses them.

use crate::load::tensor_bytes;
use crate::proto::{data_type, GraphProto, NodeProto};
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// One decomposed op: the node whose output is the op's result, the op's input, and every
/// node the chain is made of (the result's node included).
#[derive(Clone, Debug, PartialEq)]
pub struct Decomposed {
    pub last: usize,
    pub input: String,
    pub nodes: BTreeSet<usize>,
}

/// A scalar float constant: a one-element float initializer or `Constant` node output.
fn scalar(g: &GraphProto, path: &Path, name: &str) -> Option<f64> {
    let one = |t: &crate::proto::TensorProto| -> Option<f64> {
        if t.dims.iter().product::<i64>() != 1 {
            return None;
        }
        let b = match t.data_type {
            data_type::FLOAT => tensor_bytes(t, path, 4, 1).ok()?,
            data_type::DOUBLE => {
                let b = tensor_bytes(t, path, 8, 1).ok()?;
                return Some(f64::from_le_bytes(b[..8].try_into().ok()?));
            }
            data_type::FLOAT16 => {
                let b = tensor_bytes(t, path, 2, 1).ok()?;
                return Some(half::f16::from_le_bytes([b[0], b[1]]).to_f64());
            }
            _ => return None,
        };
        Some(f32::from_le_bytes(b[..4].try_into().ok()?) as f64)
    };
    if let Some(t) = g.initializer.iter().find(|t| t.name == name) {
        return one(t);
    }
    let n = g
        .node
        .iter()
        .find(|n| n.op_type == "Constant" && n.output.first().is_some_and(|o| o == name))?;
    let a = n.attribute.iter().find(|a| a.name == "value" || a.name == "value_float")?;
    match &a.t {
        Some(t) => one(t),
        None => Some(a.f as f64),
    }
}

fn near(v: Option<f64>, want: f64) -> bool {
    v.is_some_and(|v| (v - want).abs() <= 1e-4 * want.abs().max(1.0))
}

/// GELU chains of `g` (see the module docs).
pub fn find(g: &GraphProto, path: &Path) -> Vec<Decomposed> {
    let producer: HashMap<&str, usize> = g
        .node
        .iter()
        .enumerate()
        .flat_map(|(i, n)| n.output.iter().map(move |o| (o.as_str(), i)))
        .collect();
    let mut readers: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, n) in g.node.iter().enumerate() {
        for x in n.input.iter().filter(|x| !x.is_empty()) {
            readers.entry(x.as_str()).or_default().push(i);
        }
    }
    let outputs: BTreeSet<&str> = g.output.iter().map(|o| o.name.as_str()).collect();
    // The one node reading `n`'s output, when no one else (and no graph output) reads it.
    let only_reader = |n: usize| -> Option<usize> {
        let o = g.node[n].output.first()?;
        match readers.get(o.as_str()).map(Vec::as_slice) {
            Some([r]) if !outputs.contains(o.as_str()) => Some(*r),
            _ => None,
        }
    };
    // For a binary node: its operand other than a scalar constant near `k`.
    let with_const = |n: &NodeProto, op: &str, k: f64| -> Option<String> {
        if n.op_type != op || n.input.len() != 2 {
            return None;
        }
        let (a, b) = (&n.input[0], &n.input[1]);
        if near(scalar(g, path, b), k) {
            Some(a.clone())
        } else if op != "Div" && near(scalar(g, path, a), k) {
            Some(b.clone())
        } else {
            None
        }
    };
    let other = |n: &NodeProto, one: &str| -> Option<String> {
        match (n.input.first(), n.input.get(1)) {
            (Some(a), Some(b)) if a == one => Some(b.clone()),
            (Some(a), Some(b)) if b == one => Some(a.clone()),
            _ => None,
        }
    };
    let mut found = Vec::new();
    for (ie, e) in g.node.iter().enumerate().filter(|(_, n)| n.op_type == "Erf") {
        let Some(&id) = e.input.first().and_then(|d| producer.get(d.as_str())) else { continue };
        let dn = &g.node[id];
        let Some(x) = with_const(dn, "Div", std::f64::consts::SQRT_2)
            .or_else(|| with_const(dn, "Mul", std::f64::consts::FRAC_1_SQRT_2))
        else {
            continue;
        };
        if only_reader(id) != Some(ie) {
            continue;
        }
        let Some(ia) = only_reader(ie) else { continue };
        if with_const(&g.node[ia], "Add", 1.0).as_deref() != Some(e.output[0].as_str()) {
            continue;
        }
        let Some(im) = only_reader(ia) else { continue };
        let m = &g.node[im];
        if m.op_type != "Mul" {
            continue;
        }
        let a_out = g.node[ia].output[0].as_str();
        let Some(partner) = other(m, a_out) else { continue };
        let mut nodes: BTreeSet<usize> = [id, ie, ia, im].into_iter().collect();
        let last = if partner == x {
            // (x * a) * 0.5
            let Some(ih) = only_reader(im) else { continue };
            if with_const(&g.node[ih], "Mul", 0.5).as_deref() != Some(m.output[0].as_str()) {
                continue;
            }
            nodes.insert(ih);
            ih
        } else {
            // (x * 0.5) * a
            let Some(&ih) = producer.get(partner.as_str()) else { continue };
            if with_const(&g.node[ih], "Mul", 0.5).as_deref() != Some(x.as_str())
                || only_reader(ih) != Some(im)
            {
                continue;
            }
            nodes.insert(ih);
            im
        };
        found.push(Decomposed { last, input: x, nodes });
    }
    found
}
