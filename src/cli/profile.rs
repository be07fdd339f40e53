//! `onnx2ait profile MODEL`: time every candidate library instance of the model's convolutions
//! and matrix products on this machine's GPU and store the times in the profile cache, which
//! `onnx2ait compile` then uses to pick instances (see `onnx2ait::profile`).

use super::validate::DimSpec;
use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::build::BuildOptions;
use onnx2ait::egraph::OptimizeOptions;
use onnx2ait::ir::Graph;
use onnx2ait::lower::LowerOptions;
use onnx2ait::profile::{self, ProfileOptions, ProfileTarget};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// GPU platform (as for compile): cuda times CUTLASS instances (nvcc), rocm Composable Kernel
    /// instances (clang-19 in HIP mode; the profiler then runs on an AMD GPU).
    #[arg(long, default_value = "cuda", value_name = "cuda|rocm")]
    pub target: super::compile::TargetName,
    /// GPU architecture (as for compile): CUDA sm_80, sm_90, sm_90a (the default; adds the Hopper
    /// TMA + wgmma candidates); ROCm gfx90a or gfx942 (the default).
    #[arg(long)]
    pub arch: Option<String>,
    /// Largest run-time batch: problems are profiled at batch 1, 8, 64 and this (those below it).
    /// [default: 64] A range of the batch dim (--dim batch=1..8) bounds the batch instead, as
    /// for compile; a --max-batch other than that range's largest value is an error.
    #[arg(long = "max-batch", value_parser = super::validate::parse_batch)]
    pub max_batch: Option<i64>,
    /// As compile's --dim (repeatable): fixes a symbolic dim (--dim seq=128), or makes it a
    /// run-time dim with a range (--dim seq=1..512): products whose sizes depend on it are then
    /// profiled at each of its ranges' largest values (1, 8, 64 and 512), for each batch range,
    /// as compile with the same --dim chooses them.
    #[arg(long = "dim", value_name = "NAME=N|NAME=MIN..MAX", value_parser = super::validate::parse_dim_spec)]
    pub dims: Vec<(String, DimSpec)>,
    /// Profile cache file (default: $ONNX2AIT_PROFILE_CACHE or ~/.cache/onnx2ait/profile.json).
    #[arg(long = "cache", value_name = "FILE")]
    pub cache: Option<PathBuf>,
    /// Where the profiler's sources and library go (default: beside the cache file).
    #[arg(long = "work-dir", value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Parallel nvcc jobs (default: cores, limited by available memory).
    #[arg(long, value_parser = super::parse_jobs)]
    pub jobs: Option<usize>,
    /// Object cache shared with model builds (default: WORK_DIR/obj; env ONNX2AIT_CACHE_DIR).
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Untimed runs before timing each candidate.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub warmup: u32,
    /// Timed runs per candidate (the median is kept).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub iters: u32,
    /// As compile's --attention: the products of the graph compile optimises with it are the
    /// ones to profile (fused attention packs the q, k and v projections into one product).
    #[arg(long, default_value = "auto", value_name = "auto|unfused|fused")]
    pub attention: super::compile::AttentionMode,
    /// As compile's --squeeze-excite.
    #[arg(long, default_value = "fused", value_name = "fused|unfused")]
    pub squeeze_excite: super::compile::SqueezeExciteMode,
    /// Build the profiler library and stop (no GPU needed); a later run times the candidates
    /// without compiling anything.
    #[arg(long = "build-only")]
    pub build_only: bool,
    /// Candidate sources one part of the profile compiles before its problems are timed and
    /// saved in the cache [default: 3 per nvcc job]. A profile stopped while compiling keeps the
    /// parts timed before it; the next run resumes after them.
    #[arg(long = "part-sources", value_name = "N", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub part_sources: Option<u64>,
    /// Print the report as JSON (progress stays on stderr).
    #[arg(long)]
    pub json: bool,
    /// Also write the per-problem report as JSON.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
}

/// The cache file from an option, the environment or the default location.
pub fn cache_path(given: Option<&PathBuf>) -> Result<PathBuf, Failure> {
    given
        .cloned()
        .or_else(profile::cache::default_path)
        .ok_or_else(|| Failure::new(1, "no profile cache location: pass --cache FILE or set ONNX2AIT_PROFILE_CACHE"))
}

/// The model as compile with the same `--dim` optimises it (fixed dims bound, so what reads them
/// folds as in the build the profile is for) and the lowering options: fixed dims, run-time
/// ranges, `--max-batch`. Checks the dims against the model and every tensor's size at the
/// largest values (ranges at their largest, the batch at `--max-batch`) against the largest GPU
/// of `arch`, with checked arithmetic: the profiled problems run at those sizes.
fn model_and_options(a: &ProfileArgs, target: ProfileTarget) -> Result<(Graph, LowerOptions), Failure> {
    let mut g = super::checks::load_model(&a.model.model)?;
    let (fixed, ranges) = super::checks::split_dims(&a.dims)?;
    let pairs: Vec<(String, i64)> = fixed.iter().map(|(k, v)| (k.clone(), *v)).collect();
    let dims = super::checks::check_dims(&g, &pairs)?;
    onnx2ait::compile::checks::check_ranges(&g, &ranges, &dims)?;
    onnx2ait::ir::specialize::bind_dims(&mut g, &dims)?;
    let max_batch = super::checks::max_batch(&g, &dims, &ranges, a.max_batch, onnx2ait::compile::DEFAULT_MAX_BATCH)?;
    let (env, context) = super::checks::largest_dims(&g, &dims, &ranges, max_batch);
    let bound = match target {
        ProfileTarget::Cuda(arch) => onnx2ait::compile::checks::gpu_memory_bound(arch),
        ProfileTarget::Rocm(arch) => onnx2ait::compile::checks::rocm_memory_bound(arch),
    };
    super::checks::check_sizes(&g, &env, None, super::checks::host_bytes, &bound, &context)?;
    Ok((g, LowerOptions { dims, ranges, max_batch, ..LowerOptions::default() }))
}

pub fn run(a: &ProfileArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let target = a.target.profile_target(a.arch.as_deref())?;
    let (g, lower) = model_and_options(a, target)?;
    let cache = cache_path(a.cache.as_ref())?;
    let work_dir = a.work_dir.clone().unwrap_or_else(|| profile::default_work_dir(&cache));
    let cache_dir = a.cache_dir.clone().or_else(|| std::env::var_os("ONNX2AIT_CACHE_DIR").map(PathBuf::from));
    let optimize =
        OptimizeOptions::pipeline(a.attention.fused_on_cuda())?.with_squeeze_excite(a.squeeze_excite.fused())?;
    let opts = ProfileOptions {
        target,
        lower,
        optimize,
        cache,
        work_dir,
        build: BuildOptions { jobs: a.jobs, cache_dir, progress: true, ..Default::default() },
        warmup: a.warmup,
        iters: a.iters,
        progress: true,
        build_only: a.build_only,
        part_sources: a.part_sources.map(|n| n as usize),
    };
    let report = profile::profile(&g, &opts)?;
    if a.build_only {
        super::emit(&format!("built the profiler in {:.1} s ({})\n", report.build_seconds, opts.work_dir.display()));
        return Ok(0);
    }
    if let Some(path) = &a.report {
        let text = serde_json::to_string_pretty(&report).map_err(|e| Failure::new(1, e.to_string()))? + "\n";
        std::fs::write(path, text).map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", path.display())))?;
    }
    if a.json {
        let text = serde_json::to_string_pretty(&report).map_err(|e| Failure::new(1, e.to_string()))? + "\n";
        super::emit(&text);
    } else {
        super::emit(&report.summary());
    }
    Ok(0)
}
