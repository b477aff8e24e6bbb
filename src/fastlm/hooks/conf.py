"""Hooks over the run's conf and parameters: the project folder the paths in them are read from,
``--params`` keys no conf file knows, every parameter group validated before any node runs, the
tune pipeline's ``tuned_parameters`` in conf/local said in effect, and mlflow.yml's local store made an
absolute path."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from kedro.framework.hooks import hook_impl

from fastlm.engine.paths import project_name
from fastlm.errors import ConfigError
from fastlm.hooks.catalog import local_path, put
from fastlm.parameters import (
    GROUPS,
    check_top_level_params,
    env_parameters,
    known_top_level_params,
    misread_top_level_keys,
    named_in,
    packed_conf,
    packed_conf_file,
    runtime_only_params,
    setting_file,
    unread_parameters_files,
)
from fastlm.tracking import local_store_uri

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
    folder. Moved before any other hook reads one (the MLflow hook reads its store's path as the run starts);
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
        loader = getattr(context, "config_loader", None)
        self._patterns = dict(getattr(loader, "config_patterns", None) or {})
        self._envs = (
            getattr(loader, "base_env", None) or "base",
            getattr(loader, "env", None) or getattr(loader, "default_run_env", None) or "local",
        )
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
        # a top-level key of a parameters file that no node reads: dropped silently (the nodes' reads are
        # looked up only for a key that looks meant for another name: building every pipeline costs seconds)
        misread = misread_top_level_keys(conf, self._envs, set())
        read = _params_nodes_read() if misread else None
        if read is not None:
            for file, key, meant in misread_top_level_keys(conf, self._envs, read):
                nested = key.split(".", 1)
                raise ConfigError(
                    f"{project_name(file)} sets {key}, which no node reads"
                    + ("" if nested[0] == meant else f" (did you mean {meant}?)")
                    + ": it would be left out of the run.",
                    fix=f"write it as {meant}: {{{nested[1]}: ...}} (a key with a dot in a parameters file "
                    "is one name, not a path)."
                    if len(nested) > 1 and nested[0] == meant
                    else f"correct it to {meant} in {project_name(file)}.",
                )
        patterns = getattr(self, "_patterns", {})
        if "parameters" in patterns:  # a parameters file under a name Kedro does not read: dropped silently
            for file, keys, renamed in unread_parameters_files(conf, self._envs, patterns):
                read = ", ".join(patterns["parameters"])
                raise ConfigError(
                    f"{project_name(file)} is not read: Kedro reads parameters from files named parameters* "
                    f"alone ({read}), so what it sets ({', '.join(keys)}) would be left out of the run.",
                    fix=f"rename it to {project_name(renamed)} (or move it out of conf/ if it is not "
                    "meant to be read).",
                )
        # a name the catalog reads from --params alone (raw_path), set in a parameters file: dropped silently
        for name, files in runtime_only_params(conf).items():
            value = getattr(self, "_params", {}).get(name)
            if name not in given and value is not None:
                raise ConfigError(
                    f"{name} = {value!r} is set in {', '.join(files)}, but the catalog reads {name} from "
                    "--params only: the run would read its default instead.",
                    fix=f"pass --params {name}={value} (and remove it from {files[0]}).",
                )


def _params_nodes_read() -> set[str] | None:
    """The top-level parameter names the project's nodes take (``params:<name>``), the registered pipelines'
    and fastlm's own; None where a node takes every parameter (``parameters``): nothing is unread then."""
    from fastlm.hooks.inputs import all_pipelines

    pipelines = list(all_pipelines().values())
    try:
        from kedro.framework.project import pipelines as registered

        pipelines += list(registered.values())
    except Exception:  # noqa: BLE001 - no project bootstrapped (a notebook, a test): fastlm's own
        pass
    inputs = {name for pipeline in pipelines for name in pipeline.inputs()}
    if "parameters" in inputs:
        return None
    return {name.removeprefix("params:").split(".", 1)[0] for name in inputs if name.startswith("params:")}


class ParametersValidHook:
    """Before a run starts, validate every parameter group its nodes read (``fastlm.parameters.GROUPS``): a
    bad value is one line, before any node has written anything (a node that validates on entry may run after
    others saved their outputs). Across groups: a pipeline generating from ``report.prompts`` (it writes
    ``sample_generations``) on pre-tokenized data needs them to be ids of its vocabulary
    (``reporting.params.check_id_prompts``); the report's ``top_k`` must be below the trained model's
    vocabulary (``reporting.params.check_top_k``; the evaluation checks it again on the model it loads)."""

    def __init__(self) -> None:
        self._loader = None

    @hook_impl
    def after_context_created(self, context) -> None:
        self._loader = getattr(context, "config_loader", None)

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        try:
            _validate_groups(pipeline, catalog)
        except ConfigError as error:
            raise self._named_where_set(error, run_params) from None

    def _named_where_set(self, error: ConfigError, run_params: dict) -> ConfigError:
        """``error`` with its fix naming where the value it names was set: a value given with ``--params``
        (the run's ``runtime_params``) is to be changed there first, as it overrides every parameters file;
        in the fix, conf/base/parameters_<group>.yml is replaced by the parameters file of the run's
        environment (``--env``, else conf/local) that sets the value, which overrides conf/base, so editing
        conf/base would change nothing; a misspelled key (``unknown parameter train.optimzer``) is named in
        the file that writes it, of the environment or of conf/base. Unchanged where neither applies, or where
        the conf is packed or remote (for the file)."""
        what, said, fix = str(error).partition(" Fix: ")
        if not said:
            return error
        changed = self._file_named(what, fix, run_params)
        given = named_in(run_params.get("runtime_params") or {}, what)
        if what.startswith("sweep file "):  # a key or value of the file --params sweep names: fixed there
            given = [name for name in given if name != "sweep"]
        if given:
            where = "this run's --params" + (" (or its --config file's run.params)" if _config_file() else "")
            if "unknown parameter" in what and self._written_in_no_file(what, run_params):
                return type(error)(
                    what, fix=f"correct {' and '.join(given)} in {where}: no parameters file writes it."
                )
            changed = (
                f"change {' and '.join(given)} in {where} first (a --params value overrides every parameters "
                f"file: editing one changes nothing while it is given); {changed}"
            )
        return error if changed == fix else type(error)(what, fix=changed)

    def _conf_envs(self, run_params: dict) -> tuple[Path | None, str, str]:
        """The run's conf folder (None where it is packed or remote), its environment and base environment."""
        loader = self._loader
        if loader is not None:
            source = str(getattr(loader, "conf_source", "") or "")
            conf = None if not source or packed_conf(source) or "://" in source else Path(source)
            env = getattr(loader, "env", None) or getattr(loader, "default_run_env", None) or "local"
            base = getattr(loader, "base_env", None) or "base"
        else:  # the hook called alone
            conf = Path(run_params.get("project_path") or ".") / "conf"
            env, base = run_params.get("env") or "local", "base"
        return conf, env, base

    def _written_in_no_file(self, what: str, run_params: dict) -> bool:
        """Whether no parameters file of the run's environment or of its base writes a value ``what`` names
        (False where the conf cannot be read here: packed or remote)."""
        conf, env, base = self._conf_envs(run_params)
        return conf is not None and all(setting_file(conf, name, what) is None for name in {env, base})

    def _file_named(self, what: str, fix: str, run_params: dict) -> str:
        """``fix`` with conf/base's parameters file replaced by the run environment's that sets a value
        ``what`` names (see ``_named_where_set``)."""
        conf, env, base = self._conf_envs(run_params)
        bases = [group.source for group in GROUPS.values() if group.source in fix]
        if conf is None or env == base or not bases:
            return fix
        found = setting_file(conf, env, what)
        if found is None and "unknown parameter" in what:  # a misspelled key written in another base file
            found = setting_file(conf, base, what)
            if found is not None and found.resolve() == (conf.parent / bases[0]).resolve():
                return fix
        if found is None:
            return fix
        shown = found.resolve()
        here = Path.cwd().resolve()
        shown = shown.relative_to(here) if shown.is_relative_to(here) else shown
        for source in bases:
            fix = fix.replace(source, str(shown))
        return fix


def _config_file() -> bool:
    """Whether the run's command (``kedro run``, under click) read parameters from a ``--config`` file's
    ``run.params``: they reach the hooks as ``--params`` do (``cli.run_params`` merges the two)."""
    import click

    context = click.get_current_context(silent=True)
    return bool(context is not None and (context.default_map or {}).get("params"))


def _validate_groups(pipeline, catalog) -> None:
    """Every parameter group ``pipeline`` reads parsed, and the checks across groups (see the class)."""
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
    from fastlm.datasets.atomic_folder import recover_folder

    folder = local_path(catalog, "trained_model")
    try:
        recover_folder(folder)  # a save killed between the two renames of its swap
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return size if isinstance(size, int) and size > 0 else None


# what a pipeline that trains from params:train writes: a train run's model, a sweep's comparison of runs
_TRAINING_OUTPUTS = {"trained_model", "sweep_comparison"}
# what the split writes of the tokenized data, which the training reads; its entry in a tune's record
_FINGERPRINT = "tokenized_corpus_fingerprint"


class TunedParametersHook:
    """Say, before a training run, that ``tuned_parameters`` (written by the tune pipeline into conf/local)
    is in effect, with the batching mode and micro-batch settings it gives; and after a tune run under an
    environment that does not read conf/local, that a train run under it will not use them.

    The file is the one the run's config loader reads: under ``--conf-source <folder>`` the catalog's
    conf/local/parameters_tuned.yml (a path in the project's conf folder) is that folder's local/ file, which
    the tune writes and a train run with the same ``--conf-source`` reads; a packed conf (``.tar.gz``,
    ``.zip``) is read, not written: the tune writes the catalog's file and says that runs with that conf do
    not read it, a train run checks the file packed in it.

    The tuned file records what it was measured on (``tune.record.measured_on``: the model and its weights,
    the split, the device, precision, adapter and checkpointing settings). A training run whose settings
    differ, or a file without the record (an older version's), does not apply it: ``params:train`` goes back
    to what the other parameters files and ``--params`` give, with one warning naming what changed and the
    fix. A run whose split writes the tokenized data (``kedro run``: split, train, report) compares the data
    once the split wrote it, before the first node reading ``params:train`` (the other settings before the run
    starts). A tune run measures the settings without the previous tune's file.

    Without the file, a setting it sets is what conf/base gives, as the run's config loader reads it
    (globals, resolvers, interpolations and ``--params`` resolved): no other file of conf/local may set it
    (Kedro refuses a key repeated in one environment). Without a loader (the hook called alone): defaults."""

    def __init__(self) -> None:
        self._loader = None
        self._project: Path | None = None
        # (where, tuned, untuned): the tuned file whose data is checked once this run's split wrote it
        self._pending: tuple | None = None
        self._catalog = None  # the run's catalog, where the pending check puts ``params:train``

    @hook_impl
    def after_context_created(self, context) -> None:
        self._loader = getattr(context, "config_loader", None)
        project = getattr(context, "project_path", None)
        self._project = Path(project) if project else None

    @hook_impl
    def after_catalog_created(self, catalog) -> None:
        """``tuned_parameters`` naming a file of the project's conf folder, under another ``--conf-source``
        folder: that folder's file at the same place (the one its runs read, the one its tune writes)."""
        path, conf = local_path(catalog, "tuned_parameters"), self._conf_folder()
        if path is None or conf is None or self._project is None:
            return
        project_conf = (self._project / "conf").resolve()
        here = path.resolve()
        if not here.is_relative_to(project_conf) or project_conf == conf.resolve():
            return
        moved = conf / here.relative_to(project_conf)
        try:
            catalog["tuned_parameters"] = type(catalog["tuned_parameters"])(filepath=str(moved))
        except Exception:  # noqa: BLE001 - a dataset type of other arguments: the catalog's file is kept
            log.warning("%s is kept: runs with --conf-source %s read %s instead", path, conf, moved)

    def _conf_source(self) -> str | None:
        source = getattr(self._loader, "conf_source", None)
        return str(source) if source else None

    def _conf_folder(self) -> Path | None:
        """The run's conf folder; None without a loader, or for a packed or remote conf."""
        source = self._conf_source()
        return None if source is None or packed_conf(source) or "://" in source else Path(source)

    def _envs(self, run_params: dict) -> tuple[str, str]:
        """(base environment, run environment) as the loader reads them."""
        loader = self._loader
        env = getattr(loader, "env", None) or getattr(loader, "default_run_env", None)
        return getattr(loader, "base_env", None) or "base", env or run_params.get("env") or "local"

    def _read(self, path: Path, env: str, base: str) -> bool:
        """Whether the run's config loader reads the catalog's tuned file ``path``."""
        if self._conf_source() is not None and self._conf_folder() is None:
            return False  # a packed or remote conf: its own files are read, not this one
        conf = self._conf_folder()
        if conf is None:  # the hook called alone: conf/local is read under the default environment only
            return not (path.parent.name == "local" and env != "local")
        here, folder = path.resolve(), conf.resolve()
        return here.is_relative_to(folder) and here.relative_to(folder).parts[0] in (base, env)

    @hook_impl
    def on_pipeline_error(self, error, run_params: dict, pipeline, catalog) -> None:
        from fastlm.pipelines.tune.record import set_in_effect

        set_in_effect(None)  # the next run of this process (a test, a notebook) decides its own

    @hook_impl
    def after_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        from fastlm.pipelines.tune.record import set_in_effect

        set_in_effect(None)  # the next run of this process (a test, a notebook) decides its own
        if "tuned_parameters" not in pipeline.all_outputs():
            return
        path = local_path(catalog, "tuned_parameters")
        base, env = self._envs(run_params)
        if path is None or self._read(path, env, base):
            return
        source = self._conf_source()
        if self._conf_folder() is None and source is not None:
            log.warning(
                "%s is not read by runs with --conf-source %s (its own files are): put the file in it as "
                "%s/%s, or run with an unpacked conf folder",
                path,
                source,
                env,
                path.name,
            )
            return
        log.warning(
            "%s is not read under --env %s (conf/base and conf/%s are): `kedro run --pipeline=train` "
            "without --env uses its settings, a train run under --env %s does not",
            path,
            env,
            env,
            env,
        )

    def _tuned(self, path: Path, catalog, run_params: dict, trains: bool) -> tuple[str, dict | None] | None:
        """(where, contents) of the tuned file the run reads (None: no such file); None where the run reads
        none of the catalog's (said for a training run under another environment)."""
        base, env = self._envs(run_params)
        source = self._conf_source()
        if source is not None and self._conf_folder() is None:
            return packed_tuned_file(source, env, path.name) if packed_conf(source) else None
        if not catalog.exists("tuned_parameters"):
            return None
        if not self._read(path, env, base):
            if trains:
                log.info(
                    "%s is not read under --env %s (conf/base and conf/%s are): its tuned settings are not "
                    "used",
                    path,
                    env,
                    env,
                )
            return None
        return str(path), catalog.load("tuned_parameters")

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        from fastlm.pipelines.tune.record import set_in_effect

        self._pending, self._catalog = None, catalog
        set_in_effect(None)
        outputs = pipeline.all_outputs()
        trains, tunes = bool(_TRAINING_OUTPUTS & outputs), "tuned_parameters" in outputs
        if not (trains or tunes) or "tuned_parameters" not in catalog or "params:train" not in catalog:
            return
        path = local_path(catalog, "tuned_parameters")
        if path is None:
            return
        if tunes:  # before any trial: a file the next runs could not read is never written
            from fastlm.pipelines.tune.record import refuse_clashing_files

            refuse_clashing_files(path, catalog.load("params:train"))
        found = self._tuned(path, catalog, run_params, trains)
        if found is None:
            return
        where, tuned = found
        from fastlm.pipelines.tune.record import check_tuned_file, tuned_leaves, without_tuned

        if trains:  # a tune measures without the file and replaces it
            check_tuned_file(where, tuned)
        tuned = tuned or {}
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
        if _FINGERPRINT in outputs:  # this run's split rewrites the data: the settings now, the data later
            if self._check(where, tuned, untuned, catalog, data=False):
                self._pending = (where, tuned, untuned)
            return
        self._check(where, tuned, untuned, catalog, data=True)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        """The tokenized data's fingerprint written by this run's split: the tuned file checked on it, before
        any later node loads ``params:train`` (not applied: ``params:train`` without it in the catalog, so
        every hook of those nodes, MLflow's parameter logging included, sees what they run with)."""
        if self._pending is None or dataset_name != _FINGERPRINT or self._catalog is None:
            return
        (where, tuned, untuned), self._pending = self._pending, None
        self._check(where, tuned, untuned, self._catalog, data=True, split=True)

    @hook_impl
    def before_node_run(self, node, catalog, inputs: dict) -> dict | None:
        """The first node reading ``params:train`` of a run whose split wrote the tokenized data, where the
        check did not run when the fingerprint was saved: the tuned file checked on the data written (not
        applied: that node and the later ones get ``params:train`` without it)."""
        if self._pending is None or "params:train" not in node.inputs:
            return None
        (where, tuned, untuned), self._pending = self._pending, None
        if self._check(where, tuned, untuned, catalog, data=True, split=True):
            return {"params:train": catalog.load("params:train")}  # its accumulation for this run's processes
        return {"params:train": untuned}

    def _check(
        self, where: str, tuned: dict, untuned: dict, catalog, *, data: bool, split: bool = False
    ) -> bool:
        """Whether the tuned file ``tuned`` (read from ``where``) applies: measured on the settings now (and,
        with ``data``, the tokenized data in the catalog: with ``split``, the data this run's split wrote),
        said so once that is known; else one warning and ``params:train`` without it (``untuned``)."""
        from fastlm.pipelines.tune.record import (
            DATA_KEY,
            RECORD_KEY,
            TunedInEffect,
            limited_device,
            set_in_effect,
            tuned_for,
            tuned_leaves,
            what_changed,
        )

        recorded = tuned.get(RECORD_KEY)
        if not data and isinstance(recorded, dict):  # the data is compared once this run's split wrote it
            recorded = {key: value for key, value in recorded.items() if key != DATA_KEY}

        def changes(train: dict) -> str | None:
            now = _measured_now(train, catalog)
            if not data:
                now.pop(DATA_KEY, None)
            # tuned under tune.memory_limit_gb: for a device of its kind with that much memory, not its card
            device = limited_device(recorded, now, requested=GROUPS["train"].parse(train).runtime.device)
            return "; ".join(filter(None, [device, what_changed(recorded, now)])) or None

        changed = changes(untuned)
        if changed:
            log.warning(
                "%s is not applied: it was measured on other settings (%s)%s; run "
                "`kedro run --pipeline=tune` again, or delete the file",
                where,
                changed,
                " (the data this run's split wrote)" if split else "",
            )
            put(catalog, "params:train", untuned)
            return False
        _valid_with(where, catalog.load("params:train"), untuned)
        if not data:
            return True
        tuned_batching = (tuned.get("train") or {}).get("batching") or {}
        # what --params or a later file set over the file, before the file's own rescaling for the processes
        batching = GROUPS["train"].parse(catalog.load("params:train")).batching
        keys = ("mode", "micro_batch_size", "gradient_accumulation_steps")
        given = ", ".join(f"{key}={tuned_batching[key]}" for key in keys if key in tuned_batching)
        overridden = ", ".join(
            f"{key}={getattr(batching, key)}"
            for key in keys
            if key in tuned_batching and tuned_batching[key] != getattr(batching, key)
        )
        processes = _for_processes(where, tuned, tuned_batching, catalog, untuned)
        if processes is None:
            put(catalog, "params:train", untuned)
            return False
        leaves = tuple(tuned_leaves(tuned))
        set_in_effect(TunedInEffect(where, leaves, untuned, changes))  # a sweep checks each of its runs
        limited = tuned_for(recorded)
        log.info(
            "%s is in effect (from `kedro run --pipeline=tune`%s): %s%s%s; delete it to go back to conf/base",
            where,
            f", {limited}" if limited else "",
            given or "no batching settings",
            f" (--params or a later file overrides it: {overridden})" if overridden else "",
            f"; {processes}" if processes else "",
        )
        return True


def _valid_with(where: str, train: dict, untuned: dict) -> None:
    """Refuse in one line naming the tuned file ``where`` a value it sets that ``params:train`` cannot take
    (a hand edit: ``micro_batch_size: 0``), where the run's parameters without it (``untuned``) are valid:
    the parser's own line would send the user to conf/base."""
    try:
        GROUPS["train"].parse(train)
    except ConfigError as error:
        try:
            GROUPS["train"].parse(untuned)
        except ConfigError:
            return  # the other files' own problem: the node's parsing says it
        problem = str(error).split(" Fix: ")[0].removesuffix(".")
        raise ConfigError(
            f"{where}: {problem}.",
            fix=f"correct the value in {where}, run `kedro run --pipeline=tune` again, or delete the file.",
        ) from None


def _for_processes(where: str, tuned: dict, tuned_batching: dict, catalog, untuned: dict) -> str | None:
    """The tuned accumulation for the processes this run's step spans (``engine.config.train_processes``):
    where the file's is for another count (``tune_accumulation``), or the run trains another micro-batch
    (``--params``, a later file) with the file's accumulation, ``params:train`` gets the accumulation that
    keeps the tuned target, and the sentence saying so is returned (empty: nothing to change); where the
    target cannot be kept, one warning. An accumulation given over the file's is the run's own.
    An accumulation the tune did not choose (``tune.target_effective_batch`` null: it copied the conf's) is
    the run's own without the file (``untuned``: conf/base's as it is now), said where the two differ.
    None: not applied (warned): a file that does not record its process count, on more than one process."""
    from fastlm.engine.config import train_processes
    from fastlm.pipelines.tune.record import ACCUMULATION_KEY, accumulation_for_processes

    raw = catalog.load("params:train")
    params = GROUPS["train"].parse(raw)
    batching = params.batching
    accumulation = tuned_batching.get("gradient_accumulation_steps")
    if accumulation is None or accumulation != batching.gradient_accumulation_steps:
        return ""  # no tuned accumulation, or --params / a later file sets it: the run's own
    recorded = tuned.get(ACCUMULATION_KEY)
    if isinstance(recorded, dict) and "target_effective_batch" in recorded:
        if recorded["target_effective_batch"] is None:  # copied from the conf: the conf's now applies
            return _own_accumulation(raw, batching.gradient_accumulation_steps, untuned, catalog)
    measured, tuned_mode = tuned_batching.get("micro_batch_size"), tuned_batching.get("mode")
    given = (measured is not None and measured != batching.micro_batch_size) or (
        tuned_mode is not None and tuned_mode != batching.mode
    )
    if given and not isinstance(recorded, dict):
        return ""  # a micro-batch or mode given over a file that does not record its target: as it is given
    modes = (tuned_mode, batching.mode) if tuned_mode is not None and tuned_mode != batching.mode else None
    target = recorded.get("target_effective_batch") if isinstance(recorded, dict) else None
    if modes and target is not None and batching.mode != "length_grouped":
        log.warning(
            "%s: its gradient_accumulation_steps %d was chosen for %s micro-batches to hold "
            "tune.target_effective_batch %s samples a step; a %s micro-batch holds another number of "
            "samples, so this run's steps do not hold that target: give "
            "train.batching.gradient_accumulation_steps with --params, or tune with tune.modes: [%s]",
            where,
            batching.gradient_accumulation_steps,
            tuned_mode,
            target,
            batching.mode,
            batching.mode,
        )
        return ""
    processes = train_processes(params.distributed.nproc_per_node)
    steps, said, kept = accumulation_for_processes(
        tuned.get(ACCUMULATION_KEY),
        accumulation=batching.gradient_accumulation_steps,
        micro_batch_size=batching.micro_batch_size,
        processes=processes,
        tuned_micro_batch_size=measured,
        modes=modes,
    )
    if said is None and not kept:
        log.warning(
            "%s is not applied: its gradient_accumulation_steps was chosen for one process and this run's "
            "step spans %d (train.distributed.nproc_per_node, or torchrun's world size), which it does not "
            "record (written by an older version); run `kedro run --pipeline=tune` again, or delete the file",
            where,
            processes,
        )
        return None
    if said is None:
        return ""
    put(
        catalog,
        "params:train",
        {**raw, "batching": {**(raw.get("batching") or {}), "gradient_accumulation_steps": steps}},
    )
    if not kept:
        log.warning("%s: the tuned target cannot be kept: %s", where, said)
        return ""
    return said


def _own_accumulation(raw: dict, tuned: int, untuned: dict, catalog) -> str:
    """``params:train`` (``raw``, with the tuned file's accumulation ``tuned``) given the accumulation of the
    run without the file (``untuned``), where a tune without ``tune.target_effective_batch`` copied another
    value (conf/base's since changed, or a tune's ``--params``): the sentence saying so (empty: the same)."""
    try:
        own = GROUPS["train"].parse(untuned).batching.gradient_accumulation_steps
    except ConfigError:
        return ""  # the other files' own problem: the node's parsing says it
    if own == tuned:
        return ""
    put(
        catalog,
        "params:train",
        {**raw, "batching": {**(raw.get("batching") or {}), "gradient_accumulation_steps": own}},
    )
    return (
        f"gradient_accumulation_steps {tuned} -> {own}: the tune kept the accumulation it was given "
        f"(tune.target_effective_batch: null), and this run's without the file is {own}"
    )


def packed_tuned_file(source: str, env: str, name: str) -> tuple[str, dict | None] | None:
    """(where, contents) of the tuned file ``name`` in environment ``env`` of the packed conf ``source``; None
    where it holds none. A file that is no YAML mapping: said, None (Kedro's loader reports it too)."""
    import yaml

    data = packed_conf_file(source, f"{env}/{name}")
    if data is None:
        return None
    where = f"{env}/{name} in {source}"
    try:
        tuned = yaml.safe_load(data)
    except yaml.YAMLError as error:
        log.warning("%s could not be read (%s): its tuned settings are not checked", where, error)
        return None
    return where, tuned if isinstance(tuned, dict) else None


def _measured_now(train: dict, catalog) -> dict:
    """What a tune run now would measure on (``tune.record.measured_on``) with ``train`` (``params:train``
    without the tuned file's settings)."""
    from fastlm.corpus.fingerprint import data_identity
    from fastlm.pipelines.tune.record import device_description, measured_on

    params = GROUPS["train"].parse(train)
    split = GROUPS["split"].parse(catalog.load("params:split"))
    name = _FINGERPRINT
    fingerprint = catalog.load(name) if name in catalog and catalog.exists(name) else None
    try:
        device = device_description(params.runtime.device)
    except Exception:  # noqa: BLE001 - a device that is not there: the training run says so itself
        device = params.runtime.device
    return measured_on(params, max_length=split.max_length, data=data_identity(fingerprint), device=device)


def pin_local_store(config_loader) -> str | None:
    """The session's mlflow.yml with a local SQLite store named relative to the working folder (the default
    ``sqlite:///mlflow.db``) as its absolute path (``fastlm.tracking.local_store_uri``), so that each project
    run in one process tracks into its own store. Returns the store's URI (kedro-mlflow's: mlflow.yml's, else
    ``MLFLOW_TRACKING_URI``)."""
    config_loader.config_patterns.setdefault("mlflow", ["mlflow*", "mlflow*/**", "**/mlflow*"])
    conf = config_loader["mlflow"]
    server = conf.get("server") or {}
    uri = server.get("mlflow_tracking_uri")
    if local_store_uri(uri) != uri:
        config_loader["mlflow"] = {**conf, "server": {**server, "mlflow_tracking_uri": local_store_uri(uri)}}
    return local_store_uri(uri if uri is not None else os.environ.get("MLFLOW_TRACKING_URI"))
