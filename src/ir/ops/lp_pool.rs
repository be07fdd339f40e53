//! The lp_pool op family: LpPool (p-norm over sliding windows, 1 to 3 spatial dims) and
//! GlobalLpPool (p-norm over all spatial dims). Window geometry is shared with Conv and the
//! other pools (`conv::Window`).

use super::conv::Window;
use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{required, Dim, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use crate::reference::lp_pool as kernels;
use crate::{op_bail, op_ensure};
use ndarray::{ArrayD, IxDyn};
use std::any::Any;

pub const OPS: &[OpSpec] = &[OpSpec::onnx("GlobalLpPool", parse_global_lp_pool), OpSpec::onnx("LpPool", parse_lp_pool)];

fn check_input(op: &str, x: &Fact, spatial: Option<usize>) -> OpResult<()> {
    op_ensure!(x.dtype().is_float(), "{op} needs a floating-point input, found {}", x.dtype());
    match spatial {
        Some(n) => op_ensure!(
            x.rank() == n + 2,
            "{op}: kernel_shape has {n} dims, so the input must be [N, C, {n} spatial dims], found {}",
            fmt_shape(x.shape())
        ),
        None => op_ensure!(x.rank() >= 3, "{op} needs an input [N, C, spatial...], found {}", fmt_shape(x.shape())),
    }
    Ok(())
}

/// The input's values, contiguous, as f32.
fn f32_data(t: &Tensor) -> Vec<f32> {
    t.to_f32().iter().copied().collect()
}

fn output(values: Vec<f32>, shape: &[usize], dtype: crate::ir::DType) -> OpResult<Tensor> {
    let y = ArrayD::from_shape_vec(IxDyn(shape), values).map_err(|e| OpError(format!("internal shape error: {e}")))?;
    Ok(Tensor::F32(y).cast(dtype))
}

/// Reads `p`: a FLOAT in opset 1, an INT from opset 2 on. It must be at least 1 (ONNX Runtime
/// returns infinities for p = 0; a norm needs p >= 1).
fn parse_p(ctx: &NodeCtx) -> OpResult<f64> {
    let p = if ctx.opset < 2 { ctx.float_or("p", 2.0)? as f64 } else { ctx.int_or("p", 2)? as f64 };
    if p.is_nan() || p < 1.0 {
        op_bail!("attribute 'p' = {p} must be at least 1");
    }
    Ok(p)
}

// ---------------------------------------------------------------------------------------------
// LpPool

#[derive(Clone, Debug)]
pub struct LpPool {
    pub p: f64,
    pub window: Window,
    pub kernel: Vec<usize>,
}

impl Op for LpPool {
    fn op_type(&self) -> &'static str {
        "LpPool"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        check_input("LpPool", x, Some(self.kernel.len()))?;
        let mut shape = x.shape()[..2].to_vec();
        shape.extend(self.window.out_dims(&x.shape()[2..], &self.kernel)?);
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        check_input("LpPool", &Fact::new(x.dtype(), crate::ir::dim::dims_of(x.shape())), Some(self.kernel.len()))?;
        let xs = x.shape();
        let g = self.window.resolve(&xs[2..], &self.kernel)?;
        let y = kernels::lp_pool(&f32_data(x), xs[0] * xs[1], &g, self.p);
        let mut shape = xs[..2].to_vec();
        shape.extend_from_slice(&g.output[3 - (xs.len() - 2)..]);
        Ok(vec![output(y, &shape, x.dtype())?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// LpPool: `(sum |x|^p)^(1/p)` over each window. Opset history: 1 (kernel_shape, strides, pads,
/// auto_pad; `p` a FLOAT); 2 made `p` an INT (default 2); 11 fixed the auto_pad/pads output-size
/// rules (implemented: SAME_* gives `ceil(in / stride)`); 18 added `dilations` and `ceil_mode`
/// (read at every opset: older nodes simply do not carry them); 22 added bfloat16.
fn parse_lp_pool(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let mut window = Window::parse(ctx)?;
    window.ceil_mode = ctx.flag("ceil_mode", false)?;
    let kernel = window.kernel.clone().ok_or_else(|| OpError("required attribute 'kernel_shape' is missing".into()))?;
    op_ensure!((1..=3).contains(&kernel.len()), "attribute 'kernel_shape' = {kernel:?} must have 1 to 3 dims");
    Ok(Box::new(LpPool { p: parse_p(ctx)?, window, kernel }))
}

// ---------------------------------------------------------------------------------------------
// GlobalLpPool

#[derive(Clone, Debug)]
pub struct GlobalLpPool {
    pub p: f64,
}

impl Op for GlobalLpPool {
    fn op_type(&self) -> &'static str {
        "GlobalLpPool"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        check_input("GlobalLpPool", x, None)?;
        let mut shape = x.shape()[..2].to_vec();
        shape.resize(x.rank(), Dim::known(1));
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "X")?;
        check_input("GlobalLpPool", &Fact::new(x.dtype(), crate::ir::dim::dims_of(x.shape())), None)?;
        let xs = x.shape();
        let len: usize = xs[2..].iter().product();
        let y = kernels::global_lp_pool(&f32_data(x), xs[0] * xs[1], len, self.p);
        let mut shape = xs[..2].to_vec();
        shape.resize(xs.len(), 1);
        Ok(vec![output(y, &shape, x.dtype())?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// GlobalLpPool: the p-norm over all spatial dims, one value per (batch, channel). Opset
/// history: 1 (`p` a FLOAT, default 2.0); 2 made `p` an INT (default 2); 22 added bfloat16.
fn parse_global_lp_pool(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(GlobalLpPool { p: parse_p(ctx)? }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attr, DType};

    fn parse(op: &str, opset: i64, attrs: &[(&str, Attr)]) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &[true], 1)
    }

    fn close(t: &Tensor, want: &[f64]) {
        let got = t.to_f64_vec();
        assert_eq!(got.len(), want.len(), "{got:?}");
        assert!(got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-4), "got {got:?}, want {want:?}");
    }

    #[test]
    fn lp_pool_matches_ort() {
        // ORT: x = [[[1,-2,3,4,-5]]].
        let x = Tensor::from_f32s(&[1, 1, 5], vec![1.0, -2.0, 3.0, 4.0, -5.0]);
        let k2 = ("kernel_shape", Attr::Ints(vec![2]));
        let p3 = parse("LpPool", 18, &[k2.clone(), ("p", Attr::Int(3))]).unwrap();
        close(&p3.eval(&[Some(&x)]).unwrap()[0], &[2.0800838, 3.2710664, 4.4979415, 5.738794]);
        let ceil =
            parse("LpPool", 18, &[k2.clone(), ("strides", Attr::Ints(vec![2])), ("ceil_mode", Attr::Int(1))]).unwrap();
        close(&ceil.eval(&[Some(&x)]).unwrap()[0], &[2.236068, 5.0, 5.0]);
        let dil = parse("LpPool", 18, &[k2.clone(), ("dilations", Attr::Ints(vec![2]))]).unwrap();
        close(&dil.eval(&[Some(&x)]).unwrap()[0], &[3.1622777, 4.472136, 5.8309517]);
        let same = parse("LpPool", 11, &[k2.clone(), ("auto_pad", Attr::String("SAME_UPPER".into()))]).unwrap();
        close(&same.eval(&[Some(&x)]).unwrap()[0], &[2.236068, 3.6055512, 5.0, 6.4031243, 5.0]);
        let h = p3.eval(&[Some(&x.cast(DType::F16))]).unwrap().remove(0);
        assert_eq!(h.dtype(), DType::F16);
        // p is a FLOAT at opset 1 and must be >= 1.
        assert!(parse("LpPool", 1, &[k2.clone(), ("p", Attr::Float(3.0))]).is_ok());
        assert!(parse("LpPool", 11, &[k2.clone(), ("p", Attr::Float(3.0))]).unwrap_err().0.contains("INT"));
        assert!(parse("LpPool", 18, &[k2, ("p", Attr::Int(0))]).unwrap_err().0.contains("at least 1"));
        assert!(parse("LpPool", 18, &[]).unwrap_err().0.contains("kernel_shape"));
    }

    #[test]
    fn infer_keeps_symbols() {
        let op =
            parse("LpPool", 18, &[("kernel_shape", Attr::Ints(vec![3, 3])), ("pads", Attr::Ints(vec![1, 1, 1, 1]))])
                .unwrap();
        let x = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(8), Dim::sym("H"), Dim::known(10)]);
        assert_eq!(fmt_shape(op.infer(&[Some(&x)]).unwrap()[0].shape()), "[N,8,H,10]");
        let bad = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(8), Dim::known(10)]);
        assert!(op.infer(&[Some(&bad)]).unwrap_err().0.contains("2 spatial dims"));
        let g = parse("GlobalLpPool", 2, &[]).unwrap();
        assert_eq!(fmt_shape(g.infer(&[Some(&x)]).unwrap()[0].shape()), "[N,8,1,1]");
    }

    #[test]
    fn global_lp_pool_matches_ort() {
        let x = Tensor::from_f32s(&[1, 1, 5], vec![1.0, -2.0, 3.0, 4.0, -5.0]);
        close(&parse("GlobalLpPool", 2, &[("p", Attr::Int(3))]).unwrap().eval(&[Some(&x)]).unwrap()[0], &[6.0822024]);
        close(&parse("GlobalLpPool", 2, &[]).unwrap().eval(&[Some(&x)]).unwrap()[0], &[7.4161983]);
    }
}
