"""Trained built-ins (`workbench.models.trained`): the stdlib text and its split, reproducible training, the
on-disk cache (reused, retrained when corrupt, trained once under concurrency), held-out scores against
baselines computed here from the raw data, and `load_model(..., weights="trained")`.

Budgets here are tiny (a second or so each); the recipes' own budgets are what `make demo` uses."""

from __future__ import annotations

import copy
import json
import math
import sysconfig
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from workbench.cache import CACHE_ENV
from workbench.errors import WorkbenchError
from workbench.models import load_model
from workbench.models.registry import BUILTINS
from workbench.models.trained import checkpoint, corpus, recipes
from workbench.models.trained.checkpoint import CheckpointWarning, checkpoint_path, load_or_train
from workbench.models.trained.digits import digits_split
from workbench.models.trained.training import Budget

SMALL_GPT = {"layers": 1, "d_model": 32, "heads": 2, "max_seq": 64}
GPT_BUDGET = Budget(steps=150, batch=8, seq=32, lr=1e-2, warmup=5)
CNN_BUDGET = Budget(steps=100, batch=32, lr=3e-3, warmup=5)


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty workbench cache folder for each test."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def small_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's recipes with this file's small budgets."""
    monkeypatch.setitem(recipes.RECIPES, "tiny-gpt", replace(recipes.TINY_GPT, budget=GPT_BUDGET))
    monkeypatch.setitem(recipes.RECIPES, "convnet", replace(recipes.CONVNET, budget=CNN_BUDGET))


def _trained_gpt(seed: int = 0):
    return recipes.load_trained(BUILTINS["tiny-gpt"], {**SMALL_GPT, "seed": seed}, GPT_BUDGET)


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _stdlib_file(name: str) -> bytes:
    return (Path(sysconfig.get_paths()["stdlib"]) / f"{name}.py").read_bytes()


def test_held_out_text_is_never_in_the_training_text():
    text = corpus.stdlib_corpus()
    assert not set(text.train_files) & set(text.held_out_files)
    for name in text.held_out_files:
        source = _stdlib_file(name)
        assert source in text.held_out
        assert source not in text.train, name
    for name in text.train_files:
        assert _stdlib_file(name) in text.train
    read = [*text.train_files, *text.held_out_files]
    assert len(text.train) + len(text.held_out) == (sum(len(_stdlib_file(n)) for n in read)
                                                     + 2 * (len(read) - 2))  # blank lines between files


def test_perplexity_windows_are_held_out_text():
    text = corpus.stdlib_corpus()
    windows = recipes._eval_windows({"max_seq": 64})
    assert windows.shape == (64, 65)
    for window in windows:
        assert bytes(window.tolist()) in text.held_out


def test_training_is_bit_identical_and_seeded(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    first = _trained_gpt()
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "other-cache"))  # nothing cached: trains again
    again = _trained_gpt()
    other_seed = _trained_gpt(seed=1)
    assert _same_state(first.module, again.module)
    assert not _same_state(first.module, other_seed.module)
    assert first.training["value"] == again.training["value"]


def test_small_budget_beats_the_unigram_baseline():
    loaded = _trained_gpt()
    text = corpus.stdlib_corpus()
    counts = Counter(text.train)
    total = len(text.train) + 256  # add-one smoothing over the 256 byte values
    windows = recipes._eval_windows(loaded.config)
    targets = [byte for window in windows.tolist() for byte in window[1:]]
    unigram = math.exp(-sum(math.log((counts[b] + 1) / total) for b in targets) / len(targets))
    training = loaded.training
    assert training["baseline"]["value"] == pytest.approx(unigram, rel=1e-9)
    assert training["value"] < 0.9 * unigram
    assert recipes.held_out_score("tiny-gpt", loaded.config, loaded.module) == pytest.approx(training["value"])
    assert training["description"] == (
        f"trained on the Python {text.python} standard library source ({len(text.train) / 1e6:.1f} MB, seed 0, "
        f"150 steps), held-out perplexity {training['value']:.2f} (unigram {unigram:.2f})")


def test_the_cache_is_reused_without_training(monkeypatch: pytest.MonkeyPatch):
    first = _trained_gpt()
    path = checkpoint_path("tiny-gpt", {"config": first.config, "budget": GPT_BUDGET.to_dict(),
                                        "data": corpus.stdlib_corpus().digest})
    stamp = path.stat().st_mtime_ns

    def no_training(*args, **kwargs):
        raise AssertionError("trained again although the checkpoint is cached")

    monkeypatch.setattr(recipes, "train_language_model", no_training)
    second = _trained_gpt()
    assert _same_state(first.module, second.module)
    assert second.training == first.training
    assert path.stat().st_mtime_ns == stamp


def test_a_corrupt_checkpoint_is_trained_again_with_a_warning(cache: Path):
    first = _trained_gpt()
    (path,) = (cache / checkpoint.FOLDER).glob("tiny-gpt-*.pt")
    path.write_bytes(path.read_bytes()[:1000])  # truncated, as by a full disk
    with pytest.warns(CheckpointWarning, match="training again"):
        second = _trained_gpt()
    assert _same_state(first.module, second.module)
    path.write_bytes(b"not a checkpoint")
    with pytest.warns(CheckpointWarning):
        _trained_gpt()
    assert not list(path.parent.glob(".tmp-*"))
    torch.load(path, weights_only=True)  # whole again


def test_two_callers_at_once_train_once():
    calls: list[int] = []

    def train():
        calls.append(1)
        time.sleep(0.3)
        return {"w": torch.ones(2)}, {"value": 1.0}

    results = []
    threads = [threading.Thread(target=lambda: results.append(load_or_train("probe", {"k": 1}, train)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert [meta for _, meta in results] == [{"value": 1.0}] * 2
    assert all(torch.equal(state["w"], torch.ones(2)) for state, _ in results)


def test_digits_convnet_reaches_ninety_percent_top1():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    loaded = recipes.load_trained(BUILTINS["convnet"], {}, CNN_BUDGET)
    pixels, labels = load_digits(return_X_y=True)
    digits = digits_split()
    assert (len(digits.train_labels), len(digits.held_out_labels)) == (len(labels) - 360, 360)
    split = [(tuple(image[0].flatten().mul(16).round().tolist()), int(label)) for images, labels_ in
             ((digits.train_images, digits.train_labels), (digits.held_out_images, digits.held_out_labels))
             for image, label in zip(images, labels_, strict=True)]
    assert sorted(split) == sorted((tuple(row.tolist()), int(label)) for row, label in zip(pixels, labels, strict=True))
    with torch.no_grad():
        predicted = loaded.module(digits.held_out_images).argmax(dim=1)
    accuracy = (predicted == digits.held_out_labels).double().mean().item()
    assert accuracy >= 0.9
    assert loaded.training["value"] == pytest.approx(accuracy)
    assert loaded.training["description"].endswith(f"held-out top-1 {accuracy:.3f}")
    assert "1,437 train / 360 held out" in loaded.training["description"]


@pytest.mark.usefixtures("small_recipes")
def test_load_model_weights_trained_tiny_gpt_takes_held_out_text():
    gpt = load_model("tiny-gpt", weights="trained", **SMALL_GPT)
    assert (gpt.weights, gpt.source, gpt.config["vocab"]) == ("trained", "builtin", 256)
    assert gpt.training["description"].startswith("trained on the Python 3.")
    (tokens,) = gpt.make_inputs(3, 16)
    held_out = corpus.stdlib_corpus().held_out
    assert tokens.shape == (3, 16) and all(bytes(row.tolist()) in held_out for row in tokens)
    assert load_model("tiny-gpt", **SMALL_GPT).weights == "random"  # the default stays seeded random weights


@pytest.mark.usefixtures("small_recipes")
def test_load_model_weights_trained_convnet_takes_held_out_digits():
    pytest.importorskip("sklearn")
    cnn = load_model("convnet", weights="trained")
    assert (cnn.weights, cnn.config["num_classes"], cnn.config["image_size"]) == ("trained", 10, 8)
    (images,) = cnn.make_inputs(5)
    assert torch.equal(images, digits_split().held_out_images[:5])
    assert cnn.module(images).shape == (5, 10)


@pytest.mark.parametrize(("ref", "overrides", "message"), [
    ("tiny-gpt", {"weights": "pretrained"}, "weights must be 'random' or 'trained'"),
    ("mlp", {"weights": "trained"}, "has no trained weights"),
    ("tiny-gpt", {"weights": "trained", "vocab": 1024}, "vocab=256"),
    ("convnet", {"weights": "trained", "image_size": 64}, "image_size=8"),
    ("tiny-gpt", {"weights": "trained", "depth": 2}, "no config key"),
    ("tiny-gpt", {"weights": "trained", "d_model": 30}, "not divisible by heads"),
    ("tiny-gpt", {"weights": "trained", "seed": -1}, "seed must be an integer"),
])
def test_bad_trained_requests_are_refused_before_training(ref, overrides, message, cache: Path):
    with pytest.raises(WorkbenchError, match=message):
        load_model(ref, **overrides)
    assert not (cache / checkpoint.FOLDER).exists()


def test_held_out_scores_take_any_copy_of_the_model():
    loaded = _trained_gpt()
    fp32 = recipes.held_out_score("tiny-gpt", loaded.config, loaded.module)
    assert recipes.held_out_score("tiny-gpt", loaded.config, lambda tokens: loaded.module(tokens)) == fp32
    bf16 = recipes.held_out_score("tiny-gpt", loaded.config, copy.deepcopy(loaded.module).to(torch.bfloat16))
    assert bf16 == pytest.approx(fp32, rel=0.05)
    inverted = copy.deepcopy(loaded.module)
    with torch.no_grad():
        inverted.lm_head.weight.mul_(-1.0)  # predicts what it learned is least likely
    assert recipes.held_out_score("tiny-gpt", loaded.config, inverted) > 2 * fp32
    with pytest.raises(WorkbenchError, match="no held-out data"):
        recipes.held_out_score("mlp", {}, loaded.module)


@pytest.mark.usefixtures("small_recipes")
def test_a_capture_of_trained_weights_says_what_they_learned(tmp_path: Path):
    from click.testing import CliRunner

    from workbench.cli import main
    from workbench.trace.store.bundle import open_bundle

    root = tmp_path / "traces"
    result = CliRunner().invoke(main, ["capture", "--model", "convnet", "--set", "weights=trained", "--variants",
                                       "eager", "--batch", "2", "--iterations", "2", "--warmup", "1", "--no-profile",
                                       "--out", str(root), "--json"])
    assert result.exit_code == 0, result.output
    (run,) = json.loads(result.stdout)["runs"]
    description = load_model("convnet", weights="trained").training["description"]
    assert run["weights"] == "trained" and run["training"] == description
    assert description.startswith("trained on scikit-learn load_digits")
    assert open_bundle(run["run_id"], root).record.model_training == description
    shown = CliRunner().invoke(main, ["show", run["run_id"], "--out", str(root)])
    assert shown.exit_code == 0 and description in shown.stdout.replace("\n", " ")
