//! The ROCm target: AMD CDNA GPUs (MI200 = gfx90a, MI300 = gfx942), compiled with clang-19 in HIP
//! mode (`crate::build::hip`).
//!
//! Library instances are Composable Kernel (CK) device operations behind the same ABI as the
//! CUDA target's CUTLASS instances (`O2aConvArgs` / `O2aGemmArgs`, `templates/rocm/library.cuh.hbs`),
//! so the node kernels (`conv2d_library`, `gemm_library`) are shared:
//! - convolutions (group 1, C % 8 == 0, K % 8 == 0): `DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle`
//!   on NHWGC input, GKYXC weights and NHWGK output with G = 1 — the same bytes as the NHWC / KRSC
//!   tensors the lowering produces (`templates/rocm/library/conv2d_ck.cu.hbs`);
//! - matrix products (A with K contiguous, per-column or no bias, N % 8 == 0):
//!   `DeviceGemmMultipleD_Xdl_CShuffle` with B row- or column-major
//!   (`templates/rocm/library/gemm_ck.cu.hbs`); a batched product runs one launch per matrix.
//!
//! Both fuse the whole epilogue — bias, the pre-activation, the residual add and the activation,
//! in fp32 — through one project-defined CK element-wise functor (`O2aEpilogue` in the
//! templates) rather than CK's fixed AddRelu / AddAddRelu / AddFastGelu: one functor covers every
//! activation the CUDA epilogues have (relu, clip, sigmoid, silu, gelu, hardswish, …) with the
//! same expressions (`templates/cuda/partials/pointwise.hbs`), in the CUDA path's order.
//!
//! Tile configurations (all 256 threads = 4 wavefronts of 64 in a 2x2 grid, XDL 32x32x8 fp16
//! MFMA, K tile 32, fp32 accumulation and C-shuffle): [`CK_TILES`]. The heuristic
//! ([`pick_ck_tile`]), documented since no AMD GPU has timed them: the largest tile that is not
//! more than twice the problem on a side and whose grid still has a workgroup per compute unit
//! (110 on an MI250X GCD, 304 on an MI300X); when none has, the smallest tile (most workgroups).
//! It is CUDA's `pick_tile` rule with CU counts in place of SM counts. Every tile that passes
//! a problem's checks is a candidate the profiler times on an AMD GPU (`onnx2ait profile
//! --target rocm`); with profiled times the fastest runs (`lower::choice`, shared with CUDA).
//!
//! CK checks part of a configuration's fitness only at run time (`IsSupportedArgument`), so
//! [`ck_conv_check`] and [`ck_gemm_check`] repeat those checks on the CPU for the problem's
//! shape at every batch range: vector widths against the contiguous dims, the 1x1 filter
//! specialisation, CK's 32-bit indexing (every tensor under 2 GiB). A problem no tile passes
//! runs on our own kernels; an instance never gets a problem it would refuse.
//!
//! Own kernels: the kernel families of `templates/cuda/kernels/` compile as HIP through the
//! portability header (`templates/rocm/library.cuh.hbs`); `templates/rocm/kernels/` replaces
//! those that cannot be shared. Wavefronts are 64 lanes ([`Target::warp_size`] = 64: row-wise
//! kernels get 64-thread rows); the shared templates' 32-lane shuffles run as HIP shuffles of
//! width 32. The fused attention kernel (`--attention fused`) is built on NVIDIA's wmma and is
//! refused by name ([`RocmTarget::own_kernel`]).

use super::choice::{
    act_expr, act_name, at, conv_epilogue, conv_profile_problem, conv_signature, gemm_dims, gemm_epilogue,
    gemm_profile_problem, gemm_signature, Choices,
};
use super::cuda::{instance_name, multiple_of, CONV_NODE_TEMPLATE, GEMM_NODE_TEMPLATE, LIBRARY_WORKSPACE_BYTES};
use super::problem::{BiasKind, ConvProblem, GemmProblem};
use super::target::{
    choice_grid, dispatch_over, range_buckets, Instance, LibraryInstance, Measurements, Point, ProfileProblem,
    ProfiledTarget, Target,
};
use crate::error::{Error, Result};
use crate::ir::Dim;
use serde_json::{json, Map, Value as Json};
use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

/// An AMD GPU architecture with XDL (MFMA) instructions that CK supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RocmArch {
    /// CDNA2: MI200 series (MI210, MI250, MI250X).
    Gfx90a,
    /// CDNA3: MI300 series (MI300X, MI300A).
    Gfx942,
}

impl RocmArch {
    /// The name clang's `--offload-arch` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            RocmArch::Gfx90a => "gfx90a",
            RocmArch::Gfx942 => "gfx942",
        }
    }

    /// Compute units of the largest part (MI250X: 110 per GCD, each GCD a device; MI300X: 304).
    pub fn compute_units(self) -> i64 {
        match self {
            RocmArch::Gfx90a => 110,
            RocmArch::Gfx942 => 304,
        }
    }

    /// Memory of the largest device (MI250X GCD / MI210: 64 GiB; MI300X: 192 GB), bytes.
    pub fn memory_bytes(self) -> u64 {
        match self {
            RocmArch::Gfx90a => 64 << 30,
            RocmArch::Gfx942 => 192_000_000_000,
        }
    }
}

impl fmt::Display for RocmArch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RocmArch {
    type Err = Error;

    fn from_str(s: &str) -> Result<RocmArch> {
        match s {
            "gfx90a" => Ok(RocmArch::Gfx90a),
            "gfx942" => Ok(RocmArch::Gfx942),
            _ => Err(Error::Other(format!("unknown ROCm architecture '{s}' (expected gfx90a or gfx942)"))),
        }
    }
}

/// The library templates of this target.
pub const CONV_CK_TEMPLATE: &str = "conv2d_ck";
pub const GEMM_CK_TEMPLATE: &str = "gemm_ck";

/// Threads of every CK configuration here: 4 wavefronts of 64.
const BLOCK_SIZE: i64 = 256;
/// K elements per block iteration, and per-thread fp16 vector of the K-contiguous loads (K1).
const K_PER_BLOCK: i64 = 32;
const K1: i64 = 8;
/// MFMA tile of one wavefront step (v_mfma_f32_32x32x8f16).
const XDL: i64 = 32;
/// Elements per vector of the C-shuffle epilogue's stores and D (bias, residual) loads.
const CDE_VECTOR: i64 = 8;
/// CK indexes tensors with 32-bit offsets.
const CK_MAX_TENSOR_BYTES: i64 = 1 << 31;

/// One CK XDL tile configuration: the block tile and the MFMA repeats per wavefront.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CkTile {
    pub m: i64,
    pub n: i64,
    pub m_xdl_per_wave: i64,
    pub n_xdl_per_wave: i64,
}

impl CkTile {
    const fn new(m: i64, n: i64, m_xdl: i64, n_xdl: i64) -> CkTile {
        CkTile { m, n, m_xdl_per_wave: m_xdl, n_xdl_per_wave: n_xdl }
    }

    fn config(&self) -> String {
        format!("{}x{}x{K_PER_BLOCK}", self.m, self.n)
    }

    /// Wavefronts along M and N.
    fn waves(&self) -> (i64, i64) {
        (self.m / (self.m_xdl_per_wave * XDL), self.n / (self.n_xdl_per_wave * XDL))
    }

    /// CK's compile-time requirements of the configuration itself (its static_asserts and the
    /// thread-cluster arithmetic of the block transfers): 4 wavefronts, whole MFMA repeats, a
    /// K-contiguous transfer cluster of 4 x 64 threads covering the tile, and a C-shuffle tile
    /// the 32 x 8 store cluster with 8-wide vectors divides.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let (mw, nw) = self.waves();
        if self.m % (self.m_xdl_per_wave * XDL) != 0 || self.n % (self.n_xdl_per_wave * XDL) != 0 {
            return Err(format!("{}: the tile is not a whole number of MFMA repeats", self.config()));
        }
        if mw * nw * 64 != BLOCK_SIZE {
            return Err(format!("{}: {mw}x{nw} wavefronts of 64 are not {BLOCK_SIZE} threads", self.config()));
        }
        // Block transfer clusters S<4, 64, 1>: K0 = KPerBlock / K1 = 4 rows of 64 threads.
        if K_PER_BLOCK / K1 != 4 || self.m % 64 != 0 || self.n % 64 != 0 {
            return Err(format!("{}: the 4x64 transfer cluster does not cover the tile", self.config()));
        }
        // C-shuffle: (1 · mw · 32) x (1 · nw · 32) per shuffle, cluster S<1, 32, 1, 8> x 8 wide.
        if (mw * XDL) % 32 != 0 || (nw * XDL) % (8 * CDE_VECTOR) != 0 {
            return Err(format!("{}: the C-shuffle tile does not fit the 32x8 store cluster", self.config()));
        }
        Ok(())
    }

    /// Template fields of the configuration.
    fn fields(&self) -> Map<String, Json> {
        let mut f = Map::new();
        for (k, v) in [
            ("block_size", BLOCK_SIZE),
            ("tile_m", self.m),
            ("tile_n", self.n),
            ("tile_k", K_PER_BLOCK),
            ("k1", K1),
            ("xdl", XDL),
            ("m_xdl_per_wave", self.m_xdl_per_wave),
            ("n_xdl_per_wave", self.n_xdl_per_wave),
            // Per-thread slice of an M- or N-contiguous transfer (64 threads along the dim).
            ("m_per_thread", self.m / 64),
            ("n_per_thread", self.n / 64),
            ("cde_vector", CDE_VECTOR),
        ] {
            f.insert(k.into(), json!(v));
        }
        f
    }
}

/// The candidate tiles, largest first (the heuristic's order).
pub const CK_TILES: [CkTile; 4] =
    [CkTile::new(256, 128, 4, 2), CkTile::new(128, 128, 2, 2), CkTile::new(128, 64, 2, 1), CkTile::new(64, 64, 1, 1)];

/// The tile for a product of `m` x `n` (`batches` independent problems) on `cus` compute units,
/// among `allowed` (those that pass the problem's checks), largest first: see the module docs.
pub fn pick_ck_tile(allowed: &[CkTile], m: i64, n: i64, batches: i64, cus: i64) -> Option<CkTile> {
    let not_oversized = |t: &&CkTile| !(t.m > 64 && m <= 64 || t.n > 64 && n <= 64);
    let workgroups = |t: &CkTile| ((m + t.m - 1) / t.m) * ((n + t.n - 1) / t.n) * batches.max(1);
    let sized: Vec<&CkTile> = allowed.iter().filter(not_oversized).collect();
    if let Some(t) = sized.iter().find(|t| workgroups(t) >= cus) {
        return Some(**t);
    }
    allowed.iter().min_by_key(|t| t.m * t.n).copied()
}

/// CK's convolution forward specialisation a problem allows.
fn conv_spec(p: &ConvProblem) -> &'static str {
    if p.r == 1 && p.s == 1 && p.strides == [1, 1] && p.pads == [0; 4] {
        "Filter1x1Stride1Pad0"
    } else {
        "Default"
    }
}

/// Whether the CK convolution with `tile` and specialisation `spec` accepts `p` at batch `n`:
/// the CPU side of `DeviceGroupedConvFwdMultipleABD_Xdl_CShuffle::IsSupportedArgument` for the
/// layouts and vector widths the template compiles in.
pub fn ck_conv_check(tile: &CkTile, spec: &str, p: &ConvProblem, n: i64) -> std::result::Result<(), String> {
    tile.validate()?;
    if p.group != 1 {
        return Err(format!("group {}: the instances are compiled for one group", p.group));
    }
    // ConvolutionForwardSpecialization::Filter1x1Stride1Pad0: every filter side 1, stride 1, no padding.
    if spec == "Filter1x1Stride1Pad0" && conv_spec(p) != spec {
        return Err(format!("{spec} needs a 1x1 filter, stride 1 and no padding (got {}x{})", p.r, p.s));
    }
    // A (NHWGC) and B (GKYXC) are read 8 channels at a time (ABlockTransferSrcScalarPerVector
    // along C); D and E (NHWGK) 8 output channels at a time (CDEBlockTransferScalarPerVector).
    if p.c % K1 != 0 {
        return Err(format!("C = {} is not a multiple of the {K1}-channel input vectors", p.c));
    }
    if p.k % CDE_VECTOR != 0 {
        return Err(format!("K = {} is not a multiple of the {CDE_VECTOR}-channel output vectors", p.k));
    }
    let bytes = [n * p.h * p.w * p.c * 2, p.k * p.r * p.s * p.c * 2, n * p.p * p.q * p.k * 2];
    if let Some(b) = bytes.iter().find(|&&b| b >= CK_MAX_TENSOR_BYTES) {
        return Err(format!("a tensor of {b} bytes at batch {n} exceeds CK's 32-bit indexing"));
    }
    Ok(())
}

/// The CPU side of `DeviceGemmMultipleD_Xdl_CShuffle::IsSupportedArgument` (MNKPadding) for a
/// product of `m` x `n` x `k` with B row-major (`b_row`) or column-major: A (row-major) is read 8
/// elements along K, B 8 along K (column-major) or `tile.n / 64` along N (row-major), D and E 8
/// along N; every matrix under CK's 32-bit indexing.
pub fn ck_gemm_check(tile: &CkTile, m: i64, n: i64, k: i64, b_row: bool) -> std::result::Result<(), String> {
    tile.validate()?;
    if k % K1 != 0 {
        return Err(format!("K = {k} is not a multiple of the {K1}-element A vectors"));
    }
    let b_vector = if b_row { tile.n / 64 } else { K1 };
    let b_dim = if b_row { n } else { k };
    if b_dim % b_vector != 0 {
        return Err(format!("B's contiguous dim {b_dim} is not a multiple of its {b_vector}-element vectors"));
    }
    if n % CDE_VECTOR != 0 {
        return Err(format!("N = {n} is not a multiple of the {CDE_VECTOR}-element output vectors"));
    }
    if [m * k, k * n, m * n].iter().any(|&e| e * 2 >= CK_MAX_TENSOR_BYTES) {
        return Err(format!("a {m}x{n}x{k} operand exceeds CK's 32-bit indexing"));
    }
    Ok(())
}

/// The ROCm target for one architecture.
#[derive(Clone, Debug)]
pub struct RocmTarget {
    arch: RocmArch,
    /// Batch ranges (ascending upper bounds; the last is the largest batch), as CUDA's.
    buckets: Vec<i64>,
    /// Profiled times, shared instances, the record for the profiler (as CUDA's).
    choices: Choices,
}

impl RocmTarget {
    pub fn new(arch: RocmArch) -> RocmTarget {
        RocmTarget { arch, buckets: vec![super::cuda::DEFAULT_BATCH_HINT], choices: Choices::default() }
    }

    /// Instances are chosen at batch 1, 8, 64 and `max_batch` (those below it), as on CUDA.
    pub fn with_max_batch(self, max_batch: i64) -> RocmTarget {
        self.with_batch_range(1, max_batch)
    }

    /// The batch ranges for a batch running from `min` to `max`, as on CUDA
    /// (`CudaTarget::with_batch_range`): no choice below `min`.
    pub fn with_batch_range(mut self, min: i64, max: i64) -> RocmTarget {
        self.buckets = range_buckets(min, max);
        self
    }

    pub fn arch(&self) -> RocmArch {
        self.arch
    }

    /// Records every library problem the lowering asks about, with its candidates.
    pub fn recording(mut self) -> RocmTarget {
        self.choices = self.choices.recording();
        self
    }

    /// The candidate tiles of convolution `p` at batch `n` (those that pass CK's checks).
    fn conv_tiles(p: &ConvProblem, spec: &str, n: i64) -> Vec<CkTile> {
        CK_TILES.iter().copied().filter(|t| ck_conv_check(t, spec, p, n).is_ok()).collect()
    }

    /// The candidate tiles of a `m` x `n` x `k` product.
    fn gemm_tiles(p: &GemmProblem, m: i64, n: i64, k: i64) -> Vec<CkTile> {
        CK_TILES.iter().copied().filter(|t| ck_gemm_check(t, m, n, k, !p.trans_b).is_ok()).collect()
    }

    /// Whether a library instance may compute convolution `p` (else our own kernels do).
    fn conv_on_library(p: &ConvProblem) -> bool {
        p.group == 1 && p.c > 0 && p.k > 0
    }

    /// Whether a library instance may compute product `p` (else the generic kernel does).
    fn gemm_on_library(p: &GemmProblem) -> bool {
        // A is read along K (row-major); per-column bias only (a D tensor with stride 0).
        let layout_ok = !p.trans_a && matches!(p.bias, None | Some(BiasKind::PerColumn));
        layout_ok && multiple_of(&p.k, K1) && multiple_of(&p.n, CDE_VECTOR)
    }

    /// The points to choose a convolution's instance at, as on CUDA: every batch bucket when
    /// `n` is the run-time batch, else one.
    fn conv_points(&self, n: &Dim) -> Vec<Point> {
        match n.as_known() {
            None => choice_grid(&self.buckets, &[]),
            Some(_) => vec![Point::batch(*self.buckets.last().unwrap_or(&1))],
        }
    }

    fn epilogue(bias: bool, residual: bool, pre_act: &str, act: &str) -> Map<String, Json> {
        let mut f = Map::new();
        f.insert("has_bias".into(), json!(bias));
        f.insert("has_residual".into(), json!(residual));
        f.insert("pre_act".into(), json!(pre_act));
        f.insert("act".into(), json!(act));
        f
    }

    fn library(template: &str, config: String, mut ctx: Map<String, Json>) -> LibraryInstance {
        let name = instance_name(template, &config, &ctx);
        ctx.insert("name".into(), json!(name));
        LibraryInstance { name, template: template.into(), config: format!("{template} {config}"), context: ctx }
    }

    fn conv_instance(&self, p: &ConvProblem, tile: &CkTile, spec: &str) -> LibraryInstance {
        let mut ctx = tile.fields();
        ctx.insert("conv_spec".into(), json!(spec));
        for (k, v) in Self::epilogue(p.bias, p.residual, &act_expr(p.pre_act, "v"), &act_expr(p.act, "v")) {
            ctx.insert(k, v);
        }
        let tag = format!(
            "{} {spec} bias{} res{} pre:{} act:{}",
            tile.config(),
            p.bias as u8,
            p.residual as u8,
            act_name(p.pre_act),
            act_name(p.act)
        );
        Self::library(CONV_CK_TEMPLATE, tag, ctx)
    }

    fn gemm_instance(&self, p: &GemmProblem, tile: &CkTile) -> LibraryInstance {
        let mut ctx = tile.fields();
        let has_bias = p.bias.is_some();
        for (k, v) in Self::epilogue(has_bias, p.residual, "v", &act_expr(p.act, "v")) {
            ctx.insert(k, v);
        }
        ctx.insert("b_row_major".into(), json!(!p.trans_b));
        let tag = format!(
            "{} b{} bias{} res{} act:{}",
            tile.config(),
            if p.trans_b { "col" } else { "row" },
            has_bias as u8,
            p.residual as u8,
            act_name(p.act)
        );
        Self::library(GEMM_CK_TEMPLATE, tag, ctx)
    }

    /// The direct or depthwise kernel of our own, as on CUDA.
    fn conv_own(p: &ConvProblem) -> Instance {
        if p.group == p.c && p.k == p.c && p.c % K1 == 0 {
            return super::ops::conv::depthwise_instance(p);
        }
        super::ops::conv::direct_instance(p)
    }
}

impl Target for RocmTarget {
    fn name(&self) -> &'static str {
        "rocm"
    }

    fn arch_name(&self) -> String {
        self.arch.as_str().to_string()
    }

    /// CDNA wavefronts are 64 lanes.
    fn warp_size(&self) -> i64 {
        64
    }

    fn conv2d(&self, p: &ConvProblem) -> Instance {
        if !Self::conv_on_library(p) {
            return Self::conv_own(p);
        }
        let spec = conv_spec(p);
        let epi = conv_epilogue(p);
        let points = self.conv_points(&p.n);
        // None when a range has no instance that passes the checks. Every tile that passes is a
        // candidate the profiler times; the heuristic picks one of them.
        let dispatch = dispatch_over(&points, |point| {
            let n = at(&p.n, point.batch);
            let allowed = Self::conv_tiles(p, spec, n);
            let tile = pick_ck_tile(&allowed, n * p.p * p.q, p.k, 1, self.arch.compute_units())?;
            let candidates: Vec<LibraryInstance> = allowed.iter().map(|t| self.conv_instance(p, t, spec)).collect();
            let heuristic = self.conv_instance(p, &tile, spec);
            Some(self.choices.choose(conv_profile_problem(p, n, point, &epi, &candidates, &heuristic), heuristic))
        });
        match dispatch {
            Some(dispatch) => Instance {
                template: CONV_NODE_TEMPLATE.into(),
                context: Map::new(),
                workspace_bytes: LIBRARY_WORKSPACE_BYTES,
                dispatch,
            },
            None => Self::conv_own(p),
        }
    }

    fn gemm(&self, p: &GemmProblem) -> Instance {
        if !Self::gemm_on_library(p) {
            return Instance::own("gemm_generic", Map::new());
        }
        let epi = gemm_epilogue(p);
        // Per range of the batch and of the other run-time dims the sizes depend on, as on CUDA.
        let points = p.choice_points(&self.buckets);
        let dispatch = dispatch_over(&points, |point| {
            let [bc, m, n, k] = gemm_dims(p, point);
            let allowed = Self::gemm_tiles(p, m, n, k);
            let tile = pick_ck_tile(&allowed, m, n, bc, self.arch.compute_units())?;
            let candidates: Vec<LibraryInstance> = allowed.iter().map(|t| self.gemm_instance(p, t)).collect();
            let heuristic = self.gemm_instance(p, &tile);
            Some(self.choices.choose(gemm_profile_problem(p, point, &epi, &candidates, &heuristic), heuristic))
        });
        match dispatch {
            Some(dispatch) => Instance {
                template: GEMM_NODE_TEMPLATE.into(),
                context: Map::new(),
                workspace_bytes: LIBRARY_WORKSPACE_BYTES,
                dispatch,
            },
            None => Instance::own("gemm_generic", Map::new()),
        }
    }

    fn conv_channel_multiple(&self) -> usize {
        K1 as usize
    }

    /// The fused attention, tensor-core stem and grouped convolution kernels are written on
    /// NVIDIA's mma.sync fragments and have no HIP version yet.
    fn own_kernel(&self, template: &str) -> std::result::Result<(), String> {
        match template {
            "attention" => Err("the fused attention kernel (--attention fused) is not written for ROCm yet; \
                 compile without --attention fused"
                .into()),
            crate::lower::ops::conv::STEM_TEMPLATE => {
                Err("the tensor-core stem kernel is not written for ROCm yet (thin stems take the library path)".into())
            }
            crate::lower::ops::conv::GROUP_MMA_TEMPLATE => {
                Err("the tensor-core grouped convolution kernel is not written for ROCm yet (narrow groups take the \
                 direct kernel)"
                    .into())
            }
            _ => Ok(()),
        }
    }
}

/// The profiled choice on ROCm, as on CUDA: a problem's candidates are the CK tiles that pass its
/// checks at the point's sizes.
impl ProfiledTarget for RocmTarget {
    /// Profiled times to choose from (`onnx2ait profile --target rocm` on an AMD GPU).
    fn with_measurements(mut self, m: Measurements) -> RocmTarget {
        self.choices = self.choices.with_measurements(m);
        self
    }
    fn measurements(&self) -> Option<&Measurements> {
        self.choices.measurements()
    }
    fn conv_signature_at(&self, p: &ConvProblem, batch: i64) -> Option<String> {
        if Target::conv2d(self, p).template != CONV_NODE_TEMPLATE {
            return None;
        }
        Some(conv_signature(p, at(&p.n, batch), &conv_epilogue(p)))
    }
    fn conv_time(&self, p: &ConvProblem, batch: i64) -> Option<f64> {
        self.choices.measurements()?;
        let signature = self.conv_signature_at(p, batch)?;
        let (spec, n) = (conv_spec(p), at(&p.n, batch));
        let candidates: Vec<LibraryInstance> =
            Self::conv_tiles(p, spec, n).iter().map(|t| self.conv_instance(p, t, spec)).collect();
        self.choices.fastest_measured_ms(&signature, &candidates)
    }
    fn gemm_signature_at(&self, p: &GemmProblem, batch: i64) -> Option<String> {
        if Target::gemm(self, p).template != GEMM_NODE_TEMPLATE {
            return None;
        }
        Some(gemm_signature(p, &Point::batch(batch), &gemm_epilogue(p)))
    }
    fn gemm_time(&self, p: &GemmProblem, batch: i64) -> Option<f64> {
        self.choices.measurements()?;
        let signature = self.gemm_signature_at(p, batch)?;
        let [_, m, n, k] = gemm_dims(p, &Point::batch(batch));
        let candidates: Vec<LibraryInstance> =
            Self::gemm_tiles(p, m, n, k).iter().map(|t| self.gemm_instance(p, t)).collect();
        self.choices.fastest_measured_ms(&signature, &candidates)
    }
    fn probe(&self) -> RocmTarget {
        RocmTarget { arch: self.arch, buckets: self.buckets.clone(), choices: self.choices.probe() }
    }
    fn recorded(&self) -> Vec<ProfileProblem> {
        self.choices.recorded()
    }
    fn with_shared_instances(mut self, instances: BTreeSet<String>, tolerance: f64) -> RocmTarget {
        self.choices = self.choices.with_shared_instances(instances, tolerance);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::ops::conv::DEPTHWISE_TEMPLATE;
    use std::collections::BTreeMap;

    fn conv(n: Dim, hw: i64, c: i64, k: i64, rs: i64, stride: i64) -> ConvProblem {
        let pad = rs / 2;
        let out = (hw + 2 * pad - rs) / stride + 1;
        ConvProblem {
            n,
            h: hw,
            w: hw,
            c,
            k,
            r: rs,
            s: rs,
            p: out,
            q: out,
            pads: [pad; 4],
            strides: [stride; 2],
            dilations: [1, 1],
            group: 1,
            bias: true,
            residual: false,
            pre_act: None,
            act: Some(crate::ir::ops::kernel::Act::Relu),
        }
    }

    #[test]
    fn every_tile_satisfies_cks_configuration_rules() {
        for t in CK_TILES {
            t.validate().unwrap_or_else(|e| panic!("{e}"));
        }
        // A configuration CK would reject: 8 wavefronts.
        assert!(CkTile::new(256, 256, 2, 2).validate().is_err());
        assert!(CkTile::new(96, 64, 1, 1).validate().is_err());
    }

    #[test]
    fn cpu_checks_mirror_cks_run_time_checks() {
        let t = CK_TILES[1];
        let p = conv(Dim::known(8), 56, 64, 64, 3, 1);
        assert!(ck_conv_check(&t, "Default", &p, 8).is_ok());
        // The 1x1 specialisation refuses a 3x3 filter.
        assert!(ck_conv_check(&t, "Filter1x1Stride1Pad0", &p, 8).unwrap_err().contains("1x1"));
        // Channels off the vector width.
        let p = conv(Dim::known(8), 56, 12, 64, 3, 1);
        assert!(ck_conv_check(&t, "Default", &p, 8).unwrap_err().contains("C = 12"));
        let p = conv(Dim::known(8), 56, 64, 20, 3, 1);
        assert!(ck_conv_check(&t, "Default", &p, 8).unwrap_err().contains("K = 20"));
        // A tensor beyond 32-bit indexing.
        let p = conv(Dim::known(1), 56, 64, 64, 3, 1);
        assert!(ck_conv_check(&t, "Default", &p, 6000).unwrap_err().contains("32-bit"));
        // GEMM: B row-major with a 128-wide tile reads 2 elements along N, with the 64-wide one 1;
        // the output takes 8-vectors along N, A 8-vectors along K.
        assert!(ck_gemm_check(&CK_TILES[1], 64, 1001, 2048, true).unwrap_err().contains("B's contiguous dim 1001"));
        assert!(ck_gemm_check(&CK_TILES[3], 64, 1001, 2048, true).unwrap_err().contains("N = 1001"));
        assert!(ck_gemm_check(&CK_TILES[3], 64, 1024, 2048, true).is_ok());
        assert!(ck_gemm_check(&CK_TILES[0], 64, 1024, 2044, false).unwrap_err().contains("K = 2044"));
    }

    #[test]
    fn heuristic_fills_the_compute_units() {
        // Large: the largest tile fills 304 CUs.
        assert_eq!(pick_ck_tile(&CK_TILES, 64 * 56 * 56, 256, 1, 304), Some(CK_TILES[0]));
        // A 7x7 layer at batch 1: nothing fills the GPU, the smallest tile.
        assert_eq!(pick_ck_tile(&CK_TILES, 49, 512, 1, 304), Some(CK_TILES[3]));
        // M <= 64 never takes a 128-row tile.
        let t = pick_ck_tile(&CK_TILES, 32, 4096, 1, 110).unwrap();
        assert_eq!(t.m, 64);
        assert_eq!(pick_ck_tile(&[], 10, 10, 1, 110), None);
    }

    /// The profiled choice on ROCm: a recording target lists each convolution at every batch
    /// range with every CK tile that passes its checks as a candidate (the heuristic's among
    /// them); with profiled times, the fastest candidate runs, flagged as measured, and the
    /// profiler's signature and time are the ones `profile::cost` prices the graph by.
    #[test]
    fn profiled_times_choose_the_rocm_instance() {
        let p = conv(Dim::sym("N"), 56, 64, 64, 3, 1);
        let rec = RocmTarget::new(RocmArch::Gfx942).with_max_batch(64).recording();
        let heuristic = rec.conv2d(&p);
        let problems = ProfiledTarget::recorded(&rec);
        let batches: std::collections::BTreeSet<i64> = problems.iter().map(|q| q.point.batch).collect();
        assert_eq!(problems.len(), 3);
        assert_eq!(batches, [1, 8, 64].into());
        for q in &problems {
            assert_eq!(q.kind, "conv");
            assert!(q.candidates.len() > 1, "{}", q.signature);
            assert!(q.candidates.iter().any(|c| c.config == q.heuristic), "{}", q.signature);
            assert!(q.candidates.iter().all(|c| c.template == CONV_CK_TEMPLATE));
        }
        // Times where the heuristic's choice at batch 64 is the slowest candidate.
        let at64 = problems.iter().find(|q| q.point.batch == 64).unwrap();
        let mut times = BTreeMap::new();
        for (i, c) in at64.candidates.iter().enumerate() {
            let ms = if c.config == at64.heuristic { 9.0 } else { 1.0 + i as f64 };
            times.insert(c.config.clone(), ms);
        }
        let fastest = times.iter().min_by(|a, b| a.1.total_cmp(b.1)).map(|(c, _)| c.clone()).unwrap();
        let fastest_ms = times[&fastest];
        assert_ne!(fastest, at64.heuristic);
        let measured = RocmTarget::new(RocmArch::Gfx942)
            .with_max_batch(64)
            .with_measurements([(at64.signature.clone(), times)].into());
        let chosen = measured.conv2d(&p);
        let last = chosen.dispatch.last().unwrap();
        assert!(last.measured && last.instance.config == fastest, "{last:?}");
        // Ranges without times keep the heuristic's choice.
        assert!(!chosen.dispatch[0].measured && chosen.dispatch[0].instance == heuristic.dispatch[0].instance);
        assert_eq!(measured.conv_signature_at(&p, 64).as_deref(), Some(at64.signature.as_str()));
        assert_eq!(measured.conv_time(&p, 64), Some(fastest_ms));
        assert_eq!(measured.conv_time(&p, 8), None, "no times at batch 8");
    }

    #[test]
    fn rocm_instances_by_batch_range_and_fallbacks() {
        let t = RocmTarget::new(RocmArch::Gfx942).with_max_batch(64);
        let inst = t.conv2d(&conv(Dim::sym("N"), 56, 64, 64, 3, 1));
        assert_eq!(inst.template, "conv2d_library");
        assert!(!inst.dispatch.is_empty());
        assert!(inst.dispatch.iter().all(|d| d.instance.template == CONV_CK_TEMPLATE));
        assert!(inst.dispatch.iter().all(|d| !d.measured));
        assert_eq!(inst.dispatch.last().unwrap().max_batch, 64);
        // 1x1 stride-1 unpadded: the 1x1 specialisation.
        let inst = t.conv2d(&conv(Dim::known(1), 56, 64, 256, 1, 1));
        assert!(
            inst.dispatch[0].instance.config.contains("Filter1x1Stride1Pad0"),
            "{}",
            inst.dispatch[0].instance.config
        );
        // Unaligned channels: our direct kernel.
        assert_eq!(t.conv2d(&conv(Dim::known(1), 8, 12, 64, 3, 1)).template, "conv2d_direct");
        // Depthwise: our depthwise kernel.
        let mut dw = conv(Dim::known(1), 8, 32, 32, 3, 1);
        dw.group = 32;
        assert_eq!(t.conv2d(&dw).template, DEPTHWISE_TEMPLATE);
        assert!(t.own_kernel("attention").unwrap_err().contains("--attention fused"));
        assert_eq!(t.warp_size(), 64);
        assert_eq!("gfx942".parse::<RocmArch>().unwrap(), RocmArch::Gfx942);
        assert!("gfx940".parse::<RocmArch>().is_err());
    }
}
