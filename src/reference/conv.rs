//! Reference kernels of the conv family: Conv (im2col + SGEMM per image and group, a direct
//! loop for depthwise) and ConvTranspose (SGEMM + col2im).
//!
//! Every kernel works on NC + 3 spatial dims: 1-D and 2-D problems are lifted to 3-D with
//! leading unit spatial dims (kernel 1, stride 1, no padding), which costs nothing and keeps one
//! code path for all ranks.

use super::linalg::{sgemm, MatRef};
use crate::ir::ops::conv::Geom3;
use crate::ir::{OpError, OpResult};

/// Convolution (ONNX Conv) in NC + 3-D spatial layout.
///
/// `x` is `[n, c, input...]`, `w` is `[k, c / group, kernel...]`, `bias` has `k` values; the
/// result is `[n, k, output...]`, row-major.
pub fn conv(
    x: &[f32],
    n: usize,
    c: usize,
    w: &[f32],
    k: usize,
    bias: Option<&[f32]>,
    g: &Geom3,
    group: usize,
) -> OpResult<Vec<f32>> {
    let (cg, kg) = group_sizes(c, k, group)?;
    let (in_len, out_len, ksz) = (g.in_len(), g.out_len(), g.kernel_len());
    check_len("W", w.len(), k * cg * ksz)?;
    let mut y = checked_output(x, n * c * in_len, bias, n, k, out_len)?;
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    // Nothing to compute; returning here also skips the im2col buffer sized by `out_len`.
    if y.is_empty() {
        return Ok(y);
    }
    if cg == 1 && group == c {
        depthwise(x, n, c, w, kg, g, &mut y);
        return Ok(y);
    }
    let rows = cg * ksz;
    let pointwise = g.is_pointwise();
    let mut cols = if pointwise { Vec::new() } else { vec![0.0f32; rows * out_len] };
    for img in 0..n {
        for gi in 0..group {
            let xg = &x[(img * c + gi * cg) * in_len..(img * c + (gi + 1) * cg) * in_len];
            let b = if pointwise {
                MatRef::row_major(xg, cg, in_len)
            } else {
                im2col(xg, cg, g, &mut cols);
                MatRef::row_major(&cols, rows, out_len)
            };
            let wg = MatRef::row_major(&w[gi * kg * rows..(gi + 1) * kg * rows], kg, rows);
            let dst = &mut y[(img * k + gi * kg) * out_len..(img * k + (gi + 1) * kg) * out_len];
            sgemm(1.0, wg, b, beta, dst);
        }
    }
    Ok(y)
}

/// `n * k * out_len` values of a conv output, checked: with an empty batch or channel axis the
/// spatial size is not bounded by any real allocation.
/// Channels per group of the input and the output, checking that both divide into `group`.
fn group_sizes(c: usize, k: usize, group: usize) -> OpResult<(usize, usize)> {
    if group == 0 || c % group != 0 || k % group != 0 {
        return Err(OpError(format!("{c} input and {k} output channels do not divide into {group} groups")));
    }
    Ok((c / group, k / group))
}

/// Checks the input and bias lengths and returns the `[n, k, out_len]` output, each output
/// plane filled with its bias (or zeros), as conv and transposed conv both accumulate into it.
fn checked_output(
    x: &[f32],
    x_len: usize,
    bias: Option<&[f32]>,
    n: usize,
    k: usize,
    out_len: usize,
) -> OpResult<Vec<f32>> {
    check_len("X", x.len(), x_len)?;
    if let Some(b) = bias {
        check_len("B", b.len(), k)?;
    }
    let mut y = vec![0.0f32; out_size(n, k, out_len)?];
    if let Some(b) = bias {
        for (plane, &bv) in y.chunks_mut(out_len.max(1)).zip(b.iter().cycle()) {
            plane.fill(bv);
        }
    }
    Ok(y)
}

fn out_size(n: usize, k: usize, out_len: usize) -> OpResult<usize> {
    n.checked_mul(k)
        .and_then(|v| v.checked_mul(out_len))
        .ok_or_else(|| OpError(format!("an output of {n} x {k} x {out_len} values overflows")))
}

fn check_len(what: &str, got: usize, want: usize) -> OpResult<()> {
    if got != want {
        return Err(OpError(format!("{what} has {got} values, the geometry needs {want}")));
    }
    Ok(())
}

/// Unfolds `cg` input planes into `cols` `[cg * kernel_len, out_len]` (zeros where a tap
/// reads padding).
fn im2col(x: &[f32], cg: usize, g: &Geom3, cols: &mut [f32]) {
    let [id_, ih_, iw_] = g.input;
    let [kd_, kh_, kw_] = g.kernel;
    let [od_, oh_, ow_] = g.output;
    let out_len = od_ * oh_ * ow_;
    let sw = g.strides[2];
    let mut row = 0;
    for ch in 0..cg {
        let plane = &x[ch * id_ * ih_ * iw_..(ch + 1) * id_ * ih_ * iw_];
        for kd in 0..kd_ {
            let off_d = g.tap_offset(0, kd);
            let (d_lo, d_hi) = g.valid_outputs(0, off_d);
            for kh in 0..kh_ {
                let off_h = g.tap_offset(1, kh);
                let (h_lo, h_hi) = g.valid_outputs(1, off_h);
                for kw in 0..kw_ {
                    let off_w = g.tap_offset(2, kw);
                    let (w_lo, w_hi) = g.valid_outputs(2, off_w);
                    let dst = &mut cols[row * out_len..(row + 1) * out_len];
                    row += 1;
                    for od in 0..od_ {
                        let dplane = &mut dst[od * oh_ * ow_..(od + 1) * oh_ * ow_];
                        if od < d_lo || od >= d_hi {
                            dplane.fill(0.0);
                            continue;
                        }
                        let idd = (od as isize * g.strides[0] as isize + off_d) as usize;
                        for oh in 0..oh_ {
                            let drow = &mut dplane[oh * ow_..(oh + 1) * ow_];
                            if oh < h_lo || oh >= h_hi {
                                drow.fill(0.0);
                                continue;
                            }
                            let ih = (oh as isize * g.strides[1] as isize + off_h) as usize;
                            let src = &plane[(idd * ih_ + ih) * iw_..(idd * ih_ + ih + 1) * iw_];
                            drow[..w_lo].fill(0.0);
                            drow[w_hi..].fill(0.0);
                            if w_lo < w_hi {
                                let start = (w_lo as isize * sw as isize + off_w) as usize;
                                if sw == 1 {
                                    drow[w_lo..w_hi].copy_from_slice(&src[start..start + (w_hi - w_lo)]);
                                } else {
                                    for (j, d) in drow[w_lo..w_hi].iter_mut().enumerate() {
                                        *d = src[start + j * sw];
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Depthwise convolution (one input channel per group, `kg` outputs per channel), accumulated
/// tap by tap into `y` (which holds the bias already). The inner loop runs over a contiguous
/// output row, so it vectorises for stride 1.
fn depthwise(x: &[f32], n: usize, c: usize, w: &[f32], kg: usize, g: &Geom3, y: &mut [f32]) {
    let [_, ih_, iw_] = g.input;
    let [kd_, kh_, kw_] = g.kernel;
    let [_, oh_, ow_] = g.output;
    let (in_len, out_len, ksz) = (g.in_len(), g.out_len(), g.kernel_len());
    let sw = g.strides[2];
    for img in 0..n {
        for ch in 0..c {
            let plane = &x[(img * c + ch) * in_len..(img * c + ch + 1) * in_len];
            for m in 0..kg {
                let oc = ch * kg + m;
                let taps = &w[oc * ksz..(oc + 1) * ksz];
                let out = &mut y[(img * c * kg + oc) * out_len..(img * c * kg + oc + 1) * out_len];
                for kd in 0..kd_ {
                    let off_d = g.tap_offset(0, kd);
                    let (d_lo, d_hi) = g.valid_outputs(0, off_d);
                    for kh in 0..kh_ {
                        let off_h = g.tap_offset(1, kh);
                        let (h_lo, h_hi) = g.valid_outputs(1, off_h);
                        for kw in 0..kw_ {
                            let wv = taps[(kd * kh_ + kh) * kw_ + kw];
                            let off_w = g.tap_offset(2, kw);
                            let (w_lo, w_hi) = g.valid_outputs(2, off_w);
                            if w_lo >= w_hi {
                                continue;
                            }
                            let start = (w_lo as isize * sw as isize + off_w) as usize;
                            for od in d_lo..d_hi {
                                let idd = (od as isize * g.strides[0] as isize + off_d) as usize;
                                for oh in h_lo..h_hi {
                                    let ih = (oh as isize * g.strides[1] as isize + off_h) as usize;
                                    let src = &plane[(idd * ih_ + ih) * iw_..(idd * ih_ + ih + 1) * iw_];
                                    let dst = &mut out[(od * oh_ + oh) * ow_ + w_lo..(od * oh_ + oh) * ow_ + w_hi];
                                    if sw == 1 {
                                        for (d, s) in dst.iter_mut().zip(&src[start..]) {
                                            *d += wv * s;
                                        }
                                    } else {
                                        for (j, d) in dst.iter_mut().enumerate() {
                                            *d += wv * src[start + j * sw];
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Transposed convolution (ONNX ConvTranspose) in NC + 3-D spatial layout.
///
/// `x` is `[n, c, input...]`, `w` is `[c, k / group, kernel...]`, `bias` has `k` values. The
/// geometry is read the transposed way: `g.input` is the ConvTranspose input, `g.output` its
/// output, and output position `i * stride + tap * dilation - pad_begin` receives input `i`.
pub fn conv_transpose(
    x: &[f32],
    n: usize,
    c: usize,
    w: &[f32],
    k: usize,
    bias: Option<&[f32]>,
    g: &Geom3,
    group: usize,
) -> OpResult<Vec<f32>> {
    let (cg, kg) = group_sizes(c, k, group)?;
    let (in_len, out_len, ksz) = (g.in_len(), g.out_len(), g.kernel_len());
    check_len("W", w.len(), c * kg * ksz)?;
    let mut y = checked_output(x, n * c * in_len, bias, n, k, out_len)?;
    if y.is_empty() || in_len == 0 {
        return Ok(y);
    }
    let rows = kg * ksz;
    let mut cols = vec![0.0f32; rows * in_len];
    let [id_, ih_, iw_] = g.input;
    let [kd_, kh_, kw_] = g.kernel;
    let [od_, oh_, ow_] = g.output;
    for img in 0..n {
        for gi in 0..group {
            let xg =
                MatRef::row_major(&x[(img * c + gi * cg) * in_len..(img * c + (gi + 1) * cg) * in_len], cg, in_len);
            let wg = MatRef::row_major(&w[gi * cg * rows..(gi + 1) * cg * rows], cg, rows);
            sgemm(1.0, wg.t(), xg, 0.0, &mut cols);
            // col2im: scatter-add every (channel, tap) row into the output planes.
            for oc in 0..kg {
                let out = &mut y[(img * k + gi * kg + oc) * out_len..(img * k + gi * kg + oc + 1) * out_len];
                for kd in 0..kd_ {
                    for kh in 0..kh_ {
                        for kw in 0..kw_ {
                            let row = ((oc * kd_ + kd) * kh_ + kh) * kw_ + kw;
                            let src = &cols[row * in_len..(row + 1) * in_len];
                            for i_d in 0..id_ {
                                let o_d = (i_d * g.strides[0] + kd * g.dilations[0]) as isize - g.pad_begin[0] as isize;
                                if o_d < 0 || o_d >= od_ as isize {
                                    continue;
                                }
                                for i_h in 0..ih_ {
                                    let o_h =
                                        (i_h * g.strides[1] + kh * g.dilations[1]) as isize - g.pad_begin[1] as isize;
                                    if o_h < 0 || o_h >= oh_ as isize {
                                        continue;
                                    }
                                    let srow = &src[(i_d * ih_ + i_h) * iw_..(i_d * ih_ + i_h + 1) * iw_];
                                    let obase = (o_d as usize * oh_ + o_h as usize) * ow_;
                                    for (i_w, &v) in srow.iter().enumerate() {
                                        let o_w = (i_w * g.strides[2] + kw * g.dilations[2]) as isize
                                            - g.pad_begin[2] as isize;
                                        if o_w >= 0 && o_w < ow_ as isize {
                                            out[obase + o_w as usize] += v;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Direct 2-D convolution by definition, to check the im2col path against.
    #[allow(clippy::too_many_arguments)]
    fn naive(x: &[f32], c: usize, w: &[f32], k: usize, g: &Geom3, group: usize) -> Vec<f32> {
        let (cg, kg) = (c / group, k / group);
        let [_, ih, iw] = g.input;
        let [_, kh, kw] = g.kernel;
        let [_, oh, ow] = g.output;
        let mut y = vec![0.0; k * oh * ow];
        for o in 0..k {
            let gi = o / kg;
            for p in 0..oh {
                for q in 0..ow {
                    let mut acc = 0.0;
                    for ci in 0..cg {
                        for r in 0..kh {
                            for s in 0..kw {
                                let y_ = (p * g.strides[1] + r * g.dilations[1]) as isize - g.pad_begin[1] as isize;
                                let x_ = (q * g.strides[2] + s * g.dilations[2]) as isize - g.pad_begin[2] as isize;
                                if y_ >= 0 && x_ >= 0 && (y_ as usize) < ih && (x_ as usize) < iw {
                                    acc += x[((gi * cg + ci) * ih + y_ as usize) * iw + x_ as usize]
                                        * w[((o * cg + ci) * kh + r) * kw + s];
                                }
                            }
                        }
                    }
                    y[(o * oh + p) * ow + q] = acc;
                }
            }
        }
        y
    }

    fn geom(input: [usize; 2], kernel: [usize; 2], s: usize, d: usize, p: usize) -> Geom3 {
        let out: Vec<usize> = (0..2).map(|i| (input[i] + 2 * p - d * (kernel[i] - 1) - 1) / s + 1).collect();
        Geom3::lift(&input, &kernel, &[s, s], &[d, d], &[p, p], &[p, p], &out).unwrap()
    }

    #[test]
    fn im2col_gemm_matches_definition() {
        for &(c, k, group, s, d, p) in
            &[(4, 6, 1, 1, 1, 1), (4, 6, 2, 2, 1, 0), (3, 5, 1, 2, 2, 2), (4, 4, 4, 1, 1, 1), (4, 8, 4, 2, 1, 1)]
        {
            let g = geom([7, 6], [3, 3], s, d, p);
            let x: Vec<f32> = (0..c * 42).map(|i| ((i * 7 % 13) as f32 - 6.0) * 0.1).collect();
            let w: Vec<f32> = (0..k * (c / group) * 9).map(|i| ((i * 5 % 11) as f32 - 5.0) * 0.1).collect();
            let got = conv(&x, 1, c, &w, k, None, &g, group).unwrap();
            let want = naive(&x, c, &w, k, &g, group);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "c{c} k{k} g{group} s{s} d{d} p{p}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn transpose_of_unit_stride_spreads_kernel() {
        // numpy/ORT: ConvTranspose of x=[1,2] (1x1x2) with w=[1,1,1] (1x1x3), stride 2:
        // out length (2-1)*2+3 = 5 → [1,1,1+2,2,2]
        let g = Geom3::lift(&[2], &[3], &[2], &[1], &[0], &[0], &[5]).unwrap();
        let y = conv_transpose(&[1.0, 2.0], 1, 1, &[1.0, 1.0, 1.0], 1, Some(&[0.5]), &g, 1).unwrap();
        assert_eq!(y, vec![1.5, 1.5, 3.5, 2.5, 2.5]);
    }

    #[test]
    fn geometry_that_overflows_is_an_error() {
        let huge = 1usize << 62;
        // A stride whose product with the output size leaves isize.
        let e = Geom3::lift(&[4], &[1], &[huge], &[1], &[0], &[0], &[4]).unwrap_err();
        assert!(e.0.contains("overflows on spatial axis 2"), "{}", e.0);
        // Per-axis sizes that fit, but whose product does not.
        let e = Geom3::lift(&[1, 1, 1], &[1, 1, 1], &[1; 3], &[1; 3], &[0; 3], &[0; 3], &[1 << 30; 3]).unwrap_err();
        assert!(e.0.contains("output spatial size"), "{}", e.0);
        // An empty batch computes nothing, however large the output plane.
        let g = Geom3::lift(&[1], &[1], &[1], &[1], &[1 << 20], &[1 << 20], &[(1 << 21) + 1]).unwrap();
        assert!(conv(&[], 0, 1, &[1.0], 1, None, &g, 1).unwrap().is_empty());
    }
}
