//! IR graph → e-graph. Ops the rules know become language nodes (attributes as leaf tokens);
//! every other node becomes one opaque node per output, referring to the original node.

use super::analysis::{axes_token, gemm_attrs_token, OGraph, OptAnalysis, OrigNode};
use super::language::{leaf, opaque_symbol, ONode};
use crate::error::{Error, Result};
use crate::ir::dim::Dim;
use crate::ir::ops::activation::Activation;
use crate::ir::ops::arithmetic::{BinaryKind, UnaryKind};
use crate::ir::ops::kernel::{self as k, Act, ConvGeom, Elementwise, EwExpr, Layout};
use crate::ir::ops::{activation, arithmetic, cast, conv, linalg, normalization, pool, reduce, shape};
use crate::ir::{Fact, Graph, Node, Tensor};
use egg::Id;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The e-graph of a graph, with the class of every graph output and of every node output.
pub struct Imported {
    pub eg: OGraph,
    pub roots: Vec<Id>,
    /// Classes of each original node's outputs, by node index.
    pub node_classes: Vec<Vec<Id>>,
    /// Classes of each original node's inputs (`None`: absent optional input).
    pub node_inputs: Vec<Vec<Option<Id>>>,
}

struct Builder {
    eg: OGraph,
    /// 1-D conv weights already given their 2-D shape, by constant index (a weight shared by
    /// several convs is stored once).
    weights_2d: BTreeMap<usize, Id>,
}

impl Builder {
    fn leaf(&mut self, tok: &str) -> Id {
        self.eg.add(leaf(tok))
    }
    fn none(&mut self) -> Id {
        self.leaf("none")
    }
    fn scalar(&mut self, v: f32, like: &Fact) -> Id {
        let t = Tensor::from_f32s(&[], vec![v]).cast(like.dtype());
        let c = self.eg.analysis.add_const(Arc::new(t), None);
        self.leaf(&format!("c{c}"))
    }
}

/// Builds the e-graph of `g` (which must have been through inference).
pub fn from_ir(g: &Graph) -> Result<Imported> {
    let path = g.info.source.clone();
    let mut b = Builder { eg: OGraph::new(OptAnalysis::default()), weights_2d: BTreeMap::new() };
    let mut class: Vec<Option<Id>> = vec![None; g.values.len()];
    for (i, &v) in g.inputs.iter().enumerate() {
        let ty = g.values[v]
            .ty
            .clone()
            .ok_or_else(|| Error::model(&path, format!("input '{}' has no type", g.values[v].name)))?;
        b.eg.analysis.inputs.push(Fact::of_type(ty));
        class[v] = Some(b.leaf(&format!("in{i}")));
    }
    let mut node_classes = Vec::with_capacity(g.nodes.len());
    let mut node_inputs = Vec::with_capacity(g.nodes.len());
    for (ni, node) in g.nodes.iter().enumerate() {
        b.eg.analysis.origs.push(OrigNode {
            name: node.name.clone(),
            op_type: node.op_type.clone(),
            domain: node.domain.clone(),
            op: node.op.clone(),
            num_outputs: node.outputs.len(),
        });
        let mut children = Vec::with_capacity(node.inputs.len());
        for inp in &node.inputs {
            children.push(match inp {
                None => None,
                Some(v) => Some(value_class(&mut b, g, &mut class, *v)?),
            });
        }
        if let Some(c) = static_reshape_target(&mut b, node, &children) {
            children[1] = Some(c);
        }
        let recognised = if node.outputs.len() == 1 { recognise(&mut b, node, ni, &children) } else { None };

        // Inference Dropout with its mask output (opsets 7-11 exporters always declare it): the
        // data output is an identity the cleanup rules remove; the mask stays an opaque output,
        // computed only if something reads it.
        let dropout_with_mask = node.outputs.len() == 2
            && node.op.downcast_ref::<cast::DropoutOp>().is_some()
            && children.first().copied().flatten().is_some();
        let outs: Vec<Id> = match recognised {
            Some(n) => vec![b.eg.add(n)],
            None if dropout_with_mask => {
                let x = children[0].unwrap_or_else(|| b.none());
                let orig = b.leaf(&format!("op{ni}"));
                let data = b.eg.add(ONode::Identity([x, orig]));
                let ch: Vec<Id> = children.iter().map(|c| c.unwrap_or_else(|| b.none())).collect();
                let mask = b.eg.add(ONode::Opaque(opaque_symbol(ni, 1), ch));
                vec![data, mask]
            }
            None => {
                let ch: Vec<Id> = children.iter().map(|c| c.unwrap_or_else(|| b.none())).collect();
                (0..node.outputs.len()).map(|j| b.eg.add(ONode::Opaque(opaque_symbol(ni, j), ch.clone()))).collect()
            }
        };
        for (&v, &c) in node.outputs.iter().zip(&outs) {
            class[v] = Some(c);
        }
        node_classes.push(outs);
        node_inputs.push(children);
    }
    let mut roots = Vec::with_capacity(g.outputs.len());
    for &o in &g.outputs {
        roots.push(value_class(&mut b, g, &mut class, o)?);
    }
    b.eg.rebuild();
    Ok(Imported { eg: b.eg, roots, node_classes, node_inputs })
}

fn value_class(b: &mut Builder, g: &Graph, class: &mut [Option<Id>], v: usize) -> Result<Id> {
    if let Some(c) = class[v] {
        return Ok(c);
    }
    let val = &g.values[v];
    let Some(t) = val.konst.clone() else {
        return Err(Error::model(&g.info.source, format!("value '{}' is read before it is produced", val.name)));
    };
    let k = b.eg.analysis.add_const(t, Some(val.name.clone()));
    let id = b.leaf(&format!("c{k}"));
    class[v] = Some(id);
    Ok(id)
}

/// A Reshape whose target comes from a shape subgraph (`Shape → Gather → Unsqueeze → Concat`,
/// as PyTorch exports `x.view(n, s, heads, d)` or `x.view(x.size(0), -1)`) reads a constant
/// target instead when every target entry is either known, equal to the input dim at the same
/// position (written 0, ONNX's "copy this dim"; `allowzero` must be off), or the one entry left
/// to -1 (`x.view(s, n * heads, d)`: `n·heads` follows from the element count; kept only when
/// inference gives the same shape back). The subgraph then has no reader left and disappears
/// from the extracted graph, so no kernels are spent computing shapes at run time.
fn static_reshape_target(b: &mut Builder, node: &Node, ch: &[Option<Id>]) -> Option<Id> {
    let r = node.op.downcast_ref::<shape::Reshape>()?;
    if r.allowzero || r.attr_shape.is_some() || ch.len() != 2 {
        return None;
    }
    let x = fact_of(b, ch[0])?;
    let target = fact_of(b, ch[1])?;
    if target.konst.is_some() {
        return None;
    }
    let dims = target.sym.as_ref()?;
    let mut values = Vec::with_capacity(dims.len());
    let mut inferred = None;
    for (i, d) in dims.iter().enumerate() {
        // Known entries (sizes, -1, 0) keep their meaning verbatim; a symbolic entry that is the
        // input's dim at the same position is copied by 0; one other symbolic entry (`n·heads` of
        // `x.view(s, n * heads, d)`) is inferred from the element count by -1.
        match d.as_known() {
            Some(v) => values.push(v),
            None if x.shape().get(i) == Some(d) => values.push(0),
            None if inferred.is_none() => {
                inferred = Some(i);
                values.push(-1);
            }
            None => return None,
        }
    }
    if inferred.is_some() {
        // -1 must be the only one, and must give back the shape inference found (a zero-sized
        // dim elsewhere would leave it undetermined).
        if values.iter().filter(|&&v| v == -1).count() != 1 {
            return None;
        }
        let now = Fact::constant(Arc::new(Tensor::from_i64s(&[values.len()], values.clone())));
        let was = node.op.infer(&[Some(x), Some(target)]).ok()?;
        let is = node.op.infer(&[Some(x), Some(&now)]).ok()?;
        if was.first().map(|f| &f.ty) != is.first().map(|f| &f.ty) {
            return None;
        }
    }
    let t = Tensor::from_i64s(&[values.len()], values);
    let k = b.eg.analysis.add_const(Arc::new(t), None);
    Some(b.leaf(&format!("c{k}")))
}

fn fact_of(b: &Builder, c: Option<Id>) -> Option<&Fact> {
    c.and_then(|c| b.eg[c].data.fact.as_ref())
}

/// The language node for a node the rules understand, or `None` (it stays opaque).
fn recognise(b: &mut Builder, node: &Node, ni: usize, ch: &[Option<Id>]) -> Option<ONode> {
    let op = node.op.as_ref();
    let x = ch.first().copied().flatten();
    let is_float = fact_of(b, x).is_some_and(|f| f.dtype().is_float());
    let opt = |b: &mut Builder, i: usize| ch.get(i).copied().flatten().unwrap_or_else(|| b.none());
    let act_tok = |b: &mut Builder, a: Option<Act>| match a {
        Some(a) => b.leaf(&a.to_string()),
        None => b.none(),
    };
    // ONNX ops.
    if let Some(a) = op.downcast_ref::<activation::ActivationOp>() {
        let f = onnx_activation(a.act)?;
        if !is_float {
            return None;
        }
        return Some(ONode::Act([b.leaf(&f.to_string()), x?]));
    }
    if op.downcast_ref::<activation::ClipOp>().is_some() {
        let facts: Vec<Option<&Fact>> = ch.iter().map(|c| fact_of(b, *c)).collect();
        let f = onnx_activation(activation::ClipOp.constant_activation(&facts)?)?;
        if !is_float {
            return None;
        }
        return Some(ONode::Act([b.leaf(&f.to_string()), x?]));
    }
    if let Some(a) = op.downcast_ref::<arithmetic::BinaryOp>() {
        if a.legacy.is_some() || !is_float || ch.len() != 2 {
            return None;
        }
        let c = [x?, ch[1]?];
        return match a.kind {
            BinaryKind::Add => Some(ONode::Add(c)),
            BinaryKind::Sub => Some(ONode::Sub(c)),
            BinaryKind::Mul => Some(ONode::Mul(c)),
            BinaryKind::Div => Some(ONode::Div(c)),
            BinaryKind::Max => Some(ONode::Max(c)),
            BinaryKind::Min => Some(ONode::Min(c)),
            BinaryKind::Mod { .. } => None,
        };
    }
    // Variadic Sum / Max / Min of two or more inputs are left-folded chains of the binary op
    // (Caffe2 exports write residual additions as `Sum`): the rules then see an ordinary `add`.
    if let Some(v) = op.downcast_ref::<arithmetic::VariadicOp>() {
        let wrap: fn([Id; 2]) -> ONode = match v.kind {
            arithmetic::VariadicKind::Sum => ONode::Add,
            arithmetic::VariadicKind::Max => ONode::Max,
            arithmetic::VariadicKind::Min => ONode::Min,
            arithmetic::VariadicKind::Mean => return None,
        };
        if !is_float || ch.len() < 2 {
            return None;
        }
        let ids: Vec<Id> = ch.iter().copied().collect::<Option<_>>()?;
        let mut acc = ids[0];
        for &c in &ids[1..ids.len() - 1] {
            acc = b.eg.add(wrap([acc, c]));
        }
        return Some(wrap([acc, ids[ids.len() - 1]]));
    }
    // Float concatenations (channel concats of inception/densenet branches) are visible to the
    // layout rules; int64 shape-tensor concats stay opaque.
    if let Some(c) = op.downcast_ref::<crate::ir::ops::indexing::Concat>() {
        let rank = fact_of(b, x)?.rank() as i64;
        let axis = if c.axis < 0 { c.axis + rank } else { c.axis };
        if !is_float || !(0..rank).contains(&axis) || ch.is_empty() {
            return None;
        }
        let mut children = vec![b.leaf(&axis.to_string())];
        for c in ch {
            children.push((*c)?);
        }
        return Some(ONode::Concat(children.into_boxed_slice()));
    }
    if let Some(p) = op.downcast_ref::<arithmetic::PowOp>() {
        let same = fact_of(b, ch.get(1).copied().flatten()).map(|f| f.dtype()) == fact_of(b, x).map(|f| f.dtype());
        if p.legacy.is_some() || !is_float || !same {
            return None;
        }
        return Some(ONode::Pow([x?, ch.get(1).copied().flatten()?]));
    }
    if let Some(u) = op.downcast_ref::<arithmetic::UnaryOp>() {
        let f = match u.kind {
            UnaryKind::Sqrt => Act::Sqrt,
            UnaryKind::Reciprocal => Act::Reciprocal,
            UnaryKind::Exp => Act::Exp,
            UnaryKind::Log => Act::Log,
            UnaryKind::Neg => Act::Neg,
            UnaryKind::Abs => Act::Abs,
            _ => return None,
        };
        if !is_float {
            return None;
        }
        return Some(ONode::Act([b.leaf(&f.to_string()), x?]));
    }
    if op.downcast_ref::<cast::IdentityOp>().is_some() || op.downcast_ref::<cast::DropoutOp>().is_some() {
        return Some(ONode::Identity([x?, b.leaf(&format!("op{ni}"))]));
    }
    if let Some(c) = op.downcast_ref::<conv::Conv>() {
        let xf = fact_of(b, x)?;
        let wf = fact_of(b, ch.get(1).copied().flatten())?;
        if xf.rank() != wf.rank() || !is_float {
            return None;
        }
        // 3-D convolutions (rank 5) have no kernel-level form: they stay opaque, and code
        // generation reports them as unsupported.
        return match xf.rank() {
            4 => {
                let kernel = [wf.shape()[2].as_known()? as usize, wf.shape()[3].as_known()? as usize];
                let geom = resolve_window(&c.window, &xf.shape()[2..], kernel, c.group)?;
                let g = b.leaf(&geom.to_string());
                let bias = opt(b, 2);
                Some(ONode::Conv([x?, ch[1]?, bias, g]))
            }
            3 => {
                let kernel = [1, wf.shape()[2].as_known()? as usize];
                let spatial = [Dim::known(1), xf.shape()[2].clone()];
                let geom = resolve_window(&window_as_2d(&c.window)?, &spatial, kernel, c.group)?;
                let bias = opt(b, 2);
                Some(conv_1d_as_2d(b, x?, ch[1]?, bias, geom))
            }
            _ => None,
        };
    }
    if let Some(gm) = op.downcast_ref::<linalg::Gemm>() {
        if !is_float {
            return None;
        }
        let attrs = k::Gemm { trans_a: gm.trans_a, trans_b: gm.trans_b, alpha: gm.alpha, beta: gm.beta, act: None };
        let at = b.leaf(&gemm_attrs_token(&attrs));
        let (bias, none, act) = (opt(b, 2), b.none(), b.none());
        return Some(ONode::Gemm([x?, ch.get(1).copied().flatten()?, bias, none, at, act]));
    }
    if op.downcast_ref::<linalg::MatMul>().is_some() {
        if !is_float {
            return None;
        }
        let at = b.leaf(&gemm_attrs_token(&k::Gemm::matmul()));
        let (n1, n2) = (b.none(), b.none());
        return Some(ONode::Gemm([x?, ch.get(1).copied().flatten()?, n1, n2, at, n2]));
    }
    if let Some(bn) = op.downcast_ref::<normalization::BatchNorm>() {
        let xf = fact_of(b, x)?.clone();
        if ch.len() != 5 || !is_float || xf.rank() < 2 {
            return None;
        }
        let eps = b.scalar(bn.epsilon, &xf);
        let orig = b.leaf(&format!("op{ni}"));
        return Some(ONode::BatchNorm([x?, ch[1]?, ch[2]?, ch[3]?, ch[4]?, eps, orig]));
    }
    if let Some(ln) = op.downcast_ref::<normalization::LayerNorm>() {
        let xf = fact_of(b, x)?.clone();
        let last = ln.axis == -1 || ln.axis == xf.rank() as i64 - 1;
        if ln.num_outputs != 1 || !last || !is_float {
            return None;
        }
        let eps = b.scalar(ln.epsilon, &xf);
        let bias = opt(b, 2);
        return Some(ONode::LayerNorm([x?, ch.get(1).copied().flatten()?, bias, eps]));
    }
    // Softmax over the last axis: the attention rules look through it. (Before opset 13 the
    // input is coerced to a matrix at `axis`, which is the same thing when `axis` is the last.)
    if let Some(sm) = op.downcast_ref::<crate::ir::ops::softmax::Softmax>() {
        let rank = fact_of(b, x)?.rank() as i64;
        let axis = if sm.axis < 0 { sm.axis + rank } else { sm.axis };
        if sm.log || !is_float || rank == 0 || axis != rank - 1 {
            return None;
        }
        return Some(ONode::Softmax([x?, b.leaf(&format!("op{ni}"))]));
    }
    if let Some(r) = op.downcast_ref::<reduce::Reduce>() {
        let reduce::ReduceAxes::Attr(axes) = &r.axes else { return None };
        if !matches!(r.kind, crate::ir::ops::reduce::ReduceKind::Mean) || axes.is_empty() || !is_float {
            return None;
        }
        let t = b.leaf(&k::ReduceMean { axes: axes.clone(), keepdims: r.keepdims }.token());
        return Some(ONode::ReduceMean([t, x?]));
    }
    if let Some(t) = op.downcast_ref::<shape::Transpose>() {
        let rank = fact_of(b, x)?.rank();
        let perm: Vec<usize> = match &t.perm {
            None => (0..rank).rev().collect(),
            Some(p) => p.iter().map(|&v| usize::try_from(v).ok()).collect::<Option<_>>()?,
        };
        k::Transpose::new(perm.clone()).ok()?;
        let p = b.leaf(&k::Transpose::perm_token(&perm));
        return Some(ONode::Transpose([p, x?]));
    }
    if let Some(f) = op.downcast_ref::<shape::Flatten>() {
        let rank = fact_of(b, x)?.rank() as i64;
        let axis = if f.axis < 0 { f.axis + rank } else { f.axis };
        if !(0..=rank).contains(&axis) {
            return None;
        }
        let a = b.leaf(&axis.to_string());
        return Some(ONode::Flatten([a, x?]));
    }
    if let Some(p) = op.downcast_ref::<pool::Pool>() {
        let xf = fact_of(b, x)?;
        if xf.rank() != 4 || p.kernel.len() != 2 || !is_float {
            return None;
        }
        let kind = match p.kind {
            pool::PoolKind::Max { indices: false, .. } => k::PoolKind::Max,
            pool::PoolKind::Max { .. } => return None,
            pool::PoolKind::Average { count_include_pad } => k::PoolKind::Avg { count_include_pad },
        };
        let kernel = [p.kernel[0], p.kernel[1]];
        let geom = resolve_window(&p.window, &xf.shape()[2..], kernel, 1)?;
        let kp = k::Pool { kind, layout: Layout::Nchw, kernel, geom, ceil_mode: p.window.ceil_mode };
        let t = b.leaf(&kp.token());
        return Some(ONode::Pool([t, x?]));
    }
    if let Some(gp) = op.downcast_ref::<pool::GlobalPool>() {
        let rank4 = fact_of(b, x)?.rank() == 4;
        if gp.max || !rank4 || !is_float {
            return None;
        }
        return Some(ONode::Gap(x?));
    }
    recognise_kernel(b, op, ch, act_tok)
}

/// Kernel-level ops (a graph the optimiser produced, optimised again).
fn recognise_kernel(
    b: &mut Builder,
    op: &dyn crate::ir::Op,
    ch: &[Option<Id>],
    act_tok: impl Fn(&mut Builder, Option<Act>) -> Id,
) -> Option<ONode> {
    let x = ch.first().copied().flatten();
    let opt = |b: &mut Builder, i: usize| ch.get(i).copied().flatten().unwrap_or_else(|| b.none());
    if let Some(c) = op.downcast_ref::<k::Conv2d>() {
        let g = b.leaf(&c.geom.to_string());
        let (bias, res) = (opt(b, 2), opt(b, 3));
        return match c.layout {
            Layout::Nchw if c.act.is_none() && c.pre_act.is_none() && ch.get(3).copied().flatten().is_none() => {
                Some(ONode::Conv([x?, ch[1]?, bias, g]))
            }
            Layout::Nchw => None,
            // The language holds one activation per kconv: before or after the residual add.
            Layout::Nhwc if c.pre_act.is_some() && c.act.is_some() => None,
            Layout::Nhwc => {
                let a = match c.pre_act {
                    Some(f) => b.leaf(&format!("pre:{f}")),
                    None => act_tok(b, c.act),
                };
                Some(ONode::KConv([x?, ch[1]?, bias, res, g, a]))
            }
        };
    }
    if let Some(gm) = op.downcast_ref::<k::Gemm>() {
        let at = b.leaf(&gemm_attrs_token(gm));
        let (bias, res) = (opt(b, 2), opt(b, 3));
        let a = act_tok(b, gm.act);
        return Some(ONode::Gemm([x?, ch.get(1).copied().flatten()?, bias, res, at, a]));
    }
    if let Some(e) = op.downcast_ref::<Elementwise>() {
        return match &e.expr {
            EwExpr::Unary(f, a) if **a == EwExpr::Input(0) => Some(ONode::Act([b.leaf(&f.to_string()), x?])),
            EwExpr::Binary(o, l, r) if **l == EwExpr::Input(0) && **r == EwExpr::Input(1) => {
                let c = [x?, ch.get(1).copied().flatten()?];
                Some(match o {
                    k::BinOp::Add => ONode::Add(c),
                    k::BinOp::Sub => ONode::Sub(c),
                    k::BinOp::Mul => ONode::Mul(c),
                    k::BinOp::Div => ONode::Div(c),
                    k::BinOp::Pow => ONode::Pow(c),
                    k::BinOp::Max => ONode::Max(c),
                    k::BinOp::Min => ONode::Min(c),
                })
            }
            _ => None,
        };
    }
    if let Some(t) = op.downcast_ref::<k::Transpose>() {
        let p = b.leaf(&k::Transpose::perm_token(&t.perm));
        return Some(ONode::Transpose([p, x?]));
    }
    if let Some(f) = op.downcast_ref::<k::Flatten>() {
        let a = b.leaf(&f.axis.to_string());
        return Some(ONode::Flatten([a, x?]));
    }
    if let Some(c) = op.downcast_ref::<k::ChannelView>() {
        let a = b.leaf(&c.trailing_ones.to_string());
        return Some(ONode::Chan([a, x?]));
    }
    if let Some(r) = op.downcast_ref::<k::ReduceMean>() {
        let t = b.leaf(&r.token());
        return Some(ONode::ReduceMean([t, x?]));
    }
    if let Some(p) = op.downcast_ref::<k::Pool>() {
        let t = b.leaf(&p.token());
        return Some(match p.layout {
            Layout::Nchw => ONode::Pool([t, x?]),
            Layout::Nhwc => ONode::PoolNhwc([t, x?]),
        });
    }
    if let Some(g) = op.downcast_ref::<k::GlobalAvgPool>() {
        return Some(match (g.layout, g.flatten) {
            (Layout::Nchw, false) => ONode::Gap(x?),
            (Layout::Nhwc, false) => ONode::GapNhwc(x?),
            (Layout::Nhwc, true) => ONode::GapFlatNhwc(x?),
            (Layout::Nchw, true) => return None,
        });
    }
    if let Some(a) = op.downcast_ref::<k::Attention>() {
        let how = match a.layout {
            k::AttentionLayout::HeadsLast => "mul",
            k::AttentionLayout::HeadsFirst => "mul-bhsd",
            // Strided views are made after extraction and never re-enter an e-graph as such.
            k::AttentionLayout::Strided(_) => return None,
        };
        let qf = fact_of(b, x)?.clone();
        let s = b.scalar(a.scale, &qf);
        let how = b.leaf(how);
        let m = opt(b, 3);
        return Some(ONode::Attention([x?, ch.get(1).copied().flatten()?, ch.get(2).copied().flatten()?, m, s, how]));
    }
    if let Some(se) = op.downcast_ref::<k::SqueezeExciteScale>() {
        let (b1, b2) = (opt(b, 2), opt(b, 4));
        let (act, gate) = (act_tok(b, se.act), act_tok(b, se.gate));
        return Some(ONode::SeScale([
            x?,
            ch.get(1).copied().flatten()?,
            b1,
            act,
            ch.get(3).copied().flatten()?,
            b2,
            gate,
        ]));
    }
    if let Some(l) = op.downcast_ref::<k::LayerNorm>() {
        let xf = fact_of(b, x)?.clone();
        if !(l.axis == -1 || l.axis == xf.rank() as i64 - 1) {
            return None;
        }
        let eps = b.scalar(l.eps, &xf);
        let bias = opt(b, 2);
        return Some(ONode::LayerNorm([x?, ch.get(1).copied().flatten()?, bias, eps]));
    }
    None
}

/// The optimiser's pointwise function for an ONNX activation, when it has one.
fn onnx_activation(a: Activation) -> Option<Act> {
    Some(match a {
        Activation::Relu => Act::Relu,
        Activation::LeakyRelu { alpha } => Act::LeakyRelu { alpha },
        Activation::Sigmoid => Act::Sigmoid,
        Activation::Tanh => Act::Tanh,
        Activation::Clip { min, max } => Act::Clip { lo: min, hi: max },
        Activation::HardSigmoid { alpha, beta } => Act::HardSigmoid { alpha, beta },
        Activation::HardSwish => Act::HardSwish,
        Activation::Gelu { tanh_approx: false } => Act::GeluErf,
        Activation::Gelu { tanh_approx: true } => Act::GeluTanh,
        Activation::Erf => Act::Erf,
        Activation::Elu { alpha } => Act::Elu { alpha },
        _ => return None,
    })
}

/// A 1-D convolution `[N,C,L] * [K,C/g,k]` as the 2-D convolution of the height-1 image
/// `[N,C,1,L]` with the weights `[K,C/g,1,k]`, its `[N,K,1,L']` result viewed back as
/// `[N,K,L']`: `(squeeze [2] (conv (unsqueeze [2] x) w' b geom))`, `w'` the constant weights
/// reshaped here (or `(unsqueeze [2] w)` for weights computed at run time). The views are free,
/// so the 1-D convolution gets every 2-D rewrite (NHWC layout, bias and epilogue fusion) and the
/// 2-D kernels. `geom` is the 2-D geometry with the identity on the height axis
/// ([`window_as_2d`]).
fn conv_1d_as_2d(b: &mut Builder, x: Id, w: Id, bias: Id, geom: ConvGeom) -> ONode {
    let axes = b.leaf(&axes_token(&[2]));
    let x2 = b.eg.add(ONode::Unsqueeze([axes, x]));
    let w2 = match weights_as_2d(b, w) {
        Some(w2) => w2,
        None => b.eg.add(ONode::Unsqueeze([axes, w])),
    };
    let g = b.leaf(&geom.to_string());
    let y = b.eg.add(ONode::Conv([x2, w2, bias, g]));
    ONode::Squeeze([axes, y])
}

/// Constant 1-D conv weights `[K,C/g,k]` as the constant `[K,C/g,1,k]` under the same name, so
/// the generated weights keep the model's names (the analysis would fold an `unsqueeze` of them
/// into an unnamed constant). `None` when `w` is not a named constant.
fn weights_as_2d(b: &mut Builder, w: Id) -> Option<Id> {
    let k = b.eg[w].nodes.iter().find_map(|n| match n {
        ONode::Leaf(s) => match super::language::leaf_kind(s.as_str()) {
            super::language::LeafKind::Const(k) => Some(k),
            _ => None,
        },
        _ => None,
    })?;
    if let Some(&id) = b.weights_2d.get(&k) {
        return Some(id);
    }
    let name = b.eg.analysis.const_names.get(k).cloned().flatten()?;
    let t = b.eg.analysis.consts.get(k)?.clone();
    let [o, i, taps] = *t.shape() else { return None };
    let t2 = t.reshaped(&[o, i, 1, taps])?;
    let c = b.eg.analysis.add_const(Arc::new(t2), Some(name));
    let id = b.leaf(&format!("c{c}"));
    b.weights_2d.insert(k, id);
    Some(id)
}

/// The window of a 1-D convolution over a height-1 image: `kernel_shape`, `strides` and
/// `dilations` get a leading 1, `pads` `[begin, end]` become `[0, begin, 0, end]`. SAME
/// padding needs no change: over a height of 1 with one tap and stride 1 it pads nothing.
/// `None` when an attribute does not have the one value of a 1-D window.
fn window_as_2d(w: &conv::Window) -> Option<conv::Window> {
    let lead_one = |v: &Option<Vec<usize>>| -> Option<Option<Vec<usize>>> {
        match v.as_deref() {
            None => Some(None),
            Some(&[a]) => Some(Some(vec![1, a])),
            Some(_) => None,
        }
    };
    let pads = match w.pads.as_deref() {
        None => None,
        Some(&[begin, end]) => Some(vec![0, begin, 0, end]),
        Some(_) => return None,
    };
    Some(conv::Window {
        kernel: lead_one(&w.kernel)?,
        strides: lead_one(&w.strides)?,
        dilations: lead_one(&w.dilations)?,
        pads,
        auto_pad: w.auto_pad,
        ceil_mode: w.ceil_mode,
    })
}

/// Explicit 2-D window geometry from an ONNX window (resolving `auto_pad` against known
/// spatial sizes); `None` when it cannot be expressed (unknown sizes with SAME padding).
fn resolve_window(w: &conv::Window, spatial: &[Dim], kernel: [usize; 2], group: usize) -> Option<ConvGeom> {
    let strides = w.strides.clone().unwrap_or_else(|| vec![1, 1]);
    let dilations = w.dilations.clone().unwrap_or_else(|| vec![1, 1]);
    if strides.len() != 2 || dilations.len() != 2 || spatial.len() != 2 {
        return None;
    }
    let pads: Vec<usize> = match w.auto_pad {
        conv::AutoPad::NotSet => w.pads.clone().unwrap_or_else(|| vec![0; 4]),
        conv::AutoPad::Valid => vec![0; 4],
        conv::AutoPad::SameUpper | conv::AutoPad::SameLower => {
            let mut begin = [0usize; 2];
            let mut end = [0usize; 2];
            for a in 0..2 {
                let n = spatial[a].as_known()? as usize;
                let out = n.div_ceil(strides[a]);
                let span = dilations[a] * (kernel[a] - 1) + 1;
                let total = ((out - 1) * strides[a] + span).saturating_sub(n);
                let (lo, hi) = if w.auto_pad == conv::AutoPad::SameUpper {
                    (total / 2, total - total / 2)
                } else {
                    (total - total / 2, total / 2)
                };
                begin[a] = lo;
                end[a] = hi;
            }
            vec![begin[0], begin[1], end[0], end[1]]
        }
    };
    if pads.len() != 4 || w.kernel.as_ref().is_some_and(|k| k.len() != 2 || k[0] != kernel[0] || k[1] != kernel[1]) {
        return None;
    }
    Some(ConvGeom {
        strides: [strides[0], strides[1]],
        pads: [pads[0], pads[1], pads[2], pads[3]],
        dilations: [dilations[0], dilations[1]],
        group,
    })
}

#[cfg(test)]
mod tests {
    use crate::egraph::{optimize, OptimizeOptions};
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::kernel::{Conv2d, Layout};
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{Attr, DType, Graph, Tensor, ValueId};
    use crate::lower::cuda::Arch;
    use crate::lower::{cuda::CudaTarget, lower, LowerOptions};
    use crate::validate::inputs::random_tensor;
    use rand::SeedableRng;
    use std::collections::BTreeMap;

    fn seeded(shape: &[usize], seed: u64) -> Tensor {
        random_tensor(DType::F32, shape, &mut rand::rngs::StdRng::seed_from_u64(seed))
    }

    /// `[N,C,L]` input `x`, weights `[K,C/group,k]`, optional bias: one Conv node, then `more`
    /// (e.g. a Relu) on its output. Returns the graph, inferred.
    fn conv_graph(x_shape: &str, w_shape: &[usize], bias: bool, attrs: Vec<(&str, Attr)>, more: &[&str]) -> Graph {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, x_shape);
        let w = b.konst("w", seeded(w_shape, 1));
        let mut ins: Vec<ValueId> = vec![x, w];
        if bias {
            ins.push(b.konst("b", seeded(&[w_shape[0]], 2)));
        }
        let mut y = b.node("Conv", attrs, &ins, 1)[0];
        for op in more {
            y = b.node(op, vec![], &[y], 1)[0];
        }
        b.g.outputs.push(y);
        infer_graph(&mut b.g).expect("the test graph infers");
        b.g
    }

    /// Optimises `g`, checks the result computes what `g` computes (relative to the largest
    /// output, 1e-5) with the symbolic batch bound to 2, and returns it.
    fn optimised_matching(g: &Graph) -> Graph {
        let (opt, report) = optimize(g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        let inputs: BTreeMap<String, Tensor> = g
            .inputs
            .iter()
            .map(|&v| {
                let shape: Vec<usize> = g.ty(v).shape.iter().map(|d| d.as_known().map_or(2, |k| k as usize)).collect();
                (g.values[v].name.clone(), seeded(&shape, 3))
            })
            .collect();
        let want = crate::reference::run(g, &inputs).expect("original runs");
        let got = crate::reference::run(&opt, &inputs).expect("optimised runs");
        let (w, o) = (want[0].1.to_f64_vec(), got[0].1.to_f64_vec());
        assert_eq!(want[0].1.shape(), got[0].1.shape());
        let scale = w.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
        let err = w.iter().zip(&o).fold(0f64, |m, (a, b)| m.max((a - b).abs() / scale));
        assert!(err <= 1e-5, "optimised graph differs by {err:e} (relative)\n{report}");
        opt
    }

    fn kernel_convs(g: &Graph) -> Vec<&Conv2d> {
        g.nodes.iter().filter_map(|n| n.op.downcast_ref::<Conv2d>()).collect()
    }

    fn onnx_convs(g: &Graph) -> usize {
        g.nodes.iter().filter(|n| n.op.downcast_ref::<crate::ir::ops::conv::Conv>().is_some()).count()
    }

    #[test]
    fn conv_1d_runs_as_a_2d_conv_over_a_height_1_image() {
        // onnx_models/conv_1d: pads [2,2], stride 2, bias; here with a symbolic batch.
        let g = conv_graph(
            "N,4,16",
            &[6, 4, 5],
            true,
            vec![("pads", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2]))],
            &[],
        );
        let opt = optimised_matching(&g);
        assert_eq!(onnx_convs(&opt), 0);
        let convs = kernel_convs(&opt);
        assert_eq!(convs.len(), 1);
        // The height axis is the identity: stride 1, no padding, dilation 1.
        assert_eq!(convs[0].geom.to_string(), "s1,2:p0,2,0,2:d1,1:g1");
        let out = opt.ty(opt.outputs[0]);
        assert_eq!(crate::ir::dim::fmt_shape(&out.shape), "[N,6,8]");
    }

    #[test]
    fn conv_1d_grouped_dilated_same_padded_fuses_its_activation() {
        let g = conv_graph(
            "1,4,15",
            &[8, 2, 3],
            false,
            vec![
                ("group", Attr::Int(2)),
                ("dilations", Attr::Ints(vec![2])),
                ("auto_pad", Attr::String("SAME_UPPER".into())),
            ],
            &["Relu"],
        );
        let opt = optimised_matching(&g);
        let convs = kernel_convs(&opt);
        assert_eq!(convs.len(), 1);
        assert_eq!(convs[0].geom.to_string(), "s1,1:p0,2,0,2:d1,2:g2");
        // The squeeze view does not stop the activation from reaching the conv's epilogue.
        assert_eq!(convs[0].layout, Layout::Nhwc);
        assert_eq!(convs[0].act.map(|a| a.to_string()).as_deref(), Some("relu"));
        assert_eq!(op_types(&opt), ["Unsqueeze", "Transpose", "Conv2d", "Transpose", "Squeeze"]);
    }

    /// A residual block of 1-D convs (conv+BN+Relu, conv+BN, + block input, Relu): the BNs fold
    /// into the convs, the activations and the residual add go to the epilogues, and the convs
    /// meet in NHWC, with no view or transpose between them; each squeeze rule fires.
    #[test]
    fn conv_1d_residual_block_fuses_like_2d() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "N,4,10");
        let conv_bn = |b: &mut GraphBuilder, input: ValueId, seed: u64| {
            let w = b.konst("w", seeded(&[4, 4, 3], seed));
            let y = b.node("Conv", vec![("pads", Attr::Ints(vec![1, 1]))], &[input, w], 1)[0];
            let s = b.konst("s", Tensor::from_f32s(&[4], vec![0.5, 1.5, 1.0, 0.8]));
            let t = b.konst("t", seeded(&[4], seed + 1));
            let m = b.konst("m", seeded(&[4], seed + 2));
            let v = b.konst("v", Tensor::from_f32s(&[4], vec![0.7, 1.2, 0.9, 1.1]));
            b.node("BatchNormalization", vec![("epsilon", Attr::Float(1e-5))], &[y, s, t, m, v], 1)[0]
        };
        let h = conv_bn(&mut b, x, 10);
        let h = b.node("Relu", vec![], &[h], 1)[0];
        let y = conv_bn(&mut b, h, 20);
        let y = b.node("Add", vec![], &[y, x], 1)[0];
        let y = b.node("Relu", vec![], &[y], 1)[0];
        b.g.outputs.push(y);
        infer_graph(&mut b.g).expect("infers");
        let (_, report) = optimize(&b.g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
        let opt = optimised_matching(&b.g);
        assert_eq!(op_types(&opt), ["Unsqueeze", "Transpose", "Conv2d", "Conv2d", "Transpose", "Squeeze"], "{report}");
        // The explain report sees through the views: each conv kernel replaces its own nodes.
        let fusions: Vec<(&str, Vec<&str>)> = report
            .fusions
            .iter()
            .map(|f| (f.detail.as_str(), f.onnx_nodes.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            fusions,
            [
                ("conv[nhwc]+bias+relu", vec!["Conv_0", "BatchNormalization_1", "Relu_2"]),
                ("conv[nhwc]+bias+residual+relu", vec!["Conv_3", "BatchNormalization_4", "Add_5", "Relu_6"]),
            ],
            "{report}"
        );
        let fired: BTreeMap<&str, usize> = report
            .phases
            .iter()
            .flat_map(|p| p.rules_applied.iter().map(|(r, n)| (r.as_str(), *n)))
            .filter(|(r, _)| r.starts_with("squeeze-") || r.starts_with("unsqueeze-"))
            .fold(BTreeMap::new(), |mut m, (r, n)| {
                *m.entry(r).or_insert(0) += n;
                m
            });
        for rule in ["squeeze-mul-chan", "squeeze-add-chan", "squeeze-act", "squeeze-add-operand", "unsqueeze-squeeze"]
        {
            assert!(fired.get(rule).copied().unwrap_or(0) > 0, "{rule} did not fire: {fired:?}");
        }
    }

    fn op_types(g: &Graph) -> Vec<&str> {
        g.nodes.iter().map(|n| n.op_type.as_str()).collect()
    }

    #[test]
    fn conv_1d_lowers_to_the_2d_conv_kernel() {
        let g = conv_graph(
            "2,4,16",
            &[6, 4, 5],
            true,
            vec![("pads", Attr::Ints(vec![2, 2])), ("strides", Attr::Ints(vec![2]))],
            &[],
        );
        let opt = optimised_matching(&g);
        let p = lower(&opt, &CudaTarget::new(Arch::Sm90), &LowerOptions::default()).expect("lowers");
        assert!(p.kernels.iter().any(|k| k.template.starts_with("conv2d")), "{:?}", p.kernels);
    }

    #[test]
    fn conv_3d_stays_onnx_and_is_reported_unsupported() {
        let g = conv_graph("1,2,4,5,6", &[3, 2, 2, 2, 2], false, vec![], &[]);
        let opt = optimised_matching(&g);
        assert_eq!(onnx_convs(&opt), 1);
        let err = lower(&opt, &CudaTarget::new(Arch::Sm90), &LowerOptions::default())
            .expect_err("3-D convolutions have no GPU kernel")
            .to_string();
        assert!(err.contains("Conv"), "{err}");
    }
}
