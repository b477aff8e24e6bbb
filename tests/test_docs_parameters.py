"""The parameter names users copy from the README and the conf files' comments exist: every dotted name
under a parameter group (``train.optimizer.lr``, ``split.tokenizer.source``, ``report.top_k``)
resolves, key by key, to a field of that group's typed schema (fastlm.parameters.GROUPS), and every key a
``--params`` example sets is one ``--params`` may set. A renamed or removed parameter left in the docs fails
here instead of being refused (or, inside a sweep file, failing) only when a user copies it. So does a value
the README gives one (`` `train.model.gradient_checkpointing: off | selective | full | auto` ``,
``--params train.batching.mode=length_grouped``) that its field no longer takes."""

from __future__ import annotations

import importlib
import re
import typing
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from fastlm.parameters import GROUPS, known_top_level_params

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "conf").rglob("*.yml"))]

# A group name, a dot and identifiers: what the docs write for a parameter (``train.model.lora.r``). A name
# glued to a word before it (``data/08_reporting``, ``fastlm.reporting``) is no parameter and does not match.
_GROUPS = "|".join(name for name, group in GROUPS.items() if group.schema is not None)
DOTTED = re.compile(rf"(?<![\w./-])(?:{_GROUPS})(?:\.[A-Za-z_]\w*)+")

# Dotted words in the docs that are not parameters: file names the report writes.
NOT_PARAMETERS = {
    "report.html",  # data/08_reporting/report.html
    "report.md",  # data/08_reporting/report.md
}


def _models(annotation) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models(arg)]


def _is_mapping(annotation) -> bool:
    origin = typing.get_origin(annotation)
    if isinstance(origin, type) and issubclass(origin, Mapping):
        return True
    return any(_is_mapping(arg) for arg in typing.get_args(annotation))


def unresolved(name: str) -> str | None:
    """Why ``name`` (``group.key.key``) is not a parameter of its group's schema; None where it is. A key
    under a mapping field (``split.chat_template_kwargs.enable_thinking``) is the user's own."""
    group, *keys = name.split(".")
    schema = GROUPS[group]
    models = [getattr(importlib.import_module(schema.module), schema.schema)]
    for depth, key in enumerate(keys):
        fields = [model.model_fields[key] for model in models if key in model.model_fields]
        if not fields:
            known = sorted({field for model in models for field in model.model_fields})
            return f"no key {key!r} under {'.'.join([group, *keys[:depth]])} (its keys: {known})"
        if any(_is_mapping(field.annotation) for field in fields):
            return None
        models = [model for field in fields for model in _models(field.annotation)]
        if not models and depth < len(keys) - 1:
            return f"{'.'.join([group, *keys[: depth + 1]])} is a value, not a group of keys"
    return None


def _mentions() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in DOCS:
        for name in DOTTED.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_the_docs_mention_parameters_at_all():
    """The extraction itself works: the README's well-known parameters are found."""
    mentions = _mentions()
    assert {"train.max_steps", "split.max_length", "report.references.max_samples"} <= set(mentions)


def test_every_parameter_the_readme_and_the_conf_comments_name_exists():
    wrong = {
        name: f"{why} (in {', '.join(sorted(where))})"
        for name, where in _mentions().items()
        if name not in NOT_PARAMETERS and (why := unresolved(name))
    }
    assert not wrong, "\n".join(f"{name}: {why}" for name, why in sorted(wrong.items()))


def test_the_allow_list_holds_only_names_that_are_no_parameters_and_still_appear():
    mentions = _mentions()
    for name in NOT_PARAMETERS:
        assert name in mentions, f"{name} is no longer in the docs: drop it from NOT_PARAMETERS"
        assert unresolved(name) is not None, f"{name} is a parameter: drop it from NOT_PARAMETERS"


@pytest.mark.parametrize(
    ("name", "resolves"),
    [
        ("train.model.lora.r", True),
        ("split.chat_template_kwargs.enable_thinking", True),
        ("train.optimizer.learning_rate", False),
        ("train.max_steps.value", False),
        ("report.references.max_sample", False),
    ],
)
def test_the_resolver_tells_parameters_from_other_names(name, resolves):
    assert (unresolved(name) is None) is resolves


def test_every_key_a_params_example_in_the_readme_sets_is_one_params_may_set():
    """``--params raw_path=...,split.text_column=body``: each top-level key is a group, ``run_name``, or one
    a conf file defines or reads (``raw_path``, ``sweep``)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    arguments = re.findall(r"--params(?:\s+|=)'?([^\s`']+)", readme)
    keys = {key for argument in arguments for key in re.findall(r"(?:^|,)([A-Za-z_][\w.]*)=", argument)}
    assert "raw_path" in keys
    known = known_top_level_params(ROOT / "conf")
    assert {key.split(".")[0] for key in keys} <= known
    unknown = {key: why for key in keys if "." in key and (why := unresolved(key))}
    assert not unknown, unknown


# Values the README gives a parameter that its field cannot take on every machine, each with the reason.
NOT_VALUES = {
    ("train.fold", "i"): "a placeholder: `train.fold: i` is the i-th fold",
    ("train.optimizer.name", "paged_adamw_8bit"): "CUDA only: refused on a machine without a CUDA GPU",
}


def _given_values(text: str) -> set[tuple[str, str]]:
    """(name, value) for each `` `name: a | b` `` alternative and each ``name=value`` the text gives a
    parameter; values holding a ``<placeholder>`` are left out."""
    pairs = {
        (name, alternative.strip())
        for name, values in re.findall(rf"`({DOTTED.pattern}): ([^`]+)`", text)
        for alternative in values.split(" | ")
    }
    pairs |= set(re.findall(rf"({DOTTED.pattern})=(\[[^\]]*\]|[^,\s`']+)", text))
    return {(name, value) for name, value in pairs if "<" not in value}


def refused_value(name: str, raw: str) -> str | None:
    """Why ``name``'s field refuses ``raw`` (read as YAML, as ``--params`` reads it); None where it takes it.
    The other fields keep their defaults: checks across fields (a prompt column without a response column)
    are not this value's and are left out."""
    group, *keys = name.split(".")
    schema = GROUPS[group]
    model = getattr(importlib.import_module(schema.module), schema.schema)
    data = yaml.safe_load(raw)
    for key in reversed(keys):
        data = {key: data}
    try:
        model.model_validate(data)
    except ValidationError as error:
        for detail in error.errors():
            if tuple(detail["loc"][: len(keys)]) == tuple(keys):
                return detail["msg"]
    except Exception:  # a check across fields (fastlm's ConfigError): not about this value
        return None
    return None


def test_every_value_the_readme_gives_a_parameter_is_one_its_field_takes():
    given = _given_values((ROOT / "README.md").read_text(encoding="utf-8"))
    assert ("train.batching.mode", "length_grouped") in given
    assert set(NOT_VALUES) <= given, "a NOT_VALUES entry is no longer in the README: drop it"
    wrong = {
        f"{name}: {value}": why
        for name, value in sorted(given - set(NOT_VALUES))
        if unresolved(name) is None and (why := refused_value(name, value))
    }
    assert not wrong, "\n".join(f"{pair}: {why}" for pair, why in wrong.items())


@pytest.mark.parametrize(
    ("name", "raw", "takes"),
    [
        ("train.model.gradient_checkpointing", "selective", True),
        ("train.model.gradient_checkpointing", "true", True),
        ("train.model.gradient_checkpointing", "every", False),
        ("train.batching.mode", "padded", False),
        ("report.references.rouge_tokenizer", "syllable", True),
        ("report.prompts", '["9 10"]', True),
        ("split.prompt_column", "dialogue", True),
    ],
)
def test_the_value_check_tells_taken_values_from_refused_ones(name, raw, takes):
    assert (refused_value(name, raw) is None) is takes
