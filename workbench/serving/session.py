"""One serving run as every surface asks for it (`workbench serve`, `wb.serve`): launch the engine or attach to a
URL, run the load points, stop the engine. The surfaces only turn their options into a `ServeRequest`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import WorkbenchError
from workbench.serving.engine import Endpoint, EngineSettings, attach, launched_engine
from workbench.serving.load import Load
from workbench.serving.run import ProfileWindow, ServeOptions, ServeResult, serve

SERVING_ENV = "WORKBENCH_SERVING"
"""Environment variable naming the folder of the serving environments (default ./.serving, `make serving`)."""


def serving_dir() -> Path:
    """Where `make serving` put the engine's and the generator's environments."""
    return Path(os.environ.get(SERVING_ENV) or ".serving")


@dataclass(frozen=True)
class ServeRequest:
    """What to serve and how to load it: the load points; a running server's `url` (with its `tokenizer` folder
    and, to profile it, its `profile_dir`) or an engine to launch (`engine`, `engine_python`, the model `ref` and
    its `overrides`, where it listens, its limits and extra arguments); the generator; the profiling window
    (None: the whole load for a launched engine, off for a URL without `profile_dir`); the metrics period and
    the SLO."""

    points: tuple[Load, ...]
    url: str | None = None
    model: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    engine: str = "vllm"
    engine_python: str | None = None
    generator: str = "aiperf"
    aiperf: str | None = None
    window: ProfileWindow | None = None
    profile_dir: Path | None = None
    max_steps: int = 2000
    metrics_period_s: float = 0.5
    slo: dict[str, int] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int = 512
    max_num_seqs: int = 16
    engine_args: tuple[str, ...] = ()
    ready_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.url is not None and self.overrides:
            raise WorkbenchError("--set applies to an engine the workbench launches, not to --url")
        if self.url is not None and self.engine_python and self.generator != "vllm-bench":
            raise WorkbenchError("--engine-python with --url names the Python that runs `vllm bench serve` "
                                 "(--generator vllm-bench); AIPerf needs none")
        if self.url is None and self.profile_dir is not None:
            raise WorkbenchError("--profile-dir applies to --url (a launched engine's profiler writes where the "
                                 "workbench tells it)")
        if self.generator == "vllm-bench" and any(p.sessions or p.shared_prefix for p in self.points):
            raise WorkbenchError("--sessions and --shared-prefix need AIPerf (--generator aiperf)")

    @property
    def profile_window(self) -> ProfileWindow:
        """The window asked for, or the default (module docstring)."""
        if self.window is not None:
            return self.window
        return ProfileWindow("load" if self.url is None or self.profile_dir else "off")


def run_serving(request: ServeRequest, root: Path,
                on_progress: Callable[[str], None] = lambda message: None) -> ServeResult:
    """Run `request`'s load points into `root`; a launched engine is stopped however this ends."""
    if request.url is not None:
        return _attached(request, root, on_progress)
    return _launched(request, root, on_progress)


def _attached(request: ServeRequest, root: Path, on_progress: Callable[[str], None]) -> ServeResult:
    endpoint = attach(request.url, request.model)
    if request.tokenizer is None:
        raise WorkbenchError(f"--url {request.url}: give --tokenizer PATH, the served model's tokenizer folder (the "
                             "load generator counts prompt tokens with it; nothing is downloaded)")
    window = request.profile_window
    endpoint = Endpoint(endpoint.url, endpoint.model, profiler=window.kind != "off")
    options = _options(request, request.tokenizer, window, request.profile_dir, {"name": endpoint.model}, "server",
                       {"url": endpoint.url}, engine_python=request.engine_python)
    return serve(endpoint, list(request.points), options, root, on_progress)


def _launched(request: ServeRequest, root: Path, on_progress: Callable[[str], None]) -> ServeResult:
    from workbench.serving.model_folder import DEFAULT_MODEL, model_folder

    python = request.engine_python or str(serving_dir() / "vllm" / "bin" / "python")
    ref = request.model or DEFAULT_MODEL
    on_progress(f"preparing {ref}")
    folder, name = model_folder(ref, request.overrides)
    window = request.profile_window
    with tempfile.TemporaryDirectory(prefix="workbench-serve-") as work:
        profile_dir = Path(work) / "profile" if window.kind != "off" else None
        settings = EngineSettings(python=python, model_dir=folder, served_name=name, engine=request.engine,
                                  host=request.host, port=request.port, max_model_len=request.max_model_len,
                                  max_num_seqs=request.max_num_seqs, profile_dir=profile_dir,
                                  max_steps=request.max_steps, extra_args=request.engine_args,
                                  ready_timeout_s=request.ready_timeout_s)
        with launched_engine(settings, Path(work) / "engine.log", on_progress) as endpoint:
            options = _options(request, request.tokenizer or str(folder), window, profile_dir,
                               {"name": name, "ref": ref, "folder": str(folder), **request.overrides}, "cpu",
                               {"engine": request.engine, "max_model_len": request.max_model_len,
                                "max_num_seqs": request.max_num_seqs, "args": list(request.engine_args)},
                               engine_python=python)
            return serve(endpoint, list(request.points), options, root, on_progress)


def _options(request: ServeRequest, tokenizer: str, window: ProfileWindow, profile_dir: Path | None,
             model: dict[str, Any], device: str, engine: dict[str, Any], engine_python: str | None) -> ServeOptions:
    """The options of each load point: the generator's program (AIPerf, or the engine's Python for vllm bench)."""
    if request.generator == "aiperf":
        program = request.aiperf or str(serving_dir() / "aiperf" / "bin" / "aiperf")
    elif engine_python is None:
        raise WorkbenchError("--generator vllm-bench runs with vLLM's Python: with --url, give it as --engine-python "
                             "(e.g. .serving/vllm/bin/python)")
    else:
        program = engine_python
    return ServeOptions(tokenizer=tokenizer, generator=request.generator, program=program, window=window,
                        profile_dir=profile_dir, metrics_period_s=request.metrics_period_s, slo=request.slo,
                        model=model, device=device, engine=engine)
