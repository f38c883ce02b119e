"""The optional packages of the `models` extra (transformers, torchvision, timm), imported when first used."""

from __future__ import annotations

import importlib
from types import ModuleType

from workbench.errors import MissingDependency

EXTRA = "models"


def require(module: str) -> ModuleType:
    """Import `module` (a package of the `models` extra); MissingDependency with the pip line if it is absent."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(module.partition(".")[0], EXTRA) from exc
