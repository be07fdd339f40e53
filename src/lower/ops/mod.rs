//! Per-family lowering of kernel-level and remaining ONNX ops, one file per family. Each family
//! has one `OPS` table mapping an op type (as `Op::op_type` names it) to its lowering function;
//! [`FAMILIES`] lists the tables, and a lookup that finds nothing makes the node unsupported.

pub mod act;
pub mod attention;
pub mod cast;
pub mod conv;
pub mod elementwise;
pub mod gemm;
pub mod indexing;
pub mod misc;
pub mod norm;
pub mod pool;
pub mod reduce;
pub mod shape;
pub mod squeeze_excite;
pub mod transpose;

use super::{ctype, LowerCtx, LowerError, LowerResult};
use crate::ir::{DType, Node};
use serde_json::{json, Map, Value as Json};
use std::any::Any;

/// How one op type is lowered: the function emits the node's kernel(s) or views.
pub struct LowerSpec {
    pub op_type: &'static str,
    /// Whether the node's op is the type this lowering handles: kernel-level ops share some
    /// names with ONNX ops (`Gemm`, `Transpose`), so the name alone does not decide.
    pub is: fn(&dyn Any) -> bool,
    pub lower: fn(&mut LowerCtx, &Node) -> LowerResult<()>,
}

impl LowerSpec {
    /// The lowering of op type `op_type` implemented by the IR struct `T`.
    pub const fn of<T: 'static>(
        op_type: &'static str,
        lower: fn(&mut LowerCtx, &Node) -> LowerResult<()>,
    ) -> LowerSpec {
        LowerSpec { op_type, is: is_type::<T>, lower }
    }
}

fn is_type<T: 'static>(a: &dyn Any) -> bool {
    a.is::<T>()
}

/// Every family's table.
pub const FAMILIES: &[(&str, &[LowerSpec])] = &[
    ("conv", conv::OPS),
    ("gemm", gemm::OPS),
    ("elementwise", elementwise::OPS),
    ("cast", cast::OPS),
    ("transpose", transpose::OPS),
    ("shape", shape::OPS),
    ("indexing", indexing::OPS),
    ("misc", misc::OPS),
    ("pool", pool::OPS),
    ("norm", norm::OPS),
    ("attention", attention::OPS),
    ("squeeze_excite", squeeze_excite::OPS),
    ("reduce", reduce::OPS),
];

/// The lowering of a node, by its op type.
pub fn find(node: &Node) -> Option<&'static LowerSpec> {
    let op_type = node.op.op_type();
    FAMILIES.iter().flat_map(|(_, specs)| specs.iter()).find(|s| s.op_type == op_type && (s.is)(node.op.as_any()))
}

/// Every op type with a GPU kernel, sorted (for reports and `onnx2ait ops`).
pub fn supported_op_types() -> Vec<&'static str> {
    let mut v: Vec<&str> = FAMILIES.iter().flat_map(|(_, specs)| specs.iter().map(|s| s.op_type)).collect();
    v.sort();
    v.dedup();
    v
}

/// Template fields of a kernel that stores floats as `dt` and computes in fp32 (`conv2d_direct`,
/// `gemm_generic`): `ctype`, the conversions `to_float` / `from_float` of one element, and `half`.
/// The fp16 spellings are the intrinsics those templates always used, so fp16 kernels render as
/// they did before fp32 storage existed.
pub(crate) fn float_storage_fields(c: &mut Map<String, Json>, dt: DType) -> LowerResult<()> {
    let (to_float, from_float) = match dt {
        DType::F16 => ("__half2float", "__float2half_rn"),
        DType::F32 => ("o2a_to_float", "o2a_from_float<float>"),
        other => return Err(LowerError::Invalid(format!("float kernels store fp16 or fp32 tensors, found {other}"))),
    };
    c.insert("ctype".into(), json!(ctype(dt)));
    c.insert("to_float".into(), json!(to_float));
    c.insert("from_float".into(), json!(from_float));
    c.insert("half".into(), json!(dt == DType::F16));
    Ok(())
}

/// Whether a device tensor holds floats: fp16, or fp32 at fp32 precision (`--precision fp32`).
/// Kernels load either as `float` and compute in fp32.
pub(crate) fn is_device_float(dt: DType) -> bool {
    dt == DType::F16 || dt == DType::F32
}

/// Fails with "`what` of `dt` tensors" (unsupported) unless `t` holds floats on the device.
pub(crate) fn require_float(cx: &LowerCtx, t: super::TensorId, what: &str) -> LowerResult<()> {
    let dt = cx.dtype(t);
    if !is_device_float(dt) {
        return Err(LowerError::Unsupported(format!("{what} of {dt} tensors")));
    }
    Ok(())
}

/// The work each op family states for its kernels (`Program::kernel_work`), read back as the
/// runtime reads it from build.json (`Dim::to_terms_json` / `from_terms_json`, evaluated at the
/// run-time dims) at two batch sizes.
#[cfg(test)]
mod work_tests {
    use super::conv::tests::{lower_with, G};
    use super::*;
    use crate::ir::ops::arithmetic::{BinaryKind, BinaryOp};
    use crate::ir::ops::kernel::{Attention, AttentionLayout, Conv2d, ConvGeom, Gemm, Layout};
    use crate::ir::Dim;
    use crate::lower::Program;
    use std::collections::BTreeMap;

    /// Any node, through the family tables.
    fn lower_any(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
        let spec = find(node).ok_or_else(|| LowerError::Unsupported(format!("no lowering of {}", node.name)))?;
        (spec.lower)(cx, node)
    }

    /// `(flops, bytes)` of the kernel with template family `template` at batch `n`.
    fn work_at(p: &Program, template: &str, n: i64) -> (i64, i64) {
        let k = p.kernels.iter().find(|k| k.template.starts_with(template)).unwrap_or_else(|| {
            panic!("no {template} kernel in {:?}", p.kernels.iter().map(|k| &k.template).collect::<Vec<_>>())
        });
        let env = BTreeMap::from([("N".to_string(), n)]);
        let (flops, bytes) = p.kernel_work(k);
        let at = |d: &Dim| Dim::from_terms_json(&d.to_terms_json()).expect("reads back").eval(&env).as_known();
        (at(&flops).expect("flops known"), at(&bytes).expect("bytes known"))
    }

    fn d(v: i64) -> Dim {
        Dim::known(v)
    }

    #[test]
    fn conv_counts_the_models_problem() {
        // NHWC 10x12x16 → 32 channels, 3x3, stride 1, pad 1: P·Q = 120.
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), d(10), d(12), d(16)]);
        let w = b.konst("w", &[32, 3, 3, 16], |i| (i % 5) as f32);
        let geom = ConvGeom { strides: [1, 1], pads: [1; 4], dilations: [1, 1], group: 1 };
        b.node("c", Box::new(Conv2d { layout: Layout::Nhwc, geom, act: None, pre_act: None }), vec![Some(x), Some(w)]);
        let p = lower_with(&b.g, lower_any).expect("lowers");
        for n in [1, 32] {
            let (flops, bytes) = work_at(&p, "conv2d", n);
            assert_eq!(flops, 2 * n * 10 * 12 * 32 * 16 * 3 * 3, "batch {n}");
            // fp16 input, weights and output, each once.
            assert_eq!(bytes, 2 * (n * 10 * 12 * 16 + 32 * 3 * 3 * 16 + n * 10 * 12 * 32), "batch {n}");
        }
    }

    #[test]
    fn grouped_conv_counts_channels_per_group() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), d(8), d(8), d(32)]);
        let w = b.konst("w", &[32, 3, 3, 1], |_| 1.0);
        let geom = ConvGeom { strides: [1, 1], pads: [1; 4], dilations: [1, 1], group: 32 };
        b.node("dw", Box::new(Conv2d { layout: Layout::Nhwc, geom, act: None, pre_act: None }), vec![Some(x), Some(w)]);
        let p = lower_with(&b.g, lower_any).expect("lowers");
        for n in [1, 32] {
            assert_eq!(work_at(&p, "conv2d", n).0, 2 * n * 8 * 8 * 32 * 3 * 3, "batch {n}");
        }
    }

    #[test]
    fn gemm_counts_two_flops_per_multiply_add_batched_too() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), d(2048)]);
        let w = b.konst("w", &[1000, 2048], |i| (i % 3) as f32);
        let bias = b.konst("b", &[1000], |_| 1.0);
        let op = Box::new(Gemm { trans_a: false, trans_b: true, alpha: 1.0, beta: 1.0, act: None });
        b.node("fc", op, vec![Some(x), Some(w), Some(bias), None]);
        let p = lower_with(&b.g, lower_any).expect("lowers");
        for n in [1, 32] {
            let (flops, bytes) = work_at(&p, "gemm", n);
            assert_eq!(flops, 2 * n * 1000 * 2048, "batch {n}");
            assert_eq!(bytes, 2 * (n * 2048 + 1000 * 2048 + 1000 + n * 1000), "batch {n}");
        }

        // [N,12,128,64] x [N,12,64,128]: 12·N products of 128x64 by 64x128.
        let mut b = G::new();
        let q = b.input("q", vec![Dim::sym("N"), d(12), d(128), d(64)]);
        let kt = b.input("kt", vec![Dim::sym("N"), d(12), d(64), d(128)]);
        b.node("scores", Box::new(Gemm::matmul()), vec![Some(q), Some(kt), None, None]);
        let p = lower_with(&b.g, lower_any).expect("lowers");
        for n in [1, 32] {
            assert_eq!(work_at(&p, "gemm", n).0, 2 * n * 12 * 128 * 128 * 64, "batch {n}");
        }
    }

    #[test]
    fn attention_counts_both_products() {
        let (h, s, dh) = (12, 128, 64);
        let mut b = G::new();
        let q = b.input("q", vec![Dim::sym("N"), d(h), d(s), d(dh)]);
        let kt = b.input("kt", vec![Dim::sym("N"), d(h), d(dh), d(s)]);
        let v = b.input("v", vec![Dim::sym("N"), d(h), d(s), d(dh)]);
        let op = Box::new(Attention { scale: 0.125, layout: AttentionLayout::HeadsFirst });
        b.node("att", op, vec![Some(q), Some(kt), Some(v), None]);
        let p = lower_with(&b.g, lower_any).expect("lowers");
        for n in [1, 32] {
            let (flops, bytes) = work_at(&p, "attention", n);
            assert_eq!(flops, 4 * n * h * s * s * dh, "batch {n}");
            assert_eq!(bytes, 2 * 4 * n * h * s * dh, "batch {n}: q, k, v and the output once");
        }
    }

    #[test]
    fn elementwise_counts_one_flop_per_output_element() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), d(64), d(7)]);
        let y = b.input("y", vec![d(1), d(64), d(1)]);
        let op = Box::new(BinaryOp { kind: BinaryKind::Add, legacy: None, float_floor_mod: false });
        b.node("add", op, vec![Some(x), Some(y)]);
        let p = lower_with(&b.g, lower_any).expect("lowers");
        for n in [1, 32] {
            let (flops, bytes) = work_at(&p, "elementwise", n);
            assert_eq!(flops, n * 64 * 7, "batch {n}");
            assert_eq!(bytes, 2 * (n * 64 * 7 + 64 + n * 64 * 7), "batch {n}: the broadcast operand once");
        }
    }
}
