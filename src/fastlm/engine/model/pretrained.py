"""What a pretrained folder holds, loading it whole, and fitting its vocabulary to the tokenized data.

One place decides what a checkpoint is: ``checkpoint_kind`` reads its config (``is_encoder_decoder``,
``is_decoder``, ``architectures``, ``model_type``, a remote-code ``auto_map``) and says causal LM,
encoder-decoder (seq2seq), encoder-only / masked LM, or unknown. ``TRAINABLE`` maps the kinds fastlm trains to
the transformers auto class that builds them: causal LMs, and encoder-decoder models (BART, mBART, T5
families), which train on prompt/response data (the prompt feeds the encoder, the response is the decoder
target: ``data.Seq2SeqCollator``); every other kind is refused with one line.

Weights load whole: the folder's weight files are opened first (a cut-off file is named), then
``from_pretrained(..., output_loading_info=True)`` reports missing, unexpected and size-mismatched keys.
transformers already leaves the benign ones out of that report (tied output embeddings, non-persistent
buffers, each model's ``_keys_to_ignore_on_load_*``), so anything left is an error naming the first keys and
the folder, unless ``train.model.allow_new_weights`` is true (a deliberate new head), which logs them.

The vocabulary check tells the truth about which side is wrong: a tokenizer that is not the folder's own
(different ids) is told to tokenize with the model's tokenizer; the model's own tokenizer (or an extension of
it) larger than the embedding is told to resize explicitly (``train.model.resize_embeddings: true``, which
resizes and logs) or to fix the folder.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastlm.errors import ConfigError, FastlmError

log = logging.getLogger(__name__)

PARAM = "train.model.name_or_path"
NEW_WEIGHTS_PARAM = "train.model.allow_new_weights"
RESIZE_PARAM = "train.model.resize_embeddings"
CAUSAL_LM = "causal LM"
SEQ2SEQ = "encoder-decoder (seq2seq) model"
ENCODER = "encoder-only or masked LM"
UNKNOWN = "unknown kind of model"
# The kinds fastlm trains, and the transformers auto class that builds each.
TRAINABLE = {CAUSAL_LM: "AutoModelForCausalLM", SEQ2SEQ: "AutoModelForSeq2SeqLM"}
FIX_CAUSAL = (
    f"point {PARAM} at a causal LM folder (e.g. a Llama, Qwen, Gemma or GPT-2 family model) or an "
    "encoder-decoder one (BART, T5)"
)
WEIGHT_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
)


@dataclass(frozen=True)
class PretrainedFolder:
    """A pretrained folder (or hub id) and what its config says it is."""

    source: str  # as the user wrote it, for messages
    location: str  # what from_pretrained gets: an absolute folder or a hub id
    label: str  # how messages name it, e.g. "train.model.name_or_path = './models/x'"
    config: Any
    kind: str

    @property
    def model_type(self) -> str:
        return getattr(self.config, "model_type", None) or "?"

    @property
    def architecture(self) -> str:
        return (
            next(iter(getattr(self.config, "architectures", None) or []), None) or f"{self.model_type} model"
        )

    def file(self, name: str) -> str:
        return f"{self.source.rstrip('/')}/{name}"


def _class_names(mapping) -> set[str]:
    names: set[str] = set()
    for value in mapping.values():
        names.update(value if isinstance(value, (tuple, list)) else [value])
    return names


def checkpoint_kind(config) -> str:
    """The one place that decides what a checkpoint is (see the module docstring)."""
    from transformers.models.auto import modeling_auto as auto

    causal, seq2seq, masked = (
        auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )
    model_type = getattr(config, "model_type", None)
    architectures = set(getattr(config, "architectures", None) or [])
    auto_map = getattr(config, "auto_map", None) or {}
    if getattr(config, "is_encoder_decoder", False):
        return SEQ2SEQ
    # BERT-like families have a causal head class too, but only a config that says it is a decoder attends
    # causally; a masked LM loaded into that class would see every position (the loss would mean nothing).
    decoder = getattr(config, "is_decoder", False) or getattr(config, "causal", False)
    if model_type in masked and not decoder:
        return ENCODER
    if architectures & _class_names(causal) or "AutoModelForCausalLM" in auto_map:
        return CAUSAL_LM
    if architectures & _class_names(seq2seq) or "AutoModelForSeq2SeqLM" in auto_map:
        return SEQ2SEQ
    if architectures & _class_names(masked) or "AutoModelForMaskedLM" in auto_map:
        return ENCODER
    if model_type in causal:  # e.g. a LlamaModel or a classifier: the head check below decides
        return CAUSAL_LM
    if model_type in seq2seq:
        return SEQ2SEQ
    return UNKNOWN


def inspect_checkpoint(
    source: str, location: str, *, trust_remote_code: bool = False, label: str | None = None, **config_args
) -> PretrainedFolder:
    """Read the config of ``location`` (a folder or hub id) into a ``PretrainedFolder``; a missing, cut-off or
    unknown config is one line naming the file."""
    from transformers import AutoConfig, __version__

    label = label or f"{PARAM} = {source!r}"
    shown = f"{source.rstrip('/')}/config.json"
    model_type = None
    if Path(location).is_dir():
        config_file = Path(location) / "config.json"
        if not config_file.is_file():
            raise ConfigError(
                f"{label}: {shown} does not exist, so this is not a complete model folder.",
                fix=f"point {PARAM} at a folder written by save_pretrained (config.json and weights).",
            )
        try:
            raw = json.loads(config_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as error:
            raise ConfigError(
                f"{label}: {shown} is not valid JSON ({error}), a cut-off or edited file.",
                fix="restore config.json from the model's original folder.",
            ) from error
        if not isinstance(raw, dict):
            raise ConfigError(
                f"{label}: {shown} is not valid JSON for a model config (not an object).",
                fix="restore config.json from the model's original folder.",
            )
        model_type = raw.get("model_type")
    try:
        config = AutoConfig.from_pretrained(location, trust_remote_code=trust_remote_code, **config_args)
    except Exception as error:  # noqa: BLE001 - transformers raises ValueError, KeyError, OSError here
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        if not Path(location).is_dir():  # a hub id: not found, offline, no access ...
            raise ConfigError(
                f"{label}: the model config could not be read ({first})",
                fix=f"check the hub id, or download the model once and point {PARAM} at its folder.",
            ) from error
        raise ConfigError(
            f"{label}: model type {model_type!r} in {shown} is not one transformers {__version__} can build "
            f"({first})",
            fix="use a checkpoint of a family transformers knows, upgrade transformers, or set "
            "train.model.trust_remote_code: true for a folder that ships its own modeling code.",
        ) from error
    return PretrainedFolder(
        source=source, location=location, label=label, config=config, kind=checkpoint_kind(config)
    )


def trained_class(name_or_path: str | None, trust_remote_code: bool = False) -> type | None:
    """The class a run trains, from the folder's config alone (the attention choice needs it before the
    weights load): the from-config Llama for None; None where it cannot be told so (a hub id, remote code,
    a folder that does not load: the build says what is wrong)."""
    return trained_class_and_config(name_or_path, trust_remote_code)[0]


def trained_class_and_config(name_or_path: str | None, trust_remote_code: bool = False) -> tuple:
    """:func:`trained_class` and the folder's config (None for the from-config Llama and where the class is
    None)."""
    import transformers

    if name_or_path is None:
        return transformers.LlamaForCausalLM, None
    local = Path(name_or_path).expanduser()
    if trust_remote_code or not (local / "config.json").is_file():
        return None, None
    try:
        checkpoint = inspect_checkpoint(name_or_path, str(local.resolve()), local_files_only=True)
        auto_class = getattr(transformers, require_trainable(checkpoint))
        return auto_class._model_mapping[type(checkpoint.config)], checkpoint.config
    except Exception:  # noqa: BLE001 - any reason: the build reports it in its own words
        return None, None


def require_trainable(checkpoint: PretrainedFolder) -> str:
    """The auto class that trains ``checkpoint``; any other kind is refused with one line."""
    if checkpoint.kind in TRAINABLE:
        return TRAINABLE[checkpoint.kind]
    what = (
        f"{checkpoint.label} holds a {checkpoint.architecture} (model type {checkpoint.model_type}), "
        f"an {checkpoint.kind}"
    )
    reason = (
        "its attention sees every position, so a next-token loss would mean nothing"
        if checkpoint.kind == ENCODER
        else "fastlm finds no causal LM or seq2seq class for it in transformers"
    )
    raise ConfigError(f"{what}: {reason}; fastlm trains causal and seq2seq LMs.", fix=FIX_CAUSAL + ".")


def check_weight_files(checkpoint: PretrainedFolder) -> None:
    """A local folder has weights, and each safetensors file opens (a cut-off or garbled file is named)."""
    folder = Path(checkpoint.location)
    if not folder.is_dir():
        return
    restore = "restore the folder's weight files from the original model (re-download or re-save it)."
    if not any(any(folder.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        raise ConfigError(
            f"{checkpoint.label} has no weights (no model.safetensors, sharded index or "
            "pytorch_model.bin next to config.json).",
            fix=restore,
        )
    check_safetensors(folder, checkpoint.source, fix=restore)


def check_safetensors(folder: str | Path, shown: str, *, fix: str) -> None:
    """Each safetensors file of ``folder`` opens (its header and size agree); else one line naming it."""
    from safetensors import safe_open

    for path in sorted(Path(folder).glob("*.safetensors")):
        try:
            with safe_open(str(path), framework="pt"):
                pass
        except Exception as error:  # noqa: BLE001 - SafetensorError, OSError
            raise ConfigError(
                f"{str(shown).rstrip('/')}/{path.name} is unreadable ({error}): a cut-off or edited file.",
                fix=fix,
            ) from error


def load_pretrained(
    checkpoint: PretrainedFolder,
    *,
    allow_new_weights: bool = False,
    new_weights_param: str | None = NEW_WEIGHTS_PARAM,
    **load_args,
):
    """The model of ``checkpoint`` as the class its kind trains as, with every weight from the folder.

    ``load_args`` go to ``from_pretrained`` (dtype, attention, quantization, trust_remote_code ...).
    """
    import torch
    import transformers

    auto_class = getattr(transformers, require_trainable(checkpoint))
    check_weight_files(checkpoint)
    try:
        with _without_load_report():
            model, info = auto_class.from_pretrained(
                checkpoint.location, output_loading_info=True, ignore_mismatched_sizes=True, **load_args
            )
    except (FastlmError, torch.OutOfMemoryError, MemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - OSError, ValueError, RuntimeError, SafetensorError ...
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        attention = load_args.get("attn_implementation")
        if attention and attention in first and "support" in first:  # a path the class does not have
            fix = "set train.model.attn_implementation: auto (it takes a path the model has) or eager."
        else:
            fix = "check that the folder is a complete save_pretrained model (config.json and every weight "
            fix += "file)."
        raise ConfigError(
            f"{checkpoint.label} could not be loaded as a {checkpoint.kind}: {first}", fix=fix
        ) from error
    _check_loaded_whole(
        checkpoint, model, info, allow_new_weights=allow_new_weights, new_weights_param=new_weights_param
    )
    return model


class _DropLoadReport(logging.Filter):
    """transformers' multi-line LOAD REPORT: ``_check_loaded_whole`` says the same in one line (or one
    warning)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in record.getMessage()


@contextlib.contextmanager
def _without_load_report():
    library = logging.getLogger("transformers")  # the report reaches the library logger's own handlers
    handlers = list(library.handlers)
    drop = _DropLoadReport()
    for handler in handlers:
        handler.addFilter(drop)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop)


def _check_loaded_whole(
    checkpoint: PretrainedFolder, model, info: dict, *, allow_new_weights: bool, new_weights_param: str | None
) -> None:
    groups = [  # (what, what loading with allow_new_weights does to them, keys)
        ("missing from the checkpoint", "newly initialised", sorted(info.get("missing_keys") or ())),
        ("in the checkpoint but unused by the model", "dropped", sorted(info.get("unexpected_keys") or ())),
        (
            "of another shape than the model's",
            "newly initialised",
            sorted(key for key, *_ in info.get("mismatched_keys") or ()),
        ),
    ]
    if not any(keys for *_, keys in groups):
        return

    def summary(with_effect: bool) -> str:
        return "; ".join(
            f"{len(keys)} {what}{f', {effect}' if with_effect else ''}: {', '.join(keys[:3])}"
            f"{', ...' if len(keys) > 3 else ''}"
            for what, effect, keys in groups
            if keys
        )

    if allow_new_weights:
        log.warning(
            "%s into %s with %s = true: %s",
            checkpoint.label,
            type(model).__name__,
            new_weights_param,
            summary(True),
        )
        return
    fix = "restore the folder's weight files from the original model (a cut-off or edited safetensors)"
    if new_weights_param:
        fix += f", or set {new_weights_param}: true if a new head is deliberate"
    raise ConfigError(
        f"{checkpoint.label} does not load whole into {type(model).__name__}: {summary(False)}.",
        fix=fix + ".",
    )


# ------------------------------------------------------------------------------------------------ vocabulary


def folder_vocabulary(location: str | Path) -> dict[str, int] | None:
    """The vocabulary of the tokenizer saved in a folder, or None when it has none (or it does not load)."""
    from transformers import AutoTokenizer

    folder = Path(location)
    if not folder.is_dir() or not any(
        (folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")
    ):
        return None
    try:
        return AutoTokenizer.from_pretrained(str(folder), local_files_only=True).get_vocab()
    except Exception as error:  # noqa: BLE001 - an unloadable tokenizer: nothing to compare
        log.debug("Could not load the tokenizer of %s: %s", folder, error)
        return None


def tokenizer_relation(location: str, tokenizer) -> str | None:
    """``same`` / ``extends`` (the folder's tokens, same ids, plus more) / ``other``, or None when the folder
    has no tokenizer to compare with."""
    own = folder_vocabulary(location)
    if own is None:
        return None
    used = tokenizer.get_vocab()
    if used == own:
        return "same"
    return "extends" if own.items() <= used.items() else "other"


def fit_vocabulary(
    checkpoint: PretrainedFolder, model, tokenizer, *, resize: bool, frozen_embeddings: bool = False
) -> None:
    """Refuse a tokenizer the model cannot embed, with the hint that fits; resize when asked (and logged)."""
    vocab = model.get_input_embeddings().num_embeddings
    relation = tokenizer_relation(checkpoint.location, tokenizer)
    retokenize = (
        f"tokenize with the model's own tokenizer: set split.tokenizer.source: {checkpoint.source} and "
        "rerun `kedro run --pipeline=split`"
    )
    if relation == "other":
        raise ConfigError(
            f"the tokenized data was made with a tokenizer ({len(tokenizer)} tokens) that is not the model's "
            f"own: the tokenizer in {checkpoint.source} gives other ids, so the pretrained embeddings would "
            "mean nothing.",
            fix=retokenize + ".",
        )
    if len(tokenizer) <= vocab:
        if relation is None and Path(checkpoint.location).is_dir():  # a local folder of weights alone
            log.warning(
                "%s holds no tokenizer to compare the data's with (%d tokens): it is taken to be the "
                "model's own; one of other ids would train on embeddings that mean other tokens (a first "
                "loss far above ln(vocab) says so). Set split.tokenizer.source to the folder of the model's "
                "tokenizer, or save it beside the weights, to have it checked.",
                checkpoint.source,
                len(tokenizer),
            )
        return
    grow = (
        f"set {RESIZE_PARAM}: true to grow the embedding to {len(tokenizer)} rows (the new rows are trained)"
    )
    if not resize:
        if relation is None:
            fix = f"{retokenize}; if it already is the model's own tokenizer, {grow}."
            what = "tokenizer and model vocabularies disagree"
        else:
            fix = (
                f"{grow}, or fix {checkpoint.source} (its tokenizer and weights come from different "
                "versions)."
            )
            what = f"the model's own tokenizer is larger than the embedding of {checkpoint.source}"
        raise ConfigError(
            f"the tokenizer has {len(tokenizer)} tokens but the model's embedding has {vocab}: {what}.",
            fix=fix,
        )
    if frozen_embeddings:
        raise ConfigError(
            f"{RESIZE_PARAM} is true but LoRA keeps the embedding frozen: its {len(tokenizer) - vocab} new "
            "rows would stay random.",
            fix="add the embedding and output modules to train.model.lora.modules_to_save "
            f"(e.g. [embed_tokens, lm_head]), or set {RESIZE_PARAM}: false and tokenize with the model's own "
            "tokenizer.",
        )
    model.resize_token_embeddings(len(tokenizer))
    log.warning(
        "Resized the embedding of %s from %d to %d tokens (%s = true): rows %d..%d are new and trained.",
        checkpoint.source,
        vocab,
        len(tokenizer),
        RESIZE_PARAM,
        vocab,
        len(tokenizer) - 1,
    )


def embedding_module_names(model) -> set[str]:
    """The last name component of the input embedding and the output head (what ``modules_to_save`` names)."""
    targets = {
        id(module) for module in (model.get_input_embeddings(), model.get_output_embeddings()) if module
    }
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if id(module) in targets}
