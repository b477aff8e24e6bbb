"""Parameters of the tune pipeline (``params:tune`` in conf/base/parameters_tune.yml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fastlm.validation import Params, parse_params

SOURCE = "conf/base/parameters_tune.yml"


class TuneParams(Params):
    min_micro_batch_size: int = Field(1, ge=1)
    max_micro_batch_size: int = Field(64, ge=1)
    target_effective_batch: int | None = Field(None, ge=1, description="samples per optimizer step")
    warmup_steps: int = Field(1, ge=0)
    timed_steps: int = Field(2, ge=1)
    memory_headroom: float = Field(0.10, ge=0, lt=1)
    memory_limit_gb: float | None = Field(
        None, gt=0, description="tune for a card of this size; null: this one"
    )
    cliff_tolerance: float = Field(0.05, ge=0, lt=1)
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="no new trial, mode or checkpointing policy after this long (each ladder's first size "
        "excepted); the explanation names what it left out; null: no limit",
    )
    # batching modes to measure, each over the size ladder; the fastest (mode, size) is written. Empty or
    # null: train.batching.mode only.
    modes: list[Literal["packed", "length_grouped", "dynamic"]] | None = Field(
        default_factory=lambda: ["packed", "length_grouped"]
    )

    @model_validator(mode="after")
    def _ordered(self) -> TuneParams:
        if self.min_micro_batch_size > self.max_micro_batch_size:
            raise ValueError("min_micro_batch_size must not exceed max_micro_batch_size")
        return self


def parse_tune_params(raw) -> TuneParams:
    return parse_params(TuneParams, raw, prefix="tune", source=SOURCE)
