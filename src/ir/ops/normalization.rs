//! The normalization op family: BatchNormalization (inference form), LayerNormalization,
//! InstanceNormalization and LRN.

use super::linalg::{f32_of, into_dtype};
use super::OpSpec;
use crate::ir::broadcast::{broadcast_shapes, normalize_axis};
use crate::ir::dim::fmt_shape;
use crate::ir::{optional, required, DType, Dim, Fact, NodeCtx, Op, OpError, OpResult, Tensor};
use crate::op_ensure;
use crate::reference::linalg::{contiguous, standard};
use crate::reference::normalization as kernels;
use ndarray::{ArrayD, IxDyn};
use std::any::Any;

pub const OPS: &[OpSpec] = &[
    OpSpec::onnx("BatchNormalization", parse_batch_norm),
    OpSpec::onnx("InstanceNormalization", parse_instance_norm),
    OpSpec::onnx("LRN", parse_lrn),
    OpSpec::onnx("LayerNormalization", parse_layer_norm),
];

/// Checks that a per-channel parameter is a float vector of `c` values.
fn check_channel_param(op: &str, name: &str, p: &Fact, c: &Dim) -> OpResult<()> {
    op_ensure!(p.dtype().is_float(), "{op}: '{name}' must be floating point, found {}", p.dtype());
    op_ensure!(
        p.rank() == 1 && (p.shape()[0] == *c || !p.shape()[0].is_known() || !c.is_known()),
        "{op}: '{name}' must have shape [{c}] (one value per channel), found {}",
        fmt_shape(p.shape())
    );
    Ok(())
}

/// Contiguous f32 values of a tensor.
fn values(t: &Tensor) -> Vec<f32> {
    let a = f32_of(t);
    let s = standard(&a);
    contiguous(&s).to_vec()
}

fn check_len(op: &str, name: &str, v: &[f32], want: usize) -> OpResult<()> {
    op_ensure!(v.len() == want, "{op}: '{name}' has {} values, the input has {want} channels", v.len());
    Ok(())
}

fn shaped(shape: &[usize], v: Vec<f32>, dtype: DType) -> OpResult<Tensor> {
    Ok(into_dtype(Tensor::F32(ArrayD::from_shape_vec(IxDyn(shape), v).map_err(|e| OpError(e.to_string()))?), dtype))
}

/// BatchNormalization in inference mode: normalise with the running statistics.
#[derive(Clone, Debug)]
pub struct BatchNorm {
    pub epsilon: f32,
}

impl Op for BatchNorm {
    fn op_type(&self) -> &'static str {
        "BatchNormalization"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.dtype().is_float(), "BatchNormalization needs a floating-point input, found {}", x.dtype());
        op_ensure!(x.rank() >= 2, "BatchNormalization needs an input [N, C, ...], found {}", fmt_shape(x.shape()));
        let c = &x.shape()[1];
        for (i, name) in ["scale", "B", "input_mean", "input_var"].iter().enumerate() {
            check_channel_param("BatchNormalization", name, required(inputs, i + 1, name)?, c)?;
        }
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let xs = xt.shape();
        op_ensure!(xs.len() >= 2, "BatchNormalization needs an input [N, C, ...], got {xs:?}");
        let (n, c, inner) = (xs[0], xs[1], xs[2..].iter().product::<usize>());
        let mut params = Vec::with_capacity(4);
        for (i, name) in ["scale", "B", "input_mean", "input_var"].iter().enumerate() {
            let v = values(required(inputs, i + 1, name)?);
            check_len("BatchNormalization", name, &v, c)?;
            params.push(v);
        }
        let x = f32_of(xt);
        let x_std = standard(&x);
        let y = kernels::batch_norm(
            contiguous(&x_std),
            n,
            c,
            inner,
            &params[0],
            &params[1],
            &params[2],
            &params[3],
            self.epsilon,
        );
        Ok(vec![shaped(xs, y, xt.dtype())?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// BatchNormalization, inference form only (the form every exported model uses). Opset
/// history: 1 had `consumed_inputs` (ignored) and 1/6 an `is_test` flag — training (`is_test`
/// = 0 with the running-statistics outputs) is rejected; before 9 a `spatial` attribute
/// (default 1) allowed per-activation statistics: only `spatial = 1` is supported; 9 removed
/// `spatial`; 14 added `training_mode` (must be 0); 15 let scale/B and mean/var have their own
/// float types (all computed in f32 here). Outputs beyond `Y` exist only in training mode and
/// are rejected with a clear error.
fn parse_batch_norm(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    op_ensure!(
        ctx.num_outputs <= 1,
        "BatchNormalization with {} outputs is the training form (running mean/var outputs), which is not supported; export the model in inference mode",
        ctx.num_outputs
    );
    if ctx.opset < 9 {
        let spatial = ctx.int_or("spatial", 1)?;
        op_ensure!(
            spatial == 1,
            "attribute 'spatial' = {spatial} is not supported (only per-channel statistics, spatial = 1)"
        );
    }
    if ctx.opset < 7 {
        let is_test = ctx.int_or("is_test", 0)?;
        op_ensure!(is_test == 0 || is_test == 1, "attribute 'is_test' = {is_test} must be 0 or 1");
    }
    let training = ctx.int_or("training_mode", 0)?;
    op_ensure!(
        training == 0,
        "attribute 'training_mode' = {training} is not supported (only inference, training_mode = 0)"
    );
    let epsilon = ctx.float_or("epsilon", 1e-5)?;
    Ok(Box::new(BatchNorm { epsilon }))
}

/// LayerNormalization over the trailing axes from `axis`, with optional Mean and InvStdDev
/// outputs.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    pub axis: i64,
    pub epsilon: f32,
    /// Element type of Mean and InvStdDev (`stash_type`).
    pub stash: DType,
    pub num_outputs: usize,
}

impl Op for LayerNorm {
    fn op_type(&self) -> &'static str {
        "LayerNormalization"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        let scale = required(inputs, 1, "Scale")?;
        op_ensure!(x.dtype().is_float(), "LayerNormalization needs a floating-point input, found {}", x.dtype());
        op_ensure!(x.rank() >= 1, "LayerNormalization needs an input of rank >= 1, found a scalar");
        let axis = normalize_axis(self.axis, x.rank())?;
        let normalized = &x.shape()[axis..];
        for (name, p) in [("Scale", Some(scale)), ("B", optional(inputs, 2))] {
            let Some(p) = p else { continue };
            op_ensure!(p.dtype() == x.dtype(), "LayerNormalization: '{name}' is {} but X is {}", p.dtype(), x.dtype());
            let b = broadcast_shapes(&[p.shape(), normalized]);
            op_ensure!(
                b.as_deref().ok() == Some(normalized),
                "LayerNormalization: '{name}' of shape {} does not broadcast to the normalized shape {}",
                fmt_shape(p.shape()),
                fmt_shape(normalized)
            );
        }
        let mut stat_shape = x.shape()[..axis].to_vec();
        stat_shape.resize(x.rank(), Dim::known(1));
        let mut out = vec![Fact::of_type(x.ty.clone())];
        for _ in 1..self.num_outputs {
            out.push(Fact::new(self.stash, stat_shape.clone()));
        }
        Ok(out)
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let xs = xt.shape();
        op_ensure!(!xs.is_empty(), "LayerNormalization needs an input of rank >= 1, got a scalar");
        let axis = normalize_axis(self.axis, xs.len())?;
        let normalized = &xs[axis..];
        let inner: usize = normalized.iter().product();
        let spread = |t: &Tensor, name: &str| -> OpResult<Vec<f32>> {
            let a = t.to_f32();
            let b = a.broadcast(IxDyn(normalized)).ok_or_else(|| {
                OpError(format!(
                    "LayerNormalization: '{name}' of shape {:?} does not broadcast to {normalized:?}",
                    t.shape()
                ))
            })?;
            Ok(b.iter().copied().collect())
        };
        let scale = spread(required(inputs, 1, "Scale")?, "Scale")?;
        let bias = optional(inputs, 2).map(|b| spread(b, "B")).transpose()?;
        let x = f32_of(xt);
        let x_std = standard(&x);
        let (y, mean, inv) = kernels::layer_norm(contiguous(&x_std), inner, &scale, bias.as_deref(), self.epsilon);
        let mut out = vec![shaped(xs, y, xt.dtype())?];
        let mut stat_shape = xs[..axis].to_vec();
        stat_shape.resize(xs.len(), 1);
        for v in [mean, inv].into_iter().take(self.num_outputs.saturating_sub(1)) {
            out.push(shaped(&stat_shape, v, self.stash)?);
        }
        Ok(out)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// LayerNormalization (opset 17, the first version; earlier models decompose it into
/// ReduceMean/Sub/Pow/Sqrt/Div, which the other families handle). `stash_type` names the type
/// of the Mean/InvStdDev outputs and of the statistics' computation: statistics are always
/// accumulated in f64 here (at least as precise as any stash type) and stored as `stash_type`.
fn parse_layer_norm(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let stash_code = ctx.int_or("stash_type", 1)?;
    let stash = DType::from_onnx(stash_code as i32).filter(|d| d.is_float()).ok_or_else(|| {
        OpError(format!("attribute 'stash_type' = {stash_code} is not supported (expected a float type code)"))
    })?;
    op_ensure!(
        (1..=3).contains(&ctx.num_outputs),
        "LayerNormalization has 1 to 3 outputs, the node has {}",
        ctx.num_outputs
    );
    Ok(Box::new(LayerNorm {
        axis: ctx.int_or("axis", -1)?,
        epsilon: ctx.float_or("epsilon", 1e-5)?,
        stash,
        num_outputs: ctx.num_outputs,
    }))
}

/// InstanceNormalization: per (batch, channel) statistics, per-channel scale and bias.
#[derive(Clone, Debug)]
pub struct InstanceNorm {
    pub epsilon: f32,
}

impl Op for InstanceNorm {
    fn op_type(&self) -> &'static str {
        "InstanceNormalization"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "input")?;
        op_ensure!(x.dtype().is_float(), "InstanceNormalization needs a floating-point input, found {}", x.dtype());
        op_ensure!(
            x.rank() >= 3,
            "InstanceNormalization needs an input [N, C, spatial...], found {}",
            fmt_shape(x.shape())
        );
        let c = &x.shape()[1];
        check_channel_param("InstanceNormalization", "scale", required(inputs, 1, "scale")?, c)?;
        check_channel_param("InstanceNormalization", "B", required(inputs, 2, "B")?, c)?;
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "input")?;
        let xs = xt.shape();
        op_ensure!(xs.len() >= 3, "InstanceNormalization needs an input [N, C, spatial...], got {xs:?}");
        let (c, inner) = (xs[1], xs[2..].iter().product::<usize>());
        let scale = values(required(inputs, 1, "scale")?);
        let bias = values(required(inputs, 2, "B")?);
        check_len("InstanceNormalization", "scale", &scale, c)?;
        check_len("InstanceNormalization", "B", &bias, c)?;
        let x = f32_of(xt);
        let x_std = standard(&x);
        let y = kernels::instance_norm(contiguous(&x_std), c, inner, &scale, &bias, self.epsilon);
        Ok(vec![shaped(xs, y, xt.dtype())?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// InstanceNormalization. Opset 1 had `consumed_inputs` (ignored); 6 removed it; semantics
/// unchanged since (22 added bfloat16).
fn parse_instance_norm(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    Ok(Box::new(InstanceNorm { epsilon: ctx.float_or("epsilon", 1e-5)? }))
}

/// Local response normalization across channels.
#[derive(Clone, Debug)]
pub struct Lrn {
    pub size: usize,
    pub alpha: f32,
    pub beta: f32,
    pub bias: f32,
}

impl Op for Lrn {
    fn op_type(&self) -> &'static str {
        "LRN"
    }

    fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
        let x = required(inputs, 0, "X")?;
        op_ensure!(x.dtype().is_float(), "LRN needs a floating-point input, found {}", x.dtype());
        op_ensure!(x.rank() >= 3, "LRN needs an input [N, C, spatial...], found {}", fmt_shape(x.shape()));
        Ok(vec![Fact::of_type(x.ty.clone())])
    }

    fn eval(&self, inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
        let xt = required(inputs, 0, "X")?;
        let xs = xt.shape();
        op_ensure!(xs.len() >= 3, "LRN needs an input [N, C, spatial...], got {xs:?}");
        let x = f32_of(xt);
        let x_std = standard(&x);
        let y = kernels::lrn(
            contiguous(&x_std),
            xs[0],
            xs[1],
            xs[2..].iter().product(),
            self.size,
            self.alpha,
            self.beta,
            self.bias,
        );
        Ok(vec![shaped(xs, y, xt.dtype())?])
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// LRN. Opset 1; 13 only added bfloat16. `size` is required and must be positive.
fn parse_lrn(ctx: &NodeCtx) -> OpResult<Box<dyn Op>> {
    let size = ctx.req_int("size")?;
    op_ensure!(size >= 1, "attribute 'size' = {size} must be >= 1");
    Ok(Box::new(Lrn {
        size: size as usize,
        alpha: ctx.float_or("alpha", 1e-4)?,
        beta: ctx.float_or("beta", 0.75)?,
        bias: ctx.float_or("bias", 1.0)?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Attr;

    fn parse_op(op: &str, opset: i64, attrs: &[(&str, Attr)], num_outputs: usize) -> OpResult<Box<dyn Op>> {
        crate::ir::ops::testutil::parse_node(op, opset, attrs, &[true; 5], num_outputs)
    }

    fn close(got: &Tensor, want: &[f64]) {
        let g = got.to_f64_vec();
        assert_eq!(g.len(), want.len());
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-4, "{g:?} vs {want:?}");
        }
    }

    fn v(x: &[f32]) -> Tensor {
        Tensor::from_f32s(&[x.len()], x.to_vec())
    }

    #[test]
    fn batch_norm_infer_eval_and_training_errors() {
        let op = parse_op("BatchNormalization", 15, &[("epsilon", Attr::Float(0.0))], 1).unwrap();
        let x = Fact::new(DType::F32, vec![Dim::sym("N"), Dim::known(2), Dim::sym("H")]);
        let p = Fact::new(DType::F32, vec![Dim::known(2)]);
        let out = op.infer(&[Some(&x), Some(&p), Some(&p), Some(&p), Some(&p)]).unwrap();
        assert_eq!(out[0].ty, x.ty);
        let bad = Fact::new(DType::F32, vec![Dim::known(3)]);
        assert!(op.infer(&[Some(&x), Some(&bad), Some(&p), Some(&p), Some(&p)]).unwrap_err().0.contains("'scale'"));
        let xt = Tensor::from_f32s(&[1, 2, 2], vec![1., 2., 3., 4.]);
        let y = op
            .eval(&[Some(&xt), Some(&v(&[2., 1.])), Some(&v(&[1., 0.])), Some(&v(&[1., 0.])), Some(&v(&[4., 1.]))])
            .unwrap();
        close(&y[0], &[1., 2., 3., 4.]);
        assert!(parse_op("BatchNormalization", 15, &[], 3).unwrap_err().0.contains("training"));
        assert!(parse_op("BatchNormalization", 15, &[("training_mode", Attr::Int(1))], 1)
            .unwrap_err()
            .0
            .contains("training_mode"));
        assert!(parse_op("BatchNormalization", 7, &[("spatial", Attr::Int(0))], 1).unwrap_err().0.contains("spatial"));
        assert!(parse_op("BatchNormalization", 7, &[("spatial", Attr::Int(1))], 1).is_ok());
    }

    fn xi() -> Tensor {
        Tensor::from_f32s(&[2, 2, 3], (0..12).map(|v| (v as f32).powf(1.5)).collect())
    }

    #[test]
    fn layer_norm_outputs_match_onnxruntime() {
        let op = parse_op("LayerNormalization", 17, &[], 3).unwrap();
        let x = Fact::new(DType::F32, vec![Dim::sym("B"), Dim::sym("S"), Dim::known(3)]);
        let s = Fact::new(DType::F32, vec![Dim::known(3)]);
        let out = op.infer(&[Some(&x), Some(&s), None]).unwrap();
        assert_eq!(out[1].shape(), &[Dim::sym("B"), Dim::sym("S"), Dim::known(1)]);
        assert!(op.infer(&[Some(&x), Some(&Fact::new(DType::F32, vec![Dim::known(4)])), None]).is_err());
        let y = op.eval(&[Some(&xi()), Some(&v(&[1., 2., 3.])), None]).unwrap();
        close(
            &y[0],
            &[
                -1.0896974,
                -0.47159564,
                3.9764853,
                -1.1982690,
                -0.10267151,
                3.7488132,
                -1.2098749,
                -0.05843445,
                3.7172737,
                -1.2144011,
                -0.04086361,
                3.7044973,
            ],
        );
        close(&y[1], &[1.2761424, 8.125498, 18.614872, 31.701883]);
        close(&y[2], &[0.8538995, 0.40905696, 0.30880436, 0.2582797]);
        assert_eq!(y[1].shape(), &[2, 2, 1]);
    }

    #[test]
    fn instance_norm_and_lrn_match_onnxruntime() {
        let op = parse_op("InstanceNormalization", 6, &[("epsilon", Attr::Float(1e-3))], 1).unwrap();
        let y = op.eval(&[Some(&xi()), Some(&v(&[1., 2.])), Some(&v(&[0., 1.]))]).unwrap();
        close(
            &y[0],
            &[
                -1.0893043,
                -0.23571283,
                1.3250171,
                -1.3963385,
                0.8973379,
                3.4990025,
                -1.2098169,
                -0.029215336,
                1.2390332,
                -1.4287214,
                0.95913696,
                3.4695835,
            ],
        );
        let lrn =
            parse_op("LRN", 13, &[("size", Attr::Int(3)), ("alpha", Attr::Float(0.5)), ("bias", Attr::Float(2.0))], 1)
                .unwrap();
        let x = Tensor::from_f32s(&[1, 4, 2, 1], (0..8).map(|v| v as f32).collect());
        let y = lrn.eval(&[Some(&x)]).unwrap();
        close(&y[0], &[0.0, 0.37739524, 0.56987679, 0.6407096, 0.64757746, 0.62992775, 1.0165523, 0.9502494]);
        assert!(parse_op("LRN", 13, &[], 1).unwrap_err().0.contains("'size'"));
    }
}
