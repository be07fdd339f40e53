"""Tests of the BENCHMARKS.md writers (CPU only, standard library):

    python3 -m unittest discover -s scripts/gpu -p 'test_*.py'

Fake runs go through write_benchmarks.py and write_transformer_benchmarks.py as the GPU scripts
call them; a later run must replace the figures of the benchmarks it measured and keep the others.
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import bench_store  # noqa: E402


def read(path):
    with open(path) as f:
        return f.read()


def check_run(date, commit, batches, graph_ms, command="scripts/gpu-check.sh --quick"):
    """A gpu-check results.json: ResNet-50 built with the profile cache, benched at `batches`."""
    return {
        "env": {"date_utc": date, "gpu": "NVIDIA H200", "commit": commit, "command": command},
        "overall": "passed",
        "steps": [{"step": "build scratch", "status": "ok", "seconds": 60.0, "required": True}],
        "build_scratch": {"rc": 0, "seconds": 61.5, "report": {"seconds": 60.0, "compiled": 73, "cached": 0},
                          "command": ["onnx2ait", "compile", "M", "-o", "OUT", "--arch", "sm_90a", "--profile-cache",
                                      "p.json"]},
        "validate_b1": {"batch": 1, "runs": [{}], "passed": True, "max_err": 0.01,
                        "engines": {"gpu": {"worst_err": 7e-4, "top1_agree": 8, "top1_rows": 8}}},
        "bench_onnx2ait": {"results": [{"batch": b, "graph_median_ms": graph_ms[b], "median_ms": graph_ms[b] * 1.5}
                                       for b in batches]},
        "bench_torch": {"model": "resnet50", "results": [{"batch": b, "eager_ms": 4.0, "graph_ms": 1.0} for b in batches]},
    }


def bench_run(date, commit):
    """A gpu-bench results.json: ResNet-50 at batch 1 next to torch.compile."""
    return {
        "env": {"date_utc": date, "gpu": "NVIDIA H200", "commit": commit},
        "overall": "complete",
        "plan": {"script": "gpu-bench", "models": ["resnet50"], "batches": [1], "compile_batches": [1],
                 "command": "scripts/gpu-bench.sh --batches 1", "torch_compile": {"enabled": True, "mode": "max-autotune"}},
        "final_resnet50": {"kind": "profiled kernels (profile cache of this run)"},
        "bench_onnx2ait_resnet50": {"results": [{"batch": 1, "graph_median_ms": 0.5, "median_ms": 0.7}]},
        "bench_torch_resnet50": {"results": [{"batch": 1, "eager_ms": 5.0, "graph_ms": 0.9}]},
        "torch_compile_resnet50_b1": {"results": [{"batch": 1, "compile_ms": 0.45, "compile_seconds": 300.0}]},
        "compile_resnet50": {"rc": 0, "seconds": 70.0, "report": {"compiled": 80, "cached": 3}},
    }


def transformer_records(bert_ms):
    recs = []
    for name, seq in (("bert_torchscript", 128), ("vit_torchscript", 0)):
        recs.append({"kind": "build", "name": name, "seq": seq, "seconds": 60.0, "rc": 0,
                     "generated": "generated: 200 kernels"})
        ours = bert_ms if name.startswith("bert") else 2.0
        recs.append({"kind": "bench", "name": name, "seq": seq,
                     "result": [{"batch": 1, "graph_median_ms": ours, "median_ms": ours * 2}]})
    recs.append({"kind": "torch", "model": "vit", "result": {"batches": {"1": {"eager": {"median_ms": 3.0},
                                                                                "cuda_graph": {"median_ms": 1.0}}}}})
    return recs


class Writers(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.md = os.path.join(self.tmp.name, "BENCHMARKS.md")

    def tearDown(self):
        self.tmp.cleanup()

    def write_cnn(self, res):
        path = os.path.join(self.tmp.name, "results.json")
        with open(path, "w") as f:
            json.dump(res, f)
        prev = ["--previous", self.md] if os.path.exists(self.md) else []
        subprocess.run([sys.executable, os.path.join(HERE, "write_benchmarks.py"), "--results", path,
                        "--out", self.md] + prev, check=True, capture_output=True)
        return bench_store.load(self.md)

    def write_transformers(self, recs, commit, when, gpu="NVIDIA H200, 580", rowwise=None):
        path = os.path.join(self.tmp.name, "results.jsonl")
        with open(path, "w") as f:
            f.write("\n".join(json.dumps(r) for r in recs) + "\n")
        extra = []
        if rowwise is not None:
            extra = ["--rowwise", os.path.join(self.tmp.name, "rowwise.txt")]
            with open(extra[1], "w") as f:
                f.write(rowwise)
        subprocess.run([sys.executable, os.path.join(HERE, "write_transformer_benchmarks.py"), path,
                        "--previous", self.md, "--out", self.md, "--commit", commit, "--when", when,
                        "--gpu", gpu, "--command", "scripts/gpu-transformers.sh"] + extra,
                       check=True, capture_output=True)
        return bench_store.load(self.md)

    @staticmethod
    def row(store, model, batch, build=None, gpu=None):
        rows = [r for r in store["latency"] if r["model"] == model and r["batch"] == batch
                and (build is None or r["build"] == build) and (gpu is None or r["gpu"] == gpu)]
        assert len(rows) == 1, rows
        return rows[0]["cells"]

    def test_second_run_replaces_its_benchmarks_and_keeps_the_others(self):
        a = "2026-12-01 10:00 UTC"
        self.write_cnn(check_run(a, "a" * 40, [1, 8], {1: 0.40, 8: 0.60}))
        store = self.write_cnn(check_run("2026-12-02 10:00 UTC", "b" * 40, [1], {1: 0.35}))
        one, eight = self.row(store, "resnet50", 1), self.row(store, "resnet50", 8)
        self.assertEqual(one["onnx2ait"]["ms"], 0.35)
        self.assertTrue(one["onnx2ait"]["run"].endswith("bbbbbbbbbbbb"))
        self.assertEqual(eight["onnx2ait"]["ms"], 0.60)
        self.assertTrue(eight["onnx2ait"]["run"].endswith("aaaaaaaaaaaa"))
        self.assertEqual(len(store["latency"]), 2)
        # Build and validation of the same benchmark: replaced, not added.
        self.assertEqual(len(store["builds"]), 1)
        self.assertTrue(store["builds"][0]["run"].endswith("bbbbbbbbbbbb"))
        self.assertEqual([v["batch"] for v in store["validation"]], [1])
        text = read(self.md)
        self.assertEqual(text.count("0.400"), 0)  # the superseded figure is gone
        self.assertIn("| 0.350 |", text)
        self.assertIn("| 0.600 |", text)
        self.assertEqual(text.count("## ResNet-50"), 1)
        # Both runs are named: batch 8 still comes from the first.
        self.assertEqual(len(store["runs"]), 2)

    def test_bench_validations_at_each_batch_are_kept(self):
        res = bench_run("2026-12-01 10:00 UTC", "a" * 40)
        engines = {"gpu": {"worst_err": 6e-4, "top1_agree": 2, "top1_rows": 2}}
        res["validate_resnet50"] = {"batch": 1, "seeds": [0, 1], "passed": True, "max_err": 0.01, "engines": engines}
        res["validate_resnet50_b8"] = {"batch": 8, "seeds": [0, 1], "passed": False, "max_err": 0.01,
                                       "engines": {"gpu": {"worst_err": 3e-2, "top1_agree": 16, "top1_rows": 16}}}
        store = self.write_cnn(res)
        rows = sorted((v["batch"], v["rel_err"], v["top1"]) for v in store["validation"] if v["model"] == "resnet50")
        self.assertEqual(rows, [(1, "6.00e-04", "2/2"), (8, "3.00e-02", "16/16")])
        text = read(self.md)
        self.assertIn("validation at batch 1 against ONNX Runtime (2 seeds): rel err 6.00e-04", text)
        self.assertIn("validation at batch 8 against ONNX Runtime (2 seeds): rel err 3.00e-02, top-1 16/16", text)
        self.assertIn("FAILED: out of the error bound", text)

    def test_run_without_a_figure_left_is_dropped(self):
        self.write_cnn(check_run("2026-12-01 10:00 UTC", "a" * 40, [1], {1: 0.40}))
        store = self.write_cnn(check_run("2026-12-02 10:00 UTC", "b" * 40, [1], {1: 0.35}))
        self.assertEqual([r["id"] for r in store["runs"].values()], ["2026-12-02T1000Z-bbbbbbbbbbbb"])
        self.assertNotIn("aaaaaaaaaaaa", read(self.md))

    def test_torch_compile_of_an_older_run_is_kept_and_marked(self):
        self.write_cnn(bench_run("2026-12-01 10:00 UTC", "a" * 40))
        store = self.write_cnn(check_run("2026-12-02 10:00 UTC", "b" * 40, [1], {1: 0.35}))
        cells = self.row(store, "resnet50", 1)
        self.assertEqual(cells["onnx2ait"]["ms"], 0.35)
        self.assertEqual(cells["torch_compile"]["ms"], 0.45)
        self.assertTrue(cells["torch_compile"]["run"].endswith("aaaaaaaaaaaa"))
        text = read(self.md)
        self.assertIn("1.29×†", text)  # 0.45 / 0.35, figures of two runs
        # Build times of both scripts are distinct benchmarks: both kept.
        self.assertEqual(sorted(b["step"] for b in store["builds"]),
                         ["onnx2ait build after profiling", "onnx2ait compile: from scratch (empty cache)",
                          "torch.compile batch 1"])

    def test_transformer_runs(self):
        self.write_cnn(check_run("2026-12-01 10:00 UTC", "a" * 40, [1], {1: 0.40}))
        self.write_transformers(transformer_records(1.0), "c" * 40, "2026-12-02 10:00 UTC")
        recs = [r for r in transformer_records(0.8) if not r.get("name", "").startswith("vit")
                and r.get("model") != "vit"]
        store = self.write_transformers(recs, "d" * 40, "2026-12-03 10:00 UTC")
        bert = self.row(store, "bert", 1)
        vit = self.row(store, "vit", 1)
        self.assertEqual(bert["onnx2ait"]["ms"], 0.8)
        self.assertTrue(bert["onnx2ait"]["run"].endswith("dddddddddddd"))
        self.assertEqual(vit["onnx2ait"]["ms"], 2.0)
        self.assertEqual(vit["cuda_graph"]["ms"], 1.0)
        self.assertTrue(vit["onnx2ait"]["run"].endswith("cccccccccccc"))
        self.assertEqual(self.row(store, "resnet50", 1)["onnx2ait"]["ms"], 0.40)
        text = read(self.md)
        # The newest transformer run keeps its whole report; the older one its header.
        self.assertIn("#### Builds", text)
        self.assertEqual(text.count("#### Latency (median ms"), 1)

    def test_transformer_section_names_what_ran(self):
        import write_transformer_benchmarks as wtb
        vit = [{"kind": "export", "model": "vit"}, {"kind": "build", "name": "vit_torchscript_fusedattn"}]
        self.assertEqual(wtb.models_text(vit), "torchvision `vit_b_16`")
        self.assertIn("heuristic kernel choice (no profile)", wtb.choice_text(vit))
        both = vit + [{"kind": "export", "model": "bert"}, {"kind": "build", "name": "bert_torchscript_profiled"}]
        self.assertTrue(wtb.models_text(both).startswith("Hugging Face `BertModel`"))
        self.assertIn("*_profiled with kernels chosen by profiling", wtb.choice_text(both))
        profiled = [{"kind": "build", "name": "bert_torchscript_profiled"}]
        self.assertIn("chosen by profiling on this GPU (`compile --profile`)", wtb.choice_text(profiled))

    def test_run_time_settings_get_their_own_rows(self):
        # One library timed with PDL off and with the attention block width and rows forced: four rows,
        # and the default's figure is not overwritten by the others'.
        base = "bert_torchscript_fusedattn"
        recs = [{"kind": "bench", "name": name, "seq": 128, "result": [{"batch": 1, "graph_median_ms": ms,
                                                                           "median_ms": ms}]}
                for name, ms in ((base, 0.5), (base + "_pdl_off", 0.6), (base + "_attnwarps8", 0.4),
                                 (base + "_attnrows32", 0.45))]
        store = self.write_transformers(recs, "e" * 40, "2026-12-04 10:00 UTC")
        label = "torchscript export, fused attention, heuristic kernels"
        self.assertEqual(self.row(store, "bert", 1, label)["onnx2ait"]["ms"], 0.5)
        self.assertEqual(self.row(store, "bert", 1, label + ", O2A_PDL=0")["onnx2ait"]["ms"], 0.6)
        self.assertEqual(self.row(store, "bert", 1, label + ", O2A_ATTENTION_WARPS=8")["onnx2ait"]["ms"], 0.4)
        self.assertEqual(self.row(store, "bert", 1, label + ", O2A_ATTENTION_ROWS=32")["onnx2ait"]["ms"], 0.45)

    def test_transformer_torch_compile_column(self):
        # A run that timed torch.compile (gpu-transformers.sh --torch-compile) stores it as that
        # engine with its mode; batches it did not time get none.
        recs = transformer_records(0.5)
        recs.append({"kind": "bench", "name": "vit_torchscript", "seq": 0,
                     "result": [{"batch": 8, "graph_median_ms": 4.0, "median_ms": 5.0}]})
        recs[-2]["result"]["batches"]["1"]["torch_compile"] = {"median_ms": 1.5, "mode": "max-autotune",
                                                                "compile_seconds": 90.0}
        recs[-2]["result"]["batches"]["8"] = {"eager": {"median_ms": 6.0}, "cuda_graph": {"median_ms": 4.4}}
        store = self.write_transformers(recs, "f" * 40, "2026-12-04 11:00 UTC")
        one = self.row(store, "vit", 1)
        self.assertEqual((one["torch_compile"]["ms"], one["torch_compile"]["mode"]), (1.5, "max-autotune"))
        self.assertNotIn("torch_compile", self.row(store, "vit", 8))
        text = read(self.md)
        self.assertIn("torch.compile max-autotune", text)
        self.assertIn("| 0.75× |", text)  # 1.5 / 2.0 in the run's own table

    def test_run_time_length_builds_and_figures_of_two_gpus(self):
        # A run-time-length build on an H200 next to PyTorch, then the same build on an H100
        # without PyTorch: its own label, and a row per GPU (the H200's figure and ratio stay).
        name, label = ("bert_torchscript_seqrange128_fusedattn",
                       "torchscript export, run-time seq 1..128, fused attention, heuristic kernels")

        def records(ms, torch):
            recs = [{"kind": "build", "name": name, "seq": 128, "seconds": 9.0, "rc": 0,
                     "generated": "generated: 107 kernels"},
                    {"kind": "bench", "name": name, "seq": 128,
                     "result": [{"batch": 1, "graph_median_ms": ms, "median_ms": ms * 1.4}]}]
            if torch:
                recs.append({"kind": "torch", "model": "bert", "result": {"seq": 128, "batches": {
                    "1": {"eager": {"median_ms": 5.0}, "cuda_graph": {"median_ms": 0.75}}}}})
            return recs

        self.write_transformers(transformer_records(1.0) + records(0.6, True), "c" * 40, "2026-12-02 10:00 UTC")
        line = lambda gpu: next(x for x in read(self.md).splitlines() if x.startswith(f"| {label} | {gpu} | 128 | 1 |"))
        self.assertIn("1.25×", line("NVIDIA H200"))  # 0.75 / 0.6, one run, one GPU
        store = self.write_transformers(records(0.5, False), "d" * 40, "2026-12-03 10:00 UTC",
                                        gpu="NVIDIA H100 80GB HBM3, 580")
        h100 = self.row(store, "bert", 1, label, gpu="NVIDIA H100 80GB HBM3")
        self.assertEqual(h100["onnx2ait"]["ms"], 0.5)
        self.assertNotIn("cuda_graph", h100)
        self.assertNotIn("×", line("NVIDIA H100 80GB HBM3"))
        h200 = self.row(store, "bert", 1, label, gpu="NVIDIA H200")
        self.assertEqual((h200["onnx2ait"]["ms"], h200["cuda_graph"]["ms"]), (0.6, 0.75))
        self.assertIn("1.25×", line("NVIDIA H200"))
        # The fixed-length build of the first run keeps its own row.
        self.assertEqual(self.row(store, "bert", 1, "torchscript export, heuristic kernels")["onnx2ait"]["ms"], 1.0)

    def test_a_store_of_the_first_format_is_keyed_by_gpu_on_load(self):
        # Format 1 had no GPU in the keys: a row whose onnx2ait figure came from an H100 run and
        # whose torch.compile figure from an H200 run becomes two rows, one per GPU.
        self.write_cnn(bench_run("2026-12-01 10:00 UTC", "a" * 40))
        store = bench_store.load(self.md)
        old = json.loads(json.dumps(store))
        old["format"] = 1
        for kind in ("builds", "validation", "latency"):
            for rec in old[kind]:
                rec.pop("gpu")
        row = next(r for r in old["latency"] if r["batch"] == 1)
        h100 = dict(old["runs"][row["cells"]["onnx2ait"]["run"]], id="2026-12-02T1000Z-bbbbbbbbbbbb",
                    gpu="NVIDIA H100 80GB HBM3, 580")
        old["runs"][h100["id"]] = h100
        row["cells"]["onnx2ait"] = dict(row["cells"]["onnx2ait"], run=h100["id"])
        text = bench_store.render(dict(old, format=2)).replace('{"format": 2,', '{"format": 1,')
        up = bench_store.load_text(text)
        self.assertEqual(up["format"], 2)
        ones = sorted((r["gpu"], sorted(r["cells"])) for r in up["latency"] if r["batch"] == 1)
        self.assertEqual([g for g, _ in ones], ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
        self.assertEqual(ones[0][1], ["onnx2ait"])
        self.assertNotIn("onnx2ait", ones[1][1])
        self.assertTrue(all(r["gpu"] == "NVIDIA H200" for r in up["builds"] + up["validation"]))

    @staticmethod
    def sweep(tbs):
        """bench_rowwise.py's table with onnx2ait at `tbs` TB/s for both ops at K = 128 and 1024."""
        lines = ["op              K     rows  onnx2ait TB/s  torch TB/s  copy TB/s  kernel"]
        for op in ("softmax", "layernorm"):
            for k in (128, 1024):
                lines.append(f"{op:<9} {k:>7} {2**26 // k:>8} {tbs:>14.2f} {1.5:>11.2f} {3.8:>10.2f}  k000_{op}")
        return "\n".join(lines) + "\n"

    def test_rowwise_sweeps_are_kept_per_gpu(self):
        self.write_transformers(transformer_records(0.5), "a" * 40, "2026-12-05 03:37 UTC", rowwise=self.sweep(3.7))
        first = read(self.md)
        self.write_transformers(transformer_records(0.5), "b" * 40, "2026-12-05 14:44 UTC",
                                gpu="NVIDIA H100 80GB HBM3, 580", rowwise=self.sweep(2.7))
        # A later run without a sweep replaces the latencies and keeps both GPUs' sweeps.
        store = self.write_transformers(transformer_records(0.4), "c" * 40, "2026-12-06 10:00 UTC")
        by_gpu = {(r["gpu"], r["op"], r["k"]): r for r in store["rowwise"]}
        self.assertEqual(len(by_gpu), 8)
        self.assertEqual(by_gpu[("NVIDIA H200", "softmax", 1024)]["onnx2ait_tbs"], 3.7)
        self.assertEqual(by_gpu[("NVIDIA H100 80GB HBM3", "layernorm", 128)]["onnx2ait_tbs"], 2.7)
        self.assertEqual(by_gpu[("NVIDIA H200", "softmax", 1024)]["run"], "2026-12-05T0337Z-aaaaaaaaaaaa")
        text = read(self.md)
        self.assertIn("## Softmax and layernorm bandwidth", text)
        self.assertIn("| NVIDIA H200 | softmax | 1024 | 65536 | 3.70 | 1.50 | 3.80 | 97% |", text)
        self.assertEqual(bench_store.render(bench_store.load_text(text)), text)
        # A sweep from a file the store did not keep it in comes back under its own run.
        fresh = bench_store.empty()
        bench_store.restore_rowwise(fresh, first, "2026-12-05T0337Z-aaaaaaaaaaaa")
        self.assertEqual(len(fresh["rowwise"]), 4)
        self.assertEqual(fresh["latency"], [])
        self.assertEqual(list(fresh["runs"]), ["2026-12-05T0337Z-aaaaaaaaaaaa"])

    def test_render_load_round_trip(self):
        self.write_cnn(bench_run("2026-12-01 10:00 UTC", "a" * 40))
        self.write_cnn(check_run("2026-12-02 10:00 UTC", "b" * 40, [1, 8], {1: 0.35, 8: 0.5}))
        text = read(self.md)
        self.assertEqual(bench_store.render(bench_store.load_text(text)), text)

    def test_migration_of_the_older_format(self):
        # The older format: every run a section, newest first, as the writers rendered them.
        import write_benchmarks
        old = "\n".join(["# Benchmarks", "", "Each run adds a section at the top.", "",
                         write_benchmarks.render_section(check_run("2026-12-02 10:00 UTC", "b" * 40, [1], {1: 0.35})),
                         write_benchmarks.render_section(check_run("2026-12-01 10:00 UTC", "a" * 40, [1, 8],
                                                                   {1: 0.40, 8: 0.60}))])
        oldpath = os.path.join(self.tmp.name, "old.md")
        with open(oldpath, "w") as f:
            f.write(old)
        subprocess.run([sys.executable, os.path.join(HERE, "write_benchmarks.py"), "--migrate", oldpath,
                        "--out", self.md], check=True, capture_output=True)
        store = bench_store.load(self.md)
        self.assertEqual(self.row(store, "resnet50", 1)["onnx2ait"]["ms"], 0.35)
        self.assertEqual(self.row(store, "resnet50", 8)["onnx2ait"]["ms"], 0.60)


class WhereTheTimeGoes(unittest.TestCase):
    """The per-kernel tables of `onnx2ait bench --kernels --json`: work and achieved rates."""

    def res(self, ceilings=True):
        kernels = [
            {"name": "k000_nchw_to_nhwc", "node": "graph inputs, conv_1", "ms": 0.25, "flops": None, "bytes": 500000},
            {"name": "k001_conv2d_library", "node": "conv_1", "ms": 2.0, "flops": 4e9, "bytes": 8e6},
            {"name": "k002_conv2d_library", "node": "conv_2", "ms": 1.0, "flops": 1e9, "bytes": 2e6},
            {"name": "k003_gemm_library", "node": "fc", "ms": 0.5},  # an older build: no work
        ]
        res = {"plan": {"iters": 100}, "bench_onnx2ait_resnet50": {"results": [
            {"batch": 1, "graph_median_ms": 0.5, "median_ms": 0.7},
            {"batch": 32, "graph_median_ms": 3.5, "median_ms": 4.0, "kernels": kernels}]}}
        if ceilings:
            res["bench_torch_resnet50"] = {"gemm_ceiling": {"tflops": 400.0}, "copy_ceiling": {"gbps": 2000.0}}
        return res

    def test_kernels_and_families_carry_work_and_rates(self):
        import write_benchmarks
        text = "\n".join(write_benchmarks.bench_kernel_times(self.res(), "resnet50"))
        self.assertIn("#### Where the time goes (onnx2ait, batch 32)", text)
        self.assertIn("fp16 GEMM ceiling 400 TFLOP/s, copy ceiling 2000 GB/s", text)
        self.assertIn("| # | ms | % | GFLOP | TFLOP/s | % of GEMM ceiling | MB | GB/s | % of copy ceiling | kernel | node |",
                      text)
        # 4 GFLOP in 2 ms: 2 TFLOP/s, 0.5% of 400; 8 MB in 2 ms: 4 GB/s, 0.2% of 2000.
        self.assertIn("| 1 | 2.000 | 53.3% | 4.00 | 2.00 | 0.5% | 8.00 | 4.00 | 0.2% | `k001_conv2d_library` | conv_1 |",
                      text)
        self.assertIn("| 3 | 0.500 | 13.3% | — | — | — | — | — | — | `k003_gemm_library` | fc |", text)
        self.assertIn("| 4 | 0.250 | 6.7% | — | — | — | 0.500 | 2.00 | 0.1% | `k000_nchw_to_nhwc` |", text)
        self.assertIn("| kernel family | kernels | ms | % | GFLOP | TFLOP/s | MB | GB/s |", text)
        # The family's work over its summed time: 5 GFLOP in 3 ms, 10 MB in 3 ms.
        self.assertIn("| `conv2d_library` | 2 | 3.000 | 80.0% | 5.00 | 1.67 | 10.0 | 3.33 |", text)
        self.assertIn("| `gemm_library` | 1 | 0.500 | 13.3% | — | — | — | — |", text)

    def test_without_ceilings_no_share_is_printed(self):
        import write_benchmarks
        text = "\n".join(write_benchmarks.bench_kernel_times(self.res(ceilings=False), "resnet50"))
        self.assertIn("| # | ms | % | GFLOP | TFLOP/s | MB | GB/s | kernel | node |", text)
        self.assertNotIn("ceiling", text)


class KernelsVariant(unittest.TestCase):
    def test_a_partial_profile_is_not_filed_as_profiled(self):
        """gpu-bench's label of a build whose profile the time budget stopped (profiled_kind)."""
        partial = ("onnx2ait build benchmarked: partly profiled kernels (profile cache of this run: "
                   "41 of 53 node choices measured, the heuristic chose the rest)")
        self.assertEqual(bench_store.kernels_variant(partial), "partly profiled kernels")
        whole = "onnx2ait build benchmarked: profiled kernels (profile cache of this run; 53 of 53 node choices measured)"
        self.assertEqual(bench_store.kernels_variant(whole), "profiled kernels")
        self.assertEqual(bench_store.kernels_variant("heuristic kernels (no profile cache)"), "heuristic kernels")


class Repository(unittest.TestCase):
    def test_benchmarks_md_is_rendered_from_its_store(self):
        """BENCHMARKS.md is exactly what its store renders: nobody edited a figure by hand."""
        text = read(os.path.join(ROOT, "BENCHMARKS.md"))
        self.assertIn(bench_store.STORE_HEAD, text)
        self.assertTrue(bench_store.render(bench_store.load_text(text)) == text,
                        "BENCHMARKS.md differs from what its store renders (edited by hand?)")


if __name__ == "__main__":
    unittest.main()
