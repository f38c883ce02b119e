"""Bottleneck findings: the `Finding` record and what detectors share, the detectors of device work and of what a
compiler would fix, and the ranking over a trace.
"""
