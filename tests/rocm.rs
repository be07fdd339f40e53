//! The ROCm target without an AMD GPU: snapshots of the generated tree of every bundled model
//! (`snapshots/rocm__*.snap`), and the compile-only build of a whole ResNet-50 for gfx942 with
//! clang-19 + HIP 5.2 + Composable Kernel (`scripts/setup-rocm.sh`), every object's device code
//! inspected.

mod common;
use common::{bundled_models, tree_text};
use onnx2ait::build::hip::{device_code, HipClang};
use onnx2ait::build::BuildOptions;
use onnx2ait::codegen::generate_rocm;
use onnx2ait::egraph::{optimize, OptimizeOptions};
use onnx2ait::lower::rocm::RocmArch;
use onnx2ait::lower::LowerOptions;
use std::path::{Path, PathBuf};

fn fresh_dir(tag: &str) -> PathBuf {
    common::fresh_dir("rocm", tag)
}

fn generate(model: &Path, out: &Path, lower: &LowerOptions, opts: &OptimizeOptions) -> Result<(), String> {
    let g = onnx2ait::onnx::load_model(model).map_err(|e| e.to_string())?;
    let (opt, _) = optimize(&g, opts).map_err(|e| e.to_string())?;
    generate_rocm(&opt, lower, RocmArch::Gfx942, out).map(|_| ()).map_err(|e| e.to_string())
}

/// insta snapshots (snapshots/rocm__*.snap) of the ROCm tree of every bundled model (gfx942,
/// max batch 8, as the CUDA snapshots), or of the error for a model that does not lower.
/// Regenerate with `INSTA_UPDATE=always cargo test --release --test rocm rocm_tree_snapshots`.
#[test]
fn rocm_tree_snapshots() {
    let opts = OptimizeOptions::standard().expect("rules load");
    let lower = LowerOptions { max_batch: 8, ..LowerOptions::default() };
    for model in bundled_models() {
        let name = model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let out = fresh_dir(&name);
        let text = match generate(&model, &out, &lower, &opts) {
            Ok(()) => tree_text(&out),
            Err(e) => format!("does not lower:\n{e}\n"),
        };
        let _ = std::fs::remove_dir_all(&out);
        insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("rocm__{name}"), text);
        });
    }
}

/// An op the ROCm target does not lower fails loudly, naming the node and its op: the fused
/// attention kernel (NVIDIA wmma) with `--attention fused`.
#[test]
fn unsupported_kernels_name_their_node() {
    let out = fresh_dir("attention-fused");
    let e = generate(
        Path::new("onnx_models/pattern_attention.onnx"),
        &out,
        &LowerOptions { max_batch: 8, ..LowerOptions::default() },
        &OptimizeOptions::pipeline(true).expect("rules load"),
    )
    .expect_err("the fused attention kernel has no ROCm version");
    let _ = std::fs::remove_dir_all(&out);
    assert!(e.contains("node '") && e.contains("Attention") && e.contains("--attention fused"), "{e}");
}

/// The same model gives byte-identical ROCm trees.
#[test]
fn rocm_generation_is_deterministic() {
    let opts = OptimizeOptions::standard().expect("rules load");
    let lower = LowerOptions { max_batch: 16, ..LowerOptions::default() };
    let model = Path::new("onnx_models/pattern_resnet_bottleneck.onnx");
    let (a, b) = (fresh_dir("det-a"), fresh_dir("det-b"));
    generate(model, &a, &lower, &opts).expect("lowers");
    generate(model, &b, &lower, &opts).expect("lowers");
    assert_eq!(tree_text(&a), tree_text(&b));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
}

/// Every kernel of the generated ResNet-50 compiled for gfx942 with clang-19 in HIP mode and CK,
/// linked into libmodel.so: every object of a source with kernels (our own families, model.cu, CK
/// instances) holds a gfx942 code object with kernels, every CK instance MFMA instructions; node
/// launchers (host code calling instances) hold none. Skipped with a printed reason when the
/// toolchain is missing (scripts/setup-rocm.sh installs it; scripts/test.sh runs it), except in
/// CI or with ONNX2AIT_REQUIRE_ROCM, where that fails.
#[test]
fn resnet50_builds_for_gfx942_with_mfma() {
    let model = Path::new("onnx_models/generated/resnet50.onnx");
    let Some(clang) = HipClang::discover_for_test(RocmArch::Gfx942, "rocm::resnet50_builds_for_gfx942_with_mfma")
    else {
        return;
    };
    assert!(model.exists(), "{} is missing: run scripts/gen-models.sh", model.display());
    let out = fresh_dir("resnet50");
    let g = onnx2ait::onnx::load_model(model).expect("resnet50 loads");
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    let lower = LowerOptions { max_batch: 64, ..LowerOptions::default() };
    let gen = generate_rocm(&opt, &lower, RocmArch::Gfx942, &out).expect("resnet50 lowers for ROCm");
    let convs = gen.program.kernels.iter().filter(|k| k.template == "conv2d_library").count();
    assert_eq!(convs, 53, "every conv of ResNet-50 is a CK conv");
    let started = std::time::Instant::now();
    let report = onnx2ait::build::build(
        &out,
        &gen.files.sources,
        &gen.files.headers,
        &clang,
        &BuildOptions { jobs: None, cache_dir: None, progress: true, ..Default::default() },
        "libmodel.so",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{} ({:.0} s)", report.summary(), started.elapsed().as_secs_f64());
    assert_eq!(report.compiled, gen.files.sources.len());
    assert!(out.join("libmodel.so").exists());
    let (mut mfma_total, mut with_kernels, mut launchers) = (0, 0, 0);
    for src in &gen.files.sources {
        let obj = find_object(&out.join("obj"), src);
        let code = device_code(&obj).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let name = src.to_string_lossy();
        let text = std::fs::read_to_string(out.join(src)).unwrap();
        if !name.starts_with("o2a_") && !text.contains("__global__") {
            // A node launcher: host code calling library instances, no device code.
            assert!(code.iter().all(|c| c.kernels == 0), "{name}: unexpected kernels {code:?}");
            launchers += 1;
            continue;
        }
        let gfx = code.iter().find(|c| c.target.ends_with("gfx942")).unwrap_or_else(|| {
            panic!("{name}: no gfx942 code object ({:?})", code.iter().map(|c| &c.target).collect::<Vec<_>>())
        });
        assert!(gfx.kernels > 0, "{name}: its gfx942 code object has no kernels");
        if name.starts_with("o2a_") {
            assert!(gfx.mfma > 0, "{name}: a CK instance without MFMA instructions");
            mfma_total += gfx.mfma;
        }
        with_kernels += 1;
    }
    assert!(with_kernels + launchers == gen.files.sources.len());
    eprintln!("{with_kernels} objects with gfx942 kernels, {launchers} host-only node launchers");
    eprintln!("{} CK instances, {mfma_total} MFMA instructions in all", gen.program.library.len());
    let _ = std::fs::remove_dir_all(&out);
}

/// The object the build cached for `src` (`obj/<stem>-<hash>.o`).
fn find_object(obj_dir: &Path, src: &Path) -> PathBuf {
    let stem = src.file_stem().unwrap().to_string_lossy().to_string();
    std::fs::read_dir(obj_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&format!("{stem}-")) && n.ends_with(".o")
            })
        })
        .unwrap_or_else(|| panic!("no object for {}", src.display()))
}
