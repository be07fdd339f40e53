#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the results.json of scripts/gpu-check.sh.

    write_benchmarks.py --results results.json --out BENCHMARKS.md [--previous BENCHMARKS.md]
        [--print-section]

The new run becomes the first section; the sections of --previous (an earlier file written by
this script, usually the repository's BENCHMARKS.md) follow unchanged, newest first. Parts of
results.json that are missing (a step failed or was skipped) show as "—" with the reason.
Standard library only.
"""
import argparse
import json
import math
import os
import re
import sys

TITLE = "# Benchmarks"
DASH = "—"


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def ms(v):
    v = num(v)
    if v is None:
        return DASH
    return f"{v:.3f}" if v < 10 else f"{v:.2f}"


def sci(v):
    v = num(v)
    return DASH if v is None else f"{v:.2e}"


def secs(v):
    v = num(v)
    return DASH if v is None else f"{v:.1f} s"


def cell(text, limit=160):
    """Text safe inside a markdown table cell."""
    s = " ".join(str(text).split()).replace("|", "\\|")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


def shell_join(cmd):
    def q(a):
        a = str(a)
        return a if re.fullmatch(r"[\w@%+=:,./-]+", a) else "'" + a.replace("'", "'\\''") + "'"

    return " ".join(q(a) for a in cmd)


def step_note(res, name):
    for s in res.get("steps") or []:
        if s.get("step") == name:
            return s
    return None


def why_missing(res, step):
    s = step_note(res, step)
    if s is None:
        return "not run"
    note = f": {s['note']}" if s.get("note") else ""
    return f"{s.get('status', '?')}{note}"


def attempted(res, *keys):
    """True when a step of these names ran (or was skipped) or left a record: sections of steps
    a run never tried (--models-only) are left out."""
    names = {s.get("step") for s in res.get("steps") or []}
    return any(k in res or k.replace("_", " ") in names for k in keys)


def device_engine(engines):
    for name in engines or {}:
        if name not in ("ort", "onnxruntime", "reference"):
            return name
    return None


def section_env(res):
    env, exp = res.get("env") or {}, res.get("export") or {}
    pk = env.get("packages") or {}
    lines = [
        f"- GPU: {env.get('gpu', '?')} (driver {env.get('driver', '?')}, {env.get('gpu_memory', '?')}); "
        f"{env.get('cpus', '?')} CPU cores; nvcc: {env.get('nvcc', '?')}",
        f"- Software: Python {env.get('python', '?')}, "
        + ", ".join(f"{k} {v}" for k, v in pk.items() if v)
        + (f"; {env['onnx2ait']}" if env.get("onnx2ait") else ""),
        f"- Commit: `{env.get('commit', 'unknown')}`",
        f"- Command: `{env.get('command') or 'scripts/gpu-check.sh'}` (the onnx2ait commands it ran are listed at the end)",
    ]
    if not attempted(res, "export"):
        pass
    elif exp.get("ok"):
        oc = exp.get("ort_check") or {}
        dims = ", ".join(f"{k}[0]={v}" for k, v in (exp.get("batch_dims") or {}).items())
        lines.append(
            f"- Model: torchvision `{exp.get('model')}` with random weights (torch.manual_seed(0)), fp32, exported by torch "
            f"{exp.get('torch')} ({exp.get('exporter')} exporter), opset {(exp.get('opsets') or {}).get('ai.onnx', '?')}, "
            f"IR {exp.get('ir_version')}, dynamic batch ({dims}); ONNX Runtime vs PyTorch on the CPU: "
            f"rel err {sci(oc.get('rel_to_max'))}"
        )
    else:
        lines.append(f"- Model export: {exp.get('error') or why_missing(res, 'export')}")
    return lines


def section_build(res):
    if not attempted(res, "build_scratch", "build_rebuild"):
        return []
    rows, slowest = [], []
    for key, label in (("build_scratch", "from scratch (empty cache)"), ("build_rebuild", "no-change rebuild")):
        b = res.get(key)
        if not b:
            rows.append([label, DASH, DASH, DASH, DASH, cell(why_missing(res, key.replace("_", " ")))])
            continue
        rep = b.get("report") or {}
        files = rep.get("per_file") or []
        fresh = [f for f in files if isinstance(f, list) and len(f) == 3 and not f[2]]
        if fresh:
            slow = max(fresh, key=lambda f: f[1] if num(f[1]) is not None else -1)
            slowest.append(f"{label}: slowest source {slow[0]} {secs(slow[1])}, {rep.get('jobs', '?')} parallel jobs, "
                           f"{len(files)} sources")
        result = "ok" if b.get("rc") == 0 else cell(
            ("timed out" if b.get("timed_out") else f"exit {b.get('rc')}") + (f": {b['error']}" if b.get("error") else "")
        )
        rows.append([label, secs(b.get("seconds")), secs(rep.get("seconds")), rep.get("compiled", DASH),
                     rep.get("cached", DASH), result])
    args = ""
    b = res.get("build_scratch")
    if b and b.get("command"):
        args = " " + " ".join(str(x) for x in b["command"][5:])
    cmd = [f"`onnx2ait compile MODEL -o OUT{args}`", ""] if args else []
    out = ["### Build", ""] + cmd + table(
        ["build", "wall time", "onnx2ait's own time", "sources compiled", "from cache", "result"], rows
    )
    return out + ([""] + [f"- {cell(s, 300)}" for s in slowest] if slowest else [])


def section_validation(res):
    if not attempted(res, "validate_b1", "validate_b32", "validate bs1", "validate bs32"):
        return []
    rows, problems = [], []
    for key in sorted((k for k in res if re.fullmatch(r"validate_b\d+", k)), key=lambda k: int(k[10:])):
        v = res[key]
        eng = v.get("engines") or {}
        dev = device_engine(eng)
        d, r = eng.get(dev) or {}, eng.get("reference") or {}
        top1 = f"{d['top1_agree']:g}/{d['top1_rows']:g}" if d.get("top1_rows") else DASH
        rows.append([v.get("batch"), len(v.get("runs") or []), sci(d.get("worst_err")), sci(d.get("worst_max_abs")),
                     top1, sci(r.get("worst_err")), "pass" if v.get("passed") else "**FAIL**"])
        problems += [f"bs {v.get('batch')}: {p}" for p in v.get("problems") or []]
    if not rows:
        return ["### Validation", "", f"Not available ({why_missing(res, 'validate bs1')})."]
    v0 = next(res[k] for k in res if re.fullmatch(r"validate_b\d+", k))
    out = [
        "### Validation of the ResNet-50 build",
        "",
        "ONNX Runtime (CPU, fp32) is the baseline. Rel err = max |a − b| / max |b| per output (worst over "
        f"seeds); bound {v0.get('max_err', '?')}; top-1 = arg-max agreement with ONNX Runtime over all rows "
        f"of all seeds (at least {v0.get('min_top1', '?')} required).",
        "",
    ]
    out += table(["batch", "seeds", "GPU rel err", "GPU max abs diff", "GPU top-1", "CPU reference rel err", "result"],
                 rows)
    if problems:
        out += ["", "Problems:"] + [f"- {cell(p, 300)}" for p in problems[:12]]
        if len(problems) > 12:
            out.append(f"- … and {len(problems) - 12} more (results.json)")
    return out


def section_models(res):
    if not attempted(res, "models"):
        return []
    m = res.get("models")
    if not m:
        return ["### Bundled models", "", f"Not run ({why_missing(res, 'models')})."]
    rows = []
    for r in m.get("models") or []:
        status = r.get("status", "?")
        shown = f"**{status}**" if status in ("fail", "compile failed", "timeout", "error") else status
        compile_s = secs(r.get("compile_seconds"))
        if r.get("kernels_compiled") is not None:
            compile_s += f" ({r['kernels_compiled']} compiled, {r.get('kernels_cached', 0)} cached)"
        top1 = f"{r['top1'][0]:g}/{r['top1'][1]:g}" if r.get("top1") else ""
        rows.append([f"`{r.get('model')}`", shown, sci(r.get("max_err")) if "max_err" in r else DASH, top1 or DASH,
                     compile_s if "compile_seconds" in r else DASH, cell(r.get("note", ""), 140) if status != "pass" else ""])
    counts = ", ".join(f"{n} {s}" for s, n in (m.get("counts") or {}).items())
    return [
        "### Bundled models",
        "",
        "Each model compiled to a fresh folder (shared kernel cache) and validated once (seed 0) against "
        "ONNX Runtime; \"unsupported\" is exit code 2 (ops onnx2ait does not support yet).",
        "",
    ] + table(["model", "result", "GPU rel err", "top-1", "compile", "note"], rows) + ["", f"Totals: {counts}."]


def section_bench(res):
    if not attempted(res, "bench_onnx2ait", "bench_torch", "bench onnx2ait", "bench PyTorch"):
        return []
    o2a, pt = res.get("bench_onnx2ait") or {}, res.get("bench_torch") or {}
    o_rows = {r.get("batch"): r for r in o2a.get("results") or []}
    p_rows = {r.get("batch"): r for r in pt.get("results") or []}
    batches = sorted(b for b in set(o_rows) | set(p_rows) if isinstance(b, int))
    if not batches:
        return [
            "### Latency",
            "",
            f"Not available: onnx2ait bench {o2a.get('error') or why_missing(res, 'bench onnx2ait')}; "
            f"PyTorch {pt.get('error') or why_missing(res, 'bench PyTorch')}.",
        ]
    rows = []
    for b in batches:
        o, p = o_rows.get(b, {}), p_rows.get(b, {})
        og, pg = num(o.get("graph_median_ms")), num(p.get("graph_ms"))
        ratio = f"{pg / og:.2f}×" if og and pg else DASH
        rows.append([b, ms(og), ms(o.get("median_ms")), ms(p.get("eager_ms")), ms(pg), ratio])
    model = pt.get("model") or (res.get("export") or {}).get("model") or "resnet50"
    out = [
        f"### Latency: torchvision {model}, median ms",
        "",
    ]
    out += table(["batch", "onnx2ait (graph replay)", "onnx2ait (plain launches)", "PyTorch eager",
                  "PyTorch + CUDA graph", "ratio vs PyTorch+graph"], rows)
    out += [
        "",
        "Ratio = PyTorch + CUDA graph time / onnx2ait graph-replay time: above 1 means onnx2ait is faster. "
        f"Both measured in this run on the same GPU: medians of {pt.get('iters', '?')} CUDA-event timings after "
        f"{pt.get('warmup', '?')} warm-ups, inputs rotating over pre-made random tensors. onnx2ait runs the fp32 "
        "ONNX model computing in fp16 (boundary casts included); PyTorch "
        f"{pt.get('torch', '')} runs fp16 weights and inputs, channels_last, cudnn.benchmark, inference_mode "
        f"(cuDNN {pt.get('cudnn', '?')}).",
    ]
    if o2a.get("error"):
        out.append(f"onnx2ait bench: {cell(o2a['error'], 300)}")
    if pt.get("error"):
        out.append(f"PyTorch bench: {cell(pt['error'], 300)}")
    return out


def section_steps(res):
    rows = [[s.get("step"), s.get("status"), secs(s.get("seconds")), "yes" if s.get("required") else "no",
             cell(s.get("note", ""), 200)] for s in res.get("steps") or []]
    return ["### Steps", ""] + table(["step", "result", "time", "required", "note"], rows)


def section_commands(res):
    cmds = []
    for key in ("build_scratch", "build_rebuild"):
        if (res.get(key) or {}).get("command"):
            cmds.append(res[key]["command"])
    lines = [shell_join(c) for c in cmds]
    for key in sorted((k for k in res if re.fullmatch(r"validate_b\d+", k)), key=lambda k: int(k[10:])):
        runs = res[key].get("runs") or []
        if runs and runs[0].get("command"):
            c = list(runs[0]["command"])
            seeds = res[key].get("seeds") or []
            if "--seed" in c and seeds:
                i = c.index("--seed")
                span = f"{seeds[0]}..{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else ",".join(map(str, seeds))
                lines.append(f"{shell_join(c[:i])} --seed $S {shell_join(c[i + 2:])}   # S = {span}")
            else:
                lines.append(shell_join(c))
    if (res.get("bench_onnx2ait") or {}).get("command"):
        lines.append(shell_join(res["bench_onnx2ait"]["command"]))
    m = res.get("models") or {}
    if m.get("models"):
        cargs = shell_join(list(m.get("compile_args") or []) + ["--jobs", str(m.get("compile_jobs", "N"))])
        lines.append(f"onnx2ait compile $M -o $D {cargs}   # each bundled model M, D a fresh folder")
        lines.append("onnx2ait validate $M --build $D --seed 0 --json")
    if not lines:
        return []
    return ["### Commands", "", "```"] + lines + ["```"]


def render_section(res):
    env = res.get("env") or {}
    date = env.get("date_utc", "unknown date")
    overall = res.get("overall", "unknown")
    verdict = {"passed": "all required checks passed", "failed": "SOME CHECKS FAILED"}.get(overall, overall)
    commit = env.get("commit", "unknown commit")
    short = re.sub(r"^([0-9a-f]{12})[0-9a-f]{28}", r"\1", commit)
    head = f"## {date} · {env.get('gpu', 'unknown GPU')} · `{short}` · {verdict}"
    parts = [[head, ""] + section_env(res), section_build(res), section_validation(res), section_bench(res),
             section_models(res), section_steps(res), section_commands(res)]
    lines = []
    for p in parts:
        if p:
            lines += p + [""]
    return "\n".join(lines).rstrip() + "\n"


def earlier_sections(text):
    """The run sections of an earlier file (from its first '## ' line), or its body."""
    lines = text.splitlines()
    for i, l in enumerate(lines):
        if l.startswith("## "):
            return "\n".join(lines[i:]).rstrip() + "\n"
    body = [l for l in lines if not l.startswith("# ")]
    return "\n".join(body).strip() + "\n" if "".join(body).strip() else ""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--previous", help="an earlier BENCHMARKS.md whose sections are kept below the new one")
    p.add_argument("--print-section", action="store_true", help="also print the new section")
    a = p.parse_args()
    with open(a.results) as f:
        res = json.load(f)
    section = render_section(res)
    date = (res.get("env") or {}).get("date_utc", "unknown date")
    doc = [
        TITLE,
        "",
        f"Written by scripts/gpu-check.sh on {date}; do not edit. Each run adds a section at the top; "
        "earlier runs follow, newest first. Raw numbers: the run's results.json.",
        "",
        section,
    ]
    if a.previous and os.path.isfile(a.previous):
        with open(a.previous) as f:
            old = earlier_sections(f.read())
        if old.strip():
            doc += [old]
    text = "\n".join(doc).rstrip() + "\n"
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, a.out)
    if a.print_section:
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
