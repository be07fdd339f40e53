//! Reference kernel of the cumsum family: running sums along one axis, inclusive or exclusive,
//! forward or reversed. Integer sums wrap like ONNX Runtime's; float sums accumulate in the
//! element type (f32 for the half types, converted by the op).

use super::scatter::Reducible;
use ndarray::{ArrayD, Axis};

/// Cumulative sum of every lane along `axis`. `exclusive` leaves the current element out of
/// its own sum (the first output of a lane is 0); `reverse` sums from the end of the lane.
pub fn cumsum<T: Reducible>(a: &ArrayD<T>, axis: usize, exclusive: bool, reverse: bool) -> ArrayD<T> {
    let mut out = a.to_owned();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let n = lane.len();
        let mut acc = T::default();
        for step in 0..n {
            let i = if reverse { n - 1 - step } else { step };
            let v = lane[i];
            if exclusive {
                lane[i] = acc;
                acc = acc.add(v);
            } else {
                acc = acc.add(v);
                lane[i] = acc;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::IxDyn;

    #[test]
    fn modes() {
        let a = ArrayD::from_shape_vec(IxDyn(&[4]), vec![1i64, 2, 3, 4]).unwrap();
        let v = |x: ArrayD<i64>| x.iter().copied().collect::<Vec<_>>();
        assert_eq!(v(cumsum(&a, 0, false, false)), vec![1, 3, 6, 10]);
        assert_eq!(v(cumsum(&a, 0, true, false)), vec![0, 1, 3, 6]);
        assert_eq!(v(cumsum(&a, 0, false, true)), vec![10, 9, 7, 4]);
        assert_eq!(v(cumsum(&a, 0, true, true)), vec![9, 7, 4, 0]);
    }
}
