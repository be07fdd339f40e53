//! Errors reported to users. Each names the file and, where one is involved, the node and op.

use std::fmt;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read or decoded, or the model as a whole is malformed.
    #[error("{path}: {msg}")]
    Model { path: String, msg: String },

    /// One node is wrong (bad attribute, incompatible shapes, failed evaluation).
    #[error("{path}: node '{node}' ({op}): {msg}")]
    Node { path: String, node: String, op: String, msg: String },

    /// The model uses ops onnx2ait does not support; all of them are listed at once.
    #[error("{path}: {} unsupported op type(s):\n{}", .ops.len(), fmt_unsupported(.ops))]
    Unsupported { path: String, ops: Vec<UnsupportedOp> },

    /// Several independent problems (e.g. every bad node of a model), listed together.
    #[error("{}", fmt_many(.0))]
    Many(Vec<Error>),

    #[error("{0}")]
    Other(String),
}

/// An op type the registry does not know, with the nodes that use it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct UnsupportedOp {
    pub domain: String,
    pub op_type: String,
    pub nodes: Vec<String>,
}

impl fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name =
            if self.domain.is_empty() { self.op_type.clone() } else { format!("{}::{}", self.domain, self.op_type) };
        let shown: Vec<&str> = self.nodes.iter().take(8).map(String::as_str).collect();
        let more = if self.nodes.len() > 8 { format!(", … ({} more)", self.nodes.len() - 8) } else { String::new() };
        write!(f, "{name} ({} node(s): {}{more})", self.nodes.len(), shown.join(", "))
    }
}

fn fmt_unsupported(ops: &[UnsupportedOp]) -> String {
    ops.iter().map(|o| format!("  - {o}")).collect::<Vec<_>>().join("\n")
}

fn fmt_many(errs: &[Error]) -> String {
    errs.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n")
}

impl Error {
    pub fn model(path: &str, msg: impl Into<String>) -> Error {
        Error::Model { path: path.to_string(), msg: msg.into() }
    }

    pub fn node(path: &str, node: &str, op: &str, msg: impl Into<String>) -> Error {
        Error::Node { path: path.to_string(), node: node.to_string(), op: op.to_string(), msg: msg.into() }
    }

    /// One error, or all of them together.
    pub fn from_many(mut errs: Vec<Error>) -> Error {
        if errs.len() == 1 {
            errs.pop().unwrap()
        } else {
            Error::Many(errs)
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
