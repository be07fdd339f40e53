//! Elementwise kernels: the optimiser's fused chains (`Elementwise`) and every ONNX elementwise
//! op that survives optimisation (arithmetic, activations, comparisons, logic, bit operations,
//! `Where`, inference-mode `BatchNormalization`). All of them render one template,
//! `elementwise.cu.hbs`: a C++ expression over the loaded operands, numpy broadcasting of every
//! operand to the output shape, and a vectorised path (up to 16 bytes per access) when the
//! broadcast allows it.
//!
//! How broadcasting becomes code: for each operand, the output axes are grouped innermost-first
//! into runs that the operand either reads in full or broadcasts (size-1 output axes dropped,
//! adjacent axes of the same kind merged). The operand's element offset for output index `idx`
//! is then a short C++ expression (`idx`, `0`, `(idx % 64)`, `((idx / 3136) % 64)`, …) rendered at
//! lowering time with the dims as constants (or expressions in `batch`), so the compiler turns
//! the divisions into multiplications. The vector path loads `VEC` consecutive outputs' operands
//! with one access when each operand's innermost run is a multiple of `VEC` long (or the operand
//! is a single run): contiguous (`contig`) for read runs, one element (`splat`) for broadcast runs.
//!
//! Compute types: float tensors (fp16, or fp32 at fp32 precision) load as `float` (fp32 math),
//! integers and bools in their own type; integer arithmetic wraps like the reference
//! (`src/reference/arithmetic.rs`).

use super::act::{act_call, float_lit};
use super::{is_device_float, LowerSpec};
use crate::ir::dim::product;
use crate::ir::ops::activation::Activation;
use crate::ir::ops::activation::{ActivationOp, ClipOp, PReluOp};
use crate::ir::ops::arithmetic::{BinaryKind, UnaryKind};
use crate::ir::ops::arithmetic::{BinaryOp, LegacyBroadcast, PowOp, UnaryOp, VariadicKind, VariadicOp};
use crate::ir::ops::kernel::{BinOp, Elementwise, EwExpr};
use crate::ir::ops::logical::{BitKind, CompareKind, LogicKind};
use crate::ir::ops::logical::{BitOp, BitwiseNotOp, CompareOp, LogicOp, PredicateKind, PredicateOp, WhereOp};
use crate::ir::ops::normalization::BatchNorm;
use crate::ir::{DType, Dim, Node, Tensor};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult, TensorId};
use crate::lower_unsupported;
use serde_json::{json, Map, Value as Json};

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<Elementwise>("Elementwise", lower_fused),
    // arithmetic
    LowerSpec::of::<BinaryOp>("Add", lower_binary),
    LowerSpec::of::<BinaryOp>("Sub", lower_binary),
    LowerSpec::of::<BinaryOp>("Mul", lower_binary),
    LowerSpec::of::<BinaryOp>("Div", lower_binary),
    LowerSpec::of::<BinaryOp>("Mod", lower_binary),
    LowerSpec::of::<BinaryOp>("Max", lower_binary),
    LowerSpec::of::<BinaryOp>("Min", lower_binary),
    LowerSpec::of::<PowOp>("Pow", lower_pow),
    LowerSpec::of::<VariadicOp>("Sum", lower_variadic),
    LowerSpec::of::<VariadicOp>("Mean", lower_variadic),
    LowerSpec::of::<VariadicOp>("Max", lower_variadic),
    LowerSpec::of::<VariadicOp>("Min", lower_variadic),
    LowerSpec::of::<UnaryOp>("Sqrt", lower_unary),
    LowerSpec::of::<UnaryOp>("Reciprocal", lower_unary),
    LowerSpec::of::<UnaryOp>("Exp", lower_unary),
    LowerSpec::of::<UnaryOp>("Log", lower_unary),
    LowerSpec::of::<UnaryOp>("Neg", lower_unary),
    LowerSpec::of::<UnaryOp>("Abs", lower_unary),
    LowerSpec::of::<UnaryOp>("Floor", lower_unary),
    LowerSpec::of::<UnaryOp>("Ceil", lower_unary),
    LowerSpec::of::<UnaryOp>("Round", lower_unary),
    LowerSpec::of::<UnaryOp>("Sign", lower_unary),
    LowerSpec::of::<UnaryOp>("Sin", lower_unary),
    LowerSpec::of::<UnaryOp>("Cos", lower_unary),
    LowerSpec::of::<UnaryOp>("Tan", lower_unary),
    LowerSpec::of::<UnaryOp>("Asin", lower_unary),
    LowerSpec::of::<UnaryOp>("Acos", lower_unary),
    LowerSpec::of::<UnaryOp>("Atan", lower_unary),
    LowerSpec::of::<UnaryOp>("Sinh", lower_unary),
    LowerSpec::of::<UnaryOp>("Cosh", lower_unary),
    LowerSpec::of::<UnaryOp>("Asinh", lower_unary),
    LowerSpec::of::<UnaryOp>("Acosh", lower_unary),
    LowerSpec::of::<UnaryOp>("Atanh", lower_unary),
    // activations
    LowerSpec::of::<ActivationOp>("Relu", lower_activation),
    LowerSpec::of::<ActivationOp>("LeakyRelu", lower_activation),
    LowerSpec::of::<ActivationOp>("Sigmoid", lower_activation),
    LowerSpec::of::<ActivationOp>("Tanh", lower_activation),
    LowerSpec::of::<ActivationOp>("Clip", lower_activation),
    LowerSpec::of::<ActivationOp>("HardSigmoid", lower_activation),
    LowerSpec::of::<ActivationOp>("HardSwish", lower_activation),
    LowerSpec::of::<ActivationOp>("Gelu", lower_activation),
    LowerSpec::of::<ActivationOp>("Erf", lower_activation),
    LowerSpec::of::<ActivationOp>("Softplus", lower_activation),
    LowerSpec::of::<ActivationOp>("Elu", lower_activation),
    LowerSpec::of::<ActivationOp>("Selu", lower_activation),
    LowerSpec::of::<ActivationOp>("Celu", lower_activation),
    LowerSpec::of::<ActivationOp>("Softsign", lower_activation),
    LowerSpec::of::<ActivationOp>("ThresholdedRelu", lower_activation),
    LowerSpec::of::<ActivationOp>("Mish", lower_activation),
    LowerSpec::of::<ActivationOp>("Shrink", lower_activation),
    LowerSpec::of::<ClipOp>("Clip", lower_clip),
    LowerSpec::of::<PReluOp>("PRelu", lower_prelu),
    // comparisons, logic, bits
    LowerSpec::of::<CompareOp>("Equal", lower_compare),
    LowerSpec::of::<CompareOp>("Greater", lower_compare),
    LowerSpec::of::<CompareOp>("GreaterOrEqual", lower_compare),
    LowerSpec::of::<CompareOp>("Less", lower_compare),
    LowerSpec::of::<CompareOp>("LessOrEqual", lower_compare),
    LowerSpec::of::<LogicOp>("And", lower_logic),
    LowerSpec::of::<LogicOp>("Or", lower_logic),
    LowerSpec::of::<LogicOp>("Xor", lower_logic),
    LowerSpec::of::<PredicateOp>("Not", lower_predicate),
    LowerSpec::of::<PredicateOp>("IsNaN", lower_predicate),
    LowerSpec::of::<PredicateOp>("IsInf", lower_predicate),
    LowerSpec::of::<WhereOp>("Where", lower_where),
    LowerSpec::of::<BitOp>("BitwiseAnd", lower_bit),
    LowerSpec::of::<BitOp>("BitwiseOr", lower_bit),
    LowerSpec::of::<BitOp>("BitwiseXor", lower_bit),
    LowerSpec::of::<BitOp>("BitShift", lower_bit),
    LowerSpec::of::<BitwiseNotOp>("BitwiseNot", lower_bitwise_not),
    LowerSpec::of::<BatchNorm>("BatchNormalization", lower_batch_norm),
];

// ---------------------------------------------------------------------------------------------
// Broadcast indexing, shared with the other families of this target-neutral lowering.

/// One run of adjacent output axes (innermost first) that an operand reads in full or
/// broadcasts: `size` output elements.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Run {
    pub size: Dim,
    pub read: bool,
}

/// The runs of an operand of shape `inp` broadcast (numpy, right-aligned) to `out`.
pub(crate) fn broadcast_runs(out: &[Dim], inp: &[Dim]) -> LowerResult<Vec<Run>> {
    if inp.len() > out.len() {
        return Err(LowerError::Invalid(format!(
            "operand of rank {} does not broadcast to the output rank {}",
            inp.len(),
            out.len()
        )));
    }
    let pad = out.len() - inp.len();
    let one = Dim::known(1);
    let mut runs: Vec<Run> = Vec::new();
    for a in (0..out.len()).rev() {
        let o = &out[a];
        if *o == one {
            continue;
        }
        let i = if a < pad { &one } else { &inp[a - pad] };
        let read = if i == o {
            true
        } else if *i == one {
            false
        } else {
            return Err(LowerError::Invalid(format!(
                "operand dim {i} does not broadcast to output dim {o} (axis {a})"
            )));
        };
        match runs.last_mut() {
            Some(r) if r.read == read => r.size = r.size.mul(o),
            _ => runs.push(Run { size: o.clone(), read }),
        }
    }
    Ok(runs)
}

/// The C++ element offset of an operand with `runs` for output index `idx` (an integer
/// expression).
pub(crate) fn offset_expr(cx: &LowerCtx, runs: &[Run], idx: &str) -> LowerResult<String> {
    let one = Dim::known(1);
    let mut terms = Vec::new();
    let mut inner = one.clone();
    let mut stride = one.clone();
    for (k, r) in runs.iter().enumerate() {
        if r.read {
            let outermost = k + 1 == runs.len();
            let size = cx.expr(&r.size)?;
            let coord = match (inner == one, outermost) {
                (true, true) => idx.to_string(),
                (true, false) => format!("({idx} % {size})"),
                (false, true) => format!("({idx} / {})", cx.expr(&inner)?),
                (false, false) => format!("(({idx} / {}) % {size})", cx.expr(&inner)?),
            };
            terms.push(if stride == one { coord } else { format!("{coord} * {}", cx.expr(&stride)?) });
            stride = stride.mul(&r.size);
        }
        inner = inner.mul(&r.size);
    }
    Ok(match terms.len() {
        0 => "0".to_string(),
        1 => terms.remove(0),
        _ => format!("({})", terms.join(" + ")),
    })
}

/// How an operand is read on the vector path of width `vec`, when it can be: `Some(true)`
/// contiguous, `Some(false)` one element for all `vec` outputs.
fn vector_mode(runs: &[Run], vec: i64) -> Option<bool> {
    let Some(first) = runs.first() else { return Some(false) };
    if runs.len() == 1 {
        return Some(first.read);
    }
    match first.size.as_known() {
        Some(s) if s % vec == 0 => Some(first.read),
        _ => None,
    }
}

/// The index type for `n` elements at the largest batch: 32-bit when the grid-stride loop
/// cannot overflow it.
pub(crate) fn index_type(cx: &LowerCtx, n: &Dim) -> LowerResult<&'static str> {
    Ok(if cx.upper_bound(n)? < (1i64 << 30) { "int32_t" } else { "int64_t" })
}

/// The compute type of a device dtype in elementwise expressions (fp16 computes in fp32).
pub(crate) fn compute_type(dt: DType) -> &'static str {
    if dt == DType::F16 {
        "float"
    } else {
        ctype(dt)
    }
}

// ---------------------------------------------------------------------------------------------
// The elementwise emitter.

/// An operand of an elementwise kernel: a device tensor read with `shape` (its own shape, or a
/// legacy/per-channel view of the same elements) broadcast to the output.
pub(crate) struct Operand {
    pub tensor: TensorId,
    pub shape: Vec<Dim>,
}

impl Operand {
    pub fn of(cx: &LowerCtx, tensor: TensorId) -> Operand {
        Operand { tensor, shape: cx.shape(tensor).to_vec() }
    }
}

/// Emits `out = expr(v0, v1, …)` where `vK` is operand K converted to its compute type
/// ([`compute_type`]); the expression's value is converted to the output's element type.
pub(crate) fn emit_elementwise(
    cx: &mut LowerCtx,
    node: &str,
    operands: &[Operand],
    out: TensorId,
    expr: &str,
) -> LowerResult<()> {
    let out_shape = cx.shape(out).to_vec();
    let out_dt = cx.dtype(out);
    let n = product(&out_shape);
    let mut runs = Vec::with_capacity(operands.len());
    let mut max_bytes = out_dt.size_bytes();
    for o in operands {
        runs.push(broadcast_runs(&out_shape, &o.shape)?);
        max_bytes = max_bytes.max(cx.dtype(o.tensor).size_bytes());
    }
    // Widest vector (≤ 16 bytes per access of the widest type, ≤ 8 elements) every operand allows.
    let mut vec = (16 / max_bytes.max(1)).min(8) as i64;
    while vec > 1 && !runs.iter().all(|r| vector_mode(r, vec).is_some()) {
        vec /= 2;
    }
    let mut inputs = Vec::new();
    for (k, (o, r)) in operands.iter().zip(&runs).enumerate() {
        let dt = cx.dtype(o.tensor);
        inputs.push(json!({
            "i": k,
            "arg": k,
            "ctype": ctype(dt),
            "vtype": compute_type(dt),
            "offset": offset_expr(cx, r, "idx")?,
            "contig": vec > 1 && vector_mode(r, vec) == Some(true),
        }));
    }
    let mut c = Map::new();
    c.insert("n".into(), json!(cx.expr(&n)?));
    c.insert("idx_t".into(), json!(index_type(cx, &n)?));
    c.insert("vec".into(), json!(vec));
    c.insert("vector".into(), json!(vec > 1));
    c.insert("inputs".into(), Json::Array(inputs));
    c.insert("out_arg".into(), json!(operands.len()));
    c.insert("out_ctype".into(), json!(ctype(out_dt)));
    c.insert("expr".into(), json!(expr));
    let mut args: Vec<TensorId> = operands.iter().map(|o| o.tensor).collect();
    args.push(out);
    let writes = vec![operands.len()];
    cx.emit(node, "elementwise", args, writes, c, 0)?;
    // One flop per output element, however many ops the expression fuses: a throughput figure
    // that stays comparable between kernels (their time is memory traffic anyway).
    cx.set_flops(&n)
}

/// The device dtype of operand `i`, which must be present.
fn operand_dtype(cx: &mut LowerCtx, node: &Node, i: usize) -> LowerResult<(TensorId, DType)> {
    let t = cx.input(node, i)?;
    Ok((t, cx.dtype(t)))
}

fn require_same(a: DType, b: DType) -> LowerResult<()> {
    if a != b {
        return Err(LowerError::Invalid(format!("operands have different element types {a} and {b}")));
    }
    Ok(())
}

fn is_int(dt: DType) -> bool {
    dt.is_int()
}

fn call(f: &str, args: &[&str]) -> String {
    format!("{f}({})", args.join(", "))
}

// ---------------------------------------------------------------------------------------------
// The optimiser's fused chains.

/// Renders an expression tree of the fused elementwise kernel over operands `v0, v1, …`.
pub fn render_expr(e: &EwExpr) -> String {
    match e {
        EwExpr::Input(i) => format!("v{i}"),
        EwExpr::Unary(f, a) => act_call(*f, &render_expr(a)),
        EwExpr::Binary(op, a, b) => {
            let (a, b) = (render_expr(a), render_expr(b));
            let f = match op {
                BinOp::Add => "o2a_add",
                BinOp::Sub => "o2a_sub",
                BinOp::Mul => "o2a_mul",
                BinOp::Div => "o2a_div",
                BinOp::Pow => "o2a_pow",
                BinOp::Max => "o2a_max",
                BinOp::Min => "o2a_min",
            };
            call(f, &[&a, &b])
        }
    }
}

/// Kernel-level `Elementwise`: a fused chain over float operands (fp16 or fp32), computed in fp32.
fn lower_fused(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<Elementwise>() else {
        return Err(LowerError::Invalid("not an Elementwise node".into()));
    };
    let mut operands = Vec::new();
    for i in 0..op.num_inputs {
        let (t, dt) = operand_dtype(cx, node, i)?;
        if !is_device_float(dt) {
            lower_unsupported!("fused elementwise chains compute on float tensors, operand {i} is {dt}");
        }
        operands.push(Operand::of(cx, t));
    }
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &operands, out, &render_expr(&op.expr))
}

// ---------------------------------------------------------------------------------------------
// Arithmetic.

/// The operand shape of input B under opset < 7 broadcasting (`broadcast=1, axis`).
fn legacy_b_shape(a_rank: usize, b: &[Dim], legacy: Option<LegacyBroadcast>) -> LowerResult<Vec<Dim>> {
    match legacy {
        Some(LegacyBroadcast::Axis(axis)) => {
            let start =
                crate::ir::broadcast::normalize_axis(axis, a_rank.max(1)).map_err(|e| LowerError::Invalid(e.0))?;
            if start + b.len() > a_rank {
                return Err(LowerError::Invalid(format!(
                    "legacy broadcast: B of rank {} does not fit A of rank {a_rank} at axis {start}",
                    b.len()
                )));
            }
            let mut s = vec![Dim::known(1); a_rank];
            s[start..start + b.len()].clone_from_slice(b);
            Ok(s)
        }
        _ => Ok(b.to_vec()),
    }
}

/// The expression of a binary arithmetic kind over `a` and `b` of device dtype `dt`.
fn binary_expr(kind: BinaryKind, dt: DType, a: &str, b: &str) -> LowerResult<String> {
    if is_device_float(dt) {
        return Ok(match kind {
            BinaryKind::Add => format!("({a} + {b})"),
            BinaryKind::Sub => format!("({a} - {b})"),
            BinaryKind::Mul => format!("({a} * {b})"),
            BinaryKind::Div => format!("({a} / {b})"),
            BinaryKind::Mod { fmod: true } => call("o2a_fmod", &[a, b]),
            BinaryKind::Mod { fmod: false } => call("o2a_floor_mod", &[a, b]),
            BinaryKind::Max => call("o2a_max_nan", &[a, b]),
            BinaryKind::Min => call("o2a_min_nan", &[a, b]),
        });
    }
    if is_int(dt) {
        return Ok(match kind {
            BinaryKind::Add => call("o2a_iadd", &[a, b]),
            BinaryKind::Sub => call("o2a_isub", &[a, b]),
            BinaryKind::Mul => call("o2a_imul", &[a, b]),
            BinaryKind::Div => call("o2a_idiv", &[a, b]),
            BinaryKind::Mod { fmod } => call("o2a_imod", &[a, b, if fmod { "true" } else { "false" }]),
            BinaryKind::Max => call("o2a_imax", &[a, b]),
            BinaryKind::Min => call("o2a_imin", &[a, b]),
        });
    }
    lower_unsupported!("{kind:?} of {dt} tensors")
}

/// Add, Sub, Mul, Div, Mod (and a binary Max/Min): floats in fp32, integers exactly with
/// wrap-around (division truncates, `Mod` follows `fmod`).
fn lower_binary(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<BinaryOp>() else {
        return Err(LowerError::Invalid("not a binary arithmetic node".into()));
    };
    let (a, da) = operand_dtype(cx, node, 0)?;
    let (b, db) = operand_dtype(cx, node, 1)?;
    require_same(da, db)?;
    let expr = binary_expr(op.kind, da, "v0", "v1")?;
    let b_shape = legacy_b_shape(cx.shape(a).len(), cx.shape(b), op.legacy)?;
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, a), Operand { tensor: b, shape: b_shape }];
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

/// Pow: the output has the base's type; the exponent may be any numeric type (opset 12+).
/// float bases use `powf`; integer bases are exact with an integer exponent and computed in double
/// (saturated) with a floating exponent.
fn lower_pow(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<PowOp>() else {
        return Err(LowerError::Invalid("not a Pow node".into()));
    };
    let (a, da) = operand_dtype(cx, node, 0)?;
    let (b, db) = operand_dtype(cx, node, 1)?;
    let expr = match (is_device_float(da), is_device_float(db)) {
        (true, _) if db == DType::Bool => lower_unsupported!("bool exponents"),
        (true, _) => "powf(v0, static_cast<float>(v1))".to_string(),
        (false, true) if is_int(da) => "o2a_ipow_f(v0, static_cast<double>(v1))".to_string(),
        (false, false) if is_int(da) && is_int(db) => "o2a_ipow(v0, static_cast<long long>(v1))".to_string(),
        _ => lower_unsupported!("Pow of {da} by {db}"),
    };
    let b_shape = legacy_b_shape(cx.shape(a).len(), cx.shape(b), op.legacy)?;
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, a), Operand { tensor: b, shape: b_shape }];
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

/// Sum, Mean (floating point), Max, Min (NaN-propagating for floats) over any number of
/// broadcast operands, folded left to right like the reference.
fn lower_variadic(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<VariadicOp>() else {
        return Err(LowerError::Invalid("not a variadic node".into()));
    };
    let mut operands = Vec::new();
    let mut dt0 = None;
    for i in 0..node.inputs.len() {
        let (t, dt) = operand_dtype(cx, node, i)?;
        if let Some(d) = dt0 {
            require_same(d, dt)?;
        }
        dt0 = Some(dt);
        operands.push(Operand::of(cx, t));
    }
    let Some(dt) = dt0 else { return Err(LowerError::Invalid("no operands".into())) };
    let kind = match op.kind {
        VariadicKind::Sum | VariadicKind::Mean => BinaryKind::Add,
        VariadicKind::Max => BinaryKind::Max,
        VariadicKind::Min => BinaryKind::Min,
    };
    if matches!(op.kind, VariadicKind::Sum | VariadicKind::Mean) && !is_device_float(dt) {
        lower_unsupported!("{} of {dt} tensors", node.op.op_type());
    }
    let mut expr = "v0".to_string();
    for i in 1..operands.len() {
        expr = binary_expr(kind, dt, &expr, &format!("v{i}"))?;
    }
    if op.kind == VariadicKind::Mean {
        expr = format!("({expr} / {})", float_lit(operands.len() as f32));
    }
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

/// The expression of an ONNX unary math kind.
fn unary_expr(kind: UnaryKind, dt: DType, x: &str) -> LowerResult<String> {
    if is_int(dt) {
        return Ok(match kind {
            UnaryKind::Neg if dt.is_signed() => call("o2a_ineg", &[x]),
            UnaryKind::Abs => call("o2a_iabs", &[x]),
            UnaryKind::Sign => call("o2a_isign", &[x]),
            _ => lower_unsupported!("{kind:?} of {dt} tensors"),
        });
    }
    if !is_device_float(dt) {
        lower_unsupported!("{kind:?} of {dt} tensors");
    }
    let f = match kind {
        UnaryKind::Sqrt => "sqrtf",
        UnaryKind::Reciprocal => return Ok(format!("(1.0f / {x})")),
        UnaryKind::Exp => "expf",
        UnaryKind::Log => "logf",
        UnaryKind::Neg => return Ok(format!("(-{x})")),
        UnaryKind::Abs => "fabsf",
        UnaryKind::Floor => "floorf",
        UnaryKind::Ceil => "ceilf",
        UnaryKind::Round => "o2a_round",
        UnaryKind::Sign => "o2a_sign",
        UnaryKind::Sin => "sinf",
        UnaryKind::Cos => "cosf",
        UnaryKind::Tan => "tanf",
        UnaryKind::Asin => "asinf",
        UnaryKind::Acos => "acosf",
        UnaryKind::Atan => "atanf",
        UnaryKind::Sinh => "sinhf",
        UnaryKind::Cosh => "coshf",
        UnaryKind::Asinh => "asinhf",
        UnaryKind::Acosh => "acoshf",
        UnaryKind::Atanh => "atanhf",
    };
    Ok(call(f, &[x]))
}

/// Unary math (Sqrt, Exp, Round (half to even), trigonometry, …); Neg/Abs/Sign also on integers.
fn lower_unary(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<UnaryOp>() else {
        return Err(LowerError::Invalid("not a unary math node".into()));
    };
    let (x, dt) = operand_dtype(cx, node, 0)?;
    let expr = unary_expr(op.kind, dt, "v0")?;
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &[Operand::of(cx, x)], out, &expr)
}

// ---------------------------------------------------------------------------------------------
// Activations (ONNX semantics: `src/reference/activation.rs`, which differ from the fused
// chains' `Act` in NaN handling).

/// The expression of an ONNX activation on a float operand.
pub fn activation_expr(act: Activation, x: &str) -> String {
    use crate::ir::ops::kernel::Act;
    match act {
        Activation::Relu => call("o2a_onnx_relu", &[x]),
        Activation::LeakyRelu { alpha } => act_call(Act::LeakyRelu { alpha }, x),
        Activation::Sigmoid => call("o2a_onnx_sigmoid", &[x]),
        Activation::Tanh => act_call(Act::Tanh, x),
        Activation::Clip { min, max } => call("o2a_onnx_clip", &[x, &float_lit(min), &float_lit(max)]),
        Activation::HardSigmoid { alpha, beta } => {
            call("o2a_onnx_hardsigmoid", &[x, &float_lit(alpha), &float_lit(beta)])
        }
        Activation::HardSwish => call("o2a_onnx_hardswish", &[x]),
        Activation::Gelu { tanh_approx: false } => act_call(Act::GeluErf, x),
        Activation::Gelu { tanh_approx: true } => act_call(Act::GeluTanh, x),
        Activation::Erf => act_call(Act::Erf, x),
        Activation::Softplus => call("o2a_softplus", &[x]),
        Activation::Elu { alpha } => act_call(Act::Elu { alpha }, x),
        Activation::Selu { alpha, gamma } => call("o2a_selu", &[x, &float_lit(alpha), &float_lit(gamma)]),
        Activation::Celu { alpha } => call("o2a_celu", &[x, &float_lit(alpha)]),
        Activation::Softsign => call("o2a_softsign", &[x]),
        Activation::ThresholdedRelu { alpha } => call("o2a_thresholded_relu", &[x, &float_lit(alpha)]),
        Activation::Mish => call("o2a_mish", &[x]),
        Activation::Shrink { lambd, bias } => call("o2a_shrink", &[x, &float_lit(lambd), &float_lit(bias)]),
    }
}

/// The ONNX activations (Relu, LeakyRelu, Sigmoid, …, legacy attribute Clip); Relu also on
/// signed integers.
fn lower_activation(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<ActivationOp>() else {
        return Err(LowerError::Invalid("not an activation node".into()));
    };
    let (x, dt) = operand_dtype(cx, node, 0)?;
    let expr = if is_device_float(dt) {
        activation_expr(op.act, "v0")
    } else if op.act == Activation::Relu && dt.is_int() && dt.is_signed() {
        format!("(v0 < 0 ? static_cast<{}>(0) : v0)", ctype(dt))
    } else {
        lower_unsupported!("{} of {dt} tensors", op.act.name())
    };
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &[Operand::of(cx, x)], out, &expr)
}

/// A bound of Clip (opset 11+): a literal when the input is a constant or absent (the type's
/// lowest/highest value, ±f32::MAX or ±65504 for fp16 models as in the reference), otherwise
/// a broadcast one-element operand.
fn clip_bound(
    cx: &mut LowerCtx,
    node: &Node,
    i: usize,
    high: bool,
    operands: &mut Vec<Operand>,
) -> LowerResult<String> {
    let (dt, model_dt) = {
        let x = cx.input(node, 0)?;
        let v = node.inputs[0].ok_or_else(|| LowerError::Invalid("input 0 is missing".into()))?;
        let model_dt = cx.graph.value(v).ty.as_ref().map(|t| t.dtype).unwrap_or(DType::F32);
        (cx.dtype(x), model_dt)
    };
    let present = node.inputs.get(i).copied().flatten().is_some();
    if !present {
        return Ok(if is_device_float(dt) {
            let m = if model_dt == DType::F16 { 65504.0f32 } else { f32::MAX };
            float_lit(if high { m } else { -m })
        } else {
            format!("std::numeric_limits<{}>::{}()", ctype(dt), if high { "max" } else { "lowest" })
        });
    }
    if let Some(k) = cx.konst(node, i) {
        if k.len() != 1 {
            return Err(LowerError::Invalid(format!("Clip bound {i} must have one element, found {:?}", k.shape())));
        }
        return Ok(if is_device_float(dt) {
            float_lit(k.to_f64_vec()[0] as f32)
        } else {
            let v = k.to_i64_vec()[0];
            // i64::MIN has no literal form; everything else round-trips through the cast.
            if v == i64::MIN {
                format!("static_cast<{}>(std::numeric_limits<long long>::lowest())", ctype(dt))
            } else {
                format!("static_cast<{}>({v}LL)", ctype(dt))
            }
        });
    }
    let t = cx.input(node, i)?;
    operands.push(Operand::of(cx, t));
    Ok(format!("v{}", operands.len() - 1))
}

/// Clip (opset 11+) with `min`/`max` as optional inputs, constant or not; any ordered type.
fn lower_clip(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let (x, dt) = operand_dtype(cx, node, 0)?;
    if !(is_device_float(dt) || is_int(dt)) {
        lower_unsupported!("Clip of {dt} tensors");
    }
    let mut operands = vec![Operand::of(cx, x)];
    let lo = clip_bound(cx, node, 1, false, &mut operands)?;
    let hi = clip_bound(cx, node, 2, true, &mut operands)?;
    let vt = compute_type(dt);
    let expr = format!("o2a_onnx_clip<{vt}>(v0, {lo}, {hi})");
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

/// PRelu: `x < 0 ? slope·x : x`, slope broadcast to X (opset < 7: a one-element slope is per
/// channel).
fn lower_prelu(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<PReluOp>() else {
        return Err(LowerError::Invalid("not a PRelu node".into()));
    };
    let (x, dt) = operand_dtype(cx, node, 0)?;
    let (s, ds) = operand_dtype(cx, node, 1)?;
    require_same(dt, ds)?;
    let expr = if is_device_float(dt) {
        "o2a_prelu(v0, v1)".to_string()
    } else if dt.is_int() && dt.is_signed() {
        "(v0 < 0 ? o2a_imul(v0, v1) : v0)".to_string()
    } else {
        lower_unsupported!("PRelu of {dt} tensors")
    };
    let x_rank = cx.shape(x).len();
    let mut s_shape = cx.shape(s).to_vec();
    if op.legacy_channel_slope && s_shape.len() == 1 && x_rank >= 2 {
        s_shape.extend(std::iter::repeat_n(Dim::known(1), x_rank - 2));
    }
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, x), Operand { tensor: s, shape: s_shape }];
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

// ---------------------------------------------------------------------------------------------
// Comparisons, logic, bits, Where.

/// Equal, Greater, GreaterOrEqual, Less, LessOrEqual: bool output; floats compare in fp32
/// (exact for fp16 values; NaN unequal and unordered), integers and bools natively.
fn lower_compare(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<CompareOp>() else {
        return Err(LowerError::Invalid("not a comparison node".into()));
    };
    let (a, da) = operand_dtype(cx, node, 0)?;
    let (b, db) = operand_dtype(cx, node, 1)?;
    require_same(da, db)?;
    if !(is_device_float(da) || is_int(da) || (da == DType::Bool && op.kind == CompareKind::Equal)) {
        lower_unsupported!("comparison of {da} tensors");
    }
    let sym = match op.kind {
        CompareKind::Equal => "==",
        CompareKind::Greater => ">",
        CompareKind::GreaterOrEqual => ">=",
        CompareKind::Less => "<",
        CompareKind::LessOrEqual => "<=",
    };
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, a), Operand::of(cx, b)];
    emit_elementwise(cx, &node.name, &operands, out, &format!("(v0 {sym} v1)"))
}

/// And, Or, Xor of bools.
fn lower_logic(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<LogicOp>() else {
        return Err(LowerError::Invalid("not a logic node".into()));
    };
    let (a, da) = operand_dtype(cx, node, 0)?;
    let (b, db) = operand_dtype(cx, node, 1)?;
    if da != DType::Bool || db != DType::Bool {
        return Err(LowerError::Invalid(format!("logic operands must be bool, found {da} and {db}")));
    }
    let expr = match op.kind {
        LogicKind::And => "(v0 && v1)",
        LogicKind::Or => "(v0 || v1)",
        LogicKind::Xor => "(v0 != v1)",
    };
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, a), Operand::of(cx, b)];
    emit_elementwise(cx, &node.name, &operands, out, expr)
}

/// Not (bool), IsNaN and IsInf (floats): bool output.
fn lower_predicate(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<PredicateOp>() else {
        return Err(LowerError::Invalid("not a predicate node".into()));
    };
    let (x, dt) = operand_dtype(cx, node, 0)?;
    let expr = match op.kind {
        PredicateKind::Not if dt == DType::Bool => "(!v0)".to_string(),
        PredicateKind::IsNaN if is_device_float(dt) => "o2a_isnan(v0)".to_string(),
        PredicateKind::IsInf { negative, positive } if is_device_float(dt) => {
            format!("o2a_isinf(v0, {negative}, {positive})")
        }
        _ => lower_unsupported!("{} of {dt} tensors", node.op.op_type()),
    };
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &[Operand::of(cx, x)], out, &expr)
}

/// Where: `cond ? x : y` with three-way broadcasting, any element type.
fn lower_where(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let (c, dc) = operand_dtype(cx, node, 0)?;
    let (x, dx) = operand_dtype(cx, node, 1)?;
    let (y, dy) = operand_dtype(cx, node, 2)?;
    if dc != DType::Bool {
        return Err(LowerError::Invalid(format!("the condition must be bool, found {dc}")));
    }
    require_same(dx, dy)?;
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, c), Operand::of(cx, x), Operand::of(cx, y)];
    emit_elementwise(cx, &node.name, &operands, out, "(v0 ? v1 : v2)")
}

/// BitwiseAnd/Or/Xor and BitShift (shifts by the bit width or more give 0) on integers.
fn lower_bit(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<BitOp>() else {
        return Err(LowerError::Invalid("not a bitwise node".into()));
    };
    let (a, da) = operand_dtype(cx, node, 0)?;
    let (b, db) = operand_dtype(cx, node, 1)?;
    require_same(da, db)?;
    if !is_int(da) {
        lower_unsupported!("bit operations on {da} tensors");
    }
    let expr = match op.kind {
        BitKind::And => "(v0 & v1)".to_string(),
        BitKind::Or => "(v0 | v1)".to_string(),
        BitKind::Xor => "(v0 ^ v1)".to_string(),
        BitKind::ShiftLeft => "o2a_shl(v0, v1)".to_string(),
        BitKind::ShiftRight => "o2a_shr(v0, v1)".to_string(),
    };
    let out = cx.output(node, 0)?;
    let operands = [Operand::of(cx, a), Operand::of(cx, b)];
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

/// BitwiseNot of integers.
fn lower_bitwise_not(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let (x, dt) = operand_dtype(cx, node, 0)?;
    if !is_int(dt) {
        lower_unsupported!("BitwiseNot of {dt} tensors");
    }
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &[Operand::of(cx, x)], out, "(~v0)")
}

// ---------------------------------------------------------------------------------------------
// BatchNormalization (inference): a per-channel affine map.

/// BatchNormalization with running statistics: `x·a + b` per channel (axis 1), with
/// `a = scale / sqrt(var + eps)` and `b = bias - mean·a` folded at compile time in f32 (as the
/// reference does) when the four parameters are constants, else computed in the kernel.
fn lower_batch_norm(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<BatchNorm>() else {
        return Err(LowerError::Invalid("not a BatchNormalization node".into()));
    };
    if node.outputs.len() > 1 {
        lower_unsupported!("BatchNormalization with training outputs");
    }
    let (x, dt) = operand_dtype(cx, node, 0)?;
    if !is_device_float(dt) {
        lower_unsupported!("BatchNormalization of {dt} tensors");
    }
    let x_shape = cx.shape(x).to_vec();
    if x_shape.len() < 2 {
        return Err(LowerError::Invalid("BatchNormalization needs an input [N, C, ...]".into()));
    }
    // Parameters are [C]: view them as [C, 1, …] against [N, C, spatial…].
    let per_channel = |c: &Dim| {
        let mut s = vec![c.clone()];
        s.extend(std::iter::repeat_n(Dim::known(1), x_shape.len() - 2));
        s
    };
    let eps = op.epsilon;
    let consts: Option<Vec<&Tensor>> = (1..5).map(|i| cx.konst(node, i)).collect();
    if let Some(k) = consts {
        let (scale, bias, mean, var) = (k[0].to_f32(), k[1].to_f32(), k[2].to_f32(), k[3].to_f32());
        let c = scale.len();
        if [bias.len(), mean.len(), var.len()].iter().any(|&l| l != c) {
            return Err(LowerError::Invalid("BatchNormalization parameters differ in length".into()));
        }
        let (mut mul, mut add) = (Vec::with_capacity(c), Vec::with_capacity(c));
        for ((&s, &b), (&m, &v)) in scale.iter().zip(bias.iter()).zip(mean.iter().zip(var.iter())) {
            let a = s / (v + eps).sqrt();
            mul.push(a);
            add.push(b - m * a);
        }
        let a_t = cx.add_weight(&format!("{}.bn_scale", node.name), &Tensor::from_f32s(&[c], mul))?;
        let b_t = cx.add_weight(&format!("{}.bn_shift", node.name), &Tensor::from_f32s(&[c], add))?;
        let cd = Dim::known(c as i64);
        let out = cx.output(node, 0)?;
        let operands = [
            Operand::of(cx, x),
            Operand { tensor: a_t, shape: per_channel(&cd) },
            Operand { tensor: b_t, shape: per_channel(&cd) },
        ];
        return emit_elementwise(cx, &node.name, &operands, out, "(v0 * v1 + v2)");
    }
    let mut operands = vec![Operand::of(cx, x)];
    for i in 1..5 {
        let (t, d) = operand_dtype(cx, node, i)?;
        require_same(dt, d)?;
        let c = cx.shape(t).first().cloned().unwrap_or_else(|| Dim::known(1));
        operands.push(Operand { tensor: t, shape: per_channel(&c) });
    }
    let a = format!("(v1 / sqrtf(v4 + {}))", float_lit(eps));
    let expr = format!("(v0 * {a} + (v2 - v3 * {a}))");
    let out = cx.output(node, 0)?;
    emit_elementwise(cx, &node.name, &operands, out, &expr)
}

/// Test support shared by this target's family tests: builds small graphs, lowers them with a
/// family table (no registry needed), and renders the kernels through the embedded templates
/// exactly as `crate::codegen` registers them. With `O2A_RENDER_DIR` set, the rendered files are
/// also written there (with `common.cuh`) for compiling by hand with nvcc.
#[cfg(test)]
pub(crate) mod testkit {
    use super::super::LowerSpec;
    use crate::ir::{DType, Dim, Fact, Graph, Node, Op, Tensor, ValueId, ValueType};
    use crate::lower::program::{Program, RunDims, Storage};
    use crate::lower::{ConvProblem, GemmProblem, Instance, LowerCtx, LowerResult, Precision, Target};
    use serde_json::{json, Map, Value as Json};
    use std::sync::Arc;

    pub struct Builder {
        pub g: Graph,
    }

    impl Builder {
        pub fn new() -> Builder {
            Builder { g: Graph::default() }
        }

        pub fn input(&mut self, name: &str, dt: DType, shape: Vec<Dim>) -> ValueId {
            let v = self.g.add_value(name.to_string(), Some(ValueType::new(dt, shape)));
            self.g.inputs.push(v);
            v
        }

        pub fn konst(&mut self, name: &str, t: Tensor) -> ValueId {
            let shape = crate::ir::dim::dims_of(t.shape());
            let v = self.g.add_value(name.to_string(), Some(ValueType::new(t.dtype(), shape)));
            self.g.values[v].konst = Some(Arc::new(t));
            v
        }

        /// Appends a node (its outputs typed by the op's own inference) and returns its outputs.
        pub fn node(&mut self, op: Box<dyn Op>, inputs: &[Option<ValueId>]) -> Vec<ValueId> {
            let facts: Vec<Option<Fact>> = inputs
                .iter()
                .map(|i| {
                    i.map(|v| {
                        let val = self.g.value(v);
                        match &val.konst {
                            Some(k) => Fact::constant(k.clone()),
                            None => Fact::of_type(val.ty.clone().expect("typed")),
                        }
                    })
                })
                .collect();
            let refs: Vec<Option<&Fact>> = facts.iter().map(|f| f.as_ref()).collect();
            let outs = op.infer(&refs).unwrap_or_else(|e| panic!("{}: {}", op.op_type(), e.0));
            let id = self.g.nodes.len();
            let outputs: Vec<ValueId> =
                outs.into_iter().enumerate().map(|(k, f)| self.g.add_value(format!("n{id}.{k}"), Some(f.ty))).collect();
            self.g.nodes.push(Node {
                name: format!("n{id}"),
                op_type: op.op_type().to_string(),
                domain: String::new(),
                op,
                inputs: inputs.to_vec(),
                outputs: outputs.clone(),
            });
            outputs
        }
    }

    struct NoLibraries;

    impl Target for NoLibraries {
        fn name(&self) -> &'static str {
            "cuda"
        }
        fn arch_name(&self) -> String {
            "sm_90".into()
        }
        fn warp_size(&self) -> i64 {
            32
        }
        fn conv2d(&self, _: &ConvProblem) -> Instance {
            Instance::own("none", Map::new())
        }
        fn gemm(&self, _: &GemmProblem) -> Instance {
            Instance::own("none", Map::new())
        }
        fn conv_channel_multiple(&self) -> usize {
            8
        }
    }

    /// Lowers every node of `g` with `table`; a symbolic dim `N` is the batch (max 64).
    pub fn lower(g: &Graph, table: &[LowerSpec]) -> LowerResult<Program> {
        lower_at(g, table, Precision::Fp16)
    }

    /// [`lower`] at a given storage precision.
    pub fn lower_at(g: &Graph, table: &[LowerSpec], precision: Precision) -> LowerResult<Program> {
        let has_n = g
            .values
            .iter()
            .any(|v| v.ty.as_ref().is_some_and(|t| t.shape.iter().any(|d| d.symbols().any(|s| s == "N"))));
        let program = Program::empty(
            "test".into(),
            "test.onnx".into(),
            if has_n { RunDims::batch_only("N", 64) } else { RunDims::none() },
        );
        let mut cx = LowerCtx {
            graph: g,
            target: &NoLibraries,
            program,
            value_tensor: vec![None; g.values.len()],
            bound: Default::default(),
            precision,
        };
        for (index, &v) in g.inputs.iter().enumerate() {
            let ty = g.value(v).ty.clone().expect("typed");
            let t = cx.push_tensor(
                &g.value(v).name.clone(),
                precision.device_dtype(ty.dtype)?,
                ty.shape,
                Storage::Input { index },
            );
            cx.value_tensor[v] = Some(t);
        }
        for node in &g.nodes {
            let spec = table
                .iter()
                .find(|s| s.op_type == node.op.op_type() && (s.is)(node.op.as_any()))
                .unwrap_or_else(|| panic!("no lowering for {}", node.op.op_type()));
            (spec.lower)(&mut cx, node)?;
        }
        Ok(cx.program)
    }

    /// Renders every kernel of `p` (and `common.cuh`); returns (file name, text) pairs. `tag` names
    /// the files written to `O2A_RENDER_DIR`.
    pub fn render(p: &Program, tag: &str) -> Vec<(String, String)> {
        let mut hb = handlebars::Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        for (path, text) in crate::codegen::TEMPLATE_FILES {
            let Some(rel) = path.strip_prefix("cuda/") else { continue };
            let name = rel.strip_suffix(".hbs").unwrap_or(rel);
            let name = name.strip_prefix("partials/").unwrap_or(name);
            hb.register_template_string(name, *text).unwrap_or_else(|e| panic!("template {path}: {e}"));
        }
        let mut files = vec![(
            "common.cuh".to_string(),
            hb.render("common.cuh", &json!({ "model_name": "test" })).unwrap_or_else(|e| panic!("common.cuh: {e}")),
        )];
        for k in &p.kernels {
            let mut ctx = k.context.clone();
            ctx.insert("node".into(), json!(k.node));
            ctx.insert("workspace_bytes".into(), json!(k.workspace_bytes));
            let text = hb
                .render(&format!("kernels/{}.cu", k.template), &Json::Object(ctx))
                .unwrap_or_else(|e| panic!("kernel {} ({}): {e}", k.name, k.template));
            files.push((format!("{}.cu", k.name), text));
        }
        if let Ok(dir) = std::env::var("O2A_RENDER_DIR") {
            let dir = std::path::Path::new(&dir);
            std::fs::create_dir_all(dir).expect("render dir");
            for (name, text) in &files {
                // Kernel names restart at k000 in every program: prefix with the test's tag.
                let file = if name == "common.cuh" { name.clone() } else { format!("{tag}_{name}") };
                std::fs::write(dir.join(file), text).expect("writing a rendered file");
            }
        }
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::ops::kernel::Act;

    use super::testkit::{lower, lower_at, render, Builder};

    fn n() -> Dim {
        Dim::sym("N")
    }

    fn ctx_of(p: &crate::lower::Program, k: usize) -> &Map<String, Json> {
        &p.kernels[k].context
    }

    #[test]
    fn fused_bias_relu_nhwc_vectorises() {
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n(), Dim::known(56), Dim::known(56), Dim::known(64)]);
        let bias = b.konst("bias", Tensor::from_f32s(&[64], vec![0.5; 64]));
        let e = EwExpr::Unary(
            Act::Relu,
            Box::new(EwExpr::Binary(BinOp::Add, Box::new(EwExpr::Input(0)), Box::new(EwExpr::Input(1)))),
        );
        b.node(Box::new(Elementwise::new(e, 2).unwrap()), &[Some(x), Some(bias)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = ctx_of(&p, 0);
        assert_eq!(c["vec"], json!(8));
        assert_eq!(c["n"], json!("((int64_t)200704*dims.v[0])"));
        assert_eq!(c["idx_t"], json!("int32_t"));
        assert_eq!(c["expr"], json!("o2a_relu(o2a_add(v0, v1))"));
        assert_eq!(c["inputs"][0]["offset"], json!("idx"));
        assert_eq!(c["inputs"][1]["offset"], json!("(idx % 64)"));
        assert_eq!(c["inputs"][1]["contig"], json!(true));
        let files = render(&p, "fused_bias_relu");
        assert!(files[1].1.contains("o2a_vector"), "{}", files[1].1);
    }

    #[test]
    fn nchw_channel_scale_splats() {
        let mut b = Builder::new();
        let x = b.input("x", DType::F16, vec![n(), Dim::known(64), Dim::known(56), Dim::known(56)]);
        let s = b.input("s", DType::F16, vec![n(), Dim::known(64), Dim::known(1), Dim::known(1)]);
        b.node(Box::new(Elementwise::binary(BinOp::Mul)), &[Some(x), Some(s)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = ctx_of(&p, 0);
        assert_eq!(c["vec"], json!(8));
        assert_eq!(c["inputs"][1]["offset"], json!("(idx / 3136)"));
        assert_eq!(c["inputs"][1]["contig"], json!(false));
        render(&p, "nchw_channel_scale");
    }

    #[test]
    fn onnx_ops_render() {
        use crate::ir::ops::testutil::parse_node as parse;
        let mut b = Builder::new();
        let a = b.input("a", DType::I64, vec![Dim::known(3), Dim::known(1)]);
        let c = b.input("c", DType::I64, vec![Dim::known(4)]);
        let f = b.input("f", DType::F32, vec![n(), Dim::known(6)]);
        let g = b.input("g", DType::F32, vec![Dim::known(6)]);
        let m = b.input("m", DType::Bool, vec![n(), Dim::known(1)]);
        for op in ["Add", "Sub", "Mul", "Div", "Max"] {
            b.node(parse(op, 14, &[], &[true, true], 1).unwrap(), &[Some(a), Some(c)]);
        }
        b.node(parse("Mod", 13, &[], &[true, true], 1).unwrap(), &[Some(a), Some(c)]);
        b.node(parse("Mod", 13, &[("fmod", crate::ir::Attr::Int(1))], &[true, true], 1).unwrap(), &[Some(f), Some(g)]);
        let e = b.input("e", DType::I64, vec![Dim::known(6)]);
        b.node(parse("Pow", 15, &[], &[true, true], 1).unwrap(), &[Some(f), Some(e)]);
        b.node(parse("Pow", 15, &[], &[true, true], 1).unwrap(), &[Some(a), Some(c)]);
        let lt = b.node(parse("Less", 13, &[], &[true, true], 1).unwrap(), &[Some(f), Some(g)]);
        b.node(parse("Xor", 7, &[], &[true, true], 1).unwrap(), &[Some(lt[0]), Some(m)]);
        b.node(parse("Where", 16, &[], &[true, true, true], 1).unwrap(), &[Some(m), Some(f), Some(g)]);
        b.node(parse("IsNaN", 13, &[], &[true], 1).unwrap(), &[Some(f)]);
        b.node(parse("Neg", 13, &[], &[true], 1).unwrap(), &[Some(a)]);
        b.node(parse("Round", 11, &[], &[true], 1).unwrap(), &[Some(f)]);
        b.node(parse("Sum", 13, &[], &[true, true, true], 1).unwrap(), &[Some(f), Some(g), Some(f)]);
        b.node(parse("Mean", 13, &[], &[true, true], 1).unwrap(), &[Some(f), Some(g)]);
        b.node(parse("Softplus", 13, &[], &[true], 1).unwrap(), &[Some(f)]);
        b.node(parse("Relu", 14, &[], &[true], 1).unwrap(), &[Some(a)]);
        b.node(parse("PRelu", 16, &[], &[true, true], 1).unwrap(), &[Some(f), Some(g)]);
        let lo = b.konst("lo", Tensor::from_f32s(&[], vec![-1.5]));
        b.node(parse("Clip", 13, &[], &[true, true, false], 1).unwrap(), &[Some(f), Some(lo), None]);
        let hi = b.input("hi", DType::I64, vec![]);
        b.node(parse("Clip", 13, &[], &[true, false, true], 1).unwrap(), &[Some(a), None, Some(hi)]);
        let u = b.input("u", DType::U8, vec![Dim::known(16)]);
        b.node(
            parse("BitShift", 11, &[("direction", crate::ir::Attr::String("LEFT".into()))], &[true, true], 1).unwrap(),
            &[Some(u), Some(u)],
        );
        b.node(parse("BitwiseNot", 18, &[], &[true], 1).unwrap(), &[Some(u)]);
        let p = lower(&b.g, OPS).unwrap();
        let exprs: Vec<String> = p.kernels.iter().map(|k| k.context["expr"].as_str().unwrap().to_string()).collect();
        assert_eq!(exprs[3], "o2a_idiv(v0, v1)");
        assert_eq!(exprs[5], "o2a_imod(v0, v1, false)");
        assert_eq!(exprs[6], "o2a_fmod(v0, v1)");
        assert_eq!(exprs[7], "powf(v0, static_cast<float>(v1))");
        assert_eq!(exprs[15], "((v0 + v1) + v2)");
        assert_eq!(exprs[16], "((v0 + v1) / 2.0f)");
        assert_eq!(exprs[20], "o2a_onnx_clip<float>(v0, (-1.5f), 3.4028235e38f)");
        assert_eq!(exprs[21], "o2a_onnx_clip<int64_t>(v0, std::numeric_limits<int64_t>::lowest(), v1)");
        assert_eq!(p.kernels[9].context["out_ctype"], json!("bool"));
        render(&p, "onnx_ops");
    }

    #[test]
    fn batch_norm_folds_constants() {
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n(), Dim::known(2), Dim::known(5)]);
        let scale = b.konst("s", Tensor::from_f32s(&[2], vec![2.0, 1.0]));
        let bias = b.konst("b", Tensor::from_f32s(&[2], vec![1.0, 0.0]));
        let mean = b.konst("m", Tensor::from_f32s(&[2], vec![1.0, 0.0]));
        let var = b.konst("v", Tensor::from_f32s(&[2], vec![4.0, 1.0]));
        b.node(Box::new(BatchNorm { epsilon: 0.0 }), &[Some(x), Some(scale), Some(bias), Some(mean), Some(var)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = ctx_of(&p, 0);
        assert_eq!(c["expr"], json!("(v0 * v1 + v2)"));
        assert_eq!(c["inputs"][1]["offset"], json!("((idx / 5) % 2)"));
        // a = [1, 1], b = [0, 0] as fp16 in the weights blob
        let a_t = p.kernels[0].args[1];
        let crate::lower::Storage::Weight { offset, .. } = p.tensors[a_t].storage else { panic!("weight") };
        let h = half::f16::from_le_bytes([p.weights[offset as usize], p.weights[offset as usize + 1]]);
        assert_eq!(h.to_f32(), 1.0);
        render(&p, "batch_norm");
    }

    fn d(v: &[i64]) -> Vec<Dim> {
        v.iter().map(|&x| Dim::known(x)).collect()
    }

    #[test]
    fn runs_merge_and_classify() {
        // per-channel NCHW bias [1,C,1,1] against [N,C,H,W]
        let out = vec![Dim::sym("N"), Dim::known(64), Dim::known(56), Dim::known(56)];
        let r = broadcast_runs(&out, &d(&[1, 64, 1, 1])).unwrap();
        assert_eq!(
            r,
            vec![
                Run { size: Dim::known(3136), read: false },
                Run { size: Dim::known(64), read: true },
                Run { size: Dim::sym("N"), read: false }
            ]
        );
        // the output itself: one read run
        let r = broadcast_runs(&out, &out).unwrap();
        assert_eq!(r.len(), 1);
        assert!(r[0].read);
        // NHWC per-channel vector [C]
        let r = broadcast_runs(&d(&[8, 7, 7, 64]), &d(&[64])).unwrap();
        assert_eq!(r, vec![Run { size: Dim::known(64), read: true }, Run { size: Dim::known(392), read: false }]);
        assert!(broadcast_runs(&d(&[2, 3]), &d(&[4])).is_err());
        assert_eq!(vector_mode(&broadcast_runs(&d(&[8, 64]), &d(&[64])).unwrap(), 8), Some(true));
        assert_eq!(vector_mode(&broadcast_runs(&d(&[8, 6]), &d(&[6])).unwrap(), 8), None);
        assert_eq!(vector_mode(&broadcast_runs(&d(&[8, 6]), &d(&[1])).unwrap(), 8), Some(false));
    }

    #[test]
    fn fused_expressions_render() {
        let e = EwExpr::Binary(
            BinOp::Mul,
            Box::new(EwExpr::Input(0)),
            Box::new(EwExpr::Unary(Act::Sigmoid, Box::new(EwExpr::Input(0)))),
        );
        assert_eq!(render_expr(&e), "o2a_mul(v0, o2a_sigmoid(v0))");
        let e = EwExpr::Unary(Act::Clip { lo: 0.0, hi: 6.0 }, Box::new(EwExpr::Input(1)));
        assert_eq!(render_expr(&e), "o2a_clip(v1, 0.0f, 6.0f)");
        assert_eq!(binary_expr(BinaryKind::Div, DType::I64, "v0", "v1").unwrap(), "o2a_idiv(v0, v1)");
        assert_eq!(binary_expr(BinaryKind::Max, DType::F16, "a", "b").unwrap(), "o2a_max_nan(a, b)");
        assert!(binary_expr(BinaryKind::Add, DType::Bool, "a", "b").is_err());
        assert_eq!(unary_expr(UnaryKind::Round, DType::F16, "v0").unwrap(), "o2a_round(v0)");
        assert!(unary_expr(UnaryKind::Neg, DType::U8, "v0").is_err());
        assert_eq!(activation_expr(Activation::Selu { alpha: 2.0, gamma: 0.5 }, "v0"), "o2a_selu(v0, 2.0f, 0.5f)");
    }

    /// fp32 precision: float operands stay fp32 (loaded as float, 4 per 16-byte access), the
    /// float-only families (fused chains, Sum/Mean, unary math, Clip, comparisons, IsNaN,
    /// BatchNormalization) accept them, and folded constants are fp32 weights.
    #[test]
    fn fp32_operands() {
        use crate::ir::ops::testutil::parse_node as parse;
        use crate::lower::Precision;
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n(), Dim::known(56), Dim::known(56), Dim::known(64)]);
        let bias = b.konst("bias", Tensor::from_f32s(&[64], vec![0.5; 64]));
        let e = EwExpr::Unary(
            Act::Relu,
            Box::new(EwExpr::Binary(BinOp::Add, Box::new(EwExpr::Input(0)), Box::new(EwExpr::Input(1)))),
        );
        b.node(Box::new(Elementwise::new(e, 2).unwrap()), &[Some(x), Some(bias)]);
        let f = b.input("f", DType::F32, vec![n(), Dim::known(6)]);
        let g = b.input("g", DType::F32, vec![Dim::known(6)]);
        b.node(parse("Sum", 13, &[], &[true, true, true], 1).unwrap(), &[Some(f), Some(g), Some(f)]);
        b.node(parse("Exp", 13, &[], &[true], 1).unwrap(), &[Some(f)]);
        b.node(parse("Clip", 13, &[], &[true], 1).unwrap(), &[Some(f)]);
        b.node(parse("Less", 13, &[], &[true, true], 1).unwrap(), &[Some(f), Some(g)]);
        b.node(parse("IsNaN", 13, &[], &[true], 1).unwrap(), &[Some(f)]);
        let c = b.input("c", DType::F32, vec![n(), Dim::known(2), Dim::known(5)]);
        let scale = b.konst("s", Tensor::from_f32s(&[2], vec![2.0, 1.0]));
        let shift = b.konst("b", Tensor::from_f32s(&[2], vec![1.0, 0.0]));
        let mean = b.konst("m", Tensor::from_f32s(&[2], vec![1.0, 0.0]));
        let var = b.konst("v", Tensor::from_f32s(&[2], vec![4.0, 1.0]));
        b.node(Box::new(BatchNorm { epsilon: 0.0 }), &[Some(c), Some(scale), Some(shift), Some(mean), Some(var)]);
        let p = lower_at(&b.g, OPS, Precision::Fp32).unwrap();
        assert_eq!(p.kernels.len(), 7);
        let fused = ctx_of(&p, 0);
        assert_eq!(fused["vec"], json!(4));
        assert_eq!(fused["out_ctype"], json!("float"));
        for k in &p.kernels {
            let c = &k.context;
            for i in c["inputs"].as_array().unwrap() {
                assert_eq!((i["ctype"].as_str(), i["vtype"].as_str()), (Some("float"), Some("float")), "{}", k.name);
            }
        }
        assert_eq!(ctx_of(&p, 4)["out_ctype"], json!("bool"));
        // Clip without bounds: ±f32::MAX for an fp32 model.
        assert!(ctx_of(&p, 3)["expr"].as_str().unwrap().starts_with("o2a_onnx_clip<float>(v0, (-3.4028235e38f)"));
        // The folded BatchNorm scale a = [1, 1] is an fp32 weight.
        let a_t = p.kernels[6].args[1];
        assert_eq!(p.tensors[a_t].dtype, DType::F32);
        let crate::lower::Storage::Weight { offset, bytes } = p.tensors[a_t].storage else { panic!("weight") };
        let o = offset as usize;
        assert_eq!(
            (bytes, f32::from_le_bytes([p.weights[o], p.weights[o + 1], p.weights[o + 2], p.weights[o + 3]])),
            (8, 1.0)
        );
        for (name, text) in render(&p, "fp32_elementwise") {
            assert!(!text.contains("half") || name == "common.cuh", "{name} mentions half");
        }
    }
}
