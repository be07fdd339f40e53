//! Compile test of templates/cuda/library/conv2d_gemm_sm90.cu.hbs: a 1x1 convolution computed by
//! the sm90 GEMM behind the convolution ABI. One sm_90a compile (a minute or more): bias +
//! residual + relu on the ping-pong schedule, the ResNet bottleneck's last conv. Its CHECK-mode
//! answers are asked on the host (CHECK never touches the device): 1x1 problems pass, anything
//! the GEMM cannot express (a 3x3 filter, a stride, padding) and channel counts the GEMM's 16-byte
//! accesses cannot read are refused with the instance's name in the message.

use crate::common;
use onnx2ait::lower::cuda::Arch;
use serde_json::json;

#[test]
fn conv_gemm_sm90_bias_residual_relu_pingpong_128x128() {
    let name = "o2a_conv2d_gemm_sm90_res";
    let ctx = json!({
        "name": name,
        "gemm_name": format!("{name}_gemm"),
        "gemm_act": "o2a_relu(v)",
        "has_bias": true,
        "has_residual": true,
        "pre_act": "v",
        "act": "o2a_relu(v)",
        "epilogue": "o2a_relu(v)",
        "tile_m": 128,
        "tile_n": 128,
        "tile_k": 64,
        "cluster_m": 1,
        "cluster_n": 1,
        "schedule": "pingpong",
        "tile_scheduler": "persistent",
    });
    let src = common::render("conv2d_gemm_sm90", &ctx, "res");
    let text = std::fs::read_to_string(&src).unwrap();
    // The GEMM inside: row-major activations times the KRSC weights read column-major, the
    // epilogue's activation, and the conv-ABI function calling it.
    for want in [
        "using LayoutA = cutlass::layout::RowMajor;",
        "using LayoutB = cutlass::layout::ColumnMajor;",
        "out[i] = o2a_relu(v);",
        "constexpr bool kPingpong = true;",
        &format!("int {name}_gemm(const O2aGemmArgs* args"),
        &format!("int {name}(const O2aConvArgs* args"),
        &format!("return {name}_gemm(&g, workspace, workspace_bytes, stream, mode);"),
    ] {
        assert!(text.contains(want), "the rendered instance lacks `{want}`");
    }
    let Some((nvcc, obj)) = common::build("conv2d_gemm_sm90", Arch::Sm90a, "O2aConvArgs", "res", &ctx) else {
        return;
    };
    common::run_host_driver(&nvcc, &obj, &common::check_driver(name, "O2aConvArgs", name, CHECK_DRIVER));
}

/// CHECK-mode answers on fake (aligned) pointers: CHECK reads nothing through them.
/// The driver's body, after `common::check_driver`'s prelude.
const CHECK_DRIVER: &str = r#"
static O2aConvArgs conv(int n, int h, int c, int k, int r, int stride, int pad) {
  O2aConvArgs a;
  memset(&a, 0, sizeof a);
  a.n = n; a.h = a.w = h; a.c = c; a.k = k; a.r = a.s = r;
  a.pad_h = a.pad_w = pad; a.stride_h = a.stride_w = stride; a.dil_h = a.dil_w = 1;
  a.p = a.q = (h + 2 * pad - r) / stride + 1;
  a.x = (const half*)0x10000; a.weight = (const half*)0x20000; a.bias = (const half*)0x30000;
  a.res = (const half*)0x40000; a.out = (half*)0x50000;
  return a;
}
int main() {
  O2aConvArgs a = conv(256, 56, 64, 256, 1, 1, 0);
  expect("resnet 1x1 64->256 at batch 256", &a, O2A_LIBRARY_CHECK, O2A_OK);
  a = conv(1, 7, 512, 2048, 1, 1, 0);
  expect("resnet 1x1 512->2048 at batch 1", &a, O2A_LIBRARY_CHECK, O2A_OK);
  a = conv(8, 56, 64, 64, 3, 1, 1);
  expect("3x3 filter", &a, O2A_LIBRARY_CHECK, O2A_ERR_UNSUPPORTED);
  expect("3x3 filter (run)", &a, O2A_LIBRARY_RUN, O2A_ERR_UNSUPPORTED);
  a = conv(8, 56, 64, 256, 1, 2, 0);
  expect("stride 2", &a, O2A_LIBRARY_CHECK, O2A_ERR_UNSUPPORTED);
  a = conv(8, 56, 64, 256, 1, 1, 1);
  expect("padding 1", &a, O2A_LIBRARY_CHECK, O2A_ERR_UNSUPPORTED);
  a = conv(8, 56, 12, 256, 1, 1, 0);
  expect("12 channels (not 16-byte rows)", &a, O2A_LIBRARY_CHECK, O2A_ERR_UNSUPPORTED);
  a = conv(8, 56, 64, 256, 1, 1, 0);
  a.res = (const half*)0x40002;
  expect("misaligned residual", &a, O2A_LIBRARY_CHECK, O2A_ERR_UNSUPPORTED);
  a = conv(0, 56, 64, 256, 1, 1, 0);
  expect("batch 0 (nothing to do)", &a, O2A_LIBRARY_RUN, O2A_OK);
  return failures == 0 ? 0 : 1;
}
"#;

/// The narrow tile of projections with at most 32 output channels (MobileNetV2): bias, no
/// residual, ping-pong 128x32 (wgmma N = 32, the epilogue tile follows).
#[test]
fn conv_gemm_sm90_bias_pingpong_128x32() {
    let name = "o2a_conv2d_gemm_sm90_narrow";
    let ctx = json!({
        "name": name,
        "gemm_name": format!("{name}_gemm"),
        "gemm_act": "v",
        "has_bias": true,
        "has_residual": false,
        "pre_act": "v",
        "act": "v",
        "epilogue": "v",
        "tile_m": 128,
        "tile_n": 32,
        "tile_k": 64,
        "cluster_m": 1,
        "cluster_n": 1,
        "schedule": "pingpong",
        "tile_scheduler": "persistent",
    });
    common::build("conv2d_gemm_sm90", Arch::Sm90a, "O2aConvArgs", "narrow", &ctx);
}
