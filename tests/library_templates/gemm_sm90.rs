//! Compile tests of templates/cuda/library/gemm_sm90.cu.hbs (owner: the template's author).
//!
//! Each variant is one sm_90a compile of a CUTLASS 3.x GEMM (a minute or more), so the set is
//! small and covers every branch of the template: epilogue trees (bias + act, bias + residual,
//! none), both schedules, both tile schedulers, both B layouts, a 2x1 cluster and the widest
//! tile. The Linear variants are also linked into a host library and asked CHECK-mode questions
//! (no GPU needed: CHECK mode must not touch the device), covering the run-time rules and the
//! batch plans.

use crate::common;
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::build::Compiler;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::PathBuf;

struct Variant {
    case: &'static str,
    has_bias: bool,
    has_residual: bool,
    act: &'static str,
    layout_a: &'static str,
    layout_b: &'static str,
    tile: (u32, u32, u32),
    cluster: (u32, u32),
    schedule: &'static str,
    tile_scheduler: &'static str,
}

impl Variant {
    fn name(&self) -> String {
        format!("o2a_gemm_sm90_{}", self.case)
    }

    fn ctx(&self) -> Json {
        json!({
            "name": self.name(),
            "has_bias": self.has_bias,
            "has_residual": self.has_residual,
            "act": self.act,
            "layout_a": self.layout_a,
            "layout_b": self.layout_b,
            "tile_m": self.tile.0,
            "tile_n": self.tile.1,
            "tile_k": self.tile.2,
            "cluster_m": self.cluster.0,
            "cluster_n": self.cluster.1,
            "schedule": self.schedule,
            "tile_scheduler": self.tile_scheduler,
        })
    }
}

/// Renders the variant, checks the rendered configuration, and compiles it when nvcc is
/// available (returning nvcc and the source, whose object lies next to it).
fn check(v: &Variant) -> Option<(Nvcc, PathBuf)> {
    let src = common::render("gemm_sm90", &v.ctx(), v.case);
    let text = std::fs::read_to_string(&src).unwrap();
    let signature = format!(
        "int {}(const O2aGemmArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode)",
        v.name()
    );
    assert!(text.contains(&signature), "{}: the instance function is not defined as `{signature}`", v.case);
    assert!(!text.contains("extern \"C\""), "{}: library instances have C++ linkage", v.case);
    assert!(text.contains(&format!("constexpr bool kHasBias = {};", v.has_bias)), "{}: bias flag", v.case);
    assert!(text.contains(&format!("constexpr bool kHasResidual = {};", v.has_residual)), "{}: residual flag", v.case);
    assert!(
        text.contains(&format!("constexpr bool kCooperative = {};", v.schedule == "cooperative")),
        "{}: schedule",
        v.case
    );
    assert!(
        text.contains(&format!("constexpr bool kStreamK = {};", v.tile_scheduler == "stream_k")),
        "{}: tile scheduler",
        v.case
    );
    assert!(text.contains(&format!("out[i] = {};", v.act)), "{}: the activation expression", v.case);
    let nvcc = common::nvcc(Arch::Sm90a)?;
    let start = std::time::Instant::now();
    common::compile(&nvcc, &src);
    eprintln!("{}: compiled in {:.1} s", v.case, start.elapsed().as_secs_f64());
    Some((nvcc, src))
}

/// relu(x·Wᵀ + bias), the Linear layer: row-major activations times a [n, k] weight read
/// column-major; cooperative 128x128x64 with a 2x1 cluster (the weight tile multicast).
#[test]
fn gemm_sm90_linear_bias_relu_cooperative_128x128_cluster2() {
    let v = Variant {
        case: "linear_bias_relu_128x128_c2x1",
        has_bias: true,
        has_residual: false,
        act: "o2a_relu(v)",
        layout_a: "RowMajor",
        layout_b: "ColumnMajor",
        tile: (128, 128, 64),
        cluster: (2, 1),
        schedule: "cooperative",
        tile_scheduler: "persistent",
    };
    if let Some((nvcc, src)) = check(&v) {
        check_mode(&nvcc, &src, &v.name());
    }
}

/// gelu(x·Wᵀ + bias), BERT's first feed-forward product, on the stream-K tile scheduler
/// (cooperative 128x64x64), a profiler candidate. CHECK mode answers for the data-parallel
/// decomposition without asking the device for its SM count, so the same host-side questions
/// hold.
#[test]
fn gemm_sm90_linear_bias_gelu_stream_k_128x64() {
    let v = Variant {
        case: "linear_bias_gelu_128x64_streamk",
        has_bias: true,
        has_residual: false,
        act: "o2a_gelu_erf(v)",
        layout_a: "RowMajor",
        layout_b: "ColumnMajor",
        tile: (128, 64, 64),
        cluster: (1, 1),
        schedule: "cooperative",
        tile_scheduler: "stream_k",
    };
    if let Some((nvcc, src)) = check(&v) {
        check_mode(&nvcc, &src, &v.name());
    }
}

/// alpha·x·Wᵀ + beta·bias + residual (the residual block's projection), identity activation:
/// pingpong 64x128x64.
#[test]
fn gemm_sm90_bias_residual_pingpong_64x128() {
    check(&Variant {
        case: "bias_residual_64x128_pingpong",
        has_bias: true,
        has_residual: true,
        act: "v",
        layout_a: "RowMajor",
        layout_b: "ColumnMajor",
        tile: (64, 128, 64),
        cluster: (1, 1),
        schedule: "pingpong",
        tile_scheduler: "persistent",
    });
}

/// Batched [m, k] x [k, n] (attention scores / context), no epilogue operands: both operands
/// row-major, cooperative 128x256x64.
#[test]
fn gemm_sm90_batched_matmul_cooperative_128x256() {
    check(&Variant {
        case: "batched_matmul_128x256",
        has_bias: false,
        has_residual: false,
        act: "v",
        layout_a: "RowMajor",
        layout_b: "RowMajor",
        tile: (128, 256, 64),
        cluster: (1, 1),
        schedule: "cooperative",
        tile_scheduler: "persistent",
    });
}

/// BERT's feed-forward output product with the residual: cooperative 128x192x64 (N = 768 in
/// four column tiles), a profiler candidate.
#[test]
fn gemm_sm90_bias_residual_cooperative_128x192() {
    check(&Variant {
        case: "bias_residual_128x192",
        has_bias: true,
        has_residual: true,
        act: "v",
        layout_a: "RowMajor",
        layout_b: "ColumnMajor",
        tile: (128, 192, 64),
        cluster: (1, 1),
        schedule: "cooperative",
        tile_scheduler: "persistent",
    });
}

/// gelu(x·Wᵀ + bias) on the ping-pong 128x128x64 and cooperative 256x128x64 tiles, profiler
/// candidates.
#[test]
fn gemm_sm90_linear_bias_gelu_pingpong_128x128_and_cooperative_256x128() {
    for (case, tile, schedule) in [
        ("linear_bias_gelu_128x128_pingpong", (128, 128, 64), "pingpong"),
        ("linear_bias_gelu_256x128", (256, 128, 64), "cooperative"),
    ] {
        check(&Variant {
            case,
            has_bias: true,
            has_residual: false,
            act: "o2a_gelu_erf(v)",
            layout_a: "RowMajor",
            layout_b: "ColumnMajor",
            tile,
            cluster: (1, 1),
            schedule,
            tile_scheduler: "persistent",
        });
    }
}

// ---- CHECK mode, run on the host --------------------------------------------------------------
// CHECK mode must answer without touching the device, so it runs here without a GPU: the
// instance object is linked with a small driver into a shared library and called through it.

/// `O2aGemmArgs` of library.cuh, field for field (the driver checks size and offsets).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct GemmArgs {
    m: i64,
    n: i64,
    k: i64,
    batch_count: i64,
    lda: i64,
    ldb: i64,
    ldd: i64,
    ld_bias: i64,
    ld_res: i64,
    batch_stride_a: i64,
    batch_stride_b: i64,
    batch_stride_d: i64,
    batch_stride_bias: i64,
    batch_stride_res: i64,
    alpha: f32,
    beta: f32,
    a: usize,
    b: usize,
    bias: usize,
    res: usize,
    d: usize,
}

impl GemmArgs {
    /// `batch` products x[m, k] · W[n, k]ᵀ + bias[n] with packed operands and no pointers (CHECK
    /// mode answers before any allocation); the weight is shared (batch stride 0).
    fn linear(batch: i64, m: i64, n: i64, k: i64) -> GemmArgs {
        GemmArgs {
            m,
            n,
            k,
            batch_count: batch,
            lda: k,
            ldb: k,
            ldd: n,
            ld_bias: 0,
            ld_res: n,
            batch_stride_a: m * k,
            batch_stride_b: 0,
            batch_stride_d: m * n,
            batch_stride_bias: 0,
            batch_stride_res: m * n,
            alpha: 1.0,
            beta: 1.0,
            a: 0,
            b: 0,
            bias: 0,
            res: 0,
            d: 0,
        }
    }

    fn with(mut self, f: impl FnOnce(&mut GemmArgs)) -> GemmArgs {
        f(&mut self);
        self
    }
}

const CHECK_DRIVER: &str = r#"#include "library.cuh"
#include <cstdarg>
#include <cstddef>
#include <cstdio>

namespace {
thread_local char g_error[1024];
}  // namespace

void o2a_set_error(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_error, sizeof(g_error), fmt, ap);
  va_end(ap);
}

int INSTANCE(const O2aGemmArgs* args, void* workspace, size_t workspace_bytes, cudaStream_t stream, int mode);

extern "C" void o2a_test_layout(size_t* out) {
  out[0] = sizeof(O2aGemmArgs);
  out[1] = offsetof(O2aGemmArgs, alpha);
  out[2] = offsetof(O2aGemmArgs, a);
  out[3] = offsetof(O2aGemmArgs, d);
}

extern "C" int o2a_test_check(const O2aGemmArgs* args, size_t workspace_bytes, char* err, size_t err_len) {
  g_error[0] = 0;
  int rc = INSTANCE(args, nullptr, workspace_bytes, nullptr, O2A_LIBRARY_CHECK);
  snprintf(err, err_len, "%s", g_error);
  return rc;
}
"#;

const O2A_OK: i32 = 0;
const O2A_ERR_UNSUPPORTED: i32 = 3;
const WORKSPACE_BYTES: usize = 4 << 20;

/// Links the compiled instance `src` (its object next to it) with the driver and checks its
/// CHECK-mode answers (variant: RowMajor A, ColumnMajor B, bias, no residual).
fn check_mode(nvcc: &Nvcc, src: &std::path::Path, name: &str) {
    let dir = src.parent().unwrap().to_path_buf();
    let driver = dir.join("check_driver.cu");
    std::fs::write(&driver, CHECK_DRIVER.replace("INSTANCE", name)).unwrap();
    let driver_obj = driver.with_extension("o");
    let out = nvcc.compile_command(&driver, &driver_obj, &dir).output().expect("nvcc runs");
    assert!(out.status.success(), "driver: {}", String::from_utf8_lossy(&out.stderr));
    let lib = dir.join("libcheck.so");
    let out = nvcc.link_command(&[src.with_extension("o"), driver_obj], &lib).output().expect("nvcc runs");
    assert!(out.status.success(), "link: {}", String::from_utf8_lossy(&out.stderr));

    type Layout = unsafe extern "C" fn(*mut usize);
    type Check = unsafe extern "C" fn(*const GemmArgs, usize, *mut u8, usize) -> i32;
    // SAFETY: the library was just built from the instance and the driver above; the symbols
    // have the declared C signatures, and CHECK mode makes no CUDA call.
    let lib = unsafe { libloading::Library::new(&lib) }.expect("the check library loads");
    let layout: libloading::Symbol<Layout> = unsafe { lib.get(b"o2a_test_layout") }.unwrap();
    let check: libloading::Symbol<Check> = unsafe { lib.get(b"o2a_test_check") }.unwrap();
    let mut l = [0usize; 4];
    unsafe { layout(l.as_mut_ptr()) };
    assert_eq!(
        l,
        [
            std::mem::size_of::<GemmArgs>(),
            std::mem::offset_of!(GemmArgs, alpha),
            std::mem::offset_of!(GemmArgs, a),
            std::mem::offset_of!(GemmArgs, d)
        ],
        "O2aGemmArgs changed: update GemmArgs"
    );
    let run = |g: GemmArgs, workspace: usize| -> (i32, String) {
        let mut err = vec![0u8; 1024];
        let rc = unsafe { check(&g, workspace, err.as_mut_ptr(), err.len()) };
        let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
        (rc, String::from_utf8_lossy(&err[..end]).into_owned())
    };

    let lin = GemmArgs::linear;
    let supported = [
        ("one Linear", lin(1, 256, 1024, 512)),
        ("one row (decode)", lin(1, 1, 1024, 512)),
        ("batch folded into M (shared weight)", lin(8, 128, 1024, 512)),
        ("batch in L (both batched)", lin(8, 128, 1024, 512).with(|g| g.batch_stride_b = 1024 * 512)),
        (
            "broadcast A (one launch per entry)",
            lin(8, 128, 1024, 512).with(|g| {
                g.batch_stride_a = 0;
                g.batch_stride_b = 1024 * 512
            }),
        ),
        (
            "padded leading dims",
            lin(2, 64, 64, 64).with(|g| {
                g.lda = 72;
                g.ldb = 80;
                g.ldd = 128;
                g.batch_stride_a = 64 * 72;
                g.batch_stride_b = 64 * 80;
                g.batch_stride_d = 64 * 128;
            }),
        ),
        (
            "per-batch bias rows",
            lin(4, 64, 64, 64).with(|g| {
                g.batch_stride_b = 64 * 64;
                g.batch_stride_bias = 64
            }),
        ),
        ("batch too large to fold into M (one launch per entry)", lin(1 << 16, 1 << 16, 64, 64)),
        ("empty (m = 0)", lin(1, 0, 64, 64)),
        (
            "aligned pointers",
            lin(1, 64, 64, 64).with(|g| {
                g.a = 0x1000;
                g.b = 0x2000;
                g.bias = 0x3000;
                g.d = 0x4000
            }),
        ),
    ];
    for (what, g) in supported {
        let (rc, err) = run(g, WORKSPACE_BYTES);
        assert_eq!(rc, O2A_OK, "{what}: {err} ({g:?})");
    }
    let (rc, err) = run(lin(1, 256, 256, 256), 0);
    assert_eq!(rc, O2A_OK, "the data-parallel decomposition needs no workspace: {err}");

    let unsupported = [
        ("k not a multiple of 8", lin(1, 64, 1024, 4), "multiples of 8"),
        ("n not a multiple of 8", lin(1, 64, 12, 64), "multiples of 8"),
        ("k = 0", lin(1, 64, 64, 0), "k = 0"),
        ("a full bias matrix", lin(1, 64, 64, 64).with(|g| g.ld_bias = 64), "ld_bias"),
        ("lda below k", lin(1, 64, 64, 64).with(|g| g.lda = 56), "lda = 56"),
        ("ldd not a multiple of 8", lin(1, 64, 64, 64).with(|g| g.ldd = 65), "ldd = 65"),
        ("misaligned A", lin(1, 64, 64, 64).with(|g| g.a = 8), "pointer a"),
        ("misaligned bias", lin(1, 64, 64, 64).with(|g| g.bias = 0x1002), "pointer bias"),
        ("every batch entry writes one D", lin(4, 64, 64, 64).with(|g| g.batch_stride_d = 0), "batch_stride_d"),
        ("misaligned batch stride", lin(4, 64, 64, 64).with(|g| g.batch_stride_a = 12), "batch_stride_a = 12"),
        ("m beyond 32 bits", lin(1, 1 << 32, 64, 64), "32-bit"),
        ("batch beyond 32 bits", lin(1 << 31, 8, 64, 64), "32-bit"),
        ("negative size", lin(1, -1, 64, 64), "negative"),
    ];
    for (what, g, why) in unsupported {
        let (rc, err) = run(g, WORKSPACE_BYTES);
        assert_eq!(rc, O2A_ERR_UNSUPPORTED, "{what}: expected unsupported, got {rc} ({g:?})");
        assert!(err.starts_with(&format!("{name}: ")), "{what}: the message names the instance: {err}");
        assert!(err.contains(why), "{what}: the message '{err}' does not say '{why}'");
    }
}
