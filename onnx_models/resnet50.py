#!/usr/bin/env python3
"""Writes a full ResNet-50 (v1.5) in the topology `torch.onnx.export` produces for torchvision's
`resnet50()` in eval mode WITHOUT BatchNorm folding (as exported with `do_constant_folding=False`,
so every BatchNormalization stays a node for the optimiser to fold):

    Conv 7x7/2 (no bias) -> BatchNormalization -> Relu -> MaxPool 3x3/2 pad 1
    4 stages of bottlenecks (3, 4, 6, 3 blocks; widths 64, 128, 256, 512; expansion 4):
        1x1 Conv -> BN -> Relu -> 3x3 Conv (stride on the 3x3, "v1.5") -> BN -> Relu -> 1x1 Conv -> BN
        shortcut: identity, or 1x1 Conv (stride) -> BN on the first block of each stage
        Add -> Relu
    GlobalAveragePool -> Flatten(axis 1) -> Gemm(2048 -> 1000, transB=1)

Input `input` [N,3,224,224] with a symbolic batch dim "N", output `logits` [N,1000]. Initializer
and node names follow the exporter (`layer1.0.conv1.weight`, `/layer1/layer1.0/conv1/Conv`).
Random weights with a fixed seed: He-normal convs (fan-in), BN statistics drawn so every BN is
well-conditioned (var in [0.5, 1.5]) and the residual stream stays O(1) (small gamma on each
block's last BN, like torchvision's zero_init_residual but nonzero). Opset 17, ir_version 8.

Usage: resnet50.py [--out PATH]   (default: onnx_models/generated/resnet50.onnx, ~100 MB)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PINNED = {"onnx": "1.23.2", "numpy": "2.3.5"}
OPSET = 17
IR_VERSION = 8
SEED = 50
STAGES = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]  # (width, blocks, stride of first block)
EXPANSION = 4
NUM_CLASSES = 1000


class Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def param(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def node(self, op: str, scope: str, inputs: list[str], **attrs) -> str:
        # The exporter names nodes by module path and op ("/layer1/layer1.0/conv1/Conv") and
        # their outputs by the node name plus "_output_0".
        name = f"{scope}/{op}"
        out = f"{name}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=name, **attrs))
        return out

    def conv(self, x: str, module: str, c_in: int, c_out: int, k: int, stride: int) -> str:
        fan_in = c_in * k * k
        w = self.rng.standard_normal((c_out, c_in, k, k)) * math.sqrt(2.0 / fan_in)
        pad = k // 2
        return self.node("Conv", scope(module), [x, self.param(f"{module}.weight", w)], dilations=[1, 1], group=1,
                         kernel_shape=[k, k], pads=[pad] * 4, strides=[stride, stride])

    def bn(self, x: str, module: str, c: int, gamma_range=(0.5, 1.0)) -> str:
        g = self.rng.uniform(*gamma_range, c)
        b = self.rng.normal(0.0, 0.1, c)
        mean = self.rng.normal(0.0, 0.1, c)
        var = self.rng.uniform(0.5, 1.5, c)
        ins = [x] + [self.param(f"{module}.{p}", a) for p, a in
                     (("weight", g), ("bias", b), ("running_mean", mean), ("running_var", var))]
        return self.node("BatchNormalization", scope(module), ins, epsilon=1e-5, momentum=0.9)

    def relu(self, x: str, module: str) -> str:
        return self.node("Relu", scope(module), [x])


def scope(module: str) -> str:
    """`layer1.0.conv1` -> `/layer1/layer1.0/conv1` (the exporter's scope names)."""
    parts = module.split(".")
    # A numeric part is an index into a Sequential: its scope is `<parent>.<index>`, e.g.
    # /layer1/layer1.0/conv1 and /layer1/layer1.0/downsample/downsample.0.
    res, path = [], []
    for p in parts:
        path.append(p)
        res.append(".".join(path[-2:]) if p.isdigit() else p)
    return "/" + "/".join(res)


def bottleneck(net: Net, x: str, name: str, c_in: int, width: int, stride: int) -> str:
    c_out = width * EXPANSION
    y = net.relu(net.bn(net.conv(x, f"{name}.conv1", c_in, width, 1, 1), f"{name}.bn1", width), f"{name}.relu")
    y = net.relu(net.bn(net.conv(y, f"{name}.conv2", width, width, 3, stride), f"{name}.bn2", width), f"{name}.relu_1")
    # Small gamma on the last BN keeps the residual stream O(1) through 16 blocks.
    y = net.bn(net.conv(y, f"{name}.conv3", width, c_out, 1, 1), f"{name}.bn3", c_out, gamma_range=(0.1, 0.3))
    if stride != 1 or c_in != c_out:
        short = net.bn(net.conv(x, f"{name}.downsample.0", c_in, c_out, 1, stride), f"{name}.downsample.1", c_out)
    else:
        short = x
    y = net.node("Add", scope(name), [y, short])
    return net.relu(y, f"{name}.relu_2")


def build(seed: int = SEED) -> onnx.ModelProto:
    net = Net(seed)
    x = "input"
    y = net.relu(net.bn(net.conv(x, "conv1", 3, 64, 7, 2), "bn1", 64), "relu")
    y = net.node("MaxPool", scope("maxpool"), [y], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                 strides=[2, 2])
    c_in = 64
    for s, (width, blocks, stride) in enumerate(STAGES, start=1):
        for i in range(blocks):
            y = bottleneck(net, y, f"layer{s}.{i}", c_in, width, stride if i == 0 else 1)
            c_in = width * EXPANSION
    y = net.node("GlobalAveragePool", scope("avgpool"), [y])
    y = net.node("Flatten", "", [y], axis=1)
    fc_w = net.rng.standard_normal((NUM_CLASSES, c_in)) * math.sqrt(1.0 / c_in)
    fc_b = net.rng.normal(0.0, 0.01, NUM_CLASSES)
    net.nodes.append(helper.make_node("Gemm", [y, net.param("fc.weight", fc_w), net.param("fc.bias", fc_b)], ["logits"],
                                      name="/fc/Gemm", alpha=1.0, beta=1.0, transB=1))
    graph = helper.make_graph(
        net.nodes,
        "main_graph",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", NUM_CLASSES])],
        initializer=net.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pytorch",
                              producer_version="2.5.0")
    model.ir_version = IR_VERSION
    model.doc_string = ("ResNet-50 v1.5 in torchvision's torch.onnx.export topology, eval mode, BatchNormalization not "
                        "folded; symbolic batch N; random He-init weights (seed %d). Written by "
                        "onnx_models/resnet50.py." % seed)
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "generated" / "resnet50.onnx")
    ap.add_argument("--check", action="store_true", help="also run it once with ONNX Runtime and print output stats")
    args = ap.parse_args()
    got = {"onnx": onnx.__version__, "numpy": np.__version__}
    if got != PINNED:
        raise SystemExit(f"resnet50.py needs {PINNED} for byte-identical output, found {got} (run scripts/setup-python.sh)")
    model = build()
    onnx.checker.check_model(model, full_check=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(args.out))
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    print(f"wrote {args.out} ({len(model.graph.node)} nodes, {n_params / 1e6:.2f} M parameters)")
    if args.check:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(args.out), providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
        (logits,) = sess.run(None, {"input": x})
        print(f"ORT: logits {logits.shape}, mean {logits.mean():.4f}, std {logits.std():.4f}, "
              f"max |x| {np.abs(logits).max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
