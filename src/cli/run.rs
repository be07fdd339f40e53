//! `onnx2ait run OUT [--input name=x.npy …] [--batch B] [--dim NAME=V …] [--seed S]
//! [--output-dir D]`: run the compiled model of OUT (`onnx2ait MODEL -o OUT`) once on the GPU
//! and write every output as `D/<output name>.npy` (default D: OUT/outputs).
//!
//! Inputs come from .npy files; an input without one gets seeded random values, as in
//! `validate`. The run-time dims are `--batch` and `--dim`, or else the ones the files' shapes
//! imply (without files: batch 1, every other run-time dim at its largest).

use super::validate::parse_batch;
use super::Failure;
use clap::Args;
use onnx2ait::ir::Tensor;
use onnx2ait::runtime::{Library, Model};
use onnx2ait::validate::inputs::{parse_assignment, random_tensor, read_input_file};
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The build folder (`onnx2ait MODEL -o OUT`), holding libmodel.so and weights.bin.
    #[arg(value_name = "OUT")]
    pub out: PathBuf,
    /// Values for an input from a .npy file (repeatable): --input x=x.npy. Inputs without a file
    /// get random values.
    #[arg(long = "input", value_name = "NAME=FILE.npy", value_parser = parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// Batch size (default: implied by the input files, else 1).
    #[arg(long, value_name = "B", value_parser = parse_batch)]
    pub batch: Option<i64>,
    /// Value of a run-time dim the build was compiled with a range for (repeatable):
    /// --dim seq=77 (default: implied by the input files, else its largest value).
    #[arg(long = "dim", value_name = "NAME=V", value_parser = super::validate::parse_dim)]
    pub dims: Vec<(String, i64)>,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where to write the outputs (default: OUT/outputs).
    #[arg(long = "output-dir", value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

fn parse_input(s: &str) -> Result<(String, PathBuf), String> {
    let (k, v) = parse_assignment(s)?;
    Ok((k, PathBuf::from(v)))
}

pub fn run(a: &RunArgs) -> Result<u8, Failure> {
    let lib = Library::open(&a.out)?;
    let mut files: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (name, path) in &a.inputs {
        if files.insert(name.clone(), path.clone()).is_some() {
            return Err(Failure::new(1, format!("--input '{name}' is given more than once")));
        }
        if !lib.inputs().iter().any(|i| &i.name == name) {
            let known: Vec<&str> = lib.inputs().iter().map(|i| i.name.as_str()).collect();
            return Err(Failure::new(
                1,
                format!("--input {name}=…: the model has no input '{name}' (its inputs: {})", known.join(", ")),
            ));
        }
        if !path.is_file() {
            return Err(Failure::new(1, format!("--input {name}={}: no such file", path.display())));
        }
    }
    let mut loaded: Vec<Option<Tensor>> = Vec::with_capacity(lib.inputs().len());
    for info in lib.inputs() {
        loaded.push(match files.get(&info.name) {
            Some(path) => Some(
                read_input_file(path, &info.name, info.dtype)
                    .map_err(|m| Failure::new(1, format!("--input {}={}: {m}", info.name, path.display())))?,
            ),
            None => None,
        });
    }
    let named = super::checks::check_dims_given(&a.dims)?;
    let dims = if a.batch.is_some() || !named.is_empty() || loaded.iter().all(Option::is_none) {
        let batch = a.batch.unwrap_or_else(|| lib.batch_dim().map_or(1, |b| lib.run_dims()[b].min));
        lib.dims_at(batch, &named)?
    } else {
        let shapes: Vec<Option<&[usize]>> = loaded.iter().map(|t| t.as_ref().map(Tensor::shape)).collect();
        lib.infer_dims(&shapes).map_err(|e| Failure::new(1, format!("the input files: {e}")))?
    };

    let mut rng = StdRng::seed_from_u64(a.seed);
    let mut tensors = Vec::with_capacity(loaded.len());
    let mut report = String::new();
    for (i, (info, t)) in lib.inputs().iter().zip(loaded).enumerate() {
        let (t, source) = match t {
            Some(t) => (t, files[&info.name].display().to_string()),
            None => {
                (random_tensor(info.dtype, &lib.input_shape(i, &dims)?, &mut rng), format!("random, seed {}", a.seed))
            }
        };
        let _ = writeln!(report, "input  '{}' {} ({source})", info.name, describe(&t));
        tensors.push(t);
    }

    let mut model = Model::create(lib)?;
    let outputs = model.run_host(&dims, &tensors)?;
    let lib = model.library();
    let dir = a.output_dir.clone().unwrap_or_else(|| a.out.join("outputs"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| Failure::new(1, format!("{}: cannot create directory: {e}", dir.display())))?;
    let names: Vec<&str> = lib.outputs().iter().map(|o| o.name.as_str()).collect();
    let files = output_file_names(&names);
    for ((info, t), file) in lib.outputs().iter().zip(&outputs).zip(files) {
        let path = dir.join(file);
        let note = write_npy(&path, t)?;
        let _ = writeln!(report, "output '{}' {} -> {}{note}", info.name, describe(t), path.display());
    }
    let head = format!(
        "model '{}' from {} on {}, {}\n",
        lib.model_name(),
        lib.path().display(),
        model.device_name(),
        lib.dims_text(&dims).trim_start_matches("at ")
    );
    super::emit(&format!("{head}{report}"));
    Ok(0)
}

/// `float32[2,1000]`.
fn describe(t: &Tensor) -> String {
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    format!("{}[{}]", t.dtype(), dims.join(","))
}

/// One file name per output: the name with characters other than letters, digits, `.`, `_`, `-`
/// replaced by `_`, made unique, with `.npy`.
fn output_file_names(names: &[&str]) -> Vec<String> {
    let mut used = BTreeSet::new();
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut stem: String =
                n.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
            if stem.is_empty() || stem.chars().all(|c| c == '.') {
                stem = format!("output{i}");
            }
            let mut file = format!("{stem}.npy");
            let mut k = 1;
            while !used.insert(file.to_lowercase()) {
                file = format!("{stem}_{k}.npy");
                k += 1;
            }
            file
        })
        .collect()
}

/// Writes `t` as .npy; 16-bit floats (which .npy readers here cannot hold) as float32, with a
/// note saying so.
fn write_npy(path: &Path, t: &Tensor) -> Result<&'static str, Failure> {
    let err = |e: ndarray_npy::WriteNpyError| Failure::new(1, format!("{}: cannot write: {e}", path.display()));
    let note = match t {
        Tensor::F32(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::F64(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::F16(_) | Tensor::BF16(_) => {
            ndarray_npy::write_npy(path, &t.to_f32()).map_err(err).map(|_| " (written as float32)")
        }
        Tensor::I8(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::I16(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::I32(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::I64(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::U8(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::U16(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::U32(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::U64(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
        Tensor::Bool(a) => ndarray_npy::write_npy(path, a).map_err(err).map(|_| ""),
    }?;
    Ok(note)
}

#[cfg(test)]
mod tests {
    use super::*;
    use onnx2ait::ir::DType;

    #[test]
    fn output_files_are_safe_and_unique() {
        let files = output_file_names(&["logits", "a/b:0", "a_b_0", "", "..", "A_B_0"]);
        assert_eq!(files, vec!["logits.npy", "a_b_0.npy", "a_b_0_1.npy", "output3.npy", "output4.npy", "A_B_0_2.npy"]);
    }

    #[test]
    fn npy_round_trip_and_half_note() {
        let dir = std::env::temp_dir().join(format!("onnx2ait-run-npy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let t = Tensor::from_i64s(&[2], vec![3, -4]);
        assert_eq!(write_npy(&dir.join("i.npy"), &t).unwrap(), "");
        assert_eq!(read_input_file(&dir.join("i.npy"), "i", DType::I64).unwrap(), t);
        let h = Tensor::from_f32s(&[2], vec![0.5, -1.0]).cast(DType::F16);
        assert_eq!(write_npy(&dir.join("h.npy"), &h).unwrap(), " (written as float32)");
        assert_eq!(read_input_file(&dir.join("h.npy"), "h", DType::F16).unwrap(), h);
        std::fs::remove_dir_all(&dir).ok();
    }
}
