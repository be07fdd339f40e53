//! Tensor dimensions: known integers or symbolic expressions over named dims (`N`, `seq`).
//!
//! A symbolic dim is kept as a polynomial with integer coefficients in normal form (sorted
//! monomials, no zero terms), so `N*3*4` and `12*N` are equal and a batch dim `N` stays `N`
//! through reshapes that multiply and divide it. Operations that leave the polynomial ring
//! (division that is not exact, min/max) produce an opaque symbol whose name spells the
//! expression, so equal expressions still compare equal.

use serde::{Serialize, Serializer};
use std::collections::BTreeMap;
use std::fmt;

/// Name of the marker symbol of `Dim::data_dependent`.
const DATA_DEPENDENT: &str = "?";

/// A product of symbols, e.g. `N*S`, kept sorted. The empty product is the constant term.
type Monomial = Vec<String>;

#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dim {
    terms: BTreeMap<Monomial, i64>,
}

impl Dim {
    pub fn known(v: i64) -> Dim {
        let mut terms = BTreeMap::new();
        if v != 0 {
            terms.insert(Vec::new(), v);
        }
        Dim { terms }
    }

    pub fn sym(name: impl Into<String>) -> Dim {
        let mut terms = BTreeMap::new();
        terms.insert(vec![name.into()], 1);
        Dim { terms }
    }

    /// A dim that depends on run-time data (e.g. `Expand` to a shape read from a graph input).
    /// Ops return it from `infer`; the inference driver replaces it with a fresh symbol named
    /// after the value and axis (`y:0`), which the reference executor binds when it runs.
    /// Code generation rejects graphs that still hold such symbols.
    pub fn data_dependent() -> Dim {
        Dim::sym(DATA_DEPENDENT)
    }

    pub fn is_data_dependent_marker(&self) -> bool {
        *self == Dim::data_dependent()
    }

    /// The value when the dim has no symbols.
    pub fn as_known(&self) -> Option<i64> {
        match self.terms.len() {
            0 => Some(0),
            1 => self.terms.get(&Vec::new()).copied(),
            _ => None,
        }
    }

    pub fn is_known(&self) -> bool {
        self.as_known().is_some()
    }

    /// Symbols this dim depends on.
    pub fn symbols(&self) -> impl Iterator<Item = &str> {
        self.terms.keys().flat_map(|m| m.iter().map(String::as_str))
    }

    /// The polynomial's terms: (sorted product of symbols, coefficient); the constant term has
    /// an empty product. Code generation renders dims from these as C++ expressions.
    pub fn terms(&self) -> impl Iterator<Item = (&[String], i64)> {
        self.terms.iter().map(|(m, c)| (m.as_slice(), *c))
    }

    /// Substitutes symbol values; symbols missing from `env` stay symbolic.
    pub fn eval(&self, env: &BTreeMap<String, i64>) -> Dim {
        let mut out = Dim::known(0);
        for (mono, coeff) in &self.terms {
            let mut term = Dim::known(*coeff);
            for s in mono {
                let f = match env.get(s) {
                    Some(v) => Dim::known(*v),
                    None => Dim::sym(s.clone()),
                };
                term = term.mul(&f);
            }
            out = out.add(&term);
        }
        out
    }

    /// The dim standing for an arithmetic result that does not fit in i64 (only malformed
    /// models get there); it stays symbolic, so no kernel is ever sized from a wrapped value.
    fn overflow() -> Dim {
        Dim::sym("overflow")
    }

    pub fn add(&self, other: &Dim) -> Dim {
        let mut terms = self.terms.clone();
        for (m, c) in &other.terms {
            let e = terms.entry(m.clone()).or_insert(0);
            let Some(sum) = e.checked_add(*c) else { return Dim::overflow() };
            *e = sum;
            if *e == 0 {
                terms.remove(m);
            }
        }
        Dim { terms }
    }

    pub fn neg(&self) -> Dim {
        let mut terms = BTreeMap::new();
        for (m, c) in &self.terms {
            let Some(n) = c.checked_neg() else { return Dim::overflow() };
            terms.insert(m.clone(), n);
        }
        Dim { terms }
    }

    pub fn sub(&self, other: &Dim) -> Dim {
        self.add(&other.neg())
    }

    pub fn mul(&self, other: &Dim) -> Dim {
        let mut out = Dim::known(0);
        for (ma, ca) in &self.terms {
            for (mb, cb) in &other.terms {
                let mut m: Monomial = ma.iter().chain(mb.iter()).cloned().collect();
                m.sort();
                let Some(c) = ca.checked_mul(*cb) else { return Dim::overflow() };
                let term = Dim { terms: BTreeMap::from([(m, c)]) };
                out = out.add(&term);
            }
        }
        out
    }

    /// Floor division. Exact when every coefficient divides (so `(6*N)/3 = 2*N`); otherwise
    /// an opaque symbol spelling the expression.
    pub fn div_floor(&self, d: &Dim) -> Dim {
        if let (Some(a), Some(b)) = (self.as_known(), d.as_known()) {
            if let Some(q) = a.checked_div_euclid(b) {
                return Dim::known(q);
            }
        }
        if let Some(b) = d.as_known() {
            if b != 0 && b != -1 && self.terms.values().all(|c| c % b == 0) {
                return Dim { terms: self.terms.iter().map(|(m, c)| (m.clone(), c / b)).collect() };
            }
        }
        // Exact division by a symbolic monomial factor, e.g. (N*S*768)/(N*S) = 768.
        if d.terms.len() == 1 {
            let (dm, dc) = d.terms.iter().next().unwrap();
            let mut out = BTreeMap::new();
            let mut exact = true;
            for (m, c) in &self.terms {
                let mut rest = m.clone();
                for s in dm {
                    match rest.iter().position(|x| x == s) {
                        Some(i) => {
                            rest.remove(i);
                        }
                        None => exact = false,
                    }
                }
                if !exact || *dc == 0 || *dc == -1 || c % dc != 0 {
                    exact = false;
                    break;
                }
                out.insert(rest, c / dc);
            }
            if exact {
                return Dim { terms: out };
            }
        }
        Dim::sym(format!("floor({}/{})", self.paren(), d.paren()))
    }

    /// Ceiling division, used by `auto_pad=SAME_*` and ceil-mode pooling.
    pub fn div_ceil(&self, d: &Dim) -> Dim {
        if let (Some(a), Some(b)) = (self.as_known(), d.as_known()) {
            if b > 0 {
                return a.checked_add(b - 1).map_or_else(Dim::overflow, |n| Dim::known(n.div_euclid(b)));
            }
        }
        let exact = self.div_floor(d);
        if exact.mul(d) == *self {
            return exact;
        }
        Dim::sym(format!("ceil({}/{})", self.paren(), d.paren()))
    }

    /// Named apart from `Ord::min`, which `Dim` also has (a total order for sorting, not by value).
    pub fn min_dim(&self, other: &Dim) -> Dim {
        match (self.as_known(), other.as_known()) {
            (Some(a), Some(b)) => Dim::known(a.min(b)),
            _ if self == other => self.clone(),
            _ => Dim::sym(format!("min({self},{other})")),
        }
    }

    pub fn max_dim(&self, other: &Dim) -> Dim {
        match (self.as_known(), other.as_known()) {
            (Some(a), Some(b)) => Dim::known(a.max(b)),
            _ if self == other => self.clone(),
            _ => Dim::sym(format!("max({self},{other})")),
        }
    }

    /// The least value the dim can take, when the polynomial bounds it: every symbol stands for
    /// a size (≥ 0), so a polynomial whose symbolic terms all have positive coefficients is at
    /// least its constant term. Lets inference decide comparisons such as `N == -1` (never),
    /// which PyTorch's shape subgraphs use to pick between a shape and `-1`.
    pub fn lower_bound(&self) -> Option<i64> {
        self.bound(1)
    }

    /// The greatest value, when bounded (every symbolic term has a negative coefficient).
    pub fn upper_bound(&self) -> Option<i64> {
        self.bound(-1)
    }

    /// The constant term when every symbolic term has a coefficient of sign `sign` and consists
    /// of symbols known to be non-negative.
    fn bound(&self, sign: i64) -> Option<i64> {
        let mut constant = 0;
        for (mono, coeff) in &self.terms {
            if mono.is_empty() {
                constant = *coeff;
            } else if coeff.signum() != sign || !mono.iter().all(|s| is_size_symbol(s)) {
                return None;
            }
        }
        Some(constant)
    }

    /// The least and greatest values over a box of symbol ranges (`lo..=hi` per symbol, every
    /// `lo ≥ 0`), by interval arithmetic: exact for polynomials whose terms all have one sign,
    /// conservative otherwise. `None` when a symbol has no range or the bound overflows i64.
    /// Memory planning sizes every tensor at the upper bound over the run-time dims' ranges.
    pub fn range_in(&self, ranges: &BTreeMap<String, (i64, i64)>) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (0i64, 0i64);
        for (mono, coeff) in &self.terms {
            let (mut mlo, mut mhi) = (1i64, 1i64);
            for s in mono {
                let &(a, b) = ranges.get(s)?;
                mlo = mlo.checked_mul(a)?;
                mhi = mhi.checked_mul(b)?;
            }
            let (tlo, thi) = if *coeff >= 0 {
                (mlo.checked_mul(*coeff)?, mhi.checked_mul(*coeff)?)
            } else {
                (mhi.checked_mul(*coeff)?, mlo.checked_mul(*coeff)?)
            };
            lo = lo.checked_add(tlo)?;
            hi = hi.checked_add(thi)?;
        }
        Some((lo, hi))
    }

    fn paren(&self) -> String {
        if self.terms.len() > 1 {
            format!("({self})")
        } else {
            self.to_string()
        }
    }
}

/// Whether a symbol stands for a non-negative number: a named dim (`N`, `unk__3`, `y:0`) is a
/// size; an opaque expression (`floor((H+1)/2)`, `max(N,S)`) is one when it is built from sizes
/// and non-negative constants only, i.e. it spells no minus sign. `overflow` is unknown.
fn is_size_symbol(s: &str) -> bool {
    s != "overflow" && !s.contains('-')
}

impl From<i64> for Dim {
    fn from(v: i64) -> Dim {
        Dim::known(v)
    }
}

impl From<usize> for Dim {
    fn from(v: usize) -> Dim {
        Dim::known(v as i64)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return f.write_str("0");
        }
        // Highest-degree terms first, constant last: `2*N+1`.
        let mut terms: Vec<_> = self.terms.iter().collect();
        terms.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(b.0)));
        for (i, (mono, coeff)) in terms.into_iter().enumerate() {
            let (sign, mag) = if *coeff < 0 { ("-", coeff.unsigned_abs()) } else { ("+", coeff.unsigned_abs()) };
            if i > 0 || sign == "-" {
                f.write_str(sign)?;
            }
            if mono.is_empty() {
                write!(f, "{mag}")?;
            } else {
                if mag != 1 {
                    write!(f, "{mag}*")?;
                }
                f.write_str(&mono.join("*"))?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Known dims serialise as numbers, symbolic ones as their expression string.
impl Serialize for Dim {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.as_known() {
            Some(v) => s.serialize_i64(v),
            None => s.serialize_str(&self.to_string()),
        }
    }
}

impl Dim {
    /// The polynomial as JSON a reader evaluates without parsing an expression: a number when
    /// the dim is known, else a list of terms, each `[coefficient, symbol, symbol, …]` (the
    /// constant term `[c]`), e.g. `[[25690112, "N"]]` for `25690112*N`. The build metadata stores
    /// run-time quantities (a kernel's work) this way, and [`Dim::from_terms_json`] reads them
    /// back into the same polynomial, evaluated with [`Dim::eval`] like any shape.
    pub fn to_terms_json(&self) -> serde_json::Value {
        if let Some(v) = self.as_known() {
            return serde_json::Value::from(v);
        }
        let terms = self
            .terms
            .iter()
            .map(|(mono, coeff)| {
                let mut term = vec![serde_json::Value::from(*coeff)];
                term.extend(mono.iter().map(|s| serde_json::Value::from(s.as_str())));
                serde_json::Value::Array(term)
            })
            .collect();
        serde_json::Value::Array(terms)
    }

    /// Reads [`Dim::to_terms_json`]'s form back; `None` for anything else (a term without an
    /// integer coefficient first, a symbol that is not a string, a coefficient out of i64).
    pub fn from_terms_json(v: &serde_json::Value) -> Option<Dim> {
        if let Some(n) = v.as_i64() {
            return Some(Dim::known(n));
        }
        let mut out = Dim::known(0);
        for term in v.as_array()? {
            let (coeff, symbols) = term.as_array()?.split_first()?;
            let mut t = Dim::known(coeff.as_i64()?);
            for s in symbols {
                t = t.mul(&Dim::sym(s.as_str()?));
            }
            out = out.add(&t);
        }
        Some(out)
    }
}

/// Formats a shape as `[N,3,224,224]`.
pub fn fmt_shape(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

/// Product of dims (element count).
pub fn product(shape: &[Dim]) -> Dim {
    shape.iter().fold(Dim::known(1), |acc, d| acc.mul(d))
}

/// Row-major (contiguous) element strides of a shape: each dim's stride is the product of the
/// dims after it.
pub fn row_major_strides(shape: &[Dim]) -> Vec<Dim> {
    let mut strides = vec![Dim::known(1); shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].mul(&shape[i + 1]);
    }
    strides
}

/// Known values of a shape, if all are known.
pub fn known_shape(shape: &[Dim]) -> Option<Vec<usize>> {
    shape.iter().map(|d| d.as_known().filter(|v| *v >= 0).map(|v| v as usize)).collect()
}

pub fn dims_of(shape: &[usize]) -> Vec<Dim> {
    shape.iter().map(|&v| Dim::from(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn polynomial_normal_form() {
        let n = Dim::sym("N");
        let twelve_n = n.mul(&Dim::known(3)).mul(&Dim::known(4));
        assert_eq!(twelve_n, Dim::known(12).mul(&n));
        assert_eq!(twelve_n.to_string(), "12*N");
        assert_eq!(twelve_n.div_floor(&Dim::known(4)), n.mul(&Dim::known(3)));
        assert_eq!(n.add(&Dim::known(1)).sub(&Dim::known(1)), n);
        assert_eq!(n.sub(&n).as_known(), Some(0));
    }

    #[test]
    fn symbolic_division() {
        let ns = Dim::sym("N").mul(&Dim::sym("S"));
        let total = ns.mul(&Dim::known(768));
        assert_eq!(total.div_floor(&ns).as_known(), Some(768));
        let odd = Dim::sym("H").add(&Dim::known(1));
        assert_eq!(odd.div_floor(&Dim::known(2)).to_string(), "floor((H+1)/2)");
        assert_eq!(Dim::known(7).div_ceil(&Dim::known(2)).as_known(), Some(4));
    }

    #[test]
    fn terms_json_round_trips_and_evaluates() {
        let d = Dim::sym("N").mul(&Dim::sym("seq")).mul(&Dim::known(24)).add(&Dim::known(5));
        let j = d.to_terms_json();
        assert_eq!(j, serde_json::json!([[5], [24, "N", "seq"]]));
        assert_eq!(Dim::from_terms_json(&j), Some(d.clone()));
        let env = BTreeMap::from([("N".to_string(), 2), ("seq".to_string(), 3)]);
        assert_eq!(Dim::from_terms_json(&j).unwrap().eval(&env).as_known(), Some(149));
        assert_eq!(Dim::known(7).to_terms_json(), serde_json::json!(7));
        assert_eq!(Dim::from_terms_json(&serde_json::json!(7)), Some(Dim::known(7)));
        for bad in
            [serde_json::json!("N"), serde_json::json!([["N", 2]]), serde_json::json!([[]]), serde_json::json!([[1.5]])]
        {
            assert_eq!(Dim::from_terms_json(&bad), None, "{bad}");
        }
    }

    #[test]
    fn overflow_stays_symbolic() {
        let big = Dim::known(i64::MAX);
        assert!(!big.mul(&Dim::known(2)).is_known());
        assert!(!big.add(&Dim::known(1)).is_known());
        assert!(!Dim::known(i64::MIN).neg().is_known());
        assert!(!Dim::known(i64::MIN).div_floor(&Dim::known(-1)).is_known());
        assert!(!big.div_ceil(&Dim::known(2)).is_known());
    }

    #[test]
    fn bounds_of_sizes() {
        let n = Dim::sym("N");
        assert_eq!(n.lower_bound(), Some(0));
        assert_eq!(n.upper_bound(), None);
        assert_eq!(n.mul(&Dim::known(3)).add(&Dim::known(2)).lower_bound(), Some(2));
        assert_eq!(n.neg().add(&Dim::known(5)).upper_bound(), Some(5));
        assert_eq!(n.sub(&Dim::sym("S")).lower_bound(), None);
        assert_eq!(Dim::known(-1).upper_bound(), Some(-1));
        assert_eq!(Dim::sym("floor((H+1)/2)").lower_bound(), Some(0));
        assert_eq!(Dim::sym("floor((H-1)/2)").lower_bound(), None);
    }

    #[test]
    fn evaluation_binds_symbols() {
        let d = Dim::sym("N").mul(&Dim::known(2)).add(&Dim::known(1));
        let env = BTreeMap::from([("N".to_string(), 4)]);
        assert_eq!(d.eval(&env).as_known(), Some(9));
    }

    #[test]
    fn ranges_bound_polynomials() {
        let (n, s) = (Dim::sym("N"), Dim::sym("S"));
        let ranges = BTreeMap::from([("N".to_string(), (1, 64)), ("S".to_string(), (1, 512))]);
        // Attention scores [N, 12, S, S]: 12·N·S².
        let scores = n.mul(&Dim::known(12)).mul(&s).mul(&s);
        assert_eq!(scores.range_in(&ranges), Some((12, 12 * 64 * 512 * 512)));
        // A negative term takes the other end of its range: S - 1 over 1..=512.
        assert_eq!(s.sub(&Dim::known(1)).range_in(&ranges), Some((0, 511)));
        assert_eq!(Dim::known(7).range_in(&ranges), Some((7, 7)));
        assert_eq!(Dim::sym("H").range_in(&ranges), None);
        let huge = BTreeMap::from([("N".to_string(), (1, i64::MAX))]);
        assert_eq!(n.mul(&n).range_in(&huge), None);
    }
}
