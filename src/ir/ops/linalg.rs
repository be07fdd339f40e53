//! The linalg op family: Gemm and MatMul.

use super::OpSpec;
use crate::ir::broadcast::broadcast_shapes;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::reference::linalg as kernels;
use crate::{op_bail, op_ensure};
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("Gemm", parse_gemm), OpSpec::onnx("MatMul", parse_matmul)];

/// `Y = alpha * op(A) × op(B) + beta * C`.
#[derive(Clone, Debug)]
pub struct Gemm {
    pub trans_a: bool,
    pub trans_b: bool,
    pub alpha: f32,
    pub beta: f32,
}

impl Op for Gemm {
    fn op_type(&self) -> &'static str {
        "Gemm"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let dtype = a.dtype();
        op_ensure!(dtype.is_float(), "Gemm needs floating-point inputs, found {dtype}");
        op_ensure!(b.dtype() == dtype, "Gemm: A is {dtype} but B is {}", b.dtype());
        op_ensure!(
            a.rank() == 2 && b.rank() == 2,
            "Gemm needs 2-D A and B, found {} and {}",
            fmt_shape(a.shape()),
            fmt_shape(b.shape())
        );
        let (m, ka) = if self.trans_a { (&a.shape()[1], &a.shape()[0]) } else { (&a.shape()[0], &a.shape()[1]) };
        let (kb, n) = if self.trans_b { (&b.shape()[1], &b.shape()[0]) } else { (&b.shape()[0], &b.shape()[1]) };
        if let (Some(x), Some(y)) = (ka.as_known(), kb.as_known()) {
            op_ensure!(
                x == y,
                "Gemm: inner dimensions differ: A {} (transA={}) and B {} (transB={})",
                fmt_shape(a.shape()),
                self.trans_a as u8,
                fmt_shape(b.shape()),
                self.trans_b as u8
            );
        }
        let out = vec![m.clone(), n.clone()];
        if let Some(c) = optional(inputs, 2) {
            op_ensure!(c.dtype() == dtype, "Gemm: C is {} but A is {dtype}", c.dtype());
            let bc = broadcast_shapes(&[c.shape(), &out])?;
            op_ensure!(
                bc == out,
                "Gemm: C of shape {} cannot be broadcast to the output {}",
                fmt_shape(c.shape()),
                fmt_shape(&out)
            );
        }
        Ok(vec![Fact::new(dtype, out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let c = optional(inputs, 2).map(|t| t.to_f32());
        let y = kernels::gemm(&f32_of(a), &f32_of(b), c.as_ref(), self.trans_a, self.trans_b, self.alpha, self.beta)?;
        Ok(vec![into_dtype(Tensor::F32(y), a.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The values as f32, borrowed when they already are (weights are not copied per run).
pub(crate) fn f32_of(t: &Tensor) -> std::borrow::Cow<'_, ndarray::ArrayD<f32>> {
    match t.as_f32() {
        Some(a) => std::borrow::Cow::Borrowed(a),
        None => std::borrow::Cow::Owned(t.to_f32()),
    }
}

/// A computed f32 result in the op's element type; no copy when that is f32 (`Tensor::cast`
/// clones even when the type does not change).
pub(crate) fn into_dtype(t: Tensor, dtype: DType) -> Tensor {
    if t.dtype() == dtype {
        t
    } else {
        t.cast(dtype)
    }
}

/// Gemm. Opset history: 1–6 carry a `broadcast` flag (C broadcasts only when it is set) —
/// we accept any unidirectionally broadcastable C regardless, which every valid older model
/// satisfies; 7 made broadcasting implicit; 9 added integer types (not supported here: the
/// reference executor computes Gemm in f32 and rejects integer inputs at inference); 11 made C
/// optional; 13 added bfloat16.
fn parse_gemm(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Gemm {
        trans_a: ctx.flag("transA", false)?,
        trans_b: ctx.flag("transB", false)?,
        alpha: ctx.float_or("alpha", 1.0)?,
        beta: ctx.float_or("beta", 1.0)?,
    }))
}

/// numpy-style matrix product.
#[derive(Clone, Debug)]
pub struct MatMul;

const MATMUL_INT_TYPES: [DType; 4] = [DType::I32, DType::I64, DType::U32, DType::U64];

impl Op for MatMul {
    fn op_type(&self) -> &'static str {
        "MatMul"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let dtype = a.dtype();
        op_ensure!(
            dtype.is_float() || MATMUL_INT_TYPES.contains(&dtype),
            "MatMul does not support element type {dtype}"
        );
        op_ensure!(b.dtype() == dtype, "MatMul: A is {dtype} but B is {}", b.dtype());
        let (sa, sb) = (a.shape(), b.shape());
        op_ensure!(
            !sa.is_empty() && !sb.is_empty(),
            "MatMul operands must have rank >= 1, found {} and {}",
            fmt_shape(sa),
            fmt_shape(sb)
        );
        let a2: Vec<Dim> = if sa.len() == 1 { vec![Dim::known(1), sa[0].clone()] } else { sa.to_vec() };
        let b2: Vec<Dim> = if sb.len() == 1 { vec![sb[0].clone(), Dim::known(1)] } else { sb.to_vec() };
        let (m, ka) = (&a2[a2.len() - 2], &a2[a2.len() - 1]);
        let (kb, n) = (&b2[b2.len() - 2], &b2[b2.len() - 1]);
        if let (Some(x), Some(y)) = (ka.as_known(), kb.as_known()) {
            op_ensure!(x == y, "MatMul: inner dimensions differ: {} x {}", fmt_shape(sa), fmt_shape(sb));
        }
        let mut out = broadcast_shapes(&[&a2[..a2.len() - 2], &b2[..b2.len() - 2]]).map_err(|e| {
            crate::ir::OpError(format!("MatMul batch dims of {} and {}: {}", fmt_shape(sa), fmt_shape(sb), e.0))
        })?;
        if sa.len() > 1 {
            out.push(m.clone());
        }
        if sb.len() > 1 {
            out.push(n.clone());
        }
        Ok(vec![Fact::new(dtype, out)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let a = required(inputs, 0, "A")?;
        let b = required(inputs, 1, "B")?;
        let y = match (a, b) {
            (Tensor::I32(x), Tensor::I32(y)) => Tensor::I32(kernels::matmul_int(x.view(), y.view())?),
            (Tensor::I64(x), Tensor::I64(y)) => Tensor::I64(kernels::matmul_int(x.view(), y.view())?),
            (Tensor::U32(x), Tensor::U32(y)) => Tensor::U32(kernels::matmul_int(x.view(), y.view())?),
            (Tensor::U64(x), Tensor::U64(y)) => Tensor::U64(kernels::matmul_int(x.view(), y.view())?),
            _ if a.dtype().is_float() && b.dtype() == a.dtype() => {
                into_dtype(Tensor::F32(kernels::matmul(&f32_of(a), &f32_of(b))?), a.dtype())
            }
            _ => op_bail!("MatMul does not support {} x {}", a.dtype(), b.dtype()),
        };
        Ok(vec![y])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// MatMul. Opset history: 1 (floats), 9 added int32/int64/uint32/uint64 (computed exactly,
/// wrapping on overflow), 13 added bfloat16. Semantics identical across versions.
fn parse_matmul(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(MatMul))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;

    fn parse_op(op: &str, opset: i64, attrs: &[(&str, Attr)], n_in: usize) -> Box<dyn Op> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &vec![true; n_in], 1).expect("parses")
    }

    fn f(dtype: DType, shape: Vec<Dim>) -> Fact {
        Fact::new(dtype, shape)
    }

    #[test]
    fn gemm_infer_symbolic_and_errors() {
        let op = parse_op("Gemm", 13, &[("transB", Attr::Int(1))], 3);
        let n = Dim::sym("N");
        let a = f(DType::F32, vec![n.clone(), Dim::known(512)]);
        let b = f(DType::F32, vec![Dim::known(10), Dim::known(512)]);
        let c = f(DType::F32, vec![Dim::known(10)]);
        let out = op.infer(&[Some(&a), Some(&b), Some(&c)]).unwrap();
        assert_eq!(out[0].shape(), &[n.clone(), Dim::known(10)]);
        let bad_c = f(DType::F32, vec![Dim::known(3)]);
        assert!(op.infer(&[Some(&a), Some(&b), Some(&bad_c)]).is_err());
        let bad_b = f(DType::F32, vec![Dim::known(10), Dim::known(256)]);
        let e = op.infer(&[Some(&a), Some(&bad_b), None]).unwrap_err();
        assert!(e.0.contains("inner dimensions"), "{}", e.0);
        assert!(parse_op("Gemm", 13, &[], 2)
            .infer(&[
                Some(&f(DType::I32, vec![Dim::known(1), Dim::known(1)])),
                Some(&f(DType::I32, vec![Dim::known(1), Dim::known(1)]))
            ])
            .is_err());
    }

    #[test]
    fn gemm_eval_matches_numpy() {
        // numpy: A = [[1,2],[3,4]]; B = [[5,6],[7,8]]; 0.5 * A @ B.T + 2 * [[1],[2]]
        let op = parse_op(
            "Gemm",
            11,
            &[("transB", Attr::Int(1)), ("alpha", Attr::Float(0.5)), ("beta", Attr::Float(2.0))],
            3,
        );
        let a = Tensor::from_f32s(&[2, 2], vec![1., 2., 3., 4.]);
        let b = Tensor::from_f32s(&[2, 2], vec![5., 6., 7., 8.]);
        let c = Tensor::from_f32s(&[2, 1], vec![1., 2.]);
        let y = op.eval(&[Some(&a), Some(&b), Some(&c)]).unwrap();
        assert_eq!(y[0].to_f64_vec(), vec![10.5, 13.5, 23.5, 30.5]);
        let y16 = op.eval(&[Some(&a.cast(DType::F16)), Some(&b.cast(DType::F16)), None]).unwrap();
        assert_eq!(y16[0].dtype(), DType::F16);
        assert_eq!(y16[0].to_f64_vec(), vec![8.5, 11.5, 19.5, 26.5]);
    }

    #[test]
    fn matmul_infer_broadcasts_batch_and_drops_vector_dims() {
        let op = parse_op("MatMul", 13, &[], 2);
        let (b, s) = (Dim::sym("B"), Dim::sym("S"));
        let a = f(DType::F32, vec![b.clone(), Dim::known(1), s.clone(), Dim::known(64)]);
        let w = f(DType::F32, vec![Dim::known(12), Dim::known(64), s.clone()]);
        let out = op.infer(&[Some(&a), Some(&w)]).unwrap();
        assert_eq!(out[0].shape(), &[b.clone(), Dim::known(12), s.clone(), s.clone()]);
        let v = f(DType::F32, vec![Dim::known(64)]);
        let out = op.infer(&[Some(&a), Some(&v)]).unwrap();
        assert_eq!(out[0].shape(), &[b.clone(), Dim::known(1), s.clone()]);
        let e = op.infer(&[Some(&a), Some(&f(DType::F32, vec![Dim::known(32), Dim::known(3)]))]).unwrap_err();
        assert!(e.0.contains("inner dimensions"), "{}", e.0);
        let e = op
            .infer(&[
                Some(&f(DType::F32, vec![Dim::known(2), Dim::known(3), Dim::known(4)])),
                Some(&f(DType::F32, vec![Dim::known(3), Dim::known(4), Dim::known(5)])),
            ])
            .unwrap_err();
        assert!(e.0.contains("cannot be broadcast"), "{}", e.0);
    }

    #[test]
    fn matmul_eval_float_and_int() {
        let op = parse_op("MatMul", 13, &[], 2);
        let a = Tensor::from_f32s(&[2, 3], vec![1., 2., 3., 4., 5., 6.]);
        let v = Tensor::from_f32s(&[3], vec![1., 0., -1.]);
        let y = op.eval(&[Some(&a), Some(&v)]).unwrap();
        assert_eq!(y[0].shape(), &[2]);
        assert_eq!(y[0].to_f64_vec(), vec![-2.0, -2.0]);
        let ai = Tensor::from_i64s(&[2, 2], vec![1, 2, 3, 4]);
        let y = op.eval(&[Some(&ai), Some(&ai)]).unwrap();
        assert_eq!(y[0].to_i64_vec(), vec![7, 10, 15, 22]);
    }
}
