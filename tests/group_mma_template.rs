//! templates/cuda/kernels/conv2d_group_mma.cu.hbs (grouped convolutions of narrow groups on
//! tensor cores) renders with the fields the lowering gives it (`ops::conv::group_mma_tile` /
//! `group_mma_instance`, so the tile sizes are the ones models get) and compiles warning-free
//! with the pinned nvcc for sm_90a and sm_80, with no register spills and its shared memory
//! within the static 48 KB (ptxas -v). The cases are the grouped 3x3 convs of RegNetY (24
//! channels per group, stride 1 and 2) and ResNeXt-50 (4, two groups at a time, 8 and 16), and
//! odd ones: 8 channels per
//! group, a residual, dilation, a 5x5 filter, maps narrower than a tile. (Wider groups do not
//! fit: 64 per group of a 3x3 filter is 74 KB of weights alone; 32 per group takes CUTLASS's
//! grouped instances.) Compile-only: the GPU check runs the kernel through the model
//! validations (RegNetY-1.6GF, ResNeXt-50) against ONNX Runtime; which convolutions take it, with
//! which weights, is checked by the lowering's tests (src/lower/ops/conv.rs).
//!
//! Without nvcc the test is skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set.

mod common;

use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::ops::conv::{group_mma_instance, group_mma_tile, GroupMmaTile, GROUP_MMA_TEMPLATE};
use onnx2ait::lower::ConvProblem;
use serde_json::Value as Json;

use common::conv_problem as problem;

/// The kernel fields of one grouped node as the lowering writes them (`[K, Kp]` weights).
fn context(name: &str, batch: &str, p: &ConvProblem, tile: &GroupMmaTile) -> Json {
    let instance = group_mma_instance(tile);
    assert_eq!(instance.template, GROUP_MMA_TEMPLATE);
    let p = &tile.kernel_problem(p);
    let cg = p.c / p.group;
    common::conv_kernel_context(name, batch, p, [tile.columns, p.s * cg, cg, 1], instance.context)
}

fn cases() -> Vec<Json> {
    let shapes = [
        problem([56, 56, 48], 48, 2, [3, 3], [1, 1], [1, 1], [1, 1], false), // RegNetY-1.6GF stage 1
        problem([56, 56, 120], 120, 5, [3, 3], [1, 1], [2, 2], [1, 1], false), // stage 2 entry, stride 2
        problem([14, 14, 336], 336, 14, [3, 3], [1, 1], [1, 1], [1, 1], true), // stage 3, + a residual
        problem([7, 7, 888], 888, 37, [3, 3], [1, 1], [1, 1], [1, 1], false), // stage 4: 7-column maps
        problem([28, 28, 256], 256, 32, [3, 3], [1, 1], [1, 1], [1, 1], false), // ResNeXt-50, 8 per group
        problem([28, 28, 512], 512, 32, [3, 3], [1, 1], [2, 2], [1, 1], false), // 16 per group, stride 2
        problem([20, 30, 64], 64, 4, [3, 3], [2, 2], [1, 1], [2, 2], true),  // 16 per group, dilated
        problem([9, 5, 32], 16, 2, [5, 5], [2, 2], [1, 1], [1, 1], false),   // 5x5, Kg 8, narrow map
        problem([56, 56, 128], 128, 32, [3, 3], [1, 1], [2, 2], [1, 1], true), // ResNeXt-50, 4 per group
    ];
    shapes
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let tile = group_mma_tile(p).unwrap_or_else(|| panic!("case {i} takes the grouped kernel: {p:?}"));
            // A run-time batch for half of them.
            let batch = if i % 2 == 0 { "(dims.v[0])" } else { "8" };
            context(&format!("k{i:03}_conv2d_group_mma"), batch, p, &tile)
        })
        .collect()
}

fn compile_all(arch: Arch, tag: &str) {
    let dir = common::cuda_kernel_dir("group_mma", tag, "group_mma_test");
    let sources = common::render_kernels(&dir, "kernels/conv2d_group_mma.cu", &cases());
    common::compile_kernels(arch, "the grouped mma template test", &dir, &sources, "conv2d_group_mma_kernel");
}

compile_tests_for_both_archs!(group_mma_kernels_compile_for_sm90a, group_mma_kernels_compile_for_sm80);

/// The rule of `ops::conv::group_mma_tile` (no nvcc needed): narrow groups with 8-multiple
/// channel counts take 128-pixel tiles over whole k16 steps within 48 KB, groups of 4 and 12
/// two at a time; depthwise, odd, 2-channel and wide (more than 64 filters per group) groups, and
/// ungrouped convolutions, do not.
#[test]
fn group_mma_selection_rule() {
    let regnet = problem([56, 56, 48], 48, 2, [3, 3], [1, 1], [1, 1], [1, 1], false);
    // 3 x 3 x 24 = 216 columns, rounded up to 224 (whole k16 steps).
    assert_eq!(
        group_mma_tile(&regnet),
        Some(GroupMmaTile { tile_p: 8, tile_q: 16, columns: 224, merge: 1, group_block: 1 })
    );
    let strided = problem([56, 56, 120], 120, 5, [3, 3], [1, 1], [2, 2], [1, 1], false);
    let t = group_mma_tile(&strided).expect("stride 2, 24 per group");
    assert!(t.smem_bytes(&strided) <= 48 * 1024, "{t:?}");
    let narrow = problem([7, 7, 888], 888, 37, [3, 3], [1, 1], [1, 1], [1, 1], false);
    assert_eq!(group_mma_tile(&narrow).map(|t| (t.tile_p, t.tile_q)), Some((32, 4)), "7-column maps");
    // 16 per group with a 5x5/2 filter: the 8x16 tile's 19x35 halo is 21 KB of the 48, with
    // 400-column weights; a 4-column tile's 67x11 halo would be 23 KB.
    let wide_halo = problem([56, 56, 64], 64, 4, [5, 5], [2, 2], [2, 2], [1, 1], false);
    let t = group_mma_tile(&wide_halo).expect("16 per group, 5x5/2");
    assert_eq!((t.tile_q, t.columns), (16, 400), "{t:?}");
    assert!(t.smem_bytes(&wide_halo) <= 48 * 1024, "{t:?}");

    let none = |p: ConvProblem, why: &str| assert_eq!(group_mma_tile(&p), None, "{why}");
    none(problem([56, 56, 64], 64, 64, [3, 3], [1, 1], [1, 1], [1, 1], false), "depthwise");
    // Groups of 4 (ResNeXt-50's first stage) and 12 channels: two per kernel group, of 8 and 24.
    let resnext = problem([56, 56, 128], 128, 32, [3, 3], [1, 1], [1, 1], [1, 1], false);
    assert_eq!(
        group_mma_tile(&resnext),
        Some(GroupMmaTile { tile_p: 8, tile_q: 16, columns: 80, merge: 2, group_block: 4 })
    );
    assert_eq!(group_mma_tile(&resnext).map(|t| t.kernel_problem(&resnext).group), Some(16));
    let twelve = problem([56, 56, 96], 96, 8, [3, 3], [1, 1], [1, 1], [1, 1], false);
    assert_eq!(group_mma_tile(&twelve).map(|t| (t.merge, t.columns)), Some((2, 224)));
    none(problem([56, 56, 12], 12, 3, [3, 3], [1, 1], [1, 1], [1, 1], false), "3 groups of 4: no pairs");
    none(problem([56, 56, 64], 64, 32, [3, 3], [1, 1], [1, 1], [1, 1], false), "2 per group: 4 would merge");
    none(problem([56, 56, 64], 128, 64, [3, 3], [1, 1], [1, 1], [1, 1], false), "depthwise, 2 filters each");
    none(problem([56, 56, 256], 256, 2, [3, 3], [1, 1], [1, 1], [1, 1], false), "128 filters per group");
    none(problem([56, 56, 128], 128, 2, [3, 3], [1, 1], [1, 1], [1, 1], false), "64 per group: 74 KB of weights");
    none(problem([56, 56, 64], 64, 1, [3, 3], [1, 1], [1, 1], [1, 1], false), "ungrouped");
    none(problem([56, 56, 128], 128, 2, [11, 11], [5, 5], [4, 4], [1, 1], false), "an 11x11/4 halo of 64 channels");
}
