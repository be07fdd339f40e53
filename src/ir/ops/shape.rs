//! The shape op family: ops that change how elements are laid out without computing on them
//! (Reshape, Flatten, Squeeze, Unsqueeze, Transpose, Expand, Tile) and ops that read shapes
//! (Shape, Size).
//!
//! Symbolic shape propagation is the point of this family: shape-like inputs are read through
//! `Fact::as_dims`, so a batch dim `N` that reaches `Reshape` through `Shape → Gather → Concat`
//! stays `N` in the output type, and small int64 "shape tensors" moved by these ops keep their
//! symbolic contents (`Fact::sym`) so the inference driver can fold them. The helpers at the top
//! are shared with the indexing and generator families.

use super::OpSpec;
use crate::ir::broadcast::{broadcast_shapes, broadcast_usize, normalize_axes};
use crate::ir::dim::{dims_of, fmt_shape, product};
use crate::ir::{optional, required, DType, Dim, Fact, NodeCtx, Op, OpError, OpResult, Tensor, ValueType};
use crate::reference::indexing as kernels;
use crate::{map_tensor, op_bail, op_ensure};
use std::any::Any;

/// The restriction `onnx2ait ops` states for Squeeze/Unsqueeze.
const RUNTIME_AXES: &str = "'axes' may be a run-time value (e.g. a graph input) of static length for the reference \
     executor and validate; code generation needs it known at compile time";

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Reshape", parse_reshape),
    OpSpec::onnx("Flatten", parse_flatten),
    OpSpec::onnx("Squeeze", parse_squeeze).with_note(RUNTIME_AXES),
    OpSpec::onnx("Unsqueeze", parse_unsqueeze).with_note(RUNTIME_AXES),
    OpSpec::onnx("Transpose", parse_transpose),
    OpSpec::onnx("Expand", parse_expand),
    OpSpec::onnx("Tile", parse_tile),
    OpSpec::onnx("Shape", parse_shape),
    OpSpec::onnx("Size", parse_size),
];

// ---------------------------------------------------------------------------------------------
// Helpers shared by the data-movement families.

/// Longest constant tensor whose contents are carried symbolically through data-movement ops.
/// Shape tensors are a handful of elements; the bound keeps large int constants (token tables)
/// from being turned into `Dim`s element by element.
pub(crate) const MAX_SYM_LEN: i64 = 1024;

/// Reads a shape-like input (a 0-D or 1-D integer tensor) as dims, symbolic ones included.
pub(crate) fn dims_input(f: &Fact, what: &str) -> OpResult<Vec<Dim>> {
    op_ensure!(f.dtype().is_int(), "input '{what}' must be an integer tensor, found {}", f.dtype());
    op_ensure!(f.rank() <= 1, "input '{what}' must be 1-D, found shape {}", fmt_shape(f.shape()));
    f.as_dims().ok_or_else(|| OpError(format!("input '{what}' must be a compile-time constant or shape expression")))
}

/// Reads a shape-like input whose contents may only be known at run time: its values as dims
/// when known (constant or symbolic), otherwise one `Dim::data_dependent()` per element. The
/// input must be 1-D with a static length, since that length fixes the output rank.
pub(crate) fn runtime_dims_input(f: &Fact, what: &str) -> OpResult<Vec<Dim>> {
    op_ensure!(f.dtype().is_int(), "input '{what}' must be an integer tensor, found {}", f.dtype());
    op_ensure!(f.rank() <= 1, "input '{what}' must be 1-D, found shape {}", fmt_shape(f.shape()));
    if let Some(d) = f.as_dims() {
        return Ok(d);
    }
    let len = match f.shape() {
        [] => Some(1),
        [n] => n.as_known(),
        _ => None,
    };
    match len {
        Some(n) if n >= 0 => Ok(vec![Dim::data_dependent(); n as usize]),
        _ => op_bail!(
            "input '{what}' is only known at run time and its length {} is not static, so the output rank is unknown",
            fmt_shape(f.shape())
        ),
    }
}

/// Reads an input whose values must be plain integers at compile time (axes, steps).
pub(crate) fn ints_input(f: &Fact, what: &str) -> OpResult<Vec<i64>> {
    let dims = dims_input(f, what)?;
    dims.iter()
        .map(|d| d.as_known())
        .collect::<Option<Vec<i64>>>()
        .ok_or_else(|| OpError(format!("input '{what}' must be known at compile time, found {}", fmt_shape(&dims))))
}

/// The values of an integer input at evaluation time.
pub(crate) fn tensor_ints(t: &Tensor, what: &str) -> OpResult<Vec<i64>> {
    op_ensure!(t.dtype().is_int(), "input '{what}' must be an integer tensor, found {}", t.dtype());
    op_ensure!(t.rank() <= 1, "input '{what}' must be 1-D, found shape {:?}", t.shape());
    Ok(t.to_i64_vec())
}

/// The contents of a small integer tensor as dims, when known (constant or symbolic).
pub(crate) fn sym_values(f: &Fact) -> Option<Vec<Dim>> {
    if !f.dtype().is_int() || f.rank() > 1 {
        return None;
    }
    if f.sym.is_none() {
        let len = f.shape().first().map_or(Some(1), Dim::as_known)?;
        if len > MAX_SYM_LEN {
            return None;
        }
    }
    f.as_dims()
}

/// An output fact carrying symbolic contents when they are known and fit its shape.
pub(crate) fn fact_with_sym(dtype: DType, shape: Vec<Dim>, values: Option<Vec<Dim>>) -> Fact {
    let fits = |v: &Vec<Dim>| match shape.as_slice() {
        [] => v.len() == 1,
        [n] => n.as_known() == Some(v.len() as i64),
        _ => false,
    };
    let sym = values.filter(|v| dtype.is_int() && fits(v));
    Fact { ty: ValueType::new(dtype, shape), konst: None, sym }
}

/// Concrete sizes of a shape computed at evaluation time (every dim known and non-negative).
pub(crate) fn concrete(shape: &[Dim]) -> OpResult<Vec<usize>> {
    shape
        .iter()
        .map(|d| match d.as_known() {
            Some(v) if v >= 0 => Ok(v as usize),
            _ => Err(OpError(format!("invalid output shape {}", fmt_shape(shape)))),
        })
        .collect()
}

fn reshape_tensor(t: &Tensor, shape: &[usize]) -> OpResult<Tensor> {
    t.reshaped(shape).ok_or_else(|| OpError(format!("cannot reshape {:?} into {shape:?}", t.shape())))
}

// ---------------------------------------------------------------------------------------------
// Reshape

/// Output shape of `Reshape`: 0 copies the input dim (unless `allowzero`), one -1 is inferred
/// from the element count, symbolic entries are taken as they are.
pub fn reshape_dims(input: &[Dim], target: &[Dim], allowzero: bool) -> OpResult<Vec<Dim>> {
    let mut out = Vec::with_capacity(target.len());
    let mut infer_at = None;
    let mut has_zero = false;
    for (i, t) in target.iter().enumerate() {
        match t.as_known() {
            Some(-1) => {
                op_ensure!(infer_at.is_none(), "shape {} contains more than one -1", fmt_shape(target));
                infer_at = Some(i);
                out.push(Dim::known(1));
            }
            Some(0) if !allowzero => match input.get(i) {
                Some(d) => out.push(d.clone()),
                None => op_bail!(
                    "shape {} copies dim {i} (0) but the input {} has rank {}",
                    fmt_shape(target),
                    fmt_shape(input),
                    input.len()
                ),
            },
            Some(v) if v < -1 => {
                op_bail!("shape {} contains the invalid dim {v}", fmt_shape(target))
            }
            Some(0) => {
                has_zero = true;
                out.push(Dim::known(0));
            }
            _ => out.push(t.clone()),
        }
    }
    op_ensure!(
        !(has_zero && infer_at.is_some()),
        "with allowzero=1 the shape {} cannot contain both 0 and -1",
        fmt_shape(target)
    );
    let total = product(input);
    if let Some(i) = infer_at {
        let rest = product(&out);
        op_ensure!(
            rest.as_known() != Some(0),
            "cannot infer the -1 in {} from {}: the other dims have no elements",
            fmt_shape(target),
            fmt_shape(input)
        );
        if let (Some(t), Some(r)) = (total.as_known(), rest.as_known()) {
            op_ensure!(t % r == 0, "cannot reshape {} ({t} elements) into {}", fmt_shape(input), fmt_shape(target));
        }
        out[i] = total.div_floor(&rest);
    } else {
        // Symbolic counts can only be compared when their difference is a plain number.
        let diff = total.sub(&product(&out));
        op_ensure!(
            diff.as_known().is_none_or(|d| d == 0),
            "cannot reshape {} ({total} elements) into {} ({} elements)",
            fmt_shape(input),
            fmt_shape(&out),
            product(&out)
        );
    }
    Ok(out)
}

#[derive(Clone, Debug)]
pub struct Reshape {
    pub allowzero: bool,
    /// The target shape of opsets 1-4, which was an attribute; `None` reads input 1.
    pub attr_shape: Option<Vec<i64>>,
}

impl Reshape {
    fn target(&self, f: Option<&Fact>) -> OpResult<Vec<Dim>> {
        match &self.attr_shape {
            Some(s) => Ok(s.iter().map(|&v| Dim::known(v)).collect()),
            None => {
                runtime_dims_input(f.ok_or_else(|| OpError("input 1 (shape) is required but missing".into()))?, "shape")
            }
        }
    }
}

impl Op for Reshape {
    fn op_type(&self) -> &'static str {
        "Reshape"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let data = required(inputs, 0, "data")?;
        let target = self.target(optional(inputs, 1))?;
        // A run-time shape (0 and -1 entries included) is resolved by evaluation: every dim is
        // data-dependent and only the rank is static.
        let out = if target.iter().any(Dim::is_data_dependent_marker) {
            target
        } else {
            reshape_dims(data.shape(), &target, self.allowzero)?
        };
        Ok(vec![fact_with_sym(data.dtype(), out, sym_values(data))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let data = required(inputs, 0, "data")?;
        let target: Vec<Dim> = match &self.attr_shape {
            Some(s) => s.iter().map(|&v| Dim::known(v)).collect(),
            None => tensor_ints(required(inputs, 1, "shape")?, "shape")?.into_iter().map(Dim::known).collect(),
        };
        let out = concrete(&reshape_dims(&dims_of(data.shape()), &target, self.allowzero)?)?;
        Ok(vec![reshape_tensor(data, &out)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Reshape. Opsets 1-4: target shape in the `shape` attribute. Opset 5: target shape as input 1
/// (read through `as_dims`, so symbolic entries from shape subgraphs survive; a shape only known
/// at run time gives data-dependent dims of its static length). Opset 14: adds
/// `allowzero` (1 makes 0 an actual zero-sized dim instead of "copy the input dim").
fn parse_reshape(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let attr_shape = if ctx.opset < 5 { Some(ctx.req_ints("shape")?) } else { None };
    let allowzero = if ctx.opset >= 14 { ctx.flag("allowzero", false)? } else { false };
    Ok(Box::new(Reshape { allowzero, attr_shape }))
}

// ---------------------------------------------------------------------------------------------
// Flatten

#[derive(Clone, Debug)]
pub struct Flatten {
    pub axis: i64,
}

impl Flatten {
    fn out_shape(&self, shape: &[Dim]) -> OpResult<Vec<Dim>> {
        let r = shape.len() as i64;
        op_ensure!((-r..=r).contains(&self.axis), "axis {} is out of range for rank {r}", self.axis);
        let a = if self.axis < 0 { self.axis + r } else { self.axis } as usize;
        Ok(vec![product(&shape[..a]), product(&shape[a..])])
    }
}

impl Op for Flatten {
    fn op_type(&self) -> &'static str {
        "Flatten"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        Ok(vec![Fact::new(x.dtype(), self.out_shape(x.shape())?)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        let out = concrete(&self.out_shape(&dims_of(x.shape()))?)?;
        Ok(vec![reshape_tensor(x, &out)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Flatten to 2-D around `axis` (default 1; `axis` = rank gives `[prod, 1]`). Opset 11 allows
/// negative axes; they are accepted for every opset since older models never contain them.
/// Opsets 9/13 only widened the type list.
fn parse_flatten(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Flatten { axis: ctx.int_or("axis", 1)? }))
}

// ---------------------------------------------------------------------------------------------
// Squeeze / Unsqueeze

/// Where Squeeze/Unsqueeze read their axes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AxesFrom {
    /// The `axes` attribute of opsets before 13 (`None`: attribute absent).
    Attr(Option<Vec<i64>>),
    /// Input 1 (opset 13 and later), optional for Squeeze.
    Input,
}

/// The axes at inference: known values, or only their count when input 1 is a run-time value.
enum InferAxes {
    Known(Option<Vec<i64>>),
    /// `n` axes (n > 0) whose values are read at run time.
    Runtime(usize),
}

fn axes_at_infer(from: &AxesFrom, inputs: &[Option<&Fact>]) -> OpResult<InferAxes> {
    let f = match from {
        AxesFrom::Attr(a) => return Ok(InferAxes::Known(a.clone())),
        AxesFrom::Input => match optional(inputs, 1) {
            None => return Ok(InferAxes::Known(None)),
            Some(f) => f,
        },
    };
    op_ensure!(f.dtype().is_int(), "input 'axes' must be an integer tensor, found {}", f.dtype());
    op_ensure!(f.rank() <= 1, "input 'axes' must be 1-D, found shape {}", fmt_shape(f.shape()));
    if f.as_dims().is_some() {
        return Ok(InferAxes::Known(Some(ints_input(f, "axes")?)));
    }
    match runtime_axes_len(f, "axes")? {
        0 => Ok(InferAxes::Known(Some(Vec::new()))),
        n => Ok(InferAxes::Runtime(n)),
    }
}

/// The number of axes in an axes input known only at run time; it must be static, since it
/// fixes the output rank.
pub(crate) fn runtime_axes_len(f: &Fact, what: &str) -> OpResult<usize> {
    match f.shape() {
        [] => Ok(1),
        [n] => match n.as_known() {
            Some(n) if n >= 0 => Ok(n as usize),
            _ => op_bail!(
                "input '{what}' is only known at run time and its length {n} is not static, so the output rank is unknown"
            ),
        },
        s => op_bail!("input '{what}' must be 1-D, found shape {}", fmt_shape(s)),
    }
}

/// One output dim that is one of `candidates` depending on run-time axes: that dim when they
/// all agree, else `Dim::data_dependent()`.
fn one_of(candidates: impl IntoIterator<Item = Dim>) -> Dim {
    let mut it = candidates.into_iter();
    let first = it.next().unwrap_or_else(Dim::data_dependent);
    if it.all(|d| d == first) {
        first
    } else {
        Dim::data_dependent()
    }
}

/// The shape after removing `n` axes whose positions are known only at run time: output dim
/// `i` is one of input dims `i..=i+n`.
pub(crate) fn dims_without_runtime_axes(shape: &[Dim], n: usize) -> OpResult<Vec<Dim>> {
    op_ensure!(n <= shape.len(), "{n} axes given for rank {}", shape.len());
    Ok((0..shape.len() - n).map(|i| one_of(shape[i..=i + n].iter().cloned())).collect())
}

/// The shape after inserting `n` 1s at positions known only at run time: output dim `i` is 1
/// or one of input dims `i-n..=i`.
fn dims_with_runtime_axes(shape: &[Dim], n: usize) -> Vec<Dim> {
    let r = shape.len();
    (0..r + n)
        .map(|i| {
            let from = i.saturating_sub(n);
            let upto = i.min(r.saturating_sub(1));
            let kept = if r == 0 || from > upto { &shape[0..0] } else { &shape[from..=upto] };
            one_of(std::iter::once(Dim::known(1)).chain(kept.iter().cloned()))
        })
        .collect()
}

fn axes_at_eval(from: &AxesFrom, inputs: &[Option<&Tensor>]) -> OpResult<Option<Vec<i64>>> {
    match from {
        AxesFrom::Attr(a) => Ok(a.clone()),
        AxesFrom::Input => optional(inputs, 1).map(|t| tensor_ints(t, "axes")).transpose(),
    }
}

/// Shape after removing `axes` (or every known 1 when `axes` is absent).
fn squeeze_dims(shape: &[Dim], axes: Option<&[i64]>) -> OpResult<Vec<Dim>> {
    // An empty `axes` input means "no axes given" (as in ONNX Runtime), not "squeeze nothing".
    let remove: Vec<usize> = match axes.filter(|a| !a.is_empty()) {
        Some(axes) => {
            let axes = normalize_axes(axes, shape.len())?;
            for &a in &axes {
                // A symbolic dim being squeezed is 1 at run time by the model's contract.
                if let Some(v) = shape[a].as_known() {
                    op_ensure!(v == 1, "cannot squeeze axis {a} of shape {}: its size is {v}, not 1", fmt_shape(shape));
                }
            }
            axes
        }
        None => {
            if let Some(d) = shape.iter().find(|d| !d.is_known()) {
                op_bail!(
                    "Squeeze without axes on shape {} cannot tell whether the symbolic dim {d} is 1; give 'axes'",
                    fmt_shape(shape)
                );
            }
            (0..shape.len()).filter(|&i| shape[i].as_known() == Some(1)).collect()
        }
    };
    Ok(shape.iter().enumerate().filter(|(i, _)| !remove.contains(i)).map(|(_, d)| d.clone()).collect())
}

/// Shape after inserting 1s at `axes` (positions in the output).
fn unsqueeze_dims(shape: &[Dim], axes: &[i64]) -> OpResult<Vec<Dim>> {
    let out_rank = shape.len() + axes.len();
    let axes = normalize_axes(axes, out_rank)?;
    let mut rest = shape.iter();
    (0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                Ok(Dim::known(1))
            } else {
                rest.next().cloned().ok_or_else(|| OpError("internal: unsqueeze rank mismatch".into()))
            }
        })
        .collect()
}

#[derive(Clone, Debug)]
pub struct Squeeze {
    pub axes: AxesFrom,
}

impl Op for Squeeze {
    fn op_type(&self) -> &'static str {
        "Squeeze"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let out = match axes_at_infer(&self.axes, inputs)? {
            InferAxes::Known(axes) => squeeze_dims(x.shape(), axes.as_deref())?,
            // Each squeezed dim must be 1 at run time; which ones is read then.
            InferAxes::Runtime(n) => dims_without_runtime_axes(x.shape(), n)?,
        };
        Ok(vec![fact_with_sym(x.dtype(), out, sym_values(x))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let axes = axes_at_eval(&self.axes, inputs)?;
        let out = concrete(&squeeze_dims(&dims_of(x.shape()), axes.as_deref())?)?;
        Ok(vec![reshape_tensor(x, &out)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Squeeze. Before opset 13 the axes are the optional `axes` attribute (negative values from
/// opset 11); from opset 13 they are the optional int64 input 1. Without axes every dim of
/// size 1 is removed, which needs a fully known shape (a symbolic dim could be 1 or not).
fn parse_squeeze(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let axes = if ctx.opset >= 13 { AxesFrom::Input } else { AxesFrom::Attr(ctx.ints("axes")?) };
    Ok(Box::new(Squeeze { axes }))
}

#[derive(Clone, Debug)]
pub struct Unsqueeze {
    pub axes: AxesFrom,
}

impl Op for Unsqueeze {
    fn op_type(&self) -> &'static str {
        "Unsqueeze"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let out = match axes_at_infer(&self.axes, inputs)? {
            InferAxes::Known(Some(axes)) => unsqueeze_dims(x.shape(), &axes)?,
            InferAxes::Known(None) => op_bail!("input 1 (axes) is required but missing"),
            InferAxes::Runtime(n) => dims_with_runtime_axes(x.shape(), n),
        };
        Ok(vec![fact_with_sym(x.dtype(), out, sym_values(x))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let axes = axes_at_eval(&self.axes, inputs)?
            .ok_or_else(|| OpError("input 1 (axes) is required but missing".into()))?;
        let out = concrete(&unsqueeze_dims(&dims_of(x.shape()), &axes)?)?;
        Ok(vec![reshape_tensor(x, &out)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Unsqueeze. Before opset 13 the axes are the required `axes` attribute (negative values from
/// opset 11); from opset 13 they are the required int64 input 1. Axes index the output, so
/// `[0, 2]` on `[N, S]` gives `[1, N, 1, S]`.
fn parse_unsqueeze(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let axes = if ctx.opset >= 13 { AxesFrom::Input } else { AxesFrom::Attr(Some(ctx.req_ints("axes")?)) };
    Ok(Box::new(Unsqueeze { axes }))
}

// ---------------------------------------------------------------------------------------------
// Transpose

#[derive(Clone, Debug)]
pub struct Transpose {
    /// `None`: reverse the axes.
    pub perm: Option<Vec<i64>>,
}

impl Transpose {
    fn perm(&self, rank: usize) -> OpResult<Vec<usize>> {
        match &self.perm {
            None => Ok((0..rank).rev().collect()),
            Some(p) => {
                op_ensure!(p.len() == rank, "perm {p:?} has {} entries for an input of rank {rank}", p.len());
                let mut seen = vec![false; rank];
                p.iter()
                    .map(|&a| {
                        op_ensure!(
                            (0..rank as i64).contains(&a) && !seen[a as usize],
                            "perm {p:?} is not a permutation of 0..{rank}"
                        );
                        seen[a as usize] = true;
                        Ok(a as usize)
                    })
                    .collect()
            }
        }
    }
}

impl Op for Transpose {
    fn op_type(&self) -> &'static str {
        "Transpose"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let perm = self.perm(x.rank())?;
        let out: Vec<Dim> = perm.iter().map(|&p| x.shape()[p].clone()).collect();
        // Transposing a 0-D or 1-D tensor is the identity, so shape tensors keep their contents.
        Ok(vec![fact_with_sym(x.dtype(), out, sym_values(x))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let perm = self.perm(x.rank())?;
        Ok(vec![map_tensor!(x, a => kernels::transpose(a, &perm))])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Transpose with the `perm` attribute (default: reversed axes). Unchanged since opset 1
/// except for types (13).
fn parse_transpose(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Transpose { perm: ctx.ints("perm")? }))
}

// ---------------------------------------------------------------------------------------------
// Expand

#[derive(Clone, Debug)]
pub struct Expand;

impl Op for Expand {
    fn op_type(&self) -> &'static str {
        "Expand"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        let shape_fact = required(inputs, 1, "shape")?;
        let shape = runtime_dims_input(shape_fact, "shape")?;
        let out = if shape.iter().any(Dim::is_data_dependent_marker) {
            expand_runtime_dims(x.shape(), &shape)?
        } else {
            broadcast_shapes(&[x.shape(), &shape])?
        };
        // A broadcast shape tensor: the values of a 0-D/1-element input repeated.
        let sym = sym_values(x).and_then(|v| match (out.as_slice(), v.len()) {
            ([], 1) => Some(v),
            ([n], 1) => n.as_known().filter(|&n| n <= MAX_SYM_LEN).map(|n| vec![v[0].clone(); n as usize]),
            ([_], _) => Some(v),
            _ => None,
        });
        Ok(vec![fact_with_sym(x.dtype(), out, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        let shape = tensor_ints(required(inputs, 1, "shape")?, "shape")?;
        let shape: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| OpError(format!("shape {shape:?} has a negative dim"))))
            .collect::<OpResult<_>>()?;
        let out = broadcast_usize(&[x.shape(), &shape])?;
        Ok(vec![crate::with_tensor!(x, a => kernels::expand(a, &out).map(crate::ir::Elem::wrap))?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Output dims of `Expand` when some `shape` entries are only known at run time: a known input
/// dim other than 1 decides its axis (the entry must be 1 or equal to it); every other axis
/// with a run-time entry is data-dependent.
fn expand_runtime_dims(x: &[Dim], shape: &[Dim]) -> OpResult<Vec<Dim>> {
    let rank = x.len().max(shape.len());
    (0..rank)
        .map(|axis| {
            let xd = (axis + x.len()).checked_sub(rank).map(|i| &x[i]);
            let sd = (axis + shape.len()).checked_sub(rank).map(|i| &shape[i]);
            match (xd, sd) {
                (Some(d), None) => Ok(d.clone()),
                (None, Some(s)) => Ok(s.clone()),
                (Some(d), Some(s)) if s.is_data_dependent_marker() => Ok(match d.as_known() {
                    Some(v) if v != 1 => d.clone(),
                    _ => Dim::data_dependent(),
                }),
                (Some(d), Some(s)) => Ok(broadcast_shapes(&[std::slice::from_ref(d), std::slice::from_ref(s)])
                    .map_err(|e| OpError(format!("axis {axis}: {}", e.0)))?[0]
                    .clone()),
                (None, None) => Ok(Dim::known(1)),
            }
        })
        .collect()
}

/// Expand (opset 8): numpy-style bidirectional broadcast of the input with the `shape` input,
/// so a 1 in `shape` keeps the input dim. `shape` is read through `as_dims`; symbolic entries
/// (e.g. `[N, 1, S]` from a shape subgraph) become the output dims. A `shape` only known at run
/// time (a graph input) gives data-dependent dims where the input does not decide them; the
/// output rank is still static because `shape` has a static length.
fn parse_expand(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Expand))
}

// ---------------------------------------------------------------------------------------------
// Tile

#[derive(Clone, Debug)]
pub struct Tile;

impl Op for Tile {
    fn op_type(&self) -> &'static str {
        "Tile"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        let reps = runtime_dims_input(required(inputs, 1, "repeats")?, "repeats")?;
        op_ensure!(
            reps.len() == x.rank(),
            "repeats {} must have one entry per input dim (rank {})",
            fmt_shape(&reps),
            x.rank()
        );
        if let Some(r) = reps.iter().find(|r| r.as_known().is_some_and(|v| v < 0)) {
            op_bail!("repeats {} contains the negative count {r}", fmt_shape(&reps));
        }
        let out: Vec<Dim> = x
            .shape()
            .iter()
            .zip(&reps)
            .map(|(d, r)| match (r.is_data_dependent_marker(), d.as_known()) {
                (true, Some(0)) => Dim::known(0),
                (true, _) => Dim::data_dependent(),
                (false, _) => d.mul(r),
            })
            .collect();
        let sym = match (sym_values(x), reps.first().and_then(Dim::as_known)) {
            // `repeats` is model-controlled: a negative or huge count is no shape tensor to fold.
            (Some(v), Some(r))
                if x.rank() == 1 && r >= 0 && (v.len() as i64).checked_mul(r).is_some_and(|n| n <= MAX_SYM_LEN) =>
            {
                Some(v.iter().cycle().take(v.len() * r as usize).cloned().collect())
            }
            _ => None,
        };
        Ok(vec![fact_with_sym(x.dtype(), out, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        let reps = tensor_ints(required(inputs, 1, "repeats")?, "repeats")?;
        op_ensure!(reps.len() == x.rank(), "repeats {reps:?} must have one entry per input dim (rank {})", x.rank());
        let reps: Vec<usize> = reps
            .iter()
            .map(|&r| usize::try_from(r).map_err(|_| OpError(format!("repeats {reps:?} has a negative count"))))
            .collect::<OpResult<_>>()?;
        Ok(vec![map_tensor!(x, a => kernels::tile(a, &reps))])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Tile with the `repeats` input (opset 6; opset 1's `tiles`/`axis` inputs are rejected).
/// Repeats are read through `as_dims`, so a symbolic repeat count multiplies the dim; repeats
/// only known at run time make the output dims data-dependent (a zero-sized dim stays zero).
fn parse_tile(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    op_ensure!(ctx.opset >= 6, "Tile of opset {} (tiles/axis inputs) is not supported; opset 6 or later is", ctx.opset);
    Ok(Box::new(Tile))
}

// ---------------------------------------------------------------------------------------------
// Shape / Size

#[derive(Clone, Debug)]
pub struct Shape {
    pub start: i64,
    pub end: Option<i64>,
}

impl Shape {
    /// The `[start, end)` range of dims taken, clamped like the spec says (never an error).
    fn range(&self, rank: usize) -> (usize, usize) {
        let r = rank as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let s = clamp(self.start);
        let e = clamp(self.end.unwrap_or(r));
        (s, e.max(s))
    }
}

impl Op for Shape {
    fn op_type(&self) -> &'static str {
        "Shape"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        let (s, e) = self.range(x.rank());
        Ok(vec![Fact::symbolic(x.shape()[s..e].to_vec(), false)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        let (s, e) = self.range(x.rank());
        let dims: Vec<i64> = x.shape()[s..e].iter().map(|&d| d as i64).collect();
        Ok(vec![Tensor::from_i64s(&[dims.len()], dims)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Shape: the input's dims as a 1-D int64 tensor whose contents are symbolic (`Fact::sym`), so
/// `[N,3,224,224]` flows into Gather/Concat/Reshape as `N` and folds when `N` is static.
/// Opset 15 adds `start`/`end` (negative counts from the back, clamped to `[0, rank]`).
fn parse_shape(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let (start, end) = if ctx.opset >= 15 { (ctx.int_or("start", 0)?, ctx.int("end")?) } else { (0, None) };
    Ok(Box::new(Shape { start, end }))
}

#[derive(Clone, Debug)]
pub struct Size;

impl Op for Size {
    fn op_type(&self) -> &'static str {
        "Size"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        Ok(vec![Fact::symbolic(vec![product(x.shape())], true)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        Ok(vec![Tensor::from_i64s(&[], vec![x.len() as i64])])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Size: the element count as a 0-D int64 tensor, symbolic (`N*3*224*224`) when the shape is.
/// Unchanged since opset 1 except for types.
fn parse_size(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Size))
}

#[cfg(test)]
mod tests {
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::testutil::*;
    use crate::ir::{Attr, DType, Dim, Fact};
    use std::collections::BTreeMap;

    #[test]
    fn reshape_keeps_symbolic_dims() {
        let op = parse("Reshape", 13, vec![], 2, 1).unwrap();
        let x = fact(DType::F32, "N,S,768");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[0, 0, 12, 64])]), "[N,S,12,64]");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[-1, 768])]), "[N*S,768]");
        assert_eq!(out_shape(&*op, &[&x, &ints(&[0, -1])]), "[N,768*S]");
        // A symbolic target from a shape subgraph.
        let target = Fact::symbolic(vec![Dim::sym("N"), Dim::known(-1)], false);
        let pooled = fact(DType::F32, "N,2048,1,1");
        assert_eq!(out_shape(&*op, &[&pooled, &target]), "[N,2048]");
    }

    #[test]
    fn reshape_errors_are_clear() {
        let op = parse("Reshape", 13, vec![], 2, 1).unwrap();
        let x = fact(DType::F32, "2,3");
        let err = |shape: &[i64]| op.infer(&[Some(&x), Some(&ints(shape))]).unwrap_err().0;
        assert!(err(&[-1, -1]).contains("more than one -1"), "{}", err(&[-1, -1]));
        assert!(err(&[4]).contains("cannot reshape [2,3] (6 elements) into [4]"), "{}", err(&[4]));
        assert!(err(&[4, -1]).contains("cannot reshape"), "{}", err(&[4, -1]));
        assert!(err(&[0, 0, 0]).contains("copies dim 2"), "{}", err(&[0, 0, 0]));
        // A run-time shape of static length gives data-dependent dims of that rank; one of
        // unknown length leaves the rank unknown, which is an error.
        let runtime = fact(DType::I64, "2");
        let out = op.infer(&[Some(&x), Some(&runtime)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::data_dependent(), Dim::data_dependent()]);
        let unknown_len = fact(DType::I64, "R");
        let msg = op.infer(&[Some(&x), Some(&unknown_len)]).unwrap_err().0;
        assert!(msg.contains("is not static"), "{msg}");
        let az = parse("Reshape", 14, vec![("allowzero", Attr::Int(1))], 2, 1).unwrap();
        assert!(az.infer(&[Some(&x), Some(&ints(&[0, -1]))]).is_err());
    }

    #[test]
    fn reshape_eval_and_allowzero() {
        let op = parse("Reshape", 13, vec![], 2, 1).unwrap();
        let out = eval1(&*op, &[&iota(&[2, 3, 4]), &t_ints(&[0, -1])]);
        assert_eq!(out.shape(), &[2, 12]);
        assert_eq!(out.to_f64_vec()[13], 13.0);
        let az = parse("Reshape", 14, vec![("allowzero", Attr::Int(1))], 2, 1).unwrap();
        let empty = iota(&[0, 3]);
        assert_eq!(eval1(&*az, &[&empty, &t_ints(&[3, 0])]).shape(), &[3, 0]);
        let old = parse("Reshape", 1, vec![("shape", Attr::Ints(vec![3, 2]))], 1, 1).unwrap();
        assert_eq!(out_shape(&*old, &[&fact(DType::F32, "2,3")]), "[3,2]");
    }

    #[test]
    fn flatten_axes() {
        let x = fact(DType::F32, "N,3,4,5");
        let f = |axis: i64| parse("Flatten", 13, vec![("axis", Attr::Int(axis))], 1, 1).unwrap();
        assert_eq!(out_shape(&*f(1), &[&x]), "[N,60]");
        assert_eq!(out_shape(&*f(-1), &[&x]), "[12*N,5]");
        assert_eq!(out_shape(&*f(0), &[&x]), "[1,60*N]");
        assert_eq!(out_shape(&*f(4), &[&x]), "[60*N,1]");
        assert!(f(5).infer(&[Some(&x)]).is_err());
        assert_eq!(eval1(&*f(2), &[&iota(&[2, 3, 4])]).shape(), &[6, 4]);
    }

    #[test]
    fn squeeze_and_unsqueeze_axes_known_only_at_run_time() {
        let dd = Dim::data_dependent();
        let axes = |n: i64| Fact::new(DType::I64, vec![Dim::known(n)]);
        let un = parse("Unsqueeze", 13, vec![], 2, 1).unwrap();
        // [N, 3] with 1 axis: out[0] is 1 or N, out[1] N, 1 or 3 ... : rank 3, dims from the data.
        let x = fact(DType::F32, "N,3");
        assert_eq!(un.infer(&[Some(&x), Some(&axes(1))]).unwrap()[0].shape(), &[dd.clone(), dd.clone(), dd.clone()]);
        // Where every candidate agrees the dim is known: [1, 1] with 2 axes is all ones.
        let ones = fact(DType::F32, "1,1");
        assert_eq!(un.infer(&[Some(&ones), Some(&axes(2))]).unwrap()[0].shape(), &dims("1,1,1,1"));
        assert_eq!(un.infer(&[Some(&fact(DType::F32, "")), Some(&axes(2))]).unwrap()[0].shape(), &dims("1,1"));

        let sq = parse("Squeeze", 13, vec![], 2, 1).unwrap();
        let x = fact(DType::F32, "1,N,1,1");
        assert_eq!(sq.infer(&[Some(&x), Some(&axes(1))]).unwrap()[0].shape(), &[dd.clone(), dd.clone(), Dim::known(1)]);
        assert_eq!(sq.infer(&[Some(&x), Some(&axes(4))]).unwrap()[0].shape(), &dims(""));
        assert!(sq.infer(&[Some(&x), Some(&axes(5))]).is_err());
        let err = sq.infer(&[Some(&x), Some(&Fact::new(DType::I64, dims("K")))]).unwrap_err();
        assert!(err.0.contains("only known at run time"), "{}", err.0);

        // Evaluation reads the axes.
        let t = iota(&[1, 2, 1]);
        assert_eq!(eval1(sq.as_ref(), &[&t, &t_ints(&[-1])]).shape(), &[1, 2]);
        assert_eq!(eval1(sq.as_ref(), &[&t, &t_ints(&[0, 2])]).shape(), &[2]);
        assert!(sq.eval(&[Some(&t), Some(&t_ints(&[1]))]).is_err(), "axis 1 has size 2");
        assert_eq!(eval1(un.as_ref(), &[&t, &t_ints(&[0, 4])]).shape(), &[1, 1, 2, 1, 1]);
    }

    #[test]
    fn squeeze_and_unsqueeze_across_opsets() {
        let x = fact(DType::F32, "N,1,S,1");
        let sq11 = parse("Squeeze", 11, vec![("axes", Attr::Ints(vec![1, -1]))], 1, 1).unwrap();
        assert_eq!(out_shape(&*sq11, &[&x]), "[N,S]");
        let sq13 = parse("Squeeze", 13, vec![], 2, 1).unwrap();
        assert_eq!(out_shape(&*sq13, &[&x, &ints(&[3])]), "[N,1,S]");
        let msg = sq13.infer(&[Some(&x), None]).unwrap_err().0;
        assert!(msg.contains("symbolic dim N"), "{msg}");
        assert_eq!(out_shape(&*sq13, &[&fact(DType::F32, "1,3,1")]), "[3]");
        assert_eq!(out_shape(&*sq13, &[&fact(DType::F32, "1,3,1"), &ints(&[])]), "[3]");
        assert!(sq13.infer(&[Some(&fact(DType::F32, "2,3")), Some(&ints(&[0]))]).unwrap_err().0.contains("not 1"));

        let un11 = parse("Unsqueeze", 11, vec![("axes", Attr::Ints(vec![0, -1]))], 1, 1).unwrap();
        assert_eq!(out_shape(&*un11, &[&fact(DType::F32, "N,S")]), "[1,N,S,1]");
        let un13 = parse("Unsqueeze", 13, vec![], 2, 1).unwrap();
        assert_eq!(out_shape(&*un13, &[&fact(DType::F32, "N,S"), &ints(&[0, 2])]), "[1,N,1,S]");
        assert!(parse("Unsqueeze", 11, vec![], 1, 1).is_err());

        // A scalar symbol becomes a one-element shape tensor and back.
        let n = Fact::symbolic(vec![Dim::sym("N")], true);
        let out = un13.infer(&[Some(&n), Some(&ints(&[0]))]).unwrap();
        assert_eq!(out[0].sym, Some(vec![Dim::sym("N")]));
        assert_eq!(out[0].shape(), &[Dim::known(1)]);
        let back = sq13.infer(&[Some(&out[0]), Some(&ints(&[0]))]).unwrap();
        assert_eq!(back[0].rank(), 0);
        assert_eq!(back[0].sym, Some(vec![Dim::sym("N")]));
        assert_eq!(eval1(&*un13, &[&iota(&[2, 3]), &t_ints(&[1])]).shape(), &[2, 1, 3]);
    }

    #[test]
    fn transpose_default_and_perm() {
        let rev = parse("Transpose", 13, vec![], 1, 1).unwrap();
        assert_eq!(out_shape(&*rev, &[&fact(DType::F32, "N,3,4")]), "[4,3,N]");
        let p = parse("Transpose", 13, vec![("perm", Attr::Ints(vec![0, 2, 1]))], 1, 1).unwrap();
        let out = eval1(&*p, &[&iota(&[1, 2, 3])]);
        // numpy: np.arange(6).reshape(1,2,3).transpose(0,2,1).ravel()
        assert_eq!(out.to_f64_vec(), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        let bad = parse("Transpose", 13, vec![("perm", Attr::Ints(vec![0, 0, 1]))], 1, 1).unwrap();
        assert!(bad.infer(&[Some(&fact(DType::F32, "1,2,3"))]).unwrap_err().0.contains("not a permutation"));
    }

    #[test]
    fn expand_is_bidirectional() {
        let op = parse("Expand", 13, vec![], 2, 1).unwrap();
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "3,1"), &ints(&[2, 1, 4])]), "[2,3,4]");
        let sym_shape = Fact::symbolic(vec![Dim::sym("N"), Dim::known(1), Dim::sym("S")], false);
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "1,4,1"), &sym_shape]), "[N,4,S]");
        let msg = op.infer(&[Some(&fact(DType::F32, "3")), Some(&ints(&[4]))]).unwrap_err().0;
        assert!(msg.contains("cannot be broadcast"), "{msg}");
        let out = eval1(&*op, &[&t_f32(&[3, 1], vec![1.0, 2.0, 3.0]), &t_ints(&[2, 1, 2])]);
        assert_eq!(out.shape(), &[2, 3, 2]);
        assert_eq!(out.to_f64_vec()[..6], [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
    }

    #[test]
    fn tile_shapes_and_values() {
        let op = parse("Tile", 13, vec![], 2, 1).unwrap();
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,3"), &ints(&[2, 1])]), "[2*N,3]");
        let reps = Fact::symbolic(vec![Dim::known(1), Dim::sym("K")], false);
        assert_eq!(out_shape(&*op, &[&fact(DType::F32, "N,3"), &reps]), "[N,3*K]");
        let out = eval1(&*op, &[&iota(&[2, 2]), &t_ints(&[1, 2])]);
        // numpy: np.tile(np.arange(4).reshape(2,2), (1,2))
        assert_eq!(out.to_f64_vec(), vec![0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0]);
        assert!(op.infer(&[Some(&fact(DType::F32, "N,3")), Some(&ints(&[2]))]).is_err());
        assert!(parse("Tile", 1, vec![], 3, 1).is_err());
    }

    #[test]
    fn shape_and_size_are_symbolic() {
        let x = fact(DType::F32, "N,3,224,224");
        let shape = parse("Shape", 13, vec![], 1, 1).unwrap();
        let out = shape.infer(&[Some(&x)]).unwrap();
        assert_eq!(out[0].sym, Some(dims("N,3,224,224")));
        assert_eq!(out[0].shape(), &[Dim::known(4)]);
        let tail = parse("Shape", 15, vec![("start", Attr::Int(-2))], 1, 1).unwrap();
        assert_eq!(tail.infer(&[Some(&x)]).unwrap()[0].sym, Some(dims("224,224")));
        let mid = parse("Shape", 15, vec![("start", Attr::Int(1)), ("end", Attr::Int(-1))], 1, 1).unwrap();
        assert_eq!(eval1(&*mid, &[&iota(&[2, 3, 4, 5])]).to_i64_vec(), vec![3, 4]);
        let clamped = parse("Shape", 15, vec![("start", Attr::Int(10))], 1, 1).unwrap();
        assert_eq!(eval1(&*clamped, &[&iota(&[2, 3])]).shape(), &[0]);
        let size = parse("Size", 13, vec![], 1, 1).unwrap();
        let s = size.infer(&[Some(&x)]).unwrap();
        assert_eq!(s[0].rank(), 0);
        assert_eq!(s[0].sym.as_ref().unwrap()[0].to_string(), "150528*N");
        assert_eq!(eval1(&*size, &[&iota(&[2, 3])]).to_i64_vec(), vec![6]);
    }

    /// The classic PyTorch flatten export:
    /// `Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1]))`.
    fn flatten_chain(batch: &str) -> (crate::ir::ops::testutil::GraphBuilder, usize) {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F32, &format!("{batch},2048,1,1"));
        let zero = b.konst("zero", crate::ir::Tensor::from_i64s(&[], vec![0]));
        let axes = b.konst("axes", t_ints(&[0]));
        let minus_one = b.konst("minus_one", t_ints(&[-1]));
        let shape = b.node("Shape", vec![], &[x], 1)[0];
        let n = b.node("Gather", vec![("axis", Attr::Int(0))], &[shape, zero], 1)[0];
        let n1 = b.node("Unsqueeze", vec![], &[n, axes], 1)[0];
        let target = b.node("Concat", vec![("axis", Attr::Int(0))], &[n1, minus_one], 1)[0];
        let y = b.node("Reshape", vec![], &[x, target], 1)[0];
        b.g.outputs.push(y);
        (b, y)
    }

    #[test]
    fn pytorch_flatten_chain_folds_when_static() {
        let (mut b, y) = flatten_chain("2");
        let stats = infer_graph(&mut b.g).unwrap();
        assert_eq!(stats.folded, 4, "{stats:?}");
        let ops: Vec<&str> = b.g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!(ops, vec!["Reshape"]);
        assert_eq!(b.g.ty(y).to_string(), "float32[2,2048]");
        let x = iota(&[2, 2048, 1, 1]);
        let out = crate::reference::run(&b.g, &BTreeMap::from([("x".to_string(), x)])).unwrap();
        assert_eq!(out[0].1.shape(), &[2, 2048]);
        assert_eq!(out[0].1.to_f64_vec()[2049], 2049.0);
    }

    #[test]
    fn pytorch_flatten_chain_stays_symbolic() {
        let (mut b, y) = flatten_chain("N");
        infer_graph(&mut b.g).unwrap();
        assert_eq!(b.g.ty(y).to_string(), "float32[N,2048]");
        let target = b.g.nodes.iter().find(|n| n.op_type == "Concat").unwrap().outputs[0];
        assert_eq!(b.g.value(target).sym, Some(vec![Dim::sym("N"), Dim::known(-1)]));
        // The executor runs the kept shape subgraph and binds N.
        let out = crate::reference::run(&b.g, &BTreeMap::from([("x".to_string(), iota(&[3, 2048, 1, 1]))])).unwrap();
        assert_eq!(out[0].1.shape(), &[3, 2048]);
    }

    #[test]
    fn expand_with_runtime_shape() {
        let op = parse("Expand", 13, vec![], 2, 1).unwrap();
        let dd = Dim::data_dependent();
        // A known input dim other than 1 decides its axis; the rest depend on the data.
        let out = op.infer(&[Some(&fact(DType::F32, "N,3,1")), Some(&fact(DType::I64, "4"))]).unwrap();
        assert_eq!(out[0].shape(), &[dd.clone(), dd.clone(), Dim::known(3), dd.clone()]);
        // A shorter shape leaves the leading input dims as they are.
        let out = op.infer(&[Some(&fact(DType::F32, "2,5,1")), Some(&fact(DType::I64, "1"))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::known(2), Dim::known(5), dd]);
        let msg = op.infer(&[Some(&fact(DType::F32, "3")), Some(&fact(DType::I64, "K"))]).unwrap_err().0;
        assert!(msg.contains("length [K] is not static"), "{msg}");
    }

    #[test]
    fn runtime_expand_binds_its_dims_when_run() {
        // Expand([1,3,1], shape) with `shape` a graph input, as ONNX's test_expand_shape_model*.
        let mut b = crate::ir::ops::testutil::GraphBuilder::new(13);
        let x = b.input("x", DType::F32, "1,3,1");
        let shape = b.input("shape", DType::I64, "2");
        let y = b.node("Expand", vec![], &[x, shape], 1)[0];
        b.g.outputs.push(y);
        infer_graph(&mut b.g).unwrap();
        assert_eq!(b.g.ty(y).to_string(), "float32[1,3,Expand_0_0:2]");
        let feeds = BTreeMap::from([
            ("x".to_string(), t_f32(&[1, 3, 1], vec![1.0, 2.0, 3.0])),
            ("shape".to_string(), t_ints(&[3, 4])),
        ]);
        let out = crate::reference::run(&b.g, &feeds).unwrap();
        assert_eq!(out[0].1.shape(), &[1, 3, 4]);
        assert_eq!(out[0].1.to_f64_vec()[4..8], [2.0; 4]);
    }

    #[test]
    fn tile_and_reshape_with_runtime_inputs() {
        let dd = Dim::data_dependent();
        let tile = parse("Tile", 13, vec![], 2, 1).unwrap();
        let out = tile.infer(&[Some(&fact(DType::F32, "0,N")), Some(&fact(DType::I64, "2"))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::known(0), dd.clone()]);
        let out = eval1(&*tile, &[&t_f32(&[1, 2], vec![1.0, 2.0]), &t_ints(&[2, 2])]);
        assert_eq!(out.to_f64_vec(), [1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
        let msg = tile.infer(&[Some(&fact(DType::F32, "2")), Some(&fact(DType::I64, "2"))]).unwrap_err().0;
        assert!(msg.contains("one entry per input dim"), "{msg}");
        let reshape = parse("Reshape", 13, vec![], 2, 1).unwrap();
        let out = reshape.infer(&[Some(&fact(DType::F32, "N,6")), Some(&fact(DType::I64, "3"))]).unwrap();
        assert_eq!(out[0].shape(), &[dd.clone(), dd.clone(), dd]);
        // The run-time values still follow Reshape's 0 / -1 rules.
        let out = eval1(&*reshape, &[&iota(&[2, 6]), &t_ints(&[0, -1, 3])]);
        assert_eq!(out.shape(), &[2, 2, 3]);
    }
}
