//! GPU lowering of views and shape ops: Reshape, Flatten, Squeeze, Unsqueeze, Identity, Dropout
//! (inference), the optimiser's kernel-level `Flatten` and `ChannelView`, and the ops that
//! produce shapes or fills at run time (Shape, Size, ConstantOfShape, Range).
//!
//! A view costs nothing: on standard-layout (row-major, contiguous) tensors every op here that
//! only renames dims reinterprets the same bytes, so its output is an alias of its input
//! (`LowerCtx::alias_output`). Shape, Size and ConstantOfShape remain in an optimised graph only
//! when their result depends on the run-time batch (otherwise inference folded them), so their
//! kernels write values computed from the `batch` argument.
//!
//! The helpers at the top are shared with the indexing and misc families: reading compile-time
//! inputs, row-major strides, and the strided copy that Slice, Split, Expand and the depth/space
//! ops lower to.

use super::LowerSpec;
use crate::ir::dim::product;
use crate::ir::ops::cast::{DropoutOp, IdentityOp};
use crate::ir::ops::generator::{ConstantOfShape, Range};
use crate::ir::ops::kernel::{ChannelView, Flatten as KernelFlatten};
use crate::ir::ops::shape::{Flatten, Reshape, Shape, Size, Squeeze, Unsqueeze};
use crate::ir::{DType, Dim, Node, Tensor};
use crate::lower::{LowerCtx, LowerError, LowerResult, TensorId};
use crate::lower_unsupported;
use serde_json::{json, Map, Value as Json};

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<KernelFlatten>("Flatten", lower_view),
    LowerSpec::of::<ChannelView>("ChannelView", lower_view),
    LowerSpec::of::<Reshape>("Reshape", lower_view),
    LowerSpec::of::<Flatten>("Flatten", lower_view),
    LowerSpec::of::<Squeeze>("Squeeze", lower_view),
    LowerSpec::of::<Unsqueeze>("Unsqueeze", lower_view),
    LowerSpec::of::<IdentityOp>("Identity", lower_view),
    LowerSpec::of::<DropoutOp>("Dropout", lower_dropout),
    LowerSpec::of::<Shape>("Shape", lower_shape),
    LowerSpec::of::<Size>("Size", lower_size),
    LowerSpec::of::<ConstantOfShape>("ConstantOfShape", lower_constant_of_shape),
    LowerSpec::of::<Range>("Range", lower_range),
];

// ---------------------------------------------------------------------------------------------
// Helpers shared by the data-movement families.

/// The node's op as its IR struct (the lookup already matched the type, so a mismatch is a bug).
pub(crate) fn op_of<T: 'static>(node: &Node) -> LowerResult<&T> {
    node.op.as_any().downcast_ref::<T>().ok_or_else(|| {
        LowerError::Invalid(format!("node '{}' does not hold a {}", node.name, std::any::type_name::<T>()))
    })
}

/// Every dim of `dims` as a C++ expression in `batch`.
pub(crate) fn exprs(cx: &LowerCtx, dims: &[Dim]) -> LowerResult<Vec<String>> {
    dims.iter().map(|d| cx.expr(d)).collect()
}

/// Template fields from a JSON object literal.
pub(crate) fn fields(v: Json) -> Map<String, Json> {
    match v {
        Json::Object(m) => m,
        _ => Map::new(),
    }
}

/// The contents of a small integer input known at compile time: a constant, or the symbolic
/// contents inference attached to a shape tensor (`[N, -1]`).
pub(crate) fn input_dims(cx: &LowerCtx, node: &Node, i: usize) -> Option<Vec<Dim>> {
    let v = (*node.inputs.get(i)?)?;
    let val = cx.graph.value(v);
    if let Some(s) = &val.sym {
        return Some(s.clone());
    }
    let k = val.konst.as_ref()?;
    if k.dtype().is_float() || k.rank() > 1 {
        return None;
    }
    Some(k.to_i64_vec().into_iter().map(Dim::known).collect())
}

/// Like [`input_dims`] for values that must be plain integers (axes, steps, pads).
pub(crate) fn input_ints(cx: &LowerCtx, node: &Node, i: usize) -> Option<Vec<i64>> {
    input_dims(cx, node, i)?.iter().map(Dim::as_known).collect()
}

/// The inferred shape of node output `i` (dims bound as the lowering bound them), for
/// lowerings that decide between a view and a kernel before creating the output.
pub(crate) fn output_shape(cx: &LowerCtx, node: &Node, i: usize) -> LowerResult<Vec<Dim>> {
    let v = *node.outputs.get(i).ok_or_else(|| LowerError::Invalid(format!("output {i} is missing")))?;
    let val = cx.graph.value(v);
    val.ty
        .as_ref()
        .map(|t| t.shape.clone())
        .ok_or_else(|| LowerError::Invalid(format!("value '{}' has no inferred type", val.name)))
}

pub(crate) use crate::ir::dim::row_major_strides;

/// An f32 parameter table packed into the weights blob bit for bit: the blob stores float
/// tensors as fp16, but per-channel scales, resize weights and the like are kept in f32 so the
/// kernels compute exactly what the reference computes. Kernels read the int32 words as floats.
pub(crate) fn f32_table(cx: &mut LowerCtx, name: &str, values: &[f32]) -> LowerResult<TensorId> {
    let bits: Vec<i32> = values.iter().map(|v| v.to_bits() as i32).collect();
    let t = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[bits.len()]), bits)
        .map_err(|e| LowerError::Invalid(format!("internal: {e}")))?;
    cx.add_weight(name, &Tensor::I32(t))
}

/// A one-element weight holding `value` converted to `dtype` (fill values of Pad, Dropout's
/// mask): the kernels read it through a pointer, which keeps them generic over the dtype.
pub(crate) fn scalar_weight(cx: &mut LowerCtx, name: &str, dtype: DType, value: f64) -> LowerResult<TensorId> {
    cx.add_weight(name, &Tensor::full(dtype, &[1], value))
}

/// One output axis of a strided read: its extent and the input element stride it advances by.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StridedAxis {
    pub len: Dim,
    pub stride: Dim,
}

/// Drops unit axes and merges neighbours that walk the input contiguously, so kernels index
/// with as few divisions as possible. At least one axis remains.
pub(crate) fn coalesce(axes: Vec<StridedAxis>) -> Vec<StridedAxis> {
    let one = Dim::known(1);
    let mut out: Vec<StridedAxis> = Vec::new();
    for a in axes.into_iter().rev().filter(|a| a.len != one) {
        if let Some(inner) = out.last_mut() {
            if a.stride == inner.stride.mul(&inner.len) {
                inner.len = a.len.mul(&inner.len);
                continue;
            }
        }
        out.push(a);
    }
    out.reverse();
    if out.is_empty() {
        out.push(StridedAxis { len: one, stride: Dim::known(0) });
    }
    out
}

/// Output `out_index` of `node` reads `src[base + Σ coord_d · stride_d]` over the output axes
/// `axes` (whose extents multiply to the output's element count). A read that is the whole
/// input in order becomes a view; anything else is one `strided_copy` kernel.
pub(crate) fn emit_strided_copy(
    cx: &mut LowerCtx,
    node: &Node,
    src: TensorId,
    out_index: usize,
    base: Dim,
    axes: Vec<StridedAxis>,
) -> LowerResult<()> {
    let axes = coalesce(axes);
    let src_numel = product(cx.shape(src));
    let whole = base == Dim::known(0) && axes.len() == 1 && axes[0].stride == Dim::known(1) && axes[0].len == src_numel;
    if whole {
        cx.alias_output(node, out_index, src)?;
        return Ok(());
    }
    let out = cx.output(node, out_index)?;
    let n = product(&axes.iter().map(|a| a.len.clone()).collect::<Vec<_>>());
    let dims: Vec<String> = axes.iter().map(|a| cx.expr(&a.len)).collect::<LowerResult<_>>()?;
    let strides: Vec<String> = axes.iter().map(|a| cx.expr(&a.stride)).collect::<LowerResult<_>>()?;
    let c = fields(json!({
        "n": cx.expr(&n)?,
        "rank": axes.len(),
        "dims": dims,
        "strides": strides,
        "base": cx.expr(&base)?,
        "ctype": crate::lower::ctype(cx.dtype(src)),
    }));
    cx.emit(&node.name, "strided_copy", vec![src, out], vec![1], c, 0)
}

// ---------------------------------------------------------------------------------------------
// Views

/// Reshape, Flatten, Squeeze, Unsqueeze, Identity and the kernel-level Flatten/ChannelView:
/// the output is the input's bytes under another shape.
fn lower_view(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    cx.alias_output(node, 0, x)?;
    Ok(())
}

/// Dropout in inference: output 0 is a view of the input; the optional mask is a fill of
/// `true` (opset 12+, bool), `false` (opsets 10-11, bool) or 0 of the input's type (before 10),
/// exactly as the IR op's reference says.
fn lower_dropout(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<DropoutOp>(node)?;
    let x = cx.input(node, 0)?;
    cx.alias_output(node, 0, x)?;
    if op.outputs == 2 && node.outputs.len() == 2 {
        let mask = cx.output(node, 1)?;
        let value = scalar_weight(
            cx,
            &format!("{}.mask_value", node.name),
            cx.dtype(mask),
            f64::from(u8::from(op.mask_value)),
        )?;
        emit_fill(cx, node, value, mask)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Fills

/// `out[i] = value[0]` over the whole output.
fn emit_fill(cx: &mut LowerCtx, node: &Node, value: TensorId, out: TensorId) -> LowerResult<()> {
    let c = fields(json!({
        "n": cx.numel_expr(cx.shape(out))?,
        "ctype": crate::lower::ctype(cx.dtype(out)),
    }));
    cx.emit(&node.name, "fill", vec![value, out], vec![1], c, 0)
}

/// ConstantOfShape: the output's shape is known up to the batch (inference resolved the shape
/// input), so the shape tensor itself is not read; the kernel fills with the `value` attribute.
fn lower_constant_of_shape(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<ConstantOfShape>(node)?;
    let out = cx.output(node, 0)?;
    let value = cx.add_weight(&format!("{}.value", node.name), &op.value)?;
    emit_fill(cx, node, value, out)
}

// ---------------------------------------------------------------------------------------------
// Shape / Size

/// Writes `values` (C++ expressions in `batch`) into the int64 output.
fn emit_values(cx: &mut LowerCtx, node: &Node, values: &[Dim]) -> LowerResult<()> {
    let out = cx.output(node, 0)?;
    if cx.dtype(out) != DType::I64 {
        return Err(LowerError::Invalid(format!("{} output must be int64, found {}", node.op_type, cx.dtype(out))));
    }
    let exprs: Vec<String> = values.iter().map(|d| cx.expr(d)).collect::<LowerResult<_>>()?;
    if exprs.is_empty() {
        // An empty shape slice: nothing to write.
        return Ok(());
    }
    let c = fields(json!({ "count": exprs.len(), "values": exprs }));
    cx.emit(&node.name, "shape_values", vec![out], vec![0], c, 0)
}

/// Shape (opset 15 `start`/`end` clamped to `[0, rank]` like the spec): the input's dims, which
/// are constants or polynomials in the batch.
fn lower_shape(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = op_of::<Shape>(node)?;
    let x = cx.input(node, 0)?;
    let shape = cx.shape(x).to_vec();
    let r = shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let s = clamp(op.start);
    let e = clamp(op.end.unwrap_or(r)).max(s);
    emit_values(cx, node, &shape[s..e])
}

/// Size: the input's element count.
fn lower_size(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let x = cx.input(node, 0)?;
    let n = product(cx.shape(x));
    emit_values(cx, node, &[n])
}

// ---------------------------------------------------------------------------------------------
// Range

/// The C++ spelling of an f32 constant, exact for every value (inf and NaN included).
pub(crate) fn f32_literal(v: f32) -> String {
    format!("__uint_as_float(0x{:08x}u)", v.to_bits())
}

/// Range: `out[i] = start + i·delta`, the length known up to the batch. Integer ranges are
/// computed exactly in int64 per element. Float ranges accumulate `v += delta` in f32 like the
/// reference (and ONNX Runtime), so one thread walks the sequence; constant float bounds are
/// baked in as exact f32 literals (run-time ones arrive as fp16 device values).
fn lower_range(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let out = cx.output(node, 0)?;
    let dtype = cx.dtype(out);
    let float = dtype.is_float();
    if !float && !matches!(dtype, DType::I16 | DType::I32 | DType::I64) {
        lower_unsupported!("Range of {dtype}");
    }
    let start = cx.input(node, 0)?;
    let delta = cx.input(node, 2)?;
    let konst_f32 = |cx: &LowerCtx, i: usize| -> Option<f32> {
        let k = cx.konst(node, i)?;
        k.dtype().is_float().then(|| k.to_f32().iter().next().copied()).flatten()
    };
    let read = |cx: &LowerCtx, t: TensorId, slot: &str| {
        let acc = if float { "float" } else { "int64_t" };
        format!("({acc})static_cast<const {}*>({slot})[0]", crate::lower::ctype(cx.dtype(t)))
    };
    let (start_expr, delta_expr) = if float {
        (
            konst_f32(cx, 0).map(f32_literal).unwrap_or_else(|| read(cx, start, "start_p")),
            konst_f32(cx, 2).map(f32_literal).unwrap_or_else(|| read(cx, delta, "delta_p")),
        )
    } else {
        (read(cx, start, "start_p"), read(cx, delta, "delta_p"))
    };
    let c = fields(json!({
        "n": cx.numel_expr(cx.shape(out))?,
        "ctype": crate::lower::ctype(dtype),
        "float": float,
        "start": start_expr,
        "delta": delta_expr,
    }));
    cx.emit(&node.name, "range", vec![start, delta, out], vec![2], c, 0)
}

// ---------------------------------------------------------------------------------------------
// Test support shared by the data-movement families' tests.

#[cfg(test)]
pub(crate) mod testing {
    use crate::ir::{Graph, Tensor};
    use crate::lower::ops::LowerSpec;
    use crate::lower::{
        problem::{ConvProblem, GemmProblem},
        Instance, KernelInstance, LowerCtx, LowerError, Program, RunDims, Storage, Target,
    };
    use handlebars::Handlebars;
    use std::collections::BTreeSet;

    /// A target for tests of families that never ask for a library instance.
    pub struct NoLibraryTarget;

    impl Target for NoLibraryTarget {
        fn name(&self) -> &'static str {
            "cuda"
        }
        fn arch_name(&self) -> String {
            "sm_90".into()
        }
        fn warp_size(&self) -> i64 {
            32
        }
        fn conv2d(&self, _p: &ConvProblem) -> Instance {
            panic!("the data-movement families never ask for a conv instance")
        }
        fn gemm(&self, _p: &GemmProblem) -> Instance {
            panic!("the data-movement families never ask for a gemm instance")
        }
        fn conv_channel_multiple(&self) -> usize {
            8
        }
    }

    /// The data-movement families' tables (the lead's registry may not list them yet).
    pub fn tables() -> Vec<&'static [LowerSpec]> {
        vec![super::OPS, crate::lower::ops::indexing::OPS, crate::lower::ops::misc::OPS]
    }

    /// Lowers an inferred graph with this session's tables only: inputs get their device dtype
    /// (the GPU check below converts on upload, standing in for the boundary casts), outputs are
    /// not bound. Fails with the first node's error.
    pub fn lower(g: &Graph) -> Result<Program, String> {
        lower_with_outputs(g).map(|(p, _)| p)
    }

    /// [`lower`] at a given storage precision.
    pub fn lower_at(g: &Graph, precision: crate::lower::Precision) -> Result<Program, String> {
        lower_with_outputs_at(g, precision).map(|(p, _)| p)
    }

    /// [`lower`] plus the device tensor of every graph output.
    pub fn lower_with_outputs(g: &Graph) -> Result<(Program, Vec<usize>), String> {
        lower_with_outputs_at(g, crate::lower::Precision::Fp16)
    }

    /// [`lower_with_outputs`] at a given storage precision.
    pub fn lower_with_outputs_at(
        g: &Graph,
        precision: crate::lower::Precision,
    ) -> Result<(Program, Vec<usize>), String> {
        let batch_symbol = g
            .inputs
            .iter()
            .flat_map(|&v| g.value(v).ty.as_ref().map(|t| t.shape.clone()).unwrap_or_default())
            .flat_map(|d| d.symbols().map(str::to_string).collect::<Vec<_>>())
            .next();
        let program = Program::empty(
            "test".into(),
            "test.onnx".into(),
            batch_symbol.as_deref().map_or_else(RunDims::none, |s| RunDims::batch_only(s, 8)),
        );
        let mut cx = LowerCtx {
            graph: g,
            target: &NoLibraryTarget,
            program,
            value_tensor: vec![None; g.values.len()],
            bound: Default::default(),
            precision,
        };
        for (index, &v) in g.inputs.iter().enumerate() {
            let (dtype, shape) = cx.value_shape(v).map_err(err)?;
            let dtype = precision.device_dtype(dtype).map_err(err)?;
            let t = cx.push_tensor(&g.value(v).name.clone(), dtype, shape, Storage::Input { index });
            cx.value_tensor[v] = Some(t);
        }
        for node in &g.nodes {
            let spec = tables()
                .into_iter()
                .flat_map(|t| t.iter())
                .find(|s| s.op_type == node.op.op_type() && (s.is)(node.op.as_any()))
                .ok_or_else(|| format!("no lowering for {}", node.op.op_type()))?;
            (spec.lower)(&mut cx, node).map_err(err)?;
        }
        let mut outputs = Vec::new();
        for &v in &g.outputs {
            outputs.push(cx.value(v).map_err(err)?);
        }
        Ok((cx.program, outputs))
    }

    /// Lowers the nodes of `g` these families handle, giving the outputs of every other node a
    /// placeholder tensor (as the lowering does after a failed node); returns one line per
    /// lowered node that failed, and the templates of the kernels emitted.
    pub fn lower_ours(g: &Graph) -> (Vec<String>, Vec<String>) {
        let mut g = g.clone();
        let dims = crate::lower::bind_dims(&mut g, &crate::lower::LowerOptions::default()).unwrap_or_default();
        let program = Program::empty("test".into(), "test.onnx".into(), dims);
        let mut cx = LowerCtx {
            graph: &g,
            target: &NoLibraryTarget,
            program,
            value_tensor: vec![None; g.values.len()],
            bound: Default::default(),
            precision: crate::lower::Precision::Fp16,
        };
        let placeholder = |cx: &mut LowerCtx, v: usize| {
            if let Ok((dt, shape)) = cx.value_shape(v) {
                let t = cx.temp(&g.value(v).name.clone(), crate::lower::device_dtype(dt).unwrap_or(dt), shape);
                cx.value_tensor[v] = Some(t);
            }
        };
        for &v in &g.inputs {
            placeholder(&mut cx, v);
        }
        let mut errors = Vec::new();
        for node in &g.nodes {
            let spec = tables()
                .into_iter()
                .flat_map(|t| t.iter())
                .find(|s| s.op_type == node.op.op_type() && (s.is)(node.op.as_any()));
            if let Some(spec) = spec {
                if let Err(e) = (spec.lower)(&mut cx, node) {
                    errors.push(format!("{} ({}): {}", node.name, node.op.op_type(), err(e)));
                }
            }
            for &o in &node.outputs {
                if cx.value_tensor[o].is_none() {
                    placeholder(&mut cx, o);
                }
            }
        }
        (errors, cx.program.kernels.iter().map(|k| k.template.clone()).collect())
    }

    fn err(e: LowerError) -> String {
        match e {
            LowerError::Unsupported(m) => format!("unsupported: {m}"),
            LowerError::Invalid(m) => format!("invalid: {m}"),
        }
    }

    /// The kernel templates of the CUDA target, registered as codegen registers them.
    pub fn templates() -> Handlebars<'static> {
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        for (path, text) in crate::codegen::TEMPLATE_FILES {
            let Some(rel) = path.strip_prefix("cuda/") else { continue };
            let name = rel.strip_suffix(".hbs").unwrap_or(rel);
            let name = name.strip_prefix("partials/").unwrap_or(name);
            hb.register_template_string(name, *text).unwrap_or_else(|e| panic!("templates/{path}: {e}"));
        }
        hb
    }

    /// Renders one kernel as codegen does (context + `node` + `workspace_bytes`).
    pub fn render(hb: &Handlebars<'static>, k: &KernelInstance) -> String {
        let mut ctx = k.context.clone();
        ctx.insert("node".into(), serde_json::json!(k.node));
        ctx.insert("workspace_bytes".into(), serde_json::json!(k.workspace_bytes));
        hb.render(&format!("kernels/{}.cu", k.template), &serde_json::Value::Object(ctx))
            .unwrap_or_else(|e| panic!("{} ({}): {e}", k.name, k.template))
    }

    /// Renders every kernel of `p`; when `O2A_RENDER_DIR` is set the files are also written
    /// there (one per kernel, named `<test>_<kernel>.cu`) for compiling by hand with nvcc.
    pub fn render_all(tag: &str, p: &Program) -> Vec<String> {
        let hb = templates();
        let dir = std::env::var_os("O2A_RENDER_DIR").map(std::path::PathBuf::from);
        if let Some(d) = &dir {
            // The shared header, so the files compile on their own.
            std::fs::create_dir_all(d).expect("render dir");
            match hb.render("common.cuh", &serde_json::json!({ "model_name": "test" })) {
                Ok(text) => std::fs::write(d.join("common.cuh"), text).expect("write common.cuh"),
                Err(e) => eprintln!("common.cuh does not render yet: {e}"),
            }
        }
        let mut seen = BTreeSet::new();
        p.kernels
            .iter()
            .map(|k| {
                let text = render(&hb, k);
                assert!(text.contains(&format!("int {}(void* const* t, o2a_dims dims", k.name)), "{text}");
                if let Some(d) = &dir {
                    std::fs::create_dir_all(d).expect("render dir");
                    seen.insert(k.template.clone());
                    std::fs::write(d.join(format!("{tag}_{}.cu", k.name)), &text).expect("write rendered kernel");
                }
                text
            })
            .collect()
    }

    /// Writes a self-contained GPU check of `g` into `dir`: every kernel, `common.cuh`, the
    /// weights, the inputs in their device dtypes (fp32 rounded to fp16, as the boundary casts
    /// do), the expected outputs and `driver.cu`, which runs the kernels in order with the batch
    /// of `env` and prints one PASS/FAIL line per graph output (see [`write_program_case`]).
    pub fn write_gpu_case(
        dir: &std::path::Path,
        g: &Graph,
        env: &std::collections::BTreeMap<String, i64>,
        feeds: &[(String, Tensor)],
        expected: &[(String, Tensor)],
    ) -> Result<(), String> {
        let (p, outs) = lower_with_outputs(g)?;
        let mut inputs = Vec::with_capacity(feeds.len());
        for (_, t) in feeds {
            inputs.push(t.cast(crate::lower::device_dtype(t.dtype()).map_err(err)?));
        }
        write_program_case(dir, &p, &outs, env, &inputs, expected)
    }

    /// Writes a self-contained GPU check of the lowered program `p` into `dir`: every kernel,
    /// `common.cuh`, the weights, `inputs[i]` (the bytes of the `Storage::Input { index: i }`
    /// tensor, already in its dtype), the expected values of the tensors `outs` and
    /// `driver.cu`, which runs the kernels in order with the run-time dims of `env` and prints one
    /// PASS/FAIL line per output: fp16 outputs within `2e-2 + 2e-2·|expected|`, fp32 outputs
    /// within `1e-4 + 1e-3·|expected|`, every other dtype bit-exact.
    pub fn write_program_case(
        dir: &std::path::Path,
        p: &Program,
        outs: &[usize],
        env: &std::collections::BTreeMap<String, i64>,
        inputs: &[Tensor],
        expected: &[(String, Tensor)],
    ) -> Result<(), String> {
        use crate::ir::DType;
        use std::fmt::Write as _;
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let hb = templates();
        let common =
            hb.render("common.cuh", &serde_json::json!({ "model_name": "check" })).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("common.cuh"), common).map_err(|e| e.to_string())?;
        for k in &p.kernels {
            std::fs::write(dir.join(format!("{}.cu", k.name)), render(&hb, k)).map_err(|e| e.to_string())?;
        }
        std::fs::write(dir.join("weights.bin"), &p.weights).map_err(|e| e.to_string())?;
        let bytes_of = |t: usize| -> u64 {
            let d = &p.tensors[t];
            let n: i64 = d.shape.iter().map(|x| x.eval(env).as_known().unwrap_or(0)).product();
            n.max(0) as u64 * d.dtype.size_bytes() as u64
        };
        for (i, t) in inputs.iter().enumerate() {
            std::fs::write(dir.join(format!("in{i}.bin")), crate::lower::weights::to_le_bytes(t))
                .map_err(|e| e.to_string())?;
        }
        for (j, (_, t)) in expected.iter().enumerate() {
            let t = if t.dtype().is_float() { t.cast(DType::F32) } else { t.clone() };
            std::fs::write(dir.join(format!("exp{j}.bin")), crate::lower::weights::to_le_bytes(&t))
                .map_err(|e| e.to_string())?;
        }
        // The run-time dims' values: from `env`, else 1.
        let values: Vec<String> =
            p.dims.dims.iter().map(|d| env.get(&d.symbol).copied().unwrap_or(1).to_string()).collect();
        let mut d = String::new();
        let w = &mut d;
        let _ = writeln!(w, "#include \"common.cuh\"\n#include <cstdio>\n#include <cstdlib>\n#include <cstring>\n#include <cstdarg>\n#include <cmath>\n#include <vector>\n#include <string>");
        for k in &p.kernels {
            let _ = writeln!(
                w,
                "int {}(void* const* t, o2a_dims dims, void* workspace, size_t workspace_bytes, cudaStream_t stream);",
                k.name
            );
        }
        let _ = writeln!(
            w,
            r#"void o2a_set_error(const char* fmt, ...) {{ va_list ap; va_start(ap, fmt); vfprintf(stderr, fmt, ap); va_end(ap); fputc('\n', stderr); }}
static std::vector<char> slurp(const std::string& path) {{
  std::vector<char> v; FILE* f = fopen(path.c_str(), "rb"); if (!f) {{ fprintf(stderr, "cannot open %s\n", path.c_str()); exit(3); }}
  char buf[65536]; size_t n; while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n); fclose(f); return v;
}}
static void* upload(const std::vector<char>& v, size_t bytes) {{
  void* p = nullptr; cudaMalloc(&p, bytes > 0 ? bytes : 1); if (!v.empty()) cudaMemcpy(p, v.data(), v.size(), cudaMemcpyHostToDevice); return p;
}}
static void* arena(size_t bytes) {{ void* p = nullptr; cudaMalloc(&p, bytes > 0 ? bytes : 1); cudaMemset(p, 0xff, bytes > 0 ? bytes : 1); return p; }}
// mode 1: fp16 output, 2: fp32 output (both against fp32 expectations), 0: bit-exact.
static int check(const char* name, const void* dev, size_t bytes, int mode, const std::string& exp_path) {{
  std::vector<char> got(bytes); if (bytes) cudaMemcpy(got.data(), dev, bytes, cudaMemcpyDeviceToHost);
  std::vector<char> exp = slurp(exp_path);
  if (mode == 2) {{
    size_t n = bytes / 4; if (exp.size() != n * 4) {{ printf("FAIL %s: size %zu vs expected %zu\n", name, n, exp.size() / 4); return 1; }}
    double worst = 0; size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; ++i) {{
      float e, a; memcpy(&e, exp.data() + 4 * i, 4); memcpy(&a, got.data() + 4 * i, 4);
      if (std::isnan(e) && std::isnan(a)) continue;
      if (std::isinf(e) && a == e) continue;
      double err = fabs((double)a - (double)e), lim = 1e-4 + 1e-3 * fabs((double)e);
      if (!(err <= lim)) {{ if (bad == 0) at = i; ++bad; }}
      if (err > worst || std::isnan(err)) worst = err;
    }}
    if (bad) {{ float e, a; memcpy(&e, exp.data() + 4 * at, 4); memcpy(&a, got.data() + 4 * at, 4);
      printf("FAIL %s: %zu of %zu differ, first at %zu: %g vs %g\n", name, bad, n, at, a, e); return 1; }}
    printf("PASS %s: %zu values, max abs err %g\n", name, n, worst); return 0;
  }}
  if (mode == 1) {{
    size_t n = bytes / 2; if (exp.size() != n * 4) {{ printf("FAIL %s: size %zu vs expected %zu\n", name, n, exp.size() / 4); return 1; }}
    double worst = 0; size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; ++i) {{
      float e; memcpy(&e, exp.data() + 4 * i, 4); half h; memcpy(&h, got.data() + 2 * i, 2); float a = __half2float(h);
      if (std::isnan(e) && std::isnan(a)) continue;
      double err = fabs((double)a - (double)e), lim = 2e-2 + 2e-2 * fabs((double)e);
      if (!(err <= lim)) {{ if (bad == 0) at = i; ++bad; }}
      if (err > worst || std::isnan(err)) worst = err;
    }}
    if (bad) {{ float e; memcpy(&e, exp.data() + 4 * at, 4); half h; memcpy(&h, got.data() + 2 * at, 2);
      printf("FAIL %s: %zu of %zu differ, first at %zu: %g vs %g\n", name, bad, n, at, __half2float(h), e); return 1; }}
    printf("PASS %s: %zu values, max abs err %g\n", name, n, worst); return 0;
  }}
  if (exp.size() != bytes) {{ printf("FAIL %s: %zu bytes vs expected %zu\n", name, bytes, exp.size()); return 1; }}
  size_t bad = 0, at = 0; for (size_t i = 0; i < bytes; ++i) if (got[i] != exp[i]) {{ if (!bad) at = i; ++bad; }}
  if (bad) {{ printf("FAIL %s: %zu bytes differ, first at byte %zu\n", name, bad, at); return 1; }}
  printf("PASS %s: %zu bytes exact\n", name, bytes); return 0;
}}
int main(int argc, char** argv) {{
  std::string dir = argc > 1 ? argv[1] : ".";
  std::vector<char> wb = slurp(dir + "/weights.bin");
  char* weights = static_cast<char*>(upload(wb, wb.size()));
  std::vector<void*> t({nt});
  o2a_dims dims{{}};
  {set_dims}"#,
            nt = p.tensors.len(),
            set_dims =
                values.iter().enumerate().map(|(i, v)| format!("dims.v[{i}] = {v};")).collect::<Vec<_>>().join(" ")
        );
        for (i, tensor) in p.tensors.iter().enumerate() {
            let line = match tensor.storage {
                Storage::Input { index } => {
                    format!("t[{i}] = upload(slurp(dir + \"/in{index}.bin\"), {});", bytes_of(i))
                }
                Storage::Weight { offset, .. } => format!("t[{i}] = weights + {offset};"),
                Storage::Alias { of } => format!("t[{i}] = t[{of}];"),
                Storage::Arena { .. } | Storage::Output { .. } => format!("t[{i}] = arena({});", bytes_of(i)),
            };
            let _ = writeln!(w, "  {line}");
        }
        for k in &p.kernels {
            let args: Vec<String> = k.args.iter().map(|a| format!("t[{a}]")).collect();
            let _ = writeln!(
                w,
                "  {{ void* a[] = {{{}}}; if ({}(a, dims, nullptr, 0, 0) != 0) {{ printf(\"FAIL launch {}\\n\"); return 1; }} }}",
                args.join(", "),
                k.name,
                k.name
            );
        }
        let _ = writeln!(
            w,
            "  cudaError_t e = cudaDeviceSynchronize(); if (e != cudaSuccess) {{ printf(\"FAIL cuda: %s\\n\", cudaGetErrorString(e)); return 1; }}\n  int failed = 0;"
        );
        for (j, &o) in outs.iter().enumerate() {
            let mode = match p.tensors[o].dtype {
                DType::F16 => 1,
                DType::F32 => 2,
                _ => 0,
            };
            let name = &expected[j].0;
            let _ =
                writeln!(w, "  failed += check(\"{name}\", t[{o}], {}, {mode}, dir + \"/exp{j}.bin\");", bytes_of(o));
        }
        let _ = writeln!(w, "  return failed ? 1 : 0;\n}}");
        std::fs::write(dir.join("driver.cu"), d).map_err(|e| e.to_string())?;
        Ok(())
    }

    /// The CPU stand-in for `common.cuh` used by [`emulate_on_cpu`]: the CUDA runtime calls of
    /// the driver become host memory operations and every launch runs each CUDA thread of a
    /// block as one host thread (blocks one after the other), so barriers and warp shuffles keep
    /// their meaning. fp16 comes from the CUDA headers' host implementation.
    const CPU_SHIM: &str = r#"// CPU emulation of the CUDA launcher environment (see emulate_on_cpu in src/lower/ops/shape.rs).
#pragma once
#include <cstdint>
#include <cstddef>
#include <cstring>
#include <cstdlib>
#include <cstdio>
#include <cmath>
#include <cuda_fp16.h>
#define __global__
#define __device__
#ifndef __host__
#define __host__
#endif
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#include <thread>
#include <barrier>
#include <vector>
#include <memory>
#include <type_traits>
#define __shared__ static
struct o2a_dim3 { unsigned x = 1, y = 1, z = 1; };
// Every CUDA thread of a block is one host thread (blocks run one after the other), so block
// barriers and warp shuffles behave as on the GPU. Warps are consecutive linear thread ids.
inline thread_local o2a_dim3 blockIdx, threadIdx;
inline o2a_dim3 blockDim, gridDim;
inline std::barrier<>* o2a_block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> o2a_warp_barriers;
alignas(16) inline unsigned char o2a_exchange[1024 * 16];
inline unsigned o2a_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline unsigned o2a_block_threads() { return blockDim.x * blockDim.y * blockDim.z; }
inline void __syncthreads() { o2a_block_barrier->arrive_and_wait(); }
// Lane `lane` of the calling thread's warp reads `v` of lane `src` (its own when out of range).
template <class T> T o2a_shuffle(T v, unsigned src_lane) {
  T* slots = reinterpret_cast<T*>(o2a_exchange);
  const unsigned t = o2a_tid(), base = t - t % 32, src = base + src_lane;
  std::barrier<>& warp = *o2a_warp_barriers[t / 32];
  slots[t] = v;
  warp.arrive_and_wait();
  const T r = (src_lane < 32 && src < o2a_block_threads()) ? slots[src] : v;
  warp.arrive_and_wait();
  return r;
}
template <class T> T __shfl_down_sync(unsigned, T v, int offset) { return o2a_shuffle(v, o2a_tid() % 32 + offset); }
template <class T> T __shfl_xor_sync(unsigned, T v, int mask) { return o2a_shuffle(v, (o2a_tid() % 32) ^ mask); }
template <class T> T __ldg(const T* p) { return *p; }
// cuda_fp16.h brings the runtime's types (cudaStream_t, cudaError_t, cudaMemcpyKind, dim3); the
// runtime calls the driver makes become host memory operations.
#define cudaGetLastError() cudaSuccess
#define cudaGetErrorString(e) "ok"
#define cudaMalloc(p, n) (*(p) = malloc(n), cudaSuccess)
#define cudaMemcpy(d, s, n, k) (memcpy(d, s, n), cudaSuccess)
#define cudaMemset(d, v, n) (memset(d, v, n), cudaSuccess)
#define cudaDeviceSynchronize() cudaSuccess
#define cudaMemcpyAsync(d, s, n, k, stream) (memcpy(d, s, n), cudaSuccess)
// Device code calls the C99 classification functions unqualified.
using std::isinf;
using std::isnan;
inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
inline float __uint_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
inline o2a_dim3 o2a_as3(const dim3& d) { return {d.x, d.y, d.z}; }
template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
o2a_dim3 o2a_as3(I v) { return {static_cast<unsigned>(v), 1, 1}; }
template <class G, class B, class F> void o2a_cpu_launch(G grid_arg, B block_arg, F f) {
  const o2a_dim3 grid = o2a_as3(grid_arg), block = o2a_as3(block_arg);
  gridDim = grid; blockDim = block;
  const unsigned nt = block.x * block.y * block.z;
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::barrier<> bar(nt);
        o2a_block_barrier = &bar;
        o2a_warp_barriers.clear();
        for (unsigned w = 0; w < (nt + 31) / 32; ++w)
          o2a_warp_barriers.push_back(std::make_unique<std::barrier<>>(nt - 32 * w < 32 ? nt - 32 * w : 32));
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < nt; ++t)
          threads.emplace_back([&, bx, by, bz, t] {
            blockIdx = {bx, by, bz};
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            f();
          });
        for (auto& th : threads) th.join();
      }
}
#define O2A_OK 0
#define O2A_ERR_INVALID_ARGUMENT 1
#define O2A_ERR_CUDA 2
#define O2A_ERR_UNSUPPORTED 3
void o2a_set_error(const char* fmt, ...);
#define O2A_CHECK_LAUNCH(kernel_name) do { } while (0)
"#;

    /// Rewrites every `kernel<<<grid, block, smem, stream>>>(args)` into an emulated launch.
    fn cpu_launches(text: &str) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(j) = rest.find("<<<") {
            let head = &rest[..j];
            // The kernel name: an identifier, optionally with template arguments.
            let name_start = head
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '<' || c == '>' || c == ':'))
                .map_or(0, |p| p + 1);
            out.push_str(&head[..name_start]);
            let name = &head[name_start..];
            let k = rest[j..].find(">>>").expect("launch config ends") + j;
            let mut cfg = Vec::new();
            let (mut depth, mut cur) = (0, String::new());
            for ch in rest[j + 3..k].chars() {
                match ch {
                    ',' if depth == 0 => cfg.push(std::mem::take(&mut cur)),
                    '(' | '[' => {
                        depth += 1;
                        cur.push(ch)
                    }
                    ')' | ']' => {
                        depth -= 1;
                        cur.push(ch)
                    }
                    _ => cur.push(ch),
                }
            }
            cfg.push(cur);
            let a = rest[k..].find('(').expect("launch arguments") + k;
            let mut depth = 0;
            let mut e = a;
            for (i, ch) in rest[a..].char_indices() {
                match ch {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            e = a + i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            out.push_str(&format!(
                "o2a_cpu_launch({}, {}, [&]() {{ {name}({}); }})",
                cfg[0].trim(),
                cfg[1].trim(),
                &rest[a + 1..e]
            ));
            rest = &rest[e + 1..];
        }
        out.push_str(rest);
        out
    }

    /// Builds the GPU check in `case` (see [`write_gpu_case`]) for the CPU with g++ and runs
    /// it: the kernels' exact semantics without a GPU. Needs g++ (C++20) and the CUDA headers
    /// (`cuda_fp16.h`) at `cuda_include`. Returns the driver's PASS/FAIL lines.
    pub fn emulate_on_cpu(case: &std::path::Path, cuda_include: &std::path::Path) -> Result<String, String> {
        let dir = case.join("cpu");
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        // The pointwise functions (conversions, vectors, activations) as the real common.cuh has them.
        let pointwise = templates().render("pointwise", &serde_json::json!({})).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("common.cuh"), format!("{CPU_SHIM}{pointwise}")).map_err(|e| e.to_string())?;
        let mut sources = Vec::new();
        for e in std::fs::read_dir(case).map_err(|e| e.to_string())?.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if let Some(stem) = name.strip_suffix(".cu") {
                let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
                let cpp = dir.join(format!("{stem}.cpp"));
                std::fs::write(&cpp, cpu_launches(&text)).map_err(|e| e.to_string())?;
                sources.push(cpp);
            }
        }
        sources.sort();
        let exe = dir.join("run");
        let build = std::process::Command::new("g++")
            .args(["-std=c++20", "-O1", "-pthread", "-w", "-x", "c++"])
            .arg(format!("-I{}", dir.display()))
            .arg(format!("-I{}", cuda_include.display()))
            .args(&sources)
            .arg("-o")
            .arg(&exe)
            .output()
            .map_err(|e| format!("g++: {e}"))?;
        if !build.status.success() {
            return Err(format!("g++ failed:\n{}", String::from_utf8_lossy(&build.stderr)));
        }
        let run = std::process::Command::new(&exe).arg(case).output().map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&run.stdout).to_string() + &String::from_utf8_lossy(&run.stderr))
    }

    /// The kernels' template names, in launch order.
    pub fn templates_of(p: &Program) -> Vec<&str> {
        p.kernels.iter().map(|k| k.template.as_str()).collect()
    }

    /// Tensor `i`'s storage kind, for view assertions.
    pub fn is_alias(p: &Program, t: usize) -> bool {
        matches!(p.tensors[t].storage, Storage::Alias { .. })
    }

    /// A one-dim int64 constant.
    pub fn ints(v: &[i64]) -> Tensor {
        Tensor::from_i64s(&[v.len()], v.to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::{Attr, DType, Tensor};
    use crate::lower::Storage;

    #[test]
    fn reshape_squeeze_flatten_are_views() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "N,2,3,1");
        let shape = b.konst("shape", ints(&[0, 6, 1]));
        let axes = b.konst("axes", ints(&[2]));
        let r = b.node("Reshape", vec![], &[x, shape], 1)[0];
        let s = b.node("Squeeze", vec![], &[r, axes], 1)[0];
        let u = b.node("Unsqueeze", vec![], &[s, axes], 1)[0];
        let f = b.node("Flatten", vec![("axis", Attr::Int(0))], &[u], 1)[0];
        let i = b.node("Identity", vec![], &[f], 1)[0];
        b.g.outputs.push(i);
        infer_graph(&mut b.g).unwrap();
        let p = lower(&b.g).unwrap();
        assert!(p.kernels.is_empty(), "{:?}", templates_of(&p));
        assert_eq!(p.tensors.len(), 6);
        for t in 1..6 {
            assert!(is_alias(&p, t));
            assert_eq!(p.base(t), 0);
        }
        assert_eq!(crate::ir::dim::fmt_shape(&p.tensors[5].shape), "[1,6*N]");
    }

    #[test]
    fn dropout_mask_is_a_fill() {
        let mut b = GraphBuilder::new(13);
        let x = b.input("x", DType::F16, "2,3");
        let out = b.node("Dropout", vec![], &[x], 2);
        b.g.outputs.extend(out.iter().copied());
        infer_graph(&mut b.g).unwrap();
        let p = lower(&b.g).unwrap();
        assert_eq!(templates_of(&p), vec!["fill"]);
        assert!(is_alias(&p, 1));
        let k = &p.kernels[0];
        assert_eq!(k.context["ctype"], "bool");
        // The mask value weight: one `true` byte.
        let Storage::Weight { offset, bytes } = p.tensors[k.args[0]].storage else { panic!("weight expected") };
        assert_eq!(&p.weights[offset as usize..(offset + bytes) as usize], &[1u8]);
        render_all("dropout", &p);
    }

    #[test]
    fn shape_size_write_batch_expressions() {
        let mut b = GraphBuilder::new(15);
        let x = b.input("x", DType::F16, "N,3,4");
        let s = b.node("Shape", vec![("start", Attr::Int(0)), ("end", Attr::Int(-1))], &[x], 1)[0];
        let n = b.node("Size", vec![], &[x], 1)[0];
        b.g.outputs.extend([s, n]);
        infer_graph(&mut b.g).unwrap();
        let p = lower(&b.g).unwrap();
        assert_eq!(templates_of(&p), vec!["shape_values", "shape_values"]);
        assert_eq!(p.kernels[0].context["values"], serde_json::json!(["(dims.v[0])", "3"]));
        assert_eq!(p.kernels[1].context["values"], serde_json::json!(["((int64_t)12*dims.v[0])"]));
        let text = render_all("shape", &p);
        assert!(text[0].contains("v.v[0] = (dims.v[0]);"), "{}", text[0]);
    }

    #[test]
    fn constant_of_shape_and_range_follow_the_batch() {
        // generator_range_dynamic: Range(0, Gather(Shape(x), 1), 1) and ConstantOfShape(Shape(x)).
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F16, "2,T");
        let one = b.konst("one", Tensor::from_i64s(&[], vec![1]));
        let zero = b.konst("zero", Tensor::from_i64s(&[], vec![0]));
        let shape = b.node("Shape", vec![], &[x], 1)[0];
        let t = b.node("Gather", vec![("axis", Attr::Int(0))], &[shape, one], 1)[0];
        let r = b.node("Range", vec![], &[zero, t, one], 1)[0];
        let value = Attr::Tensor(Tensor::from_i64s(&[1], vec![7]));
        let c = b.node("ConstantOfShape", vec![("value", value)], &[shape], 1)[0];
        b.g.outputs.extend([r, c]);
        infer_graph(&mut b.g).unwrap();
        let p = lower(&b.g).unwrap();
        let names = templates_of(&p);
        assert!(names.contains(&"range") && names.contains(&"fill"), "{names:?}");
        let range = p.kernels.iter().find(|k| k.template == "range").unwrap();
        assert_eq!(range.context["n"], "(dims.v[0])");
        assert_eq!(range.context["float"], false);
        let fill = p.kernels.iter().find(|k| k.template == "fill").unwrap();
        assert_eq!(fill.context["n"], "((int64_t)2*dims.v[0])");
        render_all("generator", &p);
    }

    #[test]
    fn float_range_bakes_exact_constants() {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F16, "T");
        let start = b.konst("start", Tensor::from_f32s(&[], vec![0.1]));
        let delta = b.konst("delta", Tensor::from_f32s(&[], vec![0.25]));
        let shape = b.node("Shape", vec![], &[x], 1)[0];
        let zero = b.konst("zero", Tensor::from_i64s(&[], vec![0]));
        let t = b.node("Gather", vec![("axis", Attr::Int(0))], &[shape, zero], 1)[0];
        let tf = b.node("Cast", vec![("to", Attr::Int(1))], &[t], 1)[0];
        let r = b.node("Range", vec![], &[start, tf, delta], 1)[0];
        b.g.outputs.push(r);
        infer_graph(&mut b.g).unwrap();
        // Range over a run-time float limit has a data-dependent length: not lowerable.
        assert!(b.g.ty(r).shape[0].symbols().any(|s| s.contains(':')), "{}", b.g.ty(r));
        assert_eq!(super::f32_literal(0.25), "__uint_as_float(0x3e800000u)");
    }
}
