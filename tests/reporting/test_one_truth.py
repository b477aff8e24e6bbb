"""The report tells one story: one throughput figure everywhere, a run comparison of values that really
differ, readable cells (wrapped, real line breaks, decoded tokens), diagnosis lines naming what they measure,
and a summary that says what was trained on what data."""

from __future__ import annotations

import math

import pandas as pd

from fastlm.engine.observe.rates import timed_rate
from fastlm.reporting.comparison import compare_runs
from fastlm.reporting.diagnosis import diagnose, epoch_eta
from fastlm.reporting.report_document import readable_token
from fastlm.reporting.summaries import efficiency_summary
from tests.support.reporting import SUMMARY, make_history, report_document

HISTORY = make_history(
    3, step=[1, 10, 11], real_tokens_per_s=[100.0, 1000.0, 4000.0], step_time_s=[2.0, 0.5, 0.5]
)
SPEED = (1000.0 * 9 * 0.5 + 4000.0 * 1 * 0.5) / (9 * 0.5 + 1 * 0.5)  # total real tokens over total time


def runs_frame(current_speed: float) -> pd.DataFrame:
    start = pd.to_datetime(["2026-01-02 10:00", "2026-01-01 10:00", "2025-12-31 10:00"], utc=True)
    return pd.DataFrame(
        {
            "run_id": ["a" * 32, "b" * 32, "c" * 32],
            "tags.mlflow.runName": ["new", "old", "older"],
            "start_time": start,
            "end_time": start + pd.Timedelta(seconds=60),
            "status": "FINISHED",
            # the last, partial window: not the speed
            "metrics.train/real_tokens_per_s": [123.0, 456.0, 789.0],
            "metrics.real_tokens_per_s": [current_speed, 900.0, 800.0],
            "params.train.seed": ["0", "0", "0"],
            "params.train.batching.mode": ["packed", "dynamic", "packed"],
            "params.report.prompts": ['["a", "b"]', None, None],  # a report-only key, from one run
            "params.train.model.lora.target_modules": ['["q_proj", "v_proj"]', '["q_proj"]', '["q_proj"]'],
            "params.train.model.name_or_path": [None, None, None],
        }
    )


def test_one_throughput_figure_over_the_timed_steps_everywhere():
    assert math.isclose(timed_rate(HISTORY.to_dict("records")), SPEED)
    efficiency = efficiency_summary(SUMMARY, HISTORY)
    assert math.isclose(efficiency["real_tokens_per_s"].iloc[0], SPEED)
    assert math.isclose(epoch_eta({**SUMMARY, "train_tokens": 10_000}, HISTORY)["real_tokens_per_s"], SPEED)
    compute = [f for f in diagnose(SUMMARY, HISTORY) if f.kind == "compute-bound"][0]
    assert f"{SPEED:,.0f} real tokens/s" in compute.figure
    table = compare_runs(runs_frame(SPEED), current_run_id="a" * 32)
    assert math.isclose(table["real_tokens_per_s"].iloc[0], SPEED)


def test_run_comparison_shows_values_that_differ_and_marks_this_run():
    table = compare_runs(runs_frame(SPEED), current_run_id="a" * 32)
    assert (
        "train.seed" not in table
        and "report.prompts" not in table
        and "train.model.name_or_path" not in table
    )
    assert list(table["train.batching.mode"]) == ["packed", "dynamic", "packed"]
    assert list(table["train.model.lora.target_modules"]) == ["q_proj, v_proj", "q_proj", "q_proj"]
    assert list(table["this run"]) == ["◀", "", ""]


def test_run_comparison_leaves_out_the_texts_saying_why_a_runtime_setting_was_chosen():
    """``runtime.precision_choice`` and ``runtime.compile_choice`` are sentences with the timings measured
    (``auto, measured on the first micro-batch: eager 0.031 s ...``): they differ in every run, as wide
    columns of "parameters that differ". The choices themselves (``runtime.precision``, ``runtime.compile``)
    are compared. Was: both sentences shown for every pair of trainings."""
    why = [f"auto, measured on the first micro-batch: eager 0.0{i}1 s, compiled 0.0{i}2 s" for i in range(3)]
    runs = runs_frame(SPEED).assign(
        **{
            "params.runtime.precision_choice": why,
            "params.runtime.compile_choice": why,
            "params.runtime.float8_choice": why,
            "params.fused_linear_choice": why,
            "params.runtime.compile": ["True", "False", "False"],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    assert not [column for column in table if column.endswith("_choice")], list(table)
    assert list(table["runtime.compile"]) == ["True", "False", "False"]


def test_run_comparison_shows_a_setting_one_run_left_unset_and_another_set():
    """MLflow logs no unset (null) parameter: a run of ``train.max_minutes: 30`` beside one without a time
    budget, a pretrained ``train.model.name_or_path`` beside a model from scratch, ``split.max_samples: 2000``
    beside the whole corpus differ, where the run lacking the key logged its group (other ``train.*`` /
    ``split.*`` keys). Such columns were left out: the one run holding the key was taken for the only run
    that had it. A run that logged no key of the group (a report-only key, a train-only run) still differs
    in nothing there."""
    runs = runs_frame(SPEED).assign(
        **{
            "params.train.max_minutes": ["30", None, None],
            "params.train.model.name_or_path": ["models/x", None, None],
            "params.split.max_length": ["48", "48", None],  # the oldest run logged no split.* key
            "params.split.max_samples": [None, "2000", None],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    assert table["train.max_minutes"].tolist()[0] == "30" and table["train.max_minutes"].iloc[1:].isna().all()
    assert table["train.model.name_or_path"].iloc[0] == "models/x"
    assert table["train.model.name_or_path"].iloc[1:].isna().all()
    assert table["split.max_samples"].iloc[1] == "2000"
    assert table["split.max_samples"].iloc[[0, 2]].isna().all()
    assert "report.prompts" not in table and "train.seed" not in table and "split.max_length" not in table


def test_the_reported_run_stays_in_its_comparison_when_newer_runs_fill_the_limit():
    """A report of an earlier training (``--params run_name=<it>``) with ``report.compare_runs`` newer
    training runs in the experiment: the table kept the newest alone, without the reported run, nothing
    marked ◀ and the ``data`` column judged against another run. It holds the reported run and the newest
    others, ``compare_runs`` rows in all."""
    runs = runs_frame(SPEED).assign(**{"params.data.fingerprint": ["new-data", "new-data", "old-data"]})
    table = compare_runs(runs, limit=2, current_run_id="c" * 32)
    assert list(table["run_name"]) == ["new", "older"]
    assert list(table["this run"]) == ["", "◀"]
    assert list(table["data"]) == ["other", "same"]
    assert list(compare_runs(runs, limit=2, current_run_id="a" * 32)["run_name"]) == ["new", "old"]


def test_run_comparison_wall_time_is_the_trainings_and_other_data_shows():
    """``wall_time_s`` is what the run logged as its training's wall time; a run from before that has none
    (its MLflow span held the split and the report too). A run name given as a parameter does not blank the
    names of runs without it (a sweep's child runs), and the data fingerprint shows where runs differ."""
    runs = runs_frame(SPEED).assign(
        **{
            "metrics.wall_time_s": [12.5, 30.0, math.nan],
            # the returned model's validation loss (early stopping: the best step's, not the last evaluation)
            "metrics.eval/val_loss": [3.0, 2.0, 4.0],
            "metrics.final_val_loss": [2.5, math.nan, math.nan],
            "params.run_name": ["mine", None, None],
            "params.data.fingerprint": ["0123456789ab", "0123456789ab", "ba9876543210"],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    assert table["wall_time_s"].iloc[:2].tolist() == [12.5, 30.0] and math.isnan(table["wall_time_s"].iloc[2])
    assert list(table["run_name"]) == ["new", "old", "older"]
    assert list(table["final_val_loss"]) == [2.5, 2.0, 4.0]  # runs from before: their last evaluation
    assert list(table["data.fingerprint"]) == ["0123456789ab", "0123456789ab", "ba9876543210"]


def test_run_comparison_says_which_runs_did_not_finish():
    """A run stopped part way (Ctrl-C, a pre-emption, an error) and the run that resumed it are two MLflow
    runs of one name: the stopped one's row had a loss and no wall time, like a finished short run. Where a
    run did not finish, a ``status`` column says so for every row (the report's own run, still open, is
    ``running``); where all finished, there is none."""
    assert "status" not in compare_runs(runs_frame(SPEED), current_run_id="a" * 32)
    runs = runs_frame(SPEED).assign(
        status=["RUNNING", "FAILED", "KILLED"], **{"tags.mlflow.runName": ["mine", "mine", "older"]}
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    assert list(table["status"]) == ["running", "failed", "killed"]
    assert list(table.columns[:4]) == ["this run", "run_id", "run_name", "status"]
    running = runs_frame(SPEED).assign(status=["RUNNING", "FINISHED", "FINISHED"])
    assert "status" not in compare_runs(running, current_run_id="a" * 32)  # the report's own open run


def test_a_resumed_run_beside_runs_started_fresh_shows_the_step_it_went_on_from():
    """A training run again by name (a run of 3 steps, then ``train.max_steps=6``) is a second MLflow run of
    that name; its ``resumed_from_step`` was shown only where two runs had other values of it, so one
    resumed run among fresh ones (the usual case) stood as a second row of that name with nothing to say it
    went on from the first. The column shows where any run resumed, blank for the runs started fresh."""
    runs = runs_frame(SPEED).assign(
        **{"tags.mlflow.runName": ["r1", "r1", "older"], "params.resumed_from_step": ["3", None, None]}
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    assert table["resumed_from_step"].iloc[0] == "3", list(table.columns)
    assert table["resumed_from_step"].iloc[1:].isna().all()  # started fresh: blank
    fresh = runs_frame(SPEED).assign(**{"params.resumed_from_step": [None, None, None]})
    assert "resumed_from_step" not in compare_runs(fresh).columns


def test_rouge_scored_under_other_settings_says_so_in_the_comparison():
    """ROUGE of one run generated greedily and of another with beam search (or tokenized for ROUGE another
    way: report.references.rouge_tokenizer) stood side by side as one figure. The settings each run's ROUGE
    was scored under (tags the report sets beside the figures) are columns where they differ."""
    runs = runs_frame(SPEED).assign(
        **{
            "metrics.test_rouge1": [0.31, 0.42, 0.30],
            "tags.test_rouge_decoding": [
                "greedy, max_new_tokens=64",
                "beam search, num_beams=4, max_new_tokens=64",
                None,
            ],
            "tags.test_rouge_tokenizer": ["syllable", "syllable", None],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    columns = list(table.columns)
    assert columns.index("test_rouge_decoding") == columns.index("test_rouge1") + 1, columns
    assert table["test_rouge_decoding"].iloc[1].startswith("beam search")
    assert "test_rouge_tokenizer" not in columns  # the same in every run that has it
    same = runs.assign(**{"tags.test_rouge_decoding": "greedy, max_new_tokens=64"})
    assert "test_rouge_decoding" not in compare_runs(same).columns


def test_a_top_k_figure_is_logged_under_its_own_k():
    from fastlm.reporting.comparison import test_metric_values

    logged = test_metric_values({"loss": 2.0, "accuracy": 0.3, "top3_accuracy": 0.5, "seconds": 1.0})
    assert logged == {"test_loss": 2.0, "test_accuracy": 0.3, "test_top3_accuracy": 0.5}


def test_report_cells_wrap_show_line_breaks_and_decoded_tokens():
    long_prediction = "가" * 400
    generations = pd.DataFrame(
        {
            "prompt": ["대화:\n안녕\n\n### Response:\n"],
            "setting": ["greedy"],
            "settings": [""],
            "output": [long_prediction],
        }
    )
    pairs = pd.DataFrame(
        {
            "target_id": [5],
            "predicted_id": [6],
            "target": ["ĠìĥĢëĬĶëį°"],
            "predicted": ["Ġthe"],
            "target_text": [" 새는데"],
            "predicted_text": [" the"],
            "count": [3],
            "share_of_errors": [0.5],
        }
    )
    html, markdown = document(generations=generations, error_pairs=pairs)
    assert "ĠìĥĢëĬĶëį°" not in html and "␣새는데" in html
    assert "overflow-wrap: anywhere" in html and "white-space: pre-wrap" in html
    assert "대화:\n안녕" in html and "\\n" not in html
    assert readable_token(" a ") == "␣a␣"


def test_diagnosis_lines_name_what_they_measure_and_the_summary_says_what_was_trained():
    summary = {
        **SUMMARY,
        "lora": True,
        "base_model": "models/qwen3-4b",
        "trainable_parameters": 1_000,
        "total_parameters": 100_000,
    }
    split_report = {
        "raw_rows": 120,
        "kept_rows": 100,
        "dropped": {"duplicate": 15, "empty": 5, "total": 20},
        "splits": {"train": {"rows": 90}, "validation": {"rows": 5}, "test": {"rows": 5}},
    }
    html, markdown = document(summary=summary, split_report=split_report)
    assert "padding efficiency 95 %" in markdown and "padding-bound: 95" not in markdown
    assert "LoRA on models/qwen3-4b" in markdown and "1,000 trainable of 100,000 parameters" in markdown
    assert "train 90, validation 5, test 5" in markdown and "duplicate 15" in markdown
    # a fold run (train.fold): trained on the other folds of train + validation, validated on its fold
    fold = {"fold": 1, "folds": 3, "train_samples": 1308, "validation_samples": 609}
    _, markdown = document(summary={**summary, **fold}, split_report=split_report)
    assert (
        "Fold: train.fold 1 of 3 (split.folds): trained on 1,308 rows of train + validation outside fold 1, "
        "validated on its 609 rows; the test split is the split's." in markdown
    )
    # the adapter as trained (train_summary.json's ``adapter``: lora.adapter_description)
    _, markdown = document(summary={**summary, "adapter": "DoRA (r 16, alpha 32, B at 16x the rate)"})
    assert "Model: DoRA (r 16, alpha 32, B at 16x the rate) on models/qwen3-4b" in markdown


def document(**parts) -> tuple[str, str]:
    return report_document(HISTORY, **parts)


def test_run_comparison_says_when_test_figures_cover_other_numbers_of_samples():
    """A report capped by ``report.eval_max_batches`` (or ``report.references.max_samples``) scores part of
    the test split: its test_loss beside a whole-split one compares figures over other samples. The counts
    are logged with the figures, and the comparison shows them where they differ (not where they agree)."""
    from fastlm.reporting.comparison import test_metric_values

    logged = test_metric_values({"loss": 2.0, "samples": 27, "rouge1": 0.4, "rouge_samples": 41})
    assert logged["test_samples"] == 27.0 and logged["test_rouge_samples"] == 41.0
    runs = runs_frame(SPEED).assign(
        **{
            "metrics.test_loss": [2.0, 2.5, 2.4],
            "metrics.test_samples": [27.0, 83.0, 83.0],
            "metrics.test_rouge1": [0.4, 0.3, math.nan],
            "metrics.test_rouge_samples": [41.0, 41.0, math.nan],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    assert table["test_samples"].tolist() == [27.0, 83.0, 83.0]
    assert "test_rouge_samples" not in table  # the same 41 wherever scored
    agreeing = compare_runs(runs.assign(**{"metrics.test_samples": 83.0}), current_run_id="a" * 32)
    assert "test_samples" not in agreeing


def test_run_comparison_names_a_label_smoothed_train_loss_and_an_early_stopped_runs_model_step():
    """final_train_loss (the last step's) stood bare beside final_val_loss (the returned model's step's): a
    label-smoothed train loss read like the others' plain ones, and an early-stopped run's pair was two
    steps' figures. Now a ``label_smoothing`` column follows final_train_loss where any run smoothed it, and
    ``model_step`` / ``last_step`` follow final_val_loss where a run's model is not its last step's."""
    runs = runs_frame(SPEED).assign(
        **{
            "metrics.train/loss": [3.1, 2.9, 3.0],
            "metrics.final_val_loss": [3.2, 3.0, 3.1],
            "params.train.loss.label_smoothing": ["0.1", "0.0", None],
            "metrics.model_step": [60.0, 70.0, math.nan],
            "metrics.steps": [70.0, 70.0, math.nan],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    columns = list(table.columns)
    at = columns.index("final_train_loss")
    assert columns[at + 1] == "label_smoothing" and columns[at + 2] == "final_val_loss"
    assert table["label_smoothing"].tolist()[:2] == [0.1, 0.0] and math.isnan(table["label_smoothing"][2])
    assert "train.loss.label_smoothing" not in columns  # once, beside the loss it smooths
    assert columns[at + 3 : at + 5] == ["model_step", "last_step"]
    assert table["model_step"].tolist()[:2] == [60.0, 70.0] and table["last_step"].tolist()[:2] == [
        70.0,
        70.0,
    ]
    plain = runs.drop(columns=["params.train.loss.label_smoothing"]).assign(**{"metrics.model_step": 70.0})
    assert not {"label_smoothing", "model_step", "last_step"} & set(compare_runs(plain).columns)


def test_a_run_stopped_before_its_planned_steps_shows_the_steps_it_trained():
    """A run stopped by its time budget (``train.max_minutes``) at step 4 of its 300 stood in the comparison
    as ``train.max_steps 300`` beside full runs of 6 steps, its losses read as a 300-step run's; the step it
    reached was nowhere. Now ``last_step`` follows final_val_loss wherever a run trained fewer steps than it
    planned (``planned_steps``, logged by the train node; else its ``train.max_steps``)."""
    runs = runs_frame(SPEED).assign(
        **{
            "metrics.final_val_loss": [3.2, 3.0, 3.1],
            "params.train.max_steps": ["300", "6", "6"],
            "metrics.model_step": [4.0, 6.0, 6.0],
            "metrics.steps": [4.0, 6.0, 6.0],
        }
    )
    table = compare_runs(runs, current_run_id="a" * 32)
    columns = list(table.columns)
    assert columns[columns.index("final_val_loss") + 1] == "last_step", columns
    assert table["last_step"].tolist() == [4.0, 6.0, 6.0] and "model_step" not in columns
    assert table["train.max_steps"].tolist() == ["300", "6", "6"]
    # an epoch-based run (no train.max_steps) stopped short: its planned steps, logged as a metric, tell
    epochs = runs.drop(columns=["params.train.max_steps"]).assign(
        **{"metrics.planned_steps": [61.0, 6.0, 6.0]}
    )
    assert compare_runs(epochs)["last_step"].tolist() == [4.0, 6.0, 6.0]
    # every run trained its planned steps: no column
    whole = runs.assign(**{"metrics.steps": [300.0, 6.0, 6.0], "metrics.model_step": [300.0, 6.0, 6.0]})
    assert "last_step" not in compare_runs(whole).columns


def test_a_finished_training_logs_its_planned_steps_as_a_run_metric(monkeypatch):
    """The steps a run planned (``train.max_steps``, or its epochs' steps) reach its MLflow run beside the
    steps it trained, where the run comparison reads them."""
    from fastlm.tracking import RunTracker

    logged = {}
    tracker = RunTracker()
    monkeypatch.setattr(tracker.metrics, "log_params", lambda params: None)
    monkeypatch.setattr(tracker.metrics, "log_run_metrics", logged.update)
    tracker.training_finished({"steps": 4, "planned_steps": 300, "real_tokens_per_s": 1.0, "runtime": {}})
    assert logged["steps"] == 4 and logged["planned_steps"] == 300


def test_the_run_comparison_keeps_its_columns_in_one_order_whatever_order_mlflow_gives():
    """``mlflow.search_runs`` orders the parameter columns as a set of their names iterates, which changes
    with each process (string hashing): the same runs reported twice gave run_comparison.csv and the report's
    table their parameter columns in another order each time. They are in their names' order."""
    runs = runs_frame(SPEED).assign(
        **{"params.split.max_length": ["48", "64", "48"], "params.train.optimizer.lr": ["0.1", "0.2", "0.1"]}
    )
    tables = [
        compare_runs(runs[[*runs.columns[:6], *order]], current_run_id="a" * 32)
        for order in (list(runs.columns[6:]), list(reversed(runs.columns[6:])))
    ]
    pd.testing.assert_frame_equal(tables[0], tables[1])
    shown = [column for column in tables[0].columns if column.startswith(("split.", "train."))]
    assert shown == sorted(shown) and len(shown) == 4, shown


def test_runs_on_other_tokenized_data_are_marked_and_said_not_to_compare():
    """Per-token losses of runs with another tokenizer or other data do not compare: the rows whose data
    fingerprint is not the reported run's are marked (``data``: other) and the comparison's text says so.
    Was: only a data.fingerprint column differed, the losses side by side."""
    runs = runs_frame(SPEED).assign(**{"params.data.fingerprint": ["f" * 12, "e" * 12, "f" * 12]})
    runs["metrics.test_loss"] = [2.0, 5.5, 2.1]
    table = compare_runs(runs, current_run_id="a" * 32)
    assert table["data"].tolist() == ["same", "other", "same"]
    assert table["test_loss"].tolist() == [2.0, 5.5, 2.1]
    _, text = report_document(HISTORY, runs=table)
    assert "1 run (data: other) trained and was evaluated on other tokenized data than this run" in text
    assert "its losses do not compare with this run's" in text
    # an older run without a fingerprint is not judged; runs all on the same data get no column
    unknown = compare_runs(
        runs.assign(**{"params.data.fingerprint": ["f" * 12, None, "f" * 12]}), current_run_id="a" * 32
    )
    assert "data" not in unknown and "other tokenized data" not in report_document(HISTORY, runs=unknown)[1]
    # the reported run logged no fingerprint (an older training): the runs are judged against the newest
    # that did, and the text names that run, not "this run"
    unmarked = compare_runs(
        runs.assign(**{"params.data.fingerprint": [None, "e" * 12, "f" * 12]}), current_run_id="a" * 32
    )
    assert unmarked["data"].tolist() == ["", "same", "other"], unmarked["data"].tolist()
    text = report_document(HISTORY, runs=unmarked)[1]
    assert "other tokenized data than the newest run that recorded its data" in text, text
    assert "than this run" not in text
    assert "data" not in compare_runs(runs_frame(SPEED), current_run_id="a" * 32)


def test_a_run_record_holding_a_metric_that_is_no_number_is_shown_blank_with_one_warning(caplog):
    """A run record that loads but holds bad values (a metric that reads as text, a parameter missing) in the
    run comparison: that figure blank and one warning naming the run and the metric, never the text shown as
    a figure or a traceback."""
    frame = runs_frame(SPEED)
    frame["metrics.real_tokens_per_s"] = frame["metrics.real_tokens_per_s"].astype(object)
    frame.loc[1, "metrics.real_tokens_per_s"] = "fast"
    frame["metrics.test_loss"] = [1.25, "oops", 2.5]
    frame.loc[2, "params.train.batching.mode"] = None
    with caplog.at_level("WARNING", logger="fastlm.reporting.comparison"):
        table = compare_runs(frame, current_run_id="a" * 32)
    assert list(table["run_name"]) == ["new", "old", "older"]
    assert math.isclose(table["real_tokens_per_s"].iloc[0], SPEED)
    # the unreadable throughput is as a run without it: its last window's figure stands in, as for older runs
    assert table["real_tokens_per_s"].iloc[1] == 456.0 and math.isnan(table["test_loss"].iloc[1])
    assert table["test_loss"].iloc[2] == 2.5
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "old" in warnings[0] and "real_tokens_per_s" in warnings[0] and "test_loss" in warnings[0]


def test_a_fold_run_on_the_same_test_split_is_said_comparable_on_test_figures_alone():
    """A k-fold run (split.folds: part of the data fingerprint) beside a run on the same texts split without
    folds was marked ``data: other`` and its test loss said not to compare, although both were evaluated on
    the same test rows. Where the test split's identity (data.test) is the reported run's, it is ``other
    train, same test``: its test figures compare, its train and validation losses do not. Runs on really other
    data (another data.test) and older runs that logged no data.test stay ``other``; two folds of one split
    (train.fold) trained on other rows: ``other train, same test``."""
    runs = pd.concat([runs_frame(SPEED), runs_frame(SPEED).iloc[[1, 2]]], ignore_index=True)
    runs["run_id"] = ["a" * 32, "b" * 32, "c" * 32, "d" * 32, "e" * 32]
    runs["start_time"] = pd.to_datetime([f"2026-01-0{day} 10:00" for day in (9, 8, 7, 6, 5)], utc=True)
    runs["params.data.fingerprint"] = ["f" * 12, "e" * 12, "d" * 12, "c" * 12, "e" * 12]
    runs["params.data.test"] = ["1" * 12, "1" * 12, "2" * 12, None, "1" * 12]
    runs["params.train.fold"] = [None, "0", None, None, "1"]
    runs["metrics.test_loss"] = [2.0, 2.1, 5.5, 4.0, 2.2]
    table = compare_runs(runs, current_run_id="a" * 32)
    assert table["data"].tolist() == [
        "same",
        *["other train, same test", "other", "other"],
        "other train, same test",
    ]
    _, text = report_document(HISTORY, runs=table)
    assert "2 runs (data: other train, same test) trained on other rows than this run" in text
    assert "their test figures compare with this run's" in text
    assert "2 runs (data: other) trained and were evaluated on other tokenized data than this run" in text
    # reported from a fold run: the other fold is other training data on the same test split too
    folds = compare_runs(runs, current_run_id="b" * 32)
    assert folds["data"].tolist() == [
        "other train, same test",
        "same",
        "other",
        "other",
        "other train, same test",
    ]


def test_run_comparison_takes_the_summarys_final_train_loss_where_the_run_logged_no_train_step():
    """A finished run entered again (``resume: auto``, nothing to train: a sweep's second pass) logs no
    ``train/loss``: its comparison row showed "—" though its summary held the loss. The train node logs the
    summary's ``final_train_loss`` as a run metric; the comparison takes it, else the last ``train/loss``."""
    runs = runs_frame(SPEED)
    runs["metrics.train/loss"] = [None, 2.5, 2.7]
    runs["metrics.final_train_loss"] = [3.25, 2.5, None]  # the oldest: logged before it was
    table = compare_runs(runs, current_run_id="a" * 32)
    assert list(table["final_train_loss"]) == [3.25, 2.5, 2.7]


def test_a_finished_training_logs_its_final_train_loss_as_a_run_metric(monkeypatch):
    from fastlm.tracking import RunTracker

    logged = {}
    tracker = RunTracker()
    monkeypatch.setattr(tracker.metrics, "log_params", lambda params: None)
    monkeypatch.setattr(tracker.metrics, "log_run_metrics", logged.update)
    tracker.training_finished(
        {"runtime": {}, "real_tokens_per_s": 10.0, "final_train_loss": 5.024, "steps": 8}
    )
    assert logged["final_train_loss"] == 5.024


def test_the_mfu_is_the_runs_over_its_timed_steps_as_its_throughput():
    """A window's MFU is flops_per_token x its real tokens/s / the device's peak: the run's MFU is that of the
    run's throughput (total over time, the timed windows weighted by their duration), the figure the
    efficiency table and the diagnosis show beside it. Was: the plain mean of the windows' MFUs, which
    weighs a one-step window as a nine-step one (here 0.25 where the throughput gives 0.13)."""
    per_token = 1e-4  # MFU per real token/s
    history = HISTORY.assign(mfu=HISTORY["real_tokens_per_s"] * per_token)
    expected = SPEED * per_token
    efficiency = efficiency_summary(SUMMARY, history)
    assert math.isclose(efficiency["mfu"].iloc[0], expected, rel_tol=1e-9)
    cuda = {**SUMMARY, "runtime": {"device": "cuda:0", "precision": "bf16"}, "data_wait_share": 0.01}
    compute = [f for f in diagnose(cuda, history) if f.kind == "compute-bound"][0]
    assert f"MFU {expected * 100:.0f} %" in compute.figure
    host = [f for f in diagnose(cuda, history) if f.kind == "host-sync-bound"][0]
    assert f"MFU {expected * 100:.0f} %" in host.figure


def test_wrong_predictions_of_byte_pieces_that_decode_to_no_character_are_told_apart_by_their_ids():
    """A byte-level BPE piece of a Korean syllable (one byte of its three) decodes to U+FFFD alone: three
    such targets were three rows "� → ." of other counts, the same row to a reader. Each undecodable piece
    is shown with its token id."""
    from fastlm.reporting.report_document import error_pairs_table

    pairs = pd.DataFrame(
        {
            "target_id": [121, 260, 5],
            "predicted_id": [14, 14, 14],
            "target": ["¼", "Ġë", "Ġthe"],
            "predicted": [".", ".", "."],
            "target_text": ["\ufffd", " \ufffd", " the"],
            "predicted_text": [".", ".", "."],
            "count": [7, 6, 5],
            "share_of_errors": [0.4, 0.3, 0.2],
        }
    )
    table = error_pairs_table(pairs)
    assert table["target"].tolist() == ["� (id 121)", "␣� (id 260)", "␣the"]
    assert table["predicted"].tolist() == [".", ".", "."]
    assert table["count"].tolist() == [7, 6, 5]


def test_run_comparison_start_times_say_their_time_zone():
    """MLflow gives each run's start as a UTC time: the comparison's start_time says UTC, where the log lines
    beside it are in the machine's local time (a run started at 21:17 in Seoul was shown as 12:17)."""
    table = compare_runs(runs_frame(SPEED), current_run_id="a" * 32)
    assert table["start_time"].tolist() == [
        "2026-01-02 10:00 UTC",
        "2026-01-01 10:00 UTC",
        "2025-12-31 10:00 UTC",
    ]
    seoul = runs_frame(SPEED).assign(start_time=lambda f: f["start_time"].dt.tz_convert("Asia/Seoul"))
    assert compare_runs(seoul, current_run_id="a" * 32)["start_time"].iloc[0] == "2026-01-02 10:00 UTC"


def test_report_tables_read_back_keep_tokens_and_texts_that_pandas_would_read_as_missing(tmp_path):
    """error_pairs.csv, worst_samples.csv and sample_generations.csv are written, then read back by
    write_report: a token or text such as ``None``, ``null``, ``NA`` or ``nan`` (a code corpus's ``=None``,
    JSON's ``null``) stays that text; only an empty cell is missing. Was: pandas' default missing markers
    read them as NaN, and the report showed an empty cell (a wrong prediction of no token) or —."""
    from fastlm.reporting.report_document import error_pairs_table
    from tests.support.project import catalog_dataset

    pairs = pd.DataFrame(
        {
            "target_id": [7, 8],
            "predicted_id": [9, 9],
            "target": ["None", "null"],
            "predicted": [",", ","],
            "target_text": ["None", "null"],
            "predicted_text": [",", ","],
            "count": [3, 2],
            "share_of_errors": [0.6, 0.4],
        }
    )
    catalog_dataset("error_pairs", tmp_path / "error_pairs.csv").save(pairs)
    back = catalog_dataset("error_pairs", tmp_path / "error_pairs.csv").load()
    assert error_pairs_table(back)["target"].tolist() == ["None", "null"]
    assert back["share_of_errors"].dtype.kind == "f"
    generations = pd.DataFrame(
        {"prompt": ["NA", ""], "setting": ["greedy"] * 2, "settings": [None, None], "output": ["nan", "x"]}
    )
    catalog_dataset("sample_generations", tmp_path / "g.csv").save(generations)
    back = catalog_dataset("sample_generations", tmp_path / "g.csv").load()
    assert (
        back["prompt"].iloc[0] == "NA" and back["output"].iloc[0] == "nan" and pd.isna(back["prompt"].iloc[1])
    )
    worst = pd.DataFrame({"sample": [1], "loss": [float("nan")], "length": [2], "text": ["null"]})
    catalog_dataset("worst_samples", tmp_path / "w.csv").save(worst)
    back = catalog_dataset("worst_samples", tmp_path / "w.csv").load()
    assert back["text"].iloc[0] == "null" and back["loss"].dtype.kind == "f"
