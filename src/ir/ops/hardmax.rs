//! The hardmax op family: Hardmax, a one-hot of the first maximum along an axis (beside the
//! softmax family, with the same opset < 13 coerce-to-2-D semantics).

use super::OpSpec;
use crate::ir::broadcast::normalize_axis;
use crate::ir::{required, DType, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::hardmax::{hardmax_axis, hardmax_coerced_2d};
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("Hardmax", parse_hardmax)];

#[derive(Clone, Debug)]
pub struct Hardmax {
    pub axis: i64,
    /// Opset < 13: the lanes are the rows of the input viewed as
    /// `[prod(dims[..axis]), prod(dims[axis..])]` instead of the single `axis`.
    pub coerce_2d: bool,
}

impl Hardmax {
    fn check(&self, dtype: DType, rank: usize) -> OpResult<usize> {
        op_ensure!(dtype.is_float(), "Hardmax needs a floating-point input, found {dtype}");
        op_ensure!(rank > 0, "Hardmax needs an input of rank 1 or more, found a scalar");
        normalize_axis(self.axis, rank)
    }
}

impl Op for Hardmax {
    fn op_type(&self) -> &'static str {
        "Hardmax"
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
        let y = if self.coerce_2d { hardmax_coerced_2d(&a, axis) } else { hardmax_axis(&a, axis) };
        Ok(vec![Tensor::F32(y).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Hardmax: 1 at the first maximum of each lane, 0 elsewhere. Opset history (as Softmax):
/// 1 and 11 coerce the input to 2-D at `axis` (default 1; 11 allowed negative axes) and take
/// each row as a lane; 13 uses the single `axis` (default -1) and added bfloat16.
fn parse_hardmax(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let coerce_2d = ctx.opset < 13;
    let axis = ctx.int_or("axis", if coerce_2d { 1 } else { -1 })?;
    Ok(Box::new(Hardmax { axis, coerce_2d }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Dim;

    fn parse(opset: i64) -> Box<dyn Op> {
        crate::ir::ops::testutil::parse_node("Hardmax", opset, &[], &[true], 1).unwrap()
    }

    #[test]
    fn opset_picks_lanes_like_ort() {
        // ORT: x = [[[3,1],[2,4]],[[0,0],[5,1]]] float.
        let x = Tensor::from_f32s(&[2, 2, 2], vec![3., 1., 2., 4., 0., 0., 5., 1.]);
        let new = parse(13).eval(&[Some(&x)]).unwrap().remove(0);
        assert_eq!(new.to_f64_vec(), vec![1., 0., 0., 1., 1., 0., 1., 0.]);
        let old = parse(11).eval(&[Some(&x)]).unwrap().remove(0);
        assert_eq!(old.to_f64_vec(), vec![0., 0., 0., 1., 0., 0., 1., 0.]);
        let h = parse(13).eval(&[Some(&x.cast(DType::F16))]).unwrap().remove(0);
        assert_eq!(h.dtype(), DType::F16);
    }

    #[test]
    fn infer_checks_dtype() {
        let x = Fact::new(DType::BF16, vec![Dim::sym("N"), Dim::known(10)]);
        assert_eq!(parse(13).infer(&[Some(&x)]).unwrap()[0].ty, x.ty);
        let i = Fact::new(DType::I64, vec![Dim::known(3)]);
        assert!(parse(13).infer(&[Some(&i)]).unwrap_err().0.contains("floating-point"));
    }
}
