//! The `onnx2ait` binary: commands, output files and exit codes.
//!
//! Uses the bundled `onnx_models/convnet_symbolic_batch.onnx` (symbolic batch dim `N`, output
//! `[N,10]`) and, for unsupported ops, a model written here with the crate's own protobuf types.

use onnx2ait::onnx::proto::{
    tensor_shape_proto, type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_onnx2ait");

fn bundled(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models").join(name)
}

fn convnet() -> PathBuf {
    bundled("convnet_symbolic_batch.onnx")
}

/// A fresh scratch directory per test (tests run in parallel).
fn scratch(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("onnx2ait-cli-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create scratch directory");
    d
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run onnx2ait")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Asserts the exit code, printing both streams when it is wrong.
fn expect_code(o: &Output, code: i32) -> (String, String) {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(code), "exit code\n--- stdout:\n{out}\n--- stderr:\n{err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "panic:\n{err}");
    (out, err)
}

fn tensor_value(name: &str, elem_type: i32, dims: &[&str]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| tensor_shape_proto::Dimension {
            value: Some(match d.parse::<i64>() {
                Ok(v) => tensor_shape_proto::dimension::Value::DimValue(v),
                Err(_) => tensor_shape_proto::dimension::Value::DimParam(d.to_string()),
            }),
            ..Default::default()
        })
        .collect();
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: Some(TensorShapeProto { dim }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, domain: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        domain: Some(domain.into()),
        name: Some(name.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// `x → Relu → FancyOp → com.example::Custom ×2 → y`: two unsupported op types, three nodes.
fn write_unsupported_model(dir: &Path) -> PathBuf {
    let model = ModelProto {
        ir_version: Some(8),
        producer_name: Some("onnx2ait-tests".into()),
        opset_import: vec![
            OperatorSetIdProto { domain: Some(String::new()), version: Some(17) },
            OperatorSetIdProto { domain: Some("com.example".into()), version: Some(1) },
        ],
        graph: Some(GraphProto {
            name: Some("unsupported".into()),
            node: vec![
                node("Relu", "", "relu", &["x"], &["a"]),
                node("FancyOp", "", "fancy_1", &["a"], &["b"]),
                node("Custom", "com.example", "custom_1", &["b"], &["c"]),
                node("Custom", "com.example", "custom_2", &["c"], &["y"]),
            ],
            input: vec![tensor_value("x", 1, &["N", "4"])],
            output: vec![tensor_value("y", 1, &["N", "4"])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = dir.join("unsupported.onnx");
    std::fs::write(&p, model.encode_to_vec()).expect("write model");
    p
}

#[test]
fn inspect_describes_a_supported_model() {
    let m = convnet();
    let (out, _) = expect_code(&run(&["inspect", m.to_str().unwrap()]), 0);
    assert!(out.contains("opsets:      ai.onnx=17"), "{out}");
    assert!(out.contains("inputs (inferred):") && out.contains("x float32[N,3,16,16]"), "{out}");
    assert!(out.contains("float32[N,10]"), "{out}");
    assert!(out.contains("Conv") && out.contains("Gemm"), "op histogram:\n{out}");
    assert!(out.contains("unsupported: none") && out.contains("import:      ok"), "{out}");

    let (json, _) = expect_code(&run(&["inspect", m.to_str().unwrap(), "--json"]), 0);
    let v: serde_json::Value = serde_json::from_str(&json).expect("inspect --json prints JSON");
    assert_eq!(v["inputs"][0]["shape"], serde_json::json!(["N", 3, 16, 16]));
    assert_eq!(v["op_histogram"]["Conv"], 2);
    assert!(v["parameters"]["elements"].as_u64().unwrap() > 0);
    assert_eq!(v["unsupported"], serde_json::json!([]));
}

#[test]
fn inspect_lists_every_unsupported_op_and_exits_2() {
    let dir = scratch("inspect-unsupported");
    let m = write_unsupported_model(&dir);
    let (out, err) = expect_code(&run(&["inspect", m.to_str().unwrap()]), 2);
    assert!(out.contains("FancyOp (1 node(s)): fancy_1"), "{out}");
    assert!(out.contains("com.example::Custom (2 node(s)): custom_1, custom_2"), "{out}");
    assert!(out.contains("inputs (declared):") && out.contains("x float32[N,4]"), "still prints the rest:\n{out}");
    assert!(out.contains("Relu"), "{out}");
    assert!(err.starts_with("error: ") && err.contains("2 unsupported op type(s) in 3 node(s)"), "{err}");

    let (json, _) = expect_code(&run(&["inspect", m.to_str().unwrap(), "--json"]), 2);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["unsupported"].as_array().unwrap().len(), 2);

    // Every command reports unsupported ops with exit code 2.
    let (_, err) = expect_code(&run(&["validate", m.to_str().unwrap()]), 2);
    assert!(err.contains("FancyOp"), "{err}");
    let (_, err) = expect_code(&run(&[m.to_str().unwrap(), "-o", dir.join("out").to_str().unwrap()]), 2);
    assert!(err.contains("com.example::Custom"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn main_command_writes_graph_json_and_summary() {
    let dir = scratch("compile");
    let m = convnet();
    for i in 0..2 {
        let out_dir = dir.join(format!("out{i}"));
        let (out, _) =
            expect_code(&run(&["compile", m.to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--no-build"]), 0);
        assert!(out.contains("wrote the sources to") && out.contains("generated:"), "{out}");
        let json = std::fs::read_to_string(out_dir.join("graph.json")).expect("graph.json written");
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["inputs"][0]["shape"], serde_json::json!(["N", 3, 16, 16]));
        assert_eq!(v["outputs"][0]["shape"], serde_json::json!(["N", 10]));
        assert!(v["nodes"].as_array().unwrap().iter().all(|n| n["outputs"][0]["dtype"] == "float32"));
        assert!(v["constants"]["bytes"].as_u64().unwrap() > 0);
        let summary = std::fs::read_to_string(out_dir.join("summary.txt")).expect("summary.txt written");
        assert!(summary.contains("x float32[N,3,16,16]") && summary.contains("memory:"), "{summary}");
        assert!(!out_dir.join("libmodel.so").exists(), "--no-build runs no compiler");
    }
    // The output is stable: both runs wrote the same files, sources and weights included.
    let mut files: Vec<_> = std::fs::read_dir(dir.join("out0")).unwrap().flatten().map(|e| e.file_name()).collect();
    files.sort();
    assert!(files.iter().any(|f| f == "model.cu") && files.iter().any(|f| f == "weights.bin"), "{files:?}");
    for file in files {
        let a = std::fs::read(dir.join("out0").join(&file)).unwrap();
        let b = std::fs::read(dir.join("out1").join(&file)).unwrap();
        assert_eq!(a, b, "{} differs between two runs", file.to_string_lossy());
    }
    let kernels: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("out0/kernels.json")).unwrap()).unwrap();
    assert_eq!(kernels["outputs"][0]["shape"], serde_json::json!(["N", 10]));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--attention fused` makes one attention kernel of the bundled attention block, `unfused`
/// keeps the softmax and score products as their own kernels, and the default (`auto`) is fused
/// for CUDA and unfused for ROCm, which has no fused kernel.
#[test]
fn attention_option_fuses_attention_by_default_on_cuda() {
    let dir = scratch("attention");
    let m = bundled("pattern_attention.onnx");
    let summary = |name: &str, extra: &[&str]| {
        let out_dir = dir.join(name);
        let mut args = vec!["compile", m.to_str().unwrap(), "-o", out_dir.to_str().unwrap(), "--no-build"];
        args.extend_from_slice(extra);
        expect_code(&run(&args), 0);
        std::fs::read_to_string(out_dir.join("summary.txt")).expect("summary.txt written")
    };
    let is_fused = |s: &str| s.contains("attention 1") && !s.contains("softmax");
    let is_unfused = |s: &str| !s.contains("attention 1") && s.contains("softmax 1");
    let fused = summary("fused", &["--attention", "fused"]);
    assert!(is_fused(&fused), "{fused}");
    let unfused = summary("unfused", &["--attention", "unfused"]);
    assert!(is_unfused(&unfused), "{unfused}");
    let default = summary("default", &[]);
    assert!(is_fused(&default), "{default}");
    let rocm = summary("rocm", &["--target", "rocm", "--arch", "gfx942"]);
    assert!(is_unfused(&rocm), "{rocm}");
    let (_, err) = expect_code(&run(&["compile", m.to_str().unwrap(), "-o", "x", "--attention", "fast"]), 1);
    assert!(err.contains("fast"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--squeeze-excite fused`, the default, makes one scale kernel of each squeeze-and-excitation
/// block of the SE rule model (compile's summary and explain's JSON); with `unfused` none, and
/// the pooling and convolutions stay separate kernels.
#[test]
fn squeeze_excite_is_fused_by_default_and_unfused_on_request() {
    let dir = scratch("squeeze_excite");
    let m = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/rules/squeeze_excite.onnx");
    let m = m.to_str().unwrap();
    let summary = |mode: Option<&str>| {
        let out_dir = dir.join(mode.unwrap_or("default"));
        let mut args = vec!["compile", m, "-o", out_dir.to_str().unwrap(), "--no-build"];
        args.extend(mode.map(|mode| ["--squeeze-excite", mode]).into_iter().flatten());
        expect_code(&run(&args), 0);
        std::fs::read_to_string(out_dir.join("summary.txt")).expect("summary.txt written")
    };
    for fused in [summary(None), summary(Some("fused"))] {
        assert!(fused.contains("squeeze_excite 2") && fused.contains("global_pool 1"), "{fused}");
    }
    let unfused = summary(Some("unfused"));
    assert!(!unfused.contains("squeeze_excite 2") && unfused.contains("global_pool 3"), "{unfused}");
    let (out, _) = expect_code(&run(&["explain", m, "--json"]), 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("explain --json parses");
    assert_eq!(v["kernels_after"]["squeeze_excite"], 2, "{out}");
    let (out, _) = expect_code(&run(&["explain", m, "--json", "--squeeze-excite", "unfused"]), 0);
    let v: serde_json::Value = serde_json::from_str(&out).expect("explain --json parses");
    assert!(v["kernels_after"].get("squeeze_excite").is_none(), "{out}");
    let (_, err) = expect_code(&run(&["compile", m, "-o", "x", "--squeeze-excite", "always"]), 1);
    assert!(err.contains("always"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Without a working nvcc the main command still writes the sources, fails, and says what is
/// missing and how to get it.
#[test]
fn main_command_without_nvcc_writes_sources_and_says_what_is_missing() {
    let dir = scratch("no-nvcc");
    let m = convnet();
    let out_dir = dir.join("out");
    let o = Command::new(BIN)
        .args([m.to_str().unwrap(), "-o", out_dir.to_str().unwrap()])
        .env("NVCC", dir.join("missing/nvcc"))
        .output()
        .expect("run onnx2ait");
    let (_, err) = expect_code(&o, 1);
    assert!(err.contains("no library was built") && err.contains("nvcc"), "{err}");
    assert!(out_dir.join("model.cu").exists() && out_dir.join("model.h").exists());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn validate_passes_and_reports() {
    let m = convnet();
    let (out, _) = expect_code(&run(&["validate", m.to_str().unwrap()]), 0);
    assert!(out.contains("PASS") && out.contains("gemm_0"), "{out}");
    assert!(out.contains("engine ort [baseline]") && out.contains("engine reference"), "{out}");

    let (json, _) = expect_code(&run(&["validate", m.to_str().unwrap(), "--dim", "N=3", "--seed", "5", "--json"]), 0);
    let v: serde_json::Value = serde_json::from_str(&json).expect("validate --json prints JSON");
    assert_eq!(v["passed"], true);
    assert_eq!(v["dims"]["N"], 3);
    assert_eq!(v["seed"], 5);
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([3, 10]));
    assert_eq!(v["outputs"][0]["results"][0]["engine"], "reference");
    assert_eq!(v["outputs"][0]["results"][0]["top1"]["rows"], 3);
}

#[test]
fn validate_reads_npy_inputs() {
    let dir = scratch("validate-npy");
    let file = dir.join("x.npy");
    let x = ndarray::ArrayD::from_shape_fn(ndarray::IxDyn(&[2, 3, 16, 16]), |i| {
        ((i[1] * 7 + i[2] * 3 + i[3]) % 11) as f32 / 5.0 - 1.0
    });
    ndarray_npy::write_npy(&file, &x).unwrap();
    let arg = format!("x={}", file.display());
    let (json, _) = expect_code(&run(&["validate", convnet().to_str().unwrap(), "--input", &arg, "--json"]), 0);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["dims"]["N"], 2, "N is bound by the file's shape");
    assert_eq!(v["inputs"][0]["source"]["kind"], "file");

    // float64 values that are float32 numbers convert exactly (issue 16, point 4); 0.1 does not.
    let wide = dir.join("x64.npy");
    ndarray_npy::write_npy(&wide, &x.mapv(|v| v as f64)).unwrap();
    let arg = format!("x={}", wide.display());
    expect_code(&run(&["validate", convnet().to_str().unwrap(), "--input", &arg]), 0);
    let bad = dir.join("x64-inexact.npy");
    let mut inexact = x.mapv(|v| v as f64);
    inexact[[0, 0, 0, 0]] = 0.1;
    ndarray_npy::write_npy(&bad, &inexact).unwrap();
    let arg = format!("x={}", bad.display());
    let (_, err) = expect_code(&run(&["validate", convnet().to_str().unwrap(), "--input", &arg]), 1);
    assert!(err.starts_with("error: ") && err.contains("float64") && err.contains("float32"), "{err}");
    assert!(err.contains("x64-inexact.npy"), "the error names the file: {err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn errors_are_one_line_messages_with_exit_1() {
    let m = convnet();
    let (_, err) = expect_code(&run(&["inspect", "/nonexistent/model.onnx"]), 1);
    assert!(err.starts_with("error: ") && err.contains("no such file"), "{err}");
    let (_, err) = expect_code(&run(&["validate", m.to_str().unwrap(), "--dim", "batch=2"]), 1);
    assert!(err.starts_with("error: ") && err.contains("no symbolic dim 'batch'"), "{err}");
    let (_, err) = expect_code(&run(&["validate", m.to_str().unwrap(), "--dim", "N"]), 1);
    assert!(err.contains("expected NAME=VALUE"), "{err}");

    let dir = scratch("errors");
    let junk = dir.join("junk.onnx");
    std::fs::write(&junk, b"this is not a protobuf").unwrap();
    let (_, err) = expect_code(&run(&["inspect", junk.to_str().unwrap()]), 1);
    assert!(err.starts_with("error: ") && err.contains("not a valid ONNX model"), "{err}");
    let (_, err) = expect_code(&run(&[]), 1);
    assert!(err.contains("error:"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn ops_lists_the_registry() {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_onnx2ait")).args(["ops", "--json"]).output().expect("runs");
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(rows.len(), onnx2ait::ir::ops::registry().ops().count());
    assert!(rows.iter().any(|r| r["op_type"] == "Conv" && r["family"] == "conv"));
}

/// `bench` without a GPU: its options (--kernels, --kernel-top, --peak-tflops, --peak-gbps) parse,
/// a folder without a library is a one-line error before any GPU work, and --kernel-top or a
/// ceiling alone is a usage error.
#[test]
fn bench_checks_its_arguments_before_the_gpu() {
    let dir = scratch("bench");
    let d = dir.to_str().unwrap();
    let (_, err) = expect_code(&run(&["bench", d, "--batch", "1,8", "--kernels", "--kernel-top", "10", "--json"]), 1);
    assert!(err.starts_with("error: ") && err.contains("libmodel.so: not found"), "{err}");
    assert!(err.contains("build the model first") && err.lines().count() == 1, "{err}");
    let (_, err) = expect_code(&run(&["bench", d, "--kernel-top", "10"]), 1);
    assert!(err.contains("--kernels"), "{err}");
    let (_, err) = expect_code(&run(&["bench", d, "--kernels", "--peak-tflops", "700", "--peak-gbps", "3000"]), 1);
    assert!(err.contains("libmodel.so: not found"), "{err}");
    let (_, err) = expect_code(&run(&["bench", d, "--peak-gbps", "3000"]), 1);
    assert!(err.contains("--kernels"), "{err}");
    let (_, err) = expect_code(&run(&["bench", d, "--kernels", "--peak-tflops", "0"]), 1);
    assert!(err.contains("not a ceiling"), "{err}");
    let (help, _) = expect_code(&run(&["bench", "--help"]), 0);
    assert!(help.contains("--kernels") && help.contains("--kernel-top <N>"), "{help}");
    assert!(help.contains("--peak-tflops <TFLOPS>") && help.contains("--peak-gbps <GBPS>"), "{help}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Top-level names in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// `O2A_BUILD_HASH` of `OUT/model.h` ("" when it has none).
fn header_hash(out: &Path) -> String {
    let h = std::fs::read_to_string(out.join("model.h")).expect("model.h");
    let line = h.lines().find(|l| l.starts_with("#define O2A_BUILD_HASH")).unwrap_or_default();
    line.trim_start_matches("#define O2A_BUILD_HASH").trim().trim_matches('"').to_string()
}

/// Issue 16, point 1: compiling into a folder with a user's files never deletes them. A
/// non-empty folder that onnx2ait did not write is refused (naming it) unless --force, and with
/// --force, or into a folder onnx2ait wrote, the user's files survive every later compile.
#[test]
fn compile_never_touches_files_it_did_not_write() {
    let dir = scratch("user-files");
    let out = dir.join("project");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("my_project.cu"), "// mine\n").unwrap();
    std::fs::write(out.join("config.h"), "#define MINE 1\n").unwrap();
    let (m, o) = (convnet(), out.to_str().unwrap());
    let (_, err) = expect_code(&run(&[m.to_str().unwrap(), "-o", o, "--no-build"]), 1);
    assert!(err.contains(o) && err.contains("not written by onnx2ait") && err.contains("--force"), "{err}");
    assert_eq!(names(&out), ["config.h", "my_project.cu"], "a refused compile writes nothing");
    assert_eq!(names(&dir), ["project"], "and leaves no staging folder");

    expect_code(&run(&[m.to_str().unwrap(), "-o", o, "--no-build", "--force"]), 0);
    assert!(out.join("model.cu").is_file() && out.join("onnx2ait-manifest.json").is_file());
    // A folder onnx2ait wrote takes another model without --force; the user's files stay.
    let other = bundled("indexing_pad_opset9.onnx");
    expect_code(&run(&[other.to_str().unwrap(), "-o", o, "--no-build"]), 0);
    assert_eq!(std::fs::read_to_string(out.join("my_project.cu")).unwrap(), "// mine\n");
    assert_eq!(std::fs::read_to_string(out.join("config.h")).unwrap(), "#define MINE 1\n");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("onnx2ait-manifest.json")).unwrap()).unwrap();
    let owned: Vec<&str> = manifest["files"].as_array().unwrap().iter().map(|f| f.as_str().unwrap()).collect();
    assert!(!owned.contains(&"my_project.cu") && !owned.contains(&"config.h"), "{owned:?}");
    // Exactly the new model's files and the user's: nothing of the first model is left.
    let mut expected: Vec<String> = owned.iter().map(|s| s.to_string()).collect();
    expected.extend(["config.h", "my_project.cu", "onnx2ait-manifest.json"].map(String::from));
    expected.sort();
    assert_eq!(names(&out), expected);
    assert_eq!(names(&dir), ["project"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Marks OUT's files as the output of a build of its model, as a successful build leaves it: a
/// library listed in the manifest as onnx2ait's own (the bytes are not a real library: this test
/// needs no nvcc, `a_real_build_is_replaced_by_the_next_model` builds one).
fn pretend_built(out: &Path, tag: &str) {
    std::fs::write(out.join("libmodel.so"), format!("library of {tag}")).unwrap();
    let path = out.join("onnx2ait-manifest.json");
    let mut m: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| serde_json::json!({ "format_version": 1, "generator": "onnx2ait", "files": [] }));
    m["library"] = serde_json::json!("libmodel.so");
    m["build_hash"] = serde_json::json!(header_hash(out));
    m["files"] =
        serde_json::json!(names(out).into_iter().filter(|n| n != "onnx2ait-manifest.json").collect::<Vec<_>>());
    std::fs::write(&path, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

/// Issue 16, point 2: after --no-build or a failed build OUT holds no library of a previous
/// model, and what it holds is one build (headers, weights and manifest share the build hash).
#[test]
fn no_build_and_failed_builds_leave_no_stale_library() {
    let dir = scratch("stale-lib");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let (a, b) = (convnet(), bundled("indexing_pad_opset9.onnx"));
    expect_code(&run(&[a.to_str().unwrap(), "-o", o, "--no-build"]), 0);
    let hash_a = header_hash(&out);
    pretend_built(&out, "A");

    expect_code(&run(&[b.to_str().unwrap(), "-o", o, "--no-build"]), 0);
    assert!(!out.join("libmodel.so").exists(), "--no-build of B left A's library beside B's sources");
    let hash_b = header_hash(&out);
    assert!(hash_a.len() == 16 && hash_b.len() == 16 && hash_a != hash_b, "{hash_a} {hash_b}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("onnx2ait-manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["build_hash"], hash_b.as_str());
    assert!(manifest["library"].is_null(), "{manifest}");
    let weights = std::fs::read(out.join("weights.bin")).unwrap();
    assert!(weights.ends_with(format!("onnx2ait build {hash_b}\n").as_bytes()), "weights.bin carries the hash");
    let build: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("build.json")).unwrap()).unwrap();
    assert_eq!(build["build_hash"], hash_b.as_str());

    // A failed build (no nvcc) of A over B's "built" output: A's sources, no library.
    pretend_built(&out, "B");
    let fail = Command::new(BIN)
        .args([a.to_str().unwrap(), "-o", o])
        .env("NVCC", dir.join("missing/nvcc"))
        .output()
        .expect("run onnx2ait");
    let (_, err) = expect_code(&fail, 1);
    assert!(err.contains("no library was built") && err.contains(o), "{err}");
    assert!(!out.join("libmodel.so").exists(), "a failed build left B's library beside A's sources");
    assert_eq!(header_hash(&out), hash_a);
    assert_eq!(names(&dir), ["out"], "no staging folder is left");
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 2 with a real build (nvcc; skipped without it outside CI): the library of model A is
/// loadable and matches its folder; a --no-build compile of model B removes it.
#[test]
fn a_real_build_is_replaced_by_the_next_model() {
    use onnx2ait::build::nvcc::Nvcc;
    use onnx2ait::lower::cuda::Arch;
    if Nvcc::discover_for_test(Arch::Sm90, "the real-build output test").is_none() {
        return;
    }
    let dir = scratch("real-build");
    let out = dir.join("out");
    let o = out.to_str().unwrap();
    let (a, b) = (bundled("indexing_slice_opset9.onnx"), bundled("indexing_pad_opset9.onnx"));
    expect_code(&run(&[a.to_str().unwrap(), "-o", o, "--arch", "sm_90", "--no-profile"]), 0);
    let lib = onnx2ait::runtime::Library::open(&out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lib.model_name(), "indexing_slice_opset9");
    drop(lib);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("build_report.json")).unwrap()).unwrap();
    assert_eq!(
        report["lib"],
        out.join("libmodel.so").to_str().unwrap(),
        "the report names OUT, not the staging folder"
    );
    // Again, unchanged: nothing recompiles, nothing relinks.
    let (_, err) = expect_code(&run(&[a.to_str().unwrap(), "-o", o, "--arch", "sm_90", "--no-profile"]), 0);
    assert!(err.contains("libmodel.so up to date"), "{err}");

    expect_code(&run(&[b.to_str().unwrap(), "-o", o, "--no-build"]), 0);
    assert!(!out.join("libmodel.so").exists(), "A's library outlived A");
    let e = onnx2ait::runtime::Library::open(&out).err().unwrap().to_string();
    assert!(e.contains("the library was not built"), "{e}");
    assert_eq!(names(&dir), ["out"]);
    std::fs::remove_dir_all(&dir).ok();
}

/// Issue 16, point 7: two fresh builds of one model, from copies in different folders (one
/// named by a relative path, one by an absolute path) into different OUT folders, give the same
/// bytes in every file but the build's records (`build.log`, `build_report.json`: timings and
/// paths); the library included.
#[test]
fn fresh_builds_are_byte_identical() {
    use onnx2ait::build::nvcc::Nvcc;
    use onnx2ait::lower::cuda::Arch;
    if Nvcc::discover_for_test(Arch::Sm90, "the reproducible-build test").is_none() {
        return;
    }
    let dir = scratch("reproducible");
    for sub in ["a", "b/c"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::copy(bundled("indexing_pad_opset9.onnx"), dir.join(sub).join("pad.onnx")).unwrap();
    }
    let build = |model: &str, out: &str| {
        let o = Command::new(BIN)
            .args([model, "-o", out, "--arch", "sm_90", "--no-profile"])
            .current_dir(&dir)
            .env_remove("ONNX2AIT_CACHE_DIR")
            .output()
            .expect("run onnx2ait");
        expect_code(&o, 0);
    };
    build("a/pad.onnx", "out1");
    build(dir.join("b/c/pad.onnx").to_str().unwrap(), "b/out2");
    let (one, two) = (dir.join("out1"), dir.join("b/out2"));
    let files = names(&one);
    assert!(files.iter().any(|f| f == "libmodel.so"), "{files:?}");
    assert_eq!(files, names(&two));
    for f in files.iter().filter(|f| !["build.log", "build_report.json", "obj"].contains(&f.as_str())) {
        assert!(
            std::fs::read(one.join(f)).unwrap() == std::fs::read(two.join(f)).unwrap(),
            "{f} differs between two fresh builds"
        );
    }
    // The objects too.
    let objs = |out: &Path| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(out.join("obj"))
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_file())
            .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
            .collect();
        v.sort();
        v
    };
    assert!(objs(&one) == objs(&two), "the objects differ between two fresh builds");
    std::fs::remove_dir_all(&dir).ok();
}

/// A one-node model: `op` from input `x` (float32 `x_dims`) and the initializers to `y`.
fn write_one_node_model(
    path: &Path,
    opset: i64,
    n: NodeProto,
    x_dims: &[&str],
    y_dims: &[&str],
    initializer: Vec<onnx2ait::onnx::proto::TensorProto>,
) {
    let model = ModelProto {
        ir_version: Some(8),
        producer_name: Some("onnx2ait-tests".into()),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) }],
        graph: Some(GraphProto {
            name: Some("one_node".into()),
            node: vec![n],
            initializer,
            input: vec![tensor_value("x", 1, x_dims)],
            output: vec![tensor_value("y", 1, y_dims)],
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::write(path, model.encode_to_vec()).expect("write model");
}

/// Issue 16, point 3: compile checks every option against the model and the GPU: an unknown or
/// repeated --dim, a batch whose sizes overflow or exceed the largest GPU of --arch, a library
/// beyond --max-memory, a zero --max-batch or --jobs. Each is one clear error, exit 1.
#[test]
fn compile_checks_every_option() {
    let dir = scratch("strict-compile");
    let (m, out) = (convnet(), dir.join("out"));
    let (m, o) = (m.to_str().unwrap(), out.to_str().unwrap());
    let compile = |extra: &[&str]| run(&[&["compile", m, "-o", o, "--no-build"], extra].concat());

    let (_, err) = expect_code(&compile(&["--dim", "nosuch=4"]), 1);
    assert!(err.contains("--dim nosuch=4") && err.contains("no symbolic dim 'nosuch'") && err.contains("N"), "{err}");
    let (_, err) = expect_code(&compile(&["--dim", "N=4", "--dim", "N=5"]), 1);
    assert!(err.contains("--dim N is given more than once"), "{err}");

    let (out_text, err) = expect_code(&compile(&["--max-batch", "1000000000000000"]), 1);
    assert!(!out_text.contains("arena"), "no arena is reported for an impossible batch: {out_text}");
    assert!(err.contains("--max-batch 1000000000000000") && err.contains("H200") && err.contains("141 GB"), "{err}");
    let (_, err) = expect_code(&compile(&["--max-batch", "100000000", "--arch", "sm_80"]), 1);
    assert!(err.contains("A100 80GB") && err.contains("value 'x'"), "{err}");
    let (_, err) = expect_code(&compile(&["--max-batch", "9223372036854775807"]), 1);
    assert!(err.contains("64-bit") || err.contains("more than the 141 GB"), "{err}");
    // Every tensor fits but the library's arena, workspace and weights together do not.
    let (_, err) = expect_code(&compile(&["--max-batch", "1000", "--max-memory", "5MiB"]), 1);
    assert!(err.contains("activation arena") && err.contains("more than --max-memory (5.0 MiB)"), "{err}");
    assert!(!out.exists(), "a refused compile writes nothing");
    expect_code(&compile(&["--max-batch", "1000", "--max-memory", "1GiB"]), 0);

    for bad in [
        &["--max-batch", "0"][..],
        &["--max-batch=-3"],
        &["--jobs", "0"],
        &["--max-memory", "lots"],
        &["--reuse-within", "200"],
    ] {
        let (_, err) = expect_code(&compile(bad), 1);
        let option = bad[0].split('=').next().unwrap();
        assert!(err.contains(option) && err.contains("invalid value"), "{bad:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 3: validate computes the sizes of --dim and --batch with checked arithmetic and refuses
/// what cannot fit, instead of "capacity overflow" or an abort (exit 134).
#[test]
fn validate_refuses_sizes_that_overflow_or_cannot_fit() {
    let m = convnet();
    let m = m.to_str().unwrap();
    let (_, err) = expect_code(&run(&["validate", m, "--dim", "N=9223372036854775807"]), 1);
    assert!(err.contains("--dim N=9223372036854775807") && err.contains("64-bit"), "{err}");
    let (_, err) = expect_code(&run(&["validate", m, "--batch", "100000000000"]), 1);
    assert!(err.contains("--batch 100000000000") && err.contains("available memory"), "{err}");
    let (_, err) = expect_code(&run(&["profile", m, "--max-batch", "1000000000000000", "--build-only"]), 1);
    assert!(err.contains("H200"), "{err}");
    let (_, err) = expect_code(&run(&["explain", m, "--dim", "nosuch=1", "--profile-cache", "/nonexistent.json"]), 1);
    assert!(err.contains("no symbolic dim 'nosuch'"), "{err}");
}

/// `profile --dim` takes compile's run-time ranges (issue 14): checked against the model and sized
/// at their largest values before anything is built.
#[test]
fn profile_takes_run_time_ranges() {
    let bert = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
    let m = bert.to_str().unwrap();
    let (_, err) = expect_code(&run(&["profile", m, "--dim", "seq=1..100000000000000", "--build-only"]), 1);
    assert!(
        err.contains("at --max-batch 64 (batch dim 'batch') and the largest values of --dim seq=1..100000000000000")
            && err.contains("H200"),
        "{err}"
    );
    // A range of the batch dim is named as given, not as a --max-batch the user did not pass.
    let (_, err) = expect_code(
        &run(&["profile", m, "--dim", "seq=1..16", "--dim", "batch=2..100000000000000", "--build-only"]),
        1,
    );
    assert!(
        err.contains("at the largest values of --dim batch=2..100000000000000, --dim seq=1..16")
            && !err.contains("--max-batch"),
        "{err}"
    );
    let (_, err) = expect_code(&run(&["profile", m, "--dim", "nosuch=1..8", "--build-only"]), 1);
    assert!(err.contains("--dim nosuch=1..8") && err.contains("no symbolic dim 'nosuch'"), "{err}");
    let (_, err) = expect_code(&run(&["profile", m, "--dim", "seq=8..4", "--build-only"]), 1);
    assert!(err.contains("1 ≤ MIN ≤ MAX"), "{err}");
    let (_, err) = expect_code(&run(&["profile", m, "--dim", "seq=4", "--dim", "seq=1..8", "--build-only"]), 1);
    assert!(err.contains("--dim seq is given more than once"), "{err}");
}

/// Point 3: a misspelled subcommand gets clap's suggestion instead of being taken for a model.
#[test]
fn misspelled_subcommands_get_a_suggestion() {
    let m = convnet();
    for (typo, meant) in [("inspct", "inspect"), ("valdate", "validate"), ("explian", "explain")] {
        let (_, err) = expect_code(&run(&[typo, m.to_str().unwrap()]), 1);
        assert!(err.contains(&format!("unrecognized subcommand '{typo}'")), "{err}");
        assert!(err.contains(&format!("similar subcommand exists: '{meant}'")), "{err}");
    }
    // The default command still takes a model whose name is close to a subcommand.
    let dir = scratch("typo-model");
    let model = dir.join("inspct");
    std::fs::copy(convnet(), &model).unwrap();
    let out = dir.join("out");
    let o = Command::new(BIN)
        .current_dir(&dir)
        .args(["inspct", "-o", out.to_str().unwrap(), "--no-build"])
        .output()
        .expect("run onnx2ait");
    expect_code(&o, 0);
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 3: a model stamped with an opset newer than the newest supported imports with a warning
/// naming both; one at the newest gets none.
#[test]
fn a_newer_opset_is_a_warning_naming_both() {
    let dir = scratch("new-opset");
    let (new, ok) = (dir.join("opset23.onnx"), dir.join("opset21.onnx"));
    for (path, opset) in [(&new, 23), (&ok, onnx2ait::onnx::NEWEST_OPSET)] {
        write_one_node_model(path, opset, node("Relu", "", "relu", &["x"], &["y"]), &["N", "4"], &["N", "4"], vec![]);
    }
    let out = dir.join("out");
    let (_, err) = expect_code(&run(&["compile", new.to_str().unwrap(), "-o", out.to_str().unwrap(), "--no-build"]), 0);
    assert!(err.contains("warning:") && err.contains("opset 23") && err.contains("opset 21"), "{err}");
    let (text, _) = expect_code(&run(&["inspect", new.to_str().unwrap()]), 0);
    assert!(text.contains("opset 23") && text.contains("opset 21, the newest onnx2ait supports"), "{text}");
    let (_, err) = expect_code(&run(&["explain", new.to_str().unwrap()]), 0);
    assert!(err.contains("opset 23"), "{err}");
    let (_, err) = expect_code(&run(&["explain", ok.to_str().unwrap()]), 0);
    assert!(!err.contains("warning"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 3: a constant Gather index outside [-dim, dim) is an import error naming the node, not a
/// kernel that silently returns 0.
#[test]
fn constant_out_of_range_gather_index_is_an_import_error() {
    let dir = scratch("gather-range");
    let model = dir.join("gather.onnx");
    let indices = onnx2ait::onnx::proto::TensorProto {
        name: Some("idx".into()),
        dims: vec![1],
        data_type: Some(7),
        int64_data: vec![5],
        ..Default::default()
    };
    write_one_node_model(
        &model,
        17,
        node("Gather", "", "gather_bad", &["x", "idx"], &["y"]),
        &["3", "N"],
        &["1", "N"],
        vec![indices],
    );
    let out = dir.join("out");
    let (_, err) =
        expect_code(&run(&["compile", model.to_str().unwrap(), "-o", out.to_str().unwrap(), "--no-build"]), 1);
    assert!(err.contains("gather_bad") && err.contains("index 5 is out of range for an axis of size 3"), "{err}");
    assert!(!out.exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 5: `explain --dot` says which files it wrote, and that Graphviz was not found.
#[test]
fn explain_dot_names_its_files_and_a_missing_graphviz() {
    let dir = scratch("dot");
    let empty_path = dir.join("bin");
    std::fs::create_dir_all(&empty_path).unwrap();
    let dots = dir.join("dots");
    let o = Command::new(BIN)
        .args(["explain", convnet().to_str().unwrap(), "--dot", dots.to_str().unwrap()])
        .env("PATH", &empty_path)
        .output()
        .expect("run onnx2ait");
    let (_, err) = expect_code(&o, 0);
    for f in ["before.dot", "after.dot"] {
        assert!(dots.join(f).is_file() && err.contains(dots.join(f).to_str().unwrap()), "{f}: {err}");
    }
    assert!(err.contains("Graphviz `dot` was not found") && !err.contains(".svg,"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 5: after --no-build, the library's absence is explained as such, not as a missing nvcc.
#[test]
fn validate_build_after_no_build_says_no_build() {
    let dir = scratch("no-build-validate");
    let (m, out) = (convnet(), dir.join("out"));
    expect_code(&run(&["compile", m.to_str().unwrap(), "-o", out.to_str().unwrap(), "--no-build"]), 0);
    let (_, err) = expect_code(&run(&["validate", m.to_str().unwrap(), "--build", out.to_str().unwrap()]), 1);
    assert!(err.contains("--no-build") && !err.contains("where nvcc is available"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A stand-in CUDA toolchain: an `nvcc` that reports CUDA 12.8 and "compiles" by writing its
/// `-o` file, and a CUTLASS 4.2 folder with only what discovery checks.
fn fake_toolchain(dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let nvcc = dir.join("fake-cuda/bin/nvcc");
    std::fs::create_dir_all(nvcc.parent().unwrap()).unwrap();
    std::fs::write(
        &nvcc,
        "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'Cuda compilation tools, release 12.8, V12.8.93'; exit 0; fi\n\
         while [ $# -gt 0 ]; do if [ \"$1\" = -o ]; then echo fake > \"$2\"; fi; shift; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&nvcc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let cutlass = dir.join("fake-cutlass");
    std::fs::create_dir_all(cutlass.join("include/cutlass")).unwrap();
    std::fs::create_dir_all(cutlass.join("tools/util/include/cutlass/util")).unwrap();
    std::fs::write(cutlass.join("include/cutlass/cutlass.h"), "").unwrap();
    std::fs::write(
        cutlass.join("include/cutlass/version.h"),
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 2\n#define CUTLASS_PATCH 0\n",
    )
    .unwrap();
    (nvcc, cutlass)
}

/// Point 5: when stderr is not a terminal (here a pipe) the build prints a line per finished
/// source, with counts and elapsed time, instead of nothing for minutes.
#[test]
fn build_progress_is_printed_as_lines_when_stderr_is_not_a_terminal() {
    let dir = scratch("progress-lines");
    let (nvcc, cutlass) = fake_toolchain(&dir);
    let out = dir.join("out");
    let o = Command::new(BIN)
        .args([convnet().to_str().unwrap(), "-o", out.to_str().unwrap(), "--no-profile", "--arch", "sm_80"])
        .env("NVCC", &nvcc)
        .env("CUTLASS_DIR", &cutlass)
        .env_remove("ONNX2AIT_CACHE_DIR")
        .output()
        .expect("run onnx2ait");
    let (_, err) = expect_code(&o, 0);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("build_report.json")).unwrap()).unwrap();
    let n = report["compiled"].as_u64().unwrap();
    assert!(n >= 2, "{report}");
    assert!(err.contains(&format!("compiling {n} sources with nvcc")), "{err}");
    for k in 1..=n {
        let line = err.lines().find(|l| l.starts_with(&format!("compiled {k}/{n} ")));
        assert!(line.is_some_and(|l| l.contains(".cu (") && l.ends_with(" s elapsed)")), "source {k}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 5: the test summary says which tests skipped their GPU part, and says so when none did.
#[test]
fn test_summary_reports_gpu_skips() {
    let dir = scratch("summary");
    let log = dir.join("log");
    let summary = |text: &str| {
        std::fs::write(&log, text).unwrap();
        let o = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test-summary.sh"))
            .arg(&log)
            .output()
            .expect("run bash");
        expect_code(&o, 0).0
    };
    let results = "test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out\n\
                   test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n";
    let text = summary(&format!(
        "test a::gpu ... GPU-SKIPPED: a::gpu (no GPU here: no CUDA device: 100)\nok\n{results}\
         GPU-SKIPPED: b::gpu (no nvcc to build the test library)\n"
    ));
    assert!(text.contains("== summary: 5 passed, 0 failed, 1 ignored in 2 test binaries"), "{text}");
    assert!(text.contains("== GPU: 2 tests skipped their GPU part (no GPU here"), "{text}");
    assert!(text.contains("a::gpu (no GPU here") && text.contains("b::gpu (no nvcc"), "{text}");
    let text = summary(results);
    assert!(text.contains("no test skipped its GPU part"), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Point 5: no script reopens /dev/stdout, which truncates a log its caller redirected to a file.
#[test]
fn scripts_never_reopen_dev_stdout() {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
    let mut offenders = Vec::new();
    let mut dirs = vec![scripts];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "sh") {
                let text = std::fs::read_to_string(&p).unwrap_or_default();
                if text.lines().any(|l| !l.trim_start().starts_with('#') && l.contains("/dev/stdout")) {
                    offenders.push(p.display().to_string());
                }
            }
        }
    }
    assert!(offenders.is_empty(), "scripts writing to /dev/stdout: {offenders:?}");
}

/// An explicit range of the batch dim (`--dim batch=1..8`) bounds the batch: library instances
/// are chosen for batches up to 8 (not `--max-batch`'s default 64), and a `--max-batch` that says
/// otherwise is refused by compile and profile; one that agrees is accepted.
#[test]
fn a_range_of_the_batch_dim_governs_the_batch() {
    let bert = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
    let m = bert.to_str().unwrap();
    for (extra, name) in [(&[][..], "range"), (&["--max-batch", "8"][..], "agreeing")] {
        let out = scratch(&format!("batch-range-{name}"));
        let o = out.to_str().unwrap();
        let mut args = vec!["compile", m, "-o", o, "--no-build", "--dim", "seq=1..16", "--dim", "batch=1..8"];
        args.extend_from_slice(extra);
        let (stdout, _) = expect_code(&run(&args), 0);
        assert!(stdout.contains("batch 'batch' from 1 to 8"), "{name}: {stdout}");
        let build: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("build.json")).unwrap()).unwrap();
        let mut bounds = Vec::new();
        for k in build["kernels"].as_array().unwrap() {
            for d in k["dispatch"].as_array().into_iter().flatten() {
                bounds.push(d["max_batch"].as_i64().unwrap());
            }
        }
        assert!(!bounds.is_empty(), "{name}: the products have library instances");
        assert!(bounds.iter().all(|&b| b <= 8) && bounds.contains(&8), "{name}: {bounds:?}");
        let _ = std::fs::remove_dir_all(&out);
    }
    let out = scratch("batch-range-contradiction");
    let o = out.to_str().unwrap();
    let args = ["compile", m, "-o", o, "--no-build", "--dim", "seq=1..16", "--dim", "batch=1..8", "--max-batch", "32"];
    let (_, err) = expect_code(&run(&args), 1);
    assert!(err.contains("--max-batch 32 contradicts --dim batch=1..8"), "{err}");
    let args = ["profile", m, "--dim", "seq=1..16", "--dim", "batch=2..8", "--max-batch", "32", "--build-only"];
    let (_, err) = expect_code(&run(&args), 1);
    assert!(err.contains("--max-batch 32 contradicts --dim batch=2..8"), "{err}");
    let _ = std::fs::remove_dir_all(&out);
}

/// Issue 14: the memory checks name the option that bounds the batch as the user gave it. With a
/// range of the batch dim (`--dim batch=1..4096`) the GPU-memory refusal says to lower that
/// range's largest value, not `--max-batch` (which was not passed); with a free batch it says
/// `--max-batch`. Tiny BERT at 4096 · 16 tokens: every value fits 20 MiB, the arena does not.
#[test]
fn memory_refusals_name_the_option_that_bounds_the_batch() {
    let bert = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
    let m = bert.to_str().unwrap();
    let out = scratch("batch-range-memory");
    let o = out.to_str().unwrap();
    let base = ["compile", m, "-o", o, "--no-build", "--no-profile", "--max-memory", "20MiB", "--dim", "seq=1..16"];
    let mut ranged = base.to_vec();
    ranged.extend(["--dim", "batch=1..4096"]);
    let (_, err) = expect_code(&run(&ranged), 1);
    assert!(
        err.contains("the library would need")
            && err.contains("at the largest values of --dim batch=1..4096, --dim seq=1..16")
            && err.contains("more than --max-memory (20.0 MiB); lower the largest value of --dim batch=1..4096 or the largest value of --dim seq=1..16")
            && !err.contains("--max-batch"),
        "{err}"
    );
    let mut free = base.to_vec();
    free.extend(["--max-batch", "4096"]);
    let (_, err) = expect_code(&run(&free), 1);
    assert!(
        err.contains("at --max-batch 4096 and the largest values of --dim seq=1..16")
            && err.contains("; lower --max-batch or the largest value of --dim seq=1..16"),
        "{err}"
    );
    // The per-value check before lowering names them alike.
    let mut small = ranged.clone();
    small[7] = "12MiB";
    let (_, err) = expect_code(&run(&small), 1);
    assert!(
        err.contains("at the largest values of --dim batch=1..4096, --dim seq=1..16: value")
            && !err.contains("--max-batch"),
        "{err}"
    );
    assert!(!out.join("model.cu").exists(), "a refused compile writes nothing");
    let _ = std::fs::remove_dir_all(&out);
}

/// Issue 14: a batch range whose smallest value is above 1 (`--dim batch=4..64`, and a seq range
/// from 16) gets no choice for a batch below it: every dispatch bound lies inside the ranges (8
/// and 64 for the batch, 64 for seq), build.json and model.cu record the range with the option
/// that set it, and the library's dim check refuses a batch below 4 with
/// O2A_ERR_INVALID_ARGUMENT naming that option.
#[test]
fn a_batch_range_above_one_has_no_choice_below_it() {
    let bert = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
    let m = bert.to_str().unwrap();
    let out = scratch("batch-range-min");
    let o = out.to_str().unwrap();
    let args = ["compile", m, "-o", o, "--no-build", "--no-profile", "--dim", "batch=4..64", "--dim", "seq=16..128"];
    let (stdout, _) = expect_code(&run(&args), 0);
    assert!(stdout.contains("batch 'batch' from 4 to 64") && stdout.contains("dim 'seq' from 16 to 128"), "{stdout}");
    let build: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("build.json")).unwrap()).unwrap();
    let (mut batches, mut seqs) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    for k in build["kernels"].as_array().unwrap() {
        for d in k["dispatch"].as_array().into_iter().flatten() {
            batches.insert(d["max_batch"].as_i64().unwrap());
            seqs.extend(d["dims"]["seq"].as_i64());
        }
    }
    assert!(batches.iter().all(|b| [8, 64].contains(b)) && batches.contains(&64), "{batches:?}");
    assert!(seqs.iter().all(|&s| s == 64), "{seqs:?}");
    assert_eq!(
        build["run_dims"],
        serde_json::json!([
            { "symbol": "batch", "min": 4, "max": 64, "option": "--dim batch=4..64" },
            { "symbol": "seq", "min": 16, "max": 128, "option": "--dim seq=16..128" }
        ])
    );
    let model_cu = std::fs::read_to_string(out.join("model.cu")).unwrap();
    for row in [
        r#"{R"onnx2ait(batch)onnx2ait", 4, 64, R"onnx2ait(--dim batch=4..64)onnx2ait"},"#,
        r#"{R"onnx2ait(seq)onnx2ait", 16, 128, R"onnx2ait(--dim seq=16..128)onnx2ait"},"#,
    ] {
        assert!(model_cu.contains(row), "{row} missing from model.cu");
    }
    let check = model_cu.split("int check_dims(").nth(1).unwrap().split("\n}\n").next().unwrap();
    assert!(
        check.contains("if (v < kDims[i].min || v > kDims[i].max) {")
            && check.contains("return fail(O2A_ERR_INVALID_ARGUMENT,")
            && check.contains("kDims[i].option);"),
        "{check}"
    );
    let _ = std::fs::remove_dir_all(&out);
}

/// `explain --profile-cache` takes compile's run-time ranges: a ranged dim is priced at its
/// largest value (as compile prices it), a range of the batch dim sets the pricing batch, and a
/// `--batch` contradicting it is refused.
#[test]
fn explain_prices_run_time_ranges_at_their_largest_values() {
    let bert = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
    let m = bert.to_str().unwrap();
    let dir = scratch("explain-ranges");
    // A cache without times: every cost is the analytical estimate, which follows the sizes.
    let cache = dir.join("profile.json");
    std::fs::write(&cache, r#"{"format_version":1,"devices":{}}"#).unwrap();
    let c = cache.to_str().unwrap();
    let priced = |dims: &[&str]| -> (i64, Vec<f64>) {
        let mut args = vec!["explain", m, "--json", "--attention", "fused", "--profile-cache", c];
        for d in dims {
            args.extend(["--dim", d]);
        }
        let (out, _) = expect_code(&run(&args), 0);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let costs = &v["kernel_costs"];
        let us = costs["kernels"].as_array().unwrap().iter().map(|k| k["us"].as_f64().unwrap()).collect();
        (costs["batch"].as_i64().unwrap(), us)
    };
    let fixed = priced(&["seq=64"]);
    assert!(!fixed.1.is_empty());
    assert_eq!(priced(&["seq=1..64"]), fixed, "a range is priced at its largest value");
    let short = priced(&["seq=1..16"]);
    assert_eq!(short.0, 64);
    assert_ne!(short.1, fixed.1, "shorter sequences cost less");
    let (batch, _) = priced(&["seq=1..64", "batch=1..8"]);
    assert_eq!(batch, 8, "the batch range sets the pricing batch");
    let args = ["explain", m, "--profile-cache", c, "--dim", "seq=1..64", "--dim", "batch=1..8", "--batch", "4"];
    let (_, err) = expect_code(&run(&args), 1);
    assert!(err.contains("--batch 4 contradicts --dim batch=1..8"), "{err}");
    let (_, err) = expect_code(&run(&["explain", m, "--profile-cache", c, "--dim", "seq=9..3"]), 1);
    assert!(err.contains("1 ≤ MIN ≤ MAX"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
