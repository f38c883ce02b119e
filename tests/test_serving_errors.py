"""Bad input to `workbench serve` and to the import of load generators' results: each gives one clear line and
the exit code it should (2 misuse, 1 a failed run), keeps the requests that completed, leaves no half bundle, and
stops every process it started.

The servers here are small HTTP servers on 127.0.0.1 that misbehave on purpose (not OpenAI-compatible, answering
errors, streaming malformed chunks); the engines are programs that die or never become ready. The real engine is
in test_serving_live.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import psutil
import pytest

from workbench.trace.store.bundle import list_bundles, open_bundle

DATA = Path(__file__).parent / "data" / "serving" / "aiperf"
SERVING = Path(os.environ.get("WORKBENCH_SERVING", Path(__file__).resolve().parents[1] / ".serving"))
AIPERF = SERVING / "aiperf" / "bin" / "aiperf"
needs_aiperf = pytest.mark.skipif(not AIPERF.is_file(), reason=f"no AIPerf in {SERVING}: run `make serving`")


class _Stub(BaseHTTPRequestHandler):
    """/v1/models names one model unless the server is `not_openai`; completions answer as `mode` says."""

    mode = "errors"

    def log_message(self, *args: object) -> None:
        pass

    def _reply(self, code: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/v1/models" and self.mode != "not_openai":
            self._reply(200, json.dumps({"object": "list", "data": [{"id": "stub", "object": "model"}]}).encode())
        elif self.path == "/metrics":
            self._reply(200, b"# no metrics\n", "text/plain")
        else:
            self._reply(404, b"<html>not found</html>", "text/html")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "dies":  # the server goes away after its first answer: later requests are refused
            threading.Thread(target=lambda: (self.server.shutdown(), self.server.server_close())).start()
        if self.mode == "malformed":
            body = b'data: {"id": "x", "choices": [{"text": "w1", "ind\n\ndata: [DONE]\n\n'
            self._reply(200, body, "text/event-stream")
        else:
            self._reply(500, json.dumps({"error": {"message": "stub overloaded", "type": "InternalServerError",
                                                   "code": 500}}).encode())


@contextmanager
def stub_server(mode: str = "errors") -> Iterator[str]:
    """A `_Stub` answering as `mode` says, on 127.0.0.1, for the block: its URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), type(f"Stub_{mode}", (_Stub,), {"mode": mode}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def stub() -> Iterator[callable]:
    with ExitStack() as servers:
        yield lambda mode: servers.enter_context(stub_server(mode))


@pytest.fixture
def tokenizer(tmp_path: Path) -> Path:
    """A tokenizer folder built in code (the generator counts prompt tokens with it)."""
    from workbench.serving.model_folder import word_tokenizer

    folder = tmp_path / "tokenizer"
    word_tokenizer(64).save_pretrained(folder)
    return folder


def _workbench(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def _one_error_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_url_that_is_not_an_openai_server_is_refused(stub, tokenizer: Path, tmp_path: Path):
    done = _workbench("serve", "--url", stub("not_openai"), "--tokenizer", str(tokenizer), "--out", str(tmp_path))
    assert done.returncode == 2
    assert "not an OpenAI-compatible server (GET /v1/models answered 404" in _one_error_line(done)
    assert not tmp_path.joinpath("traces").exists() and not list_bundles(tmp_path)


def test_a_url_where_nothing_listens_is_refused(tokenizer: Path, tmp_path: Path):
    from workbench.serving.engine import free_port

    done = _workbench("serve", "--url", f"http://127.0.0.1:{free_port()}", "--tokenizer", str(tokenizer),
                      "--out", str(tmp_path))
    assert done.returncode == 2 and "no server answers" in _one_error_line(done)


@pytest.mark.parametrize("argv, message", [
    (["--rate", "1", "--concurrency", "2"], "give --rate or --concurrency, not both"),
    (["--rate", "0"], "give positive, finite numbers"),
    (["--profile-window", "requests:x"], "give load, off, requests:N or seconds:S"),
    (["--slo", "ttft=fast"], "--slo"),
    (["--url", "http://127.0.0.1:9", "--set", "layers=2"], "--set applies to an engine the workbench launches"),
    (["--url", "http://127.0.0.1:9", "--engine-python", "python"], "--engine-python with --url names the Python"),
    (["--profile-dir", "/tmp"], "--profile-dir applies to --url"),
])
def test_misuse_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path):
    done = _workbench("serve", *argv, "--out", str(tmp_path))
    assert done.returncode == 2 and message in _one_error_line(done), done.stderr


def _model_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    return folder


def test_an_engine_that_dies_before_it_is_ready_is_quoted(tmp_path: Path):
    engine = tmp_path / "engine"
    engine.write_text("#!/bin/sh\necho 'loading the model'\necho 'RuntimeError: no kernel image for this device' >&2\n"
                      "exit 3\n")
    engine.chmod(0o755)
    done = _workbench("serve", "--engine-python", str(engine), "--model", f"hf:{_model_folder(tmp_path)}",
                      "--out", str(tmp_path / "traces"))
    assert done.returncode == 2
    assert "vllm exited with code 3 before it was ready" in done.stderr
    assert "RuntimeError: no kernel image for this device" in done.stderr  # its last log lines, quoted
    assert not list_bundles(tmp_path / "traces")


def test_an_engine_that_never_becomes_ready_is_stopped(tmp_path: Path):
    pid_file = tmp_path / "engine.pid"
    engine = tmp_path / "engine"
    engine.write_text(f"#!/bin/sh\necho 'waiting for a GPU'\nsleep 600 &\necho $$ $! > {pid_file}\nwait\n")
    engine.chmod(0o755)
    done = _workbench("serve", "--engine-python", str(engine), "--model", f"hf:{_model_folder(tmp_path)}",
                      "--ready-timeout", "3", "--out", str(tmp_path / "traces"))
    assert done.returncode == 2 and "was not ready after 3 s" in done.stderr and "waiting for a GPU" in done.stderr
    for pid in map(int, pid_file.read_text().split()):  # the engine and the worker it started
        deadline = time.monotonic() + 10
        while _running(pid):
            assert time.monotonic() < deadline, f"process {pid} was left running"
            time.sleep(0.2)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@needs_aiperf
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["errors", "malformed", "dies"])
def test_a_server_that_fails_its_requests_keeps_them_counted_with_their_error(stub, mode: str, tokenizer: Path,
                                                                              tmp_path: Path):
    done = _workbench("serve", "--url", stub(mode), "--tokenizer", str(tokenizer), "--aiperf", str(AIPERF),
                      "--requests", "4", "--rate", "20", "--isl", "8", "--osl", "4", "--out", str(tmp_path), "--json")
    assert done.returncode == 1, done.stderr  # a run with failed requests
    (point,) = json.loads(done.stdout)["runs"]
    requests = open_bundle(point["run"], tmp_path).table("requests").to_pylist()
    assert len(requests) == 4 and point["summary"]["failed"] == 4 and point["summary"]["ok"] == 0
    assert all(r["status"] == "error" and r["error"] for r in requests)
    if mode == "errors":
        assert all("stub overloaded" in r["error"] for r in requests)
    if mode == "dies":
        assert any("the server stopped answering during the load" in w for w in point["warnings"])
    assert point["errors"] and sum(point["errors"].values()) == 4  # each failed request counted with its error


def test_a_truncated_generator_file_keeps_its_complete_requests(tmp_path: Path):
    lines = (DATA / "profile_export.jsonl").read_bytes().splitlines(keepends=True)
    cut = tmp_path / "profile_export.jsonl"
    cut.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    done = _workbench("import", str(cut), "--out", str(tmp_path / "traces"), "--json")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())  # the warning is wrapped to the terminal's width
    assert "line 24 is cut short (the file was truncated)" in said and str(cut) in said
    (run,) = json.loads(done.stdout)
    assert open_bundle(run, tmp_path / "traces").table("requests").num_rows == len(lines) - 1


def test_a_generator_file_of_another_kind_is_refused_whole(tmp_path: Path):
    other = tmp_path / "results.json"
    other.write_text(json.dumps({"duration": 3.0, "completed": 4, "request_throughput": 1.3}))
    done = _workbench("import", str(other), "--out", str(tmp_path / "traces"))
    assert done.returncode == 2 and str(other) in _one_error_line(done) and "--save-detailed" in done.stderr
    assert not list_bundles(tmp_path / "traces")
