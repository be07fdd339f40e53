//! The typed graph: values (with types, and contents when constant) and nodes in topological order.

use super::dim::Dim;
use super::op::{Op, ValueType};
use super::tensor::Tensor;
use std::collections::BTreeMap;
use std::sync::Arc;

pub type ValueId = usize;
pub type NodeId = usize;

#[derive(Clone, Debug)]
pub struct Value {
    pub name: String,
    /// Known after inference for every value; graph inputs and initializers have it from import.
    pub ty: Option<ValueType>,
    /// Contents of constants: initializers, folded subgraphs.
    pub konst: Option<Arc<Tensor>>,
    /// Symbolic contents of small int64 shape tensors (see `Fact::sym`).
    pub sym: Option<Vec<Dim>>,
}

#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    /// The ONNX op type and domain as written in the model (kept for reports).
    pub op_type: String,
    pub domain: String,
    pub op: Box<dyn Op>,
    /// `None` marks an omitted optional input.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<ValueId>,
}

#[derive(Clone, Debug, Default)]
pub struct ModelInfo {
    /// The file the graph was read from, for error messages.
    pub source: String,
    pub ir_version: i64,
    pub producer: String,
    pub graph_name: String,
    /// Opset version per domain ("" is the default ONNX domain).
    pub opsets: BTreeMap<String, i64>,
    /// Problems that do not stop the import (e.g. `value_info` that disagrees with inference).
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub info: ModelInfo,
    pub values: Vec<Value>,
    /// In topological order.
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

impl Graph {
    pub fn value(&self, id: ValueId) -> &Value {
        &self.values[id]
    }

    pub fn value_named(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name)
    }

    /// Type of a value; panics only on graphs that skipped inference, a programming error.
    pub fn ty(&self, id: ValueId) -> &ValueType {
        self.values[id].ty.as_ref().unwrap_or_else(|| panic!("value '{}' has no inferred type", self.values[id].name))
    }

    pub fn add_value(&mut self, name: String, ty: Option<ValueType>) -> ValueId {
        self.values.push(Value { name, ty, konst: None, sym: None });
        self.values.len() - 1
    }

    /// Which node produces each value (`None` for graph inputs and constants).
    pub fn producers(&self) -> Vec<Option<NodeId>> {
        let mut p = vec![None; self.values.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            for &o in &node.outputs {
                p[o] = Some(n);
            }
        }
        p
    }

    /// For each value, the nodes that read it.
    pub fn consumers(&self) -> Vec<Vec<NodeId>> {
        let mut c = vec![Vec::new(); self.values.len()];
        for (n, node) in self.nodes.iter().enumerate() {
            for i in node.inputs.iter().flatten() {
                if !c[*i].contains(&n) {
                    c[*i].push(n);
                }
            }
        }
        c
    }

    /// Constants the graph reads (initializers and folded values), excluding unused ones.
    pub fn used_constants(&self) -> Vec<ValueId> {
        let mut used = vec![false; self.values.len()];
        for node in &self.nodes {
            for i in node.inputs.iter().flatten() {
                used[*i] = true;
            }
        }
        for &o in &self.outputs {
            used[o] = true;
        }
        (0..self.values.len()).filter(|&v| used[v] && self.values[v].konst.is_some()).collect()
    }

    /// Op-type histogram (ONNX names), sorted by name.
    pub fn op_histogram(&self) -> BTreeMap<String, usize> {
        let mut h = BTreeMap::new();
        for n in &self.nodes {
            *h.entry(n.op_type.clone()).or_insert(0) += 1;
        }
        h
    }

    /// For each node, whether a graph output depends on it.
    pub fn live_nodes(&self) -> Vec<bool> {
        let mut live = vec![false; self.values.len()];
        for &o in &self.outputs {
            live[o] = true;
        }
        let mut keep = vec![false; self.nodes.len()];
        for (n, node) in self.nodes.iter().enumerate().rev() {
            if node.outputs.iter().any(|&o| live[o]) {
                keep[n] = true;
                for i in node.inputs.iter().flatten() {
                    live[*i] = true;
                }
            }
        }
        keep
    }

    /// Removes nodes whose outputs nobody reads (and that are not graph outputs).
    pub fn remove_dead_nodes(&mut self) {
        let keep = self.live_nodes();
        let mut k = keep.iter();
        self.nodes.retain(|_| *k.next().unwrap());
    }
}
