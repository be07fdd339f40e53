//! `onnx2ait explain MODEL [--json] [--dot DIR] [--profile-cache FILE [--profile-gpu NAME]
//! [--arch ARCH] [--batch B] [--dim NAME=N|NAME=MIN..MAX]]`: what the equality-saturation optimiser does to a
//! model — op counts before and kernel counts after, every fusion (which ONNX nodes became which
//! kernel), e-graph statistics per phase (classes, nodes, iterations, time, stop reason, rules
//! applied) and the estimated cost before and after.
//!
//! With `--profile-cache`, extraction uses the measured kernel times of that cache (as
//! `onnx2ait compile` does; see `onnx2ait::profile::cost`), and the report adds every
//! convolution and matrix product kernel with its cost and whether it was measured or
//! estimated, and the line "N of M conv/gemm costs measured". Costs are taken at batch `--batch`
//! (default 64, compile's default `--max-batch`, where compile prices them; or the largest value
//! of a `--dim` range of the batch dim), and every ranged dim at its largest value.
//!
//! `--json` prints the report in its stable JSON form (documented in README.md, "Optimiser");
//! with `--profile-cache` it has one more key, `kernel_costs` (see `profile::cost::CostReport`).
//! `--dot DIR` writes `DIR/before.dot` and `DIR/after.dot` (and `.svg` next to them when
//! Graphviz `dot` is installed), and says on stderr which files it wrote and when `dot` was not
//! found.

use super::{emit, Failure, ModelArg};
use clap::Args;
use onnx2ait::egraph::explain::to_dot;
use onnx2ait::egraph::{optimize, optimize_with_cost, ExplainReport, OptimizeOptions};
use onnx2ait::ir::Graph;
use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::cuda::CudaTarget;
use onnx2ait::lower::target::ProfiledTarget;
use onnx2ait::profile::cache::ProfileCache;
use onnx2ait::profile::cost::{CostReport, MeasuredCost};
use serde::Serialize;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The JSON report with the kernel costs after its own keys (their order kept).
#[derive(Serialize)]
struct WithCosts<'a> {
    #[serde(flatten)]
    report: &'a ExplainReport,
    kernel_costs: &'a CostReport,
}

/// Compile's default `--max-batch`: the batch compile prices kernels at.
const DEFAULT_PRICING_BATCH: i64 = 64;

#[derive(Args, Debug, Clone)]
pub struct ExplainArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Write Graphviz files of the graph before and after optimisation into this directory.
    #[arg(long, value_name = "DIR")]
    pub dot: Option<PathBuf>,
    /// Price convolutions and matrix products with the measured times of this profile cache
    /// (written by `onnx2ait profile`), and list each kernel's cost.
    #[arg(long = "profile-cache", value_name = "FILE")]
    pub profile_cache: Option<PathBuf>,
    /// The GPU whose times to use when the profile cache has several (as `profile` names it).
    #[arg(long = "profile-gpu", value_name = "NAME", requires = "profile_cache")]
    pub profile_gpu: Option<String>,
    /// GPU architecture of the times (as for compile): sm_80, sm_90, sm_90a.
    #[arg(long, default_value = "sm_90a", requires = "profile_cache")]
    pub arch: String,
    /// Batch to price at: the batch symbol takes this value. The profile has times at batch 1,
    /// 8, 64 and its --max-batch. Default 64 (compile's default --max-batch).
    #[arg(long, requires = "profile_cache", value_parser = clap::value_parser!(i64).range(1..))]
    pub batch: Option<i64>,
    /// As compile's --dim (repeatable): fixes a symbolic dim before optimising (--dim seq=128),
    /// or makes it a run-time dim with a range (--dim seq=1..512), priced at its largest value as
    /// compile prices it. A range of the batch dim sets the pricing batch (its largest value).
    #[arg(long = "dim", value_name = "NAME=N|NAME=MIN..MAX", value_parser = super::validate::parse_dim_spec, requires = "profile_cache")]
    pub dims: Vec<(String, super::validate::DimSpec)>,
    /// Attention subgraphs fused into one kernel each or not, as compile's --attention (`auto`,
    /// the default, is fused: explain prices the CUDA target).
    #[arg(long, default_value = "auto", value_name = "auto|unfused|fused")]
    pub attention: super::compile::AttentionMode,
    /// Squeeze-and-excitation blocks with their scale computed by one kernel each (default) or
    /// unfused, as compile's --squeeze-excite.
    #[arg(long, default_value = "fused", value_name = "fused|unfused")]
    pub squeeze_excite: super::compile::SqueezeExciteMode,
}

pub fn run(a: &ExplainArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let mut g = super::checks::load_model(&a.model.model)?;
    let (fixed, ranges) = super::checks::split_dims(&a.dims)?;
    let pairs: Vec<(String, i64)> = fixed.into_iter().collect();
    let dims = super::checks::check_dims(&g, &pairs)?;
    onnx2ait::compile::checks::check_ranges(&g, &ranges, &dims)?;
    // As compile does: the fixed dims are numbers before optimising; the ranged ones stay
    // symbols, priced at their largest values (`LowerOptions::pricing_dims`).
    onnx2ait::ir::specialize::bind_dims(&mut g, &dims)?;
    let batch = super::checks::batch_bound(&g, &dims, &ranges, a.batch, DEFAULT_PRICING_BATCH, "--batch")?;
    let mut pricing = dims.clone();
    pricing.extend(ranges.iter().map(|(s, &(_, max))| (s.clone(), max)));
    let opts = OptimizeOptions::pipeline(a.attention.fused_on_cuda())?.with_squeeze_excite(a.squeeze_excite.fused())?;
    let (optimised, report, costs) = match &a.profile_cache {
        None => {
            let (optimised, report) = optimize(&g, &opts)?;
            (optimised, report, None)
        }
        Some(file) => {
            let arch: Arch = a.arch.parse()?;
            let (target, source) = measured_target(file, arch, a.profile_gpu.as_deref())?;
            let cost = MeasuredCost::new(&target, batch).with_dims(pricing.clone());
            let (optimised, report) = optimize_with_cost(&g, &opts, &cost)?;
            let costs = CostReport { source, ..cost.kernel_costs(&optimised) };
            (optimised, report, Some(costs))
        }
    };
    if let Some(dir) = &a.dot {
        write_dots(dir, &[("before", &g), ("after", &optimised)])?;
    }
    if a.json {
        let text = match &costs {
            None => report.to_json(),
            Some(kernel_costs) => serde_json::to_string_pretty(&WithCosts { report: &report, kernel_costs })
                .map_err(|e| Failure::new(1, e.to_string()))?,
        };
        emit(&format!("{text}\n"));
    } else {
        let mut text = report.to_string();
        if let Some(costs) = &costs {
            text.push_str(&costs.to_string());
        }
        emit(&text);
    }
    Ok(0)
}

/// Writes `DIR/<name>.dot` for each graph and, when Graphviz `dot` is installed, `DIR/<name>.svg`;
/// says on stderr (stdout may be the JSON report) which files it wrote, and when `dot` was not
/// found.
fn write_dots(dir: &Path, graphs: &[(&str, &Graph)]) -> Result<(), Failure> {
    std::fs::create_dir_all(dir).map_err(|e| Failure::new(1, format!("--dot {}: {e}", dir.display())))?;
    let mut wrote: Vec<String> = Vec::new();
    let mut no_dot: Option<String> = None;
    for (name, graph) in graphs {
        let path = dir.join(format!("{name}.dot"));
        std::fs::write(&path, to_dot(graph))
            .map_err(|e| Failure::new(1, format!("{}: cannot write: {e}", path.display())))?;
        wrote.push(path.display().to_string());
        if no_dot.is_some() {
            continue;
        }
        let svg = path.with_extension("svg");
        match std::process::Command::new("dot").arg("-Tsvg").arg(&path).arg("-o").arg(&svg).output() {
            Ok(o) if o.status.success() => wrote.push(svg.display().to_string()),
            Ok(o) => {
                return Err(Failure::new(
                    1,
                    format!(
                        "Graphviz dot failed on {} ({}): {}",
                        path.display(),
                        o.status,
                        String::from_utf8_lossy(&o.stderr).trim()
                    ),
                ))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                no_dot = Some(
                    "Graphviz `dot` was not found on PATH: no .svg files written (install graphviz for them)".into(),
                )
            }
            Err(e) => no_dot = Some(format!("Graphviz `dot` could not be run ({e}): no .svg files written")),
        }
    }
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "wrote {}", wrote.join(", "));
    if let Some(why) = no_dot {
        let _ = writeln!(err, "{why}");
    }
    Ok(())
}

/// The target with the cache's times for `arch` and this machine's nvcc and CUTLASS (the times
/// hold for the code this toolchain produces), and a description of where they come from. A
/// cache without times for the toolchain still explains, every cost estimated.
fn measured_target(file: &std::path::Path, arch: Arch, gpu: Option<&str>) -> Result<(CudaTarget, String), Failure> {
    if !file.exists() {
        return Err(Failure::new(1, format!("profile cache {}: no such file", file.display())));
    }
    let cache = ProfileCache::open(file)?;
    let toolchain = onnx2ait::profile::Toolchain::discover(onnx2ait::profile::ProfileTarget::Cuda(arch))?;
    let target = CudaTarget::new(arch);
    Ok(match onnx2ait::profile::measurements_for(&cache, &toolchain, gpu)? {
        Some((device, m)) => (target.with_measurements(m), format!("times of {device} from {}", file.display())),
        None => (
            target,
            format!(
                "{} has no times for {} with this nvcc and CUTLASS: every cost estimated",
                file.display(),
                arch.as_str()
            ),
        ),
    })
}
