//! Reference kernels of the lp_pool family: the p-norm over sliding windows (LpPool) or over
//! the whole spatial extent (GlobalLpPool). Padded cells count as zeros, which add nothing to
//! the norm; sums accumulate in f64.

use crate::ir::ops::conv::Geom3;

/// `(sum |x|^p)^(1/p)` over each window of `planes` planes of `g.input` cells (spatial axes
/// lifted to 3-D), row-major output `[planes, out_d, out_h, out_w]`.
pub fn lp_pool(x: &[f32], planes: usize, g: &Geom3, p: f64) -> Vec<f32> {
    let in_len: usize = g.input.iter().product();
    let out_len: usize = g.output.iter().product();
    let mut out = Vec::with_capacity(planes * out_len);
    // Input coordinate of tap `k` of output `o` on one axis, when it lies inside the input.
    let tap = |axis: usize, o: usize, k: usize| -> Option<usize> {
        let pos = (o * g.strides[axis] + k * g.dilations[axis]) as isize - g.pad_begin[axis] as isize;
        (pos >= 0 && (pos as usize) < g.input[axis]).then_some(pos as usize)
    };
    for plane in 0..planes {
        let base = &x[plane * in_len..(plane + 1) * in_len];
        for od in 0..g.output[0] {
            for oh in 0..g.output[1] {
                for ow in 0..g.output[2] {
                    let mut sum = 0.0f64;
                    for kd in 0..g.kernel[0] {
                        let Some(d) = tap(0, od, kd) else { continue };
                        for kh in 0..g.kernel[1] {
                            let Some(h) = tap(1, oh, kh) else { continue };
                            for kw in 0..g.kernel[2] {
                                let Some(w) = tap(2, ow, kw) else { continue };
                                let v = base[(d * g.input[1] + h) * g.input[2] + w] as f64;
                                sum += v.abs().powf(p);
                            }
                        }
                    }
                    out.push(sum.powf(1.0 / p) as f32);
                }
            }
        }
    }
    out
}

/// The p-norm of each of `planes` consecutive runs of `len` values.
pub fn global_lp_pool(x: &[f32], planes: usize, len: usize, p: f64) -> Vec<f32> {
    (0..planes)
        .map(|i| {
            let sum: f64 = x[i * len..(i + 1) * len].iter().map(|&v| (v as f64).abs().powf(p)).sum();
            sum.powf(1.0 / p) as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_strided_windows() {
        // ORT LpPool-11: x = [1,-2,3,4,-5], kernel 2, p 1, pads [1,1], strides 2 -> [1, 5, 9]
        let g = Geom3::lift(&[5], &[2], &[2], &[1], &[1], &[1], &[3]).unwrap();
        assert_eq!(lp_pool(&[1.0, -2.0, 3.0, 4.0, -5.0], 1, &g, 1.0), vec![1.0, 5.0, 9.0]);
        assert_eq!(global_lp_pool(&[3.0, -4.0], 1, 2, 2.0), vec![5.0]);
    }
}
