//! Reference kernels of reductions, layernorm and pooling.

use crate::ir::ops::kernel::{Layout, Pool, PoolKind};
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, Axis, IxDyn};

/// Mean over `axes` (each in range), keeping them as size 1 when `keepdims`.
pub fn reduce_mean(x: &ArrayD<f32>, axes: &[usize], keepdims: bool) -> ArrayD<f32> {
    let mut sorted = axes.to_vec();
    sorted.sort_unstable();
    let count: usize = sorted.iter().map(|&a| x.shape()[a]).product();
    let mut out = x.clone();
    // Sum in f64 per reduced axis would cost a copy; f32 pairwise sums of ndarray are accurate
    // enough for the 1e-5 comparisons the tests make.
    for &a in sorted.iter().rev() {
        out = out.sum_axis(Axis(a));
        if keepdims {
            out.insert_axis_inplace(Axis(a));
        }
    }
    let inv = 1.0 / count.max(1) as f32;
    out.mapv_inplace(|v| v * inv);
    out
}

/// Layernorm over axes `axis..`, population variance.
pub fn layer_norm(
    x: &ArrayD<f32>,
    axis: usize,
    eps: f32,
    scale: &ArrayD<f32>,
    bias: Option<&ArrayD<f32>>,
) -> OpResult<ArrayD<f32>> {
    let inner_shape = &x.shape()[axis..];
    let inner: usize = inner_shape.iter().product();
    let sv = scale
        .broadcast(IxDyn(inner_shape))
        .ok_or_else(|| OpError(format!("scale {:?} does not broadcast to {inner_shape:?}", scale.shape())))?;
    let sv: Vec<f32> = sv.iter().copied().collect();
    let bv: Vec<f32> = match bias {
        Some(b) => b
            .broadcast(IxDyn(inner_shape))
            .ok_or_else(|| OpError(format!("bias {:?} does not broadcast to {inner_shape:?}", b.shape())))?
            .iter()
            .copied()
            .collect(),
        None => vec![0.0; inner],
    };
    let mut out = x.as_standard_layout().into_owned();
    let Some(data) = out.as_slice_mut() else {
        return Err(OpError("layernorm input is not contiguous".into()));
    };
    if inner == 0 {
        return Ok(out);
    }
    for row in data.chunks_mut(inner) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / inner as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / inner as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (i, v) in row.iter_mut().enumerate() {
            *v = ((*v as f64 - mean) * inv) as f32 * sv[i] + bv[i];
        }
    }
    Ok(out)
}

/// 2-D max/average pooling (computed in NCHW).
pub fn pool(p: &Pool, x: &ArrayD<f32>) -> OpResult<ArrayD<f32>> {
    if x.ndim() != 4 {
        return Err(OpError(format!("2-D pooling needs a rank-4 input, got {:?}", x.shape())));
    }
    let xn = match p.layout {
        Layout::Nchw => x.as_standard_layout().into_owned(),
        Layout::Nhwc => x.view().permuted_axes(IxDyn(&[0, 3, 1, 2])).as_standard_layout().into_owned(),
    };
    let (n, c, h, w) = (xn.shape()[0], xn.shape()[1], xn.shape()[2], xn.shape()[3]);
    let known = |axis: usize, v: usize| -> OpResult<usize> {
        p.out_dim(axis, &crate::ir::Dim::from(v))?
            .as_known()
            .map(|v| v as usize)
            .ok_or_else(|| OpError("pooling output size is not known".into()))
    };
    let (oh, ow) = (known(0, h)?, known(1, w)?);
    let xs = xn.as_slice().ok_or_else(|| OpError("pooling input is not contiguous".into()))?;
    let mut out = vec![0f32; n * c * oh * ow];
    let [sh, sw] = p.geom.strides;
    let [dh, dw] = p.geom.dilations;
    let [pt, pl, pb, pr] = p.geom.pads;
    for plane in 0..n * c {
        let src = &xs[plane * h * w..(plane + 1) * h * w];
        for oy in 0..oh {
            for ox in 0..ow {
                let mut acc = match p.kind {
                    PoolKind::Max => f32::NEG_INFINITY,
                    PoolKind::Avg { .. } => 0.0,
                };
                let mut count = 0usize;
                for ky in 0..p.kernel[0] {
                    let iy = (oy * sh + ky * dh) as isize - pt as isize;
                    for kx in 0..p.kernel[1] {
                        let ix = (ox * sw + kx * dw) as isize - pl as isize;
                        let inside = iy >= 0 && iy < h as isize && ix >= 0 && ix < w as isize;
                        let in_pads = iy >= -(pt as isize)
                            && iy < (h + pb) as isize
                            && ix >= -(pl as isize)
                            && ix < (w + pr) as isize;
                        match p.kind {
                            PoolKind::Max => {
                                if inside {
                                    acc = acc.max(src[iy as usize * w + ix as usize]);
                                }
                            }
                            PoolKind::Avg { count_include_pad } => {
                                if inside {
                                    acc += src[iy as usize * w + ix as usize];
                                }
                                if inside || (count_include_pad && in_pads) {
                                    count += 1;
                                }
                            }
                        }
                    }
                }
                if let PoolKind::Avg { .. } = p.kind {
                    acc /= count.max(1) as f32;
                }
                out[(plane * oh + oy) * ow + ox] = acc;
            }
        }
    }
    let out = ArrayD::from_shape_vec(IxDyn(&[n, c, oh, ow]), out).map_err(|e| OpError(e.to_string()))?;
    Ok(match p.layout {
        Layout::Nchw => out,
        Layout::Nhwc => out.permuted_axes(IxDyn(&[0, 2, 3, 1])).as_standard_layout().into_owned(),
    })
}
