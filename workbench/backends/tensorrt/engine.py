"""TensorRT engine build and execution (needs `tensorrt` and a CUDA GPU; imported lazily).

Build: the ONNX file is parsed into a strongly typed network (the precision is the graph's, see
`precision`; the STRONGLY_TYPED creation flag is required on TensorRT 10 and ignored, always on, in
11), with one optimization profile for the batch range, `ProfilingVerbosity.DETAILED` (so the engine
inspector and per-layer NVTX ranges name layers, tactics and formats), and a timing cache that is loaded
when given and written back after the build, so rebuilding on the same GPU skips tactic timing.

Run: `TrtEngine.infer` binds torch tensors by `data_ptr()` (`set_input_shape`, `set_tensor_address`) and
calls `execute_async_v3` on a side CUDA stream ordered after and before the caller's current stream, so
CUDA-event timers and later torch work on the current stream see the engine's work. `profile` attaches
an `IProfiler` that reports each layer's time per execution into a `LayerTimes`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.backends.tensorrt.deps import require_tensorrt
from workbench.errors import WorkbenchError
from workbench.trace.formats.trt_layers import LayerTimes

TORCH_DTYPES = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT8": torch.int8,
                "INT32": torch.int32, "INT64": torch.int64, "BOOL": torch.bool, "UINT8": torch.uint8,
                "FP8": torch.float8_e4m3fn}
"""TensorRT DataType name → torch dtype, for the engine's I/O tensors."""

KEPT_LOG_LINES = 200


def torch_dtype(trt_dtype: Any) -> torch.dtype:
    """The torch dtype of a TensorRT `DataType`; WorkbenchError for one torch cannot hold (INT4, FP4)."""
    name = getattr(trt_dtype, "name", str(trt_dtype).rsplit(".", 1)[-1])
    if name not in TORCH_DTYPES:
        raise WorkbenchError(f"TensorRT I/O tensor type {name} has no torch equivalent")
    return TORCH_DTYPES[name]


def _logger(trt: Any) -> Any:
    """A `trt.ILogger` that keeps warnings and errors (for the build notes) instead of printing them."""

    class KeptLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.lines: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if int(severity) <= int(trt.ILogger.Severity.WARNING) and len(self.lines) < KEPT_LOG_LINES:
                self.lines.append(f"{getattr(severity, 'name', severity)}: {msg}")

    return KeptLogger()


@dataclass(frozen=True)
class BatchProfile:
    """Shapes of one input for the optimization profile: (min, opt, max)."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


def batch_profiles(shapes: Mapping[str, Sequence[int]], network_shapes: Mapping[str, Sequence[int]]
                   ) -> dict[str, BatchProfile]:
    """Per input, the profile for the example `shapes`: a dynamic (-1) batch axis ranges from 1 to the
    example batch, which is also the shape TensorRT optimizes for; every other axis is the example's."""
    profiles = {}
    for name, shape in shapes.items():
        opt = tuple(int(d) for d in shape)
        dims = list(network_shapes.get(name, opt))
        low = (1, *opt[1:]) if opt and dims and int(dims[0]) < 0 else opt
        profiles[name] = BatchProfile(min=low, opt=opt, max=opt)
    return profiles


@dataclass(frozen=True)
class BuiltEngine:
    """A serialized engine plan and how it was built."""

    plan: bytes
    build_s: float
    tensorrt_version: str
    network_layers: int
    profiles: dict[str, BatchProfile]
    timing_cache: dict[str, Any]
    log: list[str] = field(default_factory=list)

    def notes(self) -> dict[str, Any]:
        """JSON-ready build facts (for run.json)."""
        return {"build_s": self.build_s, "tensorrt_version": self.tensorrt_version,
                "network_layers": self.network_layers, "plan_bytes": len(self.plan),
                "profiles": {k: {"min": v.min, "opt": v.opt, "max": v.max} for k, v in self.profiles.items()},
                "timing_cache": self.timing_cache, "builder_log": self.log,
                "profiling_verbosity": "DETAILED", "strongly_typed": True}


def _load_timing_cache(trt: Any, config: Any, path: Path | None) -> dict[str, Any]:
    """Attach a timing cache to `config`: `path`'s when it exists and matches this GPU and TensorRT, else
    an empty one (which the build fills)."""
    facts: dict[str, Any] = {"loaded_from": None, "loaded_bytes": 0}
    cache = None
    if path is not None and path.is_file():
        data = path.read_bytes()
        cache = config.create_timing_cache(data)
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            facts.update(loaded_from=str(path), loaded_bytes=len(data))
            return facts
        facts["rejected"] = f"{path}: not a timing cache of this GPU / TensorRT version; started empty"
    cache = config.create_timing_cache(b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    return facts


def build_engine(onnx_path: str | Path, shapes: Mapping[str, Sequence[int]], *,
                 timing_cache: Path | None = None, save_timing_cache: Sequence[Path] = ()) -> BuiltEngine:
    """Parse `onnx_path` into a strongly typed network and build a serialized engine for inputs of
    `shapes` (batch axis from 1 up to theirs), with DETAILED profiling verbosity, the timing cache at
    `timing_cache` (if it exists), and the updated cache written to each of `save_timing_cache`."""
    trt = require_tensorrt()
    logger = _logger(trt)
    builder = trt.Builder(logger)
    flags = 0
    strongly_typed = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
    if strongly_typed is not None:
        flags |= 1 << int(strongly_typed)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise WorkbenchError(f"TensorRT could not parse {onnx_path}: {errors or 'no parser message'}")
    config = builder.create_builder_config()
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    cache_facts = _load_timing_cache(trt, config, timing_cache)
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    missing = sorted({t.name for t in inputs} - set(shapes))
    if missing:
        raise WorkbenchError(f"no example shape for TensorRT network input(s) {', '.join(missing)}")
    profiles = batch_profiles({t.name: shapes[t.name] for t in inputs}, {t.name: tuple(t.shape) for t in inputs})
    profile = builder.create_optimization_profile()
    for name, shape in profiles.items():
        profile.set_shape(name, shape.min, shape.opt, shape.max)
    config.add_optimization_profile(profile)
    start = time.perf_counter()
    plan = builder.build_serialized_network(network, config)
    elapsed = time.perf_counter() - start
    if plan is None:
        raise WorkbenchError(f"TensorRT failed to build an engine from {onnx_path}: "
                             + ("; ".join(logger.lines[-5:]) or "no builder message"))
    serialized = bytes(memoryview(config.get_timing_cache().serialize()))
    for path in save_timing_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(serialized)
    cache_facts.update(saved_bytes=len(serialized), saved_to=[str(p) for p in save_timing_cache])
    return BuiltEngine(plan=bytes(memoryview(plan)), build_s=elapsed, tensorrt_version=trt.__version__,
                       network_layers=network.num_layers, profiles=profiles, timing_cache=cache_facts,
                       log=list(logger.lines))


def _layer_profiler(trt: Any, times: LayerTimes) -> Any:
    """A `trt.IProfiler` forwarding `report_layer_time` into `times`."""

    class Profiler(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            times.record(layer_name, ms)

    return Profiler()


class TrtEngine:
    """A deserialized engine with one execution context, run on its own CUDA stream of `device`."""

    def __init__(self, plan: bytes, device: torch.device) -> None:
        self._trt = trt = require_tensorrt()
        self.device = device
        self._logger = _logger(trt)
        with torch.cuda.device(device):
            self._runtime = trt.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(plan)
            if self.engine is None:
                raise WorkbenchError("TensorRT could not deserialize the engine: "
                                     + ("; ".join(self._logger.lines[-5:]) or "no runtime message"))
            self.context = self.engine.create_execution_context()
            self._stream = torch.cuda.Stream(device)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: torch_dtype(self.engine.get_tensor_dtype(n)) for n in names}

    def _bind_inputs(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(inputs) != len(self.input_names):
            raise WorkbenchError(f"the engine takes {len(self.input_names)} input(s) "
                                 f"({', '.join(self.input_names)}), got {len(inputs)}")
        bound = []
        for name, tensor in zip(self.input_names, inputs, strict=True):
            tensor = tensor.to(self.device, self.dtypes[name]).contiguous()
            shape = tuple(tensor.shape)
            if tuple(self.context.get_tensor_shape(name)) != shape and not self.context.set_input_shape(name, shape):
                raise WorkbenchError(f"TensorRT rejected shape {shape} for input {name} (outside the engine's "
                                     "optimization profile?)")
            self.context.set_tensor_address(name, tensor.data_ptr())
            bound.append(tensor)
        return bound

    def _bind_outputs(self) -> list[torch.Tensor]:
        outputs = []
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise WorkbenchError(f"output {name} has a data-dependent shape {shape}; not supported")
            out = torch.empty(shape, dtype=self.dtypes[name], device=self.device)
            self.context.set_tensor_address(name, out.data_ptr())
            outputs.append(out)
        return outputs

    def infer(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run the engine once on `inputs` (in engine input order); returns the outputs, ready on the
        caller's current stream (no host sync)."""
        with torch.cuda.device(self.device):
            current = torch.cuda.current_stream(self.device)
            bound = self._bind_inputs(inputs)
            outputs = self._bind_outputs()
            self._stream.wait_stream(current)
            if not self.context.execute_async_v3(self._stream.cuda_stream):
                raise WorkbenchError("TensorRT execute_async_v3 failed: "
                                     + ("; ".join(self._logger.lines[-5:]) or "no runtime message"))
            current.wait_stream(self._stream)
            for tensor in (*bound, *outputs):
                tensor.record_stream(self._stream)
        return outputs

    def inspector_json(self) -> str:
        """The engine inspector's JSON for this context (its concrete shapes, after a first `infer`)."""
        inspector = self.engine.create_engine_inspector()
        inspector.execution_context = self.context
        return str(inspector.get_engine_information(self._trt.LayerInformationFormat.JSON))

    def profile(self, inputs: Sequence[torch.Tensor], iterations: int) -> LayerTimes:
        """Run `iterations` times with a layer profiler attached; per-layer times per execution (host
        times from `time.perf_counter_ns`, with that clock's offset to the UTC epoch). Timing every layer
        separately adds synchronization between layers and slows the execution: these runs are not the
        benchmark's."""
        if iterations < 1:
            raise WorkbenchError(f"profile iterations must be positive, got {iterations}")
        times = LayerTimes(epoch_offset_ns=time.time_ns() - time.perf_counter_ns())
        profiler = _layer_profiler(self._trt, times)
        self.context.profiler = profiler
        self.context.enqueue_emits_profile = True
        try:
            for _ in range(iterations):
                torch.cuda.synchronize(self.device)
                times.begin(time.perf_counter_ns())
                self.infer(inputs)
                torch.cuda.synchronize(self.device)
                times.end(time.perf_counter_ns())
        finally:
            self.context.profiler = None
        return times

    def notes(self) -> dict[str, Any]:
        """JSON-ready engine facts."""
        memory = getattr(self.engine, "device_memory_size_v2", None)
        if memory is None:
            memory = getattr(self.engine, "device_memory_size", None)
        return {"layers": self.engine.num_layers, "inputs": self.input_names, "outputs": self.output_names,
                "io_dtypes": {n: str(d).removeprefix("torch.") for n, d in self.dtypes.items()},
                "device_memory_bytes": memory, "runtime_log": list(self._logger.lines)}
