"""The tune pipeline through a KedroSession: trials, plot, and a parameters file the train pipeline uses."""

import json
import math

import pandas as pd
import pytest
import yaml

from tests.support.e2e import SPLIT, TRAIN, own_experiment
from tests.support.project import copy_split_data, run_pipeline, split_once

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def split_data(tmp_path_factory, sample_texts, mlflow_uri):
    """A project split once with SPLIT (every test here tunes or trains on that split)."""
    return split_once(tmp_path_factory.mktemp("tune-split"), sample_texts, mlflow_uri, {"split": SPLIT})


@pytest.fixture
def split_project(kedro_project, split_data):
    """The test's project with the module's split copied in, as `kedro run --pipeline=split` leaves it."""
    return copy_split_data(split_data, kedro_project)


def test_tune_writes_trials_plot_and_parameters_that_train_picks_up(split_project, mlflow_uri):
    own_experiment(split_project, "tune-e2e")
    params = {
        "split": SPLIT,
        "train": TRAIN,
        "tune": {"max_micro_batch_size": 4, "target_effective_batch": 8, "cliff_tolerance": 0.9},
    }
    # the accumulation is for the processes a training step spans: micro-batch x accumulation x processes
    two = {**TRAIN, "distributed": {**TRAIN.get("distributed", {}), "nproc_per_node": 2}}
    run_pipeline(split_project, "tune", {**params, "train": two})
    trials = pd.read_csv(split_project / "data/08_reporting/tune_trials.csv")
    assert list(trials["mode"]) == ["packed"] * 3 + ["length_grouped"] * 3  # conf/base: tune.modes
    assert list(trials["micro_batch_size"]) == [1, 2, 4] * 2 and (trials["real_tokens_per_s"] > 0).all()
    assert (split_project / "data/08_reporting/plots/tune.png").stat().st_size > 5_000
    import mlflow  # the tune run logs what it wrote (the README says so): the trials too

    mlflow.set_tracking_uri(mlflow_uri)
    run = mlflow.search_runs(experiment_names=["tune-e2e"]).iloc[0]
    logged = {item.path for item in mlflow.MlflowClient().list_artifacts(run["run_id"], "tune")}
    assert {"tune/tune_trials.csv", "tune/tune_choice.json"} <= logged, logged
    tuned = yaml.safe_load((split_project / "conf/local/parameters_tuned.yml").read_text())
    chosen, mode = tuned["train"]["batching"]["micro_batch_size"], tuned["train"]["batching"]["mode"]
    fastest = trials.loc[trials["real_tokens_per_s"].idxmax()]
    assert (mode, chosen) == (fastest["mode"], fastest["micro_batch_size"])
    # target_effective_batch counts samples: a packed row holds several, a length-grouped row one
    samples = fastest["samples_per_micro_batch"]
    assert mode == "packed" or samples == chosen
    accumulation = tuned["train"]["batching"]["gradient_accumulation_steps"]
    assert accumulation == max(1, math.ceil(8 / (samples * 2)))
    record = tuned["tune_accumulation"]
    assert (record["processes"], record["measured_processes"], record["target_effective_batch"]) == (2, 1, 8)
    assert record["samples_per_micro_batch"] == pytest.approx(samples, rel=1e-9)  # read back from the CSV

    from kedro.framework.session import KedroSession

    with KedroSession.create(project_path=split_project) as session:
        train = session.load_context().params["train"]
    assert train["batching"]["micro_batch_size"] == chosen and train["optimizer"]["lr"] == 0.002
    assert train["batching"]["mode"] == mode


def test_max_minutes_stops_the_measurement_and_the_choice_comes_from_what_was_measured(split_project):
    """A limit already past when the measurement starts: the first mode's first size only (each ladder's
    first size always runs), the next size and the second mode left out and said so, that size chosen. Tuned
    under ``tune.memory_limit_gb``, the file records the limit (for a card of this kind with that memory)."""
    tune = {"max_micro_batch_size": 4, "max_minutes": 1e-6, "memory_limit_gb": 2}
    params = {"split": SPLIT, "train": TRAIN, "tune": tune}
    run_pipeline(split_project, "tune", params)
    trials = pd.read_csv(split_project / "data/08_reporting/tune_trials.csv")
    assert list(zip(trials["mode"], trials["micro_batch_size"], trials["status"], strict=True)) == [
        ("packed", 1, "ok"),
        ("packed", 2, "time limit"),
    ]
    tuned = yaml.safe_load((split_project / "conf/local/parameters_tuned.yml").read_text())
    assert tuned["train"]["batching"]["micro_batch_size"] == 1
    assert tuned["tune_measured_on"]["device memory limit GB"] == 2
    explanation = json.loads((split_project / "data/08_reporting/tune_choice.json").read_text())[
        "explanation"
    ]
    assert "tune.max_minutes was reached before micro-batch 2" in explanation
    assert "length_grouped: not measured (tune.max_minutes was reached first)" in explanation


def test_under_cuda_graphs_tune_measures_packed_without_recompute_and_says_why(split_project, monkeypatch):
    """``compile_mode: reduce-overhead``: conf/base's ``tune.modes`` lists length_grouped and memory stops
    the ladder with ``gradient_checkpointing: auto``, but CUDA graphs replay packed micro-batches and no
    recompute: tune measures packed with checkpointing off, writes what train accepts and says why. (The
    trials are faked, memory-bound at 4: the choice, not the measurement, is what this checks.)"""
    from fastlm.engine.train import tune

    measured = []

    def fake_modes(model, dataset, modes, *, settings, **_):
        measured.append((list(modes), sum(layer.gradient_checkpointing for layer in model.model.layers)))

        def measure(size: int) -> tune.Measurement:
            return tune.Measurement(100.0 * size, 0.1, 30.0 * size, samples_per_micro_batch=2.0 * size)

        trials = tune.run_ladder(
            measure, settings.sizes, memory_limit_mb=100, headroom=0.1, cliff_tolerance=0.05
        )
        return [tune.ModeLadder(mode, trials, tune.choose(trials)) for mode in modes]

    monkeypatch.setattr(tune, "tune_modes", fake_modes)
    graphs = {"compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead", "device": "auto"}
    train = {**TRAIN, "runtime": graphs, "model": {**TRAIN["model"], "gradient_checkpointing": "auto"}}
    params = {"split": SPLIT, "train": train, "tune": {"max_micro_batch_size": 8}}
    run_pipeline(split_project, "tune", params)
    assert measured == [(["packed"], 0)]  # one policy (off), one mode
    tuned = yaml.safe_load((split_project / "conf/local/parameters_tuned.yml").read_text())
    assert (
        tuned["train"]["batching"]["mode"] == "packed" and tuned["train"]["batching"]["micro_batch_size"] == 2
    )
    assert tuned["train"]["model"]["gradient_checkpointing"] == "off"
    explanation = json.loads((split_project / "data/08_reporting/tune_choice.json").read_text())[
        "explanation"
    ]
    assert "recompute was not measured: train.runtime.compile_mode reduce-overhead" in explanation
    assert "tune.modes length_grouped not measured" in explanation


def test_tuned_settings_measured_on_another_split_are_not_applied(split_project, split_data, monkeypatch):
    """Tune, then train: the tuned micro-batch and mode are applied and said. Re-split with another
    max_length, or a tuned file without the record of what it measured on (an older version's): train runs on
    conf/base's batching, with one warning naming what changed and the fix."""
    import fastlm.hooks.conf as conf_hooks
    from tests.support.logs import module_log_lines

    lines = module_log_lines(monkeypatch, conf_hooks)

    train = {key: value for key, value in TRAIN.items() if key != "batching"}  # batching from the files
    tune = {"max_micro_batch_size": 2, "modes": ["length_grouped"], "cliff_tolerance": 0.9}
    run_pipeline(split_project, "tune", {"split": SPLIT, "train": train, "tune": tune})
    tuned_file = split_project / "conf/local/parameters_tuned.yml"
    tuned = yaml.safe_load(tuned_file.read_text())["train"]["batching"]
    base = yaml.safe_load((split_project / "conf/base/parameters_train.yml").read_text())["train"]["batching"]
    assert tuned["micro_batch_size"] != base["micro_batch_size"] and tuned["mode"] != base["mode"]

    def trained_batching(split: dict) -> tuple[int, str]:
        lines.clear()
        run_pipeline(split_project, "train", {"split": split, "train": train})
        summary = json.loads((split_project / "data/08_reporting/train_summary.json").read_text())
        return summary["micro_batch_size"], summary["batching"]

    assert trained_batching(SPLIT) == (tuned["micro_batch_size"], tuned["mode"])
    applied = [line for line in lines if "is in effect" in line]
    assert len(applied) == 1 and f"mode={tuned['mode']}" in applied[0]

    other = {**SPLIT, "max_length": SPLIT["max_length"] // 2}
    run_pipeline(split_project, "split", {"split": other})
    assert trained_batching(other) == (base["micro_batch_size"], base["mode"])
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and "split.max_length" in warned[0] and "kedro run --pipeline=tune" in warned[0]
    assert not any("is in effect" in line for line in lines)

    copy_split_data(split_data, split_project)  # the split it was measured on
    old = yaml.safe_load(tuned_file.read_text())
    old.pop("tune_measured_on", None)  # as an older version wrote it
    tuned_file.write_text(yaml.safe_dump(old))
    assert trained_batching(SPLIT) == (base["micro_batch_size"], base["mode"])
    warned = [line for line in lines if "not applied" in line]
    assert len(warned) == 1 and "older version" in warned[0]


def test_a_tuned_file_not_applied_leaves_the_train_parameters_of_a_run_without_it(kedro_project):
    """A tuned file the run does not apply (here: no record of what it measured on) gives ``params:train``
    as a run without the file has it, as Kedro reads conf/base: a global (``${globals:...}``), the project's
    ``${env_or:...}`` resolver, ``${runtime_params:...}`` and ``--params`` resolved, a folder Kedro's
    patterns do not read left out. (They came back as the raw text: every train and tune run refused, or
    took a value from a file Kedro does not read.)"""
    import re

    from kedro.framework.session import KedroSession
    from kedro.pipeline import Node, Pipeline

    from fastlm.hooks import TunedParametersHook
    from tests.support.project import bootstrap

    conf = kedro_project / "conf"
    (conf / "base/globals.yml").write_text("micro_batch: 6\n")
    train_yml = conf / "base/parameters_train.yml"
    text = train_yml.read_text()
    for key, value in (
        ("mode", "${env_or:FASTLM_NO_SUCH_VARIABLE,dynamic}"),
        ("micro_batch_size", "${globals:micro_batch}"),
        ("gradient_accumulation_steps", "${runtime_params:accumulation,3}"),
    ):
        text, count = re.subn(rf"(\n    {key}:) \S+", rf"\1 {value}", text, count=1)
        assert count == 1
    train_yml.write_text(text)
    unread = conf / "base/zz_notes/parameters/batching.yml"  # patterns: parameters*, parameters*/**, ...
    unread.parent.mkdir(parents=True)
    unread.write_text("train:\n  batching:\n    row_length: 64\n")
    tuned_file = conf / "local/parameters_tuned.yml"
    tuned = {"mode": "length_grouped", "micro_batch_size": 4, "gradient_accumulation_steps": 5}
    tuned_file.write_text(yaml.safe_dump({"train": {"batching": {**tuned, "row_length": 32}}}))
    given = {"accumulation": 2, "train": {"seed": 7}}
    training = Pipeline([Node(lambda train: train, "params:train", "trained_model")])

    def train_params(hooked: bool) -> dict:
        bootstrap(kedro_project)
        with KedroSession.create(project_path=kedro_project, runtime_params=given) as session:
            context = session.load_context()
            catalog = context.catalog
            if hooked:
                read = catalog.load("params:train")["batching"]
                assert read["micro_batch_size"] == tuned["micro_batch_size"]  # the file is read
                hook = TunedParametersHook()
                hook.after_context_created(context)
                run = {"env": None, "runtime_params": given, "project_path": str(kedro_project)}
                hook.before_pipeline_run(run, training, catalog)
            return catalog.load("params:train")

    not_applied = train_params(hooked=True)
    tuned_file.unlink()
    without = train_params(hooked=False)
    assert without["batching"]["micro_batch_size"] == 6 and without["batching"]["mode"] == "dynamic"
    assert without["batching"]["gradient_accumulation_steps"] == 2 and without["seed"] == 7
    assert not_applied == without
