"""The timeline's windowed queries over a run: the span index (built from events.parquet, kept as a memory-mapped
file), the lanes a window draws, and the queries the panel's routes and the notebook answer with (`queries`).
"""
