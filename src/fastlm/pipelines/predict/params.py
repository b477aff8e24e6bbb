"""Parameters of the predict pipeline (``params:predict`` in conf/base/parameters_predict.yml)."""

from __future__ import annotations

import logging
import unicodedata
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fastlm.corpus.config import DEFAULT_PROMPT_TEMPLATE, check_chat_template_kwargs
from fastlm.errors import ConfigError
from fastlm.reporting.params import DecodingParams
from fastlm.validation import parse_params

log = logging.getLogger(__name__)
SOURCE = "conf/base/parameters_predict.yml"
MESSAGES = "predict.messages_column"


class PredictParams(DecodingParams):
    """What to read, which model, how to decode. The decoding keys are those of ``report.references``, so a
    setting tuned against ROUGE there is copied here as it is."""

    input: str | None = Field(
        None, description="the file to predict on (required): --params predict.input=FILE"
    )
    model: str | None = Field(None, description="null: the trained model; or a model folder; or a run name")
    text_column: str | None = Field(
        None, min_length=1, description="plain text, continued as it is; null: text (see messages_column)"
    )
    prompt_column: str | None = Field(
        None, min_length=1, description="prompt data: wrapped by prompt_template"
    )
    messages_column: str | None = Field(
        None,
        min_length=1,
        description="chat data: [{role, content}, ...] rendered as in training (the chat template); null: "
        "the trained model's split.messages_column when no other column is named",
    )
    chat_template_kwargs: dict[str, bool | int | float | str] | None = Field(
        None,
        description="chat template variables (e.g. {enable_thinking: false}); null: the training's (its "
        "training_data.json), none for a model from elsewhere; set for a model trained here, it must equal "
        "the training's",
    )
    prompt_template: str | None = Field(
        None,
        description="wraps each prompt ({prompt}); null: the template the model was trained with (its "
        "training_data.json), else the split's default",
    )
    id_column: str | None = Field(None, min_length=1, description="null: the row number (0-based)")
    batch_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    max_input_tokens: int | None = Field(None, ge=1, description="null: what the model's positions leave")
    too_long: Literal["truncate", "refuse"] = "truncate"
    seed: int = 0
    resume: bool = Field(True, description="reuse the finished batches of an interrupted run of the same job")

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _template_variables(cls, value: Any) -> dict | None:
        return (
            None
            if value is None
            else check_chat_template_kwargs(value, "predict.chat_template_kwargs", SOURCE)
        )

    @field_validator("prompt_template")
    @classmethod
    def _composed(cls, template: str | None) -> str | None:
        # the training texts are composed (NFC): a template saved decomposed would tokenize otherwise
        return None if template is None else unicodedata.normalize("NFC", template)

    @model_validator(mode="after")
    def _one_input_column(self) -> PredictParams:
        others = [name for name in ("text_column", "prompt_column") if getattr(self, name) is not None]
        if self.messages_column is not None and others:
            # ConfigError (not ValueError): the line names both parameters, not the whole predict group.
            raise ConfigError(
                f"predict.messages_column and predict.{others[0]} are both set: the inputs are read from one "
                "column.",
                fix=f"name one of them and leave the other unset (null, its default in {SOURCE}).",
            )
        if self.prompt_template is not None and self.prompt_template.count("{prompt}") != 1:
            raise ConfigError(
                f"predict.prompt_template must hold {{prompt}} exactly once, where each input goes (got "
                f"{self.prompt_template!r}).",
                fix="put {prompt} in it once (in --params, quote the value: "
                "'predict.prompt_template=\"Q: {prompt} A:\"'), or leave it null for the model's own "
                "template.",
            )
        return self

    def input_column(self, trained_messages_column: str | None = None) -> tuple[str, str]:
        """(parameter, column) of the inputs: the column named (prompt, messages, text); with none named,
        the model's training messages column when it was trained on chat messages, else ``text``."""
        for name in ("prompt_column", "messages_column", "text_column"):
            if getattr(self, name) is not None:
                return f"predict.{name}", getattr(self, name)
        if trained_messages_column is not None:
            return MESSAGES, trained_messages_column
        return "predict.text_column", "text"

    def template(self, trained: dict | None) -> tuple[str | None, str]:
        """(template, where it came from) for prompt inputs; (None, "") for others. ``trained``: how the
        model's training data was formatted (``PredictSources.training_format``), None where nothing says.
        Unset, the trained template (prompt/response data), else the split's default; set, the one given,
        with a warning where the model was trained with another."""
        if self.prompt_column is None:
            return None, ""
        used = (
            trained.get("prompt_template") if trained and trained.get("kind") == "prompt_response" else None
        )
        if self.prompt_template is None:
            return (used, trained["source"]) if used is not None else (DEFAULT_PROMPT_TEMPLATE, "default")
        if used is not None and used != self.prompt_template:
            log.warning(
                "predict.prompt_template %r is not the template the model was trained with (%r, in %s): "
                "the predictions use the one given; leave predict.prompt_template unset for the trained one",
                self.prompt_template,
                used,
                trained["source"],
            )
        return self.prompt_template, "predict.prompt_template"

    def require_input(self) -> str:
        """``input`` has no default (there is no file to guess): its absence is one line, before any work."""
        if self.input is None or not self.input.strip():
            raise ConfigError(
                "parameter predict.input is not set: there is no file to predict on.",
                fix="kedro run --pipeline=predict --params predict.input=<file> (.jsonl, .csv, "
                ".tsv, .parquet or .txt, optionally .gz).",
            )
        return self.input


def parse_predict_params(raw) -> PredictParams:
    return parse_params(PredictParams, raw, prefix="predict", source=SOURCE)
