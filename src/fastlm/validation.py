"""Typed, validated parameters: parse a Kedro parameter dict once, at node entry.

Every problem becomes one ``ConfigError`` line naming the parameter, the value, what is wrong and
where to fix it; a misspelled key is refused with a "did you mean" suggestion instead of being
silently ignored. Kedro-free: the engine uses it too.

The parameter is named by its key path alone: pydantic puts the name of each union branch it tried into an
error's location (``target_modules.list[str]``, ``.int``, ``.function-after[...]``, a model's class name);
those are dropped, and the branches' messages at one key are said together
("a list such as [q_proj] or 'auto'").
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from fastlm.errors import ConfigError

Model = TypeVar("Model", bound="Params")

# pydantic-core's names of schemas, used as union branch tags where the branch could not be followed
_TAG = re.compile(
    r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\[.*\]|any|none|bool|int|float|decimal|str|bytes|date|"
    r"datetime|time|timedelta|uuid|url|[a-z]+(?:-[a-z]+)+"
)
_SHOULD = "Input should be "
_DETAIL = re.compile(r", (?:unable to|got) .*$")


class Params(BaseModel):
    """Base for parameter groups: unknown keys are errors, values are validated on assignment; no number is
    NaN or infinite, and ``true`` / ``false`` is no number (pydantic's lax mode read ``--params
    train.fold=true`` as fold 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and _number_not_boolean(field.annotation):
            raise ValueError("true or false where a number is expected")
        return value


def parse_params(model: type[Model], raw: Any, *, prefix: str, source: str, file_only: bool = False) -> Model:
    """Validate ``raw`` (the ``params:<prefix>`` dict) into ``model`` or raise one ConfigError line.

    ``file_only``: the values come from ``source`` alone (a sweep file), so the message begins with it and
    does not offer ``--params`` as a fix; ``prefix`` may then be empty (the file's own keys).
    """
    if raw is None:
        raw = {}
    if isinstance(raw, Params):
        return raw  # already validated
    where = f"{source}: " if file_only else ""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{where}{f'parameter {prefix}' if prefix else 'it'} must be a mapping, got "
            f"{type(raw).__name__}.",
            fix=f"check {source}.",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        path, parent = _key_path(model, first["loc"])
        name = ".".join(part for part in (prefix, *path) if part)
        if first["type"] == "extra_forbidden":
            close = difflib.get_close_matches(path[-1], _field_names(parent), n=1)
            meant = ".".join(part for part in (prefix, *path[:-1], *close[:1]) if part)
            hint = f" (did you mean {meant}?)" if close else ""
            raise ConfigError(
                f"{where}unknown parameter {name}{hint}.",
                fix=f"remove or correct it in {source}{'' if file_only else ' or in --params'}.",
            ) from None
        value = first.get("input")
        branches = [error for error in errors if _key_path(model, error["loc"])[0] == path]
        message, example = _branch_messages(branches, value)
        if not name:  # the whole file (a check across its keys)
            raise ConfigError(f"{where}{message}.", fix=f"correct {source}.") from None
        shown = "" if first["type"] == "missing" else f" = {value!r}"
        keys = _field_names(_child(parent, path[-1])) if first["type"] == "model_type" and path else []
        if keys:  # a value where a group of parameters is (``--params train.loss=0.1``)
            listed = ", ".join(f"{name}.{key}" for key in keys[:4]) + (", ..." if len(keys) > 4 else "")
            raise ConfigError(
                f"{where}parameter {name}{shown} is invalid: {name} is a group of parameters ({listed}), "
                "not a value.",
                fix=f"set one of its keys in {source}"
                + ("" if file_only else f" or with --params {name}.{keys[0]}=<value>")
                + ".",
            ) from None
        if isinstance(value, dict) and first["type"] == "string_type":
            # a text holding ": " or braces, given in --params or unquoted in YAML, is read as a mapping
            raise ConfigError(
                f"{where}parameter {name}{shown} is invalid: {message} (a text holding ': ' or braces, "
                "unquoted, is read as a mapping).",
                fix=f"quote the text in {source}"
                + ("" if file_only else f", or in --params: '{name}=\"<text>\"'")
                + ".",
            ) from None
        if isinstance(value, int | float) and first["type"] == "string_type":
            # a text of digits (a salt, a column named 2024) or true/false, given in --params or unquoted in
            # YAML, is read as a number or a boolean: quoted, it stays the text typed. The fix quotes that
            # text where it is found (``0042`` is read as 34, ``1.50`` as 1.5: the number read is no fix)
            from fastlm.parameters import written_text

            typed = "true or false" if isinstance(value, bool) else "a number"
            written = None if file_only else written_text(name, value)
            read = f"{written} is read as {value!r}" if written is not None else f"it is read as {typed}"
            raise ConfigError(
                f"{where}parameter {name}{shown} is invalid: {message} (unquoted, {read}).",
                fix=f"quote the text{'' if written else ' as written'} in {source}"
                + ("" if file_only else f", or in --params: '{name}=\"{written or '<text as written>'}\"'")
                + ".",
            ) from None
        read = _keys_read(_child(parent, path[-1]), message) if isinstance(value, dict) and path else []
        if read:  # a check across the group's keys: name those keys, not the whole mapping
            shown_keys = _listed(
                [f"{name}.{key} = {_group_value(parent, path, value, key)!r}" for key in read], "and"
            )
            what = (
                f"parameters {shown_keys} are invalid together"
                if len(read) > 1
                else f"parameter {shown_keys} is invalid"
            )
            raise ConfigError(
                f"{where}{what}: {message}.",
                fix=f"set {_listed([f'{name}.{key}' for key in read], 'or')} in {source}"
                + ("" if file_only else f" or pass --params {name}.{read[0]}=<value>")
                + ".",
            ) from None
        target = f"{name}.<key>" if isinstance(value, dict) else name
        passed = f"'{target}={example}'" if example else f"{target}=<value>"
        raise ConfigError(
            f"{where}parameter {name}{shown} is invalid: {message}.",
            fix=f"set {target} in {source}{'' if file_only else f' or pass --params {passed}'}.",
        ) from None


def _number_not_boolean(annotation: Any) -> bool:
    """An annotation that takes a number (int, float) and no boolean (``bool``, a Literal of True/False)."""
    members = _flat_members(annotation)
    numbers = any(member in (int, float) for member in members)
    booleans = any(
        member is bool
        or (
            typing.get_origin(member) is typing.Literal
            and any(isinstance(a, bool) for a in typing.get_args(member))
        )
        for member in members
    )
    return numbers and not booleans


def _flat_members(annotation: Any) -> list[Any]:
    """The types of a union (``X | Y``, Optional), through ``Annotated``."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _flat_members(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [member for arg in typing.get_args(annotation) for member in _flat_members(arg)]
    return [annotation]


def _branch_messages(errors: list[dict], value: Any) -> tuple[str, str | None]:
    """What the union branches tried at one key accept, as one phrase ("Input should be a valid integer or
    'auto'"); and, where a list was expected and a string given, the list to write (``[q_proj]``)."""
    if len(errors) == 1 and errors[0]["type"] != "list_type":
        return errors[0]["msg"].removeprefix("Value error, "), None
    listed = any(error["type"] == "list_type" for error in errors)
    example = f"[{value}]" if listed and isinstance(value, str) else None
    wants: list[str] = []
    others: list[str] = []
    for error in errors:
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "list_type" and example:
            message = f"{_SHOULD}a list such as {example}"
        if message.startswith(_SHOULD):  # "a valid integer, unable to parse string as an integer": its start
            wants.append(
                _DETAIL.sub("", message.removeprefix(_SHOULD))
                if len(errors) > 1
                else message.removeprefix(_SHOULD)
            )
        else:
            others.append(message)
    wants, others = list(dict.fromkeys(wants)), list(dict.fromkeys(others))
    if others:
        return "; ".join(others) + (f" (or {' or '.join(wants)})" if wants else ""), example
    return _SHOULD + " or ".join(wants), example


def _key_path(model: type[BaseModel], loc: Sequence) -> tuple[tuple[str, ...], Any]:
    """``loc`` without union branch tags, and the annotation its last key was looked up in (None: unknown)."""
    path: list[str] = []
    annotation: Any = model
    parent: Any = None
    for part in loc:
        members = _union_members(annotation)
        if members is not None and isinstance(part, str):  # pydantic names the branch it tried here
            annotation = _branch(members, part)
            continue
        if annotation is None and isinstance(part, str) and _TAG.fullmatch(part):
            continue  # a branch tag below a level that could not be followed
        path.append(str(part))
        parent, annotation = annotation, _child(annotation, part)
    return tuple(path), parent


def _unwrap(annotation: Any) -> Any:
    """``annotation`` without ``Annotated[...]`` and without ``| None``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        if len(members) == 1:
            return _unwrap(members[0])
    return annotation


def _union_members(annotation: Any) -> list | None:
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [member for member in typing.get_args(annotation) if member is not type(None)]
    return None


def _branch(members: list, tag: str) -> Any:
    """The member of a union pydantic tags ``tag`` (a model by its class name, a list, a dict), or None."""
    for member in members:
        plain = _unwrap(member)
        if isinstance(plain, type) and plain.__name__ == tag:
            return plain
        origin = typing.get_origin(plain)
        if origin is not None and isinstance(origin, type) and tag.startswith(f"{origin.__name__}["):
            return plain
    return None


def _child(annotation: Any, part: Any) -> Any:
    """The annotation of key or index ``part`` inside ``annotation`` (None where it cannot be told)."""
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return field.annotation if field is not None else None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
        return args[1]
    if isinstance(origin, type) and issubclass(origin, Sequence) and args and isinstance(part, int):
        return args[0] if origin is not tuple or args[-1] is Ellipsis else args[min(part, len(args) - 1)]
    return None


def _listed(items: list[str], last: str) -> str:
    """``a``, ``a and b``, ``a, b and c`` (``last``: the word before the last item)."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {last} {items[-1]}"


def _keys_read(group: Any, message: str) -> list[str]:
    """The keys of the parameter group ``group`` (a model annotation) that a check's ``message`` names, in
    the group's order ([] where it names none, or ``group`` is no model)."""
    return [key for key in _field_names(group) if re.search(rf"\b{re.escape(key)}\b", message)]


def _group_value(parent: Any, path: Sequence[str], given: Mapping, key: str) -> Any:
    """The value of ``key`` in the group at ``path``: as ``given``, else the group's default."""
    if key in given:
        return given[key]
    group = _unwrap(_child(parent, path[-1]))
    field = group.model_fields.get(key) if isinstance(group, type) and issubclass(group, BaseModel) else None
    return field.default if field is not None else None


def _field_names(annotation: Any) -> list[str]:
    """The field names of a model annotation (for "did you mean" hints), else []."""
    annotation = _unwrap(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return list(annotation.model_fields)
    return []
