"""Nsight Systems SQLite exports (`nsys export --type sqlite`): table access, the event tables as parts, the
export's metadata, and the reader (`reader.read_nsys`).
"""

from workbench.trace.nsys.reader import read_nsys

__all__ = ["read_nsys"]
