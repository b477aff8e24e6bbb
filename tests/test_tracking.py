"""A failing MLflow store warns once and never stops training."""

import logging

import mlflow
import pytest

from fastlm.tracking import MlflowMetrics


@pytest.fixture
def active_run(tmp_path):
    """A run of its own experiment in its own store (earlier tests may have set a global experiment id)."""
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("tracking-test")
    with mlflow.start_run() as run:
        yield run
    mlflow.set_tracking_uri(None)


def test_metrics_are_logged_with_their_step(active_run):
    tracker = MlflowMetrics()
    tracker("train", {"step": 3, "loss": 2.5, "mfu": None, "lr": 1e-3, "loss_nan": float("nan")})
    history = mlflow.MlflowClient().get_metric_history(active_run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(3, 2.5)]
    names = set(mlflow.MlflowClient().get_run(active_run.info.run_id).data.metrics)
    assert names == {"train/loss", "train/lr"}  # None and NaN values are skipped, not sent


def test_store_failure_warns_once_and_is_then_skipped(active_run, monkeypatch, caplog):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(mlflow, "log_metrics", broken)
    tracker = MlflowMetrics()
    with caplog.at_level(logging.WARNING, logger="fastlm.tracking"):
        for step in range(5):
            tracker("train", {"step": step, "loss": 1.0})
    warnings = [r for r in caplog.records if "training and local outputs continue" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionError" in warnings[0].getMessage()
    assert len(calls) == 1 and tracker.failed


def test_no_active_run_is_a_no_op(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert mlflow.active_run() is None
    MlflowMetrics()("train", {"step": 1, "loss": 1.0})  # nothing to log to, nothing raised
