//! Validation: runs a model on the same inputs in several *engines* and compares every output
//! with the baseline engine's.
//!
//! The baseline is ONNX Runtime ([`ort`]); the other engines are the CPU reference executor
//! ([`crate::reference`]) and, given a build folder, the compiled GPU library ([`gpu`]). A [`Report`]
//! has one row per graph output and one column group per compared engine; it prints as a table
//! and serialises to JSON. Inputs come from [`inputs`], the comparison rule from [`compare`].

pub mod compare;
pub mod gpu;
pub mod inputs;
pub mod ort;
pub mod range;

use crate::error::{Error, Result};
use crate::ir::{DType, Graph, Tensor};
use compare::{fmt_num, Comparison, Status, Tolerance};
use inputs::{InputOptions, InputSource};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Something that runs a model: ONNX Runtime, the reference executor, the compiled GPU library.
pub trait Engine {
    /// Short column name: `ort`, `reference`, `gpu`.
    fn name(&self) -> &'static str;
    /// One line for reports (library and version, settings).
    fn describe(&self) -> String;
    /// Runs the model; returns the graph outputs by name.
    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>>;
    /// The bounds its outputs of `dtype` are held to, before `--rtol`/`--atol` overrides.
    fn default_tolerance(&self, dtype: DType) -> Tolerance {
        Tolerance::default_for(dtype)
    }
}

/// ONNX Runtime on the CPU, loading the model file itself (not our import of it).
pub struct OrtEngine {
    model: ort::OrtModel,
}

impl OrtEngine {
    pub fn load(path: &Path) -> Result<OrtEngine> {
        Ok(OrtEngine { model: ort::OrtModel::load(path)? })
    }
}

impl Engine for OrtEngine {
    fn name(&self) -> &'static str {
        "ort"
    }

    fn describe(&self) -> String {
        match ort::runtime() {
            Ok(rt) => {
                format!("ONNX Runtime {} (CPU, graph optimisations off) from {}", rt.version, rt.library.display())
            }
            Err(_) => "ONNX Runtime".to_string(),
        }
    }

    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        self.model.run(inputs)
    }
}

/// The CPU reference executor on the imported graph.
pub struct ReferenceEngine {
    graph: Graph,
}

impl ReferenceEngine {
    pub fn new(graph: Graph) -> ReferenceEngine {
        ReferenceEngine { graph }
    }
}

impl Engine for ReferenceEngine {
    fn name(&self) -> &'static str {
        "reference"
    }

    fn describe(&self) -> String {
        format!("onnx2ait CPU reference executor ({} nodes after folding)", self.graph.nodes.len())
    }

    fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let named: BTreeMap<String, Tensor> = inputs.iter().cloned().collect();
        crate::reference::run(&self.graph, &named)
    }
}

/// What to run and how strictly to compare.
#[derive(Clone, Debug, Default)]
pub struct Options {
    pub inputs: InputOptions,
    /// Overrides of the per-dtype default tolerance (float outputs only).
    pub rtol: Option<f64>,
    pub atol: Option<f64>,
    /// Override of the GPU engine's rtol alone (wins over `rtol` for that engine).
    pub gpu_rtol: Option<f64>,
    /// The build folder of the model (`onnx2ait MODEL -o OUT`): its library is a third engine.
    pub build: Option<PathBuf>,
    /// The batch dim's value for every engine (`--batch`).
    pub batch: Option<i64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct InputReport {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub source: InputSource,
}

#[derive(Clone, Debug, Serialize)]
pub struct EngineRun {
    pub name: String,
    pub description: String,
    pub seconds: f64,
}

/// One engine's result for one output.
#[derive(Clone, Debug, Serialize)]
pub struct EngineResult {
    pub engine: String,
    /// The engine it is compared with.
    pub baseline: String,
    /// Fraction of rows whose arg-max agrees, for `[N, classes]` float outputs; else null.
    pub top1_agree: Option<f64>,
    #[serde(flatten)]
    pub comparison: Comparison,
}

impl EngineResult {
    fn new(engine: &str, baseline: &str, comparison: Comparison) -> EngineResult {
        let top1_agree = comparison.top1.map(|t| t.agree as f64 / t.rows as f64);
        EngineResult { engine: engine.to_string(), baseline: baseline.to_string(), top1_agree, comparison }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct OutputReport {
    pub name: String,
    /// Of the baseline's tensor.
    pub dtype: String,
    pub shape: Vec<usize>,
    pub results: Vec<EngineResult>,
}

impl OutputReport {
    pub fn passed(&self) -> bool {
        self.results.iter().all(|r| r.comparison.passed())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub model: String,
    pub seed: u64,
    /// Values used for the symbolic dims of the inputs.
    pub dims: BTreeMap<String, i64>,
    pub inputs: Vec<InputReport>,
    /// The engine every other engine is compared with.
    pub baseline: String,
    pub engines: Vec<EngineRun>,
    pub outputs: Vec<OutputReport>,
    pub passed: bool,
    /// With a GPU build that failed: the largest magnitudes the optimised graph's float values
    /// reach on the same inputs (reference executor, float32), to tell float16 overflow apart
    /// from a wrong kernel. `None` when not checked.
    pub fp16_range: Option<range::RangeReport>,
    /// Diagnoses printed under the table (float16 overflow, or why it could not be checked).
    pub notes: Vec<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.passed
    }

    /// `(output, engine, reason)` for every failed comparison.
    pub fn failures(&self) -> Vec<(&str, &str, &str)> {
        let mut v = Vec::new();
        for o in &self.outputs {
            for r in &o.results {
                if !r.comparison.passed() {
                    v.push((o.name.as_str(), r.engine.as_str(), r.comparison.reason.as_str()));
                }
            }
        }
        v
    }

    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// Imports `model_path`, makes inputs, runs ONNX Runtime, the reference executor and (with
/// `options.build`) the compiled library, compares.
pub fn validate(model_path: &Path, options: &Options) -> Result<Report> {
    let graph = crate::onnx::load_model(model_path)?;
    // The GPU first: a missing library or GPU is reported before the slow engines run.
    let gpu = options.build.as_deref().map(gpu::GpuEngine::open).transpose()?;
    let mut input_options = options.inputs.clone();
    gpu::bind_dims(&graph, gpu.as_ref(), options.batch, &mut input_options.dims)?;
    let ort = OrtEngine::load(model_path)?;
    let inputs = inputs::make_inputs(&graph, &input_options)?;
    // Kept for the float16 range check, which runs only when the GPU fails.
    let diagnosis = gpu.as_ref().map(|_| (graph.clone(), inputs.tensors.clone()));
    let mut engines: Vec<Box<dyn Engine>> = vec![Box::new(ort), Box::new(ReferenceEngine::new(graph))];
    if let Some(g) = gpu {
        engines.push(Box::new(g));
    }
    let mut report = run_engines(&model_path.display().to_string(), inputs, engines, options)?;
    if let Some((graph, tensors)) = diagnosis {
        if report.failures().iter().any(|(_, engine, _)| *engine == gpu::ENGINE_NAME) {
            check_fp16_range(&mut report, &graph, &tensors);
        }
    }
    Ok(report)
}

/// Adds the float16 range check of the optimised graph (what the GPU code is generated from)
/// on `inputs` to a report whose GPU column failed. Best effort: the check is a diagnosis, so
/// when it cannot run the report says why instead of failing.
fn check_fp16_range(report: &mut Report, graph: &Graph, inputs: &[(String, Tensor)]) {
    let named: BTreeMap<String, Tensor> = inputs.iter().cloned().collect();
    match range::optimised_fp16_range(graph, &named) {
        Ok(r) => {
            if r.overflows() {
                report.notes.push(format!("float16 overflow: {}", r.summary()));
            }
            report.fp16_range = Some(r);
        }
        Err(e) => report.notes.push(format!("the float16 range check could not run: {e}")),
    }
}

/// An engine's bounds for `dtype` with the user's overrides (float outputs only).
fn engine_tolerance(engine: &dyn Engine, dtype: DType, options: &Options) -> Tolerance {
    let d = engine.default_tolerance(dtype);
    if !dtype.is_float() {
        return d;
    }
    let rtol = match options.gpu_rtol {
        Some(r) if engine.name() == gpu::ENGINE_NAME => Some(r),
        _ => options.rtol,
    };
    Tolerance { rtol: rtol.unwrap_or(d.rtol), atol: options.atol.unwrap_or(d.atol) }
}

/// Runs every engine on `inputs` and compares each with the first (the baseline).
pub fn run_engines(
    model: &str,
    inputs: inputs::Inputs,
    mut engines: Vec<Box<dyn Engine>>,
    options: &Options,
) -> Result<Report> {
    if engines.len() < 2 {
        return Err(Error::Other("validation needs a baseline engine and at least one engine to compare".into()));
    }
    let mut runs = Vec::with_capacity(engines.len());
    let mut results: Vec<Vec<(String, Tensor)>> = Vec::with_capacity(engines.len());
    for e in engines.iter_mut() {
        let start = Instant::now();
        let out = e.run(&inputs.tensors).map_err(|err| Error::Other(format!("{} failed: {err}", e.name())))?;
        runs.push(EngineRun {
            name: e.name().to_string(),
            description: e.describe(),
            seconds: start.elapsed().as_secs_f64(),
        });
        results.push(out);
    }
    let (baseline, others) = results.split_first().expect("at least two engines");
    let mut outputs = Vec::with_capacity(baseline.len());
    for (name, expected) in baseline {
        let mut per_engine = Vec::with_capacity(others.len());
        for ((run, out), engine) in runs[1..].iter().zip(others).zip(&engines[1..]) {
            let tol = engine_tolerance(engine.as_ref(), expected.dtype(), options);
            let comparison = match out.iter().find(|(n, _)| n == name) {
                Some((_, actual)) => compare::compare(actual, expected, tol),
                None => missing_output(&run.name, tol),
            };
            per_engine.push(EngineResult::new(&run.name, &runs[0].name, comparison));
        }
        outputs.push(OutputReport {
            name: name.clone(),
            dtype: expected.dtype().to_string(),
            shape: expected.shape().to_vec(),
            results: per_engine,
        });
    }
    // An engine output the baseline lacks means the two disagree about the model's interface.
    for ((run, out), engine) in runs[1..].iter().zip(others).zip(&engines[1..]) {
        for (name, t) in out {
            if !baseline.iter().any(|(n, _)| n == name) {
                let tol = engine_tolerance(engine.as_ref(), t.dtype(), options);
                let mut c = missing_output(&runs[0].name, tol);
                c.reason = format!("'{}' produced output '{name}' that {} does not have", run.name, runs[0].name);
                outputs.push(OutputReport {
                    name: name.clone(),
                    dtype: t.dtype().to_string(),
                    shape: t.shape().to_vec(),
                    results: vec![EngineResult::new(&run.name, &runs[0].name, c)],
                });
            }
        }
    }
    let input_reports = inputs
        .tensors
        .iter()
        .zip(&inputs.sources)
        .map(|((name, t), src)| InputReport {
            name: name.clone(),
            dtype: t.dtype().to_string(),
            shape: t.shape().to_vec(),
            source: src.clone(),
        })
        .collect();
    let passed = outputs.iter().all(OutputReport::passed);
    Ok(Report {
        model: model.to_string(),
        seed: options.inputs.seed,
        dims: inputs.dims,
        inputs: input_reports,
        baseline: runs[0].name.clone(),
        engines: runs,
        outputs,
        passed,
        fp16_range: None,
        notes: Vec::new(),
    })
}

fn missing_output(engine: &str, tol: Tolerance) -> Comparison {
    Comparison::failed(format!("'{engine}' did not produce this output"), tol)
}

/// Plain-text table with left-aligned columns.
pub(crate) fn render_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths.get(i).copied().unwrap_or(0)))
            .collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = line(header);
    out.push('\n');
    let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
    out.push_str(&"-".repeat(total));
    out.push('\n');
    for r in rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

fn fmt_dims(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(","))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "model: {}", self.model)?;
        let dims: Vec<String> = self.dims.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let dims = if dims.is_empty() { String::new() } else { format!(", dims {}", dims.join(" ")) };
        writeln!(f, "seed: {}{dims}", self.seed)?;
        for i in &self.inputs {
            let src = match &i.source {
                InputSource::Random => "random".to_string(),
                InputSource::File(p) => p.clone(),
            };
            writeln!(f, "input  {} {}{} ({src})", i.name, i.dtype, fmt_dims(&i.shape))?;
        }
        for e in &self.engines {
            let role = if e.name == self.baseline { " [baseline]" } else { "" };
            writeln!(f, "engine {}{role}: {} — {:.3} s", e.name, e.description, e.seconds)?;
        }
        writeln!(f)?;
        let compared: Vec<&str> =
            self.engines.iter().map(|e| e.name.as_str()).filter(|n| *n != self.baseline).collect();
        let mut header: Vec<String> = vec!["output".into(), "shape".into(), "dtype".into()];
        for e in &compared {
            let p = if compared.len() > 1 { format!("{e} ") } else { String::new() };
            for col in ["max_abs", "max_rel", "rel_to_max", "top1", "status"] {
                header.push(format!("{p}{col}"));
            }
        }
        let mut rows = Vec::new();
        for o in &self.outputs {
            let mut row = vec![o.name.clone(), fmt_dims(&o.shape), o.dtype.clone()];
            for e in &compared {
                match o.results.iter().find(|r| r.engine == *e) {
                    Some(r) => {
                        let c = &r.comparison;
                        row.push(fmt_num(c.max_abs));
                        row.push(fmt_num(c.max_rel));
                        row.push(fmt_num(c.rel_to_max));
                        row.push(c.top1.map(|t| format!("{}/{}", t.agree, t.rows)).unwrap_or_else(|| "-".into()));
                        row.push(match c.status {
                            Status::Pass => "pass".into(),
                            Status::Fail => "FAIL".into(),
                        });
                    }
                    None => row.extend(std::iter::repeat_n("-".to_string(), 5)),
                }
            }
            rows.push(row);
        }
        f.write_str(&render_table(&header, &rows))?;
        writeln!(f)?;
        let failures = self.failures();
        if failures.is_empty() {
            let tols: Vec<String> = tolerance_summary(self);
            write!(
                f,
                "PASS: {} output(s) within tolerance vs {} ({})",
                self.outputs.len(),
                self.baseline,
                tols.join("; ")
            )
        } else {
            writeln!(
                f,
                "FAIL: {} of {} output(s) out of tolerance vs {}:",
                failures.len(),
                self.outputs.len(),
                self.baseline
            )?;
            for (i, (out, eng, why)) in failures.iter().enumerate() {
                write!(f, "  - '{out}' ({eng}): {why}")?;
                if i + 1 < failures.len() {
                    writeln!(f)?;
                }
            }
            for note in &self.notes {
                write!(f, "\nnote: {note}")?;
            }
            Ok(())
        }
    }
}

/// Distinct tolerances used, as `float32: rtol 1e-4, atol 1e-5` (prefixed with the engine,
/// `gpu float32: …`, when several engines are compared).
fn tolerance_summary(r: &Report) -> Vec<String> {
    let several = r.engines.len() > 2;
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for o in &r.outputs {
        for res in &o.results {
            let t = res.comparison.tolerance;
            let s = if t.rtol == 0.0 && t.atol == 0.0 {
                "exact".to_string()
            } else {
                format!("rtol {}, atol {}", fmt_num(t.rtol), fmt_num(t.atol))
            };
            let key = if several { format!("{} {}", res.engine, o.dtype) } else { o.dtype.clone() };
            seen.entry(key).or_insert(s);
        }
    }
    seen.into_iter().map(|(d, s)| format!("{d}: {s}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine returning fixed outputs, to test the comparison plumbing without models.
    struct Fixed(&'static str, Vec<(String, Tensor)>);

    impl Engine for Fixed {
        fn name(&self) -> &'static str {
            self.0
        }
        fn describe(&self) -> String {
            format!("fixed outputs ({})", self.0)
        }
        fn run(&mut self, _: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
            Ok(self.1.clone())
        }
    }

    fn inputs() -> inputs::Inputs {
        inputs::Inputs {
            tensors: vec![("x".into(), Tensor::from_f32s(&[2], vec![1.0, 2.0]))],
            sources: vec![InputSource::Random],
            dims: BTreeMap::from([("N".to_string(), 2)]),
        }
    }

    #[test]
    fn report_rows_per_output_and_engine() {
        let base = vec![
            ("logits".to_string(), Tensor::from_f32s(&[1, 3], vec![0.1, 0.7, 0.2])),
            ("idx".to_string(), Tensor::from_i64s(&[1], vec![1])),
        ];
        let mut off = base.clone();
        off[1].1 = Tensor::from_i64s(&[1], vec![2]);
        let engines: Vec<Box<dyn Engine>> = vec![
            Box::new(Fixed("ort", base.clone())),
            Box::new(Fixed("reference", base.clone())),
            Box::new(Fixed("gpu", off)),
        ];
        let r = run_engines("m.onnx", inputs(), engines, &Options::default()).unwrap();
        assert_eq!(r.outputs.len(), 2);
        assert_eq!(r.outputs[0].results.len(), 2);
        assert!(!r.passed());
        assert_eq!(r.failures().len(), 1);
        assert_eq!(r.failures()[0].0, "idx");
        assert_eq!(r.failures()[0].1, "gpu");
        let text = r.to_string();
        assert!(text.contains("reference max_abs") && text.contains("gpu status"), "{text}");
        assert!(text.contains("FAIL: 1 of 2 output(s)"), "{text}");
        assert!(text.contains("1/1"), "top-1 column: {text}");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["outputs"][1]["results"][1]["status"], "fail");
        assert_eq!(json["outputs"][0]["results"][0]["engine"], "reference");
        assert_eq!(json["baseline"], "ort");
        assert_eq!(json["dims"]["N"], 2);
    }

    #[test]
    fn missing_and_extra_outputs_fail() {
        let base = vec![("y".to_string(), Tensor::from_f32s(&[1], vec![1.0]))];
        let other = vec![("z".to_string(), Tensor::from_f32s(&[1], vec![1.0]))];
        let engines: Vec<Box<dyn Engine>> = vec![Box::new(Fixed("ort", base)), Box::new(Fixed("reference", other))];
        let r = run_engines("m.onnx", inputs(), engines, &Options::default()).unwrap();
        let f = r.failures();
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].2.contains("did not produce"), "{f:?}");
        assert!(f[1].2.contains("does not have"), "{f:?}");
    }

    /// A GPU column that failed because the values leave float16's range gets a note naming
    /// the first value past 65504 (x·300·400 on inputs up to 2: 2.4e5).
    #[test]
    fn gpu_failure_notes_float16_overflow() {
        use crate::ir::infer::infer_graph;
        use crate::ir::ops::testutil::GraphBuilder;
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "2");
        let c1 = b.konst("c1", Tensor::from_f32s(&[], vec![300.0]));
        let c2 = b.konst("c2", Tensor::from_f32s(&[], vec![400.0]));
        let y = b.node("Mul", vec![], &[x, c1], 1)[0];
        let y = b.node("Mul", vec![], &[y, c2], 1)[0];
        b.g.outputs.push(y);
        b.g.values[y].name = "y".into();
        infer_graph(&mut b.g).unwrap();
        let want = vec![("y".to_string(), Tensor::from_f32s(&[2], vec![120000.0, 240000.0]))];
        let inf = vec![("y".to_string(), Tensor::from_f32s(&[2], vec![f32::INFINITY, f32::INFINITY]))];
        let engines: Vec<Box<dyn Engine>> = vec![Box::new(Fixed("ort", want)), Box::new(Fixed("gpu", inf))];
        let ins = inputs();
        let tensors = ins.tensors.clone();
        let mut r = run_engines("m.onnx", ins, engines, &Options::default()).unwrap();
        assert!(!r.passed());
        check_fp16_range(&mut r, &b.g, &tensors);
        let range = r.fp16_range.as_ref().expect("checked");
        assert_eq!(range.over.first().map(|v| v.max_abs), Some(240000.0));
        let text = r.to_string();
        assert!(text.contains("note: float16 overflow: 1 of 4 float values exceed"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["fp16_range"]["over"][0]["max_abs"], 240000.0);
    }

    #[test]
    fn passing_report_names_tolerances() {
        let base = vec![("y".to_string(), Tensor::from_f32s(&[2], vec![1.0, 2.0]))];
        let engines: Vec<Box<dyn Engine>> =
            vec![Box::new(Fixed("ort", base.clone())), Box::new(Fixed("reference", base))];
        let r = run_engines("m.onnx", inputs(), engines, &Options { rtol: Some(1e-3), ..Default::default() }).unwrap();
        assert!(r.passed());
        let text = r.to_string();
        assert!(text.contains("PASS: 1 output(s)") && text.contains("rtol 1.00e-3"), "{text}");
    }

    /// `gpu_rtol` loosens the GPU column alone: a 2% error passes there, the same error in the
    /// reference column still fails against its default fp32 bound.
    #[test]
    fn gpu_rtol_overrides_the_gpu_engine_only() {
        let base = vec![("y".to_string(), Tensor::from_f32s(&[2], vec![1.0, 2.0]))];
        let off = vec![("y".to_string(), Tensor::from_f32s(&[2], vec![1.0, 2.04]))];
        let engines = || -> Vec<Box<dyn Engine>> {
            vec![
                Box::new(Fixed("ort", base.clone())),
                Box::new(Fixed("reference", off.clone())),
                Box::new(Fixed("gpu", off.clone())),
            ]
        };
        let strict = run_engines("m.onnx", inputs(), engines(), &Options::default()).unwrap();
        let engines_failing = |r: &Report| r.failures().iter().map(|f| f.1.to_string()).collect::<Vec<_>>();
        assert_eq!(engines_failing(&strict), vec!["reference", "gpu"]);
        let loose = Options { gpu_rtol: Some(3e-2), ..Default::default() };
        let r = run_engines("m.onnx", inputs(), engines(), &loose).unwrap();
        assert_eq!(engines_failing(&r), vec!["reference"]);
    }
}
