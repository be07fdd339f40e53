//! Row normalisations: the optimiser's `LayerNorm`, ONNX `LayerNormalization` (with its optional
//! Mean and InvStdDev outputs), and ONNX `Softmax`, `LogSoftmax` and `Hardmax` (opset < 13: the
//! input coerced to a matrix at `axis`; 13+: the single `axis`).
//!
//! Both templates (`layernorm.cu.hbs`, `softmax.cu.hbs`) reduce rows in fp32 with warp shuffles:
//! - rows of at most 1024 known elements: the fewest lanes of a warp (several rows to a warp),
//!   each holding 4 vectors of the row in registers;
//! - longer rows up to 64K elements: one block per row (up to 1024 threads), held in registers;
//! - anything else (unknown or huge rows, misaligned buffers): one block per row reading the row
//!   from memory on every pass;
//! - softmax over a non-innermost axis (opset 13+): one thread per (outer, inner) column, the
//!   reads coalesced across threads.
//!
//! Semantics follow the reference: layernorm uses the population variance, two-pass in fp32
//! (`(x - mean) * (1 / sqrt(var + eps)) * scale + bias`); softmax subtracts the row maximum
//! (NaN skipped by the maximum, then propagated by the sum); hardmax marks the first maximum,
//! NaN never winning unless it is the row's first element.

use super::act::float_lit;
use super::elementwise::{broadcast_runs, offset_expr};
use super::{require_float, LowerSpec};
use crate::ir::broadcast::normalize_axis;
use crate::ir::dim::product;
use crate::ir::ops::hardmax::Hardmax;
use crate::ir::ops::kernel::LayerNorm as KernelLayerNorm;
use crate::ir::ops::normalization::LayerNorm as OnnxLayerNorm;
use crate::ir::ops::softmax::Softmax;
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult, TensorId};
use serde_json::{json, Map, Value as Json};

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<KernelLayerNorm>("LayerNorm", lower_kernel_layer_norm),
    LowerSpec::of::<OnnxLayerNorm>("LayerNormalization", lower_onnx_layer_norm),
    LowerSpec::of::<Softmax>("Softmax", lower_softmax),
    LowerSpec::of::<Softmax>("LogSoftmax", lower_softmax),
    LowerSpec::of::<Hardmax>("Hardmax", lower_hardmax),
];

/// How a row kernel is laid out: `threads` per row (up to a warp: 256 / threads rows per block,
/// several rows to a warp when fewer than 32; more: one block per row), `vec` elements per access
/// and `items` vectors per thread held in registers (0: streamed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RowPlan {
    threads: i64,
    vec: i64,
    items: i64,
}

/// Vectors each thread holds: loads in flight per thread. On the H200 a warp per row holding 4
/// vectors (K = 1024) moved 3.84 TB/s, while the block plans that spread long rows one vector per
/// thread over up to 1024 threads reached 2.9–3.3 TB/s at K = 2048..8192 (BENCHMARKS.md, rowwise
/// sweep of 2026-12-05 03:37). With 4 vectors a thread for every row length, both ops moved
/// 94–105% of the copy rate at every K from 32 to 16384 on an H100 (sweep of 2026-12-06 08:21);
/// 8 vectors a thread for K = 8192 and 16384 measured the same within 3% in that run.
const ROW_ITEMS: i64 = 4;

impl RowPlan {
    /// The plan for rows of `cols` elements of `dt` on a target with `warp`-thread warps:
    /// accesses of up to 16 bytes (8 halfs, 4 floats), each thread holding [`ROW_ITEMS`] of them
    /// where the row allows. A row of at most 1024 elements gets the fewest lanes (a power of
    /// two, at most a warp, at least two so that each access covers a 32-byte sector) that hold
    /// it that way, so a 128-element fp16 row takes 4 lanes and a warp computes eight rows;
    /// longer rows a block of such threads.
    fn for_cols(cols: &Dim, dt: DType, warp: i64) -> RowPlan {
        let Some(k) = cols.as_known().filter(|&k| k > 0) else {
            return RowPlan { threads: 1024, vec: 1, items: 0 };
        };
        let widest = (16 / dt.size_bytes().max(1)) as i64;
        let vec = [8, 4, 2].into_iter().find(|&v| v <= widest && k % v == 0).unwrap_or(1);
        let vectors = k / vec;
        let div_ceil = |a: i64, b: i64| (a + b - 1) / b;
        if k <= 1024 {
            let fewest = (div_ceil(vectors, ROW_ITEMS) as u64).next_power_of_two() as i64;
            let threads = fewest.max(vectors.min(2)).min(warp);
            return RowPlan { threads, vec, items: div_ceil(vectors, threads) };
        }
        let threads = (div_ceil(div_ceil(vectors, ROW_ITEMS), warp) * warp).clamp(2 * warp, 1024);
        let items = div_ceil(vectors, threads);
        if items <= 8 {
            RowPlan { threads, vec, items }
        } else {
            RowPlan { threads: 1024, vec: 1, items: 0 }
        }
    }

    fn fields(self, c: &mut Map<String, Json>) {
        c.insert("threads".into(), json!(self.threads));
        c.insert("vec".into(), json!(self.vec));
        c.insert("items".into(), json!(self.items));
        c.insert("cached".into(), json!(self.items > 0));
    }
}

/// A per-column parameter (scale or bias) broadcast to the normalised shape `inner`: its
/// element offset for column `j`, and whether it is `j` itself (contiguous, vector loads).
fn param_fields(cx: &LowerCtx, inner: &[Dim], p: TensorId) -> LowerResult<(String, bool)> {
    let runs = broadcast_runs(inner, cx.shape(p))?;
    let off = offset_expr(cx, &runs, "j")?;
    let contig = off == "j";
    Ok((off, contig))
}

/// Emits a layernorm of x over axes `axis..` with scale, optional bias, and optional per-row
/// statistics outputs (mean, inv_std_dev).
fn emit_layer_norm(
    cx: &mut LowerCtx,
    node: &Node,
    axis: usize,
    eps: f32,
    stats: Option<(TensorId, TensorId)>,
) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    require_float(cx, x, "layer normalisation")?;
    let scale = cx.input(node, 1)?;
    let bias = cx.opt_input(node, 2)?;
    let xs = cx.shape(x).to_vec();
    let inner = xs[axis..].to_vec();
    let (rows, cols) = (product(&xs[..axis]), product(&inner));
    let y = cx.output(node, 0)?;
    let mut c = Map::new();
    c.insert("ctype".into(), json!(ctype(cx.dtype(x))));
    c.insert("rows".into(), json!(cx.expr(&rows)?));
    c.insert("cols".into(), json!(cx.expr(&cols)?));
    c.insert("eps".into(), json!(float_lit(eps)));
    RowPlan::for_cols(&cols, cx.dtype(x), cx.target.warp_size()).fields(&mut c);
    let mut args = vec![x, scale];
    let (off, contig) = param_fields(cx, &inner, scale)?;
    c.insert("scale_ctype".into(), json!(ctype(cx.dtype(scale))));
    c.insert("scale_offset".into(), json!(off));
    c.insert("scale_contig".into(), json!(contig));
    c.insert("has_bias".into(), json!(bias.is_some()));
    if let Some(b) = bias {
        let (off, contig) = param_fields(cx, &inner, b)?;
        c.insert("bias_ctype".into(), json!(ctype(cx.dtype(b))));
        c.insert("bias_offset".into(), json!(off));
        c.insert("bias_contig".into(), json!(contig));
        c.insert("bias_arg".into(), json!(args.len()));
        args.push(b);
    } else {
        c.insert("bias_contig".into(), json!(false));
    }
    c.insert("y_arg".into(), json!(args.len()));
    args.push(y);
    let mut writes = vec![args.len() - 1];
    c.insert("stats".into(), json!(stats.is_some()));
    if let Some((mean, inv)) = stats {
        c.insert("stats_ctype".into(), json!(ctype(cx.dtype(mean))));
        c.insert("mean_arg".into(), json!(args.len()));
        args.push(mean);
        c.insert("inv_arg".into(), json!(args.len()));
        args.push(inv);
        writes.extend([args.len() - 2, args.len() - 1]);
    }
    cx.emit(&node.name, "layernorm", args, writes, c, 0)
}

/// Kernel-level LayerNorm (the optimiser's fusion of the decomposed pattern and of ONNX
/// LayerNormalization without statistics outputs).
fn lower_kernel_layer_norm(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<KernelLayerNorm>() else {
        return Err(LowerError::Invalid("not a LayerNorm node".into()));
    };
    let x = cx.input(node, 0)?;
    let axis = normalize_axis(op.axis, cx.shape(x).len()).map_err(|e| LowerError::Invalid(e.0))?;
    emit_layer_norm(cx, node, axis, op.eps, None)
}

/// ONNX LayerNormalization (opset 17): normalises axes `axis..`; the optional Mean and
/// InvStdDev outputs (`stash_type`, fp32 stored as fp16 on the device) are written per row.
fn lower_onnx_layer_norm(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<OnnxLayerNorm>() else {
        return Err(LowerError::Invalid("not a LayerNormalization node".into()));
    };
    let x = cx.input(node, 0)?;
    let axis = normalize_axis(op.axis, cx.shape(x).len()).map_err(|e| LowerError::Invalid(e.0))?;
    let stats = match node.outputs.len() {
        1 => None,
        // The statistics come together: a node asking for the mean only gets a scratch tensor for
        // the inverse deviation.
        2 => {
            let mean = cx.output(node, 1)?;
            let shape = cx.shape(mean).to_vec();
            let inv = cx.temp(&format!("{}.inv_std_dev", node.name), cx.dtype(mean), shape);
            Some((mean, inv))
        }
        _ => Some((cx.output(node, 1)?, cx.output(node, 2)?)),
    };
    emit_layer_norm(cx, node, axis, op.epsilon, stats)
}

/// What a softmax-family kernel writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SoftmaxMode {
    Softmax,
    LogSoftmax,
    Hardmax,
}

fn emit_softmax(cx: &mut LowerCtx, node: &Node, axis: i64, coerce_2d: bool, mode: SoftmaxMode) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    require_float(cx, x, node.op.op_type())?;
    let xs = cx.shape(x).to_vec();
    let axis = normalize_axis(axis, xs.len()).map_err(|e| LowerError::Invalid(e.0))?;
    let (rows, cols, inner) = if coerce_2d {
        (product(&xs[..axis]), product(&xs[axis..]), Dim::known(1))
    } else {
        (product(&xs[..axis]), xs[axis].clone(), product(&xs[axis + 1..]))
    };
    let y = cx.output(node, 0)?;
    let mut c = Map::new();
    c.insert("ctype".into(), json!(ctype(cx.dtype(x))));
    c.insert("rows".into(), json!(cx.expr(&rows)?));
    c.insert("cols".into(), json!(cx.expr(&cols)?));
    c.insert("inner".into(), json!(cx.expr(&inner)?));
    c.insert("columns".into(), json!(inner != Dim::known(1)));
    c.insert("mode_softmax".into(), json!(mode == SoftmaxMode::Softmax));
    c.insert("mode_log".into(), json!(mode == SoftmaxMode::LogSoftmax));
    c.insert("mode_hardmax".into(), json!(mode == SoftmaxMode::Hardmax));
    RowPlan::for_cols(&cols, cx.dtype(x), cx.target.warp_size()).fields(&mut c);
    cx.emit(&node.name, "softmax", vec![x, y], vec![1], c, 0)
}

/// Softmax / LogSoftmax (opset 1, 11: the input coerced to 2-D at `axis`, default 1; 13: the
/// single `axis`, default -1).
fn lower_softmax(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<Softmax>() else {
        return Err(LowerError::Invalid("not a Softmax node".into()));
    };
    let mode = if op.log { SoftmaxMode::LogSoftmax } else { SoftmaxMode::Softmax };
    emit_softmax(cx, node, op.axis, op.coerce_2d, mode)
}

/// Hardmax (opset 1, 11: coerced to 2-D at `axis`; 13: the single `axis`).
fn lower_hardmax(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<Hardmax>() else {
        return Err(LowerError::Invalid("not a Hardmax node".into()));
    };
    emit_softmax(cx, node, op.axis, op.coerce_2d, SoftmaxMode::Hardmax)
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testkit::{lower, render, Builder};
    use super::*;
    use crate::ir::ops::testutil::parse_node as parse;
    use crate::ir::{Attr, Tensor};

    #[test]
    fn row_plans() {
        assert_eq!(RowPlan::for_cols(&Dim::known(768), DType::F16, 32), RowPlan { threads: 32, vec: 8, items: 3 });
        assert_eq!(RowPlan::for_cols(&Dim::known(1000), DType::F16, 32), RowPlan { threads: 32, vec: 8, items: 4 });
        assert_eq!(RowPlan::for_cols(&Dim::known(7), DType::F16, 32), RowPlan { threads: 2, vec: 1, items: 4 });
        // Short rows: the fewest lanes holding 4 vectors each (at least two), several rows to a warp.
        assert_eq!(RowPlan::for_cols(&Dim::known(128), DType::F16, 32), RowPlan { threads: 4, vec: 8, items: 4 });
        assert_eq!(RowPlan::for_cols(&Dim::known(256), DType::F16, 32), RowPlan { threads: 8, vec: 8, items: 4 });
        assert_eq!(RowPlan::for_cols(&Dim::known(32), DType::F16, 32), RowPlan { threads: 2, vec: 8, items: 2 });
        assert_eq!(RowPlan::for_cols(&Dim::known(8), DType::F16, 32), RowPlan { threads: 1, vec: 8, items: 1 });
        // Long rows: a block whose threads hold 4 vectors each.
        assert_eq!(RowPlan::for_cols(&Dim::known(2048), DType::F16, 32), RowPlan { threads: 64, vec: 8, items: 4 });
        assert_eq!(RowPlan::for_cols(&Dim::known(16384), DType::F16, 32), RowPlan { threads: 512, vec: 8, items: 4 });
        assert_eq!(RowPlan::for_cols(&Dim::known(4096), DType::F16, 32), RowPlan { threads: 128, vec: 8, items: 4 });
        // 50257 odd elements would need 50 per thread: streamed
        assert_eq!(RowPlan::for_cols(&Dim::known(50257), DType::F16, 32), RowPlan { threads: 1024, vec: 1, items: 0 });
        assert_eq!(RowPlan::for_cols(&Dim::known(50000), DType::F16, 32), RowPlan { threads: 1024, vec: 8, items: 7 });
        assert_eq!(RowPlan::for_cols(&Dim::sym("N"), DType::F16, 32), RowPlan { threads: 1024, vec: 1, items: 0 });
        // fp32 rows: 16-byte accesses are 4 floats.
        assert_eq!(RowPlan::for_cols(&Dim::known(768), DType::F32, 32), RowPlan { threads: 32, vec: 4, items: 6 });
        assert_eq!(RowPlan::for_cols(&Dim::known(1000), DType::F32, 32), RowPlan { threads: 32, vec: 4, items: 8 });
        assert_eq!(RowPlan::for_cols(&Dim::known(4096), DType::F32, 32), RowPlan { threads: 256, vec: 4, items: 4 });
    }

    #[test]
    fn layer_norms_and_softmaxes() {
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(128), Dim::known(768)]);
        let s = b.konst("s", Tensor::from_f32s(&[768], vec![1.0; 768]));
        let bias = b.konst("b", Tensor::from_f32s(&[768], vec![0.0; 768]));
        b.node(Box::new(KernelLayerNorm { axis: -1, eps: 1e-5 }), &[Some(x), Some(s), Some(bias)]);
        let ln = parse("LayerNormalization", 17, &[("axis", Attr::Int(1))], &[true, true, false], 3).unwrap();
        let s2 = b.konst("s2", Tensor::from_f32s(&[128, 1], vec![1.0; 128]));
        b.node(ln, &[Some(x), Some(s2), None]);
        b.node(parse("Softmax", 13, &[], &[true], 1).unwrap(), &[Some(x)]);
        b.node(parse("LogSoftmax", 11, &[("axis", Attr::Int(1))], &[true], 1).unwrap(), &[Some(x)]);
        b.node(parse("Softmax", 13, &[("axis", Attr::Int(1))], &[true], 1).unwrap(), &[Some(x)]);
        b.node(parse("Hardmax", 13, &[], &[true], 1).unwrap(), &[Some(x)]);
        let w = b.input("w", DType::F16, vec![Dim::known(3), Dim::known(50000)]);
        b.node(parse("Softmax", 13, &[], &[true], 1).unwrap(), &[Some(w)]);
        b.node(parse("Hardmax", 11, &[("axis", Attr::Int(0))], &[true], 1).unwrap(), &[Some(w)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = &p.kernels[0].context;
        assert_eq!((c["threads"].as_i64(), c["vec"].as_i64(), c["items"].as_i64()), (Some(32), Some(8), Some(3)));
        assert_eq!(c["scale_contig"], json!(true));
        assert_eq!(c["rows"], json!("((int64_t)128*dims.v[0])"));
        let c = &p.kernels[1].context;
        assert_eq!(c["stats"], json!(true));
        assert_eq!(c["scale_offset"], json!("(j / 768)"));
        assert_eq!(c["has_bias"], json!(false));
        assert_eq!(p.kernels[1].args.len(), 5);
        assert_eq!(p.kernels[3].context["cols"], json!("98304"));
        assert_eq!(p.kernels[4].context["columns"], json!(true));
        assert_eq!(p.kernels[4].context["inner"], json!("768"));
        assert_eq!(p.kernels[6].context["cached"], json!(true));
        assert_eq!(p.kernels[7].context["cached"], json!(false));
        render(&p, "norm");
    }

    /// fp32 precision: layer norms and softmaxes keep fp32 rows, read 4 floats per access.
    #[test]
    fn fp32_rows() {
        use super::super::elementwise::testkit::lower_at;
        use crate::lower::Precision;
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(128), Dim::known(768)]);
        let s = b.konst("s", Tensor::from_f32s(&[768], vec![1.0; 768]));
        let bias = b.konst("b", Tensor::from_f32s(&[768], vec![0.0; 768]));
        b.node(Box::new(KernelLayerNorm { axis: -1, eps: 1e-5 }), &[Some(x), Some(s), Some(bias)]);
        b.node(parse("Softmax", 13, &[], &[true], 1).unwrap(), &[Some(x)]);
        b.node(parse("LogSoftmax", 11, &[("axis", Attr::Int(1))], &[true], 1).unwrap(), &[Some(x)]);
        let logits = b.input("logits", DType::F32, vec![Dim::known(1), Dim::known(1000)]);
        b.node(parse("Softmax", 13, &[], &[true], 1).unwrap(), &[Some(logits)]);
        let p = lower_at(&b.g, OPS, Precision::Fp32).unwrap();
        assert!(p.kernels.iter().all(|k| k.context["ctype"] == json!("float")));
        let c = &p.kernels[0].context;
        assert_eq!((c["threads"].as_i64(), c["vec"].as_i64(), c["items"].as_i64()), (Some(32), Some(4), Some(6)));
        assert_eq!((c["scale_ctype"].as_str(), c["bias_ctype"].as_str()), (Some("float"), Some("float")));
        let c = &p.kernels[3].context;
        assert_eq!((c["threads"].as_i64(), c["vec"].as_i64(), c["items"].as_i64()), (Some(32), Some(4), Some(8)));
        render(&p, "norm_fp32");
    }
}
