//! Reference kernels of the softmax family: Softmax and LogSoftmax along one axis.
//!
//! Both are computed around the lane maximum (`exp(x - max)`), so large logits do not
//! overflow; the normaliser accumulates in f64 because vocabulary-sized lanes are common.

use ndarray::{ArrayD, Axis, IxDyn};

/// Softmax (or LogSoftmax when `log`) of every lane along `axis`.
pub fn softmax_axis(a: &ArrayD<f32>, axis: usize, log: bool) -> ArrayD<f32> {
    let mut out = a.to_owned();
    for mut lane in out.lanes_mut(Axis(axis)) {
        // f32::max skips NaN; a NaN still poisons the lane through the sum below.
        let m = lane.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = lane.iter().map(|&v| ((v - m) as f64).exp()).sum();
        if log {
            let log_sum = sum.ln();
            lane.mapv_inplace(|v| ((v - m) as f64 - log_sum) as f32);
        } else {
            lane.mapv_inplace(|v| (((v - m) as f64).exp() / sum) as f32);
        }
    }
    out
}

/// The opset < 13 form: the input is viewed as a matrix `[prod(dims[..axis]), prod(dims[axis..])]`
/// and each row is normalised.
pub fn softmax_coerced_2d(a: &ArrayD<f32>, axis: usize, log: bool) -> ArrayD<f32> {
    let shape = a.shape().to_vec();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis..].iter().product();
    let flat: Vec<f32> = a.iter().copied().collect();
    let matrix = ArrayD::from_shape_vec(IxDyn(&[outer, inner]), flat).expect("row-major element count matches");
    let rows = softmax_axis(&matrix, 1, log);
    let values: Vec<f32> = rows.iter().copied().collect();
    ArrayD::from_shape_vec(IxDyn(&shape), values).expect("same element count as the input")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn softmax_of_large_logits_is_stable() {
        let a = array![[1000.0f32, 1001.0, 1002.0], [-1.0, 0.0, 1.0]].into_dyn();
        let s = softmax_axis(&a, 1, false);
        // numpy: e = exp([-2,-1,0]); e / e.sum()
        let want = [0.090_030_57, 0.244_728_48, 0.665_240_94];
        for r in 0..2 {
            for c in 0..3 {
                assert!((s[[r, c]] - want[c]).abs() < 1e-6, "{s}");
            }
        }
        let l = softmax_axis(&a, 1, true);
        assert!((l[[0, 2]] - (-0.407_605_96)).abs() < 1e-6, "{l}");
    }

    #[test]
    fn coerced_rows_span_trailing_axes() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 2, 2]), vec![0.0f32; 8]).unwrap();
        let s = softmax_coerced_2d(&a, 1, false);
        assert!(s.iter().all(|&v| (v - 0.25).abs() < 1e-7), "{s}");
        let s0 = softmax_coerced_2d(&a, 0, false);
        assert!(s0.iter().all(|&v| (v - 0.125).abs() < 1e-7), "{s0}");
    }
}
