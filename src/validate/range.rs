//! Float16 range check: which floating-point values of a graph leave float16's finite range.
//!
//! The GPU library stores every float activation and weight in float16 (fp32 accumulation
//! inside kernels only), whose largest finite value is 65504. A model whose float32 activations
//! grow past that overflows to ±Inf on the GPU, and the next normalisation or softmax turns the
//! Infs into NaN (`Inf − Inf`). No order of operations avoids it when the values themselves are
//! that large, so the useful answer is a diagnosis: which value first leaves the range, how far,
//! and the largest one. [`fp16_range`] runs the reference executor on the graph the GPU code is
//! generated from (the optimised kernel graph) and measures the largest magnitude of every float
//! value; [`weights_over_fp16`] needs no inputs and checks the (folded) constants.

use crate::error::Result;
use crate::ir::graph::Node;
use crate::ir::ops::arithmetic::UnaryKind;
use crate::ir::ops::arithmetic::UnaryOp;
use crate::ir::ops::reduce::ReduceKind;
use crate::ir::ops::reduce::{Reduce, ReduceAxes};
use crate::ir::{Dim, Graph, Tensor, ValueId, ValueType};
use serde::Serialize;
use std::collections::BTreeMap;

/// The largest finite float16 value.
pub const F16_MAX: f64 = 65504.0;

/// The largest magnitude one value reaches.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ValueRange {
    pub value: String,
    /// The node computing it; `None` for graph inputs and constants.
    pub node: Option<String>,
    /// That node's op type (`Conv2d`, `Gemm`, …), `input` or `constant`.
    pub op: String,
    /// The ONNX nodes a fused kernel replaces (filled by [`optimised_fp16_range`]).
    pub onnx_nodes: Vec<String>,
    /// Largest |x|; +Inf when the value holds an infinity or a NaN.
    pub max_abs: f64,
}

/// Every float value's largest magnitude, and the ones float16 cannot hold.
#[derive(Clone, Debug, Serialize)]
pub struct RangeReport {
    /// Float values measured (inputs, node outputs and constants).
    pub checked: usize,
    /// Values past [`F16_MAX`], constants first, then inputs and node outputs in execution order.
    pub over: Vec<ValueRange>,
    /// The value of largest magnitude.
    pub largest: Option<ValueRange>,
}

impl RangeReport {
    pub fn overflows(&self) -> bool {
        !self.over.is_empty()
    }

    /// One paragraph for reports: how many values overflow, the first and the largest.
    pub fn summary(&self) -> String {
        let Some(first) = self.over.first() else {
            return format!("all {} float values stay within float16's range (|x| ≤ 65504)", self.checked);
        };
        let mut s = format!(
            "{} of {} float values exceed float16's range (|x| > 65504) in float32 on these inputs; the first is {}",
            self.over.len(),
            self.checked,
            describe(first)
        );
        if let Some(l) = self.largest.as_ref().filter(|l| *l != first) {
            s.push_str(&format!(", the largest {}", describe(l)));
        }
        s.push_str(
            ". The GPU library stores float values as float16, so these become Inf (and NaN after the next \
             normalisation or softmax): the model's values are too large for float16 storage",
        );
        s
    }
}

fn describe(v: &ValueRange) -> String {
    let mut s = match &v.node {
        Some(n) => format!("'{}', output of {} {n}", v.value, v.op),
        None => format!("'{}' ({})", v.value, v.op),
    };
    if !v.onnx_nodes.is_empty() {
        s.push_str(&format!(" (ONNX {})", v.onnx_nodes.join(", ")));
    }
    format!("{s}, at {}", super::compare::fmt_num(v.max_abs))
}

/// Largest |x| of a tensor; +Inf if it holds a NaN or an infinity.
fn max_abs(t: &Tensor) -> f64 {
    t.to_f64_vec().iter().fold(0.0f64, |m, v| if v.is_finite() { m.max(v.abs()) } else { f64::INFINITY })
}

fn is_float(ty: Option<&ValueType>) -> bool {
    ty.is_some_and(|t| t.dtype.is_float())
}

/// Float constants of `g` whose magnitude exceeds float16's: folded weights that overflow
/// in the GPU library's float16 weights file, whatever the inputs.
pub fn weights_over_fp16(g: &Graph) -> Vec<ValueRange> {
    g.values
        .iter()
        .filter(|v| is_float(v.ty.as_ref()))
        .filter_map(|v| {
            let t = v.konst.as_ref()?;
            let m = max_abs(t);
            (m > F16_MAX).then(|| ValueRange {
                value: v.name.clone(),
                node: None,
                op: "constant".into(),
                onnx_nodes: Vec::new(),
                max_abs: m,
            })
        })
        .collect()
}

/// Measures every float value of `g` on `inputs` with the reference executor and reports the
/// ones float16 cannot hold.
///
/// Each measured value gets an `Abs → ReduceMax` pair whose scalar is a graph output of a copy
/// of `g`: the executor still frees every activation after its last reader, so memory stays
/// that of one inference, not of all activations at once.
pub fn fp16_range(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<RangeReport> {
    let mut probe = g.clone();
    probe.outputs.clear();
    // (value measured, node computing it) in execution order: inputs, then node outputs.
    let mut measured: Vec<(ValueId, Option<&Node>)> = g.inputs.iter().map(|&v| (v, None)).collect();
    for n in &g.nodes {
        measured.extend(n.outputs.iter().map(|&v| (v, Some(n))));
    }
    measured.retain(|(v, _)| {
        let ty = g.values[*v].ty.as_ref();
        // A value with no element has no magnitude (and ReduceMax of nothing is undefined).
        is_float(ty) && ty.is_some_and(|t| !t.shape.iter().any(|d| d.as_known() == Some(0)))
    });
    for (k, &(v, _)) in measured.iter().enumerate() {
        let ty = g.values[v].ty.clone().expect("measured values are typed");
        let abs = probe.add_value(format!("__range_abs_{k}"), Some(ty.clone()));
        let max = probe.add_value(format!("__range_max_{k}"), Some(ValueType::new(ty.dtype, Vec::<Dim>::new())));
        probe.nodes.push(Node {
            name: format!("__range_abs_{k}"),
            op_type: "Abs".into(),
            domain: String::new(),
            op: Box::new(UnaryOp { kind: UnaryKind::Abs }),
            inputs: vec![Some(v)],
            outputs: vec![abs],
        });
        probe.nodes.push(Node {
            name: format!("__range_max_{k}"),
            op_type: "ReduceMax".into(),
            domain: String::new(),
            op: Box::new(Reduce {
                kind: ReduceKind::Max,
                op_name: "ReduceMax",
                axes: ReduceAxes::Attr(Vec::new()),
                keepdims: false,
                noop_with_empty_axes: false,
            }),
            inputs: vec![Some(abs)],
            outputs: vec![max],
        });
        probe.outputs.push(max);
    }
    let maxima = crate::reference::run(&probe, inputs)?;
    let mut ranges: Vec<ValueRange> = g
        .values
        .iter()
        .filter(|v| is_float(v.ty.as_ref()))
        .filter_map(|v| {
            let t = v.konst.as_ref()?;
            Some(ValueRange {
                value: v.name.clone(),
                node: None,
                op: "constant".into(),
                onnx_nodes: Vec::new(),
                max_abs: max_abs(t),
            })
        })
        .collect();
    for (&(v, node), (_, m)) in measured.iter().zip(&maxima) {
        ranges.push(ValueRange {
            value: g.values[v].name.clone(),
            node: node.map(|n| n.name.clone()),
            op: node.map_or("input".to_string(), |n| n.op.op_type().to_string()),
            onnx_nodes: Vec::new(),
            max_abs: max_abs(m),
        });
    }
    let largest = ranges.iter().fold(None::<&ValueRange>, |best, r| match best {
        Some(b) if b.max_abs >= r.max_abs => Some(b),
        _ => Some(r),
    });
    Ok(RangeReport {
        checked: ranges.len(),
        largest: largest.cloned(),
        over: ranges.iter().filter(|r| r.max_abs > F16_MAX).cloned().collect(),
    })
}

/// [`fp16_range`] of the graph the GPU code is generated from: `g` optimised with the standard
/// rules. Kernel nodes that replace several ONNX nodes list those nodes' names, since the kernel
/// graph's own names are generated.
pub fn optimised_fp16_range(g: &Graph, inputs: &BTreeMap<String, Tensor>) -> Result<RangeReport> {
    let (optimised, explain) = crate::egraph::optimize(g, &crate::egraph::OptimizeOptions::standard()?)?;
    let mut r = fp16_range(&optimised, inputs)?;
    let fused: BTreeMap<&str, &Vec<String>> =
        explain.fusions.iter().map(|f| (f.node.as_str(), &f.onnx_nodes)).collect();
    for v in r.over.iter_mut().chain(r.largest.as_mut()) {
        if let Some(onnx) = v.node.as_deref().and_then(|n| fused.get(n)) {
            v.onnx_nodes = onnx.to_vec();
        }
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::infer::infer_graph;
    use crate::ir::ops::testutil::GraphBuilder;
    use crate::ir::DType;

    /// x·w1 → ·w2 → Relu, with scalar weights: the second product is the first past 65504.
    fn chain(w1: f32, w2: f32) -> Graph {
        let mut b = GraphBuilder::new(17);
        let x = b.input("x", DType::F32, "N,4");
        let c1 = b.konst("w1", Tensor::from_f32s(&[], vec![w1]));
        let c2 = b.konst("w2", Tensor::from_f32s(&[], vec![w2]));
        let y1 = b.node("Mul", vec![], &[x, c1], 1)[0];
        let y2 = b.node("Mul", vec![], &[y1, c2], 1)[0];
        let y3 = b.node("Relu", vec![], &[y2], 1)[0];
        b.g.outputs.push(y3);
        infer_graph(&mut b.g).expect("infers");
        b.g
    }

    fn x_input(v: Vec<f32>) -> BTreeMap<String, Tensor> {
        BTreeMap::from([("x".to_string(), Tensor::from_f32s(&[2, 4], v))])
    }

    #[test]
    fn finds_the_first_and_the_largest_value_past_float16() {
        let g = chain(300.0, 400.0);
        let x = vec![1.0, -2.0, 0.5, 0.0, 0.25, -0.125, 1.5, 0.75];
        let r = fp16_range(&g, &x_input(x)).expect("runs");
        // 2 constants, the input, three node outputs.
        assert_eq!(r.checked, 6);
        let names: Vec<&str> = r.over.iter().map(|v| v.value.as_str()).collect();
        // y1 peaks at 600; y2 at −240000 (|x| counts); Relu(y2) at 180000.
        assert_eq!(names, ["Mul_1_0", "Relu_2_0"], "{r:?}");
        assert_eq!(r.over[0].node.as_deref(), Some("Mul_1"));
        assert_eq!(r.over[0].op, "Mul");
        assert_eq!(r.over[0].max_abs, 240000.0);
        assert_eq!(r.over[1].max_abs, 180000.0);
        assert_eq!(r.largest.as_ref().map(|l| l.value.as_str()), Some("Mul_1_0"));
        let text = r.summary();
        assert!(text.contains("2 of 6 float values exceed float16's range"), "{text}");
        assert!(text.contains("'Mul_1_0', output of Mul Mul_1, at 2.40e5"), "{text}");
        assert!(!text.contains("the largest"), "first and largest coincide: {text}");
    }

    #[test]
    fn values_within_range_report_nothing() {
        let g = chain(2.0, 3.0);
        let r = fp16_range(&g, &x_input(vec![1.0; 8])).expect("runs");
        assert!(!r.overflows());
        assert_eq!(r.largest.as_ref().map(|l| l.max_abs), Some(6.0));
        assert!(r.summary().starts_with("all 6 float values stay within"), "{}", r.summary());
    }

    #[test]
    fn nan_and_infinity_count_as_overflow() {
        let g = chain(1.0, 1.0);
        let r = fp16_range(&g, &x_input(vec![f32::NAN, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0])).expect("runs");
        assert_eq!(r.over.first().map(|v| v.op.as_str()), Some("input"));
        assert_eq!(r.over[0].max_abs, f64::INFINITY);
    }

    #[test]
    fn large_weights_are_reported_without_inputs() {
        let g = chain(1e5, 0.5);
        let w = weights_over_fp16(&g);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].value, "w1");
        assert_eq!(w[0].op, "constant");
        assert!(weights_over_fp16(&chain(6e4, 0.5)).is_empty());
    }

    /// light_resnet50 (onnx wheel, Caffe2 export, every weight a ConstantOfShape fill of 0.02):
    /// its float32 activations grow to ~1e19, far past float16. On validate's seed-0 input the
    /// first kernel output past 65504 is res3_2's branch2b conv+BN+Relu, and the logits are the
    /// largest value.
    #[test]
    fn light_resnet50_activations_leave_float16() {
        let path =
            std::path::Path::new(".venv/lib/python3.11/site-packages/onnx/backend/test/data/light/light_resnet50.onnx");
        if !path.exists() {
            eprintln!("skipped: {} missing (scripts/setup-python.sh)", path.display());
            return;
        }
        let g = crate::onnx::load_model(path).expect("loads");
        let inputs = super::super::inputs::make_inputs(&g, &Default::default()).expect("inputs");
        let named: BTreeMap<String, Tensor> = inputs.tensors.into_iter().collect();
        let r = optimised_fp16_range(&g, &named).expect("runs");
        for v in &r.over {
            println!("{:>12.4e}  {}  {} {:?}", v.max_abs, v.value, v.op, v.onnx_nodes);
        }
        println!("{}", r.summary());
        assert!(weights_over_fp16(&g).is_empty());
        let first = r.over.first().expect("overflows");
        assert_eq!(first.op, "Conv2d");
        assert_eq!(first.onnx_nodes, ["n61", "n62", "n63"]);
        assert!(first.max_abs > 7e4 && first.max_abs < 8e4, "{first:?}");
        let largest = r.largest.as_ref().expect("has values");
        assert!(largest.max_abs > 1e18, "{largest:?}");
    }
}
