//! ONNX graph -> the compiler's IR, through `GraphBuilder`.
//!
//! Values are tensors in the IR (`Val::Node`), or known at import time: integer tensors (shape
//! arithmetic, folded symbolically in terms of the model's dynamic dims) and small float
//! constants (`Val::Known`). Float initializers become graph parameters (the weights, read from
//! the model file at run time); graph inputs keep their names, and a dim named by `dim_param`
//! stays dynamic. Every IR node records the ONNX node it came from as its `line` (node index +
//! 1), which the fused-model writer uses to map kernels back to nodes.

use crate::load::{tensor_bytes, Model};
use crate::proto::{attribute_type, data_type, AttributeProto, NodeProto, TensorProto};
use crate::OnnxError;
use autofusion_compiler::dim::{numel, shape_str, DimExpr, Shape};
use autofusion_compiler::ir::{BinaryOp, DType, Graph, NodeId, Op, ReduceKind, UnaryOp};
use autofusion_compiler::GraphBuilder;
use std::collections::{BTreeSet, HashMap};

mod computed;
mod fold;

/// The opsets this importer reads (of the default domain). Past 21, the ops it takes changed
/// only by the element types they admit (and Cast's `round_mode`, which concerns float8 and
/// float4 targets, and Range's `stash_type`): checked with onnx's schemas (`since_version`).
pub const OPSETS: std::ops::RangeInclusive<i64> = 13..=28;

/// A model read into the IR.
pub struct Imported {
    pub graph: Graph,
    /// Parameters that are initializers (weights), by parameter index.
    pub weights: Vec<(usize, String)>,
    /// Nodes left out of the IR (`import_partial` only): (node name, why).
    pub left: Vec<(String, String)>,
    /// Parameters standing for the outputs of nodes left out, by parameter index.
    pub boundary: Vec<(usize, String)>,
    /// Chains of nodes imported as one op (GELU written with Erf): the IR op's `line` is the
    /// chain's last node.
    pub merged: Vec<crate::patterns::Decomposed>,
}

/// A value during import.
#[derive(Clone, Debug)]
enum Val {
    /// A tensor computed by the IR graph.
    Node(NodeId),
    /// A tensor known at import time: its shape and its elements, integers as dims (so shape
    /// arithmetic stays symbolic) or floats (`float` says which list holds them).
    Known { shape: Vec<usize>, ints: Vec<DimExpr>, floats: Vec<f64>, float: bool },
}

impl Imported {
    /// The little-endian bytes of weight parameter `param` (an initializer) as the model file
    /// holds them: a slice of the mapped model or of its external-data file, not a copy.
    pub fn weight_bytes(&self, model: &Model, param: usize) -> Result<bytes::Bytes, OnnxError> {
        let (t, elem, n) = self.weight(model, param)?;
        tensor_bytes(t, &model.path, elem, n)
    }

    /// The initializer of weight parameter `param`, its element size and element count.
    fn weight<'m>(
        &self,
        model: &'m Model,
        param: usize,
    ) -> Result<(&'m TensorProto, usize, usize), OnnxError> {
        let (_, name) = self.weights.iter().find(|(p, _)| *p == param).ok_or_else(|| {
            OnnxError::model(format!("parameter {param} is not a weight of the model"))
        })?;
        let g = model.proto.graph.as_ref().expect("load checks the graph");
        // An initializer, or the value of the Constant node whose output it is.
        let constant = || {
            g.node
                .iter()
                .filter(|n| n.op_type == "Constant" && n.output.first() == Some(name))
                .find_map(|n| {
                    n.attribute.iter().find(|a| a.name == "value").and_then(|a| a.t.as_ref())
                })
        };
        let t =
            g.initializer.iter().find(|t| &t.name == name).or_else(constant).ok_or_else(|| {
                OnnxError::model(format!(
                    "weight `{name}` is neither an initializer nor a Constant"
                ))
            })?;
        let node = self.graph.node(self.graph.param_nodes()[param]);
        let n = node.shape.iter().map(|d| d.as_const().unwrap_or(0).max(0) as usize).product();
        Ok((t, node.dtype.size(), n))
    }
}

impl Imported {
    /// Where the data of weight parameter `param` is in the model's files (for loading it at
    /// run time without the importer: `Builder::onnx`).
    pub fn weight_location(
        &self,
        model: &Model,
        param: usize,
    ) -> Result<crate::load::Location, OnnxError> {
        let (t, elem, n) = self.weight(model, param)?;
        crate::load::tensor_location(t, model, elem, n)
    }
}

/// Import the graph of `model` as an IR graph named `name`; any node the compiler cannot take
/// is an error.
pub fn import(model: &Model, name: &str) -> Result<Imported, OnnxError> {
    import_with(model, name, false)
}

/// Import what the compiler can take and leave the rest (the command's mode): a node it cannot
/// take is left out, its outputs become parameters when the model records their type and
/// shape (`value_info`), and nodes that read an output of unknown shape are left out too.
/// Values computed in the IR that a left-out node reads are graph outputs, so they are stored.
pub fn import_partial(model: &Model, name: &str) -> Result<Imported, OnnxError> {
    import_with(model, name, true)
}

fn import_with(model: &Model, name: &str, partial: bool) -> Result<Imported, OnnxError> {
    let proto = &model.proto;
    let opset = proto
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| OnnxError::model("imports no default-domain opset".into()))?;
    if !OPSETS.contains(&opset) {
        return Err(OnnxError::model(format!("opset {opset} is not supported")).help(format!(
            "re-export the model with an opset in {}..={}",
            OPSETS.start(),
            OPSETS.end()
        )));
    }
    let graph = proto.graph.as_ref().expect("load checks the graph");
    let mut im = Importer {
        model,
        b: GraphBuilder::new(name),
        vals: HashMap::new(),
        inits: graph.initializer.iter().map(|t| (t.name.clone(), t)).collect(),
        weights: Vec::new(),
        n_params: 0,
        opset,
        dim_values: HashMap::new(),
    };
    for input in &graph.input {
        if im.inits.contains_key(&input.name) {
            continue; // an initializer listed as an input too (IR version < 4)
        }
        let (dtype, shape) = value_type(input)?;
        let id = im.b.param(&input.name, dtype, shape);
        im.n_params += 1;
        im.vals.insert(input.name.clone(), Val::Node(id));
    }
    let types: HashMap<&str, &crate::proto::ValueInfoProto> =
        graph.value_info.iter().chain(&graph.output).map(|v| (v.name.as_str(), v)).collect();
    let mut left: Vec<(String, String)> = Vec::new();
    let mut left_reads: Vec<String> = Vec::new();
    let mut unknown: std::collections::HashSet<String> = Default::default();
    let mut boundary = Vec::new();
    let merged = crate::patterns::find(graph, &model.path);
    let inside: BTreeSet<usize> =
        merged.iter().flat_map(|d| d.nodes.iter().copied().filter(move |n| *n != d.last)).collect();
    for (i, node) in graph.node.iter().enumerate() {
        if inside.contains(&i) {
            continue; // a step of a chain imported as one op at its last node
        }
        im.b.set_line(i as u32 + 1);
        let chain_input = merged.iter().find(|d| d.last == i).map(|d| &d.input);
        let reason = match node.input.iter().chain(chain_input).find(|x| unknown.contains(*x)) {
            Some(x) if partial => Err(format!(
                "reads `{x}`, the output of a node left as it is, whose type and shape the model \
                 does not record (run onnx.shape_inference on the model first)"
            )),
            _ => match merged.iter().find(|d| d.last == i) {
                Some(d) => im.gelu(node, &d.input),
                None => im.node(node),
            },
        };
        let Err(why) = reason else { continue };
        if !partial {
            return Err(im.node_error(node, why));
        }
        // Left as it is: its outputs enter the IR as parameters where their type is known.
        left.push((Importer::name(node), format!("{} ({}): {why}", node.op_type, im.opset)));
        left_reads.extend(node.input.iter().filter(|x| !x.is_empty()).cloned());
        for o in node.output.iter().filter(|o| !o.is_empty()) {
            match types.get(o.as_str()).map(|v| value_type(v)) {
                Some(Ok((dtype, shape))) => {
                    let id = im.b.param(o, dtype, shape);
                    boundary.push((im.n_params, o.clone()));
                    im.n_params += 1;
                    im.vals.insert(o.clone(), Val::Node(id));
                }
                _ => {
                    unknown.insert(o.clone());
                }
            }
        }
    }
    // What left-out nodes read from the IR is stored: an output of the IR graph.
    let mut outputs: Vec<NodeId> = Vec::new();
    for x in &left_reads {
        if let Some(Val::Node(id)) = im.vals.get(x) {
            if !matches!(im.b.node(*id).op, Op::Param { .. }) && !outputs.contains(id) {
                outputs.push(*id);
            }
        }
    }
    for out in &graph.output {
        match im.vals.get(&out.name) {
            Some(Val::Node(id)) => {
                if !outputs.contains(id) {
                    outputs.push(*id);
                }
            }
            _ if partial
                && (unknown.contains(&out.name) || left.iter().any(|l| l.0 == out.name)) => {}
            Some(_) => {
                return Err(OnnxError::model(format!(
                    "graph output `{}` is a constant: nothing to compute",
                    out.name
                )))
            }
            None => {
                return Err(OnnxError::model(format!(
                    "graph output `{}` is produced by no node",
                    out.name
                )))
            }
        }
    }
    if outputs.is_empty() {
        return Err(OnnxError::model(
            "no part of the graph is something the compiler can take".into(),
        )
        .help(left.first().map_or(String::new(), |(n, w)| format!("`{n}`: {w}"))));
    }
    for o in outputs {
        im.b.output(o);
    }
    let Importer { b, weights, .. } = im;
    let graph = b.finish().map_err(|e| OnnxError::model(e.to_string()))?;
    Ok(Imported { graph, weights, left, boundary, merged })
}

/// The dtype and shape of a graph input; `dim_param` names become dynamic dims.
fn value_type(v: &crate::proto::ValueInfoProto) -> Result<(DType, Shape), OnnxError> {
    use crate::proto::tensor_shape_proto::dimension::Value as D;
    use crate::proto::type_proto::Value as T;
    let err = |m: String| OnnxError::model(format!("graph input `{}`: {m}", v.name));
    let Some(T::TensorType(t)) = v.r#type.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(err("is not a tensor".into()));
    };
    let dtype = elem_dtype(t.elem_type).ok_or_else(|| {
        err(format!(
            "element type {} is not one of {} (ONNX 1, 10, 16, 7, 6, 9)",
            t.elem_type,
            DType::names()
        ))
    })?;
    let shape = t.shape.as_ref().ok_or_else(|| err("has no shape".into()))?;
    let dims = shape
        .dim
        .iter()
        .enumerate()
        .map(|(a, d)| match &d.value {
            Some(D::DimValue(n)) if *n >= 0 => Ok(DimExpr::constant(*n)),
            Some(D::DimParam(p)) if !p.is_empty() => Ok(DimExpr::sym(&dim_name(p))),
            _ => Err(err(format!("axis {a} has neither a size nor a name"))
                .help("name dynamic axes when exporting (dynamic_axes / dynamic_shapes)")),
        })
        .collect::<Result<Shape, OnnxError>>()?;
    Ok((dtype, dims))
}

/// A dim name usable in generated code: letters, digits and `_`.
fn dim_name(p: &str) -> String {
    let s: String = p.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if s.starts_with(|c: char| c.is_ascii_digit()) {
        format!("d_{s}")
    } else {
        s
    }
}

/// The storage type of an ONNX element type, floats and integers.
fn elem_dtype(t: i32) -> Option<DType> {
    match t {
        data_type::INT64 => Some(DType::I64),
        data_type::INT32 => Some(DType::I32),
        data_type::BOOL => Some(DType::Bool),
        t => float_dtype(t),
    }
}

fn float_dtype(t: i32) -> Option<DType> {
    match t {
        data_type::FLOAT => Some(DType::F32),
        data_type::FLOAT16 => Some(DType::F16),
        data_type::BFLOAT16 => Some(DType::BF16),
        _ => None,
    }
}

struct Importer<'m> {
    model: &'m Model,
    b: GraphBuilder,
    vals: HashMap<String, Val>,
    inits: HashMap<String, &'m TensorProto>,
    weights: Vec<(usize, String)>,
    n_params: usize,
    opset: i64,
    /// The run-time values of dynamic dims built so far (`dim_node`), built once each.
    dim_values: HashMap<(DimExpr, DType), NodeId>,
}

/// Attributes of one node, by name.
struct Attrs<'a>(&'a [AttributeProto]);

impl Attrs<'_> {
    fn get(&self, n: &str) -> Option<&AttributeProto> {
        self.0.iter().find(|a| a.name == n)
    }
    fn int(&self, n: &str, default: i64) -> i64 {
        self.get(n).filter(|a| a.r#type == attribute_type::INT).map_or(default, |a| a.i)
    }
    fn float(&self, n: &str, default: f32) -> f32 {
        self.get(n).filter(|a| a.r#type == attribute_type::FLOAT).map_or(default, |a| a.f)
    }
    fn ints(&self, n: &str) -> Option<Vec<i64>> {
        self.get(n).filter(|a| a.r#type == attribute_type::INTS).map(|a| a.ints.clone())
    }
    fn string(&self, n: &str) -> Option<String> {
        self.get(n)
            .filter(|a| a.r#type == attribute_type::STRING)
            .map(|a| String::from_utf8_lossy(&a.s).into_owned())
    }
}

/// Axis `a` (negative counts from the end) of a rank-`r` tensor.
fn axis(a: i64, r: usize) -> Result<usize, String> {
    let v = if a < 0 { a + r as i64 } else { a };
    if (0..r as i64).contains(&v) {
        Ok(v as usize)
    } else {
        Err(format!("axis {a} is out of range for rank {r}"))
    }
}

/// Flatten's axis of a rank-`r` tensor: in `-r ..= r`, a negative one counting from `r`.
fn flatten_axis(a: i64, r: usize) -> Result<usize, String> {
    let v = if a < 0 { a + r as i64 } else { a };
    usize::try_from(v)
        .ok()
        .filter(|v| *v <= r)
        .ok_or_else(|| format!("Flatten axis {a} is out of range for rank {r}"))
}

type R<T> = Result<T, String>;

impl Importer<'_> {
    /// The error of node `n`: its op, opset and input shapes, and what went wrong.
    fn node_error(&self, n: &NodeProto, msg: String) -> OnnxError {
        let ins: Vec<String> = n
            .input
            .iter()
            .filter(|i| !i.is_empty())
            .map(|i| match self.vals.get(i) {
                Some(Val::Node(id)) => {
                    let nd = self.b.node(*id);
                    format!("{i}: {}{}", nd.dtype.name(), shape_str(&nd.shape))
                }
                Some(Val::Known { shape, .. }) => format!("{i}: constant {shape:?}"),
                None if self.inits.contains_key(i) => format!("{i}: initializer"),
                None => format!("{i}: (unknown)"),
            })
            .collect();
        OnnxError {
            context: format!(
                "node `{}` ({}, opset {}) with inputs [{}]",
                n.name,
                n.op_type,
                self.opset,
                ins.join(", ")
            ),
            msg,
            help: None,
        }
    }

    /// The value named `name`: computed, known, or an initializer (a weight becomes a
    /// parameter the first time it is read).
    fn val(&mut self, name: &str) -> R<Val> {
        if let Some(v) = self.vals.get(name) {
            return Ok(v.clone());
        }
        let Some(t) = self.inits.get(name).copied() else {
            let later = self
                .model
                .proto
                .graph
                .as_ref()
                .is_some_and(|g| g.node.iter().any(|n| n.output.iter().any(|o| o == name)));
            return Err(if later {
                format!(
                    "input `{name}` is produced by a later node (the nodes are not in topological \
                     order, or they form a cycle)"
                )
            } else {
                format!("input `{name}` is produced by no node, input or initializer")
            });
        };
        let v = self.initializer(t, name)?;
        self.vals.insert(name.to_string(), v.clone());
        Ok(v)
    }

    /// An initializer, or the value of a Constant node, named `name` (an initializer's own, a
    /// Constant's output): integers and float scalars are known; other floats are weights,
    /// read from the model file by that name.
    fn initializer(&mut self, t: &TensorProto, name: &str) -> R<Val> {
        let shape: Vec<usize> = t
            .dims
            .iter()
            .map(|d| {
                usize::try_from(*d).map_err(|_| format!("initializer `{}` has dim {d}", t.name))
            })
            .collect::<R<_>>()?;
        let n = shape
            .iter()
            .try_fold(1usize, |a, d| a.checked_mul(*d))
            .ok_or_else(|| format!("initializer `{}`: shape {shape:?} overflows", t.name))?;
        let known = |ints: Vec<DimExpr>, floats: Vec<f64>, float: bool| Val::Known {
            shape: shape.clone(),
            ints,
            floats,
            float,
        };
        match t.data_type {
            data_type::INT64
            | data_type::INT32
            | data_type::BOOL
            | data_type::INT8
            | data_type::UINT8 => {
                let elem = match t.data_type {
                    data_type::INT64 => 8,
                    data_type::INT32 => 4,
                    _ => 1,
                };
                let b = tensor_bytes(t, &self.model.path, elem, n).map_err(|e| e.msg)?;
                let ints = b
                    .chunks_exact(elem)
                    .map(|c| {
                        DimExpr::constant(match t.data_type {
                            data_type::INT64 => i64::from_le_bytes(c.try_into().unwrap()),
                            data_type::INT32 => i32::from_le_bytes(c.try_into().unwrap()) as i64,
                            data_type::INT8 => c[0] as i8 as i64,
                            _ => c[0] as i64,
                        })
                    })
                    .collect();
                Ok(known(ints, vec![], false))
            }
            ty => {
                let dtype = float_dtype(ty).ok_or_else(|| {
                    format!(
                        "initializer `{}` has element type {ty}, not a float or an integer",
                        t.name
                    )
                })?;
                if n <= 1 {
                    let b =
                        tensor_bytes(t, &self.model.path, dtype.size(), n).map_err(|e| e.msg)?;
                    let v = match dtype {
                        DType::F32 => f32::from_le_bytes(b[..4].try_into().unwrap()) as f64,
                        DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
                        DType::BF16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
                        DType::I64 | DType::I32 | DType::Bool => {
                            unreachable!("float_dtype gives a float type")
                        }
                    };
                    return Ok(known(vec![], vec![v], true));
                }
                // The data is read at run time; its presence and size are checked now (a
                // mapping, not a copy).
                tensor_bytes(t, &self.model.path, dtype.size(), n).map_err(|e| e.msg)?;
                let dims = shape.iter().map(|d| DimExpr::constant(*d as i64)).collect();
                let id = self.b.param(name, dtype, dims);
                self.weights.push((self.n_params, name.to_string()));
                self.n_params += 1;
                Ok(Val::Node(id))
            }
        }
    }

    fn node_of(&mut self, name: &str) -> R<NodeId> {
        match self.val(name)? {
            Val::Node(id) => Ok(id),
            Val::Known { .. } => {
                Err(format!("input `{name}` is a constant where a tensor is computed"))
            }
        }
    }

    /// Integer contents of a known input (shapes, axes, indices).
    fn ints_of(&mut self, name: &str) -> R<Vec<DimExpr>> {
        match self.val(name)? {
            Val::Known { ints, float: false, .. } => Ok(ints),
            _ => Err(format!(
                "input `{name}` must be known at import time (a constant integer tensor)"
            )),
        }
    }

    fn const_ints(&mut self, name: &str) -> R<Vec<i64>> {
        self.ints_of(name)?
            .iter()
            .map(|d| {
                d.as_const().ok_or_else(|| format!("input `{name}` must be constant, it is {d}"))
            })
            .collect()
    }

    fn shape(&self, id: NodeId) -> Shape {
        self.b.node(id).shape.clone()
    }

    fn set(&mut self, n: &NodeProto, out: usize, v: Val) {
        if let Some(name) = n.output.get(out).filter(|s| !s.is_empty()) {
            self.vals.insert(name.clone(), v);
        }
    }

    fn name(n: &NodeProto) -> String {
        n.output.first().cloned().unwrap_or_else(|| n.name.clone())
    }

    /// Ops folded at import only: an input computed at run time (a mask built from an input,
    /// positions of a dynamic length) is an error naming which.
    fn known_only(&self, op: &str, vals: &[&Val]) -> R<()> {
        match vals.iter().position(|v| matches!(v, Val::Node(_))) {
            None => Ok(()),
            Some(i) => Err(format!(
                "`{op}` on a tensor computed at run time (input {i}) is not supported yet: only \
                 on shapes and constants, which are folded at import"
            )),
        }
    }

    /// Split along an axis into views (Slice), one per output: sizes from the `split` input
    /// (opset 13+), else `num_outputs` (opset 18+) or the output count, equal parts with the
    /// last one smaller as ONNX says.
    fn split(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<()> {
        let x = self.node_of(n.input.first().ok_or("input 0 is missing")?)?;
        let shape = self.shape(x);
        let ax = axis(a.int("axis", 0), shape.len())?;
        let outs = n.output.len();
        let sizes: Vec<DimExpr> = match n.input.get(1).filter(|s| !s.is_empty()) {
            Some(sp) => self.ints_of(&sp.clone())?,
            None => {
                let parts = a.int("num_outputs", outs as i64);
                if parts < 1 || parts as usize != outs {
                    return Err(format!("Split into {parts} parts with {outs} outputs"));
                }
                let len = &shape[ax];
                let each = match len.as_const() {
                    Some(l) => DimExpr::constant((l + parts - 1) / parts),
                    None => len.div_const(parts).ok_or_else(|| {
                        format!("Split of the dynamic dim {len} into {parts} equal parts")
                    })?,
                };
                (0..parts)
                    .map(|i| {
                        let start = each.mul(&DimExpr::constant(i));
                        match len.as_const() {
                            Some(l) => DimExpr::constant(
                                (l - start.as_const().unwrap()).clamp(0, each.as_const().unwrap()),
                            ),
                            None => each.clone(),
                        }
                    })
                    .collect()
            }
        };
        if sizes.len() != outs {
            return Err(format!("Split into {} parts with {outs} outputs", sizes.len()));
        }
        let total = sizes.iter().fold(DimExpr::constant(0), |acc, s| acc.add(s));
        if total != shape[ax] {
            return Err(format!("Split sizes add up to {total}, the axis {ax} has {}", shape[ax]));
        }
        let mut start = DimExpr::constant(0);
        for (i, size) in sizes.iter().enumerate() {
            let end = start.add(size);
            let nm = n.output[i].clone();
            let nm = if nm.is_empty() { format!("{name}.{i}") } else { nm };
            let id = self
                .b
                .op(Op::Slice { axis: ax, start: start.clone(), end: end.clone() }, &[x], &nm)
                .map_err(|e| e.msg)?;
            self.set(n, i, Val::Node(id));
            start = end;
        }
        Ok(())
    }

    fn bin(&mut self, op: BinaryOp, x: Val, y: Val, name: &str) -> R<Val> {
        match (x, y) {
            (Val::Node(a), Val::Node(b)) => {
                self.b.binary(op, a, b, name).map(Val::Node).map_err(|e| e.msg)
            }
            (Val::Node(a), k @ Val::Known { .. }) => {
                let c = self.operand(k, self.b.node(a).dtype, self.shape(a).len(), name)?;
                self.b.binary(op, a, c, name).map(Val::Node).map_err(|e| e.msg)
            }
            (k @ Val::Known { .. }, Val::Node(b)) => {
                let c = self.operand(k, self.b.node(b).dtype, self.shape(b).len(), name)?;
                self.b.binary(op, c, b, name).map(Val::Node).map_err(|e| e.msg)
            }
            (a, b) => fold_binary(op, &a, &b),
        }
    }

    /// A value as the operand of an elementwise op whose computed operands have rank up to
    /// `rank`: a computed one as it is; a known one as a scalar constant when it is one element
    /// that broadcasts without raising that rank, else as the tensor it stands for
    /// (`tensor_of`), of type `like`.
    fn operand(&mut self, v: Val, like: DType, rank: usize, name: &str) -> R<NodeId> {
        match &v {
            Val::Node(id) => Ok(*id),
            Val::Known { shape, .. }
                if shape.iter().product::<usize>() == 1 && shape.len() <= rank =>
            {
                self.scalar(&v, like)
            }
            _ => self.tensor_of(v, like, &format!("{name}.const")),
        }
    }

    /// A known single-element value as an IR constant of `dtype`.
    fn scalar(&mut self, k: &Val, dtype: DType) -> R<NodeId> {
        let Val::Known { ints, floats, float, .. } = k else { unreachable!() };
        let v = match (float, floats.as_slice(), ints.as_slice()) {
            (true, [v], _) => *v,
            (false, _, [d]) => match d.as_const() {
                Some(v) => v as f64,
                // A dim's value (`S` in `position_ids + S`): computed at run time.
                None => return self.dim_node(&d.clone(), dtype, "dim"),
            },
            _ => return Err("a constant with several elements used as a tensor operand".into()),
        };
        Ok(self.b.constant(v, dtype))
    }

    fn node(&mut self, n: &NodeProto) -> R<()> {
        if !n.domain.is_empty() && n.domain != "ai.onnx" {
            return Err(format!("domain `{}` is not supported", n.domain));
        }
        let a = Attrs(&n.attribute);
        let name = Self::name(n);
        let op = n.op_type.as_str();
        let out = if let Some(v) = self.elementwise(n, &a, &name)? {
            v
        } else if let Some(v) = self.computed_logic(n, &a, &name)? {
            v
        } else if let Some(v) = self.layout(n, &a, &name)? {
            v
        } else if let Some(v) = self.folded(n, &a)? {
            v
        } else {
            match op {
                "Identity" => self.val(&need(n, 0)?)?,
                // Inference: Dropout passes its input through (its `training_mode` input,
                // opset 12+, must then be absent or false; its mask output unused).
                "Dropout" => {
                    if let Some(tm) = input(n, 2) {
                        if self.const_ints(&tm)?.iter().any(|v| *v != 0) {
                            return Err("Dropout in training mode is not inference".into());
                        }
                    }
                    self.val(&need(n, 0)?)?
                }
                "Cast" => self.cast(&need(n, 0)?, a.int("to", 0) as i32, &name)?,
                "MatMul" => self.matmul(&need(n, 0)?, &need(n, 1)?, &name)?,
                "Gemm" => self.gemm(n, &a, &name)?,
                "Softmax" => {
                    let x = self.node_of(&need(n, 0)?)?;
                    let ax = axis(a.int("axis", -1), self.shape(x).len())?;
                    Val::Node(self.b.op(Op::Softmax { axis: ax }, &[x], &name).map_err(|e| e.msg)?)
                }
                "LayerNormalization" => self.layer_norm(n, &a, &name)?,
                "ReduceMean" | "ReduceSum" | "ReduceMax" => self.reduce(n, &a, &name)?,
                "Constant" => self.constant(&a, &name)?,
                "Concat" => self.concat(n, &a, &name)?,
                "Gather" => self.gather(n, &a, &name)?,
                "GatherND" => self.gather_nd(n, &a, &name)?,
                "Slice" => self.slice(n, &name)?,
                "Split" => return self.split(n, &a, &name),
                _ => {
                    return Err(format!(
                        "op `{op}` is not supported by the importer (supported: {SUPPORTED})"
                    ))
                }
            }
        };
        self.set(n, 0, out);
        // (Dropout's mask output, when a model names it, is left undefined: a node reading it
        // is an error that names it.)
        if !matches!(op, "LayerNormalization" | "Dropout")
            && n.output.iter().skip(1).any(|o| !o.is_empty())
        {
            return Err("only the first output of this op is supported".into());
        }
        Ok(())
    }

    /// Elementwise functions (variadic binary ops fold left, as ONNX's Max / Min / Sum do).
    fn elementwise(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Option<Val>> {
        let op = n.op_type.as_str();
        if op == "Pow" {
            return self.pow(n, name).map(Some);
        }
        if let Some(b) = binary_op(op) {
            let mut acc = self.val(&need(n, 0)?)?;
            for i in 1..n.input.len() {
                let y = self.val(&need(n, i)?)?;
                acc = self.bin(b, acc, y, name)?;
            }
            return Ok(Some(acc));
        }
        let u = match (unary_op(op), op) {
            (Some(u), _) => u,
            (None, "Gelu") => match a.string("approximate").as_deref() {
                None | Some("none") => UnaryOp::Gelu,
                Some("tanh") => UnaryOp::GeluTanh,
                Some(o) => return Err(format!("approximate = `{o}` is not a GELU")),
            },
            (None, "Reciprocal") => {
                let x = self.node_of(&need(n, 0)?)?;
                let one = self.b.constant(1.0, self.b.node(x).dtype);
                let y = self.b.binary(BinaryOp::Div, one, x, name).map_err(|e| e.msg)?;
                return Ok(Some(Val::Node(y)));
            }
            _ => return Ok(None),
        };
        let x = match self.val(&need(n, 0)?)? {
            Val::Node(x) => x,
            k => return fold::unary(u, &k).map(Some),
        };
        Ok(Some(Val::Node(self.b.unary(u, x, name).map_err(|e| e.msg)?)))
    }

    /// Pow: ONNX lets the exponent have its own type; it is cast to the base's (a float; an
    /// integer base is not taken).
    fn pow(&mut self, n: &NodeProto, name: &str) -> R<Val> {
        let (x, y) = (self.val(&need(n, 0)?)?, self.val(&need(n, 1)?)?);
        let y = match (&x, y) {
            (Val::Node(b), Val::Node(e)) if self.b.node(*b).dtype != self.b.node(e).dtype => {
                let d = self.b.node(*b).dtype;
                if !d.is_float() {
                    return Err(format!("Pow of an integer base ({d}) is not supported"));
                }
                Val::Node(self.b.cast(e, d, &format!("{name}.exponent")).map_err(|e| e.msg)?)
            }
            (_, y) => y,
        };
        self.bin(BinaryOp::Pow, x, y, name)
    }

    /// Ops that move or describe a tensor's layout: views, and its shape as a known value.
    fn layout(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Option<Val>> {
        let op = n.op_type.as_str();
        let views = ["Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Shape", "Size"];
        if !views.contains(&op) {
            return Ok(None);
        }
        if matches!(op, "Squeeze" | "Unsqueeze") {
            return self.squeeze(n, a, name).map(Some);
        }
        let xv = self.val(&need(n, 0)?)?;
        let s: Shape = match &xv {
            Val::Node(id) => self.shape(*id),
            Val::Known { shape, .. } => {
                shape.iter().map(|d| DimExpr::constant(*d as i64)).collect()
            }
        };
        if matches!(op, "Shape" | "Size") {
            // Of a computed or a known value alike: known.
            if op == "Size" {
                return Ok(Some(Val::Known {
                    shape: vec![],
                    ints: vec![numel(&s)],
                    floats: vec![],
                    float: false,
                }));
            }
            let r = s.len() as i64;
            let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
            let (st, en) = (clamp(a.int("start", 0)), clamp(a.int("end", r)));
            let ints: Vec<DimExpr> = s[st..en.max(st)].to_vec();
            return Ok(Some(Val::Known {
                shape: vec![ints.len()],
                ints,
                floats: vec![],
                float: false,
            }));
        }
        let x = match xv {
            Val::Node(id) => id,
            k => match self.known_layout(n, a, k.clone())? {
                Some(v) => return Ok(Some(v)),
                // Otherwise built as a tensor and moved as one.
                None => self.tensor_of(k, DType::I64, &format!("{name}.const"))?,
            },
        };
        Ok(Some(match op {
            "Transpose" => {
                let r = s.len();
                let perm: Vec<usize> = match a.ints("perm") {
                    Some(p) => p.iter().map(|p| axis(*p, r)).collect::<R<_>>()?,
                    None => (0..r).rev().collect(),
                };
                Val::Node(self.b.op(Op::Transpose { perm }, &[x], name).map_err(|e| e.msg)?)
            }
            "Reshape" => {
                let spec = self.ints_of(&need(n, 1)?)?;
                let to = reshape_target(&s, &spec, a.int("allowzero", 0) != 0)?;
                Val::Node(self.b.reshape(x, to, name).map_err(|e| e.msg)?)
            }
            _ => {
                // Flatten, the one left.
                let ax = flatten_axis(a.int("axis", 1), s.len())?;
                let to = vec![numel(&s[..ax]), numel(&s[ax..])];
                Val::Node(self.b.reshape(x, to, name).map_err(|e| e.msg)?)
            }
        }))
    }

    /// Reshape / Flatten of a known value to a constant shape: folded (its elements keep their
    /// order). `None` for what must be computed.
    fn known_layout(&mut self, n: &NodeProto, a: &Attrs, k: Val) -> R<Option<Val>> {
        let Val::Known { shape, ints, floats, float } = k else { return Ok(None) };
        let dims: Shape = shape.iter().map(|d| DimExpr::constant(*d as i64)).collect();
        let to = match n.op_type.as_str() {
            "Reshape" => {
                reshape_target(&dims, &self.ints_of(&need(n, 1)?)?, a.int("allowzero", 0) != 0)?
            }
            "Flatten" => {
                let ax = flatten_axis(a.int("axis", 1), dims.len())?;
                vec![numel(&dims[..ax]), numel(&dims[ax..])]
            }
            _ => return Ok(None),
        };
        let Some(to) =
            to.iter().map(|d| d.as_const().map(|v| v as usize)).collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        Ok(Some(Val::Known { shape: to, ints, floats, float }))
    }

    /// Exporters' arithmetic on shapes and constants, folded at import (`fold`): each takes
    /// known values only.
    fn folded(&mut self, n: &NodeProto, a: &Attrs) -> R<Option<Val>> {
        let op = n.op_type.as_str();
        let vals = |me: &mut Self, k: usize| -> R<Vec<Val>> {
            (0..k).map(|i| me.val(&need(n, i)?)).collect()
        };
        Ok(Some(match op {
            "Equal" | "Less" | "LessOrEqual" | "Greater" | "GreaterOrEqual" => {
                let v = vals(self, 2)?;
                self.known_only(op, &[&v[0], &v[1]])?;
                fold::compare(op, &v[0], &v[1])?
            }
            "Not" | "And" | "Or" | "Xor" => {
                let v = vals(self, if op == "Not" { 1 } else { 2 })?;
                self.known_only(op, &v.iter().collect::<Vec<_>>())?;
                fold::logic(op, &v)?
            }
            "Where" => {
                let v = vals(self, 3)?;
                self.known_only(op, &[&v[0], &v[1], &v[2]])?;
                fold::select(&v[0], &v[1], &v[2])?
            }
            "Expand" => {
                let x = self.val(&need(n, 0)?)?;
                let to = self.ints_of(&need(n, 1)?)?;
                if let Val::Node(id) = x {
                    // A computed tensor (a mask broadcast to [B, 1, S, S], heads repeated):
                    // the IR's expand, materialised where a kernel needs it.
                    let e = self.b.op(Op::Expand { shape: to }, &[id], &Self::name(n));
                    return e.map(|e| Some(Val::Node(e))).map_err(|e| e.msg);
                }
                self.known_only(op, &[&x])?;
                if to.iter().all(|d| d.as_const().is_some()) {
                    fold::expand(&x, &to)?
                } else {
                    let nm = Self::name(n);
                    let k = self.tensor_of(x, DType::I64, &format!("{nm}.const"))?;
                    let e = self.b.op(Op::Expand { shape: to }, &[k], &nm);
                    return e.map(|e| Some(Val::Node(e))).map_err(|e| e.msg);
                }
            }
            "ConstantOfShape" => {
                let shape = self.ints_of(&need(n, 0)?)?;
                let value = match a.get("value").and_then(|v| v.t.as_ref()) {
                    Some(t) => Some(self.initializer(t, &t.name)?),
                    None => None,
                };
                if shape.iter().all(|d| d.as_const().is_some()) {
                    fold::constant_of_shape(&shape, value)?
                } else {
                    // Of a dynamic shape (a mask [B, 1, S, S] filled before Where): computed.
                    let elem = a.get("value").and_then(|v| v.t.as_ref()).map(|t| t.data_type);
                    let dtype = elem.and_then(elem_dtype).unwrap_or(DType::F32);
                    let fill = value.unwrap_or(Val::Known {
                        shape: vec![],
                        ints: vec![],
                        floats: vec![0.0],
                        float: true,
                    });
                    let nm = Self::name(n);
                    let c = self.scalar(&fill, dtype)?;
                    Val::Node(self.b.op(Op::Expand { shape }, &[c], &nm).map_err(|e| e.msg)?)
                }
            }
            "Range" => {
                let v = vals(self, 3)?;
                if let Some(i) = v.iter().position(|x| matches!(x, Val::Node(_))) {
                    return Err(format!(
                        "Range whose bound (input {i}) is a value computed at run time: its \
                         length would depend on the data, and shapes here depend on dims only"
                    ));
                }
                let symbolic = v.iter().any(|x| {
                    matches!(x, Val::Known { ints, .. } if ints.iter().any(|d| d.as_const().is_none()))
                });
                if symbolic {
                    self.dynamic_range(&v, &Self::name(n))?
                } else {
                    fold::range(&v[0], &v[1], &v[2])?
                }
            }
            "CumSum" => {
                let x = self.val(&need(n, 0)?)?;
                self.known_only(op, &[&x])?;
                let rank = fold::known(&x).map_or(0, |k| k.0.len());
                let ax = match self.const_ints(&need(n, 1)?)?.as_slice() {
                    [v] => axis(*v, rank)?,
                    _ => return Err("CumSum's axis must be a scalar".into()),
                };
                fold::cumsum(&x, ax, a.int("exclusive", 0) != 0, a.int("reverse", 0) != 0)?
            }
            _ => return Ok(None),
        }))
    }

    /// GELU written out with Erf (`patterns`), as the exact GELU of its input.
    fn gelu(&mut self, n: &NodeProto, x: &str) -> R<()> {
        let x = self.node_of(x)?;
        let y = self.b.unary(UnaryOp::Gelu, x, &Self::name(n)).map_err(|e| e.msg)?;
        self.set(n, 0, Val::Node(y));
        Ok(())
    }

    fn cast(&mut self, x: &str, to: i32, name: &str) -> R<Val> {
        match self.val(x)? {
            Val::Node(id) => {
                let d =
                    elem_dtype(to).ok_or_else(|| format!("Cast to type {to} is not supported"))?;
                Ok(Val::Node(self.b.cast(id, d, name).map_err(|e| e.msg)?))
            }
            Val::Known { shape, ints, floats, float } => {
                let to_float = float_dtype(to).is_some();
                if to_float == float {
                    return Ok(Val::Known { shape, ints, floats, float });
                }
                if to_float {
                    let floats = ints
                        .iter()
                        .map(|d| {
                            d.as_const().map(|v| v as f64).ok_or("a symbolic dim cast to float")
                        })
                        .collect::<Result<_, _>>()?;
                    Ok(Val::Known { shape, ints: vec![], floats, float: true })
                } else {
                    let ints = floats.iter().map(|f| DimExpr::constant(f.trunc() as i64)).collect();
                    Ok(Val::Known { shape, ints, floats: vec![], float: false })
                }
            }
        }
    }

    /// numpy.matmul: a 1-D A is a row [1, K] and a 1-D B a column [K, 1], that axis dropped
    /// from the result.
    fn matmul(&mut self, a: &str, b: &str, name: &str) -> R<Val> {
        let (mut x, mut y) = (self.node_of(a)?, self.node_of(b)?);
        let (ra, rb) = (self.shape(x).len(), self.shape(y).len());
        if ra == 0 || rb == 0 {
            return Err("MatMul of a scalar".into());
        }
        let one = DimExpr::constant(1);
        if ra == 1 {
            let s = vec![one.clone(), self.shape(x)[0].clone()];
            x = self.b.reshape(x, s, &format!("{name}.a_row")).map_err(|e| e.msg)?;
        }
        if rb == 1 {
            let s = vec![self.shape(y)[0].clone(), one.clone()];
            y = self.b.reshape(y, s, &format!("{name}.b_col")).map_err(|e| e.msg)?;
        }
        if ra > 1 && rb > 1 {
            return Ok(Val::Node(self.b.matmul(x, y, name).map_err(|e| e.msg)?));
        }
        let z = self.b.matmul(x, y, &format!("{name}.mm")).map_err(|e| e.msg)?;
        let mut s = self.shape(z);
        let r = s.len();
        if rb == 1 {
            s.remove(r - 1);
        }
        if ra == 1 {
            s.remove(r - 2);
        }
        Ok(Val::Node(self.b.reshape(z, s, name).map_err(|e| e.msg)?))
    }

    fn gemm(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let mut x = self.node_of(&n.input[0])?;
        let mut w = self.node_of(n.input.get(1).ok_or("input 1 is missing")?)?;
        if self.shape(x).len() != 2 || self.shape(w).len() != 2 {
            return Err("Gemm operands must be 2-D".into());
        }
        let tr = |b: &mut GraphBuilder, v: NodeId, nm: &str| {
            b.op(Op::Transpose { perm: vec![1, 0] }, &[v], nm).map_err(|e| e.msg)
        };
        if a.int("transA", 0) != 0 {
            x = tr(&mut self.b, x, &format!("{name}.a_t"))?;
        }
        if a.int("transB", 0) != 0 {
            w = tr(&mut self.b, w, &format!("{name}.b_t"))?;
        }
        let mut y = self.b.matmul(x, w, &format!("{name}.mm")).map_err(|e| e.msg)?;
        let (alpha, beta) = (a.float("alpha", 1.0) as f64, a.float("beta", 1.0) as f64);
        let dtype = self.b.node(y).dtype;
        if alpha != 1.0 {
            let c = self.b.constant(alpha, dtype);
            y = self.b.binary(BinaryOp::Mul, y, c, &format!("{name}.alpha")).map_err(|e| e.msg)?;
        }
        if let Some(c) = n.input.get(2).filter(|s| !s.is_empty()) {
            let mut c = self.val(c)?;
            if beta != 1.0 {
                let k = Val::Known { shape: vec![], ints: vec![], floats: vec![beta], float: true };
                c = self.bin(BinaryOp::Mul, c, k, &format!("{name}.beta"))?;
            }
            return self.bin(BinaryOp::Add, Val::Node(y), c, name);
        }
        Ok(Val::Node(y))
    }

    fn layer_norm(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let x = self.node_of(&n.input[0])?;
        let shape = self.shape(x);
        let r = shape.len();
        let ax = axis(a.int("axis", -1), r)?;
        self.layer_norm_stats(n, x, ax, a.float("epsilon", 1e-5) as f64, name)?;
        let mut g = self.node_of(n.input.get(1).ok_or("input 1 (Scale) is missing")?)?;
        let mut bias = match n.input.get(2).filter(|s| !s.is_empty()) {
            Some(b) => self.node_of(b)?,
            None => self.b.constant(0.0, self.b.node(x).dtype),
        };
        let eps = a.float("epsilon", 1e-5) as f64;
        if ax == r - 1 {
            return self
                .b
                .op(Op::LayerNorm { eps }, &[x, g, bias], name)
                .map(Val::Node)
                .map_err(|e| e.msg);
        }
        // Normalised over axes ax..: flattened into one last axis (scale and bias too, which
        // broadcast over those axes), normalised, and shaped back.
        let inner = numel(&shape[ax..]);
        let mut flat: Shape = shape[..ax].to_vec();
        flat.push(inner.clone());
        let xf = self.b.reshape(x, flat, &format!("{name}.flat")).map_err(|e| e.msg)?;
        for (v, what) in [(&mut g, "scale"), (&mut bias, "bias")] {
            let vs = self.shape(*v);
            if vs.is_empty() {
                continue; // a scalar broadcasts as it is
            }
            let want: Shape = shape[ax..].to_vec();
            let full: Shape = vec![DimExpr::constant(1); want.len().saturating_sub(vs.len())]
                .into_iter()
                .chain(vs.iter().cloned())
                .collect();
            if full != want {
                return Err(format!(
                    "{what} {} does not cover the normalised axes {}",
                    shape_str(&vs),
                    shape_str(&want)
                ));
            }
            *v = self
                .b
                .reshape(*v, vec![inner.clone()], &format!("{name}.{what}"))
                .map_err(|e| e.msg)?;
        }
        let y = self
            .b
            .op(Op::LayerNorm { eps }, &[xf, g, bias], &format!("{name}.norm"))
            .map_err(|e| e.msg)?;
        Ok(Val::Node(self.b.reshape(y, shape, name).map_err(|e| e.msg)?))
    }

    /// LayerNormalization's optional outputs 1 (Mean) and 2 (InvStdDev), shaped like X with
    /// the normalised axes kept as 1, computed from X flattened over those axes.
    fn layer_norm_stats(
        &mut self,
        n: &NodeProto,
        x: NodeId,
        ax: usize,
        eps: f64,
        name: &str,
    ) -> R<()> {
        let wanted = |i: usize| n.output.get(i).is_some_and(|o| !o.is_empty());
        if !wanted(1) && !wanted(2) {
            return Ok(());
        }
        let shape = self.shape(x);
        let mut flat: Shape = shape[..ax].to_vec();
        flat.push(numel(&shape[ax..]));
        let kept: Shape = shape
            .iter()
            .enumerate()
            .map(|(i, d)| if i < ax { d.clone() } else { DimExpr::constant(1) })
            .collect();
        let e = |e: autofusion_compiler::BuildError| e.msg;
        let xf = self.b.reshape(x, flat, &format!("{name}.stats_in")).map_err(e)?;
        let last = self.shape(xf).len() - 1;
        let mean = self
            .b
            .op(Op::Reduce { kind: ReduceKind::Mean, axis: last }, &[xf], &format!("{name}.mean"))
            .map_err(e)?;
        let c = self.b.binary(BinaryOp::Sub, xf, mean, &format!("{name}.centered")).map_err(e)?;
        let sq = self.b.binary(BinaryOp::Mul, c, c, &format!("{name}.sq")).map_err(e)?;
        let var = self
            .b
            .op(Op::Reduce { kind: ReduceKind::Mean, axis: last }, &[sq], &format!("{name}.var"))
            .map_err(e)?;
        let k = self.b.constant(eps, self.b.node(x).dtype);
        let ve = self.b.binary(BinaryOp::Add, var, k, &format!("{name}.var_eps")).map_err(e)?;
        let inv = self.b.unary(UnaryOp::Rsqrt, ve, &format!("{name}.inv_std")).map_err(e)?;
        for (i, v, what) in [(1, mean, "mean"), (2, inv, "inv_std_dev")] {
            if wanted(i) {
                let out =
                    self.b.reshape(v, kept.clone(), &format!("{name}.{what}_out")).map_err(e)?;
                self.set(n, i, Val::Node(out));
            }
        }
        Ok(())
    }

    fn reduce(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let xv = self.val(&n.input[0])?;
        let r = match &xv {
            Val::Node(id) => self.shape(*id).len(),
            Val::Known { shape, .. } => shape.len(),
        };
        // Axes: an attribute before opset 18 (ReduceSum: before 13), an input after.
        let axes_input = n.op_type == "ReduceSum" || self.opset >= 18;
        let axes: Vec<i64> = match (axes_input, n.input.get(1).filter(|s| !s.is_empty())) {
            (true, Some(ax)) => self.const_ints(&ax.clone())?,
            (true, None) => vec![],
            (false, _) => a.ints("axes").unwrap_or_default(),
        };
        if axes.is_empty() && a.int("noop_with_empty_axes", 0) != 0 {
            return Ok(xv);
        }
        let mut axes: Vec<usize> = if axes.is_empty() {
            (0..r).collect()
        } else {
            axes.iter().map(|v| axis(*v, r)).collect::<R<_>>()?
        };
        axes.sort_unstable();
        axes.dedup();
        let kind = match n.op_type.as_str() {
            "ReduceMean" => ReduceKind::Mean,
            "ReduceSum" => ReduceKind::Sum,
            _ => ReduceKind::Max,
        };
        let x = match xv {
            Val::Node(x) => x,
            k => return fold::reduce(kind, &k, &axes, a.int("keepdims", 1) != 0),
        };
        // ReduceMax of bools is "any": the max of them as floats (-inf for none) above 0.
        let any = kind == ReduceKind::Max && self.b.node(x).dtype == DType::Bool;
        let mut y = if any {
            self.b.cast(x, DType::F32, &format!("{name}.f32")).map_err(|e| e.msg)?
        } else {
            x
        };
        for (k, ax) in axes.iter().enumerate() {
            let nm = if k + 1 == axes.len() { name.to_string() } else { format!("{name}.{ax}") };
            y = self.b.op(Op::Reduce { kind, axis: *ax }, &[y], &nm).map_err(|e| e.msg)?;
        }
        if a.int("keepdims", 1) == 0 {
            let s: Shape = self
                .shape(y)
                .iter()
                .enumerate()
                .filter(|(i, _)| !axes.contains(i))
                .map(|(_, d)| d.clone())
                .collect();
            y = self.b.reshape(y, s, &format!("{name}.squeeze")).map_err(|e| e.msg)?;
        }
        if any {
            let zero = self.b.constant(0.0, DType::F32);
            y = self.b.binary(BinaryOp::Gt, y, zero, &format!("{name}.any")).map_err(|e| e.msg)?;
        }
        Ok(Val::Node(y))
    }

    fn squeeze(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let axes: Option<Vec<i64>> = match n.input.get(1).filter(|s| !s.is_empty()) {
            Some(ax) => Some(self.const_ints(&ax.clone())?),
            None => a.ints("axes"),
        };
        let unsqueeze = n.op_type == "Unsqueeze";
        let x = self.val(&n.input[0])?;
        let shape: Shape = match &x {
            Val::Node(id) => self.shape(*id),
            Val::Known { shape, .. } => {
                shape.iter().map(|d| DimExpr::constant(*d as i64)).collect()
            }
        };
        let one = DimExpr::constant(1);
        let to: Shape = if unsqueeze {
            let axes = axes.ok_or("Unsqueeze needs axes")?;
            let r = shape.len() + axes.len();
            let mut ax: Vec<usize> = axes.iter().map(|v| axis(*v, r)).collect::<R<_>>()?;
            ax.sort_unstable();
            let mut src = shape.iter();
            (0..r)
                .map(|i| if ax.contains(&i) { one.clone() } else { src.next().unwrap().clone() })
                .collect()
        } else {
            let ax: Vec<usize> = match axes {
                Some(v) => v.iter().map(|v| axis(*v, shape.len())).collect::<R<_>>()?,
                None => (0..shape.len()).filter(|i| shape[*i] == one).collect(),
            };
            if let Some(i) = ax.iter().find(|i| shape[**i] != one) {
                return Err(format!("axis {i} has size {}, not 1", shape[*i]));
            }
            shape
                .iter()
                .enumerate()
                .filter(|(i, _)| !ax.contains(i))
                .map(|(_, d)| d.clone())
                .collect()
        };
        match x {
            Val::Node(id) => Ok(Val::Node(self.b.reshape(id, to, name).map_err(|e| e.msg)?)),
            Val::Known { ints, floats, float, .. } => Ok(Val::Known {
                shape: to.iter().map(|d| d.as_const().unwrap() as usize).collect(),
                ints,
                floats,
                float,
            }),
        }
    }

    fn constant(&mut self, a: &Attrs, name: &str) -> R<Val> {
        if let Some(t) = a.get("value").and_then(|v| v.t.as_ref()) {
            return self.initializer(t, name);
        }
        if let Some(v) = a.get("value_float") {
            return Ok(Val::Known {
                shape: vec![],
                ints: vec![],
                floats: vec![v.f as f64],
                float: true,
            });
        }
        if let Some(v) = a.get("value_floats") {
            let floats: Vec<f64> = v.floats.iter().map(|f| *f as f64).collect();
            return Ok(Val::Known { shape: vec![floats.len()], ints: vec![], floats, float: true });
        }
        if let Some(v) = a.get("value_int") {
            return Ok(Val::Known {
                shape: vec![],
                ints: vec![DimExpr::constant(v.i)],
                floats: vec![],
                float: false,
            });
        }
        if let Some(v) = a.get("value_ints") {
            let ints: Vec<DimExpr> = v.ints.iter().map(|i| DimExpr::constant(*i)).collect();
            return Ok(Val::Known { shape: vec![ints.len()], ints, floats: vec![], float: false });
        }
        Err("Constant without a supported value attribute".into())
    }

    fn concat(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let vals: Vec<Val> = n.input.iter().map(|i| self.val(i)).collect::<R<_>>()?;
        if vals.iter().all(|v| matches!(v, Val::Known { float: false, .. })) {
            let mut ints = Vec::new();
            for v in vals {
                let Val::Known { shape, ints: xs, .. } = v else { unreachable!() };
                if shape.len() > 1 {
                    return Err("Concat of constant tensors of rank > 1".into());
                }
                ints.extend(xs);
            }
            return Ok(Val::Known { shape: vec![ints.len()], ints, floats: vec![], float: false });
        }
        // Known parts beside computed ones are built as tensors of the computed ones' type.
        let like = vals
            .iter()
            .find_map(|v| match v {
                Val::Node(id) => Some(self.b.node(*id).dtype),
                _ => None,
            })
            .ok_or("Concat of float constants")?;
        let mut ids = Vec::new();
        for (k, v) in vals.into_iter().enumerate() {
            ids.push(self.tensor_of(v, like, &format!("{name}.part{k}"))?);
        }
        let ax = axis(a.int("axis", 0), self.shape(ids[0]).len())?;
        Ok(Val::Node(self.b.op(Op::Concat { axis: ax }, &ids, name).map_err(|e| e.msg)?))
    }

    /// Comparisons, logic, `Where` and `CumSum` on tensors computed at run time (masks from an
    /// `attention_mask`, positions from it): IR ops. On known values they are folded instead.
    fn computed_logic(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Option<Val>> {
        let op = n.op_type.as_str();
        let cmp = match op {
            "Equal" => Some(BinaryOp::Eq),
            "Less" => Some(BinaryOp::Lt),
            "LessOrEqual" => Some(BinaryOp::Le),
            "Greater" => Some(BinaryOp::Gt),
            "GreaterOrEqual" => Some(BinaryOp::Ge),
            "And" => Some(BinaryOp::And),
            "Or" => Some(BinaryOp::Or),
            _ => None,
        };
        if cmp.is_none() && !matches!(op, "Not" | "Xor" | "Where" | "CumSum") {
            return Ok(None);
        }
        let vals: Vec<Val> =
            n.input.iter().filter(|i| !i.is_empty()).map(|i| self.val(i)).collect::<R<_>>()?;
        if !vals.iter().any(|v| matches!(v, Val::Node(_))) {
            return Ok(None); // folded
        }
        let rank = vals
            .iter()
            .filter_map(|v| match v {
                Val::Node(id) => Some(self.shape(*id).len()),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let mut vals = vals.into_iter();
        let mut next = || vals.next().ok_or_else(|| format!("`{op}` is missing an input"));
        let node = |me: &mut Self, v: Val, like: DType| -> R<NodeId> {
            let id = me.operand(v, like, rank, name)?;
            // A known mask built as integers (known values keep no type) where ONNX has a bool.
            if like == DType::Bool && me.b.node(id).dtype == DType::I64 {
                return me.b.cast(id, DType::Bool, &format!("{name}.bool")).map_err(|e| e.msg);
            }
            Ok(id)
        };
        let out = match op {
            "And" | "Or" => {
                let (x, y) = (node(self, next()?, DType::Bool)?, node(self, next()?, DType::Bool)?);
                self.b.binary(cmp.expect("a logical op"), x, y, name)
            }
            "Not" => {
                let x = node(self, next()?, DType::Bool)?;
                self.b.unary(UnaryOp::Not, x, name)
            }
            "Xor" => {
                let (x, y) = (next()?, next()?);
                let Val::Node(ne) = self.bin(BinaryOp::Eq, x, y, &format!("{name}.eq"))? else {
                    unreachable!("a node operand gives a node")
                };
                self.b.unary(UnaryOp::Not, ne, name)
            }
            "Where" => {
                let (c, x, y) = (next()?, next()?, next()?);
                let like = [&x, &y]
                    .iter()
                    .find_map(|v| match v {
                        Val::Node(id) => Some(self.b.node(*id).dtype),
                        _ => None,
                    })
                    .unwrap_or(DType::F32);
                let c = node(self, c, DType::Bool)?;
                let (x, y) = (node(self, x, like)?, node(self, y, like)?);
                self.b.op(Op::Where, &[c, x, y], name)
            }
            "CumSum" => {
                let x = node(self, next()?, DType::F32)?;
                let rank = self.shape(x).len();
                let ax = match self.const_ints(&need(n, 1)?)?.as_slice() {
                    [v] => axis(*v, rank)?,
                    _ => return Err("CumSum's axis must be a scalar".into()),
                };
                let exclusive = a.int("exclusive", 0) != 0;
                if a.int("reverse", 0) != 0 {
                    return self
                        .cumsum_reverse(x, ax, exclusive, name)
                        .map(|id| Some(Val::Node(id)));
                }
                self.b.op(Op::CumSum { axis: ax, exclusive }, &[x], name)
            }
            _ => return self.bin(cmp.expect("a binary op"), next()?, next()?, name).map(Some),
        };
        out.map(|id| Some(Val::Node(id))).map_err(|e| e.msg)
    }

    /// Gather: on a computed tensor, the IR's gather (an embedding lookup, any axis); by known
    /// indices, their slices concatenated; on a known integer tensor (shape arithmetic), folded.
    fn gather(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let data = self.val(&n.input[0])?;
        let idx = self.val(n.input.get(1).ok_or("input 1 is missing")?)?;
        if let Val::Node(d) = data {
            let ax = axis(a.int("axis", 0), self.shape(d).len())?;
            return match idx {
                Val::Node(i) => self
                    .b
                    .op(Op::Gather { axis: ax }, &[d, i], name)
                    .map(Val::Node)
                    .map_err(|e| e.msg),
                Val::Known { shape, ints, float: false, .. } => {
                    let picked = ints
                        .iter()
                        .map(|i| i.as_const().ok_or("symbolic Gather index"))
                        .collect::<Result<Vec<i64>, _>>()?;
                    self.gather_known(d, ax, &shape, &picked, name).map(Val::Node)
                }
                Val::Known { .. } => Err("Gather indices must be integers".into()),
            };
        }
        if let Val::Node(i) = idx {
            // A known table (a position buffer) read by computed indices: built, then gathered.
            let d = self.tensor_of(data, DType::I64, &format!("{name}.table"))?;
            let ax = axis(a.int("axis", 0), self.shape(d).len())?;
            return self
                .b
                .op(Op::Gather { axis: ax }, &[d, i], name)
                .map(Val::Node)
                .map_err(|e| e.msg);
        }
        let Val::Known { shape, ints, float: false, .. } = data else {
            return Err("Gather of a constant float tensor is not supported".into());
        };
        if shape.len() != 1 || a.int("axis", 0) != 0 {
            return Err("Gather on constants is supported on 1-D integer tensors only".into());
        }
        let Val::Known { shape: ishape, ints: is, float: false, .. } = idx else {
            return Err("Gather of a constant by computed indices is not supported".into());
        };
        let picked = is
            .iter()
            .map(|i| {
                let i = i.as_const().ok_or("symbolic Gather index")?;
                let k = if i < 0 { i + shape[0] as i64 } else { i };
                ints.get(usize::try_from(k).map_err(|_| "Gather index out of range")?)
                    .cloned()
                    .ok_or("Gather index out of range")
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Val::Known { shape: ishape, ints: picked, floats: vec![], float: false })
    }

    /// `data` gathered along `axis` by known indices of shape `ishape`: one slice per index,
    /// concatenated, reshaped to `data[..axis] ++ ishape ++ data[axis + 1..]`.
    fn gather_known(
        &mut self,
        data: NodeId,
        axis: usize,
        ishape: &[usize],
        picked: &[i64],
        name: &str,
    ) -> R<NodeId> {
        let s = self.shape(data);
        let size = &s[axis];
        let mut parts = Vec::new();
        for (k, i) in picked.iter().enumerate() {
            // Negative counts from the end (of a dynamic axis too: `S - 1`); a constant extent
            // is checked now, a dynamic one by the slice's bounds when the call binds `S`.
            let start =
                if *i < 0 { size.add(&DimExpr::constant(*i)) } else { DimExpr::constant(*i) };
            if let (Some(e), Some(j)) = (size.as_const(), start.as_const()) {
                if !(0..e).contains(&j) {
                    return Err(format!("Gather index {i} is outside the axis of extent {e}"));
                }
            }
            let end = start.add(&DimExpr::constant(1));
            let op = Op::Slice { axis, start, end };
            parts.push(self.b.op(op, &[data], &format!("{name}.{k}")).map_err(|e| e.msg)?);
        }
        if parts.is_empty() {
            return Err("Gather with no indices".into());
        }
        let cat =
            self.b.op(Op::Concat { axis }, &parts, &format!("{name}.rows")).map_err(|e| e.msg)?;
        let mut to = s[..axis].to_vec();
        to.extend(ishape.iter().map(|d| DimExpr::constant(*d as i64)));
        to.extend(s[axis + 1..].iter().cloned());
        self.b.reshape(cat, to, name).map_err(|e| e.msg)
    }

    /// GatherND: the index tuples (the last axis of the indices, `k` long) linearised over
    /// axes `b .. b + k` of `data` after its `b = batch_dims` leading axes, each batch element's
    /// coordinates added as their own terms, then a gather along axis 0 of `data` viewed as
    /// `[prod(data[..b + k]), data[b + k..]..]`.
    fn gather_nd(&mut self, n: &NodeProto, a: &Attrs, name: &str) -> R<Val> {
        let b = usize::try_from(a.int("batch_dims", 0))
            .map_err(|_| "GatherND with a negative batch_dims".to_string())?;
        let data = self.node_of(&need(n, 0)?)?;
        let s = self.shape(data);
        let idx = self.val(&need(n, 1)?)?;
        let (ishape, k) = match &idx {
            Val::Node(i) => {
                let is = self.shape(*i);
                let k = is
                    .last()
                    .and_then(|d| d.as_const())
                    .ok_or("GatherND's index tuples need a static length")?;
                (is, k as usize)
            }
            Val::Known { shape, .. } => {
                let is: Shape = shape.iter().map(|d| DimExpr::constant(*d as i64)).collect();
                (is, *shape.last().ok_or("GatherND indices of rank 0")?)
            }
        };
        if k == 0 || b + k > s.len() || ishape.len() < b + 1 || ishape[..b] != s[..b] {
            return Err(format!(
                "GatherND index tuples of length {k} with batch_dims {b} on data {} by indices {}",
                shape_str(&s),
                shape_str(&ishape)
            ));
        }
        // Row-major strides of the first b + k axes.
        let used = b + k;
        let mut strides = vec![DimExpr::constant(1); used];
        for j in (0..used - 1).rev() {
            strides[j] = strides[j + 1].mul(&s[j + 1]);
        }
        let mut flat_shape = vec![s[..used].iter().fold(DimExpr::constant(1), |acc, d| acc.mul(d))];
        flat_shape.extend(s[used..].iter().cloned());
        let flat = self.b.reshape(data, flat_shape, &format!("{name}.flat")).map_err(|e| e.msg)?;
        let outer: Vec<DimExpr> = ishape[..ishape.len() - 1].to_vec();
        match idx {
            Val::Node(i) => {
                let dt = self.b.node(i).dtype;
                let mut lin: Option<NodeId> = None;
                // Batch element coordinates: an iota along each batch axis of the indices.
                for j in 0..b {
                    let iota = self.iota(&s[j], dt, &format!("{name}.b{j}"))?;
                    let mut at = vec![DimExpr::constant(1); outer.len()];
                    at[j] = s[j].clone();
                    let coord =
                        self.b.reshape(iota, at, &format!("{name}.bc{j}")).map_err(|e| e.msg)?;
                    let c = self.dim_node(&strides[j], dt, &format!("{name}.bst{j}"))?;
                    let term = self
                        .b
                        .binary(BinaryOp::Mul, coord, c, &format!("{name}.bt{j}"))
                        .map_err(|e| e.msg)?;
                    lin = Some(match lin {
                        None => term,
                        Some(l) => self
                            .b
                            .binary(BinaryOp::Add, l, term, &format!("{name}.bs{j}"))
                            .map_err(|e| e.msg)?,
                    });
                }
                for (j, st) in strides[b..].iter().enumerate() {
                    let op = Op::Slice {
                        axis: ishape.len() - 1,
                        start: DimExpr::constant(j as i64),
                        end: DimExpr::constant(j as i64 + 1),
                    };
                    let col = self.b.op(op, &[i], &format!("{name}.i{j}")).map_err(|e| e.msg)?;
                    let col = self
                        .b
                        .reshape(col, outer.clone(), &format!("{name}.c{j}"))
                        .map_err(|e| e.msg)?;
                    let dt = self.b.node(col).dtype;
                    // A negative component counts from the end of its own axis.
                    let zero = self.b.constant(0.0, dt);
                    let neg = self
                        .b
                        .binary(BinaryOp::Lt, col, zero, &format!("{name}.n{j}"))
                        .map_err(|e| e.msg)?;
                    let ext = self.dim_node(&s[b + j], dt, &format!("{name}.e{j}"))?;
                    let up = self
                        .b
                        .binary(BinaryOp::Add, col, ext, &format!("{name}.u{j}"))
                        .map_err(|e| e.msg)?;
                    let col = self
                        .b
                        .op(Op::Where, &[neg, up, col], &format!("{name}.w{j}"))
                        .map_err(|e| e.msg)?;
                    let c = self.dim_node(st, dt, &format!("{name}.st{j}"))?;
                    let term = self
                        .b
                        .binary(BinaryOp::Mul, col, c, &format!("{name}.t{j}"))
                        .map_err(|e| e.msg)?;
                    lin = Some(match lin {
                        None => term,
                        Some(l) => self
                            .b
                            .binary(BinaryOp::Add, l, term, &format!("{name}.s{j}"))
                            .map_err(|e| e.msg)?,
                    });
                }
                let lin = lin.expect("k >= 1");
                self.b
                    .op(Op::Gather { axis: 0 }, &[flat, lin], name)
                    .map(Val::Node)
                    .map_err(|e| e.msg)
            }
            Val::Known { .. } if b > 0 => {
                Err("GatherND with batch_dims > 0 by constant indices is not supported".into())
            }
            Val::Known { shape, ints, .. } => {
                let mut picked = Vec::new();
                for tuple in ints.chunks(k) {
                    let mut l = 0i64;
                    for (j, v) in tuple.iter().enumerate() {
                        let v = v.as_const().ok_or("symbolic GatherND index")?;
                        let e = s[j].as_const().ok_or("GatherND over dynamic axes")?;
                        let v = if v < 0 { v + e } else { v };
                        l += v * strides[j].as_const().ok_or("GatherND over dynamic axes")?;
                    }
                    picked.push(l);
                }
                let outer: Vec<usize> = shape[..shape.len() - 1].to_vec();
                self.gather_known(flat, 0, &outer, &picked, name).map(Val::Node)
            }
        }
    }

    /// Slice with constant axes and steps, and starts and ends that are constants or dims
    /// (`position_ids[:, :S]`: a dynamic end is checked against the axis when a call binds it);
    /// a step other than 1 takes the elements by index, on an axis of known extent.
    fn slice(&mut self, n: &NodeProto, name: &str) -> R<Val> {
        let starts = self.ints_of(n.input.get(1).ok_or("starts are missing")?)?;
        let ends = self.ints_of(n.input.get(2).ok_or("ends are missing")?)?;
        let mut x = self.val(&n.input[0])?;
        let rank = match &x {
            Val::Node(id) => self.shape(*id).len(),
            Val::Known { shape, .. } => shape.len(),
        };
        let axes: Vec<usize> = match n.input.get(3).filter(|s| !s.is_empty()) {
            Some(ax) => {
                self.const_ints(&ax.clone())?.iter().map(|v| axis(*v, rank)).collect::<R<_>>()?
            }
            None => (0..starts.len()).collect(),
        };
        let steps: Vec<i64> = match n.input.get(4).filter(|s| !s.is_empty()) {
            Some(st) => self.const_ints(&st.clone())?,
            None => vec![1; axes.len()],
        };
        if steps.len() != axes.len() || starts.len() != axes.len() || ends.len() != axes.len() {
            return Err("Slice's starts, ends, axes and steps differ in length".into());
        }
        if steps.contains(&0) {
            return Err("Slice with a step of 0".into());
        }
        let constant = starts.iter().chain(&ends).all(|d| d.as_const().is_some());
        if let Val::Known { shape, ints, float: false, .. } = &x {
            if shape.len() == 1 && constant {
                let c = |v: &DimExpr| v.as_const().expect("constant bounds");
                let picked = stepped(c(&starts[0]), c(&ends[0]), steps[0], shape[0] as i64);
                let ints: Vec<DimExpr> = picked.iter().map(|i| ints[*i as usize].clone()).collect();
                return Ok(Val::Known {
                    shape: vec![ints.len()],
                    ints,
                    floats: vec![],
                    float: false,
                });
            }
        }
        if matches!(x, Val::Known { float: false, .. }) {
            // A known table sliced to a dynamic length: built as a tensor, then sliced.
            x = Val::Node(self.tensor_of(x, DType::I64, &format!("{name}.table"))?);
        }
        match x {
            Val::Node(mut id) => {
                for (k, ax) in axes.iter().enumerate() {
                    let dim = self.shape(id)[*ax].clone();
                    let bound = |v: &DimExpr| -> R<DimExpr> {
                        let Some(v) = v.as_const() else {
                            return Ok(v.clone()); // a dim: within the axis, checked at bind
                        };
                        if v >= 0 {
                            match dim.as_const() {
                                Some(d) => Ok(DimExpr::constant(v.min(d))),
                                None if v >= i32::MAX as i64 => Ok(dim.clone()),
                                None => Ok(DimExpr::constant(v)),
                            }
                        } else {
                            Ok(dim.add(&DimExpr::constant(v)))
                        }
                    };
                    let nm =
                        if k + 1 == axes.len() { name.to_string() } else { format!("{name}.{ax}") };
                    if steps[k] != 1 {
                        // Every step-th element (backwards for a negative step): the elements
                        // by index, on an axis of known extent.
                        let (Some(d), Some(s), Some(e)) =
                            (dim.as_const(), starts[k].as_const(), ends[k].as_const())
                        else {
                            return Err(format!(
                                "Slice with step {} of the dynamic axis {ax} ({dim})",
                                steps[k]
                            ));
                        };
                        let picked = stepped(s, e, steps[k], d);
                        id = self.gather_known(id, *ax, &[picked.len()], &picked, &nm)?;
                        continue;
                    }
                    let (s, e) = (bound(&starts[k])?, bound(&ends[k])?);
                    id = self
                        .b
                        .op(Op::Slice { axis: *ax, start: s, end: e }, &[id], &nm)
                        .map_err(|e| e.msg)?;
                }
                Ok(Val::Node(id))
            }
            _ => Err("Slice of a float constant".into()),
        }
    }
}

/// The indices ONNX's Slice takes from an axis of extent `dim`: from `start` towards `end`
/// (exclusive) by `step`, negative bounds counting from the end, clamped as the operator says
/// (to `[0, dim]` going forwards, `[-1, dim - 1]` going backwards).
fn stepped(start: i64, end: i64, step: i64, dim: i64) -> Vec<i64> {
    let adj = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (lo, hi) = if step > 0 { (0, dim) } else { (-1, dim - 1) };
    let (mut i, e) = (adj(start).clamp(lo, hi), adj(end).clamp(lo, hi));
    let mut out = Vec::new();
    while (step > 0 && i < e) || (step < 0 && i > e) {
        out.push(i);
        i += step;
    }
    out
}

/// Binary arithmetic on two known values (shape arithmetic), elementwise with numpy
/// broadcasting.
fn fold_binary(op: BinaryOp, a: &Val, b: &Val) -> R<Val> {
    let (Val::Known { shape: sa, float: xa, .. }, Val::Known { shape: sb, float: xb, .. }) = (a, b)
    else {
        unreachable!()
    };
    if xa != xb {
        return Err("arithmetic between a float and an integer constant".into());
    }
    let out = fold::broadcast(&[sa, sb])?;
    let (a, b) = (fold::expand_to(a, &out)?, fold::expand_to(b, &out)?);
    let (Val::Known { ints: ia, floats: fa, .. }, Val::Known { ints: ib, floats: fb, .. }) =
        (&a, &b)
    else {
        unreachable!()
    };
    if *xa {
        let floats = fa.iter().zip(fb).map(|(x, y)| op.eval(*x, *y)).collect();
        return Ok(Val::Known { shape: out, ints: vec![], floats, float: true });
    }
    let ints = ia
        .iter()
        .zip(ib)
        .map(|(x, y)| match op {
            BinaryOp::Add => Ok(x.add(y)),
            BinaryOp::Sub => Ok(x.sub(y)),
            BinaryOp::Mul => Ok(x.mul(y)),
            BinaryOp::Div => match (x.as_const(), y.as_const()) {
                (Some(p), Some(q)) if q != 0 => Ok(DimExpr::constant(p.div_euclid(q))),
                (Some(_), Some(_)) => Err("integer division by zero in shape arithmetic".into()),
                _ => x.div(y).ok_or_else(|| format!("{x} / {y} is not exact")),
            },
            _ => match (x.as_const(), y.as_const()) {
                (Some(p), Some(q)) => Ok(DimExpr::constant(op.eval(p as f64, q as f64) as i64)),
                _ => Err(format!("`{}` of symbolic dims", op.name())),
            },
        })
        .collect::<R<_>>()?;
    Ok(Val::Known { shape: out, ints, floats: vec![], float: false })
}

/// The shape a Reshape produces: 0 copies the input's dim (unless `allowzero`), -1 is what is
/// left of the element count.
fn reshape_target(input: &Shape, spec: &[DimExpr], allowzero: bool) -> R<Shape> {
    let mut out: Vec<Option<DimExpr>> = Vec::new();
    for (i, d) in spec.iter().enumerate() {
        match d.as_const() {
            Some(0) if !allowzero => out.push(Some(
                input.get(i).cloned().ok_or(format!("0 at axis {i} copies no input dim"))?,
            )),
            Some(-1) => out.push(None),
            Some(v) if v < 0 => return Err(format!("reshape dim {v}")),
            _ => out.push(Some(d.clone())),
        }
    }
    if out.iter().filter(|d| d.is_none()).count() > 1 {
        return Err("more than one -1 in the shape".into());
    }
    let known: Shape = out.iter().flatten().cloned().collect();
    let rest = if out.iter().any(|d| d.is_none()) {
        Some(remaining(input, &known).ok_or_else(|| {
            format!(
                "cannot infer -1: {} is not a multiple of {}",
                shape_str(input),
                shape_str(&known)
            )
        })?)
    } else {
        None
    };
    Ok(out.into_iter().map(|d| d.unwrap_or_else(|| rest.clone().unwrap())).collect())
}

/// numel(input) / numel(known), cancelling equal factors first so symbolic dims divide out.
fn remaining(input: &Shape, known: &Shape) -> Option<DimExpr> {
    let mut left: Vec<DimExpr> = input.to_vec();
    let mut rest: Vec<DimExpr> = Vec::new();
    for k in known {
        if let Some(p) = left.iter().position(|d| d == k) {
            left.remove(p);
        } else {
            rest.push(k.clone());
        }
    }
    numel(&left).div(&numel(&rest))
}

/// What the importer takes, for the error on anything else.
const SUPPORTED: &str = "MatMul, Gemm, Add, Sub, Mul, Div, Pow, Max, Min, Neg, Exp, Log, Sqrt, \
    Reciprocal, Tanh, Sigmoid, Relu, Erf, Sin, Cos, Gelu, Softmax, LayerNormalization, \
    ReduceMean/Sum/Max, Cast, Identity, Dropout, Transpose, Reshape, Flatten, Squeeze, \
    Unsqueeze, Concat, Slice, Split, Gather, GatherND, Equal, Less(OrEqual), Greater(OrEqual), \
    Not, And, Or, Xor, Where, CumSum, Expand, Shape, Size, Constant, ConstantOfShape, Range";

/// Input `i` of node `n`, when it is given (ONNX leaves optional inputs empty).
fn input(n: &NodeProto, i: usize) -> Option<String> {
    n.input.get(i).filter(|s| !s.is_empty()).cloned()
}

/// Input `i` of node `n`, which the op needs.
fn need(n: &NodeProto, i: usize) -> R<String> {
    input(n, i).ok_or_else(|| format!("input {i} is missing"))
}

/// The binary elementwise function of an ONNX op type.
fn binary_op(op: &str) -> Option<BinaryOp> {
    Some(match op {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Pow" => BinaryOp::Pow,
        "Max" => BinaryOp::Max,
        "Min" => BinaryOp::Min,
        _ => return None,
    })
}

/// The unary elementwise function of an ONNX op type.
fn unary_op(op: &str) -> Option<UnaryOp> {
    Some(match op {
        "Neg" => UnaryOp::Neg,
        "Exp" => UnaryOp::Exp,
        "Log" => UnaryOp::Log,
        "Sqrt" => UnaryOp::Sqrt,
        "Tanh" => UnaryOp::Tanh,
        "Sigmoid" => UnaryOp::Sigmoid,
        "Relu" => UnaryOp::Relu,
        "Erf" => UnaryOp::Erf,
        "Sin" => UnaryOp::Sin,
        "Cos" => UnaryOp::Cos,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::{flatten_axis, stepped};

    #[test]
    fn slice_steps_clamp_as_onnx_says() {
        assert_eq!(stepped(0, 8, 2, 8), [0, 2, 4, 6]);
        assert_eq!(stepped(1, i64::MAX, 2, 8), [1, 3, 5, 7]);
        // Backwards from the end to the start, the sentinels of "everything".
        assert_eq!(stepped(-1, i64::MIN, -1, 4), [3, 2, 1, 0]);
        assert_eq!(stepped(20, 0, -3, 8), [7, 4, 1]);
        assert!(stepped(5, 2, 1, 8).is_empty());
    }

    #[test]
    fn flatten_axes_count_negative_ones_from_the_rank() {
        assert_eq!(flatten_axis(-1, 4), Ok(3));
        assert_eq!(flatten_axis(-4, 4), Ok(0));
        assert_eq!(flatten_axis(4, 4), Ok(4));
        assert!(flatten_axis(5, 4).is_err() && flatten_axis(-5, 4).is_err());
    }
}
