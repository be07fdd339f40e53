//! Reference kernels of the arithmetic op family, and the numpy-broadcasting helpers every
//! elementwise family (activation, logical, cast) shares.
//!
//! Floating point: f32 and f64 are computed natively; f16/bf16 go through f32 and round once at
//! the end. Integers are exact in their own type with wrap-around on overflow (what ONNX Runtime
//! does on the CPU), so int64 shape arithmetic is exact.

use crate::ir::broadcast::broadcast_usize;
use crate::ir::ops::arithmetic::{BinaryKind, UnaryKind};
use crate::ir::ops::logical::{BitKind, CompareKind, LogicKind};
use crate::ir::{DType, Elem, OpError, OpResult, Tensor};
use ndarray::{ArrayD, IxDyn, Zip};
use num_traits::{
    CheckedRem, CheckedShl, CheckedShr, Float, PrimInt, WrappingAdd, WrappingMul, WrappingNeg, WrappingSub,
};

/// Integer element types with the wrapping arithmetic the integer kernels need.
pub trait IntElem:
    Elem + PrimInt + CheckedRem + CheckedShl + CheckedShr + WrappingAdd + WrappingSub + WrappingMul + WrappingNeg
{
}
impl IntElem for i8 {}
impl IntElem for i16 {}
impl IntElem for i32 {}
impl IntElem for i64 {}
impl IntElem for u8 {}
impl IntElem for u16 {}
impl IntElem for u32 {}
impl IntElem for u64 {}

fn first<T: Copy>(a: &ArrayD<T>) -> OpResult<T> {
    a.iter().next().copied().ok_or_else(|| OpError("empty tensor where one element was expected".into()))
}

/// `f` applied elementwise over the numpy broadcast of `a` and `b`.
///
/// Same shapes zip directly and a one-element operand is mapped over the other without any
/// index arithmetic (the common cases: residual adds, bias/scale constants); everything else
/// zips broadcast views.
pub fn zip_broadcast<A: Copy, B: Copy, O>(a: &ArrayD<A>, b: &ArrayD<B>, f: impl Fn(A, B) -> O) -> OpResult<ArrayD<O>> {
    if a.shape() == b.shape() {
        return Ok(Zip::from(a).and(b).map_collect(|&x, &y| f(x, y)));
    }
    let shape = broadcast_usize(&[a.shape(), b.shape()])?;
    if b.len() == 1 && a.shape() == shape.as_slice() {
        let y = first(b)?;
        return Ok(a.mapv(|x| f(x, y)));
    }
    if a.len() == 1 && b.shape() == shape.as_slice() {
        let x = first(a)?;
        return Ok(b.mapv(|y| f(x, y)));
    }
    let av = a.broadcast(IxDyn(&shape)).ok_or_else(|| broadcast_error(&[a.shape(), b.shape()]))?;
    let bv = b.broadcast(IxDyn(&shape)).ok_or_else(|| broadcast_error(&[a.shape(), b.shape()]))?;
    Ok(Zip::from(&av).and(&bv).map_collect(|&x, &y| f(x, y)))
}

/// `f` applied elementwise over the numpy broadcast of three arrays (`Where`).
pub fn zip3_broadcast<A: Copy, B: Copy, C: Copy, O>(
    a: &ArrayD<A>,
    b: &ArrayD<B>,
    c: &ArrayD<C>,
    f: impl Fn(A, B, C) -> O,
) -> OpResult<ArrayD<O>> {
    if a.shape() == b.shape() && b.shape() == c.shape() {
        return Ok(Zip::from(a).and(b).and(c).map_collect(|&x, &y, &z| f(x, y, z)));
    }
    let shapes = [a.shape(), b.shape(), c.shape()];
    let shape = broadcast_usize(&shapes)?;
    let av = a.broadcast(IxDyn(&shape)).ok_or_else(|| broadcast_error(&shapes))?;
    let bv = b.broadcast(IxDyn(&shape)).ok_or_else(|| broadcast_error(&shapes))?;
    let cv = c.broadcast(IxDyn(&shape)).ok_or_else(|| broadcast_error(&shapes))?;
    Ok(Zip::from(&av).and(&bv).and(&cv).map_collect(|&x, &y, &z| f(x, y, z)))
}

fn broadcast_error(shapes: &[&[usize]]) -> OpError {
    OpError(format!("shapes {shapes:?} cannot be broadcast together"))
}

/// Matches two tensors of the same integer type, binding their arrays; `None` otherwise.
/// The body is expanded once per type, so it may call generic functions.
#[macro_export]
macro_rules! same_int_tensors {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            ($crate::ir::Tensor::I8($x), $crate::ir::Tensor::I8($y)) => Some($crate::ir::Tensor::I8($body)),
            ($crate::ir::Tensor::I16($x), $crate::ir::Tensor::I16($y)) => Some($crate::ir::Tensor::I16($body)),
            ($crate::ir::Tensor::I32($x), $crate::ir::Tensor::I32($y)) => Some($crate::ir::Tensor::I32($body)),
            ($crate::ir::Tensor::I64($x), $crate::ir::Tensor::I64($y)) => Some($crate::ir::Tensor::I64($body)),
            ($crate::ir::Tensor::U8($x), $crate::ir::Tensor::U8($y)) => Some($crate::ir::Tensor::U8($body)),
            ($crate::ir::Tensor::U16($x), $crate::ir::Tensor::U16($y)) => Some($crate::ir::Tensor::U16($body)),
            ($crate::ir::Tensor::U32($x), $crate::ir::Tensor::U32($y)) => Some($crate::ir::Tensor::U32($body)),
            ($crate::ir::Tensor::U64($x), $crate::ir::Tensor::U64($y)) => Some($crate::ir::Tensor::U64($body)),
            _ => None,
        }
    };
}

/// Matches one integer tensor, binding its array; `None` for other types.
#[macro_export]
macro_rules! int_tensor {
    ($a:expr, |$x:ident| $body:expr) => {
        match $a {
            $crate::ir::Tensor::I8($x) => Some($crate::ir::Tensor::I8($body)),
            $crate::ir::Tensor::I16($x) => Some($crate::ir::Tensor::I16($body)),
            $crate::ir::Tensor::I32($x) => Some($crate::ir::Tensor::I32($body)),
            $crate::ir::Tensor::I64($x) => Some($crate::ir::Tensor::I64($body)),
            $crate::ir::Tensor::U8($x) => Some($crate::ir::Tensor::U8($body)),
            $crate::ir::Tensor::U16($x) => Some($crate::ir::Tensor::U16($body)),
            $crate::ir::Tensor::U32($x) => Some($crate::ir::Tensor::U32($body)),
            $crate::ir::Tensor::U64($x) => Some($crate::ir::Tensor::U64($body)),
            _ => None,
        }
    };
}

/// Applies a float function to a float tensor: f32/f64 natively, f16/bf16 through f32.
/// `None` when the tensor is not floating point.
pub fn map_float(x: &Tensor, f32fn: impl Fn(f32) -> f32, f64fn: impl Fn(f64) -> f64) -> Option<Tensor> {
    match x {
        Tensor::F32(a) => Some(Tensor::F32(a.mapv(f32fn))),
        Tensor::F64(a) => Some(Tensor::F64(a.mapv(f64fn))),
        Tensor::F16(_) | Tensor::BF16(_) => Some(Tensor::F32(x.to_f32().mapv(f32fn)).cast(x.dtype())),
        _ => None,
    }
}

/// Applies a float function of two same-typed float tensors with broadcasting.
/// `Ok(None)` when the tensors are not both of one float type.
pub fn zip_float(
    a: &Tensor,
    b: &Tensor,
    f32fn: impl Fn(f32, f32) -> f32,
    f64fn: impl Fn(f64, f64) -> f64,
) -> OpResult<Option<Tensor>> {
    Ok(match (a, b) {
        (Tensor::F32(x), Tensor::F32(y)) => Some(Tensor::F32(zip_broadcast(x, y, f32fn)?)),
        (Tensor::F64(x), Tensor::F64(y)) => Some(Tensor::F64(zip_broadcast(x, y, f64fn)?)),
        (Tensor::F16(_), Tensor::F16(_)) | (Tensor::BF16(_), Tensor::BF16(_)) => {
            Some(Tensor::F32(zip_broadcast(&a.to_f32(), &b.to_f32(), f32fn)?).cast(a.dtype()))
        }
        _ => None,
    })
}

impl BinaryKind {
    pub fn float<F: Float>(self, a: F, b: F) -> F {
        match self {
            BinaryKind::Add => a + b,
            BinaryKind::Sub => a - b,
            BinaryKind::Mul => a * b,
            BinaryKind::Div => a / b,
            BinaryKind::Mod { fmod: true } => a % b,
            BinaryKind::Mod { fmod: false } => {
                let r = a % b;
                if r != F::zero() && (r < F::zero()) != (b < F::zero()) {
                    r + b
                } else {
                    r
                }
            }
            // NaN propagates (numpy and ONNX Runtime), unlike `f32::max`.
            BinaryKind::Max => {
                if a.is_nan() || b.is_nan() {
                    F::nan()
                } else {
                    a.max(b)
                }
            }
            BinaryKind::Min => {
                if a.is_nan() || b.is_nan() {
                    F::nan()
                } else {
                    a.min(b)
                }
            }
        }
    }

    /// Integer version; the caller has rejected zero divisors for `Div` and `Mod`.
    pub fn int<I: IntElem>(self, a: I, b: I) -> I {
        match self {
            BinaryKind::Add => a.wrapping_add(&b),
            BinaryKind::Sub => a.wrapping_sub(&b),
            BinaryKind::Mul => a.wrapping_mul(&b),
            // Truncates toward zero; the only overflow, MIN / -1, wraps to MIN (= a).
            BinaryKind::Div => a.checked_div(&b).unwrap_or(a),
            BinaryKind::Mod { fmod } => {
                let r = a.checked_rem(&b).unwrap_or_else(I::zero);
                if !fmod && r != I::zero() && (r < I::zero()) != (b < I::zero()) {
                    r.wrapping_add(&b)
                } else {
                    r
                }
            }
            BinaryKind::Max => {
                if a >= b {
                    a
                } else {
                    b
                }
            }
            BinaryKind::Min => {
                if a <= b {
                    a
                } else {
                    b
                }
            }
        }
    }

    fn divides(self) -> bool {
        matches!(self, BinaryKind::Div | BinaryKind::Mod { .. })
    }
}

/// `a ∘ b` with numpy broadcasting; both operands must have the same element type.
pub fn binary(kind: BinaryKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    if a.dtype() != b.dtype() {
        crate::op_bail!("operands have different element types {} and {}", a.dtype(), b.dtype());
    }
    if let Some(t) = zip_float(a, b, |x, y| kind.float(x, y), |x, y| kind.float(x, y))? {
        return Ok(t);
    }
    if kind.divides() && a.dtype().is_int() && crate::with_tensor!(b, y => y.iter().any(|v| v.to_i64() == 0)) {
        crate::op_bail!("integer division by zero");
    }
    let out = same_int_tensors!(a, b, |x, y| zip_broadcast(x, y, |p, q| kind.int(p, q))?);
    out.ok_or_else(|| OpError(format!("element type {} is not supported", a.dtype())))
}

/// Folds `kind` over several operands with multidirectional broadcasting (`Sum`, `Max`,
/// `Min`); half-precision inputs are accumulated in f32 and rounded once.
pub fn variadic(kind: BinaryKind, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let (head, rest) = inputs.split_first().ok_or_else(|| OpError("at least one input is required".into()))?;
    let dtype = head.dtype();
    let widen = matches!(dtype, DType::F16 | DType::BF16);
    let lift = |t: &Tensor| {
        if widen {
            Tensor::F32(t.to_f32())
        } else {
            t.clone()
        }
    };
    let mut acc = lift(head);
    for t in rest {
        if t.dtype() != dtype {
            crate::op_bail!("operands have different element types {} and {}", dtype, t.dtype());
        }
        acc = binary(kind, &acc, &lift(t))?;
    }
    Ok(acc.cast(dtype))
}

/// Arithmetic mean of several float operands with broadcasting.
pub fn mean(inputs: &[&Tensor]) -> OpResult<Tensor> {
    let dtype = inputs.first().map(|t| t.dtype()).ok_or_else(|| OpError("at least one input is required".into()))?;
    let sum = variadic(BinaryKind::Add, inputs)?;
    let n = inputs.len();
    map_float(&sum, |x| x / n as f32, |x| x / n as f64)
        .ok_or_else(|| OpError(format!("element type {dtype} is not supported (floating point only)")))
}

/// Integer `b^e`, exact with wrap-around. Negative exponents give the truncated reciprocal
/// (0 unless |b| = 1), what `static_cast<T>(std::pow(b, e))` gives in ONNX Runtime; `0^-n`
/// has no integer value and yields 0.
fn int_pow<I: IntElem>(b: I, e: i64) -> I {
    if e < 0 {
        let minus_one = I::zero().wrapping_sub(&I::one());
        let signed = I::min_value() < I::zero();
        return if b == I::one() {
            I::one()
        } else if signed && b == minus_one {
            if e % 2 == 0 {
                I::one()
            } else {
                minus_one
            }
        } else {
            I::zero()
        };
    }
    let (mut acc, mut base, mut e) = (I::one(), b, e as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(&base);
        }
        base = base.wrapping_mul(&base);
        e >>= 1;
    }
    acc
}

fn int_pow_float<I: IntElem>(b: I, e: f64) -> I {
    I::from_f64(b.to_f64().powf(e))
}

/// `Pow`: the output has the base's type; the exponent may be of any numeric type (opset 12+).
pub fn pow(base: &Tensor, exp: &Tensor) -> OpResult<Tensor> {
    if base.dtype() == DType::Bool || exp.dtype() == DType::Bool {
        crate::op_bail!("bool operands are not supported");
    }
    match base {
        Tensor::F32(b) => Ok(Tensor::F32(zip_broadcast(b, &exp.to_f32(), f32::powf)?)),
        Tensor::F64(b) => {
            let e = match exp.cast(DType::F64) {
                Tensor::F64(e) => e,
                _ => unreachable!("cast to F64 yields F64"),
            };
            Ok(Tensor::F64(zip_broadcast(b, &e, f64::powf)?))
        }
        Tensor::F16(_) | Tensor::BF16(_) => {
            Ok(Tensor::F32(zip_broadcast(&base.to_f32(), &exp.to_f32(), f32::powf)?).cast(base.dtype()))
        }
        _ if exp.dtype().is_float() => {
            let e = match exp.cast(DType::F64) {
                Tensor::F64(e) => e,
                _ => unreachable!("cast to F64 yields F64"),
            };
            int_tensor!(base, |b| zip_broadcast(b, &e, int_pow_float)?)
                .ok_or_else(|| OpError(format!("base element type {} is not supported", base.dtype())))
        }
        _ => {
            let e = match exp.cast(DType::I64) {
                Tensor::I64(e) => e,
                _ => unreachable!("cast to I64 yields I64"),
            };
            int_tensor!(base, |b| zip_broadcast(b, &e, int_pow)?)
                .ok_or_else(|| OpError(format!("base element type {} is not supported", base.dtype())))
        }
    }
}

impl UnaryKind {
    pub fn float<F: Float>(self, x: F) -> F {
        match self {
            UnaryKind::Sqrt => x.sqrt(),
            UnaryKind::Reciprocal => x.recip(),
            UnaryKind::Exp => x.exp(),
            UnaryKind::Log => x.ln(),
            UnaryKind::Neg => -x,
            UnaryKind::Abs => x.abs(),
            UnaryKind::Floor => x.floor(),
            UnaryKind::Ceil => x.ceil(),
            UnaryKind::Round => round_half_even(x),
            // Zero keeps its sign and NaN stays NaN, as in ONNX Runtime.
            UnaryKind::Sign => {
                if x > F::zero() {
                    F::one()
                } else if x < F::zero() {
                    -F::one()
                } else {
                    x
                }
            }
            UnaryKind::Sin => x.sin(),
            UnaryKind::Cos => x.cos(),
            UnaryKind::Tan => x.tan(),
            UnaryKind::Asin => x.asin(),
            UnaryKind::Acos => x.acos(),
            UnaryKind::Atan => x.atan(),
            UnaryKind::Sinh => x.sinh(),
            UnaryKind::Cosh => x.cosh(),
            UnaryKind::Asinh => x.asinh(),
            UnaryKind::Acosh => x.acosh(),
            UnaryKind::Atanh => x.atanh(),
        }
    }

    /// Whether the op is defined on integer types (ONNX type constraints).
    pub fn accepts_int(self) -> bool {
        matches!(self, UnaryKind::Neg | UnaryKind::Abs | UnaryKind::Sign)
    }

    /// Whether the integer type must be signed (`Neg`).
    pub fn needs_signed(self) -> bool {
        matches!(self, UnaryKind::Neg)
    }

    fn int<I: IntElem>(self, x: I) -> I {
        match self {
            UnaryKind::Neg => x.wrapping_neg(),
            // MIN has no positive counterpart and wraps to itself.
            UnaryKind::Abs => {
                if x < I::zero() {
                    x.wrapping_neg()
                } else {
                    x
                }
            }
            UnaryKind::Sign => {
                if x > I::zero() {
                    I::one()
                } else if x < I::zero() {
                    I::zero().wrapping_sub(&I::one())
                } else {
                    I::zero()
                }
            }
            // Float-only kinds never reach here (`unary` checks `accepts_int`); identity keeps
            // this total.
            _ => x,
        }
    }
}

/// Rounds to the nearest integer, halves to even (`Round`, numpy `rint`).
pub fn round_half_even<F: Float>(x: F) -> F {
    let r = x.round();
    let two = F::one() + F::one();
    if (r - x).abs() == F::one() / two {
        (x / two).round() * two
    } else {
        r
    }
}

pub fn unary(kind: UnaryKind, x: &Tensor) -> OpResult<Tensor> {
    if let Some(t) = map_float(x, |v| kind.float(v), |v| kind.float(v)) {
        return Ok(t);
    }
    let ok = kind.accepts_int() && x.dtype().is_int() && (x.dtype().is_signed() || !kind.needs_signed());
    if !ok {
        crate::op_bail!("element type {} is not supported", x.dtype());
    }
    int_tensor!(x, |a| a.mapv(|v| kind.int(v)))
        .ok_or_else(|| OpError(format!("element type {} is not supported", x.dtype())))
}

/// Matches two tensors of the same element type (any type), binding their arrays; the
/// body is expanded once per type and must evaluate to an `OpResult<Tensor>`.
#[macro_export]
macro_rules! same_tensors {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $body:expr, $mismatch:expr) => {
        match ($a, $b) {
            ($crate::ir::Tensor::F32($x), $crate::ir::Tensor::F32($y)) => $body,
            ($crate::ir::Tensor::F64($x), $crate::ir::Tensor::F64($y)) => $body,
            ($crate::ir::Tensor::F16($x), $crate::ir::Tensor::F16($y)) => $body,
            ($crate::ir::Tensor::BF16($x), $crate::ir::Tensor::BF16($y)) => $body,
            ($crate::ir::Tensor::I8($x), $crate::ir::Tensor::I8($y)) => $body,
            ($crate::ir::Tensor::I16($x), $crate::ir::Tensor::I16($y)) => $body,
            ($crate::ir::Tensor::I32($x), $crate::ir::Tensor::I32($y)) => $body,
            ($crate::ir::Tensor::I64($x), $crate::ir::Tensor::I64($y)) => $body,
            ($crate::ir::Tensor::U8($x), $crate::ir::Tensor::U8($y)) => $body,
            ($crate::ir::Tensor::U16($x), $crate::ir::Tensor::U16($y)) => $body,
            ($crate::ir::Tensor::U32($x), $crate::ir::Tensor::U32($y)) => $body,
            ($crate::ir::Tensor::U64($x), $crate::ir::Tensor::U64($y)) => $body,
            ($crate::ir::Tensor::Bool($x), $crate::ir::Tensor::Bool($y)) => $body,
            _ => $mismatch,
        }
    };
}

impl CompareKind {
    pub fn test<T: PartialOrd>(self, a: T, b: T) -> bool {
        match self {
            CompareKind::Equal => a == b,
            CompareKind::Greater => a > b,
            CompareKind::GreaterOrEqual => a >= b,
            CompareKind::Less => a < b,
            CompareKind::LessOrEqual => a <= b,
        }
    }

    /// The result from the sign of `a - b` (decides symbolic comparisons).
    pub fn from_difference(self, d: i64) -> bool {
        self.test(d, 0)
    }
}

/// `a <op> b` with broadcasting, for operands of one type (floats compare natively, NaN is
/// unequal and unordered).
pub fn compare(kind: CompareKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    same_tensors!(
        a,
        b,
        |x, y| Ok(Tensor::Bool(zip_broadcast(x, y, |p, q| kind.test(p, q))?)),
        Err(OpError(format!("operands have different element types {} and {}", a.dtype(), b.dtype())))
    )
}

pub fn logic(kind: LogicKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let (Some(x), Some(y)) = (a.as_bool(), b.as_bool()) else {
        crate::op_bail!("operands must be bool, got {} and {}", a.dtype(), b.dtype());
    };
    Ok(Tensor::Bool(zip_broadcast(x, y, |p, q| match kind {
        LogicKind::And => p && q,
        LogicKind::Or => p || q,
        LogicKind::Xor => p != q,
    })?))
}

/// `Where`: `cond ? x : y` with three-way broadcasting; `x` and `y` share one type.
pub fn where_select(cond: &Tensor, x: &Tensor, y: &Tensor) -> OpResult<Tensor> {
    let c = cond.as_bool().ok_or_else(|| OpError(format!("condition must be bool, got {}", cond.dtype())))?;
    same_tensors!(
        x,
        y,
        |p, q| Ok(Elem::wrap(zip3_broadcast(c, p, q, |k, u, v| if k { u } else { v })?)),
        Err(OpError(format!("X and Y have different element types {} and {}", x.dtype(), y.dtype())))
    )
}

impl BitKind {
    pub fn int<I: IntElem>(self, a: I, b: I) -> I {
        // Shift amounts beyond u32 (or negative, which ONNX's unsigned-only BitShift never
        // sees) shift everything out.
        let amount = || b.to_u32().unwrap_or(u32::MAX);
        match self {
            BitKind::And => a & b,
            BitKind::Or => a | b,
            BitKind::Xor => a ^ b,
            BitKind::ShiftLeft => a.checked_shl(amount()).unwrap_or_else(I::zero),
            BitKind::ShiftRight => a.checked_shr(amount()).unwrap_or_else(I::zero),
        }
    }
}

/// `a <op> b` bitwise with broadcasting; integers of one type (bool for And/Or/Xor is logic).
pub fn bitwise(kind: BitKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    if a.dtype() != b.dtype() {
        crate::op_bail!("operands have different element types {} and {}", a.dtype(), b.dtype());
    }
    same_int_tensors!(a, b, |x, y| zip_broadcast(x, y, |p, q| kind.int(p, q))?)
        .ok_or_else(|| OpError(format!("element type {} is not supported (integer types only)", a.dtype())))
}

/// Bitwise complement of an integer tensor (`BitwiseNot`).
pub fn bitwise_not(x: &Tensor) -> OpResult<Tensor> {
    int_tensor!(x, |a| a.mapv(|v| !v))
        .ok_or_else(|| OpError(format!("element type {} is not supported (integer types only)", x.dtype())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32s(shape, v.to_vec())
    }

    fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
        Tensor::from_i64s(shape, v.to_vec())
    }

    #[test]
    fn broadcasting_shapes_and_values() {
        let a = f32s(&[2, 1], &[1.0, 2.0]);
        let b = f32s(&[3], &[10.0, 20.0, 30.0]);
        let r = binary(BinaryKind::Add, &a, &b).unwrap();
        assert_eq!(r.shape(), &[2, 3]);
        assert_eq!(r.to_f64_vec(), vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
        // A rank-raising scalar-like operand: [1,1] against [3] gives [1,3].
        let r = binary(BinaryKind::Mul, &f32s(&[1, 1], &[2.0]), &b).unwrap();
        assert_eq!(r.shape(), &[1, 3]);
        let err = binary(BinaryKind::Add, &f32s(&[2], &[1.0, 2.0]), &b).unwrap_err();
        assert!(err.0.contains("cannot be broadcast"), "{}", err.0);
    }

    #[test]
    fn integer_division_and_mod_match_onnxruntime() {
        let a = i64s(&[4], &[-7, 7, -7, 7]);
        let b = i64s(&[4], &[2, -2, -2, 2]);
        assert_eq!(binary(BinaryKind::Div, &a, &b).unwrap().to_i64_vec(), vec![-3, -3, 3, 3]);
        assert_eq!(binary(BinaryKind::Mod { fmod: false }, &a, &b).unwrap().to_i64_vec(), vec![1, -1, -1, 1]);
        assert_eq!(binary(BinaryKind::Mod { fmod: true }, &a, &b).unwrap().to_i64_vec(), vec![-1, 1, -1, 1]);
        let zero = i64s(&[1], &[0]);
        assert!(binary(BinaryKind::Div, &a, &zero).unwrap_err().0.contains("division by zero"));
        let min = i64s(&[1], &[i64::MIN]);
        assert_eq!(binary(BinaryKind::Div, &min, &i64s(&[1], &[-1])).unwrap().to_i64_vec(), vec![i64::MIN]);
        assert_eq!(binary(BinaryKind::Mod { fmod: false }, &min, &i64s(&[1], &[-1])).unwrap().to_i64_vec(), vec![0]);
    }

    #[test]
    fn float_mod_and_nan_propagation() {
        let a = f32s(&[3], &[-2.5, 2.5, f32::NAN]);
        let b = f32s(&[3], &[-2.0, -2.0, 0.0]);
        let r = binary(BinaryKind::Mod { fmod: true }, &a, &b).unwrap().to_f64_vec();
        assert_eq!(&r[..2], &[-0.5, 0.5]);
        let r = binary(BinaryKind::Mod { fmod: false }, &a, &b).unwrap().to_f64_vec();
        assert_eq!(&r[..2], &[-0.5, -1.5]);
        let m = binary(BinaryKind::Max, &a, &b).unwrap().to_f64_vec();
        assert_eq!(&m[..2], &[-2.0, 2.5]);
        assert!(m[2].is_nan());
        assert!(binary(BinaryKind::Min, &b, &a).unwrap().to_f64_vec()[2].is_nan());
    }

    #[test]
    fn pow_mixed_types() {
        // Values from ONNX Runtime 1.32.
        let b = i64s(&[6], &[2, 3, -2, 1, -1, 0]);
        let e = i64s(&[6], &[3, -1, 3, -5, -3, 0]);
        assert_eq!(pow(&b, &e).unwrap().to_i64_vec(), vec![8, 0, -8, 1, -1, 1]);
        let b = Tensor::I32(ndarray::arr1(&[2, 3, -2, 4]).into_dyn());
        let r = pow(&b, &f32s(&[4], &[0.5, 1.5, 2.0, 0.5])).unwrap();
        assert_eq!(r.dtype(), DType::I32);
        assert_eq!(r.to_i64_vec(), vec![1, 5, 4, 2]);
        let r = pow(&f32s(&[2], &[2.0, 3.0]), &i64s(&[2], &[3, -1])).unwrap();
        assert_eq!(r.dtype(), DType::F32);
        assert_eq!(r.to_f64_vec()[0], 8.0);
        assert!((r.to_f64_vec()[1] - 1.0 / 3.0).abs() < 1e-7);
    }

    #[test]
    fn unary_kinds() {
        let x = f32s(&[7], &[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, f32::NAN]);
        let r = unary(UnaryKind::Round, &x).unwrap().to_f64_vec();
        assert_eq!(&r[..6], &[-2.0, -2.0, -0.0, 0.0, 2.0, 2.0]);
        assert!(r[6].is_nan());
        let s = unary(UnaryKind::Sign, &x).unwrap().to_f64_vec();
        assert_eq!(&s[..6], &[-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]);
        assert!(s[6].is_nan());
        let i = Tensor::I8(ndarray::arr1(&[-128i8, 5, 0]).into_dyn());
        assert_eq!(unary(UnaryKind::Neg, &i).unwrap().to_i64_vec(), vec![-128, -5, 0]);
        assert_eq!(unary(UnaryKind::Abs, &i).unwrap().to_i64_vec(), vec![-128, 5, 0]);
        assert_eq!(unary(UnaryKind::Sign, &i).unwrap().to_i64_vec(), vec![-1, 1, 0]);
        assert!(unary(UnaryKind::Sqrt, &i).is_err());
        let u = Tensor::U8(ndarray::arr1(&[3u8]).into_dyn());
        assert!(unary(UnaryKind::Neg, &u).is_err());
        let h = Tensor::from_f32s(&[1], vec![4.0]).cast(DType::F16);
        let r = unary(UnaryKind::Sqrt, &h).unwrap();
        assert_eq!(r.dtype(), DType::F16);
        assert_eq!(r.to_f64_vec(), vec![2.0]);
    }

    #[test]
    fn variadic_and_mean() {
        let a = f32s(&[2, 1], &[1.0, 2.0]);
        let b = f32s(&[2], &[10.0, 20.0]);
        let c = f32s(&[], &[100.0]);
        let s = variadic(BinaryKind::Add, &[&a, &b, &c]).unwrap();
        assert_eq!(s.shape(), &[2, 2]);
        assert_eq!(s.to_f64_vec(), vec![111.0, 121.0, 112.0, 122.0]);
        let m = mean(&[&a, &b]).unwrap();
        assert_eq!(m.to_f64_vec(), vec![5.5, 10.5, 6.0, 11.0]);
        assert!(mean(&[&i64s(&[1], &[1])]).is_err());
        let h = a.cast(DType::F16);
        assert_eq!(variadic(BinaryKind::Max, &[&h, &b.cast(DType::F16)]).unwrap().dtype(), DType::F16);
    }

    #[test]
    fn bit_operations() {
        let a = Tensor::U8(ndarray::arr1(&[0b1100u8, 1, 255]).into_dyn());
        let b = Tensor::U8(ndarray::arr1(&[0b1010u8, 9, 1]).into_dyn());
        assert_eq!(bitwise(BitKind::And, &a, &b).unwrap().to_i64_vec(), vec![0b1000, 1, 1]);
        assert_eq!(bitwise(BitKind::Xor, &a, &b).unwrap().to_i64_vec(), vec![0b0110, 8, 254]);
        assert_eq!(bitwise(BitKind::ShiftLeft, &a, &b).unwrap().to_i64_vec(), vec![0, 0, 254]);
        assert_eq!(bitwise(BitKind::ShiftRight, &a, &b).unwrap().to_i64_vec(), vec![0, 0, 127]);
        assert_eq!(bitwise_not(&Tensor::from_i64s(&[1], vec![5])).unwrap().to_i64_vec(), vec![-6]);
        assert!(bitwise(BitKind::Or, &f32s(&[1], &[1.0]), &f32s(&[1], &[1.0])).is_err());
    }

    #[test]
    fn compare_logic_where() {
        let a = f32s(&[3], &[1.0, f32::NAN, 3.0]);
        let b = f32s(&[], &[1.0]);
        assert_eq!(compare(CompareKind::Equal, &a, &b).unwrap().to_i64_vec(), vec![1, 0, 0]);
        assert_eq!(compare(CompareKind::GreaterOrEqual, &a, &b).unwrap().to_i64_vec(), vec![1, 0, 1]);
        assert!(compare(CompareKind::Less, &a, &i64s(&[], &[1])).is_err());
        let t = Tensor::Bool(ndarray::arr1(&[true, false]).into_dyn());
        let f = Tensor::Bool(ndarray::arr2(&[[false], [true]]).into_dyn());
        assert_eq!(logic(LogicKind::Xor, &t, &f).unwrap().to_i64_vec(), vec![1, 0, 0, 1]);
        let r = where_select(&t, &i64s(&[2, 1], &[1, 2]), &i64s(&[], &[-1])).unwrap();
        assert_eq!(r.shape(), &[2, 2]);
        assert_eq!(r.to_i64_vec(), vec![1, -1, 2, -1]);
        assert!(where_select(&t, &i64s(&[], &[1]), &b).is_err());
    }
}
