//! The reference interpreter: runs the canonical IR op by op on dense arrays, rounding every
//! result to its value's dtype. It shares no code with the generated kernels and is the oracle
//! of every differential test.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use autofusion_ir::ir::{BinaryOp, DType, Graph, Op, ReduceKind, UnaryOp};
use half::{bf16, f16};

#[derive(Clone, Debug)]
struct Arr {
    shape: Vec<usize>,
    data: Vec<f32>,
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn round(d: DType, v: &mut [f32]) {
    match d {
        DType::F32 => {}
        DType::F16 => v.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        DType::BF16 => v.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
    }
}

fn unary(u: UnaryOp, x: f32) -> f32 {
    (u.spec().f32)(x)
}

fn binary(b: BinaryOp, x: f32, y: f32) -> f32 {
    (b.spec().f32)(x, y)
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

fn elementwise(shape: &[usize], ins: &[&Arr], f: impl Fn(&[f32], &[usize]) -> f32) -> Arr {
    let strs: Vec<Vec<usize>> = ins.iter().map(|a| strides(&a.shape)).collect();
    let mut data = Vec::with_capacity(shape.iter().product());
    let mut vals = vec![0f32; ins.len()];
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
            Op::Param { index } => Arr { shape: shape.clone(), data: inputs[*index].to_f32_vec() },
            Op::Const { value } => Arr { shape: vec![], data: vec![*value as f32] },
            Op::Unary(_) | Op::Binary(_) | Op::Cast | Op::Copy | Op::CausalMask => {
                pointwise(&n.op, &shape, &ins)
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
    g.outputs
        .iter()
        .map(|o| {
            let a = vals[o.idx()].as_ref().unwrap();
            Tensor::from_f32_as(&a.shape, &a.data, g.node(*o).dtype)
        })
        .collect()
}

/// Elementwise ops (unary, binary, cast, copy, causal mask) at output `shape`, broadcasting `ins`.
fn pointwise(op: &Op, shape: &[usize], ins: &[&Arr]) -> Arr {
    match op {
        Op::Unary(u) => elementwise(shape, ins, |v, _| unary(*u, v[0])),
        Op::Binary(b) => elementwise(shape, ins, |v, _| binary(*b, v[0], v[1])),
        Op::Cast | Op::Copy => elementwise(shape, ins, |v, _| v[0]),
        Op::CausalMask => {
            let r = shape.len();
            let shift = shape[r - 1] as i64 - shape[r - 2] as i64;
            elementwise(shape, ins, |v, idx| {
                if idx[r - 1] as i64 > idx[r - 2] as i64 + shift {
                    f32::NEG_INFINITY
                } else {
                    v[0]
                }
            })
        }
        op => unreachable!("`{}` is not pointwise", op.name()),
    }
}

/// Reduction of `a` over `axis` (kept, of extent 1 in `shape`).
fn reduce(kind: ReduceKind, axis: usize, a: &Arr, shape: &[usize]) -> Arr {
    let st = strides(&a.shape);
    let ext = a.shape[axis];
    let mut data = Vec::with_capacity(shape.iter().product());
    for_each_index(shape, |idx| {
        let base: usize = idx.iter().zip(&st).map(|(i, s)| i * s).sum();
        let it = (0..ext).map(|k| a.data[base + k * st[axis]]);
        data.push(match kind {
            ReduceKind::Sum => it.sum(),
            ReduceKind::Mean => it.sum::<f32>() / ext as f32,
            ReduceKind::Max => it.fold(f32::NEG_INFINITY, f32::max),
        });
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
    let mut data = vec![0f32; shape.iter().product()];
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
                    acc += a.data[a0 + i * ars + p * acs] as f64
                        * b.data[b0 + p * brs + j * bcs] as f64;
                }
                data[(bi * m + i) * nn + j] = acc as f32;
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
