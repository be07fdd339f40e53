//! Rendering a library template and compiling it with nvcc (`-c`, no GPU needed).

use onnx2ait::build::nvcc::{Arch, Nvcc};
use onnx2ait::build::Compiler;
use onnx2ait::codegen::Templates;
use serde_json::Value as Json;
use std::path::PathBuf;

/// nvcc for `arch`, or `None` (test skipped) when it is missing and not required.
pub fn nvcc(arch: Arch) -> Option<Nvcc> {
    let required = std::env::var_os("CI").is_some() || std::env::var_os("ONNX2AIT_REQUIRE_NVCC").is_some();
    match Nvcc::discover(arch) {
        Ok(n) => Some(n),
        Err(e) if required => panic!("library template tests need nvcc and CUTLASS: {e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
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
pub fn compile(nvcc: &Nvcc, src: &PathBuf) {
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
