//! The pool op family: MaxPool, AveragePool (1-D, 2-D and 3-D spatial), GlobalAveragePool and
//! GlobalMaxPool. Window geometry is shared with Conv (`conv::Window`).

use super::conv::Window;
use super::linalg::{f32_of, into_dtype};
use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{required, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::linalg::{contiguous, standard};
use crate::reference::pool as kernels;
use ndarray::{ArrayD, IxDyn};
use std::any::Any;

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("AveragePool", parse_average_pool),
    OpSpec::onnx("GlobalAveragePool", parse_global_average_pool),
    OpSpec::onnx("GlobalMaxPool", parse_global_max_pool),
    OpSpec::onnx("MaxPool", parse_max_pool),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolKind {
    /// `column_major`: ONNX `storage_order = 1` for the Indices output.
    Max {
        indices: bool,
        column_major: bool,
    },
    Average {
        count_include_pad: bool,
    },
}

/// MaxPool or AveragePool over a sliding window.
#[derive(Clone, Debug)]
pub struct Pool {
    pub kind: PoolKind,
    pub window: Window,
    /// `kernel_shape` (required by both ops).
    pub kernel: Vec<usize>,
}

impl Pool {
    fn name(&self) -> &'static str {
        match self.kind {
            PoolKind::Max { .. } => "MaxPool",
            PoolKind::Average { .. } => "AveragePool",
        }
    }

    fn check_input(&self, dtype: DType, shape: &[Dim]) -> OpResult<()> {
        let int8 = matches!(self.kind, PoolKind::Max { .. }) && matches!(dtype, DType::I8 | DType::U8);
        op_ensure!(dtype.is_float() || int8, "{} does not support element type {dtype}", self.name());
        op_ensure!(
            (3..=5).contains(&shape.len()),
            "{} needs an input [N, C, spatial...] with 1 to 3 spatial dims, found {}",
            self.name(),
            fmt_shape(shape)
        );
        op_ensure!(
            self.kernel.len() == shape.len() - 2,
            "{}: kernel_shape {:?} does not match the {} spatial dims of the input {}",
            self.name(),
            self.kernel,
            shape.len() - 2,
            fmt_shape(shape)
        );
        Ok(())
    }
}

impl Op for Pool {
    fn op_type(&self) -> &'static str {
        self.name()
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        self.check_input(x.dtype(), x.shape())?;
        let mut shape = x.shape()[..2].to_vec();
        shape.extend(self.window.out_dims(&x.shape()[2..], &self.kernel)?);
        let mut out = vec![Fact::new(x.dtype(), shape.clone())];
        if let PoolKind::Max { indices: true, .. } = self.kind {
            out.push(Fact::new(DType::I64, shape));
        }
        Ok(out)
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let xs = xt.shape();
        self.check_input(xt.dtype(), &crate::ir::dim::dims_of(xs))?;
        let x = f32_of(xt);
        let x_std = standard(&x);
        let geom = self.window.resolve(&xs[2..], &self.kernel)?;
        let planes = xs[0] * xs[1];
        let mut shape = xs[..2].to_vec();
        shape.extend_from_slice(&geom.output[3 - (xs.len() - 2)..]);
        let wrap = |v: Vec<f32>| {
            ArrayD::from_shape_vec(IxDyn(&shape), v).map(Tensor::F32).map_err(|e| crate::ir::OpError(e.to_string()))
        };
        match self.kind {
            PoolKind::Max { indices, column_major } => {
                let (y, idx) =
                    kernels::max_pool(contiguous(&x_std), planes, &geom, indices, column_major, xs.len() - 2);
                let mut out = vec![into_dtype(wrap(y)?, xt.dtype())];
                if indices {
                    out.push(Tensor::I64(
                        ArrayD::from_shape_vec(IxDyn(&shape), idx).map_err(|e| crate::ir::OpError(e.to_string()))?,
                    ));
                }
                Ok(out)
            }
            PoolKind::Average { count_include_pad } => {
                let y = kernels::avg_pool(contiguous(&x_std), planes, &geom, count_include_pad);
                Ok(vec![into_dtype(wrap(y)?, xt.dtype())])
            }
        }
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn parse_window(ctx: &NodeCtx) -> OpResult<(Window, Vec<usize>)> {
    let mut window = Window::parse(ctx)?;
    window.ceil_mode = ctx.flag("ceil_mode", false)?;
    let kernel = window
        .kernel
        .clone()
        .ok_or_else(|| crate::ir::OpError("required attribute 'kernel_shape' is missing".into()))?;
    op_ensure!(!kernel.is_empty(), "attribute 'kernel_shape' must not be empty");
    Ok((window, kernel))
}

/// MaxPool. Opset history: 1 (kernel_shape, strides, pads, auto_pad); 8 added the optional
/// `Indices` output and `storage_order` (0 row-major, 1 column-major indices); 10 added
/// `ceil_mode` and `dilations`; 11 fixed the auto_pad/pads output-size rules (implemented:
/// SAME_* gives `ceil(in / stride)`); 12 added int8/uint8 (computed exactly through f32).
/// Older opsets simply never carry the newer attributes.
fn parse_max_pool(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let (window, kernel) = parse_window(ctx)?;
    let storage_order = ctx.int_or("storage_order", 0)?;
    op_ensure!(storage_order == 0 || storage_order == 1, "attribute 'storage_order' = {storage_order} must be 0 or 1");
    op_ensure!(ctx.num_outputs <= 2, "MaxPool has at most 2 outputs, the node has {}", ctx.num_outputs);
    let kind = PoolKind::Max { indices: ctx.num_outputs == 2, column_major: storage_order == 1 };
    Ok(Box::new(Pool { kind, window, kernel }))
}

/// AveragePool. Opset history: 1 (padding never counted); 7 added `count_include_pad`
/// (default 0); 10 added `ceil_mode`; 11 fixed the auto_pad/pads output-size rules; 19 added
/// `dilations`. With `count_include_pad` the divisor counts taps inside the padded input
/// only (not the extra taps ceil_mode adds past the end padding), as ONNX Runtime does.
fn parse_average_pool(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let (window, kernel) = parse_window(ctx)?;
    let count_include_pad = ctx.flag("count_include_pad", false)?;
    Ok(Box::new(Pool { kind: PoolKind::Average { count_include_pad }, window, kernel }))
}

/// GlobalAveragePool or GlobalMaxPool: one value per (batch, channel).
#[derive(Clone, Debug)]
pub struct GlobalPool {
    pub max: bool,
}

impl GlobalPool {
    fn name(&self) -> &'static str {
        if self.max {
            "GlobalMaxPool"
        } else {
            "GlobalAveragePool"
        }
    }
}

impl Op for GlobalPool {
    fn op_type(&self) -> &'static str {
        self.name()
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.dtype().is_float(), "{} needs a floating-point input, found {}", self.name(), x.dtype());
        op_ensure!(x.rank() >= 3, "{} needs an input [N, C, spatial...], found {}", self.name(), fmt_shape(x.shape()));
        let mut shape = x.shape()[..2].to_vec();
        shape.resize(x.rank(), Dim::known(1));
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let xs = xt.shape();
        op_ensure!(xs.len() >= 3, "{} needs an input [N, C, spatial...], got {xs:?}", self.name());
        let x = f32_of(xt);
        let x_std = standard(&x);
        let len: usize = xs[2..].iter().product();
        let y = kernels::global_pool(contiguous(&x_std), xs[0] * xs[1], len, self.max);
        let mut shape = xs[..2].to_vec();
        shape.resize(xs.len(), 1);
        let y = ArrayD::from_shape_vec(IxDyn(&shape), y).map_err(|e| crate::ir::OpError(e.to_string()))?;
        Ok(vec![into_dtype(Tensor::F32(y), xt.dtype())])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// GlobalAveragePool. Opset 1; 22 only added bfloat16. Mean accumulated in f64.
fn parse_global_average_pool(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(GlobalPool { max: false }))
}

/// GlobalMaxPool. Opset 1; 22 only added bfloat16.
fn parse_global_max_pool(_ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(GlobalPool { max: true }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;

    fn parse_op(op: &str, opset: i64, attrs: &[(&str, Attr)], num_outputs: usize) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &[true], num_outputs)
    }

    fn ints(v: &[i64]) -> Attr {
        Attr::Ints(v.to_vec())
    }

    fn grid() -> Tensor {
        Tensor::from_f32s(&[1, 1, 5, 5], (0..25).map(|v| v as f32).collect())
    }

    #[test]
    fn max_pool_ceil_mode_and_indices_match_onnxruntime() {
        let attrs = [("kernel_shape", ints(&[2, 2])), ("strides", ints(&[2, 2])), ("ceil_mode", Attr::Int(1))];
        let op = parse_op("MaxPool", 12, &attrs, 2).unwrap();
        let y = op.eval(&[Some(&grid())]).unwrap();
        assert_eq!(y[0].shape(), &[1, 1, 3, 3]);
        assert_eq!(y[0].to_f64_vec(), vec![6., 8., 9., 16., 18., 19., 21., 23., 24.]);
        assert_eq!(y[1].to_i64_vec(), vec![6, 8, 9, 16, 18, 19, 21, 23, 24]);
        let mut cm = attrs.to_vec();
        cm.push(("storage_order", Attr::Int(1)));
        let y = parse_op("MaxPool", 12, &cm, 2).unwrap().eval(&[Some(&grid())]).unwrap();
        assert_eq!(y[1].to_i64_vec(), vec![6, 16, 21, 8, 18, 23, 9, 19, 24]);
        let facts = op
            .infer(&[Some(&Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(1), Dim::known(5), Dim::known(5)]))])
            .unwrap();
        assert_eq!(facts.len(), 2);
        assert_eq!(facts[1].dtype(), DType::I64);
        assert_eq!(facts[0].shape()[2], Dim::known(3));
        // int8 pooling is exact.
        let y = op.eval(&[Some(&grid().cast(DType::I8))]).unwrap();
        assert_eq!(y[0].dtype(), DType::I8);
    }

    #[test]
    fn average_pool_divisors_match_onnxruntime() {
        let base = [
            ("kernel_shape", ints(&[3, 3])),
            ("strides", ints(&[2, 2])),
            ("pads", ints(&[1, 1, 1, 1])),
            ("ceil_mode", Attr::Int(1)),
        ];
        let mut incl = base.to_vec();
        incl.push(("count_include_pad", Attr::Int(1)));
        let y = parse_op("AveragePool", 17, &incl, 1).unwrap().eval(&[Some(&grid())]).unwrap();
        let want = [4.0 / 3.0, 3.0, 8.0 / 3.0, 7.0, 12.0, 9.0, 8.0, 13.0, 28.0 / 3.0];
        for (a, b) in y[0].to_f64_vec().iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{:?}", y[0]);
        }
        let y = parse_op("AveragePool", 17, &base, 1).unwrap().eval(&[Some(&grid())]).unwrap();
        assert_eq!(y[0].to_f64_vec(), vec![3.0, 4.5, 6.0, 10.5, 12.0, 13.5, 18.0, 19.5, 21.0]);
        let dil = [("kernel_shape", ints(&[2, 2])), ("dilations", ints(&[2, 2]))];
        let y = parse_op("AveragePool", 19, &dil, 1).unwrap().eval(&[Some(&grid())]).unwrap();
        assert_eq!(y[0].to_f64_vec(), vec![6., 7., 8., 11., 12., 13., 16., 17., 18.]);
    }

    #[test]
    fn global_pools_and_errors() {
        let op = parse_op("GlobalAveragePool", 17, &[], 1).unwrap();
        let f = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(8), Dim::sym("H"), Dim::sym("W")]);
        assert_eq!(
            op.infer(&[Some(&f)]).unwrap()[0].shape(),
            &[Dim::sym("N"), Dim::known(8), Dim::known(1), Dim::known(1)]
        );
        assert_eq!(op.eval(&[Some(&grid())]).unwrap()[0].to_f64_vec(), vec![12.0]);
        let op = parse_op("GlobalMaxPool", 17, &[], 1).unwrap();
        assert_eq!(op.eval(&[Some(&grid())]).unwrap()[0].to_f64_vec(), vec![24.0]);
        assert!(parse_op("MaxPool", 17, &[], 1).unwrap_err().0.contains("kernel_shape"));
        let op = parse_op("MaxPool", 17, &[("kernel_shape", ints(&[2]))], 1).unwrap();
        assert!(op.infer(&[Some(&f)]).unwrap_err().0.contains("kernel_shape"));
        let bad = parse_op("AveragePool", 17, &[("kernel_shape", ints(&[2, 2])), ("strides", ints(&[1]))], 1).unwrap();
        assert!(bad.infer(&[Some(&f)]).unwrap_err().0.contains("strides"));
    }
}
