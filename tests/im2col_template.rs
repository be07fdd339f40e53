//! templates/cuda/kernels/im2col.cu.hbs (the patch matrix of a thin convolution stem) renders
//! with the fields `ops::conv` gives it and compiles warning-free with the pinned nvcc, next to
//! the rendered `common.cuh` / `library.cuh` as in a generated tree. Compile-only: the H200 check
//! runs the kernel through the model validations; its index math is checked on the CPU by the
//! tests of src/lower/ops/conv.rs.
//!
//! Without nvcc the test is skipped, unless `CI` or `ONNX2AIT_REQUIRE_NVCC` is set.

mod common;

use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::build::Compiler;
use onnx2ait::lower::cuda::Arch;
use serde_json::{json, Value as Json};
use std::path::Path;

fn nvcc() -> Option<Nvcc> {
    Nvcc::discover_for_test(Arch::Sm90a, "the im2col template test")
}

/// The kernel fields of one im2col node, as `ops::conv::emit_im2col` writes them (plus `node`
/// and `workspace_bytes`, which codegen adds).
#[allow(clippy::too_many_arguments)]
fn context(
    name: &str,
    n: &str,
    [h, w, c]: [i64; 3],
    [r, s]: [i64; 2],
    [p, q]: [i64; 2],
    [pad_h, pad_w]: [i64; 2],
    [stride_h, stride_w]: [i64; 2],
    [dil_h, dil_w]: [i64; 2],
    kp: i64,
) -> Json {
    json!({
        "name": name, "node": "stem", "workspace_bytes": 0, "args": [],
        "n": n, "h": h, "w": w, "c": c, "r": r, "s": s, "p": p, "q": q,
        "pad_h": pad_h, "pad_w": pad_w, "stride_h": stride_h, "stride_w": stride_w, "dil_h": dil_h, "dil_w": dil_w,
        "kp": kp, "x_index": 0, "out_index": 1,
    })
}

fn compile(nvcc: &Nvcc, src: &Path, dir: &Path) {
    let obj = src.with_extension("o");
    let out = nvcc.compile_command(src, &obj, dir).output().expect("nvcc runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "nvcc failed on {}:\n{log}", src.display());
    assert!(!log.to_lowercase().contains("warning"), "nvcc warns on {}:\n{log}", src.display());
    // The launcher has the kernels.h signature with C++ linkage (checked when nm is present).
    if let Ok(nm) = std::process::Command::new("nm").arg("-C").arg("--defined-only").arg(&obj).output() {
        let symbols = String::from_utf8_lossy(&nm.stdout);
        let name = src.file_stem().and_then(|s| s.to_str()).expect("name");
        let want = format!("{name}(void* const*, o2a_dims, void*, unsigned long, CUstream_st*)");
        assert!(symbols.contains(&want), "{} does not define {want}:\n{symbols}", obj.display());
    }
}

#[test]
fn im2col_kernel_compiles() {
    // ResNet-50's stem at a symbolic batch (7x7/2, pad 3, 3 channels → 152 columns), and an odd
    // window (1 channel, 3x5, asymmetric stride, dilation, padding; 15 → 16 columns) at a fixed
    // batch, whose image offsets need 64 bits (an image of more than 2^31 elements).
    let cases = [
        context("k000_im2col", "(dims.v[0])", [224, 224, 3], [7, 7], [112, 112], [3, 3], [2, 2], [1, 1], 152),
        context("k001_im2col", "2", [50_000, 50_000, 1], [3, 5], [24_999, 49_992], [1, 0], [2, 1], [2, 2], 16),
    ];
    let dir = common::cuda_kernel_dir("im2col", "kernels", "im2col_test");
    let sources = common::render_kernels(&dir, "kernels/im2col.cu", &cases);
    let Some(nvcc) = nvcc() else { return };
    for (src, _) in &sources {
        let started = std::time::Instant::now();
        compile(&nvcc, src, &dir);
        eprintln!("{}: compiled in {:.1} s", src.display(), started.elapsed().as_secs_f64());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
