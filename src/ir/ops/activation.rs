//! The activation op family: pointwise activations (one [`ActivationOp`] holding an
//! [`Activation`]), `Clip` with runtime bounds (opset 11+) and `PRelu`.

use super::OpSpec;
use crate::ir::broadcast::broadcast_shapes;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::activation::{self as kernels};
use std::any::Any;

/// A pointwise activation with its parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Relu,
    LeakyRelu {
        alpha: f32,
    },
    Sigmoid,
    Tanh,
    /// `min(max(x, min), max)`; NaN propagates and `min > max` gives `max` (ONNX Runtime).
    Clip {
        min: f32,
        max: f32,
    },
    HardSigmoid {
        alpha: f32,
        beta: f32,
    },
    HardSwish,
    /// `0.5·x·(1 + erf(x/√2))`, or the tanh approximation when `tanh_approx`.
    Gelu {
        tanh_approx: bool,
    },
    Erf,
    Softplus,
    Elu {
        alpha: f32,
    },
    Selu {
        alpha: f32,
        gamma: f32,
    },
    Celu {
        alpha: f32,
    },
    Softsign,
    ThresholdedRelu {
        alpha: f32,
    },
    /// `x · tanh(softplus(x))`.
    Mish,
    /// `x < -lambd ? x + bias : x > lambd ? x - bias : 0`.
    Shrink {
        lambd: f32,
        bias: f32,
    },
}

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("Relu", parse_relu),
    OpSpec::onnx("LeakyRelu", parse_leaky_relu),
    OpSpec::onnx("PRelu", parse_prelu),
    OpSpec::onnx("Sigmoid", parse_sigmoid),
    OpSpec::onnx("Tanh", parse_tanh),
    OpSpec::onnx("Clip", parse_clip),
    OpSpec::onnx("HardSigmoid", parse_hard_sigmoid),
    OpSpec::onnx("HardSwish", parse_hard_swish),
    OpSpec::onnx("Gelu", parse_gelu),
    OpSpec::onnx("Erf", parse_erf),
    OpSpec::onnx("Softplus", parse_softplus),
    OpSpec::onnx("Elu", parse_elu),
    OpSpec::onnx("Selu", parse_selu),
    OpSpec::onnx("Celu", parse_celu),
    OpSpec::onnx("Softsign", parse_softsign),
    OpSpec::onnx("ThresholdedRelu", parse_thresholded_relu),
    OpSpec::onnx("Mish", parse_mish),
    OpSpec::onnx("Shrink", parse_shrink),
];

/// Checks the element type an activation accepts.
fn check_input_type(act: Activation, dtype: DType) -> OpResult<()> {
    let ok = dtype.is_float() || (act.accepts_signed_int() && dtype.is_int() && dtype.is_signed());
    crate::op_ensure!(
        ok,
        "element type {dtype} is not supported ({})",
        if act.accepts_signed_int() {
            "floating-point or signed integer types only"
        } else {
            "floating-point types only"
        }
    );
    Ok(())
}

/// A unary pointwise activation with constant parameters.
#[derive(Clone, Debug)]
pub struct ActivationOp {
    pub act: Activation,
}

impl Op for ActivationOp {
    fn op_type(&self) -> &'static str {
        self.act.name()
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        check_input_type(self.act, x.dtype())?;
        Ok(vec![Fact::new(x.dtype(), x.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        Ok(vec![self.act.apply_tensor(required(inputs, 0, "X")?)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn activation(act: Activation) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(ActivationOp { act }))
}

/// `Relu` (opset 1, 6, 13, 14): opset < 6 `consumed_inputs` is a legacy hint, ignored;
/// opset 14 adds signed integer types (accepted for any opset).
fn parse_relu(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Relu)
}

/// `LeakyRelu` (opset 1, 6, 16): `alpha` defaults to 0.01; 16 only adds bfloat16.
fn parse_leaky_relu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::LeakyRelu { alpha: ctx.float_or("alpha", 0.01)? })
}

/// `Sigmoid` (opset 1, 6, 13).
fn parse_sigmoid(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Sigmoid)
}

/// `Tanh` (opset 1, 6, 13).
fn parse_tanh(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Tanh)
}

/// `HardSigmoid` (opset 1, 6, 22): `max(0, min(1, alpha·x + beta))`, alpha 0.2, beta 0.5.
fn parse_hard_sigmoid(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::HardSigmoid { alpha: ctx.float_or("alpha", 0.2)?, beta: ctx.float_or("beta", 0.5)? })
}

/// `HardSwish` (opset 14, 22): `x · HardSigmoid(x; 1/6, 0.5)`.
fn parse_hard_swish(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::HardSwish)
}

/// `Gelu` (opset 20): `approximate` is "none" (erf form) or "tanh". Models of older opsets
/// express Gelu as Div/Erf/Add/Mul, which the optimiser recognises instead.
fn parse_gelu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let approx = ctx.choice("approximate", "none", &["none", "tanh"])?;
    activation(Activation::Gelu { tanh_approx: approx == "tanh" })
}

/// `Erf` (opset 9, 13): floating-point types (ONNX also lists integers, which ONNX Runtime
/// rejects; so do we).
fn parse_erf(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Erf)
}

/// `Softplus` (opset 1, 22): `ln(1 + eˣ)`, computed without overflow.
fn parse_softplus(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Softplus)
}

/// `Elu` (opset 1, 6, 22): `alpha` defaults to 1.
fn parse_elu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Elu { alpha: ctx.float_or("alpha", 1.0)? })
}

/// `Selu` (opset 1, 6, 22): defaults are the float32 values of the SELU constants.
fn parse_selu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Selu {
        alpha: ctx.float_or("alpha", 1.673_263_2)?,
        gamma: ctx.float_or("gamma", 1.050_701)?,
    })
}

/// `Celu` (opset 12): `max(0, x) + min(0, alpha·(exp(x/alpha) − 1))`, alpha defaults to 1.
fn parse_celu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let alpha = ctx.float_or("alpha", 1.0)?;
    crate::op_ensure!(alpha != 0.0, "attribute 'alpha' must be nonzero");
    activation(Activation::Celu { alpha })
}

/// `Softsign` (opset 1, 22): `x / (1 + |x|)`.
fn parse_softsign(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Softsign)
}

/// `ThresholdedRelu` (opset 10, 22): `x > alpha ? x : 0`, alpha defaults to 1.
fn parse_thresholded_relu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::ThresholdedRelu { alpha: ctx.float_or("alpha", 1.0)? })
}

/// `Mish` (opset 18, 22): `x · tanh(softplus(x))`.
fn parse_mish(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    activation(Activation::Mish)
}

/// `Shrink` (opset 9): `lambd` defaults to 0.5, `bias` to 0. ONNX also allows integer inputs;
/// only floating-point types are supported here.
fn parse_shrink(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let lambd = ctx.float_or("lambd", 0.5)?;
    if lambd.is_nan() || lambd < 0.0 {
        crate::op_bail!("attribute 'lambd' = {lambd} must be non-negative");
    }
    activation(Activation::Shrink { lambd, bias: ctx.float_or("bias", 0.0)? })
}

/// The constant activation a node computes, for fusing into conv/gemm epilogues: any
/// [`ActivationOp`], and a [`ClipOp`] whose bounds are absent or constant.
pub fn activation_of(op: &dyn Op, inputs: &[Option<&Fact>]) -> Option<Activation> {
    if let Some(a) = op.downcast_ref::<ActivationOp>() {
        return Some(a.act);
    }
    op.downcast_ref::<ClipOp>()?.constant_activation(inputs)
}

// ---------------------------------------------------------------------------------------------
// Clip with bounds as inputs (opset 11+).

/// `Clip` whose bounds are the optional inputs 1 (`min`) and 2 (`max`), read at run time.
#[derive(Clone, Debug)]
pub struct ClipOp;

impl ClipOp {
    /// The equivalent constant activation when both bounds are absent or constant floats,
    /// for fusing into epilogues.
    pub fn constant_activation(&self, inputs: &[Option<&Fact>]) -> Option<Activation> {
        let x = optional(inputs, 0)?;
        if x.dtype() != DType::F32 && x.dtype() != DType::F16 && x.dtype() != DType::BF16 {
            return None;
        }
        let bound = |i: usize, default: f32| -> Option<f32> {
            match optional(inputs, i) {
                None => Some(default),
                Some(f) => f.konst.as_ref()?.scalar_f64().map(|v| v as f32),
            }
        };
        Some(Activation::Clip { min: bound(1, f32::MIN)?, max: bound(2, f32::MAX)? })
    }
}

impl Op for ClipOp {
    fn op_type(&self) -> &'static str {
        "Clip"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        crate::op_ensure!(x.dtype() != DType::Bool, "element type bool is not supported");
        for (i, what) in [(1, "min"), (2, "max")] {
            if let Some(b) = optional(inputs, i) {
                crate::op_ensure!(
                    b.dtype() == x.dtype(),
                    "'{what}' has element type {}, the input has {}; they must match",
                    b.dtype(),
                    x.dtype()
                );
                let one = b.shape().iter().all(|d| d.as_known() == Some(1));
                crate::op_ensure!(one, "'{what}' must be a scalar, got shape {}", fmt_shape(b.shape()));
            }
        }
        Ok(vec![Fact::new(x.dtype(), x.shape().to_vec())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        Ok(vec![kernels::clip(x, optional(inputs, 1), optional(inputs, 2))?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `Clip` (opset 1, 6, 11, 12, 13): before 11 the bounds are the `min`/`max` attributes
/// (defaults: the float32 lowest/highest values) and the op is a constant [`Activation`];
/// from 11 they are optional scalar inputs (absent = the type's lowest/highest value, as in
/// ONNX Runtime), read at run time; 12 adds integer types (accepted from 11).
fn parse_clip(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    if ctx.opset < 11 {
        let min = ctx.float_or("min", f32::MIN)?;
        let max = ctx.float_or("max", f32::MAX)?;
        return activation(Activation::Clip { min, max });
    }
    Ok(Box::new(ClipOp))
}

// ---------------------------------------------------------------------------------------------
// PRelu.

/// `PRelu`: `x < 0 ? slope·x : x`, with `slope` unidirectionally broadcast to `x`.
#[derive(Clone, Debug)]
pub struct PReluOp {
    /// Opset < 7: a 1-D slope of more than one element holds one value per channel (axis 1).
    pub legacy_channel_slope: bool,
}

impl PReluOp {
    /// The shape the slope is broadcast with: `[C]` becomes `[C,1,…,1]` (aligned to axis 1)
    /// under the legacy per-channel rule.
    fn slope_shape<D: Clone>(&self, x_rank: usize, slope: &[D], one: D) -> Vec<D> {
        if self.legacy_channel_slope && slope.len() == 1 && x_rank >= 2 {
            let mut s = vec![slope[0].clone()];
            s.extend(std::iter::repeat_n(one, x_rank - 2));
            s
        } else {
            slope.to_vec()
        }
    }
}

impl Op for PReluOp {
    fn op_type(&self) -> &'static str {
        "PRelu"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let slope = required(inputs, 1, "slope")?;
        let ok = x.dtype().is_float() || (x.dtype().is_int() && x.dtype().is_signed());
        crate::op_ensure!(
            ok,
            "element type {} is not supported (floating-point or signed integer types only)",
            x.dtype()
        );
        crate::op_ensure!(
            slope.dtype() == x.dtype(),
            "slope has element type {}, X has {}; they must match",
            slope.dtype(),
            x.dtype()
        );
        let slope_shape = self.slope_shape(x.rank(), slope.shape(), Dim::known(1));
        let shape = broadcast_shapes(&[x.shape(), &slope_shape])?;
        crate::op_ensure!(
            shape == x.shape(),
            "slope of shape {} does not broadcast to X of shape {}",
            fmt_shape(slope.shape()),
            fmt_shape(x.shape())
        );
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let slope = required(inputs, 1, "slope")?;
        let shape = self.slope_shape(x.rank(), slope.shape(), 1);
        if shape.as_slice() != slope.shape() {
            let slope =
                slope.reshaped(&shape).ok_or_else(|| crate::ir::OpError("per-channel slope reshape failed".into()))?;
            return Ok(vec![kernels::prelu(x, &slope)?]);
        }
        Ok(vec![kernels::prelu(x, slope)?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// `PRelu` (opset 1, 6, 7, 9, 16): before 7 a 1-D slope `[C]` is per channel (axis 1, the
/// Caffe2 rule PyTorch exports relied on), so it is aligned as `[C,1,…,1]`; from 7 the slope
/// is unidirectionally (numpy) broadcast; 16 adds integer types (accepted for any opset).
fn parse_prelu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(PReluOp { legacy_channel_slope: ctx.opset < 7 }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::arithmetic::tests::{eval, fact, infer};
    use crate::ir::ops::testutil::parse_node as parse;
    use crate::ir::Attr;
    use std::sync::Arc;

    fn n() -> Dim {
        Dim::sym("N")
    }

    #[test]
    fn unary_activations_keep_shape_and_type() {
        for op in ["Relu", "Sigmoid", "Tanh", "HardSwish", "Erf", "Softplus", "Softsign"] {
            let p = parse(op, 14, &[], &[true], 1).unwrap();
            assert_eq!(p.op_type(), op);
            let out = infer(&*p, &[fact(DType::F16, &[n(), Dim::known(8)])]).unwrap();
            assert_eq!(out[0].dtype(), DType::F16);
            assert_eq!(out[0].shape(), &[n(), Dim::known(8)]);
        }
        let relu = parse("Relu", 14, &[], &[true], 1).unwrap();
        assert!(infer(&*relu, &[fact(DType::I8, &[])]).is_ok());
        assert!(infer(&*relu, &[fact(DType::U8, &[])]).is_err());
        let sig = parse("Sigmoid", 13, &[], &[true], 1).unwrap();
        let err = infer(&*sig, &[fact(DType::I64, &[])]).unwrap_err();
        assert!(err.0.contains("floating-point"), "{}", err.0);
    }

    #[test]
    fn attributes_and_defaults() {
        let leaky = parse("LeakyRelu", 16, &[], &[true], 1).unwrap();
        assert_eq!(leaky.downcast_ref::<ActivationOp>().unwrap().act, Activation::LeakyRelu { alpha: 0.01 });
        let hs = parse("HardSigmoid", 6, &[("alpha", Attr::Float(0.5))], &[true], 1).unwrap();
        assert_eq!(hs.downcast_ref::<ActivationOp>().unwrap().act, Activation::HardSigmoid { alpha: 0.5, beta: 0.5 });
        let gelu = parse("Gelu", 20, &[("approximate", Attr::String("tanh".into()))], &[true], 1).unwrap();
        assert_eq!(gelu.downcast_ref::<ActivationOp>().unwrap().act, Activation::Gelu { tanh_approx: true });
        let err = parse("Gelu", 20, &[("approximate", Attr::String("fast".into()))], &[true], 1).unwrap_err();
        assert!(err.0.contains("'approximate' = 'fast'"), "{}", err.0);
        assert!(parse("Elu", 6, &[("alpha", Attr::Int(1))], &[true], 1).unwrap_err().0.contains("must be FLOAT"));
        let r = eval(&*leaky, &[Tensor::from_f32s(&[2], vec![-2.0, 3.0])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![-0.019999999552965164, 3.0]);
    }

    #[test]
    fn clip_by_opset() {
        let old = parse("Clip", 6, &[("min", Attr::Float(0.0)), ("max", Attr::Float(6.0))], &[true], 1).unwrap();
        assert_eq!(old.downcast_ref::<ActivationOp>().unwrap().act, Activation::Clip { min: 0.0, max: 6.0 });
        let new = parse("Clip", 13, &[], &[true, true, true], 1).unwrap();
        let lo = Fact::constant(Arc::new(Tensor::from_f32s(&[], vec![0.0])));
        let hi = Fact::constant(Arc::new(Tensor::from_f32s(&[], vec![6.0])));
        let x = fact(DType::F32, &[n()]);
        let facts = [Some(&x), Some(&lo), Some(&hi)];
        assert_eq!(new.infer(&facts).unwrap()[0].shape(), &[n()]);
        assert_eq!(activation_of(&*new, &facts), Some(Activation::Clip { min: 0.0, max: 6.0 }));
        assert_eq!(activation_of(&*old, &[Some(&x)]), Some(Activation::Clip { min: 0.0, max: 6.0 }));
        let clip = new.downcast_ref::<ClipOp>().unwrap();
        assert_eq!(clip.constant_activation(&facts), Some(Activation::Clip { min: 0.0, max: 6.0 }));
        assert_eq!(
            clip.constant_activation(&[Some(&x), None, Some(&hi)]),
            Some(Activation::Clip { min: f32::MIN, max: 6.0 })
        );
        let xt = Tensor::from_f32s(&[3], vec![-1.0, 3.0, 9.0]);
        let hit = Tensor::from_f32s(&[], vec![6.0]);
        let r = new.eval(&[Some(&xt), None, Some(&hit)]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![-1.0, 3.0, 6.0]);
        let bad = fact(DType::F32, &[Dim::known(2)]);
        assert!(new.infer(&[Some(&x), Some(&bad), None]).unwrap_err().0.contains("scalar"));
        let int_lo = fact(DType::I32, &[]);
        assert!(new.infer(&[Some(&x), Some(&int_lo), None]).unwrap_err().0.contains("must match"));
    }

    #[test]
    fn prelu_unidirectional() {
        let p = parse("PRelu", 16, &[], &[true, true], 1).unwrap();
        let out = infer(
            &*p,
            &[
                fact(DType::F32, &[n(), Dim::known(3), Dim::known(4), Dim::known(4)]),
                fact(DType::F32, &[Dim::known(3), Dim::known(1), Dim::known(1)]),
            ],
        )
        .unwrap();
        assert_eq!(out[0].shape(), &[n(), Dim::known(3), Dim::known(4), Dim::known(4)]);
        let err = infer(&*p, &[fact(DType::F32, &[Dim::known(3)]), fact(DType::F32, &[Dim::known(2), Dim::known(3)])])
            .unwrap_err();
        assert!(err.0.contains("does not broadcast to X"), "{}", err.0);
        let r = eval(
            &*p,
            &[Tensor::from_f32s(&[2, 2], vec![-1.0, 1.0, -1.0, 2.0]), Tensor::from_f32s(&[2, 1], vec![0.5, 0.25])],
        )
        .unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![-0.5, 1.0, -0.25, 2.0]);
    }

    #[test]
    fn prelu_legacy_per_channel_slope() {
        let p = parse("PRelu", 6, &[], &[true, true], 1).unwrap();
        let x = fact(DType::F32, &[n(), Dim::known(3), Dim::known(4)]);
        let out = infer(&*p, &[x, fact(DType::F32, &[Dim::known(3)])]).unwrap();
        assert_eq!(out[0].shape(), &[n(), Dim::known(3), Dim::known(4)]);
        let xt = Tensor::from_f32s(&[1, 2, 2], vec![-1.0, -2.0, -1.0, 3.0]);
        let r = eval(&*p, &[xt, Tensor::from_f32s(&[2], vec![0.5, 0.25])]).unwrap();
        assert_eq!(r[0].to_f64_vec(), vec![-0.5, -1.0, -0.25, 3.0]);
    }
}
