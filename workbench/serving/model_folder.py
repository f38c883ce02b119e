"""The model folder a serving engine loads: a user's `hf:` folder as it is, or an `hf-config:` preset (scaled with
`--set`) saved once into the cache with seeded random weights and a word-level tokenizer built in code, since
nothing can be downloaded. The same preset and settings give the same folder, so a second run starts at once.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workbench.cache import cache_dir
from workbench.errors import UnknownModelError

DEFAULT_MODEL = "hf-config:llama-3-8b"
"""What `workbench serve` serves when no model is named: Llama-3's architecture, scaled by DEFAULT_SCALE."""
DEFAULT_SCALE: Mapping[str, Any] = {"layers": 2, "hidden": 128, "heads": 4, "intermediate": 256, "vocab": 512,
                                    "max_positions": 2048}
"""A Llama small enough to serve on two CPU cores in seconds per request."""
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
"""The turns' texts one after another: enough for the chat endpoint and multi-turn loads on a random model."""
FOLDER_FORMAT = 2
"""Part of a saved folder's key: a folder saved by an earlier format (one without a chat template) is not reused."""


def model_folder(ref: str, overrides: Mapping[str, Any]) -> tuple[Path, str]:
    """The folder to serve for `ref` and the name to serve it under."""
    if ref.startswith("hf:"):
        from workbench.models.hf_local import local_name

        if overrides:
            raise UnknownModelError(f"{ref}: a model folder is served as it is; --set applies to hf-config: presets")
        folder = Path(local_name(ref)).expanduser()
        if not (folder / "config.json").is_file():
            raise UnknownModelError(f"{ref}: not a Hugging Face model folder (no config.json in {folder}); "
                                    "give hf:PATH of a save_pretrained folder, or an hf-config:<preset>")
        return folder.absolute(), folder.name
    if not ref.startswith("hf-config:"):
        raise UnknownModelError(f"{ref!r}: a serving engine loads an hf:FOLDER or an hf-config:<preset> "
                                f"(default {DEFAULT_MODEL})")
    settings = dict(DEFAULT_SCALE) if ref == DEFAULT_MODEL and not overrides else dict(overrides)
    key = hashlib.sha256(json.dumps([ref, settings, FOLDER_FORMAT], sort_keys=True).encode()).hexdigest()[:12]
    name = ref.removeprefix("hf-config:")
    folder = cache_dir() / "serving-models" / f"{name}-{key}"
    if not (folder / "config.json").is_file():
        _save(ref, settings, folder)
    return folder, name


def _save(ref: str, settings: Mapping[str, Any], folder: Path) -> None:
    """Save the preset's model and a tokenizer into `folder`, through a temporary folder renamed into place."""
    from workbench.models.hf import load_hf_config

    loaded = load_hf_config(ref, settings)
    tmp = folder.with_name(f".tmp-{folder.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        loaded.hf_model.save_pretrained(tmp)
        word_tokenizer(loaded.hf_model.config.vocab_size).save_pretrained(tmp)
        tmp.replace(folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer of `vocab_size` ids: the special tokens, then words `w0`, `w1`, ...; a word it does
    not know is `<unk>`, so any English prompt has one token per word. Its chat template joins the turns."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{i}": len(SPECIAL_TOKENS) + i for i in range(vocab_size - len(SPECIAL_TOKENS))})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="<pad>", chat_template=CHAT_TEMPLATE)
