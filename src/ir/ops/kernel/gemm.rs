//! Fused (batched) matrix product: `act(alpha·op(A)·op(B) + beta·bias + residual)`.

use super::act::Act;
use crate::ir::broadcast::broadcast_shapes;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, Dim, Fact, Op, OpResult, Tensor};
use crate::reference::kernel::gemm as kernels;
use crate::{op_bail, op_ensure};
use std::any::Any;

/// Covers ONNX `MatMul` (numpy `matmul` semantics: batch dims broadcast, 1-D operands promoted
/// and the promoted axis removed) and `Gemm` (2-D, `transA`/`transB`, `alpha`/`beta`, bias `C`
/// broadcast to the output), plus a residual input of the output's shape and an activation.
///
/// Inputs: `A`, `B`, optional `bias` (broadcastable to the output), optional `residual`.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
    pub act: Option<Act>,
}

impl Gemm {
    pub fn matmul() -> Gemm {
        Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: None }
    }

    /// Output shape from the operand shapes (1-D promotion and batch broadcast).
    pub fn out_shape(&self, a: &[Dim], b: &[Dim]) -> OpResult<Vec<Dim>> {
        op_ensure!(
            !a.is_empty() && !b.is_empty(),
            "matrix product operands must have rank ≥ 1, found {} and {}",
            fmt_shape(a),
            fmt_shape(b)
        );
        op_ensure!(
            !(self.trans_a && a.len() < 2 || self.trans_b && b.len() < 2),
            "transposed operands must have rank ≥ 2"
        );
        let one = Dim::known(1);
        let a2: Vec<Dim> = if a.len() == 1 { vec![one.clone(), a[0].clone()] } else { a.to_vec() };
        let b2: Vec<Dim> = if b.len() == 1 { vec![b[0].clone(), one.clone()] } else { b.to_vec() };
        let (ra, rb) = (a2.len(), b2.len());
        let (m, ka) = if self.trans_a { (&a2[ra - 1], &a2[ra - 2]) } else { (&a2[ra - 2], &a2[ra - 1]) };
        let (kb, n) = if self.trans_b { (&b2[rb - 1], &b2[rb - 2]) } else { (&b2[rb - 2], &b2[rb - 1]) };
        if ka != kb && ka.is_known() && kb.is_known() {
            op_bail!("inner dimensions differ: {} and {} (shapes {} and {})", ka, kb, fmt_shape(a), fmt_shape(b));
        }
        let mut out = broadcast_shapes(&[&a2[..ra - 2], &b2[..rb - 2]])?;
        if a.len() > 1 {
            out.push(m.clone());
        }
        if b.len() > 1 {
            out.push(n.clone());
        }
        Ok(out)
    }
}

impl Op for Gemm {
    fn op_type(&self) -> &'static str {
        "Gemm"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let dtype = a.dtype();
        op_ensure!(dtype.is_float(), "matrix products compute on floating-point tensors, found {dtype}");
        op_ensure!(b.dtype() == dtype, "operands have different element types: {dtype} and {}", b.dtype());
        let out = self.out_shape(a.shape(), b.shape())?;
        for (i, what) in [(2, "bias"), (3, "residual")] {
            if let Some(f) = optional(inputs, i) {
                op_ensure!(f.dtype() == dtype, "{what} is {} but the operands are {dtype}", f.dtype());
                let joined = broadcast_shapes(&[&out, f.shape()])?;
                op_ensure!(
                    joined == out,
                    "{what} {} does not broadcast to the output {}",
                    fmt_shape(f.shape()),
                    fmt_shape(&out)
                );
            }
        }
        Ok(vec![Fact::new(dtype, out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let bias = optional(inputs, 2).map(|t| t.to_f32());
        let res = optional(inputs, 3).map(|t| t.to_f32());
        let out = kernels::gemm(self, &a.to_f32(), &b.to_f32(), bias.as_ref(), res.as_ref())?;
        Ok(vec![Tensor::F32(out).cast(a.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
