//! The squeeze-and-excitation scale folded into the next 1x1 convolution's weights (issue 15,
//! after extraction): `conv1x1(x · s, w)` with `s[n, c]` the block's per-image channel scale
//! (`kernel::SqueezeExciteScale`) equals a batched product of `x` by per-image weights
//! `w'[n, k, c] = w[k, c] · s[n, c]`:
//!
//! ```text
//!   y[n, p, k] = Σ_c x[n, p, c] · s[n, c] · w[k, c] = Σ_c x[n, p, c] · w'[n, k, c]
//! ```
//!
//! Without the fold the product `x · s` is a full-tensor elementwise pass (x read, x' written,
//! x' read again by the convolution: EfficientNet-B0 at batch 256 spent 0.77 ms of 6.4 in these
//! sixteen passes on an H100). With it the convolution reads `x` itself, and the pass becomes
//! the scaling of the weights: `K·C` values per image instead of `H·W·C`. So it applies where
//! `K < H·W`, and from [`MIN_PIXELS`] pixels on: EfficientNet-B0's blocks at 112x112, 56x56 and
//! 28x28 (five of its sixteen; the 14x14 and 7x7 ones keep the product).
//!
//! The new nodes: `s` viewed as `[N, 1, C]`, the weights as a `[1, K, C]` constant, their
//! elementwise product `w'` `[N, K, C]`, `x` viewed as `[N, H·W, C]`, the batched product
//! `x · w'ᵀ` with the convolution's bias, residual (viewed as `[N, H·W, K]`) and activation,
//! and its result viewed back as `[N, H, W, K]`, the convolution's output value. The reshapes
//! are views (no kernel), so two launches replace two and the full-tensor pass goes.
//!
//! Where it applies: an NHWC 1x1 convolution (stride 1, no padding, one group) with constant
//! weights and no pre-activation, whose input is an elementwise `x · s` (either order) read by
//! nothing else and not a graph output, `s` of shape `[N, 1, 1, C]` computed by a
//! squeeze-excite scale, known H, W, C and K, `K < H·W` and `H·W ≥` [`MIN_PIXELS`]. A graph
//! pass rather than a rewrite rule: it needs reshapes of a symbolic batch, which the e-graph
//! language has no node for, and a new constant, and leaves no choice to weigh.

use super::to_ir::Lowered;
use crate::ir::ops::kernel::{BinOp, Conv2d, Elementwise, EwExpr, Gemm, Layout, SqueezeExciteScale};
use crate::ir::ops::shape::Reshape;
use crate::ir::{Dim, Graph, Node, ValueId, ValueType};
use std::sync::Arc;

/// The domain of the nodes the optimiser adds (reports look through its views).
const OPTIMISER_DOMAIN: &str = "onnx2ait";

/// The fewest pixels per image worth folding for: the batched product runs one matrix of H·W
/// rows per image, and below this its 128-row tiles leave much of their last tile idle (14x14:
/// 196 rows in 256) while the product the fold saves is small (EfficientNet-B0's 14x14 blocks:
/// 0.02-0.05 ms each at batch 256 on an H100).
pub const MIN_PIXELS: i64 = 512;

/// A fold found by [`find`]: node indices and the sizes the new nodes need.
struct Site {
    mul: usize,
    conv: usize,
    x: ValueId,
    s: ValueId,
    hw: [i64; 2],
    c: i64,
    k: i64,
}

/// Folds every eligible squeeze-excite product into its projection (see the module docs).
/// Returns how many were folded.
pub fn fold_scale_into_projections(low: &mut Lowered) -> usize {
    let mut folded = 0;
    while let Some(site) = find(&low.graph) {
        rewrite(low, site);
        folded += 1;
    }
    folded
}

fn known(d: &Dim) -> Option<i64> {
    d.as_known()
}

fn shape(g: &Graph, v: ValueId) -> Option<&[Dim]> {
    g.values[v].ty.as_ref().map(|t| t.shape.as_slice())
}

/// The first eligible (product, projection) pair.
fn find(g: &Graph) -> Option<Site> {
    let producers = g.producers();
    let consumers = g.consumers();
    for (ci, node) in g.nodes.iter().enumerate() {
        let Some(conv) = node.op.as_any().downcast_ref::<Conv2d>() else { continue };
        let geom = conv.geom;
        if conv.layout != Layout::Nhwc
            || conv.pre_act.is_some()
            || geom.strides != [1, 1]
            || geom.pads != [0; 4]
            || geom.group != 1
        {
            continue;
        }
        let (Some(xs), Some(w)) = (node.inputs.first().copied().flatten(), node.inputs.get(1).copied().flatten())
        else {
            continue;
        };
        let Some(wshape) = shape(g, w) else { continue };
        if g.values[w].konst.is_none()
            || wshape.len() != 4
            || known(&wshape[1]) != Some(1)
            || known(&wshape[2]) != Some(1)
        {
            continue;
        }
        let Some(mi) = producers[xs] else { continue };
        if consumers[xs].len() != 1 || g.outputs.contains(&xs) {
            continue;
        }
        let mul = &g.nodes[mi];
        let Some(ew) = mul.op.as_any().downcast_ref::<Elementwise>() else { continue };
        let (a, b) = match &ew.expr {
            EwExpr::Binary(BinOp::Mul, a, b) if ew.num_inputs == 2 => (a.as_ref(), b.as_ref()),
            _ => continue,
        };
        let (EwExpr::Input(ia), EwExpr::Input(ib)) = (a, b) else { continue };
        let ins: Vec<Option<ValueId>> = [*ia, *ib].iter().map(|&i| mul.inputs.get(i).copied().flatten()).collect();
        let (Some(va), Some(vb)) = (ins[0], ins[1]) else { continue };
        let is_scale = |v: ValueId| {
            producers[v].is_some_and(|p| g.nodes[p].op.as_any().downcast_ref::<SqueezeExciteScale>().is_some())
        };
        let (x, s) = if is_scale(vb) && !is_scale(va) {
            (va, vb)
        } else if is_scale(va) && !is_scale(vb) {
            (vb, va)
        } else {
            continue;
        };
        let (Some(xshape), Some(sshape)) = (shape(g, x), shape(g, s)) else { continue };
        if xshape.len() != 4 || sshape.len() != 4 || sshape[0] != xshape[0] || sshape[3] != xshape[3] {
            continue;
        }
        if known(&sshape[1]) != Some(1) || known(&sshape[2]) != Some(1) {
            continue;
        }
        let (Some(h), Some(wd), Some(c), Some(k)) =
            (known(&xshape[1]), known(&xshape[2]), known(&xshape[3]), known(&wshape[0]))
        else {
            continue;
        };
        if known(&wshape[3]) != Some(c) || k >= h * wd || h * wd < MIN_PIXELS {
            continue;
        }
        return Some(Site { mul: mi, conv: ci, x, s, hw: [h, wd], c, k });
    }
    None
}

fn add_value(g: &mut Graph, base: &str, ty: ValueType, konst: Option<crate::ir::Tensor>) -> ValueId {
    let mut name = base.to_string();
    while g.value_named(&name).is_some() {
        name.push('_');
    }
    g.values.push(crate::ir::Value { name, ty: Some(ty), konst: konst.map(Arc::new), sym: None });
    g.values.len() - 1
}

fn reshape_node(name: String, target: Vec<i64>, input: ValueId, output: ValueId) -> Node {
    Node {
        name,
        op_type: "Reshape".into(),
        domain: OPTIMISER_DOMAIN.into(),
        op: Box::new(Reshape { allowzero: false, attr_shape: Some(target) }),
        inputs: vec![Some(input)],
        outputs: vec![output],
    }
}

fn rewrite(low: &mut Lowered, site: Site) {
    let g = &mut low.graph;
    let conv_node = &g.nodes[site.conv];
    let conv = conv_node.op.as_any().downcast_ref::<Conv2d>().expect("find checked the op").clone();
    let name = conv_node.name.clone();
    let w = conv_node.inputs[1].expect("find checked the weights");
    let bias = conv_node.inputs.get(2).copied().flatten();
    let residual = conv_node.inputs.get(3).copied().flatten();
    let out = conv_node.outputs[0];
    let dtype = g.values[out].ty.as_ref().expect("typed output").dtype;
    let n = g.values[site.x].ty.as_ref().expect("typed input").shape[0].clone();
    let [h, wd] = site.hw;
    let (c, k, hw) = (site.c, site.k, site.hw[0] * site.hw[1]);
    let known = |v: i64| Dim::known(v);

    let w_konst = g.values[w].konst.as_ref().expect("find checked the weights").reshaped(&[1, k as usize, c as usize]);
    let w_konst = w_konst.expect("a [K,1,1,C] constant holds K·C values");
    let w3 = add_value(
        g,
        &format!("{name}.weight_kc"),
        ValueType::new(dtype, vec![known(1), known(k), known(c)]),
        Some(w_konst),
    );
    let s3 =
        add_value(g, &format!("{name}.scale_n1c"), ValueType::new(dtype, vec![n.clone(), known(1), known(c)]), None);
    let ws = add_value(
        g,
        &format!("{name}.scaled_weight"),
        ValueType::new(dtype, vec![n.clone(), known(k), known(c)]),
        None,
    );
    let x3 =
        add_value(g, &format!("{name}.input_rows"), ValueType::new(dtype, vec![n.clone(), known(hw), known(c)]), None);
    let y3 = add_value(g, &format!("{name}.rows"), ValueType::new(dtype, vec![n.clone(), known(hw), known(k)]), None);
    let r3 = residual.map(|_| {
        add_value(
            g,
            &format!("{name}.residual_rows"),
            ValueType::new(dtype, vec![n.clone(), known(hw), known(k)]),
            None,
        )
    });

    let mut nodes = vec![
        reshape_node(format!("{name}.scale_view"), vec![0, 1, c], site.s, s3),
        Node {
            name: format!("{name}.scale_weights"),
            op_type: "Mul".into(),
            domain: OPTIMISER_DOMAIN.into(),
            op: Box::new(Elementwise::binary(BinOp::Mul)),
            inputs: vec![Some(w3), Some(s3)],
            outputs: vec![ws],
        },
        reshape_node(format!("{name}.input_view"), vec![0, hw, c], site.x, x3),
    ];
    if let (Some(r), Some(r3)) = (residual, r3) {
        nodes.push(reshape_node(format!("{name}.residual_view"), vec![0, hw, k], r, r3));
    }
    nodes.push(Node {
        name: format!("{name}.scaled"),
        op_type: "Gemm".into(),
        domain: OPTIMISER_DOMAIN.into(),
        op: Box::new(Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act: conv.act }),
        inputs: vec![Some(x3), Some(ws), bias, r3],
        outputs: vec![y3],
    });
    nodes.push(reshape_node(format!("{name}.output_view"), vec![0, h, wd, k], y3, out));

    // The new nodes compute the projection's class; the product's class is now theirs.
    let conv_class = low.node_class[site.conv];
    let mul_class = low.node_class[site.mul];
    low.absorbed.push((mul_class, conv_class));
    // Removed, and the new nodes put where the projection was: everything they read (x, s, the
    // bias, the residual) is computed before it, everything reading its output after it.
    let at = if site.mul < site.conv { site.conv - 1 } else { site.conv };
    for i in [site.mul.max(site.conv), site.mul.min(site.conv)] {
        low.graph.nodes.remove(i);
        low.node_class.remove(i);
    }
    for (i, node) in nodes.into_iter().enumerate() {
        low.graph.nodes.insert(at + i, node);
        low.node_class.insert(at + i, conv_class);
    }
}
