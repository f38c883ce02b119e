"""Tables of recorded generation runs (bundles written by `workbench.llm.run`), for the views.

Pure functions over run.json and the Trace; they never plot.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from workbench.analysis.breakdown import phase_window
from workbench.trace import Trace
from workbench.trace.schema import PHASE_MEASURE
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import RunInfo, display_name, number

STEP_LABEL = re.compile(r"^(prefill|decode (\d+)|draft|verify)$")
"""Labels of a generation's steps (`workbench.llm.generate`, `workbench.llm.speculative`)."""

STEP_COLUMNS = ("label", "kind", "step", "start_ns", "dur_ns")
VARIANT_COLUMNS = ("variant", "run", "status", "attention", "kv", "decoding", "batch", "prompt", "new", "ttft_ms",
                   "tpot_ms", "tpot_p99_ms", "itl_p99_ms", "tokens_per_s", "kv_cache_bytes",
                   "kv_cache_bytes_predicted", "peak_memory_bytes", "acceptance_rate", "speedup_vs_greedy",
                   "sqnr_db", "token_match")


def trace_decode_steps(trace: Trace) -> pd.DataFrame:
    """The labelled steps of the captured generation, in time order, times from the prefill's start:

    | label | kind | step | start_ns | dur_ns |

    `kind` is prefill, decode, draft or verify; `step` is the decode round (-1 for the prefill; a
    speculative round's draft and verify take the number of the round they sit in). Only spans inside
    the first `measure` phase count when the trace has one.
    """
    events = trace.df()
    notes = events[(events["kind"] == "annotation") & events["name"].astype(str).str.match(STEP_LABEL)]
    window = phase_window(trace, PHASE_MEASURE)
    if window is not None:
        notes = notes[(notes["start_ns"] >= window[0]) & (notes["start_ns"] < window[1])]
    if notes.empty:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c.endswith("_ns") or c == "step" else "object")
                             for c in STEP_COLUMNS})
    notes = notes.sort_values("start_ns")
    labels = notes["name"].astype(str).to_numpy()
    kinds = np.array([label.split(" ")[0] for label in labels], dtype=object)
    numbers = np.array([int(m.group(2)) if (m := STEP_LABEL.match(label)).group(2) else -1 for label in labels])
    # draft / verify take the number of the decode round that encloses them (the latest one started)
    rounds = np.maximum.accumulate(np.where(kinds == "decode", numbers, -1))
    origin = int(notes["start_ns"].iloc[0])
    return pd.DataFrame({"label": labels, "kind": kinds, "step": np.where(kinds == "prefill", -1, rounds),
                         "start_ns": notes["start_ns"].to_numpy() - origin, "dur_ns": notes["dur_ns"].to_numpy()})


def timed_steps(record: RunInfo) -> pd.DataFrame:
    """Every timed generation's steps from run.json, long form:

    | repeat | step | kind | dur_ms | tokens | start_ms |

    `step` -1 is the prefill; `start_ms` is from the start of that repeat.
    """
    frames = []
    for repeat, timed in enumerate((record.generation or {}).get("timed") or []):
        durations = np.asarray(timed.get("step_ms") or [], dtype=np.float64)
        if not durations.size:
            continue
        frames.append(pd.DataFrame({
            "repeat": repeat, "step": np.arange(len(durations)) - 1,
            "kind": np.where(np.arange(len(durations)) == 0, "prefill", "decode"),
            "dur_ms": durations, "tokens": np.asarray(timed.get("step_tokens") or [1] * len(durations)),
            "start_ms": np.concatenate([[0.0], np.cumsum(durations)[:-1]]),
        }))
    if not frames:
        return pd.DataFrame({"repeat": pd.Series(dtype="int64"), "step": pd.Series(dtype="int64"),
                             "kind": pd.Series(dtype="object"), "dur_ms": pd.Series(dtype="float64"),
                             "tokens": pd.Series(dtype="int64"), "start_ms": pd.Series(dtype="float64")})
    return pd.concat(frames, ignore_index=True)


def timeline_steps(bundle: Bundle) -> tuple[pd.DataFrame, str]:
    """The steps to draw on a run's decode timeline (`trace_decode_steps` columns) and where they come from:
    the profiled generation's labelled spans, else the run's first timed generation."""
    steps = trace_decode_steps(bundle.trace()) if bundle.has_trace else pd.DataFrame()
    if not steps.empty:
        return steps, "profiled generation"
    timed = timed_steps(bundle.record)
    timed = timed[timed["repeat"] == 0]
    steps = pd.DataFrame({"label": ["prefill" if s < 0 else f"decode {s}" for s in timed["step"]],
                          "kind": timed["kind"].to_numpy(), "step": timed["step"].to_numpy(),
                          "start_ns": np.round(timed["start_ms"].to_numpy() * 1e6).astype("int64"),
                          "dur_ns": np.round(timed["dur_ms"].to_numpy() * 1e6).astype("int64")},
                         columns=list(STEP_COLUMNS))
    return steps, "first timed generation"


def variant_table(bundles: Sequence[Bundle]) -> pd.DataFrame:
    """One row per generation run with its headline figures (`VARIANT_COLUMNS`); runs that are not
    generation runs are left out. `sqnr_db` and `token_match` compare the run with the fp32 KV cache
    (None for fp32 runs); for speculative runs `token_match` is against the target's greedy output."""
    rows = []
    for bundle in bundles:
        record = bundle.record
        llm = record.llm
        if llm is None:
            continue
        numerics = llm.get("numerics") or {}
        vs_fp32 = numerics.get("vs_fp32_cache") or {}
        tokens = (vs_fp32.get("tokens") or numerics.get("matches_greedy") or {})
        speculative = llm.get("speculative") or {}
        rows.append({
            "variant": display_name(record),
            "run": bundle.run_id,
            "status": record.status,
            "attention": llm.get("attention"),
            "kv": llm.get("kv"),
            "decoding": llm.get("decoding"),
            "batch": llm.get("batch", (record.variant or {}).get("batch")),
            "prompt": llm.get("prompt"),
            "new": llm.get("new"),
            "ttft_ms": llm.get("ttft_ms"),
            "tpot_ms": llm.get("tpot_ms"),
            "tpot_p99_ms": llm.get("tpot_p99_ms"),
            "itl_p99_ms": (llm.get("itl_ms") or {}).get("p99"),
            "tokens_per_s": llm.get("tokens_per_s"),
            "kv_cache_bytes": llm.get("kv_cache_bytes"),
            "kv_cache_bytes_predicted": llm.get("kv_cache_bytes_predicted"),
            "peak_memory_bytes": llm.get("peak_memory_bytes"),
            "acceptance_rate": speculative.get("acceptance_rate"),
            "speedup_vs_greedy": speculative.get("speedup_vs_greedy"),
            "sqnr_db": number((vs_fp32.get("logits") or {}).get("sqnr_db")),
            "token_match": tokens.get("token_match"),
        })
    return pd.DataFrame(rows, columns=list(VARIANT_COLUMNS))

