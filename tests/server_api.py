"""Helpers of the Jupyter server extension's tests: API calls through a pytest-jupyter server, runs on disk."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import payload_trace
from jupyter_server.utils import url_path_join
from traitlets.config import Config

from workbench.trace import read_trace
from workbench.trace.store.bundle import write_bundle

TINY_JOB = {"model": "mlp", "overrides": {"hidden": 32, "in_features": 16, "num_classes": 10},
            "variants": ["eager"], "batch": 2, "iterations": 2, "warmup": 0, "threads": 1, "profile": False}
"""A capture that takes a couple of seconds (most of it importing torch)."""


def server_config(**workbench: Any) -> Config:
    """A test server with the workbench extension, every route behind a token; `workbench` adds
    WorkbenchServerApp settings."""
    return Config({
        "ServerApp": {"jpserver_extensions": {"workbench.server": True, "jupyter_server_terminals": False},
                      "allow_unauthenticated_access": False},
        "WorkbenchServerApp": {"cancel_grace_s": 30.0, **workbench},
    })


@pytest.fixture
def jp_server_config(request, monkeypatch):
    """The test server over a folder traces root (`<root_dir>/traces`, whatever WORKBENCH_TRACES says); a test may
    pass WorkbenchServerApp settings with `indirect` parametrization. A test module takes it by importing it."""
    monkeypatch.delenv("WORKBENCH_TRACES", raising=False)
    return server_config(**getattr(request, "param", {}))


class Api:
    """Calls to the test server, running its event loop until each reply."""

    def __init__(self, client, base_url: str, auth: dict[str, str], loop: asyncio.AbstractEventLoop) -> None:
        self.client, self.base_url, self.auth, self.loop = client, base_url, auth, loop

    def raw(self, method: str, path: str, body: Any = None, *, token: bool = True):
        """`method` on `<base_url>/workbench/<path>`, the path sent exactly as given (escapes included)."""
        data = None if body is None else body if isinstance(body, (str, bytes)) else json.dumps(body)
        if data is None and method in ("POST", "PUT"):
            data = b""
        return self.loop.run_until_complete(self.client.fetch(
            url_path_join(self.base_url, "workbench", path), method=method, body=data,
            headers=dict(self.auth) if token else {}, raise_error=False, follow_redirects=False,
            allow_nonstandard_methods=True))

    def call(self, method: str, path: str, body: Any = None, *, token: bool = True) -> tuple[int, Any]:
        """An API call: its status code and JSON reply."""
        response = self.raw(method, f"api/{path}", body, token=token)
        assert response.headers["Content-Type"].startswith("application/json"), response.body[:200]
        return response.code, json.loads(response.body)

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        code, reply = self.call(method, path, body)
        assert code == status, reply
        return reply

    def sleep(self, seconds: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(seconds))

    def wait_job(self, job_id: str, until, what: str) -> dict[str, Any]:
        """Poll the job until `until(job)` holds (a safety cap, not a timing check: about 3 minutes)."""
        for _ in range(1800):
            job = self.ok("GET", f"jobs/{job_id}")
            if until(job):
                return job
            self.sleep(0.1)
        pytest.fail(f"job {job_id} never {what}: {job}")


def make_run(root: Path, run_id: str, trace_dir: Path, variant: str = "eager", p50: float = 1.5,
             experiment: str | None = None) -> str:
    """A bundle with a small GPU-like trace and headline numbers, written as a capture would."""
    trace = read_trace(payload_trace(trace_dir / f"{run_id}.json"))
    info = {"model": {"name": "mlp"}, "variant": {"name": variant}, "device": "cuda:0",
            "benchmark": {"p50": p50, "p99": p50 * 1.2}, "experiment": experiment}
    write_bundle(root, run_id, info, trace)
    return run_id


def is_finished(job: dict[str, Any]) -> bool:
    return job["status"] in ("succeeded", "failed", "cancelled")
