"""XProf tools: xprof's converter on a real `jax.profiler.trace` capture, the XProf server on 127.0.0.1,
and `workbench xprof`."""

from __future__ import annotations

import gzip
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from workbench.cli import main
from workbench.errors import BundleError, TraceFormatError, WorkbenchError
from workbench.profiling import xprof_tools
from workbench.profiling.xprof_tools import DEFAULT_TOOLS, export_tool_data
from workbench.trace.store.bundle import open_bundle, write_bundle
from workbench.xprof_server import LOOPBACK, RUNS_ROUTE, serve_bundle, start_xprof, xprof_command

jax = pytest.importorskip("jax", reason="XProf tools need jax (pip install 'workbench[jax]')")
jnp = pytest.importorskip("jax.numpy")
pytest.importorskip("xprof", reason="XProf tools need xprof (pip install 'workbench[jax]')")

STEPS = 3
STEP_NAME = "xprof_step"
EMPTY_ON_CPU = ("op_profile", "hlo_stats", "roofline_model", "framework_op_stats", "kernel_stats", "memory_profile")


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TensorBoard logdir with one capture of a jitted function, 3 annotated steps."""

    @jax.jit
    def scaled_tanh(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w) * 2 + 1

    x, w = jnp.ones((32, 64)), jnp.full((64, 16), 0.01)
    scaled_tanh(x, w).block_until_ready()  # compile outside the capture
    root = tmp_path_factory.mktemp("xprof_logdir")
    with jax.profiler.trace(str(root)):
        for i in range(STEPS):
            with jax.profiler.StepTraceAnnotation(STEP_NAME, step_num=i):
                scaled_tanh(x, w).block_until_ready()
    return root


@pytest.fixture(scope="module")
def xspace(logdir: Path) -> Path:
    (path,) = logdir.glob("plugins/profile/*/*.xplane.pb")
    return path


@pytest.fixture(scope="module")
def exported(xspace: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("xprof_export") / "xprof"
    return out, export_tool_data(xspace, out)


@pytest.fixture(scope="module")
def module(exported: tuple[Path, dict[str, Any]]) -> str:
    """The HLO module name (`jit_scaled_tanh(N)`) of the captured function."""
    (name,) = [m for m in exported[1]["memory_viewer"]["modules"] if m.startswith("jit_scaled_tanh(")]
    return name


def test_index_lists_every_tool_and_exactly_the_files_written(exported: tuple[Path, dict[str, Any]],
                                                              xspace: Path) -> None:
    out, index = exported
    assert list(index) == list(DEFAULT_TOOLS)
    listed = {f for entry in index.values() for f in entry["files"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert listed == on_disk  # no temporary file left behind, nothing unlisted
    for entry in index.values():
        assert entry["empty"] == (not entry["files"])
    # The converter ran on a copy: nothing was written beside the capture.
    assert sorted(p.name for p in xspace.parent.iterdir()) == sorted(
        [xspace.name, xspace.name.replace(".xplane.pb", ".trace.json.gz")])


def test_trace_viewer_has_the_functions_xla_ops(exported: tuple[Path, dict[str, Any]], xspace: Path) -> None:
    from workbench.trace.xspace.reader import read_xspace

    out, index = exported
    assert index["trace_viewer"] == {"files": ["trace_viewer.json.gz"], "empty": False, "error": None}
    trace = json.loads(gzip.decompress((out / "trace_viewer.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"] if e.get("ph") == "X"}
    events = read_xspace(xspace).events.to_pylist()
    hlo_ops = {r["name"] for r in events if r["kind"] == "hlo"}
    assert hlo_ops and hlo_ops <= names
    assert sum(1 for n in names if n and n.startswith(STEP_NAME)) == STEPS


def test_memory_and_graph_viewer_for_the_module(exported: tuple[Path, dict[str, Any]], module: str) -> None:
    out, index = exported
    assert f"memory_viewer/{module}.json" in index["memory_viewer"]["files"]
    memory = json.loads((out / "memory_viewer" / f"{module}.json").read_text())
    assert memory["moduleName"] == "jit_scaled_tanh" and memory["peakHeapMib"] > 0 and memory["maxHeap"]
    assert {f"graph_viewer/{module}.hlo.txt", f"graph_viewer/{module}.dot"} <= set(index["graph_viewer"]["files"])
    hlo = (out / "graph_viewer" / f"{module}.hlo.txt").read_text()
    assert hlo.startswith("HloModule jit_scaled_tanh") and "ENTRY" in hlo and "tanh" in hlo
    assert (out / "graph_viewer" / f"{module}.dot").read_text().startswith("digraph")
    assert index["graph_viewer"]["error"] is None and module not in index["memory_viewer"]["modules_skipped"]


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="which tools are empty is measured on XLA:CPU")
def test_tools_without_data_on_cpu_are_marked_empty(exported: tuple[Path, dict[str, Any]]) -> None:
    out, index = exported
    for tool in EMPTY_ON_CPU:
        assert index[tool] == {"files": [], "empty": True, "error": None}, tool
        assert not list(out.glob(f"{tool}*"))
    # The annotated steps give the overview page its step-time table.
    assert index["overview_page"]["files"] == ["overview_page.json"]
    tables = json.loads((out / "overview_page.json").read_text())
    (steps,) = [t for t in tables if any(c["id"] == "stepnum" for c in t.get("cols", []))]
    assert len(steps["rows"]) == STEPS


def test_module_cap_keeps_the_modules_that_ran(xspace: Path, module: str, tmp_path: Path) -> None:
    index = export_tool_data(xspace, tmp_path / "out", tools=("memory_viewer",), max_modules=1)
    entry = index["memory_viewer"]
    assert entry["modules"] == [module]  # the only module that ran in the capture
    assert entry["modules_skipped"] and module not in entry["modules_skipped"]
    assert entry["files"] == [f"memory_viewer/{module}.json"]


@pytest.mark.parametrize("content", [os.urandom(4096), b"", b"\x0a\x10\x08" + bytes(range(200))],
                         ids=["random bytes", "empty file", "XSpace-like header"])
def test_not_an_xspace_raises_and_writes_nothing(content: bytes, tmp_path: Path) -> None:
    path = tmp_path / "bad.xplane.pb"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=r"bad\.xplane\.pb"):
        export_tool_data(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.xplane.pb"]


def test_unknown_tool_and_missing_file(xspace: Path, tmp_path: Path) -> None:
    with pytest.raises(WorkbenchError, match=r"unknown XProf tool.*'trace_veiwer'"):
        export_tool_data(xspace, tmp_path / "out", tools=("trace_veiwer",))
    with pytest.raises(TraceFormatError, match="no such XSpace file"):
        export_tool_data(tmp_path / "missing.xplane.pb", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _table(columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"cols": [{"id": c} for c in columns], "rows": [{"c": [{"v": v} for v in row]} for row in rows]}


@pytest.mark.parametrize(("tool", "doc", "empty"), [
    ("hlo_stats", _table(["rank", "hlo_op_name"], []), True),
    ("hlo_stats", _table(["rank", "hlo_op_name"], [[1, "dot.1"]]), False),
    ("hlo_stats", {"something": "else"}, False),  # an unknown shape is kept
    ("framework_op_stats", [_table(["operation"], [["IDLE"]]), _table(["operation"], [])], True),
    ("framework_op_stats", [_table(["operation"], [["IDLE"], ["MatMul"]])], False),
    ("overview_page", [_table(["operation"], []), _table(["stepnum"], []), _table(["tip_type"], [["faq"]])], True),
    ("overview_page", [_table(["operation"], []), _table(["stepnum"], [["step 0"]])], False),
    ("op_profile", {"byProgram": {"children": []}, "byCategory": {"children": []}}, True),
    ("op_profile", {"byProgram": {"children": [{"name": "jit_f"}]}}, False),
    ("memory_profile", {"memoryProfilePerAllocator": {}}, True),
    ("memory_profile", {"memoryProfilePerAllocator": {"GPU_0_bfc": {}}}, False),
    ("trace_viewer", {"traceEvents": [{"ph": "M", "name": "process_name"}, {}]}, True),
    ("trace_viewer", {"traceEvents": [{"ph": "M"}, {"ph": "X", "name": "dot"}]}, False),
])
def test_empty_results_by_tool(tool: str, doc: Any, empty: bool) -> None:
    for text in (json.dumps(doc), json.dumps(doc, separators=(",", ":"))):
        assert xprof_tools._TOOLS[tool].empty(text.encode()) is empty


# The XProf server --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def jax_bundle(logdir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A traces root holding one bundle whose raw/ has the capture as plugins/profile/<run>/."""
    root = tmp_path_factory.mktemp("traces")
    write_bundle(root, "jax-run", {"model": "scaled_tanh"}, raw_files=[logdir / "plugins"])
    return root, "jax-run"


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return response.status, body


def _listening(pid: int) -> set[tuple[str, int]]:
    psutil = pytest.importorskip("psutil")
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_xprof_serves_the_bundle_on_loopback_only(jax_bundle: tuple[Path, str], logdir: Path) -> None:
    root, run_id = jax_bundle
    bundle = open_bundle(run_id, root)
    raw_before = sorted(p.relative_to(bundle.path) for p in bundle.path.rglob("*"))
    (capture_run,) = [p.name for p in (logdir / "plugins" / "profile").iterdir()]
    with serve_bundle(bundle) as server:
        port = int(server.url.rsplit(":", 1)[1].strip("/"))
        assert server.url == f"http://127.0.0.1:{port}/"
        assert _listening(server.process.pid) == {(LOOPBACK, port)}  # no wildcard socket, no gRPC port
        status, page = _get(server.url)
        assert status == 200 and b"<html" in page.lower()
        status, runs = _get(server.url + RUNS_ROUTE.lstrip("/"))
        assert json.loads(runs) == [capture_run]
        status, tools = _get(f"{server.url}data/plugin/profile/run_tools?run={capture_run}")
        assert {"trace_viewer@", "memory_viewer", "graph_viewer"} <= set(json.loads(tools))
    assert server.process.returncode is not None and not server.log.exists()
    server.stop()  # idempotent
    # XProf wrote its caches into the temporary logdir, not into the bundle.
    assert sorted(p.relative_to(bundle.path) for p in bundle.path.rglob("*")) == raw_before


def test_a_server_that_cannot_bind_is_reported_with_its_log(logdir: Path) -> None:
    with socket.socket() as taken:
        taken.bind((LOOPBACK, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(WorkbenchError, match=r"exited with code .*(?s:.*)in use"):
            start_xprof(logdir, port, timeout_s=60)


def test_command_binds_loopback_and_missing_logdir_is_an_error(tmp_path: Path) -> None:
    command = xprof_command(tmp_path, 1234)
    assert command[:3] == [sys.executable, "-m", "workbench.xprof_server"]
    assert command[command.index("--host") + 1] == "127.0.0.1" and command[command.index("--port") + 1] == "1234"
    with pytest.raises(WorkbenchError, match="not a folder"):
        start_xprof(tmp_path / "missing")


def test_cli_xprof_on_a_run_without_xspace_exits_2(tmp_path: Path) -> None:
    trace = tmp_path / "kineto.json"
    trace.write_text(json.dumps({"traceEvents": []}))
    write_bundle(tmp_path / "traces", "torch-run", {}, raw_files=[trace])
    result = CliRunner().invoke(main, ["xprof", "torch-run", "--no-browser", "--out", str(tmp_path / "traces")])
    assert result.exit_code == 2
    assert "not captured with JAX" in result.stderr
    with pytest.raises(BundleError, match="no XSpace"):
        serve_bundle(open_bundle("torch-run", tmp_path / "traces"))


def test_cli_xprof_serves_until_interrupted(jax_bundle: tuple[Path, str]) -> None:
    psutil = pytest.importorskip("psutil")
    root, run_id = jax_bundle
    cli = subprocess.Popen([sys.executable, "-c", "from workbench.cli import main; main()", "xprof", run_id,
                            "--no-browser", "--out", str(root)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        url = _first_line(cli, timeout_s=120)
        assert url.startswith("http://127.0.0.1:"), url
        status, runs = _get(url + RUNS_ROUTE.lstrip("/"))
        assert status == 200 and len(json.loads(runs)) == 1
        children = psutil.Process(cli.pid).children(recursive=True)
        assert children
        cli.send_signal(signal.SIGINT)
        assert cli.wait(60) == 130
        _, stderr = cli.communicate()
        assert b"interrupted" in stderr
        _, alive = psutil.wait_procs(children, timeout=30)
        assert not alive  # the XProf child was stopped with the CLI
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()


def _first_line(process: subprocess.Popen[bytes], timeout_s: float) -> str:
    """The first line the process prints on stdout (failing with its stderr if it exits first)."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    line = b""
    while not line.endswith(b"\n"):
        if time.monotonic() > deadline:
            pytest.fail(f"no URL printed within {timeout_s} s")
        if selector.select(timeout=1):
            chunk = os.read(process.stdout.fileno(), 1)
            if not chunk:
                stderr = process.stderr.read().decode() if process.stderr else ""
                pytest.fail(f"the CLI exited with {process.wait()} before printing a URL: {stderr}")
            line += chunk
    return line.decode().strip()
