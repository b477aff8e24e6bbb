"""Hooks that refuse a run's inputs before any node runs: one missing (with the pipeline that makes it)
or damaged, a trained model evaluated on other splits than it was trained on, and a report of files of
several trainings."""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.corpus.fingerprint import data_identity
from fastlm.datasets.integrity import damaged_input_error, find_damaged
from fastlm.errors import ConfigError, InputDataError, StaleDataError
from fastlm.hooks.catalog import local_path


def all_pipelines() -> dict:
    """Every pipeline of the project (Kedro 1.7 builds only the requested ones during a run)."""
    import fastlm.pipelines

    return {
        info.name: importlib.import_module(f"fastlm.pipelines.{info.name}").create_pipeline()
        for info in pkgutil.iter_modules(fastlm.pipelines.__path__)
        if info.ispkg
    }


class MissingInputsHook:
    """Before a run starts, refuse inputs that another pipeline produces but that do not exist yet.

    One line names the dataset, its path and the pipeline to run first; nothing has run, nothing is written.
    An input that exists is checked to be whole (``fastlm.datasets.integrity``): a cut-off file is one line
    too; so is one that is whole but not what it should be, for a dataset with a ``check_saved`` method (e.g.
    ``TrainSummaryDataset``: a ``train_summary.json`` of ``{}``).
    Raw inputs (produced by no pipeline) are checked by their datasets, which explain themselves
    (``check_input``: a missing file, an unknown extension), so that a refused run opens no MLflow run.
    """

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        # every pipeline, imported only when an input is missing or damaged (torch etc. cost seconds)
        producers = None
        for dataset in sorted(pipeline.inputs()):
            if dataset.startswith("params:") or dataset == "parameters" or dataset not in catalog:
                continue
            if getattr(catalog[dataset], "raw_input", False):
                check_input = getattr(catalog[dataset], "check_input", None)
                if check_input is not None:
                    check_input()
                continue
            path = getattr(catalog[dataset], "_filepath", None) or getattr(catalog[dataset], "_path", None)
            exists = catalog.exists(dataset)
            damaged = find_damaged(str(path)) if exists and path is not None else None
            if exists and damaged is None:
                check_saved = getattr(catalog[dataset], "check_saved", None)  # whole, but what it should be?
                if check_saved is not None:
                    check_saved()
                continue
            producers = all_pipelines() if producers is None else producers
            producer = next((name for name, p in producers.items() if dataset in p.all_outputs()), None)
            if producer is None:
                continue
            if damaged is not None:  # a cut-off file is one line before any node writes
                raise damaged_input_error(*damaged, producer=producer)
            raise InputDataError(
                f"{dataset}{f' ({path})' if path else ''} does not exist yet.",
                fix=f"run `kedro run --pipeline={producer}` first.",
            )


class ModelOfTheseSplitsHook:
    """A pipeline that evaluates the trained model on the tokenized splits without training it (the report)
    is refused before any node runs when the model was trained on other splits than those now on disk: the
    model folder's ``training_data.json`` records the identity of its training data
    (``corpus.fingerprint.data_identity``: the tokenizer, the parameters and the split texts), and a
    re-split since (another ``hash_salt``, ratios, folds, texts) changes it. Its test split may then hold rows
    the model trained on, and a test score, logged onto the training run, would look held out. A model
    folder without the record (written before it existed) is not checked."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if (
            "trained_model" not in pipeline.inputs()
            or "tokenized_corpus_fingerprint" not in pipeline.inputs()
        ):
            return
        model, fingerprint = (
            local_path(catalog, "trained_model"),
            local_path(catalog, "tokenized_corpus_fingerprint"),
        )
        if model is None or fingerprint is None or not fingerprint.is_file():
            return
        from fastlm.datasets.atomic_folder import recover_folder
        from fastlm.datasets.pretrained_model import TRAINING_DATA

        recover_folder(model)  # a save killed between the two renames of its swap, before its record is read
        try:
            trained_on = json.loads((model / TRAINING_DATA).read_text(encoding="utf-8"))["fingerprint"]
            split = json.loads(fingerprint.read_text(encoding="utf-8"))
            now = data_identity(split)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return  # no record, or a file the nodes explain when they read it
        # a model folder written before the texts' digest was part of its data identity records the
        # fingerprint alone (never equal to an identity that holds a digest)
        if trained_on not in (now, split.get("fingerprint")):
            data = local_path(catalog, "tokenized_corpus") or fingerprint.parent
            raise StaleDataError(
                f"the model in {model} was trained on other data than {data} holds now (data fingerprint "
                f"{str(trained_on)[:12]}, now {str(now)[:12]}: split again since): its test split may hold "
                "rows the model trained on.",
                fix="train it again on these splits (`kedro run --pipeline=train`), or split again with the "
                "settings it was trained on.",
            )


# The catalog entries a node checks the tokenized data against (``pipelines.start.start_node``): the split's
# tokenizer (train, tune, sweep) or the trained model's own (the report's ``evaluate_model``)
_FINGERPRINT, _TOKENIZERS = "tokenized_corpus_fingerprint", ("tokenizer", "trained_model")


class FreshDataHook:
    """The checks of the tokenized data that the nodes training or evaluating a model make first
    (``pipelines.start.start_node``: made with the tokenizer and the split settings of this run, its split
    files as the split wrote them), made before any node runs, where the run reads that data without making
    it. Under the ParallelRunner or the ThreadRunner the report's other nodes (plots, summaries) run before
    ``evaluate_model`` and would rewrite their files before it refused; a single-node pipeline (train, tune,
    sweep) would open its MLflow run first. Only the tokenizer of the trained model is loaded, not its
    weights; the nodes keep their own check (a node run alone still refuses)."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        free = pipeline.inputs()
        if _FINGERPRINT not in free or "tokenized_corpus" not in free:
            return
        sources = sorted(
            {
                next(name for name in _TOKENIZERS if name in node.inputs)
                for node in pipeline.nodes
                if _FINGERPRINT in node.inputs and any(name in node.inputs for name in _TOKENIZERS)
            }
            & free
        )
        if not sources:
            return
        from fastlm.pipelines.start import TOKENIZED, start_node

        fingerprint, tokenized = catalog.load(_FINGERPRINT), catalog.load("tokenized_corpus")
        path = local_path(catalog, TOKENIZED)
        for source in sources:
            dataset = catalog[source]
            load = getattr(dataset, "load_tokenizer", None)  # the trained model: its tokenizer alone
            tokenizer = load() if load is not None else catalog.load(source)
            start_node(
                catalog.load("params:train"),
                catalog.load("params:split"),
                fingerprint=fingerprint,
                tokenizer=tokenizer,
                tokenized=tokenized,
                paths={TOKENIZED: str(path)} if path is not None else None,
                runtime=False,
            )


# What the report (``write_report``) reads of one training, as its argument of
# ``reporting.summaries.check_report_sources``: each written by a node of the report pipeline.
_REPORT_SOURCES = {
    "test_metrics": "test_metrics",
    "bottleneck_diagnosis": "diagnosis",
    "run_comparison": "runs",
}


# Where a training's train summary is kept under its run name when its catalog entry does not say
_TRAINING_RUNS = "data/08_reporting/runs"


def _check_report_name(given: str, catalog) -> None:
    """A report run named after another training than the last (``run_name`` of a training whose summary is
    kept under its name) would file the last training's report under that name in MLflow: refused."""
    try:
        if not catalog.exists("train_summary"):
            return
        trained = (catalog.load("train_summary") or {}).get("run_name")
    except Exception:  # noqa: BLE001 - a damaged or missing file: MissingInputsHook and the nodes say so
        return
    metadata = getattr(catalog["train_summary"], "metadata", None) or {}
    folder = Path(str(metadata.get("keep_per_run") or _TRAINING_RUNS))
    if not trained or given == trained:
        return
    interrupted = _interrupted_training(given, catalog)
    if interrupted is not None and not (folder / given / "train_summary.json").is_file():
        raise ConfigError(
            f"run_name {given}: the training {given} was interrupted and never finished (its checkpoints are "
            f"in {interrupted.as_posix()}); the report covers the last finished training, {trained}, and "
            f"this run would file {trained}'s report under {given}'s name in MLflow.",
            fix=f"finish it first (kedro run --pipeline=train --params run_name={given}), then report it; or "
            f"drop run_name (the report is filed under {trained}).",
        )
    if not (folder / given / "train_summary.json").is_file():
        return
    raise ConfigError(
        f"run_name {given}: the report covers the last training, {trained} (train_summary.json), not the "
        f"training {given}, whose own report was kept in {folder.as_posix()}/{given}/ when it ran; this run "
        f"would file {trained}'s report under {given}'s name in MLflow.",
        fix=f"drop run_name (the report is filed under {trained}), or name the report run otherwise; to "
        f"report {given} again, train it again (kedro run --params run_name={given}).",
    )


def _interrupted_training(name: str, catalog) -> Path | None:
    """The checkpoint folder of a training named ``name`` (``train.checkpoint_dir``/<name>) that holds a
    checkpoint, or None."""
    from fastlm.engine.config import TrainParams

    try:
        train = catalog.load("params:train") if "params:train" in catalog else {}
    except Exception:  # noqa: BLE001 - parameters are checked where they are parsed
        train = {}
    root = (train if isinstance(train, dict) else {}).get("checkpoint_dir") or TrainParams().checkpoint_dir
    folder = Path(str(root)) / name
    return folder if folder.is_dir() and any(folder.glob("checkpoint-*")) else None


def _check_history(pipeline, catalog) -> None:
    """A run that reads ``train_history`` beside the ``train_summary`` it does not write (the report's
    ``summarize_training``): the history refused before any node runs where it is not the summary's
    training's (``summaries.check_one_training``: its last step is not the summary's), as that node would
    refuse it after the report's other nodes had rewritten their files."""
    needed = {"train_summary", "train_history"}
    if not needed <= set(pipeline.inputs()) or "train_summary" in pipeline.all_outputs():
        return
    try:
        if not all(name in catalog and catalog.exists(name) for name in needed):
            return
        summary, history = catalog.load("train_summary"), catalog.load("train_history")
    except Exception:  # noqa: BLE001 - a damaged or missing file: MissingInputsHook and the nodes say so
        return
    if not isinstance(summary, dict) or not hasattr(history, "columns"):
        return  # not a summary or a table: the nodes say what it is
    from fastlm.reporting.summaries import check_history_steps, check_one_training

    path = local_path(catalog, "train_history")
    check_history_steps(history, path.as_posix() if path is not None else "train_history")
    shown = "train_history" + (f" ({path.as_posix()})" if path is not None else "")
    check_one_training(summary, history=history, what=f"the history {shown}")


def _check_model(pipeline, catalog) -> None:
    """A run that reads the trained model beside the ``train_summary`` it does not write (the report): the
    model folder refused before any node runs where its ``training_data.json`` names another training than
    the summary (a training stopped between saving its model and its summary), as ``collect_test_metrics``
    would refuse its figures after the report's other nodes had rewritten their files. A folder without the
    record is not checked."""
    needed = {"train_summary", "trained_model"}
    if not needed <= set(pipeline.inputs()) or "train_summary" in pipeline.all_outputs():
        return
    model = local_path(catalog, "trained_model")
    if model is None:
        return
    from fastlm.datasets.atomic_folder import recover_folder
    from fastlm.datasets.pretrained_model import TRAINING_DATA

    try:
        recover_folder(model)  # a save killed between the two renames of its swap
        trained = json.loads((model / TRAINING_DATA).read_text(encoding="utf-8")).get("training_id")
        summary = catalog.load("train_summary") if catalog.exists("train_summary") else None
    except Exception:  # noqa: BLE001 - no record, or a file the nodes explain when they read it
        return
    if not isinstance(summary, dict) or not isinstance(trained, str):
        return
    from fastlm.reporting.summaries import check_one_training

    check_one_training(summary, training_id=trained, what=f"the model folder {model.as_posix()}")


class ReportOfOneTrainingHook:
    """A run that writes the report but not all the files it reads of one training (``kedro run
    --pipeline=report --nodes ...`` without ``summarize_training`` or ``compare_training_runs``) is refused
    before any node runs when one of those it does not write again was written for another training than
    ``train_summary.json``'s, as ``write_report`` would refuse it once the slice's other nodes had rewritten
    their files and an MLflow run was opened. Any run reading the summary without writing it: its training
    history and model folder are checked so too (``_check_history``, ``_check_model``)."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        outputs = pipeline.all_outputs()
        _check_history(pipeline, catalog)
        _check_model(pipeline, catalog)
        if "report_html" not in outputs or "train_summary" in outputs or "train_summary" not in catalog:
            return
        given = (run_params.get("runtime_params") or {}).get("run_name")
        if given:
            _check_report_name(str(given), catalog)
        kept = [name for name in _REPORT_SOURCES if name not in outputs and name in catalog]
        try:
            if not kept or not catalog.exists("train_summary"):
                return
            summary = catalog.load("train_summary")
            read = {_REPORT_SOURCES[name]: catalog.load(name) for name in kept if catalog.exists(name)}
        except Exception:  # noqa: BLE001 - a damaged or missing file: MissingInputsHook and the nodes say so
            return
        from fastlm.reporting.summaries import check_report_sources

        check_report_sources(summary, **read)
