//! Compile tests of templates/cuda/library/conv2d_splitk_sm80.cu.hbs: the CUTLASS 2.x
//! implicit-GEMM conv in parallel split-K mode plus its fused reduction, one variant per epilogue
//! shape, compiled for sm_90a (where the lowering offers it on the H100/H200) and sm_80; the
//! split it plans for ResNet-50's late convolutions, and its CHECK answers, run on the host.

use crate::common;
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

/// A full context (every field the strict template may name) with the 64x64x32 tile the
/// lowering offers.
fn ctx(name: &str, has_bias: bool, has_residual: bool, pre_act: &str, act: &str) -> Json {
    json!({
        "name": name,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "pre_act": pre_act,
        "act": act,
        "epilogue": act.replace('v', &format!("({pre_act})")),
        "tile_m": 64, "tile_n": 64, "tile_k": 32,
        "warp_m": 32, "warp_n": 32, "warp_k": 32,
        "stages": 5,
        "swizzle": 1,
        "iterator": "kOptimized",
        "target_ctas": 132,
    })
}

fn build(case: &str, arch: Arch, ctx: &Json) -> Option<(Nvcc, PathBuf)> {
    common::build("conv2d_splitk_sm80", arch, "O2aConvArgs", case, ctx)
}

/// Bias + ReLU (ResNet's 3x3 convs), sm_90a; the slice plan and the CHECK answers on the host.
#[test]
fn conv_splitk_sm80_bias_relu_plan() {
    let c = ctx("o2a_conv_splitk_a", true, false, "v", "o2a_relu(v)");
    let Some((nvcc, obj)) = build("bias_relu", Arch::Sm90a, &c) else { return };
    let driver = common::check_driver("o2a_conv_splitk_a", "O2aConvArgs", "o2a_conv_splitk_a: ", SPLITK_CHECK_DRIVER);
    common::run_host_driver(&nvcc, &obj, &driver);
}

/// Bias + residual with a pre-activation and an activation after the sum, for sm_80.
#[test]
fn conv_splitk_sm80_bias_residual() {
    let c = ctx("o2a_conv_splitk_b", true, true, "o2a_relu(v)", "o2a_relu(v)");
    build("bias_residual", Arch::Sm80, &c);
}

/// Neither bias nor residual, a sigmoid: the reduction's other branches.
#[test]
fn conv_splitk_sm80_plain_sigmoid() {
    let c = ctx("o2a_conv_splitk_c", false, false, "v", "o2a_sigmoid(v)");
    build("plain_sigmoid", Arch::Sm90a, &c);
}

/// The slice count, read from CHECK's answer with no workspace (its message names the split),
/// for ResNet-50's late products at batch 1 and larger; and the usual CHECK answers.
const SPLITK_CHECK_DRIVER: &str = r#"
static O2aConvArgs conv(int n, int h, int c, int k, int r, int stride) {
  O2aConvArgs a;
  memset(&a, 0, sizeof a);
  a.n = n; a.h = a.w = h; a.c = c; a.k = k; a.r = a.s = r;
  a.pad_h = a.pad_w = r / 2; a.stride_h = a.stride_w = stride; a.dil_h = a.dil_w = 1;
  a.p = a.q = (h + 2 * (r / 2) - r) / stride + 1;
  a.x = (const half*)0x10000; a.weight = (const half*)0x20000; a.bias = (const half*)0x40000;
  a.out = (half*)0x30000;
  return a;
}
static int slices_of(const O2aConvArgs* a) {
  g_err[0] = 0;
  if (o2a_conv_splitk_a(a, nullptr, 0, nullptr, O2A_LIBRARY_CHECK) != O2A_ERR_UNSUPPORTED) return -1;
  const char* p = strstr(g_err, " for ");
  int s = -1;
  if (p == nullptr || sscanf(p, " for %d slices", &s) != 1) return -1;
  return s;
}
static void expect_slices(const char* what, O2aConvArgs a, int want) {
  const int got = slices_of(&a);
  printf("%-36s slices=%d want=%d %s\n", what, got, want, g_err);
  if (got != want) failures++;
}
int main() {
  const int CHECK = O2A_LIBRARY_CHECK;
  // 1 x 8 tiles of 64x64, 16 channel blocks: 16 slices of 9 iterations (128 CTAs).
  expect_slices("7x7 c512 k512 3x3, n1", conv(1, 7, 512, 512, 3, 1), 16);
  // 4 x 4 tiles, 8 channel blocks: 8 slices (128 CTAs).
  expect_slices("14x14 c256 k256 3x3, n1", conv(1, 14, 256, 256, 3, 1), 8);
  // 8 tiles, 64 channel blocks, one tap: 16 slices of 4 iterations.
  expect_slices("7x7 c2048 k512 1x1, n1", conv(1, 7, 2048, 512, 1, 1), 16);
  // 32 tiles: 4 slices.
  expect_slices("7x7 c512 k2048 1x1, n1", conv(1, 7, 512, 2048, 1, 1), 4);
  // The downsampling 1x1 of the last stage (7x7 out): 1 x 32 tiles, 32 channel blocks: 4 slices.
  expect_slices("14x14 c1024 k2048 1x1/2, n1", conv(1, 14, 1024, 2048, 1, 2), 4);
  // A 1x1 with 4 channel blocks: 2 slices would leave 2 iterations each, below the minimum.
  expect_slices("7x7 c128 k64 1x1, n1", conv(1, 7, 128, 64, 1, 1), 1);
  // Batch 64 fills the GPU without a split.
  expect_slices("7x7 c512 k512 3x3, n64", conv(64, 7, 512, 512, 3, 1), 1);
  // 12 channel blocks (C = 384) with a 3x3: the largest divisor of 12 within 132 / 8 CTAs.
  expect_slices("7x7 c384 k512 3x3, n1", conv(1, 7, 384, 512, 3, 1), 12);

  // One slice at batch 64: 6.4 MB of partials, above the 4 MiB every node reserves.
  O2aConvArgs b64 = conv(64, 7, 512, 512, 3, 1);
  expect("n64: partials above the reserve", &b64, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs late = conv(1, 7, 512, 512, 3, 1);
  expect("late 3x3", &late, CHECK, O2A_OK);
  O2aConvArgs big = conv(4096, 56, 256, 256, 3, 1);  // 6.6 GB input: beyond 2^31 bytes
  expect("input above 2^31 bytes", &big, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs k12 = late; k12.k = 12;
  expect("K % 8", &k12, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs odd = late; odd.out = (half*)0x30008;
  expect("misaligned out", &odd, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs bad = late; bad.dil_h = 0;
  expect("dilation 0", &bad, CHECK, O2A_ERR_INVALID_ARGUMENT);
  O2aConvArgs empty = late; empty.n = 0;
  O2aConvArgs nul = late; nul.bias = nullptr;
  return finish_with_abi_rules(empty, nul);
}
"#;

/// Rendering needs no nvcc: the library ABI, the reduction kernel, and strict fields.
#[test]
fn conv_splitk_sm80_renders_library_abi() {
    let t = onnx2ait::codegen::Templates::for_target("cuda").unwrap();
    let c = ctx("o2a_conv_splitk_r", true, true, "v", "o2a_relu(v)");
    let src = t.render("library/conv2d_splitk_sm80.cu", &c).unwrap();
    assert!(src.contains("int o2a_conv_splitk_r(const O2aConvArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode)"));
    assert!(src.contains("SplitKMode::kParallel"));
    assert!(src.contains("o2a_conv_splitk_r_reduce"));
    assert!(src.contains("constexpr int kTargetCtas = 132;"));
    for field in ["target_ctas", "iterator", "pre_act"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(field);
        assert!(t.render("library/conv2d_splitk_sm80.cu", &missing).is_err(), "{field}");
    }
}
