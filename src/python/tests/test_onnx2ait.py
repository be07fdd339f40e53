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
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

import onnx2ait
from onnx2ait import (_bind_outputs, _check_device_tensor, _device_input, _dlpack_import, _host_array, _host_output,
                      _refuse_overlaps, _spec, _stream_handle, _weights_bytes, IOSpec)

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
    # IR version 8 (opset 17's): a newer onnx stamps its own IR version, which an older ONNX
    # Runtime (the GPU machine's 1.30 with onnx writing IR 14) refuses to load.
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8), str(path))
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

    def test_symbol_prefix(self):
        """symbol_prefix names the C API of the sources (model.h, exports.map, build.json)."""
        onnx2ait.compile(CONVNET, self.tmp / "out", build=False, symbol_prefix="convnet")
        header = (self.tmp / "out" / "model.h").read_text()
        self.assertIn("int convnet_o2a_create(const char* out_dir, convnet_o2a_model** out);", header)
        self.assertIn("#define CONVNET_O2A_BUILD_HASH", header)
        self.assertIn("convnet_o2a_*;", (self.tmp / "out" / "exports.map").read_text())

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
            ({"symbol_prefix": "Bad-Name"}, ValueError, "symbol_prefix 'Bad-Name'"),
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

    @classmethod
    def tearDownClass(cls):
        if getattr(cls, "tiny_dir", None) is not None:
            shutil.rmtree(cls.tiny_dir, ignore_errors=True)

    def tiny(self):
        """The tiny model built with nvcc once for the class (its tests only read it)."""
        cls = type(self)
        if getattr(cls, "tiny_build", None) is None:
            cls.tiny_dir = Path(tempfile.mkdtemp(prefix="onnx2ait-py-tiny-"))
            model = tiny_model(cls.tiny_dir / "tiny.onnx")
            cls.tiny_build = compile_or_skip(self, model, cls.tiny_dir / "out", no_profile=True, max_batch=16, jobs=2)
        return cls.tiny_build

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
        b = self.tiny()
        self.assertEqual(b.library, b.out / "libmodel.so")
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

    def test_weights_from_memory_are_checked_before_the_gpu(self):
        """load(out, weights=...) hands the buffer to o2a_create_from_memory, which checks its size
        and build hash before touching the GPU: a wrong buffer is named as such on any machine."""
        b = self.tiny()
        good = (b.out / "weights.bin").read_bytes()
        with self.assertRaises(onnx2ait.Error) as e:
            onnx2ait.load(b.out, weights=good[:10])
        self.assertIn("cannot create the model from the weights in memory", str(e.exception))
        self.assertIn(f"the weights buffer has 10 bytes but the model expects {len(good)}", str(e.exception))
        with self.assertRaises(onnx2ait.Error) as e:
            onnx2ait.load(b.out, weights=b"")
        self.assertIn("the weights buffer has 0 bytes", str(e.exception))
        other = bytearray(good)
        other[-2] ^= 1  # the last character of the build hash
        with self.assertRaises(onnx2ait.Error) as e:
            onnx2ait.load(b.out, weights=other)
        self.assertIn("the weights buffer belongs to another build", str(e.exception))
        self.assertIn(b.build_hash, str(e.exception))
        if not HAS_GPU:
            # The right bytes, in each form taken, get as far as the GPU.
            for w in (good, bytearray(good), memoryview(good), np.frombuffer(good, np.uint8)):
                with self.subTest(type=type(w).__name__):
                    with self.assertRaises(onnx2ait.Error) as e:
                        onnx2ait.load(b.out, weights=w)
                    self.assertIn("no CUDA device", str(e.exception))

    def test_weights_argument(self):
        """What load's weights= takes: any contiguous buffer of bytes, read in place."""
        data = bytearray(b"0123456789")
        view = _weights_bytes(data)
        self.assertEqual((view.dtype, view.shape), (np.uint8, (10,)))
        data[0] = 7
        self.assertEqual(view[0], 7)  # a view of the caller's buffer, not a copy
        self.assertEqual(_weights_bytes(b"").shape, (0,))
        arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
        self.assertTrue(np.shares_memory(_weights_bytes(arr), arr))
        self.assertEqual(_weights_bytes(np.zeros(4, np.int8)).dtype, np.uint8)
        self.assertEqual(_weights_bytes(memoryview(b"abcd")).tobytes(), b"abcd")
        bad = [
            ("weights.bin", TypeError, "got the path 'weights.bin'"),
            (self.tmp / "weights.bin", TypeError, "got the path"),
            (np.zeros(4, np.float32), TypeError, "a NumPy array of float32"),
            (memoryview(np.zeros(4, np.float32)), TypeError, "4-byte items"),
            (np.zeros(8, np.uint8)[::2], ValueError, "not C-contiguous"),
            (memoryview(b"abcdef")[::2], ValueError, "not contiguous"),
            (12, TypeError, "got int"),
            ([1, 2], TypeError, "got list"),
        ]
        for w, kind, part in bad:
            with self.subTest(w=repr(w)):
                with self.assertRaises(kind) as e:
                    onnx2ait.load(self.tmp, weights=w)
                self.assertIn(part, str(e.exception))


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

    def test_gpu_tensors_are_never_copied_to_the_host(self):
        """A GPU tensor runs on the device (Module._run) and never reaches the host conversion."""
        class CudaTensor:
            def __dlpack__(self, stream=None):
                raise AssertionError("must not be exported")

            def __dlpack_device__(self):
                return (2, 1)  # kDLCUDA, device 1

        with self.assertRaises(TypeError) as e:
            _host_array(self.F32, CudaTensor())
        self.assertIn("cuda:1", str(e.exception))

        class CupyLike:
            __cuda_array_interface__ = {"shape": (2, 4), "typestr": "<f4", "data": (0, False), "version": 3}

        with self.assertRaises(TypeError):
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


class Outputs(unittest.TestCase):
    """Preallocated outputs (`out=`), as far as a machine without a GPU can check: how they are
    bound to the outputs and the refusals that come before any call of the library."""

    Y = IOSpec("y", "float32", ("N", 4))
    Z = IOSpec("z", "float16", ("N", 2, 3))

    def test_binding(self):
        y, z = np.zeros((2, 4), np.float32), np.zeros((2, 2, 3), np.float16)
        for out in ([y, z], (y, z), {"z": z, "y": y}):
            with self.subTest(out=type(out).__name__):
                got = _bind_outputs([self.Y, self.Z], out)
                self.assertTrue(got[0] is y and got[1] is z)
        self.assertIs(_bind_outputs([self.Y], y)[0], y)  # one output: the array itself
        bad = [
            ([y], "1 array(s) given, the model has 2 outputs (y, z)"),
            ({"y": y}, "no array for output(s) z"),
            ({"y": y, "z": z, "w": y}, "no output 'w'"),
            (y, "one array given, the model has 2 outputs"),
            ("y", "got str"),
            (3, "got int"),
        ]
        for out, part in bad:
            with self.subTest(out=repr(out)[:30]):
                with self.assertRaises(TypeError) as e:
                    _bind_outputs([self.Y, self.Z], out)
                self.assertIn(part, str(e.exception))

    def test_host_outputs_are_used_as_they_are(self):
        y = np.zeros((2, 4), np.float32)
        self.assertIs(_host_output(self.Y, y), y)  # written in place: no conversion, no copy
        ro = np.zeros((2, 4), np.float32)
        ro.flags.writeable = False
        bad = [
            (np.zeros((2, 4), np.float64), TypeError, "'y' (out=) is float64, the model writes float32"),
            (np.zeros((2, 4), np.float16), TypeError, "outputs are not converted"),
            (np.zeros((2, 5), np.float32), ValueError, "has shape (2, 5), the model writes [N, 4]"),
            (np.zeros((2, 4, 1), np.float32), ValueError, "has shape (2, 4, 1)"),
            (ro, ValueError, "read-only"),
            (np.zeros((2, 8), np.float32)[:, ::2], ValueError, "not C-contiguous"),
            (np.zeros((4, 2), np.float32).T, ValueError, "not C-contiguous"),
            ([[0.0] * 4] * 2, TypeError, "expected a numpy.ndarray, got list"),
            (FakeCuda(np.zeros((2, 4), np.float32)), TypeError, "is a GPU tensor but the inputs are host arrays"),
        ]
        for x, kind, part in bad:
            with self.subTest(part=part):
                with self.assertRaises(kind) as e:
                    _host_output(self.Y, x)
                self.assertIn(part, str(e.exception))
        import ml_dtypes

        b = np.zeros((2, 4), ml_dtypes.bfloat16)
        bits = _host_output(IOSpec("b", "bfloat16", ("N", 4)), b)
        self.assertEqual(bits.dtype, np.uint16)  # the native side takes bfloat16 as its bits
        self.assertTrue(np.shares_memory(bits, b))

    def test_host_outputs_must_not_share_memory(self):
        buf = np.zeros(16, np.float32)
        a, b = buf[:8].reshape(2, 4), buf[4:12].reshape(2, 4)
        with self.assertRaises(ValueError) as e:
            _refuse_overlaps([(self.Y, a), (IOSpec("w", "float32", ("N", 4)), b)])
        self.assertIn("outputs 'y' and 'w' (out=) share memory", str(e.exception))
        _refuse_overlaps([(self.Y, buf[:8].reshape(2, 4)), (self.Y, buf[8:].reshape(2, 4))])

    def test_device_outputs_are_checked(self):
        """A preallocated GPU output gets the checks of a GPU input, and must be writable."""
        ok = _dlpack_import(np.zeros((2, 4), np.float32).__dlpack__())
        _check_device_tensor(self.Y, ok, "output")
        ro = np.zeros((2, 4), np.float32)
        ro.flags.writeable = False
        cases = [
            (np.zeros((2, 4), np.float64), {}, TypeError, "output 'y' is float64, the model writes float32"),
            (np.zeros((2, 5), np.float32), {}, ValueError, "output 'y' has shape (2, 5), the model writes [N, 4]"),
            (np.zeros((2, 8), np.float32)[:, ::2], {}, ValueError, "output 'y' is not contiguous"),
            (ro, {"max_version": (1, 0)}, ValueError, "output 'y' is read-only"),
        ]
        for a, kw, kind, part in cases:
            with self.subTest(part=part):
                with self.assertRaises(kind) as e:
                    _check_device_tensor(self.Y, _dlpack_import(a.__dlpack__(**kw)), "output")
                self.assertIn(part, str(e.exception))
        other = FakeCuda(np.zeros((2, 4), np.float32), index=1)
        with self.assertRaises(ValueError) as e:
            _device_input(self.Y, other, 0, 0, "output")
        self.assertIn("output 'y' is on cuda:1, the model on cuda:0", str(e.exception))
        self.assertEqual(other.calls, [])

    def test_refused_before_the_library_is_called(self):
        """Module's refusals of out= that need no model: a stand-in for the native model fails the
        test if anything reaches it."""
        class Unreachable:
            def __getattr__(self, name):
                raise AssertionError(f"the native model was reached ({name})")

        m = onnx2ait.Module.__new__(onnx2ait.Module)
        m._native = Unreachable()
        m.inputs, m.outputs = (IOSpec("x", "float32", ("N", 4)),), (self.Y, self.Z)
        x = np.zeros((2, 4), np.float32)
        y, z = np.zeros((2, 4), np.float32), np.zeros((2, 2, 3), np.float16)
        cases = [
            (lambda: m(x, out=[y]), TypeError, "1 array(s) given, the model has 2 outputs"),
            (lambda: m(x, out=[y, z.astype(np.float32)]), TypeError, "'z' (out=) is float32"),
            (lambda: m(x, out=[y, FakeCuda(z)]), TypeError, "'z' (out=) is a GPU tensor but the inputs are host"),
            (lambda: m.call([x], out=[y, y[:, :3].copy()]), TypeError, "'z' (out=) is float32"),
            (lambda: m(FakeCuda(x), out=[y, z]), TypeError, "'y' (out=) is a host array but the inputs are GPU"),
        ]
        for run, kind, part in cases:
            with self.subTest(part=part):
                with self.assertRaises(kind) as e:
                    run()
                self.assertIn(part, str(e.exception))
        # A model input named "out" keeps its name in calls: out= is then that input.
        m.inputs = (IOSpec("x", "float32", ("N", 4)), IOSpec("out", "float32", ("N", 4)))
        with self.assertRaises(TypeError) as e:
            m(x, out=x, nosuch=x)
        self.assertIn("no input 'nosuch'", str(e.exception))
        with self.assertRaises(AssertionError) as e:
            m(x, out=x)  # bound as the input "out": the run reaches the library
        self.assertIn("native model was reached (run)", str(e.exception))


class FakeCuda:
    """A DLPack producer that claims to live on cuda:`index` and exports a NumPy array's capsule
    (the host memory of a test): what the device path checks before and after exporting can be
    tried without a GPU. Records the keywords __dlpack__ was called with."""

    def __init__(self, a, index=0, versioned=True):
        self.a, self.index, self.versioned, self.calls = a, index, versioned, []

    def __dlpack__(self, stream=None, **kw):
        if not self.versioned and "max_version" in kw:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        self.calls.append(dict(stream=stream, **kw))
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (2, self.index)


class DLPack(unittest.TestCase):
    """GPU tensors through DLPack, as far as a machine without a GPU can check: capsule parsing,
    the checks of every input and the stream protocol's numbers."""

    F32 = IOSpec("x", "float32", ("N", 4))

    def test_capsules_are_parsed_and_released(self):
        import sys

        a = np.arange(12, dtype=np.float32).reshape(3, 4)
        refs = sys.getrefcount(a)
        for kw in ({}, {"max_version": (1, 0)}):
            cap = a.__dlpack__(**kw)
            t = _dlpack_import(cap)
            self.assertEqual(t.device, (1, 0))  # kDLCPU
            self.assertEqual((t.dtype, t.shape, t.contiguous), ("float32", [3, 4], True))
            self.assertEqual(t.data_ptr, a.ctypes.data)
            self.assertEqual(t.versioned, bool(kw))
            self.assertGreater(sys.getrefcount(a), refs)  # the capsule's manager holds the array
            with self.assertRaises(TypeError) as e:
                _dlpack_import(cap)  # consumed: a capsule is taken once
            self.assertIn("already consumed", str(e.exception))
            del t, cap
            self.assertEqual(sys.getrefcount(a), refs)  # the producer's deleter ran
        # A read-only array says so in a DLPack 1.x capsule.
        ro = np.zeros(3, np.int64)
        ro.flags.writeable = False
        self.assertTrue(_dlpack_import(ro.__dlpack__(max_version=(1, 0))).readonly)
        with self.assertRaises(TypeError) as e:
            _dlpack_import(object())
        self.assertIn("not a DLPack capsule", str(e.exception))

    def test_dtypes_shapes_and_strides_are_checked(self):
        ok = _dlpack_import(np.zeros((2, 4), np.float32).__dlpack__())
        _check_device_tensor(self.F32, ok)
        cases = [
            (np.zeros((2, 4), np.float64), TypeError, ["'x' is float64, the model takes float32", "not converted"]),
            (np.zeros((2, 5), np.float32), ValueError, ["shape (2, 5)", "[N, 4]"]),
            (np.zeros((2, 4, 1), np.float32), ValueError, ["rank 2"]),
            (np.zeros((2, 8), np.float32)[:, ::2], ValueError, ["not contiguous", "strides (8, 2)", "x.contiguous()"]),
            (np.zeros((4, 2), np.float32).T, ValueError, ["not contiguous"]),
        ]
        for a, kind, parts in cases:
            with self.assertRaises(kind, msg=str(parts)) as e:
                _check_device_tensor(self.F32, _dlpack_import(a.__dlpack__()))
            for p in parts:
                self.assertIn(p, str(e.exception))
        # A size-1 axis may have any stride (here 8 elements where a dense row has 4).
        single = np.zeros((2, 4), np.float32)[::2]
        self.assertEqual(single.strides, (32, 4))
        _check_device_tensor(IOSpec("c", "float32", (1, 4)), _dlpack_import(single.__dlpack__()))
        self.assertEqual(_dlpack_import(np.zeros(2, bool).__dlpack__()).dtype, "bool")

    def test_device_inputs_are_checked_before_and_after_export(self):
        a = np.zeros((2, 4), np.float32)
        other = FakeCuda(a, index=1)
        with self.assertRaises(ValueError) as e:
            _device_input(self.F32, other, 0, 0)
        self.assertIn("'x' is on cuda:1, the model on cuda:0", str(e.exception))
        self.assertEqual(other.calls, [])  # refused before exporting anything

        class Rocm(FakeCuda):
            def __dlpack_device__(self):
                return (10, 0)

        with self.assertRaises(TypeError) as e:
            _device_input(self.F32, Rocm(a), 0, 0)
        self.assertIn("rocm:0", str(e.exception))

        class NoDLPack:
            __cuda_array_interface__ = {}

        with self.assertRaises(TypeError) as e:
            _device_input(self.F32, NoDLPack(), 0, 0)
        self.assertIn("without the DLPack protocol", str(e.exception))

        # The producer is asked for DLPack 1.x on the run's stream: 1 for the legacy default
        # stream (handle 0), the handle itself otherwise; an older producer without max_version
        # is asked again without it. The capsule then turns out to hold host memory: refused.
        for versioned, handle, want in ((True, 0, 1), (False, 0x5555, 0x5555)):
            fake = FakeCuda(a, versioned=versioned)
            with self.assertRaises(ValueError) as e:
                _device_input(self.F32, fake, 0, handle)
            self.assertIn("its DLPack tensor is on cpu:0", str(e.exception))
            self.assertEqual(fake.calls, [dict(stream=want, max_version=(1, 0))] if versioned else [dict(stream=want)])

    def test_stream_handles(self):
        class TorchLike:
            cuda_stream = 0x1234

        class CupyLike:
            ptr = 0x42

        self.assertEqual(_stream_handle(7, 0), 7)
        self.assertEqual(_stream_handle(TorchLike(), 0), 0x1234)
        self.assertEqual(_stream_handle(CupyLike(), 0), 0x42)
        if "torch" not in sys.modules:
            self.assertEqual(_stream_handle(None, 0), 0)  # the legacy default stream
        for bad in (-1, True, "s", 1.5):
            with self.assertRaises(TypeError):
                _stream_handle(bad, 0)


class TinyBuild:
    """The GPU test classes' fixture: the tiny model compiled and loaded once per class."""

    @classmethod
    def build_tiny(cls, prefix):
        cls.tmp = Path(tempfile.mkdtemp(prefix=prefix))
        cls.model = tiny_model(cls.tmp / "tiny.onnx")
        onnx2ait.compile(cls.model, cls.tmp / "out", no_profile=True, max_batch=16)
        cls.m = onnx2ait.load(cls.tmp / "out")

    @classmethod
    def tearDownClass(cls):
        del cls.m
        shutil.rmtree(cls.tmp, ignore_errors=True)


@unittest.skipUnless(HAS_GPU, NO_GPU)
class Run(TinyBuild, unittest.TestCase):
    """Runs a built model on the GPU and compares with ONNX Runtime."""

    @classmethod
    def setUpClass(cls):
        cls.build_tiny("onnx2ait-py-")

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

    def test_preallocated_outputs(self):
        """out= writes the caller's arrays in place and returns them."""
        rng = np.random.default_rng(1)
        x = rng.standard_normal((5, 4)).astype(np.float32)
        h = rng.standard_normal((5, 2, 3)).astype(np.float16)
        want_y, want_z = self.m(x, h)
        y, z = np.full((5, 4), np.nan, np.float32), np.full((5, 2, 3), np.nan, np.float16)
        got = self.m(x, h, out=[y, z])
        self.assertTrue(got[0] is y and got[1] is z)
        np.testing.assert_array_equal(y, want_y)
        np.testing.assert_array_equal(z, want_z)
        y2, z2 = np.zeros_like(y), np.zeros_like(z)
        got = self.m.call({"x": x, "h": h}, out={"z": z2, "y": y2})
        self.assertTrue(got[0] is y2 and got[1] is z2)
        np.testing.assert_array_equal(z2, want_z)
        # An output may be an input's array: the inputs are on the GPU before an output is written.
        xc = x.copy()
        self.m(xc, h, out=[xc, z2])
        np.testing.assert_array_equal(xc, want_y)
        # The shapes at the run's dims are the library's check (batch 5 here).
        with self.assertRaises(ValueError) as e:
            self.m(x, h, out=[np.zeros((4, 4), np.float32), z])
        self.assertIn("output 'y' has shape [4, 4], the run at batch 5 takes [5, 4]", str(e.exception))
        ro = np.zeros((5, 4), np.float32)
        ro.flags.writeable = False
        with self.assertRaises(ValueError) as e:
            self.m(x, h, out=[ro, z])
        self.assertIn("read-only", str(e.exception))

    def test_weights_from_memory(self):
        """load(out, weights=...) runs as the weights file does, without that file."""
        good = (self.tmp / "out" / "weights.bin").read_bytes()
        x = np.arange(8, dtype=np.float32).reshape(2, 4) - 3
        h = np.ones((2, 2, 3), np.float16)
        want = self.m(x, h)
        moved = self.tmp / "weights.moved"
        (self.tmp / "out" / "weights.bin").rename(moved)
        try:
            for w in (good, np.fromfile(moved, np.uint8)):
                m = onnx2ait.load(self.tmp / "out", weights=w)
                for g, e in zip(m(x, h), want):
                    np.testing.assert_array_equal(g, e)
                del m
            with self.assertRaises(onnx2ait.Error) as e:
                onnx2ait.load(self.tmp / "out", weights=good[:-1])
            self.assertIn("the weights buffer has", str(e.exception))
        finally:
            moved.rename(self.tmp / "out" / "weights.bin")

    def test_call_errors(self):
        x = np.zeros((2, 4), np.float32)
        with self.assertRaises(TypeError):
            self.m(x)  # h missing
        with self.assertRaises(TypeError):
            self.m(x, np.zeros((2, 2, 3), np.float16), nosuch=x)
        with self.assertRaises(ValueError) as e:
            self.m(np.zeros((17, 4), np.float32), np.zeros((17, 2, 3), np.float16))
        self.assertIn("1..16", str(e.exception))  # the compiled range, as infer_dims states it
        self.assertEqual(self.m.input_shape("h", 7), (7, 2, 3))
        self.assertIn("tiny", repr(self.m))


class RunTorch(TinyBuild, unittest.TestCase):
    """PyTorch CUDA tensors in and out through DLPack (no host copy), on the default and on a
    side stream; the refusals. Needs a GPU and PyTorch with CUDA: skipped, saying which is
    missing, otherwise (ONNX2AIT_REQUIRE_GPU=1 makes a missing torch a failure too)."""

    @classmethod
    def setUpClass(cls):
        if not HAS_GPU:
            raise unittest.SkipTest(NO_GPU)
        try:
            import torch
        except ImportError:
            if os.environ.get("ONNX2AIT_REQUIRE_GPU"):
                raise
            raise unittest.SkipTest("PyTorch is not installed: the DLPack tests with torch tensors are skipped")
        if not torch.cuda.is_available():
            raise unittest.SkipTest("PyTorch has no CUDA here: the DLPack tests with torch tensors are skipped")
        cls.torch = torch
        cls.build_tiny("onnx2ait-py-torch-")

    def inputs(self, batch, seed=0):
        g = self.torch.Generator(device="cuda").manual_seed(seed)
        x = self.torch.randn(batch, 4, device="cuda", generator=g)
        h = self.torch.randn(batch, 2, 3, device="cuda", generator=g).half()
        return x, h

    def test_torch_tensors_in_and_out(self):
        torch = self.torch
        for batch in (1, 5, 16):
            x, h = self.inputs(batch, batch)
            y, z = self.m(x, h=h)
            self.assertIsInstance(y, torch.Tensor)
            self.assertEqual((y.device.type, y.dtype, tuple(y.shape)), ("cuda", torch.float32, (batch, 4)))
            self.assertEqual((z.dtype, tuple(z.shape)), (torch.float16, (batch, 2, 3)))
            torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(z, h * 2, rtol=1e-3, atol=1e-3)
            # The same numbers as the host path.
            hy, hz = self.m(x.cpu().numpy(), h.cpu().numpy())
            np.testing.assert_allclose(y.cpu().numpy(), hy, rtol=1e-6)
            np.testing.assert_array_equal(z.cpu().numpy(), hz)

    def test_side_stream(self):
        torch = self.torch
        x, h = self.inputs(8, 3)
        s = torch.cuda.Stream()
        # Inputs written on the current stream, the run on s: the producer's __dlpack__(stream=s)
        # makes s wait for them; torch.from_dlpack makes the current stream wait for the run.
        for _ in range(3):
            x.mul_(1.5)
            y, z = self.m.call({"x": x, "h": h}, stream=s)
            torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)
        with torch.cuda.stream(s):
            y, _ = self.m(x, h)  # the current stream (s) by default
        s.synchronize()
        torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)

    def test_device_tensors_for_any_consumer(self):
        torch = self.torch
        x, h = self.inputs(2)
        native = self.m._native
        outs = native.run_device([onnx2ait._dlpack_import(x.__dlpack__()), onnx2ait._dlpack_import(h.__dlpack__())], 0)
        self.assertIsInstance(outs[0], onnx2ait.DeviceTensor)
        self.assertEqual((outs[0].shape, outs[0].dtype, outs[0].device), ([2, 4], "float32", 0))
        self.assertEqual(outs[0].__dlpack_device__(), (2, 0))
        y = torch.from_dlpack(outs[0])
        self.assertEqual(y.data_ptr(), outs[0].data_ptr)  # no copy
        torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)
        with self.assertRaises(BufferError):
            outs[0].__dlpack__(copy=True)
        with self.assertRaises(BufferError):
            outs[0].__dlpack__(dl_device=(1, 0))
        del outs
        torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)  # y keeps its memory

    def test_preallocated_outputs(self):
        """out= with torch tensors: the kernels write them in place, the same objects come back,
        on the current stream and on a side stream."""
        torch = self.torch
        x, h = self.inputs(6, 7)
        y = torch.full((6, 4), float("nan"), device="cuda")
        z = torch.full((6, 2, 3), float("nan"), device="cuda", dtype=torch.float16)
        ptrs = (y.data_ptr(), z.data_ptr())
        got = self.m(x, h, out=[y, z])
        self.assertTrue(got[0] is y and got[1] is z)
        self.assertEqual((y.data_ptr(), z.data_ptr()), ptrs)  # written in place
        torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(z, h * 2, rtol=1e-3, atol=1e-3)
        # On a side stream: the current stream waits for the run before reading the outputs.
        s = torch.cuda.Stream()
        for i in range(3):
            x.mul_(1.5)
            y.zero_()
            self.m.call({"x": x, "h": h}, stream=s, out={"y": y, "z": z})
            torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)
        # A temporary input freed after the call is not reused before the run is done.
        for i in range(3):
            self.m.call([x.clone(), h.clone()], stream=s, out=[y, z])
            torch.testing.assert_close(y, torch.relu(x) + x, rtol=1e-3, atol=1e-3)

    def test_preallocated_output_refusals(self):
        torch = self.torch
        x, h = self.inputs(4)
        y = torch.empty(4, 4, device="cuda")
        z = torch.empty(4, 2, 3, device="cuda", dtype=torch.float16)
        cases = [
            ([y.double(), z], TypeError, "output 'y' is float64, the model writes float32"),
            ([torch.empty(4, 8, device="cuda")[:, ::2], z], ValueError, "output 'y' is not contiguous"),
            ([y.cpu(), z], TypeError, "output 'y' (out=) is a host array but the inputs are GPU tensors"),
            ([torch.empty(5, 4, device="cuda"), z], ValueError, "output 'y' has shape [5, 4], the run at batch 4 writes [4, 4]"),
            ([x, z], ValueError, "output 'y' overlaps input 'x' in memory"),
            ([y], TypeError, "1 array(s) given, the model has 2 outputs"),
        ]
        big = torch.empty(64, device="cuda")
        cases.append(([big[:16].view(4, 4), big.view(torch.float16)[8:32].view(4, 2, 3)], ValueError,
                      "output 'z' overlaps output 'y' in memory"))
        for out, kind, part in cases:
            with self.subTest(part=part):
                with self.assertRaises(kind) as e:
                    self.m(x, h, out=out)
                self.assertIn(part, str(e.exception))

    def test_refusals(self):
        torch = self.torch
        x, h = self.inputs(4)
        with self.assertRaises(TypeError) as e:
            self.m(x.double(), h)
        self.assertIn("'x' is float64, the model takes float32", str(e.exception))
        with self.assertRaises(ValueError) as e:
            self.m(torch.zeros(4, 8, device="cuda")[:, ::2], h)
        self.assertIn("not contiguous", str(e.exception))
        with self.assertRaises(TypeError) as e:
            self.m(x, h.cpu())
        self.assertIn("input(s) h are host arrays and x GPU tensors", str(e.exception))
        with self.assertRaises(ValueError) as e:
            self.m(torch.zeros(17, 4, device="cuda"), torch.zeros(17, 2, 3, device="cuda").half())
        self.assertIn("1..16", str(e.exception))  # the compiled range, as infer_dims states it
        with self.assertRaises(TypeError):
            self.m.call([x.cpu().numpy(), h.cpu().numpy()], stream=0)


if __name__ == "__main__":
    unittest.main()
