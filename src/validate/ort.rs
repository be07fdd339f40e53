//! ONNX Runtime as the validation oracle, through the `ort` crate with a dynamically loaded
//! `libonnxruntime`.
//!
//! The library is found once per process: `ORT_DYLIB_PATH` when set, otherwise the one the
//! project's Python environment installs (`.venv/lib/python3*/site-packages/onnxruntime/capi/`),
//! looked up under the current directory and then under the crate's source directory.
//! ONNX Runtime allows one environment per process, so it is created once and shared.

use crate::error::{Error, Result};
use crate::ir::Tensor;
use ::ort::memory::Allocator;
use ::ort::session::builder::GraphOptimizationLevel;
use ::ort::session::{Session, SessionInputValue};
use ::ort::value::{DynTensor, DynTensorValueType, DynValue, TensorElementType, ValueType};
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Environment variable naming the `libonnxruntime` shared library to load.
pub const DYLIB_ENV: &str = "ORT_DYLIB_PATH";

/// The loaded runtime: which library, its version, and the process-wide environment.
pub struct Runtime {
    pub library: PathBuf,
    pub version: String,
    env: ::ort::environment::Environment,
}

static RUNTIME: OnceLock<std::result::Result<Runtime, String>> = OnceLock::new();

/// Loads ONNX Runtime on first use; later calls return the same runtime (or the same error).
pub fn runtime() -> Result<&'static Runtime> {
    RUNTIME.get_or_init(load_runtime).as_ref().map_err(|m| Error::Other(m.clone()))
}

fn load_runtime() -> std::result::Result<Runtime, String> {
    let library = find_library()?;
    let builder = ::ort::init_from(&library)
        .map_err(|e| format!("cannot load ONNX Runtime from {}: {e}\n{}", library.display(), HOW_TO_GET_IT))?;
    let env = builder
        .with_name("onnx2ait-validate")
        .build()
        .map_err(|e| format!("cannot create the ONNX Runtime environment: {e}"))?;
    let version = ::ort::info()
        .split(',')
        .find_map(|part| part.trim().strip_prefix("git-branch=rel-"))
        .map(str::to_string)
        .unwrap_or_else(|| version_from_file_name(&library));
    Ok(Runtime { library, version, env })
}

const HOW_TO_GET_IT: &str =
    "run scripts/setup-python.sh (installs onnxruntime into .venv), or set ORT_DYLIB_PATH to a libonnxruntime shared library";

/// Finds the shared library: `ORT_DYLIB_PATH`, else the project's virtual environment.
pub fn find_library() -> std::result::Result<PathBuf, String> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        roots.push(cwd);
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if !roots.contains(&manifest) {
        roots.push(manifest);
    }
    locate(std::env::var_os(DYLIB_ENV).map(PathBuf::from), &roots)
}

/// The library named by the environment variable (which must exist), else the first
/// `<root>/.venv` that has one.
fn locate(from_env: Option<PathBuf>, roots: &[PathBuf]) -> std::result::Result<PathBuf, String> {
    if let Some(p) = from_env.filter(|p| !p.as_os_str().is_empty()) {
        if !p.is_file() {
            return Err(format!("{DYLIB_ENV}={} does not name a file; {HOW_TO_GET_IT}", p.display()));
        }
        return Ok(p);
    }
    for root in roots {
        if let Some(lib) = find_in_venv(&root.join(".venv")) {
            return Ok(lib);
        }
    }
    let searched: Vec<String> =
        roots.iter().map(|r| format!("{}/.venv/lib/python3*/site-packages/onnxruntime/capi/", r.display())).collect();
    Err(format!("ONNX Runtime library not found (searched {}); {HOW_TO_GET_IT}", searched.join(", ")))
}

/// The newest `libonnxruntime.so*` / `libonnxruntime*.dylib` of a virtual environment.
fn find_in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = venv.join("lib");
    let mut found: Vec<PathBuf> = Vec::new();
    for py in read_dir_sorted(&lib) {
        let name = py.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !name.starts_with("python3") {
            continue;
        }
        let capi = py.join("site-packages").join("onnxruntime").join("capi");
        for f in read_dir_sorted(&capi) {
            let fname = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // `libonnxruntime_providers_shared.so` is a plugin, not the runtime.
            let is_runtime = fname.starts_with("libonnxruntime.so")
                || (fname.starts_with("libonnxruntime.") && fname.ends_with(".dylib"));
            if is_runtime && f.is_file() {
                found.push(f);
            }
        }
    }
    // Several versions side by side: the highest version sorts last once numbers are compared.
    found.sort_by_key(|p| version_key(&version_from_file_name(p)));
    found.pop()
}

fn read_dir_sorted(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

/// `libonnxruntime.so.1.32.0` → `1.32.0` (empty when the name carries no version).
fn version_from_file_name(p: &Path) -> String {
    let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let digits: Vec<&str> =
        name.split('.').filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit())).collect();
    digits.join(".")
}

fn version_key(v: &str) -> Vec<u64> {
    v.split('.').filter_map(|s| s.parse().ok()).collect()
}

/// One model loaded into ONNX Runtime (CPU execution provider).
pub struct OrtModel {
    session: Session,
    path: String,
}

impl OrtModel {
    /// Loads a model file. Graph optimisations are off: the oracle should compute each node as
    /// the ONNX spec defines it, not a fused approximation (fusions such as Conv+BatchNorm
    /// change rounding).
    pub fn load(path: &Path) -> Result<OrtModel> {
        let rt = runtime()?;
        let p = path.display().to_string();
        let err = |what: &str, e: String| Error::model(&p, format!("ONNX Runtime {what}: {e}"));
        let session = Session::builder(&rt.env)
            .map_err(|e| err("session options", e.to_string()))?
            .with_optimization_level(GraphOptimizationLevel::Disable)
            .map_err(|e| err("session options", e.to_string()))?
            .with_log_level(::ort::logging::LogLevel::Error)
            .map_err(|e| err("session options", e.to_string()))?
            .commit_from_file(path)
            .map_err(|e| err("could not load the model", e.to_string()))?;
        Ok(OrtModel { session, path: p })
    }

    /// Names of the inputs ONNX Runtime expects (initializers listed as inputs excluded).
    pub fn input_names(&self) -> Vec<String> {
        self.session.inputs().iter().map(|o| o.name().to_string()).collect()
    }

    /// Runs the model on named inputs; returns every graph output, in graph order.
    pub fn run(&mut self, inputs: &[(String, Tensor)]) -> Result<Vec<(String, Tensor)>> {
        let path = self.path.clone();
        let mut feed: Vec<(Cow<'_, str>, SessionInputValue<'_>)> = Vec::with_capacity(inputs.len());
        for (name, t) in inputs {
            let v = to_ort(t).map_err(|m| Error::model(&path, format!("input '{name}': {m}")))?;
            feed.push((Cow::Owned(name.clone()), SessionInputValue::from(v)));
        }
        let names: Vec<String> = self.session.outputs().iter().map(|o| o.name().to_string()).collect();
        let mut outs = self.session.run(feed).map_err(|e| Error::model(&path, format!("ONNX Runtime failed: {e}")))?;
        let mut result = Vec::with_capacity(names.len());
        for name in names {
            let v = outs
                .remove(name.as_str())
                .ok_or_else(|| Error::model(&path, format!("ONNX Runtime returned no value for output '{name}'")))?;
            let t = from_ort(v).map_err(|m| Error::model(&path, format!("output '{name}': {m}")))?;
            result.push((name, t));
        }
        Ok(result)
    }
}

fn ort_err(e: ::ort::Error) -> String {
    e.to_string()
}

/// Copies a host tensor into an ONNX Runtime value (always a copy: element order is the
/// logical row-major order, whatever the ndarray layout).
fn to_ort(t: &Tensor) -> std::result::Result<DynValue, String> {
    fn typed<T: ::ort::value::PrimitiveTensorElementType + Clone + std::fmt::Debug + 'static>(
        a: &ArrayD<T>,
    ) -> std::result::Result<DynValue, String> {
        let shape: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
        let data: Vec<T> = a.iter().cloned().collect();
        Ok(::ort::value::Tensor::from_array((shape, data)).map_err(ort_err)?.into_dyn())
    }
    match t {
        Tensor::F32(a) => typed(a),
        Tensor::F64(a) => typed(a),
        Tensor::I8(a) => typed(a),
        Tensor::I16(a) => typed(a),
        Tensor::I32(a) => typed(a),
        Tensor::I64(a) => typed(a),
        Tensor::U8(a) => typed(a),
        Tensor::U16(a) => typed(a),
        Tensor::U32(a) => typed(a),
        Tensor::U64(a) => typed(a),
        Tensor::Bool(a) => typed(a),
        Tensor::F16(a) => half_bits(TensorElementType::Float16, a.shape(), a.iter().map(|v| v.to_bits()).collect()),
        Tensor::BF16(a) => half_bits(TensorElementType::Bfloat16, a.shape(), a.iter().map(|v| v.to_bits()).collect()),
    }
}

/// 16-bit floats go in as raw bits: `ort` maps `half::f16` only with its `half` feature, which
/// this build does not enable, so the tensor is allocated untyped and filled bit for bit.
fn half_bits(ty: TensorElementType, shape: &[usize], bits: Vec<u16>) -> std::result::Result<DynValue, String> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut v: DynTensor = DynTensor::new(&Allocator::default(), ty, dims).map_err(ort_err)?;
    if !bits.is_empty() {
        let dst = v.data_ptr_mut().cast::<u16>();
        if dst.is_null() {
            return Err("ONNX Runtime allocated no buffer for a non-empty tensor".into());
        }
        // SAFETY: the tensor was just allocated on the CPU allocator with `bits.len()` elements of
        // a 2-byte type, and nothing else refers to it yet.
        unsafe { std::ptr::copy_nonoverlapping(bits.as_ptr(), dst, bits.len()) };
    }
    Ok(v.into_dyn())
}

/// Copies an ONNX Runtime output into a host tensor.
fn from_ort(v: DynValue) -> std::result::Result<Tensor, String> {
    let (ty, dims) = match v.dtype() {
        ValueType::Tensor { ty, shape, .. } => (*ty, shape.iter().map(|&d| d as usize).collect::<Vec<usize>>()),
        other => return Err(format!("is a {other}, only tensors are supported")),
    };
    fn typed<T: ::ort::value::PrimitiveTensorElementType + Clone + 'static>(
        v: &DynValue,
        dims: &[usize],
    ) -> std::result::Result<ArrayD<T>, String> {
        let (_, data) = v.try_extract_tensor::<T>().map_err(ort_err)?;
        ArrayD::from_shape_vec(IxDyn(dims), data.to_vec()).map_err(|e| e.to_string())
    }
    Ok(match ty {
        TensorElementType::Float32 => Tensor::F32(typed(&v, &dims)?),
        TensorElementType::Float64 => Tensor::F64(typed(&v, &dims)?),
        TensorElementType::Int8 => Tensor::I8(typed(&v, &dims)?),
        TensorElementType::Int16 => Tensor::I16(typed(&v, &dims)?),
        TensorElementType::Int32 => Tensor::I32(typed(&v, &dims)?),
        TensorElementType::Int64 => Tensor::I64(typed(&v, &dims)?),
        TensorElementType::Uint8 => Tensor::U8(typed(&v, &dims)?),
        TensorElementType::Uint16 => Tensor::U16(typed(&v, &dims)?),
        TensorElementType::Uint32 => Tensor::U32(typed(&v, &dims)?),
        TensorElementType::Uint64 => Tensor::U64(typed(&v, &dims)?),
        TensorElementType::Bool => Tensor::Bool(typed(&v, &dims)?),
        TensorElementType::Float16 => Tensor::F16(half_from_bits(v, &dims, f16::from_bits)?),
        TensorElementType::Bfloat16 => Tensor::BF16(half_from_bits(v, &dims, bf16::from_bits)?),
        other => return Err(format!("element type {other} is not supported by onnx2ait")),
    })
}

fn half_from_bits<T>(v: DynValue, dims: &[usize], conv: fn(u16) -> T) -> std::result::Result<ArrayD<T>, String> {
    let n: usize = dims.iter().product();
    let bits: Vec<u16> = if n == 0 {
        Vec::new()
    } else {
        let t: DynTensor = v.downcast::<DynTensorValueType>().map_err(ort_err)?;
        let src = t.data_ptr().cast::<u16>();
        if src.is_null() {
            return Err("ONNX Runtime returned no buffer for a non-empty tensor".into());
        }
        // SAFETY: the value is a CPU tensor of a 2-byte element type (checked by the caller)
        // with `n` elements; it outlives this borrow.
        unsafe { std::slice::from_raw_parts(src, n) }.to_vec()
    };
    ArrayD::from_shape_vec(IxDyn(dims), bits.into_iter().map(conv).collect()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;
    use crate::onnx::proto::{
        tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto,
        TypeProto, ValueInfoProto,
    };
    use prost::Message;

    #[test]
    fn version_ordering_picks_newest() {
        assert_eq!(version_from_file_name(Path::new("libonnxruntime.so.1.32.0")), "1.32.0");
        assert_eq!(version_from_file_name(Path::new("libonnxruntime.so")), "");
        assert!(version_key("1.32.0") > version_key("1.9.1"));
    }

    #[test]
    fn library_lookup_errors_say_how_to_fix() {
        let e = locate(Some(PathBuf::from("/nonexistent/libonnxruntime.so")), &[]).unwrap_err();
        assert!(e.contains("ORT_DYLIB_PATH=/nonexistent") && e.contains("scripts/setup-python.sh"), "{e}");
        let e = locate(None, &[PathBuf::from("/nonexistent")]).unwrap_err();
        assert!(e.contains("/nonexistent/.venv/lib/python3*") && e.contains("ORT_DYLIB_PATH"), "{e}");
        let venv = tempdir("venv-layout");
        let capi = venv.join(".venv/lib/python3.11/site-packages/onnxruntime/capi");
        std::fs::create_dir_all(&capi).unwrap();
        for f in ["libonnxruntime.so.1.9.0", "libonnxruntime.so.1.32.0", "libonnxruntime_providers_shared.so"] {
            std::fs::write(capi.join(f), b"").unwrap();
        }
        assert_eq!(locate(None, std::slice::from_ref(&venv)).unwrap(), capi.join("libonnxruntime.so.1.32.0"));
        std::fs::remove_dir_all(&venv).ok();
    }

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onnx2ait-ort-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn value_info(name: &str, d: DType, shape: &[usize]) -> ValueInfoProto {
        let dim = shape
            .iter()
            .map(|&v| tensor_shape_proto::Dimension {
                value: Some(tensor_shape_proto::dimension::Value::DimValue(v as i64)),
                ..Default::default()
            })
            .collect();
        ValueInfoProto {
            name: Some(name.into()),
            r#type: Some(TypeProto {
                value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                    elem_type: Some(d.onnx_code()),
                    shape: Some(TensorShapeProto { dim }),
                })),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Every element type crosses into ONNX Runtime and back unchanged (Identity per dtype),
    /// including empty tensors and 16-bit floats, which go through raw bits.
    #[test]
    fn every_dtype_round_trips_through_onnxruntime() {
        let shape = [2usize, 3];
        let mut nodes = Vec::new();
        let (mut inputs, mut outputs, mut feed) = (Vec::new(), Vec::new(), Vec::new());
        for (k, d) in DType::ALL.iter().enumerate() {
            let values: Vec<f32> = (0..6).map(|i| i as f32 * 1.5 - 2.0).collect();
            let t = if *d == DType::Bool {
                Tensor::from_f32s(&shape, values.iter().map(|v| (*v > 0.0) as i32 as f32).collect()).cast(*d)
            } else if d.is_signed() {
                Tensor::from_f32s(&shape, values).cast(*d)
            } else {
                Tensor::from_f32s(&shape, values.iter().map(|v| v.abs()).collect()).cast(*d)
            };
            let (i, o) = (format!("in_{k}"), format!("out_{k}"));
            nodes.push(NodeProto {
                op_type: Some("Identity".into()),
                input: vec![i.clone()],
                output: vec![o.clone()],
                ..Default::default()
            });
            inputs.push(value_info(&i, *d, &shape));
            outputs.push(value_info(&o, *d, &shape));
            feed.push((i, t));
        }
        // An empty float16 tensor: no buffer to copy.
        nodes.push(NodeProto {
            op_type: Some("Identity".into()),
            input: vec!["e".into()],
            output: vec!["e_out".into()],
            ..Default::default()
        });
        inputs.push(value_info("e", DType::F16, &[0, 4]));
        outputs.push(value_info("e_out", DType::F16, &[0, 4]));
        feed.push(("e".into(), Tensor::zeros(DType::F16, &[0, 4])));
        let model = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
            graph: Some(GraphProto {
                name: Some("identity".into()),
                node: nodes,
                input: inputs,
                output: outputs,
                ..Default::default()
            }),
            ..Default::default()
        };
        let dir = tempdir("roundtrip");
        let path = dir.join("identity.onnx");
        std::fs::write(&path, model.encode_to_vec()).unwrap();
        let mut m = OrtModel::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.input_names().len(), feed.len());
        let out = m.run(&feed).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.len(), feed.len());
        for ((name, got), (_, want)) in out.iter().zip(&feed) {
            assert_eq!(got, want, "output {name} ({})", want.dtype());
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn onnxruntime_errors_name_the_model() {
        let dir = tempdir("bad-input");
        let model = ModelProto {
            ir_version: Some(8),
            opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
            graph: Some(GraphProto {
                node: vec![NodeProto {
                    op_type: Some("Relu".into()),
                    input: vec!["x".into()],
                    output: vec!["y".into()],
                    ..Default::default()
                }],
                input: vec![value_info("x", DType::F32, &[2])],
                output: vec![value_info("y", DType::F32, &[2])],
                ..Default::default()
            }),
            ..Default::default()
        };
        let path = dir.join("relu.onnx");
        std::fs::write(&path, model.encode_to_vec()).unwrap();
        let mut m = OrtModel::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let e = m.run(&[("x".into(), Tensor::from_i64s(&[2], vec![1, 2]))]).unwrap_err().to_string();
        assert!(e.contains("relu.onnx") && e.contains("ONNX Runtime failed"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
