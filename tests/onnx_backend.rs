//! Runs the ONNX backend test data shipped in the `onnx` wheel through the importer and the CPU
//! reference executor, and compares with the expected outputs stored beside each model.
//!
//! Which cases run is decided by `tests/onnx_backend.manifest`: one line per case directory of
//! `pytorch-converted/`, `pytorch-operator/`, `simple/` and per `light/light_*.onnx` model, either
//! `run <case>` or `skip <case>  # <specific reason>`. The manifest must list exactly the cases on
//! disk, so new wheel versions (new cases) and stale lines are both caught.
//!
//! The data directory is `$ONNX_BACKEND_DATA`, else the project's `.venv` (created by
//! `scripts/setup-python.sh`). A missing data directory is a failure, never a silent pass.
//!
//! Knobs: `ONNX_BACKEND_FILTER=Conv` runs only cases whose name contains the string;
//! `ONNX_BACKEND_RECHECK_SKIPS=1` also runs the skipped cases and lists those that now pass.
//!
//! Tolerances: the backend runner's own, rtol 1e-3 / atol 1e-7 (rtol 2e-3 for light_densenet121,
//! as in `onnx/backend/test/case/model/__init__.py`), although the executor computes every float
//! op in f32 (the float64 cases included) in another summation order than numpy/PyTorch. A looser
//! atol such as 1e-4 would absorb that rounding noise, but every case that runs passes at 1e-7,
//! and 1e-4 would make the light_* checks nearly vacuous (their outputs are softmax probabilities
//! of about 1e-3). `ONNX_BACKEND_RTOL` / `ONNX_BACKEND_ATOL` override them to investigate; relax
//! the constants only for a specific, understood cause.
//! Integer and bool outputs must match exactly.

use onnx2ait::ir::{Graph, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const RTOL: f64 = 1e-3;
const ATOL: f64 = 1e-7;
/// Cases the runner itself checks with a larger rtol.
const RTOL_OVERRIDES: [(&str, f64); 1] = [("light/light_densenet121", 2e-3)];

/// Tolerances, overridable with `ONNX_BACKEND_RTOL` / `ONNX_BACKEND_ATOL` to investigate precision.
fn tolerances(case: &str) -> (f64, f64) {
    let get = |var: &str, default: f64| {
        std::env::var(var).ok().map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{var}='{v}' is not a number")))
    };
    let rtol = RTOL_OVERRIDES.iter().find(|(c, _)| *c == case).map_or(RTOL, |(_, r)| *r);
    (get("ONNX_BACKEND_RTOL", rtol), get("ONNX_BACKEND_ATOL", ATOL))
}

/// Sub-directories whose every entry is a case directory (`model.onnx` + `test_data_set_*`).
const CASE_DIRS: [&str; 3] = ["pytorch-converted", "pytorch-operator", "simple"];

const MANIFEST: &str = "tests/onnx_backend.manifest";

/// Reference-executor stack: whole graphs run on one thread; give it room for deep models.
const CASE_STACK_BYTES: usize = 64 << 20;

fn manifest_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(MANIFEST)
}

/// Finds the backend data directory or explains how to get it.
fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("ONNX_BACKEND_DATA") {
        let d = PathBuf::from(d);
        assert!(
            d.join("light").is_dir(),
            "ONNX_BACKEND_DATA={} has no light/ sub-directory: not the onnx backend test data",
            d.display()
        );
        return d;
    }
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/lib");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&lib)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path().join("site-packages/onnx/backend/test/data"))
                .filter(|p| p.join("light").is_dir())
                .collect()
        })
        .unwrap_or_default();
    // Deterministic choice when several Python versions are present.
    found.sort();
    found.pop().unwrap_or_else(|| {
        panic!(
            "ONNX backend test data not found: set ONNX_BACKEND_DATA to onnx's backend/test/data directory, \
             or run scripts/setup-python.sh to create {}/.venv with the pinned onnx wheel",
            env!("CARGO_MANIFEST_DIR")
        )
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Action {
    Run,
    Skip(String),
}

/// Parses the manifest: `run <case>` / `skip <case>  # reason`; blank lines and `#` comments allowed.
fn read_manifest() -> BTreeMap<String, Action> {
    let path = manifest_path();
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut cases = BTreeMap::new();
    let mut errors = Vec::new();
    for (lineno, line) in text.lines().enumerate() {
        let lineno = lineno + 1;
        let (body, comment) = match line.split_once('#') {
            Some((b, c)) => (b.trim(), Some(c.trim())),
            None => (line.trim(), None),
        };
        if body.is_empty() {
            continue;
        }
        let mut words = body.split_whitespace();
        let (verb, case, extra) = (words.next(), words.next(), words.next());
        let action = match (verb, case, extra) {
            (Some("run"), Some(_), None) => Action::Run,
            (Some("skip"), Some(_), None) => match comment {
                Some(reason) if !reason.is_empty() => Action::Skip(reason.to_string()),
                _ => {
                    errors.push(format!("{MANIFEST}:{lineno}: 'skip' needs a reason after '#'"));
                    continue;
                }
            },
            _ => {
                errors.push(format!(
                    "{MANIFEST}:{lineno}: expected 'run <case>' or 'skip <case>  # reason', got '{line}'"
                ));
                continue;
            }
        };
        let case = case.unwrap_or_default().to_string();
        if cases.insert(case.clone(), action).is_some() {
            errors.push(format!("{MANIFEST}:{lineno}: case '{case}' listed twice"));
        }
    }
    assert!(errors.is_empty(), "malformed manifest:\n{}", errors.join("\n"));
    cases
}

/// Every case on disk, as `<subdir>/<case>` (light models as `light/light_<name>`).
fn cases_on_disk(data: &Path) -> BTreeSet<String> {
    let mut cases = BTreeSet::new();
    for sub in CASE_DIRS {
        let dir = data.join(sub);
        let rd = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
        for e in rd.filter_map(|e| e.ok()) {
            if e.path().join("model.onnx").is_file() {
                cases.insert(format!("{sub}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    let light = data.join("light");
    let rd = std::fs::read_dir(&light).unwrap_or_else(|e| panic!("cannot list {}: {e}", light.display()));
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".onnx") {
            if stem.starts_with("light_") {
                cases.insert(format!("light/{stem}"));
            }
        }
    }
    cases
}

#[test]
fn manifest_lists_exactly_the_cases_on_disk() {
    let data = data_dir();
    let on_disk = cases_on_disk(&data);
    let manifest = read_manifest();
    let listed: BTreeSet<String> = manifest.keys().cloned().collect();
    let missing: Vec<&String> = on_disk.difference(&listed).collect();
    let stale: Vec<&String> = listed.difference(&on_disk).collect();
    let mut msg = String::new();
    if !missing.is_empty() {
        let _ = writeln!(msg, "cases in {} missing from {MANIFEST} (add a 'run' or 'skip' line):", data.display());
        for c in &missing {
            let _ = writeln!(msg, "  {c}");
        }
    }
    if !stale.is_empty() {
        let _ = writeln!(msg, "{MANIFEST} lines naming no case in {}:", data.display());
        for c in &stale {
            let _ = writeln!(msg, "  {c}");
        }
    }
    assert!(msg.is_empty(), "{msg}");
}

/// One set of named inputs and expected outputs.
struct DataSet {
    name: String,
    inputs: Vec<(String, Tensor)>,
    outputs: Vec<(String, Tensor)>,
}

fn read_pb(path: &Path) -> Result<(String, Tensor), String> {
    onnx2ait::onnx::read_tensor_file(path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// `input_0.pb, input_1.pb, …` (or `output_*`) of one data set, in numeric order.
fn numbered_files(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<(usize, PathBuf)> = Vec::new();
    let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
    for e in rd.filter_map(|e| e.ok()) {
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(k) = name.strip_prefix(prefix).and_then(|r| r.strip_suffix(".pb")).and_then(|k| k.parse().ok()) {
            files.push((k, e.path()));
        }
    }
    files.sort();
    if files.iter().enumerate().any(|(i, (k, _))| i != *k) {
        return Err(format!("{}: {prefix}*.pb files are not numbered 0..n", dir.display()));
    }
    Ok(files.into_iter().map(|(_, p)| p).collect())
}

/// The graph inputs the caller feeds (initializers listed as inputs by old exporters excluded),
/// in declaration order, which is the order of `input_K.pb`.
fn fed_inputs(g: &Graph) -> Vec<usize> {
    g.inputs.iter().copied().filter(|&i| g.values[i].konst.is_none()).collect()
}

/// Data sets of a case directory: `test_data_set_*/{input,output}_K.pb`.
fn case_data_sets(dir: &Path) -> Result<Vec<DataSet>, String> {
    let mut sets: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("test_data_set_"))
        .map(|e| e.path())
        .collect();
    sets.sort();
    if sets.is_empty() {
        return Err(format!("{}: no test_data_set_* directory", dir.display()));
    }
    sets.iter()
        .map(|s| {
            let inputs = numbered_files(s, "input_")?.iter().map(|p| read_pb(p)).collect::<Result<_, _>>()?;
            let outputs = numbered_files(s, "output_")?.iter().map(|p| read_pb(p)).collect::<Result<_, _>>()?;
            Ok(DataSet { name: s.file_name().unwrap_or_default().to_string_lossy().into_owned(), inputs, outputs })
        })
        .collect()
}

/// The input onnx's backend runner feeds the `light_*` models (see `generate_dummy_data` in
/// `onnx/backend/test/runner/__init__.py`, `random=False`): `arange(n).reshape(shape) / n` as
/// float32, with every dim that has no value taken as 1. Their expected output is
/// `light_X_output_0.pb` beside the model.
fn light_data_set(g: &Graph, model: &Path) -> Result<DataSet, String> {
    let mut inputs = Vec::new();
    for id in fed_inputs(g) {
        let v = &g.values[id];
        let ty = g.ty(id);
        if ty.dtype != onnx2ait::ir::DType::F32 {
            return Err(format!(
                "light model input '{}' is {}: the onnx runner only generates float32 inputs",
                v.name, ty.dtype
            ));
        }
        let shape: Vec<usize> = ty.shape.iter().map(|d| d.as_known().map_or(1, |k| k as usize)).collect();
        let n: usize = shape.iter().product();
        // numpy computes arange(n) / n in float64, then rounds to float32.
        let values: Vec<f32> = (0..n).map(|i| (i as f64 / n as f64) as f32).collect();
        inputs.push((v.name.clone(), Tensor::from_f32s(&shape, values)));
    }
    let stem = model.with_extension("");
    let mut outputs = Vec::new();
    for k in 0..g.outputs.len() {
        let p = PathBuf::from(format!("{}_output_{k}.pb", stem.display()));
        outputs.push(read_pb(&p)?);
    }
    Ok(DataSet { name: "light".to_string(), inputs, outputs })
}

/// Compares one output; `Err` says how it differs.
fn compare(got: &Tensor, want: &Tensor, (rtol, atol): (f64, f64)) -> Result<(), String> {
    if got.dtype() != want.dtype() {
        return Err(format!("dtype {} but expected {}", got.dtype(), want.dtype()));
    }
    if got.shape() != want.shape() {
        return Err(format!("shape {:?} but expected {:?}", got.shape(), want.shape()));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !want.dtype().is_float();
    let mut bad = 0usize;
    let mut first: Option<(usize, f64, f64)> = None;
    let mut max_abs = 0f64;
    for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
        let ok = if exact {
            a == b
        } else if a.is_nan() || b.is_nan() {
            a.is_nan() && b.is_nan()
        } else if a.is_infinite() || b.is_infinite() {
            a == b
        } else {
            max_abs = max_abs.max((a - b).abs());
            (a - b).abs() <= atol + rtol * b.abs()
        };
        if !ok {
            bad += 1;
            first.get_or_insert((i, a, b));
        }
    }
    match first {
        None => Ok(()),
        Some((i, a, b)) => Err(format!(
            "{bad} of {} elements differ (first at flat index {i}: got {a}, expected {b}; max abs diff {max_abs:.3e}; rtol {rtol:e}, atol {atol:e})",
            g.len()
        )),
    }
}

/// Loads, runs and checks one case. `Err` carries the reason it failed.
fn run_case(data: &Path, case: &str) -> Result<(), String> {
    let (model_path, light) = match case.strip_prefix("light/") {
        Some(stem) => (data.join("light").join(format!("{stem}.onnx")), true),
        None => (data.join(case).join("model.onnx"), false),
    };
    let g = onnx2ait::onnx::load_model(&model_path).map_err(|e| format!("load: {e}"))?;
    let sets = if light { vec![light_data_set(&g, &model_path)?] } else { case_data_sets(&data.join(case))? };
    let fed = fed_inputs(&g);
    for set in sets {
        if set.inputs.len() != fed.len() {
            return Err(format!(
                "{}: {} input files but the graph has {} inputs",
                set.name,
                set.inputs.len(),
                fed.len()
            ));
        }
        // The backend runner feeds inputs by position; the pytorch-* files carry no names.
        let feeds: BTreeMap<String, Tensor> =
            fed.iter().zip(set.inputs).map(|(&id, (_, t))| (g.values[id].name.clone(), t)).collect();
        let outs = onnx2ait::reference::run(&g, &feeds).map_err(|e| format!("{}: run: {e}", set.name))?;
        if outs.len() != set.outputs.len() {
            return Err(format!("{}: graph has {} outputs, {} expected", set.name, outs.len(), set.outputs.len()));
        }
        for (k, ((name, got), (_, want))) in outs.iter().zip(&set.outputs).enumerate() {
            compare(got, want, tolerances(case)).map_err(|e| format!("{}: output {k} '{name}': {e}", set.name))?;
        }
    }
    Ok(())
}

/// Panic messages of case threads, keyed by thread name, so a panicking op is reported as that
/// case's failure (with its location) instead of aborting the whole run.
static PANICS: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
const CASE_THREAD_PREFIX: &str = "onnx-backend:";

fn install_panic_capture() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().unwrap_or_default().to_string();
        if name.starts_with(CASE_THREAD_PREFIX) {
            let msg = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            if let Ok(mut p) = PANICS.lock() {
                p.insert(name, format!("panicked{at}: {msg}"));
            }
        } else {
            default(info);
        }
    }));
}

/// Runs a case on its own thread (fresh, large stack; panics contained).
fn run_case_isolated(data: &Path, case: &str) -> Result<(), String> {
    let thread_name = format!("{CASE_THREAD_PREFIX}{case}");
    let (data, case_owned) = (data.to_path_buf(), case.to_string());
    let handle = std::thread::Builder::new()
        .name(thread_name.clone())
        .stack_size(CASE_STACK_BYTES)
        .spawn(move || run_case(&data, &case_owned))
        .map_err(|e| format!("cannot spawn case thread: {e}"))?;
    match handle.join() {
        Ok(r) => r,
        Err(_) => {
            Err(PANICS.lock().ok().and_then(|mut p| p.remove(&thread_name)).unwrap_or_else(|| "panicked".to_string()))
        }
    }
}

#[test]
fn onnx_backend_cases() {
    let data = data_dir();
    let manifest = read_manifest();
    let on_disk = cases_on_disk(&data);
    install_panic_capture();
    // `ONNX_BACKEND_FILTER=Conv` runs only the cases whose name contains the string.
    let filter = std::env::var("ONNX_BACKEND_FILTER").ok();
    // `ONNX_BACKEND_RECHECK_SKIPS=1` also runs the skipped cases and lists those that now pass.
    let recheck_skips = std::env::var_os("ONNX_BACKEND_RECHECK_SKIPS").is_some();
    let mut stale_skips: Vec<String> = Vec::new();
    let (mut passed, mut skipped) = (0usize, 0usize);
    let mut failures: Vec<(String, String)> = Vec::new();
    let mut slow: Vec<(Duration, String)> = Vec::new();
    let start = Instant::now();
    for (case, action) in &manifest {
        if filter.as_deref().is_some_and(|f| !case.contains(f)) {
            continue;
        }
        if !on_disk.contains(case) {
            // Reported by `manifest_lists_exactly_the_cases_on_disk`.
            continue;
        }
        match action {
            Action::Skip(reason) => {
                skipped += 1;
                if recheck_skips && run_case_isolated(&data, case).is_ok() {
                    stale_skips.push(format!("{case}  # was skipped: {reason}"));
                }
            }
            Action::Run => {
                let t = Instant::now();
                match run_case_isolated(&data, case) {
                    Ok(()) => passed += 1,
                    Err(e) => failures.push((case.clone(), e)),
                }
                slow.push((t.elapsed(), case.clone()));
            }
        }
    }
    let total = passed + failures.len() + skipped;
    let mut report = format!(
        "onnx backend: {passed} passed, {} failed, {skipped} skipped (of {total}) in {:.1} s [{}]\n",
        failures.len(),
        start.elapsed().as_secs_f64(),
        data.display()
    );
    // Errors name the model file; inside the data directory the case name already says which.
    let prefix = format!("{}/", data.display());
    for (case, err) in &failures {
        let err = err.replace(&prefix, "").replace('\n', "\n      ");
        let _ = writeln!(report, "FAIL {case}: {err}");
    }
    for line in &stale_skips {
        let _ = writeln!(report, "PASSES BUT SKIPPED (change to 'run'): {line}");
    }
    slow.sort_by_key(|(d, _)| std::cmp::Reverse(*d));
    let _ = writeln!(
        report,
        "slowest: {}",
        slow.iter().take(5).map(|(d, c)| format!("{c} {:.2} s", d.as_secs_f64())).collect::<Vec<_>>().join(", ")
    );
    println!("{report}");
    assert!(failures.is_empty(), "{} onnx backend case(s) failed (report above)", failures.len());
}
