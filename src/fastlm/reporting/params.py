"""Parameters of the report pipeline (``params:report`` in conf/base/parameters_report.yml)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from fastlm.corpus.cleaning import normalize_text
from fastlm.corpus.pretokenized import id_word
from fastlm.errors import ConfigError
from fastlm.reporting.rouge import TOKENIZERS
from fastlm.validation import Params, parse_params

SOURCE = "conf/base/parameters_report.yml"

# A sampling seed (report.references.seed, report.decoding[].seed, predict.seed). torch takes 0 .. 2**64 - 1
# and reads a negative seed modulo 2**64 (-1 draws as 2**64 - 1 does); past 64 bits it raises. int64's
# range leaves room for the seed + chunk predict's chunks sample with; train.seed is never negative either.
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]


class DecodingSetting(Params):
    name: str = Field(min_length=1)
    do_sample: bool = False
    temperature: float | None = Field(None, gt=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    num_beams: int | None = Field(None, ge=1)
    repetition_penalty: float | None = Field(None, gt=0)
    no_repeat_ngram_size: int | None = Field(None, ge=1)
    length_penalty: float | None = None
    min_new_tokens: int | None = Field(None, ge=0)
    seed: Seed = 0


class DecodingParams(Params):
    """One decoding set-up for ``generate`` (greedy, sampling, beam search with penalties), shared by
    ``report.references`` and ``predict``: a setting tuned against ROUGE in the report is copied as it is."""

    num_beams: int = Field(1, ge=1)
    do_sample: bool = False
    temperature: float = Field(1.0, description="sampling only; above 0")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float = Field(1.0, gt=0)
    no_repeat_ngram_size: int = Field(0, ge=0)
    length_penalty: float = Field(1.0, description="beam search only: > 1 favours longer outputs")

    @field_validator("temperature")
    @classmethod
    def _temperature_above_zero(cls, value: float) -> float:
        # vLLM's and the OpenAI API's temperature 0 is greedy decoding: the refusal says what is greedy here
        if not value > 0:  # NaN too
            raise ValueError(
                "a temperature must be above 0 (a temperature of 0, greedy decoding in vLLM and the OpenAI "
                "API, is do_sample: false here, the default)"
            )
        return value

    def unused(self) -> tuple[dict, dict]:
        """(sampling settings set though ``do_sample`` is false, a length penalty set though ``num_beams`` is
        1): away from their "off" value, yet dropped before ``generate`` (``decoding_kwargs``), so
        transformers' own warning never comes; {name: value} each, empty where none."""
        sampling = {}
        if not self.do_sample:
            off = {"temperature": 1.0, "top_p": 1.0, "top_k": None}
            sampling = {
                name: getattr(self, name) for name, value in off.items() if getattr(self, name) != value
            }
        beams = (
            {"length_penalty": self.length_penalty}
            if self.num_beams == 1 and self.length_penalty != 1.0
            else {}
        )
        return sampling, beams

    def decoding(self) -> dict:
        """The decoding settings (``fastlm.engine.evaluate.generation.decoding_kwargs`` arguments)."""
        return self.model_dump(
            include={
                "num_beams",
                "do_sample",
                "temperature",
                "top_p",
                "top_k",
                "repetition_penalty",
                "no_repeat_ngram_size",
                "length_penalty",
            }
        )


class ReferenceParams(DecodingParams):
    """Generation on the test split and ROUGE against the references (prompt/response data only)."""

    enabled: Literal["auto", True, False] = Field(
        "auto", description="auto: when the data has prompt/response"
    )
    max_samples: int | None = Field(200, ge=1, description="hash-selected test samples; null: all")
    batch_size: int = Field(16, ge=1)
    max_new_tokens: int = Field(64, ge=1)
    seed: Seed = 0
    rouge_tokenizer: Literal[TOKENIZERS] = "auto"  # type: ignore[valid-type]


class ReportParams(Params):
    eval_max_batches: int | None = Field(None, ge=1, description="null: the whole test split")
    top_k: int = Field(5, ge=1)
    worst_samples: int = Field(10, ge=1)
    error_pairs: int = Field(20, ge=1)
    prompts: list[str] = ["", "배송", "The battery", "가격 대비"]
    max_new_tokens: int = Field(40, ge=1)
    decoding: list[DecodingSetting] = [
        DecodingSetting(name="greedy"),
        DecodingSetting(name="sampled", do_sample=True, temperature=0.8, top_p=0.95),
    ]
    compare_runs: int = Field(20, ge=1, description="latest MLflow training runs in the comparison table")
    references: ReferenceParams = ReferenceParams()

    @field_validator("prompts")
    @classmethod
    def _cleaned(cls, prompts: list[str]) -> list[str]:
        # as the split cleans the training texts (normalize_text: NFC, LF line ends, no invisible marks): a
        # prompt saved decomposed, or with the CRLF of a file edited on Windows, would tokenize otherwise. Not
        # stripped: a plain-text prompt's trailing space is part of what the model continues.
        return [normalize_text(prompt) for prompt in prompts]


def check_top_k(top_k: int, vocab_size: int) -> None:
    """``report.top_k`` below the vocabulary the model predicts over: with ``vocab_size`` ids or more every
    target is among the top k, and the top-k accuracy would read 1.000 whatever the model."""
    if top_k >= vocab_size:
        raise ConfigError(
            f"report.top_k = {top_k} is not below the model's vocabulary of {vocab_size:,} token ids: every "
            "target would be in the top k (accuracy 1.000 whatever the model).",
            fix=f"set report.top_k below {vocab_size} in {SOURCE} or --params report.top_k=5.",
        )


def check_id_prompts(prompts: list[str], vocab_size: int) -> None:
    """Pre-tokenized data: each of ``report.prompts`` is ids ``0 .. vocab_size - 1`` written as the data
    writes them (decimal, no leading zeros: ``corpus.pretokenized.id_word``, the rule predict reads its rows
    by), separated by spaces; its tokenizer reads other words as EOS."""
    known = range(vocab_size)
    for index, prompt in enumerate(prompts):
        for word in prompt.split():
            number = id_word(word)
            if number is None or number not in known:
                raise ConfigError(
                    f"report.prompts[{index}] = {prompt!r}: {word!r} is not an id of the pre-tokenized data "
                    f"(0 .. {vocab_size - 1}), and its tokenizer would read it as EOS.",
                    fix=f'write each prompt as ids 0 .. {vocab_size - 1} separated by spaces (e.g. "9 10"; '
                    f'"" starts from EOS) in {SOURCE} or --params \'report.prompts=["9 10"]\'.',
                )


def parse_report_params(raw) -> ReportParams:
    return parse_params(ReportParams, raw, prefix="report", source=SOURCE)
