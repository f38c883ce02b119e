"""Architecture checks over the source of `workbench`: its modules import each other without cycles, and no
module grows past `MAX_LINES` lines.

The import graph is read from the syntax trees, not by importing: every `import` and `from ... import`
anywhere in a module counts (top level or inside functions, absolute or relative) except those under
`if TYPE_CHECKING:`, which never run (they are how a module names a type without importing its module).
`from package import name` is an edge to the submodule `package.name` when there is one, else to the
package; an import of a module that does not exist is no edge (importing it fails elsewhere). Two edges
that no `import` statement shows count too:

- a package's `__init__` runs on the way to any of its submodules, so importing `a.b.c` is also an edge to
  the packages `a.b` and `a` (what their `__init__` re-exports is then imported), except to the importing
  module's own packages, which are initialised before it runs;
- a string naming a module of the package is an edge: the plug-in registries (`BUILTIN`) and
  `importlib.import_module` import modules by name. The way back, a plug-in importing the registry that
  names it (to register itself), is not: the registry imports its plug-ins at first lookup, once it is
  whole, so that import always finds it complete.
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


def with_packages(name: str, is_package: bool, found: Set[str], known: Set[str]) -> set[str]:
    """The modules `found` that module `name` imports, with the packages Python initialises on the way to them
    (see the module docstring), itself left out."""
    own = _packages_of(name) | ({name} if is_package else set())
    found = set(found) | {package for target in found for package in _packages_of(target) if package in known} - own
    found.discard(name)
    return found


def _packages_of(module: str) -> set[str]:
    """The packages enclosing `module` (`a.b.c`: `a`, `a.b`)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def _named_in_strings(tree: ast.Module, known: Set[str]) -> set[str]:
    """The modules among `known` that a module's syntax tree names in a string (a plug-in registry's)."""
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "." in node.value
            and node.value in known}


def _named_imports(name: str, tree: ast.Module, is_package: bool, known: Set[str]) -> set[str]:
    """The modules among `known` that module `name` (its syntax tree) names in an import statement."""
    here = name.split(".") if is_package else name.split(".")[:-1]
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
    return found


def _is_type_checking_block(node: ast.AST) -> bool:
    """Whether `node` is `if TYPE_CHECKING:` (or `if typing.TYPE_CHECKING:`)."""
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module name -> the modules of the same package it imports (a plug-in's import of the registry that
    names it left out: see the module docstring)."""
    modules = module_files(package)
    known = modules.keys()
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), str(path)) for name, (path, _) in modules.items()}
    named = {name: _named_in_strings(tree, known) for name, tree in trees.items()}
    graph = {name: with_packages(name, is_package, _named_imports(name, trees[name], is_package, known) | named[name],
                                 known)
             for name, (_, is_package) in modules.items()}
    for registry, plugins in named.items():
        for plugin in plugins:
            for module in (m for m in graph if m == plugin or m.startswith(f"{plugin}.")):
                graph[module].discard(registry)  # a plug-in package's modules register it too
    return graph


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
    assert import_graph(package) == {"pkg": {"pkg.sub", "pkg.sub.helper"}, "pkg.sub": {"pkg.sub.helper"},
                                     "pkg.sub.helper": {"pkg.top"}, "pkg.top": {"pkg.sub", "pkg.sub.helper"}}
    assert find_cycles(import_graph(package)) == [["pkg.sub", "pkg.sub.helper", "pkg.top", "pkg.sub"]]


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


def test_a_package_init_re_exporting_a_module_that_imports_the_package_is_a_cycle(tmp_path):
    package = _package(tmp_path, {"pkg/__init__.py": "", "pkg/trace/__init__.py": "from pkg.trace.reader import read\n",
                                  "pkg/trace/reader.py": "from pkg.store.bundle import write\n",
                                  "pkg/store/__init__.py": "", "pkg/store/bundle.py": "from pkg.trace.model import T\n",
                                  "pkg/trace/model.py": ""})
    assert find_cycles(import_graph(package)) == [["pkg.store.bundle", "pkg.trace", "pkg.trace.reader",
                                                   "pkg.store.bundle"]]


def test_an_import_inside_a_function_is_a_cycle(tmp_path):
    package = _package(tmp_path, {"pkg/__init__.py": "", "pkg/child.py": "def run():\n    from pkg import lifecycle\n",
                                  "pkg/lifecycle.py": "import pkg.child\n"})
    assert find_cycles(import_graph(package)) == [["pkg.child", "pkg.lifecycle", "pkg.child"]]


def test_a_module_a_plugin_registry_names_is_a_cycle(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/registry.py": "BUILTIN = {'nsys': 'pkg.nsys'}\n",
             "pkg/nsys.py": "from pkg.registry import register\nfrom pkg.child import spec\n",
             "pkg/child.py": "def run():\n    from pkg.lifecycle import go\n",
             "pkg/lifecycle.py": "from pkg.registry import get\n"}
    package = _package(tmp_path, files)
    assert find_cycles(import_graph(package)) == [["pkg.child", "pkg.lifecycle", "pkg.registry", "pkg.nsys",
                                                   "pkg.child"]]
    files["pkg/child.py"] = ""  # the registry alone, its plug-in registering itself: no cycle
    assert find_cycles(import_graph(_package(tmp_path, files))) == []


def test_no_import_cycles():
    cycles = find_cycles(import_graph(PACKAGE))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_module_over_max_lines():
    too_long = long_modules(PACKAGE)
    assert not too_long, f"modules over {MAX_LINES} lines:\n" + "\n".join(
        f"{name}: {n}" for name, n in too_long.items())
