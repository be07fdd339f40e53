//! `onnx2ait profile MODEL`: time every candidate library instance of the model's convolutions
//! and matrix products on this machine's GPU and store the times in the profile cache, which
//! `onnx2ait compile` then uses to pick instances (see `onnx2ait::profile`).

use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::build::BuildOptions;
use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::LowerOptions;
use onnx2ait::profile::{self, ProfileOptions};
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// GPU architecture (as for compile): sm_90a adds the Hopper (TMA + wgmma) candidates.
    #[arg(long, default_value = "sm_90a")]
    pub arch: String,
    /// Largest run-time batch: problems are profiled at batch 1, 8, 64 and this (those below it).
    #[arg(long = "max-batch", default_value_t = 64, value_parser = super::validate::parse_batch)]
    pub max_batch: i64,
    /// Fixes a symbolic dim at compile time (repeatable): --dim seq=128.
    #[arg(long = "dim", value_name = "NAME=N", value_parser = super::validate::parse_dim)]
    pub dims: Vec<(String, i64)>,
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
    /// Build the profiler library and stop (no GPU needed); a later run times the candidates
    /// without compiling anything.
    #[arg(long = "build-only")]
    pub build_only: bool,
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

pub fn run(a: &ProfileArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let arch: Arch = a.arch.parse()?;
    let g = super::checks::load_model(&a.model.model)?;
    let dims = super::checks::check_dims(&g, &a.dims)?;
    // The profiled problems run on this GPU at --max-batch: their sizes must fit the largest GPU
    // of the architecture, computed without overflow.
    let mut env = dims.clone();
    let free: Vec<String> = super::checks::symbols(&g).into_iter().filter(|s| !dims.contains_key(s)).collect();
    if let [batch] = free.as_slice() {
        env.insert(batch.clone(), a.max_batch);
    }
    let bound = super::checks::gpu_memory_bound(arch);
    let context = format!("at --max-batch {}", a.max_batch);
    super::checks::check_sizes(&g, &env, None, super::checks::host_bytes, &bound, &context)?;
    let cache = cache_path(a.cache.as_ref())?;
    let work_dir = a.work_dir.clone().unwrap_or_else(|| profile::default_work_dir(&cache));
    let cache_dir = a.cache_dir.clone().or_else(|| std::env::var_os("ONNX2AIT_CACHE_DIR").map(PathBuf::from));
    let opts = ProfileOptions {
        arch,
        lower: LowerOptions { dims, max_batch: a.max_batch, ..LowerOptions::default() },
        cache,
        work_dir,
        build: BuildOptions { jobs: a.jobs, cache_dir, progress: true, ..Default::default() },
        warmup: a.warmup,
        iters: a.iters,
        progress: true,
        build_only: a.build_only,
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
