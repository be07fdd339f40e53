"""onnx2ait: compile ONNX models into self-contained CUDA inference libraries, and run them on
NumPy arrays.

    import numpy as np
    import onnx2ait

    build = onnx2ait.compile("resnet50.onnx", "out", max_batch=32)   # sources + out/libmodel.so
    print(build.summary)
    model = onnx2ait.load("out")                                     # needs a CUDA GPU
    x = np.random.rand(8, 3, 224, 224).astype(np.float32)            # batch 8, from the shape
    (logits,) = model(x)

`compile` is `onnx2ait MODEL -o OUT` (the same options, as keywords); `load` opens OUT/libmodel.so
through its C API and instantiates the model on the current GPU. Failures raise
`onnx2ait.Error` (a RuntimeError) with the library's message; bad options raise ValueError or
TypeError.

GPU tensors go in and come out through DLPack, without a host copy:

    import torch
    x = torch.randn(8, 3, 224, 224, device="cuda")
    (logits,) = model(x)                      # a torch tensor on the same GPU
    (logits,) = model.call([x], stream=s)     # on the stream s (torch.cuda.Stream or a handle)

Any object with `__dlpack__`/`__dlpack_device__` on the model's GPU (kDLCUDA) is taken, dense
(row-major) and of the input's exact dtype; outputs are torch tensors when PyTorch is imported
and an input is a torch tensor, else `DeviceTensor`s for any DLPack consumer
(`cupy.from_dlpack`, `jax.dlpack.from_dlpack`, ...). The run is asynchronous on its stream:
PyTorch's current stream of the model's device when torch is imported, else the legacy default
stream. Not implemented yet: loading weights from memory.
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._onnx2ait import DEFAULT_MAX_BATCH, VERSION, DeviceTensor, Error
from ._onnx2ait import NativeModel as _NativeModel
from ._onnx2ait import dlpack_import as _dlpack_import
from ._onnx2ait import compile as _compile
from ._onnx2ait import describe as _describe

__all__ = ["compile", "load", "inspect", "Build", "Module", "LibraryInfo", "IOSpec", "DeviceTensor", "Error",
           "DEFAULT_MAX_BATCH"]
__version__ = VERSION

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Build:
    """What `compile` made (onnx2ait::compile::Build)."""

    out: Path
    """The output folder."""
    library: Optional[Path]
    """OUT/libmodel.so; None with build=False."""
    build_hash: str
    """Content hash of the render, as the library's o2a_build_hash() returns it."""
    summary: str
    """OUT/summary.txt: the model, the optimisation, the kernels and where their choice came from."""
    kernels: Dict[str, int]
    """Kernel-level nodes by kind after optimisation."""
    profile_summary: Optional[str] = None
    """The profiler's report, when profile=True ran it."""
    warnings: List[str] = field(default_factory=list)
    """The model's import warnings (also issued as Python warnings)."""


def compile(
    model_path: PathLike,
    out_dir: PathLike,
    *,
    arch: str = "sm_90a",
    max_batch: int = DEFAULT_MAX_BATCH,
    max_memory: Union[int, str, None] = None,
    dims: Optional[Mapping[str, Union[int, Tuple[int, int]]]] = None,
    precision: str = "fp16",
    attention: str = "auto",
    squeeze_excite: str = "unfused",
    profile: bool = False,
    profile_cache: Optional[PathLike] = None,
    no_profile: bool = False,
    profile_gpu: Optional[str] = None,
    reuse_within: float = 1.0,
    jobs: Optional[int] = None,
    cache_dir: Optional[PathLike] = None,
    build: bool = True,
    force: bool = False,
    progress: bool = False,
    symbol_prefix: Optional[str] = None,
) -> Build:
    """Compiles an ONNX model into `out_dir` and builds `out_dir/libmodel.so`, as
    `onnx2ait MODEL -o OUT` with the same options:

    arch           sm_80, sm_90 or sm_90a (--arch)
    max_batch      largest run-time batch; sizes the activation arena (--max-batch)
    max_memory     GPU memory the library may take, bytes or a size such as "40GiB" (--max-memory)
    dims           values of symbolic dims fixed at compile time, e.g. {"seq": 128} (--dim seq=128),
                   or (min, max) ranges of dims chosen at each run, e.g. {"seq": (1, 512)}
                   (--dim seq=1..512)
    precision      "fp16" or "fp32" storage of float values on the GPU (--precision)
    attention      "auto" (default: fused on CUDA), "fused" or "unfused" attention kernels (--attention)
    squeeze_excite "unfused" (default) or "fused" squeeze-and-excitation scales (--squeeze-excite)
    profile        profile the kernels on this machine's GPU first (--profile)
    profile_cache  the profile cache file to read (and write with profile=True) (--profile-cache)
    no_profile     ignore profile caches: the heuristic chooses (--no-profile)
    profile_gpu    the GPU whose times to use when the cache has several (--profile-gpu)
    reuse_within   percent slower an instance may be to serve several problems (--reuse-within)
    jobs           parallel nvcc jobs (default: one per core) (--jobs)
    cache_dir      object cache shared between builds (default $ONNX2AIT_CACHE_DIR, else OUT/obj)
    build          False writes the sources only (--no-build)
    force          write into a non-empty folder onnx2ait did not write (--force)
    progress       print profiling and nvcc progress on stderr
    symbol_prefix  prefix of the library's C API names, e.g. "resnet" gives resnet_o2a_create and
                   RESNET_O2A_BUILD_HASH (--symbol-prefix); None keeps o2a_*. `load` finds them
                   either way; the prefix is for C programs that link several models

    The GIL is released while it runs. Without nvcc (and build=True) OUT gets the sources and
    the error says what is missing.
    """
    if dims is not None and not isinstance(dims, Mapping):
        raise TypeError(f"dims: expected a mapping of dim names to values, e.g. {{'seq': 128}}, got {dims!r}")
    done = _compile(
        model_path,
        out_dir,
        arch=arch,
        max_batch=_int("max_batch", max_batch),
        max_memory=max_memory,
        dims=dict(dims) if dims is not None else None,
        precision=precision,
        attention=attention,
        squeeze_excite=squeeze_excite,
        profile=bool(profile),
        profile_cache=profile_cache,
        no_profile=bool(no_profile),
        profile_gpu=profile_gpu,
        reuse_within=float(reuse_within),
        jobs=None if jobs is None else _int("jobs", jobs),
        cache_dir=cache_dir,
        build=bool(build),
        force=bool(force),
        progress=bool(progress),
        symbol_prefix=symbol_prefix,
    )
    for w in done["warnings"]:
        warnings.warn(f"{model_path}: {w}", stacklevel=2)
    return Build(
        out=Path(done["out"]),
        library=Path(done["library"]) if done["library"] is not None else None,
        build_hash=done["build_hash"],
        summary=done["summary"],
        kernels=dict(done["kernels"]),
        profile_summary=done["profile_summary"],
        warnings=list(done["warnings"]),
    )


def _int(name: str, v: Any) -> int:
    # bool is an int in Python; max_batch=True is a mistake, not batch 1.
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name}: expected a whole number, got {v!r}")
    return int(v)


@dataclass(frozen=True)
class IOSpec:
    """A model input or output as the library describes it."""

    name: str
    dtype: str
    """NumPy's name of the element type ("float16", "int64", "bfloat16" with ml_dtypes)."""
    shape: Tuple[Union[int, str], ...]
    """Dims are ints, a run-time dim its ONNX name ("N", "seq"), a multiple of one "k*N", and
    "?" a dim that follows several (`input_shape` gives it at given dims); with fixed shapes
    every dim is an int."""


@dataclass(frozen=True)
class LibraryInfo:
    """What a built library says about its model (`inspect`); needs no GPU."""

    out: Path
    model_name: str
    max_batch: int
    """The largest batch the model runs (1 for fixed shapes)."""
    batch_symbol: Optional[str]
    """The ONNX name of the batch dim, when the model has one."""
    dims: Tuple[Tuple[str, int, int], ...]
    """The run-time dims (the batch among them) as (name, min, max): what a call may vary."""
    inputs: Tuple[IOSpec, ...]
    outputs: Tuple[IOSpec, ...]
    kernels: Tuple[Tuple[str, str], ...]
    """(kernel name, graph node(s)) in launch order."""


def _info(out: Path, d: Tuple[Any, ...]) -> LibraryInfo:
    name, max_batch, symbol, dims, inputs, outputs, kernels = d
    return LibraryInfo(out, name, max_batch, symbol, tuple(tuple(x) for x in dims),
                       tuple(_spec(r) for r in inputs), tuple(_spec(r) for r in outputs),
                       tuple(tuple(k) for k in kernels))


# DLPack device types (dlpack.h DLDeviceType), for messages.
_DLPACK_DEVICES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi", 10: "rocm",
                   11: "rocm_host", 13: "cuda_managed", 14: "oneapi"}


class Module:
    """A compiled model instantiated on the GPU (`load`). Call it on NumPy arrays, one per input
    (positionally in input order, or by name); the batch and any other run-time dims come from
    their shapes. Returns the
    outputs as a list of NumPy arrays in output order (`run_dict` returns a dict by name).

    Arrays of another dtype are converted when that is exact (int32 to int64, float16 to
    float32); otherwise it is a TypeError (convert them yourself if the rounding is acceptable).
    Lists and scalars are converted to the input's dtype.

    Called on GPU tensors (DLPack, every input on the model's GPU), it runs on their memory and
    returns GPU tensors (torch tensors for torch inputs, else `DeviceTensor`s), asynchronously on
    PyTorch's current stream (torch imported) or the legacy default stream; `call` takes another
    stream. GPU tensors must have the input's exact dtype and be dense; they are not converted.
    Each output is new device memory that keeps the run's inputs alive until it is freed.
    """

    def __init__(self, out_dir: PathLike):
        self.out = Path(out_dir)
        self._native = _NativeModel(self.out)
        self.device_name, description = self._native.describe()
        info = _info(self.out, description)
        self.model_name = info.model_name
        self.max_batch = info.max_batch
        self.batch_symbol = info.batch_symbol
        self.dims = info.dims
        self.inputs = info.inputs
        self.outputs = info.outputs
        self.kernels = info.kernels

    def __repr__(self) -> str:
        def io(specs: Sequence[IOSpec]) -> str:
            return ", ".join(f"{s.name}: {s.dtype}{list(s.shape)}" for s in specs)

        return (f"<onnx2ait.Module {self.model_name!r} from {str(self.out)!r} on {self.device_name}: "
                f"({io(self.inputs)}) -> ({io(self.outputs)}), max_batch {self.max_batch}>")

    def input_shape(self, input: Union[int, str], batch: int = 1, **dims: int) -> Tuple[int, ...]:
        """The shape input `input` (index or name) takes at `batch` and the other run-time dims
        given by name (`seq=77`; the ones not given at their largest)."""
        return tuple(self._native.shape(False, self._index(self.inputs, input, "input"), batch, dims))

    def output_shape(self, output: Union[int, str], batch: int = 1, **dims: int) -> Tuple[int, ...]:
        """The shape output `output` (index or name) has at `batch` and the other run-time dims
        given by name."""
        return tuple(self._native.shape(True, self._index(self.outputs, output, "output"), batch, dims))

    def __call__(self, *arrays: Any, **named: Any) -> List[Any]:
        return self._run(self._bind(arrays, named), None)

    def call(self, inputs: Union[Sequence[Any], Mapping[str, Any]], *, stream: Any = None) -> List[Any]:
        """Runs the model on `inputs` (a sequence in input order, or a mapping by name), GPU
        tensors on `stream`: a CUDA stream handle (int; 0 is the default stream) or an object
        with one (torch.cuda.Stream's `cuda_stream`, cupy's `ptr`). The inputs' producers are
        asked (`__dlpack__(stream=...)`) to order their pending work before the run, and outputs
        handed to a consumer are ordered after it on the consumer's stream. `stream` is for GPU
        inputs only."""
        if isinstance(inputs, Mapping):
            bound = self._bind((), dict(inputs))
        elif isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise TypeError(f"inputs: expected a sequence or a mapping of the model's inputs, got {type(inputs).__name__}")
        else:
            bound = self._bind(tuple(inputs), {})
        return self._run(bound, stream)

    def _run(self, bound: List[Any], stream: Any) -> List[Any]:
        on_gpu = [_on_device(x) for x in bound]
        if not any(on_gpu):
            if stream is not None:
                raise TypeError("stream= orders GPU work; the inputs are host arrays (their run is synchronous)")
            if any(s.dtype == "bfloat16" for s in self.outputs):
                _bfloat16()  # before running: the outputs could not be returned as bfloat16
            ins = [_host_array(spec, x) for spec, x in zip(self.inputs, bound)]
            outs = self._native.run(ins)
            return [o.view(_bfloat16()) if s.dtype == "bfloat16" else o for s, o in zip(self.outputs, outs)]
        if not all(on_gpu):
            host = [s.name for s, g in zip(self.inputs, on_gpu) if not g]
            gpu = [s.name for s, g in zip(self.inputs, on_gpu) if g]
            raise TypeError(f"input(s) {', '.join(host)} are host arrays and {', '.join(gpu)} GPU tensors: pass every "
                            "input on the GPU (one run on the device, no copy) or every input on the host")
        device = self._native.device()
        handle = _stream_handle(stream, device)
        imported = [_device_input(spec, x, device, handle) for spec, x in zip(self.inputs, bound)]
        outs = self._native.run_device(imported, handle)
        torch = sys.modules.get("torch")
        if torch is not None and any(isinstance(x, torch.Tensor) for x in bound):
            # Consumed on PyTorch's current stream, which waits for the run when it is another.
            return [torch.from_dlpack(o) for o in outs]
        return list(outs)

    def run_dict(self, *arrays: Any, **named: Any) -> Dict[str, np.ndarray]:
        """As calling the module, with the outputs by name."""
        return {s.name: o for s, o in zip(self.outputs, self(*arrays, **named))}

    @staticmethod
    def _index(specs: Sequence[IOSpec], key: Union[int, str], what: str) -> int:
        if isinstance(key, str):
            for i, s in enumerate(specs):
                if s.name == key:
                    return i
            raise KeyError(f"the model has no {what} {key!r} (its {what}s: {', '.join(s.name for s in specs)})")
        return int(key)

    def _bind(self, arrays: Tuple[Any, ...], named: Dict[str, Any]) -> List[Any]:
        names = [s.name for s in self.inputs]
        if len(arrays) > len(names):
            raise TypeError(f"{len(arrays)} inputs given, the model takes {len(names)} ({', '.join(names)})")
        bound: Dict[str, Any] = dict(zip(names, arrays))
        for k, v in named.items():
            if k not in names:
                raise TypeError(f"the model has no input {k!r} (its inputs: {', '.join(names)})")
            if k in bound:
                raise TypeError(f"input {k!r} is given twice (positionally and by name)")
            bound[k] = v
        missing = [n for n in names if n not in bound]
        if missing:
            raise TypeError(f"missing input(s): {', '.join(missing)} (the model takes {', '.join(names)})")
        return [bound[n] for n in names]

def _on_device(x: Any) -> bool:
    """Whether `x` is a tensor in GPU memory (DLPack device other than the CPU, or only the CUDA
    array interface)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return False
    if hasattr(x, "__dlpack_device__"):
        return int(x.__dlpack_device__()[0]) != _KDL_CPU
    return hasattr(x, "__cuda_array_interface__")


_KDL_CPU = 1
_KDL_CUDA = 2


def _host_array(spec: IOSpec, x: Any) -> np.ndarray:
    """`x` as the C-contiguous host array of `spec`'s dtype the native side takes."""
    # A GPU tensor never gets here from a call (it runs on the device); copying one to the host
    # behind the caller's back would hide a slow path, so it is refused.
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__dlpack_device__"):
            kind, index = x.__dlpack_device__()
            kind = int(kind)
            if kind != _KDL_CPU:
                raise TypeError(f"input {spec.name!r} is on the device {_device_name(kind, index)}, "
                                "not host memory")
            x = np.from_dlpack(x)
        elif hasattr(x, "__cuda_array_interface__"):
            raise TypeError(f"input {spec.name!r} is GPU memory (__cuda_array_interface__), not host memory")
    want = _bfloat16() if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
    if isinstance(x, np.ndarray) or isinstance(x, np.generic):
        a = np.asarray(x)
        if a.dtype != want:
            if not np.can_cast(a.dtype, want, casting="safe"):
                raise TypeError(
                    f"input {spec.name!r} is {a.dtype}, the model takes {spec.dtype}, and {a.dtype} does not "
                    f"convert to it exactly; convert it yourself (x.astype(np.{spec.dtype})) if that is intended")
            a = a.astype(want)
    else:
        a = np.asarray(x, dtype=want)
    a = np.ascontiguousarray(a)
    # The native side takes bfloat16 as its bits.
    return a.view(np.uint16) if spec.dtype == "bfloat16" else a


def _device_name(kind: int, index: int) -> str:
    return f"{_DLPACK_DEVICES.get(kind, f'DLPack device type {kind}')}:{index}"


def _stream_handle(stream: Any, device: int) -> int:
    """The CUDA stream handle a device run is enqueued on (see `Module.call`)."""
    if stream is None:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_stream(device).cuda_stream)
        return 0  # the legacy default stream
    for attr in ("cuda_stream", "ptr"):  # torch.cuda.Stream, cupy.cuda.Stream
        if not isinstance(stream, (int, np.integer)) and hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    if isinstance(stream, bool) or not isinstance(stream, (int, np.integer)) or int(stream) < 0:
        raise TypeError(f"stream: expected a CUDA stream handle (an int >= 0) or a stream object with .cuda_stream "
                        f"or .ptr (torch.cuda.Stream, cupy.cuda.Stream), got {stream!r}")
    return int(stream)


def _export(x: Any, dlpack_stream: int) -> Any:
    """`x.__dlpack__` for the consumer stream `dlpack_stream`, asking for DLPack 1.x and falling
    back to the keywords of producers that predate it."""
    try:
        return x.__dlpack__(stream=dlpack_stream, max_version=(1, 0))
    except TypeError:
        return x.__dlpack__(stream=dlpack_stream)


def _device_input(spec: IOSpec, x: Any, device: int, stream: int) -> Any:
    """Takes the GPU tensor `x` for input `spec` of a model on cuda:`device` whose run goes on
    `stream`: checks where it lives before exporting it, then what the capsule says."""
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"input {spec.name!r} is GPU memory without the DLPack protocol (__dlpack__, "
                        "__dlpack_device__): pass it through a library that has it (cupy >= 10, PyTorch, JAX)")
    kind, index = x.__dlpack_device__()
    kind, index = int(kind), int(index)
    if kind != _KDL_CUDA:
        raise TypeError(f"input {spec.name!r} is on the device {_device_name(kind, index)}; the model runs on "
                        f"cuda:{device} and takes CUDA device memory (or host arrays)")
    if index != device:
        raise ValueError(f"input {spec.name!r} is on cuda:{index}, the model on cuda:{device}: move it there "
                         f"(tensor.to('cuda:{device}')) or load the model with cuda:{index} current")
    # The DLPack stream number of the run's stream: 1 for the legacy default (0 is ambiguous in
    # the protocol); other handles are themselves.
    t = _dlpack_import(_export(x, stream if stream != 0 else 1))
    if t.device != (_KDL_CUDA, device):
        raise ValueError(f"input {spec.name!r}: its __dlpack_device__ says cuda:{index} but its DLPack tensor is on "
                         f"{_device_name(*t.device)}; the producer is inconsistent")
    _check_device_tensor(spec, t)
    return t


def _check_device_tensor(spec: IOSpec, t: Any) -> None:
    """Refuses an imported DLPack tensor that input `spec` cannot take as it is: no conversion or
    copy happens on the device."""
    if t.dtype != spec.dtype:
        raise TypeError(f"input {spec.name!r} is {t.dtype}, the model takes {spec.dtype}; GPU tensors are not "
                        f"converted: convert it first (e.g. x.to(torch.{spec.dtype}))")
    if len(t.shape) != len(spec.shape):
        raise ValueError(f"input {spec.name!r} has shape {tuple(t.shape)}, the model takes rank {len(spec.shape)} "
                         f"{_shape_text(spec.shape)}")
    for got, want in zip(t.shape, spec.shape):
        if isinstance(want, int) and got != want:
            raise ValueError(f"input {spec.name!r} has shape {tuple(t.shape)}, the model takes "
                             f"{_shape_text(spec.shape)}")
    if not t.contiguous:
        raise ValueError(f"input {spec.name!r} is not contiguous (shape {tuple(t.shape)}, strides "
                         f"{tuple(t.strides)} in elements): make it dense first (x.contiguous())")


def _shape_text(shape: Sequence[Union[int, str]]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _bfloat16() -> np.dtype:
    try:
        import ml_dtypes  # noqa: PLC0415 - optional, only for bfloat16 models
    except ImportError:
        raise TypeError("the model has bfloat16 inputs or outputs, which NumPy holds only with the ml_dtypes "
                        "package: pip install ml_dtypes") from None
    return np.dtype(ml_dtypes.bfloat16)


def _spec(row: Tuple[str, str, List[Union[int, str]]]) -> IOSpec:
    """An input or output as the native side labels it: ints, and run-time dims by name."""
    name, dtype, shape = row
    return IOSpec(name, dtype, tuple(shape))


def load(out_dir: PathLike) -> Module:
    """Loads `out_dir/libmodel.so` (the output of `compile`) and instantiates the model on the
    current CUDA device: its activation arena at max_batch, workspace and weights. Raises
    onnx2ait.Error when the folder holds no library (e.g. it was compiled with build=False),
    mixes two builds, or there is no usable GPU."""
    return Module(out_dir)


def inspect(out_dir: PathLike) -> LibraryInfo:
    """What `out_dir/libmodel.so` says about its model (names, dtypes, shapes, batch range,
    kernels), read through its C API; needs no GPU."""
    return _info(Path(out_dir), _describe(out_dir))
