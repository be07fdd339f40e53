#!/usr/bin/env python3
"""Writes torchvision's EfficientNet-B0, MobileNetV2 and MobileNetV3-Large in the topology the
TorchScript exporter (`torch.onnx.export(..., dynamo=False)`, opset 17, eval mode) produces for
them, with random weights, so the optimiser and code generation can be checked on these CNN
families without torch (issue 15):

- BatchNormalization folded into the convolutions (the exporter's eval-mode folding): every conv
  has a bias.
- SiLU as `Mul(x, Sigmoid(x))`, ReLU6 as `Clip(x, 0, 6)`, HardSwish and HardSigmoid as the ONNX
  ops (opset 14+; HardSigmoid with alpha 1/6, beta 0.5).
- Squeeze-and-excitation (torchvision.ops.SqueezeExcitation): `GlobalAveragePool -> Conv 1x1
  (+bias) -> act -> Conv 1x1 (+bias) -> Sigmoid | HardSigmoid -> Mul(scale, x)` (scale first,
  as `scale * input` exports). EfficientNet-B0: squeeze = max(1, block input // 4), SiLU;
  MobileNetV3: squeeze = make_divisible(expanded // 4, 8), ReLU, HardSigmoid.
- Head: GlobalAveragePool -> Flatten -> Gemm (MobileNetV3: Gemm -> HardSwish -> Gemm); the
  classifier's Dropout is gone in eval mode.

Input `input` [batch, 3, 224, 224] (symbolic batch), output `logits` [batch, 1000]. He-normal
weights (fan-in; depthwise fan-in = k²), small biases, seeded per model: values are O(1) through
the network, which is all the optimiser and code generation need. Opset 17, IR version 8.

Usage: cnn_families.py --out DIR [--model efficientnet_b0|mobilenet_v2|mobilenet_v3_large ...]
Writes DIR/<model>.onnx (efficientnet_b0 ~21 MB, mobilenet_v2 ~14 MB, mobilenet_v3_large ~22 MB).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
NUM_CLASSES = 1000


class Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def param(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def node(self, op: str, scope: str, inputs: list[str], **attrs) -> str:
        self.count += 1
        name = f"{scope}/{op}_{self.count}"
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, x: str, module: str, c_in: int, c_out: int, k: int = 1, stride: int = 1, groups: int = 1) -> str:
        fan_in = (c_in // groups) * k * k
        w = self.rng.standard_normal((c_out, c_in // groups, k, k)) * math.sqrt(2.0 / fan_in)
        b = self.rng.normal(0.0, 0.05, c_out)
        pad = (k - 1) // 2
        return self.node("Conv", module, [x, self.param(f"{module}.weight", w), self.param(f"{module}.bias", b)],
                         dilations=[1, 1], group=groups, kernel_shape=[k, k], pads=[pad] * 4,
                         strides=[stride, stride])

    def act(self, x: str, module: str, kind: str) -> str:
        if kind == "silu":
            return self.node("Mul", module, [x, self.node("Sigmoid", module, [x])])
        if kind == "relu":
            return self.node("Relu", module, [x])
        if kind == "relu6":
            lo = self.param(f"{module}.clip_min_{self.count}", np.array(0.0))
            hi = self.param(f"{module}.clip_max_{self.count}", np.array(6.0))
            return self.node("Clip", module, [x, lo, hi])
        if kind == "hardswish":
            return self.node("HardSwish", module, [x])
        if kind == "none":
            return x
        raise ValueError(kind)

    def squeeze_excite(self, x: str, module: str, c: int, squeeze: int, act: str, gate: str) -> str:
        s = self.node("GlobalAveragePool", f"{module}/avgpool", [x])
        s = self.act(self.conv(s, f"{module}.fc1", c, squeeze), f"{module}/activation", act)
        s = self.conv(s, f"{module}.fc2", squeeze, c)
        if gate == "sigmoid":
            s = self.node("Sigmoid", f"{module}/scale_activation", [s])
        else:
            s = self.node("HardSigmoid", f"{module}/scale_activation", [s], alpha=1.0 / 6.0, beta=0.5)
        return self.node("Mul", module, [s, x])

    def gemm(self, x: str, module: str, c_in: int, c_out: int) -> str:
        w = self.rng.standard_normal((c_out, c_in)) * math.sqrt(1.0 / c_in)
        b = self.rng.normal(0.0, 0.01, c_out)
        return self.node("Gemm", module, [x, self.param(f"{module}.weight", w), self.param(f"{module}.bias", b)],
                         alpha=1.0, beta=1.0, transB=1)


def make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


def efficientnet_b0(net: Net) -> str:
    # (expand_ratio, kernel, stride, in, out, layers), torchvision's _efficientnet_conf for B0.
    conf = [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
            (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]
    y = net.act(net.conv("input", "/features/features.0/features.0.0", 3, 32, 3, 2), "/features/features.0", "silu")
    i = 1
    for e, k, s, c_in, c_out, n in conf:
        for j in range(n):
            m = f"/features/features.{i}/features.{i}.{j}"
            cin = c_in if j == 0 else c_out
            stride = s if j == 0 else 1
            exp = cin * e
            h = y
            if exp != cin:
                h = net.act(net.conv(h, f"{m}/block.0", cin, exp), f"{m}/block.0", "silu")
            b = len([1 for _ in ([0] if exp != cin else [])])
            h = net.act(net.conv(h, f"{m}/block.{b}", exp, exp, k, stride, groups=exp), f"{m}/block.{b}", "silu")
            h = net.squeeze_excite(h, f"{m}/block.{b + 1}", exp, max(1, cin // 4), "silu", "sigmoid")
            h = net.conv(h, f"{m}/block.{b + 2}", exp, c_out)
            if stride == 1 and cin == c_out:
                h = net.node("Add", m, [h, y])
            y = h
        i += 1
    y = net.act(net.conv(y, "/features/features.8", 320, 1280), "/features/features.8", "silu")
    y = net.node("Flatten", "", [net.node("GlobalAveragePool", "/avgpool", [y])], axis=1)
    return net.gemm(y, "/classifier/classifier.1", 1280, NUM_CLASSES)


def mobilenet_v2(net: Net) -> str:
    conf = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]
    y = net.act(net.conv("input", "/features/features.0", 3, 32, 3, 2), "/features/features.0", "relu6")
    c_in, i = 32, 1
    for t, c, n, s in conf:
        for j in range(n):
            m = f"/features/features.{i}"
            stride = s if j == 0 else 1
            hidden = c_in * t
            h = y
            if t != 1:
                h = net.act(net.conv(h, f"{m}/conv.0", c_in, hidden), f"{m}/conv.0", "relu6")
            h = net.act(net.conv(h, f"{m}/conv.1", hidden, hidden, 3, stride, groups=hidden), f"{m}/conv.1", "relu6")
            h = net.conv(h, f"{m}/conv.2", hidden, c)
            if stride == 1 and c_in == c:
                h = net.node("Add", m, [y, h])
            y, c_in = h, c
            i += 1
    y = net.act(net.conv(y, "/features/features.18", 320, 1280), "/features/features.18", "relu6")
    y = net.node("Flatten", "", [net.node("GlobalAveragePool", "", [y])], axis=1)
    return net.gemm(y, "/classifier/classifier.1", 1280, NUM_CLASSES)


def mobilenet_v3_large(net: Net) -> str:
    # (input, kernel, expanded, out, use_se, activation, stride), torchvision's large config.
    conf = [(16, 3, 16, 16, False, "relu", 1), (16, 3, 64, 24, False, "relu", 2), (24, 3, 72, 24, False, "relu", 1),
            (24, 5, 72, 40, True, "relu", 2), (40, 5, 120, 40, True, "relu", 1), (40, 5, 120, 40, True, "relu", 1),
            (40, 3, 240, 80, False, "hardswish", 2), (80, 3, 200, 80, False, "hardswish", 1),
            (80, 3, 184, 80, False, "hardswish", 1), (80, 3, 184, 80, False, "hardswish", 1),
            (80, 3, 480, 112, True, "hardswish", 1), (112, 3, 672, 112, True, "hardswish", 1),
            (112, 5, 672, 160, True, "hardswish", 2), (160, 5, 960, 160, True, "hardswish", 1),
            (160, 5, 960, 160, True, "hardswish", 1)]
    y = net.act(net.conv("input", "/features/features.0", 3, 16, 3, 2), "/features/features.0", "hardswish")
    for i, (cin, k, exp, cout, se, act, stride) in enumerate(conf, start=1):
        m = f"/features/features.{i}"
        h = y
        if exp != cin:
            h = net.act(net.conv(h, f"{m}/block.0", cin, exp), f"{m}/block.0", act)
        h = net.act(net.conv(h, f"{m}/block.dw", exp, exp, k, stride, groups=exp), f"{m}/block.dw", act)
        if se:
            h = net.squeeze_excite(h, f"{m}/block.se", exp, make_divisible(exp // 4, 8), "relu", "hardsigmoid")
        h = net.conv(h, f"{m}/block.project", exp, cout)
        if stride == 1 and cin == cout:
            h = net.node("Add", m, [h, y])
        y = h
    y = net.act(net.conv(y, "/features/features.16", 160, 960), "/features/features.16", "hardswish")
    y = net.node("Flatten", "", [net.node("GlobalAveragePool", "/avgpool", [y])], axis=1)
    y = net.act(net.gemm(y, "/classifier/classifier.0", 960, 1280), "/classifier/classifier.1", "hardswish")
    return net.gemm(y, "/classifier/classifier.3", 1280, NUM_CLASSES)


MODELS = {"efficientnet_b0": (efficientnet_b0, 70), "mobilenet_v2": (mobilenet_v2, 71),
          "mobilenet_v3_large": (mobilenet_v3_large, 72)}


def build(name: str) -> onnx.ModelProto:
    fn, seed = MODELS[name]
    net = Net(seed)
    out = fn(net)
    net.nodes.append(helper.make_node("Identity", [out], ["logits"], name="/logits/Identity"))
    graph = helper.make_graph(
        net.nodes, "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", NUM_CLASSES])],
        initializer=net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pytorch",
                              producer_version="2.5.0")
    model.ir_version = IR_VERSION
    model.doc_string = (f"torchvision {name} in the TorchScript exporter's topology (BN folded), random weights "
                        f"(seed {seed}); written by onnx_models/cnn_families.py.")
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="output folder")
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="default: all")
    ap.add_argument("--check", action="store_true", help="also run each once with ONNX Runtime")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.model or sorted(MODELS):
        model = build(name)
        onnx.checker.check_model(model, full_check=True)
        path = args.out / f"{name}.onnx"
        onnx.save_model(model, str(path))
        n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
        print(f"wrote {path} ({len(model.graph.node)} nodes, {n_params / 1e6:.2f} M parameters)")
        if args.check:
            import onnxruntime as ort

            sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
            (logits,) = sess.run(None, {"input": x})
            print(f"  ORT: logits {logits.shape}, std {logits.std():.4f}, max |x| {np.abs(logits).max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
