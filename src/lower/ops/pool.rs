//! Pooling: the optimiser's `Pool` (2-D max/average, NCHW or NHWC) and `GlobalAvgPool`, and the
//! ONNX pools that survive optimisation (MaxPool with or without Indices, AveragePool and LpPool
//! over 1 to 3 spatial dims, GlobalAveragePool, GlobalMaxPool, GlobalLpPool).
//!
//! Two templates:
//! - `pool2d.cu.hbs`: sliding windows. NHWC: one thread per output pixel and vector of up to 8
//!   fp16 or 4 fp32 channels (16-byte loads, channels contiguous across threads). NCHW (and the
//!   ONNX layout with 1–3 spatial dims, lifted to 3-D with unit leading dims): one thread per
//!   output element.
//! - `global_pool.cu.hbs`: a whole spatial extent. NHWC: each thread sums a channel vector over
//!   a share of the pixels, a block reduces the shares in shared memory. NCHW: one warp per
//!   (batch, channel) plane with shuffle reductions.
//!
//! Semantics follow the reference executor: the kernel-level max starts from -inf and the ONNX
//! max from the lowest finite float (`src/reference/pool.rs`), both skip NaN (`v > best`); the
//! ONNX MaxPool index is the flat input index of the first maximum (row- or column-major by
//! `storage_order`, -1 when no tap is valid); the average divisor counts the taps inside the
//! input, or with `count_include_pad` those inside the padded input (never the extra taps that
//! ceil mode adds past the end padding); padded taps add nothing to an Lp norm.

use super::act::float_lit;
use super::elementwise::index_type;
use super::{require_float, LowerSpec};
use crate::ir::dim::product;
use crate::ir::ops::conv::Geom3;
use crate::ir::ops::kernel::{GlobalAvgPool, Layout, Pool as KernelPool, PoolKind as KernelPoolKind};
use crate::ir::ops::lp_pool::{GlobalLpPool, LpPool};
use crate::ir::ops::pool::{GlobalPool, Pool as OnnxPool, PoolKind as OnnxPoolKind};
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, KernelFacts, LowerCtx, LowerError, LowerResult, TensorId};
use serde_json::{json, Map, Value as Json};

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<KernelPool>("Pool", lower_kernel_pool),
    LowerSpec::of::<GlobalAvgPool>("GlobalAvgPool", lower_kernel_global),
    LowerSpec::of::<OnnxPool>("MaxPool", lower_onnx_pool),
    LowerSpec::of::<OnnxPool>("AveragePool", lower_onnx_pool),
    LowerSpec::of::<LpPool>("LpPool", lower_lp_pool),
    LowerSpec::of::<GlobalPool>("GlobalAveragePool", lower_onnx_global),
    LowerSpec::of::<GlobalPool>("GlobalMaxPool", lower_onnx_global),
    LowerSpec::of::<GlobalLpPool>("GlobalLpPool", lower_onnx_global_lp),
];

/// What a window computes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reduction {
    /// Maximum from `init` (-inf or the lowest finite float), NaN skipped.
    Max {
        init: f32,
    },
    Avg {
        count_include_pad: bool,
    },
    Lp {
        p: f64,
    },
}

impl Reduction {
    fn fields(self, c: &mut Map<String, Json>) {
        let (mode, init, cip, p) = match self {
            Reduction::Max { init } => ("max", init, false, 1.0),
            Reduction::Avg { count_include_pad } => ("avg", 0.0, count_include_pad, 1.0),
            Reduction::Lp { p } => ("lp", 0.0, false, p),
        };
        c.insert("mode_max".into(), json!(mode == "max"));
        c.insert("mode_avg".into(), json!(mode == "avg"));
        c.insert("mode_lp".into(), json!(mode == "lp"));
        c.insert("init".into(), json!(float_lit(init)));
        c.insert("count_include_pad".into(), json!(cip));
        c.insert("p".into(), json!(float_lit(p as f32)));
        c.insert("inv_p".into(), json!(float_lit((1.0 / p) as f32)));
    }
}

/// The window over 3 spatial dims (1-D and 2-D lifted with leading unit dims), all known.
struct Window3 {
    input: [i64; 3],
    output: [i64; 3],
    kernel: [i64; 3],
    strides: [i64; 3],
    dilations: [i64; 3],
    pad_begin: [i64; 3],
    pad_end: [i64; 3],
}

impl Window3 {
    fn from_geom3(g: &Geom3) -> Window3 {
        let c = |a: [usize; 3]| a.map(|v| v as i64);
        Window3 {
            input: c(g.input),
            output: c(g.output),
            kernel: c(g.kernel),
            strides: c(g.strides),
            dilations: c(g.dilations),
            pad_begin: c(g.pad_begin),
            pad_end: c(g.pad_end),
        }
    }

    fn fields(&self, c: &mut Map<String, Json>) {
        for (name, v) in [
            ("in", self.input),
            ("out", self.output),
            ("k", self.kernel),
            ("s", self.strides),
            ("d", self.dilations),
            ("pb", self.pad_begin),
            ("pe", self.pad_end),
        ] {
            c.insert(name.into(), json!(v));
        }
    }
}

/// Known spatial dims, or an unsupported error naming them.
fn known(dims: &[Dim]) -> LowerResult<Vec<i64>> {
    dims.iter()
        .map(|d| {
            d.as_known().ok_or_else(|| LowerError::Unsupported(format!("pooling over a symbolic spatial dim {d}")))
        })
        .collect()
}

/// Channel vector width of an NHWC kernel over elements of `dt`: up to 16 bytes (8 halfs or 4
/// floats) when the channels allow it.
fn channel_vec(c: &Dim, dt: DType) -> i64 {
    let widest = (16 / dt.size_bytes().max(1)) as i64;
    match c.as_known() {
        Some(c) => [8, 4, 2].into_iter().find(|&v| v <= widest && c % v == 0).unwrap_or(1),
        None => 1,
    }
}

/// Emits a sliding-window kernel. `nhwc`: x is `[N, IH, IW, C]` (2-D only); else x is
/// `[planes, spatial…]` with planes = N·C. `indices`: the ONNX MaxPool Indices output with its
/// strides over the lifted spatial dims.
#[allow(clippy::too_many_arguments)]
fn emit_window(
    cx: &mut LowerCtx,
    node: &Node,
    x: TensorId,
    out: TensorId,
    indices: Option<(TensorId, [i64; 3])>,
    nhwc: bool,
    w: &Window3,
    red: Reduction,
) -> LowerResult<()> {
    let xs = cx.shape(x).to_vec();
    let mut c = Map::new();
    c.insert("ctype".into(), json!(ctype(cx.dtype(x))));
    c.insert("nhwc".into(), json!(nhwc));
    let (batch_dim, channels) = (xs[0].clone(), xs[if nhwc { xs.len() - 1 } else { 1 }].clone());
    let vec = if nhwc { channel_vec(&channels, cx.dtype(x)) } else { 1 };
    c.insert("vec".into(), json!(vec));
    c.insert("n".into(), json!(cx.expr(&batch_dim)?));
    c.insert("c".into(), json!(cx.expr(&channels)?));
    let outputs = product(cx.shape(out));
    // Threads: one per output element (per channel vector in NHWC).
    let work = if nhwc { outputs.div_floor(&Dim::known(vec)) } else { outputs.clone() };
    c.insert("work".into(), json!(cx.expr(&work)?));
    let wide = index_type(cx, &product(&xs))? == "int64_t" || index_type(cx, &outputs)? == "int64_t";
    c.insert("idx_t".into(), json!(if wide { "int64_t" } else { "int32_t" }));
    w.fields(&mut c);
    red.fields(&mut c);
    c.insert("indices".into(), json!(indices.is_some()));
    c.insert("index_strides".into(), json!(indices.map(|(_, s)| s).unwrap_or([0; 3])));
    let mut args = vec![x, out];
    let mut writes = vec![1];
    if let Some((t, _)) = indices {
        args.push(t);
        writes.push(2);
    }
    cx.emit(&node.name, "pool2d", args, writes, c, 0)
}

/// Kernel-level 2-D pooling in NCHW or NHWC (ceil mode, pads and count_include_pad as the op says).
fn lower_kernel_pool(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<KernelPool>() else {
        return Err(LowerError::Invalid("not a Pool node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, "pooling")?;
    let out = cx.output(node, 0)?;
    let (xs, os) = (cx.shape(x).to_vec(), cx.shape(out).to_vec());
    if xs.len() != 4 || os.len() != 4 {
        return Err(LowerError::Invalid("2-D pooling needs rank-4 tensors".into()));
    }
    let nhwc = op.layout == Layout::Nhwc;
    let (ins, outs) = if nhwc { (&xs[1..3], &os[1..3]) } else { (&xs[2..4], &os[2..4]) };
    let (ih, oh) = (known(ins)?, known(outs)?);
    let g = &op.geom;
    let u = |v: usize| v as i64;
    let w = Window3 {
        input: [1, ih[0], ih[1]],
        output: [1, oh[0], oh[1]],
        kernel: [1, u(op.kernel[0]), u(op.kernel[1])],
        strides: [1, u(g.strides[0]), u(g.strides[1])],
        dilations: [1, u(g.dilations[0]), u(g.dilations[1])],
        pad_begin: [0, u(g.pads[0]), u(g.pads[1])],
        pad_end: [0, u(g.pads[2]), u(g.pads[3])],
    };
    let red = match op.kind {
        KernelPoolKind::Max => Reduction::Max { init: f32::NEG_INFINITY },
        KernelPoolKind::Avg { count_include_pad } => Reduction::Avg { count_include_pad },
    };
    emit_window(cx, node, x, out, None, nhwc, &w, red)?;
    // An NHWC fp16 max pooling without dilation may fuse into the stem convolution before it
    // (`fuse.rs`, `ops::conv::stem_pool_tile`).
    let fp16 = cx.dtype(x) == DType::F16 && cx.dtype(out) == DType::F16;
    if nhwc && fp16 && red == (Reduction::Max { init: f32::NEG_INFINITY }) && w.dilations == [1; 3] {
        let two = |a: [i64; 3]| [a[1], a[2]];
        cx.set_facts(KernelFacts::MaxPool2d {
            x_slot: 0,
            out_slot: 1,
            kernel: two(w.kernel),
            strides: two(w.strides),
            pads: two(w.pad_begin),
            out: two(w.output),
        })?;
    }
    Ok(())
}

/// The resolved window of an ONNX pool on input `x` (`[N, C, spatial…]`).
fn onnx_window(
    cx: &LowerCtx,
    x: TensorId,
    window: &crate::ir::ops::conv::Window,
    kernel: &[usize],
) -> LowerResult<(Window3, Geom3)> {
    let xs = cx.shape(x);
    if xs.len() < 3 || xs.len() > 5 {
        return Err(LowerError::Invalid(format!("pooling needs [N, C, 1 to 3 spatial dims], found rank {}", xs.len())));
    }
    let spatial: Vec<usize> = known(&xs[2..])?.into_iter().map(|v| v as usize).collect();
    let g = window.resolve(&spatial, kernel).map_err(|e| LowerError::Invalid(e.0))?;
    Ok((Window3::from_geom3(&g), g))
}

/// ONNX MaxPool (opset 1–22; Indices with `storage_order`) and AveragePool (count_include_pad,
/// ceil_mode, dilations), 1 to 3 spatial dims, in the ONNX layout.
fn lower_onnx_pool(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<OnnxPool>() else {
        return Err(LowerError::Invalid("not a MaxPool/AveragePool node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, node.op.op_type())?;
    let (w, g) = onnx_window(cx, x, &op.window, &op.kernel)?;
    let out = cx.output(node, 0)?;
    let (red, indices) = match op.kind {
        OnnxPoolKind::Max { indices, column_major } => {
            let idx = if indices {
                // Flat index strides of the lifted spatial dims; lifted unit dims get 0.
                let rank = cx.shape(x).len() - 2;
                let first = 3 - rank;
                let mut st = [0i64; 3];
                let mut acc = 1i64;
                let axes: Vec<usize> = if column_major { (first..3).collect() } else { (first..3).rev().collect() };
                for a in axes {
                    st[a] = acc;
                    acc *= g.input[a] as i64;
                }
                Some((cx.output(node, 1)?, st))
            } else {
                None
            };
            (Reduction::Max { init: f32::MIN }, idx)
        }
        OnnxPoolKind::Average { count_include_pad } => (Reduction::Avg { count_include_pad }, None),
    };
    emit_window(cx, node, x, out, indices, false, &w, red)
}

/// ONNX LpPool (opset 1–22): the p-norm of each window, padded taps adding nothing.
fn lower_lp_pool(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<LpPool>() else {
        return Err(LowerError::Invalid("not an LpPool node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, "LpPool")?;
    let (w, _) = onnx_window(cx, x, &op.window, &op.kernel)?;
    let out = cx.output(node, 0)?;
    emit_window(cx, node, x, out, None, false, &w, Reduction::Lp { p: op.p })
}

/// Partial rows (image, pixel range) of a split global pool's workspace
/// (`templates/cuda/partials/pool_split.hbs`): at small batch the pixels of an image are split
/// into ranges reduced by separate blocks, at most this many rows in all, each `C` fp32 values.
pub(crate) const POOL_SPLIT_MAX_ROWS: u64 = 512;

/// Workspace of a split NHWC pool over `c` channels: none when `c` is not known at compile time
/// (the kernel then pools one range per image; it checks the size it is given).
pub(crate) fn pool_split_workspace(c: &Dim) -> u64 {
    c.as_known().map_or(0, |c| POOL_SPLIT_MAX_ROWS * c.max(0) as u64 * 4)
}

/// Emits a global reduction of x: `[N, L, C]` when `nhwc`, else `[N·C, L]` planes.
fn emit_global(
    cx: &mut LowerCtx,
    node: &Node,
    x: TensorId,
    out: TensorId,
    nhwc: bool,
    red: Reduction,
) -> LowerResult<()> {
    let xs = cx.shape(x).to_vec();
    let (n, c, l) = if nhwc {
        (xs[0].clone(), xs[xs.len() - 1].clone(), product(&xs[1..xs.len() - 1]))
    } else {
        (xs[0].clone(), xs[1].clone(), product(&xs[2..]))
    };
    let mut ctx = Map::new();
    ctx.insert("ctype".into(), json!(ctype(cx.dtype(x))));
    ctx.insert("nhwc".into(), json!(nhwc));
    ctx.insert("n".into(), json!(cx.expr(&n)?));
    ctx.insert("c".into(), json!(cx.expr(&c)?));
    ctx.insert("l".into(), json!(cx.expr(&l)?));
    ctx.insert("vec".into(), json!(if nhwc { channel_vec(&c, cx.dtype(x)) } else { 1 }));
    // 1/L as a literal when known (the mean multiplies); a division otherwise.
    ctx.insert(
        "inv_l".into(),
        json!(match l.as_known() {
            Some(v) if v > 0 => float_lit(1.0 / v as f32),
            _ => format!("(1.0f / static_cast<float>({}))", cx.expr(&l)?),
        }),
    );
    red.fields(&mut ctx);
    ctx.insert("split_max_rows".into(), json!(POOL_SPLIT_MAX_ROWS));
    let workspace = if nhwc { pool_split_workspace(&c) } else { 0 };
    cx.emit(&node.name, "global_pool", vec![x, out], vec![1], ctx, workspace)
}

/// Kernel-level GlobalAvgPool (NCHW or NHWC; `flatten` only changes the output's shape).
fn lower_kernel_global(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<GlobalAvgPool>() else {
        return Err(LowerError::Invalid("not a GlobalAvgPool node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, "global pooling")?;
    let out = cx.output(node, 0)?;
    emit_global(cx, node, x, out, op.layout == Layout::Nhwc, Reduction::Avg { count_include_pad: false })
}

/// ONNX GlobalAveragePool / GlobalMaxPool (opset 1, 22: types), any rank ≥ 3.
fn lower_onnx_global(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<GlobalPool>() else {
        return Err(LowerError::Invalid("not a global pool node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, node.op.op_type())?;
    let out = cx.output(node, 0)?;
    let red = if op.max { Reduction::Max { init: f32::MIN } } else { Reduction::Avg { count_include_pad: false } };
    emit_global(cx, node, x, out, false, red)
}

/// ONNX GlobalLpPool (opset 1, 2: `p` an INT, 22: types).
fn lower_onnx_global_lp(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<GlobalLpPool>() else {
        return Err(LowerError::Invalid("not a GlobalLpPool node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, "GlobalLpPool")?;
    let out = cx.output(node, 0)?;
    emit_global(cx, node, x, out, false, Reduction::Lp { p: op.p })
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testkit::{lower, render, Builder};
    use super::*;
    use crate::ir::ops::kernel::ConvGeom;
    use crate::ir::ops::testutil::parse_node as parse;
    use crate::ir::Attr;

    fn geom(s: usize, p: usize) -> ConvGeom {
        ConvGeom { strides: [s, s], pads: [p, p, p, p], dilations: [1, 1], group: 1 }
    }

    #[test]
    fn resnet_pools() {
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(112), Dim::known(112), Dim::known(64)]);
        let mp = KernelPool {
            kind: KernelPoolKind::Max,
            layout: Layout::Nhwc,
            kernel: [3, 3],
            geom: geom(2, 1),
            ceil_mode: false,
        };
        b.node(Box::new(mp), &[Some(x)]);
        let f = b.input("f", DType::F32, vec![n.clone(), Dim::known(7), Dim::known(7), Dim::known(2048)]);
        b.node(Box::new(GlobalAvgPool { layout: Layout::Nhwc, flatten: true }), &[Some(f)]);
        let y = b.input("y", DType::F32, vec![n.clone(), Dim::known(16), Dim::known(9), Dim::known(9)]);
        let ap = KernelPool {
            kind: KernelPoolKind::Avg { count_include_pad: true },
            layout: Layout::Nchw,
            kernel: [3, 3],
            geom: geom(2, 1),
            ceil_mode: true,
        };
        b.node(Box::new(ap), &[Some(y)]);
        b.node(Box::new(GlobalAvgPool { layout: Layout::Nchw, flatten: false }), &[Some(y)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = &p.kernels[0].context;
        assert_eq!(c["vec"], json!(8));
        assert_eq!(c["out"], json!([1, 56, 56]));
        assert_eq!(c["work"], json!("((int64_t)25088*dims.v[0])"));
        assert_eq!(c["init"], json!("__int_as_float(0xff800000)"));
        let g = &p.kernels[1].context;
        assert_eq!(
            (g["l"].as_str(), g["vec"].as_i64(), g["inv_l"].as_str()),
            (Some("49"), Some(8), Some("0.020408163f"))
        );
        assert_eq!(p.kernels[2].context["out"], json!([1, 5, 5]));
        render(&p, "pool_kernel");
    }

    #[test]
    fn onnx_pools() {
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![Dim::known(2), Dim::known(3), Dim::known(10), Dim::known(9)]);
        let ks = ("kernel_shape", Attr::Ints(vec![3, 3]));
        let mp = parse(
            "MaxPool",
            12,
            &[ks.clone(), ("storage_order", Attr::Int(1)), ("ceil_mode", Attr::Int(1))],
            &[true],
            2,
        )
        .unwrap();
        b.node(mp, &[Some(x)]);
        let ap = parse(
            "AveragePool",
            19,
            &[ks.clone(), ("pads", Attr::Ints(vec![1, 1, 1, 1])), ("dilations", Attr::Ints(vec![2, 1]))],
            &[true],
            1,
        )
        .unwrap();
        b.node(ap, &[Some(x)]);
        let x1 = b.input("x1", DType::F16, vec![Dim::known(2), Dim::known(3), Dim::known(11)]);
        let lp =
            parse("LpPool", 18, &[("kernel_shape", Attr::Ints(vec![2])), ("p", Attr::Int(3))], &[true], 1).unwrap();
        b.node(lp, &[Some(x1)]);
        for op in ["GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"] {
            b.node(parse(op, 13, &[], &[true], 1).unwrap(), &[Some(x1)]);
        }
        let x3 =
            b.input("x3", DType::F32, vec![Dim::known(1), Dim::known(2), Dim::known(4), Dim::known(5), Dim::known(6)]);
        b.node(parse("MaxPool", 12, &[("kernel_shape", Attr::Ints(vec![2, 2, 2]))], &[true], 2).unwrap(), &[Some(x3)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = &p.kernels[0].context;
        assert_eq!(c["indices"], json!(true));
        assert_eq!(c["index_strides"], json!([0, 1, 10]));
        assert_eq!(c["init"], json!("(-3.4028235e38f)"));
        assert_eq!(p.kernels[0].args.len(), 3);
        assert_eq!(p.kernels[6].context["index_strides"], json!([30, 6, 1]));
        assert_eq!(p.kernels[2].context["in"], json!([1, 1, 11]));
        assert_eq!(p.kernels[5].context["p"], json!("2.0f"));
        render(&p, "pool_onnx");
    }

    /// fp32 precision: the pools keep fp32 tensors, NHWC channel vectors are 4 floats (16 bytes).
    #[test]
    fn fp32_pools() {
        use super::super::elementwise::testkit::lower_at;
        use crate::lower::Precision;
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(112), Dim::known(112), Dim::known(64)]);
        let mp = KernelPool {
            kind: KernelPoolKind::Max,
            layout: Layout::Nhwc,
            kernel: [3, 3],
            geom: geom(2, 1),
            ceil_mode: false,
        };
        b.node(Box::new(mp), &[Some(x)]);
        let f = b.input("f", DType::F32, vec![n.clone(), Dim::known(7), Dim::known(7), Dim::known(2048)]);
        b.node(Box::new(GlobalAvgPool { layout: Layout::Nhwc, flatten: true }), &[Some(f)]);
        let y = b.input("y", DType::F32, vec![n.clone(), Dim::known(16), Dim::known(9), Dim::known(9)]);
        b.node(parse("AveragePool", 19, &[("kernel_shape", Attr::Ints(vec![3, 3]))], &[true], 1).unwrap(), &[Some(y)]);
        b.node(parse("GlobalMaxPool", 13, &[], &[true], 1).unwrap(), &[Some(y)]);
        let p = lower_at(&b.g, OPS, Precision::Fp32).unwrap();
        assert_eq!(p.kernels.len(), 4);
        assert!(p.kernels.iter().all(|k| k.context["ctype"] == json!("float")));
        assert!(p.tensors.iter().all(|t| t.dtype == DType::F32));
        assert_eq!(p.kernels[0].context["vec"], json!(4));
        assert_eq!(p.kernels[0].context["work"], json!("((int64_t)50176*dims.v[0])"));
        assert_eq!(p.kernels[1].context["vec"], json!(4));
        render(&p, "pool_fp32");
    }
}
