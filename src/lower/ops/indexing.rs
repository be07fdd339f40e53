//! GPU lowering of the data-movement ops that select, join, pad or scatter elements: Concat,
//! Split, Slice, Gather, GatherElements, GatherND, Pad, Expand, Tile, DepthToSpace,
//! SpaceToDepth, ScatterND, ScatterElements (and its opset-9 name Scatter), OneHot and TopK.
//!
//! Everything an output's shape depends on is known at compile time up to the batch (the
//! lowering rejects data-dependent dims), so the kernels receive shapes and strides as C++
//! expressions in `batch`. Index tensors are data: out-of-range indices cannot be reported from
//! inside a kernel without a host synchronisation, so a gather yields 0 for them and a scatter
//! skips them (the reference executor reports them as errors).
//!
//! Slices, splits, broadcasts and the depth/space rearrangements are all one strided copy
//! (`shape::emit_strided_copy`), which becomes a view when it reads the whole input in order.

use super::shape::{
    emit_strided_copy, exprs, fields, input_dims, input_ints, op_of, output_shape, row_major_strides, scalar_weight,
    StridedAxis,
};
use super::LowerSpec;
use crate::ir::broadcast::{normalize_axes, normalize_axis};
use crate::ir::dim::{fmt_shape, product};
use crate::ir::ops::indexing::PadMode;
use crate::ir::ops::indexing::{Concat, Gather, GatherElements, Pad, Slice, Split, TopK};
use crate::ir::ops::layout::{DepthToSpace, SpaceToDepth};
use crate::ir::ops::scatter::Reduction;
use crate::ir::ops::scatter::{GatherNd, OneHot, ScatterElements, ScatterNd};
use crate::ir::ops::shape::{Expand, Tile};
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult, Storage, TensorId};
use crate::lower_unsupported;
use serde_json::json;

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<Concat>("Concat", lower_concat),
    LowerSpec::of::<Split>("Split", lower_split),
    LowerSpec::of::<Slice>("Slice", lower_slice),
    LowerSpec::of::<Gather>("Gather", lower_gather),
    LowerSpec::of::<GatherElements>("GatherElements", lower_gather_elements),
    LowerSpec::of::<GatherNd>("GatherND", lower_gather_nd),
    LowerSpec::of::<Pad>("Pad", lower_pad),
    LowerSpec::of::<Expand>("Expand", lower_expand),
    LowerSpec::of::<Tile>("Tile", lower_tile),
    LowerSpec::of::<DepthToSpace>("DepthToSpace", lower_depth_to_space),
    LowerSpec::of::<SpaceToDepth>("SpaceToDepth", lower_space_to_depth),
    LowerSpec::of::<ScatterNd>("ScatterND", lower_scatter_nd),
    LowerSpec::of::<ScatterElements>("ScatterElements", lower_scatter_elements),
    LowerSpec::of::<ScatterElements>("Scatter", lower_scatter_elements),
    LowerSpec::of::<OneHot>("OneHot", lower_one_hot),
    LowerSpec::of::<TopK>("TopK", lower_top_k),
];

/// An IR error found while lowering (the op's own checks let it through, so this is a model
/// the reference would also reject, or a bug).
fn invalid(msg: String) -> LowerError {
    LowerError::Invalid(msg)
}

fn ir_err(e: crate::ir::OpError) -> LowerError {
    LowerError::Invalid(e.0)
}

// ---------------------------------------------------------------------------------------------
// Concat / Split

/// Concat along `axis`: each input is a `[outer, len_k · inner]` block copied into the output's
/// rows at column `offset_k · inner`. One launch per non-empty input.
fn lower_concat(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Concat>(node)?;
    let n_in = node.inputs.len();
    let mut xs = Vec::with_capacity(n_in);
    for i in 0..n_in {
        xs.push(cx.input(node, i)?);
    }
    if let [x] = xs[..] {
        // Concatenating one tensor is the tensor.
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    let out = cx.output(node, 0)?;
    let out_shape = cx.shape(out).to_vec();
    let axis = normalize_axis(op.axis, out_shape.len()).map_err(ir_err)?;
    let outer = product(&out_shape[..axis]);
    let inner = product(&out_shape[axis + 1..]);
    let dst_pitch = out_shape[axis].mul(&inner);
    let mut copies = Vec::new();
    let mut offset = Dim::known(0);
    let mut args = Vec::with_capacity(n_in + 1);
    for (k, &x) in xs.iter().enumerate() {
        let len = cx.shape(x).get(axis).cloned().ok_or_else(|| invalid(format!("input {k} has a lower rank")))?;
        let row = len.mul(&inner);
        if row.as_known() != Some(0) {
            copies.push(json!({
                "arg": args.len(),
                "row": cx.expr(&row)?,
                "dst_offset": cx.expr(&offset.mul(&inner))?,
            }));
            args.push(x);
        }
        offset = offset.add(&len);
    }
    let out_arg = args.len();
    args.push(out);
    let c = fields(json!({
        "ctype": ctype(cx.dtype(out)),
        "rows": cx.expr(&outer)?,
        "dst_pitch": cx.expr(&dst_pitch)?,
        "out_arg": out_arg,
        "copies": copies,
    }));
    cx.emit(&node.name, "concat", args, vec![out_arg], c, 0)
}

/// Split along `axis`: output k is the `[outer, len_k · inner]` block of the input's rows at
/// column `offset_k · inner`, with the chunk sizes the outputs' shapes carry. A single output
/// covering the whole input is a view.
fn lower_split(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Split>(node)?;
    let x = cx.input(node, 0)?;
    let in_shape = cx.shape(x).to_vec();
    let axis = normalize_axis(op.axis, in_shape.len()).map_err(ir_err)?;
    if node.outputs.len() == 1 {
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    let outer = product(&in_shape[..axis]);
    let inner = product(&in_shape[axis + 1..]);
    let src_pitch = in_shape[axis].mul(&inner);
    let mut args = vec![x];
    let mut writes = Vec::new();
    let mut copies = Vec::new();
    let mut offset = Dim::known(0);
    for k in 0..node.outputs.len() {
        let o = cx.output(node, k)?;
        let len = cx.shape(o)[axis].clone();
        let row = len.mul(&inner);
        if row.as_known() != Some(0) {
            copies.push(json!({
                "arg": args.len(),
                "row": cx.expr(&row)?,
                "src_offset": cx.expr(&offset.mul(&inner))?,
            }));
        }
        writes.push(args.len());
        args.push(o);
        offset = offset.add(&len);
    }
    let c = fields(json!({
        "ctype": ctype(cx.dtype(x)),
        "rows": cx.expr(&outer)?,
        "src_pitch": cx.expr(&src_pitch)?,
        "copies": copies,
    }));
    cx.emit(&node.name, "split", args, writes, c, 0)
}

// ---------------------------------------------------------------------------------------------
// Slice

/// Bounds at or beyond this magnitude mean "to the end" (as in the IR op).
const OPEN_BOUND: i64 = i32::MAX as i64;

/// The first index a slice takes on an axis of size `d`, with ONNX's clamping (the IR op's
/// `slice_known` for known sizes and `slice_len` for symbolic ones; the output length comes
/// from the inferred type).
fn slice_first(d: &Dim, start: &Dim, step: i64) -> LowerResult<Dim> {
    let Some(s) = start.as_known() else {
        // A symbolic start (from a shape subgraph) lies within the axis by the model's contract.
        return Ok(start.clone());
    };
    if let Some(dk) = d.as_known() {
        if dk == 0 {
            return Ok(Dim::known(0));
        }
        let wrapped = if s < 0 { s.saturating_add(dk) } else { s };
        let first = if step > 0 { wrapped.clamp(0, dk) } else { wrapped.clamp(0, dk - 1) };
        return Ok(Dim::known(first));
    }
    Ok(if s >= OPEN_BOUND {
        if step > 0 {
            d.clone()
        } else {
            d.sub(&Dim::known(1))
        }
    } else if s <= -OPEN_BOUND {
        Dim::known(0)
    } else if s < 0 {
        d.add(&Dim::known(s))
    } else {
        Dim::known(s)
    })
}

/// Slice (opset 1-9 attributes or opset 10+ inputs): starts may be symbolic, axes and steps
/// must be constants; negative steps walk backwards. One strided copy (a view when the slice
/// keeps everything).
fn lower_slice(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Slice>(node)?;
    let x = cx.input(node, 0)?;
    let in_shape = cx.shape(x).to_vec();
    let rank = in_shape.len();
    let (starts, axes, steps): (Vec<Dim>, Option<Vec<i64>>, Option<Vec<i64>>) = match &op.attrs {
        Some(a) => (a.starts.iter().map(|&v| Dim::known(v)).collect(), a.axes.clone(), None),
        None => {
            let Some(starts) = input_dims(cx, node, 1) else {
                lower_unsupported!("Slice with 'starts' known only at run time")
            };
            let axes = match node.inputs.get(3).copied().flatten() {
                None => None,
                Some(_) => match input_ints(cx, node, 3) {
                    Some(a) => Some(a),
                    None => lower_unsupported!("Slice with 'axes' known only at run time"),
                },
            };
            let steps = match node.inputs.get(4).copied().flatten() {
                None => None,
                Some(_) => match input_ints(cx, node, 4) {
                    Some(s) => Some(s),
                    None => lower_unsupported!("Slice with 'steps' known only at run time"),
                },
            };
            (starts, axes, steps)
        }
    };
    let axes = match axes {
        Some(a) => normalize_axes(&a, rank).map_err(ir_err)?,
        None => (0..starts.len()).collect(),
    };
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if axes.len() != starts.len() || steps.len() != starts.len() || steps.contains(&0) {
        return Err(invalid(format!("inconsistent slice parameters: axes {axes:?}, steps {steps:?}")));
    }
    let out_shape = output_shape(cx, node, 0)?;
    let strides = row_major_strides(&in_shape);
    let mut base = Dim::known(0);
    let mut out_axes: Vec<StridedAxis> =
        (0..rank).map(|a| StridedAxis { len: out_shape[a].clone(), stride: strides[a].clone() }).collect();
    for (k, &a) in axes.iter().enumerate() {
        let first = slice_first(&in_shape[a], &starts[k], steps[k])?;
        check_within_axis(cx, &in_shape[a], &first, &out_shape[a], steps[k], a)?;
        base = base.add(&first.mul(&strides[a]));
        out_axes[a].stride = strides[a].mul(&Dim::known(steps[k]));
    }
    if is_weight_prefix(cx, x, &in_shape, &out_shape, &base, &out_axes, &strides) {
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    emit_strided_copy(cx, node, x, 0, base, out_axes)
}

/// A slice whose length is a run-time dim (`table[:seq]`) must stay inside its axis at every
/// value of the ranges: ONNX would clamp the end there and give fewer elements than the shape the
/// graph was typed with, and the copy would read past the end. So a range that lets it (BERT's
/// positions with `--dim seq=1..N` beyond the model's position table) is refused here, naming the
/// largest value the model supports, instead of compiling a kernel that reads out of bounds.
fn check_within_axis(cx: &LowerCtx, d: &Dim, first: &Dim, len: &Dim, step: i64, axis: usize) -> LowerResult<()> {
    let (Some(size), false) = (d.as_known(), len.is_known()) else { return Ok(()) };
    if step <= 0 {
        return Ok(());
    }
    // The last element read: first + (len - 1) * step, at the ranges' largest values.
    let last = first.add(&len.sub(&Dim::known(1)).mul(&Dim::known(step)));
    let Ok(most) = cx.upper_bound(&last) else { return Ok(()) };
    if most < size {
        return Ok(());
    }
    let ranges = cx.run_dims_text();
    Err(invalid(format!(
        "axis {axis} has {size} elements, but this slice takes {len} of them (step {step}), which the run-time \
         dims' ranges ({ranges}) let reach element {most}: the model supports fewer; lower the range's largest value"
    )))
}

/// Whether a slice is the first rows of a weight (its leading axis cut, every other axis
/// whole, step 1): those rows are a row-major tensor at the weight's own address, so the
/// output is a view and no kernel copies them. BERT's position embeddings with a run-time
/// sequence length are `table[:seq]` (see `ir::index_views`). Only for weights: they are never
/// written, so the view cannot see a later write; and only when the rows can never run past
/// the table at any value of the run-time dims (else the copy stays, as before).
fn is_weight_prefix(
    cx: &LowerCtx,
    x: TensorId,
    in_shape: &[Dim],
    out_shape: &[Dim],
    base: &Dim,
    out_axes: &[StridedAxis],
    strides: &[Dim],
) -> bool {
    let weight = matches!(cx.tensor(cx.base_of(x)).storage, Storage::Weight { .. });
    if !weight || *base != Dim::known(0) || in_shape.is_empty() || out_shape.len() != in_shape.len() {
        return false;
    }
    let same_rows = out_axes.iter().zip(strides).all(|(a, s)| a.stride == *s);
    let whole_rows = out_shape[1..] == in_shape[1..];
    let fits = match (in_shape[0].as_known(), cx.upper_bound(&out_shape[0])) {
        (Some(rows), Ok(most)) => most <= rows,
        _ => false,
    };
    same_rows && whole_rows && fits
}

// ---------------------------------------------------------------------------------------------
// Expand / Tile / DepthToSpace / SpaceToDepth

/// Expand: a broadcast read (stride 0 where the input dim is 1 or absent).
fn lower_expand(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    let in_shape = cx.shape(x).to_vec();
    let out_shape = output_shape(cx, node, 0)?;
    if out_shape.len() < in_shape.len() {
        return Err(invalid(format!("Expand output {} has a lower rank than the input", fmt_shape(&out_shape))));
    }
    let lead = out_shape.len() - in_shape.len();
    let strides = row_major_strides(&in_shape);
    let one = Dim::known(1);
    let mut axes = Vec::with_capacity(out_shape.len());
    for (a, od) in out_shape.iter().enumerate() {
        let stride = if a < lead {
            Dim::known(0)
        } else {
            let id = &in_shape[a - lead];
            if id == od {
                strides[a - lead].clone()
            } else if *id == one {
                Dim::known(0)
            } else {
                return Err(invalid(format!(
                    "input {} does not broadcast to {}",
                    fmt_shape(&in_shape),
                    fmt_shape(&out_shape)
                )));
            }
        };
        axes.push(StridedAxis { len: od.clone(), stride });
    }
    emit_strided_copy(cx, node, x, 0, Dim::known(0), axes)
}

/// Tile: `out[c] = in[c mod in_dims]` per axis.
fn lower_tile(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    let in_shape = cx.shape(x).to_vec();
    let out = cx.output(node, 0)?;
    let out_shape = cx.shape(out).to_vec();
    if out_shape.len() != in_shape.len() || in_shape.is_empty() {
        return Err(invalid(format!("Tile of {} into {}", fmt_shape(&in_shape), fmt_shape(&out_shape))));
    }
    let c = fields(json!({
        "ctype": ctype(cx.dtype(x)),
        "n": cx.numel_expr(&out_shape)?,
        "rank": in_shape.len(),
        "out_dims": exprs(cx, &out_shape)?,
        "in_dims": exprs(cx, &in_shape)?,
        "in_strides": exprs(cx, &row_major_strides(&in_shape))?,
    }));
    cx.emit(&node.name, "tile", vec![x, out], vec![1], c, 0)
}

/// The depth/space ops as the ONNX definitions write them: reshape the input to rank 6
/// (`split`), transpose by `perm`, reshape to the output. The transpose is a strided read.
fn emit_rank6_transpose(
    cx: &mut LowerCtx,
    node: &Node,
    x: TensorId,
    split: [Dim; 6],
    perm: [usize; 6],
) -> LowerResult<()> {
    let strides = row_major_strides(&split);
    let axes = perm.iter().map(|&p| StridedAxis { len: split[p].clone(), stride: strides[p].clone() }).collect();
    emit_strided_copy(cx, node, x, 0, Dim::known(0), axes)
}

fn nchw(cx: &LowerCtx, x: TensorId, op: &str) -> LowerResult<[Dim; 4]> {
    match cx.shape(x) {
        [n, c, h, w] => Ok([n.clone(), c.clone(), h.clone(), w.clone()]),
        s => Err(invalid(format!("{op} needs an [N, C, H, W] input, found {}", fmt_shape(s)))),
    }
}

/// DepthToSpace: DCR reshapes to `[n, b, b, c/b², h, w]` and permutes `[0,3,4,1,5,2]`; CRD
/// reshapes to `[n, c/b², b, b, h, w]` and permutes `[0,1,4,2,5,3]` (the reference's order).
fn lower_depth_to_space(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<DepthToSpace>(node)?;
    let x = cx.input(node, 0)?;
    let [n, c, h, w] = nchw(cx, x, "DepthToSpace")?;
    let b = Dim::from(op.blocksize);
    let cb = c.div_floor(&b.mul(&b));
    if op.crd {
        emit_rank6_transpose(cx, node, x, [n, cb, b.clone(), b, h, w], [0, 1, 4, 2, 5, 3])
    } else {
        emit_rank6_transpose(cx, node, x, [n, b.clone(), b, cb, h, w], [0, 3, 4, 1, 5, 2])
    }
}

/// SpaceToDepth: reshape to `[n, c, h/b, b, w/b, b]`, permute `[0,3,5,1,2,4]` (DCR) or
/// `[0,1,3,5,2,4]` (CRD).
fn lower_space_to_depth(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<SpaceToDepth>(node)?;
    let x = cx.input(node, 0)?;
    let [n, c, h, w] = nchw(cx, x, "SpaceToDepth")?;
    let b = Dim::from(op.blocksize);
    let split = [n, c, h.div_floor(&b), b.clone(), w.div_floor(&b), b];
    let perm = if op.crd { [0, 1, 3, 5, 2, 4] } else { [0, 3, 5, 1, 2, 4] };
    emit_rank6_transpose(cx, node, x, split, perm)
}

// ---------------------------------------------------------------------------------------------
// Gather family

/// Gather along `axis`: the output is `[outer, n_indices, inner]` over the data's
/// `[outer, axis_len, inner]`; indices (int32/int64, constant or run-time) wrap when negative.
fn lower_gather(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Gather>(node)?;
    let data = cx.input(node, 0)?;
    let idx = cx.input(node, 1)?;
    let out = cx.output(node, 0)?;
    let ds = cx.shape(data).to_vec();
    let axis = normalize_axis(op.axis, ds.len()).map_err(ir_err)?;
    let n_idx = product(cx.shape(idx));
    let c = fields(json!({
        "ctype": ctype(cx.dtype(data)),
        "index_ctype": ctype(cx.dtype(idx)),
        "n": cx.numel_expr(cx.shape(out))?,
        "axis_len": cx.expr(&ds[axis])?,
        "n_indices": cx.expr(&n_idx)?,
        "inner": cx.expr(&product(&ds[axis + 1..]))?,
    }));
    cx.emit(&node.name, "gather", vec![data, idx, out], vec![2], c, 0)
}

/// GatherElements: `out[i] = data[i with the axis coordinate replaced by indices[i]]`.
fn lower_gather_elements(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<GatherElements>(node)?;
    let data = cx.input(node, 0)?;
    let idx = cx.input(node, 1)?;
    let out = cx.output(node, 0)?;
    let ds = cx.shape(data).to_vec();
    let is = cx.shape(idx).to_vec();
    let axis = normalize_axis(op.axis, ds.len()).map_err(ir_err)?;
    let c = fields(json!({
        "ctype": ctype(cx.dtype(data)),
        "index_ctype": ctype(cx.dtype(idx)),
        "n": cx.numel_expr(&is)?,
        "rank": is.len(),
        "axis": axis,
        "axis_len": cx.expr(&ds[axis])?,
        "idx_dims": exprs(cx, &is)?,
        "data_strides": exprs(cx, &row_major_strides(&ds))?,
    }));
    cx.emit(&node.name, "gather_elements", vec![data, idx, out], vec![2], c, 0)
}

/// GatherND with `batch_dims`: every index tuple of length `m` picks a slice of
/// `data.shape[batch_dims + m..]` within its batch.
fn lower_gather_nd(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<GatherNd>(node)?;
    let data = cx.input(node, 0)?;
    let idx = cx.input(node, 1)?;
    let out = cx.output(node, 0)?;
    let ds = cx.shape(data).to_vec();
    let is = cx.shape(idx).to_vec();
    let b = op.batch_dims;
    let q = is.len();
    let Some(m) = is.last().and_then(Dim::as_known).map(|m| m as usize) else {
        return Err(invalid(format!("indices {} need a known last dim", fmt_shape(&is))));
    };
    if q == 0 || m == 0 || b + m > ds.len() || b >= q {
        return Err(invalid(format!("GatherND of {} by {} with batch_dims {b}", fmt_shape(&ds), fmt_shape(&is))));
    }
    let strides = row_major_strides(&ds);
    let c = fields(json!({
        "ctype": ctype(cx.dtype(data)),
        "n": cx.numel_expr(cx.shape(out))?,
        "m": m,
        "slice": cx.expr(&product(&ds[b + m..]))?,
        "tuples_per_batch": cx.expr(&product(&is[b..q - 1]))?,
        "batch_stride": cx.expr(&product(&ds[b..]))?,
        "tuple_dims": exprs(cx, &ds[b..b + m])?,
        "tuple_strides": exprs(cx, &strides[b..b + m])?,
    }));
    cx.emit(&node.name, "gather_nd", vec![data, idx, out], vec![2], c, 0)
}

// ---------------------------------------------------------------------------------------------
// Pad

/// Pad in constant, reflect, edge or wrap mode; negative pads crop first, then the border is
/// filled from the cropped input (the reference's order). Pads and axes must be constants.
fn lower_pad(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Pad>(node)?;
    let x = cx.input(node, 0)?;
    let in_shape = cx.shape(x).to_vec();
    let rank = in_shape.len();
    let dtype = cx.dtype(x);
    let (pads, axes, value) = match &op.attrs {
        Some((p, v)) => {
            (p.clone(), None, Some(scalar_weight(cx, &format!("{}.value", node.name), dtype, f64::from(*v))?))
        }
        None => {
            let Some(p) = input_ints(cx, node, 1) else { lower_unsupported!("Pad with 'pads' known only at run time") };
            let axes = match node.inputs.get(3).copied().flatten() {
                None => None,
                Some(_) => match input_ints(cx, node, 3) {
                    Some(a) => Some(a),
                    None => lower_unsupported!("Pad with 'axes' known only at run time"),
                },
            };
            // An absent or empty constant_value means 0.
            let value = match node.inputs.get(2).copied().flatten() {
                Some(v) if cx.graph.ty(v).shape.iter().all(|d| d.as_known() != Some(0)) => Some(cx.input(node, 2)?),
                _ => None,
            };
            (p, axes, value)
        }
    };
    let axes = match axes {
        Some(a) => normalize_axes(&a, rank).map_err(ir_err)?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(invalid(format!("'pads' {pads:?} does not give begin and end for {} axes", axes.len())));
    }
    let mut per_axis = vec![(0i64, 0i64); rank];
    for (k, &a) in axes.iter().enumerate() {
        per_axis[a] = (pads[k], pads[k + axes.len()]);
    }
    let out = cx.output(node, 0)?;
    let out_shape = cx.shape(out).to_vec();
    let strides = row_major_strides(&in_shape);
    let (mut begins, mut crops, mut lens) = (Vec::new(), Vec::new(), Vec::new());
    for (a, &(b, e)) in per_axis.iter().enumerate() {
        let lo = b.saturating_neg().max(0);
        let cropped = in_shape[a].sub(&Dim::known(lo)).sub(&Dim::known(e.saturating_neg().max(0)));
        if let Some(n) = cropped.as_known() {
            if n < 0 {
                return Err(invalid(format!(
                    "pads ({b}, {e}) crop more than axis {a} of {} holds",
                    fmt_shape(&in_shape)
                )));
            }
            if op.mode != PadMode::Constant && (b > 0 || e > 0) {
                if n == 0 {
                    return Err(invalid(format!("cannot pad the empty axis {a} in {:?} mode", op.mode)));
                }
                if op.mode == PadMode::Reflect && b.max(e) > n - 1 {
                    return Err(invalid(format!(
                        "reflect padding ({b}, {e}) of axis {a} needs at most {} elements per side",
                        n - 1
                    )));
                }
            }
        } else if op.mode != PadMode::Constant && (b > 0 || e > 0) {
            lower_unsupported!("{:?} padding of the batch-sized axis {a}", op.mode);
        }
        begins.push(Dim::known(b.max(0)));
        crops.push(Dim::known(lo));
        lens.push(cropped);
    }
    let value = match value {
        Some(v) => v,
        None => scalar_weight(cx, &format!("{}.value", node.name), dtype, 0.0)?,
    };
    let mode = match op.mode {
        PadMode::Constant => 0,
        PadMode::Reflect => 1,
        PadMode::Edge => 2,
        PadMode::Wrap => 3,
    };
    let c = fields(json!({
        "ctype": ctype(dtype),
        "n": cx.numel_expr(&out_shape)?,
        "rank": rank.max(1),
        "mode": mode,
        "out_dims": exprs(cx, &nonempty(&out_shape))?,
        "in_strides": exprs(cx, &nonempty(&strides))?,
        "begins": exprs(cx, &nonempty_zero(&begins))?,
        "crops": exprs(cx, &nonempty_zero(&crops))?,
        "lens": exprs(cx, &nonempty(&lens))?,
    }));
    cx.emit(&node.name, "pad", vec![x, value, out], vec![2], c, 0)
}

/// A 0-D shape as the rank-1 shape `[1]`, so kernels always have an axis.
fn nonempty(d: &[Dim]) -> Vec<Dim> {
    if d.is_empty() {
        vec![Dim::known(1)]
    } else {
        d.to_vec()
    }
}

fn nonempty_zero(d: &[Dim]) -> Vec<Dim> {
    if d.is_empty() {
        vec![Dim::known(0)]
    } else {
        d.to_vec()
    }
}

// ---------------------------------------------------------------------------------------------
// Scatter family

/// The device expression combining the current value `a` with an update `u` (C++ names),
/// with the reference's semantics: floats in f32 (rounded once per update), integers wrapping.
fn combine_expr(reduction: Reduction, dtype: DType) -> LowerResult<String> {
    let t = ctype(dtype);
    if dtype == DType::Bool {
        return match reduction {
            Reduction::None => Ok("u".into()),
            r => Err(invalid(format!("reduction '{}' is not defined for bool tensors", r.name()))),
        };
    }
    let float = dtype.is_float();
    let wrap = |op: &str| format!("({t})(uint64_t)((uint64_t)(int64_t)a {op} (uint64_t)(int64_t)u)");
    Ok(match (reduction, float) {
        (Reduction::None, _) => "u".into(),
        (Reduction::Add, true) => format!("({t})((float)a + (float)u)"),
        (Reduction::Mul, true) => format!("({t})((float)a * (float)u)"),
        (Reduction::Max, true) => format!("({t})fmaxf((float)a, (float)u)"),
        (Reduction::Min, true) => format!("({t})fminf((float)a, (float)u)"),
        (Reduction::Add, false) => wrap("+"),
        (Reduction::Mul, false) => wrap("*"),
        (Reduction::Max, false) => "(a < u ? u : a)".into(),
        (Reduction::Min, false) => "(u < a ? u : a)".into(),
    })
}

/// ScatterND: the output is a copy of `data` where each index tuple's slice is combined with
/// its updates in index order. Parallel over the slice elements, each thread applies every
/// tuple in order, so duplicates resolve exactly as in the reference (last write wins).
fn lower_scatter_nd(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<ScatterNd>(node)?;
    let data = cx.input(node, 0)?;
    let idx = cx.input(node, 1)?;
    let upd = cx.input(node, 2)?;
    let out = cx.output(node, 0)?;
    let ds = cx.shape(data).to_vec();
    let is = cx.shape(idx).to_vec();
    let Some(m) = is.last().and_then(Dim::as_known).map(|m| m as usize) else {
        return Err(invalid(format!("indices {} need a known last dim", fmt_shape(&is))));
    };
    if m == 0 || m > ds.len() {
        return Err(invalid(format!("ScatterND of {} by {}", fmt_shape(&ds), fmt_shape(&is))));
    }
    let strides = row_major_strides(&ds);
    let dtype = cx.dtype(data);
    let c = fields(json!({
        "ctype": ctype(dtype),
        "n": cx.numel_expr(&ds)?,
        "m": m,
        "tuples": cx.expr(&product(&is[..is.len() - 1]))?,
        "slice": cx.expr(&product(&ds[m..]))?,
        "tuple_dims": exprs(cx, &ds[..m])?,
        "tuple_strides": exprs(cx, &strides[..m])?,
        "combine": combine_expr(op.reduction, dtype)?,
    }));
    cx.emit(&node.name, "scatter_nd", vec![data, idx, upd, out], vec![3], c, 0)
}

/// ScatterElements / Scatter: a copy of `data`, then along each lane of `indices` (every
/// coordinate but the axis fixed) the updates are combined in order; lanes run in parallel.
fn lower_scatter_elements(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<ScatterElements>(node)?;
    let data = cx.input(node, 0)?;
    let idx = cx.input(node, 1)?;
    let upd = cx.input(node, 2)?;
    let out = cx.output(node, 0)?;
    let ds = cx.shape(data).to_vec();
    let is = cx.shape(idx).to_vec();
    let axis = normalize_axis(op.axis, ds.len()).map_err(ir_err)?;
    let dtype = cx.dtype(data);
    // Lanes: the indices' shape with the axis taken out (kept as a unit dim).
    let mut lane_dims = is.clone();
    lane_dims[axis] = Dim::known(1);
    let c = fields(json!({
        "ctype": ctype(dtype),
        "index_ctype": ctype(cx.dtype(idx)),
        "n": cx.numel_expr(&ds)?,
        "lanes": cx.expr(&product(&lane_dims))?,
        "rank": is.len(),
        "axis": axis,
        "axis_len": cx.expr(&ds[axis])?,
        "lane_len": cx.expr(&is[axis])?,
        "idx_dims": exprs(cx, &is)?,
        "idx_strides": exprs(cx, &row_major_strides(&is))?,
        "data_strides": exprs(cx, &row_major_strides(&ds))?,
        "combine": combine_expr(op.reduction, dtype)?,
    }));
    cx.emit(&node.name, "scatter_elements", vec![data, idx, upd, out], vec![3], c, 0)
}

// ---------------------------------------------------------------------------------------------
// OneHot

/// OneHot: `depth` (the output's dim at `axis`, known up to the batch) is inserted into the
/// indices' shape; the cell matching the index (negative ones wrap) is `values[1]`, every other
/// `values[0]`. Indices outside `[-depth, depth)` give an all-off line.
fn lower_one_hot(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<OneHot>(node)?;
    let idx = cx.input(node, 0)?;
    let values = cx.input(node, 2)?;
    let out = cx.output(node, 0)?;
    let is = cx.shape(idx).to_vec();
    let axis = normalize_axis(op.axis, is.len() + 1).map_err(ir_err)?;
    let depth = cx.shape(out)[axis].clone();
    // Float indices truncate toward zero like the reference's integer conversion.
    let index_to_i64 = if cx.dtype(idx).is_float() { "(int64_t)(float)" } else { "(int64_t)" };
    let c = fields(json!({
        "ctype": ctype(cx.dtype(values)),
        "index_ctype": ctype(cx.dtype(idx)),
        "index_to_i64": index_to_i64,
        "n": cx.numel_expr(cx.shape(out))?,
        "depth": cx.expr(&depth)?,
        "inner": cx.expr(&product(&is[axis..]))?,
    }));
    cx.emit(&node.name, "one_hot", vec![idx, values, out], vec![2], c, 0)
}

// ---------------------------------------------------------------------------------------------
// TopK

/// TopK: the `k` largest (or smallest) elements of every lane along `axis`, sorted, ties by
/// lower index, NaN above every number (the reference's order), with their int64 indices. `k`
/// is the output's dim on the axis. Each element computes its rank in its lane's order and, if
/// it is among the first `k`, writes itself to that slot: exact and deterministic, with work
/// quadratic in the lane length (TopK lanes are class scores or candidate lists).
fn lower_top_k(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<TopK>(node)?;
    let x = cx.input(node, 0)?;
    let s = cx.shape(x).to_vec();
    let axis = normalize_axis(op.axis, s.len()).map_err(ir_err)?;
    let values = cx.output(node, 0)?;
    let indices = cx.output(node, 1)?;
    let k = cx.shape(values)[axis].clone();
    let dtype = cx.dtype(x);
    let c = fields(json!({
        "ctype": ctype(dtype),
        "float": dtype.is_float(),
        "largest": op.largest,
        "n": cx.numel_expr(&s)?,
        "axis_len": cx.expr(&s[axis])?,
        "inner": cx.expr(&product(&s[axis + 1..]))?,
        "k": cx.expr(&k)?,
    }));
    cx.emit(&node.name, "top_k", vec![x, values, indices], vec![1, 2], c, 0)
}

#[cfg(test)]
mod tests {
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{Attr, DType, Tensor};
    use crate::lower::ops::shape::testing::*;
    use serde_json::json;

    fn lowered(b: &mut GraphBuilder) -> crate::lower::Program {
        infer_graph(&mut b.g).unwrap();
        lower(&b.g).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn concat_and_split_copy_row_blocks() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "N,2,4");
        let y = b.input("y", DType::F16, "N,3,4");
        let c = b.node("Concat", vec![("axis", Attr::Int(1))], &[x, y], 1)[0];
        let sizes = b.konst("sizes", ints(&[1, 4]));
        let parts = b.node("Split", vec![("axis", Attr::Int(1))], &[c, sizes], 2);
        b.g.outputs.extend(parts);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["concat", "split"]);
        let k = &p.kernels[0].context;
        assert_eq!(k["rows"], "(dims.v[0])");
        assert_eq!(k["dst_pitch"], "20");
        assert_eq!(
            k["copies"],
            json!([{"arg": 0, "row": "8", "dst_offset": "0"}, {"arg": 1, "row": "12", "dst_offset": "8"}])
        );
        let s = &p.kernels[1].context;
        assert_eq!(
            s["copies"],
            json!([{"arg": 1, "row": "4", "src_offset": "0"}, {"arg": 2, "row": "16", "src_offset": "4"}])
        );
        render_all("concat_split", &p);
    }

    #[test]
    fn slice_strides_and_views() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "N,6,5");
        // x[:, ::-2, 1:]: starts [-1, 1] ends [INT64_MIN, MAX] axes [1, 2] steps [-2, 1]
        let st = b.konst("st", ints(&[-1, 1]));
        let en = b.konst("en", ints(&[i64::MIN, i64::MAX]));
        let ax = b.konst("ax", ints(&[1, 2]));
        let sp = b.konst("sp", ints(&[-2, 1]));
        let s = b.node("Slice", vec![], &[x, st, en, ax, sp], 1)[0];
        // A slice keeping everything is a view.
        let z = b.konst("z", ints(&[0]));
        let big = b.konst("big", ints(&[i64::MAX]));
        let all = b.node("Slice", vec![], &[s, z, big], 1)[0];
        b.g.outputs.push(all);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["strided_copy"]);
        let k = &p.kernels[0].context;
        assert_eq!(crate::ir::dim::fmt_shape(&p.tensors[p.kernels[0].args[1]].shape), "[N,3,4]");
        assert_eq!(k["dims"], json!(["(dims.v[0])", "3", "4"]));
        assert_eq!(k["strides"], json!(["30", "-10", "1"]));
        assert_eq!(k["base"], "26");
        assert!(is_alias(&p, p.tensors.len() - 1));
        render_all("slice", &p);
    }

    /// `table[:N]` of a constant table, N the run-time batch (at most 8 here): the rows are the
    /// weight's own bytes, so the slice is a view; a prefix that cuts the rows' inner axis keeps
    /// the copy; and a table with fewer rows than N can reach is refused (ONNX would clamp the
    /// slice, so the output would not have its typed N rows, and the copy would read past it).
    #[test]
    fn a_prefix_of_a_weight_is_a_view_when_it_fits_the_table() {
        for (rows, cols, inner, view) in [(8usize, 3usize, 3i64, true), (6, 3, 3, false), (8, 3, 2, false)] {
            // Opset 15: Shape's start/end.
            let mut b = GraphBuilder::new(15);
            let x = b.input("x", DType::F16, "N,4");
            let table = b.konst("table", Tensor::from_f32s(&[rows, cols], vec![0.5; rows * cols]));
            let n = b.node("Shape", vec![("start", Attr::Int(0)), ("end", Attr::Int(1))], &[x], 1)[0];
            let z = b.konst("z", ints(&[0, 0]));
            let inner_end = b.konst("inner", ints(&[inner]));
            let ends = b.node("Concat", vec![("axis", Attr::Int(0))], &[n, inner_end], 1)[0];
            let s = b.node("Slice", vec![], &[table, z, ends], 1)[0];
            b.g.outputs.push(s);
            infer_graph(&mut b.g).unwrap();
            if rows < 8 {
                let err =
                    lower_with_outputs(&b.g).err().expect("a table shorter than N's range is refused").to_string();
                assert!(err.contains("has 6 elements") && err.contains("N 1..8"), "{err}");
                continue;
            }
            let (p, outs) = lower_with_outputs(&b.g).unwrap_or_else(|e| panic!("{e}"));
            let what = format!("table [{rows}, {cols}], inner {inner}");
            // (The shape kernels computing `ends` are removed later, by `lower::dead`: the slice
            // takes its extent from its type.)
            let copies = templates_of(&p).iter().filter(|t| **t == "strided_copy").count();
            assert_eq!(copies, usize::from(!view), "{what}: {:?}", templates_of(&p));
            assert_eq!(is_alias(&p, outs[0]), view, "{what}");
            if view {
                assert!(matches!(p.tensors[p.base(outs[0])].storage, crate::lower::Storage::Weight { .. }), "{what}");
            }
        }
    }

    #[test]
    fn expand_tile_depth_to_space() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "3,1");
        let shape = b.konst("shape", ints(&[2, 1, 4]));
        let e = b.node("Expand", vec![], &[x, shape], 1)[0];
        let reps = b.konst("reps", ints(&[2, 3]));
        let t = b.node("Tile", vec![], &[x, reps], 1)[0];
        let y = b.input("y", DType::I64, "N,8,2,3");
        let d =
            b.node("DepthToSpace", vec![("blocksize", Attr::Int(2)), ("mode", Attr::String("CRD".into()))], &[y], 1)[0];
        let s = b.node("SpaceToDepth", vec![("blocksize", Attr::Int(2))], &[d], 1)[0];
        b.g.outputs.extend([e, t, s]);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["strided_copy", "tile", "strided_copy", "strided_copy"]);
        assert_eq!(p.kernels[0].context["strides"], json!(["0", "1", "0"]));
        assert_eq!(p.kernels[1].context["in_dims"], json!(["3", "1"]));
        // CRD: [n, 2, 2, 2, 2, 3] read as [0,1,4,2,5,3].
        assert_eq!(p.kernels[2].context["dims"], json!(["((int64_t)2*dims.v[0])", "2", "2", "3", "2"]));
        assert_eq!(p.kernels[2].context["ctype"], "int64_t");
        render_all("expand_tile_d2s", &p);
    }

    #[test]
    fn gathers_and_pad() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "N,5,4");
        let i = b.konst("i", Tensor::from_i64s(&[2, 2], vec![0, -1, 2, 3]));
        let g = b.node("Gather", vec![("axis", Attr::Int(1))], &[x, i], 1)[0];
        let ge_idx = b.input("gi", DType::I32, "N,2,4");
        let ge = b.node("GatherElements", vec![("axis", Attr::Int(1))], &[x, ge_idx], 1)[0];
        let pads = b.konst("pads", ints(&[0, 1, -1, 0, 2, 1]));
        let pd = b.node("Pad", vec![("mode", Attr::String("reflect".into()))], &[x, pads], 1)[0];
        let nd_idx = b.input("ni", DType::I64, "N,3,1");
        let nd = b.node("GatherND", vec![("batch_dims", Attr::Int(1))], &[x, nd_idx], 1)[0];
        b.g.outputs.extend([g, ge, pd, nd]);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["gather", "gather_elements", "pad", "gather_nd"]);
        assert_eq!(p.kernels[0].context["inner"], "4");
        assert_eq!(p.kernels[0].context["n_indices"], "4");
        assert_eq!(p.kernels[1].context["index_ctype"], "int32_t");
        let pad = &p.kernels[2].context;
        assert_eq!(pad["out_dims"], json!(["(dims.v[0])", "8", "4"]));
        assert_eq!(pad["crops"], json!(["0", "0", "1"]));
        assert_eq!(pad["lens"], json!(["(dims.v[0])", "5", "3"]));
        assert_eq!(pad["begins"], json!(["0", "1", "0"]));
        assert_eq!(p.kernels[3].context["slice"], "4");
        render_all("gathers_pad", &p);

        // Reflecting more than n-1 elements is rejected like the reference does.
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "2,3");
        let pads = b.konst("pads", ints(&[0, 3, 0, 0]));
        let pd = b.node("Pad", vec![("mode", Attr::String("reflect".into()))], &[x, pads], 1)[0];
        b.g.outputs.push(pd);
        infer_graph(&mut b.g).unwrap();
        assert!(lower(&b.g).unwrap_err().contains("at most 2 elements"));
    }

    #[test]
    fn scatters_and_one_hot() {
        let mut b = GraphBuilder::new(18);
        let x = b.input("x", DType::F16, "4,5");
        let ni = b.input("ni", DType::I64, "2,1");
        let nu = b.input("nu", DType::F16, "2,5");
        let snd = b.node("ScatterND", vec![("reduction", Attr::String("add".into()))], &[x, ni, nu], 1)[0];
        let ei = b.input("ei", DType::I64, "4,2");
        let eu = b.input("eu", DType::F16, "4,2");
        let se = b.node("ScatterElements", vec![("axis", Attr::Int(1))], &[x, ei, eu], 1)[0];
        let oi = b.input("oi", DType::I64, "3");
        let depth = b.konst("depth", Tensor::from_i64s(&[], vec![4]));
        let vals = b.konst("vals", Tensor::from_i64s(&[2], vec![0, 1]));
        let oh = b.node("OneHot", vec![("axis", Attr::Int(0))], &[oi, depth, vals], 1)[0];
        let ci = b.input("ci", DType::I32, "4,5");
        let cu = b.input("cu", DType::I32, "4,5");
        let xi = b.input("xi", DType::I32, "4,5");
        let sm = b.node(
            "ScatterElements",
            vec![("axis", Attr::Int(0)), ("reduction", Attr::String("mul".into()))],
            &[xi, ci, cu],
            1,
        )[0];
        let kk = b.konst("kk", ints(&[2]));
        let tk = b.node("TopK", vec![("axis", Attr::Int(0)), ("largest", Attr::Int(0))], &[x, kk], 2);
        b.g.outputs.extend([snd, se, oh, sm, tk[0], tk[1]]);
        let p = lowered(&mut b);
        assert_eq!(templates_of(&p), vec!["scatter_nd", "scatter_elements", "one_hot", "scatter_elements", "top_k"]);
        assert_eq!(p.kernels[4].context["k"], "2");
        assert_eq!(p.kernels[4].context["inner"], "5");
        assert_eq!(p.kernels[4].context["largest"], false);
        assert_eq!(p.kernels[0].context["combine"], "(half)((float)a + (float)u)");
        assert_eq!(p.kernels[1].context["lanes"], "4");
        assert_eq!(p.kernels[2].context["depth"], "4");
        assert_eq!(p.kernels[2].context["inner"], "3");
        render_all("scatter", &p);
    }
}
