//! The scale of a squeeze-and-excitation block (`kernel::SqueezeExciteScale`, made by
//! rewrites/squeeze_excite.rules): `squeeze_excite.cu.hbs`, one launch for what ran as a global
//! pooling kernel, two 1x1 convolution kernels and, for a squeeze width that is not a multiple of
//! 8, a `pad_channels` kernel in front of the second (EfficientNet-B0: 16 blocks, 10 of them
//! with squeeze widths 4 to 28).
//!
//! One block per image: its threads pool x's pixels into the channel means (each thread a
//! vector of channels over a share of the pixels, the shares combined in shared memory, in a
//! fixed order so results do not depend on scheduling), then a warp per squeeze unit computes
//! the first dense layer from shared memory, then a thread per channel the second and the gate.
//! The dense layers are `S·C` multiply-adds each per image (EfficientNet-B0's largest: 48 x
//! 1152), far too small for tensor cores to pay off; the weights come from L2 after the first
//! image. The pooled means, the hidden layer and the shares live in shared memory, which bounds
//! C (`kernel::SqueezeExciteScale::MAX_CHANNELS`).
//!
//! At small batch a block per image leaves most of the GPU idle while it pools (EfficientNet-B0's
//! first block pools 112x112x32 values), so the launcher first splits each image's pixels into
//! ranges pooled by separate blocks into fp32 partial rows of the workspace
//! (`partials/pool_split.hbs`, shared with the global pool), and the block per image then adds
//! its rows in order instead of pooling: one launch more, the pooling spread over the GPU.
//!
//! Up to `WIDE_MAX_IMAGES` images the dense layers are spread over blocks too: a block per image
//! reads both weight matrices through one SM (MobileNetV3-Large's 960 x 240 layers: 0.052 ms at
//! batch 1 on an H100). Then a grid of (row blocks, images) pools and computes the hidden layer
//! into the workspace, and a second grid the scale; each row's dot product is computed exactly
//! as by the block per image, so the launch changes no value.
//!
//! The product `x · scale` is not done here: the scale needs every pixel of x first. It stays an
//! elementwise kernel (merged into any elementwise chain reading x), so the block costs two
//! launches (three when the pooling is split).

use super::{require_float, LowerSpec};
use crate::ir::ops::kernel::SqueezeExciteScale;
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult};
use serde_json::{json, Map};

use super::conv::act_expr;
use super::pool::{pool_split_workspace, POOL_SPLIT_MAX_ROWS};

pub const OPS: &[LowerSpec] = &[LowerSpec::of::<SqueezeExciteScale>("SqueezeExciteScale", lower_squeeze_excite)];

/// Threads per block (one block per image).
const THREADS: i64 = 512;

/// Up to this batch the dense layers' rows are spread over blocks (`wide_max_images` of the
/// template): a block per image reads both weight matrices through one SM, which took 0.052 ms
/// per MobileNetV3-Large 960 x 240 block at batch 1 on an H100 (30% of its kernel time).
const WIDE_MAX_IMAGES: u64 = 16;

fn lower_squeeze_excite(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<SqueezeExciteScale>() else {
        return Err(LowerError::Invalid("not a SqueezeExciteScale node".into()));
    };
    let x = cx.input(node, 0)?;
    require_float(cx, x, "squeeze-excite")?;
    let w1 = cx.input(node, 1)?;
    let b1 = cx.opt_input(node, 2)?;
    let w2 = cx.input(node, 3)?;
    let b2 = cx.opt_input(node, 4)?;
    let y = cx.output(node, 0)?;
    let dt = cx.dtype(x);
    for (what, t) in [("w1", Some(w1)), ("b1", b1), ("w2", Some(w2)), ("b2", b2), ("scale", Some(y))] {
        if let Some(t) = t {
            if cx.dtype(t) != dt {
                return Err(LowerError::Invalid(format!(
                    "squeeze-excite {what} is {} on the device but x is {dt}",
                    cx.dtype(t)
                )));
            }
        }
    }
    let xs = cx.shape(x).to_vec();
    if xs.len() != 4 {
        return Err(LowerError::Invalid(format!("squeeze-excite input has rank {}, want NHWC", xs.len())));
    }
    let known = |d: &Dim, what: &str| {
        d.as_known().filter(|&v| v > 0).ok_or_else(|| {
            LowerError::Unsupported(format!("squeeze-excite {what} ({d}) must be known at compile time"))
        })
    };
    let c = known(&xs[3], "channel count")?;
    let s = known(&cx.shape(w1)[0].clone(), "squeeze width")?;
    if c > SqueezeExciteScale::MAX_CHANNELS || s > SqueezeExciteScale::MAX_CHANNELS {
        return Err(LowerError::Unsupported(format!(
            "squeeze-excite over {c} channels with a squeeze of {s}: the kernel holds at most {} of each in shared memory",
            SqueezeExciteScale::MAX_CHANNELS
        )));
    }
    let widest = (16 / dt.size_bytes().max(1)) as i64;
    let vec = [8, 4, 2].into_iter().find(|&v| v <= widest && c % v == 0).unwrap_or(1);
    let pixels = xs[1].mul(&xs[2]);
    let mut ctx = Map::new();
    ctx.insert("ctype".into(), json!(ctype(dt)));
    ctx.insert("n".into(), json!(cx.expr(&xs[0])?));
    ctx.insert("l".into(), json!(cx.expr(&pixels)?));
    ctx.insert("c".into(), json!(c));
    ctx.insert("s".into(), json!(s));
    ctx.insert("vec".into(), json!(vec));
    ctx.insert("threads".into(), json!(THREADS));
    // Shared memory: the pooling shares (at most THREADS vectors, or C when there are more
    // channel vectors than threads), the pooled means and the hidden layer, all fp32.
    let shares_floats = (THREADS * vec).max(c);
    ctx.insert("shares_floats".into(), json!(shares_floats));
    ctx.insert("smem_bytes".into(), json!((shares_floats + c + s) * 4));
    ctx.insert("act".into(), json!(act_expr(op.act, "v")));
    ctx.insert("gate".into(), json!(act_expr(op.gate, "v")));
    ctx.insert("fp16".into(), json!(dt == DType::F16));
    let mut args = vec![x, w1];
    if let Some(b) = b1 {
        ctx.insert("b1_arg".into(), json!(args.len()));
        args.push(b);
    }
    ctx.insert("w2_arg".into(), json!(args.len()));
    args.push(w2);
    if let Some(b) = b2 {
        ctx.insert("b2_arg".into(), json!(args.len()));
        args.push(b);
    }
    ctx.insert("y_arg".into(), json!(args.len()));
    args.push(y);
    let writes = vec![args.len() - 1];
    ctx.insert("split_max_rows".into(), json!(POOL_SPLIT_MAX_ROWS));
    ctx.insert("wide_max_images".into(), json!(WIDE_MAX_IMAGES));
    // The split pooling's partial rows, then the hidden layer of a small batch (fp32).
    let workspace = pool_split_workspace(&xs[3]) + WIDE_MAX_IMAGES * s as u64 * 4;
    cx.emit(&node.name, "squeeze_excite", args, writes, ctx, workspace)
}
