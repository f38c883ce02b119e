"""Image classifiers of torchvision (`torchvision:<name>`) and timm (`timm:<name>`) as LoadedModels.

Nothing is downloaded: a model loads its pretrained weights only when they are already in the local cache
(torchvision: torch hub's `checkpoints/` folder; timm: the Hugging Face cache, or torch hub's folder for
weights published by URL), and is otherwise built with seeded random weights (`seed`, default 0). The
LoadedModel says which (`weights`). Example inputs are images of the model's own input size (torchvision:
its weights' crop size; timm: its pretrained config's input size), standard normal. A model whose fp32
weights would not fit in memory is refused before it is built.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from workbench.errors import UnknownModelError, WorkbenchError
from workbench.models.extra import require
from workbench.models.hf_local import offline
from workbench.models.loaded import LoadedModel, Source
from workbench.models.memory import check_fits, meta_parameter_count
from workbench.models.seeding import input_generator, seeded_global_rng

TORCHVISION_PREFIX = "torchvision:"
TIMM_PREFIX = "timm:"
DEFAULT_IMAGE_SIZE = 224
CONFIG_KEYS = ("seed",)


def _seed(ref: str, overrides: Mapping[str, Any]) -> int:
    unknown = sorted(set(overrides) - set(CONFIG_KEYS))
    if unknown:
        raise WorkbenchError(f"{ref} has no config key(s) {', '.join(unknown)}; valid: {', '.join(CONFIG_KEYS)}")
    seed = overrides.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkbenchError(f"{ref}: seed must be an integer >= 0, got {seed!r}")
    return seed


def _hub_checkpoint(url: str | None) -> Path | None:
    """The file torch hub caches `url` as, when it is there."""
    if not url:
        return None
    path = Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(url).path)
    return path if path.is_file() else None


def _loaded(ref: str, model: nn.Module, size: tuple[int, ...], source: Source, cached: bool,
            info: dict[str, Any], seed: int) -> LoadedModel:
    def make_inputs(batch: int, seq: int | None) -> tuple[torch.Tensor, ...]:
        return (torch.randn(batch, *size, generator=input_generator(seed)),)

    return LoadedModel(name=ref, module=model.to(device="cpu", dtype=torch.float32).eval(),
                       config={**info, "input_size": list(size), "seed": seed}, source=source,
                       input_maker=make_inputs, weights="real" if cached else "random")


def _built(factory: Callable[[], nn.Module], seed: int) -> nn.Module:
    """`factory()` offline, its random initialization (replaced by cached weights, if any) seeded."""
    with seeded_global_rng(seed), offline():
        return factory()


def load_torchvision(ref: str, overrides: Mapping[str, Any]) -> LoadedModel:
    """`torchvision:<name>`: a torchvision classification model, with its DEFAULT weights when cached."""
    models = require("torchvision.models")
    name = ref.removeprefix(TORCHVISION_PREFIX)
    seed = _seed(ref, overrides)
    available = models.list_models(module=models)
    if name not in available:
        raise UnknownModelError(f"unknown torchvision model {name!r}; classification models: {', '.join(available)}")
    default = models.get_model_weights(name).DEFAULT
    check_fits(ref, int(default.meta["num_params"]))
    cached = _hub_checkpoint(default.url) is not None
    crop = default.transforms().crop_size
    side = int(crop[0]) if crop else DEFAULT_IMAGE_SIZE
    model = _built(lambda: models.get_model(name, weights=default if cached else None), seed)
    info = {"model": name, "pretrained": str(default) if cached else None}
    return _loaded(ref, model, (3, side, side), "torchvision", cached, info, seed)


def _timm_cached_file(pretrained_cfg: Mapping[str, Any]) -> str | None:
    """The locally cached weights file of a timm pretrained config, or None."""
    hub_id = pretrained_cfg.get("hf_hub_id")
    if hub_id:
        from huggingface_hub import try_to_load_from_cache

        for filename in ("model.safetensors", "pytorch_model.bin"):
            found = try_to_load_from_cache(hub_id, filename)
            if isinstance(found, str):
                return found
    checkpoint = _hub_checkpoint(pretrained_cfg.get("url"))
    return str(checkpoint) if checkpoint else None


def load_timm(ref: str, overrides: Mapping[str, Any]) -> LoadedModel:
    """`timm:<name>`: a timm model (an architecture, optionally `.tag`), with its pretrained weights when
    cached."""
    timm = require("timm")
    name = ref.removeprefix(TIMM_PREFIX)
    seed = _seed(ref, overrides)
    if not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=8, cutoff=0.6)
        raise UnknownModelError(
            f"unknown timm model {name!r}; "
            + (f"close matches: {', '.join(close)}; " if close else "")
            + f"{len(timm.list_models())} models in all (timm.list_models('*pattern*') lists them)")
    pretrained_cfg: dict[str, Any] = {}

    def build_keeping_cfg() -> nn.Module:
        model = timm.create_model(name, pretrained=False)
        pretrained_cfg.update(getattr(model, "pretrained_cfg", None) or {})
        return model

    check_fits(ref, meta_parameter_count(ref, build_keeping_cfg))
    weights_file = _timm_cached_file(pretrained_cfg)
    overlay = {"pretrained_cfg_overlay": {"file": weights_file}} if weights_file else {}
    model = _built(lambda: timm.create_model(name, pretrained=bool(weights_file), **overlay), seed)
    size = tuple(int(d) for d in (pretrained_cfg.get("input_size") or (3, DEFAULT_IMAGE_SIZE, DEFAULT_IMAGE_SIZE)))
    origin = pretrained_cfg.get("hf_hub_id") or pretrained_cfg.get("url")
    info = {"model": name, "pretrained": origin if weights_file else None}
    return _loaded(ref, model, size, "timm", weights_file is not None, info, seed)
