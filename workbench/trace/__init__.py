"""Trace model, readers and run bundles. Light: no torch or jax at import."""

from workbench.trace.model import Trace
from workbench.trace.registry import read_trace, sniff_format

__all__ = ["Trace", "read_trace", "sniff_format"]
