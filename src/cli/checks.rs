//! What the commands share about a model: loading it with its warnings printed, and the option
//! checks of `onnx2ait::compile::checks` (`--dim` names, sizes, the GPU memory bound).

use super::Failure;
use onnx2ait::ir::{DType, Graph};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

pub use onnx2ait::compile::checks::{check_dims, check_sizes, fmt_bytes, gpu_memory_bound, symbols, Bound};

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
pub fn check_dims_given(pairs: &[(String, i64)]) -> Result<BTreeMap<String, i64>, Failure> {
    let mut m = BTreeMap::new();
    for (name, value) in pairs {
        if m.insert(name.clone(), *value).is_some() {
            return Err(Failure::new(1, format!("--dim {name} is given more than once")));
        }
    }
    Ok(m)
}

/// Bytes of an element of `t` as the host stores it.
pub fn host_bytes(t: DType) -> u64 {
    t.size_bytes() as u64
}

/// A memory size: bytes, or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB,
/// GB, TB (powers of 1000); `K`/`M`/`G`/`T` alone are the binary units. Case is ignored.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "m" | "mib" => 1024f64.powi(2),
        "g" | "gib" => 1024f64.powi(3),
        "t" | "tib" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("'{s}' is not a memory size (e.g. 80GiB, 141GB, 40000MiB)")),
    };
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale >= 1.0 && v * scale < 2f64.powi(63) => Ok((v * scale) as u64),
        _ => Err(format!("'{s}' is not a memory size (a positive number with an optional unit, e.g. 80GiB, 141GB)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_sizes_parse() {
        assert_eq!(parse_size("80GiB").unwrap(), 80 << 30);
        assert_eq!(parse_size("141GB").unwrap(), 141_000_000_000);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        for bad in ["", "0", "-1GB", "12 parsecs", "nan", "1e400", "99999999999TB"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
