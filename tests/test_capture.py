"""Capture: phase labels, the profiler session, a variant's profiled lifecycle and the FLOPs join."""

from __future__ import annotations

import math

import pyarrow as pa
import pytest

from workbench.backends import get_variant
from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.profiling import (
    ProfileSettings,
    attach_flops,
    phase,
    phases,
    progress_units,
)
from workbench.profiling.lifecycle import profile_variant
from workbench.profiling.torch_profiler import TRACE_SUFFIX, TorchProfilerSession
from workbench.trace import read_trace, schema
from workbench.trace.model import Trace
from workbench.trace.schema import LIFECYCLE_PHASES as LIFECYCLE

TINY_GPT = {"vocab": 64, "layers": 1, "d_model": 32, "heads": 4, "max_seq": 16}
STEPS = ["step 0", "step 1", "step 2"]


@pytest.fixture(scope="module")
def gpt():
    return load_model("tiny-gpt", **TINY_GPT)


def _names(trace: Trace, kind: str | None = None) -> set[str]:
    df = trace.df()
    if kind is not None:
        df = df[df["kind"] == kind]
    return set(df["name"].astype(str))


def _profile(gpt, tmp_path, variant="eager", **settings):
    ticks = []
    run = profile_variant(get_variant(variant, batch=2), gpt, gpt.make_inputs(2, 16), tmp_path,
                          ProfileSettings(**settings), on_progress=lambda: ticks.append(1))
    return run, read_trace(run.trace_path), len(ticks)


def test_phase_times_its_region_accumulates_repeats_and_counts_a_failed_region(monkeypatch):
    clock = iter(range(0, 10**9, 1_000_000))  # every reading is 1 ms after the previous one
    monkeypatch.setattr(phases.time, "perf_counter_ns", lambda: next(clock))
    timings: dict[str, float] = {}
    with phase("load", timings):
        pass
    for _ in range(2):
        with phase("step 0", timings):
            pass
    with pytest.raises(RuntimeError), phase("compile", timings):
        raise RuntimeError("boom")
    assert timings == {"load": 1.0, "step 0": 2.0, "compile": 1.0}


def test_phase_labels_appear_in_a_profiler_session(tmp_path):
    with TorchProfilerSession(tmp_path, "labels") as session, phase("outer"), phase("inner"):
        pass
    assert session.trace_path == tmp_path / f"labels{TRACE_SUFFIX}"
    assert {"outer", "inner"} <= _names(read_trace(session.trace_path), "annotation")


def test_profiled_lifecycle_records_every_phase_memory_and_flops(gpt, tmp_path):
    run, trace, ticks = _profile(gpt, tmp_path)
    assert run.trace_path.name == "eager.pt.trace.json"
    assert {*LIFECYCLE, *STEPS} <= _names(trace, "annotation")
    assert set(run.phases_ms) == {*LIFECYCLE, *STEPS}
    assert ticks == progress_units(ProfileSettings())
    assert trace.memory.num_rows > 0
    assert run.op_flops["aten::addmm"] > 0  # FLOPs come from key_averages, not from the JSON
    assert trace.df().query("name == 'aten::addmm'")["flops"].isna().all()
    with_flops = attach_flops(trace, run.op_flops).df()
    assert with_flops.query("name == 'aten::addmm'")["flops"].sum() == pytest.approx(run.op_flops["aten::addmm"])


def test_steady_state_mode_records_only_the_steps(gpt, tmp_path):
    run, trace, _ = _profile(gpt, tmp_path, record_setup=False, warmup_steps=1)
    names = _names(trace, "annotation")
    assert set(STEPS) <= names
    assert not {"load", "compile", "warmup"} & names
    assert {"load", "compile", "warmup"} <= set(run.phases_ms)  # still timed, just not recorded


def test_session_closes_once_and_exports_nothing_after_an_exception(tmp_path):
    session = TorchProfilerSession(tmp_path, "failed")
    with pytest.raises(RuntimeError), session:
        raise RuntimeError("model raised")
    assert session.close() is None
    assert not list(tmp_path.iterdir())
    with pytest.raises(WorkbenchError):
        session.start()
    with pytest.raises(WorkbenchError, match="not running"):
        session.step()


def test_profile_settings_are_checked():
    with pytest.raises(WorkbenchError, match="active_steps"):
        ProfileSettings(active_steps=0)
    with pytest.raises(WorkbenchError, match="warmup_steps"):
        ProfileSettings(warmup_steps=-1)
    assert ProfileSettings(warmup_steps=1, active_steps=4).steps == 5


def _events(rows: list[tuple[str, str, float]]) -> Trace:
    base = {"start_ns": 0, "dur_ns": 1, "device": "cpu", "track": "cpu/thread 1", "pid": 1, "tid": 1,
            "corr": -1, "parent": -1, "depth": 0, "launcher": -1, "bytes": None, "shapes": "", "dtypes": "",
            "args": "{}"}
    table = pa.Table.from_pylist([{**base, "name": n, "kind": k, "flops": f} for n, k, f in rows],
                                 schema=schema.EVENTS)
    return Trace(events=table)


def test_attach_flops_spreads_totals_over_op_events_and_keeps_recorded_values():
    nan = float("nan")
    trace = _events([("aten::mm", "op", nan), ("aten::mm", "op", nan), ("aten::mm", "annotation", nan),
                     ("aten::addmm", "op", 7.0), ("aten::addmm", "op", nan), ("aten::relu", "op", nan)])
    flops = attach_flops(trace, {"aten::mm": 10.0, "aten::addmm": 8.0, "absent": 1.0}).events["flops"].to_pylist()
    assert flops[:2] == [5.0, 5.0]
    assert math.isnan(flops[2])  # not an op
    assert flops[3:5] == [7.0, 4.0]  # a value from the file is kept
    assert math.isnan(flops[5])
    assert attach_flops(trace, {"aten::mm": 1.0}).metadata["flops"]["source"].startswith("torch.profiler")


@pytest.mark.slow
def test_compiled_variant_shows_its_generated_kernels(gpt, tmp_path):
    run, trace, _ = _profile(gpt, tmp_path, variant="compile", warmup_steps=1, active_steps=1)
    fused = {name for name in _names(trace) if "cpp_fused" in name}
    assert fused, "inductor's generated kernels should be named events"
    assert run.notes["kernel_profile"] is True
    assert {*LIFECYCLE, "step 0"} <= _names(trace, "annotation")
