//! Reference kernel of the squeeze-and-excitation scale (`crate::ir::ops::kernel::SqueezeExciteScale`).

use crate::ir::ops::kernel::Act;
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, IxDyn};

/// `scale[n, c] = gate(b2[c] + Σ_j w2[c, j] · act(b1[j] + Σ_i w1[j, i] · mean_hw x[n, h, w, i]))`
/// for x `[N, H, W, C]` (NHWC), w1 `[S, 1, 1, C]` and w2 `[C, 1, 1, S]` (KRSC 1x1 filters), b1
/// `[S]`, b2 `[C]`; returns `[N, 1, 1, C]`. Sums in f64, so the reference is not the least
/// accurate of the engines it checks.
pub fn squeeze_excite_scale(
    x: &ArrayD<f32>,
    w1: &ArrayD<f32>,
    b1: Option<&ArrayD<f32>>,
    act: Option<Act>,
    w2: &ArrayD<f32>,
    b2: Option<&ArrayD<f32>>,
    gate: Option<Act>,
) -> OpResult<ArrayD<f32>> {
    let bad = |m: String| Err(OpError(m));
    if x.ndim() != 4 || w1.ndim() != 4 || w2.ndim() != 4 {
        return bad(format!(
            "squeeze-excite needs rank-4 x, w1 and w2, found {:?}, {:?}, {:?}",
            x.shape(),
            w1.shape(),
            w2.shape()
        ));
    }
    let (n, h, w, c) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let s = w1.shape()[0];
    if w1.shape() != [s, 1, 1, c] || w2.shape() != [c, 1, 1, s] {
        return bad(format!(
            "squeeze-excite weights {:?} and {:?} do not fit {c} channels (want [S,1,1,{c}] and [{c},1,1,S])",
            w1.shape(),
            w2.shape()
        ));
    }
    let vec_of = |b: Option<&ArrayD<f32>>, len: usize, what: &str| -> OpResult<Vec<f32>> {
        match b {
            None => Ok(vec![0.0; len]),
            Some(b) if b.len() == len => Ok(b.iter().copied().collect()),
            Some(b) => Err(OpError(format!("{what} has {} values, want {len}", b.len()))),
        }
    };
    let b1 = vec_of(b1, s, "b1")?;
    let b2 = vec_of(b2, c, "b2")?;
    let x = x.as_standard_layout();
    let w1 = w1.as_standard_layout();
    let w2 = w2.as_standard_layout();
    let (Some(xs), Some(w1s), Some(w2s)) = (x.as_slice(), w1.as_slice(), w2.as_slice()) else {
        return bad("squeeze-excite operands are not contiguous".into());
    };
    let apply = |f: Option<Act>, v: f32| f.map_or(v, |f| f.apply(v));
    let pixels = h * w;
    let mut out = vec![0f32; n * c];
    let mut pooled = vec![0f64; c];
    let mut hidden = vec![0f32; s];
    for img in 0..n {
        pooled.iter_mut().for_each(|p| *p = 0.0);
        for px in xs[img * pixels * c..(img + 1) * pixels * c].chunks(c.max(1)) {
            for (p, &v) in pooled.iter_mut().zip(px) {
                *p += v as f64;
            }
        }
        let inv = 1.0 / pixels.max(1) as f64;
        for (j, hj) in hidden.iter_mut().enumerate() {
            let row = &w1s[j * c..(j + 1) * c];
            let dot: f64 = row.iter().zip(&pooled).map(|(&wv, &p)| wv as f64 * p * inv).sum();
            *hj = apply(act, (dot + b1[j] as f64) as f32);
        }
        for ch in 0..c {
            let row = &w2s[ch * s..(ch + 1) * s];
            let dot: f64 = row.iter().zip(&hidden).map(|(&wv, &hv)| wv as f64 * hv as f64).sum();
            out[img * c + ch] = apply(gate, (dot + b2[ch] as f64) as f32);
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[n, 1, 1, c]), out).map_err(|e| OpError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values worked by hand: two images of 2x1 pixels, 2 channels, a squeeze of 1.
    #[test]
    fn pools_then_two_dense_layers_with_activations() {
        // image 0 pixels (1, 3), (3, 5): means (2, 4); image 1: (0, -2), (2, 2): means (1, 0).
        let x = ArrayD::from_shape_vec(IxDyn(&[2, 2, 1, 2]), vec![1.0, 3.0, 3.0, 5.0, 0.0, -2.0, 2.0, 2.0]).unwrap();
        let w1 = ArrayD::from_shape_vec(IxDyn(&[1, 1, 1, 2]), vec![0.5, -1.0]).unwrap();
        let b1 = ArrayD::from_shape_vec(IxDyn(&[1]), vec![1.0]).unwrap();
        let w2 = ArrayD::from_shape_vec(IxDyn(&[2, 1, 1, 1]), vec![2.0, -1.0]).unwrap();
        let b2 = ArrayD::from_shape_vec(IxDyn(&[2]), vec![0.0, 0.5]).unwrap();
        let out = squeeze_excite_scale(&x, &w1, Some(&b1), Some(Act::Relu), &w2, Some(&b2), None).unwrap();
        // image 0: hidden = relu(0.5·2 − 4 + 1) = 0 → (0, 0.5); image 1: relu(0.5 + 1) = 1.5 → (3, −1).
        assert_eq!(out.shape(), &[2, 1, 1, 2]);
        assert_eq!(out.iter().copied().collect::<Vec<_>>(), vec![0.0, 0.5, 3.0, -1.0]);
        let gated = squeeze_excite_scale(&x, &w1, Some(&b1), Some(Act::Relu), &w2, None, Some(Act::Sigmoid)).unwrap();
        let want = [0.5, 0.5, 1.0 / (1.0 + (-3.0f32).exp()), 1.0 / (1.0 + 1.5f32.exp())];
        for (g, w) in gated.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{g} vs {w}");
        }
    }

    #[test]
    fn mismatched_weights_are_an_error() {
        let x = ArrayD::zeros(IxDyn(&[1, 2, 2, 4]));
        let w1 = ArrayD::zeros(IxDyn(&[2, 1, 1, 4]));
        let w2 = ArrayD::zeros(IxDyn(&[4, 1, 1, 3]));
        assert!(squeeze_excite_scale(&x, &w1, None, None, &w2, None, None).is_err());
    }
}
