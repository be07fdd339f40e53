//! The kernel profiler: times every candidate library instance on every convolution and matrix
//! product of a model, on the GPU, and stores the times in the profile cache ([`cache`]).
//!
//! 1. Lower the optimised model with a recording target: every library problem at every batch
//!    range (`CudaTarget::batch_buckets`) with its candidate instances.
//! 2. Split the problems not yet in the cache into parts of whole problems, each needing a few
//!    rounds of nvcc jobs' worth of candidate sources no earlier part built (`plan_parts`).
//! 3. Per part: render its candidates (each once, the same files a model build compiles, so the
//!    object cache serves both) and `profile/profiler.cu` with its problems, build the part's
//!    library (`libprofile.so`, or `libprofile-partK.so` when there are several; parallel nvcc,
//!    cached), load it, and for every (problem, candidate): one run compared with a naive
//!    reference kernel, warm-up, timed runs (median of CUDA-event times). The cache is saved
//!    after every problem, so an interrupted profile resumes, and a profile stopped while
//!    compiling keeps every part timed before.
//!
//! Compiling with the cache (`onnx2ait compile --profile-cache`) then picks, per node and batch
//! range, the fastest instance that matched the reference.

pub mod cache;
pub mod cost;
pub mod toolchain;

use crate::build::BuildOptions;
use crate::codegen::Templates;
use crate::error::{Error, Result};
use crate::ir::Graph;
use crate::lower::cuda::CudaTarget;
use crate::lower::rocm::RocmTarget;
use crate::lower::target::{ProfileProblem, ProfiledTarget};
use crate::lower::{LibraryInstance, LowerOptions};
use crate::runtime::profiler::{CaseError, ProfilerLib};
use cache::{Outcome, ProfileCache};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{json, Value as Json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;
pub use toolchain::{ProfileTarget, Toolchain};

/// A candidate disagrees with the reference when max |out − ref| exceeds this fraction of
/// max |ref| (plus the same absolute slack): fp16 output rounding and a different summation order
/// stay far below it, a wrong kernel does not.
pub const MISMATCH_TOLERANCE: f64 = 1e-2;

pub struct ProfileOptions {
    /// The target and architecture whose library instances are timed.
    pub target: ProfileTarget,
    pub lower: LowerOptions,
    /// The optimiser's options of the build the profile is for (`--attention fused` packs the q,
    /// k and v projections into one product, whose problem only that graph has).
    pub optimize: crate::egraph::OptimizeOptions,
    /// The profile cache file.
    pub cache: PathBuf,
    /// Where the profiler's sources and library are written.
    pub work_dir: PathBuf,
    pub build: BuildOptions,
    pub warmup: u32,
    pub iters: u32,
    pub progress: bool,
    /// Build the profiler and stop (CPU only: e.g. while the GPU is busy with something else).
    pub build_only: bool,
    /// New candidate sources one part of the profile builds before its problems are timed and
    /// saved (`plan_parts`); None: [`PART_SOURCES_PER_JOB`] per nvcc job.
    pub part_sources: Option<usize>,
}

/// An instance and its median time.
#[derive(Clone, Debug, Serialize)]
pub struct Timed {
    pub name: String,
    pub median_ms: f64,
}

/// One problem's result, for the report and the per-kernel sweep in BENCHMARKS.md.
#[derive(Clone, Debug, Serialize)]
pub struct ProblemReport {
    pub signature: String,
    pub kind: &'static str,
    pub gflop: f64,
    /// The fastest instance that matched the reference, and its time.
    pub best: Option<Timed>,
    pub best_ms: Option<f64>,
    /// Achieved TFLOP/s of the best instance.
    pub tflops: Option<f64>,
    /// The time of what the heuristic alone would pick (when it was measured).
    pub heuristic: Option<Timed>,
    /// Candidates measured / refused / mismatched / failed.
    pub counts: [usize; 4],
}

#[derive(Clone, Debug, Serialize)]
pub struct ProfileReport {
    pub device: String,
    pub cache: PathBuf,
    pub problems: Vec<ProblemReport>,
    /// (problem, candidate) cases run now, and found in the cache.
    pub cases_run: usize,
    pub cases_cached: usize,
    pub build_seconds: f64,
    pub profile_seconds: f64,
}

impl ProfileReport {
    pub fn summary(&self) -> String {
        let mut s = String::new();
        use std::fmt::Write as _;
        let _ = writeln!(s, "device:   {}", self.device);
        let _ = writeln!(
            s,
            "profiled: {} problems, {} cases run, {} from the cache {} (build {:.1} s, timing {:.1} s)",
            self.problems.len(),
            self.cases_run,
            self.cases_cached,
            self.cache.display(),
            self.build_seconds,
            self.profile_seconds
        );
        let _ = writeln!(
            s,
            "{:>9} {:>8} {:>9} {:>9}  {:<44} problem",
            "ms", "TFLOP/s", "heur. ms", "gain", "best instance"
        );
        for p in &self.problems {
            let (best, ms) =
                p.best.as_ref().map_or(("(none ran)".to_string(), f64::NAN), |b| (b.name.clone(), b.median_ms));
            let heur = p.heuristic.as_ref().map_or(f64::NAN, |h| h.median_ms);
            let _ = writeln!(
                s,
                "{ms:>9.4} {:>8.1} {heur:>9.4} {:>8.2}x  {best:<44} {}",
                p.tflops.unwrap_or(f64::NAN),
                heur / ms,
                p.signature
            );
        }
        s
    }
}

/// Profiles the library problems of a model (the imported graph, before optimisation).
///
/// The problems are every convolution and matrix product the e-graph offers — all of them are
/// priced during a measured extraction, which records them — plus those of the extracted graph's
/// lowering (e.g. a padded stem). Profiling the alternatives too matters: extraction with
/// measured times must compare measured with measured, since the analytical estimate of an
/// unprofiled alternative (say, a convolution without its fused activation) is optimistic and
/// would win against the real time of the fused kernel.
pub fn profile(graph: &Graph, opts: &ProfileOptions) -> Result<ProfileReport> {
    profile_problems(&problems(graph, opts)?, opts)
}

/// The library problems [`profile`] times: those priced while optimising `graph` with measured
/// costs, and those of lowering the result, each at every choice point of the run-time dims —
/// the batch ranges, and the ranges of every other run-time dim (`opts.lower.ranges`) a problem's
/// sizes depend on, each at its bound, as `compile` with these options chooses.
pub fn problems(graph: &Graph, opts: &ProfileOptions) -> Result<Vec<ProfileProblem>> {
    let (min_batch, max_batch) = opts.lower.batch_range(graph);
    match opts.target {
        ProfileTarget::Cuda(arch) => {
            recorded_problems(graph, opts, CudaTarget::new(arch).with_batch_range(min_batch, max_batch).recording())
        }
        ProfileTarget::Rocm(arch) => {
            recorded_problems(graph, opts, RocmTarget::new(arch).with_batch_range(min_batch, max_batch).recording())
        }
    }
}

/// The problems a recording `target` is asked for while the graph is optimised with measured
/// costs and lowered.
fn recorded_problems<T: ProfiledTarget>(
    graph: &Graph,
    opts: &ProfileOptions,
    target: T,
) -> Result<Vec<ProfileProblem>> {
    let (optimised, _) =
        cost::optimize_measured(graph, &opts.optimize, &target, opts.lower.max_batch, &opts.lower.pricing_dims())?;
    crate::lower::lower(&optimised, &target, &opts.lower)?;
    Ok(target.recorded())
}

fn profile_problems(all: &[ProfileProblem], opts: &ProfileOptions) -> Result<ProfileReport> {
    if all.is_empty() {
        return Err(Error::Other(
            "profile: the model has no convolution or matrix product that runs on a library instance".into(),
        ));
    }
    let toolchain = Toolchain::discover(opts.target)?;
    let templates = Templates::for_target(opts.target.templates())?;
    let dir = &opts.work_dir;
    std::fs::create_dir_all(dir).map_err(|e| Error::Other(format!("profile: cannot create {}: {e}", dir.display())))?;
    // One profile at a time per work folder: another would rewrite the sources and replace
    // libprofile.so under this one. The cache is opened after the wait, so what the other run
    // measured (saved into the cache) is not built or timed again.
    let _work_lock = lock_work_dir(dir, opts.progress)?;

    // The GPU is known only once the profiler runs. A cache holding times of exactly one GPU for
    // this toolchain is taken to be of this one (checked after loading), so what it has already
    // measured is neither built nor timed again: a resumed or extended profile builds only the
    // candidates it still needs.
    let mut cache = ProfileCache::open(&opts.cache)?;
    let known = toolchain.devices_in(&cache);
    let assumed = if known.len() == 1 { known.first().cloned() } else { None };
    let pending = pending_problems(all, &cache, assumed.as_deref());
    let total_cases: usize = all.iter().map(|p| p.candidates.len()).sum();
    if pending.is_empty() {
        let device = assumed.unwrap_or_default();
        return Ok(report(all, &device, &cache, 0, total_cases, 0.0, 0.0));
    }
    let jobs = opts.build.jobs.unwrap_or_else(crate::build::default_jobs);
    let parts = plan_parts(&pending, opts.part_sources.unwrap_or(PART_SOURCES_PER_JOB * jobs));
    let library_cuh = templates.render("library.cuh", &json!({}))?;
    write_if_changed(&dir.join("library.cuh"), &library_cuh)?;

    let (mut build_seconds, mut profile_seconds) = (0.0, 0.0);
    let (mut run, mut cached) = (0usize, 0usize);
    let mut device: Option<String> = None;
    // Every part's library stays loaded until the end (its device buffers freed once it is
    // timed): unloading one, with its statically linked CUDA runtime, while the process goes on
    // with the next would save only a little host memory.
    let mut libs = Vec::new();
    let mut earlier: BTreeSet<&str> = BTreeSet::new();
    for (k, part) in parts.iter().enumerate() {
        let name = |stem: &str, ext: &str| {
            if parts.len() == 1 {
                format!("{stem}.{ext}")
            } else {
                format!("{stem}-part{}.{ext}", k + 1)
            }
        };
        let sources = candidate_sources(part);
        if opts.progress && parts.len() > 1 {
            eprintln!(
                "profile: part {}/{}: {} problems, {} candidate sources ({} not in an earlier part)",
                k + 1,
                parts.len(),
                part.len(),
                sources.len(),
                sources.difference(&earlier).count()
            );
        }
        earlier.extend(sources);
        let (lib_name, profiler_cu) = (name("libprofile", "so"), name("profiler", "cu"));
        let t0 = Instant::now();
        let ordered = build_part(part, &templates, dir, &profiler_cu, &lib_name, &toolchain, opts)?;
        build_seconds += t0.elapsed().as_secs_f64();
        if opts.build_only {
            continue;
        }
        let lib = ProfilerLib::load(&dir.join(&lib_name))?;
        let this = toolchain.device_key(&lib.device_name()?);
        if let Some(a) = assumed.as_ref().filter(|a| **a != this) {
            return Err(Error::Other(format!(
                "profile: the cache {} holds times of '{a}', but this GPU is '{this}': the candidates it \
                 has were skipped; profile into another cache file (--cache)",
                cache.path().display()
            )));
        }
        let t1 = Instant::now();
        let (r, c) = time_part(&lib, &ordered, &mut cache, &this, opts.progress.then(|| (k + 1, parts.len())), opts)?;
        profile_seconds += t1.elapsed().as_secs_f64();
        lib.release_buffers();
        (run, cached) = (run + r, cached + c);
        device = Some(this);
        libs.push(lib);
    }
    let Some(device) = device else {
        // --build-only: every part's library is built; nothing was timed.
        return Ok(ProfileReport {
            device: String::new(),
            cache: opts.cache.clone(),
            problems: Vec::new(),
            cases_run: 0,
            cases_cached: 0,
            build_seconds,
            profile_seconds: 0.0,
        });
    };
    let pending_cases: usize = pending.iter().map(|p| p.candidates.len()).sum();
    Ok(report(all, &device, &cache, run, cached + (total_cases - pending_cases), build_seconds, profile_seconds))
}

/// New candidate sources a part of a profile compiles, per nvcc job, before its problems are
/// timed and saved: about three rounds of the slowest instances (sm90 CUTLASS ones take ~1 min
/// each), so a profile too long for the time it has (MobileNetV3-Large: 140 sources, ~7 min of
/// compiling on 16 cores) keeps what it timed every few minutes, and the next run resumes after it.
pub const PART_SOURCES_PER_JOB: usize = 3;

/// Splits the problems into parts, each whole problems (every candidate of a problem is timed in
/// the same part, so a profile stopped between parts leaves no problem half measured) needing
/// about `max_new` candidate sources that no earlier part built. Problems are taken greedily,
/// those needing the fewest new sources first (problems sharing an epilogue share their
/// sources), in the given order on ties; a problem needing more than `max_new` by itself starts
/// a part that only problems needing no new source join, and a problem needing none joins the
/// part at hand. With room for every source, one part in the given order.
fn plan_parts(problems: &[ProfileProblem], max_new: usize) -> Vec<Vec<ProfileProblem>> {
    if candidate_sources(problems).len() <= max_new {
        return vec![problems.to_vec()];
    }
    let mut left: Vec<&ProfileProblem> = problems.iter().collect();
    let mut built: BTreeSet<&str> = BTreeSet::new();
    let (mut parts, mut part, mut part_new) = (Vec::new(), Vec::new(), 0usize);
    let new_sources = |p: &ProfileProblem, built: &BTreeSet<&str>| {
        candidate_sources(std::slice::from_ref(p)).difference(built).count()
    };
    while let Some((i, new)) =
        left.iter().enumerate().map(|(i, p)| (i, new_sources(p, &built))).min_by_key(|&(i, n)| (n, i))
    {
        // A problem whose sources are all built already joins the current part for free.
        if !part.is_empty() && new > 0 && part_new + new > max_new {
            parts.push(std::mem::take(&mut part));
            part_new = 0;
        }
        let p = left.remove(i);
        built.extend(candidate_sources(std::slice::from_ref(p)));
        part_new += new;
        part.push(p.clone());
    }
    if !part.is_empty() {
        parts.push(part);
    }
    parts
}

/// The distinct candidate sources (instance names) of `problems`.
fn candidate_sources(problems: &[ProfileProblem]) -> BTreeSet<&str> {
    problems.iter().flat_map(|p| p.candidates.iter().map(|c| c.name.as_str())).collect()
}

fn write_if_changed(path: &Path, text: &str) -> Result<()> {
    if std::fs::read(path).ok().as_deref() != Some(text.as_bytes()) {
        std::fs::write(path, text).map_err(|e| Error::Other(format!("profile: writing {}: {e}", path.display())))?;
    }
    Ok(())
}

/// Renders one part's candidate sources and its `profiler_cu` (the case table of its problems)
/// into `dir` and builds them into `lib_name` (objects of sources an earlier part or run compiled
/// come from the object cache). Returns the part's problems in the order of the library's case
/// table: convolutions first, then matrix products.
fn build_part<'a>(
    part: &'a [ProfileProblem],
    templates: &Templates,
    dir: &Path,
    profiler_cu: &str,
    lib_name: &str,
    toolchain: &Toolchain,
    opts: &ProfileOptions,
) -> Result<Vec<&'a ProfileProblem>> {
    let mut instances: BTreeMap<String, &LibraryInstance> = BTreeMap::new();
    for p in part {
        for c in &p.candidates {
            instances.entry(c.name.clone()).or_insert(c);
        }
    }
    let mut sources = Vec::new();
    for (name, inst) in &instances {
        let text = templates.render(&format!("library/{}.cu", inst.template), &Json::Object(inst.context.clone()))?;
        write_if_changed(&dir.join(format!("{name}.cu")), &text)?;
        sources.push(PathBuf::from(format!("{name}.cu")));
    }
    let kind_of = |t: &str| if t.starts_with("conv") { "conv" } else { "gemm" };
    let ctx_instances: Vec<Json> =
        instances.values().map(|i| json!({ "name": i.name, "kind": kind_of(&i.template) })).collect();
    // The profiler enumerates conv problems first, then gemms; keep that order here.
    let ordered: Vec<&ProfileProblem> =
        part.iter().filter(|p| p.kind == "conv").chain(part.iter().filter(|p| p.kind == "gemm")).collect();
    let section = |kind: &str| -> Vec<Json> {
        ordered
            .iter()
            .filter(|p| p.kind == kind)
            .enumerate()
            .map(|(i, p)| {
                let mut f = p.fields.clone();
                f.insert("index".into(), json!(i));
                f.insert("signature".into(), json!(p.signature));
                f.insert("candidates".into(), json!(p.candidates.iter().map(|c| c.name.clone()).collect::<Vec<_>>()));
                Json::Object(f)
            })
            .collect()
    };
    let ctx = json!({ "instances": ctx_instances, "convs": section("conv"), "gemms": section("gemm") });
    write_if_changed(&dir.join(profiler_cu), &templates.render("profile/profiler.cu", &ctx)?)?;
    sources.push(PathBuf::from(profiler_cu));
    // With progress on, the build prints its own summary line.
    crate::build::build(dir, &sources, &[PathBuf::from("library.cuh")], toolchain.compiler(), &opts.build, lib_name)?;
    Ok(ordered)
}

/// Times every case of one part's library (`ordered`: its problems in case-table order) not yet
/// in the cache for `device`, saving the cache after each problem. Returns the cases run and
/// those found in the cache. `part`: (this part, parts) for the progress bar, None for no bar.
fn time_part(
    lib: &ProfilerLib,
    ordered: &[&ProfileProblem],
    cache: &mut ProfileCache,
    device: &str,
    part: Option<(usize, usize)>,
    opts: &ProfileOptions,
) -> Result<(usize, usize)> {
    let cases = lib.num_cases();
    let expected: usize = ordered.iter().map(|p| p.candidates.len()).sum();
    if cases != expected {
        return Err(Error::Other(format!(
            "profile: {} has {cases} cases, the model has {expected}: stale build",
            lib.path().display()
        )));
    }
    let bar = match part {
        Some(_) => ProgressBar::new(cases as u64),
        None => ProgressBar::hidden(),
    };
    let label = match part {
        Some((k, n)) if n > 1 => format!("profiling part {k}/{n}"),
        _ => "profiling".to_string(),
    };
    bar.set_style(
        ProgressStyle::with_template(&format!(
            "{label} [{{bar:30}}] {{pos}}/{{len}} cases, {{elapsed}} elapsed, eta {{eta}} {{msg}}"
        ))
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let (mut run, mut cached) = (0usize, 0usize);
    let mut last_problem = None;
    let mut fatal: Option<String> = None;
    for i in 0..cases {
        let info = lib.case_info(i)?;
        let p = ordered
            .iter()
            .filter(|p| (p.kind == "gemm") == info.is_gemm)
            .nth(info.problem)
            .ok_or_else(|| Error::Other(format!("profile: case {i} names a problem the model does not have")))?;
        let cand = p
            .candidates
            .get(info.candidate)
            .ok_or_else(|| Error::Other(format!("profile: case {i} names a candidate the model does not have")))?;
        if last_problem != Some(&p.signature) {
            if last_problem.is_some() {
                cache.save()?;
            }
            last_problem = Some(&p.signature);
            bar.set_message(p.signature.clone());
        }
        bar.inc(1);
        if cache.get(device, &p.signature, &cand.config).is_some() {
            cached += 1;
            continue;
        }
        run += 1;
        let outcome = match lib.run(i, opts.warmup, opts.iters) {
            Ok(t) => {
                let (err, r) = (t.max_abs_err as f64, t.max_abs_ref as f64);
                if err.is_finite() && err <= MISMATCH_TOLERANCE * (r + 1.0) {
                    Outcome::Ok { ms: t.median_ms as f64 }
                } else {
                    Outcome::Mismatch { max_abs_err: err, max_abs_ref: r }
                }
            }
            Err(CaseError::Unsupported(why)) => Outcome::Unsupported { why },
            Err(CaseError::Failed(why)) => {
                // A sticky CUDA error (illegal address, …) leaves the context unusable: stop here;
                // the cache keeps everything measured so far and the next run resumes after it.
                if lib.context_lost() {
                    fatal = Some(format!("{} on {}: {why}", cand.config, p.signature));
                }
                Outcome::Failed { why }
            }
        };
        cache.put(device, &p.signature, &cand.config, outcome);
        if fatal.is_some() {
            break;
        }
    }
    cache.save()?;
    bar.finish_and_clear();
    if let Some(f) = fatal {
        return Err(Error::Other(format!(
            "profile: a candidate failed at run time and profiling stopped ({f}); the times measured so far are in {}",
            cache.path().display()
        )));
    }
    Ok((run, cached))
}

/// The problems with only their candidates that `device` has no outcome for in the cache (all of
/// them without a device), and without the problems left with none.
fn pending_problems(all: &[ProfileProblem], cache: &ProfileCache, device: Option<&str>) -> Vec<ProfileProblem> {
    all.iter()
        .filter_map(|p| {
            let candidates: Vec<LibraryInstance> = p
                .candidates
                .iter()
                .filter(|c| device.is_none_or(|d| cache.get(d, &p.signature, &c.config).is_none()))
                .cloned()
                .collect();
            (!candidates.is_empty()).then(|| ProfileProblem { candidates, ..p.clone() })
        })
        .collect()
}

/// The per-problem report of every problem of the model, from the cache.
fn report(
    problems: &[ProfileProblem],
    device: &str,
    cache: &ProfileCache,
    cases_run: usize,
    cases_cached: usize,
    build_seconds: f64,
    profile_seconds: f64,
) -> ProfileReport {
    let problems_report = problems
        .iter()
        .map(|p| {
            let mut counts = [0usize; 4];
            let mut best: Option<(String, f64)> = None;
            for c in &p.candidates {
                match cache.get(device, &p.signature, &c.config) {
                    Some(Outcome::Ok { ms }) => {
                        counts[0] += 1;
                        if best.as_ref().is_none_or(|b| *ms < b.1) {
                            best = Some((c.config.clone(), *ms));
                        }
                    }
                    Some(Outcome::Unsupported { .. }) => counts[1] += 1,
                    Some(Outcome::Mismatch { .. }) => counts[2] += 1,
                    Some(Outcome::Failed { .. }) | None => counts[3] += 1,
                }
            }
            let heur = match cache.get(device, &p.signature, &p.heuristic) {
                Some(Outcome::Ok { ms }) => Some(Timed { name: p.heuristic.clone(), median_ms: *ms }),
                _ => None,
            };
            ProblemReport {
                signature: p.signature.clone(),
                kind: p.kind,
                gflop: p.flops / 1e9,
                tflops: best.as_ref().map(|b| p.flops / (b.1 * 1e-3) / 1e12),
                best_ms: best.as_ref().map(|b| b.1),
                best: best.map(|(name, median_ms)| Timed { name, median_ms }),
                heuristic: heur,
                counts,
            }
        })
        .collect();
    ProfileReport {
        device: device.to_string(),
        cache: cache.path().to_path_buf(),
        problems: problems_report,
        cases_run,
        cases_cached,
        build_seconds,
        profile_seconds,
    }
}

/// The measurements of the one device in `cache` matching `arch` and the toolchain, or of `gpu`
/// when given. None when the cache has no entry for this toolchain (the heuristic decides).
pub fn measurements_for(
    cache: &ProfileCache,
    toolchain: &Toolchain,
    gpu: Option<&str>,
) -> Result<Option<(String, crate::lower::target::Measurements)>> {
    let devices = toolchain.devices_in(cache);
    let chosen = match gpu {
        Some(g) => {
            let key = toolchain.device_key(g);
            if !devices.contains(&key) {
                return Err(Error::Other(format!(
                    "profile cache {} has no times for '{key}' (it has: {})",
                    cache.path().display(),
                    if devices.is_empty() { "none for this toolchain".to_string() } else { devices.join("; ") }
                )));
            }
            key
        }
        None => match devices.len() {
            0 => return Ok(None),
            1 => devices[0].clone(),
            _ => {
                return Err(Error::Other(format!(
                    "profile cache {} has times for several GPUs ({}); pick one with --profile-gpu",
                    cache.path().display(),
                    devices.join("; ")
                )))
            }
        },
    };
    let m = cache.measurements(&chosen);
    Ok(Some((chosen, m)))
}

/// Where `profile` writes its sources by default: beside the cache file.
pub fn default_work_dir(cache: &Path) -> PathBuf {
    cache.parent().map(|d| d.join("profiler")).unwrap_or_else(|| PathBuf::from("onnx2ait-profiler"))
}

/// The lock of a profiler work folder (`<dir>/.profile.lock`), waited for when another profile
/// holds it (saying so on stderr with `progress`).
fn lock_work_dir(dir: &Path, progress: bool) -> Result<crate::build::lock::FileLock> {
    let path = dir.join(".profile.lock");
    if let Some(held) = crate::build::lock::try_lock(&path)? {
        return Ok(held);
    }
    if progress {
        eprintln!("profile: another profile is using {}; waiting for it to finish", dir.display());
    }
    crate::build::lock::lock(&path)
}

/// The object cache of a profile with the default work folder and no shared cache directory:
/// where `compile` finds the instances the profiler compiled.
pub fn default_object_cache(cache: &Path) -> PathBuf {
    crate::build::private_cache_dir(&default_work_dir(cache))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::Dim;
    use crate::lower::cuda::Arch;
    use crate::lower::problem::ConvProblem;
    use cache::device_key;

    /// The recorded problems of one 3x3 convolution at batch ranges 1 and 8 (sm_90a candidates).
    fn problems() -> Vec<ProfileProblem> {
        let p = ConvProblem {
            n: Dim::sym("N"),
            h: 28,
            w: 28,
            c: 64,
            k: 64,
            r: 3,
            s: 3,
            p: 28,
            q: 28,
            pads: [1; 4],
            strides: [1, 1],
            dilations: [1, 1],
            group: 1,
            bias: true,
            residual: false,
            pre_act: None,
            act: None,
        };
        let t = CudaTarget::new(Arch::Sm90a).with_max_batch(8).recording();
        crate::lower::Target::conv2d(&t, &p);
        t.recorded()
    }

    /// The problems `profile --build-only --attention fused` of tiny BERT (TorchScript export)
    /// records for sm_90a with `lower`'s ranges.
    fn tiny_bert_problems(lower: LowerOptions) -> Vec<ProfileProblem> {
        let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models/exports/bert_tiny_torchscript.onnx");
        let g = crate::onnx::load_model(&model).unwrap();
        let opts = ProfileOptions {
            target: ProfileTarget::Cuda(Arch::Sm90a),
            lower,
            optimize: crate::egraph::OptimizeOptions::pipeline(true).unwrap(),
            cache: PathBuf::from("unused.json"),
            work_dir: PathBuf::from("unused"),
            build: BuildOptions::default(),
            warmup: 0,
            iters: 1,
            progress: false,
            build_only: true,
            part_sources: None,
        };
        super::problems(&g, &opts).unwrap()
    }

    /// `profile --dim seq=1..64 --max-batch 4 --attention fused` of tiny BERT: every product is
    /// timed at each (batch, seq) range bound the build chooses at, the packed q/k/v projection
    /// included, and at no other size.
    #[test]
    fn run_time_ranges_are_profiled_at_each_range_bound() {
        let lower = LowerOptions { ranges: [("seq".to_string(), (1, 64))].into(), max_batch: 4, ..Default::default() };
        let all = tiny_bert_problems(lower);
        let field = |p: &ProfileProblem, k: &str| p.fields[k].as_i64().unwrap();
        // Projections and feed-forward products have batch · seq rows: one problem per bound.
        let rows: BTreeSet<i64> = all
            .iter()
            .filter(|p| field(p, "k") == 64 && field(p, "n") != 64 || field(p, "n") == 192)
            .map(|p| field(p, "m"))
            .collect();
        assert_eq!(rows, [1, 4, 8, 32, 64, 256].into(), "batch 1 and 4 times seq 1, 8 and 64");
        // Every problem is at a point of the grid: rows are a batch bound times a seq bound, or a
        // batch bound (the pooler). Pricing seq at the batch (4) would have added 16 rows.
        for p in &all {
            let m = field(p, "m");
            assert!([1, 4, 8, 32, 64, 256].contains(&m), "{}", p.signature);
        }
        // The packed q/k/v projection (N = 3 · 64) of fused attention is among them, per range.
        let qkv: Vec<&ProfileProblem> = all.iter().filter(|p| field(p, "n") == 192).collect();
        assert_eq!(qkv.len(), 6, "{:?}", qkv.iter().map(|p| &p.signature).collect::<Vec<_>>());
        assert!(qkv
            .iter()
            .any(|p| p.point == crate::lower::target::Point { batch: 4, dims: [("seq".to_string(), 8)].into() }
                && field(p, "m") == 32));
    }

    /// `profile --dim batch=4..64 --dim seq=16..128` of tiny BERT (issue 14): ranges whose smallest
    /// values are above 1 are profiled only at bounds inside them, batch 8 and 64 and seq 64 and
    /// 128, never at a batch or length of 1 that no run of the build can take.
    #[test]
    fn ranges_above_one_are_profiled_inside_them() {
        let ranges = [("batch".to_string(), (4, 64)), ("seq".to_string(), (16, 128))].into();
        let all = tiny_bert_problems(LowerOptions { ranges, max_batch: 64, ..Default::default() });
        assert!(!all.is_empty());
        let batches: BTreeSet<i64> = all.iter().map(|p| p.point.batch).collect();
        assert_eq!(batches, [8, 64].into(), "batch bounds inside 4..64");
        let seqs: BTreeSet<i64> = all.iter().filter_map(|p| p.point.dims.get("seq").copied()).collect();
        assert_eq!(seqs, [64, 128].into(), "seq bounds inside 16..128");
        // The packed q/k/v projection's rows are a batch bound times a seq bound: none at 1.
        let field = |p: &ProfileProblem, k: &str| p.fields[k].as_i64().unwrap();
        let rows: BTreeSet<i64> = all.iter().filter(|p| field(p, "n") == 192).map(|p| field(p, "m")).collect();
        assert_eq!(rows, [8 * 64, 8 * 128, 64 * 64, 64 * 128].into());
    }

    fn cache(name: &str) -> ProfileCache {
        let path = std::env::temp_dir().join(format!("o2a-profile-{}-{name}.json", std::process::id()));
        let _ = std::fs::remove_file(&path);
        ProfileCache::open(&path).unwrap()
    }

    #[test]
    fn cached_candidates_are_neither_built_nor_timed_again() {
        let all = problems();
        assert_eq!(all.len(), 2);
        let n = all[0].candidates.len();
        let dev = device_key("NVIDIA H200", "sm_90a", "nvcc 13.0.88", "cutlass 4.2.0");
        let mut c = cache("pending");
        // Without a known device everything is pending.
        assert_eq!(pending_problems(&all, &c, None).iter().map(|p| p.candidates.len()).sum::<usize>(), 2 * n);
        // Every outcome counts as done, not only times: a refused or wrong candidate is not retried.
        c.put(&dev, &all[0].signature, &all[0].candidates[0].config, Outcome::Ok { ms: 0.05 });
        c.put(&dev, &all[0].signature, &all[0].candidates[1].config, Outcome::Unsupported { why: "x".into() });
        c.put(
            &dev,
            &all[0].signature,
            &all[0].candidates[2].config,
            Outcome::Mismatch { max_abs_err: 1.0, max_abs_ref: 1.0 },
        );
        let pending = pending_problems(&all, &c, Some(&dev));
        assert_eq!(pending.len(), 2);
        assert_eq!(pending[0].candidates.len(), n - 3);
        assert_eq!(pending[1].candidates.len(), n);
        // A problem with every candidate done drops out; another GPU's times do not count.
        for cand in &all[1].candidates {
            c.put(&dev, &all[1].signature, &cand.config, Outcome::Ok { ms: 0.1 });
        }
        assert_eq!(pending_problems(&all, &c, Some(&dev)).len(), 1);
        assert_eq!(pending_problems(&all, &c, Some("another GPU")).len(), 2);
    }

    #[test]
    fn report_takes_the_fastest_matching_candidate() {
        let all = problems();
        let dev = device_key("NVIDIA H200", "sm_90a", "nvcc 13.0.88", "cutlass 4.2.0");
        let mut c = cache("report");
        let p = &all[1];
        c.put(&dev, &p.signature, &p.candidates[0].config, Outcome::Ok { ms: 0.30 });
        c.put(&dev, &p.signature, &p.candidates[1].config, Outcome::Ok { ms: 0.20 });
        // Faster but wrong: never the best.
        c.put(&dev, &p.signature, &p.candidates[2].config, Outcome::Mismatch { max_abs_err: 9.0, max_abs_ref: 1.0 });
        c.put(&dev, &p.signature, &p.heuristic, Outcome::Ok { ms: 0.25 });
        let r = report(&all, &dev, &c, 4, 0, 1.0, 2.0);
        let pr = &r.problems[1];
        assert_eq!(pr.best.as_ref().map(|b| b.name.as_str()), Some(p.candidates[1].config.as_str()));
        assert_eq!(pr.best_ms, Some(0.20));
        assert_eq!(pr.heuristic.as_ref().map(|h| h.median_ms), Some(0.25));
        let flops = 2.0 * 8.0 * 28.0 * 28.0 * 64.0 * 9.0 * 64.0;
        assert!((pr.tflops.unwrap() - flops / 0.20e-3 / 1e12).abs() < 1e-9);
        assert_eq!(pr.counts[2], 1, "one mismatch");
        // The other problem has no outcome: no best, every candidate counted as not run.
        assert!(r.problems[0].best.is_none());
        assert_eq!(r.problems[0].counts[3], all[0].candidates.len());
        assert!(r.summary().contains(&p.signature));
    }

    /// The candidate sources of `problems` not in `built`.
    fn new_sources<'a>(problems: &'a [ProfileProblem], built: &BTreeSet<&str>) -> Vec<&'a str> {
        candidate_sources(problems).into_iter().filter(|n| !built.contains(n)).collect()
    }

    /// A profile too long to compile at once is split into parts of whole problems: every
    /// problem in exactly one part, each part needing at most the given number of sources no
    /// earlier part built (or only its first problem's), a problem whose sources are built joining
    /// the part at hand; with room for every source, one part in the original order.
    #[test]
    fn parts_split_whole_problems_by_new_sources() {
        let lower = LowerOptions { ranges: [("seq".to_string(), (1, 64))].into(), max_batch: 8, ..Default::default() };
        let all = tiny_bert_problems(lower);
        let total = new_sources(&all, &Default::default()).len();
        assert!(all.len() > 4 && total > 8, "{} problems, {total} sources", all.len());
        let one = plan_parts(&all, total);
        assert_eq!(one.len(), 1);
        let sigs = |ps: &[ProfileProblem]| ps.iter().map(|p| p.signature.clone()).collect::<Vec<_>>();
        assert_eq!(sigs(&one[0]), sigs(&all));

        let max_new = 4;
        let parts = plan_parts(&all, max_new);
        assert!(parts.len() > 1);
        let mut seen: Vec<String> = parts.iter().flat_map(|p| sigs(p)).collect();
        seen.sort();
        let mut want = sigs(&all);
        want.sort();
        assert_eq!(seen, want, "every problem once");
        let mut built = BTreeSet::new();
        let mut reused = 0;
        for part in &parts {
            let new = new_sources(part, &built);
            // Over the limit only when its first problem alone is (the others adding nothing).
            let first = new_sources(&part[..1], &built);
            assert!(new.len() <= max_new || new == first, "{} new sources in a part of {}", new.len(), part.len());
            reused += part.iter().filter(|p| p.candidates.iter().all(|c| built.contains(c.name.as_str()))).count();
            built.extend(candidate_sources(part));
        }
        assert_eq!(built.len(), total);
        // A problem whose sources an earlier part built joins that part (at no compile cost):
        // no later part waits for it, and problems sharing an epilogue share a part.
        assert_eq!(reused, 0, "a problem with every source built came in a later part");
        assert!(parts.len() < all.len(), "{} parts for {} problems", parts.len(), all.len());
    }

    /// A second profile of the same work folder waits for the first to release it.
    #[test]
    fn profiles_of_one_work_folder_take_turns() {
        let dir = std::env::temp_dir().join(format!("o2a-profile-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let first = lock_work_dir(&dir, false).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn({
            let dir = dir.clone();
            move || {
                let held = lock_work_dir(&dir, false);
                tx.send(()).unwrap();
                held.map(|_| ())
            }
        });
        assert!(rx.recv_timeout(std::time::Duration::from_millis(200)).is_err(), "the second did not wait");
        drop(first);
        rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the second got the folder");
        second.join().unwrap().unwrap();
        std::fs::remove_dir_all(&dir).ok();
    }
}
