//! Fused scaled dot-product attention, the kernel the optimiser makes of the exported
//! `softmax(Q·Kᵀ·scale + mask)·V` subgraph with its head transposes (rewrites/fusion.rules).

use crate::ir::broadcast::broadcast_shapes;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, Fact, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::kernel::attention as kernels;
use std::any::Any;

/// `O[b,i,h,:] = Σ_j softmax_j(Q[b,i,h,:]·K[b,j,h,:]·scale + mask[b,h,i,j]) · V[b,j,h,:]`.
///
/// Inputs: `q` `[B, Sq, H, D]`, `k` `[B, Sk, H, D]`, `v` `[B, Sk, H, Dv]` — the heads-last
/// layout a `[B, S, H·D]` projection has when viewed per head, so no transposes are needed —
/// and an optional additive `mask` broadcastable to `[B, H, Sq, Sk]`. Output `[B, Sq, H, Dv]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    pub scale: f32,
}

impl Op for Attention {
    fn op_type(&self) -> &'static str {
        "Attention"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let q = required(inputs, 0, "q")?;
        let k = required(inputs, 1, "k")?;
        let v = required(inputs, 2, "v")?;
        op_ensure!(q.dtype().is_float(), "attention computes on floating-point tensors, found {}", q.dtype());
        for (what, f) in [("k", k), ("v", v)] {
            op_ensure!(f.dtype() == q.dtype(), "{what} is {} but q is {}", f.dtype(), q.dtype());
            op_ensure!(f.rank() == 4, "{what} must be [B, S, H, D], found {}", fmt_shape(f.shape()));
        }
        op_ensure!(q.rank() == 4, "q must be [B, S, H, D], found {}", fmt_shape(q.shape()));
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        op_ensure!(
            qs[0] == ks[0] && qs[2] == ks[2] && qs[3] == ks[3],
            "q {} and k {} differ in batch, heads or head size",
            fmt_shape(qs),
            fmt_shape(ks)
        );
        op_ensure!(
            vs[0] == ks[0] && vs[1] == ks[1] && vs[2] == ks[2],
            "k {} and v {} differ in batch, length or heads",
            fmt_shape(ks),
            fmt_shape(vs)
        );
        if let Some(m) = optional(inputs, 3) {
            op_ensure!(m.dtype() == q.dtype(), "mask is {} but q is {}", m.dtype(), q.dtype());
            let scores = [qs[0].clone(), qs[2].clone(), qs[1].clone(), ks[1].clone()];
            let joined = broadcast_shapes(&[&scores, m.shape()])?;
            op_ensure!(
                joined == scores,
                "mask {} does not broadcast to the scores {}",
                fmt_shape(m.shape()),
                fmt_shape(&scores)
            );
        }
        Ok(vec![Fact::new(q.dtype(), vec![qs[0].clone(), qs[1].clone(), qs[2].clone(), vs[3].clone()])])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let q = required(inputs, 0, "q")?;
        let k = required(inputs, 1, "k")?.to_f32();
        let v = required(inputs, 2, "v")?.to_f32();
        let mask = optional(inputs, 3).map(|m| m.to_f32());
        let out = kernels::attention(&q.to_f32(), &k, &v, mask.as_ref(), self.scale)?;
        Ok(vec![Tensor::F32(out).cast(q.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
