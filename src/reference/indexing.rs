//! Reference kernels of the data-movement op families (shape, indexing, generator): pure index
//! arithmetic over ndarray arrays, generic over the element type, so every dtype moves
//! bit-exactly. Shape validation and ONNX attribute semantics live in the ops; these kernels
//! receive normalised, in-range parameters and only check what would otherwise panic.

use crate::ir::ops::indexing::PadMode;
use crate::ir::{DType, Elem, OpError, OpResult, Tensor};
use crate::with_dtype;
use ndarray::{ArrayD, ArrayViewD, Axis, Dimension, IxDyn, Slice};

/// Copies a (possibly strided) view into a standard-layout array of the given shape.
fn collect_into<T: Elem>(v: ArrayViewD<'_, T>, shape: &[usize]) -> OpResult<ArrayD<T>> {
    let data: Vec<T> = v.iter().copied().collect();
    ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| OpError(format!("internal shape error: {e}")))
}

/// Permutes axes (`perm` is a validated permutation).
pub fn transpose<T: Elem>(a: &ArrayD<T>, perm: &[usize]) -> ArrayD<T> {
    a.view().permuted_axes(IxDyn(perm)).as_standard_layout().into_owned()
}

/// Broadcasts `a` to `shape` (numpy rules; `shape` is the already-broadcast output shape).
pub fn expand<T: Elem>(a: &ArrayD<T>, shape: &[usize]) -> OpResult<ArrayD<T>> {
    let v = a
        .broadcast(IxDyn(shape))
        .ok_or_else(|| OpError(format!("shape {:?} cannot be broadcast to {shape:?}", a.shape())))?;
    collect_into(v, shape)
}

/// Repeats `a` `reps[i]` times along each axis i.
pub fn tile<T: Elem>(a: &ArrayD<T>, reps: &[usize]) -> ArrayD<T> {
    let in_shape = a.shape().to_vec();
    let out_shape: Vec<usize> = in_shape.iter().zip(reps).map(|(d, r)| d * r).collect();
    ArrayD::from_shape_fn(IxDyn(&out_shape), |idx| {
        let src: Vec<usize> = (0..in_shape.len()).map(|i| idx[i] % in_shape[i]).collect();
        a[IxDyn(&src)]
    })
}

/// Concatenates arrays of equal rank along `axis` (other dims already checked equal).
pub fn concat<T: Elem>(arrays: &[&ArrayD<T>], axis: usize) -> OpResult<ArrayD<T>> {
    let views: Vec<ArrayViewD<'_, T>> = arrays.iter().map(|a| a.view()).collect();
    ndarray::concatenate(Axis(axis), &views).map_err(|e| OpError(format!("cannot concatenate: {e}")))
}

/// Splits `a` along `axis` into consecutive chunks of the given sizes (summing to the dim).
pub fn split<T: Elem>(a: &ArrayD<T>, axis: usize, sizes: &[usize]) -> Vec<ArrayD<T>> {
    let mut start = 0usize;
    sizes
        .iter()
        .map(|&n| {
            let part = a.slice_axis(Axis(axis), Slice::from(start..start + n)).to_owned();
            start += n;
            part
        })
        .collect()
}

/// One axis of a strided slice: the first element taken, the step, and how many are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AxisSlice {
    pub first: usize,
    pub step: i64,
    pub len: usize,
}

/// Takes `a[first, first+step, ...]` (`len` elements) on each axis; steps may be negative.
pub fn slice<T: Elem>(a: &ArrayD<T>, axes: &[AxisSlice]) -> ArrayD<T> {
    let mut v = a.view();
    for (axis, s) in axes.iter().enumerate() {
        let slice = if s.len == 0 {
            Slice::new(0, Some(0), 1)
        } else {
            // ndarray applies a negative step from the end of the range, ONNX from `first`:
            // with the range [last, first] both start at `first`.
            // A single element needs no stride (and huge strides would overflow ndarray's).
            let step = if s.len == 1 { 1 } else { s.step };
            let last = s.first as i64 + step * (s.len as i64 - 1);
            let (lo, hi) = if step > 0 { (s.first as i64, last) } else { (last, s.first as i64) };
            Slice::new(lo as isize, Some(hi as isize + 1), step as isize)
        };
        v.slice_axis_inplace(Axis(axis), slice);
    }
    v.as_standard_layout().into_owned()
}

/// `numpy.take(a, indices, axis)`: indices are normalised to `[0, dim)` and shaped `idx_shape`.
pub fn gather<T: Elem>(a: &ArrayD<T>, axis: usize, indices: &[usize], idx_shape: &[usize]) -> OpResult<ArrayD<T>> {
    let picked = a.select(Axis(axis), indices);
    let mut out_shape: Vec<usize> = a.shape()[..axis].to_vec();
    out_shape.extend_from_slice(idx_shape);
    out_shape.extend_from_slice(&a.shape()[axis + 1..]);
    collect_into(picked.view(), &out_shape)
}

/// `numpy.take_along_axis`: `out[i] = a[i with axis coordinate replaced by indices[i]]`.
/// Indices are normalised to `[0, a.shape[axis])`; the other index coordinates must lie within
/// `a`'s shape (checked by the op).
pub fn gather_elements<T: Elem>(a: &ArrayD<T>, axis: usize, indices: &ArrayD<usize>) -> ArrayD<T> {
    ArrayD::from_shape_fn(indices.raw_dim(), |idx| {
        let mut src = idx.clone();
        src[axis] = indices[&idx];
        a[src]
    })
}

/// Maps an index outside `[0, n)` back into it for the non-constant pad modes.
fn pad_source(i: i64, n: i64, mode: PadMode) -> Option<i64> {
    if (0..n).contains(&i) {
        return Some(i);
    }
    match mode {
        PadMode::Constant => None,
        PadMode::Edge => Some(i.clamp(0, n - 1)),
        PadMode::Wrap => Some(i.rem_euclid(n)),
        PadMode::Reflect => {
            if n == 1 {
                return Some(0);
            }
            // Reflection without repeating the edge has period 2(n-1).
            let period = 2 * (n - 1);
            let r = i.rem_euclid(period);
            Some(if r < n { r } else { period - r })
        }
    }
}

/// Pads (positive amounts) and crops (negative amounts) each axis by `(begin, end)`.
/// Cropping is applied first, then the border is filled from the cropped array, as ONNX
/// Runtime does.
pub fn pad<T: Elem>(a: &ArrayD<T>, pads: &[(i64, i64)], mode: PadMode, value: T) -> OpResult<ArrayD<T>> {
    let mut v = a.view();
    for (axis, &(b, e)) in pads.iter().enumerate() {
        let n = v.shape()[axis] as i64;
        // Pads come from the model: i64::MIN has no negation, so saturate.
        let lo = b.saturating_neg().max(0);
        let hi = n.saturating_sub(e.saturating_neg().max(0));
        if hi < lo {
            return Err(OpError(format!("pads ({b}, {e}) crop more than the {n} elements of axis {axis}")));
        }
        v.slice_axis_inplace(Axis(axis), Slice::from(lo as usize..hi as usize));
    }
    let cropped = v;
    let mut out_shape = Vec::with_capacity(pads.len());
    for (axis, &(b, e)) in pads.iter().enumerate() {
        let n = cropped.shape()[axis];
        if n == 0 && mode != PadMode::Constant && (b > 0 || e > 0) {
            return Err(OpError(format!("cannot pad the empty axis {axis} in {mode:?} mode")));
        }
        // Reflection of more than n-1 elements would repeat the border; ONNX Runtime rejects it.
        let widest = b.max(e).max(0) as usize;
        if mode == PadMode::Reflect && widest > n.saturating_sub(1) {
            return Err(OpError(format!(
                "reflect padding ({b}, {e}) of axis {axis} needs at most {} elements per side (the axis has {n})",
                n.saturating_sub(1)
            )));
        }
        let padded = n
            .checked_add(b.max(0) as usize)
            .and_then(|s| s.checked_add(e.max(0) as usize))
            .filter(|&s| i64::try_from(s).is_ok())
            .ok_or_else(|| OpError(format!("pads ({b}, {e}) of axis {axis} overflow")))?;
        out_shape.push(padded);
    }
    // ndarray panics on a shape whose element count overflows isize.
    if out_shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .is_none_or(|n| n > isize::MAX as usize)
    {
        return Err(OpError(format!("padded shape {out_shape:?} is too large")));
    }
    let mut src = vec![0usize; pads.len()];
    Ok(ArrayD::from_shape_fn(IxDyn(&out_shape), |idx| {
        for (axis, &(b, _)) in pads.iter().enumerate() {
            let n = cropped.shape()[axis] as i64;
            match pad_source(idx[axis] as i64 - b.max(0), n, mode) {
                Some(s) => src[axis] = s as usize,
                None => return value,
            }
        }
        cropped[IxDyn(&src)]
    }))
}

/// A 2-D array with ones on the diagonal offset by `k` (above the main one when positive).
pub fn eye<T: Elem>(rows: usize, cols: usize, k: i64) -> ArrayD<T> {
    let one = T::from_i64(1);
    ArrayD::from_shape_fn(
        IxDyn(&[rows, cols]),
        |idx| {
            if idx[1] as i64 - idx[0] as i64 == k {
                one
            } else {
                T::default()
            }
        },
    )
}

/// `n` copies of the single element of `value`, shaped `shape` (ConstantOfShape).
pub fn fill(value: &Tensor, shape: &[usize]) -> OpResult<Tensor> {
    fn go<T: Elem>(a: &ArrayD<T>, shape: &[usize]) -> OpResult<Tensor> {
        let v = a.iter().next().copied().ok_or_else(|| OpError("the fill value has no element".into()))?;
        Ok(T::wrap(ArrayD::from_elem(IxDyn(shape), v)))
    }
    crate::with_tensor!(value, a => go(a, shape))
}

/// Number of elements of `Range(start, limit, delta)`: `max(ceil((limit - start) / delta), 0)`.
pub fn range_len_f64(start: f64, limit: f64, delta: f64) -> OpResult<usize> {
    if delta == 0.0 {
        return Err(OpError("Range: 'delta' must not be zero".into()));
    }
    let n = ((limit - start) / delta).ceil();
    if !n.is_finite() {
        return Err(OpError(format!("Range({start}, {limit}, {delta}) has no finite length")));
    }
    Ok(n.max(0.0) as usize)
}

/// Integer `Range`, exact in i64: `start, start+delta, ...` while before `limit`.
pub fn range_i64(start: i64, limit: i64, delta: i64) -> OpResult<Vec<i64>> {
    if delta == 0 {
        return Err(OpError("Range: 'delta' must not be zero".into()));
    }
    let span = limit as i128 - start as i128;
    let d = delta as i128;
    // ceil(span / d) for either sign of d.
    let n = if d > 0 { (span + d - 1).div_euclid(d) } else { (-span + (-d) - 1).div_euclid(-d) }.max(0);
    let n = usize::try_from(n).map_err(|_| OpError(format!("Range({start}, {limit}, {delta}) is too long")))?;
    Ok((0..n as i64).map(|i| start + i * delta).collect())
}

/// Float `Range`, accumulated in the element type like ONNX Runtime (`v += delta`), so the
/// rounding of long float ranges matches it.
pub fn range_f32(start: f32, limit: f32, delta: f32) -> OpResult<Vec<f32>> {
    let n = range_len_f64(start as f64, limit as f64, delta as f64)?;
    let mut v = start;
    Ok((0..n)
        .map(|_| {
            let out = v;
            v += delta;
            out
        })
        .collect())
}

/// See `range_f32`.
pub fn range_f64(start: f64, limit: f64, delta: f64) -> OpResult<Vec<f64>> {
    let n = range_len_f64(start, limit, delta)?;
    let mut v = start;
    Ok((0..n)
        .map(|_| {
            let out = v;
            v += delta;
            out
        })
        .collect())
}

/// Concatenates tensors of one dtype along `axis`.
pub fn concat_tensors(ts: &[&Tensor], axis: usize) -> OpResult<Tensor> {
    let dtype = match ts.first() {
        Some(t) => t.dtype(),
        None => return Err(OpError("Concat needs at least one input".into())),
    };
    with_dtype!(dtype, T => {
        let arrays: Vec<&ArrayD<T>> = ts
            .iter()
            .map(|t| T::view(t).ok_or_else(|| OpError(format!("inputs mix {} and {}", dtype, t.dtype()))))
            .collect::<OpResult<_>>()?;
        concat(&arrays, axis).map(T::wrap)
    })
}

/// Pads a tensor; `value` is the constant fill (already of the tensor's dtype) or `None` for 0.
pub fn pad_tensor(t: &Tensor, pads: &[(i64, i64)], mode: PadMode, value: Option<&Tensor>) -> OpResult<Tensor> {
    let dtype = t.dtype();
    with_dtype!(dtype, T => {
        let a = T::view(t).ok_or_else(|| OpError("internal dtype mismatch".into()))?;
        let fill = match value {
            None => T::default(),
            Some(v) => {
                let v = T::view(v).ok_or_else(|| OpError(format!("constant_value is {}, the data {}", v.dtype(), dtype)))?;
                v.iter().next().copied().unwrap_or_default()
            }
        };
        pad(a, pads, mode, fill).map(T::wrap)
    })
}

/// An identity-like matrix of `dtype`.
pub fn eye_tensor(dtype: DType, rows: usize, cols: usize, k: i64) -> Tensor {
    with_dtype!(dtype, T => T::wrap(eye::<T>(rows, cols, k)))
}

/// `NonZero`: the coordinates of the non-zero elements in row-major order, as a
/// `[rank, count]` int64 array. A 0-D input is read as 1-D of one element, as ONNX Runtime does.
pub fn nonzero<T: Elem>(a: &ArrayD<T>) -> ArrayD<i64> {
    let rank = a.ndim().max(1);
    let zero = T::default();
    let hits: Vec<Vec<usize>> = a
        .indexed_iter()
        .filter(|(_, v)| **v != zero)
        .map(|(idx, _)| if a.ndim() == 0 { vec![0] } else { idx.slice().to_vec() })
        .collect();
    ArrayD::from_shape_fn(IxDyn(&[rank, hits.len()]), |i| hits[i[1]][i[0]] as i64)
}

/// Order of two elements for `TopK`: NaN compares above every number (ONNX Runtime puts it
/// first for `largest=1` and last for `largest=0`).
fn topk_order<T: Elem + PartialOrd>(a: &T, b: &T) -> std::cmp::Ordering {
    #[allow(clippy::eq_op)]
    let nan = |v: &T| v != v;
    match a.partial_cmp(b) {
        Some(o) => o,
        None => nan(a).cmp(&nan(b)),
    }
}

/// `TopK` along `axis`: the `k` largest (or smallest) elements of every lane, sorted, ties by
/// lower index first, with their int64 indices. `k` must not exceed the axis size.
pub fn top_k<T: Elem + PartialOrd>(a: &ArrayD<T>, axis: usize, k: usize, largest: bool) -> (ArrayD<T>, ArrayD<i64>) {
    let mut shape = a.shape().to_vec();
    shape[axis] = k;
    let mut values = ArrayD::from_elem(IxDyn(&shape), T::default());
    let mut indices = ArrayD::from_elem(IxDyn(&shape), 0i64);
    let lanes = a.lanes(Axis(axis)).into_iter();
    let outs = values.lanes_mut(Axis(axis)).into_iter().zip(indices.lanes_mut(Axis(axis)));
    for (lane, (mut v_out, mut i_out)) in lanes.zip(outs) {
        let mut order: Vec<usize> = (0..lane.len()).collect();
        // A stable sort keeps equal elements in index order.
        if largest {
            order.sort_by(|&x, &y| topk_order(&lane[y], &lane[x]));
        } else {
            order.sort_by(|&x, &y| topk_order(&lane[x], &lane[y]));
        }
        for (slot, &src) in order.iter().take(k).enumerate() {
            v_out[slot] = lane[src];
            i_out[slot] = src as i64;
        }
    }
    (values, indices)
}

/// `nonzero` on any tensor.
pub fn nonzero_tensor(t: &Tensor) -> Tensor {
    Tensor::I64(crate::with_tensor!(t, a => nonzero(a)))
}

/// `top_k` on any non-bool tensor: (values, int64 indices).
pub fn top_k_tensor(t: &Tensor, axis: usize, k: usize, largest: bool) -> OpResult<(Tensor, Tensor)> {
    if t.dtype() == DType::Bool {
        return Err(OpError("TopK of bool is not supported (numeric types are)".into()));
    }
    with_dtype!(t.dtype(), E => {
        let a = E::view(t).ok_or_else(|| OpError("internal: tensor does not hold its dtype".into()))?;
        let (v, i) = top_k(a, axis, k, largest);
        Ok((E::wrap(v), Tensor::I64(i)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::ArrayD;

    fn arr(shape: &[usize], v: Vec<i64>) -> ArrayD<i64> {
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    #[test]
    fn slice_negative_step_starts_at_first() {
        let a = arr(&[6], (0..6).collect());
        let out = slice(&a, &[AxisSlice { first: 5, step: -2, len: 3 }]);
        assert_eq!(out.iter().copied().collect::<Vec<_>>(), vec![5, 3, 1]);
        let out = slice(&a, &[AxisSlice { first: 1, step: 2, len: 3 }]);
        assert_eq!(out.iter().copied().collect::<Vec<_>>(), vec![1, 3, 5]);
        let out = slice(&a, &[AxisSlice { first: 3, step: 1, len: 0 }]);
        assert_eq!(out.len(), 0);
    }

    #[test]
    fn pad_modes_match_numpy() {
        // numpy.pad([1,2,3], (2,3), mode) for each mode.
        let a = arr(&[3], vec![1, 2, 3]);
        let run = |m| pad(&a, &[(2, 3)], m, 9).unwrap().iter().copied().collect::<Vec<_>>();
        assert_eq!(run(PadMode::Constant), vec![9, 9, 1, 2, 3, 9, 9, 9]);
        let reflect = pad(&a, &[(2, 2)], PadMode::Reflect, 0).unwrap();
        assert_eq!(reflect.iter().copied().collect::<Vec<_>>(), vec![3, 2, 1, 2, 3, 2, 1]);
        assert!(pad(&a, &[(3, 0)], PadMode::Reflect, 0).is_err());
        assert_eq!(run(PadMode::Edge), vec![1, 1, 1, 2, 3, 3, 3, 3]);
        assert_eq!(run(PadMode::Wrap), vec![2, 3, 1, 2, 3, 1, 2, 3]);
        let cropped = pad(&a, &[(-1, 1)], PadMode::Constant, 0).unwrap();
        assert_eq!(cropped.iter().copied().collect::<Vec<_>>(), vec![2, 3, 0]);
    }

    #[test]
    fn ranges() {
        assert_eq!(range_i64(10, 4, -3).unwrap(), vec![10, 7]);
        assert_eq!(range_i64(0, 0, 1).unwrap(), Vec::<i64>::new());
        assert_eq!(range_f32(0.0, 1.0, 0.25).unwrap(), vec![0.0, 0.25, 0.5, 0.75]);
        assert!(range_i64(0, 3, 0).is_err());
    }

    #[test]
    fn tile_and_gather() {
        let a = arr(&[2], vec![1, 2]);
        assert_eq!(tile(&a, &[3]).iter().copied().collect::<Vec<_>>(), vec![1, 2, 1, 2, 1, 2]);
        let m = arr(&[2, 3], (0..6).collect());
        let g = gather(&m, 1, &[2, 0], &[2]).unwrap();
        assert_eq!(g.shape(), &[2, 2]);
        assert_eq!(g.iter().copied().collect::<Vec<_>>(), vec![2, 0, 5, 3]);
    }

    #[test]
    fn pad_amounts_from_the_model_do_not_overflow() {
        let a = arr(&[2], vec![1, 2]);
        let e = pad(&a, &[(i64::MIN, 0)], PadMode::Constant, 0).unwrap_err();
        assert!(e.0.contains("crop more than"), "{}", e.0);
        let e = pad(&a, &[(i64::MAX, i64::MAX)], PadMode::Constant, 0).unwrap_err();
        assert!(e.0.contains("overflow"), "{}", e.0);
        let b = arr(&[1, 1], vec![7]);
        let e = pad(&b, &[(0, 1 << 40), (0, 1 << 40)], PadMode::Constant, 0).unwrap_err();
        assert!(e.0.contains("too large"), "{}", e.0);
    }
}
