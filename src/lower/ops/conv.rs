//! Lowering of the fused 2-D convolution (kernel-level `Conv2d`):
//! `out = act(pre_act(conv(x, w) + bias) + residual)` on channels-last activations.
//!
//! The family describes the problem ([`ConvProblem`]) and the target picks the kernel: a library
//! instance (CUTLASS on CUDA) or the direct kernel [`DIRECT_TEMPLATE`], which every target
//! provides and which computes any group count, channel count, padding, stride and dilation.
//! A grouped problem is given as it is (C and K over all groups, `group`, KRSC weights
//! `[K,R,S,C/g]`): the CUDA target runs it on its grouped instances where their alignment and
//! group-width rules hold (`cuda::group_conv_fit`), a target without them on the direct kernel.
//! Narrower groups with constant weights run on the target's own tensor-core grouped kernel
//! where it has one ([`GROUP_MMA_TEMPLATE`], [`group_mma_tile`]: groups of 8 to 64 filters over
//! channel counts in multiples of 8, groups of 4 or 12 two at a time with block-diagonal
//! weights), with the weights as `[K, Kp]` (each filter's (r, s, c) elements, zero-padded to
//! whole k16 steps).
//! At fp32 precision (`--precision fp32`) the target is not asked: library instances store fp16,
//! so every convolution runs on the direct kernel with fp32 storage ([`direct_instance`]), and
//! no stem is padded or unfolded by im2col (both only serve the library kernels).
//!
//! - Layout: the kernels compute channels-last: x `[N,H,W,C]`, w KRSC `[K,R,S,C/g]`, out
//!   `[N,P,Q,K]` (`Layout::Nhwc`). The optimiser turns convolutions into NHWC where the layout
//!   transforms pay off across a network; an `Layout::Nchw` one (x `[N,C,H,W]`, w `[K,C/g,R,S]`,
//!   typically an isolated conv, which the cost model prices as the NHWC kernel plus two
//!   transforms) gets exactly that: x (and a residual) transposed to NHWC, constant weights
//!   permuted to KRSC at compile time (run-time weights by a kernel), the NHWC kernel, and the
//!   output transposed back. Transforms over a size-1 channel or spatial extent move no bytes
//!   and are skipped.
//! - Thin stems on the target's own tensor-core kernel ([`STEM_TEMPLATE`]). Where the target has
//!   it (`Target::own_kernel`) and [`stem_tile`] fits the problem (group 1, C ≤ 4, a filter wider
//!   than 1x1, K a multiple of 8, constant weights, fp16), the stem is one kernel: an implicit
//!   GEMM whose patch-matrix operand is gathered from an input tile in shared memory, with the
//!   weights stored as the im2col product's `[K, Kp]` (`{weight}.stem{Kp}`, Kp = R·S·C rounded
//!   up to 16) and the fused epilogue. It replaces the two passes of the im2col form below
//!   (ResNet-50 at batch 256 on an H100: im2col 0.454 ms + product 0.635 ms, 13% of the network,
//!   for a patch matrix of 1 GB written and read back). A max pooling that alone reads the
//!   stem's output fuses into its store after lowering (`fuse.rs`, [`stem_pool_tile`]).
//! - Thin stems: im2col. An implicit-GEMM library convolution reads a thin input (C ≤ 4) a few
//!   channels per access and spends its tensor cores on padded channels: measured on the H200,
//!   ResNet-50's stem (N = 256, 224x224x3 → 112x112x64, 7x7/2, pad 3) took 1.155 ms through
//!   CUTLASS's fixed-channels iterator on a 4-channel padded copy, 13% of the whole network.
//!   When `Target::conv_im2col_columns` answers `Kp` for a group-1 problem with constant weights
//!   (fp16 only), the lowering instead emits an [`IM2COL_TEMPLATE`] kernel that writes the patch
//!   matrix `[N·P·Q, Kp]` (a `[N,P,Q,Kp]` temporary): `cols[m][(r·S + s)·C + c] =
//!   x[n, p·stride_h − pad_t + r·dil_h, q·stride_w − pad_l + s·dil_w, c]`, zero outside the
//!   image and in the columns `R·S·C ≤ col < Kp`; then a 1x1, stride-1, unpadded library
//!   convolution over `Kp` input channels (a GEMM for the target) with the weights flattened to
//!   `[K, R·S·C]` in the same (r, s, c) order and zero-padded to `[K,1,1,Kp]` (a new weight,
//!   `{weight}.im2col{Kp}`), the original bias, residual and activations. Each output is the
//!   same sum of products as the direct definition (zero columns add nothing). The matrix costs
//!   one extra pass over memory (≈1 GB written at batch 256 for Kp = 152), where the product
//!   then runs at the GEMM rate. If the target has no library kernel for the 1x1 problem, the
//!   convolution takes the paths below.
//! - Stem padding: library convolutions want the input channels in multiples of
//!   `Target::conv_channel_multiple` (8 for 16-byte fp16 accesses), which an RGB stem (C = 3)
//!   is not. When the im2col path does not apply (a 1x1 thin convolution, a target that does not
//!   ask for it), the weights are a compile-time constant and the group count is 1, the lowering
//!   pads them with zero input channels (KRSC `[K,R,S,3]` → `[K,R,S,8]`, a new weight), emits a
//!   [`PAD_CHANNELS_TEMPLATE`] kernel that copies x into a zero-filled `[N,H,W,8]` temporary,
//!   and runs the library convolution on that; the zero channels add nothing to any sum, so the
//!   result is exactly the unpadded convolution's. If the target has no library instance for
//!   the padded problem either, the direct kernel runs on the unpadded tensors.
//! - Direct kernel weights: constant weights are stored transposed to RSCK `[R,S,C/g,K]`, so the
//!   output channels a thread computes read contiguous weights; run-time weights are read in
//!   their KRSC layout. The template gets the weights' element strides either way.
//! - Bias `[K]` and residual (the output's shape) are optional; `pre_act`/`act` are rendered by
//!   `act::act_call` as C++ expressions in `v`.

use super::{float_storage_fields, LowerSpec};
use crate::ir::ops::kernel::{Conv2d, Layout};
use crate::ir::{Dim, Node, Tensor};
use crate::lower::{
    ConvProblem, Instance, KernelFacts, LowerCtx, LowerError, LowerResult, Precision, StemFacts, Target, TensorId,
};
use crate::lower_unsupported;
use ndarray::{s, ArrayD, IxDyn};
use serde_json::{json, Map, Value as Json};
use std::borrow::Cow;

pub const OPS: &[LowerSpec] = &[LowerSpec::of::<Conv2d>("Conv2d", lower_conv2d)];

/// The target-neutral direct convolution every target provides.
pub const DIRECT_TEMPLATE: &str = "conv2d_direct";

/// A target's own kernel for depthwise convolutions (group = C = K), with the direct kernel's
/// fields; a target that has none uses the direct kernel.
pub const DEPTHWISE_TEMPLATE: &str = "conv2d_depthwise";

/// Shared memory a tiled depthwise block may use: the static limit of every CUDA device (and
/// within a ROCm workgroup's 64 KB LDS), so no launch needs an opt-in.
pub const DEPTHWISE_TILE_SMEM_BYTES: i64 = 48 * 1024;
/// Threads of a tiled depthwise block at most (the register kernel's block size too).
const DEPTHWISE_BLOCK_THREADS: i64 = 256;

/// A tiled depthwise block's shape (the `tiled` variant of [`DEPTHWISE_TEMPLATE`]): an output
/// tile of `tile_p` x `tile_q` pixels x `slab_blocks` blocks of 8 channels, `rows_per_thread`
/// output rows per thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthwiseTile {
    pub tile_p: i64,
    pub tile_q: i64,
    pub slab_blocks: i64,
    pub rows_per_thread: i64,
}

impl DepthwiseTile {
    /// One thread per (channel block, tile column, row group).
    pub fn threads(&self) -> i64 {
        self.slab_blocks * self.tile_q * (self.tile_p / self.rows_per_thread)
    }

    /// The block's shared memory, as the template declares it: the input tile with its halo
    /// (columns rounded up to a multiple of the column stride for the phase layout) and the
    /// slab's R·S weight vectors, 16 bytes per 8 channels.
    pub fn smem_bytes(&self, p: &ConvProblem) -> i64 {
        let rows = (self.tile_p - 1) * p.strides[0] + (p.r - 1) * p.dilations[0] + 1;
        let cols = (self.tile_q - 1) * p.strides[1] + (p.s - 1) * p.dilations[1] + 1;
        let stored_cols = (cols + p.strides[1] - 1) / p.strides[1] * p.strides[1];
        (rows * stored_cols + p.r * p.s) * self.slab_blocks * 16
    }
}

/// The tile of the tiled depthwise kernel for `p`, or None where the register kernel serves it
/// better. The one selection rule for every target (the kernel assumes no warp size):
/// - tiled: square 3x3, 5x5 or 7x7 filters with equal strides of 1 or 2 (any dilation whose
///   tile fits) on output maps of at least 8x8. These are the MobileNet / EfficientNet layers,
///   where the register kernel reads each input up to R·S times through L1/L2; the tile reads
///   it from global memory once (plus the halo).
/// - register: smaller maps (a 7x7 map fills a fraction of a tile, and the halo of a 5x5 tile
///   over it is 2.5x its outputs: nothing to reuse), other filters and strides, and problems
///   whose smallest tile does not fit [`DEPTHWISE_TILE_SMEM_BYTES`].
///
/// The tile: slabs of up to 4 channel blocks of 8 (see [`depthwise_slab_blocks`]: a staged
/// pixel is one contiguous run of up to 64 bytes), up to 16 output columns (see
/// [`depthwise_tile_columns`]: 28 and 56 columns take tiles of 14, not a last tile of 12 or 8),
/// 4 rows per thread at stride 1 and 2 at stride 2 (the rows a thread reads are shared by its
/// R-row windows: 3x3 stride 1 reads 6 rows for 4 outputs instead of 12), and as many row
/// groups as fill 256 threads, fewer where the map is shorter or the tile would not fit shared
/// memory.
pub fn depthwise_tile(p: &ConvProblem) -> Option<DepthwiseTile> {
    let square = p.r == p.s && matches!(p.r, 3 | 5 | 7);
    let stride = p.strides[0];
    if !square || stride != p.strides[1] || !(1..=2).contains(&stride) || p.p < 8 || p.q < 8 {
        return None;
    }
    if p.dilations.iter().any(|&d| d < 1) || p.c % 8 != 0 {
        return None;
    }
    let slab_blocks = depthwise_slab_blocks(p.c / 8);
    let rows_per_thread = if stride == 1 { 4 } else { 2 };
    let tile_q = depthwise_tile_columns(p.q);
    // Row groups: fill the block, but no taller than the map (rounded up to whole groups).
    let map_groups = (p.p + rows_per_thread - 1) / rows_per_thread;
    let mut groups = (DEPTHWISE_BLOCK_THREADS / (slab_blocks * tile_q)).clamp(1, map_groups);
    loop {
        let tile = DepthwiseTile { tile_p: groups * rows_per_thread, tile_q, slab_blocks, rows_per_thread };
        if tile.smem_bytes(p) <= DEPTHWISE_TILE_SMEM_BYTES {
            return Some(tile);
        }
        if groups == 1 {
            return None;
        }
        groups -= 1;
    }
}

/// Channel blocks (of 8) per slab of the tiled depthwise kernel for `blocks` channel blocks: the
/// largest of 4, 3, 2, 1 whose partial last slab leaves at most an eighth of the blocks idle. A
/// slab is what a staged pixel reads contiguously: one block (16 bytes) of a pixel every C·2
/// bytes half fills each 32-byte sector, and the idle threads of a partial slab cost only
/// arithmetic (C = 72: 3 blocks; C = 120: 4, the last slab of 3).
pub fn depthwise_slab_blocks(blocks: i64) -> i64 {
    [4, 3, 2].into_iter().find(|&b| ((blocks + b - 1) / b * b - blocks) * 8 <= blocks).unwrap_or(1)
}

/// Output columns of a tiled depthwise tile for a map `q` columns wide: the map's width up to 16,
/// else the width from 8 to 16 that wastes the fewest columns in the last tile, the widest of
/// those (112 → 16, 56 → 14, 28 → 14, 40 → 10).
pub fn depthwise_tile_columns(q: i64) -> i64 {
    if q <= 16 {
        return q;
    }
    (8..=16).rev().min_by_key(|t| (q + t - 1) / t * t - q).unwrap_or(16)
}

/// The depthwise kernel's instance (group = C = K, C % 8 == 0) for every target that has it:
/// the tiled variant where [`depthwise_tile`] gives a tile, else the register variant, with
/// several output pixels of a row per thread sharing their input columns and weights (the
/// largest count dividing the row, so no thread idles on a partial group).
pub fn depthwise_instance(p: &ConvProblem) -> Instance {
    let mut context = Map::new();
    match depthwise_tile(p) {
        Some(tile) => {
            context.insert("tiled".into(), json!(true));
            context.insert("block_threads".into(), json!(tile.threads()));
            context.insert("tile_p".into(), json!(tile.tile_p));
            context.insert("tile_q".into(), json!(tile.tile_q));
            context.insert("slab_blocks".into(), json!(tile.slab_blocks));
            context.insert("rows_per_thread".into(), json!(tile.rows_per_thread));
        }
        None => {
            let pixels = [4, 2, 1].into_iter().find(|v| p.q % v == 0).unwrap_or(1);
            context.insert("tiled".into(), json!(false));
            context.insert("block_threads".into(), json!(DEPTHWISE_BLOCK_THREADS));
            context.insert("pixels_per_thread".into(), json!(pixels));
        }
    }
    Instance::own(DEPTHWISE_TEMPLATE, context)
}

/// Whether a kernel is one of our own direct convolutions (the general one or the depthwise
/// one): both read constant weights transposed to RSCK.
pub fn is_direct(template: &str) -> bool {
    template == DIRECT_TEMPLATE || template == DEPTHWISE_TEMPLATE
}
/// A target's own tensor-core kernel for thin stems
/// (`templates/<target>/kernels/conv2d_stem.cu.hbs`), with the direct kernel's fields and the
/// weights as the im2col product's `[K, Kp]`.
pub const STEM_TEMPLATE: &str = "conv2d_stem";
/// Input channels of a thin stem at most (RGB, RGBA, grayscale).
pub const STEM_MAX_CHANNELS: i64 = 4;
/// Shared memory a stem block may use: the static limit of every CUDA device, no opt-in.
const STEM_SMEM_BYTES: i64 = 48 * 1024;
/// Output pixels of a stem tile: 4 warps of two m16 fragments.
const STEM_TILE_PIXELS: i64 = 128;
/// Output channels of a stem block at most: 8 n8 fragments per warp (64 fp32 accumulators per
/// thread for its 32 pixels).
const STEM_MAX_BLOCK_N: i64 = 64;

/// A stem block's shape (see [`STEM_TEMPLATE`]): output tiles of `tile_p` x `tile_q` pixels x
/// `block_n` channels, reduction over `columns` (Kp) patch columns, `row_columns` of them per
/// filter row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StemTile {
    pub tile_p: i64,
    pub tile_q: i64,
    pub block_n: i64,
    pub columns: i64,
    /// Weight columns per filter row: S·C, plus a zero column where `paired` needs even rows.
    pub row_columns: i64,
    /// The kernel reads each pair of patch columns with one 4-byte shared load (see the template):
    /// pairs are neighbours in the staged tile when the dilation along W is 1, and aligned when the
    /// window's step along W (stride · C halves) is even.
    pub paired: bool,
    /// A max pooling over the stem's output fused into its store ([`stem_pool_tile`]): the conv
    /// tile `tile_p` x `tile_q` is then the pooled tile's windows, computed in one or two passes
    /// of 128 pixels.
    pub pool: Option<StemPool>,
}

/// A max pooling the stem kernel applies to its own output tile before storing it (ResNet's
/// 3x3/2 pooling after the 7x7/2 stem): the stem's `P` x `Q` map is never written, only the
/// pooled one. Padding taps (outside the stem's map) are skipped, as ONNX's MaxPool skips them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StemPool {
    /// Window rows and columns.
    pub kernel: [i64; 2],
    pub strides: [i64; 2],
    /// Padding before the first row and column.
    pub pads: [i64; 2],
    /// The pooled map's rows and columns.
    pub out: [i64; 2],
    /// Pooled rows and columns of a block's tile.
    pub tile: [i64; 2],
}

impl StemTile {
    /// Halves per row of the staged input tile: even when `paired`.
    pub fn pitch(&self, p: &ConvProblem) -> i64 {
        let halves = self.in_cols(p) * p.c;
        if self.paired {
            (halves + 1) / 2 * 2
        } else {
            halves
        }
    }

    fn in_rows(&self, p: &ConvProblem) -> i64 {
        (self.tile_p - 1) * p.strides[0] + (p.r - 1) * p.dilations[0] + 1
    }

    fn in_cols(&self, p: &ConvProblem) -> i64 {
        (self.tile_q - 1) * p.strides[1] + (p.s - 1) * p.dilations[1] + 1
    }

    /// Halves of the staged input tile the kernel allocates: its rows, and 8 zeros past the end
    /// (a pair's second half may read one).
    pub fn patch_halves(&self, p: &ConvProblem) -> i64 {
        self.in_rows(p) * self.pitch(p) + 8
    }

    /// Passes of 128 pixels (4 warps of two m16 tiles) over the conv tile: one, or two for a
    /// pooled tile of more than 128 pixels.
    pub fn passes(&self) -> i64 {
        (self.tile_p * self.tile_q + STEM_TILE_PIXELS - 1) / STEM_TILE_PIXELS
    }

    /// The block's shared memory, as the template lays it out: the weight rows (padded by 8
    /// halves), the input tile with its halo (rounded up to 16 bytes), the output tile (a row of
    /// `block_n` + 8 halves for each pixel of every pass), and the column table (ints).
    pub fn smem_bytes(&self, p: &ConvProblem) -> i64 {
        let out_tile = self.passes() * STEM_TILE_PIXELS * (self.block_n + 8);
        let patch = (self.patch_halves(p) + 7) / 8 * 8;
        (self.block_n * (self.columns + 8) + patch + out_tile) * 2 + self.columns * 4
    }
}

/// The stem kernel's tile for `p`, or None where it does not apply: one group, 1 to
/// [`STEM_MAX_CHANNELS`] input channels, a filter wider than 1x1 (a 1x1 thin convolution is a
/// product of rank ≤ 4, no stem), K a multiple of 8 (the epilogue's aligned stores), and a
/// tile that fits the static 48 KB of shared memory. The tile is 8 rows x 16 columns of output
/// pixels (a map narrower than 16 columns takes 8 or 4 columns and more rows, so fewer pixels
/// fall outside it), up to 64 output channels per block.
pub fn stem_tile(p: &ConvProblem) -> Option<StemTile> {
    if p.group != 1 || !(1..=STEM_MAX_CHANNELS).contains(&p.c) || p.r * p.s <= 1 || p.k < 8 || p.k % 8 != 0 {
        return None;
    }
    if p.strides.iter().chain(&p.dilations).any(|&v| v < 1) || p.p < 1 || p.q < 1 {
        return None;
    }
    let tile_q = if p.q >= 16 {
        16
    } else if p.q >= 8 {
        8
    } else {
        4
    };
    let paired = p.dilations[1] == 1 && p.strides[1] * p.c % 2 == 0;
    let row_columns = if paired { (p.s * p.c + 1) / 2 * 2 } else { p.s * p.c };
    let tile = StemTile {
        tile_p: STEM_TILE_PIXELS / tile_q,
        tile_q,
        block_n: p.k.min(STEM_MAX_BLOCK_N),
        columns: (p.r * row_columns + 15) / 16 * 16,
        row_columns,
        paired,
        pool: None,
    };
    (tile.smem_bytes(p) <= STEM_SMEM_BYTES).then_some(tile)
}

/// Shared memory of a stem block with a fused pooling at most: its output tile holds one or two
/// passes of 128 pixels (dynamic shared memory beyond the static 48 KB; the launcher reserves
/// it). 100 KB leaves room for two blocks on an SM of every target with the kernel (sm_80: 164
/// KB, sm_90: 227 KB).
const STEM_POOL_SMEM_BYTES: i64 = 100 * 1024;

/// The stem tile `tile` of `p` with the max pooling (`kernel`, `strides`, `pads` before, no
/// dilation, a pooled map `out`) fused into its store, in at most `max_passes` passes of 128
/// pixels (1 or 2), or None where the fusion does not apply: a residual (the pooled stem has
/// none in the networks that have it), a window that does not fit such a tile, or shared memory
/// beyond `STEM_POOL_SMEM_BYTES` (100 KB). The pooled tile is the one that computes the fewest
/// stem pixels over the whole pooled map (its windows overlap the neighbouring tiles' by
/// `kernel - stride` rows and columns, which both compute): for ResNet's 3x3/2 pooling of the
/// 112x112 stem map to 56x56, 7x8 pooled pixels from 15x17 stem pixels in two passes, 14336
/// stem pixels a map where the unfused stem computes 12544; in one pass, 3x8 pooled pixels from
/// 7x17 stem pixels, 17024 stem pixels in more, smaller blocks (the kernel's choice for grids
/// of fewer two-pass tiles than SMs, see [`stem_pool_fields`]).
pub fn stem_pool_tile(
    p: &ConvProblem,
    tile: &StemTile,
    kernel: [i64; 2],
    strides: [i64; 2],
    pads: [i64; 2],
    out: [i64; 2],
    max_passes: i64,
) -> Option<StemTile> {
    let positive = |a: [i64; 2]| a.iter().all(|&v| v >= 1);
    if p.residual || tile.pool.is_some() || !positive(kernel) || !positive(strides) || !positive(out) {
        return None;
    }
    if pads.iter().zip(&kernel).any(|(&pad, &k)| pad < 0 || pad >= k) {
        return None;
    }
    // Every window must start inside the stem's map (a window wholly in the padding would
    // have no tap).
    if (out[0] - 1) * strides[0] - pads[0] >= p.p || (out[1] - 1) * strides[1] - pads[1] >= p.q {
        return None;
    }
    let mut best: Option<(i64, i64, StemTile)> = None;
    for a in 1..=out[0] {
        for b in 1..=out[1] {
            let (tile_p, tile_q) = ((a - 1) * strides[0] + kernel[0], (b - 1) * strides[1] + kernel[1]);
            // Wider tiles only grow (and so does a taller one's narrowest).
            if tile_p * tile_q > max_passes.clamp(1, 2) * STEM_TILE_PIXELS {
                break;
            }
            let pool = StemPool { kernel, strides, pads, out, tile: [a, b] };
            let t = StemTile { tile_p, tile_q, pool: Some(pool), ..*tile };
            if t.smem_bytes(p) > STEM_POOL_SMEM_BYTES {
                continue;
            }
            let tiles = ((out[0] + a - 1) / a) * ((out[1] + b - 1) / b);
            let rows = tiles * t.passes() * STEM_TILE_PIXELS;
            // Fewest stem pixels computed; then the larger tile (fewer blocks' weight loads).
            if best.as_ref().is_none_or(|&(r, pixels, _)| rows < r || rows == r && a * b > pixels) {
                best = Some((rows, a * b, t));
            }
        }
    }
    best.map(|(_, _, t)| t)
}

/// The stem kernel's instance for `tile`.
pub fn stem_instance(tile: &StemTile) -> Instance {
    let mut context = Map::new();
    context.insert("tile_p".into(), json!(tile.tile_p));
    context.insert("tile_q".into(), json!(tile.tile_q));
    context.insert("block_n".into(), json!(tile.block_n));
    context.insert("row_columns".into(), json!(tile.row_columns));
    context.insert("paired".into(), json!(tile.paired));
    // The input as the lowering gives it, fp16 NHWC; the fusion pass (`fuse.rs`) may switch the
    // kernel to the NCHW tensor the layout transform read (`KernelFacts::StemConv`).
    context.insert("x_nchw".into(), json!(false));
    context.insert("x_ctype".into(), json!("half"));
    Instance::own(STEM_TEMPLATE, context)
}

/// The template fields of a stem kernel with a fused pooling (`tile` from [`stem_pool_tile`]),
/// over those of [`stem_instance`]: the conv tile under the pooled tile's windows, and the
/// pooling. Nothing for a tile without one. With `small_grid`, a one-pass tile of the same
/// pooling, the kernel also gets that tile, which it runs where the grid of `tile` has fewer
/// tiles than the GPU has SMs (on an H200, ResNet-50's batch 1: 0.013 ms against 0.017 for the
/// two-pass tile's 56 blocks).
pub fn stem_pool_fields(tile: &StemTile, small_grid: Option<&StemTile>, c: &mut Map<String, Json>) {
    let Some(sp) = tile.pool else { return };
    let small = small_grid.filter(|t| t.passes() == 1 && tile.passes() > 1);
    if let Some((small, ssp)) = small.and_then(|t| t.pool.map(|pool| (t, pool))) {
        c.insert("small_grid".into(), json!(true));
        for (key, v) in [
            ("small_tile_p", small.tile_p),
            ("small_tile_q", small.tile_q),
            ("small_pool_tile_p", ssp.tile[0]),
            ("small_pool_tile_q", ssp.tile[1]),
        ] {
            c.insert(key.into(), json!(v));
        }
    }
    c.insert("tile_p".into(), json!(tile.tile_p));
    c.insert("tile_q".into(), json!(tile.tile_q));
    c.insert("pool".into(), json!(true));
    for (key, v) in [
        ("pool_kernel_h", sp.kernel[0]),
        ("pool_kernel_w", sp.kernel[1]),
        ("pool_stride_h", sp.strides[0]),
        ("pool_stride_w", sp.strides[1]),
        ("pool_pad_h", sp.pads[0]),
        ("pool_pad_w", sp.pads[1]),
        ("pool_p", sp.out[0]),
        ("pool_q", sp.out[1]),
        ("pool_tile_p", sp.tile[0]),
        ("pool_tile_q", sp.tile[1]),
    ] {
        c.insert(key.into(), json!(v));
    }
}

/// The stem kernel's `[K, 1, 1, Kp]` weights: [`patch_weights`] with the tile's filter-row
/// length (a filter row's spare column stays zero).
fn stem_weights(w: &Tensor, tile: &StemTile) -> LowerResult<Tensor> {
    patch_weights(w, Some(tile.row_columns), tile.columns)
}

/// `[K, 1, 1, columns]` weights: row k holds filter k's (r, s, c) elements, filter row r from
/// column r·row (`row` S·C when None: the filter flattened), zero elsewhere.
fn patch_weights(w: &Tensor, row: Option<i64>, columns: i64) -> LowerResult<Tensor> {
    let a = w.to_f32();
    let &[k, r, s_, c] = a.shape() else {
        return Err(LowerError::Invalid(format!("convolution weights must be rank 4, found {:?}", a.shape())));
    };
    let sc = s_ * c;
    let row_len = row.map_or(Some(sc), |v| usize::try_from(v).ok()).unwrap_or(0);
    let kp = usize::try_from(columns).unwrap_or(0);
    if row_len < sc || kp < r * row_len {
        return Err(LowerError::Invalid(format!(
            "{columns} patch columns ({row_len} per filter row) cannot hold {r}x{s_}x{c} filters"
        )));
    }
    let mut out = ArrayD::<f32>::zeros(IxDyn(&[k, 1, 1, kp]));
    for ri in 0..r {
        let flat = a
            .slice(s![.., ri, .., ..])
            .as_standard_layout()
            .into_shape_with_order((k, sc))
            .map_err(|e| LowerError::Invalid(format!("flattening the convolution weights: {e}")))?
            .into_owned();
        out.slice_mut(s![.., 0, 0, ri * row_len..ri * row_len + sc]).assign(&flat);
    }
    Ok(Tensor::F32(out))
}

/// A target's own tensor-core kernel for grouped convolutions of narrow groups
/// (`templates/<target>/kernels/conv2d_group_mma.cu.hbs`): the stem kernel's implicit GEMM per
/// group, with the weights as `[K, Kp]` (each filter's (r, s, c) elements, zero-padded). Its
/// block is the stem's: 128 pixels, up to 64 filters (one kernel group's), within the 48 KB of
/// static shared memory.
pub const GROUP_MMA_TEMPLATE: &str = "conv2d_group_mma";

/// Groups the grouped kernel merges into one at most: two groups of 4 channels become one of 8
/// (ResNeXt-50's first stage), at twice the tensor-core work.
const GROUP_MMA_MAX_MERGE: i64 = 2;

/// A grouped block's shape (see [`GROUP_MMA_TEMPLATE`]): output tiles of `tile_p` x `tile_q`
/// pixels x one kernel group's output channels, reduction over `columns` (Kp) patch columns. The
/// kernel's groups are `merge` consecutive groups of the convolution each: groups of Cg and Kg
/// channels too narrow for the kernel's 16-byte accesses (4 and 4) are computed as groups of
/// merge·Cg and merge·Kg with block-diagonal weights (zero where a filter's group does not read
/// the channel), which adds only zero products. A block computes `group_block` consecutive
/// kernel groups of its pixel tile, so it reads and writes runs of group_block·Cg' channels of
/// each pixel rather than a group's 16-48 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupMmaTile {
    pub tile_p: i64,
    pub tile_q: i64,
    pub columns: i64,
    pub merge: i64,
    pub group_block: i64,
}

impl GroupMmaTile {
    /// The problem the kernel computes: `p` with every `merge` groups as one.
    pub fn kernel_problem(&self, p: &ConvProblem) -> ConvProblem {
        ConvProblem { group: p.group / self.merge, ..p.clone() }
    }

    /// A staged input pixel, in halves (the template's PP): the group block's channels, padded by
    /// 8 where they are 32 or 64 (4 or 8 16-byte units: 8 pixels that far apart would share
    /// banks in one ldmatrix).
    pub fn pixel_halves(&self, p: &ConvProblem) -> i64 {
        let cb = p.c / (p.group / self.merge) * self.group_block;
        if (cb / 8) % 2 == 0 && cb >= 32 {
            cb + 8
        } else {
            cb
        }
    }

    /// The block's shared memory, as the template declares it: the group block's weight rows
    /// (padded by 8 halves), its channels of the input tile with its halo (`pixel_halves` a
    /// pixel), the output tile (rows padded by 8 halves), and the column table (ints).
    pub fn smem_bytes(&self, p: &ConvProblem) -> i64 {
        let kb = p.k / (p.group / self.merge) * self.group_block;
        let pixel = self.pixel_halves(p);
        let in_rows = (self.tile_p - 1) * p.strides[0] + (p.r - 1) * p.dilations[0] + 1;
        let in_cols = (self.tile_q - 1) * p.strides[1] + (p.s - 1) * p.dilations[1] + 1;
        let patch = in_rows * in_cols * pixel;
        (kb * (self.columns + 8) + patch + STEM_TILE_PIXELS * (kb + 8)) * 2 + self.columns * 4
    }
}

/// The grouped kernel's tile for `p`, or None where it does not apply: more than one group;
/// the kernel's groups (`merge` groups of `p` each, the fewest up to 2
/// that make them fit) of Cg' input channels, a multiple of 8 (16-byte staging loads; even, so
/// the A fragments' channel pairs never straddle two filter taps), and Kg' filters, a multiple
/// of 8 up to 64 (n8 fragments, 16-byte stores); and a tile of 128 output
/// pixels that fits the static 48 KB of shared memory: 8 x 16 pixels, or 16 x 8 / 32 x 4 for
/// narrow maps (fewer pixels fall outside), then the other shapes where the halo of a strided
/// 16-column tile is too large. Depthwise convolutions (Cg = 1) have their own kernel.
pub fn group_mma_tile(p: &ConvProblem) -> Option<GroupMmaTile> {
    let g = p.group;
    if g < 2 || p.c % g != 0 || p.k % g != 0 || p.c == g {
        return None;
    }
    if p.strides.iter().chain(&p.dilations).any(|&v| v < 1) || p.p < 1 || p.q < 1 || p.r < 1 || p.s < 1 {
        return None;
    }
    let (cg, kg) = (p.c / g, p.k / g);
    (1..=GROUP_MMA_MAX_MERGE)
        .filter(|&m| g % m == 0 && (m * cg) % 8 == 0 && (m * kg) % 8 == 0 && m * kg <= STEM_MAX_BLOCK_N)
        .find_map(|merge| group_mma_tile_of(p, merge))
}

/// Channels a grouped block reads per pixel at most: a 128-byte line of fp16.
const GROUP_MMA_BLOCK_CHANNELS: i64 = 64;

/// The tile for `p` with `merge` groups per kernel group, if one fits shared memory: the most
/// kernel groups per block (a divisor of their count) whose channels fit a 128-byte line, fewer
/// where no tile shape fits; for them the first shape of the preference order that fits. On an
/// H100 at batch 256, ResNeXt-50's first-stage conv (16 kernel groups of 8) took 0.560, 0.285
/// and 0.215 ms with 1, 2 and 4 groups per block (a one-off build of each, 2026-12-07).
fn group_mma_tile_of(p: &ConvProblem, merge: i64) -> Option<GroupMmaTile> {
    let groups = p.group / merge;
    let cg = p.c / p.group * merge;
    let mut group_blocks: Vec<i64> =
        (1..=groups).filter(|&b| groups % b == 0 && b * cg <= GROUP_MMA_BLOCK_CHANNELS.max(cg)).collect();
    group_blocks.reverse();
    let columns = (p.r * p.s * cg + 15) / 16 * 16;
    let preferred: i64 = if p.q >= 16 {
        16
    } else if p.q >= 8 {
        8
    } else {
        4
    };
    let shapes = std::iter::once(preferred).chain([16, 8, 4].into_iter().filter(|&q| q != preferred));
    group_blocks
        .into_iter()
        .flat_map(|group_block| {
            shapes.clone().map(move |tile_q| GroupMmaTile {
                tile_p: STEM_TILE_PIXELS / tile_q,
                tile_q,
                columns,
                merge,
                group_block,
            })
        })
        .find(|t| t.smem_bytes(p) <= STEM_SMEM_BYTES)
}

/// The grouped kernel's instance for `tile`.
pub fn group_mma_instance(tile: &GroupMmaTile) -> Instance {
    let mut context = Map::new();
    context.insert("tile_p".into(), json!(tile.tile_p));
    context.insert("tile_q".into(), json!(tile.tile_q));
    context.insert("group_block".into(), json!(tile.group_block));
    Instance::own(GROUP_MMA_TEMPLATE, context)
}

/// KRSC weights `[K, R, S, Cg]` of `groups` groups as those of `groups / merge` groups
/// `[K, R, S, merge·Cg]`: filter k (of group g = k / Kg) reads its original channels at
/// positions (g mod merge)·Cg.. of its merged group's channels, and zero weights at the others.
pub fn merge_group_weights(w: &Tensor, groups: usize, merge: usize) -> LowerResult<Tensor> {
    let a = w.to_f32();
    let &[k, r, s_, cg] = a.shape() else {
        return Err(LowerError::Invalid(format!("convolution weights must be rank 4, found {:?}", a.shape())));
    };
    if merge == 0 || groups == 0 || groups % merge != 0 || k % groups != 0 {
        return Err(LowerError::Invalid(format!(
            "{k} filters in {groups} groups cannot be merged {merge} groups at a time"
        )));
    }
    let kg = k / groups;
    let mut out = ArrayD::<f32>::zeros(IxDyn(&[k, r, s_, cg * merge]));
    for f in 0..k {
        let at = (f / kg) % merge * cg;
        out.slice_mut(s![f, .., .., at..at + cg]).assign(&a.slice(s![f, .., .., ..]));
    }
    Ok(Tensor::F32(out))
}

/// Zero-pads the channel dim of a channels-last tensor.
pub const PAD_CHANNELS_TEMPLATE: &str = "pad_channels";
/// Writes the patch matrix of a thin stem (explicit im2col).
pub const IM2COL_TEMPLATE: &str = "im2col";

pub(crate) use crate::lower::choice::act_expr;

/// A dim that kernels need as a compile-time constant.
fn known(d: &Dim, what: &str) -> LowerResult<i64> {
    d.as_known().ok_or_else(|| {
        LowerError::Unsupported(format!("the {what} ({d}) must be known at compile time for a convolution kernel"))
    })
}

/// The graph shape of node input `i` (without packing a constant into the weights blob).
fn input_shape(cx: &LowerCtx, node: &Node, i: usize) -> LowerResult<Vec<Dim>> {
    let v =
        node.inputs.get(i).copied().flatten().ok_or_else(|| LowerError::Invalid(format!("input {i} is missing")))?;
    let val = cx.graph.value(v);
    let ty =
        val.ty.as_ref().ok_or_else(|| LowerError::Invalid(format!("value '{}' has no inferred type", val.name)))?;
    Ok(ty.shape.clone())
}

/// The graph name of node input `i`, for naming derived weights.
fn input_name(cx: &LowerCtx, node: &Node, i: usize) -> String {
    match node.inputs.get(i).copied().flatten() {
        Some(v) => cx.graph.value(v).name.clone(),
        None => format!("{}.input{i}", node.name),
    }
}

/// Every tensor of a convolution has the device's float type (fp16, or fp32 at fp32 precision).
fn ensure_float(cx: &LowerCtx, t: TensorId, what: &str) -> LowerResult<()> {
    let (dt, want) = (cx.dtype(t), cx.float_dtype());
    if dt != want {
        lower_unsupported!("convolution {what} is {dt} on the device; the kernels compute on {want} tensors");
    }
    Ok(())
}

/// The direct kernel's instance when the lowering chooses it itself (fp32 precision): a thread
/// computes up to 8 consecutive output channels of one pixel, within one group (the CUDA target
/// chooses its direct convolutions with the same rule).
pub fn direct_instance(p: &ConvProblem) -> Instance {
    let kg = if p.group > 0 { p.k / p.group } else { p.k };
    let k_per_thread = [8, 4, 2, 1].into_iter().find(|v| kg % v == 0).unwrap_or(1);
    let mut context = Map::new();
    context.insert("k_per_thread".into(), json!(k_per_thread));
    context.insert("block_threads".into(), json!(256));
    Instance::own(DIRECT_TEMPLATE, context)
}

/// The kernel of a convolution problem: the target's choice at fp16 precision, the direct
/// kernel at fp32 (no library instance stores fp32).
fn conv_instance(cx: &LowerCtx, p: &ConvProblem) -> Instance {
    match cx.precision() {
        Precision::Fp16 => cx.target.conv2d(p),
        Precision::Fp32 => direct_instance(p),
    }
}

/// KRSC weights `[K,R,S,C]` with zero input channels appended up to `c_padded`.
fn pad_weight_channels(w: &Tensor, c_padded: usize) -> LowerResult<Tensor> {
    let a = w.to_f32();
    let &[k, r, s_, c] = a.shape() else {
        return Err(LowerError::Invalid(format!("convolution weights must be rank 4, found {:?}", a.shape())));
    };
    let mut out = ArrayD::<f32>::zeros(IxDyn(&[k, r, s_, c_padded]));
    out.slice_mut(s![.., .., .., ..c]).assign(&a);
    Ok(Tensor::F32(out))
}

/// The library problem of convolution `p` lowered as an explicit im2col with `columns` (Kp)
/// columns: each output pixel's patch is one row of the product, so it is a 1x1, stride-1,
/// unpadded convolution of the `[N, P, Q, Kp]` patch matrix with `p`'s output, bias, residual
/// and activations.
pub fn im2col_product(p: &ConvProblem, columns: i64) -> ConvProblem {
    ConvProblem {
        h: p.p,
        w: p.q,
        c: columns,
        r: 1,
        s: 1,
        pads: [0; 4],
        strides: [1, 1],
        dilations: [1, 1],
        group: 1,
        ..p.clone()
    }
}

/// How the lowering hands convolution `p` to the target's library at fp16.
#[derive(Clone, Debug)]
pub enum LibraryForm {
    /// No library: the target's own tensor-core stem kernel ([`STEM_TEMPLATE`]) with this tile.
    Stem(StemTile),
    /// No library: the target's own tensor-core grouped kernel ([`GROUP_MMA_TEMPLATE`]) with this
    /// tile, for narrow groups its library does not take.
    GroupMma(GroupMmaTile),
    /// An explicit im2col with `columns` (Kp) columns, then `problem`, the 1x1 product.
    Im2col { columns: i64, problem: ConvProblem },
    /// A thin stem's input copied into a zero-padded `problem.c`-channel temporary.
    Padded(ConvProblem),
    /// `p` as it is.
    AsIs,
}

/// The one rule, shared by the lowering and the optimiser's measured cost model
/// (`profile::cost`), for how convolution `p` (fp16 tensors) reaches the target: with constant
/// weights and several groups that the target's library leaves to the direct kernel, the
/// grouped tensor-core kernel where the target has it and [`group_mma_tile`] fits; with constant
/// weights and one group, the stem kernel where the target has it and [`stem_tile`] fits, else
/// the im2col form when the target asks for it
/// (`Target::conv_im2col_columns`) and has a library kernel for the 1x1 product, else the padded
/// form when the target wants more channels (`Target::conv_padded_channels`) and has a library
/// kernel for the padded problem; otherwise `p` as it is.
pub fn library_form(target: &dyn Target, p: &ConvProblem, constant_weights: bool) -> LowerResult<LibraryForm> {
    if constant_weights && p.group > 1 && target.own_kernel(GROUP_MMA_TEMPLATE).is_ok() {
        if let Some(tile) = group_mma_tile(p) {
            if is_direct(&target.conv2d(p).template) {
                return Ok(LibraryForm::GroupMma(tile));
            }
        }
    }
    if !constant_weights || p.group != 1 {
        return Ok(LibraryForm::AsIs);
    }
    if target.own_kernel(STEM_TEMPLATE).is_ok() {
        if let Some(tile) = stem_tile(p) {
            return Ok(LibraryForm::Stem(tile));
        }
    }
    if let Some(columns) = target.conv_im2col_columns(p) {
        let rsc = p.r * p.s * p.c;
        if columns % 8 != 0 || columns < rsc {
            return Err(LowerError::Invalid(format!(
                "the target asked for {columns} im2col columns for a {}x{}x{} filter: they must be a multiple of 8 \
                 covering the {rsc} filter elements",
                p.r, p.s, p.c
            )));
        }
        let problem = im2col_product(p, columns);
        if !is_direct(&target.conv2d(&problem).template) {
            return Ok(LibraryForm::Im2col { columns, problem });
        }
    }
    let padded_c = target.conv_padded_channels(p.c as usize) as i64;
    if padded_c != p.c {
        let padded = ConvProblem { c: padded_c, ..p.clone() };
        if !is_direct(&target.conv2d(&padded).template) {
            return Ok(LibraryForm::Padded(padded));
        }
    }
    Ok(LibraryForm::AsIs)
}

/// KRSC weights `[K,R,S,C]` as the im2col product's `[K,1,1,Kp]`: each filter flattened in
/// (r, s, c) order — the patch matrix's column order — and zero-padded to `columns`.
fn im2col_weights(w: &Tensor, columns: i64) -> LowerResult<Tensor> {
    patch_weights(w, None, columns)
}

/// Emits the [`IM2COL_TEMPLATE`] kernel writing the patch matrix of `p` over the NHWC tensor `x`
/// into a new `[N, P, Q, columns]` temporary, which it returns.
fn emit_im2col(cx: &mut LowerCtx, node: &Node, p: &ConvProblem, columns: i64, x: TensorId) -> LowerResult<TensorId> {
    let d = Dim::known;
    let shape = vec![p.n.clone(), d(p.p), d(p.q), d(columns)];
    let cols = cx.temp(&format!("{}.im2col{columns}", cx.tensor(x).name), cx.dtype(x), shape);
    let mut c = Map::new();
    c.insert("n".into(), json!(cx.expr(&p.n)?));
    for (key, v) in p.geometry_fields() {
        if key != "k" {
            c.insert(key.into(), json!(v));
        }
    }
    c.insert("kp".into(), json!(columns));
    c.insert("x_index".into(), json!(0));
    c.insert("out_index".into(), json!(1));
    cx.emit(&node.name, IM2COL_TEMPLATE, vec![x, cols], vec![1], c, 0)?;
    Ok(cols)
}

/// The convolution problem of a kernel-level `Conv2d` with input, weights and output shapes
/// `xs`, `ws`, `os` (in the node's layout): what the lowering gives the target, and what the
/// measured cost model (`profile::cost`) prices.
pub(crate) fn conv_problem_of(
    op: &Conv2d,
    xs: &[Dim],
    ws: &[Dim],
    os: &[Dim],
    bias: bool,
    residual: bool,
) -> LowerResult<ConvProblem> {
    if xs.len() != 4 || ws.len() != 4 || os.len() != 4 {
        return Err(LowerError::Invalid(format!(
            "Conv2d needs rank-4 input, weights and output, found ranks {}, {} and {}",
            xs.len(),
            ws.len(),
            os.len()
        )));
    }
    // Axis positions of (H, W, C) in x, (K, R, S, Cg) in w and (P, Q) in the output.
    let ([ih, iw, ic], [wk, wr, wsx, wc], [op_, oq]) =
        if op.layout == Layout::Nchw { ([2, 3, 1], [0, 2, 3, 1], [2, 3]) } else { ([1, 2, 3], [0, 1, 2, 3], [1, 2]) };
    let (h, w, c) =
        (known(&xs[ih], "input height")?, known(&xs[iw], "input width")?, known(&xs[ic], "input channel count")?);
    let (k, r, s, cg) = (
        known(&ws[wk], "output channel count")?,
        known(&ws[wr], "filter height")?,
        known(&ws[wsx], "filter width")?,
        known(&ws[wc], "channels per group")?,
    );
    let (p, q) = (known(&os[op_], "output height")?, known(&os[oq], "output width")?);
    let geom = &op.geom;
    let group = geom.group as i64;
    if group < 1 || cg * group != c || k % group != 0 {
        return Err(LowerError::Invalid(format!(
            "weights with {k} filters of {r}x{s}x{cg} do not fit {c} input channels in {group} groups"
        )));
    }
    let i = |v: usize| v as i64;
    Ok(ConvProblem {
        n: xs[0].clone(),
        h,
        w,
        c,
        k,
        r,
        s,
        p,
        q,
        pads: geom.pads.map(i),
        strides: geom.strides.map(i),
        dilations: geom.dilations.map(i),
        group,
        bias,
        residual,
        pre_act: op.pre_act,
        act: op.act,
    })
}

/// The lowering of a kernel-level `Conv2d` node.
fn lower_conv2d(cx: &mut LowerCtx, node: &Node) -> LowerResult<()> {
    let op = node
        .op
        .downcast_ref::<Conv2d>()
        .ok_or_else(|| LowerError::Invalid("the node is not a kernel-level Conv2d".into()))?;
    let nchw = op.layout == Layout::Nchw;
    let x_in = cx.input(node, 0)?;
    ensure_float(cx, x_in, "input")?;
    let fdt = cx.float_dtype();
    let xs = cx.shape(x_in).to_vec();
    let ws = input_shape(cx, node, 1)?;
    let out_shape = {
        let v = *node.outputs.first().ok_or_else(|| LowerError::Invalid("output 0 is missing".into()))?;
        let val = cx.graph.value(v);
        val.ty
            .as_ref()
            .ok_or_else(|| LowerError::Invalid(format!("value '{}' has no inferred type", val.name)))?
            .shape
            .clone()
    };
    let problem = conv_problem_of(
        op,
        &xs,
        &ws,
        &out_shape,
        node.inputs.get(2).copied().flatten().is_some(),
        node.inputs.get(3).copied().flatten().is_some(),
    )?;
    let ConvProblem { ref n, h, w, c, k, r, s: s_, p, q, group, .. } = problem;
    // The model's problem, before any padding the library form adds.
    let flops = problem.flops();
    let (n, cg) = (n.clone(), c / group);
    let d = Dim::known;
    let nhwc_in = vec![n.clone(), d(h), d(w), d(c)];
    let nhwc_out = vec![n.clone(), d(p), d(q), d(k)];

    // NCHW: the kernels run channels-last between layout transforms (the optimiser's cost model
    // prices an NCHW convolution exactly so). A transform over a size-1 channel or spatial extent
    // moves no bytes and is skipped.
    let x = if nchw && c > 1 && h * w > 1 {
        let t = cx.temp(&format!("{}.nhwc", cx.tensor(x_in).name), fdt, nhwc_in.clone());
        emit_matrix_transpose(cx, node, x_in, t, &n, c, h * w)?;
        t
    } else {
        x_in
    };
    // Weights as KRSC: constants are permuted at compile time, run-time weights by a kernel.
    let w_const: Option<Cow<Tensor>> =
        cx.konst(node, 1).map(|t| if nchw { Cow::Owned(permute(t, &[0, 2, 3, 1])) } else { Cow::Borrowed(t) });
    let w_runtime = match w_const {
        Some(_) => None,
        None => {
            let w_in = cx.input(node, 1)?;
            ensure_float(cx, w_in, "weights")?;
            Some(if nchw && cg > 1 && r * s_ > 1 {
                let t = cx.temp(&format!("{}.krsc", cx.tensor(w_in).name), fdt, vec![d(k), d(r), d(s_), d(cg)]);
                emit_matrix_transpose(cx, node, w_in, t, &d(k), cg, r * s_)?;
                t
            } else {
                w_in
            })
        }
    };
    let bias = cx.opt_input(node, 2)?;
    if let Some(b) = bias {
        ensure_float(cx, b, "bias")?;
    }
    let out_moves = nchw && k > 1 && p * q > 1;
    let res = match cx.opt_input(node, 3)? {
        Some(r_in) if out_moves => {
            ensure_float(cx, r_in, "residual")?;
            let t = cx.temp(&format!("{}.nhwc", cx.tensor(r_in).name), fdt, nhwc_out.clone());
            emit_matrix_transpose(cx, node, r_in, t, &n, k, p * q)?;
            Some(t)
        }
        other => other,
    };
    if let Some(r) = res {
        ensure_float(cx, r, "residual")?;
    }

    // The kernel and the tensors it reads, then the output.
    let fp16 = cx.precision() == Precision::Fp16;
    // A thin stem: an explicit im2col and a 1x1 convolution, or its channels padded up to the
    // library's multiple (fp16 only: at fp32 no library instance runs, and the direct kernel takes
    // any C). Constant weights only: they are reshaped or padded at compile time.
    let form = if fp16 { library_form(cx.target, &problem, w_const.is_some())? } else { LibraryForm::AsIs };
    let (p_final, inst, x_k, w_k, w_layout) = match (&w_const, form) {
        (Some(wk), LibraryForm::Stem(tile)) => {
            let kp = tile.columns;
            let wt = cx.add_weight(&format!("{}.stem{kp}", input_name(cx, node, 1)), &stem_weights(wk, &tile)?)?;
            (problem, stem_instance(&tile), x, wt, WeightLayout::Patch { columns: kp, row: tile.row_columns })
        }
        (Some(wk), LibraryForm::GroupMma(tile)) => {
            let kp = tile.columns;
            let merged = tile.kernel_problem(&problem);
            let wm = if tile.merge > 1 {
                Cow::Owned(merge_group_weights(wk, group as usize, tile.merge as usize)?)
            } else {
                Cow::Borrowed(wk.as_ref())
            };
            let name = format!("{}.patch{kp}", input_name(cx, node, 1));
            let wt = cx.add_weight(&name, &patch_weights(&wm, None, kp)?)?;
            let row = s_ * cg * tile.merge;
            (merged, group_mma_instance(&tile), x, wt, WeightLayout::Patch { columns: kp, row })
        }
        (Some(wk), LibraryForm::Im2col { columns, problem: product }) => {
            let wt =
                cx.add_weight(&format!("{}.im2col{columns}", input_name(cx, node, 1)), &im2col_weights(wk, columns)?)?;
            let cols = emit_im2col(cx, node, &problem, columns, x)?;
            let inst = conv_instance(cx, &product);
            (product, inst, cols, wt, WeightLayout::Krsc)
        }
        (Some(wk), LibraryForm::Padded(padded)) => {
            let inst = conv_instance(cx, &padded);
            let cp = padded.c;
            let wt =
                cx.add_weight(&format!("{}.pad{cp}", input_name(cx, node, 1)), &pad_weight_channels(wk, cp as usize)?)?;
            let mut xs_padded = nhwc_in.clone();
            xs_padded[3] = d(cp);
            let x_padded = cx.temp(&format!("{}.pad{cp}", cx.tensor(x).name), fdt, xs_padded);
            emit_pad_channels(cx, node, x, x_padded, &nhwc_in[..3], c, cp)?;
            (padded, inst, x_padded, wt, WeightLayout::Krsc)
        }
        (Some(wk), _) => {
            let inst = conv_instance(cx, &problem);
            if is_direct(&inst.template) {
                let wt = cx.add_weight(&format!("{}.rsck", input_name(cx, node, 1)), &permute(wk, &[1, 2, 3, 0]))?;
                (problem, inst, x, wt, WeightLayout::Rsck)
            } else {
                let name = if nchw { format!("{}.krsc", input_name(cx, node, 1)) } else { input_name(cx, node, 1) };
                let wt = if nchw { cx.add_weight(&name, wk)? } else { cx.input(node, 1)? };
                (problem, inst, x, wt, WeightLayout::Krsc)
            }
        }
        (None, _) => {
            let inst = conv_instance(cx, &problem);
            let wt = w_runtime.ok_or_else(|| LowerError::Invalid("convolution weights are missing".into()))?;
            (problem, inst, x, wt, WeightLayout::Krsc)
        }
    };
    if out_moves {
        let out_nhwc = cx.temp(&format!("{}.nhwc", node.name), fdt, nhwc_out);
        emit_conv(cx, node, &p_final, inst, [x_k, w_k], w_layout, bias, res, out_nhwc)?;
        cx.set_flops(&flops)?;
        let out = cx.output(node, 0)?;
        ensure_float(cx, out, "output")?;
        emit_matrix_transpose(cx, node, out_nhwc, out, &n, p * q, k)
    } else {
        let out = cx.output(node, 0)?;
        ensure_float(cx, out, "output")?;
        emit_conv(cx, node, &p_final, inst, [x_k, w_k], w_layout, bias, res, out)?;
        cx.set_flops(&flops)
    }
}

/// A constant with its axes permuted (`out.shape[i] = in.shape[perm[i]]`), as fp32.
fn permute(t: &Tensor, perm: &[usize]) -> Tensor {
    Tensor::F32(t.to_f32().permuted_axes(IxDyn(perm)).as_standard_layout().into_owned())
}

/// Emits `dst[b, j, i] = src[b, i, j]` over `[batches, rows, cols]`: NCHW ↔ NHWC (and OIHW →
/// KRSC) through the `transpose` family's tiled kernel.
fn emit_matrix_transpose(
    cx: &mut LowerCtx,
    node: &Node,
    src: TensorId,
    dst: TensorId,
    batches: &Dim,
    rows: i64,
    cols: i64,
) -> LowerResult<()> {
    super::transpose::emit_tiled(cx, &node.name, src, dst, [batches.clone(), Dim::known(rows), Dim::known(cols)])
}

/// Emits the [`PAD_CHANNELS_TEMPLATE`] kernel copying the channels-last `x` (`c_in` channels
/// per pixel, `pixels` the dims before the channels) into `out` (`c_out` channels, the others
/// zero), its template fields built from the [`KernelFacts`] the fusion pass reads.
fn emit_pad_channels(
    cx: &mut LowerCtx,
    node: &Node,
    x: TensorId,
    out: TensorId,
    pixels: &[Dim],
    c_in: i64,
    c_out: i64,
) -> LowerResult<()> {
    let (x_slot, out_slot) = (0, 1);
    let mut c = Map::new();
    c.insert("pixels".into(), json!(cx.numel_expr(pixels)?));
    c.insert("c_in".into(), json!(c_in));
    c.insert("c_out".into(), json!(c_out));
    c.insert("x_index".into(), json!(x_slot));
    c.insert("out_index".into(), json!(out_slot));
    let facts = KernelFacts::PadChannels { x_slot, out_slot, c_in, c_out };
    cx.emit_with_facts(&node.name, PAD_CHANNELS_TEMPLATE, vec![x, out], vec![out_slot], c, facts)
}

/// How the weights the kernel reads are laid out.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WeightLayout {
    /// `[K,R,S,Cg]`, as in the graph.
    Krsc,
    /// `[R,S,Cg,K]`, transposed at compile time for the direct kernel.
    Rsck,
    /// `[K, Kp]`: each filter flattened in (r, s, c) order, filter row r from column r·row, and
    /// zero-padded to Kp columns (the stem kernel's, the im2col product's layout).
    Patch { columns: i64, row: i64 },
}

/// Emits the NHWC convolution kernel over `x` and `w` (the node's inputs or their padded /
/// transposed versions) with the bias, residual and output tensors given.
#[allow(clippy::too_many_arguments)]
fn emit_conv(
    cx: &mut LowerCtx,
    node: &Node,
    p: &ConvProblem,
    inst: Instance,
    [x, w]: [TensorId; 2],
    w_layout: WeightLayout,
    bias: Option<TensorId>,
    res: Option<TensorId>,
    out: TensorId,
) -> LowerResult<()> {
    ensure_float(cx, w, "weights")?;
    let mut args = vec![x, w];
    let mut slot = |t: Option<TensorId>| -> i64 {
        match t {
            Some(t) => {
                args.push(t);
                args.len() as i64 - 1
            }
            None => -1,
        }
    };
    let bias_index = slot(bias);
    let res_index = slot(res);
    let out_index = slot(Some(out));

    let (cg, kg) = (p.c / p.group, p.k / p.group);
    let [ws_k, ws_r, ws_s, ws_c] = match w_layout {
        WeightLayout::Krsc => [p.r * p.s * cg, p.s * cg, cg, 1],
        WeightLayout::Rsck => [1, p.s * cg * p.k, cg * p.k, p.k],
        WeightLayout::Patch { columns, row } => [columns, row, cg, 1],
    };
    let mut c: Map<String, Json> = Map::new();
    c.insert("n".into(), json!(cx.expr(&p.n)?));
    for (key, v) in p.geometry_fields().into_iter().chain([
        ("group", p.group),
        ("cg", cg),
        ("kg", kg),
        ("w_stride_k", ws_k),
        ("w_stride_r", ws_r),
        ("w_stride_s", ws_s),
        ("w_stride_c", ws_c),
        ("x_index", 0),
        ("w_index", 1),
        ("bias_index", bias_index),
        ("res_index", res_index),
        ("out_index", out_index),
    ]) {
        c.insert(key.into(), json!(v));
    }
    c.insert("has_bias".into(), json!(bias.is_some()));
    c.insert("has_residual".into(), json!(res.is_some()));
    c.insert("pre_act".into(), json!(act_expr(p.pre_act, "v")));
    c.insert("act".into(), json!(act_expr(p.act, "v")));
    // Without a residual the two activations compose: act(pre_act(v)).
    c.insert("epilogue".into(), json!(act_expr(p.act, &act_expr(p.pre_act, "v"))));
    if inst.template == DIRECT_TEMPLATE {
        float_storage_fields(&mut c, cx.dtype(out))?;
    }
    let stem = inst.template == STEM_TEMPLATE;
    cx.emit_instance(&node.name, inst, args, vec![out_index as usize], c)?;
    if stem {
        // The tile the lowering chose the stem kernel with (`library_form`).
        let tile = stem_tile(p).ok_or_else(|| LowerError::Invalid("the stem kernel without a stem tile".into()))?;
        let facts = StemFacts { x_slot: 0, out_slot: out_index as usize, problem: p.clone(), tile };
        cx.set_facts(KernelFacts::StemConv(Box::new(facts)))?;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ir::ops::kernel::Act;
    use crate::ir::ops::kernel::ConvGeom;
    use crate::ir::{DType, Graph, Op, Value, ValueType};
    use crate::lower::cuda::Arch;
    use crate::lower::cuda::CudaTarget;
    use crate::lower::{KernelInstance, Precision, Program, Storage};
    use std::sync::Arc;

    /// A graph under construction: typed values, constants, nodes.
    pub(crate) struct G {
        pub g: Graph,
    }

    impl G {
        pub fn new() -> G {
            G { g: Graph::default() }
        }
        pub fn value(&mut self, name: &str, dtype: DType, shape: Vec<Dim>) -> usize {
            self.g.values.push(Value {
                name: name.into(),
                ty: Some(ValueType::new(dtype, shape)),
                konst: None,
                sym: None,
            });
            self.g.values.len() - 1
        }
        pub fn input(&mut self, name: &str, shape: Vec<Dim>) -> usize {
            let v = self.value(name, DType::F32, shape);
            self.g.inputs.push(v);
            v
        }
        pub fn konst(&mut self, name: &str, shape: &[usize], f: impl Fn(usize) -> f32) -> usize {
            let n: usize = shape.iter().product();
            let t = Tensor::from_f32s(shape, (0..n).map(f).collect());
            let v = self.value(name, DType::F32, shape.iter().map(|&d| Dim::known(d as i64)).collect());
            self.g.values[v].konst = Some(Arc::new(t));
            v
        }
        /// Adds a node, inferring its output type with the op's own `infer`.
        pub fn node(&mut self, name: &str, op: Box<dyn Op>, inputs: Vec<Option<usize>>) -> usize {
            let facts: Vec<Option<crate::ir::Fact>> = inputs
                .iter()
                .map(|i| i.map(|v| crate::ir::Fact::of_type(self.g.values[v].ty.clone().expect("typed"))))
                .collect();
            let refs: Vec<Option<&crate::ir::Fact>> = facts.iter().map(|f| f.as_ref()).collect();
            let out = op.infer(&refs).expect("infer")[0].clone();
            let o = self.value(&format!("{name}.out"), out.dtype(), out.shape().to_vec());
            self.g.nodes.push(Node {
                name: name.into(),
                op_type: op.op_type().into(),
                domain: String::new(),
                op,
                inputs,
                outputs: vec![o],
            });
            o
        }
    }

    /// Lowers every node of `g` with `lower` (the family's function, so the test does not depend
    /// on the family tables), graph inputs bound as in `lower::lower`.
    pub(crate) fn lower_with(g: &Graph, lower: fn(&mut LowerCtx, &Node) -> LowerResult<()>) -> LowerResult<Program> {
        lower_named(g, lower, "test")
    }

    pub(crate) fn lower_named(
        g: &Graph,
        lower: fn(&mut LowerCtx, &Node) -> LowerResult<()>,
        model_name: &str,
    ) -> LowerResult<Program> {
        lower_at(g, lower, model_name, Precision::Fp16)
    }

    /// [`lower_named`] at a given storage precision.
    pub(crate) fn lower_at(
        g: &Graph,
        lower: fn(&mut LowerCtx, &Node) -> LowerResult<()>,
        model_name: &str,
        precision: Precision,
    ) -> LowerResult<Program> {
        let cuda = CudaTarget::new(Arch::Sm90);
        // At fp32 precision the lowering must not consult the target at all.
        let target: &dyn crate::lower::Target = match precision {
            Precision::Fp16 => &cuda,
            Precision::Fp32 => &NeverAsked,
        };
        let program = Program::empty(model_name.into(), "test.onnx".into(), crate::lower::RunDims::batch_only("N", 64));
        let mut cx = LowerCtx {
            graph: g,
            target,
            program,
            value_tensor: vec![None; g.values.len()],
            bound: Default::default(),
            precision,
        };
        for (index, &v) in g.inputs.iter().enumerate() {
            let (dtype, shape) = cx.value_shape(v)?;
            let dtype = cx.device_dtype(dtype)?;
            let t = cx.push_tensor(&g.value(v).name.clone(), dtype, shape, Storage::Input { index });
            cx.value_tensor[v] = Some(t);
        }
        for node in &g.nodes {
            lower(&mut cx, node)?;
        }
        Ok(cx.program)
    }

    /// A target that fails the test when asked anything (fp32 lowering never asks).
    pub(crate) struct NeverAsked;

    impl crate::lower::Target for NeverAsked {
        fn name(&self) -> &'static str {
            "cuda"
        }
        fn arch_name(&self) -> String {
            "sm_90".into()
        }
        fn warp_size(&self) -> i64 {
            32
        }
        fn conv2d(&self, p: &ConvProblem) -> Instance {
            panic!("the target was asked for a convolution instance: {p:?}")
        }
        fn gemm(&self, p: &crate::lower::GemmProblem) -> Instance {
            panic!("the target was asked for a gemm instance: {p:?}")
        }
        fn conv_channel_multiple(&self) -> usize {
            panic!("the target was asked for its channel multiple")
        }
    }

    /// Renders every kernel of `p` through its template the way codegen does (strict mode, no
    /// escaping, `node` and `workspace_bytes` added), from the template files on disk. With
    /// `O2A_RENDER_DIR` set, writes the files there with a rendered `common.cuh`, ready for nvcc.
    pub(crate) fn render_all(p: &Program) -> Vec<(String, String)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/cuda");
        let read = |rel: &str| std::fs::read_to_string(root.join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let mut hb = handlebars::Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        // Every partial under its name, as `Templates::for_target` registers them.
        for entry in std::fs::read_dir(root.join("partials")).expect("templates/cuda/partials") {
            let file = entry.expect("a partial").file_name().into_string().expect("a UTF-8 name");
            let name = file.strip_suffix(".hbs").unwrap_or(&file).to_string();
            hb.register_template_string(&name, read(&format!("partials/{file}"))).expect("partial parses");
        }
        hb.register_template_string("common.cuh", read("common.cuh.hbs")).expect("common");
        let mut files = Vec::new();
        for k in &p.kernels {
            let name = format!("kernels/{}.cu", k.template);
            if !hb.has_template(&name) {
                hb.register_template_string(&name, read(&format!("{name}.hbs"))).expect("template parses");
            }
            let mut ctx = k.context.clone();
            ctx.insert("node".into(), json!(k.node));
            ctx.insert("workspace_bytes".into(), json!(k.workspace_bytes));
            let text = hb.render(&name, &Json::Object(ctx)).unwrap_or_else(|e| panic!("{}: {e}", k.name));
            files.push((format!("{}.cu", k.name), text));
        }
        if let Ok(dir) = std::env::var("O2A_RENDER_DIR") {
            let dir = std::path::Path::new(&dir);
            std::fs::create_dir_all(dir).expect("render dir");
            let common = hb.render("common.cuh", &json!({ "model_name": p.model_name })).expect("common.cuh");
            std::fs::write(dir.join("common.cuh"), common).expect("write");
            let mut manifest = Vec::new();
            for ((f, text), k) in files.iter().zip(&p.kernels) {
                // Launchers of several test programs go into one library: prefix the names.
                let file = format!("{}_{f}", p.model_name);
                let name = format!("{}_{}", p.model_name, k.name);
                std::fs::write(dir.join(&file), text.replace(&k.name, &name)).expect("write");
                manifest.push(json!({ "file": file, "name": name, "template": k.template, "context": k.context }));
            }
            let text = serde_json::to_string_pretty(&manifest).expect("manifest");
            std::fs::write(dir.join(format!("{}_manifest.json", p.model_name)), text).expect("write");
        }
        files
    }

    fn geom(s: usize, p: usize, g: usize) -> ConvGeom {
        ConvGeom { strides: [s, s], pads: [p; 4], dilations: [1, 1], group: g }
    }

    fn conv_op(s: usize, p: usize, g: usize, act: Option<Act>) -> Box<dyn Op> {
        Box::new(Conv2d { layout: Layout::Nhwc, geom: geom(s, p, g), act, pre_act: None })
    }

    fn nhwc(h: i64, w: i64, c: i64) -> Vec<Dim> {
        vec![Dim::sym("N"), Dim::known(h), Dim::known(w), Dim::known(c)]
    }

    fn only_kernel(p: &Program, template: &str) -> KernelInstance {
        let ks: Vec<&KernelInstance> = p.kernels.iter().filter(|k| k.template == template).collect();
        assert_eq!(ks.len(), 1, "{:?}", p.kernels.iter().map(|k| &k.template).collect::<Vec<_>>());
        ks[0].clone()
    }

    #[test]
    fn resnet_block_uses_cutlass() {
        let mut b = G::new();
        let x = b.input("x", nhwc(56, 56, 64));
        let w = b.konst("w", &[64, 3, 3, 64], |i| (i % 7) as f32 * 0.01);
        let bias = b.konst("b", &[64], |i| i as f32);
        let y = b.node("conv1", conv_op(1, 1, 1, Some(Act::Relu)), vec![Some(x), Some(w), Some(bias), None]);
        let res_op =
            Box::new(Conv2d { layout: Layout::Nhwc, geom: geom(1, 0, 1), act: Some(Act::Relu), pre_act: None });
        let w2 = b.konst("w2", &[64, 1, 1, 64], |_| 0.5);
        b.node("conv2", res_op, vec![Some(y), Some(w2), Some(bias), Some(x)]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(p.kernels.len(), 2);
        let k0 = &p.kernels[0];
        assert_eq!(k0.template, "conv2d_library");
        assert_eq!(k0.context["n"], "(dims.v[0])");
        assert_eq!(k0.context["epilogue"], "o2a_relu(v)");
        assert_eq!(k0.context["has_residual"], false);
        assert_eq!(k0.args.len(), 4);
        let k1 = &p.kernels[1];
        assert_eq!(k1.context["has_residual"], true);
        assert_eq!(k1.context["act"], "o2a_relu(v)");
        assert_eq!(k1.context["pre_act"], "v");
        assert_eq!((k1.context["res_index"].as_i64(), k1.context["out_index"].as_i64()), (Some(3), Some(4)));
        assert_eq!(k1.writes, vec![4]);
    }

    /// A thin 1x1 convolution is no im2col case (its patch is the pixel itself): its input is
    /// padded to the library's channel count instead.
    #[test]
    fn thin_1x1_conv_is_padded_to_four_channels() {
        let mut b = G::new();
        let x = b.input("x", nhwc(224, 224, 3));
        let w = b.konst("w", &[64, 1, 1, 3], |i| i as f32);
        b.node("thin", conv_op(2, 0, 1, Some(Act::Relu)), vec![Some(x), Some(w), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["pad_channels", "conv2d_library"]
        );
        let pad = &p.kernels[0];
        assert_eq!(pad.facts, KernelFacts::PadChannels { x_slot: 0, out_slot: 1, c_in: 3, c_out: 4 });
        assert_eq!(pad.context["c_in"], 3);
        assert_eq!(pad.context["c_out"], 4);
        assert_eq!((pad.context["x_index"].as_u64(), pad.context["out_index"].as_u64()), (Some(0), Some(1)));
        assert_eq!(pad.context["pixels"], "((int64_t)50176*dims.v[0])");
        let conv = &p.kernels[1];
        assert_eq!(conv.context["c"], 4);
        assert_eq!(
            conv.context["dispatch"][0]["config"].as_str().map(|c| c.ends_with("kFixedChannels a4")),
            Some(true)
        );
        assert_eq!(conv.context["has_bias"], false);
        // The conv reads the padded temporary and the padded weight.
        assert_eq!(conv.args[0], pad.args[1]);
        let wt = &p.tensors[conv.args[1]];
        assert_eq!(wt.shape, vec![Dim::known(64), Dim::known(1), Dim::known(1), Dim::known(4)]);
        let Storage::Weight { bytes, .. } = wt.storage else { panic!("padded weight is a weight") };
        assert_eq!(bytes, 64 * 4 * 2);
        // Channels 0..3 carry the original values (fp16), channel 3 is zero.
        let w = weight_f32(&p, conv.args[1]);
        assert_eq!(&w[..5], [0.0, 1.0, 2.0, 0.0, 3.0]);
    }

    /// The fp16 weight `t` of a lowered program, as f32 values in memory order.
    fn weight_f32(p: &Program, t: TensorId) -> Vec<f32> {
        let Storage::Weight { offset, bytes } = p.tensors[t].storage else {
            panic!("{} is no weight", p.tensors[t].name)
        };
        assert_eq!(p.tensors[t].dtype, DType::F16);
        p.weights[offset as usize..(offset + bytes) as usize]
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()
    }

    /// Deterministic small integers in [-4, 4] (exact in fp16, and so are their products' sums).
    fn small_ints(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 33) % 9) as f32 - 4.0
            })
            .collect()
    }

    /// The im2col kernel's block and thread index math (templates/cuda/kernels/im2col.cu.hbs) on
    /// the CPU: block b stages the R input rows under output pixels q0 ..< q0 + TILE_Q of output
    /// row b / Q_TILES (zeros outside the image), then writes the tile's column groups from the
    /// staged window through the column-offset table, as the kernel does.
    /// Returns the patch matrix `[N·P·Q, Kp]`, checking that every element is stored exactly once
    /// and every staged read stays inside the window.
    fn simulate_im2col(x: &[f32], n: usize, p: &ConvProblem, kp: usize) -> Vec<f32> {
        let [h, w, c_, r_, s_, pp, qq] = [p.h, p.w, p.c, p.r, p.s, p.p, p.q];
        let (kp, rsc, image) = (kp as i64, r_ * s_ * c_, h * w * c_);
        let groups = kp / 8;
        assert_eq!(kp % 8, 0);
        let tile_q = crate::lower::cuda::im2col_tile_q(p, kp).expect("the window fits");
        let tile_row = ((tile_q - 1) * p.strides[1] + (s_ - 1) * p.dilations[1] + 1) * c_;
        let q_tiles = (qq + tile_q - 1) / tile_q;
        let col_off: Vec<i64> = (0..kp)
            .map(|col| {
                let (r, s, c) = (col / (s_ * c_), (col / c_) % s_, col % c_);
                if col < rsc {
                    r * tile_row + s * p.dilations[1] * c_ + c
                } else {
                    0
                }
            })
            .collect();
        let mut out: Vec<Option<f32>> = vec![None; (n as i64 * pp * qq * kp) as usize];
        for b in 0..n as i64 * pp * q_tiles {
            let np = b / q_tiles;
            let q0 = (b - np * q_tiles) * tile_q;
            let (pi, ni) = (np % pp, np / pp);
            let tq = (qq - q0).min(tile_q);
            let (ih0, iw0) = (pi * p.strides[0] - p.pads[0], q0 * p.strides[1] - p.pads[1]);
            let tile: Vec<f32> = (0..r_ * tile_row)
                .map(|e| {
                    let (r, rem) = (e / tile_row, e % tile_row);
                    let (ih, iw) = (ih0 + r * p.dilations[0], iw0 + rem / c_);
                    if (0..h).contains(&ih) && (0..w).contains(&iw) {
                        x[(ni * image + (ih * w + iw0) * c_ + rem) as usize]
                    } else {
                        0.0
                    }
                })
                .collect();
            let dst = (np * qq + q0) * groups;
            for g in 0..tq * groups {
                let (row, col0) = (g / groups, (g % groups) * 8);
                for j in 0..8 {
                    let col = col0 + j;
                    let v = if col < rsc {
                        let at = col_off[col as usize] + row * p.strides[1] * c_;
                        assert!((0..tile.len() as i64).contains(&at), "a staged read leaves the window");
                        tile[at as usize]
                    } else {
                        0.0
                    };
                    let i = ((dst + g) * 8 + j) as usize;
                    assert!(out[i].replace(v).is_none(), "element {i} stored twice");
                }
            }
        }
        out.into_iter().map(|v| v.expect("every element stored")).collect()
    }

    /// `cols [M, Kp] · wt[k, :]` for the `[K,1,1,Kp]` im2col weights: the 1x1 product, `[M, K]`.
    fn product(cols: &[f32], wt: &[f32], kp: usize) -> Vec<f32> {
        let k = wt.len() / kp;
        cols.chunks_exact(kp)
            .flat_map(|row| wt.chunks_exact(kp).map(move |f| row.iter().zip(f).map(|(a, b)| a * b).sum::<f32>()))
            .collect::<Vec<_>>()
            .chunks_exact(k)
            .flatten()
            .copied()
            .collect()
    }

    fn problem_of(n: i64, [h, w, c]: [i64; 3], [k, r, s]: [i64; 3], g: &ConvGeom) -> ConvProblem {
        let extent = |i: usize, x: i64, f: i64| {
            (x + (g.pads[i] + g.pads[i + 2]) as i64 - (g.dilations[i] as i64) * (f - 1) - 1) / g.strides[i] as i64 + 1
        };
        ConvProblem {
            n: Dim::known(n),
            h,
            w,
            c,
            k,
            r,
            s,
            p: extent(0, h, r),
            q: extent(1, w, s),
            pads: g.pads.map(|v| v as i64),
            strides: g.strides.map(|v| v as i64),
            dilations: g.dilations.map(|v| v as i64),
            group: 1,
            bias: false,
            residual: false,
            pre_act: None,
            act: None,
        }
    }

    /// The im2col product (the kernel's index math, the lowering's weight reshape) equals the
    /// reference convolution for strides, asymmetric padding, dilation and 1..4 channels.
    #[test]
    fn im2col_product_matches_the_reference_convolution() {
        use crate::lower::Target;
        let cuda = CudaTarget::new(Arch::Sm90);
        let cases: [([usize; 3], [usize; 3], ConvGeom); 7] = [
            ([11, 13, 3], [5, 7, 7], ConvGeom { strides: [2, 2], pads: [3; 4], dilations: [1, 1], group: 1 }),
            ([9, 8, 1], [4, 3, 3], ConvGeom { strides: [1, 1], pads: [1, 0, 2, 1], dilations: [1, 1], group: 1 }),
            ([10, 12, 4], [3, 3, 2], ConvGeom { strides: [1, 2], pads: [2, 1, 0, 3], dilations: [2, 3], group: 1 }),
            ([7, 7, 2], [6, 5, 5], ConvGeom { strides: [3, 1], pads: [0; 4], dilations: [1, 1], group: 1 }),
            ([6, 9, 3], [8, 1, 3], ConvGeom { strides: [1, 1], pads: [0, 1, 0, 1], dilations: [1, 1], group: 1 }),
            // Q = 150: a full 128-pixel tile and a partial one per output row.
            ([3, 300, 3], [2, 3, 5], ConvGeom { strides: [1, 2], pads: [1, 2, 1, 1], dilations: [1, 1], group: 1 }),
            // Stride 8 over 7 rows: the stage fits 64 of the 150 pixels (tiles of 64, 64, 22).
            ([7, 1200, 4], [2, 7, 3], ConvGeom { strides: [1, 8], pads: [0; 4], dilations: [1, 1], group: 1 }),
        ];
        for (seed, ([h, w, c], [k, r, s_], geom)) in cases.into_iter().enumerate() {
            let n = 2;
            let p = problem_of(n as i64, [h, w, c].map(|v| v as i64), [k, r, s_].map(|v| v as i64), &geom);
            let kp = cuda.conv_im2col_columns(&p).expect("a thin filter wider than 1x1 takes im2col") as usize;
            assert!(kp % 8 == 0 && kp >= r * s_ * c && kp < r * s_ * c + 8);
            if w == 1200 {
                assert_eq!(crate::lower::cuda::im2col_tile_q(&p, kp as i64), Some(64));
            }
            let x = small_ints(n * h * w * c, seed as u64);
            let wv = small_ints(k * r * s_ * c, 100 + seed as u64);
            let wt = im2col_weights(&Tensor::from_f32s(&[k, r, s_, c], wv.clone()), kp as i64).expect("reshapes");
            assert_eq!(wt.shape(), [k, 1, 1, kp]);
            let wt: Vec<f32> = wt.to_f32().iter().copied().collect();
            let got = product(&simulate_im2col(&x, n, &p, kp), &wt, kp);
            let xa = ArrayD::from_shape_vec(IxDyn(&[n, h, w, c]), x).expect("x");
            let wa = ArrayD::from_shape_vec(IxDyn(&[k, r, s_, c]), wv).expect("w");
            let want = crate::reference::kernel::conv::conv2d(Layout::Nhwc, &geom, &xa, &wa, None, None, None, None)
                .expect("reference");
            assert_eq!(want.shape(), [n, p.p as usize, p.q as usize, k]);
            // Small integers: both sums are exact.
            assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "case {seed}: {p:?}");
        }
    }

    /// A thin filter whose window under a single output pixel does not fit the im2col kernel's
    /// shared memory (7 rows of a 3-tap row dilated by 1000: 2001 pixels) is not unfolded.
    #[test]
    fn im2col_needs_the_window_to_fit() {
        use crate::lower::Target;
        let cuda = CudaTarget::new(Arch::Sm90);
        let geom = |dil| ConvGeom { strides: [1, 1], pads: [0; 4], dilations: [1, dil], group: 1 };
        let p = problem_of(1, [7, 2100, 4], [8, 7, 3], &geom(1000));
        assert_eq!(cuda.conv_im2col_columns(&p), None);
        let p = problem_of(1, [7, 2100, 4], [8, 7, 3], &geom(100));
        assert_eq!(cuda.conv_im2col_columns(&p), Some(88));
    }

    /// The thin-stem kernel (templates/cuda/kernels/conv2d_stem.cu.hbs) on the CPU, step by step
    /// as the kernel computes: per channel block and pixel tile, the staged input tile (zeros
    /// outside the image), the column table, each warp's A and B fragments gathered lane by lane
    /// in the PTX m16n8k16 layout (A rows g, g + 8 at columns 2t, 2t + 1 (+ 8); B column g at rows
    /// 2t, 2t + 1 (+ 8)), the products, and the epilogue's stores from the lanes' accumulators
    /// (rows g, g + 8 at columns 2t, 2t + 1; the kernel stages them through its output tile).
    /// `wt` is the `[K, Kp]` weight matrix. A paired tile reads column pairs (2i, 2i + 1) as the
    /// element at coff[2i] and the next one. Returns the `[N, P, Q, K]` output, checking that each
    /// element is stored exactly once, that every gathered element lies inside the staged tile,
    /// and that every pair starts at an even (4-byte aligned) index. `x` is `[N, H, W, C]`, or
    /// `[N, C, H, W]` with `x_nchw` (the fused layout transform's form, see `fuse.rs`).
    fn simulate_stem(x: &[f32], x_nchw: bool, n: usize, p: &ConvProblem, tile: &StemTile, wt: &[f32]) -> Vec<f32> {
        let u = |v: i64| v as usize;
        let [h, w, c, k, r, s, pp, qq] = [p.h, p.w, p.c, p.k, p.r, p.s, p.p, p.q].map(u);
        let [sh, sw, dh, dw] = [p.strides[0], p.strides[1], p.dilations[0], p.dilations[1]].map(u);
        let [tp, tq, bn, kp, row_cols] =
            [tile.tile_p, tile.tile_q, tile.block_n, tile.columns, tile.row_columns].map(u);
        let (in_rows, in_cols) = ((tp - 1) * sh + (r - 1) * dh + 1, (tq - 1) * sw + (s - 1) * dw + 1);
        let pitch = u(tile.pitch(p));
        let patch_len = u(tile.patch_halves(p));
        assert!(patch_len >= in_rows * pitch && pitch >= in_cols * c);
        // The stored map and its tiles: the pooled ones with a fused pooling (the identity
        // window otherwise, as the template's constants).
        let pool = tile.pool.unwrap_or(StemPool {
            kernel: [1, 1],
            strides: [1, 1],
            pads: [0, 0],
            out: [p.p, p.q],
            tile: [tile.tile_p, tile.tile_q],
        });
        let [pk_h, pk_w, ps_h, ps_w] = [pool.kernel[0], pool.kernel[1], pool.strides[0], pool.strides[1]].map(u);
        let [out_p, out_q, ptp, ptq] = [pool.out[0], pool.out[1], pool.tile[0], pool.tile[1]].map(u);
        let (pixels, passes) = (tp * tq, u(tile.passes()));
        let (tiles_q, rsc) = (out_q.div_ceil(ptq), r * row_cols);
        let tiles = out_p.div_ceil(ptp) * tiles_q;
        let coff: Vec<usize> = (0..kp)
            .map(|kk| {
                let (ri, j) = (kk / row_cols, kk % row_cols);
                match () {
                    _ if kk >= rsc => 0,
                    _ if tile.paired => ri * dh * pitch + j,
                    _ => ri * dh * pitch + j / c * dw * c + j % c,
                }
            })
            .collect();
        let origin = |m: usize| if m < pixels { m / tq * sh * pitch + m % tq * sw * c } else { 0 };
        let mut out: Vec<Option<f32>> = vec![None; n * out_p * out_q * k];
        for k0 in (0..k).step_by(bn) {
            for t_idx in 0..n * tiles {
                let (ni, tt) = (t_idx / tiles, t_idx % tiles);
                let (pp0, pq0) = (tt / tiles_q * ptp, tt % tiles_q * ptq);
                // The first stem pixel under the tile's windows: above or left of the map for a
                // padded pooling's first tiles.
                let (p0, q0) = ((pp0 * ps_h) as i64 - pool.pads[0], (pq0 * ps_w) as i64 - pool.pads[1]);
                let (ih0, iw0) = (p0 * sh as i64 - p.pads[0], q0 * sw as i64 - p.pads[1]);
                let inside = |row: usize, col: usize| {
                    let (ih, iw) = (ih0 + row as i64, iw0 + col as i64);
                    let staged = row < in_rows && col < in_cols;
                    (staged && (0..h as i64).contains(&ih) && (0..w as i64).contains(&iw))
                        .then_some((ih as usize, iw as usize))
                };
                let patch: Vec<f32> = if x_nchw {
                    // The kernel's NCHW staging: element i is (row, channel, column), stored at
                    // row·pitch + column·C + channel; the pitch padding and the tail stay zero.
                    let mut patch: Vec<Option<f32>> = (0..patch_len)
                        .map(|i| (i >= in_rows * pitch || i % pitch >= in_cols * c).then_some(0.0))
                        .collect();
                    for i in 0..in_rows * c * in_cols {
                        let (row, cc, col) = (i / (c * in_cols), i % (c * in_cols) / in_cols, i % in_cols);
                        let v = inside(row, col).map_or(0.0, |(ih, iw)| x[((ni * c + cc) * h + ih) * w + iw]);
                        let slot = &mut patch[row * pitch + col * c + cc];
                        assert!(slot.is_none(), "staged element {i} written twice");
                        *slot = Some(v);
                    }
                    patch.into_iter().map(|v| v.expect("every staged element is written")).collect()
                } else {
                    (0..patch_len)
                        .map(|i| {
                            let (row, e) = (i / pitch, i % pitch);
                            let (cc, col) = (e % c, e / c);
                            inside(row, col).map_or(0.0, |(ih, iw)| x[((ni * h + ih) * w + iw) * c + cc])
                        })
                        .collect()
                };
                let at = |i: usize| {
                    assert!(i < patch_len, "a gather past the staged tile");
                    patch[i]
                };
                let weight = |row: usize, col: usize| if k0 + row < k { wt[(k0 + row) * kp + col] } else { 0.0 };
                // The output tile: stem pixel m's channels, every pass (the kernel's `ot`).
                let mut ot: Vec<Option<f32>> = vec![None; passes * 128 * bn];
                for (pass, warp) in (0..passes).flat_map(|pass| (0..4).map(move |warp| (pass, warp))) {
                    // acc[lane][mt][nt][e]
                    let mut acc = vec![[[[0f32; 4]; 8]; 2]; 32];
                    for kb in (0..kp).step_by(16) {
                        for mt in 0..2 {
                            let mut a = [[0f32; 16]; 16];
                            for lane in 0..32 {
                                let (g, t) = (lane / 4, lane % 4);
                                let kc = kb + 2 * t;
                                let m = pass * 128 + warp * 32 + mt * 16 + g;
                                let o = [origin(m), origin(m + 8)];
                                for (h8, &base) in o.iter().enumerate() {
                                    for (j, col) in [kc, kc + 1, kc + 8, kc + 9].into_iter().enumerate() {
                                        let index = if tile.paired && col % 2 == 1 {
                                            base + coff[col - 1] + 1
                                        } else {
                                            base + coff[col]
                                        };
                                        assert!(!tile.paired || col % 2 == 1 || index % 2 == 0, "a misaligned pair");
                                        a[g + 8 * h8][2 * t + j % 2 + 8 * (j / 2)] = at(index);
                                    }
                                }
                            }
                            for nt in 0..bn / 8 {
                                let mut b = [[0f32; 8]; 16];
                                for lane in 0..32 {
                                    let (g, t) = (lane / 4, lane % 4);
                                    for j in [0, 1, 8, 9] {
                                        b[2 * t + j][g] = weight(nt * 8 + g, kb + 2 * t + j);
                                    }
                                }
                                for (lane, acc) in acc.iter_mut().enumerate() {
                                    let (g, t) = (lane / 4, lane % 4);
                                    for (e, (row, col)) in
                                        [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
                                            .into_iter()
                                            .enumerate()
                                    {
                                        acc[mt][nt][e] += (0..16).map(|j| a[row][j] * b[j][col]).sum::<f32>();
                                    }
                                }
                            }
                        }
                    }
                    for (lane, acc) in acc.iter().enumerate() {
                        let (g, t) = (lane / 4, lane % 4);
                        for mt in 0..2 {
                            for h8 in 0..2 {
                                let m = pass * 128 + warp * 32 + mt * 16 + h8 * 8 + g;
                                for nt in 0..bn / 8 {
                                    for e in 0..2 {
                                        let slot = &mut ot[m * bn + nt * 8 + 2 * t + e];
                                        assert!(slot.is_none(), "output tile row {m} written twice");
                                        *slot = Some(acc[mt][nt][2 * h8 + e]);
                                    }
                                }
                            }
                        }
                    }
                }
                // The store: each stored pixel the maximum over its window's taps inside the stem's
                // map (the stem pixel itself without a pooling).
                for (a, b_, kc) in
                    (0..ptp).flat_map(|a| (0..ptq).flat_map(move |b_| (0..bn).map(move |kc| (a, b_, kc))))
                {
                    let (opi, oqi) = (pp0 + a, pq0 + b_);
                    if opi >= out_p || oqi >= out_q || k0 + kc >= k {
                        continue;
                    }
                    let mut mx = f32::NEG_INFINITY;
                    for (kh, kw) in (0..pk_h).flat_map(|kh| (0..pk_w).map(move |kw| (kh, kw))) {
                        let (row, col) = (a * ps_h + kh, b_ * ps_w + kw);
                        let (pi, qi) = (p0 + row as i64, q0 + col as i64);
                        if pi < 0 || pi >= pp as i64 || qi < 0 || qi >= qq as i64 {
                            continue;
                        }
                        assert!(row < tp && col < tq, "a window tap outside the tile");
                        let v = ot[(row * tq + col) * bn + kc].expect("a tapped stem pixel is computed");
                        mx = if v > mx { v } else { mx };
                    }
                    let o = ((ni * out_p + opi) * out_q + oqi) * k + k0 + kc;
                    assert!(out[o].is_none(), "output {o} stored twice");
                    out[o] = Some(mx);
                }
            }
        }
        out.into_iter().enumerate().map(|(i, v)| v.unwrap_or_else(|| panic!("output {i} never stored"))).collect()
    }

    /// The stem kernel's index math gives the reference convolution exactly (small integers) for
    /// ResNet's 7x7/2 stem with two channel blocks (72 filters: the second block is partial),
    /// MobileNet's 3x3/2 one on an odd map, a dilated, asymmetrically strided and padded
    /// grayscale one, and a map narrower than a tile (4-column tiles).
    #[test]
    fn stem_kernel_index_math_matches_the_reference() {
        // (input, filter, geometry, paired gathers)
        let cases: [([i64; 3], [i64; 3], ConvGeom, bool); 6] = [
            ([23, 37, 3], [72, 7, 7], geom(2, 3, 1), true),
            ([19, 21, 3], [32, 3, 3], geom(2, 1, 1), true),
            (
                [13, 17, 1],
                [16, 5, 3],
                ConvGeom { strides: [1, 2], pads: [2, 0, 1, 3], dilations: [2, 1], group: 1 },
                true,
            ),
            ([6, 7, 4], [8, 3, 2], geom(1, 1, 1), true),
            // An odd window step (stride 1, 3 channels): pairs would be misaligned.
            ([9, 10, 3], [8, 3, 3], geom(1, 1, 1), false),
            // Dilated along W: a filter row's columns are not neighbours.
            ([12, 14, 2], [16, 3, 3], ConvGeom { strides: [1, 1], pads: [1; 4], dilations: [1, 2], group: 1 }, false),
        ];
        for (i, ([h, w, c], [k, r, s], g, paired)) in cases.into_iter().enumerate() {
            let n = 2;
            let p = problem_of(n, [h, w, c], [k, r, s], &g);
            let tile = stem_tile(&p).unwrap_or_else(|| panic!("case {i} takes the stem kernel"));
            assert_eq!(tile.paired, paired, "case {i}: {tile:?}");
            assert_eq!(tile.row_columns, if paired { (s * c + 1) / 2 * 2 } else { s * c }, "case {i}");
            let xv = small_ints((n * h * w * c) as usize, 11 + i as u64);
            let wv = small_ints((k * r * s * c) as usize, 17 + i as u64);
            let wa = ArrayD::from_shape_vec(IxDyn(&[k, r, s, c].map(|v| v as usize)), wv).expect("w");
            let Tensor::F32(flat) = stem_weights(&Tensor::F32(wa.clone()), &tile).expect("flatten") else {
                panic!("f32 weights")
            };
            let wt = flat.as_slice().expect("contiguous");
            let got = simulate_stem(&xv, false, n as usize, &p, &tile, wt);
            let xa = ArrayD::from_shape_vec(IxDyn(&[n, h, w, c].map(|v| v as usize)), xv).expect("x");
            let want = crate::reference::kernel::conv::conv2d(Layout::Nhwc, &g, &xa, &wa, None, None, None, None)
                .expect("reference");
            let want: Vec<f32> = want.iter().copied().collect();
            assert_eq!(got, want, "case {i}: {tile:?}");
            // The same input channels-first, as the stem reads the model's input when the layout
            // transform before it is fused away.
            let nchw: Vec<f32> = xa.permuted_axes(IxDyn(&[0, 3, 1, 2])).iter().copied().collect();
            assert_eq!(simulate_stem(&nchw, true, n as usize, &p, &tile, wt), want, "case {i} (NCHW input): {tile:?}");
        }
    }

    /// The stem kernel with a fused max pooling (`stem_pool_tile`) gives the reference
    /// convolution's pooling exactly: ResNet's 7x7/2 stem and 3x3/2 pooling on a small odd map
    /// with two channel blocks (72 filters), a 2x2/2 pooling without padding, a 3x3/1 one (single
    /// pass tiles), and a stride-1 stem under a 3x3/2 pooling whose last window hangs over the
    /// map's edge (ceil mode).
    #[test]
    fn stem_pool_kernel_index_math_matches_the_reference() {
        use crate::ir::ops::kernel::{Pool, PoolKind};
        // (input, filter, stem geometry, pool kernel, stride, pad, ceil mode)
        let cases: [([i64; 3], [i64; 3], ConvGeom, i64, i64, i64, bool); 4] = [
            ([45, 51, 3], [72, 7, 7], geom(2, 3, 1), 3, 2, 1, false),
            ([30, 34, 3], [16, 3, 3], geom(2, 1, 1), 2, 2, 0, false),
            ([21, 25, 3], [24, 3, 3], geom(2, 1, 1), 3, 1, 1, false),
            ([20, 22, 1], [8, 3, 3], geom(1, 0, 1), 3, 2, 0, true),
        ];
        for (i, ([h, w, c], [k, r, s], g, pk, ps, pad, ceil_mode)) in cases.into_iter().enumerate() {
            let n = 2;
            let p = problem_of(n, [h, w, c], [k, r, s], &g);
            let stem = stem_tile(&p).unwrap_or_else(|| panic!("case {i} takes the stem kernel"));
            let pool = Pool {
                kind: PoolKind::Max,
                layout: Layout::Nhwc,
                kernel: [pk as usize; 2],
                geom: ConvGeom { strides: [ps as usize; 2], pads: [pad as usize; 4], dilations: [1, 1], group: 1 },
                ceil_mode,
            };
            let out =
                [0, 1].map(|a| pool.out_dim(a, &Dim::known([p.p, p.q][a])).expect("pooled").as_known().expect("known"));
            // The tile the kernel runs on large grids (one or two passes), and on small ones.
            for max_passes in [2, 1] {
                let tile = stem_pool_tile(&p, &stem, [pk; 2], [ps; 2], [pad; 2], out, max_passes)
                    .unwrap_or_else(|| panic!("case {i}: the pooling fuses"));
                assert!(
                    tile.passes() <= max_passes && tile.smem_bytes(&p) <= STEM_POOL_SMEM_BYTES,
                    "case {i}: {tile:?}"
                );
                let xv: Vec<f32> = small_ints((n * h * w * c) as usize, 31 + i as u64);
                let wv = small_ints((k * r * s * c) as usize, 37 + i as u64);
                let wa = ArrayD::from_shape_vec(IxDyn(&[k, r, s, c].map(|v| v as usize)), wv).expect("w");
                let Tensor::F32(flat) = stem_weights(&Tensor::F32(wa.clone()), &tile).expect("flatten") else {
                    panic!("f32 weights")
                };
                let got = simulate_stem(&xv, false, n as usize, &p, &tile, flat.as_slice().expect("contiguous"));
                let xa = ArrayD::from_shape_vec(IxDyn(&[n, h, w, c].map(|v| v as usize)), xv).expect("x");
                let conv = crate::reference::kernel::conv::conv2d(Layout::Nhwc, &g, &xa, &wa, None, None, None, None)
                    .expect("reference");
                let want = crate::reference::kernel::misc::pool(&pool, &conv).expect("reference pooling");
                assert_eq!(want.shape()[1..3], out.map(|v| v as usize), "case {i}");
                assert_eq!(got, want.iter().copied().collect::<Vec<f32>>(), "case {i}: {tile:?}");
            }
        }
    }

    /// ResNet's stem lowers to one kernel: the stem kernel over the unpadded input, with the
    /// `[K, 1, 1, 160]` weights (filter rows of 22 columns, zero past 154), its tile, bias and
    /// epilogue.
    #[test]
    fn thin_stem_runs_on_the_stem_kernel() {
        let mut b = G::new();
        let x = b.input("x", nhwc(224, 224, 3));
        let wv = small_ints(64 * 7 * 7 * 3, 5);
        let w = b.konst("stem.w", &[64, 7, 7, 3], |i| wv[i]);
        let bias = b.konst("b", &[64], |i| i as f32);
        b.node("stem", conv_op(2, 3, 1, Some(Act::Relu)), vec![Some(x), Some(w), Some(bias), None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(), [STEM_TEMPLATE]);
        let k = &p.kernels[0];
        let field = |f: &str| k.context[f].as_i64().unwrap_or_else(|| panic!("{f}"));
        assert_eq!(
            ["c", "k", "r", "s", "p", "q", "stride_h", "w_stride_k", "tile_p", "tile_q", "block_n"].map(field),
            [3, 64, 7, 7, 112, 112, 2, 160, 8, 16, 64]
        );
        assert_eq!(p.tensors[k.args[0]].storage, Storage::Input { index: 0 });
        assert_eq!((k.context["has_bias"].as_bool(), k.context["act"].as_str()), (Some(true), Some("o2a_relu(v)")));
        let wt = &p.tensors[k.args[1]];
        assert_eq!((wt.name.as_str(), &wt.shape), ("stem.w.stem160", &[64, 1, 1, 160].map(Dim::known).to_vec()));
        // Each filter row's 21 weights, then a zero column (4-byte pairs never straddle two rows):
        // 7 x 22 = 154 columns, zero to 160.
        assert_eq!((field("row_columns"), k.context["paired"].as_bool()), (22, Some(true)));
        let wl = weight_f32(&p, k.args[1]);
        for f in 0..64 {
            for r in 0..7 {
                let row = f * 160 + r * 22;
                assert_eq!(wl[row..row + 21], wv[f * 147 + r * 21..f * 147 + (r + 1) * 21], "filter {f} row {r}");
                assert_eq!(wl[row + 21], 0.0, "filter {f} row {r} spare column");
            }
            assert!(wl[f * 160 + 154..(f + 1) * 160].iter().all(|&v| v == 0.0), "filter {f} padding");
        }
        // No patch matrix: the arena holds nothing but the output.
        assert!(p.tensors.iter().all(|t| !t.name.contains("im2col")));
        render_all(&p);
    }

    /// An AlexNet-style stem (3 channels, 11x11/4, pad 2, 64 filters), whose 363-column weights
    /// and input tile exceed the stem kernel's shared memory: the im2col kernel into a
    /// [N,P,Q,368] temporary and the 1x1 library convolution over 368 channels with the
    /// flattened weights; the lowered program's tensors computed on the CPU give the reference
    /// convolution.
    #[test]
    fn thin_stem_runs_as_im2col_and_a_1x1_product() {
        let mut b = G::new();
        let x = b.input("x", nhwc(32, 32, 3));
        let wv = small_ints(64 * 11 * 11 * 3, 7);
        let w = b.konst("stem.w", &[64, 11, 11, 3], |i| wv[i]);
        let bias = b.konst("b", &[64], |i| i as f32);
        b.node("stem", conv_op(4, 2, 1, Some(Act::Relu)), vec![Some(x), Some(w), Some(bias), None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(), ["im2col", "conv2d_library"]);
        let (im, conv) = (&p.kernels[0], &p.kernels[1]);
        let field = |k: &KernelInstance, f: &str| k.context[f].as_i64().unwrap_or_else(|| panic!("{f}"));
        assert_eq!(im.context["n"], "(dims.v[0])");
        assert_eq!(
            ["h", "w", "c", "r", "s", "p", "q", "pad_h", "pad_w", "stride_h", "stride_w", "dil_h", "dil_w", "kp"]
                .map(|f| field(im, f)),
            [32, 32, 3, 11, 11, 7, 7, 2, 2, 4, 4, 1, 1, 368]
        );
        assert_eq!((field(im, "x_index"), field(im, "out_index")), (0, 1));
        assert_eq!(im.writes, vec![1]);
        // x is the graph input itself (no pad_channels); the patch matrix is a temporary.
        assert_eq!(p.tensors[im.args[0]].storage, Storage::Input { index: 0 });
        let cols = &p.tensors[im.args[1]];
        assert_eq!((cols.name.as_str(), &cols.storage), ("x.im2col368", &Storage::Arena { offset: 0 }));
        assert_eq!(cols.shape, vec![Dim::sym("N"), Dim::known(7), Dim::known(7), Dim::known(368)]);
        // The 1x1 problem over the patch matrix: same output, bias and activation.
        assert_eq!(conv.args[0], im.args[1]);
        assert_eq!(
            ["h", "w", "c", "k", "r", "s", "p", "q", "pad_h", "pad_w", "stride_h", "stride_w", "dil_h", "dil_w"]
                .map(|f| field(conv, f)),
            [7, 7, 368, 64, 1, 1, 7, 7, 0, 0, 1, 1, 1, 1]
        );
        assert_eq!(
            (conv.context["has_bias"].as_bool(), conv.context["epilogue"].as_str()),
            (Some(true), Some("o2a_relu(v)"))
        );
        assert_eq!(p.tensors[conv.args[2]].name, "b");
        // The weights: [K,1,1,368], each filter flattened in (r, s, c) order, zero beyond 363.
        let wt = &p.tensors[conv.args[1]];
        assert_eq!((wt.name.as_str(), &wt.shape), ("stem.w.im2col368", &[64, 1, 1, 368].map(Dim::known).to_vec()));
        let wl = weight_f32(&p, conv.args[1]);
        for k in 0..64 {
            assert_eq!(wl[k * 368..k * 368 + 363], wv[k * 363..(k + 1) * 363], "filter {k}");
            assert!(wl[k * 368 + 363..(k + 1) * 368].iter().all(|&v| v == 0.0), "filter {k} padding");
        }
        // Numerically: im2col (the kernel's index math) then the product with the lowered weights.
        let n = 2;
        let xv = small_ints(n * 32 * 32 * 3, 8);
        let problem = problem_of(n as i64, [32, 32, 3], [64, 11, 11], &geom(4, 2, 1));
        let got = product(&simulate_im2col(&xv, n, &problem, 368), &wl, 368);
        let xa = ArrayD::from_shape_vec(IxDyn(&[n, 32, 32, 3]), xv).expect("x");
        let wa = ArrayD::from_shape_vec(IxDyn(&[64, 11, 11, 3]), wv).expect("w");
        let want =
            crate::reference::kernel::conv::conv2d(Layout::Nhwc, &geom(4, 2, 1), &xa, &wa, None, None, None, None)
                .expect("reference");
        assert_eq!(got, want.iter().copied().collect::<Vec<_>>());
        render_all(&p);
    }

    /// An NCHW thin stem: x is transposed to NHWC first, the OIHW weights are flattened in KRSC
    /// order (the patch matrix's) for the stem kernel, and the output is transposed back.
    #[test]
    fn nchw_thin_stem_flattens_krsc_weights() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(3), Dim::known(20), Dim::known(20)]);
        // OIHW: w[k, c, r, s] = 100k + 25c + 5r + s, distinct and exact in fp16.
        let w = b.konst("w", &[8, 3, 5, 5], |i| ((i / 75) * 100 + (i / 25 % 3) * 25 + i % 25) as f32);
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 2, 1), act: None, pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["transpose", STEM_TEMPLATE, "transpose"]
        );
        let (tin, conv) = (&p.kernels[0], &p.kernels[1]);
        assert_eq!(conv.args[0], tin.args[1]);
        assert_eq!(conv.context["w_stride_k"], 80);
        let wl = weight_f32(&p, conv.args[1]);
        assert_eq!(wl.len(), 8 * 80);
        for (k, r, s, c) in [(0, 0, 0, 0), (3, 2, 4, 1), (7, 4, 4, 2), (5, 1, 0, 2)] {
            assert_eq!(wl[k * 80 + (r * 5 + s) * 3 + c], (k * 100 + c * 25 + r * 5 + s) as f32, "w[{k},{c},{r},{s}]");
        }
        assert!(wl[75..80].iter().all(|&v| v == 0.0));
    }

    /// Not an im2col case: a 1x1 thin filter (above), a grouped or depthwise thin convolution,
    /// run-time weights, a wide input.
    #[test]
    fn other_convolutions_skip_im2col() {
        let mut b = G::new();
        let x = b.input("x", nhwc(16, 16, 4));
        let wd = b.konst("wd", &[4, 3, 3, 1], |_| 1.0);
        b.node("depthwise", conv_op(1, 1, 4, None), vec![Some(x), Some(wd), None, None]);
        let wg = b.konst("wg", &[4, 3, 3, 2], |_| 1.0);
        b.node("grouped", conv_op(1, 1, 2, None), vec![Some(x), Some(wg), None, None]);
        let wr = b.input("wr", vec![Dim::known(8), Dim::known(3), Dim::known(3), Dim::known(4)]);
        b.node("runtime", conv_op(1, 1, 1, None), vec![Some(x), Some(wr), None, None]);
        let x16 = b.input("x16", nhwc(16, 16, 16));
        let w16 = b.konst("w16", &[8, 3, 3, 16], |_| 1.0);
        b.node("wide", conv_op(1, 1, 1, None), vec![Some(x16), Some(w16), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        let templates: Vec<&str> = p.kernels.iter().map(|k| k.template.as_str()).collect();
        assert!(!templates.contains(&IM2COL_TEMPLATE), "{templates:?}");
        assert_eq!(templates.len(), 4, "{templates:?}");
        assert_eq!(p.kernels[3].context["c"], 16);
        assert!(p.tensors.iter().all(|t| !t.name.contains("im2col")));
    }

    #[test]
    fn depthwise_and_unaligned_grouped_use_our_kernels() {
        let mut b = G::new();
        let x = b.input("x", nhwc(28, 28, 64));
        let w = b.konst("w", &[64, 3, 3, 1], |i| i as f32);
        let y =
            b.node("dw", conv_op(1, 1, 64, Some(Act::Clip { lo: 0.0, hi: 6.0 })), vec![Some(x), Some(w), None, None]);
        // 2 groups of 32 channels with 18 filters each: 18 neither divides a 32-wide tile nor
        // fills whole ones (and K = 36 is no multiple of 8), so no grouped instance applies.
        let w2 = b.konst("w2", &[36, 3, 3, 32], |_| 1.0);
        b.node("grouped", conv_op(2, 1, 2, None), vec![Some(y), Some(w2), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        // Depthwise (C = K = group, C % 8 == 0) gets the depthwise kernel, this grouped one the
        // direct one.
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            [DEPTHWISE_TEMPLATE, DIRECT_TEMPLATE]
        );
        let dw = &p.kernels[0];
        assert_eq!((dw.context["cg"].as_i64(), dw.context["kg"].as_i64()), (Some(1), Some(1)));
        assert_eq!(dw.context["act"], "o2a_clip(v, 0.0f, 6.0f)");
        // Constant weights are transposed to RSCK: w[k, r, s, c] at ((r*S + s)*Cg + c)*K + k.
        assert_eq!(
            ["w_stride_k", "w_stride_r", "w_stride_s", "w_stride_c"].map(|f| dw.context[f].as_i64().unwrap()),
            [1, 3 * 64, 64, 64]
        );
        let wt = &p.tensors[dw.args[1]];
        assert_eq!(wt.shape, vec![Dim::known(3), Dim::known(3), Dim::known(1), Dim::known(64)]);
        let grouped = &p.kernels[1];
        assert_eq!((grouped.context["cg"].as_i64(), grouped.context["kg"].as_i64()), (Some(32), Some(18)));
        assert_eq!(grouped.context["k_per_thread"], 2);
        assert_eq!(grouped.context["p"], 14);
    }

    /// The grouped library configs a node dispatches to, in batch order.
    fn dispatch_configs(k: &KernelInstance) -> Vec<String> {
        k.context["dispatch"]
            .as_array()
            .expect("a library node has a dispatch table")
            .iter()
            .map(|d| d["config"].as_str().expect("config").to_string())
            .collect()
    }

    /// ResNeXt-50 (32x4d) 3x3 convolutions with 4 and 8 filters per group (128 channels in 32
    /// groups of 4 at stride 1 and 2, 256 in 32 groups of 8, BN folded into a bias, ReLU, one
    /// with a residual): the grouped CUTLASS instance would put several groups in each 32-wide
    /// tile (see `CudaTarget::conv2d`), so they run on the tensor-core grouped kernel
    /// ([`GROUP_MMA_TEMPLATE`]), groups of 4 two at a time (16 groups of 8 with block-diagonal
    /// weights), its weights each filter's (r, s, c) elements zero-padded to whole k16 steps. The
    /// ungrouped 1x1 between them stays a library conv.
    #[test]
    fn resnext_narrow_groups_run_on_the_grouped_mma_kernel() {
        let mut b = G::new();
        let x = b.input("x", nhwc(56, 56, 128));
        let bias128 = b.konst("b128", &[128], |i| i as f32 * 0.01);
        // w1[k, r, s, c] = (k·36 + (r·3 + s)·4 + c) mod 251.
        let w1 = b.konst("w1", &[128, 3, 3, 4], |i| (i % 251) as f32);
        let y1 = b.node("g4_s1", conv_op(1, 1, 32, Some(Act::Relu)), vec![Some(x), Some(w1), Some(bias128), None]);
        let w2 = b.konst("w2", &[128, 3, 3, 4], |i| (i % 7) as f32);
        let y2 = b.node("g4_s2", conv_op(2, 1, 32, Some(Act::Relu)), vec![Some(y1), Some(w2), Some(bias128), None]);
        let w_up = b.konst("w_up", &[256, 1, 1, 128], |_| 0.5);
        let y3 = b.node("expand", conv_op(1, 0, 1, None), vec![Some(y2), Some(w_up), None, None]);
        // w8[k, r, s, c] = (k·72 + (r·3 + s)·8 + c) mod 509: distinct along a filter.
        let w8 = b.konst("w8", &[256, 3, 3, 8], |i| (i % 509) as f32);
        let bias256 = b.konst("b256", &[256], |_| 0.5);
        b.node("g8_res", conv_op(1, 1, 32, Some(Act::Relu)), vec![Some(y3), Some(w8), Some(bias256), Some(y3)]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        let templates: Vec<&str> = p.kernels.iter().map(|k| k.template.as_str()).collect();
        assert_eq!(templates, [GROUP_MMA_TEMPLATE, GROUP_MMA_TEMPLATE, "conv2d_library", GROUP_MMA_TEMPLATE]);
        assert!(p.library.iter().all(|l| l.template != "conv2d_group_sm80"));
        let fields = |k: &KernelInstance| {
            ["group", "cg", "kg", "w_stride_k", "stride_h", "tile_q"].map(|f| k.context[f].as_i64().expect(f))
        };
        // Groups of 4 as 16 groups of 8: 72 filter elements in 80 columns (five k16 steps).
        assert_eq!((p.kernels[0].node.as_str(), fields(&p.kernels[0])), ("g4_s1", [16, 8, 8, 80, 1, 16]));
        assert_eq!((p.kernels[1].node.as_str(), fields(&p.kernels[1])), ("g4_s2", [16, 8, 8, 80, 2, 16]));
        assert_eq!((p.kernels[3].node.as_str(), fields(&p.kernels[3])), ("g8_res", [32, 8, 8, 80, 1, 16]));
        assert_eq!(p.kernels[3].context["has_residual"].as_bool(), Some(true));
        let patch_value = |w: &dyn Fn(usize) -> f32, kg: usize, f: usize, col: usize| -> f32 {
            // Column (r·3 + s)·8 + c' of filter f: its own group's channel c' - j·kg when c' is in
            // block j = (f / kg) mod (8 / kg), else zero; zero past the 72 filter elements.
            if col >= 72 {
                return 0.0;
            }
            let (tap, c) = (col / 8, col % 8);
            let j = (f / kg) % (8 / kg);
            if c / kg != j {
                return 0.0;
            }
            w(f * 9 * kg + tap * kg + c % kg)
        };
        for (i, kg, w) in
            [(0, 4, &(|i: usize| (i % 251) as f32) as &dyn Fn(usize) -> f32), (3, 8, &|i: usize| (i % 509) as f32)]
        {
            let k = &p.kernels[i];
            let wt = &p.tensors[k.args[1]];
            let filters = if kg == 4 { 128 } else { 256 };
            assert_eq!(wt.shape, [filters, 1, 1, 80].map(Dim::known).to_vec());
            let values = weight_f32(&p, k.args[1]);
            for f in 0..filters as usize {
                for col in 0..80 {
                    assert_eq!(
                        values[f * 80 + col],
                        patch_value(w, kg, f, col),
                        "{}: filter {f}, column {col}",
                        k.node
                    );
                }
            }
        }
        render_all(&p);
    }

    /// The grouped tensor-core kernel (templates/cuda/kernels/conv2d_group_mma.cu.hbs) on the CPU,
    /// as its indices go: per group block and pixel tile, the staged tile written by
    /// `stage_tile`'s chunks (chunk i: 8 channels of pixel i / (CB/8), at pixel·PP + its channel
    /// offset; zeros outside the image), each written once; the column table and window origins;
    /// per group g, each A row's 8-column runs read from origin + g·CG + coff[run start], each run
    /// inside the staged tile and within one pixel's channels; the products with the group's
    /// `[K, Kp]` weight rows; each output stored once. Returns the `[N, P, Q, K]` output.
    fn simulate_group_mma(x: &[f32], n: usize, p: &ConvProblem, tile: &GroupMmaTile, wt: &[f32]) -> Vec<f32> {
        let u = |v: i64| v as usize;
        let kp_ = tile.kernel_problem(p);
        let [h, w, c, k, r, s, pp, qq, groups] =
            [kp_.h, kp_.w, kp_.c, kp_.k, kp_.r, kp_.s, kp_.p, kp_.q, kp_.group].map(u);
        let [sh, sw, dh, dw] = [p.strides[0], p.strides[1], p.dilations[0], p.dilations[1]].map(u);
        let [tp, tq, kp, gb] = [tile.tile_p, tile.tile_q, tile.columns, tile.group_block].map(u);
        let (cg, kg) = (c / groups, k / groups);
        let (cb, kb) = (gb * cg, gb * kg);
        let pix = u(tile.pixel_halves(p));
        assert!(pix >= cb && pix % 8 == 0);
        let (in_rows, in_cols) = ((tp - 1) * sh + (r - 1) * dh + 1, (tq - 1) * sw + (s - 1) * dw + 1);
        let pitch = in_cols * pix;
        let rsc = r * s * cg;
        assert!(kp % 16 == 0 && rsc <= kp && cg % 8 == 0 && groups % gb == 0);
        assert_eq!(tile.smem_bytes(p), ((kb * (kp + 8) + in_rows * pitch + 128 * (kb + 8)) * 2 + kp * 4) as i64);
        let coff: Vec<usize> = (0..kp)
            .map(|kk| if kk >= rsc { 0 } else { kk / (s * cg) * dh * pitch + kk % (s * cg) / cg * dw * pix + kk % cg })
            .collect();
        let origin = |m: usize| m / tq * sh * pitch + m % tq * sw * pix;
        let (tiles_q, tiles) = (qq.div_ceil(tq), pp.div_ceil(tp) * qq.div_ceil(tq));
        let mut out: Vec<Option<f32>> = vec![None; n * pp * qq * k];
        for block in 0..groups / gb {
            let k0 = block * kb;
            for t_idx in 0..n * tiles {
                let (ni, tt) = (t_idx / tiles, t_idx % tiles);
                let (p0, q0) = (tt / tiles_q * tp, tt % tiles_q * tq);
                let (ih0, iw0) = ((p0 * sh) as i64 - p.pads[0], (q0 * sw) as i64 - p.pads[1]);
                let mut patch: Vec<Option<f32>> = vec![None; in_rows * pitch];
                for i in 0..in_rows * in_cols * (cb / 8) {
                    let (pixel, c8) = (i / (cb / 8), i % (cb / 8) * 8);
                    let (ih, iw) = (ih0 + (pixel / in_cols) as i64, iw0 + (pixel % in_cols) as i64);
                    let inside = (0..h as i64).contains(&ih) && (0..w as i64).contains(&iw);
                    for j in 0..8 {
                        let v = if inside {
                            x[((ni * h + ih as usize) * w + iw as usize) * c + block * cb + c8 + j]
                        } else {
                            0.0
                        };
                        let slot = &mut patch[pixel * pix + c8 + j];
                        assert!(slot.is_none(), "staged element {} written twice", pixel * pix + c8 + j);
                        *slot = Some(v);
                    }
                }
                for g in 0..gb {
                    for m in 0..128 {
                        let (pi, qi) = (p0 + m / tq, q0 + m % tq);
                        let row: Vec<f32> = (0..kp)
                            .step_by(8)
                            .flat_map(|run| {
                                let start = origin(m) + g * cg + coff[run];
                                // A run is 8 channels of one staged pixel (16 bytes, aligned).
                                assert!(start % 8 == 0 && start % pix + 8 <= cb, "run {run} of pixel {m} straddles");
                                (0..8).map(move |j| start + j)
                            })
                            .map(|i| patch.get(i).copied().flatten().expect("a read of an unstaged element"))
                            .collect();
                        if pi >= pp || qi >= qq {
                            continue;
                        }
                        for j in 0..kg {
                            let kc = k0 + g * kg + j;
                            let v = (0..kp).map(|kk| row[kk] * wt[kc * kp + kk]).sum::<f32>();
                            let o = ((ni * pp + pi) * qq + qi) * k + kc;
                            assert!(out[o].is_none(), "output {o} stored twice");
                            out[o] = Some(v);
                        }
                    }
                }
            }
        }
        out.into_iter().enumerate().map(|(i, v)| v.unwrap_or_else(|| panic!("output {i} never stored"))).collect()
    }

    /// The grouped kernel's index math gives the reference convolution exactly (small integers)
    /// for ResNeXt-50's groups of 4 (merged in pairs, 4 kernel groups a block: padded pixels),
    /// strided groups of 8 (2 a block), groups of 16 (2 a block) dilated, RegNetY's 24 (one a
    /// block), and a 5x5 filter on a map narrower than a tile (2 groups of 16 a block).
    #[test]
    fn group_mma_kernel_index_math_matches_the_reference() {
        let cases: [([i64; 3], [i64; 3], ConvGeom, i64); 5] = [
            ([10, 18, 64], [64, 3, 3], geom(1, 1, 16), 4),
            ([11, 13, 64], [64, 3, 3], geom(2, 1, 8), 2),
            ([9, 12, 64], [64, 3, 3], ConvGeom { strides: [1, 1], pads: [2; 4], dilations: [2, 2], group: 4 }, 2),
            ([7, 9, 48], [48, 3, 3], geom(1, 1, 2), 1),
            ([9, 5, 32], [16, 5, 5], geom(1, 2, 2), 2),
        ];
        for (i, ([h, w, c], [k, r, s], g, group_block)) in cases.into_iter().enumerate() {
            let n = 2;
            let p = ConvProblem { group: g.group as i64, ..problem_of(n, [h, w, c], [k, r, s], &g) };
            let tile = group_mma_tile(&p).unwrap_or_else(|| panic!("case {i} takes the grouped kernel"));
            assert_eq!(tile.group_block, group_block, "case {i}: {tile:?}");
            let cg = c / g.group as i64;
            let xv = small_ints((n * h * w * c) as usize, 23 + i as u64);
            let wv = small_ints((k * r * s * cg) as usize, 29 + i as u64);
            let wa = ArrayD::from_shape_vec(IxDyn(&[k, r, s, cg].map(|v| v as usize)), wv).expect("w");
            let merged = merge_group_weights(&Tensor::F32(wa.clone()), g.group, tile.merge as usize).expect("merge");
            let Tensor::F32(flat) = patch_weights(&merged, None, tile.columns).expect("flatten") else {
                panic!("f32 weights")
            };
            let got = simulate_group_mma(&xv, n as usize, &p, &tile, flat.as_slice().expect("contiguous"));
            let xa = ArrayD::from_shape_vec(IxDyn(&[n, h, w, c].map(|v| v as usize)), xv).expect("x");
            let want = crate::reference::kernel::conv::conv2d(Layout::Nhwc, &g, &xa, &wa, None, None, None, None)
                .expect("reference");
            assert_eq!(got, want.iter().copied().collect::<Vec<f32>>(), "case {i}: {tile:?}");
        }
    }

    /// Merging groups only adds zero products: the reference convolution with the merged
    /// (block-diagonal) weights and half the groups equals the original, for groups of 4 into 8
    /// and of 12 into 24, strided and padded.
    #[test]
    fn merged_group_weights_compute_the_same_convolution() {
        use crate::ir::ops::conv::Geom3;
        use crate::reference::conv::conv;
        for (c, groups, stride) in [(16usize, 4usize, 1usize), (48, 4, 2)] {
            let (n, hw, cg) = (2usize, 9usize, c / groups);
            let k = c;
            let geom = Geom3::lift(
                &[hw, hw],
                &[3, 3],
                &[stride, stride],
                &[1, 1],
                &[1, 1],
                &[1, 1],
                &[(hw + 2 - 3) / stride + 1, (hw + 2 - 3) / stride + 1],
            )
            .expect("geometry");
            let x: Vec<f32> = (0..n * c * hw * hw).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
            // KRSC weights [K, 3, 3, Cg], and the reference's [K, Cg, 3, 3].
            let w = Tensor::from_f32s(
                &[k, 3, 3, cg],
                (0..k * 9 * cg).map(|i| ((i * 53 % 97) as f32 - 48.0) / 40.0).collect(),
            );
            let kcrs =
                |t: &Tensor| -> Vec<f32> { t.to_f32().permuted_axes(IxDyn(&[0, 3, 1, 2])).iter().copied().collect() };
            let bias: Vec<f32> = (0..k).map(|i| i as f32 * 0.1).collect();
            let want = conv(&x, n, c, &kcrs(&w), k, Some(&bias), &geom, groups).expect("original");
            let merged = merge_group_weights(&w, groups, 2).expect("merges");
            assert_eq!(merged.shape(), &[k, 3, 3, 2 * cg]);
            let got = conv(&x, n, c, &kcrs(&merged), k, Some(&bias), &geom, groups / 2).expect("merged");
            assert_eq!(got.len(), want.len());
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "c {c}, element {i}: {a} against {b}");
            }
        }
        let w = Tensor::from_f32s(&[12, 3, 3, 4], vec![1.0; 12 * 36]);
        assert!(merge_group_weights(&w, 3, 2).is_err(), "3 groups do not pair up");
    }

    /// Grouped convolutions whose groups hold 32 filters (ResNeXt-50's last stage) compute one
    /// group per tile with the optimized iterators, NCHW ones included (OIHW weights permuted to
    /// KRSC [K, R, S, C / group] at compile time).
    #[test]
    fn one_group_per_tile_and_nchw_grouped_weights() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(64), Dim::known(7), Dim::known(7)]);
        // OIHW [64, 32, 3, 3]: w[k, c, r, s] = 100k + 10c + 3r + s (exact in fp16 below 2048).
        let w = b.konst("w", &[64, 32, 3, 3], |i| {
            let (k, c, r, s_) = (i / 288, i / 9 % 32, i / 3 % 3, i % 3);
            ((k % 16) * 100 + c * 10 + r * 3 + s_) as f32
        });
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 1, 2), act: None, pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["transpose", "conv2d_library", "transpose"]
        );
        let conv = &p.kernels[1];
        for config in dispatch_configs(conv) {
            assert!(config.ends_with(" kOptimized single g2 a8"), "{config}");
        }
        let wt = &p.tensors[conv.args[1]];
        assert_eq!(wt.shape, [64, 3, 3, 32].map(Dim::known).to_vec());
        let wl = weight_f32(&p, conv.args[1]);
        for (k, r, s_, c) in [(0, 0, 0, 0), (17, 2, 1, 31), (63, 1, 2, 5)] {
            assert_eq!(wl[((k * 3 + r) * 3 + s_) * 32 + c], ((k % 16) * 100 + c * 10 + r * 3 + s_) as f32);
        }
    }

    #[test]
    fn nchw_runs_between_layout_transforms() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(16), Dim::known(10), Dim::known(12)]);
        // OIHW weights: w[k, c, r, s] = 1000k + 100c + 10r + s.
        let w = b
            .konst("w", &[32, 16, 3, 3], |i| ((i / 144) * 1000 + (i / 9 % 16) * 100 + (i / 3 % 3) * 10 + i % 3) as f32);
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 1, 1), act: Some(Act::Relu), pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["transpose", "conv2d_library", "transpose"]
        );
        let (tin, conv, tout) = (&p.kernels[0], &p.kernels[1], &p.kernels[2]);
        assert_eq!(
            (tin.context["batches"].as_str(), tin.context["rows"].as_str(), tin.context["cols"].as_str()),
            (Some("(dims.v[0])"), Some("16"), Some("120"))
        );
        assert_eq!((tout.context["rows"].as_str(), tout.context["cols"].as_str()), (Some("120"), Some("32")));
        assert_eq!(conv.args[0], tin.args[1]);
        assert_eq!(conv.args[2], tout.args[0]);
        assert_eq!(
            (conv.context["h"].as_i64(), conv.context["c"].as_i64(), conv.context["k"].as_i64()),
            (Some(10), Some(16), Some(32))
        );
        // The weights were permuted to KRSC: element [k=1, r=2, s=1, c=3] at ((1*3 + 2)*3 + 1)*16 + 3.
        let Storage::Weight { offset, .. } = p.tensors[conv.args[1]].storage else { panic!("weight") };
        let (k, r, s, c) = (1, 2, 1, 3);
        let at = offset as usize + 2 * (((k * 3 + r) * 3 + s) * 16 + c);
        assert_eq!(half::f16::from_le_bytes([p.weights[at], p.weights[at + 1]]).to_f32(), 1321.0);

        // With a residual (K == C) it is transposed too; a 1-channel input needs no transform.
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(8), Dim::known(6), Dim::known(6)]);
        let w = b.konst("w", &[8, 8, 1, 1], |_| 1.0);
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 0, 1), act: None, pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), None, Some(x)]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["transpose", "transpose", "conv2d_library", "transpose"]
        );
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(1), Dim::known(6), Dim::known(6)]);
        let w = b.konst("w", &[4, 1, 3, 3], |_| 1.0);
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 1, 1), act: None, pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), None, None]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        assert_eq!(p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(), ["conv2d_direct", "transpose"]);
    }

    #[test]
    fn pre_activation_with_residual_reaches_the_epilogue() {
        let mut b = G::new();
        let x = b.input("x", nhwc(14, 14, 16));
        let w = b.konst("w", &[16, 3, 3, 16], |_| 1.0);
        let op = Box::new(Conv2d {
            layout: Layout::Nhwc,
            geom: geom(1, 1, 1),
            act: Some(Act::Sigmoid),
            pre_act: Some(Act::Relu),
        });
        b.node("c", op, vec![Some(x), Some(w), None, Some(x)]);
        let p = lower_with(&b.g, lower_conv2d).expect("lowers");
        let k = only_kernel(&p, "conv2d_library");
        assert_eq!(k.context["pre_act"], "o2a_relu(v)");
        assert_eq!(k.context["act"], "o2a_sigmoid(v)");
        assert_eq!(k.context["epilogue"], "o2a_sigmoid(o2a_relu(v))");
        assert_eq!(k.context["bias_index"], -1);
    }

    /// ResNet-50-like convolutions (1x1, 3x3, 1x1 stride-2 projection, the 7x7 stem kernel,
    /// residual + relu), the depthwise kernel (with residual) and a grouped library convolution
    /// render.
    #[test]
    fn examples_render() {
        let mut b = G::new();
        let x = b.input("image", nhwc(224, 224, 3));
        let w = b.konst("stem.w", &[64, 7, 7, 3], |i| (i % 5) as f32);
        let bias64 = b.konst("b64", &[64], |_| 0.1);
        let stem = b.node("stem", conv_op(2, 3, 1, Some(Act::Relu)), vec![Some(x), Some(w), Some(bias64), None]);
        let w1 = b.konst("w1", &[64, 1, 1, 64], |_| 0.1);
        let y1 = b.node("conv1x1", conv_op(1, 0, 1, Some(Act::Relu)), vec![Some(stem), Some(w1), Some(bias64), None]);
        let w3 = b.konst("w3", &[64, 3, 3, 64], |_| 0.1);
        let y3 = b.node("conv3x3", conv_op(1, 1, 1, Some(Act::Relu)), vec![Some(y1), Some(w3), Some(bias64), None]);
        let wr = b.konst("wr", &[64, 1, 1, 64], |_| 0.1);
        let add = b.node(
            "conv_add_relu",
            conv_op(1, 0, 1, Some(Act::Relu)),
            vec![Some(y3), Some(wr), Some(bias64), Some(y1)],
        );
        let wp = b.konst("wp", &[128, 1, 1, 64], |_| 0.1);
        let bias128 = b.konst("b128", &[128], |_| 0.1);
        let proj = b.node("proj", conv_op(2, 0, 1, None), vec![Some(add), Some(wp), Some(bias128), None]);
        let wd = b.konst("wd", &[128, 3, 3, 1], |_| 0.1);
        let dw_op = Box::new(Conv2d {
            layout: Layout::Nhwc,
            geom: geom(1, 1, 128),
            act: Some(Act::Clip { lo: 0.0, hi: 6.0 }),
            pre_act: Some(Act::Relu),
        });
        let dw = b.node("depthwise", dw_op, vec![Some(proj), Some(wd), Some(bias128), Some(proj)]);
        let wg = b.konst("wg", &[128, 3, 3, 32], |_| 0.1);
        b.node("grouped", conv_op(1, 1, 4, Some(Act::Silu)), vec![Some(dw), Some(wg), None, None]);
        let pre_res =
            Box::new(Conv2d { layout: Layout::Nhwc, geom: geom(1, 1, 1), act: None, pre_act: Some(Act::Relu) });
        let y = b.node("pre_act_residual", pre_res, vec![Some(y3), Some(w3), None, Some(y3)]);
        let dil = Box::new(Conv2d {
            layout: Layout::Nhwc,
            geom: ConvGeom { strides: [2, 1], pads: [2, 1, 0, 3], dilations: [2, 3], group: 1 },
            act: Some(Act::LeakyRelu { alpha: 0.1 }),
            pre_act: None,
        });
        b.node("dilated", dil, vec![Some(y), Some(w3), Some(bias64), None]);
        let p = lower_named(&b.g, lower_conv2d, "conv").expect("lowers");
        let files = render_all(&p);
        let templates: Vec<&str> = p.kernels.iter().map(|k| k.template.as_str()).collect();
        assert_eq!(
            templates,
            [
                "conv2d_stem",
                "conv2d_library",
                "conv2d_library",
                "conv2d_library",
                "conv2d_library",
                "conv2d_depthwise",
                "conv2d_library",
                "conv2d_library",
                "conv2d_library"
            ]
        );
        for (name, text) in &files {
            assert!(text.contains(&format!("int {}(void* const* t, o2a_dims dims", &name[..name.len() - 3])), "{name}");
            assert!(!text.contains("{{"), "{name}: unrendered handlebars");
        }
    }

    /// An NCHW convolution with a residual renders: its layout transforms, the NHWC kernel.
    #[test]
    fn nchw_example_renders() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(16), Dim::known(20), Dim::known(20)]);
        let w = b.konst("w", &[16, 16, 3, 3], |i| (i % 11) as f32 * 0.01);
        let bias = b.konst("b", &[16], |_| 0.1);
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 1, 1), act: Some(Act::Relu), pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), Some(bias), Some(x)]);
        let p = lower_named(&b.g, lower_conv2d, "nchw").expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["transpose", "transpose", "conv2d_library", "transpose"]
        );
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("templates/cuda/kernels/transpose.cu.hbs");
        if root.exists() {
            render_all(&p);
        }
    }

    fn f32_at(p: &Program, t: TensorId, i: usize) -> f32 {
        let Storage::Weight { offset, .. } = p.tensors[t].storage else { panic!("not a weight") };
        let o = offset as usize + 4 * i;
        f32::from_le_bytes([p.weights[o], p.weights[o + 1], p.weights[o + 2], p.weights[o + 3]])
    }

    /// fp32 precision: no library instance (the target is never asked), no stem padding; every
    /// convolution runs the direct kernel on fp32 tensors with fp32 weights (RSCK when constant).
    #[test]
    fn fp32_convolutions_run_the_direct_kernel() {
        let mut b = G::new();
        let x = b.input("x", nhwc(224, 224, 3));
        let w = b.konst("w", &[64, 7, 7, 3], |i| i as f32 * 0.5);
        let bias = b.konst("b", &[64], |i| i as f32);
        let stem = b.node("stem", conv_op(2, 3, 1, Some(Act::Relu)), vec![Some(x), Some(w), Some(bias), None]);
        let w3 = b.konst("w3", &[64, 3, 3, 64], |_| 0.25);
        b.node("res", conv_op(1, 1, 1, Some(Act::Relu)), vec![Some(stem), Some(w3), Some(bias), Some(stem)]);
        let p = lower_at(&b.g, lower_conv2d, "conv32", Precision::Fp32).expect("lowers");
        assert_eq!(p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(), ["conv2d_direct"; 2]);
        assert!(p.library.is_empty());
        assert!(p.tensors.iter().all(|t| t.dtype == DType::F32), "every tensor is fp32");
        let stem_k = &p.kernels[0];
        assert_eq!(stem_k.context["c"], 3, "the stem is not padded");
        assert_eq!(
            (stem_k.context["ctype"].as_str(), stem_k.context["to_float"].as_str()),
            (Some("float"), Some("o2a_to_float"))
        );
        assert_eq!(
            (stem_k.context["from_float"].as_str(), stem_k.context["half"].as_bool()),
            (Some("o2a_from_float<float>"), Some(false))
        );
        assert_eq!(stem_k.context["k_per_thread"], 8);
        // Constant weights RSCK [7,7,3,64] in fp32: w[k, r, s, c] at ((r*7 + s)*3 + c)*64 + k.
        let wt = stem_k.args[1];
        assert_eq!(p.tensors[wt].shape, vec![Dim::known(7), Dim::known(7), Dim::known(3), Dim::known(64)]);
        let Storage::Weight { bytes, .. } = p.tensors[wt].storage else { panic!("weight") };
        assert_eq!(bytes, 64 * 7 * 7 * 3 * 4);
        let (k, r, s, c) = (5, 2, 4, 1);
        let src = ((k * 7 + r) * 7 + s) * 3 + c;
        assert_eq!(f32_at(&p, wt, ((r * 7 + s) * 3 + c) * 64 + k), src as f32 * 0.5);
        let res_k = &p.kernels[1];
        assert_eq!(
            (res_k.context["has_residual"].as_bool(), res_k.context["res_index"].as_i64()),
            (Some(true), Some(3))
        );
        for (name, text) in render_all(&p) {
            assert!(text.contains("const float* __restrict__ x"), "{name}");
            assert!(text.contains("__ldg(w4)"), "{name}: 8 channels per thread load fp32 weights as float4");
            assert!(!text.contains("half"), "{name} mentions half");
        }
    }

    /// fp32 precision with NCHW, grouped, depthwise and run-time weights: the layout transforms
    /// move floats, run-time KRSC weights keep their strides.
    #[test]
    fn fp32_nchw_grouped_and_runtime_weights() {
        let mut b = G::new();
        let x = b.input("x", vec![Dim::sym("N"), Dim::known(16), Dim::known(10), Dim::known(12)]);
        let w = b.konst("w", &[32, 16, 3, 3], |i| i as f32);
        let op = Box::new(Conv2d { layout: Layout::Nchw, geom: geom(1, 1, 1), act: None, pre_act: None });
        b.node("c", op, vec![Some(x), Some(w), None, None]);
        let p = lower_at(&b.g, lower_conv2d, "nchw32", Precision::Fp32).expect("lowers");
        assert_eq!(
            p.kernels.iter().map(|k| k.template.as_str()).collect::<Vec<_>>(),
            ["transpose", "conv2d_direct", "transpose"]
        );
        assert_eq!(p.kernels[0].context["ctype"], "float");
        assert_eq!(p.kernels[2].context["ctype"], "float");
        render_all(&p);

        let mut b = G::new();
        let x = b.input("x", nhwc(28, 28, 64));
        let wd = b.konst("wd", &[64, 3, 3, 1], |_| 1.0);
        let y = b.node("dw", conv_op(1, 1, 64, None), vec![Some(x), Some(wd), None, None]);
        let wr = b.input("wr", vec![Dim::known(12), Dim::known(1), Dim::known(1), Dim::known(64)]);
        b.node("runtime_w", conv_op(1, 0, 1, None), vec![Some(y), Some(wr), None, None]);
        let p = lower_at(&b.g, lower_conv2d, "dw32", Precision::Fp32).expect("lowers");
        assert!(p.kernels.iter().all(|k| k.template == "conv2d_direct"));
        let rt = &p.kernels[1];
        assert_eq!(rt.context["k_per_thread"], 4);
        assert_eq!(
            ["w_stride_k", "w_stride_r", "w_stride_s", "w_stride_c"].map(|f| rt.context[f].as_i64().unwrap()),
            [64, 64, 64, 1]
        );
        assert_eq!(p.tensors[rt.args[1]].dtype, DType::F32);
        render_all(&p);
    }
}
