//! Phased equality saturation: separate runs (cleanup → layout → fusion → cleanup) on the same
//! e-graph, each with its own limits and a reported stop reason.

use super::analysis::{OGraph, OptAnalysis};
use super::language::ONode;
use super::rules::{load_embedded, RuleDef, RuleError};
use egg::{Rewrite, Runner, SimpleScheduler, StopReason};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// One phase: a name, its rules and its limits.
#[derive(Clone)]
pub struct Phase {
    pub name: String,
    pub rules: Vec<RuleDef>,
    pub iter_limit: usize,
    pub node_limit: usize,
    pub time_limit: Duration,
}

impl Phase {
    /// A phase running the rules of one embedded `rewrites/` file.
    pub fn from_file(name: &str, file: &str) -> Result<Phase, RuleError> {
        Ok(Phase {
            name: name.to_string(),
            rules: load_embedded(file)?,
            iter_limit: 30,
            node_limit: 200_000,
            time_limit: Duration::from_secs(10),
        })
    }
}

/// Statistics of one phase, as reported by `explain`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct PhaseStats {
    pub name: String,
    /// E-classes and e-nodes after the phase.
    pub classes: usize,
    pub nodes: usize,
    pub iterations: usize,
    pub time_ms: f64,
    /// `saturated`, `iteration limit`, `node limit`, `time limit` or another message.
    pub stop_reason: String,
    /// How many times each rule was applied (rules that never fired are listed with 0).
    pub rules_applied: BTreeMap<String, usize>,
}

/// Runs one phase on `eg` and returns the e-graph with the phase's statistics.
///
/// The scheduler is egg's `SimpleScheduler`: the default `BackoffScheduler` bans rules that
/// match often, and fusion rules match on every conv of a network, so they would be silently
/// skipped.
pub fn run_phase(eg: OGraph, phase: &Phase) -> Result<(OGraph, PhaseStats), RuleError> {
    let rewrites: Vec<Rewrite<ONode, OptAnalysis>> =
        phase.rules.iter().map(|r| r.to_rewrite()).collect::<Result<_, _>>()?;
    let start = std::time::Instant::now();
    let runner = Runner::<ONode, OptAnalysis, ()>::default()
        .with_egraph(eg)
        .with_iter_limit(phase.iter_limit)
        .with_node_limit(phase.node_limit)
        .with_time_limit(phase.time_limit)
        .with_scheduler(SimpleScheduler)
        .run(&rewrites);
    let time_ms = start.elapsed().as_secs_f64() * 1e3;
    let mut rules_applied: BTreeMap<String, usize> = phase.rules.iter().map(|r| (r.name.clone(), 0)).collect();
    for it in &runner.iterations {
        for (name, n) in &it.applied {
            *rules_applied.entry(name.to_string()).or_insert(0) += n;
        }
    }
    let stop_reason = match &runner.stop_reason {
        Some(StopReason::Saturated) => "saturated".to_string(),
        Some(StopReason::IterationLimit(_)) => "iteration limit".to_string(),
        Some(StopReason::NodeLimit(_)) => "node limit".to_string(),
        Some(StopReason::TimeLimit(_)) => "time limit".to_string(),
        Some(StopReason::Other(m)) => m.clone(),
        None => "not run".to_string(),
    };
    let mut eg = runner.egraph;
    eg.rebuild();
    let stats = PhaseStats {
        name: phase.name.clone(),
        classes: eg.number_of_classes(),
        nodes: eg.total_number_of_nodes(),
        iterations: runner.iterations.len(),
        time_ms,
        stop_reason,
        rules_applied,
    };
    Ok((eg, stats))
}
