//! `onnx2ait [compile] MODEL -o OUT`: import, optimise, lower, generate the CUDA sources and build
//! `OUT/libmodel.so`.
//!
//! Besides the sources (see `onnx2ait::codegen`), OUT gets `graph.json` (the imported graph:
//! inputs/outputs with symbolic shapes, every node with its op and output types), `kernels.json`
//! (the optimised kernel graph) and `summary.txt` (both, for people). All of these are stable (no
//! timestamps, sorted maps) so they can be diffed between versions; only `build_report.json`
//! (timings) changes from build to build. Without nvcc the sources are still written and the
//! error says what to install.

use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::build::nvcc::{Arch, Nvcc};
use onnx2ait::build::BuildOptions;
use onnx2ait::egraph::{optimize, OptimizeOptions};
use onnx2ait::ir::dim::fmt_shape;
use onnx2ait::ir::{Dim, Graph, ValueId};
use onnx2ait::lower::LowerOptions;
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
    /// GPU architecture: sm_80 (A100), sm_90 (H100/H200), sm_90a (Hopper-only kernels).
    #[arg(long, default_value = "sm_90")]
    pub arch: String,
    /// Largest run-time batch (when the model's batch dim is symbolic); sizes the activation arena.
    #[arg(long = "max-batch", default_value_t = 64)]
    pub max_batch: i64,
    /// Fixes a symbolic dim at compile time (repeatable): --dim seq=128.
    #[arg(long = "dim", value_name = "NAME=N", value_parser = super::validate::parse_dim)]
    pub dims: Vec<(String, i64)>,
    /// Write the sources only; do not run nvcc.
    #[arg(long = "no-build")]
    pub no_build: bool,
    /// Parallel nvcc jobs (default: cores, limited by available memory).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Object cache shared between builds (default: OUT/obj; env ONNX2AIT_CACHE_DIR).
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
}

impl CompileArgs {
    /// The defaults of `onnx2ait MODEL -o OUT`.
    pub fn new(model: ModelArg, out: PathBuf) -> CompileArgs {
        CompileArgs {
            model,
            out,
            arch: "sm_90".into(),
            max_batch: 64,
            dims: Vec::new(),
            no_build: false,
            jobs: None,
            cache_dir: None,
        }
    }
}

/// The library every build produces.
const LIB_NAME: &str = "libmodel.so";

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
    s
}

pub fn run(a: &CompileArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let g = onnx2ait::onnx::load_model(&a.model.model)?;
    let j = graph_json(&g);
    // The optimised kernel graph is written beside the sources so its changes can be reviewed as
    // diffs. No timings go into these files: the same model gives the same bytes.
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

    let arch: Arch = a.arch.parse()?;
    let lower_opts = LowerOptions { dims: a.dims.iter().cloned().collect(), max_batch: a.max_batch };
    let generated = onnx2ait::codegen::generate_cuda(&optimised, &lower_opts, arch, &a.out)?;
    let _ = writeln!(summary, "{}", generated.summary());

    let files = [
        ("graph.json", format!("{json}\n")),
        ("kernels.json", format!("{kernels_json}\n")),
        ("summary.txt", summary.clone()),
    ];
    for (file, text) in &files {
        let p = a.out.join(file);
        std::fs::write(&p, text).map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", p.display())))?;
    }
    super::emit(&format!("{summary}wrote the sources to {}\n", a.out.display()));
    if a.no_build {
        return Ok(0);
    }
    let compiler = Nvcc::discover(arch).map_err(|e| {
        Failure::new(
            1,
            format!(
                "the CUDA sources are in {} but no library was built: {e}\n(run with --no-build to write sources only)",
                a.out.display()
            ),
        )
    })?;
    let cache_dir = a.cache_dir.clone().or_else(|| std::env::var_os("ONNX2AIT_CACHE_DIR").map(PathBuf::from));
    let opts = BuildOptions { jobs: a.jobs, cache_dir, progress: true };
    let built =
        onnx2ait::build::build(&a.out, &generated.files.sources, &generated.files.headers, &compiler, &opts, LIB_NAME)?;
    let report_json = serde_json::to_string_pretty(&built).map_err(|e| Failure::new(1, e.to_string()))? + "\n";
    let rp = a.out.join("build_report.json");
    std::fs::write(&rp, report_json).map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", rp.display())))?;
    // build() has printed its summary line (progress is on).
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
        assert!(text.contains("x float32[N,3]"), "{text}");
    }
}
