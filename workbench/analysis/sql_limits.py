"""The bounds a caller of `workbench.analysis.sql.run_query` chooses within: rows returned and seconds run.

Apart from the query engine (DuckDB, Arrow, the bundles' tables), which `workbench.analysis.sql` re-exports
them with, so that the command line shows them (`workbench query --help`) without loading any of it.
"""

from __future__ import annotations

DEFAULT_LIMIT = 1_000
"""Rows a query returns unless asked for more."""
MAX_LIMIT = 100_000
"""Most rows one query may return."""
DEFAULT_TIMEOUT_S = 30.0
"""Seconds a query may run before it is interrupted."""
