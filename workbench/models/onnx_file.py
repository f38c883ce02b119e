"""ONNX files as models: `onnx:<file>` or a path ending in `.onnx`, run only by the ONNX Runtime variants.

The file is read (not run) when it is resolved: a file that is not ONNX, or holds no graph, is a
WorkbenchError naming it. Example inputs are generated from the graph's declared inputs (initializers
listed as inputs left out), seeded:

- dims: a fixed size stays; a symbolic or unknown dim 0 takes the batch; any other symbolic dim takes the
  sequence length (`--seq`, default `DEFAULT_SEQ`), so a graph with such a dim has a sequence axis. The
  config key `shapes` (`--shape name=1x3x224x224`) gives an input's whole shape instead;
- types: floating inputs are standard normal; integer inputs that index an initializer through a `Gather`
  (token ids into an embedding) are uniform over its rows, other integer and bool inputs are ones (masks).

The `LoadedModel`'s module is an `OnnxFileModule`: it holds the path and, as one meta-device parameter (no
memory), the initializers' element count so parameter counts see the file's weights; calling it is an error.
Only the `onnxruntime` backend runs it, and its numerics reference is ONNX Runtime on the CPU with graph
optimizations disabled (`REFERENCE`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.errors import MissingDependency, WorkbenchError
from workbench.models.loaded import LoadedModel
from workbench.models.seeding import input_generator

PREFIX = "onnx:"
SUFFIX = ".onnx"
DEFAULT_SEQ = 128
BACKENDS = ("onnxruntime",)
"""The backends that run an ONNX file."""
REFERENCE = "ort-noopt"
"""The variant whose output is an ONNX file's numerics reference."""
CONFIG_KEYS = ("shapes", "seed")
MAX_ELEMENTS = 1 << 31
"""Most elements one `--shape` may ask for (it stops typos before a huge tensor is made)."""

_FLOAT_TYPES = {1: torch.float32, 10: torch.float16, 11: torch.float64, 16: torch.bfloat16}
_INT_TYPES = {2: torch.uint8, 3: torch.int8, 5: torch.int16, 6: torch.int32, 7: torch.int64, 9: torch.bool}
_SHAPE = re.compile(r"^\d+(?:x\d+)*$")


def is_onnx_ref(ref: str) -> bool:
    """Whether `ref` names an ONNX file (`onnx:<file>`, or a path ending in .onnx)."""
    return ref.startswith(PREFIX) or ref.lower().endswith(SUFFIX)


class OnnxFileModule(nn.Module):
    """Stands for an ONNX file in a `LoadedModel` (see the module docstring)."""

    def __init__(self, path: Path, weights: int) -> None:
        super().__init__()
        self.onnx_path = path
        self.weights = nn.Parameter(torch.empty(weights, device="meta"), requires_grad=False)

    def forward(self, *inputs: Any) -> torch.Tensor:
        raise WorkbenchError(f"{self.onnx_path} is an ONNX file: only ONNX Runtime variants (ort, ...) run it")


def parse_shape(name: str, value: Any) -> list[int]:
    """An input shape given as `1x3x224x224` or a list of positive ints."""
    if isinstance(value, str) and _SHAPE.match(value):
        dims = [int(d) for d in value.split("x")]
    elif isinstance(value, int) and not isinstance(value, bool):
        dims = [value]
    elif isinstance(value, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        dims = list(value)
    else:
        raise WorkbenchError(f"shape of input {name!r}: expected dims like 1x3x224x224, got {value!r}")
    if any(d < 1 for d in dims):
        raise WorkbenchError(f"shape of input {name!r}: dims must be positive, got {value!r}")
    if math.prod(dims) > MAX_ELEMENTS:
        raise WorkbenchError(f"shape of input {name!r}: {math.prod(dims):,} elements, more than {MAX_ELEMENTS:,}")
    return dims


def load_onnx(path: str | Path) -> Any:
    """The ONNX ModelProto at `path` (weights left in external files, if any); WorkbenchError naming
    the file when it is missing or not ONNX."""
    try:
        import onnx
    except ImportError as exc:
        raise MissingDependency("onnx", "onnx") from exc
    path = Path(path)
    if not path.is_file():
        raise WorkbenchError(f"{path}: no such ONNX file")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError / RuntimeError variants by version
        raise WorkbenchError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from exc


def _read(path: Path) -> Any:
    """The ModelProto (weights left in external files); WorkbenchError naming the file when it is no ONNX
    model with a graph."""
    model = load_onnx(path)
    initializers = {init.name for init in model.graph.initializer}
    if not model.graph.node or not [i for i in model.graph.input if i.name not in initializers]:
        raise WorkbenchError(f"{path}: not an ONNX model with a graph (no nodes or no inputs)")
    return model


def _embedding_rows(model: Any) -> dict[str, int]:
    """Graph input → rows of the initializer a `Gather` indexes with it (an embedding's vocabulary)."""
    sizes = {init.name: int(init.dims[0]) for init in model.graph.initializer if init.dims}
    return {node.input[1]: sizes[node.input[0]] for node in model.graph.node
            if node.op_type == "Gather" and len(node.input) > 1 and node.input[0] in sizes}


class _InputSpec:
    """One graph input: name, element type code, dims (int, or a str for a symbolic/unknown dim)."""

    def __init__(self, value: Any) -> None:
        tensor = value.type.tensor_type
        self.name = value.name
        self.elem_type = tensor.elem_type
        self.dims: list[int | str] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                                      for d in tensor.shape.dim]

    def shape(self, batch: int, seq: int | None, override: list[int] | None) -> list[int]:
        if override is not None:
            return override
        return [d if isinstance(d, int) else (batch if axis == 0 else int(seq or DEFAULT_SEQ))
                for axis, d in enumerate(self.dims)]


def load_onnx_file(ref: str, overrides: Mapping[str, Any]) -> LoadedModel:
    """The LoadedModel of the ONNX file `ref` names (module docstring); `overrides` may set `shapes`
    ({input name: dims}) and `seed`."""
    unknown = sorted(set(overrides) - set(CONFIG_KEYS))
    if unknown:
        raise WorkbenchError(f"an ONNX file model has no config key(s) {', '.join(unknown)}; valid: "
                             f"{', '.join(CONFIG_KEYS)} (shapes: --shape name=1x3x224x224)")
    path = Path(ref.removeprefix(PREFIX)).expanduser()
    if not path.is_file():
        raise WorkbenchError(f"{path}: no such ONNX file")
    model = _read(path)
    initializers = {init.name for init in model.graph.initializer}
    specs = [_InputSpec(v) for v in model.graph.input if v.name not in initializers]
    unsupported = [f"{s.name} (element type {s.elem_type})" for s in specs
                   if s.elem_type not in _FLOAT_TYPES and s.elem_type not in _INT_TYPES]
    if unsupported:
        raise WorkbenchError(f"{path}: cannot generate inputs of type {', '.join(unsupported)}")
    shapes = {name: parse_shape(name, dims) for name, dims in dict(overrides.get("shapes") or {}).items()}
    stray = sorted(set(shapes) - {s.name for s in specs})
    if stray:
        raise WorkbenchError(f"{path}: --shape names no graph input: {', '.join(stray)}; inputs: "
                             f"{', '.join(s.name for s in specs)}")
    seed = overrides.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkbenchError(f"{path}: seed must be an integer >= 0, got {seed!r}")
    rows = _embedding_rows(model)
    has_seq = any(isinstance(d, str) for s in specs if s.name not in shapes for d in s.dims[1:])

    def make_inputs(batch: int, seq: int | None) -> tuple[torch.Tensor, ...]:
        gen = input_generator(seed)
        made = []
        for spec in specs:
            shape = spec.shape(batch, seq, shapes.get(spec.name))
            if spec.elem_type in _FLOAT_TYPES:
                made.append(torch.randn(shape, generator=gen).to(_FLOAT_TYPES[spec.elem_type]))
            elif spec.name in rows and spec.elem_type != 9:
                made.append(torch.randint(0, rows[spec.name], shape, generator=gen, dtype=_INT_TYPES[spec.elem_type]))
            else:
                made.append(torch.ones(shape, dtype=_INT_TYPES[spec.elem_type]))
        return tuple(made)

    weights = sum(math.prod(init.dims) for init in model.graph.initializer)
    config = {"path": str(path.resolve()), "inputs": {s.name: s.dims for s in specs}, "shapes": shapes, "seed": seed}
    return LoadedModel(name=path.stem, module=OnnxFileModule(path.resolve(), weights), config=config, source="onnx",
                       input_maker=make_inputs, default_seq=DEFAULT_SEQ if has_seq else None, backends=BACKENDS,
                       reference=REFERENCE)


def shape_overrides(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """`--shape name=1x3x224x224` items as model config ({"shapes": {name: dims}}; {} for none)."""
    shapes: dict[str, list[int]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not name:
            raise WorkbenchError(f"--shape {item!r}: expected NAME=DIMS, e.g. --shape pixel_values=1x3x224x224")
        shapes[name] = parse_shape(name, dims)
    return {"shapes": shapes} if shapes else {}
