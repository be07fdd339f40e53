//! The model-level templates and the runtime without a GPU: render a hand-built program, compile
//! model.cu warning-free with the pinned nvcc, link it with hand-written kernels into a library,
//! load it and read its interface. On a machine with a GPU the same test also runs the model
//! and checks its numbers; without one it checks that creating the model says "no CUDA device".

use super::*;
use crate::build::nvcc::Nvcc;
use crate::build::Compiler;
use crate::lower::cuda::Arch;
use crate::lower::plan::plan_memory;
use crate::lower::weights::to_le_bytes;
use crate::lower::{DeviceTensor, IoTensor, KernelFacts, KernelInstance, MemoryPlan, Program, RunDims, Storage};
use serde_json::Map;
use std::process::Command;

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("onnx2ait-runtime-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An input name no C string literal could hold as is.
const NASTY_INPUT: &str = "x:0 \"quoted\" \\ )raw(";
/// A node name with a comment terminator and a newline.
const NASTY_NODE: &str = "scale */ node\nsecond line";

fn tensor(name: &str, dtype: DType, shape: Vec<Dim>, storage: Storage) -> DeviceTensor {
    DeviceTensor { name: name.into(), dtype, shape, storage }
}

fn kernel(name: &str, node: &str, args: Vec<usize>, workspace_bytes: u64) -> KernelInstance {
    KernelInstance {
        name: name.into(),
        template: name[5..].into(),
        node: node.into(),
        args,
        writes: vec![],
        workspace_bytes,
        flops: Dim::known(0),
        context: Map::new(),
        launcher_args: Vec::new(),
        dispatch: Vec::new(),
        facts: KernelFacts::Opaque,
    }
}

/// y = float(half(x) * w) viewed as [N,2,2], and ids + 1 (read through a view of the input):
/// casts at both boundaries, a weight, arena tensors, views of the arena and of an input, a
/// workspace, float and integer inputs and outputs.
fn tiny_program(batch: bool) -> Program {
    let n = if batch { Dim::sym("N") } else { Dim::known(2) };
    let w = Tensor::from_f32s(&[4], vec![1.0, 2.0, 3.0, 0.5]).cast(DType::F16);
    let w_bytes = to_le_bytes(&w);
    let tensors = vec![
        tensor(NASTY_INPUT, DType::F32, vec![n.clone(), Dim::known(4)], Storage::Input { index: 0 }),
        tensor("x.device", DType::F16, vec![n.clone(), Dim::known(4)], Storage::Arena { offset: 0 }),
        tensor("w", DType::F16, vec![Dim::known(4)], Storage::Weight { offset: 0, bytes: w_bytes.len() as u64 }),
        tensor("y.device", DType::F16, vec![n.clone(), Dim::known(4)], Storage::Arena { offset: 0 }),
        tensor("y.view", DType::F16, vec![n.clone(), Dim::known(2), Dim::known(2)], Storage::Alias { of: 3 }),
        tensor("y", DType::F32, vec![n.clone(), Dim::known(2), Dim::known(2)], Storage::Output { index: 0 }),
        tensor("ids", DType::I64, vec![n.clone()], Storage::Input { index: 1 }),
        tensor("ids_plus_one", DType::I64, vec![n.clone()], Storage::Output { index: 1 }),
        tensor("ids.view", DType::I64, vec![n.clone(), Dim::known(1)], Storage::Alias { of: 6 }),
    ];
    let io = |name: &str, dtype, shape, tensor| IoTensor { name: String::from(name), dtype, shape, tensor };
    let mut p = Program {
        model_name: "tiny_model".into(),
        source: "dir/tiny model.onnx".into(),
        dims: if batch { RunDims::batch_only("N", 8) } else { RunDims::none() },
        inputs: vec![
            io(NASTY_INPUT, DType::F32, tensors[0].shape.clone(), 0),
            io("ids", DType::I64, vec![n.clone()], 6),
        ],
        outputs: vec![
            io("y", DType::F32, tensors[5].shape.clone(), 5),
            io("ids_plus_one", DType::I64, vec![n.clone()], 7),
        ],
        tensors,
        library: Vec::new(),
        kernels: vec![
            kernel("k000_cast", "graph inputs", vec![0, 1], 0),
            kernel("k001_scale", NASTY_NODE, vec![1, 2, 3], 1024),
            kernel("k002_cast", "graph outputs", vec![4, 5], 0),
            kernel("k003_add_one", "add", vec![8, 7], 0),
        ],
        weights: w_bytes,
        memory: MemoryPlan::default(),
    };
    plan_memory(&mut p);
    p
}

/// Hand-written launchers for [`tiny_program`], in the launcher ABI. k003 refuses batch 3 so
/// the error path can be tested on a GPU.
const TINY_KERNELS: &str = r#"
#include "common.cuh"

namespace {
__global__ void to_half(const float* x, half* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half(x[i]);
}
__global__ void scale(const half* x, const half* w, half* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2half(__half2float(x[i]) * __half2float(w[i % 4]));
}
__global__ void to_float(const half* x, float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __half2float(x[i]);
}
__global__ void add_one(const int64_t* x, int64_t* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1;
}
unsigned blocks(int64_t n) { return static_cast<unsigned>((n + 127) / 128); }
}  // namespace

int k000_cast(void* const* t, o2a_dims dims, void*, size_t, cudaStream_t stream) {
  const int64_t batch = dims.v[0];  // the tiny model's one run-time dim
  const int64_t n = batch * 4;
  to_half<<<blocks(n), 128, 0, stream>>>(static_cast<const float*>(t[0]), static_cast<half*>(t[1]), n);
  O2A_CHECK_LAUNCH("k000_cast");
  return O2A_OK;
}

int k001_scale(void* const* t, o2a_dims dims, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  const int64_t batch = dims.v[0];  // the tiny model's one run-time dim
  if (workspace == nullptr || workspace_bytes < 1024) {
    o2a_set_error("k001_scale: workspace of %zu bytes, 1024 needed", workspace_bytes);
    return O2A_ERR_INVALID_ARGUMENT;
  }
  if (cudaMemsetAsync(workspace, 0, 1024, stream) != cudaSuccess) {
    o2a_set_error("k001_scale: cudaMemsetAsync failed");
    return O2A_ERR_CUDA;
  }
  const int64_t n = batch * 4;
  scale<<<blocks(n), 128, 0, stream>>>(static_cast<const half*>(t[0]), static_cast<const half*>(t[1]),
                                       static_cast<half*>(t[2]), n);
  O2A_CHECK_LAUNCH("k001_scale");
  return O2A_OK;
}

int k002_cast(void* const* t, o2a_dims dims, void*, size_t, cudaStream_t stream) {
  const int64_t batch = dims.v[0];  // the tiny model's one run-time dim
  const int64_t n = batch * 4;
  to_float<<<blocks(n), 128, 0, stream>>>(static_cast<const half*>(t[0]), static_cast<float*>(t[1]), n);
  O2A_CHECK_LAUNCH("k002_cast");
  return O2A_OK;
}

int k003_add_one(void* const* t, o2a_dims dims, void*, size_t, cudaStream_t stream) {
  const int64_t batch = dims.v[0];  // the tiny model's one run-time dim
  if (batch == 3) {
    o2a_set_error("k003_add_one: batch 3 is refused by this test kernel");
    return O2A_ERR_UNSUPPORTED;
  }
  add_one<<<blocks(batch), 128, 0, stream>>>(static_cast<const int64_t*>(t[0]), static_cast<int64_t*>(t[1]), batch);
  O2A_CHECK_LAUNCH("k003_add_one");
  return O2A_OK;
}
"#;

/// The build hash the tiny model's files are rendered with.
const TINY_HASH: &str = "0123456789abcdef";

/// Renders the model-level files (library.cuh, common.cuh, kernels.h, model.cu, model.h) of `p`
/// into `out` with the embedded CUDA templates, as `codegen::generate` does, without the kernel
/// templates (the test supplies its own kernels), with the build hash [`TINY_HASH`].
fn render_model_files(p: &Program, out: &Path) {
    let templates = crate::codegen::Templates::for_target("cuda").expect("cuda templates");
    let mut ctx = crate::codegen::model_context(p, "sm_90");
    ctx["build_hash"] = serde_json::json!(TINY_HASH);
    for file in ["library.cuh", "common.cuh", "kernels.h", "model.cu", "model.h"] {
        let text = templates.render(file, &ctx).unwrap_or_else(|e| panic!("rendering {file}: {e}"));
        std::fs::write(out.join(file), text).unwrap();
    }
}

/// nvcc and CUTLASS from the pinned wheels; `None` (test skipped) where they are missing,
/// except in CI, where that is a failure.
fn nvcc() -> Option<Nvcc> {
    Nvcc::discover_for_test(Arch::Sm90, "this test")
}

/// Compiles `src` (in `dir`) with the library's flags plus the host compiler's -Wall -Wextra;
/// fails on any error or warning.
fn compile_clean(nvcc: &Nvcc, dir: &Path, src: &str) -> PathBuf {
    let obj = dir.join(format!("{src}.o"));
    let mut cmd: Command = nvcc.compile_command(&dir.join(src), &obj, dir);
    cmd.arg("-Xcompiler=-Wall,-Wextra");
    let out = cmd.output().unwrap_or_else(|e| panic!("running nvcc: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{src} does not compile:\n{text}");
    assert!(!text.to_lowercase().contains("warning"), "{src} compiles with warnings:\n{text}");
    obj
}

#[test]
fn templates_render_tables_and_run_sequence() {
    let out = temp_dir("render");
    render_model_files(&tiny_program(true), &out);
    let cu = std::fs::read_to_string(out.join("model.cu")).unwrap();
    // ONNX names only inside raw strings, verbatim.
    assert!(cu.contains(&format!("R\"onnx2ait({NASTY_INPUT})onnx2ait\", 1, 4, 2, 32}}")), "{cu}");
    assert!(cu.contains(&format!("R\"onnx2ait({NASTY_NODE})onnx2ait\",")), "{cu}");
    // Dims as expressions in the batch.
    assert!(cu.contains("d[0] = (dims.v[0]);"), "{cu}");
    assert!(cu.contains("d[1] = 4;"), "{cu}");
    // Each kernel with its tensors, a view of an input passed through.
    assert!(cu.contains("void* a[] = {t[1], t[2], t[3], nullptr};"), "{cu}");
    assert!(cu.contains("void* a[] = {t[8], t[7], nullptr};"), "{cu}");
    assert!(cu.contains("const int rc = k003_add_one(a, dims, ws,"), "{cu}");
    // A timing mark before every kernel and after the last (o2a_kernel_times); none elsewhere.
    assert!(cu.contains("O2A_TRY(mark(marks, 0, stream));") && cu.contains("O2A_TRY(mark(marks, 3, stream));"), "{cu}");
    assert!(cu.contains("return mark(marks, kNumKernels, stream);"), "{cu}");
    assert_eq!(cu.matches("run_kernels(m, d, m->stream, marks.ev.data())").count(), 1, "{cu}");
    assert!(
        cu.contains("int o2a_kernel_times(o2a_model* m, const int64_t* dims, int warmup, int iters, float* median_ms)")
    );
    assert!(cu.contains("{Storage::alias, 0ull, 6, 0},  // t8"), "{cu}");
    assert!(cu.contains("constexpr int kNumDims = 1;") && cu.contains("constexpr int kBatchDim = 0;"), "{cu}");
    assert!(cu.contains("{R\"onnx2ait(N)onnx2ait\", 1, 8, R\"onnx2ait(--max-batch 8)onnx2ait\"},"), "{cu}");
    assert!(cu.contains("constexpr uint64_t kWeightsBytes = 8ull;"), "{cu}");
    assert!(cu.contains("constexpr uint64_t kWorkspaceBytes = 1024ull;"), "{cu}");
    let kh = std::fs::read_to_string(out.join("kernels.h")).unwrap();
    assert!(
        kh.contains("int k001_scale(void* const* t, o2a_dims dims, void* workspace, size_t workspace_bytes, cudaStream_t stream);"),
        "{kh}"
    );
    let h = std::fs::read_to_string(out.join("model.h")).unwrap();
    assert!(h.contains(
        "int o2a_run(o2a_model* m, const int64_t* dims, const void* const* inputs, void* const* outputs, void* stream);"
    ));
    assert!(!h.contains("cuda_runtime.h"), "model.h needs no CUDA header");
    assert!(h.contains("#define O2A_ABI_VERSION 6") && ABI_VERSION == 6, "{h}");
    assert!(h.contains(" *   dims[0] = N, 1 to 8"), "{h}");
    assert!(h.contains(&format!("#define O2A_BUILD_HASH \"{TINY_HASH}\"")), "{h}");
    assert!(cu.contains("const char* o2a_build_hash(void) { return O2A_BUILD_HASH; }"), "{cu}");
    for decl in [
        "const char* o2a_build_hash(void);",
        "int o2a_create_from_memory(const void* weights, uint64_t bytes, o2a_model** out);",
        "int o2a_num_kernels(const o2a_model* m);",
        "const char* o2a_kernel_name(const o2a_model* m, int k);",
        "const char* o2a_kernel_node(const o2a_model* m, int k);",
        "int o2a_kernel_times(o2a_model* m, const int64_t* dims, int warmup, int iters, float* median_ms);",
        "int o2a_num_dims(const o2a_model* m);",
        "const char* o2a_dim_name(const o2a_model* m, int i);",
        "int64_t o2a_dim_min(const o2a_model* m, int i);",
        "int64_t o2a_dim_max(const o2a_model* m, int i);",
        "int o2a_batch_dim(const o2a_model* m);",
    ] {
        assert!(h.contains(decl), "model.h lacks {decl}:\n{h}");
    }

    render_model_files(&tiny_program(false), &out);
    let cu = std::fs::read_to_string(out.join("model.cu")).unwrap();
    assert!(cu.contains("constexpr int kNumDims = 0;") && cu.contains("constexpr int kBatchDim = -1;"), "{cu}");
    let h = std::fs::read_to_string(out.join("model.h")).unwrap();
    assert!(h.contains("This build has none: its shapes are fixed"), "{h}");
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn open_reports_missing_and_broken_libraries() {
    let d = temp_dir("open");
    let e = Library::open(&d.join("absent")).err().unwrap().to_string();
    assert!(e.contains("absent: no such directory"), "{e}");
    let e = Library::open(&d).err().unwrap().to_string();
    assert!(e.contains("libmodel.so: not found") && e.contains("build the model first"), "{e}");
    std::fs::write(d.join("model.cu"), "").unwrap();
    let e = Library::open(&d).err().unwrap().to_string();
    assert!(e.contains("the library was not built"), "{e}");
    std::fs::write(d.join(LIB_NAME), b"not an ELF file").unwrap();
    let e = Library::open(&d).err().unwrap().to_string();
    assert!(e.starts_with("cannot load") && e.contains(LIB_NAME), "{e}");
    let f = d.join("file");
    std::fs::write(&f, "").unwrap();
    let e = Library::open(&f).err().unwrap().to_string();
    assert!(e.contains("not a directory"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn tensor_bytes_round_trip() {
    let tensors = [
        Tensor::from_f32s(&[2, 2], vec![1.0, -2.5, 3.25, f32::INFINITY]),
        Tensor::from_f32s(&[3], vec![0.5, -1.0, 65504.0]).cast(DType::F16),
        Tensor::from_i64s(&[2], vec![i64::MIN, 7]),
        Tensor::from_i64s(&[2, 1], vec![1, 0]).cast(DType::Bool),
        Tensor::from_i64s(&[3], vec![255, 0, 9]).cast(DType::U8),
        Tensor::from_i64s(&[0, 4], vec![]).cast(DType::I32),
    ];
    for t in tensors {
        let bytes = to_le_bytes(&t);
        assert_eq!(tensor_from_le_bytes(t.dtype(), t.shape(), &bytes).unwrap(), t);
    }
    let e = tensor_from_le_bytes(DType::F32, &[2], &[0; 7]).unwrap_err().to_string();
    assert!(e.contains("7 bytes cannot hold a float32 tensor of shape [2] (8 bytes)"), "{e}");
}

/// Builds the tiny model's library into a fresh folder; `None` without nvcc.
///
/// `ONNX2AIT_RUNTIME_TEST_LIB=DIR` takes the library from DIR instead (a folder this test left
/// with `ONNX2AIT_KEEP_TEST_BUILD=1`), for GPU machines without nvcc.
fn tiny_library(tag: &str) -> Option<PathBuf> {
    let dir = temp_dir(tag);
    let p = tiny_program(true);
    if let Some(prebuilt) = std::env::var_os("ONNX2AIT_RUNTIME_TEST_LIB") {
        for f in [LIB_NAME, "weights.bin"] {
            std::fs::copy(Path::new(&prebuilt).join(f), dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
        return Some(dir);
    }
    build_tiny(&dir, &p)
}

/// Renders `p` with the test kernels into `dir` and builds its library; `None` without nvcc.
fn build_tiny(dir: &Path, p: &Program) -> Option<PathBuf> {
    let nvcc = nvcc()?;
    render_model_files(p, dir);
    write_weights(dir, &p.weights, TINY_HASH);
    std::fs::write(dir.join("k_test.cu"), TINY_KERNELS).unwrap();
    let objs = vec![compile_clean(&nvcc, dir, "model.cu"), compile_clean(&nvcc, dir, "k_test.cu")];
    let out = nvcc.link_command(&objs, &dir.join(LIB_NAME)).output().unwrap();
    assert!(out.status.success(), "link failed:\n{}", String::from_utf8_lossy(&out.stderr));
    Some(dir.to_path_buf())
}

/// Issue 14: a build whose batch range starts above 1 (`--dim N=4..8`) refuses a batch below it
/// at run time: the library's own dim check returns O2A_ERR_INVALID_ARGUMENT (1) naming the
/// range and the option that set it, and the runtime's checks, which read that option from
/// build.json, name it too (never `--max-batch`, which the build was not given).
#[test]
fn a_batch_below_the_range_is_refused_naming_its_option() {
    let mut p = tiny_program(true);
    p.dims = RunDims { dims: vec![crate::lower::RunDim::ranged("N", 4, 8)], batch: Some(0) };
    let dir = temp_dir("range-min");
    let Some(dir) = build_tiny(&dir, &p) else {
        gpu_part_skipped("runtime::tests::a_batch_below_the_range_is_refused_naming_its_option", "no nvcc");
        return;
    };
    let meta = serde_json::json!({ "run_dims": p.dims.dims });
    std::fs::write(dir.join("build.json"), meta.to_string()).unwrap();
    let lib = Library::open(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lib.run_dims(), p.dims.dims.as_slice());
    assert_eq!(lib.run_dims()[0].option, "--dim N=4..8");
    // The library itself, past the runtime's checks (no GPU needed).
    let mut shape = [0i64; 2];
    for (n, ok) in [(3, false), (4, true), (8, true), (9, false)] {
        // SAFETY: one run-time dim value, input 0 has rank 2 (`shape` holds 2).
        let rc = unsafe { (lib.api.input_shape)(std::ptr::null(), 0, [n].as_ptr(), shape.as_mut_ptr()) };
        assert_eq!(rc == 0, ok, "batch {n}: status {rc}");
        if !ok {
            assert_eq!(rc, 1, "O2A_ERR_INVALID_ARGUMENT");
            let e = lib.last_error();
            assert!(
                e.contains(&format!(
                    "dim 'N' = {n} is out of range: the build serves 4 to 8 (set at compile time with --dim N=4..8)"
                )),
                "{e}"
            );
        }
    }
    let e = lib.input_shape(0, &[3]).unwrap_err().to_string();
    assert!(
        e.contains("dim 'N' = 3 is out of range: the build runs 4 to 8 (set at compile time with --dim N=4..8)"),
        "{e}"
    );
    let e = lib.check_batch(2).unwrap_err().to_string();
    assert!(
        e.contains("batch 2 is out of range: the model runs batches 4 to 8 (set at compile time with --dim N=4..8;")
            && !e.contains("--max-batch"),
        "{e}"
    );
    assert!(lib.check_batch(4).is_ok());
    // Without build.json the option is unknown, and the messages name both that can set it.
    std::fs::remove_file(dir.join("build.json")).unwrap();
    let lib = Library::open(&dir).unwrap_or_else(|e| panic!("{e}"));
    let e = lib.check_batch(2).unwrap_err().to_string();
    assert!(e.contains("(set at compile time with --max-batch or --dim N=MIN..MAX;"), "{e}");
    if std::env::var_os("ONNX2AIT_KEEP_TEST_BUILD").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Two libraries with the same C API symbols live in one process: each is opened privately
/// (`RTLD_LOCAL`), so every call reaches its own library. (Linking two libraries into one
/// executable needs per-model names: `--symbol-prefix`, `two_prefixed_models_link_into_one_program`.)
#[test]
fn two_libraries_live_in_one_process() {
    let mut other = tiny_program(false);
    other.model_name = "other_model".into();
    let (Some(a), Some(b)) =
        (build_tiny(&temp_dir("two-a"), &tiny_program(true)), build_tiny(&temp_dir("two-b"), &other))
    else {
        return;
    };
    let (la, lb) = (Library::open(&a).unwrap(), Library::open(&b).unwrap());
    assert_eq!((la.model_name(), lb.model_name()), ("tiny_model", "other_model"));
    assert_eq!((la.batch_symbol(), lb.batch_symbol()), (Some("N"), None));
    assert_eq!((la.input_shape(0, &[3]).unwrap(), lb.input_shape(0, &[]).unwrap()), (vec![3, 4], vec![2, 4]));
    drop(la);
    // The other library stays usable after the first is unloaded.
    assert_eq!(lb.output_shape(0, &[]).unwrap(), vec![2, 2, 2]);
    for d in [a, b] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// weights.bin as `codegen::generate` writes it: the weights, then the build hash.
fn write_weights(dir: &Path, weights: &[u8], hash: &str) {
    let mut bytes = weights.to_vec();
    bytes.extend_from_slice(crate::codegen::weights_trailer(hash).as_bytes());
    std::fs::write(dir.join("weights.bin"), bytes).unwrap();
}

/// The library refuses a header, weights or output manifest of another build (issue 16, point 2):
/// the runtime checks before loading anything, and o2a_create checks the weights itself (run on
/// a GPU by `run_on_gpu`).
#[test]
fn library_refuses_files_of_another_build() {
    let Some(dir) = tiny_library("mixed") else { return };
    if std::env::var_os("ONNX2AIT_RUNTIME_TEST_LIB").is_some() {
        return; // a prebuilt library comes without its model.h
    }
    let weights = tiny_program(true).weights;
    Library::open(&dir).unwrap_or_else(|e| panic!("{e}"));
    let header = std::fs::read_to_string(dir.join("model.h")).unwrap();
    std::fs::write(dir.join("model.h"), header.replace(TINY_HASH, "fedcba9876543210")).unwrap();
    let e = Library::open(&dir).err().unwrap().to_string();
    assert!(
        e.contains("libmodel.so is build 0123456789abcdef but the model.h next to it is build fedcba9876543210")
            && e.contains("mixes two builds"),
        "{e}"
    );
    std::fs::write(dir.join("model.h"), &header).unwrap();
    write_weights(&dir, &weights, "fedcba9876543210");
    let e = Library::open(&dir).err().unwrap().to_string();
    assert!(e.contains("the weights.bin next to it is build fedcba9876543210"), "{e}");
    std::fs::write(dir.join("weights.bin"), &weights).unwrap();
    let e = Library::open(&dir).err().unwrap().to_string();
    assert!(e.contains("the weights.bin next to it is of another build"), "{e}");
    write_weights(&dir, &weights, TINY_HASH);
    let manifest = |hash: &str, library: Option<&str>| crate::codegen::outdir::Manifest {
        format_version: 1,
        generator: "onnx2ait".into(),
        build_hash: hash.into(),
        library: library.map(str::to_string),
        files: vec![],
    };
    let write_manifest = |m: &crate::codegen::outdir::Manifest| {
        std::fs::write(dir.join(crate::codegen::outdir::MANIFEST), serde_json::to_string(m).unwrap()).unwrap()
    };
    write_manifest(&manifest(TINY_HASH, None));
    let e = Library::open(&dir).err().unwrap().to_string();
    assert!(e.contains("is build 0123456789abcdef without a library"), "{e}");
    write_manifest(&manifest("fedcba9876543210", Some(LIB_NAME)));
    assert!(Library::open(&dir).is_err());
    write_manifest(&manifest(TINY_HASH, Some(LIB_NAME)));
    Library::open(&dir).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Says on the real stderr that the GPU part of `test` did not run and why: test output capture
/// would hide an `eprintln!`, and scripts/test.sh counts these lines for its summary.
fn gpu_part_skipped(test: &str, why: &str) {
    use std::io::Write as _;
    let why = why.lines().next().unwrap_or_default();
    let _ = writeln!(std::io::stderr().lock(), "GPU-SKIPPED: {test} ({why})");
}

#[test]
fn model_library_compiles_links_and_loads() {
    const TEST: &str = "runtime::tests::model_library_compiles_links_and_loads";
    let Some(dir) = tiny_library("build") else {
        gpu_part_skipped(TEST, "no nvcc to build the test library");
        return;
    };

    let lib = Library::open(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(lib.model_name(), "tiny_model");
    assert_eq!(lib.batch_symbol(), Some("N"));
    assert_eq!(lib.max_batch(), 8);
    let inputs: Vec<(&str, DType, usize)> = lib.inputs().iter().map(|i| (i.name.as_str(), i.dtype, i.rank)).collect();
    assert_eq!(inputs, vec![(NASTY_INPUT, DType::F32, 2), ("ids", DType::I64, 1)]);
    let outputs: Vec<(&str, DType, usize)> = lib.outputs().iter().map(|i| (i.name.as_str(), i.dtype, i.rank)).collect();
    assert_eq!(outputs, vec![("y", DType::F32, 3), ("ids_plus_one", DType::I64, 1)]);
    let kernels: Vec<(&str, &str)> = lib.kernels().iter().map(|k| (k.name.as_str(), k.node.as_str())).collect();
    assert_eq!(
        kernels,
        vec![
            ("k000_cast", "graph inputs"),
            ("k001_scale", NASTY_NODE),
            ("k002_cast", "graph outputs"),
            ("k003_add_one", "add")
        ]
    );
    assert_eq!((lib.num_kernels(), lib.kernel_name(3), lib.kernel_node(4)), (4, Some("k003_add_one"), None));
    // No build.json beside this library: the option that set the range is unknown.
    let n = crate::lower::RunDim { option: String::new(), ..crate::lower::RunDim::free_batch("N", 8) };
    assert_eq!(lib.run_dims(), [n]);
    assert_eq!(lib.batch_dim(), Some(0));
    assert_eq!(lib.input_shape(0, &[3]).unwrap(), vec![3, 4]);
    assert_eq!(lib.output_shape(0, &[5]).unwrap(), vec![5, 2, 2]);
    assert_eq!(lib.infer_dims(&[Some(&[5, 4]), Some(&[5])]).unwrap(), vec![5]);
    assert_eq!(lib.infer_dims(&[None, Some(&[6])]).unwrap(), vec![6]);
    let e = lib.infer_dims(&[Some(&[5, 3]), Some(&[5])]).unwrap_err().to_string();
    assert!(
        e.contains("do not fit the model at any run-time dims it was built for (N 1..8)") && e.contains("[5,3]"),
        "{e}"
    );
    // A value outside the compiled range is refused by the library itself (no GPU needed).
    let e = lib.input_shape(0, &[9]).unwrap_err().to_string();
    assert!(e.contains("dim 'N' = 9 is out of range: the build runs 1 to 8"), "{e}");
    let e = lib.input_shape(0, &[]).unwrap_err().to_string();
    assert!(e.contains("0 run-time dim value(s) given, the model has 1 (N 1..8)"), "{e}");
    assert_eq!(lib.dims_at(4, &Default::default()).unwrap(), vec![4]);

    // o2a_create_from_memory checks the buffer before the device: with or without a GPU, a
    // buffer of the wrong size or of another build is named as such (what the Python package's
    // `load(out, weights=...)` reports).
    let good = std::fs::read(dir.join("weights.bin")).unwrap();
    let from_memory =
        |w: &[u8]| Model::create_from_memory(Library::open(&dir).unwrap(), w).err().map(|e| e.to_string());
    let e = from_memory(&good[..6]).unwrap();
    assert!(
        e.contains("cannot create the model from the weights in memory: tiny_model: the weights buffer has 6 bytes but the model expects 40"),
        "{e}"
    );
    let e = from_memory(&[]).unwrap();
    assert!(e.contains("the weights buffer has 0 bytes"), "{e}");
    let mut other = good.clone();
    let n = other.len();
    other[n - 2] ^= 1;
    let e = from_memory(&other).unwrap();
    assert!(e.contains("the weights buffer belongs to another build"), "{e}");
    // The right buffer gets as far as the device: a model with a GPU, "no CUDA device" without.
    if let Some(e) = from_memory(&good) {
        assert!(e.contains("no CUDA device"), "{e}");
    }

    match Model::create(lib) {
        Err(e) => {
            let e = e.to_string();
            gpu_part_skipped(TEST, &format!("no GPU here: {e}"));
            assert!(e.contains("cannot create the model: tiny_model: no CUDA device: "), "{e}");
        }
        Ok(mut m) => run_on_gpu(&mut m, &dir),
    }
    if std::env::var_os("ONNX2AIT_KEEP_TEST_BUILD").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The GPU half of the test above: numbers, the error path, the benchmark, bad weights.
fn run_on_gpu(m: &mut Model, dir: &Path) {
    assert!(!m.device_name().is_empty());
    let x = Tensor::from_f32s(&[2, 4], vec![1.0, 1.0, 1.0, 1.0, -2.0, 0.25, 8.0, 3.0]);
    let ids = Tensor::from_i64s(&[2], vec![41, -7]);
    let out = m.run_host(&[2], &[x, ids]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[0], Tensor::from_f32s(&[2, 2, 2], vec![1.0, 2.0, 3.0, 0.5, -2.0, 0.5, 24.0, 1.5]));
    assert_eq!(out[1], Tensor::from_i64s(&[2], vec![42, -6]));

    let x3 = Tensor::from_f32s(&[3, 4], vec![0.0; 12]);
    let e = m.run_host(&[3], &[x3, Tensor::from_i64s(&[3], vec![0; 3])]).unwrap_err().to_string();
    assert!(e.contains("tiny_model: k003_add_one: batch 3 is refused by this test kernel (node 'add')"), "{e}");
    let e = m.run_host(&[2], &[Tensor::from_f32s(&[2, 3], vec![0.0; 6]), Tensor::from_i64s(&[2], vec![0; 2])]);
    assert!(e.unwrap_err().to_string().contains("has shape [2,3], the model takes [2,4] at batch 2"));
    let e = m.run_host(&[9], &[]).unwrap_err().to_string();
    assert!(e.contains("'N' = 9 is out of range"), "{e}");

    for graph in [true, false] {
        for batch in [1, 8, 1] {
            let ms = m.bench(&[batch], 2, 5, graph).unwrap_or_else(|e| panic!("{e}"));
            assert!(ms > 0.0 && ms.is_finite(), "{ms}");
        }
    }
    for batch in [8, 2] {
        let ms = m.kernel_times(&[batch], 2, 5).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ms.len(), 4);
        assert!(ms.iter().all(|t| t.is_finite() && *t >= 0.0), "{ms:?}");
    }
    let e = m.kernel_times(&[3], 0, 3).unwrap_err().to_string();
    assert!(e.contains("timing each kernel at batch 3") && e.contains("k003_add_one: batch 3 is refused"), "{e}");
    let e = m.kernel_times(&[9], 0, 3).unwrap_err().to_string();
    assert!(e.contains("'N' = 9 is out of range"), "{e}");
    // Running after benchmarking still computes on the caller's inputs.
    let x = Tensor::from_f32s(&[1, 4], vec![2.0, 2.0, 2.0, 2.0]);
    let out = m.run_host(&[1], &[x, Tensor::from_i64s(&[1], vec![0])]).unwrap();
    assert_eq!(out[0], Tensor::from_f32s(&[1, 2, 2], vec![2.0, 4.0, 6.0, 1.0]));

    // o2a_create itself refuses weights of the wrong size or of another build.
    let lib = Library::open(dir).unwrap();
    std::fs::write(dir.join("weights.bin"), [0u8; 6]).unwrap();
    let e = Model::create(lib).err().unwrap().to_string();
    assert!(e.contains("weights.bin has 6 bytes but the model expects 40"), "{e}");
    let lib = Library::open(dir).unwrap();
    write_weights(dir, &tiny_program(true).weights, "fedcba9876543210");
    let e = Model::create(lib).err().unwrap().to_string();
    assert!(
        e.contains("weights.bin belongs to another build (it ends with 'onnx2ait build fedcba9876543210', this library is build 0123456789abcdef)"),
        "{e}"
    );

    // The same checks, and the same model, with the weights from memory.
    write_weights(dir, &tiny_program(true).weights, TINY_HASH);
    let good = std::fs::read(dir.join("weights.bin")).unwrap();
    let mut m = Model::create_from_memory(Library::open(dir).unwrap(), &good).unwrap_or_else(|e| panic!("{e}"));
    let x = Tensor::from_f32s(&[1, 4], vec![2.0, 2.0, 2.0, 2.0]);
    let out = m.run_host(&[1], &[x, Tensor::from_i64s(&[1], vec![0])]).unwrap();
    assert_eq!(out[0], Tensor::from_f32s(&[1, 2, 2], vec![2.0, 4.0, 6.0, 1.0]));
    // (Its refusals of a wrong buffer are checked with or without a GPU, before `Model::create` above.)
}

/// The C program of `two_prefixed_models_link_into_one_program`: both headers in one
/// translation unit, both libraries linked, each API reached under its own prefix. Prints what
/// each library says, then creates and runs both (or prints why creating fails: no GPU).
const TWO_MODELS_MAIN: &str = r#"
#include "unary/model.h"
#include "binary/model.h"
#include <stdio.h>
#include <string.h>

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  if (unary_o2a_abi_version() != UNARY_O2A_ABI_VERSION || binary_o2a_abi_version() != BINARY_O2A_ABI_VERSION) {
    return 3;
  }
  if (strcmp(unary_o2a_build_hash(), UNARY_O2A_BUILD_HASH) != 0 || strcmp(binary_o2a_build_hash(), BINARY_O2A_BUILD_HASH) != 0) {
    return 4;
  }
  printf("unary: %s, %d input(s), first '%s'\n", unary_o2a_model_name(NULL), unary_o2a_num_inputs(NULL),
         unary_o2a_input_name(NULL, 0));
  printf("binary: %s, %d input(s), second '%s'\n", binary_o2a_model_name(NULL), binary_o2a_num_inputs(NULL),
         binary_o2a_input_name(NULL, 1));
  unary_o2a_model* u = NULL;
  binary_o2a_model* b = NULL;
  if (unary_o2a_create(argv[1], &u) != UNARY_O2A_OK) {
    printf("unary create: %s\n", unary_o2a_last_error());
    return 0;
  }
  if (binary_o2a_create(argv[2], &b) != BINARY_O2A_OK) {
    printf("binary create: %s\n", binary_o2a_last_error());
    return 5;
  }
  /* unary: x [2,3,4,5] -> relu_0 first; binary: a [2,3,4], b [3,1] -> add_0 first. */
  static float x[120], outs_u[10][120], a[24], bb[3], outs_b[6][24];
  for (int i = 0; i < 120; ++i) x[i] = (float)(i % 7) - 3.0f;
  for (int i = 0; i < 24; ++i) a[i] = (float)i;
  for (int i = 0; i < 3; ++i) bb[i] = 100.0f * (float)(i + 1);
  const void* in_u[1] = {x};
  void* out_u[10];
  for (int i = 0; i < 10; ++i) out_u[i] = outs_u[i];
  const void* in_b[2] = {a, bb};
  void* out_b[6];
  for (int i = 0; i < 6; ++i) out_b[i] = outs_b[i];
  if (unary_o2a_run_host(u, NULL, in_u, out_u) != UNARY_O2A_OK) {
    printf("unary run: %s\n", unary_o2a_last_error());
    return 6;
  }
  if (binary_o2a_run_host(b, NULL, in_b, out_b) != BINARY_O2A_OK) {
    printf("binary run: %s\n", binary_o2a_last_error());
    return 7;
  }
  printf("ran: relu %g %g, add %g %g\n", outs_u[0][0], outs_u[0][3], outs_b[0][0], outs_b[0][23]);
  unary_o2a_destroy(u);
  binary_o2a_destroy(b);
  return 0;
}
"#;

/// Two models compiled by the real pipeline with `--symbol-prefix` live in one process: loaded
/// side by side through the runtime, and linked together into one C program (both headers in
/// one translation unit). Each library exports its prefixed C API and nothing else: no
/// unprefixed `o2a_*` name, no kernel launcher or internal helper another library's calls could
/// bind to.
#[test]
fn two_prefixed_models_link_into_one_program() {
    const TEST: &str = "runtime::tests::two_prefixed_models_link_into_one_program";
    if nvcc().is_none() {
        gpu_part_skipped(TEST, "no nvcc to build the test libraries");
        return;
    }
    let root = temp_dir("prefixed");
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models");
    let build = |prefix: &str, model: &str| {
        let opts = crate::compile::CompileOptions {
            symbol_prefix: Some(prefix.into()),
            kernel_choice: crate::compile::KernelChoice::Heuristic,
            arch: Arch::Sm90,
            jobs: Some(2),
            ..Default::default()
        };
        let out = root.join(prefix);
        crate::compile::compile(&models.join(model), &out, &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
        out
    };
    let (u, b) = (build("unary", "activation_unary.onnx"), build("binary", "arithmetic_binary_broadcast.onnx"));
    let header = std::fs::read_to_string(u.join("model.h")).unwrap();
    assert!(header.contains("int unary_o2a_create(const char* out_dir, unary_o2a_model** out);"), "{header}");
    assert!(header.contains("#define UNARY_O2A_ABI_VERSION 6") && !header.contains(" o2a_"), "{header}");

    // Through the runtime, in this process.
    let (lu, lb) = (Library::open(&u).unwrap(), Library::open(&b).unwrap());
    assert_eq!((lu.symbol_prefix(), lb.symbol_prefix()), (Some("unary"), Some("binary")));
    assert_eq!((lu.model_name(), lb.model_name()), ("activation_unary", "arithmetic_binary_broadcast"));
    assert_eq!((lu.inputs().len(), lb.inputs().len()), (1, 2));
    for (dir, prefix) in [(&u, "unary"), (&b, "binary")] {
        // SAFETY: the library is the pipeline's output; only symbol lookups follow.
        let lib = unsafe { load_local(&dir.join(LIB_NAME)) }.unwrap();
        let has = |name: &str| unsafe { lib.get::<unsafe extern "C" fn()>(format!("{name}\0").as_bytes()).is_ok() };
        assert!(has(&format!("{prefix}_o2a_create")) && has(&format!("{prefix}_o2a_stream_wait")));
        assert!(!has("o2a_create") && !has("o2a_run"), "{prefix}: an unprefixed C API name is exported");
        assert!(!has("_Z13o2a_set_errorPKcz"), "{prefix}: the internal o2a_set_error is exported");
        // Every exported name is the C API's (nm lists the dynamic symbol table).
        if let Ok(out) = Command::new("nm").args(["-D", "--defined-only"]).arg(dir.join(LIB_NAME)).output() {
            let text = String::from_utf8_lossy(&out.stdout);
            let foreign: Vec<&str> = text
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2))
                .filter(|s| !s.starts_with(&format!("{prefix}_o2a_")))
                .collect();
            assert!(out.status.success() && foreign.is_empty(), "{prefix}: exports {foreign:?}");
        }
    }

    // One C program linking both.
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    std::fs::write(root.join("main.c"), TWO_MODELS_MAIN).unwrap();
    let exe = root.join("two_models");
    let out = Command::new(&cc)
        .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&root)
        .arg(root.join("main.c"))
        .arg(u.join(LIB_NAME))
        .arg(b.join(LIB_NAME))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running the host C compiler {cc}: {e}"));
    assert!(out.status.success(), "{cc} main.c:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).arg(&u).arg(&b).output().unwrap();
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    assert!(
        run.status.success(),
        "two_models exited with {}: {text}{}",
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(text.contains("unary: activation_unary, 1 input(s), first 'x'"), "{text}");
    assert!(text.contains("binary: arithmetic_binary_broadcast, 2 input(s), second 'b'"), "{text}");
    if text.contains("unary create: ") {
        assert!(text.contains("no CUDA device"), "{text}");
        gpu_part_skipped(TEST, text.lines().last().unwrap_or_default());
    } else {
        // x[0] = -3 -> relu 0, x[3] = 0 -> 0; a[0] + b[0] = 100, a[23] + b[2] = 323.
        assert!(text.contains("ran: relu 0 0, add 100 323"), "{text}");
    }
    drop((lu, lb));
    let _ = std::fs::remove_dir_all(&root);
}

/// build.json's `kernels[].work` is read by kernel name; a build without it (or with an entry
/// that is not two polynomials) leaves those kernels without work rather than failing.
#[test]
fn kernel_work_is_read_from_build_json_by_name() {
    let dir = temp_dir("kernel-work");
    let conv = Dim::sym("N").mul(&Dim::known(1_000_000));
    let meta = serde_json::json!({ "kernels": [
        { "name": "k000_conv2d_library", "work": { "flops": conv.to_terms_json(), "bytes": 4096 } },
        { "name": "k001_cast", "work": { "flops": 0, "bytes": [[2, "N"], [16]] } },
        { "name": "k002_old" },
        { "name": "k003_bad", "work": { "flops": "2*N", "bytes": 1 } },
    ]});
    std::fs::write(dir.join("build.json"), meta.to_string()).unwrap();
    let work = kernel_work(&dir);
    assert_eq!(work.keys().collect::<Vec<_>>(), ["k000_conv2d_library", "k001_cast"]);
    assert_eq!(work["k000_conv2d_library"], KernelWork { flops: conv, bytes: Dim::known(4096) });
    let env = BTreeMap::from([("N".to_string(), 32)]);
    assert_eq!(work["k001_cast"].bytes.eval(&env).as_known(), Some(80));
    std::fs::remove_file(dir.join("build.json")).unwrap();
    assert!(kernel_work(&dir).is_empty());
}
