"""A model's operator graph from a file: an ONNX model, a saved `torch.export` program or an XLA HLO module.

Each returns the table `workbench.codesign.graph` defines (`GRAPH_COLUMNS`, one row per operator in program
order, the same units and meanings), so a file projects like a model or a captured run.

- ONNX (`graph_from_onnx`): shapes come from ONNX shape inference after every dynamic input dim is given a size
  (none is guessed), carried past the ONNX Runtime contrib ops onnx does not know (FusedMatMul, the Skip norms,
  the fused GELUs, Attention, MultiHeadAttention: `onnx_ops.contrib_shape`). Each node is costed as the aten op that
  computes the same thing, through `graph_row` and op_cost's rules: MatMul -> matmul (by a 2-D weight: one GEMM
  of all the rows, as torch folds it), Gemm -> addmm/mm (transA/transB transpose the operands' shapes), Conv and
  ConvTranspose -> convolution (strides, pads, dilations, group), elementwise nodes -> their aten names, Softmax,
  the normalizations, Transpose -> a copy (it materializes its output), Gather of a weight table -> embedding.
  Views (Reshape, Squeeze, Shape, Identity, ...) and nodes whose inputs are all constants (shape arithmetic,
  folded weight transposes: a runtime computes them once, at load) are left out. Data movement (Concat, Slice,
  Expand, Cast, ...) is costed by its bytes with no FLOPs. Any other node (a reduction, pooling, a comparison, a
  contrib op with no simple rule such as com.microsoft Attention, control flow) becomes a kind "other" row costed
  by its bytes, and is listed with the reason in `graph.attrs["uncosted"]` (a node without inferred shapes is
  listed there too, with no row). `layer` is the node's module scope: the torch exporter's `name_scopes` metadata,
  else a `/blocks.0/attn/MatMul` name's path, else "". The dataflow: `inputs_from` the rows that wrote the
  node's inputs (through views, by tensor name), `weight_input` whether it reads an initializer of more than one
  element (a weight, not a scalar constant) or a constant folded from one.
- torch.export (`graph_from_export`): the program is unflattened back into its module hierarchy and run on its
  saved example inputs through `graph_from_model`, so rows and layers are those of the original module.
- XLA HLO (`graph_from_hlo`): one row per kernel of the executed computations (`hlo_op_costs`: a fusion is one
  row, its FLOPs the sum over what it fuses and its bytes at its boundary, as XLA's cost analysis counts them).
  A fusion or instruction with a dot is a matmul (batch, M, K, N from the dot's dimension numbers), with a
  convolution a conv (its implicit GEMM); else softmax (a reduce and an exponential), norm (a reduce and a
  square root), "other" (another reduction), copy (only data movement) or elementwise. XLA counts
  transcendental functions apart from FLOPs; the graph counts each as one FLOP, its extra cycles through
  `transcendental`, so a row's `flops` are XLA's FLOPs plus its transcendentals. `name` is the instruction's
  name (what XLA's profiles call the kernel); `layer` the scope of its `op_name` metadata (`jit(f)/MLP/Dense_0/
  dot_general` -> `MLP.Dense_0`); `inputs_from` the rows that wrote its operands (through tuples and their
  elements); `weight_input` None (the text does not say which parameters are weights). Custom calls (their work is
  not in the text) and loop bodies (counted once) are listed in `graph.attrs["uncosted"]`.

`file_kind` recognizes the three by suffix or content, `graph_from_file` dispatches on it. What each ONNX node and
each HLO kernel computes lives in `onnx_ops` and `hlo_ops`; this module reads the files and builds the tables.
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from workbench.analysis.hlo_cost import hlo_op_costs
from workbench.codesign.graph import _RECORDED, _frame, graph_row, op_kind
from workbench.codesign.hlo_ops import hlo_row
from workbench.codesign.onnx_ops import (
    SAME_SHAPE,
    VIEWS,
    ByBytes,
    Value,
    contrib_shape,
    onnx_call,
    onnx_layer,
    op_name,
    tensor_values,
)
from workbench.errors import WorkbenchError
from workbench.trace.formats.hlo_text import parse_hlo

FileKind = Literal["onnx", "export", "hlo"]

UNCOSTED = "uncosted"
"""Key of `graph.attrs` listing the operators whose work could not be counted: {node, op, reason} each."""


def graph_from_onnx(path: str | Path, shapes: Mapping[str, Sequence[int]] | None = None) -> pd.DataFrame:
    """The graph of the ONNX model at `path` (see the module docstring), every dynamic input dim sized by `shapes`
    (input name -> its whole shape); a dynamic dim `shapes` leaves unsized, a shape that contradicts the file's
    fixed dims, or a file that is not ONNX raises WorkbenchError naming the file and the problem."""
    import onnx

    from workbench.models.onnx_file import load_onnx

    path = Path(path)
    model = load_onnx(path)
    if not model.graph.node:
        raise WorkbenchError(f"{path}: the ONNX graph has no nodes")
    _fix_input_shapes(path, model, dict(shapes or {}))
    graph = _inferred(path, model).graph
    values = tensor_values(graph)
    static = {init.name for init in graph.initializer}
    weights = {init.name for init in graph.initializer if math.prod(init.dims) > 1}
    writers: dict[str, int] = {}  # tensor -> order of the row that wrote it (a view's output: its input's writer)
    rows: list[dict[str, Any]] = []
    uncosted: list[dict[str, str]] = []
    for index, node in enumerate(graph.node):
        inputs = [name for name in node.input if name]
        label = node.name or f"{node.op_type} #{index}"
        if all(name in static for name in inputs) or node.op_type in ("Shape", "Size"):
            static.update(node.output)  # computed once from constants (or from the now fixed shapes)
            if any(name in weights for name in inputs):
                weights.update(node.output)  # a folded transpose or cast of a weight is a weight
            continue
        if node.op_type in VIEWS:
            if inputs and inputs[0] in writers:
                writers.update(dict.fromkeys(node.output, writers[inputs[0]]))
            continue
        ins = [values.get(name, Value(None, None)) if name else None for name in node.input]
        outs = [values.get(name, Value(None, None)) for name in node.output if name]
        row = None
        if not all(v.known for v in ins if v is not None) or not all(v.known for v in outs):
            uncosted.append({"node": label, "op": op_name(node), "reason": "shapes unknown after shape inference"})
        else:
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            row = _onnx_row(node, ins, outs, attrs, weights, onnx_layer(node), uncosted, label)
        if row is None:
            continue
        row["inputs_from"] = tuple(dict.fromkeys(writers[name] for name in inputs if name in writers))
        row["weight_input"] = any(name in weights for name in inputs)
        writers.update(dict.fromkeys(node.output, len(rows)))
        rows.append(row)
    frame = _frame(rows)
    frame.attrs[UNCOSTED] = uncosted
    return frame


def _fix_input_shapes(path: Path, model: Any, shapes: dict[str, Sequence[int]]) -> None:
    """Write `shapes` into the model's declared inputs; an error naming the input and dim for a dynamic dim left
    unsized, a rank or fixed dim `shapes` contradicts, or a name that is no input."""
    weights = {init.name for init in model.graph.initializer}
    inputs = [value for value in model.graph.input if value.name not in weights]
    unknown = sorted(set(shapes) - {value.name for value in inputs})
    if unknown:
        names = ", ".join(repr(value.name) for value in inputs)
        raise WorkbenchError(f"{path}: shapes names {', '.join(map(repr, unknown))}, which the model does not take "
                             f"as inputs ({names})")
    for value in inputs:
        tensor = value.type.tensor_type
        declared = list(tensor.shape.dim) if tensor.HasField("shape") else None
        given = shapes.get(value.name)
        if given is None:
            if declared is None:
                raise WorkbenchError(f"{path}: input {value.name!r} declares no shape: give it (--shape "
                                     f"{value.name}=DIMS, or shapes={{{value.name!r}: (...)}})")
            for position, dim in enumerate(declared):
                if not (dim.HasField("dim_value") and dim.dim_value > 0):
                    symbol = f" ({dim.dim_param!r})" if dim.dim_param else ""
                    raise WorkbenchError(f"{path}: input {value.name!r} dim {position}{symbol} is dynamic: give its "
                                         f"size (--shape {value.name}=DIMS, or shapes={{{value.name!r}: (...)}})")
            continue
        dims = [int(d) for d in given]
        if any(d < 1 for d in dims) or (declared is not None and len(declared) != len(dims)):
            rank = f" of rank {len(declared)}" if declared is not None else ""
            raise WorkbenchError(f"{path}: shapes[{value.name!r}] = {tuple(given)}: expected positive dims{rank}")
        for position, (dim, size) in enumerate(zip(declared or [], dims, strict=True)):
            if dim.HasField("dim_value") and dim.dim_value > 0 and dim.dim_value != size:
                raise WorkbenchError(f"{path}: shapes[{value.name!r}] dim {position} = {size}, but the model fixes "
                                     f"it at {dim.dim_value}")
        tensor.shape.ClearField("dim")
        for size in dims:
            tensor.shape.dim.add().dim_value = size


def _inferred(path: Path, model: Any) -> Any:
    """`model` with every tensor's shape that ONNX shape inference finds, and those of the ONNX Runtime contrib
    ops it does not know (`contrib_shape`) so that inference carries on past them: repeated until nothing new."""
    import onnx

    for _ in range(len(model.graph.node) + 1):
        try:
            model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
        except Exception as exc:  # InferenceError, ValidationError: their messages name the node
            raise WorkbenchError(f"{path}: ONNX shape inference failed: {_one_line(exc)}") from None
        values = tensor_values(model.graph)
        learned = []
        for node in model.graph.node:
            known = values.get(node.output[0], Value(None, None)).known if node.output else True
            if node.domain != "com.microsoft" or known:
                continue
            ins = [values.get(name) if name else None for name in node.input]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            shape = contrib_shape(node, ins, attrs)
            if shape is not None and ins[0] is not None:
                residual = node.output[3:4] if node.op_type in SAME_SHAPE else []  # a Skip norm's input + skip
                learned += [onnx.helper.make_tensor_value_info(name, ins[0].code, shape)
                            for name in [node.output[0], *residual] if name]
        if not learned:
            return model
        model.graph.value_info.extend(learned)
    return model


def _onnx_row(node: Any, ins: list[Value | None], outs: list[Value], attrs: dict[str, Any], weights: set[str],
              layer: str, uncosted: list[dict[str, str]], label: str) -> dict[str, Any] | None:
    """The graph row of one node that computes or moves data (None when it moves no byte: empty tensors); nodes
    without a rule are logged in `uncosted`."""
    moved = sum(v.nbytes for v in ins if v is not None) + sum(v.nbytes for v in outs)
    out_bytes = sum(v.nbytes for v in outs)
    how = onnx_call(node, ins, outs, attrs, weights)
    if isinstance(how, ByBytes):
        if how.reason is not None:
            uncosted.append({"node": label, "op": op_name(node), "reason": how.reason})
        return _by_bytes(how.name, ins, how.moved, layer, out_bytes)
    shapes = [list(v.shape) if v is not None and v.shape is not None else None for v in how.tensors]
    dtypes = [_RECORDED.get(v.dtype or "", "") if v is not None else "" for v in how.tensors]
    row = graph_row(f"aten::{how.name}", shapes, dtypes, how.concrete, layer=layer, extra_bytes=moved,
                    out_bytes=out_bytes)
    if row is not None and row["kind"] == "other" and op_kind(how.name) != "other":
        uncosted.append({"node": label, "op": op_name(node),
                         "reason": f"its shapes do not fit {how.name}'s cost rule: costed by its bytes"})
    return row


def _by_bytes(name: str, ins: list[Value | None], moved: float, layer: str, out_bytes: float) -> dict[str, Any] | None:
    """A kind "other" row with no FLOPs and `moved` bytes (no tensor shapes given, so op_cost costs nothing)."""
    dtypes = [_RECORDED.get(v.dtype or "", "") for v in ins if v is not None]
    return graph_row(name, [], dtypes, None, layer=layer, extra_bytes=moved, out_bytes=out_bytes)


def graph_from_export(path: str | Path) -> pd.DataFrame:
    """The graph of a program saved with `torch.export.save` (.pt2), run on the example inputs saved with it; the
    program is unflattened into its module hierarchy first, so `layer` names the original modules."""
    import torch

    from workbench.codesign.graph import graph_from_model

    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"{path}: no such torch.export program file")
    try:
        program = torch.export.load(path)
    except Exception as exc:  # a zip that is not a program, a version torch cannot read
        raise WorkbenchError(f"{path}: not a loadable torch.export program ({_one_line(exc)})") from None
    args, kwargs = program.example_inputs or (None, None)
    if args is None:
        raise WorkbenchError(f"{path}: the program was saved without example inputs (export it with them)")
    if kwargs:
        raise WorkbenchError(f"{path}: keyword example inputs are not supported ({', '.join(sorted(kwargs))})")
    try:
        module = torch.export.unflatten(program)
    except Exception as exc:
        raise WorkbenchError(f"{path}: the program cannot be unflattened into modules ({_one_line(exc)})") from None
    return graph_from_model(module, tuple(args))


def graph_from_hlo(text_or_path: str | Path) -> pd.DataFrame:
    """The graph of an XLA HLO module (text as `compiled.as_text()` gives, or the path of a dumped .hlo/.hlo.txt
    file): one row per kernel in program order (see the module docstring)."""
    text, source = _hlo_source(text_or_path)
    try:
        module = parse_hlo(text)
        costs = hlo_op_costs(text)
    except WorkbenchError as exc:
        raise WorkbenchError(f"{source}: {exc}") from None
    found = dict(zip(costs["name"], zip(costs["flops"], costs["transcendentals"], costs["bytes"], strict=True),
                     strict=True))
    shapes = {c.name: {i.name: i.shape for i in c.instructions} for c in module.computations.values()}
    writers: dict[str, tuple[int, ...]] = {}  # instruction -> orders of the rows that wrote it (through plumbing)
    elements: dict[str, list[tuple[int, ...]]] = {}  # a tuple instruction -> its elements' writers
    rows: list[dict[str, Any]] = []
    uncosted: list[dict[str, str]] = []
    for computation in module.executed():
        for inst in computation.instructions:
            read = tuple(dict.fromkeys(o for operand in inst.operands for o in writers.get(operand, ())))
            if inst.name not in found:  # plumbing and control flow: no kernel of its own
                if inst.opcode == "tuple":
                    elements[inst.name] = [writers.get(operand, ()) for operand in inst.operands]
                index = int(inst.attrs.get("index", -1)) if inst.opcode == "get-tuple-element" else -1
                parts = elements.get(inst.operands[0], []) if inst.operands else []
                writers[inst.name] = parts[index] if 0 <= index < len(parts) else read
                if inst.opcode in ("while", "conditional"):
                    what = "loop body and condition" if inst.opcode == "while" else "every branch"
                    uncosted.append({"node": inst.name, "op": inst.opcode,
                                     "reason": f"{what} counted once (how often it runs is not in the text)"})
                continue
            flops, transcendentals, moved = found[inst.name]
            row = hlo_row(module, shapes, computation, inst)
            row.update(flops=float(flops + transcendentals), bytes=float(moved),
                       transcendental=float(transcendentals), inputs_from=read)
            writers[inst.name] = (len(rows),)
            rows.append(row)
            if inst.opcode == "custom-call":
                target = inst.attrs.get("custom_call_target", "").strip('"')
                uncosted.append({"node": inst.name, "op": f"custom-call {target}".strip(),
                                 "reason": "a custom call's work is not in the HLO text: costed by its bytes"})
    frame = _frame(rows)
    frame.attrs[UNCOSTED] = uncosted
    return frame


def _hlo_source(text_or_path: str | Path) -> tuple[str, str]:
    """The HLO text and what to call it in errors: a Path, or a one-line string naming an existing file (or
    ending in .hlo / .txt), is read; any other string is the text itself."""
    is_path = isinstance(text_or_path, Path) or (
        "\n" not in text_or_path and len(text_or_path) < 4096
        and (text_or_path.endswith((".hlo", ".txt")) or Path(text_or_path).is_file()))
    if not is_path:
        return str(text_or_path), "HLO text"
    path = Path(text_or_path)
    try:
        return path.read_text(encoding="utf-8"), str(path)
    except FileNotFoundError:
        raise WorkbenchError(f"{path}: no such HLO file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkbenchError(f"{path}: cannot read it as HLO text ({_one_line(exc)})") from None


def file_kind(path: str | Path) -> FileKind | None:
    """Which file graph `path` holds: by suffix (.onnx; .pt2; .hlo, .hlo.txt), else by content (HLO text opens
    with `HloModule`; a .pt2 is a zip archive with an `archive_format` member; an ONNX model is a protobuf whose
    first field is its IR version, tag byte 0x08, and that onnx reads); None for anything else."""
    path = Path(path)
    name = path.name.lower()
    if name.endswith(".onnx"):
        return "onnx"
    if name.endswith(".pt2"):
        return "export"
    if name.endswith((".hlo", ".hlo.txt")):
        return "hlo"
    try:
        with path.open("rb") as handle:
            head = handle.read(4096)
    except OSError:
        return None
    if head.lstrip().startswith(b"HloModule"):
        return "hlo"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                return "export" if any(n.rsplit("/", 1)[-1] == "archive_format" for n in archive.namelist()) else None
        except zipfile.BadZipFile:
            return None
    if head[:1] == b"\x08":
        import onnx

        try:
            return "onnx" if onnx.load(str(path), load_external_data=False).graph.node else None
        except Exception:  # not a ModelProto after all
            return None
    return None


def graph_from_file(path: str | Path, shapes: Mapping[str, Sequence[int]] | None = None) -> pd.DataFrame:
    """The graph of an ONNX, torch.export or HLO file (`file_kind`); `shapes` sizes an ONNX model's dynamic
    inputs. A file of none of these kinds raises WorkbenchError naming it."""
    kind = file_kind(path)
    if kind is None:
        raise WorkbenchError(f"{path}: not an ONNX model, a torch.export program (.pt2) or XLA HLO text")
    if shapes and kind != "onnx":
        raise WorkbenchError(f"{path}: input shapes apply to ONNX models only (this is {kind})")
    if kind == "onnx":
        return graph_from_onnx(path, shapes)
    return graph_from_export(path) if kind == "export" else graph_from_hlo(Path(path))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
