#!/usr/bin/env python3
"""Writes the bundled test models of the op families added after generate.py: scatter (GatherND,
ScatterND, ScatterElements, Scatter, OneHot), layout (DepthToSpace, SpaceToDepth), trilu, cumsum,
hardmax, einsum, mvn (MeanVarianceNormalization) and lp_pool (LpPool, GlobalLpPool).

Same conventions as generate.py, whose ModelBuilder, checks and ORT smoke run it reuses: pinned
onnx==1.23.2 / numpy==2.3.5, every model seeded from its own name, ir_version 8, no timestamps, so
running it twice gives byte-identical files; each model passes the ONNX checker (full shape
inference) and one ONNX Runtime run before it is written. Index tensors are initializers (the
models test feeds random values to graph inputs, and random indices would be out of range), while
the data every node reads comes from a graph input, so nothing folds away at import.

It writes only its own `<family>_<what>.onnx` files and touches nothing else in the folder (in
particular not MODELS.md, which generate.py owns).

Usage: generate_extra.py [--out DIR] [--check-only]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import F32, I64, ModelBuilder, check_versions, smoke_run  # noqa: E402

MODELS: list = []


def model(fn):
    MODELS.append(fn)
    return fn


@model
def scatter_gather_scatter_onehot():
    b = ModelBuilder("scatter_gather_scatter_onehot", "GatherND with batch_dims=1 and negative indices; ScatterND "
                     "with reduction=add and a duplicate index tuple; ScatterElements axis=1 reduction=max with int32 "
                     "indices; OneHot (axis 1, negative and out-of-range indices) with float values from a graph "
                     "input.", opset=18)
    x = b.input("x", [2, 3, 4])
    upd = b.input("updates", [3, 4])
    y = b.input("y", [3, 4])
    yu = b.input("y_updates", [3, 2])
    values = b.input("values", [2])
    b.output(b.node("GatherND", [x, b.ints("gather_idx", [[[0, 1], [2, -1]], [[1, 0], [0, 3]]])], batch_dims=1))
    b.output(b.node("ScatterND", [x, b.ints("nd_idx", [[0, 1], [1, -1], [0, 1]]), upd], reduction="add"))
    el_idx = b.init("el_idx", np.array([[0, 3], [1, 1], [-1, 2]], np.int32))
    b.output(b.node("ScatterElements", [y, el_idx, yu], axis=1, reduction="max"))
    b.output(b.node("OneHot", [b.ints("hot_idx", [[1, 0, -1], [5, 2, 3]]), b.ints("depth", [4]), values], axis=1))
    return b


@model
def scatter_opset11():
    b = ModelBuilder("scatter_opset11", "Opset 11 forms: ScatterND and ScatterElements without reduction (last duplicate "
                     "wins is not exercised: indices are distinct), GatherND without batch_dims, OneHot with the "
                     "default last axis.", opset=11)
    x = b.input("x", [3, 4])
    upd = b.input("updates", [2, 4])
    b.output(b.node("ScatterND", [x, b.ints("nd_idx", [[2], [0]]), upd]))
    b.output(b.node("ScatterElements", [x, b.ints("el_idx", [[2, 0, 1, 2], [1, 2, 0, 0]]), upd]))
    b.output(b.node("GatherND", [x, b.ints("gather_idx", [[2, 3], [0, -4]])]))
    b.output(b.node("OneHot", [b.ints("hot_idx", [0, -1, 2]), b.ints("depth", [3]), b.input("values", [2])]))
    return b


@model
def scatter_opset9():
    b = ModelBuilder("scatter_opset9", "Opset 9: Scatter (the deprecated name of ScatterElements) on axis 1, and OneHot "
                     "with float depth.", opset=9)
    x = b.input("x", [2, 5])
    upd = b.input("updates", [2, 2])
    b.output(b.node("Scatter", [x, b.ints("idx", [[4, 0], [1, 3]]), upd], axis=1))
    depth = b.floats("depth", [3.0])
    b.output(b.node("OneHot", [b.ints("hot_idx", [[2, 0]]), depth, b.input("values", [2])], axis=0))
    return b


@model
def layout_depth_space():
    b = ModelBuilder("layout_depth_space", "DepthToSpace in DCR (default) and CRD modes and SpaceToDepth, blocksize 2, "
                     "on a symbolic batch; SpaceToDepth(DepthToSpace(x)) round trip.", opset=13)
    x = b.input("x", ["N", 8, 3, 5])
    dcr = b.node("DepthToSpace", [x], blocksize=2)
    b.output(dcr, b.node("DepthToSpace", [x], blocksize=2, mode="CRD"), b.node("SpaceToDepth", [dcr], blocksize=2))
    b.output(b.node("SpaceToDepth", [b.input("y", ["N", 3, 4, 6])], blocksize=2))
    return b


@model
def trilu_upper_lower():
    b = ModelBuilder("trilu_upper_lower", "Trilu upper with k=-1, lower without k, lower with k=2, on a batched "
                     "[N,4,5] input and an int64 input.", opset=14)
    x = b.input("x", ["N", 4, 5])
    b.output(b.node("Trilu", [x, b.init("k_neg", np.array(-1, np.int64))]), b.node("Trilu", [x], upper=0),
             b.node("Trilu", [x, b.init("k_pos", np.array(2, np.int64))], upper=0))
    b.output(b.node("Trilu", [b.input("xi", [3, 3], I64)]))
    return b


@model
def cumsum_modes():
    b = ModelBuilder("cumsum_modes", "CumSum along a constant axis: inclusive, exclusive, reverse, exclusive+reverse "
                     "with a negative int32 axis, and an int64 input.", opset=14)
    x = b.input("x", [2, 3, 4])
    ax1 = b.init("axis1", np.array(1, np.int64))
    b.output(b.node("CumSum", [x, ax1]), b.node("CumSum", [x, ax1], exclusive=1), b.node("CumSum", [x, ax1], reverse=1),
             b.node("CumSum", [x, b.init("axis_neg", np.array(-1, np.int32))], exclusive=1, reverse=1))
    b.output(b.node("CumSum", [b.input("xi", [5, 2], I64), b.init("axis0", np.array(0, np.int64))]))
    return b


@model
def hardmax_opset13():
    b = ModelBuilder("hardmax_opset13", "Hardmax (opset 13): default last axis and axis 1 of a [2,3,4] input.", opset=13)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("Hardmax", [x]), b.node("Hardmax", [x], axis=1))
    return b


@model
def hardmax_opset11():
    b = ModelBuilder("hardmax_opset11", "Hardmax (opset 11): the input coerced to 2-D at the default axis 1 and at "
                     "axis -1.", opset=11)
    x = b.input("x", [2, 3, 4])
    b.output(b.node("Hardmax", [x]), b.node("Hardmax", [x], axis=-1))
    return b


@model
def einsum_equations():
    b = ModelBuilder("einsum_equations", "Einsum: batched matmul with a symbolic batch, attention scores "
                     "(bhid,bhjd->bhij), implicit output (ij,jk), diagonal (ii->i), trace (ii), reduction to a scalar, "
                     "ellipsis broadcasting, a three-operand chain and a transpose.", opset=12)
    a = b.input("a", ["B", 3, 4])
    c = b.input("c", ["B", 4, 5])
    b.output(b.node("Einsum", [a, c], equation="bij,bjk->bik"))
    q, k = b.input("q", [2, 2, 3, 4]), b.input("k", [2, 2, 5, 4])
    b.output(b.node("Einsum", [q, k], equation="bhid,bhjd->bhij"))
    m, n = b.input("m", [3, 4]), b.input("n", [4, 2])
    b.output(b.node("Einsum", [m, n], equation="ij,jk"))
    sq = b.input("sq", [4, 4])
    b.output(b.node("Einsum", [sq], equation="ii->i"), b.node("Einsum", [sq], equation="ii"),
             b.node("Einsum", [m], equation="ij->"), b.node("Einsum", [m], equation="ij->ji"))
    e1, e2 = b.input("e1", [2, 3, 4]), b.input("e2", [2, 4, 3])
    b.output(b.node("Einsum", [e1, e2], equation="...ij,...jk->...ik"))
    b.output(b.node("Einsum", [m, n, b.input("p", [2, 5])], equation="ij,jk,kl->il"))
    return b


@model
def mvn_axes():
    b = ModelBuilder("mvn_axes", "MeanVarianceNormalization with the default axes [0,2,3] and with axes [1] and "
                     "[2,3].", opset=13)
    # onnx 1.23.2's strict shape inference fails inside MVN's function body ("One and only one of
    # the attributes 'value', 'value_*' ... for a Constant node") at every opset, although the
    # node is valid and ONNX Runtime runs it; this model is inferred and checked non-strictly.
    b.lenient_inference = True
    x = b.input("x", [2, 3, 4, 5])
    outs = [b.node("MeanVarianceNormalization", [x]), b.node("MeanVarianceNormalization", [x], axes=[1]),
            b.node("MeanVarianceNormalization", [x], axes=[2, 3])]
    for o in outs:
        b.declare(o, [2, 3, 4, 5])  # non-strict inference leaves the output shapes out
    b.output(*outs)
    return b


@model
def lp_pool_2d():
    b = ModelBuilder("lp_pool_2d", "LpPool p=3 3x3 padded, p=2 2x2 stride 2 with dilations and ceil_mode (opset 18), "
                     "SAME_UPPER 1-D, GlobalLpPool p=1 and p=2, on a symbolic batch.", opset=18)
    x = b.input("x", ["N", 3, 7, 6])
    b.output(b.node("LpPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], p=3),
             b.node("LpPool", [x], kernel_shape=[2, 2], strides=[2, 2], dilations=[1, 2], ceil_mode=1),
             b.node("GlobalLpPool", [x], p=1), b.node("GlobalLpPool", [x]))
    b.output(b.node("LpPool", [b.input("s", [2, 2, 9])], kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER"))
    return b


def build_lenient(b: ModelBuilder) -> onnx.ModelProto:
    """ModelBuilder.build with non-strict ONNX shape inference (see mvn_axes for why)."""
    strict = onnx.shape_inference.infer_shapes

    def non_strict(m, **kw):
        return strict(m, **{**kw, "strict_mode": False})

    onnx.shape_inference.infer_shapes = non_strict
    try:
        return b.build()
    finally:
        onnx.shape_inference.infer_shapes = strict


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    ap.add_argument("--check-only", action="store_true", help="build and check the models, write nothing")
    args = ap.parse_args()
    check_versions()
    for fn in MODELS:
        b = fn()
        if b.name != fn.__name__:
            raise SystemExit(f"model function {fn.__name__} builds '{b.name}': names must match")
        lenient = getattr(b, "lenient_inference", False)
        m = build_lenient(b) if lenient else b.build()
        onnx.checker.check_model(m, full_check=not lenient)
        smoke_run(m, None)
        if not args.check_only:
            onnx.save_model(m, str(args.out / f"{b.name}.onnx"))
    verb = "checked" if args.check_only else f"wrote to {args.out}:"
    print(f"{verb} {len(MODELS)} models ({', '.join(fn.__name__ for fn in MODELS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
