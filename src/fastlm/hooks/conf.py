"""Hooks over the run's conf and parameters: the project folder the paths in them are read from,
``--params`` keys no conf file knows, every parameter group validated before any node runs, and the
tune pipeline's ``tuned_parameters`` in conf/local said in effect."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.errors import ConfigError
from fastlm.hooks.catalog import local_path, put
from fastlm.parameters import (
    GROUPS,
    check_top_level_params,
    env_parameters,
    known_top_level_params,
    runtime_only_params,
)

log = logging.getLogger(__name__)


def _conf_source(context) -> Path | None:
    """The run's conf folder (``--conf-source`` included) as Kedro's config loader reads it."""
    source = getattr(getattr(context, "config_loader", None), "conf_source", None)
    return Path(str(source)) if source else None


class ProjectFolderHook:
    """A session opened in a subfolder of the project (a notebook in ``notebooks/``, a script) works in the
    project folder, as ``kedro run`` does (:func:`fastlm.cli.in_project_folder`); one opened outside the
    project keeps its folder. Kedro makes the catalog's paths the project's, but ``train.checkpoint_dir``,
    the MLflow store (``sqlite:///mlflow.db``) and the other paths in parameters are read from the working
    folder. Moved before any other hook reads one (the MLflow hook sets its store when the context is made);
    said once."""

    @hook_impl(tryfirst=True)
    def after_context_created(self, context) -> None:
        project, here = Path(context.project_path).resolve(), Path.cwd().resolve()
        if project == here or not here.is_relative_to(project):  # a script elsewhere keeps its own folder
            return
        log.info(
            "fastlm: working in the project folder %s (opened in %s): the paths in conf/ and parameters are "
            "the project's",
            project,
            here.relative_to(project).as_posix(),
        )
        os.chdir(project)


class UnknownRuntimeParamsHook:
    """Refuse a top-level ``--params`` key that no parameters file defines and no conf file reads
    (``raw_pth=...``, ``trian.max_steps=5``): one ConfigError line with a suggestion, before any node runs.

    Keys inside a parameter group (``train.max_stesp``) are refused by the group's validation the same way; a
    misspelled top-level key would otherwise be dropped and the run go on with the defaults (the demo corpus
    re-split over the outputs). What is known: :func:`fastlm.parameters.known_top_level_params` of the run's
    conf folder (``--conf-source`` included; a packed conf archive is not read, so nothing is refused there).
    """

    def __init__(self) -> None:
        self._conf: Path | None = None

    @hook_impl
    def after_context_created(self, context) -> None:
        self._conf = _conf_source(context)
        try:
            self._params = dict(context.params)
        except Exception:  # noqa: BLE001 - a broken parameters file is Kedro's to report, when it is read
            self._params = {}

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        given = run_params.get("runtime_params") or {}
        conf = self._conf or Path(run_params.get("project_path") or ".") / "conf"
        if not conf.is_dir():
            return
        if given:
            check_top_level_params(given, known_top_level_params(conf))
        # a name the catalog reads from --params alone (raw_path), set in a parameters file: dropped silently
        for name, files in runtime_only_params(conf).items():
            value = getattr(self, "_params", {}).get(name)
            if name not in given and value is not None:
                raise ConfigError(
                    f"{name} = {value!r} is set in {', '.join(files)}, but the catalog reads {name} from "
                    "--params only: the run would read its default instead.",
                    fix=f"pass --params {name}={value} (and remove it from {files[0]}).",
                )


class ParametersValidHook:
    """Before a run starts, validate every parameter group its nodes read (``fastlm.parameters.GROUPS``): a
    bad value is one line, before any node has written anything (a node that validates on entry may run after
    others saved their outputs). Across groups: a pipeline generating from ``report.prompts`` (it writes
    ``sample_generations``) on pre-tokenized data needs them to be ids of its vocabulary
    (``reporting.params.check_id_prompts``); the report's ``top_k`` must be below the trained model's
    vocabulary (``reporting.params.check_top_k``; the evaluation checks it again on the model it loads)."""

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        parsed = {}
        for dataset in sorted(pipeline.inputs()):
            group = dataset.removeprefix("params:")
            if dataset.startswith("params:") and group in GROUPS:
                parsed[group] = GROUPS[group].parse(catalog.load(dataset))
        report, split = parsed.get("report"), parsed.get("split")
        generates = "sample_generations" in pipeline.all_outputs()
        if generates and report is not None and split is not None and split.pretokenized:
            from fastlm.reporting.params import check_id_prompts

            check_id_prompts(report.prompts, split.vocab_size)
        vocab_size = _model_vocab_size(catalog) if "trained_model" in pipeline.inputs() else None
        if report is not None and vocab_size is not None:
            from fastlm.reporting.params import check_top_k

            check_top_k(report.top_k, vocab_size)


def _model_vocab_size(catalog) -> int | None:
    """The vocabulary of the model folder's config.json (a language model's, or its text model's); None where
    the folder has none (an adapter folder, not trained yet: the nodes say so)."""
    folder = local_path(catalog, "trained_model")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return size if isinstance(size, int) and size > 0 else None


# what a pipeline that trains from params:train writes: a train run's model, a sweep's comparison of runs
_TRAINING_OUTPUTS = {"trained_model", "sweep_comparison"}


class TunedParametersHook:
    """Say, before a training run, that ``tuned_parameters`` (written by the tune pipeline into conf/local)
    is in effect, with the batching mode and micro-batch settings it gives; and after a tune run under an
    environment that does not read conf/local, that a train run under it will not use them.

    The tuned file records what it was measured on (``tune.record.measured_on``: the model and its weights,
    the split, the device, precision, adapter and checkpointing settings). A training run whose settings
    differ, or a file without the record (an older version's), does not apply it: ``params:train`` goes back
    to what the other parameters files and ``--params`` give, with one warning naming what changed and the
    fix. A tune run measures the settings without the previous tune's file.

    Without the file, a setting it sets is what conf/base gives, as the run's config loader reads it
    (globals, resolvers, interpolations and ``--params`` resolved): no other file of conf/local may set it
    (Kedro refuses a key repeated in one environment). Without a loader (the hook called alone): defaults."""

    def __init__(self) -> None:
        self._loader = None

    @hook_impl
    def after_context_created(self, context) -> None:
        self._loader = getattr(context, "config_loader", None)

    @hook_impl
    def after_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if "tuned_parameters" not in pipeline.all_outputs():
            return
        path, env = local_path(catalog, "tuned_parameters"), run_params.get("env") or "local"
        if path is not None and path.parent.name == "local" and env != "local":
            log.warning(
                "%s is not read under --env %s (conf/base and conf/%s are): `kedro run --pipeline=train` "
                "without --env uses its settings, a train run under --env %s does not",
                path,
                env,
                env,
                env,
            )

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        outputs = pipeline.all_outputs()
        trains, tunes = bool(_TRAINING_OUTPUTS & outputs), "tuned_parameters" in outputs
        if not (trains or tunes) or "tuned_parameters" not in catalog or "params:train" not in catalog:
            return
        path = local_path(catalog, "tuned_parameters")
        if path is None or not catalog.exists("tuned_parameters"):
            return
        env = run_params.get("env") or "local"
        if path.parent.name == "local" and env != "local":  # Kedro reads conf/base and conf/<env> alone
            if trains:
                log.info(
                    "%s is not read under --env %s (conf/base and conf/%s are): its tuned settings are not "
                    "used",
                    path,
                    env,
                    env,
                )
            return
        from fastlm.pipelines.tune.record import RECORD_KEY, tuned_leaves, what_changed, without_tuned

        tuned = catalog.load("tuned_parameters") or {}
        leaves = tuned_leaves(tuned)
        if not leaves:  # an empty file: nothing applied, nothing to say
            return
        loader = self._loader
        base = [env_parameters(loader, loader.base_env or "base")] if loader is not None else []
        untuned = without_tuned(
            catalog.load("params:train"),
            leaves,
            other_files=base,
            given=run_params.get("runtime_params"),
        )
        if tunes:  # measured on the conf's own settings, not the previous tune's choice
            put(catalog, "params:train", untuned)
            return
        changed = what_changed(tuned.get(RECORD_KEY), _measured_now(untuned, catalog))
        if changed:
            log.warning(
                "%s is not applied: it was measured on other settings (%s); run `kedro run --pipeline=tune` "
                "again, or delete the file",
                path,
                changed,
            )
            put(catalog, "params:train", untuned)
            return
        batching = GROUPS["train"].parse(catalog.load("params:train")).batching
        tuned_batching = (tuned.get("train") or {}).get("batching") or {}
        keys = ("mode", "micro_batch_size", "gradient_accumulation_steps")
        given = ", ".join(f"{key}={tuned_batching[key]}" for key in keys if key in tuned_batching)
        overridden = ", ".join(
            f"{key}={getattr(batching, key)}"
            for key in keys
            if key in tuned_batching and tuned_batching[key] != getattr(batching, key)
        )
        log.info(
            "%s is in effect (from `kedro run --pipeline=tune`): %s%s; delete it to go back to conf/base",
            path,
            given or "no batching settings",
            f" (--params or a later file overrides it: {overridden})" if overridden else "",
        )


def _measured_now(train: dict, catalog) -> dict:
    """What a tune run now would measure on (``tune.record.measured_on``) with ``train`` (``params:train``
    without the tuned file's settings)."""
    from fastlm.corpus.fingerprint import data_identity
    from fastlm.pipelines.tune.record import device_description, measured_on

    params = GROUPS["train"].parse(train)
    split = GROUPS["split"].parse(catalog.load("params:split"))
    name = "tokenized_corpus_fingerprint"
    fingerprint = catalog.load(name) if name in catalog and catalog.exists(name) else None
    try:
        device = device_description(params.runtime.device)
    except Exception:  # noqa: BLE001 - a device that is not there: the training run says so itself
        device = params.runtime.device
    return measured_on(params, max_length=split.max_length, data=data_identity(fingerprint), device=device)
