"""Reading Hugging Face models and configs only from this machine: a local folder or the local HF cache.

Every read goes through `offline()`: `local_files_only=True` is passed by the callers, and HF_HUB_OFFLINE
is set for the duration too, so no network access is ever tried. A reference that is neither a folder nor
in the cache is a one-line `UnknownModelError` that says how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from workbench.errors import UnknownModelError, WorkbenchError, first_line
from workbench.models.extra import require

PREFIX = "hf:"

T = TypeVar("T")


@contextmanager
def offline() -> Iterator[None]:
    """HF_HUB_OFFLINE=1 (and TRANSFORMERS_OFFLINE=1) while the block runs; the previous values after."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def local_name(ref: str) -> str:
    """The id or folder of `hf:<id or folder>` (the prefix is optional); a leading ~ is expanded."""
    name = ref.removeprefix(PREFIX).strip()
    if not name:
        raise UnknownModelError("hf: needs a model id or a local folder, e.g. hf:gpt2 or hf:./my-model")
    return str(Path(name).expanduser()) if name.startswith("~") else name


def is_folder_ref(ref: str) -> bool:
    """Whether `hf:<...>` names a local folder (rather than a model id of the HF cache)."""
    return Path(local_name(ref)).is_dir()


def cached_models() -> list[str]:
    """The ids of the models in the local Hugging Face cache (its `models--org--name` folders), sorted."""
    from huggingface_hub import constants

    cache = Path(constants.HF_HUB_CACHE)
    folders = cache.glob("models--*") if cache.is_dir() else ()
    return sorted(folder.name.removeprefix("models--").replace("--", "/") for folder in folders)


def not_local(name: str, what: str = "model") -> UnknownModelError:
    """The error for a model neither in a local folder nor in the local HF cache: how to get it, and what the
    cache holds."""
    cached = cached_models()
    return UnknownModelError(
        f"hf:{name}: the {what} is not in the local Hugging Face cache and no such folder exists (nothing is "
        f"downloaded); get it with `huggingface-cli download {name}` on a machine with network and copy the "
        f"cache here, or pass a folder: hf:/path/to/model; "
        + (f"cached: {', '.join(cached)}" if cached else "the local cache holds no models")
    )


def read_local(name: str, read: Callable[[], T], what: str = "model") -> T:
    """`read()` (a from_pretrained call with local_files_only=True) offline; its failures as one line."""
    try:
        with offline():
            return read()
    except OSError as exc:
        if Path(name).is_dir():
            raise WorkbenchError(f"hf:{name}: cannot load the {what} from this folder: {first_line(exc)}") from exc
        raise not_local(name, what) from exc
    except (ValueError, KeyError) as exc:
        raise WorkbenchError(f"hf:{name}: cannot load the {what}: {first_line(exc)}") from exc


def hf_config_from(ref: str) -> Any:
    """The transformers config of `hf:<local folder or cached id>` (AutoConfig, local_files_only)."""
    auto_config = require("transformers").AutoConfig
    name = local_name(ref)
    return read_local(name, lambda: auto_config.from_pretrained(name, local_files_only=True), "config")
