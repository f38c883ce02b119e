"""The input shapes an experiment runs at: one (batch, seq) by default, or a grid of them for a sweep.

`ExperimentSettings.batch` and `.seq` each take one value or a tuple of values (`--batch 1,2,4`,
`wb.capture(batch=[1, 2, 4])`); `sweep_value` checks and normalizes one of them (a tuple of one value is that
value, so a single shape is written exactly as before sweeps existed) and `shape_grid` gives their product,
batch-major. A run of a sweep is labelled by its variant and the sizes that vary ("eager-b4-s128"), so the
runs of one variant stay apart in tables, legends and run ids.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import WorkbenchError

PROFILE_SHAPES = ("all", "largest")
"""Which shapes of a sweep are profiled: every one (memory curves need each), or only the largest (the
others are benchmarked only: a quicker sweep)."""

SweepValue = int | tuple[int, ...]


@dataclass(frozen=True)
class Shape:
    """One input shape: `batch` items of `seq` tokens (None: the model's default, or no sequence axis)."""

    batch: int
    seq: int | None = None

    def label(self, variant: str, swept: frozenset[str]) -> str:
        """`variant` followed by the sizes in `swept` ("batch", "seq"): "eager-b4-s128"; `variant` alone when
        nothing is swept."""
        parts = [variant]
        if "batch" in swept:
            parts.append(f"b{self.batch}")
        if "seq" in swept:
            parts.append(f"s{self.seq}")
        return "-".join(parts)

    @property
    def size(self) -> tuple[int, int]:
        """What orders shapes by the work of one call: items × tokens (tokens 1 without a sequence axis), then batch."""
        return self.batch * (self.seq or 1), self.batch


def sweep_value(name: str, value: object, *, optional: bool = False) -> SweepValue | None:
    """`value` of setting `name` checked and normalized: an integer >= 1, or a list/tuple of distinct ones (a
    tuple of two or more; one value is returned as itself); None when `optional`. Raises WorkbenchError naming
    the setting and the problem."""
    if value is None and optional:
        return None
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,)
    if not values:
        raise WorkbenchError(f"{name} needs at least one value")
    for item in values:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise WorkbenchError(f"{name} must be an integer >= 1 or a list of them, got {item!r}")
    repeated = sorted({item for item in values if values.count(item) > 1})
    if repeated:
        raise WorkbenchError(f"{name} value(s) listed more than once: {', '.join(map(str, repeated))}")
    return values[0] if len(values) == 1 else values


def as_values(value: SweepValue | None) -> tuple[int | None, ...]:
    """A normalized setting (`sweep_value`) as the tuple of its values."""
    return value if isinstance(value, tuple) else (value,)


def shape_grid(batch: SweepValue, seq: SweepValue | None) -> tuple[Shape, ...]:
    """Every (batch, seq) of the settings, batch-major, in the order given."""
    return tuple(Shape(b, s) for b in as_values(batch) for s in as_values(seq))  # type: ignore[arg-type]


def swept(batch: SweepValue, seq: SweepValue | None) -> frozenset[str]:
    """The settings that take more than one value ("batch", "seq")."""
    return frozenset(name for name, value in (("batch", batch), ("seq", seq)) if isinstance(value, tuple))
