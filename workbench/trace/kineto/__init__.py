"""PyTorch profiler (Kineto) and Chrome trace JSON: the streaming JSON decoder, the typed records, and the reader
that turns them into a `Trace` (`reader.read_kineto`).
"""

from workbench.trace.kineto.reader import read_kineto

__all__ = ["read_kineto"]
