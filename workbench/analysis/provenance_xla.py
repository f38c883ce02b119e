"""XLA's side of kernel provenance (`workbench.analysis.provenance`): each XLA op of a JAX run traced to the JAX
ops it runs, from the optimized HLO text's metadata: the `op_name` of every op (a fusion: of every op of its
fused computation, nested fusions expanded) with its call site, read from the `stack_frame_id` and the module's
FileNames / FunctionNames / FileLocations / StackFrames sections. A label reads `add @ _layer_norm:101 ←
apply:164`: the op_name less its outermost `jit(f)/` scope, then the Python frames from the innermost outwards,
less the outermost ones every op shares (the harness that called the model). Pure text parsing, no jax."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from workbench.trace.formats.hlo_text import FUSED_PLUMBING, HloModule, parse_hlo

_FILE_NAMES = re.compile(r'^(\d+) "(.*)"$')
_LOCATION = re.compile(r"^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)")
_FRAME = re.compile(r"^(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)\}")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_FRAME_ID = re.compile(r"stack_frame_id=(\d+)")




def xla_sources(names: Iterable[str], hlo_text: str) -> dict[str, dict[str, str]]:
    """Per XLA op name of the trace (an instruction of the module's executed computations), its source ops in
    order, each label → its op type (`add @ _layer_norm:101 ← apply:164` → add); names the HLO lacks, or
    whose ops carry no metadata, are left out."""
    module = parse_hlo(hlo_text)
    frames = _stack_frames(hlo_text)
    by_name = {inst.name: inst for computation in module.executed() for inst in computation.instructions}
    sources = {name: _hlo_sources(module, by_name[name]) for name in names if name in by_name}
    used = {frame for ops in sources.values() for _, frame in ops if frame is not None}
    common = _common_tail([frames.chain(f) for f in used])
    named: dict[str, dict[str, str]] = {}
    for name, ops in sources.items():
        for op, frame in ops:
            chain = frames.chain(frame)
            named.setdefault(name, {}).setdefault(_xla_label(op, chain[: len(chain) - common]),
                                                  _short_op(op).rsplit("/", 1)[-1])
    return named


def _hlo_sources(module: HloModule, inst: Any, depth: int = 0) -> list[tuple[str, int | None]]:
    """The distinct (op_name, stack frame) of the ops an instruction runs: a fusion's fused ops (nested fusions
    expanded), else its own; the fusion's own metadata when its ops carry none."""
    found: dict[tuple[str, int | None], None] = {}
    if inst.opcode == "fusion" and depth <= len(module.computations):
        for called in inst.references("calls"):
            inner = module.computation(called, inst)
            for op in inner.instructions:
                if op.opcode in FUSED_PLUMBING:
                    continue
                for source in _hlo_sources(module, op, depth + 1) if op.opcode == "fusion" else [_metadata(op)]:
                    if source is not None:
                        found.setdefault(source, None)
    if not found and (own := _metadata(inst)) is not None:
        found[own] = None
    return list(found)


def _metadata(inst: Any) -> tuple[str, int | None] | None:
    text = inst.attrs.get("metadata", "")
    name = _OP_NAME.search(text)
    if name is None:
        return None
    frame = _FRAME_ID.search(text)
    return name[1], int(frame[1]) if frame else None


@dataclass
class _Frames:
    """The HLO text's stack frame index: frame → (function, line) and parent frame."""

    locations: dict[int, tuple[str, int]]
    parents: dict[int, tuple[int, int]]

    def chain(self, frame: int | None) -> list[str]:
        """`function:line` from the frame outwards."""
        out, seen = [], set()
        while frame is not None and frame in self.parents and frame not in seen:
            seen.add(frame)
            location, parent = self.parents[frame]
            if location in self.locations:
                function, line = self.locations[location]
                out.append(f"{function.rsplit('.', 1)[-1]}:{line}")
            frame = parent if parent > 0 else None
        return out


def _stack_frames(text: str) -> _Frames:
    """The FileNames / FunctionNames / FileLocations / StackFrames sections before the module's computations."""
    functions: dict[int, str] = {}
    locations: dict[int, tuple[str, int]] = {}
    parents: dict[int, tuple[int, int]] = {}
    section = ""
    for line in text.splitlines()[1:]:
        stripped = line.strip()
        if stripped in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = stripped
            continue
        if stripped.startswith(("%", "ENTRY")):
            break
        if section == "FunctionNames" and (m := _FILE_NAMES.match(stripped)):
            functions[int(m[1])] = m[2]
        elif section == "FileLocations" and (m := _LOCATION.match(stripped)):
            locations[int(m[1])] = (functions.get(int(m[3]), "?"), int(m[4]))
        elif section == "StackFrames" and (m := _FRAME.match(stripped)):
            parents[int(m[1])] = (int(m[2]), int(m[3]) - 1)  # the text prints the parent's id plus one; 0: none
    return _Frames(locations, parents)


def _common_tail(chains: list[list[str]]) -> int:
    """How many outermost frames all chains share (the harness calling the model), keeping one frame each."""
    if not chains:
        return 0
    shortest = min(len(c) for c in chains)
    n = 0
    while n < shortest - 1 and len({c[len(c) - 1 - n] for c in chains}) == 1:
        n += 1
    return n


def _short_op(op_name: str) -> str:
    """An op_name less its outermost `jit(f)/` scope, which every op of the module shares."""
    head, _, rest = op_name.partition("/")
    return rest if head.startswith("jit(") and rest else op_name


def _xla_label(op_name: str, chain: list[str]) -> str:
    return f"{_short_op(op_name)} @ {' ← '.join(chain)}" if chain else _short_op(op_name)
