"""Shared test helpers: where the real-trace fixtures live, and a writer for tiny inline traces."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures"


def fixture_path(*parts: str) -> Path:
    """Path of a shared real-trace fixture; skips the test where shared/ is absent (a user's clone)."""
    path = FIXTURES.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"shared fixture {path} not present (it lives beside the repository, in ../shared)")
    return path


def load_raw(path: Path) -> dict[str, Any]:
    """The raw JSON of a (gzipped) Chrome trace, for checking readers against it."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def write_trace(path: Path, events: list[dict[str, Any]], **top: Any) -> Path:
    """Write a Kineto-style object-form trace with the given events and top-level keys."""
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    path.write_text(json.dumps(doc, indent=1))
    return path
