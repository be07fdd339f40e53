//! templates/cuda/kernels/conv2d_stem.cu.hbs (the thin-stem convolution on tensor cores) renders
//! with the fields the lowering gives it (`ops::conv::stem_tile` / `stem_instance`, so the tile
//! sizes are the ones models get) and compiles warning-free with the pinned nvcc for sm_90a and
//! sm_80, with no register spills and its shared memory within the static 48 KB (ptxas -v). The
//! cases are the stems of the CNN families (ResNet's 7x7/2 to 64 channels, MobileNet's and
//! EfficientNet's 3x3/2 to 16 or 32) and odd ones: one or four channels, 96 output channels
//! (two channel blocks, the second partial), dilation, asymmetric strides, a residual, maps
//! narrower than a tile. Compile-only: the GPU check runs the kernel through the model
//! validations (ResNet-50, the MobileNets and EfficientNet-B0, and every bundled model with an
//! RGB input convolution) against ONNX Runtime.
//!
//! Without nvcc the test is skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set.

mod common;

use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::ops::conv::{stem_instance, stem_pool_fields, stem_pool_tile, stem_tile, StemTile};
use onnx2ait::lower::ConvProblem;
use serde_json::{json, Value as Json};

/// A convolution of a `c`-channel `h` x `w` map with an `r` x `s` filter to `k` channels.
fn problem(
    hwc: [i64; 3],
    k: i64,
    rs: [i64; 2],
    pads: [i64; 2],
    strides: [i64; 2],
    dilations: [i64; 2],
    residual: bool,
) -> ConvProblem {
    common::conv_problem(hwc, k, 1, rs, pads, strides, dilations, residual)
}

/// The kernel fields of one stem node as the lowering writes them (`[K, Kp]` weights).
fn context(name: &str, batch: &str, p: &ConvProblem, tile: &StemTile) -> Json {
    let instance = stem_instance(tile);
    assert_eq!(instance.template, "conv2d_stem");
    common::conv_kernel_context(name, batch, p, [tile.columns, tile.row_columns, p.c, 1], instance.context)
}

fn cases() -> Vec<Json> {
    let shapes = [
        problem([224, 224, 3], 64, [7, 7], [3, 3], [2, 2], [1, 1], false), // ResNet
        problem([224, 224, 3], 32, [3, 3], [1, 1], [2, 2], [1, 1], false), // MobileNetV2, EfficientNet
        problem([224, 224, 3], 16, [3, 3], [1, 1], [2, 2], [1, 1], true),  // MobileNetV3 (+ a residual)
        problem([33, 45, 1], 96, [5, 3], [2, 0], [1, 2], [2, 1], false),   // gray, dilated, 2 blocks
        problem([12, 9, 4], 8, [3, 3], [1, 1], [1, 1], [1, 1], true),      // RGBA, maps narrower than 16
        problem([7, 6, 2], 24, [2, 2], [0, 0], [1, 1], [1, 1], false),     // 4-column tiles
        problem([56, 56, 3], 16, [3, 3], [1, 1], [1, 1], [1, 1], false),   // stride 1 over RGB: unpaired
    ];
    // The model's NCHW input read directly (the fused layout transform, src/lower/fuse.rs): fp32
    // for ResNet's stem and the unpaired one, fp16 for MobileNet's.
    let nchw = [(0, "float"), (1, "half"), (6, "float")];
    let mut out: Vec<Json> = shapes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tile = stem_tile(p).unwrap_or_else(|| panic!("case {i} takes the stem kernel: {p:?}"));
            // A run-time batch for half of them.
            let batch = if i % 2 == 0 { "(dims.v[0])" } else { "8" };
            context(&format!("k{i:03}_conv2d_stem"), batch, p, &tile)
        })
        .collect();
    for (j, (i, ctype)) in nchw.into_iter().enumerate() {
        let mut c = out[i].clone();
        let name = format!("k{:03}_conv2d_stem", shapes.len() + j);
        let map = c.as_object_mut().expect("object");
        map.insert("name".into(), json!(name));
        map.insert("node".into(), json!(name));
        map.insert("x_nchw".into(), json!(true));
        map.insert("x_ctype".into(), json!(ctype));
        out.push(c);
    }
    // A max pooling fused into the store (src/lower/fuse.rs): ResNet's 3x3/2 after its stem
    // (two passes, the NCHW fp32 input) and a 2x2/2 one without padding after MobileNet's.
    for (i, window, stride, pad) in [(0, 3, 2, 1), (1, 2, 2, 0)] {
        let p = &shapes[i];
        let stem = stem_tile(p).expect("a stem");
        let pooled = [p.p, p.q].map(|x| (x + 2 * pad - window) / stride + 1);
        let tile = stem_pool_tile(p, &stem, [window; 2], [stride; 2], [pad; 2], pooled, 2).expect("the pooling fuses");
        // The one-pass tile the kernel runs on grids of fewer tiles than SMs (both shapes compiled).
        let small_grid = stem_pool_tile(p, &stem, [window; 2], [stride; 2], [pad; 2], pooled, 1);
        let name = format!("k{:03}_conv2d_stem", out.len());
        let mut c = context(&name, "(dims.v[0])", p, &stem);
        let map = c.as_object_mut().expect("object");
        stem_pool_fields(&tile, small_grid.as_ref(), map);
        map.insert("node".into(), json!(name));
        if i == 0 {
            map.insert("x_nchw".into(), json!(true));
            map.insert("x_ctype".into(), json!("float"));
        }
        out.push(c);
    }
    out
}

fn compile_all(arch: Arch, tag: &str) {
    let dir = common::cuda_kernel_dir("stem", tag, "stem_test");
    let sources = common::render_kernels(&dir, "kernels/conv2d_stem.cu", &cases());
    common::compile_kernels(arch, "the stem template test", &dir, &sources, "conv2d_stem_kernel");
}

compile_tests_for_both_archs!(stem_kernels_compile_for_sm90a, stem_kernels_compile_for_sm80);

/// The rule of `ops::conv::stem_tile` (no nvcc needed): the CNN stems take 8x16-pixel tiles of
/// up to 64 channels over whole k16 steps within 48 KB; grouped, wide-input, 1x1, and
/// odd-channel-count convolutions, and filters too large for shared memory, do not.
#[test]
fn stem_selection_rule() {
    let resnet = problem([224, 224, 3], 64, [7, 7], [3, 3], [2, 2], [1, 1], false);
    let tile = stem_tile(&resnet).expect("ResNet's stem");
    // Filter rows of 7x3 = 21 columns and one zero column: 7 x 22 = 154 of 160 columns, read in
    // 4-byte pairs (stride 2: every window starts at an even half).
    assert_eq!(
        tile,
        StemTile { tile_p: 8, tile_q: 16, block_n: 64, columns: 160, row_columns: 22, paired: true, pool: None }
    );
    assert!(tile.smem_bytes(&resnet) <= 48 * 1024);
    let mobilenet = problem([224, 224, 3], 32, [3, 3], [1, 1], [2, 2], [1, 1], false);
    assert_eq!(
        stem_tile(&mobilenet),
        Some(StemTile { tile_p: 8, tile_q: 16, block_n: 32, columns: 32, row_columns: 10, paired: true, pool: None })
    );
    let narrow = problem([12, 9, 4], 8, [3, 3], [1, 1], [1, 1], [1, 1], false);
    assert_eq!(stem_tile(&narrow).map(|t| (t.tile_p, t.tile_q, t.paired)), Some((16, 8, true)));
    let odd_step = problem([56, 56, 3], 16, [3, 3], [1, 1], [1, 1], [1, 1], false);
    assert_eq!(stem_tile(&odd_step).map(|t| (t.row_columns, t.paired)), Some((9, false)), "stride 1 over 3 channels");

    let mut grouped = resnet.clone();
    grouped.group = 3;
    grouped.k = 63;
    assert_eq!(stem_tile(&grouped), None, "grouped");
    let wide = problem([56, 56, 8], 64, [3, 3], [1, 1], [1, 1], [1, 1], false);
    assert_eq!(stem_tile(&wide), None, "8 input channels: the library's implicit GEMM reads them 16 bytes at a time");
    let pointwise = problem([56, 56, 3], 64, [1, 1], [0, 0], [1, 1], [1, 1], false);
    assert_eq!(stem_tile(&pointwise), None, "1x1");
    let odd_k = problem([224, 224, 3], 30, [3, 3], [1, 1], [2, 2], [1, 1], false);
    assert_eq!(stem_tile(&odd_k), None, "K not a multiple of 8");
    let huge = problem([512, 512, 3], 64, [11, 11], [5, 5], [4, 4], [1, 1], false);
    assert_eq!(stem_tile(&huge), None, "11x11/4: 64 rows of 368 columns and a 39x71 input tile exceed 48 KB");
}
