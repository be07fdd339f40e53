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
            let a = input(inputs, *i)?;
            if a.shape() == shape {
                return Ok(a.clone());
            }
            // `assign` walks the broadcast view with Zip's inner-loop fast path; `to_owned` on a
            // broadcast view steps a dynamic-rank index per element, which made folding per-channel
            // scales into conv weights the optimiser's bottleneck.
            let mut out = ArrayD::<f32>::zeros(IxDyn(shape));
            out.assign(&broadcast(a, *i, shape)?);
            Ok(out)
        }
        EwExpr::Unary(f, a) => {
            let mut x = go(a, inputs, shape)?;
            let f = *f;
            x.mapv_inplace(|v| f.apply(v));
            Ok(x)
        }
        EwExpr::Binary(op, a, b) => {
            let mut x = go(a, inputs, shape)?;
            let op = *op;
            // A direct input operand is read through a broadcast view, not materialised.
            if let EwExpr::Input(i) = **b {
                let y = broadcast(input(inputs, i)?, i, shape)?;
                Zip::from(&mut x).and(&y).for_each(|p, &q| *p = op.apply(*p, q));
            } else {
                let y = go(b, inputs, shape)?;
                Zip::from(&mut x).and(&y).for_each(|p, &q| *p = op.apply(*p, q));
            }
            Ok(x)
        }
    }
}

fn input(inputs: &[ArrayD<f32>], i: usize) -> OpResult<&ArrayD<f32>> {
    inputs
        .get(i)
        .ok_or_else(|| OpError(format!("elementwise expression reads missing input {i}")))
}

fn broadcast<'a>(a: &'a ArrayD<f32>, i: usize, shape: &[usize]) -> OpResult<ndarray::ArrayViewD<'a, f32>> {
    a.broadcast(IxDyn(shape))
        .ok_or_else(|| OpError(format!("input {i} of shape {:?} does not broadcast to {shape:?}", a.shape())))
}
