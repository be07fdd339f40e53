//! The arithmetic op family: binary math with numpy broadcasting (Add, Sub, Mul, Div, Mod,
//! Pow), variadic Sum/Mean/Max/Min, and unary math (Sqrt, Exp, Log, Round, trigonometry, ...).
//!
//! Add/Sub/Mul/Div/Max/Min on int64 shape values propagate symbolic contents, so PyTorch shape
//! subgraphs (`Shape → Gather → Mul(·, 64) → Concat → Reshape`) fold to constants.

use super::OpSpec;
use crate::ir::broadcast::broadcast_shapes;
use crate::ir::{required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor, ValueType};
use crate::reference::arithmetic::{self as kernels};
use std::any::Any;

/// Elementwise binary arithmetic over operands of one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryKind {
    Add,
    Sub,
    Mul,
    Div,
    /// `fmod`: C `fmod` (result has the dividend's sign); otherwise the divisor's sign (Python `%`).
    Mod {
        fmod: bool,
    },
    Max,
    Min,
}

/// Elementwise unary math.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryKind {
    Sqrt,
    Reciprocal,
    Exp,
    Log,
    Neg,
    Abs,
    Floor,
    Ceil,
    Round,
    Sign,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
}

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Add", parse_add),
    OpSpec::onnx("Sub", parse_sub),
    OpSpec::onnx("Mul", parse_mul),
    OpSpec::onnx("Div", parse_div),
    OpSpec::onnx("Mod", parse_mod),
    OpSpec::onnx("Pow", parse_pow),
    OpSpec::onnx("Sum", parse_sum),
    OpSpec::onnx("Mean", parse_mean),
    OpSpec::onnx("Max", parse_max),
    OpSpec::onnx("Min", parse_min),
    OpSpec::onnx("Sqrt", parse_sqrt),
    OpSpec::onnx("Reciprocal", parse_reciprocal),
    OpSpec::onnx("Exp", parse_exp),
    OpSpec::onnx("Log", parse_log),
    OpSpec::onnx("Neg", parse_neg),
    OpSpec::onnx("Abs", parse_abs),
    OpSpec::onnx("Floor", parse_floor),
    OpSpec::onnx("Ceil", parse_ceil),
    OpSpec::onnx("Round", parse_round),
    OpSpec::onnx("Sign", parse_sign),
    OpSpec::onnx("Sin", parse_sin),
    OpSpec::onnx("Cos", parse_cos),
    OpSpec::onnx("Tan", parse_tan),
    OpSpec::onnx("Asin", parse_asin),
    OpSpec::onnx("Acos", parse_acos),
    OpSpec::onnx("Atan", parse_atan),
    OpSpec::onnx("Sinh", parse_sinh),
    OpSpec::onnx("Cosh", parse_cosh),
    OpSpec::onnx("Asinh", parse_asinh),
    OpSpec::onnx("Acosh", parse_acosh),
    OpSpec::onnx("Atanh", parse_atanh),
];

// ---------------------------------------------------------------------------------------------
// Shared inference helpers (also used by the logical, activation and cast families).

/// All present inputs, failing clearly when one of the first `n` is missing.
pub fn required_all<'a>(inputs: &[Option<&'a Fact>], n: usize) -> OpResult<Vec<&'a Fact>> {
    (0..n).map(|i| required(inputs, i, "operand")).collect()
}

/// The common element type of `facts`, or an error naming the mismatch.
pub fn same_dtype(facts: &[&Fact]) -> OpResult<DType> {
    let first =
        facts.first().map(|f| f.dtype()).ok_or_else(|| crate::ir::OpError("at least one input is required".into()))?;
    for (i, f) in facts.iter().enumerate().skip(1) {
        crate::op_ensure!(
            f.dtype() == first,
            "input {i} has element type {} but input 0 has {first}; they must match",
            f.dtype()
        );
    }
    Ok(first)
}

/// The numpy broadcast of the facts' shapes.
pub fn broadcast_facts(facts: &[&Fact]) -> OpResult<Vec<Dim>> {
    let shapes: Vec<&[Dim]> = facts.iter().map(|f| f.shape()).collect();
    broadcast_shapes(&shapes)
}

/// Rejects bool operands of arithmetic.
pub fn ensure_numeric(dtype: DType) -> OpResult<()> {
    crate::op_ensure!(dtype != DType::Bool, "element type bool is not supported (numeric types only)");
    Ok(())
}

pub fn ensure_float(dtype: DType) -> OpResult<()> {
    crate::op_ensure!(dtype.is_float(), "element type {dtype} is not supported (floating-point types only)");
    Ok(())
}

/// Combines the symbolic contents of two rank-0/1 int64 values elementwise, broadcasting a
/// single element against many; `None` when either is unknown, the lengths do not broadcast,
/// or `f` cannot decide an element.
pub fn sym_zip<T>(a: &Fact, b: &Fact, f: impl Fn(&Dim, &Dim) -> Option<T>) -> Option<Vec<T>> {
    if a.rank() > 1 || b.rank() > 1 {
        return None;
    }
    let (x, y) = (a.as_dims()?, b.as_dims()?);
    let n = match (x.len(), y.len()) {
        (p, q) if p == q => p,
        (1, q) => q,
        (p, 1) => p,
        _ => return None,
    };
    (0..n).map(|i| f(&x[if x.len() == 1 { 0 } else { i }], &y[if y.len() == 1 { 0 } else { i }])).collect()
}

/// A fact of the given type carrying symbolic contents (`Fact::symbolic` for non-i64 types
/// and explicit shapes).
pub fn with_sym(dtype: DType, shape: Vec<Dim>, sym: Option<Vec<Dim>>) -> Fact {
    Fact { ty: ValueType::new(dtype, shape), konst: None, sym }
}

/// Legacy (opset < 7) broadcasting: `B` is aligned to `A` starting at `axis`.
fn legacy_expand(a_rank: usize, b_shape: &[usize], axis: i64) -> OpResult<Vec<usize>> {
    let axis = crate::ir::broadcast::normalize_axis(axis, a_rank.max(1))?;
    crate::op_ensure!(
        axis + b_shape.len() <= a_rank,
        "legacy broadcast: B of rank {} does not fit A of rank {a_rank} at axis {axis}",
        b_shape.len()
    );
    let mut shape = vec![1; a_rank];
    shape[axis..axis + b_shape.len()].copy_from_slice(b_shape);
    Ok(shape)
}

fn legacy_expand_dims(a_rank: usize, b_shape: &[Dim], axis: i64) -> OpResult<Vec<Dim>> {
    let start = crate::ir::broadcast::normalize_axis(axis, a_rank.max(1))?;
    crate::op_ensure!(
        start + b_shape.len() <= a_rank,
        "legacy broadcast: B of rank {} does not fit A of rank {a_rank} at axis {start}",
        b_shape.len()
    );
    let mut shape = vec![Dim::known(1); a_rank];
    shape[start..start + b_shape.len()].clone_from_slice(b_shape);
    Ok(shape)
}

// ---------------------------------------------------------------------------------------------
// Binary ops: Add, Sub, Mul, Div, Mod.

/// Opset < 7 broadcasting rules of the binary ops (`broadcast`/`axis` attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegacyBroadcast {
    /// `broadcast=0`: shapes must be equal.
    None,
    /// `broadcast=1` with `axis`: B is aligned to A at `axis`.
    Axis(i64),
}

#[derive(Clone, Debug)]
pub struct BinaryOp {
    pub kind: BinaryKind,
    /// Only set for opset < 7 models that used the legacy attributes.
    pub legacy: Option<LegacyBroadcast>,
    /// Floor modulo of floats (`Mod` with `fmod=0`) is only defined from opset 28.
    pub float_floor_mod: bool,
}

impl BinaryOp {
    fn b_shape(&self, a: &Fact, b: &Fact) -> OpResult<Vec<Dim>> {
        match self.legacy {
            Some(LegacyBroadcast::None) => {
                crate::op_ensure!(
                    a.shape() == b.shape(),
                    "broadcast=0 requires equal shapes, got {} and {}",
                    crate::ir::dim::fmt_shape(a.shape()),
                    crate::ir::dim::fmt_shape(b.shape())
                );
                Ok(b.shape().to_vec())
            }
            Some(LegacyBroadcast::Axis(axis)) => legacy_expand_dims(a.rank(), b.shape(), axis),
            None => Ok(b.shape().to_vec()),
        }
    }

    fn sym(&self, a: &Fact, b: &Fact) -> Option<Vec<Dim>> {
        if a.dtype() != DType::I64 || self.legacy.is_some() {
            return None;
        }
        sym_zip(a, b, |x, y| sym_binary(self.kind, x, y))
    }
}

/// One element of symbolic shape arithmetic; `None` when the result is not expressible.
fn sym_binary(kind: BinaryKind, x: &Dim, y: &Dim) -> Option<Dim> {
    if let (Some(p), Some(q)) = (x.as_known(), y.as_known()) {
        if kernels_divides(kind) && q == 0 {
            return None;
        }
        return Some(Dim::known(kind.int(p, q)));
    }
    Some(match kind {
        BinaryKind::Add => x.add(y),
        BinaryKind::Sub => x.sub(y),
        BinaryKind::Mul => x.mul(y),
        // Symbolic values are dims (non-negative), so truncating and flooring division agree
        // when the divisor is a positive constant.
        BinaryKind::Div => match y.as_known() {
            Some(q) if q > 0 => x.div_floor(y),
            _ => return None,
        },
        BinaryKind::Max => x.max_dim(y),
        BinaryKind::Min => x.min_dim(y),
        BinaryKind::Mod { .. } => return None,
    })
}

fn kernels_divides(kind: BinaryKind) -> bool {
    matches!(kind, BinaryKind::Div | BinaryKind::Mod { .. })
}

fn binary_name(kind: BinaryKind) -> &'static str {
    match kind {
        BinaryKind::Add => "Add",
        BinaryKind::Sub => "Sub",
        BinaryKind::Mul => "Mul",
        BinaryKind::Div => "Div",
        BinaryKind::Mod { .. } => "Mod",
        BinaryKind::Max => "Max",
        BinaryKind::Min => "Min",
    }
}

impl Op for BinaryOp {
    fn op_type(&self) -> &'static str {
        binary_name(self.kind)
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let f = required_all(inputs, 2)?;
        let dtype = same_dtype(&f)?;
        ensure_numeric(dtype)?;
        if let BinaryKind::Mod { fmod: false } = self.kind {
            crate::op_ensure!(
                !dtype.is_float() || self.float_floor_mod,
                "attribute 'fmod' must be 1 for floating-point inputs (floor modulo of floats needs opset 28)"
            );
        }
        let b_shape = self.b_shape(f[0], f[1])?;
        let shape = broadcast_shapes(&[f[0].shape(), &b_shape])?;
        let sym = self.sym(f[0], f[1]);
        Ok(vec![with_sym(dtype, shape, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let out = match self.legacy {
            Some(LegacyBroadcast::Axis(axis)) => {
                let shape = legacy_expand(a.rank(), b.shape(), axis)?;
                let b =
                    b.reshaped(&shape).ok_or_else(|| crate::ir::OpError("legacy broadcast reshape failed".into()))?;
                kernels::binary(self.kind, a, &b)?
            }
            _ => kernels::binary(self.kind, a, b)?,
        };
        Ok(vec![out])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Shared parser of Add/Sub/Mul/Div/Mod: opsets 1–6 carry `broadcast`/`axis` (legacy
/// broadcasting, supported: B aligned to A at `axis`, or equal shapes when `broadcast=0`);
/// opset 7+ uses numpy multidirectional broadcasting; opsets 13/14 only add types.
fn parse_binary(ctx: &NodeCtx, kind: BinaryKind) -> OpResult<Box<dyn Op>> {
    let legacy = if ctx.opset < 7 {
        if ctx.flag("broadcast", false)? {
            // Without `axis`, legacy broadcasting aligns the suffix: the same as numpy here.
            ctx.int("axis")?.map(LegacyBroadcast::Axis)
        } else {
            Some(LegacyBroadcast::None)
        }
    } else {
        None
    };
    Ok(Box::new(BinaryOp { kind, legacy, float_floor_mod: ctx.opset >= 28 }))
}

/// `Add` (opset 1, 6, 7, 13, 14): see `parse_binary` for the broadcasting history.
fn parse_add(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_binary(ctx, BinaryKind::Add)
}

/// `Sub` (opset 1, 6, 7, 13, 14): see `parse_binary`.
fn parse_sub(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_binary(ctx, BinaryKind::Sub)
}

/// `Mul` (opset 1, 6, 7, 13, 14): see `parse_binary`.
fn parse_mul(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_binary(ctx, BinaryKind::Mul)
}

/// `Div` (opset 1, 6, 7, 13, 14): see `parse_binary`. Integer division truncates toward zero
/// (ONNX Runtime); a zero integer divisor is an evaluation error.
fn parse_div(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse_binary(ctx, BinaryKind::Div)
}

/// `Mod` (opset 10, 13): `fmod=0` (default) takes the divisor's sign (Python `%`), integers
/// only before opset 28; `fmod=1` is C `fmod` (the dividend's sign).
fn parse_mod(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let fmod = ctx.flag("fmod", false)?;
    Ok(Box::new(BinaryOp { kind: BinaryKind::Mod { fmod }, legacy: None, float_floor_mod: ctx.opset >= 28 }))
}

// ---------------------------------------------------------------------------------------------
// Pow.

#[derive(Clone, Debug)]
pub struct PowOp {
    pub legacy: Option<LegacyBroadcast>,
}

impl Op for PowOp {
    fn op_type(&self) -> &'static str {
        "Pow"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let f = required_all(inputs, 2)?;
        ensure_numeric(f[0].dtype())?;
        ensure_numeric(f[1].dtype())?;
        let helper = BinaryOp { kind: BinaryKind::Mul, legacy: self.legacy, float_floor_mod: false };
        let b_shape = helper.b_shape(f[0], f[1])?;
        Ok(vec![Fact::new(f[0].dtype(), broadcast_shapes(&[f[0].shape(), &b_shape])?)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let a = required(inputs, 0, "X")?;
        let b = required(inputs, 1, "Y")?;
        if let Some(LegacyBroadcast::Axis(axis)) = self.legacy {
            let shape = legacy_expand(a.rank(), b.shape(), axis)?;
            let b = b.reshaped(&shape).ok_or_else(|| crate::ir::OpError("legacy broadcast reshape failed".into()))?;
            return Ok(vec![kernels::pow(a, &b)?]);
        }
        Ok(vec![kernels::pow(a, b)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `Pow` (opset 1, 7, 12, 13, 15): opset < 7 legacy broadcasting as in `parse_binary`;
/// opset 12+ lets the exponent have its own numeric type (the output has the base's type);
/// earlier opsets required one type, a subset of what is accepted here.
fn parse_pow(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let legacy = if ctx.opset < 7 {
        if ctx.flag("broadcast", false)? {
            ctx.int("axis")?.map(LegacyBroadcast::Axis)
        } else {
            Some(LegacyBroadcast::None)
        }
    } else {
        None
    };
    Ok(Box::new(PowOp { legacy }))
}

// ---------------------------------------------------------------------------------------------
// Variadic ops: Sum, Mean, Max, Min.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VariadicKind {
    Sum,
    Mean,
    Max,
    Min,
}

#[derive(Clone, Debug)]
pub struct VariadicOp {
    pub kind: VariadicKind,
}

impl Op for VariadicOp {
    fn op_type(&self) -> &'static str {
        match self.kind {
            VariadicKind::Sum => "Sum",
            VariadicKind::Mean => "Mean",
            VariadicKind::Max => "Max",
            VariadicKind::Min => "Min",
        }
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        crate::op_ensure!(!inputs.is_empty(), "at least one input is required");
        let f = required_all(inputs, inputs.len())?;
        let dtype = same_dtype(&f)?;
        match self.kind {
            VariadicKind::Sum | VariadicKind::Mean => ensure_float(dtype)?,
            VariadicKind::Max | VariadicKind::Min => ensure_numeric(dtype)?,
        }
        let shape = broadcast_facts(&f)?;
        let sym = match (self.kind, f.as_slice()) {
            (VariadicKind::Max, [a, b]) if dtype == DType::I64 => sym_zip(a, b, |x, y| Some(x.max_dim(y))),
            (VariadicKind::Min, [a, b]) if dtype == DType::I64 => sym_zip(a, b, |x, y| Some(x.min_dim(y))),
            _ => None,
        };
        Ok(vec![with_sym(dtype, shape, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let ts: Vec<&Tensor> = (0..inputs.len()).map(|i| required(inputs, i, "data")).collect::<OpResult<_>>()?;
        let out = match self.kind {
            VariadicKind::Sum => kernels::variadic(BinaryKind::Add, &ts)?,
            VariadicKind::Mean => kernels::mean(&ts)?,
            VariadicKind::Max => kernels::variadic(BinaryKind::Max, &ts)?,
            VariadicKind::Min => kernels::variadic(BinaryKind::Min, &ts)?,
        };
        Ok(vec![out])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `Sum` (opset 1, 6, 8, 13): opset 8 added multidirectional broadcasting; earlier versions
/// required equal shapes, which broadcasting accepts too. Floating-point types only.
fn parse_sum(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(VariadicOp { kind: VariadicKind::Sum }))
}

/// `Mean` (opset 1, 6, 8, 13): as `Sum`.
fn parse_mean(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(VariadicOp { kind: VariadicKind::Mean }))
}

/// `Max` (opset 1, 6, 8, 12, 13): broadcasting from 8, integer types from 12 (accepted for any
/// opset). NaN propagates.
fn parse_max(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(VariadicOp { kind: VariadicKind::Max }))
}

/// `Min` (opset 1, 6, 8, 12, 13): as `Max`.
fn parse_min(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(VariadicOp { kind: VariadicKind::Min }))
}

// ---------------------------------------------------------------------------------------------
// Unary math.

#[derive(Clone, Debug)]
pub struct UnaryOp {
    pub kind: UnaryKind,
}

impl Op for UnaryOp {
    fn op_type(&self) -> &'static str {
        match self.kind {
            UnaryKind::Sqrt => "Sqrt",
            UnaryKind::Reciprocal => "Reciprocal",
            UnaryKind::Exp => "Exp",
            UnaryKind::Log => "Log",
            UnaryKind::Neg => "Neg",
            UnaryKind::Abs => "Abs",
            UnaryKind::Floor => "Floor",
            UnaryKind::Ceil => "Ceil",
            UnaryKind::Round => "Round",
            UnaryKind::Sign => "Sign",
            UnaryKind::Sin => "Sin",
            UnaryKind::Cos => "Cos",
            UnaryKind::Tan => "Tan",
            UnaryKind::Asin => "Asin",
            UnaryKind::Acos => "Acos",
            UnaryKind::Atan => "Atan",
            UnaryKind::Sinh => "Sinh",
            UnaryKind::Cosh => "Cosh",
            UnaryKind::Asinh => "Asinh",
            UnaryKind::Acosh => "Acosh",
            UnaryKind::Atanh => "Atanh",
        }
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let dtype = x.dtype();
        if !dtype.is_float() {
            let ok = self.kind.accepts_int() && dtype.is_int() && (dtype.is_signed() || !self.kind.needs_signed());
            crate::op_ensure!(
                ok,
                "element type {dtype} is not supported ({})",
                if self.kind.accepts_int() { "numeric types only" } else { "floating-point types only" }
            );
        }
        // Neg/Abs of symbolic shape values stay symbolic (e.g. `Neg` in slice-end arithmetic).
        let sym = match (self.kind, x.rank() <= 1 && dtype == DType::I64) {
            (UnaryKind::Neg, true) => x.as_dims().map(|d| d.iter().map(Dim::neg).collect()),
            (UnaryKind::Abs, true) => x.as_ints().map(|v| v.iter().map(|i| Dim::known(i.wrapping_abs())).collect()),
            _ => None,
        };
        Ok(vec![with_sym(dtype, x.shape().to_vec(), sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![kernels::unary(self.kind, required(inputs, 0, "X")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn unary(kind: UnaryKind) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(UnaryOp { kind }))
}

/// `Sqrt` (opset 1, 6, 13): opset < 6 `consumed_inputs` is a legacy optimisation hint, ignored.
fn parse_sqrt(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Sqrt)
}

/// `Reciprocal` (opset 1, 6, 13): `consumed_inputs` (opset < 6) ignored.
fn parse_reciprocal(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Reciprocal)
}

/// `Exp` (opset 1, 6, 13): `consumed_inputs` (opset < 6) ignored.
fn parse_exp(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Exp)
}

/// `Log` (opset 1, 6, 13): `consumed_inputs` (opset < 6) ignored.
fn parse_log(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Log)
}

/// `Neg` (opset 1, 6, 13): signed integers from opset 6 (accepted for any opset); unsigned
/// types are rejected.
fn parse_neg(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Neg)
}

/// `Abs` (opset 1, 6, 13): all numeric types from opset 6.
fn parse_abs(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Abs)
}

/// `Floor` (opset 1, 6, 13): floats only.
fn parse_floor(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Floor)
}

/// `Ceil` (opset 1, 6, 13): floats only.
fn parse_ceil(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Ceil)
}

/// `Round` (opset 11, 22): halves round to even.
fn parse_round(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Round)
}

/// `Sign` (opset 9, 13): all numeric types; NaN stays NaN.
fn parse_sign(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Sign)
}

/// `Sin` (opset 7, 22).
fn parse_sin(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Sin)
}

/// `Cos` (opset 7, 22).
fn parse_cos(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Cos)
}

/// `Tan` (opset 7, 22).
fn parse_tan(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Tan)
}

/// `Asin` (opset 7, 22).
fn parse_asin(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Asin)
}

/// `Acos` (opset 7, 22).
fn parse_acos(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Acos)
}

/// `Atan` (opset 7, 22).
fn parse_atan(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Atan)
}

/// `Sinh` (opset 9, 22).
fn parse_sinh(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Sinh)
}

/// `Cosh` (opset 9, 22).
fn parse_cosh(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Cosh)
}

/// `Asinh` (opset 9, 22).
fn parse_asinh(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Asinh)
}

/// `Acosh` (opset 9, 22).
fn parse_acosh(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Acosh)
}

/// `Atanh` (opset 9, 22).
fn parse_atanh(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    unary(UnaryKind::Atanh)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ir::Attr;
    use std::sync::Arc;

    use crate::ir::ops::testutil::parse_node as parse;

    pub(crate) fn fact(dtype: DType, shape: &[Dim]) -> Fact {
        Fact::new(dtype, shape.to_vec())
    }

    pub(crate) fn infer(op: &dyn Op, facts: &[Fact]) -> OpResult<Vec<Fact>> {
        let refs: Vec<Option<&Fact>> = facts.iter().map(Some).collect();
        op.infer(&refs)
    }

    pub(crate) fn eval(op: &dyn Op, ts: &[Tensor]) -> OpResult<Vec<Tensor>> {
        let refs: Vec<Option<&Tensor>> = ts.iter().map(Some).collect();
        op.eval(&refs)
    }

    fn n() -> Dim {
        Dim::sym("N")
    }

    #[test]
    fn add_infers_symbolic_broadcast() {
        let op = parse("Add", 14, &[], &[true, true], 1).unwrap();
        let out =
            infer(&*op, &[fact(DType::F32, &[n(), Dim::known(3), Dim::known(1)]), fact(DType::F32, &[Dim::known(4)])])
                .unwrap();
        assert_eq!(out[0].shape(), &[n(), Dim::known(3), Dim::known(4)]);
        let err = infer(&*op, &[fact(DType::F32, &[Dim::known(2), Dim::known(3)]), fact(DType::F32, &[Dim::known(4)])])
            .unwrap_err();
        assert!(err.0.contains("[2,3] and [4] cannot be broadcast"), "{}", err.0);
        let err = infer(&*op, &[fact(DType::F32, &[Dim::known(2)]), fact(DType::I64, &[Dim::known(2)])]).unwrap_err();
        assert!(err.0.contains("must match"), "{}", err.0);
        let err = infer(&*op, &[fact(DType::Bool, &[Dim::known(2)]), fact(DType::Bool, &[Dim::known(2)])]).unwrap_err();
        assert!(err.0.contains("bool"), "{}", err.0);
    }

    #[test]
    fn shape_arithmetic_stays_symbolic() {
        // Shape → Gather gives [N, S]; Mul by 64 and Div by 2 keep the expressions.
        let shape = Fact::symbolic(vec![n(), Dim::sym("S")], false);
        let k = Fact::constant(Arc::new(Tensor::from_i64s(&[], vec![64])));
        let mul = parse("Mul", 13, &[], &[true, true], 1).unwrap();
        let out = infer(&*mul, &[shape.clone(), k]).unwrap();
        assert_eq!(out[0].sym, Some(vec![n().mul(&Dim::known(64)), Dim::sym("S").mul(&Dim::known(64))]));
        assert_eq!(out[0].shape(), &[Dim::known(2)]);
        let div = parse("Div", 13, &[], &[true, true], 1).unwrap();
        let two = Fact::constant(Arc::new(Tensor::from_i64s(&[1], vec![2])));
        let halved = infer(&*div, &[out[0].clone(), two]).unwrap();
        assert_eq!(halved[0].sym, Some(vec![n().mul(&Dim::known(32)), Dim::sym("S").mul(&Dim::known(32))]));
        let scalar = Fact::symbolic(vec![n()], true);
        let one = Fact::symbolic(vec![Dim::known(1)], true);
        let sub = parse("Sub", 13, &[], &[true, true], 1).unwrap();
        let out = infer(&*sub, &[scalar.clone(), one]).unwrap();
        assert_eq!(out[0].rank(), 0);
        assert_eq!(out[0].sym, Some(vec![n().sub(&Dim::known(1))]));
        let max = parse("Max", 13, &[], &[true, true], 1).unwrap();
        let out = infer(&*max, &[scalar.clone(), scalar]).unwrap();
        assert_eq!(out[0].sym, Some(vec![n()]));
        // Float values carry no symbolic contents.
        let out = infer(&*mul, &[fact(DType::F32, &[Dim::known(2)]), fact(DType::F32, &[Dim::known(2)])]).unwrap();
        assert!(out[0].sym.is_none());
    }

    #[test]
    fn eval_binary_and_variadic() {
        let a = Tensor::from_f32s(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        let b = Tensor::from_f32s(&[2], vec![10.0, 20.0]);
        let sub = parse("Sub", 14, &[], &[true, true], 1).unwrap();
        assert_eq!(eval(&*sub, &[a.clone(), b.clone()]).unwrap()[0].to_f64_vec(), vec![-9.0, -18.0, -7.0, -16.0]);
        let sum = parse("Sum", 13, &[], &[true, true, true], 1).unwrap();
        let out = infer(
            &*sum,
            &[fact(DType::F32, &[n(), Dim::known(2)]), fact(DType::F32, &[Dim::known(2)]), fact(DType::F32, &[])],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[n(), Dim::known(2)]);
        let r = eval(&*sum, &[a.clone(), b, Tensor::from_f32s(&[], vec![0.5])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![11.5, 22.5, 13.5, 24.5]);
        let err = infer(&*sum, &[fact(DType::I32, &[]), fact(DType::I32, &[])]).unwrap_err();
        assert!(err.0.contains("floating-point"), "{}", err.0);
        let min = parse("Min", 13, &[], &[true], 1).unwrap();
        assert_eq!(eval(&*min, std::slice::from_ref(&a)).unwrap()[0], a);
    }

    #[test]
    fn mod_attribute_and_float_rule() {
        let m = parse("Mod", 13, &[], &[true, true], 1).unwrap();
        let err = infer(&*m, &[fact(DType::F32, &[]), fact(DType::F32, &[])]).unwrap_err();
        assert!(err.0.contains("fmod"), "{}", err.0);
        let m = parse("Mod", 13, &[("fmod", Attr::Int(1))], &[true, true], 1).unwrap();
        let r = eval(&*m, &[Tensor::from_f32s(&[2], vec![-7.0, 7.0]), Tensor::from_f32s(&[1], vec![2.0])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![-1.0, 1.0]);
        assert!(parse("Mod", 13, &[("fmod", Attr::Int(2))], &[true, true], 1).is_err());
    }

    #[test]
    fn legacy_axis_broadcast() {
        let add = parse("Add", 6, &[("broadcast", Attr::Int(1)), ("axis", Attr::Int(1))], &[true, true], 1).unwrap();
        let out =
            infer(&*add, &[fact(DType::F32, &[n(), Dim::known(3), Dim::known(2)]), fact(DType::F32, &[Dim::known(3)])])
                .unwrap();
        assert_eq!(out[0].shape(), &[n(), Dim::known(3), Dim::known(2)]);
        let a = Tensor::from_f32s(&[1, 3, 2], vec![0.0; 6]);
        let r = eval(&*add, &[a, Tensor::from_f32s(&[3], vec![1.0, 2.0, 3.0])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
        let strict = parse("Add", 6, &[], &[true, true], 1).unwrap();
        assert!(infer(&*strict, &[fact(DType::F32, &[Dim::known(2)]), fact(DType::F32, &[Dim::known(1)])]).is_err());
    }

    #[test]
    fn pow_infers_base_type() {
        let p = parse("Pow", 15, &[], &[true, true], 1).unwrap();
        let out = infer(&*p, &[fact(DType::F16, &[n()]), fact(DType::I64, &[])]).unwrap();
        assert_eq!(out[0].dtype(), DType::F16);
        let r = eval(&*p, &[Tensor::from_f32s(&[2], vec![2.0, 4.0]), Tensor::from_i64s(&[], vec![2])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![4.0, 16.0]);
    }

    #[test]
    fn unary_type_rules() {
        let sqrt = parse("Sqrt", 13, &[], &[true], 1).unwrap();
        assert!(infer(&*sqrt, &[fact(DType::I64, &[])]).unwrap_err().0.contains("floating-point"));
        let neg = parse("Neg", 13, &[], &[true], 1).unwrap();
        assert!(infer(&*neg, &[fact(DType::U8, &[])]).is_err());
        let out = infer(&*neg, &[Fact::symbolic(vec![n()], false)]).unwrap();
        assert_eq!(out[0].sym, Some(vec![n().neg()]));
        let r = eval(&*parse("Exp", 13, &[], &[true], 1).unwrap(), &[Tensor::from_f32s(&[1], vec![0.0])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![1.0]);
    }

    /// Runs ONNX-backend-style node cases (`<dir>/<case>/model.onnx` with
    /// `test_data_set_0/{input,output}_k.pb`) through import, inference and the reference
    /// executor. Ignored by default; generate cases with ONNX Runtime and run with
    /// `ONNX2AIT_NODE_CASES=<dir> cargo test --lib node_cases -- --ignored`.
    #[test]
    #[ignore]
    fn node_cases_match_recorded_outputs() {
        let Ok(root) = std::env::var("ONNX2AIT_NODE_CASES") else {
            return;
        };
        let mut dirs: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
        dirs.sort();
        let mut failures = Vec::new();
        for dir in &dirs {
            let name = dir.file_name().unwrap().to_string_lossy().to_string();
            if let Err(msg) = run_node_case(dir) {
                failures.push(format!("{name}: {msg}"));
            }
        }
        assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), dirs.len(), failures.join("\n"));
    }

    fn run_node_case(dir: &std::path::Path) -> Result<(), String> {
        let g = crate::onnx::load_model(&dir.join("model.onnx")).map_err(|e| e.to_string())?;
        let data = dir.join("test_data_set_0");
        let mut inputs = std::collections::BTreeMap::new();
        for k in 0.. {
            let p = data.join(format!("input_{k}.pb"));
            if !p.exists() {
                break;
            }
            let (name, t) = crate::onnx::read_tensor_file(&p).map_err(|e| e.to_string())?;
            inputs.insert(name, t);
        }
        let outs = crate::reference::run(&g, &inputs).map_err(|e| e.to_string())?;
        for (k, (_, got)) in outs.iter().enumerate() {
            let (_, want) =
                crate::onnx::read_tensor_file(&data.join(format!("output_{k}.pb"))).map_err(|e| e.to_string())?;
            if got.dtype() != want.dtype() || got.shape() != want.shape() {
                return Err(format!(
                    "output {k}: got {}{:?}, want {}{:?}",
                    got.dtype(),
                    got.shape(),
                    want.dtype(),
                    want.shape()
                ));
            }
            let tol = match want.dtype() {
                DType::F16 | DType::BF16 => 2e-3,
                DType::F32 => 2e-6,
                // ONNX Runtime's own float64 kernels use approximations (tanh) at ~1e-9.
                DType::F64 => 1e-8,
                _ => 0.0,
            };
            for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                let same = (a.is_nan() && b.is_nan()) || a == &b || (a - b).abs() <= tol * (1.0 + b.abs());
                if !same {
                    return Err(format!("output {k} element {i}: got {a}, want {b}"));
                }
            }
        }
        Ok(())
    }
}
