//! What the commands share about a model: loading it with its warnings printed, and the option
//! checks of `onnx2ait::compile::checks` (`--dim` names, sizes, the GPU memory bound).

use super::validate::DimSpec;
use super::Failure;
use onnx2ait::ir::{DType, Graph};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub use onnx2ait::compile::checks::{check_dims, check_sizes, fmt_bytes, largest_dims, parse_size, Bound};

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

/// The largest run-time batch of compile and profile: a range of the batch dim
/// (`--dim batch=1..8`) governs; otherwise `--max-batch` (`given`), or `default`. A `--max-batch`
/// other than the largest value of the batch dim's range is refused, naming both: the two would
/// say different things about the same dim, and neither silently winning is what a user wants.
pub fn max_batch(
    g: &Graph,
    fixed: &BTreeMap<String, i64>,
    ranges: &BTreeMap<String, (i64, i64)>,
    given: Option<i64>,
    default: i64,
) -> Result<i64, Failure> {
    batch_bound(g, fixed, ranges, given, default, "--max-batch")
}

/// [`max_batch`] for any option that gives the batch's largest value (`flag`, e.g. explain's
/// `--batch`, the batch it prices at, which compile takes to be the largest).
pub fn batch_bound(
    g: &Graph,
    fixed: &BTreeMap<String, i64>,
    ranges: &BTreeMap<String, (i64, i64)>,
    given: Option<i64>,
    default: i64,
    flag: &str,
) -> Result<i64, Failure> {
    match (onnx2ait::lower::ranged_batch(g, fixed, ranges), given) {
        (Some((name, (_, max))), Some(m)) if m != max => Err(Failure::new(
            1,
            format!(
                "{flag} {m} contradicts --dim {name}={}..{max}: '{name}' is the batch dim, and its range \
                 already bounds the batch; drop {flag} (or make it {max})",
                ranges[&name].0
            ),
        )),
        (Some((_, (_, max))), _) => Ok(max),
        (None, m) => Ok(m.unwrap_or(default)),
    }
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
