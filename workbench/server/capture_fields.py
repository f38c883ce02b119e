"""The options of a capture request, derived from the settings dataclasses rather than kept by hand.

One `CaptureField` per field of `workbench.experiment.ExperimentSettings`, its `profile_settings` expanded
into the `workbench.profiling.settings.ProfileSettings` fields the capture command exposes; each is typed
from the dataclass's annotations, with the dataclass's default, bounds from `workbench.limits` and choices
from the registries. The `POST jobs` check (`capture_request`), the `GET capture/options` reply
(`capture_options`) and the panel's TypeScript type (`scripts/gen-capture-types`) all read these, so a new
setting reaches every surface at once.

A field's key is the capture command's parameter name (`REQUEST_KEYS` and `PROFILE_OPTIONS` name the ones
that differ from the settings field), its command-line option `--<key with dashes>` (`FLAGS` names the
others). The settings modules import torch, so they are imported on first use, not with the server.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from workbench.limits import SETTING_LIMITS, SETTING_MINIMUMS

REQUEST_KEYS = {"model_overrides": "overrides"}
"""Settings fields whose request key (the capture command's parameter) is another name."""
PROFILE_FIELD = "profile_settings"
"""The settings field whose own fields are request keys (those in `PROFILE_OPTIONS`)."""
PROFILE_OPTIONS = {"record_setup": ("steady_state_only", True), "active_steps": ("profile_steps", False),
                   "with_stack": ("with_stack", False)}
"""The `ProfileSettings` fields the capture command exposes: their request key, and whether the option is
the field's negation (`--steady-state-only` records no setup)."""
FLAGS = {"overrides": "--set"}
"""Command-line options not named `--<key>` (overrides are the repeated `--set KEY=VALUE`)."""


@dataclass(frozen=True)
class CaptureField:
    """One option of a capture request. `type` is its JSON type (string, integer, boolean, array of strings,
    object); `nullable` whether null is a value of its own (null always leaves the default); `path` the
    settings field it sets (`("profile_settings", "active_steps")` for a profile field); `inverted` that the
    option is the negation of that boolean field; `minimum`/`maximum` its bounds, `choices` the registered
    names it (or each of its items) must be one of; `sweep` that the integer option also takes a list of
    distinct values, a sweep (`batch`, `seq`: `--batch 1,8,32`)."""

    key: str
    type: str
    nullable: bool
    default: Any
    path: tuple[str, ...]
    inverted: bool = False
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] | None = None
    sweep: bool = False

    @property
    def flag(self) -> str:
        """The capture command's option for this field."""
        return FLAGS.get(self.key, "--" + self.key.replace("_", "-"))

    def to_json(self) -> dict[str, Any]:
        """The field as the options route describes it."""
        described = dataclasses.asdict(self)
        del described["path"], described["inverted"]
        return {**described, "flag": self.flag, "choices": list(self.choices) if self.choices is not None else None}


@functools.cache
def capture_fields() -> tuple[CaptureField, ...]:
    """Every option of a capture request, in the settings dataclass's order (registry choices excluded:
    `with_choices` adds them)."""
    from workbench.experiment import ExperimentSettings
    from workbench.profiling.settings import ProfileSettings

    found: list[CaptureField] = []
    for field, hint, default in _described(ExperimentSettings):
        if field.name == PROFILE_FIELD:
            for inner, inner_hint, inner_default in _described(ProfileSettings):
                if inner.name in PROFILE_OPTIONS:
                    key, inverted = PROFILE_OPTIONS[inner.name]
                    found.append(_field(key, inner_hint, not inner_default if inverted else inner_default,
                                        (field.name, inner.name), inverted))
        else:
            found.append(_field(REQUEST_KEYS.get(field.name, field.name), hint, default, (field.name,), False))
    return tuple(found)


def with_choices(fields: Sequence[CaptureField]) -> list[CaptureField]:
    """`fields` with the registries' names as choices: variants for `variants`, profilers for `profiler`."""
    from workbench.backends import list_variants
    from workbench.profiling.registry import profilers

    registered = {"variants": tuple(list_variants()), "profiler": tuple(profilers())}
    return [dataclasses.replace(f, choices=registered[f.key]) if f.key in registered else f for f in fields]


def capture_options() -> dict[str, Any]:
    """The reply of `GET capture/options`: the fields (`CaptureField.to_json`, with choices), the variants
    with their backend and description, the profilers with what they need, the devices this machine has
    and the models a picker offers (`models`: built-ins, `hf-config:` presets, common torchvision/timm models;
    `builtin_models`: the built-ins alone), for a client to build its capture form from."""
    from workbench.backends import available_devices, get_variant, list_variants
    from workbench.models.registry import list_models, model_choices
    from workbench.profiling.registry import get_profiler, profilers

    variants = [get_variant(name) for name in list_variants()]
    return {
        "fields": [f.to_json() for f in with_choices(capture_fields())],
        "variants": [{"name": v.name, "backend": v.backend, "description": v.description} for v in variants],
        "profilers": [{"name": spec.name, "description": spec.description, "tool": spec.tool,
                       "needs_cuda": spec.needs_cuda} for spec in map(get_profiler, profilers())],
        "devices": available_devices(),
        "models": model_choices(),
        "builtin_models": list_models(),
    }


def _described(cls: type) -> list[tuple[dataclasses.Field, Any, Any]]:
    """Each field of dataclass `cls` with its resolved type and its default."""
    hints = typing.get_type_hints(cls)
    described = []
    for field in dataclasses.fields(cls):
        if field.default is not dataclasses.MISSING:
            default = field.default
        elif field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        else:
            default = None
        described.append((field, hints[field.name], default))
    return described


def _field(key: str, hint: Any, default: Any, path: tuple[str, ...], inverted: bool) -> CaptureField:
    json_type, nullable = json_type_of(hint)
    sweep = is_sweep(hint)
    if isinstance(default, tuple):
        default = list(default)
    elif isinstance(default, Mapping):
        default = dict(default)
    return CaptureField(key=key, type=json_type, nullable=nullable, default=default, path=path, inverted=inverted,
                        minimum=SETTING_MINIMUMS.get(key), maximum=SETTING_LIMITS.get(key), sweep=sweep)


def is_sweep(hint: Any) -> bool:
    """Whether a settings annotation is a sweepable size, `int | tuple[int, ...]` (optionally `| None`): one
    value, or several that make a sweep."""
    if typing.get_origin(hint) not in (typing.Union, types.UnionType):
        return False
    inner = [a for a in typing.get_args(hint) if a is not type(None)]
    return len(inner) == 2 and inner[0] is int and inner[1] == tuple[int, ...]


def json_type_of(hint: Any) -> tuple[str, bool]:
    """The JSON type of a settings annotation and whether it admits None: `int | None` -> ("integer", True),
    `tuple[str, ...]` -> ("array", False). A sweepable size, `int | tuple[int, ...]` (`ExperimentSettings.batch`),
    is "integer": its field is marked `sweep` (`is_sweep`), and a request gives one value or a list of them. An
    annotation with no JSON form raises TypeError, so a new setting of such a type is noticed here rather than
    sent as something else."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 2 and tuple[inner[0], ...] == inner[1]:  # a size or a sweep of sizes (`is_sweep`)
            inner = inner[:1]
        if len(inner) == 1:
            return json_type_of(inner[0])[0], type(None) in args
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if hint in simple:
        return simple[hint], False
    if origin in (tuple, list) and args and args[0] is str and (len(args) == 1 or args[1:] == (Ellipsis,)):
        return "array", False
    if origin in (dict, Mapping) and args and args[0] is str:
        return "object", False
    raise TypeError(f"a setting of type {hint!r} has no JSON form for capture requests")
