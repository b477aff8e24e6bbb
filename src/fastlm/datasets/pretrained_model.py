"""A Hugging Face causal LM and its tokenizer, stored together as one ``save_pretrained`` directory."""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from kedro.io import AbstractDataset, DatasetError

from fastlm.corpus.tokenizer_source import check_has_vocabulary, has_vocabulary_files
from fastlm.datasets.atomic_folder import read_folder_whole, recover_folder, write_folder_atomically
from fastlm.errors import ConfigError

TRAINING_DATA = "training_data.json"  # how the model's training data was made (the train pipeline writes it)
# One load at a time per process: transformers' lazy imports race under Kedro's ThreadRunner (two report nodes
# load the model at once: an ImportError, or an intact folder reported as missing weights)
_LOADING = threading.Lock()
log = logging.getLogger(__name__)
_said_unrecorded: set[str] = set()  # QLoRA adapter folders whose missing quantization record was said


class PretrainedModelDataset(AbstractDataset):
    """Saves ``{"model": ..., "tokenizer": ...}`` (safetensors) atomically; loads the same dict, offline.

    A full model's folder loads with ``AutoModelForCausalLM``, ``AutoTokenizer`` and
    ``pipeline("text-generation")``. A LoRA model (peft) is saved as its adapter (``adapter_config.json``,
    ``adapter_model.safetensors``) plus the tokenizer; loading it reads the base model from the folder the
    adapter config names and returns the adapter merged into it, a plain transformers model
    (``python -m fastlm merge-adapter`` writes that model as a full folder). The adapter folder also holds
    ``base_digest.json`` (``fastlm.engine.model.adapter_folder.BASE_DIGEST``): a base folder whose weights
    changed since is refused where the adapter is loaded.

    ``training_data`` (optional, saved as ``training_data.json``, loaded back, None where a folder has none):
    the fingerprint of the tokenized data the model was trained on and its ``data_format`` (how prompts and
    chat messages were rendered), so a later split of the project does not change how the model is used.

    ``train_summaries``: the folder of the train summaries (``train_summary.json``, ``runs/<run>/``), read
    to say when a QLoRA adapter saved without its quantization record is loaded (``say_unrecorded_qlora``).
    """

    def __init__(
        self,
        filepath: str,
        load_args: dict[str, Any] | None = None,
        metadata: dict | None = None,
        train_summaries: str | None = None,
    ):
        self._filepath = PurePosixPath(filepath)
        self._load_args = {"local_files_only": True, "trust_remote_code": False, **(load_args or {})}
        self.metadata = metadata
        self._train_summaries = train_summaries

    def load(self) -> dict:
        """The folder as one save wrote it: loaded again where a training's save replaced it meanwhile."""
        with _LOADING:
            return read_folder_whole(self._filepath, self._load_folder)

    def _load_folder(self) -> dict:
        self._check_folder()
        folder = str(self._filepath)
        if _is_adapter_folder(folder):
            from fastlm.engine.model.adapter_folder import load_adapter_model

            model = load_adapter_model(folder, **self._load_args)
        else:  # as what its config says it is, whole, or one line (never re-shaped into another class)
            from fastlm.engine.model import pretrained

            checkpoint = pretrained.inspect_checkpoint(
                folder,
                str(Path(folder).resolve()),
                label=f"the trained model {folder}",
                trust_remote_code=self._load_args["trust_remote_code"],
                local_files_only=True,
            )
            model = pretrained.load_pretrained(checkpoint, new_weights_param=None, **self._load_args)
        record = Path(folder) / TRAINING_DATA
        tokenizer = self._load_tokenizer()
        if self._train_summaries is not None:
            say_unrecorded_qlora(folder, self._train_summaries)
        return {
            "model": model,
            "tokenizer": tokenizer,
            "training_data": json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None,
        }

    def load_tokenizer(self):
        """The folder's tokenizer alone, as ``load`` loads it (no weights read: a hook checks the tokenized
        data against it before any node runs)."""
        self._check_folder()
        with _LOADING:
            return self._load_tokenizer()

    def _check_folder(self) -> None:
        if not self._exists():  # a swap cut between its renames recovered first
            raise DatasetError(
                f"No trained model at {self._filepath}: run `kedro run --pipeline=train` first."
            )
        if not has_vocabulary_files(Path(self._filepath)):  # config.json alone makes an empty tokenizer
            raise ConfigError(
                f"{self._filepath} holds no tokenizer (no tokenizer.json, vocabulary, merges or "
                "sentencepiece file): its predictions would start from no input token.",
                fix=_tokenizer_fix(self._filepath),
            )

    def _load_tokenizer(self):
        from transformers import AutoTokenizer

        folder = str(self._filepath)
        tokenizer = AutoTokenizer.from_pretrained(folder, **self._load_args)
        check_has_vocabulary(tokenizer, folder, fix="save the model's tokenizer into the folder.")
        return tokenizer

    def save(self, data: dict) -> None:
        def write(folder: Path) -> None:
            if hasattr(data["model"], "peft_config"):  # a LoRA adapter, and the base weights it is for
                from fastlm.engine.model.adapter_folder import save_adapter, write_base_digest

                save_adapter(data["model"], folder, shown=self._filepath)
                write_base_digest(data["model"], folder)
            else:
                with for_inference(data["model"], data["tokenizer"]):
                    data["model"].save_pretrained(str(folder), safe_serialization=True)
            data["tokenizer"].save_pretrained(str(folder))
            if data.get("training_data") is not None:
                record = json.dumps(data["training_data"], indent=2, ensure_ascii=False)  # texts as written
                (folder / TRAINING_DATA).write_text(record, encoding="utf-8")

        write_folder_atomically(self._filepath, write)

    def _exists(self) -> bool:
        recover_folder(self._filepath)  # a save killed between the two renames of its swap
        return (Path(self._filepath) / "config.json").is_file() or _is_adapter_folder(self._filepath)

    def _describe(self) -> dict[str, Any]:
        return {"filepath": str(self._filepath)}


def _tokenizer_fix(folder: PurePosixPath) -> str:
    """How to give a model folder without a tokenizer one: an adapter folder (peft's ``save_pretrained``
    alone) the command saving the tokenizer of the base its adapter config records into it (predict reads
    the tokenizer from the model folder: no parameter names another); any other folder, its own."""
    config = _json_file(Path(folder) / "adapter_config.json")
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    if not isinstance(base, str) or not base:
        return (
            "save the model's tokenizer into the folder (tokenizer.save_pretrained), or point at the model "
            "folder a train run wrote."
        )
    command = f"AutoTokenizer.from_pretrained({json.dumps(base)}).save_pretrained({json.dumps(str(folder))})"
    code = shlex.quote(f"from transformers import AutoTokenizer; {command}")  # a quote in a path stays
    return (
        f"save the tokenizer of its base ({base}, as its adapter_config.json records it) into it: python -c "
        f"{code} (a training that added tokens needs its own tokenizer instead), or point at the model "
        "folder a train run wrote."
    )


@contextlib.contextmanager
def for_inference(model, tokenizer):
    """``model``'s config as a folder for inference wants it while it is saved: the key/value cache on
    (training switches it off; put back after), and the tokenizer's pad id in the generation config where it
    has none (a base whose tokenizer pads with its EOS). Not in the model config: a Llama or Qwen2 built from
    a ``pad_token_id`` that is its EOS would give the EOS embedding no gradient in a later fine-tune."""
    configs = list({id(c): c for c in (model.config, model.config.get_text_config())}.values())
    cached = [getattr(config, "use_cache", None) for config in configs]
    for config in configs:
        if hasattr(config, "use_cache"):
            config.use_cache = True
    pad, generation = getattr(tokenizer, "pad_token_id", None), getattr(model, "generation_config", None)
    if generation is not None and pad is not None and generation.pad_token_id is None:
        generation.pad_token_id = pad
    try:
        yield
    finally:
        for config, value in zip(configs, cached, strict=True):
            if value is not None:
                config.use_cache = value


def _json_file(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def say_unrecorded_qlora(folder: str | Path, train_summaries: str | Path) -> None:
    """Say once, in one warning, that the LoRA adapter in ``folder`` trained on a 4-bit base (the train
    summary of its ``training_id``, in ``train_summaries`` or its ``runs/<run>/``, names a QLoRA adapter) but
    was saved before ``base_digest.json`` recorded the quantization: it is merged into the base folder's
    full-precision weights, not the 4-bit weights it trained on (``adapter_folder.as_trained_in_4bit``
    rebuilds those only from the record), and training it again records it. Nothing for any other folder."""
    from fastlm.engine.model.adapter_folder import BASE_DIGEST
    from fastlm.reporting.summaries import TRAINING_ID

    folder = Path(folder)
    digest = _json_file(folder / BASE_DIGEST)
    if not _is_adapter_folder(folder) or (isinstance(digest, dict) and "quantized" in digest):
        return
    record = _json_file(folder / TRAINING_DATA)
    training_id = record.get(TRAINING_ID) if isinstance(record, dict) else None
    where = str(folder.resolve())
    if not training_id or where in _said_unrecorded:
        return
    summaries = Path(train_summaries)
    for path in [summaries / "train_summary.json", *sorted(summaries.glob("runs/*/train_summary.json"))]:
        summary = _json_file(path)
        if not isinstance(summary, dict) or summary.get(TRAINING_ID) != training_id:
            continue
        adapter = summary.get("adapter")
        if isinstance(adapter, str) and adapter.startswith(("QLoRA", "QDoRA")):
            _said_unrecorded.add(where)
            log.warning(
                "The adapter in %s trained on its base's 4-bit weights (%s: %s), but its %s, saved by an "
                "earlier fastlm, does not record that quantization: it is merged into the base folder's "
                "full-precision weights, not the 4-bit weights it trained on (a model that never trained). "
                "Fix: train it again (`kedro run --pipeline=train`), which records the quantization",
                folder,
                path,
                adapter,
                BASE_DIGEST,
            )
        return


def training_of(folder: str | Path, train_summaries: str | Path | None) -> dict:
    """Which training made the model in ``folder``: ``{"training_id", "training_run"}`` from its
    ``training_data.json`` and the train summary of that id (``train_summaries`` or its ``runs/<run>/``: the
    run's name), each where known; empty for a folder no training here wrote. Predict records it: the
    trained model's folder is replaced by each training, and a predictions file said only the folder."""
    from fastlm.reporting.summaries import TRAINING_ID

    record = _json_file(Path(folder) / TRAINING_DATA)
    training_id = record.get(TRAINING_ID) if isinstance(record, dict) else None
    if not isinstance(training_id, str) or not training_id:
        return {}
    found = {"training_id": training_id}
    if train_summaries is not None:
        summaries = Path(train_summaries)
        for path in [summaries / "train_summary.json", *sorted(summaries.glob("runs/*/train_summary.json"))]:
            summary = _json_file(path)
            if isinstance(summary, dict) and summary.get(TRAINING_ID) == training_id:
                if isinstance(summary.get("run_name"), str):
                    found["training_run"] = summary["run_name"]
                break
    return found


def _is_adapter_folder(folder) -> bool:
    """A peft LoRA adapter folder (``fastlm.engine.model.adapter_folder.ADAPTER_CONFIG``), checked without
    importing torch."""
    return (Path(folder) / "adapter_config.json").is_file()
