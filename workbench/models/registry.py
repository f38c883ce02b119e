"""Resolving a model reference: a built-in name, `package.module:factory`, or a `.pt2` file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models import convnet, mlp, tiny_gpt
from workbench.models.loaded import LoadedModel, Source
from workbench.models.spec import BuiltinSpec, require_int
from workbench.models.user import FACTORY_REF, load_exported, load_factory

BUILTINS: dict[str, BuiltinSpec] = {spec.name: spec for spec in (tiny_gpt.SPEC, mlp.SPEC, convnet.SPEC)}


def list_models() -> list[str]:
    """Names of the built-in models, sorted."""
    return sorted(BUILTINS)


def _unknown(ref: str) -> UnknownModelError:
    return UnknownModelError(
        f"unknown model '{ref}'; built-in models: {', '.join(list_models())} "
        "(or give package.module:factory, or the path of a torch.export .pt2 file)"
    )


def describe_model(name: str) -> dict[str, Any]:
    """The default config of a built-in model (a copy; kv_heads None means 'same as heads')."""
    if name not in BUILTINS:
        raise _unknown(name)
    return dict(BUILTINS[name].defaults)


def _load_builtin(spec: BuiltinSpec, overrides: dict[str, Any]) -> LoadedModel:
    unknown = sorted(set(overrides) - set(spec.defaults))
    if unknown:
        raise WorkbenchError(
            f"model '{spec.name}' has no config key(s) {', '.join(unknown)}; "
            f"valid: {', '.join(spec.defaults)}"
        )
    config = {**spec.defaults, **overrides}
    require_int(spec.name, config, "seed", minimum=0)
    return LoadedModel(
        name=spec.name,
        module=spec.build(config),
        config=config,
        source="builtin",
        input_maker=lambda batch, seq: spec.make_inputs(config, batch, seq),
        default_seq=spec.default_seq(config),
    )


def model_source(ref: str, cwd: Path | None = None) -> Source | None:
    """What kind of model `ref` names, as `load_model` decides it: "builtin", "export" (ends in .pt2 or
    names an existing file, relative to `cwd`, default the current directory), "factory"
    (`package.module:factory`), or None for none. The Jupyter server checks its policy with this."""
    if ref in BUILTINS:
        return "builtin"
    if ref.endswith(".pt2") or ((cwd or Path()) / ref).is_file():
        return "export"
    return "factory" if FACTORY_REF.match(ref) else None


def load_model(ref: str, **config_overrides: Any) -> LoadedModel:
    """Resolve `ref` into a LoadedModel.

    `ref` is a built-in name (`config_overrides` override its defaults), `package.module:factory`
    (called with `config_overrides` as keyword arguments) or the path of a saved torch.export
    program (ends in .pt2 or names an existing file; takes no overrides).
    """
    source = model_source(ref)
    if source == "builtin":
        return _load_builtin(BUILTINS[ref], config_overrides)
    if source == "export":
        return load_exported(ref, config_overrides)
    if source == "factory":
        return load_factory(ref, config_overrides)
    raise _unknown(ref)
