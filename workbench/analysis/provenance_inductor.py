"""Inductor's side of kernel provenance (`workbench.analysis.provenance`): the record a compiled torch run keeps
(`compile/inductor_graphs.json`, `workbench.backends.inductor_record`) read into, per compiled graph, its Dynamo
nodes (op type and source line, in execution order) and its kernels in call order with the Dynamo nodes each
computes; and, for runs without that record, the aten ops a generated kernel's name lists. Pure, no torch."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workbench.errors import WorkbenchError

INDUCTOR_GRAPHS = "inductor_graphs.json"
"""A compiled torch run's inductor record in its compile/ folder, as `workbench.backends.inductor_record`
writes it."""

GRAPH_PREFIX = re.compile(r"^graph_\d+_")
"""The `graph_<id>_` inductor puts before a CPU kernel's name in the profiler's events."""
ORDINAL = re.compile(r"_\d+$")
"""The `_<n>` ending of an FX node's name (and of a kernel's)."""

VIEW_OPS = frozenset({"view", "_unsafe_view", "unsafe_view", "permute", "reshape", "expand", "squeeze",
                      "unsqueeze", "t", "transpose", "getitem", "alias", "slice", "select", "as_strided",
                      "reinterpret_tensor"})
"""Post-grad node types that reinterpret memory without computing (see the module docstring)."""

_NODE = re.compile(r'^\s+(?P<name>\w+)(?:\s*:\s*"[^"]*")?\s*=\s*(?P<expr>.+)$')
_FILE = re.compile(r"^\s+# File: (?P<file>.*?):(?P<line>\d+) in (?P<fn>\S+), code: (?P<code>.*)$")
_CALL = re.compile(r"^(?P<callee>[\w.]+)\(")
_BINARY = {"+": "add", "-": "sub", "*": "mul", "/": "div", "//": "floordiv", "%": "remainder", "@": "matmul",
           "**": "pow", "&": "and", "|": "or", "^": "xor", "==": "eq", "!=": "ne", "<": "lt", ">": "gt",
           "<=": "le", ">=": "ge"}
_BINARY_EXPR = re.compile(r"^[\w.]+ (?P<op>\*\*|//|==|!=|<=|>=|[-+*/%@&|^<>]) [\w.]+$")
_MULTIWORD = ("native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm", "native_group_norm",
              "group_norm", "var_mean", "log_softmax", "index_select", "index_put", "masked_fill", "scatter_add",
              "constant_pad_nd", "max_pool2d_with_indices", "avg_pool2d", "adaptive_avg_pool2d", "to_copy",
              "scaled_dot_product", "embedding_dense_backward", "full_like", "zeros_like", "ones_like")
"""aten op names of several words, found whole in a fused kernel's name (`cpp_fused_add_native_layer_norm_0`)."""


@dataclass
class InductorGraph:
    """One compiled graph of the inductor record: its Dynamo nodes (name → op type, in order, and the source
    line), and its kernels in call order (normalized name, Dynamo nodes)."""

    nodes: dict[str, str] = field(default_factory=dict)
    code: dict[str, str] = field(default_factory=dict)
    kernels: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)


def read_inductor_graphs(text: str, where: str = INDUCTOR_GRAPHS) -> list[InductorGraph]:
    """The compiled graphs of an inductor record (JSON text); WorkbenchError naming `where` when malformed."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise WorkbenchError(f"{where}: not JSON ({exc})") from exc
    if not isinstance(document, Mapping) or not isinstance(document.get("graphs"), list):
        raise WorkbenchError(f"{where}: no \"graphs\" list")
    return [_graph(entry, where) for entry in document["graphs"]]


def fused_name_ops(name: str) -> list[str]:
    """The aten ops a generated kernel's name lists (`graph_0_cpp_fused_add_native_layer_norm_0` → add,
    native_layer_norm; `triton_per_fused__softmax_1` → _softmax), in order; [] for a name that lists none."""
    base = GRAPH_PREFIX.sub("", name)
    _, marker, rest = base.partition("fused_")
    if not marker:
        return []
    tokens = ORDINAL.sub("", rest).split("_")
    ops: list[str] = []
    i, underscore = 0, ""
    while i < len(tokens):
        if tokens[i] == "":
            underscore += "_"
            i += 1
            continue
        width = next((len(m.split("_")) for m in _MULTIWORD if tokens[i:i + len(m.split("_"))] == m.split("_")), 1)
        ops.append(underscore + "_".join(tokens[i:i + width]))
        i, underscore = i + width, ""
    return [op for op in ops if op]


def _graph(entry: Any, where: str) -> InductorGraph:
    """One graph of the inductor record (see `InductorGraph`)."""
    if not isinstance(entry, Mapping):
        raise WorkbenchError(f"{where}: a graph entry is not an object")
    graph = InductorGraph()
    source = None
    for line in str(entry.get("dynamo_graph") or "").splitlines():
        if match := _FILE.match(line):
            source = f"{match['file'].rsplit('/', 1)[-1]}:{match['line']} {match['code'].strip()}"
            continue
        match = _NODE.match(line)
        if match is None or match["name"] in ("return",):
            continue
        op_type = _node_type(match["expr"].split(";  ")[0].strip())
        if op_type is not None:
            graph.nodes[match["name"]] = op_type
            if source:
                graph.code[match["name"]] = source
    mapping = entry.get("provenance")
    if isinstance(mapping, Mapping):
        graph.kernels = _graph_kernels(mapping, where)
    return graph


def _node_type(expr: str) -> str | None:
    """The op type of a Dynamo graph line's expression (`torch._C._nn.linear(...)` → linear, `a + b` → add,
    `x.view(...)` → view, `x[0]` → getitem); None for what is no op (an input's alias)."""
    if match := _CALL.match(expr):
        return match["callee"].rsplit(".", 1)[-1]
    if match := _BINARY_EXPR.match(expr):
        return _BINARY[match["op"]]
    if re.match(r"^[\w.]+\[", expr):
        return "getitem"
    if expr.startswith("-"):
        return "neg"
    return None


def _graph_kernels(mapping: Mapping[str, Any], where: str) -> list[tuple[str, tuple[str, ...]]]:
    """The provenance mapping's kernels in call order, each with the Dynamo nodes it computes (the module
    docstring's rule for post-grad view nodes)."""
    code_to_post = mapping.get("cppCodeToPost") or {}
    post_to_pre = mapping.get("postToPre") or {}
    if not isinstance(code_to_post, Mapping) or not isinstance(post_to_pre, Mapping):
        raise WorkbenchError(f"{where}: the provenance mapping has no cppCodeToPost / postToPre objects")

    def handle(key: str) -> int:
        tail = key.rsplit(":", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    kernels = sorted(code_to_post, key=handle)
    computed = {pre for key in kernels for post in code_to_post[key] if not _is_view(post)
                for pre in post_to_pre.get(post, [])}
    out = []
    for key in kernels:
        pres: dict[str, None] = {}
        for post in code_to_post[key]:
            for pre in post_to_pre.get(post, []):
                if not _is_view(post) or pre not in computed:
                    pres.setdefault(pre, None)
        out.append((_provenance_kernel_name(key), tuple(pres)))
    return out


def _is_view(post_node: str) -> bool:
    return ORDINAL.sub("", post_node) in VIEW_OPS


def _provenance_kernel_name(key: str) -> str:
    """A provenance kernel key as the trace names it, less its namespace: `extern_kernels.addmm:2` → addmm,
    `torch.ops.aten._foo.default:5` → _foo, `cpp_fused_gelu_1:9` → cpp_fused_gelu_1."""
    name = key.rsplit(":", 1)[0]
    parts = name.split(".")
    if parts[0] == "extern_kernels" and len(parts) > 1:
        return parts[1]
    if parts[:2] == ["torch", "ops"] and len(parts) > 3:
        return parts[3]
    return name
