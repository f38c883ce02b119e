"""The span index kept in a bundle (events.index): written with new bundles, built and kept on first open of
bundles without one, rebuilt when stale or damaged, and giving the same replies as an index built in memory
from events.parquet (what opening a run did before the file existed)."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from spans_data import CPU, gpu_steps, write_run

from workbench.analysis.spans import index as span_index
from workbench.analysis.spans import mapped as span_file
from workbench.analysis.spans import queries as spans
from workbench.analysis.spans.build import LONG_PER_LANE, build
from workbench.analysis.spans.index import INDEX_FILE, SpanIndex
from workbench.errors import BundleError

OLD_BUNDLES = Path(__file__).parent / "data" / "bundles-0.1.0-d3606ea.tar.gz"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A bundle of 4 steps of 400 ops (6.4k events; the CPU lane holds more than LONG_PER_LANE)."""
    return write_run(tmp_path_factory.mktemp("index-file"), "steps", gpu_steps(steps=4, ops_per_step=400))


def refuse_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, opening a run fails if it builds the index from the Parquet instead of mapping its file."""
    def refuse(path):
        raise AssertionError(f"built the index of {path} instead of mapping its file")
    monkeypatch.setattr(span_index, "build", refuse)


@pytest.fixture
def no_build(monkeypatch):
    refuse_builds(monkeypatch)


def replies(run: Path | SpanIndex, extent: tuple[int, int], seed: int = 0) -> list[str]:
    """The JSON of the whole-trace window, 40 random windows (all zoom levels), a search, an aggregate, an event."""
    first, last = extent
    rng = np.random.default_rng(seed)
    out = [spans.window(run, first, last, 1600), spans.window(run, first, last, 300, max_spans=50)]
    for _ in range(40):
        width = max(int((last - first) * 10 ** rng.uniform(-5, 0)), 1)
        start = first + int(rng.uniform(-0.05, 1) * (last - first))
        out.append(spans.window(run, start, start + width, int(rng.integers(100, 2400))))
    out += [spans.search(run, "kernel", limit=20), spans.aggregate(run, first, (first + last) // 2),
            spans.event(run, 0)]
    return [json.dumps({**reply, "run": None}) for reply in out]


def test_a_new_bundle_holds_an_index_of_its_events_table(run, no_build):
    stored = span_file.read(run / INDEX_FILE)
    assert stored is not None
    assert stored.meta["source"] == span_file.parquet_fingerprint(run / "events.parquet")
    table = pq.read_table(run / "events.parquet")
    start, dur = table["start_ns"].to_numpy(), table["dur_ns"].to_numpy()
    index = SpanIndex.open(run / "events.parquet")
    assert not index.start.flags.writeable  # a view of the mapped file, not a copy
    assert index.size == table.num_rows and sorted(index.row.tolist()) == list(range(table.num_rows))
    assert index.extent == (int(start.min()), int(np.maximum(start + dur, start + 1).max()))
    cpu = index.lane_slice(int(index.lanes.set_index("track").loc[CPU, "lane"]))
    assert cpu.stop - cpu.start > LONG_PER_LANE
    assert index.start[cpu].tolist() == sorted(start[index.row[cpu]].tolist())  # (lane, start) order
    assert index.names[index.name[:10]].tolist() == [table["name"][int(r)].as_py() for r in index.row[:10]]


def test_the_mapped_index_equals_one_built_from_the_parquet(run):
    events = run / "events.parquet"
    built, mapped = SpanIndex(path=events, **build(events)), SpanIndex.open(events)
    for field in ("row", "position", "start", "dur", "name", "kind", "depth", "launcher", "parent", "flops",
                  "launched", "shapes", "names", "kinds", "shape_values", "marker", "is_marker", "lane_start",
                  "short_max", "busy_offset", "busy_start", "busy_end", "busy_before", "block_key"):
        expected, got = getattr(built, field), getattr(mapped, field)
        assert got.dtype == expected.dtype and np.array_equal(got, expected, equal_nan=got.dtype.kind == "f"), field
    assert [lane.tolist() for lane in mapped.long] == [lane.tolist() for lane in built.long]
    assert mapped.lanes.equals(built.lanes) and mapped.extent == built.extent
    assert replies(mapped, mapped.extent) == replies(built, built.extent)


def test_a_bundle_without_an_index_is_indexed_on_first_open_and_keeps_it(run, tmp_path, monkeypatch):
    copy = shutil.copytree(run, tmp_path / "steps")
    written = (copy / INDEX_FILE).read_bytes()
    (copy / INDEX_FILE).unlink()
    events = copy / "events.parquet"
    expected = replies(SpanIndex(path=events, **build(events)), SpanIndex.open(run / "events.parquet").extent)
    spans.RUNS.clear()
    assert replies(copy, SpanIndex.open(run / "events.parquet").extent) == expected
    assert (copy / INDEX_FILE).read_bytes() == written  # kept, the same file the writer writes
    assert not [p.name for p in copy.iterdir() if p.name.startswith(".")]
    refuse_builds(monkeypatch)
    assert replies(SpanIndex.open(events), SpanIndex.open(events).extent) == expected


def test_an_index_that_cannot_be_kept_is_used_from_memory_and_nothing_is_left(run, tmp_path, monkeypatch):
    copy = shutil.copytree(run, tmp_path / "steps")
    (copy / INDEX_FILE).unlink()

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(span_file.os, "replace", full_disk)
    index = SpanIndex.open(copy / "events.parquet")
    assert index.start.flags.writeable  # built in memory
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in run.iterdir() if p.name != INDEX_FILE)
    assert replies(index, index.extent) == replies(SpanIndex.open(run / "events.parquet"), index.extent)


def test_a_stale_or_damaged_index_is_built_again(run, tmp_path):
    other = write_run(tmp_path, "other", [{"start_ns": 5, "dur_ns": 10, "name": "only", "track": CPU}])
    copy = shutil.copytree(run, tmp_path / "steps")
    shutil.copy(other / "events.parquet", copy / "events.parquet")  # another table under the old index
    index = SpanIndex.open(copy / "events.parquet")
    assert (index.size, index.extent, index.names.tolist()) == (1, (5, 15), ["only"])
    assert span_file.read(copy / INDEX_FILE).meta["source"] == span_file.parquet_fingerprint(copy / "events.parquet")
    size = (copy / INDEX_FILE).stat().st_size
    with open(copy / INDEX_FILE, "r+b") as damaged:  # cut short, as by a full disk under another tool
        damaged.truncate(size // 2)
    assert span_file.read(copy / INDEX_FILE) is None
    assert SpanIndex.open(copy / "events.parquet").names.tolist() == ["only"]
    assert (copy / INDEX_FILE).stat().st_size == size


def test_an_unreadable_events_table_is_a_bundle_error_naming_it(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "events.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(BundleError, match=r"bad/events.parquet: cannot read the events table: not a Parquet"):
        SpanIndex.open(folder / "events.parquet")
    assert sorted(p.name for p in folder.iterdir()) == ["events.parquet"]


def test_bundles_of_the_previous_release_open_and_keep_an_index(tmp_path):
    with tarfile.open(OLD_BUNDLES) as archive:
        archive.extractall(tmp_path, filter="data")
    folder = tmp_path / "20261203-094459-tiny-gpt-mha-fp32-7a31"
    assert not (folder / INDEX_FILE).exists()
    table = pq.read_table(folder / "events.parquet", columns=["start_ns", "dur_ns", "track"])
    start, dur = table["start_ns"].to_numpy(), table["dur_ns"].to_numpy()
    first, last = int(start.min()), int(np.maximum(start + dur, start + 1).max())
    reply = spans.window(folder, first, last, 1000)
    assert reply["extent_ns"] == [first, last]
    assert sum(lane["events"] for lane in reply["lanes"]) == reply["events"] == table.num_rows
    assert {lane["track"] for lane in reply["lanes"]} == set(table["track"].cast("string").to_pylist())
    assert span_file.read(folder / INDEX_FILE) is not None


def test_the_array_file_round_trips_and_refuses_what_it_did_not_write(tmp_path):
    arrays = {"a": np.arange(5, dtype=np.int64), "b": np.array([True, False]), "empty": np.zeros(0, np.float32),
              "s": np.array(["x", "", "ünïcode ✓", "[[8, 64]]"], dtype=object), "f": np.array([1.5, np.nan])}
    span_file.write(tmp_path / "f.idx", arrays, {"k": [1, "v"]})
    stored = span_file.read(tmp_path / "f.idx")
    assert stored.meta == {"k": [1, "v"]} and stored.arrays.keys() == arrays.keys()
    for name, array in arrays.items():
        got = stored.arrays[name]
        assert got.dtype == array.dtype and np.array_equal(got, array, equal_nan=name == "f"), name
    assert [p.name for p in tmp_path.iterdir()] == ["f.idx"]
    (tmp_path / "other").write_bytes(b"PAR1 something else entirely")
    (tmp_path / "empty").write_bytes(b"")
    assert span_file.read(tmp_path / "other") is span_file.read(tmp_path / "empty") is None
    assert span_file.read(tmp_path / "missing") is None
