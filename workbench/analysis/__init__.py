"""Analyses: pure functions over a Trace or run bundles, returning DataFrames and plain dicts."""
