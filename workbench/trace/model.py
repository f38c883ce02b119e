"""The `Trace`: three Arrow tables and a metadata dict, the one model every reader produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from workbench.trace import schema


@dataclass
class Trace:
    """A normalized trace.

    `events`, `memory` and `counters` follow `workbench.trace.schema`; `metadata` holds the source
    format and file, device properties, versions, capture settings and the reader's `skipped`
    counts (records it did not turn into rows, by reason).
    """

    events: pa.Table
    memory: pa.Table = field(default_factory=lambda: schema.MEMORY.empty_table())
    counters: pa.Table = field(default_factory=lambda: schema.COUNTERS.empty_table())
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, expected in (("events", schema.EVENTS), ("memory", schema.MEMORY),
                               ("counters", schema.COUNTERS)):
            table: pa.Table = getattr(self, name)
            if not table.schema.equals(expected):
                setattr(self, name, table.select(expected.names).cast(expected))

    def kind_counts(self) -> dict[str, int]:
        """Number of events per kind, most frequent first."""
        counts = pc.value_counts(self.events["kind"].combine_chunks().dictionary_decode())
        pairs = [(c["values"].as_py(), c["counts"].as_py()) for c in counts]
        return dict(sorted(pairs, key=lambda p: (-p[1], p[0])))

    def df(self, table: str = "events"):
        """A pandas view of one table, dictionary columns as categoricals."""
        return getattr(self, table).to_pandas()

    def __repr__(self) -> str:
        source = self.metadata.get("source", {})
        return (f"Trace({self.events.num_rows} events, {self.memory.num_rows} memory, "
                f"{self.counters.num_rows} counters, format={source.get('format')!r})")
