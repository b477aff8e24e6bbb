"""Which checkpoint a run may continue: a digest of what makes a checkpoint resumable, and the choice.

A checkpoint's saved data position and weights only mean something for the same model, data and batching. The
digest (:func:`run_digest`) records, as readable fields:

- ``model.source`` (``name_or_path``; a local folder relative to the project folder when inside it) and
  ``model.shape`` (a hash of every parameter's name and shape: architecture, sizes, vocabulary, LoRA
  adapters), ``model.lora`` (the settings but ``base_dtype``, ``fused_forward`` and ``shared_input``, which
  change no weight or data position, and ``use_rslora`` / ``use_dora`` / ``loraplus_lr_ratio`` where off, as
  checkpoints written before they existed hold them, and ``init`` where it leaves the base weights alone:
  PiSSA's and OLoRA's train over a base they changed, rebuilt at resume from the setting),
  ``model.base_weights`` (a hash of a local base folder's weights: LoRA's frozen base, which a LoRA
  checkpoint does not hold; a full fine-tune's starting point, which its weights are a fine-tune of: a
  checkpoint of another base is another run, as one of other data is; a full fine-tune's checkpoint written
  before it was recorded holds None, not compared),
  ``model.config`` (the config's ``CONFIG_MATH_KEYS``: RoPE, norms' epsilon, activations, attention windows,
  which change the computation where no shape shows them; compared only where the checkpoint recorded it);
- ``data``: a hash of the tokenized training split (every token, every sample boundary, prompt lengths),
  ``data.fold`` (``train.fold`` of k-fold runs) and, for an encoder-decoder model whose tokenizer puts
  special tokens around a text, ``data.ends`` (``collators.TextEnds``: the ids its rows get back at batch
  time; in the digest only where there are some, so a checkpoint of rows written without them, by an
  earlier fastlm, is not continued on rows framed otherwise);
- ``batching.mode``, ``batching.micro_batch_size`` (as configured, before any OOM back-off), ``max_length``,
  ``seed``, ``data_seed`` (``train.data_seed`` as set: compared by the order's seed it gives, null being
  ``seed``'s, so a checkpoint written before it existed, which has none, reads as null),
  ``batching.row_length`` (packed: the rows' length in use, ``auto`` resolved, which the device's
  float8 token multiple may round) and ``batching.pad_to_multiple_of``: the data order and the meaning of
  the saved micro-batch position; ``batching.length_groups`` (length-grouped batches: ``whole steps``,
  ``samplers.LengthGroupedSampler``; absent from a checkpoint of an earlier fastlm, whose micro-batches were
  each grouped on their own, another order, so that one starts fresh; no field for the other modes);
- ``loss.label_smoothing`` and ``model.neftune_noise_alpha`` (NEFTune's noise on the training embeddings):
  the objective the train losses measure (a run continued under another would mix two in its curve, its
  summary and its report's label, which name one); with early stopping, ``eval_max_batches``: the
  validation batches its best loss so far was measured on, which the losses to come are compared with. All
  compared only where the checkpoint recorded them (``ADDED_LATER``: one written before they were resumes);
- ``micro_batches_per_step`` (gradient accumulation x processes): the world layout. The number of processes
  and the strategy may change (resume across world sizes and between FSDP2, DDP and one process with the
  same effective batch: every checkpoint holds the whole weights and AdamW moments,
  ``distributed.full_state_dicts``), where the step plans agree: an epoch's micro-batches are split evenly
  over the processes and the rest left out, so W and W' processes train the same ones only where
  ``N mod W == N mod W'`` (``batching.StepPlan.difference``, checked against the checkpoint's ``world_size``,
  which every checkpoint records; one written before data parallelism is one process's). Elsewhere its step
  would sit at another data position and the epochs end
  on other steps: a micro-batch trained twice or never.

:func:`plan_resume` applies ``train.resume``: ``auto`` continues the newest checkpoint in the run's folder
when its digest matches and its step is within this run's total; otherwise it starts fresh, moves the folder's
old checkpoints into ``superseded-<time>/`` (never deleted, never pruned together with the new ones) and logs
ONE line saying which fields differ and where the old checkpoints are. An explicit folder that does not match
is refused in one line. ``never`` starts fresh the same way.

Learning-rate schedule when the total changes: the schedule is rebuilt for the NEW total and the saved
scheduler position (the step) is restored, so warm-up and decay follow the new length from the resumed step on
(the rate at the resumed step jumps to where the longer schedule is at that step); the Hugging Face Trainer
does the same. ``train.optimizer.warmup_ratio`` derives its warmup from that total, the plan's (never the
steps left); like ``warmup_steps`` and the other optimizer settings it is not in the digest: a run resumed
with another applies it from the resumed step on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fastlm.engine.checkpoint.discovery import complete_checkpoints, resolve_resume
from fastlm.engine.checkpoint.files import move_aside, recover_checkpoints
from fastlm.engine.checkpoint.layout import CheckpointError
from fastlm.engine.checkpoint.loading import read_header
from fastlm.engine.config import BASE_KEEPING_INITS, TrainParams
from fastlm.engine.paths import project_name

if TYPE_CHECKING:
    from fastlm.engine.batching import StepPlan

log = logging.getLogger(__name__)


def data_digest(values, offsets, prompt_lengths=None, answer_spans=None) -> str:
    """A hash of a tokenized split's content (token ids, sample boundaries, prompt lengths and, where a chat's
    earlier answers are trained, their spans: data without them hashes as before they existed)."""
    digest = hashlib.blake2b(digest_size=16)
    for array in (values, offsets, prompt_lengths):
        if array is not None:
            digest.update(memoryview(array).cast("B"))
        digest.update(b"|")
    for array in answer_spans or ():
        digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        digest.update(b"|")
    return digest.hexdigest()


# Speed levers (like compile): a checkpoint written with either setting resumes with the other.
_LORA_LEVERS = frozenset({"base_dtype", "fused_forward", "shared_input"})
# Settings added after checkpoints were written: in the digest only where set, so an older checkpoint of a
# run that leaves them off still resumes.
_LORA_ADDED_OFF = ("use_rslora", "use_dora", "loraplus_lr_ratio")


def _lora_defaults_added(lora) -> set[str]:
    off = {name for name in _LORA_ADDED_OFF if getattr(lora, name) in (False, None)}
    # the adapters' initial weights: the trained ones replace them, unless the init also changed the base
    # (PiSSA, OLoRA: the base they trained over is rebuilt from it, and no checkpoint holds it)
    return off | ({"init"} if lora.init in BASE_KEEPING_INITS else set())


def run_digest(
    model: torch.nn.Module,
    params: TrainParams,
    *,
    max_length: int,
    data: str,
    world_size: int,
    sharded: bool,
    row_length: int | None = None,
    text_ends=None,
    length_grouped: bool | None = None,
) -> dict[str, Any]:
    """The fields a checkpoint must share with this run to be resumed (see the module docstring).
    ``row_length``: the packed rows' length in use (``auto`` resolved: the device's float8 token multiple may
    round it, which no other field sees); None: the configured one. ``text_ends``: the special tokens an
    encoder-decoder model's rows get around the split's ids (``collators.TextEnds``; None: a causal LM).
    ``length_grouped``: the run's batches are grouped by length (an encoder-decoder's ``packed`` may be);
    None: ``batching.mode`` says."""
    shapes = [[name, list(param.shape)] for name, param in model.named_parameters()]
    source = params.model.name_or_path
    if source is not None and Path(source).expanduser().is_dir():
        source = project_name(source)
    lora = params.model.lora
    digest = {
        "model.source": source or "from scratch",
        "model.shape": hashlib.sha256(json.dumps(sorted(shapes)).encode()).hexdigest()[:16],
        "model.lora": lora.model_dump(mode="json", exclude=_LORA_LEVERS | _lora_defaults_added(lora))
        if lora.enabled
        else None,
        BASE_WEIGHTS: _base_weights(source),
        "data": data,
        "data.fold": params.fold,  # k-fold runs: never continue another fold's checkpoint
        "batching.mode": params.batching.mode,
        "batching.micro_batch_size": params.batching.micro_batch_size,
        # packed rows: which samples a batch position holds
        "batching.row_length": row_length if row_length is not None else params.batching.row_length,
        "batching.pad_to_multiple_of": params.batching.pad_to_multiple_of,
        "max_length": max_length,
        "seed": params.seed,
        DATA_SEED: params.data_seed,  # null: the order is seed's (compared by the seed it gives: _same)
        "micro_batches_per_step": params.batching.gradient_accumulation_steps * world_size,
        "distributed.strategy": "fsdp" if sharded else "ddp",  # one process counts as ddp; not compared
        LABEL_SMOOTHING: params.loss.label_smoothing,  # the objective the train losses measure
        NEFTUNE: params.model.neftune_noise_alpha,  # the embeddings' noise: the objective too
    }
    if length_grouped if length_grouped is not None else params.batching.mode == "length_grouped":
        digest[LENGTH_GROUPS] = WHOLE_STEPS  # the order's rule: an earlier fastlm's checkpoint has none
    if params.early_stopping.patience is not None:  # the batches its best validation loss was measured on
        digest[EVAL_MAX_BATCHES] = params.eval_max_batches
    if text_ends is not None and (text_ends.head or text_ends.tail):
        digest["data.ends"] = {"head": list(text_ends.head), "tail": list(text_ends.tail)}
    config = model_config_math(model)
    if config:
        digest[MODEL_CONFIG] = config
    return digest


MODEL_CONFIG = "model.config"
# A model config's keys that change what the model computes where no weight's shape shows it: positions
# (RoPE base and scaling), norms' epsilon, activations, attention windows and scales. The others either
# show in ``model.shape`` (sizes, vocabulary, tied weights) or change no computation of a step (the cache,
# the attention kernel, token ids); dropout is a training setting, as the learning rate is.
CONFIG_MATH_KEYS = frozenset(
    {
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "rotary_pct",
        "rotary_emb_base",
        "max_position_embeddings",
        "rms_norm_eps",
        "layer_norm_eps",
        "layer_norm_epsilon",
        "norm_eps",
        "hidden_act",
        "hidden_activation",
        "activation_function",
        "feed_forward_proj",
        "sliding_window",
        "use_sliding_window",
        "max_window_layers",
        "layer_types",
        "attn_logit_softcapping",
        "final_logit_softcapping",
        "query_pre_attn_scalar",
        "attention_multiplier",
        "embedding_multiplier",
        "residual_multiplier",
        "logits_scaling",
        "scale_embedding",
        "scale_attn_weights",
        "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn",
        "normalize_before",
        "relative_attention_max_distance",
    }
)


def model_config_math(model: torch.nn.Module) -> dict[str, Any]:
    """The model config's ``CONFIG_MATH_KEYS`` it sets (a LoRA or sharded model's own config), a mapping's
    keys each on its own (``rope_parameters.rope_theta``), JSON-ready."""
    config = getattr(model, "config", None)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        return {}
    values, flat = to_dict(), {}
    for key in sorted(CONFIG_MATH_KEYS & set(values)):  # a mapping (rope_parameters) key by key: named alone
        value = values[key]
        items = value.items() if isinstance(value, dict) and value else [(None, value)]
        for name, item in items:
            flat[key if name is None else f"{key}.{name}"] = item
    return json.loads(json.dumps(flat, default=str))


DATA_SEED = "data_seed"


def _order_seed(digest: dict) -> Any:
    """The seed a digest's data order was drawn from: its ``data_seed``, else (null, or a checkpoint written
    before the field existed) its ``seed``."""
    return digest.get("seed") if digest.get(DATA_SEED) is None else digest.get(DATA_SEED)


def _same(key: str, saved: Any, now: Any) -> bool:
    """Digest fields equal; a model folder named two ways (absolute by an earlier fastlm, relative now) is
    the same folder when both name it; the adapter's module lists (``target_modules``, ``modules_to_save``)
    in any order (sets of modules: peft wraps them in the model's order, the parameters keep their places)."""
    if saved == now:
        return True
    if key == "model.lora" and isinstance(saved, dict) and isinstance(now, dict):
        return _module_sets(saved) == _module_sets(now)
    if key != "model.source" or not isinstance(saved, str) or not isinstance(now, str):
        return False
    return Path(saved).expanduser().resolve() == Path(now).expanduser().resolve()


def _module_sets(lora: dict) -> dict:
    """An adapter's digest with its lists of module names as sorted lists (any order names the same set)."""
    return {
        key: sorted(value) if isinstance(value, list) and all(isinstance(v, str) for v in value) else value
        for key, value in lora.items()
    }


BASE_WEIGHTS = "model.base_weights"
# Recorded for the reader, not compared: how the checkpoint was written (``fsdp``: FSDP2 over several
# processes, its AdamW moments keyed by parameter name; ``ddp``: one process or DDP, keyed by position).
# Either resumes in the other (``train.persistence``), so a checkpoint continues under another strategy.
RECORDED_ONLY = frozenset({"distributed.strategy"})
LABEL_SMOOTHING = "loss.label_smoothing"
NEFTUNE = "model.neftune_noise_alpha"
EVAL_MAX_BATCHES = "eval_max_batches"
LENGTH_GROUPS = "batching.length_groups"
WHOLE_STEPS = "whole steps"  # length_grouped sorts whole optimizer steps, then cuts them in micro-batches
# Fields added after checkpoints were written without them: compared only where the checkpoint recorded one.
ADDED_LATER = frozenset({LABEL_SMOOTHING, NEFTUNE, EVAL_MAX_BATCHES})


def _unrecorded_base(saved: dict) -> bool:
    """A full fine-tune's checkpoint written before its base folder's weights were recorded (None there):
    not compared, so it still resumes."""
    return saved.get(BASE_WEIGHTS) is None and saved.get("model.lora") is None


def _base_weights(source: str | None) -> str | None:
    """A hash of a local base folder's weights (``weights_identity.base_weights_digest``: a few MB read for a
    multi-GB base); None for a hub name or a model from scratch."""
    if source is None or not Path(source).is_dir():
        return None
    from fastlm.engine.model.weights_identity import base_weights_digest

    return hashlib.sha256(json.dumps(base_weights_digest(source), sort_keys=True).encode()).hexdigest()[:16]


def digest_differences(saved: dict | None, current: dict) -> list[str]:
    """``field saved -> now`` for each field that differs (long values shortened); everything when none
    saved."""
    if not isinstance(saved, dict):
        return ["settings (not recorded: written by an earlier fastlm)"]
    differences = []
    for key, value in current.items():
        if key == MODEL_CONFIG:  # not recorded by an earlier fastlm: not compared; else key by key
            differences += _config_differences(saved.get(key), value)
        elif key in RECORDED_ONLY or (key == BASE_WEIGHTS and _unrecorded_base(saved)):
            continue
        elif key in ADDED_LATER and key not in saved:
            continue
        elif key == DATA_SEED:  # the order's seed compared; both null: a changed seed, named as seed
            nulls = saved.get(key) is None and value is None
            if not nulls and _order_seed(saved) != _order_seed(current):
                differences.append(f"{key} {_seed_text(saved)} -> {_seed_text(current)}")
        elif not _same(key, saved.get(key), value):
            differences.append(
                f"{key} {_short(saved.get(key))} -> {_short(value)}" + _unrecorded(key, saved.get(key), value)
            )
    return differences


def _seed_text(digest: dict) -> str:
    value = digest.get(DATA_SEED)
    return f"None (seed {digest.get('seed')})" if value is None else str(value)


def _config_differences(saved: Any, now: dict) -> list[str]:
    if not isinstance(saved, dict):
        return []
    return [
        f"{MODEL_CONFIG}.{name} {_short(saved.get(name))} -> {_short(now.get(name))}"
        for name in sorted({**saved, **now})
        if saved.get(name) != now.get(name)
    ]


def _unrecorded(key: str, saved: Any, now: Any) -> str:
    """What a difference of a checkpoint written before the digest held the resolved packed-row length
    means: ``row_length: auto`` as configured, not the length it packed to, which may differ."""
    if key == "batching.row_length" and saved == "auto" and isinstance(now, int):
        return " (the checkpoint, from an earlier fastlm, recorded auto, not the length it packed to)"
    if key == LENGTH_GROUPS and saved is None:
        return (
            " (the checkpoint, from an earlier fastlm, grouped each micro-batch by length on its own: "
            "another data order)"
        )
    return ""


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else str(value)
    return text if len(text) <= 24 else text[:12] + "…"


@dataclass
class ResumePlan:
    checkpoint: Path | None  # None: start fresh
    header: dict | None = None  # checkpoint.read_header's result: read once, handed to load_checkpoint

    @property
    def state(self) -> dict | None:
        """The checkpoint's saved state (step, position, digest)."""
        return self.header["trainer_state"]["state"] if self.header is not None else None


def plan_resume(
    root: Path, resume: str, digest: dict, *, plan: StepPlan, move_old: bool = True
) -> ResumePlan:
    """The checkpoint this run continues, or a fresh start (old checkpoints moved aside when ``move_old``,
    i.e. on the one writing process). ``plan``: this run's steps, in its number of processes. Raises
    :class:`CheckpointError` for an explicit folder that cannot be used.
    """
    root = Path(root)
    if move_old:  # the writing process, holding the lock: a replacement cut between its renames put back
        recover_checkpoints(root)
    if resume not in ("auto", "never"):
        folder = resolve_resume(root, resume)
        header = read_header(folder)
        problems = _problems(header["trainer_state"]["state"], digest, plan)
        if problems:
            raise CheckpointError(
                f"train.resume: checkpoint {folder} does not belong to this run: {'; '.join(problems)}.",
                fix="resume with the settings it was written with, or set train.resume: auto (continues a "
                "matching checkpoint, else starts fresh) or never.",
            )
        _rewind(root, folder, move_old)
        return ResumePlan(folder, header)
    newest = complete_checkpoints(root)[-1:] if resume == "auto" else []  # a folder holds one run: its newest
    why = None
    if newest:
        header = read_header(newest[0])
        problems = _problems(header["trainer_state"]["state"], digest, plan)
        if not problems:
            return ResumePlan(newest[0], header)
        why = f"{newest[0].name} does not match this run ({'; '.join(problems)})"
    aside = move_aside(root) if move_old else None
    if why is not None:
        log.warning(
            "train.resume auto: not resuming from %s: %s; starting fresh%s.",
            root,
            why,
            f", the old checkpoints are kept in {aside}" if aside else "",
        )
    elif aside is not None:
        log.info(
            "train.resume %s: starting fresh; the checkpoints already in %s were moved to %s",
            resume,
            root,
            aside,
        )
    return ResumePlan(None)


def _rewind(root: Path, folder: Path, move_old: bool) -> None:
    """An explicit checkpoint of this run's own folder with later ones beside it (a rewind): those belong to
    the line the rewind abandons and go to ``superseded-<time>/``, or ``keep_last`` would prune the rewound
    line first and a later ``resume: auto`` would continue the abandoned one."""
    if not move_old or Path(folder).resolve().parent != root.resolve():
        return
    step = int(Path(folder).name.rsplit("-", 1)[1])
    later = [path for path in complete_checkpoints(root) if int(path.name.rsplit("-", 1)[1]) > step]
    aside = move_aside(root, only=later) if later else None
    if aside is not None:
        log.warning(
            "train.resume: rewinding to %s; the later checkpoints of the line it abandons (%s) moved to %s",
            Path(folder).name,
            ", ".join(path.name for path in later),
            aside,
        )


def _problems(state: dict, digest: dict, plan: StepPlan) -> list[str]:
    problems = digest_differences(state.get("digest"), digest)
    step = int(state.get("step", 0))
    if step > plan.total_steps:
        problems.append(f"it is at step {step}, past the {plan.total_steps} steps this run asks for")
    batch = int(state.get("batch_in_epoch", 0))
    if batch % plan.world_size:
        problems.append(
            f"its data position (global micro-batch {batch}) cannot be split over {plan.world_size} processes"
        )
    elif not problems:  # the same data and batching: the step plans of both numbers of processes compare
        other = plan.difference(int(state.get("world_size", 1)))  # not recorded: before data parallelism
        if other is not None:
            problems.append(other)
    return problems
