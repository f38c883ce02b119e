"""The body of `POST jobs` as `workbench capture` options, checked as the CLI checks them before it runs.

    {"model": "mlp", "variants": ["eager", "int8"], "batch": 2, "iterations": 10, "profile": false,
     "overrides": {"hidden": 64}}   ->   --model mlp --variants eager,int8 --batch 2 --iterations 10
                                         --no-profile --set hidden=64
    {"model": "mlp", "batch": [1, 8, 32]}   ->   --model mlp --batch 1,8,32   (a sweep, as the CLI's)

Keys are the capture command's parameter names, one per setting (`capture_fields`, derived from the
settings dataclasses); where the server decides (traces root, output format, report file) there is no key,
and any other key is refused. `model` is required (an empty body is no request for the CLI's default
capture). Values keep their JSON types: an integer option takes a JSON integer (a sweepable size, `batch` or
`seq`, also a list of distinct ones: a sweep), a flag `true`/`false`,
`null` leaves the CLI's default. Numbers are bounded by `workbench.limits`; the model must pass the server's
`ModelPolicy`; the settings they make must pass the checks a capture makes before it runs (the settings'
own, known variants, a device name, a usable profiler), and more, since a job's failures would be written as
failed runs: the device must exist on this machine (`check_device`), and no string value (the model's name
among them) may start with `-`, which the CLI would read as an option.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from workbench.errors import WorkbenchError
from workbench.limits import check_limits
from workbench.models.registry import list_models
from workbench.server.capture_fields import PROFILE_FIELD, CaptureField, capture_fields
from workbench.server.model_policy import ModelPolicy

MAX_WORD = 4096
"""Longest string option (model, device, variants): far above any real one, far below the OS's limit
on one command-line argument (128 KiB on Linux)."""


class CaptureRequestError(WorkbenchError):
    """A `POST jobs` body that does not describe a capture; the message names the key and the problem."""


def capture_args(body: Any, policy: ModelPolicy | None = None) -> list[str]:
    """The `workbench capture` arguments `body` asks for (a JSON object), validated as the CLI would, within
    `workbench.limits`, with a model `policy` allows (default: built-in models only). Raises
    CaptureRequestError, LimitError or ModelRefused. Imports torch (the settings' checks need it)."""
    fields = {field.key: field for field in capture_fields()}
    if not isinstance(body, Mapping):
        raise CaptureRequestError(f"the body must be a JSON object of capture options ({', '.join(fields)})")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise CaptureRequestError(f"unknown capture option(s) {', '.join(map(repr, unknown))}; "
                                  f"valid: {', '.join(fields)}")
    model = body.get("model")
    if model is None:
        raise CaptureRequestError(f"model: required (a built-in model: {', '.join(list_models())})")
    if not isinstance(model, str) or not _is_word(model) or model.startswith("-"):
        raise CaptureRequestError(f"model: expected a model name (never starting with '-'), got {model!r:.200}")
    model = (policy or ModelPolicy()).checked_model(model)
    args: list[str] = []
    values: dict[str, Any] = {}
    for key, value in body.items():
        if value is None:
            continue
        field = fields[key]
        if key == "overrides":
            args += _set_args(value)
        elif key == "variants" and isinstance(value, list):
            args += _option_args(field, _joined_variants(value))
        elif field.sweep and isinstance(value, list):
            args += [field.flag, _joined_sizes(field, value)]
            value = tuple(value)
        else:
            args += _option_args(field, model if key == "model" else value)
        values[key] = _variant_names(value) if key == "variants" else value
    check_limits({key: max(value) if fields[key].sweep and isinstance(value, tuple) else value  # a sweep's largest
                  for key, value in values.items()})
    _check_settings({**values, "model": model})
    return args


def _option_args(field: CaptureField, value: Any) -> list[str]:
    """The command-line words that give `field` the JSON `value` (not None): a boolean is a flag (`--no-<key>`
    for false where the default is true), any other value the option and its text."""
    name = field.key
    if field.type == "boolean":
        if not isinstance(value, bool):
            raise CaptureRequestError(f"{name}: expected true or false, got {value!r}")
        if value:
            return [field.flag]
        return [f"--no-{field.flag.removeprefix('--')}"] if field.default else []
    if field.type == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise CaptureRequestError(f"{name}: expected an integer, got {value!r:.200}")
        if field.minimum is not None and value < field.minimum:
            raise CaptureRequestError(f"{name} ({field.flag}): must be at least {field.minimum}, got {value!r}")
    elif not isinstance(value, str) or not _is_word(value):
        raise CaptureRequestError(f"{name}: expected a non-empty string without control characters, "
                                  f"got {value!r:.200}")
    elif value.startswith("-"):  # the CLI would read it as an option
        raise CaptureRequestError(f"{name}: a value never starts with '-', got {value!r:.200}")
    return [field.flag, str(value)]


def _check_settings(values: Mapping[str, Any]) -> None:
    """Make the settings the request's `values` describe and check them as a capture does before it runs: the
    settings' own checks, the profiler (its tool, the device it needs), each variant's name and the device's."""
    from workbench.backends import get_variant
    from workbench.experiment import ExperimentSettings
    from workbench.profiling.registry import check_profiler
    from workbench.profiling.settings import ProfileSettings
    from workbench.shapes import as_values

    top: dict[str, Any] = {}
    profile: dict[str, Any] = {}
    for field in capture_fields():
        if field.key in values:
            value = not values[field.key] if field.inverted else values[field.key]
            (profile if field.path[0] == PROFILE_FIELD else top)[field.path[-1]] = value
    try:
        settings = ExperimentSettings(**top, profile_settings=ProfileSettings(**profile))
        check_device(settings.device)
        check_profiler(settings.profiler, settings.device, settings.profile)
        for name in settings.variants:
            get_variant(name, as_values(settings.batch)[0], settings.device)
    except WorkbenchError as exc:
        raise CaptureRequestError(str(exc)) from exc


def check_device(device: str) -> None:
    """Raise CaptureRequestError unless `device` is a device of this machine: `cpu`; `cuda[:N]` with N below
    torch's CUDA device count (torch is imported here, never at the server's start); `tpu[:N]` with N below the
    TPU chips the kernel shows (`/dev/accel*`, `/dev/vfio/N`: the server never starts JAX, which would hold the
    chips a job needs). A malformed name is the error `check_device_name` words."""
    from workbench.backends.devices import check_device_name

    check_device_name(device)  # WorkbenchError naming what a device looks like
    kind, _, index_text = device.partition(":")
    if kind == "cpu":
        return
    index = int(index_text) if index_text.isdigit() else 0
    if kind == "cuda":
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    elif kind == "tpu":
        count = _tpu_chips()
    else:
        raise CaptureRequestError(f"device: {device!r} is no device this server runs captures on (cpu, cuda[:N], "
                                  "tpu[:N])")
    if index >= count:
        have = f"only {count} {kind.upper()} device(s)" if count else f"no {kind.upper()} device"
        raise CaptureRequestError(f"device: {device!r} does not exist on this server ({have}; see "
                                  "GET capture/options for its devices)")


def _tpu_chips() -> int:
    """TPU chips the kernel shows on this machine (0 when none)."""
    import glob

    return len(glob.glob("/dev/accel[0-9]*")) or len(glob.glob("/dev/vfio/[0-9]*"))


def _variant_names(value: str | list[str]) -> tuple[str, ...]:
    """Variant names from a JSON list, or from a comma-separated string as the CLI's `--variants` reads it."""
    items = value if isinstance(value, list) else value.split(",")
    return tuple(item.strip() for item in items if item.strip())


def _is_word(text: str) -> bool:
    """Whether `text` can be one command-line word as given: 1 to MAX_WORD characters, no NUL or other
    control character."""
    return 0 < len(text) <= MAX_WORD and text.isprintable()


def _joined_variants(value: list[Any]) -> str:
    """A JSON list of variant names as the CLI's comma-separated `--variants`."""
    if not value or not all(isinstance(v, str) and v and "," not in v for v in value):
        raise CaptureRequestError(f"variants: expected a non-empty list of variant names, got {value!r}")
    return ",".join(value)


def _joined_sizes(field: CaptureField, value: list[Any]) -> str:
    """A JSON list of sizes (a sweep: `"batch": [1, 8, 32]`) as the CLI's comma-separated `--batch 1,8,32`; each
    an integer of at least the field's minimum (the settings refuse repeated values, the limits large ones)."""
    if not value:
        raise CaptureRequestError(f"{field.key}: expected an integer or a non-empty list of integers, got []")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise CaptureRequestError(f"{field.key}: expected an integer or a list of integers, got {item!r:.200} "
                                      "in the list")
        if field.minimum is not None and item < field.minimum:
            raise CaptureRequestError(f"{field.key} ({field.flag}): must be at least {field.minimum}, got {item!r}")
    return ",".join(map(str, value))


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
