//! DAG-aware extraction and the cost model.
//!
//! Greedy extraction in the style of extraction-gym's "faster greedy DAG": the cost of choosing
//! a node is the cost of the *set* of classes it needs (its own node plus everything below it,
//! each class counted once), so a conv whose output feeds two residual adds is paid for once,
//! not once per consumer as a tree-cost extractor would. Costs are integer picoseconds, so sums
//! do not depend on the order they are added in and extraction is deterministic. Every node is
//! re-checked with its op's inference before it may be chosen, and the result is verified to be
//! acyclic.

use super::analysis::{children_typed, denote, OGraph};
use super::language::ONode;
use crate::ir::dim::Dim;
use crate::ir::ops::kernel::{Attention, Conv2d, Elementwise, Gemm, Layout};
use crate::ir::{Fact, Op};
use egg::{Id, Language};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;

/// Estimates the run time of one node. The default is [`AnalyticalCost`]; a later stage plugs
/// measured kernel times in through the same trait.
pub trait CostModel {
    /// Seconds one execution of `node` takes. `op` is the op the node denotes (absent for
    /// leaves), `inputs` the facts of its IR inputs, `out` the fact of its result.
    fn cost(&self, node: &ONode, op: Option<&dyn Op>, inputs: &[Option<&Fact>], out: &Fact) -> f64;
}

/// Roofline estimate for the target GPU: `max(flops / rate, bytes / bandwidth) + launch`.
///
/// Conv and gemm run on tensor cores in NHWC; an NCHW conv is priced as the NHWC kernel plus
/// the two layout transforms a library performs around it, so the extractor sees what keeping
/// NCHW really costs. Layout transforms are priced by the bytes they move; views (`flatten`,
/// `chan`, `squeeze`, `unsqueeze`) are free; constants and inputs are free.
#[derive(Clone, Debug)]
pub struct AnalyticalCost {
    pub tensor_flops_per_s: f64,
    pub vector_flops_per_s: f64,
    pub bytes_per_s: f64,
    pub launch_s: f64,
    /// Value assumed for symbolic dims (batch, sequence) when pricing.
    pub symbol_value: i64,
}

impl Default for AnalyticalCost {
    fn default() -> Self {
        AnalyticalCost {
            tensor_flops_per_s: 700e12,
            vector_flops_per_s: 60e12,
            bytes_per_s: 4e12,
            launch_s: 3e-6,
            symbol_value: 1,
        }
    }
}

impl AnalyticalCost {
    fn dim(&self, d: &Dim) -> f64 {
        if let Some(v) = d.as_known() {
            return v.max(0) as f64;
        }
        let env: BTreeMap<String, i64> = d.symbols().map(|s| (s.to_string(), self.symbol_value)).collect();
        d.eval(&env).as_known().unwrap_or(self.symbol_value) as f64
    }

    fn elems(&self, f: &Fact) -> f64 {
        f.shape().iter().map(|d| self.dim(d)).product()
    }

    fn bytes(&self, f: &Fact) -> f64 {
        self.elems(f) * f.dtype().size_bytes() as f64
    }

    fn kernel(&self, flops: f64, tensor: bool, bytes: f64) -> f64 {
        let rate = if tensor { self.tensor_flops_per_s } else { self.vector_flops_per_s };
        (flops / rate).max(bytes / self.bytes_per_s) + self.launch_s
    }
}

impl CostModel for AnalyticalCost {
    fn cost(&self, node: &ONode, op: Option<&dyn Op>, inputs: &[Option<&Fact>], out: &Fact) -> f64 {
        let io_bytes: f64 = inputs.iter().flatten().map(|f| self.bytes(f)).sum::<f64>() + self.bytes(out);
        match node {
            ONode::Leaf(_) => 0.0,
            ONode::Flatten(_) | ONode::Chan(_) | ONode::Squeeze(_) | ONode::Unsqueeze(_) => 0.0,
            ONode::Transpose(_) => self.kernel(0.0, false, 2.0 * self.bytes(out)),
            ONode::Conv(_) | ONode::KConv(_) => {
                let Some(conv) = op.and_then(|o| o.downcast_ref::<Conv2d>()) else {
                    return self.kernel(0.0, false, io_bytes);
                };
                let w = inputs.get(1).copied().flatten();
                let per_out = w.map(|w| w.shape()[1..].iter().map(|d| self.dim(d)).product::<f64>()).unwrap_or(1.0);
                let flops = 2.0 * self.elems(out) * per_out;
                let base = self.kernel(flops, true, io_bytes);
                match conv.layout {
                    Layout::Nhwc => base,
                    // Transposes of the input and the output around the NHWC kernel.
                    Layout::Nchw => {
                        let x = inputs.first().copied().flatten().map(|f| self.bytes(f)).unwrap_or(0.0);
                        base + self.kernel(0.0, false, 2.0 * x) + self.kernel(0.0, false, 2.0 * self.bytes(out))
                    }
                }
            }
            ONode::Gemm(_) => {
                let k = match (op.and_then(|o| o.downcast_ref::<Gemm>()), inputs.first().copied().flatten()) {
                    (Some(g), Some(a)) if a.rank() >= 1 => {
                        let r = a.rank();
                        let axis = if g.trans_a && r >= 2 { r - 2 } else { r - 1 };
                        self.dim(&a.shape()[axis])
                    }
                    _ => 1.0,
                };
                self.kernel(2.0 * self.elems(out) * k, true, io_bytes)
            }
            // Two products per score on tensor cores; the scores never leave the chip.
            ONode::Attention(_) => {
                let (q, k) = (inputs.first().copied().flatten(), inputs.get(1).copied().flatten());
                let v = inputs.get(2).copied().flatten();
                let sizes = match (op.and_then(|o| o.downcast_ref::<Attention>()), q, k, v) {
                    (Some(a), Some(q), Some(k), Some(v)) => a.scores_shape(q.shape(), k.shape(), v.shape()).ok(),
                    _ => None,
                };
                let flops = match (q, sizes) {
                    (Some(q), Some(scores)) => 4.0 * self.elems(q) * self.dim(&scores[3]),
                    _ => self.elems(out),
                };
                self.kernel(flops, true, io_bytes)
            }
            // Pooling reads x once; the two products are 2·S·C multiply-adds per image on the
            // vector units (the weights are read once per image, from L2 after the first).
            ONode::SeScale(_) => {
                let per_image = inputs.get(1).copied().flatten().map(|w| 4.0 * self.elems(w)).unwrap_or(0.0);
                let images = inputs.first().copied().flatten().map(|x| self.dim(&x.shape()[0])).unwrap_or(1.0);
                let x = inputs.first().copied().flatten().map(|f| self.elems(f)).unwrap_or(0.0);
                self.kernel(x + per_image * images, false, io_bytes)
            }
            _ => {
                let flops = op.and_then(|o| o.downcast_ref::<Elementwise>()).map(|e| e.expr.flops()).unwrap_or(1.0)
                    * self.elems(out);
                self.kernel(flops, false, io_bytes)
            }
        }
    }
}

/// The chosen node of every class reachable from the roots.
#[derive(Clone, Debug)]
pub struct Extraction {
    pub roots: Vec<Id>,
    /// Canonical class → the chosen node (children canonical).
    pub choice: BTreeMap<Id, ONode>,
    /// Total estimated time of the extracted DAG, each class counted once (picoseconds).
    pub cost_ps: u64,
}

impl Extraction {
    /// Classes of the extracted DAG in topological order (children first), from the roots.
    pub fn topo_order(&self) -> Vec<Id> {
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for &r in &self.roots {
            self.visit(r, &mut seen, &mut order);
        }
        order
    }

    fn visit(&self, id: Id, seen: &mut BTreeSet<Id>, order: &mut Vec<Id>) {
        // Iterative post-order: deep graphs must not overflow the stack.
        let mut stack = vec![(id, false)];
        while let Some((c, expanded)) = stack.pop() {
            if expanded {
                order.push(c);
                continue;
            }
            if !seen.insert(c) {
                continue;
            }
            stack.push((c, true));
            if let Some(n) = self.choice.get(&c) {
                for &ch in n.children().iter().rev() {
                    if !seen.contains(&ch) {
                        stack.push((ch, false));
                    }
                }
            }
        }
    }
}

#[derive(Clone)]
struct ClassCost {
    total: u64,
    set: Rc<BTreeMap<Id, u64>>,
    node: usize,
}

/// Cost of one node in picoseconds, or `None` when the node is not well typed (a rule produced
/// something its op rejects, or a child has no type).
pub fn node_cost_ps(eg: &OGraph, class: Id, node: &ONode, model: &dyn CostModel) -> Option<u64> {
    let out = eg[class].data.fact.as_ref()?;
    if node.is_leaf() {
        return Some(0);
    }
    if !children_typed(eg, node) {
        return None;
    }
    let den = denote(eg, node).ok()??;
    let facts: Vec<Option<&Fact>> = den.inputs.iter().map(|i| i.and_then(|i| eg[i].data.fact.as_ref())).collect();
    if den.inputs.iter().zip(&facts).any(|(i, f)| i.is_some() && f.is_none()) {
        return None;
    }
    let outs = den.op.infer(&facts).ok()?;
    if outs.get(den.output).map(|f| &f.ty) != Some(&out.ty) {
        return None;
    }
    let secs = model.cost(node, Some(den.op.as_ref()), &facts, out);
    Some((secs.max(0.0) * 1e12).round() as u64)
}

/// Extracts the cheapest DAG computing `roots` in which no conv or matrix product is computed
/// twice.
///
/// Set-based costing already pays a shared class once, but epilogue fusion creates a *different*
/// class per consumer (`relu(conv + a)` and `conv + b` each absorb the conv), and with a launch
/// overhead per kernel the cost model can find recomputing a small conv in two fused kernels
/// cheaper than one conv and two elementwise kernels. Recomputation multiplies the dominant
/// FLOPs and weight traffic on real sizes, so it is ruled out structurally: when two chosen
/// kernels share a producer computation (same input, weights and geometry), the epilogue-fused
/// forms (with a residual or an activation) of that computation are banned and extraction
/// runs again, until no computation is duplicated.
///
/// The original implementation of a BatchNormalization (the `bn` node) is a fallback: where its
/// class also holds a well-typed rewrite (the per-channel scale+shift of cleanup.rules), the
/// rewrite is extracted. The cost model alone would keep the one-kernel `bn` over the two
/// elementwise kernels of x·S + T, not seeing that those fuse into one chain (or into a
/// neighbour) after extraction. Should that ever leave a root unreachable, extraction falls back
/// to letting the cost decide.
pub fn extract(eg: &OGraph, roots: &[Id], model: &dyn CostModel) -> Result<Extraction, String> {
    let fallbacks = rewritten_fallbacks(eg, model);
    let mut banned: BTreeSet<(Id, usize)> = fallbacks.clone();
    let mut first = true;
    loop {
        let ex = match extract_with_bans(eg, roots, model, &banned) {
            Ok(ex) => ex,
            Err(_) if first && !fallbacks.is_empty() => {
                banned.retain(|b| !fallbacks.contains(b));
                first = false;
                continue;
            }
            Err(e) => return Err(e),
        };
        first = false;
        let mut seen: BTreeMap<[Id; 3], usize> = BTreeMap::new();
        for node in ex.choice.values() {
            if let Some((key, _)) = producer_key(eg, node) {
                *seen.entry(key).or_insert(0) += 1;
            }
        }
        let dup: BTreeSet<[Id; 3]> = seen.into_iter().filter(|(_, n)| *n > 1).map(|(k, _)| k).collect();
        let before = banned.len();
        if !dup.is_empty() {
            for class in eg.classes() {
                for (i, n) in class.nodes.iter().enumerate() {
                    if let Some((key, true)) = producer_key(eg, n) {
                        if dup.contains(&key) {
                            banned.insert((class.id, i));
                        }
                    }
                }
            }
        }
        if banned.len() == before {
            return Ok(ex);
        }
    }
}

/// `bn` nodes whose class holds another well-typed, non-leaf node.
fn rewritten_fallbacks(eg: &OGraph, model: &dyn CostModel) -> BTreeSet<(Id, usize)> {
    let mut out = BTreeSet::new();
    for class in eg.classes() {
        let has_rewrite = class.nodes.iter().any(|n| {
            !matches!(n, ONode::BatchNorm(_)) && !n.is_leaf() && node_cost_ps(eg, class.id, n, model).is_some()
        });
        if !has_rewrite {
            continue;
        }
        for (i, n) in class.nodes.iter().enumerate() {
            if matches!(n, ONode::BatchNorm(_)) {
                out.insert((class.id, i));
            }
        }
    }
    out
}

/// The producer computation of a conv / gemm kernel node (canonical input, weights and
/// attribute classes) and whether the node fuses an epilogue that belongs to one consumer
/// (a residual add or an activation; a bias is part of the producer).
fn producer_key(eg: &OGraph, node: &ONode) -> Option<([Id; 3], bool)> {
    let none = |id: Id| eg[id].nodes.iter().any(|n| matches!(n, ONode::Leaf(s) if s.as_str() == "none"));
    match node {
        ONode::KConv([x, w, _b, r, g, a]) | ONode::Gemm([x, w, _b, r, g, a]) => {
            Some(([eg.find(*x), eg.find(*w), eg.find(*g)], !none(*r) || !none(*a)))
        }
        _ => None,
    }
}

fn extract_with_bans(
    eg: &OGraph,
    roots: &[Id],
    model: &dyn CostModel,
    banned: &BTreeSet<(Id, usize)>,
) -> Result<Extraction, String> {
    let roots: Vec<Id> = roots.iter().map(|&r| eg.find(r)).collect();
    // Per-node costs and the parents index.
    let mut node_costs: BTreeMap<Id, Vec<Option<u64>>> = BTreeMap::new();
    let mut parents: BTreeMap<Id, Vec<(Id, usize)>> = BTreeMap::new();
    let mut queue: VecDeque<(Id, usize)> = VecDeque::new();
    let mut queued: BTreeSet<(Id, usize)> = BTreeSet::new();
    for class in eg.classes() {
        let costs: Vec<Option<u64>> = class
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| if banned.contains(&(class.id, i)) { None } else { node_cost_ps(eg, class.id, n, model) })
            .collect();
        for (i, n) in class.nodes.iter().enumerate() {
            if costs[i].is_none() {
                continue;
            }
            for &c in n.children() {
                parents.entry(eg.find(c)).or_default().push((class.id, i));
            }
            if n.children().is_empty() {
                queue.push_back((class.id, i));
                queued.insert((class.id, i));
            }
        }
        node_costs.insert(class.id, costs);
    }
    // Attribute leaves have no fact and so no cost above; they are free.
    let mut best: BTreeMap<Id, ClassCost> = BTreeMap::new();
    for class in eg.classes() {
        if class.data.fact.is_none() && class.nodes.iter().all(|n| n.is_leaf()) {
            best.insert(class.id, ClassCost { total: 0, set: Rc::new(BTreeMap::new()), node: 0 });
            for &(p, i) in parents.get(&class.id).into_iter().flatten() {
                if queued.insert((p, i)) {
                    queue.push_back((p, i));
                }
            }
        }
    }
    while let Some((cid, ni)) = queue.pop_front() {
        queued.remove(&(cid, ni));
        let node = &eg[cid].nodes[ni];
        let Some(own) = node_costs.get(&cid).and_then(|v| v[ni]) else {
            continue;
        };
        let children: Vec<Id> = node.children().iter().map(|&c| eg.find(c)).collect();
        if children.iter().any(|c| !best.contains_key(c)) {
            continue;
        }
        // Union of the children's sets, starting from the largest.
        let mut sets: Vec<&Rc<BTreeMap<Id, u64>>> = children.iter().map(|c| &best[c].set).collect();
        sets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut set: BTreeMap<Id, u64> = sets.first().map(|s| (***s).clone()).unwrap_or_default();
        for s in sets.iter().skip(1) {
            for (k, v) in s.iter() {
                set.insert(*k, *v);
            }
        }
        if set.contains_key(&cid) {
            continue; // choosing this node would make the class depend on itself
        }
        set.insert(cid, own);
        let total: u64 = set.values().sum();
        let better = match best.get(&cid) {
            None => true,
            Some(b) => total < b.total,
        };
        if better {
            best.insert(cid, ClassCost { total, set: Rc::new(set), node: ni });
            for &(p, i) in parents.get(&cid).into_iter().flatten() {
                if queued.insert((p, i)) {
                    queue.push_back((p, i));
                }
            }
        }
    }
    let mut choice = BTreeMap::new();
    let mut stack: Vec<Id> = roots.clone();
    while let Some(c) = stack.pop() {
        if choice.contains_key(&c) {
            continue;
        }
        let b = best.get(&c).ok_or_else(|| format!("class {c} has no well-typed form to extract"))?;
        let node = eg[c].nodes[b.node].clone().map_children(|ch| eg.find(ch));
        stack.extend(node.children().iter().copied());
        choice.insert(c, node);
    }
    let ex = Extraction { roots, choice, cost_ps: 0 };
    check_acyclic(&ex)?;
    let mut cost_ps = 0u64;
    for c in ex.topo_order() {
        let node = &ex.choice[&c];
        cost_ps += node_cost_ps(eg, c, node, model).unwrap_or(0);
    }
    Ok(Extraction { cost_ps, ..ex })
}

/// Fails when the chosen nodes form a cycle.
pub fn check_acyclic(ex: &Extraction) -> Result<(), String> {
    // 0 = unvisited, 1 = on the stack, 2 = done.
    let mut state: BTreeMap<Id, u8> = BTreeMap::new();
    for &r in &ex.roots {
        let mut stack: Vec<(Id, usize)> = vec![(r, 0)];
        if state.get(&r) == Some(&2) {
            continue;
        }
        state.insert(r, 1);
        while let Some((c, i)) = stack.pop() {
            let children = ex.choice.get(&c).map(|n| n.children().to_vec()).unwrap_or_default();
            if i < children.len() {
                stack.push((c, i + 1));
                let ch = children[i];
                match state.get(&ch).copied().unwrap_or(0) {
                    0 => {
                        state.insert(ch, 1);
                        stack.push((ch, 0));
                    }
                    1 => return Err(format!("extracted graph has a cycle through class {ch}")),
                    _ => {}
                }
            } else {
                state.insert(c, 2);
            }
        }
    }
    Ok(())
}
