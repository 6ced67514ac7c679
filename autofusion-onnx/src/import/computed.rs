//! Values the importer knows symbolically but a kernel must compute: the run-time value of a
//! dynamic dim, a `Range` of dynamic length, a known integer tensor (a fill or an `arange`)
//! where an op reads a tensor, and `CumSum` in reverse. Exporters write these around the
//! attention mask (`arange(B)`, `arange(S)`, index tuples for `GatherND`, `position_ids[:, :S]`).
//! Everything is built from IR ops that exist anyway: `Expand` of a constant 1 to the length,
//! its running sum (0, 1, 2, ...), and slices of it.

use super::{Importer, Val, R};
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{BinaryOp, DType, NodeId, Op};

impl Importer<'_> {
    /// The running sum of `len` ones of `dtype` along a `[len]` tensor: `0, 1, .., len - 1`
    /// when `exclusive`, `1, 2, .., len` when not.
    fn count(&mut self, len: &DimExpr, dtype: DType, exclusive: bool, name: &str) -> R<NodeId> {
        let e = |e: autofusion_compiler::BuildError| e.msg;
        let one = self.b.constant(1.0, dtype);
        let ones = self
            .b
            .op(Op::Expand { shape: vec![len.clone()] }, &[one], &format!("{name}.ones"))
            .map_err(e)?;
        self.b.op(Op::CumSum { axis: 0, exclusive }, &[ones], &format!("{name}.count")).map_err(e)
    }

    /// `0, 1, .., len - 1` as a `[len]` tensor of `dtype` (an integer or float type).
    pub(super) fn iota(&mut self, len: &DimExpr, dtype: DType, name: &str) -> R<NodeId> {
        self.count(len, dtype, true, name)
    }

    /// The value of dim `d` as a scalar of `dtype`: a constant when `d` is, else computed at
    /// run time as the last element of `1, 2, .., d` (for strides and extents of dynamic axes),
    /// once per dim and type.
    pub(super) fn dim_node(&mut self, d: &DimExpr, dtype: DType, name: &str) -> R<NodeId> {
        if let Some(v) = d.as_const() {
            return Ok(self.b.constant(v as f64, dtype));
        }
        if let Some(id) = self.dim_values.get(&(d.clone(), dtype)) {
            return Ok(*id);
        }
        let e = |e: autofusion_compiler::BuildError| e.msg;
        let count = self.count(d, dtype, false, name)?;
        let last = d.sub(&DimExpr::constant(1));
        let v = self
            .b
            .op(
                Op::Slice { axis: 0, start: last, end: d.clone() },
                &[count],
                &format!("{name}.last"),
            )
            .map_err(e)?;
        let id = self.b.reshape(v, vec![], name).map_err(e)?;
        self.dim_values.insert((d.clone(), dtype), id);
        Ok(id)
    }

    /// ONNX `Range(start, limit, delta)` whose length depends on a dynamic dim: `start + delta *
    /// (0, 1, ..)` with `|limit - start|` elements, for a delta of 1 or -1 (what exporters write
    /// for positions and batch indices). Integer bounds give `i64` values.
    pub(super) fn dynamic_range(&mut self, v: &[Val], name: &str) -> R<Val> {
        let bound = |x: &Val, what: &str| -> R<DimExpr> {
            match x {
                Val::Known { ints, float: false, .. } if ints.len() == 1 => Ok(ints[0].clone()),
                _ => Err(format!(
                    "Range of dynamic length needs integer scalar bounds known at import; its \
                     {what} is not"
                )),
            }
        };
        let (start, limit, delta) =
            (bound(&v[0], "start")?, bound(&v[1], "limit")?, bound(&v[2], "delta")?);
        let len = match delta.as_const() {
            Some(1) => limit.sub(&start),
            Some(-1) => start.sub(&limit),
            _ => {
                return Err(format!(
                    "Range({start}, {limit}, {delta}) of dynamic length with a step other than 1 \
                     or -1"
                ))
            }
        };
        let dt = DType::I64;
        let iota = self.iota(&len, dt, name)?;
        let e = |e: autofusion_compiler::BuildError| e.msg;
        let stepped = if delta.as_const() == Some(-1) {
            self.b
                .unary(autofusion_compiler::ir::UnaryOp::Neg, iota, &format!("{name}.down"))
                .map_err(e)?
        } else {
            iota
        };
        if start.as_const() == Some(0) {
            return Ok(Val::Node(stepped));
        }
        let s = self.dim_node(&start, dt, &format!("{name}.start"))?;
        Ok(Val::Node(self.b.binary(BinaryOp::Add, stepped, s, name).map_err(e)?))
    }

    /// A value as a tensor the IR computes: a computed one as it is; a known one (an integer
    /// fill, a progression along its last axis the same in every row such as `arange`, or one
    /// element) built from a constant. `like` is the storage type for known integers (the
    /// type of what they meet; ONNX's known values do not keep theirs).
    pub(super) fn tensor_of(&mut self, v: Val, like: DType, name: &str) -> R<NodeId> {
        let (shape, ints, floats, float) = match v {
            Val::Node(id) => return Ok(id),
            Val::Known { shape, ints, floats, float } => (shape, ints, floats, float),
        };
        let e = |e: autofusion_compiler::BuildError| e.msg;
        let dims: Vec<DimExpr> = shape.iter().map(|d| DimExpr::constant(*d as i64)).collect();
        if float {
            let [x] = floats.as_slice() else {
                return Err(
                    "a constant float tensor of several elements where a tensor is computed".into(),
                );
            };
            let dt = if like.is_float() { like } else { DType::F32 };
            let c = self.b.constant(*x, dt);
            return if dims.is_empty() { Ok(c) } else { self.b.reshape(c, dims, name).map_err(e) };
        }
        let vals: Vec<i64> = ints
            .iter()
            .map(|d| {
                d.as_const()
                    .ok_or_else(|| format!("the symbolic value {d} where a tensor is computed"))
            })
            .collect::<R<_>>()?;
        let m = shape.last().copied().unwrap_or(1).max(1);
        let (start, step) = match vals.as_slice() {
            [] => return Err("an empty constant where a tensor is computed".into()),
            [a] => (*a, Some(0)),
            [a, b, ..] if m > 1 => (*a, b.checked_sub(*a)),
            [a, ..] => (*a, Some(0)),
        };
        // Checked: a file's values may be anything (i64::MIN sentinels).
        let at = |i: usize| step?.checked_mul((i % m) as i64)?.checked_add(start);
        let progression = vals.iter().enumerate().all(|(i, v)| at(i) == Some(*v));
        let step = step.filter(|_| progression);
        let Some(step) = step else {
            return Err(format!(
                "a constant integer tensor of shape {shape:?} where a tensor is computed: only \
                 fills and progressions along the last axis (arange) are built at run time"
            ));
        };
        // Progressions are computed in i64 and cast (bool masks are fills).
        let dt = if like == DType::Bool && step == 0 {
            DType::Bool
        } else if like.is_float() {
            like
        } else {
            DType::I64
        };
        let row = if step == 0 {
            self.b.constant(start as f64, dt)
        } else {
            let iota = self.iota(&DimExpr::constant(m as i64), dt, name)?;
            let k = self.b.constant(step as f64, dt);
            let scaled =
                self.b.binary(BinaryOp::Mul, iota, k, &format!("{name}.step")).map_err(e)?;
            let s = self.b.constant(start as f64, dt);
            self.b.binary(BinaryOp::Add, scaled, s, &format!("{name}.start")).map_err(e)?
        };
        let full = if dims.is_empty() {
            row
        } else {
            self.b.op(Op::Expand { shape: dims }, &[row], &format!("{name}.fill")).map_err(e)?
        };
        if dt == like {
            return Ok(full);
        }
        self.b.cast(full, like, name).map_err(e)
    }

    /// ONNX `CumSum` with `reverse = 1` on a computed tensor: the sum from each element to the
    /// end is the total (the last element of the forward sum) minus the forward sum before it
    /// (`exclusive = 0`), or minus the forward sum through it (`exclusive = 1`).
    pub(super) fn cumsum_reverse(
        &mut self,
        x: NodeId,
        axis: usize,
        exclusive: bool,
        name: &str,
    ) -> R<NodeId> {
        let e = |e: autofusion_compiler::BuildError| e.msg;
        let fwd = self
            .b
            .op(Op::CumSum { axis, exclusive: false }, &[x], &format!("{name}.fwd"))
            .map_err(e)?;
        let d = self.shape(x)[axis].clone();
        let total = self
            .b
            .op(
                Op::Slice { axis, start: d.sub(&DimExpr::constant(1)), end: d },
                &[fwd],
                &format!("{name}.total"),
            )
            .map_err(e)?;
        let before = if exclusive {
            fwd
        } else {
            self.b
                .op(Op::CumSum { axis, exclusive: true }, &[x], &format!("{name}.before"))
                .map_err(e)?
        };
        self.b.binary(BinaryOp::Sub, total, before, name).map_err(e)
    }
}
