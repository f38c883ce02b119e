"""Provenance of a run's kernels: which source ops of the model each kernel computes, so a compiled run is
compared with eager op by op ("these 9 eager ops took 105 µs; in `compile` they are 3 fused kernels of 4 µs").

A **source op** is one call of the model's program, named by its op type and its ordinal among the calls of
that type in one forward pass, the way Dynamo names FX nodes: `linear`, `linear_1`, ... `add_3` is the
fourth `add` the model's Python ran. The same name therefore means the same call in an eager run and in a
compiled one. Where each run's kernels come from (`source_kind`, and `how` the sources were found):

- `eager` (a torch run's ops outside compiled regions): each outermost dispatched op is one source op, its
  type the op's name (`aten::linear` → `linear`). `how`: `eager op`.
- `inductor` (the kernels of a `## Call CompiledFxGraph ##`: generated `cpp_fused_*` / `triton_*` kernels and
  extern calls such as `aten::addmm`): the bundle's `compile/inductor_graphs.json`
  (`workbench.backends.inductor_record`) holds the Dynamo graph (its nodes in execution order, with their op
  types) and inductor's provenance mapping (kernel → post-grad nodes → Dynamo nodes). A graph call's
  kernels are matched in call order to the mapping's kernels of the same name; each one's source ops are the
  Dynamo nodes of its compute nodes. A post-grad node that only reinterprets memory (`view`, `permute`, ...)
  names its Dynamo node only when no kernel computes that node otherwise (the q/k/v transposes an attention
  kernel reads through strides; not the `view` of a GEMM's output the next kernel reads). `how`:
  `inductor provenance`. Without the record (bundles of earlier releases) the aten ops in the kernel's name
  are its source ops, without ordinals (`cpp_fused_add_native_layer_norm_0` → `add`, `native_layer_norm`);
  `how`: `kernel name`.
- `xla` (the `hlo` ops of a JAX run, `workbench.analysis.provenance_xla`): the bundle's
  `compile/optimized.hlo.txt`; each kernel's source ops are the distinct `op_name`s of the ops it runs (a
  fusion: the ops of its fused computation), each with the call site from the `stack_frame_id` metadata
  (`add @ _layer_norm:101 ← apply:164`), as one JAX op at two call sites is two source ops. `how`: `hlo metadata`.
- `trt` (TensorRT layers, the trace's `layer` events): the ONNX nodes the engine inspector lists for each
  layer (`workbench.analysis.trt_fusion`). `how`: `trt layer`.
- `ort` (ONNX Runtime's profiled nodes): ORT records no map from a fused node back to the nodes it replaced, so
  the run's graph record (`compile/ort_graph.json`) holds one worked out from the given and optimized graphs
  (`workbench.backends.onnxruntime.graph.fusion_map`): a new node's source ops are the given ONNX nodes it
  replaced, `how`: `ort graph`; a node ORT kept is its own source op, `how`: `ort node`.

Time is attributed by one stated rule: a kernel's time is split evenly over its source ops, in integer
nanoseconds, the remainder going one ns each to its first source ops. So the per-source-op totals of
`by_source_op` add up exactly to the run's kernel time (`kernel_units` inside the profiled steps). A source op
computed by several kernels (inductor recomputes cheap ops in each consumer) collects a share of each.

`compare_by_source_op` groups two runs' kernels by the source ops they share: two kernels are in one group
when they (transitively) compute a common source op, so each run's kernels fall in exactly one group and the
groups' times add up to each run's time.

Pure: reads bundles; no torch, no jax.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from workbench.analysis.fusion import OPTIMIZED_HLO, kernel_units
from workbench.analysis.ort_fusion import GRAPH_RECORD, read_graph_record
from workbench.analysis.provenance_inductor import (
    GRAPH_PREFIX,
    INDUCTOR_GRAPHS,
    InductorGraph,
    fused_name_ops,
    read_inductor_graphs,
)
from workbench.analysis.provenance_xla import xla_sources
from workbench.analysis.trt_fusion import ENGINE_JSON, ONNX_NODES, read_node_ops, trt_fusions
from workbench.errors import WorkbenchError
from workbench.trace.store.bundle import Bundle
from workbench.trace.store.records import display_name

KERNEL_COLUMNS = ("kernel", "instance", "source_ops", "n_source_ops", "op_types", "source_kind", "calls",
                  "time_ns", "how", "fused")
SOURCE_COLUMNS = ("source_op", "op_type", "kernels", "n_kernels", "time_ns", "per_step_ns", "share", "code")
COMPARE_COLUMNS = ("group", "source_ops", "n_source_ops", "a_kernels", "a_n", "a_ns", "b_kernels", "b_n", "b_ns",
                   "delta_ns", "speedup")

_GRAPH_CALL = "CompiledFxGraph"



@dataclass(frozen=True)
class Unit:
    """One kernel execution with its source ops: what the run-specific readers hand to the tables."""

    name: str
    step: int
    dur_ns: int
    sources: tuple[str, ...]
    types: tuple[str, ...]
    kind: str
    how: str
    codes: tuple[str, ...] = ()
    """The model's source line of each source op, where the record has one ("" where not)."""


def provenance(bundle: Bundle) -> pd.DataFrame:
    """One row per kernel of the run (a kernel name at its n-th launch within a step: `instance`), over the
    profiled steps:

    | kernel | instance | source_ops | n_source_ops | op_types | source_kind | calls | time_ns | how | fused |

    `source_ops` lists the source ops it computes (see the module docstring), `op_types` their types; `calls`
    its executions; `time_ns` their total time; `fused` whether it computes several source ops. Largest time
    first."""
    return _kernel_table(run_units(bundle))


def run_units(bundle: Bundle) -> list[Unit]:
    """The run's kernel executions inside its profiled steps, each with its source ops."""
    if not bundle.has_trace:
        raise WorkbenchError(f"run {bundle.run_id!r} has no trace to trace kernels to source ops in")
    record = bundle.record
    compile_dir = bundle.local_files() / "compile"
    trace = bundle.trace()
    events = trace.df()
    if record.variant_backend == "tensorrt":
        return _trt_units(events, compile_dir)
    units = kernel_units(trace)
    units = units[units["step"] >= 0]
    kinds = events["kind"].astype(str).to_numpy()
    if len(units) and kinds[int(units["row"].iloc[0])] == "hlo":
        hlo = compile_dir / OPTIMIZED_HLO
        if not hlo.is_file():
            raise WorkbenchError(f"run {bundle.run_id!r}: no {OPTIMIZED_HLO} in its compile/ folder to read XLA's "
                                 "op metadata from")
        return _xla_units(units, hlo.read_text(encoding="utf-8"))
    if record.variant_backend == "onnxruntime":
        return _ort_units(units, compile_dir)
    graphs_file = compile_dir / INDUCTOR_GRAPHS
    graphs = read_inductor_graphs(graphs_file.read_text(encoding="utf-8"), str(graphs_file)) \
        if graphs_file.is_file() else []
    return _torch_units(events, units, graphs)


def _ort_units(units: pd.DataFrame, compile_dir: Path) -> list[Unit]:
    """ORT's profiled nodes with the given nodes each replaced (the graph record's `fused_nodes`; a kept node is
    its own source op), typed by the record's `node_types` (the name itself where the record has none)."""
    record_file = compile_dir / GRAPH_RECORD
    record = read_graph_record(record_file.read_text(encoding="utf-8"), str(record_file)) \
        if record_file.is_file() else {}
    fused, types = record.get("fused_nodes", {}), record.get("node_types", {})
    out = []
    for u in units.itertuples():
        name = str(u.name)
        sources = tuple(fused.get(name) or (name,))
        out.append(Unit(name, int(u.step), int(u.dur_ns), sources, tuple(types.get(s, s) for s in sources), "ort",
                        "ort graph" if name in fused else "ort node"))
    return out


def by_source_op(run: Bundle | pd.DataFrame, steps: int | None = None) -> pd.DataFrame:
    """Time attributed to each source op (a kernel's time split evenly over its source ops, the module
    docstring's rule), largest first:

    | source_op | op_type | kernels | n_kernels | time_ns | per_step_ns | share | code |

    `kernels` names the kernels that compute it, `share` its part of the run's kernel time; `time_ns` sums to
    the run's total exactly. `run` is a bundle or a `provenance` table (then `steps` gives the per-step
    divisor, default 1). `code` is the source line where the record has one (inductor)."""
    if isinstance(run, Bundle):
        units = run_units(run)
        table, steps = _kernel_table(units), _steps(units)
        code = {source: line for unit in units for source, line in zip(unit.sources, unit.codes, strict=False)
                if line}
    else:
        table, steps, code = run, steps or 1, {}
    shares: dict[str, int] = defaultdict(int)
    kernels: dict[str, list[str]] = defaultdict(list)
    types: dict[str, str] = {}
    for row in table.itertuples():
        for source, op_type, share in zip(row.source_ops, row.op_types, _split(int(row.time_ns), len(row.source_ops)),
                                          strict=True):
            shares[source] += share
            types.setdefault(source, op_type)
            label = kernel_label(row.kernel, row.instance)
            if label not in kernels[source]:
                kernels[source].append(label)
    total = sum(shares.values())
    rows = [(source, types[source], kernels[source], len(kernels[source]), time, time / steps,
             time / total if total else np.nan, code.get(source)) for source, time in shares.items()]
    frame = pd.DataFrame(rows, columns=list(SOURCE_COLUMNS))
    return frame.sort_values("time_ns", ascending=False, kind="stable").reset_index(drop=True)


def compare_by_source_op(a: Bundle, b: Bundle) -> pd.DataFrame:
    """Two runs' kernels grouped by the source ops they compute (the module docstring's groups), with each
    side's time per profiled step, largest first:

    | group | source_ops | n_source_ops | a_kernels | a_n | a_ns | b_kernels | b_n | b_ns | delta_ns | speedup |

    `a_kernels` / `b_kernels` list each side's kernels of the group (`name` or `name #k` for its k-th launch in
    a step), `a_n` / `b_n` count them (0: the ops run no kernel there, a view folded into its consumer),
    `a_ns` / `b_ns` their time per step; `delta_ns` is b − a and `speedup` a / b. The table's `attrs` hold
    the runs' names (`a`, `b`) and kinds (`a_kind`, `b_kind`: the source kind of most of each run's time)."""
    sides = []
    for bundle in (a, b):
        units = run_units(bundle)
        sides.append((_kernel_table(units), _steps(units)))
    parent: dict[str, str] = {}

    def find(op: str) -> str:
        while parent.setdefault(op, op) != op:
            parent[op] = parent[parent[op]]
            op = parent[op]
        return op

    for table, _ in sides:
        for ops in table["source_ops"]:
            for op in ops[1:]:
                parent[find(op)] = find(ops[0])
            find(ops[0])
    groups: dict[str, dict[str, Any]] = {}
    order = {op: i for i, op in enumerate(parent)}
    for side, (table, steps) in zip("ab", sides, strict=True):
        for row in table.itertuples():
            group = groups.setdefault(find(row.source_ops[0]), {"ops": set(), "a": [], "b": [], "a_ns": 0.0,
                                                                 "b_ns": 0.0})
            group["ops"].update(row.source_ops)
            group[side].append(kernel_label(row.kernel, row.instance))
            group[f"{side}_ns"] += row.time_ns / steps
    rows = []
    for group in groups.values():
        ops = sorted(group["ops"], key=order.__getitem__)
        a_ns, b_ns = group["a_ns"], group["b_ns"]
        rows.append((0, ops, len(ops), group["a"], len(group["a"]), a_ns, group["b"], len(group["b"]), b_ns,
                     b_ns - a_ns, a_ns / b_ns if b_ns > 0 else np.nan))
    frame = pd.DataFrame(rows, columns=list(COMPARE_COLUMNS))
    frame = frame.assign(size=frame["a_ns"] + frame["b_ns"]).sort_values("size", ascending=False, kind="stable")
    frame = frame.drop(columns="size").reset_index(drop=True)
    frame["group"] = range(len(frame))
    frame.attrs.update(a=display_name(a.record), b=display_name(b.record),
                       a_kind=_main_kind(sides[0][0]), b_kind=_main_kind(sides[1][0]))
    return frame


# --- tables -------------------------------------------------------------------------------------------------


def _kernel_table(units: Sequence[Unit]) -> pd.DataFrame:
    """`provenance`'s table from the units (see there)."""
    seen: Counter[tuple[int, str]] = Counter()
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for unit in units:
        instance = seen[(unit.step, unit.name)]
        seen[(unit.step, unit.name)] += 1
        row = rows.setdefault((unit.name, instance), {
            "kernel": unit.name, "instance": instance, "source_ops": list(unit.sources),
            "n_source_ops": len(unit.sources), "op_types": list(unit.types), "source_kind": unit.kind, "calls": 0,
            "time_ns": 0, "how": unit.how, "fused": len(unit.sources) > 1})
        row["calls"] += 1
        row["time_ns"] += unit.dur_ns
    frame = pd.DataFrame(list(rows.values()), columns=list(KERNEL_COLUMNS))
    frame = frame.astype({"instance": "int64", "calls": "int64", "time_ns": "int64", "n_source_ops": "int64",
                          "fused": bool})
    return frame.sort_values("time_ns", ascending=False, kind="stable").reset_index(drop=True)


def _split(total: int, parts: int) -> list[int]:
    """`total` split evenly over `parts` integers, the remainder one each to the first."""
    base, rest = divmod(total, parts)
    return [base + (i < rest) for i in range(parts)]


def kernel_label(kernel: str, instance: int) -> str:
    """A kernel as the tables name it: its name, with ` #k` for its k-th launch within a step past the first."""
    return kernel if instance == 0 else f"{kernel} #{instance + 1}"


def _steps(units: Sequence[Unit]) -> int:
    return max(len({u.step for u in units}), 1)


def _main_kind(table: pd.DataFrame) -> str:
    """The source kind of most of a kernel table's time ('' for an empty table)."""
    if table.empty:
        return ""
    return str(table.groupby("source_kind")["time_ns"].sum().idxmax())


# --- torch: eager ops and inductor kernels ----------------------------------------------------------------------


def _trace_kernel_name(name: str) -> str:
    """A trace kernel's name as the provenance mapping names it (`graph_0_cpp_fused_x_0` → cpp_fused_x_0,
    `aten::addmm` → addmm)."""
    return GRAPH_PREFIX.sub("", name.split("::")[-1])


def _ordinal_label(op_type: str, counts: Counter[str]) -> str:
    """The next source op name of `op_type` (`linear`, `linear_1`, ...), counting in `counts`."""
    n = counts[op_type]
    counts[op_type] += 1
    return op_type if n == 0 else f"{op_type}_{n}"


def _torch_units(events: pd.DataFrame, units: pd.DataFrame, graphs: list[InductorGraph]) -> list[Unit]:
    """A torch run's kernel executions with their source ops (eager ops and inductor kernels)."""
    names = events["name"].astype(str).to_numpy()
    parent = events["parent"].to_numpy()
    starts = events["start_ns"].to_numpy()
    out: list[Unit] = []
    for step, group in units.sort_values("start_ns", kind="stable").groupby("step", sort=True):
        calls: dict[int, list[Any]] = {}
        slots: list[tuple[int, str, int]] = []
        for unit in group.itertuples():
            up = int(parent[unit.row])
            if up >= 0 and _GRAPH_CALL in names[up]:
                if up not in calls:
                    calls[up] = []
                    slots.append((int(starts[up]), "graph", up))
                calls[up].append(unit)
            else:
                slots.append((int(unit.start_ns), "op", int(unit.Index)))
        counts: Counter[str] = Counter()
        labels: dict[int, dict[str, str]] = {}
        graph_of: dict[int, InductorGraph | None] = {}
        for _, what, key in sorted(slots):
            if what == "op":
                unit = group.loc[key]
                op_type = str(unit["name"]).split("::")[-1]
                label = _ordinal_label(op_type, counts)
                out.append(Unit(str(unit["name"]), int(step), int(unit["dur_ns"]), (label,), (op_type,), "eager",
                                "eager op"))
                continue
            graph = _graph_for([u.name for u in calls[key]], graphs)
            graph_of[key] = graph
            labels[key] = {node: _ordinal_label(op_type, counts) for node, op_type in graph.nodes.items()} \
                if graph else {}
        for call, members in calls.items():
            out.extend(_graph_call_units(members, graph_of[call], labels[call], int(step)))
    return out


def _graph_for(kernel_names: Iterable[str], graphs: list[InductorGraph]) -> InductorGraph | None:
    """The recorded graph a graph call ran: the one whose kernels share most names with the call's."""
    called = Counter(_trace_kernel_name(n) for n in kernel_names)
    best, best_score = None, 0
    for graph in graphs:
        if not graph.kernels:
            continue
        score = sum((called & Counter(name for name, _ in graph.kernels)).values())
        if score > best_score:
            best, best_score = graph, score
    return best


def _graph_call_units(members: list[Any], graph: InductorGraph | None, labels: Mapping[str, str],
                      step: int) -> list[Unit]:
    """The kernels of one graph call, matched in call order to the graph's recorded kernels of the same name;
    a kernel without a match has the ops its name lists (or itself) as source ops."""
    queue = list(graph.kernels) if graph else []
    position = 0
    out = []
    for unit in members:
        wanted = _trace_kernel_name(unit.name)
        index = next((i for i in range(position, len(queue)) if queue[i][0] == wanted), None)
        sources: tuple[str, ...] = ()
        types: tuple[str, ...] = ()
        codes: tuple[str, ...] = ()
        if index is not None:
            position = index + 1
            nodes = [node for node in queue[index][1] if node in labels]
            sources = tuple(labels[node] for node in nodes)
            types = tuple(graph.nodes[node] for node in nodes) if graph else ()
            codes = tuple(graph.code.get(node, "") for node in nodes) if graph else ()
        how = "inductor provenance"
        if not sources:
            listed = fused_name_ops(unit.name) or [wanted]
            sources, types, codes, how = tuple(listed), tuple(listed), (), "kernel name"
        out.append(Unit(str(unit.name), step, int(unit.dur_ns), sources, types, "inductor", how, codes))
    return out


# --- XLA ------------------------------------------------------------------------------------------------------


def _xla_units(units: pd.DataFrame, hlo_text: str) -> list[Unit]:
    """A JAX run's XLA ops with their source ops from the optimized HLO's metadata (`provenance_xla`)."""
    named = xla_sources(set(units["name"].astype(str)), hlo_text)
    out = []
    for unit in units.itertuples():
        labels = named.get(str(unit.name))
        if labels:
            out.append(Unit(str(unit.name), int(unit.step), int(unit.dur_ns), tuple(labels), tuple(labels.values()),
                            "xla", "hlo metadata"))
        else:
            out.append(Unit(str(unit.name), int(unit.step), int(unit.dur_ns), (str(unit.name),), (str(unit.name),),
                            "xla", "hlo name"))
    return out


# --- TensorRT -----------------------------------------------------------------------------------------------------


def _trt_units(events: pd.DataFrame, compile_dir: Any) -> list[Unit]:
    """A TensorRT run's profiled layers with the ONNX nodes each fused (one step per engine execution)."""
    engine = compile_dir / ENGINE_JSON
    if not engine.is_file():
        raise WorkbenchError(f"no {ENGINE_JSON} in {compile_dir} to read TensorRT's layers from")
    nodes_file = compile_dir / ONNX_NODES
    node_ops = read_node_ops(nodes_file.read_text(encoding="utf-8") if nodes_file.is_file() else None)
    layers = trt_fusions(engine.read_text(encoding="utf-8"), node_ops).set_index("name")
    is_layer = (events["kind"].astype(str) == "layer").to_numpy()
    out = []
    for row in np.flatnonzero(is_layer):
        name = str(events["name"].iloc[row])
        nodes = [n for n in str(layers.at[name, "onnx_nodes"]).split(" + ") if n] if name in layers.index else []
        types = [t.strip() for t in str(layers.at[name, "fused_ops"]).split(",")] if nodes and node_ops else nodes
        sources = tuple(nodes) or (name,)
        out.append(Unit(name, int(events["parent"].iloc[row]), int(events["dur_ns"].iloc[row]), sources,
                        tuple(types) if len(types) == len(sources) else sources, "trt",
                        "trt layer" if nodes else "trt layer name"))
    return out

