//! The layout op family: DepthToSpace and SpaceToDepth, which move `blocksize x blocksize`
//! blocks between the channel axis and the two spatial axes of an NCHW tensor.

use super::OpSpec;
use crate::ir::dim::fmt_shape;
use crate::ir::{required, Dim, Fact, NodeCtx, Op, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::layout as kernels;
use std::any::Any;

pub const OPS: &[OpSpec] =
    &[OpSpec::onnx("DepthToSpace", parse_depth_to_space), OpSpec::onnx("SpaceToDepth", parse_space_to_depth)];

/// Fails when a known dim is not a multiple of `by`.
fn check_divisible(op: &str, shape: &[Dim], axis: usize, by: usize, what: &str) -> OpResult<()> {
    if let Some(v) = shape[axis].as_known() {
        op_ensure!(v % by as i64 == 0, "{op}: {what} (dim {axis} of {}) must be divisible by {by}", fmt_shape(shape));
    }
    Ok(())
}

fn check_nchw(op: &str, x: &Fact) -> OpResult<()> {
    op_ensure!(x.rank() == 4, "{op} needs a 4-D input [N, C, H, W], found {}", fmt_shape(x.shape()));
    Ok(())
}

fn known(t: &Tensor) -> Fact {
    Fact::new(t.dtype(), crate::ir::dim::dims_of(t.shape()))
}

// ---------------------------------------------------------------------------------------------
// DepthToSpace

#[derive(Clone, Debug)]
pub struct DepthToSpace {
    pub blocksize: usize,
    /// Column-row-depth order (`mode = "CRD"`); otherwise depth-column-row (`"DCR"`).
    pub crd: bool,
}

impl DepthToSpace {
    fn check(&self, x: &Fact) -> OpResult<()> {
        check_nchw("DepthToSpace", x)?;
        check_divisible("DepthToSpace", x.shape(), 1, self.blocksize * self.blocksize, "the channel count")
    }
}

impl Op for DepthToSpace {
    fn op_type(&self) -> &'static str {
        "DepthToSpace"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        self.check(x)?;
        let b = Dim::from(self.blocksize);
        let s = x.shape();
        let shape = vec![s[0].clone(), s[1].div_floor(&b.mul(&b)), s[2].mul(&b), s[3].mul(&b)];
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        self.check(&known(x))?;
        Ok(vec![crate::map_tensor!(x, a => kernels::depth_to_space(a, self.blocksize, self.crd)?)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn blocksize(ctx: &NodeCtx) -> OpResult<usize> {
    let b = ctx.req_int("blocksize")?;
    op_ensure!(b >= 1, "attribute 'blocksize' = {b} must be at least 1");
    // The ops divide or multiply the channel count by b², so b² must be representable.
    op_ensure!(b.checked_mul(b).is_some(), "attribute 'blocksize' = {b} overflows: blocksize² does not fit in 64 bits");
    Ok(b as usize)
}

/// DepthToSpace: `[N, C, H, W] -> [N, C/b², H*b, W*b]`. Opset history: 1 has only the DCR
/// order; 11 added `mode` (DCR default, or CRD) — a `mode` on an older node is rejected unless
/// it says DCR; 13 added bfloat16; 28 changed only the type list (no new attribute).
fn parse_depth_to_space(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let allowed: &[&str] = if ctx.opset >= 11 { &["DCR", "CRD"] } else { &["DCR"] };
    let mode = ctx.choice("mode", "DCR", allowed)?;
    Ok(Box::new(DepthToSpace { blocksize: blocksize(ctx)?, crd: mode == "CRD" }))
}

// ---------------------------------------------------------------------------------------------
// SpaceToDepth

#[derive(Clone, Debug)]
pub struct SpaceToDepth {
    pub blocksize: usize,
    /// Channel-major output order (`mode = "CRD"`, opset 28); otherwise DCR.
    pub crd: bool,
}

impl SpaceToDepth {
    fn check(&self, x: &Fact) -> OpResult<()> {
        check_nchw("SpaceToDepth", x)?;
        check_divisible("SpaceToDepth", x.shape(), 2, self.blocksize, "the height")?;
        check_divisible("SpaceToDepth", x.shape(), 3, self.blocksize, "the width")
    }
}

impl Op for SpaceToDepth {
    fn op_type(&self) -> &'static str {
        "SpaceToDepth"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        self.check(x)?;
        let b = Dim::from(self.blocksize);
        let s = x.shape();
        let shape = vec![s[0].clone(), s[1].mul(&b.mul(&b)), s[2].div_floor(&b), s[3].div_floor(&b)];
        Ok(vec![Fact::new(x.dtype(), shape)])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let x = required(inputs, 0, "input")?;
        self.check(&known(x))?;
        Ok(vec![crate::map_tensor!(x, a => kernels::space_to_depth(a, self.blocksize, self.crd)?)])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// SpaceToDepth: `[N, C, H, W] -> [N, C*b², H/b, W/b]`, the inverse of DepthToSpace in the
/// same mode. Opset history: 1 introduced it (DCR order only); 13 added bfloat16; 28 added
/// `mode` (DCR default, or CRD) — a `mode` on an older node is rejected unless it says DCR.
fn parse_space_to_depth(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let allowed: &[&str] = if ctx.opset >= 28 { &["DCR", "CRD"] } else { &["DCR"] };
    let mode = ctx.choice("mode", "DCR", allowed)?;
    Ok(Box::new(SpaceToDepth { blocksize: blocksize(ctx)?, crd: mode == "CRD" }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Attr, DType};

    fn parse(op: &str, opset: i64, attrs: &[(&str, Attr)]) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &[true], 1)
    }

    fn iota(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_f32s(shape, (0..n).map(|v| v as f32).collect())
    }

    #[test]
    fn infer_keeps_symbols_and_checks_divisibility() {
        let op = parse("DepthToSpace", 13, &[("blocksize", Attr::Int(2))]).unwrap();
        let x = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(8), Dim::sym("H"), Dim::known(3)]);
        let out = op.infer(&[Some(&x)]).unwrap();
        assert_eq!(fmt_shape(out[0].shape()), "[N,2,2*H,6]");
        let bad = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(6), Dim::known(2), Dim::known(2)]);
        assert!(op.infer(&[Some(&bad)]).unwrap_err().0.contains("divisible by 4"));
        let s2d = parse("SpaceToDepth", 13, &[("blocksize", Attr::Int(2))]).unwrap();
        let y =
            Fact::new(DType::F16, vec![Dim::sym("N"), Dim::known(3), Dim::sym("H").mul(&Dim::known(2)), Dim::known(4)]);
        assert_eq!(fmt_shape(s2d.infer(&[Some(&y)]).unwrap()[0].shape()), "[N,12,H,2]");
        assert!(parse("DepthToSpace", 9, &[("blocksize", Attr::Int(2)), ("mode", Attr::String("CRD".into()))]).is_err());
        assert!(parse("DepthToSpace", 13, &[]).unwrap_err().0.contains("blocksize"));
    }

    #[test]
    fn values_match_ort() {
        // ORT opset 13: x = arange(16).reshape(1,4,2,2), blocksize 2.
        let x = iota(&[1, 4, 2, 2]);
        let dcr = parse("DepthToSpace", 13, &[("blocksize", Attr::Int(2))]).unwrap().eval(&[Some(&x)]).unwrap();
        assert_eq!(dcr[0].shape(), &[1, 1, 4, 4]);
        assert_eq!(dcr[0].to_f64_vec(), vec![0., 4., 1., 5., 8., 12., 9., 13., 2., 6., 3., 7., 10., 14., 11., 15.]);
        // CRD on [1,8,1,1] with b=2: channels c*4 + i*2 + j -> output (c, i, j).
        let y = iota(&[1, 8, 1, 2]);
        let crd = parse("DepthToSpace", 13, &[("blocksize", Attr::Int(2)), ("mode", Attr::String("CRD".into()))])
            .unwrap()
            .eval(&[Some(&y)])
            .unwrap();
        assert_eq!(crd[0].shape(), &[1, 2, 2, 4]);
        assert_eq!(crd[0].to_f64_vec(), vec![0., 2., 1., 3., 4., 6., 5., 7., 8., 10., 9., 11., 12., 14., 13., 15.]);
        let s2d = parse("SpaceToDepth", 1, &[("blocksize", Attr::Int(2))])
            .unwrap()
            .eval(&[Some(&iota(&[1, 1, 2, 4]))])
            .unwrap();
        assert_eq!(s2d[0].shape(), &[1, 4, 1, 2]);
        assert_eq!(s2d[0].to_f64_vec(), vec![0., 2., 1., 3., 4., 6., 5., 7.]);
        // Opset 28 CRD (onnx reference: transpose [0,1,3,5,2,4]) on [1,2,2,2].
        let crd =
            parse("SpaceToDepth", 28, &[("blocksize", Attr::Int(2)), ("mode", Attr::String("CRD".into()))]).unwrap();
        let y = crd.eval(&[Some(&iota(&[1, 2, 2, 2]))]).unwrap();
        assert_eq!(y[0].to_f64_vec(), vec![0., 1., 2., 3., 4., 5., 6., 7.]);
        assert!(
            parse("SpaceToDepth", 13, &[("blocksize", Attr::Int(2)), ("mode", Attr::String("CRD".into()))]).is_err()
        );
    }

    #[test]
    fn huge_blocksize_is_an_error_not_an_overflow() {
        // blocksize² overflows i64: rejected when the node is parsed.
        for op in ["DepthToSpace", "SpaceToDepth"] {
            let e = parse(op, 13, &[("blocksize", Attr::Int(i64::MAX))]).unwrap_err();
            assert!(e.0.contains("overflows"), "{}", e.0);
        }
        // blocksize² fits but the scaled spatial dims do not: a symbolic overflow dim in
        // inference, an error (not a panic) in the kernel.
        let b = 3_000_000_000;
        let d2s = parse("DepthToSpace", 13, &[("blocksize", Attr::Int(b))]).unwrap();
        let x = Fact::new(DType::F32, vec![Dim::known(1), Dim::known(0), Dim::known(i64::MAX / 2), Dim::known(1)]);
        let out = d2s.infer(&[Some(&x)]).unwrap();
        assert!(!out[0].shape()[2].is_known(), "{}", fmt_shape(out[0].shape()));
        let e = kernels::depth_to_space(
            &ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[1, 0, 1 << 40, 1])),
            b as usize,
            false,
        )
        .unwrap_err();
        assert!(e.0.contains("overflows"), "{}", e.0);
    }
}
