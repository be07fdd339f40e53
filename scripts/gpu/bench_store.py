#!/usr/bin/env python3
"""The latest figure of every benchmark, kept inside BENCHMARKS.md, and BENCHMARKS.md rendered from it.

BENCHMARKS.md ends with a fenced JSON block, the store: the runs whose figures are still the
latest for some benchmark (date, GPU, commit, command) and one record per benchmark:

    latency     (model, GPU, onnx2ait build, seq, batch): per engine (onnx2ait CUDA graph, onnx2ait
                plain launches, PyTorch eager, PyTorch + CUDA graph, torch.compile) its median ms and run
    builds      (model, GPU, onnx2ait build, seq, step): wall seconds, detail, run
    validation  (model, GPU, onnx2ait build, seq, batch, output): rel err, top-1, result, run
    bundled     (bundled model): result, rel err, top-1, compile time, note, run
    rowwise     (GPU, op, K): the softmax / layernorm bandwidth sweep of scripts/gpu/bench_rowwise.py,
                onnx2ait's, torch's and the copy rate in TB/s, and run (one row per GPU, so a
                sweep on one GPU does not replace another's)

The GPU is part of every figure's key (format 2): a run on an H100 replaces the H100's figures and
keeps the H200's, so a target stated for one GPU keeps its latest figure there. A store of format 1
(no GPU in the keys) is upgraded on load: each record takes its run's GPU, and a latency row whose
engines come from runs on two GPUs becomes one row per GPU.

Each kept run's own section (the full report the writer rendered for it: build, validation,
per-kernel tables, kernel sweep, schedule, commands) is kept too, between <!-- run ID --> markers.

The writers (write_benchmarks.py, write_transformer_benchmarks.py) render a run's section as they
always did, read its figures back from that section (`parse_section`), and `apply` them: every
figure the run measured replaces the stored one of the same benchmark and engine; every other
benchmark keeps its latest figure and names the run it comes from. Runs no figure refers to any
more are dropped, except the latest run of each script (so a run that measured nothing still
shows). Older figures are in git: `git log -p BENCHMARKS.md`. Nothing here is typed by hand: the
store is written only from runs' sections, and `migrate` builds it from a BENCHMARKS.md of the
older format (every run a section, newest first) by applying its sections oldest first.
Standard library only.
"""
import json
import re

TITLE = "# Benchmarks"
DASH = "—"
STORE_HEAD = "## Store"
STORE_NOTE = ("<!-- The figures above, machine-readable: written by scripts/gpu/bench_store.py from runs' "
              "results; do not edit. -->")
FORMAT = 2

MODELS = {  # model -> (title, order)
    "resnet50": ("ResNet-50 (torchvision `resnet50`)", 0),
    "mobilenet_v2": ("MobileNetV2 (torchvision `mobilenet_v2`)", 1),
    "bert": ("BERT-base (Hugging Face `BertModel`, 12 layers, hidden 768)", 2),
    "vit": ("ViT-B/16 (torchvision `vit_b_16`)", 3),
}
ENGINES = ("onnx2ait", "onnx2ait_plain", "eager", "cuda_graph", "torch_compile")
ENGINE_TITLES = {"onnx2ait": "onnx2ait (CUDA graph)", "onnx2ait_plain": "onnx2ait (plain launches)",
                 "eager": "PyTorch eager", "cuda_graph": "PyTorch + CUDA graph", "torch_compile": "torch.compile"}
SCRIPTS = ("gpu-bench", "gpu-check", "gpu-transformers")


# --- markdown helpers ---------------------------------------------------------------------------


def split_cells(line):
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", s)]


def cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


def blocks(text):
    """The section's tables, each as (heading, header, rows, notes): heading is the last '###'
    (or deeper) heading above the table, notes the '- ' lines after the table up to the next
    heading. Code fences are skipped."""
    lines = text.splitlines()
    out, heading, fence, i = [], "", False, 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fence = not fence
        elif not fence and line.startswith("#"):
            heading = line.lstrip("#").strip()
        elif not fence and line.startswith("|") and i + 1 < len(lines) and re.match(r"^\|(-+\|)+\s*$", lines[i + 1]):
            header = split_cells(line)
            j, rows = i + 2, []
            while j < len(lines) and lines[j].startswith("|"):
                rows.append(split_cells(lines[j]))
                j += 1
            notes, k = [], j
            while k < len(lines) and not lines[k].startswith("#"):
                if lines[k].startswith("- "):
                    notes.append(lines[k][2:])
                k += 1
            out.append((heading, header, [dict(zip(header, r)) for r in rows], notes))
            i = j
            continue
        i += 1
    return out


def demote(text, by=1):
    """Headings one level deeper (outside code fences); promote with by=-1."""
    out, fence = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            line = "#" * by + line if by > 0 else line[-by:]
        out.append(line)
    return "\n".join(out).rstrip() + "\n"


def number(text):
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)", text or "")
    return float(m.group(1)) if m else None


def ms(v):
    if v is None:
        return DASH
    return f"{v:.3f}" if v < 10 else f"{v:.2f}"


# --- reading a run's section --------------------------------------------------------------------


def run_meta(text):
    head = next((l for l in text.splitlines() if l.startswith("## ")), "")
    parts = head[3:].split(" · ")
    date = parts[0] if parts else "unknown date"
    gpu = parts[1] if len(parts) > 1 else "unknown GPU"
    short = parts[2].strip("`") if len(parts) > 2 else "unknown"
    verdict = " · ".join(parts[3:])
    commit = re.search(r"^- Commit: `([^`]*)`", text, re.M)
    command = re.search(r"^- Command: `([^`]*)`", text, re.M)
    if "transformers" in verdict:
        script = "gpu-transformers"
    elif verdict.startswith("benchmark"):
        script = "gpu-bench"
    else:
        script = "gpu-check"
    m = re.match(r"(\d{4}-\d\d-\d\d) (\d\d):(\d\d)", date)
    stamp = f"{m.group(1)}T{m.group(2)}{m.group(3)}Z" if m else re.sub(r"\W+", "-", date)
    return {"id": f"{stamp}-{short}", "date": date, "gpu": gpu, "commit": commit.group(1) if commit else short,
            "command": command.group(1) if command else f"scripts/{script}.sh", "script": script, "verdict": verdict}


def kernels_variant(text):
    """onnx2ait's kernel choice, from a build description or a compile command line."""
    t = text or ""
    # A profile stopped before it timed every problem: its label names the heuristic too, for
    # the choices it made.
    if "partly profiled" in t:
        return "partly profiled kernels"
    if "heuristic" in t or "--no-profile" in t:
        return "heuristic kernels"
    if "profiled" in t or "--profile" in t:
        return "profiled kernels"
    # No flag: gpu-check passes --profile-cache or --no-profile since the profiler exists; the
    # commits before it had the heuristic only.
    return "heuristic kernels"


def engine_of(column):
    c = column.strip()
    if c in ("onnx2ait (graph replay)", "onnx2ait (CUDA graph)", "onnx2ait (graph)"):
        return "onnx2ait", None
    if c == "onnx2ait (plain launches)":
        return "onnx2ait_plain", None
    if c == "PyTorch eager":
        return "eager", None
    if c == "PyTorch + CUDA graph":
        return "cuda_graph", None
    if c.startswith("torch.compile ") and "÷" not in c:
        return "torch_compile", c[len("torch.compile "):]
    return None, None


def latency_cells(row):
    cells = {}
    for col, val in row.items():
        eng, mode = engine_of(col)
        v = number(val)
        if eng and v is not None:
            cells[eng] = {"ms": v}
            if mode:
                cells[eng]["mode"] = mode
    return cells


def result_of(text):
    t = text.replace("**", "").strip()
    return t.split(" (")[0] if t.startswith("FAILED") else t


def parse_section(text):
    """The figures of one run's section (as rendered by the writers): {"meta", "latency",
    "builds", "validation", "bundled", "rowwise", "details"}; keys of records without their run."""
    meta = run_meta(text)
    run = {"meta": meta, "latency": [], "builds": [], "validation": [], "bundled": [], "rowwise": [],
           "details": text.rstrip() + "\n"}
    if meta["script"] == "gpu-transformers":
        parse_transformers(text, run)
        run["rowwise"] = parse_rowwise(text, meta)
    else:
        parse_cnn(text, meta["script"], run)
    return run


def parse_cnn(text, script, run):
    compile_line = re.search(r"^`onnx2ait compile MODEL -o OUT([^`]*)`", text, re.M)
    check_variant = kernels_variant(compile_line.group(1) if compile_line else "")
    bench_variants = {}
    for heading, header, rows, notes in blocks(text):
        m = re.search(r"\(torchvision `(\w+)`\), median ms", heading)
        if m:  # gpu-bench: one table per model, its facts below
            model = m.group(1)
            built = next((n for n in notes if n.startswith("onnx2ait build benchmarked: ")), "")
            variant = kernels_variant(built) if built else "profiled kernels"
            bench_variants[model] = variant
            for r in rows:
                cells = latency_cells(r)
                if cells and number(r.get("batch")) is not None:
                    run["latency"].append({"model": model, "build": variant, "seq": None,
                                           "batch": int(number(r["batch"])), "cells": cells})
            for n in notes:
                v = re.match(r"validation at batch (\d+) against ONNX Runtime \((\d+) seeds\): rel err (\S+?), "
                             r"top-1 (\S+?)(?:, bound (\S+?))?(?: \(.*\))?: (.*)$", n)
                if v:
                    run["validation"].append({"model": model, "build": variant, "seq": None, "batch": int(v.group(1)),
                                              "output": DASH, "seeds": int(v.group(2)), "rel_err": v.group(3),
                                              "top1": v.group(4), "bound": v.group(5) or DASH,
                                              "result": result_of(v.group(6))})
            continue
        m = re.match(r"Latency: torchvision (\w+), median ms", heading)
        if m:  # gpu-check
            for r in rows:
                cells = latency_cells(r)
                if cells and number(r.get("batch")) is not None:
                    run["latency"].append({"model": m.group(1), "build": check_variant, "seq": None,
                                           "batch": int(number(r["batch"])), "cells": cells})
            continue
        if heading.startswith("Validation of the ResNet-50 build") and "GPU rel err" in header:
            for r in rows:
                if number(r.get("batch")) is None or r.get("GPU rel err") in (None, DASH):
                    continue
                run["validation"].append({"model": "resnet50", "build": check_variant, "seq": None,
                                          "batch": int(number(r["batch"])), "output": DASH,
                                          "seeds": int(number(r.get("seeds")) or 0), "rel_err": r["GPU rel err"],
                                          "top1": r.get("GPU top-1", DASH), "bound": DASH,
                                          "result": result_of(r.get("result", DASH))})
            continue
        if heading == "Build" and "wall time" in header:
            for r in rows:
                secs = number(r.get("wall time"))
                if secs is None or r.get("result") != "ok":
                    continue
                # "warm profile cache, 13 objects from the profiler's object cache": the count is a
                # detail, not another benchmark.
                step = re.sub(r", \d+ objects from", ", objects from", r["build"])
                run["builds"].append({"model": "resnet50", "build": check_variant, "seq": None,
                                      "step": f"onnx2ait compile: {step}", "seconds": secs,
                                      "detail": f"{r.get('sources compiled', '?')} sources compiled, "
                                                f"{r.get('from cache', '?')} from cache; gpu-check, nothing else running"})
            continue
        if heading.startswith("Build and compile times") and header and header[0] == "model":
            loaded = any("torch.compile batch" in h for h in header)
            for r in rows:
                model = r["model"].strip("`")
                for col in header[1:]:
                    secs = number(r.get(col))
                    if secs is None:
                        continue
                    rest = re.sub(r"^\s*[\d.]+ s,?\s*", "", r[col]).strip("() ")
                    load = ("under the load of concurrent torch.compile jobs and builds" if loaded
                            else "nothing else running")
                    run["builds"].append({"model": model, "build": bench_variants.get(model, "profiled kernels"),
                                          "seq": None, "step": col, "seconds": secs,
                                          "detail": "; ".join(x for x in (rest, f"gpu-bench, {load}") if x)})
            continue
        if heading == "Bundled models" and "model" in header:
            for r in rows:
                name = r.get("model", "").strip("`")
                if not name:
                    continue
                run["bundled"].append({"model": name, "result": r.get("result", DASH).replace("**", ""),
                                       "rel_err": r.get("GPU rel err", DASH), "top1": r.get("top-1", DASH),
                                       "compile": r.get("compile", DASH), "note": r.get("note", "")})


def parse_transformers(text, run):
    def model_variant(build, seq):
        # <model>_<exporter>[_seqrange<MAX>][_fusedattn][_profiled] (scripts/gpu-transformers.sh's
        # build names; seqrange<MAX>: one build with a run-time sequence length from 1 to MAX).
        model, _, rest = build.partition("_")
        parts = rest.split("_") if rest else []
        exporter = parts[0] if parts else "default"
        options = ""
        for p in parts[1:]:
            m = re.fullmatch(r"seqrange(\d+)", p)
            if m:
                options += f"run-time seq 1..{m.group(1)}, "
        options += "fused attention, " if "fusedattn" in parts[1:] else ""
        kernels = "profiled kernels" if "profiled" in parts[1:] else "heuristic kernels"
        # The same library timed under a run-time setting (--pdl-modes: <build>_pdl_<mode>;
        # --attention-warps: <build>_attnwarps<W>; --attention-rows: <build>_attnrows<R>): its own
        # row, never the default's.
        for i, p in enumerate(parts[1:], 1):
            if p == "pdl" and i + 1 < len(parts):
                kernels += f", O2A_PDL={'0' if parts[i + 1] == 'off' else parts[i + 1]}"
            m = re.fullmatch(r"attnwarps(\d+)", p)
            if m:
                kernels += f", O2A_ATTENTION_WARPS={m.group(1)}"
            m = re.fullmatch(r"attnrows(\d+)", p)
            if m:
                kernels += f", O2A_ATTENTION_ROWS={m.group(1)}"
        seq_v = int(seq) if number(seq) is not None else None
        return model, f"{exporter} export, {options}{kernels}", seq_v

    for heading, header, rows, notes in blocks(text):
        if heading.startswith("Builds") and "wall time" in header:
            for r in rows:
                secs = number(r.get("wall time"))
                if secs is None or r.get("result") != "ok":
                    continue
                model, variant, seq = model_variant(r["build"], r.get("seq"))
                k = re.search(r"(\d+) kernels", r.get("kernels", ""))
                c = re.search(r"(\d+) compiled, (\d+) cached", r.get("kernels", ""))
                run["builds"].append({"model": model, "build": variant, "seq": seq, "step": "onnx2ait compile",
                                      "seconds": secs, "detail": (f"{k.group(1)} kernels; " if k else "")
                                      + (f"{c.group(1)} objects compiled, {c.group(2)} from cache; " if c else "")
                                      + "gpu-transformers, nothing else running"})
        elif heading.startswith("Validation") and "GPU rel err" in header:
            for r in rows:
                if number(r.get("batch")) is None:
                    continue
                model, variant, seq = model_variant(r["build"], r.get("seq"))
                run["validation"].append({"model": model, "build": variant, "seq": seq, "batch": int(number(r["batch"])),
                                          "output": r.get("output", DASH), "seeds": 1, "rel_err": r["GPU rel err"],
                                          "top1": r.get("GPU top-1", DASH), "bound": "2e-2",
                                          "result": result_of(r.get("result", DASH))})
        elif heading.startswith("Latency") and "build" in header:
            for r in rows:
                cells = latency_cells(r)
                if cells and number(r.get("batch")) is not None:
                    model, variant, seq = model_variant(r["build"], r.get("seq"))
                    run["latency"].append({"model": model, "build": variant, "seq": seq,
                                           "batch": int(number(r["batch"])), "cells": cells})


ROWWISE_HEAD = "Softmax and layernorm bandwidth"


def parse_rowwise(text, meta):
    """The bandwidth sweep of a transformer run's section: the code block under its
    "Softmax and layernorm bandwidth" heading, as bench_rowwise.py prints it (op, K, rows,
    onnx2ait TB/s, torch TB/s, copy TB/s, kernel)."""
    m = re.search(r"^#+ " + re.escape(ROWWISE_HEAD) + r".*?\n```\n(.*?)^```", text, re.M | re.S)
    if not m:
        return []
    gpu = (meta.get("gpu") or "?").split(",")[0].strip()
    out = []
    for line in m.group(1).splitlines():
        f = line.split()
        if len(f) >= 6 and f[0] in ("softmax", "layernorm") and f[1].isdigit():
            out.append({"gpu": gpu, "op": f[0], "k": int(f[1]), "rows": int(f[2]), "onnx2ait_tbs": number(f[3]),
                        "torch_tbs": number(f[4]), "copy_tbs": number(f[5])})
    return out


# --- the store ----------------------------------------------------------------------------------

KEYS = {
    "latency": ("model", "gpu", "build", "seq", "batch"),
    "builds": ("model", "gpu", "build", "seq", "step"),
    "validation": ("model", "gpu", "build", "seq", "batch", "output"),
    "bundled": ("model",),
    "rowwise": ("gpu", "op", "k"),
}


def empty():
    return {"format": FORMAT, "runs": {}, "latency": [], "builds": [], "validation": [], "bundled": [], "rowwise": []}


def key_of(kind, rec):
    return tuple(rec.get(k) for k in KEYS[kind])


def apply(store, run):
    """Puts a run's figures in the store: each replaces the figure of the same benchmark (per
    engine for latency); everything else is kept. Returns the store."""
    rid = run["meta"]["id"]
    while rid in store["runs"] and store["runs"][rid].get("details") != run["details"]:
        rid += "+"
    meta = dict(run["meta"], id=rid, details=run["details"])
    store["runs"][rid] = meta
    gpu = gpu_name(meta)
    for kind in ("builds", "validation", "bundled", "rowwise"):
        store.setdefault(kind, [])
        index = {key_of(kind, r): i for i, r in enumerate(store[kind])}
        for rec in run.get(kind, []):
            if "gpu" in KEYS[kind]:
                rec = dict(rec, gpu=rec.get("gpu") or gpu)
            new = dict(rec, run=rid)
            k = key_of(kind, rec)
            if k in index:
                store[kind][index[k]] = new
            else:
                index[k] = len(store[kind])
                store[kind].append(new)
    index = {key_of("latency", r): r for r in store["latency"]}
    for rec in run["latency"]:
        rec = dict(rec, gpu=rec.get("gpu") or gpu)
        k = key_of("latency", rec)
        row = index.get(k)
        if row is None:
            row = {f: rec[f] for f in KEYS["latency"]}
            row["cells"] = {}
            index[k] = row
            store["latency"].append(row)
        for eng, c in rec["cells"].items():
            row["cells"][eng] = dict(c, run=rid)
    prune(store)
    return store


def prune(store):
    used = {r["run"] for kind in ("builds", "validation", "bundled", "rowwise") for r in store.get(kind, [])}
    used |= {c["run"] for r in store["latency"] for c in r["cells"].values()}
    latest = {}
    for rid, m in store["runs"].items():
        s = m.get("script")
        if s not in latest or order_key(m) > order_key(store["runs"][latest[s]]):
            latest[s] = rid
    used |= set(latest.values())
    store["runs"] = {k: v for k, v in store["runs"].items() if k in used}
    # Only the latest run of each script keeps its full report; the others keep their header and
    # environment (GPU, software, commit, command, models): git has the rest.
    for k, v in store["runs"].items():
        if k not in latest.values():
            v["details"] = summary(v["details"])


def summary(details):
    out = []
    for line in details.rstrip().splitlines():
        if line.startswith("### "):
            break
        out.append(line)
    text = "\n".join(out).rstrip()
    note = "- Full report: `git log -p BENCHMARKS.md`; only the figures still the latest are kept above."
    return text + ("" if text.endswith(note) else "\n" + note) + "\n"


def order_key(meta):
    return (meta.get("date", ""), meta.get("id", ""))


def sections_of(text):
    """The '## ' sections of a BENCHMARKS.md of the older format, newest first (code fences
    respected)."""
    out, cur, fence = [], None, False
    for line in text.splitlines():
        if line.startswith("```"):
            fence = not fence
        if not fence and line.startswith("## "):
            if cur is not None:
                out.append("\n".join(cur))
            cur = [line]
        elif cur is not None:
            cur.append(line)
    if cur is not None:
        out.append("\n".join(cur))
    return [s.rstrip() + "\n" for s in out]


def migrate(text):
    """A store built from a BENCHMARKS.md of the older format: its sections applied oldest first."""
    store = empty()
    runs = [parse_section(sec) for sec in reversed(sections_of(text))]
    for run in sorted(runs, key=lambda r: r["meta"]["date"]):  # stable: file order within a minute
        apply(store, run)
    return store


def load_text(text):
    """The store of a BENCHMARKS.md: its JSON block and the kept runs' sections; a file of the
    older format (no store) is migrated; an empty text gives an empty store."""
    m = re.search(r"^" + re.escape(STORE_HEAD) + r"\n.*?^```json\n(.*?)^```", text, re.M | re.S)
    if not m:
        return migrate(text) if text.strip() else empty()
    store = json.loads(m.group(1))
    if store.get("format") not in (1, FORMAT):
        raise SystemExit(f"BENCHMARKS.md: store format {store.get('format')} is neither 1 nor {FORMAT}")
    runs = {}
    for r in store["runs"]:
        d = re.search(rf"^<!-- run {re.escape(r['id'])} -->\n(.*?)^<!-- /run {re.escape(r['id'])} -->", text, re.M | re.S)
        details = demote(re.sub(r"^<a id=\"[^\"]*\"></a>\n\n?", "", d.group(1)), -1) if d else ""
        runs[r["id"]] = dict(r, details=details)
    store["runs"] = runs
    store.setdefault("rowwise", [])
    relabel_legacy_builds(store)
    if store["format"] == 1:
        upgrade_keys_by_gpu(store)
    return store


def upgrade_keys_by_gpu(store):
    """Format 1 → 2: the GPU of each record's run joins its key; a latency row whose engines come
    from runs on two GPUs splits into one row per GPU."""
    for kind in ("builds", "validation"):
        for rec in store.get(kind, []):
            rec["gpu"] = gpu_model(store, rec["run"])
    rows = []
    for row in store["latency"]:
        by_gpu = {}
        for eng, c in row["cells"].items():
            by_gpu.setdefault(gpu_model(store, c["run"]), {})[eng] = c
        for gpu, cells in by_gpu.items():
            rows.append(dict({f: row.get(f) for f in KEYS["latency"]}, gpu=gpu, cells=cells))
    store["latency"] = rows
    store["format"] = FORMAT


def relabel_legacy_builds(store):
    """Build labels stored before the transformer build names were parsed into options: the
    fused-attention build was filed as `<exporter>_fusedattn export, heuristic kernels`."""
    for kind in ("builds", "validation", "latency"):
        for rec in store.get(kind, []):
            m = re.fullmatch(r"(\w+?)_fusedattn export, (.*)", rec.get("build", ""))
            if m:
                rec["build"] = f"{m.group(1)} export, fused attention, {m.group(2)}"


def load(path):
    try:
        with open(path) as f:
            return load_text(f.read())
    except FileNotFoundError:
        return empty()


# --- rendering ----------------------------------------------------------------------------------


def anchor(rid):
    return "run-" + re.sub(r"[^a-z0-9-]", "-", rid.lower())


def run_link(store, rid):
    m = store["runs"].get(rid) or {}
    short = re.sub(r"^([0-9a-f]{12})[0-9a-f]{28}", r"\1", m.get("commit", "?"))
    date = m.get("date", "?").replace(" UTC", "")
    return f"[{date}, `{short}`](#{anchor(rid)})"


def gpu_name(meta):
    """The GPU of a run's meta without its driver version ("NVIDIA H200")."""
    return ((meta or {}).get("gpu") or "?").split(",")[0].strip()


def gpu_model(store, rid):
    """The GPU of a run without its driver version ("NVIDIA H200")."""
    return gpu_name(store["runs"].get(rid))


def sort_key(rec, *fields):
    return tuple((0, v) if isinstance(v, (int, float)) else (1, str(v)) for v in (rec.get(f) for f in fields))


def render_latency(store, model):
    rows = [r for r in store["latency"] if r["model"] == model]
    if not rows:
        return []
    has = {e for r in rows for e in r["cells"]}
    engines = [e for e in ENGINES if e in has]
    modes = sorted({c.get("mode") for r in rows for c in r["cells"].values() if c.get("mode")})
    seq = any(r.get("seq") is not None for r in rows)
    header = ["onnx2ait build", "GPU"] + (["seq"] if seq else []) + ["batch"]
    for e in engines:
        header.append(ENGINE_TITLES[e] + (" " + "/".join(modes) if e == "torch_compile" and modes else ""))
    peers = [e for e in ("eager", "cuda_graph", "torch_compile") if e in has]
    header += [f"{ENGINE_TITLES[e]} ÷ onnx2ait" for e in peers] + ["run"]
    out, crossed, other_gpu = [], False, False
    for r in sorted(rows, key=lambda r: sort_key(r, "build", "gpu", "seq", "batch")):
        cells = r["cells"]
        main = (cells.get("onnx2ait") or next(iter(cells.values())))["run"]
        line = ([r["build"], cell(r.get("gpu") or DASH)] + ([DASH if r.get("seq") is None else r["seq"]] if seq else [])
                + [r["batch"]])
        for e in engines:
            line.append(ms(cells[e]["ms"]) if e in cells else DASH)
        for e in peers:
            o, p = cells.get("onnx2ait"), cells.get(e)
            if o and p and gpu_model(store, o["run"]) != gpu_model(store, p["run"]):
                # Figures of two GPUs make no ratio.
                other_gpu = True
                line.append("other GPU")
            elif o and p and o["ms"] > 0:
                mark = "" if o["run"] == p["run"] else "†"
                crossed |= bool(mark)
                line.append(f"{p['ms'] / o['ms']:.2f}×{mark}")
            else:
                line.append(DASH)
        others = {}
        for e in engines:
            if e in cells and cells[e]["run"] != main:
                others.setdefault(cells[e]["run"], []).append(ENGINE_TITLES[e])
        line.append(run_link(store, main) + "".join(f"; {', '.join(es)}: {run_link(store, rid)}"
                                                    for rid, es in others.items()))
        out.append(line)
    text = ["### Latency, median ms", ""] + table(header, out) + [
        "", "Ratio = peer ms ÷ onnx2ait CUDA-graph ms: above 1 means onnx2ait is faster."
        + (" †: the two figures come from different runs (see the run column)." if crossed else "")
        + (" \"other GPU\": onnx2ait and the peer were measured on different GPUs (see the runs), so no ratio."
           if other_gpu else "")]
    return text


def render_builds(store, model):
    rows = [r for r in store["builds"] if r["model"] == model]
    if not rows:
        return []
    seq = any(r.get("seq") is not None for r in rows)
    body = []
    for r in sorted(rows, key=lambda r: sort_key(r, "build", "gpu", "seq", "step")):
        body.append([r["build"], cell(r.get("gpu") or DASH)] + ([DASH if r.get("seq") is None else r["seq"]] if seq else [])
                    + [cell(r["step"]), f"{r['seconds']:.1f} s", cell(r.get("detail", "")), run_link(store, r["run"])])
    header = ["onnx2ait build", "GPU"] + (["seq"] if seq else []) + ["step", "wall time", "detail", "run"]
    return ["### Build and compile times (wall clock)", ""] + table(header, body)


def render_validation(store, model):
    rows = [r for r in store["validation"] if r["model"] == model]
    if not rows:
        return []
    seq = any(r.get("seq") is not None for r in rows)
    outputs = any(r.get("output") not in (None, DASH) for r in rows)
    body = []
    for r in sorted(rows, key=lambda r: sort_key(r, "build", "gpu", "seq", "batch", "output")):
        body.append([r["build"], cell(r.get("gpu") or DASH)] + ([DASH if r.get("seq") is None else r["seq"]] if seq else [])
                    + [r["batch"]]
                    + ([r["output"]] if outputs else [])
                    + [r.get("seeds", DASH), r["rel_err"], r.get("top1", DASH), r.get("bound", DASH),
                       cell(r["result"]), run_link(store, r["run"])])
    header = (["onnx2ait build", "GPU"] + (["seq"] if seq else []) + ["batch"] + (["output"] if outputs else [])
              + ["seeds", "GPU rel err", "top-1", "bound", "result", "run"])
    return ["### Validation against ONNX Runtime (CPU, fp32)", "",
            "Rel err = max |gpu − ort| / max |ort| (worst over seeds); top-1 = arg-max agreement with ONNX Runtime.",
            ""] + table(header, body)


def render_bundled(store):
    rows = store["bundled"]
    if not rows:
        return []
    counts = {}
    for r in rows:
        counts[r["result"]] = counts.get(r["result"], 0) + 1
    body = [[f"`{r['model']}`", r["result"] if r["result"] == "pass" else f"**{r['result']}**", r["rel_err"],
             r.get("top1", DASH), cell(r.get("compile", DASH)), cell(r.get("note", "")), run_link(store, r["run"])]
            for r in sorted(rows, key=lambda r: r["model"])]
    return ["## Bundled models", "",
            "Each model of onnx_models/ compiled to a fresh folder and validated once (seed 0) against ONNX Runtime "
            "(scripts/gpu-check.sh); \"unsupported\" is exit code 2. Totals: "
            + ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1])) + ".", ""] + table(
        ["model", "result", "GPU rel err", "top-1", "compile", "note", "run"], body)


def render_rowwise(store):
    rows = sorted(store.get("rowwise", []), key=lambda r: sort_key(r, "gpu", "op", "k"))
    if not rows:
        return []
    tb = lambda v: DASH if v is None else f"{v:.2f}"
    body = [[cell(r["gpu"]), r["op"], str(r["k"]), str(r["rows"]), tb(r["onnx2ait_tbs"]), tb(r["torch_tbs"]),
             tb(r["copy_tbs"]), DASH if not r["copy_tbs"] or r["onnx2ait_tbs"] is None
             else f"{r['onnx2ait_tbs'] / r['copy_tbs']:.0%}", run_link(store, r["run"])] for r in rows]
    return [f"## {ROWWISE_HEAD}", "",
            "scripts/gpu/bench_rowwise.py (`scripts/gpu-transformers.sh --rowwise`): fp16 `[rows, K]` tensors of 64 Mi "
            "elements through onnx2ait's softmax and layernorm kernels, `torch.softmax` / `layer_norm` and a device "
            "copy, in TB/s of bytes read and written over the kernel time; the latest sweep of each GPU.", ""] + table(
        ["GPU", "op", "K", "rows", "onnx2ait TB/s", "torch TB/s", "copy TB/s", "onnx2ait ÷ copy", "run"], body)


def store_json(store):
    """The JSON block: one record per line, so that a run's diff shows which figures it replaced."""
    runs = sorted(({k: v for k, v in m.items() if k != "details"} for m in store["runs"].values()),
                  key=order_key, reverse=True)
    parts = ['{"format": %d,' % FORMAT]
    for i, (name, items) in enumerate((("runs", runs),) + tuple((k, store[k]) for k in KEYS)):
        lines = ",\n  ".join(json.dumps(x, ensure_ascii=False, sort_keys=True) for x in items)
        end = "," if i < len(KEYS) else ""
        parts.append(f' "{name}": [\n  {lines}\n ]{end}' if items else f' "{name}": []{end}')
    return "\n".join(parts) + "}\n"


def render(store):
    models = sorted({r["model"] for k in ("latency", "builds", "validation") for r in store[k]},
                    key=lambda m: (MODELS.get(m, (m, 99))[1], m))
    runs = sorted(store["runs"].values(), key=order_key, reverse=True)
    toc = [f"[{MODELS.get(m, (m,))[0].split(' (')[0]}](#{re.sub(r'[^a-z0-9_-]', '', MODELS.get(m, (m,))[0].lower().replace(' ', '-'))})"
           for m in models]
    out = [
        TITLE, "",
        "The latest figure of every benchmark the GPU scripts measure (scripts/gpu-check.sh, scripts/gpu-bench.sh, "
        "scripts/gpu-transformers.sh) on each GPU, one section per model: onnx2ait next to PyTorch eager, PyTorch + CUDA graph and "
        "torch.compile where measured, build times and validation. Every row names the run it comes from; the runs "
        "(date, GPU, commit, command, and each run's full report) are listed under [Runs](#runs).",
        "",
        "Written by scripts/gpu/write_benchmarks.py and scripts/gpu/write_transformer_benchmarks.py from the store at the "
        "end of this file; do not edit. A run replaces the figures of the benchmarks it measured and keeps the others. "
        "Earlier figures: `git log -p BENCHMARKS.md`.",
        "",
        "Models: " + " · ".join(toc + ["[Bundled models](#bundled-models)" if store["bundled"] else ""]
                                + ["[Softmax and layernorm bandwidth](#softmax-and-layernorm-bandwidth)"
                                   if store.get("rowwise") else ""]).strip(" ·"),
        "",
    ]
    for m in models:
        out += [f"## {MODELS.get(m, (m,))[0]}", ""]
        for part in (render_latency(store, m), render_builds(store, m), render_validation(store, m)):
            if part:
                out += part + [""]
    if store["bundled"]:
        out += render_bundled(store) + [""]
    if store.get("rowwise"):
        out += render_rowwise(store) + [""]
    out += ["## Runs", "", "The runs the figures above come from (and the latest run of each script), newest first.", ""]
    out += table(["run", "GPU", "commit", "command", "result"],
                 [[run_link(store, r["id"]), cell(r["gpu"]), f"`{r['commit']}`", f"`{cell(r['command'])}`",
                   cell(r["verdict"])] for r in runs])
    out.append("")
    for r in runs:
        out += [f"<!-- run {r['id']} -->", f'<a id="{anchor(r["id"])}"></a>', "", demote(r["details"]).rstrip(),
                f"<!-- /run {r['id']} -->", ""]
    out += [STORE_HEAD, "", STORE_NOTE, "", "```json", store_json(store).rstrip(), "```"]
    return "\n".join(out).rstrip() + "\n"


def write(path, store):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(render(store))
    import os
    os.replace(tmp, path)


def restore_rowwise(store, old_text, rid):
    """Files the bandwidth sweep of run `rid` of an earlier BENCHMARKS.md (from git) in `store`:
    only its rowwise figures, under its own run (date, GPU, commit, command), as the run's
    writer would have filed them had the store kept sweeps then. Returns the store."""
    m = re.search(rf"^<!-- run {re.escape(rid)} -->\n(.*?)^<!-- /run {re.escape(rid)} -->", old_text, re.M | re.S)
    if not m:
        raise SystemExit(f"run {rid} has no section in that file")
    section = demote(re.sub(r"^<a id=\"[^\"]*\"></a>\n\n?", "", m.group(1)), -1)
    run = parse_section(section)
    if not run["rowwise"]:
        raise SystemExit(f"run {rid} has no softmax / layernorm sweep")
    run = dict(run, latency=[], builds=[], validation=[], bundled=[])
    if rid in store["runs"]:  # the run is still listed: file the sweep under it, not as a new run
        run["details"] = store["runs"][rid]["details"]
    return apply(store, run)


def record_run(previous, out, section):
    """What a writer does with a new run's section: load the store of `previous` (a BENCHMARKS.md;
    migrated when of the older format), apply the section's figures, render `out`."""
    store = load(previous) if previous else empty()
    apply(store, parse_section(section))
    write(out, store)
    return store


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="Maintenance of the store of BENCHMARKS.md (the writers record runs).")
    ap.add_argument("--restore-rowwise", nargs=2, metavar=("OLD_BENCHMARKS_MD", "RUN_ID"),
                    help="file the softmax / layernorm sweep of a run of an earlier BENCHMARKS.md (git show REV:BENCHMARKS.md)")
    ap.add_argument("--previous", required=True, help="the BENCHMARKS.md to update")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    st = load(a.previous)
    if a.restore_rowwise:
        with open(a.restore_rowwise[0]) as f:
            restore_rowwise(st, f.read(), a.restore_rowwise[1])
    write(a.out, st)
