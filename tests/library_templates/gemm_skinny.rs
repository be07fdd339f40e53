//! Compile tests of templates/cuda/library/gemm_skinny.cu.hbs: the project's own few-row matrix
//! product (one warp per output column), compiled for sm_80 and sm_90a, and its CHECK answers.

use crate::common;
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

/// A full context (every field the strict template may name).
fn ctx(name: &str, has_bias: bool, has_residual: bool, act: &str, layouts: [&str; 2]) -> Json {
    json!({
        "name": name,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "act": act,
        "layout_a": layouts[0],
        "layout_b": layouts[1],
        "rows": 8,
    })
}

fn build(arch: Arch, case: &str, ctx: &Json) -> Option<(Nvcc, PathBuf)> {
    common::build("gemm_skinny", arch, "O2aGemmArgs", case, ctx)
}

#[test]
fn gemm_skinny_bias_sm90a() {
    let c = ctx("o2a_gemm_skinny_a", true, false, "v", ["RowMajor", "ColumnMajor"]);
    let Some((nvcc, obj)) = build(Arch::Sm90a, "bias_sm90a", &c) else { return };
    let driver = common::check_driver("o2a_gemm_skinny_a", "O2aGemmArgs", "o2a_gemm_skinny_a: ", CHECK_DRIVER);
    common::run_host_driver(&nvcc, &obj, &driver);
}

#[test]
fn gemm_skinny_bias_residual_gelu_sm80() {
    let c = ctx("o2a_gemm_skinny_b", true, true, "o2a_gelu_erf(v)", ["RowMajor", "ColumnMajor"]);
    build(Arch::Sm80, "bias_residual_gelu_sm80", &c);
}

/// CHECK-mode answers of the bias instance, on fake pointers: CHECK reads nothing through them.
const CHECK_DRIVER: &str = r#"
// A row-major [m, k], B stored [n, k], d row-major, one bias row.
static O2aGemmArgs gemm(int64_t m, int64_t n, int64_t k, int64_t batch) {
  O2aGemmArgs g;
  memset(&g, 0, sizeof g);
  g.m = m; g.n = n; g.k = k; g.batch_count = batch;
  g.lda = k; g.ldb = k; g.ldd = n; g.ld_bias = 0; g.ld_res = n;
  g.batch_stride_a = m * k; g.batch_stride_b = 0; g.batch_stride_d = m * n;
  g.alpha = 1.0f; g.beta = 1.0f;
  g.a = (const half*)0x10000; g.b = (const half*)0x20000; g.bias = (const half*)0x30000;
  g.d = (half*)0x50000;
  return g;
}
int main() {
  const int CHECK = O2A_LIBRARY_CHECK;
  O2aGemmArgs ok = gemm(1, 1000, 2048, 1);
  expect("ResNet-50's classifier at batch 1", &ok, CHECK, O2A_OK);
  O2aGemmArgs rows = gemm(64, 1000, 2048, 1);
  expect("64 rows", &rows, CHECK, O2A_OK);
  O2aGemmArgs many = gemm(65, 1000, 2048, 1);
  expect("65 rows: tensor cores", &many, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs odd_n = gemm(3, 1001, 2048, 2);
  expect("any N, batched", &odd_n, CHECK, O2A_OK);
  O2aGemmArgs k_odd = gemm(1, 1000, 2044, 1);
  expect("K % 8", &k_odd, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs lda = ok; lda.lda = 2052;
  expect("lda % 8", &lda, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs short_ld = ok; short_ld.ldb = 1024;
  expect("ldb < K", &short_ld, CHECK, O2A_ERR_INVALID_ARGUMENT);
  O2aGemmArgs full_bias = ok; full_bias.ld_bias = 1000;
  expect("bias matrix", &full_bias, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs one_out = gemm(2, 1000, 2048, 3); one_out.batch_stride_d = 0;
  expect("batches into one output", &one_out, CHECK, O2A_ERR_INVALID_ARGUMENT);
  O2aGemmArgs ptr = ok; ptr.b = (const half*)0x20008;
  expect("misaligned b", &ptr, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs batches = gemm(1, 1000, 2048, 70000);
  expect("batch beyond 65535", &batches, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs neg = ok; neg.ldd = -8;
  expect("negative ldd", &neg, CHECK, O2A_ERR_INVALID_ARGUMENT);
  O2aGemmArgs empty = ok; empty.m = 0;
  O2aGemmArgs nul = ok; nul.bias = nullptr;
  return finish_with_abi_rules(empty, nul);
}
"#;

/// Rendering needs no nvcc; a layout the kernel does not read fails the build with the reason.
#[test]
fn gemm_skinny_renders_library_abi() {
    let t = onnx2ait::codegen::Templates::for_target("cuda").unwrap();
    let c = ctx("o2a_gemm_skinny_r", false, true, "v", ["RowMajor", "ColumnMajor"]);
    let src = t.render("library/gemm_skinny.cu", &c).unwrap();
    assert!(src.contains("int o2a_gemm_skinny_r(const O2aGemmArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode)"));
    assert!(src.contains("#include \"library.cuh\""));
    assert!(!src.contains("#error"));
    let turned = ctx("o2a_gemm_skinny_t", false, false, "v", ["RowMajor", "RowMajor"]);
    let src = t.render("library/gemm_skinny.cu", &turned).unwrap();
    assert!(src.contains("#error \"o2a_gemm_skinny_t: gemm_skinny reads B stored [n, k]"), "{src}");
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("rows");
    assert!(t.render("library/gemm_skinny.cu", &missing).is_err());
}
