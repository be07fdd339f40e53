//! Reference kernel of the trilu family: the upper or lower triangle of the last two axes.

use crate::ir::Elem;
use ndarray::ArrayD;

/// Keeps the elements `(.., i, j)` with `j - i >= k` (upper) or `j - i <= k` (lower) and zeroes
/// the rest. `a` has rank >= 2 (checked by the op).
pub fn trilu<T: Elem>(a: &ArrayD<T>, k: i64, upper: bool) -> ArrayD<T> {
    let r = a.ndim();
    let mut out = a.to_owned();
    for (idx, v) in out.indexed_iter_mut() {
        let diag = idx[r - 1] as i64 - idx[r - 2] as i64;
        let keep = if upper { diag >= k } else { diag <= k };
        if !keep {
            *v = T::default();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::IxDyn;

    #[test]
    fn upper_and_lower_with_offsets() {
        // numpy: np.triu(arange(9).reshape(3,3), 1) and np.tril(..., -1)
        let a = ArrayD::from_shape_vec(IxDyn(&[3, 3]), (1..=9).collect::<Vec<i32>>()).unwrap();
        assert_eq!(trilu(&a, 1, true).iter().copied().collect::<Vec<_>>(), vec![0, 2, 3, 0, 0, 6, 0, 0, 0]);
        assert_eq!(trilu(&a, -1, false).iter().copied().collect::<Vec<_>>(), vec![0, 0, 0, 4, 0, 0, 7, 8, 0]);
    }
}
