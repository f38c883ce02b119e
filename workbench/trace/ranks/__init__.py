"""Multi-rank imports: per-rank traces read in parallel and put on one time axis, and the tasks an engine runs
for them.
"""
