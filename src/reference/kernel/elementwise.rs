//! Reference kernel of the fused elementwise op.

use crate::ir::broadcast::broadcast_usize;
use crate::ir::ops::kernel::{BinOp, EwExpr};
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
                let y = input(inputs, i)?;
                if !apply_contiguous(op, &mut x, y, shape) {
                    let y = broadcast(y, i, shape)?;
                    Zip::from(&mut x).and(&y).for_each(|p, &q| *p = op.apply(*p, q));
                }
            } else {
                let y = go(b, inputs, shape)?;
                Zip::from(&mut x).and(&y).for_each(|p, &q| *p = op.apply(*p, q));
            }
            Ok(x)
        }
    }
}

/// `x = x op y` over contiguous memory when `y` broadcasts in one of the two shapes constant
/// folding meets on weights: a per-row value repeated over trailing axes (a `[K,1,1,1]` scale
/// against `[K,C,R,S]` conv weights) or a block repeated over leading axes (a `[C]` bias against
/// `[N,H,W,C]`, a scalar). `Zip` walks such broadcasts with an inner loop as short as the kernel
/// width, which made BN folding the optimiser's hot spot. Returns false (nothing done) for other
/// layouts; `x` must already have the output `shape`.
fn apply_contiguous(op: BinOp, x: &mut ArrayD<f32>, y: &ArrayD<f32>, shape: &[usize]) -> bool {
    let (Some(xs), Some(ys)) = (x.as_slice_mut(), y.as_slice()) else {
        return false;
    };
    if xs.is_empty() || ys.is_empty() || y.ndim() > shape.len() {
        return false;
    }
    let mut yp = vec![1usize; shape.len() - y.ndim()];
    yp.extend_from_slice(y.shape());
    let ones = |d: &[usize]| d.iter().all(|&v| v == 1);
    // Leading axes broadcast, trailing axes equal: y is one block repeated.
    if (0..=shape.len()).any(|k| ones(&yp[..k]) && yp[k..] == shape[k..]) {
        for chunk in xs.chunks_mut(ys.len()) {
            for (p, &q) in chunk.iter_mut().zip(ys) {
                *p = op.apply(*p, q);
            }
        }
        return true;
    }
    // Leading axes equal, trailing axes broadcast: each y value covers a run of x.
    if let Some(m) = (0..=shape.len()).find(|&m| yp[..m] == shape[..m] && ones(&yp[m..])) {
        let run: usize = shape[m..].iter().product();
        if run == 0 {
            return false;
        }
        for (chunk, &q) in xs.chunks_mut(run).zip(ys) {
            for p in chunk {
                *p = op.apply(*p, q);
            }
        }
        return true;
    }
    false
}

fn input(inputs: &[ArrayD<f32>], i: usize) -> OpResult<&ArrayD<f32>> {
    inputs.get(i).ok_or_else(|| OpError(format!("elementwise expression reads missing input {i}")))
}

fn broadcast<'a>(a: &'a ArrayD<f32>, i: usize, shape: &[usize]) -> OpResult<ndarray::ArrayViewD<'a, f32>> {
    a.broadcast(IxDyn(shape))
        .ok_or_else(|| OpError(format!("input {i} of shape {:?} does not broadcast to {shape:?}", a.shape())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::kernel::{Act, BinOp};
    use ndarray::{arr2, Dimension};

    fn input(i: usize) -> Box<EwExpr> {
        Box::new(EwExpr::Input(i))
    }

    #[test]
    fn broadcasts_both_operands() {
        // [3,1] - [1,2] -> [3,2]
        let a = arr2(&[[1.0f32], [2.0], [3.0]]).into_dyn();
        let b = arr2(&[[10.0f32, 20.0]]).into_dyn();
        let e = EwExpr::Binary(BinOp::Sub, input(0), input(1));
        let out = eval(&e, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(out, arr2(&[[-9.0f32, -19.0], [-8.0, -18.0], [-7.0, -17.0]]).into_dyn());
        // The broadcast operand first, a nested expression second.
        let e = EwExpr::Binary(BinOp::Mul, input(1), Box::new(EwExpr::Unary(Act::Relu, input(0))));
        let out = eval(&e, &[a, b]).unwrap();
        assert_eq!(out, arr2(&[[10.0f32, 20.0], [20.0, 40.0], [30.0, 60.0]]).into_dyn());
    }

    /// The contiguous fast paths agree with plain broadcasting: per-row values over trailing
    /// axes, a block over leading axes, a scalar, and a layout neither covers (`Zip` fallback).
    #[test]
    fn contiguous_broadcasts_match_zip() {
        let x = ArrayD::from_shape_fn(IxDyn(&[2, 3, 2]), |i| (i[0] * 6 + i[1] * 2 + i[2]) as f32 - 5.0);
        for y_shape in [vec![2, 1, 1], vec![3, 2], vec![2], vec![], vec![2, 3, 2], vec![1, 3, 1], vec![2, 1, 2]] {
            let y = ArrayD::from_shape_fn(IxDyn(&y_shape), |i| 1.0 + i.slice().iter().sum::<usize>() as f32);
            for op in [BinOp::Sub, BinOp::Div] {
                let e = EwExpr::Binary(op, input(0), input(1));
                let got = eval(&e, &[x.clone(), y.clone()]).unwrap();
                let yb = y.broadcast(IxDyn(x.shape())).unwrap();
                let mut want = x.clone();
                Zip::from(&mut want).and(&yb).for_each(|p, &q| *p = op.apply(*p, q));
                assert_eq!(got, want, "{op:?} with y {y_shape:?}");
            }
        }
    }

    #[test]
    fn incompatible_shapes_are_an_error() {
        let a = ArrayD::<f32>::zeros(IxDyn(&[2, 3]));
        let b = ArrayD::<f32>::zeros(IxDyn(&[4]));
        let e = EwExpr::Binary(BinOp::Add, input(0), input(1));
        assert!(eval(&e, &[a.clone(), b]).is_err());
        assert!(eval(&EwExpr::Unary(Act::Relu, input(3)), &[a]).is_err());
    }
}
