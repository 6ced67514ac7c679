//! The reference interpreter: runs the canonical IR op by op on dense arrays, rounding every
//! result to its value's dtype. It shares no code with the generated kernels and is the oracle
//! of every differential test.
//!
//! Elements are held as f64, which holds every f32 value and every integer below 2^53 exactly:
//! float ops compute in f32 (the ops table's f32 row), integer and truth values in i64 (its
//! i64 row). Integers beyond 2^53 are outside what the reference checks.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use autofusion_ir::ir::{BinaryOp, ComputeType, DType, Graph, Op, ReduceKind, UnaryOp};
use half::{bf16, f16};

#[derive(Clone, Debug)]
struct Arr {
    shape: Vec<usize>,
    data: Vec<f64>,
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn round(d: DType, v: &mut [f64]) {
    let f32s =
        |v: &mut [f64], f: fn(f32) -> f32| v.iter_mut().for_each(|x| *x = f(*x as f32) as f64);
    match d {
        DType::F32 | DType::I64 | DType::Bool => {}
        DType::F16 => f32s(v, |x| f16::from_f32(x).to_f32()),
        DType::BF16 => f32s(v, |x| bf16::from_f32(x).to_f32()),
        DType::I32 => v.iter_mut().for_each(|x| *x = (*x as i64) as i32 as f64),
    }
}

/// `u` on a value computed in `on`.
fn unary(u: UnaryOp, on: ComputeType, x: f64) -> f64 {
    let s = u.spec();
    match (on, s.i64) {
        (ComputeType::I64, Some(f)) => f(x as i64) as f64,
        _ => (s.f32)(x as f32) as f64,
    }
}

/// `b` on values computed in `on`.
fn binary(b: BinaryOp, on: ComputeType, x: f64, y: f64) -> f64 {
    let s = b.spec();
    match (on, s.i64) {
        (ComputeType::I64, Some(f)) => f(x as i64, y as i64) as f64,
        _ => (s.f32)(x as f32, y as f32) as f64,
    }
}

/// `x` of type `from` cast to `to` (before `round`): floats to integers truncate toward zero
/// and saturate (NaN -> 0), to i32 saturating at its range; integers to i32 wrap (in `round`);
/// anything to bool is `x != 0`.
fn cast(from: DType, to: DType, x: f64) -> f64 {
    match to {
        DType::Bool => (x != 0.0) as u8 as f64,
        DType::F32 | DType::F16 | DType::BF16 if !from.is_float() => (x as i64) as f32 as f64,
        DType::I64 if from.is_float() => (x as f32) as i64 as f64,
        DType::I32 if from.is_float() => (x as f32) as i32 as f64,
        _ => x,
    }
}

/// Index into `a` for the output multi-index `idx` under right-aligned broadcasting.
fn bcast_index(a: &Arr, a_str: &[usize], idx: &[usize]) -> usize {
    let off = idx.len() - a.shape.len();
    a.shape.iter().enumerate().map(|(d, &e)| if e == 1 { 0 } else { idx[off + d] * a_str[d] }).sum()
}

fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

fn elementwise(shape: &[usize], ins: &[&Arr], f: impl Fn(&[f64], &[usize]) -> f64) -> Arr {
    let strs: Vec<Vec<usize>> = ins.iter().map(|a| strides(&a.shape)).collect();
    let mut data = Vec::with_capacity(shape.iter().product());
    let mut vals = vec![0f64; ins.len()];
    for_each_index(shape, |idx| {
        for (k, a) in ins.iter().enumerate() {
            vals[k] = a.data[bcast_index(a, &strs[k], idx)];
        }
        data.push(f(&vals, idx));
    });
    Arr { shape: shape.to_vec(), data }
}

/// Run the canonical graph `g` on `inputs` (already validated) with dynamic dims `dims`.
pub fn run(g: &Graph, inputs: &[&Tensor], dims: &[i64]) -> Result<Vec<Tensor>> {
    Ok(run_with_state(g, inputs, dims)?.0)
}

/// `run`, also returning the state parameters as the graph leaves them (in `g.state` order):
/// each one's `cache_write` result.
pub fn run_with_state(
    g: &Graph,
    inputs: &[&Tensor],
    dims: &[i64],
) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
    let vals = values_of_all(g, inputs, dims)?;
    let tensor_of = |id: autofusion_ir::ir::NodeId| {
        let a = vals[id.idx()].as_ref().expect("every node is computed");
        tensor(&a.shape, &a.data, g.node(id).dtype)
    };
    let outputs = g.outputs.iter().map(|o| tensor_of(*o)).collect::<Result<_>>()?;
    let states = g.state_writes().into_iter().map(tensor_of).collect::<Result<_>>()?;
    Ok((outputs, states))
}

/// The value of every node of `g`.
fn values_of_all(g: &Graph, inputs: &[&Tensor], dims: &[i64]) -> Result<Vec<Option<Arr>>> {
    let bind = |s: &str| g.dyn_dims.iter().position(|d| d == s).map(|i| dims[i]);
    let mut vals: Vec<Option<Arr>> = vec![None; g.nodes.len()];
    for id in g.ids() {
        let n = g.node(id);
        let shape: Vec<usize> = n
            .shape
            .iter()
            .map(|d| d.eval(&bind).map(|v| v as usize))
            .collect::<std::result::Result<_, _>>()
            .map_err(|msg| Error::Dims { graph: g.name.clone(), msg })?;
        let ins: Vec<&Arr> =
            n.inputs.iter().map(|i| vals[i.idx()].as_ref().expect("topological order")).collect();
        let mut out = match &n.op {
            Op::Param { index } => Arr { shape: shape.clone(), data: values(inputs[*index]) },
            Op::Const { value } => Arr { shape: vec![], data: vec![constant(*value, n.dtype)] },
            op if op.is_elementwise() => {
                let from = g.node(n.inputs[0]).dtype;
                pointwise(&n.op, from, n.dtype, &shape, &ins)
            }
            Op::CumSum { exclusive, .. } => cumsum(ins[0], n.dtype, *exclusive),
            Op::RotateHalf => rotate_half(ins[0]).map_err(|msg| Error::Dims {
                graph: g.name.clone(),
                msg: format!("rotate_half `{}`: {msg}", n.name),
            })?,
            Op::Gather { axis } => {
                gather(ins[0], ins[1], *axis, &shape).map_err(|(at, index)| Error::Index {
                    graph: g.name.clone(),
                    param: g.node(n.inputs[1]).name.clone(),
                    at,
                    index,
                    table: g.node(n.inputs[0]).name.clone(),
                    size: ins[0].shape[*axis] as i64,
                })?
            }
            Op::Reduce { kind, axis } => reduce(*kind, *axis, ins[0], &shape),
            Op::MatMul => matmul(ins[0], ins[1], &shape),
            Op::Reshape => Arr { shape: shape.clone(), data: ins[0].data.clone() },
            Op::Transpose { perm } => transpose(ins[0], perm, &shape),
            Op::Slice { axis, start, .. } => {
                let s0 =
                    start.eval(&bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg })?
                        as usize;
                slice(ins[0], *axis, s0, &shape)
            }
            Op::Concat { axis } => concat(&ins, *axis, &shape),
            Op::CacheWrite { axis, start } => {
                let s0 =
                    start.eval(&bind).map_err(|msg| Error::Dims { graph: g.name.clone(), msg })?;
                cache_write(ins[0], ins[1], *axis, s0).map_err(|msg| Error::Dims {
                    graph: g.name.clone(),
                    msg: format!("cache_write `{}`: {msg}", n.name),
                })?
            }
            op => {
                return Err(Error::Module {
                    symbol: g.name.clone(),
                    msg: format!(
                        "the reference runs canonical graphs; found sugar op `{}`",
                        op.name()
                    ),
                })
            }
        };
        round(n.dtype, &mut out.data);
        vals[id.idx()] = Some(out);
    }
    Ok(vals)
}

/// `cache` with `new` written at `start` along `axis`.
fn cache_write(
    cache: &Arr,
    new: &Arr,
    axis: usize,
    start: i64,
) -> std::result::Result<Arr, String> {
    let (t, s) = (cache.shape[axis] as i64, new.shape[axis] as i64);
    if start < 0 || start + s > t {
        return Err(format!("positions {start} .. {} are outside the cache's {t}", start + s));
    }
    let mut out = cache.clone();
    let cs = strides(&cache.shape);
    let mut k = 0;
    for_each_index(&new.shape, |idx| {
        let at: usize = idx
            .iter()
            .enumerate()
            .map(|(d, &i)| (i + if d == axis { start as usize } else { 0 }) * cs[d])
            .sum();
        out.data[at] = new.data[k];
        k += 1;
    });
    Ok(out)
}

/// A tensor's elements as the reference holds them.
fn values(t: &Tensor) -> Vec<f64> {
    match t.dtype().compute() {
        ComputeType::F32 => t.to_f32_vec().into_iter().map(f64::from).collect(),
        ComputeType::I64 => t.to_i64_vec().into_iter().map(|x| x as f64).collect(),
    }
}

/// A constant of type `d` as the reference holds it.
fn constant(value: f64, d: DType) -> f64 {
    match d.compute() {
        ComputeType::F32 => value as f32 as f64,
        ComputeType::I64 => value as i64 as f64,
    }
}

/// Elements of type `d` (already rounded to it) as a tensor.
fn tensor(shape: &[usize], data: &[f64], d: DType) -> Result<Tensor> {
    match d.compute() {
        ComputeType::F32 => {
            Tensor::from_f32_as(shape, &data.iter().map(|x| *x as f32).collect::<Vec<_>>(), d)
        }
        ComputeType::I64 => {
            Tensor::from_i64(shape, data.iter().map(|x| *x as i64).collect())?.to_dtype(d)
        }
    }
}

/// Elementwise ops (unary, binary, cast, copy, causal mask, where) at output `shape`,
/// broadcasting `ins`; `from` is the type of the first operand, `to` the result's.
fn pointwise(op: &Op, from: DType, to: DType, shape: &[usize], ins: &[&Arr]) -> Arr {
    let on = from.compute();
    match op {
        Op::Unary(u) => elementwise(shape, ins, |v, _| unary(*u, on, v[0])),
        Op::Binary(b) => elementwise(shape, ins, |v, _| binary(*b, on, v[0], v[1])),
        Op::Cast => elementwise(shape, ins, |v, _| cast(from, to, v[0])),
        Op::Copy | Op::Expand { .. } => elementwise(shape, ins, |v, _| v[0]),
        Op::Where => elementwise(shape, ins, |v, _| if v[0] != 0.0 { v[1] } else { v[2] }),
        Op::CausalMask => {
            let r = shape.len();
            let shift = shape[r - 1] as i64 - shape[r - 2] as i64;
            elementwise(shape, ins, |v, idx| {
                if idx[r - 1] as i64 > idx[r - 2] as i64 + shift {
                    f64::NEG_INFINITY
                } else {
                    v[0]
                }
            })
        }
        op => unreachable!("`{}` is not pointwise", op.name()),
    }
}

/// Running sums of `a` (of type `d`) along its last axis: in f32 for floats, wrapping i64 for
/// integers.
fn cumsum(a: &Arr, d: DType, exclusive: bool) -> Arr {
    let n = a.shape.last().copied().unwrap_or(1).max(1);
    let mut data = Vec::with_capacity(a.data.len());
    for row in a.data.chunks(n) {
        let (mut f, mut i) = (0f32, 0i64);
        for x in row {
            let before = if d.is_float() { f as f64 } else { i as f64 };
            f += *x as f32;
            i = i.wrapping_add(*x as i64);
            let after = if d.is_float() { f as f64 } else { i as f64 };
            data.push(if exclusive { before } else { after });
        }
    }
    Arr { shape: a.shape.clone(), data }
}

/// Each row's halves swapped, the new first half negated (`Op::RotateHalf`).
fn rotate_half(a: &Arr) -> std::result::Result<Arr, String> {
    let n = a.shape.last().copied().unwrap_or(1);
    if n % 2 != 0 {
        return Err(format!("the last axis ({n}) must be even"));
    }
    let h = n / 2;
    let mut data = Vec::with_capacity(a.data.len());
    for row in a.data.chunks(n.max(1)) {
        data.extend(row[h..].iter().map(|x| -x));
        data.extend_from_slice(&row[..h]);
    }
    Ok(Arr { shape: a.shape.clone(), data })
}

/// Slices of `data` along `axis` picked by `idx` (negative from the end); `Err((element,
/// index))` for the first index out of range.
fn gather(
    data: &Arr,
    idx: &Arr,
    axis: usize,
    shape: &[usize],
) -> std::result::Result<Arr, (usize, i64)> {
    let size = data.shape[axis] as i64;
    let outer: usize = data.shape[..axis].iter().product();
    let inner: usize = data.shape[axis + 1..].iter().product();
    let mut rows = Vec::with_capacity(idx.data.len());
    for (at, v) in idx.data.iter().enumerate() {
        let i = *v as i64;
        let fixed = if i < 0 { i + size } else { i };
        if !(0..size).contains(&fixed) {
            return Err((at, i));
        }
        rows.push(fixed as usize);
    }
    let mut out = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for r in &rows {
            let base = (o * size as usize + r) * inner;
            out.extend_from_slice(&data.data[base..base + inner]);
        }
    }
    Ok(Arr { shape: shape.to_vec(), data: out })
}

/// Reduction of `a` over `axis` (kept, of extent 1 in `shape`), in f32.
fn reduce(kind: ReduceKind, axis: usize, a: &Arr, shape: &[usize]) -> Arr {
    let st = strides(&a.shape);
    let ext = a.shape[axis];
    let mut data = Vec::with_capacity(shape.iter().product());
    for_each_index(shape, |idx| {
        let base: usize = idx.iter().zip(&st).map(|(i, s)| i * s).sum();
        let it = (0..ext).map(|k| a.data[base + k * st[axis]] as f32);
        let r = match kind {
            ReduceKind::Sum => it.sum(),
            ReduceKind::Mean => it.sum::<f32>() / ext as f32,
            ReduceKind::Max => it.fold(f32::NEG_INFINITY, f32::max),
        };
        data.push(r as f64);
    });
    Arr { shape: shape.to_vec(), data }
}

/// Batched `a @ b` (batch dims broadcast), accumulated in f64.
fn matmul(a: &Arr, b: &Arr, shape: &[usize]) -> Arr {
    let r = shape.len();
    let (m, nn) = (shape[r - 2], shape[r - 1]);
    let k = a.shape[a.shape.len() - 1];
    let batch = &shape[..r - 2];
    let (sa, sb) = (strides(&a.shape), strides(&b.shape));
    let mut data = vec![0f64; shape.iter().product()];
    let mut bi = 0;
    for_each_index(batch, |bidx| {
        let mut ia = bidx.to_vec();
        ia.extend([0, 0]);
        let a0 = bcast_index(a, &sa, &ia);
        let b0 = bcast_index(b, &sb, &ia);
        let (ars, acs) = (sa[sa.len() - 2], sa[sa.len() - 1]);
        let (brs, bcs) = (sb[sb.len() - 2], sb[sb.len() - 1]);
        for i in 0..m {
            for j in 0..nn {
                let mut acc = 0f64;
                for p in 0..k {
                    acc += a.data[a0 + i * ars + p * acs] * b.data[b0 + p * brs + j * bcs];
                }
                data[(bi * m + i) * nn + j] = acc as f32 as f64;
            }
        }
        bi += 1;
    });
    Arr { shape: shape.to_vec(), data }
}

/// `a` with its axes permuted: output axis `d` is input axis `perm[d]`.
fn transpose(a: &Arr, perm: &[usize], shape: &[usize]) -> Arr {
    let st = strides(&a.shape);
    let mut data = Vec::with_capacity(a.data.len());
    for_each_index(shape, |idx| {
        data.push(a.data[idx.iter().enumerate().map(|(d, i)| i * st[perm[d]]).sum::<usize>()]);
    });
    Arr { shape: shape.to_vec(), data }
}

/// The part of `a` starting at `s0` along `axis` (its extent given by `shape`).
fn slice(a: &Arr, axis: usize, s0: usize, shape: &[usize]) -> Arr {
    let st = strides(&a.shape);
    let mut data = Vec::with_capacity(shape.iter().product());
    for_each_index(shape, |idx| {
        data.push(
            a.data[idx
                .iter()
                .enumerate()
                .map(|(d, i)| (if d == axis { i + s0 } else { *i }) * st[d])
                .sum::<usize>()],
        );
    });
    Arr { shape: shape.to_vec(), data }
}

/// `ins` concatenated along `axis`.
fn concat(ins: &[&Arr], axis: usize, shape: &[usize]) -> Arr {
    let mut data = Vec::with_capacity(shape.iter().product());
    let starts: Vec<usize> = ins
        .iter()
        .scan(0, |acc, a| {
            let s = *acc;
            *acc += a.shape[axis];
            Some(s)
        })
        .collect();
    for_each_index(shape, |idx| {
        let j = starts.iter().rposition(|s| *s <= idx[axis]).unwrap();
        let a = ins[j];
        let st = strides(&a.shape);
        let off: usize = idx
            .iter()
            .enumerate()
            .map(|(d, i)| (if d == axis { i - starts[j] } else { *i }) * st[d])
            .sum();
        data.push(a.data[off]);
    });
    Arr { shape: shape.to_vec(), data }
}
