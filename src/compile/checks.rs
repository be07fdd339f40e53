//! Checks of compile options against the model, shared by `compile` and the commands that run
//! a model: dim names, sizes at the dims and batch asked for (checked arithmetic, bounded by the
//! memory that will hold them), and the GPU memory bound of an architecture. Messages name the
//! command-line options (`--dim`, `--max-batch`), which the Rust and Python APIs take under the
//! same names.

use crate::ir::dim::fmt_shape;
use crate::ir::{DType, Dim, Graph};
use crate::lower::cuda::Arch;
use crate::{Error, Result};
use std::collections::{BTreeMap, BTreeSet};

/// The symbolic dims a `--dim` may name: every symbol of the graph's value types, except the
/// ones standing for run-time data (`y:0`), which no option can fix.
pub fn symbols(g: &Graph) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for v in &g.values {
        if let Some(ty) = &v.ty {
            for d in &ty.shape {
                out.extend(d.symbols().filter(|s| !is_runtime_symbol(s)).map(str::to_string));
            }
        }
    }
    out
}

fn is_runtime_symbol(s: &str) -> bool {
    s.contains(':') || s == "?" || s == "overflow"
}

/// The dims a size check runs at, with the options that set them for its messages: the fixed
/// `dims`, every `--dim` range at its largest value, and the one symbol left with neither (the
/// run-time batch) at `max_batch`. The context names the options as the user gave them: `at
/// --max-batch 64 (batch dim 'N')`, `at --max-batch 64 (batch dim 'N') and the largest values of
/// --dim seq=1..512`, or, with a range of the batch dim itself, `at the largest values of --dim
/// batch=4..64, --dim seq=1..16` (never a `--max-batch` the user did not give).
pub fn largest_dims(
    g: &Graph,
    dims: &BTreeMap<String, i64>,
    ranges: &BTreeMap<String, (i64, i64)>,
    max_batch: i64,
) -> (BTreeMap<String, i64>, String) {
    let mut env = dims.clone();
    env.extend(ranges.iter().map(|(k, &(_, hi))| (k.clone(), hi)));
    let free: Vec<String> = symbols(g).into_iter().filter(|s| !env.contains_key(s)).collect();
    let ranged: Vec<String> = ranges.iter().map(|(s, (lo, hi))| format!("--dim {s}={lo}..{hi}")).collect();
    let ranged = (!ranged.is_empty()).then(|| format!("the largest values of {}", ranged.join(", ")));
    // Several free symbols: lowering refuses the model and says which to bind.
    let batch = match free.as_slice() {
        [batch] => {
            env.insert(batch.clone(), max_batch);
            Some(format!("--max-batch {max_batch} (batch dim '{batch}')"))
        }
        _ => None,
    };
    let context = match (batch, ranged) {
        (Some(b), Some(r)) => format!("at {b} and {r}"),
        (Some(b), None) => format!("at {b}"),
        (None, Some(r)) => format!("at {r}"),
        (None, None) => "at the dims given".to_string(),
    };
    (env, context)
}

/// The `--dim NAME=N` pairs as a map: a name given twice, or one the model does not have, is an
/// error naming it (and the dims the model has).
pub fn check_dims(g: &Graph, pairs: &[(String, i64)]) -> Result<BTreeMap<String, i64>> {
    let known = symbols(g);
    let mut m = BTreeMap::new();
    for (name, value) in pairs {
        if !known.contains(name) {
            return Err(Error::Other(format!(
                "--dim {name}={value}: {} has no symbolic dim '{name}' ({})",
                g.info.source,
                symbol_list(&known)
            )));
        }
        if m.insert(name.clone(), *value).is_some() {
            return Err(Error::Other(format!("--dim {name} is given more than once")));
        }
    }
    Ok(m)
}

/// The `--dim NAME=MIN..MAX` ranges: each names a symbolic dim of the model that no `--dim
/// NAME=N` fixes, and runs from at least 1 up (`MIN ≤ MAX`).
pub fn check_ranges(g: &Graph, ranges: &BTreeMap<String, (i64, i64)>, fixed: &BTreeMap<String, i64>) -> Result<()> {
    let known = symbols(g);
    for (name, &(lo, hi)) in ranges {
        if !known.contains(name) {
            return Err(Error::Other(format!(
                "--dim {name}={lo}..{hi}: {} has no symbolic dim '{name}' ({})",
                g.info.source,
                symbol_list(&known)
            )));
        }
        if fixed.contains_key(name) {
            return Err(Error::Other(format!("--dim {name} is given both a value and a range")));
        }
        if lo < 1 || lo > hi {
            return Err(Error::Other(format!("--dim {name}={lo}..{hi}: a run-time range needs 1 ≤ MIN ≤ MAX")));
        }
    }
    Ok(())
}

/// The model's symbolic dims, for messages.
fn symbol_list(known: &BTreeSet<String>) -> String {
    if known.is_empty() {
        "it has none: every dim is fixed".to_string()
    } else {
        format!("its symbolic dims: {}", known.iter().cloned().collect::<Vec<_>>().join(", "))
    }
}

/// What bounds a size check: the limit in bytes and what it is, for the message ("the 141 GB
/// (143771 MiB) of an H200, the largest sm_90 GPU; set --max-memory for another").
#[derive(Clone, Debug)]
pub struct Bound {
    pub bytes: u64,
    pub what: String,
}

/// Checks every value of `g` at the dims `env` (symbols not in it take `default`, or stay
/// unbound when `default` is `None`, and such values are skipped): its element count and bytes
/// (`elem_bytes` per element of a dtype) are computed with checked arithmetic, and neither may
/// overflow nor exceed `bound`. `context` names the options that set the dims ("at --max-batch
/// 64", see [`largest_dims`]). Returns the largest value's bytes.
pub fn check_sizes(
    g: &Graph,
    env: &BTreeMap<String, i64>,
    default: Option<i64>,
    elem_bytes: impl Fn(DType) -> u64,
    bound: &Bound,
    context: &str,
) -> Result<u64> {
    let mut env = env.clone();
    if let Some(d) = default {
        for s in symbols(g) {
            env.entry(s).or_insert(d);
        }
    }
    let mut largest = 0u64;
    for v in &g.values {
        let Some(ty) = &v.ty else { continue };
        let shape: Vec<Dim> = ty.shape.iter().map(|d| d.eval(&env)).collect();
        let overflow = shape.iter().any(|d| d.symbols().any(|s| s == "overflow"));
        if !overflow && shape.iter().any(|d| !d.is_known()) {
            continue;
        }
        let bytes = if overflow {
            None
        } else {
            shape
                .iter()
                .try_fold(1u64, |n, d| u64::try_from(d.as_known()?).ok().and_then(|d| n.checked_mul(d)))
                .and_then(|n| n.checked_mul(elem_bytes(ty.dtype)))
        };
        let shown = if overflow { fmt_shape(&ty.shape) } else { fmt_shape(&shape) };
        match bytes {
            None => {
                return Err(Error::Other(format!(
                    "{context}: value '{}' {}{shown} would have more bytes than a 64-bit size can count",
                    v.name,
                    ty.dtype.name()
                )))
            }
            Some(b) if b > bound.bytes => {
                return Err(Error::Other(format!(
                    "{context}: value '{}' {}{shown} would take {}, more than {}",
                    v.name,
                    ty.dtype.name(),
                    fmt_bytes(b),
                    bound.what
                )))
            }
            Some(b) => largest = largest.max(b),
        }
    }
    Ok(largest)
}

/// The GPU memory compile sizes a library against when `--max-memory` is not given: the largest
/// memory of the GPUs the architecture runs on, as `nvidia-smi` reports it (sm_80: A100 80GB,
/// 81920 MiB; sm_90/sm_90a: H200, 143771 MiB, sold as 141 GB).
/// The memory of the largest device of a ROCm architecture (MI250X GCD / MI210: 64 GiB; MI300X:
/// 192 GB).
pub fn rocm_memory_bound(arch: crate::lower::rocm::RocmArch) -> Bound {
    let what = match arch {
        crate::lower::rocm::RocmArch::Gfx90a => "the 64 GiB of an MI250X GCD or MI210, the largest gfx90a device",
        crate::lower::rocm::RocmArch::Gfx942 => "the 192 GB of an MI300X, the largest gfx942 GPU",
    };
    Bound { bytes: arch.memory_bytes(), what: format!("{what} (--max-memory sets another bound)") }
}

pub fn gpu_memory_bound(arch: Arch) -> Bound {
    const MIB: u64 = 1 << 20;
    match arch {
        Arch::Sm80 => Bound {
            bytes: 81920 * MIB,
            what: "the 80 GiB of an A100 80GB, the largest sm_80 GPU (--max-memory sets another bound)".into(),
        },
        Arch::Sm90 | Arch::Sm90a => Bound {
            bytes: 143771 * MIB,
            what: format!(
                "the 141 GB (143771 MiB) of an H200, the largest {} GPU (--max-memory sets another bound)",
                arch.as_str()
            ),
        },
    }
}

/// A memory size (`--max-memory`, `max_memory=` of the Python package): bytes, or a number with a unit: KiB, MiB, GiB, TiB (powers of 1024) or KB, MB,
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

/// Bytes, for messages: "1.5 GiB".
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// A count with thousands separators: "25,557,032".
pub fn fmt_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ValueType;

    fn graph() -> Graph {
        let mut g = Graph::default();
        g.info.source = "m.onnx".into();
        let x = g.add_value("x".into(), Some(ValueType::new(DType::F32, vec![Dim::sym("N"), Dim::known(3)])));
        let y = g.add_value("y".into(), Some(ValueType::new(DType::F32, vec![Dim::sym("y:0")])));
        g.inputs.push(x);
        g.outputs.push(y);
        g
    }

    #[test]
    fn dims_must_name_a_symbol_of_the_model_once() {
        let g = graph();
        assert_eq!(check_dims(&g, &[("N".into(), 4)]).unwrap(), BTreeMap::from([("N".to_string(), 4)]));
        let e = check_dims(&g, &[("nosuch".into(), 4)]).unwrap_err().to_string();
        assert!(e.contains("--dim nosuch=4") && e.contains("no symbolic dim 'nosuch'") && e.contains(": N)"), "{e}");
        let e = check_dims(&g, &[("y:0".into(), 4)]).unwrap_err().to_string();
        assert!(e.contains("no symbolic dim"), "{e}");
        let e = check_dims(&g, &[("N".into(), 4), ("N".into(), 5)]).unwrap_err().to_string();
        assert!(e.contains("more than once"), "{e}");
    }

    /// Bytes of an element of `t`.
    pub fn size(t: DType) -> u64 {
        t.size_bytes() as u64
    }

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

    #[test]
    fn gpu_memory_bounds() {
        assert!(gpu_memory_bound(Arch::Sm90a).what.contains("H200"));
        assert!(gpu_memory_bound(Arch::Sm80).bytes < gpu_memory_bound(Arch::Sm90).bytes);
    }

    #[test]
    fn sizes_are_checked_without_overflow() {
        let g = graph();
        let bound = Bound { bytes: 1 << 30, what: "1 GiB".into() };
        let env = BTreeMap::from([("N".to_string(), 4)]);
        assert_eq!(check_sizes(&g, &env, None, size, &bound, "--dim N=4").unwrap(), 48);
        assert_eq!(check_sizes(&g, &env, None, |_| 2, &bound, "--dim N=4").unwrap(), 24);
        assert_eq!(check_sizes(&g, &BTreeMap::new(), Some(1), size, &bound, "x").unwrap(), 12);
        let env = BTreeMap::from([("N".to_string(), i64::MAX)]);
        let e = check_sizes(&g, &env, None, size, &bound, "--dim N=9223372036854775807").unwrap_err().to_string();
        assert!(e.contains("--dim N=9223372036854775807: value 'x'") && e.contains("64-bit"), "{e}");
        let env = BTreeMap::from([("N".to_string(), 100_000_000_000)]);
        let e = check_sizes(&g, &env, None, size, &bound, "--batch 100000000000").unwrap_err().to_string();
        assert!(e.contains("value 'x' float32[100000000000,3] would take") && e.contains("more than 1 GiB"), "{e}");
    }
}
