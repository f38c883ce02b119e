"""Resolving a model reference: a built-in name, a prefixed source (`hf:`, `hf-config:`, `torchvision:`,
`timm:`, ...), `package.module:factory`, or a `.pt2` file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models import convnet, hf, hf_presets, mlp, tiny_gpt, vision
from workbench.models.loaded import LoadedModel, Source
from workbench.models.onnx_file import is_onnx_ref, load_onnx_file
from workbench.models.spec import BuiltinSpec, require_int
from workbench.models.user import FACTORY_REF, load_exported, load_factory

BUILTINS: dict[str, BuiltinSpec] = {spec.name: spec for spec in (tiny_gpt.SPEC, mlp.SPEC, convnet.SPEC)}

Loader = Callable[[str, Mapping[str, Any]], LoadedModel]

PREFIXED: dict[str, tuple[Source, Loader]] = {
    hf.HF_PREFIX: ("hf", hf.load_hf),
    hf.CONFIG_PREFIX: ("hf-config", hf.load_hf_config),
    vision.TORCHVISION_PREFIX: ("torchvision", vision.load_torchvision),
    vision.TIMM_PREFIX: ("timm", vision.load_timm),
}
"""Model sources named by a prefix of the reference: prefix → (source kind, loader(ref, overrides)). One line
adds a source."""


def _prefixed(ref: str) -> tuple[Source, Loader] | None:
    return next((entry for prefix, entry in PREFIXED.items() if ref.startswith(prefix)), None)


def list_models() -> list[str]:
    """Names of the built-in models, sorted."""
    return sorted(BUILTINS)


EXAMPLE_VISION_MODELS = ("torchvision:resnet50", "torchvision:vit_b_16", "torchvision:convnext_tiny",
                         "torchvision:efficientnet_b0", "torchvision:mobilenet_v3_small", "timm:resnet50",
                         "timm:vit_base_patch16_224", "timm:convnext_tiny", "timm:efficientnet_b0",
                         "timm:mobilenetv3_small_100")
"""Vision references a model picker offers (any torchvision classifier or timm model name works)."""


def model_choices() -> list[str]:
    """What a model picker offers: the built-ins, every `hf-config:` preset and common vision models."""
    return [*list_models(), *(f"hf-config:{name}" for name in hf_presets.preset_names()), *EXAMPLE_VISION_MODELS]


def _unknown(ref: str) -> UnknownModelError:
    return UnknownModelError(
        f"unknown model '{ref}'; built-in models: {', '.join(list_models())} "
        f"(or give hf:<id or folder>, hf-config:<preset> with presets {', '.join(hf_presets.preset_names())}, "
        "torchvision:<name>, timm:<name>, package.module:factory, or the path of a torch.export .pt2 file)"
    )


def describe_model(name: str) -> dict[str, Any]:
    """The default config of a built-in model (a copy; kv_heads None means 'same as heads')."""
    if name not in BUILTINS:
        raise _unknown(name)
    return dict(BUILTINS[name].defaults)


WEIGHTS_KEY = "weights"
"""The override that picks a built-in's weights: "random" (seeded, the default) or "trained"
(`workbench.models.trained`)."""


def _load_builtin(spec: BuiltinSpec, overrides: dict[str, Any]) -> LoadedModel:
    overrides = dict(overrides)
    weights = overrides.pop(WEIGHTS_KEY, "random")
    unknown = sorted(set(overrides) - set(spec.defaults))
    if unknown:
        raise WorkbenchError(
            f"model '{spec.name}' has no config key(s) {', '.join(unknown)}; "
            f"valid: {', '.join(spec.defaults)}, {WEIGHTS_KEY}"
        )
    if weights == "trained":
        from workbench.models.trained.recipes import load_trained

        return load_trained(spec, overrides)
    if weights != "random":
        raise WorkbenchError(f"model '{spec.name}': {WEIGHTS_KEY} must be 'random' or 'trained', got {weights!r}")
    config = {**spec.defaults, **overrides}
    require_int(spec.name, config, "seed", minimum=0)
    return LoadedModel(
        name=spec.name,
        module=spec.build(config),
        config=config,
        source="builtin",
        input_maker=lambda batch, seq: spec.make_inputs(config, batch, seq),
        default_seq=spec.default_seq(config),
        weights="random",
    )


def model_source(ref: str, cwd: Path | None = None) -> Source | None:
    """What kind of model `ref` names, as `load_model` decides it: "builtin", a prefixed source's kind
    ("hf", "hf-config", "torchvision", "timm": `PREFIXED`), "export" (ends in .pt2 or
    names an existing file, relative to `cwd`, default the current directory), "onnx" (`onnx:<file>` or a
    path ending in .onnx), "factory" (`package.module:factory`), or None for none. The Jupyter server
    checks its policy with this."""
    if ref in BUILTINS:
        return "builtin"
    if (prefixed := _prefixed(ref)) is not None:
        return prefixed[0]
    if is_onnx_ref(ref):
        return "onnx"
    if ref.endswith(".pt2") or ((cwd or Path()) / ref).is_file():
        return "export"
    return "factory" if FACTORY_REF.match(ref) else None


def load_model(ref: str, **config_overrides: Any) -> LoadedModel:
    """Resolve `ref` into a LoadedModel.

    `ref` is a built-in name (`config_overrides` override its defaults; `weights="trained"` gives tiny-gpt and
    convnet trained weights, `workbench.models.trained`), a prefixed source (`PREFIXED`:
    `hf-config:<preset>` takes friendly keys such as layers/hidden, `torchvision:`/`timm:` take seed),
    `package.module:factory`
    (called with `config_overrides` as keyword arguments) or the path of a saved torch.export
    program (ends in .pt2 or names an existing file; takes no overrides).
    """
    source = model_source(ref)
    if source == "builtin":
        return _load_builtin(BUILTINS[ref], config_overrides)
    if (prefixed := _prefixed(ref)) is not None:
        return prefixed[1](ref, config_overrides)
    if source == "export":
        return load_exported(ref, config_overrides)
    if source == "factory":
        return load_factory(ref, config_overrides)
    if source == "onnx":
        return load_onnx_file(ref, config_overrides)
    raise _unknown(ref)
