#!/usr/bin/env python3
"""Exports a torchvision classifier with random weights to ONNX, with a dynamic batch axis.

    export_torchvision.py MODEL OUT.onnx [--opset 17] [--max-ir-version 10] [--image-size 224]
        [--exporter auto|torchscript|dynamo] [--meta-out META.json]

MODEL is a torchvision classification model name: resnet50 and mobilenet_v2 are the ones the
benchmarks use (scripts/gpu-check.sh, scripts/gpu-bench.sh); any other name that
`torchvision.models.list_models(module=torchvision.models)` lists works too (resnext50_32x4d,
efficientnet_b0, convnext_tiny, vit_b_16, ...). The weights come from `torch.manual_seed(0)` (no
download: the GPU machine has no network), exactly as scripts/gpu/bench_torch.py builds its
PyTorch peer, so both sides run the same weights. The model is in eval mode and fp32. The graph
input is `input` [batch, 3, S, S] (S = --image-size), the output `logits` [batch, classes], where
`batch` is symbolic.

Exporters. `auto` tries the TorchScript exporter (`dynamo=False`) first: it writes the requested
opset directly, folds BatchNormalization into the convolutions in eval mode and needs nothing
beyond torch. If it is missing or fails (it is deprecated since torch 2.9), the dynamo exporter
is used; it needs the `onnxscript` package and writes opset 18 or newer (asking it for 17 makes
it run the ONNX version converter, which is less tested than its native opsets).

After export the file is rewritten as one self-contained file (no external data) with the IR
version lowered to --max-ir-version when it is higher (ONNX Runtime 1.30 rejects IR 11+), checked
with onnx.checker, and run once in ONNX Runtime (CPU) against PyTorch (CPU, fp32) on a random
batch of 3: that proves the batch axis is really dynamic and the export is numerically right.
Exit status 1 when any of this fails.
"""
import argparse
import importlib.util
import inspect
import json
import os
import sys
import time
import warnings

# The models the benchmark scripts use; any torchvision classification model is accepted.
MODELS = ("resnet50", "mobilenet_v2")
INPUT, OUTPUT = "input", "logits"
# ONNX Runtime vs PyTorch, both fp32 on the CPU: different summation orders only.
EXPORT_TOLERANCE = 1e-3


def log(msg):
    print(f"export_torchvision: {msg}", flush=True)


def classification_models(torchvision):
    """The classification model names this torchvision offers (list_models exists since 0.14)."""
    lister = getattr(torchvision.models, "list_models", None)
    if lister is None:
        return sorted(n for n in MODELS if hasattr(torchvision.models, n))
    return sorted(lister(module=torchvision.models))


def calibrate_batchnorm(torch, model, image_size=224, batches=4, batch_size=16):
    """Sets every BatchNorm's running statistics from random N(0, 1) images (train-mode forward
    passes, cumulative averages), so activations have the scale a trained network's have.

    Why: torchvision's random initialisation with the default running statistics (mean 0, var 1)
    shrinks activations layer after layer in some architectures. MobileNetV2's depthwise convs are
    initialised with kaiming fan-out over C·k² although each output sees only k² inputs: its
    logits come out around 1e-9, below fp16's smallest subnormal (6e-8), so any fp16 engine
    outputs zeros and no numerical comparison means anything. After calibration each BatchNorm
    output is about N(0, 1), as in a trained model. Deterministic (its own seeded generator)."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return model
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average over the calibration batches
    gen = torch.Generator().manual_seed(1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn(batch_size, 3, image_size, image_size, generator=gen))
    return model


# Logits below this (max |x| on a random image) cannot be compared in fp16: its smallest normal
# number is 6.1e-5 and the values would lose all precision or flush to zero.
FP16_MEANINGFUL = 1e-3


def needs_calibration(torch, model, image_size):
    """Whether torchvision's initialisation leaves the logits too small for fp16 (MobileNetV2: about
    1e-9, see calibrate_batchnorm)."""
    gen = torch.Generator().manual_seed(2)
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, image_size, image_size, generator=gen))
    return float(out.abs().max()) < FP16_MEANINGFUL


def build_model(name, image_size=224, calibrate="auto"):
    """The model with the weights of torch.manual_seed(0), and BatchNorm statistics calibrated on
    random images where torchvision's initialisation leaves the logits below what fp16 can compare
    (`calibrate="auto"`; True or False to force). Returns (model, weights description);
    ValueError for an unknown name.

    Why not calibrate every model: a calibrated random network is far more sensitive to rounding
    than a trained one. Measured on the H200 with scripts/gpu/fp16_error.py, PyTorch's own fp16
    run differs from fp32 by 2.8-3.0e-2 (max-relative) on calibrated ResNet-50 but 6-7e-4 with
    torchvision's initialisation, and by 1.6-1.9e-2 on calibrated MobileNetV2 (whose plain
    initialisation gives 1e-9 logits: no fp16 engine can be compared on those)."""
    import torch
    import torchvision

    known = classification_models(torchvision)
    if name not in known:
        raise ValueError(f"'{name}' is not a torchvision classification model; known: {', '.join(known)}")
    torch.manual_seed(0)
    ctor = torchvision.models.get_model if hasattr(torchvision.models, "get_model") else None
    model = ctor(name, weights=None) if ctor else getattr(torchvision.models, name)(weights=None)
    model = model.float()
    if calibrate == "auto":
        calibrate = needs_calibration(torch, model, image_size)
    if calibrate:
        model = calibrate_batchnorm(torch, model, image_size)
        weights = "random (torch.manual_seed(0); BatchNorm statistics calibrated on random images)"
    else:
        weights = "random (torch.manual_seed(0), torchvision's initialisation)"
    return model.eval().float(), weights


def export_torchscript(torch, model, example, path, opset):
    kwargs = dict(
        input_names=[INPUT],
        output_names=[OUTPUT],
        dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}},
        opset_version=opset,
        do_constant_folding=True,
    )
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    with warnings.catch_warnings():
        # The deprecation notice of the TorchScript exporter is expected; keep the log short.
        warnings.simplefilter("ignore", category=DeprecationWarning)
        warnings.simplefilter("ignore", category=FutureWarning)
        torch.onnx.export(model, (example,), path, **kwargs)
    return opset


def export_dynamo(torch, model, example, path, opset):
    if importlib.util.find_spec("onnxscript") is None:
        raise RuntimeError("the dynamo exporter needs the 'onnxscript' package, which is not installed")
    # The dynamo exporter's own opsets start at 18; see the module doc.
    opset = max(opset, 18)
    common = dict(input_names=[INPUT], output_names=[OUTPUT], opset_version=opset, dynamo=True)
    if "external_data" in inspect.signature(torch.onnx.export).parameters:
        common["external_data"] = False
    # A named torch.export dim first; the exporter's own translation of dynamic_axes second.
    batch = torch.export.Dim("batch", min=1, max=4096)
    try:
        torch.onnx.export(model, (example,), path, dynamic_shapes=({0: batch},), **common)
    except Exception as e:  # any failure of the first form: try the second, report both if it fails too
        log(f"dynamo export with dynamic_shapes failed ({type(e).__name__}: {e}); trying dynamic_axes")
        torch.onnx.export(model, (example,), path, dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}}, **common)
    return opset


def finish_file(path, max_ir):
    """Inlines external data, lowers the IR version, checks; returns facts for the record."""
    import onnx

    # External data files the exporter may have written beside the model (read before loading:
    # onnx.load inlines the data and forgets where it came from).
    header = onnx.load(path, load_external_data=False)
    data_files = {
        os.path.join(os.path.dirname(path) or ".", e.value)
        for t in header.graph.initializer
        for e in t.external_data
        if e.key == "location"
    }
    model = onnx.load(path)
    ir_before = model.ir_version
    if model.ir_version > max_ir:
        model.ir_version = max_ir
    opsets = {(o.domain or "ai.onnx"): o.version for o in model.opset_import}
    inputs = [i for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    if len(inputs) != 1 or len(model.graph.output) != 1:
        raise RuntimeError(f"expected one input and one output, found {len(inputs)} and {len(model.graph.output)}")
    dims = {}
    for vi in (inputs[0], model.graph.output[0]):
        d0 = vi.type.tensor_type.shape.dim[0]
        if d0.HasField("dim_value"):
            raise RuntimeError(f"'{vi.name}' has a fixed batch dimension {d0.dim_value}: the export lost the dynamic axis")
        dims[vi.name] = d0.dim_param or "?"
    onnx.checker.check_model(model)
    # Rewrite as one file, then remove the exporter's external data files.
    onnx.save_model(model, path, save_as_external_data=False)
    for f in data_files:
        if os.path.isfile(f):
            os.remove(f)
    nodes = {}
    for n in model.graph.node:
        nodes[n.op_type] = nodes.get(n.op_type, 0) + 1
    return {
        "ir_version": model.ir_version,
        "ir_version_exported": ir_before,
        "opsets": opsets,
        "input": inputs[0].name,
        "output": model.graph.output[0].name,
        "batch_dims": dims,
        "ops": dict(sorted(nodes.items())),
        "bytes": os.path.getsize(path),
    }


def check_with_ort(torch, model, path, size, batch=3):
    """Max |ort - torch| / max |torch| on a random batch; None when onnxruntime is absent."""
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import numpy as np
    import onnxruntime as ort

    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen)
    with torch.inference_mode():
        want = model(x).numpy().astype(np.float64)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    got = sess.run(None, {name: x.numpy()})[0].astype(np.float64)
    if got.shape != want.shape:
        raise RuntimeError(f"ONNX Runtime output shape {got.shape}, PyTorch {want.shape}")
    scale = float(np.abs(want).max())
    return {
        "batch": batch,
        "onnxruntime": ort.__version__,
        "max_abs": float(np.abs(got - want).max()),
        "rel_to_max": float(np.abs(got - want).max() / max(scale, 1e-30)),
        "finite": bool(np.isfinite(got).all()),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help=f"a torchvision classification model name ({', '.join(MODELS)}, ...)")
    p.add_argument("out", help="the .onnx file to write")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--max-ir-version", type=int, default=10, help="lower the IR version to this (default 10)")
    p.add_argument("--exporter", choices=("auto", "torchscript", "dynamo"), default="auto")
    p.add_argument("--image-size", type=int, default=224, help="input height and width (default 224)")
    p.add_argument("--meta-out", help="write what was done as JSON here")
    a = p.parse_args()
    if a.image_size < 16:
        p.error("--image-size must be at least 16")

    import torch

    t0 = time.time()
    try:
        model, weights = build_model(a.model, a.image_size)
    except ValueError as e:
        log(f"error: {e}")
        if a.meta_out:
            with open(a.meta_out, "w") as f:
                json.dump({"model": a.model, "exporter": None, "ok": False, "error": str(e)}, f, indent=2)
        return 1
    example = torch.randn(2, 3, a.image_size, a.image_size)  # batch 2: torch.export specialises dims of size 1
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for stale in (a.out, a.out + ".data"):  # never leave an older export to be mistaken for this one
        if os.path.exists(stale):
            os.remove(stale)
    order = {"auto": ("torchscript", "dynamo"), "torchscript": ("torchscript",), "dynamo": ("dynamo",)}[a.exporter]
    funcs = {"torchscript": export_torchscript, "dynamo": export_dynamo}
    used, opset, errors = None, None, {}
    for name in order:
        try:
            opset = funcs[name](torch, model, example, a.out, a.opset)
            used = name
            break
        except Exception as e:  # any exporter failure: record it and try the next one
            errors[name] = f"{type(e).__name__}: {e}"
            log(f"{name} exporter failed: {errors[name]}")
    meta = {
        "model": a.model,
        "weights": weights,
        "torch": torch.__version__,
        "exporter": used,
        "exporter_errors": errors,
        "opset_requested": a.opset,
        "image_size": a.image_size,
        "path": a.out,
    }
    status = 0
    if used is None:
        meta["error"] = "every exporter failed"
        status = 1
    else:
        try:
            meta.update(finish_file(a.out, a.max_ir_version))
            meta["ort_check"] = check_with_ort(torch, model, a.out, a.image_size)
            oc = meta["ort_check"]
            if oc is None:
                log("onnxruntime is not installed: the export was not checked numerically")
            elif not oc["finite"] or not oc["rel_to_max"] <= EXPORT_TOLERANCE:
                meta["error"] = f"ONNX Runtime disagrees with PyTorch: rel_to_max {oc['rel_to_max']:.3g} > {EXPORT_TOLERANCE}"
                status = 1
        except Exception as e:
            meta["error"] = f"{type(e).__name__}: {e}"
            status = 1
    meta["seconds"] = round(time.time() - t0, 2)
    meta["ok"] = status == 0
    if a.meta_out:
        with open(a.meta_out, "w") as f:
            json.dump(meta, f, indent=2)
    if status == 0:
        oc = meta.get("ort_check") or {}
        log(
            f"{a.model} -> {a.out}: {used} exporter, opset {opset}, IR {meta['ir_version']}, "
            f"batch dims {meta['batch_dims']}, {meta['bytes'] / 1e6:.1f} MB, "
            f"ORT vs torch rel err {oc.get('rel_to_max', float('nan')):.2g} ({meta['seconds']} s)"
        )
    else:
        log(f"error: {meta['error']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
