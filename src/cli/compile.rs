//! `onnx2ait [compile] MODEL -o OUT`: import, infer, and write the analysed graph.
//!
//! Code generation does not exist yet, so the command stops after analysis and says so. What it
//! writes is stable (no timestamps, sorted maps) so it can be diffed between versions:
//! `OUT/graph.json` (inputs/outputs with symbolic shapes, every node with its op and output
//! types, constants) and `OUT/summary.txt` (the same, for people).

use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::egraph::{optimize, OptimizeOptions};
use onnx2ait::ir::dim::fmt_shape;
use onnx2ait::ir::{Dim, Graph, ValueId};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct CompileArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Output directory (created if missing).
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: PathBuf,
}

/// Version of the graph.json layout; bump it when fields change meaning.
const GRAPH_JSON_VERSION: u32 = 1;

#[derive(Serialize)]
struct GraphJson {
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

fn graph_json(g: &Graph) -> GraphJson {
    let consts = g.used_constants();
    let (elements, bytes) = consts.iter().fold((0, 0), |(n, b), &c| match &g.value(c).konst {
        Some(t) => (n + t.len(), b + t.size_bytes()),
        None => (n, b),
    });
    GraphJson {
        format_version: GRAPH_JSON_VERSION,
        model: g.info.source.clone(),
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

fn summary_text(j: &GraphJson) -> String {
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
        super::inspect::fmt_count(j.constants.elements as u64),
        super::inspect::fmt_bytes(j.constants.bytes as u64)
    );
    let _ = writeln!(s, "nodes:     {} after constant folding", j.nodes.len());
    for (op, n) in &j.op_histogram {
        let _ = writeln!(s, "  {op:<24} {n}");
    }
    let _ = writeln!(
        s,
        "codegen:   not built yet (CUDA code generation is a later stage; this run imports and analyses only)"
    );
    s
}

pub fn run(a: &CompileArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let g = onnx2ait::onnx::load_model(&a.model.model)?;
    let j = graph_json(&g);
    // The optimised kernel graph is what code generation will consume; it is written now so its
    // changes can be reviewed as diffs. No timings go into OUT: the same model gives the same files.
    let (optimised, report) = optimize(&g, &OptimizeOptions::standard()?)?;
    let k = graph_json(&optimised);
    let to_json = |v: &GraphJson, file: &str| {
        serde_json::to_string_pretty(v).map_err(|e| Failure::new(1, format!("cannot serialise {file}: {e}")))
    };
    let (json, kernels_json) = (to_json(&j, "graph.json")?, to_json(&k, "kernels.json")?);
    let mut summary = summary_text(&j);
    let kernels: Vec<String> = report.kernels_after.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
    let _ = writeln!(
        summary,
        "optimised: {} ONNX nodes -> {} kernels ({})",
        g.nodes.len(),
        optimised.nodes.len(),
        kernels.join(", ")
    );
    std::fs::create_dir_all(&a.out)
        .map_err(|e| Failure::new(1, format!("{}: cannot create directory: {e}", a.out.display())))?;
    let files = [
        ("graph.json", format!("{json}\n")),
        ("kernels.json", format!("{kernels_json}\n")),
        ("summary.txt", summary.clone()),
    ];
    for (file, text) in &files {
        let p = a.out.join(file);
        std::fs::write(&p, text).map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", p.display())))?;
    }
    super::emit(&format!(
        "{summary}\nwrote {}, {} and {}\nnote: code generation is not implemented yet, so no CUDA library was produced; the model imports, its shapes infer and it optimises into the kernels above.\n",
        a.out.join("graph.json").display(),
        a.out.join("kernels.json").display(),
        a.out.join("summary.txt").display()
    ));
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onnx2ait::ir::{DType, ValueType};

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
        assert!(text.contains("x float32[N,3]") && text.contains("not built yet"), "{text}");
    }
}
