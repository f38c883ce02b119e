"""XSpace profiles (`.xplane.pb`, jax.profiler / XProf): device planes, the host-thread rules both XLA readers
share, and the reader (`reader.read_xspace`).
"""

from workbench.trace.xspace.reader import read_xspace

__all__ = ["read_xspace"]
