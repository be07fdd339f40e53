//! Reference kernels of the linalg family (Gemm, MatMul) and the SGEMM wrapper every
//! compute-heavy kernel (convolution included) builds on.
//!
//! All float products go through `matrixmultiply::sgemm` (blocked, vectorised, threaded);
//! nothing here multiplies matrices with scalar loops except the exact integer MatMul.

use crate::ir::broadcast::broadcast_usize;
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, ArrayViewD, CowArray, IxDyn};
use num_traits::{WrappingAdd, WrappingMul, Zero};

/// A strided read-only matrix over a slice: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major matrix (`rows × cols`, contiguous rows).
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> MatRef<'a> {
        MatRef { data, rows, cols, rs: cols, cs: 1 }
    }

    /// The transpose, as a view with swapped strides (no copy).
    pub fn t(self) -> MatRef<'a> {
        MatRef { data: self.data, rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs }
    }

    /// Whether every element index lies inside `data` (checked before handing raw pointers out).
    fn in_bounds(&self) -> bool {
        if self.rows == 0 || self.cols == 0 {
            return true;
        }
        (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `c = alpha * a × b + beta * c`, with `c` row-major `a.rows × b.cols` (contiguous). When `beta`
/// is 0, `c` is overwritten without being read (so it may hold garbage, even NaN).
pub fn sgemm(alpha: f32, a: MatRef, b: MatRef, beta: f32, c: &mut [f32]) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    // Shape mismatches are programming errors of the callers in this crate, never user input:
    // every op checks shapes against the model before calling here.
    assert!(b.rows == k && c.len() == m * n, "sgemm: [{m}x{k}] x [{}x{n}] into {} values", b.rows, c.len());
    assert!(a.in_bounds() && b.in_bounds(), "sgemm: operand strides exceed their data");
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // matrixmultiply handles k = 0 too, but be explicit: the product is empty.
        if beta == 0.0 {
            c.fill(0.0);
        } else {
            c.iter_mut().for_each(|v| *v *= beta);
        }
        return;
    }
    // SAFETY: the asserts above keep every index of a, b and c inside its slice; the three
    // slices are distinct borrows so c does not alias a or b.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr(),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr(),
            b.rs as isize,
            b.cs as isize,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        );
    }
}

/// The array in standard (row-major contiguous) layout, borrowed when it already is.
pub fn standard(a: &ArrayD<f32>) -> CowArray<'_, f32, IxDyn> {
    a.as_standard_layout()
}

/// Contiguous data of a standard-layout array.
pub fn contiguous<'a, T>(a: &'a CowArray<'_, T, IxDyn>) -> &'a [T] {
    // `as_standard_layout` guarantees contiguity, so this cannot fail.
    a.as_slice().expect("standard layout arrays are contiguous")
}

/// ONNX Gemm: `alpha * op(a) × op(b) + beta * c`, with `c` unidirectionally broadcast to `[M, N]`.
pub fn gemm(
    a: &ArrayD<f32>,
    b: &ArrayD<f32>,
    c: Option<&ArrayD<f32>>,
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
) -> OpResult<ArrayD<f32>> {
    if a.ndim() != 2 || b.ndim() != 2 {
        return Err(OpError(format!("Gemm needs 2-D A and B, got {:?} and {:?}", a.shape(), b.shape())));
    }
    let (a_std, b_std) = (standard(a), standard(b));
    let mut am = MatRef::row_major(contiguous(&a_std), a.shape()[0], a.shape()[1]);
    let mut bm = MatRef::row_major(contiguous(&b_std), b.shape()[0], b.shape()[1]);
    if trans_a {
        am = am.t();
    }
    if trans_b {
        bm = bm.t();
    }
    if am.cols != bm.rows {
        return Err(OpError(format!(
            "Gemm: inner dimensions differ: op(A) is [{}, {}] and op(B) is [{}, {}]",
            am.rows, am.cols, bm.rows, bm.cols
        )));
    }
    let (m, n) = (am.rows, bm.cols);
    let mut out = vec![0.0f32; m * n];
    let mut gemm_beta = 0.0;
    if let Some(c) = c.filter(|_| beta != 0.0) {
        let target = broadcast_usize(&[c.shape(), &[m, n]])?;
        if target != [m, n] {
            return Err(OpError(format!("Gemm: C of shape {:?} cannot be broadcast to [{m}, {n}]", c.shape())));
        }
        let cb = c
            .broadcast(IxDyn(&[m, n]))
            .ok_or_else(|| OpError(format!("Gemm: C of shape {:?} cannot be broadcast to [{m}, {n}]", c.shape())))?;
        for (o, v) in out.iter_mut().zip(cb.iter()) {
            *o = beta * v;
        }
        gemm_beta = 1.0;
    }
    sgemm(alpha, am, bm, gemm_beta, &mut out);
    Ok(ArrayD::from_shape_vec(IxDyn(&[m, n]), out).expect("m*n values"))
}

/// Shapes of a numpy `matmul`: operands promoted to rank >= 2, the broadcast batch shape, and
/// the final output shape (with the promoted unit dims of 1-D operands removed).
pub struct MatMulShape {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a_batch: Vec<usize>,
    pub b_batch: Vec<usize>,
    pub batch: Vec<usize>,
    pub out: Vec<usize>,
}

pub fn matmul_shape(a: &[usize], b: &[usize]) -> OpResult<MatMulShape> {
    if a.is_empty() || b.is_empty() {
        return Err(OpError(format!("MatMul operands must have rank >= 1, got {a:?} and {b:?}")));
    }
    let a2: Vec<usize> = if a.len() == 1 { vec![1, a[0]] } else { a.to_vec() };
    let b2: Vec<usize> = if b.len() == 1 { vec![b[0], 1] } else { b.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (kb, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != kb {
        return Err(OpError(format!("MatMul: inner dimensions differ: {a:?} x {b:?} ({k} vs {kb})")));
    }
    let a_batch = a2[..a2.len() - 2].to_vec();
    let b_batch = b2[..b2.len() - 2].to_vec();
    let batch = broadcast_usize(&[&a_batch, &b_batch])?;
    let mut out = batch.clone();
    if a.len() > 1 {
        out.push(m);
    }
    if b.len() > 1 {
        out.push(n);
    }
    Ok(MatMulShape { m, k, n, a_batch, b_batch, batch, out })
}

/// Element offsets of each batch matrix of an operand with batch shape `own`, broadcast to
/// `batch` (a broadcast axis repeats the same matrix).
fn batch_offsets(own: &[usize], batch: &[usize], matrix_len: usize) -> Vec<usize> {
    let rank = batch.len();
    let pad = rank - own.len();
    // Row-major strides of the operand's own batch dims, 0 where it is broadcast.
    let mut strides = vec![0usize; rank];
    let mut s = matrix_len;
    for i in (0..own.len()).rev() {
        strides[pad + i] = if own[i] == 1 { 0 } else { s };
        s *= own[i];
    }
    let total: usize = batch.iter().product();
    let mut offs = Vec::with_capacity(total);
    let mut idx = vec![0usize; rank];
    for _ in 0..total {
        offs.push(idx.iter().zip(&strides).map(|(i, s)| i * s).sum());
        for ax in (0..rank).rev() {
            idx[ax] += 1;
            if idx[ax] < batch[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
    offs
}

/// numpy `matmul` of f32 arrays: 1-D operands are promoted and the unit dim removed again,
/// batch dims broadcast. One SGEMM per batch matrix, or one for the whole batch when `b` is a
/// single matrix (the batch then folds into the rows of `a`).
pub fn matmul(a: &ArrayD<f32>, b: &ArrayD<f32>) -> OpResult<ArrayD<f32>> {
    let sh = matmul_shape(a.shape(), b.shape())?;
    let (a_std, b_std) = (standard(a), standard(b));
    let (ad, bd) = (contiguous(&a_std), contiguous(&b_std));
    let (m, k, n) = (sh.m, sh.k, sh.n);
    let batches: usize = sh.batch.iter().product();
    let mut out = vec![0.0f32; batches * m * n];
    let b_single = sh.b_batch.iter().product::<usize>() == 1;
    let a_full = sh.a_batch.iter().product::<usize>() == batches;
    if b_single && a_full {
        let am = MatRef::row_major(ad, batches * m, k);
        let bm = MatRef::row_major(bd, k, n);
        sgemm(1.0, am, bm, 0.0, &mut out);
    } else if m * n > 0 {
        let a_offs = batch_offsets(&sh.a_batch, &sh.batch, m * k);
        let b_offs = batch_offsets(&sh.b_batch, &sh.batch, k * n);
        for (i, dst) in out.chunks_mut(m * n).enumerate() {
            let am = MatRef::row_major(&ad[a_offs[i]..a_offs[i] + m * k], m, k);
            let bm = MatRef::row_major(&bd[b_offs[i]..b_offs[i] + k * n], k, n);
            sgemm(1.0, am, bm, 0.0, dst);
        }
    }
    Ok(ArrayD::from_shape_vec(IxDyn(&sh.out), out).expect("output size matches its shape"))
}

/// numpy `matmul` of integer arrays, exact in the element type (wrapping on overflow, like
/// ONNX Runtime's integer kernels).
pub fn matmul_int<T>(a: ArrayViewD<T>, b: ArrayViewD<T>) -> OpResult<ArrayD<T>>
where
    T: Copy + Zero + WrappingAdd + WrappingMul,
{
    let sh = matmul_shape(a.shape(), b.shape())?;
    let a_std = a.as_standard_layout();
    let b_std = b.as_standard_layout();
    let ad = a_std.as_slice().expect("standard layout arrays are contiguous");
    let bd = b_std.as_slice().expect("standard layout arrays are contiguous");
    let (m, k, n) = (sh.m, sh.k, sh.n);
    let batches: usize = sh.batch.iter().product();
    let mut out = vec![T::zero(); batches * m * n];
    if m * n > 0 {
        let a_offs = batch_offsets(&sh.a_batch, &sh.batch, m * k);
        let b_offs = batch_offsets(&sh.b_batch, &sh.batch, k * n);
        for (bi, dst) in out.chunks_mut(m * n).enumerate() {
            let am = &ad[a_offs[bi]..a_offs[bi] + m * k];
            let bm = &bd[b_offs[bi]..b_offs[bi] + k * n];
            for i in 0..m {
                let row = &mut dst[i * n..(i + 1) * n];
                for p in 0..k {
                    let av = am[i * k + p];
                    for (o, &bv) in row.iter_mut().zip(&bm[p * n..(p + 1) * n]) {
                        *o = o.wrapping_add(&av.wrapping_mul(&bv));
                    }
                }
            }
        }
    }
    Ok(ArrayD::from_shape_vec(IxDyn(&sh.out), out).expect("output size matches its shape"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(shape: &[usize], v: Vec<f32>) -> ArrayD<f32> {
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    #[test]
    fn gemm_transposes_and_broadcasts_c() {
        // numpy: A = arange(6).reshape(3,2); B = arange(6).reshape(3,2)
        // 2 * A.T @ B + 0.5 * [1, 2] → [[40.5, 53], [52.5, 71]]
        let a = arr(&[3, 2], (0..6).map(|v| v as f32).collect());
        let b = arr(&[3, 2], (0..6).map(|v| v as f32).collect());
        let c = arr(&[2], vec![1.0, 2.0]);
        let y = gemm(&a, &b, Some(&c), true, false, 2.0, 0.5).unwrap();
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![40.5, 53.0, 52.5, 71.0]);
        let bad = gemm(&a, &b, None, false, false, 1.0, 1.0).unwrap_err();
        assert!(bad.0.contains("inner dimensions"), "{}", bad.0);
    }

    #[test]
    fn matmul_promotes_vectors_and_broadcasts_batches() {
        let a = arr(&[3], vec![1.0, 2.0, 3.0]);
        let b = arr(&[3], vec![4.0, 5.0, 6.0]);
        let dot = matmul(&a, &b).unwrap();
        assert_eq!(dot.shape(), &[] as &[usize]);
        assert_eq!(dot.iter().copied().collect::<Vec<_>>(), vec![32.0]);
        // numpy: A = arange(12).reshape(2,1,2,3); B = arange(18).reshape(3,3,2); (A @ B).shape = (2,3,2,2)
        let a = arr(&[2, 1, 2, 3], (0..12).map(|v| v as f32).collect());
        let b = arr(&[3, 3, 2], (0..18).map(|v| v as f32).collect());
        let y = matmul(&a, &b).unwrap();
        assert_eq!(y.shape(), &[2, 3, 2, 2]);
        // (A @ B)[1, 2, 1] = [9,10,11] @ [[12,13],[14,15],[16,17]] = [424, 454]
        assert_eq!(y[[1, 2, 1, 0]], 424.0);
        assert_eq!(y[[1, 2, 1, 1]], 454.0);
        // Folded path: [2,2,3] @ [3,2]
        let y2 = matmul(
            &arr(&[2, 2, 3], (0..12).map(|v| v as f32).collect()),
            &arr(&[3, 2], (12..18).map(|v| v as f32).collect()),
        )
        .unwrap();
        assert_eq!(y2[[1, 1, 0]], 424.0);
    }

    #[test]
    fn integer_matmul_is_exact() {
        let a = ArrayD::from_shape_vec(IxDyn(&[1, 2]), vec![1i64 << 40, 3]).unwrap();
        let b = ArrayD::from_shape_vec(IxDyn(&[2, 1]), vec![3i64, 1]).unwrap();
        let y = matmul_int(a.view(), b.view()).unwrap();
        assert_eq!(y[[0, 0]], 3 * (1i64 << 40) + 3);
    }
}
