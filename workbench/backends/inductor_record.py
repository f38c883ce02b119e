"""What inductor says about a compilation, kept for the bundle's compile/ folder: per compiled graph the
output code, the graph Dynamo traced (its nodes, in the order the model's Python ran them, with the source
lines) and inductor's provenance mapping (each generated kernel → the post-grad FX nodes it computes → the
Dynamo nodes they came from). `workbench.analysis.provenance` reads them to name each kernel's source ops.

Inductor emits all three through torch's structured trace log (`torch._logging.trace_structured`, what
`TORCH_TRACE` / tlparse read): on a fresh compile and again when the FX graph cache hits, as the cached
graph keeps its output code and mapping. `record_inductor` listens there while a compile runs; the mapping is
only made when inductor's `trace.provenance_tracking_level` is at least 1 (the torch backend sets it for
profiled compiles, `torch_backend.prepare_torch`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from workbench.analysis.provenance_inductor import INDUCTOR_GRAPHS

__all__ = ["INDUCTOR_GRAPHS", "InductorRecorder", "record_inductor"]

_MAPPING = "inductor_provenance_tracking_node_mappings"


class InductorRecorder(logging.Handler):
    """A handler of torch's structured trace log keeping, per compile id (`frame/attempt`), the Dynamo graph,
    the output code and the provenance mapping."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.graphs: dict[str, dict[str, Any]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        metadata = getattr(record, "metadata", None)
        payload = getattr(record, "payload", None)
        if not isinstance(metadata, dict) or not isinstance(payload, str):
            return
        artifact = metadata.get("artifact")
        if "dynamo_output_graph" in metadata:
            key = "dynamo_graph"
        elif "inductor_output_code" in metadata:
            key = "output_code"
        elif isinstance(artifact, dict) and artifact.get("name") == _MAPPING:
            key = "provenance"
        else:
            return
        compile_id = f"{metadata.get('frame_id')}/{metadata.get('frame_compile_id')}"
        graph = self.graphs.setdefault(compile_id, {"compile_id": compile_id})
        graph[key] = json.loads(payload) if key == "provenance" else payload

    def document(self) -> str:
        """The record as JSON: `{"version": 1, "graphs": [{compile_id, dynamo_graph, output_code, provenance}]}`
        (a key is missing when inductor did not emit it: no provenance without tracking, no Dynamo graph for a
        graph Dynamo had compiled before in this process)."""
        return json.dumps({"version": 1, "graphs": list(self.graphs.values())}, indent=1)


@contextmanager
def record_inductor() -> Iterator[InductorRecorder]:
    """Listen to torch's structured trace log during the block (compilations there are recorded)."""
    from torch._logging._internal import trace_log

    recorder = InductorRecorder()
    trace_log.addHandler(recorder)
    try:
        yield recorder
    finally:
        trace_log.removeHandler(recorder)
