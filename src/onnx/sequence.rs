//! Compile-time lowering of ONNX sequence ops to tensor ops.
//!
//! onnx2ait holds tensors only. A sequence whose *structure* (its length, and which tensor sits
//! at each position) is known at compile time is just a list of tensor values, so this pass,
//! run on the `GraphProto` before the IR is built, tracks every sequence value as a list of
//! tensor value names and rewrites the sequence ops into tensor ops:
//!
//! | sequence op | lowered to |
//! |---|---|
//! | `SequenceEmpty`, `SequenceConstruct` | nothing (the list itself) |
//! | `SequenceInsert`, `SequenceErase` | nothing (list edit at a constant or absent position) |
//! | `SequenceAt` | `Identity` of the element at a constant position |
//! | `SequenceLength` | `Constant` (int64 scalar) |
//! | `ConcatFromSequence` | `Concat` (after `Unsqueeze` of every element when `new_axis=1`) |
//! | `SplitToSequence` | `Split` (then `Squeeze` when `keepdims=0` and `split` is absent) |
//!
//! Positions and split sizes must be compile-time values: initializers, `Constant` nodes or
//! anything inference folds to a constant (shape subgraphs included). To read them, and the
//! static dims `SplitToSequence` needs, the pass imports the slice of the already-lowered graph
//! that produces the value ("probe") and reads the inferred fact, so it sees exactly what the
//! importer's inference sees. A sequence whose structure depends on run-time data (a position
//! read from a graph input, a split count from a symbolic dim) fails with an error naming the
//! node and op.
//!
//! The chunks of a `SplitToSequence` are materialised only when an element is read
//! (`SequenceAt`, `ConcatFromSequence`), so a sequence consumed only by `SequenceLength` costs
//! no nodes — and a run-time `split` of known length works for `SequenceLength` at any opset,
//! while reading its chunks needs opset 13 (where `Split` takes its sizes as an input).
//!
//! Sequences may not cross the graph boundary (sequence-typed graph inputs or outputs) nor be
//! read by tensor ops (If/Loop/Scan bodies are not supported anyway); both fail clearly.

use super::import::{node_names, ModelFile};
use super::proto::{
    attribute_proto::AttributeType, AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, ValueInfoProto,
};
use crate::error::{Error, Result};
use crate::ir::ops::normalize_domain;
use crate::ir::{Tensor, ValueType};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The sequence ops of the default ONNX domain this pass lowers.
pub const SEQUENCE_OPS: &[&str] = &[
    "ConcatFromSequence",
    "SequenceAt",
    "SequenceConstruct",
    "SequenceEmpty",
    "SequenceErase",
    "SequenceInsert",
    "SequenceLength",
    "SplitToSequence",
];

/// Longest sequence the pass builds: every element becomes its own value (and `Split` output),
/// so a `SplitToSequence` over a huge axis must fail cleanly rather than exhaust memory.
const MAX_SEQUENCE_LEN: usize = 1 << 16;

/// Whether `(domain, op_type)` is a sequence op lowered by this pass.
pub fn is_sequence_op(domain: &str, op_type: &str) -> bool {
    normalize_domain(domain).is_empty() && SEQUENCE_OPS.contains(&op_type)
}

/// The model with its sequence ops lowered to tensor ops, or `None` when it has none.
pub fn lower_sequences(mf: &ModelFile) -> Result<Option<ModelFile>> {
    let Some(gp) = mf.proto.graph.as_ref() else {
        return Ok(None);
    };
    let uses_sequences =
        gp.node.iter().any(|n| is_sequence_op(n.domain.as_deref().unwrap_or(""), n.op_type.as_deref().unwrap_or("")));
    if !uses_sequences {
        return Ok(None);
    }
    // Unsupported ops are reported for the whole model at once, as the importer does, rather
    // than piecemeal by whichever probe first meets one.
    let unsupported = mf.unsupported_ops();
    if !unsupported.is_empty() {
        return Err(Error::Unsupported { path: mf.source(), ops: unsupported });
    }
    let opset = mf.opsets().get("").copied().unwrap_or(0);
    if opset < 11 {
        return Err(Error::model(
            &mf.source(),
            format!("the model uses sequence ops, which exist from opset 11, but imports opset {opset} of the default domain"),
        ));
    }
    let mut lowering = Lowering::new(mf, gp, opset);
    lowering.run()?;
    let Lowering { nodes, new_initializers, .. } = lowering;
    let mut proto = mf.proto.clone();
    if let Some(graph) = proto.graph.as_mut() {
        graph.node = nodes;
        graph.initializer.extend(new_initializers);
    }
    Ok(Some(ModelFile { path: mf.path.clone(), proto }))
}

/// One element of a tracked sequence.
#[derive(Clone, Debug)]
enum Element {
    /// A tensor value of the graph.
    Value(String),
    /// Chunk `index` of the `SplitToSequence` recorded at `pending[split]`, not yet emitted.
    Chunk { split: usize, index: usize },
}

/// Chunk sizes of a `SplitToSequence`.
#[derive(Clone, Debug)]
enum SplitSizes {
    Known(Vec<i64>),
    /// A run-time 1-D `split` input of static length `count`.
    Runtime {
        input: String,
        count: usize,
    },
}

/// A `SplitToSequence` whose chunks are emitted on first read.
#[derive(Clone, Debug)]
struct PendingSplit {
    node: String,
    input: String,
    axis: i64,
    sizes: SplitSizes,
    /// `keepdims=0` with `split` absent: each chunk (of size 1) loses the split axis.
    squeeze: bool,
    /// The chunk value names, once emitted.
    emitted: Option<Vec<String>>,
}

struct Lowering<'a> {
    mf: &'a ModelFile,
    gp: &'a GraphProto,
    src: String,
    opset: i64,
    /// Lowered nodes, in the original (topological) order, with generated nodes in place.
    nodes: Vec<NodeProto>,
    new_initializers: Vec<TensorProto>,
    sequences: BTreeMap<String, Vec<Element>>,
    pending: Vec<PendingSplit>,
    /// Every value and node name in use, so generated names never collide.
    used_names: BTreeSet<String>,
}

impl<'a> Lowering<'a> {
    fn new(mf: &'a ModelFile, gp: &'a GraphProto, opset: i64) -> Self {
        let mut used_names = BTreeSet::new();
        for n in &gp.node {
            used_names.extend(n.input.iter().chain(&n.output).cloned());
            used_names.extend(n.name.clone());
        }
        used_names.extend(gp.initializer.iter().filter_map(|t| t.name.clone()));
        used_names.extend(gp.input.iter().chain(&gp.output).filter_map(|v| v.name.clone()));
        Lowering {
            mf,
            gp,
            src: mf.source(),
            opset,
            nodes: Vec::new(),
            new_initializers: Vec::new(),
            sequences: BTreeMap::new(),
            pending: Vec::new(),
            used_names,
        }
    }

    fn run(&mut self) -> Result<()> {
        let names = node_names(self.gp);
        for i in self.topo_order()? {
            let node = &self.gp.node[i];
            let op_type = node.op_type.as_deref().unwrap_or("");
            if is_sequence_op(node.domain.as_deref().unwrap_or(""), op_type) {
                self.lower(node, &names[i], op_type)?;
            } else {
                let mut node = node.clone();
                if let Some(inp) = node.input.iter().find(|i| self.sequences.contains_key(*i)) {
                    return Err(Error::node(
                        &self.src,
                        &names[i],
                        op_type,
                        format!("input '{inp}' is a sequence, which only sequence ops can read (onnx2ait lowers sequences to tensors at compile time)"),
                    ));
                }
                // Keep the name the importer would give it in the original model, so messages
                // about this node read the same whether or not the model had sequences.
                node.name = Some(names[i].clone());
                self.nodes.push(node);
            }
        }
        for out in &self.gp.output {
            let name = out.name.as_deref().unwrap_or("");
            if self.sequences.contains_key(name) {
                return Err(Error::model(
                    &self.src,
                    format!("graph output '{name}' is a sequence: onnx2ait holds tensors only, so sequences can only be used inside the graph"),
                ));
            }
        }
        Ok(())
    }

    /// Node indices in topological order (file order among ready nodes).
    fn topo_order(&self) -> Result<Vec<usize>> {
        let nodes = &self.gp.node;
        let mut producer: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, n) in nodes.iter().enumerate() {
            for o in n.output.iter().filter(|o| !o.is_empty()) {
                producer.insert(o.as_str(), i);
            }
        }
        let mut indegree = vec![0usize; nodes.len()];
        let mut users: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (i, n) in nodes.iter().enumerate() {
            let deps: BTreeSet<usize> = n.input.iter().filter_map(|v| producer.get(v.as_str()).copied()).collect();
            indegree[i] = deps.len();
            for d in deps {
                users[d].push(i);
            }
        }
        let mut ready: BTreeSet<usize> = (0..nodes.len()).filter(|&i| indegree[i] == 0).collect();
        let mut order = Vec::with_capacity(nodes.len());
        while let Some(i) = ready.pop_first() {
            order.push(i);
            for &u in &users[i] {
                indegree[u] -= 1;
                if indegree[u] == 0 {
                    ready.insert(u);
                }
            }
        }
        if order.len() != nodes.len() {
            let names = node_names(self.gp);
            let stuck: Vec<&str> = (0..nodes.len()).filter(|&i| indegree[i] > 0).map(|i| names[i].as_str()).collect();
            return Err(Error::model(
                &self.src,
                format!("the graph has a cycle through node(s): {}", stuck.join(", ")),
            ));
        }
        Ok(order)
    }

    fn lower(&mut self, node: &NodeProto, name: &str, op_type: &str) -> Result<()> {
        let src = self.src.clone();
        let err = |msg: String| Error::node(&src, name, op_type, msg);
        let input = |k: usize| node.input.get(k).filter(|s| !s.is_empty()).cloned();
        let output = node.output.first().filter(|s| !s.is_empty()).cloned();
        let output = output.ok_or_else(|| err("the node has no output".into()))?;
        match op_type {
            "SequenceEmpty" => {
                self.sequences.insert(output, Vec::new());
            }
            "SequenceConstruct" => {
                op_inputs_are_tensors(self, node).map_err(err)?;
                let items = node.input.iter().map(|s| Element::Value(s.clone())).collect();
                self.sequences.insert(output, items);
            }
            "SequenceInsert" => {
                let mut seq = self.sequence(input(0), "input_sequence").map_err(err)?;
                let tensor = input(1).ok_or_else(|| err("input 1 (tensor) is required but missing".into()))?;
                if self.sequences.contains_key(&tensor) {
                    return Err(err(format!("input 'tensor' ('{tensor}') must be a tensor, found a sequence")));
                }
                let len = seq.len() as i64;
                let at = match input(2) {
                    None => len,
                    Some(p) => {
                        let pos = self.position(&p, name, op_type)?;
                        // Insert positions range over [-n, n]; n appends.
                        if !(-len..=len).contains(&pos) {
                            return Err(err(format!("position {pos} is out of range for a sequence of length {len}")));
                        }
                        if pos < 0 {
                            pos + len
                        } else {
                            pos
                        }
                    }
                };
                seq.insert(at as usize, Element::Value(tensor));
                self.sequences.insert(output, seq);
            }
            "SequenceErase" => {
                let mut seq = self.sequence(input(0), "input_sequence").map_err(err)?;
                let pos = match input(1) {
                    None => -1,
                    Some(p) => self.position(&p, name, op_type)?,
                };
                let at = element_index(pos, seq.len()).map_err(err)?;
                seq.remove(at);
                self.sequences.insert(output, seq);
            }
            "SequenceAt" => {
                let seq = self.sequence(input(0), "input_sequence").map_err(err)?;
                let p = input(1).ok_or_else(|| err("input 1 (position) is required but missing".into()))?;
                let pos = self.position(&p, name, op_type)?;
                let at = element_index(pos, seq.len()).map_err(err)?;
                let value = self.materialize(&seq[at])?;
                self.nodes.push(make_node("Identity", &format!("{name}/Identity"), vec![value], vec![output], vec![]));
            }
            "SequenceLength" => {
                let seq = self.sequence(input(0), "input_sequence").map_err(err)?;
                let value = TensorProto {
                    dims: vec![],
                    data_type: Some(7),
                    int64_data: vec![seq.len() as i64],
                    ..Default::default()
                };
                let attr = AttributeProto {
                    name: Some("value".into()),
                    r#type: Some(AttributeType::Tensor as i32),
                    t: Some(value),
                    ..Default::default()
                };
                self.nodes.push(make_node("Constant", &format!("{name}/Constant"), vec![], vec![output], vec![attr]));
            }
            "ConcatFromSequence" => self.lower_concat(node, name, op_type, output)?,
            "SplitToSequence" => self.lower_split(node, name, op_type, output)?,
            other => return Err(err(format!("'{other}' is not a sequence op this pass lowers"))),
        }
        Ok(())
    }

    /// ConcatFromSequence (opset 11): `Concat` along `axis`; with `new_axis=1` every element
    /// first gets a new dim at `axis` (in `[-r-1, r]`, negative counting from the output rank —
    /// the same convention as `Unsqueeze`), which makes it a stack.
    fn lower_concat(&mut self, node: &NodeProto, name: &str, op_type: &str, output: String) -> Result<()> {
        let src = self.src.clone();
        let err = |msg: String| Error::node(&src, name, op_type, msg);
        let axis =
            int_attr(node, "axis").map_err(err)?.ok_or_else(|| err("required attribute 'axis' is missing".into()))?;
        let new_axis = match int_attr(node, "new_axis").map_err(err)?.unwrap_or(0) {
            0 => false,
            1 => true,
            v => return Err(err(format!("attribute 'new_axis' must be 0 or 1, found {v}"))),
        };
        let seq = self.sequence(node.input.first().cloned(), "input_sequence").map_err(err)?;
        if seq.is_empty() {
            return Err(err("the sequence is empty: ConcatFromSequence of no tensors has no defined type".into()));
        }
        let mut parts = Vec::with_capacity(seq.len());
        for (k, e) in seq.iter().enumerate() {
            let v = self.materialize(e)?;
            if new_axis {
                let out = self.fresh(&format!("{name}/unsqueezed_{k}"));
                let node = self.axes_node("Unsqueeze", &format!("{name}/Unsqueeze_{k}"), v, out.clone(), axis);
                self.nodes.push(node);
                parts.push(out);
            } else {
                parts.push(v);
            }
        }
        self.nodes.push(make_node(
            "Concat",
            &format!("{name}/Concat"),
            parts,
            vec![output],
            vec![int_attr_proto("axis", axis)],
        ));
        Ok(())
    }

    /// SplitToSequence (opset 11). `split` absent: chunks of 1 along `axis`, one per element
    /// of the (static) axis, squeezed away when `keepdims=0`. `split` a scalar: chunks of that
    /// size, the last one holding the rest (needs a static axis). `split` 1-D: one chunk per
    /// entry; its values may be run-time data when its length is static. `keepdims` is ignored
    /// when `split` is given, as the spec says.
    fn lower_split(&mut self, node: &NodeProto, name: &str, op_type: &str, output: String) -> Result<()> {
        let src = self.src.clone();
        let err = |msg: String| Error::node(&src, name, op_type, msg);
        let x = node
            .input
            .first()
            .filter(|s| !s.is_empty())
            .cloned()
            .ok_or_else(|| err("input 0 (input) is required but missing".into()))?;
        let axis = int_attr(node, "axis").map_err(err)?.unwrap_or(0);
        let keepdims = match int_attr(node, "keepdims").map_err(err)?.unwrap_or(1) {
            0 => false,
            1 => true,
            v => return Err(err(format!("attribute 'keepdims' must be 0 or 1, found {v}"))),
        };
        let split = node.input.get(1).filter(|s| !s.is_empty()).cloned();
        let (x_ty, _) = self.probe(&x, name, op_type)?;
        let rank = x_ty.rank() as i64;
        if !(-rank..rank).contains(&axis) {
            return Err(err(format!("axis {axis} is out of range for rank {rank}")));
        }
        let dim = &x_ty.shape[if axis < 0 { axis + rank } else { axis } as usize];
        let static_dim = |why: &str| {
            dim.as_known().ok_or_else(|| {
                err(format!("{why} needs the size of axis {axis} of '{x}' at compile time, but it is {dim} (the sequence length would depend on run-time data)"))
            })
        };
        // Checked before anything of that length is allocated.
        let count_ok = |n: i64| {
            if n > MAX_SEQUENCE_LEN as i64 {
                Err(err(format!(
                    "the sequence would have {n} elements; at most {MAX_SEQUENCE_LEN} are supported, since each becomes its own tensor"
                )))
            } else {
                Ok(n.max(0) as usize)
            }
        };
        let (sizes, squeeze) = match split {
            None => (SplitSizes::Known(vec![1; count_ok(static_dim("splitting into chunks of 1")?)?]), !keepdims),
            Some(s) => {
                let (s_ty, s_konst) = self.probe(&s, name, op_type)?;
                if !s_ty.dtype.is_int() {
                    return Err(err(format!("input 'split' must be an integer tensor, found {}", s_ty.dtype)));
                }
                match (s_ty.rank(), s_konst) {
                    (0, Some(k)) => {
                        let chunk = k.to_i64_vec()[0];
                        if chunk <= 0 {
                            return Err(err(format!("split size {chunk} must be positive")));
                        }
                        let d = static_dim("a scalar 'split'")?;
                        let mut sizes = vec![chunk; count_ok(d / chunk)?];
                        if d % chunk != 0 {
                            sizes.push(d % chunk);
                        }
                        (SplitSizes::Known(sizes), false)
                    }
                    (0, None) => {
                        return Err(err(format!(
                            "the scalar 'split' ('{s}') is only known at run time, so the number of chunks is not known at compile time"
                        )))
                    }
                    (1, Some(k)) => {
                        let sizes = k.to_i64_vec();
                        count_ok(sizes.len() as i64)?;
                        if let Some(v) = sizes.iter().find(|v| **v < 0) {
                            return Err(err(format!("split {sizes:?} contains the negative size {v}")));
                        }
                        if let Some(d) = dim.as_known() {
                            let total: i64 = sizes.iter().sum();
                            if total != d {
                                return Err(err(format!("split {sizes:?} sums to {total}, but axis {axis} has size {d}")));
                            }
                        }
                        (SplitSizes::Known(sizes), false)
                    }
                    (1, None) => match s_ty.shape[0].as_known() {
                        Some(n) => (SplitSizes::Runtime { input: s, count: count_ok(n)? }, false),
                        None => {
                            return Err(err(format!(
                                "input 'split' ('{s}') has the non-static length {}, so the number of chunks is not known at compile time",
                                s_ty.shape[0]
                            )))
                        }
                    },
                    (r, _) => return Err(err(format!("input 'split' must be a scalar or 1-D, found rank {r}"))),
                }
            }
        };
        let count = match &sizes {
            SplitSizes::Known(s) => s.len(),
            SplitSizes::Runtime { count, .. } => *count,
        };
        let split = self.pending.len();
        self.pending.push(PendingSplit { node: name.to_string(), input: x, axis, sizes, squeeze, emitted: None });
        self.sequences.insert(output, (0..count).map(|index| Element::Chunk { split, index }).collect());
        Ok(())
    }

    /// The value name of an element, emitting its `SplitToSequence` chunks on first use.
    fn materialize(&mut self, e: &Element) -> Result<String> {
        let (split, index) = match e {
            Element::Value(v) => return Ok(v.clone()),
            Element::Chunk { split, index } => (*split, *index),
        };
        if let Some(names) = &self.pending[split].emitted {
            return Ok(names[index].clone());
        }
        let p = self.pending[split].clone();
        let count = match &p.sizes {
            SplitSizes::Known(s) => s.len(),
            SplitSizes::Runtime { count, .. } => *count,
        };
        let parts: Vec<String> = (0..count).map(|k| self.fresh(&format!("{}/chunk_{k}", p.node))).collect();
        let split_node = format!("{}/Split", p.node);
        let mut attrs = vec![int_attr_proto("axis", p.axis)];
        let mut inputs = vec![p.input.clone()];
        match &p.sizes {
            SplitSizes::Known(sizes) if self.opset < 13 => attrs.push(ints_attr_proto("split", sizes)),
            SplitSizes::Known(sizes) => {
                let name = self.fresh(&format!("{}/split_sizes", p.node));
                self.new_initializers.push(int64_tensor(&name, sizes));
                inputs.push(name);
            }
            SplitSizes::Runtime { .. } if self.opset < 13 => {
                return Err(Error::node(
                    &self.src,
                    &p.node,
                    "SplitToSequence",
                    format!(
                        "reading the chunks of a run-time 'split' needs opset 13 or later (where Split takes its sizes as an input); the model imports opset {}",
                        self.opset
                    ),
                ))
            }
            SplitSizes::Runtime { input, .. } => inputs.push(input.clone()),
        }
        self.nodes.push(make_node("Split", &split_node, inputs, parts.clone(), attrs));
        let names = if p.squeeze {
            let mut squeezed = Vec::with_capacity(count);
            for (k, part) in parts.into_iter().enumerate() {
                let out = self.fresh(&format!("{}/item_{k}", p.node));
                let node = self.axes_node("Squeeze", &format!("{}/Squeeze_{k}", p.node), part, out.clone(), p.axis);
                self.nodes.push(node);
                squeezed.push(out);
            }
            squeezed
        } else {
            parts
        };
        let value = names[index].clone();
        self.pending[split].emitted = Some(names);
        Ok(value)
    }

    /// A `Squeeze`/`Unsqueeze` of one axis: an attribute before opset 13, an input from 13.
    fn axes_node(&mut self, op: &str, name: &str, input: String, output: String, axis: i64) -> NodeProto {
        if self.opset < 13 {
            make_node(op, name, vec![input], vec![output], vec![ints_attr_proto("axes", &[axis])])
        } else {
            let axes = self.fresh(&format!("{name}/axes"));
            self.new_initializers.push(int64_tensor(&axes, &[axis]));
            make_node(op, name, vec![input, axes], vec![output], vec![])
        }
    }

    fn sequence(&self, name: Option<String>, what: &str) -> std::result::Result<Vec<Element>, String> {
        let name = name.filter(|n| !n.is_empty()).ok_or_else(|| format!("input '{what}' is required but missing"))?;
        self.sequences.get(&name).cloned().ok_or_else(|| {
            format!("input '{what}' ('{name}') is not a sequence built in this graph (sequence graph inputs are not supported)")
        })
    }

    /// A position input, which must be a compile-time integer scalar.
    fn position(&mut self, value: &str, node: &str, op_type: &str) -> Result<i64> {
        let (ty, konst) = self.probe(value, node, op_type)?;
        let err = |msg: String| Error::node(&self.src, node, op_type, msg);
        if !ty.dtype.is_int() || ty.rank() > 1 || ty.shape.iter().any(|d| d.as_known() != Some(1)) {
            return Err(err(format!("input 'position' ('{value}') must be an integer scalar, found {ty}")));
        }
        match konst {
            Some(t) => Ok(t.to_i64_vec()[0]),
            None => Err(err(format!(
                "input 'position' ('{value}') is only known at run time; onnx2ait lowers sequences to tensors at compile time, so positions must be constants"
            ))),
        }
    }

    /// Type and (if constant) contents of a tensor value, by importing the lowered nodes that
    /// produce it, so inference and constant folding decide exactly as they will in the model.
    fn probe(&mut self, value: &str, node: &str, op_type: &str) -> Result<(ValueType, Option<Arc<Tensor>>)> {
        if self.sequences.contains_key(value) {
            return Err(Error::node(
                &self.src,
                node,
                op_type,
                format!("'{value}' is a sequence where a tensor is expected"),
            ));
        }
        let known = self.nodes.iter().any(|n| n.output.iter().any(|o| o == value))
            || self.gp.initializer.iter().chain(&self.new_initializers).any(|t| t.name.as_deref() == Some(value))
            || self.gp.input.iter().any(|v| v.name.as_deref() == Some(value));
        if !known {
            return Err(Error::node(
                &self.src,
                node,
                op_type,
                format!("input '{value}' is not produced by any node, initializer or graph input"),
            ));
        }
        // The nodes `value` depends on, walking the lowered nodes backwards.
        let mut needed: BTreeSet<&str> = BTreeSet::from([value]);
        let mut slice = vec![false; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate().rev() {
            if n.output.iter().any(|o| needed.contains(o.as_str())) {
                slice[i] = true;
                needed.extend(n.input.iter().filter(|s| !s.is_empty()).map(String::as_str));
            }
        }
        let probe_name = {
            let mut k = 0;
            loop {
                let candidate = format!("{value}/probe_{k}");
                if !self.used_names.contains(&candidate) {
                    break candidate;
                }
                k += 1;
            }
        };
        let mut nodes: Vec<NodeProto> =
            self.nodes.iter().zip(&slice).filter(|(_, s)| **s).map(|(n, _)| n.clone()).collect();
        nodes.push(make_node("Identity", &probe_name, vec![value.to_string()], vec![probe_name.clone()], vec![]));
        let initializer = self
            .gp
            .initializer
            .iter()
            .chain(&self.new_initializers)
            .filter(|t| t.name.as_deref().is_some_and(|n| needed.contains(n)))
            .cloned()
            .collect();
        let graph = GraphProto {
            node: nodes,
            name: self.gp.name.clone(),
            initializer,
            input: self.gp.input.clone(),
            output: vec![ValueInfoProto { name: Some(probe_name), ..Default::default() }],
            ..Default::default()
        };
        let proto = ModelProto {
            ir_version: self.mf.proto.ir_version,
            opset_import: self.mf.proto.opset_import.clone(),
            graph: Some(graph),
            ..Default::default()
        };
        let g = ModelFile { path: self.mf.path.clone(), proto }.to_graph()?;
        let out = g.outputs[0];
        let v = &g.values[out];
        let ty =
            v.ty.clone()
                .ok_or_else(|| Error::node(&self.src, node, op_type, format!("no type was inferred for '{value}'")))?;
        Ok((ty, v.konst.clone()))
    }

    fn fresh(&mut self, base: &str) -> String {
        let mut name = base.to_string();
        let mut k = 1;
        while self.used_names.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.used_names.insert(name.clone());
        name
    }
}

/// Elements of SequenceConstruct must be tensors.
fn op_inputs_are_tensors(l: &Lowering, node: &NodeProto) -> std::result::Result<(), String> {
    for (k, i) in node.input.iter().enumerate() {
        if i.is_empty() {
            return Err(format!("input {k} is empty: every element of SequenceConstruct must be a tensor"));
        }
        if l.sequences.contains_key(i) {
            return Err(format!("input {k} ('{i}') is a sequence: sequences of sequences are not supported"));
        }
    }
    Ok(())
}

/// Maps a position in `[-n, n)` to an element index.
fn element_index(pos: i64, len: usize) -> std::result::Result<usize, String> {
    let n = len as i64;
    if !(-n..n).contains(&pos) {
        return Err(format!("position {pos} is out of range for a sequence of length {len}"));
    }
    Ok(if pos < 0 { pos + n } else { pos } as usize)
}

fn int_attr(node: &NodeProto, name: &str) -> std::result::Result<Option<i64>, String> {
    match node.attribute.iter().find(|a| a.name.as_deref() == Some(name)) {
        None => Ok(None),
        Some(a) if a.r#type.is_none_or(|t| t == AttributeType::Int as i32) => Ok(Some(a.i.unwrap_or(0))),
        Some(_) => Err(format!("attribute '{name}' must be INT")),
    }
}

fn make_node(
    op: &str,
    name: &str,
    inputs: Vec<String>,
    outputs: Vec<String>,
    attribute: Vec<AttributeProto>,
) -> NodeProto {
    NodeProto {
        input: inputs,
        output: outputs,
        name: Some(name.to_string()),
        op_type: Some(op.to_string()),
        attribute,
        ..Default::default()
    }
}

fn int_attr_proto(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(v),
        ..Default::default()
    }
}

fn ints_attr_proto(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Ints as i32),
        ints: v.to_vec(),
        ..Default::default()
    }
}

fn int64_tensor(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.to_string()),
        dims: vec![v.len() as i64],
        data_type: Some(7),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::super::proto::{tensor_shape_proto, type_proto, OperatorSetIdProto, TensorShapeProto, TypeProto};
    use super::*;
    use std::path::PathBuf;

    fn tensor_vi(name: &str, elem: i32, dims: &[i64]) -> ValueInfoProto {
        let dim = dims
            .iter()
            .map(|&d| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(d)),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(elem),
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(op: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<AttributeProto>) -> NodeProto {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        NodeProto {
            op_type: Some(op.into()),
            input: s(inputs),
            output: s(outputs),
            attribute: attrs,
            ..Default::default()
        }
    }

    fn scalar(name: &str, v: i64) -> TensorProto {
        TensorProto { name: Some(name.into()), data_type: Some(7), int64_data: vec![v], ..Default::default() }
    }

    /// A model of float32 inputs `[2,3]` named in `inputs`, with `outputs` untyped.
    fn model(
        opset: i64,
        nodes: Vec<NodeProto>,
        inputs: &[&str],
        inits: Vec<TensorProto>,
        outputs: &[&str],
    ) -> ModelFile {
        let graph = GraphProto {
            node: nodes,
            name: Some("g".into()),
            initializer: inits,
            input: inputs.iter().map(|n| tensor_vi(n, 1, &[2, 3])).collect(),
            output: outputs
                .iter()
                .map(|n| ValueInfoProto { name: Some(n.to_string()), ..Default::default() })
                .collect(),
            ..Default::default()
        };
        let proto = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
            graph: Some(graph),
            ..Default::default()
        };
        ModelFile { path: PathBuf::from("seq.onnx"), proto }
    }

    fn run(mf: &ModelFile, feeds: &[(&str, Tensor)]) -> Vec<Tensor> {
        let g = mf.to_graph().unwrap_or_else(|e| panic!("{e}"));
        let feeds = feeds.iter().map(|(n, t)| (n.to_string(), t.clone())).collect();
        crate::reference::run(&g, &feeds).unwrap_or_else(|e| panic!("{e}")).into_iter().map(|(_, t)| t).collect()
    }

    fn iota(offset: f32) -> Tensor {
        Tensor::from_f32s(&[2, 3], (0..6).map(|v| v as f32 + offset).collect())
    }

    #[test]
    fn insert_erase_at_and_stack_lower_to_tensor_ops() {
        // [x, y] → insert z at -1 → [x, z, y] → erase 0 → [z, y]; At(-1) = y; stack on a new
        // last axis gives [2, 3, 2]. Opset 11 (axes as attributes) and 13 (axes as inputs).
        for opset in [11, 13] {
            let mf = model(
                opset,
                vec![
                    node("SequenceConstruct", &["x", "y"], &["s1"], vec![]),
                    node("SequenceInsert", &["s1", "z", "minus_one"], &["s2"], vec![]),
                    node("SequenceErase", &["s2", "zero"], &["s3"], vec![]),
                    node("SequenceAt", &["s3", "minus_one"], &["at"], vec![]),
                    node(
                        "ConcatFromSequence",
                        &["s3"],
                        &["stacked"],
                        vec![int_attr_proto("axis", -1), int_attr_proto("new_axis", 1)],
                    ),
                    node("SequenceLength", &["s3"], &["len"], vec![]),
                ],
                &["x", "y", "z"],
                vec![scalar("minus_one", -1), scalar("zero", 0)],
                &["at", "stacked", "len"],
            );
            let out = run(&mf, &[("x", iota(0.0)), ("y", iota(10.0)), ("z", iota(20.0))]);
            assert_eq!(out[0], iota(10.0), "opset {opset}");
            assert_eq!(out[1].shape(), &[2, 3, 2]);
            assert_eq!(out[1].to_f64_vec()[..4], [20.0, 10.0, 21.0, 11.0]);
            assert_eq!(out[2], Tensor::from_i64s(&[], vec![2]));
        }
    }

    #[test]
    fn split_to_sequence_variants() {
        for opset in [12, 13, 18] {
            // No split, keepdims=0: one squeezed row per element of axis 0 (size 2).
            let mf = model(
                opset,
                vec![
                    node("SplitToSequence", &["x"], &["s"], vec![int_attr_proto("keepdims", 0)]),
                    node("SequenceAt", &["s", "one"], &["row"], vec![]),
                    node("ConcatFromSequence", &["s"], &["cat"], vec![int_attr_proto("axis", 0)]),
                ],
                &["x"],
                vec![scalar("one", 1)],
                &["row", "cat"],
            );
            let out = run(&mf, &[("x", iota(0.0))]);
            assert_eq!(out[0], Tensor::from_f32s(&[3], vec![3.0, 4.0, 5.0]), "opset {opset}");
            assert_eq!(out[1], Tensor::from_f32s(&[6], (0..6).map(|v| v as f32).collect()));
            // A scalar split of 2 along axis 1 (size 3): chunks of 2 and 1; keepdims is ignored.
            let mf = model(
                opset,
                vec![
                    node(
                        "SplitToSequence",
                        &["x", "two"],
                        &["s"],
                        vec![int_attr_proto("axis", 1), int_attr_proto("keepdims", 0)],
                    ),
                    node("SequenceAt", &["s", "one"], &["last"], vec![]),
                    node("SequenceLength", &["s"], &["len"], vec![]),
                ],
                &["x"],
                vec![scalar("one", 1), scalar("two", 2)],
                &["last", "len"],
            );
            let out = run(&mf, &[("x", iota(0.0))]);
            assert_eq!(out[0], Tensor::from_f32s(&[2, 1], vec![2.0, 5.0]), "opset {opset}");
            assert_eq!(out[1], Tensor::from_i64s(&[], vec![2]));
        }
    }

    #[test]
    fn runtime_split_sizes() {
        let nodes = |read: bool| {
            let mut v = vec![
                node("SplitToSequence", &["x", "sizes"], &["s"], vec![int_attr_proto("axis", 1)]),
                node("SequenceLength", &["s"], &["len"], vec![]),
            ];
            if read {
                v.push(node("SequenceAt", &["s", "one"], &["second"], vec![]));
            }
            v
        };
        let with_sizes = |mut mf: ModelFile| {
            mf.proto.graph.as_mut().unwrap().input.push(tensor_vi("sizes", 7, &[2]));
            mf
        };
        let feeds = [("x", iota(0.0)), ("sizes", Tensor::from_i64s(&[2], vec![1, 2]))];
        // The length is the static length of `sizes`, at any opset.
        let mf = with_sizes(model(12, nodes(false), &["x"], vec![], &["len"]));
        assert_eq!(run(&mf, &feeds)[0], Tensor::from_i64s(&[], vec![2]));
        // Reading a chunk needs Split's `split` input (opset 13).
        let mf = with_sizes(model(13, nodes(true), &["x"], vec![scalar("one", 1)], &["len", "second"]));
        let out = run(&mf, &feeds);
        assert_eq!(out[1], Tensor::from_f32s(&[2, 2], vec![1.0, 2.0, 4.0, 5.0]));
        let mf = with_sizes(model(12, nodes(true), &["x"], vec![scalar("one", 1)], &["len", "second"]));
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("(SplitToSequence): reading the chunks of a run-time 'split' needs opset 13"), "{msg}");
    }

    #[test]
    fn structure_known_only_at_run_time_is_an_error() {
        // The position is a graph input (not an initializer): its value is run-time data.
        let mut mf = model(
            13,
            vec![
                node("SequenceConstruct", &["x", "y"], &["s"], vec![]),
                node("SequenceAt", &["s", "pos"], &["out"], vec![]),
            ],
            &["x", "y"],
            vec![],
            &["out"],
        );
        mf.proto.graph.as_mut().unwrap().input.push(tensor_vi("pos", 7, &[]));
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("node 'SequenceAt_1' (SequenceAt)"), "{msg}");
        assert!(msg.contains("input 'position' ('pos') is only known at run time"), "{msg}");
        // A graph output cannot be a sequence.
        let mf = model(13, vec![node("SequenceConstruct", &["x"], &["s"], vec![])], &["x"], vec![], &["s"]);
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("graph output 's' is a sequence"), "{msg}");
        // Nor can a tensor op read one.
        let mf = model(
            13,
            vec![node("SequenceConstruct", &["x"], &["s"], vec![]), node("Relu", &["s"], &["r"], vec![])],
            &["x"],
            vec![],
            &["r"],
        );
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("(Relu): input 's' is a sequence"), "{msg}");
        // Out-of-range positions name the node.
        let mf = model(
            13,
            vec![
                node("SequenceConstruct", &["x"], &["s"], vec![]),
                node("SequenceErase", &["s", "two"], &["e"], vec![]),
                node("SequenceLength", &["e"], &["n"], vec![]),
            ],
            &["x"],
            vec![scalar("two", 2)],
            &["n"],
        );
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("(SequenceErase): position 2 is out of range for a sequence of length 1"), "{msg}");
    }

    #[test]
    fn degenerate_sequences_fail_cleanly() {
        let mut mf = model(
            13,
            vec![
                node("SplitToSequence", &["big"], &["s"], vec![int_attr_proto("axis", 1)]),
                node("SequenceLength", &["s"], &["n"], vec![]),
            ],
            &[],
            vec![],
            &["n"],
        );
        mf.proto.graph.as_mut().unwrap().input.push(tensor_vi("big", 1, &[1, 70_000]));
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("70000 elements; at most 65536"), "{msg}");
        let mf = model(
            13,
            vec![
                node("SequenceEmpty", &[], &["s"], vec![]),
                node("ConcatFromSequence", &["s"], &["c"], vec![int_attr_proto("axis", 0)]),
            ],
            &["x"],
            vec![],
            &["c"],
        );
        let msg = mf.to_graph().unwrap_err().to_string();
        assert!(msg.contains("(ConcatFromSequence): the sequence is empty"), "{msg}");
    }

    #[test]
    fn outputs_declared_without_shape_check_only_the_dtype() {
        // Sequence-reading outputs (SequenceAt of elements of different shapes) and
        // data-dependent ones are often declared with an element type and no shape.
        let declare = |elem: i32| {
            let mut mf = model(
                13,
                vec![
                    node("SequenceConstruct", &["x"], &["s"], vec![]),
                    node("SequenceAt", &["s", "zero"], &["o"], vec![]),
                ],
                &["x"],
                vec![scalar("zero", 0)],
                &["o"],
            );
            let out = &mut mf.proto.graph.as_mut().unwrap().output[0];
            out.r#type = Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(elem), shape: None })),
                ..Default::default()
            });
            mf
        };
        assert!(declare(1).to_graph().is_ok());
        let msg = declare(7).to_graph().unwrap_err().to_string();
        assert!(msg.contains("graph output 'o' is declared int64 but inference gives float32[2,3]"), "{msg}");
    }

    #[test]
    fn sequence_ops_are_not_reported_unsupported() {
        let mf = model(
            13,
            vec![node("SequenceConstruct", &["x"], &["s"], vec![]), node("SequenceAt", &["s", "zero"], &["o"], vec![])],
            &["x"],
            vec![scalar("zero", 0)],
            &["o"],
        );
        assert!(mf.unsupported_ops().is_empty());
        assert_eq!(run(&mf, &[("x", iota(0.0))])[0], iota(0.0));
    }
}
