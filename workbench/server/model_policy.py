"""Which models a capture job of the Jupyter server may load: built-in ones, and what the admin allows.

A `package.module:factory` model imports and calls Python code with the request's overrides as keyword
arguments (`os:system` with `{"command": ...}` would run a shell command as the server's user), and an
exported program is unpickled from a file. Through the server both are refused unless the server's
admin allows them (`WorkbenchServerApp.allowed_factory_modules`, `.allowed_model_dirs`). Refusals name
the setting to change, never a path of the server's disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import WorkbenchError
from workbench.models.hf_local import local_name
from workbench.models.registry import list_models, model_source

FACTORY_SETTING = "c.WorkbenchServerApp.allowed_factory_modules"
DIRS_SETTING = "c.WorkbenchServerApp.allowed_model_dirs"


class ModelRefused(WorkbenchError):
    """A model the server's policy does not allow; says which setting would allow it (403)."""


@dataclass(frozen=True)
class ModelPolicy:
    """The models a job may load besides the built-in ones.

    `factory_modules`: module names whose factories may be called; an entry also allows its submodules
    (`mymodels` allows `mymodels:make` and `mymodels.vision:make`). `model_dirs`: folders (relative ones
    from `cwd`, the server's root_dir) whose exported programs, subfolders included, may be loaded; a
    file is judged by where it really is, links resolved.
    """

    factory_modules: Sequence[str] = ()
    model_dirs: Sequence[str] = ()
    cwd: Path = Path()

    def checked_model(self, ref: str) -> str:
        """The model reference the job should get for the requested `ref`: `ref` itself, or for an
        exported program its resolved path (the file that was checked). Raises ModelRefused."""
        source = model_source(ref, self.cwd)
        if source == "factory":
            self._check_factory(ref)
        elif source == "export":
            return str(self._checked_file(ref))
        elif source == "onnx":  # an ONNX file is data, not code, but read only from the allowed folders too
            return f"onnx:{self._checked_file(ref.removeprefix('onnx:'))}"
        elif source == "hf" and (self.cwd / local_name(ref)).is_dir():  # a folder of weights: like a model file
            return f"hf:{self._checked_file(local_name(ref), directory=True)}"
        # a built-in model, hf-config:/torchvision:/timm: (code of installed packages, seeded weights), an HF id
        # read from the local cache (never with remote code), or an unknown name the capture command rejects
        return ref

    def _check_factory(self, ref: str) -> None:
        module, _, attribute = ref.partition(":")
        allowed = any(module == name or module.startswith(f"{name}.") for name in self.factory_modules)
        if not allowed:
            raise ModelRefused(
                f"model {ref!r}: this server runs only built-in models ({', '.join(list_models())}) and "
                f"factories of the modules its admin allows; to allow this one, add {module!r} to "
                f"{FACTORY_SETTING}")
        if "." in attribute or attribute.startswith("_"):
            raise ModelRefused(f"model {ref!r}: through the server a factory must be a public name of its "
                               f"module (no '.' or leading '_'), e.g. {module}:make_model")

    def _checked_file(self, ref: str, directory: bool = False) -> Path:
        """The resolved file (a folder when `directory`) `ref` names, when it lies in an allowed folder."""
        real = _resolved(self.cwd / ref)
        folders = [folder for folder in (_resolved(self.cwd / Path(name).expanduser()) for name in self.model_dirs
                                         if name) if folder is not None]
        kind_ok = real is not None and (real.is_dir() if directory else real.is_file())
        if real is None or not kind_ok or not any(real.is_relative_to(folder) for folder in folders):
            raise ModelRefused(
                f"model {ref!r}: this server loads model files only from the folders its admin allows "
                f"({DIRS_SETTING}), and this is no file in one of them")
        return real


def _resolved(path: Path) -> Path | None:
    """`path` with every link resolved, or None when it does not exist, loops or cannot be a path."""
    try:
        return path.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):  # a symlink loop before Python 3.13; a NUL in the name
        return None
