"""Typed records of the run bundle: `RunInfo` (run.json) and `ExperimentRecord` (experiments/<id>.json).

They are the one definition of those files' fields. Writers (the experiment runner, the generation sweep,
imports) build a record; `to_json()` gives the JSON object the bundle writes; readers get a record back
with `from_json`, which accepts every schema version written so far and files written before a field
existed (it takes the field's default). Fields the record does not know are kept in `extra` and written
back, so nothing is lost. Nested objects whose shape belongs to another layer (benchmark statistics,
numerics, notes, trace metadata) stay JSON objects: the record only guarantees they are objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import PurePath
from typing import Any, ClassVar

from workbench.errors import BundleError
from workbench.trace.schema import SCHEMA_VERSION

READABLE_VERSIONS = frozenset({1, 2})
"""Schema versions of run.json and experiment records this release reads."""

SWEEP_SCHEMA_VERSION = 2
"""The schema version of a sweep's experiment record (one with a `grid`): releases before sweeps would read
its runs as one shape's variants, so they refuse it instead. Every other record stays at version 1."""

Json = dict[str, Any]

GENERATION = "generation"
"""`kind` of a generation sweep's runs and of its experiment record."""


def number(value: object) -> float | None:
    """A JSON number, or one of the strings run.json writes for non-finite floats ("inf", "-inf", "nan"),
    as a float; None when absent or not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _object(value: object) -> Json | None:
    """A JSON object field: dicts pass, None stays None, anything else is dropped (None)."""
    return value if isinstance(value, dict) else None


def _named(value: object) -> Json | None:
    """A model or variant field: an object with a `name`, or a bare name (older imports) as `{"name": ...}`."""
    if isinstance(value, dict):
        return value
    if isinstance(value, str) and value:
        return {"name": value}
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _version(data: Json, label: str) -> int:
    version = data.get("schema_version", 1)
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise BundleError(f"{label}: schema version {version!r} is newer than this workbench reads "
                          f"({', '.join(map(str, sorted(READABLE_VERSIONS)))}); upgrade workbench")
    return int(version)


@dataclass
class _Record:
    """What both records share: the JSON round trip with unknown fields kept in `extra`."""

    _COERCE: ClassVar[dict[str, Any]] = {}

    def to_json(self) -> Json:
        """The JSON object of the file, known fields first, then `extra`."""
        known = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**known, **{k: v for k, v in self.extra.items() if k not in known}}  # type: ignore[attr-defined]

    @classmethod
    def _from(cls, data: Json, label: str, **fixed: Any) -> Any:
        if not isinstance(data, dict):
            raise BundleError(f"{label}: the record is not a JSON object")
        _version(data, label)
        names = {f.name for f in fields(cls)} - {"extra"}
        values = {name: cls._COERCE.get(name, _keep)(data[name]) for name in names if name in data}
        return cls(**{**values, **fixed}, extra={k: v for k, v in data.items() if k not in names})


def _keep(value: Any) -> Any:
    return value


@dataclass
class RunInfo(_Record):
    """A run's run.json. `kind` is "generation" for a generation sweep's runs, "serving" for a serving run's load
    points, None otherwise; `source` is
    "import" for imported traces (then `imported_from` says from where). `trace` is the trace's metadata,
    written by the bundle."""

    run_id: str = ""
    schema_version: int = SCHEMA_VERSION
    created: str | None = None
    status: str = "ok"
    error: str | None = None
    traceback: str | None = None
    experiment: str | None = None
    kind: str | None = None
    model: Json | None = None
    variant: Json | str | None = None
    """An object (name, backend, precision...); a rank import writes the bare name, read back as `{"name": ...}`."""
    device: str | None = None
    batch: int | None = None
    seq: int | None = None
    items_per_call: int | None = None
    tokens_per_call: int | None = None
    environment: Json | None = None
    reference: str | None = None
    reference_error: str | None = None
    benchmark: Json | None = None
    first_call_s: float | None = None
    numerics: Json | None = None
    notes: Json = field(default_factory=dict)
    phases_ms: Json | None = None
    capture: Json | None = None
    xprof: Json | None = None
    device_properties: Json | None = None
    op_flops: Json | None = None
    llm: Json | None = None
    generation: Json | None = None
    serving: Json | None = None
    """A serving run's endpoint, engine, generator, load, profiling window, SLO and latency summary
    (`workbench.serving.run`)."""
    source: str | None = None
    imported_from: str | None = None
    rank: int | None = None
    world_size: int | None = None
    trace: Json | None = None
    label: str | None = None
    """How the run is named in a sweep: its variant and the swept sizes it ran at ("eager-b4-s128"); None
    outside sweeps (the variant's name then names it)."""
    extra: Json = field(default_factory=dict)

    _COERCE: ClassVar[dict[str, Any]] = {
        **{name: _object for name in ("environment", "benchmark", "numerics", "phases_ms", "capture", "xprof",
                                      "device_properties", "op_flops", "llm", "generation", "serving", "trace")},
        **{name: _text for name in ("created", "error", "traceback", "experiment", "kind", "device", "reference",
                                    "reference_error", "source", "imported_from", "label")},
        **{name: _int for name in ("batch", "seq", "items_per_call", "tokens_per_call", "rank", "world_size")},
        "model": _named, "variant": _named, "first_call_s": number, "notes": lambda v: _object(v) or {},
    }

    @classmethod
    def from_json(cls, data: Json, run_id: str, label: str | None = None) -> RunInfo:
        """The record of run `run_id` from its run.json object (any readable schema version)."""
        return cls._from(data, label or f"run {run_id!r}", run_id=run_id)

    @property
    def model_name(self) -> str | None:
        """The model's name (None for an import)."""
        return _text((self.model or {}).get("name"))

    @property
    def model_weights(self) -> str | None:
        """Whether the model's weights were "real" (trained, or the user's) or "random" (seeded); None when not
        recorded (imports, bundles written before weights were recorded)."""
        return _text((self.model or {}).get("weights"))

    @property
    def model_training(self) -> str | None:
        """A trained built-in's description ("trained on ..., held-out perplexity X"); None for other weights."""
        training = (self.model or {}).get("training")
        return _text(training.get("description")) if isinstance(training, dict) else None

    @property
    def variant_name(self) -> str | None:
        """The variant's name (None for a plain import)."""
        return _text((_named(self.variant) or {}).get("name"))

    @property
    def variant_backend(self) -> str | None:
        """The backend the variant ran on ("torch", "jax", "tensorrt"; None for an import)."""
        return _text((_named(self.variant) or {}).get("backend"))

    @property
    def variant_precision(self) -> str | None:
        """The variant's precision ("fp32", "bf16", ...; None for an import)."""
        return _text((_named(self.variant) or {}).get("precision"))

    @property
    def p50_ms(self) -> float | None:
        """Median latency of the benchmark, when there was one."""
        return number((self.benchmark or {}).get("p50"))


@dataclass
class ExperimentRecord(_Record):
    """An experiment's record: the runs of one model (or of one multi-rank import) with their reference
    variant; `failed` names the variants that failed; `kind` is "generation" for a generation sweep. A
    multi-rank import adds `ranks` (rank, run, file, clock offset...), `world_size`, `align` and
    `imported_from`. A capture over several shapes has a `grid` ({"batch": [...], "seq": [...],
    "profile_shapes": ...}; schema version 2) and one run per (variant, shape); its `variants` and `failed`
    then name runs by their labels ("eager-b4")."""

    experiment_id: str = ""
    schema_version: int = SCHEMA_VERSION
    created: str | None = None
    kind: str | None = None
    model: str | None = None
    model_ref: str | None = None
    reference: str | None = None
    reference_error: str | None = None
    runs: list[str] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    settings: Json | None = None
    environment: Json | None = None
    phases_ms: Json | None = None
    ranks: list[Json] | None = None
    world_size: int | None = None
    align: str | None = None
    imported_from: str | None = None
    grid: Json | None = None
    extra: Json = field(default_factory=dict)

    REQUIRED: ClassVar[tuple[str, ...]] = ("model", "reference", "runs")
    """Fields every record file has: the model, its reference variant and the run ids."""

    _COERCE: ClassVar[dict[str, Any]] = {
        **{name: _text for name in ("created", "kind", "model", "model_ref", "reference", "reference_error", "align",
                                    "imported_from")},
        "world_size": _int, "ranks": lambda v: [r for r in v if isinstance(r, dict)] if isinstance(v, list) else None,
        **{name: _object for name in ("settings", "environment", "phases_ms", "grid")},
        **{name: (lambda v: [x for x in v if isinstance(x, str)] if isinstance(v, list) else [])
           for name in ("runs", "variants", "failed")},
    }

    @classmethod
    def from_json(cls, data: Json, experiment_id: str, label: str | None = None) -> ExperimentRecord:
        """The record `experiment_id` from its JSON object (any readable schema version)."""
        label = label or f"experiment {experiment_id!r}"
        missing = [key for key in cls.REQUIRED if not isinstance(data, dict) or key not in data]
        if missing:
            raise BundleError(f"{label}: malformed record: no {', '.join(missing)}")
        return cls._from(data, label, experiment_id=experiment_id)


def as_run_info(run: RunInfo | Mapping[str, Any]) -> RunInfo:
    """`run` as a typed record: a `RunInfo` as is, run.json's object (`Bundle.info`) read into one; for the
    readers that callers still hand run.json."""
    return run if isinstance(run, RunInfo) else RunInfo.from_json(dict(run), str(run.get("run_id") or ""))


TRACE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json", ".trace.json.gz", ".trace.json", ".json.gz", ".json",
                  ".jsonl", ".nsys-rep", ".sqlite", ".xplane.pb", ".pb", ".gz")
"""Endings of trace files that an imported run's name leaves out."""


def display_name(info: RunInfo) -> str:
    """How a run is named in tables, legends and tabs: its sweep label, else its variant's name, else (an import)
    the name of the file it came from less its trace suffix, else its run id."""
    if info.label or info.variant_name:
        return info.label or info.variant_name
    if info.imported_from:
        file = PurePath(info.imported_from).name
        for suffix in TRACE_SUFFIXES:
            if file.endswith(suffix) and len(file) > len(suffix):
                return file[: -len(suffix)]
        return file or info.run_id
    return info.run_id


def series_name(info: RunInfo) -> str:
    """The variant a run measured without the sizes it ran at, which a sweep draws as one curve: the variant's
    name for a capture ("eager"), attention and KV format (and "spec" when speculative) for a generation run
    ("mha-fp32"), else its display name."""
    variant = _named(info.variant) or {}
    if info.kind == GENERATION and isinstance(variant.get("kv"), str):
        parts = [str(variant.get("attention") or "default"), variant["kv"]]
        return "-".join(parts + (["spec"] if variant.get("decoding") == "speculative" else []))
    return info.variant_name or display_name(info)
