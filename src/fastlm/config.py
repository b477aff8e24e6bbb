"""Typed, validated parameters: parse a Kedro parameter dict once, at node entry.

Every problem becomes one ``ConfigError`` line naming the parameter, the value, what is wrong and
where to fix it; a misspelled key is refused with a "did you mean" suggestion instead of being
silently ignored. Kedro-free: the engine uses it too.
"""

from __future__ import annotations

import difflib
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from fastlm.errors import ConfigError

Model = TypeVar("Model", bound="Params")


class Params(BaseModel):
    """Base for parameter groups: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def _known_keys(model: type[BaseModel], loc: tuple) -> list[str]:
    """Field names at ``loc``'s parent, following nested models, for "did you mean" hints."""
    current: Any = model
    for part in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(part)
        annotation = getattr(field, "annotation", None)
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return []
        current = annotation
    return list(getattr(current, "model_fields", {}))


def parse_params(model: type[Model], raw: Any, *, prefix: str, source: str) -> Model:
    """Validate ``raw`` (the ``params:<prefix>`` dict) into ``model`` or raise one ConfigError line."""
    if raw is None:
        raw = {}
    if isinstance(raw, Params):
        return raw  # already validated
    if not isinstance(raw, dict):
        raise ConfigError(
            f"parameter {prefix} must be a mapping, got {type(raw).__name__}.",
            fix=f"check {source}.",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(str(part) for part in first["loc"])
        name = ".".join((prefix, *loc))
        if first["type"] == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1], _known_keys(model, loc), n=1)
            hint = f" (did you mean {'.'.join((prefix, *loc[:-1], close[0]))}?)" if close else ""
            raise ConfigError(
                f"unknown parameter {name}{hint}.",
                fix=f"remove or correct it in {source} or in --params.",
            ) from None
        value = first.get("input")
        shown = "" if first["type"] == "missing" else f" = {value!r}"
        message = first["msg"].removeprefix("Value error, ")
        target = f"{name}.<key>" if isinstance(value, dict) else name
        raise ConfigError(
            f"parameter {name}{shown} is invalid: {message}.",
            fix=f"set {target} in {source} or pass --params {target}=<value>.",
        ) from None
