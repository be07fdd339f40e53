//! Reference kernel of the hardmax family: a one-hot of the first maximum of each lane.

use ndarray::{ArrayD, Axis, IxDyn};

/// 1 at the first maximum of every lane along `axis`, 0 elsewhere. NaN never wins (a lane of
/// NaNs marks its first element), matching a `>` scan from the lane start.
pub fn hardmax_axis(a: &ArrayD<f32>, axis: usize) -> ArrayD<f32> {
    let mut out = ArrayD::<f32>::zeros(a.raw_dim());
    for (lane, mut dst) in a.lanes(Axis(axis)).into_iter().zip(out.lanes_mut(Axis(axis))) {
        if lane.is_empty() {
            continue;
        }
        let mut best = 0;
        for (i, &v) in lane.iter().enumerate() {
            if v > lane[best] {
                best = i;
            }
        }
        dst[best] = 1.0;
    }
    out
}

/// The opset < 13 form: the input viewed as `[prod(dims[..axis]), prod(dims[axis..])]`, each
/// row one lane.
pub fn hardmax_coerced_2d(a: &ArrayD<f32>, axis: usize) -> ArrayD<f32> {
    let shape = a.shape().to_vec();
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis..].iter().product();
    let flat: Vec<f32> = a.iter().copied().collect();
    let matrix = ArrayD::from_shape_vec(IxDyn(&[outer, inner]), flat).expect("row-major element count matches");
    let rows: Vec<f32> = hardmax_axis(&matrix, 1).iter().copied().collect();
    ArrayD::from_shape_vec(IxDyn(&shape), rows).expect("same element count as the input")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_maximum_wins() {
        let a = ArrayD::from_shape_vec(IxDyn(&[2, 3]), vec![1.0f32, 3.0, 3.0, -1.0, -2.0, -3.0]).unwrap();
        assert_eq!(hardmax_axis(&a, 1).iter().copied().collect::<Vec<_>>(), vec![0.0, 1.0, 0.0, 1.0, 0.0, 0.0]);
        assert_eq!(hardmax_coerced_2d(&a, 0).iter().copied().collect::<Vec<_>>(), vec![0.0, 1.0, 0.0, 0.0, 0.0, 0.0]);
    }
}
