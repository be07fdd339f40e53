//! Extracted e-graph → IR graph of kernel-level nodes, plus the elementwise chain fusion that
//! runs on the result.

use super::analysis::{denote, OGraph};
use super::extract::Extraction;
use super::language::{leaf_kind, opaque_ref, LeafKind, ONode};
use crate::error::{Error, Result};
use crate::ir::ops::kernel::{Elementwise, EwExpr, Transpose};
use crate::ir::{Fact, Graph, Node, Value, ValueId};
use egg::Id;
use std::collections::{BTreeMap, BTreeSet};

/// The IR graph and, for each of its nodes, the class it computes.
pub struct Lowered {
    pub graph: Graph,
    pub node_class: Vec<Id>,
    /// (class, class of the node that computes it now): classes whose node a pass after
    /// extraction folded into another (a packed projection, a layout op absorbed into a view),
    /// so reports attribute their ONNX nodes to the kernel that does the work.
    pub absorbed: Vec<(Id, Id)>,
}

/// Builds the IR graph of an extraction. Graph inputs and outputs keep their names and order.
pub fn to_ir(eg: &OGraph, ex: &Extraction, src: &Graph) -> Result<Lowered> {
    let path = src.info.source.clone();
    let err = |m: String| Error::model(&path, m);
    let mut g = Graph { info: src.info.clone(), ..Default::default() };
    let mut names: BTreeSet<String> = BTreeSet::new();
    for &v in &src.inputs {
        let val = &src.values[v];
        g.values.push(Value { name: val.name.clone(), ty: val.ty.clone(), konst: None, sym: None });
        g.inputs.push(g.values.len() - 1);
        names.insert(val.name.clone());
    }
    // The first root naming a class gives that class's value its output name.
    let mut out_name: BTreeMap<Id, String> = BTreeMap::new();
    for (&r, &o) in ex.roots.iter().zip(&src.outputs) {
        out_name.entry(r).or_insert_with(|| src.values[o].name.clone());
    }
    for n in out_name.values() {
        names.insert(n.clone());
    }
    let mut counter = 0usize;
    let mut fresh = |names: &mut BTreeSet<String>, base: &str| -> String {
        loop {
            counter += 1;
            let n = format!("{base}_{counter}");
            if names.insert(n.clone()) {
                return n;
            }
        }
    };
    let mut value_of: BTreeMap<Id, ValueId> = BTreeMap::new();
    let mut opaque_nodes: BTreeMap<(usize, Vec<Id>), Vec<ValueId>> = BTreeMap::new();
    let mut node_class = Vec::new();
    for c in ex.topo_order() {
        let node = ex.choice.get(&c).ok_or_else(|| err(format!("class {c} was not extracted")))?;
        let fact = eg[c].data.fact.as_ref();
        match node {
            ONode::Leaf(s) => match leaf_kind(s.as_str()) {
                LeafKind::Const(k) => {
                    let t = eg
                        .analysis
                        .consts
                        .get(k)
                        .cloned()
                        .ok_or_else(|| err(format!("constant {k} does not exist")))?;
                    let name = match out_name.get(&c) {
                        Some(n) => n.clone(),
                        None => match eg.analysis.const_names.get(k).cloned().flatten() {
                            Some(n) if names.insert(n.clone()) => n,
                            _ => fresh(&mut names, "const"),
                        },
                    };
                    let ty = Fact::constant(t.clone()).ty;
                    g.values.push(Value { name, ty: Some(ty), konst: Some(t), sym: None });
                    value_of.insert(c, g.values.len() - 1);
                }
                LeafKind::Input(i) => {
                    let v = *g.inputs.get(i).ok_or_else(|| err(format!("graph input {i} does not exist")))?;
                    value_of.insert(c, v);
                }
                _ => {}
            },
            ONode::Opaque(sym, children) => {
                let (k, j) = opaque_ref(sym.as_str()).ok_or_else(|| err(format!("malformed opaque node '{sym}'")))?;
                let key = (k, children.clone());
                if let Some(outs) = opaque_nodes.get(&key) {
                    value_of.insert(c, outs[j]);
                    continue;
                }
                let orig = eg.analysis.origs.get(k).ok_or_else(|| err(format!("original node {k} does not exist")))?;
                let den =
                    denote(eg, node).map_err(|e| err(e.0))?.ok_or_else(|| err("opaque node denotes nothing".into()))?;
                let inputs = map_inputs(&value_of, &den.inputs).map_err(err)?;
                let facts = input_facts(&g, &inputs);
                let refs: Vec<Option<&Fact>> = facts.iter().map(|f| f.as_ref()).collect();
                let out_facts = den.op.infer(&refs).map_err(|e| Error::node(&path, &orig.name, &orig.op_type, e.0))?;
                let mut outs = Vec::new();
                for (jj, f) in out_facts.into_iter().enumerate() {
                    let name = if jj == j { out_name.get(&c).cloned() } else { None }
                        .unwrap_or_else(|| fresh(&mut names, "t"));
                    g.values.push(Value { name, ty: Some(f.ty), konst: None, sym: f.sym });
                    outs.push(g.values.len() - 1);
                }
                g.nodes.push(Node {
                    name: orig.name.clone(),
                    op_type: orig.op_type.clone(),
                    domain: orig.domain.clone(),
                    op: orig.op.clone(),
                    inputs,
                    outputs: outs.clone(),
                });
                node_class.push(c);
                value_of.insert(c, outs[j]);
                opaque_nodes.insert(key, outs);
            }
            other => {
                let den = denote(eg, other)
                    .map_err(|e| err(format!("class {c}: {e}")))?
                    .ok_or_else(|| err("node denotes nothing".into()))?;
                let fact = fact.ok_or_else(|| err(format!("class {c} has no type")))?;
                let inputs = map_inputs(&value_of, &den.inputs).map_err(err)?;
                let kind = optimiser_kind(den.op.as_ref()).unwrap_or(den.op.op_type());
                let name = out_name.get(&c).cloned().unwrap_or_else(|| fresh(&mut names, "t"));
                g.values.push(Value { name, ty: Some(fact.ty.clone()), konst: None, sym: None });
                let v = g.values.len() - 1;
                // A softmax no rule rewrote is its original node, under its own name.
                let orig = match other {
                    ONode::Softmax([_, o]) => {
                        super::analysis::orig_index(eg, *o).and_then(|k| eg.analysis.origs.get(k))
                    }
                    _ => None,
                };
                let (node_name, domain) = match orig {
                    Some(o) if !g.nodes.iter().any(|n| n.name == o.name) => (o.name.clone(), o.domain.clone()),
                    _ => (fresh(&mut names, kind), "onnx2ait".to_string()),
                };
                let op_type = den.op.op_type().to_string();
                g.nodes.push(Node { name: node_name, op_type, domain, op: den.op, inputs, outputs: vec![v] });
                node_class.push(c);
                value_of.insert(c, v);
            }
        }
    }
    for (&r, &o) in ex.roots.iter().zip(&src.outputs) {
        let v = *value_of.get(&r).ok_or_else(|| err(format!("output '{}' was not computed", src.values[o].name)))?;
        let want = &src.values[o].name;
        if &g.values[v].name == want && !g.outputs.contains(&v) && !g.inputs.contains(&v) {
            g.outputs.push(v);
            continue;
        }
        // The output is a graph input, or another output's value: copy it under its own name
        // (a transpose with the identity permutation copies any dtype).
        let ty = g.values[v].ty.clone().ok_or_else(|| err(format!("value '{}' has no type", g.values[v].name)))?;
        let perm: Vec<usize> = (0..ty.rank()).collect();
        g.values.push(Value { name: want.clone(), ty: Some(ty), konst: None, sym: None });
        let out = g.values.len() - 1;
        let node_name = fresh(&mut names, "copy");
        g.nodes.push(Node {
            name: node_name,
            op_type: "Transpose".into(),
            domain: "onnx2ait".into(),
            op: Box::new(Transpose { perm }),
            inputs: vec![Some(v)],
            outputs: vec![out],
        });
        node_class.push(r);
        g.outputs.push(out);
    }
    Ok(Lowered { graph: g, node_class, absorbed: Vec::new() })
}

fn map_inputs(
    value_of: &BTreeMap<Id, ValueId>,
    inputs: &[Option<Id>],
) -> std::result::Result<Vec<Option<ValueId>>, String> {
    inputs
        .iter()
        .map(|i| match i {
            None => Ok(None),
            Some(c) => {
                value_of.get(c).copied().map(Some).ok_or_else(|| format!("class {c} is used before it is computed"))
            }
        })
        .collect()
}

fn input_facts(g: &Graph, inputs: &[Option<ValueId>]) -> Vec<Option<Fact>> {
    inputs
        .iter()
        .map(|i| {
            i.and_then(|v| {
                g.values[v].ty.clone().map(|ty| Fact {
                    ty,
                    konst: g.values[v].konst.clone(),
                    sym: g.values[v].sym.clone(),
                })
            })
        })
        .collect()
}

/// Fuses chains of elementwise kernels: a producer whose only reader is another elementwise
/// kernel of the same output shape is inlined into that reader's expression, so the chain runs
/// as one pass over memory. Done on the extracted graph rather than as rewrite rules because an
/// expression over any number of inputs does not fit fixed-arity patterns, and the merge is
/// always profitable (one launch and one round trip to memory fewer). Returns the number of
/// kernels removed; `node_class` is kept aligned with the nodes.
pub fn fuse_elementwise_chains(g: &mut Graph, node_class: &mut Vec<Id>) -> usize {
    let mut removed = 0;
    loop {
        let consumers = g.consumers();
        let mut merged = None;
        for (pi, p) in g.nodes.iter().enumerate() {
            let Some(pe) = p.op.downcast_ref::<Elementwise>() else { continue };
            let v = p.outputs[0];
            if g.outputs.contains(&v) || consumers[v].len() != 1 {
                continue;
            }
            let ci = consumers[v][0];
            let c = &g.nodes[ci];
            let Some(ce) = c.op.downcast_ref::<Elementwise>() else { continue };
            if g.values[v].ty.as_ref().map(|t| &t.shape) != g.values[c.outputs[0]].ty.as_ref().map(|t| &t.shape) {
                continue;
            }
            let mut inputs: Vec<Option<ValueId>> = Vec::new();
            let index =
                |x: Option<ValueId>, inputs: &mut Vec<Option<ValueId>>| match inputs.iter().position(|y| *y == x) {
                    Some(i) => i,
                    None => {
                        inputs.push(x);
                        inputs.len() - 1
                    }
                };
            let cmap: Vec<Option<usize>> =
                c.inputs.iter().map(|&x| (x != Some(v)).then(|| index(x, &mut inputs))).collect();
            let pmap: Vec<usize> = p.inputs.iter().map(|&x| index(x, &mut inputs)).collect();
            let inlined = pe.expr.remap(&pmap);
            let expr = rewrite_inputs(&ce.expr, &|j| match cmap[j] {
                Some(k) => EwExpr::Input(k),
                None => inlined.clone(),
            });
            let Ok(op) = Elementwise::new(expr, inputs.len()) else { continue };
            merged = Some((pi, ci, op, inputs));
            break;
        }
        let Some((pi, ci, op, inputs)) = merged else { return removed };
        g.nodes[ci].op = Box::new(op);
        g.nodes[ci].inputs = inputs;
        g.nodes.remove(pi);
        node_class.remove(pi);
        removed += 1;
    }
}

fn rewrite_inputs(e: &EwExpr, f: &dyn Fn(usize) -> EwExpr) -> EwExpr {
    match e {
        EwExpr::Input(i) => f(*i),
        EwExpr::Unary(a, x) => EwExpr::Unary(*a, Box::new(rewrite_inputs(x, f))),
        EwExpr::Binary(o, a, b) => EwExpr::Binary(*o, Box::new(rewrite_inputs(a, f)), Box::new(rewrite_inputs(b, f))),
    }
}

/// The kernel kind of an op the optimiser emits: a kernel-level op, or one of the ONNX views
/// it adds around a 1-D conv (`squeeze`/`unsqueeze`, a `reshape` like the kernel-level views).
fn optimiser_kind(op: &dyn crate::ir::Op) -> Option<&'static str> {
    use crate::ir::ops::shape::{Reshape, Squeeze, Unsqueeze};
    crate::ir::ops::kernel::kernel_kind(op).or_else(|| {
        let any = op.as_any();
        (any.is::<Squeeze>() || any.is::<Unsqueeze>() || any.is::<Reshape>()).then_some("reshape")
    })
}

/// The op a node runs, for reports: the kernel kind of kernel-level ops (and of the views the
/// optimiser adds), otherwise the ONNX op type in lower case (`softmax`).
pub fn kernel_name(n: &Node) -> String {
    let kind = if n.domain == "onnx2ait" {
        optimiser_kind(n.op.as_ref())
    } else {
        crate::ir::ops::kernel::kernel_kind(n.op.as_ref())
    };
    kind.map(str::to_string).unwrap_or_else(|| n.op_type.to_lowercase())
}
