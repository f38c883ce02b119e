"""User models: a `package.module:factory` callable or a saved `torch.export` program (.pt2).

Both bring one set of example inputs. Other batch sizes are made from it along dim 0 (slicing
or repeating rows), which is only possible when every input is batched on dim 0. Inputs without
a shared dim 0 count as one item: they serve batch 1 unchanged, and any other batch is a
WorkbenchError saying why.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models.loaded import LoadedModel

FACTORY_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _shared_rows(inputs: Sequence[torch.Tensor]) -> int | None:
    """The (non-zero) dim 0 size every input shares, or None when they share none."""
    rows = {t.shape[0] if t.dim() else None for t in inputs}
    return next(iter(rows)) if len(rows) == 1 and None not in rows and 0 not in rows else None


def example_batch(inputs: Sequence[torch.Tensor]) -> int:
    """How many items the example inputs hold: their shared dim 0, else 1."""
    return _shared_rows(inputs) or 1


def resize_batch(inputs: Sequence[torch.Tensor], batch: int, what: str) -> tuple[torch.Tensor, ...]:
    """The example inputs with dim 0 sliced or tiled to `batch` rows."""
    rows = _shared_rows(inputs)
    if batch == example_batch(inputs):
        return tuple(inputs)
    if rows is None:
        shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
        raise WorkbenchError(
            f"{what}: cannot make inputs for batch {batch}: "
            f"example inputs ({shapes}) do not share a batch dim 0"
        )
    tiles = -(-batch // rows)
    return tuple(t.repeat(tiles, *([1] * (t.dim() - 1)))[:batch] for t in inputs)


def _as_cpu_fp32(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu")
    return t.float() if t.is_floating_point() else t


def _validated_inputs(ref: str, raw: Any) -> tuple[torch.Tensor, ...]:
    inputs = (raw,) if isinstance(raw, torch.Tensor) else raw
    if not isinstance(inputs, (tuple, list)) or not inputs or not all(
        isinstance(t, torch.Tensor) for t in inputs
    ):
        raise WorkbenchError(
            f"model '{ref}': example inputs must be a tensor or a non-empty tuple of tensors, got {raw!r:.80}"
        )
    return tuple(_as_cpu_fp32(t) for t in inputs)


def _resolve_factory(ref: str) -> Callable[..., Any]:
    module_name, _, attr_path = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise UnknownModelError(f"model '{ref}': cannot import module '{module_name}': {exc}") from exc
    for attr in attr_path.split("."):
        if not hasattr(target, attr):
            raise UnknownModelError(f"model '{ref}': '{module_name}' has no attribute '{attr_path}'")
        target = getattr(target, attr)
    if not callable(target):
        raise UnknownModelError(f"model '{ref}': '{attr_path}' is not callable")
    return target


def load_factory(ref: str, overrides: dict[str, Any]) -> LoadedModel:
    """Call the factory named by `ref` (keyword arguments: `overrides`); it returns (module, inputs)."""
    factory = _resolve_factory(ref)
    try:
        result = factory(**overrides)
    except Exception as exc:
        raise WorkbenchError(f"model '{ref}': factory raised {type(exc).__name__}: {exc}") from exc
    if not (isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], nn.Module)):
        raise WorkbenchError(
            f"model '{ref}': factory must return (torch.nn.Module, example_inputs), "
            f"got {type(result).__name__}"
        )
    module = result[0].to(device="cpu", dtype=torch.float32).eval()
    inputs = _validated_inputs(ref, result[1])
    return LoadedModel(
        name=ref,
        module=module,
        config=dict(overrides),
        source="factory",
        input_maker=lambda batch, seq: resize_batch(inputs, batch, f"model '{ref}'"),
    )


def _batch_is_dynamic(program: torch.export.ExportedProgram) -> bool:
    """Whether every user input of the program has a symbolic (resizable) dim 0."""
    user_inputs = set(program.graph_signature.user_inputs)
    values = [node.meta.get("val") for node in program.graph.nodes if node.name in user_inputs]
    shapes = [v.shape for v in values if isinstance(v, torch.Tensor)]
    return bool(shapes) and all(len(s) > 0 and isinstance(s[0], torch.SymInt) for s in shapes)


def load_exported(ref: str, overrides: dict[str, Any]) -> LoadedModel:
    """Load a program saved with `torch.export.save`; its example inputs come with it."""
    if overrides:
        raise WorkbenchError(
            f"model '{ref}': an exported program takes no config overrides ({sorted(overrides)})"
        )
    path = Path(ref)
    if not path.is_file():
        raise UnknownModelError(f"model '{ref}': no such exported program file")
    try:
        program = torch.export.load(path)
    except Exception as exc:
        raise UnknownModelError(f"model '{ref}': not a loadable torch.export program: {exc}") from exc
    args, kwargs = program.example_inputs or ((), {})
    if kwargs:
        raise WorkbenchError(f"model '{ref}': keyword example inputs are not supported ({sorted(kwargs)})")
    inputs = _validated_inputs(ref, args)
    dynamic = _batch_is_dynamic(program)

    def make(batch: int, seq: int | None) -> tuple[torch.Tensor, ...]:
        if not dynamic and batch != example_batch(inputs):
            raise WorkbenchError(
                f"model '{ref}': exported with a static batch of {example_batch(inputs)}; "
                f"re-export with a dynamic dim 0 (dynamic_shapes) to run batch {batch}"
            )
        return resize_batch(inputs, batch, f"model '{ref}'")

    # ep.module() is already in the mode it was exported in; exported modules refuse .eval().
    return LoadedModel(
        name=ref, module=program.module(), config={"path": str(path)}, source="export", input_maker=make
    )
