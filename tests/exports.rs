//! Real PyTorch exports of transformers, as users make them (`onnx_models/exports/`, written by
//! `scripts/gpu/export_transformers.py --size tiny`): Hugging Face `BertModel` (input ids and an
//! attention mask, dynamic `batch` and `seq`) and torchvision's `VisionTransformer` (dynamic
//! `batch`), each from both PyTorch exporters — the TorchScript-based one (`dynamo=False`,
//! opset 17), whose shape subgraphs (`Shape → Gather → Unsqueeze → Concat`, `Where(Equal(shape,
//! -1), 1, shape)` before `Expand`) must be tracked symbolically, and the `torch.export`-based
//! default (opset 18).
//!
//! Each export must (1) infer its outputs in the model's own dims, (2) agree with ONNX Runtime
//! through the reference executor at several (batch, seq) points, a non-power-of-two sequence
//! included, (3) compute the same after optimisation, and (4) generate CUDA code once `seq` is
//! bound (`--dim seq=16`); the generated trees are insta snapshots. (5) BERT also generates with
//! `seq` a run-time dim (`--dim seq=1..64`): one build for every length.

mod common;
use common::tree_text;
use onnx2ait::codegen::generate_cuda;
use onnx2ait::egraph::{optimize, OptimizeOptions};
use onnx2ait::ir::{DType, Tensor};
use onnx2ait::lower::LowerOptions;
use onnx2ait::validate::inputs::random_tensor;
use onnx2ait::validate::{validate, Options};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// (file stem, expected output types).
const EXPORTS: &[(&str, &[&str])] = &[
    ("bert_tiny_torchscript", &["float32[batch,seq,64]", "float32[batch,64]"]),
    ("bert_tiny_dynamo", &["float32[batch,seq,64]", "float32[batch,64]"]),
    ("vit_tiny_torchscript", &["float32[batch,10]"]),
    ("vit_tiny_dynamo", &["float32[batch,10]"]),
];

fn path(stem: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models").join("exports").join(format!("{stem}.onnx"))
}

/// The symbolic dims of an export's inputs: BERT has `batch` and `seq`, ViT only `batch`.
fn dims(stem: &str, batch: i64, seq: i64) -> BTreeMap<String, i64> {
    let mut d = BTreeMap::from([("batch".to_string(), batch)]);
    if stem.starts_with("bert") {
        d.insert("seq".to_string(), seq);
    }
    d
}

#[test]
fn exports_infer_outputs_in_the_models_own_dims() {
    for (stem, want) in EXPORTS {
        let g = onnx2ait::onnx::load_model(&path(stem)).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let got: Vec<String> = g.outputs.iter().map(|&v| g.ty(v).to_string()).collect();
        assert_eq!(&got, want, "{stem}");
    }
}

/// Reference executor against ONNX Runtime (fp32, `onnx2ait validate`'s default tolerance) at
/// (batch, seq) points inside and at the edges of what the tiny models take (128 positions).
#[test]
fn exports_match_onnxruntime_at_several_shapes() {
    let points = [(1, 1), (2, 7), (3, 16), (1, 100)];
    let mut failures = Vec::new();
    for (stem, _) in EXPORTS {
        for &(batch, seq) in &points {
            let mut opts = Options::default();
            opts.inputs.dims = dims(stem, batch, seq);
            opts.inputs.seed = (batch * 1000 + seq) as u64;
            match validate(&path(stem), &opts) {
                // An output that is (nearly) all zeros passes on atol alone and proves nothing
                // (torchvision's zero-initialised classifier head did that): require a scale.
                Ok(r) if r.passed() => {
                    for o in &r.outputs {
                        for e in &o.results {
                            if !(e.comparison.ref_max_abs > 1e-2) {
                                failures.push(format!(
                                    "{stem} at batch {batch}, seq {seq}: output '{}' is degenerate (max |ort| = {:e})",
                                    o.name, e.comparison.ref_max_abs
                                ));
                            }
                        }
                    }
                }
                Ok(r) => failures.push(format!("{stem} at batch {batch}, seq {seq}: {:?}", r.failures())),
                Err(e) => failures.push(format!("{stem} at batch {batch}, seq {seq}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The optimised graph computes what the imported one computes (reference executor, 1e-4),
/// with `seq` symbolic and bound (`--dim seq=7`, as `compile` binds it before optimising).
#[test]
fn optimised_exports_match_the_original() {
    // Both pipelines: the default, and the one with fused attention (--attention fused).
    for (fused, bind_seq) in [(false, false), (true, false), (false, true), (true, true)] {
        let opts = OptimizeOptions::pipeline(fused).expect("embedded rules load");
        for (stem, _) in EXPORTS {
            let mut g = onnx2ait::onnx::load_model(&path(stem)).unwrap();
            if bind_seq {
                let seq = BTreeMap::from([("seq".to_string(), 7)]);
                onnx2ait::ir::specialize::bind_dims(&mut g, &seq).unwrap();
            }
            let (opt, report) = optimize(&g, &opts).unwrap_or_else(|e| panic!("{stem}: {e}"));
            if bind_seq && stem.starts_with("bert") {
                // The padding mask is a view of attention_mask (ir::index_views): its index
                // arithmetic over the batch (Range, Mul, Add, Gather / GatherND), the And with
                // `arange(seq) >= 0` and the Expand to [B, 1, S, S] are gone; what runs is the
                // cast to bool and the Where making the additive mask, on [B, 1, 1, S]. The
                // token-type embeddings of the all-zero buffer fold into a constant: the gathers
                // left are the word embeddings and the pooler's first token.
                for gone in ["range", "gathernd", "and", "expand"] {
                    assert!(!report.kernels_after.contains_key(gone), "{stem}: {gone}\n{report}");
                }
                assert_eq!(report.kernels_after.get("gather"), Some(&2), "{stem}\n{report}");
                assert_eq!(report.kernels_after.get("where"), Some(&1), "{stem}\n{report}");
            }
            if fused {
                // Both layers' attention fuses, whichever layout the export computes it in, and
                // the layout ops around it fold into strided views: no softmax and no
                // transposes of heads are left (ViT keeps the ones around its projections).
                assert_eq!(report.kernels_after.get("attention"), Some(&2), "{stem}\n{report}");
                assert!(!report.kernels_after.contains_key("softmax"), "{stem}\n{report}");
                if stem.starts_with("vit") {
                    // The [B,S,E] <-> [S,B,E] transposes around each in- and out-projection
                    // commute through the products into the attention's views, and the residual
                    // add after the out-projection fuses into it: the one transpose left is the
                    // patch embedding's, the one elementwise kernel the position embedding add.
                    assert_eq!(report.kernels_after.get("transpose"), Some(&1), "{stem}\n{report}");
                    assert_eq!(report.kernels_after.get("elementwise"), Some(&1), "{stem}\n{report}");
                }
                if stem.starts_with("bert") {
                    // q, k and v are one packed product per layer: 2 x (qkv, out, ffn1, ffn2) + pooler.
                    assert_eq!(report.kernels_after.get("gemm"), Some(&9), "{stem}\n{report}");
                    assert!(!report.kernels_after.contains_key("transpose"), "{stem}\n{report}");
                }
            }
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            let bound = dims(stem, 3, 7);
            let inputs: BTreeMap<String, Tensor> = g
                .inputs
                .iter()
                .map(|&v| {
                    let ty = g.ty(v);
                    let shape: Vec<usize> =
                        ty.shape.iter().map(|d| d.eval(&bound).as_known().expect("bound") as usize).collect();
                    // Integer inputs (ids, mask) come out in 0..4: valid ids, and a mask of zeros
                    // and non-zeros, which the exports cast to bool.
                    (g.values[v].name.clone(), random_tensor(ty.dtype, &shape, &mut rng))
                })
                .collect();
            let want = onnx2ait::reference::run(&g, &inputs).unwrap_or_else(|e| panic!("{stem}: {e}"));
            let got = onnx2ait::reference::run(&opt, &inputs).unwrap_or_else(|e| panic!("{stem} optimised: {e}"));
            for ((name, w), (_, o)) in want.iter().zip(&got) {
                assert_eq!(w.shape(), o.shape(), "{stem}: {name}");
                assert_eq!(w.dtype(), DType::F32);
                let (w, o) = (w.to_f64_vec(), o.to_f64_vec());
                let scale = w.iter().fold(1e-6f64, |m, v| m.max(v.abs()));
                let err = w.iter().zip(&o).fold(0f64, |m, (a, b)| m.max((a - b).abs() / scale));
                assert!(
                    err <= 1e-4,
                    "{stem} (fused attention {fused}, seq bound {bind_seq}): output {name} differs by {err:e}\n{report}"
                );
            }
        }
    }
}

/// With `seq` bound at compile time the exports lower and render, with attention unfused and
/// fused (`*_fused_attention`); the trees are snapshots (`snapshots/exports__*.snap`; regenerate with `INSTA_UPDATE=always cargo test --release
/// --test exports` and review the diff).
#[test]
fn exports_generate_cuda_snapshots() {
    for fused in [false, true] {
        let opts = OptimizeOptions::pipeline(fused).expect("embedded rules load");
        for (stem, _) in EXPORTS {
            generate_snapshot(stem, &opts, if fused { "_fused_attention" } else { "" });
        }
    }
}

/// The exports for the ROCm target (gfx942), attention unfused (the fused kernel is CUDA-only and
/// refused by name): `snapshots/exports__rocm_*.snap`.
#[test]
fn exports_generate_rocm_snapshots() {
    let opts = OptimizeOptions::pipeline(false).expect("embedded rules load");
    for (stem, _) in EXPORTS {
        let (opt, lower) = bound_and_optimised(stem, &opts);
        let out = std::env::temp_dir().join(format!("onnx2ait-exports-rocm-{}-{stem}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        onnx2ait::codegen::generate_rocm(&opt, &lower, onnx2ait::lower::rocm::RocmArch::Gfx942, &out)
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        let text = tree_text(&out);
        let _ = std::fs::remove_dir_all(&out);
        insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("exports__rocm_{stem}"), text);
        });
    }
}

/// The fused attention kernel compiles warning-free with the pinned nvcc for sm_90a, and no
/// variant spills a register (the tensor-core kernel of 1, 2, 4 and 8 warps of 16 query rows,
/// of 2 and 4 warps of 32, the split-key kernel, the row kernel): for the tiny exports (head size 16; BERT's key-padding mask staged in
/// shared memory, `MASK_ROWS`, ViT without a mask) and for BERT-base's head size 64 (the
/// 12-layer encoder of onnx_models/generated, sequence 128). The tensor-core kernel's register
/// budget (168, so that twelve warps share an SM) is a property of the template that no CPU test
/// would otherwise see break. Compile-only: the GPU check validates the kernel
/// (scripts/gpu-transformers.sh).
#[test]
fn fused_attention_kernels_compile_without_spills() {
    use onnx2ait::lower::cuda::Arch;
    let Some(nvcc) = onnx2ait::build::nvcc::Nvcc::discover_for_test(Arch::Sm90a, "the attention compile test (nvcc)")
    else {
        return;
    };
    let opts = OptimizeOptions::pipeline(true).expect("embedded rules load");
    let bert12 = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/generated/bert12.onnx");
    assert!(bert12.exists(), "{} is missing: run scripts/gen-models.sh", bert12.display());
    let (bert12, _) = optimize(&onnx2ait::onnx::load_model(&bert12).unwrap(), &opts).unwrap();
    let bert12_lower =
        LowerOptions { dims: BTreeMap::from([("S".to_string(), 128)]), max_batch: 8, ..LowerOptions::default() };
    let mut cases = vec![("bert12", bert12, bert12_lower, 64, true)];
    for (stem, head, mask_rows) in [("bert_tiny_dynamo", 16, true), ("vit_tiny_dynamo", 16, false)] {
        let (opt, lower) = bound_and_optimised(stem, &opts);
        cases.push((stem, opt, lower, head, mask_rows));
    }
    for (stem, opt, lower, head, mask_rows) in cases {
        let out = common::fresh_dir("exports-attention", stem);
        generate_cuda(&opt, &lower, Arch::Sm90a, &out).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let mut sources: Vec<PathBuf> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with("_attention.cu"))
            .collect();
        sources.sort();
        // A model's attention kernels differ only in their names and views: one is compiled.
        let src = sources.first().unwrap_or_else(|| panic!("{stem}: no attention kernel"));
        let text = std::fs::read_to_string(src).unwrap();
        for expected in [
            "o2a_attn_tc_launch<4>".to_string(),
            format!("constexpr int HEAD_D = {head};"),
            format!("constexpr bool MASK_ROWS = {mask_rows};"),
        ] {
            assert!(text.contains(&expected), "{stem}: {} lacks `{expected}`", src.display());
        }
        let resources = common::compile_kernel(&nvcc, src, &out, "o2a_attn");
        eprintln!("{stem} {}:\n{resources}", src.display());
        let _ = std::fs::remove_dir_all(&out);
    }
}

/// BERT compiled as `compile --dim seq=1..64 --max-batch 8` does it, attention fused and not:
/// both `batch` and `seq` are run-time dims (in that order, as the inputs name them), every
/// shape is an expression in them (`dims.v[0]`, `dims.v[1]`), the arena is planned at the
/// largest values, and the C API lists both with their ranges.
#[test]
fn bert_generates_with_a_run_time_sequence_range() {
    for stem in ["bert_tiny_torchscript", "bert_tiny_dynamo"] {
        for fused in [false, true] {
            let g = onnx2ait::onnx::load_model(&path(stem)).unwrap();
            let (opt, _) = optimize(&g, &OptimizeOptions::pipeline(fused).unwrap()).unwrap();
            let lower = LowerOptions {
                ranges: BTreeMap::from([("seq".to_string(), (1, 64))]),
                max_batch: 8,
                ..LowerOptions::default()
            };
            let what = format!("{stem}, fused attention {fused}");
            let out =
                std::env::temp_dir().join(format!("onnx2ait-exports-range-{}-{stem}-{fused}", std::process::id()));
            let _ = std::fs::remove_dir_all(&out);
            let gen = generate_cuda(&opt, &lower, onnx2ait::lower::cuda::Arch::Sm90a, &out)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let p = &gen.program;
            let dims: Vec<(&str, i64, i64)> = p.dims.dims.iter().map(|d| (d.symbol.as_str(), d.min, d.max)).collect();
            assert_eq!(dims, [("batch", 1, 8), ("seq", 1, 64)], "{what}");
            assert_eq!(p.dims.batch, Some(0), "{what}");
            let cu = std::fs::read_to_string(out.join("model.cu")).unwrap();
            assert!(
                cu.contains("constexpr int kNumDims = 2;") && cu.contains("constexpr int kBatchDim = 0;"),
                "{what}"
            );
            assert!(
                cu.contains("{R\"onnx2ait(seq)onnx2ait\", 1, 64, R\"onnx2ait(--dim seq=1..64)onnx2ait\"},"),
                "{what}"
            );
            // The hidden state's dims follow both run-time dims.
            assert!(cu.contains("d[0] = (dims.v[0]);") && cu.contains("d[1] = (dims.v[1]);"), "{what}");
            // Every kernel is generated for any length: some reads the sequence length at run time.
            let seq_readers = std::fs::read_dir(&out)
                .unwrap()
                .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
                .filter(|t| t.contains("dims.v[1]"))
                .count();
            assert!(seq_readers > 5, "{what}: {seq_readers} files read the sequence length");
            // The padding mask is a view of attention_mask with batch and seq both run-time
            // (ir::index_views): no Range, shape or mask gather kernels run, and the `And` with
            // `arange(seq) >= 0` is gone. The token-type lookup of the all-zero buffer is one
            // constant row, broadcast where it is added; the position lookup `table[arange(seq)]`
            // is the first seq rows of the table, read in place: no slice of the buffers,
            // GatherElements or their gathers run. The gathers left are the word embeddings and
            // the pooler's first token.
            let count = |t: &str| p.kernels.iter().filter(|k| k.template == t).count();
            assert_eq!(count("range") + count("shape_values"), 0, "{what}");
            assert_eq!(count("gather"), 2, "{what}");
            assert_eq!(count("gather_elements") + count("strided_copy"), 0, "{what}");
            // As many kernels as with the length fixed (`--dim seq=64`), where these fold.
            let mut fixed = g.clone();
            onnx2ait::ir::specialize::bind_dims(&mut fixed, &BTreeMap::from([("seq".to_string(), 64)])).unwrap();
            let (fixed, _) = optimize(&fixed, &OptimizeOptions::pipeline(fused).unwrap()).unwrap();
            let fixed_out = out.with_extension("fixed");
            let _ = std::fs::remove_dir_all(&fixed_out);
            let fixed_lower = LowerOptions { max_batch: 8, ..LowerOptions::default() };
            let fixed_gen = generate_cuda(&fixed, &fixed_lower, onnx2ait::lower::cuda::Arch::Sm90a, &fixed_out)
                .unwrap_or_else(|e| panic!("{what}, seq 64: {e}"));
            let _ = std::fs::remove_dir_all(&fixed_out);
            assert_eq!(p.kernels.len(), fixed_gen.program.kernels.len(), "{what}");
            assert_eq!(p.kernels.len(), if fused { 23 } else { 41 }, "{what}");
            // Planned at the largest dims: an activation [8, 64, 64] of fp16 fits the arena.
            assert!(p.memory.arena_bytes >= 8 * 64 * 64 * 2, "{what}: arena {}", p.memory.arena_bytes);
            if fused {
                let attention = p.kernels.iter().find(|k| k.template == "attention").expect("a fused attention");
                assert!(attention.context["sk"].as_str().unwrap().contains("dims.v[1]"), "{what}");
            }
            let _ = std::fs::remove_dir_all(&out);
        }
    }
}

/// With a run-time batch (1..512) and sequence length (1..128, the tiny export's position
/// table), a product whose rows are batch · seq gets library instances per range of both: 512
/// sequences of 8 tokens are a small problem, 512 of 128 a large one, and the node tests both
/// dims to pick.
#[test]
fn bert_chooses_library_instances_per_batch_and_sequence_range() {
    let stem = "bert_tiny_torchscript";
    let g = onnx2ait::onnx::load_model(&path(stem)).unwrap();
    let (opt, _) = optimize(&g, &OptimizeOptions::pipeline(true).unwrap()).unwrap();
    let lower = LowerOptions {
        ranges: BTreeMap::from([("seq".to_string(), (1, 128))]),
        max_batch: 512,
        ..LowerOptions::default()
    };
    let out = std::env::temp_dir().join(format!("onnx2ait-exports-buckets-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let gen = generate_cuda(&opt, &lower, onnx2ait::lower::cuda::Arch::Sm90a, &out).unwrap();
    let p = &gen.program;
    assert_eq!(p.dims.index_of("seq"), Some(1));
    let mut both = 0;
    for k in p.kernels.iter().filter(|k| k.template == "gemm_library") {
        let entries = k.context["dispatch"].as_array().unwrap();
        let configs: std::collections::BTreeSet<&str> = entries.iter().map(|e| e["config"].as_str().unwrap()).collect();
        let seq_tested = entries.iter().any(|e| e["when"].as_str().unwrap().contains("dims.v[1] <= "));
        if seq_tested {
            // The condition tests the batch and the sequence length, and the generated node does.
            let e = entries.iter().find(|e| e["when"].as_str().unwrap().contains("dims.v[1] <= ")).unwrap();
            let when = e["when"].as_str().unwrap();
            assert!(when.starts_with("dims.v[0] <= ") && when.contains(" && "), "{}: {when}", k.name);
            assert!(e["dims"]["seq"].as_i64().is_some(), "{}: {e}", k.name);
            let cu = std::fs::read_to_string(out.join(format!("{}.cu", k.name))).unwrap();
            assert!(cu.contains(&format!("if ({when}) return ")), "{}", k.name);
            assert!(configs.len() > 1, "{}: {configs:?}", k.name);
            both += 1;
        }
    }
    // The projections and feed-forward products (rows = batch · seq) of both layers.
    assert!(both >= 4, "only {both} products choose by sequence length");
    let _ = std::fs::remove_dir_all(&out);
}

/// The export optimised as `compile --dim seq=16 --max-batch 8` does it (seq bound before
/// optimising, so what reads it folds), and the lowering options that go with it.
fn bound_and_optimised(stem: &str, opts: &OptimizeOptions) -> (onnx2ait::ir::Graph, LowerOptions) {
    let mut g = onnx2ait::onnx::load_model(&path(stem)).unwrap();
    let mut bound = dims(stem, 1, 16);
    bound.remove("batch");
    onnx2ait::ir::specialize::bind_dims(&mut g, &bound).unwrap();
    let (opt, _) = optimize(&g, opts).unwrap();
    (opt, LowerOptions { dims: bound, max_batch: 8, ..LowerOptions::default() })
}

fn generate_snapshot(stem: &str, opts: &OptimizeOptions, suffix: &str) {
    {
        let (opt, lower) = bound_and_optimised(stem, opts);
        let out = std::env::temp_dir().join(format!("onnx2ait-exports-{}-{stem}{suffix}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        generate_cuda(&opt, &lower, onnx2ait::lower::cuda::Arch::Sm90, &out).unwrap_or_else(|e| panic!("{stem}: {e}"));
        let text = tree_text(&out);
        let _ = std::fs::remove_dir_all(&out);
        insta::with_settings!({snapshot_path => "../snapshots", prepend_module_to_snapshot => false}, {
            insta::assert_snapshot!(format!("exports__{stem}{suffix}"), text);
        });
    }
}

/// A sequence range beyond the model's position table (the tiny exports have 128 positions) is
/// refused at compile time, naming the slice that would read past its axis, for both exporters:
/// ONNX would clamp the slice there, so the graph's shapes would no longer hold, and the copy
/// would read out of bounds.
#[test]
fn a_sequence_range_beyond_the_position_table_is_refused() {
    for stem in ["bert_tiny_torchscript", "bert_tiny_dynamo"] {
        let g = onnx2ait::onnx::load_model(&path(stem)).unwrap();
        let (opt, _) = optimize(&g, &OptimizeOptions::pipeline(true).unwrap()).unwrap();
        let lower = |max: i64| LowerOptions {
            ranges: BTreeMap::from([("seq".to_string(), (1, max))]),
            max_batch: 8,
            ..LowerOptions::default()
        };
        let out = std::env::temp_dir().join(format!("onnx2ait-exports-positions-{stem}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&out);
        let err = generate_cuda(&opt, &lower(129), onnx2ait::lower::cuda::Arch::Sm90a, &out)
            .err()
            .unwrap_or_else(|| panic!("{stem}: seq up to 129 compiled past a 128-row position table"))
            .to_string();
        assert!(err.contains("has 128 elements") && err.contains("seq 1..129"), "{stem}: {err}");
        generate_cuda(&opt, &lower(128), onnx2ait::lower::cuda::Arch::Sm90a, &out)
            .unwrap_or_else(|e| panic!("{stem}: seq up to 128 fits the table: {e}"));
        let _ = std::fs::remove_dir_all(&out);
    }
}
