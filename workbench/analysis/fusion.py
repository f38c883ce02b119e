"""Fusion analysis: what XLA fused, read from optimized HLO text, and per variant the kernels, fusions and
time per profiled step, so `jax-jit` sits beside `jax-nofusion`, torch `eager` beside `compile` and the
TensorRT variants (whose engine inspector JSON says what each layer fused, `workbench.analysis.trt_fusion`)
beside both in one table.

HLO side (no jax; the text parsed by `workbench.trace.formats.hlo_text`): `hlo_fusions` lists the fusion
instructions of the computations that run (the entry and the while bodies / conditional branches / called
computations below it) with the ops fused into each; `hlo_summary` counts fusions, unfused ops and kernels
(launch units).

A fusion whose computation holds one real op is no fusion of several ops: XLA:CPU wraps every op left
alone into such a one-instruction fusion (`%wrapped_tanh = ... fusion(...), kind=kLoop,
calls=%wrapped_tanh_computation`), also with every fusion pass disabled. Those count as unfused ops
(`single_op` True), like a bare `dot` in the entry.

Trace side: `kernel_units` the events that are kernels (XLA ops,
device kernels, or on a CPU torch trace the dispatched ops and inductor's generated kernels), and
`fusion_table` turns per-variant `FusionInputs` into the experiments table; `fusion_detail` lists one run's
fusions (XLA's fusion instructions, or TensorRT's layers with their times).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from workbench.analysis.ort_fusion import GRAPH_RECORD, ort_node_table, ort_summary, read_graph_record
from workbench.analysis.steps import STEP_NAME, step_windows_of
from workbench.analysis.trt_fusion import (
    ENGINE_JSON,
    ONNX_NODES,
    layer_executions,
    read_node_ops,
    trt_fusions,
    trt_layer_table,
    trt_summary,
)
from workbench.errors import WorkbenchError
from workbench.trace import Trace
from workbench.trace.formats.hlo_text import (
    CONTROL_FLOW,
    PLUMBING,
    HloComputation,
    HloInstruction,
    HloModule,
    parse_hlo,
)
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name

FUSED_NAME = re.compile(r"fused|triton_|Torch-Compiled Region|CompiledFxGraph", re.IGNORECASE)
ELEMENTWISE_OPS = frozenset({
    "aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::neg", "aten::exp",
    "aten::tanh", "aten::gelu", "aten::relu", "aten::relu_", "aten::silu", "aten::sigmoid", "aten::pow",
    "aten::rsqrt", "aten::sqrt", "aten::where", "aten::clamp", "aten::copy_", "aten::to", "aten::_to_copy",
    "aten::native_dropout", "aten::masked_fill", "aten::softmax", "aten::_softmax", "aten::layer_norm",
    "aten::native_layer_norm", "aten::embedding", "aten::cat", "aten::contiguous", "aten::clone",
})
"""Host ops that a fusing compiler (inductor, XLA) folds into its generated kernels."""

OPTIMIZED_HLO = "optimized.hlo.txt"
"""A JAX run's post-optimization HLO in its bundle's compile/ folder (`jax_backend.ARTIFACTS`)."""

FUSION_KINDS = {"kLoop": "loop", "kInput": "input", "kOutput": "output", "kCustom": "custom"}
"""XLA's fusion kinds, by the name HLO text gives them."""

FUSION_COLUMNS = ("name", "computation", "kind", "calls", "fused_ops", "n_ops", "single_op", "shape",
                  "custom_kind", "op_name")
TABLE_COLUMNS = ("variant", "framework", "steps", "kernels", "fusions", "fused_ops", "unfused_ops",
                 "elementwise_ops", "hlo_kernels", "kernel_ns", "step_ns", "bytes_accessed", "flops")

_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_CONFIG_KIND = re.compile(r'\\?"kind\\?"\s*:\s*\\?"([^"\\]+)')
_GRAPH_CALL = "CompiledFxGraph"
_COMPILED_REGION = "Torch-Compiled Region"
_TORCH_RUNTIME = re.compile(r"TorchDynamo|Torch-Compiled Region|CompiledFxGraph|Pregraph bytecode|AOTDispatcher")


def hlo_fusions(hlo_text: str) -> pd.DataFrame:
    """One row per fusion instruction of the executed computations (entry and control-flow bodies).

    | name | computation | kind | calls | fused_ops | n_ops | single_op | shape | custom_kind | op_name |

    `kind` is loop / input / output / custom; `fused_ops` the opcodes of the called computation's real ops
    ("dot, tanh, multiply"; parameters, constants, tuples and bitcasts left out), `n_ops` their number;
    `single_op` marks a fusion of one op (XLA:CPU's `wrapped_<op>`), an unfused op in all but name.
    `custom_kind` names a custom fusion's kind (`ynn_fusion`, `triton_gemm`, ...) from its backend_config,
    else from its name; `op_name` is the JAX op path from the metadata.
    """
    module = parse_hlo(hlo_text)
    rows = []
    for computation in module.executed():
        for inst in computation.instructions:
            if inst.opcode != "fusion":
                continue
            rows.append(_fusion_row(module, computation, inst))
    return pd.DataFrame(rows, columns=[*FUSION_COLUMNS])


def hlo_summary(hlo_text: str) -> dict[str, Any]:
    """Counts over the executed computations of an HLO module, each instruction counted once (a while
    body is counted once, not once per trip).

    `fusions`: fusions of several ops, also by kind in `fusions_by_kind`; `fused_ops`: the ops inside them;
    `single_op_fusions`: one-op fusions; `unfused_ops`: ops that run alone (one-op fusions, bare compute
    instructions such as a `dot`, custom calls), by opcode in `unfused_by_opcode`; `custom_calls`: the
    custom calls among them; `kernels`: launch units, `fusions + unfused_ops`. Control flow (`while`,
    `conditional`, `call`) and plumbing (parameters, constants, tuples, bitcasts, async waits) are no kernels.
    """
    module = parse_hlo(hlo_text)
    by_kind = dict.fromkeys(FUSION_KINDS.values(), 0)
    unfused: Counter[str] = Counter()
    fused_ops = single = custom_calls = control = instructions = 0
    for computation in module.executed():
        instructions += len(computation.instructions)
        for inst in computation.instructions:
            if inst.opcode == "fusion":
                row = _fusion_row(module, computation, inst)
                if row["single_op"]:
                    single += 1
                    unfused[row["fused_ops"] or "fusion"] += 1
                else:
                    by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + 1
                    fused_ops += row["n_ops"]
            elif inst.opcode in CONTROL_FLOW:
                control += inst.opcode != "async-start"
            elif inst.opcode not in PLUMBING and not inst.opcode.endswith(("-done", "-update")):
                unfused[inst.opcode] += 1
                custom_calls += inst.opcode == "custom-call"
    fusions = sum(by_kind.values())
    return {
        "module": module.name,
        "computations": len(module.computations),
        "entry_instructions": len(module.entry.instructions),
        "instructions": instructions,
        "fusions": fusions,
        "fusions_by_kind": by_kind,
        "fused_ops": fused_ops,
        "single_op_fusions": single,
        "unfused_ops": sum(unfused.values()),
        "unfused_by_opcode": dict(unfused.most_common()),
        "custom_calls": custom_calls,
        "control_flow": control,
        "kernels": fusions + sum(unfused.values()),
    }


FRAMEWORKS = ("jax", "torch", "tensorrt", "onnxruntime")
"""`FusionInputs.framework` values: the run's variant backend."""


@dataclass(frozen=True)
class FusionInputs:
    """What `fusion_table` needs of one run: its variant and framework, and whichever of the optimized
    HLO text, XLA's `compiled.cost_analysis()`, TensorRT's engine inspector JSON (with the ONNX node →
    op type map), ONNX Runtime's graph record (`workbench.analysis.ort_fusion`) and the profiled trace the run has."""

    variant: str
    framework: Literal["jax", "torch", "tensorrt", "onnxruntime"]
    hlo_text: str | None = None
    cost_analysis: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None
    trace: Trace | None = None
    engine_json: str | None = None
    node_ops: Mapping[str, str] | None = None
    ort_graph: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.variant:
            raise WorkbenchError("FusionInputs needs a variant name")
        if self.framework not in FRAMEWORKS:
            raise WorkbenchError(f"variant {self.variant}: framework must be "
                                 f"{' or '.join(map(repr, FRAMEWORKS))}, got {self.framework!r}")


def fusion_inputs(bundle: Bundle) -> FusionInputs:
    """What `fusion_table` needs, from a run bundle: its trace; for a JAX run the optimized HLO
    (`compile/optimized.hlo.txt`) and XLA's cost analysis (run.json `notes.xla`); for a TensorRT run the
    engine inspector's JSON (`compile/tensorrt_engine.json`) and the node map (`compile/onnx_nodes.json`); for an
    ONNX Runtime run its graph record (`compile/ort_graph.json`)."""
    record = bundle.record
    framework = record.variant_backend if record.variant_backend in FRAMEWORKS else "torch"
    compile_dir = bundle.local_files() / "compile"
    xla = record.notes.get("xla") or {}
    engine_json = node_ops = None
    if framework == "tensorrt":
        engine_json = _read_text(compile_dir / ENGINE_JSON)
        nodes = compile_dir / ONNX_NODES
        node_ops = read_node_ops(_read_text(nodes), f"run {bundle.run_id!r}: {nodes}")
    graph = _read_text(compile_dir / GRAPH_RECORD) if framework == "onnxruntime" else None
    return FusionInputs(variant=display_name(record), framework=framework,
                        hlo_text=_read_text(compile_dir / OPTIMIZED_HLO), cost_analysis=xla.get("cost_analysis"),
                        trace=bundle.trace() if bundle.has_trace else None, engine_json=engine_json,
                        node_ops=node_ops,
                        ort_graph=None if graph is None else read_graph_record(graph, f"run {bundle.run_id!r}"))


def _read_text(path: Path) -> str | None:
    """The text of `path`, None when there is no such file."""
    return path.read_text(encoding="utf-8") if path.is_file() else None


def fusion_detail(run: FusionInputs) -> pd.DataFrame:
    """One run's fusions in detail: for a JAX run `hlo_fusions` of its optimized HLO (one row per fusion
    instruction); for a TensorRT run `trt_layer_table` (one row per engine layer: the ONNX nodes it fused,
    type, tactic, precision, and its time from the trace's `layer` events); for an ONNX Runtime run
    `ort_node_table` (node counts per op type before and after ORT's optimizations). WorkbenchError for a run with
    none (torch's inductor leaves no fusion record: its fused kernels are in `kernel_units`)."""
    if run.ort_graph is not None:
        return ort_node_table(run.ort_graph)
    if run.engine_json is not None:
        return trt_layer_table(trt_fusions(run.engine_json, run.node_ops), run.trace)
    if run.hlo_text is not None:
        return hlo_fusions(run.hlo_text)
    raise WorkbenchError(f"variant {run.variant}: no fusion record (neither XLA's optimized HLO nor TensorRT's "
                         "engine inspector JSON); for a torch run see kernel_units(trace)")


def fusion_table(runs: Sequence[FusionInputs]) -> pd.DataFrame:
    """One row per run: kernels, fusions and time per profiled step, bytes accessed and FLOPs.

    | variant | framework | steps | kernels | fusions | fused_ops | unfused_ops | elementwise_ops |
    | hlo_kernels | kernel_ns | step_ns | bytes_accessed | flops |

    Per-step figures are medians over the trace's steps (`steps.step_windows`): `kernels` counts the trace's
    `kernel_units` (the HLO's static `kernels` when there is no trace), `kernel_ns` sums their time,
    `step_ns` is the steps' wall time. With HLO text, `fusions` / `fused_ops` / `unfused_ops` come from
    `hlo_summary` and `hlo_kernels` is its static kernel count; without, from the trace: fused kernels
    (`FUSED_NAME`), `fused_ops` unknown (NaN), unfused = the other kernels. `elementwise_ops` counts the
    kernels of a CPU torch trace that are `ELEMENTWISE_OPS` (what a fusing compiler removes). `bytes_accessed`
    and `flops` come from the cost analysis, else from the trace's per-event `bytes` / `flops` when it has
    any, else NaN.

    A TensorRT run with its inspector JSON: `kernels` / `fusions` / `fused_ops` / `unfused_ops` are
    `trt_summary`'s (compute layers of the engine; layers fusing several ONNX nodes; ...), per execution.
    With IProfiler `layer` events in the trace, `kernel_ns` is the median over profiled executions of their
    layers' summed time (`layer_executions`), and `step_ns` the measured steps' wall time when the trace has
    step annotations, else the executions' median wall time.

    An ONNX Runtime run with its graph record: `fusions` / `fused_ops` / `unfused_ops` are `ort_summary`'s
    (fused nodes ORT made, the nodes they replaced, the other nodes of the optimized graph); `kernels` counts
    the nodes its ORT profile ran per step (kind `kernel`), else the optimized graph's nodes.
    """
    rows = [_table_row(run) for run in runs]
    return pd.DataFrame(rows, columns=[*TABLE_COLUMNS])


def kernel_units(trace: Trace) -> pd.DataFrame:
    """The events that are kernels (launch units) of the trace, with the step each ran in.

    | row | name | start_ns | dur_ns | fused | step |

    - XLA ops (`hlo` events, JAX/XProf): the leaf ones (a `while` op enclosing its body's ops is not one).
    - Else device kernels (`kernel` events, torch on GPU, nsys); a kernel belongs to the step its launching
      host op started in.
    - Else host ops of a CPU torch trace: inside a compiled graph (`## Call CompiledFxGraph`) its direct op
      children, inductor's generated kernels (`graph_0_cpp_fused_*`) and extern ops (`aten::addmm`, ...);
      outside compiled regions the outermost ops, each one call dispatched from Python (`aten::linear`,
      whose `aten::addmm` does the GEMM; counting leaf ops instead would count `aten::as_strided` and miss
      the GEMM's time). Dynamo's and AOT's runtime wrappers are no kernels.

    Kernels never nest, so their times add up.

    `fused` marks kernels whose name says they were fused (`FUSED_NAME`); `step` is the index into
    `steps.step_windows`, -1 for kernels outside every step.
    """
    events = trace.df()
    return _kernel_units(events, step_windows_of(events, trace))


def _kernel_units(events: pd.DataFrame, windows: pd.DataFrame) -> pd.DataFrame:
    """`kernel_units` over the trace's events table and step windows."""
    kind = events["kind"].astype(str).to_numpy()
    names = events["name"].astype(str)
    unit_kind = _unit_kind(kind)
    if unit_kind == "hlo":
        is_hlo = kind == "hlo"
        picked = is_hlo & ~_has_descendant(events, is_hlo)
        when = events["start_ns"].to_numpy()
    elif unit_kind == "kernel":
        picked = kind == "kernel"
        launcher = events["launcher"].to_numpy()
        when = np.where(launcher >= 0, events["start_ns"].to_numpy()[np.maximum(launcher, 0)],
                        events["start_ns"].to_numpy())
    else:
        picked = _torch_cpu_kernels(events, names, kind == "op")
        when = events["start_ns"].to_numpy()
    rows = np.flatnonzero(picked)
    return pd.DataFrame({
        "row": rows,
        "name": names.to_numpy()[rows],
        "start_ns": events["start_ns"].to_numpy()[rows],
        "dur_ns": events["dur_ns"].to_numpy()[rows],
        "fused": names.str.contains(FUSED_NAME).to_numpy()[rows],
        "step": _step_of(when[rows], windows),
    })


def _table_row(run: FusionInputs) -> dict[str, Any]:
    """One `fusion_table` row (see there)."""
    row: dict[str, Any] = dict.fromkeys(TABLE_COLUMNS, math.nan)
    row.update(variant=run.variant, framework=run.framework)
    if run.hlo_text is not None:
        summary = hlo_summary(run.hlo_text)
        row.update(kernels=summary["kernels"], hlo_kernels=summary["kernels"], fusions=summary["fusions"],
                   fused_ops=summary["fused_ops"], unfused_ops=summary["unfused_ops"])
    if run.trace is not None:
        events = run.trace.df()
        windows = step_windows_of(events, run.trace)
        units = _kernel_units(events, windows)
        steps = len(windows)
        in_step = units[units["step"] >= 0].assign(
            one=1, unfused=lambda u: ~u["fused"], elementwise=lambda u: u["name"].isin(ELEMENTWISE_OPS))
        row.update(steps=steps, kernels=_median_per_step(in_step, "one", steps),
                   kernel_ns=_median_per_step(in_step, "dur_ns", steps),
                   step_ns=float((windows["end_ns"] - windows["start_ns"]).median()))
        if run.hlo_text is None:
            row.update(fusions=_median_per_step(in_step, "fused", steps),
                       unfused_ops=_median_per_step(in_step, "unfused", steps))
        if _unit_kind(events["kind"].astype(str).to_numpy()) == "op":
            row["elementwise_ops"] = _median_per_step(in_step, "elementwise", steps)
        for column, figure in (("flops", "flops"), ("bytes", "bytes_accessed")):
            row[figure] = _trace_total(events, units, windows, column)
    if run.engine_json is not None:
        row.update(_trt_figures(run))
    if run.ort_graph is not None:
        summary = ort_summary(run.ort_graph)
        row.update({key: summary[key] for key in ("fusions", "fused_ops", "unfused_ops")})
        if run.trace is None:
            row["kernels"] = summary["kernels"]
    if run.cost_analysis is not None:
        cost = _cost(run)
        row.update(flops=_float(cost.get("flops")), bytes_accessed=_float(cost.get("bytes accessed")))
    return row


def _trt_figures(run: FusionInputs) -> dict[str, Any]:
    """The `fusion_table` figures of a TensorRT run from its inspector JSON and `layer` events (see there)."""
    assert run.engine_json is not None
    summary = trt_summary(trt_fusions(run.engine_json, run.node_ops))
    figures: dict[str, Any] = {key: summary[key] for key in ("kernels", "fusions", "fused_ops", "unfused_ops")}
    if run.trace is None:
        return figures
    events = run.trace.df()
    executions = layer_executions(events)
    if executions.empty:
        return figures
    figures["kernel_ns"] = float(executions["layer_ns"].median())
    notes = events.loc[events["kind"].astype(str) == "annotation", "name"].astype(str)
    if not notes.str.match(STEP_NAME).any():
        figures.update(steps=len(executions), step_ns=float(executions["wall_ns"].median()))
    return figures


def _unit_kind(kind: np.ndarray) -> str:
    """Which events are a trace's kernels: `hlo` (XLA ops), else `kernel` (device kernels), else `op`."""
    return next((k for k in ("hlo", "kernel") if (kind == k).any()), "op")


def _median_per_step(units: pd.DataFrame, column: str, steps: int) -> float:
    """Median over all `steps` of the per-step sum of `column` (a step without units counts 0)."""
    totals = units.groupby("step")[column].sum().reindex(range(steps), fill_value=0)
    return float(totals.median()) if steps else math.nan


def _trace_total(events: pd.DataFrame, units: pd.DataFrame, windows: pd.DataFrame, column: str) -> float:
    """Median per step of a per-event figure (`flops`, `bytes`) summed over all events of the kernels' kind,
    not only the kernels (torch puts FLOPs on `aten::addmm`, nested in eager's `aten::linear`); NaN when no
    event has one."""
    if units.empty:
        return math.nan
    kind = events["kind"].iloc[int(units["row"].iloc[0])]
    known = events[(events["kind"] == kind) & events[column].notna()]
    if known.empty:
        return math.nan
    step = _step_of(known["start_ns"].to_numpy(), windows)
    totals = pd.DataFrame({"step": step, column: known[column].to_numpy()})
    return _median_per_step(totals[totals["step"] >= 0], column, len(windows))


def _cost(run: FusionInputs) -> Mapping[str, Any]:
    """The cost analysis as one mapping (older jax returns a list of one dict per device program)."""
    cost = run.cost_analysis
    if isinstance(cost, Sequence) and not isinstance(cost, (str, bytes)):
        if len(cost) != 1 or not isinstance(cost[0], Mapping):
            raise WorkbenchError(f"variant {run.variant}: cost_analysis is a list of {len(cost)} entries; "
                                 "expected one dict")
        cost = cost[0]
    if not isinstance(cost, Mapping):
        raise WorkbenchError(f"variant {run.variant}: cost_analysis must be a dict (compiled.cost_analysis()), "
                             f"got {type(cost).__name__}")
    return cost


def _float(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _fusion_row(module: HloModule, computation: HloComputation, inst: HloInstruction) -> dict[str, Any]:
    """The `hlo_fusions` row of one fusion instruction."""
    called = inst.references("calls")
    if len(called) != 1:
        raise WorkbenchError(f"HLO line {inst.line}: fusion %{inst.name} has no single calls=%computation")
    raw_kind = inst.attrs.get("kind")
    if raw_kind is None:
        raise WorkbenchError(f"HLO line {inst.line}: fusion %{inst.name} has no kind=")
    kind = FUSION_KINDS.get(raw_kind, raw_kind.removeprefix("k").lower())
    ops = module.fused_opcodes(module.computation(called[0], inst), inst)
    custom_kind = None
    if kind == "custom":
        found = _CONFIG_KIND.search(inst.attrs.get("backend_config", ""))
        custom_kind = (found[1] if found else inst.name.split(".")[0]).lstrip("_")
    op_name = _OP_NAME.search(inst.attrs.get("metadata", ""))
    return {"name": inst.name, "computation": computation.name, "kind": kind, "calls": called[0],
            "fused_ops": ", ".join(ops), "n_ops": len(ops), "single_op": len(ops) <= 1, "shape": inst.shape,
            "custom_kind": custom_kind, "op_name": op_name[1] if op_name else None}


def _step_of(times: np.ndarray, windows: pd.DataFrame) -> np.ndarray:
    """Index of the step window each time falls in, -1 outside every window."""
    starts, ends = windows["start_ns"].to_numpy(), windows["end_ns"].to_numpy()
    index = np.searchsorted(starts, times, side="right") - 1
    inside = (index >= 0) & (times < ends[np.maximum(index, 0)])
    return np.where(inside, index, -1)


def _has_ancestor(events: pd.DataFrame, mask: np.ndarray) -> np.ndarray:
    """Per event, whether an enclosing span on its track (parent, grandparent, ...) satisfies `mask`."""
    parent, depth = events["parent"].to_numpy(), events["depth"].to_numpy()
    below = np.zeros(len(events), dtype=bool)
    for level in range(1, int(depth.max()) + 1 if len(depth) else 0):
        rows = np.flatnonzero((depth == level) & (parent >= 0))
        up = parent[rows]
        below[rows] = mask[up] | below[up]
    return below


def _has_descendant(events: pd.DataFrame, mask: np.ndarray) -> np.ndarray:
    """Per event, whether a span nested in it (child, grandchild, ...) satisfies `mask`."""
    parent, depth = events["parent"].to_numpy(), events["depth"].to_numpy()
    above = np.zeros(len(events), dtype=bool)
    for level in range(int(depth.max()) if len(depth) else 0, 0, -1):
        rows = np.flatnonzero((depth == level) & (parent >= 0) & (mask | above))
        above[parent[rows]] = True
    return above


def _torch_cpu_kernels(events: pd.DataFrame, names: pd.Series, is_op: np.ndarray) -> np.ndarray:
    """The kernels of a CPU torch trace (see `kernel_units`)."""
    graph_call = names.str.contains(_GRAPH_CALL, regex=False).to_numpy()
    region = names.str.contains(_COMPILED_REGION, regex=False).to_numpy()
    parent = events["parent"].to_numpy()
    in_graph = _has_ancestor(events, graph_call)
    in_region = _has_ancestor(events, region)
    graph_child = (parent >= 0) & graph_call[np.maximum(parent, 0)]
    outermost = ~_has_ancestor(events, is_op) & ~in_region & ~names.str.contains(_TORCH_RUNTIME).to_numpy()
    return is_op & np.where(in_graph, graph_child, outermost)
