//! The op table of the elementwise functions: for each unary and binary op, everything that
//! differs between them in one row (its name in the DSL and in dumps, its semantics in f64
//! for constant folding and in f32 for the reference interpreter, its host C and Ascend C
//! spellings, and what it costs), read by the front end, the reference interpreter, both code
//! generators and the cost model. Adding an elementwise op is adding a variant and its row.
//!
//! Spellings are templates: `{x}` and `{y}` are the operands; in Ascend C vector sequences
//! `{dst}` is the destination UB tensor, `{n}` the element count, and `ta`, `tb`, `tc` are
//! scratch UB tensors of the same length that the generator provides.

use crate::ir::{BinaryOp, DType, UnaryOp};

/// One unary function.
pub struct UnarySpec {
    pub op: UnaryOp,
    pub name: &'static str,
    /// Semantics in f64 (constant folding).
    pub f64: fn(f64) -> f64,
    /// Semantics in f32: what the reference interpreter computes.
    pub f32: fn(f32) -> f32,
    /// Host C expression (helpers of `include/autofusion/host.h`).
    pub c: &'static str,
    /// Ascend C scalar expression (helpers taking the scalar scratch `sc`).
    pub ascend_scalar: &'static str,
    /// Ascend C vector sequence, one statement per line (count form).
    pub ascend_vector: &'static [&'static str],
    /// Vector-unit FLOPs per element (the cost model), and whether it is evaluated by a
    /// polynomial or library function (priced at the target's transcendental rate).
    pub flops: f64,
    pub transcendental: bool,
    /// The values the op takes.
    pub domain: Domain,
    /// Semantics on integers and truth values (computed in i64), where the domain admits them.
    pub i64: Option<fn(i64) -> i64>,
    /// Host C expression on `int64_t` values (`""` where the domain admits no integers).
    pub c_int: &'static str,
}

/// One binary function.
pub struct BinarySpec {
    pub op: BinaryOp,
    pub name: &'static str,
    pub f64: fn(f64, f64) -> f64,
    pub f32: fn(f32, f32) -> f32,
    pub c: &'static str,
    pub ascend_scalar: &'static str,
    /// The Ascend C vector API on two tensors (`Add`), if there is one.
    pub ascend_vv: Option<&'static str>,
    /// The Ascend C vector API on a tensor and a scalar, either order (`Adds`), if the op is
    /// commutative and there is one.
    pub ascend_vs: Option<&'static str>,
    pub flops: f64,
    pub transcendental: bool,
    pub domain: Domain,
    pub i64: Option<fn(i64, i64) -> i64>,
    pub c_int: &'static str,
}

/// The values an elementwise op takes, and the type of its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// Floating-point values (transcendental functions, pow); the result has their type.
    Float,
    /// Floats or integers (not `bool`); the result has their type.
    Numeric,
    /// `bool` values; a `bool` result.
    Logical,
    /// Values of any one type; a `bool` result.
    Compare,
}

impl Domain {
    pub fn admits(self, d: DType) -> bool {
        match self {
            Domain::Float => d.is_float(),
            Domain::Numeric => d != DType::Bool,
            Domain::Logical => d == DType::Bool,
            Domain::Compare => true,
        }
    }
    /// The result's type for operands of type `d`.
    pub fn result(self, d: DType) -> DType {
        match self {
            Domain::Float | Domain::Numeric => d,
            Domain::Logical | Domain::Compare => DType::Bool,
        }
    }
    pub fn describe(self) -> &'static str {
        match self {
            Domain::Float => "floating-point values",
            Domain::Numeric => "numbers (floating-point or integer, not bool)",
            Domain::Logical => "bool values",
            Domain::Compare => "two values of one type",
        }
    }
    /// How to get a value the op takes.
    pub fn hint(self) -> Option<&'static str> {
        match self {
            Domain::Float => Some("convert it first: `cast(x, f32)`"),
            Domain::Numeric => Some("convert it first: `cast(x, i64)` or `cast(x, f32)`"),
            Domain::Logical => Some("compare first (`eq`, `lt`, ...) or `cast(x, bool)`"),
            Domain::Compare => None,
        }
    }
}

/// Integer division as the kernels compute it: truncated toward zero (C, ONNX), wrapping at
/// `i64::MIN / -1`; division by zero gives 0 rather than a trap.
pub fn div_i64(a: i64, b: i64) -> i64 {
    if b == 0 {
        0
    } else {
        a.wrapping_div(b)
    }
}

/// A truth value as a number.
fn truth(b: bool) -> f64 {
    b as u8 as f64
}

/// erf with |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit), enough for folding.
fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

// The f32 semantics of the reference interpreter: what fused kernels are checked against.
fn sigmoid32(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}
fn gelu32(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}
fn gelu_tanh32(x: f32) -> f32 {
    0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
}

/// erf(z) for z >= 0 on the vector unit, Abramowitz-Stegun 7.1.26 (|error| <= 1.5e-7): with
/// `ta` = the argument's magnitude before scaling and `tb` = p z (p = 0.3275911), leaves
/// erf(z) in `tc`; `$sq` scales ta^2 to -z^2 (-1 when z = ta, -1/2 when z = ta / sqrt 2).
macro_rules! erf_7_1_26_vec {
    ($sq:literal) => {
        [
            "AscendC::Adds(tb, tb, 1.0f, {n});",
            "AscendC::Duplicate(tc, 1.0f, {n});",
            "AscendC::Div(tb, tc, tb, {n}); /* t */",
            "AscendC::Muls(tc, tb, 1.061405429f, {n});",
            "AscendC::Adds(tc, tc, -1.453152027f, {n});",
            "AscendC::Mul(tc, tc, tb, {n});",
            "AscendC::Adds(tc, tc, 1.421413741f, {n});",
            "AscendC::Mul(tc, tc, tb, {n});",
            "AscendC::Adds(tc, tc, -0.284496736f, {n});",
            "AscendC::Mul(tc, tc, tb, {n});",
            "AscendC::Adds(tc, tc, 0.254829592f, {n});",
            "AscendC::Mul(tc, tc, tb, {n});",
            "AscendC::Mul(tb, ta, ta, {n});",
            concat!("AscendC::Muls(tb, tb, ", $sq, ", {n});"),
            "AscendC::Exp(tb, tb, {n});",
            "AscendC::Mul(tc, tc, tb, {n});",
            "AscendC::Muls(tc, tc, -1.0f, {n});",
            "AscendC::Adds(tc, tc, 1.0f, {n}); /* erf */",
        ]
    };
}

/// x reduced by 2 pi on the vector unit (as `af_reduce_2pi` of the headers): `tb` = r in
/// [-pi, pi], `tc` = r^2; k = round(x / 2 pi) by the 1.5 * 2^23 rounding trick, 2 pi in two
/// parts so that k * 6.28125 is exact.
macro_rules! reduce_2pi_vec {
    () => {
        [
            "AscendC::Muls(ta, {x}, 0.15915494309189535f, {n});",
            "AscendC::Adds(ta, ta, 12582912.0f, {n});",
            "AscendC::Adds(ta, ta, -12582912.0f, {n}); /* k = round(x / 2 pi) */",
            "AscendC::Muls(tb, ta, -6.28125f, {n});",
            "AscendC::Add(tb, tb, {x}, {n});",
            "AscendC::Muls(ta, ta, -1.9353071795864769e-3f, {n});",
            "AscendC::Add(tb, tb, ta, {n}); /* r */",
            "AscendC::Mul(tc, tb, tb, {n}); /* r^2 */",
        ]
    };
}

/// sin: the reduction, then r (1 + r^2 (-1/3! + r^2 (1/5! + ... - r^2 / 15!))).
const SIN_VEC: &[&str] = &concat_arrays::<8, 16, 24>(
    reduce_2pi_vec!(),
    [
        "AscendC::Duplicate({dst}, -7.6471637318198164e-13f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 1.6059043836821613e-10f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -2.5052108385441720e-8f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 2.7557319223985893e-6f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -1.9841269841269841e-4f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 8.3333333333333332e-3f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -1.6666666666666666e-1f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 1.0f, {n});",
        "AscendC::Mul({dst}, {dst}, tb, {n});",
    ],
);

/// cos: the reduction, then 1 + r^2 (-1/2 + r^2 (1/4! + ... + r^2 / 16!)).
const COS_VEC: &[&str] = &concat_arrays::<8, 17, 25>(
    reduce_2pi_vec!(),
    [
        "AscendC::Duplicate({dst}, 4.7794773323873853e-14f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -1.1470745597729725e-11f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 2.0876756987868099e-9f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -2.7557319223985888e-7f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 2.4801587301587302e-5f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -1.3888888888888889e-3f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 4.1666666666666664e-2f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, -0.5f, {n});",
        "AscendC::Mul({dst}, {dst}, tc, {n});",
        "AscendC::Adds({dst}, {dst}, 1.0f, {n});",
    ],
);

/// `a` then `b`, at compile time.
const fn concat_arrays<const A: usize, const B: usize, const N: usize>(
    a: [&'static str; A],
    b: [&'static str; B],
) -> [&'static str; N] {
    assert!(A + B == N, "concat_arrays: N must be A + B");
    let mut out = [""; N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

/// Sigmoid on the vector unit: 1 / (1 + e^-x).
const SIGMOID_VEC: &[&str] = &[
    "AscendC::Muls({dst}, {x}, -1.0f, {n});",
    "AscendC::Exp({dst}, {dst}, {n});",
    "AscendC::Adds({dst}, {dst}, 1.0f, {n});",
    "AscendC::Duplicate(tc, 1.0f, {n});",
    "AscendC::Div({dst}, tc, {dst}, {n});",
];

/// The unary table, in `UnaryOp` declaration order (`UnaryOp::spec` indexes it).
pub const UNARY: [UnarySpec; 15] = [
    UnarySpec {
        op: UnaryOp::Neg,
        name: "neg",
        f64: |x| -x,
        f32: |x| -x,
        c: "(-{x})",
        ascend_scalar: "(-{x})",
        ascend_vector: &["AscendC::Muls({dst}, {x}, -1.0f, {n});"],
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(i64::wrapping_neg),
        c_int: "af_ineg({x})",
    },
    UnarySpec {
        op: UnaryOp::Exp,
        name: "exp",
        f64: f64::exp,
        f32: f32::exp,
        c: "af_expf({x})",
        ascend_scalar: "af_s_exp(sc, {x})",
        ascend_vector: &["AscendC::Exp({dst}, {x}, {n});"],
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Log,
        name: "log",
        f64: f64::ln,
        f32: f32::ln,
        c: "logf({x})",
        ascend_scalar: "af_s_ln(sc, {x})",
        ascend_vector: &["AscendC::Ln({dst}, {x}, {n});"],
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Sqrt,
        name: "sqrt",
        f64: f64::sqrt,
        f32: f32::sqrt,
        c: "sqrtf({x})",
        ascend_scalar: "af_s_sqrt(sc, {x})",
        ascend_vector: &["AscendC::Sqrt({dst}, {x}, {n});"],
        flops: 4.0,
        transcendental: false,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Rsqrt,
        name: "rsqrt",
        f64: |x| 1.0 / x.sqrt(),
        f32: |x| 1.0 / x.sqrt(),
        c: "(1.0f / sqrtf({x}))",
        ascend_scalar: "(1.0f / af_s_sqrt(sc, {x}))",
        // Ascend C's Rsqrt misses 1e-4 relative on float: Sqrt, then 1 / x with Div.
        ascend_vector: &[
            "AscendC::Sqrt({dst}, {x}, {n});",
            "AscendC::Duplicate(tc, 1.0f, {n});",
            "AscendC::Div({dst}, tc, {dst}, {n});",
        ],
        flops: 4.0,
        transcendental: false,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Tanh,
        name: "tanh",
        f64: f64::tanh,
        f32: f32::tanh,
        c: "af_tanhf({x})",
        ascend_scalar: "af_s_tanh(sc, {x})",
        // tanh x = 2 / (1 + e^(-2x)) - 1: saturates to +-1 without inf - inf.
        ascend_vector: &[
            "AscendC::Muls({dst}, {x}, -2.0f, {n});",
            "AscendC::Exp({dst}, {dst}, {n});",
            "AscendC::Adds({dst}, {dst}, 1.0f, {n});",
            "AscendC::Duplicate(tc, 2.0f, {n});",
            "AscendC::Div({dst}, tc, {dst}, {n});",
            "AscendC::Adds({dst}, {dst}, -1.0f, {n});",
        ],
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Sigmoid,
        name: "sigmoid",
        f64: |x| 1.0 / (1.0 + (-x).exp()),
        f32: sigmoid32,
        c: "af_sigmoid({x})",
        ascend_scalar: "af_s_sigmoid(sc, {x})",
        ascend_vector: SIGMOID_VEC,
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Relu,
        name: "relu",
        f64: |x| x.max(0.0),
        f32: |x| x.max(0.0),
        c: "af_fmax({x}, 0.0f)",
        ascend_scalar: "({x} > 0.0f ? {x} : 0.0f)",
        ascend_vector: &["AscendC::Relu({dst}, {x}, {n});"],
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(|x| x.max(0)),
        c_int: "af_imax({x}, 0)",
    },
    UnarySpec {
        op: UnaryOp::Gelu,
        name: "gelu",
        f64: |x| 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        f32: gelu32,
        c: "af_gelu({x})",
        ascend_scalar: "(0.5f * {x} * (1.0f + af_s_erf(sc, {x} * 0.70710678f)))",
        // 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x + 0.5 |x| erf(|x| / sqrt 2), erf by
        // Abramowitz-Stegun 7.1.26 (|error| <= 1.5e-7) on Exp.
        ascend_vector: &concat_arrays::<20, 3, 23>(
            concat_arrays::<2, 18, 20>(
                [
                    "AscendC::Abs(ta, {x}, {n});",
                    "AscendC::Muls(tb, ta, 0.231641900f, {n}); /* p / sqrt 2 */",
                ],
                erf_7_1_26_vec!("-0.5f"),
            ),
            [
                "AscendC::Mul(tc, tc, ta, {n});",
                "AscendC::Add({dst}, tc, {x}, {n});",
                "AscendC::Muls({dst}, {dst}, 0.5f, {n});",
            ],
        ),
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::GeluTanh,
        name: "gelu_tanh",
        f64: |x| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        },
        f32: gelu_tanh32,
        c: "af_gelu_tanh({x})",
        ascend_scalar: "(0.5f * {x} * (1.0f + af_s_tanh(sc, 0.7978845608f * ({x} + 0.044715f * {x} * {x} * {x}))))",
        // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
        ascend_vector: &[
            "AscendC::Mul(ta, {x}, {x}, {n});",
            "AscendC::Mul(ta, ta, {x}, {n});",
            "AscendC::Muls(ta, ta, 0.044715f, {n});",
            "AscendC::Add(ta, ta, {x}, {n});",
            "AscendC::Muls(ta, ta, -1.595769122f, {n}); /* -2 sqrt(2 / pi) */",
            "AscendC::Exp(ta, ta, {n});",
            "AscendC::Adds(ta, ta, 1.0f, {n});",
            "AscendC::Duplicate(tc, 2.0f, {n});",
            "AscendC::Div(ta, tc, ta, {n}); /* 1 + tanh */",
            "AscendC::Mul({dst}, ta, {x}, {n});",
            "AscendC::Muls({dst}, {dst}, 0.5f, {n});",
        ],
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Silu,
        name: "silu",
        f64: |x| x / (1.0 + (-x).exp()),
        f32: |x| x / (1.0 + (-x).exp()),
        c: "af_silu({x})",
        ascend_scalar: "({x} * af_s_sigmoid(sc, {x}))",
        ascend_vector: &[
            "AscendC::Muls({dst}, {x}, -1.0f, {n});",
            "AscendC::Exp({dst}, {dst}, {n});",
            "AscendC::Adds({dst}, {dst}, 1.0f, {n});",
            "AscendC::Duplicate(tc, 1.0f, {n});",
            "AscendC::Div({dst}, tc, {dst}, {n});",
            "AscendC::Mul({dst}, {dst}, {x}, {n});",
        ],
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Erf,
        name: "erf",
        f64: erf,
        f32: libm::erff,
        c: "af_erff({x})",
        ascend_scalar: "af_s_erf(sc, {x})",
        // sign(x) erf(|x|), erf(|x|) = 1 - t (a1 + t (a2 + ...)) e^(-x^2) with t = 1 / (1 + p |x|)
        // (Abramowitz-Stegun 7.1.26, |error| <= 1.5e-7). The sign is x / max(|x|, 1e-30) of x
        // clamped to +-1e30 (so +-1 at the infinities, 0 at 0), |x| clamped to 10 (erf is 1
        // there in f32).
        ascend_vector: &concat_arrays::<26, 1, 27>(
            concat_arrays::<8, 18, 26>(
                [
                    "AscendC::Maxs({dst}, {x}, -1e30f, {n});",
                    "AscendC::Mins({dst}, {dst}, 1e30f, {n});",
                    "AscendC::Abs(ta, {dst}, {n});",
                    "AscendC::Maxs(ta, ta, 1e-30f, {n});",
                    "AscendC::Div({dst}, {dst}, ta, {n}); /* sign(x) */",
                    "AscendC::Abs(ta, {x}, {n});",
                    "AscendC::Mins(ta, ta, 10.0f, {n});",
                    "AscendC::Muls(tb, ta, 0.3275911f, {n});",
                ],
                erf_7_1_26_vec!("-1.0f"),
            ),
            ["AscendC::Mul({dst}, {dst}, tc, {n});"],
        ),
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Sin,
        name: "sin",
        f64: f64::sin,
        f32: f32::sin,
        c: "af_sinf({x})",
        ascend_scalar: "af_s_sin({x})",
        ascend_vector: SIN_VEC,
        flops: 20.0,
        transcendental: false,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Cos,
        name: "cos",
        f64: f64::cos,
        f32: f32::cos,
        c: "af_cosf({x})",
        ascend_scalar: "af_s_cos({x})",
        ascend_vector: COS_VEC,
        flops: 21.0,
        transcendental: false,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    UnarySpec {
        op: UnaryOp::Not,
        name: "not",
        f64: |x| truth(x == 0.0),
        f32: |x| truth(x == 0.0) as f32,
        c: "(!{x})",
        // Truth values are 0.0 / 1.0 in the Ascend kernels' f32 lanes: not x = 1 - x.
        ascend_scalar: "(1.0f - {x})",
        ascend_vector: &[
            "AscendC::Muls({dst}, {x}, -1.0f, {n});",
            "AscendC::Adds({dst}, {dst}, 1.0f, {n});",
        ],
        flops: 1.0,
        transcendental: false,
        domain: Domain::Logical,
        i64: Some(|x| (x == 0) as i64),
        c_int: "(!{x})",
    },
];

/// The binary table, in `BinaryOp` declaration order (`BinaryOp::spec` indexes it).
pub const BINARY: [BinarySpec; 14] = [
    BinarySpec {
        op: BinaryOp::Add,
        name: "add",
        f64: |a, b| a + b,
        f32: |a, b| a + b,
        c: "({x} + {y})",
        ascend_scalar: "({x} + {y})",
        ascend_vv: Some("Add"),
        ascend_vs: Some("Adds"),
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(i64::wrapping_add),
        c_int: "af_iadd({x}, {y})",
    },
    BinarySpec {
        op: BinaryOp::Sub,
        name: "sub",
        f64: |a, b| a - b,
        f32: |a, b| a - b,
        c: "({x} - {y})",
        ascend_scalar: "({x} - {y})",
        ascend_vv: Some("Sub"),
        ascend_vs: None,
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(i64::wrapping_sub),
        c_int: "af_isub({x}, {y})",
    },
    BinarySpec {
        op: BinaryOp::Mul,
        name: "mul",
        f64: |a, b| a * b,
        f32: |a, b| a * b,
        c: "({x} * {y})",
        ascend_scalar: "({x} * {y})",
        ascend_vv: Some("Mul"),
        ascend_vs: Some("Muls"),
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(i64::wrapping_mul),
        c_int: "af_imul({x}, {y})",
    },
    BinarySpec {
        op: BinaryOp::Div,
        name: "div",
        f64: |a, b| a / b,
        f32: |a, b| a / b,
        c: "({x} / {y})",
        ascend_scalar: "({x} / {y})",
        ascend_vv: Some("Div"),
        ascend_vs: None,
        flops: 2.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(div_i64),
        c_int: "af_idiv({x}, {y})",
    },
    BinarySpec {
        op: BinaryOp::Pow,
        name: "pow",
        f64: f64::powf,
        f32: f32::powf,
        c: "powf({x}, {y})",
        // a^b = exp(b ln a): the vector unit has no pow (a > 0).
        ascend_scalar: "af_s_exp(sc, {y} * af_s_ln(sc, {x}))",
        ascend_vv: None,
        ascend_vs: None,
        flops: 2.0,
        transcendental: true,
        domain: Domain::Float,
        i64: None,
        c_int: "",
    },
    BinarySpec {
        op: BinaryOp::Max,
        name: "max",
        f64: f64::max,
        f32: f32::max,
        c: "af_fmax({x}, {y})",
        ascend_scalar: "({x} > {y} ? {x} : {y})",
        ascend_vv: Some("Max"),
        ascend_vs: Some("Maxs"),
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(i64::max),
        c_int: "af_imax({x}, {y})",
    },
    BinarySpec {
        op: BinaryOp::Min,
        name: "min",
        f64: f64::min,
        f32: f32::min,
        c: "af_fmin({x}, {y})",
        ascend_scalar: "({x} < {y} ? {x} : {y})",
        ascend_vv: Some("Min"),
        ascend_vs: Some("Mins"),
        flops: 1.0,
        transcendental: false,
        domain: Domain::Numeric,
        i64: Some(i64::min),
        c_int: "af_imin({x}, {y})",
    },
    BinarySpec {
        op: BinaryOp::And,
        name: "and",
        f64: |a, b| truth(a != 0.0 && b != 0.0),
        f32: |a, b| truth(a != 0.0 && b != 0.0) as f32,
        c: "({x} & {y})",
        // On 0.0 / 1.0 lanes: and = min, or = max.
        ascend_scalar: "({x} < {y} ? {x} : {y})",
        ascend_vv: Some("Min"),
        ascend_vs: Some("Mins"),
        flops: 1.0,
        transcendental: false,
        domain: Domain::Logical,
        i64: Some(|a, b| a & b),
        c_int: "({x} & {y})",
    },
    BinarySpec {
        op: BinaryOp::Or,
        name: "or",
        f64: |a, b| truth(a != 0.0 || b != 0.0),
        f32: |a, b| truth(a != 0.0 || b != 0.0) as f32,
        c: "({x} | {y})",
        ascend_scalar: "({x} > {y} ? {x} : {y})",
        ascend_vv: Some("Max"),
        ascend_vs: Some("Maxs"),
        flops: 1.0,
        transcendental: false,
        domain: Domain::Logical,
        i64: Some(|a, b| a | b),
        c_int: "({x} | {y})",
    },
    BinarySpec {
        op: BinaryOp::Eq,
        name: "eq",
        f64: |a, b| truth(a == b),
        f32: |a, b| truth(a == b) as f32,
        c: "({x} == {y})",
        ascend_scalar: "({x} == {y} ? 1.0f : 0.0f)",
        // Vector sequences: `codegen::ascend::vector::compare_seq`.
        ascend_vv: None,
        ascend_vs: None,
        flops: 1.0,
        transcendental: false,
        domain: Domain::Compare,
        i64: Some(|a, b| (a == b) as i64),
        c_int: "({x} == {y})",
    },
    BinarySpec {
        op: BinaryOp::Lt,
        name: "lt",
        f64: |a, b| truth(a < b),
        f32: |a, b| truth(a < b) as f32,
        c: "({x} < {y})",
        ascend_scalar: "({x} < {y} ? 1.0f : 0.0f)",
        // Vector sequences: `codegen::ascend::vector::compare_seq`.
        ascend_vv: None,
        ascend_vs: None,
        flops: 1.0,
        transcendental: false,
        domain: Domain::Compare,
        i64: Some(|a, b| (a < b) as i64),
        c_int: "({x} < {y})",
    },
    BinarySpec {
        op: BinaryOp::Le,
        name: "le",
        f64: |a, b| truth(a <= b),
        f32: |a, b| truth(a <= b) as f32,
        c: "({x} <= {y})",
        ascend_scalar: "({x} <= {y} ? 1.0f : 0.0f)",
        // Vector sequences: `codegen::ascend::vector::compare_seq`.
        ascend_vv: None,
        ascend_vs: None,
        flops: 1.0,
        transcendental: false,
        domain: Domain::Compare,
        i64: Some(|a, b| (a <= b) as i64),
        c_int: "({x} <= {y})",
    },
    BinarySpec {
        op: BinaryOp::Gt,
        name: "gt",
        f64: |a, b| truth(a > b),
        f32: |a, b| truth(a > b) as f32,
        c: "({x} > {y})",
        ascend_scalar: "({x} > {y} ? 1.0f : 0.0f)",
        // Vector sequences: `codegen::ascend::vector::compare_seq`.
        ascend_vv: None,
        ascend_vs: None,
        flops: 1.0,
        transcendental: false,
        domain: Domain::Compare,
        i64: Some(|a, b| (a > b) as i64),
        c_int: "({x} > {y})",
    },
    BinarySpec {
        op: BinaryOp::Ge,
        name: "ge",
        f64: |a, b| truth(a >= b),
        f32: |a, b| truth(a >= b) as f32,
        c: "({x} >= {y})",
        ascend_scalar: "({x} >= {y} ? 1.0f : 0.0f)",
        // Vector sequences: `codegen::ascend::vector::compare_seq`.
        ascend_vv: None,
        ascend_vs: None,
        flops: 1.0,
        transcendental: false,
        domain: Domain::Compare,
        i64: Some(|a, b| (a >= b) as i64),
        c_int: "({x} >= {y})",
    },
];

impl UnaryOp {
    /// This op's row of the table.
    pub fn spec(self) -> &'static UnarySpec {
        &UNARY[self as usize]
    }
}

impl BinaryOp {
    /// This op's row of the table.
    pub fn spec(self) -> &'static BinarySpec {
        &BINARY[self as usize]
    }
}

/// Fill a spelling template: `{x}`, `{y}`, `{dst}`, `{n}` replaced by the given strings.
pub fn fill(template: &str, subs: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    'scan: while let Some(i) = rest.find('{') {
        out.push_str(&rest[..i]);
        for (key, val) in subs {
            let k = &rest[i + 1..];
            if k.starts_with(key) && k[key.len()..].starts_with('}') {
                out.push_str(val);
                rest = &k[key.len() + 1..];
                continue 'scan;
            }
        }
        out.push('{');
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_in_declaration_order() {
        for (i, u) in UnaryOp::ALL.iter().enumerate() {
            assert_eq!(UNARY[i].op, *u, "UNARY[{i}]");
        }
        for (i, b) in BinaryOp::ALL.iter().enumerate() {
            assert_eq!(BINARY[i].op, *b, "BINARY[{i}]");
        }
    }

    #[test]
    fn f32_and_f64_semantics_agree() {
        for u in UnaryOp::ALL {
            let s = u.spec();
            for x in [-3.0f32, -0.5, 0.25, 1.0, 2.5] {
                if matches!(u, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt) && x <= 0.0 {
                    continue;
                }
                let (a, b) = ((s.f32)(x) as f64, (s.f64)(x as f64));
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{} at {x}: {a} vs {b}", s.name);
            }
        }
        for b in BinaryOp::ALL {
            let s = b.spec();
            let (x, y) = (1.5f32, 0.75f32);
            let (p, q) = ((s.f32)(x, y) as f64, (s.f64)(x as f64, y as f64));
            assert!((p - q).abs() <= 1e-6 * q.abs().max(1.0), "{}: {p} vs {q}", s.name);
        }
    }

    #[test]
    fn templates_fill_every_placeholder() {
        assert_eq!(fill("({x} + {y})", &[("x", "a[i]"), ("y", "1.0f")]), "(a[i] + 1.0f)");
        assert_eq!(fill("{dst} {q} {n}", &[("dst", "d"), ("n", "64")]), "d {q} 64");
        for u in UnaryOp::ALL {
            let s = u.spec();
            let subs = [("x", "X"), ("dst", "D"), ("n", "N")];
            for t in [s.c, s.c_int, s.ascend_scalar].iter().chain(s.ascend_vector) {
                assert!(!fill(t, &subs).contains('{'), "{}: {t}", s.name);
            }
        }
    }
}
