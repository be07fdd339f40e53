#!/usr/bin/env python3
"""Times a torchvision classifier in PyTorch: eager and CUDA graph replay, or torch.compile. The
peers of `onnx2ait bench` in scripts/gpu-check.sh and scripts/gpu-bench.sh, measured in the same
run on the same GPU.

    bench_torch.py [--model resnet50] [--batch 1,8,64,256] [--warmup 10] [--iters 50]
        [--inputs 4] [--gemm-ceiling] [--copy-ceiling] [--json-out FILE]
    bench_torch.py --compile max-autotune --model M --batch B [--warmup 10] [--iters 50]
        [--ready-file F --go-file F [--stop-file F] [--parent-pid PID] [--wait-timeout S]]
        [--log FILE] [--tag TEXT] [--json-out FILE]

Settings (those of /work/shared/anchors.md, what a PyTorch user would run): the weights of
torch.manual_seed(0) (built by export_torchvision.py's build_model, so they are the weights of
the ONNX export onnx2ait compiles), fp16 weights and inputs, channels_last,
cudnn.benchmark=True, torch.inference_mode(). For each batch: `--warmup` untimed runs, then
`--iters` runs each timed with a pair of CUDA events; the median is reported (and min, p90).
Inputs rotate over `--inputs` pre-made random tensors (never zeros, never one buffer that would
sit in L2).

Eager and CUDA graph (default): after the eager warm-up (so cuDNN has chosen its algorithms), a
few runs on a side stream, then capture on that side stream; each timed replay is preceded by an
untimed copy of the next pre-made input into the graph's static input buffer.

torch.compile (--compile MODE, e.g. max-autotune): `torch.compile(model, mode=MODE,
dynamic=False)`, one compile per batch (the first call compiles and autotunes; its wall time is
reported as compile_seconds), then `--warmup` calls (max-autotune records its CUDA graphs here)
and a check of the output against eager (rel err = max |compiled - eager| / max |eager|). Each
timed call passes the next pre-made input: the compiled function copies it into its CUDA graph's
static input (at most ~77 MB at batch 256, ~0.03 ms), so that copy is inside the timed region,
unlike the eager CUDA-graph mode above.

Barrier (scripts/gpu-bench.sh): with --ready-file and --go-file the process compiles every batch,
shuts its compile workers down, writes the ready file (JSON: compile seconds), then waits until
the go file exists before it warms up again and times: so a compile can run while other
processes time, and the timing itself runs alone on the GPU. It gives up (exit 3, with the
reason in --json-out) when the stop file appears, the parent process is gone, or
--wait-timeout passes. With --log, everything torch prints (inductor's autotuning tables, compile
workers) goes to that file and only short status lines prefixed with --tag reach stderr,
including a heartbeat every 30 s while compiling.

--gemm-ceiling also times an fp16 8192x8192x8192 torch.matmul (the tensor-core ceiling the
per-kernel sweep of BENCHMARKS.md is compared with). --copy-ceiling also times a 1 GiB
device-to-device copy (the memory ceiling the per-kernel GB/s of "Where the time goes" are
compared with; a copy reads and writes every byte, so 2 GiB move per copy).

Prints one line per batch, and the JSON document to --json-out (else to stdout). Exit status 0
when everything asked for was measured.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import threading
import time

HEARTBEAT_S = 30


def parse_batches(text):
    out = []
    for part in text.split(","):
        try:
            b = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{part}' is not a batch size")
        if b < 1:
            raise argparse.ArgumentTypeError(f"batch {b} must be at least 1")
        out.append(b)
    return out


class Status:
    """Short progress lines with a time stamp (to the original stderr when --log redirects the rest)."""

    def __init__(self, tag):
        self.tag = tag
        self.stream = sys.stderr

    def __call__(self, msg):
        stamp = datetime.datetime.now().strftime("%H:%M:%S")
        try:
            self.stream.write(f"[{stamp}] {self.tag}: {msg}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def redirect_rest(self, log_path):
        """Keeps a copy of stderr for status lines, then sends fd 1 and 2 (and so every child
        process: compile workers, nvcc of Triton) to log_path."""
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.stream = os.fdopen(os.dup(2), "w", buffering=1)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)


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


def make_inputs(torch, batch, size, n, dtype):
    return [
        torch.randn(batch, 3, size, size, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
        for _ in range(n)
    ]


def bench_batch(torch, model, batch, size, dtype, warmup, iters, n_inputs):
    xs = make_inputs(torch, batch, size, n_inputs, dtype)
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


def gemm_ceiling(torch, n=8192, warmup=5, iters=20):
    """fp16 n^3 matmul through PyTorch (cuBLAS): the tensor-core rate the kernel sweep is compared to."""
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    for _ in range(warmup):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    s = time_runs(torch, lambda i: torch.matmul(a, b), lambda i: None, iters)
    flops = 2.0 * n * n * n
    s.update({"m": n, "n": n, "k": n, "dtype": "float16", "tflops": flops / (s["median_ms"] * 1e-3) / 1e12})
    del a, b
    torch.cuda.empty_cache()
    return s


def copy_ceiling(torch, nbytes=1 << 30, warmup=5, iters=20):
    """A device-to-device copy of `nbytes` through PyTorch: the memory rate (bytes read plus
    bytes written per second) the per-kernel GB/s of `onnx2ait bench --kernels` are compared to."""
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.float16).normal_()
    dst = torch.empty_like(src)
    for _ in range(warmup):
        dst.copy_(src)
    torch.cuda.synchronize()
    s = time_runs(torch, lambda i: dst.copy_(src), lambda i: None, iters)
    moved = 2.0 * nbytes
    s.update({"bytes": nbytes, "gbps": moved / (s["median_ms"] * 1e-3) / 1e9})
    del src, dst
    torch.cuda.empty_cache()
    return s


def rel_err(torch, got, want):
    got, want = got.float(), want.float()
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / max(scale, 1e-30)


class Heartbeat:
    """Prints `what… N s (load L)` every HEARTBEAT_S seconds until stopped."""

    def __init__(self, status):
        self.status, self.what, self.t0 = status, None, time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, what):
        self.what, self.t0 = what, time.time()
        if not self._thread.is_alive():
            self._thread.start()

    def stop(self):
        self.what = None

    def close(self):
        self._stop.set()

    def _run(self):
        while not self._stop.wait(HEARTBEAT_S):
            if self.what:
                try:
                    load = f", load {os.getloadavg()[0]:.1f}"
                except OSError:
                    load = ""
                self.status(f"{self.what}… {time.time() - self.t0:.0f} s{load}")


class Barrier:
    """The ready/go/stop files of scripts/gpu-bench.sh."""

    def __init__(self, a):
        self.ready, self.go, self.stop, self.parent = a.ready_file, a.go_file, a.stop_file, a.parent_pid
        self.timeout = a.wait_timeout

    def abort_reason(self):
        if self.stop and os.path.exists(self.stop):
            return f"stopped by the orchestrator ({self.stop} exists)"
        if self.parent:
            try:
                os.kill(self.parent, 0)
            except ProcessLookupError:
                return f"the parent process {self.parent} is gone"
            except PermissionError:
                pass
        return None

    def announce(self, doc):
        tmp = self.ready + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, self.ready)

    def wait(self):
        """None when the go file appeared; else why not."""
        t0 = time.time()
        while not os.path.exists(self.go):
            why = self.abort_reason()
            if why:
                return why
            if time.time() - t0 > self.timeout:
                return f"no go signal within {self.timeout:.0f} s"
            time.sleep(0.1)
        return None


def run_compile_mode(a, torch, model, doc, status):
    """torch.compile: compile every batch, announce, wait for the go signal, then time."""
    barrier = Barrier(a) if a.go_file else None
    heartbeat = Heartbeat(status)
    compiled = torch.compile(model, mode=a.compile, dynamic=False)
    per_batch = {}
    error = None
    try:
        for b in a.batch:
            xs = make_inputs(torch, b, a.image_size, a.inputs, torch.float16)
            want = model(xs[0]).clone()
            status(f"batch {b}: compiling (mode={a.compile})")
            heartbeat.start(f"batch {b}: compiling")
            t0 = time.time()
            y = compiled(xs[0])
            torch.cuda.synchronize()
            compile_s = time.time() - t0
            err = rel_err(torch, y, want)
            finite = bool(torch.isfinite(y).all().item())
            del y
            heartbeat.start(f"batch {b}: warm-up")
            t1 = time.time()
            for i in range(a.warmup):
                compiled(xs[i % a.inputs])
            torch.cuda.synchronize()
            heartbeat.stop()
            status(f"batch {b}: compiled in {compile_s:.1f} s, warm-up {time.time() - t1:.1f} s, "
                   f"rel err vs eager {err:.2e}")
            per_batch[b] = {"xs": xs, "compile_seconds": round(compile_s, 2),
                            "rel_err_vs_eager": err, "outputs_finite": finite}
            if barrier and barrier.abort_reason():
                break
    except Exception as e:  # a compile failure of the peer is reported, not raised
        error = f"{type(e).__name__}: {e}"
        status(f"error: {error}")
    finally:
        heartbeat.close()
    doc["compile_seconds"] = {str(b): r["compile_seconds"] for b, r in per_batch.items()}
    try:
        # The idle compile workers would hold memory and CPU slots while the others time.
        from torch._inductor import async_compile

        getattr(async_compile, "shutdown_compile_workers", lambda: None)()
    except Exception as e:  # optional clean-up only
        status(f"note: could not shut the compile workers down ({type(e).__name__}: {e})")
    if error:
        doc["error"] = error
        return 1
    if barrier:
        barrier.announce({"pid": os.getpid(), "ready_at": time.time(), "compile_seconds": doc["compile_seconds"]})
        status("ready; waiting for its timing turn")
        why = barrier.wait()
        if why:
            doc["error"] = f"not timed: {why}"
            status(doc["error"])
            return 3
        status("timing")
    doc["timed_at"] = time.time()
    for b in a.batch:
        r = per_batch.get(b)
        if r is None:
            continue
        xs = r.pop("xs")
        for i in range(a.warmup):  # again: the GPU may have idled since the compile
            compiled(xs[i % a.inputs])
        torch.cuda.synchronize()
        t = time_runs(torch, lambda i: compiled(xs[i % a.inputs]), lambda i: None, a.iters)
        row = {"batch": b, "compile": t, "compile_ms": t["median_ms"]}
        row.update(r)
        doc["results"].append(row)
        print(f"bench_torch: {a.model} batch {b:4d}: torch.compile({a.compile}) {t['median_ms']:8.3f} ms "
              f"(median of {a.iters}; compiled in {r['compile_seconds']:.0f} s)", flush=True)
        status(f"batch {b}: {t['median_ms']:.3f} ms")
        del xs
        torch.cuda.empty_cache()
    return 0 if len(doc["results"]) == len(a.batch) else 1


def note_of(doc):
    """One line for the step table of the shell scripts."""
    if doc.get("error") and not doc.get("results"):
        return doc["error"][:300]
    parts = []
    for r in doc.get("results") or []:
        if "compile_ms" in r:
            parts.append(f"bs {r['batch']}: {r['compile_ms']:.3f} ms (compiled in {r['compile_seconds']:.0f} s)")
        else:
            parts.append(f"bs {r['batch']}: eager {r['eager_ms']:.3f} / graph {r['graph_ms']:.3f} ms")
    if doc.get("gemm_ceiling"):
        parts.append(f"fp16 GEMM {doc['gemm_ceiling']['tflops']:.0f} TFLOP/s")
    if doc.get("copy_ceiling"):
        parts.append(f"copy {doc['copy_ceiling']['gbps']:.0f} GB/s")
    if doc.get("error"):
        parts.append(doc["error"])
    return ", ".join(parts)[:300]


def write_doc(path, doc):
    text = json.dumps(doc, indent=2)
    if not path:
        print(text)
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text + "\n")
    os.replace(path + ".tmp", path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="a torchvision classification model (default resnet50)")
    p.add_argument("--batch", type=parse_batches, default=parse_batches("1,8,64,256"))
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--inputs", type=int, default=4, help="pre-made random inputs to rotate over")
    p.add_argument("--gemm-ceiling", action="store_true", help="also time an fp16 8192^3 matmul")
    p.add_argument("--copy-ceiling", action="store_true", help="also time a 1 GiB device-to-device copy")
    p.add_argument("--compile", metavar="MODE", help="time torch.compile(mode=MODE) instead of eager / CUDA graph")
    p.add_argument("--ready-file", help="barrier: written once compiled")
    p.add_argument("--go-file", help="barrier: timing starts once this file exists")
    p.add_argument("--stop-file", help="barrier: give up waiting when this file exists")
    p.add_argument("--parent-pid", type=int, help="barrier: give up waiting when this process is gone")
    p.add_argument("--wait-timeout", type=float, default=900.0, help="barrier: seconds to wait for the go file")
    p.add_argument("--log", help="send torch's own output here; only status lines go to stderr")
    p.add_argument("--tag", help="prefix of the status lines (default: the model and mode)")
    p.add_argument("--json-out")
    a = p.parse_args()
    if a.iters < 1 or a.warmup < 0 or a.inputs < 1:
        p.error("--iters and --inputs must be at least 1, --warmup at least 0")
    if (a.ready_file is None) != (a.go_file is None):
        p.error("--ready-file and --go-file go together")
    if a.go_file and not a.compile:
        p.error("the barrier (--ready-file/--go-file) is for --compile")

    mode = f"torch.compile {a.compile}" if a.compile else "eager+graph"
    status = Status(a.tag or f"bench_torch {a.model} {mode}")
    if a.go_file:
        # Its own process group: the orchestrator ends the process and its compile workers together.
        try:
            os.setpgrp()
        except OSError:
            pass
    if a.log:
        status.redirect_rest(a.log)
    status(f"pid {os.getpid()}, batches {','.join(map(str, a.batch))}")

    t0 = time.time()
    doc = {
        "model": a.model,
        "mode": f"compile:{a.compile}" if a.compile else "eager+graph",
        "weights": "random (torch.manual_seed(0))",
        "dtype": "float16",
        "memory_format": "channels_last",
        "cudnn_benchmark": True,
        "warmup": a.warmup,
        "iters": a.iters,
        "inputs": a.inputs,
        "command": ["bench_torch.py"] + sys.argv[1:],
        "started_at": t0,
        "results": [],
    }
    if a.compile:
        doc["compile_mode"] = a.compile
    status_code = 0
    try:
        import torch
        import torchvision

        doc.update(torch=torch.__version__, torchvision=torchvision.__version__, cuda=torch.version.cuda)
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA is not available to PyTorch")
        doc.update(cudnn=torch.backends.cudnn.version(), gpu=torch.cuda.get_device_name(0))
        if a.compile:
            doc["inductor_cache_dir"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            doc["compile_threads"] = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
        torch.backends.cudnn.benchmark = True
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from export_torchvision import build_model  # the same weights as the ONNX export

        model = build_model(a.model)[0].to(device="cuda", dtype=torch.float16, memory_format=torch.channels_last)
        with torch.inference_mode():
            if a.gemm_ceiling:
                doc["gemm_ceiling"] = gemm_ceiling(torch)
                print(f"bench_torch: fp16 8192^3 matmul {doc['gemm_ceiling']['median_ms']:.3f} ms = "
                      f"{doc['gemm_ceiling']['tflops']:.0f} TFLOP/s", flush=True)
            if a.copy_ceiling:
                doc["copy_ceiling"] = copy_ceiling(torch)
                print(f"bench_torch: 1 GiB device copy {doc['copy_ceiling']['median_ms']:.3f} ms = "
                      f"{doc['copy_ceiling']['gbps']:.0f} GB/s (read + written)", flush=True)
            if a.compile:
                status_code = run_compile_mode(a, torch, model, doc, status)
            else:
                for b in a.batch:
                    r = bench_batch(torch, model, b, a.image_size, torch.float16, a.warmup, a.iters, a.inputs)
                    torch.cuda.empty_cache()  # the batch's graph and inputs are gone: give their memory back
                    doc["results"].append(r)
                    print(
                        f"bench_torch: {a.model} batch {b:4d}: eager {r['eager_ms']:8.3f} ms, "
                        f"CUDA graph {r['graph_ms']:8.3f} ms (median of {a.iters})"
                        + ("" if r["outputs_finite"] else "  [outputs not finite]"),
                        flush=True,
                    )
    except Exception as e:  # reported in the JSON record (the shell scripts read it), then exit 1
        doc["error"] = f"{type(e).__name__}: {e}"
        status(f"error: {doc['error']}")
        status_code = 1
    doc["seconds"] = round(time.time() - t0, 2)
    doc["note"] = note_of(doc)
    write_doc(a.json_out, doc)
    if a.json_out:
        print(f"bench_torch: wrote {a.json_out} ({doc['seconds']} s)", flush=True)
    status(f"done (exit {status_code}, {doc['seconds']:.0f} s)")
    return status_code


if __name__ == "__main__":
    sys.exit(main())
