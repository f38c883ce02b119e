"""Architecture checks over the source of `workbench`: its modules import each other without cycles, and no
module grows past `MAX_LINES` lines.

The import graph is read from the syntax trees, not by importing: every `import` and `from ... import`
anywhere in a module counts (top level or inside functions, absolute or relative) except those under
`if TYPE_CHECKING:`, which never run (they are how a module names a type without importing its module).
`from package import name` is an edge to the submodule `package.name` when there is one, else to the
package; an import of a module that does not exist is no edge (importing it fails elsewhere). The parent
packages that Python initialises on the way to a submodule are not edges: they are imported first and
are in `sys.modules` by the time a submodule imports anything.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workbench"
MAX_LINES = 500


def module_files(package: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under `package` by dotted name, with its file and whether it is a package `__init__`."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = [package.name, *path.relative_to(package).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def imported_modules(name: str, path: Path, is_package: bool, known: Set[str]) -> set[str]:
    """The modules among `known` that module `name` (file `path`) imports anywhere in its body."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    type_only = {id(node) for block in ast.walk(tree) if _is_type_checking_block(block)
                 for statement in block.body for node in ast.walk(statement)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            anchor = here[:len(here) - node.level + 1] if node.level else []
            source = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{source}.{alias.name}" in known:
                    found.add(f"{source}.{alias.name}")
                elif source in known:
                    found.add(source)
    found.discard(name)
    return found


def _is_type_checking_block(node: ast.AST) -> bool:
    """Whether `node` is `if TYPE_CHECKING:` (or `if typing.TYPE_CHECKING:`)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module name -> the modules of the same package it imports."""
    modules = module_files(package)
    return {name: imported_modules(name, path, is_package, modules.keys())
            for name, (path, is_package) in modules.items()}


def find_cycles(graph: Mapping[str, Set[str]]) -> list[list[str]]:
    """One import cycle (`[a, b, ..., a]`) through each group of modules that import each other (each strongly
    connected component of more than one module, Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            child = next((e for e in edges if e not in index or e in on_stack), None)
            if child is not None and child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
                continue
            if child is not None:
                low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(component)
    return sorted(_cycle_in(graph, component) for component in components)


def _cycle_in(graph: Mapping[str, Set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module, by breadth-first search inside it."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def long_modules(package: Path, limit: int = MAX_LINES) -> dict[str, int]:
    """Modules with more than `limit` lines, by dotted name."""
    lengths = {name: len(path.read_text(encoding="utf-8").splitlines())
               for name, (path, _) in module_files(package).items()}
    return {name: n for name, n in sorted(lengths.items()) if n > limit}


def test_find_cycles_reports_each_cycle_once():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}, "g": {"a"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_sees_lazy_relative_and_submodule_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.sub import helper\n")
    (package / "sub" / "__init__.py").write_text("from . import helper\n")
    (package / "sub" / "helper.py").write_text("def f():\n    from ..top import g\n    import pkg.missing\n")
    (package / "top.py").write_text("import json\nfrom typing import TYPE_CHECKING\nfrom .sub.helper import f\n"
                                    "if TYPE_CHECKING:\n    from pkg import sub\n")
    assert import_graph(package) == {"pkg": {"pkg.sub.helper"}, "pkg.sub": {"pkg.sub.helper"},
                                     "pkg.sub.helper": {"pkg.top"}, "pkg.top": {"pkg.sub.helper"}}
    assert find_cycles(import_graph(package)) == [["pkg.sub.helper", "pkg.top", "pkg.sub.helper"]]


def test_no_import_cycles():
    cycles = find_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_over_max_lines():
    too_long = long_modules(PACKAGE)
    assert not too_long, f"modules over {MAX_LINES} lines:\n" + "\n".join(
        f"{name}: {n}" for name, n in too_long.items())
