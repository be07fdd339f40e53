//! `onnx2ait inspect MODEL [--json]`: what a model is and whether onnx2ait can take it.
//!
//! Everything that can be read from the file is printed even when the import fails: the
//! header, opsets, declared inputs/outputs, op histogram, parameters, and every unsupported op
//! with its nodes. When the graph imports, inputs/outputs show the inferred (symbolic) types.
//! Exit 2 when any op is unsupported, 1 when the import fails otherwise.

use super::{Failure, ModelArg, EXIT_UNSUPPORTED};
use clap::Args;
pub use onnx2ait::compile::checks::{fmt_bytes, fmt_count};
use onnx2ait::error::UnsupportedOp;
use onnx2ait::ir::dim::fmt_shape;
use onnx2ait::ir::{DType, Dim, Graph};
use onnx2ait::onnx::proto::{tensor_shape_proto, type_proto, GraphProto, TensorProto, ValueInfoProto};
use onnx2ait::onnx::ModelFile;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct ValueInfo {
    name: String,
    dtype: String,
    shape: Vec<Dim>,
}

#[derive(Serialize, Default)]
struct Parameters {
    /// Initializers plus tensors held by `Constant` nodes.
    tensors: usize,
    elements: u64,
    bytes: u64,
}

#[derive(Serialize)]
struct Inspection {
    model: String,
    ir_version: i64,
    producer: String,
    graph_name: String,
    opsets: BTreeMap<String, i64>,
    /// "inferred" when the graph imported, else "declared" (as written in the file).
    shapes: &'static str,
    inputs: Vec<ValueInfo>,
    outputs: Vec<ValueInfo>,
    nodes: usize,
    /// Nodes left after constant folding, when the graph imported.
    nodes_after_folding: Option<usize>,
    op_histogram: BTreeMap<String, usize>,
    parameters: Parameters,
    unsupported: Vec<UnsupportedOp>,
    /// Why the import failed, when it did for reasons other than unsupported ops.
    import_error: Option<String>,
    /// Problems the import tolerated (e.g. `value_info` that disagrees with inference).
    warnings: Vec<String>,
}

pub fn run(a: &InspectArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let mf = ModelFile::open(&a.model.model)?;
    let gp = mf.proto.graph.clone().unwrap_or_default();
    let unsupported = mf.unsupported_ops();
    // With unsupported ops the import cannot succeed; the list above already says why.
    let imported: Option<Result<Graph, onnx2ait::Error>> =
        if unsupported.is_empty() { Some(mf.to_graph()) } else { None };
    let (shapes, inputs, outputs, nodes_after_folding, import_error) = match &imported {
        Some(Ok(g)) => {
            let vi = |id: usize| {
                let v = g.value(id);
                match &v.ty {
                    Some(t) => ValueInfo { name: v.name.clone(), dtype: t.dtype.name().into(), shape: t.shape.clone() },
                    None => ValueInfo { name: v.name.clone(), dtype: "unknown".into(), shape: Vec::new() },
                }
            };
            (
                "inferred",
                g.inputs.iter().map(|&i| vi(i)).collect(),
                g.outputs.iter().map(|&o| vi(o)).collect(),
                Some(g.nodes.len()),
                None,
            )
        }
        other => {
            let err = match other {
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            };
            ("declared", declared_inputs(&gp), gp.output.iter().map(declared).collect(), None, err)
        }
    };
    let report = Inspection {
        model: mf.source(),
        ir_version: mf.proto.ir_version.unwrap_or(0),
        producer: format!(
            "{} {}",
            mf.proto.producer_name.as_deref().unwrap_or(""),
            mf.proto.producer_version.as_deref().unwrap_or("")
        )
        .trim()
        .to_string(),
        graph_name: gp.name.clone().unwrap_or_default(),
        opsets: mf.opsets(),
        shapes,
        inputs,
        outputs,
        nodes: gp.node.len(),
        nodes_after_folding,
        op_histogram: op_histogram(&gp),
        parameters: parameters(&gp),
        unsupported,
        import_error,
        warnings: match &imported {
            Some(Ok(g)) => g.info.warnings.clone(),
            // Without an imported graph, the warnings read from the file alone.
            _ => onnx2ait::onnx::opset_warning(&mf.opsets()).into_iter().collect(),
        },
    };
    if a.json {
        let s = serde_json::to_string_pretty(&report)
            .map_err(|e| Failure::new(1, format!("cannot serialise the report: {e}")))?;
        super::emit(&format!("{s}\n"));
    } else {
        super::emit(&render(&report));
    }
    if !report.unsupported.is_empty() {
        let n: usize = report.unsupported.iter().map(|u| u.nodes.len()).sum();
        return Err(Failure::new(
            EXIT_UNSUPPORTED,
            format!(
                "{}: {} unsupported op type(s) in {n} node(s) (listed above)",
                report.model,
                report.unsupported.len()
            ),
        ));
    }
    if let Some(e) = report.import_error {
        return Err(Failure::new(1, format!("the model does not import:\n{e}")));
    }
    Ok(0)
}

/// Graph inputs as declared, without the initializers old models also list as inputs.
fn declared_inputs(gp: &GraphProto) -> Vec<ValueInfo> {
    let inits: std::collections::BTreeSet<&str> = gp.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    gp.input.iter().filter(|v| !inits.contains(v.name.as_deref().unwrap_or(""))).map(declared).collect()
}

/// A value's type as written in the file; unnamed unknown dims show as `?`.
fn declared(v: &ValueInfoProto) -> ValueInfo {
    let name = v.name.clone().unwrap_or_default();
    match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::TensorType(t)) => {
            let code = t.elem_type.unwrap_or(0);
            let dtype = DType::onnx_code_name(code).to_lowercase();
            let shape = t
                .shape
                .as_ref()
                .map(|s| {
                    s.dim
                        .iter()
                        .map(|d| match &d.value {
                            Some(tensor_shape_proto::dimension::Value::DimValue(v)) => Dim::known(*v),
                            Some(tensor_shape_proto::dimension::Value::DimParam(p)) if !p.is_empty() => {
                                Dim::sym(p.clone())
                            }
                            _ => Dim::sym("?"),
                        })
                        .collect()
                })
                .unwrap_or_default();
            ValueInfo { name, dtype, shape }
        }
        Some(_) => ValueInfo { name, dtype: "non-tensor".into(), shape: Vec::new() },
        None => ValueInfo { name, dtype: "untyped".into(), shape: Vec::new() },
    }
}

fn op_histogram(gp: &GraphProto) -> BTreeMap<String, usize> {
    let mut h = BTreeMap::new();
    for n in &gp.node {
        let op = n.op_type.clone().unwrap_or_default();
        let domain = onnx2ait::ir::ops::normalize_domain(n.domain.as_deref().unwrap_or(""));
        let key = if domain.is_empty() { op } else { format!("{domain}::{op}") };
        *h.entry(key).or_insert(0) += 1;
    }
    h
}

fn parameters(gp: &GraphProto) -> Parameters {
    let mut p = Parameters::default();
    let mut add = |t: &TensorProto| {
        let elements: u64 = t.dims.iter().map(|&d| d.max(0) as u64).product();
        p.tensors += 1;
        p.elements += elements;
        p.bytes += elements * element_bytes(t.data_type.unwrap_or(0));
    };
    gp.initializer.iter().for_each(&mut add);
    for n in &gp.node {
        if n.op_type.as_deref() == Some("Constant")
            && onnx2ait::ir::ops::normalize_domain(n.domain.as_deref().unwrap_or("")).is_empty()
        {
            n.attribute.iter().filter_map(|a| a.t.as_ref()).for_each(&mut add);
        }
    }
    p
}

/// Storage size of an ONNX element type (strings, whose size varies, count as 0).
fn element_bytes(code: i32) -> u64 {
    match DType::from_onnx(code) {
        Some(d) => d.size_bytes() as u64,
        None => match code {
            14 => 8,      // complex64
            15 => 16,     // complex128
            17..=20 => 1, // float8 variants
            _ => 0,       // string, 4-bit types (packed, under a byte), unknown
        },
    }
}

fn render(r: &Inspection) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "model:       {}", r.model);
    let _ = writeln!(s, "ir_version:  {}", r.ir_version);
    let _ = writeln!(s, "producer:    {}", if r.producer.is_empty() { "-" } else { &r.producer });
    let _ = writeln!(s, "graph:       {}", if r.graph_name.is_empty() { "-" } else { &r.graph_name });
    let opsets: Vec<String> =
        r.opsets.iter().map(|(d, v)| format!("{}={v}", if d.is_empty() { "ai.onnx" } else { d })).collect();
    let _ = writeln!(s, "opsets:      {}", opsets.join(", "));
    let _ = writeln!(s, "inputs ({}):", r.shapes);
    for v in &r.inputs {
        let _ = writeln!(s, "  {} {}{}", v.name, v.dtype, fmt_shape(&v.shape));
    }
    let _ = writeln!(s, "outputs ({}):", r.shapes);
    for v in &r.outputs {
        let _ = writeln!(s, "  {} {}{}", v.name, v.dtype, fmt_shape(&v.shape));
    }
    let _ = writeln!(
        s,
        "parameters:  {} in {} tensor(s), {}",
        fmt_count(r.parameters.elements),
        r.parameters.tensors,
        fmt_bytes(r.parameters.bytes)
    );
    let folded = r.nodes_after_folding.map(|n| format!(" ({n} after constant folding)")).unwrap_or_default();
    let _ = writeln!(s, "nodes:       {}{folded}", r.nodes);
    let _ = writeln!(s, "op histogram:");
    let width = r.op_histogram.keys().map(|k| k.len()).max().unwrap_or(0);
    for (op, n) in &r.op_histogram {
        let _ = writeln!(s, "  {op:<width$}  {n}");
    }
    if r.unsupported.is_empty() {
        let _ = writeln!(s, "unsupported: none");
    } else {
        let _ = writeln!(s, "unsupported: {} op type(s)", r.unsupported.len());
        for u in &r.unsupported {
            let op = if u.domain.is_empty() { u.op_type.clone() } else { format!("{}::{}", u.domain, u.op_type) };
            let _ = writeln!(s, "  {op} ({} node(s)): {}", u.nodes.len(), u.nodes.join(", "));
        }
    }
    let status = match (&r.import_error, r.unsupported.is_empty()) {
        (_, false) => "not attempted (unsupported ops)".to_string(),
        (Some(_), true) => "FAILED (see the error below)".to_string(),
        (None, true) => "ok".to_string(),
    };
    let _ = writeln!(s, "import:      {status}");
    for w in &r.warnings {
        let _ = writeln!(s, "warning:     {w}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_formatting() {
        assert_eq!(fmt_count(25557032), "25,557,032");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(102_228_128), "97.5 MiB");
    }
}
