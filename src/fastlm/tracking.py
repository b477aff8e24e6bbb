"""MLflow logging that never stops training: a failing tracking store warns once, then is left alone.

Kedro-free (the engine's loop calls ``MlflowMetrics`` as a callback); used inside the run that
kedro-mlflow opened for the current ``kedro run``, or any active run.
"""

from __future__ import annotations

import logging
import math
from numbers import Number

log = logging.getLogger(__name__)


def active_run_id() -> str | None:
    """The id of the active MLflow run, if any (never raises)."""
    try:
        import mlflow

        run = mlflow.active_run()
        return run.info.run_id if run is not None else None
    except Exception:  # noqa: BLE001
        return None


class SafeMlflow:
    """Calls into mlflow that warn once on the first failure and are skipped afterwards."""

    def __init__(self) -> None:
        self.failed = False

    def call(self, what: str, function, *args, **kwargs) -> None:
        if self.failed:
            return
        try:
            import mlflow

            if mlflow.active_run() is None:
                return
            function(mlflow, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any store failure: warn once, keep training
            self.failed = True
            log.warning("MLflow %s failed (%s: %s); training and local outputs continue without tracking.",
                        what, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


class MlflowMetrics(SafeMlflow):
    """Loop callback: each logging-step record as MLflow metrics (``train/loss``, ``eval/val_loss``...)."""

    def __call__(self, kind: str, record: dict) -> None:
        values = {f"{kind}/{key}": float(value) for key, value in record.items()
                  if key != "step" and isinstance(value, Number) and math.isfinite(value)}
        self.call("metric logging", lambda mlflow: mlflow.log_metrics(values, step=int(record["step"])))

    def log_params(self, params: dict) -> None:
        clean = {key: ("" if value is None else str(value)[:500]) for key, value in params.items()}
        self.call("parameter logging", lambda mlflow: mlflow.log_params(clean))

    def log_artifacts(self, path: str, artifact_path: str | None) -> None:
        from pathlib import Path

        def log(mlflow):
            if Path(path).is_dir():
                mlflow.log_artifacts(path, artifact_path)
            else:
                mlflow.log_artifact(path, artifact_path)

        self.call(f"artifact logging of {path}", log)
