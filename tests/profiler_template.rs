//! templates/cuda/profile/profiler.cu.hbs renders, compiles warning-free with the pinned nvcc,
//! links with candidate instances into libprofile.so, and the runtime reads its case table
//! (host-only functions: no GPU needed). Running cases needs a GPU: the H200 check does that.
//!
//! Without nvcc the test is skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set.

use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::build::Compiler;
use onnx2ait::codegen::Templates;
use onnx2ait::lower::cuda::Arch;
use onnx2ait::runtime::profiler::{CaseInfo, ProfilerLib, PROFILE_LIB_NAME};
use serde_json::{json, Value as Json};
use std::path::{Path, PathBuf};

fn nvcc() -> Option<Nvcc> {
    Nvcc::discover_for_test(Arch::Sm80, "the profiler template test")
}

/// Candidate instances that refuse every problem (CHECK and RUN), with the library ABI's
/// signatures: enough to link the profiler.
fn dummy_instances(conv: &[&str], gemm: &[&str]) -> String {
    let mut s = String::from("#include \"library.cuh\"\n");
    for name in conv {
        s += &format!(
            "int {name}(const O2aConvArgs* args, void*, size_t, cudaStream_t, int mode) {{\n  \
             o2a_set_error(\"{name}: refuses every problem (k=%d, mode %d)\", args->k, mode);\n  \
             return O2A_ERR_UNSUPPORTED;\n}}\n"
        );
    }
    for name in gemm {
        s += &format!(
            "int {name}(const O2aGemmArgs* args, void*, size_t, cudaStream_t, int mode) {{\n  \
             o2a_set_error(\"{name}: refuses every problem (m=%lld, mode %d)\", (long long)args->m, mode);\n  \
             return O2A_ERR_UNSUPPORTED;\n}}\n"
        );
    }
    s
}

/// Two conv problems (bias + residual with distinct pre_act / act; grouped, bias only with a
/// fused epilogue) and two gemm problems (A transposed with bias; batched B transposed with residual).
fn context() -> Json {
    json!({
        "instances": [
            { "name": "dummy_conv_a", "kind": "conv" },
            { "name": "dummy_conv_b", "kind": "conv" },
            { "name": "dummy_gemm", "kind": "gemm" },
        ],
        "convs": [
            {
                "index": 0, "n": 2, "h": 14, "w": 14, "c": 32, "k": 64, "r": 3, "s": 3, "p": 7, "q": 7,
                "pad_h": 1, "pad_w": 1, "stride_h": 2, "stride_w": 2, "dil_h": 1, "dil_w": 1, "groups": 1,
                "has_bias": true, "has_residual": true,
                "pre_act": "v", "act": "o2a_relu(v)", "epilogue": "o2a_relu(v)",
                "candidates": ["dummy_conv_a", "dummy_conv_b"],
            },
            {
                "index": 1, "n": 1, "h": 8, "w": 8, "c": 8, "k": 16, "r": 1, "s": 1, "p": 8, "q": 8,
                "pad_h": 0, "pad_w": 0, "stride_h": 1, "stride_w": 1, "dil_h": 1, "dil_w": 1, "groups": 2,
                "has_bias": true, "has_residual": false,
                "pre_act": "o2a_clip(v, 0.0f, 6.0f)", "act": "v", "epilogue": "o2a_clip(v, 0.0f, 6.0f)",
                "candidates": ["dummy_conv_b"],
            },
        ],
        "gemms": [
            {
                "index": 0, "m": 64, "n": 128, "k": 256, "batch_count": 1,
                "lda": 64, "ldb": 128, "ldd": 128, "ld_bias": 0, "ld_res": 128,
                "batch_stride_a": 0, "batch_stride_b": 0, "batch_stride_d": 0,
                "batch_stride_bias": 0, "batch_stride_res": 0,
                "alpha": "1.0f", "beta": "1.0f",
                "a_elems": 256 * 64, "b_elems": 256 * 128, "bias_elems": 128, "res_elems": 0, "d_elems": 64 * 128,
                "trans_a": true, "trans_b": false, "has_bias": true, "has_residual": false,
                "act": "o2a_gelu_erf(v)",
                "candidates": ["dummy_gemm"],
            },
            {
                "index": 1, "m": 32, "n": 48, "k": 40, "batch_count": 3,
                "lda": 40, "ldb": 40, "ldd": 48, "ld_bias": 0, "ld_res": 48,
                "batch_stride_a": 32 * 40, "batch_stride_b": 0, "batch_stride_d": 32 * 48,
                "batch_stride_bias": 0, "batch_stride_res": 32 * 48,
                "alpha": "0.125f", "beta": "0.0f",
                "a_elems": 3 * 32 * 40, "b_elems": 48 * 40, "bias_elems": 0, "res_elems": 3 * 32 * 48,
                "d_elems": 3 * 32 * 48,
                "trans_a": false, "trans_b": true, "has_bias": false, "has_residual": true,
                "act": "v",
                "candidates": ["dummy_gemm"],
            },
        ],
    })
}

/// Compiles `src` in `dir` with the library flags plus -Wall -Wextra; fails on an error or a
/// warning.
fn compile_clean(nvcc: &Nvcc, dir: &Path, src: &str) -> PathBuf {
    let obj = dir.join(format!("{src}.o"));
    let mut cmd = nvcc.compile_command(&dir.join(src), &obj, dir);
    cmd.arg("-Xcompiler=-Wall,-Wextra");
    let out = cmd.output().unwrap_or_else(|e| panic!("running nvcc: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{src} does not compile:\n{text}");
    assert!(!text.to_lowercase().contains("warning"), "{src} compiles with warnings:\n{text}");
    obj
}

#[test]
fn profiler_renders_compiles_links_and_lists_its_cases() {
    let Some(nvcc) = nvcc() else { return };
    let dir = std::env::temp_dir().join(format!("o2a-profiler-template-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    let t = Templates::for_target("cuda").expect("cuda templates");
    std::fs::write(dir.join("library.cuh"), t.render("library.cuh", &json!({})).expect("library.cuh renders")).unwrap();
    let profiler = t.render("profile/profiler.cu", &context()).expect("profiler.cu renders");
    // Every case in order: conv problems' candidates, then gemms'.
    for line in [
        r#"{0, 0, 0, "dummy_conv_a", &dummy_conv_a, nullptr, &kConv0, nullptr},"#,
        r#"{0, 0, 1, "dummy_conv_b", &dummy_conv_b, nullptr, &kConv0, nullptr},"#,
        r#"{0, 1, 0, "dummy_conv_b", &dummy_conv_b, nullptr, &kConv1, nullptr},"#,
        r#"{1, 0, 0, "dummy_gemm", nullptr, &dummy_gemm, nullptr, &kGemm0 },"#,
        r#"{1, 1, 0, "dummy_gemm", nullptr, &dummy_gemm, nullptr, &kGemm1 },"#,
    ] {
        assert!(profiler.contains(line), "missing case line {line}:\n{profiler}");
    }
    // The group counts reach the problems' shapes (the reference reads C / groups channels).
    assert!(profiler.contains("      1, 1, 1 },") && profiler.contains("      1, 1, 2 },"), "{profiler}");
    assert!(profiler.contains("launch_gemm_reference<true, false, GemmEpilogue0>"), "{profiler}");
    assert!(profiler.contains("launch_gemm_reference<false, true, GemmEpilogue1>"), "{profiler}");
    std::fs::write(dir.join("profiler.cu"), profiler).unwrap();
    std::fs::write(dir.join("instances.cu"), dummy_instances(&["dummy_conv_a", "dummy_conv_b"], &["dummy_gemm"]))
        .unwrap();

    let objs = vec![compile_clean(&nvcc, &dir, "profiler.cu"), compile_clean(&nvcc, &dir, "instances.cu")];
    let lib = dir.join(PROFILE_LIB_NAME);
    let out = nvcc.link_command(&objs, &lib).output().expect("nvcc links");
    assert!(
        out.status.success(),
        "linking {} failed:\n{}{}",
        lib.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The case table comes from host code only: this works without a GPU.
    let p = ProfilerLib::load(&lib).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.num_cases(), 5);
    let case = |is_gemm, problem, candidate| CaseInfo { is_gemm, problem, candidate };
    let expected = [case(false, 0, 0), case(false, 0, 1), case(false, 1, 0), case(true, 0, 0), case(true, 1, 0)];
    assert_eq!(p.cases(), &expected);
    for (i, c) in expected.iter().enumerate() {
        assert_eq!(p.case_info(i).unwrap(), *c);
    }
    let err = p.case_info(5).unwrap_err().to_string();
    assert!(err.contains("case 5 is out of range") && err.contains(PROFILE_LIB_NAME), "{err}");
    assert!(!p.context_lost());
}

/// An empty profile (no problems) still renders and compiles: the tables keep their marker entry.
#[test]
fn empty_profile_compiles() {
    let Some(nvcc) = nvcc() else { return };
    let dir = std::env::temp_dir().join(format!("o2a-profiler-empty-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let t = Templates::for_target("cuda").expect("cuda templates");
    std::fs::write(dir.join("library.cuh"), t.render("library.cuh", &json!({})).expect("library.cuh renders")).unwrap();
    let ctx = json!({ "instances": [], "convs": [], "gemms": [] });
    std::fs::write(dir.join("profiler.cu"), t.render("profile/profiler.cu", &ctx).expect("renders")).unwrap();
    compile_clean(&nvcc, &dir, "profiler.cu");
}
