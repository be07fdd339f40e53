//! Compile tests of templates/cuda/library/conv2d_group_sm80.cu.hbs: the CUTLASS 2.x grouped
//! implicit-GEMM conv instance (Sm80 mainloop, one group per tile), compiled for sm_90a (where
//! the lowering uses it on the H200 as on the A100): one variant per epilogue shape and access
//! width, and the CHECK-mode answers of one instance run on the host.

use crate::common;
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

/// A full context (every field the strict template may name); `tile` is
/// [tile_m, tile_n, tile_k, warp_m, warp_n, warp_k, stages].
fn ctx(
    name: &str,
    groups: u32,
    iterator: &str,
    input_alignment: u32,
    has_bias: bool,
    has_residual: bool,
    tile: [u32; 7],
) -> Json {
    json!({
        "name": name,
        "groups": groups,
        "iterator": iterator,
        "input_alignment": input_alignment,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "pre_act": "o2a_relu(v)",
        "act": "o2a_relu(v)",
        "epilogue": "o2a_relu(v)",
        "tile_m": tile[0], "tile_n": tile[1], "tile_k": tile[2],
        "warp_m": tile[3], "warp_n": tile[4], "warp_k": tile[5],
        "stages": tile[6],
        "swizzle": 1,
    })
}

fn build(case: &str, ctx: &Json) -> Option<(Nvcc, PathBuf)> {
    common::build("conv2d_group_sm80", Arch::Sm90a, "O2aConvArgs", case, ctx)
}

/// ResNeXt-50's last stage: 32 groups of 32 channels and filters, one group per 32-wide tile,
/// bias + relu; its CHECK answers on the host.
#[test]
fn conv_group_sm80_one_group_per_tile_bias() {
    let c = ctx("o2a_conv_group_a", 32, "kOptimized", 8, true, false, [128, 32, 32, 32, 32, 32, 4]);
    let Some((nvcc, obj)) = build("single_bias", &c) else { return };
    let driver = common::check_driver("o2a_conv_group_a", "O2aConvArgs", "o2a_conv_group_a: ", GROUP_CHECK_DRIVER);
    common::run_host_driver(&nvcc, &obj, &driver);
}

/// One group per 32-wide tile (32 filters per group), bias + residual + relu: the grouped
/// mainloop with the broadcast epilogue.
#[test]
fn conv_group_sm80_single_group_residual() {
    let c = ctx("o2a_conv_group_b", 32, "kOptimized", 8, true, true, [64, 32, 32, 32, 32, 32, 5]);
    build("single_residual", &c);
}

/// 4 channels per group (8-byte accesses), 64 filters per group on a 64-wide tile, the analytic
/// iterator, residual without bias.
#[test]
fn conv_group_sm80_four_channel_groups_residual_no_bias() {
    let c = ctx("o2a_conv_group_c", 16, "kAnalytic", 4, false, true, [128, 64, 32, 64, 32, 32, 4]);
    build("four_channels_residual", &c);
}

/// CHECK-mode answers of the 32-group, 32-wide-tile instance on fake pointers: CHECK reads
/// nothing through them.
const GROUP_CHECK_DRIVER: &str = r#"
static O2aConvArgs conv(int n, int h, int c, int k, int stride) {
  O2aConvArgs a;
  memset(&a, 0, sizeof a);
  a.n = n; a.h = a.w = h; a.c = c; a.k = k; a.r = a.s = 3;
  a.pad_h = a.pad_w = 1; a.stride_h = a.stride_w = stride; a.dil_h = a.dil_w = 1;
  a.p = a.q = (h + 2 - 3) / stride + 1;
  a.x = (const half*)0x10000; a.weight = (const half*)0x20000; a.bias = (const half*)0x40000;
  a.out = (half*)0x30000;
  return a;
}
int main() {
  const int CHECK = O2A_LIBRARY_CHECK;
  O2aConvArgs resnext = conv(8, 7, 1024, 1024, 1);  // 32 groups of 32 -> 32
  expect("resnext stage 4", &resnext, CHECK, O2A_OK);
  O2aConvArgs strided = conv(8, 14, 1024, 1024, 2);
  expect("resnext 3x3 stride 2", &strided, CHECK, O2A_OK);
  O2aConvArgs k2048 = conv(8, 7, 1024, 2048, 1);  // 64 filters per group: two tiles per group
  expect("64 filters per group", &k2048, CHECK, O2A_OK);
  O2aConvArgs narrow = conv(8, 56, 128, 128, 1);  // 4 filters per group: the direct kernel's
  expect("K/groups below the tile", &narrow, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs k1536 = conv(8, 28, 1024, 1536, 1);  // 48 filters per group: not whole tiles
  expect("K/groups not whole tiles", &k1536, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs c100 = conv(8, 28, 100, 1024, 1);  // 100 channels do not split into 32 groups
  expect("C % groups", &c100, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs c192 = conv(8, 28, 192, 1024, 1);  // 6 channels per group: not a multiple of 8
  expect("C/groups % 8", &c192, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs odd = resnext; odd.weight = (const half*)0x20008;
  expect("misaligned weight", &odd, CHECK, O2A_ERR_UNSUPPORTED);
  O2aConvArgs big = conv(600, 112, 1024, 1024, 1);  // 15 GB input: chunks of images
  expect("chunked batch", &big, CHECK, O2A_OK);
  O2aConvArgs bad = resnext; bad.stride_h = 0;
  expect("stride 0", &bad, CHECK, O2A_ERR_INVALID_ARGUMENT);
  O2aConvArgs empty = resnext; empty.n = 0;
  O2aConvArgs nul = resnext; nul.bias = nullptr;
  return finish_with_abi_rules(empty, nul);
}
"#;

/// Rendering needs no nvcc: the function has the library ABI, the group count is compiled in, and
/// a missing field is an error.
#[test]
fn conv_group_sm80_renders_library_abi() {
    let t = onnx2ait::codegen::Templates::for_target("cuda").unwrap();
    let c = ctx("o2a_conv_group_r", 32, "kOptimized", 8, true, true, [128, 64, 32, 64, 32, 32, 4]);
    let src = t.render("library/conv2d_group_sm80.cu", &c).unwrap();
    assert!(src.contains("int o2a_conv_group_r(const O2aConvArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode)"));
    assert!(src.contains("constexpr int kGroups = 32;"));
    assert!(src.contains("cutlass::conv::GroupMode::kSingleGroup"));
    assert!(!src.contains("kMultipleGroup;"), "one group per tile only");
    assert!(src.contains("struct GroupedConvWithBroadcast"), "the residual epilogue runs the grouped mainloop");
    assert!(!src.contains("common.cuh"));
    let plain = ctx("o2a_conv_group_p", 32, "kAnalytic", 4, true, false, [128, 32, 32, 32, 32, 32, 4]);
    let src = t.render("library/conv2d_group_sm80.cu", &plain).unwrap();
    assert!(!src.contains("GroupedConvWithBroadcast"), "no residual: CUTLASS's grouped kernel as it is");
    assert!(src.contains("ImplicitGemmConvolution<GroupKernel>"));
    for field in ["groups", "iterator", "input_alignment"] {
        let mut missing = c.clone();
        missing.as_object_mut().unwrap().remove(field);
        assert!(t.render("library/conv2d_group_sm80.cu", &missing).is_err(), "{field}");
    }
}
