"""The panel's trace export route (`GET runs/<id>/export`, `workbench.server.export_handlers`) through a real Jupyter
server (pytest-jupyter): authenticated; a bad format is a 400, an id that is no run id a 400, a link out of the traces
root a 422, a run without a trace a 422, none of them naming a path of the server; an imported Kineto fixture comes
back as an attachment in either format whose bytes read back (`read_trace`) with the fixture's kernels, counted and
timed from the raw file, and the temporary file it was written to is gone."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("jupyter_server", reason="jupyter_server is not installed (pip install -e .[lab])")
pytest.importorskip("pytest_jupyter", reason="pytest-jupyter is not installed (pip install -e .[test])")

import test_server
from conftest import fixture_path
from pytest_jupyter.jupyter_server import *  # noqa: F403
from server_api import jp_server_config, make_run  # noqa: F401 (jp_server_config: a fixture)

from workbench.imports import import_traces
from workbench.trace.registry import read_trace
from workbench.trace.store.bundle import write_bundle

api = test_server.api
"""The API client fixture of the server tests (its server is configured here, by `jp_server_config`)."""

FIXTURE = ("kineto", "amd_mi250_train.json.gz")
"""A small ROCm training trace: 14 kernels."""
SUFFIX = {"perfetto": ".perfetto-trace", "chrome": ".json"}


@pytest.fixture
def run(jp_root_dir) -> str:
    """The fixture imported into the server's traces root."""
    (run_id,) = import_traces([fixture_path(*FIXTURE)], jp_root_dir / "traces")
    return run_id


def raw_kernels() -> list[float]:
    """The durations (µs, as written) of the fixture's kernel records."""
    with gzip.open(fixture_path(*FIXTURE), "rt") as f:
        events = json.load(f)["traceEvents"]
    return [event["dur"] for event in events if event.get("ph") == "X" and event.get("cat") == "kernel"]


def _exports() -> set[str]:
    """The export folders of the temporary folder now."""
    return {path.name for path in Path(tempfile.gettempdir()).glob("workbench-export-*")}


def test_the_route_refuses_requests_without_a_token(api, run):
    response = api.raw("GET", f"api/runs/{run}/export", token=False)
    assert response.code == 403
    assert json.loads(response.body)["message"]


@pytest.mark.parametrize(("path", "status", "message"), [
    ("RUN/export?format=pdf", 400, "format: expected perfetto or chrome, got 'pdf'"),
    ("RUN/export?format=", 400, "format: expected perfetto or chrome, got ''"),
    ("RUN/export?critical_path=yes", 400, "critical_path: expected 0 or 1, got 'yes'"),
    ("..%2F..%2Fetc/export", 400, "'../../etc' is not a run id"),
    ("no-such-run/export", 404, "no run 'no-such-run' in the traces root"),
])
def test_bad_requests_are_refused_with_their_message(api, run, jp_root_dir, path, status, message):
    code, reply = api.call("GET", "runs/" + path.replace("RUN", run))
    assert code == status, reply
    assert message in reply["message"]
    assert str(jp_root_dir) not in reply["message"]


def test_a_run_outside_the_root_or_without_a_trace_is_refused(api, jp_root_dir, tmp_path):
    traces = jp_root_dir / "traces"
    make_run(tmp_path / "elsewhere", "victim", tmp_path)
    traces.mkdir()
    (traces / "escape").symlink_to(tmp_path / "elsewhere" / "victim", target_is_directory=True)
    code, reply = api.call("GET", "runs/escape/export")
    assert code == 422 and "leads outside the traces root" in reply["message"], reply
    write_bundle(traces, "no-trace", {"model": {"name": "mlp"}, "status": "failed", "error": "out of memory"})
    code, reply = api.call("GET", "runs/no-trace/export?format=chrome")
    assert code == 422 and "has no trace" in reply["message"], reply
    for text in (str(tmp_path), str(jp_root_dir)):
        assert text not in reply["message"]


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_the_download_reads_back_with_the_runs_kernels(api, run, tmp_path, fmt):
    before = _exports()
    response = api.raw("GET", f"api/runs/{run}/export?format={fmt}")
    assert response.code == 200, response.body[:300]
    assert response.headers["Content-Disposition"] == f'attachment; filename="{run}{SUFFIX[fmt]}"'
    expected_type = "application/json" if fmt == "chrome" else "application/octet-stream"
    assert response.headers["Content-Type"] == expected_type
    assert int(response.headers["Content-Length"]) == len(response.body)
    downloaded = tmp_path / f"{run}{SUFFIX[fmt]}"
    downloaded.write_bytes(response.body)
    trace = read_trace(downloaded)
    events = trace.events.select(["kind", "dur_ns"]).to_pandas()
    kernels = events[events["kind"].astype(str) == "kernel"]
    durations = raw_kernels()
    assert len(kernels) == len(durations) == 14
    assert int(kernels["dur_ns"].sum()) == round(sum(durations) * 1e3)
    assert _exports() == before  # the temporary file went with the reply


def test_the_download_can_carry_the_critical_path(api, run, tmp_path):
    response = api.raw("GET", f"api/runs/{run}/export?format=perfetto&critical_path=1")
    assert response.code == 200, response.body[:300]
    downloaded = tmp_path / f"{run}.perfetto-trace"
    downloaded.write_bytes(response.body)
    events = read_trace(downloaded).events.select(["kind", "track", "dur_ns"]).to_pandas()
    on_path = events[events["track"].astype(str).str.contains("critical path", regex=False)]
    assert len(on_path) and (on_path["kind"].astype(str) == "annotation").all()
    assert len(events[events["kind"].astype(str) == "kernel"]) == len(raw_kernels())
