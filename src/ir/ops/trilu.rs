//! The trilu op family: Trilu, the upper or lower triangle of the last two axes (numpy `triu` /
//! `tril`), batched over the leading axes.

use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, DType, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::trilu as kernels;
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("Trilu", parse_trilu)];

#[derive(Clone, Debug)]
pub struct Trilu {
    pub upper: bool,
}

fn check_k(k: &Fact) -> OpResult<()> {
    op_ensure!(k.dtype() == DType::I64, "Trilu: input 'k' must be int64, found {}", k.dtype());
    op_ensure!(
        k.rank() == 0 || (k.rank() == 1 && k.shape()[0].as_known().is_none_or(|n| n == 1)),
        "Trilu: input 'k' must be a scalar, found shape {}",
        fmt_shape(k.shape())
    );
    Ok(())
}

impl Op for Trilu {
    fn op_type(&self) -> &'static str {
        "Trilu"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(x.rank() >= 2, "Trilu needs an input of rank 2 or more, found {}", fmt_shape(x.shape()));
        if let Some(k) = optional(inputs, 1) {
            check_k(k)?;
        }
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(x.rank() >= 2, "Trilu needs an input of rank 2 or more, found shape {:?}", x.shape());
        let k = match optional(inputs, 1) {
            None => 0,
            Some(t) => {
                op_ensure!(
                    t.dtype() == DType::I64 && t.len() == 1,
                    "Trilu: input 'k' must be one int64 value, found {}{:?}",
                    t.dtype(),
                    t.shape()
                );
                t.to_i64_vec()[0]
            }
        };
        Ok(vec![crate::map_tensor!(x, a => kernels::trilu(a, k, self.upper))])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Trilu: keeps `x[.., i, j]` where `j - i >= k` (`upper = 1`, the default) or `j - i <= k`
/// (`upper = 0`), zeroing the rest; the optional input `k` (int64 scalar, default 0) shifts
/// the diagonal and may be a run-time value. Opset history: introduced in 14, unchanged since.
fn parse_trilu(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(Trilu { upper: ctx.flag("upper", true)? }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attr, Dim};

    fn parse(attrs: &[(&str, Attr)]) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node("Trilu", 14, attrs, &[true, true], 1)
    }

    #[test]
    fn batched_upper_and_lower_match_ort() {
        // ORT opset 14: x = arange(1, 25).reshape(2,3,4) int32.
        let x = Tensor::from_i64s(&[2, 3, 4], (1..=24).collect()).cast(DType::I32);
        let k = Tensor::from_i64s(&[], vec![-1]);
        let upper = parse(&[]).unwrap().eval(&[Some(&x), Some(&k)]).unwrap().remove(0);
        assert_eq!(upper.dtype(), DType::I32);
        assert_eq!(&upper.to_i64_vec()[12..], &[13, 14, 15, 16, 17, 18, 19, 20, 0, 22, 23, 24]);
        let lower = parse(&[("upper", Attr::Int(0))]).unwrap().eval(&[Some(&x), None]).unwrap().remove(0);
        assert_eq!(&lower.to_i64_vec()[..12], &[1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0]);
        let big_k = Tensor::from_i64s(&[1], vec![5]);
        let none = parse(&[]).unwrap().eval(&[Some(&x), Some(&big_k)]).unwrap().remove(0);
        assert!(none.to_i64_vec().iter().all(|&v| v == 0));
    }

    #[test]
    fn infer_and_errors() {
        let op = parse(&[]).unwrap();
        let x = Fact::new(DType::F32, vec![Dim::sym("B"), Dim::sym("S"), Dim::sym("S")]);
        assert_eq!(op.infer(&[Some(&x), None]).unwrap()[0].ty, x.ty);
        let vec = Fact::new(DType::F32, vec![Dim::known(4)]);
        assert!(op.infer(&[Some(&vec), None]).unwrap_err().0.contains("rank 2 or more"));
        let k32 = Fact::new(DType::I32, vec![]);
        assert!(op.infer(&[Some(&x), Some(&k32)]).unwrap_err().0.contains("int64"));
        assert!(parse(&[("upper", Attr::Int(2))]).is_err());
    }
}
