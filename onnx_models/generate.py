#!/usr/bin/env python3
"""Writes the small test models bundled in onnx_models/ (one or more per op family, plus the
graph patterns the optimiser targets).

Deterministic: pinned onnx==1.23.2 / numpy==2.3.5, every model seeded from its own name (adding a
model never changes another), ir_version 8, no timestamps. Running it twice gives byte-identical
files. Each model is checked with the ONNX checker (full shape inference) and executed once with
ONNX Runtime on random inputs before it is written, so every file here is a valid model that ORT
runs.

Usage: generate.py [--out DIR] [--check-only]
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

PINNED = {"onnx": "1.23.2", "numpy": "2.3.5"}
DEFAULT_OPSET = 17
IR_VERSION = 8
PRODUCER = "onnx2ait/onnx_models/generate.py"

F32, F16, I64, I32, BOOL = T.FLOAT, T.FLOAT16, T.INT64, T.INT32, T.BOOL


class ModelBuilder:
    """Collects nodes, initializers and graph inputs/outputs of one model."""

    def __init__(self, name: str, doc: str, opset: int = DEFAULT_OPSET, extra_opsets: dict[str, int] | None = None):
        self.name = name
        self.doc = doc
        self.opset = opset
        self.extra_opsets = extra_opsets or {}
        # Seeded from the model name, so models are independent of each other and of their order.
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[str] = []
        # Output shapes ONNX inference cannot derive (e.g. symbolic dims through shape subgraphs).
        self.declared: dict[str, list] = {}
        self.counts: dict[str, int] = {}

    def fresh(self, base: str) -> str:
        k = self.counts.get(base, 0)
        self.counts[base] = k + 1
        return f"{base}_{k}"

    def input(self, name: str, shape: list, dtype: int = F32) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def init(self, base: str, array: np.ndarray) -> str:
        name = self.fresh(base)
        # np.ascontiguousarray would turn 0-d (scalar) arrays into 1-d ones.
        self.inits.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def ints(self, base: str, values) -> str:
        return self.init(base, np.array(values, dtype=np.int64))

    def floats(self, base: str, values) -> str:
        return self.init(base, np.array(values, dtype=np.float32))

    def he(self, base: str, shape: tuple, fan_in: int, dtype=np.float32) -> str:
        """He-initialised weights: normal with std sqrt(2 / fan_in), so activations stay O(1)."""
        w = self.rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)
        return self.init(base, w.astype(dtype))

    def small(self, base: str, shape: tuple, scale: float = 0.1, dtype=np.float32) -> str:
        return self.init(base, (self.rng.standard_normal(shape) * scale).astype(dtype))

    def node(self, op: str, inputs: list, n_out: int = 1, domain: str = "", name: str | None = None, **attrs):
        """Adds a node; returns its output name (or the list of names when n_out > 1)."""
        name = name or self.fresh(op.lower())
        outs = [f"{name}_out{i}" if n_out > 1 else name for i in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=name, domain=domain, **attrs))
        return outs if n_out > 1 else outs[0]

    def output(self, *names: str) -> None:
        self.outputs.extend(names)

    def declare(self, name: str, shape: list) -> None:
        self.declared[name] = shape

    def build(self) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            [onnx.ValueInfoProto(name=o) for o in self.outputs],
            initializer=self.inits,
        )
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in sorted(self.extra_opsets.items())]
        model = helper.make_model(graph, opset_imports=opsets, producer_name=PRODUCER, producer_version="1")
        model.ir_version = IR_VERSION
        model.doc_string = self.doc
        graph.doc_string = self.doc
        # Output types (dtype and, symbolic where the inputs are, shape) come from ONNX shape
        # inference; intermediate value_info is dropped so the importer infers everything itself.
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        del model.graph.output[:]
        for out in inferred.graph.output:
            if out.name in self.declared:
                out = helper.make_tensor_value_info(out.name, out.type.tensor_type.elem_type, self.declared[out.name])
            for d in out.type.tensor_type.shape.dim:
                if d.dim_param.startswith("unk__") or not (d.HasField("dim_value") or d.HasField("dim_param")):
                    raise SystemExit(f"{self.name}: shape of output '{out.name}' not inferred: declare() it")
            model.graph.output.append(out)
        return model


MODELS: list = []


def model(fn):
    MODELS.append(fn)
    return fn


# ----------------------------------------------------------------------------------------------
# activation


@model
def activation_unary():
    b = ModelBuilder("activation_unary", "Element-wise activations on one [2,3,4,5] input: Relu, Sigmoid, Tanh, Erf, "
                     "Softplus, HardSigmoid(alpha=0.25, beta=0.4), HardSwish, LeakyRelu(alpha=0.2), Clip(-0.5, 0.8) "
                     "with min/max inputs, Clip with only min.")
    x = b.input("x", [2, 3, 4, 5])
    b.output(b.node("Relu", [x]), b.node("Sigmoid", [x]), b.node("Tanh", [x]), b.node("Erf", [x]), b.node("Softplus", [x]),
             b.node("HardSigmoid", [x], alpha=0.25, beta=0.4), b.node("HardSwish", [x]), b.node("LeakyRelu", [x], alpha=0.2))
    lo, hi = b.init("clip_min", np.array(-0.5, np.float32)), b.init("clip_max", np.array(0.8, np.float32))
    b.output(b.node("Clip", [x, lo, hi]), b.node("Clip", [x, lo]))
    return b


@model
def activation_prelu():
    b = ModelBuilder("activation_prelu", "PRelu with a per-channel slope of shape [C,1,1] broadcast over NCHW, and a "
                     "scalar-like slope [1].")
    x = b.input("x", [2, 4, 3, 3])
    b.output(b.node("PRelu", [x, b.floats("slope_c", [[[0.1]], [[0.2]], [[-0.3]], [[0.5]]])]),
             b.node("PRelu", [x, b.floats("slope_1", [0.25])]))
    return b


@model
def activation_opset9():
    b = ModelBuilder("activation_opset9", "Opset 9 activations: Clip with min/max ATTRIBUTES (inputs only from "
                     "opset 11), LeakyRelu default alpha, HardSigmoid defaults, Sigmoid.", opset=9)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("Clip", [x], min=-0.3, max=0.6), b.node("Clip", [x]), b.node("LeakyRelu", [x]),
             b.node("HardSigmoid", [x]), b.node("Sigmoid", [x]))
    return b


@model
def activation_gelu_opset20():
    b = ModelBuilder("activation_gelu_opset20", "Gelu (op added in opset 20): exact (erf) and approximate='tanh'.",
                     opset=20)
    x = b.input("x", [2, 8])
    b.output(b.node("Gelu", [x]), b.node("Gelu", [x], approximate="tanh"))
    return b


# ----------------------------------------------------------------------------------------------
# arithmetic


@model
def arithmetic_binary_broadcast():
    b = ModelBuilder("arithmetic_binary_broadcast", "Add/Sub/Mul/Div of a [2,3,4] and a [3,1] input (multidirectional "
                     "broadcasting), Pow with a constant integer-valued exponent [4] broadcast on the last axis, and "
                     "Add with a scalar initializer.")
    a = b.input("a", [2, 3, 4])
    c = b.input("b", [3, 1])
    b.output(b.node("Add", [a, c]), b.node("Sub", [a, c]), b.node("Mul", [a, c]), b.node("Div", [a, c]),
             b.node("Pow", [a, b.floats("exponent", [0.0, 1.0, 2.0, 3.0])]),
             b.node("Add", [a, b.init("scalar", np.array(1.5, np.float32))]))
    return b


@model
def arithmetic_unary():
    b = ModelBuilder("arithmetic_unary", "Unary math: Neg, Abs, Exp, and Sqrt/Log/Reciprocal on Abs(x)+1 so random "
                     "inputs stay in their domains.")
    x = b.input("x", [3, 5])
    pos = b.node("Add", [b.node("Abs", [x]), b.init("one", np.array(1.0, np.float32))])
    b.output(b.node("Neg", [x]), b.node("Abs", [x]), b.node("Exp", [x]), b.node("Sqrt", [pos]), b.node("Log", [pos]),
             b.node("Reciprocal", [pos]))
    return b


@model
def arithmetic_variadic():
    b = ModelBuilder("arithmetic_variadic", "Variadic Sum/Mean/Max/Min over three inputs of shapes [2,3,4], [3,4] and "
                     "[1,4] (broadcast), and the one-input forms.")
    x, y, z = b.input("x", [2, 3, 4]), b.input("y", [3, 4]), b.input("z", [1, 4])
    for op in ("Sum", "Mean", "Max", "Min"):
        b.output(b.node(op, [x, y, z]))
    b.output(b.node("Sum", [y]), b.node("Max", [z]))
    return b


@model
def arithmetic_mod():
    b = ModelBuilder("arithmetic_mod", "Mod: int64 with fmod=0 (result takes the divisor's sign, Python-style) and "
                     "float32 with fmod=1 (C fmod, dividend's sign); divisors are nonzero constants with both signs.")
    xi = b.input("xi", [2, 4], I64)
    xf = b.input("xf", [2, 4])
    b.output(b.node("Mod", [xi, b.ints("div_i", [3, -4, 5, -7])]),
             b.node("Mod", [xf, b.floats("div_f", [0.7, -0.5, 1.5, -2.0])], fmod=1))
    return b


@model
def arithmetic_int():
    b = ModelBuilder("arithmetic_int", "Integer arithmetic in int32 and int64: Add, Sub, Mul, Div (truncates toward "
                     "zero) by nonzero constants, Neg, Abs, Max.")
    x = b.input("x", [3, 4], I64)
    y = b.input("y", [4], I32)
    d = b.ints("divisor", [2, -3, 5, 7])
    b.output(b.node("Add", [x, d]), b.node("Sub", [x, d]), b.node("Mul", [x, d]), b.node("Div", [x, d]),
             b.node("Neg", [x]), b.node("Abs", [x]), b.node("Max", [x, d]),
             b.node("Div", [y, b.init("divisor32", np.array([3, -2, 4, 5], np.int32))]))
    return b


@model
def arithmetic_opset7():
    b = ModelBuilder("arithmetic_opset7", "Opset 7 arithmetic (first opset with numpy-style broadcasting): "
                     "Add/Mul/Sub/Div/Pow with broadcast; Sum/Max/Min variadic on equal shapes (they broadcast only "
                     "from opset 8).", opset=7)
    a, c, d = b.input("a", [2, 3]), b.input("b", [3]), b.input("d", [2, 3])
    b.output(b.node("Add", [a, c]), b.node("Mul", [a, c]), b.node("Sub", [a, c]), b.node("Div", [a, c]),
             b.node("Pow", [b.node("Abs", [a]), b.floats("e", [2.0])]), b.node("Sum", [a, d]), b.node("Max", [a, d]),
             b.node("Min", [a, d]))
    return b


# ----------------------------------------------------------------------------------------------
# logical


@model
def logical_compare_where():
    b = ModelBuilder("logical_compare_where", "Comparisons with broadcasting (Equal, Greater, Less, LessOrEqual, "
                     "GreaterOrEqual) giving bool, Not, And, Or, Xor, IsNaN (on Log(x): NaN for negative x), Where "
                     "selecting between two float tensors, and Equal on int64.")
    x, y = b.input("x", [2, 3, 4]), b.input("y", [3, 4])
    gt, lt = b.node("Greater", [x, y]), b.node("Less", [x, y])
    b.output(b.node("Equal", [x, x]), gt, lt, b.node("LessOrEqual", [x, y]), b.node("GreaterOrEqual", [x, y]),
             b.node("Not", [gt]), b.node("And", [gt, b.node("Not", [lt])]), b.node("Or", [gt, lt]),
             b.node("Xor", [gt, lt]), b.node("IsNaN", [b.node("Log", [x])]), b.node("Where", [gt, x, y]))
    i = b.input("i", [5], I64)
    b.output(b.node("Equal", [i, b.ints("ref", [0, 1, 2, 3, 4])]))
    return b


@model
def logical_opset9():
    b = ModelBuilder("logical_opset9", "Opset 9 comparisons (Greater/Less only for float before opset 9 and "
                     "GreaterOrEqual/LessOrEqual absent until 12), Where (added in 9), IsNaN (9).", opset=9)
    x, y = b.input("x", [3, 4]), b.input("y", [4])
    gt = b.node("Greater", [x, y])
    b.output(gt, b.node("Less", [x, y]), b.node("Where", [gt, x, y]), b.node("IsNaN", [x]))
    return b


# ----------------------------------------------------------------------------------------------
# cast


@model
def cast_roundtrip():
    b = ModelBuilder("cast_roundtrip", "Cast float32 -> int64 (truncation toward zero), -> float16 -> float32, -> bool, "
                     "int64 -> float32, bool -> int32; Identity; Dropout in inference (ratio input, mask output: all "
                     "true).")
    x = b.input("x", [2, 6])
    i = b.input("i", [4], I64)
    scaled = b.node("Mul", [x, b.init("ten", np.array(10.0, np.float32))])
    as_bool = b.node("Cast", [x], to=BOOL)
    d, mask = b.node("Dropout", [x, b.init("ratio", np.array(0.3, np.float32))], n_out=2)
    b.output(b.node("Cast", [scaled], to=I64), b.node("Cast", [b.node("Cast", [x], to=F16)], to=F32), as_bool,
             b.node("Cast", [i], to=F32), b.node("Cast", [as_bool], to=I32), b.node("Identity", [x]), d, mask)
    return b


@model
def cast_opset9():
    b = ModelBuilder("cast_opset9", "Opset 9 Cast (to attribute) and Dropout with the 'ratio' attribute (inference: "
                     "identity).", opset=9)
    x = b.input("x", [3, 3])
    b.output(b.node("Cast", [b.node("Cast", [x], to=I32)], to=F32), b.node("Dropout", [x], ratio=0.5))
    return b


# ----------------------------------------------------------------------------------------------
# conv


def conv_model(name, doc, x_shape, w_shape, group=1, bias=True, opset=DEFAULT_OPSET, op="Conv", **attrs):
    b = ModelBuilder(name, doc, opset=opset)
    x = b.input("x", x_shape)
    if op == "Conv":
        fan_in = int(np.prod(w_shape[1:]))
        n_bias = w_shape[0]
    else:
        # ConvTranspose weights are [C_in, C_out/group, k...].
        fan_in = int(np.prod(w_shape[2:])) * w_shape[0] // group
        n_bias = w_shape[1] * group
    inputs = [x, b.he("w", tuple(w_shape), fan_in)]
    if bias:
        inputs.append(b.small("bias", (n_bias,)))
    b.output(b.node(op, inputs, group=group, **attrs) if group != 1 else b.node(op, inputs, **attrs))
    return b


@model
def conv_basic():
    return conv_model("conv_basic", "Conv 3x3, pads 1, bias; 2x4x8x8 -> 2x8x8x8.", [2, 4, 8, 8], [8, 4, 3, 3],
                      pads=[1, 1, 1, 1], kernel_shape=[3, 3])


@model
def conv_strided_padded():
    return conv_model("conv_strided_padded", "Conv 3x3 stride 2 with asymmetric pads [0,1,1,2], no bias, no "
                      "kernel_shape attribute (taken from the weights).", [1, 3, 9, 10], [6, 3, 3, 3], bias=False,
                      strides=[2, 2], pads=[0, 1, 1, 2])


@model
def conv_dilated():
    return conv_model("conv_dilated", "Conv 3x3 dilation 2, pads 2, bias.", [1, 4, 9, 9], [4, 4, 3, 3],
                      dilations=[2, 2], pads=[2, 2, 2, 2])


@model
def conv_grouped():
    return conv_model("conv_grouped", "Grouped conv: group 2, 8 -> 6 channels, 3x3 pads 1, stride [1,2].",
                      [2, 8, 6, 6], [6, 4, 3, 3], group=2, pads=[1, 1, 1, 1], strides=[1, 2])


@model
def conv_depthwise():
    return conv_model("conv_depthwise", "Depthwise conv (group = channels = 6) with channel multiplier 2, 3x3 "
                      "stride 2 pads 1.", [1, 6, 8, 8], [12, 1, 3, 3], group=6, pads=[1, 1, 1, 1], strides=[2, 2])


@model
def conv_autopad_same_upper():
    return conv_model("conv_autopad_same_upper", "Conv with auto_pad=SAME_UPPER, stride 2, even input (extra pad at "
                      "the end).", [1, 2, 8, 7], [3, 2, 4, 4], auto_pad="SAME_UPPER", strides=[2, 2])


@model
def conv_autopad_same_lower():
    return conv_model("conv_autopad_same_lower", "Conv with auto_pad=SAME_LOWER, 2x2 kernel (extra pad at the "
                      "beginning).", [1, 2, 5, 5], [3, 2, 2, 2], auto_pad="SAME_LOWER")


@model
def conv_autopad_valid():
    return conv_model("conv_autopad_valid", "Conv with auto_pad=VALID (no padding), stride 2.", [1, 3, 7, 7],
                      [4, 3, 3, 3], auto_pad="VALID", strides=[2, 2])


@model
def conv_1d():
    return conv_model("conv_1d", "1-D conv: [2,4,16] with kernel 5, stride 2, pads 2, dilation 1.", [2, 4, 16],
                      [6, 4, 5], strides=[2], pads=[2, 2])


@model
def conv_opset11():
    return conv_model("conv_opset11", "Conv at opset 11 (same definition as opset 1) with explicit kernel_shape.",
                      [1, 3, 6, 6], [4, 3, 3, 3], opset=11, kernel_shape=[3, 3], pads=[1, 1, 1, 1])


@model
def conv_transpose():
    return conv_model("conv_transpose", "ConvTranspose 3x3 stride 2, pads 1, output_padding 1 (doubles 5x5 -> 10x10), "
                      "bias.", [1, 4, 5, 5], [4, 3, 3, 3], op="ConvTranspose", strides=[2, 2], pads=[1, 1, 1, 1],
                      output_padding=[1, 1])


@model
def conv_transpose_grouped():
    return conv_model("conv_transpose_grouped", "ConvTranspose with group 2, kernel 2x2 stride 2 (no overlap), "
                      "dilation 1, no bias.", [1, 4, 3, 4], [4, 2, 2, 2], op="ConvTranspose", group=2, bias=False,
                      strides=[2, 2])


@model
def conv_transpose_output_shape():
    return conv_model("conv_transpose_output_shape", "ConvTranspose with output_shape given (pads computed, "
                      "SAME_UPPER-like split) instead of pads.", [1, 2, 4, 4], [2, 3, 3, 3], op="ConvTranspose",
                      strides=[2, 2], output_shape=[9, 9])


# ----------------------------------------------------------------------------------------------
# linalg


@model
def linalg_gemm():
    b = ModelBuilder("linalg_gemm", "Gemm: transA=1 with alpha 0.5, beta 2 and a [N] bias broadcast; transB=1 with "
                     "a [M,N] bias; no bias (C omitted, allowed from opset 11).")
    a = b.input("a", [6, 3])  # used transposed: [3, 6]
    x = b.input("x", [3, 6])
    w = b.he("w", (6, 5), 6)
    wt = b.he("wt", (5, 6), 6)
    b.output(b.node("Gemm", [a, w, b.small("c_n", (5,))], transA=1, alpha=0.5, beta=2.0),
             b.node("Gemm", [x, wt, b.small("c_mn", (3, 5))], transB=1),
             b.node("Gemm", [x, w]))
    return b


@model
def linalg_gemm_opset9():
    b = ModelBuilder("linalg_gemm_opset9", "Gemm at opset 9: C required, broadcast [1,N] to [M,N].", opset=9)
    x = b.input("x", [2, 4])
    b.output(b.node("Gemm", [x, b.he("w", (4, 3), 4), b.small("c", (1, 3))]))
    return b


@model
def linalg_matmul():
    b = ModelBuilder("linalg_matmul", "MatMul: 2-D, 3-D batched, 4-D with batch broadcast ([2,1,4,5] x [3,5,6]), "
                     "and the 1-D cases ([5] x [5,3], [2,3,5] x [5]).")
    a2, a3, a4 = b.input("a2", [3, 5]), b.input("a3", [2, 3, 5]), b.input("a4", [2, 1, 4, 5])
    v = b.input("v", [5])
    b.output(b.node("MatMul", [a2, b.he("w2", (5, 4), 5)]),
             b.node("MatMul", [a3, b.input("b3", [2, 5, 4])]),
             b.node("MatMul", [a4, b.he("w4", (3, 5, 6), 5)]),
             b.node("MatMul", [v, b.he("wv", (5, 3), 5)]),
             b.node("MatMul", [a3, v]))
    return b


# ----------------------------------------------------------------------------------------------
# normalization


@model
def normalization_batchnorm():
    b = ModelBuilder("normalization_batchnorm", "BatchNormalization in inference mode (opset 15+ definition) on "
                     "NCHW and on a 3-D [N,C,L] input, epsilon 1e-3.")
    x = b.input("x", [2, 4, 3, 3])
    x3 = b.input("x3", [2, 4, 5])

    def params():
        return [b.floats("scale", b.rng.uniform(0.5, 1.5, 4)), b.small("bias", (4,), 0.2),
                b.small("mean", (4,), 0.2), b.floats("var", b.rng.uniform(0.5, 1.5, 4))]

    b.output(b.node("BatchNormalization", [x] + params(), epsilon=1e-3), b.node("BatchNormalization", [x3] + params()))
    return b


@model
def normalization_batchnorm_opset9():
    b = ModelBuilder("normalization_batchnorm_opset9", "BatchNormalization at opset 9 (no 'spatial', no "
                     "training_mode), momentum attribute present and ignored in inference.", opset=9)
    x = b.input("x", [1, 3, 4, 4])
    b.output(b.node("BatchNormalization", [x, b.floats("s", [1.0, 0.5, 2.0]), b.floats("b", [0.0, 0.1, -0.1]),
                                           b.floats("m", [0.1, -0.2, 0.0]), b.floats("v", [1.0, 0.8, 1.2])],
                    momentum=0.9))
    return b


@model
def normalization_layernorm():
    b = ModelBuilder("normalization_layernorm", "LayerNormalization (opset 17): axis -1 with scale and bias; axis -2 "
                     "(normalise over the last two axes) without bias, epsilon 1e-3.")
    x = b.input("x", [2, 3, 8])
    b.output(b.node("LayerNormalization", [x, b.floats("g", b.rng.uniform(0.5, 1.5, 8)), b.small("beta", (8,))]),
             b.node("LayerNormalization", [x, b.floats("g2", b.rng.uniform(0.5, 1.5, (3, 8)))], axis=-2, epsilon=1e-3))
    return b


@model
def normalization_lrn():
    b = ModelBuilder("normalization_lrn", "LRN across channels: size 3 with defaults, size 5 with alpha 1e-3, beta "
                     "0.75, bias 2 (AlexNet settings).")
    x = b.input("x", [1, 6, 4, 4])
    b.output(b.node("LRN", [x], size=3), b.node("LRN", [x], size=5, alpha=1e-3, beta=0.75, bias=2.0))
    return b


# ----------------------------------------------------------------------------------------------
# pool


@model
def pool_max():
    b = ModelBuilder("pool_max", "MaxPool: 3x3 stride 2 pads 1 (ResNet stem); 2x2 stride 2 ceil_mode=1 on an odd "
                     "input; 3x3 dilation 2; 1-D kernel 3 stride 2; auto_pad SAME_UPPER.")
    x = b.input("x", [1, 3, 9, 9])
    x1 = b.input("x1", [2, 3, 10])
    b.output(b.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
             b.node("MaxPool", [x], kernel_shape=[3, 3], dilations=[2, 2]),
             b.node("MaxPool", [x1], kernel_shape=[3], strides=[2]),
             b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2], auto_pad="SAME_UPPER"))
    return b


@model
def pool_average():
    b = ModelBuilder("pool_average", "AveragePool: 3x3 stride 1 pads 1 with count_include_pad 0 and 1; 3x3 stride 2 "
                     "ceil_mode=1 with pads (last window partly outside the padded input); 2x2 stride 2 no pads.")
    x = b.input("x", [1, 2, 7, 7])
    b.output(b.node("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             b.node("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
             b.node("AveragePool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
             b.node("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2]))
    return b


@model
def pool_global():
    b = ModelBuilder("pool_global", "GlobalAveragePool and GlobalMaxPool on NCHW and on a 3-D input.")
    x, x1 = b.input("x", [2, 3, 5, 4]), b.input("x1", [2, 3, 7])
    b.output(b.node("GlobalAveragePool", [x]), b.node("GlobalMaxPool", [x]), b.node("GlobalAveragePool", [x1]),
             b.node("GlobalMaxPool", [x1]))
    return b


@model
def pool_opset9():
    b = ModelBuilder("pool_opset9", "Opset 9 MaxPool / AveragePool (no ceil_mode, no dilations: added in 10).",
                     opset=9)
    x = b.input("x", [1, 2, 6, 6])
    b.output(b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2]),
             b.node("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1))
    return b


# ----------------------------------------------------------------------------------------------
# reduce


@model
def reduce_opset13():
    b = ModelBuilder("reduce_opset13", "Opset 13 reductions: axes as ATTRIBUTE for ReduceMean/ReduceMax, as INPUT for "
                     "ReduceSum (changed in 13); keepdims 0/1; negative axes; all axes (none given).", opset=13)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("ReduceMean", [x], axes=[-1]), b.node("ReduceMean", [x], axes=[0, 2], keepdims=0),
             b.node("ReduceMax", [x], axes=[1], keepdims=0), b.node("ReduceMax", [x]),
             b.node("ReduceSum", [x, b.ints("axes", [1])]), b.node("ReduceSum", [x], keepdims=0))
    return b


@model
def reduce_opset18():
    b = ModelBuilder("reduce_opset18", "Opset 18 reductions: axes as INPUT for every reduce op; "
                     "noop_with_empty_axes=1 with no axes (identity); keepdims 0.", opset=18)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("ReduceMean", [x, b.ints("axes", [-1])]), b.node("ReduceMax", [x, b.ints("axes", [0, 1])], keepdims=0),
             b.node("ReduceSum", [x, b.ints("axes", [2])], keepdims=0), b.node("ReduceSum", [x], noop_with_empty_axes=1),
             b.node("ReduceMean", [x]))
    return b


@model
def reduce_opset11():
    b = ModelBuilder("reduce_opset11", "Opset 11 reductions (axes attribute for all, negative axes allowed from 11).",
                     opset=11)
    x = b.input("x", [3, 4, 2])
    b.output(b.node("ReduceSum", [x], axes=[-2]), b.node("ReduceMean", [x], axes=[0], keepdims=0))
    return b


# ----------------------------------------------------------------------------------------------
# softmax


@model
def softmax_opset13():
    b = ModelBuilder("softmax_opset13", "Softmax / LogSoftmax at opset 13 (single-axis definition): default axis -1 "
                     "and axis 1 on a 3-D input.", opset=13)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("Softmax", [x]), b.node("Softmax", [x], axis=1), b.node("LogSoftmax", [x]),
             b.node("LogSoftmax", [x], axis=1))
    return b


@model
def softmax_opset11():
    b = ModelBuilder("softmax_opset11", "Softmax / LogSoftmax at opset 11: the input is coerced to 2-D at 'axis' "
                     "(default 1) and normalised over ALL trailing axes flattened — not the same as opset 13.",
                     opset=11)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("Softmax", [x]), b.node("LogSoftmax", [x]), b.node("Softmax", [x], axis=2))
    return b


# ----------------------------------------------------------------------------------------------
# shape


@model
def shape_reshape_flatten():
    b = ModelBuilder("shape_reshape_flatten", "Reshape with 0 (copy dim) and -1 (infer), allowzero absent; Flatten "
                     "axis 2 and axis 0; Transpose with perm and default (reverse).")
    x = b.input("x", [2, 3, 4, 5])
    b.output(b.node("Reshape", [x, b.ints("shape", [0, -1, 10])]), b.node("Flatten", [x], axis=2),
             b.node("Flatten", [x], axis=0), b.node("Transpose", [x], perm=[0, 2, 3, 1]), b.node("Transpose", [x]))
    return b


@model
def shape_squeeze_unsqueeze():
    b = ModelBuilder("shape_squeeze_unsqueeze", "Squeeze/Unsqueeze at opset 13 (axes as INPUT): negative axes, "
                     "Squeeze without axes (all 1-dims), Unsqueeze of two axes.")
    x = b.input("x", [1, 3, 1, 4])
    b.output(b.node("Squeeze", [x, b.ints("axes", [0, -2])]), b.node("Squeeze", [x]),
             b.node("Unsqueeze", [x, b.ints("axes", [0, -1])]))
    return b


@model
def shape_squeeze_opset11():
    b = ModelBuilder("shape_squeeze_opset11", "Squeeze/Unsqueeze at opset 11 (axes as ATTRIBUTE).", opset=11)
    x = b.input("x", [3, 1, 4])
    b.output(b.node("Squeeze", [x], axes=[1]), b.node("Unsqueeze", [x], axes=[0, 3]))
    return b


@model
def shape_expand_tile():
    b = ModelBuilder("shape_expand_tile", "Expand [3,1] to [2,3,4] (shape may have fewer dims and 1s that keep the "
                     "input's dim); Tile [3,1] by [2,3].")
    x = b.input("x", [3, 1])
    b.output(b.node("Expand", [x, b.ints("shape", [2, 1, 4])]), b.node("Expand", [x, b.ints("shape", [1])]),
             b.node("Tile", [x, b.ints("repeats", [2, 3])]))
    return b


@model
def shape_shape_size():
    b = ModelBuilder("shape_shape_size", "Shape (full, and start=1 end=-1 from opset 15) and Size of an input with a "
                     "symbolic batch dim N (outputs are int64).")
    x = b.input("x", ["N", 3, 4, 5])
    b.output(b.node("Shape", [x]), b.node("Shape", [x], start=1, end=-1), b.node("Size", [x]))
    return b


@model
def shape_reshape_opset21():
    b = ModelBuilder("shape_reshape_opset21", "Opset 21 model: Reshape (allowzero=0), Transpose, Squeeze, Flatten, "
                     "Cast, Shape — definitions re-versioned in 21 for new types.", opset=21)
    x = b.input("x", [2, 1, 6])
    r = b.node("Reshape", [x, b.ints("shape", [0, 3, -1])])
    b.output(b.node("Transpose", [r], perm=[0, 2, 1]), b.node("Squeeze", [x, b.ints("axes", [1])]),
             b.node("Flatten", [x]), b.node("Cast", [x], to=F16), b.node("Shape", [r]))
    return b


# ----------------------------------------------------------------------------------------------
# indexing


@model
def indexing_concat_split():
    b = ModelBuilder("indexing_concat_split", "Concat on axis 1 and -1; Split with a 'split' input [2,4] on axis 1 "
                     "(opset 13+); equal Split into 3 without split sizes.")
    x, y = b.input("x", [2, 2, 3]), b.input("y", [2, 4, 3])
    c = b.node("Concat", [x, y], axis=1)
    b.output(c, b.node("Concat", [x, x], axis=-1))
    b.output(*b.node("Split", [c, b.ints("split", [2, 4])], n_out=2, axis=1))
    b.output(*b.node("Split", [c], n_out=3, axis=1))
    return b


@model
def indexing_split_opset18():
    b = ModelBuilder("indexing_split_opset18", "Split at opset 18 with num_outputs=3 on a dim of 8 (uneven: chunks of "
                     "3,3,2).", opset=18)
    x = b.input("x", [2, 8])
    b.output(*b.node("Split", [x], n_out=3, axis=1, num_outputs=3))
    return b


@model
def indexing_split_opset11():
    b = ModelBuilder("indexing_split_opset11", "Split at opset 11 with 'split' as ATTRIBUTE.", opset=11)
    x = b.input("x", [6, 2])
    b.output(*b.node("Split", [x], n_out=2, axis=0, split=[1, 5]))
    return b


@model
def indexing_slice():
    b = ModelBuilder("indexing_slice", "Slice (opset 13, inputs): positive range, negative starts/ends, negative "
                     "step (reverse), out-of-range ends clamped, axes omitted, INT64_MAX end.")
    x = b.input("x", [4, 6, 5])
    big = 2**63 - 1
    b.output(b.node("Slice", [x, b.ints("s", [1, 0]), b.ints("e", [3, 4]), b.ints("a", [0, 2])]),
             b.node("Slice", [x, b.ints("s", [-3]), b.ints("e", [-1]), b.ints("a", [1])]),
             b.node("Slice", [x, b.ints("s", [-1]), b.ints("e", [-big]), b.ints("a", [1]), b.ints("st", [-2])]),
             b.node("Slice", [x, b.ints("s", [0, 1]), b.ints("e", [100, big])]),
             b.node("Slice", [x, b.ints("s", [1]), b.ints("e", [5]), b.ints("a", [-1]), b.ints("st", [3])]))
    return b


@model
def indexing_slice_opset9():
    b = ModelBuilder("indexing_slice_opset9", "Slice at opset 9 (starts/ends/axes as ATTRIBUTES, no steps).", opset=9)
    x = b.input("x", [3, 5])
    b.output(b.node("Slice", [x], starts=[1, -4], ends=[3, 1000], axes=[0, 1]))
    return b


@model
def indexing_gather():
    b = ModelBuilder("indexing_gather", "Gather axis 0 with a 2-D index tensor (incl. negative index), axis 1 with a "
                     "scalar index (rank drops); GatherElements axis 1 and axis 0 with negative indices.")
    x = b.input("x", [5, 4, 3])
    b.output(b.node("Gather", [x, b.ints("idx", [[0, -1], [2, 3]])]),
             b.node("Gather", [x, b.init("scalar_idx", np.array(2, np.int64))], axis=1),
             b.node("GatherElements", [x, b.ints("ge1", np.array([[[0, 1, 2], [3, -1, 0]]] * 5))], axis=1),
             b.node("GatherElements", [x, b.ints("ge0", np.array([[[4, 0, -5]] * 4]))], axis=0))
    return b


@model
def indexing_gather_rows():
    b = ModelBuilder("indexing_gather_rows", "Gather of whole rows of 16-byte multiples (the gather kernel's vector "
                     "path): an embedding lookup (table [64, 32], int64 ids [2, 7] incl. negative) and axis 1 of a "
                     "[4, 10, 16] tensor with int32 indices (incl. negative).")
    table = b.input("table", [64, 32])
    x = b.input("x", [4, 10, 16])
    ids = [[0, 5, 63, -1, 17, 17, 2], [-64, 40, 8, 1, 33, 62, 9]]
    b.output(b.node("Gather", [table, b.ints("ids", ids)]),
             b.node("Gather", [x, b.init("cols", np.array([9, -10, 3], np.int32))], axis=1))
    return b


@model
def indexing_pad():
    b = ModelBuilder("indexing_pad", "Pad (opset 13, pads input): constant with value 1.5 and a negative pad (crop); "
                     "reflect; edge.")
    x = b.input("x", [1, 2, 4, 4])
    b.output(b.node("Pad", [x, b.ints("pads", [0, 0, 1, -1, 0, 0, 2, 1]), b.init("value", np.array(1.5, np.float32))]),
             b.node("Pad", [x, b.ints("pads", [0, 0, 2, 1, 0, 0, 1, 3])], mode="reflect"),
             b.node("Pad", [x, b.ints("pads", [0, 0, 1, 2, 0, 0, 3, 0])], mode="edge"))
    return b


@model
def indexing_pad_opset9():
    b = ModelBuilder("indexing_pad_opset9", "Pad at opset 9 (pads and value as ATTRIBUTES).", opset=9)
    x = b.input("x", [2, 3])
    b.output(b.node("Pad", [x], pads=[1, 0, 0, 2], value=-1.0))
    return b


@model
def indexing_pad_opset18_axes():
    b = ModelBuilder("indexing_pad_opset18_axes", "Pad at opset 18 with the 'axes' input (pads only for the listed "
                     "axes, negative axis).", opset=18)
    x = b.input("x", [1, 2, 3, 3])
    b.output(b.node("Pad", [x, b.ints("pads", [1, 2, 0, 1]), b.init("value", np.array(0.0, np.float32)),
                            b.ints("axes", [2, -1])]))
    return b


# ----------------------------------------------------------------------------------------------
# generator


@model
def generator_constants():
    b = ModelBuilder("generator_constants", "Constant with 'value' tensor, 'value_float', 'value_ints'; "
                     "ConstantOfShape from Shape(x) with value 0.5 and with the default (float 0); Range float "
                     "and int64 with a negative delta.")
    x = b.input("x", [2, 3])
    k = b.node("Constant", [], value=numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3)))
    b.output(b.node("Add", [x, k]), b.node("Constant", [], value_float=2.5), b.node("Constant", [], value_ints=[1, 2, 3]))
    shape = b.node("Shape", [x])
    b.output(b.node("ConstantOfShape", [shape], value=numpy_helper.from_array(np.array([0.5], np.float32))),
             b.node("ConstantOfShape", [shape]))
    b.output(b.node("Range", [b.init("start", np.array(0.5, np.float32)), b.init("limit", np.array(3.0, np.float32)),
                              b.init("delta", np.array(0.75, np.float32))]),
             b.node("Range", [b.init("start", np.array(10, np.int64)), b.init("limit", np.array(1, np.int64)),
                              b.init("delta", np.array(-3, np.int64))]))
    return b


@model
def generator_range_dynamic():
    b = ModelBuilder("generator_range_dynamic", "Range whose limit is a shape value (Shape -> Gather) of an input with a "
                     "symbolic dim T, as in positional-embedding indices; ConstantOfShape with int64 value.")
    x = b.input("x", [2, "T"])
    t = b.node("Gather", [b.node("Shape", [x]), b.init("one", np.array(1, np.int64))], axis=0)
    pos = b.node("Range", [b.init("zero", np.array(0, np.int64)), t, b.init("step", np.array(1, np.int64))])
    b.declare(pos, ["T"])
    b.output(pos, b.node("ConstantOfShape", [b.node("Shape", [x])], value=numpy_helper.from_array(np.array([7], np.int64))))
    return b


# ----------------------------------------------------------------------------------------------
# resize


@model
def resize_nearest():
    b = ModelBuilder("resize_nearest", "Resize (opset 13) nearest: scales [1,1,2,2] with asymmetric / floor "
                     "(PyTorch 'nearest'); scales [1,1,1.5,0.5] with half_pixel / round_prefer_floor.")
    x = b.input("x", [1, 2, 4, 4])
    roi = ""
    b.output(b.node("Resize", [x, roi, b.floats("scales", [1, 1, 2, 2])], mode="nearest",
                    coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             b.node("Resize", [x, roi, b.floats("scales", [1, 1, 1.5, 0.5])], mode="nearest",
                    coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor"))
    return b


@model
def resize_linear():
    b = ModelBuilder("resize_linear", "Resize (opset 13) linear: 'sizes' [1,2,7,5] with half_pixel (bilinear "
                     "downsample+upsample), scales 2 with align_corners, pytorch_half_pixel.")
    x = b.input("x", [1, 2, 4, 6])
    b.output(b.node("Resize", [x, "", "", b.ints("sizes", [1, 2, 7, 5])], mode="linear"),
             b.node("Resize", [x, "", b.floats("scales", [1, 1, 2, 2])], mode="linear",
                    coordinate_transformation_mode="align_corners"),
             b.node("Resize", [x, "", b.floats("scales", [1, 1, 0.5, 1.5])], mode="linear",
                    coordinate_transformation_mode="pytorch_half_pixel"))
    return b


@model
def resize_opset11():
    b = ModelBuilder("resize_opset11", "Resize at opset 11 (roi input required even if empty, scales given as an empty "
                     "tensor when sizes are used).", opset=11)
    x = b.input("x", [1, 1, 3, 3])
    b.output(b.node("Resize", [x, b.floats("roi", []), b.floats("scales", [1, 1, 2, 2])], mode="nearest"),
             b.node("Resize", [x, b.floats("roi", []), b.floats("scales", []), b.ints("sizes", [1, 1, 5, 4])],
                    mode="linear"))
    return b


@model
def resize_upsample_opset9():
    b = ModelBuilder("resize_upsample_opset9", "Upsample at opset 9 (scales as INPUT; deprecated in 10): nearest x2 "
                     "and linear x[1,1,2,3].", opset=9)
    x = b.input("x", [1, 2, 3, 3])
    b.output(b.node("Upsample", [x, b.floats("scales", [1, 1, 2, 2])], mode="nearest"),
             b.node("Upsample", [x, b.floats("scales", [1, 1, 2, 3])], mode="linear"))
    return b


# ----------------------------------------------------------------------------------------------
# patterns for the optimiser


def conv_bn(b, x, c_in, c_out, k, stride=1, pad=0, group=1, dilation=1):
    """Conv (no bias) -> BatchNormalization with well-conditioned random statistics."""
    w = b.he("w", (c_out, c_in // group, k, k), c_in // group * k * k)
    attrs = dict(kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4)
    if group != 1:
        attrs["group"] = group
    if dilation != 1:
        attrs["dilations"] = [dilation, dilation]
    y = b.node("Conv", [x, w], **attrs)
    return b.node("BatchNormalization", [y, b.floats("bn_scale", b.rng.uniform(0.5, 1.5, c_out)),
                                         b.small("bn_bias", (c_out,)), b.small("bn_mean", (c_out,)),
                                         b.floats("bn_var", b.rng.uniform(0.5, 1.5, c_out))], epsilon=1e-5)


@model
def pattern_conv_bn_relu():
    b = ModelBuilder("pattern_conv_bn_relu", "Conv(no bias) -> BatchNormalization -> Relu: the unfolded PyTorch export "
                     "pattern (BN folds into the conv, Relu fuses as epilogue).")
    x = b.input("x", [1, 3, 8, 8])
    b.output(b.node("Relu", [conv_bn(b, x, 3, 8, 3, pad=1)]))
    return b


@model
def pattern_resnet_bottleneck():
    b = ModelBuilder("pattern_resnet_bottleneck", "ResNet bottleneck with projection shortcut: 1x1 -> 3x3 stride 2 -> "
                     "1x1 conv+BN(+Relu), downsample 1x1 stride 2 conv+BN, residual Add then Relu; followed by an "
                     "identity-shortcut bottleneck.")
    x = b.input("x", [1, 16, 8, 8])

    def bottleneck(x, c_in, width, c_out, stride):
        y = b.node("Relu", [conv_bn(b, x, c_in, width, 1)])
        y = b.node("Relu", [conv_bn(b, y, width, width, 3, stride=stride, pad=1)])
        y = conv_bn(b, y, width, c_out, 1)
        short = conv_bn(b, x, c_in, c_out, 1, stride=stride) if (stride != 1 or c_in != c_out) else x
        return b.node("Relu", [b.node("Add", [y, short])])

    b.output(bottleneck(bottleneck(x, 16, 8, 32, 2), 32, 8, 32, 1))
    return b


@model
def pattern_depthwise_clip():
    b = ModelBuilder("pattern_depthwise_clip", "MobileNet-v2 style: 1x1 expand conv+BN+Clip(0,6), 3x3 depthwise conv "
                     "(group = channels)+BN+Clip(0,6), 1x1 project conv+BN, residual Add.")
    x = b.input("x", [1, 8, 8, 8])
    lo, hi = b.init("zero", np.array(0.0, np.float32)), b.init("six", np.array(6.0, np.float32))
    y = b.node("Clip", [conv_bn(b, x, 8, 24, 1), lo, hi])
    y = b.node("Clip", [conv_bn(b, y, 24, 24, 3, pad=1, group=24), lo, hi])
    b.output(b.node("Add", [conv_bn(b, y, 24, 8, 1), x]))
    return b


@model
def pattern_depthwise_shapes():
    b = ModelBuilder("pattern_depthwise_shapes", "Depthwise convs (group = channels)+BN of the EfficientNet / MobileNet "
                     "shapes on odd maps, each kernel variant and tile edge: 3x3 stride 1 C=32 on 19x19 +Relu, 1x1 "
                     "expand, 5x5 stride 2 C=96 (19 -> 10)+Clip(0,6), 1x1 expand, 7x7 stride 1 C=240 + residual Add, "
                     "3x3 dilation 2 C=240 + residual Add then Relu, 3x3 stride 2 C=240 (10 -> 5, a map below one "
                     "tile).")
    x = b.input("x", [2, 32, 19, 19])
    lo, hi = b.init("zero", np.array(0.0, np.float32)), b.init("six", np.array(6.0, np.float32))
    y = b.node("Relu", [conv_bn(b, x, 32, 32, 3, pad=1, group=32)])
    y = conv_bn(b, y, 32, 96, 1)
    y = b.node("Clip", [conv_bn(b, y, 96, 96, 5, stride=2, pad=2, group=96), lo, hi])
    y = conv_bn(b, y, 96, 240, 1)
    y = b.node("Add", [conv_bn(b, y, 240, 240, 7, pad=3, group=240), y])
    y = b.node("Relu", [b.node("Add", [conv_bn(b, y, 240, 240, 3, pad=2, group=240, dilation=2), y])])
    b.output(conv_bn(b, y, 240, 240, 3, stride=2, pad=1, group=240))
    return b


@model
def pattern_resnext_grouped():
    b = ModelBuilder("pattern_resnext_grouped", "ResNeXt-style grouped convs (the grouped tensor-core instances): 3x3 "
                     "group 4 (4 channels per group)+BN+Relu, 3x3 stride 2 group 2 (8 channels, 16 filters per "
                     "group)+BN+Relu, 3x3 group 4+BN, residual Add then Relu, 1x1 group 2 (32 filters per group)+BN.")
    x = b.input("x", [2, 16, 10, 10])
    a = b.node("Relu", [conv_bn(b, x, 16, 16, 3, pad=1, group=4)])
    c = b.node("Relu", [conv_bn(b, a, 16, 32, 3, stride=2, pad=1, group=2)])
    d = b.node("Relu", [b.node("Add", [conv_bn(b, c, 32, 32, 3, pad=1, group=4), c])])
    b.output(conv_bn(b, d, 32, 64, 1, group=2))
    return b


def gelu_erf(b, x):
    """GELU as PyTorch exports it before opset 20: x * 0.5 * (1 + erf(x / sqrt(2)))."""
    e = b.node("Erf", [b.node("Div", [x, b.init("sqrt2", np.array(math.sqrt(2.0), np.float32))])])
    one = b.node("Add", [e, b.init("one", np.array(1.0, np.float32))])
    return b.node("Mul", [b.node("Mul", [x, one]), b.init("half", np.array(0.5, np.float32))])


def linear(b, x, d_in, d_out):
    """MatMul + Add bias, as PyTorch exports nn.Linear on 3-D inputs."""
    return b.node("Add", [b.node("MatMul", [x, b.he("w", (d_in, d_out), d_in)]), b.small("bias", (d_out,))])


@model
def pattern_gemm_gelu_erf():
    b = ModelBuilder("pattern_gemm_gelu_erf", "MatMul + Add bias followed by GELU written with Div/Erf/Add/Mul/Mul "
                     "(PyTorch export before opset 20): a fusable GEMM epilogue.")
    x = b.input("x", [2, 4, 16])
    b.output(gelu_erf(b, linear(b, x, 16, 32)))
    return b


def layernorm_decomposed(b, x, d):
    """LayerNorm as exported before opset 17: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul, Add."""
    mean = b.node("ReduceMean", [x], axes=[-1])
    xc = b.node("Sub", [x, mean])
    var = b.node("ReduceMean", [b.node("Pow", [xc, b.init("two", np.array(2.0, np.float32))])], axes=[-1])
    std = b.node("Sqrt", [b.node("Add", [var, b.init("eps", np.array(1e-5, np.float32))])])
    y = b.node("Div", [xc, std])
    return b.node("Add", [b.node("Mul", [y, b.floats("gamma", b.rng.uniform(0.5, 1.5, d))]), b.small("beta", (d,))])


@model
def pattern_layernorm_decomposed():
    b = ModelBuilder("pattern_layernorm_decomposed", "LayerNorm over the last axis written as ReduceMean, Sub, Pow, "
                     "ReduceMean, Add(eps), Sqrt, Div, Mul(gamma), Add(beta) — the pre-opset-17 export to be "
                     "recognised as one LayerNormalization.")
    x = b.input("x", [2, 5, 16])
    b.output(layernorm_decomposed(b, x, 16))
    return b


@model
def pattern_layernorm_fused():
    b = ModelBuilder("pattern_layernorm_fused", "LayerNormalization (opset 17) over the last axis with gamma and beta, "
                     "same sizes as pattern_layernorm_decomposed.")
    x = b.input("x", [2, 5, 16])
    b.output(b.node("LayerNormalization", [x, b.floats("gamma", b.rng.uniform(0.5, 1.5, 16)), b.small("beta", (16,))],
                    axis=-1, epsilon=1e-5))
    return b


@model
def pattern_attention():
    b = ModelBuilder("pattern_attention", "BERT-style self-attention block: Q/K/V MatMul+Add, Reshape [B,S,H,Dh] + "
                     "Transpose to heads, Q·K^T MatMul, Div by sqrt(Dh), Softmax, ·V MatMul, Transpose/Reshape back, "
                     "output projection MatMul+Add, residual Add, LayerNormalization. B=2, S=8, hidden 32, 4 heads.")
    bs, s, d, h = 2, 8, 32, 4
    dh = d // h
    x = b.input("x", [bs, s, d])
    heads = b.ints("heads_shape", [0, 0, h, dh])

    def to_heads(t, perm):
        return b.node("Transpose", [b.node("Reshape", [t, heads])], perm=perm)

    q = to_heads(linear(b, x, d, d), [0, 2, 1, 3])
    k = to_heads(linear(b, x, d, d), [0, 2, 3, 1])  # K^T directly, as PyTorch exports it
    v = to_heads(linear(b, x, d, d), [0, 2, 1, 3])
    scores = b.node("Div", [b.node("MatMul", [q, k]), b.init("sqrt_dh", np.array(math.sqrt(dh), np.float32))])
    ctx = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])
    ctx = b.node("Reshape", [b.node("Transpose", [ctx], perm=[0, 2, 1, 3]), b.ints("merge_shape", [0, 0, d])])
    y = b.node("Add", [linear(b, ctx, d, d), x])
    b.output(b.node("LayerNormalization", [y, b.floats("ln_g", b.rng.uniform(0.5, 1.5, d)), b.small("ln_b", (d,))],
                    axis=-1, epsilon=1e-12))
    return b


@model
def pattern_mlp():
    b = ModelBuilder("pattern_mlp", "Transformer MLP: Gemm(transB=1) 16->64, GELU (Div/Erf/Add/Mul/Mul), "
                     "Gemm(transB=1) 64->16, on a [4,16] input.")
    x = b.input("x", [4, 16])
    h = b.node("Gemm", [x, b.he("w1", (64, 16), 16), b.small("b1", (64,))], transB=1)
    b.output(b.node("Gemm", [gelu_erf(b, h), b.he("w2", (16, 64), 64), b.small("b2", (16,))], transB=1))
    return b


@model
def pattern_transpose_chain():
    b = ModelBuilder("pattern_transpose_chain", "Transposes that compose and cancel: NCHW->NHWC->NCHW (identity), "
                     "two transposes composing into one, a transpose around an element-wise Relu, and one feeding "
                     "a MatMul.")
    x = b.input("x", [2, 3, 4, 5])
    back = b.node("Transpose", [b.node("Transpose", [x], perm=[0, 2, 3, 1])], perm=[0, 3, 1, 2])
    composed = b.node("Transpose", [b.node("Transpose", [x], perm=[1, 0, 2, 3])], perm=[0, 1, 3, 2])
    around = b.node("Transpose", [b.node("Relu", [b.node("Transpose", [x], perm=[0, 2, 3, 1])])], perm=[0, 3, 1, 2])
    mm = b.node("MatMul", [b.node("Transpose", [x], perm=[0, 1, 3, 2]), b.he("w", (4, 6), 4)])
    b.output(b.node("Add", [back, around]), composed, mm)
    return b


@model
def pattern_shape_subgraph():
    b = ModelBuilder("pattern_shape_subgraph", "PyTorch-style dynamic reshape with a SYMBOLIC batch dim N: "
                     "Shape -> Gather(0) -> Unsqueeze -> Concat with constants -> Reshape (x.view(x.size(0), -1, 4)), "
                     "then the same to flatten back; must fold to static shapes in terms of N.")
    x = b.input("x", ["N", 3, 8])
    n = b.node("Unsqueeze", [b.node("Gather", [b.node("Shape", [x]), b.init("zero", np.array(0, np.int64))], axis=0),
                             b.ints("axes", [0])])
    y = b.node("Reshape", [x, b.node("Concat", [n, b.ints("rest", [-1, 4])], axis=0)])
    y = b.node("Relu", [y])
    n2 = b.node("Unsqueeze", [b.node("Gather", [b.node("Shape", [y]), b.init("zero", np.array(0, np.int64))], axis=0),
                              b.ints("axes", [0])])
    out = b.node("Reshape", [y, b.node("Concat", [n2, b.ints("minus1", [-1])], axis=0)])
    b.output(out)
    b.declare(out, ["N", 24])
    return b


@model
def convnet_symbolic_batch():
    b = ModelBuilder("convnet_symbolic_batch", "Small conv net with a SYMBOLIC batch dim N: conv+BN+Relu, MaxPool, "
                     "conv+BN+Relu, GlobalAveragePool, Flatten, Gemm -> [N,10].")
    x = b.input("x", ["N", 3, 16, 16])
    y = b.node("Relu", [conv_bn(b, x, 3, 8, 3, pad=1)])
    y = b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = b.node("Relu", [conv_bn(b, y, 8, 16, 3, stride=2, pad=1)])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])], axis=1)
    b.output(b.node("Gemm", [y, b.he("fc_w", (10, 16), 16), b.small("fc_b", (10,))], transB=1))
    return b


@model
def conv_split_reduction():
    b = ModelBuilder("conv_split_reduction", "Deep reductions on a tiny 4x4 image with a SYMBOLIC batch N, as in "
                     "ResNet's last stage at batch 1: conv3x3 128->32+BN+Relu, conv1x1 32->512+Relu, conv1x1 "
                     "512->128 + bias + residual (x) + Relu. At small batches their grids have 1-2 CTAs, so the CUDA "
                     "heuristic splits the reduction (conv2d_splitk_sm80, with and without the residual).")
    x = b.input("x", ["N", 128, 4, 4])
    y = b.node("Relu", [conv_bn(b, x, 128, 32, 3, pad=1)])
    y = b.node("Relu", [b.node("Conv", [y, b.he("w_expand", (512, 32, 1, 1), 32)], kernel_shape=[1, 1])])
    y = b.node("Conv", [y, b.he("w_project", (128, 512, 1, 1), 512), b.small("b_project", (128,))], kernel_shape=[1, 1])
    b.output(b.node("Relu", [b.node("Add", [y, x])]))
    return b


@model
def external_data_mlp():
    b = ModelBuilder("external_data_mlp", "Two-layer MLP whose weights are stored as EXTERNAL DATA in "
                     "external_data_mlp.onnx.data beside the model (every initializer, size_threshold 0).")
    b.external_data = True
    x = b.input("x", [2, 8])
    h = b.node("Relu", [b.node("Gemm", [x, b.he("w1", (8, 16), 8), b.small("b1", (16,))])])
    b.output(b.node("Gemm", [h, b.he("w2", (16, 4), 16), b.small("b2", (4,))]))
    return b


@model
def float16_convnet():
    b = ModelBuilder("float16_convnet", "float16 model: fp16 input and weights, Conv+Relu, MaxPool, Conv, Add "
                     "residual, GlobalAveragePool, Flatten, Gemm, Softmax — every tensor is float16.")
    x = b.input("x", [1, 4, 8, 8], F16)
    w1, w2 = b.he("w1", (4, 4, 3, 3), 36, np.float16), b.he("w2", (4, 4, 3, 3), 36, np.float16)
    y = b.node("Relu", [b.node("Conv", [x, w1, b.small("b1", (4,), dtype=np.float16)], pads=[1, 1, 1, 1])])
    y = b.node("MaxPool", [y], kernel_shape=[2, 2], strides=[2, 2])
    y = b.node("Add", [b.node("Conv", [y, w2], pads=[1, 1, 1, 1]), y])
    y = b.node("Flatten", [b.node("GlobalAveragePool", [y])])
    y = b.node("Gemm", [y, b.he("fc", (4, 5), 4, np.float16), b.small("fc_b", (5,), dtype=np.float16)])
    b.output(b.node("Softmax", [y]))
    return b


# ----------------------------------------------------------------------------------------------


def random_feed(m: onnx.ModelProto, rng: np.random.Generator, sym_value: int = 2) -> dict:
    """Random inputs for an ORT smoke run; symbolic dims take `sym_value`."""
    feeds = {}
    for vi in m.graph.input:
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sym_value for d in tt.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[vi.name] = rng.integers(-20, 20, shape).astype(dtype)
    return feeds


def smoke_run(m: onnx.ModelProto, path: Path | None) -> None:
    """Executes the model once with ONNX Runtime so only models ORT accepts are written."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    src = str(path) if path is not None else m.SerializeToString()
    sess = ort.InferenceSession(src, opts, providers=["CPUExecutionProvider"])
    outs = sess.run(None, random_feed(m, np.random.default_rng(0)))
    for o, info in zip(outs, m.graph.output):
        dims = info.type.tensor_type.shape.dim
        if len(dims) != np.ndim(o):
            raise SystemExit(f"{m.graph.name}: output {info.name} has rank {np.ndim(o)} in ORT, {len(dims)} declared")


INDEX = "MODELS.md"


def previously_written(index: Path) -> set[str]:
    """Model files listed in an earlier MODELS.md (rows start with "| `<name>.onnx` |")."""
    if not index.exists():
        return set()
    names = set()
    for line in index.read_text().splitlines():
        if line.startswith("| `") and ".onnx` |" in line:
            names.add(line[3:line.index("` |")])
    return names


def check_versions() -> None:
    got = {"onnx": onnx.__version__, "numpy": np.__version__}
    if got != PINNED:
        raise SystemExit(f"generate.py needs {PINNED} for byte-identical output, found {got} "
                         "(run scripts/setup-python.sh)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--check-only", action="store_true", help="build and check the models, write nothing")
    args = ap.parse_args()
    check_versions()
    out: Path = args.out
    written = []
    index = []
    # Other generators write into this folder too (generate_extra.py, rule_models.py): only files
    # this script wrote before, as recorded in its MODELS.md index, may be removed as stale.
    previous = previously_written(out / INDEX)
    for fn in MODELS:
        b = fn()
        if b.name != fn.__name__:
            raise SystemExit(f"model function {fn.__name__} builds '{b.name}': names must match")
        m = b.build()
        onnx.checker.check_model(m, full_check=True)
        external = getattr(b, "external_data", False)
        smoke_run(m, None)
        if args.check_only:
            continue
        path = out / f"{b.name}.onnx"
        if external:
            data_name = f"{b.name}.onnx.data"
            (out / data_name).unlink(missing_ok=True)  # onnx appends to an existing data file
            onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                            location=data_name, size_threshold=0)
            written.append(data_name)
        else:
            onnx.save_model(m, str(path))
        if external:
            # The written pair (model + data file) must load on its own.
            onnx.checker.check_model(str(path), full_check=True)
            smoke_run(m, path)
        written.append(path.name)
        ops = sorted({n.op_type for n in m.graph.node})
        index.append(f"| `{b.name}.onnx` | {b.opset} | {', '.join(ops)} | {b.doc} |")
    if not args.check_only:
        (out / INDEX).write_text(
            "# Bundled test models\n\nWritten by `generate.py` (run `scripts/gen-models.sh`); do not edit by hand.\n"
            "The full ResNet-50 is written by `resnet50.py` to `generated/resnet50.onnx` (git-ignored).\n\n"
            "| model | opset | ops | what it tests |\n|---|---|---|---|\n" + "\n".join(index) + "\n")
        # Models this script wrote before but no longer produces (renamed or dropped).
        keep = set(written)
        for name in sorted(previous - keep):
            for stale in (out / name, out / f"{name}.data"):
                if stale.exists():
                    stale.unlink()
                    print(f"removed stale {stale.name}")
        print(f"wrote {len(MODELS)} models to {out}")
    else:
        print(f"checked {len(MODELS)} models (nothing written)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
