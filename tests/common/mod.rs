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

/// A convolution of an `h` x `w` x `c` map (batch 8) in `group` groups with an `r` x `s` filter
/// to `k` channels, symmetric padding, a bias and no activations: the problems of the
/// own-kernel template tests.
#[allow(dead_code, clippy::too_many_arguments)]
pub fn conv_problem(
    [h, w, c]: [i64; 3],
    k: i64,
    group: i64,
    [r, s]: [i64; 2],
    pads: [i64; 2],
    strides: [i64; 2],
    dilations: [i64; 2],
    residual: bool,
) -> onnx2ait::lower::ConvProblem {
    let out = |x: i64, f: i64, pad: i64, stride: i64, dil: i64| (x + 2 * pad - (f - 1) * dil - 1) / stride + 1;
    onnx2ait::lower::ConvProblem {
        n: onnx2ait::ir::Dim::known(8),
        h,
        w,
        c,
        k,
        r,
        s,
        p: out(h, r, pads[0], strides[0], dilations[0]),
        q: out(w, s, pads[1], strides[1], dilations[1]),
        pads: [pads[0], pads[1], pads[0], pads[1]],
        strides,
        dilations,
        group,
        bias: true,
        residual,
        pre_act: None,
        act: None,
    }
}

/// The template test's kernels for sm_90a and sm_80 (`$name_compile_for_sm90a` / `_sm80`), each
/// compiling the cases of `compile_all(arch, tag)`.
#[macro_export]
macro_rules! compile_tests_for_both_archs {
    ($sm90a:ident, $sm80:ident) => {
        #[test]
        fn $sm90a() {
            compile_all(onnx2ait::lower::cuda::Arch::Sm90a, "sm90a");
        }

        #[test]
        fn $sm80() {
            compile_all(onnx2ait::lower::cuda::Arch::Sm80, "sm80");
        }
    };
}

/// The fields the lowering gives a convolution kernel (`emit_conv`) for problem `p`: geometry,
/// the weights' element strides `[k, r, s, c]`, argument slots (x, w, bias, residual if any,
/// out), and both epilogue slots in use (ReLU before the residual, SiLU after it), then the
/// instance's own fields.
#[allow(dead_code)]
pub fn conv_kernel_context(
    name: &str,
    batch: &str,
    p: &onnx2ait::lower::ConvProblem,
    [ws_k, ws_r, ws_s, ws_c]: [i64; 4],
    instance: serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    use serde_json::json;
    let mut ctx = json!({
        "name": name, "node": name, "workspace_bytes": 0, "args": [], "n": batch,
        "group": p.group, "cg": p.c / p.group, "kg": p.k / p.group,
        "w_stride_k": ws_k, "w_stride_r": ws_r, "w_stride_s": ws_s, "w_stride_c": ws_c,
        "x_index": 0, "w_index": 1, "bias_index": 2, "res_index": if p.residual { 3 } else { -1 },
        "out_index": if p.residual { 4 } else { 3 },
        "has_bias": p.bias, "has_residual": p.residual,
        "pre_act": "fmaxf(v, 0.0f)", "act": "v / (1.0f + __expf(-v))",
    });
    let map = ctx.as_object_mut().expect("object");
    for (k, v) in p.geometry_fields() {
        map.insert(k.into(), json!(v));
    }
    map.extend(instance);
    ctx
}
