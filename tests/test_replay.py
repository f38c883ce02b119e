"""Op replay: a tiny GPT captured with shapes has every op signature rebuilt and timed alone, within a stated factor
of the trace's time; inline traces for what cannot be rebuilt and why; the command line's output and errors.

Expected figures come from the raw Kineto JSON the capture wrote (the bundle's raw/ copy), never from the replay.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from bokeh.embed import file_html
from bokeh.models import Div
from bokeh.resources import INLINE
from click.testing import CliRunner
from conftest import PAYLOADS, write_trace

import workbench.notebook as wb
from workbench.cli import main
from workbench.experiment import ExperimentSettings, run_experiment
from workbench.imports import import_traces
from workbench.profiling import ProfileSettings
from workbench.replay.calls import parse_inputs
from workbench.replay.rebuild import make_tensors, resolve
from workbench.replay.table import REPLAY_COLUMNS, replay_run
from workbench.trace.store.bundle import open_bundle
from workbench.views.replay import replay_text, replay_view

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16}
PROFILE = ProfileSettings(record_shapes=True, warmup_steps=1, active_steps=5)
INPUT_KEYS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")

TOLERANCE = 5.0
"""How far each replayed eager time may sit from the trace's, as a factor either way, for the top 10 ops of at
least `TOLERANCE_FROM_NS` in the trace; `MEDIAN_TOLERANCE` bounds their median ratio. Measured here over a dozen
captures (2 shared cores, 1 torch thread): ratios replay/trace of 0.37 to 0.87, medians 0.58 to 0.84, and once
0.22 (aten::index_select, the first op of each forward). The replay is faster as a rule: the trace's time includes
the profiler's cost for every nested op it records with shapes, memory and FLOPs (aten::linear, eight nested ops,
replays at 0.55), and the model calls each op with caches cold from the Python between steps where a replay
calls it hot, most visible for the first op of a step. Against that the replay pays its own Python call and schema
parsing, about 1.5 µs a call; and a call preempted on a shared core takes 100 µs or more, which the medians of 5
traced and 15 replayed calls absorb but not always both alike. A factor of 3 per op failed about one run in ten on
index_select; 5 holds the worst seen with margin, and the median's factor 2.5 keeps the check tight in the
aggregate: a replay in the wrong dtype, shape or thread count moves the median past it."""
MEDIAN_TOLERANCE = 2.5
TOLERANCE_FROM_NS = 5_000
"""Ops shorter than this are not held to `TOLERANCE`: their replayed time is mostly the replay's own call cost
(views and empty: 0.2 µs in the trace, about 1.5 µs replayed)."""


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A tiny GPT's eager run profiled with shapes (5 measured steps), and the raw Kineto events of its measured
    steps' ops."""
    root = tmp_path_factory.mktemp("replay-traces")
    settings = ExperimentSettings(model="tiny-gpt", variants=("eager",), batch=2, seq=16, warmup=1, iterations=2,
                                  threads=1, model_overrides=TINY_GPT, profile_settings=PROFILE)
    (run,) = run_experiment(settings, root).runs
    bundle = open_bundle(run.path, root)
    (raw,) = [p for p in bundle.raw_files() if p.name.endswith(".json")]
    events = json.loads(raw.read_text())["traceEvents"]
    measure = next(e for e in events if e.get("ph") == "X" and e.get("name") == "measure")
    low, high = measure["ts"], measure["ts"] + measure["dur"]
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op" and low <= e["ts"] < high]
    return root, bundle, ops


@pytest.fixture(scope="module")
def replayed(captured):
    """Every signature of the capture replayed eagerly."""
    _, bundle, _ = captured
    return replay_run(bundle, top=10_000, variants=("eager",), iterations=15, warmup=2)


def _key(event: dict[str, Any]) -> str:
    args = event.get("args", {})
    return json.dumps([event["name"], *(args.get(k) for k in INPUT_KEYS)] if "Input type" in args else event["name"])


def _raw_signatures(ops: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per distinct call signature in the raw trace, its calls' durations in ns."""
    durations: dict[str, list[float]] = defaultdict(list)
    for event in ops:
        durations[_key(event)].append(event["dur"] * 1e3)
    return durations


def test_every_signature_is_a_row_and_every_aten_op_is_rebuilt(captured, replayed):
    _, _, ops = captured
    signatures = _raw_signatures(ops)
    per_name = Counter(json.loads(key)[0] if key.startswith("[") else json.loads(key) for key in signatures)
    assert Counter(replayed["name"]) == per_name  # none dropped, none doubled
    assert list(replayed.columns) == list(REPLAY_COLUMNS)
    with_shapes = {json.loads(k)[0] for k in signatures if k.startswith("[") and json.loads(k)[0].startswith("aten::")}
    rebuilt = replayed[replayed["name"].isin(with_shapes)]
    assert len(rebuilt) > 40
    assert (rebuilt["status"] == "ok").all(), rebuilt[rebuilt["status"] != "ok"][["name", "reason"]]
    assert rebuilt["replay_eager_ns"].gt(0).all()
    others = replayed[~replayed["name"].isin(with_shapes)]
    assert others["reason"].str.len().gt(0).all()  # what is not rebuilt says why
    assert replayed["calls"].sum() == len(ops)
    assert replayed["self_ns"].is_monotonic_decreasing


def test_trace_times_are_the_raw_medians(captured, replayed):
    _, _, ops = captured
    by_name: dict[str, list[float]] = defaultdict(list)
    for key, durations in _raw_signatures(ops).items():
        name = json.loads(key)[0] if key.startswith("[") else json.loads(key)
        by_name[name].append(statistics.median(durations))
    for name, rows in replayed.groupby("name"):
        assert sorted(rows["trace_ns"]) == pytest.approx(sorted(by_name[name]), abs=1.0)


def test_replayed_times_agree_with_the_trace(replayed):
    top = replayed.head(10)
    held = top[(top["status"] == "ok") & (top["trace_ns"] >= TOLERANCE_FROM_NS)]
    assert len(held) >= 3, top[["name", "trace_ns"]]
    ratios = held["replay_eager_ns"] / held["trace_ns"]
    outside = held[(ratios > TOLERANCE) | (ratios < 1 / TOLERANCE)]
    assert outside.empty, outside[["name", "signature", "trace_ns", "replay_eager_ns"]]
    assert 1 / MEDIAN_TOLERANCE <= ratios.median() <= MEDIAN_TOLERANCE, ratios.tolist()
    assert replayed.attrs["threads"] == 1  # the capture's, from run.json
    assert 0 < replayed.attrs["floor_ns"] < TOLERANCE_FROM_NS


def test_bf16_and_compile_variants(captured):
    _, bundle, _ = captured
    table = replay_run(bundle, top=2, iterations=3, warmup=1)
    assert (table["status"] == "ok").all(), table["reason"]
    for variant in ("eager", "compile"):
        assert table[f"replay_{variant}_ns"].gt(0).all(), (variant, table["reason"].tolist())
    floats = table[table["signature"].str.contains("fp32")]  # what bf16 casts
    assert len(floats) and floats["replay_bf16_ns"].gt(0).all(), table["reason"].tolist()
    assert table["bound"].isin(["latency", "compute", "memory", "unknown"]).all()  # against the run's CPU figures


def _inputs(args: list[tuple[str, Any, Any, str]]) -> dict[str, Any]:
    """Recorded inputs from (type, dims, strides, concrete) per argument, keyed as Kineto writes them."""
    return {"Input type": [a[0] for a in args], "Input Dims": [a[1] for a in args],
            "Input Strides": [a[2] for a in args], "Concrete Inputs": [a[3] for a in args]}


def _op(name: str, ts: float, dur: float, inputs: list[tuple[str, Any, Any, str]] | None = None) -> dict[str, Any]:
    """A cpu_op event; `inputs` as (type, dims, strides, concrete) per argument, none for a call without shapes."""
    args: dict[str, Any] = {"External id": int(ts), **(_inputs(inputs) if inputs is not None else {})}
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


MM = [("float", [4, 8], [8, 1], ""), ("float", [8, 16], [1, 8], "")]
STRIDED_ADD = [("float", [8, 4], [1, 8], ""), ("float", [8, 4], [4, 1], ""), ("Scalar", [], [], "1")]
EMBEDDING = [("float", [64, 32], [32, 1], ""), ("long int", [2, 16], [16, 1], ""), ("Scalar", [], [], "-1"),
             ("Scalar", [], [], "False"), ("Scalar", [], [], "False")]
CAT = [("TensorList", [[4, 8], [4, 8]], [[8, 1], [8, 1]], ""), ("Scalar", [], [], "1")]
INDEX = [("float", [4, 8], [8, 1], ""), ("", [], [], "")]
CUSTOM = [("float", [4, 8], [8, 1], "")]


@pytest.fixture(scope="module")
def inline(tmp_path_factory):
    """An imported trace of ops that replay (mm, a strided add, embedding, cat) and ops that cannot: a custom op, an
    index whose indices were not recorded, an op without shapes, names that are no op (a script payload, an
    autograd node)."""
    folder = tmp_path_factory.mktemp("replay-inline")
    events = [_op("aten::mm", 100, 40, MM), _op("aten::add", 200, 30, STRIDED_ADD),
              _op("aten::embedding", 300, 25, EMBEDDING), _op("aten::cat", 400, 20, CAT),
              _op("mylib::fused_gelu", 500, 60, CUSTOM), _op("aten::index", 600, 50, INDEX),
              _op("aten::relu", 700, 45), _op(PAYLOADS[0], 800, 35, CUSTOM),
              _op("autograd::engine::evaluate_function: MmBackward0", 900, 30, CUSTOM)]
    root = folder / "traces"
    (run_id,) = import_traces([write_trace(folder / "ops.json", events)], root)
    (bare,) = import_traces([write_trace(folder / "bare.json", [_op("aten::mm", 100, 40), _op("aten::relu", 200, 5)])],
                            root)
    return root, run_id, bare


def test_what_cannot_be_rebuilt_says_why(inline):
    root, run_id, _ = inline
    table = replay_run(open_bundle(run_id, root), variants=("eager",), iterations=2, warmup=0).set_index("name")
    assert len(table) == 9
    assert set(table[table["status"] == "ok"].index) == {"aten::mm", "aten::add", "aten::embedding", "aten::cat"}
    assert "custom op: mylib::fused_gelu is not registered" in table.loc["mylib::fused_gelu", "reason"]
    assert "'indices'" in table.loc["aten::index", "reason"] and "not recorded" in table.loc["aten::index", "reason"]
    assert table.loc["aten::relu", "reason"].startswith("no shapes recorded")
    assert table.loc[PAYLOADS[0], "reason"].startswith("not a dispatcher op")
    assert table.loc["autograd::engine::evaluate_function: MmBackward0", "reason"].startswith("not a dispatcher op")
    assert "tensor list dtypes not recorded" in table.loc["aten::cat", "reason"]
    assert table.loc["aten::mm", "flops"] == 2 * 4 * 8 * 16
    assert table.loc["aten::add", "signature"].startswith("fp32[8,4](1,8), fp32[8,4], 1")
    assert table["bound"].isna().all()  # an imported CPU trace names no device figures
    assert math.isnan(table.loc["aten::relu", "replay_eager_ns"])


def test_rebuilt_tensors_keep_strides_and_index_ranges():
    add = make_tensors(resolve("aten::add", parse_inputs(_inputs(STRIDED_ADD)), "cpu"))
    assert [t.stride() for t in add] == [(1, 8), (4, 1)] and [tuple(t.shape) for t in add] == [(8, 4), (8, 4)]
    weight, indices = make_tensors(resolve("aten::embedding", parse_inputs(_inputs(EMBEDDING)), "cpu"))
    assert indices.dtype == torch.int64 and int(indices.min()) >= 0 and int(indices.max()) < weight.shape[0]
    (bf16, bf16_b) = make_tensors(resolve("aten::mm", parse_inputs(_inputs(MM)), "cpu"), bf16=True)
    assert bf16.dtype == bf16_b.dtype == torch.bfloat16 and bf16_b.stride() == (1, 8)


def test_cli_json_text_and_html(inline, tmp_path):
    root, run_id, _ = inline
    runner = CliRunner()
    page = tmp_path / "replay.html"
    result = runner.invoke(main, ["replay", run_id, "--out", str(root), "--variants", "eager", "--iterations", "2",
                                  "--top", "3", "--json", "--html", str(page)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["run"] == run_id and report["variants"] == ["eager"] and len(report["rows"]) == 3
    assert [row["name"] for row in report["rows"]] == ["mylib::fused_gelu", "aten::index", "aten::relu"]
    assert "ORT" in report["ort"] and report["html"] == str(page)
    html = page.read_text()
    assert "op replay" in html
    text = runner.invoke(main, ["replay", run_id, "--out", str(root), "--variants", "eager", "--iterations", "2"])
    assert text.exit_code == 0 and "aten::mm" in text.stdout and "custom op" in text.stdout


def test_views_keep_names_as_text(inline):
    root, run_id, _ = inline
    table = replay_run(open_bundle(run_id, root), variants=("eager",), iterations=2, warmup=0)
    layout = replay_view(table, "op replay")
    for model in layout.references():
        if isinstance(model, Div):
            assert model.render_as_text
    html = file_html(layout, INLINE, "replay")
    assert PAYLOADS[0] not in html
    summary, text_table = replay_text(table)
    assert "4 of 9 op signatures replayed" in summary and len(text_table.rows) == 9


@pytest.mark.parametrize(("args", "message"), [
    (["no-such-run"], "no-such-run"),
    (["RUN", "--variants", "ort"], "ORT does not apply"),
    (["BARE"], "record_shapes"),
])
def test_cli_bad_input_exits_2(inline, args, message):
    root, run_id, bare = inline
    args = [{"RUN": run_id, "BARE": bare}.get(a, a) for a in args]
    result = CliRunner().invoke(main, ["replay", *args, "--out", str(root)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_notebook_replay(inline):
    root, run_id, _ = inline
    table = wb.replay(run_id, top=2, variants=["eager"], iterations=1, warmup=0, root=root)
    assert list(table["name"]) == ["mylib::fused_gelu", "aten::index"] and table.attrs["variants"] == ["eager"]


def test_replay_writes_nothing_into_the_run(inline):
    root, run_id, _ = inline
    before = sorted(p.name for p in Path(root, run_id).iterdir())
    CliRunner().invoke(main, ["replay", run_id, "--out", str(root), "--variants", "eager", "--iterations", "1"])
    assert sorted(p.name for p in Path(root, run_id).iterdir()) == before
