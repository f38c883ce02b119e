"""The body of `POST jobs` as `workbench capture` options, checked by the CLI's own option parser.

    {"model": "mlp", "variants": ["eager", "int8"], "batch": 2, "iterations": 10, "profile": false,
     "overrides": {"hidden": 64}}   ->   --model mlp --variants eager,int8 --batch 2 --iterations 10
                                         --no-profile --set hidden=64

Keys are the capture command's parameter names; where the server decides (traces root, output format,
report file) the key is refused, as is any key the command lacks. `model` is required (an empty body is
no request for the CLI's default capture). Values keep their JSON types: an integer option takes a JSON
integer, a flag `true`/`false`, `null` leaves the CLI's default. Numbers are bounded by
`workbench.limits`; the model must pass the server's `ModelPolicy`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from workbench.cli import capture
from workbench.errors import WorkbenchError
from workbench.limits import check_limits
from workbench.models.registry import list_models
from workbench.server.model_policy import ModelPolicy

OPTIONS = ("model", "variants", "batch", "seq", "device", "iterations", "warmup", "threads", "profile",
           "steady_state_only", "profile_steps", "with_stack", "overrides")
"""The capture options a job may set (`overrides` is the CLI's repeated `--set KEY=VALUE`)."""
MAX_WORD = 4096
"""Longest string option (model, device, variants): far above any real one, far below the OS's limit
on one command-line argument (128 KiB on Linux)."""


class CaptureRequestError(WorkbenchError):
    """A `POST jobs` body that does not describe a capture; the message names the key and the problem."""


def capture_args(body: Any, policy: ModelPolicy | None = None) -> list[str]:
    """The `workbench capture` arguments `body` asks for (a JSON object), validated as the CLI would, within
    `workbench.limits`, with a model `policy` allows (default: built-in models only). Raises
    CaptureRequestError, LimitError or ModelRefused."""
    if not isinstance(body, Mapping):
        raise CaptureRequestError(f"the body must be a JSON object of capture options ({', '.join(OPTIONS)})")
    unknown = sorted(set(body) - set(OPTIONS))
    if unknown:
        raise CaptureRequestError(f"unknown capture option(s) {', '.join(map(repr, unknown))}; "
                                  f"valid: {', '.join(OPTIONS)}")
    model = body.get("model")
    if model is None:
        raise CaptureRequestError(f"model: required (a built-in model: {', '.join(list_models())})")
    if not isinstance(model, str) or not _is_word(model):
        raise CaptureRequestError(f"model: expected a model name, got {model!r:.200}")
    model = (policy or ModelPolicy()).checked_model(model)
    params = {param.name: param for param in capture.params if isinstance(param, click.Option)}
    args: list[str] = []
    for key, value in body.items():
        if key == "overrides":
            args += _set_args(value)
        elif key == "variants" and isinstance(value, list):
            args += _option_args(params[key], _joined_variants(value))
        else:
            args += _option_args(params[key], model if key == "model" else value)
    check_limits(body)
    try:
        with capture.make_context("capture", list(args)):
            pass
    except click.ClickException as exc:
        raise CaptureRequestError(exc.format_message()) from exc
    return args


def _option_args(param: click.Option, value: Any) -> list[str]:
    """The command-line words that give `param` the JSON `value`."""
    name = param.name
    if value is None:
        return []
    if param.is_flag:
        if not isinstance(value, bool):
            raise CaptureRequestError(f"{name}: expected true or false, got {value!r}")
        if param.secondary_opts:  # --profile/--no-profile
            return [param.opts[0] if value else param.secondary_opts[0]]
        return [param.opts[0]] if value else []
    expected = int if isinstance(param.type, click.types.IntParamType) else str
    if isinstance(value, bool) or not isinstance(value, expected) or (expected is str and not _is_word(value)):
        kind = "an integer" if expected is int else "a non-empty string without control characters"
        raise CaptureRequestError(f"{name}: expected {kind}, got {value!r:.200}")
    return [param.opts[0], str(value)]


def _is_word(text: str) -> bool:
    """Whether `text` can be one command-line word as given: 1 to MAX_WORD characters, no NUL or other
    control character."""
    return 0 < len(text) <= MAX_WORD and text.isprintable()


def _joined_variants(value: list[Any]) -> str:
    """A JSON list of variant names as the CLI's comma-separated `--variants`."""
    if not value or not all(isinstance(v, str) and v and "," not in v for v in value):
        raise CaptureRequestError(f"variants: expected a non-empty list of variant names, got {value!r}")
    return ",".join(value)


def _set_args(value: Any) -> list[str]:
    """A JSON object of model config overrides as `--set KEY=VALUE` words (values as JSON, as the CLI reads them)."""
    if not isinstance(value, Mapping):
        raise CaptureRequestError(f"overrides: expected an object of model config keys and values, got {value!r}")
    args: list[str] = []
    for key, item in value.items():
        if not _is_word(key) or "=" in key:
            raise CaptureRequestError(f"overrides: {key!r:.200} is not a model config key")
        args += ["--set", f"{key}={json.dumps(item)}"]
    return args
