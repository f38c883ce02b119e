"""Workbench for agents: the traces root's answers as compact, size-bounded JSON (`answers`, `paging`) and the
Model Context Protocol server that serves them (`mcp_server`, `workbench mcp`; docs/agents.md)."""
