//! The softmax op family: Softmax and LogSoftmax.

use super::OpSpec;
use crate::ir::broadcast::normalize_axis;
use crate::ir::{required, DType, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::softmax::{softmax_axis, softmax_coerced_2d};
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("LogSoftmax", parse_log_softmax), OpSpec::onnx("Softmax", parse_softmax)];

/// Softmax or LogSoftmax.
#[derive(Clone, Debug)]
pub struct Softmax {
    pub log: bool,
    pub axis: i64,
    /// Opset < 13 semantics: normalise over all of `dims[axis..]` (the input viewed as a
    /// matrix) instead of over the single axis.
    pub coerce_2d: bool,
}

impl Softmax {
    fn name(&self) -> &'static str {
        if self.log {
            "LogSoftmax"
        } else {
            "Softmax"
        }
    }

    fn check(&self, dtype: DType, rank: usize) -> OpResult<usize> {
        op_ensure!(dtype.is_float(), "{} needs a floating-point input, found {dtype}", self.name());
        op_ensure!(rank > 0, "{} needs an input of rank 1 or more, found a scalar", self.name());
        normalize_axis(self.axis, rank)
    }
}

impl Op for Softmax {
    fn op_type(&self) -> &'static str {
        self.name()
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        self.check(x.dtype(), x.rank())?;
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        let axis = self.check(x.dtype(), x.rank())?;
        let a = x.to_f32();
        let y = if self.coerce_2d { softmax_coerced_2d(&a, axis, self.log) } else { softmax_axis(&a, axis, self.log) };
        Ok(vec![Tensor::F32(y).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Shared parser. Opset history: 1 and 11 coerce the input to 2-D at `axis` (default 1;
/// 11 only widened the axis range to negatives) and normalise each row of
/// `[prod(dims[..axis]), prod(dims[axis..])]`; 13 normalises along the single `axis`
/// (default -1) and added bfloat16. `ctx.opset` picks the semantics and the default.
fn parse(ctx: &NodeCtx, log: bool) -> OpResult<Box<dyn Op>> {
    let coerce_2d = ctx.opset < 13;
    let axis = ctx.int_or("axis", if coerce_2d { 1 } else { -1 })?;
    Ok(Box::new(Softmax { log, axis, coerce_2d }))
}

/// Softmax: `exp(x - max) / sum(exp(x - max))` (see [`parse`] for the opset history).
fn parse_softmax(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse(ctx, false)
}

/// LogSoftmax: `x - max - log(sum(exp(x - max)))` (see [`parse`] for the opset history).
fn parse_log_softmax(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    parse(ctx, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attr, Dim};

    fn parse_op(op: &str, opset: i64, attrs: &[(&str, Attr)]) -> Box<dyn Op> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &[true], 1).expect("parses")
    }

    #[test]
    fn infer_keeps_symbolic_shape_and_checks_dtype() {
        let op = parse_op("Softmax", 13, &[]);
        let x = Fact::new(DType::F16, vec![Dim::sym("N"), Dim::sym("S"), Dim::known(8)]);
        let out = op.infer(&[Some(&x)]).unwrap();
        assert_eq!(out[0].ty, x.ty);
        let err = op.infer(&[Some(&Fact::new(DType::I32, vec![Dim::known(3)]))]).unwrap_err();
        assert!(err.0.contains("floating-point"), "{}", err.0);
        let bad_axis = parse_op("Softmax", 13, &[("axis", Attr::Int(3))]);
        assert!(bad_axis.infer(&[Some(&x)]).unwrap_err().0.contains("out of range"));
    }

    #[test]
    fn opset_picks_semantics() {
        // numpy: x = arange(8).reshape(2,2,2); opset 13 softmax over the last axis,
        // opset 11 (axis 1) over the flattened trailing 4 values of each batch row.
        let x = Tensor::from_f32s(&[2, 2, 2], (0..8).map(|v| v as f32).collect());
        let new = parse_op("Softmax", 13, &[]).eval(&[Some(&x)]).unwrap();
        let want_new = [0.268_941_43, 0.731_058_6];
        for (i, v) in new[0].to_f64_vec().iter().enumerate() {
            assert!((v - want_new[i % 2]).abs() < 1e-6, "{v}");
        }
        let old = parse_op("Softmax", 11, &[]).eval(&[Some(&x)]).unwrap();
        let want_old = [0.032_058_6, 0.087_144_32, 0.236_882_82, 0.643_914_26];
        for (i, v) in old[0].to_f64_vec().iter().enumerate() {
            assert!((v - want_old[i % 4]).abs() < 1e-6, "{v}");
        }
        let log_old = parse_op("LogSoftmax", 1, &[("axis", Attr::Int(0))]).eval(&[Some(&x)]).unwrap();
        // numpy: x.ravel() - logsumexp(x.ravel())
        assert!((log_old[0].to_f64_vec()[7] - (-0.458_339_7)).abs() < 1e-5, "{:?}", log_old[0]);
    }

    #[test]
    fn half_precision_round_trips() {
        let x = Tensor::from_f32s(&[2], vec![0.0, 0.0]).cast(DType::F16);
        let out = parse_op("Softmax", 13, &[]).eval(&[Some(&x)]).unwrap();
        assert_eq!(out[0].dtype(), DType::F16);
        assert_eq!(out[0].to_f64_vec(), vec![0.5, 0.5]);
    }
}
