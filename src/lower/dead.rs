//! Removal of kernels whose results no live kernel reads, run on the finished [`Program`] after
//! fusion and before memory planning.
//!
//! Why at this level: the graph keeps some values alive that no kernel needs. An `Expand`,
//! `Reshape` or `ConstantOfShape` whose shape input is known symbolically (`[batch, 128]`) is
//! lowered from its output type, so the `Shape → Gather → Concat → Where` chain computing that
//! shape tensor on the device is read by nobody; only the lowering knows which inputs a kernel
//! really reads (its `args`). A kernel is live when it writes a graph output, or a tensor (or
//! the base of a view) that a later live kernel reads; everything else goes, with the arena
//! tensors and views only it referred to and the library instances only it called.

use super::program::{Program, Storage, TensorId};
use std::collections::BTreeSet;

/// Removes the kernels whose writes nobody reads; returns how many were removed.
pub fn remove_unread_kernels(p: &mut Program) -> usize {
    let n = p.tensors.len();
    // Tensors whose bytes are needed after the current point, by base (views share their
    // base's bytes): the graph outputs at the end.
    let mut needed = vec![false; n];
    for io in &p.outputs {
        needed[p.base(io.tensor)] = true;
    }
    let mut live = vec![false; p.kernels.len()];
    for (k, kernel) in p.kernels.iter().enumerate().rev() {
        let writes_needed = kernel.writes.iter().any(|&slot| needed[p.base(kernel.args[slot])]);
        if !writes_needed {
            continue;
        }
        live[k] = true;
        // Every argument, written ones included: a kernel may read what it writes (a residual
        // aliasing the output, a concat filling part of a tensor), so earlier writers stay.
        for &t in &kernel.args {
            needed[p.base(t)] = true;
        }
    }
    let removed = live.iter().filter(|l| !**l).count();
    if removed == 0 {
        return 0;
    }
    let old = std::mem::take(&mut p.kernels);
    p.kernels = old.into_iter().zip(&live).filter(|(_, &l)| l).map(|(k, _)| k).collect();

    // Arena tensors and views that no kernel, graph input or output refers to any more.
    let mut referenced = vec![false; n];
    for kernel in &p.kernels {
        for &t in &kernel.args {
            referenced[t] = true;
        }
    }
    for io in p.inputs.iter().chain(&p.outputs) {
        referenced[io.tensor] = true;
    }
    // A referenced view keeps the tensors it is a view of.
    for t in 0..n {
        if referenced[t] {
            let mut v: TensorId = t;
            while let Storage::Alias { of } = p.tensors[v].storage {
                referenced[of] = true;
                v = of;
            }
        }
    }
    let dead: Vec<bool> = (0..n)
        .map(|t| !referenced[t] && matches!(p.tensors[t].storage, Storage::Arena { .. } | Storage::Alias { .. }))
        .collect();
    super::fuse::remove_tensors(p, &dead);

    // Library instances only removed kernels called.
    let called: BTreeSet<String> =
        p.kernels.iter().flat_map(|k| k.dispatch.iter().map(|d| d.function.clone())).collect();
    p.library.retain(|l| called.contains(&l.name));
    super::fuse::renumber_kernels(p);
    removed
}

#[cfg(test)]
mod tests {
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{DType, Tensor};
    use crate::lower::cuda::{Arch, CudaTarget};
    use crate::lower::{lower, LowerOptions};

    /// `Expand(x, Concat(Shape(y)[0], 4))`: the expand is lowered from its symbolic output type
    /// `[batch, 4]`, so the kernels computing its shape input on the device are removed; the
    /// same graph with the shape tensor also a graph output keeps them.
    #[test]
    fn the_shape_kernels_of_an_expand_are_removed() {
        let build = |shape_is_output: bool| {
            let mut b = GraphBuilder::new(17);
            let x = b.input("x", DType::F32, "1,4");
            let y = b.input("y", DType::F32, "batch,3");
            let shape = b.node("Shape", vec![], &[y], 1)[0];
            let zero = b.konst("zero", Tensor::from_i64s(&[1], vec![0]));
            let four = b.konst("four", Tensor::from_i64s(&[1], vec![4]));
            let batch = b.node("Gather", vec![], &[shape, zero], 1)[0];
            let target = b.node("Concat", vec![("axis", crate::ir::Attr::Int(0))], &[batch, four], 1)[0];
            let e = b.node("Expand", vec![], &[x, target], 1)[0];
            b.g.outputs.push(e);
            if shape_is_output {
                b.g.outputs.push(target);
            }
            infer_graph(&mut b.g).unwrap();
            let target = CudaTarget::new(Arch::Sm90);
            lower(&b.g, &target, &LowerOptions { max_batch: 8, ..Default::default() }).expect("lowers")
        };
        let p = build(false);
        let templates: Vec<&str> = p.kernels.iter().map(|k| k.template.as_str()).collect();
        assert!(!templates.iter().any(|t| *t == "shape_values" || *t == "gather" || *t == "concat"), "{templates:?}");
        assert!(templates.contains(&"strided_copy"), "{templates:?}");
        for (i, k) in p.kernels.iter().enumerate() {
            assert_eq!(k.name, format!("k{i:03}_{}", k.template), "kernels are renumbered");
            assert!(k.args.iter().all(|&t| t < p.tensors.len()), "tensor ids are renumbered");
        }
        let kept = build(true);
        assert!(kept.kernels.len() > p.kernels.len(), "a shape tensor the caller asked for is computed");
    }
}
