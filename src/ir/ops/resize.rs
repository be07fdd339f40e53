//! The resize op family: Resize (opsets 10–19+) and the older Upsample (opsets 7–9).
//!
//! Both are one [`Resize`] op: the parsers translate each opset's attributes and inputs into
//! the same description (where scales/sizes/roi come from, interpolation, coordinate mode).
//! The kernels are in `crate::reference::resize`.

use super::OpSpec;
use crate::ir::broadcast::normalize_axes;
use crate::ir::dim::known_shape;
use crate::ir::{optional, required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::resize::{resize_f32, resize_nearest, AxisResample};
use crate::{map_tensor, op_bail, op_ensure};
use std::any::Any;

/// Maps an output coordinate to an input coordinate along one axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

/// How nearest mode rounds a fractional source coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Resize-10 and Upsample (no `nearest_mode` attribute): ORT truncates when upsampling
    /// and rounds up when downsampling along the axis.
    Legacy,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum InterpMode {
    Nearest(NearestMode),
    Linear,
    Cubic { a: f32, exclude_outside: bool },
}

/// The restriction `onnx2ait ops` states for Resize/Upsample.
const RUNTIME_SCALES: &str = "'scales', 'sizes' and 'roi' may be run-time values (e.g. graph inputs) of static \
     length for the reference executor and validate; code generation needs them known at compile time";

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Resize", parse_resize).with_note(RUNTIME_SCALES),
    OpSpec::onnx("Upsample", parse_upsample).with_note(RUNTIME_SCALES),
];

/// `keep_aspect_ratio_policy` (Resize-18) for `sizes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AspectPolicy {
    Stretch,
    NotLarger,
    NotSmaller,
}

/// Where the resize parameters come from.
#[derive(Clone, Debug, PartialEq)]
pub enum ScaleSource {
    /// Upsample-7: the `scales` attribute.
    Attr(Vec<f32>),
    /// Input indices of roi, scales and sizes (each optional; an empty tensor is absent).
    Inputs { roi: Option<usize>, scales: Option<usize>, sizes: Option<usize> },
}

#[derive(Clone, Debug)]
pub struct Resize {
    pub op_name: &'static str,
    pub mode: InterpMode,
    pub coord: CoordMode,
    pub extrapolation_value: f32,
    /// Resize-18 `axes`: the axes `scales`/`sizes`/`roi` refer to (all axes when absent).
    pub axes: Option<Vec<i64>>,
    pub aspect: AspectPolicy,
    pub source: ScaleSource,
    /// Upsample requires scales >= 1.
    pub upsample_only: bool,
}

/// The resize parameters as given by the model, before they are expanded to every axis.
struct Request {
    roi: Option<Vec<f32>>,
    scales: Option<Vec<f32>>,
    sizes: Option<Vec<Dim>>,
    /// At inference: `scales` is only known at run time (its values are placeholders of the
    /// right length); the resized axes become data-dependent.
    runtime_scales: bool,
}

/// One axis of the plan: output length, and the scale when it is known.
struct AxisPlan {
    out: Dim,
    scale: Option<f32>,
    roi: (f32, f32),
    from_sizes: bool,
}

/// `floor(dim * scale)` on a possibly symbolic dim; exact integer arithmetic where the scale
/// is an integer or the reciprocal of one, an opaque symbol otherwise.
fn scaled_dim(d: &Dim, scale: f32) -> Dim {
    if let Some(v) = d.as_known() {
        // f32 product truncated, as ORT computes it.
        return Dim::known((v as f32 * scale) as i64);
    }
    if scale == 1.0 {
        return d.clone();
    }
    if scale.fract() == 0.0 {
        return d.mul(&Dim::known(scale as i64));
    }
    let inv = 1.0 / scale;
    if inv.fract() == 0.0 && scale * inv == 1.0 {
        return d.div_floor(&Dim::known(inv as i64));
    }
    Dim::sym(format!("floor({d}*{scale})"))
}

impl Resize {
    fn rank_axes(&self, rank: usize) -> OpResult<Vec<usize>> {
        match &self.axes {
            Some(a) => normalize_axes(a, rank),
            None => Ok((0..rank).collect()),
        }
    }

    /// Expands the request to every axis: output length, scale and crop window.
    fn plan(&self, in_shape: &[Dim], req: Request) -> OpResult<Vec<AxisPlan>> {
        let rank = in_shape.len();
        let axes = self.rank_axes(rank)?;
        let n = axes.len();
        let mut plan: Vec<AxisPlan> = in_shape
            .iter()
            .map(|d| AxisPlan { out: d.clone(), scale: Some(1.0), roi: (0.0, 1.0), from_sizes: false })
            .collect();
        if self.coord == CoordMode::TfCropAndResize {
            let Some(roi) = req.roi else {
                op_bail!("coordinate_transformation_mode 'tf_crop_and_resize' needs input 'roi'")
            };
            op_ensure!(
                roi.len() == 2 * n,
                "input 'roi' must have {} values (starts then ends of {n} axes), found {}",
                2 * n,
                roi.len()
            );
            for (k, &ax) in axes.iter().enumerate() {
                plan[ax].roi = (roi[k], roi[n + k]);
            }
        }
        match (req.scales, req.sizes) {
            (Some(_), Some(_)) => op_bail!("only one of 'scales' and 'sizes' may be given"),
            (None, None) => op_bail!("one of 'scales' and 'sizes' must be given"),
            (Some(scales), None) => {
                op_ensure!(
                    scales.len() == n,
                    "'scales' must have {n} values (one per resized axis), found {}",
                    scales.len()
                );
                for (k, &ax) in axes.iter().enumerate() {
                    if req.runtime_scales {
                        plan[ax].out = Dim::data_dependent();
                        plan[ax].scale = None;
                        continue;
                    }
                    let s = scales[k];
                    op_ensure!(s.is_finite() && s > 0.0, "scale {s} of axis {ax} must be a positive number");
                    op_ensure!(!self.upsample_only || s >= 1.0, "Upsample scales must be >= 1, axis {ax} has {s}");
                    plan[ax].out = scaled_dim(&in_shape[ax], s);
                    plan[ax].scale = Some(s);
                }
            }
            (None, Some(sizes)) => {
                op_ensure!(
                    sizes.len() == n,
                    "'sizes' must have {n} values (one per resized axis), found {}",
                    sizes.len()
                );
                for d in &sizes {
                    if let Some(v) = d.as_known() {
                        op_ensure!(v >= 0, "'sizes' must not be negative, found {v}");
                    }
                }
                let ratio = |k: usize, ax: usize| -> Option<f32> {
                    let (o, i) = (sizes[k].as_known()?, in_shape[ax].as_known()?);
                    Some(o as f32 / i as f32)
                };
                match self.aspect {
                    AspectPolicy::Stretch => {
                        for (k, &ax) in axes.iter().enumerate() {
                            plan[ax].out = sizes[k].clone();
                            plan[ax].scale = if sizes[k] == in_shape[ax] { Some(1.0) } else { ratio(k, ax) };
                            plan[ax].from_sizes = true;
                        }
                    }
                    // Run-time sizes under an aspect policy: one scale computed at run time
                    // decides every resized axis.
                    _ if sizes.iter().any(Dim::is_data_dependent_marker) => {
                        for &ax in &axes {
                            plan[ax].out = Dim::data_dependent();
                            plan[ax].scale = None;
                            plan[ax].from_sizes = false;
                        }
                    }
                    policy => {
                        let mut ratios = Vec::with_capacity(n);
                        for (k, &ax) in axes.iter().enumerate() {
                            match ratio(k, ax) {
                                Some(r) => ratios.push(r),
                                None => op_bail!(
                                    "keep_aspect_ratio_policy '{}' needs static input dims and sizes on the resized axes, axis {ax} has {} → {}",
                                    if policy == AspectPolicy::NotLarger { "not_larger" } else { "not_smaller" },
                                    in_shape[ax],
                                    sizes[k]
                                ),
                            }
                        }
                        let pick = if policy == AspectPolicy::NotLarger { f32::min } else { f32::max };
                        let scale = ratios.iter().copied().reduce(pick).unwrap_or(1.0);
                        for &ax in &axes {
                            let i = in_shape[ax].as_known().unwrap_or(0);
                            // Round half up, as the ONNX reference does.
                            plan[ax].out = Dim::known((scale * i as f32 + 0.5) as i64);
                            plan[ax].scale = Some(scale);
                        }
                    }
                }
            }
        }
        Ok(plan)
    }

    fn check_dtype(&self, dtype: DType) -> OpResult<()> {
        op_ensure!(
            matches!(self.mode, InterpMode::Nearest(_)) || dtype != DType::Bool,
            "{}: only mode 'nearest' is defined for bool input",
            self.op_name
        );
        Ok(())
    }

    fn request_from_facts(&self, inputs: &[Option<&Fact>]) -> OpResult<Request> {
        let (roi_i, scales_i, sizes_i) = match &self.source {
            ScaleSource::Attr(s) => {
                return Ok(Request { roi: None, scales: Some(s.clone()), sizes: None, runtime_scales: false })
            }
            ScaleSource::Inputs { roi, scales, sizes } => (*roi, *scales, *sizes),
        };
        let present = |i: Option<usize>| -> Option<&Fact> {
            let f = optional(inputs, i?)?;
            // An empty tensor marks an unused input (Resize-11 requires roi/scales to exist).
            let empty = f.shape().iter().any(|d| d.as_known() == Some(0));
            (!empty).then_some(f)
        };
        // The values when constant, else NaN placeholders of the static length (the values
        // are read at run time; the output dims do not depend on roi).
        let floats = |f: &Fact, what: &str| -> OpResult<(Vec<f32>, bool)> {
            op_ensure!(f.dtype().is_float(), "input '{what}' must be a float tensor, found {}", f.dtype());
            op_ensure!(f.rank() == 1, "input '{what}' must be 1-D, found rank {}", f.rank());
            match &f.konst {
                Some(t) => Ok((t.to_f64_vec().into_iter().map(|v| v as f32).collect(), false)),
                None => match f.shape()[0].as_known() {
                    Some(n) if n >= 0 => Ok((vec![f32::NAN; n as usize], true)),
                    _ => op_bail!(
                        "input '{what}' is only known at run time and its length {} is not static",
                        f.shape()[0]
                    ),
                },
            }
        };
        let roi = match present(roi_i) {
            Some(f) if self.coord == CoordMode::TfCropAndResize => Some(floats(f, "roi")?.0),
            _ => None,
        };
        let (scales, runtime_scales) = match present(scales_i) {
            Some(f) => {
                let (v, runtime) = floats(f, "scales")?;
                (Some(v), runtime)
            }
            None => (None, false),
        };
        let sizes = match present(sizes_i) {
            None => None,
            Some(f) => {
                op_ensure!(f.dtype() == DType::I64, "input 'sizes' must be int64, found {}", f.dtype());
                // Sizes only known at run time (of static length) give data-dependent dims.
                Some(super::shape::runtime_dims_input(f, "sizes")?)
            }
        };
        Ok(Request { roi, scales, sizes, runtime_scales })
    }

    fn request_from_tensors(&self, inputs: &[Option<&Tensor>]) -> OpResult<Request> {
        let (roi_i, scales_i, sizes_i) = match &self.source {
            ScaleSource::Attr(s) => {
                return Ok(Request { roi: None, scales: Some(s.clone()), sizes: None, runtime_scales: false })
            }
            ScaleSource::Inputs { roi, scales, sizes } => (*roi, *scales, *sizes),
        };
        let present = |i: Option<usize>| optional(inputs, i?).filter(|t| !t.is_empty());
        let floats = |t: &Tensor| -> Vec<f32> { t.to_f64_vec().into_iter().map(|v| v as f32).collect() };
        Ok(Request {
            roi: present(roi_i).filter(|_| self.coord == CoordMode::TfCropAndResize).map(floats),
            scales: present(scales_i).map(floats),
            sizes: present(sizes_i).map(|t| t.to_i64_vec().into_iter().map(Dim::known).collect()),
            runtime_scales: false,
        })
    }
}

impl Op for Resize {
    fn op_type(&self) -> &'static str {
        self.op_name
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        self.check_dtype(x.dtype())?;
        let req = self.request_from_facts(inputs)?;
        let plan = self.plan(x.shape(), req)?;
        Ok(vec![Fact::new(x.dtype(), plan.into_iter().map(|p| p.out).collect())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        self.check_dtype(x.dtype())?;
        let req = self.request_from_tensors(inputs)?;
        let in_dims: Vec<Dim> = x.shape().iter().map(|&d| Dim::from(d)).collect();
        let plan = self.plan(&in_dims, req)?;
        let mut axes = Vec::with_capacity(plan.len());
        for (ax, p) in plan.iter().enumerate() {
            let out_len = known_shape(std::slice::from_ref(&p.out)).map(|v| v[0]);
            let (Some(out_len), Some(scale)) = (out_len, p.scale) else {
                op_bail!("output length of axis {ax} is not a non-negative number ({})", p.out)
            };
            axes.push(AxisResample { scale, out_len, roi: p.roi, from_sizes: p.from_sizes });
        }
        let ev = self.extrapolation_value;
        let y = match self.mode {
            InterpMode::Nearest(nm) => {
                map_tensor!(x, a => resize_nearest(a, &axes, nm, self.coord, ev as f64))
            }
            mode => Tensor::F32(resize_f32(&x.to_f32(), &axes, mode, self.coord, ev)).cast(x.dtype()),
        };
        Ok(vec![y])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Resize.
///
/// Opset history and handling:
/// - 10: inputs (X, scales); `mode` nearest|linear. ORT uses asymmetric coordinates and
///   legacy nearest rounding (truncate when upsampling, round up when downsampling); so do we.
/// - 11: inputs (X, roi, scales, sizes) with exactly one of scales/sizes (an empty tensor marks
///   the unused one); adds `coordinate_transformation_mode`, `nearest_mode`, `cubic` mode with
///   `cubic_coeff_a`/`exclude_outside`, `extrapolation_value` (for `tf_crop_and_resize`, which
///   is supported; roi may be a run-time value). `tf_half_pixel_for_nn` (11–12, removed in 13) is
///   rejected: ORT's results for it do not follow the documented formula, so no oracle exists.
/// - 13: roi and scales become optional inputs.
/// - 18: `axes`, `keep_aspect_ratio_policy` (stretch, not_larger, not_smaller all supported)
///   and `antialias` (1 is rejected: the antialiasing filter is not implemented).
/// - 19: `half_pixel_symmetric` coordinate mode.
///
/// Scales and roi may be constants or run-time values of static length (read when the node
/// runs; run-time scales make the resized axes data-dependent); sizes may be symbolic shape
/// expressions, or run-time values of static length (the resized axes are then data-dependent). Output dims stay
/// symbolic where the scale is 1, an integer or the reciprocal of an integer.
fn parse_resize(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    if ctx.opset < 11 {
        let mode = ctx.choice("mode", "nearest", &["nearest", "linear"])?;
        op_ensure!(
            ctx.num_inputs() == 2,
            "Resize-10 takes inputs (X, scales), the node has {} inputs",
            ctx.num_inputs()
        );
        return Ok(Box::new(Resize {
            op_name: "Resize",
            mode: if mode == "linear" { InterpMode::Linear } else { InterpMode::Nearest(NearestMode::Legacy) },
            coord: CoordMode::Asymmetric,
            extrapolation_value: 0.0,
            axes: None,
            aspect: AspectPolicy::Stretch,
            source: ScaleSource::Inputs { roi: None, scales: Some(1), sizes: None },
            upsample_only: false,
        }));
    }
    let mut coords = vec!["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"];
    if ctx.opset >= 19 {
        coords.push("half_pixel_symmetric");
    }
    let coord = match ctx.choice("coordinate_transformation_mode", "half_pixel", &coords)?.as_str() {
        "half_pixel" => CoordMode::HalfPixel,
        "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
        "align_corners" => CoordMode::AlignCorners,
        "asymmetric" => CoordMode::Asymmetric,
        "tf_crop_and_resize" => CoordMode::TfCropAndResize,
        _ => CoordMode::HalfPixelSymmetric,
    };
    let nearest = match ctx
        .choice("nearest_mode", "round_prefer_floor", &["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])?
        .as_str()
    {
        "round_prefer_floor" => NearestMode::RoundPreferFloor,
        "round_prefer_ceil" => NearestMode::RoundPreferCeil,
        "floor" => NearestMode::Floor,
        _ => NearestMode::Ceil,
    };
    let mode = match ctx.choice("mode", "nearest", &["nearest", "linear", "cubic"])?.as_str() {
        "nearest" => InterpMode::Nearest(nearest),
        "linear" => InterpMode::Linear,
        _ => InterpMode::Cubic {
            a: ctx.float_or("cubic_coeff_a", -0.75)?,
            exclude_outside: ctx.flag("exclude_outside", false)?,
        },
    };
    let (axes, aspect) = if ctx.opset >= 18 {
        if ctx.flag("antialias", false)? {
            op_bail!("attribute 'antialias'=1 is not supported (the antialiasing filter is not implemented)");
        }
        let aspect = match ctx
            .choice("keep_aspect_ratio_policy", "stretch", &["stretch", "not_larger", "not_smaller"])?
            .as_str()
        {
            "stretch" => AspectPolicy::Stretch,
            "not_larger" => AspectPolicy::NotLarger,
            _ => AspectPolicy::NotSmaller,
        };
        (ctx.ints("axes")?, aspect)
    } else {
        for attr in ["axes", "antialias", "keep_aspect_ratio_policy"] {
            op_ensure!(
                !ctx.has(attr),
                "attribute '{attr}' needs opset 18 or later; the model imports opset {}",
                ctx.opset
            );
        }
        (None, AspectPolicy::Stretch)
    };
    op_ensure!(
        ctx.num_inputs() <= 4,
        "Resize takes at most 4 inputs (X, roi, scales, sizes), the node has {}",
        ctx.num_inputs()
    );
    let input = |i: usize| ctx.input_present(i).then_some(i);
    Ok(Box::new(Resize {
        op_name: "Resize",
        mode,
        coord,
        extrapolation_value: ctx.float_or("extrapolation_value", 0.0)?,
        axes,
        aspect,
        source: ScaleSource::Inputs { roi: input(1), scales: input(2), sizes: input(3) },
        upsample_only: false,
    }))
}

/// Upsample (deprecated since opset 10, where it equals Resize-10).
///
/// Opset history: 7 takes `scales` as an attribute; 9 moves it to input 1 (a constant, or a
/// run-time value of static length). Modes nearest and linear; coordinates are asymmetric and nearest
/// truncates (ORT's behaviour). Scales must be >= 1.
fn parse_upsample(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let mode = ctx.choice("mode", "nearest", &["nearest", "linear"])?;
    let source = if ctx.opset < 9 {
        ScaleSource::Attr(ctx.req_floats("scales")?)
    } else {
        op_ensure!(
            ctx.num_inputs() == 2,
            "Upsample-9 takes inputs (X, scales), the node has {} inputs",
            ctx.num_inputs()
        );
        ScaleSource::Inputs { roi: None, scales: Some(1), sizes: None }
    };
    Ok(Box::new(Resize {
        op_name: "Upsample",
        mode: if mode == "linear" { InterpMode::Linear } else { InterpMode::Nearest(NearestMode::Legacy) },
        coord: CoordMode::Asymmetric,
        extrapolation_value: 0.0,
        axes: None,
        aspect: AspectPolicy::Stretch,
        source,
        upsample_only: true,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;
    use std::sync::Arc;

    fn parse(op: &str, opset: i64, attrs: &[(&str, Attr)], present: &[bool]) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, present, 1)
    }

    fn s(v: &str) -> Attr {
        Attr::String(v.to_string())
    }

    fn konst(t: Tensor) -> Fact {
        Fact::constant(Arc::new(t))
    }

    fn f32s(v: &[f32]) -> Tensor {
        Tensor::from_f32s(&[v.len()], v.to_vec())
    }

    fn nchw() -> Vec<Dim> {
        vec![Dim::sym("N"), Dim::known(3), Dim::sym("H"), Dim::known(10)]
    }

    #[test]
    fn infer_scales_keep_symbolic_dims() {
        let op = parse("Resize", 13, &[], &[true, false, true]).unwrap();
        let x = Fact::new(DType::F32, nchw());
        let scales = konst(f32s(&[1.0, 1.0, 2.0, 0.5]));
        let out = op.infer(&[Some(&x), None, Some(&scales)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(3), Dim::sym("H").mul(&Dim::known(2)), Dim::known(5)]);
        let half = konst(f32s(&[1.0, 1.0, 0.5, 1.0]));
        let out = op.infer(&[Some(&x), None, Some(&half)]).unwrap();
        assert_eq!(out[0].shape()[2].to_string(), "floor(H/2)");
        // Scales known only at run time: the resized axes are data-dependent; evaluation reads them.
        let dynamic = Fact::new(DType::F32, vec![Dim::known(4)]);
        assert_eq!(
            op.infer(&[Some(&x), None, Some(&dynamic)]).unwrap()[0].shape(),
            vec![Dim::data_dependent(); 4].as_slice()
        );
        let sym_len = Fact::new(DType::F32, vec![Dim::sym("K")]);
        assert!(op.infer(&[Some(&x), None, Some(&sym_len)]).unwrap_err().0.contains("not static"));
        let t = Tensor::from_f32s(&[1, 1, 2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let y = op.eval(&[Some(&t), None, Some(&f32s(&[1.0, 1.0, 2.0, 1.0]))]).unwrap();
        assert_eq!(y[0].shape(), &[1, 1, 4, 2]);
        // A run-time roi (tf_crop_and_resize) does not change the output dims.
        let crop =
            parse("Resize", 13, &[("coordinate_transformation_mode", s("tf_crop_and_resize"))], &[true, true, true])
                .unwrap();
        let roi = Fact::new(DType::F32, vec![Dim::known(8)]);
        assert_eq!(
            crop.infer(&[Some(&x), Some(&roi), Some(&scales)]).unwrap()[0].shape(),
            out_shape_of(op.as_ref(), &x, &scales).as_slice()
        );
    }

    fn out_shape_of(op: &dyn Op, x: &Fact, scales: &Fact) -> Vec<Dim> {
        op.infer(&[Some(x), None, Some(scales)]).unwrap().remove(0).shape().to_vec()
    }

    #[test]
    fn infer_symbolic_sizes_and_axes() {
        let op = parse("Resize", 13, &[], &[true, true, true, true]).unwrap();
        let x = Fact::new(DType::F16, nchw());
        let empty = konst(Tensor::from_f32s(&[0], vec![]));
        let sizes = Fact::symbolic(vec![Dim::sym("N"), Dim::known(3), Dim::known(64), Dim::known(64)], false);
        let out = op.infer(&[Some(&x), Some(&empty), Some(&empty), Some(&sizes)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(3), Dim::known(64), Dim::known(64)]);
        let op18 = parse("Resize", 18, &[("axes", Attr::Ints(vec![-1]))], &[true, false, true]).unwrap();
        let out = op18.infer(&[Some(&x), None, Some(&konst(f32s(&[3.0])))]).unwrap();
        assert_eq!(out[0].shape()[3], Dim::known(30));
        assert_eq!(out[0].shape()[2], Dim::sym("H"));
        let err = op.infer(&[Some(&x), None, None, None]).unwrap_err();
        assert!(err.0.contains("one of 'scales' and 'sizes'"), "{}", err.0);
    }

    #[test]
    fn parse_rejects_unsupported_attributes() {
        let err = parse("Resize", 18, &[("antialias", Attr::Int(1))], &[true, true, true]).unwrap_err();
        assert!(err.0.contains("antialias"), "{}", err.0);
        let err =
            parse("Resize", 13, &[("coordinate_transformation_mode", s("tf_half_pixel_for_nn"))], &[true, true, true])
                .unwrap_err();
        assert!(err.0.contains("not supported"), "{}", err.0);
        assert!(parse(
            "Resize",
            11,
            &[("coordinate_transformation_mode", s("tf_half_pixel_for_nn"))],
            &[true, true, true]
        )
        .is_err());
        assert!(parse(
            "Resize",
            18,
            &[("coordinate_transformation_mode", s("half_pixel_symmetric"))],
            &[true, true, true]
        )
        .is_err());
        assert!(parse("Resize", 13, &[("mode", s("area"))], &[true, true, true]).is_err());
        assert!(parse("Upsample", 7, &[], &[true]).unwrap_err().0.contains("scales"));
    }

    #[test]
    fn eval_nearest_keeps_integers_exact() {
        let op = parse("Resize", 13, &[("nearest_mode", s("floor"))], &[true, false, true]).unwrap();
        let big = i64::MAX - 3;
        let x = Tensor::from_i64s(&[1, 2], vec![big, 7]);
        let out = op.eval(&[Some(&x), None, Some(&f32s(&[1.0, 2.0]))]).unwrap();
        // half_pixel + floor: x = (j + 0.5) / 2 - 0.5 → -0.25, 0.25, 0.75, 1.25 → 0, 0, 0, 1.
        assert_eq!(out[0].to_i64_vec(), vec![big, big, big, 7]);
    }

    #[test]
    fn eval_linear_align_corners_and_keep_aspect() {
        // numpy/ORT: align_corners, [0, 3] resized to 4 → [0, 1, 2, 3]
        let op = parse(
            "Resize",
            13,
            &[("mode", s("linear")), ("coordinate_transformation_mode", s("align_corners"))],
            &[true, false, false, true],
        )
        .unwrap();
        let x = Tensor::from_f32s(&[1, 2], vec![0.0, 3.0]);
        let out = op.eval(&[Some(&x), None, None, Some(&Tensor::from_i64s(&[2], vec![1, 4]))]).unwrap();
        assert_eq!(out[0].shape(), &[1, 4]);
        assert_eq!(out[0].to_f64_vec(), vec![0.0, 1.0, 2.0, 3.0]);
        // not_larger: sizes (4, 6) for a 2x2 input gives scale min(2, 3) = 2 → 4x4.
        let op =
            parse("Resize", 18, &[("keep_aspect_ratio_policy", s("not_larger"))], &[true, false, false, true]).unwrap();
        let x = Tensor::from_f32s(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let out = op.eval(&[Some(&x), None, None, Some(&Tensor::from_i64s(&[2], vec![4, 6]))]).unwrap();
        assert_eq!(out[0].shape(), &[4, 4]);
    }

    #[test]
    fn upsample_versions() {
        let x = Tensor::from_f32s(&[1, 3], vec![0.0, 1.0, 2.0]);
        let up7 = parse("Upsample", 7, &[("scales", Attr::Floats(vec![1.0, 2.0]))], &[true]).unwrap();
        let out = up7.eval(&[Some(&x)]).unwrap();
        assert_eq!(out[0].to_f64_vec(), vec![0.0, 0.0, 1.0, 1.0, 2.0, 2.0]);
        let up9 = parse("Upsample", 9, &[("mode", s("linear"))], &[true, true]).unwrap();
        let scales = f32s(&[1.0, 2.0]);
        let fact = up9
            .infer(&[Some(&Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(3)])), Some(&konst(scales.clone()))])
            .unwrap();
        assert_eq!(fact[0].shape(), &[Dim::sym("N"), Dim::known(6)]);
        let out = up9.eval(&[Some(&x), Some(&scales)]).unwrap();
        // ORT Upsample-9 linear: asymmetric, edge clamped.
        assert_eq!(out[0].to_f64_vec(), vec![0.0, 0.5, 1.0, 1.5, 2.0, 2.0]);
        let shrink = f32s(&[1.0, 0.5]);
        assert!(up9.eval(&[Some(&x), Some(&shrink)]).unwrap_err().0.contains(">= 1"));
    }

    #[test]
    fn infer_runtime_sizes() {
        let op = parse("Resize", 13, &[], &[true, true, true, true]).unwrap();
        let x = Fact::new(DType::F32, nchw());
        let empty = konst(Tensor::from_f32s(&[0], vec![]));
        let sizes = Fact::new(DType::I64, vec![Dim::known(4)]);
        let out = op.infer(&[Some(&x), Some(&empty), Some(&empty), Some(&sizes)]).unwrap();
        assert_eq!(out[0].shape(), vec![Dim::data_dependent(); 4].as_slice());
        let op18 = parse(
            "Resize",
            18,
            &[("axes", Attr::Ints(vec![2, 3])), ("keep_aspect_ratio_policy", Attr::String("not_larger".into()))],
            &[true, true, true, true],
        )
        .unwrap();
        let sizes = Fact::new(DType::I64, vec![Dim::known(2)]);
        let out = op18.infer(&[Some(&x), Some(&empty), Some(&empty), Some(&sizes)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(3), Dim::data_dependent(), Dim::data_dependent()]);
        let unknown_len = Fact::new(DType::I64, vec![Dim::sym("R")]);
        let msg = op.infer(&[Some(&x), Some(&empty), Some(&empty), Some(&unknown_len)]).unwrap_err().0;
        assert!(msg.contains("is not static"), "{msg}");
    }
}
