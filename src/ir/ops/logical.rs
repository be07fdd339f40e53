//! The logical op family: comparisons, boolean logic, NaN/Inf tests and `Where`.
//!
//! Comparisons and `Where` over symbolic shape values are decided at compile time when the
//! answer does not depend on the symbols' values (equal known ints, identical expressions, a
//! known difference such as `N+1 > N`), so shape subgraphs with such guards still fold.

use super::arithmetic::{broadcast_facts, required_all, same_dtype, sym_zip, with_sym};
use super::OpSpec;
use crate::ir::dim::known_shape;
use crate::ir::{required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::arithmetic::{self as kernels};
use ndarray::{ArrayD, IxDyn};
use std::any::Any;
use std::sync::Arc;

/// Elementwise comparison producing bool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareKind {
    Equal,
    Greater,
    GreaterOrEqual,
    Less,
    LessOrEqual,
}

/// Elementwise boolean logic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogicKind {
    And,
    Or,
    Xor,
}

/// Elementwise bit operations on integers of one type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BitKind {
    And,
    Or,
    Xor,
    /// `BitShift` with `direction="LEFT"`; shifting by the bit width or more gives 0.
    ShiftLeft,
    ShiftRight,
}

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Equal", parse_equal),
    OpSpec::onnx("Greater", parse_greater),
    OpSpec::onnx("GreaterOrEqual", parse_greater_or_equal),
    OpSpec::onnx("Less", parse_less),
    OpSpec::onnx("LessOrEqual", parse_less_or_equal),
    OpSpec::onnx("Not", parse_not),
    OpSpec::onnx("And", parse_and),
    OpSpec::onnx("Or", parse_or),
    OpSpec::onnx("Xor", parse_xor),
    OpSpec::onnx("IsNaN", parse_is_nan),
    OpSpec::onnx("IsInf", parse_is_inf),
    OpSpec::onnx("Where", parse_where),
    OpSpec::onnx("BitwiseAnd", parse_bitwise_and),
    OpSpec::onnx("BitwiseOr", parse_bitwise_or),
    OpSpec::onnx("BitwiseXor", parse_bitwise_xor),
    OpSpec::onnx("BitwiseNot", parse_bitwise_not),
    OpSpec::onnx("BitShift", parse_bit_shift),
];

/// Opsets 1–6 of the binary logical ops had legacy `broadcast`/`axis` attributes; the
/// suffix-aligned form is numpy broadcasting, the `axis` form is rejected.
fn reject_legacy_axis(ctx: &NodeCtx) -> OpResult<()> {
    if ctx.opset < 7 && ctx.flag("broadcast", false)? && ctx.has("axis") {
        crate::op_bail!("legacy broadcasting with attribute 'axis' (opset {}) is not supported", ctx.opset);
    }
    Ok(())
}

/// A bool constant of the given (known) shape.
fn bool_fact(shape: Vec<Dim>, values: Vec<bool>) -> Option<Fact> {
    let dims = known_shape(&shape)?;
    let t = Tensor::Bool(ArrayD::from_shape_vec(IxDyn(&dims), values).ok()?);
    let mut f = Fact::new(DType::Bool, shape);
    f.konst = Some(Arc::new(t));
    Some(f)
}

// ---------------------------------------------------------------------------------------------
// Comparisons.

#[derive(Clone, Debug)]
pub struct CompareOp {
    pub kind: CompareKind,
}

impl Op for CompareOp {
    fn op_type(&self) -> &'static str {
        match self.kind {
            CompareKind::Equal => "Equal",
            CompareKind::Greater => "Greater",
            CompareKind::GreaterOrEqual => "GreaterOrEqual",
            CompareKind::Less => "Less",
            CompareKind::LessOrEqual => "LessOrEqual",
        }
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let f = required_all(inputs, 2)?;
        let dtype = same_dtype(&f)?;
        crate::op_ensure!(
            dtype != DType::Bool || self.kind == CompareKind::Equal,
            "element type bool is not supported (numeric types only)"
        );
        let shape = broadcast_facts(&f)?;
        if dtype.is_int() {
            let decided = sym_zip(f[0], f[1], |x, y| decide(self.kind, &x.sub(y)));
            if let Some(fact) = decided.and_then(|v| bool_fact(shape.clone(), v)) {
                return Ok(vec![fact]);
            }
        }
        Ok(vec![Fact::new(DType::Bool, shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![kernels::compare(self.kind, required(inputs, 0, "A")?, required(inputs, 1, "B")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `a <kind> b` from the difference `d = a - b` of two symbolic values, when the sign of `d` is
/// settled: exactly for a known difference, else from the bounds that sizes give (`N - (-1)`
/// is at least 1, so `N == -1` is false: PyTorch's exporters test shapes against -1 that way).
fn decide(kind: CompareKind, d: &Dim) -> Option<bool> {
    if let Some(v) = d.as_known() {
        return Some(kind.from_difference(v));
    }
    let (lo, hi) = (d.lower_bound(), d.upper_bound());
    let above = |v: i64| lo.is_some_and(|l| l > v);
    let at_least = |v: i64| lo.is_some_and(|l| l >= v);
    let below = |v: i64| hi.is_some_and(|h| h < v);
    let at_most = |v: i64| hi.is_some_and(|h| h <= v);
    match kind {
        CompareKind::Equal if above(0) || below(0) => Some(false),
        CompareKind::Greater if above(0) => Some(true),
        CompareKind::Greater if at_most(0) => Some(false),
        CompareKind::GreaterOrEqual if at_least(0) => Some(true),
        CompareKind::GreaterOrEqual if below(0) => Some(false),
        CompareKind::Less if below(0) => Some(true),
        CompareKind::Less if at_least(0) => Some(false),
        CompareKind::LessOrEqual if at_most(0) => Some(true),
        CompareKind::LessOrEqual if above(0) => Some(false),
        _ => None,
    }
}

fn compare(ctx: &NodeCtx, kind: CompareKind) -> OpResult<Box<dyn Op>> {
    reject_legacy_axis(ctx)?;
    Ok(Box::new(CompareOp { kind }))
}

/// `Equal` (opset 1, 7, 11, 13, 19): 7 introduced numpy broadcasting, 11 added floats and
/// bool comparisons beside integers, 19 strings (not a supported type). All accepted types
/// compare for any opset.
fn parse_equal(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    compare(ctx, CompareKind::Equal)
}

/// `Greater` (opset 1, 7, 9, 13): 9 added integer types (accepted for any opset).
fn parse_greater(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    compare(ctx, CompareKind::Greater)
}

/// `GreaterOrEqual` (opset 12, 16).
fn parse_greater_or_equal(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    compare(ctx, CompareKind::GreaterOrEqual)
}

/// `Less` (opset 1, 7, 9, 13): as `Greater`.
fn parse_less(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    compare(ctx, CompareKind::Less)
}

/// `LessOrEqual` (opset 12, 16).
fn parse_less_or_equal(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    compare(ctx, CompareKind::LessOrEqual)
}

// ---------------------------------------------------------------------------------------------
// Boolean logic.

#[derive(Clone, Debug)]
pub struct LogicOp {
    pub kind: LogicKind,
}

fn ensure_bool(f: &Fact, what: &str) -> OpResult<()> {
    crate::op_ensure!(f.dtype() == DType::Bool, "{what} must be bool, got {}", f.dtype());
    Ok(())
}

impl Op for LogicOp {
    fn op_type(&self) -> &'static str {
        match self.kind {
            LogicKind::And => "And",
            LogicKind::Or => "Or",
            LogicKind::Xor => "Xor",
        }
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let f = required_all(inputs, 2)?;
        ensure_bool(f[0], "input A")?;
        ensure_bool(f[1], "input B")?;
        Ok(vec![Fact::new(DType::Bool, broadcast_facts(&f)?)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![kernels::logic(self.kind, required(inputs, 0, "A")?, required(inputs, 1, "B")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn logic(ctx: &NodeCtx, kind: LogicKind) -> OpResult<Box<dyn Op>> {
    reject_legacy_axis(ctx)?;
    Ok(Box::new(LogicOp { kind }))
}

/// `And` (opset 1, 7): 7 introduced numpy broadcasting.
fn parse_and(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    logic(ctx, LogicKind::And)
}

/// `Or` (opset 1, 7): as `And`.
fn parse_or(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    logic(ctx, LogicKind::Or)
}

/// `Xor` (opset 1, 7): as `And`.
fn parse_xor(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    logic(ctx, LogicKind::Xor)
}

// ---------------------------------------------------------------------------------------------
// Unary predicates: Not, IsNaN, IsInf.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PredicateKind {
    Not,
    IsNaN,
    IsInf { negative: bool, positive: bool },
}

#[derive(Clone, Debug)]
pub struct PredicateOp {
    pub kind: PredicateKind,
}

impl Op for PredicateOp {
    fn op_type(&self) -> &'static str {
        match self.kind {
            PredicateKind::Not => "Not",
            PredicateKind::IsNaN => "IsNaN",
            PredicateKind::IsInf { .. } => "IsInf",
        }
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        match self.kind {
            PredicateKind::Not => ensure_bool(x, "the input")?,
            _ => crate::op_ensure!(
                x.dtype().is_float(),
                "element type {} is not supported (floating-point types only)",
                x.dtype()
            ),
        }
        Ok(vec![Fact::new(DType::Bool, x.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let out = match self.kind {
            PredicateKind::Not => {
                let a = x
                    .as_bool()
                    .ok_or_else(|| crate::ir::OpError(format!("the input must be bool, got {}", x.dtype())))?;
                a.mapv(|v| !v)
            }
            PredicateKind::IsNaN => float_predicate(x, f64::is_nan)?,
            PredicateKind::IsInf { negative, positive } => {
                float_predicate(x, |v| (positive && v == f64::INFINITY) || (negative && v == f64::NEG_INFINITY))?
            }
        };
        Ok(vec![Tensor::Bool(out)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A float predicate (exact through f64 for every float type: widening keeps NaN and ±∞).
fn float_predicate(x: &Tensor, f: impl Fn(f64) -> bool) -> OpResult<ArrayD<bool>> {
    use crate::ir::Elem;
    Ok(match x {
        Tensor::F32(a) => a.mapv(|v| f(v as f64)),
        Tensor::F64(a) => a.mapv(f),
        Tensor::F16(a) => a.mapv(|v| f(Elem::to_f64(v))),
        Tensor::BF16(a) => a.mapv(|v| f(Elem::to_f64(v))),
        _ => crate::op_bail!("element type {} is not supported (floating-point types only)", x.dtype()),
    })
}

/// `Not` (opset 1).
fn parse_not(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(PredicateOp { kind: PredicateKind::Not }))
}

/// `IsNaN` (opset 9, 13, 20): later versions only add types.
fn parse_is_nan(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(PredicateOp { kind: PredicateKind::IsNaN }))
}

/// `IsInf` (opset 10, 20): `detect_negative` and `detect_positive` (both default 1).
fn parse_is_inf(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let negative = ctx.flag("detect_negative", true)?;
    let positive = ctx.flag("detect_positive", true)?;
    Ok(Box::new(PredicateOp { kind: PredicateKind::IsInf { negative, positive } }))
}

// ---------------------------------------------------------------------------------------------
// Where.

#[derive(Clone, Debug)]
pub struct WhereOp;

impl WhereOp {
    /// Selects symbolic values when the condition is a known constant and both branches are
    /// known (possibly symbolic) integer values of rank ≤ 1.
    fn sym(cond: &Fact, x: &Fact, y: &Fact) -> Option<Vec<Dim>> {
        if !x.dtype().is_int() || cond.rank() > 1 || x.rank() > 1 || y.rank() > 1 {
            return None;
        }
        let c: Vec<bool> = cond.konst.as_ref()?.to_i64_vec().into_iter().map(|v| v != 0).collect();
        let (a, b) = (x.as_dims()?, y.as_dims()?);
        let n = c.len().max(a.len()).max(b.len());
        if [c.len(), a.len(), b.len()].iter().any(|&l| l != n && l != 1) {
            return None;
        }
        let pick = |l: usize, i: usize| if l == 1 { 0 } else { i };
        Some(
            (0..n)
                .map(|i| if c[pick(c.len(), i)] { a[pick(a.len(), i)].clone() } else { b[pick(b.len(), i)].clone() })
                .collect(),
        )
    }
}

impl Op for WhereOp {
    fn op_type(&self) -> &'static str {
        "Where"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let f = required_all(inputs, 3)?;
        ensure_bool(f[0], "condition")?;
        let dtype = same_dtype(&f[1..])?;
        let shape = broadcast_facts(&f)?;
        let sym = Self::sym(f[0], f[1], f[2]);
        Ok(vec![with_sym(dtype, shape, sym)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let c = required(inputs, 0, "condition")?;
        Ok(vec![kernels::where_select(c, required(inputs, 1, "X")?, required(inputs, 2, "Y")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `Where` (opset 9, 16): 16 only adds bfloat16. Three-way numpy broadcasting.
fn parse_where(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(WhereOp))
}

// ---------------------------------------------------------------------------------------------
// Bitwise ops.

#[derive(Clone, Debug)]
pub struct BitOp {
    pub kind: BitKind,
}

impl Op for BitOp {
    fn op_type(&self) -> &'static str {
        match self.kind {
            BitKind::And => "BitwiseAnd",
            BitKind::Or => "BitwiseOr",
            BitKind::Xor => "BitwiseXor",
            BitKind::ShiftLeft | BitKind::ShiftRight => "BitShift",
        }
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let f = required_all(inputs, 2)?;
        let dtype = same_dtype(&f)?;
        let shift = matches!(self.kind, BitKind::ShiftLeft | BitKind::ShiftRight);
        let ok = dtype.is_int() && !(shift && dtype.is_signed());
        crate::op_ensure!(
            ok,
            "element type {dtype} is not supported ({} types only)",
            if shift { "unsigned integer" } else { "integer" }
        );
        Ok(vec![Fact::new(dtype, broadcast_facts(&f)?)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![kernels::bitwise(self.kind, required(inputs, 0, "A")?, required(inputs, 1, "B")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `BitwiseNot`: complement of an integer tensor.
#[derive(Clone, Debug)]
pub struct BitwiseNotOp;

impl Op for BitwiseNotOp {
    fn op_type(&self) -> &'static str {
        "BitwiseNot"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        crate::op_ensure!(x.dtype().is_int(), "element type {} is not supported (integer types only)", x.dtype());
        Ok(vec![Fact::new(x.dtype(), x.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![kernels::bitwise_not(required(inputs, 0, "X")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `BitwiseAnd` (opset 18).
fn parse_bitwise_and(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(BitOp { kind: BitKind::And }))
}

/// `BitwiseOr` (opset 18).
fn parse_bitwise_or(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(BitOp { kind: BitKind::Or }))
}

/// `BitwiseXor` (opset 18).
fn parse_bitwise_xor(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(BitOp { kind: BitKind::Xor }))
}

/// `BitwiseNot` (opset 18).
fn parse_bitwise_not(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(BitwiseNotOp))
}

/// `BitShift` (opset 11): `direction` is required ("LEFT" or "RIGHT"); unsigned types only.
/// Shifting by the bit width or more gives 0.
fn parse_bit_shift(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let direction = ctx.req_string("direction")?;
    let kind = match direction.as_str() {
        "LEFT" => BitKind::ShiftLeft,
        "RIGHT" => BitKind::ShiftRight,
        _ => crate::op_bail!("attribute 'direction' = '{direction}' is not supported (expected \"LEFT\" or \"RIGHT\")"),
    };
    Ok(Box::new(BitOp { kind }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::arithmetic::tests::{eval, fact, infer};
    use crate::ir::ops::testutil::parse_node as parse;
    use crate::ir::Attr;

    fn n() -> Dim {
        Dim::sym("N")
    }

    #[test]
    fn comparisons_infer_and_eval() {
        let gt = parse("Greater", 13, &[], &[true, true], 1).unwrap();
        let out = infer(&*gt, &[fact(DType::F32, &[n(), Dim::known(1)]), fact(DType::F32, &[Dim::known(4)])]).unwrap();
        assert_eq!(out[0].dtype(), DType::Bool);
        assert_eq!(out[0].shape(), &[n(), Dim::known(4)]);
        assert!(infer(&*gt, &[fact(DType::Bool, &[]), fact(DType::Bool, &[])]).is_err());
        let eq = parse("Equal", 13, &[], &[true, true], 1).unwrap();
        assert!(infer(&*eq, &[fact(DType::Bool, &[]), fact(DType::Bool, &[])]).is_ok());
        let r = eval(&*gt, &[Tensor::from_i64s(&[3], vec![1, 2, 3]), Tensor::from_i64s(&[], vec![2])]).unwrap();
        assert_eq!(r[0].to_i64_vec(), vec![0, 0, 1]);
        let le = parse("LessOrEqual", 16, &[], &[true, true], 1).unwrap();
        let r = eval(&*le, &[Tensor::from_f32s(&[2], vec![1.0, f32::NAN]), Tensor::from_f32s(&[], vec![1.0])]).unwrap();
        assert_eq!(r[0].to_i64_vec(), vec![1, 0]);
    }

    #[test]
    fn symbolic_comparisons_decide_when_possible() {
        let eq = parse("Equal", 13, &[], &[true, true], 1).unwrap();
        let a = Fact::symbolic(vec![n(), Dim::known(3), Dim::sym("S")], false);
        let b = Fact::symbolic(vec![n(), Dim::known(3), Dim::known(3)], false);
        // S vs 3 is undecidable: only the type is known.
        let out = infer(&*eq, &[a.clone(), b]).unwrap();
        assert!(out[0].konst.is_none());
        let c = Fact::symbolic(vec![n(), Dim::known(4), Dim::sym("S")], false);
        let out = infer(&*eq, &[a.clone(), c]).unwrap();
        assert_eq!(out[0].konst.as_ref().unwrap().to_i64_vec(), vec![1, 0, 1]);
        let gt = parse("Greater", 13, &[], &[true, true], 1).unwrap();
        let n1 = Fact::symbolic(vec![n().add(&Dim::known(1))], true);
        let out = infer(&*gt, &[n1, Fact::symbolic(vec![n()], true)]).unwrap();
        assert_eq!(out[0].rank(), 0);
        assert_eq!(out[0].konst.as_ref().unwrap().to_i64_vec(), vec![1]);
    }

    #[test]
    fn sizes_are_never_negative() {
        // PyTorch's `Where(Equal(shape, -1), 1, shape)` before an Expand: a size is never -1.
        let eq = parse("Equal", 13, &[], &[true, true], 1).unwrap();
        let shape = Fact::symbolic(vec![n(), Dim::known(-1), Dim::sym("S").mul(&Dim::known(2))], false);
        let minus_one = Fact::symbolic(vec![Dim::known(-1); 3], false);
        let out = infer(&*eq, &[shape, minus_one]).unwrap();
        assert_eq!(out[0].konst.as_ref().unwrap().to_i64_vec(), vec![0, 1, 0]);
        let ge = parse("GreaterOrEqual", 16, &[], &[true, true], 1).unwrap();
        let out = infer(&*ge, &[Fact::symbolic(vec![n()], true), Fact::symbolic(vec![Dim::known(0)], true)]).unwrap();
        assert_eq!(out[0].konst.as_ref().unwrap().to_i64_vec(), vec![1]);
        // N > 0 is not settled (a size may be 0), nor N == S.
        let gt = parse("Greater", 13, &[], &[true, true], 1).unwrap();
        let out = infer(&*gt, &[Fact::symbolic(vec![n()], true), Fact::symbolic(vec![Dim::known(0)], true)]).unwrap();
        assert!(out[0].konst.is_none());
        let out = infer(&*eq, &[Fact::symbolic(vec![n()], true), Fact::symbolic(vec![Dim::sym("S")], true)]).unwrap();
        assert!(out[0].konst.is_none());
    }

    #[test]
    fn where_selects_symbols() {
        let w = parse("Where", 16, &[], &[true, true, true], 1).unwrap();
        let cond = Fact::constant(Arc::new(Tensor::Bool(ndarray::arr1(&[true, false]).into_dyn())));
        let x = Fact::symbolic(vec![n(), Dim::known(8)], false);
        let y = Fact::constant(Arc::new(Tensor::from_i64s(&[], vec![-1])));
        let out = infer(&*w, &[cond, x, y]).unwrap();
        assert_eq!(out[0].sym, Some(vec![n(), Dim::known(-1)]));
        let out = infer(
            &*w,
            &[fact(DType::Bool, &[n(), Dim::known(1)]), fact(DType::F16, &[Dim::known(3)]), fact(DType::F16, &[])],
        )
        .unwrap();
        assert_eq!(out[0].dtype(), DType::F16);
        assert_eq!(out[0].shape(), &[n(), Dim::known(3)]);
        assert!(infer(&*w, &[fact(DType::I64, &[]), fact(DType::F32, &[]), fact(DType::F32, &[])])
            .unwrap_err()
            .0
            .contains("condition must be bool"));
        assert!(infer(&*w, &[fact(DType::Bool, &[]), fact(DType::F32, &[]), fact(DType::F16, &[])]).is_err());
    }

    #[test]
    fn predicates_and_logic() {
        let inf = parse("IsInf", 20, &[("detect_negative", Attr::Int(0))], &[true], 1).unwrap();
        let x = Tensor::from_f32s(&[4], vec![f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1.0]);
        assert_eq!(eval(&*inf, std::slice::from_ref(&x)).unwrap()[0].to_i64_vec(), vec![1, 0, 0, 0]);
        let nan = parse("IsNaN", 13, &[], &[true], 1).unwrap();
        assert_eq!(eval(&*nan, &[x.cast(DType::F16)]).unwrap()[0].to_i64_vec(), vec![0, 0, 1, 0]);
        assert!(infer(&*nan, &[fact(DType::I32, &[])]).is_err());
        let not = parse("Not", 1, &[], &[true], 1).unwrap();
        let b = Tensor::Bool(ndarray::arr1(&[true, false]).into_dyn());
        assert_eq!(eval(&*not, std::slice::from_ref(&b)).unwrap()[0].to_i64_vec(), vec![0, 1]);
        let and = parse("And", 7, &[], &[true, true], 1).unwrap();
        assert!(infer(&*and, &[fact(DType::I64, &[]), fact(DType::Bool, &[])]).is_err());
        assert_eq!(
            eval(&*and, &[b.clone(), Tensor::Bool(ndarray::arr0(true).into_dyn())]).unwrap()[0].to_i64_vec(),
            vec![1, 0]
        );
        assert!(parse("Or", 1, &[("broadcast", Attr::Int(1)), ("axis", Attr::Int(0))], &[true, true], 1).is_err());
    }

    #[test]
    fn bitwise_ops() {
        let shl = parse("BitShift", 11, &[("direction", Attr::String("LEFT".into()))], &[true, true], 1).unwrap();
        assert!(infer(&*shl, &[fact(DType::I32, &[]), fact(DType::I32, &[])]).unwrap_err().0.contains("unsigned"));
        let a = Tensor::U32(ndarray::arr1(&[1u32, 3]).into_dyn());
        let b = Tensor::U32(ndarray::arr1(&[4u32]).into_dyn());
        assert_eq!(eval(&*shl, &[a.clone(), b]).unwrap()[0].to_i64_vec(), vec![16, 48]);
        assert!(parse("BitShift", 11, &[("direction", Attr::String("UP".into()))], &[true, true], 1).is_err());
        let and = parse("BitwiseAnd", 18, &[], &[true, true], 1).unwrap();
        let out = infer(&*and, &[fact(DType::I64, &[n()]), fact(DType::I64, &[])]).unwrap();
        assert_eq!(out[0].shape(), &[n()]);
        assert!(infer(&*and, &[fact(DType::Bool, &[]), fact(DType::Bool, &[])]).is_err());
        let not = parse("BitwiseNot", 18, &[], &[true], 1).unwrap();
        assert_eq!(
            eval(&*not, &[Tensor::U32(ndarray::arr1(&[0u32]).into_dyn())]).unwrap()[0].to_i64_vec(),
            vec![u32::MAX as i64]
        );
    }
}
