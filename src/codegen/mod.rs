//! Code generation: a lowered [`Program`] is rendered through one target's handlebars templates
//! into the output folder.
//!
//! Templates are embedded from `templates/<target>/` at build time (see `scripts/embed.rs`):
//! kernel families under `kernels/` (one template per family, one rendered file per kernel
//! instance), the model-level files (`model.cu`, `model.h`, `common.cuh`, `kernels.h`) at the top,
//! and partials under `partials/`. Rendering is strict: a field a template names but the context
//! lacks is an error, never an empty string in C++. Output is deterministic: the same program
//! renders byte-identical files. Writing the output folder safely (staging, the manifest of
//! onnx2ait's own files, the swap that never touches a user's files) is [`outdir`]'s job.

use crate::error::{Error, Result};
use crate::lower::{ctype, dim_expr, json_dims, Program, Storage};
use handlebars::Handlebars;
use serde_json::{json, Map, Value as Json};
use std::path::{Path, PathBuf};

pub mod outdir;

include!(concat!(env!("OUT_DIR"), "/template_files.rs"));

/// Model-level files every target renders, with the file they become.
const MODEL_FILES: &[(&str, &str)] = &[
    ("library.cuh", "library.cuh"),
    ("common.cuh", "common.cuh"),
    ("kernels.h", "kernels.h"),
    ("model.cu", "model.cu"),
    ("model.h", "model.h"),
];

/// The files of one render.
#[derive(Clone, Debug, Default)]
pub struct Generated {
    /// Translation units, one per kernel plus the model's, relative to the output folder.
    pub sources: Vec<PathBuf>,
    /// Headers every source includes (part of every object's cache key).
    pub headers: Vec<PathBuf>,
    /// Content hash of the render (sources, headers, weights), in `model.h` (`O2A_BUILD_HASH`),
    /// returned by the library's `o2a_build_hash()` and at the end of `weights.bin`.
    pub build_hash: String,
}

/// A target's template set, ready to render.
pub struct Templates {
    target: String,
    hb: Handlebars<'static>,
    /// Where each registered template came from (`cuda/kernels/cast.cu.hbs`), for messages.
    origin: std::collections::BTreeMap<String, String>,
}

/// The template folders of a target, in the order they are registered: a template of a later
/// folder replaces the one of the same name from an earlier folder. ROCm renders the kernel
/// families of `templates/cuda/` through its own portability header (`templates/rocm/library.cuh.hbs`)
/// and replaces the templates that cannot be shared.
pub fn template_dirs(target: &str) -> &'static [&'static str] {
    match target {
        "rocm" => &["cuda", "rocm"],
        "cuda" => &["cuda"],
        _ => &[],
    }
}

/// The C type of a GPU stream in the generated sources of `target` (model.h's documentation).
fn stream_type(target: &str) -> &'static str {
    match target {
        "rocm" => "hipStream_t",
        _ => "cudaStream_t",
    }
}

impl Templates {
    /// Registers every embedded template of `target` (`cuda`, `rocm`): those of its folders
    /// ([`template_dirs`]), later folders replacing earlier ones.
    pub fn for_target(target: &str) -> Result<Templates> {
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        let mut origin = std::collections::BTreeMap::new();
        let mut found = 0;
        for dir in template_dirs(target) {
            let prefix = format!("{dir}/");
            for (path, text) in TEMPLATE_FILES {
                let Some(rel) = path.strip_prefix(&prefix) else { continue };
                // The profiler is CUDA's own (ROCm has no profiler yet).
                if *dir != target && rel.starts_with("profile/") {
                    continue;
                }
                let name = rel.strip_suffix(".hbs").unwrap_or(rel);
                let name = name.strip_prefix("partials/").unwrap_or(name);
                hb.register_template_string(name, *text)
                    .map_err(|e| Error::Other(format!("template templates/{path}: {e}")))?;
                origin.insert(name.to_string(), path.to_string());
                // With several folders, every template is also reachable by its folder-qualified
                // name (`cuda/kernels/gemm_generic.cu`), so a replacement can render the template
                // it replaces as a partial with other fields.
                if template_dirs(target).len() > 1 {
                    let qualified = format!("{dir}/{name}");
                    hb.register_template_string(&qualified, *text)
                        .map_err(|e| Error::Other(format!("template templates/{path}: {e}")))?;
                    origin.insert(qualified, path.to_string());
                }
                found += 1;
            }
        }
        if found == 0 {
            return Err(Error::Other(format!("no templates for target '{target}' (looked for templates/{target}/)")));
        }
        Ok(Templates { target: target.to_string(), hb, origin })
    }

    /// The target whose templates these are.
    pub fn target(&self) -> &str {
        &self.target
    }

    pub fn has(&self, name: &str) -> bool {
        self.hb.has_template(name)
    }

    pub fn render(&self, name: &str, ctx: &Json) -> Result<String> {
        if !self.hb.has_template(name) {
            return Err(Error::Other(format!("target '{}' has no template {name}.hbs", self.target)));
        }
        let path = self.origin.get(name).cloned().unwrap_or_else(|| format!("{}/{name}.hbs", self.target));
        self.hb.render(name, ctx).map_err(|e| Error::Other(format!("rendering templates/{path}: {e}")))
    }
}

/// The fields of the model-level templates: tensors with their storage, inputs, outputs, the run
/// sequence and the memory figures.
pub fn model_context(p: &Program, arch: &str) -> Json {
    model_context_for(p, "cuda", arch)
}

/// [`model_context`] for the templates of `target`.
pub fn model_context_for(p: &Program, target: &str, arch: &str) -> Json {
    let tensors: Vec<Json> = p
        .tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let (kind, offset, of, io) = match t.storage {
                Storage::Input { index } => ("input", 0, 0, index),
                Storage::Output { index } => ("output", 0, 0, index),
                Storage::Weight { offset, .. } => ("weight", offset, 0, 0),
                Storage::Arena { offset } => ("arena", offset, 0, 0),
                Storage::Alias { of } => ("alias", 0, of, 0),
            };
            json!({
                "index": i, "name": t.name, "ctype": ctype(t.dtype), "storage": kind,
                "offset": offset, "of": of, "io_index": io,
                "shape": json_dims(p, &t.shape),
            })
        })
        .collect();
    let io = |list: &[crate::lower::IoTensor]| -> Vec<Json> {
        list.iter()
            .enumerate()
            .map(|(i, t)| {
                let dims: Vec<String> =
                    t.shape.iter().map(|d| dim_expr(d, &p.dims).unwrap_or_else(|_| d.to_string())).collect();
                let max_numel = p.dims.upper_bound(&crate::ir::dim::product(&t.shape)).unwrap_or(0);
                json!({
                    "index": i, "name": t.name, "ctype": ctype(t.dtype), "dtype": t.dtype.name(),
                    "onnx_dtype": t.dtype.onnx_code(), "elem_bytes": t.dtype.size_bytes(),
                    "rank": t.shape.len(), "dims": dims, "shape": json_dims(p, &t.shape), "tensor": t.tensor,
                    "max_numel": max_numel,
                })
            })
            .collect()
    };
    let kernels: Vec<Json> = p
        .kernels
        .iter()
        .map(|k| json!({ "name": k.name, "template": k.template, "node": k.node, "args": k.args, "num_args": k.args.len() }))
        .collect();
    let run_dims: Vec<Json> = p
        .dims
        .dims
        .iter()
        .enumerate()
        .map(|(i, d)| json!({ "index": i, "symbol": d.symbol, "min": d.min, "max": d.max }))
        .collect();
    json!({
        "model_name": p.model_name,
        // Set by `generate` once the other files are rendered (it is their hash).
        "build_hash": "",
        "source": Path::new(&p.source).file_name().and_then(|s| s.to_str()).unwrap_or(&p.source),
        "arch": arch,
        "stream_type": stream_type(target),
        "run_dims": run_dims,
        "num_dims": p.dims.dims.len(),
        "batch_dim": p.dims.batch.map_or(-1, |b| b as i64),
        "tensors": tensors,
        "num_tensors": p.tensors.len(),
        "inputs": io(&p.inputs),
        "outputs": io(&p.outputs),
        "num_inputs": p.inputs.len(),
        "num_outputs": p.outputs.len(),
        "kernels": kernels,
        "num_kernels": p.kernels.len(),
        "arena_bytes": p.memory.arena_bytes,
        "activations_bytes": p.memory.activations_bytes,
        "workspace_bytes": p.memory.workspace_bytes,
        "weights_bytes": p.memory.weights_bytes,
    })
}

/// The weights index written beside the blob, for people and tools.
fn weights_index(p: &Program) -> Json {
    let entries: Vec<Json> = p
        .tensors
        .iter()
        .filter_map(|t| match t.storage {
            Storage::Weight { offset, bytes } => Some(json!({
                "name": t.name, "dtype": t.dtype.name(), "shape": json_dims(p, &t.shape), "offset": offset, "bytes": bytes,
            })),
            _ => None,
        })
        .collect();
    json!({ "format_version": 1, "file": "weights.bin", "bytes": p.weights.len(), "tensors": entries })
}

/// Bytes at the end of `weights.bin` after the weights: `onnx2ait build <hash>\n`, so the library
/// can tell its own weights from those of another build (model.cu checks them in `o2a_create`,
/// [`crate::runtime::Library::open`] before loading anything).
pub const WEIGHTS_TRAILER_PREFIX: &str = "onnx2ait build ";

/// Hex digits of a build hash.
pub const BUILD_HASH_DIGITS: usize = 16;

/// Length of the trailer of `weights.bin`.
pub const WEIGHTS_TRAILER_BYTES: usize = WEIGHTS_TRAILER_PREFIX.len() + BUILD_HASH_DIGITS + 1;

/// The trailer of `weights.bin` for a build hash.
pub fn weights_trailer(build_hash: &str) -> String {
    format!("{WEIGHTS_TRAILER_PREFIX}{build_hash}\n")
}

/// The build hash of a render: SHA-256 (first [`BUILD_HASH_DIGITS`] hex digits) of the generator
/// version and every file's name and bytes, the model-level files rendered with an empty hash.
fn build_hash(files: &[(String, Vec<u8>)], weights: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    let mut feed = |b: &[u8]| {
        h.update((b.len() as u64).to_le_bytes());
        h.update(b);
    };
    feed(concat!("onnx2ait ", env!("CARGO_PKG_VERSION")).as_bytes());
    for (name, bytes) in files {
        feed(name.as_bytes());
        feed(bytes);
    }
    feed(b"weights.bin");
    feed(weights);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect::<String>()[..BUILD_HASH_DIGITS].to_string()
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(path, bytes).map_err(|e| Error::Other(format!("writing {}: {e}", path.display())))
}

/// Renders `program` into `out` for the templates' target and returns the files with their build
/// hash (in `model.h`, `model.cu` and at the end of `weights.bin`). Writes into `out` as it is and
/// deletes nothing: `onnx2ait compile` renders into a fresh staging folder and swaps it into
/// place ([`outdir::Staging`]).
pub fn generate(p: &Program, templates: &Templates, arch: &str, out: &Path) -> Result<Generated> {
    std::fs::create_dir_all(out).map_err(|e| Error::Other(format!("creating {}: {e}", out.display())))?;
    let mut gen = Generated::default();
    let mut model = model_context_for(p, &templates.target, arch);
    // Every file but the model-level ones, in the order they are written.
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    for k in &p.kernels {
        let mut ctx: Map<String, Json> = k.context.clone();
        ctx.insert("node".into(), json!(k.node));
        ctx.insert("workspace_bytes".into(), json!(k.workspace_bytes));
        let text = templates
            .render(&format!("kernels/{}.cu", k.template), &Json::Object(ctx))
            .map_err(|e| Error::Other(format!("kernel {} (node '{}'): {e}", k.name, k.node)))?;
        files.push((format!("{}.cu", k.name), text.into_bytes()));
    }
    // Library instances go first: they take a minute of nvcc each against a few seconds for any
    // other source, and the build starts its sources in this order, so the long ones start at once
    // and the short ones fill the remaining jobs.
    let mut library_sources = Vec::with_capacity(p.library.len());
    for l in &p.library {
        let text = templates
            .render(&format!("library/{}.cu", l.template), &Json::Object(l.context.clone()))
            .map_err(|e| Error::Other(format!("library instance {} ({}): {e}", l.name, l.config)))?;
        let file = format!("{}.cu", l.name);
        library_sources.push(PathBuf::from(&file));
        files.push((file, text.into_bytes()));
    }
    let index = serde_json::to_string_pretty(&weights_index(p)).map_err(|e| Error::Other(e.to_string()))? + "\n";
    files.push(("weights.json".to_string(), index.into_bytes()));
    // The hash covers the model-level files too, rendered with an empty hash.
    model["build_hash"] = json!("");
    let mut hashed = files.clone();
    for (template, file) in MODEL_FILES {
        hashed.push((file.to_string(), templates.render(template, &model)?.into_bytes()));
    }
    hashed.sort();
    let hash = build_hash(&hashed, &p.weights);
    model["build_hash"] = json!(hash);
    for (template, file) in MODEL_FILES {
        let text = templates.render(template, &model)?;
        write_file(&out.join(file), text.as_bytes())?;
        if file.ends_with(".cu") {
            gen.sources.push(PathBuf::from(file));
        } else {
            gen.headers.push(PathBuf::from(file));
        }
    }
    for (file, bytes) in &files {
        write_file(&out.join(file), bytes)?;
        if file.ends_with(".cu") && !library_sources.iter().any(|l| l.as_os_str() == file.as_str()) {
            gen.sources.push(PathBuf::from(file));
        }
    }
    gen.sources.splice(0..0, library_sources);
    let mut weights = Vec::with_capacity(p.weights.len() + WEIGHTS_TRAILER_BYTES);
    weights.extend_from_slice(&p.weights);
    weights.extend_from_slice(weights_trailer(&hash).as_bytes());
    write_file(&out.join("weights.bin"), &weights)?;
    gen.build_hash = hash;
    Ok(gen)
}

/// A model rendered for one target: the program and the files.
pub struct GeneratedModel {
    pub program: Program,
    pub files: Generated,
}

impl GeneratedModel {
    /// Lines for the compile summary: kernels by template, memory plan.
    pub fn summary(&self) -> String {
        let p = &self.program;
        let mut by_template = std::collections::BTreeMap::<&str, usize>::new();
        for k in &p.kernels {
            *by_template.entry(k.template.as_str()).or_default() += 1;
        }
        let t: Vec<String> = by_template.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        let dims: Vec<String> = p
            .dims
            .dims
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let what = if p.dims.batch == Some(i) { "batch" } else { "dim" };
                format!("{what} '{}' from {} to {}", d.symbol, d.min, d.max)
            })
            .collect();
        let dims = if dims.is_empty() { "fixed shapes".to_string() } else { dims.join(", ") };
        let at = if p.dims.dims.len() > 1 { "at the largest dims" } else { "at the largest batch" };
        format!(
            "generated: {} kernels ({}); {dims}\nmemory:    arena {:.1} MiB for {:.1} MiB of activations ({at}), workspace {:.1} MiB, weights {:.1} MiB\n",
            p.kernels.len(),
            t.join(", "),
            mib(p.memory.arena_bytes),
            mib(p.memory.activations_bytes),
            mib(p.memory.workspace_bytes),
            mib(p.memory.weights_bytes),
        )
    }
}

/// Build metadata: what was generated for which target, the kernel list and the memory plan.
/// Deterministic (no timings, no paths of this machine).
fn build_metadata(p: &Program, target: &str, arch: &str, files: &Generated) -> Json {
    let kernels: Vec<Json> = p
        .kernels
        .iter()
        .map(|k| {
            let mut e = json!({ "name": k.name, "template": k.template, "node": k.node });
            // Which library instance runs each batch range, and whether a profile chose it.
            if let Some(d) = k.context.get("dispatch") {
                e["dispatch"] = d.clone();
            }
            e
        })
        .collect();
    let instances: Vec<Json> =
        p.library.iter().map(|l| json!({ "name": l.name, "template": l.template, "config": l.config })).collect();
    json!({
        "format_version": 1,
        "generator": concat!("onnx2ait ", env!("CARGO_PKG_VERSION")),
        "model": Path::new(&p.source).file_name().and_then(|s| s.to_str()).unwrap_or(&p.source),
        "target": target,
        "arch": arch,
        "library": "libmodel.so",
        "build_hash": files.build_hash,
        "batch": p.dims.batch_dim(),
        "run_dims": p.dims.dims,
        "sources": files.sources,
        "headers": files.headers,
        "kernels": kernels,
        "library_instances": instances,
        "memory": p.memory,
    })
}

/// Lowers an optimised graph for the CUDA target and renders it into `out` (sources, weights,
/// build metadata). Building is separate (`crate::build`).
pub fn generate_cuda(
    graph: &crate::ir::Graph,
    opts: &crate::lower::LowerOptions,
    arch: crate::lower::cuda::Arch,
    out: &Path,
) -> Result<GeneratedModel> {
    let target = crate::lower::cuda::CudaTarget::new(arch).with_max_batch(opts.max_batch);
    generate_cuda_with(graph, opts, &target, out)
}

/// [`generate_cuda`] with a configured target (profiled measurements, recording).
pub fn generate_cuda_with(
    graph: &crate::ir::Graph,
    opts: &crate::lower::LowerOptions,
    target: &crate::lower::cuda::CudaTarget,
    out: &Path,
) -> Result<GeneratedModel> {
    generate_for(graph, opts, target, out)
}

/// Lowers an optimised graph for the ROCm target (`arch`: gfx90a or gfx942) and renders it into
/// `out`. Building is separate (`crate::build::hip`).
pub fn generate_rocm(
    graph: &crate::ir::Graph,
    opts: &crate::lower::LowerOptions,
    arch: crate::lower::rocm::RocmArch,
    out: &Path,
) -> Result<GeneratedModel> {
    let target = crate::lower::rocm::RocmTarget::new(arch).with_max_batch(opts.max_batch);
    generate_for(graph, opts, &target, out)
}

/// Lowers an optimised graph for any target and renders it through that target's templates
/// ([`template_dirs`]) into `out`, with `build.json`.
pub fn generate_for(
    graph: &crate::ir::Graph,
    opts: &crate::lower::LowerOptions,
    target: &dyn crate::lower::Target,
    out: &Path,
) -> Result<GeneratedModel> {
    let arch = target.arch_name();
    let program = crate::lower::lower(graph, target, opts)?;
    let templates = Templates::for_target(target.name())?;
    let files = generate(&program, &templates, &arch, out)?;
    let meta = build_metadata(&program, target.name(), &arch, &files);
    let text = serde_json::to_string_pretty(&meta).map_err(|e| Error::Other(e.to_string()))? + "\n";
    write_file(&out.join("build.json"), text.as_bytes())?;
    Ok(GeneratedModel { program, files })
}
