//! The indexing op family: ops that select, join or pad elements along axes (Concat, Split,
//! Slice, Gather, GatherElements, Pad, NonZero, TopK).
//!
//! Like the shape family, these ops carry the symbolic contents of small int64 shape tensors
//! (`Fact::sym`): Gather of `Shape(x)` at 0 is the symbol `N`, Concat of `[N]` and `[-1]` is
//! `[N, -1]`, Slice of `[N, S, 768]` from 1 is `[S, 768]`.

use super::shape::{concrete, fact_with_sym, ints_input, runtime_dims_input, sym_values, tensor_ints};
use super::OpSpec;
use crate::ir::broadcast::{normalize_axes, normalize_axis};
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, DType, Dim, Elem, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use crate::reference::indexing::{self as kernels, AxisSlice};
use crate::{op_bail, op_ensure, with_tensor};
use ndarray::ArrayD;
use std::any::Any;

/// How `Pad` fills the border.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Concat", parse_concat),
    OpSpec::onnx("Split", parse_split),
    OpSpec::onnx("Slice", parse_slice),
    OpSpec::onnx("Gather", parse_gather),
    OpSpec::onnx("GatherElements", parse_gather_elements),
    OpSpec::onnx("Pad", parse_pad).with_note(
        "'pads' (opset 11+) may be a run-time value (e.g. a graph input) for the reference executor and \
         validate; code generation needs it known at compile time; 'axes' (opset 18+) must be a constant",
    ),
    OpSpec::onnx("NonZero", parse_nonzero),
    OpSpec::onnx("TopK", parse_topk),
];

/// Every input of a variadic op, all required.
fn all_required<'a, T>(inputs: &[Option<&'a T>]) -> OpResult<Vec<&'a T>> {
    inputs
        .iter()
        .enumerate()
        .map(|(i, x)| x.ok_or_else(|| OpError(format!("input {i} is required but missing"))))
        .collect()
}

fn check_index_dtype(dtype: DType, what: &str) -> OpResult<()> {
    op_ensure!(matches!(dtype, DType::I32 | DType::I64), "input '{what}' must be int32 or int64, found {dtype}");
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Concat

#[derive(Clone, Debug)]
pub struct Concat {
    pub axis: i64,
}

/// Merges one non-concatenated dim of two inputs: a known size wins over a symbolic one (they
/// are equal at run time by the model's contract); two different known sizes are an error.
fn merge_dim(a: &Dim, b: &Dim) -> Option<Dim> {
    match (a.as_known(), b.as_known()) {
        (Some(x), Some(y)) => (x == y).then(|| a.clone()),
        (Some(_), None) => Some(a.clone()),
        (None, Some(_)) => Some(b.clone()),
        (None, None) => Some(a.clone()),
    }
}

impl Op for Concat {
    fn op_type(&self) -> &'static str {
        "Concat"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let xs = all_required(inputs)?;
        let first = xs.first().ok_or_else(|| OpError("Concat needs at least one input".into()))?;
        op_ensure!(first.rank() > 0, "cannot concatenate 0-D tensors");
        let axis = normalize_axis(self.axis, first.rank())?;
        let mut out = first.shape().to_vec();
        for (i, x) in xs.iter().enumerate().skip(1) {
            op_ensure!(x.dtype() == first.dtype(), "input {i} is {}, input 0 is {}", x.dtype(), first.dtype());
            op_ensure!(
                x.rank() == first.rank(),
                "input {i} has shape {}, input 0 has shape {}: ranks differ",
                fmt_shape(x.shape()),
                fmt_shape(first.shape())
            );
            for (j, d) in x.shape().iter().enumerate() {
                if j == axis {
                    out[j] = out[j].add(d);
                } else {
                    out[j] = merge_dim(&out[j], d).ok_or_else(|| {
                        OpError(format!(
                            "input {i} has shape {}, input 0 has shape {}: they differ on axis {j}, not only on the concatenation axis {axis}",
                            fmt_shape(x.shape()),
                            fmt_shape(first.shape())
                        ))
                    })?;
                }
            }
        }
        let sym = if first.rank() == 1 {
            xs.iter().map(|x| sym_values(x)).collect::<Option<Vec<_>>>().map(|v| v.concat())
        } else {
            None
        };
        Ok(vec![fact_with_sym(first.dtype(), out, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xs = all_required(inputs)?;
        let first = xs.first().ok_or_else(|| OpError("Concat needs at least one input".into()))?;
        let axis = normalize_axis(self.axis, first.rank())?;
        for (i, x) in xs.iter().enumerate() {
            op_ensure!(x.rank() == first.rank(), "input {i} has shape {:?}, input 0 {:?}", x.shape(), first.shape());
            for j in (0..x.rank()).filter(|&j| j != axis) {
                op_ensure!(
                    x.shape()[j] == first.shape()[j],
                    "input {i} has shape {:?}, input 0 has shape {:?}: they differ on axis {j}",
                    x.shape(),
                    first.shape()
                );
            }
        }
        Ok(vec![kernels::concat_tensors(&xs, axis)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Concat along `axis`. Opset 1 defaulted `axis` to 1; from opset 4 it is required. Negative
/// axes from opset 11 (accepted for every opset). Inputs of rank 1 carrying symbolic contents
/// concatenate them, which builds Reshape targets like `[N, -1]`.
fn parse_concat(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let axis = if ctx.opset < 4 { ctx.int_or("axis", 1)? } else { ctx.req_int("axis")? };
    Ok(Box::new(Concat { axis }))
}

// ---------------------------------------------------------------------------------------------
// Split

/// Where Split's chunk sizes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SplitSizes {
    /// The `split` attribute of opsets before 13.
    Attr(Vec<i64>),
    /// Input 1 (opset 13 and later) when present, else equal chunks.
    Input,
    /// Equal chunks; `uneven` (opset 18 `num_outputs`) lets the last chunk be smaller.
    Equal { uneven: bool },
}

#[derive(Clone, Debug)]
pub struct Split {
    pub axis: i64,
    pub sizes: SplitSizes,
    pub num_outputs: usize,
}

impl Split {
    /// Chunk sizes along a dim of size `dim`, given the `split` input when there is one.
    fn chunks(&self, dim: &Dim, split_input: Option<Vec<Dim>>) -> OpResult<Vec<Dim>> {
        let n = self.num_outputs;
        let explicit = match (&self.sizes, split_input) {
            (SplitSizes::Attr(s), _) => Some(s.iter().map(|&v| Dim::known(v)).collect::<Vec<_>>()),
            (SplitSizes::Input, s) => s,
            (SplitSizes::Equal { .. }, _) => None,
        };
        if let Some(sizes) = explicit {
            op_ensure!(sizes.len() == n, "split {} has {} entries for {n} outputs", fmt_shape(&sizes), sizes.len());
            if let Some(d) = sizes.iter().find(|d| d.as_known().is_some_and(|v| v < 0)) {
                op_bail!("split {} contains the negative size {d}", fmt_shape(&sizes));
            }
            let total = sizes.iter().fold(Dim::known(0), |acc, d| acc.add(d));
            op_ensure!(
                dim.sub(&total).as_known().is_none_or(|v| v == 0),
                "split {} sums to {total}, but the axis has size {dim}",
                fmt_shape(&sizes)
            );
            return Ok(sizes);
        }
        op_ensure!(n > 0, "Split has no outputs");
        let uneven = matches!(self.sizes, SplitSizes::Equal { uneven: true });
        let nd = Dim::known(n as i64);
        if !uneven {
            if let Some(d) = dim.as_known() {
                op_ensure!(d % n as i64 == 0, "axis of size {d} cannot be split into {n} equal parts");
            }
            return Ok(vec![dim.div_floor(&nd); n]);
        }
        // Opset 18 `num_outputs`: chunks of ceil(dim / n), the last one holding the rest.
        let chunk = dim.div_ceil(&nd);
        let last = dim.sub(&chunk.mul(&Dim::known(n as i64 - 1)));
        if let Some(l) = last.as_known() {
            op_ensure!(l >= 0, "axis of size {dim} cannot be split into {n} chunks of {chunk}");
        }
        let mut sizes = vec![chunk; n - 1];
        sizes.push(last);
        Ok(sizes)
    }
}

impl Op for Split {
    fn op_type(&self) -> &'static str {
        "Split"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        let axis = normalize_axis(self.axis, x.rank())?;
        let split_input = match (&self.sizes, optional(inputs, 1)) {
            (SplitSizes::Input, Some(f)) => Some(runtime_dims_input(f, "split")?),
            _ => None,
        };
        let sizes = self.chunks(&x.shape()[axis], split_input)?;
        let values = sym_values(x).filter(|_| x.rank() == 1);
        let mut start = 0usize;
        sizes
            .iter()
            .map(|s| {
                let mut shape = x.shape().to_vec();
                shape[axis] = s.clone();
                let sym = match (&values, s.as_known()) {
                    (Some(v), Some(len)) if start + len as usize <= v.len() => {
                        let part = v[start..start + len as usize].to_vec();
                        start += len as usize;
                        Some(part)
                    }
                    _ => None,
                };
                Ok(fact_with_sym(x.dtype(), shape, sym))
            })
            .collect()
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        let axis = normalize_axis(self.axis, x.rank())?;
        let split_input = match (&self.sizes, optional(inputs, 1)) {
            (SplitSizes::Input, Some(t)) => Some(tensor_ints(t, "split")?.into_iter().map(Dim::known).collect()),
            _ => None,
        };
        let sizes = concrete(&self.chunks(&Dim::from(x.shape()[axis]), split_input)?)?;
        Ok(with_tensor!(x, a => kernels::split(a, axis, &sizes).into_iter().map(Elem::wrap).collect()))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Split along `axis` (default 0) into one chunk per node output. Opset 1's optional `split`
/// input is rejected. Opsets 2-12: sizes in the
/// optional `split` attribute. Opset 13: sizes in the optional int64 input 1. Without sizes
/// the axis is split into equal parts, which must divide it exactly — except from opset 18,
/// where the `num_outputs` attribute (required then, and equal to the output count) makes
/// chunks of `ceil(dim / num_outputs)` with a smaller last chunk. A `split` input only known at
/// run time (its length is the output count) gives data-dependent sizes on the split axis.
fn parse_split(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let axis = ctx.int_or("axis", 0)?;
    let num_outputs = ctx.num_outputs;
    op_ensure!(
        !(ctx.opset < 2 && ctx.input_present(1)),
        "Split of opset {} with a 'split' input is not supported; opset 2 or later is",
        ctx.opset
    );
    let sizes = if ctx.opset < 13 {
        match ctx.ints("split")? {
            Some(s) => SplitSizes::Attr(s),
            None => SplitSizes::Equal { uneven: false },
        }
    } else if ctx.input_present(1) {
        op_ensure!(!ctx.has("num_outputs"), "'num_outputs' and the 'split' input cannot both be given");
        SplitSizes::Input
    } else if ctx.opset >= 18 {
        match ctx.int("num_outputs")? {
            Some(n) => {
                op_ensure!(
                    n == num_outputs as i64,
                    "attribute 'num_outputs' = {n} but the node has {num_outputs} outputs"
                );
                SplitSizes::Equal { uneven: true }
            }
            None => op_bail!("from opset 18 Split needs either the 'split' input or the 'num_outputs' attribute"),
        }
    } else {
        SplitSizes::Equal { uneven: false }
    };
    Ok(Box::new(Split { axis, sizes, num_outputs }))
}

// ---------------------------------------------------------------------------------------------
// Slice

/// Bounds at or beyond this magnitude mean "to the end" (PyTorch exports INT64_MAX, older
/// exporters INT32_MAX).
const OPEN_BOUND: i64 = i32::MAX as i64;

/// Exact ONNX slice arithmetic on one axis of known size: the first index taken and the count.
fn slice_known(d: i64, start: i64, end: i64, step: i64) -> (i64, i64) {
    if d == 0 {
        return (0, 0);
    }
    let wrap = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    // ceil(span / stride) without overflow for huge strides.
    let count = |span: i64, stride: i64| {
        if span <= 0 {
            0
        } else {
            (span - 1) / stride + 1
        }
    };
    if step > 0 {
        let s = wrap(start).clamp(0, d);
        let e = wrap(end).clamp(0, d);
        (s, count(e - s, step))
    } else {
        let s = wrap(start).clamp(0, d - 1);
        let e = if is_open_end(end) { -1 } else { wrap(end).clamp(-1, d - 1) };
        (s, count(s - e, step.saturating_neg()))
    }
}

/// INT32_MAX and INT64_MAX as `end` mean numpy's `None`: with a negative step ONNX Runtime
/// walks through index 0 (`x[::-1]`) rather than clamping to `dim - 1` as the spec's formula
/// would; exporters rely on that, so onnx2ait follows Runtime.
fn is_open_end(end: i64) -> bool {
    end == i64::MAX || end == i32::MAX as i64
}

/// Output size of one sliced axis, symbolic when the dim or the bounds are. With a symbolic dim,
/// plain bounds are assumed to lie within it (`x[:, :5]` on `[N, S]` gives `[N, 5]`), negative
/// ones count from its end (`x[:, -1:]` gives `[N, 1]`) and open ones reach it.
fn slice_len(d: &Dim, start: &Dim, end: &Dim, step: i64) -> Dim {
    if let (Some(dk), Some(s), Some(e)) = (d.as_known(), start.as_known(), end.as_known()) {
        return Dim::known(slice_known(dk, s, e, step).1);
    }
    let bound = |b: &Dim, is_end: bool| -> Dim {
        match b.as_known() {
            None => b.clone(),
            Some(v) if is_end && step < 0 && is_open_end(v) => Dim::known(-1),
            Some(v) if v >= OPEN_BOUND => {
                if step > 0 {
                    d.clone()
                } else {
                    d.sub(&Dim::known(1))
                }
            }
            Some(v) if v <= -OPEN_BOUND => Dim::known(if step > 0 || !is_end { 0 } else { -1 }),
            Some(v) if v < 0 => d.add(&Dim::known(v)),
            Some(v) => Dim::known(v),
        }
    };
    let (s, e) = (bound(start, false), bound(end, true));
    let len = if step > 0 {
        e.sub(&s).div_ceil(&Dim::known(step))
    } else {
        s.sub(&e).div_ceil(&Dim::known(step.saturating_neg()))
    };
    match len.as_known() {
        Some(v) => Dim::known(v.max(0)),
        None => len,
    }
}

/// Per-axis slice parameters after defaulting axes and steps.
struct SliceSpec<T> {
    starts: Vec<T>,
    ends: Vec<T>,
    axes: Vec<usize>,
    steps: Vec<i64>,
}

fn slice_spec<T>(
    rank: usize,
    starts: Vec<T>,
    ends: Vec<T>,
    axes: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
) -> OpResult<SliceSpec<T>> {
    let n = starts.len();
    op_ensure!(ends.len() == n, "'starts' has {n} entries but 'ends' has {}", ends.len());
    let axes = match axes {
        Some(a) => {
            op_ensure!(a.len() == n, "'starts' has {n} entries but 'axes' has {}", a.len());
            normalize_axes(&a, rank)?
        }
        None => {
            op_ensure!(n <= rank, "'starts' has {n} entries for an input of rank {rank}");
            (0..n).collect()
        }
    };
    let steps = steps.unwrap_or_else(|| vec![1; n]);
    op_ensure!(steps.len() == n, "'starts' has {n} entries but 'steps' has {}", steps.len());
    op_ensure!(!steps.contains(&0), "'steps' {steps:?} contains 0");
    Ok(SliceSpec { starts, ends, axes, steps })
}

#[derive(Clone, Debug)]
pub struct Slice {
    /// Opsets 1-9: the bounds as attributes. `None`: inputs 1-4.
    pub attrs: Option<SliceAttrs>,
}

/// The `starts`, `ends` and optional `axes` attributes of Slice before opset 10.
#[derive(Clone, Debug)]
pub struct SliceAttrs {
    pub starts: Vec<i64>,
    pub ends: Vec<i64>,
    pub axes: Option<Vec<i64>>,
}

impl Slice {
    /// The slice parameters known at compile time. Run-time `starts`/`ends` entries are
    /// data-dependent dims; run-time `steps` are left at 1 here and reported by
    /// `runtime_steps`, so the caller marks those axes data-dependent.
    fn spec_at_infer(&self, rank: usize, inputs: &[Option<&Fact>]) -> OpResult<SliceSpec<Dim>> {
        match &self.attrs {
            Some(a) => {
                let dims = |v: &Vec<i64>| v.iter().map(|&x| Dim::known(x)).collect();
                slice_spec(rank, dims(&a.starts), dims(&a.ends), a.axes.clone(), None)
            }
            None => {
                let starts = runtime_dims_input(required(inputs, 1, "starts")?, "starts")?;
                let ends = runtime_dims_input(required(inputs, 2, "ends")?, "ends")?;
                let axes = optional(inputs, 3).map(|f| ints_input(f, "axes")).transpose()?;
                let steps = match optional(inputs, 4) {
                    Some(f) if Self::runtime_input(f) => None,
                    f => f.map(|f| ints_input(f, "steps")).transpose()?,
                };
                slice_spec(rank, starts, ends, axes, steps)
            }
        }
    }

    /// A 1-D integer input whose values are only known at run time.
    fn runtime_input(f: &Fact) -> bool {
        f.dtype().is_int() && f.rank() == 1 && f.as_ints().is_none()
    }

    fn spec_at_eval(&self, rank: usize, inputs: &[Option<&Tensor>]) -> OpResult<SliceSpec<i64>> {
        match &self.attrs {
            Some(a) => slice_spec(rank, a.starts.clone(), a.ends.clone(), a.axes.clone(), None),
            None => {
                let starts = tensor_ints(required(inputs, 1, "starts")?, "starts")?;
                let ends = tensor_ints(required(inputs, 2, "ends")?, "ends")?;
                let axes = optional(inputs, 3).map(|t| tensor_ints(t, "axes")).transpose()?;
                let steps = optional(inputs, 4).map(|t| tensor_ints(t, "steps")).transpose()?;
                slice_spec(rank, starts, ends, axes, steps)
            }
        }
    }
}

impl Op for Slice {
    fn op_type(&self) -> &'static str {
        "Slice"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(x.rank() > 0, "cannot slice a 0-D tensor");
        let runtime = |i: usize| self.attrs.is_none() && optional(inputs, i).is_some_and(Self::runtime_input);
        // Where the result depends on run-time values, the dim is data-dependent; an empty
        // axis stays empty whatever is sliced from it.
        let data_dependent = |d: &Dim| match d.as_known() {
            Some(0) => Dim::known(0),
            _ => Dim::data_dependent(),
        };
        if runtime(3) {
            // Run-time axes: any axis may be the sliced one.
            let out = x.shape().iter().map(data_dependent).collect();
            return Ok(vec![Fact::new(x.dtype(), out)]);
        }
        let spec = self.spec_at_infer(x.rank(), inputs)?;
        let runtime_steps = runtime(4);
        let mut out = x.shape().to_vec();
        for i in 0..spec.axes.len() {
            let a = spec.axes[i];
            out[a] = if runtime_steps
                || spec.starts[i].is_data_dependent_marker()
                || spec.ends[i].is_data_dependent_marker()
            {
                data_dependent(&x.shape()[a])
            } else {
                slice_len(&x.shape()[a], &spec.starts[i], &spec.ends[i], spec.steps[i])
            };
        }
        // A 1-D shape tensor has a known length, so its slice is exact.
        let sym = match (sym_values(x), x.rank()) {
            (Some(v), 1) => spec
                .starts
                .first()
                .zip(spec.ends.first())
                .and_then(|(s, e)| Some((s.as_known()?, e.as_known()?)))
                .map(|(s, e)| {
                    let (first, len) = slice_known(v.len() as i64, s, e, spec.steps[0]);
                    (0..len).map(|k| v[(first + k * spec.steps[0]) as usize].clone()).collect()
                })
                .or_else(|| spec.starts.is_empty().then_some(v)),
            _ => None,
        };
        Ok(vec![fact_with_sym(x.dtype(), out, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(x.rank() > 0, "cannot slice a 0-D tensor");
        let spec = self.spec_at_eval(x.rank(), inputs)?;
        let mut axes: Vec<AxisSlice> = x.shape().iter().map(|&d| AxisSlice { first: 0, step: 1, len: d }).collect();
        for i in 0..spec.axes.len() {
            let a = spec.axes[i];
            let (first, len) = slice_known(x.shape()[a] as i64, spec.starts[i], spec.ends[i], spec.steps[i]);
            axes[a] = AxisSlice { first: first as usize, step: spec.steps[i], len: len as usize };
        }
        Ok(vec![crate::map_tensor!(x, a => kernels::slice(a, &axes))])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Slice. Opsets 1-9: `starts`/`ends`/optional `axes` attributes, step 1. Opset 10: they become
/// inputs 1-3 plus optional `steps` (input 4, negative steps walk backwards). Opset 11 allows
/// negative axes. Bounds are clamped as the spec says, except that an `end` of INT32_MAX or
/// INT64_MAX with a negative step runs through index 0, as in ONNX Runtime (see `is_open_end`);
/// `starts`/`ends` may be symbolic (from shape subgraphs), `axes`/`steps` must be constants.
fn parse_slice(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let attrs = if ctx.opset < 10 {
        Some(SliceAttrs { starts: ctx.req_ints("starts")?, ends: ctx.req_ints("ends")?, axes: ctx.ints("axes")? })
    } else {
        None
    };
    Ok(Box::new(Slice { attrs }))
}

// ---------------------------------------------------------------------------------------------
// Gather

/// Maps indices in `[-dim, dim)` to `[0, dim)`.
fn normalize_indices(indices: &[i64], dim: usize, what: &str) -> OpResult<Vec<usize>> {
    let d = dim as i64;
    indices
        .iter()
        .map(|&i| {
            op_ensure!((-d..d).contains(&i), "{what} index {i} is out of range for an axis of size {dim}");
            Ok(if i < 0 { i + d } else { i } as usize)
        })
        .collect()
}

#[derive(Clone, Debug)]
pub struct Gather {
    pub axis: i64,
}

impl Op for Gather {
    fn op_type(&self) -> &'static str {
        "Gather"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        check_index_dtype(idx.dtype(), "indices")?;
        op_ensure!(x.rank() > 0, "cannot gather from a 0-D tensor");
        let axis = normalize_axis(self.axis, x.rank())?;
        // Constant indices are checked here, at import: a kernel cannot report an index out of
        // range (it would read nothing and return 0), so the model is refused instead.
        if let (Some(k), Some(dim)) = (&idx.konst, x.shape()[axis].as_known()) {
            let dim = usize::try_from(dim).unwrap_or(0);
            normalize_indices(&k.to_i64_vec(), dim, "Gather").map_err(|e| {
                OpError(format!("{} (constant indices, data axis {axis} of {})", e.0, fmt_shape(x.shape())))
            })?;
        }
        let mut out = x.shape()[..axis].to_vec();
        out.extend_from_slice(idx.shape());
        out.extend_from_slice(&x.shape()[axis + 1..]);
        // Picking entries of a shape tensor: `Gather(Shape(x), 0)` is the symbol `N`.
        let sym = match (sym_values(x), x.rank(), idx.rank() <= 1) {
            (Some(v), 1, true) => match idx.as_ints() {
                Some(i) => Some(normalize_indices(&i, v.len(), "Gather")?.into_iter().map(|k| v[k].clone()).collect()),
                None => None,
            },
            _ => None,
        };
        Ok(vec![fact_with_sym(x.dtype(), out, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        check_index_dtype(idx.dtype(), "indices")?;
        op_ensure!(x.rank() > 0, "cannot gather from a 0-D tensor");
        let axis = normalize_axis(self.axis, x.rank())?;
        let indices = normalize_indices(&idx.to_i64_vec(), x.shape()[axis], "Gather")?;
        Ok(vec![with_tensor!(x, a => kernels::gather(a, axis, &indices, idx.shape()).map(Elem::wrap))?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Gather along `axis` (default 0): output shape `data[:axis] + indices + data[axis+1:]`.
/// Negative indices count from the end (spec'd from opset 11, accepted always); out-of-range
/// indices are an error. Opset 13 only added bfloat16.
fn parse_gather(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Gather { axis: ctx.int_or("axis", 0)? }))
}

// ---------------------------------------------------------------------------------------------
// GatherElements

#[derive(Clone, Debug)]
pub struct GatherElements {
    pub axis: i64,
}

impl Op for GatherElements {
    fn op_type(&self) -> &'static str {
        "GatherElements"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        check_index_dtype(idx.dtype(), "indices")?;
        op_ensure!(
            x.rank() == idx.rank() && x.rank() > 0,
            "data {} and indices {} must have the same rank (at least 1)",
            fmt_shape(x.shape()),
            fmt_shape(idx.shape())
        );
        normalize_axis(self.axis, x.rank())?;
        Ok(vec![Fact::new(x.dtype(), idx.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let idx = required(inputs, 1, "indices")?;
        check_index_dtype(idx.dtype(), "indices")?;
        op_ensure!(
            x.rank() == idx.rank(),
            "data {:?} and indices {:?} must have the same rank",
            x.shape(),
            idx.shape()
        );
        let axis = normalize_axis(self.axis, x.rank())?;
        for j in (0..x.rank()).filter(|&j| j != axis) {
            op_ensure!(
                idx.shape()[j] <= x.shape()[j],
                "indices {:?} exceed data {:?} on axis {j}",
                idx.shape(),
                x.shape()
            );
        }
        let flat = normalize_indices(&idx.to_i64_vec(), x.shape()[axis], "GatherElements")?;
        let indices = ArrayD::from_shape_vec(idx.shape(), flat).map_err(|e| OpError(format!("internal: {e}")))?;
        Ok(vec![crate::map_tensor!(x, a => kernels::gather_elements(a, axis, &indices))])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// GatherElements (opset 11; 13 added bfloat16): `out[i][j] = data[indices[i][j]][j]` for
/// axis 0, likewise for other axes; the output has the indices' shape.
fn parse_gather_elements(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(GatherElements { axis: ctx.int_or("axis", 0)? }))
}

// ---------------------------------------------------------------------------------------------
// Pad

#[derive(Clone, Debug)]
pub struct Pad {
    pub mode: PadMode,
    /// Opsets 1-10: the `pads` attribute and the `value` fill. `None`: inputs 1-3.
    pub attrs: Option<(Vec<i64>, f32)>,
}

/// `(begin, end)` per axis from ONNX `pads` (`[b0, b1, .., e0, e1, ..]`) over `axes`.
fn pads_per_axis<T: Clone>(rank: usize, pads: &[T], axes: Option<&[i64]>, zero: T) -> OpResult<Vec<(T, T)>> {
    let axes = match axes {
        Some(a) => normalize_axes(a, rank)?,
        None => (0..rank).collect(),
    };
    op_ensure!(
        pads.len() == 2 * axes.len(),
        "'pads' has {} entries, expected {} (begin and end for each of {} axes)",
        pads.len(),
        2 * axes.len(),
        axes.len()
    );
    let mut out = vec![(zero.clone(), zero); rank];
    for (k, &a) in axes.iter().enumerate() {
        out[a] = (pads[k].clone(), pads[k + axes.len()].clone());
    }
    Ok(out)
}

impl Op for Pad {
    fn op_type(&self) -> &'static str {
        "Pad"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let pads = match &self.attrs {
            Some((p, _)) => {
                let p: Vec<Dim> = p.iter().map(|&v| Dim::known(v)).collect();
                pads_per_axis(x.rank(), &p, None, Dim::known(0))?
            }
            None => {
                let p = runtime_dims_input(required(inputs, 1, "pads")?, "pads")?;
                if let Some(v) = optional(inputs, 2) {
                    op_ensure!(v.dtype() == x.dtype(), "constant_value is {}, the data {}", v.dtype(), x.dtype());
                }
                let axes = optional(inputs, 3).map(|f| ints_input(f, "axes")).transpose()?;
                pads_per_axis(x.rank(), &p, axes.as_deref(), Dim::known(0))?
            }
        };
        let out: Vec<Dim> = x
            .shape()
            .iter()
            .zip(&pads)
            .map(|(d, (b, e))| {
                if b.is_data_dependent_marker() || e.is_data_dependent_marker() {
                    Dim::data_dependent()
                } else {
                    d.add(b).add(e)
                }
            })
            .collect();
        if let Some(d) = out.iter().find(|d| d.as_known().is_some_and(|v| v < 0)) {
            op_bail!("padding {} gives the negative dim {d}", fmt_shape(x.shape()));
        }
        Ok(vec![Fact::new(x.dtype(), out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let (pads, value) = match &self.attrs {
            Some((p, v)) => {
                (pads_per_axis(x.rank(), p, None, 0)?, Some(Tensor::from_f32s(&[], vec![*v]).cast(x.dtype())))
            }
            None => {
                let p = tensor_ints(required(inputs, 1, "pads")?, "pads")?;
                let axes = optional(inputs, 3).map(|t| tensor_ints(t, "axes")).transpose()?;
                // An empty constant_value tensor means the default 0.
                let value = optional(inputs, 2).filter(|v| !v.is_empty()).cloned();
                (pads_per_axis(x.rank(), &p, axes.as_deref(), 0)?, value)
            }
        };
        Ok(vec![kernels::pad_tensor(x, &pads, self.mode, value.as_ref())?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Pad. Opsets 2-10: `pads` and `value` (float, default 0) attributes (opset 1 spelled them
/// `paddings`). Opset 11: `pads` becomes input 1 and the fill the optional input 2 (of the
/// data's type). Opset 18: optional input 3 `axes` limits the pads to those axes. Opset 19: adds
/// `mode="wrap"`. Modes constant/reflect/edge are numpy's; negative pads crop (first, before
/// the border is filled). Pads only known at run time make the padded axes data-dependent.
fn parse_pad(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let allowed: &[&str] =
        if ctx.opset >= 19 { &["constant", "reflect", "edge", "wrap"] } else { &["constant", "reflect", "edge"] };
    let mode = match ctx.choice("mode", "constant", allowed)?.as_str() {
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        _ => PadMode::Constant,
    };
    let attrs = if ctx.opset < 11 {
        let pads = if ctx.opset < 2 { ctx.req_ints("paddings")? } else { ctx.req_ints("pads")? };
        Some((pads, ctx.float_or("value", 0.0)?))
    } else {
        None
    };
    Ok(Box::new(Pad { mode, attrs }))
}

// ---------------------------------------------------------------------------------------------
// NonZero

#[derive(Clone, Debug)]
pub struct NonZero;

impl Op for NonZero {
    fn op_type(&self) -> &'static str {
        "NonZero"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        // A 0-D input counts as 1-D (ONNX Runtime's reading).
        let rank = x.rank().max(1);
        // The count is data: known only when the input is a constant (then the driver folds).
        let count = match &x.konst {
            Some(t) => Dim::from(kernels::nonzero_tensor(t).shape()[1]),
            None if x.shape().iter().any(|d| d.as_known() == Some(0)) => Dim::known(0),
            None => Dim::data_dependent(),
        };
        Ok(vec![Fact::new(DType::I64, vec![Dim::from(rank), count])])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        Ok(vec![kernels::nonzero_tensor(x)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// NonZero (opset 9; 13 only widened types): the int64 coordinates `[rank, count]` of the
/// non-zero elements in row-major order. `count` depends on the data, so the output's second
/// dim is data-dependent unless the input is a constant. A 0-D input gives `[1, count]`, as in
/// ONNX Runtime (the spec's shape inference says `[0, count]`, which cannot hold the indices).
fn parse_nonzero(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(NonZero))
}

// ---------------------------------------------------------------------------------------------
// TopK

#[derive(Clone, Debug)]
pub struct TopK {
    pub axis: i64,
    /// Opsets 1-9: `k` as an attribute. `None`: input 1.
    pub k_attr: Option<i64>,
    pub largest: bool,
}

impl TopK {
    fn check_k(k: i64, dim: &Dim) -> OpResult<()> {
        op_ensure!(k >= 0, "'k' must not be negative, found {k}");
        if let Some(d) = dim.as_known() {
            op_ensure!(k <= d, "'k' = {k} exceeds the size {d} of the axis");
        }
        Ok(())
    }
}

impl Op for TopK {
    fn op_type(&self) -> &'static str {
        "TopK"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.dtype() != DType::Bool, "TopK of bool is not supported (numeric types are)");
        let axis = normalize_axis(self.axis, x.rank())?;
        let k = match self.k_attr {
            Some(k) => Dim::known(k),
            None => {
                let f = required(inputs, 1, "K")?;
                op_ensure!(f.dtype() == DType::I64, "input 'K' must be int64, found {}", f.dtype());
                op_ensure!(
                    f.shape().iter().all(|d| d.as_known() == Some(1)) && f.rank() <= 1,
                    "input 'K' must hold exactly one value, found shape {}",
                    fmt_shape(f.shape())
                );
                // A K known only at run time makes the axis data-dependent.
                match f.as_dims() {
                    Some(v) => v.into_iter().next().unwrap_or_else(Dim::data_dependent),
                    None => Dim::data_dependent(),
                }
            }
        };
        if let Some(kv) = k.as_known() {
            Self::check_k(kv, &x.shape()[axis])?;
        }
        let mut shape = x.shape().to_vec();
        shape[axis] = k;
        Ok(vec![Fact::new(x.dtype(), shape.clone()), Fact::new(DType::I64, shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let axis = normalize_axis(self.axis, x.rank())?;
        let k = match self.k_attr {
            Some(k) => k,
            None => {
                let v = tensor_ints(required(inputs, 1, "K")?, "K")?;
                op_ensure!(v.len() == 1, "input 'K' must hold exactly one value, found {v:?}");
                v[0]
            }
        };
        Self::check_k(k, &Dim::from(x.shape()[axis]))?;
        let (values, indices) = kernels::top_k_tensor(x, axis, k as usize, self.largest)?;
        Ok(vec![values, indices])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// TopK: the `k` largest elements along `axis` (default -1) and their int64 indices, ties by
/// lower index first. Opset 1: `k` attribute. Opset 10: `K` becomes a 1-element int64 input
/// (a value known only at run time makes the axis data-dependent). Opset 11: adds `largest`
/// (0 selects the smallest) and `sorted`; with `sorted=0` the order is unspecified, and the
/// sorted order is returned. NaN ranks above every number, as in ONNX Runtime.
fn parse_topk(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let k_attr = if ctx.opset < 10 {
        Some(ctx.req_int("k")?)
    } else {
        op_ensure!(ctx.input_present(1), "input 1 (K) is required from opset 10");
        None
    };
    let largest = if ctx.opset >= 11 { ctx.flag("largest", true)? } else { true };
    if ctx.opset >= 11 {
        ctx.flag("sorted", true)?;
    }
    Ok(Box::new(TopK { axis: ctx.int_or("axis", -1)?, k_attr, largest }))
}

#[cfg(test)]
mod tests {
    use crate::ir::ops::testutil::*;
    use crate::ir::{Attr, DType, Dim, Fact, Tensor};

    const I64_MAX: i64 = i64::MAX;

    #[test]
    fn concat_shapes_and_symbols() {
        let op = parse("Concat", 13, vec![("axis", Attr::Int(-1))], 2, 1).unwrap();
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,S,64"), &fact(DType::F32, "N,S,32")]), "[N,S,96]");
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,S"), &fact(DType::F32, "N,T")]), "[N,S+T]");
        // A known size wins over a symbolic one on the other axes.
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,2"), &fact(DType::F32, "4,3")]), "[4,5]");
        let msg = op.infer(&[Some(&fact(DType::F32, "2,3")), Some(&fact(DType::F32, "4,3"))]).unwrap_err().0;
        assert!(msg.contains("differ on axis 0"), "{msg}");
        let msg = op.infer(&[Some(&fact(DType::F32, "2")), Some(&fact(DType::I64, "2"))]).unwrap_err().0;
        assert!(msg.contains("int64"), "{msg}");
        let n = Fact::symbolic(vec![Dim::sym("N")], false);
        let out = op.infer(&[Some(&n), Some(&ints(&[-1]))]).unwrap();
        assert_eq!(out[0].sym, Some(vec![Dim::sym("N"), Dim::known(-1)]));
        let axis0 = parse("Concat", 13, vec![("axis", Attr::Int(0))], 2, 1).unwrap();
        let out = eval1(&*axis0, &[&iota(&[1, 2]), &iota(&[2, 2])]);
        assert_eq!(out.to_f64_vec(), vec![0.0, 1.0, 0.0, 1.0, 2.0, 3.0]);
        assert!(parse("Concat", 13, vec![], 2, 1).is_err());
    }

    #[test]
    fn split_across_opsets() {
        let x = fact(DType::F32, "N,6");
        let old = parse("Split", 11, vec![("axis", Attr::Int(1)), ("split", Attr::Ints(vec![2, 4]))], 1, 2).unwrap();
        let outs = old.infer(&[Some(&x)]).unwrap();
        assert_eq!(outs.iter().map(|f| f.shape().to_vec()).collect::<Vec<_>>(), vec![dims("N,2"), dims("N,4")]);
        let v13 = parse("Split", 13, vec![("axis", Attr::Int(1))], 2, 2).unwrap();
        assert_eq!(v13.infer(&[Some(&x), Some(&ints(&[5, 1]))]).unwrap()[1].shape(), dims("N,1"));
        assert!(v13.infer(&[Some(&x), Some(&ints(&[5, 2]))]).unwrap_err().0.contains("sums to 7"));
        let equal = parse("Split", 13, vec![], 1, 2).unwrap();
        let two_n = Fact::new(DType::F32, vec![Dim::sym("N").mul(&Dim::known(2)), Dim::known(3)]);
        let outs = equal.infer(&[Some(&two_n)]).unwrap();
        assert_eq!(outs[0].shape(), dims("N,3"));
        assert!(equal.infer(&[Some(&fact(DType::F32, "5"))]).unwrap_err().0.contains("equal parts"));

        // Opset 18 num_outputs: ONNX Runtime splits 5 into [2, 2, 1] and rejects 4 chunks.
        let v18 = parse("Split", 18, vec![("num_outputs", Attr::Int(3))], 1, 3).unwrap();
        let outs = v18.infer(&[Some(&fact(DType::F32, "5"))]).unwrap();
        assert_eq!(outs.iter().map(|f| f.shape()[0].as_known().unwrap()).collect::<Vec<_>>(), vec![2, 2, 1]);
        let parts = v18.eval(&[Some(&iota(&[5]))]).unwrap();
        assert_eq!(parts[2].to_f64_vec(), vec![4.0]);
        let four = parse("Split", 18, vec![("num_outputs", Attr::Int(4))], 1, 4).unwrap();
        assert!(four.infer(&[Some(&fact(DType::F32, "5"))]).is_err());
        assert!(parse("Split", 18, vec![], 1, 2).unwrap_err().0.contains("num_outputs"));
        assert!(parse("Split", 18, vec![("num_outputs", Attr::Int(3))], 1, 2).is_err());

        // Splitting a shape tensor splits its symbolic contents.
        let shape = Fact::symbolic(dims("N,S,768"), false);
        let v0 = parse("Split", 13, vec![], 2, 2).unwrap();
        let outs = v0.infer(&[Some(&shape), Some(&ints(&[2, 1]))]).unwrap();
        assert_eq!(outs[0].sym, Some(dims("N,S")));
        assert_eq!(outs[1].sym, Some(dims("768")));
    }

    #[test]
    fn slice_matches_onnxruntime() {
        let op = parse("Slice", 13, vec![], 5, 1).unwrap();
        let x = iota(&[6]);
        // Expected values from onnxruntime 1.32 on np.arange(6).
        let cases: &[(i64, i64, i64, &[f64])] = &[
            (5, -100, -2, &[5.0, 3.0, 1.0]),
            (-1, -7, -1, &[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]),
            (10, 0, -3, &[5.0, 2.0]),
            (2, 2, 1, &[]),
            (0, 100, 4, &[0.0, 4.0]),
            (1, I64_MAX, 1, &[1.0, 2.0, 3.0, 4.0, 5.0]),
            // An open end with a negative step runs through index 0 (numpy's `x[3::-1]`).
            (3, I64_MAX, -1, &[3.0, 2.0, 1.0, 0.0]),
            (3, i32::MAX as i64, -2, &[3.0, 1.0]),
        ];
        for &(s, e, st, want) in cases {
            let out = eval1(&*op, &[&x, &t_ints(&[s]), &t_ints(&[e]), &t_ints(&[0]), &t_ints(&[st])]);
            assert_eq!(out.to_f64_vec(), want, "slice {s}:{e}:{st}");
            let f = Fact::new(DType::F32, dims("6"));
            let shape = out_shape(&*op, &[&f, &ints(&[s]), &ints(&[e]), &ints(&[0]), &ints(&[st])]);
            assert_eq!(shape, format!("[{}]", want.len()));
        }
        let m = eval1(
            &*op,
            &[&iota(&[3, 4]), &t_ints(&[1, -1]), &t_ints(&[I64_MAX, 0]), &t_ints(&[0, 1]), &t_ints(&[1, -2])],
        );
        // numpy: np.arange(12).reshape(3,4)[1:, -1:0:-2]
        assert_eq!(m.shape(), &[2, 2]);
        assert_eq!(m.to_f64_vec(), vec![7.0, 5.0, 11.0, 9.0]);
    }

    #[test]
    fn slice_symbolic_dims_and_contents() {
        let op = parse("Slice", 13, vec![], 4, 1).unwrap();
        let x = fact(DType::F32, "N,S,768");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[1]), &ints(&[I64_MAX]), &ints(&[1])]), "[N,S-1,768]");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[-1]), &ints(&[I64_MAX]), &ints(&[1])]), "[N,1,768]");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[0]), &ints(&[5]), &ints(&[-2])]), "[N,5,768]");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[0]), &ints(&[-1]), &ints(&[1])]), "[N,S-1,768]");
        // A symbolic end from a shape subgraph: positions[:, :S].
        let end = Fact::symbolic(vec![Dim::sym("S")], false);
        assert_eq!(out_shape(&*op, &[&fact(DType::I64, "1,512"), &ints(&[0]), &end, &ints(&[1])]), "[1,S]");
        // Shape tensors keep their contents.
        let shape = Fact::symbolic(dims("N,S,768"), false);
        let out = op.infer(&[Some(&shape), Some(&ints(&[1])), Some(&ints(&[I64_MAX])), Some(&ints(&[0]))]).unwrap();
        assert_eq!(out[0].sym, Some(dims("S,768")));
        let old =
            parse("Slice", 9, vec![("starts", Attr::Ints(vec![1])), ("ends", Attr::Ints(vec![3]))], 1, 1).unwrap();
        assert_eq!(out_shape(&*old, &[&fact(DType::F32, "5,N")]), "[2,N]");
        let msg = op.infer(&[Some(&x), Some(&ints(&[0])), Some(&ints(&[1])), Some(&ints(&[5]))]).unwrap_err().0;
        assert!(msg.contains("out of range"), "{msg}");
        let zero_step = parse("Slice", 13, vec![], 5, 1).unwrap();
        let msg = zero_step
            .infer(&[Some(&x), Some(&ints(&[0])), Some(&ints(&[1])), Some(&ints(&[0])), Some(&ints(&[0]))])
            .unwrap_err()
            .0;
        assert!(msg.contains("contains 0"), "{msg}");
    }

    #[test]
    fn gather_shapes_values_and_symbols() {
        let op = parse("Gather", 13, vec![("axis", Attr::Int(1))], 2, 1).unwrap();
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,10,4"), &fact(DType::I64, "B,S")]), "[N,B,S,4]");
        let out = eval1(&*op, &[&iota(&[2, 3]), &t_ints(&[-1, 0])]);
        assert_eq!(out.to_f64_vec(), vec![2.0, 0.0, 5.0, 3.0]);
        let bad = op.eval(&[Some(&iota(&[2, 3])), Some(&t_ints(&[3]))]).unwrap_err().0;
        assert!(bad.contains("out of range"), "{bad}");
        // Constant indices out of range are refused by inference (no kernel can report them);
        // in range, negative, or on a symbolic axis they pass.
        let bad = op.infer(&[Some(&fact(DType::F32, "N,3")), Some(&ints(&[0, 3]))]).unwrap_err().0;
        assert!(
            bad.contains("index 3 is out of range for an axis of size 3 (constant indices, data axis 1 of [N,3])"),
            "{bad}"
        );
        assert!(op.infer(&[Some(&fact(DType::F32, "N,3")), Some(&ints(&[-4]))]).is_err());
        assert!(op.infer(&[Some(&fact(DType::F32, "N,3")), Some(&ints(&[-3, 2]))]).is_ok());
        assert!(op.infer(&[Some(&fact(DType::F32, "3,S")), Some(&ints(&[7]))]).is_ok());
        let f_idx = op.infer(&[Some(&fact(DType::F32, "2,3")), Some(&fact(DType::F32, "1"))]).unwrap_err().0;
        assert!(f_idx.contains("int32 or int64"), "{f_idx}");
        // Gather(Shape(x), 0) is the symbol N, a scalar.
        let g0 = parse("Gather", 13, vec![], 2, 1).unwrap();
        let shape = Fact::symbolic(dims("N,3,224,224"), false);
        let out = g0.infer(&[Some(&shape), Some(&scalar(0))]).unwrap();
        assert_eq!(out[0].rank(), 0);
        assert_eq!(out[0].sym, Some(vec![Dim::sym("N")]));
        let out = g0.infer(&[Some(&shape), Some(&ints(&[-1, -2]))]).unwrap();
        assert_eq!(out[0].sym, Some(dims("224,224")));
        let e = eval1(&*g0, &[&t_ints(&[7, 8, 9]), &Tensor::from_i64s(&[], vec![1])]);
        assert_eq!((e.rank(), e.to_i64_vec()), (0, vec![8]));
    }

    #[test]
    fn gather_elements_matches_numpy() {
        let op = parse("GatherElements", 13, vec![("axis", Attr::Int(1))], 2, 1).unwrap();
        // numpy: np.take_along_axis([[1,2],[3,4]], [[0,0],[1,0]], axis=1) = [[1,1],[4,3]]
        let data = Tensor::from_f32s(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let idx = Tensor::from_i64s(&[2, 2], vec![0, 0, 1, -2]);
        assert_eq!(eval1(&*op, &[&data, &idx]).to_f64_vec(), vec![1.0, 1.0, 4.0, 3.0]);
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,5"), &fact(DType::I64, "N,2")]), "[N,2]");
        assert!(op.infer(&[Some(&fact(DType::F32, "N,5")), Some(&fact(DType::I64, "2"))]).is_err());
    }

    #[test]
    fn pad_modes_match_onnxruntime() {
        let op = parse("Pad", 19, vec![("mode", Attr::String("reflect".into()))], 2, 1).unwrap();
        let x = iota(&[6]);
        // Expected values from onnxruntime 1.32 (negative pads crop before the border is filled).
        assert_eq!(eval1(&*op, &[&x, &t_ints(&[-1, 3])]).to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 4.0, 3.0, 2.0]);
        assert_eq!(eval1(&*op, &[&x, &t_ints(&[3, -1])]).to_f64_vec(), vec![3.0, 2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        let wrap = parse("Pad", 19, vec![("mode", Attr::String("wrap".into()))], 2, 1).unwrap();
        assert_eq!(eval1(&*wrap, &[&x, &t_ints(&[3, -1])]).to_f64_vec(), vec![2.0, 3.0, 4.0, 0.0, 1.0, 2.0, 3.0, 4.0]);
        let edge = parse("Pad", 13, vec![("mode", Attr::String("edge".into()))], 2, 1).unwrap();
        assert_eq!(
            eval1(&*edge, &[&iota(&[3]), &t_ints(&[5, 4])]).to_f64_vec()[..7],
            [0.0; 6][..].iter().copied().chain([1.0]).collect::<Vec<_>>()[..]
        );
        assert!(parse("Pad", 18, vec![("mode", Attr::String("wrap".into()))], 2, 1).is_err());

        let constant = parse("Pad", 13, vec![], 3, 1).unwrap();
        let out = eval1(&*constant, &[&iota(&[1, 2]), &t_ints(&[0, 1, 1, 0]), &Tensor::from_f32s(&[], vec![7.0])]);
        assert_eq!(out.shape(), &[2, 3]);
        assert_eq!(out.to_f64_vec(), vec![7.0, 0.0, 1.0, 7.0, 7.0, 7.0]);
        let x = fact(DType::F32, "N,C,H,W");
        let pads = Fact::symbolic(dims("0,0,1,1,0,0,1,1"), false);
        assert_eq!(out_shape(&*constant, &[&x, &pads]), "[N,C,H+2,W+2]");
        // Opset 18 axes: pads only for the listed axes.
        let v18 = parse("Pad", 18, vec![], 4, 1).unwrap();
        let x2 = fact(DType::F32, "N,C,H,W");
        let none = Fact::new(DType::F32, vec![]);
        assert_eq!(out_shape(&*v18, &[&x2, &ints(&[2, 3, 2, 3]), &none, &ints(&[-1, 2])]), "[N,C,H+6,W+4]");
        let v2 = parse("Pad", 2, vec![("pads", Attr::Ints(vec![1, 1])), ("value", Attr::Float(-1.0))], 1, 1).unwrap();
        assert_eq!(eval1(&*v2, &[&iota(&[1])]).to_f64_vec(), vec![-1.0, 0.0, -1.0]);
        let msg = constant.infer(&[Some(&x), Some(&ints(&[1, 1]))]).unwrap_err().0;
        assert!(msg.contains("expected 8"), "{msg}");
    }

    #[test]
    fn slice_with_runtime_bounds() {
        let dd = Dim::data_dependent();
        let op = parse("Slice", 13, vec![], 4, 1).unwrap();
        let x = fact(DType::F32, "N,8,0");
        let rt = fact(DType::I64, "1");
        // Only the sliced axis depends on the data.
        let out = op.infer(&[Some(&x), Some(&rt), Some(&ints(&[5])), Some(&ints(&[1]))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), dd.clone(), Dim::known(0)]);
        // Run-time axes: every non-empty axis may be the sliced one.
        let out = op.infer(&[Some(&x), Some(&ints(&[0])), Some(&ints(&[2])), Some(&rt)]).unwrap();
        assert_eq!(out[0].shape(), &[dd.clone(), dd.clone(), Dim::known(0)]);
        let with_steps = parse("Slice", 13, vec![], 5, 1).unwrap();
        let out =
            with_steps.infer(&[Some(&x), Some(&ints(&[0])), Some(&ints(&[4])), Some(&ints(&[1])), Some(&rt)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), dd, Dim::known(0)]);
        let t = eval1(&*op, &[&iota(&[2, 8]), &t_ints(&[-3]), &t_ints(&[I64_MAX]), &t_ints(&[1])]);
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.to_f64_vec(), [5.0, 6.0, 7.0, 13.0, 14.0, 15.0]);
    }

    #[test]
    fn pad_and_split_with_runtime_sizes() {
        let dd = Dim::data_dependent();
        let pad = parse("Pad", 18, vec![], 4, 1).unwrap();
        let x = fact(DType::F32, "N,4");
        let out = pad.infer(&[Some(&x), Some(&fact(DType::I64, "2")), None, Some(&ints(&[1]))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), dd.clone()]);
        let split = parse("Split", 13, vec![("axis", Attr::Int(1))], 2, 2).unwrap();
        let out = split.infer(&[Some(&x), Some(&fact(DType::I64, "2"))]).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].shape(), &[Dim::sym("N"), dd]);
        let msg = split.infer(&[Some(&x), Some(&fact(DType::I64, "3"))]).unwrap_err().0;
        assert!(msg.contains("3 entries for 2 outputs"), "{msg}");
    }

    #[test]
    fn nonzero_shapes_and_values() {
        let op = parse("NonZero", 13, vec![], 1, 1).unwrap();
        let out = op.infer(&[Some(&fact(DType::F32, "N,3"))]).unwrap();
        assert_eq!(out[0].dtype(), DType::I64);
        assert_eq!(out[0].shape(), &[Dim::known(2), Dim::data_dependent()]);
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "0,3")]), "[2,0]");
        // Values checked against onnxruntime 1.32: NaN is non-zero, -0.0 is zero.
        let x = t_f32(&[2, 3], vec![0.0, 1.0, 0.0, 2.0, f32::NAN, -0.0]);
        assert_eq!(out_shape(&*op, &[&Fact::constant(std::sync::Arc::new(x.clone()))]), "[2,3]");
        let t = eval1(&*op, &[&x]);
        assert_eq!(t.shape(), &[2, 3]);
        assert_eq!(t.to_i64_vec(), vec![0, 1, 1, 1, 0, 1]);
        // A 0-D input reads as 1-D, as onnxruntime does.
        let t = eval1(&*op, &[&Tensor::from_f32s(&[], vec![3.0])]);
        assert_eq!((t.shape().to_vec(), t.to_i64_vec()), (vec![1, 1], vec![0]));
    }

    #[test]
    fn topk_shapes_values_and_ties() {
        let op = parse("TopK", 11, vec![("axis", Attr::Int(1))], 2, 2).unwrap();
        let x = fact(DType::F32, "N,5");
        let out = op.infer(&[Some(&x), Some(&ints(&[3]))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(3)]);
        assert_eq!(out[1].dtype(), DType::I64);
        let out = op.infer(&[Some(&x), Some(&fact(DType::I64, "1"))]).unwrap();
        assert_eq!(out[1].shape(), &[Dim::sym("N"), Dim::data_dependent()]);
        let msg = op.infer(&[Some(&x), Some(&ints(&[6]))]).unwrap_err().0;
        assert!(msg.contains("exceeds the size 5"), "{msg}");
        // Values and tie order checked against onnxruntime 1.32.
        let data = t_f32(&[2, 5], vec![3.0, 1.0, 3.0, 2.0, 5.0, 1.0, 1.0, 1.0, 0.0, 7.0]);
        let run = |op: &dyn crate::ir::Op, x: &Tensor, k: i64| {
            let k = t_ints(&[k]);
            op.eval(&[Some(x), Some(&k)]).unwrap()
        };
        let r = run(&*op, &data, 3);
        assert_eq!(r[0].to_f64_vec(), [5.0, 3.0, 3.0, 7.0, 1.0, 1.0]);
        assert_eq!(r[1].to_i64_vec(), vec![4, 0, 2, 4, 0, 1]);
        let smallest = parse("TopK", 11, vec![("axis", Attr::Int(-1)), ("largest", Attr::Int(0))], 2, 2).unwrap();
        let r = run(&*smallest, &data, 3);
        assert_eq!(r[0].to_f64_vec(), [1.0, 2.0, 3.0, 0.0, 1.0, 1.0]);
        assert_eq!(r[1].to_i64_vec(), vec![1, 3, 0, 3, 0, 1]);
        // NaN ranks above every number.
        let nan = t_f32(&[5], vec![1.0, f32::NAN, 3.0, f32::NAN, 2.0]);
        let r = run(&*op_axis0(), &nan, 4);
        assert_eq!(r[1].to_i64_vec(), vec![1, 3, 2, 4]);
        let r =
            run(&*parse("TopK", 11, vec![("axis", Attr::Int(0)), ("largest", Attr::Int(0))], 2, 2).unwrap(), &nan, 4);
        assert_eq!(r[1].to_i64_vec(), vec![0, 4, 2, 1]);
        // Opset 1: k is an attribute.
        let v1 = parse("TopK", 1, vec![("k", Attr::Int(2))], 1, 2).unwrap();
        let r = v1.eval(&[Some(&data)]).unwrap();
        assert_eq!(r[0].to_f64_vec(), [5.0, 3.0, 7.0, 1.0]);
        assert!(parse("TopK", 10, vec![], 1, 2).is_err());
    }

    fn op_axis0() -> Box<dyn crate::ir::Op> {
        parse("TopK", 11, vec![("axis", Attr::Int(0))], 2, 2).unwrap()
    }
}
