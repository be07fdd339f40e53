//! Lowering: the optimiser's kernel-level graph becomes a [`Program`] — one kernel instance per
//! node over planned device tensors, with the weights converted and packed into one blob.
//!
//! What happens here, in order:
//! - dims: symbols bound with `--dim NAME=VALUE` are substituted; the others are run-time dims
//!   ([`RunDims`]): those given a range (`--dim seq=1..512`), and at most one more, the batch,
//!   which runs `1..=--max-batch`. Every dim must be a polynomial in the run-time dims: kernels
//!   get shapes as C++ expressions in them (`dims.v[i]`, the launcher's `o2a_dims` argument), so
//!   one build serves every value in the ranges, and the memory plan sizes each tensor at the
//!   ranges' upper bounds;
//! - precision ([`Precision`], `--precision`): float tensors are stored as fp16 (the default) or
//!   fp32 on the device; integers and booleans keep their type;
//! - inputs: a graph input whose ONNX dtype differs from its device dtype (fp32 → fp16) gets a
//!   cast kernel at the boundary; constants become weights (converted to their device dtype, in
//!   the blob) on first use;
//! - nodes: each is lowered by its family ([`ops`], one file per family, found through the
//!   family tables, not by a match on op names); a node no family lowers is reported with every
//!   other such node at once;
//! - outputs: the producing kernel writes the caller's buffer directly when the dtypes agree,
//!   otherwise a cast kernel does;
//! - clean-up: [`fuse`] merges the input's boundary kernels, [`dead`] removes kernels whose
//!   results no live kernel reads (shape tensors that a kernel takes from its symbolic type);
//! - memory: [`plan`] places every arena tensor by lifetime.
//!
//! The target (`Target`) is asked only where a library instance is chosen (conv, gemm, and only
//! at fp16 precision: the instances are fp16-only); every other kernel names a template family
//! that each target provides.

pub mod choice;
pub mod cuda;
pub mod dead;
pub mod fuse;
pub mod ops;
pub mod plan;
pub mod problem;
pub mod program;
pub mod rocm;
pub mod sharing;
pub mod target;
pub mod weights;

pub use problem::{BiasKind, ConvProblem, GemmProblem};
pub use program::{
    DeviceTensor, DispatchEntry, IoTensor, KernelFacts, KernelInstance, LauncherArg, MemoryPlan, Program, RunDim,
    RunDims, StemFacts, Storage, TensorId,
};
pub use target::{Dispatch, Instance, LibraryInstance, Target};

use crate::error::{Error, Result, UnsupportedOp};
use crate::ir::{DType, Dim, Graph, Node, Tensor, ValueId};
use serde::Serialize;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

/// What the lowering needs besides the graph.
#[derive(Clone, Debug)]
pub struct LowerOptions {
    /// Values for symbolic dims that are fixed at compile time (`--dim seq=128`).
    pub dims: BTreeMap<String, i64>,
    /// Ranges `(min, max)` of symbolic dims chosen at run time (`--dim seq=1..512`).
    pub ranges: BTreeMap<String, (i64, i64)>,
    /// The largest run-time batch (`--max-batch`): the range `1..=max_batch` of the one symbolic
    /// dim that is neither bound nor given a range.
    pub max_batch: i64,
    /// The storage type of float activations and weights on the device (`--precision`).
    pub precision: Precision,
    /// The prefix of the generated C API's names (`--symbol-prefix`; `None`: `o2a_*`). Code
    /// generation's, carried here with the other options of a render.
    pub symbol_prefix: Option<String>,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            dims: BTreeMap::new(),
            ranges: BTreeMap::new(),
            max_batch: 64,
            precision: Precision::Fp16,
            symbol_prefix: None,
        }
    }
}

impl LowerOptions {
    /// The fixed dims and every run-time range at its largest value: where the optimiser's
    /// measured extraction prices convolutions and matrix products (with the batch at
    /// `--max-batch`). That is the last range the targets choose an instance for, so its
    /// problems are the ones the profiler times; an unbound range would be priced at the batch's
    /// value instead, a size no build chooses at.
    pub fn pricing_dims(&self) -> BTreeMap<String, i64> {
        let mut env = self.dims.clone();
        env.extend(self.ranges.iter().map(|(s, &(_, max))| (s.clone(), max)));
        env
    }

    /// The range of `g`'s run-time batch: the batch dim's own range when `--dim` gives it one
    /// ([`ranged_batch`], e.g. `--dim batch=4..64`), else `1..=max_batch`. Targets choose library
    /// instances only inside it ([`cuda::CudaTarget::with_batch_range`]): a choice at a batch
    /// below the range's smallest value would serve no run.
    pub fn batch_range(&self, g: &Graph) -> (i64, i64) {
        ranged_batch(g, &self.dims, &self.ranges).map_or((1, self.max_batch), |(_, r)| r)
    }
}

/// How float tensors are stored on the device. Kernels compute in fp32 either way (fp32
/// accumulation, fp32 epilogues); the precision decides the storage, and with it which kernels
/// exist:
/// - `Fp16` (the default): every float tensor (fp32 or fp16 in the model) is stored as fp16;
///   convolutions and matrix products run on the target's library instances (CUTLASS tensor
///   cores) where they apply.
/// - `Fp32`: every float tensor is stored as fp32, for models whose values leave fp16's range
///   (±65504; e.g. light_resnet50's activations reach 1e19). The library instances are fp16-only,
///   so convolutions and matrix products run on the direct and generic kernels, and the target
///   is never asked for an instance. An fp32 model then needs no casts at its boundary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    Fp16,
    Fp32,
}

impl Precision {
    /// The device dtype of float tensors.
    pub fn float_dtype(self) -> DType {
        match self {
            Precision::Fp16 => DType::F16,
            Precision::Fp32 => DType::F32,
        }
    }

    /// The storage dtype of a tensor of dtype `dt` on the device: floats take
    /// [`float_dtype`](Self::float_dtype); integers and booleans keep their type.
    pub fn device_dtype(self, dt: DType) -> LowerResult<DType> {
        match dt {
            DType::F32 | DType::F16 => Ok(self.float_dtype()),
            DType::F64 | DType::BF16 => Err(LowerError::Unsupported(format!(
                "{dt} tensors have no GPU kernels (fp32 and fp16 models are supported)"
            ))),
            other => Ok(other),
        }
    }

    /// `fp16` / `fp32`, as the command line spells it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Precision, String> {
        match s.to_ascii_lowercase().as_str() {
            "fp16" | "float16" | "half" => Ok(Precision::Fp16),
            "fp32" | "float32" | "float" => Ok(Precision::Fp32),
            _ => Err(format!("unknown precision '{s}' (expected fp16 or fp32)")),
        }
    }
}

/// Why a node could not be lowered.
#[derive(Debug)]
pub enum LowerError {
    /// No kernel for this op or this case of it (exit code 2: "not supported yet").
    Unsupported(String),
    /// The node is inconsistent (a bug upstream or a malformed model).
    Invalid(String),
}

pub type LowerResult<T> = std::result::Result<T, LowerError>;

#[macro_export]
macro_rules! lower_unsupported {
    ($($arg:tt)*) => { return Err($crate::lower::LowerError::Unsupported(format!($($arg)*))) };
}

/// The storage dtype of a tensor on the device at the default precision (fp16): floats are
/// stored as fp16 (fp32 accumulation inside kernels); integers and booleans keep their type.
/// A lowering in progress uses [`LowerCtx::device_dtype`], which follows `--precision`.
pub fn device_dtype(dt: DType) -> LowerResult<DType> {
    Precision::Fp16.device_dtype(dt)
}

/// The C++ element type of a device dtype.
pub fn ctype(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "float",
        DType::F64 => "double",
        DType::F16 => "half",
        DType::BF16 => "__nv_bfloat16",
        DType::I8 => "int8_t",
        DType::I16 => "int16_t",
        DType::I32 => "int32_t",
        DType::I64 => "int64_t",
        DType::U8 => "uint8_t",
        DType::U16 => "uint16_t",
        DType::U32 => "uint32_t",
        DType::U64 => "uint64_t",
        DType::Bool => "bool",
    }
}

/// The state of a lowering in progress, handed to each family's lowering function.
pub struct LowerCtx<'a> {
    pub graph: &'a Graph,
    pub target: &'a dyn Target,
    program: Program,
    /// Device tensor of each graph value, once created.
    value_tensor: Vec<Option<TensorId>>,
    /// Dims bound at compile time (`--dim`), for the dims ops hold themselves (graph value types
    /// have them substituted already).
    bound: BTreeMap<String, i64>,
    precision: Precision,
}

impl<'a> LowerCtx<'a> {
    /// The storage precision of float tensors (`--precision`).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The device dtype of float tensors (fp16, or fp32 with `--precision fp32`).
    pub fn float_dtype(&self) -> DType {
        self.precision.float_dtype()
    }

    /// The storage dtype on the device of a tensor of dtype `dt` at this lowering's precision.
    pub fn device_dtype(&self, dt: DType) -> LowerResult<DType> {
        self.precision.device_dtype(dt)
    }

    /// The graph value's type with bound dims.
    fn value_shape(&self, v: ValueId) -> LowerResult<(DType, Vec<Dim>)> {
        let val = self.graph.value(v);
        let ty =
            val.ty.as_ref().ok_or_else(|| LowerError::Invalid(format!("value '{}' has no inferred type", val.name)))?;
        Ok((ty.dtype, ty.shape.clone()))
    }

    /// The compile-time contents of node input `i`, when it is a constant.
    pub fn konst(&self, node: &Node, i: usize) -> Option<&'a Tensor> {
        let v = (*node.inputs.get(i)?)?;
        self.graph.value(v).konst.as_deref()
    }

    /// The device tensor holding node input `i` (a weight is packed into the blob on first use).
    pub fn input(&mut self, node: &Node, i: usize) -> LowerResult<TensorId> {
        match node.inputs.get(i).copied().flatten() {
            Some(v) => self.value(v),
            None => Err(LowerError::Invalid(format!("input {i} is missing"))),
        }
    }

    /// Like [`input`](Self::input) for an optional input.
    pub fn opt_input(&mut self, node: &Node, i: usize) -> LowerResult<Option<TensorId>> {
        match node.inputs.get(i).copied().flatten() {
            Some(v) => self.value(v).map(Some),
            None => Ok(None),
        }
    }

    fn value(&mut self, v: ValueId) -> LowerResult<TensorId> {
        if let Some(t) = self.value_tensor[v] {
            return Ok(t);
        }
        let val = self.graph.value(v);
        let Some(k) = val.konst.clone() else {
            return Err(LowerError::Invalid(format!("value '{}' is used before any kernel writes it", val.name)));
        };
        let t = self.add_weight(&val.name, &k)?;
        self.value_tensor[v] = Some(t);
        Ok(t)
    }

    /// Packs a constant into the weights blob, converted to its device dtype.
    pub fn add_weight(&mut self, name: &str, k: &Tensor) -> LowerResult<TensorId> {
        let dtype = self.device_dtype(k.dtype())?;
        let converted = if dtype == k.dtype() { k.clone() } else { k.cast(dtype) };
        let bytes = weights::to_le_bytes(&converted);
        let offset = program::align_up(self.program.weights.len() as u64);
        self.program.weights.resize(offset as usize, 0);
        self.program.weights.extend_from_slice(&bytes);
        let shape = k.shape().iter().map(|&d| Dim::known(d as i64)).collect();
        Ok(self.push_tensor(name, dtype, shape, Storage::Weight { offset, bytes: bytes.len() as u64 }))
    }

    /// A new arena tensor for node output `i`, in its device dtype.
    pub fn output(&mut self, node: &Node, i: usize) -> LowerResult<TensorId> {
        let v = *node.outputs.get(i).ok_or_else(|| LowerError::Invalid(format!("output {i} is missing")))?;
        let (dtype, shape) = self.value_shape(v)?;
        let t = self.push_tensor(
            &self.graph.value(v).name.clone(),
            self.device_dtype(dtype)?,
            shape,
            Storage::Arena { offset: 0 },
        );
        self.value_tensor[v] = Some(t);
        Ok(t)
    }

    /// Node output `i` is a view of `of` (same bytes, another shape): no kernel.
    pub fn alias_output(&mut self, node: &Node, i: usize, of: TensorId) -> LowerResult<TensorId> {
        let v = *node.outputs.get(i).ok_or_else(|| LowerError::Invalid(format!("output {i} is missing")))?;
        let (dtype, shape) = self.value_shape(v)?;
        let dtype = self.device_dtype(dtype)?;
        if dtype != self.program.tensors[of].dtype {
            return Err(LowerError::Invalid(format!(
                "a view cannot change the element type ({} → {dtype})",
                self.program.tensors[of].dtype
            )));
        }
        let t = self.push_tensor(&self.graph.value(v).name.clone(), dtype, shape, Storage::Alias { of });
        self.value_tensor[v] = Some(t);
        Ok(t)
    }

    /// A scratch arena tensor (e.g. a channel-padded copy of an input).
    pub fn temp(&mut self, name: &str, dtype: DType, shape: Vec<Dim>) -> TensorId {
        self.push_tensor(name, dtype, shape, Storage::Arena { offset: 0 })
    }

    fn push_tensor(&mut self, name: &str, dtype: DType, shape: Vec<Dim>, storage: Storage) -> TensorId {
        self.program.tensors.push(DeviceTensor { name: name.to_string(), dtype, shape, storage });
        self.program.tensors.len() - 1
    }

    pub fn tensor(&self, t: TensorId) -> &DeviceTensor {
        &self.program.tensors[t]
    }

    /// The tensor whose bytes `t` uses (follows views).
    pub fn base_of(&self, t: TensorId) -> TensorId {
        self.program.base(t)
    }

    pub fn shape(&self, t: TensorId) -> &[Dim] {
        &self.program.tensors[t].shape
    }

    pub fn dtype(&self, t: TensorId) -> DType {
        self.program.tensors[t].dtype
    }

    /// `d` with the compile-time dims substituted (for dims an op holds itself).
    pub fn bind(&self, d: &Dim) -> Dim {
        d.eval(&self.bound)
    }

    /// A dim as a C++ expression in the run-time dims (`"802816"`,
    /// `"((int64_t)802816*dims.v[0])"`).
    pub fn expr(&self, d: &Dim) -> LowerResult<String> {
        dim_expr(&d.eval(&self.bound), &self.program.dims)
    }

    /// The program's run-time dims.
    pub fn run_dims(&self) -> &RunDims {
        &self.program.dims
    }

    /// Every dim of a shape as C++ expressions.
    pub fn shape_exprs(&self, shape: &[Dim]) -> LowerResult<Vec<String>> {
        shape.iter().map(|d| self.expr(d)).collect()
    }

    /// The element count of a shape as a C++ expression.
    pub fn numel_expr(&self, shape: &[Dim]) -> LowerResult<String> {
        self.expr(&crate::ir::dim::product(shape))
    }

    /// The largest value of a dim over the run-time dims' ranges.
    /// The run-time dims and their ranges as text for messages: `batch 1..32, seq 1..512`.
    pub fn run_dims_text(&self) -> String {
        let r = self.program.dims.ranges();
        r.iter().map(|(name, (lo, hi))| format!("{name} {lo}..{hi}")).collect::<Vec<_>>().join(", ")
    }

    pub fn upper_bound(&self, d: &Dim) -> LowerResult<i64> {
        self.program.dims.upper_bound(&d.eval(&self.bound)).ok_or_else(|| {
            LowerError::Unsupported(format!("dim {d} is not a polynomial in the run-time dims, or too large"))
        })
    }

    /// Emits the kernel of a target [`Instance`]: its fields are added to `context`, and for a
    /// library choice the node kernel gets `dispatch` (`[{max_batch, dims, when, fn, last}]`,
    /// ranges of the run-time dims in the order they are tested, `when` the C++ condition of the
    /// range, `dims` the bounds of dims other than the batch when there are any) and
    /// `instances` (the distinct functions to declare), both built from the kernel's typed
    /// [`KernelInstance::dispatch`], while the instances join the program's library (each
    /// rendered once).
    pub fn emit_instance(
        &mut self,
        node: &str,
        inst: Instance,
        args: Vec<TensorId>,
        writes: Vec<usize>,
        mut context: Map<String, Json>,
    ) -> LowerResult<()> {
        for (key, v) in inst.context {
            context.insert(key, v);
        }
        let dispatch = inst
            .dispatch
            .iter()
            .map(|d| {
                Ok(DispatchEntry {
                    max_batch: d.max_batch,
                    dims: d.dims.clone(),
                    when: self.dispatch_condition(d)?,
                    function: d.instance.name.clone(),
                    config: d.instance.config.clone(),
                    measured: d.measured,
                })
            })
            .collect::<LowerResult<Vec<DispatchEntry>>>()?;
        for d in inst.dispatch {
            if let Err(i) = self.program.library.binary_search_by(|l| l.name.cmp(&d.instance.name)) {
                self.program.library.insert(i, d.instance);
            }
        }
        let kernel = self.emit_kernel(node, &inst.template, args, writes, context, inst.workspace_bytes)?;
        kernel.dispatch = dispatch;
        if let Some(fields) = kernel.dispatch_fields() {
            let names = kernel.library_calls().into_iter().map(|n| json!(n)).collect();
            kernel.context.insert("dispatch".into(), fields);
            kernel.context.insert("instances".into(), Json::Array(names));
        }
        Ok(())
    }

    /// The C++ condition under which a node runs dispatch entry `d`: the run-time batch at most
    /// its `max_batch`, and each other run-time dim the entry bounds at most its bound (`true`
    /// for a program with neither).
    fn dispatch_condition(&self, d: &Dispatch) -> LowerResult<String> {
        let mut tests: Vec<(usize, i64)> = self.program.dims.batch.map(|b| (b, d.max_batch)).into_iter().collect();
        for (symbol, &bound) in &d.dims {
            let i = self.program.dims.index_of(symbol).ok_or_else(|| {
                LowerError::Invalid(format!("a library choice is bounded on '{symbol}', which is not a run-time dim"))
            })?;
            tests.push((i, bound));
        }
        tests.sort_unstable();
        Ok(match tests.is_empty() {
            true => "true".to_string(),
            false => tests.iter().map(|(i, v)| format!("dims.v[{i}] <= {v}")).collect::<Vec<_>>().join(" && "),
        })
    }

    /// Appends a kernel launch. `template` is the template stem (`conv2d_library`); the launcher
    /// is named `k<NNN>_<template>`. `context` gets `name` and `args` added.
    pub fn emit(
        &mut self,
        node: &str,
        template: &str,
        args: Vec<TensorId>,
        writes: Vec<usize>,
        context: Map<String, Json>,
        workspace_bytes: u64,
    ) -> LowerResult<()> {
        self.emit_kernel(node, template, args, writes, context, workspace_bytes).map(|_| ())
    }

    /// [`emit`](Self::emit) of a kernel without workspace whose computation the passes after
    /// lowering need to know (`fuse`): `facts` describes it.
    pub fn emit_with_facts(
        &mut self,
        node: &str,
        template: &str,
        args: Vec<TensorId>,
        writes: Vec<usize>,
        context: Map<String, Json>,
        facts: KernelFacts,
    ) -> LowerResult<()> {
        self.emit(node, template, args, writes, context, 0)?;
        self.set_facts(facts)
    }

    /// [`emit`](Self::emit), returning the new kernel.
    fn emit_kernel(
        &mut self,
        node: &str,
        template: &str,
        args: Vec<TensorId>,
        writes: Vec<usize>,
        mut context: Map<String, Json>,
        workspace_bytes: u64,
    ) -> LowerResult<&mut KernelInstance> {
        if let Err(why) = self.target.own_kernel(template) {
            return Err(LowerError::Unsupported(why));
        }
        let k = self.program.kernels.len();
        let name = format!("k{k:03}_{template}");
        let mut launcher_args = Vec::with_capacity(args.len());
        for (index, &t) in args.iter().enumerate() {
            let d = &self.program.tensors[t];
            launcher_args.push(LauncherArg {
                index,
                name: d.name.clone(),
                dtype: d.dtype,
                shape: self.shape_exprs(&d.shape)?,
                numel: self.numel_expr(&d.shape)?,
            });
        }
        context.insert("name".into(), json!(name));
        context.insert("args".into(), Json::Array(launcher_args.iter().map(LauncherArg::template_fields).collect()));
        self.program.kernels.push(KernelInstance {
            name,
            template: template.to_string(),
            node: node.to_string(),
            args,
            writes,
            workspace_bytes,
            flops: Dim::known(0),
            context,
            launcher_args,
            dispatch: Vec::new(),
            facts: KernelFacts::Opaque,
        });
        Ok(&mut self.program.kernels[k])
    }

    /// Sets the floating-point operations of the kernel emitted last (`flops`, in the node's
    /// dims: the compile-time ones are substituted here), for throughput reports; see
    /// [`Program::kernel_work`] for what each op family counts. Why after the emit: an op's
    /// lowering may emit helper kernels (layout changes, padding) before or after the one that
    /// computes, and only it knows which kernel does the arithmetic.
    pub fn set_flops(&mut self, flops: &Dim) -> LowerResult<()> {
        let bound = self.bind(flops);
        let k = self.program.kernels.last_mut().ok_or_else(|| {
            LowerError::Invalid("the work of a kernel was given before any kernel was emitted".into())
        })?;
        k.flops = bound;
        Ok(())
    }

    /// Records what a pass after lowering may rely on about the kernel emitted last (see
    /// [`KernelFacts`]), for kernels emitted through [`emit_instance`](Self::emit_instance).
    pub fn set_facts(&mut self, facts: KernelFacts) -> LowerResult<()> {
        let k = self
            .program
            .kernels
            .last_mut()
            .ok_or_else(|| LowerError::Invalid("kernel facts were given before any kernel was emitted".into()))?;
        k.facts = facts;
        Ok(())
    }

    /// Emits an elementwise conversion `dst = (dst type) src` of equal shapes.
    pub fn emit_cast(&mut self, node: &str, src: TensorId, dst: TensorId) -> LowerResult<()> {
        let mut c = Map::new();
        c.insert("n".into(), json!(self.numel_expr(&self.program.tensors[dst].shape.clone())?));
        c.insert("src_ctype".into(), json!(ctype(self.dtype(src))));
        c.insert("dst_ctype".into(), json!(ctype(self.dtype(dst))));
        self.emit_with_facts(node, "cast", vec![src, dst], vec![1], c, KernelFacts::Cast)
    }
}

/// Renders a dim as a C++ expression of type int64_t in the run-time dims: run-time dim `i` is
/// `dims.v[i]`, the launcher's `o2a_dims` argument.
pub fn dim_expr(d: &Dim, dims: &RunDims) -> LowerResult<String> {
    if let Some(v) = d.as_known() {
        return Ok(v.to_string());
    }
    let mut parts = Vec::new();
    for (mono, coeff) in d.terms() {
        let mut factors = Vec::new();
        for s in mono {
            let Some(i) = dims.index_of(s) else {
                return Err(LowerError::Unsupported(format!(
                    "dim {d} depends on '{s}', which is neither a run-time dim nor bound with --dim {s}=VALUE"
                )));
            };
            factors.push(format!("dims.v[{i}]"));
        }
        if coeff != 1 || factors.is_empty() {
            factors.insert(0, format!("(int64_t){coeff}"));
        }
        parts.push(factors.join("*"));
    }
    Ok(format!("({})", parts.join(" + ")))
}

/// The op registry lookup failed for these nodes: collected across the whole graph.
fn unsupported_error(path: &str, missing: BTreeMap<String, Vec<String>>) -> Error {
    Error::Unsupported {
        path: path.to_string(),
        ops: missing
            .into_iter()
            .map(|(op, nodes)| UnsupportedOp { domain: String::new(), op_type: format!("{op} (no GPU kernel)"), nodes })
            .collect(),
    }
}

/// A C identifier from the model file name (`resnet50.onnx` → `resnet50`).
fn model_name(source: &str) -> String {
    let stem = std::path::Path::new(source).file_stem().and_then(|s| s.to_str()).unwrap_or("model");
    let mut name: String = stem.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert_str(0, "m_");
    }
    name
}

/// The batch dim's name and range when a range gives it one (`--dim batch=1..8`): with every
/// symbolic dim of `g` either fixed (`fixed`) or given a range, the batch is the leading dim of
/// the first input, as `bind_dims` picks it. `None` when one dim is left free (that one is the
/// batch, `1..=max_batch`) or the leading dim has no range. Why: the batch ranges a target
/// chooses library instances for, the pricing batch and the memory checks must follow the
/// range the user gave, not `--max-batch`'s default.
pub fn ranged_batch(
    g: &Graph,
    fixed: &BTreeMap<String, i64>,
    ranges: &BTreeMap<String, (i64, i64)>,
) -> Option<(String, (i64, i64))> {
    let symbols: std::collections::BTreeSet<String> = g
        .values
        .iter()
        .filter_map(|v| v.ty.as_ref())
        .flat_map(|t| t.shape.iter().flat_map(|d| d.symbols().map(str::to_string).collect::<Vec<_>>()))
        .filter(|s| !is_data_dependent(s))
        .collect();
    if symbols.iter().any(|s| !fixed.contains_key(s) && !ranges.contains_key(s)) {
        return None;
    }
    let leading = g.inputs.first().and_then(|&v| g.values[v].ty.as_ref()?.shape.first().cloned())?;
    ranges.iter().find(|(s, _)| leading == Dim::sym((*s).clone())).map(|(s, &r)| (s.clone(), r))
}

/// Binds compile-time dims and finds the run-time ones: the symbols given a range, and at most
/// one more, the batch (`1..=max_batch`). They are numbered in order of first appearance in the
/// graph inputs' shapes, so the C API takes them in the order a reader of the model sees them.
pub(crate) fn bind_dims(g: &mut Graph, opts: &LowerOptions) -> Result<RunDims> {
    let path = g.info.source.clone();
    let mut symbols = std::collections::BTreeSet::new();
    for v in &mut g.values {
        if let Some(ty) = &mut v.ty {
            for d in &mut ty.shape {
                *d = d.eval(&opts.dims);
                symbols.extend(d.symbols().map(str::to_string));
            }
        }
    }
    if let Some(s) = symbols.iter().find(|s| is_data_dependent(s)) {
        return Err(data_dependent_error(g, s));
    }
    // First appearance in the inputs' shapes, then the rest by name.
    let mut order: Vec<String> = Vec::new();
    for &v in &g.inputs {
        for d in g.values[v].ty.iter().flat_map(|t| &t.shape) {
            for s in d.symbols() {
                if !order.iter().any(|o| o == s) {
                    order.push(s.to_string());
                }
            }
        }
    }
    order.extend(symbols.iter().filter(|s| !order.contains(s)).cloned().collect::<Vec<_>>());
    order.retain(|s| symbols.contains(s));
    let free: Vec<&String> = order.iter().filter(|s| !opts.ranges.contains_key(*s)).collect();
    if free.len() > 1 {
        let names: Vec<&str> = free.iter().map(|s| s.as_str()).collect();
        return Err(Error::model(
            &path,
            format!(
                "the model has {} symbolic dims without a value or range ({}); one can be the run-time batch, \
                 give the others a value or a run-time range with --dim NAME=VALUE or --dim NAME=MIN..MAX",
                free.len(),
                names.join(", ")
            ),
        ));
    }
    if !free.is_empty() && opts.max_batch < 1 {
        return Err(Error::model(&path, format!("--max-batch must be ≥ 1, found {}", opts.max_batch)));
    }
    let mut dims = Vec::new();
    for s in &order {
        let dim = match opts.ranges.get(s) {
            Some(&(min, max)) => RunDim::ranged(s, min, max),
            None => RunDim::free_batch(s, opts.max_batch),
        };
        if dim.min < 1 || dim.min > dim.max {
            return Err(Error::model(&path, format!("{}: a range needs 1 ≤ MIN ≤ MAX", dim.option)));
        }
        dims.push(dim);
    }
    let leading = g.inputs.first().and_then(|&v| g.values[v].ty.as_ref()?.shape.first().cloned());
    let batch = match free.first() {
        Some(s) => order.iter().position(|o| o == *s),
        None => order.iter().position(|o| leading.as_ref() == Some(&Dim::sym(o.clone()))),
    };
    Ok(RunDims { dims, batch })
}

/// Symbols inference made for dims it could not express in the model's own dims: named after a
/// value and axis (`y:0`) when they depend on run-time data, `?` or `overflow`.
fn is_data_dependent(s: &str) -> bool {
    s.contains(':') || s == "?" || s == "overflow"
}

/// The error for a shape that depends on run-time data, naming the first node (in graph order)
/// whose output has such a dim: the node that introduced it.
fn data_dependent_error(g: &Graph, symbol: &str) -> Error {
    let path = &g.info.source;
    let why = format!(
        "its output shape depends on run-time data ('{symbol}': computed from tensor values, not from the \
         input dims); code generation needs every shape to be a polynomial in the model's own dims (give \
         symbolic dims a value or a run-time range with --dim NAME=VALUE or --dim NAME=MIN..MAX)"
    );
    let producer = g.nodes.iter().find(|n| {
        n.outputs
            .iter()
            .any(|&v| g.values[v].ty.as_ref().is_some_and(|t| t.shape.iter().any(|d| d.symbols().any(|x| x == symbol))))
    });
    match producer {
        Some(n) => Error::node(path, &n.name, &n.op_type, why),
        None => Error::model(path, format!("a graph input's shape depends on run-time data ('{symbol}')")),
    }
}

/// Lowers an optimised kernel-level graph for `target`.
pub fn lower(graph: &Graph, target: &dyn Target, opts: &LowerOptions) -> Result<Program> {
    let mut g = graph.clone();
    let dims = bind_dims(&mut g, opts)?;
    let path = g.info.source.clone();
    let program = Program::empty(model_name(&path), path.clone(), dims);
    let mut cx = LowerCtx {
        graph: &g,
        target,
        program,
        value_tensor: vec![None; g.values.len()],
        bound: opts.dims.clone(),
        precision: opts.precision,
    };
    let node_err =
        |n: &Node, msg: String| Error::Node { path: path.clone(), node: n.name.clone(), op: n.op_type.clone(), msg };

    // Inputs: the caller's buffer, cast to the device dtype where they differ.
    let boundary = "graph inputs";
    for (index, &v) in g.inputs.iter().enumerate() {
        let (dtype, shape) = cx.value_shape(v).map_err(|e| lower_err(&path, boundary, e))?;
        let name = g.value(v).name.clone();
        let user = cx.push_tensor(&name, dtype, shape.clone(), Storage::Input { index });
        cx.program.inputs.push(IoTensor { name: name.clone(), dtype, shape: shape.clone(), tensor: user });
        let dev = cx.device_dtype(dtype).map_err(|e| lower_err(&path, boundary, e))?;
        let t = if dev == dtype {
            user
        } else {
            let t = cx.temp(&format!("{name}.device"), dev, shape);
            cx.emit_cast(boundary, user, t).map_err(|e| lower_err(&path, boundary, e))?;
            t
        };
        cx.value_tensor[v] = Some(t);
    }

    // Nodes, every failure collected.
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut errors = Vec::new();
    for node in &g.nodes {
        match ops::find(node).map(|spec| (spec.lower)(&mut cx, node)) {
            None => missing.entry(node.op.op_type().to_string()).or_default().push(node.name.clone()),
            Some(Ok(())) => {}
            Some(Err(LowerError::Unsupported(msg))) => {
                errors.push(node_err(node, format!("no GPU kernel for this case: {msg}")))
            }
            Some(Err(LowerError::Invalid(msg))) => errors.push(node_err(node, msg)),
        }
        // Later nodes must not read outputs a failed node never produced: give them placeholders.
        for &o in &node.outputs {
            if cx.value_tensor[o].is_none() {
                if let Ok((dt, shape)) = cx.value_shape(o) {
                    let t = cx.temp(&g.value(o).name.clone(), cx.device_dtype(dt).unwrap_or(dt), shape);
                    cx.value_tensor[o] = Some(t);
                }
            }
        }
    }
    if !missing.is_empty() {
        errors.insert(0, unsupported_error(&path, missing));
    }
    if !errors.is_empty() {
        return Err(if errors.len() == 1 { errors.remove(0) } else { Error::Many(errors) });
    }

    // Outputs: written in place when possible, else through a cast or copy kernel.
    let outputs_node = "graph outputs";
    for (index, &v) in g.outputs.iter().enumerate() {
        let (dtype, shape) = cx.value_shape(v).map_err(|e| lower_err(&path, outputs_node, e))?;
        let name = g.value(v).name.clone();
        let src = cx.value(v).map_err(|e| lower_err(&path, outputs_node, e))?;
        let in_place = matches!(cx.program.tensors[src].storage, Storage::Arena { .. })
            && cx.program.tensors[src].dtype == dtype
            && !cx.program.outputs.iter().any(|o| o.tensor == src);
        let t = if in_place {
            cx.program.tensors[src].storage = Storage::Output { index };
            src
        } else {
            let t = cx.push_tensor(&name, dtype, shape.clone(), Storage::Output { index });
            cx.emit_cast(outputs_node, src, t).map_err(|e| lower_err(&path, outputs_node, e))?;
            t
        };
        cx.program.outputs.push(IoTensor { name, dtype, shape, tensor: t });
    }

    let mut program = cx.program;
    fuse::fuse_program(&mut program);
    dead::remove_unread_kernels(&mut program);
    plan::plan_memory(&mut program);
    Ok(program)
}

/// An error at the graph boundary (the casts of inputs and outputs).
fn lower_err(path: &str, what: &str, e: LowerError) -> Error {
    let msg = match e {
        LowerError::Unsupported(m) => format!("no GPU kernel for this case: {m}"),
        LowerError::Invalid(m) => m,
    };
    Error::model(path, format!("{what}: {msg}"))
}

/// Template fields shared by the model-level templates (run sequence, header, metadata).
pub fn json_dims(p: &Program, shape: &[Dim]) -> Json {
    Json::Array(
        shape
            .iter()
            .map(|d| match d.as_known() {
                Some(v) => json!(v),
                None => json!(dim_expr(d, &p.dims).unwrap_or_else(|_| d.to_string())),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::kernel::{Act, Conv2d, ConvGeom, Gemm, Layout};
    use crate::lower::cuda::Arch;
    use crate::lower::cuda::CudaTarget;
    use crate::lower::ops::conv::tests::G;

    /// An `Expand` to a shape read from an input: the error names the node and its op.
    #[test]
    fn data_dependent_shapes_name_their_node() {
        use crate::ir::ops::testutil::GraphBuilder;
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "3,1");
        let shape = b.input("shape", DType::I64, "2");
        let y = b.node("Expand", vec![], &[x, shape], 1)[0];
        b.g.outputs.push(y);
        crate::ir::infer::infer_graph(&mut b.g).unwrap();
        let e = lower(&b.g, &CudaTarget::new(Arch::Sm90), &LowerOptions::default()).unwrap_err().to_string();
        assert!(e.contains("Expand_0") && e.contains("Expand") && e.contains("depends on run-time data"), "{e}");
    }

    #[test]
    fn precision_names_and_device_dtypes() {
        assert_eq!("fp32".parse::<Precision>(), Ok(Precision::Fp32));
        assert_eq!("FP16".parse::<Precision>(), Ok(Precision::Fp16));
        assert_eq!("float32".parse::<Precision>(), Ok(Precision::Fp32));
        assert!("bf16".parse::<Precision>().unwrap_err().contains("expected fp16 or fp32"));
        assert_eq!(Precision::default(), Precision::Fp16);
        assert_eq!(LowerOptions::default().precision, Precision::Fp16);
        assert_eq!(Precision::Fp32.to_string(), "fp32");
        for (dt, fp16, fp32) in [
            (DType::F32, DType::F16, DType::F32),
            (DType::F16, DType::F16, DType::F32),
            (DType::I64, DType::I64, DType::I64),
            (DType::Bool, DType::Bool, DType::Bool),
        ] {
            assert_eq!(Precision::Fp16.device_dtype(dt).unwrap(), fp16);
            assert_eq!(Precision::Fp32.device_dtype(dt).unwrap(), fp32);
        }
        assert_eq!(device_dtype(DType::F32).unwrap(), DType::F16, "the free function keeps the default");
        assert!(matches!(Precision::Fp32.device_dtype(DType::F64), Err(LowerError::Unsupported(_))));
    }

    /// A convolution and a classifier of an fp32 model: at fp16 the inputs and outputs are cast at
    /// the boundary and the target picks library instances; at fp32 nothing is cast, no
    /// instance is asked for, and every float tensor and weight is fp32.
    fn small_model() -> Graph {
        let mut b = G::new();
        let x = b.input("image", vec![Dim::sym("N"), Dim::known(16), Dim::known(16), Dim::known(32)]);
        let w = b.konst("w", &[32, 3, 3, 32], |i| (i % 5) as f32 * 0.1);
        let bias = b.konst("b", &[32], |_| 0.5);
        let geom = ConvGeom { strides: [1, 1], pads: [1; 4], dilations: [1, 1], group: 1 };
        let conv = Box::new(Conv2d { layout: Layout::Nhwc, geom, act: Some(Act::Relu), pre_act: None });
        let y = b.node("conv", conv, vec![Some(x), Some(w), Some(bias), None]);
        let f = b.input("features", vec![Dim::sym("N"), Dim::known(64)]);
        let fw = b.konst("fc.w", &[64, 16], |i| i as f32);
        let gemm = Box::new(Gemm { trans_a: false, trans_b: false, alpha: 1.0, beta: 1.0, act: None });
        let z = b.node("fc", gemm, vec![Some(f), Some(fw), None, None]);
        b.g.outputs = vec![y, z];
        b.g.info.source = "small.onnx".into();
        b.g
    }

    #[test]
    fn fp32_precision_keeps_floats_and_skips_the_library() {
        let g = small_model();
        let target = CudaTarget::new(Arch::Sm90).recording();
        let fp16 = lower(&g, &target, &LowerOptions::default()).expect("fp16 lowers");
        let templates = |p: &Program| p.kernels.iter().map(|k| k.template.clone()).collect::<Vec<_>>();
        assert!(templates(&fp16).iter().any(|t| t == "conv2d_library"), "{:?}", templates(&fp16));
        assert_eq!(templates(&fp16).iter().filter(|t| *t == "cast").count(), 4, "{:?}", templates(&fp16));
        assert!(!target.recorded().is_empty());

        let target = CudaTarget::new(Arch::Sm90).recording();
        let opts = LowerOptions { precision: Precision::Fp32, ..LowerOptions::default() };
        let fp32 = lower(&g, &target, &opts).expect("fp32 lowers");
        assert_eq!(templates(&fp32), ["conv2d_direct", "gemm_generic"]);
        assert!(target.recorded().is_empty(), "the target was asked for an instance");
        assert!(fp32.library.is_empty());
        assert_eq!(fp32.memory.workspace_bytes, 0);
        for t in &fp32.tensors {
            assert!(t.dtype == DType::F32, "{} is {}", t.name, t.dtype);
        }
        // The kernels read the caller's buffers and write the outputs in place.
        assert!(matches!(fp32.tensors[fp32.kernels[0].args[0]].storage, Storage::Input { index: 0 }));
        assert!(fp32.outputs.iter().all(|o| matches!(fp32.tensors[o.tensor].storage, Storage::Output { .. })));
        // fp32 weights: 32·3·3·32 + 32 + 64·16 floats, each tensor 256-byte aligned.
        let weights: u64 = fp32
            .tensors
            .iter()
            .filter_map(|t| match t.storage {
                Storage::Weight { bytes, .. } => Some(bytes),
                _ => None,
            })
            .sum();
        assert_eq!(weights, (32 * 9 * 32 + 32 + 64 * 16) * 4);
    }

    /// Whole models at fp32 precision, emulated on the CPU (`ops::shape::testing::emulate_on_cpu`:
    /// every CUDA thread a host thread): optimised as `compile` optimises them, lowered at fp32,
    /// every kernel run on seeded random inputs, and each output compared with the reference
    /// executor (fp32 outputs within 1e-4 + 1e-3·|expected|). The models: every bundled model
    /// (or `O2A_FP32_MODELS`, comma-separated paths) and light_resnet50 from the onnx wheel's test
    /// data, whose activations (up to 1e19) overflow fp16. A model the fp16 lowering rejects too
    /// is skipped. Needs g++ and the CUDA headers of the nvcc wheel (`scripts/setup-python.sh`).
    #[test]
    #[ignore = "emulates whole models on the CPU (minutes); needs g++ and the CUDA headers in .venv"]
    fn fp32_models_match_reference_in_cpu_emulation() {
        use crate::lower::ops::shape::testing::{emulate_on_cpu, write_program_case};
        let venv = std::fs::read_dir(".venv/lib").into_iter().flatten().flatten().map(|e| e.path());
        let site: Vec<std::path::PathBuf> = venv.map(|p| p.join("site-packages")).collect();
        let include = site
            .iter()
            .map(|p| p.join("nvidia/cu13/include"))
            .find(|p| p.join("cuda_fp16.h").is_file())
            .expect("the CUDA headers of the nvcc wheel (run scripts/setup-python.sh)");
        let mut models: Vec<std::path::PathBuf> = match std::env::var("O2A_FP32_MODELS") {
            Ok(list) => list.split(',').filter(|s| !s.is_empty()).map(std::path::PathBuf::from).collect(),
            Err(_) => {
                let mut m: Vec<_> = std::fs::read_dir("onnx_models").unwrap().flatten().map(|e| e.path()).collect();
                m.retain(|p| p.extension().is_some_and(|e| e == "onnx"));
                m.sort();
                m.extend(
                    site.iter()
                        .map(|p| p.join("onnx/backend/test/data/light/light_resnet50.onnx"))
                        .filter(|p| p.is_file())
                        .take(1),
                );
                m
            }
        };
        models.dedup();
        let root = std::env::temp_dir().join(format!("o2a-fp32-emulation-{}", std::process::id()));
        let optimize_opts = crate::egraph::OptimizeOptions::standard().unwrap();
        let fp32 = LowerOptions { precision: Precision::Fp32, max_batch: 4, ..LowerOptions::default() };
        let fp16 = LowerOptions { max_batch: 4, ..LowerOptions::default() };
        let (mut report, mut checked) = (Vec::new(), 0);
        for m in &models {
            let name = m.file_stem().unwrap().to_string_lossy().to_string();
            let Ok(g) = crate::onnx::load_model(m) else { continue };
            let Ok((opt, _)) = crate::egraph::optimize(&g, &optimize_opts) else { continue };
            let target = CudaTarget::new(Arch::Sm90).recording();
            let p = match lower(&opt, &target, &fp32) {
                Ok(p) => p,
                Err(e) => {
                    if lower(&opt, &CudaTarget::new(Arch::Sm90), &fp16).is_ok() {
                        report.push(format!("{name}: lowers at fp16 but not at fp32: {e}"));
                    } else {
                        eprintln!("skip {name}: {e}");
                    }
                    continue;
                }
            };
            assert!(target.recorded().is_empty(), "{name}: the target was asked for an instance at fp32");
            let mut opts = crate::validate::inputs::InputOptions { seed: 7, ..Default::default() };
            for &v in &g.inputs {
                for d in &g.ty(v).shape {
                    for s in d.symbols() {
                        opts.dims.insert(s.to_string(), 2);
                    }
                }
            }
            let Ok(inputs) = crate::validate::inputs::make_inputs(&g, &opts) else { continue };
            let feeds: BTreeMap<String, Tensor> = inputs.tensors.iter().cloned().collect();
            let expected = match crate::reference::run(&g, &feeds) {
                Ok(e) => e,
                Err(e) => {
                    eprintln!("skip {name}: reference fails: {e}");
                    continue;
                }
            };
            let outs: Vec<usize> = p.outputs.iter().map(|o| o.tensor).collect();
            let ins: Vec<Tensor> = inputs.tensors.iter().map(|(_, t)| t.clone()).collect();
            let case = root.join(&name);
            if let Err(e) = write_program_case(&case, &p, &outs, &inputs.dims, &ins, &expected) {
                report.push(format!("{name}: {e}"));
                continue;
            }
            checked += 1;
            match emulate_on_cpu(&case, &include) {
                Ok(out) if !out.is_empty() && out.lines().all(|l| l.starts_with("PASS")) => {
                    eprintln!("{name}: {} kernels\n{out}", p.kernels.len())
                }
                Ok(out) => report.push(format!("{name}:\n{out}")),
                Err(e) => report.push(format!("{name}: {e}")),
            }
        }
        let _ = std::fs::remove_dir_all(&root);
        assert!(checked > 0, "no model was checked");
        assert!(report.is_empty(), "{}", report.join("\n"));
    }
}
