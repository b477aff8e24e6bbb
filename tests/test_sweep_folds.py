"""A sweep over folds (``folds: auto``): one run per fold of the split (per parameter set of a grid), and the
mean and spread of each metric over the folds in the sweep's report."""

import contextlib
import os

import pandas as pd
import pytest
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm import sweep_training
from fastlm.engine.checkpoint.resume import digest_differences, run_digest
from fastlm.engine.config import parse_train_params
from fastlm.engine.observe.health import NonFiniteLossError
from fastlm.engine.train.signals import TrainingInterrupted
from fastlm.errors import ConfigError
from fastlm.pipelines.sweep import nodes
from fastlm.reporting.sweep_view import (
    FOLD_METRICS,
    comparison_table,
    cv_metrics,
    cv_setting,
    fold_spread,
    fold_table,
    sweep_document,
    verdict,
)
from fastlm.sweeps import SweepRuns, load_sweep, load_sweep_runs


def _file(tmp_path, spec) -> str:
    path = tmp_path / "sweep.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def test_folds_auto_makes_one_run_per_fold_and_per_grid_setting(tmp_path):
    alone = load_sweep(_file(tmp_path, {"name": "cv", "folds": "auto"}))
    assert alone.plan(folds=3) == [{"train.fold": 0}, {"train.fold": 1}, {"train.fold": 2}]
    assert alone.run_names(folds=3) == ["cv-01", "cv-02", "cv-03"]
    grid = load_sweep(
        _file(tmp_path, {"name": "cv", "folds": "auto", "grid": {"train.optimizer.lr": [1, 2]}})
    )
    assert grid.plan(folds=2) == [
        {"train.optimizer.lr": 1, "train.fold": 0},
        {"train.optimizer.lr": 1, "train.fold": 1},
        {"train.optimizer.lr": 2, "train.fold": 0},
        {"train.optimizer.lr": 2, "train.fold": 1},
    ]


def test_folds_auto_on_data_split_without_folds_is_one_line(tmp_path):
    path = _file(tmp_path, {"name": "cv", "folds": "auto"})
    with pytest.raises(ConfigError, match="split.folds") as error:
        load_sweep_runs(path, {}, folds=None)
    assert "\n" not in str(error.value) and "Fix:" in str(error.value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"name": "cv", "folds": 3}, "folds"),
        ({"name": "cv", "folds": "auto", "grid": {"train.fold": [0, 1]}}, "train.fold"),
    ],
)
def test_bad_fold_sweeps_are_one_line(tmp_path, spec, expected):
    with pytest.raises(ConfigError, match=expected) as error:
        load_sweep(_file(tmp_path, spec))
    assert "\n" not in str(error.value)


SUMMARIES = {
    "cv-01": {"final_val_loss": 2.0, "test_loss": 3.0, "final_train_loss": 1.0, "wall_time_s": 1.0},
    "cv-02": {"final_val_loss": 4.0, "test_loss": 3.5, "final_train_loss": 1.5, "wall_time_s": 1.0},
    "cv-03": {"final_val_loss": 3.0, "test_loss": 2.5, "final_train_loss": 1.2, "wall_time_s": 1.0},
}
OVERRIDES = {"cv-01": {"train.fold": 0}, "cv-02": {"train.fold": 1}, "cv-03": {"train.fold": 2}}


def test_mean_and_spread_over_folds_in_the_report():
    table = comparison_table(SUMMARIES, OVERRIDES, "final_val_loss")
    spread = fold_spread(table)
    row = spread.set_index("metric").loc["final_val_loss"]
    assert row["folds"] == 3 and row["mean"] == pytest.approx(3.0) and row["std"] == pytest.approx(1.0)
    assert (row["min"], row["max"]) == (2.0, 4.0)
    assert spread.set_index("metric").loc["test_loss", "mean"] == pytest.approx(3.0)
    assert "wall_time_s" not in set(spread["metric"])  # model quality only
    text = verdict(table, "final_val_loss", {}, spread=spread)
    assert text.startswith("Over 3 folds: final_val_loss mean 3 (std 1, min 2, max 4)")
    document = sweep_document("cv", text, table, spread)
    assert "## Mean and spread over folds" in document and "| final_val_loss |" in document


def test_the_verdict_compares_no_speed_between_folds():
    """Each fold validates on its own rows: which fold "reached validation loss L sooner" (or ran fastest)
    says nothing of a setting."""
    table = comparison_table(
        {
            name: {**figures, "wall_time_s": 1.0 + index}
            for index, (name, figures) in enumerate(SUMMARIES.items())
        },
        OVERRIDES,
        "final_val_loss",
    )
    evaluations = {
        name: pd.DataFrame({"step": [1, 2], "val_loss": [5.0, s["final_val_loss"]]})
        for name, s in SUMMARIES.items()
    }
    histories = {
        name: pd.DataFrame({"step": [1, 2], "loss": [3.0, 2.0], "elapsed_s": [0.1 * (i + 1), 0.2 * (i + 1)]})
        for i, name in enumerate(SUMMARIES)
    }
    text = verdict(table, "final_val_loss", histories, evaluations, spread=fold_spread(table))
    assert "sooner" not in text and "fastest" not in text, text


def test_spread_is_per_setting_of_a_cross_validated_grid():
    summaries = {f"r{i}": {"final_val_loss": float(i)} for i in range(4)}
    overrides = {f"r{i}": {"train.optimizer.lr": [1, 1, 2, 2][i], "train.fold": i % 2} for i in range(4)}
    spread = fold_spread(comparison_table(summaries, overrides, "final_val_loss"))
    assert list(spread["train.optimizer.lr"]) == [1, 2] and list(spread["mean"]) == [0.5, 2.5]
    no_folds = {name: {} for name in summaries}
    assert fold_spread(comparison_table(summaries, no_folds, "final_val_loss")) is None


def test_the_fold_is_part_of_the_run_digest(tmp_path):
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2
        )
    )
    digests = [
        run_digest(
            model, parse_train_params({"fold": fold}), max_length=8, data="d", world_size=1, sharded=False
        )
        for fold in (0, 1)
    ]
    assert digest_differences(digests[0], digests[1]) == ["data.fold 0 -> 1"]
    plain = run_digest(model, parse_train_params({}), max_length=8, data="d", world_size=1, sharded=False)
    assert digest_differences({key: value for key, value in plain.items() if key != "data.fold"}, plain) == []


FAILED_FOLD = {**SUMMARIES, "cv-02": {"failed": "NonFiniteLossError: the training loss became nan by step 2"}}
RUN_IDS = {"cv-01": "a1", "cv-02": "a2", "cv-03": "a3"}


def test_the_mean_and_spread_over_folds_as_mlflow_metrics_of_the_sweep_run():
    table = comparison_table(SUMMARIES, OVERRIDES, "final_val_loss")
    metrics = cv_metrics(table, "final_val_loss")
    assert metrics["cv/folds"] == 3 and metrics["cv/folds_completed"] == 3
    assert metrics["cv/final_val_loss_mean"] == pytest.approx(3.0)
    assert metrics["cv/final_val_loss_std"] == pytest.approx(1.0)  # sample std (n - 1), as in sweep.md
    assert (metrics["cv/final_val_loss_min"], metrics["cv/final_val_loss_max"]) == (2.0, 4.0)
    spread = fold_spread(table, "final_val_loss").set_index("metric")
    for metric in spread.index:  # the same figures as sweep.md's, for the same metrics
        for statistic in ("mean", "std", "min", "max"):
            assert metrics[f"cv/{metric}_{statistic}"] == spread.loc[metric, statistic]
    aggregated = {key.removeprefix("cv/").rsplit("_", 1)[0] for key in metrics if key.endswith("_mean")}
    assert aggregated == {"final_val_loss", "test_loss", "final_train_loss"} <= set(FOLD_METRICS)
    assert cv_setting(table, "final_val_loss") == {}  # folds alone: no other setting
    no_folds = comparison_table(SUMMARIES, {name: {} for name in SUMMARIES}, "final_val_loss")
    assert cv_metrics(no_folds, "final_val_loss") == {}


def test_the_report_says_which_standard_deviation_it_gives():
    table = comparison_table(SUMMARIES, OVERRIDES, "final_val_loss")
    document = sweep_document("cv", "text", table, fold_spread(table))
    assert "## Mean and spread over folds (std: sample, n - 1)\n" in document


def test_fold_table_has_one_row_per_fold_then_count_mean_std_min_max(tmp_path):
    table = comparison_table(SUMMARIES, OVERRIDES, "final_val_loss")
    path = tmp_path / "sweep_folds.csv"
    fold_table(table, RUN_IDS, "final_val_loss").to_csv(path, index=False)
    folds = pd.read_csv(path)
    assert list(folds["row"]) == ["fold"] * 3 + ["count", "mean", "std", "min", "max"]
    runs = folds[folds["row"] == "fold"]
    assert list(runs["run"]) == ["cv-01", "cv-02", "cv-03"] and list(runs["run_id"]) == ["a1", "a2", "a3"]
    assert list(runs["fold"]) == [0, 1, 2] and set(runs["status"]) == {"completed"}
    assert list(runs["final_val_loss"]) == [2.0, 4.0, 3.0]
    statistics = folds.set_index("row")
    spread = fold_spread(table, "final_val_loss").set_index("metric")
    for statistic in ("mean", "std", "min", "max"):  # what sweep.md shows, to the last digit a CSV keeps
        assert statistics.loc[statistic, "test_loss"] == pytest.approx(spread.loc["test_loss", statistic])
    assert statistics.loc["count", "final_val_loss"] == 3 and statistics.loc["std", "final_val_loss"] == 1.0
    assert "wall_time_s" not in folds  # model quality only, as in sweep.md


def test_a_cross_validated_grid_aggregates_per_setting_and_logs_the_best_setting():
    losses = [3.0, 4.0, 1.0, 2.0]
    summaries = {f"r{i}": {"final_val_loss": losses[i]} for i in range(4)}
    overrides = {f"r{i}": {"train.optimizer.lr": [1, 1, 2, 2][i], "train.fold": i % 2} for i in range(4)}
    table = comparison_table(summaries, overrides, "final_val_loss")
    folds = fold_table(table, {}, "final_val_loss")
    means = folds[folds["row"] == "mean"]
    assert list(means["train.optimizer.lr"]) == [1, 2] and list(means["final_val_loss"]) == [3.5, 1.5]
    assert cv_setting(table, "final_val_loss") == {"train.optimizer.lr": 2}
    assert cv_metrics(table, "final_val_loss")["cv/final_val_loss_mean"] == 1.5
    # lr 2 loses a fold: its mean over the one left is not ranked above a setting with every fold
    summaries["r3"] = {"failed": "OutOfMemory: the CPU device ran out of memory"}
    table = comparison_table(summaries, overrides, "final_val_loss")
    assert cv_setting(table, "final_val_loss") == {"train.optimizer.lr": 1}
    assert cv_metrics(table, "final_val_loss")["cv/folds_completed"] == 2


def test_a_failed_fold_is_named_and_the_aggregate_says_over_how_many_folds():
    table = comparison_table(FAILED_FOLD, OVERRIDES, "final_val_loss")
    metrics = cv_metrics(table, "final_val_loss")
    assert metrics["cv/folds"] == 3 and metrics["cv/folds_completed"] == 2
    assert metrics["cv/final_val_loss_mean"] == pytest.approx(2.5)  # over folds 0 and 2
    spread = fold_spread(table, "final_val_loss")
    assert spread.set_index("metric").loc["final_val_loss", "folds"] == 2
    text = verdict(table, "final_val_loss", {}, spread=spread)
    assert text.startswith("Over 2 of 3 folds (fold 1 failed): final_val_loss mean 2.5 (std")
    document = sweep_document("cv", text, table, spread)
    assert "Fold 1 (cv-02) failed: NonFiniteLossError: the training loss became nan by step 2" in document
    assert "Over 3 folds" not in document and "over 2 of 3 folds" in document
    folds = fold_table(table, RUN_IDS, "final_val_loss")
    failed = folds[folds["run"] == "cv-02"].iloc[0]
    assert (failed["status"], failed["run_id"], failed["fold"]) == ("failed", "a2", 1)
    assert failed["error"].startswith("NonFiniteLossError") and pd.isna(failed["final_val_loss"])
    assert folds.set_index("row").loc["count", "final_val_loss"] == 2


class _Tracker:
    """The RunTracker calls the sweep node makes, recorded."""

    def __init__(self):
        self.children, self.metrics, self.params, self.adopted = [], [], {}, []

    @contextlib.contextmanager
    def child_run(self, name, params):
        self.children.append(name)
        yield f"id-{name}"

    def log_run_metrics(self, metrics):
        self.metrics.append(dict(metrics))

    def log_params(self, params):
        self.params.update(params)

    def adopt_child_run(self, run_id):
        self.adopted.append(run_id)


def _fake_training(failing: set[int], error=None, seen=None):
    def train_model(tokenized, fingerprint, tokenizer, params, split_params, run_name, tracker, choices_dir):
        if seen is not None:
            seen.append((params["checkpoint_dir"], choices_dir))
        if params["fold"] in failing:
            raise error or NonFiniteLossError(
                "the training loss became nan by step 2; training stopped.", fix="lower train.optimizer.lr."
            )
        history = pd.DataFrame({"step": [1, 2], "loss": [3.0, 2.0], "elapsed_s": [0.1, 0.2]})
        evaluation = pd.DataFrame({"step": [2], "val_loss": [2.0 + params["fold"]]})
        summary = {"final_val_loss": 2.0 + params["fold"], "wall_time_s": 1.0, "steps": 2}
        return {"model": None}, history, evaluation, summary

    return train_model


class _Vocabulary:
    """What the sweep asks of the tokenizer before its runs (the fake training uses none): its length."""

    def __len__(self) -> int:
        return 300


TOKENIZER = _Vocabulary()


def _sweep(tmp_path, runs, tracker):
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 3}}
    return nodes.run_sweep(None, fingerprint, TOKENIZER, None, {}, {}, {}, str(sweep), runs, tracker)


def test_a_fold_that_fails_is_left_out_named_and_retried_by_the_next_sweep(tmp_path, monkeypatch):
    runs = SweepRuns(tmp_path / "sweeps")
    monkeypatch.setattr(nodes, "train_model", _fake_training({1}))
    tracker = _Tracker()
    table, _, document, folds, _ = _sweep(tmp_path, runs, tracker)
    assert tracker.children == ["cv-01", "cv-02", "cv-03"]  # the sweep went on after fold 1
    assert "failed: NonFiniteLossError" in table.set_index("run").loc["cv-02", "stopped"]
    assert "Over 2 of 3 folds (fold 1 failed)" in document and "Fold 1 (cv-02) failed" in document
    assert list(folds.loc[folds["row"] == "fold", "run_id"]) == ["id-cv-01", "id-cv-02", "id-cv-03"]
    assert list(folds.loc[folds["row"] == "fold", "status"]) == ["completed", "failed", "completed"]
    cv = tracker.metrics[-1]  # on the sweep's run, after its child runs
    assert (cv["cv/folds"], cv["cv/folds_completed"]) == (3, 2) and cv["cv/final_val_loss_mean"] == 3.0
    assert not (runs.folder("cv", "cv-02") / "summary.json").exists()  # not kept: the next sweep retries it

    monkeypatch.setattr(nodes, "train_model", _fake_training(set()))
    tracker = _Tracker()
    _, _, document, folds, _ = _sweep(tmp_path, runs, tracker)
    assert tracker.children == ["cv-02"] and "Over 3 folds: final_val_loss mean 3 " in document
    assert list(folds.loc[folds["row"] == "fold", "run_id"]) == ["id-cv-01", "id-cv-02", "id-cv-03"]
    assert tracker.metrics[-1]["cv/folds_completed"] == 3


@pytest.mark.parametrize(
    ("failing", "error"),
    [
        ({0, 1, 2}, None),  # every fold failed: nothing to aggregate, the first error
        ({0}, TrainingInterrupted("SIGTERM", 1, "checkpoint-00000001")),  # a stop signal stops the sweep
    ],
)
def test_a_sweep_stops_on_a_signal_or_when_every_run_failed(tmp_path, monkeypatch, failing, error):
    monkeypatch.setattr(nodes, "train_model", _fake_training(failing, error))
    tracker = _Tracker()
    with pytest.raises(type(error) if error else NonFiniteLossError):
        _sweep(tmp_path, SweepRuns(tmp_path / "sweeps"), tracker)
    assert tracker.children == (["cv-01"] if error else ["cv-01", "cv-02", "cv-03"])


def test_a_cross_validated_grid_names_the_setting_of_its_cv_metrics(tmp_path, monkeypatch):
    monkeypatch.setattr(nodes, "train_model", _fake_training(set()))
    sweep = tmp_path / "grid.yml"
    sweep.write_text(yaml.safe_dump({"name": "g", "folds": "auto", "grid": {"train.seed": [1, 2]}}))
    tracker = _Tracker()
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}}
    _, _, document, folds, best = nodes.run_sweep(
        None,
        fingerprint,
        TOKENIZER,
        None,
        {},
        {},
        {},
        str(sweep),
        SweepRuns(tmp_path / "s"),
        tracker,
        paths={"sweep_best_run": "out/best.yml"},
    )
    assert tracker.params == {"cv/train.seed": 1}  # equal means: the first setting
    # named by all its runs, one a fold, and the mean that chose it: not as its first fold's run, which the
    # verdict may call the worst fold (the header said "the setting of g-01, best by final_val_loss")
    runs = folds.loc[(folds["row"] == "fold") & (folds["train.seed"] == 1), "run"].tolist()
    assert len(runs) == 2
    assert best.startswith(
        f"# Sweep g: the setting of {' and '.join(runs)} (one run a fold), best by its mean"
    )
    assert (
        f"To train the setting of {' and '.join(runs)} (one run a fold) on the whole training split"
        in str(document)
    )
    # the best setting, to train on the whole training split: its seed, no fold
    expected = {"run_name": "g-best", "train": {"seed": 1}, "split": {}}
    assert yaml.safe_load(best) == {"run": {"pipeline": "train", "params": expected}}
    assert "kedro run --config out/best.yml" in best
    assert list(folds.loc[folds["row"] == "mean", "train.seed"]) == [1, 2]
    assert (tracker.metrics[-1]["cv/folds"], tracker.metrics[-1]["cv/final_val_loss_mean"]) == (2, 2.5)


def test_finished_runs_are_scored_again_when_the_reports_scoring_changes(tmp_path, monkeypatch):
    """A run is kept with its test figures: another report.top_k (or eval batches, references) scores it
    otherwise, so it is not "finished before" (kept, its summary had test_top5_accuracy and a sweep ranked by
    test_top4_accuracy failed on a KeyError)."""
    monkeypatch.setattr(nodes, "train_model", _fake_training(set()))
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}}
    runs = SweepRuns(tmp_path / "sweeps")
    for report, trained in (({}, 2), ({}, 0), ({"top_k": 4}, 2), ({"eval_max_batches": 3}, 2)):
        tracker = _Tracker()
        nodes.run_sweep(None, fingerprint, TOKENIZER, None, {}, {}, report, str(sweep), runs, tracker)
        assert len(tracker.children) == trained, (report, tracker.children)


def test_the_runs_of_a_sweep_keep_their_runtime_choices_where_plain_runs_do(tmp_path, monkeypatch):
    """The measured CPU precision is kept per machine, model and batch shape in the runs' checkpoint folder:
    a sweep's runs checkpoint under sweeps/<name>/ but keep their choices with the plain runs', so a
    retrain of the best setting trains in the precision its sweep run did."""
    seen = []
    monkeypatch.setattr(nodes, "train_model", _fake_training(set(), seen=seen))
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}}
    base = {"checkpoint_dir": str(tmp_path / "ckpt")}
    nodes.run_sweep(
        None, fingerprint, TOKENIZER, None, base, {}, {}, str(sweep), SweepRuns(tmp_path / "s"), _Tracker()
    )
    assert seen == [(str(tmp_path / "ckpt" / "sweeps" / "cv"), str(tmp_path / "ckpt"))] * 2


def test_a_sweeps_runs_are_kept_on_the_same_texts_and_those_kept_before_the_data_identity_trained_again(
    tmp_path, monkeypatch, caplog
):
    """A sweep's finished runs record the data they trained on: since round six the data identity (the
    fingerprint with the split texts' digest), so a split of other texts with the same tokenizer and settings
    trains them again. Runs kept by the version before recorded the fingerprint alone, which cannot tell two
    splits of other texts apart: they are trained again, each with a line saying what its record lacks (they
    were kept as finished, fine-tuned on other texts, until round twenty)."""
    import json

    monkeypatch.setattr(nodes, "train_model", _fake_training(set()))
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}, "data_sha256": "texts"}
    runs = SweepRuns(tmp_path / "sweeps")

    def trained(data: str) -> int:
        tracker = _Tracker()
        changed = {**fingerprint, "data_sha256": data}
        nodes.run_sweep(None, changed, TOKENIZER, None, {}, {}, {}, str(sweep), runs, tracker)
        return len(tracker.children)

    assert [trained("texts"), trained("texts"), trained("other texts")] == [2, 0, 2]
    for summary in (tmp_path / "sweeps").rglob("summary.json"):  # as the version before kept them
        kept = json.loads(summary.read_text())
        kept["sweep_identity"]["data"] = "f"
        summary.write_text(json.dumps(kept))
    caplog.clear()  # the lines of the runs above, where INFO reached the log
    with caplog.at_level("INFO", logger=sweep_training.__name__):
        assert trained("other texts") == 2
    said = [record.getMessage() for record in caplog.records if "is trained again" in record.getMessage()]
    assert len(said) == 2 and all("data" in line for line in said), said
    assert trained("other texts") == 0  # then kept, on their own record


def test_a_run_trained_again_for_a_changed_setting_names_it_with_both_values(tmp_path, monkeypatch, caplog):
    """One train setting edited in the project's conf (``train.optimizer.lr``) trains the sweep's finished
    runs again: the line saying why named the section alone ("its train differ"), not which setting
    changed. It names the setting by its dotted name with the value the run finished with and the new one."""
    monkeypatch.setattr(nodes, "train_model", _fake_training(set()))
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}}
    runs = SweepRuns(tmp_path / "sweeps")

    def trained(lr: float) -> int:
        tracker = _Tracker()
        train = {"optimizer": {"lr": lr}}
        nodes.run_sweep(None, fingerprint, TOKENIZER, None, train, {}, {}, str(sweep), runs, tracker)
        return len(tracker.children)

    assert [trained(0.0003), trained(0.0003)] == [2, 0]
    caplog.clear()  # the lines of the runs above
    with caplog.at_level("INFO", logger=sweep_training.__name__):
        assert trained(0.0001) == 2
    said = [record.getMessage() for record in caplog.records if "is trained again" in record.getMessage()]
    assert len(said) == 2, said
    assert all("its train.optimizer.lr 0.0003 -> 0.0001 differ" in line for line in said), said


def test_runs_past_the_ninety_ninth_keep_the_plans_order():
    """Run names number the plan with two digits (``sweep-01``): from the hundredth run on, sorting them as
    text put ``cv-100`` between ``cv-10`` and ``cv-11`` in the fold table and the folds of a setting out of
    their order. The plan's order is the number's."""
    names = [f"cv-{index:02d}" for index in range(1, 106)]
    summaries = {name: {"final_val_loss": float(index % 7)} for index, name in enumerate(names)}
    overrides = {
        name: {"train.seed": index // 35, "train.fold": index % 35} for index, name in enumerate(names)
    }
    table = comparison_table(summaries, overrides, "final_val_loss")
    folds = fold_table(table, {name: None for name in names}, "final_val_loss")
    listed = list(folds.loc[folds["row"] == "fold", "run"])
    assert listed == names, listed[8:12] + listed[98:102]


def test_a_sweeps_runs_are_trained_again_on_other_base_weights(tmp_path, monkeypatch):
    """The base model folder (``train.model.name_or_path``) given other weights in place (a newer revision
    downloaded into it, a base trained again): the sweep kept its finished runs, fine-tuned from the old
    weights, as finished with the same settings and ranked them beside new ones."""
    monkeypatch.setattr(nodes, "train_model", _fake_training(set()))
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}, "data_sha256": "texts"}
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text("{}")
    weights = base / "model.safetensors"
    weights.write_bytes(b"old weights")
    runs = SweepRuns(tmp_path / "sweeps")

    def trained() -> int:
        tracker = _Tracker()
        train = {"model": {"name_or_path": str(base)}}
        nodes.run_sweep(None, fingerprint, TOKENIZER, None, train, {}, {}, str(sweep), runs, tracker)
        return len(tracker.children)

    assert [trained(), trained()] == [2, 0]
    os.utime(base / "config.json", (1_000_000_000, 1_000_000_000))  # not the weights: still finished
    assert trained() == 0
    stat = weights.stat()
    weights.write_bytes(b"new weights")
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert trained() == 2


def test_a_run_trained_again_starts_fresh_not_from_the_checkpoint_it_finished_with(tmp_path, monkeypatch):
    """A finished run trained again for a changed setting (``train.optimizer.weight_decay`` edited in the
    conf) was given ``train.resume`` as the conf has it (``auto``): its own checkpoint, at the last step of
    the sweep's budget, was resumed with the new optimizer settings and nothing trained, and the run was kept
    with the old model's figures under the new settings. It trains from scratch (``resume: never``: its old
    checkpoints moved aside); its stale record is dropped first, so an interrupted retrain is resumed by the
    next sweep as any unfinished run is."""
    sweep = tmp_path / "folds.yml"
    sweep.write_text(yaml.safe_dump({"name": "cv", "folds": "auto"}))
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}}
    runs = SweepRuns(tmp_path / "sweeps")
    seen = []

    def training(error=None):
        fake = _fake_training({0} if error else set(), error)

        def train_model(
            tokenized, fingerprint, tokenizer, params, split_params, run_name, tracker, choices_dir
        ):
            seen.append((run_name, params.get("resume", "auto")))
            return fake(
                tokenized, fingerprint, tokenizer, params, split_params, run_name, tracker, choices_dir
            )

        return train_model

    def sweep_with(decay: float, error=None) -> list:
        seen.clear()
        monkeypatch.setattr(nodes, "train_model", training(error))
        train = {"optimizer": {"weight_decay": decay}}
        nodes.run_sweep(None, fingerprint, TOKENIZER, None, train, {}, {}, str(sweep), runs, _Tracker())
        return list(seen)

    assert sweep_with(0.1) == [("cv-01", "auto"), ("cv-02", "auto")]
    assert sweep_with(0.1) == []  # kept
    assert sweep_with(0.05) == [("cv-01", "never"), ("cv-02", "never")]  # trained again, from scratch
    assert sweep_with(0.05) == []  # then kept on its new record
    interrupted = TrainingInterrupted("SIGTERM", 1, "checkpoint-00000001")
    with pytest.raises(TrainingInterrupted):
        sweep_with(0.2, interrupted)  # cv-01's retrain stopped part way
    assert not (runs.folder("cv", "cv-01") / "summary.json").exists()  # no stale record left to keep
    assert sweep_with(0.2) == [("cv-01", "auto"), ("cv-02", "never")]  # cv-01 resumes its own retrain


def test_folds_of_one_value_have_that_mean_and_no_spread():
    """Folds that score alike (a test accuracy of 4 in 11 on every fold; a ROUGE every fold's model reaches)
    have that value as their mean and a standard deviation of 0, in sweep.md, sweep_folds.csv and the cv/
    metrics. Was: pandas' mean one unit in the last place off (0.36363636363636360) and a std of 6.799e-17
    shown as a spread."""
    same = 4 / 11
    summaries = {name: {**summary, "test_accuracy": same} for name, summary in SUMMARIES.items()}
    table = comparison_table(summaries, OVERRIDES, "final_val_loss")
    row = fold_spread(table).set_index("metric").loc["test_accuracy"]
    assert (row["mean"], row["std"], row["min"], row["max"]) == (same, 0.0, same, same)
    metrics = cv_metrics(table, "final_val_loss")
    assert (metrics["cv/test_accuracy_mean"], metrics["cv/test_accuracy_std"]) == (same, 0.0)
    folds = fold_table(table, {}, "final_val_loss").set_index("row")
    assert (folds.loc["mean", "test_accuracy"], folds.loc["std", "test_accuracy"]) == (same, 0.0)
    assert "e-17" not in sweep_document("cv", "text", table, fold_spread(table))
    spread = fold_spread(table).set_index("metric").loc["final_val_loss"]
    assert spread["std"] == pytest.approx(1.0)  # values apart: the sample std (n - 1) as before


def test_a_fold_sweep_ranked_by_final_train_loss_takes_each_models_train_loss_over_the_folds():
    """``metric: final_train_loss`` over folds where early stopping kept an earlier step's model: the setting
    is chosen by the mean of the models' train losses (``model_train_loss``), as a sweep without folds ranks
    its runs and as final_val_loss is the model's. Was: by the mean of the last steps' train losses, so lr 0.1
    (last steps 1.0, its models 3.0) was recommended over lr 0.01 (2.0, its models the last steps')."""
    early = {"steps": 60, "early_stopping": {"model_from_step": 20}, "stopped_by": "early stopping"}
    summaries = {
        "g-01": {"final_train_loss": 1.0, "model_train_loss": 3.0, "final_val_loss": 2.5, **early},
        "g-02": {"final_train_loss": 1.0, "model_train_loss": 3.2, "final_val_loss": 2.6, **early},
        "g-03": {"final_train_loss": 2.0, "model_train_loss": 2.0, "final_val_loss": 2.7, "steps": 60},
        "g-04": {"final_train_loss": 2.2, "model_train_loss": 2.2, "final_val_loss": 2.8, "steps": 60},
    }
    overrides = {
        "g-01": {"train.optimizer.lr": 0.1, "train.fold": 0},
        "g-02": {"train.optimizer.lr": 0.1, "train.fold": 1},
        "g-03": {"train.optimizer.lr": 0.01, "train.fold": 0},
        "g-04": {"train.optimizer.lr": 0.01, "train.fold": 1},
    }
    table = comparison_table(summaries, overrides, "final_train_loss")
    assert cv_setting(table, "final_train_loss") == {"train.optimizer.lr": 0.01}
    from fastlm.reporting.sweep_view import best_run, best_setting_runs

    assert best_run(table, "final_train_loss") == "g-03"
    assert best_setting_runs(table, "final_train_loss") == ["g-03", "g-04"]
    metrics = cv_metrics(table, "final_train_loss")
    assert metrics["cv/model_train_loss_mean"] == pytest.approx(2.1)
    text = verdict(table, "final_train_loss", {}, spread=fold_spread(table, "final_train_loss"))
    assert "optimizer.lr 0.01 is best by model_train_loss mean 2.1" in text, text


def test_a_cross_validated_grid_over_a_list_setting_is_compared_and_its_best_setting_named(
    tmp_path, monkeypatch
):
    """A k-fold sweep whose grid sets a list (``train.model.lora.target_modules``: which layers get adapters):
    its folds are grouped by setting as any other's, the mean and spread given per setting, the best setting
    logged and written to train. Was: every fold trained, then ``TypeError: unhashable type: 'list'`` from
    pandas' groupby, a traceback (and again on every rerun, the runs kept)."""

    def training(tokenized, fingerprint, tokenizer, params, split_params, run_name, tracker, choices_dir):
        wide = len(params["model"]["lora"]["target_modules"]) > 1  # more adapters: a lower loss
        history = pd.DataFrame({"step": [1, 2], "loss": [3.0, 2.0], "elapsed_s": [0.1, 0.2]})
        loss = 2.0 + params["fold"] - wide
        evaluation = pd.DataFrame({"step": [2], "val_loss": [loss]})
        return {"model": None}, history, evaluation, {"final_val_loss": loss, "wall_time_s": 1.0, "steps": 2}

    monkeypatch.setattr(nodes, "train_model", training)
    modules = [["q_proj"], ["q_proj", "v_proj"]]
    sweep = tmp_path / "grid.yml"
    sweep.write_text(
        yaml.safe_dump({"name": "g", "folds": "auto", "grid": {"train.model.lora.target_modules": modules}})
    )
    tracker = _Tracker()
    fingerprint = {"fingerprint": "f", "params": {"folds": 2}}
    table, _, document, folds, best = nodes.run_sweep(
        None, fingerprint, TOKENIZER, None, {}, {}, {}, str(sweep), SweepRuns(tmp_path / "s"), tracker
    )
    assert tracker.children == ["g-01", "g-02", "g-03", "g-04"]
    assert tracker.params == {"cv/train.model.lora.target_modules": ["q_proj", "v_proj"]}
    assert tracker.metrics[-1]["cv/final_val_loss_mean"] == pytest.approx(1.5)
    assert yaml.safe_load(best)["run"]["params"]["train"] == {
        "model": {"lora": {"target_modules": modules[1]}}
    }
    means = folds[folds["row"] == "mean"]
    assert means["train.model.lora.target_modules"].tolist() == modules
    assert means["final_val_loss"].tolist() == pytest.approx([2.5, 1.5])
    assert "Over 2 folds: model.lora.target_modules ['q_proj', 'v_proj'] is best" in str(document)
