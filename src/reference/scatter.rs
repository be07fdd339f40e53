//! Reference kernels of the scatter family: GatherND, ScatterND, ScatterElements (and its
//! deprecated alias Scatter), OneHot.
//!
//! Kernels work on row-major data with flat offsets. Indices arrive as raw i64 values and are
//! normalised here (negative values count from the end), so an out-of-range index found at run
//! time becomes an `OpError` naming the axis, never a panic. Reductions on integer types wrap
//! (like ONNX Runtime's kernels); float16/bfloat16 reduce through f32.

use crate::ir::ops::scatter::Reduction;
use crate::ir::{Elem, OpError, OpResult};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};

impl Reduction {
    pub fn name(self) -> &'static str {
        match self {
            Reduction::None => "none",
            Reduction::Add => "add",
            Reduction::Mul => "mul",
            Reduction::Max => "max",
            Reduction::Min => "min",
        }
    }
}

/// Element types that support the scatter reductions (every numeric type; not bool).
pub trait Reducible: Elem {
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn max_of(self, o: Self) -> Self;
    fn min_of(self, o: Self) -> Self;
}

macro_rules! reducible_int {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
            fn max_of(self, o: Self) -> Self { Ord::max(self, o) }
            fn min_of(self, o: Self) -> Self { Ord::min(self, o) }
        }
    )*};
}
reducible_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! reducible_float {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            fn add(self, o: Self) -> Self { self + o }
            fn mul(self, o: Self) -> Self { self * o }
            fn max_of(self, o: Self) -> Self { self.max(o) }
            fn min_of(self, o: Self) -> Self { self.min(o) }
        }
    )*};
}
reducible_float!(f32, f64);

macro_rules! reducible_half {
    ($($t:ty),*) => {$(
        impl Reducible for $t {
            fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
            fn max_of(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().max(o.to_f32())) }
            fn min_of(self, o: Self) -> Self { <$t>::from_f32(self.to_f32().min(o.to_f32())) }
        }
    )*};
}
reducible_half!(f16, bf16);

/// The combining function of a reduction: `f(current, update)`.
pub fn combiner<T: Reducible>(r: Reduction) -> fn(T, T) -> T {
    match r {
        Reduction::None => |_, u| u,
        Reduction::Add => T::add,
        Reduction::Mul => T::mul,
        Reduction::Max => T::max_of,
        Reduction::Min => T::min_of,
    }
}

/// Maps an index in `[-dim, dim)` to `[0, dim)`.
pub fn normalize_index(v: i64, dim: usize, axis: usize, op: &str) -> OpResult<usize> {
    let d = dim as i64;
    if v < -d || v >= d {
        return Err(OpError(format!("{op}: index {v} is out of range for axis {axis} of size {dim}")));
    }
    Ok(if v < 0 { (v + d) as usize } else { v as usize })
}

fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

fn contiguous_vec<T: Elem>(a: &ArrayD<T>) -> Vec<T> {
    a.iter().copied().collect()
}

fn shaped<T: Elem>(shape: &[usize], data: Vec<T>) -> OpResult<ArrayD<T>> {
    ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| OpError(format!("internal shape error: {e}")))
}

/// Flat offset (in `data_shape`) of the slice addressed by one index tuple starting at axis
/// `first_axis`, plus the batch offset `base`.
fn tuple_offset(
    tuple: &[i64],
    data_shape: &[usize],
    strides: &[usize],
    first_axis: usize,
    base: usize,
    op: &str,
) -> OpResult<usize> {
    let mut off = base;
    for (j, &v) in tuple.iter().enumerate() {
        let axis = first_axis + j;
        off += normalize_index(v, data_shape[axis], axis, op)? * strides[axis];
    }
    Ok(off)
}

/// GatherND with `batch_dims` leading batch axes shared by `data` and `indices`. `indices` has
/// shape `idx_shape` (last dim `m`, the index tuple length); the output has shape
/// `idx_shape[..q-1] ++ data.shape[batch_dims + m..]`. Shapes were validated by the op.
pub fn gather_nd<T: Elem>(
    data: &ArrayD<T>,
    indices: &[i64],
    idx_shape: &[usize],
    batch_dims: usize,
) -> OpResult<ArrayD<T>> {
    let dshape = data.shape();
    let q = idx_shape.len();
    let m = idx_shape[q - 1];
    let b = batch_dims;
    let strides = row_major_strides(dshape);
    let batches: usize = dshape[..b].iter().product();
    let batch_stride: usize = dshape[b..].iter().product();
    let tuples_per_batch: usize = idx_shape[b..q - 1].iter().product();
    let slice: usize = dshape[b + m..].iter().product();
    let src = contiguous_vec(data);
    let mut out = Vec::with_capacity(batches * tuples_per_batch * slice);
    for bi in 0..batches {
        for p in 0..tuples_per_batch {
            let t = (bi * tuples_per_batch + p) * m;
            let off = tuple_offset(&indices[t..t + m], dshape, &strides, b, bi * batch_stride, "GatherND")?;
            out.extend_from_slice(&src[off..off + slice]);
        }
    }
    let mut shape = idx_shape[..q - 1].to_vec();
    shape.extend_from_slice(&dshape[b + m..]);
    shaped(&shape, out)
}

/// ScatterND: a copy of `data` where each index tuple of `indices` (shape `idx_shape`, last dim
/// `m`) addresses a slice `data[tuple]` that is combined with the matching slice of `updates`
/// (shape `idx_shape[..q-1] ++ data.shape[m..]`, validated by the op). Updates apply in index
/// order.
pub fn scatter_nd<T: Elem>(
    data: &ArrayD<T>,
    indices: &[i64],
    idx_shape: &[usize],
    updates: &ArrayD<T>,
    combine: fn(T, T) -> T,
) -> OpResult<ArrayD<T>> {
    let dshape = data.shape();
    let q = idx_shape.len();
    let m = idx_shape[q - 1];
    let strides = row_major_strides(dshape);
    let tuples: usize = idx_shape[..q - 1].iter().product();
    let slice: usize = dshape[m..].iter().product();
    let mut out = contiguous_vec(data);
    let upd = contiguous_vec(updates);
    for p in 0..tuples {
        let off = tuple_offset(&indices[p * m..(p + 1) * m], dshape, &strides, 0, 0, "ScatterND")?;
        for (o, &u) in out[off..off + slice].iter_mut().zip(&upd[p * slice..(p + 1) * slice]) {
            *o = combine(*o, u);
        }
    }
    shaped(dshape, out)
}

/// ScatterElements along `axis`: for every position `i` of `indices` (same rank as `data`, each
/// dim no larger than data's — validated by the op), `out[i with axis := indices[i]]` is
/// combined with `updates[i]`. Updates apply in row-major order of `indices`.
pub fn scatter_elements<T: Elem>(
    data: &ArrayD<T>,
    axis: usize,
    indices: &[i64],
    idx_shape: &[usize],
    updates: &ArrayD<T>,
    combine: fn(T, T) -> T,
) -> OpResult<ArrayD<T>> {
    let dshape = data.shape();
    let strides = row_major_strides(dshape);
    let mut out = contiguous_vec(data);
    let upd = contiguous_vec(updates);
    let rank = idx_shape.len();
    let mut pos = vec![0usize; rank];
    for (k, (&v, &u)) in indices.iter().zip(&upd).enumerate() {
        let target = normalize_index(v, dshape[axis], axis, "ScatterElements")?;
        let off: usize = (0..rank).map(|j| if j == axis { target * strides[j] } else { pos[j] * strides[j] }).sum();
        out[off] = combine(out[off], u);
        // Advance the row-major position of `indices` (skipped after the last element).
        if k + 1 < indices.len() {
            for j in (0..rank).rev() {
                pos[j] += 1;
                if pos[j] < idx_shape[j] {
                    break;
                }
                pos[j] = 0;
            }
        }
    }
    shaped(dshape, out)
}

/// OneHot: the output has `depth` inserted into the indices' shape at `axis`; the cell whose
/// coordinate on `axis` equals the index is `on`, every other cell `off`. Indices outside
/// `[-depth, depth)` (or negative ones, unless `negative_wraps`) give an all-`off` line.
pub fn one_hot<T: Elem>(
    indices: &[i64],
    idx_shape: &[usize],
    depth: usize,
    axis: usize,
    off: T,
    on: T,
    negative_wraps: bool,
) -> OpResult<ArrayD<T>> {
    let outer: usize = idx_shape[..axis].iter().product();
    let inner: usize = idx_shape[axis..].iter().product();
    // `depth` comes from the model's data, so the output size is checked, not trusted.
    let total = outer
        .checked_mul(depth)
        .and_then(|n| n.checked_mul(inner))
        .ok_or_else(|| OpError(format!("OneHot: output of {outer} x {depth} x {inner} elements is too large")))?;
    let mut out = vec![off; total];
    let d = depth as i64;
    for o in 0..outer {
        for i in 0..inner {
            let mut v = indices[o * inner + i];
            if v < 0 && negative_wraps {
                v += d;
            }
            if (0..d).contains(&v) {
                out[(o * depth + v as usize) * inner + i] = on;
            }
        }
    }
    let mut shape = idx_shape[..axis].to_vec();
    shape.push(depth);
    shape.extend_from_slice(&idx_shape[axis..]);
    shaped(&shape, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr<T: Elem>(shape: &[usize], v: Vec<T>) -> ArrayD<T> {
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    #[test]
    fn gather_nd_with_batch_dims() {
        // numpy: data = arange(8).reshape(2,2,2); indices [[1],[0]] with batch_dims=1
        // -> [data[0,1], data[1,0]] = [[2,3],[4,5]]
        let data = arr(&[2, 2, 2], (0..8).collect::<Vec<i64>>());
        let y = gather_nd(&data, &[1, 0], &[2, 1], 1).unwrap();
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        let err = gather_nd(&data, &[2, 0], &[2, 1], 1).unwrap_err();
        assert!(err.0.contains("index 2 is out of range for axis 1"), "{}", err.0);
    }

    #[test]
    fn scatter_elements_accumulates_duplicates() {
        let data = arr(&[1, 5], vec![1.0f32, 2.0, 3.0, 4.0, 5.0]);
        let upd = arr(&[1, 2], vec![1.1f32, 2.1]);
        let y = scatter_elements(&data, 1, &[1, 1], &[1, 2], &upd, combiner(Reduction::Add)).unwrap();
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![1.0, 5.2, 3.0, 4.0, 5.0]);
    }

    #[test]
    fn one_hot_negative_indices() {
        let y = one_hot(&[-1, 1, 5], &[3], 3, 1, 0i64, 1, true).unwrap();
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![0, 0, 1, 0, 1, 0, 0, 0, 0]);
        let y = one_hot(&[-1], &[1], 3, 1, 0i64, 1, false).unwrap();
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![0, 0, 0]);
    }
}
