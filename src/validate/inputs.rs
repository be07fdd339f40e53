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
use crate::ir::tensor::Elem;
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
            let t = read_input_file(file, name, *dtype)
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

/// Reads the values of input `input` from a `.npy` file, or from a `.npz` archive (the array
/// named `input`, or the archive's only array), converted to `dtype`.
///
/// Any element type numpy writes (float16/32/64, signed and unsigned integers of 8 to 64 bits,
/// bool; either byte order, C or Fortran order) is accepted when every value converts exactly:
/// a float16 file for a float16 input, an int64 file for an int32 input whose values fit, a
/// float32 file for a float16 input whose values are all float16 numbers. A value that would be
/// rounded, overflow or lose its fraction is an error naming it.
pub fn read_input_file(path: &Path, input: &str, dtype: DType) -> std::result::Result<Tensor, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    let is_zip = bytes.starts_with(b"PK\x03\x04") || bytes.starts_with(b"PK\x05\x06");
    let (t, what) = if is_zip {
        let (entry, data) = npz_entry(&bytes, input)?;
        (parse_npy(&data).map_err(|m| format!("array '{entry}': {m}"))?, format!("array '{entry}'"))
    } else {
        (parse_npy(&bytes)?, "the file".to_string())
    };
    convert_exactly(&t, dtype).map_err(|m| format!("{what} holds {}, the input needs {}: {m}", t.dtype(), dtype))
}

/// The bytes of the `.npy` member of a `.npz` archive for `input`: `input.npy` (numpy's name
/// for `np.savez(f, input=a)`), else the archive's only member.
fn npz_entry(bytes: &[u8], input: &str) -> std::result::Result<(String, Vec<u8>), String> {
    use std::io::Read;
    let mut zip =
        zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| format!("not a readable .npz archive: {e}"))?;
    let names: Vec<String> = zip.file_names().map(str::to_string).collect();
    let wanted = format!("{input}.npy");
    let entry = if names.iter().any(|n| *n == wanted) {
        wanted
    } else if names.len() == 1 {
        names[0].clone()
    } else {
        let mut arrays: Vec<&str> = names.iter().map(|n| n.strip_suffix(".npy").unwrap_or(n)).collect();
        arrays.sort_unstable();
        return Err(format!(
            "the archive has no array '{input}' (its arrays: {}); save it with np.savez(file, {input}=array)",
            if arrays.is_empty() { "none".to_string() } else { arrays.join(", ") }
        ));
    };
    let mut f = zip.by_name(&entry).map_err(|e| format!("array '{entry}': {e}"))?;
    let mut data = Vec::new();
    f.read_to_end(&mut data).map_err(|e| format!("array '{entry}': cannot read: {e}"))?;
    Ok((entry.strip_suffix(".npy").unwrap_or(&entry).to_string(), data))
}

/// Parses a `.npy` file (format versions 1 to 3) into a tensor of the file's own element type.
fn parse_npy(bytes: &[u8]) -> std::result::Result<Tensor, String> {
    if !bytes.starts_with(b"\x93NUMPY") || bytes.len() < 10 {
        return Err("not a .npy file (no \\x93NUMPY magic)".into());
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!("unsupported .npy format version {v}")),
    };
    let header =
        bytes.get(start..start + header_len).ok_or("the .npy header is truncated").map(String::from_utf8_lossy)?;
    let field = |key: &str| -> std::result::Result<&str, String> {
        let at = header.find(&format!("'{key}'")).ok_or_else(|| format!("the .npy header has no '{key}'"))?;
        let rest = header[at + key.len() + 2..].trim_start();
        Ok(rest.strip_prefix(':').ok_or_else(|| format!("malformed .npy header near '{key}'"))?.trim_start())
    };
    let descr = field("descr")?;
    let descr = match descr.chars().next() {
        Some(q @ ('\'' | '"')) => descr[1..].split(q).next().unwrap_or_default(),
        _ => return Err("the .npy file holds a structured array (only plain numeric arrays are inputs)".into()),
    };
    let fortran = field("fortran_order")?.starts_with("True");
    let shape_text = field("shape")?;
    let shape_text =
        shape_text.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or("malformed shape in the .npy header")?;
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches('L').parse::<usize>().map_err(|_| format!("bad dim '{s}' in the .npy header")))
        .collect::<std::result::Result<_, _>>()?;

    let (order, code) = match descr.chars().next() {
        Some(c @ ('<' | '>' | '|' | '=')) => (c, &descr[1..]),
        _ => ('=', descr),
    };
    let big = order == '>' || (order == '=' && cfg!(target_endian = "big"));
    let dtype = match code {
        "f2" | "e" => DType::F16,
        "f4" | "f" => DType::F32,
        "f8" | "d" => DType::F64,
        "i1" | "b" => DType::I8,
        "i2" | "h" => DType::I16,
        "i4" | "i" => DType::I32,
        "i8" | "q" => DType::I64,
        "u1" | "B" => DType::U8,
        "u2" | "H" => DType::U16,
        "u4" | "I" => DType::U32,
        "u8" | "Q" => DType::U64,
        "b1" | "?" => DType::Bool,
        _ => return Err(format!("the file holds {}, which is not a numeric input type", describe_descr(descr))),
    };
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).ok_or("the .npy shape is too large")?;
    let size = dtype.size_bytes();
    let data = &bytes[start + header_len..];
    if data.len() < n.saturating_mul(size) {
        return Err(format!("the .npy data is truncated: {} bytes for {n} elements of {size} bytes", data.len()));
    }
    fn build<T: Elem>(shape: &[usize], fortran: bool, v: Vec<T>) -> Tensor {
        use ndarray::ShapeBuilder;
        let a = if fortran {
            ArrayD::from_shape_vec(ndarray::IxDyn(shape).f(), v).map(|a| a.as_standard_layout().into_owned())
        } else {
            ArrayD::from_shape_vec(ndarray::IxDyn(shape), v)
        };
        T::wrap(a.expect("the length is the shape's product"))
    }
    macro_rules! read {
        ($t:ty, $w:expr) => {{
            let v: Vec<$t> = data[..n * $w]
                .chunks_exact($w)
                .map(|c| {
                    let c: [u8; $w] = c.try_into().expect("chunks of the element size");
                    if big {
                        <$t>::from_be_bytes(c)
                    } else {
                        <$t>::from_le_bytes(c)
                    }
                })
                .collect();
            build(&shape, fortran, v)
        }};
    }
    Ok(match dtype {
        DType::F16 => read!(half::f16, 2),
        DType::F32 => read!(f32, 4),
        DType::F64 => read!(f64, 8),
        DType::I8 => read!(i8, 1),
        DType::I16 => read!(i16, 2),
        DType::I32 => read!(i32, 4),
        DType::I64 => read!(i64, 8),
        DType::U8 => read!(u8, 1),
        DType::U16 => read!(u16, 2),
        DType::U32 => read!(u32, 4),
        DType::U64 => read!(u64, 8),
        DType::Bool => {
            let v: Vec<bool> = data[..n]
                .iter()
                .map(|&b| match b {
                    0 | 1 => Ok(b == 1),
                    _ => Err(format!("bool element with byte value {b}")),
                })
                .collect::<std::result::Result<_, _>>()?;
            build(&shape, fortran, v)
        }
        DType::BF16 => unreachable!("npy has no bfloat16"),
    })
}

/// A value of any element type, exactly.
#[derive(Clone, Copy)]
enum Exact {
    Int(i128),
    Float(f64),
}

fn exact_values(t: &Tensor) -> Vec<Exact> {
    fn ints<T: Copy + Into<i128>>(a: &ArrayD<T>) -> Vec<Exact> {
        a.iter().map(|&v| Exact::Int(v.into())).collect()
    }
    fn floats<T: Elem>(a: &ArrayD<T>) -> Vec<Exact> {
        a.iter().map(|v| Exact::Float(v.to_f64())).collect()
    }
    match t {
        Tensor::F32(a) => floats(a),
        Tensor::F64(a) => floats(a),
        Tensor::F16(a) => floats(a),
        Tensor::BF16(a) => floats(a),
        Tensor::I8(a) => ints(a),
        Tensor::I16(a) => ints(a),
        Tensor::I32(a) => ints(a),
        Tensor::I64(a) => ints(a),
        Tensor::U8(a) => ints(a),
        Tensor::U16(a) => ints(a),
        Tensor::U32(a) => ints(a),
        Tensor::U64(a) => ints(a),
        Tensor::Bool(a) => a.iter().map(|&b| Exact::Int(b as i128)).collect(),
    }
}

/// `t` as `to`, or the first value that does not convert exactly.
fn convert_exactly(t: &Tensor, to: DType) -> std::result::Result<Tensor, String> {
    if t.dtype() == to {
        return Ok(t.clone());
    }
    let int_range: Option<(i128, i128)> = match to {
        DType::I8 => Some((i8::MIN.into(), i8::MAX.into())),
        DType::I16 => Some((i16::MIN.into(), i16::MAX.into())),
        DType::I32 => Some((i32::MIN.into(), i32::MAX.into())),
        DType::I64 => Some((i64::MIN.into(), i64::MAX.into())),
        DType::U8 => Some((0, u8::MAX.into())),
        DType::U16 => Some((0, u16::MAX.into())),
        DType::U32 => Some((0, u32::MAX.into())),
        DType::U64 => Some((0, u64::MAX.into())),
        DType::Bool => Some((0, 1)),
        _ => None,
    };
    // A float that `to` holds exactly (NaN and infinities included).
    let float_fits = |f: f64| -> bool {
        let back = match to {
            DType::F16 => half::f16::from_f64(f).to_f64(),
            DType::BF16 => half::bf16::from_f64(f).to_f64(),
            DType::F32 => f as f32 as f64,
            _ => f,
        };
        back == f || (f.is_nan() && back.is_nan())
    };
    for (i, v) in exact_values(t).into_iter().enumerate() {
        let ok = match (v, int_range) {
            (Exact::Int(x), Some((lo, hi))) => (lo..=hi).contains(&x),
            (Exact::Float(f), Some((lo, hi))) => f.fract() == 0.0 && f >= lo as f64 && f <= hi as f64,
            (Exact::Int(x), None) => (x as f64) as i128 == x && float_fits(x as f64),
            (Exact::Float(f), None) => float_fits(f),
        };
        if !ok {
            let shown = match v {
                Exact::Int(x) => x.to_string(),
                Exact::Float(f) => format!("{f}"),
            };
            let index = unravel(i, t.shape());
            let hint = match to {
                DType::BF16 => "round the values to bfloat16 first (e.g. with ml_dtypes.bfloat16)".to_string(),
                _ => format!("convert the array with .astype(np.{to}) first if that is meant"),
            };
            return Err(format!("value {shown} at index {index:?} is not exactly a {to} ({hint})"));
        }
    }
    if let (Tensor::U64(a), Some(_)) = (t, int_range) {
        // Through i64 (as `cast` goes) would wrap values above i64::MAX; they only fit in u64.
        let v: Vec<i64> = a.iter().map(|&x| x as i64).collect();
        return Ok(Tensor::from_i64s(t.shape(), v).cast(to));
    }
    Ok(t.cast(to))
}

fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
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
        assert_eq!(got.tensors[0].1, Tensor::F32(arr.clone()));
        assert_eq!(got.tensors[1].1.shape(), &[5], "N bound from the file");
        assert_eq!(got.sources[0], InputSource::File(file.display().to_string()));

        // float32 → float64 is exact; 0..15 are also exact int8 values, but not bools.
        let g64 = graph_with_inputs(&[("x", DType::F64, vec![Dim::sym("N"), Dim::known(3)])]);
        assert_eq!(make_inputs(&g64, &opts).unwrap().tensors[0].1, Tensor::F32(arr.clone()).cast(DType::F64));
        let gi8 = graph_with_inputs(&[("x", DType::I8, vec![Dim::sym("N"), Dim::known(3)])]);
        assert_eq!(make_inputs(&gi8, &opts).unwrap().tensors[0].1.to_i64_vec(), (0..15).collect::<Vec<i64>>());
        let gb = graph_with_inputs(&[("x", DType::Bool, vec![Dim::sym("N"), Dim::known(3)])]);
        let e = make_inputs(&gb, &opts).unwrap_err().to_string();
        assert!(
            e.contains("the file holds float32, the input needs bool") && e.contains("value 2 at index [0, 2]"),
            "{e}"
        );
        let g4 = graph_with_inputs(&[("x", DType::F32, vec![Dim::sym("N"), Dim::known(4)])]);
        let e = make_inputs(&g4, &opts).unwrap_err().to_string();
        assert!(e.contains("dim 1 must be 4"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A `.npy` file as numpy writes it (format 1.0), for element bytes given in file order.
    fn npy_bytes(descr: &str, fortran: bool, shape: &[usize], data: &[u8]) -> Vec<u8> {
        let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
        let shape = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
        let fo = if fortran { "True" } else { "False" };
        let mut header = format!("{{'descr': '{descr}', 'fortran_order': {fo}, 'shape': {shape}, }}");
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("onnx2ait-inputs-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn every_numpy_dtype_converts_when_exact() {
        let dir = scratch("dtypes");
        let file = dir.join("a.npy");
        let read = |bytes: Vec<u8>, to: DType| {
            std::fs::write(&file, bytes).unwrap();
            read_input_file(&file, "x", to)
        };
        let f16s: Vec<u8> =
            [1.5f32, -0.25, 65504.0].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        // A float16 file for a float16 input (the case issue 16 reports), and for wider floats.
        let want = Tensor::from_f32s(&[3], vec![1.5, -0.25, 65504.0]);
        assert_eq!(read(npy_bytes("<f2", false, &[3], &f16s), DType::F16).unwrap(), want.cast(DType::F16));
        assert_eq!(read(npy_bytes("<f2", false, &[3], &f16s), DType::F32).unwrap(), want);
        assert_eq!(read(npy_bytes("<f2", false, &[3], &f16s), DType::F64).unwrap(), want.cast(DType::F64));
        // float16 → bfloat16 would round 65504.
        let e = read(npy_bytes("<f2", false, &[3], &f16s), DType::BF16).unwrap_err();
        assert!(e.contains("value 65504 at index [2] is not exactly a bfloat16"), "{e}");
        // float32 → float16: exact values pass, others are refused with the fix.
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(
            read(npy_bytes("<f4", false, &[3], &f32s(&[1.5, -0.25, 65504.0])), DType::F16).unwrap(),
            want.cast(DType::F16)
        );
        let e = read(npy_bytes("<f4", false, &[2], &f32s(&[0.5, 0.1])), DType::F16).unwrap_err();
        assert!(
            e.contains("holds float32, the input needs float16")
                && e.contains("value 0.10000000149011612 at index [1]"),
            "{e}"
        );
        assert!(e.contains(".astype(np.float16)"), "{e}");
        // NaN and infinities convert between floats.
        let odd = read(npy_bytes("<f4", false, &[2], &f32s(&[f32::NAN, f32::INFINITY])), DType::F16).unwrap();
        let odd = odd.to_f64_vec();
        assert!(odd[0].is_nan() && odd[1] == f64::INFINITY);
        // Big-endian int32 → int64, and int64 → int32 when the values fit.
        let be: Vec<u8> = [7i32, -3].iter().flat_map(|v| v.to_be_bytes()).collect();
        assert_eq!(read(npy_bytes(">i4", false, &[2], &be), DType::I64).unwrap(), Tensor::from_i64s(&[2], vec![7, -3]));
        let i64s = |v: &[i64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(
            read(npy_bytes("<i8", false, &[2], &i64s(&[7, -3])), DType::I32).unwrap(),
            Tensor::from_i64s(&[2], vec![7, -3]).cast(DType::I32)
        );
        let e = read(npy_bytes("<i8", false, &[2], &i64s(&[1, 1 << 40])), DType::I32).unwrap_err();
        assert!(e.contains("value 1099511627776 at index [1] is not exactly a int32"), "{e}");
        // Negative to unsigned, 2^53+1 to float64, uint64 above i64::MAX to uint64 and int64.
        assert!(read(npy_bytes("<i8", false, &[1], &i64s(&[-1])), DType::U8).is_err());
        assert!(read(npy_bytes("<i8", false, &[1], &i64s(&[(1 << 53) + 1])), DType::F64).is_err());
        let big = (u64::MAX - 1).to_le_bytes().to_vec();
        assert_eq!(
            read(npy_bytes("<u8", false, &[1], &big), DType::U64).unwrap().to_f64_vec()[0],
            (u64::MAX - 1) as f64
        );
        assert!(read(npy_bytes("<u8", false, &[1], &big), DType::I64).is_err());
        // uint8 → float32 and bool → int64 are exact; int8 → bool only for 0 and 1.
        assert_eq!(
            read(npy_bytes("|u1", false, &[2], &[0, 255]), DType::F32).unwrap(),
            Tensor::from_f32s(&[2], vec![0.0, 255.0])
        );
        assert_eq!(
            read(npy_bytes("|b1", false, &[2], &[1, 0]), DType::I64).unwrap(),
            Tensor::from_i64s(&[2], vec![1, 0])
        );
        assert!(read(npy_bytes("|i1", false, &[2], &[1, 0]), DType::Bool).is_ok());
        assert!(read(npy_bytes("|i1", false, &[2], &[2, 0]), DType::Bool).is_err());
        // Fortran order is read into C order.
        let fo = read(npy_bytes("<i8", true, &[2, 3], &i64s(&[0, 3, 1, 4, 2, 5])), DType::I64).unwrap();
        assert_eq!(fo.to_i64_vec(), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(fo.shape(), &[2, 3]);
        // Strings, complex numbers and truncated files are clear errors.
        let e = read(npy_bytes("<U3", false, &[1], &[0; 12]), DType::F32).unwrap_err();
        assert!(e.contains("not a numeric input type"), "{e}");
        assert!(read(npy_bytes("<c8", false, &[1], &[0; 8]), DType::F32).is_err());
        let e = read(npy_bytes("<f4", false, &[4], &f32s(&[1.0])), DType::F32).unwrap_err();
        assert!(e.contains("truncated"), "{e}");
        assert!(read(b"not numpy".to_vec(), DType::F32).unwrap_err().contains("not a .npy file"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn npz_archives_name_their_arrays() {
        use std::io::Write;
        let dir = scratch("npz");
        let f16s: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
        let ids: Vec<u8> = [5i64, 6, 7].iter().flat_map(|v| v.to_le_bytes()).collect();
        let write = |path: &Path, members: &[(&str, Vec<u8>)], method: zip::CompressionMethod| {
            let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
            for (name, bytes) in members {
                z.start_file(*name, zip::write::SimpleFileOptions::default().compression_method(method)).unwrap();
                z.write_all(bytes).unwrap();
            }
            z.finish().unwrap();
        };
        let both = dir.join("both.npz");
        write(
            &both,
            &[("x.npy", npy_bytes("<f2", false, &[2], &f16s)), ("ids.npy", npy_bytes("<i8", false, &[3], &ids))],
            zip::CompressionMethod::Deflated,
        );
        let g = graph_with_inputs(&[("x", DType::F16, vec![Dim::sym("N")]), ("ids", DType::I32, vec![Dim::known(3)])]);
        let opts = InputOptions {
            files: BTreeMap::from([("x".into(), both.clone()), ("ids".into(), both.clone())]),
            ..Default::default()
        };
        let got = make_inputs(&g, &opts).unwrap();
        assert_eq!(got.tensors[0].1, Tensor::from_f32s(&[2], vec![1.0, 2.0]).cast(DType::F16));
        assert_eq!(got.tensors[1].1, Tensor::from_i64s(&[3], vec![5, 6, 7]).cast(DType::I32));
        assert_eq!(got.dims, BTreeMap::from([("N".to_string(), 2)]));
        // An archive of one array (np.savez(f, a) names it arr_0) serves any input.
        let one = dir.join("one.npz");
        write(&one, &[("arr_0.npy", npy_bytes("<i8", false, &[3], &ids))], zip::CompressionMethod::Stored);
        assert_eq!(read_input_file(&one, "ids", DType::I64).unwrap(), Tensor::from_i64s(&[3], vec![5, 6, 7]));
        // Otherwise the input's name must be there.
        let e = read_input_file(&both, "mask", DType::Bool).unwrap_err();
        assert!(e.contains("no array 'mask'") && e.contains("its arrays: ids, x"), "{e}");
        // Errors name the array.
        let e = read_input_file(&both, "ids", DType::Bool).map(|_| ()).unwrap_err();
        assert!(e.starts_with("array 'ids' holds int64"), "{e}");
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
