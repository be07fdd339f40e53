//! Compile tests of templates/cuda/library/conv2d_sm80.cu.hbs (owner: the template's author):
//! the CUTLASS 2.x implicit-GEMM conv instance (Sm80 mainloop), one variant per epilogue shape
//! and iterator, compiled for sm_80.

use crate::common;
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

/// A full context (every field the strict template may name); `tile` is
/// [tile_m, tile_n, tile_k, warp_m, warp_n, warp_k, stages].
fn ctx(name: &str, has_bias: bool, has_residual: bool, act: &str, iterator: &str, tile: [u32; 7]) -> Json {
    // Without a residual the whole activation chain is `epilogue`; with one, `pre_act` runs on
    // acc + bias and `act` on the sum with the residual.
    json!({
        "name": name,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "pre_act": "v",
        "act": act,
        "epilogue": act,
        "tile_m": tile[0], "tile_n": tile[1], "tile_k": tile[2],
        "warp_m": tile[3], "warp_n": tile[4], "warp_k": tile[5],
        "stages": tile[6],
        "swizzle": 1,
        "iterator": iterator,
        "input_alignment": 8,
    })
}

/// Renders and compiles one variant; returns nvcc and the object (None: no nvcc, skipped).
fn build(case: &str, ctx: &Json) -> Option<(Nvcc, PathBuf)> {
    common::build("conv2d_sm80", Arch::Sm80, "O2aConvArgs", case, ctx)
}

#[test]
fn conv_sm80_bias_relu_optimized() {
    let c = ctx("o2a_conv_sm80_a", true, false, "o2a_relu(v)", "kOptimized", [128, 128, 32, 64, 64, 32, 4]);
    build("bias_relu_optimized", &c);
}

#[test]
fn conv_sm80_bias_residual_relu() {
    let c = ctx("o2a_conv_sm80_b", true, true, "o2a_relu(v)", "kOptimized", [64, 64, 32, 32, 32, 32, 5]);
    build("bias_residual_relu", &c);
}

#[test]
fn conv_sm80_fixed_channels_sigmoid() {
    let c = ctx("o2a_conv_sm80_c", false, false, "o2a_sigmoid(v)", "kFixedChannels", [64, 64, 32, 32, 32, 32, 3]);
    let Some((nvcc, obj)) = build("fixed_channels_sigmoid", &c) else { return };
    let driver = common::check_driver("o2a_conv_sm80_c", "O2aConvArgs", "o2a_conv_sm80_c: ", CONV_CHECK_DRIVER);
    common::run_host_driver(&nvcc, &obj, &driver);
}

/// The RGB stem padded to 4 channels: fixed-channels iterator with 8-byte input accesses.
#[test]
fn conv_sm80_fixed_four_channels() {
    let mut c = ctx("o2a_conv_sm80_d", true, false, "o2a_relu(v)", "kFixedChannels", [64, 64, 32, 32, 32, 32, 5]);
    c["input_alignment"] = json!(4);
    build("fixed_four_channels", &c);
}

/// CHECK-mode answers of the kFixedChannels instance (no bias, no residual), on fake pointers:
/// CHECK reads nothing through them.
/// The driver's body, after `common::check_driver`'s prelude.
const CONV_CHECK_DRIVER: &str = r#"
static O2aConvArgs conv(int n, int h, int w, int c, int k, int r, int stride, int pad) {
  O2aConvArgs a;
  memset(&a, 0, sizeof a);
  a.n = n; a.h = h; a.w = w; a.c = c; a.k = k; a.r = r; a.s = r;
  a.pad_h = a.pad_w = pad; a.stride_h = a.stride_w = stride; a.dil_h = a.dil_w = 1;
  a.p = (h + 2 * pad - r) / stride + 1; a.q = (w + 2 * pad - r) / stride + 1;
  a.x = (const half*)0x10000; a.weight = (const half*)0x20000; a.out = (half*)0x30000;
  return a;
}
int main() {
  const int CHECK = O2A_LIBRARY_CHECK;
  O2aConvArgs stem = conv(8, 224, 224, 8, 64, 7, 2, 3);
  expect("stem", &stem, CHECK, O2A_OK);
  O2aConvArgs c64 = conv(8, 56, 56, 64, 64, 3, 1, 1);
  expect("C != 8", &c64, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs k60 = conv(8, 56, 56, 8, 60, 3, 1, 1);
  expect("K % 8", &k60, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs odd = stem; odd.out = (half*)0x30008;
  expect("misaligned out", &odd, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs big = conv(20000, 224, 224, 8, 64, 7, 2, 3);  // 16 GB input: chunks of images
  expect("chunked batch", &big, CHECK, O2A_OK);
  O2aConvArgs huge = conv(1, 16384, 16384, 8, 8, 3, 1, 1);  // one image of 4 GiB
  expect("image over 2^31 bytes", &huge, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs bad = stem; bad.dil_w = 0;
  expect("dilation 0", &bad, CHECK, O2A_ERR_INVALID_ARGUMENT);
  expect("unknown mode", &stem, 7, O2A_ERR_INVALID_ARGUMENT);
  O2aConvArgs empty = stem; empty.n = 0;
  O2aConvArgs nul = stem; nul.x = nullptr;
  return finish_with_abi_rules(empty, nul);
}
"#;

/// Rendering needs no nvcc: the function has the library ABI and the problem is not baked in.
#[test]
fn conv_sm80_renders_library_abi() {
    let t = onnx2ait::codegen::Templates::for_target("cuda").unwrap();
    let c = ctx("o2a_conv_sm80_r", true, true, "o2a_relu(v)", "kAnalytic", [64, 64, 32, 32, 32, 32, 3]);
    let src = t.render("library/conv2d_sm80.cu", &c).unwrap();
    assert!(src.contains("int o2a_conv_sm80_r(const O2aConvArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode)"));
    assert!(src.contains("#include \"library.cuh\""));
    assert!(!src.contains("common.cuh"));
    assert!(src.contains("IteratorAlgorithm::kAnalytic"));
    // Strict rendering: a missing field is an error, never an empty string in C++.
    let mut missing = c.clone();
    missing.as_object_mut().unwrap().remove("iterator");
    assert!(t.render("library/conv2d_sm80.cu", &missing).is_err());
}
