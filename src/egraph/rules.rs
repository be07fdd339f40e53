//! Rules as data: the `rewrites/*.rules` parser and the registry of named conditions.
//!
//! Syntax, one rule per line (a line ending in `\` continues on the next; `#` starts a comment):
//!
//! ```text
//! conv-bias: (add (conv ?x ?w none ?g) (chan 2 ?t)) => (conv ?x ?w ?t ?g) if const(?t)
//! ```
//!
//! `name: LHS => RHS [if cond(args), cond(args)…]`. LHS and RHS are egg patterns over
//! [`ONode`]; a condition is a predicate registered in [`PREDICATES`] applied to pattern
//! variables or literal tokens. Unknown operators or wrong arities in patterns, unknown
//! predicates or arities, unbound variables, duplicate names and a bare-variable LHS are
//! load-time errors naming `file:line`.

use super::analysis::{token_of, OGraph, OptAnalysis};
use super::language::ONode;
use crate::ir::broadcast::broadcast_shapes;
use crate::ir::ops::kernel::{Act, ChannelView, ReduceMean};
use crate::ir::Fact;
use egg::{Applier, ENodeOrVar, Id, Language, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

include!(concat!(env!("OUT_DIR"), "/rule_files.rs"));

/// A load-time error in a rules file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub file: String,
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.msg)
    }
}

impl std::error::Error for RuleError {}

/// An argument of a condition: a pattern variable or a literal token.
#[derive(Clone, Debug, PartialEq)]
pub enum PredArg {
    Var(Var),
    Lit(String),
}

/// A named condition: `check(egraph, matched class, substitution, args)`.
pub struct Predicate {
    pub name: &'static str,
    pub arity: usize,
    pub doc: &'static str,
    pub check: fn(&OGraph, Id, &Subst, &[PredArg]) -> bool,
}

/// One condition of a rule.
#[derive(Clone)]
pub struct Cond {
    pub pred: &'static Predicate,
    pub args: Vec<PredArg>,
}

/// A parsed rule, before it becomes an egg `Rewrite`.
#[derive(Clone)]
pub struct RuleDef {
    pub name: String,
    pub file: String,
    pub line: usize,
    pub lhs: Pattern<ONode>,
    pub rhs: Pattern<ONode>,
    pub conds: Vec<Cond>,
}

impl RuleDef {
    pub fn to_rewrite(&self) -> Result<Rewrite<ONode, OptAnalysis>, RuleError> {
        let applier = CondApplier { rhs: self.rhs.clone(), conds: self.conds.clone() };
        Rewrite::new(self.name.clone(), self.lhs.clone(), applier).map_err(|m| RuleError {
            file: self.file.clone(),
            line: self.line,
            msg: m,
        })
    }
}

/// Checks the conditions, then instantiates the right-hand side (and unions it with the match).
/// A plain applier rather than egg's `ConditionalApplier`, so conditions see the matched class.
struct CondApplier {
    rhs: Pattern<ONode>,
    conds: Vec<Cond>,
}

impl Applier<ONode, OptAnalysis> for CondApplier {
    fn apply_one(
        &self,
        eg: &mut OGraph,
        eclass: Id,
        subst: &Subst,
        ast: Option<&PatternAst<ONode>>,
        rule: Symbol,
    ) -> Vec<Id> {
        if !self.conds.iter().all(|c| (c.pred.check)(eg, eclass, subst, &c.args)) {
            return Vec::new();
        }
        self.rhs.apply_one(eg, eclass, subst, ast, rule)
    }

    fn vars(&self) -> Vec<Var> {
        self.rhs.vars()
    }
}

/// Loads one of the embedded rule files by name (`cleanup.rules`).
pub fn load_embedded(file: &str) -> Result<Vec<RuleDef>, RuleError> {
    let text = RULE_FILES.iter().find(|(n, _)| *n == file).map(|(_, t)| *t).ok_or_else(|| RuleError {
        file: file.to_string(),
        line: 0,
        msg: "no such rules file in rewrites/".into(),
    })?;
    parse_rules(file, text)
}

/// Parses a rules file.
pub fn parse_rules(file: &str, text: &str) -> Result<Vec<RuleDef>, RuleError> {
    let mut rules: Vec<RuleDef> = Vec::new();
    let mut names = BTreeSet::new();
    let mut pending = String::new();
    let mut start_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let content = raw.split('#').next().unwrap_or("").trim_end();
        if pending.is_empty() {
            start_line = i + 1;
        }
        if let Some(head) = content.strip_suffix('\\') {
            pending.push_str(head);
            pending.push(' ');
            continue;
        }
        pending.push_str(content);
        let line = std::mem::take(&mut pending);
        if line.trim().is_empty() {
            continue;
        }
        let rule = parse_rule(file, start_line, line.trim())?;
        if !names.insert(rule.name.clone()) {
            return Err(RuleError {
                file: file.into(),
                line: start_line,
                msg: format!("rule '{}' is defined twice", rule.name),
            });
        }
        rules.push(rule);
    }
    if !pending.trim().is_empty() {
        return Err(RuleError {
            file: file.into(),
            line: start_line,
            msg: "the file ends inside a continued line".into(),
        });
    }
    Ok(rules)
}

fn parse_rule(file: &str, line: usize, text: &str) -> Result<RuleDef, RuleError> {
    let err = |msg: String| RuleError { file: file.to_string(), line, msg };
    let (name, body) = text.split_once(':').ok_or_else(|| err("expected 'name: LHS => RHS [if conditions]'".into()))?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
        return Err(err(format!("rule name '{name}' must be letters, digits, '-' or '_'")));
    }
    let (lhs_s, rest) = body.split_once("=>").ok_or_else(|| err(format!("rule '{name}': missing '=>'")))?;
    let (rhs_s, cond_s) = split_conditions(rest);
    let lhs = parse_pattern(lhs_s.trim()).map_err(|m| err(format!("rule '{name}', left-hand side: {m}")))?;
    let rhs = parse_pattern(rhs_s.trim()).map_err(|m| err(format!("rule '{name}', right-hand side: {m}")))?;
    if matches!(lhs.ast.as_ref().last(), Some(ENodeOrVar::Var(_))) {
        return Err(err(format!("rule '{name}': the left-hand side must not be a bare variable")));
    }
    let bound: BTreeSet<Var> = lhs.vars().into_iter().collect();
    for v in rhs.vars() {
        if !bound.contains(&v) {
            return Err(err(format!("rule '{name}': variable {v} on the right is not bound on the left")));
        }
    }
    let mut conds = Vec::new();
    if let Some(cs) = cond_s {
        for c in split_top_level(cs, ',') {
            let c = c.trim();
            let (pname, args) = c
                .strip_suffix(')')
                .and_then(|c| c.split_once('('))
                .ok_or_else(|| err(format!("rule '{name}': malformed condition '{c}' (expected pred(?a, …))")))?;
            let pname = pname.trim();
            let pred = PREDICATES.iter().find(|p| p.name == pname).ok_or_else(|| {
                err(format!("rule '{name}': unknown condition '{pname}' (known: {})", predicate_names()))
            })?;
            let args: Vec<PredArg> = args
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(|a| match a.strip_prefix('?') {
                    Some(_) => Var::from_str(a).map(PredArg::Var).map_err(|e| format!("{e}")),
                    None => Ok(PredArg::Lit(a.to_string())),
                })
                .collect::<Result<_, _>>()
                .map_err(|m| err(format!("rule '{name}': {m}")))?;
            if args.len() != pred.arity {
                return Err(err(format!(
                    "rule '{name}': condition '{pname}' takes {} argument(s), found {}",
                    pred.arity,
                    args.len()
                )));
            }
            for a in &args {
                if let PredArg::Var(v) = a {
                    if !bound.contains(v) {
                        return Err(err(format!(
                            "rule '{name}': variable {v} in condition '{pname}' is not bound on the left"
                        )));
                    }
                }
            }
            conds.push(Cond { pred, args });
        }
    }
    Ok(RuleDef { name: name.to_string(), file: file.to_string(), line, lhs, rhs, conds })
}

/// Splits `RHS if c1, c2` at the first ` if ` outside parentheses.
fn split_conditions(s: &str) -> (&str, Option<&str>) {
    let mut depth = 0i32;
    let bytes = s.as_bytes();
    for i in 0..bytes.len() {
        match bytes[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b' ' if depth == 0 && s[i..].starts_with(" if ") => return (&s[..i], Some(&s[i + 4..])),
            _ => {}
        }
    }
    (s, None)
}

fn split_top_level(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if c == sep && depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// Parses a pattern and rejects operators the language does not have (egg would otherwise read
/// a misspelt or mis-arity operator as an opaque node that never matches).
pub fn parse_pattern(s: &str) -> Result<Pattern<ONode>, String> {
    let p = Pattern::<ONode>::from_str(s).map_err(|e| e.to_string())?;
    for n in p.ast.as_ref() {
        if let ENodeOrVar::ENode(ONode::Opaque(op, children)) = n {
            return Err(format!("unknown operator '{op}' with {} operand(s)", children.len()));
        }
        if let ENodeOrVar::ENode(ONode::Leaf(sym)) = n {
            if matches!(
                super::language::leaf_kind(sym.as_str()),
                super::language::LeafKind::Const(_)
                    | super::language::LeafKind::Input(_)
                    | super::language::LeafKind::Orig(_)
            ) {
                return Err(format!("leaf '{sym}' names a model-specific constant, input or node"));
            }
        }
    }
    Ok(p)
}

fn predicate_names() -> String {
    PREDICATES.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
}

// ---------------------------------------------------------------------------------------------
// The predicate registry.

fn var_id(subst: &Subst, a: &PredArg) -> Option<Id> {
    match a {
        PredArg::Var(v) => subst.get(*v).copied(),
        PredArg::Lit(_) => None,
    }
}

fn fact<'a>(eg: &'a OGraph, subst: &Subst, a: &PredArg) -> Option<&'a Fact> {
    eg[var_id(subst, a)?].data.fact.as_ref()
}

fn lit(a: &PredArg) -> Option<&str> {
    match a {
        PredArg::Lit(s) => Some(s),
        PredArg::Var(_) => None,
    }
}

fn token(eg: &OGraph, subst: &Subst, a: &PredArg) -> Option<String> {
    token_of(eg, var_id(subst, a)?)
}

fn p_const(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    fact(eg, s, &a[0]).is_some_and(|f| f.konst.is_some())
}

fn p_float(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    fact(eg, s, &a[0]).is_some_and(|f| f.dtype().is_float())
}

fn p_rank(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    let Some(r) = lit(&a[1]).and_then(|r| r.parse::<usize>().ok()) else {
        return false;
    };
    fact(eg, s, &a[0]).is_some_and(|f| f.rank() == r)
}

fn p_same_shape(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    matches!((fact(eg, s, &a[0]), fact(eg, s, &a[1])), (Some(x), Some(y)) if x.ty == y.ty)
}

fn p_shape_of_root(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    matches!((fact(eg, s, &a[0]), eg[root].data.fact.as_ref()), (Some(x), Some(y)) if x.ty == y.ty)
}

fn p_broadcasts_to_root(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(x), Some(r)) = (fact(eg, s, &a[0]), eg[root].data.fact.as_ref()) else {
        return false;
    };
    x.dtype() == r.dtype()
        && x.rank() <= r.rank()
        && broadcast_shapes(&[x.shape(), r.shape()]).is_ok_and(|b| b == r.shape())
}

/// `?c` holds one value per channel of the NCHW-style tensor `?x` (channel axis 1): every dim 1
/// except the one aligned with axis 1, which equals `?x`'s channel count.
fn p_per_channel(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(c), Some(x)) = (fact(eg, s, &a[0]), fact(eg, s, &a[1])) else {
        return false;
    };
    if x.rank() < 2 || c.rank() > x.rank() || c.rank() + 1 < x.rank() || c.dtype() != x.dtype() {
        return false;
    }
    let offset = x.rank() - c.rank();
    let one = crate::ir::Dim::known(1);
    c.shape().iter().enumerate().all(|(i, d)| if i + offset == 1 { *d == x.shape()[1] } else { *d == one })
}

/// `?c` holds one value per element of `?y`'s last axis (a bias row): `[C]`, `[1,C]`, ….
fn p_last_axis_vector(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(c), Some(y)) = (fact(eg, s, &a[0]), fact(eg, s, &a[1])) else {
        return false;
    };
    let (Some(last), Some(ch)) = (y.shape().last(), ChannelView::channels(c.shape())) else {
        return false;
    };
    c.rank() >= 1 && c.rank() <= y.rank() && c.dtype() == y.dtype() && c.shape().last() == Some(last) && ch == *last
}

/// `?t` is a vector with one value per channel (axis 1) of the matched class.
fn p_chan_vector(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(t), Some(r)) = (fact(eg, s, &a[0]), eg[root].data.fact.as_ref()) else {
        return false;
    };
    t.rank() == 1 && r.rank() >= 2 && t.shape()[0] == r.shape()[1]
}

/// `?t` has one value per element of the matched class's last axis (`[C]`, `[1,C]`, …).
fn p_root_last_axis_vector(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(c), Some(y)) = (fact(eg, s, &a[0]), eg[root].data.fact.as_ref()) else {
        return false;
    };
    let (Some(last), Some(ch)) = (y.shape().last(), ChannelView::channels(c.shape())) else {
        return false;
    };
    c.rank() >= 1 && c.rank() <= y.rank() && c.dtype() == y.dtype() && c.shape().last() == Some(last) && ch == *last
}

fn p_epilogue_act(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    token(eg, s, &a[0]).and_then(|t| Act::parse(&t).ok()).is_some_and(|f| f.is_activation())
}

/// `?c` is a constant with one element equal to the literal (relative tolerance 1e-6, so
/// `1.4142135` matches the f32 √2 exporters write).
fn p_scalar(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    let Some(want) = lit(&a[1]).and_then(|v| v.parse::<f64>().ok()) else {
        return false;
    };
    fact(eg, s, &a[0])
        .and_then(|f| f.konst.as_ref())
        .and_then(|t| t.scalar_f64())
        .is_some_and(|v| (v - want).abs() <= 1e-6 * want.abs().max(1.0))
}

/// `?ax` is a mean reduction token over exactly the last axis of `?x`, keeping dims.
fn p_reduce_last_axis(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(t), Some(x)) = (token(eg, s, &a[0]), fact(eg, s, &a[1])) else {
        return false;
    };
    let Ok(r) = ReduceMean::parse(&t) else { return false };
    let rank = x.rank() as i64;
    r.keepdims && r.axes.len() == 1 && rank > 0 && (r.axes[0] == -1 || r.axes[0] == rank - 1)
}

/// `?c` is a one-element constant of `?x`'s dtype and no higher rank: broadcasting it commutes
/// with any permutation of `?x`.
fn p_scalar_const(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    let (Some(c), Some(x)) = (fact(eg, s, &a[0]), fact(eg, s, &a[1])) else {
        return false;
    };
    c.konst.as_ref().is_some_and(|t| t.len() == 1) && c.rank() <= x.rank() && c.dtype() == x.dtype()
}

fn p_beta_one(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    token(eg, s, &a[0]).and_then(|t| super::analysis::parse_gemm_attrs(&t).ok()).is_some_and(|g| g.beta == 1.0)
}

/// `attention-fits(?q, ?k, ?v, ?m)`: heads-last q, k, v (and the mask `?m`, or the literal
/// `none`) are operands the fused attention kernel accepts (equal batch, heads and head size, a
/// mask that broadcasts to the scores), and its output has the matched class's type.
fn p_attention_fits(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    attention_fits(eg, root, s, a, crate::ir::ops::kernel::AttentionLayout::HeadsLast)
}

/// `attention-fits-bhsd(?q, ?k, ?v, ?m)`: `attention-fits` for heads-first `[B, H, S, D]` operands.
fn p_attention_fits_bhsd(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    attention_fits(eg, root, s, a, crate::ir::ops::kernel::AttentionLayout::HeadsFirst)
}

fn attention_fits(
    eg: &OGraph,
    root: Id,
    s: &Subst,
    a: &[PredArg],
    layout: crate::ir::ops::kernel::AttentionLayout,
) -> bool {
    use crate::ir::Op;
    let (Some(q), Some(k), Some(v)) = (fact(eg, s, &a[0]), fact(eg, s, &a[1]), fact(eg, s, &a[2])) else {
        return false;
    };
    let m = match lit(&a[3]) {
        Some("none") => None,
        Some(_) => return false,
        None => match fact(eg, s, &a[3]) {
            Some(m) => Some(m),
            None => return false,
        },
    };
    let out = crate::ir::ops::kernel::Attention { scale: 1.0, layout }.infer(&[Some(q), Some(k), Some(v), m]);
    matches!((out, eg[root].data.fact.as_ref()), (Ok(o), Some(r)) if o.len() == 1 && o[0].ty == r.ty)
}

/// `squeeze-excite-fits(?x, ?w1, ?b1, ?g1, ?a1, ?w2, ?b2, ?g2, ?a2)`: the two NHWC convolutions
/// after a global average pooling of `?x` are a squeeze-and-excitation block's dense layers that
/// `kernel::SqueezeExciteScale` computes: constant filters, constant biases or `none`, group-1
/// unpadded geometries (on the 1x1 pooled image a 1x1 filter's stride and dilation change
/// nothing; padding would add border pixels), activations (or `none`) applied after each
/// product, operands the op's inference accepts (`w1` `[S,1,1,C]`, `w2` `[C,1,1,S]`), and C
/// and S known and within what the kernel holds in shared memory.
fn p_squeeze_excite_fits(eg: &OGraph, _: Id, s: &Subst, a: &[PredArg]) -> bool {
    use crate::ir::Op;
    let is_none = |arg: &PredArg| token(eg, s, arg).as_deref() == Some("none");
    let konst = |arg: &PredArg| fact(eg, s, arg).filter(|f| f.konst.is_some());
    let bias = |arg: &PredArg| -> Option<Option<&Fact>> {
        if is_none(arg) {
            Some(None)
        } else {
            konst(arg).map(Some)
        }
    };
    let unit_geometry = |arg: &PredArg| {
        token(eg, s, arg)
            .and_then(|t| crate::ir::ops::kernel::ConvGeom::parse(&t).ok())
            .is_some_and(|g| g.group == 1 && g.pads == [0; 4])
    };
    let act = |arg: &PredArg| -> Option<Option<Act>> {
        match token(eg, s, arg)?.as_str() {
            "none" => Some(None),
            t => Act::parse(t).ok().filter(|f| f.is_activation()).map(Some),
        }
    };
    let (Some(x), Some(w1), Some(b1), Some(w2), Some(b2)) =
        (fact(eg, s, &a[0]), konst(&a[1]), bias(&a[2]), konst(&a[5]), bias(&a[6]))
    else {
        return false;
    };
    let (Some(act1), Some(act2)) = (act(&a[4]), act(&a[8])) else {
        return false;
    };
    if !unit_geometry(&a[3]) || !unit_geometry(&a[7]) {
        return false;
    }
    use crate::ir::ops::kernel::SqueezeExciteScale;
    let fits_kernel = |d: &crate::ir::Dim| d.as_known().is_some_and(|v| v > 0 && v <= SqueezeExciteScale::MAX_CHANNELS);
    if !(x.rank() == 4 && fits_kernel(&x.shape()[3]) && w1.rank() == 4 && fits_kernel(&w1.shape()[0])) {
        return false;
    }
    let op = SqueezeExciteScale { act: act1, gate: act2 };
    op.infer(&[Some(x), Some(w1), b1, Some(w2), b2]).is_ok()
}

/// `multiplies(?x)`: the matched class is an operand of a product with `?x` (some `mul` node
/// reads both). Lets a rule rewrite a value by what it is used for, as the squeeze-excite rule
/// rewrites a scale only where it scales the very tensor it was pooled from.
fn p_multiplies(eg: &OGraph, root: Id, s: &Subst, a: &[PredArg]) -> bool {
    let Some(x) = var_id(s, &a[0]).map(|x| eg.find(x)) else {
        return false;
    };
    let root = eg.find(root);
    eg[root].parents().any(|p| match eg.id_to_node(p) {
        ONode::Mul([l, r]) => {
            let (l, r) = (eg.find(*l), eg.find(*r));
            (l == root && r == x) || (l == x && r == root)
        }
        _ => false,
    })
}

/// Every condition rules may use. Names are kebab-case; arities are checked at load time.
pub static PREDICATES: &[Predicate] = &[
    Predicate { name: "const", arity: 1, doc: "the class has a compile-time constant value", check: p_const },
    Predicate { name: "float", arity: 1, doc: "the class holds a floating-point tensor", check: p_float },
    Predicate { name: "rank", arity: 2, doc: "rank(?x, n): ?x has rank n", check: p_rank },
    Predicate { name: "same-shape", arity: 2, doc: "both classes have the same dtype and shape", check: p_same_shape },
    Predicate {
        name: "shape-of-root",
        arity: 1,
        doc: "?x has the dtype and shape of the matched class",
        check: p_shape_of_root,
    },
    Predicate {
        name: "broadcasts-to-root",
        arity: 1,
        doc: "?x broadcasts to the matched class's shape",
        check: p_broadcasts_to_root,
    },
    Predicate {
        name: "per-channel",
        arity: 2,
        doc: "per-channel(?c, ?x): ?c has one value per channel (axis 1) of ?x",
        check: p_per_channel,
    },
    Predicate {
        name: "last-axis-vector",
        arity: 2,
        doc: "last-axis-vector(?c, ?y): ?c has one value per element of ?y's last axis",
        check: p_last_axis_vector,
    },
    Predicate {
        name: "chan-vector",
        arity: 1,
        doc: "?t is a vector with one value per channel (axis 1) of the matched class",
        check: p_chan_vector,
    },
    Predicate {
        name: "root-last-axis-vector",
        arity: 1,
        doc: "?t has one value per element of the matched class's last axis",
        check: p_root_last_axis_vector,
    },
    Predicate {
        name: "epilogue-act",
        arity: 1,
        doc: "?f is an activation a conv/gemm epilogue can apply",
        check: p_epilogue_act,
    },
    Predicate {
        name: "scalar",
        arity: 2,
        doc: "scalar(?c, v): ?c is a one-element constant equal to v",
        check: p_scalar,
    },
    Predicate {
        name: "reduce-last-axis",
        arity: 2,
        doc: "reduce-last-axis(?ax, ?x): ?ax reduces exactly ?x's last axis, keeping dims",
        check: p_reduce_last_axis,
    },
    Predicate {
        name: "scalar-const",
        arity: 2,
        doc: "scalar-const(?c, ?x): ?c is a one-element constant of ?x's dtype and at most its rank",
        check: p_scalar_const,
    },
    Predicate {
        name: "attention-fits",
        arity: 4,
        doc: "attention-fits(?q, ?k, ?v, ?m|none): heads-last operands (and mask) the fused attention kernel accepts, giving the matched class's type",
        check: p_attention_fits,
    },
    Predicate {
        name: "attention-fits-bhsd",
        arity: 4,
        doc: "attention-fits-bhsd(?q, ?k, ?v, ?m|none): heads-first [B, H, S, D] operands (and mask) the fused attention kernel accepts, giving the matched class's type",
        check: p_attention_fits_bhsd,
    },
    Predicate {
        name: "multiplies",
        arity: 1,
        doc: "multiplies(?x): the matched class is an operand of a product with ?x",
        check: p_multiplies,
    },
    Predicate {
        name: "squeeze-excite-fits",
        arity: 9,
        doc: "squeeze-excite-fits(?x, ?w1, ?b1, ?g1, ?a1, ?w2, ?b2, ?g2, ?a2): the two 1x1 convolutions after a \
              global average pooling of ?x are dense layers kernel::SqueezeExciteScale computes",
        check: p_squeeze_excite_fits,
    },
    Predicate {
        name: "beta-one",
        arity: 1,
        doc: "gemm attributes with beta = 1 (a bias can be added unscaled)",
        check: p_beta_one,
    },
];

/// Every operator name of the language, for documentation and tests.
pub fn is_language_op(node: &ONode) -> bool {
    !matches!(node, ONode::Opaque(..)) && !node.is_leaf()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_rule_files_load() {
        for (name, _) in RULE_FILES {
            let rules = load_embedded(name).unwrap_or_else(|e| panic!("{e}"));
            assert!(!rules.is_empty(), "{name} has no rules");
            for r in &rules {
                r.to_rewrite().unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }

    #[test]
    fn malformed_rules_name_file_and_line() {
        let cases = [
            ("ok: (act relu ?x) => ?x\nbad: (conv ?x ?w) => ?x\n", 2, "unknown operator 'conv'"),
            ("# c\n\nr: (act ?f ?x) => ?x if nosuch(?x)\n", 3, "unknown condition 'nosuch'"),
            ("r: (act ?f ?x) => ?y\n", 1, "not bound"),
            ("r: ?x => (act relu ?x)\n", 1, "bare variable"),
            ("r: (act ?f ?x) => ?x if rank(?x)\n", 1, "takes 2 argument"),
            ("r: (act ?f ?x) => ?x\nr: (act ?f ?x) => ?x\n", 2, "defined twice"),
            ("r: (act ?f ?x) \\\n", 1, "ends inside"),
        ];
        for (text, line, msg) in cases {
            let e = match parse_rules("t.rules", text) {
                Err(e) => e,
                Ok(_) => panic!("accepted: {text}"),
            };
            assert_eq!((e.file.as_str(), e.line), ("t.rules", line), "{e}");
            assert!(e.to_string().contains(msg), "{e}");
            assert!(e.to_string().starts_with(&format!("t.rules:{line}: ")), "{e}");
        }
    }

    #[test]
    fn continued_lines_and_conditions_parse() {
        let r =
            parse_rules("t.rules", "a: (add ?x \\\n  ?y) => (add ?y ?x) if same-shape(?x, ?y), rank(?x, 4) # note\n")
                .unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].line, 1);
        assert_eq!(r[0].conds.len(), 2);
        assert_eq!(r[0].conds[1].args[1], PredArg::Lit("4".into()));
    }
}
