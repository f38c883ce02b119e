"""Trace model, readers and run bundles. Light: no torch or jax at import.

The contract sits here (`schema`: columns, kinds, phase names; `model`: the `Trace`; `columns`: helpers the
readers share; `registry`: formats and `read_trace`; `nesting` and `launches`: parent/depth and launch links;
`progress`: how far a long read is). Then one room per family of inputs: `kineto/` (Kineto and Chrome trace
JSON), `nsys/` (Nsight Systems SQLite), `xspace/` (XSpace, XLA's host rules), `formats/` (ncu CSV, ORT
profiles, TensorRT layers, CUDA memory snapshots, HLO text); `store/` keeps bundles and experiment records
on disk and on shared storage, and `ranks/` imports the traces of a multi-rank job.
"""

from workbench.moved import keep_importable
from workbench.trace.model import Trace
from workbench.trace.registry import read_trace, sniff_format

__all__ = ["Trace", "read_trace", "sniff_format"]

MOVED = {
    "kineto_categories": "kineto.categories", "kineto_chunks": "kineto.chunks", "kineto_pairs": "kineto.pairs",
    "kineto_records": "kineto.records", "kineto_tables": "kineto.tables", "kineto_tracks": "kineto.tracks",
    "kineto_values": "kineto.values", "kineto_xla": "kineto.xla", "jsonstream": "kineto.jsonstream",
    "jsonerrors": "kineto.jsonerrors", "nsys_meta": "nsys.meta", "nsys_parts": "nsys.parts",
    "nsys_tables": "nsys.tables", "xspace_device": "xspace.device", "xla_host": "xspace.xla_host",
    "ncu": "formats.ncu", "ort_profile": "formats.ort_profile", "trt_layers": "formats.trt_layers",
    "cuda_snapshot": "formats.cuda_snapshot", "hlo_text": "formats.hlo_text", "bundle": "store.bundle",
    "staging": "store.staging", "scratch": "store.scratch", "destination": "store.destination",
    "records": "store.records", "experiment": "store.experiment", "mirror": "store.mirror",
    "mirror_bundle": "store.mirror_bundle", "resolve": "store.resolve", "multirank": "ranks.multirank",
    "rank_tasks": "ranks.tasks",
}
"""Modules of the earlier flat layout (old name: new name, relative to this package), still importable by
their old names (`workbench.moved`). `kineto`, `nsys` and `xspace` are packages now, which re-export their
readers."""

keep_importable(__name__, MOVED)
