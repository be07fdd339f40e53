//! Reference kernels of the layout family: DepthToSpace and SpaceToDepth, both a reshape to
//! rank 6, a transpose and a reshape back (exactly the ONNX definitions), generic over the
//! element type so every dtype moves bit-exactly.

use crate::ir::{Elem, OpError, OpResult};
use ndarray::{ArrayD, IxDyn};

/// Reshapes `a` (any layout) to `split`, permutes by `perm`, and returns it standard-layout
/// with shape `out`.
fn reshape_transpose<T: Elem>(a: &ArrayD<T>, split: &[usize], perm: &[usize], out: &[usize]) -> OpResult<ArrayD<T>> {
    let data: Vec<T> = a.iter().copied().collect();
    let six = ArrayD::from_shape_vec(IxDyn(split), data).map_err(|e| OpError(format!("internal shape error: {e}")))?;
    let moved: Vec<T> = six.view().permuted_axes(IxDyn(perm)).iter().copied().collect();
    ArrayD::from_shape_vec(IxDyn(out), moved).map_err(|e| OpError(format!("internal shape error: {e}")))
}

/// DepthToSpace of an `[N, C, H, W]` array (C divisible by `b*b`, checked by the op). `crd`
/// selects column-row-depth order; otherwise depth-column-row (DCR), the opset 1 behaviour.
pub fn depth_to_space<T: Elem>(a: &ArrayD<T>, b: usize, crd: bool) -> OpResult<ArrayD<T>> {
    let s = a.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let cb = c / (b * b);
    // An empty tensor may carry any spatial size, so the scaled dims are checked.
    let scale =
        |d: usize| d.checked_mul(b).ok_or_else(|| OpError(format!("DepthToSpace: dim {d} x blocksize {b} overflows")));
    let out = [n, cb, scale(h)?, scale(w)?];
    if crd {
        reshape_transpose(a, &[n, cb, b, b, h, w], &[0, 1, 4, 2, 5, 3], &out)
    } else {
        reshape_transpose(a, &[n, b, b, cb, h, w], &[0, 3, 4, 1, 5, 2], &out)
    }
}

/// SpaceToDepth of an `[N, C, H, W]` array (H and W divisible by `b`, checked by the op).
/// Output channels are ordered block-row, block-column, channel (DCR, the only order before
/// opset 28), or channel, block-row, block-column with `crd`.
pub fn space_to_depth<T: Elem>(a: &ArrayD<T>, b: usize, crd: bool) -> OpResult<ArrayD<T>> {
    let s = a.shape();
    let (n, c, h, w) = (s[0], s[1], s[2], s[3]);
    let perm: &[usize] = if crd { &[0, 1, 3, 5, 2, 4] } else { &[0, 3, 5, 1, 2, 4] };
    let channels = c
        .checked_mul(b * b)
        .ok_or_else(|| OpError(format!("SpaceToDepth: {c} channels x blocksize² {} overflows", b * b)))?;
    reshape_transpose(a, &[n, c, h / b, b, w / b, b], perm, &[n, channels, h / b, w / b])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn space_to_depth_inverts_depth_to_space() {
        let a = ArrayD::from_shape_vec(IxDyn(&[1, 8, 2, 3]), (0..48).collect::<Vec<i64>>()).unwrap();
        let s = depth_to_space(&a, 2, false).unwrap();
        assert_eq!(s.shape(), &[1, 2, 4, 6]);
        assert_eq!(space_to_depth(&s, 2, false).unwrap(), a);
        let crd = depth_to_space(&a, 2, true).unwrap();
        assert_eq!(space_to_depth(&crd, 2, true).unwrap(), a);
    }
}
