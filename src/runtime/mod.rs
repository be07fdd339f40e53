//! Loading and running a built model: `OUT/libmodel.so` through its C API (`OUT/model.h`,
//! rendered from `templates/<target>/model.h.hbs`).
//!
//! [`Library::open`] loads the shared library and reads what the model looks like (input and
//! output names, dtypes, shapes at given run-time dims, the dims' ranges); that needs no GPU. [`Model::create`]
//! instantiates it on the current device (arena, workspace, weights) and runs it on host tensors
//! ([`Model::run_host`]), times it ([`Model::bench`]) or times each of its kernels
//! ([`Model::kernel_times`]).
//!
//! Every failure of the library comes back as an error carrying the library's own message
//! (`o2a_last_error`), which names the model and, for a kernel, the kernel and its graph node.
//! On a machine without a usable GPU, creating a model fails with the target's "no … device: …"
//! message (the CUDA target's: "no CUDA device: …").
//!
//! Nothing here is specific to one GPU target: the C API is the same for every target.
//!
//! The library is opened with `RTLD_LOCAL` (libraries built without `--symbol-prefix` export
//! the same `o2a_*` names, so several can be loaded side by side) and `RTLD_NOW` (a library
//! missing a symbol fails to load, rather than at the first call). A library exports only its C
//! API (a linker version script keeps its kernels' symbols local), so two libraries never bind
//! to each other's internals. A library built with `--symbol-prefix NAME` exports `NAME_o2a_*`:
//! the prefix is read from `OUT/build.json`.
//!
//! Device buffers: [`Model::run_device`] runs the model on the caller's device memory on the
//! caller's stream, and [`DeviceBuffer`] is device memory from the library's own GPU runtime
//! (for callers without one, as the Python package).

use crate::error::{Error, Result};
use crate::ir::dim::fmt_shape;
use crate::ir::{DType, Dim, Tensor};
pub use crate::lower::RunDim;
use half::{bf16, f16};
use ndarray::{ArrayD, IxDyn};
use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

pub mod profiler;

#[cfg(test)]
mod tests;

/// The library file in the output folder.
pub const LIB_NAME: &str = "libmodel.so";

/// The C API version this runtime speaks (`O2A_ABI_VERSION` of model.h).
/// Version 2 added the kernel list and per-kernel timing (`o2a_num_kernels`, `o2a_kernel_name`,
/// `o2a_kernel_node`, `o2a_kernel_times`); version 3 the build hash (`o2a_build_hash`,
/// `O2A_BUILD_HASH`, the trailer of `weights.bin`); version 5 run-time dims (`o2a_num_dims`,
/// `o2a_dim_name`, `o2a_dim_min`, `o2a_dim_max`, `o2a_batch_dim`, and a `dims` array instead of a
/// batch in every call that runs or shapes); version 6 device memory and stream order for hosts
/// without a GPU runtime (`o2a_device`, `o2a_device_alloc`, `o2a_device_free`, `o2a_stream_wait`).
pub const ABI_VERSION: i32 = 6;

/// Status codes of the C API (the `O2A_ERR_*` of model.h / common.cuh).
fn status_name(code: c_int) -> &'static str {
    match code {
        0 => "ok",
        1 => "invalid argument",
        2 => "GPU runtime error",
        3 => "unsupported",
        4 => "I/O error",
        5 => "out of memory",
        _ => "unknown status",
    }
}

type FnVersion = unsafe extern "C" fn() -> c_int;
type FnBuildHash = unsafe extern "C" fn() -> *const c_char;
type FnCreate = unsafe extern "C" fn(*const c_char, *mut *mut c_void) -> c_int;
type FnCreateFromMemory = unsafe extern "C" fn(*const c_void, u64, *mut *mut c_void) -> c_int;
type FnDestroy = unsafe extern "C" fn(*mut c_void);
type FnLastError = unsafe extern "C" fn() -> *const c_char;
type FnModelStr = unsafe extern "C" fn(*const c_void) -> *const c_char;
type FnModelInt = unsafe extern "C" fn(*const c_void) -> c_int;
type FnIndexStr = unsafe extern "C" fn(*const c_void, c_int) -> *const c_char;
type FnIndexInt = unsafe extern "C" fn(*const c_void, c_int) -> c_int;
type FnIndexI64 = unsafe extern "C" fn(*const c_void, c_int) -> i64;
type FnShape = unsafe extern "C" fn(*const c_void, c_int, *const i64, *mut i64) -> c_int;
type FnRunHost = unsafe extern "C" fn(*mut c_void, *const i64, *const *const c_void, *const *mut c_void) -> c_int;
type FnBench = unsafe extern "C" fn(*mut c_void, *const i64, c_int, c_int, c_int, *mut f32) -> c_int;
type FnKernelTimes = unsafe extern "C" fn(*mut c_void, *const i64, c_int, c_int, *mut f32) -> c_int;
type FnRun =
    unsafe extern "C" fn(*mut c_void, *const i64, *const *const c_void, *const *mut c_void, *mut c_void) -> c_int;
type FnDeviceAlloc = unsafe extern "C" fn(c_int, u64, *mut *mut c_void) -> c_int;
type FnDeviceFree = unsafe extern "C" fn(c_int, *mut c_void) -> c_int;
type FnStreamWait = unsafe extern "C" fn(c_int, *mut c_void, *mut c_void) -> c_int;

/// The C API's entry points, resolved once. Valid while the `libloading::Library` they come
/// from is loaded (the owning [`Library`] keeps it).
struct Api {
    create: FnCreate,
    create_from_memory: FnCreateFromMemory,
    destroy: FnDestroy,
    last_error: FnLastError,
    model_name: FnModelStr,
    device_name: FnModelStr,
    num_inputs: FnModelInt,
    num_outputs: FnModelInt,
    input_name: FnIndexStr,
    output_name: FnIndexStr,
    input_dtype: FnIndexInt,
    output_dtype: FnIndexInt,
    input_rank: FnIndexInt,
    output_rank: FnIndexInt,
    input_shape: FnShape,
    output_shape: FnShape,
    num_dims: FnModelInt,
    dim_name: FnIndexStr,
    dim_min: FnIndexI64,
    dim_max: FnIndexI64,
    batch_dim: FnModelInt,
    run: FnRun,
    run_host: FnRunHost,
    bench: FnBench,
    num_kernels: FnModelInt,
    kernel_name: FnIndexStr,
    kernel_node: FnIndexStr,
    kernel_times: FnKernelTimes,
    device: FnModelInt,
    device_alloc: FnDeviceAlloc,
    device_free: FnDeviceFree,
    stream_wait: FnStreamWait,
}

/// A graph input or output as the library describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct IoInfo {
    pub name: String,
    /// The ONNX dtype of the caller's buffer.
    pub dtype: DType,
    pub rank: usize,
}

/// A kernel of the run sequence as the library describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelInfo {
    /// "k012_conv2d_library": its position in the run sequence and its template.
    pub name: String,
    /// The graph node(s) it computes, comma-separated when several were fused.
    pub node: String,
    /// What one launch computes and moves, from `OUT/build.json` (`None` for a build without
    /// it: one made before the field, or a library read without its build.json).
    pub work: Option<KernelWork>,
}

/// A kernel's work per launch as polynomials in the run-time dims: build.json's `work`
/// (`Dim::to_terms_json`), counted as `crate::lower::Program::kernel_work` documents: flops
/// with a multiply-add as 2 (zero where the kernel's arithmetic is not counted), bytes the
/// minimum traffic (each distinct tensor argument read or written once).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelWork {
    pub flops: Dim,
    pub bytes: Dim,
}

/// A kernel's work at given run-time dim values ([`Library::kernel_work_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkAt {
    /// Floating-point operations of one launch; 0 where none are counted.
    pub flops: i64,
    /// Minimum bytes one launch reads and writes.
    pub bytes: i64,
}

/// A loaded model library: its entry points and its interface.
pub struct Library {
    dir: PathBuf,
    path: PathBuf,
    /// `--symbol-prefix` with its `_` ("resnet_"), empty without one.
    prefix: String,
    api: Api,
    model_name: String,
    inputs: Vec<IoInfo>,
    outputs: Vec<IoInfo>,
    /// The dims the caller picks at each run, in the order the C API takes their values.
    dims: Vec<RunDim>,
    /// Which of `dims` is the batch.
    batch_dim: Option<usize>,
    /// The run sequence, in launch order.
    kernels: Vec<KernelInfo>,
    // Dropped last: the function pointers in `api` point into it.
    _lib: libloading::Library,
}

/// Opens a library private to this handle, resolving every symbol now.
///
/// # Safety
/// Loading runs the library's initialisers; the caller vouches for the file.
unsafe fn load_local(path: &Path) -> std::result::Result<libloading::Library, libloading::Error> {
    #[cfg(unix)]
    {
        use libloading::os::unix::{Library as UnixLibrary, RTLD_LOCAL, RTLD_NOW};
        UnixLibrary::open(Some(path), RTLD_NOW | RTLD_LOCAL).map(Into::into)
    }
    #[cfg(not(unix))]
    {
        libloading::Library::new(path)
    }
}

/// Copies one entry point out of the library: `name` (`o2a_create`) with the library's
/// `--symbol-prefix` (`prefix`, "resnet_" or "").
///
/// # Safety
/// `T` must be the function type the C API declares for `name`.
unsafe fn symbol<T: Copy>(lib: &libloading::Library, prefix: &str, name: &str, path: &Path) -> Result<T> {
    let cname = format!("{prefix}{name}\0");
    match lib.get::<T>(cname.as_bytes()) {
        Ok(s) => Ok(*s),
        Err(e) => Err(Error::Other(format!(
            "{}: not an onnx2ait model library, or one built by another version (missing {prefix}{name}: {e}); \
             build it again with `onnx2ait MODEL -o OUT`",
            path.display()
        ))),
    }
}

/// The `--symbol-prefix` a build's C API names start with, with its `_` ("resnet_"; "" for none),
/// from `OUT/build.json` (no build.json, or one without the field: none).
fn symbol_prefix(dir: &Path) -> Result<String> {
    let path = dir.join("build.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => return Err(Error::Other(format!("{}: cannot read: {e}", path.display()))),
    };
    let meta: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| Error::Other(format!("{}: not the build.json of onnx2ait: {e}", path.display())))?;
    match &meta["symbol_prefix"] {
        serde_json::Value::Null => Ok(String::new()),
        serde_json::Value::String(p) if crate::codegen::check_symbol_prefix(p).is_ok() => Ok(format!("{p}_")),
        other => Err(Error::Other(format!("{}: symbol_prefix {other} is not a valid prefix", path.display()))),
    }
}

/// The compile option that set each run-time dim's range (`--max-batch 64`, `--dim batch=4..64`),
/// by symbol, from `OUT/build.json`'s `run_dims` (none when it is missing or predates the field:
/// messages then name every option that can set the range, see [`RunDim::set_by`]).
fn dim_options(dir: &Path) -> BTreeMap<String, String> {
    let meta: Option<serde_json::Value> =
        std::fs::read_to_string(dir.join("build.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    let dims = meta.as_ref().and_then(|m| m["run_dims"].as_array().cloned()).unwrap_or_default();
    dims.iter().filter_map(|d| Some((d["symbol"].as_str()?.to_string(), d["option"].as_str()?.to_string()))).collect()
}

/// Each kernel's work by kernel name, from `OUT/build.json`'s `kernels[].work` (see
/// [`KernelWork`]). Advisory, as the dims' options: a missing build.json, a build from before
/// the field, or an entry that is not two polynomials leaves those kernels without work, which
/// reports then print as unknown rather than failing the run.
fn kernel_work(dir: &Path) -> BTreeMap<String, KernelWork> {
    let meta: Option<serde_json::Value> =
        std::fs::read_to_string(dir.join("build.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    let kernels = meta.as_ref().and_then(|m| m["kernels"].as_array().cloned()).unwrap_or_default();
    kernels
        .iter()
        .filter_map(|k| {
            let work = &k["work"];
            let flops = Dim::from_terms_json(&work["flops"])?;
            let bytes = Dim::from_terms_json(&work["bytes"])?;
            Some((k["name"].as_str()?.to_string(), KernelWork { flops, bytes }))
        })
        .collect()
}

/// Refuses a library beside the header, weights or manifest of another build: `model.h`'s
/// `O2A_BUILD_HASH`, the trailer of `weights.bin` and the manifest's hash (each when present) must
/// be the library's `build_hash`.
fn check_same_build(dir: &Path, prefix: &str, build_hash: &str) -> Result<()> {
    let hash_macro = format!("#define {}O2A_BUILD_HASH", prefix.to_ascii_uppercase());
    let mixed = |what: &str, theirs: &str| {
        Error::Other(format!(
            "{}: {LIB_NAME} is build {build_hash} but {what} is {theirs}: the folder mixes two builds; \
             compile the model again (`onnx2ait MODEL -o OUT`)",
            dir.display()
        ))
    };
    if let Ok(header) = std::fs::read_to_string(dir.join("model.h")) {
        let found = header.lines().find_map(|l| {
            let rest = l.trim().strip_prefix(hash_macro.as_str())?.trim();
            Some(rest.trim_matches('"').to_string())
        });
        match found {
            Some(h) if h == build_hash => {}
            Some(h) => return Err(mixed("the model.h next to it", &format!("build {h}"))),
            None => return Err(mixed("the model.h next to it", "of an onnx2ait without build hashes")),
        }
    }
    let weights = dir.join("weights.bin");
    if let Ok(mut f) = std::fs::File::open(&weights) {
        use std::io::{Read, Seek, SeekFrom};
        let n = crate::codegen::WEIGHTS_TRAILER_BYTES;
        let mut tail = vec![0u8; n];
        let read = f.seek(SeekFrom::End(-(n as i64))).and_then(|_| f.read_exact(&mut tail));
        if read.is_err() || tail != crate::codegen::weights_trailer(build_hash).as_bytes() {
            let theirs = String::from_utf8_lossy(&tail);
            let theirs = match theirs.trim_end().strip_prefix(crate::codegen::WEIGHTS_TRAILER_PREFIX) {
                Some(h) if read.is_ok() => format!("build {h}"),
                _ => "of another build".to_string(),
            };
            return Err(mixed("the weights.bin next to it", &theirs));
        }
    }
    if let Some(m) = crate::codegen::outdir::Manifest::read(dir)? {
        if m.library.is_none() || m.build_hash != build_hash {
            let theirs = if m.build_hash.is_empty() {
                "being rewritten".to_string()
            } else if m.library.is_none() {
                format!("build {} without a library", m.build_hash)
            } else {
                format!("build {}", m.build_hash)
            };
            return Err(mixed(&format!("the output ({})", crate::codegen::outdir::MANIFEST), &theirs));
        }
    }
    Ok(())
}

/// A C string from the library as a Rust string (`None` for NULL).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that stays valid for the call.
unsafe fn c_str(p: *const c_char) -> Option<String> {
    (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
}

impl Library {
    /// Loads `OUT/libmodel.so` and reads the model's interface. Needs no GPU.
    ///
    /// The library is trusted: it is the output of `onnx2ait MODEL -o OUT`, and loading it runs
    /// its initialisers (those of the GPU runtime, linked statically).
    pub fn open(dir: &Path) -> Result<Library> {
        if !dir.exists() {
            return Err(Error::Other(format!(
                "{}: no such directory (expected the output folder of `onnx2ait MODEL -o OUT`)",
                dir.display()
            )));
        }
        if !dir.is_dir() {
            return Err(Error::Other(format!(
                "{}: not a directory (expected the output folder of `onnx2ait MODEL -o OUT`)",
                dir.display()
            )));
        }
        let path = dir.join(LIB_NAME);
        if !path.is_file() {
            let hint = if crate::build::written_without_build(dir) {
                "the library was not built: the folder was written with --no-build (sources only); \
                 run `onnx2ait MODEL -o OUT` without --no-build to build it"
            } else if dir.join("model.cu").is_file() {
                "the sources are there but the library was not built; run `onnx2ait MODEL -o OUT` again \
                 where nvcc is available (its error says what is missing)"
            } else {
                "build the model first: `onnx2ait MODEL -o OUT`"
            };
            return Err(Error::Other(format!("{}: not found; {hint}", path.display())));
        }
        let prefix = symbol_prefix(dir)?;
        // SAFETY: the library is onnx2ait's own output (see the doc comment); its initialisers
        // are those of the statically linked GPU runtime.
        let lib =
            unsafe { load_local(&path) }.map_err(|e| Error::Other(format!("cannot load {}: {e}", path.display())))?;
        // SAFETY: each type below is the signature model.h declares for that name.
        let version: FnVersion = unsafe { symbol(&lib, &prefix, "o2a_abi_version", &path)? };
        let abi = unsafe { version() };
        if abi != ABI_VERSION {
            return Err(Error::Other(format!(
                "{}: the library implements C API version {abi}, this onnx2ait reads version {ABI_VERSION}; \
                 build it again with this onnx2ait",
                path.display()
            )));
        }
        // SAFETY: o2a_build_hash returns a static string.
        let build_hash: FnBuildHash = unsafe { symbol(&lib, &prefix, "o2a_build_hash", &path)? };
        let build_hash = unsafe { c_str(build_hash()) }.unwrap_or_default();
        check_same_build(dir, &prefix, &build_hash)?;
        let api = unsafe {
            Api {
                create: symbol(&lib, &prefix, "o2a_create", &path)?,
                create_from_memory: symbol(&lib, &prefix, "o2a_create_from_memory", &path)?,
                destroy: symbol(&lib, &prefix, "o2a_destroy", &path)?,
                last_error: symbol(&lib, &prefix, "o2a_last_error", &path)?,
                model_name: symbol(&lib, &prefix, "o2a_model_name", &path)?,
                device_name: symbol(&lib, &prefix, "o2a_device_name", &path)?,
                num_inputs: symbol(&lib, &prefix, "o2a_num_inputs", &path)?,
                num_outputs: symbol(&lib, &prefix, "o2a_num_outputs", &path)?,
                input_name: symbol(&lib, &prefix, "o2a_input_name", &path)?,
                output_name: symbol(&lib, &prefix, "o2a_output_name", &path)?,
                input_dtype: symbol(&lib, &prefix, "o2a_input_dtype", &path)?,
                output_dtype: symbol(&lib, &prefix, "o2a_output_dtype", &path)?,
                input_rank: symbol(&lib, &prefix, "o2a_input_rank", &path)?,
                output_rank: symbol(&lib, &prefix, "o2a_output_rank", &path)?,
                input_shape: symbol(&lib, &prefix, "o2a_input_shape", &path)?,
                output_shape: symbol(&lib, &prefix, "o2a_output_shape", &path)?,
                num_dims: symbol(&lib, &prefix, "o2a_num_dims", &path)?,
                dim_name: symbol(&lib, &prefix, "o2a_dim_name", &path)?,
                dim_min: symbol(&lib, &prefix, "o2a_dim_min", &path)?,
                dim_max: symbol(&lib, &prefix, "o2a_dim_max", &path)?,
                batch_dim: symbol(&lib, &prefix, "o2a_batch_dim", &path)?,
                run: symbol(&lib, &prefix, "o2a_run", &path)?,
                run_host: symbol(&lib, &prefix, "o2a_run_host", &path)?,
                bench: symbol(&lib, &prefix, "o2a_bench", &path)?,
                num_kernels: symbol(&lib, &prefix, "o2a_num_kernels", &path)?,
                kernel_name: symbol(&lib, &prefix, "o2a_kernel_name", &path)?,
                kernel_node: symbol(&lib, &prefix, "o2a_kernel_node", &path)?,
                kernel_times: symbol(&lib, &prefix, "o2a_kernel_times", &path)?,
                device: symbol(&lib, &prefix, "o2a_device", &path)?,
                device_alloc: symbol(&lib, &prefix, "o2a_device_alloc", &path)?,
                device_free: symbol(&lib, &prefix, "o2a_device_free", &path)?,
                stream_wait: symbol(&lib, &prefix, "o2a_stream_wait", &path)?,
            }
        };
        let mut library = Library {
            dir: dir.to_path_buf(),
            path,
            prefix,
            api,
            model_name: String::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            dims: Vec::new(),
            batch_dim: None,
            kernels: Vec::new(),
            _lib: lib,
        };
        library.read_interface()?;
        Ok(library)
    }

    /// Reads names, dtypes, ranks, the run-time dims and the kernel list through the metadata
    /// functions, which accept a NULL model.
    fn read_interface(&mut self) -> Result<()> {
        let null = std::ptr::null();
        let api = &self.api;
        // SAFETY: metadata functions take a NULL model (model.h) and return static strings;
        // indices are within the count the library reports.
        let (n, batch) = unsafe {
            self.model_name = c_str((api.model_name)(null)).unwrap_or_default();
            ((api.num_dims)(null), (api.batch_dim)(null))
        };
        let options = dim_options(&self.dir);
        let mut dims = Vec::new();
        for i in 0..n.max(0) {
            let (name, min, max) =
                unsafe { (c_str((api.dim_name)(null, i)), (api.dim_min)(null, i), (api.dim_max)(null, i)) };
            let name = name.ok_or_else(|| self.corrupt(&format!("run-time dim {i} has no name")))?;
            if min < 1 || min > max {
                return Err(self.corrupt(&format!("run-time dim '{name}' runs from {min} to {max}")));
            }
            // The option that set the range comes from build.json (the C API has only the range).
            let option = options.get(&name).cloned().unwrap_or_default();
            dims.push(RunDim { symbol: name, min, max, option });
        }
        if n < 0 || batch < -1 || batch >= n.max(0) {
            return Err(self.corrupt(&format!("{n} run-time dims, the batch being dim {batch}")));
        }
        self.dims = dims;
        self.batch_dim = usize::try_from(batch).ok();
        let read = |output: bool| -> Result<Vec<IoInfo>> {
            let what = if output { "output" } else { "input" };
            // SAFETY: as above; indices are within the counts the library reports.
            let n = unsafe {
                if output {
                    (api.num_outputs)(null)
                } else {
                    (api.num_inputs)(null)
                }
            };
            let mut v = Vec::with_capacity(n.max(0) as usize);
            for i in 0..n.max(0) {
                let (name, code, rank) = unsafe {
                    if output {
                        ((api.output_name)(null, i), (api.output_dtype)(null, i), (api.output_rank)(null, i))
                    } else {
                        ((api.input_name)(null, i), (api.input_dtype)(null, i), (api.input_rank)(null, i))
                    }
                };
                let name = unsafe { c_str(name) }.ok_or_else(|| self.corrupt(&format!("{what} {i} has no name")))?;
                let dtype = DType::from_onnx(code).ok_or_else(|| {
                    self.corrupt(&format!(
                        "{what} '{name}' has ONNX dtype code {code} ({})",
                        DType::onnx_code_name(code)
                    ))
                })?;
                let rank =
                    usize::try_from(rank).map_err(|_| self.corrupt(&format!("{what} '{name}' has rank {rank}")))?;
                v.push(IoInfo { name, dtype, rank });
            }
            Ok(v)
        };
        let (inputs, outputs) = (read(false)?, read(true)?);
        self.inputs = inputs;
        self.outputs = outputs;
        self.kernels = self.read_kernels()?;
        let mut work = kernel_work(&self.dir);
        for k in &mut self.kernels {
            k.work = work.remove(&k.name);
        }
        Ok(())
    }

    fn read_kernels(&self) -> Result<Vec<KernelInfo>> {
        let null = std::ptr::null();
        let api = &self.api;
        // SAFETY: metadata functions take a NULL model and return static strings; indices are
        // within the count the library reports.
        let n = unsafe { (api.num_kernels)(null) };
        let n = usize::try_from(n).map_err(|_| self.corrupt(&format!("it has {n} kernels")))?;
        (0..n)
            .map(|k| {
                let index = c_int::try_from(k).map_err(|_| self.corrupt("too many kernels"))?;
                let (name, node) =
                    unsafe { (c_str((api.kernel_name)(null, index)), c_str((api.kernel_node)(null, index))) };
                match (name, node) {
                    (Some(name), Some(node)) => Ok(KernelInfo { name, node, work: None }),
                    _ => Err(self.corrupt(&format!("kernel {k} of {n} has no name or node"))),
                }
            })
            .collect()
    }

    fn corrupt(&self, what: &str) -> Error {
        Error::Other(format!("{}: the library describes an impossible model: {what}", self.path.display()))
    }

    /// The output folder the library was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `OUT/libmodel.so`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The build's `--symbol-prefix` (its C API is `<prefix>_o2a_*`); `None`: `o2a_*`.
    pub fn symbol_prefix(&self) -> Option<&str> {
        self.prefix.strip_suffix('_')
    }

    /// Allocates `bytes` of device memory on GPU `device` through the library's GPU runtime,
    /// freed when the buffer drops (which keeps the library loaded until then).
    pub fn device_alloc(self: &Arc<Self>, device: i32, bytes: u64) -> Result<DeviceBuffer> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` receives the allocation (NULL for 0 bytes).
        let rc = unsafe { (self.api.device_alloc)(device, bytes, &mut ptr) };
        if rc != 0 {
            return Err(self.call_error(&format!("allocating {bytes} bytes on GPU {device}"), rc));
        }
        Ok(DeviceBuffer { ptr, bytes, device, lib: Arc::clone(self) })
    }

    /// Makes stream `waiting` of GPU `device` wait, on the device, for the work enqueued on
    /// `stream` so far (handles as the GPU runtime takes them; 0 is the default stream).
    ///
    /// # Safety
    /// Both must be streams of that device's current context (or 0, or the runtime's special
    /// handles 1 and 2: the legacy and the per-thread default stream).
    pub unsafe fn stream_wait(&self, device: i32, waiting: usize, stream: usize) -> Result<()> {
        let rc = (self.api.stream_wait)(device, waiting as *mut c_void, stream as *mut c_void);
        if rc != 0 {
            return Err(self.call_error("ordering two streams", rc));
        }
        Ok(())
    }

    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    pub fn inputs(&self) -> &[IoInfo] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[IoInfo] {
        &self.outputs
    }

    /// The dims the caller picks at each run (empty for fixed shapes), in the order every call
    /// taking `dims` reads their values.
    pub fn run_dims(&self) -> &[RunDim] {
        &self.dims
    }

    /// Which of [`run_dims`](Self::run_dims) is the batch.
    pub fn batch_dim(&self) -> Option<usize> {
        self.batch_dim
    }

    /// Whether the model has a run-time batch dim (else the batch is 1).
    pub fn has_batch(&self) -> bool {
        self.batch_dim.is_some()
    }

    /// The ONNX name of the batch dim (`N`, `batch_size`).
    pub fn batch_symbol(&self) -> Option<&str> {
        self.batch_dim.map(|b| self.dims[b].symbol.as_str())
    }

    /// The largest batch the model runs (1 without a batch dim).
    pub fn max_batch(&self) -> i64 {
        self.batch_dim.map_or(1, |b| self.dims[b].max)
    }

    /// The kernels of the run sequence, in launch order.
    pub fn kernels(&self) -> &[KernelInfo] {
        &self.kernels
    }

    /// The work of kernel `k` at the run-time dim values `dims` (in [`run_dims`](Self::run_dims)
    /// order): `None` past the last kernel, when the build states no work for it, or when its
    /// polynomials name a dim this library does not have (a build.json of another build).
    pub fn kernel_work_at(&self, k: usize, dims: &[i64]) -> Option<WorkAt> {
        let work = self.kernels.get(k)?.work.as_ref()?;
        let env: BTreeMap<String, i64> = self.dims.iter().map(|d| d.symbol.clone()).zip(dims.iter().copied()).collect();
        let at = |d: &Dim| d.eval(&env).as_known();
        Some(WorkAt { flops: at(&work.flops)?, bytes: at(&work.bytes)? })
    }

    pub fn num_kernels(&self) -> usize {
        self.kernels.len()
    }

    /// The name of kernel `k` ("k012_conv2d_library"); `None` past the last kernel.
    pub fn kernel_name(&self, k: usize) -> Option<&str> {
        self.kernels.get(k).map(|i| i.name.as_str())
    }

    /// The graph node(s) kernel `k` computes; `None` past the last kernel.
    pub fn kernel_node(&self, k: usize) -> Option<&str> {
        self.kernels.get(k).map(|i| i.node.as_str())
    }

    /// The calling thread's last error message of the library.
    fn last_error(&self) -> String {
        // SAFETY: o2a_last_error returns a thread-local NUL-terminated buffer.
        unsafe { c_str((self.api.last_error)()) }.unwrap_or_default()
    }

    /// An error for a failed call, with the library's message.
    fn call_error(&self, what: &str, code: c_int) -> Error {
        let msg = self.last_error();
        let msg = if msg.is_empty() { format!("{} (status {code})", status_name(code)) } else { msg };
        Error::Other(format!("{}: {what}: {msg}", self.dir.display()))
    }

    /// Fails unless `batch` is one the model runs.
    pub fn check_batch(&self, batch: i64) -> Result<()> {
        let (lo, hi) = self.batch_dim.map_or((1, 1), |b| (self.dims[b].min, self.dims[b].max));
        if (lo..=hi).contains(&batch) {
            return Ok(());
        }
        Err(Error::Other(if let Some(d) = self.batch_dim.map(|b| &self.dims[b]) {
            format!(
                "{}: batch {batch} is out of range: the model runs batches {lo} to {hi} (set at compile time with {}; compile again with a range that holds {batch})",
                self.dir.display(),
                d.set_by(true)
            )
        } else {
            format!("{}: batch {batch}: the model has no run-time batch dim, so the batch is 1", self.dir.display())
        }))
    }

    /// [`Library::check_dims`], and that `inputs` / `outputs` buffers are one per model input /
    /// output (the caller-buffer runs, [`Model::run_device`] and [`Model::run_host_buffers`]).
    fn check_buffers(&self, dims: &[i64], inputs: usize, outputs: usize) -> Result<()> {
        self.check_dims(dims)?;
        if inputs != self.inputs.len() || outputs != self.outputs.len() {
            return Err(Error::Other(format!(
                "{}: {} input and {} output buffer(s) given, the model has {} and {}",
                self.dir.display(),
                inputs,
                outputs,
                self.inputs.len(),
                self.outputs.len()
            )));
        }
        Ok(())
    }

    /// Fails unless `dims` holds one value per run-time dim, each within its range.
    pub fn check_dims(&self, dims: &[i64]) -> Result<()> {
        if dims.len() != self.dims.len() {
            return Err(Error::Other(format!(
                "{}: {} run-time dim value(s) given, the model has {} ({})",
                self.dir.display(),
                dims.len(),
                self.dims.len(),
                self.dims_list()
            )));
        }
        for (d, &v) in self.dims.iter().zip(dims) {
            if !(d.min..=d.max).contains(&v) {
                return Err(Error::Other(format!(
                    "{}: dim '{}' = {v} is out of range: the build runs {} to {} (set at compile time with {})",
                    self.dir.display(),
                    d.symbol,
                    d.min,
                    d.max,
                    d.set_by(Some(d) == self.batch_dim.map(|b| &self.dims[b]))
                )));
            }
        }
        Ok(())
    }

    /// "at batch 8" / "at batch=8, seq=77" / "" (fixed shapes): run-time dim values, for messages.
    pub fn dims_text(&self, dims: &[i64]) -> String {
        match (self.dims.as_slice(), dims) {
            ([], _) => "(fixed shapes)".into(),
            ([_], [v]) if self.batch_dim == Some(0) => format!("at batch {v}"),
            _ => {
                let v: Vec<String> = self.dims.iter().zip(dims).map(|(d, v)| format!("{}={v}", d.symbol)).collect();
                format!("at {}", v.join(", "))
            }
        }
    }

    /// The run-time dims as `name min..max`, for messages.
    fn dims_list(&self) -> String {
        if self.dims.is_empty() {
            return "none: its shapes are fixed".into();
        }
        self.dims.iter().map(|d| format!("{} {}..{}", d.symbol, d.min, d.max)).collect::<Vec<_>>().join(", ")
    }

    /// The run-time dim values for a run at `batch` with the dims named in `named` (by their
    /// ONNX names) and every other dim at its largest value. A name that is not a run-time dim,
    /// or a value out of its range, is an error.
    pub fn dims_at(&self, batch: i64, named: &std::collections::BTreeMap<String, i64>) -> Result<Vec<i64>> {
        self.check_batch(batch)?;
        let mut v: Vec<i64> = self.dims.iter().map(|d| d.max).collect();
        if let Some(b) = self.batch_dim {
            v[b] = batch;
        }
        for (name, &value) in named {
            let Some(i) = self.dims.iter().position(|d| &d.symbol == name) else {
                return Err(Error::Other(format!(
                    "{}: --dim {name}={value}: '{name}' is not a run-time dim of this build (its run-time dims: {})",
                    self.dir.display(),
                    self.dims_list()
                )));
            };
            v[i] = value;
        }
        self.check_dims(&v)?;
        Ok(v)
    }

    fn shape(&self, output: bool, i: usize, dims: &[i64]) -> Result<Vec<usize>> {
        self.check_dims(dims)?;
        let info = if output { &self.outputs[i] } else { &self.inputs[i] };
        let mut shape = vec![0i64; info.rank];
        let index = c_int::try_from(i).map_err(|_| self.corrupt("too many inputs or outputs"))?;
        let f = if output { self.api.output_shape } else { self.api.input_shape };
        // SAFETY: `dims` holds one value per run-time dim (checked above), `shape` `rank`
        // elements, as many as the function reads and writes.
        let rc = unsafe { f(std::ptr::null(), index, dims.as_ptr(), shape.as_mut_ptr()) };
        if rc != 0 {
            return Err(self.call_error("reading a shape", rc));
        }
        shape
            .iter()
            .map(|&d| {
                usize::try_from(d)
                    .map_err(|_| self.corrupt(&format!("'{}' has dim {d} at run-time dims {dims:?}", info.name)))
            })
            .collect()
    }

    /// The shape of input `i` at the run-time dims `dims`.
    pub fn input_shape(&self, i: usize, dims: &[i64]) -> Result<Vec<usize>> {
        self.shape(false, i, dims)
    }

    /// The shape of output `i` at the run-time dims `dims`.
    pub fn output_shape(&self, i: usize, dims: &[i64]) -> Result<Vec<usize>> {
        self.shape(true, i, dims)
    }

    /// Every run-time dim at its smallest value.
    pub fn min_dims(&self) -> Vec<i64> {
        self.dims.iter().map(|d| d.min).collect()
    }

    /// The run-time dims at which the inputs have `shapes` (in input order; `None`: any shape,
    /// the input is made to fit). Each dim is read from an input axis that follows it one to one
    /// (found by comparing the shapes at the smallest dims with those with that dim one larger);
    /// a dim no given shape shows takes its smallest value. The inputs' shapes at the dims found
    /// must then equal the given ones exactly.
    pub fn infer_dims(&self, shapes: &[Option<&[usize]>]) -> Result<Vec<i64>> {
        if shapes.len() != self.inputs.len() {
            return Err(Error::Other(format!(
                "{}: {} input shape(s) given, the model has {} input(s)",
                self.dir.display(),
                shapes.len(),
                self.inputs.len()
            )));
        }
        let base = self.min_dims();
        let at_base: Vec<Vec<usize>> = (0..shapes.len()).map(|i| self.input_shape(i, &base)).collect::<Result<_>>()?;
        let mut dims = base.clone();
        for (j, d) in self.dims.iter().enumerate() {
            if d.max == d.min {
                continue;
            }
            let mut bumped = base.clone();
            bumped[j] += 1;
            // The first (input, axis) that grows by exactly one when dim j does.
            let mut found = None;
            'inputs: for (i, s) in shapes.iter().enumerate() {
                let Some(s) = s else { continue };
                let next = self.input_shape(i, &bumped)?;
                for (a, (&b0, &b1)) in at_base[i].iter().zip(&next).enumerate() {
                    if b1 == b0 + 1 && a < s.len() {
                        found = Some((s[a] as i64) - (b0 as i64) + d.min);
                        break 'inputs;
                    }
                }
            }
            if let Some(v) = found {
                dims[j] = v;
            }
        }
        let fits = self.check_dims(&dims).is_ok()
            && shapes
                .iter()
                .enumerate()
                .all(|(i, s)| s.is_none_or(|s| self.input_shape(i, &dims).is_ok_and(|w| w.as_slice() == s)));
        if fits {
            return Ok(dims);
        }
        let mut lines = Vec::new();
        for (i, (info, s)) in self.inputs.iter().zip(shapes).enumerate() {
            let Some(s) = s else { continue };
            lines.push(format!("'{}' {} (at the smallest dims: {})", info.name, dims_text(s), dims_text(&at_base[i])));
        }
        Err(Error::Other(format!(
            "{}: the input shapes do not fit the model at any run-time dims it was built for ({}): {}",
            self.dir.display(),
            self.dims_list(),
            lines.join(", ")
        )))
    }
}

fn dims_text(s: &[usize]) -> String {
    let dims: Vec<Dim> = s.iter().map(|&d| Dim::from(d)).collect();
    fmt_shape(&dims)
}

/// Device memory from a library's GPU runtime ([`Library::device_alloc`]); freed on drop.
pub struct DeviceBuffer {
    ptr: *mut c_void,
    bytes: u64,
    device: i32,
    // Keeps the library, whose runtime frees the memory, loaded.
    lib: Arc<Library>,
}

// SAFETY: a device pointer is a number to the host; the library's free may be called from any
// thread.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// The device address (NULL for 0 bytes).
    pub fn ptr(&self) -> *mut c_void {
        self.ptr
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The GPU it lives on.
    pub fn device(&self) -> i32 {
        self.device
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: the pointer came from o2a_device_alloc on this device and is freed once. The
        // free waits for the device's outstanding work (cudaFree), so no kernel still reads it.
        // A failure cannot be reported from a drop; the memory is then lost, not reused.
        let _ = unsafe { (self.lib.api.device_free)(self.device, self.ptr) };
    }
}

/// A model instance on the GPU: its arena, workspace and weights.
pub struct Model {
    ptr: NonNull<c_void>,
    lib: Arc<Library>,
}

// SAFETY: the C API may be called from any thread as long as calls on one model do not overlap,
// which `&mut self` on every running method guarantees; the model remembers its device and
// selects it for each run.
unsafe impl Send for Model {}

impl Model {
    /// Instantiates the library's model on the current GPU: allocates the arena (at the
    /// largest run-time dims) and the workspace, uploads `OUT/weights.bin`.
    pub fn create(lib: Library) -> Result<Model> {
        let dir = path_cstring(&lib.dir)?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `dir` is a NUL-terminated path; `ptr` receives the model or stays NULL.
        let rc = unsafe { (lib.api.create)(dir.as_ptr(), &mut ptr) };
        if rc != 0 {
            return Err(lib.call_error("cannot create the model", rc));
        }
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::Other(format!("{}: o2a_create succeeded without a model", lib.dir.display())))?;
        Ok(Model { ptr, lib: Arc::new(lib) })
    }

    /// [`Model::create`] with the weights from memory: `weights` holds what the build wrote to
    /// `OUT/weights.bin` (the library checks its size and build hash).
    pub fn create_from_memory(lib: Library, weights: &[u8]) -> Result<Model> {
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `weights` is valid for its length during the call, which copies it to the
        // device; `ptr` receives the model or stays NULL.
        let rc = unsafe { (lib.api.create_from_memory)(weights.as_ptr().cast(), weights.len() as u64, &mut ptr) };
        if rc != 0 {
            return Err(lib.call_error("cannot create the model from the weights in memory", rc));
        }
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            Error::Other(format!("{}: o2a_create_from_memory succeeded without a model", lib.dir.display()))
        })?;
        Ok(Model { ptr, lib: Arc::new(lib) })
    }

    /// [`Library::open`] and [`Model::create`].
    pub fn load(dir: &Path) -> Result<Model> {
        Model::create(Library::open(dir)?)
    }

    pub fn library(&self) -> &Library {
        &self.lib
    }

    /// The library, shared: what [`DeviceBuffer`]s of it hold on to.
    pub fn library_arc(&self) -> &Arc<Library> {
        &self.lib
    }

    /// The ordinal of the GPU the model lives on (the current device when it was created).
    pub fn device(&self) -> i32 {
        // SAFETY: the model is alive.
        unsafe { (self.lib.api.device)(self.ptr.as_ptr()) }
    }

    /// Runs the model at the run-time dims `dims` on device buffers: `inputs[i]` / `outputs[i]`
    /// hold input / output i at those dims (its dtype, dense row-major) on the model's GPU. The
    /// kernels are enqueued on `stream` (a GPU runtime stream handle; 0 is the default stream)
    /// and the call returns without waiting for them.
    ///
    /// # Safety
    /// Every pointer must address at least its tensor's bytes on the model's device and stay
    /// valid until the work on `stream` is done; `stream` must be a stream of that device (or
    /// 0, 1 or 2: the default, legacy default and per-thread default streams).
    pub unsafe fn run_device(
        &mut self,
        dims: &[i64],
        inputs: &[*const c_void],
        outputs: &[*mut c_void],
        stream: usize,
    ) -> Result<()> {
        let lib = &self.lib;
        lib.check_buffers(dims, inputs.len(), outputs.len())?;
        let rc =
            (lib.api.run)(self.ptr.as_ptr(), dims.as_ptr(), inputs.as_ptr(), outputs.as_ptr(), stream as *mut c_void);
        if rc != 0 {
            return Err(lib.call_error(&format!("running the model {}", lib.dims_text(dims)), rc));
        }
        Ok(())
    }

    /// The name of the GPU the model lives on.
    pub fn device_name(&self) -> String {
        // SAFETY: the model is alive; the string lives as long as it.
        unsafe { c_str((self.lib.api.device_name)(self.ptr.as_ptr())) }.unwrap_or_default()
    }

    /// Runs the model at the run-time dims `dims` on host tensors (one per input, in input
    /// order, of the input's dtype and shape at those dims); returns the outputs in output order.
    pub fn run_host(&mut self, dims: &[i64], inputs: &[Tensor]) -> Result<Vec<Tensor>> {
        let lib = &self.lib;
        lib.check_dims(dims)?;
        let at = lib.dims_text(dims);
        if inputs.len() != lib.inputs.len() {
            let names: Vec<&str> = lib.inputs.iter().map(|i| i.name.as_str()).collect();
            return Err(Error::Other(format!(
                "{}: {} input(s) given, the model takes {} ({})",
                lib.dir.display(),
                inputs.len(),
                lib.inputs.len(),
                names.join(", ")
            )));
        }
        let mut in_bytes = Vec::with_capacity(inputs.len());
        for (i, (info, t)) in lib.inputs.iter().zip(inputs).enumerate() {
            if t.dtype() != info.dtype {
                return Err(Error::Other(format!(
                    "{}: input '{}' is {}, the model takes {}",
                    lib.dir.display(),
                    info.name,
                    t.dtype(),
                    info.dtype
                )));
            }
            let want = lib.input_shape(i, dims)?;
            if t.shape() != want.as_slice() {
                return Err(Error::Other(format!(
                    "{}: input '{}' has shape {}, the model takes {} {at}",
                    lib.dir.display(),
                    info.name,
                    dims_text(t.shape()),
                    dims_text(&want)
                )));
            }
            in_bytes.push(crate::lower::weights::to_le_bytes(t));
        }
        let mut out_shapes = Vec::with_capacity(lib.outputs.len());
        let mut out_bytes: Vec<Vec<u8>> = Vec::with_capacity(lib.outputs.len());
        for (i, info) in lib.outputs.iter().enumerate() {
            let shape = lib.output_shape(i, dims)?;
            out_bytes.push(vec![0u8; shape.iter().product::<usize>() * info.dtype.size_bytes()]);
            out_shapes.push(shape);
        }
        let in_ptrs: Vec<*const c_void> = in_bytes.iter().map(|b| b.as_ptr().cast::<c_void>()).collect();
        let out_ptrs: Vec<*mut c_void> = out_bytes.iter_mut().map(|b| b.as_mut_ptr().cast::<c_void>()).collect();
        // SAFETY: each buffer holds exactly the bytes of its tensor at `dims` (checked above).
        unsafe { self.run_host_buffers(dims, &in_ptrs, &out_ptrs) }?;
        let lib = &self.lib;
        lib.outputs
            .iter()
            .zip(out_shapes)
            .zip(out_bytes)
            .map(|((info, shape), bytes)| tensor_from_le_bytes(info.dtype, &shape, &bytes))
            .collect()
    }

    /// Runs the model at the run-time dims `dims` on host buffers the caller owns: `inputs[i]` /
    /// `outputs[i]` hold input / output i at those dims (its dtype, dense row-major,
    /// little-endian). Synchronous: the outputs are written when it returns. [`Model::run_host`]
    /// with the caller's memory, so the outputs need no copy (the Python package's `out=`).
    ///
    /// # Safety
    /// Every pointer must address at least its tensor's bytes at `dims` in host memory, readable
    /// (inputs) or writable (outputs), for the duration of the call.
    pub unsafe fn run_host_buffers(
        &mut self,
        dims: &[i64],
        inputs: &[*const c_void],
        outputs: &[*mut c_void],
    ) -> Result<()> {
        let lib = &self.lib;
        lib.check_buffers(dims, inputs.len(), outputs.len())?;
        let rc = (lib.api.run_host)(self.ptr.as_ptr(), dims.as_ptr(), inputs.as_ptr(), outputs.as_ptr());
        if rc != 0 {
            return Err(lib.call_error(&format!("running the model {}", lib.dims_text(dims)), rc));
        }
        Ok(())
    }

    /// Median milliseconds of one run at the run-time dims `dims` over `iters` timed runs after
    /// `warmup` untimed ones, on random device inputs; `graph` replays a captured graph of the
    /// run instead of launching each kernel.
    pub fn bench(&mut self, dims: &[i64], warmup: u32, iters: u32, graph: bool) -> Result<f32> {
        let lib = &self.lib;
        lib.check_dims(dims)?;
        let (warmup, iters) = timing_counts(warmup, iters)?;
        let mut ms = 0f32;
        // SAFETY: the model is alive; `dims` holds one value per run-time dim; `ms` receives
        // the median.
        let rc =
            unsafe { (lib.api.bench)(self.ptr.as_ptr(), dims.as_ptr(), warmup, iters, c_int::from(graph), &mut ms) };
        if rc != 0 {
            let how = if graph { "replaying a graph" } else { "with plain launches" };
            return Err(lib.call_error(&format!("benchmarking {} {how}", lib.dims_text(dims)), rc));
        }
        Ok(ms)
    }

    /// Median milliseconds of each kernel (in run order, one per [`Library::kernels`]) at the
    /// run-time dims `dims` over `iters` runs with plain launches after `warmup` untimed ones, on the random
    /// device inputs of [`Model::bench`]. A kernel's time runs from a GPU event recorded before it
    /// to the one before the next kernel, so it includes any wait for the next launch: where
    /// launches are slower than the kernels, the times show launch overhead, and their sum is
    /// close to [`Model::bench`] with plain launches.
    pub fn kernel_times(&mut self, dims: &[i64], warmup: u32, iters: u32) -> Result<Vec<f32>> {
        let lib = &self.lib;
        lib.check_dims(dims)?;
        let (warmup, iters) = timing_counts(warmup, iters)?;
        let mut ms = vec![f32::NAN; lib.kernels.len()];
        // SAFETY: the model is alive; `dims` holds one value per run-time dim; `ms` one float
        // per kernel, as many as the call writes.
        let rc = unsafe { (lib.api.kernel_times)(self.ptr.as_ptr(), dims.as_ptr(), warmup, iters, ms.as_mut_ptr()) };
        let at = lib.dims_text(dims);
        if rc != 0 {
            return Err(lib.call_error(&format!("timing each kernel {at}"), rc));
        }
        if let Some(k) = ms.iter().position(|t| !t.is_finite() || *t < 0.0) {
            return Err(Error::Other(format!(
                "{}: timing each kernel {at}: {} (node '{}') got the impossible time {} ms",
                lib.dir.display(),
                lib.kernels[k].name,
                lib.kernels[k].node,
                ms[k]
            )));
        }
        Ok(ms)
    }
}

/// The warm-up and timed run counts as the C API takes them.
fn timing_counts(warmup: u32, iters: u32) -> Result<(c_int, c_int)> {
    let warmup = c_int::try_from(warmup).map_err(|_| Error::Other(format!("--warmup {warmup} is too large")))?;
    let iters = c_int::try_from(iters).map_err(|_| Error::Other(format!("--iters {iters} is too large")))?;
    Ok((warmup, iters))
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the pointer came from o2a_create and is destroyed once.
        unsafe { (self.lib.api.destroy)(self.ptr.as_ptr()) }
    }
}

fn path_cstring(p: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        p.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = p.to_string_lossy().into_owned().into_bytes();
    CString::new(bytes).map_err(|_| Error::Other(format!("{}: a path with a NUL byte", p.display())))
}

/// A tensor from little-endian bytes in row-major order (booleans one byte each, nonzero is
/// true): the inverse of `lower::weights::to_le_bytes`.
pub fn tensor_from_le_bytes(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor> {
    let n: usize = shape.iter().product();
    let size = dtype.size_bytes();
    if bytes.len() != n * size {
        return Err(Error::Other(format!(
            "{} bytes cannot hold a {dtype} tensor of shape {} ({} bytes)",
            bytes.len(),
            dims_text(shape),
            n * size
        )));
    }
    fn arr<T>(shape: &[usize], v: Vec<T>) -> ArrayD<T> {
        ArrayD::from_shape_vec(IxDyn(shape), v).expect("the length is the shape's product (checked)")
    }
    macro_rules! le {
        ($t:ty, $variant:ident) => {{
            const W: usize = std::mem::size_of::<$t>();
            let v: Vec<$t> = bytes
                .chunks_exact(W)
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunks_exact yields W bytes")))
                .collect();
            Tensor::$variant(arr(shape, v))
        }};
    }
    Ok(match dtype {
        DType::F32 => le!(f32, F32),
        DType::F64 => le!(f64, F64),
        DType::F16 => le!(f16, F16),
        DType::BF16 => le!(bf16, BF16),
        DType::I8 => le!(i8, I8),
        DType::I16 => le!(i16, I16),
        DType::I32 => le!(i32, I32),
        DType::I64 => le!(i64, I64),
        DType::U8 => Tensor::U8(arr(shape, bytes.to_vec())),
        DType::U16 => le!(u16, U16),
        DType::U32 => le!(u32, U32),
        DType::U64 => le!(u64, U64),
        DType::Bool => Tensor::Bool(arr(shape, bytes.iter().map(|&b| b != 0).collect())),
    })
}
