"""Hugging Face `transformers` models as LoadedModels: `hf:<id or folder>` (real weights, local only) and
`hf-config:<preset>` (a real architecture from `hf_presets`, seeded random weights).

The LoadedModel's module is an `HFModule`: a plain nn.Module whose forward takes the example inputs as
positional tensors and returns one tensor (logits, or the last hidden state of a bare encoder), so every
backend (eager, autocast, compile, torchao, torch.export, ONNX) runs it like a built-in. The transformers
model itself stays reachable as `LoadedModel.hf_model` (and `module.hf_model`) for generation.

What an architecture computes decides its inputs (`TASKS`): token ids for language models (with an
attention mask for BERT-like encoders), pixel values at the config's image size for image classifiers,
log-mel features (mel bins × 2·max_source_positions frames) and decoder token ids for Whisper. Both kinds
are refused before any weight is made or read when their fp32 weights would not fit in memory (`memory`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from workbench.errors import WorkbenchError
from workbench.models import hf_presets
from workbench.models.extra import require
from workbench.models.hf_local import hf_config_from, is_folder_ref, local_name, read_local
from workbench.models.loaded import LoadedModel, Source, Weights
from workbench.models.memory import check_fits, meta_parameter_count
from workbench.models.seeding import input_generator, seeded_global_rng

HF_PREFIX = "hf:"
CONFIG_PREFIX = "hf-config:"
DEFAULT_SEQ = 128
DEFAULT_DECODER_SEQ = 64

InputMaker = Callable[[Any, int, int | None, torch.Generator], tuple[torch.Tensor, ...]]


def _max_positions(config: Any) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_target_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def _token_ids(config: Any, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    limit = _max_positions(config)
    if limit is not None and seq > limit:
        raise WorkbenchError(f"seq {seq} is longer than the model's {limit} positions")
    return torch.randint(0, config.vocab_size, (batch, seq), generator=gen)


def _decoder_ids(config: Any, batch: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    ids = _token_ids(config, batch, seq, gen)
    start = getattr(config, "decoder_start_token_id", None)
    if isinstance(start, int):
        ids[:, 0] = start
    return ids


def _lm_inputs(config: Any, batch: int, seq: int | None, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    return (_token_ids(config, batch, int(seq or DEFAULT_SEQ), gen),)


def _encoder_inputs(config: Any, batch: int, seq: int | None, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    ids = _token_ids(config, batch, int(seq or DEFAULT_SEQ), gen)
    return ids, torch.ones_like(ids)


def _image_inputs(config: Any, batch: int, seq: int | None, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    size = config.image_size
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return (torch.randn(batch, getattr(config, "num_channels", 3), height, width, generator=gen),)


def _speech_inputs(config: Any, batch: int, seq: int | None, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    frames = 2 * config.max_source_positions  # the encoder's two convolutions halve the frames
    features = torch.randn(batch, config.num_mel_bins, frames, generator=gen)
    return features, _decoder_ids(config, batch, int(seq or DEFAULT_DECODER_SEQ), gen)


def _seq2seq_inputs(config: Any, batch: int, seq: int | None, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    seq = int(seq or DEFAULT_SEQ)
    return _token_ids(config, batch, seq, gen), _decoder_ids(config, batch, seq, gen)


@dataclass(frozen=True)
class Task:
    """What a family of architectures computes: its transformers Auto class, the inputs forward takes
    (names, in order, and how to make them), the output returned and whether inputs have a sequence axis."""

    auto_class: str
    inputs: tuple[str, ...]
    make_inputs: InputMaker
    output: str = "logits"
    default_seq: int | None = DEFAULT_SEQ
    call_kwargs: Mapping[str, Any] = field(default_factory=dict)


TASKS: dict[str, Task] = {
    "causal-lm": Task("AutoModelForCausalLM", ("input_ids",), _lm_inputs, call_kwargs={"use_cache": False}),
    "masked-lm": Task("AutoModelForMaskedLM", ("input_ids", "attention_mask"), _encoder_inputs),
    "image-classification": Task("AutoModelForImageClassification", ("pixel_values",), _image_inputs,
                                 default_seq=None),
    "speech-seq2seq": Task("AutoModelForSpeechSeq2Seq", ("input_features", "decoder_input_ids"), _speech_inputs,
                           default_seq=DEFAULT_DECODER_SEQ, call_kwargs={"use_cache": False}),
    "seq2seq-lm": Task("AutoModelForSeq2SeqLM", ("input_ids", "decoder_input_ids"), _seq2seq_inputs,
                       call_kwargs={"use_cache": False}),
    "text-encoder": Task("AutoModel", ("input_ids", "attention_mask"), _encoder_inputs, output="last_hidden_state"),
}

_ARCHITECTURE_SUFFIXES = (("ForCausalLM", "causal-lm"), ("LMHeadModel", "causal-lm"), ("ForMaskedLM", "masked-lm"),
                          ("ForImageClassification", "image-classification"))


def task_of(config: Any) -> str:
    """The task of a real config, from its first architecture (a bare text model: text-encoder)."""
    architecture = (getattr(config, "architectures", None) or [""])[0]
    for suffix, task in _ARCHITECTURE_SUFFIXES:
        if architecture.endswith(suffix):
            return task
    if architecture.endswith("ForConditionalGeneration") and getattr(config, "is_encoder_decoder", False):
        return "speech-seq2seq" if hasattr(config, "num_mel_bins") else "seq2seq-lm"
    if isinstance(getattr(config, "vocab_size", None), int):
        return "text-encoder"
    if getattr(config, "image_size", None):
        return "image-classification"
    raise WorkbenchError(f"cannot tell what inputs architecture {architecture or config.model_type!r} takes; "
                         f"supported: {', '.join(sorted(TASKS))}")


def _auto_class(task: Task) -> Any:
    return getattr(require("transformers"), task.auto_class)


class HFModule(nn.Module):
    """A transformers model behind a plain tensors-in, tensor-out forward (module docstring)."""

    def __init__(self, hf_model: nn.Module, task: Task) -> None:
        super().__init__()
        self.hf_model = hf_model
        self.input_names = task.inputs
        self.output = task.output
        self.call_kwargs = dict(task.call_kwargs)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        outputs = self.hf_model(**dict(zip(self.input_names, inputs, strict=True)), **self.call_kwargs,
                                return_dict=True)
        return outputs[self.output]


def _loaded(name: str, model: nn.Module, config: Any, task: Task, info: dict[str, Any], source: Source,
            weights: Weights, seed: int) -> LoadedModel:
    model = model.to(device="cpu", dtype=torch.float32).eval()
    make = task.make_inputs
    return LoadedModel(
        name=name, module=HFModule(model, task), config=info, source=source,
        input_maker=lambda batch, seq: make(config, batch, seq, input_generator(seed)),
        default_seq=task.default_seq, weights=weights, hf_model=model,
    )


def _split_seed(ref: str, overrides: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    rest = dict(overrides)
    seed = rest.pop("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise WorkbenchError(f"{ref}: seed must be an integer >= 0, got {seed!r}")
    return seed, rest


def load_hf_config(ref: str, overrides: Mapping[str, Any]) -> LoadedModel:
    """`hf-config:<preset>`: the preset's architecture (scaled by the friendly `overrides`; `seed` picks the
    weights) with seeded random weights, refused before it is built when it would not fit in memory."""
    name = ref.removeprefix(CONFIG_PREFIX)
    seed, scaling = _split_seed(ref, overrides)
    preset = hf_presets.preset(name)
    config = hf_presets.preset_config(name, scaling)
    task = TASKS[preset.task]
    auto = _auto_class(task)
    check_fits(ref, meta_parameter_count(ref, lambda: auto.from_config(config)))
    with seeded_global_rng(seed):
        model = auto.from_config(config)
    friendly = {key: value for key in sorted(preset.keys)
                if (value := getattr(config, preset.keys[key][0], None)) is not None}
    info = {"preset": name, "architecture": type(model).__name__, **friendly, "seed": seed}
    return _loaded(ref, model, config, task, info, "hf-config", "random", seed)


def load_hf(ref: str, overrides: Mapping[str, Any]) -> LoadedModel:
    """`hf:<id or folder>`: the model with its weights, from a local folder or the local HF cache only (no
    network); refused before its weights are read when they would not fit in memory. Takes only `seed`
    (for its example inputs) as an override."""
    seed, rest = _split_seed(ref, overrides)
    if rest:
        raise WorkbenchError(f"{ref}: a Hugging Face checkpoint is loaded as it is; it takes no config keys "
                             f"({', '.join(sorted(rest))}); hf-config:<preset> --set ... scales an architecture")
    name = local_name(ref)
    config = hf_config_from(name)
    task = TASKS[task_of(config)]
    auto = _auto_class(task)
    try:
        parameters = meta_parameter_count(ref, lambda: auto.from_config(config))
    except ValueError as exc:  # the Auto class has no model for this config
        raise WorkbenchError(f"{ref}: cannot build a {task.auto_class} from its config: {exc}") from exc
    check_fits(ref, parameters)
    model = read_local(name, lambda: auto.from_pretrained(name, local_files_only=True, dtype=torch.float32))
    folder = is_folder_ref(ref)
    where = {"path": str(Path(name).resolve())} if folder else {"id": name}
    info = {**where, "architecture": type(model).__name__, "model_type": config.model_type, "seed": seed}
    return _loaded(f"hf:{Path(name).name}" if folder else f"hf:{name}", model, config, task, info, "hf", "real", seed)
