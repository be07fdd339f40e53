//! The whole pipeline as one call, the library's entry point:
//!
//! ```no_run
//! use onnx2ait::compile::{compile, CompileOptions};
//! let mut opts = CompileOptions::default(); // the command line's defaults: sm_90a, fp16, max batch 64
//! opts.dims.insert("seq".into(), 128);
//! let build = compile("bert.onnx".as_ref(), "out".as_ref(), &opts)?;
//! println!("{}", build.summary);
//! # Ok::<(), onnx2ait::Error>(())
//! ```
//!
//! `onnx2ait MODEL -o OUT` is this call. Its steps are public too, for callers that report
//! between them (the command line prints the summary before the minutes of nvcc):
//! [`prepare`] (checks the options against the imported graph, optimises it and chooses the
//! kernel instances, profiling first if asked), [`Prepared::generate`] (renders OUT's sources,
//! weights, `graph.json`, `kernels.json` and `summary.txt` into a staging folder) and
//! [`Generated::build`] (nvcc, then OUT swapped in; see [`crate::codegen::outdir`]).

pub mod checks;
pub mod report;

use crate::build::nvcc::Nvcc;
use crate::build::{BuildOptions, BuildReport};
use crate::codegen::outdir::Staging;
use crate::codegen::GeneratedModel;
use crate::egraph::{optimize, ExplainReport, OptimizeOptions};
use crate::ir::{DType, Graph};
use crate::lower::cuda::Arch;
use crate::lower::cuda::CudaTarget;
use crate::lower::rocm::{RocmArch, RocmTarget};
use crate::lower::target::{Measurements, ProfiledTarget};
use crate::lower::{LowerOptions, Precision, RunDims};
use crate::profile::cache::ProfileCache;
use crate::profile::{ProfileOptions, ProfileTarget, Toolchain};
use crate::{Error, Result};
use checks::Bound;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The library every build produces.
pub const LIB_NAME: &str = "libmodel.so";

/// The largest run-time batch when none is given (`--max-batch`).
pub const DEFAULT_MAX_BATCH: i64 = 64;

/// Where the kernel instances come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelChoice {
    /// The heuristic only (`--no-profile`).
    Heuristic,
    /// Profiled times from a profile cache: `None` is the default location
    /// ([`crate::profile::cache::default_path`]), used when it exists (else the heuristic);
    /// a given file must exist.
    ProfileCache(Option<PathBuf>),
    /// Profile the model on this machine's GPU first (`--profile`), into the given profile
    /// cache or the default one, then use the times.
    Profile(Option<PathBuf>),
}

/// The GPU platform the model is compiled for (`--target`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuTarget {
    /// NVIDIA: CUTLASS and our kernels, nvcc, for [`CompileOptions::arch`].
    #[default]
    Cuda,
    /// AMD: Composable Kernel and our kernels in HIP, clang-19 (`--target rocm --arch gfx942`);
    /// [`CompileOptions::arch`] is not used. Kernel instances come from the heuristic, or from
    /// profiled times of an AMD GPU (`onnx2ait profile --target rocm`).
    Rocm(RocmArch),
}

/// How attention subgraphs are compiled (`--attention`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Attention {
    /// Fused where the target has the fused kernel (CUDA), unfused where it has not (ROCm).
    #[default]
    Auto,
    /// The score products, mask add, softmax and head transposes as separate kernels.
    Unfused,
    /// One kernel per attention (attention.cu.hbs); see [`OptimizeOptions::pipeline`].
    Fused,
}

impl Attention {
    /// Whether attention blocks compile to the fused kernel for `target`.
    pub fn fused_on(self, target: GpuTarget) -> bool {
        match self {
            Attention::Auto => matches!(target, GpuTarget::Cuda),
            Attention::Unfused => false,
            Attention::Fused => true,
        }
    }
}

/// Everything `compile` takes besides the model and OUT: the command line's options, and its
/// defaults ([`Default`]; the command line takes its defaults from here).
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The platform (`--target`); CUDA by default.
    pub target: GpuTarget,
    /// CUDA GPU architecture (`--arch` with the CUDA target).
    pub arch: Arch,
    /// Largest run-time batch when the batch dim is symbolic and left free (`--max-batch`); sizes
    /// the arena. When `ranges` gives the batch dim a range, that range's largest value governs
    /// instead (the command line refuses a `--max-batch` that contradicts it).
    pub max_batch: i64,
    /// GPU memory the library may take (arena, workspace, weights at `max_batch`); `None` is the
    /// largest GPU of `arch` ([`checks::gpu_memory_bound`]).
    pub max_memory: Option<u64>,
    /// Values of symbolic dims fixed at compile time (`--dim seq=128`).
    pub dims: BTreeMap<String, i64>,
    /// Ranges `(min, max)` of symbolic dims chosen at each run (`--dim seq=1..512`): one build
    /// serves every value in the range, the arena sized for the largest. The one symbolic dim
    /// left with neither a value nor a range is the run-time batch (`1..=max_batch`).
    pub ranges: BTreeMap<String, (i64, i64)>,
    /// Storage type of float activations and weights (`--precision`).
    pub precision: Precision,
    /// Attention blocks fused into one kernel each or not (`--attention`); see
    /// [`OptimizeOptions::pipeline`].
    pub attention: Attention,
    /// One kernel per squeeze-and-excitation scale (`--squeeze-excite fused`, the default); see
    /// [`OptimizeOptions::with_squeeze_excite`].
    pub fused_squeeze_excite: bool,
    pub kernel_choice: KernelChoice,
    /// The GPU whose profiled times to use when the cache has several (`--profile-gpu`).
    pub profile_gpu: Option<String>,
    /// With profiled times, let instances serve several problems when none is more than this
    /// fraction slower than its fastest (`--reuse-within`, in percent there); 0 disables sharing.
    pub reuse_within: f64,
    /// Parallel nvcc jobs; `None`: one per core.
    pub jobs: Option<usize>,
    /// A shared object cache (`--cache-dir`, `ONNX2AIT_CACHE_DIR` on the command line); `None`:
    /// OUT's private one.
    pub cache_dir: Option<PathBuf>,
    /// Build `libmodel.so` (`false`: sources only, `--no-build`).
    pub build: bool,
    /// Write into a non-empty folder onnx2ait did not write (`--force`).
    pub force: bool,
    /// Progress of profiling and nvcc on stderr.
    pub progress: bool,
    /// Prefix of the C API's names (`--symbol-prefix NAME`: `NAME_o2a_create`, …, macros
    /// `NAME_O2A_…`), so that the libraries of several models can be linked into one program;
    /// `None` (the default): the plain `o2a_*` names. See [`crate::codegen::check_symbol_prefix`].
    pub symbol_prefix: Option<String>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            target: GpuTarget::Cuda,
            arch: Arch::Sm90a,
            max_batch: DEFAULT_MAX_BATCH,
            max_memory: None,
            dims: BTreeMap::new(),
            ranges: BTreeMap::new(),
            precision: Precision::Fp16,
            attention: Attention::Auto,
            fused_squeeze_excite: true,
            kernel_choice: KernelChoice::ProfileCache(None),
            profile_gpu: None,
            reuse_within: 0.01,
            jobs: None,
            cache_dir: None,
            build: true,
            force: false,
            progress: false,
            symbol_prefix: None,
        }
    }
}

/// What [`compile`] made.
#[derive(Debug)]
pub struct Build {
    /// The output folder.
    pub out: PathBuf,
    /// `OUT/libmodel.so`; `None` with `build: false`.
    pub library: Option<PathBuf>,
    /// Content hash of the render, as `o2a_build_hash()` returns it.
    pub build_hash: String,
    /// `OUT/summary.txt`: the model, the optimisation, the kernels and where their choice came from.
    pub summary: String,
    /// The profiler's report, when it ran.
    pub profile_summary: Option<String>,
    /// Kernel-level nodes by kind after optimisation.
    pub kernels: BTreeMap<String, usize>,
    /// nvcc's work (also `OUT/build_report.json`); `None` with `build: false`.
    pub report: Option<BuildReport>,
}

/// Imports `model`, compiles it into `out` and builds `out/libmodel.so`: [`prepare`],
/// [`Prepared::generate`] and [`Generated::build`] in one call.
pub fn compile(model: &Path, out: &Path, opts: &CompileOptions) -> Result<Build> {
    let graph = crate::onnx::load_model(model)?;
    prepare(graph, opts)?.generate(out)?.build()
}

/// A model optimised and its kernel instances chosen, ready to render.
pub struct Prepared {
    opts: CompileOptions,
    lower: LowerOptions,
    graph: Graph,
    optimised: Graph,
    report: ExplainReport,
    target: PreparedTarget,
    choice: String,
    sharing: Option<String>,
    bound: Bound,
    /// The profiler's report, when `KernelChoice::Profile` ran it.
    pub profile_summary: Option<String>,
}

/// The target whose instances were chosen.
enum PreparedTarget {
    Cuda(CudaTarget),
    Rocm(RocmTarget),
}

/// Checks the options against the imported graph (dim names, every value's size at
/// `max_batch` with checked arithmetic, bounded by the GPU memory), optimises it and chooses
/// the kernel instances (profiling first with [`KernelChoice::Profile`]).
pub fn prepare(mut graph: Graph, opts: &CompileOptions) -> Result<Prepared> {
    let pairs: Vec<(String, i64)> = opts.dims.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let dims = checks::check_dims(&graph, &pairs)?;
    checks::check_ranges(&graph, &opts.ranges, &dims)?;
    // The fixed dims become numbers before optimising, so the shape and index subgraphs that
    // read them fold into constants (see ir::specialize).
    crate::ir::specialize::bind_dims(&mut graph, &dims)?;
    // A range of the batch dim (`--dim batch=1..8`) governs its largest value: the targets'
    // batch ranges, the pricing batch and the memory checks all read `max_batch`.
    let ranged = crate::lower::ranged_batch(&graph, &dims, &opts.ranges);
    let with_range;
    let opts = match ranged {
        Some((_, (_, max))) => {
            with_range = CompileOptions { max_batch: max, ..opts.clone() };
            &with_range
        }
        None => opts,
    };
    if opts.max_batch < 1 {
        return Err(Error::Other(format!("--max-batch {}: must be at least 1", opts.max_batch)));
    }
    if !(0.0..=1.0).contains(&opts.reuse_within) {
        return Err(Error::Other(format!("reuse_within {}: must be a fraction from 0 to 1", opts.reuse_within)));
    }
    let bound = match opts.max_memory {
        Some(bytes) => Bound { bytes, what: format!("--max-memory ({})", checks::fmt_bytes(bytes)) },
        None => match opts.target {
            GpuTarget::Cuda => checks::gpu_memory_bound(opts.arch),
            GpuTarget::Rocm(arch) => checks::rocm_memory_bound(arch),
        },
    };
    check_batch_sizes(&graph, &dims, &opts.ranges, opts.max_batch, opts.precision, &bound)?;
    if let Some(p) = &opts.symbol_prefix {
        crate::codegen::check_symbol_prefix(p)?;
    }
    let lower = LowerOptions {
        dims,
        ranges: opts.ranges.clone(),
        max_batch: opts.max_batch,
        precision: opts.precision,
        symbol_prefix: opts.symbol_prefix.clone(),
    };
    let optimize_opts = OptimizeOptions::pipeline(opts.attention.fused_on(opts.target))?
        .with_squeeze_excite(opts.fused_squeeze_excite)?;
    let (optimised, report) = optimize(&graph, &optimize_opts)?;
    let (min_batch, max_batch) = lower.batch_range(&graph);
    let profile_target = match opts.target {
        GpuTarget::Cuda => ProfileTarget::Cuda(opts.arch),
        GpuTarget::Rocm(arch) => ProfileTarget::Rocm(arch),
    };
    let (measured, choice, profile_summary) = kernel_choice(opts, &graph, &lower, &optimize_opts, profile_target)?;
    let chosen = Chosen { graph: &graph, optimised, report, lower: &lower, optimize: &optimize_opts, opts };
    let (target, optimised, report, sharing) = match opts.target {
        GpuTarget::Cuda => chosen.measured_and_shared(
            CudaTarget::new(opts.arch).with_batch_range(min_batch, max_batch),
            measured,
            PreparedTarget::Cuda,
        )?,
        GpuTarget::Rocm(arch) => chosen.measured_and_shared(
            RocmTarget::new(arch).with_batch_range(min_batch, max_batch),
            measured,
            PreparedTarget::Rocm,
        )?,
    };
    Ok(Prepared {
        opts: opts.clone(),
        lower,
        graph,
        optimised,
        report,
        target,
        choice,
        sharing,
        bound,
        profile_summary,
    })
}

/// The optimised graph before the target's measured times are applied.
struct Chosen<'a> {
    graph: &'a Graph,
    optimised: Graph,
    report: ExplainReport,
    lower: &'a LowerOptions,
    optimize: &'a OptimizeOptions,
    opts: &'a CompileOptions,
}

impl Chosen<'_> {
    /// `target` given the profiled times `measured`, if any. With them, extraction prices convs
    /// and gemms by them (at the largest batch, the range that dominates throughput), so fusion
    /// and layout choices follow measurements; then the measured choices share instances
    /// (`--reuse-within`). Returns the target (wrapped by `prepared`), the graph, its report and
    /// the sharing summary.
    fn measured_and_shared<T: ProfiledTarget>(
        self,
        target: T,
        measured: Option<Measurements>,
        prepared: fn(T) -> PreparedTarget,
    ) -> Result<(PreparedTarget, Graph, ExplainReport, Option<String>)> {
        let opts = self.opts;
        let target = match measured {
            Some(m) => target.with_measurements(m),
            None => target,
        };
        let (optimised, report) = if target.has_measurements() {
            crate::profile::cost::optimize_measured(
                self.graph,
                self.optimize,
                &target,
                opts.max_batch,
                &self.lower.pricing_dims(),
            )?
        } else {
            (self.optimised, self.report)
        };
        let (target, sharing) = crate::lower::sharing::share(target, &optimised, self.lower, opts.reuse_within)?;
        let sharing = sharing.map(|plan| {
            let by_batch: Vec<String> =
                plan.slowdown_by_range.iter().map(|(b, r)| format!("+{:.2}% at {b}", (r - 1.0) * 100.0)).collect();
            format!(
                "sharing:   {} instances serve the measured choices, the fastest-each choice needs {} (--reuse-within {}%: modelled library time {}; no choice more than {:.1}% slower than its fastest)",
                plan.instances.len(),
                plan.unshared,
                opts.reuse_within * 100.0,
                by_batch.join(", "),
                (plan.worst_slowdown - 1.0) * 100.0
            )
        });
        Ok((prepared(target), optimised, report, sharing))
    }
}

impl Prepared {
    /// The imported graph (with its import warnings in `info.warnings`).
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The optimised kernel-level graph.
    pub fn optimised(&self) -> &Graph {
        &self.optimised
    }

    /// Renders OUT's files into a staging folder next to `out` (OUT itself is untouched until
    /// [`Generated::build`] swaps them in): sources, weights, `graph.json`, `kernels.json`,
    /// `summary.txt`. The library's device memory must fit the bound.
    pub fn generate(self, out: &Path) -> Result<Generated> {
        let to_json = |g: &Graph, file: &str| {
            serde_json::to_string_pretty(&report::graph_json(g))
                .map_err(|e| Error::Other(format!("cannot serialise {file}: {e}")))
        };
        let (json, kernels_json) = (to_json(&self.graph, "graph.json")?, to_json(&self.optimised, "kernels.json")?);
        let mut summary = report::summary_text(&report::graph_json(&self.graph));
        let kernels: Vec<String> = self.report.kernels_after.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        let _ = writeln!(
            summary,
            "optimised: {} ONNX nodes -> {} kernels ({})",
            self.graph.nodes.len(),
            self.optimised.nodes.len(),
            kernels.join(", ")
        );
        // Everything is written into a staging folder next to OUT and swapped in at the end;
        // until then OUT keeps the previous output, and an error drops the staging folder.
        let stage = Staging::begin(out, self.opts.force)?;
        let generated = match &self.target {
            PreparedTarget::Cuda(t) => {
                crate::codegen::generate_cuda_with(&self.optimised, &self.lower, t, stage.dir())?
            }
            PreparedTarget::Rocm(t) => crate::codegen::generate_for(&self.optimised, &self.lower, t, stage.dir())?,
        };
        check_device_memory(&generated.program.memory, &generated.program.dims, &self.bound)?;
        let _ = writeln!(summary, "{}", generated.summary());
        let _ = writeln!(summary, "{}", choice_summary(&generated.program, &self.choice));
        if let Some(s) = &self.sharing {
            let _ = writeln!(summary, "{s}");
        }
        let files = [
            ("graph.json", format!("{json}\n")),
            ("kernels.json", format!("{kernels_json}\n")),
            ("summary.txt", summary.clone()),
        ];
        for (file, text) in &files {
            let p = stage.dir().join(file);
            std::fs::write(&p, text).map_err(|e| Error::Other(format!("{}: cannot write: {e}", p.display())))?;
        }
        Ok(Generated {
            out: out.to_path_buf(),
            opts: self.opts,
            stage,
            generated,
            summary,
            kernels: self.report.kernels_after,
            profile_summary: self.profile_summary,
        })
    }
}

/// OUT's files rendered in a staging folder, not yet built or swapped in.
pub struct Generated {
    out: PathBuf,
    opts: CompileOptions,
    stage: Staging,
    generated: GeneratedModel,
    /// What `OUT/summary.txt` says.
    pub summary: String,
    kernels: BTreeMap<String, usize>,
    profile_summary: Option<String>,
}

impl Generated {
    /// The rendered kernels and memory plan.
    pub fn model(&self) -> &GeneratedModel {
        &self.generated
    }

    /// Builds `libmodel.so` with nvcc (unless `build: false`) and swaps the staging folder in as
    /// OUT. Without nvcc, or when the build fails, OUT gets the new sources and `build.log`
    /// without a library, and the error says why.
    pub fn build(self) -> Result<Build> {
        let Generated { out, opts, stage, generated, summary, kernels, profile_summary } = self;
        let hash = generated.files.build_hash.clone();
        let done = |library: Option<PathBuf>, report: Option<BuildReport>| Build {
            out: out.clone(),
            library,
            build_hash: hash.clone(),
            summary: summary.clone(),
            profile_summary: profile_summary.clone(),
            kernels: kernels.clone(),
            report,
        };
        if !opts.build {
            // build.log says why there is no library (`onnx2ait run`/`validate --build` read it).
            let log = stage.dir().join(crate::build::LOG_NAME);
            std::fs::write(&log, format!("{}\n", crate::build::NO_BUILD_LOG))
                .map_err(|e| Error::Other(format!("{}: cannot write: {e}", log.display())))?;
            stage.commit(&hash, false)?;
            return Ok(done(None, None));
        }
        let discovered: Result<Box<dyn crate::build::Compiler>> = match opts.target {
            GpuTarget::Cuda => Nvcc::discover(opts.arch).map(|c| Box::new(c) as Box<dyn crate::build::Compiler>),
            GpuTarget::Rocm(arch) => {
                crate::build::hip::HipClang::discover(arch).map(|c| Box::new(c) as Box<dyn crate::build::Compiler>)
            }
        };
        let compiler = match discovered {
            Ok(c) => c,
            Err(e) => {
                let what = match opts.target {
                    GpuTarget::Cuda => "CUDA",
                    GpuTarget::Rocm(_) => "ROCm (HIP)",
                };
                let message = format!(
                    "the {what} sources are in {} but no library was built: {e}\n(run with --no-build to write sources only)",
                    out.display()
                );
                return Err(commit_failed(stage, &hash, message));
            }
        };
        // The profiler compiled every candidate it timed into its own object cache (beside the
        // profile cache, unless a shared cache dir gave both the same one): the chosen
        // instances are taken from there instead of being compiled again.
        let seed_caches = match &opts.kernel_choice {
            _ if opts.target != GpuTarget::Cuda => Vec::new(),
            KernelChoice::ProfileCache(f) | KernelChoice::Profile(f) => {
                profile_cache_file(f).map(|file| vec![crate::profile::default_object_cache(&file)]).unwrap_or_default()
            }
            KernelChoice::Heuristic => Vec::new(),
        };
        let build_opts = BuildOptions {
            jobs: opts.jobs,
            cache_dir: opts.cache_dir.clone(),
            progress: opts.progress,
            seed_caches,
            exports: generated.files.exports.clone(),
        };
        // The previous library comes along, so an unchanged model is not linked again.
        stage.carry_library();
        let built = crate::build::build(
            stage.dir(),
            &generated.files.sources,
            &generated.files.headers,
            compiler.as_ref(),
            &build_opts,
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
        built.lib = out.join(LIB_NAME);
        let report_json = serde_json::to_string_pretty(&built).map_err(|e| Error::Other(e.to_string()))? + "\n";
        let rp = stage.dir().join("build_report.json");
        std::fs::write(&rp, report_json).map_err(|e| Error::Other(format!("{}: cannot write: {e}", rp.display())))?;
        stage.commit(&hash, true)?;
        Ok(done(Some(built.lib.clone()), Some(built)))
    }
}

/// The profile cache file: the one given, else the default location; an error when there is none.
fn profile_cache_file(given: &Option<PathBuf>) -> Result<PathBuf> {
    given.clone().or_else(crate::profile::cache::default_path).ok_or_else(|| {
        Error::Other("no profile cache location: pass --profile-cache FILE or set ONNX2AIT_PROFILE_CACHE".into())
    })
}

/// Every value of the graph at `max_batch` (the one symbol the dims leave is the batch) fits the
/// GPU, its size computed without overflow: checked before lowering, which sizes the arena from
/// these shapes.
fn check_batch_sizes(
    g: &Graph,
    dims: &BTreeMap<String, i64>,
    ranges: &BTreeMap<String, (i64, i64)>,
    max_batch: i64,
    precision: Precision,
    bound: &Bound,
) -> Result<()> {
    let (env, context) = checks::largest_dims(g, dims, ranges, max_batch);
    // Float values are stored in the precision's type on the GPU.
    let elem_bytes = |t: DType| match (t.is_float(), precision) {
        (true, Precision::Fp16) => 2,
        _ => t.size_bytes() as u64,
    };
    checks::check_sizes(g, &env, None, elem_bytes, bound, &context).map(|_| ())
}

/// The library's device memory (arena, workspace, weights) fits the bound, summed with checked
/// arithmetic. The message names the options that set the run-time dims (`dims`) the arena is
/// planned for at their largest, as the user gave them: `--max-batch 64`, or the batch dim's own
/// range `--dim batch=1..8`, and the other `--dim` ranges.
fn check_device_memory(m: &crate::lower::program::MemoryPlan, dims: &RunDims, bound: &Bound) -> Result<()> {
    let fmt = checks::fmt_bytes;
    let total = m.arena_bytes.checked_add(m.workspace_bytes).and_then(|t| t.checked_add(m.weights_bytes));
    if total.is_some_and(|t| t <= bound.bytes) {
        return Ok(());
    }
    // The free batch's `--max-batch N` and the `--dim` ranges (the batch's own range among them),
    // as `checks::largest_dims` names them.
    let (mut free, mut ranged) = (None, Vec::new());
    for (i, d) in dims.dims.iter().enumerate() {
        match d.set_by(dims.batch == Some(i)) {
            o if o.starts_with("--max-batch") => free = Some(o),
            o => ranged.push(o),
        }
    }
    let ranged_text = (!ranged.is_empty()).then(|| format!("the largest values of {}", ranged.join(", ")));
    let at = match (&free, &ranged_text) {
        (Some(b), Some(r)) => format!(" at {b} and {r}"),
        (Some(b), None) => format!(" at {b}"),
        (None, Some(r)) => format!(" at {r}"),
        (None, None) => " (fixed shapes)".to_string(),
    };
    let smaller: Vec<String> = free
        .iter()
        .map(|_| "--max-batch".to_string())
        .chain(ranged.iter().map(|o| format!("the largest value of {o}")))
        .collect();
    let lower = if smaller.is_empty() { String::new() } else { format!("; lower {}", smaller.join(" or ")) };
    Err(Error::Other(format!(
        "the library would need {} of GPU memory{at} (activation arena {}, workspace {}, weights {}), more than {}{lower}",
        total.map_or_else(|| "more bytes than a 64-bit size can count".to_string(), fmt),
        fmt(m.arena_bytes),
        fmt(m.workspace_bytes),
        fmt(m.weights_bytes),
        bound.what
    )))
}

/// After a build that produced no library: OUT gets the new sources (and build.log) without one,
/// and the error is `message` (with the swap's error, if that failed too).
fn commit_failed(stage: Staging, hash: &str, message: String) -> Error {
    match stage.commit(hash, false) {
        Ok(_) => Error::Other(message),
        Err(e) => Error::Other(format!("{message}\n{e}")),
    }
}

/// Profiled times for `target` when a profile cache has them for this toolchain (after running
/// the profiler with `--profile`); a line saying where the choices come from; the profiler's
/// report when it ran.
fn kernel_choice(
    opts: &CompileOptions,
    graph: &Graph,
    lower: &LowerOptions,
    optimize: &OptimizeOptions,
    target: ProfileTarget,
) -> Result<(Option<Measurements>, String, Option<String>)> {
    let (file, explicit) = match &opts.kernel_choice {
        KernelChoice::Heuristic => return Ok((None, "kernel choice: heuristic (--no-profile)".into(), None)),
        KernelChoice::ProfileCache(file) => (file, file.is_some()),
        KernelChoice::Profile(file) => (file, true),
    };
    let cache_file = match profile_cache_file(file) {
        Ok(f) => f,
        Err(_) if !explicit => return Ok((None, "kernel choice: heuristic (no profile cache location)".into(), None)),
        Err(e) => return Err(e),
    };
    let mut profile_summary = None;
    if matches!(opts.kernel_choice, KernelChoice::Profile(_)) {
        let popts = ProfileOptions {
            target,
            lower: lower.clone(),
            optimize: optimize.clone(),
            cache: cache_file.clone(),
            work_dir: crate::profile::default_work_dir(&cache_file),
            build: BuildOptions {
                jobs: opts.jobs,
                cache_dir: opts.cache_dir.clone(),
                progress: opts.progress,
                ..Default::default()
            },
            warmup: 3,
            iters: 20,
            progress: opts.progress,
            build_only: false,
            part_sources: None,
        };
        profile_summary = Some(crate::profile::profile(graph, &popts)?.summary());
    } else if !cache_file.exists() {
        if explicit {
            return Err(Error::Other(format!("profile cache {}: no such file", cache_file.display())));
        }
        return Ok((None, format!("kernel choice: heuristic (no profile cache at {})", cache_file.display()), None));
    }
    let cache = ProfileCache::open(&cache_file)?;
    // The toolchain is part of the key: times hold for the code this compiler and instance
    // library produce.
    let toolchain = match Toolchain::discover(target) {
        Ok(t) => t,
        Err(_) if !explicit => {
            return Ok((None, "kernel choice: heuristic (no toolchain to match the profile cache with)".into(), None))
        }
        Err(e) => return Err(e),
    };
    match crate::profile::measurements_for(&cache, &toolchain, opts.profile_gpu.as_deref())? {
        Some((device, m)) => Ok((
            Some(m),
            format!("kernel choice: profiled times of {device} ({})", cache_file.display()),
            profile_summary,
        )),
        None => Ok((
            None,
            format!(
                "kernel choice: heuristic ({} has no times for this GPU architecture and toolchain)",
                cache_file.display()
            ),
            profile_summary,
        )),
    }
}

/// "library instances: 14 (41 of 53 choices measured)".
fn choice_summary(p: &crate::lower::Program, choice: &str) -> String {
    let (mut total, mut measured) = (0, 0);
    for k in &p.kernels {
        total += k.dispatch.len();
        measured += k.dispatch.iter().filter(|d| d.measured).count();
    }
    format!("{choice}\nlibrary:   {} instances; {measured} of {total} node choices measured", p.library.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::RunDim;

    /// The facade without nvcc's part: a bundled model compiled with `build: false` gives OUT
    /// with sources, the JSON files and the summary, and no library.
    #[test]
    fn compile_without_build_writes_the_sources() {
        let out = std::env::temp_dir().join(format!("onnx2ait-compile-facade-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let opts = CompileOptions {
            build: false,
            max_batch: 4,
            kernel_choice: KernelChoice::Heuristic,
            ..CompileOptions::default()
        };
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/pattern_resnet_bottleneck.onnx");
        let b = compile(&model, &out, &opts).expect("compiles");
        assert!(b.library.is_none() && b.report.is_none());
        for f in ["graph.json", "kernels.json", "summary.txt", "model.h", "weights.bin"] {
            assert!(out.join(f).exists(), "{f} missing");
        }
        assert_eq!(std::fs::read_to_string(out.join("summary.txt")).unwrap(), b.summary);
        assert!(b.summary.contains("kernel choice: heuristic (--no-profile)"), "{}", b.summary);
        assert!(b.kernels.get("conv").copied().unwrap_or(0) > 0, "{:?}", b.kernels);
        let _ = std::fs::remove_dir_all(&out);
    }

    /// Issue 14: with `--dim batch=4..64` (and a seq range from 16) the target compile chooses with
    /// has no batch bound below 4: its ranges start at the range's smallest value, so no library
    /// choice (nor a profiled problem) is made for a batch no run can take; every dispatch bound
    /// of the lowered program lies inside the ranges.
    #[test]
    fn a_batch_range_above_one_bounds_the_choices() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
        let g = crate::onnx::load_model(&model).unwrap();
        let opts = CompileOptions {
            build: false,
            kernel_choice: KernelChoice::Heuristic,
            ranges: [("batch".to_string(), (4, 64)), ("seq".to_string(), (16, 128))].into(),
            ..CompileOptions::default()
        };
        let prepared = prepare(g.clone(), &opts).unwrap();
        let PreparedTarget::Cuda(t) = &prepared.target else { panic!("a CUDA target") };
        assert_eq!(t.batch_buckets(), [8, 64]);
        // ROCm's target alike.
        let rocm = CompileOptions { target: GpuTarget::Rocm(RocmArch::Gfx942), ..opts.clone() };
        let rp = prepare(g, &rocm).unwrap();
        let PreparedTarget::Rocm(r) = &rp.target else { panic!("a ROCm target") };
        let lowered = crate::lower::lower(rp.optimised(), r, &rp.lower).unwrap();
        let mut bounds = Vec::new();
        for k in &lowered.kernels {
            for d in k.context.get("dispatch").and_then(|d| d.as_array()).into_iter().flatten() {
                bounds.push(d["max_batch"].as_i64().unwrap());
            }
        }
        assert!(bounds.iter().all(|&b| (4..=64).contains(&b)), "{bounds:?}");
        let out = std::env::temp_dir().join(format!("onnx2ait-compile-range-min-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let generated = prepared.generate(&out).unwrap();
        let p = &generated.model().program;
        assert_eq!(p.dims.ranges(), [("batch".to_string(), (4, 64)), ("seq".to_string(), (16, 128))].into());
        assert_eq!(p.dims.options_text().as_deref(), Some("--dim batch=4..64, --dim seq=16..128"));
        let mut bounds = Vec::new();
        for k in &p.kernels {
            for d in k.context.get("dispatch").and_then(|d| d.as_array()).into_iter().flatten() {
                bounds.push((d["max_batch"].as_i64().unwrap(), d["dims"]["seq"].as_i64().unwrap_or(128)));
            }
        }
        assert!(!bounds.is_empty());
        assert!(bounds.iter().all(|&(b, s)| [8, 64].contains(&b) && [64, 128].contains(&s)), "{bounds:?}");
        drop(generated);
        let _ = std::fs::remove_dir_all(&out);
    }

    /// Issue 14: the GPU-memory refusal names the options that set the run-time dims as given:
    /// a free batch's `--max-batch`, a batch dim's own `--dim` range, fixed shapes neither.
    #[test]
    fn the_memory_refusal_names_the_batch_option() {
        let m = crate::lower::program::MemoryPlan {
            arena_bytes: 3 << 20,
            workspace_bytes: 0,
            weights_bytes: 0,
            activations_bytes: 0,
        };
        let bound = Bound { bytes: 1 << 20, what: "--max-memory (1.0 MiB)".into() };
        let e = |dims: RunDims| check_device_memory(&m, &dims, &bound).unwrap_err().to_string();
        let ranged =
            RunDims { dims: vec![RunDim::ranged("batch", 4, 64), RunDim::ranged("seq", 1, 16)], batch: Some(0) };
        let msg = e(ranged);
        assert!(
            msg.contains("at the largest values of --dim batch=4..64, --dim seq=1..16")
                && msg.ends_with(
                    "; lower the largest value of --dim batch=4..64 or the largest value of --dim seq=1..16"
                )
                && !msg.contains("--max-batch"),
            "{msg}"
        );
        let msg = e(RunDims::batch_only("N", 64));
        assert!(msg.contains("at --max-batch 64 (activation arena") && msg.ends_with("; lower --max-batch"), "{msg}");
        let msg = e(RunDims::none());
        assert!(msg.contains("(fixed shapes)") && !msg.contains("lower") && !msg.contains("--max-batch"), "{msg}");
        assert!(check_device_memory(&m, &RunDims::none(), &Bound { bytes: 3 << 20, what: String::new() }).is_ok());
    }

    #[test]
    fn options_are_checked_against_the_model() {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/pattern_resnet_bottleneck.onnx");
        let g = crate::onnx::load_model(&model).unwrap();
        let mut opts = CompileOptions::default();
        opts.dims.insert("nosuch".into(), 3);
        let e = prepare(g.clone(), &opts).err().expect("unknown dim refused").to_string();
        assert!(e.contains("no symbolic dim 'nosuch'"), "{e}");
        let opts = CompileOptions { max_batch: 0, ..CompileOptions::default() };
        let e = prepare(g.clone(), &opts).err().expect("batch 0 refused").to_string();
        assert!(e.contains("--max-batch 0"), "{e}");
        let opts = CompileOptions { max_memory: Some(1024), ..CompileOptions::default() };
        let e = prepare(g, &opts).err().expect("1 KiB refused").to_string();
        assert!(e.contains("more than --max-memory (1.0 KiB)"), "{e}");
    }
}
