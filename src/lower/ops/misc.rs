//! GPU lowering of the remaining ONNX ops that survive optimisation: LRN, Resize/Upsample,
//! ConvTranspose, Trilu, CumSum, MeanVarianceNormalization, InstanceNormalization, Einsum and
//! EyeLike. (Hardmax is lowered with Softmax, in `norm.rs`.)
//!
//! Each kernel computes what the op's reference (`crate::reference`) computes, in f32 on fp16
//! storage (fp32 storage with `--precision fp32`): the per-element formulas, the rounding choices
//! of nearest-neighbour resizing and the order of the sums that the reference fixes (cumulative
//! sums) are reproduced; the resize weights themselves are taken from the reference
//! implementation (see `resize_taps`).

use super::shape::{
    exprs, f32_literal, f32_table, fields, input_dims, input_ints, op_of, output_shape, row_major_strides,
};
use super::{float_storage_fields, is_device_float, LowerSpec};
use crate::ir::broadcast::{normalize_axes, normalize_axis};
use crate::ir::dim::{fmt_shape, product};
use crate::ir::ops::conv::{AutoPad, ConvTranspose};
use crate::ir::ops::cumsum::CumSum;
use crate::ir::ops::einsum::Einsum;
use crate::ir::ops::generator::EyeLike;
use crate::ir::ops::mvn::MeanVarianceNormalization;
use crate::ir::ops::normalization::{InstanceNorm, Lrn};
use crate::ir::ops::resize::{AspectPolicy, Resize, ScaleSource};
use crate::ir::ops::resize::{CoordMode, InterpMode};
use crate::ir::ops::trilu::Trilu;
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult};
use crate::lower_unsupported;
use crate::reference::resize::{resize_f32, resize_nearest, AxisResample};
use ndarray::{ArrayD, IxDyn};
use serde_json::json;

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<Lrn>("LRN", lower_lrn),
    LowerSpec::of::<Resize>("Resize", lower_resize),
    LowerSpec::of::<Resize>("Upsample", lower_resize),
    LowerSpec::of::<ConvTranspose>("ConvTranspose", lower_conv_transpose),
    LowerSpec::of::<Trilu>("Trilu", lower_trilu),
    LowerSpec::of::<CumSum>("CumSum", lower_cumsum),
    LowerSpec::of::<MeanVarianceNormalization>("MeanVarianceNormalization", lower_mvn),
    LowerSpec::of::<Einsum>("Einsum", lower_einsum),
    LowerSpec::of::<InstanceNorm>("InstanceNormalization", lower_instance_norm),
    LowerSpec::of::<EyeLike>("EyeLike", lower_eye_like),
];

fn invalid(msg: String) -> LowerError {
    LowerError::Invalid(msg)
}

/// A dim every kernel of this file needs as a plain number (spatial sizes, channel counts).
fn known(d: &Dim, what: &str) -> LowerResult<i64> {
    match d.as_known() {
        Some(v) => Ok(v),
        None => Err(LowerError::Unsupported(format!("{what} {d} must be known at compile time"))),
    }
}

fn float_input(cx: &LowerCtx, node: &Node, t: usize) -> LowerResult<()> {
    let dt = cx.dtype(t);
    if !is_device_float(dt) {
        return Err(invalid(format!("{} computes on floating-point tensors, found {dt}", node.op_type)));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// LRN

/// LRN across channels of `[N, C, spatial...]`: `y = x / (bias + alpha/size · Σ x²)^beta` over
/// channels `c - floor((size-1)/2) ..= c + ceil((size-1)/2)` (clipped), squares summed in f32
/// in channel order like the reference.
fn lower_lrn(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Lrn>(node)?;
    let x = cx.input(node, 0)?;
    float_input(cx, node, x)?;
    let out = cx.output(node, 0)?;
    let s = cx.shape(x).to_vec();
    if s.len() < 3 {
        return Err(invalid(format!("LRN needs an input [N, C, spatial...], found {}", fmt_shape(&s))));
    }
    let before = (op.size - 1) / 2;
    let after = op.size - 1 - before;
    let mut c = fields(json!({
        "n": cx.numel_expr(&s)?,
        "channels": cx.expr(&s[1])?,
        "inner": cx.expr(&product(&s[2..]))?,
        "before": before,
        "after": after,
        // alpha / size in f32, as the reference computes it.
        "alpha_over_size": f32_literal(op.alpha / op.size as f32),
        "beta": f32_literal(op.beta),
        "bias": f32_literal(op.bias),
    }));
    float_storage_fields(&mut c, cx.dtype(x))?;
    cx.emit(&node.name, "lrn", vec![x, out], vec![1], c, 0)
}

// ---------------------------------------------------------------------------------------------
// Resize / Upsample

/// The taps of one resampled axis: for every output position, `None` (outside a
/// `tf_crop_and_resize` window: the extrapolation value) or the (input index, weight) pairs.
type AxisTaps = Vec<Option<Vec<(usize, f32)>>>;

/// The taps of one axis as the reference computes them, read back from the reference itself:
/// resampling the `in_len` unit vectors (rows of an identity matrix, an identity axis the
/// reference skips) along the axis gives each output position's weight on every input index.
/// A NaN extrapolation value marks positions outside the crop window. Deriving the taps this
/// way keeps one implementation of the coordinate and rounding rules, the reference's.
pub(crate) fn resize_taps(in_len: usize, ax: AxisResample, mode: InterpMode, coord: CoordMode) -> AxisTaps {
    let basis = ArrayD::from_shape_fn(IxDyn(&[in_len, in_len]), |i| if i[0] == i[1] { 1.0f32 } else { 0.0 });
    let plan = [AxisResample { scale: 1.0, out_len: in_len, roi: (0.0, 1.0), from_sizes: false }, ax];
    let w = match mode {
        InterpMode::Nearest(nm) => resize_nearest(&basis, &plan, nm, coord, f64::NAN),
        _ => resize_f32(&basis, &plan, mode, coord, f32::NAN),
    };
    (0..ax.out_len)
        .map(|j| {
            if w[[0, j]].is_nan() {
                return None;
            }
            Some((0..in_len).filter(|&i| w[[i, j]] != 0.0).map(|i| (i, w[[i, j]])).collect())
        })
        .collect()
}

/// How one axis of a Resize node resamples, before its output length is attached.
#[derive(Clone, Copy, Debug, PartialEq)]
struct AxisScale {
    scale: f32,
    /// The length came from `sizes` (the reference then maps coordinates by lengths).
    from_sizes: bool,
    /// The crop window of `tf_crop_and_resize`.
    roi: (f32, f32),
}

/// The per-axis plan of a Resize node, from the constant `scales` / `sizes` / `roi` inputs,
/// following the IR op's rules.
fn resize_plan(cx: &LowerCtx, node: &Node, op: &Resize, in_shape: &[Dim]) -> LowerResult<Vec<AxisScale>> {
    let rank = in_shape.len();
    let axes = match &op.axes {
        Some(a) => normalize_axes(a, rank).map_err(|e| invalid(e.0))?,
        None => (0..rank).collect(),
    };
    let n = axes.len();
    let present = |i: Option<usize>| -> Option<usize> {
        let i = i?;
        let v = node.inputs.get(i).copied().flatten()?;
        let empty = cx.graph.ty(v).shape.iter().any(|d| d.as_known() == Some(0));
        (!empty).then_some(i)
    };
    let floats = |i: usize, what: &str| -> LowerResult<Vec<f32>> {
        match cx.konst(node, i) {
            Some(t) => Ok(t.to_f64_vec().into_iter().map(|v| v as f32).collect()),
            None => Err(LowerError::Unsupported(format!("Resize with '{what}' known only at run time"))),
        }
    };
    let (roi, scales, sizes) = match &op.source {
        ScaleSource::Attr(s) => (None, Some(s.clone()), None),
        ScaleSource::Inputs { roi, scales, sizes } => {
            let roi = match present(*roi) {
                Some(i) if op.coord == CoordMode::TfCropAndResize => Some(floats(i, "roi")?),
                _ => None,
            };
            let scales = present(*scales).map(|i| floats(i, "scales")).transpose()?;
            let sizes = match present(*sizes) {
                None => None,
                Some(i) => match input_dims(cx, node, i) {
                    Some(d) => Some(d),
                    None => lower_unsupported!("Resize with 'sizes' known only at run time"),
                },
            };
            (roi, scales, sizes)
        }
    };
    let mut plan = vec![AxisScale { scale: 1.0, from_sizes: false, roi: (0.0, 1.0) }; rank];
    if op.coord == CoordMode::TfCropAndResize {
        let roi = roi.ok_or_else(|| invalid("tf_crop_and_resize needs a constant 'roi'".into()))?;
        if roi.len() != 2 * n {
            return Err(invalid(format!("'roi' has {} values for {n} axes", roi.len())));
        }
        for (k, &a) in axes.iter().enumerate() {
            plan[a].roi = (roi[k], roi[n + k]);
        }
    }
    match (scales, sizes) {
        (Some(scales), None) => {
            if scales.len() != n {
                return Err(invalid(format!("'scales' has {} values for {n} axes", scales.len())));
            }
            for (k, &a) in axes.iter().enumerate() {
                plan[a].scale = scales[k];
            }
        }
        (None, Some(sizes)) => {
            if sizes.len() != n {
                return Err(invalid(format!("'sizes' has {} values for {n} axes", sizes.len())));
            }
            let ratio = |k: usize, a: usize| -> Option<f32> {
                Some(sizes[k].as_known()? as f32 / in_shape[a].as_known()? as f32)
            };
            match op.aspect {
                AspectPolicy::Stretch => {
                    for (k, &a) in axes.iter().enumerate() {
                        let scale = if sizes[k] == in_shape[a] { Some(1.0) } else { ratio(k, a) };
                        let Some(scale) = scale else {
                            lower_unsupported!(
                                "Resize of axis {a} from {} to {} (sizes must be known)",
                                in_shape[a],
                                sizes[k]
                            )
                        };
                        plan[a].scale = scale;
                        plan[a].from_sizes = true;
                    }
                }
                policy => {
                    let ratios: Option<Vec<f32>> = axes.iter().enumerate().map(|(k, &a)| ratio(k, a)).collect();
                    let Some(ratios) = ratios else {
                        lower_unsupported!("keep_aspect_ratio_policy with sizes or dims known only at run time")
                    };
                    let pick = if policy == AspectPolicy::NotLarger { f32::min } else { f32::max };
                    let scale = ratios.iter().copied().reduce(pick).unwrap_or(1.0);
                    for &a in &axes {
                        plan[a].scale = scale;
                    }
                }
            }
        }
        _ => return Err(invalid("exactly one of 'scales' and 'sizes' must be given".into())),
    }
    Ok(plan)
}

/// Resize / Upsample: each output element combines the input at the product of its per-axis
/// taps. Axes whose length and scale stay put are read straight through; every other axis
/// (known sizes) gets a tap table in the weights blob. A resize that changes no dim is a view,
/// as the reference copies the input then.
fn lower_resize(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Resize>(node)?;
    let x = cx.input(node, 0)?;
    let in_shape = cx.shape(x).to_vec();
    let out_shape = output_shape(cx, node, 0)?;
    let rank = in_shape.len();
    if rank == 0 || out_shape.len() != rank {
        return Err(invalid(format!("Resize of {} into {}", fmt_shape(&in_shape), fmt_shape(&out_shape))));
    }
    if op.coord != CoordMode::TfCropAndResize && in_shape == out_shape {
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    let dtype = cx.dtype(x);
    let nearest = matches!(op.mode, InterpMode::Nearest(_));
    if !nearest && !is_device_float(dtype) {
        return Err(invalid(format!("{}: only mode 'nearest' is defined for {dtype} input", op.op_name)));
    }
    let plan = resize_plan(cx, node, op, &in_shape)?;
    let mut tables: Vec<AxisTaps> = Vec::new();
    let mut slots: Vec<i64> = Vec::with_capacity(rank);
    for a in 0..rank {
        let AxisScale { scale, from_sizes, roi } = plan[a];
        let passthrough = in_shape[a] == out_shape[a]
            && scale == 1.0
            && (op.coord != CoordMode::TfCropAndResize || roi == (0.0, 1.0));
        if passthrough {
            slots.push(-1);
            continue;
        }
        let in_len = known(&in_shape[a], "a resized axis")?;
        let out_len = known(&out_shape[a], "a resized axis")?;
        if in_len <= 0 || out_len <= 0 {
            lower_unsupported!("Resize of an empty axis ({in_len} → {out_len})");
        }
        if in_len == out_len && op.coord != CoordMode::TfCropAndResize {
            // The reference keeps this axis only when another axis changes; a scale other than 1
            // on an unchanged length has no GPU kernel (no model we know does it).
            lower_unsupported!("Resize with scale {scale} on axis {a} whose length {in_len} does not change");
        }
        let ax = AxisResample { scale, out_len: out_len as usize, roi, from_sizes };
        slots.push(tables.len() as i64);
        tables.push(resize_taps(in_len as usize, ax, op.mode, op.coord));
    }
    if tables.is_empty() {
        // A crop window of (0, 1) on every axis: the reference skips every identity axis.
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    let max_taps = tables.iter().flatten().flatten().map(Vec::len).max().unwrap_or(1).max(1);
    // Table of one axis: per output position [count (-1: extrapolate), index × T, weight × T].
    let row = 1 + 2 * max_taps;
    let mut words: Vec<f32> = Vec::new();
    let mut offsets = Vec::new();
    for t in &tables {
        offsets.push(words.len());
        for pos in t {
            let mut entry = vec![0i32; row];
            match pos {
                None => entry[0] = -1,
                // Every weight zero (a degenerate cubic window): one tap of weight 0.
                Some(taps) if taps.is_empty() => entry[0] = 1,
                Some(taps) => {
                    entry[0] = taps.len() as i32;
                    for (k, &(i, w)) in taps.iter().enumerate() {
                        entry[1 + k] = i as i32;
                        entry[1 + max_taps + k] = w.to_bits() as i32;
                    }
                }
            }
            words.extend(entry.into_iter().map(|v| f32::from_bits(v as u32)));
        }
    }
    let out = cx.output(node, 0)?;
    let table = f32_table(cx, &format!("{}.taps", node.name), &words)?;
    // Converted to the element type on the device, as the reference converts it.
    let extrapolation = f32_literal(op.extrapolation_value);
    let c = fields(json!({
        "ctype": ctype(dtype),
        "n": cx.numel_expr(&out_shape)?,
        "rank": rank,
        "resampled": tables.len(),
        "taps": max_taps,
        "nearest": nearest,
        "out_dims": exprs(cx, &out_shape)?,
        "in_strides": exprs(cx, &row_major_strides(&in_shape))?,
        "slots": slots,
        "table_offsets": offsets,
        "extrapolation": extrapolation,
    }));
    cx.emit(&node.name, "resize", vec![x, table, out], vec![2], c, 0)
}

// ---------------------------------------------------------------------------------------------
// ConvTranspose

/// ConvTranspose (1-3 spatial dims, groups, dilations, output_padding, output_shape, auto_pad)
/// as a direct gather: every output element sums, over its group's input channels and the
/// kernel taps that land on it, `x · w`, starting from the bias. The begin padding follows the
/// IR op (ONNX Runtime's split of the total padding).
fn lower_conv_transpose(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<ConvTranspose>(node)?;
    let x = cx.input(node, 0)?;
    let w = cx.input(node, 1)?;
    float_input(cx, node, x)?;
    let bias = cx.opt_input(node, 2)?;
    let xs = cx.shape(x).to_vec();
    let ws = cx.shape(w).to_vec();
    let rank = xs.len().saturating_sub(2);
    if !(1..=3).contains(&rank) || ws.len() != xs.len() {
        return Err(invalid(format!("ConvTranspose of {} with weights {}", fmt_shape(&xs), fmt_shape(&ws))));
    }
    let out_shape = output_shape(cx, node, 0)?;
    let group = op.group as i64;
    let c_in = known(&xs[1], "the channel count")?;
    let kg = known(&ws[1], "the weights' output channels")?;
    if group < 1 || c_in % group != 0 {
        return Err(invalid(format!("{c_in} input channels do not divide into {group} groups")));
    }
    let kernel: Vec<i64> = ws[2..].iter().map(|d| known(d, "the kernel size")).collect::<LowerResult<_>>()?;
    let get = |v: &Option<Vec<usize>>, default: usize, len: usize, what: &str| -> LowerResult<Vec<i64>> {
        match v {
            None => Ok(vec![default as i64; len]),
            Some(v) if v.len() == len => Ok(v.iter().map(|&x| x as i64).collect()),
            Some(v) => Err(invalid(format!("'{what}' = {v:?} must have {len} values"))),
        }
    };
    let strides = get(&op.window.strides, 1, rank, "strides")?;
    let dilations = get(&op.window.dilations, 1, rank, "dilations")?;
    let pads = if op.window.auto_pad == AutoPad::NotSet {
        get(&op.window.pads, 0, 2 * rank, "pads")?
    } else {
        vec![0; 2 * rank]
    };
    let out_pad = get(&op.output_padding, 0, rank, "output_padding")?;
    let requested: Option<Vec<i64>> = match &op.output_shape {
        None => None,
        Some(v) if v.len() == rank => Some(v.iter().map(|&x| x as i64).collect()),
        Some(v) if v.len() == rank + 2 => Some(v[2..].iter().map(|&x| x as i64).collect()),
        Some(v) => return Err(invalid(format!("'output_shape' = {v:?} must have {rank} values"))),
    };
    let mut in_sp = Vec::with_capacity(rank);
    let mut out_sp = Vec::with_capacity(rank);
    let mut begin = Vec::with_capacity(rank);
    for i in 0..rank {
        let input = known(&xs[2 + i], "a spatial dim")?;
        let out_len = known(&out_shape[2 + i], "a spatial dim")?;
        let span = dilations[i] * (kernel[i] - 1) + 1;
        let full = strides[i] * (input - 1) + out_pad[i] + span;
        let target = match (&requested, op.window.auto_pad) {
            (Some(r), _) => Some(r[i]),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(input * strides[i]),
            _ => None,
        };
        let b = match target {
            None => pads[i],
            Some(t) => {
                let total = (full - t).max(0);
                let small = total / 2;
                if op.window.auto_pad == AutoPad::SameUpper {
                    small
                } else {
                    total - small
                }
            }
        };
        in_sp.push(input);
        out_sp.push(out_len);
        begin.push(b);
    }
    // Lift to three spatial dims (leading unit dims), as the reference does.
    let lift = |v: &[i64], fill: i64| -> Vec<i64> {
        let mut l = vec![fill; 3 - v.len()];
        l.extend_from_slice(v);
        l
    };
    let out = cx.output(node, 0)?;
    let mut args = vec![x, w];
    if let Some(b) = bias {
        args.push(b);
    }
    let out_arg = args.len();
    args.push(out);
    let mut c = fields(json!({
        "n": cx.numel_expr(&out_shape)?,
        "channels": c_in,
        "out_channels": kg * group,
        "group_in": c_in / group,
        "group_out": kg,
        "in_dims": lift(&in_sp, 1),
        "out_dims": lift(&out_sp, 1),
        "kernel": lift(&kernel, 1),
        "strides": lift(&strides, 1),
        "dilations": lift(&dilations, 1),
        "pads": lift(&begin, 0),
        "has_bias": bias.is_some(),
        "out_arg": out_arg,
    }));
    float_storage_fields(&mut c, cx.dtype(x))?;
    cx.emit(&node.name, "conv_transpose", args, vec![out_arg], c, 0)
}

// ---------------------------------------------------------------------------------------------
// Trilu

/// Trilu: keeps `(.., i, j)` with `j - i >= k` (upper) or `<= k` (lower), zero elsewhere; `k`
/// is a constant (baked in) or read from the device when it is only known at run time.
fn lower_trilu(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Trilu>(node)?;
    let x = cx.input(node, 0)?;
    let out = cx.output(node, 0)?;
    let s = cx.shape(x).to_vec();
    if s.len() < 2 {
        return Err(invalid(format!("Trilu needs rank 2 or more, found {}", fmt_shape(&s))));
    }
    let mut args = vec![x];
    let k_const = match node.inputs.get(1).copied().flatten() {
        None => Some(0),
        Some(_) => match input_ints(cx, node, 1) {
            Some(v) if v.len() == 1 => Some(v[0]),
            Some(v) => return Err(invalid(format!("'k' must hold one value, found {v:?}"))),
            None => {
                args.push(cx.input(node, 1)?);
                None
            }
        },
    };
    let out_arg = args.len();
    args.push(out);
    let c = fields(json!({
        "ctype": ctype(cx.dtype(x)),
        "n": cx.numel_expr(&s)?,
        "rows": cx.expr(&s[s.len() - 2])?,
        "cols": cx.expr(&s[s.len() - 1])?,
        "upper": op.upper,
        "k_arg": k_const.is_none(),
        "k": k_const.unwrap_or(0),
        "out_arg": out_arg,
    }));
    cx.emit(&node.name, "trilu", args, vec![out_arg], c, 0)
}

// ---------------------------------------------------------------------------------------------
// CumSum

/// CumSum along a constant axis: one thread per lane walks it in order (forward or reversed,
/// inclusive or exclusive), accumulating in f32 for fp16 data (rounded once per output, like
/// the reference's half types) and wrapping for integers.
fn lower_cumsum(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<CumSum>(node)?;
    let x = cx.input(node, 0)?;
    let s = cx.shape(x).to_vec();
    let axis = match input_ints(cx, node, 1).as_deref() {
        Some([a]) => normalize_axis(*a, s.len()).map_err(|e| invalid(e.0))?,
        Some(v) => return Err(invalid(format!("'axis' must hold one value, found {v:?}"))),
        None => lower_unsupported!("CumSum with 'axis' known only at run time"),
    };
    let dtype = cx.dtype(x);
    let (acc, add) = match dtype {
        DType::F16 | DType::F32 => ("float", "acc + (float)v"),
        DType::I32 | DType::I64 | DType::U32 | DType::U64 => ("uint64_t", "acc + (uint64_t)v"),
        other => lower_unsupported!("CumSum of {other}"),
    };
    let out = cx.output(node, 0)?;
    let c = fields(json!({
        "ctype": ctype(dtype),
        "acc": acc,
        "add": add,
        "lanes": cx.expr(&product(&s[..axis]).mul(&product(&s[axis + 1..])))?,
        "axis_len": cx.expr(&s[axis])?,
        "inner": cx.expr(&product(&s[axis + 1..]))?,
        "exclusive": op.exclusive,
        "reverse": op.reverse,
    }));
    cx.emit(&node.name, "cumsum", vec![x, out], vec![1], c, 0)
}

// ---------------------------------------------------------------------------------------------
// MeanVarianceNormalization

/// MeanVarianceNormalization: `(x - mean) / (sqrt(var) + 1e-9)` over `axes`, population
/// variance of the centred values, accumulated in f64 like the reference. One block per group
/// (one combination of the kept coordinates).
fn lower_mvn(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<MeanVarianceNormalization>(node)?;
    let x = cx.input(node, 0)?;
    float_input(cx, node, x)?;
    let s = cx.shape(x).to_vec();
    let axes = normalize_axes(&op.axes, s.len()).map_err(|e| invalid(e.0))?;
    let strides = row_major_strides(&s);
    let (mut kept_dims, mut kept_strides, mut red_dims, mut red_strides) = (vec![], vec![], vec![], vec![]);
    for a in 0..s.len() {
        if axes.contains(&a) {
            red_dims.push(s[a].clone());
            red_strides.push(strides[a].clone());
        } else {
            kept_dims.push(s[a].clone());
            kept_strides.push(strides[a].clone());
        }
    }
    for (d, st) in [(&mut kept_dims, &mut kept_strides), (&mut red_dims, &mut red_strides)] {
        if d.is_empty() {
            d.push(Dim::known(1));
            st.push(Dim::known(0));
        }
    }
    let out = cx.output(node, 0)?;
    let mut c = fields(json!({
        "groups": cx.expr(&product(&kept_dims))?,
        "count": cx.expr(&product(&red_dims))?,
        "kept_rank": kept_dims.len(),
        "red_rank": red_dims.len(),
        "kept_dims": exprs(cx, &kept_dims)?,
        "kept_strides": exprs(cx, &kept_strides)?,
        "red_dims": exprs(cx, &red_dims)?,
        "red_strides": exprs(cx, &red_strides)?,
    }));
    float_storage_fields(&mut c, cx.dtype(x))?;
    cx.emit(&node.name, "mvn", vec![x, out], vec![1], c, 0)
}

// ---------------------------------------------------------------------------------------------
// InstanceNormalization

/// InstanceNormalization: every (n, c) plane normalised on its own statistics (mean and
/// population variance in f64, `1/sqrt(var + eps)`), then `y = x·a + b` with the reference's
/// f32 folding `a = r·scale[c]`, `b = bias[c] - mean·a`. One block per plane. Constant scale
/// and bias stay f32 (see `f32_table`).
fn lower_instance_norm(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<InstanceNorm>(node)?;
    let x = cx.input(node, 0)?;
    float_input(cx, node, x)?;
    let s = cx.shape(x).to_vec();
    if s.len() < 3 {
        return Err(invalid(format!("InstanceNormalization needs [N, C, spatial...], found {}", fmt_shape(&s))));
    }
    let konst = |cx: &LowerCtx, i: usize| cx.konst(node, i).map(|t| t.to_f32().iter().copied().collect::<Vec<f32>>());
    let (scale, bias, f32_params) = match (konst(cx, 1), konst(cx, 2)) {
        (Some(sv), Some(bv)) => (
            f32_table(cx, &format!("{}.scale", node.name), &sv)?,
            f32_table(cx, &format!("{}.bias", node.name), &bv)?,
            true,
        ),
        _ => (cx.input(node, 1)?, cx.input(node, 2)?, false),
    };
    let out = cx.output(node, 0)?;
    let mut c = fields(json!({
        "planes": cx.expr(&s[0].mul(&s[1]))?,
        "channels": cx.expr(&s[1])?,
        "inner": cx.expr(&product(&s[2..]))?,
        "epsilon": format!("{:?}", f64::from(op.epsilon)),
        "f32_params": f32_params,
    }));
    float_storage_fields(&mut c, cx.dtype(x))?;
    cx.emit(&node.name, "instance_norm", vec![x, scale, bias, out], vec![3], c, 0)
}

// ---------------------------------------------------------------------------------------------
// EyeLike

/// EyeLike: ones on the diagonal offset by `k` of a 2-D tensor of the input's shape (the input
/// is not read), in the attribute's dtype or the input's.
fn lower_eye_like(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<EyeLike>(node)?;
    let out = cx.output(node, 0)?;
    let s = cx.shape(out).to_vec();
    if s.len() != 2 {
        return Err(invalid(format!("EyeLike needs a 2-D shape, found {}", fmt_shape(&s))));
    }
    let c = fields(json!({
        "ctype": ctype(cx.dtype(out)),
        "n": cx.numel_expr(&s)?,
        "cols": cx.expr(&s[1])?,
        "k": op.k,
    }));
    cx.emit(&node.name, "eye_like", vec![out], vec![0], c, 0)
}

// ---------------------------------------------------------------------------------------------
// Einsum

/// Number of letter labels (`A`-`Z` are 0-25, `a`-`z` 26-51); ellipsis dims follow, as in the
/// IR op, so the implicit output order matches numpy's.
const LETTERS: usize = 52;

/// One subscript of an equation term: a letter label or the ellipsis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sub {
    Letter(usize),
    Ellipsis,
}

fn einsum_term(term: &str) -> LowerResult<Vec<Sub>> {
    let mut subs = Vec::new();
    let mut rest = term;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("...") {
            subs.push(Sub::Ellipsis);
            rest = after;
            continue;
        }
        subs.push(Sub::Letter(match c {
            'A'..='Z' => c as usize - 'A' as usize,
            'a'..='z' => 26 + c as usize - 'a' as usize,
            _ => return Err(invalid(format!("'{c}' is not an einsum subscript"))),
        }));
        rest = &rest[c.len_utf8()..];
    }
    Ok(subs)
}

/// The equation resolved against the input ranks: one label per input axis and the output
/// labels (the IR op's rules: ellipsis dims right-aligned, implicit output = ellipsis dims then
/// the letters used exactly once, in label order). The IR op validated the equation at import.
fn einsum_labels(equation: &str, ranks: &[usize]) -> LowerResult<(Vec<Vec<usize>>, Vec<usize>)> {
    let compact: String = equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match compact.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (compact.as_str(), None),
    };
    let terms = lhs.split(',').map(einsum_term).collect::<LowerResult<Vec<_>>>()?;
    if terms.len() != ranks.len() {
        return Err(invalid(format!("equation '{equation}' has {} operands for {} inputs", terms.len(), ranks.len())));
    }
    let mut ell = Vec::with_capacity(terms.len());
    for (t, &r) in terms.iter().zip(ranks) {
        let letters = t.iter().filter(|s| matches!(s, Sub::Letter(_))).count();
        ell.push(
            r.checked_sub(letters).ok_or_else(|| invalid(format!("equation '{equation}' does not fit rank {r}")))?,
        );
    }
    let e = ell.iter().copied().max().unwrap_or(0);
    let expand = |term: &[Sub], k: usize| -> Vec<usize> {
        let mut out = Vec::new();
        for s in term {
            match s {
                Sub::Letter(l) => out.push(*l),
                Sub::Ellipsis => out.extend((e - k..e).map(|d| LETTERS + d)),
            }
        }
        out
    };
    let inputs: Vec<Vec<usize>> = terms.iter().zip(&ell).map(|(t, &k)| expand(t, k)).collect();
    let output = match rhs {
        Some(r) => expand(&einsum_term(r)?, e),
        None => {
            let mut count = [0usize; LETTERS];
            for s in terms.iter().flatten() {
                if let Sub::Letter(l) = s {
                    count[*l] += 1;
                }
            }
            (LETTERS..LETTERS + e).chain((0..LETTERS).filter(|&l| count[l] == 1)).collect()
        }
    };
    Ok((inputs, output))
}

/// Einsum, any equation: each output element sums, over every combination of the contracted
/// labels, the product of the operands at those coordinates. Repeated labels within an operand
/// (diagonals) add their strides; size-1 dims broadcast with stride 0. Floats accumulate in
/// f32, integers wrap in 64 bits. A direct kernel: exact for every equation, meant for the
/// small contractions einsum is used for (large ones export as MatMul).
fn lower_einsum(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Einsum>(node)?;
    let mut xs = Vec::with_capacity(node.inputs.len());
    for i in 0..node.inputs.len() {
        xs.push(cx.input(node, i)?);
    }
    let shapes: Vec<Vec<Dim>> = xs.iter().map(|&x| cx.shape(x).to_vec()).collect();
    let ranks: Vec<usize> = shapes.iter().map(Vec::len).collect();
    let (inputs, output) = einsum_labels(&op.equation, &ranks)?;
    let one = Dim::known(1);
    // Each label's size: the first dim other than 1 (the IR op checked they agree).
    let mut size: std::collections::BTreeMap<usize, Dim> = std::collections::BTreeMap::new();
    for (labels, shape) in inputs.iter().zip(&shapes) {
        for (l, d) in labels.iter().zip(shape) {
            let slot = size.entry(*l).or_insert_with(|| d.clone());
            if *slot == one {
                *slot = d.clone();
            }
        }
    }
    let contracted: Vec<usize> = size.keys().copied().filter(|l| !output.contains(l)).collect();
    let stride_of = |k: usize, l: usize| -> Dim {
        let strides = row_major_strides(&shapes[k]);
        let mut s = Dim::known(0);
        for (a, &la) in inputs[k].iter().enumerate() {
            if la == l && !(shapes[k][a] == one && size[&l] != one) {
                s = s.add(&strides[a]);
            }
        }
        s
    };
    let dims_of = |labels: &[usize]| -> Vec<Dim> {
        if labels.is_empty() {
            vec![one.clone()]
        } else {
            labels.iter().map(|l| size.get(l).cloned().unwrap_or_else(|| one.clone())).collect()
        }
    };
    let strides_of = |labels: &[usize], k: usize| -> Vec<Dim> {
        if labels.is_empty() {
            vec![Dim::known(0)]
        } else {
            labels.iter().map(|&l| stride_of(k, l)).collect()
        }
    };
    let out = cx.output(node, 0)?;
    let dtype = cx.dtype(out);
    let (acc, to_acc) = match dtype {
        DType::F16 | DType::F32 => ("float", "(float)"),
        DType::I32 | DType::I64 | DType::U32 | DType::U64 => ("uint64_t", "(uint64_t)"),
        other => lower_unsupported!("Einsum of {other}"),
    };
    let out_dims = dims_of(&output);
    let con_dims = dims_of(&contracted);
    let mut out_strides = Vec::new();
    let mut con_strides = Vec::new();
    for k in 0..xs.len() {
        out_strides.push(exprs(cx, &strides_of(&output, k))?);
        con_strides.push(exprs(cx, &strides_of(&contracted, k))?);
    }
    let mut args = xs.clone();
    let out_arg = args.len();
    args.push(out);
    let c = fields(json!({
        "ctype": ctype(dtype),
        "acc": acc,
        "to_acc": to_acc,
        "n": cx.numel_expr(cx.shape(out))?,
        "ops": xs.len(),
        "out_rank": out_dims.len(),
        "con_rank": con_dims.len(),
        "out_dims": exprs(cx, &out_dims)?,
        "con_dims": exprs(cx, &con_dims)?,
        "con_total": cx.expr(&product(&con_dims))?,
        "out_strides": out_strides,
        "con_strides": con_strides,
        "out_arg": out_arg,
    }));
    cx.emit(&node.name, "einsum", args, vec![out_arg], c, 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::resize::NearestMode;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{Attr, Tensor};
    use crate::lower::ops::shape::testing::*;
    use serde_json::json;

    fn lowered(b: &mut GraphBuilder) -> crate::lower::Program {
        infer_graph(&mut b.g).unwrap();
        lower(&b.g).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes one GPU check of `g` (inputs: seeded random, symbolic dims 3) into `root/name`.
    fn write_check(root: &std::path::Path, name: &str, g: &crate::ir::Graph) {
        let mut opts = crate::validate::inputs::InputOptions { seed: 7, ..Default::default() };
        for &v in &g.inputs {
            for d in &g.ty(v).shape {
                for s in d.symbols() {
                    opts.dims.insert(s.to_string(), 3);
                }
            }
        }
        let inputs = match crate::validate::inputs::make_inputs(g, &opts) {
            Ok(i) => i,
            Err(e) => return eprintln!("skip {name}: {e}"),
        };
        // The device sees fp16 inputs: give the reference the same values.
        let feeds: Vec<(String, Tensor)> = inputs
            .tensors
            .iter()
            .map(|(n, t)| {
                let t = if t.dtype() == DType::F32 { t.cast(DType::F16).cast(DType::F32) } else { t.clone() };
                (n.clone(), t)
            })
            .collect();
        let map = feeds.iter().cloned().collect();
        let expected = match crate::reference::run(g, &map) {
            Ok(e) => e,
            Err(e) => return eprintln!("skip {name}: reference fails: {e}"),
        };
        match write_gpu_case(&root.join(name), g, &inputs.dims, &feeds, &expected) {
            Ok(()) => eprintln!("wrote {name}"),
            Err(e) => eprintln!("skip {name}: {e}"),
        }
    }

    /// Small graphs for the ops no bundled model covers.
    fn extra_checks() -> Vec<(&'static str, crate::ir::Graph)> {
        let mut out = Vec::new();
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "N,7,5");
        let k = b.konst("k", Tensor::from_i64s(&[1], vec![3]));
        let top = b.node("TopK", vec![("axis", Attr::Int(1))], &[x, k], 2);
        let low = b.node("TopK", vec![("axis", Attr::Int(-1)), ("largest", Attr::Int(0))], &[x, k], 2);
        let sc = b.konst("sc", Tensor::from_f32s(&[7], vec![0.5, 1.0, 1.5, 2.0, -1.0, 0.25, 3.0]));
        let bi = b.konst("bi", Tensor::from_f32s(&[7], vec![0.1, -0.2, 0.3, 0.0, 1.0, 2.0, -3.0]));
        let inorm = b.node("InstanceNormalization", vec![("epsilon", Attr::Float(1e-3))], &[x, sc, bi], 1)[0];
        let sq = b.input("sq", DType::F32, "4,6");
        let eye = b.node("EyeLike", vec![("k", Attr::Int(-1))], &[sq], 1)[0];
        let mask = b.node("Dropout", vec![], &[sq], 2);
        let shape = b.node("Shape", vec![], &[x], 1)[0];
        let size = b.node("Size", vec![], &[x], 1)[0];
        b.g.outputs.extend([top[0], top[1], low[0], low[1], inorm, eye, mask[0], mask[1], shape, size]);
        crate::ir::infer::infer_graph(&mut b.g).unwrap();
        out.push(("extra_topk_norm_views", b.g));

        let mut b = GraphBuilder::new(19);
        let x = b.input("x", DType::F32, "5,4");
        let idx = b.konst("idx", Tensor::from_i64s(&[3, 1], vec![1, -1, 1]));
        let upd = b.input("upd", DType::F32, "3,4");
        let add = b.node("ScatterND", vec![("reduction", Attr::String("add".into()))], &[x, idx, upd], 1)[0];
        let none = b.node("ScatterND", vec![], &[x, idx, upd], 1)[0];
        let eidx = b.konst("eidx", Tensor::from_i64s(&[2, 4], vec![0, 4, 4, 1, -1, 0, 2, 2]));
        let eupd = b.input("eupd", DType::F32, "2,4");
        let emax = b.node(
            "ScatterElements",
            vec![("axis", Attr::Int(0)), ("reduction", Attr::String("max".into()))],
            &[x, eidx, eupd],
            1,
        )[0];
        let pads = b.konst("pads", Tensor::from_i64s(&[4], vec![2, -1, 3, 2]));
        let wrap = b.node("Pad", vec![("mode", Attr::String("wrap".into()))], &[x, pads], 1)[0];
        let edge = b.node("Pad", vec![("mode", Attr::String("edge".into()))], &[x, pads], 1)[0];
        b.g.outputs.extend([add, none, emax, wrap, edge]);
        crate::ir::infer::infer_graph(&mut b.g).unwrap();
        out.push(("extra_scatter_pad", b.g));
        out
    }

    /// Writes a GPU check of every bundled model whose ops these families lower (and of
    /// [`extra_checks`]) into `$O2A_GPU_DIR/<model>/`: kernels, driver, inputs and the reference
    /// executor's outputs. Each folder builds into one executable (`nvcc *.cu`) that prints
    /// PASS/FAIL per output on a GPU. Run by hand: `O2A_GPU_DIR=… cargo test --lib
    /// gpu_check_bundle -- --ignored`.
    #[test]
    #[ignore = "writes GPU check programs; needs O2A_GPU_DIR"]
    fn gpu_check_bundle() {
        let Some(root) = std::env::var_os("O2A_GPU_DIR").map(std::path::PathBuf::from) else { return };
        let mut models: Vec<_> = std::fs::read_dir("onnx_models").unwrap().flatten().map(|e| e.path()).collect();
        models.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
        models.sort();
        for m in models {
            let name = m.file_stem().unwrap().to_string_lossy().to_string();
            match crate::onnx::load_model(&m) {
                Ok(g) => write_check(&root, &name, &g),
                Err(e) => eprintln!("skip {name}: {e}"),
            }
        }
        for (name, g) in extra_checks() {
            write_check(&root, name, &g);
        }
    }

    /// The GPU checks of [`gpu_check_bundle`] built for the CPU (see `emulate_on_cpu`): every
    /// kernel of these families, on every bundled model they cover and the extra graphs, matches
    /// the reference executor. Needs g++ and the CUDA headers of the pinned nvcc wheel
    /// (`scripts/setup-python.sh`).
    #[test]
    #[ignore = "builds every check with g++ (about a minute); needs the CUDA headers in .venv"]
    fn kernels_match_reference_in_cpu_emulation() {
        let include = std::fs::read_dir(".venv/lib")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path().join("site-packages/nvidia/cu13/include"))
            .find(|p| p.join("cuda_fp16.h").is_file())
            .expect("the CUDA headers of the nvcc wheel (run scripts/setup-python.sh)");
        let root = std::env::temp_dir().join(format!("o2a-cpu-emulation-{}", std::process::id()));
        let mut graphs: Vec<(String, crate::ir::Graph)> = Vec::new();
        let mut models: Vec<_> = std::fs::read_dir("onnx_models").unwrap().flatten().map(|e| e.path()).collect();
        models.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
        models.sort();
        for m in models {
            if let Ok(g) = crate::onnx::load_model(&m) {
                graphs.push((m.file_stem().unwrap().to_string_lossy().to_string(), g));
            }
        }
        graphs.extend(extra_checks().into_iter().map(|(n, g)| (n.to_string(), g)));
        let mut report = Vec::new();
        let mut checked = 0;
        for (name, g) in &graphs {
            write_check(&root, name, g);
            let case = root.join(name);
            if !case.join("driver.cu").exists() {
                continue;
            }
            checked += 1;
            match emulate_on_cpu(&case, &include) {
                Ok(out) if out.lines().all(|l| l.starts_with("PASS")) && !out.is_empty() => {}
                Ok(out) => report.push(format!("{name}:\n{out}")),
                Err(e) => report.push(format!("{name}: {e}")),
            }
        }
        let _ = std::fs::remove_dir_all(&root);
        assert!(checked >= 30, "only {checked} checks were written");
        assert!(report.is_empty(), "{}", report.join("\n"));
    }

    /// Every bundled model (and the generated ResNet-50 and BERT when present), optimised as
    /// the compiler optimises it: every node these families handle lowers without error.
    #[test]
    #[ignore = "optimises every bundled model (slow in debug builds)"]
    fn optimised_models_lower() {
        let opts = crate::egraph::OptimizeOptions::standard().unwrap();
        let mut models: Vec<_> = ["onnx_models", "onnx_models/generated"]
            .iter()
            .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
            .collect();
        models.sort();
        let mut failures = Vec::new();
        for m in models {
            let Ok(g) = crate::onnx::load_model(&m) else { continue };
            let Ok((opt, _)) = crate::egraph::optimize(&g, &opts) else { continue };
            let (errors, kernels) = lower_ours(&opt);
            eprintln!("{}: {kernels:?}", m.display());
            failures.extend(errors.into_iter().map(|e| format!("{}: {e}", m.display())));
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn einsum_labels_strides() {
        let (ins, out) = einsum_labels("bij,bjk", &[3, 3]).unwrap();
        assert_eq!(ins, vec![vec![27, 34, 35], vec![27, 35, 36]]);
        assert_eq!(out, vec![34, 36]);
        let (ins, out) = einsum_labels("...ii->...i", &[3]).unwrap();
        assert_eq!(ins, vec![vec![52, 34, 34]]);
        assert_eq!(out, vec![52, 34]);
        let mut b = GraphBuilder::new(12);
        let x = b.input("x", DType::F16, "N,3,4");
        let y = b.input("y", DType::F16, "N,4,5");
        let m = b.node("Einsum", vec![("equation", Attr::String("bij,bjk->bik".into()))], &[x, y], 1)[0];
        let z = b.input("z", DType::F16, "3,3");
        let tr = b.node("Einsum", vec![("equation", Attr::String("ii".into()))], &[z], 1)[0];
        b.g.outputs.extend([m, tr]);
        let p = lowered(&mut b);
        let k = &p.kernels[0].context;
        assert_eq!(k["out_dims"], json!(["(dims.v[0])", "3", "5"]));
        assert_eq!(k["con_dims"], json!(["4"]));
        assert_eq!(k["out_strides"], json!([["12", "4", "0"], ["20", "0", "1"]]));
        assert_eq!(k["con_strides"], json!([["1"], ["5"]]));
        // The trace: a 0-D output, the diagonal stride 4.
        let t = &p.kernels[1].context;
        assert_eq!(t["out_dims"], json!(["1"]));
        assert_eq!(t["con_strides"], json!([["4"]]));
        render_all("einsum", &p);
    }

    #[test]
    fn resize_taps_match_ort() {
        // ORT Resize-13 linear half_pixel, scale 1.75 on 4 → 7: x = (j + 0.5)/1.75 - 0.5.
        let ax = AxisResample { scale: 1.75, out_len: 7, roi: (0.0, 1.0), from_sizes: false };
        let taps = resize_taps(4, ax, InterpMode::Linear, CoordMode::HalfPixel);
        assert_eq!(taps[0], Some(vec![(0, 1.0)]));
        let t1 = taps[1].clone().unwrap();
        assert_eq!(t1.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1]);
        assert!((t1[1].1 - 0.357_142_87).abs() < 1e-6, "{t1:?}");
        // Legacy nearest upsampling truncates: scale 1.5 on 5 → [0,0,1,2,2,3,4].
        let ax = AxisResample { scale: 1.5, out_len: 7, roi: (0.0, 1.0), from_sizes: false };
        let taps = resize_taps(5, ax, InterpMode::Nearest(NearestMode::Legacy), CoordMode::Asymmetric);
        let idx: Vec<usize> = taps.iter().map(|t| t.as_ref().unwrap()[0].0).collect();
        assert_eq!(idx, vec![0, 0, 1, 2, 2, 3, 4]);
        // tf_crop_and_resize outside the window extrapolates.
        let ax = AxisResample { scale: 4.0 / 3.0, out_len: 4, roi: (0.5, 1.5), from_sizes: false };
        let taps = resize_taps(3, ax, InterpMode::Linear, CoordMode::TfCropAndResize);
        assert!(taps[2].is_none() && taps[3].is_none() && taps[0].is_some());
    }

    #[test]
    fn resize_nearest_and_linear_tables() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "N,2,3,4");
        let roi = b.konst("roi", Tensor::from_f32s(&[0], vec![]));
        let scales = b.konst("scales", Tensor::from_f32s(&[4], vec![1.0, 1.0, 2.0, 2.0]));
        let attrs = vec![
            ("mode", Attr::String("nearest".into())),
            ("coordinate_transformation_mode", Attr::String("asymmetric".into())),
            ("nearest_mode", Attr::String("floor".into())),
        ];
        let up = b.node("Resize", attrs, &[x, roi, scales], 1)[0];
        let sizes = b.konst("sizes", Tensor::from_i64s(&[4], vec![1, 2, 7, 5]));
        let y = b.input("y", DType::F16, "1,2,3,4");
        let lin = b.node("Resize", vec![("mode", Attr::String("linear".into()))], &[y, roi, roi, sizes], 1)[0];
        let same = b.konst("same", Tensor::from_f32s(&[4], vec![1.0; 4]));
        let view = b.node("Resize", vec![], &[y, roi, same], 1)[0];
        b.g.outputs.extend([up, lin, view]);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["resize", "resize"]);
        let k = &p.kernels[0].context;
        assert_eq!(k["slots"], json!([-1, -1, 0, 1]));
        assert_eq!(k["taps"], 1);
        assert_eq!(k["nearest"], true);
        assert_eq!(k["table_offsets"], json!([0, 18]));
        assert_eq!(p.kernels[1].context["taps"], 2);
        assert!(is_alias(&p, p.tensors.len() - 1));
        render_all("resize", &p);
    }

    #[test]
    fn conv_transpose_geometry() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F16, "N,4,5,5");
        let w = b.konst("w", Tensor::from_f32s(&[4, 3, 3, 3], vec![0.5; 108]).cast(DType::F16));
        let bias = b.konst("b", Tensor::from_f32s(&[6], vec![0.1; 6]).cast(DType::F16));
        let attrs = vec![
            ("strides", Attr::Ints(vec![2, 2])),
            ("pads", Attr::Ints(vec![1, 1, 1, 1])),
            ("output_padding", Attr::Ints(vec![1, 1])),
            ("group", Attr::Int(2)),
        ];
        let y = b.node("ConvTranspose", attrs, &[x, w, bias], 1)[0];
        let v = b.input("v", DType::F16, "1,2,7");
        let w1 = b.konst("w1", Tensor::from_f32s(&[2, 1, 2], vec![1.0; 4]).cast(DType::F16));
        let same = b.node(
            "ConvTranspose",
            vec![("strides", Attr::Ints(vec![2])), ("auto_pad", Attr::String("SAME_LOWER".into()))],
            &[v, w1],
            1,
        )[0];
        b.g.outputs.extend([y, same]);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["conv_transpose", "conv_transpose"]);
        let k = &p.kernels[0].context;
        assert_eq!(k["out_dims"], json!([1, 10, 10]));
        assert_eq!(k["pads"], json!([0, 1, 1]));
        assert_eq!(k["out_channels"], 6);
        assert_eq!(k["group_in"], 2);
        assert_eq!(k["has_bias"], true);
        // SAME_LOWER, kernel 2 stride 2 on 7: full 14, target 14, no padding.
        assert_eq!(p.kernels[1].context["pads"], json!([0, 0, 0]));
        assert_eq!(p.kernels[1].context["has_bias"], false);
        render_all("conv_transpose", &p);
    }

    #[test]
    fn lrn_trilu_cumsum_mvn() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F16, "N,6,3,3");
        let lrn = b.node(
            "LRN",
            vec![("size", Attr::Int(5)), ("alpha", Attr::Float(1e-3)), ("bias", Attr::Float(2.0))],
            &[x],
            1,
        )[0];
        let k = b.konst("k", Tensor::from_i64s(&[], vec![-1]));
        let tri = b.node("Trilu", vec![("upper", Attr::Int(0))], &[x, k], 1)[0];
        let kr = b.input("kr", DType::I64, "");
        let tri_rt = b.node("Trilu", vec![], &[x, kr], 1)[0];
        let axis = b.konst("axis", Tensor::from_i64s(&[], vec![-1]));
        let cs = b.node("CumSum", vec![("exclusive", Attr::Int(1)), ("reverse", Attr::Int(1))], &[x, axis], 1)[0];
        let xi = b.input("xi", DType::I32, "2,5");
        let csi = b.node("CumSum", vec![], &[xi, axis], 1)[0];
        let mvn = b.node("MeanVarianceNormalization", vec![], &[x], 1)[0];
        let sc = b.konst("sc", Tensor::from_f32s(&[6], vec![1.5; 6]).cast(DType::F16));
        let inorm = b.node("InstanceNormalization", vec![("epsilon", Attr::Float(1e-3))], &[x, sc, sc], 1)[0];
        let sq = b.input("sq", DType::F16, "3,4");
        let eye = b.node("EyeLike", vec![("k", Attr::Int(1)), ("dtype", Attr::Int(7))], &[sq], 1)[0];
        b.g.outputs.extend([lrn, tri, tri_rt, cs, csi, mvn, inorm, eye]);
        let p = lowered(&mut b);
        assert_eq!(
            templates_of(&p),
            vec!["lrn", "trilu", "trilu", "cumsum", "cumsum", "mvn", "instance_norm", "eye_like"]
        );
        assert_eq!(p.kernels[6].context["f32_params"], true);
        assert_eq!(p.kernels[6].context["epsilon"], "0.0010000000474974513");
        assert_eq!(p.kernels[7].context["ctype"], "int64_t");
        assert_eq!(p.kernels[6].context["inner"], "9");
        assert_eq!(p.kernels[6].context["planes"], "((int64_t)6*dims.v[0])");
        assert_eq!(p.kernels[0].context["before"], 2);
        assert_eq!(p.kernels[1].context["k"], -1);
        assert_eq!(p.kernels[2].context["k_arg"], true);
        assert_eq!(p.kernels[3].context["lanes"], "((int64_t)18*dims.v[0])");
        assert_eq!(p.kernels[4].context["acc"], "uint64_t");
        let m = &p.kernels[5].context;
        assert_eq!(m["groups"], "6");
        assert_eq!(m["red_dims"], json!(["(dims.v[0])", "3", "3"]));
        render_all("misc", &p);
    }

    /// fp32 precision: every float kernel of this file reads and writes fp32 (the templates that
    /// spelled out half get `ctype` and the fp32 conversions), weights are fp32.
    #[test]
    fn fp32_kernels() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "N,6,3,3");
        let lrn = b.node("LRN", vec![("size", Attr::Int(3))], &[x], 1)[0];
        let axis = b.konst("axis", Tensor::from_i64s(&[], vec![-1]));
        let cs = b.node("CumSum", vec![], &[x, axis], 1)[0];
        let mvn = b.node("MeanVarianceNormalization", vec![], &[x], 1)[0];
        let sc = b.konst("sc", Tensor::from_f32s(&[6], vec![1.5; 6]));
        let inorm = b.node("InstanceNormalization", vec![], &[x, sc, sc], 1)[0];
        let rs = b.input("rs", DType::F32, "6");
        let inorm_rt = b.node("InstanceNormalization", vec![], &[x, rs, rs], 1)[0];
        let w = b.konst("w", Tensor::from_f32s(&[6, 2, 3, 3], vec![0.5; 108]));
        let ct = b.node("ConvTranspose", vec![("strides", Attr::Ints(vec![2, 2]))], &[x, w], 1)[0];
        let y = b.input("y", DType::F32, "N,3,4");
        let z = b.input("z", DType::F32, "N,4,5");
        let es = b.node("Einsum", vec![("equation", Attr::String("bij,bjk->bik".into()))], &[y, z], 1)[0];
        let roi = b.konst("roi", Tensor::from_f32s(&[0], vec![]));
        let scales = b.konst("scales", Tensor::from_f32s(&[4], vec![1.0, 1.0, 2.0, 2.0]));
        let lin = b.node("Resize", vec![("mode", Attr::String("linear".into()))], &[x, roi, scales], 1)[0];
        b.g.outputs.extend([lrn, cs, mvn, inorm, inorm_rt, ct, es, lin]);
        infer_graph(&mut b.g).unwrap();
        let p = lower_at(&b.g, crate::lower::Precision::Fp32).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            templates_of(&p),
            ["lrn", "cumsum", "mvn", "instance_norm", "instance_norm", "conv_transpose", "einsum", "resize"]
        );
        for k in &p.kernels {
            assert_eq!(k.context.get("ctype"), Some(&json!("float")), "{}", k.name);
        }
        for k in [0, 2, 3, 4, 5] {
            let c = &p.kernels[k].context;
            assert_eq!(
                (c["to_float"].as_str(), c["from_float"].as_str()),
                (Some("o2a_to_float"), Some("o2a_from_float<float>"))
            );
        }
        assert_eq!(
            (p.kernels[3].context["f32_params"].as_bool(), p.kernels[4].context["f32_params"].as_bool()),
            (Some(true), Some(false))
        );
        assert_eq!(p.kernels[1].context["acc"], "float");
        assert_eq!(p.kernels[6].context["acc"], "float");
        assert_eq!(p.tensors[p.kernels[5].args[1]].dtype, DType::F32);
        for text in render_all("misc_fp32", &p) {
            assert!(!text.contains("half"), "{text}");
        }
    }
}
