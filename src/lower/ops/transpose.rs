//! Axis permutations: the optimiser's layout transforms (`kernel::Transpose`, NCHW ↔ NHWC) and
//! ONNX `Transpose`, any element type, any rank.
//!
//! The permutation is first simplified: size-1 axes are dropped and input axes that stay adjacent
//! and in order in the output are merged. What remains picks the kernel
//! (`transpose.cu.hbs`):
//! - nothing to move (rank ≤ 1 after merging): the output is a view of the input, no kernel;
//! - a batched matrix transpose `[B, R, C] → [B, C, R]` (NCHW ↔ NHWC is `[N, C, HW] ↔ [N, HW, C]`):
//!   32×32 tiles through shared memory, reads and writes coalesced;
//! - anything else: one thread per output element (or per vector of up to 16 bytes when the
//!   innermost axis stays innermost, e.g. attention's `[B, S, H, D] → [B, H, S, D]`), the input
//!   offset computed from the output index with the dims as constants.

use super::elementwise::index_type;
use super::LowerSpec;
use crate::ir::dim::product;
use crate::ir::ops::kernel::Transpose as KernelTranspose;
use crate::ir::ops::shape::Transpose as OnnxTranspose;
use crate::ir::{Dim, Node};
use crate::lower::{ctype, KernelFacts, LowerCtx, LowerError, LowerResult, TensorId};
use serde_json::{json, Map};

/// The family's template (`templates/<target>/kernels/transpose.cu.hbs`).
const TEMPLATE: &str = "transpose";

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<KernelTranspose>("Transpose", lower_kernel_transpose),
    LowerSpec::of::<OnnxTranspose>("Transpose", lower_onnx_transpose),
];

/// Kernel-level Transpose (layout changes the optimiser inserts).
fn lower_kernel_transpose(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<KernelTranspose>() else {
        return Err(LowerError::Invalid("not a Transpose node".into()));
    };
    let perm = op.perm.clone();
    lower_permutation(cx, node, &perm)
}

/// ONNX Transpose (opset 1, 13: types only): `perm` defaults to reversing the axes.
fn lower_onnx_transpose(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<OnnxTranspose>() else {
        return Err(LowerError::Invalid("not a Transpose node".into()));
    };
    let x = cx.input(node, 0)?;
    let rank = cx.shape(x).len();
    let perm: Vec<usize> = match &op.perm {
        None => (0..rank).rev().collect(),
        Some(p) => {
            let mut seen = vec![false; rank];
            let mut out = Vec::with_capacity(rank);
            for &a in p {
                if a < 0 || a as usize >= rank || seen[a as usize] || p.len() != rank {
                    return Err(LowerError::Invalid(format!("perm {p:?} is not a permutation of 0..{rank}")));
                }
                seen[a as usize] = true;
                out.push(a as usize);
            }
            out
        }
    };
    lower_permutation(cx, node, &perm)
}

/// The permutation of `shape` with size-1 axes dropped and runs of input axes that stay adjacent
/// in the output merged: (merged input shape, permutation of the merged axes).
pub(crate) fn simplify(shape: &[Dim], perm: &[usize]) -> (Vec<Dim>, Vec<usize>) {
    let one = Dim::known(1);
    // Output order of the input axes that matter.
    let kept: Vec<usize> = perm.iter().copied().filter(|&a| shape[a] != one).collect();
    // Group consecutive output entries a, a+1 (input axes adjacent and in order).
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &a in &kept {
        match groups.last_mut() {
            Some(g) if g.last().is_some_and(|&l| l + 1 == a) => g.push(a),
            _ => groups.push(vec![a]),
        }
    }
    // Merged input axes in input order: sort groups by their first input axis.
    let mut by_input: Vec<usize> = (0..groups.len()).collect();
    by_input.sort_by_key(|&g| groups[g][0]);
    let merged_shape: Vec<Dim> =
        by_input.iter().map(|&g| product(&groups[g].iter().map(|&a| shape[a].clone()).collect::<Vec<_>>())).collect();
    // perm over merged axes: output position k holds group k, which is merged input axis rank_of[k].
    let mut rank_of = vec![0; groups.len()];
    for (pos, &g) in by_input.iter().enumerate() {
        rank_of[g] = pos;
    }
    let merged_perm: Vec<usize> = (0..groups.len()).map(|g| rank_of[g]).collect();
    (merged_shape, merged_perm)
}

/// The C++ offset into the input (merged `shape`, row-major) of output index `idx`, the output
/// being the input permuted by `perm`.
fn permuted_offset(cx: &LowerCtx, shape: &[Dim], perm: &[usize], idx: &str) -> LowerResult<String> {
    let rank = shape.len();
    let one = Dim::known(1);
    let mut in_strides = vec![one.clone(); rank];
    for a in (0..rank.saturating_sub(1)).rev() {
        in_strides[a] = in_strides[a + 1].mul(&shape[a + 1]);
    }
    let mut terms = Vec::new();
    let mut inner = one.clone();
    for k in (0..rank).rev() {
        let size = &shape[perm[k]];
        let coord = match (inner == one, k == 0) {
            (true, true) => idx.to_string(),
            (true, false) => format!("({idx} % {})", cx.expr(size)?),
            (false, true) => format!("({idx} / {})", cx.expr(&inner)?),
            (false, false) => format!("(({idx} / {}) % {})", cx.expr(&inner)?, cx.expr(size)?),
        };
        let stride = &in_strides[perm[k]];
        terms.push(if *stride == one { coord } else { format!("{coord} * {}", cx.expr(stride)?) });
        inner = inner.mul(size);
    }
    Ok(if terms.is_empty() { "0".to_string() } else { format!("({})", terms.join(" + ")) })
}

fn lower_permutation(cx: &mut LowerCtx, node: &Node, perm: &[usize]) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    let shape = cx.shape(x).to_vec();
    if perm.len() != shape.len() {
        return Err(LowerError::Invalid(format!("permutation {perm:?} does not fit rank {}", shape.len())));
    }
    let (mshape, mperm) = simplify(&shape, perm);
    if mperm.iter().enumerate().all(|(k, &a)| k == a) {
        // The bytes are already in output order.
        cx.alias_output(node, 0, x)?;
        return Ok(());
    }
    let out = cx.output(node, 0)?;
    match (mshape.as_slice(), mperm.as_slice()) {
        ([r, cc], [1, 0]) => return emit_tiled(cx, &node.name, x, out, [Dim::known(1), r.clone(), cc.clone()]),
        ([b, r, cc], [0, 2, 1]) => return emit_tiled(cx, &node.name, x, out, [b.clone(), r.clone(), cc.clone()]),
        _ => {}
    }
    let dt = cx.dtype(x);
    let n = product(&shape);
    let mut c = Map::new();
    c.insert("ctype".into(), json!(ctype(dt)));
    c.insert("n".into(), json!(cx.expr(&n)?));
    c.insert("tiled".into(), json!(false));
    c.insert("idx_t".into(), json!(index_type(cx, &n)?));
    c.insert("offset".into(), json!(permuted_offset(cx, &mshape, &mperm, "idx")?));
    // The innermost axis stays innermost: move vectors of up to 16 bytes.
    let rank = mshape.len();
    let mut vec = 1i64;
    if mperm[rank - 1] == rank - 1 {
        if let Some(d) = mshape[rank - 1].as_known() {
            vec = (16 / dt.size_bytes().max(1)).min(8) as i64;
            while vec > 1 && d % vec != 0 {
                vec /= 2;
            }
        }
    }
    c.insert("vec".into(), json!(vec));
    let offset_vec = if vec > 1 {
        let mut vshape = mshape.clone();
        vshape[rank - 1] = Dim::known(mshape[rank - 1].as_known().unwrap_or(1) / vec);
        permuted_offset(cx, &vshape, &mperm, "idx")?
    } else {
        "0".to_string()
    };
    c.insert("offset_vec".into(), json!(offset_vec));
    cx.emit(&node.name, TEMPLATE, vec![x, out], vec![1], c, 0)
}

/// Emits `dst[b, j, i] = src[b, i, j]` over `[batches, rows, cols]` as the tiled kernel (32×32
/// tiles through shared memory), its template fields built from the [`KernelFacts`] the fusion
/// pass reads. NCHW ↔ NHWC is `[N, C, HW] ↔ [N, HW, C]`.
pub(crate) fn emit_tiled(
    cx: &mut LowerCtx,
    node: &str,
    src: TensorId,
    dst: TensorId,
    [batches, rows, cols]: [Dim; 3],
) -> LowerResult<()> {
    let (batches, rows, cols) = (cx.bind(&batches), cx.bind(&rows), cx.bind(&cols));
    let mut c = Map::new();
    c.insert("ctype".into(), json!(ctype(cx.dtype(src))));
    c.insert("n".into(), json!(cx.expr(&batches.mul(&rows).mul(&cols))?));
    c.insert("tiled".into(), json!(true));
    c.insert("batches".into(), json!(cx.expr(&batches)?));
    c.insert("rows".into(), json!(cx.expr(&rows)?));
    c.insert("cols".into(), json!(cx.expr(&cols)?));
    let facts = KernelFacts::TiledTranspose { batches, rows, cols };
    cx.emit_with_facts(node, TEMPLATE, vec![src, dst], vec![1], c, facts)
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testkit::{lower, render, Builder};
    use super::*;
    use crate::ir::{DType, Tensor};
    use crate::lower::Storage;

    fn d(v: &[i64]) -> Vec<Dim> {
        v.iter().map(|&x| Dim::known(x)).collect()
    }

    #[test]
    fn simplification() {
        // NCHW → NHWC
        assert_eq!(simplify(&d(&[8, 64, 56, 56]), &[0, 2, 3, 1]), (d(&[8, 64, 3136]), vec![0, 2, 1]));
        // NHWC → NCHW
        assert_eq!(simplify(&d(&[8, 56, 56, 64]), &[0, 3, 1, 2]), (d(&[8, 3136, 64]), vec![0, 2, 1]));
        // size-1 axes vanish: [1,C,1,1] → [1,1,1,C] is no movement
        assert_eq!(simplify(&d(&[1, 64, 1, 1]), &[0, 2, 3, 1]), (d(&[64]), vec![0]));
        // attention heads
        assert_eq!(simplify(&d(&[2, 128, 12, 64]), &[0, 2, 1, 3]), (d(&[2, 128, 12, 64]), vec![0, 2, 1, 3]));
        // reversal of 3 axes
        assert_eq!(simplify(&d(&[2, 3, 4]), &[2, 1, 0]), (d(&[2, 3, 4]), vec![2, 1, 0]));
        // [A,B,C,D] perm [2,3,0,1] = 2-D transpose of [AB, CD]
        assert_eq!(simplify(&d(&[2, 3, 4, 5]), &[2, 3, 0, 1]), (d(&[6, 20]), vec![1, 0]));
    }

    #[test]
    fn kernels_and_views() {
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(64), Dim::known(56), Dim::known(56)]);
        b.node(Box::new(KernelTranspose { perm: vec![0, 2, 3, 1] }), &[Some(x)]);
        let q = b.input("q", DType::F16, vec![n.clone(), Dim::known(128), Dim::known(12), Dim::known(64)]);
        b.node(Box::new(OnnxTranspose { perm: Some(vec![0, 2, 1, 3]) }), &[Some(q)]);
        let i = b.input("i", DType::I64, vec![Dim::known(2), Dim::known(3), Dim::known(4)]);
        b.node(Box::new(OnnxTranspose { perm: None }), &[Some(i)]);
        let v = b.input("v", DType::Bool, vec![Dim::known(1), Dim::known(7), Dim::known(1)]);
        b.node(Box::new(OnnxTranspose { perm: Some(vec![2, 1, 0]) }), &[Some(v)]);
        let k = b.konst("k", Tensor::from_f32s(&[3, 5], vec![0.0; 15]));
        b.node(Box::new(OnnxTranspose { perm: None }), &[Some(k)]);
        let p = lower(&b.g, OPS).unwrap();
        assert_eq!(p.kernels.len(), 4);
        let (batches, rows, cols) = (n.clone(), Dim::known(64), Dim::known(3136));
        assert_eq!(p.kernels[0].facts, KernelFacts::TiledTranspose { batches, rows, cols });
        assert!(p.kernels[1..3].iter().all(|k| k.facts == KernelFacts::Opaque));
        let (batches, rows, cols) = (Dim::known(1), Dim::known(3), Dim::known(5));
        assert_eq!(p.kernels[3].facts, KernelFacts::TiledTranspose { batches, rows, cols });
        let c0 = &p.kernels[0].context;
        assert_eq!(c0["tiled"], json!(true));
        assert_eq!(
            (c0["batches"].as_str(), c0["rows"].as_str(), c0["cols"].as_str()),
            (Some("(dims.v[0])"), Some("64"), Some("3136"))
        );
        let c1 = &p.kernels[1].context;
        assert_eq!(c1["tiled"], json!(false));
        assert_eq!(c1["vec"], json!(8));
        assert_eq!(
            c1["offset_vec"],
            json!("((idx % 8) + ((idx / 8) % 128) * 96 + ((idx / 1024) % 12) * 8 + (idx / 12288) * 12288)")
        );
        let c2 = &p.kernels[2].context;
        assert_eq!(c2["offset"], json!("((idx % 2) * 12 + ((idx / 2) % 3) * 4 + (idx / 6))"));
        assert_eq!(p.tensors.iter().filter(|t| matches!(t.storage, Storage::Alias { .. })).count(), 1);
        render(&p, "transpose");
    }

    /// fp32 precision: layout transforms and permutations move fp32 elements (4 per 16 bytes).
    #[test]
    fn fp32_permutations() {
        use super::super::elementwise::testkit::lower_at;
        use crate::lower::Precision;
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(64), Dim::known(56), Dim::known(56)]);
        b.node(Box::new(KernelTranspose { perm: vec![0, 2, 3, 1] }), &[Some(x)]);
        let q = b.input("q", DType::F32, vec![n.clone(), Dim::known(128), Dim::known(12), Dim::known(64)]);
        b.node(Box::new(OnnxTranspose { perm: Some(vec![0, 2, 1, 3]) }), &[Some(q)]);
        let p = lower_at(&b.g, OPS, Precision::Fp32).unwrap();
        assert!(p.kernels.iter().all(|k| k.context["ctype"] == json!("float")));
        assert_eq!(p.kernels[0].context["tiled"], json!(true));
        assert_eq!(p.kernels[1].context["vec"], json!(4));
        render(&p, "transpose_fp32");
    }
}
