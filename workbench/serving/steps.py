"""Engine steps of a serving trace: the step annotations vLLM and SGLang write, parsed into a `steps` table.

An engine runs in steps: each schedules some requests' prefill tokens and others' next decode token into one
batch and runs the model once. The engines name each step with an annotation (a `user_annotation` in Kineto
traces, kind `annotation` here) that says what the batch held:

- vLLM on GPU: `execute_8192_context_9(sq8155sk8430sqsq…sqsk…)_generation_37(sq37sk34489sqsq…sqsk…)`: 8,192
  scheduled tokens; 9 prefill requests with 8,155 query tokens over 8,430 context (KV) tokens; 37 decode
  requests with 37 query tokens over 34,489 context tokens;
- vLLM on CPU: `execute_context_4(164)_generation_0(0)`: 4 prefill requests of 164 tokens, no decode;
- SGLang: `step[EXTEND bs=15 toks=15360]`, `step[DECODE bs=32]` (a forward mode, its batch and tokens), often
  around or inside a vLLM-style `execute_…` annotation of the same step: the two are one row.

One row per step, in start order: | step | start_ns | dur_ns | engine | annotation | mode | scheduled_tokens |
prefill_requests | prefill_tokens | prefill_context_tokens | decode_requests | decode_tokens |
decode_context_tokens | batch_requests | kernels | kernel_ns | pid | tid | row |. `mode` is prefill, decode or
mixed (SGLang's own word, lower case, where only it is known); a figure the annotation does not give is null.
`kernels` and `kernel_ns` count the device kernels whose launching host event (their op, else their runtime
call) starts inside the step on its thread, a graph launch's replayed kernels included; `row` is the
annotation's row in the events table.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from workbench.analysis.timeline import dictionary_codes
from workbench.trace import Trace
from workbench.trace.columns import floats, lookup

STEPS_SCHEMA = pa.schema([
    ("step", pa.int64()), ("start_ns", pa.int64()), ("dur_ns", pa.int64()), ("engine", pa.string()),
    ("annotation", pa.string()), ("mode", pa.string()), ("scheduled_tokens", pa.int64()),
    ("prefill_requests", pa.int64()), ("prefill_tokens", pa.int64()), ("prefill_context_tokens", pa.int64()),
    ("decode_requests", pa.int64()), ("decode_tokens", pa.int64()), ("decode_context_tokens", pa.int64()),
    ("batch_requests", pa.int64()), ("kernels", pa.int64()), ("kernel_ns", pa.int64()), ("pid", pa.int64()),
    ("tid", pa.int64()), ("row", pa.int64()),
])
"""Columns of the `steps` table."""

_VLLM = re.compile(r"execute(?:_(?P<scheduled>\d+))?_context_(?P<prefill>\d+)\((?P<prefill_detail>[^)]*)\)"
                   r"_generation_(?P<decode>\d+)\((?P<decode_detail>[^)]*)\)")
_DETAIL = re.compile(r"sq(?P<tokens>\d+)sk(?P<context>\d+)")
_SGLANG = re.compile(r"step\[(?P<mode>[A-Z_]+)(?: bs=(?P<bs>\d+))?(?: toks=(?P<toks>\d+))?\]")
_FIELDS = [f.name for f in STEPS_SCHEMA][6:14]
"""The batch figures an annotation may give (scheduled_tokens to batch_requests)."""


def parse_step(name: str) -> dict[str, Any] | None:
    """The engine and batch figures of a step annotation's `name`; None when it names no engine step."""
    if (match := _VLLM.fullmatch(name)) is not None:
        figures: dict[str, Any] = {"engine": "vllm", "prefill_requests": int(match["prefill"]),
                                   "decode_requests": int(match["decode"])}
        if match["scheduled"]:
            figures["scheduled_tokens"] = int(match["scheduled"])
        for side in ("prefill", "decode"):
            detail = match[f"{side}_detail"]
            if detail.isdigit():
                figures[f"{side}_tokens"] = int(detail)
            elif (inner := _DETAIL.match(detail)) is not None:
                figures[f"{side}_tokens"] = int(inner["tokens"])
                figures[f"{side}_context_tokens"] = int(inner["context"])
        if "scheduled_tokens" not in figures and "prefill_tokens" in figures and "decode_tokens" in figures:
            figures["scheduled_tokens"] = figures["prefill_tokens"] + figures["decode_tokens"]
        figures["batch_requests"] = figures["prefill_requests"] + figures["decode_requests"]
        figures["mode"] = ("mixed" if figures["prefill_requests"] and figures["decode_requests"]
                           else "prefill" if figures["prefill_requests"] else "decode")
        return figures
    if (match := _SGLANG.fullmatch(name)) is not None:
        mode = match["mode"].lower()
        figures = {"engine": "sglang", "mode": {"extend": "prefill"}.get(mode, mode)}
        if match["bs"]:
            figures["batch_requests"] = int(match["bs"])
            if figures["mode"] in ("prefill", "decode"):
                figures[f"{figures['mode']}_requests"] = int(match["bs"])
        if match["toks"]:
            figures["scheduled_tokens"] = int(match["toks"])
        return figures
    return None


def engine_steps(trace: Trace) -> pa.Table | None:
    """The `steps` table of `trace` (see the module docstring); None when it holds no step annotation."""
    events = trace.events
    codes, names = dictionary_codes(events["name"])
    parsed = {code: figures for code, value in enumerate(names)
              if value and (figures := parse_step(value)) is not None}
    if not parsed:
        return None
    kind_codes, kinds = dictionary_codes(events["kind"])
    kind = kinds[kind_codes]
    rows = np.flatnonzero(np.isin(codes, list(parsed)) & (kind == "annotation"))
    if not len(rows):
        return None
    start, dur = (events[c].to_numpy() for c in ("start_ns", "dur_ns"))
    pid, tid = (events[c].to_numpy() for c in ("pid", "tid"))
    steps = _merged([{"start_ns": int(start[r]), "dur_ns": int(dur[r]), "pid": int(pid[r]), "tid": int(tid[r]),
                      "row": int(r), "annotation": str(names[codes[r]]), **parsed[int(codes[r])]}
                     for r in rows[np.lexsort((start[rows], tid[rows], pid[rows]))]])
    _count_kernels(steps, kind, _launching_rows(kind, events["launcher"].to_numpy(), events["corr"].to_numpy()),
                   start, dur, pid, tid)
    steps.sort(key=lambda s: (s["start_ns"], s["row"]))
    columns = {name: [s.get(name) for s in steps] for name in STEPS_SCHEMA.names}
    columns["step"] = list(range(len(steps)))
    return pa.table(columns, schema=STEPS_SCHEMA)


def _merged(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per step: an annotation inside another on the same thread (SGLang's `step[…]` within its
    `execute_…`, or around it) is the same step (`_one_step`)."""
    out: list[dict[str, Any]] = []
    for step in steps:  # by thread, then start
        last = out[-1] if out else None
        if last is not None and (last["pid"], last["tid"]) == (step["pid"], step["tid"]) and _nested(last, step):
            out[-1] = _one_step(last, step)
        else:
            out.append(step)
    return out


def _one_step(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two annotations of one step as one row: the outer one's times, row and name; the vLLM-style figures
    over SGLang's where both give one."""
    outer = a if a["dur_ns"] >= b["dur_ns"] else b
    combined = {k: v for s in sorted((a, b), key=lambda s: s["engine"] == "vllm") for k, v in s.items()
                if v is not None}
    combined.update({k: outer[k] for k in ("start_ns", "dur_ns", "row", "annotation")})
    combined["engine"] = "sglang" if "sglang" in (a["engine"], b["engine"]) else "vllm"
    return combined


def _nested(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether one of the two spans lies inside the other."""
    a_end, b_end = a["start_ns"] + a["dur_ns"], b["start_ns"] + b["dur_ns"]
    return (a["start_ns"] <= b["start_ns"] and b_end <= a_end) or (b["start_ns"] <= a["start_ns"] and a_end <= b_end)


def _launching_rows(kind: np.ndarray, launcher: np.ndarray, corr: np.ndarray) -> np.ndarray:
    """Per event, the host event that launched it: its launching op, else the runtime call of its correlation id
    (the kernels a graph launch replays have no op around their launch in SGLang's traces, only Python frames)."""
    runtime = np.flatnonzero((kind == "runtime") & (corr >= 0))
    by_call = np.where(corr >= 0, lookup(corr, corr[runtime], runtime), -1)
    return np.where(launcher >= 0, launcher, by_call)


def _count_kernels(steps: list[dict[str, Any]], kind: np.ndarray, launcher: np.ndarray, start: np.ndarray,
                   dur: np.ndarray, pid: np.ndarray, tid: np.ndarray) -> None:
    """Set each step's `kernels` and `kernel_ns`: the kernels whose launching host event (`_launching_rows`)
    starts inside it on its thread."""
    kernels = np.flatnonzero((kind == "kernel") & (launcher >= 0) & (launcher < len(kind)))
    by = launcher[kernels]
    for thread in {(s["pid"], s["tid"]) for s in steps}:
        own = sorted((s for s in steps if (s["pid"], s["tid"]) == thread), key=lambda s: s["start_ns"])
        begins = np.array([s["start_ns"] for s in own], dtype=np.int64)
        ends = begins + np.array([s["dur_ns"] for s in own], dtype=np.int64)
        here = (pid[by] == thread[0]) & (tid[by] == thread[1])
        at = start[by[here]]
        slot = np.searchsorted(begins, at, side="right") - 1
        inside = (slot >= 0) & (at < ends[np.maximum(slot, 0)])
        count = np.bincount(slot[inside], minlength=len(own))
        busy = np.bincount(slot[inside], weights=dur[kernels[here][inside]], minlength=len(own))
        for step, n, ns in zip(own, count.tolist(), busy.tolist(), strict=True):
            step["kernels"], step["kernel_ns"] = int(n), int(ns)


def steps_summary(steps: pa.Table | None) -> dict[str, Any] | None:
    """The headline of a `steps` table (`workbench show`): how many steps, and per mode their count, median
    and p90 duration, mean batch and median kernels; the prefill and decode tokens in all. None without steps."""
    if steps is None or not steps.num_rows:
        return None
    modes = np.asarray(steps["mode"].to_pylist(), dtype=object)
    dur_ms = steps["dur_ns"].to_numpy() / 1e6
    batch = floats(steps["batch_requests"])
    kernels = steps["kernels"].to_numpy()
    by_mode = {}
    for mode in sorted(set(modes.tolist()), key=str):
        here = modes == mode
        known = batch[here][~np.isnan(batch[here])]
        by_mode[str(mode)] = {"steps": int(here.sum()), "median_ms": float(np.median(dur_ms[here])),
                              "p90_ms": float(np.percentile(dur_ms[here], 90)),
                              "mean_batch": float(known.mean()) if len(known) else None,
                              "median_kernels": float(np.median(kernels[here]))}
    return {"steps": steps.num_rows, "by_mode": by_mode,
            "prefill_tokens": int(pc.sum(steps["prefill_tokens"]).as_py() or 0),
            "decode_tokens": int(pc.sum(steps["decode_tokens"]).as_py() or 0)}
