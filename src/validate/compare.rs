//! Comparing one engine's output tensor with the baseline's.
//!
//! Floating-point outputs pass when `max |a - b| <= atol + rtol * max |b|`: the tolerance is
//! relative to the output's largest magnitude, because two correct implementations that sum
//! in different orders differ by an amount proportional to the magnitudes summed, not to each
//! (possibly near-zero) result element. NaN and infinities must appear at the same positions.
//! The element-wise relative error `|a - b| / max(|b|, atol)` is reported too, as is the number
//! of elements outside numpy-style `allclose`, so a localised error is still visible.
//! Integer and bool outputs must match exactly.

use crate::ir::dim::fmt_shape;
use crate::ir::{DType, Tensor};
use serde::Serialize;
use std::fmt;

/// Tolerance of a float comparison.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
}

impl Tolerance {
    /// Defaults per element type. The reference executor computes in f32 and rounds to the
    /// output type, while ONNX Runtime may compute 16-bit ops natively, so 16-bit types get
    /// bounds a few units of their precision wide (f16: 2^-10 ≈ 1e-3, bf16: 2^-7 ≈ 8e-3).
    /// f64 outputs are computed in f32 by the reference executor, hence f32 bounds.
    pub fn default_for(dtype: DType) -> Tolerance {
        match dtype {
            DType::F16 => Tolerance { rtol: 5e-3, atol: 1e-3 },
            DType::BF16 => Tolerance { rtol: 3e-2, atol: 1e-2 },
            _ if dtype.is_float() => Tolerance { rtol: 1e-4, atol: 1e-5 },
            _ => Tolerance { rtol: 0.0, atol: 0.0 },
        }
    }

    /// The default for `dtype` with user overrides applied.
    pub fn resolve(dtype: DType, rtol: Option<f64>, atol: Option<f64>) -> Tolerance {
        let d = Tolerance::default_for(dtype);
        if !dtype.is_float() {
            return d;
        }
        Tolerance { rtol: rtol.unwrap_or(d.rtol), atol: atol.unwrap_or(d.atol) }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Fail,
}

/// Arg-max agreement of `[N, C]` outputs that look like classification logits.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Top1 {
    pub agree: usize,
    pub rows: usize,
}

/// One output of one engine against the baseline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub status: Status,
    /// Why it failed (empty when it passed).
    pub reason: String,
    pub tolerance: Tolerance,
    /// `max |a - b|` over finite pairs.
    pub max_abs: f64,
    /// `max |a - b| / max(|b|, atol)`, element-wise.
    pub max_rel: f64,
    /// `max |a - b| / max |b|`: the error relative to the output's scale.
    pub rel_to_max: f64,
    /// `max |b|` of the baseline.
    pub ref_max_abs: f64,
    /// Elements failing `|a - b| <= atol + rtol * |b|` (numpy `allclose`), or differing
    /// at all for integer outputs.
    pub mismatched: usize,
    pub elements: usize,
    /// Positions where exactly one side is NaN, or infinities differ.
    pub nonfinite_mismatched: usize,
    pub top1: Option<Top1>,
}

impl Comparison {
    pub fn passed(&self) -> bool {
        self.status == Status::Pass
    }

    /// A comparison that could not be made (missing output, dtype or shape mismatch).
    pub fn failed(reason: String, tolerance: Tolerance) -> Comparison {
        Comparison {
            status: Status::Fail,
            reason,
            tolerance,
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            rel_to_max: f64::NAN,
            ref_max_abs: f64::NAN,
            mismatched: 0,
            elements: 0,
            nonfinite_mismatched: 0,
            top1: None,
        }
    }
}

/// Compares `actual` with the baseline `expected`.
pub fn compare(actual: &Tensor, expected: &Tensor, tol: Tolerance) -> Comparison {
    if actual.dtype() != expected.dtype() {
        return Comparison::failed(format!("dtype {} but the baseline is {}", actual.dtype(), expected.dtype()), tol);
    }
    if actual.shape() != expected.shape() {
        return Comparison::failed(
            format!("shape {:?} but the baseline is {:?}", actual.shape(), expected.shape()),
            tol,
        );
    }
    let exact = !expected.dtype().is_float();
    let a = actual.to_f64_vec();
    let b = expected.to_f64_vec();
    let elements = a.len();
    let ref_max_abs = b.iter().filter(|v| v.is_finite()).fold(0.0f64, |m, v| m.max(v.abs()));
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    let (mut mismatched, mut nonfinite_mismatched) = (0usize, 0usize);
    // Integers beyond 2^53 lose precision in f64: compare those exactly on their own type.
    let int_diff = if exact { integer_mismatches(actual, expected) } else { None };
    for (&x, &y) in a.iter().zip(&b) {
        if !x.is_finite() || !y.is_finite() {
            let same = (x.is_nan() && y.is_nan()) || x == y;
            if !same {
                nonfinite_mismatched += 1;
            }
            continue;
        }
        let d = (x - y).abs();
        max_abs = max_abs.max(d);
        max_rel = max_rel.max(d / y.abs().max(tol.atol).max(f64::MIN_POSITIVE));
        let ok = if exact { d == 0.0 } else { d <= tol.atol + tol.rtol * y.abs() };
        if !ok {
            mismatched += 1;
        }
    }
    if let Some(n) = int_diff {
        mismatched = n;
    }
    let rel_to_max = if ref_max_abs > 0.0 {
        max_abs / ref_max_abs
    } else if max_abs == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    let top1 = if expected.dtype().is_float() { top1_agreement(actual.shape(), &a, &b) } else { None };

    let bound = tol.atol + tol.rtol * ref_max_abs;
    let reason = if nonfinite_mismatched > 0 {
        format!("{nonfinite_mismatched} NaN/Inf position(s) differ")
    } else if exact && mismatched > 0 {
        format!("{mismatched} of {elements} element(s) differ (integer outputs must match exactly)")
    } else if !exact && max_abs > bound {
        format!(
            "max |diff| {} exceeds atol + rtol*max|ref| = {} + {}*{} = {}",
            fmt_num(max_abs),
            fmt_num(tol.atol),
            fmt_num(tol.rtol),
            fmt_num(ref_max_abs),
            fmt_num(bound)
        )
    } else {
        String::new()
    };
    Comparison {
        status: if reason.is_empty() { Status::Pass } else { Status::Fail },
        reason,
        tolerance: tol,
        max_abs,
        max_rel,
        rel_to_max,
        ref_max_abs,
        mismatched,
        elements,
        nonfinite_mismatched,
        top1,
    }
}

/// Exact mismatch count for 64-bit integer outputs (whose values f64 may not hold exactly).
fn integer_mismatches(actual: &Tensor, expected: &Tensor) -> Option<usize> {
    match (actual, expected) {
        (Tensor::I64(a), Tensor::I64(b)) => Some(a.iter().zip(b.iter()).filter(|(x, y)| x != y).count()),
        (Tensor::U64(a), Tensor::U64(b)) => Some(a.iter().zip(b.iter()).filter(|(x, y)| x != y).count()),
        _ => None,
    }
}

/// Per-row arg-max agreement for rank-2 `[N, C]` outputs with `C >= 2`.
fn top1_agreement(shape: &[usize], a: &[f64], b: &[f64]) -> Option<Top1> {
    let [rows, classes] = *shape else { return None };
    if classes < 2 || rows == 0 {
        return None;
    }
    let argmax = |row: &[f64]| {
        // First maximum wins, NaN never does: deterministic on ties.
        let mut best = 0;
        for (i, v) in row.iter().enumerate() {
            if *v > row[best] || row[best].is_nan() && !v.is_nan() {
                best = i;
            }
        }
        best
    };
    let agree = a.chunks(classes).zip(b.chunks(classes)).filter(|(x, y)| argmax(x) == argmax(y)).count();
    Some(Top1 { agree, rows })
}

/// Short scientific notation for errors in tables and messages.
pub fn fmt_num(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else if v.is_nan() {
        "-".to_string()
    } else if v.is_infinite() {
        "inf".to_string()
    } else {
        format!("{v:.2e}")
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Status::Pass => {
                write!(f, "pass (max |diff| {}, {} of max|ref|)", fmt_num(self.max_abs), fmt_num(self.rel_to_max))
            }
            Status::Fail => write!(f, "FAIL: {}", self.reason),
        }
    }
}

/// `float32[1,1000]` for a concrete tensor.
pub fn describe(t: &Tensor) -> String {
    let dims: Vec<crate::ir::Dim> = t.shape().iter().map(|&d| crate::ir::Dim::from(d)).collect();
    format!("{}{}", t.dtype(), fmt_shape(&dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32s(shape, v.to_vec())
    }

    #[test]
    fn scale_relative_tolerance() {
        let b = f32s(&[4], &[100.0, -50.0, 0.0, 1e-3]);
        // 5e-3 off everywhere: 5e-5 of max |ref| = 100, within rtol 1e-4.
        let a = f32s(&[4], &[100.005, -50.005, 0.005, 1e-3 + 0.005]);
        let c = compare(&a, &b, Tolerance::default_for(DType::F32));
        assert!(c.passed(), "{c}");
        assert!((c.max_abs - 0.005).abs() < 1e-5);
        assert!((c.rel_to_max - 5e-5).abs() < 1e-6);
        assert!(c.mismatched >= 2, "near-zero elements fail allclose and are counted");
        assert!(c.max_rel > 100.0, "element-wise relative error is reported");

        let far = f32s(&[4], &[100.02, -50.0, 0.0, 1e-3]);
        let c = compare(&far, &b, Tolerance::default_for(DType::F32));
        assert!(!c.passed());
        assert!(c.reason.contains("exceeds atol + rtol*max|ref|"), "{}", c.reason);
    }

    #[test]
    fn nan_positions_and_shapes() {
        let b = f32s(&[3], &[f32::NAN, 1.0, f32::INFINITY]);
        assert!(compare(&b.clone(), &b, Tolerance::default_for(DType::F32)).passed());
        let a = f32s(&[3], &[0.0, 1.0, f32::INFINITY]);
        let c = compare(&a, &b, Tolerance::default_for(DType::F32));
        assert_eq!(c.nonfinite_mismatched, 1);
        assert!(!c.passed());
        let c = compare(&f32s(&[1, 3], &[0.0; 3]), &f32s(&[3], &[0.0; 3]), Tolerance::default_for(DType::F32));
        assert!(c.reason.contains("shape [1, 3]"), "{}", c.reason);
        let c = compare(&Tensor::from_i64s(&[1], vec![1]), &f32s(&[1], &[1.0]), Tolerance::default_for(DType::F32));
        assert!(c.reason.contains("dtype int64"), "{}", c.reason);
    }

    #[test]
    fn integers_are_exact() {
        let b = Tensor::from_i64s(&[3], vec![i64::MAX, 2, 3]);
        let a = Tensor::from_i64s(&[3], vec![i64::MAX - 1, 2, 3]);
        let c = compare(&a, &b, Tolerance::resolve(DType::I64, Some(1.0), Some(1.0)));
        assert!(!c.passed(), "overrides do not loosen integer comparisons");
        assert_eq!(c.mismatched, 1, "a difference beyond f64 precision is still seen");
        assert!(compare(&b, &b, Tolerance::default_for(DType::I64)).passed());
    }

    #[test]
    fn top1_for_logits() {
        let b = f32s(&[2, 3], &[0.1, 0.9, 0.0, 0.5, 0.2, 0.3]);
        let a = f32s(&[2, 3], &[0.1, 0.9, 0.0, 0.2, 0.5, 0.3]);
        let c = compare(&a, &b, Tolerance::default_for(DType::F32));
        assert_eq!(c.top1, Some(Top1 { agree: 1, rows: 2 }));
        assert_eq!(
            compare(&f32s(&[3], &[1.0; 3]), &f32s(&[3], &[1.0; 3]), Tolerance::default_for(DType::F32)).top1,
            None
        );
    }

    #[test]
    fn half_precision_is_looser() {
        let t = Tolerance::default_for(DType::F16);
        assert!(t.rtol > Tolerance::default_for(DType::F32).rtol);
        let b = f32s(&[2], &[1.0, 2.0]).cast(DType::F16);
        let a = f32s(&[2], &[1.001, 2.0]).cast(DType::F16);
        assert!(compare(&a, &b, t).passed());
    }
}
