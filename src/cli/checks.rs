//! What the commands share about a model: loading it with its warnings printed, and the option
//! checks of `onnx2ait::compile::checks` (`--dim` names, sizes, the GPU memory bound).

use super::validate::DimSpec;
use super::Failure;
use onnx2ait::ir::{DType, Graph};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub use onnx2ait::compile::checks::{check_dims, check_sizes, fmt_bytes, gpu_memory_bound, parse_size, symbols, Bound};

/// Imports a model and prints its import warnings (e.g. an opset newer than the newest supported)
/// on stderr, as `warning: …`.
pub fn load_model(path: &Path) -> Result<Graph, Failure> {
    let g = onnx2ait::onnx::load_model(path)?;
    print_warnings(&g);
    Ok(g)
}

/// Prints the graph's import warnings on stderr.
pub fn print_warnings(g: &Graph) {
    let mut err = std::io::stderr().lock();
    for w in &g.info.warnings {
        let _ = writeln!(err, "warning: {}: {w}", g.info.source);
    }
}

/// The `--dim NAME=N` pairs as a map (their names are checked against the model by
/// [`check_dims`]); a name given twice is an error.
pub fn check_dims_given<T: Copy>(pairs: &[(String, T)]) -> Result<BTreeMap<String, T>, Failure> {
    let mut m = BTreeMap::new();
    for (name, value) in pairs {
        if m.insert(name.clone(), *value).is_some() {
            return Err(Failure::new(1, format!("--dim {name} is given more than once")));
        }
    }
    Ok(m)
}

/// `--dim` given as values or ranges (compile, profile): the fixed values and the run-time ranges
/// by name; a name given twice is an error. Names are checked against the model later
/// ([`check_dims`], `check_ranges`).
pub fn split_dims(
    given: &[(String, DimSpec)],
) -> Result<(BTreeMap<String, i64>, BTreeMap<String, (i64, i64)>), Failure> {
    let mut fixed = BTreeMap::new();
    let mut ranges = BTreeMap::new();
    for (name, spec) in check_dims_given(given)? {
        match spec {
            DimSpec::Fixed(n) => {
                fixed.insert(name, n);
            }
            DimSpec::Range(lo, hi) => {
                ranges.insert(name, (lo, hi));
            }
        }
    }
    Ok((fixed, ranges))
}

/// Bytes of an element of `t` as the host stores it.
pub fn host_bytes(t: DType) -> u64 {
    t.size_bytes() as u64
}
