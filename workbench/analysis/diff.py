"""Diff of two traces (two runs, or two imported traces): per name and kind, count and time in each.

`trace_diff` is the table: one row per (name, kind) present in either trace, with its count and total
time in `a` (the control) and `b` (the test), the deltas, and a status: `new` (only in b), `vanished`
(only in a: what fusion or a change removed), `changed` or `unchanged`. `diff_summary` condenses it
for a report or `--json`; `aligned_pair` shifts both traces so their first profiled step starts at
0 ns, for side-by-side timelines (`workbench.analysis.steps.aligned_on_first_step`). Per-variant kernels,
fusions and unfused ops are `workbench.analysis.fusion.fusion_table`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from workbench.analysis.breakdown import phase_window
from workbench.analysis.idle import busy_by_device, covered_ns, merge_intervals
from workbench.analysis.steps import STEP_NAME, aligned_on_first_step, step_windows_of, steps_in
from workbench.errors import WorkbenchError
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.records import RunInfo, display_name

if TYPE_CHECKING:
    import pyarrow as pa

    from workbench.trace.store.bundle import Bundle

DIFF_COLUMNS = ("name", "kind", "count_a", "count_b", "time_a_ns", "time_b_ns", "delta_count", "delta_ns", "ratio",
                "status")
"""Columns of `trace_diff`, in order."""

STATUSES = ("new", "vanished", "changed", "unchanged")

DIFF_KINDS = ("op", "kernel", "memcpy", "memset", "runtime", "annotation", "hlo", "module", "layer")
"""Event kinds diffed by default (Python frames and `other` events are left out)."""


def trace_diff(a: Trace, b: Trace, kinds: tuple[str, ...] = DIFF_KINDS, *, window_a: tuple[int, int] | None = None,
               window_b: tuple[int, int] | None = None, per_step: bool = False) -> pd.DataFrame:
    """Per (name, kind): count and time in `a` and `b`, their deltas (b - a) and the status.

    | name | kind | count_a | count_b | time_a_ns | time_b_ns | delta_count | delta_ns | ratio | status |

    Time is the events' total duration (nested events each count theirs). Only events starting in a
    trace's window count when it has one; with `per_step` counts and times are divided by the trace's
    number of profiled steps (`steps.steps_in`), so runs of different lengths compare. `ratio` is
    time_b / time_a (NaN for new names). Sorted by the size of the time delta.
    """
    left = _totals(a, kinds, window_a, steps_in(a) if per_step else 1).rename(
        columns={"count": "count_a", "time_ns": "time_a_ns"})
    right = _totals(b, kinds, window_b, steps_in(b) if per_step else 1).rename(
        columns={"count": "count_b", "time_ns": "time_b_ns"})
    table = left.merge(right, on=["name", "kind"], how="outer")
    if table.empty:
        return pd.DataFrame({c: pd.Series(dtype=object if c in ("name", "kind", "status") else np.float64)
                             for c in DIFF_COLUMNS})
    for column in ("count_a", "count_b", "time_a_ns", "time_b_ns"):
        table[column] = table[column].fillna(0)
        if not per_step:
            table[column] = table[column].astype(np.int64)
    table["delta_count"] = table["count_b"] - table["count_a"]
    table["delta_ns"] = table["time_b_ns"] - table["time_a_ns"]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["ratio"] = np.where(table["time_a_ns"] > 0, table["time_b_ns"] / table["time_a_ns"].clip(lower=1), np.nan)
    table["status"] = np.select(
        [table["count_a"] == 0, table["count_b"] == 0, (table["delta_count"] == 0) & (table["delta_ns"] == 0)],
        ["new", "vanished", "unchanged"], default="changed")
    order = table["delta_ns"].abs().sort_values(ascending=False, kind="stable").index
    return table.loc[order, list(DIFF_COLUMNS)].reset_index(drop=True)


def diff_summary(table: pd.DataFrame, top: int = 10) -> dict[str, Any]:
    """The gist of a `trace_diff` table as JSON-ready values.

    `{"names": {status: n}, "time_ns": {kind: {"a", "b", "delta"}}, "new": [...], "vanished": [...],
    "grew": [...], "shrank": [...]}`; the lists hold the `top` rows by time (`name, kind, count_a,
    count_b, time_a_ns, time_b_ns, delta_ns`). Kernel names that vanish while others appear are what a
    fusing compiler replaced.
    """
    names = {s: int((table["status"] == s).sum()) for s in STATUSES}
    by_kind = table.groupby("kind")[["time_a_ns", "time_b_ns"]].sum()
    time_ns = {str(k): {"a": _json_number(r["time_a_ns"]), "b": _json_number(r["time_b_ns"]),
                        "delta": _json_number(r["time_b_ns"] - r["time_a_ns"])} for k, r in by_kind.iterrows()}
    changed = table[table["status"] == "changed"]
    return {
        "names": names,
        "time_ns": time_ns,
        "new": _rows(table[table["status"] == "new"].nlargest(top, "time_b_ns")),
        "vanished": _rows(table[table["status"] == "vanished"].nlargest(top, "time_a_ns")),
        "grew": _rows(changed[changed["delta_ns"] > 0].nlargest(top, "delta_ns")),
        "shrank": _rows(changed[changed["delta_ns"] < 0].nsmallest(top, "delta_ns")),
    }


def aligned_pair(a: Trace, b: Trace) -> tuple[Trace, Trace]:
    """Both traces shifted so that each one's first profiled step starts at 0 ns (for aligned timelines);
    each keeps its shift in `metadata["aligned_offset_ns"]`."""
    return aligned_on_first_step(a), aligned_on_first_step(b)


def _totals(trace: Trace, kinds: tuple[str, ...], window: tuple[int, int] | None, steps: int) -> pd.DataFrame:
    """| name | kind | count | time_ns | of the events of `kinds` (starting in `window` when given)."""
    events = trace.events.select(["start_ns", "dur_ns", "name", "kind"]).to_pandas()
    keep = events["kind"].isin(kinds)
    if window is not None:
        keep &= (events["start_ns"] >= window[0]) & (events["start_ns"] < window[1])
    rows = events[keep]
    grouped = rows.groupby([rows["name"].astype(str), rows["kind"].astype(str)])["dur_ns"]
    totals = pd.DataFrame({"count": grouped.size(), "time_ns": grouped.sum()}).reset_index()
    if steps != 1:
        totals[["count", "time_ns"]] = totals[["count", "time_ns"]] / steps
    return totals


def _rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = ["name", "kind", "count_a", "count_b", "time_a_ns", "time_b_ns", "delta_ns"]
    return [{c: (v if isinstance(v, str) else _json_number(v)) for c, v in row.items()}
            for row in table[columns].to_dict("records")]


def _json_number(value: Any) -> int | float | None:
    """A JSON-ready number: ints stay ints, NaN becomes None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        return None if np.isnan(value) else (int(value) if value.is_integer() else value)
    return value


# -- comparison of several runs against a baseline ------------------------------------------------------------

COMPARE_KINDS = ("op", "kernel")
"""Kinds of the op-by-op and kernel-by-kernel deltas of `trace_comparison`."""

DELTA_COLUMNS = (*DIFF_COLUMNS, "mean_a_ns", "mean_b_ns")
"""Columns of a `RunPair.table`: `trace_diff`'s, then the mean time per call on each side (NaN without calls)."""

def run_names(records: Sequence[RunInfo]) -> list[str]:
    """Each record's display name (`records.display_name`: an import is named by its file), made unique: a repeated
    name gets its run id's tail appended."""
    names = [display_name(r) for r in records]
    seen = Counter(names)
    return [f"{n} ({r.run_id[-4:]})" if seen[n] > 1 else n for n, r in zip(names, records, strict=True)]


@dataclass
class RunFigures:
    """One run of a comparison: its name, what it counts (`scope`: the measure phase of a capture, the whole
    trace of an import), its step times and its devices' activity."""

    name: str
    run_id: str
    scope: str
    window: tuple[int, int] | None
    steps: dict[str, Any]
    devices: dict[str, dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "run": self.run_id, "scope": self.scope, "steps": self.steps,
                "devices": self.devices}


@dataclass
class RunPair:
    """One run against the baseline: the op and kernel deltas (`DELTA_COLUMNS`, largest regression first) and
    its devices beside the baseline's (paired by name, else in order)."""

    name: str
    run_id: str
    table: pd.DataFrame
    devices: list[dict[str, Any]]
    step_delta_ns: int | None
    step_ratio: float | None

    def deltas(self, kind: str, top: int) -> pd.DataFrame:
        """The `top` largest regressions of `kind` (time grew, new names first by size), then its `top` largest
        improvements (time shrank, vanished names included)."""
        rows = self.table[self.table["kind"] == kind]
        grew = rows[rows["delta_ns"] > 0].sort_values("delta_ns", ascending=False, kind="stable").head(top)
        shrank = rows[rows["delta_ns"] < 0].sort_values("delta_ns", kind="stable").head(top)
        return pd.concat([grew, shrank], ignore_index=True)

    def names(self, kind: str) -> dict[str, int]:
        """How many names of `kind` are new, vanished, changed and unchanged."""
        status = self.table.loc[self.table["kind"] == kind, "status"]
        return {s: int((status == s).sum()) for s in STATUSES}

    def to_json(self, top: int) -> dict[str, Any]:
        kinds = {}
        for kind in COMPARE_KINDS:
            rows = self.table[self.table["kind"] == kind]
            time_a, time_b = int(rows["time_a_ns"].sum()), int(rows["time_b_ns"].sum())
            kinds[kind] = {
                "names": self.names(kind),
                "count": {"baseline": int(rows["count_a"].sum()), "run": int(rows["count_b"].sum())},
                "time_ns": {"baseline": time_a, "run": time_b, "delta": time_b - time_a},
                "regressions": _delta_rows(rows[rows["delta_ns"] > 0].nlargest(top, "delta_ns")),
                "improvements": _delta_rows(rows[rows["delta_ns"] < 0].nsmallest(top, "delta_ns")),
                "new": _delta_rows(rows[rows["status"] == "new"].nlargest(top, "time_b_ns")),
                "vanished": _delta_rows(rows[rows["status"] == "vanished"].nlargest(top, "time_a_ns")),
            }
        return {"name": self.name, "run": self.run_id, "step_median_delta_ns": self.step_delta_ns,
                "step_ratio": self.step_ratio, **kinds, "devices": self.devices}


@dataclass
class TraceComparison:
    """Two or more runs against one of them, the baseline (`trace_comparison`)."""

    baseline: RunFigures
    runs: list[RunFigures]
    pairs: list[RunPair]

    def to_json(self, top: int = 20) -> dict[str, Any]:
        """JSON-ready: `{"baseline": name, "runs": [...], "comparisons": [...]}`; counts are integers, times ns."""
        return {"baseline": self.baseline.name, "baseline_run": self.baseline.run_id,
                "runs": [r.to_json() for r in self.runs], "comparisons": [p.to_json(top) for p in self.pairs]}


def trace_comparison(bundles: Sequence[Bundle], baseline: str | int | None = None, *,
                     phase: str | None = PHASE_MEASURE) -> TraceComparison:
    """Compare the traces of two or more runs against a baseline (the first run, or the one `baseline` names:
    its run id, its name, or its position): per run its step time (median and spread) and each device's busy,
    idle and copy/compute overlap time; per other run the op and kernel deltas against the baseline.

    Only each trace's `phase` annotation counts when it has one (a capture's measured steps); an import
    counts whole. A `WorkbenchError` when fewer than two runs have traces, or `baseline` names none of them.
    """
    runs = [b for b in bundles if b.has_trace]
    if len(runs) < 2:
        raise WorkbenchError(f"a comparison needs two runs with traces, got {len(runs)}"
                             + (f" (without a trace: {', '.join(b.run_id for b in bundles if not b.has_trace)})"
                                if len(runs) < len(bundles) else ""))
    names = run_names([b.record for b in runs])
    index = baseline_index(runs, names, baseline)
    traces = [b.trace() for b in runs]
    figures = [_run_figures(name, b, t, phase) for name, b, t in zip(names, runs, traces, strict=True)]
    base = figures[index]
    pairs = []
    for i, (fig, trace) in enumerate(zip(figures, traces, strict=True)):
        if i == index:
            continue
        table = trace_diff(traces[index], trace, COMPARE_KINDS, window_a=base.window, window_b=fig.window)
        with np.errstate(divide="ignore", invalid="ignore"):
            table["mean_a_ns"] = np.where(table["count_a"] > 0, table["time_a_ns"] / table["count_a"].clip(lower=1),
                                          np.nan)
            table["mean_b_ns"] = np.where(table["count_b"] > 0, table["time_b_ns"] / table["count_b"].clip(lower=1),
                                          np.nan)
        a, b = base.steps.get("median_ns"), fig.steps.get("median_ns")
        pairs.append(RunPair(fig.name, fig.run_id, table, _device_pairs(base.devices, fig.devices),
                             None if a is None or b is None else int(b - a), b / a if a and b is not None else None))
    return TraceComparison(base, figures, pairs)


def step_stats(trace: Trace, engine_steps: pa.Table | None = None) -> dict[str, Any]:
    """A run's step time: `{"source", "steps", "median_ns", "p10_ns", "p90_ns", "min_ns", "max_ns", "spread"}`.

    From the serving engine's steps table when the run has one, else the step annotations (`ProfilerStep#N`,
    the workbench's `step N`), else the measure phase or whole trace as one step (`source` says which);
    `spread` is (p90 - p10) / median.
    """
    if engine_steps is not None and engine_steps.num_rows:
        durations, source = engine_steps.column("dur_ns").to_numpy().astype(np.int64), "engine steps"
    else:
        events = trace.df()
        windows = step_windows_of(events, trace)
        durations = (windows["end_ns"] - windows["start_ns"]).to_numpy(dtype=np.int64)
        names = events.loc[events["kind"] == "annotation", "name"].astype(str)
        if names.str.match(STEP_NAME).any():
            source = "step annotations"
        else:
            source = "measure phase" if phase_window(trace, PHASE_MEASURE) else "whole trace"
    if not len(durations):
        return {"source": source, "steps": 0}
    p10, median, p90 = np.percentile(durations, [10, 50, 90])
    return {"source": source, "steps": len(durations), "median_ns": int(np.rint(median)),
            "p10_ns": int(np.rint(p10)), "p90_ns": int(np.rint(p90)), "min_ns": int(durations.min()),
            "max_ns": int(durations.max()), "spread": float((p90 - p10) / median) if median > 0 else None}


def device_activity(trace: Trace, window: tuple[int, int] | None = None) -> dict[str, dict[str, Any]]:
    """Per device with kernels: busy and idle ns (`idle.busy_by_device`), busy share of its span, and its
    compute (kernels) and copies (memcpy) as unions, with the time they overlap and the share of copy time
    hidden under compute."""
    busy = busy_by_device(trace, window)
    events = trace.events.select(["start_ns", "dur_ns", "kind", "device"]).to_pandas()
    events = events[events["kind"].isin(["kernel", "memcpy"])]
    result = {}
    for device, work in busy.items():
        here = events[events["device"].astype(str) == device]
        kernels, copies = here[here["kind"] == "kernel"], here[here["kind"] == "memcpy"]
        if kernels.empty:
            continue
        compute = _union(kernels, window)
        copy = _union(copies, window)
        compute_ns, copy_ns = int((compute[1] - compute[0]).sum()), int((copy[1] - copy[0]).sum())
        overlap = int(covered_ns(compute[0], compute[1], copy[0], copy[1]).sum()) if copy_ns else 0
        result[device] = {"busy_ns": work.busy_ns, "idle_ns": work.idle_ns, "span_ns": work.span_ns,
                          "busy_share": work.busy_ns / work.span_ns if work.span_ns else None,
                          "compute_ns": compute_ns, "copy_ns": copy_ns, "overlap_ns": overlap,
                          "copy_hidden_share": overlap / copy_ns if copy_ns else None}
    return result


def _union(events: pd.DataFrame, window: tuple[int, int] | None) -> tuple[np.ndarray, np.ndarray]:
    start = events["start_ns"].to_numpy(dtype=np.int64)
    end = start + events["dur_ns"].to_numpy(dtype=np.int64)
    if window is not None:
        start, end = np.maximum(start, window[0]), np.minimum(end, window[1])
    return merge_intervals(start, end)


def _run_figures(name: str, bundle: Bundle, trace: Trace, phase: str | None) -> RunFigures:
    window = phase_window(trace, phase) if phase else None
    scope = f"the {phase} phase" if window else "whole trace"
    return RunFigures(name, bundle.run_id, scope, window, step_stats(trace, bundle.table("steps")),
                      device_activity(trace, window))


DEVICE_FIGURES = ("busy_ns", "idle_ns", "compute_ns", "copy_ns", "overlap_ns")
"""Device figures compared between runs (`device_activity`)."""


def _device_pairs(base: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The devices of a run beside the baseline's: by name where both have it, else in order (an import of rank
    3 against one of rank 1 compares cuda:3 with cuda:1); a device on one side only is compared with nothing."""
    common = [d for d in base if d in other]
    rest_a, rest_b = [d for d in base if d not in other], [d for d in other if d not in base]
    pairs = [(d, d) for d in common] + list(zip(rest_a, rest_b, strict=False))
    pairs += [(d, None) for d in rest_a[len(rest_b):]] + [(None, d) for d in rest_b[len(rest_a):]]
    rows = []
    for a, b in pairs:
        fa, fb = base.get(a or "", {}), other.get(b or "", {})
        row: dict[str, Any] = {"baseline_device": a, "device": b}
        for key in DEVICE_FIGURES:
            va, vb = fa.get(key), fb.get(key)
            row[f"baseline_{key}"], row[key] = va, vb
            row[f"delta_{key}"] = vb - va if va is not None and vb is not None else None
        for key in ("busy_share", "copy_hidden_share"):
            row[f"baseline_{key}"], row[key] = fa.get(key), fb.get(key)
        rows.append(row)
    return rows


def baseline_index(runs: Sequence[Bundle], names: Sequence[str], baseline: str | int | None) -> int:
    """The position of the `baseline` run among `runs` (named `names`): given by position, run id, name or path;
    the first when None. A baseline that is none of them is an error naming the runs."""
    if baseline is None:
        return 0
    if isinstance(baseline, int):
        if not 0 <= baseline < len(runs):
            raise WorkbenchError(f"baseline {baseline}: there are {len(runs)} runs")
        return baseline
    for i, (bundle, name) in enumerate(zip(runs, names, strict=True)):
        if baseline in (bundle.run_id, name, str(bundle.path)):
            return i
    raise WorkbenchError(f"baseline {baseline!r} is none of the compared runs ({', '.join(names)})")


def _delta_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    columns = ["name", "kind", "status", "count_a", "count_b", "delta_count", "time_a_ns", "time_b_ns", "delta_ns",
               "mean_a_ns", "mean_b_ns"]
    renamed = {"count_a": "count_baseline", "count_b": "count", "time_a_ns": "time_baseline_ns", "time_b_ns": "time_ns",
               "mean_a_ns": "mean_baseline_ns", "mean_b_ns": "mean_ns"}
    means = ("mean_a_ns", "mean_b_ns")
    return [{renamed.get(c, c): (v if isinstance(v, str) else _json_number(round(v) if c in means and v == v else v))
             for c, v in row.items()} for row in table[columns].to_dict("records")]
