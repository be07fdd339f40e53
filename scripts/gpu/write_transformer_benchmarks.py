#!/usr/bin/env python3
"""Writes the transformer section of BENCHMARKS.md from scripts/gpu-transformers.sh's results.

    write_transformer_benchmarks.py RESULTS.jsonl --previous BENCHMARKS.md --out BENCHMARKS.md
        --commit SHA --command TEXT

RESULTS.jsonl holds one JSON record per line (kind: export, build, validate, outside_range, bench, torch). The
run's section is rendered from the records; its figures (builds, validation, latency, and the
softmax / layernorm sweep of --rowwise, kept per GPU) replace those of the same benchmarks in the
store of --previous, every other benchmark keeps its latest
figure, and --out is rendered from the store (scripts/gpu/bench_store.py). The section itself is
kept whole as the latest transformer run's report. Every figure comes from the records; a step
that did not run or failed says so.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess

import bench_store


def load(path):
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    recs.append(json.loads(line))
                except json.JSONDecodeError as e:
                    recs.append({"kind": "broken", "error": str(e), "line": line[:200]})
    return recs


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:  # no nvidia-smi: the section says unknown
        return "unknown GPU"


def fmt(v, spec=".3f"):
    return "—" if v is None else format(v, spec)


def seq_of(rec):
    """The sequence length of a BERT record; ViT has none (its builds take --seq2 only by position)."""
    return rec["seq"] if rec["name"].startswith("bert") else "—"


MODEL_TEXT = {
    "bert": "Hugging Face `BertModel` (bert-base shape: 12 layers, hidden 768, 12 heads)",
    "vit": "torchvision `vit_b_16`",
}


def models_text(recs):
    """The models this run exported, described (both when the run has no export record)."""
    run = sorted({r["model"] for r in recs if r["kind"] == "export"}) or sorted(MODEL_TEXT)
    return " and ".join(MODEL_TEXT.get(m, f"`{m}`") for m in run)


def choice_text(recs):
    """How the builds chose their kernels: profiled builds are named <build>_profiled."""
    names = [r["name"] for r in recs if r["kind"] == "build"]
    profiled = [n for n in names if n.endswith("_profiled")]
    if profiled and len(profiled) == len(names):
        return "kernels chosen by profiling on this GPU (`compile --profile`)"
    if profiled:
        return "the heuristic kernel choice, and those named *_profiled with kernels chosen by profiling on this GPU"
    return "the heuristic kernel choice (no profile)"


def section(recs, commit, command, when=None, gpu=None, regenerated=None):
    now = when or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    gpu = gpu or gpu_name()
    lines = [f"## {now} · {gpu.split(',')[0]} · `{commit[:12]}` · transformers (scripts/gpu-transformers.sh)", ""]
    lines += [f"- GPU: {gpu}" + ("" if regenerated else f"; Python {platform.python_version()}"),
              f"- Commit: `{commit}`", f"- Command: `{command}`",
              f"- Models: {models_text(recs)}, random weights of torch.manual_seed(0), fp32 ONNX; onnx2ait builds "
              f"with {choice_text(recs)}, fp16 compute with fp32 accumulation."]
    if regenerated:
        lines.append(f"- {regenerated}")
    lines.append("")
    exports = [r for r in recs if r["kind"] == "export"]
    lines += ["### Exports", "", "| model | exporter | opset | nodes | ORT vs PyTorch (CPU, fp32) | result |", "|---|---|---|---|---|---|"]
    for r in exports:
        m = r.get("meta") or {}
        lines.append(f"| {r['model']} | {r['exporter']} | {m.get('opset', '—')} | {m.get('nodes', '—')} | "
                     f"{fmt(m.get('ort_vs_torch'), '.2g')} | {'ok' if m.get('ok') else 'FAILED: ' + str(m.get('error'))} |")
    lines += ["", "### Builds", "", "| build | seq | wall time | result | kernels |", "|---|---|---|---|---|"]
    for r in recs:
        if r["kind"] == "build":
            lines.append(f"| {r['name']} | {seq_of(r)} | {r['seconds']:.1f} s | {'ok' if r['rc'] == 0 else 'FAILED'} | "
                         f"{r.get('generated', '')} |")
    lines += ["", "### Validation on the GPU against ONNX Runtime (CPU, fp32)", "",
              "Rel err = max |gpu − ort| / max |ort| per output (bound 2e-2, `--gpu-rtol 2e-2`); top-1 for logits.", "",
              "| build | seq | batch | output | GPU rel err | GPU top-1 | CPU reference rel err | result |", "|---|---|---|---|---|---|---|---|"]
    degenerate = set()
    for r in recs:
        if r["kind"] != "validate":
            continue
        rep = r.get("report")
        if not rep:
            lines.append(f"| {r['name']} | {seq_of(r)} | {r['batch']} | — | — | — | — | FAILED (no report) |")
            continue
        for o in rep["outputs"]:
            by = {x["engine"]: x for x in o["results"]}
            g, c = by.get("gpu", {}), by.get("reference", {})
            t = g.get("top1")
            top1 = f"{t['agree']}/{t['rows']}" if isinstance(t, dict) else "—"
            status = g.get("status", "—")
            scale = g.get("ref_max_abs")
            if scale is not None and not scale > 1e-2:
                # All (near) zeros: any engine passes; say so instead of claiming a pass.
                status = f"not meaningful: max \\|ort\\| = {scale:.2g}"
                degenerate.add(r["name"])
            lines.append(f"| {r['name']} | {seq_of(r)} | {r['batch']} | {o['name']} | {fmt(g.get('rel_to_max'), '.2e')} | "
                         f"{top1} | {fmt(c.get('rel_to_max'), '.2e')} | {status} |")
    if degenerate:
        lines += ["", f"- {', '.join(sorted(degenerate))}: ONNX Runtime's output is all zeros, so the comparison proves "
                  "nothing (torchvision initialises vit_b_16's classifier head to zeros; export_transformers.py gives "
                  "the head N(0, 0.02) weights since this run)."]
    outside = [r for r in recs if r["kind"] == "outside_range"]
    if outside:
        lines += ["", "### A sequence length outside the compiled range", "",
                  "| build | seq | exit code | result |", "|---|---|---|---|"]
        for r in outside:
            lines.append(f"| {r['name']} | {r['seq']} | {r['rc']} | {'refused (ok)' if r['rc'] != 0 else 'ACCEPTED (wrong)'} |")
    torch = {r["model"]: r.get("result") or {} for r in recs if r["kind"] == "torch"}
    # torch.compile's column only when the run timed it (--torch-compile); its mode in the header
    # (bench_store reads "torch.compile MODE" as that engine).
    tc_modes = sorted({(b.get("torch_compile") or {}).get("mode") for t in torch.values()
                       for b in (t.get("batches") or {}).values()} - {None})
    tc_head = f" torch.compile {'/'.join(tc_modes)} | torch.compile ÷ onnx2ait |" if tc_modes else ""
    lines += ["", "### Latency (median ms; CUDA graph replay for both; ratio = PyTorch CUDA graph / onnx2ait)", "",
              "| build | seq | batch | onnx2ait (graph) | onnx2ait (plain launches) | PyTorch eager | PyTorch + CUDA graph | ratio |"
              + tc_head, "|---|---|---|---|---|---|---|---|" + ("---|---|" if tc_modes else "")]
    # One line per (model, note), naming the batches it applies to (the same note otherwise repeats
    # for every batch and every build of the model).
    notes = {}
    for r in recs:
        if r["kind"] != "bench":
            continue
        model = r["name"].split("_")[0]
        peer_run = torch.get(model) or {}
        # A peer at another sequence length is no peer: BERT's second build runs at --seq2.
        same_seq = model != "bert" or peer_run.get("seq") == r["seq"]
        peer = peer_run.get("batches", {}) if same_seq else {}
        for b in r.get("result") or []:
            p = peer.get(str(b["batch"]), {})
            eager = (p.get("eager") or {}).get("median_ms")
            graph = (p.get("cuda_graph") or {}).get("median_ms")
            ours = b.get("graph_median_ms")
            ratio = f"{graph / ours:.2f}×" if graph and ours else "—"
            if p.get("cuda_graph_note"):
                batches = notes.setdefault((model, p["cuda_graph_note"]), [])
                if b["batch"] not in batches:
                    batches.append(b["batch"])
            tc_cells = ""
            if tc_modes:
                tc = (p.get("torch_compile") or {}).get("median_ms")
                tc_cells = f" {fmt(tc)} | {f'{tc / ours:.2f}×' if tc and ours else '—'} |"
            lines.append(f"| {r['name']} | {r['seq'] if model == 'bert' else '—'} | {b['batch']} | {fmt(ours)} | "
                         f"{fmt(b.get('median_ms'))} | {fmt(eager)} | {fmt(graph)} | {ratio} |" + tc_cells)
    if notes:
        lines += [""] + [f"- PyTorch {model} batch {', '.join(map(str, batches))}: {note}"
                         for (model, note), batches in notes.items()]
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("--previous", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default="unknown")
    p.add_argument("--command", default="scripts/gpu-transformers.sh")
    p.add_argument("--kernel-times", nargs="*", default=[], help="`onnx2ait bench --kernels` outputs to include")
    p.add_argument("--rowwise", help="bench_rowwise.py's table (softmax / layernorm bandwidth) to include")
    p.add_argument("--when", help="the run's time (default now)")
    p.add_argument("--gpu", help="the run's GPU (default: nvidia-smi here)")
    p.add_argument("--regenerated", help="a note that the section was written again from a run's results")
    a = p.parse_args()
    new = section(load(a.results), a.commit, a.command, a.when, a.gpu, a.regenerated)
    if a.rowwise and os.path.exists(a.rowwise):
        new += ("\n### Softmax and layernorm bandwidth (scripts/gpu/bench_rowwise.py: fp16 [rows, K], 64 Mi elements, "
                "read + write bytes / kernel time)\n\n```\n" + open(a.rowwise).read().strip() + "\n```\n")
    for path in a.kernel_times:
        if os.path.exists(path):
            name = os.path.basename(path).removeprefix("kernels_").removesuffix(".txt")
            new += f"\n### Where the time goes: {name} (`onnx2ait bench --kernels`)\n\n```\n{open(path).read().strip()}\n```\n"
    bench_store.record_run(a.previous if os.path.exists(a.previous) else None, a.out, new)
    print(new)


if __name__ == "__main__":
    main()
