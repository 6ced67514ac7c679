//! Shape arithmetic on values known at import time: what exporters put in the graph around
//! the compute (torch.onnx's `Shape -> Gather -> Unsqueeze -> Concat -> ConstantOfShape ->
//! Equal -> Where -> Expand` chains, `Range` of constant bounds, `CumSum` of constant masks).
//! Integers stay `DimExpr`s, so a dim of the model's `dim_param` flows through symbolically;
//! booleans are the integers 0 and 1. Every op broadcasts as numpy does.

use super::{Val, R};
use autofusion_compiler::dim::DimExpr;
use autofusion_compiler::ir::{ReduceKind, UnaryOp};

/// The elements of a known value as one list: symbolic or constant integers, or floats.
#[derive(Clone, Debug)]
pub(super) enum Elems {
    Ints(Vec<DimExpr>),
    Floats(Vec<f64>),
}

impl Elems {
    fn len(&self) -> usize {
        match self {
            Elems::Ints(v) => v.len(),
            Elems::Floats(v) => v.len(),
        }
    }
}

/// The shape and elements of a known value (`None` for a computed tensor).
pub(super) fn known(v: &Val) -> Option<(Vec<usize>, Elems)> {
    match v {
        Val::Known { shape, ints, floats, float } => Some((
            shape.clone(),
            if *float { Elems::Floats(floats.clone()) } else { Elems::Ints(ints.clone()) },
        )),
        Val::Node(_) => None,
    }
}

pub(super) fn make(shape: Vec<usize>, e: Elems) -> Val {
    match e {
        Elems::Ints(ints) => Val::Known { shape, ints, floats: vec![], float: false },
        Elems::Floats(floats) => Val::Known { shape, ints: vec![], floats, float: true },
    }
}

fn numel(shape: &[usize]) -> R<usize> {
    shape
        .iter()
        .try_fold(1usize, |a, d| a.checked_mul(*d))
        .ok_or_else(|| format!("constant of shape {shape:?} overflows"))
}

/// Constants folded here stay small: they are shapes, masks of constant size and index lists.
const MAX_FOLDED: usize = 1 << 20;

/// numpy's broadcast of `shapes`.
pub(super) fn broadcast(shapes: &[&[usize]]) -> R<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        for (i, d) in s.iter().enumerate() {
            let o = &mut out[rank - s.len() + i];
            match (*o, *d) {
                (a, b) if a == b || b == 1 => {}
                (1, b) => *o = b,
                (a, b) => return Err(format!("constant shapes do not broadcast: {a} against {b}")),
            }
        }
    }
    if numel(&out)? > MAX_FOLDED {
        return Err(format!("a constant of shape {out:?} is too large to fold at import"));
    }
    Ok(out)
}

/// For each element of `out` (row-major), the index of the element of a value shaped `s` it
/// reads under broadcasting.
fn source_index(out: &[usize], s: &[usize]) -> R<Vec<usize>> {
    let n = numel(out)?;
    let lead = out.len() - s.len();
    let mut idx = Vec::with_capacity(n);
    let mut coord = vec![0usize; out.len()];
    for _ in 0..n {
        let mut k = 0;
        for (a, d) in s.iter().enumerate() {
            k = k * d + if *d == 1 { 0 } else { coord[lead + a] };
        }
        idx.push(k);
        for a in (0..out.len()).rev() {
            coord[a] += 1;
            if coord[a] < out[a] {
                break;
            }
            coord[a] = 0;
        }
    }
    Ok(idx)
}

fn int_const(d: &DimExpr, what: &str) -> R<i64> {
    d.as_const().ok_or_else(|| format!("{what} of the symbolic dim {d}"))
}

/// A lower bound of a dim expression: dims are sizes (at least 0), so a polynomial whose
/// coefficients are all positive is at least its constant term.
fn lower_bound(d: &DimExpr) -> Option<i64> {
    let terms: Vec<(autofusion_compiler::dim::Monomial, autofusion_compiler::dim::Ratio)> =
        d.clone().into();
    let mut c = 0;
    for (m, r) in terms {
        if m.is_empty() {
            c = r.num.div_euclid(r.den);
        } else if r.num <= 0 {
            return None;
        }
    }
    Some(c)
}

/// The order of two integers when it is known: both constant, or a constant below what a
/// symbolic dim can be (torch compares shapes with -1).
fn order(x: &DimExpr, y: &DimExpr) -> Option<std::cmp::Ordering> {
    use std::cmp::Ordering::*;
    match (x.as_const(), y.as_const()) {
        (Some(p), Some(q)) => Some(p.cmp(&q)),
        (None, Some(q)) => lower_bound(x).filter(|lb| q < *lb).map(|_| Greater),
        (Some(p), None) => lower_bound(y).filter(|lb| p < *lb).map(|_| Less),
        (None, None) => None,
    }
}

fn truth(e: &Elems, i: usize) -> R<bool> {
    match e {
        Elems::Ints(v) => Ok(int_const(&v[i], "a boolean test")? != 0),
        Elems::Floats(v) => Ok(v[i] != 0.0),
    }
}

/// Equal, Less, LessOrEqual, Greater, GreaterOrEqual of two known values. Symbolic dims are
/// equal when their normal forms are; an order between symbolic dims is not known.
pub(super) fn compare(op: &str, a: &Val, b: &Val) -> R<Val> {
    let ((sa, ea), (sb, eb)) = (known(a).unwrap(), known(b).unwrap());
    let out = broadcast(&[&sa, &sb])?;
    let (ia, ib) = (source_index(&out, &sa)?, source_index(&out, &sb)?);
    let ints = ia
        .iter()
        .zip(&ib)
        .map(|(&i, &j)| {
            let ord = match (&ea, &eb) {
                (Elems::Ints(x), Elems::Ints(y)) if op == "Equal" && x[i] == y[j] => {
                    Some(std::cmp::Ordering::Equal)
                }
                (Elems::Ints(x), Elems::Ints(y)) => match order(&x[i], &y[j]) {
                    Some(o) => Some(o),
                    None => {
                        return Err(format!("`{op}` of the symbolic dims {} and {}", x[i], y[j]))
                    }
                },
                (Elems::Floats(x), Elems::Floats(y)) => x[i].partial_cmp(&y[j]),
                _ => return Err(format!("`{op}` between a float and an integer constant")),
            };
            use std::cmp::Ordering::*;
            let t = match (op, ord) {
                (_, None) => false, // NaN
                ("Equal", Some(o)) => o == Equal,
                ("Less", Some(o)) => o == Less,
                ("LessOrEqual", Some(o)) => o != Greater,
                ("Greater", Some(o)) => o == Greater,
                ("GreaterOrEqual", Some(o)) => o != Less,
                _ => unreachable!("comparison {op}"),
            };
            Ok(DimExpr::constant(t as i64))
        })
        .collect::<R<_>>()?;
    Ok(make(out, Elems::Ints(ints)))
}

/// And, Or, Xor of known booleans; Not of one.
pub(super) fn logic(op: &str, vals: &[Val]) -> R<Val> {
    let parts: Vec<(Vec<usize>, Elems)> = vals.iter().map(|v| known(v).unwrap()).collect();
    let shapes: Vec<&[usize]> = parts.iter().map(|p| p.0.as_slice()).collect();
    let out = broadcast(&shapes)?;
    let idx: Vec<Vec<usize>> = parts.iter().map(|p| source_index(&out, &p.0)).collect::<R<_>>()?;
    let ints = (0..idx[0].len())
        .map(|k| {
            let x = truth(&parts[0].1, idx[0][k])?;
            let t = match op {
                "Not" => !x,
                _ => {
                    let y = truth(&parts[1].1, idx[1][k])?;
                    match op {
                        "And" => x && y,
                        "Or" => x || y,
                        "Xor" => x != y,
                        _ => unreachable!("logic {op}"),
                    }
                }
            };
            Ok(DimExpr::constant(t as i64))
        })
        .collect::<R<_>>()?;
    Ok(make(out, Elems::Ints(ints)))
}

/// Where(cond, x, y) of known values.
pub(super) fn select(c: &Val, x: &Val, y: &Val) -> R<Val> {
    let ((sc, ec), (sx, ex), (sy, ey)) = (known(c).unwrap(), known(x).unwrap(), known(y).unwrap());
    let out = broadcast(&[&sc, &sx, &sy])?;
    let (ic, ix, iy) =
        (source_index(&out, &sc)?, source_index(&out, &sx)?, source_index(&out, &sy)?);
    let pick = |k: usize| truth(&ec, ic[k]);
    let e = match (ex, ey) {
        (Elems::Ints(a), Elems::Ints(b)) => Elems::Ints(
            (0..ic.len())
                .map(|k| Ok(if pick(k)? { a[ix[k]].clone() } else { b[iy[k]].clone() }))
                .collect::<R<_>>()?,
        ),
        (Elems::Floats(a), Elems::Floats(b)) => Elems::Floats(
            (0..ic.len())
                .map(|k| Ok(if pick(k)? { a[ix[k]] } else { b[iy[k]] }))
                .collect::<R<_>>()?,
        ),
        _ => return Err("Where between a float and an integer constant".into()),
    };
    Ok(make(out, e))
}

/// A shape given as integers, every dim constant and not negative.
fn const_shape(dims: &[DimExpr], what: &str) -> R<Vec<usize>> {
    dims.iter()
        .map(|d| {
            usize::try_from(int_const(d, what)?)
                .map_err(|_| format!("{what} with a negative dim {d}"))
        })
        .collect()
}

/// Expand of a known value to a known shape (numpy broadcast of the two).
pub(super) fn expand(x: &Val, to: &[DimExpr]) -> R<Val> {
    let (sx, _) = known(x).unwrap();
    let to = const_shape(to, "Expand of a constant")?;
    let out = broadcast(&[&sx, &to])?;
    expand_to(x, &out)
}

/// A known value broadcast to the shape `out` (which its shape broadcasts to).
pub(super) fn expand_to(x: &Val, out: &[usize]) -> R<Val> {
    let (sx, ex) = known(x).unwrap();
    let ix = source_index(out, &sx)?;
    let e = match ex {
        Elems::Ints(a) => Elems::Ints(ix.iter().map(|&i| a[i].clone()).collect()),
        Elems::Floats(a) => Elems::Floats(ix.iter().map(|&i| a[i]).collect()),
    };
    Ok(make(out.to_vec(), e))
}

/// ConstantOfShape: `shape` constant, filled with `value` (one element; 0.0 by default).
pub(super) fn constant_of_shape(shape: &[DimExpr], value: Option<Val>) -> R<Val> {
    let shape = const_shape(shape, "ConstantOfShape")?;
    let n = numel(&shape)?;
    if n > MAX_FOLDED {
        return Err(format!("ConstantOfShape of {shape:?} is too large to fold at import"));
    }
    let fill = match value.as_ref().and_then(known) {
        None => Elems::Floats(vec![0.0]),
        Some((_, e)) if e.len() == 1 => e,
        Some(_) => return Err("ConstantOfShape's value must hold one element".into()),
    };
    let e = match fill {
        Elems::Ints(v) => Elems::Ints(vec![v[0].clone(); n]),
        Elems::Floats(v) => Elems::Floats(vec![v[0]; n]),
    };
    Ok(make(shape, e))
}

/// Range(start, limit, delta) of known scalars: ceil((limit - start) / delta) elements.
pub(super) fn range(start: &Val, limit: &Val, delta: &Val) -> R<Val> {
    let scalar = |v: &Val, what: &str| -> R<Elems> {
        match known(v) {
            Some((_, e)) if e.len() == 1 => Ok(e),
            _ => Err(format!("Range's {what} must be a scalar")),
        }
    };
    match (scalar(start, "start")?, scalar(limit, "limit")?, scalar(delta, "delta")?) {
        (Elems::Ints(s), Elems::Ints(l), Elems::Ints(d)) => {
            let (s, d) = (int_const(&s[0], "Range")?, int_const(&d[0], "Range")?);
            let l = l[0].as_const().ok_or_else(|| {
                format!(
                    "Range up to the symbolic dim {} makes a tensor of dynamic length; \
                     positions computed in the graph are not supported yet",
                    l[0]
                )
            })?;
            if d == 0 {
                return Err("Range with delta 0".into());
            }
            let n = ((l as i128 - s as i128) as f64 / d as f64).ceil().max(0.0) as usize;
            if n > MAX_FOLDED {
                return Err(format!("Range of {n} elements is too large to fold at import"));
            }
            let ints = (0..n as i64).map(|i| DimExpr::constant(s + i * d)).collect();
            Ok(make(vec![n], Elems::Ints(ints)))
        }
        (Elems::Floats(s), Elems::Floats(l), Elems::Floats(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            if d == 0.0 || !(s.is_finite() && l.is_finite() && d.is_finite()) {
                return Err(format!("Range({s}, {l}, {d})"));
            }
            let n = ((l - s) / d).ceil().max(0.0) as usize;
            if n > MAX_FOLDED {
                return Err(format!("Range of {n} elements is too large to fold at import"));
            }
            let floats = (0..n).map(|i| s + i as f64 * d).collect();
            Ok(make(vec![n], Elems::Floats(floats)))
        }
        _ => Err("Range of mixed integer and float bounds".into()),
    }
}

/// CumSum of a known value along `axis`, with ONNX's `exclusive` and `reverse`.
pub(super) fn cumsum(x: &Val, axis: usize, exclusive: bool, reverse: bool) -> R<Val> {
    let (shape, e) = known(x).unwrap();
    let len = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let order: Vec<usize> = if reverse { (0..len).rev().collect() } else { (0..len).collect() };
    let at = |o: usize, k: usize, i: usize| (o * len + k) * inner + i;
    let e = match e {
        Elems::Ints(v) => {
            let mut out = vec![DimExpr::constant(0); v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc = DimExpr::constant(0);
                    for &k in &order {
                        let next = acc.add(&v[at(o, k, i)]);
                        out[at(o, k, i)] = if exclusive { acc.clone() } else { next.clone() };
                        acc = next;
                    }
                }
            }
            Elems::Ints(out)
        }
        Elems::Floats(v) => {
            let mut out = vec![0.0; v.len()];
            for o in 0..outer {
                for i in 0..inner {
                    let mut acc = 0.0;
                    for &k in &order {
                        let next = acc + v[at(o, k, i)];
                        out[at(o, k, i)] = if exclusive { acc } else { next };
                        acc = next;
                    }
                }
            }
            Elems::Floats(out)
        }
    };
    Ok(make(shape, e))
}

/// ReduceSum / ReduceMean / ReduceMax of a known value over `axes` (sorted, distinct).
pub(super) fn reduce(kind: ReduceKind, x: &Val, axes: &[usize], keepdims: bool) -> R<Val> {
    let (shape, e) = known(x).unwrap();
    let out_keep: Vec<usize> =
        shape.iter().enumerate().map(|(i, d)| if axes.contains(&i) { 1 } else { *d }).collect();
    // Element k of the input adds into element `to[k]` of the kept-dims output.
    let strides: Vec<usize> = (0..shape.len()).map(|i| shape[i + 1..].iter().product()).collect();
    let out_strides: Vec<usize> =
        (0..shape.len()).map(|i| out_keep[i + 1..].iter().product()).collect();
    let to = |k: usize| -> usize {
        (0..shape.len())
            .filter(|a| !axes.contains(a))
            .map(|a| (k / strides[a]) % shape[a] * out_strides[a])
            .sum()
    };
    let n_out: usize = out_keep.iter().product();
    let count: usize = axes.iter().map(|a| shape[*a]).product();
    let e = match (e, kind) {
        (Elems::Floats(v), _) => {
            let init = if kind == ReduceKind::Max { f64::NEG_INFINITY } else { 0.0 };
            let mut out = vec![init; n_out];
            for (k, x) in v.iter().enumerate() {
                let o = &mut out[to(k)];
                *o = if kind == ReduceKind::Max { o.max(*x) } else { *o + x };
            }
            if kind == ReduceKind::Mean {
                out.iter_mut().for_each(|o| *o /= count as f64);
            }
            Elems::Floats(out)
        }
        (Elems::Ints(v), ReduceKind::Sum) => {
            let mut out = vec![DimExpr::constant(0); n_out];
            for (k, x) in v.iter().enumerate() {
                let o = &mut out[to(k)];
                *o = o.add(x);
            }
            Elems::Ints(out)
        }
        (Elems::Ints(_), _) => {
            return Err("ReduceMean / ReduceMax of integer constants is not folded".into())
        }
    };
    let shape = if keepdims {
        out_keep
    } else {
        shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| *d).collect()
    };
    Ok(make(shape, e))
}

/// A unary function of a known value: negation of integers (symbolic ones too), any of the
/// table's functions of floats.
pub(super) fn unary(u: UnaryOp, x: &Val) -> R<Val> {
    let (shape, e) = known(x).unwrap();
    let e = match e {
        Elems::Ints(v) if u == UnaryOp::Neg => {
            Elems::Ints(v.iter().map(|d| DimExpr::constant(0).sub(d)).collect())
        }
        Elems::Ints(_) => return Err(format!("`{}` of a constant integer tensor", u.name())),
        Elems::Floats(v) => Elems::Floats(v.iter().map(|f| u.eval(*f)).collect()),
    };
    Ok(make(shape, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ints(shape: Vec<usize>, v: &[i64]) -> Val {
        make(shape, Elems::Ints(v.iter().map(|x| DimExpr::constant(*x)).collect()))
    }
    fn consts(v: &Val) -> Vec<i64> {
        match known(v).unwrap().1 {
            Elems::Ints(x) => x.iter().map(|d| d.as_const().unwrap()).collect(),
            Elems::Floats(_) => panic!("floats"),
        }
    }

    #[test]
    fn comparisons_and_logic_broadcast_like_numpy() {
        let a = ints(vec![2, 1], &[1, 3]);
        let b = ints(vec![3], &[1, 2, 3]);
        let eq = compare("Equal", &a, &b).unwrap();
        assert_eq!(known(&eq).unwrap().0, vec![2, 3]);
        assert_eq!(consts(&eq), [1, 0, 0, 0, 0, 1]);
        assert_eq!(consts(&compare("LessOrEqual", &a, &b).unwrap()), [1, 1, 1, 0, 0, 1]);
        let not = logic("Not", std::slice::from_ref(&eq)).unwrap();
        assert_eq!(consts(&not), [0, 1, 1, 1, 1, 0]);
        assert_eq!(consts(&logic("And", &[eq, not]).unwrap()), [0; 6]);
        assert!(compare("Equal", &b, &ints(vec![2], &[1, 2])).is_err(), "3 against 2");
    }

    #[test]
    fn symbolic_dims_compare_equal_by_normal_form_only() {
        let s = DimExpr::sym("S");
        let a = make(vec![1], Elems::Ints(vec![s.mul(&DimExpr::constant(2))]));
        let b = make(vec![1], Elems::Ints(vec![s.add(&s)]));
        assert_eq!(consts(&compare("Equal", &a, &b).unwrap()), [1]);
        let err = compare("Less", &a, &ints(vec![1], &[4])).unwrap_err();
        assert!(err.contains("symbolic"), "{err}");
        // A size is never negative: 2S > -1 is known, S - 1 against -1 is not.
        assert_eq!(consts(&compare("Greater", &a, &ints(vec![1], &[-1])).unwrap()), [1]);
        let s_minus_1 = make(vec![1], Elems::Ints(vec![s.sub(&DimExpr::constant(1))]));
        assert!(compare("Equal", &s_minus_1, &ints(vec![1], &[-1])).is_err());
    }

    #[test]
    fn where_picks_symbolic_dims_as_torch_reshape_chains_do() {
        // torch writes `Where(Equal(shape, -1), ones, shape)` ahead of Expand.
        let s = DimExpr::sym("S");
        let shape = make(vec![2], Elems::Ints(vec![s.clone(), DimExpr::constant(-1)]));
        let minus1 = ints(vec![], &[-1]);
        let ones = constant_of_shape(&[DimExpr::constant(2)], Some(ints(vec![1], &[1]))).unwrap();
        let is_neg = compare("Equal", &shape, &minus1).unwrap();
        let picked = select(&is_neg, &ones, &shape).unwrap();
        let Some((sh, Elems::Ints(v))) = known(&picked) else { panic!() };
        assert_eq!(sh, vec![2]);
        assert_eq!(v, vec![s, DimExpr::constant(1)]);
    }

    #[test]
    fn range_cumsum_and_expand() {
        let r = range(&ints(vec![], &[2]), &ints(vec![], &[9]), &ints(vec![], &[3])).unwrap();
        assert_eq!(consts(&r), [2, 5, 8]);
        let down = range(&ints(vec![], &[3]), &ints(vec![], &[0]), &ints(vec![], &[-1])).unwrap();
        assert_eq!(consts(&down), [3, 2, 1]);
        let sym = range(
            &ints(vec![], &[0]),
            &make(vec![], Elems::Ints(vec![DimExpr::sym("S")])),
            &ints(vec![], &[1]),
        );
        assert!(sym.unwrap_err().contains("dynamic length"));
        let m = ints(vec![2, 3], &[1, 1, 0, 1, 0, 1]);
        assert_eq!(consts(&cumsum(&m, 1, false, false).unwrap()), [1, 2, 2, 1, 1, 2]);
        assert_eq!(consts(&cumsum(&m, 1, true, false).unwrap()), [0, 1, 2, 0, 1, 1]);
        assert_eq!(consts(&cumsum(&m, 0, false, true).unwrap()), [2, 1, 1, 1, 0, 1]);
        let e = expand(&ints(vec![1, 2], &[4, 5]), &[DimExpr::constant(3), DimExpr::constant(1)])
            .unwrap();
        assert_eq!(known(&e).unwrap().0, vec![3, 2]);
        assert_eq!(consts(&e), [4, 5, 4, 5, 4, 5]);
    }

    #[test]
    fn reductions_of_constants() {
        let m = make(vec![2, 3], Elems::Floats(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let sum = reduce(ReduceKind::Sum, &m, &[1], false).unwrap();
        let Some((sh, Elems::Floats(v))) = known(&sum) else { panic!() };
        assert_eq!((sh, v), (vec![2], vec![6.0, 15.0]));
        let mean = reduce(ReduceKind::Mean, &m, &[0], true).unwrap();
        let Some((sh, Elems::Floats(v))) = known(&mean) else { panic!() };
        assert_eq!((sh, v), (vec![1, 3], vec![2.5, 3.5, 4.5]));
        let max = reduce(ReduceKind::Max, &m, &[0, 1], false).unwrap();
        let Some((sh, Elems::Floats(v))) = known(&max) else { panic!() };
        assert_eq!((sh, v), (vec![], vec![6.0]));
    }

    #[test]
    fn oversized_or_negative_shapes_are_errors_not_allocations() {
        let big = [DimExpr::constant(1 << 40), DimExpr::constant(1 << 40)];
        assert!(constant_of_shape(&big, None).is_err());
        assert!(constant_of_shape(&[DimExpr::constant(-2)], None).is_err());
        let r = range(&ints(vec![], &[0]), &ints(vec![], &[i64::MAX]), &ints(vec![], &[1]));
        assert!(r.unwrap_err().contains("too large"));
    }
}
