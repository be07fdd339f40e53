//! The reduce op family: `Reduce*` over a set of axes and `ArgMax`/`ArgMin` over one axis.
//!
//! Every `Reduce*` op is one [`Reduce`] with a [`ReduceKind`]; the kernels are in
//! `crate::reference::reduce`.

use super::shape::{dims_without_runtime_axes, runtime_axes_len};
use super::OpSpec;
use crate::ir::broadcast::{normalize_axes, normalize_axis};
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::reduce::{arg_reduce, reduce_bool, reduce_f32, reduce_int};
use crate::{map_tensor, op_bail, op_ensure, with_tensor};
use ndarray::{ArrayD, IxDyn};
use std::any::Any;

/// The arithmetic of one reduction; shared by every element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    L1,
    L2,
    SumSquare,
    LogSum,
    LogSumExp,
}

/// The restriction `onnx2ait ops` states for the reductions with an `axes` input.
const RUNTIME_AXES: &str = "'axes' may be a run-time value (e.g. a graph input) for the reference executor and \
     validate; code generation needs it known at compile time";

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("ArgMax", parse_argmax),
    OpSpec::onnx("ArgMin", parse_argmin),
    OpSpec::onnx("ReduceL1", parse_reduce_l1).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceL2", parse_reduce_l2).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceLogSum", parse_reduce_log_sum).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceLogSumExp", parse_reduce_log_sum_exp).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceMax", parse_reduce_max).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceMean", parse_reduce_mean).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceMin", parse_reduce_min).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceProd", parse_reduce_prod).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceSum", parse_reduce_sum).with_note(RUNTIME_AXES),
    OpSpec::onnx("ReduceSumSquare", parse_reduce_sum_square).with_note(RUNTIME_AXES),
];

/// Where a reduction's axes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReduceAxes {
    /// The `axes` attribute (before the input form); empty means "all axes".
    Attr(Vec<i64>),
    /// Optional input 1 (ReduceSum from opset 13, the others from opset 18). Inference uses its
    /// values when they are known at compile time; otherwise (a graph input or a value computed
    /// at run time) only its static length, and the output dims become data-dependent.
    /// Evaluation reads the tensor.
    Input,
}

/// A reduction over a set of axes.
#[derive(Clone, Debug)]
pub struct Reduce {
    pub kind: ReduceKind,
    pub op_name: &'static str,
    pub axes: ReduceAxes,
    pub keepdims: bool,
    /// With empty axes: reduce nothing (each element is its own lane) instead of everything.
    pub noop_with_empty_axes: bool,
}

impl Reduce {
    /// The normalised axes to reduce, given the contents of the axes input when there is one.
    /// An empty result means "no axis" (the noop case): each element is reduced on its own,
    /// which is how ORT treats it (ReduceSumSquare squares, ReduceL1 takes |x|).
    fn resolve_axes(&self, rank: usize, axes_input: Option<Vec<i64>>) -> OpResult<Vec<usize>> {
        let given = match &self.axes {
            ReduceAxes::Attr(a) => a.clone(),
            ReduceAxes::Input => axes_input.unwrap_or_default(),
        };
        if given.is_empty() {
            return Ok(if self.noop_with_empty_axes { Vec::new() } else { (0..rank).collect() });
        }
        normalize_axes(&given, rank)
    }

    fn check_dtype(&self, dtype: DType) -> OpResult<()> {
        op_ensure!(
            dtype != DType::Bool || self.kind.supports_bool(),
            "{} does not accept bool input (only ReduceMax and ReduceMin do)",
            self.op_name
        );
        Ok(())
    }

    /// The symbolic result of summing, multiplying or taking the max/min of a shape vector,
    /// so `Shape → ReduceProd` (an element count) stays symbolic.
    fn symbolic(&self, values: &[Dim]) -> Option<Dim> {
        let mut it = values.iter();
        match self.kind {
            ReduceKind::Sum => Some(values.iter().fold(Dim::known(0), |acc, d| acc.add(d))),
            ReduceKind::Prod => Some(values.iter().fold(Dim::known(1), |acc, d| acc.mul(d))),
            ReduceKind::Max => {
                let first = it.next()?.clone();
                Some(it.fold(first, |acc, d| acc.max_dim(d)))
            }
            ReduceKind::Min => {
                let first = it.next()?.clone();
                Some(it.fold(first, |acc, d| acc.min_dim(d)))
            }
            _ => None,
        }
    }
}

/// Output shape of a reduction: reduced axes become 1 (keepdims) or disappear.
fn reduced_shape<D: Clone>(shape: &[D], axes: &[usize], keepdims: bool, one: D) -> Vec<D> {
    shape
        .iter()
        .enumerate()
        .filter_map(|(i, d)| match (axes.contains(&i), keepdims) {
            (false, _) => Some(d.clone()),
            (true, true) => Some(one.clone()),
            (true, false) => None,
        })
        .collect()
}

/// The axes input at inference: its values when known (`Ok(Ok(..))`), else the number of
/// axes read at run time (`Ok(Err(n))`, n > 0).
fn axes_fact(inputs: &[Option<&Fact>]) -> OpResult<std::result::Result<Option<Vec<i64>>, usize>> {
    let Some(f) = optional(inputs, 1) else {
        return Ok(Ok(None));
    };
    op_ensure!(f.dtype() == DType::I64, "input 'axes' must be int64, found {}", f.dtype());
    op_ensure!(f.rank() == 1, "input 'axes' must be 1-D, found rank {}", f.rank());
    if let Some(v) = f.as_dims() {
        return match v.iter().map(Dim::as_known).collect::<Option<Vec<i64>>>() {
            Some(v) => Ok(Ok(Some(v))),
            None => op_bail!("input 'axes' must hold plain integers, found symbolic values {}", fmt_shape(&v)),
        };
    }
    match runtime_axes_len(f, "axes")? {
        0 => Ok(Ok(Some(Vec::new()))),
        n => Ok(Err(n)),
    }
}

impl Op for Reduce {
    fn op_type(&self) -> &'static str {
        self.op_name
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        self.check_dtype(x.dtype())?;
        let axes = match axes_fact(inputs)? {
            Ok(axes) => self.resolve_axes(x.rank(), axes)?,
            // Axes read at run time: with keepdims every dim stays or becomes 1; without, `n`
            // dims go (the count is static, the positions are not).
            Err(n) => {
                let shape: Vec<Dim> = if self.keepdims {
                    x.shape()
                        .iter()
                        .map(|d| if d.as_known() == Some(1) { d.clone() } else { Dim::data_dependent() })
                        .collect()
                } else {
                    dims_without_runtime_axes(x.shape(), n)?
                };
                return Ok(vec![Fact::new(x.dtype(), shape)]);
            }
        };
        let shape = reduced_shape(x.shape(), &axes, self.keepdims, Dim::known(1));
        // Reducing a symbolic shape vector (rank 1) over its only axis.
        if x.dtype() == DType::I64 && x.rank() == 1 && axes == [0] {
            if let Some(v) = x.sym.as_deref().and_then(|vals| self.symbolic(vals)) {
                return Ok(vec![Fact::symbolic(vec![v], !self.keepdims)]);
            }
        }
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        self.check_dtype(x.dtype())?;
        let axes_input = optional(inputs, 1).map(|t| t.to_i64_vec());
        let axes = self.resolve_axes(x.rank(), axes_input)?;
        let out_shape = reduced_shape(x.shape(), &axes, self.keepdims, 1usize);
        let kind = self.kind;
        let reduced = match x {
            Tensor::F32(a) => Tensor::F32(reduce_f32(a, &axes, kind)),
            Tensor::F64(_) | Tensor::F16(_) | Tensor::BF16(_) => {
                Tensor::F32(reduce_f32(&x.to_f32(), &axes, kind)).cast(x.dtype())
            }
            Tensor::I8(a) => Tensor::I8(reduce_int(a, &axes, kind)),
            Tensor::I16(a) => Tensor::I16(reduce_int(a, &axes, kind)),
            Tensor::I32(a) => Tensor::I32(reduce_int(a, &axes, kind)),
            Tensor::I64(a) => Tensor::I64(reduce_int(a, &axes, kind)),
            Tensor::U8(a) => Tensor::U8(reduce_int(a, &axes, kind)),
            Tensor::U16(a) => Tensor::U16(reduce_int(a, &axes, kind)),
            Tensor::U32(a) => Tensor::U32(reduce_int(a, &axes, kind)),
            Tensor::U64(a) => Tensor::U64(reduce_int(a, &axes, kind)),
            Tensor::Bool(a) => Tensor::Bool(reduce_bool(a, &axes, kind)?),
        };
        Ok(vec![reshape(reduced, &out_shape)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Reshapes a kernel result (reduced axes dropped) to the op's output shape; the element
/// count is the same by construction.
fn reshape(t: Tensor, shape: &[usize]) -> Tensor {
    if t.shape() == shape {
        return t;
    }
    map_tensor!(t, a => {
        let v = a.into_raw_vec_and_offset().0;
        ArrayD::from_shape_vec(IxDyn(shape), v).expect("reduced element count matches the output shape")
    })
}

/// Shared parser of the `Reduce*` ops.
///
/// Opset history (all of them): 1 introduced `axes`/`keepdims`; 11 allowed negative axes;
/// 13 added integer/bfloat16 types (and moved ReduceSum's `axes` to an input, with
/// `noop_with_empty_axes`); 18 moved `axes` to an input for every other reduction; 20 let
/// ReduceMax/ReduceMin take bool. `axes_input_since` is 13 for ReduceSum and 18 otherwise.
/// Negative axes are accepted at every opset.
fn parse_reduce(
    ctx: &NodeCtx,
    kind: ReduceKind,
    op_name: &'static str,
    axes_input_since: i64,
) -> OpResult<Box<dyn Op>> {
    let keepdims = ctx.flag("keepdims", true)?;
    let (axes, noop_with_empty_axes) = if ctx.opset >= axes_input_since {
        op_ensure!(
            !ctx.has("axes"),
            "attribute 'axes' is not allowed from opset {axes_input_since} (axes are input 1); the model imports opset {}",
            ctx.opset
        );
        (ReduceAxes::Input, ctx.flag("noop_with_empty_axes", false)?)
    } else {
        op_ensure!(
            ctx.num_inputs() <= 1,
            "{op_name} takes axes as an attribute before opset {axes_input_since}, but the node has {} inputs",
            ctx.num_inputs()
        );
        op_ensure!(
            !ctx.has("noop_with_empty_axes"),
            "attribute 'noop_with_empty_axes' needs opset {axes_input_since} or later"
        );
        (ReduceAxes::Attr(ctx.ints_or("axes", Vec::new())?), false)
    };
    Ok(Box::new(Reduce { kind, op_name, axes, keepdims, noop_with_empty_axes }))
}

/// ReduceSum: sum over `axes`. Axes become input 1 at opset 13 (see [`parse_reduce`]).
fn parse_reduce_sum(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::Sum, "ReduceSum", 13)
}

/// ReduceMean: arithmetic mean; integer means truncate toward zero. Axes input from opset 18.
fn parse_reduce_mean(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::Mean, "ReduceMean", 18)
}

/// ReduceMax: maximum; bool input (any) from opset 20. Axes input from opset 18.
fn parse_reduce_max(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::Max, "ReduceMax", 18)
}

/// ReduceMin: minimum; bool input (all) from opset 20. Axes input from opset 18.
fn parse_reduce_min(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::Min, "ReduceMin", 18)
}

/// ReduceProd: product. Axes input from opset 18.
fn parse_reduce_prod(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::Prod, "ReduceProd", 18)
}

/// ReduceL1: sum of absolute values. Axes input from opset 18.
fn parse_reduce_l1(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::L1, "ReduceL1", 18)
}

/// ReduceL2: square root of the sum of squares. Axes input from opset 18.
fn parse_reduce_l2(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::L2, "ReduceL2", 18)
}

/// ReduceSumSquare: sum of squares. Axes input from opset 18.
fn parse_reduce_sum_square(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::SumSquare, "ReduceSumSquare", 18)
}

/// ReduceLogSum: natural log of the sum. Axes input from opset 18.
fn parse_reduce_log_sum(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::LogSum, "ReduceLogSum", 18)
}

/// ReduceLogSumExp: `log(sum(exp(x)))`, computed around the maximum. Axes input from opset 18.
fn parse_reduce_log_sum_exp(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_reduce(ctx, ReduceKind::LogSumExp, "ReduceLogSumExp", 18)
}

/// ArgMax / ArgMin over one axis, producing int64 indices.
#[derive(Clone, Debug)]
pub struct ArgReduce {
    pub want_max: bool,
    pub axis: i64,
    pub keepdims: bool,
    /// Among equal extremes, return the last index instead of the first.
    pub select_last_index: bool,
}

impl ArgReduce {
    fn name(&self) -> &'static str {
        if self.want_max {
            "ArgMax"
        } else {
            "ArgMin"
        }
    }
}

impl Op for ArgReduce {
    fn op_type(&self) -> &'static str {
        self.name()
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(x.dtype() != DType::Bool, "{} does not accept bool input", self.name());
        op_ensure!(x.rank() > 0, "{} needs an input of rank 1 or more, found a scalar", self.name());
        let axis = normalize_axis(self.axis, x.rank())?;
        Ok(vec![Fact::new(DType::I64, reduced_shape(x.shape(), &[axis], self.keepdims, Dim::known(1)))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        op_ensure!(x.dtype() != DType::Bool, "{} does not accept bool input", self.name());
        op_ensure!(x.rank() > 0, "{} needs an input of rank 1 or more, found a scalar", self.name());
        let axis = normalize_axis(self.axis, x.rank())?;
        let out = with_tensor!(x, a => arg_reduce(a, axis, self.want_max, self.select_last_index)?);
        let shape = reduced_shape(x.shape(), &[axis], self.keepdims, 1usize);
        Ok(vec![reshape(Tensor::I64(out), &shape)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// ArgMax/ArgMin. Opset history: 1 introduced `axis` (default 0) and `keepdims` (default 1);
/// 11 allowed negative axes; 12 added `select_last_index`; 13 added bfloat16. The attributes
/// are read at every opset (a `select_last_index` in an older model is honoured).
fn parse_arg(ctx: &NodeCtx, want_max: bool) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(ArgReduce {
        want_max,
        axis: ctx.int_or("axis", 0)?,
        keepdims: ctx.flag("keepdims", true)?,
        select_last_index: ctx.flag("select_last_index", false)?,
    }))
}

/// ArgMax: index of the maximum (see [`parse_arg`] for the opset history).
fn parse_argmax(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_arg(ctx, true)
}

/// ArgMin: index of the minimum (see [`parse_arg`] for the opset history).
fn parse_argmin(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_arg(ctx, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;
    use std::sync::Arc;

    fn parse(op: &str, opset: i64, attrs: &[(&str, Attr)], n_inputs: usize) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &vec![true; n_inputs], 1)
    }

    fn sym_shape() -> Vec<Dim> {
        vec![Dim::sym("N"), Dim::known(3), Dim::known(4)]
    }

    fn axes_const(v: &[i64]) -> Fact {
        Fact::constant(Arc::new(Tensor::from_i64s(&[v.len()], v.to_vec())))
    }

    #[test]
    fn infer_attribute_axes_keeps_symbolic_dims() {
        let op = parse("ReduceMean", 13, &[("axes", Attr::Ints(vec![-1]))], 1).unwrap();
        let x = Fact::new(DType::F16, sym_shape());
        let out = op.infer(&[Some(&x)]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(3), Dim::known(1)]);
        assert_eq!(out[0].dtype(), DType::F16);
    }

    #[test]
    fn infer_axes_input_and_noop() {
        let x = Fact::new(DType::F32, sym_shape());
        let op = parse("ReduceSum", 13, &[("keepdims", Attr::Int(0))], 2).unwrap();
        let out = op.infer(&[Some(&x), Some(&axes_const(&[1]))]).unwrap();
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(4)]);
        // No axes: reduce everything.
        let out = op.infer(&[Some(&x), None]).unwrap();
        assert!(out[0].shape().is_empty());
        let noop = parse("ReduceSum", 13, &[("noop_with_empty_axes", Attr::Int(1))], 2).unwrap();
        assert_eq!(noop.infer(&[Some(&x), Some(&axes_const(&[]))]).unwrap()[0].shape(), x.shape());
    }

    #[test]
    fn axes_known_only_at_run_time() {
        // x: [N, 1, 4]; axes: a graph input of static length.
        let x = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(1), Dim::known(4)]);
        let one_axis = Fact::new(DType::I64, vec![Dim::known(1)]);
        let dd = Dim::data_dependent();
        // keepdims: the rank stays, each dim is itself or 1 (a 1 stays 1).
        let keep = parse("ReduceSum", 13, &[], 2).unwrap();
        let out = keep.infer(&[Some(&x), Some(&one_axis)]).unwrap();
        assert_eq!(out[0].shape(), &[dd.clone(), Dim::known(1), dd.clone()]);
        // Without keepdims the static length of axes gives the rank.
        let drop = parse("ReduceMax", 18, &[("keepdims", Attr::Int(0))], 2).unwrap();
        let two_axes = Fact::new(DType::I64, vec![Dim::known(2)]);
        assert_eq!(drop.infer(&[Some(&x), Some(&two_axes)]).unwrap()[0].shape(), &[dd.clone()]);
        let all_axes = Fact::new(DType::I64, vec![Dim::known(3)]);
        assert!(drop.infer(&[Some(&x), Some(&all_axes)]).unwrap()[0].shape().is_empty());
        // An axes input of length 0 is known to be empty.
        let none = Fact::new(DType::I64, vec![Dim::known(0)]);
        assert!(drop.infer(&[Some(&x), Some(&none)]).unwrap()[0].shape().is_empty());
        // A symbolic length leaves the rank unknown: a clear error.
        let sym_len = Fact::new(DType::I64, vec![Dim::sym("K")]);
        let err = drop.infer(&[Some(&x), Some(&sym_len)]).unwrap_err();
        assert!(err.0.contains("only known at run time") && err.0.contains("output rank"), "{}", err.0);
        let too_many = Fact::new(DType::I64, vec![Dim::known(4)]);
        assert!(drop.infer(&[Some(&x), Some(&too_many)]).is_err());

        // Evaluation reads the axes tensor.
        let data = Tensor::from_f32s(&[2, 1, 3], (0..6).map(|v| v as f32).collect());
        let axes = Tensor::from_i64s(&[1], vec![-1]);
        let got = keep.eval(&[Some(&data), Some(&axes)]).unwrap();
        assert_eq!(got[0], Tensor::from_f32s(&[2, 1, 1], vec![3.0, 12.0]));
        let axes = Tensor::from_i64s(&[2], vec![0, 2]);
        let got = drop.eval(&[Some(&data), Some(&axes)]).unwrap();
        assert_eq!(got[0], Tensor::from_f32s(&[1], vec![5.0]));
    }

    #[test]
    fn opset_rules_for_axes() {
        let err = parse("ReduceMax", 18, &[("axes", Attr::Ints(vec![0]))], 1).unwrap_err();
        assert!(err.0.contains("opset 18"), "{}", err.0);
        assert!(parse("ReduceMax", 13, &[], 2).is_err());
        assert!(parse("ReduceSum", 11, &[("axes", Attr::Ints(vec![0]))], 1).is_ok());
        let x = Fact::new(DType::F32, sym_shape());
        let op = parse("ReduceL2", 11, &[("axes", Attr::Ints(vec![1, -2]))], 1).unwrap();
        assert!(op.infer(&[Some(&x)]).unwrap_err().0.contains("repeated"));
        let op = parse("ReduceL2", 11, &[("axes", Attr::Ints(vec![3]))], 1).unwrap();
        assert!(op.infer(&[Some(&x)]).unwrap_err().0.contains("out of range"));
    }

    #[test]
    fn symbolic_element_count() {
        let shape = Fact::symbolic(vec![Dim::sym("N"), Dim::known(3), Dim::known(4)], false);
        let op = parse("ReduceProd", 18, &[("keepdims", Attr::Int(0))], 1).unwrap();
        let out = op.infer(&[Some(&shape)]).unwrap();
        assert_eq!(out[0].sym.as_deref(), Some(&[Dim::sym("N").mul(&Dim::known(12))][..]));
        assert!(out[0].shape().is_empty());
    }

    #[test]
    fn eval_matches_numpy() {
        // numpy: x = arange(24).reshape(2,3,4) as float32
        let x = Tensor::from_f32s(&[2, 3, 4], (0..24).map(|v| v as f32).collect());
        let op = parse("ReduceSum", 13, &[], 2).unwrap();
        let out = op.eval(&[Some(&x), Some(&Tensor::from_i64s(&[2], vec![0, 2]))]).unwrap();
        assert_eq!(out[0].shape(), &[1, 3, 1]);
        assert_eq!(out[0].to_f64_vec(), vec![60.0, 92.0, 124.0]); // x.sum((0,2))
        let op = parse("ReduceLogSumExp", 13, &[("axes", Attr::Ints(vec![1])), ("keepdims", Attr::Int(0))], 1).unwrap();
        let out = op.eval(&[Some(&x)]).unwrap();
        // numpy: np.log(np.exp(x).sum(1))[0]
        let want = [8.018_479, 9.018_479, 10.018_479, 11.018_479];
        for (g, w) in out[0].to_f64_vec().iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
        let ints = Tensor::I32(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![3, -4, 5, 6]).unwrap());
        let op = parse("ReduceL1", 18, &[], 1).unwrap();
        let out = op.eval(&[Some(&ints), None]).unwrap();
        assert_eq!(out[0].dtype(), DType::I32);
        assert_eq!(out[0].shape(), &[1, 1]);
        assert_eq!(out[0].to_i64_vec(), vec![18]);
    }

    #[test]
    fn bool_reductions() {
        let b = Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&[2, 2]), vec![true, false, true, true]).unwrap());
        let op = parse("ReduceMin", 20, &[("keepdims", Attr::Int(0))], 2).unwrap();
        let out = op.eval(&[Some(&b), Some(&Tensor::from_i64s(&[1], vec![1]))]).unwrap();
        assert_eq!(out[0].to_i64_vec(), vec![0, 1]);
        let sum = parse("ReduceSum", 13, &[], 1).unwrap();
        let err = sum.infer(&[Some(&Fact::new(DType::Bool, vec![Dim::known(2)]))]).unwrap_err();
        assert!(err.0.contains("bool"), "{}", err.0);
    }

    #[test]
    fn argmax_infer_and_eval() {
        let op = parse("ArgMax", 13, &[("axis", Attr::Int(-1)), ("keepdims", Attr::Int(0))], 1).unwrap();
        let out = op.infer(&[Some(&Fact::new(DType::F32, sym_shape()))]).unwrap();
        assert_eq!(out[0].dtype(), DType::I64);
        assert_eq!(out[0].shape(), &[Dim::sym("N"), Dim::known(3)]);
        let x = Tensor::from_f32s(&[2, 3], vec![1.0, 5.0, 5.0, 7.0, 0.0, 7.0]);
        let last = parse("ArgMin", 13, &[("axis", Attr::Int(1)), ("select_last_index", Attr::Int(1))], 1).unwrap();
        let out = last.eval(&[Some(&x)]).unwrap();
        assert_eq!(out[0].shape(), &[2, 1]);
        assert_eq!(out[0].to_i64_vec(), vec![0, 1]);
        let first = parse("ArgMax", 13, &[("axis", Attr::Int(1))], 1).unwrap();
        assert_eq!(first.eval(&[Some(&x)]).unwrap()[0].to_i64_vec(), vec![1, 0]);
    }
}
