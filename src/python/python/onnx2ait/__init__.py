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
stream.

Weights from memory instead of OUT/weights.bin (an application that embeds or decrypts them):

    model = onnx2ait.load("out", weights=blob)   # bytes, bytearray, memoryview, mmap, uint8 array

The library checks the buffer's size and build hash first: a wrong one raises onnx2ait.Error
naming the cause.

Preallocated outputs, written in place and returned (host arrays for host inputs, GPU tensors of
the model's GPU for GPU inputs; exact dtype and shape, dense, writable):

    y = np.empty(model.output_shape(0, 8), np.float32)
    (y,) = model(x, out=[y])                  # or out={"logits": y}
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
    squeeze_excite: str = "fused",
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
    squeeze_excite "fused" (default) or "unfused" squeeze-and-excitation scales (--squeeze-excite)
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

    `out=` (a list in output order, a dict by name, or the one output's array) takes
    preallocated outputs: writable C-contiguous NumPy arrays of each output's exact dtype and
    shape for host inputs, dense writable GPU tensors of the exact dtype and shape on the model's
    GPU for GPU inputs. The run writes them in place and the call returns those objects. Torch
    tensors are recorded on the run's stream; other GPU tensors must outlive the run.
    """

    def __init__(self, out_dir: PathLike, weights: Any = None):
        self.out = Path(out_dir)
        self._native = _NativeModel(self.out, None if weights is None else _weights_bytes(weights))
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

    def __call__(self, *arrays: Any, out: Any = None, **named: Any) -> List[Any]:
        if "out" in (s.name for s in self.inputs):
            # A model input named "out" keeps its name here; `call(inputs, out=...)` takes
            # preallocated outputs for such a model.
            if out is not None:
                named["out"] = out
            return self._run(self._bind(arrays, named), None, None)
        return self._run(self._bind(arrays, named), None, out)

    def call(self, inputs: Union[Sequence[Any], Mapping[str, Any]], *, stream: Any = None, out: Any = None) -> List[Any]:
        """Runs the model on `inputs` (a sequence in input order, or a mapping by name), GPU
        tensors on `stream`: a CUDA stream handle (int; 0 is the default stream) or an object
        with one (torch.cuda.Stream's `cuda_stream`, cupy's `ptr`). The inputs' producers are
        asked (`__dlpack__(stream=...)`) to order their pending work before the run, and outputs
        handed to a consumer are ordered after it on the consumer's stream. `stream` is for GPU
        inputs only. `out` takes preallocated outputs, as calling the module does."""
        if isinstance(inputs, Mapping):
            bound = self._bind((), dict(inputs))
        elif isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise TypeError(f"inputs: expected a sequence or a mapping of the model's inputs, got {type(inputs).__name__}")
        else:
            bound = self._bind(tuple(inputs), {})
        return self._run(bound, stream, out)

    def _run(self, bound: List[Any], stream: Any, out: Any) -> List[Any]:
        targets = None if out is None else _bind_outputs(self.outputs, out)
        on_gpu = [_on_device(x) for x in bound]
        if not any(on_gpu):
            if stream is not None:
                raise TypeError("stream= orders GPU work; the inputs are host arrays (their run is synchronous)")
            if targets is not None:
                # Checked before the inputs are converted: nothing is copied for a call refused here.
                buffers = [_host_output(spec, o) for spec, o in zip(self.outputs, targets)]
                _refuse_overlaps(list(zip(self.outputs, buffers)))
                self._native.run([_host_array(spec, x) for spec, x in zip(self.inputs, bound)], buffers)
                return list(targets)
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
        if targets is not None:
            for spec, o in zip(self.outputs, targets):
                if not _on_device(o):
                    raise TypeError(f"output {spec.name!r} (out=) is a host array but the inputs are GPU tensors: "
                                    "pass GPU tensors on the model's GPU as outputs (or host arrays as inputs)")
        device = self._native.device()
        handle = _stream_handle(stream, device)
        imported = [_device_input(spec, x, device, handle) for spec, x in zip(self.inputs, bound)]
        torch = sys.modules.get("torch")
        if targets is None:
            outs = self._native.run_device(imported, handle)
            if torch is not None and any(isinstance(x, torch.Tensor) for x in bound):
                # Consumed on PyTorch's current stream, which waits for the run when it is another.
                return [torch.from_dlpack(o) for o in outs]
            return list(outs)
        written = [_device_input(spec, o, device, handle, "output") for spec, o in zip(self.outputs, targets)]
        self._native.run_device_into(imported, written, handle)
        if torch is not None and any(isinstance(x, torch.Tensor) for x in list(bound) + list(targets)):
            _torch_after_run(torch, self._native, device, handle, list(bound) + list(targets))
        return list(targets)

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


def _device_input(spec: IOSpec, x: Any, device: int, stream: int, what: str = "input") -> Any:
    """Takes the GPU tensor `x` for input `spec` (or, with what="output", the preallocated
    output `spec`) of a model on cuda:`device` whose run goes on `stream`: checks where it lives
    before exporting it, then what the capsule says."""
    if not hasattr(x, "__dlpack__") or not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"{what} {spec.name!r} is GPU memory without the DLPack protocol (__dlpack__, "
                        "__dlpack_device__): pass it through a library that has it (cupy >= 10, PyTorch, JAX)")
    kind, index = x.__dlpack_device__()
    kind, index = int(kind), int(index)
    if kind != _KDL_CUDA:
        raise TypeError(f"{what} {spec.name!r} is on the device {_device_name(kind, index)}; the model runs on "
                        f"cuda:{device} and takes CUDA device memory (or host arrays)")
    if index != device:
        raise ValueError(f"{what} {spec.name!r} is on cuda:{index}, the model on cuda:{device}: move it there "
                         f"(tensor.to('cuda:{device}')) or load the model with cuda:{index} current")
    # The DLPack stream number of the run's stream: 1 for the legacy default (0 is ambiguous in
    # the protocol); other handles are themselves. For an output this orders the producer's
    # pending reads and writes of it before the run.
    t = _dlpack_import(_export(x, stream if stream != 0 else 1))
    if t.device != (_KDL_CUDA, device):
        raise ValueError(f"{what} {spec.name!r}: its __dlpack_device__ says cuda:{index} but its DLPack tensor is on "
                         f"{_device_name(*t.device)}; the producer is inconsistent")
    _check_device_tensor(spec, t, what)
    return t


def _check_device_tensor(spec: IOSpec, t: Any, what: str = "input") -> None:
    """Refuses an imported DLPack tensor that input `spec` (or output, with what="output")
    cannot take as it is: no conversion or copy happens on the device."""
    verb = "takes" if what == "input" else "writes"
    if t.dtype != spec.dtype:
        raise TypeError(f"{what} {spec.name!r} is {t.dtype}, the model {verb} {spec.dtype}; GPU tensors are not "
                        f"converted: {'convert it first' if what == 'input' else 'allocate it as'} "
                        f"(e.g. {'x.to(' if what == 'input' else 'torch.empty(..., dtype='}torch.{spec.dtype}))")
    if len(t.shape) != len(spec.shape):
        raise ValueError(f"{what} {spec.name!r} has shape {tuple(t.shape)}, the model {verb} rank "
                         f"{len(spec.shape)} {_shape_text(spec.shape)}")
    for got, want in zip(t.shape, spec.shape):
        if isinstance(want, int) and got != want:
            raise ValueError(f"{what} {spec.name!r} has shape {tuple(t.shape)}, the model {verb} "
                             f"{_shape_text(spec.shape)}")
    if not t.contiguous:
        raise ValueError(f"{what} {spec.name!r} is not contiguous (shape {tuple(t.shape)}, strides "
                         f"{tuple(t.strides)} in elements): {'make it dense first (x.contiguous())' if what == 'input' else 'pass a dense tensor (torch.empty(shape))'}")
    if what == "output" and t.readonly:
        raise ValueError(f"output {spec.name!r} is read-only (its producer exported it with DLPack's read-only "
                         "flag): pass a writable tensor")


def _bind_outputs(specs: Sequence[IOSpec], out: Any) -> List[Any]:
    """`out=` as one target per output in output order: a sequence in output order, a mapping by
    output name (naming every output), or for a model of one output the target itself."""
    names = [s.name for s in specs]
    if isinstance(out, Mapping):
        unknown = [k for k in out if k not in names]
        if unknown:
            raise TypeError(f"out: the model has no output {unknown[0]!r} (its outputs: {', '.join(names)})")
        missing = [n for n in names if n not in out]
        if missing:
            raise TypeError(f"out: no array for output(s) {', '.join(missing)}; out= takes every output "
                            f"({', '.join(names)})")
        return [out[n] for n in names]
    if isinstance(out, (list, tuple)):
        if len(out) != len(names):
            raise TypeError(f"out: {len(out)} array(s) given, the model has {len(names)} outputs ({', '.join(names)})")
        return list(out)
    if isinstance(out, (str, bytes)) or not (isinstance(out, np.ndarray) or hasattr(out, "__dlpack__")):
        raise TypeError(f"out: expected arrays or GPU tensors, one per output (a list, a tuple or a mapping by name), "
                        f"got {type(out).__name__}")
    if len(names) != 1:
        raise TypeError(f"out: one array given, the model has {len(names)} outputs ({', '.join(names)}): pass a list "
                        "or a mapping by name")
    return [out]


def _host_output(spec: IOSpec, x: Any) -> np.ndarray:
    """The host array the run writes output `spec` into (`out=`): a writable C-contiguous NumPy
    array of the output's exact dtype and shape, used as it is (no conversion, no copy back)."""
    if not isinstance(x, np.ndarray):
        if _on_device(x):
            raise TypeError(f"output {spec.name!r} (out=) is a GPU tensor but the inputs are host arrays: pass "
                            "host arrays as outputs (or every input on the GPU)")
        raise TypeError(f"output {spec.name!r} (out=): expected a numpy.ndarray, got {type(x).__name__}")
    want = _bfloat16() if spec.dtype == "bfloat16" else np.dtype(spec.dtype)
    if x.dtype != want:
        raise TypeError(f"output {spec.name!r} (out=) is {x.dtype}, the model writes {spec.dtype}: pass an array of "
                        f"that dtype (np.empty(shape, np.{spec.dtype})); outputs are not converted")
    if len(x.shape) != len(spec.shape) or any(isinstance(w, int) and g != w for g, w in zip(x.shape, spec.shape)):
        raise ValueError(f"output {spec.name!r} (out=) has shape {x.shape}, the model writes "
                         f"{_shape_text(spec.shape)}")
    if not x.flags.writeable:
        raise ValueError(f"output {spec.name!r} (out=) is read-only: pass a writable array")
    if not x.flags.c_contiguous:
        raise ValueError(f"output {spec.name!r} (out=) is not C-contiguous (strides {x.strides}): pass a dense "
                         "row-major array; outputs are written in place, not copied back")
    # The native side takes bfloat16 as its bits.
    return x.view(np.uint16) if spec.dtype == "bfloat16" else x


def _refuse_overlaps(pairs: List[Tuple[IOSpec, np.ndarray]]) -> None:
    """Refuses host outputs that share memory: each would overwrite the other's values."""
    for i, (a, x) in enumerate(pairs):
        for b, y in pairs[i + 1:]:
            if x.size and y.size and np.shares_memory(x, y):
                raise ValueError(f"outputs {a.name!r} and {b.name!r} (out=) share memory: pass separate arrays")


def _torch_after_run(torch: Any, native: Any, device: int, handle: int, tensors: List[Any]) -> None:
    """After a run into preallocated outputs on the stream `handle`: PyTorch's caching allocator
    is told that the run uses the torch tensors among the inputs and outputs (so their memory is
    not reused before it is done, whatever stream allocated them), and PyTorch's current stream
    waits for the run, as for outputs the run allocates."""
    current = torch.cuda.current_stream(device)
    if handle == int(current.cuda_stream):
        run_stream = current
    elif handle == 0:
        run_stream = torch.cuda.default_stream(device)
    else:
        run_stream = torch.cuda.ExternalStream(handle, device=device)
    for t in tensors:
        if isinstance(t, torch.Tensor):
            t.record_stream(run_stream)
    if handle != int(current.cuda_stream):
        native.stream_wait(int(current.cuda_stream), handle)


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


def _weights_bytes(weights: Any) -> np.ndarray:
    """`load`'s weights as the 1-D uint8 array the native side reads: a view of the caller's
    buffer, not a copy."""
    if isinstance(weights, (str, os.PathLike)):
        raise TypeError(f"weights: expected the bytes of weights.bin (bytes, bytearray, memoryview, mmap or a uint8 "
                        f"NumPy array), got the path {str(weights)!r}; the weights file of the output folder is read "
                        "when weights is None")
    if isinstance(weights, np.ndarray):
        if weights.dtype not in (np.uint8, np.int8):
            raise TypeError(f"weights: a NumPy array of {weights.dtype}; expected weights.bin's bytes as uint8 "
                            "(np.fromfile(path, np.uint8)), or view it as bytes (a.view(np.uint8)) if that is what "
                            "it holds")
        if not weights.flags.c_contiguous:
            raise ValueError("weights: the array is not C-contiguous; the weights must be one contiguous buffer")
        return weights.reshape(-1).view(np.uint8)
    try:
        view = memoryview(weights)
    except TypeError:
        raise TypeError(f"weights: expected the bytes of weights.bin (bytes, bytearray, memoryview, mmap or a uint8 "
                        f"NumPy array), got {type(weights).__name__}") from None
    if view.itemsize != 1:
        raise TypeError(f"weights: a buffer of {view.itemsize}-byte items (format {view.format!r}); expected "
                        "weights.bin's bytes (cast it: memoryview(x).cast('B'))")
    if not view.c_contiguous:
        raise ValueError("weights: the buffer is not contiguous; the weights must be one contiguous buffer")
    return np.frombuffer(view, dtype=np.uint8)


def load(out_dir: PathLike, weights: Any = None) -> Module:
    """Loads `out_dir/libmodel.so` (the output of `compile`) and instantiates the model on the
    current CUDA device: its activation arena at max_batch, workspace and weights. Raises
    onnx2ait.Error when the folder holds no library (e.g. it was compiled with build=False),
    mixes two builds, or there is no usable GPU.

    weights: the weights from memory instead of `out_dir/weights.bin`: that file's bytes as
    bytes, bytearray, memoryview, mmap or a uint8 NumPy array (any C-contiguous buffer of bytes;
    read in place, copied to the GPU, not kept). The library checks them before touching the
    GPU: a buffer of another size or build raises onnx2ait.Error naming the cause."""
    return Module(out_dir, weights)


def inspect(out_dir: PathLike) -> LibraryInfo:
    """What `out_dir/libmodel.so` says about its model (names, dtypes, shapes, batch range,
    kernels), read through its C API; needs no GPU."""
    return _info(Path(out_dir), _describe(out_dir))
