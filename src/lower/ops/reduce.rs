//! Reductions over axes known at compile time: the optimiser's `ReduceMean` and the ONNX
//! `Reduce*` family (Sum, Mean, Max, Min, Prod, L1, L2, SumSquare, LogSum, LogSumExp) and
//! `ArgMax`/`ArgMin`, one template (`reduce.cu.hbs`).
//!
//! The input is simplified first (size-1 axes dropped, adjacent axes that are both kept or both
//! reduced merged). Each output element reduces `count` input elements at `base(o) + red(r)`,
//! both offsets rendered as C++ expressions with the dims as constants. Floating-point
//! reductions whose innermost axis is reduced give each output a warp (or a block for long
//! reductions): consecutive lanes read consecutive elements. Otherwise (innermost axis kept,
//! integer and bool reductions, arg-reductions) one thread computes one output sequentially,
//! consecutive threads reading consecutive elements.
//!
//! Semantics follow `src/reference/reduce.rs`: float data (fp16 or fp32) is reduced in fp32;
//! Max/Min skip NaN unless it is the first element (the result is then NaN); an empty reduction
//! gives the identity (0 for sums and means, 1 for products, ∓inf for max/min, -inf for the log
//! reductions); integer Sum/Mean accumulate exactly (128-bit) and saturate, the mean truncating
//! toward zero; bool Max/Min are any/all; ArgMax/ArgMin scan from the first element (a NaN first
//! element wins, later NaNs never do), ties to the first or, with `select_last_index`, the last.

use super::act::float_lit;
use super::elementwise::index_type;
use super::{is_device_float, LowerSpec};
use crate::ir::broadcast::{normalize_axes, normalize_axis};
use crate::ir::dim::product;
use crate::ir::ops::kernel::ReduceMean as KernelReduceMean;
use crate::ir::ops::reduce::ReduceKind;
use crate::ir::ops::reduce::{ArgReduce, Reduce, ReduceAxes};
use crate::ir::{DType, Dim, Node};
use crate::lower::{ctype, LowerCtx, LowerError, LowerResult, TensorId};
use crate::lower_unsupported;
use serde_json::{json, Map};

pub const OPS: &[LowerSpec] = &[
    LowerSpec::of::<KernelReduceMean>("ReduceMean", lower_kernel_reduce_mean),
    LowerSpec::of::<Reduce>("ReduceSum", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceMean", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceMax", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceMin", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceProd", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceL1", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceL2", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceSumSquare", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceLogSum", lower_reduce),
    LowerSpec::of::<Reduce>("ReduceLogSumExp", lower_reduce),
    LowerSpec::of::<ArgReduce>("ArgMax", lower_arg_reduce),
    LowerSpec::of::<ArgReduce>("ArgMin", lower_arg_reduce),
];

/// The input viewed as merged runs of kept or reduced axes (outermost first), size-1 axes
/// dropped.
fn merged_runs(shape: &[Dim], reduced: &[usize]) -> Vec<(Dim, bool)> {
    let one = Dim::known(1);
    let mut runs: Vec<(Dim, bool)> = Vec::new();
    for (a, d) in shape.iter().enumerate() {
        if *d == one {
            continue;
        }
        let red = reduced.contains(&a);
        match runs.last_mut() {
            Some((size, r)) if *r == red => *size = size.mul(d),
            _ => runs.push((d.clone(), red)),
        }
    }
    runs
}

/// The C++ offset of the element with linear index `var` over `dims` (outermost first), each
/// coordinate multiplied by its stride: `[(size, stride)]`.
fn decompose(cx: &LowerCtx, dims: &[(Dim, Dim)], var: &str) -> LowerResult<String> {
    let one = Dim::known(1);
    let mut terms = Vec::new();
    let mut inner = one.clone();
    for (k, (size, stride)) in dims.iter().enumerate().rev() {
        let coord = match (inner == one, k == 0) {
            (true, true) => var.to_string(),
            (true, false) => format!("({var} % {})", cx.expr(size)?),
            (false, true) => format!("({var} / {})", cx.expr(&inner)?),
            (false, false) => format!("(({var} / {}) % {})", cx.expr(&inner)?, cx.expr(size)?),
        };
        terms.push(if *stride == one { coord } else { format!("{coord} * {}", cx.expr(stride)?) });
        inner = inner.mul(size);
    }
    Ok(match terms.len() {
        0 => "0".to_string(),
        1 => terms.remove(0),
        _ => format!("({})", terms.join(" + ")),
    })
}

/// The reduction geometry: outputs, elements per output, base and reduced offsets, and whether
/// the innermost input axis is reduced.
struct Geometry {
    outputs: Dim,
    count: Dim,
    base: String,
    red: String,
    inner_reduced: bool,
}

fn geometry(cx: &LowerCtx, shape: &[Dim], reduced: &[usize]) -> LowerResult<Geometry> {
    let runs = merged_runs(shape, reduced);
    let mut strides = vec![Dim::known(1); runs.len()];
    for k in (0..runs.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1].mul(&runs[k + 1].0);
    }
    let kept: Vec<(Dim, Dim)> =
        runs.iter().zip(&strides).filter(|((_, r), _)| !r).map(|((s, _), st)| (s.clone(), st.clone())).collect();
    let red: Vec<(Dim, Dim)> =
        runs.iter().zip(&strides).filter(|((_, r), _)| *r).map(|((s, _), st)| (s.clone(), st.clone())).collect();
    let outputs = product(&kept.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>());
    // Size-1 reduced axes were dropped: the count is over every reduced axis of the input.
    let count = product(&reduced.iter().map(|&a| shape[a].clone()).collect::<Vec<_>>());
    Ok(Geometry {
        outputs,
        count,
        base: decompose(cx, &kept, "o")?,
        red: decompose(cx, &red, "r")?,
        inner_reduced: runs.last().is_some_and(|(_, r)| *r),
    })
}

/// The C++ pieces of one reduction: accumulator type, identity, how a value is taken, how two
/// partial results merge, and the final value (in `acc`, `count`, `first`).
struct Arith {
    acc_t: String,
    init: String,
    take: String,
    merge: String,
    finish: String,
    /// LogSumExp: a max pass, then a sum of exp(v - max) pass.
    lse: bool,
    /// Partial results can be combined across threads (floating point).
    parallel: bool,
}

fn arith(kind: ReduceKind, dt: DType) -> LowerResult<Arith> {
    let a = |acc_t: &str, init: String, take: &str, merge: &str, finish: &str, parallel: bool| Arith {
        acc_t: acc_t.into(),
        init,
        take: take.into(),
        merge: merge.into(),
        finish: finish.into(),
        lse: false,
        parallel,
    };
    if is_device_float(dt) {
        let inf = float_lit(f32::INFINITY);
        let ninf = float_lit(f32::NEG_INFINITY);
        let first_nan = "(count > 0 && first != first ? first : acc)";
        return Ok(match kind {
            ReduceKind::Sum => a("float", "0.0f".into(), "acc + v", "a + b", "acc", true),
            ReduceKind::Mean => a(
                "float",
                "0.0f".into(),
                "acc + v",
                "a + b",
                "(count == 0 ? 0.0f : acc / static_cast<float>(count))",
                true,
            ),
            ReduceKind::Max => a("float", ninf, "fmaxf(acc, v)", "fmaxf(a, b)", first_nan, true),
            ReduceKind::Min => a("float", inf, "fminf(acc, v)", "fminf(a, b)", first_nan, true),
            ReduceKind::Prod => a("float", "1.0f".into(), "acc * v", "a * b", "acc", true),
            ReduceKind::L1 => a("float", "0.0f".into(), "acc + fabsf(v)", "a + b", "acc", true),
            ReduceKind::L2 => a("float", "0.0f".into(), "acc + v * v", "a + b", "sqrtf(acc)", true),
            ReduceKind::SumSquare => a("float", "0.0f".into(), "acc + v * v", "a + b", "acc", true),
            ReduceKind::LogSum => a("float", "0.0f".into(), "acc + v", "a + b", "logf(acc)", true),
            ReduceKind::LogSumExp => Arith { lse: true, ..a("float", "0.0f".into(), "acc + v", "a + b", "acc", true) },
        });
    }
    if dt == DType::Bool {
        return Ok(match kind {
            ReduceKind::Max => a("bool", "false".into(), "acc || v", "a || b", "acc", false),
            ReduceKind::Min => a("bool", "true".into(), "acc && v", "a && b", "acc", false),
            _ => lower_unsupported!("{kind:?} of bool tensors"),
        });
    }
    if dt.is_int() {
        let t = ctype(dt);
        // Sums accumulate exactly in 128 bits and saturate to the element type at the end.
        let sat = format!("o2a_saturate<{t}>(acc)");
        let sat_mean =
            format!("(count == 0 ? static_cast<{t}>(0) : o2a_saturate<{t}>(acc / static_cast<__int128>(count)))");
        return Ok(match kind {
            ReduceKind::Sum => a("__int128", "0".into(), "acc + static_cast<__int128>(v)", "a + b", &sat, false),
            ReduceKind::Mean => a("__int128", "0".into(), "acc + static_cast<__int128>(v)", "a + b", &sat_mean, false),
            ReduceKind::Max => a(
                t,
                format!("std::numeric_limits<{t}>::lowest()"),
                "(v > acc ? v : acc)",
                "(b > a ? b : a)",
                "acc",
                false,
            ),
            ReduceKind::Min => {
                a(t, format!("std::numeric_limits<{t}>::max()"), "(v < acc ? v : acc)", "(b < a ? b : a)", "acc", false)
            }
            _ => lower_unsupported!("{kind:?} of {dt} tensors"),
        });
    }
    lower_unsupported!("{kind:?} of {dt} tensors")
}

/// Threads per output of the parallel kernel for `count` elements (0: one thread per output).
fn threads_per_output(cx: &LowerCtx, g: &Geometry, parallel: bool) -> LowerResult<i64> {
    if !parallel || !g.inner_reduced {
        return Ok(0);
    }
    let count = cx.upper_bound(&g.count)?;
    Ok(if count <= 2048 {
        cx.target.warp_size()
    } else if count <= 65536 {
        256
    } else {
        1024
    })
}

#[allow(clippy::too_many_arguments)]
fn emit_reduce(
    cx: &mut LowerCtx,
    node: &Node,
    x: TensorId,
    out: TensorId,
    g: &Geometry,
    ar: &Arith,
    arg: Option<(bool, bool)>,
) -> LowerResult<()> {
    let mut c = Map::new();
    let threads = if arg.is_some() { 0 } else { threads_per_output(cx, g, ar.parallel)? };
    c.insert("ctype".into(), json!(ctype(cx.dtype(x))));
    c.insert("vtype".into(), json!(if is_device_float(cx.dtype(x)) { "float" } else { ctype(cx.dtype(x)) }));
    c.insert("out_ctype".into(), json!(ctype(cx.dtype(out))));
    c.insert("outputs".into(), json!(cx.expr(&g.outputs)?));
    c.insert("count".into(), json!(cx.expr(&g.count)?));
    c.insert("base".into(), json!(g.base));
    c.insert("red".into(), json!(g.red));
    let n_in = product(cx.shape(x));
    c.insert("idx_t".into(), json!(index_type(cx, &n_in)?));
    c.insert("threads".into(), json!(threads));
    c.insert("parallel".into(), json!(threads > 0));
    c.insert("acc_t".into(), json!(ar.acc_t));
    c.insert("init".into(), json!(ar.init));
    c.insert("take".into(), json!(ar.take));
    c.insert("merge".into(), json!(ar.merge));
    c.insert("finish".into(), json!(ar.finish));
    c.insert("lse".into(), json!(ar.lse));
    c.insert("arg".into(), json!(arg.is_some()));
    let (want_max, last) = arg.unwrap_or((true, false));
    c.insert("arg_cmp".into(), json!(if want_max { ">" } else { "<" }));
    c.insert("select_last".into(), json!(last));
    cx.emit(&node.name, "reduce", vec![x, out], vec![1], c, 0)
}

/// Kernel-level ReduceMean (fp16 or fp32 storage, fp32 accumulation).
fn lower_kernel_reduce_mean(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<KernelReduceMean>() else {
        return Err(LowerError::Invalid("not a ReduceMean node".into()));
    };
    let x = cx.input(node, 0)?;
    let shape = cx.shape(x).to_vec();
    let axes = normalize_axes(&op.axes, shape.len()).map_err(|e| LowerError::Invalid(e.0))?;
    let dt = cx.dtype(x);
    if !is_device_float(dt) {
        lower_unsupported!("ReduceMean of {dt} tensors");
    }
    let out = cx.output(node, 0)?;
    let g = geometry(cx, &shape, &axes)?;
    emit_reduce(cx, node, x, out, &g, &arith(ReduceKind::Mean, dt)?, None)
}

/// The ONNX reductions (opset 1–20): axes from the attribute (before 13 for ReduceSum, 18 for
/// the others) or from input 1, which must be a compile-time constant; empty axes reduce
/// everything, or nothing with `noop_with_empty_axes` (then each element is mapped alone).
fn lower_reduce(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<Reduce>() else {
        return Err(LowerError::Invalid("not a Reduce node".into()));
    };
    let x = cx.input(node, 0)?;
    let shape = cx.shape(x).to_vec();
    let given: Vec<i64> = match &op.axes {
        ReduceAxes::Attr(a) => a.clone(),
        ReduceAxes::Input => match node.inputs.get(1).copied().flatten() {
            None => Vec::new(),
            Some(_) => match cx.konst(node, 1) {
                Some(t) => t.to_i64_vec(),
                None => lower_unsupported!("{}: the axes input is not a compile-time constant", op.op_name),
            },
        },
    };
    let axes = if given.is_empty() {
        if op.noop_with_empty_axes {
            Vec::new()
        } else {
            (0..shape.len()).collect()
        }
    } else {
        normalize_axes(&given, shape.len()).map_err(|e| LowerError::Invalid(e.0))?
    };
    let dt = cx.dtype(x);
    let ar = arith(op.kind, dt)?;
    let out = cx.output(node, 0)?;
    let g = geometry(cx, &shape, &axes)?;
    emit_reduce(cx, node, x, out, &g, &ar, None)
}

/// ArgMax / ArgMin (opset 1, 11: negative axes, 12: `select_last_index`, 13: types) over one
/// axis, int64 output.
fn lower_arg_reduce(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let Some(op) = node.op.downcast_ref::<ArgReduce>() else {
        return Err(LowerError::Invalid("not an ArgMax/ArgMin node".into()));
    };
    let x = cx.input(node, 0)?;
    let shape = cx.shape(x).to_vec();
    let axis = normalize_axis(op.axis, shape.len()).map_err(|e| LowerError::Invalid(e.0))?;
    let dt = cx.dtype(x);
    if !(is_device_float(dt) || dt.is_int()) {
        lower_unsupported!("{} of {dt} tensors", node.op.op_type());
    }
    let out = cx.output(node, 0)?;
    let g = geometry(cx, &shape, &[axis])?;
    let vt = if is_device_float(dt) { "float" } else { ctype(dt) };
    let ar = Arith {
        acc_t: vt.into(),
        init: "0".into(),
        take: "v".into(),
        merge: "a".into(),
        finish: "acc".into(),
        lse: false,
        parallel: false,
    };
    emit_reduce(cx, node, x, out, &g, &ar, Some((op.want_max, op.select_last_index)))
}

#[cfg(test)]
mod tests {
    use super::super::elementwise::testkit::{lower, render, Builder};
    use super::*;
    use crate::ir::ops::testutil::parse_node as parse;
    use crate::ir::{Attr, Tensor};

    fn d(v: &[i64]) -> Vec<Dim> {
        v.iter().map(|&x| Dim::known(x)).collect()
    }

    #[test]
    fn runs_merge() {
        assert_eq!(merged_runs(&d(&[2, 3, 1, 4, 5]), &[3, 4]), vec![(Dim::known(6), false), (Dim::known(20), true)]);
        assert_eq!(merged_runs(&d(&[2, 3, 4]), &[0, 2]).len(), 3);
    }

    #[test]
    fn reductions_render() {
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(128), Dim::known(768)]);
        b.node(Box::new(KernelReduceMean { axes: vec![-1], keepdims: true }), &[Some(x)]);
        b.node(parse("ReduceSum", 11, &[("axes", Attr::Ints(vec![1]))], &[true], 1).unwrap(), &[Some(x)]);
        let ax = b.konst("axes", Tensor::from_i64s(&[2], vec![0, 2]));
        b.node(parse("ReduceMax", 18, &[], &[true, true], 1).unwrap(), &[Some(x), Some(ax)]);
        b.node(parse("ReduceLogSumExp", 13, &[("keepdims", Attr::Int(0))], &[true], 1).unwrap(), &[Some(x)]);
        let i = b.input("i", DType::I64, vec![Dim::known(4), Dim::known(6)]);
        b.node(parse("ReduceSum", 13, &[], &[true], 1).unwrap(), &[Some(i)]);
        b.node(parse("ReduceMean", 13, &[("axes", Attr::Ints(vec![1]))], &[true], 1).unwrap(), &[Some(i)]);
        let bo = b.input("bo", DType::Bool, vec![Dim::known(4), Dim::known(6)]);
        b.node(parse("ReduceMin", 20, &[], &[true], 1).unwrap(), &[Some(bo)]);
        b.node(
            parse("ArgMax", 13, &[("axis", Attr::Int(1)), ("select_last_index", Attr::Int(1))], &[true], 1).unwrap(),
            &[Some(x)],
        );
        b.node(parse("ReduceL2", 13, &[("axes", Attr::Ints(vec![2]))], &[true], 1).unwrap(), &[Some(x)]);
        let p = lower(&b.g, OPS).unwrap();
        let c = &p.kernels[0].context;
        assert_eq!(
            (c["threads"].as_i64(), c["base"].as_str(), c["red"].as_str()),
            (Some(32), Some("o * 768"), Some("r"))
        );
        let c = &p.kernels[1].context;
        assert_eq!(
            (c["threads"].as_i64(), c["base"].as_str(), c["red"].as_str()),
            (Some(0), Some("((o % 768) + (o / 768) * 98304)"), Some("r * 768"))
        );
        let c = &p.kernels[2].context;
        assert_eq!((c["outputs"].as_str(), c["count"].as_str()), (Some("128"), Some("((int64_t)768*dims.v[0])")));
        assert_eq!(c["red"], json!("((r % 768) + (r / 768) * 98304)"));
        assert_eq!(p.kernels[3].context["lse"], json!(true));
        assert_eq!(p.kernels[3].context["threads"], json!(1024));
        assert_eq!(p.kernels[4].context["acc_t"], json!("__int128"));
        assert_eq!(p.kernels[7].context["arg"], json!(true));
        render(&p, "reduce");
    }

    /// fp32 precision: float reductions read fp32 and accumulate in fp32.
    #[test]
    fn fp32_reductions() {
        use super::super::elementwise::testkit::lower_at;
        use crate::lower::Precision;
        let n = Dim::sym("N");
        let mut b = Builder::new();
        let x = b.input("x", DType::F32, vec![n.clone(), Dim::known(128), Dim::known(768)]);
        b.node(Box::new(KernelReduceMean { axes: vec![-1], keepdims: true }), &[Some(x)]);
        b.node(parse("ReduceMax", 13, &[("axes", Attr::Ints(vec![1]))], &[true], 1).unwrap(), &[Some(x)]);
        b.node(parse("ReduceLogSumExp", 13, &[("keepdims", Attr::Int(0))], &[true], 1).unwrap(), &[Some(x)]);
        b.node(parse("ArgMin", 13, &[("axis", Attr::Int(2))], &[true], 1).unwrap(), &[Some(x)]);
        let p = lower_at(&b.g, OPS, Precision::Fp32).unwrap();
        for k in &p.kernels {
            let c = &k.context;
            assert_eq!((c["ctype"].as_str(), c["vtype"].as_str()), (Some("float"), Some("float")), "{}", k.name);
            assert_eq!(c["acc_t"], json!("float"), "{}", k.name);
        }
        assert_eq!(p.kernels[0].context["out_ctype"], json!("float"));
        assert_eq!(p.kernels[3].context["out_ctype"], json!("int64_t"));
        render(&p, "reduce_fp32");
    }
}
