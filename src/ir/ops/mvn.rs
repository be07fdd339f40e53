//! The mvn op family: MeanVarianceNormalization, `(x - mean) / (std + 1e-9)` over a set of
//! axes (by default the batch and spatial axes of NCHW, i.e. per channel).

use super::OpSpec;
use crate::ir::broadcast::normalize_axes;
use crate::ir::{required, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::mvn::mvn;
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("MeanVarianceNormalization", parse_mvn)];

#[derive(Clone, Debug)]
pub struct MeanVarianceNormalization {
    pub axes: Vec<i64>,
}

impl MeanVarianceNormalization {
    fn check(&self, x: &Fact) -> OpResult<Vec<usize>> {
        op_ensure!(x.dtype().is_float(), "MeanVarianceNormalization needs a floating-point input, found {}", x.dtype());
        normalize_axes(&self.axes, x.rank())
    }
}

impl Op for MeanVarianceNormalization {
    fn op_type(&self) -> &'static str {
        "MeanVarianceNormalization"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        self.check(x)?;
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        let axes = self.check(&Fact::new(x.dtype(), crate::ir::dim::dims_of(x.shape())))?;
        Ok(vec![Tensor::F32(mvn(&x.to_f32(), &axes)).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// MeanVarianceNormalization: `(x - mean) / (sqrt(var) + 1e-9)` with mean and population
/// variance over `axes` (default `[0, 2, 3]`), as the ONNX function body defines it. A lane
/// with zero variance gives 0 here; ONNX Runtime's kernel gives NaN there (0/0).
/// Opset history: 9 introduced it with `axes`; 13 added bfloat16. (The opset 1 form with
/// `across_channels` / `normalize_variance` was experimental and never part of ai.onnx, so
/// nodes of opset < 9 are rejected.)
fn parse_mvn(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    op_ensure!(
        ctx.opset >= 9,
        "MeanVarianceNormalization is defined from opset 9, the model imports opset {}",
        ctx.opset
    );
    Ok(Box::new(MeanVarianceNormalization { axes: ctx.ints_or("axes", vec![0, 2, 3])? }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attr, DType, Dim};

    fn parse(opset: i64, attrs: &[(&str, Attr)]) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node("MeanVarianceNormalization", opset, attrs, &[true], 1)
    }

    #[test]
    fn matches_ort() {
        // ORT opset 13: x [2,2,2,2] = channel 0 [[1,2],[3,5]] / zeros, channel 1 = 2*x+1.
        let c0 = [1.0f32, 2.0, 3.0, 5.0, 0.0, 0.0, 0.0, 0.0];
        let mut v = Vec::new();
        for n in 0..2 {
            for c in 0..2 {
                for i in 0..4 {
                    let x = c0[n * 4 + i];
                    v.push(if c == 0 { x } else { 2.0 * x + 1.0 });
                }
            }
        }
        let x = Tensor::from_f32s(&[2, 2, 2, 2], v);
        let y = parse(13, &[]).unwrap().eval(&[Some(&x)]).unwrap().remove(0);
        let want = [-0.21707238, 0.3617873, 0.94064695, 2.0983663, -0.21707238, 0.3617873, 0.94064695, 2.0983663];
        let got = y.to_f64_vec();
        for (g, w) in got[..8].iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?}");
        }
        assert!((got[8] - -0.79593205).abs() < 1e-5, "{got:?}");
        let per_channel = parse(9, &[("axes", Attr::Ints(vec![1]))]).unwrap().eval(&[Some(&x)]).unwrap().remove(0);
        assert_eq!(&per_channel.to_f64_vec()[..8], &[-1.0, -1.0, -1.0, -1.0, 1.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn infer_and_errors() {
        let op = parse(13, &[]).unwrap();
        let x = Fact::new(DType::F16, vec![Dim::sym("N"), Dim::known(3), Dim::sym("H"), Dim::sym("W")]);
        assert_eq!(op.infer(&[Some(&x)]).unwrap()[0].ty, x.ty);
        let rank2 = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(3)]);
        assert!(op.infer(&[Some(&rank2)]).unwrap_err().0.contains("out of range"));
        assert!(parse(1, &[]).unwrap_err().0.contains("opset 9"));
    }
}
