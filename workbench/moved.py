"""Module paths that moved, kept importable: `import workbench.trace.store.bundle` gives the module that now lives at
`workbench.trace.store.bundle`, so notebooks and scripts written against the earlier layout keep working.

A package lists what moved out of it (old name → new name, relative to the package) and calls `keep_importable`;
the old name then resolves, on first import, to the very module object of the new one.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Mapping
from types import ModuleType


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of one package's moved modules and loads each as its new module."""

    def __init__(self, package: str, moved: Mapping[str, str]) -> None:
        self.package = package
        self.moved = {f"{package}.{old}": f"{package}.{new}" for old, new in moved.items()}
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in self.moved else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.moved[spec.name])
        self._specs[spec.name] = module.__spec__  # the import machinery sets the alias's spec on it next
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._specs.pop(module.__spec__.name, module.__spec__) if module.__spec__ else None


def keep_importable(package: str, moved: Mapping[str, str]) -> None:
    """Let the old names of `package`'s moved modules (`moved`: old → new, relative) import as the new ones."""
    if not any(isinstance(finder, _MovedModules) and finder.package == package for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules(package, moved))
