//! The ROCm target without an AMD GPU: snapshots of the generated tree of every bundled model
//! (`snapshots/rocm__*.snap`), and compile-only builds of whole networks for gfx942 with
//! clang-19 + HIP 5.2 + Composable Kernel (`scripts/setup-rocm.sh`), every object's device code
//! inspected: ResNet-50, MobileNetV2 (depthwise convolutions), the 12-layer BERT encoder and the
//! tiny ViT and BERT exports.

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
/// What a whole-model gfx942 build held: objects with gfx942 kernels, host-only node launchers,
/// CK instances and their MFMA instructions.
struct Gfx942Build {
    with_kernels: usize,
    launchers: usize,
    instances: usize,
    mfma: usize,
}

/// Builds the generated ROCm tree of `model` for gfx942 into `libmodel.so` and checks every
/// object's device code: a gfx942 code object with kernels in every object that defines kernels
/// (MFMA instructions in every CK instance), none in the node launchers (host code). `check`
/// sees the lowered program first. `None` when the toolchain is missing (outside CI).
fn build_for_gfx942(
    test: &str,
    model: &Path,
    lower: &LowerOptions,
    check: impl FnOnce(&onnx2ait::lower::Program),
) -> Option<Gfx942Build> {
    let clang = HipClang::discover_for_test(RocmArch::Gfx942, test)?;
    let tag = model.file_stem().unwrap().to_string_lossy().to_string();
    let out = fresh_dir(&tag);
    let g = onnx2ait::onnx::load_model(model).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    let gen =
        generate_rocm(&opt, lower, RocmArch::Gfx942, &out).unwrap_or_else(|e| panic!("{tag} lowers for ROCm: {e}"));
    check(&gen.program);
    let started = std::time::Instant::now();
    let report = onnx2ait::build::build(
        &out,
        &gen.files.sources,
        &gen.files.headers,
        &clang,
        &BuildOptions { jobs: None, cache_dir: None, progress: true, ..Default::default() },
        "libmodel.so",
    )
    .unwrap_or_else(|e| panic!("{tag}: {e}"));
    eprintln!("{tag}: {} ({:.0} s)", report.summary(), started.elapsed().as_secs_f64());
    assert_eq!(report.compiled, gen.files.sources.len());
    assert!(out.join("libmodel.so").exists());
    let mut b = Gfx942Build { with_kernels: 0, launchers: 0, instances: gen.program.library.len(), mfma: 0 };
    for src in &gen.files.sources {
        let obj = find_object(&out.join("obj"), src);
        let code = device_code(&obj).unwrap_or_else(|e| panic!("{}: {e}", src.display()));
        let name = src.to_string_lossy();
        let text = std::fs::read_to_string(out.join(src)).unwrap();
        if !name.starts_with("o2a_") && !text.contains("__global__") {
            // A node launcher: host code calling library instances, no device code.
            assert!(code.iter().all(|c| c.kernels == 0), "{tag}/{name}: unexpected kernels {code:?}");
            b.launchers += 1;
            continue;
        }
        let gfx = code.iter().find(|c| c.target.ends_with("gfx942")).unwrap_or_else(|| {
            panic!("{tag}/{name}: no gfx942 code object ({:?})", code.iter().map(|c| &c.target).collect::<Vec<_>>())
        });
        assert!(gfx.kernels > 0, "{tag}/{name}: its gfx942 code object has no kernels");
        if name.starts_with("o2a_") {
            assert!(gfx.mfma > 0, "{tag}/{name}: a CK instance without MFMA instructions");
            b.mfma += gfx.mfma;
        }
        b.with_kernels += 1;
    }
    assert!(b.with_kernels + b.launchers == gen.files.sources.len());
    eprintln!("{tag}: {} objects with gfx942 kernels, {} host-only node launchers", b.with_kernels, b.launchers);
    eprintln!("{tag}: {} CK instances, {} MFMA instructions in all", b.instances, b.mfma);
    let _ = std::fs::remove_dir_all(&out);
    Some(b)
}

fn kernels_of(program: &onnx2ait::lower::Program, template: &str) -> usize {
    program.kernels.iter().filter(|k| k.template == template).count()
}

#[test]
fn resnet50_builds_for_gfx942_with_mfma() {
    let model = Path::new("onnx_models/generated/resnet50.onnx");
    assert!(model.exists(), "{} is missing: run scripts/gen-models.sh", model.display());
    let lower = LowerOptions { max_batch: 64, ..LowerOptions::default() };
    build_for_gfx942("rocm::resnet50_builds_for_gfx942_with_mfma", model, &lower, |p| {
        assert_eq!(kernels_of(p, "conv2d_library"), 53, "every conv of ResNet-50 is a CK conv");
    });
}

/// torchvision's MobileNetV2 in the TorchScript exporter's topology (onnx_models/cnn_families.py,
/// written into a scratch folder with the project's .venv): its 1x1 convolutions on CK, its 17
/// depthwise convolutions on our HIP kernel.
#[test]
fn mobilenet_v2_builds_for_gfx942_with_mfma() {
    let python = Path::new(".venv/bin/python");
    assert!(python.exists(), "{} is missing: run scripts/setup-python.sh", python.display());
    let dir = fresh_dir("cnn_families");
    let status = std::process::Command::new(python)
        .args(["onnx_models/cnn_families.py", "--model", "mobilenet_v2", "--out"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .status()
        .expect("runs onnx_models/cnn_families.py");
    assert!(status.success(), "onnx_models/cnn_families.py failed");
    let lower = LowerOptions { max_batch: 8, ..LowerOptions::default() };
    build_for_gfx942("rocm::mobilenet_v2_builds_for_gfx942_with_mfma", &dir.join("mobilenet_v2.onnx"), &lower, |p| {
        assert_eq!(kernels_of(p, "conv2d_depthwise"), 17, "every depthwise conv on the HIP kernel");
        assert_eq!(kernels_of(p, "conv2d_library"), 35, "every other conv a CK conv");
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// The 12-layer BERT encoder of onnx_models/generated (bert_encoder.py), sequence fixed at 128:
/// its products on CK GEMMs, softmax and layernorm on our HIP kernels (attention unfused: ROCm
/// has no fused attention kernel yet).
#[test]
fn bert12_builds_for_gfx942_with_mfma() {
    let model = Path::new("onnx_models/generated/bert12.onnx");
    assert!(model.exists(), "{} is missing: run scripts/gen-models.sh", model.display());
    let lower =
        LowerOptions { max_batch: 8, dims: [("S".to_string(), 128)].into_iter().collect(), ..LowerOptions::default() };
    build_for_gfx942("rocm::bert12_builds_for_gfx942_with_mfma", model, &lower, |p| {
        assert!(kernels_of(p, "gemm_library") >= 12 * 4, "every projection a CK GEMM");
        assert_eq!(kernels_of(p, "softmax"), 12, "one softmax per layer");
    });
}

/// The tiny exports of onnx_models/exports (PyTorch's TorchScript-based exporter): ViT (patch
/// convolution, class token, heads-first attention) and BERT (embeddings, attention mask,
/// heads-last attention, sequence fixed at 16).
#[test]
fn transformer_exports_build_for_gfx942_with_mfma() {
    for (stem, dims) in [("vit_tiny_torchscript", vec![]), ("bert_tiny_torchscript", vec![("seq".to_string(), 16)])] {
        let model = Path::new("onnx_models/exports").join(format!("{stem}.onnx"));
        let lower = LowerOptions { max_batch: 8, dims: dims.into_iter().collect(), ..LowerOptions::default() };
        let test = format!("rocm::transformer_exports_build_for_gfx942_with_mfma ({stem})");
        let Some(b) = build_for_gfx942(&test, &model, &lower, |p| {
            assert!(kernels_of(p, "gemm_library") > 0, "{stem}: its products on CK GEMMs");
        }) else {
            return;
        };
        assert!(b.instances > 0 && b.mfma > 0, "{stem}: no CK instance with MFMA instructions");
    }
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

/// `onnx2ait profile --target rocm --build-only`: the ROCm profiler (CUDA's profiler template
/// compiled as HIP, with every candidate CK instance of the model's products) builds for gfx942
/// into `libprofile.so`, which exports the profiler's C API and every candidate; its own object
/// holds gfx942 kernels (reference, fill, compare, spin), each candidate MFMA instructions.
/// Timing needs an AMD GPU, which CI does not have: this proves the build, not the times.
#[test]
fn rocm_profiler_builds_for_gfx942() {
    use onnx2ait::profile::{ProfileOptions, ProfileTarget};
    let Some(_) = HipClang::discover_for_test(RocmArch::Gfx942, "rocm::rocm_profiler_builds_for_gfx942") else {
        return;
    };
    let work = fresh_dir("profiler");
    let g = onnx2ait::onnx::load_model(Path::new("onnx_models/pattern_mlp.onnx")).expect("loads");
    let opts = ProfileOptions {
        target: ProfileTarget::Rocm(RocmArch::Gfx942),
        lower: LowerOptions { max_batch: 8, ..LowerOptions::default() },
        optimize: OptimizeOptions::standard().expect("rules load"),
        cache: work.join("cache.json"),
        work_dir: work.clone(),
        build: BuildOptions { jobs: None, cache_dir: None, progress: true, ..Default::default() },
        warmup: 0,
        iters: 1,
        progress: true,
        build_only: true,
        // One part, so one library holds every candidate (the checks below read it).
        part_sources: Some(usize::MAX),
    };
    let problems = onnx2ait::profile::problems(&g, &opts).expect("problems");
    assert!(!problems.is_empty() && problems.iter().all(|p| p.kind == "gemm"), "the MLP's products");
    let candidates: std::collections::BTreeSet<String> =
        problems.iter().flat_map(|p| p.candidates.iter().map(|c| c.name.clone())).collect();
    // Each product has several CK tiles to choose from, the heuristic's among them.
    for p in &problems {
        assert!(p.candidates.len() > 1, "{}: {} candidates", p.signature, p.candidates.len());
        assert!(p.candidates.iter().any(|c| c.config == p.heuristic), "{}", p.signature);
    }
    onnx2ait::profile::profile(&g, &opts).expect("the profiler builds");
    let lib = work.join("libprofile.so");
    let nm = std::process::Command::new("nm").args(["-D", "--defined-only"]).arg(&lib).output().expect("nm runs");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    for needed in ["o2a_profile_num_cases", "o2a_profile_run", "o2a_profile_device_name"] {
        assert!(symbols.contains(needed), "libprofile.so does not export {needed}");
    }
    for c in &candidates {
        assert!(symbols.contains(c.as_str()), "libprofile.so lacks candidate {c}");
        let code = device_code(&find_object(&work.join("obj"), Path::new(&format!("{c}.cu")))).expect("device code");
        assert!(code.iter().any(|d| d.target.ends_with("gfx942") && d.mfma > 0), "{c}: no gfx942 MFMA code");
    }
    let code = device_code(&find_object(&work.join("obj"), Path::new("profiler.cu"))).expect("device code");
    assert!(code.iter().any(|d| d.target.ends_with("gfx942") && d.kernels >= 4), "profiler.cu: {code:?}");
    let _ = std::fs::remove_dir_all(&work);
}
