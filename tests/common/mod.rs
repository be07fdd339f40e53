//! Helpers shared by the test binaries that snapshot generated code (`tests/codegen.rs`,
//! `tests/exports.rs`, `tests/rocm.rs`) or compile kernel templates (`tests/im2col_template.rs`,
//! `tests/depthwise_template.rs`, `tests/stem_template.rs`); a folder module, so cargo does not
//! build it as a test of its own. Each binary uses some of them, hence `allow(dead_code)` on the
//! others.

use std::path::{Path, PathBuf};

/// Every generated file but the weights blob, in name order, as one text.
#[allow(dead_code)]
pub fn tree_text(out: &Path) -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(out).expect("out dir").flatten().map(|e| e.path()).collect();
    files.sort();
    let mut s = String::new();
    for f in files {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name == "weights.bin" || f.is_dir() {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        s.push_str(&format!("=== {name} ===\n{text}\n"));
    }
    s
}

/// `onnx_models/*.onnx`, sorted by name.
#[allow(dead_code)]
pub fn bundled_models() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir("onnx_models")
        .expect("onnx_models/ exists")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "onnx"))
        .collect();
    v.sort();
    v
}

/// An empty temporary folder `onnx2ait-<suite>-<pid>-<tag>`.
#[allow(dead_code)]
pub fn fresh_dir(suite: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("onnx2ait-{suite}-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A fresh folder (`fresh_dir(suite, tag)`) holding the CUDA model headers a kernel file
/// includes (`library.cuh`, `common.cuh` for model `model_name`), to render kernels into.
#[allow(dead_code)]
pub fn cuda_kernel_dir(suite: &str, tag: &str, model_name: &str) -> PathBuf {
    use serde_json::json;
    let t = onnx2ait::codegen::Templates::for_target("cuda").expect("cuda templates");
    let dir = fresh_dir(suite, tag);
    std::fs::write(dir.join("library.cuh"), t.render("library.cuh", &json!({})).expect("library.cuh")).expect("write");
    let common = t.render("common.cuh", &json!({ "model_name": model_name })).expect("common.cuh");
    std::fs::write(dir.join("common.cuh"), common).expect("write");
    dir
}

/// Renders the CUDA kernel template `template` (`kernels/im2col.cu`) once per context into `dir`
/// as `<name>.cu`, checking that no handlebars is left and that the launcher of the kernels.h
/// signature is defined. Returns each file's path and text.
#[allow(dead_code)]
pub fn render_kernels(dir: &Path, template: &str, cases: &[serde_json::Value]) -> Vec<(PathBuf, String)> {
    let t = onnx2ait::codegen::Templates::for_target("cuda").expect("cuda templates");
    cases
        .iter()
        .map(|ctx| {
            let text = t.render(template, ctx).unwrap_or_else(|e| panic!("{template} renders: {e}"));
            assert!(!text.contains("{{"), "{template}: unrendered handlebars");
            let name = ctx["name"].as_str().expect("name");
            assert!(text.contains(&format!("int {name}(void* const* t, o2a_dims dims")), "the launcher is defined");
            let src = dir.join(format!("{name}.cu"));
            std::fs::write(&src, &text).expect("write");
            (src, text)
        })
        .collect()
}

/// Compiles one rendered kernel file with `nvcc` and ptxas -v: it must build without warnings
/// and spill no register. Returns ptxas's lines about `kernel` (its registers, shared memory).
#[allow(dead_code)]
pub fn compile_kernel(nvcc: &onnx2ait::build::nvcc::Nvcc, src: &Path, dir: &Path, kernel: &str) -> String {
    use onnx2ait::build::Compiler;
    let obj = src.with_extension("o");
    let out = nvcc.compile_command(src, &obj, dir).arg("-Xptxas=-v").output().expect("nvcc runs");
    let log = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "nvcc failed on {}:\n{log}", src.display());
    assert!(!log.to_lowercase().contains("warning"), "nvcc warns on {}:\n{log}", src.display());
    for line in log.lines().filter(|l| l.contains("spill")) {
        assert!(line.contains("0 bytes spill stores, 0 bytes spill loads"), "{} spills:\n{log}", src.display());
    }
    log.lines()
        .filter(|l| l.contains(kernel) || l.contains("registers") || l.contains("spill"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// Compiles every rendered kernel file (`render_kernels`) in `dir` for `arch` with
/// `compile_kernel`, printing ptxas's resource lines, then removes `dir`. Without nvcc it does
/// nothing (as `Nvcc::discover_for_test` decides for `what`, the test's name).
#[allow(dead_code)]
pub fn compile_kernels(
    arch: onnx2ait::lower::cuda::Arch,
    what: &str,
    dir: &Path,
    sources: &[(PathBuf, String)],
    kernel: &str,
) {
    let Some(nvcc) = onnx2ait::build::nvcc::Nvcc::discover_for_test(arch, what) else { return };
    for (src, _) in sources {
        let resources = compile_kernel(&nvcc, src, dir, kernel);
        eprintln!("{} ({arch:?}):\n{resources}", src.display());
    }
    let _ = std::fs::remove_dir_all(dir);
}
