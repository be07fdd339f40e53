//! Reference kernel of the fused elementwise op.

use crate::ir::broadcast::broadcast_usize;
use crate::ir::ops::kernel::EwExpr;
use crate::ir::{OpError, OpResult};
use ndarray::{ArrayD, IxDyn, Zip};

/// Evaluates `expr` over inputs broadcast to their common shape.
pub fn eval(expr: &EwExpr, inputs: &[ArrayD<f32>]) -> OpResult<ArrayD<f32>> {
    let shapes: Vec<&[usize]> = inputs.iter().map(|a| a.shape()).collect();
    let shape = broadcast_usize(&shapes)?;
    go(expr, inputs, &shape)
}

fn go(expr: &EwExpr, inputs: &[ArrayD<f32>], shape: &[usize]) -> OpResult<ArrayD<f32>> {
    match expr {
        EwExpr::Input(i) => {
            let a = inputs
                .get(*i)
                .ok_or_else(|| OpError(format!("elementwise expression reads missing input {i}")))?;
            let view = a
                .broadcast(IxDyn(shape))
                .ok_or_else(|| OpError(format!("input {i} of shape {:?} does not broadcast to {shape:?}", a.shape())))?;
            Ok(view.to_owned())
        }
        EwExpr::Unary(f, a) => {
            let mut x = go(a, inputs, shape)?;
            let f = *f;
            x.mapv_inplace(|v| f.apply(v));
            Ok(x)
        }
        EwExpr::Binary(op, a, b) => {
            let mut x = go(a, inputs, shape)?;
            let y = go(b, inputs, shape)?;
            let op = *op;
            Zip::from(&mut x).and(&y).for_each(|p, &q| *p = op.apply(*p, q));
            Ok(x)
        }
    }
}
