"""Parameters of the predict pipeline (``params:predict`` in conf/base/parameters_predict.yml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fastlm.errors import ConfigError
from fastlm.reporting.params import DecodingParams
from fastlm.validation import parse_params

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
    prompt_template: str = "{prompt}\n\n### Response:\n"
    id_column: str | None = Field(None, min_length=1, description="null: the row number (0-based)")
    batch_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    max_input_tokens: int | None = Field(None, ge=1, description="null: what the model's positions leave")
    too_long: Literal["truncate", "refuse"] = "truncate"
    seed: int = 0
    resume: bool = Field(True, description="reuse the finished batches of an interrupted run of the same job")

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

    @property
    def template(self) -> str | None:
        return self.prompt_template if self.prompt_column is not None else None

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
