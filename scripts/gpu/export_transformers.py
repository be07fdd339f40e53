#!/usr/bin/env python3
"""Exports a transformer with random weights to ONNX as users do, with dynamic batch (and sequence) axes.

    export_transformers.py MODEL OUT.onnx [--size base|tiny] [--exporter torchscript|dynamo]
        [--opset 17] [--max-ir-version 10] [--meta-out META.json]

MODEL:
  bert  Hugging Face `transformers.BertModel` (random weights from torch.manual_seed(0), BERT's own
        initialiser). Inputs `input_ids` and `attention_mask`, int64 [batch, seq]; outputs
        `last_hidden_state` [batch, seq, hidden] and `pooler_output` [batch, hidden]. `batch` and
        `seq` are symbolic. `--size base` is bert-base (12 layers, hidden 768, 12 heads, FFN 3072,
        vocabulary 30522); `--size tiny` keeps the topology with 2 layers, hidden 64, 4 heads, FFN
        128 and a 1000-word vocabulary (the test models in onnx_models/transformers/).
  vit   torchvision `VisionTransformer` (random weights from torch.manual_seed(0); the classifier
        head, which torchvision initialises to zeros, gets N(0, 0.02) weights). Input `input`
        [batch, 3, S, S], output `logits` [batch, classes], `batch` symbolic. `--size base` is
        `vit_b_16` (224x224, patch 16, 12 layers, hidden 768, 1000 classes); `--size tiny` is 32x32,
        patch 8, 2 layers, hidden 64, 4 heads, MLP 128, 10 classes.

Exporters: `torchscript` (`dynamo=False`, the requested opset) and `dynamo` (the `torch.export`
based exporter, the default since torch 2.9; needs `onnxscript`; opset 18 at least).

After export the file is made self-contained (no external data), its IR version lowered to
--max-ir-version (ONNX Runtime 1.30 rejects IR 11+), checked with onnx.checker, and run in ONNX
Runtime (CPU) against PyTorch (CPU, fp32) at two (batch, seq) points other than the example's, which
proves the axes are really dynamic. Exit status 1 when any of this fails.
"""
import argparse
import importlib.util
import inspect
import json
import os
import sys
import time
import warnings

EXPORT_TOLERANCE = 1e-3  # ONNX Runtime vs PyTorch, both fp32 on the CPU


def log(msg):
    print(f"export_transformers: {msg}", flush=True)


class BertSpec:
    inputs = ("input_ids", "attention_mask")
    outputs = ("last_hidden_state", "pooler_output")
    dynamic = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
               "last_hidden_state": {0: "batch", 1: "seq"}, "pooler_output": {0: "batch"}}

    def __init__(self, size):
        self.size = size

    def build(self, torch):
        import transformers

        if self.size == "base":
            cfg = transformers.BertConfig()  # bert-base-uncased's shape
        else:
            cfg = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=128,
                                          max_position_embeddings=128)
        # The eager attention is what a user's export of a stock BertModel records most often
        # (sdpa exports the same MatMul/Softmax graph in recent versions).
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        model = transformers.BertModel(cfg).eval()
        self.vocab = cfg.vocab_size
        self.max_seq = cfg.max_position_embeddings
        return model

    def wrap(self, torch, model):
        class Wrapped(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask):
                out = self.m(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
                return out.last_hidden_state, out.pooler_output

        return Wrapped(model).eval()

    def example(self, torch, batch, seq, seed):
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.vocab, (batch, seq), generator=gen)
        mask = torch.ones(batch, seq, dtype=torch.int64)
        mask[0, seq // 2:] = 0  # a padded row: the mask path matters
        return (ids, mask)

    def dynamic_shapes(self, torch):
        batch = torch.export.Dim("batch", min=1, max=1024)
        seq = torch.export.Dim("seq", min=2, max=self.max_seq)
        return ({0: batch, 1: seq}, {0: batch, 1: seq})

    def points(self):
        return [(2, 7), (3, 16)] if self.size == "tiny" else [(2, 37), (1, 128)]

    def example_point(self):
        return (2, 11) if self.size == "tiny" else (2, 64)


class VitSpec:
    inputs = ("input",)
    outputs = ("logits",)
    dynamic = {"input": {0: "batch"}, "logits": {0: "batch"}}

    def __init__(self, size):
        self.size = size

    def build(self, torch):
        import torchvision

        torch.manual_seed(0)
        if self.size == "base":
            model = torchvision.models.vit_b_16(weights=None)
            self.image = 224
        else:
            from torchvision.models.vision_transformer import VisionTransformer

            model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                                      mlp_dim=128, num_classes=10)
            self.image = 32
        # torchvision initialises the classifier head to zeros: every logit would be 0 and any
        # comparison of outputs would pass on nothing. A trained head's scale instead.
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            head = model.heads.head
            head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.02)
            head.bias.copy_(torch.randn(head.bias.shape, generator=gen) * 0.02)
        return model.eval()

    def wrap(self, torch, model):
        return model

    def example(self, torch, batch, seq, seed):
        gen = torch.Generator().manual_seed(seed)
        return (torch.randn(batch, 3, self.image, self.image, generator=gen),)

    def dynamic_shapes(self, torch):
        return ({0: torch.export.Dim("batch", min=1, max=1024)},)

    def points(self):
        return [(1, None), (3, None)]

    def example_point(self):
        return (2, None)


def export(torch, spec, model, example, path, exporter, opset):
    kwargs = dict(input_names=list(spec.inputs), output_names=list(spec.outputs))
    if exporter == "torchscript":
        kwargs.update(dynamic_axes=spec.dynamic, opset_version=opset, do_constant_folding=True)
        if "dynamo" in inspect.signature(torch.onnx.export).parameters:
            kwargs["dynamo"] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the exporter's deprecation notice
            torch.onnx.export(model, example, path, **kwargs)
        return opset
    if importlib.util.find_spec("onnxscript") is None:
        raise RuntimeError("the dynamo exporter needs the 'onnxscript' package, which is not installed")
    opset = max(opset, 18)
    kwargs.update(opset_version=opset, dynamo=True, dynamic_shapes=spec.dynamic_shapes(torch))
    if "external_data" in inspect.signature(torch.onnx.export).parameters:
        kwargs["external_data"] = False
    torch.onnx.export(model, example, path, **kwargs)
    return opset


def finish_file(path, max_ir):
    import onnx

    header = onnx.load(path, load_external_data=False)
    data_files = {os.path.join(os.path.dirname(path) or ".", e.value)
                  for t in header.graph.initializer for e in t.external_data if e.key == "location"}
    model = onnx.load(path)
    if model.ir_version > max_ir:
        model.ir_version = max_ir
    onnx.checker.check_model(model)
    onnx.save_model(model, path, save_as_external_data=False)
    for f in data_files:
        if os.path.isfile(f):
            os.remove(f)
    ops = {}
    for n in model.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    return {"ir_version": model.ir_version,
            "opsets": {(o.domain or "ai.onnx"): o.version for o in model.opset_import},
            "ops": dict(sorted(ops.items())), "nodes": len(model.graph.node), "bytes": os.path.getsize(path)}


def check_with_ort(torch, spec, model, path):
    import numpy as np
    import onnxruntime as ort

    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    worst = 0.0
    for k, (batch, seq) in enumerate(spec.points()):
        args = spec.example(torch, batch, seq, seed=10 + k)
        with torch.inference_mode():
            want = model(*args)
        want = want if isinstance(want, tuple) else (want,)
        got = sess.run(None, {n: a.numpy() for n, a in zip(names, args)})
        for w, g in zip(want, got):
            w = w.numpy().astype(np.float64)
            if g.shape != w.shape:
                raise RuntimeError(f"at {(batch, seq)}: ONNX Runtime shape {g.shape}, PyTorch {w.shape}")
            worst = max(worst, float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)))
    return worst


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", choices=("bert", "vit"))
    p.add_argument("out")
    p.add_argument("--size", choices=("base", "tiny"), default="base")
    p.add_argument("--exporter", choices=("torchscript", "dynamo"), default="torchscript")
    p.add_argument("--opset", type=int, default=17)
    p.add_argument("--max-ir-version", type=int, default=10)
    p.add_argument("--meta-out")
    a = p.parse_args()

    import torch

    t0 = time.time()
    spec = {"bert": BertSpec, "vit": VitSpec}[a.model](a.size)
    model = spec.wrap(torch, spec.build(torch))
    batch, seq = spec.example_point()
    example = spec.example(torch, batch, seq, seed=1)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    for stale in (a.out, a.out + ".data"):
        if os.path.exists(stale):
            os.remove(stale)
    meta = {"model": a.model, "size": a.size, "exporter": a.exporter, "torch": torch.__version__}
    status = 0
    try:
        meta["opset"] = export(torch, spec, model, example, a.out, a.exporter, a.opset)
        meta.update(finish_file(a.out, a.max_ir_version))
        meta["ort_vs_torch"] = check_with_ort(torch, spec, model, a.out)
        if not meta["ort_vs_torch"] <= EXPORT_TOLERANCE:
            raise RuntimeError(f"ONNX Runtime disagrees with PyTorch: {meta['ort_vs_torch']:.3g} > {EXPORT_TOLERANCE}")
    except Exception as e:  # report any failure with the facts gathered so far
        meta["error"] = f"{type(e).__name__}: {e}"
        status = 1
    meta["seconds"] = round(time.time() - t0, 2)
    meta["ok"] = status == 0
    if a.meta_out:
        with open(a.meta_out, "w") as f:
            json.dump(meta, f, indent=2)
    if status == 0:
        log(f"{a.model} ({a.size}) -> {a.out}: {a.exporter}, opset {meta['opset']}, {meta['nodes']} nodes, "
            f"{meta['bytes'] / 1e6:.2f} MB, ORT vs torch {meta['ort_vs_torch']:.2g} ({meta['seconds']} s)")
    else:
        log(f"error: {meta['error']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
