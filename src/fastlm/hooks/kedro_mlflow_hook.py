"""kedro-mlflow's hook with every secret masked and failing open (``RedactingMlflowHook``). Importing this
module imports MLflow (seconds): ``fastlm.hooks.MlflowTrackingHook`` loads it when a run starts, after the
project's checks, so that a refused run sets up no MLflow. MLflow itself is reached through
``fastlm.tracking`` only."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from kedro.framework.hooks import hook_impl
from kedro_mlflow.framework.hooks.mlflow_hook import MAX_PARAM_VAL_LENGTH, MlflowHook

from fastlm.hooks.conf import pin_local_store
from fastlm.hooks.run_outputs import RUN_NAME
from fastlm.redaction import redact
from fastlm.tracking import (
    PROCESS_TAG,
    SafeMlflow,
    active_run_id,
    begin_session_tracking,
    bound_tracking_requests,
    end_interrupted_runs,
    end_runs_of_gone_processes,
    end_session_tracking,
    note_session_run,
    param_text,
    process_tag,
    register_project_artifacts,
    session_tracking_set,
    set_run_status,
    setting_up_store,
    share_run_with_workers,
    stopped_by_user,
    store_problem,
)

_GATHERING = threading.local()  # RedactingMlflowHook: the parameters of the node whose hooks this thread runs


def logged_parameters(name: str, value):
    """A node's parameter input ``name`` as its run logs it: secrets masked, and where
    ``train.optimizer.warmup_ratio`` is set, ``train.optimizer.warmup_steps`` (the config's default, which
    the ratio replaces) left out; the run logs the warmup it used as ``warmup_steps``."""
    value = redact(value, name.removeprefix("params:"))
    train = value if name == "params:train" else None
    if name == "parameters" and isinstance(value, dict):
        train = value.get("train")
    optimizer = train.get("optimizer") if isinstance(train, dict) else None
    if isinstance(optimizer, dict) and optimizer.get("warmup_ratio") is not None:
        optimizer.pop("warmup_steps", None)  # redact's copy
    return value


class RedactingMlflowHook(MlflowHook):
    """kedro-mlflow's hook, fed copies of the parameters and run parameters with every secret masked.

    kedro-mlflow logs each node's ``params:*`` inputs verbatim as MLflow parameters and the run parameters
    (``--params`` included) as tags. This subclass replaces the plugin's own hook (``MlflowTrackingHook``
    calls it in the plugin's place, from the run's start), so what reaches MLflow is
    :func:`fastlm.redaction.redact`'s copy; the nodes still receive the real values.

    It also fails open: MLflow's requests get bounded retries and timeout, and the first failing tracking call
    (server down, a corrupt ``mlflow.db``) warns once and turns tracking off for the run; training and every
    local output continue.
    """

    @hook_impl
    def after_catalog_created(self, catalog, **kwargs) -> None:
        """Nothing: the plugin's version builds every catalog entry (seconds of imports at each start-up) to
        rename kedro-mlflow metric datasets, which this project does not use (MlflowArtifactsHook logs)."""

    @hook_impl
    def after_context_created(self, context) -> None:
        """The plugin's set-up (mlflow.yml read, the store and experiment set), called by MlflowTrackingHook
        as the run starts."""
        bound_tracking_requests()
        end_interrupted_runs()  # a run an earlier session in this process left open (Ctrl-C in a notebook)
        register_project_artifacts()  # the experiment's artefacts live next to the project's store
        begin_session_tracking()  # put back at the run's end: a later session in this process starts clean
        uri = None
        with contextlib.suppress(Exception):  # a missing or broken mlflow.yml: the plugin's own handling
            uri = pin_local_store(context.config_loader)
        self._tracking = SafeMlflow()  # one per run: this hook object outlives a session in-process
        with setting_up_store():  # a new store's tables: made by one command at a time
            # a store a cut set-up left: named with its fix, left as it is (MLflow would re-make a missing
            # table in its first schema), and the run goes on untracked, as with any failing store
            problem = store_problem(uri) if active_run_id() is None else None
            if problem is not None:
                self._tracking.give_up(problem)
            self._tracking.call(
                "tracking setup",
                lambda _: super(RedactingMlflowHook, self).after_context_created(context),
                needs_active_run=False,
            )
        session_tracking_set()

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if RUN_NAME in catalog and getattr(self, "mlflow_config", None) is not None:
            self.mlflow_config.tracking.run.name = catalog.load(RUN_NAME)  # resolved by RunNameHook
        run_params = redact(run_params)
        opened_before = active_run_id()

        def start() -> None:
            # a try before this one opened the run, then its tags were refused (the store locked by another
            # command): the run stays the one opened, its tags are this hook's below; the plugin again would
            # open a second run, nested in the first, and leave the first RUNNING
            if getattr(self, "_already_active_mlflow", True) or active_run_id() in (None, opened_before):
                super(RedactingMlflowHook, self).before_pipeline_run(run_params, pipeline, catalog)

        self._guarded("run start", start)
        if not getattr(self, "_already_active_mlflow", True):  # this run is the session's own
            note_session_run()  # Ctrl-C outside training: ended KILLED at exit, not FINISHED by MLflow
        if "ParallelRunner" in str(run_params.get("runner")):
            share_run_with_workers()  # the workers' metrics are this run's
            self._log_pipeline_parameters(pipeline, catalog)
        # Tags as values: the runner's class name, not its repr; lists and --params as JSON.
        tags = {key: text for key, value in run_params.items() if value and (text := param_text(value))}
        tags[PROCESS_TAG] = process_tag()  # a run this process leaves RUNNING is ended by a later one
        tracking = getattr(self, "_tracking", None)
        if tracking is not None:  # skipped once tracking has failed
            tracking.call("tagging", lambda mlflow: mlflow.set_tags(tags))
            tracking.call(
                "ending runs of processes that are gone",
                lambda mlflow: end_runs_of_gone_processes(mlflow, mlflow.active_run().info.experiment_id),
            )

    def _log_pipeline_parameters(self, pipeline, catalog) -> None:
        """Under Kedro's ParallelRunner the node hooks run in its workers: a forked one has this hook, the
        run active and logs each node's parameters as it starts; a spawned one has the project's hooks fresh,
        without this run's set-up, and logs none. Every node's parameters are logged here, in the process
        that opened the run, as the run starts (a forked worker's are then the same values again)."""
        names = sorted(n for n in pipeline.inputs() if n.startswith("params:") or n == "parameters")
        if names:
            self.before_node_run(None, catalog, {name: catalog.load(name) for name in names}, False)

    @hook_impl
    def before_node_run(self, node, catalog, inputs: dict, is_async: bool) -> None:
        logged = {
            name: logged_parameters(name, value)
            if name.startswith("params:") or name == "parameters"
            else value
            for name, value in inputs.items()
        }
        run_id = self.run_id
        if run_id is not None and active_run_id() == run_id:
            # kedro-mlflow re-opens its run at every node (for threaded runners); MLflow 3 then stacks the
            # same run once per node, and closing it takes as many end_run calls: the last one, at exit, set
            # FINISHED on failed runs. Only a thread without the run re-opens it.
            self.run_id = None
        try:
            with self._gathering() as batch:  # the plugin's one log_param per key: a write or request each
                self._guarded("parameter logging", super().before_node_run, node, catalog, logged, is_async)
            if (tracking := getattr(self, "_tracking", None)) is not None:
                tracking.call("parameter logging", self._log_batch, active_run_id(), batch)
        finally:
            self.run_id = run_id

    @hook_impl
    def after_pipeline_run(self, run_params, pipeline, catalog) -> None:
        try:
            self._ending("FINISHED", super().after_pipeline_run, run_params, pipeline, catalog)
        finally:
            end_session_tracking()

    @hook_impl
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        """A run stopped by a stop signal or Ctrl-C (the training loop's graceful stop) ends KILLED, any other
        failure FAILED (the plugin's)."""
        try:
            if stopped_by_user(error) and not getattr(self, "_already_active_mlflow", True):
                self._guarded("run end", lambda: end_interrupted_runs(self.run_id))
            else:
                self._ending("FAILED", super().on_pipeline_error, error, run_params, pipeline, catalog)
        finally:
            end_session_tracking()

    def _guarded(self, what: str, method, *args) -> None:
        tracking = getattr(self, "_tracking", None)
        if tracking is None or tracking.failed:
            return
        tracking.call(what, lambda _: method(*args), needs_active_run=False)

    def _ending(self, status: str, method, *args) -> None:
        """The plugin's run end (``method``), tried again where the store was locked: MLflow's ``end_run``
        lets go of the run before it writes its status, so a retry of it found no run to end and left the run
        RUNNING, silently. A retry after that writes the run's ``status`` itself."""
        run_id, tries = getattr(self, "run_id", None) or active_run_id(), []

        def end() -> None:
            if tries and run_id is not None and active_run_id() is None:
                set_run_status(run_id, status)
            else:
                tries.append(1)
                method(*args)

        self._guarded("run end", end)

    def _log_param(self, name: str, value) -> None:
        """Typed values: an unset parameter is not logged (no 'None' string); lists and mappings as JSON.
        In a node's parameter logging they are gathered for one batch (``_log_batch``); one longer than MLflow
        takes goes to the plugin's ``long_params_strategy`` (truncate, tag or fail) at once."""
        text = param_text(value)
        if text is None:
            return
        batch = getattr(_GATHERING, "params", None)
        if batch is None or len(text) > MAX_PARAM_VAL_LENGTH:
            super()._log_param(name, text)
        else:
            batch[name] = text

    @staticmethod
    @contextlib.contextmanager
    def _gathering() -> Iterator[dict[str, str]]:
        """``_log_param`` gathers into the dict yielded, in this thread only (a threaded runner runs several
        nodes' hooks at once)."""
        _GATHERING.params = batch = {}
        try:
            yield batch
        finally:
            _GATHERING.params = None

    def _log_batch(self, mlflow, run_id: str, batch: dict[str, str]) -> None:
        """A node's parameters in one write to the active run ``run_id``, less those already logged to it with
        the same value (the nodes of a pipeline share ``params:split``, ``params:train``); MLflow refuses a
        changed value as it did one key at a time."""
        if getattr(self, "_sent_to", None) != run_id:  # another run: nothing of it logged yet
            self._sent_to, self._sent = run_id, {}
        new = {name: text for name, text in batch.items() if self._sent.get(name) != text}
        if new:
            mlflow.log_params(new)
            self._sent.update(new)
