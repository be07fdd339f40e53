//! The e-class analysis: dtype, shape (symbolic dims), layout and constant contents of every
//! class, obtained by mapping each e-node to the IR op it denotes and calling that op's `infer`
//! (and `eval` when every input is constant, which folds weight-only subgraphs such as BN
//! scales multiplied into conv weights or weight transposes to KRSC).

use super::language::{leaf_kind, opaque_ref, LeafKind, ONode};
use crate::ir::infer::FOLD_LIMIT;
use crate::ir::ops::kernel::{
    Act, Attention, AttentionLayout, BinOp, ChannelView, Conv2d, ConvGeom, Elementwise, Flatten, Gemm, GlobalAvgPool,
    LayerNorm, Layout, Pool, ReduceMean, SqueezeExciteScale, Transpose,
};
use crate::ir::ops::shape::{self, AxesFrom};
use crate::ir::{Fact, Op, OpError, OpResult, Tensor};
use crate::{op_bail, op_ensure};
use egg::{DidMerge, EGraph, Id, Language};
use std::sync::Arc;

pub type OGraph = EGraph<ONode, OptAnalysis>;

/// An original IR node, kept for opaque nodes and for nodes (`bn`, `identity`) that run their
/// original implementation when no rule rewrites them.
#[derive(Clone, Debug)]
pub struct OrigNode {
    pub name: String,
    pub op_type: String,
    pub domain: String,
    pub op: Box<dyn Op>,
    pub num_outputs: usize,
}

/// Side tables shared by all classes, plus diagnostics gathered while rewriting.
#[derive(Debug, Default)]
pub struct OptAnalysis {
    pub consts: Vec<Arc<Tensor>>,
    /// Name of each constant in the source graph (`None` for constants the optimiser made).
    pub const_names: Vec<Option<String>>,
    pub inputs: Vec<Fact>,
    pub origs: Vec<OrigNode>,
    /// Type conflicts met while merging classes (a rule with a missing condition): reported,
    /// and in debug builds an assertion failure.
    pub conflicts: Vec<String>,
    /// Constants by content hash, so a value folded twice gets the same leaf (rules that
    /// rewrite constants into equal constants then reach a fixpoint instead of growing).
    by_content: std::collections::BTreeMap<u64, Vec<usize>>,
}

impl OptAnalysis {
    pub fn add_const(&mut self, t: Arc<Tensor>, name: Option<String>) -> usize {
        self.consts.push(t);
        self.const_names.push(name);
        self.consts.len() - 1
    }

    /// The index of a constant equal to `t` (same dtype, shape and bits), adding it if new.
    pub fn intern_const(&mut self, t: Arc<Tensor>) -> usize {
        let key = fingerprint(&t);
        if let Some(ids) = self.by_content.get(&key) {
            for &i in ids {
                if *self.consts[i] == *t {
                    return i;
                }
            }
        }
        let i = self.add_const(t, None);
        self.by_content.entry(key).or_default().push(i);
        i
    }
}

/// A cheap content fingerprint of a constant: dtype, shape and at most `SAMPLES` evenly spaced
/// elements. Folded weights are megabytes each and are interned once per folding step, so
/// hashing every element dominated optimisation time; equal fingerprints are confirmed by full
/// comparison in `intern_const`, so a collision costs a comparison, never a wrong merge.
fn fingerprint(t: &Tensor) -> u64 {
    use crate::ir::Elem;
    const SAMPLES: usize = 64;
    // FxHash-style mixing: deterministic across runs and platforms (no random keys).
    fn mix(h: u64, v: u64) -> u64 {
        (h.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95)
    }
    fn sample<T: Elem>(a: &ndarray::ArrayD<T>, mut h: u64) -> u64 {
        let n = a.len();
        let step = (n / SAMPLES).max(1);
        match a.as_slice() {
            Some(s) => {
                for v in s.iter().step_by(step) {
                    h = mix(h, v.to_f64().to_bits());
                }
            }
            // Non-standard layouts are rare (owned results of ops are standard): hash all, in
            // logical order, so equal tensors hash equally whatever their layout.
            None => {
                for (i, v) in a.iter().enumerate() {
                    if i % step == 0 {
                        h = mix(h, v.to_f64().to_bits());
                    }
                }
            }
        }
        h
    }
    let mut h = mix(0, t.dtype() as u64);
    for &d in t.shape() {
        h = mix(h, d as u64);
    }
    crate::with_tensor!(t, a => sample(a, h))
}

/// What the analysis knows about a class.
#[derive(Clone, Debug, Default)]
pub struct Data {
    /// `None` for attribute leaves and `none`.
    pub fact: Option<Fact>,
    /// Layout of rank-4 activations produced by layout-aware nodes.
    pub layout: Option<Layout>,
}

/// A kernel-level (or original) op an e-node denotes, with its IR inputs (`None`: absent).
pub struct Denoted {
    pub op: Box<dyn Op>,
    pub inputs: Vec<Option<Id>>,
    /// Output index of the op this node stands for (opaque nodes of multi-output ops).
    pub output: usize,
}

/// Reads the token of an attribute leaf class.
pub fn token_of(eg: &OGraph, id: Id) -> Option<String> {
    eg[id].nodes.iter().find_map(|n| match n {
        ONode::Leaf(s) if matches!(leaf_kind(s.as_str()), LeafKind::Attr(_) | LeafKind::None) => Some(s.to_string()),
        _ => None,
    })
}

pub(super) fn orig_index(eg: &OGraph, id: Id) -> Option<usize> {
    eg[id].nodes.iter().find_map(|n| match n {
        ONode::Leaf(s) => match leaf_kind(s.as_str()) {
            LeafKind::Orig(k) => Some(k),
            _ => None,
        },
        _ => None,
    })
}

fn is_none(eg: &OGraph, id: Id) -> bool {
    eg[id].nodes.iter().any(|n| matches!(n, ONode::Leaf(s) if s.as_str() == "none"))
}

/// Maps an e-node to the op it denotes. `Ok(None)` for leaves.
pub fn denote(eg: &OGraph, node: &ONode) -> OpResult<Option<Denoted>> {
    let tok = |id: Id| -> OpResult<String> {
        token_of(eg, id).ok_or_else(|| OpError(format!("child {id} of '{node}' is not an attribute leaf")))
    };
    let opt = |id: Id| -> Option<Id> { (!is_none(eg, id)).then_some(id) };
    let act_of = |id: Id| -> OpResult<Option<Act>> {
        let t = tok(id)?;
        if t == "none" {
            Ok(None)
        } else {
            Ok(Some(Act::parse(&t)?))
        }
    };
    let konst_scalar = |id: Id| -> OpResult<f32> {
        eg[id]
            .data
            .fact
            .as_ref()
            .and_then(|f| f.konst.as_ref())
            .and_then(|t| t.scalar_f64())
            .map(|v| v as f32)
            .ok_or_else(|| OpError(format!("'{node}': epsilon must be a scalar constant")))
    };
    let usize_tok = |id: Id| -> OpResult<usize> {
        let t = tok(id)?;
        t.parse::<usize>().map_err(|_| OpError(format!("'{node}': expected a non-negative integer, found '{t}'")))
    };
    let d = |op: Box<dyn Op>, inputs: Vec<Option<Id>>| Ok(Some(Denoted { op, inputs, output: 0 }));
    let bin = |op: BinOp, c: &[Id; 2]| d(Box::new(Elementwise::binary(op)), vec![Some(c[0]), Some(c[1])]);
    match node {
        ONode::Leaf(_) => Ok(None),
        ONode::Conv([x, w, b, g]) => {
            let geom = ConvGeom::parse(&tok(*g)?)?;
            d(
                Box::new(Conv2d { layout: Layout::Nchw, geom, act: None, pre_act: None }),
                vec![Some(*x), Some(*w), opt(*b)],
            )
        }
        ONode::KConv([x, w, b, r, g, a]) => {
            let geom = ConvGeom::parse(&tok(*g)?)?;
            // `pre:<act>` applies before the residual add, `<act>` after it.
            let t = tok(*a)?;
            let (pre, post) = match t.strip_prefix("pre:") {
                Some(f) => (Some(Act::parse(f)?), None),
                None => (None, act_of(*a)?),
            };
            d(
                Box::new(Conv2d { layout: Layout::Nhwc, geom, act: post, pre_act: pre }),
                vec![Some(*x), Some(*w), opt(*b), opt(*r)],
            )
        }
        ONode::Gemm([a, b, bias, r, attrs, act]) => {
            let mut g = parse_gemm_attrs(&tok(*attrs)?)?;
            g.act = act_of(*act)?;
            d(Box::new(g), vec![Some(*a), Some(*b), opt(*bias), opt(*r)])
        }
        ONode::Add(c) => bin(BinOp::Add, c),
        ONode::Sub(c) => bin(BinOp::Sub, c),
        ONode::Mul(c) => bin(BinOp::Mul, c),
        ONode::Div(c) => bin(BinOp::Div, c),
        ONode::Pow(c) => bin(BinOp::Pow, c),
        ONode::Max(c) => bin(BinOp::Max, c),
        ONode::Min(c) => bin(BinOp::Min, c),
        ONode::Act([f, x]) => d(Box::new(Elementwise::unary(Act::parse(&tok(*f)?)?)), vec![Some(*x)]),
        ONode::ReduceMean([axes, x]) => d(Box::new(ReduceMean::parse(&tok(*axes)?)?), vec![Some(*x)]),
        ONode::Transpose([p, x]) => d(Box::new(Transpose::new(Transpose::parse_perm(&tok(*p)?)?)?), vec![Some(*x)]),
        ONode::Flatten([a, x]) => d(Box::new(Flatten { axis: usize_tok(*a)? }), vec![Some(*x)]),
        ONode::Concat(ch) => {
            let Some((axis, xs)) = ch.split_first() else { op_bail!("'concat' without an axis") };
            op_ensure!(!xs.is_empty(), "'concat' without inputs");
            let axis = usize_tok(*axis)? as i64;
            d(Box::new(crate::ir::ops::indexing::Concat { axis }), xs.iter().map(|&x| Some(x)).collect())
        }
        ONode::Chan([k, x]) => d(Box::new(ChannelView { trailing_ones: usize_tok(*k)? }), vec![Some(*x)]),
        ONode::Unsqueeze([a, x]) => {
            let axes = AxesFrom::Attr(Some(axes_of(&tok(*a)?)?));
            d(Box::new(shape::Unsqueeze { axes }), vec![Some(*x)])
        }
        ONode::Squeeze([a, x]) => {
            let axes = AxesFrom::Attr(Some(axes_of(&tok(*a)?)?));
            d(Box::new(shape::Squeeze { axes }), vec![Some(*x)])
        }
        ONode::BatchNorm([x, s, b, m, v, _eps, orig]) => {
            let k = orig_index(eg, *orig).ok_or_else(|| OpError("'bn' without its original node".into()))?;
            let o = eg.analysis.origs.get(k).ok_or_else(|| OpError(format!("original node {k} does not exist")))?;
            d(o.op.clone(), vec![Some(*x), Some(*s), Some(*b), Some(*m), Some(*v)])
        }
        ONode::Identity([x, orig]) => {
            let k = orig_index(eg, *orig).ok_or_else(|| OpError("'identity' without its original node".into()))?;
            let o = eg.analysis.origs.get(k).ok_or_else(|| OpError(format!("original node {k} does not exist")))?;
            d(o.op.clone(), vec![Some(*x)])
        }
        ONode::Pool([g, x]) => d(Box::new(Pool::parse(&tok(*g)?, Layout::Nchw)?), vec![Some(*x)]),
        ONode::PoolNhwc([g, x]) => d(Box::new(Pool::parse(&tok(*g)?, Layout::Nhwc)?), vec![Some(*x)]),
        ONode::Gap(x) => d(Box::new(GlobalAvgPool { layout: Layout::Nchw, flatten: false }), vec![Some(*x)]),
        ONode::GapNhwc(x) => d(Box::new(GlobalAvgPool { layout: Layout::Nhwc, flatten: false }), vec![Some(*x)]),
        ONode::GapFlatNhwc(x) => d(Box::new(GlobalAvgPool { layout: Layout::Nhwc, flatten: true }), vec![Some(*x)]),
        ONode::LayerNorm([x, s, b, eps]) => {
            d(Box::new(LayerNorm { axis: -1, eps: konst_scalar(*eps)? }), vec![Some(*x), Some(*s), opt(*b)])
        }
        ONode::Softmax([x, orig]) => {
            let k = orig_index(eg, *orig).ok_or_else(|| OpError("'softmax' without its original node".into()))?;
            let o = eg.analysis.origs.get(k).ok_or_else(|| OpError(format!("original node {k} does not exist")))?;
            d(o.op.clone(), vec![Some(*x)])
        }
        ONode::Attention([q, k, v, m, s, how]) => {
            let c = eg[*s]
                .data
                .fact
                .as_ref()
                .and_then(|f| f.konst.as_ref())
                .filter(|t| t.len() == 1)
                .and_then(|t| t.scalar_f64())
                .ok_or_else(|| OpError(format!("'{node}': the scale must be a one-element constant")))?;
            let how = tok(*how)?;
            let (mode, layout) = match how.strip_suffix("-bhsd") {
                Some(mode) => (mode, AttentionLayout::HeadsFirst),
                None => (how.as_str(), AttentionLayout::HeadsLast),
            };
            let scale = match mode {
                "mul" => c as f32,
                "div" => (1.0 / c) as f32,
                other => op_bail!("'{node}': scale mode must be mul, div, mul-bhsd or div-bhsd, found '{other}'"),
            };
            d(Box::new(Attention { scale, layout }), vec![Some(*q), Some(*k), Some(*v), opt(*m)])
        }
        ONode::SeScale([x, w1, b1, act, w2, b2, gate]) => d(
            Box::new(SqueezeExciteScale { act: act_of(*act)?, gate: act_of(*gate)? }),
            vec![Some(*x), Some(*w1), opt(*b1), Some(*w2), opt(*b2)],
        ),
        ONode::Opaque(sym, children) => {
            let Some((k, j)) = opaque_ref(sym.as_str()) else { op_bail!("malformed opaque node '{sym}'") };
            let o = eg.analysis.origs.get(k).ok_or_else(|| OpError(format!("original node {k} does not exist")))?;
            op_ensure!(j < o.num_outputs, "opaque node '{sym}': node has {} outputs", o.num_outputs);
            let inputs = children.iter().map(|&c| opt(c)).collect();
            Ok(Some(Denoted { op: o.op.clone(), inputs, output: j }))
        }
    }
}

/// Parses the axes of `squeeze` / `unsqueeze`, spelled like a permutation: `[2]`, `[0,3]`.
pub fn axes_of(token: &str) -> OpResult<Vec<i64>> {
    let axes = Transpose::parse_perm(token)?;
    op_ensure!(!axes.is_empty(), "'{token}': squeeze and unsqueeze need at least one axis");
    Ok(axes.into_iter().map(|a| a as i64).collect())
}

/// The token of `axes` for `squeeze` / `unsqueeze`.
pub fn axes_token(axes: &[usize]) -> String {
    Transpose::perm_token(axes)
}

/// Parses `ta<0|1>:tb<0|1>:a<alpha>:b<beta>`.
pub fn parse_gemm_attrs(t: &str) -> OpResult<Gemm> {
    let bad = || OpError(format!("malformed gemm attributes '{t}' (expected ta0:tb0:a1:b1)"));
    let f: Vec<&str> = t.split(':').collect();
    if f.len() != 4 {
        return Err(bad());
    }
    let flag = |s: &str, p: &str| match s.strip_prefix(p) {
        Some("0") => Ok(false),
        Some("1") => Ok(true),
        _ => Err(bad()),
    };
    let num = |s: &str, p: &str| s.strip_prefix(p).and_then(|v| v.parse::<f32>().ok()).ok_or_else(bad);
    Ok(Gemm {
        trans_a: flag(f[0], "ta")?,
        trans_b: flag(f[1], "tb")?,
        alpha: num(f[2], "a")?,
        beta: num(f[3], "b")?,
        act: None,
    })
}

pub fn gemm_attrs_token(g: &Gemm) -> String {
    format!("ta{}:tb{}:a{}:b{}", u8::from(g.trans_a), u8::from(g.trans_b), g.alpha, g.beta)
}

/// Infers (and, for all-constant inputs, evaluates) the fact of one e-node.
pub fn node_fact(eg: &OGraph, node: &ONode) -> OpResult<Option<Fact>> {
    if let ONode::Leaf(s) = node {
        return Ok(match leaf_kind(s.as_str()) {
            LeafKind::Const(k) => eg.analysis.consts.get(k).map(|t| Fact::constant(t.clone())),
            LeafKind::Input(k) => eg.analysis.inputs.get(k).cloned(),
            _ => None,
        });
    }
    let Some(den) = denote(eg, node)? else { return Ok(None) };
    let mut facts: Vec<Option<&Fact>> = Vec::with_capacity(den.inputs.len());
    for i in &den.inputs {
        match i {
            None => facts.push(None),
            Some(id) => match eg[*id].data.fact.as_ref() {
                Some(f) => facts.push(Some(f)),
                None => op_bail!("input class {id} of '{node}' has no type"),
            },
        }
    }
    let mut outs = den.op.infer(&facts)?;
    op_ensure!(den.output < outs.len(), "'{node}' reads output {} of an op with {}", den.output, outs.len());
    let mut fact = outs.swap_remove(den.output);
    let foldable = !matches!(node, ONode::Opaque(..))
        && facts.iter().flatten().all(|f| f.konst.is_some())
        && fact.ty.known_shape().is_some_and(|s| s.iter().product::<usize>() <= FOLD_LIMIT);
    if foldable {
        // Commutativity rules add `b ∘ a` next to a folded `a ∘ b`: reuse its value rather than
        // evaluating the (possibly weight-sized) product again.
        let swapped = match node {
            ONode::Add([a, b]) => Some(ONode::Add([*b, *a])),
            ONode::Mul([a, b]) => Some(ONode::Mul([*b, *a])),
            ONode::Max([a, b]) => Some(ONode::Max([*b, *a])),
            ONode::Min([a, b]) => Some(ONode::Min([*b, *a])),
            _ => None,
        };
        if let Some(k) =
            swapped.and_then(|n| eg.lookup(n)).and_then(|id| eg[id].data.fact.as_ref()).and_then(|f| f.konst.clone())
        {
            if k.dtype() == fact.dtype() {
                return Ok(Some(Fact::constant(k)));
            }
        }
        let tensors: Vec<Option<&Tensor>> = facts.iter().map(|f| f.and_then(|f| f.konst.as_deref())).collect();
        let mut vals = den.op.eval(&tensors)?;
        op_ensure!(den.output < vals.len(), "'{node}': evaluation produced {} outputs", vals.len());
        let t = vals.swap_remove(den.output);
        op_ensure!(t.dtype() == fact.dtype(), "'{node}': evaluation gave {} but inference {}", t.dtype(), fact.dtype());
        fact = Fact::constant(Arc::new(t));
    }
    Ok(Some(fact))
}

fn layout_of(node: &ONode) -> Option<Layout> {
    match node {
        ONode::KConv(_) | ONode::PoolNhwc(_) | ONode::GapNhwc(_) => Some(Layout::Nhwc),
        ONode::Conv(_) | ONode::Pool(_) | ONode::Gap(_) => Some(Layout::Nchw),
        _ => None,
    }
}

impl egg::Analysis<ONode> for OptAnalysis {
    type Data = Data;

    fn make(eg: &mut OGraph, node: &ONode, _id: Id) -> Data {
        match node_fact(eg, node) {
            Ok(fact) => Data { fact, layout: layout_of(node) },
            Err(e) => {
                // An ill-typed node can only come from a rule whose condition is too weak; the
                // class keeps no type from it and extraction never picks it.
                if eg.analysis.conflicts.len() < 64 {
                    eg.analysis.conflicts.push(format!("ill-typed node {node}: {e}"));
                }
                Data::default()
            }
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        let mut changed_a = false;
        let mut changed_b = false;
        match (&mut a.fact, b.fact) {
            (None, Some(fb)) => {
                a.fact = Some(fb);
                changed_a = true;
            }
            (Some(_), None) => changed_b = true,
            (None, None) => {}
            (Some(fa), Some(fb)) => {
                if fa.ty != fb.ty {
                    let msg = format!("merged classes disagree: {} vs {}", fa.ty, fb.ty);
                    debug_assert!(false, "{msg}");
                    if self.conflicts.len() < 64 {
                        self.conflicts.push(msg);
                    }
                }
                match (&fa.konst, fb.konst) {
                    (None, Some(k)) => {
                        fa.konst = Some(k);
                        changed_a = true;
                    }
                    (Some(_), None) => changed_b = true,
                    _ => {}
                }
            }
        }
        if a.layout.is_none() && b.layout.is_some() {
            a.layout = b.layout;
            changed_a = true;
        } else if a.layout.is_some() && b.layout.is_none() {
            changed_b = true;
        }
        DidMerge(changed_a, changed_b)
    }

    /// A class whose value became known gets a constant leaf, which extraction prefers (cost 0):
    /// this is how weight-only subgraphs fold into new constants.
    fn modify(eg: &mut OGraph, id: Id) {
        let Some(k) = eg[id].data.fact.as_ref().and_then(|f| f.konst.clone()) else {
            return;
        };
        let has_leaf = eg[id]
            .nodes
            .iter()
            .any(|n| matches!(n, ONode::Leaf(s) if matches!(leaf_kind(s.as_str()), LeafKind::Const(_))));
        if has_leaf {
            return;
        }
        let c = eg.analysis.intern_const(k);
        let leaf = eg.add(super::language::leaf(format!("c{c}")));
        eg.union(id, leaf);
    }
}

/// Whether every child of `node` has a type (attribute leaves aside): extraction only considers
/// such nodes.
pub fn children_typed(eg: &OGraph, node: &ONode) -> bool {
    node.children().iter().all(|&c| eg[c].data.fact.is_some() || eg[c].nodes.iter().all(|n| n.is_leaf()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_dedups_by_content_not_by_sampled_fingerprint() {
        let mut a = OptAnalysis::default();
        let big: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
        let i0 = a.intern_const(Arc::new(Tensor::from_f32s(&[100, 100], big.clone())));
        // Equal content in a different allocation: the same constant.
        let i1 = a.intern_const(Arc::new(Tensor::from_f32s(&[100, 100], big.clone())));
        assert_eq!(i0, i1);
        // Differs only at an element the fingerprint does not sample: same fingerprint, but the
        // full comparison keeps them apart.
        let mut other = big.clone();
        other[1] += 1.0;
        let t = Tensor::from_f32s(&[100, 100], other);
        assert_eq!(fingerprint(&t), fingerprint(&Tensor::from_f32s(&[100, 100], big.clone())));
        let i2 = a.intern_const(Arc::new(t));
        assert_ne!(i0, i2);
        // Same values, other shape or dtype: different constants.
        let i3 = a.intern_const(Arc::new(Tensor::from_f32s(&[10_000], big)));
        assert_ne!(i0, i3);
        let i4 = a.intern_const(Arc::new(Tensor::from_i64s(&[2], vec![0, 1])));
        let i5 = a.intern_const(Arc::new(Tensor::from_f32s(&[2], vec![0.0, 0.5]).cast(crate::ir::DType::F64)));
        assert_ne!(i4, i5);
        assert_eq!(a.consts.len(), 5);
    }

    #[test]
    fn fingerprint_ignores_memory_layout() {
        let t = Tensor::from_f32s(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let Tensor::F32(arr) = &t else { unreachable!() };
        // The same logical values held in Fortran order.
        let fortran = Tensor::F32(arr.t().to_owned().reversed_axes());
        assert_eq!(t, fortran);
        assert_eq!(fingerprint(&t), fingerprint(&fortran));
    }
}
