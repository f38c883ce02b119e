"""The built-ins with trained weights (`load_model(name, weights="trained")`): what each learns, its architecture
and budget, the cached training, and its score on held-out data.

- tiny-gpt learns the Python standard library's source, byte by byte (vocab 256), and is scored by its
  perplexity on held-out modules against the unigram baseline;
- convnet learns scikit-learn's 8×8 digits (10 classes) and is scored by its top-1 on held-out images.

Other config keys (layers, width, seed, ...) may be set: each config is trained once and cached. The example
inputs of a trained model are held-out data (text windows, digit images), so a benchmark's numerics compare
variants on inputs like those the model learned from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from workbench.errors import WorkbenchError
from workbench.models import convnet, tiny_gpt
from workbench.models.loaded import InputMaker, LoadedModel
from workbench.models.seeding import input_generator
from workbench.models.spec import BuiltinSpec, Config, require_int
from workbench.models.trained.checkpoint import load_or_train
from workbench.models.trained.corpus import VOCAB, byte_tokens, stdlib_corpus
from workbench.models.trained.digits import CLASSES, IMAGE_SIZE, digits_split
from workbench.models.trained.evaluate import Model, held_out_windows, perplexity, top1, unigram_perplexity
from workbench.models.trained.training import Budget, train_classifier, train_language_model


@dataclass(frozen=True)
class Recipe:
    """How one built-in is trained: its architecture over the built-in's defaults, the keys its data fixes,
    the default budget, and the loader that trains (or loads the cached weights of) a full config."""

    config: Mapping[str, Any]
    fixed: Mapping[str, Any]
    budget: Budget
    load: Callable[[Config, Budget], LoadedModel]
    score: Callable[[Config, Model], float]


def _steps(budget: Budget) -> str:
    return f"{budget.steps:,} step{'s' if budget.steps != 1 else ''}"


EVAL_SEQ = 128
"""Tokens of context a tiny-gpt's held-out perplexity is measured with (max_seq when that is shorter)."""


def _eval_windows(config: Config) -> torch.Tensor:
    return held_out_windows(byte_tokens(stdlib_corpus().held_out), min(EVAL_SEQ, config["max_seq"]))


def tiny_gpt_score(config: Config, model: Model) -> float:
    """Held-out perplexity of `model` (a tiny-gpt of `config`, any copy of it, or its forward) on the stdlib's
    held-out text."""
    return perplexity(model, _eval_windows(config))


def _held_out_text_inputs(config: Config, tokens: torch.Tensor) -> InputMaker:
    """Example inputs of a trained tiny-gpt: `batch` windows of held-out text at seeded offsets."""

    def make(batch: int, seq: int | None) -> tuple[torch.Tensor]:
        assert seq is not None  # LoadedModel resolves the default before calling
        if not 1 <= seq <= config["max_seq"]:
            raise WorkbenchError(f"tiny-gpt: seq must be in 1..{config['max_seq']} (max_seq), got {seq}")
        starts = torch.randint(0, len(tokens) - seq, (batch, 1), generator=input_generator(config["seed"]))
        return (tokens[starts + torch.arange(seq)],)

    return make


def load_tiny_gpt(config: Config, budget: Budget) -> LoadedModel:
    """tiny-gpt of `config` trained on the stdlib corpus with `budget` (cached)."""
    corpus = stdlib_corpus()
    budget = replace(budget, seq=min(budget.seq or config["max_seq"], config["max_seq"]))
    windows = _eval_windows(config)
    module = tiny_gpt.build(config)  # checks the config before anything is trained

    def train() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tokens = byte_tokens(corpus.train)
        start = time.perf_counter()
        train_language_model(module, tokens, budget, config["seed"])
        return module.state_dict(), {
            "train_seconds": time.perf_counter() - start, "torch": torch.__version__,
            "metric": "held-out perplexity", "value": perplexity(module, windows),
            "baseline": {"name": "unigram perplexity", "value": unigram_perplexity(tokens, windows, VOCAB)}}

    key = {"config": dict(config), "budget": budget.to_dict(), "data": corpus.digest}
    state, meta = load_or_train("tiny-gpt", key, train)
    module.load_state_dict(state)
    description = (f"trained on {corpus.describe()} ({len(corpus.train) / 1e6:.1f} MB, seed {config['seed']}, "
                   f"{_steps(budget)}), held-out perplexity {meta['value']:.2f} "
                   f"(unigram {meta['baseline']['value']:.2f})")
    return _loaded("tiny-gpt", module, config, _held_out_text_inputs(config, byte_tokens(corpus.held_out)),
                   tiny_gpt.SPEC,
                   {**meta, "description": description, "data": corpus.facts(), "budget": budget.to_dict(),
                    "seed": config["seed"]})


def convnet_score(config: Config, model: Model) -> float:
    """Held-out top-1 of `model` (a convnet of `config`, any copy of it, or its forward) on the held-out digits."""
    digits = digits_split()
    return top1(model, digits.held_out_images, digits.held_out_labels)


def load_convnet(config: Config, budget: Budget) -> LoadedModel:
    """convnet of `config` trained on scikit-learn's digits with `budget` (cached)."""
    digits = digits_split()
    module = convnet.build(config)  # checks the config before anything is trained

    def train() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        start = time.perf_counter()
        train_classifier(module, digits.train_images, digits.train_labels, budget, config["seed"])
        return module.state_dict(), {
            "train_seconds": time.perf_counter() - start, "torch": torch.__version__,
            "metric": "held-out top-1", "value": top1(module, digits.held_out_images, digits.held_out_labels)}

    key = {"config": dict(config), "budget": budget.to_dict(), "data": digits.digest}
    state, meta = load_or_train("convnet", key, train)
    module.load_state_dict(state)
    images = digits.held_out_images

    def make_inputs(batch: int, seq: int | None) -> tuple[torch.Tensor]:
        return (images[torch.arange(batch) % len(images)],)

    description = (f"trained on scikit-learn load_digits ({len(digits.train_labels):,} train / "
                   f"{len(digits.held_out_labels):,} held out, seed {config['seed']}, {_steps(budget)}), "
                   f"held-out top-1 {meta['value']:.3f}")
    return _loaded("convnet", module, config, make_inputs, convnet.SPEC,
                   {**meta, "description": description, "data": digits.facts(), "budget": budget.to_dict(),
                    "seed": config["seed"]})


def _loaded(name: str, module: nn.Module, config: Config, make_inputs: InputMaker, spec: BuiltinSpec,
            training: dict[str, Any]) -> LoadedModel:
    return LoadedModel(name=name, module=module.eval(), config=dict(config), source="builtin",
                       input_maker=make_inputs, default_seq=spec.default_seq(config), weights="trained",
                       training=training)


TINY_GPT = Recipe(
    config={"vocab": VOCAB, "layers": 2, "d_model": 128, "heads": 4, "max_seq": 256},
    fixed={"vocab": VOCAB},
    budget=Budget(steps=1000, batch=16, seq=128, lr=3e-3, warmup=50),
    load=load_tiny_gpt,
    score=tiny_gpt_score,
)
"""2M training tokens: about 1.5 to 2 minutes on one core of a shared 2-core machine."""

CONVNET = Recipe(
    config={"width": 16, "stages": 2, "num_classes": CLASSES, "image_size": IMAGE_SIZE},
    fixed={"num_classes": CLASSES, "image_size": IMAGE_SIZE},
    budget=Budget(steps=300, batch=64, lr=3e-3, warmup=15),
    load=load_convnet,
    score=convnet_score,
)
"""A few seconds on one core."""

RECIPES: dict[str, Recipe] = {"tiny-gpt": TINY_GPT, "convnet": CONVNET}
"""The built-ins that have trained weights."""


def trained_config(spec: BuiltinSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The full config of `spec` with trained weights: its defaults, the recipe's architecture, then `overrides`
    (which may not change what the data fixes)."""
    recipe = RECIPES.get(spec.name)
    if recipe is None:
        raise WorkbenchError(f"model '{spec.name}' has no trained weights (built-ins with trained weights: "
                             f"{', '.join(sorted(RECIPES))}); use weights=random")
    config = {**spec.defaults, **recipe.config, **overrides}
    require_int(spec.name, config, "seed", minimum=0)
    for key, value in recipe.fixed.items():
        if config[key] != value:
            raise WorkbenchError(f"{spec.name}: trained weights have {key}={value} (the data fixes it), got "
                                 f"{config[key]!r}")
    return config


def load_trained(spec: BuiltinSpec, overrides: Mapping[str, Any], budget: Budget | None = None) -> LoadedModel:
    """Built-in `spec` with trained weights for `overrides` (see `trained_config`), trained with `budget`
    (default: the recipe's) or loaded from the cache."""
    config = trained_config(spec, overrides)
    recipe = RECIPES[spec.name]
    return recipe.load(config, budget or recipe.budget)


def held_out_score(name: str, config: Config, model: Model) -> float:
    """The held-out metric of built-in `name` (tiny-gpt: perplexity, lower is better; convnet: top-1, higher is
    better) for `model`, a model of `config`, any copy of it (quantized, compiled) or its forward function."""
    if name not in RECIPES:
        raise WorkbenchError(f"model '{name}' has no held-out data (trained built-ins: {', '.join(sorted(RECIPES))})")
    return RECIPES[name].score(config, model)
