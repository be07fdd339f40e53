//! Rendering a library template and compiling it with nvcc (`-c`, no GPU needed).

use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::build::Compiler;
use onnx2ait::codegen::Templates;
use onnx2ait::lower::cuda::Arch;
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// nvcc for `arch`, or `None` (test skipped) when it is missing and not required.
pub fn nvcc(arch: Arch) -> Option<Nvcc> {
    Nvcc::discover_for_test(arch, "library template tests (nvcc and CUTLASS)")
}

/// Renders `library/<template>.cu` with `ctx` (plus library.cuh) into a fresh folder and returns
/// the source path.
pub fn render(template: &str, ctx: &Json, case: &str) -> PathBuf {
    let t = Templates::for_target("cuda").expect("cuda templates");
    let dir = std::env::temp_dir().join(format!("o2a-libtpl-{}-{template}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let header = t.render("library.cuh", &serde_json::json!({})).expect("library.cuh renders");
    std::fs::write(dir.join("library.cuh"), header).unwrap();
    let src = t.render(&format!("library/{template}.cu"), ctx).unwrap_or_else(|e| panic!("{template} ({case}): {e}"));
    let path = dir.join(format!("{case}.cu"));
    std::fs::write(&path, src).unwrap();
    path
}

/// Compiles a rendered source to an object; panics with nvcc's output on failure.
pub fn compile(nvcc: &Nvcc, src: &std::path::Path) {
    let obj = src.with_extension("o");
    let dir = src.parent().unwrap().to_path_buf();
    let out = nvcc.compile_command(src, &obj, &dir).output().expect("nvcc runs");
    assert!(
        out.status.success(),
        "nvcc failed on {}:\n{}{}",
        src.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The instance must define its function (plain C++ linkage, name from the context).
    assert!(obj.exists());
}

/// The object defines `name` with the library instance signature for `args` (`O2aConvArgs` or
/// `O2aGemmArgs`) and C++ linkage, as the node launchers and the profiler declare it. Checked
/// when binutils' nm is present.
pub fn assert_defines(obj: &Path, name: &str, args: &str) {
    let Ok(out) = std::process::Command::new("nm").arg("-C").arg("--defined-only").arg(obj).output() else {
        return;
    };
    let symbols = String::from_utf8_lossy(&out.stdout);
    let want = format!("{name}({args} const*, void*, unsigned long, CUstream_st*, int)");
    assert!(symbols.contains(&want), "{} does not define {want}:\n{symbols}", obj.display());
}

/// Renders `library/<template>.cu` with `ctx`, compiles it for `arch` and checks the symbol;
/// returns nvcc and the object (None: no nvcc, skipped).
pub fn build(template: &str, arch: Arch, args: &str, case: &str, ctx: &Json) -> Option<(Nvcc, PathBuf)> {
    let nvcc = nvcc(arch)?;
    let src = render(template, ctx, case);
    let started = std::time::Instant::now();
    compile(&nvcc, &src);
    eprintln!("{template} {case}: compiled in {:.1} s", started.elapsed().as_secs_f64());
    let obj = src.with_extension("o");
    assert_defines(&obj, ctx["name"].as_str().unwrap(), args);
    Some((nvcc, obj))
}

/// Compiles `driver` (a C++ `main` that defines `o2a_set_error`, calls the instance in `obj` and
/// exits non-zero on a wrong answer) next to `obj`, links both with the static CUDA runtime and
/// runs it on the host. Only CHECK mode (and RUN's argument rejections) may be exercised: they
/// must answer without a GPU, which is part of the library ABI.
pub fn run_host_driver(nvcc: &Nvcc, obj: &Path, driver: &str) {
    let dir = obj.parent().unwrap();
    let src = dir.join("check_driver.cu");
    std::fs::write(&src, driver).unwrap();
    let driver_obj = dir.join("check_driver.o");
    let out = nvcc.compile_command(&src, &driver_obj, dir).output().expect("nvcc runs");
    assert!(
        out.status.success(),
        "driver: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let exe = dir.join("check_driver");
    let mut link = std::process::Command::new(nvcc.nvcc_path());
    link.arg(nvcc.arch().gencode()).arg("-o").arg(&exe).arg(&driver_obj).arg(obj).args(["-cudart", "static"]);
    // The wheel layout keeps libcudart_static.a in <nvcc>/../../lib, where nvcc does not look.
    if let Some(lib) = nvcc.nvcc_path().parent().and_then(Path::parent).map(|top| top.join("lib")) {
        if lib.join("libcudart_static.a").is_file() {
            link.arg(format!("-L{}", lib.display()));
        }
    }
    let out = link.output().expect("nvcc links");
    assert!(
        out.status.success(),
        "link: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(&exe).output().expect("the driver runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "CHECK-mode answers differ from the expected ones:\n{text}");
}

/// A host CHECK-mode driver for `run_host_driver`: the includes, `o2a_set_error` (into
/// `g_err`), a `failures` count and `expect(what, args, mode, want)`, which calls `instance`
/// (taking `const {args_type}*`) and counts a failure when the status differs from `want` or an
/// error message does not start with `error_prefix`; `finish_with_abi_rules(empty, null_tensor)`,
/// the checks every instance shares, which `main` returns; then `body` (its own helpers and
/// `main`).
pub fn check_driver(instance: &str, args_type: &str, error_prefix: &str, body: &str) -> String {
    format!(
        r#"
#include "library.cuh"
#include <cstdarg>
#include <cstdio>
#include <cstring>
static char g_err[512];
void o2a_set_error(const char* fmt, ...) {{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
}}
int {instance}(const {args_type}*, void*, size_t, cudaStream_t, int);
static int failures = 0;
static void expect(const char* what, const {args_type}* a, int mode, int want) {{
  g_err[0] = 0;
  int rc = {instance}(a, nullptr, O2A_LIBRARY_WORKSPACE_BYTES, nullptr, mode);
  printf("%-36s rc=%d want=%d %s\n", what, rc, want, g_err);
  if (rc != want || (rc != O2A_OK && strstr(g_err, "{error_prefix}") != g_err)) failures++;
}}
// The answers every library instance gives alike (the ABI of library.cuh), then the summary and
// the exit status: null args are invalid; `empty` (an empty output) runs as a no-op; `null_tensor`
// (a valid problem with a pointer the instance reads cleared) passes CHECK, which may be asked
// before tensors exist, and is invalid in RUN.
static int finish_with_abi_rules(const {args_type}& empty, const {args_type}& null_tensor) {{
  expect("null args", nullptr, O2A_LIBRARY_CHECK, O2A_ERR_INVALID_ARGUMENT);
  expect("empty output, RUN", &empty, O2A_LIBRARY_RUN, O2A_OK);
  expect("null tensor, CHECK", &null_tensor, O2A_LIBRARY_CHECK, O2A_OK);
  expect("null tensor, RUN", &null_tensor, O2A_LIBRARY_RUN, O2A_ERR_INVALID_ARGUMENT);
  printf("%d failures\n", failures);
  return failures != 0;
}}
{body}"#
    )
}
