//! Lowering: the optimiser's kernel-level graph becomes a [`Program`] — one kernel instance per
//! node over planned device tensors, with the weights converted and packed into one blob.
//!
//! What happens here, in order:
//! - dims: symbols bound with `--dim` are substituted; at most one symbol may remain, the run-time
//!   batch, and every dim must be a polynomial in it (kernels get shapes as C++ expressions in
//!   `batch`);
//! - inputs: a graph input whose ONNX dtype differs from its device dtype (fp32 → fp16) gets a
//!   cast kernel at the boundary; constants become weights (fp32 → fp16, in the blob) on first use;
//! - nodes: each is lowered by its family ([`ops`], one file per family, found through the
//!   family tables, not by a match on op names); a node no family lowers is reported with every
//!   other such node at once;
//! - outputs: the producing kernel writes the caller's buffer directly when the dtypes agree,
//!   otherwise a cast kernel does;
//! - memory: [`plan`] places every arena tensor by lifetime.
//!
//! The target (`Target`) is asked only where a library instance is chosen (conv, gemm); every
//! other kernel names a template family that each target provides.

pub mod cuda;
pub mod ops;
pub mod plan;
pub mod problem;
pub mod program;
pub mod target;
pub mod weights;

pub use problem::{BiasKind, ConvProblem, GemmProblem};
pub use program::{Batch, DeviceTensor, IoTensor, KernelInstance, MemoryPlan, Program, Storage, TensorId};
pub use target::{Instance, Target};

use crate::error::{Error, Result, UnsupportedOp};
use crate::ir::{DType, Dim, Graph, Node, Tensor, ValueId};
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

/// What the lowering needs besides the graph.
#[derive(Clone, Debug)]
pub struct LowerOptions {
    /// Values for symbolic dims that are fixed at compile time (`--dim seq=128`).
    pub dims: BTreeMap<String, i64>,
    /// The largest run-time batch (`--max-batch`), when the model has a symbolic batch dim.
    pub max_batch: i64,
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions { dims: BTreeMap::new(), max_batch: 64 }
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

/// The storage dtype of a tensor on the device: floats compute in fp16 (fp32 accumulation inside
/// kernels); integers and booleans keep their type.
pub fn device_dtype(dt: DType) -> LowerResult<DType> {
    match dt {
        DType::F32 | DType::F16 => Ok(DType::F16),
        DType::F64 | DType::BF16 => Err(LowerError::Unsupported(format!(
            "{dt} tensors have no GPU kernels (fp32 and fp16 models are supported)"
        ))),
        other => Ok(other),
    }
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
    batch_symbol: Option<String>,
}

impl<'a> LowerCtx<'a> {
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
        let dtype = device_dtype(k.dtype())?;
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
            device_dtype(dtype)?,
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
        let dtype = device_dtype(dtype)?;
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

    pub fn shape(&self, t: TensorId) -> &[Dim] {
        &self.program.tensors[t].shape
    }

    pub fn dtype(&self, t: TensorId) -> DType {
        self.program.tensors[t].dtype
    }

    /// A dim as a C++ expression in `batch` (`"802816"`, `"(batch*802816)"`).
    pub fn expr(&self, d: &Dim) -> LowerResult<String> {
        dim_expr(d, self.batch_symbol.as_deref())
    }

    /// Every dim of a shape as C++ expressions.
    pub fn shape_exprs(&self, shape: &[Dim]) -> LowerResult<Vec<String>> {
        shape.iter().map(|d| self.expr(d)).collect()
    }

    /// The element count of a shape as a C++ expression.
    pub fn numel_expr(&self, shape: &[Dim]) -> LowerResult<String> {
        self.expr(&crate::ir::dim::product(shape))
    }

    /// The value of a dim at the largest batch.
    pub fn at_max_batch(&self, d: &Dim) -> LowerResult<i64> {
        d.eval(&self.program.max_batch_env())
            .as_known()
            .ok_or_else(|| LowerError::Unsupported(format!("dim {d} is not a polynomial in the batch")))
    }

    /// Appends a kernel launch. `template` is the template stem (`conv2d_cutlass`); the launcher
    /// is named `k<NNN>_<template>`. `context` gets `name` and `args` added.
    pub fn emit(
        &mut self,
        node: &str,
        template: &str,
        args: Vec<TensorId>,
        writes: Vec<usize>,
        mut context: Map<String, Json>,
        workspace_bytes: u64,
    ) -> LowerResult<()> {
        let name = format!("k{:03}_{template}", self.program.kernels.len());
        let mut arg_json = Vec::new();
        for (i, &t) in args.iter().enumerate() {
            let d = &self.program.tensors[t];
            arg_json.push(json!({
                "index": i,
                "name": d.name,
                "ctype": ctype(d.dtype),
                "shape": self.shape_exprs(&d.shape)?,
                "numel": self.numel_expr(&d.shape)?,
            }));
        }
        context.insert("name".into(), json!(name));
        context.insert("args".into(), Json::Array(arg_json));
        self.program.kernels.push(KernelInstance {
            name,
            template: template.to_string(),
            node: node.to_string(),
            args,
            writes,
            workspace_bytes,
            context,
        });
        Ok(())
    }

    /// Emits an elementwise conversion `dst = (dst type) src` of equal shapes.
    pub fn emit_cast(&mut self, node: &str, src: TensorId, dst: TensorId) -> LowerResult<()> {
        let mut c = Map::new();
        c.insert("n".into(), json!(self.numel_expr(&self.program.tensors[dst].shape.clone())?));
        c.insert("src_ctype".into(), json!(ctype(self.dtype(src))));
        c.insert("dst_ctype".into(), json!(ctype(self.dtype(dst))));
        self.emit(node, "cast", vec![src, dst], vec![1], c, 0)
    }
}

/// Renders a dim as a C++ expression of type int64_t in the variable `batch`.
pub fn dim_expr(d: &Dim, batch: Option<&str>) -> LowerResult<String> {
    if let Some(v) = d.as_known() {
        return Ok(v.to_string());
    }
    let mut parts = Vec::new();
    for (mono, coeff) in d.terms() {
        let mut factors = Vec::new();
        for s in mono {
            if Some(s.as_str()) != batch {
                return Err(LowerError::Unsupported(format!(
                    "dim {d} depends on '{s}', which is neither the batch dim nor bound with --dim {s}=VALUE"
                )));
            }
            factors.push("batch".to_string());
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

/// Binds compile-time dims and finds the batch symbol: at most one symbol may remain.
fn bind_dims(g: &mut Graph, opts: &LowerOptions) -> Result<Option<Batch>> {
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
    let symbols: Vec<String> = symbols.into_iter().collect();
    match symbols.as_slice() {
        [] => Ok(None),
        [s] if s.contains(':') || s == "?" || s == "overflow" => Err(Error::model(
            &path,
            format!("a shape depends on run-time data ('{s}'); code generation needs shapes known up to the batch"),
        )),
        [s] => {
            if opts.max_batch < 1 {
                return Err(Error::model(&path, format!("--max-batch must be ≥ 1, found {}", opts.max_batch)));
            }
            Ok(Some(Batch { symbol: s.clone(), max: opts.max_batch }))
        }
        many => Err(Error::model(
            &path,
            format!(
                "the model has {} symbolic dims ({}); one can be the run-time batch, bind the others with --dim NAME=VALUE",
                many.len(),
                many.join(", ")
            ),
        )),
    }
}

/// Lowers an optimised kernel-level graph for `target`.
pub fn lower(graph: &Graph, target: &dyn Target, opts: &LowerOptions) -> Result<Program> {
    let mut g = graph.clone();
    let batch = bind_dims(&mut g, opts)?;
    let path = g.info.source.clone();
    let program = Program::empty(model_name(&path), path.clone(), batch.clone());
    let mut cx = LowerCtx {
        graph: &g,
        target,
        program,
        value_tensor: vec![None; g.values.len()],
        batch_symbol: batch.map(|b| b.symbol),
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
        let dev = device_dtype(dtype).map_err(|e| lower_err(&path, boundary, e))?;
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
                    let t = cx.temp(&g.value(o).name.clone(), device_dtype(dt).unwrap_or(dt), shape);
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
    let batch = p.batch.as_ref().map(|b| b.symbol.as_str());
    Json::Array(
        shape
            .iter()
            .map(|d| match d.as_known() {
                Some(v) => json!(v),
                None => json!(dim_expr(d, batch).unwrap_or_else(|_| d.to_string())),
            })
            .collect(),
    )
}
