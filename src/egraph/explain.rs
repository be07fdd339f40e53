//! The optimiser's report (`onnx2ait explain`): op counts before and after, every fusion, e-graph
//! statistics per phase, estimated cost; and Graphviz output of IR graphs.
//!
//! JSON form (stable; later stages read it):
//! - `model`: source path;
//! - `ops_before`: ONNX op type → count;
//! - `kernels_after`: kernel kind → count (`conv`, `gemm`, `elementwise`, `pool`, `layernorm`,
//!   `transpose`, `reduce`, `reshape`, or the lower-case ONNX op type of nodes kept as they were,
//!   e.g. `softmax`);
//! - `fusions`: `[{kernel, node, detail, onnx_nodes}]`, one per kernel that covers two or more
//!   ONNX nodes;
//! - `phases`: `[{name, classes, nodes, iterations, time_ms, stop_reason, rules_applied}]`;
//! - `cost_before`, `cost_after`: estimated run time in microseconds under the cost model the
//!   optimisation ran with (the analytical model by default; with a profile cache, measured
//!   kernel times where it has them, see `profile::cost`); `cost_after` is the extracted graph's
//!   cost before elementwise chains are merged, so it is an upper bound (each merged chain is
//!   still priced as separate kernels);
//! - `warnings`: type conflicts met in the e-graph (empty when every rule is sound).
//!
//! `onnx2ait explain --profile-cache` appends one key, `kernel_costs` (`profile::cost::CostReport`):
//! each conv / gemm kernel's cost and whether it was measured or estimated.

use super::runner::PhaseStats;
use crate::ir::ops::kernel::{Conv2d, Elementwise, Gemm};
use crate::ir::Graph;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Fusion {
    /// Kernel kind (`conv`, `gemm`, …).
    pub kernel: String,
    /// Name of the kernel node in the optimised graph.
    pub node: String,
    /// What the kernel does, e.g. `conv+bias+residual+relu`.
    pub detail: String,
    /// The ONNX nodes it replaces, in graph order.
    pub onnx_nodes: Vec<String>,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ExplainReport {
    pub model: String,
    pub ops_before: BTreeMap<String, usize>,
    pub kernels_after: BTreeMap<String, usize>,
    pub fusions: Vec<Fusion>,
    pub phases: Vec<PhaseStats>,
    /// Microseconds.
    pub cost_before: f64,
    /// Microseconds.
    pub cost_after: f64,
    pub warnings: Vec<String>,
}

impl ExplainReport {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }
}

/// A one-line description of what a kernel node computes.
pub fn kernel_detail(n: &crate::ir::Node) -> String {
    if let Some(c) = n.op.downcast_ref::<Conv2d>() {
        let mut s = format!("conv[{}]", c.layout.name());
        if n.inputs.get(2).copied().flatten().is_some() {
            s.push_str("+bias");
        }
        if let Some(a) = c.pre_act {
            s.push_str(&format!("+{a}"));
        }
        if n.inputs.get(3).copied().flatten().is_some() {
            s.push_str("+residual");
        }
        if let Some(a) = c.act {
            s.push_str(&format!("+{a}"));
        }
        return s;
    }
    if let Some(g) = n.op.downcast_ref::<Gemm>() {
        let mut s = "gemm".to_string();
        if n.inputs.get(2).copied().flatten().is_some() {
            s.push_str("+bias");
        }
        if n.inputs.get(3).copied().flatten().is_some() {
            s.push_str("+residual");
        }
        if let Some(a) = g.act {
            s.push_str(&format!("+{a}"));
        }
        return s;
    }
    if let Some(e) = n.op.downcast_ref::<Elementwise>() {
        return e.expr.to_string();
    }
    if let Some(se) = n.op.downcast_ref::<crate::ir::ops::kernel::SqueezeExciteScale>() {
        // `squeeze_excite[gap,1x1+bias+silu,1x1+bias+sigmoid]`: the pooling and each dense layer.
        let layer = |bias: usize, act: Option<crate::ir::ops::kernel::Act>| {
            let mut l = "1x1".to_string();
            if n.inputs.get(bias).copied().flatten().is_some() {
                l.push_str("+bias");
            }
            if let Some(a) = act {
                l.push_str(&format!("+{a}"));
            }
            l
        };
        return format!("squeeze_excite[gap,{},{}]", layer(2, se.act), layer(4, se.gate));
    }
    n.op_type.clone()
}

impl fmt::Display for ExplainReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "model: {}", self.model)?;
        let before: usize = self.ops_before.values().sum();
        let after: usize = self.kernels_after.values().sum();
        writeln!(f, "ops before: {before}")?;
        for (k, v) in &self.ops_before {
            writeln!(f, "  {k:<24} {v}")?;
        }
        writeln!(f, "kernels after: {after}")?;
        for (k, v) in &self.kernels_after {
            writeln!(f, "  {k:<24} {v}")?;
        }
        writeln!(f, "phases:")?;
        for p in &self.phases {
            writeln!(
                f,
                "  {:<10} {:>6} classes {:>7} nodes {:>3} iterations {:>9.1} ms  {}",
                p.name, p.classes, p.nodes, p.iterations, p.time_ms, p.stop_reason
            )?;
            let fired: Vec<String> =
                p.rules_applied.iter().filter(|(_, n)| **n > 0).map(|(r, n)| format!("{r}×{n}")).collect();
            if !fired.is_empty() {
                writeln!(f, "             rules: {}", fired.join(", "))?;
            }
        }
        writeln!(f, "fusions: {}", self.fusions.len())?;
        for fu in &self.fusions {
            writeln!(f, "  {} ({}) <- {}", fu.node, fu.detail, fu.onnx_nodes.join(", "))?;
        }
        writeln!(f, "estimated time: {:.1} µs -> {:.1} µs", self.cost_before, self.cost_after)?;
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        Ok(())
    }
}

/// Graphviz text of an IR graph: nodes as boxes (name and op), values as edges.
pub fn to_dot(g: &Graph) -> String {
    let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
    let mut out = String::from("digraph G {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\"];\n");
    let producers = g.producers();
    for &i in &g.inputs {
        out.push_str(&format!("  v{i} [shape=ellipse, label=\"{}\"];\n", esc(&g.values[i].name)));
    }
    for (n, node) in g.nodes.iter().enumerate() {
        let label = format!("{}\\n{}", esc(&node.name), esc(&kernel_detail(node)));
        out.push_str(&format!("  n{n} [label=\"{label}\"];\n"));
        for v in node.inputs.iter().flatten() {
            if g.values[*v].konst.is_some() {
                continue;
            }
            let ty = g.values[*v].ty.as_ref().map(|t| t.to_string()).unwrap_or_default();
            let from = match producers[*v] {
                Some(p) => format!("n{p}"),
                None => format!("v{v}"),
            };
            out.push_str(&format!("  {from} -> n{n} [label=\"{}\"];\n", esc(&ty)));
        }
    }
    for &o in &g.outputs {
        out.push_str(&format!("  o{o} [shape=ellipse, label=\"{}\"];\n", esc(&g.values[o].name)));
        if let Some(p) = producers[o] {
            out.push_str(&format!("  n{p} -> o{o};\n"));
        }
    }
    out.push_str("}\n");
    out
}

/// Writes `path` (Graphviz) and, when the `dot` program is installed, the SVG beside it.
pub fn write_dot(g: &Graph, path: &Path) -> std::io::Result<()> {
    std::fs::write(path, to_dot(g))?;
    let svg = path.with_extension("svg");
    // `dot` is optional: without it only the .dot file is written.
    if let Ok(status) = std::process::Command::new("dot").arg("-Tsvg").arg(path).arg("-o").arg(&svg).status() {
        if !status.success() {
            return Err(std::io::Error::other(format!("dot failed on {}", path.display())));
        }
    }
    Ok(())
}
