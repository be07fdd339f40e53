//! Reference kernel of the einsum family: a general Einstein summation over operands whose
//! axes carry integer labels (the op resolves letters and ellipsis dims to labels).
//!
//! Plan, for any number of operands: take the diagonal of every label repeated within one
//! operand, broadcast size-1 dims to the label's size, then contract the operands left to right.
//! Each pairwise step first sums out labels no later step needs, then permutes both operands to
//! `[batch, free, contracted]` / `[batch, contracted, free]` and runs one batched matrix product
//! (SGEMM for floats, through the caller's `bmm`). Labels the output does not keep are summed at
//! the end and the result is transposed into output order.

use super::indexing::transpose;
use super::scatter::Reducible;
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, Axis, IxDyn};

/// A batched matrix product `[B, M, K] x [B, K, N] -> [B, M, N]`.
pub type BatchedMatMul<T> = fn(&ArrayD<T>, &ArrayD<T>) -> OpResult<ArrayD<T>>;

/// An array whose axes are named by labels (distinct after `diagonal`).
struct Labeled<T> {
    data: ArrayD<T>,
    labels: Vec<usize>,
}

fn reshaped<T: Reducible>(a: &ArrayD<T>, shape: &[usize]) -> OpResult<ArrayD<T>> {
    let data: Vec<T> = a.iter().copied().collect();
    ArrayD::from_shape_vec(IxDyn(shape), data).map_err(|e| OpError(format!("internal shape error: {e}")))
}

/// Collapses repeated labels to their diagonal: `a[i, i, j]` with labels `[x, x, y]` becomes
/// `d[i, j]` with labels `[x, y]` (first-occurrence order). Repeated axes have equal sizes
/// (checked by the op).
fn diagonal<T: Reducible>(a: &ArrayD<T>, labels: &[usize]) -> Labeled<T> {
    let mut uniq: Vec<usize> = Vec::new();
    for &l in labels {
        if !uniq.contains(&l) {
            uniq.push(l);
        }
    }
    if uniq.len() == labels.len() {
        return Labeled { data: a.to_owned(), labels: uniq };
    }
    let pos: Vec<usize> = labels.iter().map(|l| uniq.iter().position(|u| u == l).expect("label is in uniq")).collect();
    let dims: Vec<usize> =
        uniq.iter().map(|u| a.shape()[labels.iter().position(|l| l == u).expect("label is in labels")]).collect();
    let data = ArrayD::from_shape_fn(IxDyn(&dims), |idx| {
        let src: Vec<usize> = pos.iter().map(|&p| idx[p]).collect();
        a[IxDyn(&src)]
    });
    Labeled { data, labels: uniq }
}

/// Sums out every axis whose label `keep` rejects.
fn sum_out<T: Reducible>(mut op: Labeled<T>, keep: impl Fn(usize) -> bool) -> Labeled<T> {
    for k in (0..op.labels.len()).rev() {
        if !keep(op.labels[k]) {
            op.data = op.data.fold_axis(Axis(k), T::default(), |acc, &v| acc.add(v));
            op.labels.remove(k);
        }
    }
    op
}

/// Permutes `op` so its labels come in the order `order` (a permutation of its labels).
fn permute_to<T: Reducible>(op: &Labeled<T>, order: &[usize]) -> ArrayD<T> {
    let perm: Vec<usize> =
        order.iter().map(|l| op.labels.iter().position(|x| x == l).expect("order lists op's labels")).collect();
    transpose(&op.data, &perm)
}

/// Contracts two operands over their shared labels; labels `needed` reports stay as batch dims.
fn contract<T: Reducible>(
    a: Labeled<T>,
    b: Labeled<T>,
    needed: impl Fn(usize) -> bool,
    dims: &[usize],
    bmm: BatchedMatMul<T>,
) -> OpResult<Labeled<T>> {
    let a = sum_out(a, |l| needed(l) || b.labels.contains(&l));
    let b = sum_out(b, |l| needed(l) || a.labels.contains(&l));
    let shared: Vec<usize> = a.labels.iter().copied().filter(|l| b.labels.contains(l)).collect();
    let batch: Vec<usize> = shared.iter().copied().filter(|&l| needed(l)).collect();
    let contracted: Vec<usize> = shared.iter().copied().filter(|&l| !needed(l)).collect();
    let a_free: Vec<usize> = a.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let b_free: Vec<usize> = b.labels.iter().copied().filter(|l| !shared.contains(l)).collect();
    let size = |ls: &[usize]| ls.iter().map(|&l| dims[l]).product::<usize>();
    let (bt, m, k, n) = (size(&batch), size(&a_free), size(&contracted), size(&b_free));
    let a_order: Vec<usize> = batch.iter().chain(&a_free).chain(&contracted).copied().collect();
    let b_order: Vec<usize> = batch.iter().chain(&contracted).chain(&b_free).copied().collect();
    let am = reshaped(&permute_to(&a, &a_order), &[bt, m, k])?;
    let bm = reshaped(&permute_to(&b, &b_order), &[bt, k, n])?;
    let prod = bmm(&am, &bm)?;
    let labels: Vec<usize> = batch.iter().chain(&a_free).chain(&b_free).copied().collect();
    let shape: Vec<usize> = labels.iter().map(|&l| dims[l]).collect();
    Ok(Labeled { data: reshaped(&prod, &shape)?, labels })
}

/// Einstein summation. `operands[i]` has one label per axis (labels may repeat: diagonal);
/// `dims[label]` is the broadcast size of each label (an operand's axis is either that size or
/// 1); `output` lists distinct labels. All of this was validated by the op.
pub fn einsum<T: Reducible>(
    operands: &[(&ArrayD<T>, Vec<usize>)],
    output: &[usize],
    dims: &[usize],
    bmm: BatchedMatMul<T>,
) -> OpResult<ArrayD<T>> {
    let mut ops: Vec<Labeled<T>> = Vec::with_capacity(operands.len());
    for (a, labels) in operands {
        let mut op = diagonal(a, labels);
        let full: Vec<usize> = op.labels.iter().map(|&l| dims[l]).collect();
        if op.data.shape() != full.as_slice() {
            let b = op.data.broadcast(IxDyn(&full)).ok_or_else(|| {
                OpError(format!("Einsum: operand of shape {:?} cannot be broadcast to {full:?}", op.data.shape()))
            })?;
            op.data = b.as_standard_layout().into_owned();
        }
        ops.push(op);
    }
    let mut rest = ops.into_iter();
    let mut acc = rest.next().ok_or_else(|| OpError("Einsum needs at least one operand".into()))?;
    let later: Vec<Labeled<T>> = rest.collect();
    let later_labels: Vec<Vec<usize>> = later.iter().map(|o| o.labels.clone()).collect();
    for (i, b) in later.into_iter().enumerate() {
        let needed = |l: usize| output.contains(&l) || later_labels[i + 1..].iter().any(|ls| ls.contains(&l));
        acc = contract(acc, b, needed, dims, bmm)?;
    }
    let acc = sum_out(acc, |l| output.contains(&l));
    Ok(permute_to(&acc, output))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bmm_f32(a: &ArrayD<f32>, b: &ArrayD<f32>) -> OpResult<ArrayD<f32>> {
        crate::reference::linalg::matmul(a, b)
    }

    fn arr(shape: &[usize], v: Vec<f32>) -> ArrayD<f32> {
        ArrayD::from_shape_vec(IxDyn(shape), v).unwrap()
    }

    #[test]
    fn trace_and_matmul() {
        // Labels: i=0, j=1, k=2.
        let a = arr(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let tr = einsum(&[(&a, vec![0, 0])], &[], &[2], bmm_f32).unwrap();
        assert_eq!(tr.iter().copied().collect::<Vec<_>>(), vec![5.0]);
        let b = arr(&[2, 3], (0..6).map(|v| v as f32).collect());
        let y = einsum(&[(&a, vec![0, 1]), (&b, vec![1, 2])], &[2, 0], &[2, 2, 3], bmm_f32).unwrap();
        // numpy: (a @ b).T
        assert_eq!(y.shape(), &[3, 2]);
        assert_eq!(y.iter().copied().collect::<Vec<_>>(), vec![6.0, 12.0, 9.0, 19.0, 12.0, 26.0]);
    }
}
