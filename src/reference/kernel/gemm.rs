//! Reference kernel of the fused (batched) matrix product.

use crate::ir::broadcast::broadcast_usize;
use crate::ir::ops::kernel::Gemm;
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, Ix2, IxDyn};

/// `act(alpha·op(A)·op(B) + beta·bias + residual)` with numpy `matmul` batching.
pub fn gemm(
    op: &Gemm,
    a: &ArrayD<f32>,
    b: &ArrayD<f32>,
    bias: Option<&ArrayD<f32>>,
    residual: Option<&ArrayD<f32>>,
) -> OpResult<ArrayD<f32>> {
    let err = |e: ndarray::ShapeError| OpError(e.to_string());
    let a2 = if a.ndim() == 1 { a.view().insert_axis(ndarray::Axis(0)).into_owned() } else { a.clone() };
    let b2 = if b.ndim() == 1 { b.view().insert_axis(ndarray::Axis(1)).into_owned() } else { b.clone() };
    let (ra, rb) = (a2.ndim(), b2.ndim());
    let mut a2 = a2;
    let mut b2 = b2;
    if op.trans_a {
        a2.swap_axes(ra - 2, ra - 1);
    }
    if op.trans_b {
        b2.swap_axes(rb - 2, rb - 1);
    }
    let (m, k) = (a2.shape()[ra - 2], a2.shape()[ra - 1]);
    let (kb, n) = (b2.shape()[rb - 2], b2.shape()[rb - 1]);
    if k != kb {
        return Err(OpError(format!("inner dimensions differ: {k} and {kb}")));
    }
    let batch = broadcast_usize(&[&a2.shape()[..ra - 2], &b2.shape()[..rb - 2]])?;
    let mut a_shape = batch.clone();
    a_shape.extend([m, k]);
    let mut b_shape = batch.clone();
    b_shape.extend([k, n]);
    let av = a2.broadcast(IxDyn(&a_shape)).ok_or_else(|| OpError("A does not broadcast over the batch".into()))?;
    let bv = b2.broadcast(IxDyn(&b_shape)).ok_or_else(|| OpError("B does not broadcast over the batch".into()))?;
    let nb: usize = batch.iter().product();
    let a3 = av.as_standard_layout().into_owned().into_shape_with_order((nb, m, k)).map_err(err)?;
    let b3 = bv.as_standard_layout().into_owned().into_shape_with_order((nb, k, n)).map_err(err)?;
    let mut out = ndarray::Array3::<f32>::zeros((nb, m, n));
    for i in 0..nb {
        let x = a3.index_axis(ndarray::Axis(0), i).into_dimensionality::<Ix2>().map_err(err)?;
        let y = b3.index_axis(ndarray::Axis(0), i).into_dimensionality::<Ix2>().map_err(err)?;
        let mut dst = out.index_axis_mut(ndarray::Axis(0), i);
        ndarray::linalg::general_mat_mul(op.alpha, &x, &y, 0.0, &mut dst);
    }
    let mut shape = batch;
    if a.ndim() > 1 {
        shape.push(m);
    }
    if b.ndim() > 1 {
        shape.push(n);
    }
    let mut out = out.into_shape_with_order(IxDyn(&shape)).map_err(err)?;
    if let Some(c) = bias {
        let cv = c
            .broadcast(IxDyn(&shape))
            .ok_or_else(|| OpError(format!("bias {:?} does not broadcast to {shape:?}", c.shape())))?;
        let beta = op.beta;
        ndarray::Zip::from(&mut out).and(&cv).for_each(|o, &c| *o += beta * c);
    }
    if let Some(r) = residual {
        let rv = r
            .broadcast(IxDyn(&shape))
            .ok_or_else(|| OpError(format!("residual {:?} does not broadcast to {shape:?}", r.shape())))?;
        out += &rv;
    }
    if let Some(f) = op.act {
        out.mapv_inplace(|v| f.apply(v));
    }
    Ok(out)
}
