//! Per-family lowering of kernel-level and remaining ONNX ops, one file per family. Each family
//! has one `OPS` table mapping an op type (as `Op::op_type` names it) to its lowering function;
//! [`FAMILIES`] lists the tables, and a lookup that finds nothing makes the node unsupported.

pub mod act;
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
pub mod transpose;

use super::{LowerCtx, LowerResult};
use crate::ir::Node;
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
