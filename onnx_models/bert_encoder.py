#!/usr/bin/env python3
"""Writes a 12-layer BERT-base encoder in the topology `torch.onnx.export` produces for
HuggingFace's `BertEncoder` at opset 14..17 (no fused LayerNormalization, no attention fusion):

    per layer (hidden 768, 12 heads of 64, FFN 3072):
        Q, K, V = MatMul(x, W) + b, each Reshape([N, S, 12, 64]) through a Shape/Gather/Unsqueeze/
                  Concat shape subgraph, Transpose to [N, 12, S, 64] (K to [N, 12, 64, S])
        scores  = Softmax(MatMul(Q, K^T) / 8 + mask, axis -1);  ctx = MatMul(scores, V)
        ctx     -> Transpose [0, 2, 1, 3] -> Reshape [N, S, 768] -> MatMul + b -> Add(x) -> LayerNorm
        FFN     = MatMul(768 -> 3072) + b -> GELU (Erf form: x * 0.5 * (1 + erf(x / sqrt 2)))
                  -> MatMul(3072 -> 768) + b -> Add(residual) -> LayerNorm
    LayerNorm decomposed: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add beta.

Inputs `hidden_states` [N, S, 768] and an additive `attention_mask` [N, 1, 1, S] (batch "N" and
sequence "S" symbolic); output `last_hidden_state` [N, S, 768]. Random weights (normal, std 0.02,
as BERT's initialiser) with a fixed seed; names follow the exporter
(`encoder.layer.0.attention.self.query.weight`, `/encoder/layer.0/attention/self/query/MatMul`).
Opset 17 (ReduceMean axes as an attribute), ir_version 8. About 85 M parameters (~340 MB).

Usage: bert_encoder.py [--out PATH] [--layers N] [--check]
       (default: onnx_models/generated/bert12.onnx)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
SEED = 12
HIDDEN = 768
HEADS = 12
HEAD_DIM = HIDDEN // HEADS
FFN = 3072
EPS = 1e-12


class Net:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.consts = 0

    def param(self, name: str, array: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(array, name))
        return name

    def const(self, scope: str, array: np.ndarray) -> str:
        """A `Constant` node, as the exporter emits for literals."""
        self.consts += 1
        name = f"{scope}/Constant_{self.consts}_output_0"
        self.nodes.append(helper.make_node("Constant", [], [name], name=f"{scope}/Constant_{self.consts}",
                                           value=numpy_helper.from_array(array)))
        return name

    def node(self, op: str, inputs: list[str], scope: str, **attrs) -> str:
        out = f"{scope}/{op}_output_0"
        self.nodes.append(helper.make_node(op, inputs, [out], name=f"{scope}/{op}", **attrs))
        return out

    def linear(self, x: str, name: str, scope: str, n_in: int, n_out: int) -> str:
        w = self.param(f"{name}.weight_t", (self.rng.standard_normal((n_in, n_out)) * 0.02).astype(np.float32))
        b = self.param(f"{name}.bias", (self.rng.standard_normal(n_out) * 0.02).astype(np.float32))
        y = self.node("MatMul", [x, w], scope)
        return self.node("Add", [b, y], scope)

    def layernorm(self, x: str, name: str, scope: str) -> str:
        g = self.param(f"{name}.weight", (1.0 + self.rng.standard_normal(HIDDEN) * 0.02).astype(np.float32))
        b = self.param(f"{name}.bias", (self.rng.standard_normal(HIDDEN) * 0.02).astype(np.float32))
        mean = self.node("ReduceMean", [x], f"{scope}/mean", axes=[-1], keepdims=1)
        d = self.node("Sub", [x, mean], scope)
        sq = self.node("Pow", [d, self.const(scope, np.array(2.0, np.float32))], scope)
        var = self.node("ReduceMean", [sq], f"{scope}/var", axes=[-1], keepdims=1)
        ve = self.node("Add", [var, self.const(scope, np.array(EPS, np.float32))], f"{scope}/eps")
        sd = self.node("Sqrt", [ve], scope)
        n = self.node("Div", [d, sd], scope)
        scaled = self.node("Mul", [n, g], scope)
        return self.node("Add", [scaled, b], f"{scope}/beta")

    def split_heads(self, x: str, scope: str, perm: list[int]) -> str:
        shape = self.node("Shape", [x], scope)
        n = self.node("Gather", [shape, self.const(scope, np.array(0, np.int64))], f"{scope}/n", axis=0)
        s = self.node("Gather", [shape, self.const(scope, np.array(1, np.int64))], f"{scope}/s", axis=0)
        n1 = self.node("Unsqueeze", [n, self.const(scope, np.array([0], np.int64))], f"{scope}/n")
        s1 = self.node("Unsqueeze", [s, self.const(scope, np.array([0], np.int64))], f"{scope}/s")
        dims = self.node("Concat", [n1, s1, self.const(scope, np.array([HEADS, HEAD_DIM], np.int64))], scope, axis=0)
        r = self.node("Reshape", [x, dims], scope)
        return self.node("Transpose", [r], scope, perm=perm)

    def layer(self, x: str, mask: str, i: int) -> str:
        p = f"encoder.layer.{i}"
        sc = f"/encoder/layer.{i}"
        att = f"{sc}/attention/self"
        q = self.split_heads(self.linear(x, f"{p}.attention.self.query", f"{att}/query", HIDDEN, HIDDEN),
                             f"{att}/q", [0, 2, 1, 3])
        k = self.split_heads(self.linear(x, f"{p}.attention.self.key", f"{att}/key", HIDDEN, HIDDEN),
                             f"{att}/k", [0, 2, 3, 1])
        v = self.split_heads(self.linear(x, f"{p}.attention.self.value", f"{att}/value", HIDDEN, HIDDEN),
                             f"{att}/v", [0, 2, 1, 3])
        scores = self.node("MatMul", [q, k], f"{att}/scores")
        scaled = self.node("Div", [scores, self.const(att, np.array(np.sqrt(HEAD_DIM), np.float32))], att)
        masked = self.node("Add", [scaled, mask], f"{att}/mask")
        probs = self.node("Softmax", [masked], att, axis=-1)
        ctx = self.node("MatMul", [probs, v], f"{att}/ctx")
        ctx = self.node("Transpose", [ctx], f"{att}/ctx", perm=[0, 2, 1, 3])
        shape = self.node("Shape", [ctx], f"{att}/merge")
        n = self.node("Gather", [shape, self.const(att, np.array(0, np.int64))], f"{att}/merge/n", axis=0)
        s = self.node("Gather", [shape, self.const(att, np.array(1, np.int64))], f"{att}/merge/s", axis=0)
        n1 = self.node("Unsqueeze", [n, self.const(att, np.array([0], np.int64))], f"{att}/merge/n")
        s1 = self.node("Unsqueeze", [s, self.const(att, np.array([0], np.int64))], f"{att}/merge/s")
        dims = self.node("Concat", [n1, s1, self.const(att, np.array([HIDDEN], np.int64))], f"{att}/merge", axis=0)
        ctx = self.node("Reshape", [ctx, dims], f"{att}/merge")
        out = self.linear(ctx, f"{p}.attention.output.dense", f"{sc}/attention/output/dense", HIDDEN, HIDDEN)
        res = self.node("Add", [out, x], f"{sc}/attention/output/residual")
        x = self.layernorm(res, f"{p}.attention.output.LayerNorm", f"{sc}/attention/output/LayerNorm")
        h = self.linear(x, f"{p}.intermediate.dense", f"{sc}/intermediate/dense", HIDDEN, FFN)
        g = f"{sc}/intermediate/intermediate_act_fn"
        e = self.node("Erf", [self.node("Div", [h, self.const(g, np.array(1.4142135, np.float32))], g)], g)
        e1 = self.node("Add", [e, self.const(g, np.array(1.0, np.float32))], g)
        hx = self.node("Mul", [h, e1], g)
        h = self.node("Mul", [hx, self.const(g, np.array(0.5, np.float32))], f"{g}/half")
        out = self.linear(h, f"{p}.output.dense", f"{sc}/output/dense", FFN, HIDDEN)
        res = self.node("Add", [out, x], f"{sc}/output/residual")
        return self.layernorm(res, f"{p}.output.LayerNorm", f"{sc}/output/LayerNorm")


def build(layers: int) -> onnx.ModelProto:
    net = Net(SEED)
    x = "hidden_states"
    for i in range(layers):
        x = net.layer(x, "attention_mask", i)
    net.nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"], name="/encoder/Identity"))
    graph = helper.make_graph(
        net.nodes, "bert_encoder",
        [helper.make_tensor_value_info("hidden_states", TensorProto.FLOAT, ["N", "S", HIDDEN]),
         helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["N", 1, 1, "S"])],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["N", "S", HIDDEN])],
        net.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="pytorch",
                              producer_version="2.1.0")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "generated" / "bert12.onnx")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--check", action="store_true", help="run the model with onnxruntime")
    args = ap.parse_args()
    model = build(args.layers)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(args.out))
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    print(f"wrote {args.out} ({len(model.graph.node)} nodes, {n_params / 1e6:.2f} M parameters)")
    if args.check:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(args.out), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        x = rng.standard_normal((2, 128, HIDDEN)).astype(np.float32)
        mask = np.zeros((2, 1, 1, 128), np.float32)
        (y,) = sess.run(None, {"hidden_states": x, "attention_mask": mask})
        print(f"ORT: output {y.shape}, mean {y.mean():.4f}, std {y.std():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
