//! Builders shared by the unit tests of every op family: parsing one node through the
//! registry (so any op of any family can be built the way the importer builds it), fact and
//! tensor shorthands, and a small hand-built graph for driver-level tests.

use crate::ir::graph::{Graph, Node, ValueId};
use crate::ir::{Attr, Attributes, DType, Dim, Fact, NodeCtx, Op, OpResult, Tensor, ValueType};
use std::sync::Arc;

/// Parses one default-domain node of `op_type` at `opset`, found through the registry, with the
/// given attributes, presence flag per input slot and output count. The general form; the
/// helpers below cover the common shapes of call.
pub fn parse_node(
    op_type: &str,
    opset: i64,
    attrs: &[(&str, Attr)],
    present: &[bool],
    n_out: usize,
) -> OpResult<Box<dyn Op>> {
    let attrs: Attributes = attrs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    let spec = super::registry().lookup("", op_type).unwrap_or_else(|| panic!("{op_type} is not registered"));
    let ctx = NodeCtx {
        name: "n",
        op_type: spec.op_type,
        domain: "",
        opset,
        attrs: &attrs,
        inputs_present: present,
        num_outputs: n_out,
    };
    (spec.parse)(&ctx)
}

/// Parses one node of `op_type` at `opset`, with `n_in` present inputs and `n_out` outputs.
pub fn parse(op_type: &str, opset: i64, attrs: Vec<(&str, Attr)>, n_in: usize, n_out: usize) -> OpResult<Box<dyn Op>> {
    parse_node(op_type, opset, &attrs, &vec![true; n_in], n_out)
}

/// A shape from text: `"N,3,224"` (numbers are known dims, names symbols, `""` is 0-D).
pub fn dims(s: &str) -> Vec<Dim> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| match p.trim().parse::<i64>() {
            Ok(v) => Dim::known(v),
            Err(_) => Dim::sym(p.trim()),
        })
        .collect()
}

pub fn fact(dtype: DType, shape: &str) -> Fact {
    Fact::new(dtype, dims(shape))
}

pub fn ints(v: &[i64]) -> Fact {
    Fact::constant(Arc::new(Tensor::from_i64s(&[v.len()], v.to_vec())))
}

pub fn scalar(v: i64) -> Fact {
    Fact::constant(Arc::new(Tensor::from_i64s(&[], vec![v])))
}

pub fn t_ints(v: &[i64]) -> Tensor {
    Tensor::from_i64s(&[v.len()], v.to_vec())
}

pub fn t_f32(shape: &[usize], v: Vec<f32>) -> Tensor {
    Tensor::from_f32s(shape, v)
}

pub fn iota(shape: &[usize]) -> Tensor {
    let n = shape.iter().product::<usize>();
    Tensor::from_f32s(shape, (0..n).map(|v| v as f32).collect())
}

/// Infers one op and returns the single output's shape as text.
pub fn out_shape(op: &dyn Op, inputs: &[&Fact]) -> String {
    let ins: Vec<Option<&Fact>> = inputs.iter().map(|f| Some(*f)).collect();
    let out = op.infer(&ins).unwrap_or_else(|e| panic!("infer failed: {e}"));
    crate::ir::dim::fmt_shape(out[0].shape())
}

pub fn eval1(op: &dyn Op, inputs: &[&Tensor]) -> Tensor {
    let ins: Vec<Option<&Tensor>> = inputs.iter().map(|t| Some(*t)).collect();
    let mut out = op.eval(&ins).unwrap_or_else(|e| panic!("eval failed: {e}"));
    out.remove(0)
}

/// A hand-built graph for driver-level tests.
#[derive(Default)]
pub struct GraphBuilder {
    pub g: Graph,
    pub opset: i64,
}

impl GraphBuilder {
    pub fn new(opset: i64) -> Self {
        let mut g = Graph::default();
        g.info.source = "test.onnx".into();
        g.info.opsets.insert(String::new(), opset);
        GraphBuilder { g, opset }
    }

    pub fn input(&mut self, name: &str, dtype: DType, shape: &str) -> ValueId {
        let id = self.g.add_value(name.into(), Some(ValueType::new(dtype, dims(shape))));
        self.g.inputs.push(id);
        id
    }

    pub fn konst(&mut self, name: &str, t: Tensor) -> ValueId {
        let id = self.g.add_value(name.into(), Some(ValueType::new(t.dtype(), crate::ir::dim::dims_of(t.shape()))));
        self.g.values[id].konst = Some(Arc::new(t));
        id
    }

    pub fn node(&mut self, op_type: &str, attrs: Vec<(&str, Attr)>, inputs: &[ValueId], n_out: usize) -> Vec<ValueId> {
        let op = parse(op_type, self.opset, attrs, inputs.len(), n_out).expect("node parses");
        let n = self.g.nodes.len();
        let outputs: Vec<ValueId> = (0..n_out).map(|k| self.g.add_value(format!("{op_type}_{n}_{k}"), None)).collect();
        self.g.nodes.push(Node {
            name: format!("{op_type}_{n}"),
            op_type: op_type.into(),
            domain: String::new(),
            op,
            inputs: inputs.iter().map(|&i| Some(i)).collect(),
            outputs: outputs.clone(),
        });
        outputs
    }
}
