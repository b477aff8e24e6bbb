"""The common start of the nodes that train or evaluate a model: validate ``params:train`` and
``params:split`` (through the parameter registry), check that the tokenized data still matches the tokenizer
and the split parameters, and apply the runtime settings. One function, so the four nodes cannot drift
apart."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastlm.corpus.fingerprint import check_fresh, check_tokenized
from fastlm.corpus.tokenizer_source import check_model_tokenizer
from fastlm.parameters import parse_group

if TYPE_CHECKING:
    from fastlm.corpus.config import SplitParams
    from fastlm.engine.config import TrainParams
    from fastlm.engine.runtime.environment import Runtime

# the catalog entry whose freshness is checked (named in the error by its path)
TOKENIZED = "tokenized_corpus"


@dataclass(frozen=True)
class NodeStart:
    train: TrainParams
    split: SplitParams
    runtime: Runtime | None  # None when the node left the runtime to the engine (training sets it per rank)


def start_node(
    train_params: Any,
    split_params: Any,
    *,
    fingerprint: dict | None = None,
    tokenizer=None,
    tokenized=None,
    paths: dict | None = None,
    runtime: bool = True,
    runtime_said: bool = False,
) -> NodeStart:
    """Validated train and split parameters; the freshness check when ``fingerprint`` is given (a stale
    ``tokenized_corpus`` is one StaleDataError line naming its path from ``paths``); the runtime applied
    (``train.runtime`` as validated, ``train.seed``) unless ``runtime`` is false; ``tokenized``: the
    tokenized splits, each compared with the rows and tokens the split recorded; ``runtime_said``: an
    earlier node of the pipeline logged the runtime line (``setup_runtime(said=...)``)."""
    train, split = parse_group("train", train_params), parse_group("split", split_params)
    if fingerprint is not None or tokenizer is not None:
        check_fresh(fingerprint, tokenizer, split, where=(paths or {}).get(TOKENIZED, TOKENIZED))
    if tokenized is not None:
        check_tokenized(fingerprint, tokenized, where=(paths or {}).get(TOKENIZED, TOKENIZED))
    if tokenizer is not None and train.model.name_or_path is not None:
        check_model_tokenizer(train.model.name_or_path, tokenizer)
    applied = None
    if runtime:
        from fastlm.engine.runtime.environment import (
            setup_runtime,  # imports torch: only for nodes that compute
        )

        applied = setup_runtime(train.runtime, seed=train.seed, said=runtime_said)
    return NodeStart(train, split, applied)
