//! Reference kernels of the resize family (Resize, Upsample): nearest, N-d linear and cubic
//! interpolation with every ONNX coordinate transformation.
//!
//! Interpolation is separable, so an N-d resize is a sequence of 1-d resamplings, one per axis
//! that changes (as in the ONNX reference implementation). Each axis first gets a table of
//! taps (input index, weight) per output position; the per-axis arithmetic (source coordinate,
//! rounding, weights) is done in f32 with ONNX Runtime's formulas, so nearest-neighbour choices
//! match ORT exactly.

use crate::ir::ops::resize::{CoordMode, InterpMode, NearestMode};
use crate::ir::Elem;
use ndarray::{ArrayD, ArrayViewMutD, Axis};

/// How one axis is resampled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AxisResample {
    /// Output length / input length, or the scale the model gave (which may differ from the
    /// ratio of lengths after flooring).
    pub scale: f32,
    pub out_len: usize,
    /// Normalised crop window (start, end), used by `tf_crop_and_resize` only.
    pub roi: (f32, f32),
    /// The output length came from `sizes` (the scale is out/in), not from `scales`.
    pub from_sizes: bool,
}

/// Output position → input taps; `None` marks a position outside the crop window, which
/// takes the extrapolation value (`tf_crop_and_resize`).
type Taps = Vec<Option<Vec<(usize, f32)>>>;

fn source_coord(coord: CoordMode, x_resized: f32, ax: &AxisResample, in_len: usize) -> f32 {
    let scale = ax.scale;
    let len_in = in_len as f32;
    let len_out = ax.out_len as f32;
    match coord {
        CoordMode::HalfPixel => (x_resized + 0.5) / scale - 0.5,
        CoordMode::HalfPixelSymmetric => {
            let adjustment = len_out / (scale * len_in);
            let center = len_in / 2.0;
            let offset = center * (1.0 - adjustment);
            // ORT adds the half-pixel terms in double precision; rounding choices depend on it.
            (offset as f64 + (x_resized as f64 + 0.5) / scale as f64 - 0.5) as f32
        }
        CoordMode::PytorchHalfPixel => {
            if ax.out_len > 1 {
                (x_resized + 0.5) / scale - 0.5
            } else {
                0.0
            }
        }
        CoordMode::AlignCorners => {
            if ax.out_len == 1 {
                0.0
            } else {
                x_resized * (len_in - 1.0) / (len_out - 1.0)
            }
        }
        // With `sizes`, ORT lands exactly on x * in / out (e.g. 3.5 for 7 → 4), which decides
        // round_prefer_ceil ties; the f32 division by out/in would give 3.4999998.
        CoordMode::Asymmetric if ax.from_sizes => (x_resized as f64 * in_len as f64 / ax.out_len as f64) as f32,
        CoordMode::Asymmetric => x_resized / scale,
        CoordMode::TfCropAndResize => {
            let (start, end) = ax.roi;
            if ax.out_len > 1 {
                start * (len_in - 1.0) + x_resized * (end - start) * (len_in - 1.0) / (len_out - 1.0)
            } else {
                0.5 * (start + end) * (len_in - 1.0)
            }
        }
    }
}

fn nearest_index(x: f32, mode: NearestMode, downsampling: bool) -> i64 {
    let is_half = x == x.trunc() + 0.5;
    let r = match mode {
        NearestMode::RoundPreferFloor if is_half => x.floor(),
        NearestMode::RoundPreferCeil if is_half => x.ceil(),
        NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => x.round(),
        NearestMode::Floor => x.floor(),
        NearestMode::Ceil => x.ceil(),
        NearestMode::Legacy if downsampling => x.ceil(),
        NearestMode::Legacy => x.trunc(),
    };
    r as i64
}

fn clamp_index(i: i64, len: usize) -> usize {
    i.clamp(0, len as i64 - 1) as usize
}

/// Cubic convolution weights of the taps at `floor(x)-1 .. floor(x)+2` for `s = x - floor(x)`.
fn cubic_coeffs(s: f32, a: f32) -> [f32; 4] {
    [
        ((a * (s + 1.0) - 5.0 * a) * (s + 1.0) + 8.0 * a) * (s + 1.0) - 4.0 * a,
        ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
        ((a + 2.0) * (1.0 - s) - (a + 3.0)) * (1.0 - s) * (1.0 - s) + 1.0,
        ((a * (2.0 - s) - 5.0 * a) * (2.0 - s) + 8.0 * a) * (2.0 - s) - 4.0 * a,
    ]
}

/// The taps of every output position along one axis of input length `in_len` (> 0).
fn axis_taps(in_len: usize, ax: &AxisResample, mode: InterpMode, coord: CoordMode) -> Taps {
    let last = in_len as f32 - 1.0;
    (0..ax.out_len)
        .map(|j| {
            let x = source_coord(coord, j as f32, ax, in_len);
            if coord == CoordMode::TfCropAndResize && (x < 0.0 || x > last) {
                return None;
            }
            Some(match mode {
                InterpMode::Nearest(nm) => vec![(clamp_index(nearest_index(x, nm, ax.scale < 1.0), in_len), 1.0)],
                InterpMode::Linear => {
                    let x = x.clamp(0.0, last);
                    let x1 = clamp_index(x as i64, in_len);
                    let x2 = (x1 + 1).min(in_len - 1);
                    if x1 == x2 {
                        vec![(x1, 1.0)]
                    } else {
                        // ORT's weights: each neighbour gets the distance to the other one.
                        vec![(x1, x2 as f32 - x), (x2, x - x1 as f32)]
                    }
                }
                InterpMode::Cubic { a, exclude_outside } => {
                    let base = x.floor();
                    let coeffs = cubic_coeffs(x - base, a);
                    let base = base as i64;
                    let mut taps: Vec<(i64, f32)> = (0..4).map(|k| (base - 1 + k as i64, coeffs[k])).collect();
                    if exclude_outside {
                        for t in taps.iter_mut() {
                            if t.0 < 0 || t.0 >= in_len as i64 {
                                t.1 = 0.0;
                            }
                        }
                        let total: f32 = taps.iter().map(|t| t.1).sum();
                        if total != 0.0 {
                            for t in taps.iter_mut() {
                                t.1 /= total;
                            }
                        }
                    }
                    // Out-of-range taps read the edge value (edge padding).
                    taps.into_iter().filter(|t| t.1 != 0.0).map(|(i, w)| (clamp_index(i, in_len), w)).collect()
                }
            })
        })
        .collect()
}

fn is_identity(taps: &Taps, in_len: usize) -> bool {
    taps.len() == in_len
        && taps.iter().enumerate().all(|(j, t)| matches!(t.as_deref(), Some([(i, w)]) if *i == j && *w == 1.0))
}

/// Resamples `a` along each axis with `plan[axis]` (`plan.len() == a.ndim()`) by
/// interpolation in f32.
pub fn resize_f32(
    a: &ArrayD<f32>,
    plan: &[AxisResample],
    mode: InterpMode,
    coord: CoordMode,
    extrapolation: f32,
) -> ArrayD<f32> {
    resample(a, plan, mode, coord, extrapolation, |out, src, axis, taps| {
        for (k, &(i, w)) in taps.iter().enumerate() {
            let lane = src.index_axis(Axis(axis), i);
            if k == 0 {
                out.zip_mut_with(&lane, |o, &v| *o = w * v);
            } else {
                out.zip_mut_with(&lane, |o, &v| *o += w * v);
            }
        }
    })
}

/// Nearest-neighbour resize of any element type, copying values exactly.
pub fn resize_nearest<T: Elem>(
    a: &ArrayD<T>,
    plan: &[AxisResample],
    mode: NearestMode,
    coord: CoordMode,
    extrapolation: f64,
) -> ArrayD<T> {
    let fill = T::from_f64(extrapolation);
    resample(a, plan, InterpMode::Nearest(mode), coord, fill, |out, src, axis, taps| {
        // Nearest taps are single (index, 1.0) pairs.
        if let Some(&(i, _)) = taps.first() {
            out.assign(&src.index_axis(Axis(axis), i));
        }
    })
}

/// The separable driver: for each axis that changes, build a new array one output slice at a
/// time with `combine(output slice, source, axis, taps)`.
fn resample<T: Copy + Default>(
    a: &ArrayD<T>,
    plan: &[AxisResample],
    mode: InterpMode,
    coord: CoordMode,
    extrapolation: T,
    combine: impl Fn(&mut ArrayViewMutD<T>, &ArrayD<T>, usize, &[(usize, f32)]),
) -> ArrayD<T> {
    let mut cur = a.clone();
    // ORT copies the input when the output shape equals the input shape, whatever the scales
    // (e.g. scale 1.3 on a length-3 axis gives length 3); a crop still resamples.
    if coord != CoordMode::TfCropAndResize && plan.iter().zip(a.shape()).all(|(ax, &d)| ax.out_len == d) {
        return cur;
    }
    for (axis, ax) in plan.iter().enumerate() {
        let in_len = cur.shape()[axis];
        let mut shape = cur.shape().to_vec();
        shape[axis] = ax.out_len;
        if in_len == 0 || shape.contains(&0) {
            // Nothing to read or nothing to write: the output is empty, or (an empty input
            // resized to a non-empty `sizes`) all extrapolation value.
            cur = ArrayD::from_elem(shape, extrapolation);
            continue;
        }
        let taps = axis_taps(in_len, ax, mode, coord);
        if is_identity(&taps, in_len) {
            continue;
        }
        let mut out = ArrayD::from_elem(shape, T::default());
        for (j, t) in taps.iter().enumerate() {
            let mut slice = out.index_axis_mut(Axis(axis), j);
            match t {
                None => slice.fill(extrapolation),
                Some(t) => combine(&mut slice, &cur, axis, t),
            }
        }
        cur = out;
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::{array, IxDyn};

    fn ax(scale: f32, out_len: usize) -> AxisResample {
        AxisResample { scale, out_len, roi: (0.0, 1.0), from_sizes: false }
    }

    fn row(v: &[f32]) -> ArrayD<f32> {
        ArrayD::from_shape_vec(IxDyn(&[1, v.len()]), v.to_vec()).unwrap()
    }

    fn assert_close(got: &ArrayD<f32>, want: &[f32]) {
        let g: Vec<f32> = got.iter().copied().collect();
        assert_eq!(g.len(), want.len(), "{g:?} vs {want:?}");
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{g:?} vs {want:?}");
        }
    }

    #[test]
    fn legacy_nearest_truncates_up_and_rounds_up_down() {
        // ORT Resize-10: scale 1.5 → [0,0,1,2,2,3,4]; scale 0.6 → [0,2,4].
        let a = row(&[0.0, 1.0, 2.0, 3.0, 4.0]);
        let up = resize_nearest(&a, &[ax(1.0, 1), ax(1.5, 7)], NearestMode::Legacy, CoordMode::Asymmetric, 0.0);
        assert_close(&up, &[0.0, 0.0, 1.0, 2.0, 2.0, 3.0, 4.0]);
        let down = resize_nearest(&a, &[ax(1.0, 1), ax(0.6, 3)], NearestMode::Legacy, CoordMode::Asymmetric, 0.0);
        assert_close(&down, &[0.0, 2.0, 4.0]);
    }

    #[test]
    fn linear_half_pixel_matches_ort() {
        // ORT Resize-13 linear half_pixel, scale 1.75 on [0,255,10,3].
        let a = row(&[0.0, 255.0, 10.0, 3.0]);
        let out = resize_f32(&a, &[ax(1.0, 1), ax(1.75, 7)], InterpMode::Linear, CoordMode::HalfPixel, 0.0);
        let want = [0.0, 91.071_43, 236.785_7, 132.5, 9.5, 5.5, 3.0];
        let g: Vec<f32> = out.iter().copied().collect();
        for (x, w) in g.iter().zip(want) {
            assert!((x - w).abs() < 1e-3, "{g:?}");
        }
    }

    #[test]
    fn crop_and_resize_extrapolates() {
        let a = row(&[0.0, 10.0, 20.0]);
        let plan = [ax(1.0, 1), AxisResample { scale: 4.0 / 3.0, out_len: 4, roi: (0.5, 1.5), from_sizes: false }];
        let out = resize_f32(&a, &plan, InterpMode::Linear, CoordMode::TfCropAndResize, -1.0);
        // x = 1 + j*(2/3): 1, 1.667, 2.333 (outside), 3 (outside)
        assert_close(&out, &[10.0, 16.666_666, -1.0, -1.0]);
    }

    #[test]
    fn cubic_at_integer_coordinates_is_exact() {
        let a = array![[1.0f32, 5.0, 2.0, 8.0]].into_dyn();
        let out = resize_f32(
            &a,
            &[ax(1.0, 1), ax(1.0, 4)],
            InterpMode::Cubic { a: -0.75, exclude_outside: false },
            CoordMode::HalfPixel,
            0.0,
        );
        assert_eq!(out, a);
    }
}
