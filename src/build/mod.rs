//! Build stage: compiles the generated sources of an output directory into the model's shared
//! library.
//!
//! Target-neutral on purpose: the CUDA specifics (nvcc, its flags, CUTLASS) live behind the
//! [`Compiler`] trait in [`nvcc`], so a HIP/ROCm back end only adds another implementation.
//!
//! Why it is shaped this way:
//! - Code generation emits one kernel instance per file because template-heavy kernels (CUTLASS)
//!   cost 10–60 s and gigabytes of memory each to compile. Files are compiled in parallel, with
//!   the job count bounded by free memory as well as by cores so a big model does not push the
//!   machine into swap or the OOM killer.
//! - Regenerating a model usually changes few kernels, so objects are cached by content hash
//!   (compiler fingerprint + source + shared headers; see [`cache`]) and only changed files are
//!   recompiled. Objects and the library are written under temporary names and renamed into
//!   place, so an interrupted build never leaves a truncated file that a later build would trust.
//! - A cache folder may be shared by builds running at the same time (`--cache-dir`): an object
//!   is compiled under an advisory lock ([`lock`]) and looked for again once the lock is held, so
//!   two builds never compile the same source twice — the second takes the first one's object.
//!   What a killed build left half-written (its temporary objects) is removed by the next build.
//! - Objects are reproducible: the compiler runs in the output folder on the source's relative
//!   path (so `__FILE__` and anonymous-namespace names do not depend on where OUT or its staging
//!   folder is), and writes into a temporary folder named after the object (nvcc names its
//!   intermediate files, whose names end up in the object, after it: see [`nvcc`]). Equal
//!   sources, headers and toolchain give equal objects and an equal library.
//! - A failing kernel should be reported with the compiler's own words, not "exit status 2":
//!   the error names the file and quotes the tail of the compiler output; `build.log` keeps
//!   everything. Once one file fails no further files are started (the build is lost anyway),
//!   but files already compiling finish and their failures are reported too.

pub mod cache;
pub mod hip;
pub mod lock;
pub mod nvcc;

pub use nvcc::Nvcc;

use crate::error::{Error, Result};
use cache::Header;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// A compiler for one target: how to turn one source into an object and objects into a shared
/// library. Implementations hold everything discovered about the toolchain; the build stage only
/// runs the commands they return.
pub trait Compiler: Sync {
    /// Short name used in messages ("nvcc").
    fn name(&self) -> &str;

    /// Everything besides the sources that determines the objects' bytes: compiler version,
    /// target architecture, flags, versions of external header libraries. Part of every object's
    /// cache key, so a change here recompiles everything. Leave machine-specific paths out, so a
    /// cache stays valid when the toolchain is installed elsewhere.
    fn fingerprint(&self) -> String;

    /// One line for logs and reports (version, paths).
    fn describe(&self) -> String {
        self.name().to_string()
    }

    /// The command compiling `src` into the object `obj`. `include_dir` is the generated tree's
    /// root, which sources address their shared headers from. [`build`] runs the command in the
    /// output folder, with `src` relative to it, `include_dir` `.` and `obj` absolute.
    fn compile_command(&self, src: &Path, obj: &Path, include_dir: &Path) -> Command;

    /// The command linking `objs` (in this order) into the shared library `lib`.
    fn link_command(&self, objs: &[PathBuf], lib: &Path) -> Command;

    /// The link arguments that make the linker read the version script `script` (GNU ld's
    /// `--version-script`, given through the compiler driver as `-Wl,`).
    fn version_script_args(&self, script: &Path) -> Vec<OsString> {
        let mut a = OsString::from("-Wl,--version-script=");
        a.push(script);
        vec![a]
    }

    /// File extension of objects, without the dot.
    fn object_ext(&self) -> &str {
        "o"
    }
}

/// How to run a build.
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Parallel compile jobs; `None` picks [`default_jobs`].
    pub jobs: Option<usize>,
    /// Where objects are cached; `None` means `<out_dir>/obj`. Stale objects (older versions of
    /// a source's object) are deleted only from that default, private cache: a directory given
    /// here may be shared between models, whose objects must survive each other's builds.
    pub cache_dir: Option<PathBuf>,
    /// Show progress on stderr and print a summary line there: a progress bar when stderr is a
    /// terminal, else (a log, a pipe, CI) one line per finished source, so a long build is never
    /// silent.
    pub progress: bool,
    /// Other object caches to take objects from (read only): an object missing from the cache
    /// but present under its name (source name + content hash) in one of these is copied in
    /// instead of compiled. `compile` passes the profiler's cache, so the instances it chose were
    /// already compiled when they were profiled.
    pub seed_caches: Vec<PathBuf>,
    /// A linker version script (relative to the output folder) naming what the library exports;
    /// every other symbol stays local to it (see [`crate::codegen::EXPORTS_FILE`]). `None`:
    /// the linker's default, every global symbol exported.
    pub exports: Option<PathBuf>,
}

/// What a build did, for the CLI and for reports.
#[derive(Clone, Debug, Serialize)]
pub struct BuildReport {
    /// Sources compiled in this build.
    pub compiled: usize,
    /// Sources whose object was already cached.
    pub cached: usize,
    /// Wall-clock seconds of the whole build (hashing, compiling, linking).
    pub seconds: f64,
    /// Per source, in the order given: its path relative to the output directory, its compile
    /// time in seconds (0 when cached), and whether it was cached.
    pub per_file: Vec<(String, f64, bool)>,
    /// The shared library.
    pub lib: PathBuf,
    /// Whether the library was (re)linked in this build, rather than already up to date.
    pub linked: bool,
    /// Parallel compile jobs used.
    pub jobs: usize,
}

impl BuildReport {
    /// One line, e.g. "built libmodel.so: 57 sources, 54 compiled, 3 cached, 41.2 s (slowest:
    /// k012_conv2d_library.cu 18.3 s)".
    pub fn summary(&self) -> String {
        let lib = self.lib.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let total = self.per_file.len();
        let what =
            if self.compiled == 0 && !self.linked { format!("{lib} up to date") } else { format!("built {lib}") };
        let mut s = format!(
            "{what}: {total} source{}, {} compiled, {} cached, {:.1} s",
            if total == 1 { "" } else { "s" },
            self.compiled,
            self.cached,
            self.seconds
        );
        let slowest = self
            .per_file
            .iter()
            .filter(|(_, _, cached)| !cached)
            .max_by(|a, b| a.1.partial_cmp(&b.1).unwrap_or(std::cmp::Ordering::Equal));
        if let Some((file, secs, _)) = slowest {
            let _ = write!(s, " (slowest: {file} {secs:.1} s)");
        }
        s
    }
}

/// Default number of parallel compile jobs: one per core, but no more than one per 1.5 GiB of
/// available memory (a CUTLASS instance takes 0.5–3.3 GB to compile), and at least one.
pub fn default_jobs() -> usize {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let by_memory = mem_available_bytes().map(|b| (b / (3 * 512 * 1024 * 1024)) as usize);
    match by_memory {
        Some(m) => cpus.min(m).max(1),
        None => cpus.max(1),
    }
}

/// `MemAvailable` from /proc/meminfo (Linux); `None` where it cannot be read.
pub fn mem_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&info)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let mut it = line["MemAvailable:".len()..].split_whitespace();
    let n: u64 = it.next()?.parse().ok()?;
    match it.next() {
        Some("kB") | None => Some(n * 1024),
        Some(_) => None,
    }
}

/// Lines of compiler output quoted in an error; the rest is in `build.log`.
const ERROR_TAIL_LINES: usize = 40;

/// Name of the full build log inside the output directory.
pub const LOG_NAME: &str = "build.log";

/// The first line of the `build.log` that `onnx2ait compile --no-build` writes in place of a build's:
/// whoever finds no library in OUT can tell that none was asked for (rather than that the build
/// failed or nvcc was missing).
pub const NO_BUILD_LOG: &str = "# not built: onnx2ait compile ran with --no-build (sources only, nvcc not run)";

/// True when `out_dir` was written by `onnx2ait compile --no-build` (its build.log says so).
pub fn written_without_build(out_dir: &Path) -> bool {
    std::fs::read_to_string(out_dir.join(LOG_NAME)).is_ok_and(|t| t.lines().next() == Some(NO_BUILD_LOG))
}

/// One source to build.
struct Unit {
    /// Path relative to the output directory, as shown to users.
    rel: String,
    /// Path the compiler is given: relative to the output directory, which it runs in.
    rel_path: PathBuf,
    base: String,
    /// The object's content hash (the digits in its name).
    hash: String,
    obj: PathBuf,
    obj_name: String,
    cached: bool,
}

/// The result of compiling one unit.
struct Outcome {
    seconds: f64,
    command: String,
    output: String,
    /// `None` on success, else why it failed (exit status or spawn error).
    failure: Option<String>,
    /// A concurrent build sharing the cache compiled the object while this one waited for it.
    by_other: bool,
}

/// The object cache of a build of `out_dir` given no cache directory.
pub fn private_cache_dir(out_dir: &Path) -> PathBuf {
    out_dir.join("obj")
}

/// Compiles `sources` (paths relative to `out_dir`) with `compiler` and links them into
/// `out_dir/<lib_name>`. `headers` (also relative to `out_dir`) are the local headers every
/// source includes; their bytes are part of every object's cache key. Compiles start in the order
/// of `sources`, so callers list the slowest first. See the module docs.
pub fn build(
    out_dir: &Path,
    sources: &[PathBuf],
    headers: &[PathBuf],
    compiler: &dyn Compiler,
    opts: &BuildOptions,
    lib_name: &str,
) -> Result<BuildReport> {
    let start = Instant::now();
    if sources.is_empty() {
        return Err(Error::Other(format!("build: no sources to compile in {}", out_dir.display())));
    }
    if lib_name.is_empty() || lib_name.contains(['/', '\\']) || lib_name.starts_with('.') {
        return Err(Error::Other(format!("build: '{lib_name}' is not a valid library file name")));
    }
    let private_cache = opts.cache_dir.is_none();
    let cache_dir = opts.cache_dir.clone().unwrap_or_else(|| private_cache_dir(out_dir));
    std::fs::create_dir_all(&cache_dir)
        .map_err(|e| Error::Other(format!("build: cannot create the object cache {}: {e}", cache_dir.display())))?;
    // Absolute: the compiler runs in `out_dir` and writes into the cache.
    let cache_dir = std::fs::canonicalize(&cache_dir)
        .map_err(|e| Error::Other(format!("build: object cache {}: {e}", cache_dir.display())))?;
    let mut cleaned = String::new();
    remove_abandoned(&cache_dir, compiler.object_ext(), &mut cleaned);

    let fingerprint = compiler.fingerprint();
    let ext = compiler.object_ext().to_string();
    let headers = read_headers(out_dir, headers)?;
    let units = plan(out_dir, sources, &headers, &fingerprint, &cache_dir, &opts.seed_caches, &ext)?;

    let todo: Vec<usize> = (0..units.len()).filter(|&i| !units[i].cached).collect();
    let jobs = opts.jobs.unwrap_or_else(default_jobs).clamp(1, todo.len().max(1));
    let print_line = |line: &str| {
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    };
    let progress = match (opts.progress, std::io::stderr().is_terminal()) {
        (false, _) => Progress::Off,
        (true, true) => Progress::Bar,
        (true, false) => Progress::Lines(&print_line),
    };
    let outcomes = compile_all(&units, &todo, compiler, out_dir, &cache_dir, jobs, progress);

    let mut log = String::new();
    let _ = writeln!(log, "# onnx2ait build of {} with {}", out_dir.join(lib_name).display(), compiler.describe());
    let _ = writeln!(log, "# {} sources, {} to compile, {jobs} jobs\n", units.len(), todo.len());
    log.push_str(&cleaned);
    let mut failures: Vec<Error> = Vec::new();
    let mut not_started: Vec<&str> = Vec::new();
    let mut per_file: Vec<(String, f64, bool)> = units.iter().map(|u| (u.rel.clone(), 0.0, true)).collect();
    for (k, &i) in todo.iter().enumerate() {
        let unit = &units[i];
        let Some(out) = &outcomes[k] else {
            not_started.push(&unit.rel);
            let _ = writeln!(log, "== {}: not compiled (an earlier file failed)\n", unit.rel);
            continue;
        };
        if out.by_other {
            let _ = writeln!(log, "== {}: cached {} (compiled by a concurrent build)", unit.rel, unit.obj.display());
            continue;
        }
        per_file[i] = (unit.rel.clone(), out.seconds, false);
        let status = out.failure.as_deref().unwrap_or("ok");
        let _ = writeln!(log, "== {} ({status}, {:.1} s)\n$ {}\n{}", unit.rel, out.seconds, out.command, out.output);
        if let Some(why) = &out.failure {
            failures.push(Error::Other(format!(
                "build: compiling {} with {} failed ({why}):\n{}\n(full output in {})",
                unit.rel,
                compiler.name(),
                tail(&out.output, ERROR_TAIL_LINES),
                out_dir.join(LOG_NAME).display()
            )));
        }
    }
    for unit in units.iter().filter(|u| u.cached) {
        let _ = writeln!(log, "== {}: cached {}", unit.rel, unit.obj.display());
    }

    if !failures.is_empty() {
        if !not_started.is_empty() {
            let shown = not_started.iter().take(10).copied().collect::<Vec<_>>().join(", ");
            let more = if not_started.len() > 10 { ", …" } else { "" };
            failures.push(Error::Other(format!(
                "build: stopped after the first failure; {} source(s) not compiled: {shown}{more}",
                not_started.len()
            )));
        }
        write_log(out_dir, &log);
        return Err(Error::from_many(failures));
    }

    if private_cache {
        for unit in &units {
            remove_stale(&cache_dir, unit, &ext, &mut log);
        }
    }

    let lib = out_dir.join(lib_name);
    let linked = match link(&units, compiler, &fingerprint, out_dir, lib_name, &lib, opts.exports.as_deref(), &mut log)
    {
        Ok(linked) => linked,
        Err(e) => {
            write_log(out_dir, &log);
            return Err(e);
        }
    };
    write_log(out_dir, &log);

    let compiled = outcomes.iter().flatten().filter(|o| !o.by_other).count();
    let report = BuildReport {
        compiled,
        cached: units.len() - compiled,
        seconds: start.elapsed().as_secs_f64(),
        per_file,
        lib,
        linked,
        jobs,
    };
    if opts.progress {
        eprintln!("{}", report.summary());
    }
    Ok(report)
}

fn read_headers(out_dir: &Path, headers: &[PathBuf]) -> Result<Vec<Header>> {
    headers
        .iter()
        .map(|h| {
            let path = out_dir.join(h);
            let bytes = std::fs::read(&path)
                .map_err(|e| Error::Other(format!("build: cannot read header {}: {e}", path.display())))?;
            Ok(Header { name: h.to_string_lossy().into_owned(), bytes })
        })
        .collect()
}

/// Hashes every source and decides which objects are already cached.
fn plan(
    out_dir: &Path,
    sources: &[PathBuf],
    headers: &[Header],
    fingerprint: &str,
    cache_dir: &Path,
    seed_caches: &[PathBuf],
    ext: &str,
) -> Result<Vec<Unit>> {
    let mut units: Vec<Unit> = Vec::with_capacity(sources.len());
    for rel_path in sources {
        let src = out_dir.join(rel_path);
        let rel_for_name = src.strip_prefix(out_dir).unwrap_or(rel_path);
        let rel = rel_for_name.to_string_lossy().into_owned();
        let base = cache::object_base(rel_for_name).ok_or_else(|| {
            Error::Other(format!(
                "build: source {} must be a file inside the output directory {}",
                rel_path.display(),
                out_dir.display()
            ))
        })?;
        if let Some(other) = units.iter().find(|u| u.base == base) {
            return Err(Error::Other(format!(
                "build: sources {} and {rel} would share the object name '{base}'; rename one",
                other.rel
            )));
        }
        let bytes = std::fs::read(&src)
            .map_err(|e| Error::Other(format!("build: cannot read source {}: {e}", src.display())))?;
        let hash = cache::object_hash(fingerprint, &bytes, &cache::included(&bytes, headers));
        let obj_name = cache::object_name(&base, &hash, ext);
        let obj = cache_dir.join(&obj_name);
        let cached = obj.is_file() || seed_caches.iter().any(|d| seed(&d.join(&obj_name), &obj));
        let hash = hash[..cache::HASH_DIGITS].to_string();
        units.push(Unit { rel, rel_path: rel_for_name.to_path_buf(), base, hash, obj, obj_name, cached });
    }
    Ok(units)
}

/// Copies the object `from` of a seed cache to `to` (through a temporary file, so a reader never
/// sees half an object); false when there is none or it cannot be copied (then it is compiled).
fn seed(from: &Path, to: &Path) -> bool {
    if !from.is_file() {
        return false;
    }
    let tmp = temp_object(to);
    let ok = std::fs::copy(from, &tmp).is_ok() && std::fs::rename(&tmp, to).is_ok();
    let _ = std::fs::remove_file(&tmp);
    ok
}

/// How a build shows its progress.
enum Progress<'a> {
    Off,
    /// A progress bar (stderr is a terminal).
    Bar,
    /// One line per finished source, given to the function: "compiled 3/57 k012_conv.cu (18.3 s;
    /// 41 s elapsed)".
    Lines(&'a (dyn Fn(&str) + Sync)),
}

/// The progress line of a finished source.
fn progress_line(done: usize, total: usize, rel: &str, outcome: &Outcome, elapsed: Duration) -> String {
    let what = match (&outcome.failure, outcome.by_other) {
        (Some(_), _) => "FAILED",
        (None, true) => "cached (compiled by a concurrent build)",
        (None, false) => "compiled",
    };
    format!("{what} {done}/{total} {rel} ({:.1} s; {:.0} s elapsed)", outcome.seconds, elapsed.as_secs_f64())
}

/// Compiles the units listed in `todo` on `jobs` threads. Returns one entry per `todo` element:
/// `None` when it was never started because an earlier file failed.
///
/// Each object is compiled under its lock in `cache_dir` (see [`object_lock`]). A unit whose lock
/// another build holds is put aside and taken up, waiting for the lock, once every other unit has
/// been started; when the lock comes, the object is usually there (the other build compiled it)
/// and is taken as cached.
fn compile_all(
    units: &[Unit],
    todo: &[usize],
    compiler: &dyn Compiler,
    out_dir: &Path,
    cache_dir: &Path,
    jobs: usize,
    progress: Progress,
) -> Vec<Option<Outcome>> {
    if todo.is_empty() {
        return Vec::new();
    }
    let start = Instant::now();
    let lines = match progress {
        Progress::Lines(f) => {
            f(&format!("compiling {} sources with {} ({jobs} jobs)", todo.len(), compiler.name()));
            Some(f)
        }
        _ => None,
    };
    let finished = AtomicUsize::new(0);
    let bar =
        if matches!(progress, Progress::Bar) { ProgressBar::new(todo.len() as u64) } else { ProgressBar::hidden() };
    if let Ok(style) = ProgressStyle::with_template("compiling [{bar:30}] {pos}/{len} {msg} ({elapsed})") {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(250));

    let next = AtomicUsize::new(0);
    let put_aside: Mutex<Vec<usize>> = Mutex::new(Vec::new());
    let failed = AtomicBool::new(false);
    let results: Mutex<Vec<Option<Outcome>>> = Mutex::new((0..todo.len()).map(|_| None).collect());
    let running: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let show_running = |running: &[String]| match running {
        [] => String::new(),
        [one] => one.clone(),
        [first, rest @ ..] => format!("{first} (+{} more)", rest.len()),
    };

    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                if failed.load(Ordering::SeqCst) {
                    break;
                }
                let k = next.fetch_add(1, Ordering::SeqCst);
                let (k, held) = if k < todo.len() {
                    match lock::try_lock(&object_lock(cache_dir, &units[todo[k]])) {
                        Ok(Some(held)) => (k, Ok(held)),
                        Ok(None) => {
                            put_aside.lock().unwrap_or_else(PoisonError::into_inner).push(k);
                            continue;
                        }
                        Err(e) => (k, Err(e)),
                    }
                } else {
                    let Some(k) = put_aside.lock().unwrap_or_else(PoisonError::into_inner).pop() else { break };
                    (k, lock::lock(&object_lock(cache_dir, &units[todo[k]])))
                };
                let unit = &units[todo[k]];
                {
                    let mut r = running.lock().unwrap_or_else(PoisonError::into_inner);
                    r.push(unit.rel.clone());
                    bar.set_message(show_running(&r));
                }
                let outcome = match held {
                    Err(e) => Outcome {
                        seconds: 0.0,
                        command: String::new(),
                        output: String::new(),
                        failure: Some(e.to_string()),
                        by_other: false,
                    },
                    Ok(_held) if unit.obj.is_file() => Outcome {
                        seconds: 0.0,
                        command: String::new(),
                        output: String::new(),
                        failure: None,
                        by_other: true,
                    },
                    Ok(_held) => compile_one(unit, compiler, out_dir, cache_dir),
                };
                if outcome.failure.is_some() {
                    failed.store(true, Ordering::SeqCst);
                }
                {
                    let mut r = running.lock().unwrap_or_else(PoisonError::into_inner);
                    r.retain(|name| name != &unit.rel);
                    bar.set_message(show_running(&r));
                }
                bar.inc(1);
                if let Some(print) = lines {
                    let done = finished.fetch_add(1, Ordering::SeqCst) + 1;
                    print(&progress_line(done, todo.len(), &unit.rel, &outcome, start.elapsed()));
                }
                let mut res = results.lock().unwrap_or_else(PoisonError::into_inner);
                res[k] = Some(outcome);
            });
        }
    });
    bar.finish_and_clear();
    results.into_inner().unwrap_or_else(PoisonError::into_inner)
}

/// Folder of a cache holding the lock files of its objects ([`object_lock`]).
const LOCK_DIR: &str = ".locks";
/// Folder of a cache in which objects are compiled, one subfolder per object being compiled.
const WORK_DIR: &str = ".work";

/// The lock guarding the compilation of `unit`'s object in `cache_dir`. Objects share 256 lock
/// files by the first two digits of their hash: enough that two builds rarely wait for each
/// other's different objects, few enough that the lock folder never grows.
fn object_lock(cache_dir: &Path, unit: &Unit) -> PathBuf {
    lock_of_hash(cache_dir, &unit.hash)
}

fn lock_of_hash(cache_dir: &Path, hash: &str) -> PathBuf {
    cache_dir.join(LOCK_DIR).join(format!("{}.lock", &hash[..2.min(hash.len())]))
}

/// Where `obj` is copied before it is renamed into place (same folder and extension): unique per
/// process and call, so concurrent copies never write one file.
fn temp_object(obj: &Path) -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    let name = obj.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let ext = obj.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_default();
    obj.with_file_name(format!("{name}.tmp{}-{n}.{ext}", std::process::id()))
}

/// Compiles one unit (its lock held) into `<cache>/.work/<object name>/<object name>` and renames
/// the object into the cache on success. The folder and file are named after the object alone —
/// no process id — because nvcc names its intermediate files after the object and the name of
/// one of them ends up in the object; the lock makes the name private to this compile.
fn compile_one(unit: &Unit, compiler: &dyn Compiler, out_dir: &Path, cache_dir: &Path) -> Outcome {
    let work = cache_dir.join(WORK_DIR).join(&unit.obj_name);
    // Whatever is there was left by a killed build (the lock is ours).
    let _ = std::fs::remove_dir_all(&work);
    if let Err(e) = std::fs::create_dir_all(&work) {
        return Outcome {
            seconds: 0.0,
            command: String::new(),
            output: String::new(),
            failure: Some(format!("cannot create {}: {e}", work.display())),
            by_other: false,
        };
    }
    let tmp = work.join(&unit.obj_name);
    let mut cmd = compiler.compile_command(&unit.rel_path, &tmp, Path::new("."));
    cmd.current_dir(out_dir);
    let command = render_command(&cmd);
    let start = Instant::now();
    let result = cmd.stdin(Stdio::null()).output();
    let seconds = start.elapsed().as_secs_f64();
    let (output, failure) = match result {
        Err(e) => (String::new(), Some(format!("cannot run {}: {e}", cmd.get_program().to_string_lossy()))),
        Ok(out) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            if !out.status.success() {
                (text, Some(out.status.to_string()))
            } else if let Err(e) = std::fs::rename(&tmp, &unit.obj) {
                (text, Some(format!("cannot move the object to {}: {e}", unit.obj.display())))
            } else {
                (text, None)
            }
        }
    };
    let _ = std::fs::remove_dir_all(&work);
    Outcome { seconds, command, output, failure, by_other: false }
}

/// Removes what killed builds left in the cache: compile folders (`.work/<object>`) whose lock
/// nobody holds, and temporary objects (`<object>.tmp<pid>[-<n>].<ext>`) of processes that no
/// longer run. Notes each removal in `log`.
fn remove_abandoned(cache_dir: &Path, ext: &str, log: &mut String) {
    let mut removed: Vec<PathBuf> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(cache_dir.join(WORK_DIR)) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(hash) = cache::hash_in_name(&name, ext) else { continue };
            // Held: a build is compiling it now. Taken: nobody is, so the folder is a leftover.
            if let Ok(Some(_held)) = lock::try_lock(&lock_of_hash(cache_dir, hash)) {
                if std::fs::remove_dir_all(e.path()).is_ok() {
                    removed.push(e.path());
                }
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(cache_dir) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(pid) = temp_object_pid(&name, ext) else { continue };
            if process_gone(pid) && std::fs::remove_file(e.path()).is_ok() {
                removed.push(e.path());
            }
        }
    }
    removed.sort();
    for path in removed {
        let _ = writeln!(log, "removed {} (left by a build that was killed)", path.display());
    }
}

/// The process id in the name of a temporary object (`<name>.tmp<pid>.<ext>`, as builds before
/// the cache was locked wrote them, or `<name>.tmp<pid>-<n>.<ext>`); `None` for other names.
fn temp_object_pid(name: &str, ext: &str) -> Option<u32> {
    let stem = name.strip_suffix(ext)?.strip_suffix('.')?;
    let (_, tag) = stem.rsplit_once(".tmp")?;
    let pid = tag.split_once('-').map_or(tag, |(pid, n)| if n.bytes().all(|b| b.is_ascii_digit()) { pid } else { "" });
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// True when no process `pid` runs on this machine. Only known where `/proc` lists processes
/// (Linux); elsewhere every process is taken to be running, so nothing is removed.
fn process_gone(pid: u32) -> bool {
    pid != std::process::id() && Path::new("/proc/self").exists() && !Path::new("/proc").join(pid.to_string()).exists()
}

/// Deletes older objects of the same source from the cache.
fn remove_stale(cache_dir: &Path, unit: &Unit, ext: &str, log: &mut String) {
    let Ok(entries) = std::fs::read_dir(cache_dir) else { return };
    let mut stale: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name != unit.obj_name && cache::is_object_of(&name, &unit.base, ext)
        })
        .map(|e| e.path())
        .collect();
    stale.sort();
    for path in stale {
        match std::fs::remove_file(&path) {
            Ok(()) => {
                let _ = writeln!(log, "removed stale object {}", path.display());
            }
            Err(e) => {
                let _ = writeln!(log, "could not remove stale object {}: {e}", path.display());
            }
        }
    }
}

/// Links the objects into `lib` unless the stamp shows the same objects were linked already.
/// Returns whether it linked.
#[allow(clippy::too_many_arguments)]
fn link(
    units: &[Unit],
    compiler: &dyn Compiler,
    fingerprint: &str,
    out_dir: &Path,
    lib_name: &str,
    lib: &Path,
    exports: Option<&Path>,
    log: &mut String,
) -> Result<bool> {
    let mut names: Vec<String> = units.iter().map(|u| u.obj_name.clone()).collect();
    // The version script decides what the library exports: a changed one links again.
    if let Some(script) = exports {
        let text = std::fs::read_to_string(out_dir.join(script)).map_err(|e| {
            Error::Other(format!("build: cannot read the version script {}: {e}", out_dir.join(script).display()))
        })?;
        use sha2::{Digest, Sha256};
        let digest: String = Sha256::digest(text.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        names.push(format!("{} (version script, sha256 {digest})", script.display()));
    }
    let stamp = cache::link_stamp(fingerprint, lib_name, &names);
    let stamp_path = out_dir.join(format!("{lib_name}.stamp"));
    if lib.is_file() && std::fs::read_to_string(&stamp_path).is_ok_and(|s| s == stamp) {
        let _ = writeln!(log, "\n== link: {} is up to date", lib.display());
        return Ok(false);
    }
    // A stamp that outlives a failed link would claim the old library matches the new objects.
    let _ = std::fs::remove_file(&stamp_path);

    let objs: Vec<PathBuf> = units.iter().map(|u| u.obj.clone()).collect();
    let tmp = out_dir.join(format!(".{lib_name}.tmp{}", std::process::id()));
    let mut cmd = compiler.link_command(&objs, &tmp);
    if let Some(script) = exports {
        // Relative to OUT, where the link runs: the log then names no path of this machine.
        cmd.args(compiler.version_script_args(script));
        cmd.current_dir(out_dir);
    }
    let command = render_command(&cmd);
    let start = Instant::now();
    let result = cmd.stdin(Stdio::null()).output();
    let seconds = start.elapsed().as_secs_f64();
    let fail = |why: String, output: &str, log: &mut String| {
        let _ = std::fs::remove_file(&tmp);
        let _ = writeln!(log, "\n== link ({why}, {seconds:.1} s)\n$ {command}\n{output}");
        Error::Other(format!(
            "build: linking {} with {} failed ({why}):\n{}\n(full output in {})",
            lib.display(),
            compiler.name(),
            tail(output, ERROR_TAIL_LINES),
            out_dir.join(LOG_NAME).display()
        ))
    };
    let out = match result {
        Ok(out) => out,
        Err(e) => {
            let why = format!("cannot run {}: {e}", cmd.get_program().to_string_lossy());
            return Err(fail(why, "", log));
        }
    };
    let mut output = String::from_utf8_lossy(&out.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        return Err(fail(out.status.to_string(), &output, log));
    }
    // Renaming (not overwriting) keeps a process that has the old library mapped working.
    if let Err(e) = std::fs::rename(&tmp, lib) {
        return Err(fail(format!("cannot move the library to {}: {e}", lib.display()), &output, log));
    }
    let _ = writeln!(log, "\n== link (ok, {seconds:.1} s)\n$ {command}\n{output}");
    std::fs::write(&stamp_path, stamp)
        .map_err(|e| Error::Other(format!("build: cannot write {}: {e}", stamp_path.display())))?;
    Ok(true)
}

/// Best effort: a build whose log cannot be written still reports its result.
fn write_log(out_dir: &Path, log: &str) {
    let _ = std::fs::write(out_dir.join(LOG_NAME), log);
}

/// The last `n` non-empty-trailing lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().collect();
    if lines.is_empty() {
        return "(no output)".to_string();
    }
    let skip = lines.len().saturating_sub(n);
    let mut s = String::new();
    if skip > 0 {
        let _ = writeln!(s, "[… {skip} earlier line(s)]");
    }
    s.push_str(&lines[skip..].join("\n"));
    s
}

/// A command line as a shell would accept it, for logs.
fn render_command(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| shell_quote(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=,:+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stands in for a real compiler: "compiling" copies the source (failing on sources that
    /// contain FAIL, with a compiler-like message), "linking" concatenates the objects.
    struct Fake;

    impl Compiler for Fake {
        fn name(&self) -> &str {
            "fake"
        }
        fn fingerprint(&self) -> String {
            "fake 1".into()
        }
        fn compile_command(&self, src: &Path, obj: &Path, _include_dir: &Path) -> Command {
            let mut c = Command::new("sh");
            c.args([
                "-c",
                r#"if grep -q FAIL "$1"; then echo "$1(1): error: FAIL found" >&2; exit 3; fi; cp "$1" "$2""#,
            ]);
            c.arg("sh").arg(src).arg(obj);
            c
        }
        fn link_command(&self, objs: &[PathBuf], lib: &Path) -> Command {
            let mut c = Command::new("sh");
            c.args(["-c", r#"out="$1"; shift; cat "$@" > "$out""#]).arg("sh").arg(lib).args(objs);
            c
        }
    }

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("onnx2ait-build-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The files of a cache, without its lock and work folders.
    fn objects(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != LOCK_DIR && n != WORK_DIR)
            .collect();
        v.sort();
        v
    }

    #[test]
    fn caches_recompiles_changes_and_relinks_only_when_needed() {
        let out = tempdir("cache");
        std::fs::write(out.join("common.cuh"), "h1\n").unwrap();
        std::fs::write(out.join("k000_a.cu"), "a1\n").unwrap();
        std::fs::write(out.join("k001_b.cu"), "#include \"common.cuh\"\nb1\n").unwrap();
        let srcs = vec![PathBuf::from("k000_a.cu"), PathBuf::from("k001_b.cu")];
        let hdrs = vec![PathBuf::from("common.cuh")];
        let opts = BuildOptions { jobs: Some(2), ..Default::default() };

        let r = build(&out, &srcs, &hdrs, &Fake, &opts, "libmodel.so").unwrap();
        assert_eq!((r.compiled, r.cached, r.linked), (2, 0, true));
        assert_eq!(std::fs::read_to_string(out.join("libmodel.so")).unwrap(), "a1\n#include \"common.cuh\"\nb1\n");
        assert_eq!(
            r.per_file.iter().map(|f| (f.0.as_str(), f.2)).collect::<Vec<_>>(),
            [("k000_a.cu", false), ("k001_b.cu", false)]
        );
        assert!(r.summary().starts_with("built libmodel.so: 2 sources, 2 compiled, 0 cached"), "{}", r.summary());

        let r = build(&out, &srcs, &hdrs, &Fake, &opts, "libmodel.so").unwrap();
        assert_eq!((r.compiled, r.cached, r.linked), (0, 2, false));
        assert!(r.summary().starts_with("libmodel.so up to date: 2 sources, 0 compiled, 2 cached"), "{}", r.summary());

        // One changed source: only it recompiles, its old object goes, the library is relinked.
        std::fs::write(out.join("k001_b.cu"), "#include \"common.cuh\"\nb2\n").unwrap();
        let r = build(&out, &srcs, &hdrs, &Fake, &opts, "libmodel.so").unwrap();
        assert_eq!((r.compiled, r.cached, r.linked), (1, 1, true));
        assert_eq!(std::fs::read_to_string(out.join("libmodel.so")).unwrap(), "a1\n#include \"common.cuh\"\nb2\n");
        let objs = objects(&out.join("obj"));
        assert_eq!(objs.len(), 2, "{objs:?}");
        assert!(objs[0].starts_with("k000_a-") && objs[1].starts_with("k001_b-"), "{objs:?}");

        // A header change recompiles the sources that include it (only b); a missing library is
        // relinked.
        std::fs::write(out.join("common.cuh"), "h2\n").unwrap();
        let r = build(&out, &srcs, &hdrs, &Fake, &opts, "libmodel.so").unwrap();
        assert_eq!((r.compiled, r.cached), (1, 1));
        std::fs::remove_file(out.join("libmodel.so")).unwrap();
        let r = build(&out, &srcs, &hdrs, &Fake, &opts, "libmodel.so").unwrap();
        assert_eq!((r.compiled, r.linked), (0, true));
        assert!(std::fs::read_to_string(out.join(LOG_NAME)).unwrap().contains("== k000_a.cu: cached"));
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn shared_cache_keeps_other_versions() {
        let out = tempdir("shared");
        let cache = out.join("shared-cache");
        std::fs::write(out.join("k.cu"), "v1\n").unwrap();
        let opts = BuildOptions { jobs: Some(1), cache_dir: Some(cache.clone()), ..Default::default() };
        build(&out, &[PathBuf::from("k.cu")], &[], &Fake, &opts, "libm.so").unwrap();
        std::fs::write(out.join("k.cu"), "v2\n").unwrap();
        build(&out, &[PathBuf::from("k.cu")], &[], &Fake, &opts, "libm.so").unwrap();
        assert_eq!(objects(&cache).len(), 2);
        assert!(!out.join("obj").exists());
        std::fs::remove_dir_all(&out).ok();
    }

    /// Like [`Fake`], but each compile takes a while and is counted (a line in `count`), so
    /// builds overlap and the test sees how often each source was compiled.
    struct SlowCounting {
        count: PathBuf,
    }

    impl Compiler for SlowCounting {
        fn name(&self) -> &str {
            "slow"
        }
        fn fingerprint(&self) -> String {
            "slow 1".into()
        }
        fn compile_command(&self, src: &Path, obj: &Path, _include_dir: &Path) -> Command {
            let mut c = Command::new("sh");
            c.args(["-c", r#"echo "$1" >> "$3"; sleep 0.4; cp "$1" "$2""#]);
            c.arg("sh").arg(src).arg(obj).arg(&self.count);
            c
        }
        fn link_command(&self, objs: &[PathBuf], lib: &Path) -> Command {
            Fake.link_command(objs, lib)
        }
    }

    #[test]
    fn concurrent_builds_sharing_a_cache_compile_each_source_once() {
        let root = tempdir("concurrent");
        let cache = root.join("shared-cache");
        let compiler = SlowCounting { count: root.join("count") };
        let srcs: Vec<PathBuf> = ["k0.cu", "k1.cu", "k2.cu"].iter().map(PathBuf::from).collect();
        let outs: Vec<PathBuf> = (0..3).map(|b| root.join(format!("out{b}"))).collect();
        for out in &outs {
            std::fs::create_dir_all(out).unwrap();
            for (i, s) in srcs.iter().enumerate() {
                std::fs::write(out.join(s), format!("source {i}\n")).unwrap();
            }
        }
        let opts = BuildOptions { jobs: Some(2), cache_dir: Some(cache.clone()), ..Default::default() };
        let reports: Vec<BuildReport> = std::thread::scope(|s| {
            let handles: Vec<_> = outs
                .iter()
                .map(|out| s.spawn(|| build(out, &srcs, &[], &compiler, &opts, "libm.so").unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let count = std::fs::read_to_string(root.join("count")).unwrap();
        assert_eq!(count.lines().count(), 3, "every source compiled once among the three builds:\n{count}");
        assert_eq!(reports.iter().map(|r| r.compiled).sum::<usize>(), 3);
        for (out, r) in outs.iter().zip(&reports) {
            assert_eq!(r.compiled + r.cached, 3);
            assert_eq!(std::fs::read_to_string(out.join("libm.so")).unwrap(), "source 0\nsource 1\nsource 2\n");
        }
        assert_eq!(objects(&cache).len(), 3, "{:?}", objects(&cache));
        // Nothing is left in the work folder.
        assert_eq!(std::fs::read_dir(cache.join(WORK_DIR)).unwrap().count(), 0);
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn leftovers_of_killed_builds_are_removed() {
        let out = tempdir("leftovers");
        let cache = out.join("obj");
        std::fs::create_dir_all(cache.join(WORK_DIR).join("k-0123456789abcdef.o")).unwrap();
        std::fs::write(cache.join(WORK_DIR).join("k-0123456789abcdef.o").join("k-0123456789abcdef.o"), "half").unwrap();
        // A process that has exited: its pid names no process any more.
        let mut child = Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = [format!("k-0123456789abcdef.o.tmp{dead}.o"), format!("j-0123456789abcdef.o.tmp{dead}-3.o")];
        let alive = format!("i-0123456789abcdef.o.tmp{}-0.o", std::process::id());
        for n in stale.iter().chain([&alive]) {
            std::fs::write(cache.join(n), "half").unwrap();
        }
        // A compile folder whose lock is held belongs to a build that is running: it stays.
        std::fs::create_dir_all(cache.join(WORK_DIR).join("m-ab23456789abcdef.o")).unwrap();
        let held = lock::lock(&lock_of_hash(&cache, "ab")).unwrap();
        std::fs::write(out.join("k.cu"), "k\n").unwrap();
        build(&out, &[PathBuf::from("k.cu")], &[], &Fake, &BuildOptions::default(), "libm.so").unwrap();
        let left = objects(&cache);
        assert!(left.iter().all(|n| !stale.contains(n)), "{left:?}");
        assert!(left.contains(&alive), "a running process's temporary object stays: {left:?}");
        let work: Vec<String> = std::fs::read_dir(cache.join(WORK_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(work, ["m-ab23456789abcdef.o"]);
        assert!(std::fs::read_to_string(out.join(LOG_NAME)).unwrap().contains("left by a build that was killed"));
        drop(held);
        assert_eq!(temp_object_pid("a-1.o.tmp12.o", "o"), Some(12));
        assert_eq!(temp_object_pid("a-1.o.tmp12-7.o", "o"), Some(12));
        assert_eq!(temp_object_pid("a-1.o.tmpx.o", "o"), None);
        assert_eq!(temp_object_pid("a-1.o", "o"), None);
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn compiles_run_in_the_output_folder_on_relative_paths() {
        // The compiler sees the same command line wherever OUT is, so the object embeds no
        // path of OUT (`__FILE__`, anonymous-namespace names).
        struct Echo;
        impl Compiler for Echo {
            fn name(&self) -> &str {
                "echo"
            }
            fn fingerprint(&self) -> String {
                "echo".into()
            }
            fn compile_command(&self, src: &Path, obj: &Path, include: &Path) -> Command {
                let mut c = Command::new("sh");
                c.args(["-c", r#"test -f "$1" && printf '%s %s %s\n' "$1" "$(basename "$2")" "$3" > "$2""#]);
                c.arg("sh").arg(src).arg(obj).arg(include);
                c
            }
            fn link_command(&self, objs: &[PathBuf], lib: &Path) -> Command {
                Fake.link_command(objs, lib)
            }
        }
        let root = tempdir("relative");
        let libs: Vec<String> = ["a", "b/deeper"]
            .iter()
            .map(|d| {
                let out = root.join(d);
                std::fs::create_dir_all(out.join("sub")).unwrap();
                std::fs::write(out.join("sub/k.cu"), "k\n").unwrap();
                build(&out, &[PathBuf::from("sub/k.cu")], &[], &Echo, &BuildOptions::default(), "libm.so").unwrap();
                std::fs::read_to_string(out.join("libm.so")).unwrap()
            })
            .collect();
        assert!(libs[0].starts_with("sub/k.cu sub__k-") && libs[0].ends_with(".o .\n"), "{}", libs[0]);
        assert_eq!(libs[0], libs[1]);
        std::fs::remove_dir_all(&root).ok();
    }

    #[test]
    fn seed_caches_give_their_objects_without_compiling() {
        // A profiler build compiled i.cu (same name, same bytes) into its own cache.
        let prof = tempdir("seed-profiler");
        std::fs::write(prof.join("i.cu"), "instance\n").unwrap();
        build(&prof, &[PathBuf::from("i.cu")], &[], &Fake, &BuildOptions::default(), "libp.so").unwrap();
        let out = tempdir("seed-model");
        std::fs::write(out.join("i.cu"), "instance\n").unwrap();
        std::fs::write(out.join("k.cu"), "kernel\n").unwrap();
        let opts = BuildOptions { seed_caches: vec![prof.join("obj"), out.join("missing")], ..Default::default() };
        let r = build(&out, &[PathBuf::from("i.cu"), PathBuf::from("k.cu")], &[], &Fake, &opts, "libm.so").unwrap();
        assert_eq!((r.compiled, r.cached), (1, 1));
        assert_eq!(std::fs::read_to_string(out.join("libm.so")).unwrap(), "instance\nkernel\n");
        assert_eq!(objects(&out.join("obj")).len(), 2, "the seeded object is copied into the cache");
        // Other bytes under the same name: the seed's object is not it.
        std::fs::write(out.join("i.cu"), "instance v2\n").unwrap();
        let r = build(&out, &[PathBuf::from("i.cu"), PathBuf::from("k.cu")], &[], &Fake, &opts, "libm.so").unwrap();
        assert_eq!((r.compiled, r.cached), (1, 1));
        std::fs::remove_dir_all(&prof).ok();
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn progress_lines_name_each_finished_source() {
        let out = tempdir("lines");
        std::fs::write(out.join("k0.cu"), "a\n").unwrap();
        std::fs::write(out.join("k1.cu"), "FAIL\n").unwrap();
        let srcs: Vec<PathBuf> = ["k0.cu", "k1.cu"].iter().map(PathBuf::from).collect();
        let units = plan(&out, &srcs, &[], "fake 1", &out.join("obj"), &[], "o").unwrap();
        std::fs::create_dir_all(out.join("obj")).unwrap();
        let lines = Mutex::new(Vec::new());
        let collect = |l: &str| lines.lock().unwrap().push(l.to_string());
        let outcomes = compile_all(&units, &[0, 1], &Fake, &out, &out.join("obj"), 1, Progress::Lines(&collect));
        assert_eq!(outcomes.len(), 2);
        let lines = lines.into_inner().unwrap();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert_eq!(lines[0], "compiling 2 sources with fake (1 jobs)");
        assert!(lines[1].starts_with("compiled 1/2 k0.cu (") && lines[1].ends_with(" s elapsed)"), "{lines:?}");
        assert!(lines[2].starts_with("FAILED 2/2 k1.cu ("), "{lines:?}");
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn failures_name_the_file_quote_the_output_and_stop_scheduling() {
        let out = tempdir("fail");
        std::fs::write(out.join("k0.cu"), "FAIL\n").unwrap();
        std::fs::write(out.join("k1.cu"), "ok\n").unwrap();
        std::fs::write(out.join("k2.cu"), "ok\n").unwrap();
        let srcs: Vec<PathBuf> = ["k0.cu", "k1.cu", "k2.cu"].iter().map(PathBuf::from).collect();
        let opts = BuildOptions { jobs: Some(1), ..Default::default() };
        let e = build(&out, &srcs, &[], &Fake, &opts, "libmodel.so").unwrap_err().to_string();
        assert!(e.contains("compiling k0.cu with fake failed (exit status: 3)"), "{e}");
        assert!(e.contains("k0.cu(1): error: FAIL found"), "{e}");
        assert!(e.contains("2 source(s) not compiled: k1.cu, k2.cu"), "{e}");
        assert!(e.contains("build.log"), "{e}");
        let log = std::fs::read_to_string(out.join(LOG_NAME)).unwrap();
        assert!(log.contains("error: FAIL found") && log.contains("$ sh -c"), "{log}");
        assert!(!out.join("libmodel.so").exists());
        // No object (not even a partial one) was left for the failed source.
        assert!(objects(&out.join("obj")).is_empty());
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn bad_inputs_are_errors() {
        let out = tempdir("bad");
        std::fs::write(out.join("a.cu"), "x").unwrap();
        std::fs::create_dir_all(out.join("sub")).unwrap();
        std::fs::write(out.join("sub/a.cu"), "x").unwrap();
        let opts = BuildOptions::default();
        let err = |srcs: &[&str], lib: &str| {
            let srcs: Vec<PathBuf> = srcs.iter().map(PathBuf::from).collect();
            build(&out, &srcs, &[], &Fake, &opts, lib).unwrap_err().to_string()
        };
        assert!(err(&[], "libm.so").contains("no sources"));
        assert!(err(&["a.cu"], "../libm.so").contains("not a valid library file name"));
        assert!(err(&["missing.cu"], "libm.so").contains("cannot read source"));
        assert!(err(&["../a.cu"], "libm.so").contains("must be a file inside the output directory"));
        // Same stem in different folders is fine; the same object name twice is not.
        let srcs = vec![PathBuf::from("a.cu"), PathBuf::from("sub/a.cu")];
        assert_eq!(build(&out, &srcs, &[], &Fake, &opts, "libm.so").unwrap().compiled, 2);
        assert!(err(&["a.cu", "./a.cu"], "libm.so").contains("would share the object name 'a'"));
        std::fs::remove_dir_all(&out).ok();
    }

    #[test]
    fn helpers() {
        assert_eq!(parse_mem_available("MemTotal: 5 kB\nMemAvailable:   2048 kB\n"), Some(2048 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert!(default_jobs() >= 1);
        let text: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        let t = tail(&text, 40);
        assert!(t.starts_with("[… 10 earlier line(s)]\nline 11\n") && t.ends_with("line 50"), "{t}");
        assert_eq!(tail("", 40), "(no output)");
        let mut c = Command::new("nvcc");
        c.args(["-I/a b", "x'y", "-O3"]);
        assert_eq!(render_command(&c), r#"nvcc '-I/a b' 'x'\''y' -O3"#);
    }
}
