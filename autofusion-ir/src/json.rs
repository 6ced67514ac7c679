//! The JSON a generated module embeds about itself, written by the compiler and read by the
//! runtime. The conversions are written out here (a `Json` trait over `serde_json::Value`)
//! rather than derived, so that this crate, and every binary that runs fused layers, depends
//! on no derive macro and so on no Rust parser.
//!
//! Non-finite floats (a `-inf` constant) are written as the strings `"inf"`, `"-inf"` and
//! `"nan"`, which plain JSON numbers cannot hold.

use crate::abi::{KernelMeta, PackMeta, Work};
use crate::dim::{DimExpr, Monomial, Ratio};
use crate::ir::{BinaryOp, DType, Graph, Node, NodeId, Op, OpKind, ReduceKind, UnaryOp};
use crate::meta::{AscendKernel, AscendMeta, ModuleMeta};
use serde_json::{json, Map, Value};

/// A value that converts to and from JSON.
pub trait Json: Sized {
    fn to_json(&self) -> Value;
    /// The value `v` describes, or what is wrong with it.
    fn from_json(v: &Value) -> Result<Self, String>;
}

/// Parse `text` as a `T`.
pub fn parse<T: Json>(text: &[u8]) -> Result<T, String> {
    let v: Value = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    T::from_json(&v)
}

/// `t` as compact JSON text.
pub fn write<T: Json>(t: &T) -> String {
    t.to_json().to_string()
}

fn bad(what: &str, v: &Value) -> String {
    let mut shown = v.to_string();
    if shown.len() > 60 {
        shown.truncate(57);
        shown += "...";
    }
    format!("expected {what}, found {shown}")
}

/// Field `key` of object `v`; a missing field reads as `null` (so `Option` and defaults work).
fn field<'a>(v: &'a Value, key: &str) -> Result<&'a Value, String> {
    match v {
        Value::Object(m) => Ok(m.get(key).unwrap_or(&Value::Null)),
        _ => Err(bad("an object", v)),
    }
}

/// Field `key` of object `v` as a `T`, the error naming the field.
fn get<T: Json>(v: &Value, key: &str) -> Result<T, String> {
    T::from_json(field(v, key)?).map_err(|e| format!("{key}: {e}"))
}

fn tag(v: &Value) -> Result<&str, String> {
    field(v, "kind")?.as_str().ok_or_else(|| bad("a `kind` string", v))
}

impl Json for String {
    fn to_json(&self) -> Value {
        Value::String(self.clone())
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        v.as_str().map(str::to_string).ok_or_else(|| bad("a string", v))
    }
}

impl Json for bool {
    fn to_json(&self) -> Value {
        Value::Bool(*self)
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        v.as_bool().ok_or_else(|| bad("a boolean", v))
    }
}

macro_rules! json_int {
    ($($t:ty),*) => {$(
        impl Json for $t {
            fn to_json(&self) -> Value {
                json!(*self)
            }
            fn from_json(v: &Value) -> Result<Self, String> {
                v.as_i64()
                    .and_then(|i| <$t>::try_from(i).ok())
                    .ok_or_else(|| bad(concat!("an integer fitting ", stringify!($t)), v))
            }
        }
    )*};
}
json_int!(i64, u64, u32, usize);

impl Json for f64 {
    fn to_json(&self) -> Value {
        match self {
            x if x.is_finite() => json!(x),
            x if x.is_nan() => json!("nan"),
            x if *x > 0.0 => json!("inf"),
            _ => json!("-inf"),
        }
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            Value::Number(n) => n.as_f64().ok_or_else(|| bad("a number", v)),
            Value::String(s) if s == "inf" => Ok(f64::INFINITY),
            Value::String(s) if s == "-inf" => Ok(f64::NEG_INFINITY),
            Value::String(s) if s == "nan" => Ok(f64::NAN),
            _ => Err(bad("a number", v)),
        }
    }
}

impl<T: Json> Json for Vec<T> {
    fn to_json(&self) -> Value {
        Value::Array(self.iter().map(Json::to_json).collect())
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            // A missing list is empty (fields added after a format was first written).
            Value::Null => Ok(Vec::new()),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .map(|(i, x)| T::from_json(x).map_err(|e| format!("[{i}]: {e}")))
                .collect(),
            _ => Err(bad("an array", v)),
        }
    }
}

fn items<const N: usize>(v: &Value) -> Result<&[Value], String> {
    match v.as_array() {
        Some(a) if a.len() == N => Ok(a),
        _ => Err(bad(&format!("an array of {N}"), v)),
    }
}

impl<A: Json, B: Json> Json for (A, B) {
    fn to_json(&self) -> Value {
        json!([self.0.to_json(), self.1.to_json()])
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let a = items::<2>(v)?;
        Ok((A::from_json(&a[0])?, B::from_json(&a[1])?))
    }
}

impl<A: Json, B: Json, C: Json, D: Json> Json for (A, B, C, D) {
    fn to_json(&self) -> Value {
        json!([self.0.to_json(), self.1.to_json(), self.2.to_json(), self.3.to_json()])
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let a = items::<4>(v)?;
        Ok((A::from_json(&a[0])?, B::from_json(&a[1])?, C::from_json(&a[2])?, D::from_json(&a[3])?))
    }
}

/// `Json` for a struct with named fields, each written under its own name.
macro_rules! json_struct {
    ($t:ident { $($f:ident),* $(,)? }) => {
        impl Json for $t {
            fn to_json(&self) -> Value {
                let mut m = Map::new();
                $(m.insert(stringify!($f).to_string(), self.$f.to_json());)*
                Value::Object(m)
            }
            fn from_json(v: &Value) -> Result<Self, String> {
                Ok($t { $($f: get(v, stringify!($f))?,)* })
            }
        }
    };
}

/// `Json` for a field-less enum written as its `name()`, read back through `ALL`.
macro_rules! json_named {
    ($($t:ident),*) => {$(
        impl Json for $t {
            fn to_json(&self) -> Value {
                json!(self.name())
            }
            fn from_json(v: &Value) -> Result<Self, String> {
                let s = v.as_str().ok_or_else(|| bad("a name", v))?;
                $t::ALL.iter().copied().find(|x| x.name() == s).ok_or_else(|| {
                    format!(concat!("unknown ", stringify!($t), " `{}`"), s)
                })
            }
        }
    )*};
}
json_named!(DType, UnaryOp, BinaryOp, ReduceKind);

impl Json for NodeId {
    fn to_json(&self) -> Value {
        json!(self.0)
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        u32::from_json(v).map(NodeId)
    }
}

impl Json for Ratio {
    fn to_json(&self) -> Value {
        json!([self.num, self.den])
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let (num, den) = <(i64, i64)>::from_json(v)?;
        if den == 0 {
            return Err("a ratio with denominator 0".into());
        }
        Ok(Ratio::new(num, den))
    }
}

/// A dim expression as its terms: `[[[["S", 1]], [2, 1]], [[], [1, 1]]]` is `2 * S + 1`.
impl Json for DimExpr {
    fn to_json(&self) -> Value {
        Vec::<(Monomial, Ratio)>::from(self.clone())
            .iter()
            .map(|(m, r)| {
                json!([m.iter().map(|(s, e)| json!([s, e])).collect::<Vec<_>>(), r.to_json()])
            })
            .collect()
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let terms: Vec<(Vec<(String, u32)>, Ratio)> = Vec::from_json(v)?;
        Ok(DimExpr::from(terms))
    }
}

impl Json for Op {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("kind".into(), json!(self.kind().name()));
        let mut put = |k: &str, v: Value| m.insert(k.into(), v);
        match self {
            Op::Param { index } => put("index", json!(index)),
            Op::Const { value } => put("value", value.to_json()),
            Op::Unary(u) => put("fn", u.to_json()),
            Op::Binary(b) => put("fn", b.to_json()),
            Op::Reduce { kind: r, axis } => {
                put("fn", r.to_json());
                put("axis", json!(axis))
            }
            Op::Transpose { perm } => put("perm", json!(perm)),
            Op::Expand { shape } => put("shape", shape.to_json()),
            Op::CumSum { axis, exclusive } => {
                put("axis", json!(axis));
                put("exclusive", json!(exclusive))
            }
            Op::Slice { axis, start, end } => {
                put("axis", json!(axis));
                put("start", start.to_json());
                put("end", end.to_json())
            }
            Op::Concat { axis } | Op::Softmax { axis } | Op::Gather { axis } => {
                put("axis", json!(axis))
            }
            Op::CacheWrite { axis, start } => {
                put("axis", json!(axis));
                put("start", start.to_json())
            }
            Op::LayerNorm { eps } | Op::RmsNorm { eps } => put("eps", eps.to_json()),
            Op::Attention { scale, causal, mask } => {
                put("scale", scale.to_json());
                put("causal", json!(causal));
                put("mask", json!(mask))
            }
            Op::Cast
            | Op::MatMul
            | Op::Reshape
            | Op::Copy
            | Op::CausalMask
            | Op::Where
            | Op::Linear
            | Op::Rope
            | Op::RotateHalf => None,
        };
        Value::Object(m)
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        let tag = tag(v)?;
        let kind = OpKind::parse(tag).ok_or_else(|| format!("unknown op `{tag}`"))?;
        Ok(match kind {
            OpKind::Param => Op::Param { index: get(v, "index")? },
            OpKind::Const => Op::Const { value: get(v, "value")? },
            OpKind::Unary => Op::Unary(get(v, "fn")?),
            OpKind::Binary => Op::Binary(get(v, "fn")?),
            OpKind::Reduce => Op::Reduce { kind: get(v, "fn")?, axis: get(v, "axis")? },
            OpKind::Transpose => Op::Transpose { perm: get(v, "perm")? },
            OpKind::Slice => {
                Op::Slice { axis: get(v, "axis")?, start: get(v, "start")?, end: get(v, "end")? }
            }
            OpKind::Concat => Op::Concat { axis: get(v, "axis")? },
            OpKind::Gather => Op::Gather { axis: get(v, "axis")? },
            OpKind::Expand => Op::Expand { shape: get(v, "shape")? },
            OpKind::CacheWrite => Op::CacheWrite { axis: get(v, "axis")?, start: get(v, "start")? },
            OpKind::Softmax => Op::Softmax { axis: get(v, "axis")? },
            OpKind::LayerNorm => Op::LayerNorm { eps: get(v, "eps")? },
            OpKind::RmsNorm => Op::RmsNorm { eps: get(v, "eps")? },
            OpKind::Attention => Op::Attention {
                scale: get(v, "scale")?,
                causal: get(v, "causal")?,
                mask: get(v, "mask")?,
            },
            OpKind::Cast => Op::Cast,
            OpKind::MatMul => Op::MatMul,
            OpKind::Reshape => Op::Reshape,
            OpKind::Copy => Op::Copy,
            OpKind::CausalMask => Op::CausalMask,
            OpKind::Where => Op::Where,
            OpKind::CumSum => Op::CumSum { axis: get(v, "axis")?, exclusive: get(v, "exclusive")? },
            OpKind::Linear => Op::Linear,
            OpKind::Rope => Op::Rope,
            OpKind::RotateHalf => Op::RotateHalf,
        })
    }
}

impl Json for Work {
    fn to_json(&self) -> Value {
        match self {
            Work::Rows { rows, n, row_buffers } => json!({
                "kind": "rows", "rows": rows.to_json(), "n": n.to_json(), "row_buffers": row_buffers
            }),
            Work::MatMul { batch, m, n, k, products, nc_step } => json!({
                "kind": "matmul", "batch": batch.to_json(), "m": m.to_json(), "n": n.to_json(),
                "k": k.to_json(), "products": products, "nc_step": nc_step.to_json()
            }),
            Work::Flash { batch, sq, sk, d, dv, group } => json!({
                "kind": "flash", "batch": batch.to_json(), "sq": sq.to_json(), "sk": sk.to_json(),
                "d": d.to_json(), "dv": dv.to_json(), "group": group.to_json()
            }),
            Work::Horizontal { parts, nc_step } => json!({
                "kind": "horizontal", "parts": parts.to_json(), "nc_step": nc_step.to_json()
            }),
        }
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        Ok(match tag(v)? {
            "rows" => Work::Rows {
                rows: get(v, "rows")?,
                n: get(v, "n")?,
                row_buffers: get(v, "row_buffers")?,
            },
            "matmul" => Work::MatMul {
                batch: get(v, "batch")?,
                m: get(v, "m")?,
                n: get(v, "n")?,
                k: get(v, "k")?,
                products: get(v, "products")?,
                nc_step: get(v, "nc_step")?,
            },
            "flash" => Work::Flash {
                batch: get(v, "batch")?,
                sq: get(v, "sq")?,
                sk: get(v, "sk")?,
                d: get(v, "d")?,
                dv: get(v, "dv")?,
                group: get(v, "group")?,
            },
            "horizontal" => {
                Work::Horizontal { parts: get(v, "parts")?, nc_step: get(v, "nc_step")? }
            }
            other => return Err(format!("unknown work `{other}`")),
        })
    }
}

json_struct!(Node { op, inputs, dtype, shape, name, line });
// `state` is written only when there is one, so stateless graphs keep their metadata as it was.
impl Json for Graph {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), self.name.to_json());
        m.insert("params".into(), self.params.to_json());
        m.insert("nodes".into(), self.nodes.to_json());
        m.insert("outputs".into(), self.outputs.to_json());
        m.insert("dyn_dims".into(), self.dyn_dims.to_json());
        m.insert("static_dims".into(), self.static_dims.to_json());
        if !self.state.is_empty() {
            m.insert("state".into(), self.state.to_json());
        }
        Value::Object(m)
    }
    fn from_json(v: &Value) -> Result<Self, String> {
        Ok(Graph {
            name: get(v, "name")?,
            params: get(v, "params")?,
            nodes: get(v, "nodes")?,
            outputs: get(v, "outputs")?,
            dyn_dims: get(v, "dyn_dims")?,
            static_dims: get(v, "static_dims")?,
            state: if v.get("state").is_some() { get(v, "state")? } else { Vec::new() },
        })
    }
}
json_struct!(PackMeta { func, param, dtype, batch, k, n, batch_dims, offset, strides });
json_struct!(KernelMeta { name, buffers, n_inputs, work, ops, packs });
json_struct!(ModuleMeta { abi, hash, variant, graph, kernels, summary, pipeline });
json_struct!(AscendKernel {
    name,
    buffers,
    n_inputs,
    work,
    ops,
    mix,
    ub_per_col,
    ub_fixed,
    cube,
    stage_a,
    stage_b,
    cube_bytes
});
json_struct!(AscendMeta { kernels, buffers, pipeline });

#[cfg(test)]
mod tests {
    use super::*;

    fn s() -> DimExpr {
        DimExpr::sym("S")
    }

    fn graph() -> Graph {
        let node = |op: Op, inputs: Vec<NodeId>, shape: Vec<DimExpr>| Node {
            op,
            inputs,
            dtype: DType::BF16,
            shape,
            name: "n".into(),
            line: 3,
        };
        let half = s().div_const(2).unwrap();
        Graph {
            name: "g".into(),
            params: vec!["x".into()],
            nodes: vec![
                node(Op::Param { index: 0 }, vec![], vec![s(), 8.into()]),
                node(Op::Const { value: f64::NEG_INFINITY }, vec![], vec![]),
                node(Op::Binary(BinaryOp::Max), vec![NodeId(0), NodeId(1)], vec![s(), 8.into()]),
                node(
                    Op::Slice { axis: 0, start: 0.into(), end: half.clone() },
                    vec![NodeId(2)],
                    vec![half.clone(), 8.into()],
                ),
                node(
                    Op::Attention { scale: 0.125, causal: true, mask: false },
                    vec![NodeId(3), NodeId(3), NodeId(3)],
                    vec![half.add(&1.into()), 8.into()],
                ),
            ],
            outputs: vec![NodeId(4)],
            dyn_dims: vec!["S".into()],
            static_dims: vec![("D".into(), 8)],
            state: Vec::new(),
        }
    }

    #[test]
    fn module_metadata_round_trips() {
        let meta = ModuleMeta {
            abi: 3,
            hash: "00ff".into(),
            variant: "fused".into(),
            graph: graph(),
            kernels: vec![KernelMeta {
                name: "k0_y".into(),
                buffers: vec![NodeId(0), NodeId(4)],
                n_inputs: 1,
                work: Work::Horizontal {
                    parts: vec![(1.into(), s(), 8.into(), 8.into())],
                    nc_step: 8.into(),
                },
                ops: "max".into(),
                packs: vec![PackMeta {
                    func: "k0_y_pack0".into(),
                    param: NodeId(0),
                    dtype: DType::BF16,
                    batch: 1.into(),
                    k: 8.into(),
                    n: s(),
                    batch_dims: vec![],
                    offset: s(),
                    strides: vec![1.into(), 8.into()],
                }],
            }],
            summary: vec!["[INFO] line".into()],
            pipeline: true,
        };
        let back: ModuleMeta = parse(write(&meta).as_bytes()).unwrap();
        // Compared as dumps: the graph holds -inf, and NaN-free equality is what matters.
        assert_eq!(back.graph.dump(), meta.graph.dump());
        assert_eq!(back.kernels, meta.kernels);
        assert_eq!((back.abi, back.pipeline, &back.summary), (3, true, &meta.summary));
        assert!(
            matches!(back.graph.nodes[1].op, Op::Const { value } if value == f64::NEG_INFINITY)
        );
    }

    #[test]
    fn bad_metadata_is_an_error_naming_the_field() {
        let mut v = graph().to_json();
        v["nodes"][2]["op"]["fn"] = json!("frobnicate");
        let e = Graph::from_json(&v).unwrap_err();
        assert!(e.contains("nodes: [2]: op: fn: unknown BinaryOp `frobnicate`"), "{e}");
        let e = parse::<AscendMeta>(b"{\"kernels\": 3}").unwrap_err();
        assert!(e.contains("kernels: expected an array"), "{e}");
        assert!(parse::<ModuleMeta>(b"not json").is_err());
    }
}
