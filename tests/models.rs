//! Every bundled model (`onnx_models/*.onnx`, found by listing the folder) and the generated
//! ResNet-50 (`onnx_models/generated/resnet50.onnx`), run by the CPU reference executor and by
//! ONNX Runtime on the same seeded random inputs, must agree.
//!
//! Tolerance: `onnx2ait validate`'s defaults. For float32 outputs the error must stay within
//! 1e-4 of the output's largest magnitude (plus 1e-5 absolute); float16 outputs get 5e-3 / 1e-3
//! (a few float16 ulps: the reference computes in f32 and rounds, ONNX Runtime may compute in
//! f16), bfloat16 3e-2 / 1e-2; integer and bool outputs must match exactly.
//!
//! The tables are written straight to stderr so they show even when the test passes.
//! Run with `cargo test --release --test models` (scripts/test.sh does): a debug build runs
//! ResNet-50 through unoptimised kernels.

use onnx2ait::validate::compare::fmt_num;
use onnx2ait::validate::{validate, Options, Report};
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("onnx_models")
}

/// `onnx_models/*.onnx`, sorted by name.
fn bundled_models() -> Vec<PathBuf> {
    let dir = models_dir();
    let mut v: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "onnx"))
            .collect(),
        Err(e) => panic!("cannot list {}: {e}", dir.display()),
    };
    v.sort();
    v
}

struct Outcome {
    model: String,
    seconds: f64,
    result: Result<Report, String>,
}

impl Outcome {
    fn passed(&self) -> bool {
        matches!(&self.result, Ok(r) if r.passed())
    }

    fn why(&self) -> String {
        match &self.result {
            Ok(r) if r.passed() => String::new(),
            Ok(r) => {
                r.failures().iter().map(|(o, e, why)| format!("'{o}' ({e}): {why}")).collect::<Vec<_>>().join("; ")
            }
            Err(e) => e.clone(),
        }
    }
}

/// Validates one model; an error or a panic becomes a failed outcome, not an aborted test.
fn check(path: &Path) -> Outcome {
    let start = Instant::now();
    let result = catch_unwind(AssertUnwindSafe(|| validate(path, &Options::default())));
    let result = match result {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("error: {e}")),
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown payload".into());
            Err(format!("PANIC: {msg}"))
        }
    };
    let model = path.strip_prefix(models_dir()).unwrap_or(path).display().to_string();
    Outcome { model, seconds: start.elapsed().as_secs_f64(), result }
}

/// Writes past libtest's output capture, so the table shows for passing runs too.
fn show(text: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(text.as_bytes());
    let _ = err.flush();
}

fn table(outcomes: &[Outcome]) -> String {
    let header = ["model", "outputs", "worst rel_to_max", "worst max_abs", "top1", "time", "status"];
    let mut rows: Vec<Vec<String>> = Vec::new();
    for o in outcomes {
        let (outputs, rel, abs, top1) = match &o.result {
            Ok(r) => {
                let cmps: Vec<_> = r.outputs.iter().flat_map(|out| out.results.iter().map(|x| &x.comparison)).collect();
                let worst = |f: fn(&onnx2ait::validate::compare::Comparison) -> f64| {
                    cmps.iter()
                        .map(|c| f(c))
                        .fold(0.0f64, |m, v| if v.is_nan() || m.is_nan() { f64::NAN } else { m.max(v) })
                };
                let (agree, rows) =
                    cmps.iter().filter_map(|c| c.top1).fold((0, 0), |(a, n), t| (a + t.agree, n + t.rows));
                (
                    r.outputs.len().to_string(),
                    fmt_num(worst(|c| c.rel_to_max)),
                    fmt_num(worst(|c| c.max_abs)),
                    if rows > 0 { format!("{agree}/{rows}") } else { "-".into() },
                )
            }
            Err(_) => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let status =
            if o.passed() { "pass".to_string() } else { format!("FAIL: {}", o.why().lines().next().unwrap_or("")) };
        rows.push(vec![o.model.clone(), outputs, rel, abs, top1, format!("{:.2}s", o.seconds), status]);
    }
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells.iter().enumerate().map(|(i, c)| format!("{c:<w$}", w = widths[i])).collect();
        parts.join("  ").trim_end().to_string() + "\n"
    };
    let mut s = line(header.iter().map(|h| h.to_string()).collect());
    s.push_str(&"-".repeat(widths.iter().sum::<usize>() + 2 * (widths.len() - 1)));
    s.push('\n');
    for r in rows {
        s.push_str(&line(r));
    }
    s
}

fn failure_list(outcomes: &[Outcome]) -> String {
    outcomes
        .iter()
        .filter(|o| !o.passed())
        .map(|o| format!("  - {}: {}", o.model, o.why()))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn bundled_models_match_onnxruntime() {
    let models = bundled_models();
    assert!(
        !models.is_empty(),
        "no models in {}: run scripts/gen-models.sh (scripts/test.sh does)",
        models_dir().display()
    );
    let outcomes: Vec<Outcome> = models.iter().map(|p| check(p)).collect();
    let passed = outcomes.iter().filter(|o| o.passed()).count();
    show(&format!(
        "\nreference executor vs ONNX Runtime, bundled models ({} models, seed 0, symbolic dims 1):\n{}{passed}/{} passed\n",
        outcomes.len(),
        table(&outcomes),
        outcomes.len()
    ));
    let failed = outcomes.len() - passed;
    assert!(failed == 0, "{failed} of {} model(s) fail:\n{}", outcomes.len(), failure_list(&outcomes));
}

#[test]
fn resnet50_matches_onnxruntime() {
    let path = models_dir().join("generated").join("resnet50.onnx");
    if !path.is_file() {
        let msg = format!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !! ResNet-50 NOT TESTED: {} is missing.\n\
             !! Generate it with scripts/gen-models.sh (scripts/test.sh does this).\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
            path.display()
        );
        show(&msg);
        // CI runs scripts/test.sh, which generates the model: its absence there is a failure.
        assert!(std::env::var_os("CI").is_none(), "CI is set and {} is missing", path.display());
        return;
    }
    if cfg!(debug_assertions) {
        show("note: ResNet-50 in a debug build is slow; scripts/test.sh runs the tests with --release\n");
    }
    let outcome = check(&path);
    let detail = match &outcome.result {
        Ok(r) => format!("{r}\n"),
        Err(e) => format!("{e}\n"),
    };
    show(&format!(
        "\nreference executor vs ONNX Runtime, ResNet-50:\n{}{detail}",
        table(std::slice::from_ref(&outcome))
    ));
    assert!(outcome.passed(), "ResNet-50 fails:\n{}", failure_list(std::slice::from_ref(&outcome)));
}
