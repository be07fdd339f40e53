//! `onnx2ait explain MODEL [--json] [--dot DIR]`: what the equality-saturation optimiser does to
//! a model — op counts before and kernel counts after, every fusion (which ONNX nodes became
//! which kernel), e-graph statistics per phase (classes, nodes, iterations, time, stop reason,
//! rules applied) and the estimated cost before and after.
//!
//! `--json` prints the report in its stable JSON form (documented in README.md, "Optimiser").
//! `--dot DIR` writes `DIR/before.dot` and `DIR/after.dot` (and `.svg` next to them when
//! Graphviz `dot` is installed).

use super::{emit, Failure, ModelArg};
use clap::Args;
use onnx2ait::egraph::{optimize, write_dot, OptimizeOptions};
use std::path::PathBuf;

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
}

pub fn run(a: &ExplainArgs) -> Result<u8, Failure> {
    a.model.check()?;
    let g = onnx2ait::onnx::load_model(&a.model.model)?;
    let opts = OptimizeOptions::standard()?;
    let (optimised, report) = optimize(&g, &opts)?;
    if let Some(dir) = &a.dot {
        std::fs::create_dir_all(dir).map_err(|e| Failure::new(1, format!("{}: {e}", dir.display())))?;
        for (name, graph) in [("before", &g), ("after", &optimised)] {
            let path = dir.join(format!("{name}.dot"));
            write_dot(graph, &path).map_err(|e| Failure::new(1, format!("{}: {e}", path.display())))?;
        }
    }
    if a.json {
        emit(&format!("{}\n", report.to_json()));
    } else {
        emit(&report.to_string());
    }
    Ok(0)
}
