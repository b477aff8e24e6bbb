"""MLflow logging that never stops training: a failing tracking store warns once, then is left alone.

Kedro-free (the engine's loop calls ``MlflowMetrics`` as a callback); used inside the run that
kedro-mlflow opened for the current ``kedro run``, or any active run.
"""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass
from numbers import Number

from fastlm.redaction import redact

log = logging.getLogger(__name__)

# An unreachable tracking server must cost seconds, not MLflow's default 7 retries with exponential back-off
# and a 120 s timeout per request (over four minutes before the first failure). A value the user set wins.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "15"}


def bound_tracking_requests() -> None:
    """Bounded retries and timeout for MLflow's REST calls (read by MLflow at each request), unless set."""
    for name, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)


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

    def call(self, what: str, function, *args, needs_active_run: bool = True, **kwargs) -> None:
        if self.failed:
            return
        try:
            import mlflow

            if needs_active_run and mlflow.active_run() is None:
                return
            function(mlflow, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any store failure: warn once, keep training
            self.failed = True
            log.warning("MLflow %s failed (%s: %s); training and local outputs continue without tracking.",
                        what, type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")


@dataclass(frozen=True)
class TrackingTarget:
    """The active run, for a launched training worker to log into (the worker has no active run of its own)."""

    tracking_uri: str
    run_id: str


def tracking_target() -> TrackingTarget | None:
    run_id = active_run_id()
    if run_id is None:
        return None
    import mlflow

    return TrackingTarget(mlflow.get_tracking_uri(), run_id)


class MlflowMetrics(SafeMlflow):
    """Loop callback: each logging-step record as MLflow metrics (``train/loss``, ``eval/val_loss``...).

    With ``run_id`` (a launched worker), metrics go to that run of ``tracking_uri`` instead of the active run.
    """

    def __init__(self, run_id: str | None = None, tracking_uri: str | None = None) -> None:
        super().__init__()
        self.run_id = run_id
        if tracking_uri is not None:
            import mlflow

            mlflow.set_tracking_uri(tracking_uri)

    def __call__(self, kind: str, record: dict) -> None:
        values = {f"{kind}/{key}": float(value) for key, value in record.items()
                  if key != "step" and isinstance(value, Number) and math.isfinite(value)}
        if self.run_id is not None:
            self.call("metric logging", lambda mlflow: mlflow.log_metrics(values, step=int(record["step"]),
                                                                        run_id=self.run_id), needs_active_run=False)
            return
        self.call("metric logging", lambda mlflow: mlflow.log_metrics(values, step=int(record["step"])))

    def log_params(self, params: dict) -> None:
        clean = {key: ("" if value is None else str(redact(value, key))[:500]) for key, value in params.items()}
        self.call("parameter logging", lambda mlflow: mlflow.log_params(clean))

    def log_artifacts(self, path: str, artifact_path: str | None) -> None:
        from pathlib import Path

        def log(mlflow):
            if Path(path).is_dir():
                mlflow.log_artifacts(path, artifact_path)
            else:
                mlflow.log_artifact(path, artifact_path)

        self.call(f"artifact logging of {path}", log)
