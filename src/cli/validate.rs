//! `onnx2ait validate MODEL [--input name=file.npy …] [--seed S] [--dim N=4 …] [--rtol R]
//! [--atol A] [--gpu-rtol R] [--build OUT] [--batch B] [--json]`: run ONNX Runtime and the reference executor
//! (and, with `--build`, the compiled library OUT/libmodel.so on the GPU) on the same inputs and
//! compare. Exit 0 within tolerance, 1 past it (the failing outputs are named).

use super::{Failure, ModelArg};
use clap::Args;
use onnx2ait::validate::inputs::{parse_assignment, InputOptions};
use onnx2ait::validate::{self, Options};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(Args, Debug, Clone)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Values for an input from a .npy or .npz file, any dtype that converts exactly (repeatable):
    /// --input x=x.npy, --input x=inputs.npz (its array x, or its only array)
    #[arg(long = "input", value_name = "NAME=FILE.npy|FILE.npz", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Value of a symbolic dim (repeatable): --dim N=4. Unset dims are 1.
    #[arg(long = "dim", value_name = "NAME=N", value_parser = parse_dim)]
    pub dims: Vec<(String, i64)>,
    /// Relative tolerance for float outputs, times the output's largest magnitude (default: 1e-4 for
    /// float32/float64, 5e-3 float16, 3e-2 bfloat16; the GPU library, which computes in fp16: 1e-2).
    #[arg(long, value_parser = parse_tolerance)]
    pub rtol: Option<f64>,
    /// Absolute tolerance for float outputs (default: 1e-5 for float32/float64, 1e-3 float16, 1e-2 bfloat16;
    /// the GPU library: 1e-4).
    #[arg(long, value_parser = parse_tolerance)]
    pub atol: Option<f64>,
    /// Relative tolerance of the GPU library's float outputs alone (wins over --rtol for it): for a
    /// network whose own fp16 error is known to exceed the 1e-2 default, without loosening the
    /// other engines' bounds.
    #[arg(long, value_parser = parse_tolerance, requires = "build")]
    pub gpu_rtol: Option<f64>,
    /// Also run the compiled model in OUT (`onnx2ait MODEL -o OUT`) on the GPU and compare it.
    #[arg(long = "build", value_name = "OUT")]
    pub build: Option<PathBuf>,
    /// Value of the batch dim for every engine (default 1; needs a GPU build or a model with one
    /// symbolic input dim).
    #[arg(long, value_name = "B", value_parser = parse_batch)]
    pub batch: Option<i64>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_input(s: &str) -> Result<(String, PathBuf), String> {
    let (k, v) = parse_assignment(s)?;
    Ok((k, PathBuf::from(v)))
}

pub fn parse_dim(s: &str) -> Result<(String, i64), String> {
    let (k, v) = parse_assignment(s)?;
    let n: i64 = v.parse().map_err(|_| format!("dim '{k}': '{v}' is not a whole number"))?;
    if n < 0 {
        return Err(format!("dim '{k}' cannot be negative"));
    }
    Ok((k, n))
}

/// A `compile --dim`: a value fixed at compile time, or a range chosen at each run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimSpec {
    /// `NAME=N`
    Fixed(i64),
    /// `NAME=MIN..MAX` (inclusive)
    Range(i64, i64),
}

/// `NAME=N` or `NAME=MIN..MAX`.
pub fn parse_dim_spec(s: &str) -> Result<(String, DimSpec), String> {
    let (k, v) = parse_assignment(s)?;
    let Some((lo, hi)) = v.split_once("..") else {
        return parse_dim(s).map(|(k, n)| (k, DimSpec::Fixed(n)));
    };
    let num = |x: &str| -> Result<i64, String> {
        x.trim().parse().map_err(|_| format!("dim '{k}': '{v}' is not a range MIN..MAX of whole numbers"))
    };
    let (lo, hi) = (num(lo)?, num(hi)?);
    if lo < 1 || lo > hi {
        return Err(format!("dim '{k}': the range {lo}..{hi} needs 1 ≤ MIN ≤ MAX"));
    }
    Ok((k, DimSpec::Range(lo, hi)))
}

/// A batch size: a whole number from 1.
pub fn parse_batch(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("'{s}' is not a batch size (a whole number from 1)")),
    }
}

fn parse_tolerance(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("'{s}' is not a non-negative number")),
    }
}

/// Later values of a repeated name win, as with most command-line tools; say so when it happens.
fn to_map<V: Clone>(pairs: &[(String, V)], what: &str) -> Result<BTreeMap<String, V>, Failure> {
    let mut m = BTreeMap::new();
    for (k, v) in pairs {
        if m.insert(k.clone(), v.clone()).is_some() {
            return Err(Failure::new(1, format!("{what} '{k}' is given more than once")));
        }
    }
    Ok(m)
}

/// Every value of the model at the `--dim` and `--batch` values (other dims 1, as the inputs
/// take them) is counted with checked arithmetic and must fit this machine's available memory:
/// ONNX Runtime and the reference executor hold them on the host.
fn check_input_sizes(
    graph: &onnx2ait::ir::Graph,
    dims: &BTreeMap<String, i64>,
    a: &ValidateArgs,
) -> Result<(), Failure> {
    let mut env = dims.clone();
    // With a library the batch is its batch dim; without one it is the only symbolic input dim
    // (the error, when there is not exactly one, is the one validation itself would give).
    if a.build.is_none() {
        onnx2ait::validate::gpu::bind_dims(graph, None, a.batch, &mut env)?;
    }
    let bound = match onnx2ait::build::mem_available_bytes() {
        Some(bytes) => super::checks::Bound {
            bytes,
            what: format!("this machine's available memory ({})", super::checks::fmt_bytes(bytes)),
        },
        None => super::checks::Bound { bytes: u64::MAX, what: "a 64-bit size".into() },
    };
    let mut given: Vec<String> = dims.iter().map(|(k, v)| format!("--dim {k}={v}")).collect();
    given.extend(a.batch.map(|b| format!("--batch {b}")));
    let context = format!("at {}", given.join(" "));
    let default = Some(onnx2ait::validate::inputs::DEFAULT_DIM);
    super::checks::check_sizes(graph, &env, default, super::checks::host_bytes, &bound, &context)
        .map(|_| ())
        .map_err(Failure::from)
}

pub fn run(a: &ValidateArgs) -> Result<u8, Failure> {
    a.model.check()?;
    for (name, file) in &a.inputs {
        if !file.is_file() {
            return Err(Failure::new(1, format!("--input {name}={}: no such file", file.display())));
        }
    }
    let dims = to_map(&a.dims, "--dim")?;
    let graph = super::checks::load_model(&a.model.model)?;
    if !dims.is_empty() || a.batch.is_some() {
        check_input_sizes(&graph, &dims, a)?;
    }
    drop(graph);
    let options = Options {
        inputs: InputOptions { seed: a.seed, dims, files: to_map(&a.inputs, "--input")? },
        rtol: a.rtol,
        atol: a.atol,
        gpu_rtol: a.gpu_rtol,
        build: a.build.clone(),
        batch: a.batch,
    };
    let report = validate::validate(&a.model.model, &options)?;
    if a.json {
        super::emit(&format!("{}\n", report.to_json()));
    } else {
        super::emit(&format!("{report}\n"));
    }
    if report.passed() {
        Ok(0)
    } else {
        let names: Vec<String> = report.failures().iter().map(|(o, e, _)| format!("'{o}' ({e})")).collect();
        Err(Failure::new(1, format!("validation failed: {} out of tolerance vs {}", names.join(", "), report.baseline)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_parsers() {
        assert_eq!(parse_dim("N=4").unwrap(), ("N".to_string(), 4));
        assert!(parse_dim("N=-1").is_err());
        assert!(parse_dim("N=x").is_err());
        assert_eq!(parse_dim_spec("seq=1..512").unwrap(), ("seq".to_string(), DimSpec::Range(1, 512)));
        assert_eq!(parse_dim_spec("seq=128").unwrap(), ("seq".to_string(), DimSpec::Fixed(128)));
        for bad in ["seq=0..4", "seq=5..4", "seq=1..", "seq=..4", "seq=a..b"] {
            assert!(parse_dim_spec(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_batch("8").unwrap(), 8);
        assert!(parse_batch("0").is_err() && parse_batch("x").is_err());
        assert_eq!(parse_tolerance("1e-3").unwrap(), 1e-3);
        assert!(parse_tolerance("-1").is_err());
        assert!(parse_tolerance("nan").is_err());
        assert!(to_map(&[("N".to_string(), 1), ("N".to_string(), 2)], "--dim").is_err());
    }
}
