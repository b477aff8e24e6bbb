"""Get the tokenizer: train a byte-level BPE on the train split, or load a local directory / hub id."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from fastlm.corpus.tokenization import cut_long_texts
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
PARAM = "split.tokenizer.source"
FIX_SOURCE = (
    f"set {PARAM} to 'train', to a local tokenizer directory, or to a hub id with "
    "split.tokenizer.allow_download: true"
)


TRAINED_HERE = "fastlm_trained"  # a tokenizer_config.json key: the split trained this tokenizer


def train_bpe_tokenizer(texts: Sequence[str], *, vocab_size: int, min_frequency: int, model_max_length: int):
    """A byte-level BPE (GPT-2 style, no unknown tokens) trained on ``texts``; EOS doubles as pad.

    The pad id never reaches the loss: labels come from sample boundaries, so EOS is still learned. Each text
    is cut to what ``model_max_length`` tokens can use, as tokenization cuts it (``cut_long_texts``): one
    50 MB line costs memory for its first characters, not gigabytes of BPE word counts.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts, _ = cut_long_texts(texts, model_max_length)
    backend.train_from_iterator(texts, trainer=trainer, length=len(texts))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="right",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.init_kwargs[TRAINED_HERE] = True  # saved in tokenizer_config.json; no part of the ids' digest
    if len(tokenizer) < vocab_size:  # not a fault (the model's embedding follows the tokenizer): said why
        log.info(
            "The BPE learned %d of the %d tokens split.tokenizer.vocab_size asks: every pair seen at least "
            "%d times (split.tokenizer.min_frequency) was merged before that; a larger corpus learns more",
            len(tokenizer),
            vocab_size,
            min_frequency,
        )
    return tokenizer


BUILT_WITH = (
    "fastlm_split_tokenizer"  # a tokenizer_config.json key: the split.tokenizer settings it came from
)


def tokenizer_settings(config) -> dict:
    """The ``split.tokenizer`` settings (``TokenizerParams``) that decide which tokenizer the split saves: its
    source, and for a BPE the split trains, the settings of that training."""
    from fastlm.corpus.config import TRAIN_TOKENIZER

    if config.source != TRAIN_TOKENIZER:
        return {"source": _folder_named(config.source)}
    return {
        "source": TRAIN_TOKENIZER,
        "vocab_size": config.vocab_size,
        "min_frequency": config.min_frequency,
        "training_samples": config.training_samples,
    }


def _folder_named(source: str) -> str:
    """A local tokenizer folder as one name however it is written (``models/base``, ``./models/base``, its
    absolute path): resolved, relative to the working folder (the project's) where inside it, so a project
    moved with its models keeps the name. A hub id or a name that is no folder here: as written."""
    path = Path(source)
    if not path.is_dir():
        return source
    folder, here = path.resolve(), Path.cwd().resolve()
    return (folder.relative_to(here) if folder.is_relative_to(here) else folder).as_posix()


def record_settings(tokenizer, config) -> None:
    """Record in ``tokenizer`` (its saved ``tokenizer_config.json``; no part of the ids' digest) the
    ``split.tokenizer`` settings it was built or loaded with, replacing any a loaded folder carried."""
    tokenizer.init_kwargs[BUILT_WITH] = tokenizer_settings(config)


def settings_changes(tokenizer, config) -> list[str]:
    """The ``split.tokenizer`` settings that differ from those ``tokenizer`` was made with, each as
    ``split.tokenizer.<name> <was> -> <now>``; none for a tokenizer that records none (saved before they were
    recorded, or not made by a split). Train, the report and a run of the split's later nodes read the saved
    tokenizer, not one built from these settings: a changed one would be logged but never used."""
    made = getattr(tokenizer, "init_kwargs", {}).get(BUILT_WITH)
    if not isinstance(made, dict):
        return []
    now = tokenizer_settings(config)
    return [
        f"split.tokenizer.{name} {made.get(name)!r} -> {now.get(name)!r}"
        for name in {**made, **now}
        if made.get(name) != now.get(name)
    ]


def trained_here(tokenizer) -> bool:
    """Whether ``tokenizer`` is one the split trained (``train_bpe_tokenizer``), not a model's own."""
    return bool(getattr(tokenizer, "init_kwargs", {}).get(TRAINED_HERE))


def check_model_tokenizer(name_or_path: str, tokenizer) -> None:
    """Refuse pretrained weights without tokenizer files (nothing the engine can compare the data's tokenizer
    with) on data tokenized by a tokenizer the split trained: its ids mean nothing to those embeddings."""
    folder = Path(name_or_path).expanduser()
    if not trained_here(tokenizer) or not (folder / "config.json").is_file() or has_vocabulary_files(folder):
        return
    raise ConfigError(
        f"the tokenized data was made with a tokenizer the split trained ({PARAM}: train), and "
        f"train.model.name_or_path = {name_or_path!r} holds no tokenizer to compare with: its pretrained "
        "embeddings were trained on ids that mean something else.",
        fix=f"set {PARAM} to the folder that holds the model's tokenizer files and rerun "
        "`kedro run --pipeline=split`.",
    )


def load_tokenizer(
    source: str, *, allow_download: bool = False, trust_remote_code: bool = False, warn: bool = True
):
    """Load ``source`` (local directory, or hub id when downloads are allowed) with clear errors; ``warn``
    False leaves the missing pad token unsaid (a caller that loads it again, for the data, says it)."""
    from transformers import AutoTokenizer

    local = Path(source).expanduser()
    looks_like_path = local.is_absolute() or source.startswith((".", "~")) or local.exists()
    if looks_like_path and not local.is_dir():
        raise ConfigError(f"{PARAM} = {source!r}: no such tokenizer directory.", fix=FIX_SOURCE + ".")
    if not local.is_dir() and not allow_download:
        raise ConfigError(
            f"{PARAM} = {source!r} is not a local directory and downloads are off.",
            fix=f"download it once and point {PARAM} at the folder, or set "
            "split.tokenizer.allow_download: true.",
        )
    if local.is_dir() and not has_vocabulary_files(local):
        raise ConfigError(
            f"{PARAM} = {source!r} holds no tokenizer (no tokenizer.json, vocabulary, merges or "
            "sentencepiece file): a model folder's config.json alone makes an empty one.",
            fix=f"point {PARAM} at the folder that holds the model's tokenizer files, or save them into it "
            "(tokenizer.save_pretrained).",
        )
    if not local.is_dir():
        os.environ["HF_HUB_OFFLINE"] = "0"  # explicit opt-in for this process
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(local) if local.is_dir() else source, trust_remote_code=trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - transformers raises many types here
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"{PARAM} = {source!r} could not be loaded as a tokenizer: {first_line}", fix=FIX_SOURCE + "."
        ) from exc
    check_has_vocabulary(tokenizer, f"{PARAM} = {source!r}", FIX_SOURCE + ".")
    return prepare_for_training(tokenizer, source, warn=warn)


def has_vocabulary_files(folder: Path) -> bool:
    """Whether ``folder`` holds a saved tokenizer: its tokenizer_config.json or tokenizer.json, a vocabulary
    or merges file, a sentencepiece or tiktoken model (a byte-level tokenizer such as ByT5's has its config
    alone). Without any, transformers builds an empty tokenizer from a model's config.json."""
    for path in Path(folder).iterdir():
        name = path.name.lower()
        if path.is_file() and (
            name in ("tokenizer.json", "tokenizer_config.json")
            or "vocab" in name
            or "merges" in name
            or name.endswith((".model", ".tiktoken", ".spm"))
        ):
            return True
    return False


def check_has_vocabulary(tokenizer, where: str, fix: str) -> None:
    """Refuse a tokenizer that holds its special tokens alone (an empty one made from a model's config)."""
    if len(tokenizer) <= len(set(tokenizer.all_special_ids)):
        raise ConfigError(
            f"{where} holds no tokenizer vocabulary ({len(tokenizer)} token ids, its special tokens).",
            fix=fix,
        )


def prepare_for_training(tokenizer, source: str = "tokenizer", *, warn: bool = True):
    """Right padding, and EOS as pad when the tokenizer has no pad token (one warning); the backend's own
    padding and truncation (set in a tokenizer.json, e.g. fixed 128 in BERT-family folders) turned off, so
    neither reaches the data nor the tokenizer split saves: fastlm pads nothing, cuts at split.max_length."""
    if tokenizer.eos_token_id is None:
        raise ConfigError(
            f"{PARAM} = {source!r} has no EOS token, which fastlm appends to every sample.",
            fix="use a tokenizer that defines eos_token (or add one to its special_tokens_map.json).",
        )
    if tokenizer.pad_token_id is None:
        (log.warning if warn else log.debug)(
            "Tokenizer %s has no pad token; EOS (%r) pads, and stays in the loss.",
            source,
            tokenizer.eos_token,
        )
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_padding()
        backend.no_truncation()
    return tokenizer
