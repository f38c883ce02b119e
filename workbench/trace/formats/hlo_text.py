"""HLO module text (`compiled.as_text()`, `HloModule.to_string()`, a JAX run's `compile/optimized.hlo.txt`)
parsed into computations and instructions: pure text parsing, no jax. Malformed text raises WorkbenchError
naming the line and the problem. Analyses of the parsed module live in `workbench.analysis.fusion` (what XLA
fused) and `workbench.analysis.hlo_cost` (FLOPs and bytes per kernel)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from workbench.errors import WorkbenchError

FUSED_PLUMBING = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})
"""Instructions of a fused computation that are no op of their own (inputs, literals, reinterpretation)."""

PLUMBING = FUSED_PLUMBING | frozenset({
    "after-all", "add-dependency", "opt-barrier", "domain", "partition-id", "replica-id", "copy-start",
    "copy-done", "async-done", "async-update", "send-done", "recv-done",
})
"""Instructions of an executed computation that launch no kernel (plumbing, async waits); so does every
`*-done` / `*-update` half of an asynchronous pair."""

CONTROL_FLOW = {"while": ("condition", "body"), "conditional": ("branch_computations", "true_computation",
                "false_computation"), "call": ("to_apply",), "async-start": ("calls",)}
"""Control-flow opcodes and the attributes naming the computations they run (whose ops are kernels)."""

_COMPUTATION = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[\w.\-$]+)\s*(?:\(.*\)\s*->.*)?\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?P<root>ROOT\s+)?%?(?P<name>[\w.\-$]+)\s*=\s*(?P<rest>\S.*)$")
_OPCODE = re.compile(r"([\w\-]+)\(")
_REFERENCE = re.compile(r"%?([\w.\-$]+)")
_OPERAND = re.compile(r"%([\w.\-$]+)\s*$")  # `%name`, or `f32[8]{0} %name` in older HLO text
_MODULE = re.compile(r"^HloModule\s+([^\s,]+)")
_CLOSERS = {"(": ")", "{": "}", "[": "]"}


@dataclass(frozen=True)
class HloInstruction:
    """One instruction line: `[ROOT] %name = shape opcode(operands), attr=value, ...`."""

    name: str
    opcode: str
    shape: str
    attrs: Mapping[str, str]
    root: bool
    line: int
    operands: tuple[str, ...] = ()

    def references(self, attribute: str) -> list[str]:
        """Computation names an attribute refers to (`calls=%c`, `branch_computations={%a, %b}`)."""
        value = self.attrs.get(attribute, "").strip().strip("{}")
        return [m[1] for part in value.split(",") if (m := _REFERENCE.fullmatch(part.strip()))]


@dataclass(frozen=True)
class HloComputation:
    """A computation: its name, whether it is the module's ENTRY, and its instructions in order."""

    name: str
    entry: bool
    instructions: tuple[HloInstruction, ...]


@dataclass(frozen=True)
class HloModule:
    """An HLO module parsed from text: its name (if the header gives one) and its computations by name."""

    name: str | None
    computations: Mapping[str, HloComputation]

    @property
    def entry(self) -> HloComputation:
        """The ENTRY computation (`parse_hlo` makes sure there is exactly one)."""
        return next(c for c in self.computations.values() if c.entry)

    def computation(self, name: str, user: HloInstruction) -> HloComputation:
        """The computation `name`, which `user` calls; an error naming both when the text lacks it."""
        try:
            return self.computations[name]
        except KeyError:
            raise WorkbenchError(f"HLO line {user.line}: %{user.name} calls %{name}, which is not in the module") \
                from None

    def executed(self) -> Iterator[HloComputation]:
        """The entry, then every computation that control flow below it runs (while bodies and conditions,
        conditional branches, called and async computations), each once; fused and reducer computations
        are not among them."""
        seen: set[str] = set()
        todo = [self.entry]
        while todo:
            computation = todo.pop(0)
            if computation.name in seen:
                continue
            seen.add(computation.name)
            yield computation
            for inst in computation.instructions:
                for attribute in CONTROL_FLOW.get(inst.opcode, ()):
                    todo.extend(self.computation(name, inst) for name in inst.references(attribute))

    def fused_opcodes(self, computation: HloComputation, user: HloInstruction, depth: int = 0) -> list[str]:
        """Opcodes of the real ops of a fused computation, nested fusions expanded, in text order."""
        if depth > len(self.computations):
            raise WorkbenchError(f"HLO line {user.line}: %{user.name} calls itself through nested fusions")
        ops: list[str] = []
        for inst in computation.instructions:
            if inst.opcode == "fusion":
                for name in inst.references("calls"):
                    ops.extend(self.fused_opcodes(self.computation(name, inst), inst, depth + 1))
            elif inst.opcode not in FUSED_PLUMBING:
                ops.append(inst.opcode)
        return ops


def parse_hlo(hlo_text: str) -> HloModule:
    """Parse HLO module text (`compiled.as_text()`, `HloModule.to_string()`); malformed text raises
    WorkbenchError naming the line and the problem."""
    if not isinstance(hlo_text, str) or not hlo_text.strip():
        raise WorkbenchError("HLO text is empty")
    module_name: str | None = None
    computations: dict[str, HloComputation] = {}
    current: tuple[str, bool, int] | None = None
    instructions: list[HloInstruction] = []
    for number, line in enumerate(hlo_text.splitlines(), start=1):
        stripped = line.strip()
        if current is None:
            if module_name is None and (header := _MODULE.match(stripped)):
                module_name = header[1]
            elif (opening := _COMPUTATION.match(line)) and not line[:1].isspace():
                current = (opening["name"], bool(opening["entry"]), number)
                instructions = []
            continue
        if stripped == "}":
            name, entry, _ = current
            if name in computations:
                raise WorkbenchError(f"HLO line {number}: computation %{name} is defined twice")
            computations[name] = HloComputation(name, entry, tuple(instructions))
            current = None
        elif stripped:
            instructions.append(_instruction(line, number))
    if current is not None:
        raise WorkbenchError(f"HLO text ends inside computation %{current[0]} (opened on line {current[2]}, "
                             "no closing '}')")
    entries = [c.name for c in computations.values() if c.entry]
    if not entries:
        problem = "no computations" if not computations else "no ENTRY computation"
        raise WorkbenchError(f"HLO text has {problem} (is it HLO module text, e.g. compiled.as_text()?)")
    if len(entries) > 1:
        raise WorkbenchError(f"HLO text has {len(entries)} ENTRY computations: {', '.join(entries)}")
    return HloModule(module_name, computations)


def _instruction(line: str, number: int) -> HloInstruction:
    """Parse one instruction line; an error naming the line when it is none."""
    head = _INSTRUCTION.match(line)
    if head is None:
        raise WorkbenchError(f"HLO line {number}: not an instruction: {line.strip()[:120]!r}")
    rest = head["rest"]
    try:
        shape_end = _closing(rest, 0) + 1 if rest.startswith("(") else len(rest.split(None, 1)[0])
        shape, rest = rest[:shape_end], rest[shape_end:].lstrip()
        opcode = _OPCODE.match(rest)
        if opcode is None:
            raise ValueError("no opcode(operands) after the shape")
        operands_end = _closing(rest, opcode.end() - 1)
        operands = tuple(m[1] for part in _split_top(rest[opcode.end():operands_end])
                         if (m := _OPERAND.search(part)))
        attrs: dict[str, str] = {}
        tail = rest[operands_end + 1:].strip()
        if tail and not tail.startswith(","):
            raise ValueError(f"unexpected text after the operands: {tail[:40]!r}")
        for part in _split_top(tail[1:]):
            key, _, value = part.partition("=")
            attrs[key.strip()] = value.strip()
    except ValueError as exc:
        raise WorkbenchError(f"HLO line {number}: malformed instruction %{head['name']}: {exc}") from None
    return HloInstruction(head["name"], opcode[1], shape, attrs, bool(head["root"]), number, operands)


def _closing(text: str, start: int) -> int:
    """Index of the bracket closing the one at `start`, skipping nested brackets and quoted strings."""
    stack: list[str] = []
    for i, char in _outside_quotes(text, start, unclosed=f"unclosed {text[start]!r}"):
        if char in _CLOSERS:
            stack.append(_CLOSERS[char])
        elif char in ")}]":
            if not stack or stack.pop() != char:
                raise ValueError(f"unbalanced {char!r} at column {i}")
            if not stack:
                return i
    raise ValueError(f"unclosed {text[start]!r}")


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets and quoted strings; empty parts dropped."""
    unclosed = "unclosed bracket or string in the attributes"
    parts, depth, start = [], 0, 0
    for i, char in _outside_quotes(text, 0, unclosed=unclosed):
        if char in _CLOSERS:
            depth += 1
        elif char in ")}]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced {char!r} in the attributes")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(unclosed)
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _outside_quotes(text: str, start: int, *, unclosed: str) -> Iterator[tuple[int, str]]:
    """(index, character) of `text` from `start` that lie outside quoted strings (whose backslash escapes
    are skipped); ValueError(`unclosed`) when the text ends inside a string."""
    quoted = False
    i = start
    while i < len(text):
        char = text[i]
        if quoted:
            if char == "\\":
                i += 1
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        else:
            yield i, char
        i += 1
    if quoted:
        raise ValueError(unclosed)
