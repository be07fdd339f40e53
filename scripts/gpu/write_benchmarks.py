#!/usr/bin/env python3
"""Writes BENCHMARKS.md from the results.json of scripts/gpu-check.sh or scripts/gpu-bench.sh.

    write_benchmarks.py --results results.json --out BENCHMARKS.md [--previous BENCHMARKS.md]
        [--print-section]
    write_benchmarks.py --migrate OLD_BENCHMARKS.md --out BENCHMARKS.md

The run's section is rendered from results.json (below), its figures are read back from that
section and replace, in the store of --previous (the repository's BENCHMARKS.md), the figures of
the benchmarks this run measured; every other benchmark keeps its latest figure and the run it
came from, and --out is rendered from the store (scripts/gpu/bench_store.py says how). --migrate
builds the store once from a BENCHMARKS.md of the older format (every run a section, newest
first); a --previous of that format is migrated the same way. Parts of results.json that are
missing (a step failed or was skipped) show as "—" with the reason in the run's report.
Standard library only.

A gpu-check.sh run (validation and latency of the ResNet-50 build, bundled models) and a
gpu-bench.sh run (a "plan" record with script "gpu-bench") are rendered differently. The
gpu-bench section: per model a latency table of onnx2ait and every peer with the ratios peer ms ÷
onnx2ait ms and, when onnx2ait bench ran with --kernels, where onnx2ait's time goes at the largest
batch (slowest kernels, kernel families); the issue-6 targets, build and compile times, the kernel
sweep, the schedule (with a check that no timed interval overlapped another), what was not
measured, steps and commands.

Where the time goes. From the "kernels" list of the bench_onnx2ait_<model> record's row of the
largest batch that has one ([{"name", "node", "ms", "flops", "bytes"}, ...] in run order, from
`onnx2ait bench --kernels`): the slowest kernels with their work (GFLOP, MB: flops with a
multiply-add as 2, counted for convolutions, matrix products, attention and elementwise kernels;
bytes the minimum traffic, each tensor read or written once) and achieved TFLOP/s and GB/s, as a
% of the fp16 GEMM ceiling (bench_torch.py --gemm-ceiling) and of the device copy ceiling
(--copy-ceiling) when this run measured them; the kernels' sum next to the graph-replay median,
and a table per kernel family (the template part of the kernel name: k012_conv2d_library ->
conv2d_library) with its summed time and work. Records without kernel lists (older runs) leave
the part out; kernels without work (older builds) show a dash.

Kernel sweep. It is drawn from `onnx2ait profile --json` reports (results key profile_<model>,
field "report") when they exist, else from the profile cache (key profile_cache). Accepted
shapes: a report {"problems": [P, ...]} or [P, ...]; a cache of nested objects down to either a
problem record P or a map candidate -> ms (or -> {"median_ms": ms}) under its problem's key. A
problem record P may hold: "signature" (or problem/key/name), "kind" (conv2d, gemm, ...),
"flops" (or "gflop"; else computed from dims: conv n h w c k r s [p q | stride pad dilation]
[groups], gemm m n k [batch] — as fields, in a "shape"/"dims" object, or as KEY=N pairs of the
signature), "best" (instance name, or {"name", "median_ms"}), "best_ms", "candidates" (map
name -> ms, or [{"name", "median_ms"}]). TFLOP/s = flops / best time; the percentage is of the
fp16 GEMM rate bench_torch.py --gemm-ceiling measured in the same run.
"""
import argparse
import json

import bench_store
import math
import os
import re
import sys

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
            f"- Model: torchvision `{exp.get('model')}`, weights {exp.get('weights') or 'random (torch.manual_seed(0))'}, fp32, exported by torch "
            f"{exp.get('torch')} ({exp.get('exporter')} exporter), opset {(exp.get('opsets') or {}).get('ai.onnx', '?')}, "
            f"IR {exp.get('ir_version')}, dynamic batch ({dims}); ONNX Runtime vs PyTorch on the CPU: "
            f"rel err {sci(oc.get('rel_to_max'))}"
        )
    else:
        lines.append(f"- Model export: {exp.get('error') or why_missing(res, 'export')}")
    return lines


def section_build(res):
    if not attempted(res, "build_cold", "build_scratch", "build_rebuild"):
        return []
    rows, slowest = [], []
    builds = (("build_scratch", "from scratch (empty cache)"), ("build_rebuild", "no-change rebuild"))
    if res.get("build_cold") or any(s.get("step") == "build cold" for s in res.get("steps") or []):
        builds = (("build_cold", "cold profile cache (profile, then build)"),
                  ("build_scratch", warm_label(res)), builds[1])
    for key, label in builds:
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
    totals = build_totals(res)
    return out + ([""] + [f"- {cell(s, 300)}" for s in totals + slowest] if totals or slowest else [])


def warm_label(res):
    """The warm-profile-cache build: from empty object caches, unless objects came from the
    profiler's (runs before gpu-check cleared that one too)."""
    cached = ((res.get("build_scratch") or {}).get("report") or {}).get("cached") or 0
    if cached:
        return f"warm profile cache, {cached} objects from the profiler's object cache"
    return "warm profile cache, empty object caches"


def build_totals(res):
    """The two build-time targets of issue 6: a build with a cold profile cache (`compile
    --profile` from empty profile and object caches) and one with the profile cache warm and the
    object cache empty."""
    cold, warm = (res.get(k) or {} for k in ("build_cold", "build_scratch"))
    out = []
    if cold.get("rc") == 0 and num(cold.get("seconds")) is not None:
        c = cold["seconds"]
        out.append(f"Cold profile cache: **{secs(c)}** (target ≤ 600 s; {'met' if c <= 600 else 'NOT met'}).")
    if warm.get("rc") == 0 and num(warm.get("seconds")) is not None:
        w = warm["seconds"]
        label = warm_label(res)
        out.append(f"{label[0].upper()}{label[1:]}: **{secs(w)}** (target ≤ 90 s; {'met' if w <= 90 else 'NOT met'}).")
    return [" ".join(out)] if out else []


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
    for key in ("build_cold", "build_scratch", "build_rebuild"):
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


# ---------------------------------------------------------------------------------------------
# scripts/gpu-bench.sh: results.json with a "plan" record (plan.script == "gpu-bench")

# The "done when" figures of issue 6 (ResNet-50 fp16 latency bounds, and faster than
# torch.compile max-autotune in the same run).
TARGET_MS = {("resnet50", 1): 0.45, ("resnet50", 256): 7.5}
TARGET_BEAT_COMPILE = {"resnet50": (1, 256), "mobilenet_v2": (1, 256)}
PRETTY = {"resnet50": "ResNet-50", "mobilenet_v2": "MobileNetV2"}
GPU_USE = {
    "none": "CPU only",
    "brief": "correctness runs",
    "timing": "timing, alone",
    "profile timing": "onnx2ait profiling, alone",
    "autotune": "autotuning benchmarks, shared",
}


def is_bench_run(res):
    return (res.get("plan") or {}).get("script") == "gpu-bench"


def pretty(model):
    return PRETTY.get(model, model)


def ratio(peer, ours):
    peer, ours = num(peer), num(ours)
    return f"{peer / ours:.2f}×" if peer and ours else DASH


def bench_rows(rec):
    return {r.get("batch"): r for r in (rec or {}).get("results") or [] if isinstance(r, dict)}


def tc_record(res, model, batch):
    return res.get(f"torch_compile_{model}_b{batch}") or {}


def tc_row(res, model, batch):
    for r in tc_record(res, model, batch).get("results") or []:
        if r.get("batch") == batch:
            return r
    return {}


def bench_verdict(res):
    overall = res.get("overall", "unknown")
    return {
        "complete": "benchmark: every planned figure measured",
        "incomplete": "benchmark: SOME FIGURES MISSING",
        "failed": "benchmark: SOME STEPS FAILED",
    }.get(overall, f"benchmark: {overall}")


def bench_env(res):
    env, plan = res.get("env") or {}, res.get("plan") or {}
    pk = env.get("packages") or {}
    lines = [
        f"- GPU: {env.get('gpu', '?')} (driver {env.get('driver', '?')}, {env.get('gpu_memory', '?')}); "
        f"{env.get('cpus', '?')} CPU cores; nvcc: {env.get('nvcc', '?')}",
        f"- Software: Python {env.get('python', '?')}, "
        + ", ".join(f"{k} {v}" for k, v in pk.items() if v)
        + (f"; {env['onnx2ait']}" if env.get("onnx2ait") else ""),
        f"- Commit: `{env.get('commit', 'unknown')}`",
        f"- Command: `{plan.get('command') or env.get('command') or 'scripts/gpu-bench.sh'}` "
        f"(budget {plan.get('budget_s', '?')} s; the commands it ran are listed at the end)",
    ]
    exports = []
    for m in plan.get("models") or []:
        e = res.get(f"export_{m}") or {}
        if e.get("ok"):
            oc = e.get("ort_check") or {}
            # Older exports did not record how their weights were made: torchvision's initialisation.
            exports.append(f"`{m}` (weights {e.get('weights') or 'random (torch.manual_seed(0))'}, "
                           f"{e.get('exporter')} exporter, opset {(e.get('opsets') or {}).get('ai.onnx', '?')}, "
                           f"IR {e.get('ir_version')}, ORT vs PyTorch rel err {sci(oc.get('rel_to_max'))})")
        else:
            exports.append(f"`{m}`: not exported ({cell(e.get('error') or why_missing(res, 'export'), 200)})")
    torch_v = next((res[k].get("torch") for k in res if k.startswith("bench_torch_") and isinstance(res[k], dict)
                    and res[k].get("torch")), None) or next(
        (e.get("torch") for m in plan.get("models") or [] for e in [res.get(f"export_{m}") or {}] if e.get("torch")), "?")
    lines.append(
        "- Models: torchvision classifiers with random weights (see export_torchvision.py), exported to fp32 ONNX with a "
        f"dynamic batch by torch {torch_v}: " + "; ".join(exports)
    )
    prof = plan.get("profile") or {}
    kinds = ", ".join(f"`{m}` {(res.get(f'final_{m}') or {}).get('kind') or '—'}" for m in plan.get("models") or [])
    lines.append(
        f"- onnx2ait: `compile --arch {plan.get('arch', '?')} --max-batch {plan.get('max_batch', '?')}`, the fp32 model "
        f"computed in fp16 (boundary casts included). Kernels: {kinds} ({prof.get('note') or 'no profiler'}"
        + (f"; profile cache seeded from `{prof['seeded_from']}`" if prof.get("seeded_from") else "") + ")"
    )
    tcp = plan.get("torch_compile") or {}
    peers = ("- Peers, same weights: PyTorch fp16 weights and inputs, channels_last, cudnn.benchmark, inference_mode; "
             "eager, and the whole model captured in one CUDA graph (replayed)")
    if tcp.get("enabled"):
        peers += (f"; torch.compile(mode=\"{tcp.get('mode')}\", dynamic=False), one process per model and batch, "
                  f"compile threads: {tcp.get('compile_threads')}")
    lines.append(peers)
    lines.append(
        f"- Method: every figure is the median of {plan.get('iters', '?')} CUDA-event timings after "
        f"{plan.get('warmup', '?')} warm-up runs, inputs rotating over pre-made random tensors, one engine at a time "
        "on the GPU with nothing else running (see Schedule). Host-device copies are not timed; torch.compile's call "
        "copies its input into its CUDA graph's static buffer inside the timed region (~0.03 ms at batch 256)."
    )
    return lines


def bound_note(v):
    """Why a validation bound is what it is (checks.py validate's `bound` record)."""
    b = v.get("bound") or {}
    own = b.get("pytorch_fp16_err")
    if own is None:
        return f" ({b['sensitivity_error']}; the base bound)" if b.get("sensitivity_error") else ""
    return (f" (the larger of {sci(b.get('base'))} and {b.get('factor', 1.5):g} × PyTorch's own fp16 error on these "
            f"weights, {sci(own)}: scripts/gpu/fp16_error.py)")


def bench_model_section(res, model):
    plan = res.get("plan") or {}
    o_rows = bench_rows(res.get(f"bench_onnx2ait_{model}"))
    p_rows = bench_rows(res.get(f"bench_torch_{model}"))
    tc_batches = list(plan.get("compile_batches") or [])
    batches = sorted({b for b in list(plan.get("batches") or []) + tc_batches + list(o_rows) + list(p_rows)
                      if isinstance(b, int)})
    # The same library timed with programmatic dependent launch off (gpu-bench.sh --pdl-off-too).
    off_rows = bench_rows(res.get(f"bench_onnx2ait_pdl_off_{model}")) if res.get(f"bench_onnx2ait_pdl_off_{model}") else None
    head = [f"### {pretty(model)} (torchvision `{model}`), median ms", ""]
    rows = []
    for b in batches:
        o, p = o_rows.get(b, {}), p_rows.get(b, {})
        og = num(o.get("graph_median_ms"))
        t = tc_row(res, model, b) if b in tc_batches else {}
        tc_cell = ms(t.get("compile_ms")) if b in tc_batches else ""
        off = [ms(num((off_rows.get(b) or {}).get("graph_median_ms")))] if off_rows is not None else []
        rows.append([b, ms(og)] + off + [ms(o.get("median_ms")), ms(p.get("eager_ms")), ms(p.get("graph_ms")),
                     tc_cell or ("" if b not in tc_batches else DASH),
                     ratio(p.get("eager_ms"), og), ratio(p.get("graph_ms"), og),
                     ratio(t.get("compile_ms"), og) if b in tc_batches else ""])
    mode = (plan.get("torch_compile") or {}).get("mode", "max-autotune")
    off_head = ["onnx2ait (CUDA graph, O2A_PDL=0)"] if off_rows is not None else []
    out = head + table(["batch", "onnx2ait (CUDA graph)"] + off_head + ["onnx2ait (plain launches)", "PyTorch eager",
                        "PyTorch + CUDA graph", f"torch.compile {mode}", "eager ÷ onnx2ait",
                        "CUDA graph ÷ onnx2ait", "torch.compile ÷ onnx2ait"], rows)
    facts = []
    final = res.get(f"final_{model}") or {}
    kind = final.get("kind")
    if kind and kind != "none":
        facts.append(f"onnx2ait build benchmarked: {kind}")
    validations = model_validations(res, model)
    for v in validations:
        dev = device_engine(v.get("engines"))
        d = (v.get("engines") or {}).get(dev) or {}
        top1 = f"{d['top1_agree']:g}/{d['top1_rows']:g}" if d.get("top1_rows") else DASH
        # A failed validation means the build's outputs are out of the bound against ONNX Runtime
        # (fp32); whether the build is wrong or the network is too sensitive to fp16 rounding
        # (compare scripts/gpu/fp16_error.py, PyTorch's own fp16 error) is for the reader to check.
        top1_all = bool(d.get("top1_rows")) and d.get("top1_agree") == d.get("top1_rows")
        verdict = ("pass" if v.get("passed") else
                   "**FAILED: out of the error bound** (top-1 identical; check the model's own fp16 sensitivity "
                   "with scripts/gpu/fp16_error.py)" if top1_all else
                   "**FAILED: the outputs disagree with ONNX Runtime: the figures above are of a wrong build**")
        facts.append(f"validation at batch {v.get('batch') or 1} against ONNX Runtime ({len(v.get('seeds') or [])} "
                     f"seeds): rel err {sci(d.get('worst_err'))}, top-1 {top1}, bound {sci(v.get('max_err'))}"
                     f"{bound_note(v)}: {verdict}")
        for prob in (v.get("problems") or [])[:3]:
            facts.append(f"validation problem: {cell(prob, 200)}")
    if not validations:
        facts.append(f"validation: not run ({why_missing(res, f'validate {model}')})")
    for b in tc_batches:
        rec, t = tc_record(res, model, b), tc_row(res, model, b)
        if t:
            facts.append(f"torch.compile batch {b}: compiled and autotuned in {secs(t.get('compile_seconds'))}, output "
                         f"vs eager rel err {sci(t.get('rel_err_vs_eager'))}")
        elif rec.get("error"):
            facts.append(f"torch.compile batch {b}: {cell(rec['error'], 200)}")
    for key, label in ((f"bench_onnx2ait_{model}", "onnx2ait bench"), (f"bench_torch_{model}", "PyTorch")):
        if (res.get(key) or {}).get("error"):
            facts.append(f"{label}: {cell(res[key]['error'], 200)}")
    out += [""] + [f"- {f}" for f in facts]
    where = bench_kernel_times(res, model)
    return out + ([""] + where if where else [])


# --- where the time goes (onnx2ait bench --kernels) ------------------------------------------------

KERNEL_TOP = 15


def kernel_family(name):
    """The template part of a generated kernel's name: k012_conv2d_library -> conv2d_library."""
    m = re.fullmatch(r"k\d+_(.+)", name)
    return m.group(1) if m else name


def short_node(node, limit=70):
    """A kernel's node list within `limit` characters: the names that fit, then how many more."""
    text = " ".join(str(node).split())
    if len(text) <= limit:
        return text
    names = text.split(", ")
    best = None
    for kept in range(1, len(names)):
        t = ", ".join(names[:kept]) + f", … +{len(names) - kept}"
        if len(t) > limit:
            break
        best = t
    return best or text[: limit - 1] + "…"


def kernel_rows(row):
    """The valid entries of a bench row's "kernels" list, in run order."""
    ks = row.get("kernels") if isinstance(row, dict) else None
    if not isinstance(ks, list):
        return []
    return [k for k in ks if isinstance(k, dict) and isinstance(k.get("name"), str) and num(k.get("ms")) is not None]


def amount(v, unit):
    """A work figure (flops, bytes) in `unit`s with about three significant digits; a dash for none."""
    v = num(v)
    if v is None:
        return DASH
    v /= unit
    if v >= 100:
        return f"{v:.0f}"
    return f"{v:#.3g}" if v >= 0.001 else ("0" if v == 0 else "<0.001")


def rate(work, t_ms, unit):
    """`work` per second in `unit`s over `t_ms` (None without work or time)."""
    work, t_ms = num(work), num(t_ms)
    return work / (t_ms * 1e-3) / unit if work and t_ms and t_ms > 0 else None


def share(r, ceiling):
    """A rate as a % of a measured ceiling."""
    return DASH if r is None else f"{100 * r / ceiling:.1f}%"


def copy_ceiling_gbps(res):
    for k, v in res.items():
        if k.startswith("bench_torch_") and isinstance(v, dict) and isinstance(v.get("copy_ceiling"), dict):
            return num(v["copy_ceiling"].get("gbps"))
    return None


def work_cells(work, t_ms, unit, rate_unit, ceiling):
    """[amount, rate] (and the rate's % of `ceiling` when there is one) of one kernel or family."""
    r = rate(work, t_ms, rate_unit)
    cells = [amount(work, unit), DASH if r is None else amount(r, 1)]
    return cells + ([share(r, ceiling)] if ceiling else [])


def bench_kernel_times(res, model, top=KERNEL_TOP):
    rows = bench_rows(res.get(f"bench_onnx2ait_{model}"))
    timed = [b for b, r in rows.items() if isinstance(b, int) and kernel_rows(r)]
    if not timed:
        return []
    batch = max(timed)
    row = rows[batch]
    kernels = kernel_rows(row)
    total = sum(k["ms"] for k in kernels)

    def pct(v):
        return f"{100 * v / total:.1f}%" if total > 0 else DASH

    gemm, copy = gemm_ceiling_tflops(res), copy_ceiling_gbps(res)

    def work(k):
        return (work_cells(k.get("flops"), k["ms"], 1e9, 1e12, gemm)
                + work_cells(k.get("bytes"), k["ms"], 1e6, 1e9, copy))

    order = sorted(kernels, key=lambda k: -k["ms"])  # stable: equal times keep run order
    top_rows = [[i + 1, ms(k["ms"]), pct(k["ms"])] + work(k)
                + [f"`{cell(k['name'], 60)}`", cell(short_node(k.get("node", "")), 80)]
                for i, k in enumerate(order[:top])]
    # Per family: kernels, time, and the work of those kernels that state it (None: none does).
    families = {}
    for k in kernels:
        f = families.setdefault(kernel_family(k["name"]), {"n": 0, "ms": 0.0, "flops": None, "bytes": None})
        f["n"] += 1
        f["ms"] += k["ms"]
        for key in ("flops", "bytes"):
            if num(k.get(key)) is not None:
                f[key] = (f[key] or 0) + k[key]
    fam_rows = [[f"`{cell(name, 60)}`", f["n"], ms(f["ms"]), pct(f["ms"])]
                + work_cells(f["flops"], f["ms"], 1e9, 1e12, None) + work_cells(f["bytes"], f["ms"], 1e6, 1e9, None)
                for name, f in sorted(families.items(), key=lambda kv: (-kv[1]["ms"], kv[0]))]
    header = ["#", "ms", "%", "GFLOP", "TFLOP/s"] + (["% of GEMM ceiling"] if gemm else []) + ["MB", "GB/s"]
    header += (["% of copy ceiling"] if copy else []) + ["kernel", "node"]
    ceilings = [f"fp16 GEMM ceiling {gemm:.0f} TFLOP/s" if gemm else None,
                f"copy ceiling {copy:.0f} GB/s" if copy else None]
    ceilings = [c for c in ceilings if c]
    plan = res.get("plan") or {}
    graph, plain = num(row.get("graph_median_ms")), num(row.get("median_ms"))
    out = [
        f"#### Where the time goes (onnx2ait, batch {batch})",
        "",
        f"`onnx2ait bench --kernels`: each kernel's median over {plan.get('iters', '?')} runs with plain launches and a "
        "CUDA event before each kernel, slowest first; % of the kernels' sum. A kernel's time includes any wait for "
        "its launch, so launch-bound kernels look slower than in a graph replay. GFLOP and MB: one launch's work "
        "(a multiply-add is 2 flops, counted for convolutions, matrix products, attention and elementwise kernels, "
        "a dash for the others; bytes: each tensor the kernel reads or writes once, a minimum traffic), "
        "TFLOP/s and GB/s that work over the kernel's time"
        + (f"; measured in this run: {', '.join(ceilings)}." if ceilings else "."),
        "",
    ]
    out += table(header, top_rows)
    if len(order) > top:
        rest = sum(k["ms"] for k in order[top:])
        out += ["", f"… and {len(order) - top} faster kernels: {ms(rest)} ms, {pct(rest)}."]
    summary = f"Sum of the kernel times ({len(kernels)} kernels): {ms(total)} ms; CUDA-graph median {ms(graph)} ms"
    if graph and total:
        summary += f" (sum ÷ graph {total / graph:.2f})"
    summary += f"; plain-launch median {ms(plain)} ms."
    out += ["", summary, ""]
    out += table(["kernel family", "kernels", "ms", "%", "GFLOP", "TFLOP/s", "MB", "GB/s"], fam_rows)
    return out


def bench_targets(res):
    plan = res.get("plan") or {}
    models = plan.get("models") or []
    rows = []
    for (m, b), bound in TARGET_MS.items():
        if m not in models:
            continue
        o = bench_rows(res.get(f"bench_onnx2ait_{m}")).get(b, {})
        og = num(o.get("graph_median_ms"))
        rows.append([f"{pretty(m)} batch {b} ≤ {bound:g} ms", f"{ms(og)} ms" if og else DASH,
                     DASH if og is None else ("yes" if og <= bound else "no")])
    for m, bs in TARGET_BEAT_COMPILE.items():
        if m not in models:
            continue
        for b in bs:
            if b not in (plan.get("compile_batches") or []):
                continue
            og = num(bench_rows(res.get(f"bench_onnx2ait_{m}")).get(b, {}).get("graph_median_ms"))
            tc = num(tc_row(res, m, b).get("compile_ms"))
            shown = f"{ms(og)} vs {ms(tc)} ms" if og or tc else DASH
            rows.append([f"{pretty(m)} batch {b} faster than torch.compile", shown,
                         DASH if og is None or tc is None else ("yes" if og < tc else "no")])
    if not rows:
        return []
    return ["### Issue 6 targets", ""] + table(["target", "measured (onnx2ait CUDA graph)", "met"], rows)


def compile_cell(rec):
    if not rec:
        return DASH
    rep = rec.get("report") or {}
    if rec.get("rc") != 0:
        return cell(("timed out" if rec.get("timed_out") else f"exit {rec.get('rc')}")
                    + (f": {rec['error']}" if rec.get("error") else ""), 120)
    extra = f" ({rep.get('compiled', '?')} compiled, {rep.get('cached', '?')} cached)" if rep else ""
    return secs(rec.get("seconds")) + extra


def profile_cell(rec):
    if not rec:
        return DASH
    text = secs(rec.get("seconds"))
    if rec.get("rc") != 0:
        text += f", {cell(rec.get('error') or 'exit ' + str(rec.get('rc')), 100)}"
    elif "cache_changed" in rec:
        text += ", cache " + ("updated" if rec["cache_changed"] else "unchanged")
    return text


def bench_build_times(res):
    plan = res.get("plan") or {}
    tcb = list(plan.get("compile_batches") or [])
    rows = []
    for m in plan.get("models") or []:
        row = [f"`{m}`", compile_cell(res.get(f"compile_pre_{m}")), profile_cell(res.get(f"profile_build_{m}")),
               profile_cell(res.get(f"profile_{m}")), compile_cell(res.get(f"compile_{m}"))]
        for b in tcb:
            t = tc_row(res, m, b)
            secs_ = num(t.get("compile_seconds")) if t else num(
                (tc_record(res, m, b).get("compile_seconds") or {}).get(str(b)))
            row.append(secs(secs_))
        rows.append(row)
    if not rows:
        return []
    header = ["model", "onnx2ait build during torch.compile", "onnx2ait profile build", "onnx2ait profile",
              "onnx2ait build after profiling"] + [f"torch.compile batch {b}" for b in tcb]
    if tcb:
        text = ("Wall times under the load of the schedule below: the torch.compile jobs compiled and autotuned at the "
                "same time as each other and as the exports and nvcc builds (those under `nice -n 10`), so each took "
                "longer than it would alone; onnx2ait's profile timing ran alone.")
    else:
        text = "Wall times; nothing else ran meanwhile (no torch.compile jobs in this run)."
    return ["### Build and compile times (wall clock)", ""] + table(header, rows) + [
        "", text + " \"—\": not run (the steps table says why)."]


# --- kernel sweep ------------------------------------------------------------------------------

_MS_KEYS = ("best_ms", "ms", "median_ms", "time_ms", "median")
_NAME_KEYS = ("signature", "problem", "key", "name")
_CAND_KEYS = ("candidates", "timings", "times", "instances")


def _first(d, keys):
    for k in keys:
        if k in d and d[k] is not None:
            return d[k]
    return None


def _ms_of(v):
    if isinstance(v, dict):
        v = _first(v, _MS_KEYS)
    return num(v)


def _candidates(v):
    """{candidate: ms} from a dict or a list of {name, ms} records."""
    if isinstance(v, dict):
        return {str(k): _ms_of(x) for k, x in v.items() if _ms_of(x) is not None}
    if isinstance(v, list):
        out = {}
        for x in v:
            if isinstance(x, dict):
                name = _first(x, ("name", "key", "instance", "candidate"))
                t = _ms_of(x)
                if name is not None and t is not None:
                    out[str(name)] = t
        return out
    return {}


def _dims(p, signature):
    """Lower-case numeric fields of a problem record, its shape sub-records and KEY=N pairs of its
    signature."""
    dims = {}
    try:
        sig_obj = json.loads(signature) if isinstance(signature, str) and signature.strip().startswith("{") else None
    except ValueError:
        sig_obj = None
    sources = [sig_obj or {}, p] + [p[k] for k in ("shape", "dims", "problem_size", "size", "args") if isinstance(p.get(k), dict)]
    if isinstance(signature, str):
        sources.insert(0, {k: int(v) for k, v in re.findall(r"([A-Za-z_]+)\s*[=:]\s*(\d+)", signature)})
        # onnx2ait's own signatures: "conv2d n256 h56 w56 c64 k256 r1 s1 p56 q56 …", "gemm b1 m256 n1000 k2048 …".
        own = {k: int(v) for k, v in re.findall(r"(?:^|\s)([a-z])(\d+)(?=\s|$)", signature)}
        if "b" in own:
            own["batch"] = own.pop("b")
        sources.insert(0, own)
    for src in sources:
        for k, v in src.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                dims[str(k).lower()] = v
            elif isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v):
                dims[f"{str(k).lower()}_h"], dims[f"{str(k).lower()}_w"] = v
    return dims


def problem_flops(p, signature, kind):
    """The FLOP count of one problem: its `flops` / `gflop` field, else from its dims (conv:
    n h w c k r s [p q | stride pad dilation] groups; gemm: m n k [batch]); None when unknown."""
    f = num(p.get("flops"))
    if f is not None:
        return f
    g = num(_first(p, ("gflop", "gflops")))
    if g is not None:
        return g * 1e9
    d = _dims(p, signature)
    kind = (kind or "").lower()
    is_conv = "conv" in kind or ("gemm" not in kind and "matmul" not in kind and all(k in d for k in ("c", "r", "s")))

    def pick(*names, default=None):
        for n in names:
            if n in d:
                return d[n]
        return default

    if is_conv:
        n, h, w, c, k = pick("n", "batch"), pick("h"), pick("w"), pick("c"), pick("k")
        r, s = pick("r", "kh"), pick("s", "kw")
        if None in (n, c, k, r, s):
            return None
        groups = pick("groups", "g", default=1) or 1
        pp, qq = pick("p", "oh", "out_h"), pick("q", "ow", "out_w")
        if pp is None or qq is None:
            if h is None or w is None:
                return None
            sh, sw = pick("stride_h", "stride", "sh", default=1), pick("stride_w", "stride", "sw", default=1)
            ph, pw = pick("pad_h", "pad", "ph", default=0), pick("pad_w", "pad", "pw", default=0)
            dh, dw = pick("dilation_h", "dilation", "dh", default=1), pick("dilation_w", "dilation", "dw", default=1)
            pp = (h + 2 * ph - dh * (r - 1) - 1) // sh + 1
            qq = (w + 2 * pw - dw * (s - 1) - 1) // sw + 1
        return 2.0 * n * pp * qq * k * (c / groups) * r * s
    m, n, k = pick("m"), pick("n"), pick("k")
    if None in (m, n, k) and isinstance(signature, str):
        mm = re.search(r"(\d+)x(\d+)x(\d+)", signature)
        if mm:
            m, n, k = (int(x) for x in mm.groups())
    if None in (m, n, k):
        return None
    return 2.0 * m * n * k * (pick("batch", "l", "batch_count", default=1) or 1)


def _problem(signature, p, source):
    cands = _candidates(_first(p, _CAND_KEYS))
    best = _first(p, ("best", "best_instance", "chosen", "choice", "winner"))
    best_ms = _ms_of(best) if isinstance(best, dict) else _ms_of(_first(p, _MS_KEYS))
    if isinstance(best, dict):
        best = _first(best, ("name", "key", "instance"))
    if cands:
        name, t = min(cands.items(), key=lambda kv: kv[1])
        if best_ms is None or best is None:
            best, best_ms = name, t
    if best_ms is None:
        return None
    kind = _first(p, ("kind", "op", "family"))
    sig = signature if signature is not None else _first(p, _NAME_KEYS)
    if kind is None and isinstance(sig, str) and sig.strip().startswith("{"):
        try:
            obj = json.loads(sig)
            kind = _first(obj, ("kind", "op", "family")) if isinstance(obj, dict) else None
        except ValueError:
            pass
    if kind is None and isinstance(sig, str):
        m = re.match(r"\s*(conv\w*|gemm\w*|matmul\w*)", sig, re.IGNORECASE)
        kind = m.group(1) if m else None
    return {"problem": str(sig), "kind": kind, "flops": problem_flops(p, sig, kind), "best": best,
            "best_ms": best_ms, "candidates": len(cands) or num(p.get("candidate_count")), "source": source}


def _walk_cache(obj, key, source, out, depth=0):
    """Finds problem records in a nested profile cache: a dict with a candidates field, or a dict
    whose values are all times (a candidate -> ms map, under its problem's key)."""
    if depth > 6 or not isinstance(obj, dict) or not obj:
        return
    if _first(obj, _CAND_KEYS) is not None or _first(obj, ("best", "best_instance")) is not None:
        p = _problem(key, obj, source)
        if p:
            out.append(p)
        return
    if all(_ms_of(v) is not None for v in obj.values()):
        p = _problem(key, {"candidates": obj}, source)
        if p:
            out.append(p)
        return
    for k, v in obj.items():
        _walk_cache(v, k, source, out, depth + 1)


def profile_problems(res):
    """One row per profiled problem, from the profiler's --json reports (profile_<model>.report:
    {"problems": [...]} or a list; each with signature, kind, flops, best, best_ms, candidates),
    else from the profile cache (GPU -> signature -> candidate -> ms). The fastest time wins when a
    problem appears twice."""
    plan = res.get("plan") or {}
    rows = []
    for m in plan.get("models") or []:
        rep = (res.get(f"profile_{m}") or {}).get("report")
        items = rep.get("problems") if isinstance(rep, dict) else rep
        for p in items if isinstance(items, list) else []:
            if isinstance(p, dict):
                row = _problem(None, p, m)
                if row:
                    rows.append(row)
    if not rows and isinstance(res.get("profile_cache"), dict):
        _walk_cache(res["profile_cache"], None, "cache", rows)
    best = {}
    for r in rows:
        k = r["problem"]
        if k not in best or r["best_ms"] < best[k]["best_ms"]:
            best[k] = r
    return sorted(best.values(), key=lambda r: -r["best_ms"])


def gemm_ceiling_tflops(res):
    for k, v in res.items():
        if k.startswith("bench_torch_") and isinstance(v, dict) and isinstance(v.get("gemm_ceiling"), dict):
            return num(v["gemm_ceiling"].get("tflops"))
    return None


def bench_sweep(res, limit=40):
    rows = profile_problems(res)
    if not rows:
        return []
    ceiling = gemm_ceiling_tflops(res)
    table_rows = []
    for r in rows[:limit]:
        tf = r["flops"] / (r["best_ms"] * 1e-3) / 1e12 if r["flops"] and r["best_ms"] > 0 else None
        line = [f"`{cell(r['problem'], 90)}`", cell(r["kind"] or DASH, 20),
                DASH if r["flops"] is None else f"{r['flops'] / 1e9:.3g}", f"`{cell(r['best'], 60)}`",
                ms(r["best_ms"]), DASH if tf is None else f"{tf:.1f}"]
        if ceiling:
            line.append(DASH if tf is None else f"{100 * tf / ceiling:.0f}%")
        line.append(DASH if not r["candidates"] else f"{r['candidates']:g}")
        table_rows.append(line)
    header = ["problem", "kind", "GFLOP", "best instance", "ms", "TFLOP/s"]
    if ceiling:
        header.append("of the GEMM ceiling")
    header.append("candidates")
    out = ["### Kernel sweep (onnx2ait profile)", "",
           "Each conv / gemm problem the profiler timed (all batch buckets), its fastest candidate and that "
           "candidate's median time; slowest first."
           + (f" GEMM ceiling: torch.matmul fp16 8192³ measured in this run, {ceiling:.0f} TFLOP/s." if ceiling else ""),
           ""]
    out += table(header, table_rows)
    if len(rows) > limit:
        out += ["", f"… and {len(rows) - limit} faster problems (results.json: profile_*, profile_cache)."]
    return out


# --- schedule ------------------------------------------------------------------------------------


def bench_schedule(res):
    events = (res.get("timeline") or {}).get("events") or []
    if not events:
        return []
    rows = [[f"{e['start']:.0f}", f"{e['end']:.0f}", cell(e.get("lane", ""), 40), cell(e.get("what", ""), 80),
             GPU_USE.get(e.get("gpu"), e.get("gpu", ""))] for e in events]
    # Checked, not claimed: does any timed or profiling interval overlap another interval?
    exclusive = [e for e in events if e.get("gpu") in ("timing", "profile timing")]
    clashes = []
    for e in exclusive:
        for o in events:
            if o is e or o.get("gpu") == "none" and o.get("lane") == "main":
                continue
            if o["start"] < e["end"] - 0.5 and e["start"] < o["end"] - 0.5:
                clashes.append(f"{e['what']} overlapped {o.get('lane')}: {o.get('what')}")
    tc_lanes = sorted({e["lane"] for e in events if e.get("gpu") == "autotune" and e.get("lane") != "main"})
    text = []
    if tc_lanes:
        text.append(
            f"The {len(tc_lanes)} torch.compile jobs (one process each) compiled and autotuned concurrently with each "
            "other and with the CPU work of the main lane below (exports, nvcc builds): their autotuning benchmarks "
            "shared the GPU with each other, so torch.compile's kernel choices were made on a busier GPU and CPU than "
            "an idle machine would give. Each job, compiled and warmed up, then waited for its turn to time alone."
        )
    text.append(
        "Every figure in the tables above was timed with nothing else running on the GPU and no build running on "
        "the CPUs, one engine after another; onnx2ait's profiler timed its candidates after all autotuning had "
        "finished."
        if not clashes else
        "**Overlaps found in the schedule (figures affected):** " + "; ".join(cell(c, 200) for c in clashes[:6])
    )
    return ["### Schedule", ""] + text + [""] + table(["from s", "to s", "lane", "what", "GPU use"], rows)


def bench_missing(res):
    items = (res.get("not_measured") or {}).get("items") or []
    if not items:
        return []
    return ["### Not measured", ""] + [f"- {cell(i.get('what'), 120)}: {cell(i.get('why'), 240)}" for i in items]


def model_validations(res, model):
    """gpu-bench's validations of `model`, by batch: `validate_<model>` (the first batch, 1 unless
    --validate-batches says otherwise) and `validate_<model>_b<B>` for the others."""
    found = [res[k] for k in res if isinstance(res.get(k), dict) and
             (k == f"validate_{model}" or re.fullmatch(rf"validate_{re.escape(model)}_b\d+", k))]
    return sorted(found, key=lambda v: v.get("batch") or 1)


def bench_commands(res):
    plan = res.get("plan") or {}
    lines = []
    for m in plan.get("models") or []:
        e = res.get(f"export_{m}") or {}
        if e.get("path"):
            lines.append(f"python3 scripts/gpu/export_torchvision.py {m} {shell_join([e['path']])} --opset "
                         f"{e.get('opset_requested', 17)} --max-ir-version 10")
    for m in plan.get("models") or []:
        for key in (f"compile_pre_{m}", f"profile_build_{m}", f"profile_{m}", f"compile_{m}", f"bench_onnx2ait_{m}"):
            if (res.get(key) or {}).get("command"):
                lines.append(shell_join(res[key]["command"]))
        for v in model_validations(res, m):
            runs = v.get("runs") or []
            if runs and runs[0].get("command"):
                c = list(runs[0]["command"])
                if "--seed" in c:
                    i = c.index("--seed")
                    c = c[:i] + ["--seed", "$S"] + c[i + 2:]
                lines.append(" ".join(shell_join([x]) if x != "$S" else x for x in c)
                             + f"   # S = 0..{len(v.get('seeds') or [1]) - 1}")
        if (res.get(f"bench_torch_{m}") or {}).get("command"):
            lines.append("python3 scripts/gpu/" + shell_join(res[f"bench_torch_{m}"]["command"]))
        for b in plan.get("compile_batches") or []:
            rec = tc_record(res, m, b)
            if rec.get("command"):
                lines.append("python3 scripts/gpu/" + shell_join(rec["command"]))
    if not lines:
        return []
    return ["### Commands", "", "```"] + lines + ["```"]


def render_bench_section(res):
    env = res.get("env") or {}
    commit = env.get("commit", "unknown commit")
    short = re.sub(r"^([0-9a-f]{12})[0-9a-f]{28}", r"\1", commit)
    head = f"## {env.get('date_utc', 'unknown date')} · {env.get('gpu', 'unknown GPU')} · `{short}` · {bench_verdict(res)}"
    plan = res.get("plan") or {}
    parts = [[head, ""] + bench_env(res)]
    parts += [bench_model_section(res, m) for m in plan.get("models") or []]
    parts += [
        [
            "Ratios: peer median ms ÷ onnx2ait median ms with CUDA graph replay, in the same run; above 1 means onnx2ait "
            "is faster."
        ],
        bench_targets(res),
        bench_build_times(res),
        bench_sweep(res),
        bench_schedule(res),
        bench_missing(res),
        section_steps(res),
        bench_commands(res),
    ]
    lines = []
    for p in parts:
        if p:
            lines += p + [""]
    return "\n".join(lines).rstrip() + "\n"


def render_section(res):
    if is_bench_run(res):
        return render_bench_section(res)
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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", help="the run's results.json")
    p.add_argument("--out", required=True)
    p.add_argument("--previous", help="the BENCHMARKS.md whose store this run updates (default: none, a new store)")
    p.add_argument("--migrate", metavar="OLD", help="write --out from a BENCHMARKS.md of the older format (one section "
                   "per run, newest first): the latest figure of every benchmark, with its run")
    p.add_argument("--print-section", action="store_true", help="also print the new section")
    a = p.parse_args()
    if bool(a.results) == bool(a.migrate):
        p.error("give --results or --migrate")
    if a.migrate:
        with open(a.migrate) as f:
            bench_store.write(a.out, bench_store.migrate(f.read()))
        return 0
    with open(a.results) as f:
        res = json.load(f)
    section = render_section(res)
    bench_store.record_run(a.previous if a.previous and os.path.isfile(a.previous) else None, a.out, section)
    if a.print_section:
        print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
