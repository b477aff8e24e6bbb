"""What the predict pipeline reads, as one catalog entry (``predict_sources``): the node gets a
``PredictSources`` and asks it for ``predict.input`` and ``predict.model``, so the parameters stay the one
place that names them (a catalog path read from ``--params`` would miss a value set in a parameters file)."""

from __future__ import annotations

import json
import logging
from pathlib import Path, PurePosixPath
from typing import Any

import pandas as pd
from kedro.io import AbstractDataset, DatasetError

from fastlm.corpus.readers import (
    COMPRESSIONS,
    column_key,
    read_text_lines,
    read_text_table,
    refuse_a_table_of_tabs,
    text_as_written,
)
from fastlm.corpus.shards import data_files, is_pattern
from fastlm.datasets.atomic_folder import read_folder_whole
from fastlm.datasets.pretrained_model import TRAINING_DATA, PretrainedModelDataset, training_of
from fastlm.engine.checkpoint.layout import MARKER
from fastlm.engine.model.weights_identity import folder_identity
from fastlm.errors import InputDataError
from fastlm.reporting.predict_chats import with_system_prompt
from fastlm.reporting.predictions import PredictionParts

FORMATS = (
    ".jsonl, .csv, .tsv, .parquet (as the split reads them) or .txt (one input a line), optionally compressed"
)
log = logging.getLogger(__name__)
PARAMETER = "predict.input"


def one_input_a_line(path: str) -> bool:
    """Whether ``path`` is a text file (``.txt``, compressed or not): one input a line, no column names."""
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSIONS:
        suffixes = suffixes[:-1]
    return suffixes[-1:] == [".txt"]


class PredictSources:
    """The input table, the model (the trained one, a folder, or a finished run's), the resumable parts, and
    how the project's models were trained (``fingerprint``: the tokenized data's fingerprint, whose
    ``params.data_format`` says how chat messages were rendered)."""

    def __init__(
        self,
        trained_model: str,
        runs: str,
        parts: str,
        fingerprint: str | None = None,
        train_summaries: str | None = None,
        checkpoints: str | None = None,
    ):
        self.trained_model, self.runs, self.parts = Path(trained_model), Path(runs), PredictionParts(parts)
        self.fingerprint = Path(fingerprint) if fingerprint is not None else None
        self.train_summaries = train_summaries  # read to say a QLoRA adapter's missing quantization record
        self.checkpoints = Path(checkpoints) if checkpoints is not None else None  # interrupted trainings'

    def read_input(self, path: str, id_column: str | None = None) -> pd.DataFrame:
        """The table at ``path``; a .txt file (compressed or not) is one input per line, in a ``text``
        column. An error's fix names ``predict.input``. ``id_column``: read as the file writes it (an id "007"
        is not the number 7.0)."""
        file = Path(path)
        if data_files(file) is not None:  # a folder (not save_to_disk's) or a glob: shards are the split's
            raise InputDataError(
                f"predict.input {path} is "
                + ("a glob" if is_pattern(file) else "a folder but not a datasets.save_to_disk folder")
                + "; predict reads one file or a save_to_disk folder (a folder or glob of shards is read "
                "by the split alone).",
                fix=f"join the inputs into one file, then --params predict.input=<that file: {FORMATS}>.",
            )
        if not file.exists():
            raise InputDataError(
                f"predict.input {path} does not exist.",
                fix=f"--params predict.input=<an existing file: {FORMATS}>.",
            )
        if one_input_a_line(path):
            lines = read_text_lines(file, PARAMETER)
            refuse_a_table_of_tabs(lines, file, "predict.text_column (or predict.prompt_column)")
            table = pd.DataFrame({"text": pd.Series(lines, dtype=object)})
            table.attrs["source_path"] = str(file)
            return table
        return _named_as_asked(read_text_table(file, PARAMETER, as_written=[id_column] if id_column else []))

    def text_as_written(self, table: pd.DataFrame, column: str) -> pd.DataFrame:
        """``table`` (``read_input``'s) with its input ``column`` as a CSV or TSV file writes it: prompts or
        texts that are numbers ("2024", "007") are the text in the file, not numbers pandas made of them; a
        JSON number stays a number (no text: refused as ``non_string``)."""
        return text_as_written(table, [column], PARAMETER)

    def training_format(self, trained: dict) -> dict | None:
        """How ``trained`` (``load_model``'s) had its training data formatted: the ``data_format`` of its
        own record (``training_data.json``, written with the model by the train pipeline) or, for a model of
        this project without one (written before the record was), of the project's split fingerprint; with
        ``source``, the file read. None: plain text, or nothing says."""
        record = trained.get("training_data")
        if record is not None:
            data_format = record.get("data_format") or {}
            source = Path(trained["source"]) / TRAINING_DATA
            return with_system_prompt(data_format, record, source) if data_format.get("kind") else None
        if not trained["trained_here"] or self.fingerprint is None or not self.fingerprint.is_file():
            return None
        try:
            stored = json.loads(self.fingerprint.read_text(encoding="utf-8"))
            data_format = stored["params"].get("data_format") or {}
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputDataError(
                f"{self.fingerprint} could not be read ({exc}): it says how the model was trained.",
                fix="re-run `kedro run --pipeline=split` (it rewrites the fingerprint).",
            ) from exc
        return with_system_prompt(data_format, stored, self.fingerprint) if data_format.get("kind") else None

    def _interrupted(self, name: str) -> Path | None:
        """The newest checkpoint of a training named ``name`` (``checkpoints``/<name>, the catalog's
        ``train.checkpoint_dir`` default) that left no model: an interrupted run; else None."""
        folder = self.checkpoints / name if self.checkpoints is not None and "/" not in name else None
        found = sorted(folder.glob("checkpoint-*")) if folder is not None and folder.is_dir() else []
        return found[-1] if found else None

    def load_model(self, name: str | None) -> dict:
        """``{"model", "tokenizer", "source", "identity", "trained_here"}``: ``name`` None is the trained
        model; else a model folder, else the run name of a finished training run (``<runs>/<name>/model``).
        ``identity`` (``weights_identity.folder_identity``: every file's name and content, a safetensors
        file's tensors sampled) keys the resumable parts: new weights never reuse old predictions, also
        written with their size and time put back, and a copied folder reuses them. ``trained_here``: the
        trained model or a run's, i.e. trained on this project's data (``training_chat`` speaks for it)."""
        folder = self.trained_model if name is None else Path(name)
        if name is not None and not folder.is_dir() and (self.runs / name / "model").is_dir():
            folder = self.runs / name / "model"
        dataset = PretrainedModelDataset(str(folder), train_summaries=self.train_summaries)
        if not dataset.exists():
            if name is None:
                raise InputDataError(
                    f"there is no trained model at {folder}.",
                    fix="run `kedro run --pipeline=train` first, or set predict.model.",
                )
            run = (
                folder.parent.name
                if (folder / MARKER).is_file() and folder.name[:11] == "checkpoint-"
                else None
            )
            if run is not None:  # a checkpoint folder: kept for resuming its run, not a model folder
                finished = (self.runs / run / "model").is_dir()
                raise InputDataError(
                    f"predict.model {name!r} is a checkpoint of the training {run} (weights, optimizer and "
                    "state kept for resuming it), not a model folder"
                    + (
                        "; that training finished and saved its model."
                        if finished
                        else ", which never finished."
                    ),
                    fix=f"--params predict.model={run} (its model)"
                    if finished
                    else f"finish it (kedro run --pipeline=train --params run_name={run}), then predict with "
                    f"predict.model={run}.",
                )
            interrupted = self._interrupted(name)
            if interrupted is not None:
                raise InputDataError(
                    f"predict.model {name!r} is a training that was interrupted and never finished (its last "
                    f"checkpoint: {interrupted}); a checkpoint is no model folder to predict with.",
                    fix=f"finish it (kedro run --pipeline=train --params run_name={name}), then predict with "
                    f"it; or give a model folder or one of the runs{_runs_said(self.runs, name)}.",
                )
            raise InputDataError(
                f"predict.model {name!r} is neither a model folder (config.json or adapter_config.json) nor "
                f"a finished training run ({self.runs}/<name>/model).",
                fix=f"give a model folder or one of the runs{_runs_said(self.runs, name)}.",
            )
        # the identity of the folder the model was loaded from (a training's save may replace it meanwhile)
        loaded, identity = read_folder_whole(folder, lambda: (dataset.load(), folder_identity(folder)))
        where = folder.resolve()
        trained_here = where == self.trained_model.resolve() or self.runs.resolve() in where.parents
        recorded = (loaded.get("training_data") or {}).get("max_length") is not None
        return {
            **loaded,
            "source": str(folder),
            "identity": identity,
            "trained_here": trained_here,
            "training": training_of(folder, self.train_summaries),
            "project_rows": self._project_rows(folder, loaded.get("training_data"))
            if trained_here and not recorded
            else None,
        }

    def _project_rows(self, folder: Path, record: dict | None) -> dict | None:
        """The rows' length (``split.max_length``) of the project's split fingerprint, for a model of this
        project whose folder predates the record of it (``training_data.json``'s ``max_length``), where the
        fingerprint is the one it trained on: its record's ``fingerprint``, else (a folder older still) that
        of the train summary written with it (``train_summary.json`` beside the trained model, a run's in
        ``runs/<run>/``). ``{"max_length", "source"}``; None where nothing ties the two."""
        if self.fingerprint is None or not self.fingerprint.is_file():
            return None
        try:
            stored = json.loads(self.fingerprint.read_text(encoding="utf-8"))
            length, fingerprint = stored["params"]["max_length"], stored["fingerprint"]
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            return None
        trained_on = (
            (record or {}).get("fingerprint") if record is not None else self._summary_fingerprint(folder)
        )
        if trained_on != fingerprint or not isinstance(length, int) or isinstance(length, bool) or length < 2:
            return None
        return {"max_length": length, "source": str(self.fingerprint)}

    def _summary_fingerprint(self, folder: Path) -> str | None:
        """The data fingerprint in the train summary written with the model ``folder`` (None: none)."""
        if self.train_summaries is None:
            return None
        where, summaries = folder.resolve(), Path(self.train_summaries)
        if where == self.trained_model.resolve():
            path = summaries / "train_summary.json"
        elif where.parent.parent == self.runs.resolve():
            path = summaries / "runs" / where.parent.name / "train_summary.json"
        else:
            return None
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return None
        return summary.get("fingerprint") if isinstance(summary, dict) else None


def _named_as_asked(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with each column whose name has white space around it (a CSV header ``id, text``) or is
    decomposed (NFD, a header saved on macOS) named as a parameter names it (``readers.column_key``), as
    the split reads such a column, said in one warning each; a name whose key another column has, as it
    is. Its cells as the file writes them are still found by that name (``readers.written_cells``)."""
    keys = [column_key(column) for column in table.columns]
    renamed = {
        column: key
        for column, key in zip(table.columns, keys, strict=True)
        if key != column and keys.count(key) == 1 and key not in table.columns
    }
    for column, key in renamed.items():
        log.warning(
            "predict: the column %r of %s is read as %r: the same name %s",
            column,
            table.attrs.get("source_path", "predict.input"),
            key,
            "with white space around it"
            if column.strip() != column
            else "decomposed (NFD, as macOS writes it)",
        )
    return table.rename(columns=renamed) if renamed else table


def _runs_said(runs: Path, name: str) -> str:
    """The finished runs under ``runs`` a message offers: the 10 newest (by their model folder's time),
    newest first, how many there are, and the closest name to ``name``."""
    import difflib

    found = [folder.parent for folder in runs.glob("*/model")] if runs.is_dir() else []
    if not found:
        return ": (none yet)"
    found.sort(key=lambda run: (run.joinpath("model").stat().st_mtime, run.name), reverse=True)
    names = [run.name for run in found]
    shown = f"the 10 newest of {len(names)}, " if len(names) > 10 else ""
    close = difflib.get_close_matches(name, names, n=1)
    return f" ({shown}newest first): {', '.join(names[:10])}" + (
        f"; the closest to it: {close[0]}" if close else ""
    )


class PredictSourcesDataset(AbstractDataset):
    """Loads a ``PredictSources`` over the configured folders; never saved."""

    raw_input = True  # the input and model named by the parameters are explained by PredictSources itself

    def __init__(
        self,
        trained_model: str,
        runs: str,
        parts: str,
        fingerprint: str | None = None,
        metadata: dict | None = None,
        train_summaries: str | None = None,
        checkpoints: str | None = None,
    ):
        self._paths = {
            "trained_model": str(PurePosixPath(trained_model)),
            "runs": str(PurePosixPath(runs)),
            "parts": str(PurePosixPath(parts)),
            "fingerprint": str(PurePosixPath(fingerprint)) if fingerprint is not None else None,
            "train_summaries": str(PurePosixPath(train_summaries)) if train_summaries is not None else None,
            "checkpoints": str(PurePosixPath(checkpoints)) if checkpoints is not None else None,
        }
        self.metadata = metadata

    def load(self) -> PredictSources:
        return PredictSources(**self._paths)

    def save(self, data) -> None:
        raise DatasetError("predict_sources is read-only: the predictions are written by their own entries.")

    def _exists(self) -> bool:
        return True

    def _describe(self) -> dict[str, Any]:
        return dict(self._paths)
