//! Index arithmetic that only re-addresses data: a `Gather` or `GatherND` whose indices are built
//! from `Range`s (iotas) by broadcasting, scaling and adding reads its data in row-major order,
//! so it is a `Reshape`; a logical `And` with an all-true constant (`Or` with an all-false one)
//! only broadcasts its other operand; and an `Expand` read by one elementwise op whose other
//! operands broadcast into the expanded tensor's input moves after that op, so the op runs on
//! the small tensor (the mask's `Where(Expand(m), 0, -inf)` becomes `Expand(Where(m, 0, -inf))`,
//! and the attention reads the broadcast through strides, see `crate::egraph::views`).
//!
//! Why: exporters build attention masks this way. Hugging Face BERT (transformers ≥ 4.48) makes
//! the padding mask as `mask.flatten()[arange(B)[:,None,None,None]·S + arange(S)]` (TorchScript
//! export: `Range → Unsqueeze → Mul → Add → Gather`) or as
//! `GatherND(mask, concat(expand(arange(B)), expand(arange(S))))` (`torch.export`), then `And`s
//! it with `arange(S) >= 0`. The ranges over the run-time batch never fold into constants, so
//! each of these nodes was a kernel (five of BERT's seven mask kernels) for what is a view of
//! `attention_mask`.
//!
//! The analysis tracks, for integer tensors, an affine map from coordinates to values
//! (`value[p] = offset + Σ coeff[i]·p[i]`, coefficients and offset as dims, so `·S` stays
//! symbolic). A gather is a reshape when its indices enumerate the gathered axes exactly once in
//! row-major order: offset 0 and coefficients equal to the row-major strides of the index
//! shape's non-unit axes, whose product is the gathered extent. Anything else is left alone:
//! the pass only ever replaces a node by an equal view, it never guesses.
//!
//! With batch and seq both run-time dims (`--dim seq=1..512`) nothing folds into constants: the
//! Reshape's constant target writes each symbolic dim as `0` (copy the source's dim) or the one
//! `-1`, reading the source from under the views the gather's data came through; `arange(seq)
//! >= 0` is recognised as all true from the index's smallest value (as is a boolean
//! `ConstantOfShape` of a run-time shape), and `And` with such a value of a symbolic shape
//! becomes an `Expand` to `Shape` of it, which the lowering takes from the type.

use super::dim::Dim;
use super::graph::{Graph, Node, Value, ValueId};
use super::infer::infer_graph;
use super::op::ValueType;
use super::ops::arithmetic::{BinaryKind, BinaryOp};
use super::ops::cast::CastOp;
use super::ops::generator::{ConstantOfShape, Range};
use super::ops::indexing::{Concat, Gather, GatherElements, Slice};
use super::ops::logical::{CompareKind, CompareOp, LogicKind, LogicOp, WhereOp};
use super::ops::scatter::GatherNd;
use super::ops::shape::{Expand, Reshape, Shape};
use super::tensor::Tensor;
use super::DType;
use crate::error::Result;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Constant index tensors up to this many elements are checked for an affine form.
const MAX_CONST_SCAN: usize = 1 << 16;

/// `value[p] = offset + Σ coeffs[i]·p[i]` over the tensor's coordinates `p`.
#[derive(Clone, Debug, PartialEq)]
struct Affine {
    offset: Dim,
    coeffs: Vec<Dim>,
}

impl Affine {
    fn uniform(v: Dim, rank: usize) -> Affine {
        Affine { offset: v, coeffs: vec![Dim::known(0); rank] }
    }

    fn is_uniform(&self) -> bool {
        self.coeffs.iter().all(|c| *c == Dim::known(0))
    }

    /// The same values seen through a broadcast from `from` to `to` (right-aligned; an axis of
    /// extent 1 repeats its single value, so its coefficient becomes 0).
    fn broadcast(&self, from: &[Dim], to: &[Dim]) -> Option<Affine> {
        let lead = to.len().checked_sub(from.len())?;
        let mut coeffs = vec![Dim::known(0); to.len()];
        for (i, d) in from.iter().enumerate() {
            if *d != Dim::known(1) {
                coeffs[lead + i] = self.coeffs[i].clone();
            }
        }
        Some(Affine { offset: self.offset.clone(), coeffs })
    }

    fn scale(&self, k: &Dim) -> Affine {
        Affine { offset: self.offset.mul(k), coeffs: self.coeffs.iter().map(|c| c.mul(k)).collect() }
    }

    fn add(&self, o: &Affine, negate: bool) -> Affine {
        let f = |a: &Dim, b: &Dim| if negate { a.sub(b) } else { a.add(b) };
        Affine {
            offset: f(&self.offset, &o.offset),
            coeffs: self.coeffs.iter().zip(&o.coeffs).map(|(a, b)| f(a, b)).collect(),
        }
    }
}

/// What the analysis knows of an integer value.
#[derive(Clone, Debug)]
enum Index {
    Affine(Affine),
    /// GatherND-style index tuples: the last axis (extent `len()`) enumerates components, each
    /// affine over the leading axes.
    Tuple(Vec<Affine>),
}

/// Statistics of one run, for tests and reports.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IndexViewStats {
    /// `Gather` / `GatherND` nodes that became `Reshape`s.
    pub gathers: usize,
    /// `And` / `Or` nodes with a neutral constant that became their other operand.
    pub logic: usize,
    /// `Expand` nodes moved after the elementwise op reading them.
    pub sunk_expands: usize,
    /// `Gather`s of a constant table by an index whose elements all hold one known value,
    /// which became an `Expand` of that (folded) row.
    pub constant_rows: usize,
    /// `Gather`s of a constant table by `arange(n)` (as a run of the index's one non-unit
    /// axis), which became a prefix `Slice` of the table.
    pub prefix_slices: usize,
}

/// Rewrites the gathers and logic ops described in the module docs, then infers the graph again
/// (which removes the index subgraphs nothing reads any more).
pub fn simplify(g: &mut Graph) -> Result<IndexViewStats> {
    let mut stats = IndexViewStats::default();
    let mut known: BTreeMap<ValueId, Index> = BTreeMap::new();
    let mut renames: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    // Boolean values known to be all true or all false without being constants (a comparison of
    // `arange(seq)` with 0, a `ConstantOfShape` of a run-time shape).
    let mut truth: BTreeMap<ValueId, bool> = BTreeMap::new();
    // `Shape` nodes to insert before the node at the index (after the loop: indices stay valid).
    let mut inserts: Vec<(usize, Node)> = Vec::new();
    for n in 0..g.nodes.len() {
        for i in 0..g.nodes[n].inputs.len() {
            if let Some(v) = g.nodes[n].inputs[i] {
                if let Some(&to) = renames.get(&v) {
                    g.nodes[n].inputs[i] = Some(to);
                }
            }
        }
        if let Some(idx) = index_of_node(g, &g.nodes[n], &known) {
            known.insert(g.nodes[n].outputs[0], idx);
            continue;
        }
        if let Some((data, shape)) = gather_as_reshape(g, &g.nodes[n], &known) {
            let name = format!("{}/index_view_shape", g.nodes[n].name);
            let shape_v = add_constant(g, name, Tensor::from_i64s(&[shape.len()], shape));
            let node = &mut g.nodes[n];
            node.op = Box::new(Reshape { allowzero: false, attr_shape: None });
            node.op_type = "Reshape".into();
            node.domain = String::new();
            node.inputs = vec![Some(data), Some(shape_v)];
            stats.gathers += 1;
            continue;
        }
        if let Some(rewrite) = gather_of_table(g, &g.nodes[n], &known) {
            let name = g.nodes[n].name.clone();
            let (data, idx) = (g.nodes[n].inputs[0].unwrap_or_default(), g.nodes[n].inputs[1].unwrap_or_default());
            let row_rank = shape(g, data).map_or(1, <[Dim]>::len) - 1;
            match rewrite {
                TableGather::Row(v, idx_rank) => {
                    // Gather(table, [v] of rank idx_rank) folds into the row (with the index's
                    // unit axes in front); Expand to Shape(idx) ++ [1…] repeats it.
                    let one_index =
                        add_constant(g, format!("{name}/row_index"), Tensor::from_i64s(&vec![1; idx_rank], vec![v]));
                    let row = new_value(g, format!("{name}/row"));
                    let mut gather_node = g.nodes[n].clone();
                    gather_node.name = format!("{name}/row");
                    gather_node.inputs[1] = Some(one_index);
                    gather_node.outputs = vec![row];
                    inserts.push((n, gather_node));
                    let target = shape_of_plus_ones(g, &mut inserts, n, &name, idx, row_rank);
                    let node = &mut g.nodes[n];
                    node.op = Box::new(Expand);
                    node.op_type = "Expand".into();
                    node.domain = String::new();
                    node.inputs = vec![Some(row), Some(target)];
                    stats.constant_rows += 1;
                }
                TableGather::Prefix(axis, target) => {
                    // Slice(table, [0], Shape(idx)[axis], [0]) is rows 0..n; the Reshape puts
                    // them on the index's axis (every other index axis has extent 1). The
                    // lowering reads that prefix of the weight in place.
                    let ends = new_value(g, format!("{name}/slice_end"));
                    inserts.push((
                        n,
                        Node {
                            name: format!("{name}/slice_end"),
                            op_type: "Shape".into(),
                            domain: String::new(),
                            op: Box::new(Shape { start: axis as i64, end: Some(axis as i64 + 1) }),
                            inputs: vec![Some(idx)],
                            outputs: vec![ends],
                        },
                    ));
                    let zero = add_constant(g, format!("{name}/slice_zero"), Tensor::from_i64s(&[1], vec![0]));
                    let rows = new_value(g, format!("{name}/rows"));
                    inserts.push((
                        n,
                        Node {
                            name: format!("{name}/rows"),
                            op_type: "Slice".into(),
                            domain: String::new(),
                            op: Box::new(Slice { attrs: None }),
                            inputs: vec![Some(data), Some(zero), Some(ends), Some(zero)],
                            outputs: vec![rows],
                        },
                    ));
                    let t =
                        add_constant(g, format!("{name}/index_view_shape"), Tensor::from_i64s(&[target.len()], target));
                    let node = &mut g.nodes[n];
                    node.op = Box::new(Reshape { allowzero: false, attr_shape: None });
                    node.op_type = "Reshape".into();
                    node.domain = String::new();
                    node.inputs = vec![Some(rows), Some(t)];
                    stats.prefix_slices += 1;
                }
            }
            continue;
        }
        if let Some(t) = truth_of_node(g, &g.nodes[n], &known, &truth) {
            truth.insert(g.nodes[n].outputs[0], t);
        }
        if let Some(rewrite) = neutral_logic(g, &g.nodes[n], &truth) {
            match rewrite {
                Neutral::Same(x) => {
                    let out = g.nodes[n].outputs[0];
                    if g.outputs.contains(&out) {
                        // A graph output keeps its name: broadcast to its own shape.
                        let shape = vec![1i64; g.ty(x).shape.len()];
                        expand_node(g, n, x, shape);
                    } else {
                        renames.insert(out, x);
                    }
                }
                Neutral::Broadcast(x, shape) => expand_node(g, n, x, shape),
                Neutral::BroadcastLike(x, c) => {
                    // Expand to `Shape(c)`: symbolic like `[1, 1, seq, 1]`, so no constant can
                    // hold it. Expand kernels take their shape from the output type, so the
                    // device never computes this Shape, nor `c` for it (`lower::dead`).
                    let name = format!("{}/index_view_shape", g.nodes[n].name);
                    let shape_v = new_value(g, name.clone());
                    let shape_node = Node {
                        name,
                        op_type: "Shape".into(),
                        domain: String::new(),
                        op: Box::new(Shape { start: 0, end: None }),
                        inputs: vec![Some(c)],
                        outputs: vec![shape_v],
                    };
                    inserts.push((n, shape_node));
                    let node = &mut g.nodes[n];
                    node.op = Box::new(Expand);
                    node.op_type = "Expand".into();
                    node.domain = String::new();
                    node.inputs = vec![Some(x), Some(shape_v)];
                }
            }
            stats.logic += 1;
        }
    }
    for (n, node) in inserts.into_iter().rev() {
        g.nodes.insert(n, node);
    }
    for o in g.outputs.iter_mut() {
        if let Some(&to) = renames.get(o) {
            *o = to;
        }
    }
    if stats != IndexViewStats::default() {
        infer_graph(g)?;
    }
    // One step at a time: sinking an Expand can put it in front of the next elementwise op.
    // Each step removes an Expand from an op's inputs or moves one further down a finite
    // graph, so the loop ends.
    loop {
        let sunk = sink_expands(g);
        if sunk == 0 {
            break;
        }
        stats.sunk_expands += sunk;
        infer_graph(g)?;
    }
    Ok(stats)
}

/// Elementwise ops an `Expand` can move after: they broadcast their operands, so
/// `op(Expand(x, s), y…) = Expand(op(x, y…), s)` for any shapes (broadcasting is associative).
fn is_elementwise(node: &Node) -> bool {
    node.domain.is_empty()
        && (node.op.downcast_ref::<BinaryOp>().is_some()
            || node.op.downcast_ref::<CastOp>().is_some()
            || node.op.downcast_ref::<WhereOp>().is_some()
            || node.op.downcast_ref::<LogicOp>().is_some()
            || node.op.downcast_ref::<CompareOp>().is_some())
}

/// One step of moving `Expand`s out of the way of the ops reading them, or 0 when none can:
/// - an elementwise op whose result has the same shape without the expansion (its other
///   operands are as large) reads the Expand's input instead;
/// - an `Expand(x, s)` whose only reader is an elementwise op whose other operands broadcast
///   into `x` moves after that op, so the op runs on the small tensor;
/// - `Gather(data, Expand(i, s), axis 0)` becomes `Expand(Gather(data, i), s ++ [1…])` (each
///   gathered row is the same row repeated), which folds when data and `i` are constants (BERT's
///   token-type embeddings of the all-zero `token_type_ids` buffer).
///
/// The caller infers the graph again after each step (producers and consumers change).
fn sink_expands(g: &mut Graph) -> usize {
    let producers = g.producers();
    let consumers = g.consumers();
    let expand_of = |v: Option<ValueId>| -> Option<(usize, ValueId, ValueId)> {
        let v = v?;
        let e = producers[v]?;
        let en = &g.nodes[e];
        if !en.domain.is_empty() || en.op.downcast_ref::<Expand>().is_none() {
            return None;
        }
        Some((e, en.inputs.first().copied().flatten()?, en.inputs.get(1).copied().flatten()?))
    };
    for w in 0..g.nodes.len() {
        if g.nodes[w].outputs.len() != 1 {
            continue;
        }
        if let Some(gather) = g.nodes[w].op.downcast_ref::<Gather>() {
            let Some((_, idx, s)) = expand_of(g.nodes[w].inputs.get(1).copied().flatten()) else { continue };
            let Some(data) = g.nodes[w].inputs[0] else { continue };
            let Some(rank) = shape(g, data).map(<[Dim]>::len) else { continue };
            if gather.axis != 0 || !g.nodes[w].domain.is_empty() {
                continue;
            }
            let name = g.nodes[w].name.clone();
            let small = new_value(g, format!("{name}/unexpanded"));
            let ones = add_constant(g, format!("{name}/row_ones"), Tensor::from_i64s(&[rank - 1], vec![1; rank - 1]));
            let target = new_value(g, format!("{name}/expand_shape"));
            let out = g.nodes[w].outputs[0];
            let mut gather_node = g.nodes[w].clone();
            gather_node.inputs[1] = Some(idx);
            gather_node.outputs = vec![small];
            let concat = Node {
                name: format!("{name}/expand_shape"),
                op_type: "Concat".into(),
                domain: String::new(),
                op: Box::new(Concat { axis: 0 }),
                inputs: vec![Some(s), Some(ones)],
                outputs: vec![target],
            };
            let expand = Node {
                name: format!("{name}/expand"),
                op_type: "Expand".into(),
                domain: String::new(),
                op: Box::new(Expand),
                inputs: vec![Some(small), Some(target)],
                outputs: vec![out],
            };
            g.nodes[w] = gather_node;
            g.nodes.splice(w + 1..w + 1, [concat, expand]);
            return 1;
        }
        if !is_elementwise(&g.nodes[w]) {
            continue;
        }
        let shapes: Option<Vec<Vec<Dim>>> =
            g.nodes[w].inputs.iter().map(|v| v.and_then(|v| shape(g, v).map(<[Dim]>::to_vec))).collect();
        let (Some(shapes), Some(out_shape)) = (shapes, shape(g, g.nodes[w].outputs[0]).map(<[Dim]>::to_vec)) else {
            continue;
        };
        for slot in 0..shapes.len() {
            let Some((e, x, s)) = expand_of(g.nodes[w].inputs[slot]) else { continue };
            let Some(xshape) = shape(g, x).map(<[Dim]>::to_vec) else { continue };
            let mut all: Vec<&[Dim]> = vec![&xshape];
            all.extend(shapes.iter().enumerate().filter(|&(i, _)| i != slot).map(|(_, s)| s.as_slice()));
            let Ok(b) = super::broadcast::broadcast_shapes(&all) else { continue };
            if b == out_shape {
                g.nodes[w].inputs[slot] = Some(x);
                return 1;
            }
            let ev = g.nodes[e].outputs[0];
            if b != xshape || consumers[ev].len() != 1 || g.outputs.contains(&ev) {
                continue;
            }
            // w reads x directly and writes a new small value; the Expand follows it and writes
            // w's old output. Both sit where w was (every input of w is ready there, and the
            // Expand's shape input was ready before e < w); e's slot goes.
            let out = g.nodes[w].outputs[0];
            let small = new_value(g, format!("{}/before_expand", g.values[out].name));
            let mut op_node = g.nodes[w].clone();
            op_node.inputs[slot] = Some(x);
            op_node.outputs = vec![small];
            let mut expand_node = g.nodes[e].clone();
            expand_node.inputs = vec![Some(small), Some(s)];
            expand_node.outputs = vec![out];
            g.nodes[w] = op_node;
            g.nodes.insert(w + 1, expand_node);
            g.nodes.remove(e);
            return 1;
        }
    }
    0
}

/// What a `Gather` of a constant table (axis 0) by a tracked index reads.
enum TableGather {
    /// Every index element is this row (a number in range): the result is that row repeated;
    /// the index has this rank.
    Row(i64, usize),
    /// The index is `arange(n)` along its axis `.0` (every other axis has extent 1): the
    /// result is rows `0..n`, reshaped by the constant target `.1` (`-1` for `n`).
    Prefix(usize, Vec<i64>),
}

/// Recognises the embedding lookups of a run-time sequence: BERT's token-type ids are an
/// all-zero buffer gathered and expanded to `[batch, seq]` (every id the same number), its
/// position ids `buffer[:, :seq]` of an `arange` buffer. With `seq` fixed both fold into
/// constants; with a run-time `seq` they were a gather kernel each, for what is one constant row
/// broadcast and a prefix of the position table.
fn gather_of_table(g: &Graph, node: &Node, known: &BTreeMap<ValueId, Index>) -> Option<TableGather> {
    let gather = node.op.downcast_ref::<Gather>()?;
    if !node.domain.is_empty() || node.outputs.len() != 1 || gather.axis != 0 {
        return None;
    }
    let (data, idx) = (node.inputs.first().copied().flatten()?, node.inputs.get(1).copied().flatten()?);
    // A constant index (with a constant table the node folds anyway) is left to folding.
    if g.values[data].konst.is_none() || g.values[idx].konst.is_some() {
        return None;
    }
    let dshape = shape(g, data)?;
    let rows = dshape.first()?.as_known()?;
    let ishape = shape(g, idx)?;
    let a = affine_of(g, idx, known)?;
    if a.is_uniform() {
        let v = a.offset.as_known()?;
        return (-rows <= v && v < rows).then_some(TableGather::Row(v, ishape.len()));
    }
    if a.offset != Dim::known(0) {
        return None;
    }
    // One axis counts 0, 1, 2…; every other axis has extent 1 (so its coefficient is 0).
    let one = Dim::known(1);
    let non_unit: Vec<usize> = (0..ishape.len()).filter(|&i| ishape[i] != one).collect();
    let [axis] = non_unit[..] else { return None };
    if a.coeffs[axis] != one {
        return None;
    }
    let mut target: Vec<i64> = ishape.iter().map(|d| if *d == one { 1 } else { -1 }).collect();
    // A zero in a Reshape target copies the input's dim, and a -1 of an empty tensor is
    // ambiguous: only tables with rows of known, positive extents.
    for d in &dshape[1..] {
        target.push(d.as_known().filter(|&v| v > 0)?);
    }
    if rows <= 0 {
        return None;
    }
    Some(TableGather::Prefix(axis, target))
}

/// A new value `Concat(Shape(idx), [1; ones])` (or `Shape(idx)` when `ones` is 0), its nodes
/// queued before node `n`.
fn shape_of_plus_ones(
    g: &mut Graph,
    inserts: &mut Vec<(usize, Node)>,
    n: usize,
    name: &str,
    idx: ValueId,
    ones: usize,
) -> ValueId {
    let s = new_value(g, format!("{name}/index_shape"));
    inserts.push((
        n,
        Node {
            name: format!("{name}/index_shape"),
            op_type: "Shape".into(),
            domain: String::new(),
            op: Box::new(Shape { start: 0, end: None }),
            inputs: vec![Some(idx)],
            outputs: vec![s],
        },
    ));
    if ones == 0 {
        return s;
    }
    let k = add_constant(g, format!("{name}/row_ones"), Tensor::from_i64s(&[ones], vec![1; ones]));
    let target = new_value(g, format!("{name}/expand_shape"));
    inserts.push((
        n,
        Node {
            name: format!("{name}/expand_shape"),
            op_type: "Concat".into(),
            domain: String::new(),
            op: Box::new(Concat { axis: 0 }),
            inputs: vec![Some(s), Some(k)],
            outputs: vec![target],
        },
    ));
    target
}

/// A new value without a type yet (inference gives it one).
fn new_value(g: &mut Graph, name: String) -> ValueId {
    g.values.push(Value { name, ty: None, konst: None, sym: None });
    g.values.len() - 1
}

fn add_constant(g: &mut Graph, name: String, t: Tensor) -> ValueId {
    let ty = ValueType::new(t.dtype(), super::dim::dims_of(t.shape()));
    g.values.push(Value { name, ty: Some(ty), konst: Some(Arc::new(t)), sym: None });
    g.values.len() - 1
}

/// Turns node `n` into `Expand(x, shape)`.
fn expand_node(g: &mut Graph, n: usize, x: ValueId, shape: Vec<i64>) {
    let name = format!("{}/index_view_shape", g.nodes[n].name);
    let shape_v = add_constant(g, name, Tensor::from_i64s(&[shape.len()], shape));
    let node = &mut g.nodes[n];
    node.op = Box::new(Expand);
    node.op_type = "Expand".into();
    node.domain = String::new();
    node.inputs = vec![Some(x), Some(shape_v)];
}

fn shape(g: &Graph, v: ValueId) -> Option<&[Dim]> {
    g.values[v].ty.as_ref().map(|t| t.shape.as_slice())
}

/// The affine form of an integer value: a tracked one, a scalar whose value is known (a
/// constant or a symbolic dim such as `Shape(x)[1]`), or a small constant that happens to be
/// affine (a folded `arange(S)`).
fn affine_of(g: &Graph, v: ValueId, known: &BTreeMap<ValueId, Index>) -> Option<Affine> {
    if let Some(Index::Affine(a)) = known.get(&v) {
        return Some(a.clone());
    }
    let val = &g.values[v];
    let ty = val.ty.as_ref()?;
    if !ty.dtype.is_int() {
        return None;
    }
    let rank = ty.shape.len();
    if let Some(s) = &val.sym {
        if s.len() == 1 && ty.shape.iter().all(|d| *d == Dim::known(1)) {
            return Some(Affine::uniform(s[0].clone(), rank));
        }
    }
    let k = val.konst.as_ref()?;
    if k.len() == 0 || k.len() > MAX_CONST_SCAN {
        return None;
    }
    affine_constant(k)
}

/// The affine form of a constant, when its values are one.
fn affine_constant(k: &Tensor) -> Option<Affine> {
    let vals = k.to_i64_vec();
    let shape = k.shape();
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    let offset = vals[0];
    let coeffs: Vec<i64> = (0..shape.len())
        .map(|i| if shape[i] > 1 { vals[strides[i]].checked_sub(offset) } else { Some(0) })
        .collect::<Option<_>>()?;
    for (flat, &v) in vals.iter().enumerate() {
        let mut expect = offset;
        for i in 0..shape.len() {
            expect = expect.checked_add(coeffs[i].checked_mul(((flat / strides[i]) % shape[i]) as i64)?)?;
        }
        if expect != v {
            return None;
        }
    }
    Some(Affine { offset: Dim::known(offset), coeffs: coeffs.into_iter().map(Dim::known).collect() })
}

/// The index form of a node's single output, from its inputs' forms.
fn index_of_node(g: &Graph, node: &Node, known: &BTreeMap<ValueId, Index>) -> Option<Index> {
    if node.outputs.len() != 1 {
        return None;
    }
    let out = node.outputs[0];
    let out_ty = g.values[out].ty.as_ref()?;
    if !out_ty.dtype.is_int() {
        return None;
    }
    let out_shape = &out_ty.shape;
    let input = |i: usize| node.inputs.get(i).copied().flatten();
    let op = &node.op;
    if op.downcast_ref::<Range>().is_some() {
        let start = affine_of(g, input(0)?, known)?;
        let delta = affine_of(g, input(2)?, known)?;
        if !start.is_uniform() || !delta.is_uniform() {
            return None;
        }
        return Some(Index::Affine(Affine { offset: start.offset, coeffs: vec![delta.offset] }));
    }
    if let Some(b) = op.downcast_ref::<BinaryOp>() {
        let (x, y) = (input(0)?, input(1)?);
        let ax = affine_of(g, x, known)?.broadcast(shape(g, x)?, out_shape)?;
        let ay = affine_of(g, y, known)?.broadcast(shape(g, y)?, out_shape)?;
        return match b.kind {
            BinaryKind::Add => Some(Index::Affine(ax.add(&ay, false))),
            BinaryKind::Sub => Some(Index::Affine(ax.add(&ay, true))),
            BinaryKind::Mul if ay.is_uniform() => Some(Index::Affine(ax.scale(&ay.offset))),
            BinaryKind::Mul if ax.is_uniform() => Some(Index::Affine(ay.scale(&ax.offset))),
            _ => None,
        };
    }
    let x = input(0)?;
    let in_shape = shape(g, x)?;
    if op.downcast_ref::<CastOp>().is_some() {
        return known.get(&x).cloned().or_else(|| affine_of(g, x, known).map(Index::Affine));
    }
    if op.downcast_ref::<Expand>().is_some() {
        return match known.get(&x) {
            Some(Index::Tuple(_)) => None,
            _ => Some(Index::Affine(affine_of(g, x, known)?.broadcast(in_shape, out_shape)?)),
        };
    }
    // A coordinate on an extent-1 axis is always 0: its coefficient does not matter, and 0
    // lets the result count as uniform or as a single run.
    let unit_axes_zero = |mut a: Affine| {
        for (c, d) in a.coeffs.iter_mut().zip(out_shape) {
            if *d == Dim::known(1) {
                *c = Dim::known(0);
            }
        }
        Index::Affine(a)
    };
    if let Some(slice) = op.downcast_ref::<Slice>() {
        return slice_of(g, slice, node, known).map(unit_axes_zero);
    }
    if let Some(ge) = op.downcast_ref::<GatherElements>() {
        // out[p] = data[p with p[axis] := idx[p]]: affine in p when both are, the data's
        // coefficient on `axis` scaling the index.
        let idx = input(1)?;
        let data = affine_of(g, x, known)?;
        if data.is_uniform() {
            // Every element the same number (BERT's all-zero token types): so is the result,
            // whatever the indices are.
            return Some(Index::Affine(Affine::uniform(data.offset, out_shape.len())));
        }
        let ia = affine_of(g, idx, known)?;
        let rank = in_shape.len();
        let axis = usize::try_from(if ge.axis < 0 { ge.axis + rank as i64 } else { ge.axis }).ok()?;
        let ishape = shape(g, idx)?;
        if axis >= rank || ishape.len() != rank {
            return None;
        }
        let k = &data.coeffs[axis];
        // A negative index counts from the end; the form holds only for indices that cannot be
        // negative, unless the data does not vary along `axis` at all.
        if *k != Dim::known(0) && affine_min(&ia).is_none_or(|m| m < 0) {
            return None;
        }
        let coeffs = (0..rank)
            .map(|i| {
                let own = if i == axis { Dim::known(0) } else { data.coeffs[i].clone() };
                own.add(&k.mul(&ia.coeffs[i]))
            })
            .collect();
        return Some(unit_axes_zero(Affine { offset: data.offset.add(&k.mul(&ia.offset)), coeffs }));
    }
    if matches!(node.op_type.as_str(), "Unsqueeze" | "Squeeze" | "Reshape" | "Identity") && node.domain.is_empty() {
        // Only views that insert or remove unit axes keep the coordinates' meaning.
        let a = affine_of(g, x, known)?;
        return regroup_unit_axes(&a, in_shape, out_shape).map(Index::Affine);
    }
    if let Some(c) = op.downcast_ref::<Concat>() {
        let rank = out_shape.len() as i64;
        if c.axis != -1 && c.axis != rank - 1 {
            return None;
        }
        let mut comps = Vec::new();
        for v in node.inputs.iter().flatten() {
            let s = shape(g, *v)?;
            match known.get(v) {
                Some(Index::Tuple(t)) => comps.extend(t.iter().cloned()),
                _ if s.last() == Some(&Dim::known(1)) => {
                    let a = affine_of(g, *v, known)?;
                    comps.push(Affine { offset: a.offset, coeffs: a.coeffs[..a.coeffs.len() - 1].to_vec() });
                }
                _ => return None,
            }
        }
        return Some(Index::Tuple(comps));
    }
    None
}

/// The affine form of a `Slice` of an affine value: each sliced axis starts at `start` and
/// steps by `step`, so `value[p] = a(…, start + step·p[axis], …)`. Only constant, non-negative
/// starts and positive steps: a start past the end clamps, but then the axis is empty and no
/// value is read; a negative start would need the extent.
fn slice_of(g: &Graph, slice: &Slice, node: &Node, known: &BTreeMap<ValueId, Index>) -> Option<Affine> {
    let x = node.inputs.first().copied().flatten()?;
    let rank = shape(g, x)?.len();
    let ints = |i: usize| -> Option<Option<Vec<i64>>> {
        match node.inputs.get(i).copied().flatten() {
            None => Some(None),
            Some(v) => Some(Some(g.values[v].konst.as_ref()?.to_i64_vec())),
        }
    };
    let (starts, axes, steps) = match &slice.attrs {
        Some(a) => (a.starts.clone(), a.axes.clone(), None),
        None => (ints(1)??, ints(3)?, ints(4)?),
    };
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if axes.len() != starts.len() || steps.len() != starts.len() {
        return None;
    }
    let mut a = affine_of(g, x, known)?;
    for ((&axis, &start), &step) in axes.iter().zip(&starts).zip(&steps) {
        let axis = usize::try_from(if axis < 0 { axis + rank as i64 } else { axis }).ok().filter(|&i| i < rank)?;
        if start < 0 || step <= 0 {
            return None;
        }
        a.offset = a.offset.add(&a.coeffs[axis].mul(&Dim::known(start)));
        a.coeffs[axis] = a.coeffs[axis].mul(&Dim::known(step));
    }
    Some(a)
}

/// `a` seen through a view that only inserts or removes extent-1 axes, or `None` for any other
/// view.
fn regroup_unit_axes(a: &Affine, from: &[Dim], to: &[Dim]) -> Option<Affine> {
    let one = Dim::known(1);
    let src: Vec<usize> = (0..from.len()).filter(|&i| from[i] != one).collect();
    let dst: Vec<usize> = (0..to.len()).filter(|&i| to[i] != one).collect();
    if src.len() != dst.len() || src.iter().zip(&dst).any(|(&i, &j)| from[i] != to[j]) {
        return None;
    }
    let mut coeffs = vec![Dim::known(0); to.len()];
    for (&i, &j) in src.iter().zip(&dst) {
        coeffs[j] = a.coeffs[i].clone();
    }
    Some(Affine { offset: a.offset.clone(), coeffs })
}

/// The index axes a component enumerates, when it is the row-major flat index over a run of
/// consecutive non-unit axes of `shape` whose extents multiply to `extent`: `Some(run)`, with
/// every other non-unit axis' coefficient zero.
fn row_major_run(a: &Affine, shape: &[Dim], extent: &Dim) -> Option<Vec<usize>> {
    if a.offset != Dim::known(0) {
        return None;
    }
    let zero = Dim::known(0);
    let one = Dim::known(1);
    let non_unit: Vec<usize> = (0..shape.len()).filter(|&i| shape[i] != one).collect();
    let run: Vec<usize> = non_unit.iter().copied().filter(|&i| a.coeffs[i] != zero).collect();
    // `run` is a subsequence of `non_unit`; it is consecutive there when its ends are as far
    // apart as it is long.
    if let (Some(first), Some(last)) = (run.first(), run.last()) {
        let p0 = non_unit.iter().position(|i| i == first)?;
        let p1 = non_unit.iter().position(|i| i == last)?;
        if p1 - p0 + 1 != run.len() {
            return None;
        }
    }
    let mut stride = one.clone();
    for &i in run.iter().rev() {
        if a.coeffs[i] != stride {
            return None;
        }
        stride = stride.mul(&shape[i]);
    }
    (stride == *extent).then_some(run)
}

/// `(source, target shape)` when node is a Gather / GatherND that reads its data in row-major
/// order: the node is `Reshape(source, target)`, see [`reshape_of`].
fn gather_as_reshape(g: &Graph, node: &Node, known: &BTreeMap<ValueId, Index>) -> Option<(ValueId, Vec<i64>)> {
    let (data, idx) = (node.inputs.first().copied().flatten()?, node.inputs.get(1).copied().flatten()?);
    let dshape = shape(g, data)?.to_vec();
    let ishape = shape(g, idx)?.to_vec();
    let out_shape = shape(g, node.outputs[0])?.to_vec();
    if let Some(gather) = node.op.downcast_ref::<Gather>() {
        let rank = dshape.len() as i64;
        let axis = if gather.axis < 0 { gather.axis + rank } else { gather.axis };
        let axis = usize::try_from(axis).ok().filter(|&a| a < dshape.len())?;
        let a = affine_of(g, idx, known)?;
        row_major_run(&a, &ishape, &dshape[axis])?;
    } else if let Some(nd) = node.op.downcast_ref::<GatherNd>() {
        let Some(Index::Tuple(comps)) = known.get(&idx) else { return None };
        let lead = &ishape[..ishape.len() - 1];
        if nd.batch_dims != 0 || comps.len() > dshape.len() || ishape.last() != Some(&Dim::from(comps.len())) {
            return None;
        }
        let one = Dim::known(1);
        let mut covered = Vec::new();
        for (k, c) in comps.iter().enumerate() {
            covered.extend(row_major_run(c, lead, &dshape[k])?);
        }
        let non_unit: Vec<usize> = (0..lead.len()).filter(|&i| lead[i] != one).collect();
        if covered != non_unit {
            return None;
        }
    } else {
        return None;
    }
    reshape_of(g, data, &out_shape)
}

/// `Reshape(source, target)` equal to a reshape of `data` to `out`, with a constant `target` (a
/// Reshape's shape input): `source` is `data`, or the tensor a chain of views (`Reshape`,
/// `Flatten`, `Squeeze`, `Unsqueeze`) made `data` from, which holds the same elements in the
/// same row-major order. Looking through the views matters with several run-time dims: the
/// TorchScript export gathers BERT's mask `[batch, seq]` from its flattened `[batch·seq]`, and
/// only the unflattened source lets both dims of the `[batch, 1, 1, seq]` result be written
/// (batch as `0`, seq as `-1`; see [`reshape_target`]).
fn reshape_of(g: &Graph, data: ValueId, out: &[Dim]) -> Option<(ValueId, Vec<i64>)> {
    let mut src = data;
    // Each step goes to an earlier node of a finite graph; the bound only guards a malformed one.
    for _ in 0..=g.nodes.len() {
        if let Some(t) = reshape_target(shape(g, src)?, out) {
            return Some((src, t));
        }
        let producer = g.nodes.iter().find(|n| n.outputs.first() == Some(&src))?;
        let is_view = matches!(producer.op_type.as_str(), "Reshape" | "Flatten" | "Squeeze" | "Unsqueeze")
            && producer.domain.is_empty();
        if !is_view || producer.outputs.len() != 1 {
            return None;
        }
        src = producer.inputs.first().copied().flatten()?;
    }
    None
}

/// A Reshape shape input that takes `input` to `shape`: known dims as numbers; a symbolic dim as
/// `0` ("copy the input's dim") where the input has the same dim at that position, else as the
/// one `-1`. None when that needs two `-1`s, for a zero-sized dim (whose `0` would copy), or
/// when Reshape would not infer exactly `shape` from it.
fn reshape_target(input: &[Dim], shape: &[Dim]) -> Option<Vec<i64>> {
    let mut unknown = 0;
    let t: Vec<i64> = shape
        .iter()
        .enumerate()
        .map(|(i, d)| match d.as_known() {
            Some(0) => None,
            Some(v) => Some(v),
            None if input.get(i) == Some(d) => Some(0),
            None => {
                unknown += 1;
                Some(-1)
            }
        })
        .collect::<Option<_>>()?;
    if unknown > 1 {
        return None;
    }
    let target: Vec<Dim> = t.iter().map(|&v| Dim::known(v)).collect();
    let inferred = super::ops::shape::reshape_dims(input, &target, false).ok()?;
    (inferred == shape).then_some(t)
}

enum Neutral {
    /// The node is its operand `x` (same shape).
    Same(ValueId),
    /// The node is its operand broadcast by `Expand(x, shape)`.
    Broadcast(ValueId, Vec<i64>),
    /// The node is its operand `x` broadcast to the shape of its neutral operand `c`, a symbolic
    /// one: `Expand(x, Shape(c))`.
    BroadcastLike(ValueId, ValueId),
}

/// The one value every element of a boolean value has, when the graph fixes it: a constant, or
/// what [`truth_of_node`] found (`truth`).
fn truth_of(g: &Graph, v: ValueId, truth: &BTreeMap<ValueId, bool>) -> Option<bool> {
    if let Some(&t) = truth.get(&v) {
        return Some(t);
    }
    let k = g.values[v].konst.as_ref()?;
    let b = k.as_bool()?;
    let first = *b.iter().next()?;
    b.iter().all(|&e| e == first).then_some(first)
}

/// The smallest value of an affine index (every coordinate is ≥ 0): its offset, when that and
/// every coefficient are numbers and no coefficient is negative.
fn affine_min(a: &Affine) -> Option<i64> {
    let coeffs_nonneg = a.coeffs.iter().all(|c| c.as_known().is_some_and(|v| v >= 0));
    coeffs_nonneg.then_some(())?;
    a.offset.as_known()
}

/// Whether every element of the boolean output of `node` is the same value, without it being a
/// constant: `ConstantOfShape` of a boolean (its shape may be run-time), a comparison of an index
/// with a number that its smallest value decides (`arange(seq) >= 0`, which BERT's mask `And`s
/// with the padding mask; with a run-time seq it never folds), and views, casts to bool and
/// `And`/`Or` of such values.
fn truth_of_node(
    g: &Graph,
    node: &Node,
    known: &BTreeMap<ValueId, Index>,
    truth: &BTreeMap<ValueId, bool>,
) -> Option<bool> {
    if node.outputs.len() != 1 || !node.domain.is_empty() {
        return None;
    }
    if g.values[node.outputs[0]].ty.as_ref()?.dtype != DType::Bool {
        return None;
    }
    let input = |i: usize| node.inputs.get(i).copied().flatten();
    if let Some(c) = node.op.downcast_ref::<ConstantOfShape>() {
        let b = c.value.as_bool()?;
        return (b.len() == 1).then(|| b.iter().next().copied()).flatten();
    }
    if let Some(cmp) = node.op.downcast_ref::<CompareOp>() {
        let (x, y) = (input(0)?, input(1)?);
        let (ax, ay) = (affine_of(g, x, known)?, affine_of(g, y, known)?);
        // `lo` is the smallest value of the index side, `c` the number on the other side.
        let decide = |lo: i64, c: i64, kind: CompareKind| -> Option<bool> {
            match kind {
                CompareKind::GreaterOrEqual => (lo >= c).then_some(true),
                CompareKind::Greater => (lo > c).then_some(true),
                CompareKind::Less => (lo >= c).then_some(false),
                CompareKind::LessOrEqual => (lo > c).then_some(false),
                CompareKind::Equal => (lo > c).then_some(false),
            }
        };
        if ay.is_uniform() {
            if let (Some(lo), Some(c)) = (affine_min(&ax), ay.offset.as_known()) {
                return decide(lo, c, cmp.kind);
            }
        }
        if ax.is_uniform() {
            // `c op index` is `index op' c` with the comparison mirrored.
            let mirrored = match cmp.kind {
                CompareKind::Less => CompareKind::Greater,
                CompareKind::LessOrEqual => CompareKind::GreaterOrEqual,
                CompareKind::Greater => CompareKind::Less,
                CompareKind::GreaterOrEqual => CompareKind::LessOrEqual,
                CompareKind::Equal => CompareKind::Equal,
            };
            if let (Some(lo), Some(c)) = (affine_min(&ay), ax.offset.as_known()) {
                return decide(lo, c, mirrored);
            }
        }
        return None;
    }
    if let Some(l) = node.op.downcast_ref::<LogicOp>() {
        let (a, b) = (truth_of(g, input(0)?, truth)?, truth_of(g, input(1)?, truth)?);
        return match l.kind {
            LogicKind::And => Some(a && b),
            LogicKind::Or => Some(a || b),
            LogicKind::Xor => Some(a != b),
        };
    }
    let x = input(0)?;
    let from_bool = g.values[x].ty.as_ref()?.dtype == DType::Bool;
    let is_view = matches!(node.op_type.as_str(), "Unsqueeze" | "Squeeze" | "Reshape" | "Identity" | "Expand");
    if from_bool && (is_view || node.op.downcast_ref::<CastOp>().is_some()) {
        return truth_of(g, x, truth);
    }
    None
}

/// `And(x, all-true)` / `Or(x, all-false)` in either order.
fn neutral_logic(g: &Graph, node: &Node, truth: &BTreeMap<ValueId, bool>) -> Option<Neutral> {
    let op = node.op.downcast_ref::<LogicOp>()?;
    let neutral = match op.kind {
        LogicKind::And => true,
        LogicKind::Or => false,
        LogicKind::Xor => return None,
    };
    let (a, b) = (node.inputs.first().copied().flatten()?, node.inputs.get(1).copied().flatten()?);
    let is_neutral = |v: ValueId| truth_of(g, v, truth) == Some(neutral);
    let (x, c) = if is_neutral(b) {
        (a, b)
    } else if is_neutral(a) {
        (b, a)
    } else {
        return None;
    };
    let out = shape(g, node.outputs[0])?;
    if shape(g, x)? == out {
        return Some(Neutral::Same(x));
    }
    let cshape: Option<Vec<i64>> = shape(g, c)?.iter().map(Dim::as_known).collect();
    match cshape {
        Some(cshape) => Some(Neutral::Broadcast(x, cshape)),
        None => Some(Neutral::BroadcastLike(x, c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::attr::Attr;
    use crate::ir::ops::testutil::GraphBuilder;

    fn ints(v: &[i64]) -> Tensor {
        Tensor::from_i64s(&[v.len()], v.to_vec())
    }

    fn scalar(v: i64) -> Tensor {
        Tensor::from_i64s(&[], vec![v])
    }

    /// A 0/1 mask `[b, s]` with a pattern that differs per row.
    fn mask(b: usize, s: usize) -> Tensor {
        Tensor::from_i64s(&[b, s], (0..b * s).map(|i| ((i * 7 + i / s) % 3 != 0) as i64).collect())
    }

    /// Simplifies a copy of `b`'s graph, checks both compute the same outputs at `mask [2, 5]`
    /// and returns the stats and the op types left.
    fn simplified(b: GraphBuilder) -> (IndexViewStats, Vec<String>) {
        let (stats, s) = simplified_graph(b);
        (stats, s.nodes.iter().map(|n| n.op_type.clone()).collect())
    }

    /// [`simplified`], returning the simplified graph.
    fn simplified_graph(b: GraphBuilder) -> (IndexViewStats, Graph) {
        let mut g = b.g;
        infer_graph(&mut g).unwrap();
        let mut s = g.clone();
        let stats = simplify(&mut s).unwrap();
        let inputs: BTreeMap<String, Tensor> = [("mask".to_string(), mask(2, 5))].into();
        let want = crate::reference::run(&g, &inputs).unwrap();
        let got = crate::reference::run(&s, &inputs).unwrap();
        assert_eq!(want.len(), got.len());
        for ((n, w), (_, o)) in want.iter().zip(&got) {
            assert_eq!(w.shape(), o.shape(), "{n}");
            assert_eq!(w.to_f64_vec(), o.to_f64_vec(), "{n}");
        }
        (stats, s)
    }

    /// The op types of the nodes of `g` that read `input` (by value name).
    fn readers_of(g: &Graph, input: &str) -> Vec<String> {
        g.nodes
            .iter()
            .filter(|n| n.inputs.iter().flatten().any(|&v| g.values[v].name == input))
            .map(|n| n.op_type.clone())
            .collect()
    }

    /// `arange(B)[:, None, None, None] * S + arange(S)` as the TorchScript export of Hugging Face
    /// BERT builds it, with the row factor `times` and the first batch index `from`.
    fn torchscript_mask(times_plus: i64, from: i64) -> GraphBuilder {
        torchscript_mask_of("B,5", times_plus, from)
    }

    /// [`torchscript_mask`] of a mask with the shape `dims` (`B,S`: both run-time dims).
    fn torchscript_mask_of(dims: &str, times_plus: i64, from: i64) -> GraphBuilder {
        let mut b = GraphBuilder::new(17);
        let m = b.input("mask", DType::I64, dims);
        let cast = b.node("Cast", vec![("to", Attr::Int(9))], &[m], 1)[0];
        let flat = b.node("Flatten", vec![("axis", Attr::Int(2))], &[cast], 1)[0];
        let shape = b.node("Shape", vec![], &[m], 1)[0];
        let (k0, k1, k_from) = (b.konst("k0", scalar(0)), b.konst("k1", scalar(1)), b.konst("from", scalar(from)));
        let batch = b.node("Gather", vec![], &[shape, k0], 1)[0];
        let seq = b.node("Gather", vec![], &[shape, k1], 1)[0];
        let rows = b.node("Range", vec![], &[k_from, batch, k1], 1)[0];
        let axes = b.konst("axes", ints(&[1, 2, 3]));
        let rows = b.node("Unsqueeze", vec![], &[rows, axes], 1)[0];
        let extra = b.konst("extra", scalar(times_plus));
        let factor = b.node("Add", vec![], &[seq, extra], 1)[0];
        let rows = b.node("Mul", vec![], &[rows, factor], 1)[0];
        let k_start = b.konst("k_start", scalar(0));
        let cols = b.node("Range", vec![], &[k_start, seq, k1], 1)[0];
        let axes3 = b.konst("axes3", ints(&[0, 1, 2]));
        let cols = b.node("Unsqueeze", vec![], &[cols, axes3], 1)[0];
        let idx = b.node("Add", vec![], &[rows, cols], 1)[0];
        let picked = b.node("Gather", vec![("axis", Attr::Int(0))], &[flat, idx], 1)[0];
        let out = b.node("Cast", vec![("to", Attr::Int(1))], &[picked], 1)[0];
        b.g.outputs.push(out);
        b
    }

    #[test]
    fn a_gather_through_row_major_iota_indices_becomes_a_reshape() {
        let (stats, ops) = simplified(torchscript_mask(0, 0));
        assert_eq!(stats.gathers, 1, "{ops:?}");
        assert!(
            !ops.iter().any(|o| o == "Gather" || o == "Range" || o == "Mul"),
            "the index arithmetic is gone: {ops:?}"
        );
        assert!(ops.iter().any(|o| o == "Reshape"), "{ops:?}");
    }

    #[test]
    fn a_gather_with_batch_and_sequence_both_symbolic_reshapes_the_unflattened_mask() {
        // The result [B,1,1,S,1] has two symbolic dims: the flattened [B·S,1] data cannot say
        // both, the mask [B,S] under the Flatten can (B copied as 0, S as the one -1).
        let (stats, ops) = simplified(torchscript_mask_of("B,S", 0, 0));
        assert_eq!(stats.gathers, 1, "{ops:?}");
        assert!(!ops.iter().any(|o| o == "Gather" || o == "Range" || o == "Mul"), "{ops:?}");
        let mut b = torchscript_mask_of("B,S", 0, 0);
        infer_graph(&mut b.g).unwrap();
        simplify(&mut b.g).unwrap();
        let reshape = b.g.nodes.iter().find(|n| n.op_type == "Reshape").unwrap();
        let target = b.g.values[reshape.inputs[1].unwrap()].konst.as_ref().unwrap().to_i64_vec();
        assert_eq!(target, [0, 1, 1, -1, 1]);
        // Shifted rows stay gathers with symbolic dims too.
        let mut b = torchscript_mask_of("B,S", 0, 1);
        infer_graph(&mut b.g).unwrap();
        assert_eq!(simplify(&mut b.g).unwrap().gathers, 0);
    }

    #[test]
    fn gathers_that_skip_or_shift_rows_stay() {
        // `b·(S+1) + s` skips elements; `(b+1)·S + s` starts a row late (and reads out of range
        // for the last row, which the reference executor rejects, so only the stats are checked).
        let mut b = torchscript_mask(1, 0);
        infer_graph(&mut b.g).unwrap();
        assert_eq!(simplify(&mut b.g).unwrap().gathers, 0);
        let mut b = torchscript_mask(0, 1);
        infer_graph(&mut b.g).unwrap();
        assert_eq!(simplify(&mut b.g).unwrap().gathers, 0);
    }

    /// `GatherND(mask, concat(expand(arange(B)[:,None,None,None]), expand(arange(S))))`, as the
    /// `torch.export` exporter writes it, with the components in `order`.
    fn dynamo_mask(swap: bool) -> GraphBuilder {
        let mut b = GraphBuilder::new(18);
        let m = b.input("mask", DType::I64, "B,5");
        let cast = b.node("Cast", vec![("to", Attr::Int(9))], &[m], 1)[0];
        let shape = b.node("Shape", vec![], &[m], 1)[0];
        let (k0, k1) = (b.konst("k0", scalar(0)), b.konst("k1", scalar(1)));
        let batch = b.node("Gather", vec![], &[shape, k0], 1)[0];
        let seq = b.node("Gather", vec![], &[shape, k1], 1)[0];
        let rows = b.node("Range", vec![], &[k0, batch, k1], 1)[0];
        let cols = b.node("Range", vec![], &[k0, seq, k1], 1)[0];
        let a123 = b.konst("a123", ints(&[1, 2, 3]));
        let a012 = b.konst("a012", ints(&[0, 1, 2]));
        let rows = b.node("Unsqueeze", vec![], &[rows, a123], 1)[0];
        let cols = b.node("Unsqueeze", vec![], &[cols, a012], 1)[0];
        let both = b.node("Max", vec![], &[rows, cols], 1)[0];
        let target = b.node("Shape", vec![], &[both], 1)[0];
        let rows = b.node("Expand", vec![], &[rows, target], 1)[0];
        let cols = b.node("Expand", vec![], &[cols, target], 1)[0];
        let last = b.konst("last", ints(&[-1]));
        let rows = b.node("Unsqueeze", vec![], &[rows, last], 1)[0];
        let cols = b.node("Unsqueeze", vec![], &[cols, last], 1)[0];
        let parts = if swap { [cols, rows] } else { [rows, cols] };
        let idx = b.node("Concat", vec![("axis", Attr::Int(-1))], &parts, 1)[0];
        let picked = b.node("GatherND", vec![], &[cast, idx], 1)[0];
        let out = b.node("Cast", vec![("to", Attr::Int(1))], &[picked], 1)[0];
        b.g.outputs.push(out);
        b
    }

    #[test]
    fn a_gather_nd_through_iota_tuples_becomes_a_reshape() {
        let (stats, ops) = simplified(dynamo_mask(false));
        assert_eq!(stats.gathers, 1, "{ops:?}");
        assert!(!ops.iter().any(|o| o == "GatherND" || o == "Range" || o == "Concat"), "{ops:?}");
        // Components in the other order read the transpose: not a reshape.
        let mut b = dynamo_mask(true);
        infer_graph(&mut b.g).unwrap();
        assert_eq!(simplify(&mut b.g).unwrap().gathers, 0);
    }

    #[test]
    fn logic_with_a_neutral_constant_is_its_operand_and_expands_sink_below_elementwise_ops() {
        // where(and(m, true[1,1,S,1]) expanded to [B,1,S,S], 0, -1e9): the And becomes a
        // broadcast of m, the Where runs on [B,1,1,S] and the Expand moves after it.
        let mut b = GraphBuilder::new(17);
        let m = b.input("mask", DType::I64, "B,5");
        let cast = b.node("Cast", vec![("to", Attr::Int(9))], &[m], 1)[0];
        let axes = b.konst("axes", ints(&[1, 2]));
        let m4 = b.node("Unsqueeze", vec![], &[cast, axes], 1)[0];
        let all_true = b.konst("t", Tensor::from_i64s(&[1, 1, 5, 1], vec![1; 5]).cast(DType::Bool));
        let and = b.node("And", vec![], &[all_true, m4], 1)[0];
        let shape = b.node("Shape", vec![], &[and], 1)[0];
        let full = b.node("Expand", vec![], &[and, shape], 1)[0];
        let (zero, neg) =
            (b.konst("zero", Tensor::from_f32s(&[], vec![0.0])), b.konst("neg", Tensor::from_f32s(&[], vec![-1e9])));
        let w = b.node("Where", vec![], &[full, zero, neg], 1)[0];
        b.g.outputs.push(w);
        let mut g = b.g.clone();
        infer_graph(&mut g).unwrap();
        let (stats, ops) = simplified(b);
        assert_eq!(stats.logic, 1, "{ops:?}");
        assert!(stats.sunk_expands >= 1, "{stats:?} {ops:?}");
        assert!(!ops.iter().any(|o| o == "And"), "{ops:?}");
        let wi = ops.iter().position(|o| o == "Where").unwrap();
        assert!(ops[wi + 1..].iter().any(|o| o == "Expand"), "the Where runs before the broadcast: {ops:?}");
        // An Xor with the same constant is not neutral.
        let xor = g.nodes.iter_mut().find(|n| n.op_type == "And").unwrap();
        xor.op = Box::new(LogicOp { kind: LogicKind::Xor });
        assert_eq!(simplify(&mut g).unwrap().logic, 0);
    }

    /// BERT's mask with a run-time seq: `And(ConstantOfShape(true, [1,1,S,1]), arange(S)[:,None]
    /// >= 0)` is all true without being a constant, so `And` of it with the mask `[B,1,1,S]` is
    /// the mask broadcast to `[B,1,S,S]`: an Expand to that value's (symbolic) shape.
    #[test]
    fn logic_with_a_provably_neutral_run_time_operand_is_a_broadcast() {
        for (cmp, k, neutral) in [("GreaterOrEqual", 0, true), ("Less", 0, false), ("Greater", -1, true)] {
            let mut b = GraphBuilder::new(17);
            let m = b.input("mask", DType::I64, "B,S");
            let cast = b.node("Cast", vec![("to", Attr::Int(9))], &[m], 1)[0];
            let axes = b.konst("axes", ints(&[1, 2]));
            let m4 = b.node("Unsqueeze", vec![], &[cast, axes], 1)[0];
            let shape = b.node("Shape", vec![], &[m], 1)[0];
            let (k0, k1) = (b.konst("k0", scalar(0)), b.konst("k1", scalar(1)));
            let seq = b.node("Gather", vec![], &[shape, k1], 1)[0];
            let cols = b.node("Range", vec![], &[k0, seq, k1], 1)[0];
            let a013 = b.konst("a013", ints(&[0, 1, 3]));
            let cols = b.node("Unsqueeze", vec![], &[cols, a013], 1)[0];
            let bound = b.konst("bound", scalar(k));
            let test = b.node(cmp, vec![], &[cols, bound], 1)[0];
            let fill = b.node("Shape", vec![], &[test], 1)[0];
            let value = Tensor::from_i64s(&[1], vec![neutral as i64]).cast(DType::Bool);
            let filled = b.node("ConstantOfShape", vec![("value", Attr::Tensor(value))], &[fill], 1)[0];
            let logic = if neutral { "And" } else { "Or" };
            let both = b.node(logic, vec![], &[filled, test], 1)[0];
            let out = b.node(logic, vec![], &[both, m4], 1)[0];
            let out = b.node("Cast", vec![("to", Attr::Int(1))], &[out], 1)[0];
            b.g.outputs.push(out);
            let (stats, ops) = simplified(b);
            assert_eq!(stats.logic, 2, "{cmp}: {ops:?}");
            assert!(!ops.iter().any(|o| o == logic), "{cmp}: {ops:?}");
            assert!(ops.iter().any(|o| o == "Expand"), "{cmp}: {ops:?}");
        }
        // A comparison the index's smallest value does not decide stays.
        let mut b = GraphBuilder::new(17);
        let m = b.input("mask", DType::I64, "B,S");
        let cast = b.node("Cast", vec![("to", Attr::Int(9))], &[m], 1)[0];
        let shape = b.node("Shape", vec![], &[m], 1)[0];
        let (k0, k1) = (b.konst("k0", scalar(0)), b.konst("k1", scalar(1)));
        let seq = b.node("Gather", vec![], &[shape, k1], 1)[0];
        let cols = b.node("Range", vec![], &[k0, seq, k1], 1)[0];
        let test = b.node("GreaterOrEqual", vec![], &[cols, k1], 1)[0];
        let out = b.node("And", vec![], &[cast, test], 1)[0];
        b.g.outputs.push(out);
        let (stats, ops) = simplified(b);
        assert_eq!(stats.logic, 0, "{ops:?}");
    }

    /// BERT's embeddings with a run-time sequence length, as the TorchScript export writes them
    /// (`mask` stands in for `input_ids [B, S]`): position ids `pos_buf[:, :S]` of an `arange`
    /// buffer; token-type ids `gather(expand(tt_buf), 1, position_ids)` expanded to `[B, S]`;
    /// each looked up in its table and added. `tt_buf` is the token-type buffer, `shift` the
    /// first position.
    fn embeddings(tt_buf: Vec<i64>, pos_buf: Vec<i64>, shift: i64) -> GraphBuilder {
        let mut b = GraphBuilder::new(17);
        let m = b.input("mask", DType::I64, "B,S");
        let pos_table = b.konst("pos_table", Tensor::from_f32s(&[8, 3], (0..24).map(|i| i as f32 * 0.5).collect()));
        let tt_table = b.konst("tt_table", Tensor::from_f32s(&[2, 3], vec![1.0, -2.0, 3.0, 0.25, 5.0, -6.0]));
        let pos_buf = b.konst("pos_buf", Tensor::from_i64s(&[1, 8], pos_buf));
        let tt_buf = b.konst("tt_buf", Tensor::from_i64s(&[1, 8], tt_buf));
        let shape = b.node("Shape", vec![], &[m], 1)[0];
        let k1 = b.konst("k1", scalar(1));
        let seq = b.node("Gather", vec![], &[shape, k1], 1)[0];
        let a0 = b.konst("a0", ints(&[0]));
        let seq1 = b.node("Unsqueeze", vec![], &[seq, a0], 1)[0];
        let start = b.konst("start", ints(&[shift]));
        let end = b.node("Add", vec![], &[seq1, start], 1)[0];
        let axis1 = b.konst("axis1", ints(&[1]));
        let pos_ids = b.node("Slice", vec![], &[pos_buf, start, end, axis1], 1)[0];
        let one_minus1 = b.konst("one_minus1", ints(&[1, 8]));
        let tt = b.node("Expand", vec![], &[tt_buf, one_minus1], 1)[0];
        let tt = b.node("GatherElements", vec![("axis", Attr::Int(1))], &[tt, pos_ids], 1)[0];
        let tt = b.node("Expand", vec![], &[tt, shape], 1)[0];
        let words = b.node("Cast", vec![("to", Attr::Int(1))], &[m], 1)[0];
        let a2 = b.konst("a2", ints(&[2]));
        let words = b.node("Unsqueeze", vec![], &[words, a2], 1)[0];
        let tt_rows = b.node("Gather", vec![], &[tt_table, tt], 1)[0];
        let pos_rows = b.node("Gather", vec![], &[pos_table, pos_ids], 1)[0];
        let sum = b.node("Add", vec![], &[words, tt_rows], 1)[0];
        let sum = b.node("Add", vec![], &[sum, pos_rows], 1)[0];
        b.g.outputs.push(sum);
        b
    }

    #[test]
    fn embedding_lookups_of_a_run_time_sequence_become_a_constant_row_and_a_table_prefix() {
        // The token-type lookup reads one row (all ids 0) and the position lookup rows 0..S: no
        // Gather or GatherElements is left; the positions are a Slice of the table.
        let (stats, g) = simplified_graph(embeddings(vec![0; 8], (0..8).collect(), 0));
        let ops: Vec<&str> = g.nodes.iter().map(|n| n.op_type.as_str()).collect();
        assert_eq!((stats.constant_rows, stats.prefix_slices), (1, 1), "{stats:?} {ops:?}");
        assert!(!ops.contains(&"GatherElements"), "{ops:?}");
        // The token-type row folded into a constant; the position table is sliced.
        assert_eq!(readers_of(&g, "tt_table"), Vec::<String>::new(), "{ops:?}");
        assert_eq!(readers_of(&g, "pos_table"), ["Slice"], "{ops:?}");
        // All ids 1 (negative ids count from the end: -1 is row 1 too): still one row.
        for ids in [vec![1; 8], vec![-1; 8]] {
            let (stats, ops) = simplified(embeddings(ids, (0..8).collect(), 0));
            assert_eq!(stats.constant_rows, 1, "{stats:?} {ops:?}");
        }
    }

    #[test]
    fn embedding_lookups_that_are_not_one_row_or_a_prefix_stay_gathers() {
        // Token types that differ along the sequence: a gather of several rows.
        let (stats, g) = simplified_graph(embeddings(vec![0, 1, 0, 1, 1, 0, 0, 1], (0..8).collect(), 0));
        assert_eq!(stats.constant_rows, 0, "{stats:?}");
        assert_eq!(readers_of(&g, "tt_table"), ["Gather"]);
        assert_eq!(stats.prefix_slices, 1, "{stats:?}");
        // Positions counting by 2 skip rows; positions from 1 do not start at row 0.
        let (stats, ops) = simplified(embeddings(vec![0; 8], (0..8).map(|i| 2 * i % 8).collect(), 0));
        assert_eq!(stats.prefix_slices, 0, "{stats:?} {ops:?}");
        let (stats, ops) = simplified(embeddings(vec![0; 8], (0..8).collect(), 1));
        assert_eq!(stats.prefix_slices, 0, "{stats:?} {ops:?}");
        assert_eq!(stats.constant_rows, 1, "the token types stay one row: {stats:?} {ops:?}");
    }

    #[test]
    fn a_gather_of_an_expanded_index_gathers_first() {
        // Token-type embeddings of an all-zero buffer expanded to [B, S]: the gathered rows fold
        // into a constant and the Add reads it through broadcasting.
        let mut b = GraphBuilder::new(17);
        let m = b.input("mask", DType::I64, "B,5");
        let table = b.konst("table", Tensor::from_f32s(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        let ids = b.konst("ids", Tensor::from_i64s(&[1, 5], vec![0, 1, 0, 1, 1]));
        let shape = b.node("Shape", vec![], &[m], 1)[0];
        let ids = b.node("Expand", vec![], &[ids, shape], 1)[0];
        let rows = b.node("Gather", vec![], &[table, ids], 1)[0];
        let x = b.node("Cast", vec![("to", Attr::Int(1))], &[m], 1)[0];
        let axes = b.konst("axes", ints(&[2]));
        let x = b.node("Unsqueeze", vec![], &[x, axes], 1)[0];
        let y = b.node("Add", vec![], &[x, rows], 1)[0];
        b.g.outputs.push(y);
        let (stats, ops) = simplified(b);
        assert!(stats.sunk_expands >= 2, "{stats:?} {ops:?}");
        assert!(!ops.iter().any(|o| o == "Gather" || o == "Expand"), "{ops:?}");
    }
}
