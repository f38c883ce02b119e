"""Trained weights kept in the workbench's cache folder (`workbench.cache`), so a model is trained once per
machine and loaded in a moment after.

A checkpoint's file name carries a hash of its key: the model, its config, the training budget, the data's
digest and `FORMAT`, so a change to any of them trains anew instead of loading stale weights. The file is
written to a temporary name and renamed into place (readers see a whole file or none), and the training runs
under a lock file, so two processes asking at once train once: the second waits and loads what the first wrote.
A file that cannot be read back (truncated, corrupt, another format) is trained again with a warning.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from workbench.cache import cache_dir

FORMAT = 1
"""Part of every key: bump it when what a checkpoint holds, or how training works, changes."""
FOLDER = "trained-models"
"""The checkpoints' folder under the cache folder."""

StateDict = dict[str, torch.Tensor]
Trainer = Callable[[], tuple[StateDict, dict[str, Any]]]
"""Trains and returns (state dict, JSON-ready metadata)."""


class CheckpointWarning(UserWarning):
    """A cached checkpoint could not be read and is trained again."""


def checkpoint_path(name: str, key: Mapping[str, Any]) -> Path:
    """Where the checkpoint of model `name` for `key` (JSON-ready) is kept."""
    digest = hashlib.sha256(json.dumps([FORMAT, name, key], sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / FOLDER / f"{name}-{digest}.pt"


def _read(path: Path, key: Mapping[str, Any]) -> tuple[StateDict, dict[str, Any]] | None:
    """The checkpoint at `path` when it is whole and was trained for `key`; None when there is none. Raises
    ValueError (or what torch.load raises) for one that cannot be used."""
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"not a format-{FORMAT} checkpoint")
    if json.loads(payload["key"]) != json.loads(json.dumps(key, sort_keys=True)):
        raise ValueError("trained for another key")
    state, meta = payload["state"], json.loads(payload["meta"])
    if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
        raise ValueError("no state dict")
    return state, meta


def _write(path: Path, key: Mapping[str, Any], state: StateDict, meta: dict[str, Any]) -> None:
    """Write the checkpoint through a temporary file in the same folder, renamed into place."""
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    try:
        torch.save({"format": FORMAT, "key": json.dumps(key, sort_keys=True), "state": state,
                    "meta": json.dumps(meta, sort_keys=True)}, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold the checkpoint's lock file (one per checkpoint) for the block."""
    with open(path.with_name(f"{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _try_read(path: Path, key: Mapping[str, Any]) -> tuple[StateDict, dict[str, Any]] | None:
    """`_read`, with an unusable file reported as a warning and treated as absent."""
    try:
        return _read(path, key)
    except Exception as error:  # any unreadable file (zip, pickle, EOF, shape) is trained again
        warnings.warn(f"cached checkpoint {path} cannot be used ({type(error).__name__}: {error}); training again",
                      CheckpointWarning, stacklevel=3)
        return None


def load_or_train(name: str, key: Mapping[str, Any], train: Trainer) -> tuple[StateDict, dict[str, Any]]:
    """The cached (state dict, metadata) of model `name` for `key`, made by `train()` and cached when there
    is none or it cannot be read."""
    path = checkpoint_path(name, key)
    try:
        found = _read(path, key)
    except Exception:  # looked at again under the lock, which reports it
        found = None
    if found is not None:
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        found = _try_read(path, key)  # another process may have trained it while this one waited
        if found is not None:
            return found
        state, meta = train()
        _write(path, key, state, meta)
    return state, meta
