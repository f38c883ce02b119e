"""XSpace reader: real `jax.profiler.trace` captures on CPU, read as a file and as a TensorBoard folder."""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from workbench.analysis.steps import step_windows
from workbench.errors import MissingDependency, TraceFormatError
from workbench.trace import read_trace, sniff_format
from workbench.trace.model import Trace
from workbench.trace.xspace.reader import read_xspace

jax = pytest.importorskip("jax", reason="the XSpace reader needs jax (pip install 'workbench[jax]')")
jnp = pytest.importorskip("jax.numpy")

STEPS = 3


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TensorBoard logdir holding one capture of a jitted tiny MLP, 3 annotated steps."""

    @jax.jit
    def mlp(x: jax.Array, w: jax.Array) -> jax.Array:
        return jnp.tanh(x @ w) * 2 + 1

    x, w = jnp.ones((64, 128)), jnp.full((128, 32), 0.01)
    mlp(x, w).block_until_ready()  # compile outside the capture
    root = tmp_path_factory.mktemp("jax_logdir")
    with jax.profiler.trace(str(root)), jax.profiler.TraceAnnotation("measure"):
        for i in range(STEPS):
            with jax.profiler.StepTraceAnnotation("train", step_num=i):
                mlp(x, w).block_until_ready()
    return root


@pytest.fixture(scope="module")
def run_dir(logdir: Path) -> Path:
    (run,) = (logdir / "plugins" / "profile").iterdir()
    return run


@pytest.fixture(scope="module")
def trace(run_dir: Path) -> Trace:
    (path,) = run_dir.glob("*.xplane.pb")
    return read_trace(path)


def _rows(trace: Trace, kind: str) -> list[dict]:
    return [r for r in trace.events.to_pylist() if r["kind"] == kind]


def test_file_reads_xla_ops_of_the_jitted_module(trace: Trace) -> None:
    assert trace.metadata["source"]["format"] == "xspace"
    hlo = _rows(trace, "hlo")
    assert len(hlo) >= STEPS and len(hlo) % STEPS == 0  # the same ops each step
    for row in hlo:
        args = json.loads(row["args"])
        assert args["hlo_module"].startswith("jit_mlp") and args["hlo_op"] == row["name"]
        assert "program_id" in args and row["device"] == "cpu" and row["track"].startswith("cpu/tf_XLA")
    assert {r["name"] for r in _rows(trace, "python")}  # the Python tracer's frames
    assert trace.metadata["planes"]["/host:metadata"]["jax_version"] == jax.__version__
    starts = trace.events["start_ns"].to_numpy()
    assert starts.min() == 0 and trace.events["dur_ns"].to_numpy().min() >= 0


def test_annotations_and_step_numbers(trace: Trace) -> None:
    notes = _rows(trace, "annotation")
    steps = [r for r in notes if r["name"] == "train"]
    assert sorted(json.loads(r["args"])["step_num"] for r in steps) == list(range(STEPS))
    (measure,) = [r for r in notes if r["name"] == "measure"]
    assert all(r["parent"] >= 0 for r in steps)
    rows = trace.events.to_pylist()
    assert all(rows[r["parent"]]["name"] == "measure" for r in steps)
    launches = [r for r in rows if r["name"].startswith("PjitFunction(") and r["depth"] == measure["depth"] + 2]
    assert len(launches) == STEPS and all(rows[r["parent"]]["name"] == "train" for r in launches)


def test_nesting_is_consistent(trace: Trace) -> None:
    rows = trace.events.to_pylist()
    assert any(r["parent"] >= 0 for r in rows)
    for r in rows:
        if r["parent"] < 0:
            assert r["depth"] == 0
            continue
        p = rows[r["parent"]]
        assert p["track"] == r["track"] and p["depth"] == r["depth"] - 1
        assert p["start_ns"] <= r["start_ns"] and r["start_ns"] + r["dur_ns"] <= p["start_ns"] + p["dur_ns"]


def test_folder_and_logdir_read_the_newest_run(logdir: Path, run_dir: Path, trace: Trace, tmp_path: Path) -> None:
    for folder in (run_dir, logdir, logdir / "plugins" / "profile"):
        assert sniff_format(folder) == "xspace"
        assert read_trace(folder).events.num_rows == trace.events.num_rows
    older = tmp_path / "plugins" / "profile" / "2000_01_01_00_00_00"
    older.mkdir(parents=True)
    (older / "old.xplane.pb").write_bytes(b"\n\x00")  # an older run is not read, even if broken
    shutil.copytree(run_dir, tmp_path / "plugins" / "profile" / "2999_01_01_00_00_00")
    assert read_trace(tmp_path).events.num_rows == trace.events.num_rows


def test_several_hosts_in_one_run(run_dir: Path, trace: Trace, tmp_path: Path) -> None:
    (path,) = run_dir.glob("*.xplane.pb")
    for host in ("hostA", "hostB"):
        shutil.copy(path, tmp_path / f"{host}.xplane.pb")
    both = read_xspace(tmp_path)
    assert both.events.num_rows == 2 * trace.events.num_rows
    assert both.metadata["hosts"] == ["hostA", "hostB"]
    tracks = set(both.events["track"].combine_chunks().dictionary.to_pylist())
    assert any(t.startswith("cpu/hostA/") for t in tracks) and any(t.startswith("cpu/hostB/") for t in tracks)
    assert set(both.events["pid"].to_pylist()) == {0, 1}


def test_chrome_trace_beside_it_has_the_same_xla_ops(run_dir: Path, trace: Trace) -> None:
    """JAX writes `<host>.trace.json.gz` from the same XSpace: processes named after its planes, threads
    after its lines, no categories, the event stats (`hlo_op`, `hlo_module`, `step_num`) as string args.
    The Kineto reader classifies those rows by the XSpace reader's rules, so both files give the same
    kinds, tracks and steps. JAX ends `traceEvents` with an empty `{}`, which the Kineto reader counts
    and skips, so both readers start from the same event and the ops' times agree directly."""
    (json_path,) = run_dir.glob("*.trace.json.gz")
    chrome = read_trace(json_path)
    assert chrome.metadata["source"]["format"] == "kineto"
    assert chrome.kind_counts() == trace.kind_counts()
    assert {"hlo", "python", "annotation", "op"} <= set(trace.kind_counts())
    assert Counter(chrome.df()["track"].astype(str)) == Counter(trace.df()["track"].astype(str))
    ops = _rows(chrome, "hlo")
    hlo = _rows(trace, "hlo")
    assert all("hlo_op" in json.loads(r["args"]) for r in ops)

    def key(rows: list[dict]) -> np.ndarray:
        return np.array(sorted((r["start_ns"], r["dur_ns"]) for r in rows))

    assert sorted(r["name"] for r in ops) == sorted(r["name"] for r in hlo)
    assert np.abs(key(ops) - key(hlo)).max() <= 2  # µs floats in the JSON: a ns of rounding at each end
    chrome_steps, steps = step_windows(chrome), step_windows(trace)
    assert chrome_steps["step"].tolist() == steps["step"].tolist() == list(range(STEPS))
    assert np.abs(chrome_steps[["start_ns", "end_ns"]].to_numpy() - steps[["start_ns", "end_ns"]].to_numpy()).max() <= 2
    assert sorted(int(json.loads(r["args"])["step_num"]) for r in _rows(chrome, "annotation") if r["name"] == "train") \
        == list(range(STEPS))
    assert chrome.metadata["reader"]["skipped"]["empty records ({})"] == 1
    assert chrome.events.num_rows == trace.events.num_rows  # every event is in both files


@pytest.mark.parametrize("content", [b"\x8b\xad\xf0\x0d" * 64, b"not an xspace at all\n"])
def test_garbage_is_a_format_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "vm.xplane.pb"
    path.write_bytes(content)
    with pytest.raises(TraceFormatError, match=r"vm\.xplane\.pb"):
        read_xspace(path)
    with pytest.raises(TraceFormatError, match=r"vm\.xplane\.pb"):
        read_trace(path)


def test_truncated_file_is_a_format_error_and_leaves_nothing(run_dir: Path, tmp_path: Path) -> None:
    (path,) = run_dir.glob("*.xplane.pb")
    cut = tmp_path / "cut.xplane.pb"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert sniff_format(cut) == "xspace"  # the head is intact: the reader itself must refuse it
    with pytest.raises(TraceFormatError, match=r"cut\.xplane\.pb: not a readable XSpace"):
        read_trace(cut)
    assert [p.name for p in tmp_path.iterdir()] == ["cut.xplane.pb"]


def test_empty_file_and_folders_are_format_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.xplane.pb"
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="no planes"):
        read_xspace(empty)
    folder = tmp_path / "logs"
    folder.mkdir()
    for reader in (read_xspace, read_trace):
        with pytest.raises(TraceFormatError, match="logs"):
            reader(folder)
    (folder / "notes.txt").write_text("no profile here")
    with pytest.raises(TraceFormatError, match=r"no \.xplane\.pb"):
        read_xspace(folder)
    with pytest.raises(TraceFormatError, match="folder"):
        read_trace(folder)


def test_missing_jax_names_the_extra(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (path,) = run_dir.glob("*.xplane.pb")
    monkeypatch.setitem(sys.modules, "jax.profiler", None)
    with pytest.raises(MissingDependency, match=r"workbench\[jax\]"):
        read_xspace(path)


_DEVICE_PLANES = """
planes {{
  id: {id} name: "/device:{dev}:{ordinal}"
  lines {{ id: 1 name: "XLA Modules" timestamp_ns: 1000
    events {{ metadata_id: 1 offset_ps: 0 duration_ps: 10000000 stats {{ metadata_id: 1 str_value: "jit_f" }} }} }}
  lines {{ id: 2 name: "XLA Ops" timestamp_ns: 1000
    events {{ metadata_id: 2 offset_ps: 1000000 duration_ps: 2000000
             stats {{ metadata_id: 2 uint64_value: 4096 }} stats {{ metadata_id: 3 uint64_value: 512 }} }} }}
  lines {{ id: 3 name: "Steps" timestamp_ns: 1000 events {{ metadata_id: 1 offset_ps: 0 duration_ps: 10000000 }} }}
  event_metadata {{ key: 1 value {{ id: 1 name: "jit_f(1)" }} }}
  event_metadata {{ key: 2 value {{ id: 2 name: "fusion.1" }} }}
  stat_metadata {{ key: 1 value {{ id: 1 name: "hlo_module" }} }}
  stat_metadata {{ key: 2 value {{ id: 2 name: "flops" }} }}
  stat_metadata {{ key: 3 value {{ id: 3 name: "bytes_accessed" }} }}
}}
"""


def test_device_planes_of_tpu_and_gpu(tmp_path: Path) -> None:
    """No TPU or GPU here: an XSpace with their planes is built from text with jax's own serializer."""
    text = "".join(_DEVICE_PLANES.format(id=i + 1, dev=dev, ordinal=i) for i, dev in enumerate(("TPU", "GPU")))
    path = tmp_path / "accel.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(text))
    rows = read_trace(path).events.to_pylist()
    got = {(r["device"], r["track"], r["kind"], r["name"]) for r in rows}
    for device in ("tpu:0", "cuda:1"):
        assert (device, f"{device}/XLA Modules", "module", "jit_f(1)") in got
        assert (device, f"{device}/XLA Ops", "hlo", "fusion.1") in got
        assert (device, f"{device}/Steps", "annotation", "jit_f(1)") in got  # step markers
    op = next(r for r in rows if r["kind"] == "hlo")
    assert (op["flops"], op["bytes"], op["start_ns"], op["dur_ns"], op["args"]) == (4096.0, 512.0, 1000, 2000, None)
    module = next(r for r in rows if r["kind"] == "module")
    assert json.loads(module["args"]) == {"hlo_module": "jit_f"} and op["parent"] == -1  # own track per line
