#!/usr/bin/env python3
"""Times a transformer in PyTorch on the GPU: eager and CUDA graph replay, fp16. The peer of
`onnx2ait bench` in scripts/gpu-transformers.sh, measured in the same run on the same GPU.

    bench_transformers.py MODEL [--size base] [--batch 1,8,32] [--seq 128] [--warmup 10]
        [--iters 50] [--compile max-autotune --compile-batch 1,32] [--json-out FILE]

MODEL is `bert` or `vit`, built by export_transformers.py's specs (the weights of
torch.manual_seed(0), so the same weights as the ONNX export onnx2ait compiles), in fp16 on the
GPU, under torch.inference_mode(). BERT's inputs: random token ids and an all-ones attention mask
of [batch, seq]; ViT's: random [batch, 3, 224, 224] images. For each batch: `--warmup` untimed
runs, then `--iters` runs each timed with a pair of CUDA events; the median is reported (and min,
p90). CUDA graph: captured on a side stream after the eager warm-up, each timed replay on the
graph's static inputs. torch.compile (--compile MODE, at the --compile-batch batches, default
all): `torch.compile(model, mode=MODE)` of the same fp16 module, its first calls (compilation,
autotuning; max-autotune also records its CUDA graphs there) untimed and reported as
compile_seconds, then timed like eager. A compile that fails is reported, not fatal.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_transformers  # noqa: E402  (the model specs: same weights as the export)


def timed(torch, fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return {"median_ms": statistics.median(times), "min_ms": times[0], "p90_ms": times[int(0.9 * (len(times) - 1))]}


def capture(torch, forward):
    """A CUDA graph of one call of `forward` (warmed up on a side stream first), or (None, why)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(side):
            for _ in range(3):
                forward()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            forward()
        return graph, None
    except Exception as e:  # report and let the caller decide
        print(f"bench_transformers: CUDA graph capture failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        torch.cuda.synchronize()
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def compile_timed(torch, compiled, args, mode, warmup, iters):
    """torch.compile's time at one batch: the first calls (compilation for this shape) untimed
    and reported as compile_seconds, then `timed`; a failure is reported in the result."""
    try:
        with torch.no_grad():
            t0 = time.time()
            for _ in range(3):
                compiled(*args)
            torch.cuda.synchronize()
            seconds = time.time() - t0
            result = timed(torch, lambda: compiled(*args), warmup, iters)
        return dict(result, mode=mode, compile_seconds=seconds)
    except Exception as e:  # report it with the other figures: the peer could not run
        torch.cuda.synchronize()
        return {"mode": mode, "error": f"{type(e).__name__}: {str(e)[:200]}"}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=("bert", "vit"))
    p.add_argument("--size", choices=("base", "tiny"), default="base")
    p.add_argument("--batch", default="1,8,32")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--compile", metavar="MODE", help="also time torch.compile(model, mode=MODE)")
    p.add_argument("--compile-batch", help="the batches torch.compile is timed at (default: every --batch)")
    p.add_argument("--json-out")
    a = p.parse_args()

    import torch

    spec = {"bert": export_transformers.BertSpec, "vit": export_transformers.VitSpec}[a.model](a.size)
    model = spec.wrap(torch, spec.build(torch)).half().cuda().eval()
    results = {"model": a.model, "size": a.size, "seq": a.seq if a.model == "bert" else None,
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "batches": {}}
    compile_batches = {int(b) for b in (a.compile_batch or a.batch).split(",")} if a.compile else set()
    compiled = torch.compile(model, mode=a.compile) if a.compile else None
    for batch in [int(b) for b in a.batch.split(",")]:
        args = spec.example(torch, batch, a.seq, seed=5)
        if a.model == "bert":
            args = (args[0], torch.ones_like(args[1]))
        args = tuple(x.cuda() if x.dtype == torch.int64 else x.half().cuda() for x in args)
        row = {}
        with torch.inference_mode():
            row["eager"] = timed(torch, lambda: model(*args), a.warmup, a.iters)
            graph, note = capture(torch, lambda: model(*args))
            if graph is None and a.model == "bert":
                # Some transformers versions make host tensors inside forward (a copy that capture
                # forbids) unless token types and positions are given, or test the mask on the host
                # (`mask.all()`, a sync). Try the explicit inputs first, then without the mask: the
                # peer then does less work, so its time is a lower bound of the masked run's and
                # the comparison stays conservative.
                ids, mask = args
                extra = dict(token_type_ids=torch.zeros_like(ids),
                             position_ids=torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids))
                # A 4-D additive mask [B, 1, S, S] is used as given: no mask building at all.
                additive = torch.zeros(ids.shape[0], 1, ids.shape[1], ids.shape[1], device=ids.device, dtype=torch.float16)
                tries = [("with explicit token_type_ids and position_ids", mask),
                         ("with explicit token_type_ids, position_ids and a 4-D additive mask", additive),
                         ("with explicit token_type_ids and position_ids, without the attention mask", None)]
                notes = [f"plain call: {note}"]
                for label, m in tries:
                    graph, why = capture(torch, lambda m=m: model.m(input_ids=ids, attention_mask=m, **extra))
                    if graph is not None:
                        notes.append(f"captured {label}")
                        break
                    notes.append(f"{label}: {why}")
                note = "; ".join(notes)
            if graph is not None:
                row["cuda_graph"] = timed(torch, graph.replay, a.warmup, a.iters)
            row["cuda_graph_note"] = note
            del graph
        if batch in compile_batches:
            row["torch_compile"] = compile_timed(torch, compiled, args, a.compile, a.warmup, a.iters)
        results["batches"][str(batch)] = row
        graph_ms = row.get("cuda_graph", {}).get("median_ms")
        tc = row.get("torch_compile") or {}
        if tc:
            print(f"bench_transformers: {a.model} batch {batch}: torch.compile {a.compile} "
                  f"{tc.get('median_ms', float('nan')):.3f} ms (compiled in {tc.get('compile_seconds', 0):.0f} s)"
                  f"{'' if 'error' not in tc else ': ' + tc['error']}", flush=True)
        print(f"bench_transformers: {a.model} batch {batch}: eager {row['eager']['median_ms']:.3f} ms, "
              f"CUDA graph {'—' if graph_ms is None else f'{graph_ms:.3f}'} ms"
              f"{'' if not row['cuda_graph_note'] else ' (' + row['cuda_graph_note'] + ')'}", flush=True)
    text = json.dumps(results, indent=2)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
