//! Lowering of matrix products: the kernel-level `Gemm` the optimiser produces
//! (`act(alpha·op(A)·op(B) + beta·bias + residual)` with numpy `matmul` batching), and the ONNX
//! `Gemm` and `MatMul` ops, which reach the lowering only from graphs that were not optimised
//! (the optimiser turns every floating-point one into a kernel-level `Gemm`); all three take the
//! same path.
//!
//! Shapes follow `crate::reference::kernel::gemm`: a rank-1 A is `[1, K]` and a rank-1 B `[K, 1]`,
//! the promoted dim is absent from the output; the leading (batch) dims broadcast numpy-style;
//! bias and residual broadcast to the output shape.
//!
//! The family describes the problem ([`GemmProblem`]) and the target picks the kernel: a library
//! instance (CUTLASS on CUDA) or the generic kernel [`GENERIC_TEMPLATE`], which every target
//! provides. Two cases never reach the target because its problem description cannot express
//! them, and go to the generic kernel directly: an operand broadcast over some batch dims but not
//! others (`[2,1,M,K] × [1,3,K,N]`), and a residual that broadcasts (is not the output's shape).
//! At fp32 precision (`--precision fp32`) no product reaches the target: the library instances
//! store fp16, so the generic kernel computes every product on fp32 tensors.
//!
//! Batch folding: a batched A times one shared B (`[N,S,K] × [K,N']`, the usual projection with
//! a weight matrix) is one `[N·S, K] × [K, N']` product, so the library problem gets M = N·S and a
//! batch of one instead of N small products.
//!
//! Integer `MatMul` has no GPU kernel (the device kernels compute on float tensors).

use super::act::{act_call, float_lit};
use super::{float_storage_fields, LowerSpec};
use crate::ir::dim::{product, row_major_strides};
use crate::ir::ops::kernel::{Act, Gemm};
use crate::ir::ops::linalg;
use crate::ir::{Dim, Node};
use crate::lower::{BiasKind, GemmProblem, Instance, LowerCtx, LowerError, LowerResult, Precision, TensorId};
use crate::lower_unsupported;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<Gemm>("Gemm", lower_kernel_gemm),
    LowerSpec::of::<linalg::Gemm>("Gemm", lower_onnx_gemm),
    LowerSpec::of::<linalg::MatMul>("MatMul", lower_onnx_matmul),
];

/// The target-neutral generic matrix product every target provides.
pub const GENERIC_TEMPLATE: &str = "gemm_generic";

fn lower_kernel_gemm(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = node
        .op
        .downcast_ref::<Gemm>()
        .ok_or_else(|| LowerError::Invalid("the node is not a kernel-level Gemm".into()))?;
    lower_product(cx, node, op, "Gemm")
}

/// ONNX `Gemm`: `alpha·op(A)·op(B) + beta·C`, 2-D, C broadcast to the output: the kernel-level
/// `Gemm` with C as the bias (opset differences are settled at import, see `ir::ops::linalg`).
fn lower_onnx_gemm(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = node
        .op
        .downcast_ref::<linalg::Gemm>()
        .ok_or_else(|| LowerError::Invalid("the node is not an ONNX Gemm".into()))?;
    let k = Gemm { trans_a: op.trans_a, trans_b: op.trans_b, alpha: op.alpha, beta: op.beta, act: None };
    lower_product(cx, node, &k, "Gemm")
}

/// ONNX `MatMul`: numpy `matmul`, the kernel-level `Gemm` without epilogue.
fn lower_onnx_matmul(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    lower_product(cx, node, &Gemm::matmul(), "MatMul")
}

fn act_expr(act: Option<Act>) -> String {
    act.map_or_else(|| "v".to_string(), |a| act_call(a, "v"))
}

/// The graph shape of a node input or output value.
fn value_shape(cx: &LowerCtx, v: Option<usize>, what: &str) -> LowerResult<Vec<Dim>> {
    let v = v.ok_or_else(|| LowerError::Invalid(format!("{what} is missing")))?;
    let val = cx.graph.value(v);
    let ty =
        val.ty.as_ref().ok_or_else(|| LowerError::Invalid(format!("value '{}' has no inferred type", val.name)))?;
    Ok(ty.shape.clone())
}

/// The element stride of a contiguous tensor of `shape` along each dim of `out` (`shape`
/// right-aligned to `out`, numpy broadcasting): 0 where it broadcasts.
fn broadcast_strides(shape: &[Dim], out: &[Dim], what: &str) -> LowerResult<Vec<Dim>> {
    if shape.len() > out.len() {
        return Err(LowerError::Invalid(format!("{what} has rank {} above the output's {}", shape.len(), out.len())));
    }
    let one = Dim::known(1);
    let st = row_major_strides(shape);
    let lead = out.len() - shape.len();
    Ok((0..out.len())
        .map(|i| if i >= lead && shape[i - lead] != one { st[i - lead].clone() } else { Dim::known(0) })
        .collect())
}

/// How an operand advances over the output's batch dims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Batching {
    /// One matrix per batch entry (contiguous): the flat batch index times the matrix size.
    Batched,
    /// One matrix shared by every batch entry.
    Broadcast,
    /// Broadcast over some batch dims only: needs per-dim strides.
    Partial,
}

/// How an operand with element strides `strides` over the output's batch dims `out_batch` advances.
pub(crate) fn batching(strides: &[Dim], out_batch: &[Dim]) -> Batching {
    let (zero, one) = (Dim::known(0), Dim::known(1));
    let live: Vec<&Dim> = strides.iter().zip(out_batch).filter(|(_, d)| **d != one).map(|(s, _)| s).collect();
    if live.iter().all(|s| **s != zero) {
        Batching::Batched
    } else if live.iter().all(|s| **s == zero) {
        Batching::Broadcast
    } else {
        Batching::Partial
    }
}

/// The element strides of a (rank ≥ 2, contiguous) operand `[..batch, rows, cols]` over the
/// output's `nb` leading batch dims (numpy broadcasting, right-aligned): 0 where it broadcasts
/// (a missing or size-1 dim).
pub(crate) fn operand_batch_strides(shape2: &[Dim], nb: usize) -> Vec<Dim> {
    let one = Dim::known(1);
    let st = row_major_strides(shape2);
    let ob = shape2.len() - 2;
    (0..nb)
        .map(|d| {
            let offset = nb - d;
            if offset <= ob && shape2[ob - offset] != one {
                st[ob - offset].clone()
            } else {
                Dim::known(0)
            }
        })
        .collect()
}

/// Strides of a bias or residual over `[batch..., M, N]` (0 where it broadcasts).
struct EpilogueStrides {
    batch: Vec<Dim>,
    m: Dim,
    n: Dim,
}

/// The shapes a matrix product is lowered from: operands, optional bias and residual, output.
pub(crate) struct ProductShapes<'s> {
    pub a: &'s [Dim],
    pub b: &'s [Dim],
    pub bias: Option<&'s [Dim]>,
    pub residual: Option<&'s [Dim]>,
    pub out: &'s [Dim],
}

/// A matrix product over `[batch..., M, N]` as `op` computes it: what the lowering and the
/// measured cost model (`profile::cost`) derive from the shapes, in one place, so the problem
/// the cost model prices is the one the lowering gives the target.
pub(crate) struct ProductGeometry {
    pub m: Dim,
    pub n: Dim,
    pub k: Dim,
    /// Row lengths of A and B as stored.
    pub a_cols: Dim,
    pub b_cols: Dim,
    /// op(A)[i, kk] and op(B)[kk, j] element strides.
    pub a_sm: Dim,
    pub a_sk: Dim,
    pub b_sk: Dim,
    pub b_sn: Dim,
    /// Whether B has rank above 1 (a vector B has no N axis).
    pub b_matrix: bool,
    /// The output's batch dims, their count and product.
    pub out_batch: Vec<Dim>,
    pub nb: usize,
    pub batch_count: Dim,
    /// Operand strides over the batch dims, and how each operand advances over them.
    pub a_bs: Vec<Dim>,
    pub b_bs: Vec<Dim>,
    pub a_batching: Batching,
    pub b_batching: Batching,
    bias_st: Option<EpilogueStrides>,
    res_st: Option<EpilogueStrides>,
    pub bias_kind: Option<BiasKind>,
    /// The residual (if any) has the output's shape.
    pub res_exact: bool,
}

impl ProductGeometry {
    pub(crate) fn of(op: &Gemm, s: &ProductShapes) -> LowerResult<ProductGeometry> {
        let (ra0, rb0) = (s.a.len(), s.b.len());
        if ra0 == 0 || rb0 == 0 {
            return Err(LowerError::Invalid("matrix product operands must have rank ≥ 1".into()));
        }
        if (op.trans_a && ra0 < 2) || (op.trans_b && rb0 < 2) {
            return Err(LowerError::Invalid("transposed operands must have rank ≥ 2".into()));
        }
        let one = Dim::known(1);
        let a2: Vec<Dim> = if ra0 == 1 { vec![one.clone(), s.a[0].clone()] } else { s.a.to_vec() };
        let b2: Vec<Dim> = if rb0 == 1 { vec![s.b[0].clone(), one.clone()] } else { s.b.to_vec() };
        let (ra, rb) = (a2.len(), b2.len());
        let (a_cols, b_cols) = (a2[ra - 1].clone(), b2[rb - 1].clone());
        let (m, k) = if op.trans_a {
            (a2[ra - 1].clone(), a2[ra - 2].clone())
        } else {
            (a2[ra - 2].clone(), a2[ra - 1].clone())
        };
        let n = if op.trans_b { b2[rb - 2].clone() } else { b2[rb - 1].clone() };
        let (a_sm, a_sk) = if op.trans_a { (one.clone(), a_cols.clone()) } else { (a_cols.clone(), one.clone()) };
        let (b_sk, b_sn) = if op.trans_b { (one.clone(), b_cols.clone()) } else { (b_cols.clone(), one.clone()) };

        let promoted = usize::from(ra0 > 1) + usize::from(rb0 > 1);
        if s.out.len() < promoted {
            return Err(LowerError::Invalid(format!("output rank {} is too small for the operands", s.out.len())));
        }
        let nb = s.out.len() - promoted;
        let out_batch = s.out[..nb].to_vec();
        let batch_count = product(&out_batch);
        let (a_bs, b_bs) = (operand_batch_strides(&a2, nb), operand_batch_strides(&b2, nb));
        let (a_batching, b_batching) = (batching(&a_bs, &out_batch), batching(&b_bs, &out_batch));

        // Bias and residual strides over [batch..., M, N].
        let epilogue_strides = |shape: Option<&[Dim]>, name: &str| -> LowerResult<Option<EpilogueStrides>> {
            let Some(shape) = shape else { return Ok(None) };
            let st = broadcast_strides(shape, s.out, name)?;
            Ok(Some(EpilogueStrides {
                batch: st[..nb].to_vec(),
                m: if ra0 > 1 { st[nb].clone() } else { Dim::known(0) },
                n: if rb0 > 1 { st[st.len() - 1].clone() } else { Dim::known(0) },
            }))
        };
        let bias_st = epilogue_strides(s.bias, "bias")?;
        let res_st = epilogue_strides(s.residual, "residual")?;
        let zero = Dim::known(0);
        let bias_kind = bias_st.as_ref().map(|st| {
            if st.batch.iter().all(|d| *d == zero) && st.m == zero && st.n == one {
                BiasKind::PerColumn
            } else {
                BiasKind::General
            }
        });
        let res_exact = s.residual.is_none_or(|r| r == s.out);
        Ok(ProductGeometry {
            m,
            n,
            k,
            a_cols,
            b_cols,
            a_sm,
            a_sk,
            b_sk,
            b_sn,
            b_matrix: rb0 > 1,
            out_batch,
            nb,
            batch_count,
            a_bs,
            b_bs,
            a_batching,
            b_batching,
            bias_st,
            res_st,
            bias_kind,
            res_exact,
        })
    }

    /// Why no library instance can compute the product (the generic kernel then does), or None.
    pub(crate) fn generic_only(&self) -> Option<&'static str> {
        if !self.res_exact {
            Some("the residual broadcasts")
        } else if self.a_batching == Batching::Partial || self.b_batching == Batching::Partial {
            Some("an operand broadcasts over some batch dims only")
        } else {
            None
        }
    }

    /// The library problem, a batched A times one shared B folded into one tall product.
    pub(crate) fn problem(&self, op: &Gemm, b_constant: bool) -> GemmProblem {
        let fold = self.a_batching == Batching::Batched
            && self.b_batching == Batching::Broadcast
            && !op.trans_a
            && matches!(self.bias_kind, None | Some(BiasKind::PerColumn))
            && self.res_exact;
        let (m, batch_count) = if fold {
            (self.batch_count.mul(&self.m), Dim::known(1))
        } else {
            (self.m.clone(), self.batch_count.clone())
        };
        GemmProblem {
            batch_count,
            m,
            n: self.n.clone(),
            k: self.k.clone(),
            trans_a: op.trans_a,
            trans_b: op.trans_b,
            a_batched: self.a_batching == Batching::Batched && !fold,
            b_batched: self.b_batching == Batching::Batched,
            b_constant,
            alpha: op.alpha,
            beta: op.beta,
            bias: self.bias_kind,
            residual: self.res_st.is_some(),
            act: op.act,
            dim_ranges: BTreeMap::new(),
        }
    }
}

/// The fused matrix product of `node` (A, B, optional bias, optional residual) as `op` computes it.
fn lower_product(cx: &mut LowerCtx, node: &Node, op: &Gemm, what: &str) -> LowerResult<()> {
    let input = |i: usize| node.inputs.get(i).copied().flatten();
    let a_dtype = {
        let v = input(0).ok_or_else(|| LowerError::Invalid("input A is missing".into()))?;
        cx.graph.value(v).ty.as_ref().map(|t| t.dtype)
    };
    if let Some(dt) = a_dtype {
        if !dt.is_float() {
            lower_unsupported!("{what} on {dt} tensors: the GPU matrix products compute on floating-point tensors");
        }
    }
    if !(op.alpha.is_finite() && op.beta.is_finite()) {
        lower_unsupported!(
            "{what} with alpha = {} and beta = {}: the kernels take finite scale factors",
            op.alpha,
            op.beta
        );
    }
    let a_shape = value_shape(cx, input(0), "input A")?;
    let b_shape = value_shape(cx, input(1), "input B")?;
    let out_shape = value_shape(cx, node.outputs.first().copied(), "the output")?;
    let bias_shape = input(2).map(|v| value_shape(cx, Some(v), "bias")).transpose()?;
    let res_shape = input(3).map(|v| value_shape(cx, Some(v), "residual")).transpose()?;
    let geo = ProductGeometry::of(
        op,
        &ProductShapes {
            a: &a_shape,
            b: &b_shape,
            bias: bias_shape.as_deref(),
            residual: res_shape.as_deref(),
            out: &out_shape,
        },
    )?;
    let mut problem = geo.problem(op, cx.konst(node, 1).is_some());
    problem.dim_ranges = cx.run_dims().other_ranges();
    // The library instances store fp16: at fp32 precision the generic kernel computes everything.
    let inst = if geo.generic_only().is_none() && cx.precision() == Precision::Fp16 {
        cx.target.gemm(&problem)
    } else {
        Instance::own(GENERIC_TEMPLATE, Map::new())
    };
    let ProductGeometry {
        m,
        n,
        k,
        a_cols,
        b_cols,
        a_sm,
        a_sk,
        b_sk,
        b_sn,
        b_matrix,
        out_batch,
        nb,
        batch_count,
        a_bs,
        b_bs,
        bias_st,
        res_st,
        ..
    } = geo;
    let (lib_m, lib_batch) = (problem.m.clone(), problem.batch_count.clone());

    // Tensors: A, B, bias?, residual?, output.
    let a = cx.input(node, 0)?;
    let b = cx.input(node, 1)?;
    let bias = cx.opt_input(node, 2)?;
    let res = cx.opt_input(node, 3)?;
    let out = cx.output(node, 0)?;
    let want = cx.float_dtype();
    for (t, name) in [(Some(a), "A"), (Some(b), "B"), (bias, "bias"), (res, "residual"), (Some(out), "output")] {
        if let Some(t) = t {
            let dt = cx.dtype(t);
            if dt != want {
                lower_unsupported!("{what} {name} is {dt} on the device; the kernels compute on {want} tensors");
            }
        }
    }
    let mut args: Vec<TensorId> = vec![a, b];
    let mut slot = |t: Option<TensorId>| -> i64 {
        match t {
            Some(t) => {
                args.push(t);
                args.len() as i64 - 1
            }
            None => -1,
        }
    };
    let bias_index = slot(bias);
    let res_index = slot(res);
    let out_index = slot(Some(out));

    let mut c: Map<String, Json> = Map::new();
    let e = |d: &Dim| cx.expr(d);
    c.insert("a_index".into(), json!(0));
    c.insert("b_index".into(), json!(1));
    c.insert("bias_index".into(), json!(bias_index));
    c.insert("res_index".into(), json!(res_index));
    c.insert("out_index".into(), json!(out_index));
    c.insert("has_bias".into(), json!(bias.is_some()));
    c.insert("has_residual".into(), json!(res.is_some()));
    c.insert("alpha".into(), json!(float_lit(op.alpha)));
    c.insert("beta".into(), json!(float_lit(op.beta)));
    c.insert("act".into(), json!(act_expr(op.act)));
    c.insert("n".into(), json!(e(&n)?));
    c.insert("k".into(), json!(e(&k)?));
    if inst.template == GENERIC_TEMPLATE {
        float_storage_fields(&mut c, want)?;
        c.insert("m".into(), json!(e(&m)?));
        c.insert("batch_count".into(), json!(e(&batch_count)?));
        let mut dims = Vec::new();
        for d in (0..nb).rev() {
            let pick = |s: &Option<EpilogueStrides>| s.as_ref().map_or(Dim::known(0), |s| s.batch[d].clone());
            dims.push(json!({
                "size": e(&out_batch[d])?,
                "a_stride": e(&a_bs[d])?,
                "b_stride": e(&b_bs[d])?,
                "bias_stride": e(&pick(&bias_st))?,
                "res_stride": e(&pick(&res_st))?,
            }));
        }
        c.insert("gemv".into(), json!(n == Dim::known(1)));
        c.insert("num_batch_dims".into(), json!(dims.len()));
        c.insert("batch_dims".into(), Json::Array(dims));
        for (key, d) in [("a_stride_m", &a_sm), ("a_stride_k", &a_sk), ("b_stride_k", &b_sk), ("b_stride_n", &b_sn)] {
            c.insert(key.into(), json!(e(d)?));
        }
        c.insert("a_k_contiguous".into(), json!(!op.trans_a));
        c.insert("b_n_contiguous".into(), json!(!op.trans_b && b_matrix));
        for (prefix, s) in [("bias", &bias_st), ("res", &res_st)] {
            let (sm, sn) = s.as_ref().map_or((Dim::known(0), Dim::known(0)), |s| (s.m.clone(), s.n.clone()));
            c.insert(format!("{prefix}_stride_m"), json!(e(&sm)?));
            c.insert(format!("{prefix}_stride_n"), json!(e(&sn)?));
        }
    } else {
        // The library's operands: contiguous matrices with a leading dim and a batch stride.
        let matrix = |rows: &Dim, cols: &Dim| rows.mul(cols);
        c.insert("m".into(), json!(e(&lib_m)?));
        c.insert("batch_count".into(), json!(e(&lib_batch)?));
        c.insert("layout_a".into(), json!(if op.trans_a { "ColumnMajor" } else { "RowMajor" }));
        c.insert("layout_b".into(), json!(if op.trans_b { "ColumnMajor" } else { "RowMajor" }));
        c.insert("lda".into(), json!(e(&a_cols)?));
        c.insert("ldb".into(), json!(e(&b_cols)?));
        c.insert("ldd".into(), json!(e(&n)?));
        let a_stride = if problem.a_batched { matrix(&m, &k) } else { Dim::known(0) };
        let b_stride = if problem.b_batched { matrix(&k, &n) } else { Dim::known(0) };
        c.insert("batch_stride_a".into(), json!(e(&a_stride)?));
        c.insert("batch_stride_b".into(), json!(e(&b_stride)?));
        c.insert("batch_stride_d".into(), json!(e(&matrix(&lib_m, &n))?));
        // Per-column bias: one row, shared by every row and batch entry.
        c.insert("bias_ld".into(), json!("0"));
        c.insert("bias_batch_stride".into(), json!("0"));
        // Residual: the output's shape.
        c.insert("res_ld".into(), json!(e(&n)?));
        c.insert("res_batch_stride".into(), json!(e(&matrix(&lib_m, &n))?));
    }
    cx.emit_instance(&node.name, inst, args, vec![out_index as usize], c)?;
    cx.set_flops(&problem.flops())
}

#[cfg(test)]
mod tests {
    use super::super::conv::tests::{lower_at, lower_named, lower_with, render_all, G};
    use super::*;
    use crate::ir::DType;
    use crate::lower::{KernelInstance, Storage};

    fn d(v: i64) -> Dim {
        Dim::known(v)
    }
    fn nsym() -> Dim {
        Dim::sym("N")
    }
    fn matmul() -> Box<Gemm> {
        Box::new(Gemm::matmul())
    }
    fn one(b: &G) -> KernelInstance {
        let p = lower_with(&b.g, lower_kernel_gemm).expect("lowers");
        assert_eq!(p.kernels.len(), 1);
        p.kernels[0].clone()
    }
    fn s(k: &KernelInstance, f: &str) -> String {
        k.context[f].as_str().map(str::to_string).unwrap_or_else(|| k.context[f].to_string())
    }

    #[test]
    fn classifier_with_transposed_weight() {
        let mut b = G::new();
        let x = b.input("x", vec![nsym(), d(2048)]);
        let w = b.konst("w", &[1000, 2048], |i| (i % 3) as f32);
        let bias = b.konst("b", &[1000], |_| 1.0);
        let op = Box::new(Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act: None });
        b.node("fc", op, vec![Some(x), Some(w), Some(bias), None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_library");
        assert_eq!(
            (s(&k, "m"), s(&k, "n"), s(&k, "k"), s(&k, "batch_count")),
            ("(dims.v[0])".into(), "1000".into(), "2048".into(), "1".into())
        );
        assert_eq!((s(&k, "layout_a"), s(&k, "layout_b")), ("RowMajor".into(), "ColumnMajor".into()));
        assert_eq!((s(&k, "lda"), s(&k, "ldb"), s(&k, "ldd")), ("2048".into(), "2048".into(), "1000".into()));
        assert_eq!(s(&k, "act"), "v");
        assert_eq!(k.args.len(), 4);
    }

    #[test]
    fn batched_attention_scores() {
        let mut b = G::new();
        let q = b.input("q", vec![nsym(), d(12), d(128), d(64)]);
        let kt = b.input("kt", vec![nsym(), d(12), d(64), d(128)]);
        let op = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 0.125, beta: 1.0, act: None });
        b.node("scores", op, vec![Some(q), Some(kt), None, None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_library");
        assert_eq!(s(&k, "batch_count"), "((int64_t)12*dims.v[0])");
        assert_eq!(
            (s(&k, "batch_stride_a"), s(&k, "batch_stride_b"), s(&k, "batch_stride_d")),
            ("8192".into(), "8192".into(), "16384".into())
        );
        assert_eq!(s(&k, "alpha"), "0.125f");
    }

    #[test]
    fn projection_folds_the_batch_into_m() {
        let mut b = G::new();
        let x = b.input("x", vec![nsym(), d(128), d(768)]);
        let w = b.konst("w", &[768, 3072], |_| 0.0);
        let bias = b.konst("b", &[3072], |_| 0.0);
        let op = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: Some(Act::GeluErf) });
        b.node("fc1", op, vec![Some(x), Some(w), Some(bias), None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_library");
        assert_eq!((s(&k, "m"), s(&k, "batch_count")), ("((int64_t)128*dims.v[0])".into(), "1".into()));
        assert_eq!((s(&k, "batch_stride_a"), s(&k, "batch_stride_b")), ("0".into(), "0".into()));
        assert_eq!(s(&k, "act"), "o2a_gelu_erf(v)");
    }

    #[test]
    fn residual_with_bias() {
        let mut b = G::new();
        let x = b.input("x", vec![nsym(), d(128), d(3072)]);
        let r = b.input("r", vec![nsym(), d(128), d(768)]);
        let w = b.konst("w", &[3072, 768], |_| 0.0);
        let bias = b.konst("b", &[768], |_| 0.0);
        let op = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: None });
        b.node("fc2", op, vec![Some(x), Some(w), Some(bias), Some(r)]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_library");
        assert_eq!((k.context["bias_index"].as_i64(), k.context["res_index"].as_i64()), (Some(2), Some(3)));
        assert_eq!(s(&k, "res_ld"), "768");
        assert_eq!(k.writes, vec![4]);
    }

    #[test]
    fn unaligned_dims_use_the_generic_kernel() {
        let mut b = G::new();
        let x = b.input("x", vec![nsym(), d(100)]);
        let w = b.konst("w", &[100, 10], |_| 0.0);
        b.node("fc", matmul(), vec![Some(x), Some(w), None, None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_generic");
        assert_eq!(
            (s(&k, "m"), s(&k, "n"), s(&k, "k"), s(&k, "batch_count")),
            ("(dims.v[0])".into(), "10".into(), "100".into(), "1".into())
        );
        assert_eq!(k.context["num_batch_dims"], 0);
        assert_eq!(
            (s(&k, "a_stride_m"), s(&k, "a_stride_k"), s(&k, "b_stride_k"), s(&k, "b_stride_n")),
            ("100".into(), "1".into(), "10".into(), "1".into())
        );
    }

    #[test]
    fn partial_batch_broadcast() {
        let mut b = G::new();
        let x = b.input("x", vec![d(2), d(1), d(8), d(16)]);
        let y = b.input("y", vec![d(1), d(3), d(16), d(8)]);
        b.node("mm", matmul(), vec![Some(x), Some(y), None, None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_generic");
        assert_eq!(s(&k, "batch_count"), "6");
        // Innermost first: dim of size 3 (A broadcast, B stride 128), then size 2 (A stride 128).
        let dims = k.context["batch_dims"].as_array().unwrap();
        assert_eq!(
            (dims[0]["size"].as_str(), dims[0]["a_stride"].as_str(), dims[0]["b_stride"].as_str()),
            (Some("3"), Some("0"), Some("128"))
        );
        assert_eq!(
            (dims[1]["size"].as_str(), dims[1]["a_stride"].as_str(), dims[1]["b_stride"].as_str()),
            (Some("2"), Some("128"), Some("0"))
        );
    }

    #[test]
    fn vector_operands_and_general_bias() {
        // [N,64] x [64] → [N]: N = 1, generic.
        let mut b = G::new();
        let x = b.input("x", vec![nsym(), d(64)]);
        let v = b.konst("v", &[64], |_| 1.0);
        b.node("mv", matmul(), vec![Some(x), Some(v), None, None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_generic");
        assert_eq!((s(&k, "n"), k.context["b_n_contiguous"].as_bool()), ("1".into(), Some(false)));
        assert_eq!(k.context["gemv"], true);
        assert_eq!((s(&k, "b_stride_k"), s(&k, "m")), ("1".into(), "(dims.v[0])".into()));

        // A per-row bias [M, 1] broadcasts along N: generic, with stride 1 along M.
        let mut b = G::new();
        let x = b.input("x", vec![d(32), d(64)]);
        let w = b.konst("w", &[64, 16], |_| 1.0);
        let bias = b.konst("b", &[32, 1], |_| 1.0);
        let op = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 2.0, beta: -0.5, act: None });
        b.node("g", op, vec![Some(x), Some(w), Some(bias), None]);
        let k = one(&b);
        assert_eq!(k.template, "gemm_generic");
        assert_eq!((s(&k, "bias_stride_m"), s(&k, "bias_stride_n")), ("1".into(), "0".into()));
        assert_eq!((s(&k, "alpha"), s(&k, "beta")), ("2.0f".into(), "(-0.5f)".into()));
    }

    #[test]
    fn onnx_matmul_and_gemm() {
        let mut b = G::new();
        let x = b.input("x", vec![nsym(), d(64)]);
        let w = b.konst("w", &[64, 32], |_| 1.0);
        b.node("mm", Box::new(linalg::MatMul), vec![Some(x), Some(w)]);
        let p = lower_with(&b.g, lower_onnx_matmul).expect("lowers");
        assert_eq!(p.kernels[0].template, "gemm_library");

        let mut b = G::new();
        let x = b.input("x", vec![d(16), d(64)]);
        let w = b.konst("w", &[32, 64], |_| 1.0);
        let c = b.konst("c", &[32], |_| 1.0);
        let op = Box::new(linalg::Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 0.5 });
        b.node("gemm", op, vec![Some(x), Some(w), Some(c)]);
        let p = lower_with(&b.g, lower_onnx_gemm).expect("lowers");
        let k = &p.kernels[0];
        assert_eq!(k.template, "gemm_library");
        assert_eq!((s(k, "beta"), k.context["has_bias"].as_bool()), ("0.5f".into(), Some(true)));

        // Integer MatMul: no GPU kernel.
        let mut b = G::new();
        let x = b.value("x", DType::I64, vec![d(4), d(4)]);
        b.g.inputs.push(x);
        b.node("imm", Box::new(linalg::MatMul), vec![Some(x), Some(x)]);
        assert!(matches!(lower_with(&b.g, lower_onnx_matmul), Err(LowerError::Unsupported(_))));
    }

    /// The examples of the brief render: classifier `[N,2048]×[2048,1000]+bias`, batched
    /// `[N·12,S,64]×[N·12,64,S]`, bias + residual + GELU, residual only, and the generic kernel
    /// (unaligned, partial broadcast, matrix-vector with a general bias).
    #[test]
    fn examples_render() {
        let mut b = G::new();
        let x = b.input("pooled", vec![nsym(), d(2048)]);
        let w = b.konst("fc.w", &[2048, 1000], |_| 0.01);
        let bias = b.konst("fc.b", &[1000], |_| 0.0);
        let fc_op = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: None });
        b.node("fc", fc_op, vec![Some(x), Some(w), Some(bias), None]);
        let heads = nsym().mul(&d(12));
        let q = b.input("q", vec![heads.clone(), d(128), d(64)]);
        let kt = b.input("kt", vec![heads, d(64), d(128)]);
        let att = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 0.125, beta: 1.0, act: None });
        b.node("scores", att, vec![Some(q), Some(kt), None, None]);
        let h = b.input("h", vec![nsym(), d(128), d(768)]);
        let w1 = b.konst("w1", &[3072, 768], |_| 0.01);
        let b1 = b.konst("b1", &[3072], |_| 0.0);
        let up = Box::new(Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act: Some(Act::GeluErf) });
        let y = b.node("up", up, vec![Some(h), Some(w1), Some(b1), None]);
        let w2 = b.konst("w2", &[3072, 768], |_| 0.01);
        let b2 = b.konst("b2", &[768], |_| 0.0);
        let down = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: None });
        let z = b.node("down_residual", down, vec![Some(y), Some(w2), Some(b2), Some(h)]);
        let w3 = b.konst("w3", &[768, 768], |_| 0.01);
        b.node("residual_only", matmul(), vec![Some(z), Some(w3), None, Some(z)]);
        let u = b.input("u", vec![nsym(), d(100)]);
        let w4 = b.konst("w4", &[100, 10], |_| 0.01);
        b.node("unaligned", matmul(), vec![Some(u), Some(w4), None, None]);
        let p1 = b.input("p1", vec![d(2), d(1), d(8), d(16)]);
        let p2 = b.input("p2", vec![d(1), d(3), d(16), d(8)]);
        b.node("partial", matmul(), vec![Some(p1), Some(p2), None, None]);
        let v = b.konst("v", &[2048], |_| 0.01);
        let c = b.konst("c", &[1], |_| 0.5);
        let mv = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 2.0, act: Some(Act::Tanh) });
        b.node("matvec", mv, vec![Some(x), Some(v), Some(c), None]);
        // More batch entries than a grid's z dim holds.
        let many_a = b.input("many_a", vec![d(70000), d(8), d(16)]);
        let many_b = b.input("many_b", vec![d(70000), d(16), d(8)]);
        b.node("many_small", matmul(), vec![Some(many_a), Some(many_b), None, None]);
        let p = lower_named(&b.g, lower_kernel_gemm, "gemm").expect("lowers");
        let templates: Vec<&str> = p.kernels.iter().map(|k| k.template.as_str()).collect();
        assert_eq!(
            templates,
            [
                "gemm_library",
                "gemm_library",
                "gemm_library",
                "gemm_library",
                "gemm_library",
                "gemm_generic",
                "gemm_generic",
                "gemm_generic",
                "gemm_library"
            ]
        );
        for (name, text) in render_all(&p) {
            assert!(text.contains(&format!("int {}(void* const* t, o2a_dims dims", &name[..name.len() - 3])), "{name}");
        }
    }

    /// fp32 precision: every product (even ones a library instance would take at fp16) runs the
    /// generic kernel on fp32 tensors, and the target is never asked.
    #[test]
    fn fp32_products_run_the_generic_kernel() {
        let mut b = G::new();
        let x = b.input("pooled", vec![nsym(), d(2048)]);
        let w = b.konst("fc.w", &[1000, 2048], |i| i as f32 * 0.25);
        let bias = b.konst("fc.b", &[1000], |_| 0.5);
        let fc = Box::new(Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act: None });
        b.node("fc", fc, vec![Some(x), Some(w), Some(bias), None]);
        let q = b.input("q", vec![nsym(), d(12), d(128), d(64)]);
        let kt = b.input("kt", vec![nsym(), d(12), d(64), d(128)]);
        let att = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 0.125, beta: 1.0, act: None });
        b.node("scores", att, vec![Some(q), Some(kt), None, None]);
        let h = b.input("h", vec![nsym(), d(128), d(768)]);
        let w1 = b.konst("w1", &[768, 768], |_| 0.01);
        let up = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: Some(Act::GeluErf) });
        b.node("residual", up, vec![Some(h), Some(w1), None, Some(h)]);
        let v = b.konst("v", &[2048], |_| 0.01);
        b.node("matvec", matmul(), vec![Some(x), Some(v), None, None]);
        let p = lower_at(&b.g, lower_kernel_gemm, "gemm32", Precision::Fp32).expect("lowers");
        assert_eq!(p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(), ["gemm_generic"; 4]);
        assert!(p.library.is_empty());
        assert!(p.tensors.iter().all(|t| t.dtype == DType::F32));
        let fc = &p.kernels[0];
        assert_eq!(
            (s(fc, "ctype"), s(fc, "to_float"), s(fc, "from_float")),
            ("float".into(), "o2a_to_float".into(), "o2a_from_float<float>".into())
        );
        assert_eq!((s(fc, "m"), s(fc, "n"), s(fc, "k")), ("(dims.v[0])".into(), "1000".into(), "2048".into()));
        // op(B) = W^T: element (kk, j) at j * 2048 + kk.
        assert_eq!((s(fc, "b_stride_k"), s(fc, "b_stride_n")), ("1".into(), "2048".into()));
        let Storage::Weight { offset, bytes } = p.tensors[fc.args[1]].storage else { panic!("weight") };
        assert_eq!(bytes, 1000 * 2048 * 4);
        let at = offset as usize + 4 * 4097;
        assert_eq!(
            f32::from_le_bytes([p.weights[at], p.weights[at + 1], p.weights[at + 2], p.weights[at + 3]]),
            1024.25
        );
        let scores = &p.kernels[1];
        assert_eq!((s(scores, "batch_count"), s(scores, "alpha")), ("((int64_t)12*dims.v[0])".into(), "0.125f".into()));
        assert_eq!(p.kernels[2].context["has_residual"], true);
        assert_eq!(p.kernels[3].context["gemv"], true);
        for (name, text) in render_all(&p) {
            assert!(text.contains("const float* a;"), "{name}");
            assert!(!text.contains("half"), "{name} mentions half");
        }
    }
}
