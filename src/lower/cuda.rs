//! The CUDA target: which kernel computes each convolution and matrix product.
//!
//! Library instances are CUTLASS 2.x kernels with the Sm80 tensor-core mainloop (`mma.sync`
//! m16n8k16, `cp.async` multistage pipelines). They run on sm_80 and on every later GPU, so one
//! instance table serves `sm_80`, `sm_90` and `sm_90a` builds; Hopper-only (TMA/wgmma) instances
//! come with profiling (issue 6). fp16 operands, fp32 accumulation, fused epilogues (bias,
//! residual, activations through the pointwise functions of `common.cuh`).
//!
//! What CUTLASS gets, and what falls back to our own kernels:
//! - convolution (`conv2d_cutlass`): group 1, C % 8 == 0 and K % 8 == 0 (every access is 8 halfs,
//!   16 bytes). The lowering pads a thin stem (C = 3) to 8 channels first, see
//!   `ops::conv`. Everything else → `conv2d_direct`.
//! - matrix product (`gemm_cutlass`): the contiguous dim of each operand (K of a row-major A, M of
//!   a transposed A, N of B, K of a transposed B) and N of the output are multiples of 8; bias
//!   absent or one value per output column; when bias and residual are both present, beta == 1
//!   (the residual-block epilogue adds the bias unscaled). Everything else → `gemm_generic`.
//!
//! Tile heuristic (until issue 6 profiles instances): one small table of tile shapes, largest
//! first; a tile is skipped when it is twice as wide or tall as the problem (M ≤ 64 or N ≤ 64
//! rules out the 128 side); the first tile whose grid fills every SM at least once
//! (CTAs ≥ SM count) wins, otherwise the smallest tile (most CTAs). Problem sizes that depend on
//! the run-time batch are judged at [`CudaTarget::with_batch_hint`] (default
//! [`DEFAULT_BATCH_HINT`]).
//!
//! Iterator algorithm of the convolution: `kFixedChannels` when C == 8 (the padded stem: the GEMM-K
//! loop walks filter taps × 8 channels with no masked lanes; `kOptimized` would spend a 32-wide
//! K slice on each 8-channel tap), `kAnalytic` when a filter side exceeds 32 (the optimized
//! iterator's mask bits), `kOptimized` otherwise.
//!
//! Workspace: every instance runs without split-K, so none needs a workspace; each launcher still
//! checks `get_workspace_size` against what it is given and fails with a message rather than launch.

use super::problem::{BiasKind, ConvProblem, GemmProblem};
use super::target::{Instance, Target};
use crate::build::nvcc::Arch;
use crate::ir::Dim;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeMap;

/// Batch size at which problem sizes that depend on the run-time batch are judged.
pub const DEFAULT_BATCH_HINT: i64 = 32;

/// Channel multiple of CUTLASS's 128-bit fp16 accesses.
const ALIGNMENT: i64 = 8;

/// A threadblock tile of the Sm80 tensor-core mainloop, with its warp tile and pipeline depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub warp_m: i64,
    pub warp_n: i64,
    pub warp_k: i64,
    pub stages: i64,
}

impl Tile {
    const fn new(tb: [i64; 3], warp: [i64; 3], stages: i64) -> Tile {
        Tile { m: tb[0], n: tb[1], k: tb[2], warp_m: warp[0], warp_n: warp[1], warp_k: warp[2], stages }
    }

    /// Shared memory of the mainloop pipeline (A and B tiles of every stage, fp16).
    pub fn smem_bytes(&self) -> i64 {
        (self.m + self.n) * self.k * 2 * self.stages
    }

    fn context(&self, swizzle: i64) -> Map<String, Json> {
        let mut c = Map::new();
        for (key, v) in [
            ("tile_m", self.m),
            ("tile_n", self.n),
            ("tile_k", self.k),
            ("warp_m", self.warp_m),
            ("warp_n", self.warp_n),
            ("warp_k", self.warp_k),
            ("stages", self.stages),
            ("swizzle", swizzle),
        ] {
            c.insert(key.into(), json!(v));
        }
        c
    }
}

/// The tile table, largest first. Four warps each (128 threads); 40–64 KiB of shared memory, so
/// two or more CTAs fit on an SM of either architecture. 128x128x32/4 is the configuration of
/// shared/cutlass case 2a (verified on the H200); the others are the standard CUTLASS sm80
/// profiler shapes with the same warp-level MMA.
pub const TILES: [Tile; 4] = [
    Tile::new([128, 128, 32], [64, 64, 32], 4),
    Tile::new([128, 64, 32], [64, 32, 32], 4),
    Tile::new([64, 128, 32], [32, 64, 32], 4),
    Tile::new([64, 64, 32], [32, 32, 32], 5),
];

/// Picks a tile for a GEMM of `m` x `n` (`batches` independent problems) on `sms` SMs.
pub fn pick_tile(m: i64, n: i64, batches: i64, sms: i64) -> Tile {
    // A 128 side is wasted on a dim of at most 64.
    let fits = |t: &&Tile| !(t.m > 64 && m <= 64 || t.n > 64 && n <= 64);
    let ctas = |t: &Tile| ((m + t.m - 1) / t.m) * ((n + t.n - 1) / t.n) * batches.max(1);
    let candidates: Vec<&Tile> = TILES.iter().filter(fits).collect();
    if let Some(t) = candidates.iter().find(|t| ctas(t) >= sms) {
        return **t;
    }
    // No tile fills the GPU: the one with the most CTAs (the smallest).
    TILES[TILES.len() - 1]
}

/// Whether a dim is a multiple of `q` for every value of the batch (every coefficient of its
/// polynomial is).
pub fn multiple_of(d: &Dim, q: i64) -> bool {
    d.terms().all(|(_, c)| c % q == 0)
}

pub struct CudaTarget {
    arch: Arch,
    batch_hint: i64,
}

impl CudaTarget {
    pub fn new(arch: Arch) -> CudaTarget {
        CudaTarget { arch, batch_hint: DEFAULT_BATCH_HINT }
    }

    /// The batch at which tile shapes are chosen for a model with a run-time batch (e.g. the
    /// `--max-batch` the model is built for, or the batch it is expected to serve).
    pub fn with_batch_hint(mut self, batch: i64) -> CudaTarget {
        self.batch_hint = batch.max(1);
        self
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// SM count of the architecture's flagship part (A100: 108; H100/H200: 132).
    fn sms(&self) -> i64 {
        match self.arch {
            Arch::Sm80 => 108,
            Arch::Sm90 | Arch::Sm90a => 132,
        }
    }

    /// The value of a dim with every symbol (the batch) set to the batch hint.
    fn estimate(&self, d: &Dim) -> i64 {
        let env: BTreeMap<String, i64> = d.symbols().map(|s| (s.to_string(), self.batch_hint)).collect();
        d.eval(&env).as_known().unwrap_or(self.batch_hint).max(1)
    }

    /// The direct convolution: a thread computes up to 8 consecutive output channels of one pixel,
    /// within one group.
    fn conv_direct(&self, p: &ConvProblem) -> Instance {
        let kg = if p.group > 0 { p.k / p.group } else { p.k };
        let k_per_thread = [8, 4, 2, 1].into_iter().find(|v| kg % v == 0).unwrap_or(1);
        let mut context = Map::new();
        context.insert("k_per_thread".into(), json!(k_per_thread));
        context.insert("block_threads".into(), json!(256));
        Instance { template: "conv2d_direct".into(), context, workspace_bytes: 0 }
    }
}

impl Target for CudaTarget {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn conv2d(&self, p: &ConvProblem) -> Instance {
        let library = p.group == 1 && p.c % ALIGNMENT == 0 && p.k % ALIGNMENT == 0 && p.c > 0 && p.k > 0;
        if !library {
            return self.conv_direct(p);
        }
        let gemm_m = self.estimate(&p.n) * p.p * p.q;
        let tile = pick_tile(gemm_m, p.k, 1, self.sms());
        let iterator = if p.c == ALIGNMENT {
            "kFixedChannels"
        } else if p.r > 32 || p.s > 32 {
            "kAnalytic"
        } else {
            "kOptimized"
        };
        let mut context = tile.context(4);
        context.insert("iterator".into(), json!(iterator));
        Instance { template: "conv2d_cutlass".into(), context, workspace_bytes: 0 }
    }

    fn gemm(&self, p: &GemmProblem) -> Instance {
        let a_contiguous = if p.trans_a { &p.m } else { &p.k };
        let b_contiguous = if p.trans_b { &p.k } else { &p.n };
        let aligned = multiple_of(a_contiguous, ALIGNMENT)
            && multiple_of(b_contiguous, ALIGNMENT)
            && multiple_of(&p.n, ALIGNMENT);
        let bias_ok = matches!(p.bias, None | Some(BiasKind::PerColumn));
        // The residual-block epilogue adds the bias vector unscaled.
        let beta_ok = !(p.residual && p.bias.is_some() && p.beta != 1.0);
        if !(aligned && bias_ok && beta_ok) {
            return Instance { template: "gemm_generic".into(), context: Map::new(), workspace_bytes: 0 };
        }
        let tile = pick_tile(self.estimate(&p.m), self.estimate(&p.n), self.estimate(&p.batch_count), self.sms());
        Instance { template: "gemm_cutlass".into(), context: tile.context(8), workspace_bytes: 0 }
    }

    fn conv_channel_multiple(&self) -> usize {
        ALIGNMENT as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(n: Dim, hw: i64, c: i64, k: i64, rs: i64, group: i64) -> ConvProblem {
        ConvProblem {
            n,
            h: hw,
            w: hw,
            c,
            k,
            r: rs,
            s: rs,
            p: hw,
            q: hw,
            pads: [rs / 2; 4],
            strides: [1, 1],
            dilations: [1, 1],
            group,
            bias: true,
            residual: false,
            pre_act: None,
            act: None,
        }
    }

    fn gemm(m: Dim, n: i64, k: i64) -> GemmProblem {
        GemmProblem {
            batch_count: Dim::known(1),
            m,
            n: Dim::known(n),
            k: Dim::known(k),
            trans_a: false,
            trans_b: true,
            a_batched: false,
            b_batched: false,
            b_constant: true,
            alpha: 1.0,
            beta: 1.0,
            bias: Some(BiasKind::PerColumn),
            residual: false,
            act: None,
        }
    }

    #[test]
    fn tiles_fit_shared_memory_and_warps() {
        for t in TILES {
            assert!(t.smem_bytes() <= 64 * 1024, "{t:?}");
            assert_eq!((t.m / t.warp_m) * (t.n / t.warp_n), 4, "{t:?}: four warps");
            assert_eq!(t.k, t.warp_k);
        }
    }

    #[test]
    fn tile_heuristic() {
        // Big problem: the largest tile.
        assert_eq!(pick_tile(100_352, 256, 1, 132), TILES[0]);
        // 64 output channels: no 128-wide tile.
        assert_eq!(pick_tile(100_352, 64, 1, 132).n, 64);
        // ResNet-50 stage 4 at batch 32 (M = 1568, N = 512): only 64x64 fills 132 SMs.
        assert_eq!(pick_tile(1568, 512, 1, 132), TILES[3]);
        // Tiny: the smallest tile.
        assert_eq!(pick_tile(8, 8, 1, 132), TILES[3]);
        // Batched attention scores, 12 heads x 32 images of 128x128: plenty of CTAs.
        assert_eq!(pick_tile(128, 128, 384, 132), TILES[0]);
    }

    #[test]
    fn conv_instances() {
        let t = CudaTarget::new(Arch::Sm90);
        let n = Dim::sym("N");
        let i = t.conv2d(&conv(n.clone(), 56, 64, 64, 3, 1));
        assert_eq!(i.template, "conv2d_cutlass");
        assert_eq!(i.context["iterator"], "kOptimized");
        assert_eq!(i.workspace_bytes, 0);
        // The padded stem.
        assert_eq!(t.conv2d(&conv(n.clone(), 224, 8, 64, 7, 1)).context["iterator"], "kFixedChannels");
        // Unpadded 3 channels, grouped, depthwise, odd K: direct.
        for p in [
            conv(n.clone(), 224, 3, 64, 7, 1),
            conv(n.clone(), 56, 64, 64, 3, 2),
            conv(n.clone(), 56, 32, 32, 3, 32),
            conv(n.clone(), 56, 64, 10, 1, 1),
        ] {
            assert_eq!(t.conv2d(&p).template, "conv2d_direct", "{p:?}");
        }
        assert_eq!(t.conv2d(&conv(n.clone(), 56, 32, 32, 3, 32)).context["k_per_thread"], 1);
        assert_eq!(t.conv2d(&conv(n.clone(), 56, 64, 12, 1, 1)).context["k_per_thread"], 4);
        // Big filters: analytic iterator.
        assert_eq!(t.conv2d(&conv(n, 64, 64, 64, 33, 1)).context["iterator"], "kAnalytic");
        assert_eq!(t.conv_channel_multiple(), 8);
    }

    #[test]
    fn gemm_instances() {
        let t = CudaTarget::new(Arch::Sm80);
        let n = Dim::sym("N");
        assert_eq!(t.gemm(&gemm(n.clone(), 1000, 2048)).template, "gemm_cutlass");
        assert_eq!(t.gemm(&gemm(n.clone(), 1000, 2047)).template, "gemm_generic");
        assert_eq!(t.gemm(&gemm(n.clone(), 1001, 2048)).template, "gemm_generic");
        // A transposed: M must be a multiple of 8 for every batch.
        let mut p = gemm(n.mul(&Dim::known(8)), 1000, 24);
        p.trans_a = true;
        assert_eq!(t.gemm(&p).template, "gemm_cutlass");
        p.m = n.mul(&Dim::known(4));
        assert_eq!(t.gemm(&p).template, "gemm_generic");
        // General bias broadcast, and bias + residual with beta != 1: generic.
        let mut p = gemm(n.clone(), 1000, 2048);
        p.bias = Some(BiasKind::General);
        assert_eq!(t.gemm(&p).template, "gemm_generic");
        let mut p = gemm(n.clone(), 1000, 2048);
        p.residual = true;
        p.beta = 0.5;
        assert_eq!(t.gemm(&p).template, "gemm_generic");
        p.bias = None;
        assert_eq!(t.gemm(&p).template, "gemm_cutlass");
    }

    #[test]
    fn symbolic_multiples() {
        let n = Dim::sym("N");
        assert!(multiple_of(&n.mul(&Dim::known(128)), 8));
        assert!(!multiple_of(&n, 8));
        assert!(multiple_of(&Dim::known(64), 8));
        assert!(!multiple_of(&n.mul(&Dim::known(8)).add(&Dim::known(4)), 8));
    }
}
