//! Typed IR: graph, values with dtype and (symbolic) shape, typed ops, inference and folding.

pub mod attr;
pub mod broadcast;
pub mod dim;
pub mod dtype;
pub mod graph;
pub mod index_views;
pub mod infer;
pub mod op;
pub mod ops;
pub mod specialize;
pub mod tensor;

pub use attr::{Attr, Attributes, NodeCtx};
pub use dim::Dim;
pub use dtype::DType;
pub use graph::{Graph, ModelInfo, Node, NodeId, Value, ValueId};
pub use op::{optional, required, Fact, Op, OpError, OpResult, ValueType};
pub use tensor::{Elem, Tensor};
