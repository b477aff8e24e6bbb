"""The LoRA adapter folder on disk: saving it, the record of the base weights it trains on, loading it onto
its base and merging it into a full model.

Saving (``save_adapter``): ``PeftModel.save_pretrained`` writes ``adapter_config.json`` and
``adapter_model.safetensors``; the config names the base folder (an absolute path, so the adapter loads from
anywhere), and ``base_digest.json`` (``BASE_DIGEST``, taken when the model is built: ``remember_base``,
written by ``write_base_digest``) records the base weights it trains on (``base_weights_digest``) and a
4-bit base's quantization: loading or merging the adapter onto a base folder whose weights changed since is
refused in one line (``check_base``; an adapter saved without one loads with one warning). An
encoder-decoder adapter keeps the generation config it trained with (``save_generation_config``); one saved
without it is given it rebuilt where fastlm's train pipeline saved it, else its base's
(``adapter_generation_config``).

Loading (``load_adapter_model``): the base found where it lay relative to the adapter (``adapter_base``),
checked, a QLoRA adapter's base rebuilt as the 4-bit weights it trained on (``as_trained_in_4bit``), tied
weights untied where an adapter sits on one of them. ``merge_adapter`` folds the adapters into the base
weights (in fp32) and returns a plain transformers model in the base folder's saved dtype (``saved_dtype``;
``save_pretrained`` it for a full model folder: ``python -m fastlm merge-adapter``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import warnings
from pathlib import Path

import torch

from fastlm.engine.config import MERGE_DTYPES
from fastlm.engine.model.lora import PARAM, initial_adapters
from fastlm.engine.model.weights_identity import base_weights_digest, safetensors_index
from fastlm.engine.paths import project_relative
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
GENERATION_CONFIG = "generation_config.json"  # an encoder-decoder adapter's: how it generates as it trained


def save_generation_config(peft_model, folder: Path) -> None:
    """An encoder-decoder's generation config into its adapter folder: how it generates as it trained
    (``encoder_decoder.generate_as_trained``: the decoder start token and a forced BOS, which the base's own
    config may lack); ``load_adapter_model`` gives it to the base the adapter is loaded or merged into."""
    base = peft_model.get_base_model()
    generation = getattr(base, "generation_config", None)
    if generation is not None and getattr(base.config, "is_encoder_decoder", False):
        generation.save_pretrained(str(folder))


_said_rebuilt: set[str] = set()


def adapter_generation_config(model, folder: str | Path) -> None:
    """``model`` (the base of the adapter in ``folder``) gets the generation config saved with the adapter
    (``save_generation_config``), where the folder holds one. An encoder-decoder adapter folder fastlm's
    train pipeline saved without one (an earlier fastlm: its ``TRAINING_RECORD``) gets the setting its
    training used, rebuilt from what the folder holds: the base's decoder start and the tokens the folder's
    tokenizer puts before a text (``TextEnds.head``, as ``batching.seq2seq_batching`` gives them to
    ``generate_as_trained``); one saved elsewhere (peft's ``save_pretrained``, another tool), whose training
    fastlm cannot know, keeps its base's generation config, as transformers and peft load it. Either is said
    once per folder."""
    if not (Path(folder) / GENERATION_CONFIG).is_file():
        if not getattr(model.config, "is_encoder_decoder", False):
            return
        if (Path(folder) / TRAINING_RECORD).is_file():
            _rebuild_generation_config(model, folder)
        else:
            _say_base_generation_config(folder)
        return
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig.from_pretrained(str(folder))
    start = model.generation_config.decoder_start_token_id
    if start is not None:
        model.config.decoder_start_token_id = start


def _say_base_generation_config(folder: str | Path) -> None:
    """One line per folder: the encoder-decoder adapter in ``folder``, saved outside fastlm's train pipeline,
    generates with its base's generation config."""
    key = str(Path(folder).resolve())
    if key in _said_rebuilt:
        return
    _said_rebuilt.add(key)
    log.info(
        "The encoder-decoder LoRA adapter in %s has no %s and none of fastlm's training records (%s): it was "
        "saved outside fastlm's train pipeline (peft's save_pretrained, another tool, or a fastlm before it "
        "wrote them) and generates with its base's generation config, as transformers and peft load it "
        "(put a %s in the folder to generate otherwise).",
        folder,
        GENERATION_CONFIG,
        TRAINING_RECORD,
        GENERATION_CONFIG,
    )


def _rebuild_generation_config(model, folder: str | Path) -> None:
    """``generate_as_trained`` on ``model`` as training called it, from the adapter folder's tokenizer and the
    base config; one line in the log per folder (a warning where the folder has no tokenizer to rebuild it
    from: the base's generation config then stays)."""
    from transformers import AutoTokenizer

    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.model.encoder_decoder import generate_as_trained

    key = str(Path(folder).resolve())
    start = model.config.decoder_start_token_id
    start = model.config.pad_token_id if start is None else start
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as error:  # noqa: BLE001 - no tokenizer (or none that loads): nothing to rebuild from
        if key not in _said_rebuilt:
            _said_rebuilt.add(key)
            log.warning(
                "The encoder-decoder LoRA adapter in %s has no %s (saved by an earlier fastlm, which wrote "
                "its %s) and no tokenizer that loads (%s): it generates with its base's generation config, "
                "which may differ from how it trained.",
                folder,
                GENERATION_CONFIG,
                TRAINING_RECORD,
                str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__,
            )
        return
    if start is None:
        return
    head = TextEnds.of(tokenizer).head
    generate_as_trained(model, int(start), head)
    if key not in _said_rebuilt:
        _said_rebuilt.add(key)
        forced = f"{head[0]} forced first" if len(head) == 1 else "none forced"
        log.info(
            "The encoder-decoder LoRA adapter in %s has no %s (saved by an earlier fastlm, which wrote its "
            "%s): it generates as it trained, from its base's decoder start token %d and what its tokenizer "
            "puts before a text (%s)",
            folder,
            GENERATION_CONFIG,
            TRAINING_RECORD,
            int(start),
            forced,
        )


def save_adapter(peft_model, folder: str | Path, *, shown: str | Path | None = None) -> None:
    """``save_pretrained`` the adapter into ``folder``; a PiSSA or OLoRA adapter as its trained difference,
    a plain LoRA of rank 2 r for the unchanged base (peft's conversion: ``W_res + s B A = W + s [B | -B0]
    [A ; A0]``, alpha doubled, or times sqrt(2) when rank-stabilized), its other trained weights as they
    are. ``shown``: the folder its messages name (where it lies once saved: ``folder`` may be the temporary
    one an atomic save writes into)."""
    from safetensors.torch import load_file, save_file

    folder = Path(folder)
    peft_model.save_pretrained(str(folder), safe_serialization=True)
    save_generation_config(peft_model, folder)
    _say_grown_embedding(peft_model, Path(shown) if shown is not None else folder)
    initial = initial_adapters(peft_model)
    if initial is None:
        return
    weights = folder / "adapter_model.safetensors"
    trained = load_file(weights)
    if set(initial) - set(trained):
        raise RuntimeError(f"the saved adapter lacks {sorted(set(initial) - set(trained))[:3]}")
    for name, start in initial.items():
        if ".lora_A." in name:
            trained[name] = torch.cat([trained[name], start.to(trained[name].dtype)], dim=0).contiguous()
        else:
            trained[name] = torch.cat([trained[name], -start.to(trained[name].dtype)], dim=1).contiguous()
    save_file(trained, weights, metadata={"format": "pt"})
    path = folder / "adapter_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise RuntimeError("a PiSSA or OLoRA adapter with per-module ranks has no conversion here")
    config["r"] *= 2
    config["lora_alpha"] *= math.sqrt(2) if config.get("use_rslora") else 2
    config["init_lora_weights"] = True
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _say_grown_embedding(peft_model, folder: Path) -> None:
    """One warning where the adapter's embedding has more rows than its base folder's (``train.model.
    resize_embeddings``): transformers loads an adapter folder's base as it is, so its ``from_pretrained`` and
    ``pipeline()`` stop there with a size mismatch; fastlm's loading grows the base first
    (``load_adapter_model``)."""
    config = next(iter(getattr(peft_model, "peft_config", {}).values()), None)
    base = getattr(config, "base_model_name_or_path", None)
    try:
        written = json.loads((Path(str(base)) / "config.json").read_text(encoding="utf-8"))
        before = written.get("vocab_size") or (written.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return
    embedding = peft_model.get_input_embeddings()
    # an adapter on the embedding (target_modules naming embed_tokens): peft's LoRA Embedding wraps the table
    size = getattr(getattr(embedding, "base_layer", embedding), "num_embeddings", None)
    if isinstance(before, int) and isinstance(size, int) and size > before:
        log.warning(
            "The adapter in %s trained an embedding grown from %d to %d tokens "
            "(train.model.resize_embeddings): transformers' AutoModelForCausalLM.from_pretrained and "
            "pipeline() on that folder load its base as it is and stop with a size mismatch. Load it with "
            "fastlm (predict, the report) or merge it into a full model folder: python -m fastlm "
            "merge-adapter --adapter %s --out <merged>; with peft, call "
            "base.resize_token_embeddings(%d) before PeftModel.from_pretrained(base, %s).",
            folder,
            before,
            size,
            folder,
            size,
            folder,
        )


BASE_DIGEST = "base_digest.json"  # beside adapter_config.json: the base weights the adapter was trained on
# beside it too, written by fastlm's train pipeline alone (fastlm.datasets.pretrained_model.TRAINING_DATA):
# how its training data was made; a folder without it or BASE_DIGEST was saved elsewhere (peft's own save)
TRAINING_RECORD = "training_data.json"
_BASE_RECORD = "_fastlm_base_weights"  # the record, kept on the LoRA model from build to save
_warned_unchecked: set[str] = set()
_said_4bit: set[str] = set()


def remember_base(peft_model, base: str | Path) -> None:
    """Digest the base folder the adapters are trained on (at build time: what the training reads), and a
    4-bit base's quantization (``quantized``: ``quantization_record``, null for a 16- or 32-bit base; a
    folder without the entry was saved before it was recorded, ``say_unrecorded_quantization``)."""
    record = {
        "base_model": str(base),
        "weights": base_weights_digest(base),
        "method": "per tensor: sha256 of dtype, shape and its bytes, whole up to 64 KiB, else 4 spread "
        "4 KiB blocks (fastlm.engine.model.weights_identity.base_weights_digest)",
        "quantized": quantization_record(peft_model),
    }
    object.__setattr__(peft_model, _BASE_RECORD, record)


def _base_name(name: str) -> str:
    """A module's name in the plain base model, from its name in the peft model."""
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


def quantization_record(peft_model) -> dict | None:
    """How a QLoRA base was quantized, for ``BASE_DIGEST`` (None for a 16- or 32-bit base): the 4-bit
    modules (named in the plain base model), bitsandbytes' quantization settings, and ``dtype``, what the
    base was loaded in before quantizing (the compute dtype: its other weights trained in it too). The
    adapter's model is these 4-bit weights plus the adapter; ``load_adapter_model`` rebuilds them."""
    modules, state, storage = [], None, None
    for name, module in peft_model.named_modules():
        weight = getattr(module, "weight", None)
        if type(weight).__name__ == "Params4bit" and weight.quant_state is not None:
            modules.append(_base_name(name))
            state, storage = weight.quant_state, weight.quant_storage
    if state is None:
        return None
    return {
        "format": "bitsandbytes 4-bit",
        "quant_type": state.quant_type,
        "blocksize": int(state.blocksize),
        "double_quant": bool(state.nested),
        "quant_storage": str(storage).removeprefix("torch."),
        "dtype": str(state.dtype).removeprefix("torch."),
        "modules": sorted(set(modules)),
    }


def _recorded_quantization(folder: str | Path) -> dict | None:
    try:
        record = json.loads((Path(folder) / BASE_DIGEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # check_base has said what is wrong with it
    quantized = record.get("quantized") if isinstance(record, dict) else None
    return quantized if isinstance(quantized, dict) else None


def as_trained_in_4bit(base_model, quantized: dict, folder: str | Path) -> None:
    """``base_model`` (its folder's weights, loaded in 16 or 32 bits) made the base a QLoRA adapter trained
    on, in place: each 4-bit module's weight quantized as the training's base was (``quantized``:
    ``quantization_record``) and dequantized back into the model's dtype, every other weight rounded to the
    dtype the training held it in. The adapter then gives the model that trained (merged: up to the merge's
    rounding); the folder's own weights with the adapter would be a model that never trained."""
    try:
        from bitsandbytes.functional import dequantize_4bit, quantize_4bit
    except ImportError as error:
        raise ConfigError(
            f"the LoRA adapter in {folder} was trained on a 4-bit (QLoRA) base, and rebuilding those 4-bit "
            f"weights needs bitsandbytes, which does not import here ({error}).",
            fix="pip install 'bitsandbytes>=0.50' (CPU, or CUDA), then load or merge the adapter again.",
        ) from error
    dtype = getattr(torch, quantized["dtype"])
    four_bit = set(quantized["modules"])
    missing = sorted(four_bit - {name for name, _ in base_model.named_modules()})
    if missing:
        raise ConfigError(
            f"the LoRA adapter in {folder} was trained on a 4-bit base with modules its base model lacks "
            f"({', '.join(missing[:3])}).",
            fix="merge it over the base it was trained on (python -m fastlm merge-adapter --base <dir>).",
        )
    done = set()
    with torch.no_grad():
        for name in sorted(four_bit):
            weight = base_model.get_submodule(name).weight
            packed, state = quantize_4bit(
                weight.detach().to(dtype).contiguous(),
                blocksize=quantized["blocksize"],
                compress_statistics=quantized["double_quant"],
                quant_type=quantized["quant_type"],
                quant_storage=getattr(torch, quantized["quant_storage"]),
            )
            weight.copy_(dequantize_4bit(packed, state).to(weight.dtype))
            done.add(id(weight))
        for param in base_model.parameters():
            if id(param) not in done and param.dtype.is_floating_point:
                done.add(id(param))
                param.copy_(param.to(dtype).to(param.dtype))
    if str(Path(folder).resolve()) not in _said_4bit:
        _said_4bit.add(str(Path(folder).resolve()))
        log.info(
            "The LoRA adapter in %s was trained on the 4-bit %s weights of its base (QLoRA): its base "
            "weights are those, dequantized to %s (the model that trained, which the adapter is merged "
            "into; the base folder's own weights with this adapter would be a model that never trained)",
            folder,
            quantized["quant_type"].upper(),
            str(next(base_model.parameters()).dtype).removeprefix("torch."),
        )


def write_base_digest(peft_model, folder: str | Path) -> None:
    """Write ``BASE_DIGEST`` into a saved adapter folder: the record taken at build time, else (a model built
    elsewhere) the base folder's digest now. A base that is no local folder (a hub id) gets none."""
    record = peft_model.__dict__.get(_BASE_RECORD)
    if record is None:
        config = peft_model.peft_config[getattr(peft_model, "active_adapter", "default")]
        base = getattr(config, "base_model_name_or_path", None)
        if not base or not Path(base).is_dir():
            return
        remember_base(peft_model, base)
        record = peft_model.__dict__[_BASE_RECORD]
    # where the base lies from the adapter and in the project (the working folder of every run): a project
    # moved or copied whole finds its own base there, from the adapter or from a copy of it elsewhere in it
    base = Path(record["base_model"]).resolve()
    record = {
        **record,
        "base_relative": os.path.relpath(base, Path(folder).resolve()),
        "base_in_project": project_relative(base),
    }
    (Path(folder) / BASE_DIGEST).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def check_base(folder: str | Path, base: str | Path) -> None:
    """Refuse, in one line, a base folder whose weights are not the ones the adapter of ``folder`` was trained
    on; an adapter saved without ``BASE_DIGEST`` loads with one warning (``say_unchecked``)."""
    path = Path(folder) / BASE_DIGEST
    if not path.is_file():
        if str(Path(folder).resolve()) not in _warned_unchecked:
            _warned_unchecked.add(str(Path(folder).resolve()))
            say_unchecked(folder, base)
        return
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))["weights"]
        if not isinstance(saved, dict):
            raise TypeError("weights is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ConfigError(
            f"{path} is unreadable ({error}): the base weights of the LoRA adapter in {folder} "
            "cannot be checked.",
            fix="restore the adapter folder from a backup, or train the adapter again.",
        ) from error
    now = base_weights_digest(base)
    changed = sorted(name for name in saved.keys() | now.keys() if saved.get(name) != now.get(name))
    if changed:
        how = {
            name: "appeared" if name not in saved else "is gone" if name not in now else "changed"
            for name in changed
        }
        what = ", ".join(f"{name} {how[name]}" for name in changed[:3]) + (", ..." * (len(changed) > 3))
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} no longer holds the weights the "
            f"adapter was trained on ({len(changed)} of {len(saved)} weights differ from {BASE_DIGEST}: "
            f"{what}): merged, it would be a model that was never trained.",
            fix=f"put the original base model back in {base} (or pass its folder: python -m fastlm "
            "merge-adapter --base <dir>), or train the adapter again on this base "
            "(kedro run --pipeline=train).",
        )


def say_unchecked(folder: str | Path, base: str | Path) -> None:
    """One warning: the adapter of ``folder`` has no ``BASE_DIGEST``, so whether ``base`` holds the weights
    it was trained on cannot be checked. A folder fastlm's train pipeline wrote (its ``TRAINING_RECORD``)
    lacks it where its base was no local folder when it trained, or where it was removed: training it again
    records it. A folder with neither record was saved elsewhere (peft's ``save_pretrained``, another tool;
    or a fastlm before it wrote them): its base is the user's to make sure of."""
    unchecked = (
        f"that {base} holds the base weights it was trained on cannot be checked, and it is merged onto them "
        "as they are (onto other weights, a model that never trained)"
    )
    if (Path(folder) / TRAINING_RECORD).is_file():
        log.warning(
            "The LoRA adapter in %s was written by fastlm's train pipeline (its %s) but has no %s (its base "
            "was no local folder when it trained, or the file was removed): %s. Fix: train it again on this "
            "base (kedro run --pipeline=train) to record its base weights, or make sure %s is the base it "
            "was trained on.",
            folder,
            TRAINING_RECORD,
            BASE_DIGEST,
            unchecked,
            base,
        )
        return
    log.warning(
        "The LoRA adapter in %s holds none of fastlm's training records (%s, %s): it was saved outside "
        "fastlm's train pipeline (peft's save_pretrained, another tool, or a fastlm before it wrote them), "
        "so %s. Fix: make sure %s holds the model it was trained on, or merge it over that model's folder: "
        "python -m fastlm merge-adapter --adapter %s --base <its folder> --out <merged>.",
        folder,
        TRAINING_RECORD,
        BASE_DIGEST,
        unchecked,
        base,
        folder,
    )


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> str:
    """The base model folder an adapter was trained on: where it lies relative to the adapter, as it did when
    the adapter was saved (``BASE_DIGEST``'s ``base_relative``: a project moved or copied whole), when that
    folder exists; else ``base_model_name_or_path`` of its config. Its weights are checked on loading."""
    recorded = json.loads((Path(folder) / ADAPTER_CONFIG).read_text(encoding="utf-8"))[
        "base_model_name_or_path"
    ]
    try:
        digest = json.loads((Path(folder) / BASE_DIGEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        digest = {}
    digest = digest if isinstance(digest, dict) else {}
    places = (
        (Path(folder).resolve(), digest.get("base_relative")),
        (Path.cwd().resolve(), digest.get("base_in_project")),  # a copy of the adapter elsewhere in it
    )
    for start, relative in places:
        if isinstance(relative, str) and (start / relative).resolve().is_dir():
            return str((start / relative).resolve())
    return recorded


def load_adapter_model(folder: str | Path, *, base: str | None = None, merge: bool = True, **load_args):
    """The base model (``base`` or the adapter config's) with the adapter of ``folder``, in fp32, offline.

    ``merge=True`` folds the adapters into the weights and returns a plain transformers model (what
    generation and evaluation want: no adapter overhead); else the peft model. A base that ties weights to
    one tensor (a head to its input embedding: Llama-3.2-1B/3B, Qwen3-4B; BART's head and its encoder's and
    decoder's embeddings) is untied for the merge, so that an adapter on one of them changes that one alone,
    as in training; tied again where the merged weights are all still equal.
    """
    from fastlm.engine.model import pretrained

    base = base or adapter_base(folder)
    if not Path(base).is_dir():
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} does not exist.",
            fix="put the base model back there, or merge the adapter over its new folder: python -m fastlm "
            f"merge-adapter --adapter {folder} --base <new folder> --out <merged>, then use the merged model "
            "(predict.model=<merged>).",
        )
    _check_holds_a_model(folder, base)
    check_base(folder, base)
    args = {"local_files_only": True, "dtype": torch.float32, **load_args}
    checkpoint = pretrained.inspect_checkpoint(
        base,
        str(Path(base).resolve()),
        label=f"the base model {base} of the LoRA adapter in {folder}",
        trust_remote_code=args.get("trust_remote_code", False),
        local_files_only=True,
    )
    base_model = pretrained.load_pretrained(checkpoint, new_weights_param=None, **args)
    quantized = _recorded_quantization(folder)
    if quantized is not None:  # QLoRA: the 4-bit weights it trained on, not the folder's
        as_trained_in_4bit(base_model, quantized, folder)
    adapter_generation_config(base_model, folder)
    size = len(pretrained.folder_vocabulary(folder) or ())
    if size > base_model.get_input_embeddings().num_embeddings:  # trained with train.model.resize_embeddings
        log.info("Growing the embedding of %s to the %d tokens of the adapter's tokenizer", base, size)
        base_model.resize_token_embeddings(size)
    tied = _tied_weights(base_model) if merge else {}
    if tied:
        _set_tied(base_model, tied, False)
    model = _load_adapter_whole(base_model, folder)
    if not merge:
        return model
    merged = model.merge_and_unload()
    weight = merged.get_parameter
    if tied and all(torch.equal(weight(target), weight(source)) for target, source in tied.items()):
        _set_tied(merged, tied, True)  # no adapter on any of them: one tensor again, saved once
    return merged


def _check_holds_a_model(folder: str | Path, base: str | Path) -> None:
    """One line where the base folder of the adapter in ``folder`` is no model folder: a LoRA adapter folder
    (``--base`` naming the adapter itself or another run's), or a folder without ``config.json``."""
    fix = (
        "pass the folder of the base model the adapter trained on (config.json and weights): python -m "
        f"fastlm merge-adapter --adapter {folder} --base <dir> --out <merged>."
    )
    if is_adapter_folder(base):
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} is a LoRA adapter folder "
            "(adapter_config.json), not a base model.",
            fix=fix,
        )
    if not (Path(base) / "config.json").is_file():
        raise ConfigError(
            f"the base model folder {base} of the LoRA adapter in {folder} holds no model (no config.json).",
            fix=fix,
        )


def _tied_weights(model) -> dict[str, str]:
    """The weights ``model`` ties to another (transformers' ``all_tied_weights_keys``: target -> source) that
    are one tensor in it: a decoder-only head and its input embedding; BART's head and its encoder's and
    decoder's embeddings to ``shared``."""
    keys = dict(getattr(model, "all_tied_weights_keys", None) or {})
    return {
        target: source
        for target, source in keys.items()
        if model.get_parameter(target) is model.get_parameter(source)
    }


def _set_tied(model, tied: dict[str, str], on: bool) -> None:
    """Tie each of ``tied``'s weights to its source (one tensor) or give it a copy of its own; the config (a
    multimodal model's text config too) and the model's list of tied weights say so, for the folder it is
    saved to (an untied weight is saved and loaded as itself)."""
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        config.tie_word_embeddings = on
    for target, source in tied.items():
        owner, _, name = target.rpartition(".")
        weight = model.get_parameter(source)
        own = weight if on else torch.nn.Parameter(weight.detach().clone())
        setattr(model.get_submodule(owner), name, own)
    model.all_tied_weights_keys = dict(tied) if on else {}


def _load_adapter_whole(base_model, folder: str | Path):
    """``PeftModel.from_pretrained``, refusing a cut-off adapter file or adapter weights missing from it (peft
    only warns and leaves those adapters at their initial values)."""
    from peft import PeftModel

    from fastlm.engine.model import pretrained

    fix = "train the adapter again (its folder is incomplete), or restore the folder from a backup."
    pretrained.check_safetensors(folder, str(folder), fix=fix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(base_model, str(folder))
    for warning in caught:
        text = str(warning.message)
        if "missing adapter keys" in text:
            keys = re.findall(r"'([^']+)'", text)
            raise ConfigError(
                f"the LoRA adapter in {folder} does not load whole: {len(keys)} adapter weights are "
                f"missing from it ({', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}).",
                fix=fix,
            )
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return model


def say_unrecorded_quantization(folder: str | Path) -> None:
    """One warning where the adapter folder's ``BASE_DIGEST`` has no ``quantized`` entry (saved before the
    quantization was recorded): whether it trained on a 4-bit base is unknown, and a QLoRA adapter would be
    merged into the base folder's full-precision weights, not the 4-bit ones it trained on. A folder without
    ``BASE_DIGEST`` at all has ``check_base``'s warning."""
    try:
        record = json.loads((Path(folder) / BASE_DIGEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(record, dict) and "quantized" not in record:
        log.warning(
            "The LoRA adapter in %s was saved before its %s recorded the base's quantization: if it trained "
            "with %s.load_in_4bit (QLoRA), this merge uses the base folder's full-precision weights, not "
            "the 4-bit weights it trained on (a model that never trained). Fix: train it again (`kedro run "
            "--pipeline=train` records the quantization), or load the base in 4-bit yourself "
            "(BitsAndBytesConfig(load_in_4bit=True)) and apply the adapter with peft's "
            "PeftModel.from_pretrained.",
            folder,
            BASE_DIGEST,
            PARAM,
        )


_SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def saved_dtype(folder: str | Path) -> torch.dtype:
    """The dtype a model folder's weights are saved in: the one most of its fp32, bf16 or fp16 safetensors
    tensors have (by elements; what its size on disk is made of). A quantized folder's packed 4-bit or fp8
    tensors do not count: its unquantized weights' dtype. A folder without safetensors (``pytorch_model.bin``)
    has its config's ``dtype`` (``torch_dtype``), else fp32, what transformers saves by default."""
    from fastlm.engine.model import pretrained

    elements: dict[torch.dtype, int] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with path.open("rb") as handle:
            for dtype, shape, _, _ in (safetensors_index(handle) or {}).values():
                if dtype in _SAFETENSORS_DTYPES:
                    dtype = _SAFETENSORS_DTYPES[dtype]
                    elements[dtype] = elements.get(dtype, 0) + math.prod(shape)
    if elements:
        return max(elements, key=elements.__getitem__)
    checkpoint = pretrained.inspect_checkpoint(str(folder), str(folder), local_files_only=True)
    named = getattr(checkpoint.config, "dtype", None) or getattr(checkpoint.config, "torch_dtype", None)
    named = getattr(torch, named, None) if isinstance(named, str) else named
    return named if named in _SAFETENSORS_DTYPES.values() else torch.float32


def merge_adapter(folder: str | Path, *, base: str | None = None, dtype: str = "auto"):
    """A full model: the adapter of ``folder`` merged into its base (then ``save_pretrained`` it), its weights
    in ``dtype`` (``MERGE_DTYPES``; ``auto``: the base folder's saved dtype, ``saved_dtype``: a bf16 base
    merges to bf16, an fp32 one to fp32; a QLoRA adapter's too, its 4-bit base weights dequantized).

    The merge computes in fp32: the base's weights load exactly into it, ``W + scale * B @ A`` is taken there
    (peft's ``merge_and_unload``), and each merged weight is cast once to ``dtype``; a weight beyond its range
    (fp16: 65504) is refused in one line rather than written as inf."""
    if dtype not in MERGE_DTYPES:
        raise ConfigError(
            f"the merge dtype {dtype!r} is not one of {', '.join(MERGE_DTYPES)}.",
            fix="use --dtype auto (the base's saved dtype), float32, bfloat16 or float16.",
        )
    base = base or adapter_base(folder)
    model = load_adapter_model(folder, base=base, merge=True)
    say_unrecorded_quantization(folder)
    _cast_weights(model, saved_dtype(base) if dtype == "auto" else getattr(torch, dtype), asked=dtype)
    model.config.use_cache = True  # a model for inference again
    return model


def _cast_weights(model, dtype: torch.dtype, *, asked: str) -> None:
    """``model``'s floating parameters and saved buffers cast to ``dtype`` in place (a tied weight stays one
    tensor); one that overflows it (finite before, inf after) is refused in one line. Buffers that are not
    saved (rotary frequencies) keep their dtype, as ``from_pretrained`` in that dtype keeps them."""
    name = str(dtype).removeprefix("torch.")
    saved = set(model.state_dict())
    with torch.no_grad():
        for weight, param in model.named_parameters():
            if param.is_floating_point() and param.dtype != dtype:
                cast = param.data.to(dtype)
                if not torch.isfinite(cast).all() and torch.isfinite(param.data).all():
                    largest = param.data.abs().max().item()
                    how = f"--dtype {asked}" + (": the base's saved dtype" if asked == "auto" else "")
                    raise ConfigError(
                        f"the merged weight {weight} holds values up to {largest:.3g}, beyond the range of "
                        f"{name} ({how}): written in it, they would be inf.",
                        fix="merge with --dtype bfloat16 (fp32's range, half its size) or --dtype float32.",
                    )
                param.data = cast
        for buffer, value in list(model.named_buffers()):
            if buffer in saved and value.is_floating_point() and value.dtype != dtype:
                owner, _, leaf = buffer.rpartition(".")
                model.get_submodule(owner).register_buffer(leaf, value.to(dtype), persistent=True)
