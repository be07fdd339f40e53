//! Inputs for validation runs: `.npy` files given by the user, and seeded random tensors shaped
//! from the graph inputs for everything else.
//!
//! Symbolic dims get their values, in order of precedence, from `--dim NAME=VALUE`, from the
//! shapes of `.npy` files (a file for an input of shape `[N,3]` binds `N`), and otherwise 1.
//! Random values: floats ~ N(0, 1); integers uniform in `0..INT_RANGE` (small and non-negative
//! so they are valid indices, axes and counts for most models); bools fair coin flips. One
//! generator seeded with `seed` fills the inputs in graph order, so a seed names a run.

use crate::error::{Error, Result};
use crate::ir::dim::fmt_shape;
use crate::ir::{DType, Dim, Graph, Tensor};
use ndarray::ArrayD;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Random integer inputs are drawn from `0..INT_RANGE`.
pub const INT_RANGE: i64 = 4;

/// Default value of a symbolic dim nobody set.
pub const DEFAULT_DIM: i64 = 1;

#[derive(Clone, Debug, Default)]
pub struct InputOptions {
    pub seed: u64,
    /// Values of symbolic dims (`--dim N=4`).
    pub dims: BTreeMap<String, i64>,
    /// `.npy` files for named inputs (`--input x=x.npy`).
    pub files: BTreeMap<String, PathBuf>,
}

/// Where an input's values came from (for reports).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "path")]
pub enum InputSource {
    Random,
    File(String),
}

/// The inputs of one run, in graph input order, with the dims they bound.
#[derive(Clone, Debug)]
pub struct Inputs {
    pub tensors: Vec<(String, Tensor)>,
    pub sources: Vec<InputSource>,
    /// Every symbolic dim of the graph inputs with the value used.
    pub dims: BTreeMap<String, i64>,
}

/// Builds the inputs of `g`: files where given, random tensors elsewhere.
pub fn make_inputs(g: &Graph, opts: &InputOptions) -> Result<Inputs> {
    let path = g.info.source.as_str();
    let inputs: Vec<(String, DType, Vec<Dim>)> = g
        .inputs
        .iter()
        .map(|&id| {
            let v = g.value(id);
            let ty =
                v.ty.as_ref().ok_or_else(|| Error::model(path, format!("graph input '{}' has no type", v.name)))?;
            Ok((v.name.clone(), ty.dtype, ty.shape.clone()))
        })
        .collect::<Result<_>>()?;

    for name in opts.files.keys() {
        if !inputs.iter().any(|(n, _, _)| n == name) {
            let known: Vec<&str> = inputs.iter().map(|(n, _, _)| n.as_str()).collect();
            return Err(Error::model(
                path,
                format!("--input {name}=…: the model has no input '{name}' (its inputs: {})", known.join(", ")),
            ));
        }
    }
    let mut symbols: Vec<String> = Vec::new();
    for (_, _, shape) in &inputs {
        for d in shape {
            for s in d.symbols() {
                if !symbols.iter().any(|x| x == s) {
                    symbols.push(s.to_string());
                }
            }
        }
    }
    for (name, value) in &opts.dims {
        if !symbols.contains(name) {
            let known = if symbols.is_empty() {
                "it has none".to_string()
            } else {
                format!("its symbolic dims: {}", symbols.join(", "))
            };
            return Err(Error::model(
                path,
                format!("--dim {name}={value}: the model inputs have no symbolic dim '{name}' ({known})"),
            ));
        }
        if *value < 0 {
            return Err(Error::model(path, format!("--dim {name}={value}: a dim cannot be negative")));
        }
    }

    let mut env: BTreeMap<String, i64> = opts.dims.clone();
    let mut loaded: BTreeMap<String, Tensor> = BTreeMap::new();
    for (name, dtype, shape) in &inputs {
        if let Some(file) = opts.files.get(name) {
            let t = read_npy_as(file, *dtype)
                .map_err(|m| Error::model(path, format!("--input {name}={}: {m}", file.display())))?;
            bind_file_dims(shape, t.shape(), &mut env).map_err(|m| {
                Error::model(
                    path,
                    format!(
                        "--input {name}={}: shape {:?} does not fit {}: {m}",
                        file.display(),
                        t.shape(),
                        fmt_shape(shape)
                    ),
                )
            })?;
            loaded.insert(name.clone(), t);
        }
    }
    for s in &symbols {
        env.entry(s.clone()).or_insert(DEFAULT_DIM);
    }

    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut tensors = Vec::with_capacity(inputs.len());
    let mut sources = Vec::with_capacity(inputs.len());
    for (name, dtype, shape) in &inputs {
        if let Some(t) = loaded.remove(name) {
            tensors.push((name.clone(), t));
            sources.push(InputSource::File(opts.files[name].display().to_string()));
            continue;
        }
        let dims = concrete_shape(shape, &env)
            .map_err(|m| Error::model(path, format!("input '{name}' {}: {m}", fmt_shape(shape))))?;
        tensors.push((name.clone(), random_tensor(*dtype, &dims, &mut rng)));
        sources.push(InputSource::Random);
    }
    let dims = env.into_iter().filter(|(k, _)| symbols.contains(k)).collect();
    Ok(Inputs { tensors, sources, dims })
}

/// Binds the symbols of `expected` from a file's shape; known dims must match exactly.
fn bind_file_dims(
    expected: &[Dim],
    actual: &[usize],
    env: &mut BTreeMap<String, i64>,
) -> std::result::Result<(), String> {
    if expected.len() != actual.len() {
        return Err(format!("rank {} expected, the file has rank {}", expected.len(), actual.len()));
    }
    for (i, (d, &a)) in expected.iter().zip(actual).enumerate() {
        let d = d.eval(env);
        match d.as_known() {
            Some(k) if k == a as i64 => {}
            Some(k) => return Err(format!("dim {i} must be {k} (from the model or --dim), the file has {a}")),
            None => {
                let syms: Vec<&str> = d.symbols().collect();
                if syms.len() == 1 && d == Dim::sym(syms[0]) {
                    env.insert(syms[0].to_string(), a as i64);
                } else {
                    return Err(format!("dim {i} is the expression {d}; set its symbols with --dim"));
                }
            }
        }
    }
    Ok(())
}

fn concrete_shape(shape: &[Dim], env: &BTreeMap<String, i64>) -> std::result::Result<Vec<usize>, String> {
    shape
        .iter()
        .map(|d| match d.eval(env).as_known() {
            Some(v) if v >= 0 => Ok(v as usize),
            Some(v) => Err(format!("dim {d} evaluates to {v}")),
            None => Err(format!("dim {d} has unbound symbols")),
        })
        .collect()
}

/// A seeded random tensor: N(0,1) floats, small non-negative integers, random bools.
pub fn random_tensor(dtype: DType, shape: &[usize], rng: &mut StdRng) -> Tensor {
    let n: usize = shape.iter().product();
    if dtype.is_float() {
        let v: Vec<f32> = (0..n).map(|_| rng.sample::<f32, _>(StandardNormal)).collect();
        return Tensor::from_f32s(shape, v).cast(dtype);
    }
    if dtype == DType::Bool {
        let v: Vec<bool> = (0..n).map(|_| rng.random::<bool>()).collect();
        return Tensor::Bool(ArrayD::from_shape_vec(ndarray::IxDyn(shape), v).expect("length is the shape's product"));
    }
    let v: Vec<i64> = (0..n).map(|_| rng.random_range(0..INT_RANGE)).collect();
    Tensor::from_i64s(shape, v).cast(dtype)
}

/// Reads a `.npy` file holding elements of `dtype`. float16/bfloat16 inputs read float32 files
/// (the npy reader has no 16-bit float element type) and round them.
pub fn read_npy_as(path: &Path, dtype: DType) -> std::result::Result<Tensor, String> {
    fn rd<T: ndarray_npy::ReadableElement>(path: &Path, what: &str) -> std::result::Result<ArrayD<T>, String> {
        ndarray_npy::read_npy::<_, ArrayD<T>>(path).map_err(|e| match e {
            ndarray_npy::ReadNpyError::WrongDescriptor(d) => {
                format!("the file holds {}, the input needs {what}", describe_descr(&d.to_string()))
            }
            other => other.to_string(),
        })
    }
    Ok(match dtype {
        DType::F32 => Tensor::F32(rd(path, "float32")?),
        DType::F64 => Tensor::F64(rd(path, "float64")?),
        DType::F16 => Tensor::F32(rd(path, "float32 (converted to float16)")?).cast(DType::F16),
        DType::BF16 => Tensor::F32(rd(path, "float32 (converted to bfloat16)")?).cast(DType::BF16),
        DType::I8 => Tensor::I8(rd(path, "int8")?),
        DType::I16 => Tensor::I16(rd(path, "int16")?),
        DType::I32 => Tensor::I32(rd(path, "int32")?),
        DType::I64 => Tensor::I64(rd(path, "int64")?),
        DType::U8 => Tensor::U8(rd(path, "uint8")?),
        DType::U16 => Tensor::U16(rd(path, "uint16")?),
        DType::U32 => Tensor::U32(rd(path, "uint32")?),
        DType::U64 => Tensor::U64(rd(path, "uint64")?),
        DType::Bool => Tensor::Bool(rd(path, "bool")?),
    })
}

/// `'<f8'` → `float64 ('<f8')`, for error messages.
fn describe_descr(d: &str) -> String {
    let code = d.trim_matches(|c| c == '\'' || c == '"' || c == ' ');
    let kind = code.trim_start_matches(['<', '>', '|', '=']);
    let name = match kind {
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "i1" => "int8",
        "i2" => "int16",
        "i4" => "int32",
        "i8" => "int64",
        "u1" => "uint8",
        "u2" => "uint16",
        "u4" => "uint32",
        "u8" => "uint64",
        "b1" => "bool",
        _ => return format!("elements of type {d}"),
    };
    format!("{name} ({code})")
}

/// Parses `NAME=VALUE` (for `--dim` and `--input`).
pub fn parse_assignment(s: &str) -> std::result::Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() && !v.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected NAME=VALUE, got '{s}'")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ValueType;

    fn graph_with_inputs(inputs: &[(&str, DType, Vec<Dim>)]) -> Graph {
        let mut g = Graph::default();
        g.info.source = "test.onnx".into();
        for (name, dtype, shape) in inputs {
            let id = g.add_value(name.to_string(), Some(ValueType::new(*dtype, shape.clone())));
            g.inputs.push(id);
        }
        g
    }

    #[test]
    fn random_inputs_follow_dims_and_seed() {
        let g = graph_with_inputs(&[
            ("x", DType::F32, vec![Dim::sym("N"), Dim::known(3)]),
            ("ids", DType::I64, vec![Dim::sym("N"), Dim::sym("S")]),
            ("mask", DType::Bool, vec![Dim::sym("S")]),
            ("h", DType::F16, vec![Dim::known(2)]),
        ]);
        let opts = InputOptions { seed: 7, dims: BTreeMap::from([("N".to_string(), 4)]), ..Default::default() };
        let a = make_inputs(&g, &opts).unwrap();
        assert_eq!(a.tensors[0].1.shape(), &[4, 3]);
        assert_eq!(a.tensors[1].1.shape(), &[4, 1]);
        assert_eq!(a.tensors[2].1.shape(), &[1]);
        assert_eq!(a.tensors[3].1.dtype(), DType::F16);
        assert!(a.tensors[1].1.to_i64_vec().iter().all(|v| (0..INT_RANGE).contains(v)));
        assert_eq!(a.dims, BTreeMap::from([("N".to_string(), 4), ("S".to_string(), 1)]));
        let b = make_inputs(&g, &opts).unwrap();
        assert_eq!(a.tensors, b.tensors, "same seed, same inputs");
        let c = make_inputs(&g, &InputOptions { seed: 8, ..opts.clone() }).unwrap();
        assert_ne!(a.tensors[0].1, c.tensors[0].1, "another seed, other inputs");
    }

    #[test]
    fn unknown_dim_and_input_names_are_errors() {
        let g = graph_with_inputs(&[("x", DType::F32, vec![Dim::sym("N")])]);
        let bad_dim = InputOptions { dims: BTreeMap::from([("batch".to_string(), 2)]), ..Default::default() };
        let e = make_inputs(&g, &bad_dim).unwrap_err().to_string();
        assert!(e.contains("no symbolic dim 'batch'") && e.contains("N"), "{e}");
        let bad_input =
            InputOptions { files: BTreeMap::from([("y".to_string(), PathBuf::from("y.npy"))]), ..Default::default() };
        let e = make_inputs(&g, &bad_input).unwrap_err().to_string();
        assert!(e.contains("no input 'y'") && e.contains("x"), "{e}");
    }

    #[test]
    fn npy_files_bind_symbolic_dims() {
        let dir = std::env::temp_dir().join(format!("onnx2ait-inputs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("x.npy");
        let arr = ArrayD::from_shape_vec(ndarray::IxDyn(&[5, 3]), (0..15).map(|v| v as f32).collect()).unwrap();
        ndarray_npy::write_npy(&file, &arr).unwrap();
        let g = graph_with_inputs(&[
            ("x", DType::F32, vec![Dim::sym("N"), Dim::known(3)]),
            ("y", DType::F32, vec![Dim::sym("N")]),
        ]);
        let opts = InputOptions { files: BTreeMap::from([("x".to_string(), file.clone())]), ..Default::default() };
        let got = make_inputs(&g, &opts).unwrap();
        assert_eq!(got.tensors[0].1, Tensor::F32(arr));
        assert_eq!(got.tensors[1].1.shape(), &[5], "N bound from the file");
        assert_eq!(got.sources[0], InputSource::File(file.display().to_string()));

        let g64 = graph_with_inputs(&[("x", DType::F64, vec![Dim::sym("N"), Dim::known(3)])]);
        let e = make_inputs(&g64, &opts).unwrap_err().to_string();
        assert!(e.contains("the file holds float32") && e.contains("needs float64"), "{e}");
        let g4 = graph_with_inputs(&[("x", DType::F32, vec![Dim::sym("N"), Dim::known(4)])]);
        let e = make_inputs(&g4, &opts).unwrap_err().to_string();
        assert!(e.contains("dim 1 must be 4"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn assignments_parse() {
        assert_eq!(parse_assignment("N=4").unwrap(), ("N".to_string(), "4".to_string()));
        assert_eq!(parse_assignment("x=a=b.npy").unwrap(), ("x".to_string(), "a=b.npy".to_string()));
        assert!(parse_assignment("N").is_err());
        assert!(parse_assignment("=4").is_err());
    }
}
