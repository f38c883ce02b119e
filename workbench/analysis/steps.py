"""Profiled steps of a trace: where each measured iteration starts and ends.

The workbench labels each measured iteration `step N` (`workbench.trace.schema.step_label`), torch's
profiler adds `ProfilerStep#N` around the same iterations and XProf captures mark them with
`StepTraceAnnotation` (a `step_num` in args): one family is picked so each step counts once.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from workbench.analysis.breakdown import phase_window
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE, STEP_PREFIX

_OWN_STEP_PATTERN = rf"{re.escape(STEP_PREFIX)}\d+"

STEP_NAME = re.compile(rf"^({_OWN_STEP_PATTERN}|ProfilerStep#\d+)$")
"""Names of step annotations: the workbench's own and torch.profiler's."""

_OWN_STEP = re.compile(rf"^{_OWN_STEP_PATTERN}$")  # the workbench's `step_label`


def step_windows(trace: Trace) -> pd.DataFrame:
    """The profiled steps of a trace: | step | start_ns | end_ns |, in time order.

    The workbench's own `step N` annotations when present, else torch's `ProfilerStep#N`, else XProf step
    annotations (`StepTraceAnnotation`, a `step_num` in args); one family only, so a trace holding both
    `step N` and `ProfilerStep#N` counts each step once. A trace without steps is one step: its `measure`
    phase, else the whole trace.
    """
    return step_windows_of(trace.df(), trace)


def step_windows_of(events: pd.DataFrame, trace: Trace) -> pd.DataFrame:
    """`step_windows` over the trace's events table when the caller has it converted already."""
    notes = events[events["kind"] == "annotation"]
    names = notes["name"].astype(str)
    own = names.str.match(_OWN_STEP)
    for family in (own, names.str.match(STEP_NAME) & ~own, notes["args"].map(_has_step_num).astype(bool)):
        picked = notes[family.to_numpy()]
        if not picked.empty:
            picked = picked.sort_values("start_ns")
            return pd.DataFrame({"step": np.arange(len(picked)), "start_ns": picked["start_ns"].to_numpy(),
                                 "end_ns": (picked["start_ns"] + picked["dur_ns"]).to_numpy()})
    window = phase_window(trace, PHASE_MEASURE)
    if window is None:
        window = (int(events["start_ns"].min()), int((events["start_ns"] + events["dur_ns"]).max())) \
            if not events.empty else (0, 0)
    return pd.DataFrame({"step": [0], "start_ns": [window[0]], "end_ns": [window[1]]})


def steps_in(trace: Trace) -> int:
    """Number of profiled steps, at least 1 (a trace without step annotations is one step)."""
    return len(step_windows(trace))


def first_step_ns(trace: Trace) -> int:
    """Start of the first profiled step (else of the `measure` phase, else of the trace)."""
    return int(step_windows(trace)["start_ns"].iloc[0])


def aligned_on_first_step(trace: Trace) -> Trace:
    """The trace with its times shifted so that its first profiled step starts at 0 ns."""
    offset = first_step_ns(trace)
    events = trace.events.set_column(0, "start_ns", pc.subtract(trace.events["start_ns"], offset))
    memory = trace.memory.set_column(0, "ts_ns", pc.subtract(trace.memory["ts_ns"], offset))
    counters = trace.counters.set_column(0, "ts_ns", pc.subtract(trace.counters["ts_ns"], offset))
    return Trace(events=events, memory=memory, counters=counters,
                 metadata={**trace.metadata, "aligned_offset_ns": offset})


def _has_step_num(args: object) -> bool:
    """Whether an event's args JSON carries XProf's `step_num` (a StepTraceAnnotation)."""
    if not isinstance(args, str) or "step_num" not in args:
        return False
    try:
        return "step_num" in json.loads(args)
    except (ValueError, TypeError):
        return False
