//! `onnx2ait [compile] MODEL -o OUT`: import, optimise, lower, generate the CUDA sources and build
//! `OUT/libmodel.so`.
//!
//! Besides the sources (see `onnx2ait::codegen`), OUT gets `graph.json` (the imported graph:
//! inputs/outputs with symbolic shapes, every node with its op and output types), `kernels.json`
//! (the optimised kernel graph) and `summary.txt` (both, for people). All of these are stable (no
//! timestamps, sorted maps) so they can be diffed between versions; only `build_report.json`
//! (timings) changes from build to build. Without nvcc the sources are still written and the
//! error says what to install.
//!
//! OUT is rendered and built in a staging folder and swapped into place
//! (`onnx2ait::codegen::outdir`): files onnx2ait did not write are never touched, a folder it did
//! not write is refused unless `--force`, and a library only ever sits beside its own sources
//! and weights.

use super::checks::Bound;
use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::build::nvcc::{Arch, Nvcc};
use onnx2ait::build::BuildOptions;
use onnx2ait::codegen::outdir::Staging;
use onnx2ait::egraph::{optimize, OptimizeOptions};
use onnx2ait::ir::dim::fmt_shape;
use onnx2ait::ir::{DType, Dim, Graph, ValueId};
use onnx2ait::lower::cuda::CudaTarget;
use onnx2ait::lower::{LowerOptions, Precision};
use onnx2ait::profile::cache::ProfileCache;
use onnx2ait::profile::ProfileOptions;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct CompileArgs {
    // The model is a field here, not a flattened `ModelArg`: clap leaves the argument group of
    // a struct with a nested flatten empty, and `onnx2ait MODEL -o OUT [OPTIONS]` (an
    // `Option<CompileArgs>` flattened into the top level) needs that group to see the options.
    /// The .onnx model file.
    #[arg(value_name = "MODEL")]
    pub model: PathBuf,
    /// Output directory (created if missing). A non-empty folder that onnx2ait did not write is
    /// refused unless --force.
    #[arg(short = 'o', long = "out", value_name = "OUT")]
    pub out: PathBuf,
    /// Write into a non-empty OUT that onnx2ait did not write: files of the names onnx2ait writes
    /// are replaced, every other file is left alone.
    #[arg(long)]
    pub force: bool,
    /// GPU architecture: sm_80 (A100), sm_90 (H100/H200 with the sm80-style kernels only),
    /// sm_90a (H100/H200 with the Hopper TMA + wgmma kernels too).
    #[arg(long, default_value = "sm_90a")]
    pub arch: String,
    /// Largest run-time batch (when the model's batch dim is symbolic); sizes the activation arena.
    #[arg(long = "max-batch", default_value_t = 64, value_parser = super::validate::parse_batch)]
    pub max_batch: i64,
    /// GPU memory the library may take (arena, workspace and weights at --max-batch), e.g. 40GiB;
    /// more is an error at compile time. Default: the largest GPU of --arch (sm_80: A100 80GB,
    /// 80 GiB; sm_90/sm_90a: H200, 141 GB).
    #[arg(long = "max-memory", value_name = "SIZE", value_parser = super::checks::parse_size)]
    pub max_memory: Option<u64>,
    /// Fixes a symbolic dim at compile time (repeatable): --dim seq=128.
    #[arg(long = "dim", value_name = "NAME=N", value_parser = super::validate::parse_dim)]
    pub dims: Vec<(String, i64)>,
    /// Write the sources only; do not run nvcc.
    #[arg(long = "no-build")]
    pub no_build: bool,
    /// Parallel nvcc jobs (default: cores, limited by available memory).
    #[arg(long, value_parser = super::parse_jobs)]
    pub jobs: Option<usize>,
    /// Object cache shared between builds (default: OUT/obj; env ONNX2AIT_CACHE_DIR).
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Profile the model's kernels on this machine's GPU first (`onnx2ait profile`), then compile
    /// with the measured times.
    #[arg(long)]
    pub profile: bool,
    /// Profile cache to choose kernel instances from (default: $ONNX2AIT_PROFILE_CACHE or
    /// ~/.cache/onnx2ait/profile.json, when it exists). Without times the heuristic chooses.
    #[arg(long = "profile-cache", value_name = "FILE")]
    pub profile_cache: Option<PathBuf>,
    /// The GPU whose times to use when the profile cache has several (as `profile` names it).
    #[arg(long = "profile-gpu", value_name = "NAME")]
    pub profile_gpu: Option<String>,
    /// Ignore the profile cache: the documented heuristic chooses every instance.
    #[arg(long = "no-profile", conflicts_with = "profile")]
    pub no_profile: bool,
    /// With profiled times, nodes share library instances where that keeps the modelled time of
    /// every batch range's library kernels within PCT% of the fastest choice: fewer instances, a
    /// shorter build (an sm90 instance is about a minute of nvcc). 0 takes the fastest everywhere.
    #[arg(long = "reuse-within", value_name = "PCT", default_value_t = 1.0, value_parser = parse_percent)]
    pub reuse_within: f64,
    /// Storage type of float activations and weights on the GPU: fp16 (tensor-core CUTLASS
    /// kernels) or fp32 (for models whose values exceed fp16's range of ±65504; convolutions and
    /// matrix products then run on the slower direct/generic kernels).
    #[arg(long, default_value = "fp16", value_name = "fp16|fp32")]
    pub precision: Precision,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a percentage from 0 to 100")),
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
    ModelArg { model: a.model.clone() }.check()?;
    let arch: Arch = a.arch.parse()?;
    let g = super::checks::load_model(&a.model)?;
    let j = graph_json(&g);
    let dims = super::checks::check_dims(&g, &a.dims)?;
    let bound = memory_bound(a, arch);
    check_batch_sizes(&g, &dims, a.max_batch, a.precision, &bound)?;
    let lower_opts = LowerOptions { dims, max_batch: a.max_batch, precision: a.precision };
    let cache_dir = a.cache_dir.clone().or_else(|| std::env::var_os("ONNX2AIT_CACHE_DIR").map(PathBuf::from));
    let (optimised, report) = optimize(&g, &OptimizeOptions::standard()?)?;
    let (target, choice) = kernel_choice(a, arch, &g, &lower_opts, cache_dir.clone())?;
    // With profiled times, extraction prices convs and gemms by them (at the largest batch, the
    // range that dominates throughput), so fusion and layout choices follow measurements.
    let (optimised, report) = if target.has_measurements() {
        onnx2ait::profile::cost::optimize_measured(
            &g,
            &OptimizeOptions::standard()?,
            &target,
            a.max_batch,
            &lower_opts.dims,
        )?
    } else {
        (optimised, report)
    };
    // The optimised kernel graph is written beside the sources so its changes can be reviewed as
    // diffs. No timings go into these files: the same model, options and profile cache give the
    // same bytes.
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
    let (target, sharing) = onnx2ait::lower::sharing::share(target, &optimised, &lower_opts, a.reuse_within / 100.0)?;
    // Everything is written into a staging folder next to OUT and swapped in at the end; until
    // then OUT keeps the previous output, and an error drops the staging folder.
    let stage = Staging::begin(&a.out, a.force)?;
    let generated = onnx2ait::codegen::generate_cuda_with(&optimised, &lower_opts, &target, stage.dir())?;
    check_device_memory(&generated.program.memory, a.max_batch, &bound)?;
    let hash = generated.files.build_hash.clone();
    let _ = writeln!(summary, "{}", generated.summary());
    let _ = writeln!(summary, "{}", choice_summary(&generated.program, &choice));
    if let Some(plan) = sharing {
        let by_batch: Vec<String> =
            plan.slowdown_by_batch.iter().map(|(b, r)| format!("+{:.2}% at batch {b}", (r - 1.0) * 100.0)).collect();
        let _ = writeln!(
            summary,
            "sharing:   {} instances serve the measured choices, the fastest-each choice needs {} (--reuse-within {}%: modelled library time {}; no choice more than {:.1}% slower than its fastest)",
            plan.instances.len(),
            plan.unshared,
            a.reuse_within,
            by_batch.join(", "),
            (plan.worst_slowdown - 1.0) * 100.0
        );
    }

    let files = [
        ("graph.json", format!("{json}\n")),
        ("kernels.json", format!("{kernels_json}\n")),
        ("summary.txt", summary.clone()),
    ];
    for (file, text) in &files {
        let p = stage.dir().join(file);
        std::fs::write(&p, text).map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", p.display())))?;
    }
    super::emit(&summary);
    let wrote = |what: &str| super::emit(&format!("wrote {what} to {}\n", a.out.display()));
    if a.no_build {
        // build.log says why there is no library (`onnx2ait run`/`validate --build` read it).
        let log = stage.dir().join(onnx2ait::build::LOG_NAME);
        std::fs::write(&log, format!("{}\n", onnx2ait::build::NO_BUILD_LOG))
            .map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", log.display())))?;
        stage.commit(&hash, false)?;
        wrote("the sources");
        return Ok(0);
    }
    let compiler = match Nvcc::discover(arch) {
        Ok(c) => c,
        Err(e) => {
            let message = format!(
                "the CUDA sources are in {} but no library was built: {e}\n(run with --no-build to write sources only)",
                a.out.display()
            );
            return Err(commit_failed(stage, &hash, message));
        }
    };
    // The profiler compiled every candidate it timed into its own object cache (beside the
    // profile cache, unless --cache-dir / ONNX2AIT_CACHE_DIR gave both the same one): the chosen
    // instances are taken from there instead of being compiled again.
    let seed_caches = match (a.no_profile, super::profile::cache_path(a.profile_cache.as_ref())) {
        (false, Ok(file)) => vec![onnx2ait::profile::default_object_cache(&file)],
        _ => Vec::new(),
    };
    let opts = BuildOptions { jobs: a.jobs, cache_dir, progress: true, seed_caches };
    // The previous library comes along, so an unchanged model is not linked again.
    stage.carry_library();
    let built = onnx2ait::build::build(
        stage.dir(),
        &generated.files.sources,
        &generated.files.headers,
        &compiler,
        &opts,
        LIB_NAME,
    );
    let mut built = match built {
        Ok(b) => b,
        Err(e) => {
            // The new sources and build.log go to OUT, without a library.
            let message = stage.rewrite_paths(&e.to_string());
            return Err(commit_failed(stage, &hash, message));
        }
    };
    built.lib = a.out.join(LIB_NAME);
    let report_json = serde_json::to_string_pretty(&built).map_err(|e| Failure::new(1, e.to_string()))? + "\n";
    let rp = stage.dir().join("build_report.json");
    std::fs::write(&rp, report_json).map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", rp.display())))?;
    stage.commit(&hash, true)?;
    // build() has printed its summary line (progress is on).
    wrote(&format!("the sources and {LIB_NAME}"));
    Ok(0)
}

/// The GPU memory bound: `--max-memory`, else the largest GPU of the architecture.
fn memory_bound(a: &CompileArgs, arch: Arch) -> Bound {
    match a.max_memory {
        Some(bytes) => Bound { bytes, what: format!("--max-memory ({})", super::checks::fmt_bytes(bytes)) },
        None => super::checks::gpu_memory_bound(arch),
    }
}

/// Every value of the graph at `--max-batch` (the one symbol `--dim` leaves is the batch) fits
/// the GPU, its size computed without overflow: checked before lowering, which sizes the arena
/// from these shapes.
fn check_batch_sizes(
    g: &Graph,
    dims: &BTreeMap<String, i64>,
    max_batch: i64,
    precision: Precision,
    bound: &Bound,
) -> Result<(), Failure> {
    let mut env = dims.clone();
    let free: Vec<String> = super::checks::symbols(g).into_iter().filter(|s| !dims.contains_key(s)).collect();
    // Several free symbols: lowering refuses the model and says which to bind.
    if let [batch] = free.as_slice() {
        env.insert(batch.clone(), max_batch);
    }
    let context = match free.as_slice() {
        [batch] => format!("at --max-batch {max_batch} (batch dim '{batch}')"),
        _ => "at the dims given".to_string(),
    };
    // Float values are stored in the --precision type on the GPU.
    let elem_bytes = |t: DType| match (t.is_float(), precision) {
        (true, Precision::Fp16) => 2,
        _ => t.size_bytes() as u64,
    };
    super::checks::check_sizes(g, &env, None, elem_bytes, bound, &context).map(|_| ())
}

/// The library's device memory (arena, workspace, weights) fits the bound, summed with checked
/// arithmetic.
fn check_device_memory(m: &onnx2ait::lower::program::MemoryPlan, max_batch: i64, bound: &Bound) -> Result<(), Failure> {
    let fmt = super::checks::fmt_bytes;
    let total = m.arena_bytes.checked_add(m.workspace_bytes).and_then(|t| t.checked_add(m.weights_bytes));
    match total {
        Some(t) if t <= bound.bytes => Ok(()),
        _ => Err(Failure::new(
            1,
            format!(
                "the library would need {} of GPU memory at --max-batch {max_batch} (activation arena {}, workspace {}, weights {}), more than {}; lower --max-batch",
                total.map_or_else(|| "more bytes than a 64-bit size can count".to_string(), fmt),
                fmt(m.arena_bytes),
                fmt(m.workspace_bytes),
                fmt(m.weights_bytes),
                bound.what
            ),
        )),
    }
}

/// After a build that produced no library: OUT gets the new sources (and build.log) without one,
/// and the error is `message` (with the swap's error, if that failed too).
fn commit_failed(stage: Staging, hash: &str, message: String) -> Failure {
    match stage.commit(hash, false) {
        Ok(_) => Failure::new(1, message),
        Err(e) => Failure::new(1, format!("{message}\n{e}")),
    }
}

/// The target, with profiled times when a profile cache has them for this toolchain, and a line
/// saying where the choices come from.
fn kernel_choice(
    a: &CompileArgs,
    arch: Arch,
    graph: &Graph,
    lower_opts: &LowerOptions,
    cache_dir: Option<PathBuf>,
) -> Result<(CudaTarget, String), Failure> {
    let target = CudaTarget::new(arch).with_max_batch(a.max_batch);
    if a.no_profile {
        return Ok((target, "kernel choice: heuristic (--no-profile)".into()));
    }
    let explicit = a.profile_cache.is_some() || a.profile;
    let cache_file = super::profile::cache_path(a.profile_cache.as_ref());
    let cache_file = match cache_file {
        Ok(f) => f,
        Err(_) if !explicit => return Ok((target, "kernel choice: heuristic (no profile cache location)".into())),
        Err(e) => return Err(e),
    };
    if a.profile {
        let opts = ProfileOptions {
            arch,
            lower: lower_opts.clone(),
            cache: cache_file.clone(),
            work_dir: onnx2ait::profile::default_work_dir(&cache_file),
            build: BuildOptions { jobs: a.jobs, cache_dir, progress: true, ..Default::default() },
            warmup: 3,
            iters: 20,
            progress: true,
            build_only: false,
        };
        let report = onnx2ait::profile::profile(graph, &opts)?;
        super::emit(&report.summary());
    } else if !cache_file.exists() {
        if explicit {
            return Err(Failure::new(1, format!("profile cache {}: no such file", cache_file.display())));
        }
        return Ok((target, format!("kernel choice: heuristic (no profile cache at {})", cache_file.display())));
    }
    let cache = ProfileCache::open(&cache_file)?;
    // The toolchain is part of the key: times hold for the code this nvcc and CUTLASS produce.
    let nvcc = match Nvcc::discover(arch) {
        Ok(n) => n,
        Err(_) if !explicit => {
            return Ok((target, "kernel choice: heuristic (no nvcc to match the profile cache with)".into()))
        }
        Err(e) => return Err(e.into()),
    };
    match onnx2ait::profile::measurements_for(&cache, arch, &nvcc, a.profile_gpu.as_deref())? {
        Some((device, m)) => Ok((
            target.with_measurements(m),
            format!("kernel choice: profiled times of {device} ({})", cache_file.display()),
        )),
        None => Ok((
            target,
            format!(
                "kernel choice: heuristic ({} has no times for this GPU architecture and toolchain)",
                cache_file.display()
            ),
        )),
    }
}

/// "library instances: 14 (41 of 53 choices measured)".
fn choice_summary(p: &onnx2ait::lower::Program, choice: &str) -> String {
    let (mut total, mut measured) = (0, 0);
    for k in &p.kernels {
        if let Some(serde_json::Value::Array(entries)) = k.context.get("dispatch") {
            total += entries.len();
            measured += entries.iter().filter(|e| e["measured"] == true).count();
        }
    }
    format!("{choice}\nlibrary:   {} instances; {measured} of {total} node choices measured", p.library.len())
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
