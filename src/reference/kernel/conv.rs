//! Reference kernel of the fused 2-D convolution (im2col + matrix product per image and group).

use crate::ir::ops::kernel::{Act, ConvGeom, Layout};
use crate::ir::{OpError, OpResult};
use ndarray::{s, Array2, ArrayD, Axis, IxDyn};

/// `act(pre_act(conv(x, w) + bias) + residual)` in either layout (see `Conv2d`). Computes in NHWC.
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    layout: Layout,
    geom: &ConvGeom,
    x: &ArrayD<f32>,
    w: &ArrayD<f32>,
    bias: Option<&ArrayD<f32>>,
    residual: Option<&ArrayD<f32>>,
    pre_act: Option<Act>,
    act: Option<Act>,
) -> OpResult<ArrayD<f32>> {
    if x.ndim() != 4 || w.ndim() != 4 {
        return Err(OpError(format!("Conv2d needs rank-4 input and weights, got {:?} and {:?}", x.shape(), w.shape())));
    }
    let (x_nhwc, w_krsc) = match layout {
        Layout::Nhwc => (x.as_standard_layout().into_owned(), w.as_standard_layout().into_owned()),
        Layout::Nchw => (
            x.view().permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().into_owned(),
            w.view().permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().into_owned(),
        ),
    };
    let mut out = conv2d_nhwc(geom, &x_nhwc, &w_krsc)?;
    if let Some(b) = bias {
        let k = out.shape()[3];
        if b.len() != k {
            return Err(OpError(format!("bias has {} values for {k} output channels", b.len())));
        }
        let b = b.as_standard_layout();
        let bs = b.as_slice().unwrap_or(&[]);
        for row in out.as_slice_mut().unwrap_or(&mut []).chunks_mut(k) {
            for (v, bb) in row.iter_mut().zip(bs) {
                *v += bb;
            }
        }
    }
    let mut out = match layout {
        Layout::Nhwc => out,
        Layout::Nchw => out.permuted_axes(IxDyn(&[0, 3, 1, 2])).as_standard_layout().into_owned(),
    };
    if let Some(f) = pre_act {
        out.mapv_inplace(|v| f.apply(v));
    }
    if let Some(r) = residual {
        if r.shape() != out.shape() {
            return Err(OpError(format!("residual shape {:?} differs from the output {:?}", r.shape(), out.shape())));
        }
        out += r;
    }
    if let Some(f) = act {
        out.mapv_inplace(|v| f.apply(v));
    }
    Ok(out)
}

/// Plain convolution, `x` `[N,H,W,C]`, `w` `[K,R,S,C/g]` (both standard layout) → `[N,P,Q,K]`.
fn conv2d_nhwc(geom: &ConvGeom, x: &ArrayD<f32>, w: &ArrayD<f32>) -> OpResult<ArrayD<f32>> {
    let (n, h, wd, c) = (x.shape()[0], x.shape()[1], x.shape()[2], x.shape()[3]);
    let (k, r, s_, cg) = (w.shape()[0], w.shape()[1], w.shape()[2], w.shape()[3]);
    let g = geom.group;
    if cg * g != c || k % g != 0 {
        return Err(OpError(format!("weights {:?} do not fit {c} input channels in {g} groups", w.shape())));
    }
    let kg = k / g;
    let [sh, sw] = geom.strides;
    let [dh, dw] = geom.dilations;
    let [pt, pl, pb, pr] = geom.pads;
    let span_h = dh * (r - 1) + 1;
    let span_w = dw * (s_ - 1) + 1;
    if h + pt + pb < span_h || wd + pl + pr < span_w {
        return Err(OpError(format!("kernel {r}x{s_} does not fit the padded input {h}x{wd}")));
    }
    let p = (h + pt + pb - span_h) / sh + 1;
    let q = (wd + pl + pr - span_w) / sw + 1;
    let xs = x.as_slice().ok_or_else(|| OpError("input is not contiguous".into()))?;
    let w2 = w.view().into_shape_with_order((k, r * s_ * cg)).map_err(|e| OpError(e.to_string()))?;
    let mut out = ArrayD::<f32>::zeros(IxDyn(&[n, p, q, k]));
    let mut cols = Array2::<f32>::zeros((p * q, r * s_ * cg));
    for img in 0..n {
        for gi in 0..g {
            cols.fill(0.0);
            for oy in 0..p {
                for ox in 0..q {
                    let mut row = cols.row_mut(oy * q + ox);
                    let row = row.as_slice_mut().unwrap_or(&mut []);
                    for ky in 0..r {
                        let iy = (oy * sh + ky * dh) as isize - pt as isize;
                        if iy < 0 || iy >= h as isize {
                            continue;
                        }
                        for kx in 0..s_ {
                            let ix = (ox * sw + kx * dw) as isize - pl as isize;
                            if ix < 0 || ix >= wd as isize {
                                continue;
                            }
                            let src = ((img * h + iy as usize) * wd + ix as usize) * c + gi * cg;
                            let dst = (ky * s_ + kx) * cg;
                            row[dst..dst + cg].copy_from_slice(&xs[src..src + cg]);
                        }
                    }
                }
            }
            let wg = w2.slice(s![gi * kg..(gi + 1) * kg, ..]);
            let prod = cols.dot(&wg.t());
            let mut dst = out.index_axis_mut(Axis(0), img);
            let mut dst = dst.slice_mut(s![.., .., gi * kg..(gi + 1) * kg]);
            let prod = prod.into_shape_with_order((p, q, kg)).map_err(|e| OpError(e.to_string()))?;
            dst.assign(&prod);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `act(pre_act(conv + bias) + residual)`: the activation before the residual add sees the
    /// conv result only.
    #[test]
    fn pre_activation_applies_before_the_residual() {
        let geom = ConvGeom::parse("s1,1:p0,0,0,0:d1,1:g1").unwrap();
        // NHWC 1x1x2x1 input, one 1x1 filter of weight 1, bias -1, residual 3.
        let x = ArrayD::from_shape_vec(IxDyn(&[1, 1, 2, 1]), vec![-2.0f32, 4.0]).unwrap();
        let w = ArrayD::from_shape_vec(IxDyn(&[1, 1, 1, 1]), vec![1.0f32]).unwrap();
        let b = ArrayD::from_shape_vec(IxDyn(&[1]), vec![-1.0f32]).unwrap();
        let r = ArrayD::from_shape_vec(IxDyn(&[1, 1, 2, 1]), vec![3.0f32, 3.0]).unwrap();
        let pre = conv2d(Layout::Nhwc, &geom, &x, &w, Some(&b), Some(&r), Some(Act::Relu), None).unwrap();
        assert_eq!(pre.iter().copied().collect::<Vec<_>>(), vec![3.0, 6.0]);
        let post = conv2d(Layout::Nhwc, &geom, &x, &w, Some(&b), Some(&r), None, Some(Act::Relu)).unwrap();
        assert_eq!(post.iter().copied().collect::<Vec<_>>(), vec![0.0, 6.0]);
    }
}
