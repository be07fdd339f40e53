//! Kernel-level ops produced by the optimiser (`crate::egraph`): fused conv and gemm with their
//! epilogues, fused elementwise chains, layernorm, pooling in either layout, layout transforms
//! and the small reshapes the rewrites introduce. They are not ONNX ops and are not in the ONNX
//! registry; each one is one GPU kernel (or a free view) in the generated code, and each has a
//! reference implementation in `crate::reference::kernel`, so optimised graphs run on the CPU
//! executor and every fusion is checked numerically without a GPU.
//!
//! Layouts: `Layout::Nchw` ops read and write the ONNX layout; `Layout::Nhwc` ops read and write
//! channels-last activations, with conv weights in KRSC order (`[K, R, S, C/group]`).

mod act;
mod attention;
mod conv;
mod elementwise;
mod gemm;
mod misc;
mod squeeze_excite;

pub use act::Act;
pub use attention::{Attention, AttentionLayout, OperandOrder, OperandView, StridedOperands};
pub use conv::{Conv2d, ConvGeom};
pub use elementwise::{BinOp, Elementwise, EwExpr};
pub use gemm::Gemm;
pub use misc::{ChannelView, Flatten, GlobalAvgPool, LayerNorm, Pool, PoolKind, ReduceMean, Transpose};
pub use squeeze_excite::SqueezeExciteScale;

use serde::Serialize;

/// Memory layout of a rank-4 activation tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    Nchw,
    Nhwc,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Nchw => "nchw",
            Layout::Nhwc => "nhwc",
        }
    }
}

/// The kernel family a kernel-level op belongs to, as named in `explain` reports
/// (`conv`, `gemm`, `elementwise`, `pool`, `layernorm`, `attention`, `squeeze_excite`, `transpose`,
/// `reduce`, `reshape`).
pub fn kernel_kind(op: &dyn crate::ir::Op) -> Option<&'static str> {
    let any = op.as_any();
    if any.is::<Conv2d>() {
        Some("conv")
    } else if any.is::<Gemm>() {
        Some("gemm")
    } else if any.is::<Elementwise>() {
        Some("elementwise")
    } else if any.is::<Pool>() || any.is::<GlobalAvgPool>() {
        Some("pool")
    } else if any.is::<LayerNorm>() {
        Some("layernorm")
    } else if any.is::<Attention>() {
        Some("attention")
    } else if any.is::<SqueezeExciteScale>() {
        Some("squeeze_excite")
    } else if any.is::<Transpose>() {
        Some("transpose")
    } else if any.is::<ReduceMean>() {
        Some("reduce")
    } else if any.is::<Flatten>() || any.is::<ChannelView>() {
        Some("reshape")
    } else {
        None
    }
}
