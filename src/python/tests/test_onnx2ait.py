"""Tests of the Python package (run by scripts/test-python.sh, which installs it first).

CPU only where no GPU is present: compiling (sources only, and a tiny library where nvcc is
found), option errors, loading errors and the input conversions run everywhere; running a model
needs a CUDA GPU and is skipped, with a message, without one (ONNX2AIT_REQUIRE_GPU=1 makes that a
failure). A missing nvcc skips the library tests likewise, except in CI (CI set) or with
ONNX2AIT_REQUIRE_NVCC, as the cargo tests do.
"""

import os
import shutil
import subprocess
import tempfile
import unittest
from pathlib import Path

import numpy as np

import onnx2ait
from onnx2ait import _host_array, _spec, IOSpec

ROOT = Path(__file__).resolve().parents[3]
MODELS = ROOT / "onnx_models"
# A small convnet whose batch dim is the symbol N: x [N,3,16,16] -> gemm_0 [N,10].
CONVNET = MODELS / "convnet_symbolic_batch.onnx"


def gpu_present():
    """Whether a CUDA GPU is visible (nvidia-smi lists one)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


HAS_GPU = gpu_present()
if not HAS_GPU and os.environ.get("ONNX2AIT_REQUIRE_GPU"):
    raise RuntimeError("ONNX2AIT_REQUIRE_GPU is set but no CUDA GPU is visible (nvidia-smi -L)")
NO_GPU = "no CUDA GPU here (nvidia-smi -L lists none): the tests that run a model are skipped"


def tiny_model(path):
    """y = Relu(x) + x and z = x * 2 on x [N,4] float32, with a float16 input h [N,2,3]: small
    enough for nvcc to build in seconds. Returns the path."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h

    x = h.make_tensor_value_info("x", T.FLOAT, ["N", 4])
    hh = h.make_tensor_value_info("h", T.FLOAT16, ["N", 2, 3])
    y = h.make_tensor_value_info("y", T.FLOAT, ["N", 4])
    z = h.make_tensor_value_info("z", T.FLOAT16, ["N", 2, 3])
    two = h.make_tensor("two", T.FLOAT16, [], [2.0])
    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Add", ["r", "x"], ["y"]),
        h.make_node("Mul", ["h", "two"], ["z"]),
    ]
    g = h.make_graph(nodes, "tiny", [x, hh], [y, z], initializer=[two])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), str(path))
    return path


def compile_or_skip(test, *args, **kwargs):
    """onnx2ait.compile, skipping `test` when it finds no nvcc, unless nvcc is required here."""
    required = os.environ.get("CI") or os.environ.get("ONNX2AIT_REQUIRE_NVCC")
    try:
        return onnx2ait.compile(*args, **kwargs)
    except onnx2ait.Error as e:
        if "nvcc" in str(e) and "no library was built" in str(e) and not required:
            test.skipTest(f"no nvcc: {str(e).splitlines()[0]}")
        raise


class Compile(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="onnx2ait-py-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_sources_only(self):
        out = self.tmp / "out"
        b = onnx2ait.compile(CONVNET, out, build=False, no_profile=True, max_batch=8)
        self.assertIsInstance(b, onnx2ait.Build)
        self.assertEqual(b.out, out)
        self.assertIsNone(b.library)
        for f in ["model.cu", "model.h", "weights.bin", "graph.json", "kernels.json", "summary.txt", "build.log"]:
            self.assertTrue((out / f).is_file(), f)
        self.assertFalse((out / "libmodel.so").exists())
        self.assertEqual(b.summary, (out / "summary.txt").read_text())
        self.assertIn("optimised:", b.summary)
        self.assertIn(f'#define O2A_BUILD_HASH "{b.build_hash}"', (out / "model.h").read_text())
        self.assertTrue(b.kernels and all(isinstance(n, int) and n > 0 for n in b.kernels.values()), b.kernels)
        # The same model and options render the same files: the same hash.
        again = onnx2ait.compile(str(CONVNET), str(out), build=False, no_profile=True, max_batch=8)
        self.assertEqual(again.build_hash, b.build_hash)
        other = onnx2ait.compile(CONVNET, out, build=False, no_profile=True, max_batch=8, precision="fp32")
        self.assertNotEqual(other.build_hash, b.build_hash)

    def test_dims_fix_a_symbol(self):
        b = onnx2ait.compile(CONVNET, self.tmp / "out", build=False, no_profile=True, dims={"N": 2})
        self.assertIn("model:", b.summary)

    def test_unknown_dim_is_named(self):
        with self.assertRaises(ValueError) as e:
            onnx2ait.compile(CONVNET, self.tmp / "out", build=False, dims={"nosuch": 4})
        self.assertIn("nosuch", str(e.exception))
        self.assertIn("N", str(e.exception))  # the dims the model has
        self.assertFalse((self.tmp / "out").exists())

    def test_bad_options(self):
        bad = [
            ({"max_batch": 0}, ValueError, "max_batch"),
            ({"max_batch": -3}, ValueError, "max_batch"),
            ({"max_batch": True}, TypeError, "max_batch"),
            ({"max_batch": 2.5}, TypeError, "max_batch"),
            ({"arch": "sm_86"}, ValueError, "sm_86"),
            ({"precision": "fp8"}, ValueError, "fp8"),
            ({"attention": "flash"}, ValueError, "flash"),
            ({"squeeze_excite": "always"}, ValueError, "squeeze_excite"),
            ({"max_memory": "12 parsecs"}, ValueError, "parsecs"),
            ({"max_memory": 0}, ValueError, "max_memory"),
            ({"max_memory": [1]}, TypeError, "max_memory"),
            ({"dims": {"N": -1}}, ValueError, "N"),
            ({"dims": {"N": "four"}}, TypeError, "N"),
            ({"dims": ["N", 4]}, TypeError, "dims"),
            ({"jobs": 0}, ValueError, "jobs"),
            ({"reuse_within": 150.0}, ValueError, "reuse_within"),
            ({"profile": True, "no_profile": True}, ValueError, "no_profile"),
            ({"no_profile": True, "profile_cache": "p.json"}, ValueError, "profile_cache"),
        ]
        for opts, kind, word in bad:
            with self.subTest(opts=opts):
                with self.assertRaises(kind) as e:
                    onnx2ait.compile(CONVNET, self.tmp / "out", build=False, **opts)
                self.assertIn(word, str(e.exception))
        self.assertFalse((self.tmp / "out").exists())

    def test_unknown_keyword_is_named(self):
        with self.assertRaises(TypeError) as e:
            onnx2ait.compile(CONVNET, self.tmp / "out", max_bach=8)
        self.assertIn("max_bach", str(e.exception))

    def test_memory_bound(self):
        # A size string like --max-memory; 1 KiB cannot hold the weights.
        with self.assertRaises(onnx2ait.Error) as e:
            onnx2ait.compile(CONVNET, self.tmp / "out", build=False, no_profile=True, max_memory="1KiB")
        self.assertIn("--max-memory (1.0 KiB)", str(e.exception))
        onnx2ait.compile(CONVNET, self.tmp / "out", build=False, no_profile=True, max_memory=8 << 30)

    def test_missing_and_broken_models(self):
        with self.assertRaises(FileNotFoundError) as e:
            onnx2ait.compile(self.tmp / "nosuch.onnx", self.tmp / "out")
        self.assertIn("nosuch.onnx", str(e.exception))
        junk = self.tmp / "junk.onnx"
        junk.write_bytes(b"not a model")
        with self.assertRaises(onnx2ait.Error) as e:
            onnx2ait.compile(junk, self.tmp / "out", build=False)
        self.assertIn("junk.onnx", str(e.exception))
        self.assertTrue(issubclass(onnx2ait.Error, RuntimeError))

    def test_foreign_folder_needs_force(self):
        out = self.tmp / "mine"
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        with self.assertRaises(onnx2ait.Error) as e:
            onnx2ait.compile(CONVNET, out, build=False, no_profile=True)
        self.assertIn("--force", str(e.exception))
        onnx2ait.compile(CONVNET, out, build=False, no_profile=True, force=True)
        self.assertEqual((out / "notes.txt").read_text(), "mine")
        self.assertTrue((out / "model.cu").is_file())


class Load(unittest.TestCase):
    def setUp(self):
        self.tmp = Path(tempfile.mkdtemp(prefix="onnx2ait-py-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_sources_only_output_is_refused(self):
        out = self.tmp / "out"
        onnx2ait.compile(CONVNET, out, build=False, no_profile=True)
        for f in (onnx2ait.load, onnx2ait.inspect):
            with self.subTest(f=f.__name__):
                with self.assertRaises(onnx2ait.Error) as e:
                    f(out)
                self.assertIn("libmodel.so", str(e.exception))
                self.assertIn("no-build", str(e.exception))

    def test_missing_folder(self):
        with self.assertRaises(FileNotFoundError) as e:
            onnx2ait.load(self.tmp / "nosuch")
        self.assertIn("nosuch", str(e.exception))

    def test_library_interface_without_gpu(self):
        """A tiny model built with nvcc: its interface reads without a GPU; loading it needs one."""
        model = tiny_model(self.tmp / "tiny.onnx")
        b = compile_or_skip(self, model, self.tmp / "out", no_profile=True, max_batch=16, jobs=2)
        self.assertEqual(b.library, self.tmp / "out" / "libmodel.so")
        self.assertTrue(b.library.is_file())
        info = onnx2ait.inspect(b.out)
        self.assertEqual(info.max_batch, 16)
        self.assertEqual(info.batch_symbol, "N")
        self.assertEqual(info.dims, (("N", 1, 16),))
        self.assertEqual(info.inputs, (IOSpec("x", "float32", ("N", 4)), IOSpec("h", "float16", ("N", 2, 3))))
        self.assertEqual(info.outputs, (IOSpec("y", "float32", ("N", 4)), IOSpec("z", "float16", ("N", 2, 3))))
        self.assertTrue(info.kernels)
        if not HAS_GPU:
            with self.assertRaises(onnx2ait.Error) as e:
                onnx2ait.load(b.out)
            self.assertIn("no CUDA device", str(e.exception))


class Inputs(unittest.TestCase):
    """How call arguments become the arrays the library takes (no model needed)."""

    F32 = IOSpec("x", "float32", ("N", 4))

    def test_exact_conversions_only(self):
        a = np.arange(8, dtype=np.float16).reshape(2, 4)
        got = _host_array(self.F32, a)
        self.assertEqual(got.dtype, np.float32)
        np.testing.assert_array_equal(got, a.astype(np.float32))
        with self.assertRaises(TypeError) as e:
            _host_array(self.F32, np.zeros((2, 4), np.float64))
        self.assertIn("float64", str(e.exception))
        self.assertIn("'x'", str(e.exception))
        # Lists take the input's dtype; non-contiguous arrays are made contiguous.
        self.assertEqual(_host_array(self.F32, [[1.5, 2, 3, 4]]).dtype, np.float32)
        strided = np.zeros((4, 8), np.float32)[:, ::2]
        self.assertTrue(_host_array(self.F32, strided).flags.c_contiguous)
        self.assertEqual(_host_array(IOSpec("i", "int64", (3,)), np.arange(3, dtype=np.int32)).dtype, np.int64)

    def test_gpu_tensors_are_refused_not_copied(self):
        class CudaTensor:
            def __dlpack__(self, stream=None):
                raise AssertionError("must not be exported")

            def __dlpack_device__(self):
                return (2, 1)  # kDLCUDA, device 1

        with self.assertRaises(NotImplementedError) as e:
            _host_array(self.F32, CudaTensor())
        self.assertIn("cuda:1", str(e.exception))
        self.assertIn("not implemented", str(e.exception))

        class CupyLike:
            __cuda_array_interface__ = {"shape": (2, 4), "typestr": "<f4", "data": (0, False), "version": 3}

        with self.assertRaises(NotImplementedError):
            _host_array(self.F32, CupyLike())

    def test_host_dlpack_tensors_are_taken(self):
        class HostTensor:
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, **kw):
                return self.a.__dlpack__(**kw)

            def __dlpack_device__(self):
                return self.a.__dlpack_device__()

        a = np.ones((2, 4), np.float32)
        np.testing.assert_array_equal(_host_array(self.F32, HostTensor(a)), a)

    def test_symbolic_shapes(self):
        self.assertEqual(_spec(("x", "float32", ["N", 3])).shape, ("N", 3))
        self.assertEqual(_spec(("x", "float32", ["4*N", "seq"])).shape, ("4*N", "seq"))


@unittest.skipUnless(HAS_GPU, NO_GPU)
class Run(unittest.TestCase):
    """Runs a built model on the GPU and compares with ONNX Runtime."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = Path(tempfile.mkdtemp(prefix="onnx2ait-py-"))
        cls.model = tiny_model(cls.tmp / "tiny.onnx")
        onnx2ait.compile(cls.model, cls.tmp / "out", no_profile=True, max_batch=16)
        cls.m = onnx2ait.load(cls.tmp / "out")

    @classmethod
    def tearDownClass(cls):
        del cls.m
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_matches_onnxruntime(self):
        import onnxruntime as ort

        sess = ort.InferenceSession(str(self.model), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        for batch in (1, 5, 16):
            x = rng.standard_normal((batch, 4)).astype(np.float32)
            h = rng.standard_normal((batch, 2, 3)).astype(np.float16)
            want = sess.run(None, {"x": x, "h": h})
            got = self.m(x, h=h)
            self.assertEqual(len(got), 2)
            for g, w in zip(got, want):
                self.assertEqual(g.dtype, w.dtype)
                self.assertEqual(g.shape, w.shape)
                np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=1e-3, atol=1e-3)
            self.assertEqual(set(self.m.run_dict(x=x, h=h)), {"y", "z"})

    def test_call_errors(self):
        x = np.zeros((2, 4), np.float32)
        with self.assertRaises(TypeError):
            self.m(x)  # h missing
        with self.assertRaises(TypeError):
            self.m(x, np.zeros((2, 2, 3), np.float16), nosuch=x)
        with self.assertRaises(ValueError) as e:
            self.m(np.zeros((17, 4), np.float32), np.zeros((17, 2, 3), np.float16))
        self.assertIn("1 to 16", str(e.exception))
        self.assertEqual(self.m.input_shape("h", 7), (7, 2, 3))
        self.assertIn("tiny", repr(self.m))


if __name__ == "__main__":
    unittest.main()
