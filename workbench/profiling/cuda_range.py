"""`CudaRangeSession`: the profiler session inside a process that an Nsight tool launched.

CUPTI serves one profiler per process, so under nsys or ncu the framework's profiler cannot record; this
session only brackets the measured iterations with cudaProfilerStart/Stop for the tool.
"""

from __future__ import annotations

import contextlib
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from workbench.errors import WorkbenchError
from workbench.profiling.session import SessionContext, register_session
from workbench.profiling.settings import ProfileSettings


class CudaRangeSession:
    """The profiler session of a run under Nsight: cudaProfilerStart once the warm-up iterations are
    done, cudaProfilerStop at close (after the `measure` phase), so `--capture-range=cudaProfilerApi`
    (nsys) and `--profile-from-start off` (ncu) record exactly the measured iterations.

    It mirrors the other sessions (`start`/`step`/`step_scope`/`close`, `trace_path`, `raw_paths`,
    `op_flops`): the trace itself is the tool's, written by the tool. With `emit_nvtx` torch's ops get
    NVTX ranges too (`torch.autograd.profiler.emit_nvtx`), so nsys ties kernels to ops. On a device
    other than CUDA there is no CUDA profiler range to open and only the bookkeeping runs. With no
    warm-up iterations the range opens at the first measured iteration.
    """

    def __init__(self, out_dir: str | Path, name: str, settings: ProfileSettings | None = None, *,
                 device_type: str = "cuda", emit_nvtx: bool = False) -> None:
        self.settings = settings or ProfileSettings()
        self.name = name
        self.device_type = device_type
        self.emit_nvtx = emit_nvtx
        self.trace_path: Path | None = None
        self.op_flops: dict[str, float] = {}  # no torch.profiler here: FLOPs are not counted
        self.captured = False
        self._out = Path(out_dir)
        self._steps = 0
        self._started = self._closed = False
        self._stack: ExitStack | None = None

    @property
    def raw_paths(self) -> tuple[Path, ...]:
        """Nothing: the tool writes the raw output."""
        return ()

    def start(self) -> None:
        """Start the session (once); the range opens after `warmup_steps` calls to `step()`."""
        if self._started or self._closed:
            raise WorkbenchError("a profiler session can be started only once")
        self._started = True

    def step(self) -> None:
        """Mark the end of an iteration; the range opens after the last warm-up iteration."""
        if not self._started or self._closed:
            raise WorkbenchError("the profiler session is not running")
        self._steps += 1
        if self._steps == self.settings.warmup_steps:
            self._begin()

    def step_scope(self, n: int) -> contextlib.AbstractContextManager[Any]:
        """Nothing to add (the phase labels are NVTX ranges already); opens the range if it is not yet open."""
        if self._started and self._stack is None and not self._closed:
            self._begin()
        return contextlib.nullcontext()

    def _begin(self) -> None:
        if self._stack is not None:
            return
        self._stack = ExitStack()
        self.captured = True
        if self.device_type != "cuda":
            return
        import torch

        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        self._stack.callback(torch.cuda.profiler.stop)
        self._stack.callback(torch.cuda.synchronize)
        if self.emit_nvtx:
            self._stack.enter_context(torch.autograd.profiler.emit_nvtx(record_shapes=self.settings.record_shapes))

    def close(self, *, export: bool = True) -> Path | None:
        """Close the range (synchronizing first); with `export`, `trace_path` becomes the output folder.
        Later calls only return the same path."""
        if self._closed:
            return self.trace_path
        self._closed = True
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()
        if export and self._started:
            self.trace_path = self._out
        return self.trace_path

    def __enter__(self) -> CudaRangeSession:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(export=exc_type is None)


def _open(out_dir: Path, name: str, settings: ProfileSettings, context: SessionContext) -> CudaRangeSession:
    return CudaRangeSession(out_dir, name, settings, device_type=context.device_type, emit_nvtx=context.emit_nvtx)


register_session("cuda-range", _open)
