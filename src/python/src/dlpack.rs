//! DLPack (https://dmlc.github.io/dlpack/latest/): GPU tensors in and out without a host copy.
//!
//! In: [`import`] takes the capsule a producer's `__dlpack__` returned (`dltensor` or, DLPack 1.x,
//! `dltensor_versioned`), marks it used as the protocol asks (so the producer's capsule
//! destructor does not free it) and holds the managed tensor until the [`Imported`] object
//! drops, when it calls the producer's deleter. The Python side checks what it describes against
//! the model ([`Imported`]'s getters); `NativeModel.run_device` checks again what memory safety
//! needs (dtype, contiguity, device, shape) before passing the pointers to the library.
//!
//! Out: [`DeviceTensor`] is an output in device memory allocated through the library
//! (`o2a_device_alloc`), with `__dlpack__`/`__dlpack_device__`, so `torch.from_dlpack`,
//! `cupy.from_dlpack` and other consumers take it without a copy. Each export is a managed tensor
//! holding the buffer (shared, reference-counted), freed when the last holder lets go.

use onnx2ait::ir::DType;
use onnx2ait::runtime::{DeviceBuffer, Library};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::ffi::{c_void, CStr};
use std::sync::Arc;

/// dlpack.h's DLDeviceType of CUDA device memory.
pub const KDL_CUDA: i32 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

/// DLPACK_FLAG_BITMASK_READ_ONLY.
const FLAG_READ_ONLY: u64 = 1;

const NAME: &CStr = c"dltensor";
const NAME_VERSIONED: &CStr = c"dltensor_versioned";
const USED: &CStr = c"used_dltensor";
const USED_VERSIONED: &CStr = c"used_dltensor_versioned";

/// DLPack's (code, bits, lanes) of a dtype.
fn dl_dtype(d: DType) -> DLDataType {
    let (code, bits) = match d {
        DType::F16 | DType::F32 | DType::F64 => (2, d.size_bytes() * 8),
        DType::BF16 => (4, 16),
        DType::I8 | DType::I16 | DType::I32 | DType::I64 => (0, d.size_bytes() * 8),
        DType::U8 | DType::U16 | DType::U32 | DType::U64 => (1, d.size_bytes() * 8),
        DType::Bool => (6, 8),
    };
    DLDataType { code, bits: bits as u8, lanes: 1 }
}

/// NumPy's name of a DLPack dtype ("float16", "bool"), or a description of one no model takes.
fn dtype_name(t: DLDataType) -> String {
    let base = match (t.code, t.bits) {
        (0, 8 | 16 | 32 | 64) => format!("int{}", t.bits),
        (1, 8 | 16 | 32 | 64) => format!("uint{}", t.bits),
        (2, 16 | 32 | 64) => format!("float{}", t.bits),
        (4, 16) => "bfloat16".into(),
        (6, 8) => "bool".into(),
        (5, b) => format!("complex{b}"),
        (c, b) => format!("DLPack type code {c} with {b} bits"),
    };
    if t.lanes == 1 {
        base
    } else {
        format!("{base} x{} lanes", t.lanes)
    }
}

enum Managed {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

/// A tensor taken from a DLPack capsule; the producer's memory stays valid while this lives.
#[pyclass(module = "onnx2ait._onnx2ait", name = "DLPackTensor", frozen)]
pub struct Imported {
    managed: Managed,
    /// (DLDeviceType, device id) as the capsule says.
    #[pyo3(get)]
    pub device: (i32, i32),
    /// NumPy's name of the element type.
    #[pyo3(get)]
    dtype: String,
    #[pyo3(get)]
    pub shape: Vec<i64>,
    /// Strides in elements; `None` when the capsule gives none (compact row-major).
    #[pyo3(get)]
    strides: Option<Vec<i64>>,
    /// The address of the first element (the data pointer plus the byte offset).
    #[pyo3(get)]
    pub data_ptr: usize,
    /// The producer marked the tensor read-only (DLPack 1.x).
    #[pyo3(get)]
    pub readonly: bool,
    /// The capsule was DLPack 1.x's versioned kind.
    #[pyo3(get)]
    versioned: bool,
}

// SAFETY: the managed tensor is only touched to call its deleter, once, on drop; DLPack
// deleters may be called from any thread.
unsafe impl Send for Imported {}
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the pointer came from a consumed capsule, so this object is its only owner, and
        // the deleter is called once.
        unsafe {
            match self.managed {
                Managed::Legacy(m) => {
                    if let Some(d) = (*m).deleter {
                        d(m)
                    }
                }
                Managed::Versioned(m) => {
                    if let Some(d) = (*m).deleter {
                        d(m)
                    }
                }
            }
        }
    }
}

impl Imported {
    /// Whether the elements are dense in row-major order (size-1 axes may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = &self.strides else { return true };
        let mut expected = 1i64;
        for (&n, &s) in self.shape.iter().zip(strides).rev() {
            if n != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(n);
        }
        true
    }

    pub fn dtype_name(&self) -> &str {
        &self.dtype
    }

    pub fn shape_usize(&self) -> Option<Vec<usize>> {
        self.shape.iter().map(|&d| usize::try_from(d).ok()).collect()
    }
}

#[pymethods]
impl Imported {
    /// Whether the elements are dense in row-major order.
    #[getter]
    fn contiguous(&self) -> bool {
        self.is_contiguous()
    }

    fn __repr__(&self) -> String {
        format!("<DLPackTensor {}{:?} on device {:?}>", self.dtype, self.shape, self.device)
    }
}

/// Reads a DLTensor's description.
///
/// # Safety
/// `t` must be a valid DLTensor whose shape (and strides, when not NULL) hold `ndim` values.
unsafe fn describe(t: &DLTensor) -> PyResult<(Vec<i64>, Option<Vec<i64>>)> {
    let ndim =
        usize::try_from(t.ndim).map_err(|_| PyValueError::new_err(format!("a DLPack tensor with {} dims", t.ndim)))?;
    if ndim > 0 && t.shape.is_null() {
        return Err(PyValueError::new_err("a DLPack tensor without a shape"));
    }
    let shape = if ndim == 0 { Vec::new() } else { std::slice::from_raw_parts(t.shape, ndim).to_vec() };
    if let Some(d) = shape.iter().find(|&&d| d < 0) {
        return Err(PyValueError::new_err(format!("a DLPack tensor of shape {shape:?} (dim {d})")));
    }
    let strides = if t.strides.is_null() || ndim == 0 {
        None
    } else {
        Some(std::slice::from_raw_parts(t.strides, ndim).to_vec())
    };
    Ok((shape, strides))
}

/// Takes the tensor of a DLPack capsule (what `__dlpack__` returns); the capsule is marked used.
#[pyfunction]
pub fn dlpack_import(capsule: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let raw = capsule.as_ptr();
    // SAFETY: the capsule API is called on a live object (checks come first); the pointer it
    // holds is a DLManagedTensor(Versioned) by the protocol's naming.
    unsafe {
        let versioned = if pyo3::ffi::PyCapsule_IsValid(raw, NAME_VERSIONED.as_ptr()) == 1 {
            true
        } else if pyo3::ffi::PyCapsule_IsValid(raw, NAME.as_ptr()) == 1 {
            false
        } else {
            let what = if pyo3::ffi::PyCapsule_CheckExact(raw) == 1 {
                let name = pyo3::ffi::PyCapsule_GetName(raw);
                let name = if name.is_null() { "no name".into() } else { CStr::from_ptr(name).to_string_lossy() };
                if name.starts_with("used_") {
                    "a DLPack capsule that was already consumed (each __dlpack__() result can be taken once)".into()
                } else {
                    format!("a capsule named '{name}', not a DLPack tensor")
                }
            } else {
                format!("a {}, not a DLPack capsule", capsule.get_type().name()?)
            };
            return Err(PyTypeError::new_err(format!("expected the capsule __dlpack__() returns, got {what}")));
        };
        let (name, used) = if versioned { (NAME_VERSIONED, USED_VERSIONED) } else { (NAME, USED) };
        let ptr = pyo3::ffi::PyCapsule_GetPointer(raw, name.as_ptr());
        if ptr.is_null() {
            return Err(PyErr::fetch(capsule.py()));
        }
        let (managed, t, readonly) = if versioned {
            let m = ptr.cast::<DLManagedTensorVersioned>();
            if (*m).version.major != 1 {
                // A future major version may lay the struct out differently: not read, not freed.
                return Err(PyBufferError::new_err(format!(
                    "a DLPack {}.{} tensor: this onnx2ait reads DLPack 1.x",
                    (*m).version.major,
                    (*m).version.minor
                )));
            }
            (Managed::Versioned(m), &(*m).dl_tensor, (*m).flags & FLAG_READ_ONLY != 0)
        } else {
            let m = ptr.cast::<DLManagedTensor>();
            (Managed::Legacy(m), &(*m).dl_tensor, false)
        };
        // From here the tensor is ours: marking the capsule used keeps its destructor from
        // freeing it, and dropping `Imported` calls the deleter.
        if pyo3::ffi::PyCapsule_SetName(raw, used.as_ptr()) != 0 {
            return Err(PyErr::fetch(capsule.py()));
        }
        let device = (t.device.device_type, t.device.device_id);
        let dtype = dtype_name(t.dtype);
        let data_ptr = (t.data as usize).wrapping_add(t.byte_offset as usize);
        let mut imported =
            Imported { managed, device, dtype, shape: Vec::new(), strides: None, data_ptr, readonly, versioned };
        // On an error `imported` drops and frees the tensor.
        let (shape, strides) = describe(t)?;
        imported.shape = shape;
        imported.strides = strides;
        Ok(imported)
    }
}

/// The dtype of an imported tensor as the model's, when it is one.
pub fn imported_dtype(t: &Imported) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.name() == t.dtype)
}

/// What an output's exports share: its device memory, and the inputs of the run that wrote it.
/// The inputs are held so that their producers cannot free or reuse their memory while the run
/// may still read it: `buf` drops first (fields drop in declaration order), and freeing it waits
/// for the device's work, so the inputs are released after the run is done.
pub struct Storage {
    pub buf: DeviceBuffer,
    pub inputs: Vec<Py<Imported>>,
}

/// An output on the GPU: hand it to `torch.from_dlpack` (or any DLPack consumer).
#[pyclass(module = "onnx2ait._onnx2ait", name = "DeviceTensor", frozen)]
pub struct DeviceTensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: Vec<i64>,
    /// The stream the run that writes it was enqueued on (a CUDA stream handle; 0 is the
    /// default stream).
    stream: usize,
    lib: Arc<Library>,
}

impl DeviceTensor {
    pub fn new(storage: Arc<Storage>, dtype: DType, shape: Vec<i64>, stream: usize, lib: Arc<Library>) -> Self {
        DeviceTensor { storage, dtype, shape, stream, lib }
    }
}

/// What a capsule's managed tensor owns: the storage (kept alive) and the shape it points to.
struct ExportCtx {
    _storage: Arc<Storage>,
    shape: Vec<i64>,
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    let m = Box::from_raw(m);
    drop(Box::from_raw(m.manager_ctx.cast::<ExportCtx>()));
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    let m = Box::from_raw(m);
    drop(Box::from_raw(m.manager_ctx.cast::<ExportCtx>()));
}

/// The capsule destructor: a capsule nobody consumed still owns its tensor.
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    if pyo3::ffi::PyCapsule_IsValid(capsule, NAME_VERSIONED.as_ptr()) == 1 {
        let m = pyo3::ffi::PyCapsule_GetPointer(capsule, NAME_VERSIONED.as_ptr()).cast::<DLManagedTensorVersioned>();
        delete_versioned(m);
    } else if pyo3::ffi::PyCapsule_IsValid(capsule, NAME.as_ptr()) == 1 {
        let m = pyo3::ffi::PyCapsule_GetPointer(capsule, NAME.as_ptr()).cast::<DLManagedTensor>();
        delete_legacy(m);
    } else {
        // Consumed (renamed "used_…"): the consumer owns the tensor and calls the deleter.
        pyo3::ffi::PyErr_Clear();
    }
}

/// A stream number of the DLPack protocol as a CUDA stream handle: None means the legacy default
/// stream, 1 is cudaStreamLegacy and 2 cudaStreamPerThread (those handles have the same values),
/// anything else a cudaStream_t. 0 is ambiguous in the protocol and taken as the legacy default.
fn consumer_stream(stream: Option<i64>) -> PyResult<Option<usize>> {
    match stream {
        None | Some(0) | Some(1) => Ok(Some(1)),
        Some(-1) => Ok(None),
        Some(s) if s > 1 => Ok(Some(s as usize)),
        Some(s) => Err(PyValueError::new_err(format!("__dlpack__(stream={s}): not a CUDA stream"))),
    }
}

/// Whether two stream handles are the same stream (0 and 1 are both the legacy default stream).
fn same_stream(a: usize, b: usize) -> bool {
    let norm = |s: usize| if s == 0 { 1 } else { s };
    norm(a) == norm(b)
}

#[pymethods]
impl DeviceTensor {
    #[getter]
    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// NumPy's name of the element type.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// The CUDA device ordinal.
    #[getter]
    fn device(&self) -> i32 {
        self.storage.buf.device()
    }

    #[getter]
    fn data_ptr(&self) -> usize {
        self.storage.buf.ptr() as usize
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.storage.buf.bytes()
    }

    fn __repr__(&self) -> String {
        format!("<onnx2ait.DeviceTensor {}{:?} on cuda:{}>", self.dtype.name(), self.shape, self.device())
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        (KDL_CUDA, self.device())
    }

    /// The DLPack protocol: `stream` is the consumer's stream, made to wait for the run that
    /// writes this tensor (None: the legacy default stream; -1: no ordering). DLPack 1.x's
    /// versioned capsule when `max_version` allows it. A copy or another device is refused.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if let Some(d) = dl_device {
            if d != self.__dlpack_device__() {
                return Err(PyBufferError::new_err(format!(
                    "__dlpack__(dl_device={d:?}): the tensor is on cuda:{} (DLPack device (2, {})) and is not copied",
                    self.device(),
                    self.device()
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err("__dlpack__(copy=True): onnx2ait's outputs are not copied"));
        }
        if let Some(consumer) = consumer_stream(stream)? {
            if !same_stream(consumer, self.stream) {
                // SAFETY: both are streams of this device by the protocol (the consumer's) and by
                // construction (the run's).
                unsafe { self.lib.stream_wait(self.device(), consumer, self.stream) }
                    .map_err(|e| crate::Error::new_err(e.to_string()))?;
            }
        }
        let ctx = Box::new(ExportCtx { _storage: Arc::clone(&self.storage), shape: self.shape.clone() });
        let ctx = Box::into_raw(ctx);
        let tensor = DLTensor {
            data: self.storage.buf.ptr(),
            device: DLDevice { device_type: KDL_CUDA, device_id: self.device() },
            ndim: self.shape.len() as i32,
            dtype: dl_dtype(self.dtype),
            // SAFETY: `ctx` lives until the deleter; its shape is never changed.
            shape: unsafe { (*ctx).shape.as_mut_ptr() },
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        // SAFETY: the capsule owns the managed tensor until a consumer renames it; the destructor
        // frees it otherwise. The names are static.
        let capsule = unsafe {
            if versioned {
                let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
                    version: DLPackVersion { major: 1, minor: 0 },
                    manager_ctx: ctx.cast(),
                    deleter: Some(delete_versioned),
                    flags: 0,
                    dl_tensor: tensor,
                }));
                let c = pyo3::ffi::PyCapsule_New(m.cast(), NAME_VERSIONED.as_ptr(), Some(capsule_destructor));
                if c.is_null() {
                    delete_versioned(m);
                }
                c
            } else {
                let m = Box::into_raw(Box::new(DLManagedTensor {
                    dl_tensor: tensor,
                    manager_ctx: ctx.cast(),
                    deleter: Some(delete_legacy),
                }));
                let c = pyo3::ffi::PyCapsule_New(m.cast(), NAME.as_ptr(), Some(capsule_destructor));
                if c.is_null() {
                    delete_legacy(m);
                }
                c
            }
        };
        // SAFETY: a new reference, or NULL with the error set.
        unsafe { Bound::from_owned_ptr_or_err(py, capsule) }
    }
}
