"""What the command line loads: the commands that only read or import traces never import a framework (torch,
jax, onnxruntime), and `--help` loads none of the heavy libraries. Each check runs the command in a fresh child
process (its `sys.modules` starts empty, whatever this test process has imported) and reads what it loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import write_trace

from workbench.cli import main
from workbench.imports import import_traces
from workbench.rank_import import import_rank_job

FRAMEWORKS = ("torch", "jax", "onnxruntime")
"""What a command over traces never imports."""

HEAVY = (*FRAMEWORKS, "pandas", "pyarrow", "bokeh", "duckdb", "tensorrt", "transformers")
"""What `--help` never imports."""

CHILD = """
import json, sys
from click.testing import CliRunner
from workbench.cli import main

watched = json.loads(sys.argv[1])
for args in json.loads(sys.argv[2]):
    result = CliRunner().invoke(main, args)
    print(json.dumps({"args": args, "exit_code": result.exit_code, "output": result.output,
                      "loaded": [name for name in watched if name in sys.modules]}), flush=True)
"""
"""Runs each command line given (a JSON list of argument lists) in turn, printing per command one JSON line: its
exit code, its output and which of the watched modules (a JSON list) are loaded once it is done."""


def _run(invocations: list[list[str]], watched: tuple[str, ...]) -> list[dict[str, Any]]:
    """The child's report of each invocation, in order."""
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(watched), json.dumps(invocations)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _events(rank: int | None = None) -> list[dict[str, Any]]:
    """A host op launching a kernel (GPU-like, with a memory event); with `rank`, a step and an NCCL
    collective on that rank too."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 100, "dur": 50,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110, "dur": 5,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 120, "dur": 20,
         "args": {"correlation": 9, "device": 0, "stream": 7}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 112,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 256, "Total Allocated": 256}},
    ]
    if rank is not None:
        events += [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 90,
             "dur": 200 + 50 * rank},
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
             "ts": 150, "dur": 30, "args": {"device": 0, "stream": 20, "correlation": -1}},
        ]
    return events


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> dict[str, Path | str]:
    """A trace file, a folder of two ranks' traces, and a traces root holding the trace imported twice (a run to
    read, a run to delete) and the ranks imported as an experiment."""
    folder = tmp_path_factory.mktemp("cli-imports")
    trace = write_trace(folder / "trace.json", _events())
    job = folder / "job"
    job.mkdir()
    for rank in range(2):
        write_trace(job / f"rank{rank}.json", _events(rank), distributedInfo={"rank": rank, "world_size": 2})
    root = folder / "traces"
    run, doomed = import_traces([trace, trace], root)
    imported = import_rank_job(job, root, workers=1, keep_going=False)
    return {"folder": folder, "trace": trace, "job": job, "root": root, "run": run, "doomed": doomed,
            "experiment": imported.experiment_id}


TRACE_COMMANDS = {
    "import": ["import", "{trace}", "--out", "{folder}/fresh-files", "--json"],
    "import --ranks": ["import", "--ranks", "{job}", "--out", "{folder}/fresh-ranks", "--json"],
    "ls": ["ls", "--out", "{root}", "--json"],
    "show": ["show", "{run}", "--out", "{root}"],
    "query": ["query", "{run}", "SELECT count(*) AS n FROM events", "--out", "{root}", "--json"],
    "report": ["report", "{run}", "--out", "{root}", "-o", "{folder}/report.html"],
    "diff": ["diff", "{run}", "{run}", "--out", "{root}", "--json"],
    "analyze": ["analyze", "{run}", "--out", "{root}"],
    "cost": ["cost", "{run}", "--out", "{root}", "--json"],
    "ranks": ["ranks", "{experiment}", "--out", "{root}", "--json"],
    "rm": ["rm", "{doomed}", "--out", "{root}"],
}
"""The commands that only read, import or delete traces, as argument templates over the `traces` fixture."""


@pytest.mark.parametrize("command", list(TRACE_COMMANDS))
def test_trace_commands_never_import_a_framework(command: str, traces: dict[str, Path | str]) -> None:
    args = [arg.format(**traces) for arg in TRACE_COMMANDS[command]]
    (report,) = _run([args], FRAMEWORKS)
    assert report["exit_code"] == 0, report["output"]
    assert report["loaded"] == [], f"`workbench {command}` imported {report['loaded']}"


def test_help_imports_no_heavy_library() -> None:
    invocations = [["--help"], ["--version"], *([name, "--help"] for name in sorted(main.commands))]
    reports = _run(invocations, HEAVY)
    assert len(reports) == len(invocations)
    for report in reports:
        assert report["exit_code"] == 0, report["output"]
        assert report["loaded"] == [], f"`workbench {' '.join(report['args'])}` imported {report['loaded']}"
