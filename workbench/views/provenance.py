"""Kernels traced to the model's source ops (`workbench.analysis.provenance`), drawn: the "by source op" section
of the comparison view (two runs' kernels grouped by the source ops they compute, in a sentence each: "9 eager
ops took 105 µs; in compile they are 3 fused kernels of 4.1 µs"), the fused kernels with their source ops
beside the fusion table, and the same as text tables for the command line."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from bokeh.models import Paragraph

from workbench.analysis.provenance import compare_by_source_op, kernel_label, provenance
from workbench.errors import WorkbenchError
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name
from workbench.views._table import data_table
from workbench.views.text_tables import TextTable, cells, format_count, format_duration

KERNEL_COLUMNS = ("kernel", "kind", "how", "calls", "time", "source ops")
FUSED_COLUMNS = ("variant", "kernel", "how", "per step", "source ops")


def group_sentence(row: pd.Series, a: str, b: str, a_kind: str) -> str:
    """One group of `compare_by_source_op` in words: "7 eager ops took 410 µs; in compile they are one fused
    kernel of 120 µs" (per profiled step)."""
    noun = "op" if a_kind == "eager" else "kernel"
    fused = "fused " if row["n_source_ops"] > 1 else ""
    one = row["a_n"] == 1
    if row["b_n"] == 0:
        there = f"{'it runs' if one else 'they run'} no kernel"
    elif row["b_n"] == 1:
        there = f"{'it is' if one else 'they are'} one {fused}kernel of {format_duration(row['b_ns'])}"
    else:
        there = f"{'it is' if one else 'they are'} {format_count(row['b_n'])} {fused}kernels of " \
                f"{format_duration(row['b_ns'])}"
    if row["a_n"] == 0:
        return f"no {a} {noun}; in {b}: {format_count(row['b_n'])} kernels of {format_duration(row['b_ns'])}"
    return f"{format_count(row['a_n'])} {a} {noun}{'' if one else 's'} took {format_duration(row['a_ns'])}; " \
           f"in {b} {there}"


def comparison_frame(compare: pd.DataFrame) -> pd.DataFrame:
    """`compare_by_source_op`'s groups for display: the sentence, the source ops, both times and the speedup."""
    a, b, kind = compare.attrs.get("a", "a"), compare.attrs.get("b", "b"), compare.attrs.get("a_kind", "")
    return pd.DataFrame({
        "what": [group_sentence(row, a, b, kind) for _, row in compare.iterrows()],
        "source_ops": [", ".join(ops) for ops in compare["source_ops"]],
        "a": compare["a_ns"].to_numpy(), "b": compare["b_ns"].to_numpy(), "speedup": compare["speedup"].to_numpy(),
    })


def by_source_op_parts(base: Bundle, others: Sequence[Bundle], *, width: int = 1100, top: int = 40) -> list:
    """The comparison view's "by source op" section: per other run, its kernels grouped with the base run's by
    the source ops they compute. A run whose kernels cannot be traced (no trace, no HLO) is left out."""
    parts: list = []
    for other in others:
        try:
            compare = compare_by_source_op(base, other)
        except WorkbenchError:
            continue
        shown = comparison_frame(compare).head(top)
        shown["a"] /= 1e3
        shown["b"] /= 1e3
        a, b = compare.attrs["a"], compare.attrs["b"]
        parts.append(Paragraph(text=f"by source op: {a} against {b}, per profiled step (kernels grouped by the "
                                    f"model's ops they compute; top {top} groups by time)", width=width))
        parts.append(data_table(shown, [("what", "what", None), ("source_ops", "source ops", None),
                                        ("a", f"{a} (µs)", "0,0.0"), ("b", f"{b} (µs)", "0,0.0"),
                                        ("speedup", "speedup", "0,0.00")],
                                width=width, height=30 + 28 * max(len(shown), 1), widths={"what": 420},
                                hover=("what", "source_ops")))
    return parts


def fused_kernels_frame(bundles: Sequence[Bundle], names: Sequence[str]) -> pd.DataFrame:
    """The fused kernels (those computing several source ops) of each run, with their source ops and time per
    profiled step: | variant | kernel | how | per step | source ops |. Runs that cannot be traced are left out."""
    frames = []
    for bundle, name in zip(bundles, names, strict=True):
        try:
            table = provenance(bundle)
        except WorkbenchError:
            continue
        fused = table[table["fused"]]
        steps = max(int(table["calls"].max()), 1) if len(table) else 1
        frames.append(pd.DataFrame({"variant": name, "kernel": fused["kernel"], "how": fused["how"],
                                    "per step": fused["time_ns"] / steps / 1e3,
                                    "source ops": [", ".join(ops) for ops in fused["source_ops"]]}))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(FUSED_COLUMNS))


def fused_kernels_parts(bundles: Sequence[Bundle], names: Sequence[str], *, width: int = 1100) -> list:
    """Beside the fusion table: each run's fused kernels with the source ops they compute."""
    frame = fused_kernels_frame(bundles, names)
    if frame.empty:
        return []
    return [Paragraph(text="fused kernels and the source ops each computes (per profiled step)", width=width),
            data_table(frame, [("variant", "variant", None), ("kernel", "kernel", None), ("how", "how", None),
                               ("per step", "per step (µs)", "0,0.00"), ("source ops", "source ops", None)],
                       width=width, height=min(30 + 28 * len(frame), 420), widths={"kernel": 300, "source ops": 420},
                       hover=("kernel", "source ops"))]


def provenance_table(bundle: Bundle, table: pd.DataFrame, top: int) -> TextTable:
    """A run's kernels with their source ops, as text (`workbench provenance RUN`)."""
    return TextTable(f"{display_name(bundle.record)}: kernels and their source ops (top {top} by time)",
                     KERNEL_COLUMNS, tuple(cells(kernel_label(row.kernel, row.instance), row.source_kind, row.how,
                                                 format_count(row.calls), format_duration(row.time_ns),
                                                 ", ".join(row.source_ops)) for row in table.head(top).itertuples()),
                     left=frozenset({"kernel", "kind", "how", "source ops"}))


def source_op_table(bundle: Bundle, sources: pd.DataFrame, top: int) -> TextTable:
    """A run's time per source op, as text."""
    return TextTable(f"{display_name(bundle.record)}: time per source op (a kernel's time split evenly over its "
                     f"source ops; top {top})", ("source op", "type", "kernels", "per step", "share", "code"),
                     tuple(cells(row.source_op, row.op_type, format_count(row.n_kernels),
                                 format_duration(row.per_step_ns), f"{row.share:.1%}", row.code or "-")
                           for row in sources.head(top).itertuples()),
                     left=frozenset({"source op", "type", "code"}))


def comparison_table(compare: pd.DataFrame, top: int) -> TextTable:
    """Two runs' kernels grouped by source op, as text."""
    shown = comparison_frame(compare).head(top)
    a, b = compare.attrs.get("a", "a"), compare.attrs.get("b", "b")
    return TextTable(f"by source op: {a} against {b}, per profiled step (top {top} groups)",
                     ("what", a, b, "speedup", "source ops"),
                     tuple(cells(row.what, format_duration(row.a), format_duration(row.b),
                                 "-" if row.speedup != row.speedup else f"{row.speedup:.2f}×", row.source_ops)
                           for row in shown.itertuples()),
                     left=frozenset({"what", "source ops"}))
