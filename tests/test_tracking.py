"""A failing MLflow store warns once and never stops training."""

import json
import logging
import shutil
import threading

import mlflow
import pytest

from fastlm.hooks.kedro_mlflow_hook import RedactingMlflowHook  # configures logging: before caplog's handler
from fastlm.tracking import MlflowMetrics
from tests.support.locked_store import store_locked_once


@pytest.fixture
def active_run(tmp_path, empty_mlflow_db):
    """A run of its own experiment in its own store (earlier tests may have set a global experiment id)."""
    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
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


def test_the_levers_a_run_used_become_parameters_of_its_run(active_run, tmp_path):
    """What train_summary.json says of the levers (fused head and kernel, liger, gradient checkpointing,
    optimizer) reaches the MLflow run that ``RunTracker.training_finished`` logs into, as the train node
    calls it; unset values (no fused kernel on a plain head) are left out."""
    from fastlm.tracking import RunTracker
    from tests.support.toy_training import run_toy, toy_params

    result = run_toy(toy_params(tmp_path, max_steps=2, log_every=1, eval_every=None))
    summary = {**result.summary, "runtime": result.runtime.describe()}
    RunTracker().training_finished(summary)
    logged = mlflow.MlflowClient().get_run(active_run.info.run_id).data.params
    assert logged["optimizer"] == "adamw" and logged["gradient_checkpointing"] == "off"
    assert logged["liger"] == summary["liger"] and logged["liger"].startswith("liger kernels off")
    assert (
        logged["fused_linear"] == "False" and logged["fused_linear_choice"] == summary["fused_linear_choice"]
    )
    assert "fused_linear_kernel" not in logged and summary["fused_linear_kernel"] is None
    assert logged["warmup_steps"] == "2" == str(summary["warmup_steps"])  # the schedule's warmup
    assert logged["runtime.float8_choice"] == summary["runtime"]["float8_choice"]  # the runtime's, once


def test_a_resumed_training_says_in_its_run_which_checkpoint_and_step_it_went_on_from(active_run, tmp_path):
    """A training run again by name goes on from its checkpoint in a new MLflow run whose curves begin at
    the step after it: nothing in that run said it was resumed, or from where (the train summary did). Its
    parameters name the checkpoint and the step; a run started fresh has neither."""
    from fastlm.tracking import RunTracker
    from tests.support.toy_training import run_toy, toy_params

    run_toy(toy_params(tmp_path, max_steps=2, log_every=1, eval_every=None, save_every=2))
    result = run_toy(toy_params(tmp_path, max_steps=4, log_every=1, eval_every=None, resume="auto"))
    summary = {**result.summary, "runtime": result.runtime.describe()}
    assert summary["resumed_from"] and summary["resumed_from_step"] == 2, summary.get("resumed_from")
    RunTracker().training_finished(summary)
    logged = mlflow.MlflowClient().get_run(active_run.info.run_id).data.params
    assert logged["resumed_checkpoint"] == summary["resumed_from"], logged
    assert logged["resumed_from_step"] == "2", logged
    fresh = run_toy(toy_params(tmp_path / "fresh", max_steps=1, log_every=1, eval_every=None))
    assert fresh.summary["resumed_from"] is None


def test_a_training_whose_settings_a_tuned_file_set_names_that_file_in_its_run(
    active_run, tmp_path, monkeypatch
):
    """A train run applying conf/local/parameters_tuned.yml (written by `kedro run --pipeline=tune`) logs
    its micro-batch and accumulation as any other run; its MLflow run now names the file and the settings it
    set (``tuned_parameters``), so two runs of one command before and after a tune show why they differ. A
    run applying none (no file, or one set aside) has no such parameter."""
    from fastlm.pipelines.tune.record import TunedInEffect, set_in_effect
    from fastlm.tracking import RunTracker
    from tests.support.toy_training import run_toy, toy_params

    result = run_toy(toy_params(tmp_path, max_steps=1, log_every=1, eval_every=None))
    summary = {**result.summary, "runtime": result.runtime.describe()}
    monkeypatch.chdir(tmp_path)
    leaves = (("batching", "micro_batch_size"), ("batching", "gradient_accumulation_steps"))
    where = str(tmp_path / "conf/local/parameters_tuned.yml")
    set_in_effect(TunedInEffect(where, leaves, {}, lambda train: None))
    try:
        RunTracker().training_finished(summary)
    finally:
        set_in_effect(None)
    logged = mlflow.MlflowClient().get_run(active_run.info.run_id).data.params
    assert logged["tuned_parameters"] == (
        "conf/local/parameters_tuned.yml: train.batching.micro_batch_size, "
        "train.batching.gradient_accumulation_steps"
    ), logged
    with mlflow.start_run(nested=True) as untuned:
        RunTracker().training_finished(summary)
    assert "tuned_parameters" not in mlflow.MlflowClient().get_run(untuned.info.run_id).data.params


def test_the_training_wall_time_and_data_fingerprint_reach_the_run(active_run, tmp_path):
    """The run comparison's wall time is the training's (the summary's, counting a resumed run's earlier
    processes), not the MLflow run's span (split, train and report of one ``kedro run``); and runs on other
    data show it: the tokenized data's fingerprint is a parameter of the run."""
    from fastlm.tracking import RunTracker
    from tests.support.toy_training import run_toy, toy_params

    result = run_toy(toy_params(tmp_path, max_steps=2, log_every=1, eval_every=None))
    summary = {
        **result.summary,
        "runtime": result.runtime.describe(),
        "fingerprint": "ab" * 32,
        "test_data": "cd"
        * 32,  # the test split's identity: a fold run's is a plain split's of the same texts
        "final_val_loss": 2.5,  # the returned model's (early stopping: its best step's)
    }
    RunTracker().training_finished(summary)
    data = mlflow.MlflowClient().get_run(active_run.info.run_id).data
    assert data.metrics["wall_time_s"] == summary["wall_time_s"] > 0
    assert data.metrics["final_val_loss"] == 2.5
    assert data.params["data.fingerprint"] == "ab" * 6 and data.params["data.test"] == "cd" * 6


@pytest.mark.e2e
def test_store_failing_mid_run_leaves_training_and_outputs_intact(kedro_project, monkeypatch):
    """Through a KedroSession: the store accepts the first metrics, then fails; the run completes."""
    from tests.support.project import run_pipeline

    small = {"split": {"tokenizer": {"vocab_size": 400}, "max_length": 48}}
    run_pipeline(kedro_project, "split", small)
    calls = []
    real_log_metrics = mlflow.log_metrics

    def failing_after_the_first(*args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise ConnectionError("tracking server went away")
        return real_log_metrics(*args, **kwargs)

    monkeypatch.setattr(mlflow, "log_metrics", failing_after_the_first)
    train = {
        "max_steps": 4,
        "log_every": 1,
        "eval_every": None,
        "save_every": 2,
        "quiet": True,
        "batching": {"micro_batch_size": 8},
        "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
    }
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append  # on the logger itself: Kedro reconfigures the root handlers per session
    logging.getLogger("fastlm.tracking").addHandler(handler)
    try:
        run_pipeline(kedro_project, "train", {**small, "train": train})
    finally:
        logging.getLogger("fastlm.tracking").removeHandler(handler)
    warnings = [r for r in records if "training and local outputs continue" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionError" in warnings[0].getMessage()
    assert len(calls) == 2  # one success, one failure, then never called again
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert summary["steps"] == 4
    assert (kedro_project / "data/06_models/model/model.safetensors").is_file()
    assert (
        kedro_project / "data/06_models/checkpoints" / summary["run_name"] / "checkpoint-00000004/COMPLETE"
    ).is_file()


@pytest.mark.e2e
def test_each_nodes_parameters_reach_the_store_in_one_write(kedro_project, monkeypatch):
    """kedro-mlflow logs a node's parameters one ``log_param`` (one store transaction, or one HTTP request to
    a tracking server) per flattened key: about 180 for split + train. They go as one batch per node; every
    value arrives as it did."""
    from kedro.framework.project import pipelines
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    from tests.support.project import run_pipeline

    writes = []
    for name in ("log_param", "log_batch"):
        real = getattr(SqlAlchemyStore, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            params = kwargs.get("params", args[2] if _name == "log_batch" and len(args) > 2 else None)
            if _name == "log_param" or params:
                writes.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(SqlAlchemyStore, name, counted)
    small = {"split": {"tokenizer": {"vocab_size": 400}, "max_length": 48}}
    run_pipeline(kedro_project, "split", small)
    with_params = [
        node for node in pipelines["split"].nodes if any(i.startswith("params:") for i in node.inputs)
    ]
    run = mlflow.MlflowClient().search_runs(
        [mlflow.get_experiment_by_name("fastlm").experiment_id], max_results=1, order_by=["start_time DESC"]
    )[0]
    logged = run.data.params
    assert logged["split.max_length"] == "48" and logged["split.tokenizer.vocab_size"] == "400"
    assert len(logged) > 3 * len(with_params)  # many keys a node
    assert 0 < len(writes) <= len(with_params), writes


def test_a_hook_that_outlives_its_run_logs_every_parameter_of_the_next(tmp_path, empty_mlflow_db):
    """The hook object outlives a session in-process (sweeps, notebooks, tests): the keys it skips as already
    logged are those of the active run only. A threaded runner runs several nodes' hooks at once: each
    thread gathers its own node's parameters."""
    from fastlm.hooks.kedro_mlflow_hook import RedactingMlflowHook
    from fastlm.tracking import active_run_id

    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow.set_experiment("tracking-test")
    hook, runs, theirs = RedactingMlflowHook(), [], []

    def other_node():
        with hook._gathering() as batch:
            hook._log_param("train.seed", 7)
        theirs.append(batch)

    hook.long_params_strategy = "truncate"  # conf/base/mlflow.yml's (after_context_created reads it)
    try:
        for _ in range(2):
            with mlflow.start_run() as run:
                for _node in range(2):  # two nodes of the run reading the same parameters
                    with hook._gathering() as batch:
                        hook._log_param("train.optimizer.lr", 0.002)
                        hook._log_param("train.resume", None)  # unset: not logged
                        hook._log_param("train.note", "x" * 7000)  # past MLflow's limit: truncated, at once
                        # a threaded runner's other thread, running another node's hooks meanwhile
                        other = threading.Thread(target=other_node)
                        other.start()
                        other.join()
                        hook._log_param("train.max_steps", 43)  # still this node's batch
                    assert batch == {"train.optimizer.lr": "0.002", "train.max_steps": "43"}
                    assert theirs.pop() == {"train.seed": "7"}
                    hook._log_batch(mlflow, active_run_id(), batch)
                runs.append(run.info.run_id)
        for run_id in runs:
            logged = mlflow.MlflowClient().get_run(run_id).data.params
            assert logged["train.optimizer.lr"] == "0.002" and "train.resume" not in logged
            assert logged["train.note"] == "x" * 6000 and logged["train.max_steps"] == "43"
    finally:
        mlflow.set_tracking_uri(None)


def test_a_run_stopped_by_a_signal_is_killed_and_one_that_failed_is_failed(active_run, tmp_path):
    """A sweep's child run stopped by Ctrl-C or a stop signal (the training loop's graceful stop) is KILLED in
    the MLflow UI, not FAILED; a session's run left open by Ctrl-C is ended KILLED (at exit, or when the next
    session starts), with its open child run, while a run the session did not open is left alone."""
    from fastlm.engine.train.signals import TrainingInterrupted
    from fastlm.tracking import RunTracker, end_interrupted_runs, note_session_run, session_runs

    client, tracker, ended = mlflow.MlflowClient(), RunTracker(), {}
    stopped = TrainingInterrupted("SIGTERM", 3, tmp_path / "checkpoint-00000003")
    for name, error in (("stopped", stopped), ("ctrl-c", KeyboardInterrupt()), ("failed", ValueError("x"))):
        with pytest.raises(type(error)), tracker.child_run(name, {}) as run_id:
            raise error
        ended[name] = client.get_run(run_id).info.status
    assert ended == {"stopped": "KILLED", "ctrl-c": "KILLED", "failed": "FAILED"}

    end_interrupted_runs()  # not a session's run: left open
    assert mlflow.active_run().info.run_id == active_run.info.run_id
    note_session_run()
    child = mlflow.start_run(run_name="open child", nested=True)
    end_interrupted_runs()
    assert mlflow.active_run() is None and active_run.info.run_id not in session_runs
    statuses = {client.get_run(run.info.run_id).info.status for run in (active_run, child)}
    assert statuses == {"KILLED"}


def test_a_report_run_again_adds_no_duplicate_test_metric_to_the_training_run(active_run):
    """Each `kedro run --pipeline=report` logs its test figures on the training run too: the same figures
    again were a second point at step 0 of every test_* history there; a changed figure is still logged."""
    from fastlm.tracking import log_test_metrics

    client = mlflow.MlflowClient()
    training = client.create_run(active_run.info.experiment_id).info.run_id
    values = {"test_loss": 2.5, "test_accuracy": 0.25}
    for _ in range(2):
        log_test_metrics(values, training_run_id=training)
    changed = {**values, "test_loss": values["test_loss"] / 2}
    log_test_metrics(changed, training_run_id=training)
    history = {key: [m.value for m in client.get_metric_history(training, key)] for key in values}
    assert history == {"test_loss": [values["test_loss"], changed["test_loss"]], "test_accuracy": [0.25]}


def test_a_report_whose_test_loss_is_not_finite_replaces_the_earlier_figure_on_the_training_run(active_run):
    """A report gave a finite test loss; the training's report run again (on another test split, another
    precision) gives an infinite one. Its figures are logged as NaN on the training run, so the run comparison
    no longer shows the earlier, finite loss as this training's; the same NaN again adds no point. Was: a
    non-finite figure was never logged, the earlier one stayed the training run's."""
    import math

    from fastlm.reporting.comparison import test_metric_values
    from fastlm.tracking import log_test_metrics

    client = mlflow.MlflowClient()
    training = client.create_run(active_run.info.experiment_id).info.run_id
    log_test_metrics(test_metric_values({"loss": 2.5, "perplexity": 12.2}), training_run_id=training)
    for _ in range(2):
        log_test_metrics(
            test_metric_values({"loss": math.inf, "perplexity": math.inf}), training_run_id=training
        )
    metrics = client.get_run(training).data.metrics
    assert math.isnan(metrics["test_loss"]) and math.isnan(metrics["test_perplexity"]), metrics
    assert len(client.get_metric_history(training, "test_loss")) == 2


def test_the_rouge_scoring_settings_reach_the_training_run_beside_its_rouge(active_run):
    """ROUGE depends on how the report generated (greedy or beams, max_new_tokens) and how it tokenized the
    texts (report.references.rouge_tokenizer), settings of the report's run, not of the training run where
    the comparison reads the figures. They are tags of both runs beside the figures (a report run again
    with other settings replaces them, as its figures)."""
    from fastlm.reporting.comparison import test_metric_values, test_scoring_tags
    from fastlm.tracking import log_test_metrics

    client = mlflow.MlflowClient()
    training = client.create_run(active_run.info.experiment_id).info.run_id
    scored = {"rouge1": 0.3, "rouge_decoding": "greedy, max_new_tokens=64", "rouge_tokenizer": "syllable"}
    log_test_metrics(test_metric_values(scored), training_run_id=training, tags=test_scoring_tags(scored))
    beams = {**scored, "rouge_decoding": "beam search, num_beams=4, max_new_tokens=64"}
    log_test_metrics(test_metric_values(beams), training_run_id=training, tags=test_scoring_tags(beams))
    for run in (training, active_run.info.run_id):
        tags = client.get_run(run).data.tags
        assert tags["test_rouge_decoding"] == beams["rouge_decoding"], tags
        assert tags["test_rouge_tokenizer"] == "syllable"
    assert test_scoring_tags({"loss": 2.0}) == {}  # no ROUGE scored: no settings


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_a_parameter_mlflow_refuses_as_changed_is_named_in_the_warning(
    active_run, monkeypatch, one_at_a_time
):
    """MLflow refuses a parameter whose value changed within a run, naming it as ``key='train.lr'`` (or
    ``{'key': 'train.lr', ...}``): the secret masking took ``key`` for a secret's name, so the warning said
    ``'key': '***'``, never which parameter conflicted. Keys are named; a value shaped like a secret is still
    masked."""
    import fastlm.tracking
    from fastlm.redaction import install_log_redaction
    from fastlm.tracking import SafeMlflow
    from tests.support.logs import module_log_lines

    install_log_redaction()  # as fastlm.settings does for every run
    lines = module_log_lines(monkeypatch, fastlm.tracking)
    first, second = "hf_" + "A" * 24, "hf_" + "B" * 24
    mlflow.log_params({"train.lr": "0.1", "train.model.path": first})
    changed = {"train.lr": "0.2", "train.model.path": second}
    if one_at_a_time:
        log = lambda mlflow: [mlflow.log_param(key, value) for key, value in changed.items()]  # noqa: E731
    else:
        log = lambda mlflow: mlflow.log_params(changed)  # noqa: E731
    SafeMlflow().call("parameter logging", log)
    assert len(lines) == 1, lines
    named = ["train.lr"] if one_at_a_time else ["train.lr", "train.model.path"]
    assert all(key in lines[0] for key in named) and "'***'" not in lines[0].split("train.lr")[0], lines
    assert first not in lines[0] and second not in lines[0], lines


def test_runs_left_running_by_a_process_that_is_gone_are_ended_killed(tmp_path, empty_mlflow_db):
    """A run killed with SIGKILL (or a machine's power) leaves its MLflow run RUNNING for ever: the UI shows
    it running beside the run that resumed it. Each run records its process (``fastlm.process``: host, PID
    namespace, PID); the next run start ends KILLED the runs still RUNNING whose process no longer runs here,
    and leaves alone a run whose process runs and one of another host or PID namespace."""
    import subprocess
    import sys

    from fastlm.tracking import PROCESS_TAG, end_runs_of_gone_processes, process_tag

    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
        dead_pid = int(gone.stdout)
        here = process_tag()
        host, namespace, _ = here.split("|")
        tags = {
            "dead": f"{host}|{namespace}|{dead_pid}",
            "alive": here,
            "other_host": f"{host}-other|{namespace}|{dead_pid}",
            "other_namespace": f"{host}|{namespace}0|{dead_pid}",
        }
        client = mlflow.MlflowClient()
        experiment = client.create_experiment("e")
        runs = {
            name: client.create_run(experiment, tags={PROCESS_TAG: tag}).info.run_id
            for name, tag in tags.items()
        }
        finished = client.create_run(experiment, tags={PROCESS_TAG: tags["dead"]}).info.run_id
        client.set_terminated(finished, "FINISHED")
        ended = end_runs_of_gone_processes(mlflow, experiment)
        status = {name: client.get_run(run_id).info.status for name, run_id in runs.items()}
        assert ended == [runs["dead"]]
        assert status == {
            "dead": "KILLED",
            "alive": "RUNNING",
            "other_host": "RUNNING",
            "other_namespace": "RUNNING",
        }
        assert client.get_run(finished).info.status == "FINISHED"
    finally:
        mlflow.set_tracking_uri(None)


def test_the_line_of_runs_ended_killed_names_each_run_by_its_name(tmp_path, empty_mlflow_db, caplog):
    """The line saying which runs a killed process left RUNNING names them as the user named them
    (``run_name``, the MLflow UI's run name), with the id beside. Was: the ids alone
    (``ended KILLED: e6bb345899f6425a825c5a3be6c4ab38``), a run the user had to look up."""
    import logging
    import subprocess
    import sys

    from fastlm.tracking import PROCESS_TAG, end_runs_of_gone_processes, process_tag

    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    try:
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
        host, namespace, _ = process_tag().split("|")
        client = mlflow.MlflowClient()
        experiment = client.create_experiment("e")
        tags = {PROCESS_TAG: f"{host}|{namespace}|{int(gone.stdout)}"}
        run_id = client.create_run(experiment, tags=tags, run_name="lora-r16").info.run_id
        with caplog.at_level(logging.INFO, logger="fastlm.tracking"):
            assert end_runs_of_gone_processes(mlflow, experiment) == [run_id]
        lines = [record.getMessage() for record in caplog.records if "ended KILLED" in record.getMessage()]
        assert len(lines) == 1 and f"lora-r16 ({run_id})" in lines[0], lines
        assert "1 run left RUNNING" in lines[0], lines
    finally:
        mlflow.set_tracking_uri(None)


def test_a_notebook_session_points_mlflow_at_the_projects_store_before_any_run(
    kedro_project, monkeypatch, empty_mlflow_db
):
    """A notebook's session (`%reload_kedro`, an IPython kernel) is set up as kedro-mlflow sets it up: the
    context's `mlflow` configuration and MLflow's tracking URI the project's store as soon as the session's
    context is made, so the notebook's own MLflow calls read and write the project's runs before any run.
    (A `kedro run` sets MLflow up as its run starts, after every check.)"""
    import sys
    import types

    from kedro.framework.session import KedroSession

    from fastlm.tracking import end_session_tracking
    from tests.support.project import bootstrap

    shutil.copyfile(empty_mlflow_db, kedro_project / "mlflow.db")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: object()))
    before = mlflow.get_tracking_uri()
    bootstrap(kedro_project)
    try:
        with KedroSession.create(project_path=kedro_project) as session:
            context = session.load_context()
            assert getattr(context, "mlflow", None) is not None
            assert mlflow.get_tracking_uri() == f"sqlite:///{(kedro_project / 'mlflow.db').resolve()}"
    finally:
        end_session_tracking()
        mlflow.set_tracking_uri(before)


def test_the_compile_and_evaluation_records_reach_the_run(active_run):
    """The summary's compile and evaluation figures reach the MLflow run as the other summary figures do: the
    seconds and counts as metrics, whether dynamo's recompile limit was reached (and where) as parameters.
    Was: train_summary.json alone held them."""
    from fastlm.tracking import RunTracker

    summary = {
        "runtime": {"device": "cpu", "compile": True},
        "real_tokens_per_s": 100.0,
        "wall_time_s": 10.0,
        "compiles": 3,
        "compile_s": 4.5,
        "compile_probe_s": 0.5,
        "eval_s": 1.25,
        "recompile_limit_hit": True,
        "recompile_limit_functions": ["forward (model.py:9): size mismatch at index 1"],
    }
    RunTracker().training_finished(summary)
    data = mlflow.MlflowClient().get_run(active_run.info.run_id).data
    figures = {
        name: data.metrics.get(name) for name in ("compiles", "compile_s", "compile_probe_s", "eval_s")
    }
    assert figures == {"compiles": 3, "compile_s": 4.5, "compile_probe_s": 0.5, "eval_s": 1.25}, data.metrics
    assert data.params["recompile_limit_hit"] == "True"
    assert json.loads(data.params["recompile_limit_functions"]) == summary["recompile_limit_functions"]


def test_a_run_within_the_recompile_limit_records_no_functions(active_run):
    from fastlm.tracking import RunTracker

    summary = {"runtime": {"device": "cpu"}, "real_tokens_per_s": 100.0, "recompile_limit_hit": False}
    RunTracker().training_finished({**summary, "recompile_limit_functions": []})
    params = mlflow.MlflowClient().get_run(active_run.info.run_id).data.params
    assert params["recompile_limit_hit"] == "False" and "recompile_limit_functions" not in params


def test_a_store_write_refused_as_locked_is_tried_again_then_logged(active_run, monkeypatch, caplog):
    """Two commands of one project log into its SQLite store at once (a training and a report): a write
    that finds the database locked is tried again after a short wait, not given up with tracking turned
    off for the rest of the run."""
    import sqlite3

    import fastlm.tracking as tracking

    monkeypatch.setattr(tracking.time, "sleep", lambda seconds: None)
    real, calls = mlflow.log_metrics, []

    def locked_twice(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 2:
            raise sqlite3.OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(mlflow, "log_metrics", locked_twice)
    tracker = MlflowMetrics()
    with caplog.at_level(logging.WARNING, logger="fastlm.tracking"):
        tracker("train", {"step": 1, "loss": 2.0})
    history = mlflow.MlflowClient().get_metric_history(active_run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0)]
    assert len(calls) == 3 and not tracker.failed and not caplog.records


def test_a_store_locked_for_good_warns_once_after_a_bounded_wait(active_run, monkeypatch, caplog):
    import sqlite3

    import fastlm.tracking as tracking

    waits, calls = [], []
    monkeypatch.setattr(tracking.time, "sleep", waits.append)

    def locked(*args, **kwargs):
        calls.append(1)
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(mlflow, "log_metrics", locked)
    tracker = MlflowMetrics()
    with caplog.at_level(logging.WARNING, logger="fastlm.tracking"):
        for step in range(3):
            tracker("train", {"step": step, "loss": 1.0})
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "database is locked" in warnings[0] and "\n" not in warnings[0]
    assert tracker.failed and len(calls) == len(waits) + 1 and 1 < len(calls) <= 6
    assert sum(waits) <= 30  # bounded: the training is not held up for long


def test_one_command_at_a_time_sets_up_the_projects_store(tmp_path):
    """Two commands starting at once on a project without its store yet (two trainings of other run
    names, a training and a report) would both create MLflow's tables and migrate them: one failed with
    ``table ... already exists`` and ran untracked. The store's set-up is one process at a time."""
    import time

    from fastlm.tracking import setting_up_store

    order, inside = [], threading.Event()

    def first():
        with setting_up_store():
            inside.set()
            time.sleep(0.3)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    inside.wait(5)
    with setting_up_store():
        order.append("second in")
    thread.join()
    assert order == ["first out", "second in"]


class MlflowConfigLoader(dict):
    """What the MLflow set-up reads of a Kedro config loader: ``mlflow.yml`` naming the store."""

    def __init__(self, uri: str) -> None:
        super().__init__(mlflow={"server": {"mlflow_tracking_uri": uri}})
        self.config_patterns: dict = {}


def _hook_and_context(project):
    """The project's MLflow hook and a Kedro context of ``project`` whose store is ``sqlite:///mlflow.db``."""
    from types import SimpleNamespace

    context = SimpleNamespace(
        config_loader=MlflowConfigLoader("sqlite:///mlflow.db"),
        project_path=project,
        _package_name="fastlm",
        _get_config_credentials=dict,
    )
    return RedactingMlflowHook(), context


def damaged_store(folder, empty_mlflow_db, *statements):
    import contextlib
    import sqlite3

    store = folder / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, store)
    with contextlib.closing(sqlite3.connect(store)) as connection, connection:
        for statement in statements:
            connection.execute(statement)
    return store


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("CREATE TABLE _alembic_tmp_runs (run_uuid VARCHAR(32))", "table _alembic_tmp_runs left"),
        ("DROP TABLE params", "table params missing"),
        ("UPDATE alembic_version SET version_num = '0584bdc529eb'", "0584bdc529eb"),
    ],
    ids=["temporary-table-left", "table-dropped", "version-row-behind-its-tables"],
)
def test_a_store_left_half_migrated_is_named_once_with_its_fix_and_kept(
    tmp_path, monkeypatch, empty_mlflow_db, caplog, damage, named
):
    """A store whose set-up was cut (an interrupted or raced migration) failed every later command's tracking
    with MLflow's own error (or none at all, or MLflow re-made a dropped table in its first schema), each
    time: the set-up names the file and the fix in one warning line, leaves the store as it is, and the run
    goes on untracked."""

    monkeypatch.chdir(tmp_path)
    store = damaged_store(tmp_path, empty_mlflow_db, damage)
    before = store.read_bytes()
    hook, context = _hook_and_context(tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            hook.after_context_created(context)
    finally:
        mlflow.set_tracking_uri(None)
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    line = warnings[0]
    assert line.startswith("mlflow.db is not a complete MLflow store") and named in line, line
    assert "mv mlflow.db mlflow.db.broken" in line and "without tracking" in line and "\n" not in line
    assert hook._tracking.failed  # the run goes on, untracked
    assert store.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["mlflow.db"]


def test_a_whole_store_and_a_locked_one_are_not_called_broken(tmp_path, empty_mlflow_db, monkeypatch):
    """Only a store a cut set-up left is named: a complete one, one another command holds locked, a new
    (empty) file and one an older MLflow made (which MLflow itself asks to upgrade) are left to MLflow."""
    import contextlib
    import sqlite3
    import time

    from fastlm import tracking

    store = damaged_store(tmp_path, empty_mlflow_db)
    assert tracking.store_problem(f"sqlite:///{store}") is None
    monkeypatch.setattr(tracking, "STORE_CHECK_WAIT_S", 0.05)
    with contextlib.closing(sqlite3.connect(store, isolation_level=None)) as writer:
        writer.execute("BEGIN EXCLUSIVE")
        started = time.monotonic()
        assert tracking.store_problem(f"sqlite:///{store}") is None
        assert time.monotonic() - started < 1
        writer.execute("ROLLBACK")
    (tmp_path / "new.db").touch()
    assert tracking.store_problem(f"sqlite:///{tmp_path / 'new.db'}") is None
    assert tracking.store_problem(f"sqlite:///{tmp_path / 'absent.db'}") is None
    older = tmp_path / "older"
    older.mkdir()
    damaged_store(
        older, empty_mlflow_db, "DROP TABLE jobs", "UPDATE alembic_version SET version_num = '0584bdc529eb'"
    )
    assert tracking.store_problem(f"sqlite:///{older / 'mlflow.db'}") is None
    (tmp_path / "garbage.db").write_bytes(b"this is not a sqlite database" * 100)
    assert "garbage.db is not a complete MLflow store" in tracking.store_problem(
        f"sqlite:///{tmp_path / 'garbage.db'}"
    )


def test_a_warmup_ratio_leaves_the_unused_warmup_steps_out_of_the_run_parameters():
    """With train.optimizer.warmup_ratio set, the config's warmup_steps (its default, unused) is not logged
    beside the warmup the run used (the ``warmup_steps`` summary parameter); without a ratio it stays."""
    from fastlm.hooks.kedro_mlflow_hook import logged_parameters

    train = {"optimizer": {"lr": 1e-3, "warmup_steps": 20, "warmup_ratio": 0.1}, "seed": 0}
    for name, value in (("params:train", train), ("parameters", {"train": train})):
        logged = logged_parameters(name, value)
        optimizer = (logged if name == "params:train" else logged["train"])["optimizer"]
        assert optimizer == {"lr": 1e-3, "warmup_ratio": 0.1}
    assert train["optimizer"]["warmup_steps"] == 20  # the node's own input untouched
    plain = {"optimizer": {"lr": 1e-3, "warmup_steps": 20, "warmup_ratio": None}}
    assert logged_parameters("params:train", plain)["optimizer"]["warmup_steps"] == 20


@pytest.mark.parametrize("failed", [False, True], ids=["finished", "failed"])
def test_a_run_whose_start_and_end_find_the_store_locked_is_one_run_ended_as_it_ended(
    tmp_path, monkeypatch, empty_mlflow_db, caplog, failed
):
    """Two commands of one project log into its SQLite store at once: the run's tags at its start and its
    FINISHED status at its end are refused once as ``database is locked`` and tried again. The retry opens no
    second (nested) run and ends the run whose status write was refused (MLflow's ``end_run`` had already
    let go of it): one run, FINISHED (FAILED for a failed pipeline), no warning."""
    from kedro.io import DataCatalog
    from kedro.pipeline import Pipeline

    import fastlm.tracking as tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tracking.time, "sleep", lambda seconds: None)
    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")

    hook, context = _hook_and_context(tmp_path)
    run_params = {"pipeline_names": ["train"], "tags": None, "node_names": None, "from_nodes": None}
    run_params |= {"to_nodes": None, "from_inputs": None, "load_versions": None, "runner": "SequentialRunner"}
    try:
        hook.after_context_created(context)
        experiment = mlflow.get_experiment_by_name("fastlm").experiment_id
        refused = store_locked_once(monkeypatch, "log_batch", "set_terminated")  # the run's tags, its end
        with caplog.at_level(logging.WARNING):
            hook.before_pipeline_run(run_params, Pipeline([]), DataCatalog())
            if failed:
                hook.on_pipeline_error(ValueError("a node failed"), run_params, Pipeline([]), DataCatalog())
            else:
                hook.after_pipeline_run(run_params, Pipeline([]), DataCatalog())
        assert mlflow.active_run() is None
        runs = mlflow.MlflowClient().search_runs([experiment])
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)
    assert refused == ["log_batch", "set_terminated"]
    status = "FAILED" if failed else "FINISHED"
    assert [run.info.status for run in runs] == [status], [(r.info.run_name, r.info.status) for r in runs]
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.mark.parametrize(
    "locked, failed",
    [
        (("create_run",), False),
        (("log_batch",), False),
        (("set_terminated",), False),
        (("create_run", "log_batch", "set_terminated"), True),
    ],
    ids=["start", "parameters", "end", "all-failed"],
)
def test_a_child_run_whose_start_and_end_find_the_store_locked_is_one_child_ended_as_it_ended(
    active_run, monkeypatch, caplog, locked, failed
):
    """A sweep's (or k-fold's) child run while another command writes the same SQLite store: its start, its
    parameters and its status at its end, refused once as ``database is locked``, are tried again. One child
    run, nested under the sweep's run, with its parameters, ended FINISHED (FAILED when its training failed);
    the sweep's run active again and RUNNING; no warning."""
    import contextlib

    import fastlm.tracking as tracking

    monkeypatch.setattr(tracking.time, "sleep", lambda seconds: None)
    client, parent = mlflow.MlflowClient(), active_run.info.run_id
    refused = store_locked_once(monkeypatch, *locked)
    outcome = pytest.raises(ValueError) if failed else contextlib.nullcontext()
    try:
        with caplog.at_level(logging.WARNING), outcome:
            with tracking.RunTracker().child_run("lr-0.1", {"train.optimizer.lr": 0.1}) as run_id:
                assert run_id is not None and tracking.active_run_id() == run_id
                if failed:
                    raise ValueError("the run's training failed")
        active = tracking.active_run_id()
    finally:  # a child left open: not the next test's active run
        while tracking.active_run_id() not in (parent, None):
            mlflow.end_run()
    assert refused == list(locked)
    assert active == parent and client.get_run(parent).info.status == "RUNNING"
    runs = client.search_runs([active_run.info.experiment_id])
    children = [
        (run.info.run_id, run.info.status, run.data.params)
        for run in runs
        if run.data.tags.get("mlflow.parentRunId") == parent
    ]
    status = "FAILED" if failed else "FINISHED"
    assert len(runs) == 2 and children == [(run_id, status, {"train.optimizer.lr": "0.1"})]
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


def test_runs_left_open_by_ctrl_c_are_ended_killed_where_the_store_is_locked(active_run, monkeypatch, caplog):
    """Ctrl-C outside the training loop while another command writes the same SQLite store: the session's run,
    its open child run, and its run open in another thread are ended KILLED at exit (``end_interrupted_runs``)
    though the look-up of the child's parent and each status write are refused once as ``database is
    locked``: each is tried again; no warning."""
    import fastlm.tracking as tracking

    monkeypatch.setattr(tracking.time, "sleep", lambda seconds: None)
    client, experiment = mlflow.MlflowClient(), active_run.info.experiment_id
    tracking.note_session_run()
    child = mlflow.start_run(run_name="open child", nested=True).info.run_id
    elsewhere = client.create_run(experiment).info.run_id  # the session's run, open in another thread
    tracking.session_runs.add(elsewhere)
    refused = store_locked_once(monkeypatch, "get_run", *["set_terminated"] * 3)
    try:
        with caplog.at_level(logging.WARNING):
            tracking.end_interrupted_runs(elsewhere)
        active = tracking.active_run_id()
    finally:
        monkeypatch.undo()  # the store unlocked for what the test leaves open
        while tracking.active_run_id() is not None:
            mlflow.end_run()
        tracking.session_runs.clear()
    assert active is None and sorted(refused) == ["get_run", *["set_terminated"] * 3]
    statuses = {run_id: client.get_run(run_id).info.status for run_id in (child, active_run.info.run_id)}
    assert statuses | {elsewhere: client.get_run(elsewhere).info.status} == {
        child: "KILLED",
        active_run.info.run_id: "KILLED",
        elsewhere: "KILLED",
    }
    assert not [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]


@pytest.mark.parametrize("worker", ["forked", "spawned"])
def test_a_sweeps_child_runs_in_a_parallel_runner_worker_are_children_not_the_sweeps_run(
    tmp_path, monkeypatch, empty_mlflow_db, worker
):
    """`kedro run --pipeline=sweep --runner=ParallelRunner`: the sweep's node runs in a worker, which has the
    sweep's run id in MLflow's ``MLFLOW_RUN_ID`` (``share_run_with_workers``); a forked worker has the run
    active (kedro-mlflow's node hook opens it again by its id), a spawned one none yet. Each setting is a
    child run of the sweep's run, with its own parameters and metrics; the sweep's run keeps its name, none
    of theirs and stays RUNNING (the main process ends it)."""
    import fastlm.tracking as tracking

    shutil.copyfile(empty_mlflow_db, tmp_path / "mlflow.db")
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    experiment = mlflow.set_experiment("sweep-worker").experiment_id
    sweep = client.create_run(experiment, run_name="sweep-1").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", sweep)
    try:
        if worker == "forked":
            mlflow.start_run(run_id=sweep)
        tracker, ids = tracking.RunTracker(), {}
        for name, lr in (("tiny-01", 0.001), ("tiny-02", 0.01)):
            with tracker.child_run(name, {"train.optimizer.lr": lr}) as run_id:
                tracker.log_run_metrics({"test_loss": lr * 100})
                ids[name] = run_id
        active, status = tracking.active_run_id(), client.get_run(sweep).info.status
    finally:
        while mlflow.active_run() is not None:
            mlflow.end_run()
        mlflow.set_tracking_uri(None)
    runs = {run.info.run_id: run for run in client.search_runs([experiment])}
    assert (active, status) == (sweep, "RUNNING") and len(runs) == 3 and sweep not in ids.values()
    assert (runs[sweep].info.run_name, runs[sweep].data.params, runs[sweep].data.metrics) == (
        "sweep-1",
        {},
        {},
    )
    children = {
        run.info.run_name: (run.info.run_id, run.info.status, run.data.params, run.data.metrics)
        for run in runs.values()
        if run.data.tags.get("mlflow.parentRunId") == sweep
    }
    assert children == {
        "tiny-01": (ids["tiny-01"], "FINISHED", {"train.optimizer.lr": "0.001"}, {"test_loss": 0.1}),
        "tiny-02": (ids["tiny-02"], "FINISHED", {"train.optimizer.lr": "0.01"}, {"test_loss": 1.0}),
    }


def test_a_read_only_store_is_named_so_not_by_sqlalchemys_preamble(tmp_path, empty_mlflow_db, monkeypatch):
    """A store that cannot be written (mlflow.db on a read-only mount) warned with SQLAlchemy's first line
    alone: ``MLflow run start failed (MlflowException: (raised as a result of Query-invoked autoflush;
    consider using a session.no_autoflush block ...))``, never saying what failed. The warning names the
    database error and that the store is read-only."""
    import fastlm.tracking
    from fastlm.tracking import SafeMlflow
    from tests.support.logs import module_log_lines

    store = tmp_path / "mlflow.db"
    shutil.copyfile(empty_mlflow_db, store)
    monkeypatch.chdir(tmp_path)  # MLflow makes the folder of ``file:<path>`` relative to the working folder
    mlflow.set_tracking_uri(f"sqlite:///{store}")
    mlflow.set_experiment("read-only")  # then opened read-only, as from a read-only mount
    mlflow.set_tracking_uri(f"sqlite:///file:{store}?mode=ro&uri=true")
    lines = module_log_lines(monkeypatch, fastlm.tracking)
    try:
        SafeMlflow().call("run start", lambda mlflow: mlflow.start_run(), needs_active_run=False)
    finally:
        mlflow.set_tracking_uri(None)
    assert len(lines) == 1, lines
    assert "autoflush" not in lines[0] and "attempt to write a readonly database" in lines[0], lines
    assert "read-only" in lines[0] and "mlflow.db" in lines[0], lines


def test_a_sweep_member_kept_from_an_earlier_sweep_run_is_nested_under_the_one_that_kept_it(active_run):
    """A k-fold sweep stopped in its second fold and run again keeps the first fold ("finished before:
    kept"): its MLflow run stayed a child of the KILLED first sweep run, and the FINISHED sweep run whose
    cv/ metrics it counts in showed one fold of two. It is nested under the sweep run that kept it; a member
    of a sweep run that finished stays that run's child (its own table compared it)."""
    from fastlm.tracking import RunTracker

    client = mlflow.MlflowClient()
    experiment = active_run.info.experiment_id
    stopped, finished = (client.create_run(experiment).info.run_id for _ in range(2))
    client.set_terminated(stopped, "KILLED")
    client.set_terminated(finished, "FINISHED")
    fold = client.create_run(experiment, tags={"mlflow.parentRunId": stopped}).info.run_id
    other = client.create_run(experiment, tags={"mlflow.parentRunId": finished}).info.run_id
    for run in (fold, other):
        RunTracker().adopt_child_run(run)
    assert client.get_run(fold).data.tags["mlflow.parentRunId"] == active_run.info.run_id
    assert client.get_run(other).data.tags["mlflow.parentRunId"] == finished
    RunTracker().adopt_child_run(None)  # a kept run tracked nowhere: nothing
    RunTracker().adopt_child_run(active_run.info.run_id)  # never its own parent
    assert "mlflow.parentRunId" not in client.get_run(active_run.info.run_id).data.tags


def test_the_run_comparison_lists_the_experiment_of_the_reported_training_run(active_run, caplog):
    """A report run in another experiment than the training it reports (the experiment renamed in
    conf/local/mlflow.yml between train and report) compared that experiment's runs: none, or others, without
    the reported one and without a word. It lists the training's experiment, said in one line; a training
    run the store does not hold leaves this run's experiment, with a warning."""
    from fastlm.tracking import search_training_runs

    client = mlflow.MlflowClient()
    earlier = client.create_experiment("earlier")
    training = client.create_run(earlier, run_name="trained").info.run_id
    client.log_metric(training, "real_tokens_per_s", 100.0)
    client.set_terminated(training)
    mine = search_training_runs()
    assert training not in set(mine.get("run_id", []))  # this run's experiment alone
    with caplog.at_level(logging.INFO, logger="fastlm.tracking"):
        runs = search_training_runs(training_run_id=training)
    assert list(runs["run_id"]) == [training]
    said = " ".join(record.getMessage() for record in caplog.records)
    assert "'earlier'" in said and "'tracking-test'" in said and "trained" in said, said
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastlm.tracking"):
        same = search_training_runs(training_run_id=active_run.info.run_id)
        missing = search_training_runs(training_run_id="f" * 32)
    assert list(same["run_id"]) == list(mine["run_id"]) == list(missing["run_id"])
    warned = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warned) == 1 and "f" * 32 in warned[0] and "not in" in warned[0], warned


def test_the_reported_training_run_is_read_behind_newer_runs(active_run, monkeypatch):
    """The run comparison reads the newest runs of the experiment (500: splits, reports and predictions count
    among them): a report of an earlier training behind as many newer runs compared them without it."""
    import fastlm.tracking as tracking

    client = mlflow.MlflowClient()
    experiment = active_run.info.experiment_id
    runs = [client.create_run(experiment, start_time=1000 + index).info.run_id for index in range(3)]
    monkeypatch.setattr(tracking, "SEARCHED_RUNS", 2)
    found = tracking.search_training_runs(training_run_id=runs[0])
    assert runs[0] in set(found["run_id"]) and len(found) == 3
    assert len(tracking.search_training_runs(training_run_id=runs[-1])) == 2
