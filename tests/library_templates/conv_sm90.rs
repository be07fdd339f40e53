//! Compile tests of templates/cuda/library/conv2d_sm90.cu.hbs (owner: the template's author).
//!
//! Each variant is one sm_90a compile of a CUTLASS 3.x conv (about a minute), so the set is
//! small and chosen to cover every branch of the template: bias / residual leaves present or
//! absent, identity and non-trivial expressions, both tile_m values, both cluster shapes, one and
//! two CTAs per SM.

use crate::common;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};

struct Variant {
    case: &'static str,
    has_bias: bool,
    has_residual: bool,
    pre_act: &'static str,
    act: &'static str,
    epilogue: &'static str,
    tile: (u32, u32, u32),
    cluster: (u32, u32),
    ctas_per_sm: u32,
}

impl Variant {
    fn ctx(&self) -> Json {
        json!({
            "name": format!("o2a_conv_sm90_{}", self.case),
            "has_bias": self.has_bias,
            "has_residual": self.has_residual,
            "pre_act": self.pre_act,
            "act": self.act,
            "epilogue": self.epilogue,
            "tile_m": self.tile.0,
            "tile_n": self.tile.1,
            "tile_k": self.tile.2,
            "cluster_m": self.cluster.0,
            "cluster_n": self.cluster.1,
            "ctas_per_sm": self.ctas_per_sm,
        })
    }
}

/// Renders the variant, checks the epilogue tree holds exactly the leaves it needs, and compiles
/// it when nvcc is available.
fn check(v: Variant) {
    let src = common::render("conv2d_sm90", &v.ctx(), v.case);
    let text = std::fs::read_to_string(&src).unwrap();
    let name = format!("int o2a_conv_sm90_{}(const O2aConvArgs* args", v.case);
    assert!(text.contains(&name), "{}: the instance function is not defined as `{name}`", v.case);
    assert_eq!(text.contains("Sm90RowBroadcast<"), v.has_bias, "{}: bias leaf", v.case);
    assert_eq!(text.contains("Sm90SrcFetch<"), v.has_residual, "{}: residual leaf", v.case);
    let Some(nvcc) = common::nvcc(Arch::Sm90a) else { return };
    let start = std::time::Instant::now();
    common::compile(&nvcc, &src);
    eprintln!("{}: compiled in {:.1} s", v.case, start.elapsed().as_secs_f64());
}

/// relu(conv + bias), the plain fused conv: 128x128 tile, no cluster.
#[test]
fn conv_sm90_bias_relu_128x128() {
    check(Variant {
        case: "bias_relu_128x128",
        has_bias: true,
        has_residual: false,
        pre_act: "v",
        act: "o2a_relu(v)",
        epilogue: "o2a_relu(v)",
        tile: (128, 128, 64),
        cluster: (1, 1),
        ctas_per_sm: 1,
    });
}

/// relu(conv + bias + residual), the ResNet block tail: 128x64 tile, 2x1 cluster (filter
/// multicast).
#[test]
fn conv_sm90_bias_residual_relu_128x64_cluster2() {
    check(Variant {
        case: "bias_residual_relu_128x64",
        has_bias: true,
        has_residual: true,
        pre_act: "v",
        act: "o2a_relu(v)",
        epilogue: "o2a_relu(v)",
        tile: (128, 64, 64),
        cluster: (2, 1),
        ctas_per_sm: 1,
    });
}

/// sigmoid(conv) without bias or residual: 64x128 tile.
#[test]
fn conv_sm90_sigmoid_no_bias_64x128() {
    check(Variant {
        case: "sigmoid_64x128",
        has_bias: false,
        has_residual: false,
        pre_act: "v",
        act: "o2a_sigmoid(v)",
        epilogue: "o2a_sigmoid(v)",
        tile: (64, 128, 64),
        cluster: (1, 1),
        ctas_per_sm: 1,
    });
}

/// relu(conv + bias + residual) on the 128x64 tile sized for two CTAs per SM (the heuristic's
/// tile for 64 output channels): the pipeline and the residual's epilogue buffers fit half an
/// SM's shared memory (the template's static_asserts check it).
#[test]
fn conv_sm90_bias_residual_relu_128x64_two_per_sm() {
    check(Variant {
        case: "bias_residual_relu_128x64_2sm",
        has_bias: true,
        has_residual: true,
        pre_act: "v",
        act: "o2a_relu(v)",
        epilogue: "o2a_relu(v)",
        tile: (128, 64, 64),
        cluster: (1, 1),
        ctas_per_sm: 2,
    });
}
