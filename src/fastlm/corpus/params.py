"""Parameters of the split pipeline (``params:split`` in conf/base/parameters_split.yml)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from fastlm.config import Params, parse_params

SOURCE = "conf/base/parameters_split.yml"
TRAIN_TOKENIZER = "train"


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
        200_000, ge=1, description="train the BPE on at most this many train texts (hash-selected)"
    )
    allow_download: bool = False
    trust_remote_code: bool = False


class SplitParams(Params):
    text_column: str = Field("text", min_length=1)
    ratios: SplitRatios = SplitRatios()
    max_samples: int | None = Field(None, ge=1)
    hash_salt: str = Field("", max_length=64, description="changing it re-draws every split")
    max_length: int = Field(320, ge=2, description="tokens per sample, EOS included")
    tokenizer: TokenizerParams = TokenizerParams()
    batch_size: int = Field(20_000, ge=1, description="texts per tokenizer call")
    num_proc: int | Literal["auto"] = "auto"

    @field_validator("num_proc")
    @classmethod
    def _positive(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be 'auto' or a whole number >= 1")
        return value


def parse_split_params(raw) -> SplitParams:
    return parse_params(SplitParams, raw, prefix="split", source=SOURCE)
