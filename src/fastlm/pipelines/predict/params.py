"""Parameters of the predict pipeline (``params:predict`` in conf/base/parameters_predict.yml)."""

from __future__ import annotations

import logging
import unicodedata
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fastlm.corpus.config import DEFAULT_PROMPT_TEMPLATE, check_chat_template_kwargs
from fastlm.errors import ConfigError, InputDataError
from fastlm.reporting.params import DecodingParams, Seed
from fastlm.validation import parse_params

log = logging.getLogger(__name__)
SOURCE = "conf/base/parameters_predict.yml"
MESSAGES = "predict.messages_column"
PROMPTS = "predict.prompt_column"


class PredictParams(DecodingParams):
    """What to read, which model, how to decode. The decoding keys are those of ``report.references``, so a
    setting tuned against ROUGE there is copied here as it is."""

    input: str | None = Field(
        None, description="the file to predict on (required): --params predict.input=FILE"
    )
    model: str | None = Field(None, description="null: the trained model; or a model folder; or a run name")
    text_column: str | None = Field(
        None,
        min_length=1,
        description="plain text, continued as it is; with no column named, the inputs are asked as the model "
        "was trained (input_column)",
    )
    prompt_column: str | None = Field(
        None, min_length=1, description="prompt data: wrapped by prompt_template"
    )
    messages_column: str | None = Field(
        None,
        min_length=1,
        description="chat data: [{role, content}, ...] (or ShareGPT {from, value} turns) rendered as in "
        "training (the chat template); null: "
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
    # chunk i samples with seed + i (torch takes 0 .. 2**64 - 1; a negative seed is read modulo 2**64, so
    # seed -1's second chunk would sample as seed 0's first): a seed of int64's range leaves room for them
    seed: Seed = 0
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

    def input_column(
        self, trained: dict | None, columns: list[str], *, lines: bool = False, source: str = "the input"
    ) -> tuple[str, str]:
        """(parameter, column) of the inputs. The column named wins (prompt, messages, text). With none named,
        the inputs are asked as the model was trained (``trained``: ``PredictSources.training_format``, None
        for plain text or where nothing says): a chat model's training messages column, else its ``text``
        column read as prompts (one user turn each, as ``predict.prompt_column``); a prompt/response
        model's training prompt column where the file has it, else its ``text`` column read as prompts (a
        ``.txt`` file's lines, ``lines``, as they are; a table's with one warning); a model trained on
        pre-tokenized ids, its training's ``split.ids_column`` where the file has it, else ``text``,
        continued; anything else's ``text``, continued. A file with neither the training's column nor
        ``text`` is refused in one line naming the split parameter that chose the column. A text column named
        for a prompt/response or chat model is continued as asked, said in one warning."""
        kind = (trained or {}).get("kind")
        trained_column = (trained or {}).get("prompt_column") or "prompt"
        for name in ("prompt_column", "messages_column", "text_column"):
            if getattr(self, name) is not None:
                if name == "text_column" and kind in ("prompt_response", "messages"):
                    log.warning(
                        "predict.text_column %r: each input is continued as raw text (no prompt template or "
                        "chat format, the prediction is its continuation), though the model was trained on "
                        "%s (in %s); leave predict.text_column unset (or set predict.prompt_column) to ask "
                        "them as prompts",
                        self.text_column,
                        "prompts" if kind == "prompt_response" else "chat messages",
                        trained["source"],
                    )
                return f"predict.{name}", getattr(self, name)
        if kind == "messages":
            if trained["messages_column"] in columns:
                return MESSAGES, trained["messages_column"]
            if "text" not in columns:
                raise _no_trained_column(
                    source, trained["messages_column"], ("split.messages_column", MESSAGES), columns
                )
            how = ("split.messages_column", "each one user turn in its training's chat format")
            return self._text_as_prompts(trained["messages_column"], self._asked(how), lines, source)
        if kind == "pretokenized":
            return "predict.text_column", self._id_column(trained, columns, source)
        if kind != "prompt_response":
            return "predict.text_column", "text"
        if trained_column in columns:
            log.info(
                "predict.prompt_column: %r, the column the model was trained on (split.prompt_column): each "
                "input wrapped by its prompt template and answered; predict.text_column continues a column "
                "as raw text instead",
                trained_column,
            )
            return PROMPTS, trained_column
        if "text" in columns:
            how = ("split.prompt_column", "wrapped by its training's prompt template")
            return self._text_as_prompts(trained_column, self._asked(how), lines, source)
        raise _no_trained_column(source, trained_column, ("split.prompt_column", PROMPTS), columns)

    @staticmethod
    def _id_column(trained: dict, columns: list[str], source: str) -> str:
        """The column of a model trained on pre-tokenized ids: its training's ``split.ids_column`` where the
        file has it (a file shaped like the training data), said in one line, else ``text`` (a .txt's
        lines); a file with neither is refused naming the training's column."""
        ids_column = trained.get("ids_column") or "ids"
        if ids_column not in columns and "text" in columns:
            return "text"
        if ids_column not in columns:
            raise _no_trained_column(source, ids_column, ("split.ids_column", "predict.text_column"), columns)
        if ids_column in columns:
            log.info(
                "predict.text_column: %r, the column the model was trained on (split.ids_column): each row's "
                "ids (a list, or ids separated by spaces) continued as it was trained",
                ids_column,
            )
        return ids_column

    def _asked(self, how: tuple[str, str]) -> tuple[str, str]:
        """How a prompt is asked: as the model was trained (``how``), or wrapped by the template given."""
        if self.prompt_template is None:
            return how[0], f"{how[1]} and answered, as the model was trained"
        return how[0], "wrapped by predict.prompt_template and answered"

    @staticmethod
    def _text_as_prompts(
        trained_column: str, how: tuple[str, str], lines: bool, source: str
    ) -> tuple[str, str]:
        """The ``text`` column (a ``.txt`` file's lines, ``lines``) read as prompts, as a model trained on
        prompts or chats is asked (``how``: the split parameter of its column, how a prompt is asked): said in
        one line, a warning for a table's column."""
        if lines:
            log.info(
                "predict: each line of %s is a prompt, %s; predict.text_column=text continues them as "
                "raw text",
                source,
                how[1],
            )
        else:
            log.warning(
                "predict: %s has no column %r (the model's %s) but a 'text' column: its rows are read as "
                "prompts (predict.prompt_column=text), %s; set predict.text_column=text to continue them "
                "as raw text instead",
                source,
                trained_column,
                how[0],
                how[1],
            )
        return PROMPTS, "text"

    def template(self, trained: dict | None, parameter: str) -> tuple[str | None, str]:
        """(template, where it came from) for prompt inputs (``parameter``, ``input_column``'s, is
        ``predict.prompt_column``); (None, "") for others. ``trained``: how the model's training data was
        formatted (``PredictSources.training_format``), None where nothing says.
        Unset, the trained template (prompt/response data), else the split's default; set, the one given,
        with a warning where the model was trained with another, or on chat messages."""
        if parameter != PROMPTS:
            return None, ""
        used = (
            trained.get("prompt_template") if trained and trained.get("kind") == "prompt_response" else None
        )
        if self.prompt_template is None:
            return (used, trained["source"]) if used is not None else (DEFAULT_PROMPT_TEMPLATE, "default")
        if trained and trained.get("kind") == "messages":
            log.warning(
                "predict.prompt_template %r wraps each prompt, though the model was trained on chat messages "
                "(in %s): the prompts are not the chats it learned; leave predict.prompt_template unset to "
                "ask each as one user turn in its training's chat format",
                self.prompt_template,
                trained["source"],
            )
        elif used is not None and used != self.prompt_template:
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


def _no_trained_column(
    source: str, column: str, parameters: tuple[str, str], columns: list[str]
) -> InputDataError:
    """The input lacks ``column``, the column the model was trained on, read since no column is named:
    one line naming the parameter that chose the column (``parameters``: the training's split parameter,
    and the predict parameter that names another), and both fixes."""
    trained, parameter = parameters
    return InputDataError(
        f"{source} has no column {column!r} ({trained} of the model's training, read since {parameter} is "
        f"unset) and no 'text' column; its columns are {columns}.",
        fix=f"name another column with --params {parameter}=<one of them>, or give the file a {column!r} "
        "column.",
    )
