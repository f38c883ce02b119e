"""The text the built-in tiny-gpt is trained on: the Python standard library's own source, which every Python
install carries, so neither the text nor a tokenizer is downloaded (tokens are bytes, vocabulary 256).

A fixed, sorted list of modules (`STDLIB_MODULES`) is read from `sysconfig`'s stdlib folder and split by file:
every `HELD_OUT_EVERY`-th module of the list is held out, the rest is training text, so no held-out line was
ever trained on. The digest covers every file's name and bytes: another Python (or a patched stdlib) gives
another digest, hence another cache key for the checkpoints trained on it.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.errors import WorkbenchError

STDLIB_MODULES: tuple[str, ...] = tuple(sorted((
    "argparse", "ast", "base64", "bdb", "bisect", "calendar", "cmd", "code", "codecs", "colorsys", "configparser",
    "contextlib", "copy", "csv", "dataclasses", "datetime", "difflib", "dis", "doctest", "enum", "filecmp",
    "fileinput", "fnmatch", "fractions", "ftplib", "functools", "getopt", "gettext", "glob", "graphlib", "gzip",
    "hashlib", "heapq", "hmac", "imaplib", "inspect", "ipaddress", "keyword", "linecache", "locale", "lzma",
    "mailbox", "mimetypes", "numbers", "operator", "optparse", "os", "pathlib", "pdb", "pickle", "pickletools",
    "platform", "plistlib", "poplib", "posixpath", "pprint", "profile", "pstats", "pydoc", "queue", "quopri",
    "random", "reprlib", "rlcompleter", "runpy", "sched", "secrets", "selectors", "shelve", "shlex", "shutil",
    "smtplib", "socket", "socketserver", "ssl", "statistics", "string", "struct", "subprocess", "symtable",
    "sysconfig", "tabnanny", "tarfile", "tempfile", "textwrap", "threading", "timeit", "token", "tokenize", "trace",
    "traceback", "tracemalloc", "types", "typing", "uuid", "warnings", "wave", "weakref", "zipapp", "zipimport",
    "asyncio/base_events", "asyncio/events", "asyncio/futures", "asyncio/locks", "asyncio/queues",
    "asyncio/selector_events", "asyncio/streams", "asyncio/tasks", "collections/__init__",
    "concurrent/futures/_base", "concurrent/futures/process", "concurrent/futures/thread", "ctypes/__init__",
    "email/_header_value_parser", "email/feedparser", "email/message", "email/parser", "email/utils",
    "html/__init__", "html/parser", "http/client", "http/cookiejar", "http/cookies", "http/server",
    "importlib/__init__", "importlib/_bootstrap", "importlib/_bootstrap_external", "importlib/metadata/__init__",
    "json/__init__", "json/decoder", "json/encoder", "json/scanner", "json/tool", "logging/__init__",
    "logging/config", "logging/handlers", "multiprocessing/connection", "multiprocessing/managers",
    "multiprocessing/pool", "multiprocessing/process", "multiprocessing/queues", "re/_compiler", "re/_parser",
    "sqlite3/__init__", "unittest/case", "unittest/loader", "unittest/main", "unittest/mock", "unittest/result",
    "unittest/runner", "unittest/suite", "urllib/parse", "urllib/request", "wsgiref/handlers", "xml/dom/minidom",
    "xml/etree/ElementTree", "xmlrpc/client", "xmlrpc/server", "zoneinfo/_zoneinfo",
)))
"""Pure-Python modules of the standard library, as paths under its folder without `.py`, sorted. They are in
every CPython 3.11 build (none of the parts Linux distributions package apart: tkinter, idlelib, lib2to3,
distutils, ensurepip, test); a module missing from an install is left out, which changes the digest."""

HELD_OUT_EVERY = 10
"""Every 10th module of `STDLIB_MODULES` (indices 9, 19, ...) is held out."""

SEPARATOR = b"\n\n"
"""Between two files of one split, so a window that crosses files sees a plain blank line."""

VOCAB = 256
"""Byte-level tokens: one token per byte of the UTF-8 source."""


@dataclass(frozen=True)
class Corpus:
    """The two splits of the text, the files each came from, and what identifies the text."""

    train: bytes
    held_out: bytes
    train_files: tuple[str, ...]
    held_out_files: tuple[str, ...]
    digest: str
    """sha256 (hex) over every file's name and bytes, in list order."""
    python: str
    """The Python version whose stdlib this is ("3.11")."""

    def describe(self) -> str:
        """How surfaces name the text: "the Python 3.11 standard library source"."""
        return f"the Python {self.python} standard library source"

    def facts(self) -> dict[str, object]:
        """JSON-ready facts a checkpoint records about its text."""
        return {"corpus": "python-stdlib", "python": self.python, "digest": self.digest,
                "train_bytes": len(self.train), "held_out_bytes": len(self.held_out),
                "train_files": len(self.train_files), "held_out_files": len(self.held_out_files)}


def stdlib_folder() -> Path:
    """The folder of this Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def split_modules(modules: tuple[str, ...] = STDLIB_MODULES) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(train, held out) module names: the list's every `HELD_OUT_EVERY`-th entry is held out."""
    held = tuple(name for i, name in enumerate(modules) if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1)
    return tuple(name for name in modules if name not in held), held


@functools.lru_cache(maxsize=4)
def stdlib_corpus(folder: Path | None = None) -> Corpus:
    """The corpus read from `folder` (default: this Python's stdlib); read once per process."""
    root = folder or stdlib_folder()
    digest = hashlib.sha256()
    texts: dict[str, bytes] = {}
    for name in STDLIB_MODULES:
        path = root / f"{name}.py"
        if path.is_file():
            texts[name] = path.read_bytes()
            digest.update(f"{name}\0{len(texts[name])}\0".encode())
            digest.update(texts[name])
    train, held = (tuple(name for name in split if name in texts) for split in split_modules())
    if not train or not held:
        raise WorkbenchError(f"{root}: not a Python standard library folder (found {len(texts)} of "
                             f"{len(STDLIB_MODULES)} modules the training text is made of)")
    return Corpus(train=SEPARATOR.join(texts[name] for name in train),
                  held_out=SEPARATOR.join(texts[name] for name in held),
                  train_files=train, held_out_files=held, digest=digest.hexdigest(),
                  python=f"{sys.version_info.major}.{sys.version_info.minor}")


def byte_tokens(text: bytes) -> torch.Tensor:
    """The token ids of `text`: its bytes, int64 [len(text)]."""
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).to(torch.int64)
