"""Misusing the CLI: every mistake ends in exit code 2 and one line on stderr that says what is wrong,
before any work and with nothing written; text from users or files is printed as it is, never as markup."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from conftest import TINY_CAPTURE, write_trace

from workbench.cli import main
from workbench.limits import MAX_BATCH, MAX_ITERATIONS, MAX_MODEL_DIM, MAX_SEQ, MAX_THREADS, MAX_WARMUP
from workbench.trace.store.bundle import write_bundle

TOO_LONG = "r" * 300
"""A run id (and a file name) longer than any file system takes."""


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return write_trace(tmp_path / "trace.json", [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1,
                                                  "tid": 1, "ts": 0, "dur": 10}])


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "somefile"
    path.write_text("not a folder")
    return path


def _invoke(*args: object, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def _one_line_error(result: Result, *fragments: str) -> None:
    """Exit code 2, one line on stderr starting `error:` and holding every fragment, no traceback."""
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.exception is None or isinstance(result.exception, SystemExit)


def _written(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


@pytest.mark.parametrize(("args", "fragments"), [
    (["--batch", MAX_BATCH + 1], ["batch", f"at most {MAX_BATCH}", str(MAX_BATCH + 1)]),
    (["--seq", MAX_SEQ + 1], ["seq", f"at most {MAX_SEQ}"]),
    (["--iterations", MAX_ITERATIONS + 1], ["iterations", f"at most {MAX_ITERATIONS}"]),
    (["--warmup", MAX_WARMUP + 1], ["warmup", f"at most {MAX_WARMUP}"]),
    (["--threads", MAX_THREADS + 1], ["threads", f"at most {MAX_THREADS}"]),
    (["--set", f"hidden={MAX_MODEL_DIM + 1}"], ["hidden", f"at most {MAX_MODEL_DIM}"]),
    (["--set", "d_model=1e400"], ["d_model", f"at most {MAX_MODEL_DIM}", "inf"]),
    (["--batch", "0"], ["--batch", "x>=1"]),
    (["--set", "layers"], ["KEY=VALUE"]),
    (["--no-such-option"], ["--no-such-option", "capture --help"]),
])
def test_capture_misuse_fails_before_any_work(tmp_path: Path, args: list[object], fragments: list[str]) -> None:
    root = tmp_path / "traces"
    _one_line_error(_invoke("capture", *args, "--out", root), *fragments)
    assert not root.exists()


@pytest.mark.parametrize(("args", "fragments"), [
    (["--batch", f"1,{MAX_BATCH + 1}"], ["batch", f"at most {MAX_BATCH}"]),
    (["--repeats", MAX_ITERATIONS + 1], ["--repeats", str(MAX_ITERATIONS)]),
    (["--threads", MAX_THREADS + 1], ["threads", f"at most {MAX_THREADS}"]),
    (["--set", f"max_seq={MAX_MODEL_DIM * 2}"], ["max_seq", f"at most {MAX_MODEL_DIM}"]),
])
def test_generate_misuse_fails_before_any_work(tmp_path: Path, args: list[object], fragments: list[str]) -> None:
    root = tmp_path / "traces"
    _one_line_error(_invoke("generate", *args, "--out", root), *fragments)
    assert not root.exists()


def test_traces_root_that_is_a_file_is_refused_by_every_command(tmp_path: Path, a_file: Path,
                                                                 trace_file: Path) -> None:
    env = {"WORKBENCH_TRACES": str(a_file)}
    for args in (["ls"], ["show", "run-1"], ["report", "run-1"], ["rm", "run-1"], ["import", trace_file],
                 ["import", "--ranks", tmp_path], ["capture", *TINY_CAPTURE], ["generate"]):
        _one_line_error(_invoke(*args, env=env), f"traces root {a_file}", "WORKBENCH_TRACES", "not a folder")
    _one_line_error(_invoke("import", trace_file, "--out", a_file / "traces"), f"lies under {a_file}")
    assert a_file.read_text() == "not a folder"


def test_traces_root_named_too_long_is_refused(tmp_path: Path, trace_file: Path) -> None:
    _one_line_error(_invoke("import", trace_file, "--out", tmp_path / TOO_LONG), "File name too long")
    _one_line_error(_invoke("ls", "--out", tmp_path / TOO_LONG), "File name too long")


def test_ids_too_long_for_the_file_system(tmp_path: Path, trace_file: Path) -> None:
    root = tmp_path / "traces"
    assert _invoke("import", trace_file, "--out", root).exit_code == 0
    for command in ("show", "rm", "report", "analyze", "cost"):
        _one_line_error(_invoke(command, TOO_LONG, "--out", root), TOO_LONG)
    assert len(_written(root)) == 1


def test_output_under_a_file_or_too_long_is_refused_before_the_work(tmp_path: Path, a_file: Path,
                                                                  trace_file: Path) -> None:
    root = tmp_path / "traces"
    (run_id,) = json.loads(_invoke("import", trace_file, "--out", root, "--json").stdout)
    _one_line_error(_invoke("report", run_id, "--out", root, "-o", a_file / "report.html"),
                    f"output file {a_file / 'report.html'}", f"lies under {a_file}")
    _one_line_error(_invoke("report", run_id, "--out", root, "-o", tmp_path / f"{TOO_LONG}.html"),
                    "File name too long")
    _one_line_error(_invoke("capture", *TINY_CAPTURE, "--out", root, "--report", a_file / "r.html"),
                    f"lies under {a_file}")
    assert _written(root) == [run_id]


def test_a_fifo_is_refused_as_a_trace(tmp_path: Path) -> None:
    fifo = tmp_path / "trace.json"
    os.mkfifo(fifo)  # reading it would block for ever
    root = tmp_path / "traces"
    _one_line_error(_invoke("import", fifo, "--out", root), str(fifo), "a FIFO")
    assert not root.exists()


def test_unknown_command_is_one_line() -> None:
    _one_line_error(_invoke("frobnicate"), "No such command 'frobnicate'")


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, "No space left on device"),
                                   OSError("IOError: [Errno 28] No space left on device")])  # Arrow's: no errno
def test_disk_full_while_importing_says_so(tmp_path: Path, trace_file: Path, monkeypatch: pytest.MonkeyPatch,
                                           error: OSError) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(pq, "write_table", full)
    root = tmp_path / "traces"
    _one_line_error(_invoke("import", trace_file, "--out", root), f"no space left on device writing {root}")
    assert _written(root) == []


def test_disk_full_while_capturing_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write_text = Path.write_text

    def full_for_run_json(self: Path, *args: object, **kwargs: object) -> int:
        if self.name == "run.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_for_run_json)
    root = tmp_path / "traces"
    result = _invoke("capture", *TINY_CAPTURE, "--variants", "eager", "--json", "--out", root)
    _one_line_error(result, f"no space left on device writing {root}")
    assert _written(root) == []


MARKUP = {"model": {"name": "[/x]model"}, "variant": {"name": "[red]variant"}, "device": "[bold]cpu",
          "status": "failed", "error": "broke [/] at [link=x]here"}


def test_markup_in_paths_and_run_json_is_printed_as_it_is(tmp_path: Path, trace_file: Path) -> None:
    root = tmp_path / "[red]traces[/x]"
    (run_id,) = json.loads(_invoke("import", trace_file, "--out", root, "--json").stdout)
    write_bundle(root, "marked", MARKUP)

    listed = _invoke("ls", "--out", root)
    assert listed.exit_code == 0, listed.output
    for text in (str(root), "[/x]model", "[red]variant", "[bold]cpu", run_id):
        assert text in listed.stdout
    shown = _invoke("show", "marked", "--out", root)
    assert shown.exit_code == 0, shown.output
    assert "[/x]model" in shown.stdout and "error: broke [/] at [link=x]here" in shown.stderr
    reported = _invoke("report", "marked", run_id, "--out", root, "-o", tmp_path / "report.html")
    assert reported.exit_code == 0, reported.output
    _one_line_error(_invoke("show", "[/x]", "--out", root), "no run '[/x]'", str(root))
