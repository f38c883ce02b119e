"""Run bundles and experiment records on disk: round trips, atomicity, id safety, listing."""

from __future__ import annotations

import errno
import json
import math
import os
import re
from datetime import datetime
from enum import Enum
from pathlib import Path

import numpy as np
import pandas.testing as pdt
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workbench.errors import BundleError, DiskFullError
from workbench.paths import traces_root
from workbench.trace import schema
from workbench.trace.model import Trace
from workbench.trace.store import bundle as bundle_module
from workbench.trace.store.bundle import (
    BundleWarning,
    delete_bundle,
    is_valid_run_id,
    json_safe,
    list_bundles,
    new_run_id,
    open_bundle,
    write_bundle,
)
from workbench.trace.store.experiment import list_experiments, read_experiment, write_experiment


def make_trace() -> Trace:
    """A small trace with every column filled: a step, an op, its launch and the kernel."""
    events = pa.table(
        {
            "start_ns": [0, 100, 150, 400],
            "dur_ns": [1000, 500, 20, 300],
            "name": ["step 0", "aten::mm", "cudaLaunchKernel", "sgemm_128x64"],
            "kind": ["annotation", "op", "runtime", "kernel"],
            "device": ["cpu", "cpu", "cpu", "cuda:0"],
            "track": ["cpu/thread 7", "cpu/thread 7", "cpu/thread 7", "cuda:0/stream 7"],
            "pid": [1, 1, 1, 0],
            "tid": [7, 7, 7, 7],
            "corr": [-1, -1, 42, 42],
            "parent": [-1, 0, 1, -1],
            "depth": [0, 1, 2, 0],
            "launcher": [-1, -1, -1, 1],
            "flops": [math.nan, 2.0e6, math.nan, 2.0e6],
            "bytes": [math.nan, 4096.0, math.nan, 4096.0],
            "shapes": ["", "[[4, 8], [8, 8]]", "", ""],
            "dtypes": ["", "[float, float]", "", ""],
            "args": ["{}", '{"seq": 3}', '{"cbid": 211}', '{"grid": [1, 1, 1]}'],
        }
    ).cast(schema.EVENTS)
    memory = pa.table(
        {"ts_ns": [120, 700], "device": ["cuda:0", "cuda:0"], "addr": [4096, 4096],
         "delta_bytes": [512, -512], "allocated_bytes": [512, 0], "reserved_bytes": [2048, 2048],
         "event": [1, -1]}
    ).cast(schema.MEMORY)
    counters = pa.table(
        {"ts_ns": [0, 500], "device": ["cuda:0", "cuda:0"], "name": ["sm_clock_mhz", "sm_clock_mhz"],
         "value": [1410.0, 1395.0]}
    ).cast(schema.COUNTERS)
    metadata = {"source": {"format": "kineto", "file": "trace.json"}, "skipped": {"metadata": 3},
                "device_properties": {"cuda:0": {"name": "H100", "memory_bytes": 80 * 2**30}}}
    return Trace(events, memory, counters, metadata)


def assert_tables_equal(got: pa.Table, want: pa.Table) -> None:
    """Same schema (dictionary columns included) and same values, NaN equal to NaN."""
    assert got.schema.equals(want.schema)
    pdt.assert_frame_equal(got.to_pandas(), want.to_pandas())


def info(**extra: object) -> dict[str, object]:
    return {"model": "tiny-gpt", "variant": "eager", "device": "cpu", **extra}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "traces"


def test_round_trip(root: Path, tmp_path: Path) -> None:
    kineto = tmp_path / "host.pt.trace.json"
    kineto.write_bytes(b'{"traceEvents": []}\n')
    xprof = tmp_path / "plugins"
    (xprof / "profile" / "run1").mkdir(parents=True)
    (xprof / "profile" / "run1" / "host.xplane.pb").write_bytes(b"\x00\x01")
    trace = make_trace()
    extra = {"bench": {"median_ms": np.float64(1.5), "samples": np.array([1.0, 2.0]), "n": np.int64(3)},
             "numerics": {"max_abs": math.nan, "sqnr_db": math.inf, "low": -math.inf},
             "source": Path("/data/run.json"), "experiment": "exp-1"}
    path = write_bundle(root, "run-1", info(**extra), trace, raw_files=[kineto, xprof])

    assert path == root / "run-1"
    assert sorted(p.name for p in path.iterdir()) == [
        "counters.parquet", "events.index", "events.parquet", "memory.parquet", "raw", "run.json"]
    assert pq.ParquetFile(path / "events.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    loaded = open_bundle("run-1", root)
    got = loaded.info
    assert (got["schema_version"], got["run_id"], got["status"], got["error"]) == (1, "run-1", "ok", None)
    assert (got["model"], got["variant"], got["device"], got["experiment"]) == ("tiny-gpt", "eager", "cpu",
                                                                                "exp-1")
    assert datetime.fromisoformat(got["created"]).utcoffset().total_seconds() == 0
    assert got["bench"] == {"median_ms": 1.5, "samples": [1.0, 2.0], "n": 3}
    assert got["numerics"] == {"max_abs": None, "sqnr_db": "inf", "low": "-inf"}
    assert got["source"] == "/data/run.json"

    assert loaded.has_trace
    back = loaded.trace()
    assert back is loaded.trace()  # read once, then cached
    for name in ("events", "memory", "counters"):
        assert_tables_equal(getattr(back, name), getattr(trace, name))
    assert back.metadata == trace.metadata
    assert back.kind_counts() == trace.kind_counts()

    raw = loaded.raw_files()
    assert [p.relative_to(path / "raw").as_posix() for p in raw] == [
        "host.pt.trace.json", "plugins/profile/run1/host.xplane.pb"]
    assert raw[0].read_bytes() == kineto.read_bytes()
    assert kineto.exists() and xprof.exists()  # copied, not moved


def test_run_without_trace(root: Path) -> None:
    write_bundle(root, "failed-1", info(status="failed", error="RuntimeError: boom"), None)
    loaded = open_bundle("failed-1", root)
    assert (loaded.info["status"], loaded.info["error"]) == ("failed", "RuntimeError: boom")
    assert not loaded.has_trace and loaded.raw_files() == []
    with pytest.raises(BundleError, match="has no trace"):
        loaded.trace()


def test_move_raw(root: Path, tmp_path: Path) -> None:
    src = tmp_path / "trace.json"
    src.write_text("{}")
    path = write_bundle(root, "moved", info(), make_trace(), raw_files=[src], move_raw=True)
    assert not src.exists()
    assert (path / "raw" / "trace.json").read_text() == "{}"


def test_bad_run_info_is_refused_before_writing(root: Path, tmp_path: Path) -> None:
    cases = [
        (info(bench={"samples": [1.0, object()]}), r"\$\.bench\.samples\[1\]: a object"),
        (info(status="maybe"), "status 'maybe'"),
        (info(status="failed"), "needs an error"),
        (info(run_id="other"), "may not set run_id"),
        (info(experiment="../x"), "not a valid id"),
    ]
    for bad, message in cases:
        with pytest.raises(BundleError, match=message):
            write_bundle(root, "bad", bad, make_trace())
    with pytest.raises(BundleError, match="may not set trace"):
        write_bundle(root, "bad", info(trace={}), make_trace())
    with pytest.raises(BundleError, match="does not exist"):
        write_bundle(root, "bad", info(), make_trace(), raw_files=[tmp_path / "nope.json"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "t.json").write_text("{}")
    (tmp_path / "b" / "t.json").write_text("{}")
    with pytest.raises(BundleError, match="collide"):
        write_bundle(root, "bad", info(), None, raw_files=[tmp_path / d / "t.json" for d in "ab"])
    for bad_id in ("", ".hidden", "../x", "a/b", "/etc", "-rf", "experiments", "x" * 129):
        with pytest.raises(BundleError, match="invalid run id"):
            write_bundle(root, bad_id, info(), None)
    assert not root.exists() or list(root.iterdir()) == []
    (tmp_path / "a-file").write_text("")
    with pytest.raises(BundleError, match="cannot write run"):
        write_bundle(tmp_path / "a-file", "run-1", info(), None)


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_failed_write_leaves_nothing(root: Path, monkeypatch: pytest.MonkeyPatch,
                                     error: BaseException) -> None:
    real_write = pq.write_table
    calls = []

    def write_then_fail(table: pa.Table, where: object, **kwargs: object) -> None:
        calls.append(where)
        if len(calls) > 1:
            raise error
        real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", write_then_fail)
    with pytest.raises(BundleError if isinstance(error, OSError) else KeyboardInterrupt):
        write_bundle(root, "run-1", info(), make_trace())
    assert len(calls) == 2
    assert list(root.iterdir()) == []


def test_a_full_disk_is_named_and_leaves_nothing(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    with pytest.raises(DiskFullError, match=re.escape(f"no space left on device writing {root / 'run-1'}")):
        write_bundle(root, "run-1", info(), make_trace())
    assert list(root.iterdir()) == []


def test_temporary_folders_name_their_owner(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    rename = os.rename

    def record(src: Path, dst: Path) -> None:
        seen.append((Path(src).name, Path(dst).name))
        rename(src, dst)

    monkeypatch.setattr(bundle_module.os, "rename", record)
    write_bundle(root, "run-1", info(), None)
    delete_bundle("run-1", root)
    (tmp, _), (_, deleting) = seen  # written as tmp, then renamed to `.deleting-...` to be removed
    assert re.fullmatch(rf"\.tmp-run-1-[0-9a-f]+\.[0-9a-f]+\.{os.getpid()}\.\d+-[0-9a-f]{{8}}", tmp)
    assert re.fullmatch(rf"\.deleting-run-1-[0-9a-f]+\.[0-9a-f]+\.{os.getpid()}\.\d+-[0-9a-f]{{8}}", deleting)
    assert list(root.iterdir()) == []


def test_failed_rename_puts_moved_raw_back(root: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "trace.json"
    src.write_text("{}")

    def no_rename(*args: object) -> None:
        raise OSError("rename refused")

    monkeypatch.setattr(bundle_module.os, "rename", no_rename)
    with pytest.raises(BundleError, match="rename refused"):
        write_bundle(root, "run-1", info(), make_trace(), raw_files=[src], move_raw=True)
    assert src.read_text() == "{}"
    assert list(root.iterdir()) == []


def test_refuses_overwrite(root: Path) -> None:
    write_bundle(root, "run-1", info(variant="eager"), make_trace())
    with pytest.raises(BundleError, match="already exists"):
        write_bundle(root, "run-1", info(variant="bf16"), None)
    assert open_bundle("run-1", root).info["variant"] == "eager"
    assert sorted(p.name for p in root.iterdir()) == ["run-1"]


def test_run_ids() -> None:
    run_id = new_run_id("tiny-gpt", "Compile BF16", "", "my.pkg:factory")
    assert re.fullmatch(r"\d{8}-\d{6}-tiny-gpt-compile-bf16-my\.pkg-factory-[0-9a-f]{4}", run_id)
    assert is_valid_run_id(run_id) and is_valid_run_id(new_run_id())
    assert is_valid_run_id(new_run_id("x" * 300)) and len(new_run_id("x" * 300)) <= 128
    assert len({new_run_id("a") for _ in range(50)}) > 40
    for good in ("a", "run_1", "20261202-174512-tiny-gpt-eager-3f9a", "v1.2", "_x"):
        assert is_valid_run_id(good)
    for bad in ("", ".", "..", ".tmp-x", "-x", "a/b", "a\\b", "../x", "/etc", "a b", "é", "x" * 129,
                "experiments", None, 3):
        assert not is_valid_run_id(bad)


def test_open_by_id_path_and_run_json(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_bundle(root, "run-1", info(), make_trace())
    monkeypatch.chdir(root.parent)
    for ref in ("run-1", path, str(path), "traces/run-1", Path("traces/run-1"), path / "run.json",
                "traces/run-1/run.json"):
        loaded = open_bundle(ref, root)
        assert (loaded.run_id, loaded.path) == ("run-1", path.resolve())
        assert loaded.info["run_id"] == "run-1"
    with pytest.raises(BundleError, match="not a run id"):
        open_bundle(path, root, allow_paths=False)
    with pytest.raises(BundleError, match="File name too long"):
        open_bundle("r" * 300, root)


def test_open_errors_name_the_ref_and_how_to_find_ids(root: Path, tmp_path: Path) -> None:
    write_bundle(root, "good", info(), None)
    (root / "junk").mkdir()
    (root / "broken").mkdir()
    (root / "broken" / "run.json").write_text("{not json")
    (root / "listy").mkdir()
    (root / "listy" / "run.json").write_text("[1, 2]")
    (root / "future").mkdir()
    (root / "future" / "run.json").write_text(json.dumps({"schema_version": 99, "run_id": "future"}))
    cases = {"nope": "no run 'nope'", "junk": "not a run bundle", "broken": "malformed",
             "listy": "not an object", "future": "schema_version 99", str(tmp_path / "nowhere"): "no run"}
    for ref, message in cases.items():
        with pytest.raises(BundleError, match=message) as caught:
            open_bundle(ref, root)
        assert ref in str(caught.value) and "workbench ls" in str(caught.value)


def test_open_rejects_escapes(root: Path, tmp_path: Path) -> None:
    write_bundle(tmp_path, "x", info(), None)  # a real bundle next to the root, at root/../x
    write_bundle(root, "inside", info(), None)
    (root / "alias").symlink_to(root / "inside")
    (root / "escape").symlink_to(tmp_path / "x")
    (root / "loop").symlink_to(root / "loop")

    assert open_bundle("alias", root).path == (root / "inside").resolve()
    for ref in ("escape", "loop"):
        for allow_paths in (True, False):
            with pytest.raises(BundleError):
                open_bundle(ref, root, allow_paths=allow_paths)
    with pytest.raises(BundleError, match="outside"):
        open_bundle("escape", root)
    for ref in (str(root / ".." / "x"), "../x", "/etc", "inside/../../x", "a/b", "", "."):
        with pytest.raises(BundleError, match="not a run id"):
            open_bundle(ref, root, allow_paths=False)
    with pytest.raises(BundleError, match="not a run bundle"):
        open_bundle("/etc", root)


def test_list_skips_junk_and_reports_malformed(root: Path, tmp_path: Path) -> None:
    write_bundle(root, "b-second", info(created="2026-12-02T10:00:00+00:00"), None)
    write_bundle(root, "a-third", info(created="2026-12-02T12:00:00+01:00"), None)  # 11:00 UTC
    write_bundle(root, "c-first", info(created="2026-12-01T00:00:00+00:00"), make_trace())
    for junk in (".tmp-run-9-abcd", ".deleting-run-8-abcd", "experiments"):
        write_bundle(tmp_path / "elsewhere", "copy", info(), None)
        os.rename(tmp_path / "elsewhere" / "copy", root / junk)
    (root / "not-a-bundle").mkdir()
    (root / "stray.txt").write_text("hello")
    (root / "broken").mkdir()
    (root / "broken" / "run.json").write_text("")
    (root / "bad name").mkdir()
    (root / "bad name" / "run.json").write_text(json.dumps({"schema_version": 1}))
    write_bundle(tmp_path, "outside", info(), None)
    (root / "escape").symlink_to(tmp_path / "outside")

    problems: list[tuple[str, str]] = []
    listed = list_bundles(root, on_problem=lambda path, message: problems.append((path.name, message)))
    assert [b.run_id for b in listed] == ["c-first", "b-second", "a-third"]
    assert sorted(name for name, _ in problems) == ["bad name", "broken", "escape"]
    with pytest.warns(BundleWarning) as warned:
        assert len(list_bundles(root)) == 3
    assert len(warned) == 3 and any("broken" in str(w.message) for w in warned)
    assert list_bundles(tmp_path / "missing") == []


def test_delete(root: Path) -> None:
    path = write_bundle(root, "run-1", info(), make_trace())
    write_bundle(root, "run-2", info(), None)
    delete_bundle("run-1", root)
    assert not path.exists()
    assert [b.run_id for b in list_bundles(root)] == ["run-2"]
    delete_bundle(root / "run-2", root)
    assert list(root.iterdir()) == []
    with pytest.raises(BundleError, match="no run 'run-1'"):
        delete_bundle("run-1", root)


def test_experiments_round_trip(root: Path) -> None:
    record = {"model": "tiny-gpt", "reference": "eager", "runs": ["r-eager", "r-bf16"],
              "settings": {"batch": np.int64(4), "seq": 128, "tolerance": math.nan}}
    path = write_experiment(root, "exp-1", record)
    assert path == root / "experiments" / "exp-1.json"
    got = read_experiment(root, "exp-1")
    assert (got.experiment_id, got.run_ids) == ("exp-1", ["r-eager", "r-bf16"])
    assert got.info["settings"] == {"batch": 4, "seq": 128, "tolerance": None}
    assert got.info["schema_version"] == 1 and datetime.fromisoformat(got.info["created"])

    write_experiment(root, "exp-1", {**record, "runs": [*record["runs"], "r-int8"]})
    assert read_experiment(root, "exp-1").run_ids == ["r-eager", "r-bf16", "r-int8"]
    write_experiment(root, "exp-0", {**record, "created": "2020-01-01T00:00:00+00:00"})
    assert [e.experiment_id for e in list_experiments(root)] == ["exp-0", "exp-1"]
    assert sorted(p.name for p in (root / "experiments").iterdir()) == ["exp-0.json", "exp-1.json"]
    assert list_bundles(root) == []  # the experiments folder is not a bundle


def test_experiment_errors(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = {"model": "tiny-gpt", "reference": "eager", "runs": ["r-1"]}
    with pytest.raises(BundleError, match="lacks reference, runs"):
        write_experiment(root, "exp", {"model": "tiny-gpt"})
    with pytest.raises(BundleError, match="list of run ids"):
        write_experiment(root, "exp", {**record, "runs": ["../x"]})
    with pytest.raises(BundleError, match="invalid experiment id"):
        write_experiment(root, "../exp", record)
    with pytest.raises(BundleError, match="not JSON-serializable"):
        write_experiment(root, "exp", {**record, "settings": object()})

    def no_replace(*args: object) -> None:
        raise OSError("replace refused")

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", no_replace)
        with pytest.raises(BundleError, match="replace refused"):
            write_experiment(root, "exp", record)
    assert list((root / "experiments").iterdir()) == []

    write_experiment(root, "good", record)
    (root / "experiments" / "broken.json").write_text("{")
    (root / "experiments" / "old.json").write_text(json.dumps({"schema_version": 1, "model": "m"}))
    (tmp_path / "secret.json").write_text(json.dumps({"schema_version": 1, **record}))
    (root / "experiments" / "escape.json").symlink_to(tmp_path / "secret.json")
    problems: list[str] = []
    listed = list_experiments(root, on_problem=lambda path, message: problems.append(path.name))
    assert [e.experiment_id for e in listed] == ["good"]
    assert sorted(problems) == ["broken.json", "escape.json", "old.json"]
    for ref, message in (("nope", "no experiment 'nope'"), ("broken", "malformed"), ("old", "no reference"),
                         ("escape", "outside"), ("../good", "not a valid experiment id")):
        with pytest.raises(BundleError, match=message):
            read_experiment(root, ref)


def test_json_safe() -> None:
    class Color(Enum):
        RED = "red"

    assert json_safe({1: {np.float32(0.5), np.bool_(True)}, "c": Color.RED, "d": datetime(2026, 1, 2)}) in (
        {"1": [0.5, True], "c": "red", "d": "2026-01-02T00:00:00"},
        {"1": [True, 0.5], "c": "red", "d": "2026-01-02T00:00:00"},
    )
    assert json_safe(np.array([[1, 2], [3, 4]], dtype=np.int16)) == [[1, 2], [3, 4]]
    assert json_safe(np.float64("nan")) is None
    with pytest.raises(TypeError, match=r"\$\.a\[0\]: a bytes"):
        json_safe({"a": [b"x"]})


def test_traces_root_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKBENCH_TRACES", raising=False)
    assert traces_root() == tmp_path / "traces"
    monkeypatch.setenv("WORKBENCH_TRACES", "")
    assert traces_root() == tmp_path / "traces"
    monkeypatch.setenv("WORKBENCH_TRACES", str(tmp_path / "env"))
    assert traces_root() == tmp_path / "env"
    assert traces_root("out") == tmp_path / "out"
    assert traces_root(Path("/abs/out")) == Path("/abs/out")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert traces_root("~/t") == tmp_path / "home" / "t"


def test_compile_texts_and_extra_folders(root: Path, tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    (tools / "graph_viewer").mkdir(parents=True)
    (tools / "graph_viewer" / "jit_f.json").write_text("{}")
    path = write_bundle(root, "r1", {}, texts={"compile/optimized.hlo.txt": "HloModule m"},
                        folders={"xprof": tools})
    assert (path / "compile" / "optimized.hlo.txt").read_text() == "HloModule m"
    assert (path / "xprof" / "graph_viewer" / "jit_f.json").read_text() == "{}"
    assert tools.exists()  # folders are copied, never moved


@pytest.mark.parametrize("texts, folders", [
    ({"run.json": "x"}, None),
    ({"compile/../run.json": "x"}, None),
    ({"/tmp/compile/x.txt": "x"}, None),
    ({"compile": "x"}, None),
    (None, {"raw": "."}),
    (None, {"xprof/sub": "."}),
])
def test_extra_paths_stay_in_their_folders(root: Path, texts, folders) -> None:
    with pytest.raises(BundleError, match="is not a"):
        write_bundle(root, "r1", {}, texts=texts, folders=folders)
    assert not root.exists() or not any(root.iterdir())
