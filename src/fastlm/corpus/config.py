"""Parameters of the split pipeline (``params:split`` in conf/base/parameters_split.yml)."""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fastlm.errors import ConfigError
from fastlm.validation import Params, parse_params

SOURCE = "conf/base/parameters_split.yml"
TRAIN_TOKENIZER = "train"
# Tokens per sample that any model fastlm trains can take: a saved model is also held to its own
# max_position_embeddings (checked when train loads it); a from-scratch model gets max(max_length, 512)
# positions.
MAX_LENGTH_LIMIT = 32_768


class SplitRatios(Params):
    train: float = Field(0.9, gt=0, le=1)
    validation: float = Field(0.05, ge=0, le=1)
    test: float = Field(0.05, ge=0, le=1)

    @model_validator(mode="after")
    def _sum_to_one(self) -> SplitRatios:
        total = self.train + self.validation + self.test
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(
                f"train + validation + test = {total:g}, they must sum to 1 "
                f"(got {self.train:g} + {self.validation:g} + {self.test:g})"
            )
        return self


class TokenizerParams(Params):
    source: str = Field(
        TRAIN_TOKENIZER,
        min_length=1,
        description="'train' (byte-level BPE on the train split), a local directory, or a hub id",
    )
    vocab_size: int = Field(8000, ge=300, le=1_000_000)
    min_frequency: int = Field(2, ge=1)
    training_samples: int | None = Field(
        200_000,
        ge=1,
        description="train the BPE on at most this many train rows (hash-selected; a pair gives both)",
    )
    allow_download: bool = False
    trust_remote_code: bool = False


DEFAULT_PROMPT_TEMPLATE = "{prompt}\n\n### Response:\n"
# Keys ``chat_template_kwargs`` may not hold, with why: ``apply_chat_template``'s own arguments, which fastlm
# sets for every render (the prompt as text with the generation prompt, tokenized by fastlm), the fixed date,
# and the variables transformers gives every template itself (the chat, the tokenizer's special tokens, its
# functions).
_RESERVED_TEMPLATE_KWARGS = {
    **dict.fromkeys(
        (
            "tokenize",
            "return_dict",
            "return_tensors",
            "return_assistant_tokens_mask",
            "padding",
            "truncation",
            "max_length",
            "tokenizer_kwargs",
            "sanitize_control_tokens",
        ),
        "it renders each prompt as text and tokenizes it itself",
    ),
    **dict.fromkeys(
        ("add_generation_prompt", "continue_final_message"),
        "a prompt always ends with the template's generation prompt, where the answer starts",
    ),
    **dict.fromkeys(
        ("conversation", "messages", "documents", "chat_template"),
        "the template renders each row's messages, with the tokenizer's own chat template",
    ),
    "tools": "each row's tools (function schemas) come from the data's tools column",
    "date_string": "a template that dates its prompt gets the same fixed date on every day "
    "(corpus.chat_template.CHAT_DATE), so the split and predict render alike",
    **dict.fromkeys(
        (
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
            "additional_special_tokens",
        ),
        "the template gets the tokenizer's own special tokens",
    ),
    **dict.fromkeys(("raise_exception", "strftime_now"), "it is a function transformers gives the template"),
}


def check_chat_template_kwargs(
    value: Any, parameter: str, source: str
) -> dict[str, bool | int | float | str]:
    """``value`` as chat template variables (TRL's ``chat_template_kwargs``): a mapping of names a template
    can read to a text, number or true/false each (texts NFC, as the data is), none of the keys fastlm sets
    itself (``_RESERVED_TEMPLATE_KWARGS``); else one ConfigError line naming ``parameter``."""
    example = f"--params {parameter}.enable_thinking=false"
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{parameter} must be a mapping of chat template variables to values, got "
            f"{type(value).__name__} {value!r}.",
            fix=f"write it as a mapping in {source} (e.g. chat_template_kwargs: {{enable_thinking: false}} "
            f"for Qwen3's non-thinking mode) or pass {example}.",
        )
    checked = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(
                f"{parameter}: {key!r} is not a name a template can read (letters, digits and _, not "
                "starting with a digit).",
                fix=f"name the template's variable in {source} as its chat template spells it (e.g. "
                "enable_thinking).",
            )
        if key == "tools":
            raise ConfigError(
                f"{parameter}.tools is set by fastlm: {_RESERVED_TEMPLATE_KWARGS[key]}.",
                fix=f"remove tools from {parameter} in {source} and give each row its function schemas in "
                "the column split.tools_column names (default tools; --params split.tools_column=<column>).",
            )
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise ConfigError(
                f"{parameter}.{key} is set by fastlm: {_RESERVED_TEMPLATE_KWARGS[key]}.",
                fix=f"remove {key} from {parameter} in {source}; it holds the template's own variables only "
                "(e.g. enable_thinking: false for Qwen3).",
            )
        scalar = isinstance(item, bool | int | str) or (isinstance(item, float) and math.isfinite(item))
        if not scalar:
            raise ConfigError(
                f"{parameter}.{key} = {item!r} is not a text, a finite number or true/false.",
                fix=f"give {key} one such value in {source} (remove the key to leave the template's "
                "default).",
            )
        if isinstance(item, str) and item.strip().lower() in ("true", "false"):
            # a quoted "false" is a text to the template, and a text is true: `enable_thinking is false` fails
            raise ConfigError(
                f"{parameter}.{key} = {item!r} is a text, not true/false (a template reads any text as "
                "true).",
                fix=f"write {key}: {item.strip().lower()} unquoted in {source}.",
            )
        checked[key] = unicodedata.normalize("NFC", item) if isinstance(item, str) else item
    return checked


class SplitParams(Params):
    """``text_column`` for plain text; ``prompt_column`` + ``response_column``, or ``messages_column``, for
    prompt/response data (completion-only loss; see ``fastlm.corpus.prompts``)."""

    text_column: str = Field("text", min_length=1)
    prompt_column: str | None = Field(
        None, min_length=1, description="with response_column: prompt/response data"
    )
    response_column: str | None = Field(None, min_length=1)
    messages_column: str | None = Field(
        None,
        min_length=1,
        description="chat-style lists of {role, content} (or ShareGPT {from, value}) turns; the last "
        "(assistant) one is the response",
    )
    prompt_template: str = Field(
        DEFAULT_PROMPT_TEMPLATE, description="wraps the prompt text ({prompt}) when no chat template is used"
    )
    chat_template: bool = Field(
        True, description="render messages with the tokenizer's chat template when it has one"
    )
    chat_template_kwargs: dict[str, bool | int | float | str] = Field(
        default_factory=dict,
        description="variables given to the chat template at every render (TRL's chat_template_kwargs), "
        "e.g. {enable_thinking: false} for Qwen3's non-thinking mode",
    )
    tools_column: str | None = Field(
        "tools",
        min_length=1,
        description="messages: each row's tools (a list of JSON-schema function descriptions, or a JSON "
        "string of one) given to the chat template, used where the data has this column",
    )
    train_turns: Literal["all", "last"] = Field(
        "all",
        description="messages: all trains every assistant answer of a chat (TRL's assistant_only_loss) with "
        "its end of turn; last trains only the last answer",
    )
    ratios: SplitRatios = SplitRatios()
    max_samples: int | None = Field(None, ge=1)
    hash_salt: str = Field("", max_length=64, description="changing it re-draws every split")
    folds: int | None = Field(
        None,
        ge=2,
        le=100,
        description="k-fold runs: k fold buckets of train + validation (train.fold picks one)",
    )
    max_length: int = Field(320, ge=2, le=MAX_LENGTH_LIMIT, description="tokens per sample, EOS included")
    tokenizer: TokenizerParams = TokenizerParams()
    batch_size: int = Field(
        20_000, ge=1, description="texts per tokenizer call (at most 8 M characters a call)"
    )
    num_proc: int | Literal["auto"] = "auto"
    # Pre-tokenized data (integer id lists, e.g. log keys): no tokenizer is trained or loaded.
    pretokenized: bool = Field(False, description="ids_column holds lists of integer ids, not texts")
    ids_column: str = Field("ids", min_length=1, description="the column of id lists (pretokenized only)")
    vocab_size: int | None = Field(None, ge=2, le=10_000_000, description="ids are 0 .. vocab_size - 1")
    eos_id: int | None = Field(None, ge=0, description="appended to every sample; default vocab_size - 1")
    pad_id: int | None = Field(None, ge=0, description="padding id; default eos_id")

    @model_validator(mode="after")
    def _one_data_format(self) -> SplitParams:
        # ConfigError (not ValueError) throughout: the line names the parameters at fault, not the whole
        # split group.
        if (self.prompt_column is None) != (self.response_column is None):
            given, missing = (
                ("prompt_column", "response_column")
                if self.response_column is None
                else ("response_column", "prompt_column")
            )
            raise ConfigError(
                f"split.{given} is set but split.{missing} is not: prompt/response data needs both columns.",
                fix=f"set split.{missing} too (--params split.{missing}=<column>), or unset "
                f"split.{given} for plain text.",
            )
        if self.prompt_column is not None and self.messages_column is not None:
            raise ConfigError(
                "split.messages_column and split.prompt_column / split.response_column are both set: the "
                "data is read in one format.",
                fix=f"name the chat column or the two prompt/response columns and leave the other unset "
                f"(null, the default in {SOURCE}).",
            )
        if self.prompt_column is not None and self.prompt_column == self.response_column:
            raise ConfigError(
                f"split.prompt_column and split.response_column are both "
                f"{self.prompt_column!r}: the model would learn to repeat the prompt.",
                fix="set split.response_column to the column that holds the responses "
                "(--params split.response_column=<name>).",
            )
        if self.prompt_template.count("{prompt}") != 1:
            raise ConfigError(
                f"split.prompt_template must hold {{prompt}} exactly once, where each prompt goes "
                f"(got {self.prompt_template!r}).",
                fix="put {prompt} in it once (in --params, quote the value: "
                "'split.prompt_template=\"Q: {prompt} A:\"').",
            )
        if self.pretokenized:
            self._check_pretokenized()
        return self

    def _check_pretokenized(self) -> None:
        # ConfigError (not ValueError): pydantic lets it through, so the line names the one parameter at
        # fault.
        if self.vocab_size is None:
            raise ConfigError(
                "split.pretokenized is true but split.vocab_size is not set (ids must run from 0 "
                "to vocab_size - 1).",
                fix=f"set split.vocab_size in {SOURCE} or pass "
                "--params split.vocab_size=<largest id + 2> (the last id is EOS by default).",
            )
        if self.prompt_column is not None or self.messages_column is not None:
            raise ConfigError(
                "split.pretokenized data is one id list per row, not prompt/response data.",
                fix="unset split.prompt_column, split.response_column and split.messages_column.",
            )
        for name in ("eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and value >= self.vocab_size:
                raise ConfigError(
                    f"split.{name} = {value} is not below split.vocab_size ({self.vocab_size}).",
                    fix=f"set split.{name} < {self.vocab_size} or raise split.vocab_size.",
                )

    @property
    def special_ids(self) -> tuple[int, int]:
        """(eos, pad) of pre-tokenized data: ``eos_id`` (default ``vocab_size - 1``), ``pad_id`` (default
        EOS)."""
        eos = self.vocab_size - 1 if self.eos_id is None else self.eos_id
        return eos, eos if self.pad_id is None else self.pad_id

    @property
    def data_format(self) -> str:
        """``text``, ``prompt_response`` (two columns), ``messages`` (a chat list per row) or
        ``pretokenized``."""
        if self.pretokenized:
            return "pretokenized"
        if self.messages_column is not None:
            return "messages"
        return "text" if self.prompt_column is None else "prompt_response"

    @field_validator("prompt_template")
    @classmethod
    def _composed(cls, template: str) -> str:
        # the texts are composed (NFC) by the cleaning: a template saved decomposed would tokenize otherwise
        return unicodedata.normalize("NFC", template)

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _template_variables(cls, value: Any) -> dict:
        return check_chat_template_kwargs(value, "split.chat_template_kwargs", SOURCE)

    @field_validator("num_proc")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be 'auto' or a whole number >= 1")
        return value


def parse_split_params(raw) -> SplitParams:
    return parse_params(SplitParams, raw, prefix="split", source=SOURCE)
