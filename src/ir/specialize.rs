//! Specialisation: symbolic dims fixed by the user (`--dim seq=128`) are substituted into the
//! graph before it is optimised, and inference runs again.
//!
//! Why before the optimiser rather than only at lowering: PyTorch exports compute shapes and
//! index tensors from the inputs' dims at run time (`Shape → Gather → Range`, the attention
//! mask's `arange(seq)` comparisons, position ids). With `seq` symbolic those nodes survive as
//! kernels; once it is a number, inference folds them into constants, so the e-graph sees
//! concrete shapes and the library runs only what depends on the run-time batch or on data.
//! On Hugging Face BERT's TorchScript export (tiny configuration, `--dim seq=128`) this removes
//! the `Range` kernels over the sequence and most shape kernels of the embedding and mask
//! preamble (the range over the batch stays).

use super::dim::Dim;
use super::graph::Graph;
use super::infer::{infer_graph, InferStats};
use crate::error::Result;
use std::collections::BTreeMap;

/// Substitutes `env` into the graph inputs' shapes and infers the graph again (folding what
/// became constant, removing what became dead). A binding that contradicts the model (a
/// `Reshape` to a fixed size that the bound dim no longer matches) is an inference error naming
/// the node. With an empty `env` the graph is left as it is.
pub fn bind_dims(g: &mut Graph, env: &BTreeMap<String, i64>) -> Result<InferStats> {
    if env.is_empty() {
        return Ok(InferStats::default());
    }
    let bind = |shape: &mut Vec<Dim>| {
        for d in shape.iter_mut() {
            *d = d.eval(env);
        }
    };
    for &v in &g.inputs {
        let value = &mut g.values[v];
        if value.konst.is_some() {
            continue;
        }
        if let Some(ty) = value.ty.as_mut() {
            bind(&mut ty.shape);
        }
        if let Some(sym) = value.sym.as_mut() {
            bind(sym);
        }
    }
    infer_graph(g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{DType, Tensor};

    /// `x[batch, seq]` → `Range(0, Shape(x)[1])`: with seq bound, the range is a constant and
    /// the shape nodes are gone; the batch stays symbolic.
    #[test]
    fn a_bound_dim_folds_the_shape_subgraph_reading_it() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "batch,seq");
        let shape = b.node("Shape", vec![], &[x], 1)[0];
        let one = b.konst("one", Tensor::from_i64s(&[], vec![1]));
        let zero = b.konst("zero", Tensor::from_i64s(&[], vec![0]));
        let step = b.konst("step", Tensor::from_i64s(&[], vec![1]));
        let seq = b.node("Gather", vec![], &[shape, one], 1)[0];
        let range = b.node("Range", vec![], &[zero, seq, step], 1)[0];
        let batch = b.node("Gather", vec![], &[shape, zero], 1)[0];
        let by_batch = b.node("Range", vec![], &[zero, batch, step], 1)[0];
        b.g.outputs.extend([range, by_batch]);
        infer_graph(&mut b.g).unwrap();
        assert!(b.g.values[range].konst.is_none(), "seq is symbolic: the range is computed at run time");
        let before = b.g.nodes.len();

        let env: BTreeMap<String, i64> = [("seq".to_string(), 5)].into();
        let stats = bind_dims(&mut b.g, &env).unwrap();
        let folded = b.g.values[range].konst.as_ref().expect("the seq range folded");
        assert_eq!(folded.to_i64_vec(), vec![0, 1, 2, 3, 4]);
        assert!(b.g.values[by_batch].konst.is_none(), "the batch range still depends on the run-time batch");
        assert_eq!(b.g.values[x].ty.as_ref().unwrap().shape, vec![Dim::sym("batch"), Dim::known(5)]);
        assert!(stats.folded > 0 && b.g.nodes.len() < before, "{stats:?}: {} of {before} nodes left", b.g.nodes.len());
    }

    /// A binding the model contradicts is an inference error that names the node.
    #[test]
    fn a_contradicting_binding_names_the_node() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "seq");
        let y = b.input("y", DType::F32, "4");
        let z = b.node("Add", vec![], &[x, y], 1)[0];
        b.g.outputs.push(z);
        infer_graph(&mut b.g).unwrap();
        let env: BTreeMap<String, i64> = [("seq".to_string(), 3)].into();
        let e = bind_dims(&mut b.g, &env).unwrap_err().to_string();
        assert!(e.contains("Add"), "{e}");
    }
}
