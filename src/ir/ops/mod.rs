//! The op registry: every supported ONNX op, one file per op family.
//!
//! Each family file declares `pub const OPS: &[OpSpec]`, one entry per op type with its parser;
//! `FAMILIES` below is the only list, and `registry()` checks it once (no duplicate keys).
//! Adding an op: see "Adding an op" in README.md.

use super::attr::NodeCtx;
use super::op::{Op, OpResult};
use std::collections::BTreeMap;
use std::sync::OnceLock;

pub mod activation;
pub mod arithmetic;
pub mod cast;
pub mod conv;
pub mod cumsum;
pub mod einsum;
pub mod generator;
pub mod hardmax;
pub mod indexing;
pub mod kernel;
pub mod layout;
pub mod linalg;
pub mod logical;
pub mod lp_pool;
pub mod mvn;
pub mod normalization;
pub mod pool;
pub mod reduce;
pub mod resize;
pub mod scatter;
pub mod shape;
pub mod softmax;
#[cfg(test)]
pub(crate) mod testutil;
pub mod trilu;

/// Builds the typed op of one node from its attributes (and opset version).
pub type ParseFn = fn(&NodeCtx) -> OpResult<Box<dyn Op>>;

/// Declaration of one supported op type.
pub struct OpSpec {
    pub op_type: &'static str,
    /// ONNX domain; "" is the default domain (also spelled "ai.onnx" in models).
    pub domain: &'static str,
    pub parse: ParseFn,
    /// What is not supported everywhere (e.g. run-time inputs that code generation rejects),
    /// printed by `onnx2ait ops`; empty when the op has no such restriction.
    pub note: &'static str,
}

impl OpSpec {
    pub const fn onnx(op_type: &'static str, parse: ParseFn) -> OpSpec {
        OpSpec { op_type, domain: "", parse, note: "" }
    }

    /// The same op with a restriction stated for `onnx2ait ops`.
    pub const fn with_note(self, note: &'static str) -> OpSpec {
        OpSpec { note, ..self }
    }
}

/// Every op family, in alphabetical order.
const FAMILIES: &[(&str, &[OpSpec])] = &[
    ("activation", activation::OPS),
    ("arithmetic", arithmetic::OPS),
    ("cast", cast::OPS),
    ("conv", conv::OPS),
    ("cumsum", cumsum::OPS),
    ("einsum", einsum::OPS),
    ("generator", generator::OPS),
    ("hardmax", hardmax::OPS),
    ("indexing", indexing::OPS),
    ("layout", layout::OPS),
    ("linalg", linalg::OPS),
    ("logical", logical::OPS),
    ("lp_pool", lp_pool::OPS),
    ("mvn", mvn::OPS),
    ("normalization", normalization::OPS),
    ("pool", pool::OPS),
    ("reduce", reduce::OPS),
    ("resize", resize::OPS),
    ("scatter", scatter::OPS),
    ("shape", shape::OPS),
    ("softmax", softmax::OPS),
    ("trilu", trilu::OPS),
];

pub struct Registry {
    by_key: BTreeMap<(&'static str, &'static str), (&'static str, &'static OpSpec)>,
}

impl Registry {
    pub fn lookup(&self, domain: &str, op_type: &str) -> Option<&'static OpSpec> {
        let domain = normalize_domain(domain);
        self.by_key.get(&(domain, op_type)).map(|(_, spec)| *spec)
    }

    /// Every supported op as (domain, op type, family), sorted.
    pub fn ops(&self) -> impl Iterator<Item = (&'static str, &'static str, &'static str)> + '_ {
        self.by_key.iter().map(|((d, o), (fam, _))| (*d, *o, *fam))
    }
}

/// "" and "ai.onnx" name the same domain.
pub fn normalize_domain(domain: &str) -> &str {
    if domain == "ai.onnx" {
        ""
    } else {
        domain
    }
}

pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let mut by_key = BTreeMap::new();
        for (family, specs) in FAMILIES {
            for spec in specs.iter() {
                let prev = by_key.insert((spec.domain, spec.op_type), (*family, spec));
                // A duplicate is a bug in this table, caught by the registry test in CI.
                assert!(prev.is_none(), "op {} registered twice (family {family})", spec.op_type);
            }
        }
        Registry { by_key }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn registry_has_no_duplicates() {
        let r = super::registry();
        assert!(r.ops().count() > 0 || cfg!(debug_assertions));
    }
}
