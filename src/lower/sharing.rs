//! Instance sharing: fewer library instances for a model that is modelled to be barely slower.
//!
//! With profiled times every (node, range of the run-time dims) takes its fastest candidate, and
//! near-ties go whichever way the timing noise tips them: ResNet-50 on the H200 ends up with 20
//! distinct sm90 instances for 136 choices. Each sm90 instance costs about a minute of nvcc (and 3 GB while it
//! compiles), so a build on 16 cores runs two waves of them. Many choices have another candidate
//! within a few percent, often one that other nodes need anyway.
//!
//! [`plan`] starts from the fastest instance of every problem (plus the heuristic's instance of
//! every unmeasured one, which is built regardless) and removes instances one at a time while the
//! model stays within budget: for every range (of the batch, and of the other run-time dims the
//! problems depend on), the sum over its library problems (each weighted by the nodes that use
//! it) of the fastest time among the remaining instances may grow by at most `tolerance` over the
//! all-fastest sum. Each step removes the instance whose removal
//! costs least (ties: the name), so the result is deterministic. The target then gives every
//! problem the fastest instance of the set (see `ProfiledTarget::with_shared_instances`, whose
//! per-choice limit is the largest slowdown of the plan).
//!
//! The budget is on the library kernels' modelled time alone: the model's own time (other kernels,
//! launch gaps) is larger, so the whole model is slowed by less than `tolerance`.

use super::target::{Measurements, Point, ProfileProblem, ProfiledTarget};
use super::LowerOptions;
use crate::error::Result;
use crate::ir::Graph;
use std::collections::{BTreeMap, BTreeSet};

/// `target` with instance sharing for `graph` (the optimised graph it will lower) under
/// `tolerance` (see [`plan`]), and the plan; `target` unchanged and None without profiled times or with a zero
/// tolerance.
pub fn share<T: ProfiledTarget>(
    target: T,
    graph: &Graph,
    opts: &LowerOptions,
    tolerance: f64,
) -> Result<(T, Option<SharingPlan>)> {
    let Some(m) = target.measurements().filter(|_| tolerance > 0.0) else {
        return Ok((target, None));
    };
    let probe = target.probe();
    super::lower(graph, &probe, opts)?;
    let plan = plan(&probe.recorded(), m, tolerance);
    // Every problem's fastest instance of the set is within the plan's worst slowdown.
    let per_choice = plan.worst_slowdown - 1.0 + 1e-9;
    Ok((target.with_shared_instances(plan.instances.clone(), per_choice), Some(plan)))
}

/// What [`plan`] decided, for the compile summary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SharingPlan {
    /// The instance names every measured problem may choose from.
    pub instances: BTreeSet<String>,
    /// How many distinct instances the fastest-per-problem choice uses.
    pub unshared: usize,
    /// The largest slowdown of one problem against its fastest (1.0 = none): the per-choice limit
    /// the target applies.
    pub worst_slowdown: f64,
    /// Per range of the run-time dims (the batch's, and with other run-time dims theirs): the
    /// modelled library time with the plan over the all-fastest time.
    pub slowdown_by_range: BTreeMap<Point, f64>,
}

/// A measured problem: its range, weight, and time per instance name.
struct Timed {
    point: Point,
    uses: f64,
    times: BTreeMap<String, f64>,
    /// The fastest instance and its time.
    fastest: (String, f64),
}

impl Timed {
    fn of(p: &ProfileProblem, m: &Measurements) -> Option<Timed> {
        let times = m.get(&p.signature)?;
        let times: BTreeMap<String, f64> = p
            .candidates
            .iter()
            .filter_map(|c| times.get(&c.config).filter(|t| t.is_finite() && **t > 0.0).map(|t| (c.name.clone(), *t)))
            .collect();
        // Ties go to the earlier candidate, as the measured choice of the target breaks them.
        let fastest = p
            .candidates
            .iter()
            .filter_map(|c| times.get(&c.name).map(|t| (c.name.clone(), *t)))
            .min_by(|a, b| a.1.total_cmp(&b.1))?;
        Some(Timed { point: p.point.clone(), uses: p.uses.max(1) as f64, times, fastest })
    }

    /// The fastest time among `set`, if `set` has a candidate of this problem.
    fn best_in(&self, set: &BTreeSet<String>) -> Option<f64> {
        self.times.iter().filter(|(n, _)| set.contains(*n)).map(|(_, t)| *t).min_by(f64::total_cmp)
    }
}

/// Per range, the weighted library time with `set`; None when a problem has no instance in `set`.
fn time_by_range(problems: &[Timed], set: &BTreeSet<String>) -> Option<BTreeMap<Point, f64>> {
    let mut out = BTreeMap::new();
    for p in problems {
        *out.entry(p.point.clone()).or_insert(0.0) += p.uses * p.best_in(set)?;
    }
    Some(out)
}

/// The instance set for `problems` (every library problem of one model, as a recording target
/// collects them) under `tolerance` (0.01: each range's library time at most 1% above the
/// all-fastest choice).
pub fn plan(problems: &[ProfileProblem], m: &Measurements, tolerance: f64) -> SharingPlan {
    let limit = 1.0 + tolerance.max(0.0);
    let mut kept: BTreeSet<String> = BTreeSet::new();
    let mut fixed: BTreeSet<String> = BTreeSet::new();
    let mut timed: Vec<Timed> = Vec::new();
    for p in problems {
        match Timed::of(p, m) {
            Some(t) => {
                kept.insert(t.fastest.0.clone());
                timed.push(t);
            }
            // Chosen by the heuristic: built whatever the plan says, so free for others to use.
            None => {
                if let Some(c) = p.candidates.iter().find(|c| c.config == p.heuristic) {
                    fixed.insert(c.name.clone());
                }
            }
        }
    }
    let unshared = kept.len();
    kept.extend(fixed.iter().cloned());
    let Some(base) = time_by_range(&timed, &kept) else {
        return SharingPlan::default();
    };
    loop {
        // The removal that adds least (summed relative growth over the ranges) and keeps
        // every range within budget.
        let mut best: Option<(f64, String)> = None;
        for name in kept.difference(&fixed) {
            let mut trial = kept.clone();
            trial.remove(name);
            let Some(t) = time_by_range(&timed, &trial) else { continue };
            let growth: Vec<f64> = base.iter().map(|(b, v)| t.get(b).copied().unwrap_or(0.0) / v).collect();
            if growth.iter().any(|g| *g > limit) {
                continue;
            }
            let cost: f64 = growth.iter().sum();
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((cost, name.clone()));
            }
        }
        match best {
            Some((_, name)) => {
                kept.remove(&name);
            }
            None => break,
        }
    }
    let mut worst: f64 = 1.0;
    for p in &timed {
        if let Some(t) = p.best_in(&kept) {
            worst = worst.max(t / p.fastest.1);
        }
    }
    let now = time_by_range(&timed, &kept).unwrap_or_default();
    let slowdown_by_range = base.iter().map(|(b, v)| (b.clone(), now.get(b).copied().unwrap_or(0.0) / v)).collect();
    SharingPlan { instances: kept, unshared, worst_slowdown: worst, slowdown_by_range }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::LibraryInstance;
    use serde_json::Map;

    fn inst(cfg: &str) -> LibraryInstance {
        LibraryInstance { name: format!("o2a_{cfg}"), template: "t".into(), config: cfg.into(), context: Map::new() }
    }

    /// A problem at `batch`, asked for `uses` times, with candidates a, b and c (heuristic: a).
    fn problem(sig: &str, batch: i64, uses: usize) -> ProfileProblem {
        ProfileProblem {
            signature: sig.into(),
            kind: "conv",
            fields: Map::new(),
            candidates: ["a", "b", "c"].iter().map(|c| inst(c)).collect(),
            flops: 1.0,
            heuristic: "a".into(),
            point: Point::batch(batch),
            uses,
        }
    }

    fn times(rows: &[(&str, &[(&str, f64)])]) -> Measurements {
        rows.iter().map(|(s, ts)| (s.to_string(), ts.iter().map(|(c, t)| (c.to_string(), *t)).collect())).collect()
    }

    fn names(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|n| format!("o2a_{n}")).collect()
    }

    #[test]
    fn near_ties_share_and_clear_winners_keep_their_instance() {
        let ps: Vec<ProfileProblem> = ["p1", "p2", "p3"].iter().map(|s| problem(s, 1, 1)).collect();
        // p1 and p2 are near-ties between a and b (b fastest on p1, a on p2); p3 needs c.
        let m = times(&[
            ("p1", &[("a", 1.02), ("b", 1.00), ("c", 2.0)]),
            ("p2", &[("a", 1.00), ("b", 1.01), ("c", 2.0)]),
            ("p3", &[("a", 1.50), ("b", 1.50), ("c", 1.00)]),
        ]);
        let all = plan(&ps, &m, 0.0);
        assert_eq!(all.instances, names(&["a", "b", "c"]));
        assert_eq!((all.unshared, all.worst_slowdown), (3, 1.0));
        assert_eq!(all.slowdown_by_range, [(Point::batch(1), 1.0)].into());

        // Dropping a costs p2 1% (+0.33% in all), dropping b costs p1 2% (+0.67%): a goes.
        let shared = plan(&ps, &m, 0.01);
        assert_eq!(shared.instances, names(&["b", "c"]));
        assert_eq!(shared.unshared, 3);
        assert!((shared.worst_slowdown - 1.01).abs() < 1e-12, "{}", shared.worst_slowdown);
        assert!((shared.slowdown_by_range[&Point::batch(1)] - 3.01 / 3.0).abs() < 1e-12);
        // Under the cost of either removal nothing goes.
        assert_eq!(plan(&ps, &m, 0.003).instances, names(&["a", "b", "c"]));
    }

    #[test]
    fn every_batch_range_keeps_its_own_budget() {
        // A 50% slower kernel at batch 1 would vanish in a budget over all ranges together.
        let ps = vec![problem("small", 1, 1), problem("large", 256, 1)];
        let m = times(&[("small", &[("a", 1.0), ("b", 1.5)]), ("large", &[("a", 101.0), ("b", 100.0)])]);
        let p = plan(&ps, &m, 0.03);
        assert_eq!(p.instances, names(&["a"]));
        assert!((p.slowdown_by_range[&Point::batch(256)] - 1.01).abs() < 1e-12);
        assert_eq!(p.slowdown_by_range[&Point::batch(1)], 1.0);
    }

    #[test]
    fn problems_weigh_by_their_uses() {
        let m = times(&[("p1", &[("a", 1.0), ("b", 1.02)]), ("p2", &[("a", 1.02), ("b", 1.0)])]);
        // p1 used by ten nodes: moving it to b costs 1.8%, moving p2 to a 0.18%.
        assert_eq!(plan(&[problem("p1", 1, 10), problem("p2", 1, 1)], &m, 0.01).instances, names(&["a"]));
        assert_eq!(plan(&[problem("p1", 1, 1), problem("p2", 1, 10)], &m, 0.01).instances, names(&["b"]));
    }

    #[test]
    fn heuristic_instances_are_kept_and_serve_others() {
        // "unmeasured" has no times: the heuristic's a is built anyway.
        let ps = vec![problem("unmeasured", 1, 1), problem("p", 1, 1)];
        let m = times(&[("p", &[("a", 1.005), ("b", 1.0)])]);
        let p = plan(&ps, &m, 0.01);
        assert_eq!(p.instances, names(&["a"]));
        assert_eq!(p.unshared, 1);
        assert_eq!(plan(&ps, &m, 0.001).instances, names(&["a", "b"]));
        // Unusable times count as none.
        let bad = times(&[("p", &[("b", f64::NAN), ("c", 0.0)])]);
        assert_eq!(plan(&ps, &bad, 0.5).instances, names(&["a"]));
    }
}
