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

use super::validate::DimSpec;
use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::compile::{CompileOptions, GpuTarget, KernelChoice, LIB_NAME};
use onnx2ait::lower::Precision;
use std::path::PathBuf;

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
    /// GPU platform: cuda (NVIDIA: CUTLASS, nvcc) or rocm (AMD MI200/MI300: Composable Kernel,
    /// clang-19 in HIP mode; see scripts/setup-rocm.sh).
    #[arg(long, default_value = "cuda", value_name = "cuda|rocm")]
    pub target: TargetName,
    /// GPU architecture. CUDA: sm_80 (A100), sm_90 (H100/H200 with the sm80-style kernels only),
    /// sm_90a (H100/H200 with the Hopper TMA + wgmma kernels too; the default). ROCm: gfx90a
    /// (MI200) or gfx942 (MI300; the default).
    #[arg(long)]
    pub arch: Option<String>,
    /// Largest run-time batch (when the model's batch dim is symbolic); sizes the activation arena.
    /// [default: 64] A range of the batch dim (--dim batch=1..8) bounds the batch instead; a
    /// --max-batch other than that range's largest value is an error.
    #[arg(long = "max-batch", value_parser = super::validate::parse_batch)]
    pub max_batch: Option<i64>,
    /// GPU memory the library may take (arena, workspace and weights at --max-batch), e.g. 40GiB;
    /// more is an error at compile time. Default: the largest GPU of --arch (sm_80: A100 80GB,
    /// 80 GiB; sm_90/sm_90a: H200, 141 GB).
    #[arg(long = "max-memory", value_name = "SIZE", value_parser = super::checks::parse_size)]
    pub max_memory: Option<u64>,
    /// Fixes a symbolic dim at compile time (--dim seq=128), or makes it a run-time dim with a
    /// range (--dim seq=1..512: one build runs every value in the range; the arena is sized for
    /// the largest). Repeatable. The one symbolic dim given neither is the run-time batch
    /// (1..--max-batch); a range of the batch dim itself (--dim batch=1..8) bounds the batch.
    #[arg(long = "dim", value_name = "NAME=N|NAME=MIN..MAX", value_parser = super::validate::parse_dim_spec)]
    pub dims: Vec<(String, DimSpec)>,
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
    /// Attention subgraphs: `fused` (one kernel per attention, attention.cu.hbs, reading q, k and
    /// v where their projection wrote them, q, k and v projections packed into one product),
    /// `unfused` (the score products, mask add, softmax and head transposes as separate kernels)
    /// or `auto` (default: fused for CUDA, unfused for ROCm, which has no fused kernel yet).
    #[arg(long, default_value = "auto", value_name = "auto|unfused|fused")]
    pub attention: AttentionMode,
    /// Squeeze-and-excitation blocks (EfficientNet, MobileNetV3): `fused` (default: the pooling,
    /// both dense layers and their activations in one kernel, squeeze_excite.cu.hbs, after a
    /// split pooling at small batch, then the scale product) or `unfused` (a global pooling, two
    /// 1x1 convolution kernels and the scale product).
    #[arg(long, default_value = "fused", value_name = "fused|unfused")]
    pub squeeze_excite: SqueezeExciteMode,
    /// Prefix every exported name of the library's C API and every macro of model.h with NAME
    /// (`NAME_o2a_create`, `NAME_O2A_BUILD_HASH`), so that several models' libraries and headers
    /// can be used in one program. Default: the plain `o2a_*` names.
    #[arg(long = "symbol-prefix", value_name = "NAME")]
    pub symbol_prefix: Option<String>,
}

/// How squeeze-and-excitation blocks are compiled (`--squeeze-excite`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SqueezeExciteMode {
    Unfused,
    Fused,
}

impl SqueezeExciteMode {
    pub fn fused(self) -> bool {
        self == SqueezeExciteMode::Fused
    }
}

/// The platform (`--target`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetName {
    Cuda,
    Rocm,
}

impl TargetName {
    /// The profile target for `--arch` (each platform's default when absent).
    pub fn profile_target(self, arch: Option<&str>) -> Result<onnx2ait::profile::ProfileTarget, Failure> {
        use onnx2ait::profile::ProfileTarget;
        Ok(match self {
            TargetName::Cuda => ProfileTarget::Cuda(arch.unwrap_or("sm_90a").parse()?),
            TargetName::Rocm => ProfileTarget::Rocm(arch.unwrap_or("gfx942").parse()?),
        })
    }
}

/// How attention subgraphs are compiled (`--attention`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionMode {
    Auto,
    Unfused,
    Fused,
}

impl From<AttentionMode> for onnx2ait::compile::Attention {
    fn from(m: AttentionMode) -> Self {
        match m {
            AttentionMode::Auto => onnx2ait::compile::Attention::Auto,
            AttentionMode::Unfused => onnx2ait::compile::Attention::Unfused,
            AttentionMode::Fused => onnx2ait::compile::Attention::Fused,
        }
    }
}

impl AttentionMode {
    /// For the commands that only know CUDA (explain, profile): `auto` is fused there.
    pub fn fused_on_cuda(self) -> bool {
        onnx2ait::compile::Attention::from(self).fused_on(onnx2ait::compile::GpuTarget::Cuda)
    }
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}' is not a percentage from 0 to 100")),
    }
}

impl CompileArgs {
    /// The library's options for these arguments.
    fn options(&self) -> Result<CompileOptions, Failure> {
        let kernel_choice = if self.no_profile {
            KernelChoice::Heuristic
        } else if self.profile {
            KernelChoice::Profile(self.profile_cache.clone())
        } else {
            KernelChoice::ProfileCache(self.profile_cache.clone())
        };
        let (target, arch) = match self.target {
            TargetName::Cuda => (GpuTarget::Cuda, self.arch.as_deref().unwrap_or("sm_90a").parse()?),
            TargetName::Rocm => {
                (GpuTarget::Rocm(self.arch.as_deref().unwrap_or("gfx942").parse()?), CompileOptions::default().arch)
            }
        };
        let (fixed, ranges) = super::checks::split_dims(&self.dims)?;
        Ok(CompileOptions {
            target,
            arch,
            max_batch: self.max_batch.unwrap_or(onnx2ait::compile::DEFAULT_MAX_BATCH),
            max_memory: self.max_memory,
            dims: fixed,
            ranges,
            precision: self.precision,
            attention: self.attention.into(),
            fused_squeeze_excite: self.squeeze_excite.fused(),
            kernel_choice,
            profile_gpu: self.profile_gpu.clone(),
            reuse_within: self.reuse_within / 100.0,
            jobs: self.jobs,
            cache_dir: self.cache_dir.clone().or_else(|| std::env::var_os("ONNX2AIT_CACHE_DIR").map(PathBuf::from)),
            build: !self.no_build,
            force: self.force,
            progress: true,
            symbol_prefix: self.symbol_prefix.clone(),
        })
    }
}

/// `onnx2ait::compile` step by step, printing between the steps: the import's warnings, the
/// profiler's report (with --profile), the summary before nvcc's minutes, then what was written.
pub fn run(a: &CompileArgs) -> Result<u8, Failure> {
    ModelArg { model: a.model.clone() }.check()?;
    let opts = a.options()?;
    let g = super::checks::load_model(&a.model)?;
    // Refuses a --max-batch that contradicts a range of the batch dim (the library lets the
    // range govern).
    super::checks::max_batch(&g, &opts.dims, &opts.ranges, a.max_batch, opts.max_batch)?;
    let prepared = onnx2ait::compile::prepare(g, &opts)?;
    if let Some(s) = &prepared.profile_summary {
        super::emit(s);
    }
    let generated = prepared.generate(&a.out)?;
    super::emit(&generated.summary);
    let build = generated.build()?;
    // build() has printed its summary line (progress is on).
    let what = if build.library.is_some() { format!("the sources and {LIB_NAME}") } else { "the sources".into() };
    super::emit(&format!("wrote {what} to {}\n", a.out.display()));
    Ok(0)
}
