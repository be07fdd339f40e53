//! Code generation without a GPU: snapshots of the generated tree of every bundled model,
//! determinism, and the compile-only build of a whole ResNet-50 with the pinned nvcc + CUTLASS.

mod common;
use common::{bundled_models, tree_text};
use onnx2ait::build::nvcc::Nvcc;
use onnx2ait::build::BuildOptions;
use onnx2ait::codegen::generate_cuda;
use onnx2ait::egraph::{optimize, OptimizeOptions};
use onnx2ait::lower::cuda::Arch;
use onnx2ait::lower::target::ProfiledTarget;
use onnx2ait::lower::LowerOptions;
use std::path::{Path, PathBuf};

fn fresh_dir(tag: &str) -> PathBuf {
    common::fresh_dir("codegen", tag)
}

/// Generates `model` into `out`; the error text (paths made relative) when it does not lower.
fn generate(model: &Path, out: &Path, max_batch: i64) -> Result<(), String> {
    generate_with(model, out, max_batch, &OptimizeOptions::standard().expect("rules load"))
}

fn generate_with(model: &Path, out: &Path, max_batch: i64, opts: &OptimizeOptions) -> Result<(), String> {
    let g = onnx2ait::onnx::load_model(model).map_err(|e| e.to_string())?;
    let (opt, _) = optimize(&g, opts).map_err(|e| e.to_string())?;
    let opts = LowerOptions { max_batch, ..LowerOptions::default() };
    generate_cuda(&opt, &opts, Arch::Sm90, out).map(|_| ()).map_err(|e| e.to_string())
}

/// insta snapshots (snapshots/codegen__*.snap) of the generated tree of every bundled model —
/// sources, headers, weights index and build metadata — or of the error for a model that does
/// not lower yet. A template change shows up as a reviewed diff: regenerate with
/// `INSTA_UPDATE=always cargo test --release --test codegen generated_tree_snapshots` and review
/// with `git diff snapshots/` (or `cargo insta review`).
#[test]
fn generated_tree_snapshots() {
    for model in bundled_models() {
        let name = model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let out = fresh_dir(&name);
        let text = match generate(&model, &out, 8) {
            Ok(()) => tree_text(&out),
            Err(e) => format!("does not lower:\n{e}\n"),
        };
        let _ = std::fs::remove_dir_all(&out);
        insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("codegen__{name}"), text);
        });
    }
}

/// The fused attention kernel (`compile --attention fused`) as generated for the bundled
/// attention block, its q, k and v projections packed into one product: its template's changes
/// are reviewed here.
#[test]
fn fused_attention_snapshot() {
    let model = Path::new("onnx_models/pattern_attention.onnx");
    let out = fresh_dir("pattern_attention_fused");
    generate_with(model, &out, 8, &OptimizeOptions::pipeline(true).expect("rules load")).expect("lowers");
    let text = tree_text(&out);
    let _ = std::fs::remove_dir_all(&out);
    assert!(text.contains("attention"), "no attention kernel in the tree");
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("codegen__pattern_attention_fused", text);
    });
}

/// The squeeze-and-excitation scale kernel (`compile --squeeze-excite fused`) as generated for a
/// depthwise conv + SE block (onnx_models/rules/squeeze_excite_depthwise.onnx): the snapshot
/// reviews its template's changes; then the whole library is built with the pinned nvcc for
/// sm_90a and sm_80 at fp16, and for sm_90a at fp32 storage (every kernel of this model is our
/// own, so the builds take seconds). The kernel has not run on a GPU: this checks that it
/// compiles, tests/egraph_models.rs checks its semantics on the reference executor.
#[test]
fn squeeze_excite_kernel_snapshot_and_nvcc_builds() {
    use onnx2ait::lower::Precision;
    let model = Path::new("onnx_models/rules/squeeze_excite_depthwise.onnx");
    let opts = OptimizeOptions::standard().and_then(|o| o.with_squeeze_excite(true)).expect("rules load");
    let g = onnx2ait::onnx::load_model(model).expect("loads");
    let (opt, _) = optimize(&g, &opts).expect("optimises");
    let out = fresh_dir("squeeze_excite_fused");
    let gen = generate_cuda(&opt, &LowerOptions { max_batch: 8, ..LowerOptions::default() }, Arch::Sm90a, &out)
        .expect("lowers");
    let templates: Vec<&str> = gen.program.kernels.iter().map(|k| k.template.as_str()).collect();
    assert!(templates.contains(&"squeeze_excite"), "{templates:?}");
    assert!(!templates.iter().any(|t| t.starts_with("conv2d_library") || *t == "global_pool"), "{templates:?}");
    let text = tree_text(&out);
    let _ = std::fs::remove_dir_all(&out);
    insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
        insta::assert_snapshot!("codegen__squeeze_excite_fused", text);
    });
    for (arch, precision) in
        [(Arch::Sm90a, Precision::Fp16), (Arch::Sm80, Precision::Fp16), (Arch::Sm90a, Precision::Fp32)]
    {
        let Some(nvcc) = Nvcc::discover_for_test(arch, "the squeeze-excite compile test (nvcc)") else { return };
        let out = fresh_dir(&format!("squeeze_excite_{}_{}", arch.as_str(), precision.name()));
        let lower = LowerOptions { max_batch: 8, precision, ..LowerOptions::default() };
        let gen = generate_cuda(&opt, &lower, arch, &out).expect("lowers");
        let report = build_generated(&out, &gen, &nvcc, false)
            .unwrap_or_else(|e| panic!("{} {}: {e}", arch.as_str(), precision.name()));
        assert_eq!(report.compiled, gen.files.sources.len());
        assert!(out.join("libmodel.so").exists());
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// The NHWC global pools of onnx_models/rules/squeeze_excite.onnx (unfused: three of them, 16 to
/// 48 channels, with the split-pool partial: `partials/pool_split.hbs`) as the lowering writes
/// them, each compiled alone, warning-free, with the pinned nvcc for sm_90a and sm_80; and their
/// workspace holds the split's partial rows. Compile-only: the GPU check validates them (the
/// bundled pool and EfficientNet models at batch 1, where the pooling is split).
#[test]
fn global_pool_kernels_build_with_nvcc() {
    use onnx2ait::build::Compiler;
    let model = Path::new("onnx_models/rules/squeeze_excite.onnx");
    let g = onnx2ait::onnx::load_model(model).expect("loads");
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    for arch in [Arch::Sm90a, Arch::Sm80] {
        let out = fresh_dir(&format!("global_pool_{}", arch.as_str()));
        let gen =
            generate_cuda(&opt, &LowerOptions { max_batch: 8, ..LowerOptions::default() }, arch, &out).expect("lowers");
        let pools: Vec<_> = gen.program.kernels.iter().filter(|k| k.template == "global_pool").collect();
        assert_eq!(pools.len(), 3, "{:?}", gen.program.kernels.iter().map(|k| &k.template).collect::<Vec<_>>());
        for k in &pools {
            assert!(k.workspace_bytes >= 512 * 16 * 4, "{}: workspace {}", k.name, k.workspace_bytes);
        }
        let Some(nvcc) = Nvcc::discover_for_test(arch, "the global-pool compile test (nvcc)") else { return };
        for k in &pools {
            let src = out.join(format!("{}.cu", k.name));
            let text = std::fs::read_to_string(&src).expect("kernel source");
            assert!(text.contains("o2a_pool_split") && text.contains("o2a_global_combine"), "{}", src.display());
            let obj = src.with_extension("o");
            let run = nvcc.compile_command(&src, &obj, &out).output().expect("nvcc runs");
            let log = format!("{}{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
            assert!(run.status.success(), "nvcc failed on {} ({}):\n{log}", src.display(), arch.as_str());
            assert!(!log.to_lowercase().contains("warning"), "nvcc warns on {}:\n{log}", src.display());
        }
        if arch == Arch::Sm90a {
            assert_eq!(split_plan_violations(&nvcc, &out, &pools[0].name), 0, "o2a_plan_split breaks its invariants");
        }
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// The split rule of `partials/pool_split.hbs` run on the host: a generated global-pool kernel
/// file with a checker appended, built into a library and called. Returns the number of broken
/// invariants over a grid of (images, pixels, channel vectors): every pixel in exactly one
/// non-empty range, the partial rows within the workspace, no split without a workspace or when
/// the images alone fill the GPU, every thread with at least its minimum of pixels, and
/// EfficientNet-B0's first pool at batch 1 (112x112 pixels, 4 vectors) spread over blocks.
fn split_plan_violations(nvcc: &Nvcc, out: &Path, kernel: &str) -> i32 {
    let mut src = std::fs::read_to_string(out.join(format!("{kernel}.cu"))).expect("kernel source");
    src.push_str(
        r#"
// model.cu's, which this library does not link.
void o2a_set_error(const char*, ...) {}

extern "C" int o2a_split_plan_violations() {
  int bad = 0;
  const int64_t ns[] = {1, 2, 3, 7, 8, 33, 64, 65, 128, 263, 264, 511, 512, 513, 4096};
  const int64_t ls[] = {1, 7, 49, 196, 784, 3136, 12544, 50176, int64_t(1) << 20};
  const int64_t cvs[] = {1, 2, 3, 4, 12, 32, 33, 144, 160, 1000};
  for (int64_t n : ns) for (int64_t l : ls) for (int64_t cv : cvs) for (bool may : {false, true}) {
    const o2a_split_plan p = o2a_plan_split(n, l, cv, may);
    const int64_t shares = O2A_SPLIT_THREADS / p.block.x, cblocks = p.grid.x;
    bad += p.splits < 1 || p.chunk < 1;
    bad += p.splits * p.chunk < l;                       // every pixel in a range
    bad += (p.splits - 1) * p.chunk >= l;                // no empty range
    bad += p.splits > 1 && n * p.splits > O2A_SPLIT_MAX_ROWS;  // the rows fit the workspace
    bad += !may && p.splits != 1;
    bad += p.splits > 1 && n * cblocks >= O2A_SPLIT_TARGET_BLOCKS;
    bad += p.splits > 1 && p.chunk < shares * O2A_SPLIT_MIN_PIXELS_PER_THREAD;
    bad += int64_t(p.block.x) * p.block.y != O2A_SPLIT_THREADS;
    bad += cblocks * p.block.x < cv || (cblocks - 1) * p.block.x >= cv;  // every vector, no idle block
    bad += int64_t(p.grid.y) != p.splits || int64_t(p.grid.z) != (n < 65535 ? n : 65535);
  }
  const o2a_split_plan e = o2a_plan_split(1, 112 * 112, 4, true);
  bad += 100 * (e.splits < 32);
  return bad;
}
"#,
    );
    let name = "k999_split_plan_check.cu";
    std::fs::write(out.join(name), src).expect("write");
    let opts = BuildOptions { jobs: Some(1), cache_dir: None, ..Default::default() };
    let headers = [PathBuf::from("common.cuh"), PathBuf::from("library.cuh")];
    let r = onnx2ait::build::build(out, &[PathBuf::from(name)], &headers, nvcc, &opts, "libcheck.so")
        .unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: the library was just built from a generated kernel file plus the function above;
    // its initialisers only register fat binaries with the static CUDA runtime, and the function
    // takes no arguments and launches nothing.
    unsafe {
        let lib = libloading::Library::new(&r.lib).expect("load the check library");
        let f: libloading::Symbol<unsafe extern "C" fn() -> i32> =
            lib.get(b"o2a_split_plan_violations").expect("symbol");
        f()
    }
}

/// The unfused squeeze-and-excitation blocks of onnx_models/rules/squeeze_excite.onnx (one with
/// a squeeze width of 6) lower without a `pad_channels` kernel and without the direct conv: the
/// padding lives in the weights (`onnx2ait::egraph::channel_padding`), so both dense layers run
/// on library instances.
#[test]
fn odd_squeeze_widths_need_no_padding_kernel() {
    let model = Path::new("onnx_models/rules/squeeze_excite.onnx");
    let out = fresh_dir("squeeze_excite_unfused");
    let g = onnx2ait::onnx::load_model(model).expect("loads");
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    let gen = generate_cuda(&opt, &LowerOptions { max_batch: 8, ..LowerOptions::default() }, Arch::Sm90a, &out)
        .expect("lowers");
    let _ = std::fs::remove_dir_all(&out);
    let templates: Vec<&str> = gen.program.kernels.iter().map(|k| k.template.as_str()).collect();
    assert!(!templates.iter().any(|t| *t == "pad_channels" || *t == "conv2d_direct"), "{templates:?}");
    assert_eq!(templates.iter().filter(|t| **t == "global_pool").count(), 3, "{templates:?}");
}

/// ResNeXt-style grouped convolutions (onnx_models/pattern_resnext_grouped.onnx: 4 and 8 channels
/// per group, stride 2, a residual epilogue, and 32 filters per group): those with 32 filters per
/// group lower to the grouped CUTLASS instance (one group per tile), 4 and 8 per group to the
/// tensor-core grouped kernel (`ops::conv::GROUP_MMA_TEMPLATE`; groups of 4 two at a time, see
/// `CudaTarget::conv2d`, `ops::conv::group_mma_tile`), and the library builds with the
/// pinned nvcc for sm_90a (the instances use the sm80 mainloop there too). Compile-only: the GPU
/// check validates the model's numbers (scripts/gpu-check.sh's bundled-model loop).
#[test]
fn grouped_convolutions_build_with_nvcc_for_sm90a() {
    let model = Path::new("onnx_models/pattern_resnext_grouped.onnx");
    let g = onnx2ait::onnx::load_model(model).expect("loads");
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    let out = fresh_dir("resnext_grouped");
    let gen = generate_cuda(&opt, &LowerOptions { max_batch: 8, ..LowerOptions::default() }, Arch::Sm90a, &out)
        .expect("lowers");
    let convs: Vec<_> = gen.program.kernels.iter().filter(|k| k.template.starts_with("conv2d")).collect();
    assert_eq!(convs.len(), 4, "{:?}", gen.program.kernels.iter().map(|k| &k.template).collect::<Vec<_>>());
    for k in &convs {
        let narrow = k.context["k"].as_i64().zip(k.context["group"].as_i64()).is_some_and(|(k, g)| k / g < 32);
        if narrow {
            assert_eq!(k.template, "conv2d_group_mma", "{}", k.node);
            continue;
        }
        assert_eq!(k.template, "conv2d_library", "{}", k.node);
        let dispatch = k.context["dispatch"].as_array().expect("dispatch");
        assert!(dispatch.iter().all(|d| d["config"].as_str().is_some_and(|c| c.starts_with("conv2d_group_sm80 "))));
    }
    for template in ["conv2d_group_mma", "conv2d_library"] {
        assert!(convs.iter().any(|k| k.template == template), "{template}");
    }
    let configs: Vec<&str> = gen.program.library.iter().map(|l| l.config.as_str()).collect();
    assert!(!configs.is_empty() && configs.iter().all(|c| c.contains(" single g")), "{configs:?}");
    let Some(nvcc) = Nvcc::discover_for_test(Arch::Sm90a, "the grouped-convolution compile test (nvcc)") else {
        let _ = std::fs::remove_dir_all(&out);
        return;
    };
    let report = build_generated(&out, &gen, &nvcc, false).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", report.summary());
    assert_eq!(report.compiled, gen.files.sources.len());
    assert!(out.join("libmodel.so").exists());
    let _ = std::fs::remove_dir_all(&out);
}

/// nvcc builds a generated model's sources into `out/libmodel.so` (`progress`: a line per source).
fn build_generated(
    out: &Path,
    gen: &onnx2ait::codegen::GeneratedModel,
    nvcc: &Nvcc,
    progress: bool,
) -> onnx2ait::Result<onnx2ait::build::BuildReport> {
    let opts = BuildOptions { jobs: None, cache_dir: None, progress, ..Default::default() };
    onnx2ait::build::build(out, &gen.files.sources, &gen.files.headers, nvcc, &opts, "libmodel.so")
}

/// The same model and options give byte-identical files, weights included.
#[test]
fn generation_is_deterministic() {
    for model in ["onnx_models/pattern_resnet_bottleneck.onnx", "onnx_models/pattern_attention.onnx"] {
        let (a, b) = (fresh_dir("det-a"), fresh_dir("det-b"));
        generate(Path::new(model), &a, 16).unwrap_or_else(|e| panic!("{model}: {e}"));
        generate(Path::new(model), &b, 16).unwrap_or_else(|e| panic!("{model}: {e}"));
        let list = |d: &Path| {
            let mut v: Vec<_> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name()).collect();
            v.sort();
            v
        };
        assert_eq!(list(&a), list(&b), "{model}");
        for f in list(&a) {
            let (x, y) = (std::fs::read(a.join(&f)).unwrap(), std::fs::read(b.join(&f)).unwrap());
            assert!(x == y, "{model}: {} differs between two runs", f.to_string_lossy());
        }
        let _ = std::fs::remove_dir_all(&a);
        let _ = std::fs::remove_dir_all(&b);
    }
}

/// The compile-only build of a whole model: every kernel of the generated ResNet-50 compiled with
/// the pinned nvcc and CUTLASS wheels (scripts/setup-python.sh) and linked into libmodel.so. No
/// GPU is needed. In CI (env CI set) a missing toolchain fails the test; elsewhere it is skipped
/// with a message.
#[test]
fn resnet50_builds_with_nvcc() {
    let model = Path::new("onnx_models/generated/resnet50.onnx");
    let Some(nvcc) = Nvcc::discover_for_test(Arch::Sm90, "the compile-only test (nvcc and CUTLASS)") else { return };
    assert!(model.exists(), "{} is missing: run scripts/gen-models.sh", model.display());
    let out = fresh_dir("resnet50");
    let g = onnx2ait::onnx::load_model(model).expect("resnet50 loads");
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    let gen = generate_cuda(&opt, &LowerOptions { max_batch: 256, ..LowerOptions::default() }, Arch::Sm90, &out)
        .expect("resnet50 lowers");
    let convs = gen.program.kernels.iter().filter(|k| k.template.starts_with("conv2d")).count();
    assert_eq!(convs, 53, "every conv of ResNet-50 is one kernel");
    let report = build_generated(&out, &gen, &nvcc, true).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{}", report.summary());
    assert_eq!(report.compiled, gen.files.sources.len());
    assert!(out.join("libmodel.so").exists());
    // Nothing changed: nothing recompiles.
    let again = build_generated(&out, &gen, &nvcc, false).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(again.compiled, 0, "{}", again.summary());
    let _ = std::fs::remove_dir_all(&out);
}

/// Instance sharing (`--reuse-within`, `onnx2ait::lower::sharing`) on ResNet-50 with the H200's
/// profile (tests/fixtures/h200_profile_cache.json): fewer instances than the fastest-each choice,
/// every batch range's modelled library time within the 1% budget, and the generated library made
/// of the plan's instances only.
#[test]
fn resnet50_shares_instances_under_the_h200_profile() {
    use onnx2ait::lower::cuda::CudaTarget;
    use onnx2ait::lower::sharing;
    let model = Path::new("onnx_models/generated/resnet50.onnx");
    assert!(model.exists(), "{} is missing: run scripts/gen-models.sh", model.display());
    let fixture = Path::new("tests/fixtures/h200_profile_cache.json");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let device = doc["devices"].as_object().unwrap().keys().next().unwrap().clone();
    let times = onnx2ait::profile::cache::ProfileCache::open(fixture).unwrap().measurements(&device);
    let g = onnx2ait::onnx::load_model(model).expect("resnet50 loads");
    let (opt, _) = optimize(&g, &OptimizeOptions::standard().expect("rules load")).expect("optimises");
    let opts = LowerOptions { max_batch: 256, ..LowerOptions::default() };
    let target = || CudaTarget::new(Arch::Sm90a).with_max_batch(256).with_measurements(times.clone());
    let fastest = onnx2ait::lower::lower(&opt, &target(), &opts).expect("lowers");
    let (shared_target, plan) = sharing::share(target(), &opt, &opts, 0.01).expect("plans");
    let plan = plan.expect("a plan: the target has times");
    let shared = onnx2ait::lower::lower(&opt, &shared_target, &opts).expect("lowers");
    let measured = |p: &onnx2ait::lower::Program| {
        p.kernels
            .iter()
            .filter_map(|k| k.context.get("dispatch")?.as_array().cloned())
            .flatten()
            .all(|d| d["measured"] == true)
    };
    assert!(measured(&fastest) && measured(&shared), "the fixture times every ResNet-50 problem");
    assert_eq!(plan.unshared, fastest.library.len());
    eprintln!(
        "instances: {} fastest-each, {} shared; slowdown by range {:?}; worst choice {:.3}",
        fastest.library.len(),
        shared.library.len(),
        plan.slowdown_by_range,
        plan.worst_slowdown
    );
    assert!(shared.library.len() * 4 <= fastest.library.len() * 3, "sharing saves at least a quarter of the instances");
    assert!(shared.library.iter().all(|l| plan.instances.contains(&l.name)));
    // ResNet-50 has no run-time dim but the batch: one range per batch bucket.
    let ranges: Vec<String> = plan.slowdown_by_range.keys().map(|p| p.to_string()).collect();
    assert_eq!(ranges, ["batch 1", "batch 8", "batch 64", "batch 256"]);
    assert!(plan.slowdown_by_range.values().all(|r| (1.0..=1.01).contains(r)), "{:?}", plan.slowdown_by_range);
}
