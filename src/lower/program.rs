//! The lowered program: device tensors with their storage, kernel instances in run order, the
//! weights blob and the memory plan. It is target-neutral data: a target's templates turn it into
//! source files (`crate::codegen`), and nothing in it names CUDA.

use crate::ir::{DType, Dim};
use serde::Serialize;
use serde_json::{Map, Value as Json};

pub type TensorId = usize;

/// Where a device tensor lives.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Storage {
    /// The caller's device buffer of graph input `index`.
    Input { index: usize },
    /// The caller's device buffer of graph output `index`.
    Output { index: usize },
    /// Bytes `[offset, offset + bytes)` of the weights blob, resident on the device.
    Weight { offset: u64, bytes: u64 },
    /// An activation in the arena; the offset is assigned by the memory plan.
    Arena { offset: u64 },
    /// The same bytes as another tensor (a reshape, a flatten): no kernel, no memory.
    Alias { of: TensorId },
}

/// A tensor as the generated code sees it.
#[derive(Clone, Debug, Serialize)]
pub struct DeviceTensor {
    pub name: String,
    /// The element type on the device (float activations are fp16).
    pub dtype: DType,
    /// Dims are constants or polynomials in the batch symbol.
    pub shape: Vec<Dim>,
    pub storage: Storage,
}

/// One kernel launch: the template that renders it and the values that fill the template.
#[derive(Clone, Debug, Serialize)]
pub struct KernelInstance {
    /// The launcher's function name and file stem (`k012_conv2d_library`), unique in the program.
    pub name: String,
    /// Template file stem under `templates/<target>/` (`conv2d_library`).
    pub template: String,
    /// The graph node(s) this kernel computes, for reports and error messages.
    pub node: String,
    /// Tensor arguments in the order the launcher receives them (`t[0]`, `t[1]`, …).
    pub args: Vec<TensorId>,
    /// Which of `args` the kernel writes (indices into `args`).
    pub writes: Vec<usize>,
    /// Bytes of scratch memory the launcher needs (the shared workspace is the largest of these).
    pub workspace_bytes: u64,
    /// The family's template fields (shapes as C++ expressions in `batch`, tile configs, …).
    pub context: Map<String, Json>,
}

/// The batch dim chosen at run time.
#[derive(Clone, Debug, Serialize)]
pub struct Batch {
    /// The ONNX symbol (`N`, `batch_size`).
    pub symbol: String,
    /// Largest batch the arena is sized for (`--max-batch`).
    pub max: i64,
}

/// A graph input or output as the C API describes it.
#[derive(Clone, Debug, Serialize)]
pub struct IoTensor {
    pub name: String,
    /// The ONNX dtype (the caller's buffers hold this type).
    pub dtype: DType,
    pub shape: Vec<Dim>,
    /// The device tensor bound to the caller's buffer.
    pub tensor: TensorId,
}

/// Memory plan summary (all figures at the largest batch).
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryPlan {
    /// Size of the activation arena after lifetime-based reuse.
    pub arena_bytes: u64,
    /// What the activations would take without reuse.
    pub activations_bytes: u64,
    /// Largest workspace any kernel needs.
    pub workspace_bytes: u64,
    /// Size of the weights blob.
    pub weights_bytes: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Program {
    /// A C identifier derived from the model file name.
    pub model_name: String,
    /// The model file, for messages and build metadata.
    pub source: String,
    pub batch: Option<Batch>,
    pub tensors: Vec<DeviceTensor>,
    pub inputs: Vec<IoTensor>,
    pub outputs: Vec<IoTensor>,
    pub kernels: Vec<KernelInstance>,
    /// Library instances the kernels call, sorted by name, each once.
    pub library: Vec<super::LibraryInstance>,
    #[serde(skip)]
    pub weights: Vec<u8>,
    pub memory: MemoryPlan,
}

/// Byte alignment of every arena and weights-blob offset (a CUTLASS 128-bit access needs 16;
/// 256 matches `cudaMalloc` and keeps vectorised loads of every tensor aligned).
pub const ALIGN: u64 = 256;

pub fn align_up(v: u64) -> u64 {
    v.div_ceil(ALIGN) * ALIGN
}

impl Program {
    /// A program with no tensors, kernels or weights yet (lowering fills it).
    pub fn empty(model_name: String, source: String, batch: Option<Batch>) -> Program {
        Program {
            model_name,
            source,
            batch,
            tensors: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            kernels: Vec::new(),
            library: Vec::new(),
            weights: Vec::new(),
            memory: MemoryPlan::default(),
        }
    }

    /// The tensor whose bytes `t` uses (follows aliases).
    pub fn base(&self, mut t: TensorId) -> TensorId {
        while let Storage::Alias { of } = self.tensors[t].storage {
            t = of;
        }
        t
    }

    /// The batch bound for evaluating dims: the largest batch, or none.
    pub fn max_batch_env(&self) -> std::collections::BTreeMap<String, i64> {
        self.batch.iter().map(|b| (b.symbol.clone(), b.max)).collect()
    }

    /// Byte size of a tensor at the largest batch.
    pub fn bytes_at_max(&self, t: TensorId) -> u64 {
        let env = self.max_batch_env();
        let d = &self.tensors[t];
        let elems: i64 = d.shape.iter().map(|x| x.eval(&env).as_known().unwrap_or(0)).product();
        elems.max(0) as u64 * d.dtype.size_bytes() as u64
    }
}
