//! Typed node attributes and the parse context ops read them through.

use super::op::{OpError, OpResult};
use super::tensor::Tensor;
use std::collections::BTreeMap;

/// A decoded ONNX attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Float(f32),
    Int(i64),
    String(String),
    Tensor(Tensor),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<String>),
    /// Graph-valued attributes (If/Loop/Scan bodies): kept only to name them in errors.
    Graph,
    /// Another attribute kind onnx2ait does not read (sparse tensors, type protos).
    Other(&'static str),
}

impl Attr {
    pub fn kind(&self) -> &'static str {
        match self {
            Attr::Float(_) => "FLOAT",
            Attr::Int(_) => "INT",
            Attr::String(_) => "STRING",
            Attr::Tensor(_) => "TENSOR",
            Attr::Floats(_) => "FLOATS",
            Attr::Ints(_) => "INTS",
            Attr::Strings(_) => "STRINGS",
            Attr::Graph => "GRAPH",
            Attr::Other(k) => k,
        }
    }
}

pub type Attributes = BTreeMap<String, Attr>;

/// What an op's parser sees of a node: its attributes, arity and the opset it was written for.
/// Getters return errors that name the attribute; the importer adds file, node and op.
pub struct NodeCtx<'a> {
    pub name: &'a str,
    pub op_type: &'a str,
    pub domain: &'a str,
    /// The opset version of the node's domain imported by the model.
    pub opset: i64,
    pub attrs: &'a Attributes,
    /// Which inputs are present (an empty name marks an omitted optional input).
    pub inputs_present: &'a [bool],
    pub num_outputs: usize,
}

macro_rules! getter {
    ($get:ident, $or:ident, $req:ident, $variant:ident, $ty:ty, $kind:literal) => {
        pub fn $get(&self, name: &str) -> OpResult<Option<$ty>> {
            match self.attrs.get(name) {
                None => Ok(None),
                Some(Attr::$variant(v)) => Ok(Some(v.clone())),
                Some(other) => Err(OpError(format!("attribute '{name}' must be {}, found {}", $kind, other.kind()))),
            }
        }

        pub fn $or(&self, name: &str, default: $ty) -> OpResult<$ty> {
            Ok(self.$get(name)?.unwrap_or(default))
        }

        pub fn $req(&self, name: &str) -> OpResult<$ty> {
            self.$get(name)?.ok_or_else(|| OpError(format!("required attribute '{name}' is missing")))
        }
    };
}

impl<'a> NodeCtx<'a> {
    getter!(int, int_or, req_int, Int, i64, "INT");
    getter!(float, float_or, req_float, Float, f32, "FLOAT");
    getter!(string, string_or, req_string, String, String, "STRING");
    getter!(ints, ints_or, req_ints, Ints, Vec<i64>, "INTS");
    getter!(floats, floats_or, req_floats, Floats, Vec<f32>, "FLOATS");
    getter!(strings, strings_or, req_strings, Strings, Vec<String>, "STRINGS");
    getter!(tensor, tensor_or, req_tensor, Tensor, Tensor, "TENSOR");

    pub fn has(&self, name: &str) -> bool {
        self.attrs.contains_key(name)
    }

    /// A boolean flag stored as INT 0/1.
    pub fn flag(&self, name: &str, default: bool) -> OpResult<bool> {
        match self.int(name)? {
            None => Ok(default),
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            Some(v) => Err(OpError(format!("attribute '{name}' must be 0 or 1, found {v}"))),
        }
    }

    /// A STRING attribute restricted to `allowed` values.
    pub fn choice(&self, name: &str, default: &str, allowed: &[&str]) -> OpResult<String> {
        let v = self.string_or(name, default.to_string())?;
        if allowed.contains(&v.as_str()) {
            Ok(v)
        } else {
            Err(OpError(format!("attribute '{name}' = '{v}' is not supported (expected one of {allowed:?})")))
        }
    }

    pub fn num_inputs(&self) -> usize {
        self.inputs_present.len()
    }

    pub fn input_present(&self, i: usize) -> bool {
        self.inputs_present.get(i).copied().unwrap_or(false)
    }
}
