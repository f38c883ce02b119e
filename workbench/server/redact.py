"""What the server sends, without the server's absolute paths: one step applied to every reply.

Messages and results come from every layer (bundles, models, the option parser, the CLI's output of a job)
and many name files by their absolute path, which tells a client the server's layout, its user's home, where
its links lead. `Redactor.value` walks a JSON reply (every string, keys included) before it leaves the server
(`WorkbenchHandler.reply` and `write_error`), and rewrites each absolute path it finds:

    a path inside the traces root     relative to it: `<root>/run-a/raw/trace.json` -> `run-a/raw/trace.json`
    the traces root itself            `.`
    any other path of this machine    `<server>` (home, root_dir, the temporary folder, site-packages, the repo...)

    Redactor(Path("/srv/lab/traces")).text(
        "/srv/lab/traces/.tmp-upload-x/big.json.gz: unrecognized trace format (see /srv/lab/notes.txt)")
    -> ".tmp-upload-x/big.json.gz: unrecognized trace format (see <server>)"

"Of this machine" means an absolute path whose first folder exists here (`/home/...`, `/tmp/...`, `/usr/...`):
names that only look like paths, such as XLA's `/device:GPU:0` or `/job:localhost/replica:0` lanes, stay as
they are. A `file://` URL counts as its path. Bokeh's binary buffers (`{"type": "bytes", "data": base64}`) are
data, not text, and pass unchanged. Redacting twice changes nothing more.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SERVER_PATH = "<server>"
"""What any absolute path of this machine outside the traces root becomes."""
ROOT = "."
"""What the traces root itself becomes in running text."""

_WORD_START = r"(?<![\w.~:/>-])"
"""Where a path may start in running text: not inside a word, a relative path, a URL or `<x>/y`."""
_PATH_CHARS = r"[^\s'\",;()\[\]{}<>]"
_ABSOLUTE_PATH = re.compile(_WORD_START + rf"/{_PATH_CHARS}+")
"""A POSIX absolute path in running text: a `/` that starts a word (not `a/b`, `http://`, `<x>/y`)."""
_END_OF_NAME = r"(?=$|[^\w.-]|\.(?:\s|$))"
"""Where a folder's name ends in running text (so `/x/traces` does not match in `/x/traces-old`)."""
_FILE_URL = re.compile(r"\bfile://(?=/)")
_TOP_LEVEL_TTL_S = 60.0
"""Seconds the listing of `/` is reused for (it changes rarely; a reply may hold thousands of strings)."""


class Redactor:
    """Rewrites the absolute paths of strings and JSON values as the module docstring says, for the traces
    root `root` (None: every path of this machine becomes `<server>`)."""

    def __init__(self, root: Path | None) -> None:
        self._root_patterns = [re.compile(_WORD_START + re.escape(spelling) + rf"(?:/+(?P<rest>{_PATH_CHARS}+)|"
                                          + _END_OF_NAME + ")")
                               for spelling in _spellings(root)]

    def text(self, message: str) -> str:
        """`message` with its absolute paths rewritten."""
        if "/" not in message:
            return message
        message = _FILE_URL.sub("", message)
        for pattern in self._root_patterns:  # the longest spelling first: a folder before its parents
            message = pattern.sub(lambda match: match["rest"] or ROOT, message)
        return _ABSOLUTE_PATH.sub(_server_path, message)

    def value(self, value: Any) -> Any:
        """A JSON value (plain data: dicts, lists, strings, numbers) with every string rewritten by `text`."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            if value.get("type") == "bytes" and isinstance(value.get("data"), str):  # a Bokeh buffer
                return value
            return {self.text(k) if isinstance(k, str) else k: self.value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.value(item) for item in value]
        return value


def redact_paths(message: str, root: Path | None) -> str:
    """`message` with its absolute paths rewritten for the traces root `root` (see `Redactor`)."""
    return Redactor(root).text(message)


def _spellings(root: Path | None) -> list[str]:
    """The ways a message may spell `root`: as given and with its links resolved, longest first."""
    if root is None:
        return []
    spellings = set()
    for spelling in (str(root), str(_resolved(root))):
        spelling = spelling.rstrip("/")
        if spelling:
            spellings.add(spelling)
    return sorted(spellings, key=len, reverse=True)


def _server_path(match: re.Match[str]) -> str:
    """`<server>` for a path whose first folder exists on this machine, else the text as it is."""
    path = match[0]
    first = path.lstrip("/").split("/", 1)[0]
    return SERVER_PATH if first in _top_level() else path


_top_level_cache: tuple[float, frozenset[str]] = (-_TOP_LEVEL_TTL_S, frozenset())
_top_level_lock = threading.Lock()


def _top_level() -> frozenset[str]:
    """The names in `/` (recent, see _TOP_LEVEL_TTL_S)."""
    global _top_level_cache
    with _top_level_lock:
        listed_at, names = _top_level_cache
        if time.monotonic() - listed_at >= _TOP_LEVEL_TTL_S:
            names = frozenset(_listing("/"))
            _top_level_cache = (time.monotonic(), names)
        return names


def _listing(folder: str) -> Iterable[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return ()


def _resolved(folder: Path) -> Path:
    try:
        return folder.resolve()
    except (OSError, RuntimeError):
        return folder
