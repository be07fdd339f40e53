//! The lowered program: device tensors with their storage, kernel instances in run order, the
//! weights blob and the memory plan. It is target-neutral data: a target's templates turn it into
//! source files (`crate::codegen`), and nothing in it names CUDA.

use super::ops::conv::StemTile;
use super::problem::ConvProblem;
use crate::ir::{DType, Dim};
use serde::Serialize;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

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
    /// Dims are constants or polynomials in the run-time dims.
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
    /// Floating-point operations of one launch, a polynomial in the run-time dims (a
    /// multiply-add counts 2): set by the op lowerings that know their problem
    /// ([`crate::lower::LowerCtx::set_flops`]), zero for kernels that only move data or whose
    /// arithmetic is not counted. See [`Program::kernel_work`] for the whole convention.
    pub flops: Dim,
    /// The family's template fields (shapes as C++ expressions in the run-time dims `dims.v[i]`, tile configs, …).
    /// Only the templates read them; the passes after lowering read the typed fields below,
    /// from which the lowering built the corresponding entries (`args`, `dispatch`, `instances`,
    /// the fields of [`KernelFacts`]).
    pub context: Map<String, Json>,
    /// How the launcher sees each tensor argument, in the order of `args` (the template's `args`).
    pub launcher_args: Vec<LauncherArg>,
    /// The library instances the kernel calls, in the order it tests them (the template's
    /// `dispatch` and `instances`); empty for a kernel of our own.
    pub dispatch: Vec<DispatchEntry>,
    /// What the kernel computes, where a pass after lowering needs to know (the fusion pass).
    pub facts: KernelFacts,
}

impl KernelInstance {
    /// The template's `dispatch` entries (`{max_batch, dims, when, fn, last, config, measured}`,
    /// `dims` only where the entry bounds run-time dims besides the batch); `None` for a kernel
    /// that calls no library instance.
    pub fn dispatch_fields(&self) -> Option<Json> {
        let last = self.dispatch.len().checked_sub(1)?;
        Some(Json::Array(self.dispatch.iter().enumerate().map(|(i, d)| d.template_fields(i == last)).collect()))
    }

    /// The distinct library functions the kernel calls, sorted (the template's `instances`).
    pub fn library_calls(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.dispatch.iter().map(|d| d.function.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// One tensor argument as a kernel's launcher sees it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LauncherArg {
    /// Its slot among the launcher's arguments (`t[index]`).
    pub index: usize,
    /// The device tensor's name.
    pub name: String,
    pub dtype: DType,
    /// The dims and the element count as C++ expressions in the run-time dims.
    pub shape: Vec<String>,
    pub numel: String,
}

impl LauncherArg {
    /// The template's entry of `args`: `{index, name, ctype, shape, numel}`.
    pub fn template_fields(&self) -> Json {
        json!({
            "index": self.index,
            "name": self.name,
            "ctype": super::ctype(self.dtype),
            "shape": self.shape,
            "numel": self.numel,
        })
    }
}

/// A library choice of a node's kernel: the function that runs for batches up to `max_batch` and
/// the other run-time dims up to their bounds in `dims` (see `target::Dispatch`). A kernel tests
/// its entries in order; the last runs for any values.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DispatchEntry {
    pub max_batch: i64,
    /// Upper bounds of run-time dims other than the batch, by symbol.
    pub dims: BTreeMap<String, i64>,
    /// The C++ condition under which the entry runs (`dims.v[0] <= 8`, `true`).
    pub when: String,
    /// The library instance's function name.
    pub function: String,
    /// The instance's configuration (`LibraryInstance::config`).
    pub config: String,
    /// Whether a profiled time chose the instance (else the heuristic).
    pub measured: bool,
}

impl DispatchEntry {
    /// The template's (and the build metadata's) entry of `dispatch`.
    fn template_fields(&self, last: bool) -> Json {
        let mut e = json!({ "max_batch": self.max_batch, "when": self.when, "fn": self.function, "last": last,
                "config": self.config, "measured": self.measured });
        if !self.dims.is_empty() {
            e["dims"] = json!(self.dims);
        }
        e
    }
}

/// What a kernel computes, recorded by the lowering that emits it for the passes after lowering
/// (`fuse`), which must not read it back out of the template fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KernelFacts {
    /// Nothing a pass needs beyond the instance's other fields.
    #[default]
    Opaque,
    /// An elementwise conversion of equal shapes, `args[1] = (its type) args[0]`
    /// (`LowerCtx::emit_cast`).
    Cast,
    /// The `transpose` family's tiled form (`ops::transpose::emit_tiled`):
    /// `args[1][b, c, r] = args[0][b, r, c]` over `[batches, rows, cols]`, the dims with the
    /// compile-time ones substituted.
    TiledTranspose { batches: Dim, rows: Dim, cols: Dim },
    /// `pad_channels` (`ops::conv`): `args[out_slot]` is `args[x_slot]` with its innermost
    /// (channel) dim zero-padded from `c_in` to `c_out`.
    PadChannels { x_slot: usize, out_slot: usize, c_in: i64, c_out: i64 },
    /// The thin-stem convolution (`ops::conv::STEM_TEMPLATE`), see [`StemFacts`].
    StemConv(Box<StemFacts>),
    /// A 2-D max pooling of an NHWC fp16 tensor without dilation (`ops::pool`): `args[out_slot]`
    /// is the pooling of `args[x_slot]`, `[N, H, W, C]` → `[N, out[0], out[1], C]`, over
    /// `kernel` windows at `strides` with `pads` (begin) rows and columns of padding, which no
    /// window reads (ONNX MaxPool).
    MaxPool2d { x_slot: usize, out_slot: usize, kernel: [i64; 2], strides: [i64; 2], pads: [i64; 2], out: [i64; 2] },
}

/// What the fusion pass (`fuse.rs`) knows of a thin-stem convolution: it reads `args[x_slot]`,
/// an `[N, H, W, C]` fp16 tensor, which it can read instead as the `[N, C, H, W]` tensor of fp32
/// or fp16 it was transposed (and converted) from (template fields `x_nchw` and `x_ctype`); it
/// writes `args[out_slot]`, which a max pooling may be fused into (`ops::conv::stem_pool_tile`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StemFacts {
    pub x_slot: usize,
    pub out_slot: usize,
    #[serde(skip)]
    pub problem: ConvProblem,
    #[serde(skip)]
    pub tile: StemTile,
}

/// A dim whose value the caller picks at each run, within a range fixed at compile time
/// (`--dim seq=1..512`; a model's one free dim is the batch and runs `1..=--max-batch`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunDim {
    /// The ONNX symbol (`N`, `batch_size`, `seq`).
    pub symbol: String,
    /// Smallest value a run may take (≥ 1).
    pub min: i64,
    /// Largest value a run may take: the arena is sized for every run-time dim at its largest.
    pub max: i64,
    /// The compile option that set the range, as messages name it: `--max-batch 64` for the
    /// free batch, `--dim batch=4..64` or `--dim seq=1..512` for a range given to the dim
    /// ([`RunDim::set_by`]). Empty where unknown (a library read through the C API alone).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub option: String,
}

impl RunDim {
    /// A dim given a range with `--dim symbol=min..max`.
    pub fn ranged(symbol: &str, min: i64, max: i64) -> RunDim {
        RunDim { symbol: symbol.into(), min, max, option: format!("--dim {symbol}={min}..{max}") }
    }

    /// The free batch dim, running `1..=max` (`--max-batch max`).
    pub fn free_batch(symbol: &str, max: i64) -> RunDim {
        RunDim { symbol: symbol.into(), min: 1, max, option: format!("--max-batch {max}") }
    }

    /// The option that set the range, for messages: [`RunDim::option`], or when that is unknown
    /// both options that can (`--max-batch or --dim N=MIN..MAX` for the batch).
    pub fn set_by(&self, is_batch: bool) -> String {
        match (self.option.is_empty(), is_batch) {
            (false, _) => self.option.clone(),
            (true, true) => format!("--max-batch or --dim {}=MIN..MAX", self.symbol),
            (true, false) => format!("--dim {}=MIN..MAX", self.symbol),
        }
    }
}

/// The run-time dims of a program, in the order the generated code numbers them (`dims.v[i]`)
/// and the C API takes their values.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunDims {
    pub dims: Vec<RunDim>,
    /// Which of `dims` is the batch (throughput figures and `--batch` refer to it): the dim
    /// `--max-batch` ranges, else the leading axis of the first graph input.
    pub batch: Option<usize>,
}

impl RunDims {
    /// Fixed shapes: no run-time dim.
    pub fn none() -> RunDims {
        RunDims::default()
    }

    /// One run-time dim, the batch `symbol`, running `1..=max`.
    pub fn batch_only(symbol: &str, max: i64) -> RunDims {
        RunDims { dims: vec![RunDim::free_batch(symbol, max)], batch: Some(0) }
    }

    pub fn is_empty(&self) -> bool {
        self.dims.is_empty()
    }

    /// The batch dim, when there is one.
    pub fn batch_dim(&self) -> Option<&RunDim> {
        self.batch.and_then(|i| self.dims.get(i))
    }

    /// The position of `symbol` among the run-time dims.
    pub fn index_of(&self, symbol: &str) -> Option<usize> {
        self.dims.iter().position(|d| d.symbol == symbol)
    }

    /// Each dim's range, by symbol.
    pub fn ranges(&self) -> BTreeMap<String, (i64, i64)> {
        self.dims.iter().map(|d| (d.symbol.clone(), (d.min, d.max))).collect()
    }

    /// Every dim at its largest value.
    pub fn max_env(&self) -> BTreeMap<String, i64> {
        self.dims.iter().map(|d| (d.symbol.clone(), d.max)).collect()
    }

    /// The options that set the dims' ranges, in order (`--max-batch 64, --dim seq=1..512`), for
    /// messages about sizes at the ranges' largest values; None for fixed shapes.
    pub fn options_text(&self) -> Option<String> {
        let v: Vec<String> = self.dims.iter().enumerate().map(|(i, d)| d.set_by(self.batch == Some(i))).collect();
        (!v.is_empty()).then(|| v.join(", "))
    }

    /// Every dim but the batch and its range: the dims a target chooses library instances for
    /// range by range, besides the batch (see `GemmProblem::choice_points`).
    pub fn other_ranges(&self) -> BTreeMap<String, (i64, i64)> {
        self.dims
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != self.batch)
            .map(|(_, d)| (d.symbol.clone(), (d.min, d.max)))
            .collect()
    }

    /// The largest value `d` takes over the dims' ranges (conservative for polynomials with
    /// terms of both signs, see [`Dim::range_in`]).
    pub fn upper_bound(&self, d: &Dim) -> Option<i64> {
        d.range_in(&self.ranges()).map(|(_, hi)| hi)
    }
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
    /// The dims chosen at run time (empty for fixed shapes).
    pub dims: RunDims,
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
    pub fn empty(model_name: String, source: String, dims: RunDims) -> Program {
        Program {
            model_name,
            source,
            dims,
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

    /// The work of kernel `k` for reports of achieved throughput (`bench --kernels`), as
    /// polynomials in the run-time dims: `(flops, bytes)`.
    ///
    /// Flops: the kernel's [`KernelInstance::flops`], the useful arithmetic of the op it
    /// computes, a multiply-add counting 2: a convolution 2·N·P·Q·K·(C/group)·R·S (the model's
    /// problem, not channel or im2col padding), a matrix product 2·batch·M·N·K, fused attention
    /// 4·B·H·Sq·Skv·D (its two products; softmax not counted), an elementwise kernel one per
    /// output element; zero for every other kernel (copies, layout changes, reductions, norms).
    ///
    /// Bytes: a minimum-traffic figure: every distinct tensor argument counted once at its
    /// element size, the tensors read (inputs, weights) and those written, whatever the kernel
    /// re-reads through caches; its scratch workspace is not counted. An argument the kernel
    /// reads only part of (a gather's table, a slice's source) counts in full.
    pub fn kernel_work(&self, k: &KernelInstance) -> (Dim, Dim) {
        let mut seen: Vec<TensorId> = Vec::with_capacity(k.args.len());
        let mut bytes = Dim::known(0);
        for &t in &k.args {
            if seen.contains(&t) {
                continue;
            }
            seen.push(t);
            let d = &self.tensors[t];
            bytes = bytes.add(&crate::ir::dim::product(&d.shape).mul(&Dim::known(d.dtype.size_bytes() as i64)));
        }
        (k.flops.clone(), bytes)
    }

    /// Byte size of a tensor with every run-time dim at its largest (its size at any run is at
    /// most this: the memory plan places tensors by these sizes).
    pub fn bytes_at_max(&self, t: TensorId) -> u64 {
        let d = &self.tensors[t];
        // A bound beyond i64 saturates, so the plan's checked sums report it rather than wrap.
        match self.dims.upper_bound(&crate::ir::dim::product(&d.shape)) {
            Some(elems) => (elems.max(0) as u64).saturating_mul(d.dtype.size_bytes() as u64),
            None => u64::MAX,
        }
    }
}
