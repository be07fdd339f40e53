//! After extraction, around each fused attention (`kernel::Attention`):
//!
//! - **Operand views.** The layout ops between a projection and the attention (reshapes that
//!   split heads, head transposes, squeezes, the `Gather` of q, k or v out of a packed
//!   `[S, B, 3, E]` projection as `torch.nn.MultiheadAttention` exports it) fold into a strided
//!   view of the projection's output, and the ops between the attention and the next product
//!   (the transpose back, the reshape merging heads) into a view of that product's input
//!   ([`AttentionLayout::Strided`]). None of them runs a kernel.
//! - **Packed projections.** When q, k and v are three products of one input by constant
//!   weights (Hugging Face BERT), the three become one product with the weights concatenated
//!   along N, and the attention reads each operand at its column offset: one launch instead of
//!   three, and a grid three times wider for the small batches that leave most SMs idle.
//!
//! - **Broadcast masks.** An additive mask made by `Expand` (Hugging Face's `[B, 1, S, S]` from
//!   a `[B, 1, 1, S]` padding mask) is read before the expansion: the kernel adds the mask
//!   through broadcast strides, so the expanded copy is never written.
//!
//! - **Row permutations through products.** A transpose that keeps the last axis commutes with
//!   a row-wise product (`T(x)·W = T(x·W)`): `torch.nn.MultiheadAttention` (torchvision ViT)
//!   transposes `[B, S, E]` to `[S, B, E]` before its in-projection and back after its
//!   out-projection. The first transpose moves after the in-projection and the second before the
//!   out-projection, where the attention's views absorb both; the residual add after the
//!   out-projection then fuses into its epilogue. Two transposes and an add fewer per layer.
//!
//! These happen here rather than in rewrite rules: a view spans a chain of any length of layout
//! ops, several of them opaque to the e-graph (`Reshape` reads its target from a constant), and
//! packing makes one new constant of three; neither leaves a choice for extraction to weigh
//! (a view moves no data; a packed product computes the same outputs in one launch).

use super::to_ir::Lowered;
use crate::ir::dim::{product, row_major_strides};
use crate::ir::ops::kernel::{
    Attention, AttentionLayout, BinOp, ChannelView, Elementwise, EwExpr, Flatten as KFlatten, Gemm, OperandOrder,
    OperandView, StridedOperands, Transpose as KTranspose,
};
use crate::ir::ops::{cast::IdentityOp, indexing::Gather, shape};
use crate::ir::{Dim, Graph, Node, Tensor, Value, ValueId, ValueType};
use std::collections::VecDeque;
use std::sync::Arc;

/// A strided view of a contiguous tensor. Each axis is a list of (size, stride) parts, outermost
/// first: a reshape that merges axes whose strides do not line up keeps their parts, so a later
/// reshape can split them again (`[S, B·H, D]` of a `[S, B, H·D]` tensor, then `[B, H, S, D]`).
#[derive(Clone, Debug)]
struct View {
    axes: Vec<Vec<(Dim, Dim)>>,
    offset: Dim,
}

fn one() -> Dim {
    Dim::known(1)
}

/// `a / b` when it is exact.
fn exact_div(a: &Dim, b: &Dim) -> Option<Dim> {
    if *b == Dim::known(0) {
        return None;
    }
    let q = a.div_floor(b);
    (q.mul(b) == *a).then_some(q)
}

impl View {
    fn with_strides(shape: &[Dim], strides: &[Dim], offset: Dim) -> View {
        View { axes: shape.iter().zip(strides).map(|(n, s)| vec![(n.clone(), s.clone())]).collect(), offset }
    }

    fn contiguous(shape: &[Dim]) -> View {
        View::with_strides(shape, &row_major_strides(shape), Dim::known(0))
    }

    fn shape(&self) -> Vec<Dim> {
        self.axes.iter().map(|a| product(&a.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>())).collect()
    }

    fn transpose(&self, perm: &[usize]) -> Option<View> {
        if perm.len() != self.axes.len() {
            return None;
        }
        let axes = perm.iter().map(|&p| self.axes.get(p).cloned()).collect::<Option<Vec<_>>>()?;
        Some(View { axes, offset: self.offset.clone() })
    }

    /// Element `index` of `axis`, the axis removed.
    fn select(&self, axis: usize, index: i64) -> Option<View> {
        let parts: Vec<&(Dim, Dim)> = self.axes.get(axis)?.iter().filter(|(n, _)| *n != one()).collect();
        let offset = match parts.as_slice() {
            [] if index == 0 || index == -1 => self.offset.clone(),
            [(n, s)] => {
                let i = if index < 0 { n.as_known()? + index } else { index };
                if i < 0 || n.as_known().is_some_and(|n| i >= n) {
                    return None;
                }
                self.offset.add(&s.mul(&Dim::known(i)))
            }
            _ => return None,
        };
        let mut axes = self.axes.clone();
        axes.remove(axis);
        Some(View { axes, offset })
    }

    fn reshape(&self, shape: &[Dim]) -> Option<View> {
        let mut parts: VecDeque<(Dim, Dim)> =
            self.axes.iter().flatten().filter(|(n, _)| *n != one()).cloned().collect();
        let mut axes = Vec::with_capacity(shape.len());
        for target in shape {
            let mut need = target.clone();
            let mut axis = Vec::new();
            while need != one() {
                let (n, s) = parts.pop_front()?;
                if n == need {
                    axis.push((n, s));
                    need = one();
                } else if let Some(rest) = exact_div(&need, &n) {
                    // The part fits whole; the axis needs `rest` more elements from the next.
                    axis.push((n, s));
                    need = rest;
                } else if let Some(inner) = exact_div(&n, &need) {
                    // Split the part: its outer `need` elements here, the inner ones next.
                    axis.push((need.clone(), s.mul(&inner)));
                    parts.push_front((inner, s));
                    need = one();
                } else {
                    return None;
                }
            }
            axes.push(axis);
        }
        parts.is_empty().then(|| View { axes, offset: self.offset.clone() })
    }

    /// One stride per axis (0 for a size-1 axis), when each axis's parts merge into one.
    fn strides(&self) -> Option<Vec<Dim>> {
        self.axes
            .iter()
            .map(|axis| {
                let parts: Vec<&(Dim, Dim)> = axis.iter().filter(|(n, _)| *n != one()).collect();
                let (mut size, stride) = match parts.last() {
                    None => return Some(Dim::known(0)),
                    Some((n, s)) => (n.clone(), s.clone()),
                };
                for (n, s) in parts.iter().rev().skip(1) {
                    if *s != size.mul(&stride) {
                        return None;
                    }
                    size = size.mul(n);
                }
                Some(stride)
            })
            .collect()
    }
}

/// A layout op: moves no data, so a view can absorb it.
#[derive(Clone, Debug)]
enum LayoutOp {
    /// To this shape (Reshape, Flatten, Squeeze, Unsqueeze, Identity).
    Reshape(Vec<Dim>),
    Transpose(Vec<usize>),
    /// Element `index` of `axis`, the axis dropped (Gather of one constant index).
    Select {
        axis: usize,
        index: i64,
    },
}

impl LayoutOp {
    fn apply(&self, v: &View) -> Option<View> {
        match self {
            LayoutOp::Reshape(s) => v.reshape(s),
            LayoutOp::Transpose(p) => v.transpose(p),
            LayoutOp::Select { axis, index } => v.select(*axis, *index),
        }
    }
}

/// The layout ops `node` is, in order, or None when it computes something.
fn layout_ops(g: &Graph, node: &Node) -> Option<Vec<LayoutOp>> {
    let x = node.inputs.first().copied().flatten()?;
    let (in_ty, out_ty) = (g.values[x].ty.as_ref()?, g.values[*node.outputs.first()?].ty.as_ref()?);
    if in_ty.dtype != out_ty.dtype || node.outputs.len() != 1 {
        return None;
    }
    let op = node.op.as_any();
    let out = out_ty.shape.clone();
    if op.is::<shape::Reshape>()
        || op.is::<shape::Flatten>()
        || op.is::<shape::Squeeze>()
        || op.is::<shape::Unsqueeze>()
        || op.is::<IdentityOp>()
        || op.is::<KFlatten>()
        || op.is::<ChannelView>()
    {
        return Some(vec![LayoutOp::Reshape(out)]);
    }
    let rank = in_ty.shape.len();
    if let Some(t) = op.downcast_ref::<KTranspose>() {
        return Some(vec![LayoutOp::Transpose(t.perm.clone())]);
    }
    if let Some(t) = op.downcast_ref::<shape::Transpose>() {
        let perm = match &t.perm {
            None => (0..rank).rev().collect(),
            Some(p) => p
                .iter()
                .map(|&a| usize::try_from(if a < 0 { a + rank as i64 } else { a }).ok())
                .collect::<Option<_>>()?,
        };
        return Some(vec![LayoutOp::Transpose(perm)]);
    }
    if let Some(gather) = op.downcast_ref::<Gather>() {
        let idx = g.values[node.inputs.get(1).copied().flatten()?].konst.as_ref()?;
        let axis = usize::try_from(if gather.axis < 0 { gather.axis + rank as i64 } else { gather.axis }).ok()?;
        if idx.len() != 1 || idx.rank() > 1 {
            return None;
        }
        let index = *idx.to_i64_vec().first()?;
        return Some(vec![LayoutOp::Select { axis, index }, LayoutOp::Reshape(out)]);
    }
    None
}

fn shape_of(g: &Graph, v: ValueId) -> Option<Vec<Dim>> {
    g.values[v].ty.as_ref().map(|t| t.shape.clone())
}

/// Where an attention operand lives: `base` read through `view`.
struct Operand {
    base: ValueId,
    view: OperandView,
    order: OperandOrder,
    /// The layout ops from `base` to the operand, to re-derive the view in a packed product.
    ops: Vec<LayoutOp>,
    /// The nodes of those ops.
    nodes: Vec<usize>,
}

/// The operand view of a final view in `order`, when each axis has one stride.
fn operand_view(v: &View, order: OperandOrder) -> Option<OperandView> {
    let st = v.strides()?;
    let [b, x, y, z]: [Dim; 4] = st.try_into().ok()?;
    let offset = v.offset.clone();
    Some(match order {
        OperandOrder::Bshd => OperandView { offset, batch: b, seq: x, head: y, dim: z },
        OperandOrder::Bhsd => OperandView { offset, batch: b, head: x, seq: y, dim: z },
        OperandOrder::Bhds => OperandView { offset, batch: b, head: x, dim: y, seq: z },
    })
}

/// Follows `v` back through layout ops and returns the farthest base it is a view of.
fn trace_operand(g: &Graph, producers: &[Option<usize>], v: ValueId, order: OperandOrder) -> Option<Operand> {
    // values[0] is the farthest base; ops[i] leads from values[i] to values[i + 1].
    let mut values = vec![v];
    let mut ops: Vec<Vec<LayoutOp>> = Vec::new();
    let mut nodes = Vec::new();
    let mut cur = v;
    while let Some(p) = producers[cur] {
        let node = &g.nodes[p];
        let Some(op) = layout_ops(g, node) else { break };
        let x = node.inputs[0]?;
        values.push(x);
        ops.push(op);
        nodes.push(p);
        cur = x;
    }
    values.reverse();
    ops.reverse();
    nodes.reverse();
    for start in 0..values.len() {
        let chain: Vec<LayoutOp> = ops[start..].iter().flatten().cloned().collect();
        let mut view = View::contiguous(&shape_of(g, values[start])?);
        let mut ok = true;
        for op in &chain {
            match op.apply(&view) {
                Some(next) => view = next,
                None => {
                    ok = false;
                    break;
                }
            }
        }
        if ok {
            if let Some(ov) = operand_view(&view, order) {
                return Some(Operand {
                    base: values[start],
                    view: ov,
                    order,
                    ops: chain,
                    nodes: nodes[start..].to_vec(),
                });
            }
        }
    }
    None
}

/// The output side: the single-reader chain of reshapes and transposes after the attention's
/// output, and the view of the attention output inside its end. Returns (end value, view,
/// chain nodes).
fn trace_output(
    g: &Graph,
    consumers: &[Vec<usize>],
    out: ValueId,
    order: OperandOrder,
) -> Option<(ValueId, OperandView, Vec<usize>)> {
    let mut values = vec![out];
    let mut nodes = Vec::new();
    let mut ops = Vec::new();
    let mut cur = out;
    while !g.outputs.contains(&cur) && consumers[cur].len() == 1 {
        let c = consumers[cur][0];
        let node = &g.nodes[c];
        if node.inputs.first().copied().flatten() != Some(cur) {
            break;
        }
        let Some(op) = layout_ops(g, node) else { break };
        if op.iter().any(|o| matches!(o, LayoutOp::Select { .. })) {
            break;
        }
        nodes.push(c);
        ops.push(op);
        cur = node.outputs[0];
        values.push(cur);
    }
    for end in (0..values.len()).rev() {
        // The attention output as a view of values[end]: undo the chain from its end.
        let mut view = View::contiguous(&shape_of(g, values[end])?);
        let mut ok = true;
        for i in (0..end).rev() {
            for op in ops[i].iter().rev() {
                let inverse = match op {
                    LayoutOp::Reshape(_) => LayoutOp::Reshape(shape_of(g, values[i])?),
                    LayoutOp::Transpose(p) => {
                        let mut inv = vec![0; p.len()];
                        for (a, &b) in p.iter().enumerate() {
                            *inv.get_mut(b)? = a;
                        }
                        LayoutOp::Transpose(inv)
                    }
                    LayoutOp::Select { .. } => return None,
                };
                match inverse.apply(&view) {
                    Some(next) => view = next,
                    None => ok = false,
                }
                if !ok {
                    break;
                }
            }
            if !ok {
                break;
            }
        }
        if ok && view.shape() == shape_of(g, out)? {
            if let Some(ov) = operand_view(&view, order) {
                return Some((values[end], ov, nodes[..end].to_vec()));
            }
        }
    }
    None
}

/// Three products of one input by constant weights, the same epilogue and no residual: the
/// pieces of one packed product.
fn packable(g: &Graph, gemms: &[&Node]) -> bool {
    let Some(first) = gemms.first() else { return false };
    let Some(f) = first.op.downcast_ref::<Gemm>() else { return false };
    let konst = |v: Option<ValueId>| v.and_then(|v| g.values[v].konst.clone());
    gemms.iter().all(|n| {
        let Some(o) = n.op.downcast_ref::<Gemm>() else { return false };
        let w = konst(n.inputs.get(1).copied().flatten());
        let bias = n.inputs.get(2).copied().flatten();
        let first_bias = first.inputs.get(2).copied().flatten();
        o == f
            && n.inputs.first() == first.inputs.first()
            && n.inputs.get(3).copied().flatten().is_none()
            && w.as_ref().is_some_and(|w| w.rank() == 2)
            && bias.is_some() == first_bias.is_some()
            && bias.is_none_or(|b| konst(Some(b)).is_some_and(|t| t.rank() == 1))
    })
}

/// The N axis of a packable product's weight.
fn n_axis(g: &Graph, gemm: usize) -> Option<usize> {
    Some(if g.nodes[gemm].op.downcast_ref::<Gemm>()?.trans_b { 0 } else { 1 })
}

/// The output shape of the packed product of `gemm_nodes` and each piece's column offset.
fn packed_layout(g: &Graph, gemm_nodes: &[usize]) -> Option<(Vec<Dim>, Vec<Dim>)> {
    let axis = n_axis(g, gemm_nodes[0])?;
    let mut offsets = Vec::new();
    let mut n_total = 0i64;
    for &i in gemm_nodes {
        let w = g.values[g.nodes[i].inputs[1]?].konst.clone()?;
        offsets.push(Dim::known(n_total));
        n_total += *w.shape().get(axis)? as i64;
    }
    let mut shape = shape_of(g, g.nodes[gemm_nodes[0]].outputs[0])?;
    *shape.last_mut()? = Dim::known(n_total);
    Some((shape, offsets))
}

/// Makes one product of `gemm_nodes` (packable): the node of the first one, its weight and
/// bias the concatenation along N. Returns the packed output value.
fn pack(g: &mut Graph, gemm_nodes: &[usize]) -> Option<ValueId> {
    let n_axis = n_axis(g, gemm_nodes[0])?;
    let (out_shape, _) = packed_layout(g, gemm_nodes)?;
    let first = &g.nodes[gemm_nodes[0]];
    let mut weights = Vec::new();
    let mut biases = Vec::new();
    for &i in gemm_nodes {
        let node = &g.nodes[i];
        weights.push(g.values[node.inputs[1]?].konst.clone()?);
        if let Some(b) = node.inputs.get(2).copied().flatten() {
            biases.push(g.values[b].konst.clone()?);
        }
    }
    let w_refs: Vec<&Tensor> = weights.iter().map(|w| w.as_ref()).collect();
    let w = crate::reference::indexing::concat_tensors(&w_refs, n_axis).ok()?;
    let b = if biases.is_empty() {
        None
    } else {
        let refs: Vec<&Tensor> = biases.iter().map(|b| b.as_ref()).collect();
        Some(crate::reference::indexing::concat_tensors(&refs, 0).ok()?)
    };
    let out_old = first.outputs[0];
    let dtype = g.values[out_old].ty.as_ref()?.dtype;
    let name = first.name.clone();
    let add = |g: &mut Graph, suffix: &str, ty: ValueType, konst: Option<Tensor>| -> ValueId {
        let mut n = format!("{name}.{suffix}");
        while g.value_named(&n).is_some() {
            n.push('_');
        }
        g.values.push(Value { name: n, ty: Some(ty), konst: konst.map(Arc::new), sym: None });
        g.values.len() - 1
    };
    let w_shape = w.shape().iter().map(|&d| Dim::known(d as i64)).collect();
    let wv = add(g, "packed_weight", ValueType::new(w.dtype(), w_shape), Some(w));
    let bv = b.map(|b| {
        let ty = ValueType::new(b.dtype(), vec![Dim::known(b.len() as i64)]);
        add(g, "packed_bias", ty, Some(b))
    });
    let out = add(g, "packed", ValueType::new(dtype, out_shape), None);
    let node = &mut g.nodes[gemm_nodes[0]];
    node.inputs[1] = Some(wv);
    if let Some(slot) = node.inputs.get_mut(2) {
        *slot = bv;
    }
    node.outputs = vec![out];
    Some(out)
}

/// Rewrites every fused attention of `low` to strided views (and packs its projections where
/// it can), then drops the nodes nothing reads any more.
pub fn fold_attention_views(low: &mut Lowered) {
    let names: Vec<String> =
        low.graph.nodes.iter().filter(|n| n.op.downcast_ref::<Attention>().is_some()).map(|n| n.name.clone()).collect();
    for name in &names {
        let find = |low: &Lowered| low.graph.nodes.iter().position(|n| &n.name == name);
        if let Some(ai) = find(low) {
            transposes_after_projections(low, ai);
        }
        if let Some(ai) = find(low) {
            transposes_before_out_projection(low, ai);
        }
    }
    for name in names {
        let Some(ai) = low.graph.nodes.iter().position(|n| n.name == name) else { continue };
        for e in mask_before_expand(&mut low.graph, ai) {
            low.absorbed.push((low.node_class[e], low.node_class[ai]));
        }
        if let Some((drop, absorbed)) = fold_one(&mut low.graph, ai) {
            for (from, to) in absorbed {
                low.absorbed.push((low.node_class[from], low.node_class[to]));
            }
            // The packed-away products and the output chain: their values come from elsewhere now.
            let keep: Vec<bool> = (0..low.graph.nodes.len()).map(|i| !drop.contains(&i)).collect();
            retain_nodes(low, &keep);
        }
    }
    // Whatever nobody reads any more (the layout chains before the operands).
    let keep = low.graph.live_nodes();
    retain_nodes(low, &keep);
}

/// A product whose rows are the rows of its A operand: A not transposed, B a constant matrix,
/// no residual (a residual would need the same permutation), any bias per column.
fn row_wise_gemm(g: &Graph, n: usize) -> bool {
    let node = &g.nodes[n];
    let Some(gemm) = node.op.downcast_ref::<Gemm>() else { return false };
    let b = node.inputs.get(1).copied().flatten();
    let bias_ok = match node.inputs.get(2).copied().flatten() {
        None => true,
        Some(v) => shape_of(g, v).is_some_and(|s| s.iter().rev().skip(1).all(|d| *d == one())),
    };
    !gemm.trans_a
        && b.is_some_and(|b| g.values[b].konst.is_some() && shape_of(g, b).is_some_and(|s| s.len() == 2))
        && bias_ok
        && node.inputs.get(3).copied().flatten().is_none()
}

/// The permutation of a transpose node that keeps the last axis in place (it permutes rows).
fn row_permutation(node: &Node) -> Option<Vec<usize>> {
    let perm = node.op.downcast_ref::<KTranspose>()?.perm.clone();
    (perm.last() == Some(&(perm.len() - 1))).then_some(perm)
}

/// Whether every reader of `v`, through chains of layout ops, is an attention (so a transpose
/// put on `v` is absorbed into the attention's views rather than run).
fn read_only_by_attentions(g: &Graph, consumers: &[Vec<usize>], v: ValueId) -> bool {
    let mut todo = vec![v];
    while let Some(v) = todo.pop() {
        if g.outputs.contains(&v) || consumers[v].is_empty() {
            return false;
        }
        for &c in &consumers[v] {
            let node = &g.nodes[c];
            if node.op.downcast_ref::<Attention>().is_some() && node.inputs.iter().take(3).any(|&i| i == Some(v)) {
                continue;
            }
            if layout_ops(g, node).is_none() {
                return false;
            }
            todo.push(node.outputs[0]);
        }
    }
    true
}

/// Inserts `node` (computing class `class`) at `at`, keeping classes aligned.
fn insert_node(low: &mut Lowered, at: usize, node: Node, class: egg::Id) {
    low.graph.nodes.insert(at, node);
    low.node_class.insert(at, class);
}

fn remove_node(low: &mut Lowered, at: usize) {
    low.graph.nodes.remove(at);
    low.node_class.remove(at);
}

/// Input side: for each q/k/v of attention `ai` computed by a row-wise product of a row
/// permutation `T(x)` read by nothing else, computes the product on `x` and puts `T` after it,
/// where the attention's operand views absorb it (`fold_one`).
fn transposes_after_projections(low: &mut Lowered, ai: usize) {
    let name = low.graph.nodes[ai].name.clone();
    for slot in 0..3 {
        let g = &low.graph;
        let Some(ai) = g.nodes.iter().position(|n| n.name == name) else { return };
        let producers = g.producers();
        let consumers = g.consumers();
        let Some(mut v) = g.nodes[ai].inputs.get(slot).copied().flatten() else { continue };
        // Back through the operand's layout ops to the product.
        while let Some(p) = producers[v] {
            if layout_ops(g, &g.nodes[p]).is_none() {
                break;
            }
            let Some(x) = g.nodes[p].inputs[0] else { break };
            v = x;
        }
        let Some(gi) = producers[v].filter(|&p| row_wise_gemm(g, p)) else { continue };
        let Some(a) = g.nodes[gi].inputs[0] else { continue };
        let Some(ti) = producers[a] else { continue };
        if row_permutation(&g.nodes[ti]).is_none() {
            continue;
        }
        let Some(x) = g.nodes[ti].inputs[0] else { continue };
        if consumers[a].len() != 1 || g.outputs.contains(&a) || !read_only_by_attentions(g, &consumers, v) {
            continue;
        }
        let (Some(xs), Some(ys), Some(dtype)) =
            (shape_of(g, x), shape_of(g, v), g.values[v].ty.as_ref().map(|t| t.dtype))
        else {
            continue;
        };
        let mut unpermuted = xs.clone();
        *unpermuted.last_mut().expect("a row permutation has rank >= 1") = ys.last().cloned().unwrap_or_else(one);
        let rows = low
            .graph
            .add_value(format!("{}/unpermuted", low.graph.values[v].name), Some(ValueType::new(dtype, unpermuted)));
        let gemm = &mut low.graph.nodes[gi];
        gemm.inputs[0] = Some(x);
        gemm.outputs = vec![rows];
        let mut t = low.graph.nodes[ti].clone();
        t.name = format!("{}/after_{}", t.name, low.graph.nodes[gi].name);
        t.inputs = vec![Some(rows)];
        t.outputs = vec![v];
        let class = low.node_class[ti];
        insert_node(low, gi + 1, t, class);
        remove_node(low, ti);
    }
}

/// Output side: when the product reading attention `ai`'s output is row-wise and its result is
/// only reshaped (rows regrouped) and row-permuted, the reshapes and the permutation move before
/// the product, where the attention's output view absorbs them; a residual add of the permuted
/// result then fuses into the product's epilogue.
fn transposes_before_out_projection(low: &mut Lowered, ai: usize) {
    let g = &low.graph;
    let consumers = g.consumers();
    // Forward from the attention output through its layout chain to the product.
    let mut v = g.nodes[ai].outputs[0];
    let gi = loop {
        let [c] = consumers[v][..] else { return };
        if g.outputs.contains(&v) {
            return;
        }
        if row_wise_gemm(g, c) && g.nodes[c].inputs[0] == Some(v) {
            break c;
        }
        if layout_ops(g, &g.nodes[c]).is_none() {
            return;
        }
        v = g.nodes[c].outputs[0];
    };
    let a = v;
    let (Some(a_shape), Some(dtype)) = (shape_of(g, a), g.values[a].ty.as_ref().map(|t| t.dtype)) else { return };
    let k = a_shape.last().cloned().unwrap_or_else(one);
    // After the product: single-reader reshapes keeping the last axis, then a row permutation.
    let mut chain = Vec::new();
    let mut w = g.nodes[gi].outputs[0];
    let (ti, perm) = loop {
        let [c] = consumers[w][..] else { return };
        if g.outputs.contains(&w) {
            return;
        }
        let node = &g.nodes[c];
        if let Some(perm) = row_permutation(node) {
            break (c, perm);
        }
        let (Some(ws), Some(os)) = (shape_of(g, w), shape_of(g, node.outputs[0])) else { return };
        let keeps_rows_apart = node.op.downcast_ref::<shape::Reshape>().is_some() && ws.last() == os.last();
        if !keeps_rows_apart {
            return;
        }
        chain.push(c);
        w = node.outputs[0];
    };
    let z = g.nodes[ti].outputs[0];
    // Rebuild the chain on A: same row shapes, A's last axis.
    let mut nodes = Vec::new();
    let mut cur = a;
    for &c in &chain {
        let Some(mut rows) = shape_of(&low.graph, low.graph.nodes[c].outputs[0]) else { return };
        *rows.last_mut().expect("rank >= 1") = k.clone();
        let target: Option<Vec<i64>> = {
            let unknown = rows.iter().filter(|d| !d.is_known()).count();
            (unknown <= 1).then(|| rows.iter().map(|d| d.as_known().unwrap_or(-1)).collect())
        };
        let Some(target) = target else { return };
        let out = low.graph.add_value(
            format!("{}/rows", low.graph.values[low.graph.nodes[c].outputs[0]].name),
            Some(ValueType::new(dtype, rows)),
        );
        let node = Node {
            name: format!("{}/before_{}", low.graph.nodes[c].name, low.graph.nodes[gi].name),
            op_type: "Reshape".into(),
            domain: String::new(),
            op: Box::new(shape::Reshape { allowzero: false, attr_shape: Some(target) }),
            inputs: vec![Some(cur)],
            outputs: vec![out],
        };
        nodes.push((node, low.node_class[c]));
        cur = out;
    }
    let Some(cur_shape) = shape_of(&low.graph, cur) else { return };
    if cur_shape.len() != perm.len() {
        return;
    }
    let permuted: Vec<Dim> = perm.iter().map(|&p| cur_shape[p].clone()).collect();
    let pv = low.graph.add_value(format!("{}/rows", low.graph.values[z].name), Some(ValueType::new(dtype, permuted)));
    let mut t = low.graph.nodes[ti].clone();
    t.name = format!("{}/before_{}", t.name, low.graph.nodes[gi].name);
    t.inputs = vec![Some(cur)];
    t.outputs = vec![pv];
    nodes.push((t, low.node_class[ti]));
    // The product reads the permuted rows and writes what the permutation wrote.
    low.graph.nodes[gi].inputs[0] = Some(pv);
    low.graph.nodes[gi].outputs = vec![z];
    // Remove the old chain and permutation (after the product), then insert the new ones before it.
    let mut old: Vec<usize> = chain.clone();
    old.push(ti);
    old.sort_unstable();
    for &i in old.iter().rev() {
        remove_node(low, i);
    }
    for (i, (node, class)) in nodes.into_iter().enumerate() {
        insert_node(low, gi + i, node, class);
    }
    residual_into_product(low, z);
}

/// Fuses `add(z, r)` (a two-input elementwise add, in either order) into the product writing
/// `z` as its residual, when the product has none and no activation, `z` has no other reader and
/// `r` is ready before the product runs.
fn residual_into_product(low: &mut Lowered, z: ValueId) {
    let g = &low.graph;
    let producers = g.producers();
    let consumers = g.consumers();
    let Some(gi) = producers[z] else { return };
    let [ei] = consumers[z][..] else { return };
    if g.outputs.contains(&z) {
        return;
    }
    let Some(gemm) = g.nodes[gi].op.downcast_ref::<Gemm>() else { return };
    if gemm.act.is_some() || g.nodes[gi].inputs.get(3).copied().flatten().is_some() {
        return;
    }
    let Some(ew) = g.nodes[ei].op.downcast_ref::<Elementwise>() else { return };
    let is_add = ew.num_inputs == 2
        && matches!(&ew.expr, EwExpr::Binary(BinOp::Add, l, r)
            if matches!((&**l, &**r), (EwExpr::Input(0), EwExpr::Input(1)) | (EwExpr::Input(1), EwExpr::Input(0))));
    if !is_add {
        return;
    }
    let Some(r) = g.nodes[ei].inputs.iter().flatten().copied().find(|&v| v != z) else { return };
    if g.nodes[ei].inputs.iter().filter(|&&v| v == Some(z)).count() != 1 || shape_of(g, r) != shape_of(g, z) {
        return;
    }
    if producers[r].is_some_and(|p| p > gi) {
        return;
    }
    let out = g.nodes[ei].outputs[0];
    let node = &mut low.graph.nodes[gi];
    while node.inputs.len() < 4 {
        node.inputs.push(None);
    }
    node.inputs[3] = Some(r);
    node.outputs = vec![out];
    low.absorbed.push((low.node_class[ei], low.node_class[gi]));
    remove_node(low, ei);
}

/// Points attention `ai`'s mask at the input of the `Expand`s that made it (the kernel adds the
/// mask through broadcast strides, so reading it unexpanded gives the same sums). Returns the
/// `Expand` nodes looked through.
fn mask_before_expand(g: &mut Graph, ai: usize) -> Vec<usize> {
    let producers = g.producers();
    let mut through = Vec::new();
    while let Some(m) = g.nodes[ai].inputs.get(3).copied().flatten() {
        let Some(e) = producers[m] else { break };
        let en = &g.nodes[e];
        if en.domain != "" || en.op.downcast_ref::<shape::Expand>().is_none() {
            break;
        }
        let Some(x) = en.inputs[0] else { break };
        let (Some(xs), Some(ms)) = (shape_of(g, x), shape_of(g, m)) else { break };
        // Right-aligned, every axis of x is 1 or the expanded extent: a broadcast of the same
        // values (Expand's own check; repeated so a malformed node is left alone).
        let fits = xs.len() <= ms.len() && xs.iter().rev().zip(ms.iter().rev()).all(|(a, b)| *a == one() || a == b);
        if !fits {
            break;
        }
        g.nodes[ai].inputs[3] = Some(x);
        through.push(e);
    }
    through
}

/// Keeps the nodes marked in `keep` (and their classes, index-aligned with them).
fn retain_nodes(low: &mut Lowered, keep: &[bool]) {
    let mut k = keep.iter();
    low.graph.nodes.retain(|_| *k.next().unwrap_or(&true));
    let mut k = keep.iter();
    low.node_class.retain(|_| *k.next().unwrap_or(&true));
}

/// What folding one attention did: the nodes that must go, and (node, node now doing its work).
type Folded = (Vec<usize>, Vec<(usize, usize)>);

/// Rewrites attention node `ai`; returns the nodes that must go (their outputs are computed
/// elsewhere now) and (node, node now doing its work) pairs for reports, or None when nothing
/// folds.
fn fold_one(g: &mut Graph, ai: usize) -> Option<Folded> {
    let att = g.nodes[ai].op.downcast_ref::<Attention>()?.clone();
    // Orders of q, k, v and the output.
    let orders = match att.layout {
        AttentionLayout::HeadsLast => [OperandOrder::Bshd; 4],
        AttentionLayout::HeadsFirst => [OperandOrder::Bhsd, OperandOrder::Bhds, OperandOrder::Bhsd, OperandOrder::Bhsd],
        AttentionLayout::Strided(_) => return None,
    };
    let producers = g.producers();
    let consumers = g.consumers();
    let ins: Vec<ValueId> = (0..3).map(|i| g.nodes[ai].inputs.get(i).copied().flatten()).collect::<Option<_>>()?;
    let shapes: Vec<Vec<Dim>> = ins.iter().map(|&v| shape_of(g, v)).collect::<Option<_>>()?;
    let mut operands: Vec<Operand> =
        ins.iter().zip(orders).map(|(&v, order)| trace_operand(g, &producers, v, order)).collect::<Option<_>>()?;
    let out = g.nodes[ai].outputs[0];
    let (end, o_view, out_chain) = match trace_output(g, &consumers, out, orders[3]) {
        Some(t) => t,
        None => (out, operand_view(&View::contiguous(&shape_of(g, out)?), orders[3])?, Vec::new()),
    };
    let mut drop = out_chain.clone();
    // The layout nodes fold into the attention's views (those with other readers stay).
    let mut absorbed: Vec<(usize, usize)> = out_chain.iter().map(|&n| (n, ai)).collect();
    absorbed.extend(operands.iter().flat_map(|o| o.nodes.iter().map(|&n| (n, ai))));

    // Three distinct single-reader products of one input: pack them.
    let gemm_of = |v: ValueId| producers[v].filter(|&p| g.nodes[p].op.downcast_ref::<Gemm>().is_some());
    let gemms: Vec<Option<usize>> = operands.iter().map(|o| gemm_of(o.base)).collect();
    // Packing replaces the pieces' outputs: only when nothing but this attention reads them,
    // directly or through the chain of layout ops (a value along it with another reader would
    // lose its producer).
    let private = |v: ValueId| consumers[v].len() == 1 && !g.outputs.contains(&v);
    let single_reader =
        |o: &Operand| private(o.base) && o.nodes.iter().all(|&n| g.nodes[n].outputs.iter().all(|&v| private(v)));
    if let [Some(a), Some(b), Some(c)] = gemms[..] {
        let nodes = [&g.nodes[a], &g.nodes[b], &g.nodes[c]];
        if a != b && b != c && a != c && operands.iter().all(single_reader) && packable(g, &nodes) {
            if let Some((packed_shape, offsets)) = packed_layout(g, &[a, b, c]) {
                let strides = row_major_strides(&packed_shape);
                let mut views = Vec::new();
                for (o, off) in operands.iter().zip(&offsets) {
                    let piece_shape = shape_of(g, o.base)?;
                    let mut view = Some(View::with_strides(&piece_shape, &strides, off.clone()));
                    for op in &o.ops {
                        view = view.and_then(|v| op.apply(&v));
                    }
                    views.push(view.and_then(|v| operand_view(&v, o.order)));
                }
                // The same ops on the packed strides fail where a reshape merged a piece's rows
                // (a packed row is wider than the piece's): then the pieces stay separate.
                let views: Option<Vec<OperandView>> = views.into_iter().collect();
                if let Some((views, packed)) = views.and_then(|v| Some((v, pack(g, &[a, b, c])?))) {
                    for (o, v) in operands.iter_mut().zip(views) {
                        o.base = packed;
                        o.view = v;
                    }
                    // `pack` rewrote q's product; it moves to the earliest of the three (its
                    // inputs, A and constants, are ready there) and the other two go.
                    let first = a.min(b).min(c);
                    if a != first {
                        g.nodes[first] = g.nodes[a].clone();
                    }
                    drop.extend([a, b, c].into_iter().filter(|&x| x != first));
                    absorbed.extend([a, b, c].into_iter().filter(|&x| x != first).map(|x| (x, first)));
                }
            }
        }
    }
    let nothing_folded = out_chain.is_empty() && operands.iter().zip(&ins).all(|(o, &v)| o.base == v);
    if nothing_folded {
        return (!drop.is_empty()).then_some((drop, absorbed));
    }
    let [b, h, sq, sk]: [Dim; 4] = att.scores_shape(&shapes[0], &shapes[1], &shapes[2]).ok()?.try_into().ok()?;
    let (d, dv) = (shapes[0][3].clone(), shapes[2][3].clone());
    let st = StridedOperands {
        batch: b,
        heads: h,
        sq,
        sk,
        d,
        dv,
        q: operands[0].view.clone(),
        k: operands[1].view.clone(),
        v: operands[2].view.clone(),
        o: o_view,
        inputs: [shape_of(g, operands[0].base)?, shape_of(g, operands[1].base)?, shape_of(g, operands[2].base)?],
        out_shape: shape_of(g, end)?,
    };
    let node = &mut g.nodes[ai];
    node.op = Box::new(Attention { scale: att.scale, layout: AttentionLayout::Strided(Box::new(st)) });
    for (i, o) in operands.iter().enumerate() {
        node.inputs[i] = Some(o.base);
    }
    node.outputs = vec![end];
    Some((drop, absorbed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: i64) -> Dim {
        Dim::known(v)
    }
    fn n() -> Dim {
        Dim::sym("batch")
    }

    /// ViT's q: `[S, B, 3E]` → `[S, B, 3, E]` → select q → `[S, B·H, D]` → `[B·H, S, D]` →
    /// `[B, H, S, D]`: the batch·heads axis keeps its two parts until they split again.
    #[test]
    fn packed_heads_first_operand() {
        let (s, e, h, hd) = (17, 64, 4, 16);
        let v = View::contiguous(&[d(s), n(), d(3 * e)]);
        let v = v.reshape(&[d(s), n(), d(3), d(e)]).unwrap();
        let v = v.transpose(&[2, 0, 1, 3]).unwrap().select(0, 1).unwrap();
        let v = v.reshape(&[d(s), n().mul(&d(h)), d(hd)]).unwrap();
        assert!(v.strides().is_none(), "batch·heads does not merge into one stride");
        let v = v.transpose(&[1, 0, 2]).unwrap().reshape(&[n(), d(h), d(s), d(hd)]).unwrap();
        let ov = operand_view(&v, OperandOrder::Bhsd).unwrap();
        assert_eq!(ov, OperandView { offset: d(e), batch: d(3 * e), seq: n().mul(&d(3 * e)), head: d(hd), dim: d(1) });
    }

    /// A heads-last attention block (BERT's form) on `[2, 5, 16]`, two heads of 8; with
    /// `k_also_output`, k's per-head view is a graph output too. Returns the inferred graph.
    fn attention_block(k_also_output: bool) -> Graph {
        use crate::ir::ops::testutil::{t_f32, t_ints, GraphBuilder};
        use crate::ir::{Attr, DType};
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "2,5,16");
        let w = |b: &mut GraphBuilder, name: &str, seed: usize| {
            b.konst(
                name,
                t_f32(&[16, 16], (0..256).map(|i| (((i * 7 + seed * 13) % 19) as f32 - 9.0) / 20.0).collect()),
            )
        };
        let heads = b.konst("heads", t_ints(&[2, 5, 2, 8]));
        let merged = b.konst("merged", t_ints(&[2, 5, 16]));
        let proj = |b: &mut GraphBuilder, name: &str, seed: usize, perm: Vec<i64>| {
            let wv = w(b, name, seed);
            let m = b.node("MatMul", vec![], &[x, wv], 1)[0];
            let r = b.node("Reshape", vec![], &[m, heads], 1)[0];
            (r, b.node("Transpose", vec![("perm", Attr::Ints(perm))], &[r], 1)[0])
        };
        let (_, q) = proj(&mut b, "wq", 1, vec![0, 2, 1, 3]);
        let (k_heads, k) = proj(&mut b, "wk", 2, vec![0, 2, 3, 1]);
        let (_, v) = proj(&mut b, "wv", 3, vec![0, 2, 1, 3]);
        let scale = b.konst("scale", t_f32(&[], vec![0.35]));
        let s = b.node("MatMul", vec![], &[q, k], 1)[0];
        let s = b.node("Mul", vec![], &[s, scale], 1)[0];
        let p = b.node("Softmax", vec![("axis", Attr::Int(-1))], &[s], 1)[0];
        let o = b.node("MatMul", vec![], &[p, v], 1)[0];
        let o = b.node("Transpose", vec![("perm", Attr::Ints(vec![0, 2, 1, 3]))], &[o], 1)[0];
        let o = b.node("Reshape", vec![], &[o, merged], 1)[0];
        b.g.outputs.push(o);
        if k_also_output {
            b.g.outputs.push(k_heads);
        }
        crate::ir::infer::infer_graph(&mut b.g).expect("the block infers");
        b.g
    }

    /// Optimised with fused attention: (kernel counts, max relative error against the original).
    fn optimise(g: &Graph) -> (std::collections::BTreeMap<String, usize>, f64) {
        let (opt, report) =
            crate::egraph::optimize(g, &crate::egraph::OptimizeOptions::pipeline(true).unwrap()).unwrap();
        let x = crate::ir::ops::testutil::t_f32(
            &[2, 5, 16],
            (0..160).map(|i| ((i * 11 % 23) as f32 - 11.0) / 10.0).collect(),
        );
        let inputs = std::collections::BTreeMap::from([("x".to_string(), x)]);
        let want = crate::reference::run(g, &inputs).unwrap();
        let got = crate::reference::run(&opt, &inputs).unwrap();
        let mut err = 0f64;
        for ((_, w), (_, o)) in want.iter().zip(&got) {
            let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
            let scale = w.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
            err = w.iter().zip(&o).fold(err, |m, (a, b)| m.max((a - b).abs() / scale));
        }
        (report.kernels_after, err)
    }

    /// The q, k and v projections pack into one product and the attention reads it through
    /// views; when k's per-head view has another reader (here: it is a graph output), the
    /// projections stay separate and that reader still gets its value.
    #[test]
    fn projections_pack_only_when_the_attention_reads_them_alone() {
        let (kernels, err) = optimise(&attention_block(false));
        assert_eq!(
            (kernels.get("gemm"), kernels.get("attention"), kernels.get("transpose")),
            (Some(&1), Some(&1), None)
        );
        assert!(err <= 1e-5, "{err:e}");
        let (kernels, err) = optimise(&attention_block(true));
        assert_eq!((kernels.get("gemm"), kernels.get("attention")), (Some(&3), Some(&1)), "{kernels:?}");
        assert!(err <= 1e-5, "{err:e}");
    }

    /// A reshape that would need elements across a part boundary it cannot split fails.
    #[test]
    fn impossible_reshapes_fail() {
        let v = View::contiguous(&[d(6), d(4)]).transpose(&[1, 0]).unwrap();
        assert!(v.reshape(&[d(24)]).is_some(), "parts are kept, so any regrouping of whole parts works");
        assert!(v.reshape(&[d(3), d(8)]).is_none(), "4 then 6 cannot make 3 x 8");
        assert!(View::contiguous(&[n(), d(5)]).reshape(&[d(2), n(), d(5)]).is_none());
    }
}
