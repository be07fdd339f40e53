//! What `compile` writes beside the sources for people and tools: `graph.json` (the imported
//! graph: inputs/outputs with symbolic shapes, every node with its op and output types),
//! `kernels.json` (the optimised kernel graph, same layout) and the summary. No timestamps and
//! sorted maps, so they diff cleanly between versions.

use crate::ir::dim::fmt_shape;
use crate::ir::{Dim, Graph, ValueId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Version of the graph.json layout; bump it when fields change meaning.
const GRAPH_JSON_VERSION: u32 = 1;

#[derive(Serialize)]
pub struct GraphJson {
    format_version: u32,
    model: String,
    ir_version: i64,
    producer: String,
    graph_name: String,
    opsets: BTreeMap<String, i64>,
    inputs: Vec<ValueJson>,
    outputs: Vec<ValueJson>,
    constants: ConstantsJson,
    op_histogram: BTreeMap<String, usize>,
    nodes: Vec<NodeJson>,
}

#[derive(Serialize)]
struct ValueJson {
    name: String,
    dtype: String,
    shape: Vec<Dim>,
}

#[derive(Serialize)]
struct ConstantsJson {
    count: usize,
    elements: usize,
    bytes: usize,
}

#[derive(Serialize)]
struct NodeJson {
    name: String,
    op: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    domain: String,
    /// Input value names; "" marks an omitted optional input.
    inputs: Vec<String>,
    outputs: Vec<ValueJson>,
}

fn value_json(g: &Graph, id: ValueId) -> ValueJson {
    let v = g.value(id);
    match &v.ty {
        Some(ty) => ValueJson { name: v.name.clone(), dtype: ty.dtype.name().to_string(), shape: ty.shape.clone() },
        // Only reachable for graphs that skipped inference; say so instead of guessing.
        None => ValueJson { name: v.name.clone(), dtype: "unknown".to_string(), shape: Vec::new() },
    }
}

pub fn graph_json(g: &Graph) -> GraphJson {
    let consts = g.used_constants();
    let (elements, bytes) = consts.iter().fold((0, 0), |(n, b), &c| match &g.value(c).konst {
        Some(t) => (n + t.len(), b + t.size_bytes()),
        None => (n, b),
    });
    GraphJson {
        format_version: GRAPH_JSON_VERSION,
        // The file name only, as in the generated sources: the path as typed (relative to where
        // compile ran, or absolute) would make equal models give different files.
        model: Path::new(&g.info.source)
            .file_name()
            .map_or_else(|| g.info.source.clone(), |n| n.to_string_lossy().into_owned()),
        ir_version: g.info.ir_version,
        producer: g.info.producer.clone(),
        graph_name: g.info.graph_name.clone(),
        opsets: g.info.opsets.clone(),
        inputs: g.inputs.iter().map(|&i| value_json(g, i)).collect(),
        outputs: g.outputs.iter().map(|&o| value_json(g, o)).collect(),
        constants: ConstantsJson { count: consts.len(), elements, bytes },
        op_histogram: g.op_histogram(),
        nodes: g
            .nodes
            .iter()
            .map(|n| NodeJson {
                name: n.name.clone(),
                op: n.op_type.clone(),
                domain: n.domain.clone(),
                inputs: n.inputs.iter().map(|i| i.map(|v| g.value(v).name.clone()).unwrap_or_default()).collect(),
                outputs: n.outputs.iter().map(|&o| value_json(g, o)).collect(),
            })
            .collect(),
    }
}

pub fn summary_text(j: &GraphJson) -> String {
    let mut s = String::new();
    let value = |v: &ValueJson| format!("{} {}{}", v.name, v.dtype, fmt_shape(&v.shape));
    let _ = writeln!(s, "model:     {}", j.model);
    let _ = writeln!(s, "producer:  {}", if j.producer.is_empty() { "-" } else { &j.producer });
    let opsets: Vec<String> =
        j.opsets.iter().map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d })).collect();
    let _ = writeln!(s, "opsets:    {}", opsets.join(", "));
    let _ = writeln!(s, "inputs:");
    for v in &j.inputs {
        let _ = writeln!(s, "  {}", value(v));
    }
    let _ = writeln!(s, "outputs:");
    for v in &j.outputs {
        let _ = writeln!(s, "  {}", value(v));
    }
    let _ = writeln!(
        s,
        "constants: {} tensors, {} elements, {}",
        j.constants.count,
        super::checks::fmt_count(j.constants.elements as u64),
        super::checks::fmt_bytes(j.constants.bytes as u64)
    );
    let _ = writeln!(s, "nodes:     {} after constant folding", j.nodes.len());
    for (op, n) in &j.op_histogram {
        let _ = writeln!(s, "  {op:<24} {n}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{DType, ValueType};

    #[test]
    fn graph_json_keeps_symbolic_dims() {
        let mut g = Graph::default();
        g.info.source = "m.onnx".into();
        let x = g.add_value("x".into(), Some(ValueType::new(DType::F32, vec![Dim::sym("N"), Dim::known(3)])));
        g.inputs.push(x);
        g.outputs.push(x);
        let j = graph_json(&g);
        let v = serde_json::to_value(&j).unwrap();
        assert_eq!(v["inputs"][0]["shape"], serde_json::json!(["N", 3]));
        assert_eq!(v["inputs"][0]["dtype"], "float32");
        assert_eq!(v["format_version"], 1);
        let text = summary_text(&j);
        assert!(text.contains("x float32[N,3]"), "{text}");
    }

    #[test]
    fn graph_json_names_the_model_file_not_the_path_typed() {
        let mut g = Graph::default();
        g.info.source = "/home/someone/models/../models/m.onnx".into();
        let j = graph_json(&g);
        assert_eq!(serde_json::to_value(&j).unwrap()["model"], "m.onnx");
        let text = summary_text(&j);
        assert!(text.starts_with("model:     m.onnx\n"), "{text}");
    }
}
