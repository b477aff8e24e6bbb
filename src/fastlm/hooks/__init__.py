"""Project hooks, one module per concern (``settings.HOOKS`` registers them, in the order they must run):

* ``conf``: the project folder, unknown ``--params`` keys, every parameter group validated, tuned parameters,
  the local MLflow store's path made absolute;
* ``inputs``: inputs missing or damaged, tokenized data stale or edited, a model evaluated on other splits
  than it trained on;
* ``split_complete``: the split's outputs used together or not at all, the raw file they were made from;
* ``run_outputs``: the run's name, its output folders writable and written by one run at a time, a copy of
  its outputs kept per run;
* ``catalog``: the entries handed to the nodes (``dataset_paths``, ``run_tracker``), ``--load-versions`` of
  versioned datasets only;
* ``errors``: a node's or the run's error masked before any plugin's hook records it;
* ``mlflow_tracking``: kedro-mlflow's hook with secrets masked and failing open (``kedro_mlflow_hook``, which
  imports MLflow: loaded when a run starts, after every check), artifacts logged.
"""

from fastlm.hooks.catalog import (
    DATASET_PATHS,
    RUN_TRACKER,
    DatasetPathsHook,
    LoadVersionsHook,
    OnlyMissingOutputsHook,
    RunTrackerHook,
    load_versions_error,
)
from fastlm.hooks.conf import (
    ParametersValidHook,
    ProjectFolderHook,
    TunedParametersHook,
    UnknownRuntimeParamsHook,
    pin_local_store,
)
from fastlm.hooks.errors import RedactedErrorsHook
from fastlm.hooks.inputs import (
    FreshDataHook,
    MissingInputsHook,
    ModelOfTheseSplitsHook,
    ReportOfOneTrainingHook,
    all_pipelines,
)
from fastlm.hooks.mlflow_tracking import KEDRO_MLFLOW_HOOK, MlflowArtifactsHook, MlflowTrackingHook
from fastlm.hooks.run_outputs import (
    RUN_NAME,
    OutputFoldersWritableHook,
    OutputsLockHook,
    RunNameHook,
    RunOutputsHook,
    output_lock_file,
)
from fastlm.hooks.split_complete import (
    RAW,
    SPLIT_COMPLETE,
    SplitCompleteHook,
    check_raw_unchanged,
    raw_record,
)

__all__ = [
    "RedactedErrorsHook",
    "DATASET_PATHS",
    "KEDRO_MLFLOW_HOOK",
    "RAW",
    "RUN_NAME",
    "RUN_TRACKER",
    "SPLIT_COMPLETE",
    "DatasetPathsHook",
    "FreshDataHook",
    "LoadVersionsHook",
    "MissingInputsHook",
    "MlflowArtifactsHook",
    "MlflowTrackingHook",
    "ModelOfTheseSplitsHook",
    "OnlyMissingOutputsHook",
    "OutputFoldersWritableHook",
    "OutputsLockHook",
    "ParametersValidHook",
    "ProjectFolderHook",
    "ReportOfOneTrainingHook",
    "RunNameHook",
    "RunOutputsHook",
    "RunTrackerHook",
    "SplitCompleteHook",
    "TunedParametersHook",
    "UnknownRuntimeParamsHook",
    "all_pipelines",
    "check_raw_unchanged",
    "load_versions_error",
    "output_lock_file",
    "pin_local_store",
    "raw_record",
]
