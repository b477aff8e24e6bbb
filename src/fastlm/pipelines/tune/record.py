"""What a tune measured on, recorded in the tuned parameters file (``tune_measured_on``), and the train run's
check of it: a micro-batch measured on another model, weights, split, device, precision, float8, TF32,
adapter, checkpointing, optimizer or distributed strategy is no measurement of this run, and applying it
silently can run out of memory or waste the device. Also the train settings without the tuned file's, for
a run that does not apply them.

No torch at import time: the hooks read this module when every `kedro run` starts."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastlm.errors import ConfigError

RECORD_KEY = "tune_measured_on"  # top-level key of the tuned parameters file
ACCUMULATION_KEY = "tune_accumulation"  # top-level key: the process count the tuned accumulation is for
DATA_KEY = "tokenized data"  # the record's entry of the tokenized data (``data_identity``)
# the record's entries of a tune under ``tune.memory_limit_gb`` (none without a limit: the record as before)
LIMIT_KEY = "device memory limit GB"  # the limit: the file applies on a device of its kind with this much
FLOAT8_KEY = "device float8 tensor cores"  # where float8 may train: whether the tuned card had them
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# settings of train the tune's measurement depends on besides train.model (every key of it)
RUNTIME_KEYS = (
    "precision",
    "param_dtype",
    "compile",
    "compile_scope",
    "compile_mode",
    "cudnn_benchmark",
    "deterministic",
    "float8",  # float8 matmuls: another speed and activation memory
    "tf32",  # TF32 matmuls of fp32 weights: another speed
)
# train.model settings that change nothing a tune measures (where a model may come from)
NOT_MEASURED = ("train.model.allow_download",)
# train.model settings a run ignores: the from-scratch shape with a pretrained name_or_path, the adapter's
# settings with LoRA off (recorded all the same: a record stays comparable whatever the run)
SCRATCH_SHAPE = tuple(
    f"train.model.{key}"
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "tie_word_embeddings",
    )
)
LORA_ENABLED = "train.model.lora.enabled"
OTHER_KEYS = (
    ("batching", "row_length"),
    ("batching", "pad_to_multiple_of"),
    ("optimizer", "name"),
    ("optimizer", "in_backward"),
    ("loss", "fused_linear"),
    ("loss", "fused_linear_kernel"),
    ("distributed", "strategy"),  # fsdp: each process holds a shard of the weights, gradients, AdamW state
)


# what a train run reads of the tuned file besides its train settings' values, with the types the tune writes
# them in (None: null is written): a value of another type is a hand edit that would be read as another value
_COUNT, _NUMBER, _TEXT, _BOOL = "a whole number", "a number", "a text", "true/false"
TUNED_TYPES: dict[tuple[str, ...], tuple[str, bool]] = {
    ("train", "batching", "mode"): (_TEXT, False),
    ("train", "batching", "micro_batch_size"): (_COUNT, False),
    ("train", "batching", "gradient_accumulation_steps"): (_COUNT, False),
    ("train", "model", "gradient_checkpointing"): (_TEXT, False),
    (ACCUMULATION_KEY, "processes"): (_COUNT, False),
    (ACCUMULATION_KEY, "measured_processes"): (_COUNT, False),
    (ACCUMULATION_KEY, "target_effective_batch"): (_COUNT, True),
    (ACCUMULATION_KEY, "samples_per_micro_batch"): (_NUMBER, True),
}
_GROUPS = (("train",), ("train", "batching"), ("train", "model"), (RECORD_KEY,), (ACCUMULATION_KEY,))
# the record's entries of one type whatever the settings (``measured_on``); its train.* settings are each a
# null, true/false, number or text (``_SETTING``), a list of texts only where the setting is one
_LIST, _SETTING = "a list of texts", "a null, true/false, number or text"
RECORD_TYPES: dict[str, tuple[str, bool]] = {
    "model weights": (_TEXT, True),
    DATA_KEY: (_TEXT, True),
    "split.max_length": (_COUNT, False),
    "device": (_TEXT, False),
    LIMIT_KEY: (_NUMBER, False),
    FLOAT8_KEY: (_BOOL, False),
}
LIST_SETTINGS = ("train.model.lora.target_modules", "train.model.lora.modules_to_save")


def _of_type(value: Any, kind: str) -> bool:
    if kind == _SETTING:
        return value is None or isinstance(value, bool | int | float | str)
    if kind == _LIST:
        return isinstance(value, list) and all(isinstance(item, str) for item in value)
    if kind == _BOOL:
        return isinstance(value, bool)
    if isinstance(value, bool):  # true / false is no number
        return False
    if kind == _COUNT:
        return isinstance(value, int)
    if kind == _NUMBER:
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, str)


def check_tuned_file(where: str, tuned: Any) -> None:
    """Refuse in one line naming the tuned file ``where``, the key and the fix a value of ``tuned`` (its
    contents) of another type than the tune writes (``micro_batch_size: "4"``, a list, ``processes: 1.0``,
    ``true`` for a number, null): a hand edit the train run would read as another value than the file's,
    or fail on; or a value of its record (``tune_measured_on``) of another type than ``measured_on`` writes
    (a list where it writes a text, a text for ``split.max_length``, a mapping), which the train run would
    take for other settings and set the file aside, naming a change that is none. A key the file does not
    hold is not checked (an older version's file, or a setting not tuned)."""
    if not isinstance(tuned, Mapping):
        return
    fix = f"run `kedro run --pipeline=tune` again, or delete the file {where}."
    for group in _GROUPS:
        found = _get(tuned, group)
        if found is not _MISSING and not isinstance(found, Mapping):
            raise ConfigError(
                f"{where}: {'.'.join(group)} is {_shown_type(found)}, where the tune writes a mapping.",
                fix=fix,
            )
    for path, (kind, nullable) in TUNED_TYPES.items():
        found = _get(tuned, path)
        if found is _MISSING or (found is None and nullable) or _of_type(found, kind):
            continue
        raise ConfigError(
            f"{where}: {'.'.join(path)} is {_shown_type(found)}, where the tune writes {kind}"
            f"{' or null' if nullable else ''}.",
            fix=fix,
        )
    record = _get(tuned, (RECORD_KEY,))
    for key, value in record.items() if isinstance(record, Mapping) else ():
        kind, nullable = RECORD_TYPES.get(key, (_SETTING, False))
        if key in LIST_SETTINGS and isinstance(value, list):
            kind = _LIST
        if (value is None and nullable) or _of_type(value, kind):
            continue
        raise ConfigError(
            f"{where}: {RECORD_KEY}.{key} is {_shown_type(value)}, where the tune writes {kind}"
            f"{' or null' if nullable else ''}.",
            fix=fix,
        )


def _shown_type(value: Any) -> str:
    if value is None:
        return "null"
    kind = {
        bool: "true/false",
        str: "a text",
        list: "a list",
        float: "a decimal number",
        int: "a whole number",
        dict: "a mapping",
    }
    return f"{value!r} ({kind.get(type(value), type(value).__name__)})"


def weights_identity(name_or_path: str | None) -> str | None:
    """A digest of the weight files of a local model folder by their names and content
    (``fastlm.engine.model.weights_identity.folder_identity``: every tensor's dtype, shape and sampled
    bytes, as an adapter's ``base_digest.json`` has them; a few MB read for a multi-GB model): other weights
    change it, also written in place with the file's size and time put back (``cp -p``, ``rsync -t``), and a
    copied or restored folder (new inodes and times) keeps it. None for a hub id or a model trained from
    scratch (the name is recorded). A record of an older version (file sizes, times, inodes) is another
    digest: taken for other weights."""
    from fastlm.engine.model.weights_identity import folder_identity

    if not name_or_path or not Path(name_or_path).is_dir():
        return None
    return folder_identity(name_or_path, WEIGHT_SUFFIXES)


def measured_on(
    train,
    *,
    max_length: int,
    data: str | None,
    device: str,
    memory_limit_gb: float | None = None,
    float8_cores: bool | None = None,
) -> dict[str, Any]:
    """The record (flat: a setting's dotted name, its value) of what a tune measures on: ``train`` (validated
    ``TrainParams``, without the tuned file's settings: gradient checkpointing as asked for, ``auto``
    included), the split's ``max_length`` and tokenized ``data`` identity (``data_identity``), the
    ``device`` (``device_description``). A tune under ``tune.memory_limit_gb`` also records the limit and,
    where float8 may train (``train.runtime.float8`` not ``off``), whether the card had float8 tensor cores
    (``float8_cores``: float8 matmuls hold other activations): the file is for a card of its kind with that
    much memory (``limited_device``)."""
    record: dict[str, Any] = {
        "model weights": weights_identity(train.model.name_or_path),
        DATA_KEY: data,
        "split.max_length": max_length,
        "device": device,
    }
    if memory_limit_gb is not None:
        record[LIMIT_KEY] = memory_limit_gb
        if train.runtime.float8 != "off":
            record[FLOAT8_KEY] = bool(float8_cores)
    model = _flat(train.model.model_dump(mode="json"), "train.model")
    record.update({key: value for key, value in model.items() if key not in NOT_MEASURED})
    record["train.model.name_or_path"] = folder_named(train.model.name_or_path)
    runtime = train.runtime.model_dump(mode="json")
    record.update({f"train.runtime.{key}": runtime[key] for key in RUNTIME_KEYS})
    for group, key in OTHER_KEYS:
        record[f"train.{group}.{key}"] = getattr(getattr(train, group), key)
    return record


def folder_named(name_or_path: str | None) -> str | None:
    """A local model folder as one name however it is written (``base_model``, ``./base_model``, its absolute
    path): resolved, relative to the working folder (the project's) where inside it. A hub id or a name that
    is no folder here: as written."""
    if not name_or_path or not Path(name_or_path).is_dir():
        return name_or_path
    folder, here = Path(name_or_path).resolve(), Path.cwd().resolve()
    return (folder.relative_to(here) if folder.is_relative_to(here) else folder).as_posix()


def device_description(requested: str) -> str:
    """The device ``train.runtime.device`` resolves to here, with the GPU's name and memory, a CPU's with the
    host's memory (the trials' memory, whose share the headroom is): a micro-batch measured on one card, or
    on a host of more RAM, is no measurement of another."""
    import torch

    from fastlm.engine.observe import metrics
    from fastlm.engine.runtime.environment import resolve_device

    device = resolve_device(requested)
    if device.type == "cpu":
        total = metrics.device_memory_mb(device)
        return "cpu" if total is None else f"cpu ({total / 1024:.0f} GiB)"
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    properties = torch.cuda.get_device_properties(index)
    return f"cuda ({properties.name}, {properties.total_memory / 2**30:.0f} GiB)"


def device_kind(description: str) -> str:
    """``cuda``, ``cpu`` or ``mps`` of a recorded device (``cuda (NVIDIA A10, 22 GiB)``, ``cuda:1``)."""
    return description.split(" (", 1)[0].split(":", 1)[0]


def device_memory_gb(requested: str) -> float | None:
    """The memory of the device ``train.runtime.device`` resolves to here, in GB of 2**30 bytes (as
    ``tune.memory_limit_gb``): the GPU's, the host's on CPU and MPS (shared); None where unknown."""
    from fastlm.engine.observe.metrics import device_memory_mb
    from fastlm.engine.runtime.environment import resolve_device

    total = device_memory_mb(resolve_device(requested))
    return None if total is None else total / 1024


def float8_tensor_cores(requested: str) -> bool:
    """Whether the device ``train.runtime.device`` resolves to here has float8 tensor cores (CUDA compute
    capability 8.9 or more), where ``train.runtime.float8`` may train in float8."""
    import torch

    from fastlm.engine.runtime.environment import resolve_device
    from fastlm.engine.runtime.float8 import MIN_CAPABILITY

    device = resolve_device(requested)
    return device.type == "cuda" and tuple(torch.cuda.get_device_capability(device)) >= MIN_CAPABILITY


def limited_device(recorded: Any, now: dict[str, Any], *, requested: str) -> str | None:
    """For a record of a tune under ``tune.memory_limit_gb`` (``LIMIT_KEY``): the device ``requested``
    (``train.runtime.device``) here is what was tuned for where it is of the recorded kind (CUDA, CPU, MPS)
    with at least the limit's memory; ``now`` (``measured_on`` here) then takes the recorded device and
    limit, and this card's float8 tensor cores where recorded (``what_changed`` names them if they differ:
    float8 matmuls hold other activations). Returns the phrase saying why the device is not what was tuned
    for (``now`` then compared on the rest), or None. A record without a limit: None, ``now`` untouched (its
    device is compared whole)."""
    if not isinstance(recorded, Mapping) or not isinstance(recorded.get(LIMIT_KEY), int | float):
        return None
    tuned_on, limit, here = str(recorded.get("device")), recorded[LIMIT_KEY], str(now.get("device"))
    why = None
    if device_kind(tuned_on) != device_kind(here):
        why = f"device {tuned_on} -> {here}"
    else:
        try:
            memory = device_memory_gb(requested)
        except Exception:  # noqa: BLE001 - a device that is not there: the training run says so itself
            memory = None
        if memory is None or memory < limit:
            has = "an unknown memory" if memory is None else f"{memory:.2f} GB"
            most = (
                ""
                if memory is None
                else f" - tune with tune.memory_limit_gb: {math.floor(memory * 100) / 100:g}"
            )
            why = (
                f"this device, {here}, has {has}, less than the {limit:g} GB of tune.memory_limit_gb it was "
                f"tuned under on {tuned_on}{most}"
            )
    now.update({"device": tuned_on, LIMIT_KEY: limit})
    if FLOAT8_KEY in recorded and why is None:
        try:
            now[FLOAT8_KEY] = float8_tensor_cores(requested)
        except Exception:  # noqa: BLE001 - as above
            now[FLOAT8_KEY] = None
    elif FLOAT8_KEY in recorded:
        now[FLOAT8_KEY] = recorded[FLOAT8_KEY]
    return why


def tuned_for(recorded: Any) -> str | None:
    """``tuned on <card> limited to <N> GB`` for a record of a tune under ``tune.memory_limit_gb``."""
    if not isinstance(recorded, Mapping) or not isinstance(recorded.get(LIMIT_KEY), int | float):
        return None
    return f"tuned on {recorded.get('device')} limited to {recorded[LIMIT_KEY]:g} GB"


def what_changed(recorded: Any, current: Mapping[str, Any]) -> str | None:
    """None when ``recorded`` (the tuned file's ``tune_measured_on``) is ``current``; else the settings that
    differ, in a phrase (a file without a record: written by an older version). Settings the run ignores
    (``_ignored``) are no change."""
    if not isinstance(recorded, Mapping):
        return "it does not record what it was measured on (written by an older version)"
    changed = [
        f"{key} {_shown(recorded.get(key))} -> {_shown(current.get(key))}"
        for key in sorted({*recorded, *current})
        if recorded.get(key) != current.get(key) and not _ignored(key, recorded, current)
    ]
    return "; ".join(changed) or None


def _ignored(key: str, recorded: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether ``key`` is a setting both runs ignore: the from-scratch shape where both train the same
    pretrained ``name_or_path``, an adapter setting where neither trains LoRA."""
    name = "train.model.name_or_path"
    if key in SCRATCH_SHAPE:
        return bool(current.get(name)) and recorded.get(name) == current.get(name)
    if key.startswith("train.model.lora.") and key != LORA_ENABLED:
        return not current.get(LORA_ENABLED) and not recorded.get(LORA_ENABLED)
    return False


@dataclass(frozen=True)
class TunedInEffect:
    """The tuned file a run applies (``TunedParametersHook``): where it is (``where``), the paths under
    ``train`` it sets (``leaves``), the run's train parameters without it (``untuned``), and ``changes``: for
    train parameters without the file (a sweep run's), what a tune on them would measure on that the file was
    not measured on, in ``what_changed``'s phrase (None: nothing, the file applies to them)."""

    where: str
    leaves: tuple[tuple[str, ...], ...]
    untuned: dict[str, Any]
    changes: Callable[[dict[str, Any]], str | None]


_IN_EFFECT: list[TunedInEffect | None] = [None]  # the tuned file this process's run applies, if any


def set_in_effect(tuned: TunedInEffect | None) -> None:
    """Record the tuned file the run applies (None: none), for the nodes that train several settings."""
    _IN_EFFECT[0] = tuned


def in_effect() -> TunedInEffect | None:
    """The tuned file the run applies (``set_in_effect``), None where it applies none."""
    return _IN_EFFECT[0]


def tuned_leaves(tuned: Mapping[str, Any] | None) -> list[tuple[str, ...]]:
    """The paths under ``train`` the tuned file sets (``("batching", "micro_batch_size")``, ...); an empty
    mapping (``batching: {}``) sets nothing, merged over the other files."""
    train = (tuned or {}).get("train") if isinstance(tuned, Mapping) else None
    leaves = _leaves(train, ()) if isinstance(train, Mapping) else ()
    return [path for path, value in leaves if not (isinstance(value, Mapping) and not value)]


def without_tuned(
    train: Mapping[str, Any],
    leaves: list[tuple[str, ...]],
    *,
    other_files: list[Mapping[str, Any]],
    given: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """``train`` (the merged ``params:train``) with each tuned leaf back to what the run has without the tuned
    file: ``--params`` (``given``, the run's runtime parameters) keeps its value; else the last of
    ``other_files`` (the parameters the run reads besides the tuned file, resolved: conf/base's) that sets
    it; else the leaf is dropped and its default applies."""
    result = _copy(train)
    for path in leaves:
        if _get((given or {}).get("train"), path) is not _MISSING:
            continue
        value = _MISSING
        for loaded in other_files:
            found = _get((loaded or {}).get("train"), path)
            value = found if found is not _MISSING else value
        parent = result
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
        if value is _MISSING:
            parent.pop(path[-1], None)
        else:
            parent[path[-1]] = value
    return result


_MISSING = object()


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            return _MISSING
        tree = tree[key]
    return tree


def _leaves(tree: Mapping[str, Any], prefix: tuple[str, ...]):
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, (*prefix, str(key)))
        else:
            yield (*prefix, str(key)), value


def _flat(tree: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {".".join((prefix, *path)): value for path, value in _leaves(tree, ())}


def _copy(tree: Any) -> Any:
    return {key: _copy(value) for key, value in tree.items()} if isinstance(tree, Mapping) else tree


def _shown(value: Any) -> str:
    return "(none)" if value is None else str(value)


def accumulation_record(
    processes: int, target: int | None, samples_per_micro_batch: float | None
) -> dict[str, Any]:
    """What the tuned accumulation is for: ``processes`` (a step spans them: micro-batch x accumulation x
    processes), ``tune.target_effective_batch`` (null: the accumulation is the conf's, not chosen) and the
    samples a measured micro-batch held. Measured in one process (``measured_processes``)."""
    return {
        "processes": processes,
        "measured_processes": 1,
        "target_effective_batch": target,
        "samples_per_micro_batch": samples_per_micro_batch,
    }


def accumulation_for_processes(
    recorded: Any,
    *,
    accumulation: int,
    micro_batch_size: int,
    processes: int,
    tuned_micro_batch_size: int | None = None,
    modes: tuple[str, str] | None = None,
) -> tuple[int, str | None, bool]:
    """(accumulation, sentence, kept) for a train run on ``processes`` of a tuned file whose accumulation
    ``recorded`` (its ``tune_accumulation``) is for another count, or with a ``micro_batch_size`` given over
    the file's (``tuned_micro_batch_size``, the size measured: ``--params``, a later file), or a batching
    mode given over the file's (``modes``: the tuned one, the run's ``length_grouped``, one sample a row):
    the accumulation that keeps the target (rounded up, at least 1: ``ceil(target / (samples per
    micro-batch x processes))``, a micro-batch's samples scaled from the measured size's), a sentence saying
    so, and whether the target is kept (False: one micro-batch per process already holds more). The same
    accumulation and no sentence on the recorded count, size and mode, or for a file without a target (the
    conf's accumulation, not chosen for it). ``recorded`` None (a file written before the record): for one
    process, target unknown: None sentence and kept False where ``processes`` is another count."""
    if not isinstance(recorded, Mapping):
        return accumulation, None, processes == 1
    tuned_for = int(recorded.get("processes") or 1)
    target = recorded.get("target_effective_batch")
    measured = tuned_micro_batch_size or micro_batch_size
    if (tuned_for == processes and measured == micro_batch_size and not modes) or target is None:
        return accumulation, None, True
    if modes:  # a length-grouped micro-batch holds one sample a row
        per_micro_batch = float(micro_batch_size)
    else:
        per_micro_batch = (
            float(recorded.get("samples_per_micro_batch") or measured) * micro_batch_size / measured
        )
    exact = target / (per_micro_batch * processes)
    steps = max(1, math.ceil(exact))
    holds = per_micro_batch * steps * processes
    tuned_mode, mode = (f"{modes[0]} ", f"{modes[1]} ") if modes else ("", "")
    if measured == micro_batch_size and not modes:
        change = f"(tuned for {tuned_for} process(es)) -> {steps} for {processes} process(es)"
    else:
        change = (
            f"(tuned for {tuned_mode}micro-batch {measured} on {tuned_for} process(es)) -> {steps} for "
            f"{mode}micro-batch {micro_batch_size} on {processes} process(es)"
        )
    said = (
        f"gradient_accumulation_steps {accumulation} {change}: micro-batch {micro_batch_size} x {steps} x "
        f"{processes} holds ~{holds:,.0f} samples (target {target}"
    )
    if exact < 1:
        return steps, f"{said}; one micro-batch per process already holds more)", False
    return steps, f"{said}, rounded up)", True


# what a tune writes into its file besides its record (``tune_measured_on``, ``tune_accumulation``)
WRITTEN_BATCHING = (
    "train.batching.mode",
    "train.batching.micro_batch_size",
    "train.batching.gradient_accumulation_steps",
)
WRITTEN_CHECKPOINTING = "train.model.gradient_checkpointing"  # where it is auto: the policy measured fastest


def refuse_clashing_files(tuned_file: Path, train: Mapping[str, Any]) -> None:
    """Refuse, in one line before a tune measures anything, where another parameters file of the tuned
    file's conf environment (its folder: conf/local/parameters.yml beside conf/local/parameters_tuned.yml)
    sets a key the tune writes (``WRITTEN_BATCHING``, the checkpointing policy where ``train`` asks auto, its
    record): Kedro refuses a key two files of one environment set, so every later run, another tune too,
    would stop on the file this tune wrote."""
    from fastlm.parameters import parameters_files

    written = {*WRITTEN_BATCHING}
    model = train.get("model") if isinstance(train, Mapping) else None
    if isinstance(model, Mapping) and model.get("gradient_checkpointing") == "auto":
        written.add(WRITTEN_CHECKPOINTING)
    own = Path(tuned_file).resolve()
    for file, loaded in parameters_files(Path(tuned_file).parent):
        if file.resolve() == own:
            continue
        if not isinstance(loaded, Mapping):
            continue
        names = [
            name
            for name in _flat(loaded, "").keys()
            if name.lstrip(".") in written or name.lstrip(".").split(".")[0] in (RECORD_KEY, ACCUMULATION_KEY)
        ]
        if names:
            keys = ", ".join(sorted(name.lstrip(".") for name in names))
            file, tuned_file = _project_path(file), _project_path(Path(tuned_file))
            raise ConfigError(
                f"{file} sets {keys}, which the tune writes into {tuned_file}: Kedro refuses a key two "
                f"files of one conf environment set, so every later run would stop on the file this tune "
                "wrote. Nothing was measured or written.",
                fix=f"move {keys} out of {file} (into conf/base, or give it with --params), then tune again.",
            )


def _project_path(path: Path) -> Path:
    """``path`` relative to the run's folder (the project's) where it is inside it, as messages name files."""
    try:
        return path.absolute().relative_to(Path.cwd())
    except ValueError:
        return path
