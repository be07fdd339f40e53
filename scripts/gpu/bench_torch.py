#!/usr/bin/env python3
"""Times a torchvision classifier in PyTorch: eager, and CUDA graph replay. The peer of
`onnx2ait bench` in scripts/gpu-check.sh, measured in the same run on the same GPU.

    bench_torch.py [--model resnet50] [--batch 1,8,64,256] [--warmup 10] [--iters 50]
        [--inputs 4] [--json-out FILE]

Settings (those of /work/shared/anchors.md, what a PyTorch user would run): random weights from
torch.manual_seed(0), fp16 weights and inputs, channels_last, cudnn.benchmark=True,
torch.inference_mode(). For each batch: `--warmup` untimed runs, then `--iters` runs each timed
with a pair of CUDA events; the median is reported (and min, p90). Inputs rotate over `--inputs`
pre-made random tensors (never zeros, never one buffer that would sit in L2).

CUDA graph: after the eager warm-up (so cuDNN has chosen its algorithms), a few runs on a side
stream, then capture on that side stream; each timed replay is preceded by an untimed copy of
the next pre-made input into the graph's static input buffer.

Prints one line per batch, and the JSON document to --json-out (else to stdout).
"""
import argparse
import json
import statistics
import sys
import time


def parse_batches(text):
    out = []
    for part in text.split(","):
        b = int(part)
        if b < 1:
            raise argparse.ArgumentTypeError(f"batch {b} must be at least 1")
        out.append(b)
    return out


def summary(times_ms):
    s = sorted(times_ms)
    return {
        "median_ms": statistics.median(s),
        "min_ms": s[0],
        "p90_ms": s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))],
    }


def time_runs(torch, fn, before, iters):
    """Median etc. of `iters` runs of fn(i), each between two CUDA events; before(i) runs
    untimed ahead of run i."""
    events = []
    for i in range(iters):
        before(i)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn(i)
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return summary([s.elapsed_time(e) for s, e in events])


def bench_batch(torch, model, batch, dtype, warmup, iters, n_inputs):
    xs = [
        torch.randn(batch, 3, 224, 224, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        for _ in range(n_inputs)
    ]
    result = {"batch": batch}

    # Eager.
    for i in range(warmup):
        model(xs[i % n_inputs])
    torch.cuda.synchronize()
    result["eager"] = time_runs(torch, lambda i: model(xs[i % n_inputs]), lambda i: None, iters)
    finite = bool(torch.isfinite(model(xs[0])).all().item())

    # CUDA graph: warm-up on a side stream, capture on it, replay.
    static_x = xs[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static_y = model(static_x)
    for i in range(warmup):
        static_x.copy_(xs[i % n_inputs])
        graph.replay()
    torch.cuda.synchronize()
    result["graph"] = time_runs(
        torch, lambda i: graph.replay(), lambda i: static_x.copy_(xs[(i + 1) % n_inputs]), iters
    )
    finite = finite and bool(torch.isfinite(static_y).all().item())
    result["eager_ms"] = result["eager"]["median_ms"]
    result["graph_ms"] = result["graph"]["median_ms"]
    result["outputs_finite"] = finite
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("resnet50", "mobilenet_v2"), default="resnet50")
    p.add_argument("--batch", type=parse_batches, default=parse_batches("1,8,64,256"))
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--inputs", type=int, default=4, help="pre-made random inputs to rotate over")
    p.add_argument("--json-out")
    a = p.parse_args()
    if a.iters < 1 or a.warmup < 0 or a.inputs < 1:
        p.error("--iters and --inputs must be at least 1, --warmup at least 0")

    import torch
    import torchvision

    if not torch.cuda.is_available():
        print("bench_torch: error: CUDA is not available to PyTorch", file=sys.stderr)
        return 1
    t0 = time.time()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)(weights=None).eval()
    model = model.to(device="cuda", dtype=torch.float16, memory_format=torch.channels_last)
    doc = {
        "model": a.model,
        "weights": "random (torch.manual_seed(0))",
        "dtype": "float16",
        "memory_format": "channels_last",
        "cudnn_benchmark": True,
        "warmup": a.warmup,
        "iters": a.iters,
        "inputs": a.inputs,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "gpu": torch.cuda.get_device_name(0),
        "results": [],
    }
    with torch.inference_mode():
        for b in a.batch:
            r = bench_batch(torch, model, b, torch.float16, a.warmup, a.iters, a.inputs)
            torch.cuda.empty_cache()  # the batch's graph and inputs are gone: give their memory back
            doc["results"].append(r)
            print(
                f"bench_torch: {a.model} batch {b:4d}: eager {r['eager_ms']:8.3f} ms, "
                f"CUDA graph {r['graph_ms']:8.3f} ms (median of {a.iters})"
                + ("" if r["outputs_finite"] else "  [outputs not finite]"),
                flush=True,
            )
    doc["seconds"] = round(time.time() - t0, 2)
    text = json.dumps(doc, indent=2)
    if a.json_out:
        with open(a.json_out, "w") as f:
            f.write(text + "\n")
        print(f"bench_torch: wrote {a.json_out} ({doc['seconds']} s)")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
