#!/usr/bin/env python3
"""The steps of scripts/gpu-check.sh that run onnx2ait: each runs commands under a time limit,
checks what they print and writes a JSON record for scripts/gpu/write_benchmarks.py.

    checks.py env      --bin B --commit-file F --command TEXT --out env.json
    checks.py compile  --bin B --model M --out-dir D --label L --timeout S --json F -- ARGS...
    checks.py validate --bin B --model M --build D --batch N --seeds 0-7 --jobs J --json F
    checks.py models   --bin B --work DIR --deadline T --json F [--compile-arg A ...] [--model-arg NAME=A ...] MODEL...
    checks.py bench    --bin B --build D --batch 1,8,64,256 --json F
    checks.py collect  --parts DIR --steps steps.tsv --out results.json

Exit status: 0 when the step's checks pass, 1 when one fails (details printed and recorded).
Standard library only, Python 3.8 or newer: it runs under the GPU machine's python3 and the
project's .venv alike. Children run in their own process group, so a time limit ends a compile
together with the nvcc processes it started.
"""
import argparse
import collections
import concurrent.futures
import datetime
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

# Exit codes of onnx2ait (src/cli/mod.rs): 2 = the model uses ops onnx2ait does not support.
EXIT_UNSUPPORTED = 2
TIMEOUT_RC = 124
BASELINE_ENGINES = {"ort", "onnxruntime"}
REFERENCE_ENGINES = {"reference"}

_live = set()
_live_lock = threading.Lock()
# Set by SIGTERM/SIGINT: no new command starts (worker threads may still be looping).
_stopping = threading.Event()


def say(msg):
    print(msg, flush=True)


def _popen_group_kwargs():
    # A new process group (not a new session: the device machine ends leftover processes of the
    # command's session when it returns, and a new session would escape that).
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"preexec_fn": os.setpgrp}


def _kill_group(proc):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=5)
            return
        except subprocess.TimeoutExpired:
            continue


def _on_signal(signum, _frame):
    _stopping.set()
    with _live_lock:
        procs = list(_live)
    for p in procs:
        _kill_group(p)
    sys.exit(128 + signum)


class Result:
    def __init__(self, rc, seconds, stdout="", stderr="", timed_out=False):
        self.rc, self.seconds, self.stdout, self.stderr, self.timed_out = rc, seconds, stdout, stderr, timed_out


def run_capture(cmd, timeout, env=None):
    """Runs cmd with stdout and stderr captured; kills its process group after `timeout` s."""
    t0 = time.time()
    if _stopping.is_set():
        return Result(143, 0.0, "", "stopped by a signal before it started")
    try:
        p = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True, errors="replace",
            **_popen_group_kwargs()
        )
    except OSError as e:
        return Result(127, 0.0, "", f"cannot run {cmd[0]}: {e}")
    with _live_lock:
        _live.add(p)
    try:
        out, err = p.communicate(timeout=max(1.0, timeout))
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_group(p)
        out, err = p.communicate()
        timed_out = True
    finally:
        with _live_lock:
            _live.discard(p)
    rc = TIMEOUT_RC if timed_out else p.returncode
    return Result(rc, time.time() - t0, out or "", err or "", timed_out)


def run_logged(cmd, timeout, log_path, echo=False, env=None, keep=60):
    """Runs cmd with stdout+stderr merged into log_path (and echoed when `echo`); returns the
    last `keep` lines as Result.stderr."""
    t0 = time.time()
    tail = collections.deque(maxlen=keep)
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    if _stopping.is_set():
        return Result(143, 0.0, "", "stopped by a signal before it started")
    with open(log_path, "w", errors="replace") as log:
        try:
            p = subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace",
                **_popen_group_kwargs()
            )
        except OSError as e:
            return Result(127, 0.0, "", f"cannot run {cmd[0]}: {e}")
        with _live_lock:
            _live.add(p)

        def pump():
            for line in p.stdout:
                log.write(line)
                tail.append(line.rstrip("\n"))
                if echo:
                    print(f"    {line.rstrip()}", flush=True)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            p.wait(timeout=max(1.0, timeout))
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(p)
            timed_out = True
        finally:
            with _live_lock:
                _live.discard(p)
        reader.join(timeout=10)
    rc = TIMEOUT_RC if timed_out else p.returncode
    return Result(rc, time.time() - t0, "", "\n".join(tail), timed_out)


def last_lines(text, n=3, limit=600):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    s = " | ".join(lines[-n:])
    return s if len(s) <= limit else "…" + s[-limit:]


def error_line(text):
    """The most telling line of a failing command's output: its last `error:` line, else its last line."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    for l in reversed(lines):
        if l.startswith("error:") or l.startswith("error["):
            return l[:400]
    return lines[-1][:400] if lines else ""


def parse_json_output(text):
    """The JSON document a `--json` command printed (tolerating lines around it), or None."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    for opener, closer in (("{", "}"), ("[", "]")):
        i, j = text.find(opener), text.rfind(closer)
        if 0 <= i < j:
            try:
                return json.loads(text[i : j + 1])
            except ValueError:
                continue
    return None


def write_json(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, allow_nan=False, default=str)
        f.write("\n")
    os.replace(tmp, path)


def finite_or_none(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def clean(obj):
    """NaN/inf become None so the record stays valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean(v) for v in obj]
    return obj


def remaining(deadline):
    return float("inf") if deadline is None else deadline - time.time()


# ---------------------------------------------------------------------------------------------
# validate reports


def top1_of(result):
    """(agree, rows) from a result's `top1` ({agree, rows}) or `top1_agree` (same, a count with
    `top1_rows`, a fraction, or a bool); None when absent."""
    t = result.get("top1")
    if t is None:
        t = result.get("top1_agree")
    if t is None:
        return None
    if isinstance(t, dict):
        a, n = t.get("agree"), t.get("rows")
        return (a, n) if isinstance(a, (int, float)) and isinstance(n, (int, float)) else None
    if isinstance(t, bool):
        return (1, 1) if t else (0, 1)
    if isinstance(t, (int, float)):
        rows = result.get("top1_rows")
        if isinstance(rows, (int, float)):
            return (t, rows)
        if 0 <= t <= 1:
            return (t, 1.0)  # a fraction: weighted as one row
    return None


def report_metrics(report):
    """Flattens a validate report into rows {output, engine, status, err, max_abs, max_rel,
    rel_to_max, top1}. `err` is the error used for the bound: rel_to_max (max |a-b| / max |ref|)
    when reported, else max_rel."""
    rows = []
    if not isinstance(report, dict):
        return rows
    for out in report.get("outputs") or []:
        results = out.get("results")
        if results is None:  # a flat per-output record
            results = [dict(out, engine=out.get("engine", "gpu"))]
        for r in results:
            rel_to_max, max_rel = finite_or_none(r.get("rel_to_max")), finite_or_none(r.get("max_rel"))
            rows.append(
                {
                    "output": out.get("name"),
                    "engine": r.get("engine", "?"),
                    "status": r.get("status"),
                    "reason": r.get("reason") or "",
                    "err": rel_to_max if "rel_to_max" in r else max_rel,
                    "max_abs": finite_or_none(r.get("max_abs")),
                    "max_rel": max_rel,
                    "rel_to_max": rel_to_max,
                    "top1": top1_of(r),
                }
            )
    return rows


def is_device_engine(name):
    return name not in BASELINE_ENGINES and name not in REFERENCE_ENGINES


def worst(values):
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def fmt(v, spec=".2e"):
    return "n/a" if v is None else format(v, spec)


# ---------------------------------------------------------------------------------------------
# env


def cmd_env(a):
    doc = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    problems = []
    r = run_capture(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"], 60
    )
    if r.rc == 0 and r.stdout.strip():
        gpus = [[x.strip() for x in line.split(",")] for line in r.stdout.strip().splitlines()]
        doc["gpu"], doc["driver"], doc["gpu_memory"] = (gpus[0] + ["?", "?", "?"])[:3]
        doc["gpu_count"] = len(gpus)
    else:
        problems.append(f"nvidia-smi failed: {error_line(r.stderr or r.stdout) or r.rc}")
    r = run_capture(["nvcc", "--version"], 60)
    doc["nvcc"] = last_lines(r.stdout, 1) if r.rc == 0 else f"not available ({error_line(r.stderr) or r.rc})"
    doc["python"] = platform.python_version()
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # Python < 3.8 has no importlib.metadata
        version, PackageNotFoundError = None, Exception
    pkgs = {}
    for name in ("torch", "torchvision", "onnx", "onnxruntime", "onnxscript", "numpy"):
        try:
            pkgs[name] = version(name) if version else "?"
        except PackageNotFoundError:
            pkgs[name] = None
    doc["packages"] = pkgs
    doc["cpus"] = os.cpu_count()
    try:
        with open(a.commit_file) as f:
            doc["commit"] = f.read().strip()
    except OSError:
        doc["commit"] = "unknown (no .gpu/COMMIT: run scripts/gpu-prepare.sh)"
    r = run_capture([a.bin, "--version"], 60)
    if r.rc == 0:
        doc["onnx2ait"] = r.stdout.strip()
    else:
        problems.append(f"{a.bin} does not run: {error_line(r.stderr or r.stdout) or r.rc}")
    doc["command"] = a.command
    doc["settings"] = {k: os.environ.get(k) for k in ("CUTLASS_DIR", "ORT_DYLIB_PATH", "ONNX2AIT_CACHE_DIR")}
    doc["problems"] = problems
    write_json(a.out, doc)
    say(f"date      {doc['date_utc']}")
    say(f"gpu       {doc.get('gpu', '?')} (driver {doc.get('driver', '?')}, {doc.get('gpu_memory', '?')})")
    say(f"nvcc      {doc['nvcc']}")
    say(f"python    {doc['python']}; " + ", ".join(f"{k} {v}" for k, v in pkgs.items()))
    say(f"commit    {doc['commit']}")
    say(f"onnx2ait  {doc.get('onnx2ait', 'not runnable')} ({a.bin})")
    for k, v in doc["settings"].items():
        say(f"{k:<19} {v}")
    for p in problems:
        say(f"error: {p}")
    return 1 if problems else 0


# ---------------------------------------------------------------------------------------------
# compile


def read_build_report(out_dir):
    try:
        with open(os.path.join(out_dir, "build_report.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def compile_model(bin_, model, out_dir, extra, timeout, echo=False, env=None):
    cmd = [bin_, "compile", model, "-o", out_dir] + list(extra)
    r = run_logged(cmd, timeout, out_dir.rstrip("/") + ".compile.log", echo=echo, env=env)
    rec = {
        "command": cmd,
        "rc": r.rc,
        "seconds": round(r.seconds, 2),
        "timed_out": r.timed_out,
        "report": read_build_report(out_dir) if r.rc == 0 else None,
        "log": out_dir.rstrip("/") + ".compile.log",
    }
    if r.rc != 0:
        rec["error"] = error_line(r.stderr)
        rec["tail"] = last_lines(r.stderr, 15, 3000)
        # The compiler's own output is in OUT/build.log; its end says which file failed and why.
        build_log = os.path.join(out_dir, "build.log")
        if os.path.isfile(build_log):
            with open(build_log, errors="replace") as f:
                rec["build_log_tail"] = "\n".join(f.read().splitlines()[-40:])
    return rec


def cmd_compile(a):
    if a.fresh:
        shutil.rmtree(a.out_dir, ignore_errors=True)
    timeout = min(a.timeout, remaining(a.deadline))
    rec = compile_model(a.bin, a.model, a.out_dir, a.args, timeout, echo=True)
    rec["label"] = a.label
    lib = os.path.join(a.out_dir, "libmodel.so")
    if rec["rc"] == 0 and not os.path.isfile(lib):
        rec["rc"], rec["error"] = 1, f"compile exited 0 but {lib} does not exist"
    write_json(a.json, rec)
    rep = rec.get("report") or {}
    if rec["rc"] == 0:
        say(
            f"compile ({a.label}): {rec['seconds']:.1f} s wall; onnx2ait reports {rep.get('seconds', '?')} s, "
            f"{rep.get('compiled', '?')} compiled, {rep.get('cached', '?')} from cache"
        )
        return 0
    what = "timed out" if rec["timed_out"] else f"exit {rec['rc']}"
    say(f"compile ({a.label}) {what} after {rec['seconds']:.1f} s: {rec.get('error', '')}")
    if rec.get("build_log_tail"):
        say(f"--- end of {os.path.join(a.out_dir, 'build.log')}:")
        say(rec["build_log_tail"])
    return 1


# ---------------------------------------------------------------------------------------------
# validate


def parse_seeds(text):
    seeds = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise argparse.ArgumentTypeError(f"bad seed list '{text}' (use 0-7 or 0,3,5)")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        seeds.extend(range(lo, hi + 1))
    return seeds


def validate_once(bin_, model, build, batch, seed, timeout, extra=()):
    cmd = [bin_, "validate", model, "--build", build]
    if batch is not None:
        cmd += ["--batch", str(batch)]
    cmd += ["--seed", str(seed), "--json"] + list(extra)
    r = run_capture(cmd, timeout)
    report = parse_json_output(r.stdout)
    return {
        "seed": seed,
        "command": cmd,
        "rc": r.rc,
        "seconds": round(r.seconds, 2),
        "timed_out": r.timed_out,
        "report": report,
        "error": "" if r.rc == 0 else (error_line(r.stderr) or error_line(r.stdout)),
    }


def summarize_runs(runs, max_err, min_top1):
    """Per-engine worst errors and pooled top-1 over runs, and the list of problems."""
    problems = []
    engines = {}
    for run in runs:
        seed = run["seed"]
        if run["timed_out"]:
            problems.append(f"seed {seed}: validate timed out after {run['seconds']:.0f} s")
            continue
        if run["report"] is None:
            problems.append(f"seed {seed}: validate exit {run['rc']} without a JSON report: {run['error']}")
            continue
        if run["rc"] != 0:
            problems.append(f"seed {seed}: validate exit {run['rc']} (out of its tolerance?) {run['error']}".rstrip())
        rows = report_metrics(run["report"])
        if not any(is_device_engine(r["engine"]) for r in rows):
            problems.append(f"seed {seed}: the report has no GPU engine result (engines: "
                            f"{sorted({r['engine'] for r in rows}) or 'none'})")
        for r in rows:
            e = engines.setdefault(
                r["engine"], {"err": [], "max_abs": [], "max_rel": [], "top1_agree": 0, "top1_rows": 0, "top1_missing": 0}
            )
            e["err"].append(r["err"])
            e["max_abs"].append(r["max_abs"])
            e["max_rel"].append(r["max_rel"])
            if r["err"] is None:
                problems.append(f"seed {seed}: {r['engine']} output '{r['output']}': no finite error reported "
                                f"({r['reason'] or r['status']})")
            elif r["err"] > max_err:
                problems.append(f"seed {seed}: {r['engine']} output '{r['output']}': rel err {r['err']:.3g} > {max_err:g}")
            if r["top1"] is None:
                e["top1_missing"] += 1
            else:
                e["top1_agree"] += r["top1"][0]
                e["top1_rows"] += r["top1"][1]
    summary = {}
    for name, e in sorted(engines.items()):
        frac = e["top1_agree"] / e["top1_rows"] if e["top1_rows"] else None
        summary[name] = {
            "worst_err": worst(e["err"]),
            "worst_max_abs": worst(e["max_abs"]),
            "worst_max_rel_elementwise": worst(e["max_rel"]),
            "top1_agree": e["top1_agree"],
            "top1_rows": e["top1_rows"],
            "top1_fraction": frac,
        }
        if is_device_engine(name):
            if e["top1_rows"] == 0:
                problems.append(f"{name}: no top-1 agreement reported (is the output [N, classes]?)")
            elif frac < min_top1:
                problems.append(f"{name}: top-1 agreement {e['top1_agree']:g}/{e['top1_rows']:g} < {min_top1:g}")
    return summary, problems


def cmd_validate(a):
    seeds = a.seeds
    results = {}
    bound = error_bound(a.max_err, a.sensitivity, a.sensitivity_factor)
    # onnx2ait validate's own exit status uses the same bound on the GPU column (its default there
    # is 1e-2); the ONNX Runtime vs reference executor comparison keeps its fp32 bound.
    extra = list(a.args)
    if bound["max_err"] > a.max_err:
        extra += ["--gpu-rtol", f"{bound['max_err']:.6g}"]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = {}
        for s in seeds:
            left = remaining(a.deadline)
            if left < 5:
                break
            futs[pool.submit(validate_once, a.bin, a.model, a.build, a.batch, s, min(a.timeout, left), extra)] = s
        for f in concurrent.futures.as_completed(futs):
            run = f.result()
            results[run["seed"]] = run
            rows = [r for r in report_metrics(run["report"]) if is_device_engine(r["engine"])]
            t1 = [r["top1"] for r in rows if r["top1"]]
            say(
                f"validate bs {a.batch} seed {run['seed']}: exit {run['rc']}"
                + ("" if not run["timed_out"] else " (timed out)")
                + (f", rel err {fmt(worst(r['err'] for r in rows))}" if rows else "")
                + (f", top-1 {sum(x[0] for x in t1):g}/{sum(x[1] for x in t1):g}" if t1 else "")
                + f" ({run['seconds']:.1f} s)"
                + (f": {run['error']}" if run["rc"] != 0 and run["error"] else "")
            )
    runs = [results[s] for s in seeds if s in results]
    not_run = [s for s in seeds if s not in results]
    summary, problems = summarize_runs(runs, bound["max_err"], a.min_top1)
    if not_run:
        problems.append(f"seeds {not_run} not run (time budget)")
    doc = {
        "batch": a.batch,
        "seeds": seeds,
        "max_err": bound["max_err"],
        "bound": bound,
        "min_top1": a.min_top1,
        "engines": summary,
        "runs": [{k: v for k, v in r.items() if k != "report"} for r in runs],
        "problems": problems,
        "passed": not problems,
    }
    write_json(a.json, clean(doc))
    if a.raw_out:
        write_json(a.raw_out, clean({"batch": a.batch, "runs": runs}))
    for name, s in summary.items():
        say(
            f"bs {a.batch} {name:>10}: worst rel err {fmt(s['worst_err'])} (max abs {fmt(s['worst_max_abs'])}, "
            f"element-wise max rel {fmt(s['worst_max_rel_elementwise'])}), "
            f"top-1 {s['top1_agree']:g}/{s['top1_rows']:g}"
        )
    for p in problems:
        say(f"FAIL: {p}")
    say(f"validate bs {a.batch}: {'pass' if not problems else 'FAILED'} ({len(runs)} of {len(seeds)} seeds run)")
    return 0 if not problems else 1


# ---------------------------------------------------------------------------------------------
# models


FAILING = {"fail", "compile failed", "timeout", "error"}


def model_name(path):
    base = os.path.basename(path)
    return base[:-5] if base.endswith(".onnx") else base


def check_model(a, path, index, total):
    name = model_name(path)
    rec = {"model": name, "path": path}
    if time.time() >= a.deadline:
        rec["status"] = "not run (time budget)"
        return rec
    out_dir = os.path.join(a.work, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    own = [arg for m, arg in a.model_arg if m == name]
    if own:
        rec["compile_extra"] = own
    extra = list(a.compile_arg) + own + ["--jobs", str(a.compile_jobs)]
    c = compile_model(a.bin, path, out_dir, extra, min(a.timeout, remaining(a.hard_deadline)))
    rec["compile_seconds"] = c["seconds"]
    rep = c.get("report") or {}
    rec["kernels_compiled"], rec["kernels_cached"] = rep.get("compiled"), rep.get("cached")
    if c["rc"] == EXIT_UNSUPPORTED:
        rec["status"], rec["note"] = "unsupported", c.get("error", "")
    elif c["timed_out"]:
        late = remaining(a.hard_deadline) <= 1
        rec["status"] = "not finished (time budget)" if late else "timeout"
        rec["note"] = f"compile stopped after {c['seconds']:.0f} s"
    elif c["rc"] != 0:
        rec["status"], rec["note"], rec["tail"] = "compile failed", c.get("error", ""), c.get("tail", "")
    else:
        v = validate_once(a.bin, path, out_dir, None, 0, min(a.timeout, remaining(a.hard_deadline)))
        rec["validate_seconds"] = v["seconds"]
        rows = report_metrics(v["report"])
        dev = [r for r in rows if is_device_engine(r["engine"])]
        rec["max_err"] = worst(r["err"] for r in (dev or rows))
        if dev:
            t1 = [r["top1"] for r in dev if r["top1"]]
            if t1:
                rec["top1"] = [sum(x[0] for x in t1), sum(x[1] for x in t1)]
        if v["timed_out"]:
            late = remaining(a.hard_deadline) <= 1
            rec["status"] = "not finished (time budget)" if late else "timeout"
            rec["note"] = f"validate stopped after {v['seconds']:.0f} s"
        elif v["rc"] == 0 and v["report"] is not None and not dev:
            rec["status"], rec["note"] = "fail", "validate reported no GPU engine result"
        elif v["rc"] == 0:
            rec["status"] = "pass"
        elif v["rc"] == EXIT_UNSUPPORTED:
            rec["status"], rec["note"] = "unsupported", v["error"]
        else:
            rec["status"] = "fail"
            bad = [f"{r['output']}: {r['reason']}" for r in rows if r["status"] not in (None, "pass") and r["reason"]]
            rec["note"] = "; ".join(bad[:3]) or v["error"]
    if shutil.disk_usage(a.work).free < 5 << 30 or not a.keep:
        shutil.rmtree(out_dir, ignore_errors=True)  # small disk: builds are not needed afterwards
    say(
        f"[{index + 1:3d}/{total}] {name}: {rec['status']}"
        + (f" (max rel err {fmt(rec.get('max_err'))})" if rec.get("max_err") is not None else "")
        + f" [compile {rec.get('compile_seconds', 0):.1f} s"
        + (f", validate {rec['validate_seconds']:.1f} s" if "validate_seconds" in rec else "")
        + "]"
        + (f" {rec['note'][:200]}" if rec.get("note") and rec["status"] != "pass" else "")
    )
    return rec


def cmd_models(a):
    os.makedirs(a.work, exist_ok=True)
    if a.hard_deadline is None:
        a.hard_deadline = a.deadline
    models = list(a.models)
    for path in models:
        if not os.path.isfile(path):
            say(f"error: {path}: no such file")
    records = [None] * len(models)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = {pool.submit(check_model, a, m, i, len(models)): i for i, m in enumerate(models) if os.path.isfile(m)}
        for f in concurrent.futures.as_completed(futs):
            records[futs[f]] = f.result()
    for i, m in enumerate(models):
        if records[i] is None:
            records[i] = {"model": model_name(m), "path": m, "status": "error", "note": "no such file"}
    for m, note in a.missing or []:
        records.append({"model": m, "path": None, "status": "not available", "note": note})
    counts = collections.Counter(r["status"] for r in records)
    doc = {
        "deadline_utc": datetime.datetime.fromtimestamp(a.deadline, datetime.timezone.utc).strftime("%H:%M:%S"),
        "jobs": a.jobs,
        "compile_jobs": a.compile_jobs,
        "compile_args": a.compile_arg,
        "counts": dict(sorted(counts.items())),
        "models": records,
        "passed": not any(r["status"] in FAILING for r in records),
    }
    write_json(a.json, clean(doc))
    say("models: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0 if doc["passed"] else 1


def parse_missing(text):
    name, _, note = text.partition("=")
    return (name, note)


# ---------------------------------------------------------------------------------------------
# bench


def normalize_bench(doc):
    rows = doc.get("results") if isinstance(doc, dict) else doc
    if not isinstance(rows, list):
        return None
    out = []
    for r in rows:
        if isinstance(r, dict) and "batch" in r:
            out.append(r)
    return out or None


def cmd_bench(a):
    cmd = [a.bin, "bench", a.build, "--batch", a.batch, "--iters", str(a.iters), "--warmup", str(a.warmup), "--json"]
    cmd += a.args
    r = run_capture(cmd, min(a.timeout, remaining(a.deadline)))
    doc = parse_json_output(r.stdout)
    rows = normalize_bench(doc) if doc is not None else None
    rec = {"command": cmd, "rc": r.rc, "seconds": round(r.seconds, 2), "timed_out": r.timed_out, "results": rows}
    if r.stderr.strip():
        rec["stderr_tail"] = last_lines(r.stderr, 10, 2000)
    ok = r.rc == 0 and rows is not None
    if not ok:
        rec["error"] = (
            "timed out" if r.timed_out else (error_line(r.stderr) or f"exit {r.rc}, no JSON results on stdout")
        )
    write_json(a.json, clean(rec))
    for row in rows or []:
        say(
            f"onnx2ait bench batch {row.get('batch'):>4}: graph replay {fmt(finite_or_none(row.get('graph_median_ms')), '.3f')} ms, "
            f"plain launches {fmt(finite_or_none(row.get('median_ms')), '.3f')} ms"
        )
    if not ok:
        say(f"bench FAILED: {rec['error']}")
    return 0 if ok else 1


# ---------------------------------------------------------------------------------------------
# collect


def error_bound(base, sensitivity_file, factor):
    """The validation bound: `base`, or `factor` times the network's own fp16 error when that is
    larger. The own error is PyTorch fp16 against PyTorch fp32 on the same weights (the rows of
    scripts/gpu/fp16_error.py --weights auto): no fp16 engine is expected to be more exact than the
    network allows, and a calibrated random network amplifies rounding far more than a trained
    one. Without a readable file (or rows) the bound is `base`."""
    bound = {"base": base, "max_err": base}
    if not sensitivity_file:
        return bound
    try:
        with open(sensitivity_file) as f:
            rows = json.load(f)
        errs = [float(r["rel_err"]) for r in rows if isinstance(r, dict) and "rel_err" in r]
    except (OSError, ValueError, TypeError, KeyError) as e:
        bound["sensitivity_error"] = f"unreadable {sensitivity_file}: {e}"
        return bound
    errs = [e for e in errs if math.isfinite(e)]
    if not errs:
        bound["sensitivity_error"] = f"no finite rel_err rows in {sensitivity_file}"
        return bound
    own = max(errs)
    bound.update({"pytorch_fp16_err": own, "factor": factor, "max_err": max(base, factor * own)})
    return bound


def cmd_collect(a):
    doc = {"overall": a.overall, "steps": []}
    if a.steps and os.path.isfile(a.steps):
        with open(a.steps) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4:
                    doc["steps"].append(
                        {
                            "step": parts[0],
                            "status": parts[1],
                            "seconds": float(parts[2]) if re.fullmatch(r"[\d.]+", parts[2]) else None,
                            "required": parts[3] == "required",
                            "note": parts[4] if len(parts) > 4 else "",
                        }
                    )
    for fn in sorted(os.listdir(a.parts)) if os.path.isdir(a.parts) else []:
        if fn.endswith(".json"):
            try:
                with open(os.path.join(a.parts, fn)) as f:
                    doc[fn[:-5]] = json.load(f)
            except (OSError, ValueError) as e:
                doc[fn[:-5]] = {"error": f"unreadable: {e}"}
    write_json(a.out, clean(doc))
    if a.raw and a.raw_out and os.path.isdir(a.raw):
        merged = {}
        for fn in sorted(os.listdir(a.raw)):
            if fn.endswith(".json"):
                with open(os.path.join(a.raw, fn)) as f:
                    merged[fn[:-5]] = json.load(f)
        write_json(a.raw_out, merged)
    return 0


# ---------------------------------------------------------------------------------------------
# note


def cmd_note(a):
    """One line summarising a step record, for the step table of gpu-check.sh."""
    try:
        with open(a.part) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return 0
    text = ""
    if "exporter" in d:  # export_torchvision.py's record
        text = (
            f"{d['exporter']} exporter, opset {(d.get('opsets') or {}).get('ai.onnx', '?')}, IR {d.get('ir_version', '?')}"
            if d.get("ok")
            else d.get("error", "failed")
        )
    elif "counts" in d:  # models
        text = ", ".join(f"{n} {s}" for s, n in d["counts"].items())
    elif "engines" in d:  # validate
        dev = [(n, e) for n, e in d["engines"].items() if is_device_engine(n)]
        if dev:
            n, e = dev[0]
            text = f"{n} rel err {fmt(e.get('worst_err'))}, top-1 {e.get('top1_agree', 0):g}/{e.get('top1_rows', 0):g}"
        if d.get("problems"):
            text += ("; " if text else "") + d["problems"][0]
    elif "label" in d:  # compile
        rep = d.get("report") or {}
        text = (
            f"{rep.get('compiled', '?')} compiled, {rep.get('cached', '?')} cached"
            if d.get("rc") == 0
            else d.get("error", f"exit {d.get('rc')}")
        )
    elif "results" in d and "cudnn" in d:  # bench_torch.py's record
        text = ", ".join(
            f"bs {r.get('batch')}: eager {fmt(finite_or_none(r.get('eager_ms')), '.3f')} / graph "
            f"{fmt(finite_or_none(r.get('graph_ms')), '.3f')} ms"
            for r in d["results"] or []
        )
    elif "results" in d and "command" in d:  # bench
        text = d.get("error", "") or ", ".join(
            f"bs {r.get('batch')}: {fmt(finite_or_none(r.get('graph_median_ms')), '.3f')} ms" for r in d["results"] or []
        )
    print(text[:300])
    return 0


# ---------------------------------------------------------------------------------------------


def main():
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    e = sub.add_parser("env", help="record GPU, driver, tool versions and commit")
    e.add_argument("--bin", required=True)
    e.add_argument("--commit-file", default=".gpu/COMMIT")
    e.add_argument("--command", default="")
    e.add_argument("--out", required=True)

    c = sub.add_parser("compile", help="one timed `onnx2ait compile`")
    c.add_argument("--bin", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--out-dir", required=True)
    c.add_argument("--label", default="compile")
    c.add_argument("--timeout", type=float, default=480)
    c.add_argument("--deadline", type=float, help="epoch seconds; the compile is stopped then")
    c.add_argument("--fresh", action="store_true", help="remove --out-dir first")
    c.add_argument("--json", required=True)
    c.add_argument("args", nargs="*", help="more compile arguments (after --)")

    v = sub.add_parser("validate", help="`onnx2ait validate --json` over several seeds")
    v.add_argument("--bin", required=True)
    v.add_argument("--model", required=True)
    v.add_argument("--build", required=True)
    v.add_argument("--batch", type=int, required=True)
    v.add_argument("--seeds", type=parse_seeds, default=parse_seeds("0-7"))
    v.add_argument("--jobs", type=int, default=4)
    v.add_argument("--timeout", type=float, default=300, help="per validate call")
    v.add_argument("--deadline", type=float)
    v.add_argument("--max-err", type=float, default=1e-2, help="bound on max|gpu-ort|/max|ort| per output")
    v.add_argument("--min-top1", type=float, default=1.0, help="pooled top-1 agreement required (issue 5: identical top-1)")
    v.add_argument("--sensitivity", help="fp16_error.py JSON of this model's weights: the bound becomes "
                   "max(--max-err, --sensitivity-factor x PyTorch's own fp16 error)")
    v.add_argument("--sensitivity-factor", type=float, default=1.5)
    v.add_argument("--json", required=True)
    v.add_argument("--raw-out", help="write the full validate reports here")
    v.add_argument("args", nargs="*", help="more validate arguments (after --)")

    m = sub.add_parser("models", help="compile + validate a list of models under a deadline")
    m.add_argument("--bin", required=True)
    m.add_argument("--work", required=True, help="folder for the per-model builds")
    m.add_argument("--deadline", type=float, required=True, help="epoch seconds: no model starts after it")
    m.add_argument("--hard-deadline", type=float, help="epoch seconds: running commands are stopped then")
    m.add_argument("--jobs", type=int, default=2, help="models checked at the same time")
    m.add_argument("--compile-jobs", type=int, default=os.cpu_count() or 4)
    m.add_argument("--compile-arg", action="append", default=[], help="one compile argument (repeat)")
    m.add_argument(
        "--model-arg",
        action="append",
        default=[],
        type=parse_missing,
        help="NAME=ARG: one more compile argument for model NAME only (repeat; e.g. light_resnet50=--precision)",
    )
    m.add_argument("--timeout", type=float, default=300, help="per compile / validate command")
    m.add_argument("--keep", action="store_true", help="keep the per-model builds")
    m.add_argument("--missing", action="append", type=parse_missing, help="NAME=why: a model that could not be found")
    m.add_argument("--json", required=True)
    m.add_argument("models", nargs="*")

    b = sub.add_parser("bench", help="`onnx2ait bench --json`")
    b.add_argument("--bin", required=True)
    b.add_argument("--build", required=True)
    b.add_argument("--batch", default="1,8,64,256")
    b.add_argument("--iters", type=int, default=50)
    b.add_argument("--warmup", type=int, default=10)
    b.add_argument("--timeout", type=float, default=300)
    b.add_argument("--deadline", type=float)
    b.add_argument("--json", required=True)
    b.add_argument("args", nargs="*", help="more `onnx2ait bench` options, after `--` (e.g. -- --kernels)")

    k = sub.add_parser("collect", help="merge step records into results.json")
    k.add_argument("--parts", required=True)
    k.add_argument("--steps")
    k.add_argument("--overall", default="unknown")
    k.add_argument("--out", required=True)
    k.add_argument("--raw", help="folder of raw reports to merge into --raw-out")
    k.add_argument("--raw-out")

    t = sub.add_parser("note", help="one-line summary of a step record")
    t.add_argument("part")

    a = p.parse_args()
    return {
        "note": cmd_note,
        "env": cmd_env,
        "compile": cmd_compile,
        "validate": cmd_validate,
        "models": cmd_models,
        "bench": cmd_bench,
        "collect": cmd_collect,
    }[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
