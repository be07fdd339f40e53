//! Shape/dtype inference over a whole graph, with constant folding.
//!
//! Nodes are visited in topological order. Each op's `infer` gives its output facts; when every
//! input is a compile-time constant the node is evaluated with its reference implementation,
//! and when an output's symbolic contents are fully known they become a constant. Folded nodes
//! are removed, so PyTorch-style shape subgraphs (`Shape → Gather → Unsqueeze → Concat`)
//! collapse into constants whenever the dims they read are static.

use super::graph::Graph;
use super::op::Fact;
use super::tensor::Tensor;
use crate::error::{Error, Result};
use std::sync::Arc;

/// Constant outputs larger than this (elements) are left to run time rather than materialised
/// at compile time, so a model cannot make the compiler allocate unbounded memory.
pub const FOLD_LIMIT: usize = 1 << 26;

/// Statistics of one inference pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InferStats {
    pub nodes_before: usize,
    pub folded: usize,
    pub removed_dead: usize,
}

/// Infers every value's type, folds constant nodes and removes dead ones.
pub fn infer_graph(g: &mut Graph) -> Result<InferStats> {
    let path = g.info.source.clone();
    let nodes_before = g.nodes.len();
    let mut folded = vec![false; g.nodes.len()];
    for n in 0..g.nodes.len() {
        let node = &g.nodes[n];
        let ctx = |msg: String| Error::node(&path, &node.name, &node.op_type, msg);
        let mut facts: Vec<Option<Fact>> = Vec::with_capacity(node.inputs.len());
        for (i, inp) in node.inputs.iter().enumerate() {
            facts.push(match inp {
                None => None,
                Some(v) => {
                    let val = &g.values[*v];
                    let ty =
                        val.ty.clone().ok_or_else(|| ctx(format!("input {i} '{}' has no known type", val.name)))?;
                    Some(Fact { ty, konst: val.konst.clone(), sym: val.sym.clone() })
                }
            });
        }
        let refs: Vec<Option<&Fact>> = facts.iter().map(|f| f.as_ref()).collect();
        let mut outs = node.op.infer(&refs).map_err(|e| ctx(e.0))?;
        if outs.len() != node.outputs.len() {
            return Err(ctx(format!("op produced {} outputs, the node has {}", outs.len(), node.outputs.len())));
        }
        // Malformed inputs (e.g. pads that crop more than a dim holds) can make shape arithmetic
        // go negative; stop here rather than let later ops size tensors from it.
        if let Some((k, f)) =
            outs.iter().enumerate().find(|(_, f)| f.shape().iter().any(|d| d.as_known().is_some_and(|v| v < 0)))
        {
            return Err(ctx(format!("output {k} would have the negative shape {}", super::dim::fmt_shape(f.shape()))));
        }
        let all_const = facts.iter().flatten().all(|f| f.konst.is_some());
        let small = outs.iter().all(|f| {
            f.ty.known_shape()
                .is_some_and(|s| s.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_some_and(|n| n <= FOLD_LIMIT))
        });
        if all_const && small {
            let tensors: Vec<Option<&Tensor>> =
                facts.iter().map(|f| f.as_ref().map(|f| &**f.konst.as_ref().unwrap())).collect();
            let results = node.op.eval(&tensors).map_err(|e| ctx(format!("constant folding failed: {}", e.0)))?;
            if results.len() != outs.len() {
                return Err(ctx(format!("evaluation produced {} outputs, inference {}", results.len(), outs.len())));
            }
            for (k, (fact, t)) in outs.iter_mut().zip(results).enumerate() {
                check_matches(fact, &t).map_err(|m| ctx(format!("output {k}: {m}")))?;
                *fact = Fact::constant(Arc::new(t));
            }
        }
        for fact in outs.iter_mut() {
            if fact.konst.is_none() {
                if let Some(vals) = fact.as_ints().filter(|_| fact.sym.is_some()) {
                    let shape: Vec<usize> = if fact.rank() == 0 { vec![] } else { vec![vals.len()] };
                    fact.konst = Some(Arc::new(Tensor::from_i64s(&shape, vals).cast(fact.dtype())));
                }
            }
        }
        for (fact, &v) in outs.iter_mut().zip(&node.outputs) {
            for (axis, d) in fact.ty.shape.iter_mut().enumerate() {
                if d.is_data_dependent_marker() {
                    *d = crate::ir::Dim::sym(format!("{}:{axis}", g.values[v].name));
                }
            }
        }
        folded[n] = outs.iter().all(|f| f.konst.is_some());
        let outputs = node.outputs.clone();
        for (v, fact) in outputs.into_iter().zip(outs) {
            let val = &mut g.values[v];
            val.ty = Some(fact.ty);
            val.sym = fact.sym;
            val.konst = fact.konst;
        }
    }
    let mut keep = folded.iter().map(|f| !f);
    g.nodes.retain(|_| keep.next().unwrap());
    let after_fold = g.nodes.len();
    g.remove_dead_nodes();
    Ok(InferStats { nodes_before, folded: nodes_before - after_fold, removed_dead: after_fold - g.nodes.len() })
}

/// An evaluated constant must agree with what inference said about it.
fn check_matches(fact: &Fact, t: &Tensor) -> std::result::Result<(), String> {
    if fact.dtype() != t.dtype() {
        return Err(format!("inferred dtype {} but evaluation gave {}", fact.dtype(), t.dtype()));
    }
    let ok = fact.rank() == t.rank()
        && fact.shape().iter().zip(t.shape()).all(|(d, &n)| d.as_known().is_none_or(|k| k == n as i64));
    if !ok {
        return Err(format!(
            "inferred shape {} but evaluation gave {:?}",
            super::dim::fmt_shape(fact.shape()),
            t.shape()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{DType, Dim, Fact, Op, OpResult};

    /// An op whose shape arithmetic went negative (what a malformed model can cause).
    #[derive(Clone, Debug)]
    struct NegativeShape;

    impl Op for NegativeShape {
        fn op_type(&self) -> &'static str {
            "NegativeShape"
        }
        fn infer(&self, inputs: &[Option<&Fact>]) -> OpResult<Vec<Fact>> {
            Ok(vec![Fact::new(inputs[0].map_or(DType::F32, |f| f.dtype()), vec![Dim::known(-1)])])
        }
        fn eval(&self, _inputs: &[Option<&Tensor>]) -> OpResult<Vec<Tensor>> {
            Err(crate::ir::OpError("not evaluated".into()))
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn a_negative_inferred_dim_is_an_error() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F32, "2");
        let y = b.node("Shape", vec![], &[x], 1)[0];
        b.g.nodes[0].op = Box::new(NegativeShape);
        b.g.outputs.push(y);
        let e = infer_graph(&mut b.g).unwrap_err().to_string();
        assert!(e.contains("output 0 would have the negative shape [-1]"), "{e}");
    }
}
