"""The MLflow hooks: kedro-mlflow's hook with every secret masked and failing open
(``fastlm.hooks.kedro_mlflow_hook.RedactingMlflowHook``), loaded and set up when a run starts
(``MlflowTrackingHook``), and saved datasets logged as artifacts. MLflow itself is reached through
``fastlm.tracking`` only."""

from __future__ import annotations

import os
import sys

from kedro.framework.hooks import hook_impl

from fastlm.hooks.catalog import ParallelRunOutputs
from fastlm.tracking import MlflowMetrics, resume_shared_run

# The name of kedro-mlflow's own hook among Kedro's plugin hooks (its ``kedro.hooks`` entry point). Kedro
# loads the plugins' hooks when a session is made, all but those whose name a registered hook has already:
# taken by MlflowTrackingHook, so kedro-mlflow's hook module, and MLflow with it (about a second), is not
# imported then. Were the plugin to rename it, its hook would be loaded and set aside again (``settings.py``'s
# DISABLE_HOOKS_FOR_PLUGINS): slower, the same runs.
KEDRO_MLFLOW_HOOK = "mlflow_hook"


class MlflowArtifactsHook:
    """Logs a saved dataset as an MLflow artifact when its catalog entry has
    ``metadata: {mlflow_artifact: <dir>}``.

    Unlike a dataset wrapper, a failing tracking store only warns (once) and the local output stays written.
    """

    def __init__(self) -> None:
        self._catalog = None
        self._mlflow = MlflowMetrics()
        self._pid: int | None = None  # the PID of before_pipeline_run (a forked worker copy: another)
        self._parallel: ParallelRunOutputs | None = None  # under ParallelRunner

    @hook_impl
    def after_catalog_created(self, catalog) -> None:
        self._catalog = catalog

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        """Under Kedro's ParallelRunner the dataset hooks run in its workers (spawned: fresh hooks without
        the catalog): the process that runs the pipeline logs the artefacts when the run ends (those saved
        since the start when a node fails), the workers none."""
        self._pid, self._parallel = os.getpid(), ParallelRunOutputs.at_start(run_params, pipeline, catalog)

    @hook_impl
    def after_pipeline_run(self) -> None:
        self._log_parallel(changed_only=False)

    @hook_impl
    def on_pipeline_error(self) -> None:
        self._log_parallel(changed_only=True)

    def _log_parallel(self, *, changed_only: bool) -> None:
        started, self._parallel = self._parallel, None
        if started is None or self._catalog is None:
            return
        for name in started.at_end(changed_only=changed_only):
            self._log(name)

    @hook_impl
    def after_dataset_saved(self, dataset_name: str) -> None:
        if self._parallel is None and self._pid in (None, os.getpid()):
            self._log(dataset_name)

    def _log(self, dataset_name: str) -> None:
        if self._catalog is None or dataset_name not in self._catalog:
            return
        dataset = self._catalog[dataset_name]
        metadata = getattr(dataset, "metadata", None) or {}
        path = getattr(dataset, "_filepath", None)
        if "mlflow_artifact" in metadata and path is not None:
            self._mlflow.log_artifacts(str(path), metadata["mlflow_artifact"] or None)


def in_a_notebook() -> bool:
    """Whether this process is an IPython shell or kernel (a notebook, ``ipython``): IPython's running shell
    (``get_ipython()``), None in a ``kedro run`` or script even where IPython is imported."""
    ipython = sys.modules.get("IPython")
    shell = getattr(ipython, "get_ipython", None)
    return shell is not None and shell() is not None


class MlflowTrackingHook:
    """kedro-mlflow's hook with secrets masked (``RedactingMlflowHook``), loaded and set up as the run starts
    (``before_pipeline_run``), not when the session's context is made: the hooks registered after this one in
    ``settings.HOOKS`` (the run's name, parameters, inputs, output folders and their locks) are called before
    it, so a run they refuse sets up no MLflow (the plugin's hook not even imported) and makes no store
    (``mlflow.db``, ``mlruns/``), and its refusal comes seconds sooner. The context's ``mlflow``
    (kedro-mlflow's configuration) is set then too. A notebook's session (an IPython kernel:
    ``%reload_kedro``) is set up as soon as its context is made, as kedro-mlflow does: the notebook's own
    MLflow calls and ``context.mlflow`` reach the project's store before any run.

    Registered as ``KEDRO_MLFLOW_HOOK``, the plugin's own hook's name, which Kedro then does not load."""

    def __init__(self) -> None:
        self.__name__ = KEDRO_MLFLOW_HOOK  # the name pluggy registers it under
        self._context = self._set_up_for = None
        # the RedactingMlflowHook, from the first run start; like this hook, it outlives a session in-process
        self._hook = None

    @hook_impl
    def after_context_created(self, context) -> None:
        self._context, self._set_up_for = context, None
        if in_a_notebook():
            self._set_up()

    @hook_impl
    def before_pipeline_run(self, run_params: dict, pipeline, catalog) -> None:
        if self._set_up_for is not self._context:
            self._set_up()
        self._hook.before_pipeline_run(run_params, pipeline, catalog)

    def _set_up(self) -> None:
        from fastlm.hooks.kedro_mlflow_hook import RedactingMlflowHook

        if self._hook is None:
            self._hook = RedactingMlflowHook()
        self._hook.after_context_created(self._context)
        self._set_up_for = self._context

    @hook_impl
    def before_node_run(self, node, catalog, inputs: dict, is_async: bool) -> None:
        if self._hook is not None:  # a forked ParallelRunner worker's: the main process's, its run active
            self._hook.before_node_run(node, catalog, inputs, is_async)
        elif os.environ.get("MLFLOW_RUN_ID"):  # a spawned worker: the run the main process shares, opened
            resume_shared_run(f"node {node.name}", "its metrics are not tracked")

    @hook_impl
    def after_pipeline_run(self, run_params, pipeline, catalog) -> None:
        if self._hook is not None:
            self._hook.after_pipeline_run(run_params, pipeline, catalog)

    @hook_impl
    def on_pipeline_error(self, error, run_params, pipeline, catalog) -> None:
        if self._hook is not None:
            self._hook.on_pipeline_error(error, run_params, pipeline, catalog)
