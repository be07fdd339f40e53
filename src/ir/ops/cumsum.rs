//! The cumsum op family: CumSum, running sums along one axis.

use super::OpSpec;
use crate::ir::broadcast::normalize_axis;
use crate::ir::dim::fmt_shape;
use crate::ir::{required, DType, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::cumsum::cumsum;
use crate::{op_bail, op_ensure};
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("CumSum", parse_cumsum)];

#[derive(Clone, Debug)]
pub struct CumSum {
    pub exclusive: bool,
    pub reverse: bool,
}

const TYPES: [DType; 8] =
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U32, DType::U64];

fn check(x_dtype: DType, x_rank: usize, axis: &Fact) -> OpResult<()> {
    op_ensure!(TYPES.contains(&x_dtype), "CumSum does not support element type {x_dtype} (expected one of {TYPES:?})");
    op_ensure!(x_rank >= 1, "CumSum needs an input of rank 1 or more, found a scalar");
    op_ensure!(
        matches!(axis.dtype(), DType::I32 | DType::I64),
        "CumSum: input 'axis' must be int32 or int64, found {}",
        axis.dtype()
    );
    op_ensure!(
        axis.rank() == 0 || (axis.rank() == 1 && axis.shape()[0].as_known().is_none_or(|n| n == 1)),
        "CumSum: input 'axis' must be a scalar, found shape {}",
        fmt_shape(axis.shape())
    );
    Ok(())
}

impl Op for CumSum {
    fn op_type(&self) -> &'static str {
        "CumSum"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "x")?;
        let axis = required(inputs, 1, "axis")?;
        check(x.dtype(), x.rank(), axis)?;
        // The output shape does not depend on the axis, so a run-time axis (as the ONNX
        // backend tests feed it) is accepted and range-checked when it runs.
        if let Some([a]) = axis.as_ints().as_deref() {
            normalize_axis(*a, x.rank())?;
        }
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "x")?;
        let axis_t = required(inputs, 1, "axis")?;
        check(x.dtype(), x.rank(), &Fact::new(axis_t.dtype(), crate::ir::dim::dims_of(axis_t.shape())))?;
        let axis = normalize_axis(axis_t.to_i64_vec()[0], x.rank())?;
        let (e, r) = (self.exclusive, self.reverse);
        Ok(vec![match x {
            Tensor::F32(a) => Tensor::F32(cumsum(a, axis, e, r)),
            Tensor::F64(a) => Tensor::F64(cumsum(a, axis, e, r)),
            // Half types accumulate in f32 and round once at the end.
            Tensor::F16(_) | Tensor::BF16(_) => Tensor::F32(cumsum(&x.to_f32(), axis, e, r)).cast(x.dtype()),
            Tensor::I32(a) => Tensor::I32(cumsum(a, axis, e, r)),
            Tensor::I64(a) => Tensor::I64(cumsum(a, axis, e, r)),
            Tensor::U32(a) => Tensor::U32(cumsum(a, axis, e, r)),
            Tensor::U64(a) => Tensor::U64(cumsum(a, axis, e, r)),
            other => op_bail!("CumSum does not support element type {}", other.dtype()),
        }])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// CumSum: `y[.., i, ..] = sum(x[.., j, ..])` over `j <= i` along `axis` (`j < i` when
/// `exclusive`, `j >= i` / `j > i` when `reverse`). The `axis` input is checked at compile
/// time when it is a constant, else when the node runs. Opset history: 11 introduced it (float, double, int32/64, uint32/64); 14 added
/// float16 and bfloat16 (accepted at every opset).
fn parse_cumsum(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(CumSum { exclusive: ctx.flag("exclusive", false)?, reverse: ctx.flag("reverse", false)? }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attr, Dim};
    use std::sync::Arc;

    fn parse(attrs: &[(&str, Attr)]) -> Box<dyn Op> {
        crate::ir::ops::testutil::parse_node("CumSum", 14, attrs, &[true, true], 1).unwrap()
    }

    #[test]
    fn modes_match_ort() {
        // ORT opset 14: x = arange(1, 7).reshape(2,3) float, axis 1 (int32) / -2.
        let x = Tensor::from_f32s(&[2, 3], (1..=6).map(|v| v as f32).collect());
        let ax1 = Tensor::from_i64s(&[], vec![1]).cast(DType::I32);
        let y = parse(&[]).eval(&[Some(&x), Some(&ax1)]).unwrap().remove(0);
        assert_eq!(y.to_f64_vec(), vec![1., 3., 6., 4., 9., 15.]);
        let rev_ex = parse(&[("exclusive", Attr::Int(1)), ("reverse", Attr::Int(1))]);
        assert_eq!(rev_ex.eval(&[Some(&x), Some(&ax1)]).unwrap()[0].to_f64_vec(), vec![5., 3., 0., 11., 6., 0.]);
        let ax0 = Tensor::from_i64s(&[1], vec![-2]);
        let y = parse(&[("exclusive", Attr::Int(1))]).eval(&[Some(&x.cast(DType::I64)), Some(&ax0)]).unwrap().remove(0);
        assert_eq!(y.to_i64_vec(), vec![0, 0, 0, 1, 2, 3]);
        let h = parse(&[]).eval(&[Some(&x.cast(DType::F16)), Some(&ax1)]).unwrap().remove(0);
        assert_eq!(h.dtype(), DType::F16);
        assert_eq!(h.to_f64_vec(), vec![1., 3., 6., 4., 9., 15.]);
    }

    #[test]
    fn infer_checks_a_constant_axis() {
        let op = parse(&[]);
        let x = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(3)]);
        let axis = Fact::constant(Arc::new(Tensor::from_i64s(&[], vec![1])));
        assert_eq!(op.infer(&[Some(&x), Some(&axis)]).unwrap()[0].ty, x.ty);
        let runtime = Fact::new(DType::I64, vec![]);
        assert_eq!(op.infer(&[Some(&x), Some(&runtime)]).unwrap()[0].ty, x.ty);
        let bad = Tensor::from_i64s(&[], vec![3]);
        let xt = Tensor::from_f32s(&[1, 3], vec![1.0, 2.0, 3.0]);
        assert!(op.eval(&[Some(&xt), Some(&bad)]).unwrap_err().0.contains("out of range"));
        let far = Fact::constant(Arc::new(Tensor::from_i64s(&[], vec![2])));
        assert!(op.infer(&[Some(&x), Some(&far)]).unwrap_err().0.contains("out of range"));
        let int8 = Fact::new(DType::I8, vec![Dim::known(3)]);
        assert!(op.infer(&[Some(&int8), Some(&axis)]).unwrap_err().0.contains("int8"));
    }
}
