//! `onnx2ait._onnx2ait`: the native half of the Python package. The pure-Python `onnx2ait`
//! package (python/onnx2ait/__init__.py) is the documented API; this module does what needs the
//! Rust library: `compile` (onnx2ait::compile, options checked here so bad ones raise
//! ValueError) and `Model` (onnx2ait::runtime::Model on NumPy arrays of the model's exact dtypes;
//! the Python side converts what users pass).
//!
//! The GIL is released while the pipeline or the model runs, so other Python threads go on.

mod dlpack;

use dlpack::{DeviceTensor, Imported, Storage, KDL_CUDA};
use numpy::{Element, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use onnx2ait::compile::{checks, CompileOptions, KernelChoice};
use onnx2ait::ir::DType;
use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::Precision;
use onnx2ait::runtime::{Library, Model};
use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

create_exception!(
    onnx2ait,
    Error,
    PyRuntimeError,
    "A failure of onnx2ait (import, optimisation, code generation, nvcc, loading or running a model); the message is the library's."
);

/// An onnx2ait error as the Python exception the package raises.
pub(crate) fn err(e: onnx2ait::Error) -> PyErr {
    Error::new_err(e.to_string())
}

/// The options as `compile` takes them, checked (a bad value is a ValueError naming the option).
#[allow(clippy::too_many_arguments)]
fn options(
    arch: &str,
    max_batch: i64,
    max_memory: Option<&Bound<'_, PyAny>>,
    dims: Option<&Bound<'_, PyDict>>,
    precision: &str,
    attention: &str,
    squeeze_excite: &str,
    profile: bool,
    profile_cache: Option<PathBuf>,
    no_profile: bool,
    profile_gpu: Option<String>,
    reuse_within: f64,
    jobs: Option<i64>,
    cache_dir: Option<PathBuf>,
    build: bool,
    force: bool,
    progress: bool,
    symbol_prefix: Option<String>,
) -> PyResult<CompileOptions> {
    let value_err = |m: String| PyValueError::new_err(m);
    let arch: Arch = arch.parse().map_err(|e: onnx2ait::Error| value_err(format!("arch: {e}")))?;
    if max_batch < 1 {
        return Err(value_err(format!("max_batch={max_batch}: must be at least 1")));
    }
    let max_memory = match max_memory {
        None => None,
        Some(v) if v.is_instance_of::<pyo3::types::PyBool>() => {
            return Err(PyTypeError::new_err("max_memory: expected bytes (an int) or a size such as '40GiB'"))
        }
        Some(v) => match v.extract::<i64>() {
            Ok(n) if n >= 1 => Some(n as u64),
            Ok(n) => return Err(value_err(format!("max_memory={n}: must be a positive number of bytes"))),
            Err(_) => {
                let s: String = v.extract().map_err(|_| {
                    PyTypeError::new_err("max_memory: expected bytes (an int) or a size such as '40GiB'")
                })?;
                Some(checks::parse_size(&s).map_err(|e| value_err(format!("max_memory: {e}")))?)
            }
        },
    };
    let mut dim_map = BTreeMap::new();
    let mut ranges = BTreeMap::new();
    if let Some(d) = dims {
        for (k, v) in d.iter() {
            let name: String =
                k.extract().map_err(|_| PyTypeError::new_err(format!("dims: the key {k} is not a string")))?;
            let expected = || {
                PyTypeError::new_err(format!(
                    "dims['{name}']: expected a whole number or a (min, max) range of them, got {v}"
                ))
            };
            if v.is_instance_of::<pyo3::types::PyBool>() {
                return Err(expected());
            }
            if let Ok((lo, hi)) = v.extract::<(i64, i64)>() {
                if lo < 1 || lo > hi {
                    return Err(value_err(format!("dims['{name}']=({lo}, {hi}): a range needs 1 <= min <= max")));
                }
                ranges.insert(name, (lo, hi));
                continue;
            }
            let n: i64 = v.extract().map_err(|_| expected())?;
            if n < 0 {
                return Err(value_err(format!("dims['{name}']={n}: cannot be negative")));
            }
            dim_map.insert(name, n);
        }
    }
    let precision: Precision = precision.parse().map_err(|e| value_err(format!("precision: {e}")))?;
    let attention = match attention {
        "auto" => onnx2ait::compile::Attention::Auto,
        "unfused" => onnx2ait::compile::Attention::Unfused,
        "fused" => onnx2ait::compile::Attention::Fused,
        other => return Err(value_err(format!("attention='{other}': expected 'auto', 'unfused' or 'fused'"))),
    };
    let fused_squeeze_excite = match squeeze_excite {
        "unfused" => false,
        "fused" => true,
        other => return Err(value_err(format!("squeeze_excite='{other}': expected 'unfused' or 'fused'"))),
    };
    // As the command line: --profile and --no-profile exclude each other, and --profile-cache
    // names the file either reads.
    let kernel_choice = match (profile, no_profile) {
        (true, true) => return Err(value_err("profile=True and no_profile=True exclude each other".into())),
        (false, true) if profile_cache.is_some() => {
            return Err(value_err("no_profile=True ignores every profile cache; drop profile_cache".into()))
        }
        (false, true) => KernelChoice::Heuristic,
        (true, false) => KernelChoice::Profile(profile_cache),
        (false, false) => KernelChoice::ProfileCache(profile_cache),
    };
    if !(0.0..=100.0).contains(&reuse_within) {
        return Err(value_err(format!("reuse_within={reuse_within}: must be a percentage from 0 to 100")));
    }
    let jobs = match jobs {
        None => None,
        Some(n) if (1..=1024).contains(&n) => Some(n as usize),
        Some(n) => return Err(value_err(format!("jobs={n}: must be a whole number from 1 to 1024"))),
    };
    Ok(CompileOptions {
        // The Python package compiles for CUDA (the ROCm target is the command line's and the
        // Rust API's for now).
        target: onnx2ait::compile::GpuTarget::Cuda,
        arch,
        max_batch,
        max_memory,
        dims: dim_map,
        ranges,
        precision,
        attention,
        fused_squeeze_excite,
        kernel_choice,
        profile_gpu,
        reuse_within: reuse_within / 100.0,
        jobs,
        // As the command line: ONNX2AIT_CACHE_DIR when no folder is given.
        cache_dir: cache_dir.or_else(|| std::env::var_os("ONNX2AIT_CACHE_DIR").map(PathBuf::from)),
        build,
        force,
        progress,
        symbol_prefix: match symbol_prefix {
            Some(p) => {
                onnx2ait::codegen::check_symbol_prefix(&p)
                    .map_err(|e| value_err(e.to_string().replacen("--symbol-prefix", "symbol_prefix", 1)))?;
                Some(p)
            }
            None => None,
        },
    })
}

/// onnx2ait.compile's native part: returns a dict of the Build's fields.
#[pyfunction]
#[pyo3(signature = (model_path, out_dir, *, arch, max_batch, max_memory, dims, precision, attention, squeeze_excite,
    profile, profile_cache, no_profile, profile_gpu, reuse_within, jobs, cache_dir, build, force, progress, symbol_prefix=None))]
#[allow(clippy::too_many_arguments)]
fn compile<'py>(
    py: Python<'py>,
    model_path: PathBuf,
    out_dir: PathBuf,
    arch: &str,
    max_batch: i64,
    max_memory: Option<&Bound<'py, PyAny>>,
    dims: Option<&Bound<'py, PyDict>>,
    precision: &str,
    attention: &str,
    squeeze_excite: &str,
    profile: bool,
    profile_cache: Option<PathBuf>,
    no_profile: bool,
    profile_gpu: Option<String>,
    reuse_within: f64,
    jobs: Option<i64>,
    cache_dir: Option<PathBuf>,
    build: bool,
    force: bool,
    progress: bool,
    symbol_prefix: Option<String>,
) -> PyResult<Bound<'py, PyDict>> {
    let opts = options(
        arch,
        max_batch,
        max_memory,
        dims,
        precision,
        attention,
        squeeze_excite,
        profile,
        profile_cache,
        no_profile,
        profile_gpu,
        reuse_within,
        jobs,
        cache_dir,
        build,
        force,
        progress,
        symbol_prefix,
    )?;
    if !model_path.is_file() {
        return Err(PyFileNotFoundError::new_err(format!("{}: no such model file", model_path.display())));
    }
    // onnx2ait::compile's steps, with the dim names checked first so that an unknown one is a
    // ValueError like the other option errors (prepare checks them again; that is cheap).
    enum Failed {
        Dims(String),
        Other(onnx2ait::Error),
    }
    let built = py.detach(|| {
        let graph = onnx2ait::onnx::load_model(&model_path).map_err(Failed::Other)?;
        let pairs: Vec<(String, i64)> = opts.dims.iter().map(|(k, v)| (k.clone(), *v)).collect();
        checks::check_dims(&graph, &pairs).map_err(|e| Failed::Dims(e.to_string().replacen("--dim ", "dims: ", 1)))?;
        let warnings = graph.info.warnings.clone();
        let build =
            (|| onnx2ait::compile::prepare(graph, &opts)?.generate(&out_dir)?.build())().map_err(Failed::Other)?;
        Ok((build, warnings))
    });
    let (built, warnings) = built.map_err(|f| match f {
        Failed::Dims(m) => PyValueError::new_err(m),
        Failed::Other(e) => err(e),
    })?;
    let d = PyDict::new(py);
    d.set_item("out", built.out)?;
    d.set_item("library", built.library)?;
    d.set_item("build_hash", built.build_hash)?;
    d.set_item("summary", built.summary)?;
    d.set_item("profile_summary", built.profile_summary)?;
    d.set_item("kernels", built.kernels)?;
    d.set_item("warnings", warnings)?;
    Ok(d)
}

/// A model instance on the GPU (onnx2ait.runtime.Model).
#[pyclass(module = "onnx2ait._onnx2ait")]
struct NativeModel {
    // Runs take `&mut Model`; the lock also keeps two Python threads from running one model at
    // once, which the C API does not allow.
    model: Mutex<Model>,
}

/// A dim of an input or output as Python shows it: a number, or the run-time dim it follows
/// ("N", "2*N"), or "?" when it follows several run-time dims or not proportionally.
#[derive(IntoPyObject)]
enum DimLabel {
    Known(usize),
    Symbolic(String),
}

/// One input or output: (name, dtype name, shape with run-time dims by name).
type IoRow = (String, &'static str, Vec<DimLabel>);

/// Each axis of input/output `i` labelled by comparing its size at the smallest run-time dims
/// with its size with one dim at a time one larger.
fn io_rows(lib: &Library, output: bool) -> PyResult<Vec<IoRow>> {
    let infos = if output { lib.outputs() } else { lib.inputs() };
    let shape = |i: usize, d: &[i64]| if output { lib.output_shape(i, d) } else { lib.input_shape(i, d) };
    let base = lib.min_dims();
    infos
        .iter()
        .enumerate()
        .map(|(i, info)| {
            let at_base = shape(i, &base).map_err(err)?;
            let mut growth: Vec<Vec<(usize, i64)>> = vec![Vec::new(); at_base.len()];
            for (j, d) in lib.run_dims().iter().enumerate() {
                if d.max == d.min {
                    continue;
                }
                let mut bumped = base.clone();
                bumped[j] += 1;
                for (a, (&s0, &s1)) in at_base.iter().zip(&shape(i, &bumped).map_err(err)?).enumerate() {
                    if s1 != s0 {
                        growth[a].push((j, s1 as i64 - s0 as i64));
                    }
                }
            }
            let labels = at_base
                .iter()
                .zip(growth)
                .map(|(&s0, g)| match g.as_slice() {
                    [] => DimLabel::Known(s0),
                    [(j, k)] if *k > 0 && s0 as i64 == k * lib.run_dims()[*j].min => {
                        let name = &lib.run_dims()[*j].symbol;
                        DimLabel::Symbolic(if *k == 1 { name.clone() } else { format!("{k}*{name}") })
                    }
                    _ => DimLabel::Symbolic("?".into()),
                })
                .collect();
            Ok((info.name.clone(), info.dtype.name(), labels))
        })
        .collect()
}

/// NumPy's dtype of a model dtype as the native side exchanges it (bfloat16 as its uint16 bits).
fn numpy_dtype(py: Python<'_>, d: DType) -> Bound<'_, numpy::PyArrayDescr> {
    match d {
        DType::F32 => numpy::dtype::<f32>(py),
        DType::F64 => numpy::dtype::<f64>(py),
        DType::F16 => numpy::dtype::<half::f16>(py),
        DType::BF16 | DType::U16 => numpy::dtype::<u16>(py),
        DType::I8 => numpy::dtype::<i8>(py),
        DType::I16 => numpy::dtype::<i16>(py),
        DType::I32 => numpy::dtype::<i32>(py),
        DType::I64 => numpy::dtype::<i64>(py),
        DType::U8 => numpy::dtype::<u8>(py),
        DType::U32 => numpy::dtype::<u32>(py),
        DType::U64 => numpy::dtype::<u64>(py),
        DType::Bool => numpy::dtype::<bool>(py),
    }
}

/// A zero-filled array of dtype `d` (bfloat16 as uint16 bits) and `shape`.
fn zeros<'py>(py: Python<'py>, d: DType, shape: &[usize]) -> Bound<'py, PyUntypedArray> {
    fn z<'py, T: Element>(py: Python<'py>, shape: &[usize]) -> Bound<'py, PyUntypedArray> {
        PyArrayDyn::<T>::zeros(py, numpy::ndarray::IxDyn(shape), false).as_untyped().clone()
    }
    match d {
        DType::F32 => z::<f32>(py, shape),
        DType::F64 => z::<f64>(py, shape),
        DType::F16 => z::<half::f16>(py, shape),
        DType::BF16 | DType::U16 => z::<u16>(py, shape),
        DType::I8 => z::<i8>(py, shape),
        DType::I16 => z::<i16>(py, shape),
        DType::I32 => z::<i32>(py, shape),
        DType::I64 => z::<i64>(py, shape),
        DType::U8 => z::<u8>(py, shape),
        DType::U32 => z::<u32>(py, shape),
        DType::U64 => z::<u64>(py, shape),
        DType::Bool => z::<bool>(py, shape),
    }
}

/// Refuses a host array that input/output `name` cannot take as it is: another dtype, not
/// C-contiguous, or another shape than `want` (the tensor's at the run's dims, `at` in words).
fn check_host_buffer(
    py: Python<'_>,
    a: &Bound<'_, PyUntypedArray>,
    what: &str,
    name: &str,
    dtype: DType,
    want: &[usize],
    at: &str,
) -> PyResult<()> {
    if !a.dtype().is_equiv_to(&numpy_dtype(py, dtype)) {
        return Err(PyTypeError::new_err(format!(
            "{what} '{name}': the array's dtype is {}, the model's is {}",
            a.dtype(),
            dtype.name()
        )));
    }
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what} '{name}': not a C-contiguous array")));
    }
    if a.shape() != want {
        return Err(PyValueError::new_err(format!(
            "{what} '{name}' has shape {:?}, the run {at} takes {want:?}",
            a.shape()
        )));
    }
    Ok(())
}

/// Whether NumPy lets the array be written (its WRITEABLE flag).
fn is_writeable(a: &Bound<'_, PyUntypedArray>) -> PyResult<bool> {
    a.getattr("flags")?.getattr("writeable")?.extract()
}

/// (model name, max batch, batch symbol or None, run-time dims as (name, min, max), inputs,
/// outputs, (kernel, node) in launch order).
type Description =
    (String, i64, Option<String>, Vec<(String, i64, i64)>, Vec<IoRow>, Vec<IoRow>, Vec<(String, String)>);

fn describe_library(lib: &Library) -> PyResult<Description> {
    let kernels = lib.kernels().iter().map(|k| (k.name.clone(), k.node.clone())).collect();
    Ok((
        lib.model_name().to_string(),
        lib.max_batch(),
        lib.batch_symbol().map(str::to_string),
        lib.run_dims().iter().map(|d| (d.symbol.clone(), d.min, d.max)).collect(),
        io_rows(lib, false)?,
        io_rows(lib, true)?,
        kernels,
    ))
}

fn no_dir(out_dir: &std::path::Path) -> PyErr {
    PyFileNotFoundError::new_err(format!(
        "{}: no such directory (expected the output folder of onnx2ait.compile)",
        out_dir.display()
    ))
}

/// What OUT/libmodel.so says about its model, read through its C API without a GPU.
#[pyfunction]
fn describe(py: Python<'_>, out_dir: PathBuf) -> PyResult<Description> {
    if !out_dir.exists() {
        return Err(no_dir(&out_dir));
    }
    let lib = py.detach(|| Library::open(&out_dir)).map_err(err)?;
    describe_library(&lib)
}

#[pymethods]
impl NativeModel {
    /// Loads OUT/libmodel.so and instantiates the model on the current GPU, with the weights of
    /// OUT/weights.bin, or of `weights` (that file's bytes as a 1-D C-contiguous uint8 array, which
    /// may view any buffer: `o2a_create_from_memory` checks its size and build hash).
    #[new]
    #[pyo3(signature = (out_dir, weights=None))]
    fn new(py: Python<'_>, out_dir: PathBuf, weights: Option<Bound<'_, PyUntypedArray>>) -> PyResult<Self> {
        if !out_dir.exists() {
            return Err(no_dir(&out_dir));
        }
        let Some(w) = weights else {
            let model = py.detach(|| Model::load(&out_dir)).map_err(err)?;
            return Ok(NativeModel { model: Mutex::new(model) });
        };
        if !w.dtype().is_equiv_to(&numpy::dtype::<u8>(py)) || w.ndim() != 1 || !w.is_c_contiguous() {
            return Err(PyTypeError::new_err(format!(
                "weights: expected a 1-D C-contiguous uint8 array, got {} of shape {:?}",
                w.dtype(),
                w.shape()
            )));
        }
        let len = w.len();
        // SAFETY: the array's data pointer, of `len` bytes (1-D, contiguous, uint8).
        let ptr = unsafe { (*w.as_array_ptr()).data } as usize;
        let model = py
            .detach(|| {
                let lib = Library::open(&out_dir)?;
                // SAFETY: `w` holds the array, and with it the buffer it views, alive until this
                // returns; the library only reads it (copying it to the device).
                let bytes: &[u8] =
                    if len == 0 { &[] } else { unsafe { std::slice::from_raw_parts(ptr as *const u8, len) } };
                Model::create_from_memory(lib, bytes)
            })
            .map_err(err)?;
        Ok(NativeModel { model: Mutex::new(model) })
    }

    /// (device name, the library's description as `describe` returns it).
    fn describe(&self) -> PyResult<(String, Description)> {
        let m = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        Ok((m.device_name(), describe_library(m.library())?))
    }

    /// The shape of input (or output) `index` at `batch`, the run-time dims in `dims` (by name)
    /// at their values and the others at their largest.
    fn shape(&self, output: bool, index: usize, batch: i64, dims: BTreeMap<String, i64>) -> PyResult<Vec<usize>> {
        let m = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        let lib = m.library();
        let n = if output { lib.outputs().len() } else { lib.inputs().len() };
        if index >= n {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!("index {index}: the model has {n}")));
        }
        let values = lib.dims_at(batch, &dims).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let shape = if output { lib.output_shape(index, &values) } else { lib.input_shape(index, &values) };
        shape.map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Runs the model on host arrays, one per input in input order, each C-contiguous and of the
    /// input's dtype (uint16 bits for bfloat16); the run-time dims come from their shapes. The
    /// outputs are written into `outputs` when given (one per output in output order, each
    /// writable, C-contiguous, of the output's dtype and shape at those dims), else into new
    /// arrays. Returns the arrays written, in output order. The library reads the inputs and
    /// writes the outputs in place: no copy on the host.
    #[pyo3(signature = (arrays, outputs=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        arrays: Vec<Bound<'py, PyUntypedArray>>,
        outputs: Option<Vec<Bound<'py, PyUntypedArray>>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut guard = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        let model: &mut Model = &mut guard;
        let lib = model.library();
        if arrays.len() != lib.inputs().len() {
            let names: Vec<&str> = lib.inputs().iter().map(|i| i.name.as_str()).collect();
            return Err(PyTypeError::new_err(format!(
                "{} input(s) given, the model takes {} ({})",
                arrays.len(),
                names.len(),
                names.join(", ")
            )));
        }
        let shapes: Vec<Option<&[usize]>> = arrays.iter().map(|a| Some(a.shape())).collect();
        let dims = lib.infer_dims(&shapes).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let at = lib.dims_text(&dims);
        // What memory safety needs before the pointers go to the library (the Python side checks
        // first, with more advice): every buffer of its tensor's dtype, dense and of its shape
        // at `dims`, and the outputs writable.
        for (i, (a, info)) in arrays.iter().zip(lib.inputs()).enumerate() {
            let want = lib.input_shape(i, &dims).map_err(|e| PyValueError::new_err(e.to_string()))?;
            check_host_buffer(py, a, "input", &info.name, info.dtype, &want, &at)?;
        }
        let outputs = match outputs {
            Some(given) => {
                if given.len() != lib.outputs().len() {
                    return Err(PyTypeError::new_err(format!(
                        "{} output array(s) given, the model has {} outputs",
                        given.len(),
                        lib.outputs().len()
                    )));
                }
                for (i, (a, info)) in given.iter().zip(lib.outputs()).enumerate() {
                    let want = lib.output_shape(i, &dims).map_err(|e| PyValueError::new_err(e.to_string()))?;
                    check_host_buffer(py, a, "output", &info.name, info.dtype, &want, &at)?;
                    if !is_writeable(a)? {
                        return Err(PyValueError::new_err(format!(
                            "output '{}': the array is read-only (out= takes writable arrays)",
                            info.name
                        )));
                    }
                }
                given
            }
            None => lib
                .outputs()
                .iter()
                .enumerate()
                .map(|(i, info)| {
                    let shape = lib.output_shape(i, &dims).map_err(|e| PyValueError::new_err(e.to_string()))?;
                    Ok(zeros(py, info.dtype, &shape))
                })
                .collect::<PyResult<Vec<_>>>()?,
        };
        let data = |a: &Bound<'py, PyUntypedArray>| {
            // SAFETY: a live array's data pointer.
            unsafe { (*a.as_array_ptr()).data as usize }
        };
        let in_ptrs: Vec<usize> = arrays.iter().map(data).collect();
        let out_ptrs: Vec<usize> = outputs.iter().map(data).collect();
        py.detach(|| {
            let ins: Vec<*const std::ffi::c_void> = in_ptrs.iter().map(|&p| p as *const std::ffi::c_void).collect();
            let outs: Vec<*mut std::ffi::c_void> = out_ptrs.iter().map(|&p| p as *mut std::ffi::c_void).collect();
            // SAFETY: every buffer is a live array (held by `arrays` / `outputs`) of its tensor's
            // dtype, C-contiguous and of its shape at `dims` (checked above), the outputs
            // writable; the call is synchronous.
            unsafe { model.run_host_buffers(&dims, &ins, &outs) }
        })
        .map_err(err)?;
        drop(guard);
        PyList::new(py, outputs)
    }

    /// The CUDA device ordinal the model lives on.
    fn device(&self) -> PyResult<i32> {
        let m = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        Ok(m.device())
    }

    /// Runs the model on GPU tensors taken from DLPack capsules (`dlpack_import`), one per input
    /// in input order, each dense row-major, of the input's dtype, on the model's device;
    /// the run-time dims come from their shapes. The kernels are enqueued on `stream` (a CUDA
    /// stream handle, 0 the default stream) and the call returns without waiting. Returns the
    /// outputs as DeviceTensors in device memory allocated through the library, each holding the
    /// inputs until it is freed (see `dlpack::Storage`).
    fn run_device<'py>(
        &self,
        py: Python<'py>,
        inputs: Vec<Bound<'py, Imported>>,
        stream: usize,
    ) -> PyResult<Bound<'py, PyList>> {
        let mut guard = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        let model: &mut Model = &mut guard;
        let lib = Arc::clone(model.library_arc());
        let device = model.device();
        let dims = device_dims(&lib, device, &inputs)?;
        let mut buffers = Vec::with_capacity(lib.outputs().len());
        let mut out_shapes = Vec::with_capacity(lib.outputs().len());
        for (i, info) in lib.outputs().iter().enumerate() {
            let shape = lib.output_shape(i, &dims).map_err(|e| PyValueError::new_err(e.to_string()))?;
            let bytes = shape.iter().product::<usize>() as u64 * info.dtype.size_bytes() as u64;
            // One byte at least: the library refuses a NULL output, which an empty one would get.
            buffers.push(lib.device_alloc(device, bytes.max(1)).map_err(err)?);
            out_shapes.push(shape.iter().map(|&d| d as i64).collect::<Vec<i64>>());
        }
        let in_ptrs: Vec<usize> = inputs.iter().map(|t| t.get().data_ptr).collect();
        let out_ptrs: Vec<usize> = buffers.iter().map(|b| b.ptr() as usize).collect();
        py.detach(|| {
            let ins: Vec<*const std::ffi::c_void> = in_ptrs.iter().map(|&p| p as *const std::ffi::c_void).collect();
            let outs: Vec<*mut std::ffi::c_void> = out_ptrs.iter().map(|&p| p as *mut std::ffi::c_void).collect();
            // SAFETY: every input is a live DLPack tensor of the model's device, dtype and shape
            // at `dims`, dense (checked above), held until the outputs are freed; every output a
            // fresh buffer of its bytes on that device. `stream` is the caller's, of that device.
            unsafe { model.run_device(&dims, &ins, &outs, stream) }
        })
        .map_err(err)?;
        drop(guard);
        let held: Vec<Py<Imported>> = inputs.iter().map(|t| t.clone().unbind()).collect();
        let list = PyList::empty(py);
        for ((buf, shape), info) in buffers.into_iter().zip(out_shapes).zip(lib.outputs()) {
            let storage = Arc::new(Storage { buf, inputs: held.iter().map(|t| t.clone_ref(py)).collect() });
            list.append(DeviceTensor::new(storage, info.dtype, shape, stream, Arc::clone(&lib)))?;
        }
        Ok(list)
    }

    /// `run_device` into the caller's GPU tensors: `outputs` (DLPack capsules taken with
    /// `dlpack_import`, one per output in output order) must each be on the model's device, of
    /// the output's dtype and shape at the run's dims, dense, writable, and overlap no input or
    /// other output. The kernels write them in place, enqueued on `stream`; the call returns
    /// without waiting. The caller's tensors must stay alive until the run is done on `stream`
    /// (the Python side records torch tensors on it); nothing here holds them after the call.
    fn run_device_into(
        &self,
        py: Python<'_>,
        inputs: Vec<Bound<'_, Imported>>,
        outputs: Vec<Bound<'_, Imported>>,
        stream: usize,
    ) -> PyResult<()> {
        let mut guard = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        let model: &mut Model = &mut guard;
        let lib = Arc::clone(model.library_arc());
        let device = model.device();
        let dims = device_dims(&lib, device, &inputs)?;
        if outputs.len() != lib.outputs().len() {
            return Err(PyTypeError::new_err(format!(
                "{} output tensor(s) given, the model has {} outputs",
                outputs.len(),
                lib.outputs().len()
            )));
        }
        let at = lib.dims_text(&dims);
        // (address, bytes, what) of every buffer, for the overlap check.
        let mut extents: Vec<(usize, usize, String)> = Vec::new();
        for (t, info) in inputs.iter().zip(lib.inputs()) {
            let t = t.get();
            let bytes = t.shape_usize().unwrap_or_default().iter().product::<usize>() * info.dtype.size_bytes();
            extents.push((t.data_ptr, bytes, format!("input '{}'", info.name)));
        }
        for (i, (t, info)) in outputs.iter().zip(lib.outputs()).enumerate() {
            let t = t.get();
            let name = &info.name;
            check_device_buffer(t, "output", name, info.dtype, device)?;
            if t.readonly {
                return Err(PyValueError::new_err(format!(
                    "output '{name}': its producer exported it read-only (DLPack's read-only flag)"
                )));
            }
            let want = lib.output_shape(i, &dims).map_err(|e| PyValueError::new_err(e.to_string()))?;
            if t.shape_usize().as_deref() != Some(want.as_slice()) {
                return Err(PyValueError::new_err(format!(
                    "output '{name}' has shape {:?}, the run {at} writes {want:?}",
                    t.shape
                )));
            }
            if t.data_ptr == 0 {
                return Err(PyValueError::new_err(format!("output '{name}' has no memory (a NULL data pointer)")));
            }
            let bytes = want.iter().product::<usize>() * info.dtype.size_bytes();
            for (start, len, other) in &extents {
                if t.data_ptr < start + len && *start < t.data_ptr + bytes {
                    return Err(PyValueError::new_err(format!(
                        "output '{name}' overlaps {other} in memory: the kernels would read or write it while \
                         writing the output; pass separate tensors"
                    )));
                }
            }
            extents.push((t.data_ptr, bytes, format!("output '{name}'")));
        }
        let in_ptrs: Vec<usize> = inputs.iter().map(|t| t.get().data_ptr).collect();
        let out_ptrs: Vec<usize> = outputs.iter().map(|t| t.get().data_ptr).collect();
        py.detach(|| {
            let ins: Vec<*const std::ffi::c_void> = in_ptrs.iter().map(|&p| p as *const std::ffi::c_void).collect();
            let outs: Vec<*mut std::ffi::c_void> = out_ptrs.iter().map(|&p| p as *mut std::ffi::c_void).collect();
            // SAFETY: every input and output is a live DLPack tensor of the model's device,
            // dtype and shape at `dims`, dense, the outputs writable and apart from every other
            // buffer (checked above). `stream` is the caller's, of that device; the caller keeps
            // the tensors until the run is done on it.
            unsafe { model.run_device(&dims, &ins, &outs, stream) }
        })
        .map_err(err)
    }

    /// Makes the stream `waiting` wait (on the device) for the work enqueued on `stream` so far;
    /// both CUDA stream handles of the model's device (0 the legacy default stream).
    fn stream_wait(&self, waiting: usize, stream: usize) -> PyResult<()> {
        let m = self.model.lock().map_err(|_| PyRuntimeError::new_err("the model's lock is poisoned"))?;
        // SAFETY: the Python side passes streams of the model's device.
        unsafe { m.library().stream_wait(m.device(), waiting, stream) }.map_err(err)
    }
}

/// Refuses a GPU tensor that input/output `name` cannot take as it is: what memory safety needs
/// before its pointer goes to the library (the Python side checks first, with more advice).
fn check_device_buffer(t: &Imported, what: &str, name: &str, dtype: DType, device: i32) -> PyResult<()> {
    if t.device != (KDL_CUDA, device) {
        return Err(PyValueError::new_err(format!(
            "{what} '{name}' is on DLPack device {:?}, the model on cuda:{device} ({KDL_CUDA}, {device})",
            t.device
        )));
    }
    if dlpack::imported_dtype(t) != Some(dtype) {
        return Err(PyTypeError::new_err(format!(
            "{what} '{name}' is {}, the model takes {}",
            t.dtype_name(),
            dtype.name()
        )));
    }
    if !t.is_contiguous() {
        return Err(PyValueError::new_err(format!("{what} '{name}' is not contiguous (row-major)")));
    }
    Ok(())
}

/// The run-time dims of a device run on `inputs`, after checking each (device, dtype, dense)
/// and that their shapes are the library's at some run-time dims (so every buffer holds the
/// bytes the kernels read).
fn device_dims(lib: &Library, device: i32, inputs: &[Bound<'_, Imported>]) -> PyResult<Vec<i64>> {
    if inputs.len() != lib.inputs().len() {
        let names: Vec<&str> = lib.inputs().iter().map(|i| i.name.as_str()).collect();
        return Err(PyTypeError::new_err(format!(
            "{} input(s) given, the model takes {} ({})",
            inputs.len(),
            names.len(),
            names.join(", ")
        )));
    }
    let mut shapes = Vec::with_capacity(inputs.len());
    for (t, info) in inputs.iter().zip(lib.inputs()) {
        let t = t.get();
        let name = &info.name;
        check_device_buffer(t, "input", name, info.dtype, device)?;
        shapes
            .push(t.shape_usize().ok_or_else(|| PyValueError::new_err(format!("input '{name}' has a negative dim")))?);
    }
    let given: Vec<Option<&[usize]>> = shapes.iter().map(|s| Some(s.as_slice())).collect();
    lib.infer_dims(&given).map_err(|e| PyValueError::new_err(e.to_string()))
}

#[pymodule]
fn _onnx2ait(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("Error", m.py().get_type::<Error>())?;
    m.add("DEFAULT_MAX_BATCH", onnx2ait::compile::DEFAULT_MAX_BATCH)?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(compile, m)?)?;
    m.add_function(wrap_pyfunction!(describe, m)?)?;
    m.add_class::<NativeModel>()?;
    m.add_class::<Imported>()?;
    m.add_class::<DeviceTensor>()?;
    m.add_function(wrap_pyfunction!(dlpack::dlpack_import, m)?)?;
    Ok(())
}
