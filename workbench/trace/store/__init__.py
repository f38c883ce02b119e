"""Run bundles on disk and on shared storage: the bundle and its typed records, experiment records, staging and
scratch entries, where multi-rank workers write, the mirror of a URL traces root, and how run references
resolve.
"""
