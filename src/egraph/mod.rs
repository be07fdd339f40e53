//! Equality-saturation optimiser (issue 4): the IR graph goes into an e-graph, phased rewriting
//! discovers fused kernels and layouts, DAG-aware extraction picks the cheapest graph, and the
//! result comes back as an IR graph of kernel-level ops that the reference executor runs.
//!
//! Modules: [`language`] (the e-graph language), [`analysis`] (dtype/shape/layout/constness,
//! by calling each denoted op's `infer`), [`rules`] (the `rewrites/*.rules` parser and the
//! predicate registry), [`runner`] (phases), [`extract`] (cost model and DAG-aware extraction),
//! [`from_ir`] / [`to_ir`], [`views`] (strided attention operands and packed projections,
//! after extraction), [`channel_padding`] (odd channel counts padded in the producing
//! convolution's weights, after extraction), [`explain`] (the report and Graphviz output).
//!
//! Three steps happen outside the rewrite rules, on purpose:
//! - Extraction never computes a conv or gemm twice: when two chosen kernels would each absorb
//!   the same producer into their epilogue, those fused forms are banned and extraction reruns
//!   (see [`extract::extract`]); the cost model alone would accept recomputing a small conv to
//!   save a launch.
//! - A BatchNormalization's original implementation is only a fallback: where the cleanup
//!   rules rewrote it into a per-channel scale+shift, extraction takes the rewrite (see
//!   [`extract::extract`]), which the per-node cost model would otherwise price as two
//!   elementwise kernels against one, not seeing the chain fusion below.
//! - Chains of elementwise kernels are merged after extraction
//!   ([`to_ir::fuse_elementwise_chains`]): a fused elementwise kernel is an expression over any
//!   number of inputs, which fixed-arity patterns cannot express without one rule per shape of
//!   expression, and merging a single-reader producer into its reader is always profitable (one
//!   launch and one round trip through memory fewer), so there is no choice for the e-graph to
//!   make.
//!
//! Performance: the analysis folds weight-only subgraphs (BN scales into conv weights, KRSC
//! transposes) by evaluating them, so constants are interned by a sampled content fingerprint
//! (confirmed by full comparison), a commuted twin of a folded product reuses its value, and the
//! reference kernels used for folding avoid per-element dynamic indexing.
//! `scripts/bench-optimiser.sh` measures ResNet-50 and BERT-12 in a release build.

pub mod analysis;
pub mod channel_padding;
pub mod explain;
pub mod extract;
pub mod from_ir;
pub mod language;
pub mod rules;
pub mod runner;
pub mod se_fold;
pub mod to_ir;
pub mod views;

pub use explain::{write_dot, ExplainReport, Fusion};
pub use extract::{AnalyticalCost, CostModel};
pub use runner::{Phase, PhaseStats};

use crate::error::{Error, Result};
use crate::ir::Graph;
use egg::Id;
use std::collections::{BTreeMap, BTreeSet};

/// The name prefix of the rules that make fused attention kernels.
pub const ATTENTION_RULE_PREFIX: &str = "attention-";

/// The phase of rewrites/squeeze_excite.rules ([`OptimizeOptions::with_squeeze_excite`]).
pub const SQUEEZE_EXCITE_PHASE: &str = "squeeze-excite";

/// What `optimize` runs.
#[derive(Clone)]
pub struct OptimizeOptions {
    pub phases: Vec<Phase>,
    /// Fuse chains of elementwise kernels after extraction.
    pub fuse_elementwise_chains: bool,
    /// Fold the layout ops around fused attention into strided views, and pack q, k and v
    /// projections into one product ([`views`]), after extraction.
    pub attention_views: bool,
    /// Before the e-graph: gathers through iota-built indices become reshapes and logic ops
    /// with a neutral constant become their operand ([`crate::ir::index_views`]).
    pub index_views: bool,
    /// Fold the channel padding a convolution's input needs into its producer's and its own
    /// weights ([`channel_padding`]), after extraction.
    pub pad_channels_into_producers: bool,
    /// Fold each squeeze-and-excitation scale into the next 1x1 convolution's weights where
    /// that moves fewer bytes than the product ([`se_fold`]), after extraction.
    pub scale_into_projections: bool,
}

impl OptimizeOptions {
    /// The standard pipeline: cleanup → layout → fusion → cleanup, rules from `rewrites/`,
    /// attention left unfused, which every target can lower (`compile` fuses it for CUDA by
    /// default; see [`Self::pipeline`]).
    pub fn standard() -> Result<OptimizeOptions> {
        Self::pipeline(false)
    }

    /// The standard pipeline with (`fused_attention`) or without the attention rules of
    /// fusion.rules (those named `attention-*`, which make the fused `kernel::Attention`).
    /// Without them (`compile --attention unfused`, and the default for ROCm, which has no fused
    /// kernel) the score products, softmax and head transposes stay separate kernels. The
    /// analytical cost model cannot weigh the two against each other, so the choice is made per
    /// target from measurements (README, BENCHMARKS.md): on CUDA the fused kernel validates for
    /// BERT-base and ViT-B/16 and runs them faster, so `--attention auto` fuses there.
    pub fn pipeline(fused_attention: bool) -> Result<OptimizeOptions> {
        let rule_err = |e: rules::RuleError| Error::Other(e.to_string());
        let mut phases = vec![
            Phase::from_file("cleanup", "cleanup.rules").map_err(rule_err)?,
            Phase::from_file("layout", "layout.rules").map_err(rule_err)?,
            Phase::from_file("fusion", "fusion.rules").map_err(rule_err)?,
            Phase::from_file("cleanup", "cleanup.rules").map_err(rule_err)?,
        ];
        if !fused_attention {
            for p in &mut phases {
                p.rules.retain(|r| !r.name.starts_with(ATTENTION_RULE_PREFIX));
            }
        }
        Ok(OptimizeOptions {
            phases,
            fuse_elementwise_chains: true,
            attention_views: true,
            index_views: true,
            pad_channels_into_producers: true,
            scale_into_projections: true,
        })
    }

    /// With `fused`, adds the squeeze-excite phase (rewrites/squeeze_excite.rules) after fusion:
    /// each squeeze-and-excitation block's pooling, two 1x1 convolutions and activations become
    /// one `kernel::SqueezeExciteScale` (`compile --squeeze-excite fused`, the compile default,
    /// [`crate::compile::CompileOptions`]). The standard pipeline leaves it out, so the other
    /// phases' tests see the unfused blocks.
    pub fn with_squeeze_excite(mut self, fused: bool) -> Result<OptimizeOptions> {
        self.phases.retain(|p| p.name != SQUEEZE_EXCITE_PHASE);
        if fused {
            let phase = Phase::from_file(SQUEEZE_EXCITE_PHASE, "squeeze_excite.rules")
                .map_err(|e| Error::Other(e.to_string()))?;
            let at = self.phases.iter().position(|p| p.name == "fusion").map_or(self.phases.len(), |i| i + 1);
            self.phases.insert(at, phase);
        }
        Ok(self)
    }

    /// No rewriting: the graph goes through the e-graph and back unchanged (a round-trip check).
    pub fn no_rules() -> OptimizeOptions {
        OptimizeOptions {
            phases: Vec::new(),
            fuse_elementwise_chains: false,
            attention_views: false,
            index_views: false,
            pad_channels_into_producers: false,
            scale_into_projections: false,
        }
    }
}

/// Optimises an inferred graph. Returns the kernel-level graph and the explain report.
pub fn optimize(g: &Graph, opts: &OptimizeOptions) -> Result<(Graph, ExplainReport)> {
    optimize_with_cost(g, opts, &AnalyticalCost::default())
}

/// `optimize` with another cost model.
pub fn optimize_with_cost(g: &Graph, opts: &OptimizeOptions, cost: &dyn CostModel) -> Result<(Graph, ExplainReport)> {
    let path = g.info.source.clone();
    let ops_before = g.op_histogram();
    let simplified;
    let g = if opts.index_views {
        let mut s = g.clone();
        crate::ir::index_views::simplify(&mut s)?;
        simplified = s;
        &simplified
    } else {
        g
    };
    let imported = from_ir::from_ir(g)?;
    let roots = imported.roots.clone();
    let mut eg = imported.eg;
    let before = extract::extract(&eg, &roots, cost).map_err(|m| Error::model(&path, format!("optimiser: {m}")))?;
    let mut phases = Vec::new();
    for phase in &opts.phases {
        let (next, stats) = runner::run_phase(eg, phase).map_err(|e| Error::Other(e.to_string()))?;
        eg = next;
        phases.push(stats);
    }
    let ex = extract::extract(&eg, &roots, cost).map_err(|m| Error::model(&path, format!("optimiser: {m}")))?;
    let mut lowered = to_ir::to_ir(&eg, &ex, g)?;
    if opts.fuse_elementwise_chains {
        to_ir::fuse_elementwise_chains(&mut lowered.graph, &mut lowered.node_class);
    }
    if opts.attention_views {
        views::fold_attention_views(&mut lowered);
    }
    if opts.pad_channels_into_producers {
        channel_padding::pad_channels_into_producers(&mut lowered.graph);
    }
    if opts.scale_into_projections {
        se_fold::fold_scale_into_projections(&mut lowered);
    }
    let fusions = attribute(&eg, &imported.node_classes, &imported.node_inputs, g, &lowered);
    let mut kernels_after = BTreeMap::new();
    for n in &lowered.graph.nodes {
        *kernels_after.entry(to_ir::kernel_name(n)).or_insert(0) += 1;
    }
    let report = ExplainReport {
        model: path,
        ops_before,
        kernels_after,
        fusions,
        phases,
        cost_before: before.cost_ps as f64 / 1e6,
        cost_after: ex.cost_ps as f64 / 1e6,
        warnings: eg.analysis.conflicts.clone(),
    };
    Ok((lowered.graph, report))
}

/// Which ONNX nodes each kernel replaces. An ONNX node belongs to the kernel computing its
/// output class (or that class's layout twin: a class holding `transpose(d)` with `d` computed),
/// and otherwise to the first kernel downstream whose computation absorbed it.
fn attribute(
    eg: &analysis::OGraph,
    node_classes: &[Vec<Id>],
    node_inputs: &[Vec<Option<Id>>],
    g: &Graph,
    low: &to_ir::Lowered,
) -> Vec<Fusion> {
    let mut computed: BTreeMap<Id, usize> = low.node_class.iter().enumerate().map(|(i, &c)| (eg.find(c), i)).collect();
    for &(from, to) in &low.absorbed {
        if let Some(&k) = computed.get(&eg.find(to)) {
            computed.entry(eg.find(from)).or_insert(k);
        }
    }
    let producers = low.graph.producers();
    // A layout transform, or a view the optimiser added (the squeeze/unsqueeze around a 1-D
    // conv, the reshapes around a projection with the squeeze-excite scale in its weights), is
    // not where an ONNX node's work went: look through it.
    let passes_through = |n: &crate::ir::Node| {
        use crate::ir::ops::shape::{Reshape, Squeeze, Unsqueeze};
        n.op.downcast_ref::<crate::ir::ops::kernel::Transpose>().is_some()
            || (n.domain == "onnx2ait"
                && (n.op.downcast_ref::<Squeeze>().is_some()
                    || n.op.downcast_ref::<Unsqueeze>().is_some()
                    || n.op.downcast_ref::<Reshape>().is_some()))
    };
    let through_transpose = |mut k: usize| -> usize {
        while passes_through(&low.graph.nodes[k]) {
            match low.graph.nodes[k].inputs.first().copied().flatten().and_then(|v| producers[v]) {
                Some(p) => k = p,
                None => break,
            }
        }
        k
    };
    // The kernel computing class `c`, or its layout twin, seen through the views around a 1-D
    // conv (a squeeze of a transpose of the NHWC conv).
    let mat = |c: Id| -> Option<usize> {
        let mut c = eg.find(c);
        for _ in 0..4 {
            if let Some(&k) = computed.get(&c) {
                return Some(through_transpose(k));
            }
            let twin = eg[c].nodes.iter().find_map(|n| match n {
                language::ONode::Transpose([_, d]) => computed.get(&eg.find(*d)).copied().map(through_transpose),
                _ => None,
            });
            if twin.is_some() {
                return twin;
            }
            let view = eg[c].nodes.iter().find_map(|n| match n {
                language::ONode::Squeeze([_, d]) | language::ONode::Unsqueeze([_, d]) => Some(eg.find(*d)),
                _ => None,
            });
            c = view?;
        }
        None
    };
    let mut producer: BTreeMap<Id, usize> = BTreeMap::new();
    for (ni, outs) in node_classes.iter().enumerate() {
        for &c in outs {
            producer.entry(eg.find(c)).or_insert(ni);
        }
    }
    let mut owner: Vec<Option<usize>> = vec![None; node_classes.len()];
    let mut claimed: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (ni, outs) in node_classes.iter().enumerate() {
        if let Some(k) = outs.first().and_then(|&c| mat(c)) {
            owner[ni] = Some(k);
            claimed.entry(k).or_default().push(ni);
        }
    }
    // Absorb unmaterialised producers into their consumer's kernel, in reverse graph order.
    for ni in (0..node_classes.len()).rev() {
        let Some(k) = owner[ni] else { continue };
        let mut stack = vec![ni];
        while let Some(n) = stack.pop() {
            for c in node_inputs[n].iter().flatten() {
                let c = eg.find(*c);
                if mat(c).is_some() {
                    continue;
                }
                if let Some(&p) = producer.get(&c) {
                    if owner[p].is_none() {
                        owner[p] = Some(k);
                        claimed.entry(k).or_default().push(p);
                        stack.push(p);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (k, mut nodes) in claimed {
        let nodes_set: BTreeSet<usize> = nodes.drain(..).collect();
        if nodes_set.len() < 2 {
            continue;
        }
        let n = &low.graph.nodes[k];
        out.push(Fusion {
            kernel: to_ir::kernel_name(n),
            node: n.name.clone(),
            detail: explain::kernel_detail(n),
            onnx_nodes: nodes_set.iter().map(|&i| g.nodes[i].name.clone()).collect(),
        });
    }
    out
}
