//! The optimiser on the models in onnx_models/: every optimised graph computes what the
//! original computes (reference executor, 1e-4 relative), and the expected fusions happen.

use onnx2ait::egraph::{optimize, ExplainReport, OptimizeOptions};
use onnx2ait::ir::{DType, Dim, Graph, Tensor};
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
    "pattern_resnext_grouped",
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

/// Every `rules_applied` count of the phases named `phase`, summed.
fn fired(r: &ExplainReport, phase: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for p in r.phases.iter().filter(|p| p.name == phase) {
        for (rule, n) in &p.rules_applied {
            *out.entry(rule.clone()).or_insert(0) += n;
        }
    }
    out
}

/// Per rule file, tiny models (onnx_models/rules/<model>.onnx, written by
/// onnx_models/rule_models.py) on which every rule of the file fires; the optimised graphs
/// compute what the originals compute within 1e-5 relative. The activation rules (decomposed
/// GELU / HardSwish, the scalar transpose sinks they need after a conv) fire on
/// `epilogue_acts`, which counts for both layout.rules and fusion.rules.
#[test]
fn every_rule_fires_on_its_rule_model() {
    // Every rule, the opt-in attention and squeeze-excite rules included.
    let opts = OptimizeOptions::pipeline(true).and_then(|o| o.with_squeeze_excite(true)).expect("embedded rules load");
    let mut missing = Vec::new();
    for (file, models) in [
        ("cleanup", &["cleanup"][..]),
        ("layout", &["layout", "epilogue_acts"][..]),
        ("fusion", &["fusion", "epilogue_acts", "attention"][..]),
        ("squeeze-excite", &["squeeze_excite"][..]),
    ] {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for m in models {
            let r = check(&format!("onnx_models/rules/{m}.onnx"), &opts, 1e-5);
            for (rule, n) in fired(&r, file) {
                *counts.entry(rule).or_insert(0) += n;
            }
        }
        assert!(!counts.is_empty(), "{file}: no phase named {file}");
        for (rule, n) in &counts {
            if *n == 0 {
                missing.push(format!("{}.rules: {rule}", file.replace('-', "_")));
            }
        }
    }
    assert!(missing.is_empty(), "rules that never fired on their rule models: {missing:#?}");
}

/// Every epilogue activation of issue 4, in each form exporters write it (relu, relu6,
/// sigmoid, x·sigmoid(x), Erf GELU, four Tanh-GELU spellings, HardSwish as an op, as
/// x·clip(x+3,0,6)/6 and as x·HardSigmoid(x), tanh, leaky relu), fuses into the epilogue of the
/// conv and of the gemm before it: 12 convs and 12 gemms, nothing else but the input/output
/// layout transforms (onnx_models/rules/epilogue_acts.onnx, numerics within 1e-5).
#[test]
fn every_epilogue_activation_fuses_into_conv_and_gemm() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    let r = check("onnx_models/rules/epilogue_acts.onnx", &opts, 1e-5);
    assert_eq!(
        r.kernels_after,
        BTreeMap::from([("conv".to_string(), 12), ("gemm".to_string(), 12), ("transpose".to_string(), 2)]),
        "{r}"
    );
    // Activation → how many of the chain's convs (and gemms) apply it.
    let expected = [
        ("relu", 1),
        ("clip:0:6", 1),
        ("sigmoid", 1),
        ("silu", 1),
        ("gelu", 1),
        ("gelu_tanh", 2),
        ("hardswish", 3),
        ("tanh", 1),
        ("leaky:0.1", 1),
    ];
    for (kernel, prefix) in [("conv", "conv[nhwc]+bias+"), ("gemm", "gemm+bias+")] {
        for (act, n) in expected {
            let want = format!("{prefix}{act}");
            let got = r.fusions.iter().filter(|f| f.kernel == kernel && f.detail == want).count();
            assert_eq!(got, n, "{want}\n{r}");
        }
    }
}

/// A conv feeding two residual adds stays one kernel (DAG-aware extraction), with both adds
/// computed from its output.
#[test]
fn shared_producer_is_not_duplicated() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    let r = check("onnx_models/rules/shared_producer.onnx", &opts, 1e-5);
    assert_eq!(r.kernels_after.get("conv"), Some(&1), "{r}");
}

/// Every bundled model optimises and still computes the same function (1e-4 relative); the
/// unoptimised reference output is itself checked against ONNX Runtime by tests/models.rs.
#[test]
fn every_bundled_model_matches_after_optimisation() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    for path in bundled_models() {
        check(&path, &opts, 1e-4);
    }
}

fn bundled_models() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir("onnx_models")
        .expect("onnx_models/ exists")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "onnx"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

const LIGHT_DIR: &str = ".venv/lib/python3.11/site-packages/onnx/backend/test/data/light";
const LIGHT: &[&str] = &[
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
];

/// The nine `light_*` models of the onnx wheel optimise and match the original (1e-4 relative).
#[test]
fn light_models_match_after_optimisation() {
    if !Path::new(LIGHT_DIR).exists() {
        eprintln!("skipped: {LIGHT_DIR} missing (scripts/setup-python.sh)");
        return;
    }
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    for m in LIGHT {
        let r = check(&format!("{LIGHT_DIR}/{m}.onnx"), &opts, 1e-4);
        println!("== {m}: {:?} -> {:?}", r.ops_before, r.kernels_after);
        // Every BatchNormalization becomes a per-channel scale+shift, folded into a conv or
        // fused into an elementwise kernel, wherever it sits (DenseNet's follow Concats).
        assert!(!r.kernels_after.contains_key("batchnormalization"), "{m}: standalone BatchNormalization left\n{r}");
        if *m == "light_resnet50" {
            // Caffe2 export: BatchNormalization folded, `Sum` fused as the residual epilogue.
            assert_eq!(r.kernels_after.get("conv"), Some(&53), "{r}");
            for k in ["batchnormalization", "sum", "relu", "elementwise"] {
                assert!(!r.kernels_after.contains_key(k), "{m}: standalone {k} left\n{r}");
            }
            let residual = r.fusions.iter().filter(|f| f.detail.contains("+residual")).count();
            assert_eq!(residual, 16, "{r}");
        }
    }
}

/// insta snapshots (snapshots/) of the explain JSON for every bundled model, with timings
/// zeroed so the output is deterministic. Regenerate with `INSTA_UPDATE=always cargo test
/// --test egraph_models explain_snapshots` (or `cargo insta review`).
#[test]
fn explain_snapshots() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    for path in bundled_models() {
        let g = onnx2ait::onnx::load_model(Path::new(&path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        let (_, r) = optimize(&g, &opts).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).expect("explain JSON parses");
        if let Some(phases) = v.get_mut("phases").and_then(|p| p.as_array_mut()) {
            for p in phases {
                p["time_ms"] = serde_json::Value::from(0);
                // Rules that never fired are listed with 0: dropped here, so adding a rule does
                // not rewrite every snapshot.
                if let Some(rules) = p.get_mut("rules_applied").and_then(|r| r.as_object_mut()) {
                    rules.retain(|_, n| n.as_u64() != Some(0));
                }
            }
        }
        let name = Path::new(&path).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let text = serde_json::to_string_pretty(&v).expect("serialises");
        insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("explain__{name}"), text);
        });
    }
}

/// The transformer patterns: MatMul+Add → gemm with bias, Erf-GELU in the gemm's epilogue,
/// decomposed layernorm → one layernorm kernel.
#[test]
fn transformer_patterns_fuse() {
    let opts = OptimizeOptions::pipeline(true).expect("embedded rules load");
    let mlp = check("onnx_models/pattern_mlp.onnx", &opts, 1e-4);
    assert_eq!(mlp.kernels_after, BTreeMap::from([("gemm".to_string(), 2)]), "{mlp}");
    assert!(mlp.fusions.iter().any(|f| f.detail == "gemm+bias+gelu"), "{mlp}");

    let att = check("onnx_models/pattern_attention.onnx", &opts, 1e-4);
    // The q, k and v projections are one packed product carrying the three biases (its fusion
    // covers the three MatMul + Add pairs); the output projection carries its bias and the
    // residual; the scores, softmax and weighted sum are one kernel.
    let packed = att.fusions.iter().filter(|f| f.detail == "gemm+bias" && f.onnx_nodes.len() == 6).count();
    assert_eq!(packed, 1, "q, k and v projections packed with their biases\n{att}");
    assert!(att.fusions.iter().any(|f| f.detail == "gemm+bias+residual"), "{att}");
    assert_eq!(att.kernels_after.get("gemm"), Some(&2), "{att}");
    assert_eq!(att.kernels_after.get("attention"), Some(&1), "{att}");
    assert_eq!(att.kernels_after.get("layernorm"), Some(&1), "{att}");
    // With --attention unfused the scores, softmax and weighted sum stay separate.
    let unfused = check("onnx_models/pattern_attention.onnx", &OptimizeOptions::pipeline(false).unwrap(), 1e-4);
    assert_eq!(unfused.kernels_after.get("attention"), None, "{unfused}");
    assert_eq!(unfused.kernels_after.get("softmax"), Some(&1), "{unfused}");

    let ln = check("onnx_models/pattern_layernorm_decomposed.onnx", &opts, 1e-4);
    assert_eq!(ln.kernels_after.get("layernorm"), Some(&1), "{ln}");
    for k in ["reducemean", "sqrt", "pow", "elementwise"] {
        assert!(!ln.kernels_after.contains_key(k), "standalone {k} left\n{ln}");
    }
}

/// The generated 12-layer BERT-base encoder (onnx_models/bert_encoder.py): every MatMul+Add is a
/// gemm with its bias (and the residual / GELU epilogues), every decomposed layernorm one
/// kernel, and the shape subgraphs feeding the head reshapes are gone.
#[test]
fn bert12_structure() {
    let path = "onnx_models/generated/bert12.onnx";
    if !Path::new(path).exists() {
        eprintln!("skipped: {path} not generated (onnx_models/bert_encoder.py)");
        return;
    }
    let opts = OptimizeOptions::pipeline(true).expect("embedded rules load");
    let r = check(path, &opts, 1e-4);
    println!("{r}");
    // Per layer: the packed Q, K, V projection, the output and two feed-forward projections,
    // and one fused attention.
    assert_eq!(r.kernels_after.get("gemm"), Some(&48), "{r}");
    assert_eq!(r.kernels_after.get("attention"), Some(&12), "{r}");
    assert_eq!(r.kernels_after.get("layernorm"), Some(&24), "{r}");
    for k in ["shape", "gather", "unsqueeze", "concat", "erf", "reducemean", "softmax", "transpose"] {
        assert!(!r.kernels_after.contains_key(k), "standalone {k} left\n{r}");
    }
    let gelu = r.fusions.iter().filter(|f| f.detail.contains("+gelu")).count();
    assert_eq!(gelu, 12, "{r}");
    let residual = r.fusions.iter().filter(|f| f.detail.contains("+residual")).count();
    assert_eq!(residual, 24, "{r}");
}

/// `onnx2ait explain MODEL --json --dot DIR`: the documented JSON fields and the Graphviz files.
#[test]
fn explain_command_prints_json_and_writes_dot() {
    let dir = std::env::temp_dir().join(format!("onnx2ait-explain-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_onnx2ait"))
        .args(["explain", "onnx_models/pattern_mlp.onnx", "--json", "--dot"])
        .arg(&dir)
        .output()
        .expect("runs the binary");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("explain --json prints JSON");
    for key in ["model", "ops_before", "kernels_after", "fusions", "phases", "cost_before", "cost_after", "warnings"] {
        assert!(v.get(key).is_some(), "missing '{key}' in {v}");
    }
    assert_eq!(v["kernels_after"]["gemm"], 2);
    assert_eq!(v["ops_before"]["Gemm"], 2);
    let phases: Vec<&str> =
        v["phases"].as_array().expect("phases is a list").iter().filter_map(|p| p["name"].as_str()).collect();
    assert_eq!(phases, ["cleanup", "layout", "fusion", "squeeze-excite", "cleanup"]);
    for f in ["before.dot", "after.dot"] {
        assert!(dir.join(f).exists(), "{f} not written");
    }
    let _ = std::fs::remove_dir_all(&dir);

    let text = std::process::Command::new(env!("CARGO_BIN_EXE_onnx2ait"))
        .args(["explain", "onnx_models/no_such_model.onnx"])
        .output()
        .expect("runs the binary");
    assert_eq!(text.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&text.stderr).contains("no such file"));
}

/// PyTorch `x.view(x.size(0), -1, 4)` with a symbolic batch: the Reshape reads a static target
/// (`[0, -1, 4]`) and the Shape/Gather/Unsqueeze/Concat subgraph leaves no kernel behind.
#[test]
fn shape_subgraphs_become_static_reshapes() {
    let opts = OptimizeOptions::standard().expect("embedded rules load");
    let r = check("onnx_models/pattern_shape_subgraph.onnx", &opts, 1e-6);
    assert_eq!(r.kernels_after, BTreeMap::from([("elementwise".to_string(), 1), ("reshape".to_string(), 2)]), "{r}");
}

/// The eight attention blocks of onnx_models/rules/attention.onnx (heads-last and heads-first,
/// scores multiplied or divided or the scale split over q and kᵀ, with and without a mask)
/// become eight fused attention kernels: no softmax, no head transposes, reshapes or score
/// products are left, each block's q, k and v projections are one packed product, and the
/// result matches the original within 1e-5.
#[test]
fn attention_blocks_fuse_into_one_kernel_each() {
    let opts = OptimizeOptions::pipeline(true).expect("embedded rules load");
    let r = check("onnx_models/rules/attention.onnx", &opts, 1e-5);
    assert_eq!(r.kernels_after.get("attention"), Some(&8), "{r}");
    assert_eq!(r.kernels_after.get("transpose"), None, "{r}");
    assert_eq!(r.kernels_after.get("reshape"), None, "{r}");
    assert_eq!(r.kernels_after.get("gemm"), Some(&8), "{r}");
    // --attention unfused leaves the eight blocks unfused.
    let unfused = check("onnx_models/rules/attention.onnx", &OptimizeOptions::pipeline(false).unwrap(), 1e-5);
    assert_eq!(unfused.kernels_after.get("attention"), None, "{unfused}");
    assert_eq!(unfused.kernels_after.get("softmax"), Some(&8), "{unfused}");
}

/// onnx_models/rules/squeeze_excite.onnx: an EfficientNet-style block (SiLU, Sigmoid gate,
/// `scale * x`, squeeze width 6) and a MobileNetV3-style one (ReLU, HardSigmoid, `x * scale`,
/// no bias on the first layer) each get one squeeze-excite scale kernel in place of their
/// pooling and two 1x1 convolutions, with `--squeeze-excite fused`; the pooled scale that
/// multiplies another tensor stays a pooling and two convolutions; the results match the
/// original within 1e-5 (symbolic batch, 2 images). Unfused, nothing changes.
#[test]
fn squeeze_excite_blocks_fuse_into_one_scale_kernel_each() {
    let path = "onnx_models/rules/squeeze_excite.onnx";
    let fused_opts = OptimizeOptions::standard().and_then(|o| o.with_squeeze_excite(true)).unwrap();
    let fused = check(path, &fused_opts, 1e-5);
    assert_eq!(fused.kernels_after.get("squeeze_excite"), Some(&2), "{fused}");
    // Left: the third block's pooling and the final layout transform.
    assert_eq!(fused.kernels_after.get("pool"), Some(&1), "{fused}");
    let scales: Vec<_> = fused.fusions.iter().filter(|f| f.kernel == "squeeze_excite").collect();
    assert_eq!(scales.len(), 2, "{fused}");
    // The pooling, two Convs, the activation (Sigmoid + Mul for SiLU) and the gate; the
    // product with x is the elementwise kernel's.
    let details: Vec<(&str, usize)> = scales.iter().map(|f| (f.detail.as_str(), f.onnx_nodes.len())).collect();
    assert_eq!(
        details,
        [
            ("squeeze_excite[gap,1x1+bias+silu,1x1+bias+sigmoid]", 6),
            ("squeeze_excite[gap,1x1+relu,1x1+bias+hardsigmoid:0.16666667:0.5]", 5)
        ],
        "{fused}"
    );
    for f in &scales {
        assert!(f.onnx_nodes.iter().any(|n| n.starts_with("globalaveragepool")), "{f:?}");
        assert!(
            !f.onnx_nodes.iter().any(|n| n == "mul_3" || n == "mul_4"),
            "the scale product is not the scale's: {f:?}"
        );
    }
    let unfused = check(path, &OptimizeOptions::standard().unwrap(), 1e-5);
    assert_eq!(unfused.kernels_after.get("squeeze_excite"), None, "{unfused}");
    assert_eq!(unfused.kernels_after.get("pool"), Some(&3), "{unfused}");
    assert_eq!(
        fused.kernels_after.get("conv").copied().unwrap_or(0) + 4,
        unfused.kernels_after.get("conv").copied().unwrap_or(0),
        "{fused}\n{unfused}"
    );
    assert!(!unfused.phases.iter().any(|p| p.name == "squeeze-excite"), "{unfused}");
}

/// onnx_models/rules/squeeze_excite_projection.onnx: each block's `x · scale` folds into its
/// projection (`onnx2ait::egraph::se_fold`): a batched product of x by per-image scaled
/// weights takes the product's and the projection's ONNX nodes (and the residual add), the
/// elementwise kernel left per block scales the weights (`[N, K, C]`, not the activation), and
/// the results match the original within 1e-5. Without the fold the projections stay
/// convolutions after an elementwise product; on 6x6 images (squeeze_excite.onnx, 36 pixels)
/// nothing folds.
#[test]
fn squeeze_excite_scale_folds_into_projection_weights() {
    let path = "onnx_models/rules/squeeze_excite_projection.onnx";
    let opts = OptimizeOptions::standard().and_then(|o| o.with_squeeze_excite(true)).unwrap();
    let folded = check(path, &opts, 1e-5);
    assert_eq!(folded.kernels_after.get("gemm"), Some(&2), "{folded}");
    let scaled: Vec<_> = folded.fusions.iter().filter(|f| f.kernel == "gemm").collect();
    let nodes: Vec<Vec<&str>> = scaled.iter().map(|f| f.onnx_nodes.iter().map(String::as_str).collect()).collect();
    assert_eq!(nodes, [vec!["mul_3", "conv_4", "add_0"], vec!["mul_6", "conv_9"]], "{folded}");
    assert_eq!(
        scaled.iter().map(|f| f.detail.as_str()).collect::<Vec<_>>(),
        ["gemm+bias+residual", "gemm+bias"],
        "{folded}"
    );
    let (g, _) = optimize(&onnx2ait::onnx::load_model(Path::new(path)).unwrap(), &opts).unwrap();
    let scale_weights: Vec<_> = g.nodes.iter().filter(|n| n.name.ends_with(".scale_weights")).collect();
    assert_eq!(scale_weights.len(), 2);
    // [N, K, C]: 16 and 24 filters of 32 and 48 channels.
    for (n, kc) in scale_weights.iter().zip([[16, 32], [24, 48]]) {
        let shape = &g.values[n.outputs[0]].ty.as_ref().unwrap().shape;
        assert_eq!(shape[1..], kc.map(Dim::known), "{}", n.name);
    }

    let unfolded = check(path, &OptimizeOptions { scale_into_projections: false, ..opts.clone() }, 1e-5);
    assert_eq!(unfolded.kernels_after.get("gemm"), None, "{unfolded}");
    assert_eq!(
        unfolded.kernels_after.get("conv").copied().unwrap_or(0),
        folded.kernels_after.get("conv").copied().unwrap_or(0) + 2,
        "{unfolded}"
    );
    let small = check("onnx_models/rules/squeeze_excite.onnx", &opts, 1e-5);
    assert_eq!(small.kernels_after.get("gemm"), None, "{small}");
}

/// Channel padding folded into the producer (`onnx2ait::egraph::channel_padding`): in the
/// unfused squeeze-and-excitation blocks of onnx_models/rules/squeeze_excite.onnx the first
/// dense layer's 6 output channels become 8 (zero filters) and the second layer reads 8 (zero
/// weights), so no convolution reads a channel count the library kernels cannot (C % 8 != 0;
/// only a thin graph input, C ≤ 4, keeps its count) and the result still matches the original
/// within 1e-5.
#[test]
fn odd_channel_counts_are_padded_in_the_producing_conv() {
    use onnx2ait::ir::ops::kernel::Conv2d;
    let path = "onnx_models/rules/squeeze_excite.onnx";
    let opts = OptimizeOptions::standard().unwrap();
    check(path, &opts, 1e-5);
    let g = onnx2ait::onnx::load_model(Path::new(path)).unwrap();
    let (opt, _) = optimize(&g, &opts).unwrap();
    let mut weights = Vec::new();
    for n in opt.nodes.iter().filter(|n| n.op.downcast_ref::<Conv2d>().is_some()) {
        let c = opt.ty(n.inputs[0].unwrap()).shape[3].as_known().unwrap();
        assert!(c % 8 == 0 || c <= 4, "{} reads {c} channels", n.name);
        let w: Vec<i64> = opt.ty(n.inputs[1].unwrap()).shape.iter().map(|d| d.as_known().unwrap()).collect();
        weights.push(w);
    }
    assert!(weights.contains(&vec![8, 1, 1, 24]) && weights.contains(&vec![24, 1, 1, 8]), "{weights:?}");
    // Without the pass, the squeeze width stays 6.
    let plain = OptimizeOptions { pad_channels_into_producers: false, ..OptimizeOptions::standard().unwrap() };
    let (unpadded, _) = optimize(&g, &plain).unwrap();
    assert!(unpadded
        .nodes
        .iter()
        .any(|n| n.op.downcast_ref::<Conv2d>().is_some()
            && unpadded.ty(n.inputs[0].unwrap()).shape[3].as_known() == Some(6)));
}

/// torchvision's EfficientNet-B0, MobileNetV3-Large and MobileNetV2 in the TorchScript
/// exporter's topology (onnx_models/cnn_families.py, written into a scratch folder with the
/// project's .venv): optimised with and without `--squeeze-excite fused`, each computes what the
/// original computes on the reference executor (batch 2, within 1e-4 of the largest logit);
/// fused, every squeeze-and-excitation block is one scale kernel (16 in EfficientNet-B0, 8 in
/// MobileNetV3-Large) and only the classifier's pooling is left; either way no convolution
/// reads a channel count the library kernels would have to pad (EfficientNet-B0's squeeze
/// widths 4 to 28 are padded in the producing conv's weights).
#[test]
fn cnn_family_exports_match_after_optimisation() {
    use onnx2ait::ir::ops::kernel::Conv2d;
    let python = Path::new(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup-python.sh", python.display());
    let dir = std::env::temp_dir().join(format!("onnx2ait-cnn-families-{}", std::process::id()));
    let status = std::process::Command::new(python)
        .args(["onnx_models/cnn_families.py", "--out"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("runs onnx_models/cnn_families.py");
    assert!(status.success(), "onnx_models/cnn_families.py failed");
    for (model, blocks) in [("efficientnet_b0", 16), ("mobilenet_v3_large", 8), ("mobilenet_v2", 0)] {
        let path = dir.join(format!("{model}.onnx"));
        let g = onnx2ait::onnx::load_model(&path).unwrap_or_else(|e| panic!("{model}: {e}"));
        let inputs = inputs_for(&g);
        let want = onnx2ait::reference::run(&g, &inputs).unwrap_or_else(|e| panic!("{model}: {e}"));
        for fused in [false, true] {
            let opts = OptimizeOptions::standard().and_then(|o| o.with_squeeze_excite(fused)).unwrap();
            let (opt, r) = optimize(&g, &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
            assert!(r.warnings.is_empty(), "{model}: {:?}", r.warnings);
            let got = onnx2ait::reference::run(&opt, &inputs).unwrap_or_else(|e| panic!("{model}: {e}"));
            let e = max_rel_err(&got[0].1, &want[0].1);
            assert!(e <= 1e-4, "{model} (squeeze-excite fused: {fused}): logits differ by {e:e}\n{r}");
            let scales = r.kernels_after.get("squeeze_excite").copied().unwrap_or(0);
            assert_eq!(scales, if fused { blocks } else { 0 }, "{model}\n{r}");
            if fused {
                assert_eq!(r.kernels_after.get("pool"), Some(&1), "{model}\n{r}");
            }
            for n in opt.nodes.iter().filter(|n| n.op.downcast_ref::<Conv2d>().is_some_and(|c| c.geom.group == 1)) {
                let c = opt.ty(n.inputs[0].unwrap()).shape[3].as_known().unwrap();
                assert!(c % 8 == 0 || c <= 4, "{model}: {} reads {c} channels", n.name);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
