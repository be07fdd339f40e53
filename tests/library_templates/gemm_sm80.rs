//! Compile tests of templates/cuda/library/gemm_sm80.cu.hbs (owner: the template's author): the
//! CUTLASS 2.x GemmUniversal instance (Sm80 mainloop), one variant per epilogue kernel and a mix
//! of operand layouts, compiled for sm_80.

use crate::common;
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

/// A full context (every field the strict template may name); `tile` is
/// [tile_m, tile_n, tile_k, warp_m, warp_n, warp_k, stages].
fn ctx(name: &str, has_bias: bool, has_residual: bool, act: &str, layouts: [&str; 2], tile: [u32; 7]) -> Json {
    json!({
        "name": name,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "act": act,
        "layout_a": layouts[0],
        "layout_b": layouts[1],
        "tile_m": tile[0], "tile_n": tile[1], "tile_k": tile[2],
        "warp_m": tile[3], "warp_n": tile[4], "warp_k": tile[5],
        "stages": tile[6],
        "swizzle": 1,
    })
}

/// Renders and compiles one variant; returns nvcc and the object (None: no nvcc, skipped).
fn build(case: &str, ctx: &Json) -> Option<(Nvcc, PathBuf)> {
    common::build("gemm_sm80", Arch::Sm80, "O2aGemmArgs", case, ctx)
}

#[test]
fn gemm_sm80_row_col_bias_relu() {
    let c =
        ctx("o2a_gemm_sm80_a", true, false, "o2a_relu(v)", ["RowMajor", "ColumnMajor"], [128, 128, 32, 64, 64, 32, 4]);
    build("row_col_bias_relu", &c);
}

#[test]
fn gemm_sm80_row_row_residual() {
    let c = ctx("o2a_gemm_sm80_b", false, true, "v", ["RowMajor", "RowMajor"], [128, 64, 32, 64, 32, 32, 5]);
    build("row_row_residual", &c);
}

#[test]
fn gemm_sm80_bias_residual_broadcast() {
    let c =
        ctx("o2a_gemm_sm80_c", true, true, "o2a_gelu_erf(v)", ["ColumnMajor", "RowMajor"], [64, 64, 32, 32, 32, 32, 3]);
    let Some((nvcc, obj)) = build("bias_residual_broadcast", &c) else { return };
    let driver = common::check_driver("o2a_gemm_sm80_c", "O2aGemmArgs", "o2a_gemm_sm80_c: ", GEMM_CHECK_DRIVER);
    common::run_host_driver(&nvcc, &obj, &driver);
}

/// CHECK-mode answers of the bias + residual instance (A ColumnMajor, B RowMajor), on fake
/// pointers: CHECK reads nothing through them.
/// The driver's body, after `common::check_driver`'s prelude.
const GEMM_CHECK_DRIVER: &str = r#"
// A is read column-major (lda = m), B row-major (ldb = n), d and res row-major, one bias row.
static O2aGemmArgs gemm(int64_t m, int64_t n, int64_t k, int64_t batch) {
  O2aGemmArgs g;
  memset(&g, 0, sizeof g);
  g.m = m; g.n = n; g.k = k; g.batch_count = batch;
  g.lda = m; g.ldb = n; g.ldd = n; g.ld_bias = 0; g.ld_res = n;
  g.batch_stride_a = m * k; g.batch_stride_b = k * n; g.batch_stride_d = m * n;
  g.batch_stride_bias = 0; g.batch_stride_res = m * n;
  g.alpha = 0.5f; g.beta = 1.0f;
  g.a = (const half*)0x10000; g.b = (const half*)0x20000; g.bias = (const half*)0x30000;
  g.res = (const half*)0x40000; g.d = (half*)0x50000;
  return g;
}
int main() {
  const int CHECK = O2A_LIBRARY_CHECK, RUN = O2A_LIBRARY_RUN;
  O2aGemmArgs ok = gemm(512, 768, 200, 4);
  expect("plain", &ok, CHECK, O2A_OK);
  O2aGemmArgs m_odd = gemm(500, 768, 200, 4);
  expect("M % 8 (A column-major)", &m_odd, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs k_odd = gemm(512, 768, 201, 4);
  expect("odd K is fine here", &k_odd, CHECK, O2A_OK);
  O2aGemmArgs n_odd = gemm(512, 764, 200, 4);
  expect("N % 8", &n_odd, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs beta = ok; beta.beta = 0.5f;
  expect("beta != 1", &beta, CHECK, O2A_ERR_UNSUPPORTED);
  expect("beta != 1, RUN", &beta, RUN, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs full_bias = ok; full_bias.ld_bias = 768;
  expect("bias matrix", &full_bias, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs stride = ok; stride.batch_stride_res = 512 * 768 + 4;
  expect("res batch stride % 8", &stride, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs ptr = ok; ptr.bias = (const half*)0x30002;
  expect("misaligned bias", &ptr, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs batches = gemm(64, 64, 64, 200000);
  expect("batch beyond 65535", &batches, CHECK, O2A_OK);
  O2aGemmArgs wide = gemm(64, (int64_t)64 * 65536 * 16, 64, 1);
  expect("grid y beyond 65535", &wide, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs big = gemm((int64_t)1 << 31, 64, 64, 1);
  expect("M beyond 32 bits", &big, CHECK, O2A_ERR_UNSUPPORTED);
  O2aGemmArgs neg = ok; neg.ldb = -8;
  expect("negative ldb", &neg, CHECK, O2A_ERR_INVALID_ARGUMENT);
  O2aGemmArgs empty = ok; empty.batch_count = 0;
  O2aGemmArgs nul = ok; nul.res = nullptr;
  return finish_with_abi_rules(empty, nul);
}
"#;

/// Rendering needs no nvcc: the function has the library ABI and the problem is not baked in.
#[test]
fn gemm_sm80_renders_library_abi() {
    let t = onnx2ait::codegen::Templates::for_target("cuda").unwrap();
    let c = ctx("o2a_gemm_sm80_r", true, true, "v", ["RowMajor", "ColumnMajor"], [64, 64, 32, 32, 32, 32, 3]);
    let src = t.render("library/gemm_sm80.cu", &c).unwrap();
    assert!(src.contains("int o2a_gemm_sm80_r(const O2aGemmArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode)"));
    assert!(src.contains("#include \"library.cuh\""));
    assert!(!src.contains("common.cuh"));
    assert!(src.contains("GemmUniversalWithBroadcast<"));
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("layout_b");
    assert!(t.render("library/gemm_sm80.cu", &missing).is_err());
}
