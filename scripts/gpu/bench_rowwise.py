#!/usr/bin/env python3
"""Bandwidth of onnx2ait's softmax and layernorm kernels against PyTorch and the copy rate, on the GPU.

    bench_rowwise.py --bin ONNX2AIT --work DIR [--ks 32,64,...,16384] [--elements 67108864]
        [--ops softmax,layernorm] [--iters 100] [--json-out FILE] [--no-torch]

For each op and each row length K: a one-node ONNX model (Softmax over the last axis, or
LayerNormalization over the last axis with gamma and beta) on an fp16 tensor [rows, K] with
rows = --elements / K (64 Mi elements by default: 128 MiB in and out, far beyond L2), compiled by
`onnx2ait compile` (one build per model) and timed by `onnx2ait bench --kernels`, which times
each kernel with CUDA events (the model compiles to the op's kernel alone: fp16 in and out).
Bytes moved = read + write of the tensor (2 bytes per element each way; gamma and beta are
negligible). PyTorch's `torch.softmax` / `torch.nn.functional.layer_norm` on the same fp16 tensor
and a device-to-device copy of it are timed in the same process (median of --iters, CUDA events).

Prints one table row per (op, K) with TB/s for onnx2ait, PyTorch and the copy, and writes the
figures as JSON to --json-out. Exit status 0 when every figure was measured.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_transformers import timed  # noqa: E402  (one timing loop for every PyTorch peer)

DEFAULT_KS = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def make_model(op, rows, k, path):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [rows, k])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [rows, k])
    inits = []
    if op == "softmax":
        node = helper.make_node("Softmax", ["x"], ["y"], axis=-1, name="rowwise")
    else:
        rng = np.random.default_rng(0)
        inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(k)).astype(np.float16), "gamma"),
                 numpy_helper.from_array((0.1 * rng.standard_normal(k)).astype(np.float16), "beta")]
        node = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5,
                                name="rowwise")
    graph = helper.make_graph([node], f"{op}_{k}", [x], [y], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)


def onnx2ait_kernel_ms(binary, model, out, iters):
    """The median ms of the op's kernel (node 'rowwise'), from `onnx2ait bench --kernels --json`."""
    build = subprocess.run([binary, "compile", model, "-o", out, "--force"], capture_output=True, text=True)
    if build.returncode != 0:
        raise RuntimeError(f"compile failed: {build.stderr.strip()[-400:]}")
    bench = subprocess.run([binary, "bench", out, "--batch", "1", "--kernels", "--json", "--iters", str(iters)],
                           capture_output=True, text=True)
    if bench.returncode != 0:
        raise RuntimeError(f"bench failed: {bench.stderr.strip()[-400:]}")
    runs = json.loads(bench.stdout)
    # The model is the op alone (fp16 in and out: no casts), so every kernel is the op's; the
    # optimiser renames the node (LayerNormalization becomes the kernel-level LayerNorm).
    kernels = runs[0].get("kernels", [])
    if not kernels:
        raise RuntimeError("onnx2ait bench --kernels listed no kernel")
    return sum(k["ms"] for k in kernels), [k["name"] for k in kernels]


def torch_ms(torch, fn, iters):
    """Median ms of `fn` over `iters` CUDA-event-timed calls (bench_transformers' timing)."""
    return timed(torch, fn, 10, iters)["median_ms"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True, help="the onnx2ait binary")
    p.add_argument("--work", required=True, help="folder for the models and builds")
    p.add_argument("--ks", default=",".join(map(str, DEFAULT_KS)))
    p.add_argument("--elements", type=int, default=1 << 26)
    p.add_argument("--ops", default="softmax,layernorm")
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--json-out")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch and the copy (no GPU: only the builds)")
    a = p.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch = None
    if not a.no_torch:
        import torch
    rows_out, ok = [], True
    print(f"{'op':<10} {'K':>6} {'rows':>8}  {'onnx2ait TB/s':>13}  {'torch TB/s':>10}  {'copy TB/s':>9}  kernel")
    for op in a.ops.split(","):
        for k in [int(v) for v in a.ks.split(",")]:
            rows = max(1, a.elements // k)
            nbytes = 2 * 2 * rows * k  # fp16 read + write
            model = os.path.join(a.work, f"{op}_{k}.onnx")
            make_model(op, rows, k, model)
            row = {"op": op, "k": k, "rows": rows, "bytes": nbytes}
            try:
                if a.no_torch:
                    build = subprocess.run([a.bin, "compile", model, "-o", os.path.join(a.work, f"build_{op}_{k}"),
                                            "--force", "--no-build"], capture_output=True, text=True)
                    if build.returncode != 0:
                        raise RuntimeError(build.stderr.strip()[-400:])
                else:
                    ms, names = onnx2ait_kernel_ms(a.bin, model, os.path.join(a.work, f"build_{op}_{k}"), a.iters)
                    row.update(onnx2ait_ms=ms, kernels=names, onnx2ait_tbs=nbytes / ms / 1e9)
                    x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
                    gamma = torch.ones(k, device="cuda", dtype=torch.float16)
                    beta = torch.zeros(k, device="cuda", dtype=torch.float16)
                    y = torch.empty_like(x)
                    f = (lambda: torch.softmax(x, -1)) if op == "softmax" else \
                        (lambda: torch.nn.functional.layer_norm(x, (k,), gamma, beta, 1e-5))
                    row["torch_ms"] = torch_ms(torch, f, a.iters)
                    row["copy_ms"] = torch_ms(torch, lambda: y.copy_(x), a.iters)
                    row["torch_tbs"] = nbytes / row["torch_ms"] / 1e9
                    row["copy_tbs"] = nbytes / row["copy_ms"] / 1e9
                    del x, y
            except Exception as e:  # record the failure and go on with the next size
                row["error"] = f"{type(e).__name__}: {e}"
                ok = False
            rows_out.append(row)
            if "error" in row:
                print(f"{op:<10} {k:>6} {rows:>8}  error: {row['error']}", flush=True)
            elif a.no_torch:
                print(f"{op:<10} {k:>6} {rows:>8}  compiled (no GPU timing)", flush=True)
            else:
                print(f"{op:<10} {k:>6} {rows:>8}  {row['onnx2ait_tbs']:>13.2f}  {row['torch_tbs']:>10.2f}  "
                      f"{row['copy_tbs']:>9.2f}  {','.join(row['kernels'])}", flush=True)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"elements": a.elements, "rows": rows_out}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
