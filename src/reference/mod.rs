//! CPU reference executor: runs any inferred IR graph with ndarray (f32 compute for floats).
//!
//! It is the numerical oracle of the project: validation compares it with ONNX Runtime, and
//! later stages check every rewrite against it without a GPU. The numeric kernels live in one
//! file per op family beside this one; ops call them from their `eval`.

use crate::error::{Error, Result};
use crate::ir::{Graph, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

pub mod activation;
pub mod arithmetic;
pub mod conv;
pub mod cumsum;
pub mod einsum;
pub mod hardmax;
pub mod indexing;
pub mod kernel;
pub mod layout;
pub mod linalg;
pub mod lp_pool;
pub mod mvn;
pub mod normalization;
pub mod pool;
pub mod reduce;
pub mod resize;
pub mod scatter;
pub mod softmax;
pub mod trilu;

/// Runs the graph on named inputs and returns the graph outputs in order.
///
/// Inputs are checked against the declared dtypes and shapes; symbolic dims are bound from the
/// first input that carries them and must agree everywhere else.
pub fn run(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<Vec<(String, Tensor)>> {
    let path = &g.info.source;
    let mut slots: Vec<Option<Arc<Tensor>>> = g.values.iter().map(|v| v.konst.clone()).collect();
    let mut env: BTreeMap<String, i64> = BTreeMap::new();
    for &id in &g.inputs {
        let v = &g.values[id];
        let t = inputs
            .get(&v.name)
            .ok_or_else(|| Error::model(path, format!("no value given for graph input '{}'", v.name)))?;
        let ty = g.ty(id);
        if t.dtype() != ty.dtype {
            return Err(Error::model(path, format!("input '{}' must be {}, got {}", v.name, ty.dtype, t.dtype())));
        }
        bind_dims(&ty.shape, t.shape(), &mut env)
            .map_err(|m| Error::model(path, format!("input '{}' {}: {m}", v.name, ty)))?;
        slots[id] = Some(Arc::new(t.clone()));
    }
    // Free each value after its last reader, so whole models run in bounded memory.
    let mut last_use = vec![usize::MAX; g.values.len()];
    for (n, node) in g.nodes.iter().enumerate() {
        for i in node.inputs.iter().flatten() {
            last_use[*i] = n;
        }
    }
    for &o in &g.outputs {
        last_use[o] = usize::MAX;
    }
    for (n, node) in g.nodes.iter().enumerate() {
        let ctx = |msg: String| Error::node(path, &node.name, &node.op_type, msg);
        let args: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|i| {
                i.map(|v| slots[v].as_deref().ok_or_else(|| ctx(format!("input '{}' not computed", g.values[v].name))))
                    .transpose()
            })
            .collect::<Result<_>>()?;
        let outs = node.op.eval(&args).map_err(|e| ctx(e.0))?;
        if outs.len() != node.outputs.len() {
            return Err(ctx(format!("produced {} outputs, expected {}", outs.len(), node.outputs.len())));
        }
        for (&v, t) in node.outputs.iter().zip(outs) {
            let ty = g.ty(v);
            if t.dtype() != ty.dtype {
                return Err(ctx(format!(
                    "output '{}' is {}, inference said {}",
                    g.values[v].name,
                    t.dtype(),
                    ty.dtype
                )));
            }
            bind_dims(&ty.shape, t.shape(), &mut env)
                .map_err(|m| ctx(format!("output '{}' {}: {m}", g.values[v].name, ty)))?;
            slots[v] = Some(Arc::new(t));
        }
        for i in node.inputs.iter().flatten() {
            if last_use[*i] == n && g.values[*i].konst.is_none() {
                slots[*i] = None;
            }
        }
    }
    g.outputs
        .iter()
        .map(|&o| {
            let t = slots[o]
                .as_ref()
                .ok_or_else(|| Error::model(path, format!("output '{}' not computed", g.values[o].name)))?;
            Ok((g.values[o].name.clone(), (**t).clone()))
        })
        .collect()
}

/// Checks a concrete shape against a symbolic one, binding unbound symbols (single-symbol
/// dims) and checking everything else after substitution.
fn bind_dims(
    expected: &[crate::ir::Dim],
    actual: &[usize],
    env: &mut BTreeMap<String, i64>,
) -> std::result::Result<(), String> {
    if expected.len() != actual.len() {
        return Err(format!("has rank {}, got shape {actual:?}", expected.len()));
    }
    for (d, &a) in expected.iter().zip(actual) {
        let d = d.eval(env);
        match d.as_known() {
            Some(k) if k == a as i64 => {}
            Some(k) => return Err(format!("dim {k} does not match actual shape {actual:?}")),
            None => {
                let syms: Vec<&str> = d.symbols().collect();
                if syms.len() == 1 && d == crate::ir::Dim::sym(syms[0]) {
                    env.insert(syms[0].to_string(), a as i64);
                }
                // Composite expressions over unbound symbols cannot be checked yet; they are
                // checked when a later value binds the symbol.
            }
        }
    }
    Ok(())
}
