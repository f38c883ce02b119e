"""How a projected step moves when one knob of the accelerator changes, for one graph or across a set of models, and
how it scales over several chips.

A knob (`--sweep NAME=V1,V2,...`) is a factor on one figure of the description (`bandwidth`, `on_chip`, `rate`,
`rate.<dtype>`, `link`, `chip_link`: `Description.scaled`), the array shape (`array=64x64,128x128`:
`Description.with_array`, whose processing elements stay as they were, so the peak follows the array's area) or the
number of chips the graph is sharded over (`chips=1,2,4`: `projection.project(..., chips=)`, against one chip; every
other knob is projected on the `chips` a sweep is given). Each value is projected again;
the step time at it over the step time of the description as written is its `ratio` (below 1: faster), and
`speedup` is its inverse. Across a model set, the knob that buys the most for a model is the value of any knob
with the largest speedup; over the set, the geometric mean of the models' speedups at each value.

The scaling table (`scaling`) is the step on each of several chip counts: its speedup over one chip, the efficiency
(speedup / chips) and the share of the step spent in all-reduces on the chip links.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from workbench.codesign.description import FACTOR_SWEEPS, SWEEPS, Description, is_dtype_rate
from workbench.codesign.projection import project

KnobValue = float | tuple[int, int]
"""A factor, or an array shape (rows, columns)."""
SWEEP_COLUMNS = ("figure", "value", "factor", "time_ns", "speedup", "compute_share", "memory_share", "comm_share")
SET_COLUMNS = ("model", "figure", "value", "factor", "time_ns", "ratio")
SCALING_COLUMNS = ("chips", "time_ns", "speedup", "efficiency", "comm_ns", "comm_share")
_SHAPE = re.compile(r"\s*(\d+)\s*[x×]\s*(\d+)\s*")


def parse_sweep(text: str) -> tuple[str, list[KnobValue]]:
    """`bandwidth=0.5,1,2,4` as ("bandwidth", [0.5, 1.0, 2.0, 4.0]); `array=64x64,128x128` as ("array", [(64, 64),
    (128, 128)]); `chips=1,2,4` as ("chips", [1, 2, 4]); a `ValueError` naming what is wrong."""
    name, _, values = text.partition("=")
    name = name.strip()
    if not (name in FACTOR_SWEEPS or name in ("array", "chips") or is_dtype_rate(name)) or not values.strip():
        raise ValueError(f"--sweep {text!r}: expected NAME=V1,V2,... with NAME one of {', '.join(SWEEPS)}")
    items = [item.strip() for item in values.split(",")]
    if name == "chips":
        try:
            return name, [float(count) for count in parse_chips(values)]
        except ValueError as exc:
            raise ValueError(f"--sweep {text!r}: {exc}") from None
    if name == "array":
        shapes = [_SHAPE.fullmatch(item) for item in items]
        if not all(shapes) or any(int(d) < 1 for match in shapes if match for d in match.groups()):
            raise ValueError(f"--sweep {text!r}: array values are ROWSxCOLS with each >= 1, e.g. array=64x64,128x128")
        return name, [(int(match.group(1)), int(match.group(2))) for match in shapes if match]
    try:
        factors = [float(item) for item in items]
    except ValueError:
        raise ValueError(f"--sweep {text!r}: factors must be numbers, e.g. {name}=0.5,1,2,4") from None
    if not all(f > 0 and math.isfinite(f) for f in factors):
        raise ValueError(f"--sweep {text!r}: factors must be positive")
    return name, factors


def parse_chips(text: str) -> list[int]:
    """"1,2,4,8" as [1, 2, 4, 8]; a `ValueError` unless every count is a whole number >= 1."""
    items = [item.strip() for item in text.split(",")]
    if not all(item.isdigit() and int(item) >= 1 for item in items):
        raise ValueError(f"chip counts are whole numbers >= 1 such as 1,2,4,8, got {text!r}")
    return [int(item) for item in items]


def varied(description: Description, name: str, value: KnobValue) -> Description:
    """`description` with knob `name` at `value`."""
    if name == "array":
        assert isinstance(value, tuple)
        return description.with_array(*value)
    assert not isinstance(value, tuple)
    return description.scaled(**{name: value})


def value_label(name: str, value: KnobValue) -> str:
    """A knob value as a user writes it: "64x64", "2x", "4 chips"."""
    if name == "chips":
        return f"{value:g} chip{'s' if value != 1 else ''}"
    return f"{value[0]}x{value[1]}" if isinstance(value, tuple) else f"{value:g}x"


def value_factor(description: Description, name: str, value: KnobValue) -> float:
    """How many times the description's figure a value is (an array: its area over the description's; chips: the
    count, against one chip)."""
    if not isinstance(value, tuple):
        return float(value)
    rows, cols = description.matrix.rows, description.matrix.cols
    return value[0] * value[1] / (rows * cols) if rows and cols else math.nan


def step_ns(graph: pd.DataFrame, description: Description, steps: int = 1, chips: int = 1) -> float:
    """The projected time of one step of `graph` on `description` (on `chips` chips)."""
    return float(project(graph, description, chips)["time_ns"].sum() / steps)


def projected(graph: pd.DataFrame, description: Description, name: str, value: KnobValue,
              chips: int = 1) -> pd.DataFrame:
    """The projection of `graph` with knob `name` at `value`: the `chips` knob on that many chips, any other on
    `chips` chips."""
    if name == "chips":
        assert not isinstance(value, tuple)
        return project(graph, description, int(value))
    return project(graph, varied(description, name, value), chips)


def sweep(graph: pd.DataFrame, description: Description, name: str, values: Iterable[KnobValue],
          steps: int = 1, chips: int = 1) -> pd.DataFrame:
    """Total projected time per step with knob `name` at each value: | figure | value | factor | time_ns | speedup |
    compute_share | memory_share | comm_share |, speedup against the description as written (on `chips` chips;
    the `chips` knob: on one)."""
    base = step_ns(graph, description, steps, 1 if name == "chips" else chips)
    rows = []
    for value in values:
        projection = projected(graph, description, name, value, chips)
        total = float(projection["time_ns"].sum())
        share = projection.groupby("bound")["time_ns"].sum() / max(total, 1e-30)
        rows.append({"figure": name, "value": value_label(name, value),
                     "factor": value_factor(description, name, value), "time_ns": total / steps,
                     "speedup": base / (total / steps) if total else math.nan,
                     "compute_share": float(share.get("compute", 0.0)),
                     "memory_share": float(share.get("memory", 0.0) + share.get("on-chip", 0.0)),
                     "comm_share": float(projection["comm_ns"].sum()) / max(total, 1e-30)})
    return pd.DataFrame(rows, columns=list(SWEEP_COLUMNS))


def scaling(graph: pd.DataFrame, description: Description, counts: Iterable[int], steps: int = 1) -> pd.DataFrame:
    """The step on each of `counts` chips: | chips | time_ns | speedup | efficiency | comm_ns | comm_share |, speedup
    over one chip, efficiency = speedup / chips, comm the all-reduces on the chip links per step."""
    one = step_ns(graph, description, steps)
    rows = []
    for chips in counts:
        projection = project(graph, description, chips)
        total = float(projection["time_ns"].sum()) / steps
        comm = float(projection["comm_ns"].sum()) / steps
        rows.append({"chips": chips, "time_ns": total, "speedup": one / total if total else math.nan,
                     "efficiency": one / total / chips if total else math.nan, "comm_ns": comm,
                     "comm_share": comm / total if total else 0.0})
    return pd.DataFrame(rows, columns=list(SCALING_COLUMNS))


def model_set_sweep(graphs: Mapping[str, pd.DataFrame], description: Description,
                    knobs: Sequence[tuple[str, Sequence[KnobValue]]]) -> pd.DataFrame:
    """Each model's step at each knob value: | model | figure | value | factor | time_ns | ratio |, ratio = the step
    at that value over the step on the description as written (on one chip)."""
    rows = []
    for model, graph in graphs.items():
        base = step_ns(graph, description)
        for name, values in knobs:
            for value in values:
                time = float(projected(graph, description, name, value)["time_ns"].sum())
                rows.append({"model": model, "figure": name, "value": value_label(name, value),
                             "factor": value_factor(description, name, value), "time_ns": time,
                             "ratio": time / base if base else math.nan})
    return pd.DataFrame(rows, columns=list(SET_COLUMNS))


def buys_most(table: pd.DataFrame) -> pd.DataFrame:
    """Which knob value buys the most: per model the one with the smallest ratio, then "(geometric mean)" over the
    models: | model | figure | value | speedup |."""
    if table.empty:
        return pd.DataFrame(columns=["model", "figure", "value", "speedup"])
    best = table.loc[table.groupby("model", sort=False)["ratio"].idxmin(), ["model", "figure", "value", "ratio"]]
    mean = table.groupby(["figure", "value"], sort=False)["ratio"].apply(lambda r: float(np.exp(np.log(r).mean())))
    figure, value = mean.idxmin()
    overall = pd.DataFrame([{"model": "(geometric mean)", "figure": figure, "value": value, "ratio": mean.min()}])
    frame = pd.concat([best, overall], ignore_index=True)
    frame["speedup"] = 1.0 / frame.pop("ratio")
    return frame
