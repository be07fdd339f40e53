//! The cast op family: `Cast`, `CastLike`, `Identity` and inference-mode `Dropout`.
//!
//! `Cast`/`CastLike`/`Identity` keep the symbolic contents of shape values when the target is
//! a 32/64-bit signed integer, so `Shape → Cast(int32) → … → Cast(int64) → Reshape` still folds.

use super::arithmetic::with_sym;
use super::OpSpec;
use crate::ir::{optional, required, DType, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use std::any::Any;

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Cast", parse_cast),
    OpSpec::onnx("CastLike", parse_cast_like),
    OpSpec::onnx("Identity", parse_identity),
    OpSpec::onnx("Dropout", parse_dropout),
];

/// Converts with ONNX Runtime's semantics. Float to narrow integer goes through int64 and
/// wraps (`static_cast` chains in ONNX Runtime: `-1.5 → 255` for uint8), where a direct Rust
/// cast would saturate; everything else is `Tensor::cast`.
pub fn cast_tensor(x: &Tensor, to: DType) -> Tensor {
    if x.dtype().is_float() && to.is_int() && to != DType::I64 {
        x.cast(DType::I64).cast(to)
    } else {
        x.cast(to)
    }
}

/// The symbolic contents that survive a conversion to `to`: integer shape values into a
/// signed type wide enough for any dim.
fn cast_sym(x: &Fact, to: DType) -> Option<Vec<crate::ir::Dim>> {
    if x.dtype().is_int() && matches!(to, DType::I32 | DType::I64) && x.rank() <= 1 {
        x.sym.clone()
    } else {
        None
    }
}

// ---------------------------------------------------------------------------------------------
// Cast and CastLike.

#[derive(Clone, Debug)]
pub struct CastOp {
    pub to: DType,
}

impl Op for CastOp {
    fn op_type(&self) -> &'static str {
        "Cast"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        Ok(vec![with_sym(self.to, x.shape().to_vec(), cast_sym(x, self.to))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![cast_tensor(required(inputs, 0, "input")?, self.to)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The element type named by an ONNX `TensorProto.DataType` code.
fn dtype_of_code(code: i64) -> OpResult<DType> {
    let c = i32::try_from(code).map_err(|_| OpError(format!("attribute 'to' = {code} is not a data type")))?;
    DType::from_onnx(c).ok_or_else(|| {
        OpError(format!("attribute 'to' = {} ({c}) is not a supported element type", DType::onnx_code_name(c)))
    })
}

/// The element type named by an opset-1 `to` string ("FLOAT", "INT64", ...).
fn dtype_of_name(name: &str) -> OpResult<DType> {
    Ok(match name.to_ascii_uppercase().as_str() {
        "FLOAT" => DType::F32,
        "DOUBLE" => DType::F64,
        "FLOAT16" => DType::F16,
        "BFLOAT16" => DType::BF16,
        "INT8" => DType::I8,
        "INT16" => DType::I16,
        "INT32" => DType::I32,
        "INT64" => DType::I64,
        "UINT8" => DType::U8,
        "UINT16" => DType::U16,
        "UINT32" => DType::U32,
        "UINT64" => DType::U64,
        "BOOL" => DType::Bool,
        _ => crate::op_bail!("attribute 'to' = '{name}' is not a supported element type"),
    })
}

/// `saturate` (opset 19+) only affects float8 targets, which are not supported types; the
/// value is validated and otherwise has no effect.
fn check_saturate(ctx: &NodeCtx) -> OpResult<()> {
    if ctx.opset >= 19 {
        ctx.flag("saturate", true)?;
    }
    Ok(())
}

/// `Cast` (opset 1, 6, 9, 13, 19, 21): opset 1 names the target as a STRING (`"FLOAT"`),
/// 6+ as a `TensorProto.DataType` INT; 9 added string types and 19/21 float8/int4 (all
/// unsupported element types, rejected by name); 19 added `saturate` (float8 only: accepted,
/// no effect). Float to integer truncates toward zero.
fn parse_cast(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    check_saturate(ctx)?;
    let to = if ctx.opset < 6 {
        match ctx.string("to") {
            Ok(Some(name)) => dtype_of_name(&name)?,
            // Some opset-1 exporters wrote the code as an INT already.
            _ => dtype_of_code(ctx.req_int("to")?)?,
        }
    } else {
        dtype_of_code(ctx.req_int("to")?)?
    };
    Ok(Box::new(CastOp { to }))
}

/// `CastLike`: casts input 0 to the element type of input 1.
#[derive(Clone, Debug)]
pub struct CastLikeOp;

impl Op for CastLikeOp {
    fn op_type(&self) -> &'static str {
        "CastLike"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        let to = required(inputs, 1, "target_type")?.dtype();
        Ok(vec![with_sym(to, x.shape().to_vec(), cast_sym(x, to))])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let to = required(inputs, 1, "target_type")?.dtype();
        Ok(vec![cast_tensor(required(inputs, 0, "input")?, to)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `CastLike` (opset 15, 19, 21): 19 added `saturate` (float8 only: accepted, no effect).
fn parse_cast_like(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    check_saturate(ctx)?;
    Ok(Box::new(CastLikeOp))
}

// ---------------------------------------------------------------------------------------------
// Identity.

#[derive(Clone, Debug)]
pub struct IdentityOp;

impl Op for IdentityOp {
    fn op_type(&self) -> &'static str {
        "Identity"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        Ok(vec![required(inputs, 0, "input")?.clone()])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![required(inputs, 0, "input")?.clone()])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `Identity` (opset 1, 13, 14, 16, 19, 21): later versions add sequence/optional and new
/// tensor types; only tensors of supported types reach here.
fn parse_identity(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(IdentityOp))
}

// ---------------------------------------------------------------------------------------------
// Dropout (inference only).

/// Inference-mode `Dropout`: output 0 is the input; the optional mask keeps every element.
#[derive(Clone, Debug)]
pub struct DropoutOp {
    /// Element type of the mask: bool from opset 10, the input's type before.
    pub bool_mask: bool,
    /// The mask's value: all kept (true) from opset 12, where the spec defines it for
    /// inference; all zero before, which is what ONNX Runtime produces for those opsets.
    pub mask_value: bool,
    /// 1 (output only) or 2 (output and mask).
    pub outputs: usize,
}

impl DropoutOp {
    fn mask_dtype(&self, x: DType) -> DType {
        if self.bool_mask {
            DType::Bool
        } else {
            x
        }
    }
}

impl Op for DropoutOp {
    fn op_type(&self) -> &'static str {
        "Dropout"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "data")?;
        if let Some(ratio) = optional(inputs, 1) {
            crate::op_ensure!(ratio.dtype().is_float(), "input 'ratio' must be floating point, got {}", ratio.dtype());
        }
        if let Some(t) = optional(inputs, 2) {
            crate::op_ensure!(t.dtype() == DType::Bool, "input 'training_mode' must be bool, got {}", t.dtype());
            let training = t.konst.as_ref().ok_or_else(|| {
                OpError(
                    "input 'training_mode' must be absent or a constant false: training mode is not supported".into(),
                )
            })?;
            check_not_training(training)?;
        }
        let mut out = vec![x.clone()];
        if self.outputs == 2 {
            out.push(Fact::new(self.mask_dtype(x.dtype()), x.shape().to_vec()));
        }
        Ok(out)
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "data")?;
        if let Some(t) = optional(inputs, 2) {
            check_not_training(t)?;
        }
        let mut out = vec![x.clone()];
        if self.outputs == 2 {
            let v = if self.mask_value { 1.0 } else { 0.0 };
            out.push(Tensor::full(self.mask_dtype(x.dtype()), x.shape(), v));
        }
        Ok(out)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn check_not_training(t: &Tensor) -> OpResult<()> {
    crate::op_ensure!(t.len() == 1, "input 'training_mode' must be a scalar, got shape {:?}", t.shape());
    crate::op_ensure!(
        t.to_i64_vec().first() == Some(&0),
        "input 'training_mode' is true: training mode is not supported (inference only)"
    );
    Ok(())
}

/// `Dropout` (opset 1, 6, 7, 10, 12, 13, 22), inference semantics (identity, all-kept mask):
/// - 1/6: `is_test` and `ratio` attributes; inference runtimes treat the op as identity either
///   way, so `is_test` is accepted but not required. Mask has the input's type.
/// - 7: `ratio` attribute only; mask of the input's type. 10: the mask becomes bool.
/// - Before 12 the inference-mode mask is unspecified; ONNX Runtime returns all zeros and so
///   do we. From 12 it is all true (nothing dropped).
/// - 12+: `ratio` and `training_mode` become optional inputs; `training_mode` must be absent
///   or a constant false (training is rejected), and the `seed` attribute is irrelevant.
fn parse_dropout(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    crate::op_ensure!(
        (1..=2).contains(&ctx.num_outputs),
        "expected 1 or 2 outputs (output, optional mask), found {}",
        ctx.num_outputs
    );
    if ctx.opset < 12 {
        let ratio = ctx.float_or("ratio", 0.5)?;
        crate::op_ensure!((0.0..1.0).contains(&ratio), "attribute 'ratio' = {ratio} must be in [0, 1)");
        if ctx.opset < 7 {
            ctx.flag("is_test", false)?;
        }
    }
    Ok(Box::new(DropoutOp { bool_mask: ctx.opset >= 10, mask_value: ctx.opset >= 12, outputs: ctx.num_outputs }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::arithmetic::tests::{eval, fact, infer};
    use crate::ir::ops::testutil::parse_node as parse;
    use crate::ir::{Attr, Dim};
    use std::sync::Arc;

    fn n() -> Dim {
        Dim::sym("N")
    }

    #[test]
    fn cast_types_and_symbols() {
        let c = parse("Cast", 13, &[("to", Attr::Int(6))], &[true], 1).unwrap();
        let out = infer(&*c, &[Fact::symbolic(vec![n(), Dim::known(3)], false)]).unwrap();
        assert_eq!(out[0].dtype(), DType::I32);
        assert_eq!(out[0].sym, Some(vec![n(), Dim::known(3)]));
        let f = parse("Cast", 13, &[("to", Attr::Int(1))], &[true], 1).unwrap();
        assert!(infer(&*f, &[Fact::symbolic(vec![n()], false)]).unwrap()[0].sym.is_none());
        let err = parse("Cast", 13, &[("to", Attr::Int(8))], &[true], 1).unwrap_err();
        assert!(err.0.contains("STRING"), "{}", err.0);
        assert!(parse("Cast", 13, &[], &[true], 1).unwrap_err().0.contains("'to'"));
        let old = parse("Cast", 1, &[("to", Attr::String("INT64".into()))], &[true], 1).unwrap();
        assert_eq!(old.downcast_ref::<CastOp>().unwrap().to, DType::I64);
        assert!(parse("Cast", 19, &[("to", Attr::Int(1)), ("saturate", Attr::Int(0))], &[true], 1).is_ok());
    }

    #[test]
    fn cast_values_match_onnxruntime() {
        let x = Tensor::from_f32s(&[4], vec![-1.5, 300.7, -2.9, 2.9]);
        assert_eq!(cast_tensor(&x, DType::U8).to_i64_vec(), vec![255, 44, 254, 2]);
        assert_eq!(cast_tensor(&x, DType::I32).to_i64_vec(), vec![-1, 300, -2, 2]);
        let big = Tensor::from_i64s(&[2], vec![300, -129]);
        assert_eq!(cast_tensor(&big, DType::I8).to_i64_vec(), vec![44, 127]);
        let c = parse("Cast", 13, &[("to", Attr::Int(9))], &[true], 1).unwrap();
        assert_eq!(
            eval(&*c, &[Tensor::from_f32s(&[3], vec![0.0, -0.5, f32::NAN])]).unwrap()[0].to_i64_vec(),
            vec![0, 1, 1]
        );
    }

    #[test]
    fn cast_like_and_identity() {
        let cl = parse("CastLike", 15, &[], &[true, true], 1).unwrap();
        let out = infer(&*cl, &[fact(DType::F32, &[n()]), fact(DType::F16, &[])]).unwrap();
        assert_eq!(out[0].dtype(), DType::F16);
        assert_eq!(out[0].shape(), &[n()]);
        let r = eval(&*cl, &[Tensor::from_f32s(&[1], vec![2.5]), Tensor::from_i64s(&[], vec![0])]).unwrap();
        assert_eq!(r[0].dtype(), DType::I64);
        let id = parse("Identity", 21, &[], &[true], 1).unwrap();
        let k = Fact::constant(Arc::new(Tensor::from_i64s(&[2], vec![1, 2])));
        assert!(infer(&*id, &[k]).unwrap()[0].konst.is_some());
        let s = infer(&*id, &[Fact::symbolic(vec![n()], true)]).unwrap();
        assert_eq!(s[0].sym, Some(vec![n()]));
    }

    #[test]
    fn dropout_inference_only() {
        let d = parse("Dropout", 13, &[], &[true, false, true], 2).unwrap();
        let x = fact(DType::F32, &[n(), Dim::known(4)]);
        let no = Fact::constant(Arc::new(Tensor::Bool(ndarray::arr0(false).into_dyn())));
        let out = d.infer(&[Some(&x), None, Some(&no)]).unwrap();
        assert_eq!(out[1].dtype(), DType::Bool);
        assert_eq!(out[1].shape(), &[n(), Dim::known(4)]);
        let yes = Fact::constant(Arc::new(Tensor::Bool(ndarray::arr0(true).into_dyn())));
        assert!(d.infer(&[Some(&x), None, Some(&yes)]).unwrap_err().0.contains("training mode is not supported"));
        let dynamic = fact(DType::Bool, &[]);
        assert!(d.infer(&[Some(&x), None, Some(&dynamic)]).unwrap_err().0.contains("constant false"));
        let xt = Tensor::from_f32s(&[2], vec![1.0, 2.0]);
        let r = d.eval(&[Some(&xt), None, None]).unwrap();
        assert_eq!(r[0], xt);
        assert_eq!(r[1].to_i64_vec(), vec![1, 1]);
        let old = parse("Dropout", 7, &[("ratio", Attr::Float(0.3))], &[true], 2).unwrap();
        let r = eval(&*old, std::slice::from_ref(&xt)).unwrap();
        assert_eq!(r[1].dtype(), DType::F32);
        assert_eq!(r[1].to_f64_vec(), vec![0.0, 0.0]);
        let single = parse("Dropout", 6, &[("is_test", Attr::Int(1))], &[true], 1).unwrap();
        assert_eq!(eval(&*single, &[xt]).unwrap().len(), 1);
        assert!(parse("Dropout", 7, &[("ratio", Attr::Float(1.5))], &[true], 1).is_err());
    }
}
