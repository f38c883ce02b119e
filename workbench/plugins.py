"""`Plugins`: a registry of named plug-ins whose built-in modules register themselves when imported.

The backend and profiler registries share it: the built-in modules are imported the first time the registry
is read (each imports its framework lazily, so nothing heavy loads before), and the built-in entries come
first, in their declared order, whatever imported them first; others follow in registration order.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class Plugins(Generic[T]):
    """Named entries; `builtin` maps the built-in names to the modules that register them."""

    def __init__(self, builtin: Mapping[str, str]) -> None:
        self.builtin = dict(builtin)
        self._entries: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str, entry: T) -> None:
        """Add (or replace) an entry."""
        self._entries[name] = entry

    def entries(self) -> dict[str, T]:
        """Every entry, the built-in modules imported first; built-in names first in their declared order."""
        if not self._loaded:
            self._loaded = True
            for module in self.builtin.values():
                importlib.import_module(module)
        order = list(self.builtin)
        return {name: self._entries[name] for name in
                sorted(self._entries, key=lambda n: order.index(n) if n in order else len(order))}

    def registered(self) -> dict[str, T]:
        """The entries registered so far, without importing the built-in modules."""
        return dict(self._entries)
