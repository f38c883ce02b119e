"""Issue 22: repeated XSpace structures (one event written thousands of times in a line, the line itself written
several times) read in time that grows with their size, not with its square, or are refused in one line.

Identical spans on one track nest as a chain, each inside the one before it; nesting and the passes that climb
or walk it level by level (annotation marks, launch links) must not cost depth × rows. Counts of numpy calls
stand in for time: they are deterministic, and a per-level loop shows in them as calls growing with depth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from workbench.errors import TraceFormatError
from workbench.trace import launches, nesting
from workbench.trace.launches import enclosing
from workbench.trace.nesting import DEPTH_LIMIT, nest_spans
from workbench.trace.schema import KIND_CODES
from workbench.trace.xspace import reader as xspace
from workbench.trace.xspace.xla_host import mark_annotations

_EVENT = "events {{ metadata_id: {meta} offset_ps: {offset} duration_ps: {dur} {stats}}}"


def _xspace(tmp_path: Path, lines: list[tuple[int, str, list[str]]], name: str = "rep") -> Path:
    """A `/host:CPU` plane with these lines (id, name, event texts), serialized with jax's own serializer."""
    jax = pytest.importorskip("jax", reason="XSpace files are serialized and read with jax")
    body = "\n".join(f'lines {{ id: {i} name: "{n}" timestamp_ns: 1000 {" ".join(events)} }}' for i, n, events in lines)
    text = f"""planes {{ id: 1 name: "/host:CPU"
      {body}
      event_metadata {{ key: 1 value {{ id: 1 name: "measure" }} }}
      event_metadata {{ key: 2 value {{ id: 2 name: "PjitFunction(f)" }} }}
      event_metadata {{ key: 3 value {{ id: 3 name: "cuLaunchKernel" }} }}
      stat_metadata {{ key: 1 value {{ id: 1 name: "correlation_id" }} }}
    }}"""
    path = tmp_path / f"{name}.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(text))
    return path


def _event(meta: int = 1, offset: int = 0, dur: int = 5_000_000, stats: str = "") -> str:
    return _EVENT.format(meta=meta, offset=offset, dur=dur, stats=stats)


def _rows(path: Path) -> list[dict[str, Any]]:
    return xspace.read_xspace(path).events.to_pylist()


def test_an_event_repeated_in_a_line_written_three_times_nests_as_one_chain(tmp_path: Path) -> None:
    n, m = 400, 3
    rows = _rows(_xspace(tmp_path, [(11, "python", [_event()] * n)] * m))
    assert len(rows) == n * m
    assert {r["track"] for r in rows} == {"cpu/python"}  # lines with one name share a track
    assert [sum(r["tid"] == t for r in rows) for t in range(m)] == [n] * m  # tid: the line's index
    # each inside the one before it, across the lines too: the chain is as deep as there are copies
    assert [r["parent"] for r in rows] == [-1, *range(n * m - 1)]
    assert [r["depth"] for r in rows] == list(range(n * m))
    assert {(r["start_ns"], r["dur_ns"], r["name"], r["kind"]) for r in rows} == {(0, 5000, "measure", "op")}


def test_annotations_are_marked_through_a_deep_chain(tmp_path: Path) -> None:
    """`measure` ranges around a jitted call are annotations, however many identical ones are stacked."""
    events = [_event(1, 0, 9_000_000)] * 2000 + [_event(2, 1_000_000, 1_000_000)]
    rows = _rows(_xspace(tmp_path, [(11, "python", events)]))
    assert [r["kind"] for r in rows] == ["annotation"] * 2000 + ["op"]
    assert rows[-1]["parent"] == 1999 and rows[-1]["depth"] == 2000


def test_launch_links_climb_a_deep_chain_of_runtime_calls(tmp_path: Path) -> None:
    """Runtime calls stacked 3,000 deep (one repeated cuLaunchKernel) inside one op all link to that op."""
    calls = [_event(3, 100_000, 1_000_000, "stats { metadata_id: 1 int64_value: 7 } ")] * 3000
    rows = _rows(_xspace(tmp_path, [(11, "python", [_event(2, 0, 5_000_000), *calls])]))
    assert [r["kind"] for r in rows] == ["op"] + ["runtime"] * 3000
    parent = np.array([r["parent"] for r in rows])
    kind = np.array([KIND_CODES[r["kind"]] for r in rows])
    ops = enclosing(parent[1:], parent, kind == KIND_CODES["op"])
    assert (ops == 0).all()


def test_zero_length_events_repeated_past_the_depth_limit_read_flat(tmp_path: Path) -> None:
    rows = _rows(_xspace(tmp_path, [(11, "python", [_event(dur=0)] * 20_000)] * 2))
    assert len(rows) == 40_000 and {r["depth"] for r in rows} == {0} and {r["parent"] for r in rows} == {-1}


def test_a_line_repeated_past_the_depth_a_trace_holds_is_refused_in_one_line(tmp_path: Path) -> None:
    """The issue's file in small: 20,000 identical events in a line written twice nest 40,000 deep."""
    path = _xspace(tmp_path, [(11, "python", [_event()] * 20_000)] * 2)
    with pytest.raises(TraceFormatError) as info:
        xspace.read_xspace(path)
    message = str(info.value)
    assert message.startswith(f"{path}: line 'python' (track cpu/python) repeats one event")
    assert "40,000 times" in message and f"{DEPTH_LIMIT:,} levels" in message and "\n" not in message


def test_refused_as_soon_as_the_repeats_pass_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal comes while reading, at the first line that passes the limit: later lines are not read."""
    monkeypatch.setattr(xspace, "DEPTH_LIMIT", 50)
    path = _xspace(tmp_path, [(11, "python", [_event()] * 30)] * 4)
    read = 0
    line = xspace._Reader._line

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal read
        read += 1
        line(self, *args, **kwargs)

    monkeypatch.setattr(xspace._Reader, "_line", counting)
    with pytest.raises(TraceFormatError, match=r"repeats one event \(start 1000 ns, 5000 ns long\) 60 times"):
        xspace.read_xspace(path)
    assert read == 2


def test_nesting_deeper_than_the_depth_column_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Distinct spans, each inside the one before, pass the limit too: refused after nesting, naming the track."""
    monkeypatch.setattr(xspace, "DEPTH_LIMIT", 50)
    events = [_event(offset=1000 * i, dur=1_000_000 - 2000 * i) for i in range(60)]
    path = _xspace(tmp_path, [(11, "python", events)])
    with pytest.raises(TraceFormatError, match=r"events on track cpu/python nest 50 or more levels deep"):
        xspace.read_xspace(path)
    monkeypatch.setattr(xspace, "DEPTH_LIMIT", 60)
    assert max(r["depth"] for r in _rows(path)) == 59


def test_nest_spans_caps_depth_instead_of_wrapping_and_keeps_parents() -> None:
    n = DEPTH_LIMIT + 10
    parent, depth = nest_spans(np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64))
    assert (parent == np.arange(-1, n - 1)).all()
    assert depth.min() == 0 and depth.max() == DEPTH_LIMIT and (depth[DEPTH_LIMIT:] == DEPTH_LIMIT).all()


class _Counting:
    """Stands for the numpy module in one of ours, counting the functions it looks up."""

    def __init__(self) -> None:
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        value = getattr(np, name)
        if callable(value) and not isinstance(value, type):
            self.calls += 1
        return value


def _numpy_calls(monkeypatch: pytest.MonkeyPatch, module: Any, run: Any) -> int:
    counting = _Counting()
    with monkeypatch.context() as patch:
        patch.setattr(module, "np", counting)
        run()
    return counting.calls


@pytest.mark.parametrize("make", [
    lambda n: (np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), np.full(n, 10, dtype=np.int64)),
    lambda n: (np.repeat(np.arange(4), n // 4), np.tile(np.arange(n // 4), 4), np.tile(n - np.arange(n // 4), 4)),
], ids=["identical", "nested on 4 tracks"])
def test_nesting_costs_the_same_numpy_calls_at_any_depth(monkeypatch: pytest.MonkeyPatch, make: Any) -> None:
    calls = [_numpy_calls(monkeypatch, nesting, lambda n=n: nest_spans(*make(n))) for n in (200, 2_000, 20_000)]
    assert calls[0] == calls[1] == calls[2]


def test_enclosing_costs_numpy_calls_logarithmic_in_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    def chain(n: int) -> None:
        parent = np.arange(-1, n - 1)
        wanted = np.zeros(n, dtype=bool)
        wanted[0] = True
        assert (enclosing(np.arange(n), parent, wanted) == 0).all()

    small, large = (_numpy_calls(monkeypatch, launches, lambda n=n: chain(n)) for n in (1_000, 1_000_000))
    assert large - small <= 5 * 10  # ten more doublings at most, a few calls each


def test_enclosing_matches_climbing_one_parent_at_a_time() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 50, 3_000):
        track = rng.integers(0, 3, n)
        start = np.where(rng.random(n) < 0.5, 7, rng.integers(0, 50, n))
        dur = np.where(start == 7, 9, rng.integers(0, 100, n))
        parent, _ = nest_spans(track, start, dur)
        wanted = rng.random(n) < 0.05
        rows = rng.integers(-1, n, 400)
        expected = []
        for row in rows:
            while row >= 0 and not wanted[row]:
                row = parent[row]
            expected.append(row)
        assert enclosing(rows, parent, wanted).tolist() == expected


def test_mark_annotations_matches_marking_one_range_at_a_time() -> None:
    """Deepest first, each annotation or jitted call makes its undecided parent an annotation."""
    rng = np.random.default_rng(5)
    codes = np.array([KIND_CODES[k] for k in ("op", "annotation", "hlo", "python")], dtype=np.int8)
    for n in (1, 40, 2_000):
        start = np.where(rng.random(n) < 0.5, 3, rng.integers(0, 40, n))
        dur = np.where(start == 3, 20, rng.integers(1, 60, n))
        parent, depth = nest_spans(rng.integers(0, 2, n), start, dur)
        kind, undecided = rng.choice(codes, n), rng.random(n) < 0.6
        names = np.array(rng.choice(["measure", "PjitFunction(f)", "x"], n), dtype=object)
        expected = kind.copy()
        for row in sorted(range(n), key=lambda r: -depth[r]):
            up = parent[row]
            marks = expected[row] == KIND_CODES["annotation"] or names[row].startswith("Pjit")
            if up >= 0 and undecided[up] and marks:
                expected[up] = KIND_CODES["annotation"]
        assert (mark_annotations(kind, undecided, names, parent, depth) == expected).all()
