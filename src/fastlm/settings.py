"""Kedro project settings."""

import multiprocessing
import os

from kedro.config import OmegaConfigLoader

from fastlm import apply_process_defaults
from fastlm.hooks import (
    DatasetPathsHook,
    FreshDataHook,
    LoadVersionsHook,
    MissingInputsHook,
    MlflowArtifactsHook,
    MlflowTrackingHook,
    ModelOfTheseSplitsHook,
    OnlyMissingOutputsHook,
    OutputFoldersWritableHook,
    OutputsLockHook,
    ParametersValidHook,
    ProjectFolderHook,
    RedactedErrorsHook,
    ReportOfOneTrainingHook,
    RunNameHook,
    RunOutputsHook,
    RunTrackerHook,
    SplitCompleteHook,
    TunedParametersHook,
    UnknownRuntimeParamsHook,
)
from fastlm.log_handler import (
    other_rank_logs_warnings_only,
    plain_logs_when_redirected,
    printable_in_any_locale,
    quiet_third_party_logs,
)
from fastlm.rank_hooks import OtherRankOutputsHook, torchrun_rank
from fastlm.redaction import install_log_redaction
from fastlm.tracking import project_artifact_location

install_log_redaction()  # every log record of the process, whatever handler shows it: secrets masked
# Under torchrun each rank runs the whole `kedro run`: ranks other than 0 show warnings and errors only, each
# prefixed "[rank N]", from here on (the INFO lines are rank 0's, once). Rank 0 and other runs: unchanged.
other_rank_logs_warnings_only(torchrun_rank())

# kedro-mlflow's own hook logs parameters verbatim; MlflowTrackingHook is that hook with secrets masked (and
# takes its name, so Kedro does not load it: this is for a kedro-mlflow that names it otherwise).
DISABLE_HOOKS_FOR_PLUGINS = ("kedro_mlflow", "kedro-mlflow")
if multiprocessing.parent_process() is not None:
    # a spawned worker of Kedro's ParallelRunner (fastlm.pipelines sets it up): kedro-viz's statistics hook,
    # without the catalog it gets in the main process, warned on every dataset and kept nothing
    DISABLE_HOOKS_FOR_PLUGINS += ("kedro-viz",)
# pluggy calls the last registered first: the run name is resolved (and checked); --params, parameters, inputs
# and output folders are checked; then MLflow is loaded, its store set up and the run opened under that name
# (a run refused before any node runs sets up no MLflow and leaves no store or run behind; the outputs' locks
# are taken just before it). At the end, artefacts are logged before MLflow closes the run.
HOOKS = (
    RunOutputsHook(),
    MlflowTrackingHook(),
    OutputsLockHook(),  # after the checks, before MLflow opens the run: a refused run leaves none
    MlflowArtifactsHook(),
    TunedParametersHook(),
    OutputFoldersWritableHook(),
    ReportOfOneTrainingHook(),
    FreshDataHook(),  # the nodes' own checks of the tokenized data, before any node runs (any runner)
    ModelOfTheseSplitsHook(),  # before SplitCompleteHook: pluggy calls the later one first
    SplitCompleteHook(),
    MissingInputsHook(),
    ParametersValidHook(),
    UnknownRuntimeParamsHook(),
    LoadVersionsHook(),
    DatasetPathsHook(),
    RunTrackerHook(),
    RunNameHook(),
    ProjectFolderHook(),  # called first: every path below is the project's
    OnlyMissingOutputsHook(),  # tryfirst: --only-missing-outputs, the hooks see the nodes that will run
    RedactedErrorsHook(),  # tryfirst: an error's secrets masked before kedro-viz's hook writes it to .viz/
)
if torchrun_rank() > 0:  # torchrun ranks other than 0 train but write nothing and open no MLflow run
    HOOKS = (
        # each rank's config loader reads the tuned file: set aside or rescaled on every rank alike
        TunedParametersHook(),
        OtherRankOutputsHook(),
        MissingInputsHook(),
        ParametersValidHook(),
        LoadVersionsHook(),
        DatasetPathsHook(),
        RunTrackerHook(),
        RunNameHook(),
        ProjectFolderHook(),
        OnlyMissingOutputsHook(),
    )

CONFIG_LOADER_CLASS = OmegaConfigLoader
CONFIG_LOADER_ARGS = {
    "base_env": "base",
    "default_run_env": "local",
    # conf/local parameters override conf/base key by key (a tuned micro-batch keeps the rest of train:)
    "merge_strategy": {"parameters": "soft"},
    # ${env_or:NAME,default}: an environment variable where the user set one (e.g. MLFLOW_TRACKING_URI)
    "custom_resolvers": {
        "env_or": lambda name, default=None: os.environ.get(name) or default,
        # mlflow.yml: artefacts next to a local SQLite store, relative to it (see fastlm.tracking)
        "project_artifacts": lambda tracking_uri: project_artifact_location(tracking_uri),
    },
}

apply_process_defaults()  # the warning filters too, for sessions not started by the kedro CLI
quiet_third_party_logs()
printable_in_any_locale()
plain_logs_when_redirected()
