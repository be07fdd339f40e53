//! templates/cuda/kernels/conv2d_depthwise.cu.hbs renders with the fields the lowering gives it
//! (`ops::conv::depthwise_instance`, so the tile sizes are the ones models get) and compiles
//! warning-free with the pinned nvcc for sm_90a and sm_80, with no register spills and the
//! tiled variant's shared memory within the static 48 KB (ptxas -v). The cases are the
//! EfficientNet / MobileNet layers: 3x3, 5x5 and 7x7 filters at strides 1 and 2, with and
//! without a residual, odd map sizes and channel counts whose slabs are 4, 3 or 1 channel
//! blocks (full and partial last slabs), plus the register variant (a 7x7 map, a 1x1 filter).
//! Compile-only: the GPU check runs the kernels through the model validations (the bundled
//! pattern_depthwise_shapes.onnx and pattern_depthwise_clip.onnx against ONNX Runtime).
//!
//! Without nvcc the test is skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set.

mod common;

use onnx2ait::ir::Dim;
use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::ops::conv::{depthwise_instance, depthwise_slab_blocks, depthwise_tile, depthwise_tile_columns};
use onnx2ait::lower::ConvProblem;
use serde_json::{json, Value as Json};

/// A depthwise problem over an `hw` x `hw` x `c` map with an `rs` x `rs` filter, "same" padding.
fn problem(hw: i64, c: i64, rs: i64, stride: i64, dil: i64, residual: bool) -> ConvProblem {
    let pad = (rs - 1) * dil / 2;
    let out = (hw + 2 * pad - (rs - 1) * dil - 1) / stride + 1;
    ConvProblem {
        n: Dim::known(64),
        h: hw,
        w: hw,
        c,
        k: c,
        r: rs,
        s: rs,
        p: out,
        q: out,
        pads: [pad; 4],
        strides: [stride; 2],
        dilations: [dil; 2],
        group: c,
        bias: true,
        residual,
        pre_act: None,
        act: None,
    }
}

/// The kernel fields of one depthwise node as the CUDA lowering writes them (RSCK weights).
fn context(name: &str, batch: &str, p: &ConvProblem) -> Json {
    let instance = depthwise_instance(p);
    assert_eq!(instance.template, "conv2d_depthwise");
    let mut ctx = json!({
        "name": name, "node": name, "workspace_bytes": 0, "args": [], "n": batch,
        "w_stride_k": 1, "w_stride_c": p.k, "w_stride_s": p.k, "w_stride_r": p.s * p.k,
        "x_index": 0, "w_index": 1, "bias_index": 2, "res_index": if p.residual { 3 } else { -1 },
        "out_index": if p.residual { 4 } else { 3 },
        "has_bias": p.bias, "has_residual": p.residual,
        // ReLU6 before the residual, SiLU after it: both epilogue slots in use.
        "pre_act": "fminf(fmaxf(v, 0.0f), 6.0f)", "act": "v / (1.0f + __expf(-v))",
    });
    let map = ctx.as_object_mut().expect("object");
    for (k, v) in p.geometry_fields() {
        map.insert(k.into(), json!(v));
    }
    for (k, v) in instance.context {
        map.insert(k, v);
    }
    ctx
}

fn cases() -> Vec<(Json, bool)> {
    // (map, channels, filter, stride, dilation, residual)
    let shapes = [
        (112, 32, 3, 1, 1, false), // EfficientNet / MobileNetV2 first block: slabs of 4 blocks
        (112, 96, 3, 2, 1, false), // stride 2, 12 blocks
        (56, 144, 3, 1, 1, true),  // 18 blocks: slabs of 4, the last of 2
        (56, 72, 3, 1, 1, false),  // 9 blocks: slabs of 3, 56 columns in tiles of 14
        (28, 120, 5, 1, 1, true),  // 15 blocks: slabs of 4, the last of 3
        (56, 144, 5, 2, 1, false), // 5x5 stride 2
        (28, 240, 5, 1, 1, true),  // 30 blocks, residual
        (14, 480, 3, 1, 1, true),  // a map narrower than 16 columns
        (14, 672, 5, 2, 1, false), // a 7x7 output: the register variant
        (15, 40, 7, 1, 1, true),   // 7x7, odd map, 5 blocks: slabs of 1 (2 would idle 1 of 6)
        (29, 64, 7, 2, 1, false),  // 7x7 stride 2: the tile shrinks to fit 48 KB
        (23, 24, 3, 1, 2, true),   // dilated 3x3, odd map and channels
        (17, 32, 3, 2, 3, false),  // dilation 3, stride 2
        (20, 16, 1, 1, 1, false),  // 1x1: the register variant
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(hw, c, rs, stride, dil, residual))| {
            let p = problem(hw, c, rs, stride, dil, residual);
            let tiled = depthwise_tile(&p).is_some();
            // A run-time batch for half of them.
            let batch = if i % 2 == 0 { "(dims.v[0])" } else { "64" };
            (context(&format!("k{i:03}_conv2d_depthwise"), batch, &p), tiled)
        })
        .collect()
}

fn compile_all(arch: Arch, tag: &str) {
    let cases = cases();
    let dir = common::cuda_kernel_dir("depthwise", tag, "depthwise_test");
    let contexts: Vec<Json> = cases.iter().map(|(ctx, _)| ctx.clone()).collect();
    let sources = common::render_kernels(&dir, "kernels/conv2d_depthwise.cu", &contexts);
    for ((_, text), (_, tiled)) in sources.iter().zip(&cases) {
        assert_eq!(text.contains("__shared__ uint4 tile"), *tiled, "the variant the lowering chose");
    }
    common::compile_kernels(arch, "the depthwise template test", &dir, &sources, "conv2d_depthwise_kernel");
}

#[test]
fn depthwise_kernels_compile_for_sm90a() {
    compile_all(Arch::Sm90a, "sm90a");
}

#[test]
fn depthwise_kernels_compile_for_sm80() {
    compile_all(Arch::Sm80, "sm80");
}

/// The variant rule of `ops::conv::depthwise_tile` (no nvcc needed): the EfficientNet-B0 and
/// MobileNetV2 layers with maps of 8x8 or more are tiled within 256 threads and 48 KB; 7x7 maps,
/// other filters and strides keep the register kernel.
#[test]
fn depthwise_selection_rule() {
    let tiled = [
        (112, 32, 3, 1),
        (112, 96, 3, 2),
        (56, 144, 3, 1),
        (56, 144, 5, 2),
        (28, 240, 5, 1),
        (28, 240, 3, 2),
        (14, 480, 3, 1),
        (14, 672, 5, 1),
        (28, 192, 3, 1),
        (28, 960, 7, 2),
    ];
    for (hw, c, rs, stride) in tiled {
        let p = problem(hw, c, rs, stride, 1, false);
        let tile = depthwise_tile(&p).unwrap_or_else(|| panic!("{hw}x{hw}x{c} {rs}x{rs}/{stride} is tiled"));
        assert!(tile.threads() <= 256 && tile.threads() >= 64, "{tile:?}: {} threads", tile.threads());
        assert!(tile.smem_bytes(&p) <= 48 * 1024, "{tile:?}: {} bytes", tile.smem_bytes(&p));
        let blocks = c / 8;
        let idle = (blocks + tile.slab_blocks - 1) / tile.slab_blocks * tile.slab_blocks - blocks;
        assert!(idle * 8 <= blocks, "a partial slab idles at most an eighth of the blocks: {tile:?}");
        assert_eq!(tile.tile_p % tile.rows_per_thread, 0);
    }
    // A 7x7 output map (14x14 stride 2, and 7x7 stride 1), a 1x1 filter, stride 3, 3x5.
    for (hw, c, rs, stride) in [(14, 672, 5, 2), (7, 1152, 3, 1), (7, 1152, 5, 1), (20, 16, 1, 1), (30, 32, 3, 3)] {
        assert_eq!(depthwise_tile(&problem(hw, c, rs, stride, 1, false)), None, "{hw}x{hw}x{c} {rs}x{rs}/{stride}");
    }
    // Slabs: contiguous runs of up to 4 blocks; columns: equal tiles where a width of 8..16 makes them.
    let slabs =
        [(1, 1), (2, 2), (3, 3), (4, 4), (5, 1), (9, 3), (12, 4), (15, 4), (18, 4), (23, 4), (25, 4), (30, 4), (84, 4)];
    for (blocks, slab) in slabs {
        assert_eq!(depthwise_slab_blocks(blocks), slab, "{blocks} channel blocks");
    }
    for (q, cols) in [(8, 8), (14, 14), (16, 16), (28, 14), (40, 10), (56, 14), (112, 16), (17, 9), (150, 15)] {
        assert_eq!(depthwise_tile_columns(q), cols, "{q} columns");
    }
    let mut rect = problem(20, 32, 3, 1, 1, false);
    rect.s = 5;
    assert_eq!(depthwise_tile(&rect), None, "3x5 filters keep the register kernel");
}
