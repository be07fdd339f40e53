#!/usr/bin/env python3
"""Writes onnx_models/rules/<file>.onnx: for each optimiser rule file (rewrites/<file>.rules), one
tiny model on which the rules of that file fire, plus `epilogue_acts.onnx` (every epilogue activation
after a conv and after a gemm, in the forms exporters write them), on which the activation rules of
layout.rules and fusion.rules fire. tests/egraph_models.rs asserts that EVERY rule fires on one of
its file's models (from the explain report's `rules_applied`) and checks the optimised graphs
against the originals.

Deterministic (models seeded from their names, via generate.py's ModelBuilder). Each model is
checked and run once with ONNX Runtime before it is written.

Usage: rule_models.py [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import ModelBuilder, conv_bn, gelu_erf, smoke_run  # noqa: E402


def conv(b, x, c_in, c_out, k=1, bias=False, pad=0):
    w = b.he("w", (c_out, c_in, k, k), c_in * k * k)
    ins = [x, w] + ([b.small("cb", (c_out,))] if bias else [])
    return b.node("Conv", ins, kernel_shape=[k, k], pads=[pad] * 4)


def conv1d(b, x, c_in, c_out, k=3):
    w = b.he("w", (c_out, c_in, k), c_in * k)
    return b.node("Conv", [x, w], kernel_shape=[k], pads=[k // 2] * 2)


def bn(b, x, c):
    return b.node("BatchNormalization", [x, b.floats("bn_scale", b.rng.uniform(0.5, 1.5, c)),
                                         b.small("bn_bias", (c,)), b.small("bn_mean", (c,)),
                                         b.floats("bn_var", b.rng.uniform(0.5, 1.5, c))], epsilon=1e-5)


def cleanup():
    b = ModelBuilder("cleanup", "Every cleanup.rules rule: Identity, BN on 4-D/3-D/2-D inputs, per-channel "
                     "constants, BN folded into convs with and without bias, 1-D convs with BN, Relu and "
                     "residual adds.")
    x = b.input("x", [1, 4, 6, 6])
    # conv without bias -> BN: conv-fold-scale, conv-fold-shift.
    y0 = bn(b, conv(b, b.node("Identity", [x]), 4, 8), 8)
    # conv with bias -> BN: conv-fold-scale-bias, conv-fold-shift-bias.
    y1 = bn(b, conv(b, x, 4, 8, bias=True), 8)
    # [C,1,1] constants on a non-conv activation: add-per-channel, mul-per-channel.
    r = b.node("Relu", [x])
    y2 = b.node("Add", [b.node("Mul", [r, b.small("s", (4, 1, 1))]), b.small("t", (4, 1, 1))])
    y2 = b.node("Add", [b.small("t", (4, 1, 1)), b.node("Mul", [b.small("s", (4, 1, 1)), y2])])
    # BN on rank 3 and rank 2 inputs.
    s = b.input("s", [2, 4, 5])
    y3 = bn(b, s, 4)
    v = b.input("v", [3, 4])
    y4 = bn(b, v, 4)
    # 1-D convs (imported between squeeze/unsqueeze views): conv+BN+Relu, conv+BN, residual add of
    # the block input and Relu (squeeze-mul-chan, squeeze-add-chan, squeeze-act, unsqueeze-squeeze
    # between the convs, squeeze-add-operand), then the residual on the left (squeeze-operand-add).
    u = b.input("u", [1, 4, 10])
    h = b.node("Relu", [bn(b, conv1d(b, u, 4, 4), 4)])
    y5 = b.node("Relu", [b.node("Add", [bn(b, conv1d(b, h, 4, 4), 4), u])])
    y5 = b.node("Add", [u, conv1d(b, y5, 4, 4)])
    b.output(y0, y1, y2, y3, y4, y5)
    return b


def layout():
    b = ModelBuilder("layout", "Every layout.rules rule: convs go NHWC; transposes sink through activations, "
                     "binary ops of two convs, per-channel constants (both operand orders) and pooling, "
                     "and cancel in pairs.")
    x = b.input("x", [1, 4, 8, 8])
    a = conv(b, x, 4, 8)
    c = conv(b, x, 4, 8, k=3, pad=1)
    # sink-act, then a conv on the result: cancel-to-nhwc.
    r = b.node("Relu", [a])
    d = conv(b, r, 8, 8)
    # two NHWC producers combined: sink-add/sub/mul/div/max/min.
    e = b.node("Add", [d, c])
    e = b.node("Sub", [e, c])
    e = b.node("Mul", [e, c])
    e = b.node("Div", [e, b.node("Sigmoid", [c])])
    e = b.node("Max", [e, c])
    e = b.node("Min", [e, c])
    # per-channel constants in both orders, on a non-conv value (so cleanup cannot fold them).
    f = b.node("Add", [e, b.small("t", (8, 1, 1))])
    f = b.node("Add", [b.small("t", (8, 1, 1)), f])
    f = b.node("Mul", [f, b.small("s", (8, 1, 1))])
    f = b.node("Mul", [b.small("s", (8, 1, 1)), f])
    p = b.node("MaxPool", [f], kernel_shape=[2, 2], strides=[2, 2])
    # channel concats of NHWC producers, 2, 3 and 4 inputs.
    q = conv(b, p, 8, 4)
    cat = b.node("Concat", [q, conv(b, p, 8, 4)], axis=1)
    cat = b.node("Concat", [conv(b, cat, 8, 4), q, conv(b, p, 8, 4)], axis=1)
    cat = b.node("Concat", [conv(b, cat, 12, 4), q, b.node("Relu", [q]), conv(b, p, 8, 4)], axis=1)
    p = b.node("Add", [p, conv(b, cat, 16, 8)])
    # NCHW output of the pooling path, read by the model input's twin: cancel-to-nchw.
    g = b.node("GlobalAveragePool", [p])
    flat = b.node("Flatten", [g], axis=1)
    b.output(flat, b.node("Add", [p, b.node("Transpose", [b.node("Transpose", [p], perm=[0, 2, 3, 1])],
                                                          perm=[0, 3, 1, 2])]))
    return b


def fusion():
    b = ModelBuilder("fusion", "Every fusion.rules rule: conv and gemm epilogues (bias, residual, activation), "
                     "GELU (three Erf forms), SiLU, decomposed layernorm.")
    x = b.input("x", [1, 4, 6, 6])
    # conv + bias (as a separate Add, twice) + residual + relu.
    y = conv(b, x, 4, 4)
    y = b.node("Add", [y, b.small("t", (4, 1, 1))])
    y = b.node("Add", [y, b.small("t", (4, 1, 1))])
    y = b.node("Relu", [b.node("Add", [x, y])])
    # activation before the residual add: relu(conv) + y, clip(conv, 0, 6) + y.
    y = b.node("Add", [b.node("Relu", [conv(b, y, 4, 4, k=3, pad=1)]), y])
    lo, hi = b.init("zero", np.array(0.0, np.float32)), b.init("six", np.array(6.0, np.float32))
    y = b.node("Add", [y, b.node("Clip", [conv(b, y, 4, 4), lo, hi])])
    m = b.input("m", [2, 3, 8])
    h = b.node("Add", [b.node("MatMul", [m, b.he("w", (8, 8), 8)]), b.small("bias", (8,))])
    h = b.node("Add", [m, h])
    h = b.node("Relu", [h])
    # three GELU forms.
    g1 = gelu_erf(b, b.node("MatMul", [h, b.he("w", (8, 8), 8)]))
    g2in = b.node("MatMul", [g1, b.he("w", (8, 8), 8)])
    e = b.node("Erf", [b.node("Div", [g2in, b.init("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
    one = b.node("Add", [e, b.init("one", np.array(1.0, np.float32))])
    g2 = b.node("Mul", [g2in, b.node("Mul", [one, b.init("half", np.array(0.5, np.float32))])])
    g3in = b.node("MatMul", [g2, b.he("w", (8, 8), 8)])
    e = b.node("Erf", [b.node("Mul", [g3in, b.init("rsqrt2", np.array(1 / math.sqrt(2.0), np.float32))])])
    one = b.node("Add", [e, b.init("one", np.array(1.0, np.float32))])
    g3 = b.node("Mul", [b.node("Mul", [g3in, one]), b.init("half", np.array(0.5, np.float32))])
    s = b.node("Mul", [g3, b.node("Sigmoid", [g3])])
    # decomposed layernorm.
    mean = b.node("ReduceMean", [s], axes=[-1], keepdims=1)
    d = b.node("Sub", [s, mean])
    var = b.node("ReduceMean", [b.node("Pow", [d, b.init("two", np.array(2.0, np.float32))])], axes=[-1], keepdims=1)
    sd = b.node("Sqrt", [b.node("Add", [var, b.init("eps", np.array(1e-5, np.float32))])])
    ln = b.node("Add", [b.node("Mul", [b.node("Div", [d, sd]), b.floats("gamma", b.rng.uniform(0.5, 1.5, 8))]),
                        b.small("beta", (8,))])
    b.output(y, ln)
    return b


def scalar(b, base, v):
    return b.init(base, np.array(v, np.float32))


def gelu_tanh(b, x, cube, half_first, const_left):
    """GELU, Tanh form, as exporters write it: 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))).

    cube: x^3 as Pow(x, 3) or x*x*x; half_first: (x*0.5)*(1 + t) (HF NewGELU) or (x*(1 + t))*0.5
    (torch.onnx); const_left: scalar constants as the first operand (Mul(0.5, x), as torch.onnx
    writes them) or the second."""
    def mul(u, v):
        return b.node("Mul", [v, u] if const_left else [u, v])

    def add(u, v):
        return b.node("Add", [v, u] if const_left else [u, v])

    x3 = (b.node("Pow", [x, scalar(b, "three", 3.0)]) if cube == "pow"
          else b.node("Mul", [b.node("Mul", [x, x]), x]))
    inner = mul(b.node("Add", [x, mul(x3, scalar(b, "kappa", 0.044715))]), scalar(b, "beta", math.sqrt(2.0 / math.pi)))
    t = add(b.node("Tanh", [inner]), scalar(b, "one", 1.0))
    if half_first:
        return b.node("Mul", [mul(x, scalar(b, "half", 0.5)), t])
    return mul(b.node("Mul", [x, t]), scalar(b, "half", 0.5))


def hardswish_clip(b, x, by):
    """HardSwish written out: x * Clip(x + 3, 0, 6) / 6 (by="div") or * (1/6) (by="mul")."""
    c = b.node("Clip", [b.node("Add", [x, scalar(b, "three", 3.0)]), scalar(b, "zero", 0.0), scalar(b, "six", 6.0)])
    xc = b.node("Mul", [x, c])
    if by == "div":
        return b.node("Div", [xc, scalar(b, "six", 6.0)])
    return b.node("Mul", [scalar(b, "sixth", 1.0 / 6.0), xc])


# Every epilogue activation, in the form(s) exporters write it; `epilogue_acts` applies each
# after a conv and after a gemm (MatMul + Add). Names are the kernel detail spellings.
EPILOGUE_ACTS = [
    ("relu", lambda b, y, conv: b.node("Relu", [y])),
    ("clip:0:6", lambda b, y, conv: b.node("Clip", [y, scalar(b, "zero", 0.0), scalar(b, "six", 6.0)])),
    ("sigmoid", lambda b, y, conv: b.node("Sigmoid", [y])),
    ("silu", lambda b, y, conv: b.node("Mul", [y, b.node("Sigmoid", [y])])),
    ("gelu", lambda b, y, conv: gelu_erf(b, y)),
    # The four Tanh-GELU spellings, two after convs and two after gemms.
    ("gelu_tanh", lambda b, y, conv: gelu_tanh(b, y, "pow", half_first=conv, const_left=conv)),
    ("gelu_tanh", lambda b, y, conv: gelu_tanh(b, y, "cube", half_first=not conv, const_left=conv)),
    ("hardswish", lambda b, y, conv: b.node("HardSwish", [y])),
    ("hardswish", lambda b, y, conv: hardswish_clip(b, y, "div" if conv else "mul")),
    ("hardswish", lambda b, y, conv: b.node("Mul", [y, b.node("HardSigmoid", [y], alpha=1.0 / 6.0, beta=0.5)])),
    ("tanh", lambda b, y, conv: b.node("Tanh", [y])),
    ("leaky:0.1", lambda b, y, conv: b.node("LeakyRelu", [y], alpha=0.1)),
]


def epilogue_acts():
    b = ModelBuilder("epilogue_acts", "Every epilogue activation (relu, relu6, sigmoid, silu, Erf and Tanh GELU, "
                     "hardswish in its op and written-out forms, tanh, leaky relu) after a conv and after a gemm: "
                     "each fuses into the kernel's epilogue.")
    y = b.input("x", [1, 4, 6, 6])
    h = b.input("m", [3, 8])
    for _, act in EPILOGUE_ACTS:
        y = act(b, conv(b, y, 4, 4, bias=True), True)
        h = act(b, b.node("Add", [b.node("MatMul", [h, b.he("w", (8, 8), 8)]), b.small("bias", (8,))]), False)
    b.output(y, h)
    return b


def shared_producer():
    b = ModelBuilder("shared_producer", "A conv+BN feeding two residual adds (each then Relu): the conv must stay one "
                     "kernel, not be duplicated into two fused epilogues.")
    x = b.input("x", [1, 4, 6, 6])
    y = conv_bn(b, x, 4, 4, 3, pad=1)
    u = b.node("Relu", [b.node("Add", [y, x])])
    v = b.node("Relu", [b.node("Add", [y, b.node("Sigmoid", [x])])])
    b.output(u, v)
    return b


def attention():
    b = ModelBuilder("attention", "The attention rules of fusion.rules: scaled dot-product attention as PyTorch "
                     "exports it (heads split by Reshape and Transpose, scores multiplied or divided by a "
                     "constant, with and without an additive mask; heads-last and heads-first), eight "
                     "blocks, each fused into one kernel.")
    x = b.input("x", [2, 5, 16])
    mask = b.input("mask", [2, 1, 1, 5])
    heads = b.ints("heads", [0, 0, 2, 8])
    merged = b.ints("merged", [0, 0, 16])
    for how, masked in (("Mul", True), ("Div", True), ("Mul", False), ("Div", False)):
        def proj(base):
            return b.node("Reshape", [b.node("MatMul", [x, b.he(base, (16, 16), 16)]), heads])
        q = b.node("Transpose", [proj("wq")], perm=[0, 2, 1, 3])
        k = b.node("Transpose", [proj("wk")], perm=[0, 2, 3, 1])
        v = b.node("Transpose", [proj("wv")], perm=[0, 2, 1, 3])
        c = b.init("scale", np.array(0.35 if how == "Mul" else 2.8, np.float32))
        s = b.node(how, [b.node("MatMul", [q, k]), c])
        if masked:
            s = b.node("Add", [s, mask])
        o = b.node("MatMul", [b.node("Softmax", [s], axis=-1), v])
        o = b.node("Reshape", [b.node("Transpose", [o], perm=[0, 2, 1, 3]), merged])
        x = b.node("Add", [x, o])
    # Heads-first blocks (the attention-bhsd-* rules): q and v [B, H, S, D], the scores' right
    # operand kᵀ [B, H, D, S] made by a transpose of k's last two axes (torch.onnx) or by
    # reshape-transpose-reshape (torch.export); the scale split as √scale on q and kᵀ, or
    # applied once to the scores; with and without the mask.
    flat = b.ints("flat", [4, 5, 8])
    flat_t = b.ints("flat_t", [2, 2, 8, 5])
    for split, masked in ((True, False), (True, True), (False, False), (False, True)):
        def heads_first(base):
            return b.node("Transpose", [b.node("Reshape", [b.node("MatMul", [x, b.he(base, (16, 16), 16)]), heads])],
                          perm=[0, 2, 1, 3])
        q, k, v = heads_first("wq"), heads_first("wk"), heads_first("wv")
        if split:
            kt = b.node("Transpose", [k], perm=[0, 1, 3, 2])
            r = b.init("root_scale", np.array(0.59, np.float32))
            s = b.node("MatMul", [b.node("Mul", [q, r]), b.node("Mul", [kt, r])])
        else:
            kt = b.node("Reshape", [b.node("Transpose", [b.node("Reshape", [k, flat])], perm=[0, 2, 1]), flat_t])
            s = b.node("Mul", [b.node("MatMul", [q, kt]), b.init("scale", np.array(0.35, np.float32))])
        if masked:
            s = b.node("Add", [s, mask])
        o = b.node("MatMul", [b.node("Softmax", [s], axis=-1), v])
        o = b.node("Reshape", [b.node("Transpose", [o], perm=[0, 2, 1, 3]), merged])
        x = b.node("Add", [x, o])
    b.output(x)
    return b


def se(b, y, c, squeeze, act, gate, scale_first, bias1=True):
    """A squeeze-and-excitation block over y's c channels, as torchvision exports them: the scale
    (pooling, 1x1 conv, SiLU or ReLU, 1x1 conv, Sigmoid or HardSigmoid gate) times y."""
    s = b.node("GlobalAveragePool", [y])
    s = conv(b, s, c, squeeze, bias=bias1)
    s = b.node("Mul", [s, b.node("Sigmoid", [s])]) if act == "silu" else b.node("Relu", [s])
    s = conv(b, s, squeeze, c, bias=True)
    s = b.node("Sigmoid", [s]) if gate == "sigmoid" else b.node("HardSigmoid", [s], alpha=1.0 / 6.0, beta=0.5)
    return b.node("Mul", [s, y] if scale_first else [y, s])


def squeeze_excite():
    b = ModelBuilder("squeeze_excite", "The squeeze_excite.rules rules: squeeze-and-excitation blocks as torchvision "
                     "exports them, EfficientNet-style (SiLU written as x*Sigmoid(x), Sigmoid gate, scale * x, a "
                     "squeeze width of 6) and MobileNetV3-style (HardSwish before, ReLU, HardSigmoid gate, x * "
                     "scale, no bias on the first dense layer), each fused into one scale kernel; and a pooled "
                     "scale multiplying a tensor other than the pooled one, which must stay unfused.")
    x = b.input("x", ["N", 8, 6, 6])

    # EfficientNet MBConv: expand 1x1 + SiLU, depthwise 3x3 + SiLU, SE, project 1x1.
    h = conv(b, x, 8, 24, bias=True)
    h = b.node("Mul", [h, b.node("Sigmoid", [h])])
    h = b.node("Conv", [h, b.he("dw", (24, 1, 3, 3), 9), b.small("dwb", (24,))], kernel_shape=[3, 3], pads=[1] * 4,
               group=24)
    h = b.node("Mul", [h, b.node("Sigmoid", [h])])
    h = conv(b, se(b, h, 24, 6, "silu", "sigmoid", scale_first=True), 24, 16, bias=True)
    # MobileNetV3 block: depthwise + HardSwish, SE (ReLU, HardSigmoid), project.
    m = b.node("Conv", [h, b.he("dw", (16, 1, 3, 3), 9), b.small("dwb", (16,))], kernel_shape=[3, 3], pads=[1] * 4,
               group=16)
    m = b.node("HardSwish", [m])
    m = conv(b, se(b, m, 16, 8, "relu", "hardsigmoid", scale_first=False, bias1=False), 16, 16, bias=True)
    # Not a squeeze-and-excitation: the scale pooled from m multiplies another tensor.
    other = b.node("Relu", [conv(b, m, 16, 16, bias=True)])
    s = b.node("Sigmoid", [conv(b, b.node("Relu", [conv(b, b.node("GlobalAveragePool", [m]), 16, 8, bias=True)]), 8, 16,
                                bias=True)])
    b.output(b.node("Mul", [s, other]))
    return b


def squeeze_excite_projection():
    b = ModelBuilder("squeeze_excite_projection", "Squeeze-and-excitation scales folded into the next 1x1 "
                     "convolution's weights (src/egraph/se_fold.rs): on 24x24 images (576 pixels, more than "
                     "the fold's 512) an EfficientNet MBConv block (expand, depthwise, SE with SiLU and a Sigmoid "
                     "gate, scale * x, projection with a residual add) and a MobileNetV3-style block (ReLU, "
                     "HardSigmoid gate, x * scale, projection to 24 channels, no residual).")
    x = b.input("x", ["N", 16, 24, 24])

    def block(y, c_in, c, k, squeeze, act, gate, scale_first, residual):
        h = conv(b, y, c_in, c, bias=True)
        h = b.node("Mul", [h, b.node("Sigmoid", [h])])
        h = b.node("Conv", [h, b.he("dw", (c, 1, 3, 3), 9), b.small("dwb", (c,))], kernel_shape=[3, 3],
                   pads=[1] * 4, group=c)
        h = b.node("Mul", [h, b.node("Sigmoid", [h])])
        out = conv(b, se(b, h, c, squeeze, act, gate, scale_first), c, k, bias=True)
        return b.node("Add", [out, y]) if residual else out

    h = block(x, 16, 32, 16, 8, "silu", "sigmoid", scale_first=True, residual=True)
    b.output(block(h, 16, 48, 24, 8, "relu", "hardsigmoid", scale_first=False, residual=False))
    return b


def squeeze_excite_depthwise():
    b = ModelBuilder("squeeze_excite_depthwise", "A depthwise 3x3 conv and a squeeze-and-excitation block over 24 "
                     "channels (squeeze width 6, SiLU, Sigmoid): every kernel after optimisation is one of "
                     "onnx2ait's own (no CUTLASS instance), so tests/codegen.rs builds it with nvcc in seconds.")
    x = b.input("x", ["N", 24, 7, 7])
    h = b.node("Conv", [x, b.he("dw", (24, 1, 3, 3), 9), b.small("dwb", (24,))], kernel_shape=[3, 3], pads=[1] * 4,
               group=24)
    h = b.node("Mul", [h, b.node("Sigmoid", [h])])
    s = conv(b, b.node("GlobalAveragePool", [h]), 24, 6, bias=True)
    s = b.node("Sigmoid", [conv(b, b.node("Mul", [s, b.node("Sigmoid", [s])]), 6, 24, bias=True)])
    b.output(b.node("Mul", [s, h]))
    return b


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "rules")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for fn in (cleanup, layout, fusion, epilogue_acts, shared_producer, attention, squeeze_excite,
               squeeze_excite_depthwise, squeeze_excite_projection):
        m = fn().build()
        onnx.checker.check_model(m, full_check=True)
        smoke_run(m, None)
        onnx.save_model(m, str(args.out / f"{fn.__name__}.onnx"))
        print(f"wrote {args.out / (fn.__name__ + '.onnx')} ({len(m.graph.node)} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
