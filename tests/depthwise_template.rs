//! templates/cuda/kernels/conv2d_depthwise.cu.hbs renders with the fields the lowering gives it
//! (`ops::conv::depthwise_instance`, so the tile sizes are the ones models get) and compiles
//! warning-free with the pinned nvcc for sm_90a and sm_80, with no register spills and the
//! tiled variant's shared memory within the static 48 KB (ptxas -v). The cases are the
//! EfficientNet / MobileNet layers: 3x3, 5x5 and 7x7 filters at strides 1 and 2, with and
//! without a residual, odd map sizes and channel counts whose slabs are 4, 3 or 1 channel
//! blocks (full and partial last slabs), plus the register variant (a 7x7 map, a 1x1 filter).
//! The same rendered kernels also run on the host (`depthwise_kernels_compute_the_reference_on_the_host`:
//! g++, one thread per CUDA thread) against a double-precision convolution, so CI checks their
//! index math, staging and epilogue numerically; the GPU check runs them through the model
//! validations (the bundled pattern_depthwise_shapes.onnx and pattern_depthwise_clip.onnx
//! against ONNX Runtime).
//!
//! Without nvcc the compile tests are skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set; the
//! host check needs only g++ (C++20).

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

compile_tests_for_both_archs!(depthwise_kernels_compile_for_sm90a, depthwise_kernels_compile_for_sm80);

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

/// The CUDA the depthwise kernels use, as plain C++ for the host: one `std::thread` per CUDA
/// thread of a block, `__syncthreads` a barrier, `__shared__` arrays function statics (blocks run
/// one after another, so a block's threads share them and nothing else does), fp16 as
/// `_Float16` (round to nearest even, as `__floats2half2_rn`), cp.async a copy.
const HOST_CUDA_SHIM: &str = r#"
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__
struct uint4 { unsigned x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
struct float2 { float x, y; };
struct half { _Float16 v; };
struct __half2 { half x, y; };
inline float2 __half22float2(__half2 h) { return {(float)h.x.v, (float)h.y.v}; }
inline __half2 __floats2half2_rn(float a, float b) { return {{(_Float16)a}, {(_Float16)b}}; }
inline float __expf(float x) { return std::exp(x); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
inline void __pipeline_commit() {}
inline void __pipeline_wait_prior(size_t) {}
inline void o2a_grid_wait() {}
struct o2a_dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local o2a_dim3 threadIdx, blockIdx;
o2a_dim3 blockDim, gridDim;
std::barrier<>* o2a_block_barrier = nullptr;
inline void __syncthreads() { o2a_block_barrier->arrive_and_wait(); }
"#;

/// The harness after the kernel: random fp16 x, weights, bias and residual (seeded), the
/// launch the template's launcher makes (`TILED`: tiles x slabs by images, else a thread per
/// channel block and pixel group), output poisoned with NaN first, then every output against a
/// double-precision depthwise convolution with the same epilogue. Prints the worst error and
/// exits 1 past `1e-3 (1 + |ref|)` or on an unwritten output.
const HOST_DEPTHWISE_HARNESS: &str = r#"
static float pre_act_f(float v) { return fminf(fmaxf(v, 0.0f), 6.0f); }
static float act_f(float v) { return v / (1.0f + std::exp(-v)); }
int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? atoll(argv[1]) : 2;
  srand(12345);
  auto rnd = [] { return (float)(rand() % 2001 - 1000) / 1000.0f; };
  std::vector<half> x(n * H * W * C), w(R * S * C), bias(C), res(n * P * Q * C), out(n * P * Q * C);
  for (auto& v : x) v.v = (_Float16)rnd();
  for (auto& v : w) v.v = (_Float16)(rnd() * 0.5f);
  for (auto& v : bias) v.v = (_Float16)rnd();
  for (auto& v : res) v.v = (_Float16)rnd();
  for (auto& v : out) v.v = (_Float16)NAN;
#if TILED
  const unsigned blocks_x = TILES * SLABS, threads = THREADS;
  const int64_t arg = n;
  gridDim = {blocks_x, (unsigned)n, 1};
#else
  const unsigned threads = BLOCK_THREADS;
  const int64_t arg = n * P * QG * CV;
  const unsigned blocks_x = (unsigned)((arg + threads - 1) / threads);
  gridDim = {blocks_x, 1, 1};
#endif
  blockDim = {threads, 1, 1};
  for (unsigned by = 0; by < gridDim.y; ++by) {
    for (unsigned bx = 0; bx < blocks_x; ++bx) {
      std::barrier<> bar(threads);
      o2a_block_barrier = &bar;
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, by, 0};
          conv2d_depthwise_kernel(x.data(), w.data(), HAS_BIAS ? bias.data() : nullptr,
                                  HAS_RESIDUAL ? res.data() : nullptr, out.data(), arg);
        });
      }
      for (auto& th : pool) th.join();
    }
  }
  double worst = 0;
  long bad = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int p = 0; p < P; ++p)
      for (int q = 0; q < Q; ++q)
        for (int k = 0; k < C; ++k) {
          double acc = 0;
          for (int r = 0; r < R; ++r)
            for (int s = 0; s < S; ++s) {
              const int ih = p * STRIDE_H - PAD_H + r * DIL_H, iw = q * STRIDE_W - PAD_W + s * DIL_W;
              if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
              acc += (double)(float)x[((i * H + ih) * W + iw) * C + k].v * (double)(float)w[r * WS_R + s * WS_S + k].v;
            }
          float v = (float)acc;
          if (HAS_BIAS) v += (float)bias[k].v;
          v = pre_act_f(v);
          const int64_t o = ((i * P + p) * Q + q) * C + k;
          if (HAS_RESIDUAL) v += (float)res[o].v;
          v = act_f(v);
          const double got = (double)(float)out[o].v, err = std::fabs(got - v);
          if (!(err <= 1e-3 * (1.0 + std::fabs(v)))) {
            if (++bad <= 10) printf("FAIL image %ld p %d q %d k %d: got %g, want %g\n", (long)i, p, q, k, got, v);
          }
          if (err > worst || std::isnan(err)) worst = std::isnan(err) ? INFINITY : err;
        }
  printf("worst abs error %.3e, %ld bad of %ld\n", worst, bad, (long)(n * P * Q * C));
  return bad ? 1 : 0;
}
"#;

/// Compiles one rendered depthwise kernel for the host ([`HOST_CUDA_SHIM`], the kernel's
/// anonymous namespace as rendered, [`HOST_DEPTHWISE_HARNESS`]) with g++ and runs it over `images`
/// images: (passed, output).
fn run_on_host(text: &str, ctx: &Json, images: i64, dir: &std::path::Path) -> (bool, String) {
    let begin = text.find("namespace {").expect("the kernel's namespace");
    let end = text.find("}  // namespace").expect("the end of the kernel's namespace");
    let tiled = ctx["tiled"].as_bool().expect("tiled");
    let defines = format!(
        "#define TILED {}\n#define HAS_BIAS {}\n#define HAS_RESIDUAL {}\n#define BLOCK_THREADS {}\n",
        tiled as u8,
        ctx["has_bias"].as_bool().unwrap() as u8,
        ctx["has_residual"].as_bool().unwrap() as u8,
        ctx["block_threads"]
    );
    let name = ctx["name"].as_str().unwrap();
    let src = dir.join(format!("{name}_host.cpp"));
    let body = format!("{HOST_CUDA_SHIM}{defines}{}}}  // namespace\n{HOST_DEPTHWISE_HARNESS}", &text[begin..end]);
    std::fs::write(&src, body).expect("write");
    let exe = dir.join(format!("{name}_host"));
    let build = std::process::Command::new("g++")
        .args(["-std=c++20", "-O1", "-pthread", "-w", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .expect("g++ runs (the depthwise kernels are checked on the host)");
    assert!(build.status.success(), "g++ failed on {}:\n{}", src.display(), String::from_utf8_lossy(&build.stderr));
    let run = std::process::Command::new(&exe).arg(images.to_string()).output().expect("the host check runs");
    (run.status.success(), String::from_utf8_lossy(&run.stdout).into_owned())
}

/// Every case of [`cases`] computes the reference convolution when run on the host (the kernel's
/// own index math, staging, partial slabs and tiles, phase layout and epilogue; two images, so
/// the image loop and the per-image offsets run too). And the check can fail: a tiled kernel whose
/// staging ignores the phase layout, and a register kernel reading the wrong weight row, are
/// caught.
#[test]
fn depthwise_kernels_compute_the_reference_on_the_host() {
    let dir = common::fresh_dir("depthwise", "host");
    let cases = cases();
    let contexts: Vec<Json> = cases.iter().map(|(ctx, _)| ctx.clone()).collect();
    let sources = common::render_kernels(&dir, "kernels/conv2d_depthwise.cu", &contexts);
    let jobs: Vec<_> = sources.iter().zip(&contexts).collect();
    let results: Vec<(String, bool, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|((_, text), ctx)| {
                let dir = &dir;
                scope.spawn(move || {
                    let (ok, out) = run_on_host(text, ctx, 2, dir);
                    (ctx["name"].as_str().unwrap().to_string(), ok, out)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("host check thread")).collect()
    });
    for (name, ok, out) in &results {
        eprintln!("{name}: {}", out.lines().last().unwrap_or(""));
        assert!(*ok, "{name} differs from the reference convolution on the host:\n{out}");
    }
    // Mutations the check must catch: the tiled form storing staged columns unphased (only a
    // column stride notices), and the register form reading every tap's weights from row 0.
    let must_fail = |tiled: bool, key: &str, value: i64, from: &str, to: &str, what: &str| {
        let ((_, text), ctx) = jobs
            .iter()
            .find(|(_, ctx)| ctx["tiled"] == json!(tiled) && ctx[key] == json!(value))
            .unwrap_or_else(|| panic!("a case for {what}"));
        let broken = text.replace(from, to);
        assert_ne!(&broken, text, "{what}: the mutation applies");
        let (ok, out) = run_on_host(&broken, ctx, 1, &dir);
        assert!(!ok, "{what} still passes:\n{out}");
    };
    must_fail(true, "stride_w", 2, "[c % STRIDE_W * PHASE_COLS + c / STRIDE_W][b]", "[c][b]", "unphased staging");
    must_fail(false, "r", 5, "r * WS_R + s * WS_S + k0", "s * WS_S + k0", "a wrong weight row");
}
