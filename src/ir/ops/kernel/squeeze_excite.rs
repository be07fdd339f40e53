//! The scale of a squeeze-and-excitation block, as one kernel: global average pooling, a 1x1
//! convolution (a dense layer on the pooled vector), its activation, a second 1x1 convolution
//! and the gate, from an NHWC activation to its per-(image, channel) scale
//! (rewrites/squeeze_excite.rules). The block's `x · scale` stays an elementwise product, which
//! the elementwise chain fusion merges with whatever else reads x pointwise.
//!
//! Why the scale is its own kernel: the pooling reads all of x before any scale is known, so
//! the product cannot run in the kernel that produces x; and in the exports this serves
//! (torchvision's EfficientNet and MobileNetV3) the block sits between a depthwise conv and a
//! 1x1 projection, so the two tiny products, the pooling and both activations in one launch
//! replace a pooling kernel, two convolution kernels and (for squeeze widths that are not a
//! multiple of 8) a channel-padding kernel.

use super::act::Act;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, Dim, Fact, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::kernel::squeeze_excite as kernels;
use std::any::Any;

/// `scale[n,0,0,c] = gate(b2[c] + Σ_j w2[c,0,0,j] · act(b1[j] + Σ_i w1[j,0,0,i] · mean_hw x[n,h,w,i]))`.
///
/// Inputs: `x` `[N, H, W, C]` (NHWC), `w1` `[S, 1, 1, C]`, optional `b1` `[S]`, `w2`
/// `[C, 1, 1, S]`, optional `b2` `[C]` (the 1x1 filters in KRSC order, as the NHWC convolutions
/// they replace hold them). Output `[N, 1, 1, C]`, x's dtype.
#[derive(Clone, Debug, PartialEq)]
pub struct SqueezeExciteScale {
    /// Applied after the first product (torchvision: ReLU, SiLU).
    pub act: Option<Act>,
    /// Applied after the second product (Sigmoid, HardSigmoid).
    pub gate: Option<Act>,
}

impl SqueezeExciteScale {
    /// The most channels (and squeeze units) the kernel holds in shared memory: with its
    /// pooling shares that is 47 KiB at 3840 (EfficientNet-B7's widest block), under the 48 KiB
    /// a kernel gets without opting in to more.
    pub const MAX_CHANNELS: i64 = 3840;
}

impl Op for SqueezeExciteScale {
    fn op_type(&self) -> &'static str {
        "SqueezeExciteScale"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "x")?;
        let w1 = required(inputs, 1, "w1")?;
        let w2 = required(inputs, 3, "w2")?;
        let dt = x.dtype();
        op_ensure!(dt.is_float(), "squeeze-excite computes on floating-point tensors, found {dt}");
        op_ensure!(x.rank() == 4, "squeeze-excite needs an NHWC input, found {}", fmt_shape(x.shape()));
        let c = &x.shape()[3];
        op_ensure!(w1.rank() == 4 && w2.rank() == 4, "squeeze-excite weights must be 1x1 filters [K,1,1,C]");
        let s = &w1.shape()[0];
        let one = Dim::known(1);
        let want1 = [s.clone(), one.clone(), one.clone(), c.clone()];
        let want2 = [c.clone(), one.clone(), one.clone(), s.clone()];
        for (what, w, want) in [("w1", w1, &want1), ("w2", w2, &want2)] {
            op_ensure!(w.dtype() == dt, "{what} is {} but x is {dt}", w.dtype());
            op_ensure!(w.shape() == want.as_slice(), "{what} is {}, want {}", fmt_shape(w.shape()), fmt_shape(want));
        }
        for (what, i, len) in [("b1", 2, s), ("b2", 4, c)] {
            if let Some(b) = optional(inputs, i) {
                op_ensure!(
                    b.dtype() == dt && b.shape() == [len.clone()],
                    "{what} must be {dt}[{len}], found {}{}",
                    b.dtype(),
                    fmt_shape(b.shape())
                );
            }
        }
        Ok(vec![Fact::new(dt, vec![x.shape()[0].clone(), one.clone(), one, c.clone()])])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "x")?;
        let w1 = required(inputs, 1, "w1")?.to_f32();
        let w2 = required(inputs, 3, "w2")?.to_f32();
        let b1 = optional(inputs, 2).map(|t| t.to_f32());
        let b2 = optional(inputs, 4).map(|t| t.to_f32());
        let out = kernels::squeeze_excite_scale(&x.to_f32(), &w1, b1.as_ref(), self.act, &w2, b2.as_ref(), self.gate)?;
        Ok(vec![Tensor::F32(out).cast(x.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;

    #[test]
    fn infers_the_per_channel_scale_and_rejects_mismatched_weights() {
        let f = |shape: &[i64]| Fact::new(DType::F32, shape.iter().map(|&d| Dim::known(d)).collect());
        let n = Fact::new(DType::F32, vec![Dim::sym("batch"), Dim::known(7), Dim::known(7), Dim::known(24)]);
        let (w1, b1, w2, b2) = (f(&[6, 1, 1, 24]), f(&[6]), f(&[24, 1, 1, 6]), f(&[24]));
        let op = SqueezeExciteScale { act: Some(Act::Silu), gate: Some(Act::Sigmoid) };
        let out = op.infer(&[Some(&n), Some(&w1), Some(&b1), Some(&w2), Some(&b2)]).unwrap();
        assert_eq!(out[0].shape(), [Dim::sym("batch"), Dim::known(1), Dim::known(1), Dim::known(24)]);
        // Without biases too.
        assert!(op.infer(&[Some(&n), Some(&w1), None, Some(&w2), None]).is_ok());
        // The second filter must map the squeeze width back to C.
        let wrong = f(&[24, 1, 1, 5]);
        let err = op.infer(&[Some(&n), Some(&w1), Some(&b1), Some(&wrong), Some(&b2)]).unwrap_err();
        assert!(err.0.contains("w2 is [24,1,1,5]"), "{}", err.0);
        let bad_bias = f(&[5]);
        assert!(op.infer(&[Some(&n), Some(&w1), Some(&bad_bias), Some(&w2), Some(&b2)]).is_err());
    }
}
