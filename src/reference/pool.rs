//! Reference kernels of the pool family: max and average pooling over sliding windows (NC +
//! 3-D spatial, lifted like the conv kernels) and global pooling.
//!
//! The valid taps of each output position are computed once per axis (the window is separable),
//! so the inner loops touch only in-bounds input cells and never test bounds per tap.

use crate::ir::ops::conv::Geom3;

/// Valid taps `k_lo..k_hi` of one output position along one axis, the input position of tap 0,
/// and the number of taps inside the padded input (the `count_include_pad` divisor).
#[derive(Clone, Copy, Debug)]
struct Span {
    start: isize,
    k_lo: usize,
    k_hi: usize,
    padded_count: usize,
}

fn spans(g: &Geom3, axis: usize) -> Vec<Span> {
    let (s, d, k) = (g.strides[axis] as isize, g.dilations[axis] as isize, g.kernel[axis]);
    let n = g.input[axis] as isize;
    let padded_end = n + g.pad_end[axis] as isize;
    let count_below = |limit: isize, start: isize| -> usize {
        // Taps t in 0..k with start + t*d < limit.
        if limit - start <= 0 {
            0
        } else {
            (((limit - start + d - 1) / d) as usize).min(k)
        }
    };
    (0..g.output[axis])
        .map(|o| {
            let start = o as isize * s - g.pad_begin[axis] as isize;
            let k_lo = if start >= 0 { 0 } else { (((-start + d - 1) / d) as usize).min(k) };
            let k_hi = count_below(n, start).max(k_lo);
            Span { start, k_lo, k_hi, padded_count: count_below(padded_end, start) }
        })
        .collect()
}

/// Runs `f(plane, out_index, spans_d, spans_h, spans_w)` for every output cell.
fn for_each_window(planes: usize, g: &Geom3, mut f: impl FnMut(usize, usize, &Span, &Span, &Span)) {
    // No planes, no windows: skip the per-axis spans, whose length (the output size) an empty
    // input does not bound.
    if planes == 0 {
        return;
    }
    let (sd, sh, sw) = (spans(g, 0), spans(g, 1), spans(g, 2));
    let mut o = 0;
    for plane in 0..planes {
        for a in &sd {
            for b in &sh {
                for c in &sw {
                    f(plane, o, a, b, c);
                    o += 1;
                }
            }
        }
    }
}

/// Max pooling of `planes` planes of `g.input` cells. With `indices`, also returns the flat
/// index of each maximum: `plane * in_len + spatial index`, the spatial index row-major, or
/// column-major (first spatial axis fastest) when `column_major` (ONNX `storage_order = 1`).
/// `spatial_rank` is the rank before lifting to 3-D (it decides the column-major strides).
pub fn max_pool(
    x: &[f32],
    planes: usize,
    g: &Geom3,
    indices: bool,
    column_major: bool,
    spatial_rank: usize,
) -> (Vec<f32>, Vec<i64>) {
    let [_, ih, iw] = g.input;
    let in_len = g.in_len();
    let mut y = vec![0.0f32; planes * g.out_len()];
    let mut idx = if indices { vec![0i64; y.len()] } else { Vec::new() };
    // Column-major strides over the original spatial axes (lifted unit axes get stride 0).
    let cm = {
        let dims = g.input;
        let first = 3 - spatial_rank;
        let mut st = [0usize; 3];
        let mut acc = 1;
        for ax in first..3 {
            st[ax] = acc;
            acc *= dims[ax];
        }
        st
    };
    let (dd, dh, dw) = (g.dilations[0] as isize, g.dilations[1] as isize, g.dilations[2] as isize);
    for_each_window(planes, g, |plane, o, a, b, c| {
        let base = &x[plane * in_len..(plane + 1) * in_len];
        let mut best = f32::MIN;
        let mut at = [usize::MAX; 3];
        for kd in a.k_lo..a.k_hi {
            let pd = (a.start + kd as isize * dd) as usize;
            for kh in b.k_lo..b.k_hi {
                let ph = (b.start + kh as isize * dh) as usize;
                let row = &base[(pd * ih + ph) * iw..(pd * ih + ph + 1) * iw];
                for kw in c.k_lo..c.k_hi {
                    let pw = (c.start + kw as isize * dw) as usize;
                    let v = row[pw];
                    // Strictly greater: the first maximum wins, NaN never replaces a value
                    // (ONNX Runtime's rule).
                    if v > best || (at[0] == usize::MAX && v == best) {
                        best = v;
                        at = [pd, ph, pw];
                    }
                }
            }
        }
        y[o] = best;
        if indices {
            idx[o] = if at[0] == usize::MAX {
                -1
            } else {
                let spatial = if column_major {
                    at[0] * cm[0] + at[1] * cm[1] + at[2] * cm[2]
                } else {
                    (at[0] * ih + at[1]) * iw + at[2]
                };
                (plane * in_len + spatial) as i64
            };
        }
    });
    (y, idx)
}

/// Average pooling. The divisor counts the taps inside the input, or with `count_include_pad`
/// the taps inside the padded input (taps that only ceil_mode adds beyond the end padding are
/// never counted, as in ONNX Runtime).
pub fn avg_pool(x: &[f32], planes: usize, g: &Geom3, count_include_pad: bool) -> Vec<f32> {
    let [_, ih, iw] = g.input;
    let in_len = g.in_len();
    let mut y = vec![0.0f32; planes * g.out_len()];
    let (dd, dh, dw) = (g.dilations[0] as isize, g.dilations[1] as isize, g.dilations[2] as isize);
    for_each_window(planes, g, |plane, o, a, b, c| {
        let base = &x[plane * in_len..(plane + 1) * in_len];
        let mut sum = 0.0f32;
        for kd in a.k_lo..a.k_hi {
            let pd = (a.start + kd as isize * dd) as usize;
            for kh in b.k_lo..b.k_hi {
                let ph = (b.start + kh as isize * dh) as usize;
                let row = &base[(pd * ih + ph) * iw..(pd * ih + ph + 1) * iw];
                for kw in c.k_lo..c.k_hi {
                    sum += row[(c.start + kw as isize * dw) as usize];
                }
            }
        }
        let count = if count_include_pad {
            a.padded_count * b.padded_count * c.padded_count
        } else {
            (a.k_hi - a.k_lo) * (b.k_hi - b.k_lo) * (c.k_hi - c.k_lo)
        };
        y[o] = if count == 0 { 0.0 } else { sum / count as f32 };
    });
    y
}

/// Global pooling of `planes` contiguous planes of `len` cells: mean (f64 accumulation) or max.
pub fn global_pool(x: &[f32], planes: usize, len: usize, max: bool) -> Vec<f32> {
    (0..planes)
        .map(|p| {
            let plane = &x[p * len..(p + 1) * len];
            if max {
                plane.iter().copied().fold(f32::MIN, |m, v| if v > m { v } else { m })
            } else if len == 0 {
                f32::NAN
            } else {
                (plane.iter().map(|&v| v as f64).sum::<f64>() / len as f64) as f32
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_pool_with_padding_and_indices() {
        // 1x1x3x3 input 0..9, kernel 2, stride 2, pads 1 → output 2x2:
        // windows {0}, {1,2}, {3,6}, {4,5,7,8} → [0, 2, 6, 8]
        let x: Vec<f32> = (0..9).map(|v| v as f32).collect();
        let g = Geom3::lift(&[3, 3], &[2, 2], &[2, 2], &[1, 1], &[1, 1], &[1, 1], &[2, 2]).unwrap();
        let (y, i) = max_pool(&x, 1, &g, true, false, 2);
        assert_eq!(y, vec![0.0, 2.0, 6.0, 8.0]);
        assert_eq!(i, vec![0, 2, 6, 8]);
        let (_, icm) = max_pool(&x, 1, &g, true, true, 2);
        // column-major: h + w*3 → (0,0)=0, (0,2)=6, (2,0)=2, (2,2)=8
        assert_eq!(icm, vec![0, 6, 2, 8]);
    }

    #[test]
    fn avg_pool_divisors() {
        let x: Vec<f32> = (0..9).map(|v| v as f32).collect();
        let g = Geom3::lift(&[3, 3], &[2, 2], &[2, 2], &[1, 1], &[1, 1], &[1, 1], &[2, 2]).unwrap();
        assert_eq!(avg_pool(&x, 1, &g, false), vec![0.0, 1.5, 4.5, 6.0]);
        assert_eq!(avg_pool(&x, 1, &g, true), vec![0.0, 0.75, 2.25, 6.0]);
        assert_eq!(global_pool(&x, 1, 9, false), vec![4.0]);
        assert_eq!(global_pool(&x, 1, 9, true), vec![8.0]);
    }

    #[test]
    fn no_planes_no_windows() {
        // An empty input with a huge padded output: no per-axis spans are built.
        let g = Geom3::lift(&[1], &[1], &[1], &[1], &[1 << 40], &[1 << 40], &[(1 << 41) + 1]).unwrap();
        assert!(avg_pool(&[], 0, &g, true).is_empty());
        assert!(max_pool(&[], 0, &g, true, false, 1).0.is_empty());
    }
}
