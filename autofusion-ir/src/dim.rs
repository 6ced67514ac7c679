//! Dimension expressions: polynomials with rational coefficients over dim symbols.
//!
//! Static dims (`dims(D = 1024)`) are substituted by their values when a graph is lowered, so the
//! symbols left in an expression are the dynamic dims (`S`), bound at run time. Products and
//! quotients of dims are monomials; sums (from `concat`) make polynomials.

use std::collections::BTreeMap;
use std::fmt;

/// A rational number in lowest terms with a positive denominator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ratio {
    pub num: i64,
    pub den: i64,
}

fn gcd(a: i64, b: i64) -> i64 {
    let (mut a, mut b) = (a.abs(), b.abs());
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a.max(1)
}

impl Ratio {
    pub fn new(num: i64, den: i64) -> Ratio {
        assert!(den != 0, "zero denominator");
        let g = gcd(num, den);
        let s = if den < 0 { -1 } else { 1 };
        Ratio { num: s * num / g, den: s * den / g }
    }
    pub fn int(v: i64) -> Ratio {
        Ratio { num: v, den: 1 }
    }
    pub fn is_zero(self) -> bool {
        self.num == 0
    }
    fn mul(self, o: Ratio) -> Ratio {
        Ratio::new(self.num * o.num, self.den * o.den)
    }
    fn add(self, o: Ratio) -> Ratio {
        Ratio::new(self.num * o.den + o.num * self.den, self.den * o.den)
    }
}

/// A product of symbols with positive integer exponents, sorted by name (empty = the constant 1).
pub type Monomial = Vec<(String, u32)>;

/// A dimension expression. Equality is structural on the normal form, so `D / H * H == D`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DimExpr {
    /// monomial -> coefficient, zero coefficients removed.
    terms: BTreeMap<Monomial, Ratio>,
}

impl From<DimExpr> for Vec<(Monomial, Ratio)> {
    fn from(d: DimExpr) -> Self {
        d.terms.into_iter().collect()
    }
}

impl From<Vec<(Monomial, Ratio)>> for DimExpr {
    fn from(v: Vec<(Monomial, Ratio)>) -> Self {
        v.into_iter().fold(DimExpr::constant(0), |acc, (m, r)| {
            let mut terms = BTreeMap::new();
            terms.insert(m, r);
            acc.add(&DimExpr { terms })
        })
    }
}

/// A constant dim, for shapes written inline (`vec![s, 4.into()]`).
impl From<i64> for DimExpr {
    fn from(v: i64) -> DimExpr {
        DimExpr::constant(v)
    }
}

impl DimExpr {
    pub fn constant(v: i64) -> DimExpr {
        Self::from_ratio(Ratio::int(v))
    }
    fn from_ratio(r: Ratio) -> DimExpr {
        let mut terms = BTreeMap::new();
        if !r.is_zero() {
            terms.insert(Vec::new(), r);
        }
        DimExpr { terms }
    }
    pub fn sym(name: &str) -> DimExpr {
        let mut terms = BTreeMap::new();
        terms.insert(vec![(name.to_string(), 1)], Ratio::int(1));
        DimExpr { terms }
    }
    /// The value if the expression has no symbols and is an integer.
    pub fn as_const(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => {
                let (m, r) = self.terms.iter().next().unwrap();
                (m.is_empty() && r.den == 1).then_some(r.num)
            }
            _ => None,
        }
    }
    /// The symbol if the expression is exactly one symbol.
    pub fn as_sym(&self) -> Option<&str> {
        if self.terms.len() != 1 {
            return None;
        }
        let (m, r) = self.terms.iter().next().unwrap();
        (m.len() == 1 && m[0].1 == 1 && *r == Ratio::int(1)).then(|| m[0].0.as_str())
    }
    pub fn symbols(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.terms.keys().flat_map(|m| m.iter().map(|(s, _)| s.clone())).collect();
        v.sort();
        v.dedup();
        v
    }
    pub fn add(&self, o: &DimExpr) -> DimExpr {
        let mut terms = self.terms.clone();
        for (m, r) in &o.terms {
            let e = terms.entry(m.clone()).or_insert(Ratio::int(0));
            *e = e.add(*r);
            if e.is_zero() {
                terms.remove(m);
            }
        }
        DimExpr { terms }
    }
    pub fn sub(&self, o: &DimExpr) -> DimExpr {
        self.add(&o.scale(Ratio::int(-1)))
    }
    fn scale(&self, k: Ratio) -> DimExpr {
        if k.is_zero() {
            return DimExpr::constant(0);
        }
        let terms = self.terms.iter().map(|(m, r)| (m.clone(), r.mul(k))).collect();
        DimExpr { terms }
    }
    pub fn mul(&self, o: &DimExpr) -> DimExpr {
        let mut out = DimExpr::constant(0);
        for (ma, ra) in &self.terms {
            for (mb, rb) in &o.terms {
                let mut m: BTreeMap<String, u32> = BTreeMap::new();
                for (s, e) in ma.iter().chain(mb.iter()) {
                    *m.entry(s.clone()).or_insert(0) += e;
                }
                let mut terms = BTreeMap::new();
                terms.insert(m.into_iter().collect::<Vec<_>>(), ra.mul(*rb));
                out = out.add(&DimExpr { terms });
            }
        }
        out
    }
    /// Division by a non-zero constant (the only division the DSL allows on dynamic dims).
    pub fn div_const(&self, k: i64) -> Option<DimExpr> {
        (k != 0).then(|| self.scale(Ratio::new(1, k)))
    }
    /// Division by another expression when the quotient is exact in the normal form.
    pub fn div(&self, o: &DimExpr) -> Option<DimExpr> {
        if let Some(k) = o.as_const() {
            return self.div_const(k);
        }
        // o is a single monomial dividing every term.
        if o.terms.len() != 1 {
            return None;
        }
        let (mo, ro) = o.terms.iter().next().unwrap();
        let mut out = DimExpr::constant(0);
        for (m, r) in &self.terms {
            let mut mm: BTreeMap<String, u32> = m.iter().cloned().collect();
            for (s, e) in mo {
                let have = mm.get(s).copied().unwrap_or(0);
                if have < *e {
                    return None;
                }
                if have == *e {
                    mm.remove(s);
                } else {
                    mm.insert(s.clone(), have - e);
                }
            }
            let mut terms = BTreeMap::new();
            terms.insert(mm.into_iter().collect(), r.mul(Ratio::new(ro.den, ro.num)));
            out = out.add(&DimExpr { terms });
        }
        Some(out)
    }
    /// Evaluate with bound symbols; `Err` names an unbound symbol or a non-integer result.
    pub fn eval(&self, bind: &dyn Fn(&str) -> Option<i64>) -> Result<i64, String> {
        let mut num: i128 = 0;
        let mut den: i128 = 1;
        for (m, r) in &self.terms {
            let mut v: i128 = r.num as i128;
            for (s, e) in m {
                let x = bind(s).ok_or_else(|| format!("dim `{s}` is not bound"))? as i128;
                for _ in 0..*e {
                    v *= x;
                }
            }
            // num/den + v/r.den
            num = num * r.den as i128 + v * den;
            den *= r.den as i128;
        }
        if num % den != 0 {
            return Err(format!("`{self}` is not an integer for the bound dims"));
        }
        i64::try_from(num / den).map_err(|_| format!("`{self}` overflows"))
    }
    /// Value with every symbol replaced by `hint` (planning estimate for dynamic dims).
    pub fn estimate(&self, hint: &dyn Fn(&str) -> i64) -> i64 {
        self.eval(&|s| Some(hint(s))).unwrap_or_else(|_| {
            let mut acc = 0f64;
            for (m, r) in &self.terms {
                let mut v = r.num as f64 / r.den as f64;
                for (s, e) in m {
                    v *= (hint(s) as f64).powi(*e as i32);
                }
                acc += v;
            }
            acc.round() as i64
        })
    }
    /// A C expression computing the value from `dims[i]` (symbol index from `index`).
    pub fn to_c(&self, index: &dyn Fn(&str) -> usize) -> String {
        if self.terms.is_empty() {
            return "0".into();
        }
        let den = self.terms.values().fold(1i64, |a, r| a / gcd(a, r.den) * r.den);
        let mut parts = Vec::new();
        for (m, r) in &self.terms {
            let k = r.num * (den / r.den);
            let mut f = vec![format!("(int64_t){k}")];
            for (s, e) in m {
                for _ in 0..*e {
                    f.push(format!("dims[{}]", index(s)));
                }
            }
            parts.push(f.join(" * "));
        }
        let sum = parts.join(" + ");
        if den == 1 {
            format!("({sum})")
        } else {
            format!("(({sum}) / {den})")
        }
    }
}

impl fmt::Display for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "0");
        }
        let mut first = true;
        for (m, r) in &self.terms {
            let neg = r.num < 0;
            if !first {
                write!(f, "{}", if neg { " - " } else { " + " })?;
            } else if neg {
                write!(f, "-")?;
            }
            first = false;
            let n = r.num.abs();
            let mut fac: Vec<String> = Vec::new();
            if n != 1 || m.is_empty() {
                fac.push(n.to_string());
            }
            for (s, e) in m {
                for _ in 0..*e {
                    fac.push(s.clone());
                }
            }
            write!(f, "{}", fac.join("*"))?;
            if r.den != 1 {
                write!(f, "/{}", r.den)?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for DimExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// A shape: one expression per axis, outermost first.
pub type Shape = Vec<DimExpr>;

/// `[S, 512]` style rendering used by diagnostics and the IR dump.
pub fn shape_str(s: &[DimExpr]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// Product of all axes.
pub fn numel(s: &[DimExpr]) -> DimExpr {
    s.iter().fold(DimExpr::constant(1), |a, d| a.mul(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_form_makes_equal_expressions_equal() {
        let s = DimExpr::sym("S");
        let d = DimExpr::constant(512);
        let e = s.mul(&d).div_const(8).unwrap();
        assert_eq!(e.to_string(), "64*S");
        assert_eq!(e.mul(&DimExpr::constant(8)), s.mul(&d));
        assert_eq!(s.add(&s).sub(&s), s);
        assert_eq!(s.mul(&s).div(&s).unwrap(), s);
        assert!(s.div(&s.mul(&s)).is_none());
    }

    #[test]
    fn eval_checks_integrality_and_binding() {
        let e = DimExpr::sym("S").div_const(2).unwrap();
        assert_eq!(e.eval(&|_| Some(8)), Ok(4));
        assert!(e.eval(&|_| Some(7)).unwrap_err().contains("not an integer"));
        assert!(e.eval(&|_| None).unwrap_err().contains("`S` is not bound"));
        assert_eq!(e.to_string(), "S/2");
        assert_eq!(e.to_c(&|_| 3), "(((int64_t)1 * dims[3]) / 2)");
    }
}
