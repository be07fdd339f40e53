//! The e-graph language: logical ONNX-level nodes the rules rewrite, kernel-level nodes they
//! produce, leaves, and opaque nodes standing for IR nodes the rules do not look into.
//!
//! Attributes the rules bind (conv geometry, activation, permutation, reduction axes) are leaf
//! children spelled as single tokens, so one rule covers every value:
//! `(conv ?x ?w ?b s2,2:p1,1,1,1:d1,1:g1)`, `(act relu ?x)`, `(transpose [0,2,3,1] ?x)`.
//!
//! Leaves:
//! - `none` — an absent optional input (no bias, no residual, no activation);
//! - `c<k>` — constant `k` of the analysis' constant table;
//! - `in<k>` — graph input `k`;
//! - `op<k>` — original IR node `k` (nodes such as `bn` keep their original implementation);
//! - anything else — an attribute token, read by the node that owns it.
//!
//! `Opaque("op<k>.<j>", inputs)` is output `j` of original IR node `k`, kept as it is.

use egg::{define_language, Id, Symbol};

define_language! {
    pub enum ONode {
        // x w bias geom — NCHW activations, OIHW weights; bias is `none` or `[K]`.
        "conv" = Conv([Id; 4]),
        // x w bias residual geom act — NHWC activations, KRSC weights; the fused kernel.
        "kconv" = KConv([Id; 6]),
        // a b bias residual attrs act — matrix product (ONNX MatMul and Gemm) with its epilogue;
        // attrs is `ta<0|1>:tb<0|1>:a<alpha>:b<beta>`.
        "gemm" = Gemm([Id; 6]),
        "add" = Add([Id; 2]),
        "sub" = Sub([Id; 2]),
        "mul" = Mul([Id; 2]),
        "div" = Div([Id; 2]),
        "pow" = Pow([Id; 2]),
        "max" = Max([Id; 2]),
        "min" = Min([Id; 2]),
        // fn x — a pointwise function (`relu`, `clip:0:6`, `erf`, `sqrt`, …).
        "act" = Act([Id; 2]),
        // axes x — mean reduction, axes token `-1|k1` (axes, then keepdims).
        "rmean" = ReduceMean([Id; 2]),
        // perm x
        "transpose" = Transpose([Id; 2]),
        // axis x — ONNX Flatten.
        "flatten" = Flatten([Id; 2]),
        // ones x — per-channel tensor viewed as `[C, 1 × ones]`.
        "chan" = Chan([Id; 2]),
        // axes x — views inserting / removing size-1 axes (ONNX Unsqueeze / Squeeze semantics,
        // axes spelled `[2]`): a 1-D convolution runs as a 2-D one over a height-1 image.
        "unsqueeze" = Unsqueeze([Id; 2]),
        "squeeze" = Squeeze([Id; 2]),
        // x scale bias mean var eps orig — inference BatchNormalization (eps a scalar constant,
        // orig the original node, which implements it when no rule rewrites it away).
        "bn" = BatchNorm([Id; 7]),
        // x orig — Identity, inference Dropout.
        "identity" = Identity([Id; 2]),
        // geom x — 2-D max/average pooling, NCHW and NHWC.
        "pool" = Pool([Id; 2]),
        "pool_nhwc" = PoolNhwc([Id; 2]),
        // x — global average pooling: NCHW `[N,C,1,1]`, NHWC `[N,1,1,C]`, NHWC flattened `[N,C]`.
        "gap" = Gap(Id),
        "gap_nhwc" = GapNhwc(Id),
        "gap_flat_nhwc" = GapFlatNhwc(Id),
        // axis x1 x2 … — ONNX Concat of floating-point tensors along a non-negative axis.
        "concat" = Concat(Box<[Id]>),
        // x scale bias eps — layernorm over the last axis (bias may be `none`).
        "layernorm" = LayerNorm([Id; 4]),
        // x orig — softmax over the last axis (ONNX Softmax at opset 13+, or earlier opsets when
        // the coerced axis is the last one); orig is the original node, which implements it and
        // names it when no rule rewrites it away.
        "softmax" = Softmax([Id; 2]),
        // q k v mask scale how — fused attention (kernel::Attention); mask is `none` or
        // additive, scale a scalar constant the scores are multiplied (`how` = `mul`) or divided
        // (`div`) by; operands are heads-last `[B, S, H, D]`, or heads-first `[B, H, S, D]` with
        // `how` = `mul-bhsd` / `div-bhsd`.
        "attention" = Attention([Id; 6]),
        // x w1 b1 act w2 b2 gate — the scale of a squeeze-and-excitation block
        // (kernel::SqueezeExciteScale): x NHWC, w1/w2 KRSC 1x1 filters, b1/b2 `none` or vectors,
        // act/gate activation tokens or `none`; the result is `[N, 1, 1, C]`.
        "se_scale" = SeScale([Id; 7]),
        Leaf(Symbol),
        Opaque(Symbol, Vec<Id>),
    }
}

/// What a leaf token stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeafKind<'a> {
    None,
    Const(usize),
    Input(usize),
    Orig(usize),
    Attr(&'a str),
}

pub fn leaf_kind(s: &str) -> LeafKind<'_> {
    let num = |p: &str| {
        s.strip_prefix(p)
            .filter(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|r| r.parse().ok())
    };
    if s == "none" {
        LeafKind::None
    } else if let Some(k) = num("c") {
        LeafKind::Const(k)
    } else if let Some(k) = num("in") {
        LeafKind::Input(k)
    } else if let Some(k) = num("op") {
        LeafKind::Orig(k)
    } else {
        LeafKind::Attr(s)
    }
}

/// Splits an opaque symbol `op<k>.<j>` into (node, output).
pub fn opaque_ref(s: &str) -> Option<(usize, usize)> {
    let (k, j) = s.strip_prefix("op")?.split_once('.')?;
    Some((k.parse().ok()?, j.parse().ok()?))
}

pub fn opaque_symbol(node: usize, output: usize) -> Symbol {
    Symbol::from(format!("op{node}.{output}"))
}

pub fn leaf(s: impl AsRef<str>) -> ONode {
    ONode::Leaf(Symbol::from(s.as_ref()))
}
