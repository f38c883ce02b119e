"""Memory analyses (timeline, allocation pairing, peak) and the memory map view, on hand-built and real traces."""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from bokeh.embed import file_html
from bokeh.models import DataTable, Div, GlyphRenderer, Plot, Quad, Range1d
from bokeh.resources import CDN
from click.testing import CliRunner
from conftest import fixture_path

from workbench.analysis.memory import (
    BEFORE_TRACE,
    NO_OP,
    allocations,
    downsample_timeline,
    memory_timeline,
    peak,
    trace_end_ns,
)
from workbench.cli import main
from workbench.trace import Trace, read_trace, schema
from workbench.trace.store.bundle import open_bundle
from workbench.views.memory import memory_map

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from synthetic_kineto import write_synthetic_trace

XSS = "<img src=x onerror=alert(1)>"


def make_trace(memory: list[tuple[int, str, int, int, int]], names: tuple[str, ...] = ("aten::empty", "aten::mm"),
               end_ns: int = 1000) -> Trace:
    """A Trace with one op per name spanning [0, end_ns) and memory rows (ts, device, addr, delta, event)."""
    n = len(names)
    events = pa.table({
        "start_ns": [0] * n, "dur_ns": [end_ns] * n, "name": list(names), "kind": ["op"] * n,
        "device": ["cpu"] * n, "track": ["cpu/thread 1"] * n, "pid": [1] * n, "tid": [1] * n,
        "corr": [-1] * n, "parent": [-1] * n, "depth": [0] * n, "launcher": [-1] * n,
        "flops": [float("nan")] * n, "bytes": [float("nan")] * n, "shapes": [""] * n, "dtypes": [""] * n,
        "args": ["{}"] * n,
    }, schema=schema.EVENTS)
    ts, device, addr, delta, event = (list(c) for c in zip(*memory, strict=True)) if memory else ([],) * 5
    frame = pd.DataFrame({"ts_ns": ts, "device": device, "delta_bytes": delta})
    allocated = frame.groupby("device")["delta_bytes"].cumsum().tolist()
    table = pa.table({"ts_ns": ts, "device": device, "addr": addr, "delta_bytes": delta,
                      "allocated_bytes": allocated, "reserved_bytes": [-1] * len(ts), "event": event},
                     schema=schema.MEMORY)
    return Trace(events=events, memory=table)


def replay(trace: Trace) -> list[tuple[str, int, int, int, int]]:
    """Reference pairing by a plain loop over the records in time order.

    Returns (device, addr, size, alloc_row, free_row) per allocation: a free pairs with the last
    unmatched alloc at its address, -1 stands for no alloc (before the trace) or no free.
    """
    memory = trace.df("memory")
    memory["device"] = memory["device"].astype(str)
    open_allocs: dict[tuple[str, int], list[tuple[int, int]]] = {}
    done = []
    for row in np.argsort(memory["ts_ns"].to_numpy(), kind="stable"):
        device, addr, delta = memory.at[row, "device"], memory.at[row, "addr"], memory.at[row, "delta_bytes"]
        if addr >= 0 and delta > 0:
            open_allocs.setdefault((device, addr), []).append((delta, row))
        elif addr >= 0 and delta < 0:
            stack = open_allocs.get((device, addr))
            size, start = stack.pop() if stack else (-delta, -1)
            done.append((device, addr, size, start, row))
    return done + [(d, a, s, r, -1) for (d, a), stack in open_allocs.items() for s, r in stack]


def live_at_peak(trace: Trace, pairs: list[tuple], device: str) -> set[tuple]:
    """(device, addr, size, alloc_row) of the pairs alive just after the device's first maximum in time."""
    memory = trace.df("memory")
    order = np.argsort(memory["ts_ns"].to_numpy(), kind="stable")
    position = {int(row): i for i, row in enumerate(order)}
    on_device = [row for row in order if memory.at[row, "device"] == device]
    top = max(memory.at[row, "allocated_bytes"] for row in on_device)
    at = position[next(row for row in on_device if memory.at[row, "allocated_bytes"] == top)]
    return {(d, a, s, r) for d, a, s, r, f in pairs
            if d == device and (r < 0 or position[r] <= at) and (f < 0 or position[f] > at)}


def as_tuples(table: pd.DataFrame, free: bool = True) -> set[tuple]:
    columns = ["device", "addr", "size", "alloc_row", *(["free_row"] if free else [])]
    return set(table[columns].itertuples(index=False, name=None))


@pytest.fixture(scope="module")
def capture_trace(tmp_path_factory) -> Trace:
    """A real torch.profiler capture of a tiny model with profile_memory (addresses and totals)."""
    root = tmp_path_factory.mktemp("traces")
    args = ["capture", "--model", "tiny-gpt", "--set", "d_model=32", "--set", "layers=1", "--set", "heads=2",
            "--batch", "2", "--seq", "8", "--iterations", "3", "--warmup", "1", "--variants", "eager",
            "--out", str(root), "--json"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    return open_bundle(run["run_id"], root).trace()


@pytest.fixture(scope="module")
def synthetic_trace(tmp_path_factory) -> Trace:
    """A synthetic Kineto trace with caching-allocator records: addresses reused, file order not time order."""
    path = tmp_path_factory.mktemp("synthetic") / "trace.json"
    write_synthetic_trace(path, 20_000)
    return read_trace(path)


@pytest.fixture(scope="module")
def resnet_trace() -> Trace:
    """Old-format Kineto memory records: no addresses, no totals, on cpu and cuda:0."""
    return read_trace(fixture_path("kineto", "resnet50_v100_train.pt.trace.json.gz"))


# --- analyses ---------------------------------------------------------------------------------------


def test_pairing_reuse_never_freed_before_trace_and_unknown_address():
    trace = make_trace([
        (10, "cuda:0", 100, 64, 0),
        (15, "cpu", 100, 4, 1),  # same address on another device: a different allocation
        (20, "cuda:0", 200, 32, 1),  # never freed
        (25, "cpu", 100, -4, -1),
        (30, "cuda:0", 100, -64, -1),
        (40, "cuda:0", 100, 128, 1),  # the address reused after its free
        (50, "cuda:0", 100, -128, 0),
        (60, "cuda:0", 300, -16, 0),  # freed, allocated before the trace began
        (70, "cuda:0", -1, 8, 0),  # no address
        (80, "cuda:0", -1, -8, -1),
    ], end_ns=1000)
    table = allocations(trace)
    rows = table.drop(columns=["alloc_row", "free_row", "op_row"]).to_dict("records")
    assert rows == [
        {"device": "cpu", "addr": 100, "size": 4, "alloc_ns": 15, "free_ns": 25, "freed": True,
         "before_trace": False, "op_name": "aten::mm", "offset": 0},
        {"device": "cuda:0", "addr": 300, "size": 16, "alloc_ns": 0, "free_ns": 60, "freed": True,
         "before_trace": True, "op_name": BEFORE_TRACE, "offset": 132},
        {"device": "cuda:0", "addr": 100, "size": 64, "alloc_ns": 10, "free_ns": 30, "freed": True,
         "before_trace": False, "op_name": "aten::empty", "offset": 0},
        {"device": "cuda:0", "addr": 200, "size": 32, "alloc_ns": 20, "free_ns": 1000, "freed": False,
         "before_trace": False, "op_name": "aten::mm", "offset": 100},  # [100, 232) is one used range
        {"device": "cuda:0", "addr": 100, "size": 128, "alloc_ns": 40, "free_ns": 50, "freed": True,
         "before_trace": False, "op_name": "aten::mm", "offset": 0},
    ]
    assert table.attrs["unknown_address"] == {"cuda:0": 2}
    assert table["alloc_row"].tolist() == [1, -1, 0, 2, 5]
    assert table["free_row"].tolist() == [3, 7, 4, -1, 6]


def test_free_pairs_with_most_recent_unmatched_alloc_at_its_address():
    trace = make_trace([(10, "cpu", 8, 16, 0), (20, "cpu", 8, 32, 1), (30, "cpu", 8, -32, -1)])
    table = allocations(trace).set_index("alloc_row")
    assert table.loc[1, ["free_ns", "freed"]].tolist() == [30, True]
    assert table.loc[0, ["free_ns", "freed"]].tolist() == [1000, False]
    assert table["op_name"].tolist() == ["aten::empty", "aten::mm"]


def test_op_without_a_row_and_empty_memory():
    assert allocations(make_trace([(5, "cpu", 8, 16, -1)]))["op_name"].tolist() == [NO_OP]
    empty = make_trace([])
    assert allocations(empty).empty and memory_timeline(empty).empty
    assert trace_end_ns(empty) == 1000


def test_timeline_conserves_deltas_in_the_old_format(resnet_trace):
    timeline = memory_timeline(resnet_trace)
    memory = resnet_trace.df("memory")
    assert len(timeline) == len(memory) == 12_838
    for device, rows in memory.groupby("device", observed=True):
        series = timeline[timeline["device"] == device]
        assert series["ts_ns"].is_monotonic_increasing
        cumulative = rows.sort_values("ts_ns", kind="stable")["delta_bytes"].cumsum()
        assert series["allocated_bytes"].tolist() == cumulative.tolist()
    assert timeline["reserved_bytes"].isna().all()  # not recorded in this format


def test_timeline_of_records_written_out_of_time_order(synthetic_trace):
    timeline = memory_timeline(synthetic_trace)
    assert (timeline["reserved_bytes"] > 0).all()
    memory = synthetic_trace.df("memory").sort_values("ts_ns", kind="stable")
    assert timeline["allocated_bytes"].tolist() == memory["delta_bytes"].cumsum().tolist()


def test_downsampled_timeline_keeps_the_extremes(resnet_trace):
    timeline = memory_timeline(resnet_trace)
    shown = downsample_timeline(timeline, 200)
    for device, rows in timeline.groupby("device"):
        kept = shown[shown["device"] == device]
        assert len(kept) <= 202
        assert kept["allocated_bytes"].max() == rows["allocated_bytes"].max()
        assert kept["allocated_bytes"].min() == rows["allocated_bytes"].min()
        assert kept["ts_ns"].iloc[[0, -1]].tolist() == rows["ts_ns"].iloc[[0, -1]].tolist()
    small = memory_timeline(make_trace([(10, "cpu", 8, 16, 0), (20, "cpu", 8, -16, 0)]))
    assert downsample_timeline(small, 200).equals(small)


@pytest.mark.parametrize("name", ["capture_trace", "synthetic_trace"])
def test_pairing_and_peak_match_a_replay(name, request):
    trace = request.getfixturevalue(name)
    table = allocations(trace)
    expected = replay(trace)
    assert as_tuples(table) == set(expected) and len(table) == len(expected)
    assert (table["free_ns"] >= table["alloc_ns"]).all()
    for device in table["device"].unique():
        ts_ns, peak_bytes, live = peak(trace, device, table)
        memory = trace.df("memory")
        on_device = memory[memory["device"] == device].sort_values("ts_ns", kind="stable")
        assert peak_bytes == on_device["allocated_bytes"].max()
        assert ts_ns == on_device["ts_ns"].iloc[on_device["allocated_bytes"].argmax()]
        assert as_tuples(live, free=False) == live_at_peak(trace, expected, device)
        assert live["size"].is_monotonic_decreasing
        assert live.equals(peak(trace, device)[2])  # same without a precomputed table


def test_peak_live_set_holds_every_byte_when_the_trace_starts_empty(synthetic_trace):
    _, peak_bytes, live = peak(synthetic_trace, "cuda:0")
    assert live["size"].sum() == peak_bytes
    assert live["op_name"].str.startswith("aten::").all()


def test_peak_without_addresses_and_unknown_device(resnet_trace):
    memory = resnet_trace.df("memory")
    _, peak_bytes, live = peak(resnet_trace, "cuda:0")
    assert peak_bytes == memory.loc[memory["device"] == "cuda:0", "allocated_bytes"].max()
    assert live.empty
    with pytest.raises(KeyError):
        peak(resnet_trace, "tpu:0")


def test_compact_offsets_do_not_overlap_live_allocations(synthetic_trace):
    table = allocations(synthetic_trace)
    addr_to_offset = table.groupby("addr")["offset"].nunique()
    assert (addr_to_offset == 1).all()  # one offset per address
    assert (table["offset"] + table["size"]).max() <= (table["addr"] + table["size"]).max() - table["addr"].min()
    _, _, live = peak(synthetic_trace, "cuda:0", table)
    spans = live.sort_values("offset")[["offset", "size"]].to_numpy()
    assert (spans[1:, 0] >= spans[:-1, 0] + spans[:-1, 1]).all()  # live blocks never overlap


# --- view ---------------------------------------------------------------------------------------------


def quads(layout) -> list:
    """The address-map renderers (one per device with addresses)."""
    return [r for r in layout.select({"type": GlyphRenderer}) if isinstance(r.glyph, Quad)]


def figures(layout) -> list[Plot]:
    """The plots of a memory map in layout order: per device, its usage figure then its address map."""
    return [child for child in layout.children if isinstance(child, Plot)]


def test_memory_map_of_a_capture(capture_trace):
    table = allocations(capture_trace)
    x_range = Range1d(0, 5)
    layout = memory_map(capture_trace, x_range=x_range)
    (rects,) = quads(layout)
    data = rects.data_source.data
    assert len(data["alloc_ns"]) == len(table) > 0
    assert sorted(data["size"]) == sorted(table["size"])
    assert set(data["op_name"]) == set(table["op_name"])
    assert all(fig.x_range is x_range for fig in figures(layout))
    assert len(figures(layout)) == 2  # usage and address map, cpu only
    (peak_table,) = layout.select({"type": DataTable})
    _, peak_bytes, live = peak(capture_trace, "cpu", table)
    assert list(peak_table.source.data["size"]) == live["size"].tolist()
    # the allocating op's name reads whole on hover, inserted only HTML-escaped
    assert "op_name_escaped" in peak_table.columns[1].formatter.template
    assert list(peak_table.source.data["op_name_escaped"]) == [html.escape(n, quote=True) for n in live["op_name"]]
    usage = figures(layout)[0]
    marker = next(r for r in usage.renderers if r.glyph.__class__.__name__ == "Scatter")
    assert list(marker.data_source.data["y"]) == [peak_bytes]


def test_memory_map_caps_rectangles_and_colours_other(capture_trace):
    table = allocations(capture_trace)
    layout = memory_map(capture_trace, max_rects=50, top_ops=3, max_live=5)
    (rects,) = quads(layout)
    data = rects.data_source.data
    assert sorted(data["size"], reverse=True) == table["size"].nlargest(50).tolist()
    address_map = next(f for f in figures(layout) if rects in f.renderers)
    assert f"largest 50 of {len(table):,} shown" in address_map.title.text
    assert len(set(data["label"]) - {"other"}) <= 3
    assert {c for c, label in zip(data["color"], data["label"], strict=True) if label == "other"} <= {"#c8c8c8"}
    (peak_table,) = layout.select({"type": DataTable})
    _, _, live = peak(capture_trace, "cpu", table)
    assert list(peak_table.source.data["size"]) == live["size"].head(5).tolist()
    assert any("(the largest 5 listed)" in d.text for d in layout.select({"type": Div}))


def test_memory_map_of_the_old_format(resnet_trace):
    layout = memory_map(resnet_trace)
    assert quads(layout) == []
    usage = figures(layout)
    assert [f.title.text.split(": ")[0] for f in usage] == ["cuda:0", "cpu"]
    notes = [d.text for d in layout.select({"type": Div})]
    assert any("cuda:0: no address map, the 8,220 memory records carry no address" in n for n in notes)
    points = sum(len(r.data_source.data["ts_ns"]) for f in usage for r in f.renderers
                 if "ts_ns" in r.data_source.data)
    assert points == 12_838 + 2  # every record, plus each device's last value held to the trace end


def test_memory_map_downsamples_long_series(resnet_trace):
    layout = memory_map(resnet_trace, max_points=100)
    cuda = figures(layout)[0]
    assert "downsampled" in cuda.title.text
    (source,) = {r.data_source for r in cuda.renderers if "ts_ns" in r.data_source.data}
    assert len(source.data["ts_ns"]) <= 103
    assert max(source.data["allocated_bytes"]) == peak(resnet_trace, "cuda:0")[1]


def test_memory_map_without_memory_is_a_note():
    layout = memory_map(make_trace([]))
    assert isinstance(layout, Div) and layout.render_as_text
    assert "No memory records" in layout.text


def test_memory_map_renders_op_names_as_text():
    trace = make_trace([(10, "cpu", 8, 16, 0), (20, "cpu", 8, -16, 0)], names=(XSS,))
    layout = memory_map(trace)
    (rects,) = quads(layout)
    assert list(rects.data_source.data["op_name"]) == [XSS]
    assert all(d.render_as_text for d in layout.select({"type": Div}))
    html = file_html(layout, CDN, "memory")
    assert XSS not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html  # only inside the escaped JSON document
