//! Reference kernels of the reduce op family: reductions over any set of axes and the
//! arg-reductions (ArgMax/ArgMin) over one axis.
//!
//! Every kernel moves the reduced axes last, so each output element reduces one contiguous
//! lane. The kernels return the output without the reduced axes; the op reshapes for
//! `keepdims`. Semantics follow ONNX Runtime where the specification leaves room:
//! - Max/Min and the arg-reductions compare with `>`/`<` from the first element, so a NaN is
//!   skipped unless it is the first element of the lane (ORT's behaviour, not numpy's).
//! - An empty lane gives the identity of the reduction: 0 for sums and for the mean (ORT
//!   returns 0, not NaN), 1 for products, -inf/+inf (the type's min/max for integers) for
//!   Max/Min, -inf for the log reductions.
//! - Integer reductions accumulate exactly (in i128) and saturate to the element type, as ORT
//!   does; the mean truncates toward zero; the L2 and log reductions of integers are computed
//!   in f64 and truncated (LogSumExp truncates each `exp` term, as ORT does).

use crate::ir::ops::reduce::ReduceKind;
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, IxDyn};

impl ReduceKind {
    /// Whether the reduction is defined on booleans (ReduceMax/ReduceMin, opset 20).
    pub fn supports_bool(self) -> bool {
        matches!(self, ReduceKind::Max | ReduceKind::Min)
    }
}

/// The data reordered so that the reduced axes come last, as (kept dims, lane length, data).
fn lanes<T: Copy>(a: &ArrayD<T>, axes: &[usize]) -> (Vec<usize>, usize, Vec<T>) {
    let rank = a.ndim();
    let mut reduced: Vec<usize> = axes.to_vec();
    reduced.sort_unstable();
    let kept: Vec<usize> = (0..rank).filter(|ax| !reduced.contains(ax)).collect();
    let perm: Vec<usize> = kept.iter().chain(reduced.iter()).copied().collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&ax| a.shape()[ax]).collect();
    let lane: usize = reduced.iter().map(|&ax| a.shape()[ax]).product();
    let data: Vec<T> = a.view().permuted_axes(IxDyn(&perm)).iter().copied().collect();
    (kept_shape, lane, data)
}

/// Applies `f` to every lane; the output has the kept dims only.
fn reduce_lanes<T: Copy, U>(a: &ArrayD<T>, axes: &[usize], mut f: impl FnMut(&[T]) -> U) -> ArrayD<U> {
    let (kept_shape, lane, data) = lanes(a, axes);
    let outer: usize = kept_shape.iter().product();
    let values: Vec<U> =
        if lane == 0 { (0..outer).map(|_| f(&[])).collect() } else { data.chunks(lane).map(&mut f).collect() };
    ArrayD::from_shape_vec(IxDyn(&kept_shape), values).expect("one value per kept position")
}

/// First-element-seeded maximum or minimum with `>`/`<`, so NaNs after the first are skipped.
fn extreme<T: Copy + PartialOrd>(lane: &[T], want_max: bool, empty: T) -> T {
    let Some((&first, rest)) = lane.split_first() else {
        return empty;
    };
    rest.iter().fold(first, |best, &v| if (want_max && v > best) || (!want_max && v < best) { v } else { best })
}

/// Reduces a float tensor (already converted to f32). Sums accumulate in f64 so the oracle
/// stays accurate on long lanes.
pub fn reduce_f32(a: &ArrayD<f32>, axes: &[usize], kind: ReduceKind) -> ArrayD<f32> {
    reduce_lanes(a, axes, |lane| {
        let sum = |g: fn(f32) -> f64| lane.iter().map(|&v| g(v)).sum::<f64>();
        match kind {
            ReduceKind::Sum => sum(|v| v as f64) as f32,
            ReduceKind::Mean => {
                if lane.is_empty() {
                    0.0
                } else {
                    (sum(|v| v as f64) / lane.len() as f64) as f32
                }
            }
            ReduceKind::Max => extreme(lane, true, f32::NEG_INFINITY),
            ReduceKind::Min => extreme(lane, false, f32::INFINITY),
            ReduceKind::Prod => lane.iter().map(|&v| v as f64).product::<f64>() as f32,
            ReduceKind::L1 => sum(|v| (v as f64).abs()) as f32,
            ReduceKind::L2 => sum(|v| (v as f64) * (v as f64)).sqrt() as f32,
            ReduceKind::SumSquare => sum(|v| (v as f64) * (v as f64)) as f32,
            ReduceKind::LogSum => sum(|v| v as f64).ln() as f32,
            ReduceKind::LogSumExp => log_sum_exp(lane),
        }
    })
}

/// `log(sum(exp(x)))` computed around the lane maximum so large inputs do not overflow.
fn log_sum_exp(lane: &[f32]) -> f32 {
    let m = lane.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if lane.iter().any(|v| v.is_nan()) {
        return f32::NAN;
    }
    if m.is_infinite() {
        // All -inf (or empty) gives -inf; any +inf gives +inf.
        return m;
    }
    let s: f64 = lane.iter().map(|&v| ((v - m) as f64).exp()).sum();
    (m as f64 + s.ln()) as f32
}

/// Integer element types, with the exact widening the integer reductions need.
pub trait IntElem: Copy + PartialOrd + Send + Sync + 'static {
    const MIN: Self;
    const MAX: Self;
    fn to_i128(self) -> i128;
    /// Converts back, saturating to the type's range.
    fn saturate(v: i128) -> Self;
    /// Converts a float result, truncating toward zero and saturating (NaN gives the minimum).
    fn from_f64_sat(v: f64) -> Self;
}

macro_rules! impl_int_elem {
    ($($t:ty),*) => {$(
        impl IntElem for $t {
            const MIN: Self = <$t>::MIN;
            const MAX: Self = <$t>::MAX;
            fn to_i128(self) -> i128 {
                self as i128
            }
            fn saturate(v: i128) -> Self {
                v.clamp(<$t>::MIN as i128, <$t>::MAX as i128) as $t
            }
            fn from_f64_sat(v: f64) -> Self {
                // NaN (log of a negative sum) gives the type's minimum, as ORT's conversion does.
                if v.is_nan() {
                    <$t>::MIN
                } else {
                    v as $t
                }
            }
        }
    )*};
}
impl_int_elem!(i8, i16, i32, i64, u8, u16, u32, u64);

/// Reduces an integer tensor exactly in its own type (see the module notes on overflow).
pub fn reduce_int<T: IntElem>(a: &ArrayD<T>, axes: &[usize], kind: ReduceKind) -> ArrayD<T> {
    reduce_lanes(a, axes, |lane| {
        let wide = || lane.iter().map(|v| v.to_i128());
        let sum_of = |g: fn(i128) -> i128| wide().fold(0i128, |acc, v| acc.saturating_add(g(v)));
        match kind {
            ReduceKind::Sum => T::saturate(sum_of(|v| v)),
            ReduceKind::Mean => {
                if lane.is_empty() {
                    T::saturate(0)
                } else {
                    T::saturate(sum_of(|v| v) / lane.len() as i128)
                }
            }
            ReduceKind::Max => extreme(lane, true, T::MIN),
            ReduceKind::Min => extreme(lane, false, T::MAX),
            ReduceKind::Prod => T::saturate(wide().fold(1i128, |acc, v| acc.saturating_mul(v))),
            ReduceKind::L1 => T::saturate(sum_of(|v| v.saturating_abs())),
            ReduceKind::SumSquare => T::saturate(sum_of(|v| v.saturating_mul(v))),
            ReduceKind::L2 => T::from_f64_sat((sum_of(|v| v.saturating_mul(v)) as f64).sqrt()),
            ReduceKind::LogSum => T::from_f64_sat((sum_of(|v| v) as f64).ln()),
            ReduceKind::LogSumExp => {
                let m = wide().max().map_or(f64::NEG_INFINITY, |m| m as f64);
                if m.is_infinite() {
                    return T::from_f64_sat(m);
                }
                // ORT truncates each exp to the element type, then truncates m + log(sum).
                let s: f64 = wide().map(|v| (v as f64 - m).exp().trunc()).sum();
                T::from_f64_sat(m + s.ln())
            }
        }
    })
}

/// ReduceMax (any) and ReduceMin (all) of booleans.
pub fn reduce_bool(a: &ArrayD<bool>, axes: &[usize], kind: ReduceKind) -> OpResult<ArrayD<bool>> {
    match kind {
        ReduceKind::Max => Ok(reduce_lanes(a, axes, |lane| lane.iter().any(|&v| v))),
        ReduceKind::Min => Ok(reduce_lanes(a, axes, |lane| lane.iter().all(|&v| v))),
        other => Err(OpError(format!("{other:?} reduction is not defined for bool tensors"))),
    }
}

/// Index of the maximum (`want_max`) or minimum along `axis`, first or last among ties.
/// The output drops `axis`.
pub fn arg_reduce<T: Copy + PartialOrd>(
    a: &ArrayD<T>,
    axis: usize,
    want_max: bool,
    select_last: bool,
) -> OpResult<ArrayD<i64>> {
    if a.shape()[axis] == 0 {
        return Err(OpError(format!(
            "cannot take the arg-{} over axis {axis} of size 0",
            if want_max { "max" } else { "min" }
        )));
    }
    Ok(reduce_lanes(a, &[axis], |lane| {
        let mut best = 0usize;
        for (i, &v) in lane.iter().enumerate().skip(1) {
            let b = lane[best];
            let better = if want_max { v > b } else { v < b };
            if better || (select_last && v == b) {
                best = i;
            }
        }
        best as i64
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn lanes_move_reduced_axes_last() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3, 2]), (0..12).collect::<Vec<i32>>()).unwrap();
        let (kept, lane, data) = lanes(&a, &[1]);
        assert_eq!((kept, lane), (vec![2, 2], 3));
        assert_eq!(data, vec![0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11]);
    }

    #[test]
    fn float_reductions() {
        let a = array![[1.0f32, -2.0], [3.0, 4.0]].into_dyn();
        assert_eq!(reduce_f32(&a, &[1], ReduceKind::Sum).into_raw_vec_and_offset().0, vec![-1.0, 7.0]);
        assert_eq!(reduce_f32(&a, &[0], ReduceKind::Mean).into_raw_vec_and_offset().0, vec![2.0, 1.0]);
        assert_eq!(reduce_f32(&a, &[0, 1], ReduceKind::L1).into_raw_vec_and_offset().0, vec![10.0]);
        // With no axes every element is its own lane: L1 is |x|, SumSquare x² (ORT's noop).
        assert_eq!(reduce_f32(&a, &[], ReduceKind::SumSquare).into_raw_vec_and_offset().0, vec![1.0, 4.0, 9.0, 16.0]);
        let lse = reduce_f32(&a, &[1], ReduceKind::LogSumExp);
        assert!((lse[[0]] - 1.048_587_4).abs() < 1e-6 && (lse[[1]] - 4.313_261_7).abs() < 1e-6, "{lse}");
    }

    #[test]
    fn nan_and_empty_follow_ort() {
        let a = array![[f32::NAN, 1.0, 3.0], [1.0, f32::NAN, 3.0]].into_dyn();
        let m = reduce_f32(&a, &[1], ReduceKind::Max);
        assert!(m[[0]].is_nan() && m[[1]] == 3.0);
        assert_eq!(arg_reduce(&a, 1, true, false).unwrap().into_raw_vec_and_offset().0, vec![0, 2]);
        let e = ArrayD::<f32>::zeros(IxDyn(&[2, 0]));
        assert_eq!(reduce_f32(&e, &[1], ReduceKind::Max)[[0]], f32::NEG_INFINITY);
        assert_eq!(reduce_f32(&e, &[1], ReduceKind::Mean)[[0]], 0.0);
        assert_eq!(reduce_f32(&e, &[1], ReduceKind::Prod)[[0]], 1.0);
        assert!(arg_reduce(&e, 1, true, false).is_err());
    }

    #[test]
    fn integer_reductions_are_exact_and_saturate() {
        let a = array![i32::MAX, 1].into_dyn();
        assert_eq!(reduce_int(&a, &[0], ReduceKind::Sum)[[]], i32::MAX);
        assert_eq!(reduce_int(&a, &[0], ReduceKind::Mean)[[]], 1_073_741_824);
        let b = array![-3i64, -4].into_dyn();
        assert_eq!(reduce_int(&b, &[0], ReduceKind::Mean)[[]], -3);
        assert_eq!(reduce_int(&b, &[0], ReduceKind::L2)[[]], 5);
        assert_eq!(reduce_int(&b, &[0], ReduceKind::LogSumExp)[[]], -3);
        let big = array![i64::MAX - 1, 0].into_dyn();
        assert_eq!(reduce_int(&big, &[0], ReduceKind::Max)[[]], i64::MAX - 1);
    }

    #[test]
    fn arg_reduce_ties() {
        let a = array![1.0f32, 3.0, 3.0, 1.0].into_dyn();
        assert_eq!(arg_reduce(&a, 0, true, false).unwrap()[[]], 1);
        assert_eq!(arg_reduce(&a, 0, true, true).unwrap()[[]], 2);
        assert_eq!(arg_reduce(&a, 0, false, false).unwrap()[[]], 0);
        assert_eq!(arg_reduce(&a, 0, false, true).unwrap()[[]], 3);
    }
}
