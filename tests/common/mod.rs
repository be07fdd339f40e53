//! Helpers shared by the test binaries that snapshot generated code (`tests/codegen.rs`,
//! `tests/exports.rs`, `tests/rocm.rs`) or compile kernel templates (`tests/im2col_template.rs`,
//! `tests/depthwise_template.rs`); a folder module, so cargo does not build it as a test of
//! its own. Each binary uses some of them, hence `allow(dead_code)` on the others.

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
