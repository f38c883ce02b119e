"""Shared test helpers: where the real-trace fixtures live, a writer for tiny inline traces, and fsspec's
memory filesystem emptied around a test."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
import pytest

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"


def fixture_path(*parts: str) -> Path:
    """Path of a shared real-trace fixture; skips the test where shared/ is absent (a user's clone)."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared fixture {path} not present (it lives beside the repository, in ../shared)")
    return path


def load_raw(path: Path) -> dict[str, Any]:
    """The raw JSON of a (gzipped) Chrome trace, for checking readers against it."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    """Write a Kineto-style object-form trace with the given events and top-level keys."""
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    path.write_text(json.dumps(doc, indent=1))
    return path


TINY_CAPTURE = ["--model", "tiny-gpt", "--set", "d_model=32", "--set", "layers=1", "--set", "heads=2",
                "--batch", "2", "--seq", "8", "--iterations", "3", "--warmup", "1"]
"""`workbench capture` options for a model small enough to capture in seconds."""

PAYLOADS = ("<img src=x onerror=alert(1)>", "</script><script>window.__pwned = 1</script>")
"""Script-injection attempts used as op and kernel names."""


def payload_trace(path: Path) -> Path:
    """A small GPU-like trace whose op and kernel names are the `PAYLOADS`."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": PAYLOADS[0], "pid": 1, "tid": 1, "ts": 100, "dur": 50,
         "args": {"External id": 1, "Input Dims": [[2, 2]]}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110, "dur": 5,
         "args": {"correlation": 9}},
        {"ph": "X", "cat": "kernel", "name": PAYLOADS[1], "pid": 0, "tid": 7, "ts": 120, "dur": 20,
         "args": {"correlation": 9, "device": 0, "stream": 7}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 112,
         "args": {"Device Type": 1, "Device Id": 0, "Addr": 4096, "Bytes": 256, "Total Allocated": 256}},
    ]
    return write_trace(path, events)


def payload_report(tmp_path: Path) -> Path:
    """Import `payload_trace` and write its HTML report with the CLI; return the report's path."""
    import json

    from click.testing import CliRunner

    from workbench.cli import main

    runner = CliRunner()
    root = tmp_path / "payload-traces"
    imported = runner.invoke(main, ["import", str(payload_trace(tmp_path / "evil.json")), "--out", str(root), "--json"])
    (run_id,) = json.loads(imported.stdout)
    report = tmp_path / "evil.html"
    written = runner.invoke(main, ["report", run_id, "--out", str(root), "-o", str(report)])
    assert written.exit_code == 0, written.output
    return report


@contextmanager
def emptied_memory(*folders: str) -> Iterator[fsspec.AbstractFileSystem]:
    """fsspec's memory filesystem (one per process, shared by every test) with `folders` removed before and
    after, so a test meets none of another's files and leaves none behind."""
    fs = fsspec.filesystem("memory")

    def empty() -> None:
        for folder in folders:
            if fs.exists(folder):
                fs.rm(folder, recursive=True)

    empty()
    try:
        yield fs
    finally:
        empty()


def json_item_figures(item: Any) -> dict[str, dict[str, Any]]:
    """The Bokeh figures of a json_item by their title's text: their attributes."""
    found: dict[str, dict[str, Any]] = {}
    pending = [item]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            attributes = node.get("attributes") if isinstance(node.get("attributes"), dict) else {}
            title = attributes.get("title")
            if node.get("name") == "Figure" and isinstance(title, dict):
                found[title.get("attributes", {}).get("text", "")] = attributes
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return found
