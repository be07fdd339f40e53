//! Reference kernels of the normalization family: BatchNormalization (inference form),
//! LayerNormalization, InstanceNormalization and LRN.
//!
//! Inputs are contiguous `[outer, channels, inner]`-style slices; statistics accumulate in f64
//! so long rows (LayerNorm over 4096 features, InstanceNorm over large images) stay accurate.

/// `y = (x - mean) / sqrt(var + eps) * scale + bias` per channel of `x` `[n, c, inner]`,
/// folded into one multiply-add per element.
#[allow(clippy::too_many_arguments)]
pub fn batch_norm(
    x: &[f32],
    n: usize,
    c: usize,
    inner: usize,
    scale: &[f32],
    bias: &[f32],
    mean: &[f32],
    var: &[f32],
    eps: f32,
) -> Vec<f32> {
    let (mul, add): (Vec<f32>, Vec<f32>) = (0..c)
        .map(|ch| {
            let a = scale[ch] / (var[ch] + eps).sqrt();
            (a, bias[ch] - mean[ch] * a)
        })
        .unzip();
    let mut y = vec![0.0f32; n * c * inner];
    for (i, (dst, src)) in y.chunks_mut(inner.max(1)).zip(x.chunks(inner.max(1))).enumerate().take(n * c) {
        let ch = i % c;
        let (a, b) = (mul[ch], add[ch]);
        for (d, &s) in dst.iter_mut().zip(src) {
            *d = s * a + b;
        }
    }
    y
}

/// Mean and `1 / sqrt(var + eps)` of one row (population variance).
fn row_stats(row: &[f32], eps: f32) -> (f32, f32) {
    let len = row.len().max(1) as f64;
    let mean = row.iter().map(|&v| v as f64).sum::<f64>() / len;
    let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / len;
    (mean as f32, (1.0 / (var + eps as f64).sqrt()) as f32)
}

/// Layer normalization of each of the `outer` rows of `inner` values. `scale` (and `bias`)
/// have `inner` values (already broadcast). Returns `(y, mean, inv_std_dev)`, one statistic per row.
pub fn layer_norm(
    x: &[f32],
    inner: usize,
    scale: &[f32],
    bias: Option<&[f32]>,
    eps: f32,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let outer = x.len().checked_div(inner).unwrap_or(0);
    let mut y = vec![0.0f32; x.len()];
    let (mut means, mut inv) = (Vec::with_capacity(outer), Vec::with_capacity(outer));
    for (dst, row) in y.chunks_mut(inner.max(1)).zip(x.chunks(inner.max(1))) {
        let (m, r) = row_stats(row, eps);
        means.push(m);
        inv.push(r);
        match bias {
            Some(b) => {
                for (((d, &v), &s), &bb) in dst.iter_mut().zip(row).zip(scale).zip(b) {
                    *d = (v - m) * r * s + bb;
                }
            }
            None => {
                for ((d, &v), &s) in dst.iter_mut().zip(row).zip(scale) {
                    *d = (v - m) * r * s;
                }
            }
        }
    }
    (y, means, inv)
}

/// Instance normalization of `x` `[n, c, inner]`: each (batch, channel) plane normalised on
/// its own statistics, then scaled and shifted per channel.
pub fn instance_norm(x: &[f32], c: usize, inner: usize, scale: &[f32], bias: &[f32], eps: f32) -> Vec<f32> {
    let mut y = vec![0.0f32; x.len()];
    for (i, (dst, row)) in y.chunks_mut(inner.max(1)).zip(x.chunks(inner.max(1))).enumerate() {
        let ch = i % c.max(1);
        let (m, r) = row_stats(row, eps);
        let a = r * scale[ch];
        let b = bias[ch] - m * a;
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = v * a + b;
        }
    }
    y
}

/// Local response normalization across channels of `x` `[n, c, inner]`:
/// `y = x / (bias + alpha / size * sum(x[c']^2))^beta` over
/// `c' in [c - floor((size-1)/2), c + ceil((size-1)/2)]`.
#[allow(clippy::too_many_arguments)]
pub fn lrn(x: &[f32], n: usize, c: usize, inner: usize, size: usize, alpha: f32, beta: f32, bias: f32) -> Vec<f32> {
    let before = (size - 1) / 2;
    let after = size - 1 - before;
    let mut y = vec![0.0f32; x.len()];
    let mut sq = vec![0.0f32; inner];
    for img in 0..n {
        let base = img * c * inner;
        for ch in 0..c {
            sq.fill(0.0);
            let lo = ch.saturating_sub(before);
            let hi = (ch + after).min(c - 1);
            for cc in lo..=hi {
                let src = &x[base + cc * inner..base + (cc + 1) * inner];
                for (s, &v) in sq.iter_mut().zip(src) {
                    *s += v * v;
                }
            }
            let src = &x[base + ch * inner..base + (ch + 1) * inner];
            let dst = &mut y[base + ch * inner..base + (ch + 1) * inner];
            let k = alpha / size as f32;
            for ((d, &v), &s) in dst.iter_mut().zip(src).zip(&sq) {
                *d = v / (bias + k * s).powf(beta);
            }
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_norm_per_channel() {
        // x = [[1,2],[3,4]] as [1,2,2]; channel 0: (x-1)/sqrt(4)*2+1, channel 1: (x-0)/1*1+0
        let y = batch_norm(&[1., 2., 3., 4.], 1, 2, 2, &[2., 1.], &[1., 0.], &[1., 0.], &[4., 1.], 0.0);
        assert_eq!(y, vec![1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn layer_and_instance_norm() {
        // numpy: x = [1,2,3,4]; (x - 2.5) / sqrt(1.25 + 1e-5)
        let (y, m, r) = layer_norm(&[1., 2., 3., 4.], 4, &[1.; 4], None, 1e-5);
        assert!((m[0] - 2.5).abs() < 1e-7);
        assert!((r[0] - 0.894_423_2).abs() < 1e-6, "{r:?}");
        assert!((y[0] - (-1.341_634_8)).abs() < 1e-5, "{y:?}");
        let z = instance_norm(&[1., 2., 3., 4.], 1, 4, &[2.], &[1.], 1e-5);
        assert!((z[3] - (1.0 + 2.0 * 1.341_634_8)).abs() < 1e-5, "{z:?}");
    }

    #[test]
    fn lrn_window() {
        // size 3, alpha 3 (alpha/size = 1), beta 1, bias 1: channel 1 sees channels 0..=2
        let y = lrn(&[1., 2., 3.], 1, 3, 1, 3, 3.0, 1.0, 1.0);
        assert!((y[1] - 2.0 / 15.0).abs() < 1e-7, "{y:?}");
        assert!((y[0] - 1.0 / 6.0).abs() < 1e-7, "{y:?}");
    }
}
