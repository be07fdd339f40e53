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
