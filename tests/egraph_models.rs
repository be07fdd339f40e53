//! The optimiser on the models in onnx_models/: every optimised graph computes what the
//! original computes (reference executor, 1e-4 relative), and the expected fusions happen.

use onnx2ait::egraph::{optimize, ExplainReport, OptimizeOptions};
use onnx2ait::ir::{DType, Graph, Tensor};
use onnx2ait::validate::inputs::random_tensor;
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::path::Path;

fn inputs_for(g: &Graph) -> BTreeMap<String, Tensor> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    g.inputs
        .iter()
        .map(|&v| {
            let ty = g.ty(v);
            // Symbolic dims (batch, sequence) get 2.
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_known().map(|k| k as usize).unwrap_or(2)).collect();
            (g.values[v].name.clone(), random_tensor(ty.dtype, &shape, &mut rng))
        })
        .collect()
}

fn max_rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(&b).fold(0f64, |m, (x, y)| m.max((x - y).abs() / scale))
}

/// Optimises a model and checks the numerics; returns the report.
fn check(path: &str, opts: &OptimizeOptions, tol: f64) -> ExplainReport {
    let g = onnx2ait::onnx::load_model(Path::new(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let (opt, report) = optimize(&g, opts).unwrap_or_else(|e| panic!("{path}: {e}"));
    let inputs = inputs_for(&g);
    let want = onnx2ait::reference::run(&g, &inputs).unwrap_or_else(|e| panic!("{path} (original): {e}"));
    let got = onnx2ait::reference::run(&opt, &inputs).unwrap_or_else(|e| panic!("{path} (optimised): {e}\n{report}"));
    assert_eq!(want.len(), got.len());
    for ((wn, w), (gn, gt)) in want.iter().zip(&got) {
        assert_eq!(wn, gn);
        assert_eq!(w.dtype(), gt.dtype(), "{path}: output {wn}");
        assert_eq!(w.shape(), gt.shape(), "{path}: output {wn}");
        if w.dtype() == DType::F32 {
            let e = max_rel_err(gt, w);
            assert!(e <= tol, "{path}: output {wn} differs by {e:e} (relative)\n{report}");
        }
    }
    assert!(report.warnings.is_empty(), "{path}: {:?}", report.warnings);
    report
}

const MODELS: &[&str] = &[
    "pattern_conv_bn_relu",
    "pattern_resnet_bottleneck",
    "pattern_depthwise_clip",
    "pattern_gemm_gelu_erf",
    "pattern_mlp",
    "pattern_attention",
    "pattern_layernorm_decomposed",
    "pattern_layernorm_fused",
    "pattern_transpose_chain",
    "pattern_shape_subgraph",
    "convnet_symbolic_batch",
    "conv_basic",
    "conv_strided_padded",
    "conv_grouped",
    "conv_dilated",
    "conv_autopad_same_upper",
    "normalization_batchnorm",
    "linalg_gemm",
    "linalg_matmul",
    "pool_max",
    "pool_average",
    "pool_global",
    "activation_unary",
    "arithmetic_binary_broadcast",
];

#[test]
fn round_trip_without_rules_is_identity() {
    for m in MODELS {
        let r = check(&format!("onnx_models/{m}.onnx"), &OptimizeOptions::no_rules(), 1e-6);
        assert!(r.cost_after <= r.cost_before + 1e-9, "{m}: {} > {}", r.cost_after, r.cost_before);
    }
}

#[test]
fn optimised_models_match_the_original() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    for m in MODELS {
        let r = check(&format!("onnx_models/{m}.onnx"), &opts, 1e-4);
        println!(
            "== {m}: {:?} -> {:?} ({:.1} -> {:.1} us)",
            r.ops_before, r.kernels_after, r.cost_before, r.cost_after
        );
    }
}

#[test]
fn conv_bn_relu_becomes_one_kernel() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    let r = check("onnx_models/pattern_conv_bn_relu.onnx", &opts, 1e-4);
    println!("{r}");
    assert!(!r.kernels_after.contains_key("batchnormalization"), "{r}");
    assert!(r.fusions.iter().any(|f| f.detail.contains("+relu")), "{r}");
}

/// The generated torchvision ResNet-50: 53 fused conv kernels, NHWC end to end.
#[test]
fn resnet50_structure() {
    let path = "onnx_models/generated/resnet50.onnx";
    if !Path::new(path).exists() {
        eprintln!("skipped: {path} not generated (scripts/gen-models.sh)");
        return;
    }
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    let g = onnx2ait::onnx::load_model(Path::new(path)).expect("loads");
    let t = std::time::Instant::now();
    let (opt, r) = optimize(&g, &opts).expect("optimises");
    println!("optimisation took {:?}\n{r}", t.elapsed());
    let inputs = inputs_for(&g);
    let want = onnx2ait::reference::run(&g, &inputs).expect("original runs");
    let got = onnx2ait::reference::run(&opt, &inputs).expect("optimised runs");
    let e = max_rel_err(&got[0].1, &want[0].1);
    println!("max relative error {e:e}");
    assert!(e <= 1e-4);
    assert_eq!(r.kernels_after.get("conv"), Some(&53), "{r}");
    assert_eq!(r.kernels_after.get("transpose"), Some(&1), "{r}");
}
