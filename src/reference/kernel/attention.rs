//! Reference kernel of fused attention (`crate::ir::ops::kernel::Attention`).

use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, IxDyn};

/// `q` `[B,Sq,H,D]`, `k` `[B,Sk,H,D]`, `v` `[B,Sk,H,Dv]`, `mask` broadcastable to `[B,H,Sq,Sk]`.
/// Scores and sums in f64; a row whose scores are all -inf (fully masked) gives NaN, as the
/// unfused softmax does.
pub fn attention(
    q: &ArrayD<f32>,
    k: &ArrayD<f32>,
    v: &ArrayD<f32>,
    mask: Option<&ArrayD<f32>>,
    scale: f32,
) -> OpResult<ArrayD<f32>> {
    let bad = |what: &str, a: &ArrayD<f32>| OpError(format!("attention: {what} {:?} is not rank 4", a.shape()));
    if q.ndim() != 4 {
        return Err(bad("q", q));
    }
    if k.ndim() != 4 {
        return Err(bad("k", k));
    }
    if v.ndim() != 4 {
        return Err(bad("v", v));
    }
    let (b, sq, h, d) = (q.shape()[0], q.shape()[1], q.shape()[2], q.shape()[3]);
    let (sk, dv) = (k.shape()[1], v.shape()[3]);
    if k.shape() != [b, sk, h, d] || v.shape()[..3] != [b, sk, h] {
        return Err(OpError(format!(
            "attention: q {:?}, k {:?} and v {:?} do not agree",
            q.shape(),
            k.shape(),
            v.shape()
        )));
    }
    let m = match mask {
        Some(m) => Some(m.broadcast(IxDyn(&[b, h, sq, sk])).ok_or_else(|| {
            OpError(format!("attention: mask {:?} does not broadcast to {:?}", m.shape(), [b, h, sq, sk]))
        })?),
        None => None,
    };
    let mut out = ArrayD::<f32>::zeros(IxDyn(&[b, sq, h, dv]));
    let mut s = vec![0f64; sk];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..sq {
                let mut max = f64::NEG_INFINITY;
                for (j, sj) in s.iter_mut().enumerate() {
                    let mut dot = 0f64;
                    for di in 0..d {
                        dot += q[[bi, i, hi, di]] as f64 * k[[bi, j, hi, di]] as f64;
                    }
                    // The unfused graph rounds the scaled product to the activation type before
                    // adding the mask; f32 here, as the reference computes in f32.
                    let mut x = (dot as f32 * scale) as f64;
                    if let Some(m) = &m {
                        x += m[[bi, hi, i, j]] as f64;
                    }
                    *sj = x;
                    max = max.max(x);
                }
                let mut sum = 0f64;
                for sj in s.iter_mut() {
                    *sj = (*sj - max).exp();
                    sum += *sj;
                }
                for e in 0..dv {
                    let mut acc = 0f64;
                    for (j, p) in s.iter().enumerate() {
                        acc += p * v[[bi, j, hi, e]] as f64;
                    }
                    out[[bi, i, hi, e]] = (acc / sum) as f32;
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arr(shape: &[usize], f: impl Fn(usize) -> f32) -> ArrayD<f32> {
        let n: usize = shape.iter().product();
        ArrayD::from_shape_vec(IxDyn(shape), (0..n).map(f).collect()).unwrap()
    }

    /// One key: the output is that key's value whatever the scores; two equal keys average.
    #[test]
    fn softmax_weights_sum_to_one() {
        let q = arr(&[1, 2, 1, 2], |i| i as f32);
        let k = arr(&[1, 1, 1, 2], |i| i as f32 - 0.5);
        let v = arr(&[1, 1, 1, 3], |i| 10.0 + i as f32);
        let o = attention(&q, &k, &v, None, 0.7).unwrap();
        assert_eq!(o.iter().copied().collect::<Vec<_>>(), vec![10.0, 11.0, 12.0, 10.0, 11.0, 12.0]);
        // A mask of -inf on key 1 leaves key 0 alone.
        let k2 = arr(&[1, 2, 1, 2], |i| i as f32);
        let v2 = arr(&[1, 2, 1, 1], |i| i as f32 * 4.0);
        let mask = ArrayD::from_shape_vec(IxDyn(&[1, 1, 1, 2]), vec![0.0, f32::NEG_INFINITY]).unwrap();
        let o = attention(&q, &k2, &v2, Some(&mask), 1.0).unwrap();
        assert_eq!(o.iter().copied().collect::<Vec<_>>(), vec![0.0, 0.0]);
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let q = arr(&[1, 2, 1, 2], |_| 0.0);
        let k = arr(&[1, 2, 2, 2], |_| 0.0);
        assert!(attention(&q, &k, &k, None, 1.0).is_err());
    }
}
