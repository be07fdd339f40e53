//! The build stage against the real toolchain: nvcc + CUTLASS compile, link and cache.
//!
//! Needs no GPU: the library is only loaded to call a host function. Without a toolchain the
//! tests print a skip line and pass, except in CI (`CI` set) or with `ONNX2AIT_REQUIRE_NVCC=1`,
//! where a missing toolchain must fail rather than hide behind a green run.

use onnx2ait::build::{build, BuildOptions, Nvcc};
use onnx2ait::lower::cuda::Arch;
use std::path::{Path, PathBuf};

/// nvcc for sm_80 (the quickest CUTLASS compile), or `None` after printing why the test is skipped.
fn toolchain(test: &str) -> Option<Nvcc> {
    match Nvcc::discover(Arch::Sm80) {
        Ok(nvcc) => {
            eprintln!("{test}: using {}", nvcc.describe());
            Some(nvcc)
        }
        Err(e) => {
            let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
            let required = std::env::var("ONNX2AIT_REQUIRE_NVCC").is_ok_and(|v| v == "1");
            if ci || required {
                panic!("{test}: the CUDA toolchain is required here (CI or ONNX2AIT_REQUIRE_NVCC=1): {e}");
            }
            eprintln!("SKIPPED {test}: {e}");
            None
        }
    }
}

fn fresh_dir(test: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("build_toolchain").join(test);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("create the test's output directory");
    d
}

const COMMON: &str = r#"#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
"#;

fn tiny_source(answer: i32) -> String {
    format!(
        r#"#include "common.cuh"
__global__ void o2a_fill(half* x, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = __float2half(1.0f);
}}
extern "C" int o2a_fill_launch(half* x, int n, cudaStream_t s) {{
  o2a_fill<<<(n + 255) / 256, 256, 0, s>>>(x, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 1;
}}
// Host-only, so the test can call it without a GPU.
extern "C" int o2a_answer() {{ return {answer}; }}
"#
    )
}

const CUTLASS_SOURCE: &str = r#"#include "common.cuh"
#include <cutlass/version.h>
#include <cutlass/gemm/device/gemm.h>
#include <cute/tensor.hpp>
extern "C" int o2a_cutlass_version() { return CUTLASS_MAJOR * 100 + CUTLASS_MINOR; }
"#;

/// Loads the library and calls a host function of it. Loads a copy under a fresh name: the
/// dynamic loader hands back an already-loaded library for a known path, and a library linking
/// the static CUDA runtime is never unloaded, so a rebuilt library at the same path would not be
/// seen.
fn call_host_fn(lib: &Path, name: &[u8]) -> i32 {
    static COPIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let copy = lib.with_file_name(format!("loaded-{n}.so"));
    std::fs::copy(lib, &copy).expect("copy the built library");
    // SAFETY: the library was just built from the sources above; its initialisers only register
    // fat binaries with the static CUDA runtime, and the called function takes no arguments.
    unsafe {
        let l = libloading::Library::new(&copy).expect("load the built library");
        let f: libloading::Symbol<unsafe extern "C" fn() -> i32> = l.get(name).expect("symbol");
        f()
    }
}

#[test]
fn compiles_links_and_caches() {
    let Some(nvcc) = toolchain("compiles_links_and_caches") else { return };
    let out = fresh_dir("compiles_links_and_caches");
    std::fs::write(out.join("common.cuh"), COMMON).unwrap();
    std::fs::write(out.join("k000_fill.cu"), tiny_source(42)).unwrap();
    std::fs::write(out.join("k001_cutlass.cu"), CUTLASS_SOURCE).unwrap();
    let sources = vec![PathBuf::from("k000_fill.cu"), PathBuf::from("k001_cutlass.cu")];
    let headers = vec![PathBuf::from("common.cuh")];
    let opts = BuildOptions { jobs: Some(2), cache_dir: None, progress: true, ..Default::default() };

    let r = build(&out, &sources, &headers, &nvcc, &opts, "libmodel.so").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.compiled, r.cached, r.linked), (2, 0, true));
    assert!(r.lib.is_file() && r.lib == out.join("libmodel.so"));
    assert_eq!(call_host_fn(&r.lib, b"o2a_answer"), 42);
    assert_eq!(call_host_fn(&r.lib, b"o2a_cutlass_version"), 402);

    let r = build(&out, &sources, &headers, &nvcc, &opts, "libmodel.so").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.compiled, r.cached, r.linked), (0, 2, false));

    std::fs::write(out.join("k000_fill.cu"), tiny_source(43)).unwrap();
    let r = build(&out, &sources, &headers, &nvcc, &opts, "libmodel.so").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.compiled, r.cached, r.linked), (1, 1, true));
    assert_eq!(r.per_file[0].0, "k000_fill.cu");
    assert!(!r.per_file[0].2 && r.per_file[1].2);
    assert_eq!(call_host_fn(&r.lib, b"o2a_answer"), 43);
    // Objects only: the cache also holds its lock folder and (empty) work folder.
    let objects = std::fs::read_dir(out.join("obj")).unwrap().flatten().filter(|e| e.path().is_file()).count();
    assert_eq!(objects, 2, "the stale object of k000_fill.cu should be gone");
}

#[test]
fn compile_errors_quote_nvcc() {
    let Some(nvcc) = toolchain("compile_errors_quote_nvcc") else { return };
    let out = fresh_dir("compile_errors_quote_nvcc");
    std::fs::write(out.join("k000_bad.cu"), "extern \"C\" int f() { return undefined_name; }\n").unwrap();
    let opts = BuildOptions { jobs: Some(1), ..Default::default() };
    let e = build(&out, &[PathBuf::from("k000_bad.cu")], &[], &nvcc, &opts, "libmodel.so")
        .expect_err("the source does not compile")
        .to_string();
    eprintln!("{e}");
    assert!(e.contains("compiling k000_bad.cu with nvcc failed"), "{e}");
    assert!(e.contains("identifier \"undefined_name\" is undefined"), "{e}");
    let log = std::fs::read_to_string(out.join("build.log")).unwrap();
    assert!(log.contains("-gencode=arch=compute_80,code=sm_80"), "{log}");
}

#[test]
fn link_errors_name_missing_symbols() {
    let Some(nvcc) = toolchain("link_errors_name_missing_symbols") else { return };
    let out = fresh_dir("link_errors_name_missing_symbols");
    // Declared, called, never defined: must fail at build time, not at dlopen.
    std::fs::write(out.join("k000_user.cu"), "int o2a_missing(); extern \"C\" int f() { return o2a_missing(); }\n")
        .unwrap();
    let opts = BuildOptions { jobs: Some(1), ..Default::default() };
    let e = build(&out, &[PathBuf::from("k000_user.cu")], &[], &nvcc, &opts, "libmodel.so")
        .expect_err("the library cannot link")
        .to_string();
    eprintln!("{e}");
    assert!(e.contains("linking") && e.contains("o2a_missing"), "{e}");
    assert!(!out.join("libmodel.so").exists());
}
