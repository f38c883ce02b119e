"""Error messages fit for API clients: no absolute path of the server's disk, no link target.

Messages come from every layer (bundles, models, the option parser) and many name files by their
absolute path, which tells a client the server's layout and where its links lead. Before one leaves the
server, the folders the client knows by name become labels and any other absolute path becomes `<path>`:

    redact_paths("run 'x': /srv/lab/traces/x leads outside /srv/lab/traces (to /etc); refused",
                 {"<traces root>": Path("/srv/lab/traces")})
    -> "run 'x': <traces root>/x leads outside <traces root> (to <path>); refused"
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/>-])/[^\s'\",;()\[\]{}<>]+")
"""A POSIX absolute path in running text: a `/` that starts a word (not `a/b`, `http://`, `<x>/y`)."""
_END_OF_NAME = r"(?=$|[^\w.-]|\.(?:\s|$))"
"""Where a folder's name ends in running text (so `/x/traces` does not match in `/x/traces-old`)."""


def redact_paths(message: str, labels: Mapping[str, Path | None]) -> str:
    """`message` with each folder of `labels` (as given and with links resolved) replaced by its label,
    then every other absolute path by `<path>`."""
    known: dict[str, str] = {}
    for label, folder in labels.items():
        if folder is not None:
            for spelling in (str(folder), str(_resolved(folder))):
                if spelling != "/":
                    known.setdefault(spelling, label)
    for spelling in sorted(known, key=len, reverse=True):  # a folder before its parents
        message = re.sub(re.escape(spelling) + _END_OF_NAME, known[spelling], message)
    return _ABSOLUTE_PATH.sub("<path>", message)


def _resolved(folder: Path) -> Path:
    try:
        return folder.resolve()
    except (OSError, RuntimeError):
        return folder
