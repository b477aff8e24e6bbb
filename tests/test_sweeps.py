"""Issue 18: the sweep file (grid or list, train.* only, one line on bad input), overrides, and the
verdict."""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fastlm.engine.checkpoint.storage import StorageError
from fastlm.errors import ConfigError
from fastlm.reporting.sweep_view import comparison_table, verdict
from fastlm.sweeps import apply_overrides, finished_summary, load_sweep, save_finished
from tests.support.disk_full import write_stops_part_way


def _file(tmp_path, spec) -> str:
    path = tmp_path / "sweep.yml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def test_grid_and_list_plans(tmp_path):
    grid = load_sweep(
        _file(tmp_path, {"name": "g", "grid": {"train.optimizer.lr": [1, 2], "train.seed": [0, 1]}})
    )
    assert grid.plan() == [
        {"train.optimizer.lr": 1, "train.seed": 0},
        {"train.optimizer.lr": 1, "train.seed": 1},
        {"train.optimizer.lr": 2, "train.seed": 0},
        {"train.optimizer.lr": 2, "train.seed": 1},
    ]
    assert grid.run_names() == ["g-01", "g-02", "g-03", "g-04"]
    listed = load_sweep(
        _file(tmp_path, {"name": "l", "runs": [{"train.seed": 3}, {"train.optimizer.lr": 0.1}]})
    )
    assert listed.plan() == [{"train.seed": 3}, {"train.optimizer.lr": 0.1}]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"name": "s", "grid": {"split.max_length": [32, 64]}}, "only train.* parameters can be swept"),
        ({"name": "s"}, "give either grid"),
        ({"name": "s", "grid": {"train.seed": [1]}, "runs": [{"train.seed": 1}]}, "give either grid"),
        ({"name": "s", "grid": {"train.seed": [1]}, "metric": "accuracy"}, "metric must be one of"),
        ({"name": "a b", "grid": {"train.seed": [1]}}, "not a safe folder name"),
        # the budget set for every run would silently replace the swept values (and the table show them)
        (
            {"name": "s", "max_steps": 2, "grid": {"train.max_steps": [1, 3]}},
            "train.max_steps is swept and max_steps sets it for every run",
        ),
        (
            {"name": "s", "max_minutes": 1, "runs": [{"train.max_minutes": 2}]},
            "train.max_minutes is swept and max_minutes sets it for every run",
        ),
        # each run's train loss smoothed by its own label_smoothing: no ranking between them
        (
            {
                "name": "s",
                "metric": "final_train_loss",
                "runs": [{"train.loss.label_smoothing": 0.0}, {"train.loss.label_smoothing": 0.5}],
            },
            "final_train_loss is smoothed by train.loss.label_smoothing",
        ),
    ],
)
def test_bad_sweep_files_are_one_line(tmp_path, spec, expected):
    with pytest.raises(ConfigError, match=expected) as raised:
        load_sweep(_file(tmp_path, spec))
    assert "\n" not in str(raised.value) and "Fix:" in str(raised.value)
    with pytest.raises(ConfigError, match="is not a sweep file"):
        load_sweep(str(tmp_path / "missing.yml"))


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        (
            "name: s\ngrid:\n  train.optimizer.lr: [0.1, 0.2]\n  train.optimizer.lr: [0.3]\n",
            4,
            "train.optimizer.lr",
        ),
        ("name: a\nruns:\n  - {train.seed: 1}\nname: b\n", 4, "name"),
        ("name: s\nruns:\n  - {train.seed: 1, train.seed: 2}\n", 3, "train.seed"),
    ],
    ids=["grid_key", "top_level", "run_setting"],
)
def test_a_key_written_twice_in_a_sweep_file_is_refused_naming_the_file_line_and_key(
    tmp_path, text, line, key
):
    """PyYAML keeps the last value of a key a mapping writes twice: a grid key written twice swept its last
    values alone, a run's setting written twice ran the last, with no word of the others."""
    path = tmp_path / "sweep.yml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as raised:
        load_sweep(str(path))
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message
    assert f"sweep file {path} line {line}" in message and f"{key!r} twice" in message, message


def test_a_sweep_file_reads_numbers_as_the_conf_files_do(tmp_path):
    """``1e-4`` in a sweep file is the number a conf file (Kedro's OmegaConf) and ``--params`` read. Was:
    PyYAML's YAML 1.1 reading, the text '1e-4' (no dot): the child runs logged ``train.optimizer.lr`` 1e-4
    beside the plain runs' 0.0001 in MLflow, the log said ``{'train.optimizer.lr': '1e-4'}``, and a mixed
    list ``[1e-4, 3.0e-4]`` swept a text and a number."""
    from omegaconf import OmegaConf

    text = (
        "name: e\nmax_steps: 1e2\ngrid:\n  train.optimizer.lr: [1e-4, 3.0e-4, 1E-3]\n"
        "  train.optimizer.weight_decay: [0, 1e-2]\n  train.model.name_or_path: [2024-01-01]\n"
    )
    path = tmp_path / "sweep.yml"
    path.write_text(text, encoding="utf-8")
    spec = load_sweep(str(path))
    as_conf = OmegaConf.to_container(OmegaConf.create(text))
    assert spec.grid == as_conf["grid"] and spec.max_steps == 100
    lrs = spec.grid["train.optimizer.lr"]
    assert all(type(value) is float for value in lrs) and lrs == [0.0001, 0.0003, 0.001]
    assert spec.grid["train.model.name_or_path"] == ["2024-01-01"]  # a date stays text, as OmegaConf keeps it


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (
            {"grid": {"train.seed": [0, 1], "train.optimizer.lr": []}},
            "grid key train.optimizer.lr has no values",
        ),
        ({"grid": {}}, "grid has no keys"),
        ({"runs": []}, "runs lists no runs"),
    ],
    ids=["empty_grid_list", "empty_grid", "empty_runs"],
)
def test_a_sweep_that_would_make_no_runs_is_refused_naming_the_file_and_key(tmp_path, plan, expected):
    path = _file(tmp_path, {"name": "s", **plan})
    with pytest.raises(ConfigError, match=expected) as raised:
        load_sweep(path)
    assert path in str(raised.value) and "\n" not in str(raised.value) and "Fix:" in str(raised.value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"name": "s", "grid": {"train.optimizer.lrr": [0.1]}},
            "unknown parameter train.optimizer.lrr (did you mean train.optimizer.lr?)",
        ),
        (
            {"name": "s", "runs": [{"train.seed": 1}, {"train.optimizer.lr": -1}]},
            "parameter train.optimizer.lr = -1",
        ),
        ({"name": "s", "max_steps": 0, "grid": {"train.seed": [1]}}, "parameter max_steps = 0"),
        (
            {"name": "s", "max_step": 3, "grid": {"train.seed": [1]}},
            "unknown parameter max_step (did you mean max_steps?)",
        ),
    ],
    ids=["unknown_train_key", "bad_train_value", "bad_budget", "unknown_sweep_key"],
)
def test_a_bad_key_or_value_of_a_sweep_file_names_the_sweep_file(tmp_path, spec, expected):
    """What the sweep node checks before its first run: a problem the sweep file brings names that file (the
    message named conf/base/parameters_train.yml and --params, where it cannot be fixed)."""
    from fastlm.sweeps import load_sweep_runs

    path = _file(tmp_path, spec)
    with pytest.raises(ConfigError) as raised:
        load_sweep_runs(path, {"optimizer": {"lr": 0.002}})
    message = str(raised.value)
    assert expected in message and f"sweep file {path}" in message and "Fix:" in message, message
    assert "parameters_train.yml" not in message and "--params" not in message, message
    assert "\n" not in message, message


def test_a_bad_base_train_parameter_still_names_the_parameters_file(tmp_path):
    from fastlm.sweeps import load_sweep_runs

    path = _file(tmp_path, {"name": "s", "grid": {"train.seed": [1]}})
    with pytest.raises(ConfigError, match="conf/base/parameters_train.yml") as raised:
        load_sweep_runs(path, {"optimizer": {"lrr": 0.002}})
    assert "unknown parameter train.optimizer.lrr" in str(raised.value) and path not in str(raised.value)
    assert load_sweep_runs(path, {}).plan() == [{"train.seed": 1}]


def test_overrides_and_finished_runs(tmp_path):
    base = {"optimizer": {"lr": 0.002, "beta1": 0.9}, "max_steps": 500}
    params = apply_overrides(base, {"train.optimizer.lr": 0.01, "train.batching.micro_batch_size": 4}, 7)
    assert params == {
        "optimizer": {"lr": 0.01, "beta1": 0.9},
        "batching": {"micro_batch_size": 4},
        "max_steps": 7,
    }
    assert base["optimizer"]["lr"] == 0.002  # a copy
    identity = {"train": params, "data": "abc"}
    save_finished(
        tmp_path / "r",
        {"run_name": "r", "sweep_identity": identity},
        pd.DataFrame({"step": [1]}),
        pd.DataFrame({"step": [1]}),
    )
    assert finished_summary(tmp_path / "r", identity)["run_name"] == "r"
    assert finished_summary(tmp_path / "r", {**identity, "data": "other"}) is None  # re-split: run again
    assert finished_summary(tmp_path / "missing", identity) is None


def test_table_sorted_by_metric_and_verdict_names_best_and_diverged():
    overrides = {
        "a": {"train.optimizer.lr": 0.001},
        "b": {"train.optimizer.lr": 0.1},
        "c": {"train.optimizer.lr": 0.01},
    }
    summaries = {
        "a": {"final_val_loss": 2.0, "wall_time_s": 10.0, "steps": 4},
        "b": {"final_val_loss": float("nan"), "wall_time_s": 5.0, "steps": 4},
        "c": {"final_val_loss": 1.5, "wall_time_s": 20.0, "steps": 4},
    }
    table = comparison_table(summaries, overrides, "final_val_loss")
    assert list(table["run"]) == ["c", "a", "b"]
    histories = {
        "a": pd.DataFrame({"step": [1, 2], "loss": [4.0, 3.0]}),
        "b": pd.DataFrame({"step": [1, 2, 3], "loss": [4.0, 9.0, float("nan")]}),
        "c": pd.DataFrame({"step": [1, 2], "loss": [4.0, 2.0]}),
    }
    text = verdict(table, "final_val_loss", histories)
    assert text.startswith("c (optimizer.lr 0.01) is best by final_val_loss = 1.5")
    assert "the worst, a (optimizer.lr 0.001), has 2" in text and "diverged: b at step 2" in text
    assert "a was the fastest (2.0x less wall time than the slowest)" in text


def test_a_history_row_of_steps_without_target_tokens_is_no_divergence():
    """A row whose steps had no target token (every sample one token long) has a NaN loss and no loss at
    all: the verdict names no divergence for it, and still names one after it."""
    overrides = {"a": {"train.optimizer.lr": 0.001}, "b": {"train.optimizer.lr": 0.1}}
    summaries = {name: {"final_val_loss": 2.0 + index, "wall_time_s": 10.0, "steps": 4} for index, name in
                 enumerate(overrides)}  # fmt: skip
    table = comparison_table(summaries, overrides, "final_val_loss")
    nan = float("nan")
    histories = {
        "a": pd.DataFrame({"step": [1, 2, 3], "loss": [nan, 4.0, 3.0], "target_tokens": [0, 40, 40]}),
        "b": pd.DataFrame({"step": [1, 2, 3], "loss": [4.0, nan, nan], "target_tokens": [40, 0, 40]}),
    }
    text = verdict(table, "final_val_loss", histories)
    assert "diverged: b at step 3" in text and "a at" not in text, text


def test_a_verdict_on_runs_tied_by_the_metric_says_they_tie():
    """Two seeds scored by tool-call exact match, both at the same figure (a small model calling no tool
    right): the verdict says the runs tie and which one the best-run file takes, naming no run best or
    worst. (It said "s-01 is best by ... = 0; the worst, s-02, has 0".) A run ahead of the others is
    still named best."""
    overrides = {"s-01": {"train.seed": 0}, "s-02": {"train.seed": 1}, "s-03": {"train.seed": 2}}
    metric = "test_tool_call_exact_match"
    tied = {name: {metric: 0.0, "wall_time_s": 10.0} for name in overrides}
    text = verdict(comparison_table(tied, overrides, metric), metric, {})
    assert "is best by" not in text and "the worst" not in text, text
    assert f"s-01, s-02 and s-03 tie at {metric} = 0" in text and "s-01 (seed 0) is taken" in text, text
    ahead = {**tied, "s-02": {metric: 0.5, "wall_time_s": 10.0}}
    text = verdict(comparison_table(ahead, overrides, metric), metric, {})
    assert text.startswith(f"s-02 (seed 1) is best by {metric} = 0.5"), text
    assert "the worst, s-03 (seed 2), has 0" in text and "tie" not in text, text


def test_verdict_says_which_run_reached_a_common_validation_loss_sooner():
    overrides = {"a": {"train.batching.micro_batch_size": 8}, "b": {"train.batching.micro_batch_size": 16}}
    summaries = {
        "a": {"final_val_loss": 2.0, "wall_time_s": 10.0},
        "b": {"final_val_loss": 1.9, "wall_time_s": 12.0},
    }
    table = comparison_table(summaries, overrides, "final_val_loss")
    histories = {
        "a": pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4, 3, 2.5, 2.2], "elapsed_s": [2.0, 4, 6, 8]}),
        "b": pd.DataFrame({"step": [1, 2, 3, 4], "loss": [4, 3, 2.4, 2.1], "elapsed_s": [2.0, 4, 6, 8]}),
    }
    evaluations = {
        "a": pd.DataFrame({"step": [2, 4], "val_loss": [3.0, 2.0]}),
        "b": pd.DataFrame({"step": [2, 4], "val_loss": [1.95, 1.9]}),
    }
    text = verdict(table, "final_val_loss", histories, evaluations)
    assert (
        "b (batching.micro_batch_size 16) reached validation loss 2 2.0x sooner in wall time than "
        "a (batching.micro_batch_size 8)"
    ) in text


def test_the_sooner_race_uses_the_evaluations_time_or_says_it_is_the_last_logged_steps():
    """``eval_every`` 3, ``log_every`` 2: the evaluation at step 3 falls between logged steps 2 and 4. Its own
    ``elapsed_s`` (where the evaluations have it) times the race; else the last logged step's time is used
    and the verdict says so. Was: step 2's time, from before the evaluation, stated as the evaluation's."""
    overrides = {"a": {"train.batching.micro_batch_size": 8}, "b": {"train.batching.micro_batch_size": 16}}
    summaries = {"a": {"final_val_loss": 2.0}, "b": {"final_val_loss": 1.9}}
    table = comparison_table(summaries, overrides, "final_val_loss")
    histories = {
        name: pd.DataFrame({"step": [2, 4, 6], "loss": [3, 2.5, 2.2], "elapsed_s": [2.0, 4.0, 6.0]})
        for name in ("a", "b")
    }
    timed = {
        "a": pd.DataFrame({"step": [3, 6], "val_loss": [3.0, 2.0], "elapsed_s": [3.0, 6.0]}),
        "b": pd.DataFrame({"step": [3, 6], "val_loss": [1.95, 1.9], "elapsed_s": [3.0, 6.0]}),
    }
    text = verdict(table, "final_val_loss", histories, timed)
    assert "b (batching.micro_batch_size 16) reached validation loss 2 2.0x sooner in wall time" in text, text
    assert "last logged step" not in text, text
    untimed = {name: frame.drop(columns="elapsed_s") for name, frame in timed.items()}
    text = verdict(table, "final_val_loss", histories, untimed)
    assert "3.0x sooner in wall time" in text, text  # 6 s at step 6, 2 s at step 2 (logged before step 3)
    assert "each evaluation's time is that of the last logged step at or before it" in text, text


def test_plain_train_never_resumes_a_sweep_child_and_a_sweep_only_its_own(tmp_path):
    """An interrupted sweep child's checkpoint folder is not one that ``train.resume: auto`` of a plain train
    run takes as "the newest interrupted run"; a sweep's children live under their own sweep's folder."""
    import datetime as dt

    from fastlm.engine.checkpoint.files import save_checkpoint
    from fastlm.runs import resolve_run_name
    from fastlm.sweeps import run_train_params
    from tests.support.tiny_models import checkpoint_llama, optimizer_and_scheduler

    base = tmp_path / "checkpoints"
    spec = load_sweep(_file(tmp_path, {"name": "s", "max_steps": 4, "grid": {"train.seed": [0, 1]}}))
    child = run_train_params({"checkpoint_dir": str(base)}, spec, spec.plan()[0])
    other = run_train_params(
        {"checkpoint_dir": str(base)},
        load_sweep(_file(tmp_path, {"name": "t", "grid": {"train.seed": [0]}})),
        {},
    )
    assert child["max_steps"] == 4 and child["seed"] == 0
    assert child["checkpoint_dir"] != other["checkpoint_dir"]  # each sweep resumes only its own children
    model = checkpoint_llama(seed=0)
    optimizer, scheduler = optimizer_and_scheduler(model)
    save_checkpoint(
        Path(child["checkpoint_dir"]) / "s-01",
        2,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        state={"step": 2, "total_steps": 4},
    )  # a sweep child cut off at step 2
    now = dt.datetime(2026, 11, 23, 4, 14, 28)
    assert (
        resolve_run_name(None, ["train"], base, resume="auto", trains=True, now=now)
        == "train-20261123-041428"
    )


def test_table_has_rouge_when_present_and_says_which_runs_the_time_budget_stopped():
    overrides = {"a": {"train.optimizer.lr": 0.001}, "b": {"train.optimizer.lr": 0.01}}
    figures = {
        "final_train_loss": 2.0,
        "final_val_loss": 2.1,
        "test_loss": 2.2,
        "test_accuracy": 0.3,
        "test_top5_accuracy": 0.6,
        "real_tokens_per_s": 900.0,
        "peak_memory_mb": 12.0,
        "wall_time_s": 3.0,
        "steps": 4,
    }
    summaries = {
        "a": {**figures, "test_rouge1": 0.2, "test_rouge2": 0.05, "test_rougeL": 0.18},
        "b": {
            **figures,
            "test_rouge1": 0.4,
            "test_rouge2": 0.1,
            "test_rougeL": 0.35,
            "stopped_by": "time budget",
            "steps": 2,
        },
    }
    table = comparison_table(summaries, overrides, "test_rougeL")
    assert list(table.columns) == [
        "run",
        "train.optimizer.lr",
        "final_train_loss",
        "final_val_loss",
        "test_loss",
        "test_accuracy",
        "test_top5_accuracy",
        "test_rouge1",
        "test_rouge2",
        "test_rougeL",
        "real_tokens_per_s",
        "peak_memory_mb",
        "wall_time_s",
        "steps",
        "stopped",
    ]
    assert list(table["run"]) == ["b", "a"]  # ROUGE: higher is better
    assert list(table["stopped"]) == ["stopped by time budget", ""]
    assert "the time budget (max_minutes) stopped b at step 2" in verdict(table, "test_rougeL", {})
    plain = comparison_table({name: {**figures} for name in overrides}, overrides, "final_val_loss")
    assert "test_rouge1" not in plain and "stopped" in plain  # no ROUGE column on data without references
    early = {**summaries, "a": {**summaries["a"], "stopped_by": "early stopping", "steps": 3}}
    said = verdict(comparison_table(early, overrides, "test_rougeL"), "test_rougeL", {})
    assert "early stopping ended a at step 3" in said  # not blamed on the time budget
    assert "the time budget (max_minutes) stopped b at step 2" in said and "stopped a" not in said


def test_sweep_budget_and_rouge_metric_are_validated(tmp_path):
    spec = load_sweep(
        _file(
            tmp_path, {"name": "s", "max_minutes": 0.5, "metric": "test_rougeL", "grid": {"train.seed": [0]}}
        )
    )
    from fastlm.sweeps import run_train_params

    assert run_train_params({}, spec, {})["max_minutes"] == 0.5
    with pytest.raises(ConfigError, match="max_minutes") as raised:
        load_sweep(_file(tmp_path, {"name": "s", "max_minutes": 0, "grid": {"train.seed": [0]}}))
    assert "\n" not in str(raised.value)


def test_reference_scores_of_a_run_on_prompt_response_data(bpe_tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fastlm.sweep_training import reference_scores
    from tests.support.reporting import pair_frame

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(bpe_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        pad_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    model = LlamaForCausalLM(config)
    train = {"runtime": {"device": "cpu", "precision": "fp32"}}
    report = {"references": {"max_samples": 3, "max_new_tokens": 3, "batch_size": 3}}
    scores = reference_scores(model, bpe_tokenizer, pair_frame(), train, {}, report)
    assert set(scores) == {"test_rouge1", "test_rouge2", "test_rougeL"}
    assert all(0 <= value <= 1 for value in scores.values())
    plain = pd.DataFrame({"text": ["a", "b"], "split": ["train", "test"]})
    assert reference_scores(model, bpe_tokenizer, plain, train, {}, report) == {}


def _png() -> bytes:
    import io

    from matplotlib.figure import Figure

    buffer = io.BytesIO()
    Figure(figsize=(1, 1)).savefig(buffer, format="png")
    return buffer.getvalue()


def test_sweep_results_load_as_one_view_or_none_before_any_sweep(tmp_path):
    from fastlm.datasets.sweep_results import SweepResultsDataset
    from fastlm.reporting.sweep_view import sweep_document

    paths = {
        "comparison": tmp_path / "sweep_comparison.csv",
        "document": tmp_path / "sweep.md",
        "plot": tmp_path / "plots/sweep_loss.png",
    }
    dataset = SweepResultsDataset(**{key: str(path) for key, path in paths.items()})
    assert dataset.load() is None and not dataset.exists()
    table = pd.DataFrame({"run": ["s-02", "s-01"], "train.seed": [1, 0], "final_val_loss": [1.5, 2.0]})
    table.to_csv(paths["comparison"], index=False)
    paths["document"].write_text(sweep_document("s", "s-02 (seed 1) is best.", table, data="d" * 64))
    paths["plot"].parent.mkdir()
    paths["plot"].write_bytes(_png())
    view = dataset.load()
    assert view["name"] == "s" and view["verdict"] == "s-02 (seed 1) is best."
    assert view["data"] == "d" * 64  # what its runs trained on
    pd.testing.assert_frame_equal(view["table"], table)
    assert view["plot"] == paths["plot"].read_bytes()


def test_report_shows_the_sweep_table_plot_and_verdict_only_after_a_sweep():
    from tests.support.reporting import make_history, report_document

    table = pd.DataFrame({"run": ["s-02", "s-01"], "train.seed": [1, 0], "final_val_loss": [1.5, 2.0]})
    view = {
        "name": "s",
        "verdict": "s-02 (seed 1) is best by final_val_loss = 1.5.",
        "table": table,
        "plot": _png(),
        "source": "data/08_reporting/sweep_comparison.csv",
    }
    html, markdown = report_document(make_history(3), sweep=view)
    assert '<section id="sweep-s">' in html and "s-02 (seed 1) is best by final_val_loss = 1.5." in html
    assert '<img id="fig-sweep-loss" alt="sweep loss" src="data:image/png;base64,' in html
    assert "| s-02" in markdown and "## Sweep s" in markdown
    html, markdown = report_document(make_history(3), sweep=None)
    assert "Sweep" not in html and "Sweep" not in markdown


def test_a_sweep_on_other_data_than_the_reports_model_is_labelled_so():
    """The report shows the last sweep: after a re-split (other texts, other max_length) and a training on
    it, the sweep's losses sat beside the model's test figures as if comparable."""
    from tests.support.reporting import SUMMARY, make_history, report_document

    view = {
        "name": "s",
        "verdict": "s-02 is best.",
        "table": pd.DataFrame({"run": ["s-02"], "final_val_loss": [1.5]}),
        "plot": None,
        "source": "data/08_reporting/sweep_comparison.csv",
    }
    other = "ran on other data than the model"
    summary = {**SUMMARY, "fingerprint": "f" * 64}
    for data, labelled in (("f" * 64, False), ("0" * 64, True), (None, False)):
        html, markdown = report_document(make_history(3), summary=summary, sweep={**view, "data": data})
        assert (other in markdown) is labelled and (other in html) is labelled, data


def test_verdict_claims_no_speed_up_where_the_times_are_about_equal():
    overrides = {"a": {"train.seed": 0}, "b": {"train.seed": 1}}
    table = comparison_table(
        {
            "a": {"final_val_loss": 2.0, "wall_time_s": 10.0},
            "b": {"final_val_loss": 1.9, "wall_time_s": 10.2},
        },
        overrides,
        "final_val_loss",
    )
    histories = {
        name: pd.DataFrame({"step": [1, 2], "loss": [4.0, 3.0], "elapsed_s": [5.0, 10.0]})
        for name in overrides
    }
    evaluations = {
        "a": pd.DataFrame({"step": [2], "val_loss": [2.0]}),
        "b": pd.DataFrame({"step": [2], "val_loss": [1.9]}),
    }
    text = verdict(table, "final_val_loss", histories, evaluations)
    assert "sooner" not in text and "fastest" not in text and "1.0x" not in text
    assert text.startswith("b (seed 1) is best by final_val_loss = 1.9")


def test_verdict_without_wall_times_names_best_and_worst_and_claims_no_speed():
    # summaries written without a wall time (an older run, a failed read): no "fastest" claim, no crash
    overrides = {"a": {"train.seed": 0}, "b": {"train.seed": 1}}
    table = comparison_table(
        {"a": {"final_val_loss": 2.0}, "b": {"final_val_loss": 1.9, "wall_time_s": float("nan")}},
        overrides,
        "final_val_loss",
    )
    histories = {name: pd.DataFrame({"step": [1, 2], "loss": [4.0, 3.0]}) for name in overrides}
    text = verdict(table, "final_val_loss", histories)
    assert text.startswith("b (seed 1) is best by final_val_loss = 1.9") and "the worst, a (seed 0)" in text
    assert "fastest" not in text


def test_a_top_k_metric_is_named_by_the_k_the_report_evaluates(tmp_path):
    """``report.top_k`` 3: the runs' figure is ``test_top3_accuracy``; a sweep ranked by
    ``test_top5_accuracy`` then would rank by a figure no run has: another k than the report's is refused."""
    from fastlm.sweeps import load_sweep_runs

    path = _file(tmp_path, {"name": "s", "metric": "test_top3_accuracy", "grid": {"train.seed": [0, 1]}})
    assert load_sweep_runs(path, {}, top_k=3).metric == "test_top3_accuracy"
    with pytest.raises(ConfigError, match="report.top_k") as raised:
        load_sweep_runs(path, {}, top_k=5)
    said = str(raised.value)
    assert "\n" not in said and "test_top3_accuracy" in said and path in said and "test_top5_accuracy" in said
    with pytest.raises(ConfigError, match="metric must be one of"):
        load_sweep(
            _file(tmp_path, {"name": "s", "metric": "test_top0_accuracy", "grid": {"train.seed": [0]}})
        )

    overrides = {"a": {"train.seed": 0}, "b": {"train.seed": 1}}
    summaries = {
        "a": {"final_val_loss": 2.0, "test_accuracy": 0.3, "test_top3_accuracy": 0.5},
        "b": {"final_val_loss": 2.1, "test_accuracy": 0.3, "test_top3_accuracy": 0.6},
    }
    table = comparison_table(summaries, overrides, "test_top3_accuracy")
    assert "test_top3_accuracy" in table.columns and "test_top5_accuracy" not in table.columns
    assert list(table["run"]) == ["b", "a"]  # accuracy: higher is better
    assert list(table.columns).index("test_top3_accuracy") == list(table.columns).index("test_accuracy") + 1


def test_the_best_setting_is_a_run_configuration_that_trains_it(tmp_path):
    """``kedro run --config <file>`` trains the sweep's best setting with the sweep's budgets: the settings as
    the sweep file gave them (lists too) over the train and split parameters the sweep ran with (its --env and
    --params: without them the file trained another setting, or refused the data as stale), under a run name
    of its own; no fold (the whole training split)."""
    from fastlm.sweeps import best_run_config

    spec = load_sweep(
        _file(
            tmp_path,
            {
                "name": "s",
                "max_steps": 30,
                "max_minutes": 2.5,
                "runs": [
                    {"train.optimizer.lr": 0.003, "train.model.lora.target_modules": ["q_proj", "v_proj"]}
                ],
            },
        )
    )
    overrides = {"train.optimizer.lr": 0.003, "train.model.lora.target_modules": ["q_proj", "v_proj"]}
    swept_with = {"optimizer": {"lr": 0.001, "warmup_steps": 0}, "batching": {"micro_batch_size": 8}}
    config = best_run_config(spec, {**overrides, "train.fold": 2}, swept_with, {"max_samples": 2000})
    assert config == {
        "run": {
            "pipeline": "train",
            "params": {
                "run_name": "s-best",
                "train": {
                    "optimizer": {"lr": 0.003, "warmup_steps": 0},
                    "batching": {"micro_batch_size": 8},
                    "model": {"lora": {"target_modules": ["q_proj", "v_proj"]}},
                    "max_steps": 30,
                    "max_minutes": 2.5,
                },
                "split": {"max_samples": 2000},
            },
        }
    }
    assert swept_with == {"optimizer": {"lr": 0.001, "warmup_steps": 0}, "batching": {"micro_batch_size": 8}}


def test_the_best_setting_of_a_fold_sweep_run_with_a_train_fold_trains_the_whole_training_split(tmp_path):
    """A k-fold sweep (folds: auto) run with a train.fold left in the parameters (conf/local, --params from
    a fold run before): each run takes its own fold, and the best setting's run configuration trains on the
    whole training split, as its header says, its train.fold set to null (a --config file's parameters merge
    over the parameters files: a key left out keeps conf/local's fold). Was: train.fold 1 written into it, a
    run on fold 1's rows validated on fold 1, under a header saying "no fold (the whole training split)"."""
    from fastlm.sweeps import best_run_config

    spec = load_sweep(_file(tmp_path, {"name": "cv", "folds": "auto", "grid": {"train.optimizer.lr": [0.1]}}))
    swept_with = {"fold": 1, "optimizer": {"lr": 0.001}, "max_steps": 30}
    config = best_run_config(spec, {"train.optimizer.lr": 0.1, "train.fold": 0}, swept_with, {"folds": 3})
    train = config["run"]["params"]["train"]
    assert "fold" in train and train["fold"] is None and train["optimizer"] == {"lr": 0.1}
    assert swept_with["fold"] == 1  # the sweep's own parameters untouched


def test_a_sweep_over_label_smoothing_says_its_train_losses_are_not_comparable():
    overrides = {"a": {"train.loss.label_smoothing": 0.0}, "b": {"train.loss.label_smoothing": 0.5}}
    summaries = {
        "a": {"final_train_loss": 7.5, "final_val_loss": 7.6},
        "b": {"final_train_loss": 7.57, "final_val_loss": 7.55},
    }
    said = verdict(comparison_table(summaries, overrides, "final_val_loss"), "final_val_loss", {})
    assert "final_train_loss is smoothed by each run's train.loss.label_smoothing" in said
    plain = {name: {"train.seed": index} for index, name in enumerate(overrides)}
    assert "smoothed" not in verdict(
        comparison_table(summaries, plain, "final_val_loss"), "final_val_loss", {}
    )


def test_a_sweep_runs_mlflow_parameters_name_what_it_trained_with(tmp_path):
    """A sweep's child run logged its swept values alone: in the MLflow UI and the report's run comparison
    train.max_steps (the sweep's budget) and every other training setting were blank beside plain train runs,
    and the sweep's own run showed conf/base's train.max_steps, not the budget its runs trained to."""
    from fastlm.sweeps import child_run_params, load_sweep_runs, run_train_params

    base = {"max_steps": 1000, "optimizer": {"lr": 0.002, "warmup_steps": 20}, "seed": 0}
    path = _file(tmp_path, {"name": "s", "max_steps": 7, "grid": {"train.optimizer.lr": [0.001, 0.003]}})
    spec = load_sweep_runs(path, base)
    for overrides in spec.plan():
        params = run_train_params(base, spec, overrides)
        logged = child_run_params(params, overrides)
        assert logged["train.max_steps"] == spec.max_steps and logged["train.seed"] == base["seed"]
        assert logged["train.optimizer.lr"] == overrides["train.optimizer.lr"]
        assert logged["train.optimizer.warmup_steps"] == base["optimizer"]["warmup_steps"]


def test_a_sweep_on_function_calling_chats_picks_its_best_run_by_the_calls(tmp_path):
    """The report scores chat data whose test answers call tools by their calls (test_tool_call_*); a sweep
    can pick its best run by them (higher is better), and its table shows them where a run has them."""
    spec = load_sweep(
        _file(tmp_path, {"name": "s", "metric": "test_tool_call_exact_match", "grid": {"train.seed": [0, 1]}})
    )
    overrides = {"a": {"train.seed": 0}, "b": {"train.seed": 1}}
    figures = {"final_train_loss": 2.0, "final_val_loss": 2.1, "wall_time_s": 3.0, "steps": 4}
    summaries = {
        "a": {**figures, "test_tool_call_name_accuracy": 0.9, "test_tool_call_exact_match": 0.5},
        "b": {**figures, "test_tool_call_name_accuracy": 0.8, "test_tool_call_exact_match": 0.7},
    }
    table = comparison_table(summaries, overrides, spec.metric)
    assert list(table["run"]) == ["b", "a"]
    assert {"test_tool_call_name_accuracy", "test_tool_call_exact_match"} <= set(table.columns)
    plain = comparison_table({name: {**figures} for name in overrides}, overrides, "final_val_loss")
    assert "test_tool_call_exact_match" not in plain


def test_the_report_shows_a_fold_sweeps_mean_and_spread_per_metric(tmp_path):
    """A k-fold sweep's report showed its verdict and runs table but not the mean and spread over folds of
    each metric (sweep.md and sweep_folds.csv had them): the report now shows the folds table's figures,
    the same numbers as sweep_folds.csv (read back, then recomputed here from the runs)."""
    from fastlm.datasets.sweep_results import SweepResultsDataset
    from fastlm.reporting.sweep_view import fold_table, sweep_document
    from tests.support.reporting import make_history, report_document

    table = pd.DataFrame(
        {
            "run": ["k-01", "k-02", "k-03"],
            "train.fold": [0, 1, 2],
            "final_val_loss": [2.0, 2.5, 3.5],
            "test_accuracy": [0.5, 0.25, 0.375],
        }
    )
    paths = {
        "comparison": tmp_path / "sweep_comparison.csv",
        "document": tmp_path / "sweep.md",
        "plot": tmp_path / "sweep_loss.png",
        "folds": tmp_path / "sweep_folds.csv",
    }
    table.to_csv(paths["comparison"], index=False)
    paths["document"].write_text(sweep_document("k", "mean over 3 folds.", table))
    fold_table(table, {}, "final_val_loss").to_csv(paths["folds"], index=False)
    view = SweepResultsDataset(**{key: str(path) for key, path in paths.items()}).load()
    html, markdown = report_document(make_history(3), sweep=view)
    assert "## Sweep k: mean and spread over folds" in markdown and "sweep-k-mean-and-spread" in html
    section = markdown.split("## Sweep k: mean and spread over folds", 1)[1]
    for metric in ("final_val_loss", "test_accuracy"):
        for statistic, value in (("mean", table[metric].mean()), ("std", table[metric].std())):
            line = next(line for line in section.splitlines() if line.startswith(f"| {statistic} "))
            cells = [cell.strip() for cell in line.strip("|").split("|")]
            header = next(line for line in section.splitlines() if line.startswith("| row"))
            column = [cell.strip() for cell in header.strip("|").split("|")].index(metric)
            assert float(cells[column]) == pytest.approx(value, rel=1e-3), (statistic, metric, line)
    without = {**view, "folds": None}
    assert "mean and spread over folds" not in report_document(make_history(3), sweep=without)[1]


def test_the_sweep_table_names_each_runs_label_smoothing_and_its_models_step():
    """A sweep whose runs all train label-smoothed (conf's train.loss.label_smoothing, not swept) and one of
    which early stopping ended on an earlier step's model: final_train_loss is the last step's and smoothed,
    final_val_loss the model's step's. Was: the table set them side by side unnamed, as the report's run
    comparison did before it named them."""
    overrides = {"s-01": {"train.optimizer.lr": 0.001}, "s-02": {"train.optimizer.lr": 0.003}}
    summaries = {
        "s-01": {
            "final_train_loss": 3.1,
            "final_val_loss": 3.2,
            "steps": 60,
            "label_smoothing": 0.1,
            "model_train_loss": 3.1,
        },
        "s-02": {
            "final_train_loss": 2.0,
            "final_val_loss": 2.9,
            "steps": 70,
            "label_smoothing": 0.1,
            "early_stopping": {"model_from_step": 40},
            "model_train_loss": 2.4,
            "stopped_by": "early stopping",
        },
    }
    table = comparison_table(summaries, overrides, "final_val_loss")
    columns = list(table.columns)
    assert columns[columns.index("final_train_loss") + 1] == "label_smoothing", columns
    assert columns[columns.index("final_val_loss") + 1 : columns.index("final_val_loss") + 3] == [
        "model_step",
        "last_step",
    ], columns
    rows = table.set_index("run")
    assert rows.loc["s-02", "model_step"] == 40 and rows.loc["s-02", "last_step"] == 70
    assert rows.loc["s-01", "model_step"] == 60 and (rows["label_smoothing"] == 0.1).all()
    plain = {name: {"final_train_loss": 3.0, "final_val_loss": 3.1, "steps": 60} for name in summaries}
    assert not {"label_smoothing", "model_step", "last_step"} & set(
        comparison_table(plain, overrides, "final_val_loss").columns
    )


def test_final_train_loss_ranks_an_early_stopped_run_by_its_models_train_loss():
    """``metric: final_train_loss``: a run that early stopping ended on step 40's model is ranked by that
    step's train loss (``model_train_loss``, shown beside the last step's), as final_val_loss is the model's;
    a summary without it (an older version's) by its last step's, as before. Was: by the last step's train
    loss, so s-02 (2.0 at its last step, 2.4 at its model's) ranked above s-01 (2.2)."""
    overrides = {
        name: {"train.optimizer.lr": lr} for name, lr in (("s-01", 1e-3), ("s-02", 3e-3), ("s-03", 5e-3))
    }
    summaries = {
        "s-01": {"final_train_loss": 2.2, "final_val_loss": 3.2, "steps": 60, "model_train_loss": 2.2},
        "s-02": {
            "final_train_loss": 2.0,
            "final_val_loss": 2.9,
            "steps": 70,
            "early_stopping": {"model_from_step": 40},
            "model_train_loss": 2.4,
            "stopped_by": "early stopping",
        },
        "s-03": {
            "final_train_loss": 2.3,
            "final_val_loss": 3.0,
            "steps": 70,
            "early_stopping": {"model_from_step": 50},
        },
    }
    table = comparison_table(summaries, overrides, "final_train_loss")
    assert list(table["run"]) == ["s-01", "s-03", "s-02"], table
    rows = table.set_index("run")
    assert rows.loc["s-02", "model_train_loss"] == 2.4 and rows.loc["s-02", "final_train_loss"] == 2.0
    text = verdict(table, "final_train_loss", {}, {})
    assert "s-01 (optimizer.lr 0.001) is best by model_train_loss = 2.2" in text, text
    assert "s-02 (optimizer.lr 0.003), has 2.4" in text, text


def test_a_run_kept_by_an_older_version_without_the_weights_or_data_identity_is_trained_again(tmp_path):
    """A run kept before the sweep recorded its base folder's weights (no ``model weights``) or the split
    texts' digest (``data`` the fingerprint alone): trained again, with one line saying why; never kept on
    what that version could not compare (other weights in the folder, another split of other texts). A
    summary that is no record at all is trained again too, not a traceback. The same identity is kept."""
    from fastlm.sweeps import SweepRuns, kept_run

    runs, history = SweepRuns(tmp_path), pd.DataFrame({"step": [1]})
    identity = {"train": {"max_steps": 2}, "data": "digest", "model weights": "w2"}
    runs.keep(
        "s", "s-01", {"sweep_identity": {"train": {"max_steps": 2}, "data": "digest"}}, history, history
    )
    runs.keep("s", "s-02", {"sweep_identity": {**identity, "data": "fp"}}, history, history)
    runs.keep("s", "s-03", {"sweep_identity": identity}, history, history)
    runs.keep("s", "s-04", {"sweep_identity": {**identity, "model weights": "w1"}}, history, history)
    runs.folder("s", "s-05").mkdir(parents=True)
    (runs.folder("s", "s-05") / "summary.json").write_text("[1]")
    done, why = kept_run(runs, "s", "s-01", identity)
    assert done is None and "model weights" in why and "older version" in why and "\n" not in why, why
    done, why = kept_run(runs, "s", "s-02", identity)
    assert done is None and "data" in why and "\n" not in why, why
    done, why = kept_run(runs, "s", "s-03", identity)
    assert done is not None and why is None
    done, why = kept_run(runs, "s", "s-04", identity)
    assert done is None and "model weights" in why and "older version" not in why, why
    assert kept_run(runs, "s", "s-05", identity)[0] is None
    assert kept_run(runs, "s", "s-06", identity) == (None, None)  # never kept: nothing to say


def test_a_run_kept_when_the_sweep_file_read_1e_3_as_text_is_kept_by_the_number(tmp_path):
    """A run a sweep kept while its file's ``1e-3`` was read as the text '1e-3' (PyYAML's YAML 1.1) is the
    run of the number 0.001 the file now gives: kept, not trained again as a changed setting."""
    from fastlm.sweeps import SweepRuns, kept_run

    runs, history = SweepRuns(tmp_path), pd.DataFrame({"step": [1]})
    old = {"train": {"optimizer": {"lr": "1e-3"}}, "data": "d", "overrides": {"train.optimizer.lr": "1e-3"}}
    runs.keep("s", "s-01", {"sweep_identity": old}, history, history)
    now = {"train": {"optimizer": {"lr": 0.001}}, "data": "d", "overrides": {"train.optimizer.lr": 0.001}}
    done, why = kept_run(runs, "s", "s-01", now)
    assert done is not None and why is None, why
    other = {**now, "train": {"optimizer": {"lr": 0.002}}, "overrides": {"train.optimizer.lr": 0.002}}
    done, why = kept_run(runs, "s", "s-01", other)
    assert done is None and "train.optimizer.lr" in why, why


def test_a_run_kept_before_train_data_seed_existed_is_kept_by_the_conf_that_has_it(tmp_path):
    """Round twenty-two: a run a sweep kept before ``train.data_seed`` existed records train parameters
    without it; the project's conf/base now holds ``data_seed: null`` (the order of ``train.seed``, as those
    runs trained), so the same sweep again trained every finished run again ("its train differ"), a
    k-fold sweep's folds logged twice, the second time with no train loss. A record without the key reads
    as null: kept; a data_seed set now is another run, and a record with it set is no null."""
    from fastlm.sweeps import SweepRuns, kept_run
    from tests.support.project import PROJECT_ROOT

    conf = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_train.yml").read_text(encoding="utf-8"))
    train = {**conf["train"], "max_steps": 2}
    assert "data_seed" in train and train["data_seed"] is None  # what an upgraded project's conf holds
    runs, history = SweepRuns(tmp_path), pd.DataFrame({"step": [1]})
    older = {key: value for key, value in train.items() if key != "data_seed"}
    runs.keep("s", "s-01", {"sweep_identity": {"train": older, "data": "d"}}, history, history)
    runs.keep(
        "s", "s-02", {"sweep_identity": {"train": {**train, "data_seed": 7}, "data": "d"}}, history, history
    )
    identity = {"train": train, "data": "d"}
    done, why = kept_run(runs, "s", "s-01", identity)
    assert done is not None and why is None, why
    assert kept_run(runs, "s", "s-01", {"train": older, "data": "d"})[0] is not None  # a conf without it
    done, why = kept_run(runs, "s", "s-01", {"train": {**train, "data_seed": 7}, "data": "d"})
    assert done is None and "train" in why, why
    done, why = kept_run(runs, "s", "s-02", identity)
    assert done is None and "train" in why, why


def test_the_reason_a_kept_run_is_trained_again_names_a_few_settings_shortened_and_masked(tmp_path):
    """The settings that differ from a kept run's record, by dotted name with both values: a few, then how
    many more; a long value shortened; a secret's value (by its name or its shape) never shown."""
    from fastlm.sweeps import SweepRuns, kept_run

    runs, history = SweepRuns(tmp_path), pd.DataFrame({"step": [1]})
    secret = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    kept = {
        "model": {"name_or_path": "https://user:pw@host/base", "hf_token": secret, "name": "m"},
        "optimizer": {"lr": 0.0003},
        "note": "x" * 200,
        "seed": 1,
        "fold": 0,
        "max_steps": 2,
    }
    now = {
        "model": {"name_or_path": "https://user:other@host/base", "hf_token": secret + "Z", "name": "m"},
        "optimizer": {"lr": 0.0001},
        "note": "y" * 200,
        "seed": 2,
        "fold": 1,
        "max_steps": 3,
    }
    runs.keep("s", "s-01", {"sweep_identity": {"train": kept, "data": "d"}}, history, history)
    done, why = kept_run(runs, "s", "s-01", {"train": now, "data": "d"})
    assert done is None and "\n" not in why, why
    assert "train.optimizer.lr 0.0003 -> 0.0001" in why and "and 3 more" in why, why
    assert "pw" not in why and "other" not in why and secret not in why and "***" in why, why
    assert "x" * 80 not in why and "y" * 80 not in why, why
    assert len(why) < 400, why
    done, why = kept_run(runs, "s", "s-01", {"train": {**kept, "data_seed": 7}, "data": "d"})
    assert why == "its train.data_seed null -> 7 differ from what it finished with", why


def test_two_writers_of_a_runs_summary_never_write_into_one_file(tmp_path):
    """Round twenty: every writer of a run's summary wrote ``summary.json.tmp``. A second writer opening it
    while the first was writing it truncated the first's file, renamed it to summary.json, and the first
    went on writing into it: a summary of both, or of neither. Each write has its own temporary file."""
    folder = tmp_path / "sweep" / "run-1"
    folder.mkdir(parents=True)
    first = json.dumps({"val_loss": 1.25, "note": "the first writer's summary, longer than the second's"})
    written = folder / "summary.json.tmp"  # the name the first writer, under way, opened
    with written.open("w", encoding="utf-8") as handle:
        handle.write(first[:20])
        handle.flush()
        save_finished(folder, {"val_loss": 2.5}, pd.DataFrame(), pd.DataFrame())  # the second writer
        handle.write(first[20:])
    assert json.loads((folder / "summary.json").read_text(encoding="utf-8")) == {"val_loss": 2.5}
    assert written.read_text(encoding="utf-8") == first  # the first writer's file, for it to rename


def test_a_full_disk_while_a_finished_run_is_kept_is_one_line_and_the_run_not_kept(tmp_path, monkeypatch):
    """Round twenty-three: a full disk while a sweep kept a finished run's histories ended the sweep with
    pandas' OSError and its traceback. Now one line names the run's folder and the fix; its summary, written
    last, is not there, so the next sweep trains the run again."""
    folder = tmp_path / "sweep" / "run-1"
    write_stops_part_way(monkeypatch, "history.csv")
    with pytest.raises(StorageError) as raised:
        save_finished(folder, {"val_loss": 2.5}, pd.DataFrame({"step": range(50)}), pd.DataFrame())
    monkeypatch.undo()
    message = str(raised.value)
    assert "\n" not in message and str(folder) in message and "the disk is full" in message, message
    assert "Fix: free disk space" in message and "trains it again" in message, message
    assert sorted(path.name for path in folder.iterdir()) == []
    assert finished_summary(folder, {}) is None


def test_a_train_budget_the_sweep_file_replaces_is_named(tmp_path):
    """`--params sweep=FILE,train.max_steps=5` trained every run for the file's `max_steps: 60`, silently: the
    replaced value is named with the file's, and the fix. A budget the file leaves out, or equal, says
    nothing."""
    from fastlm.sweeps import replaced_budgets

    path = _file(tmp_path, {"name": "s", "max_steps": 60, "max_minutes": 2, "grid": {"train.seed": [1]}})
    spec = load_sweep(path)
    lines = replaced_budgets(spec, {"max_steps": 5, "max_minutes": 2.0}, path)
    assert len(lines) == 1 and "train.max_steps 5" in lines[0] and "max_steps: 60" in lines[0], lines
    assert f"write max_steps: 5 in {path}" in lines[0], lines
    assert replaced_budgets(spec, {"max_steps": None}, path) == []
    unbudgeted = load_sweep(_file(tmp_path, {"name": "t", "grid": {"train.seed": [1]}}))
    assert replaced_budgets(unbudgeted, {"max_steps": 5}, path) == []


class _Vocabulary:
    """The tokenizer as the sweep asks it before its runs: its length."""

    def __len__(self) -> int:
        return 300


class _Children:
    """The RunTracker calls of a sweep's runs, recorded."""

    def __init__(self):
        self.children = []

    def child_run(self, name, params):
        import contextlib

        self.children.append(name)
        return contextlib.nullcontext(f"id-{name}")

    def log_run_metrics(self, metrics):
        pass

    def log_params(self, params):
        pass


def _sweep_of(tmp_path, metric: str, splits, report: dict, split: dict | None = None, tokenizer=None):
    """``train_sweep`` of a two-run sweep ranked by ``metric`` on ``splits`` (``tokenizer``: the data's); the
    runs it trained."""
    from fastlm.sweep_training import SweepInputs, train_sweep
    from fastlm.sweeps import SweepRuns

    trained = []

    def train(tokenized, fingerprint, tokenizer, params, split_params, *, run_name, tracker, choices_dir):
        trained.append(run_name)
        history = pd.DataFrame({"step": [1], "loss": [2.0], "elapsed_s": [0.1]})
        evaluation = pd.DataFrame({"step": [1], "val_loss": [2.0]})
        return {"model": None}, history, evaluation, {"final_val_loss": 2.0, "steps": 1}

    path = _file(tmp_path, {"name": "m", "metric": metric, "grid": {"train.seed": [0, 1]}})
    data = {"fingerprint": "f", "params": {}}
    inputs = SweepInputs(None, data, tokenizer or _Vocabulary(), splits, {}, split or {}, report)
    tracker = _Children()
    try:
        train_sweep(
            inputs,
            path,
            SweepRuns(tmp_path / "sweeps"),
            tracker,
            train=train,
            weights_identity=lambda _: None,
            best_run_source=str(tmp_path / "best.yml"),
        )
    finally:
        assert tracker.children == trained
    return trained, path


@pytest.mark.parametrize(
    ("metric", "data", "report", "expected"),
    [
        ("test_rouge1", "text", {}, "the data has no prompt/response pairs"),
        ("test_rougeL", "pairs", {"references": {"enabled": False}}, "report.references.enabled is false"),
        ("test_tool_call_exact_match", "pairs", {}, "no test answer the runs are scored on calls a tool"),
        ("test_tool_call_name_accuracy", "text", {}, "the data has no prompt/response pairs"),
    ],
)
def test_a_sweep_ranked_by_a_metric_its_runs_never_get_is_refused_before_the_first_run(
    tmp_path, metric, data, report, expected
):
    """ROUGE and the tool-call rates come from generations on the test split's references: none on plain text,
    none with report.references off, and no tool-call rate where no test answer calls a tool. Was: every run
    trained, then 'No run of the sweep has a finite test_rouge1: every run diverged or was not evaluated',
    a success with no setting to train."""
    from tests.support.reporting import pair_frame

    splits = (
        pair_frame() if data == "pairs" else pd.DataFrame({"text": ["a", "b"], "split": ["train", "test"]})
    )
    with pytest.raises(ConfigError, match=expected) as raised:
        _sweep_of(tmp_path, metric, splits, report)
    message = str(raised.value)
    assert "\n" not in message and f"sweep file {tmp_path / 'sweep.yml'}: metric {metric}" in message
    assert "final_val_loss" in message  # the fix names a metric every run has
    assert not (tmp_path / "sweeps").exists() and not (tmp_path / "best.yml").exists()


def test_a_sweep_ranked_by_rouge_on_prompt_response_data_trains_its_runs(tmp_path):
    from tests.support.reporting import pair_frame

    trained, _ = _sweep_of(tmp_path, "test_rouge1", pair_frame(), {}, {"prompt_column": "p"})
    assert trained == ["m-01", "m-02"]


def test_a_sweep_ranked_by_tool_calls_trains_where_its_scored_test_answers_call_tools(tmp_path):
    """Chat data whose test answers call tools in the template's call format: the runs train. Where the
    test answers scored (report.references.max_samples) all answer in text, the calls beyond them are named
    with the fix."""
    from fastlm.reporting.references import reference_pairs
    from tests.support.tiny_llama import calling_llama

    _, tokenizer = calling_llama()
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "서울"}}</tool_call>'
    splits = pd.DataFrame(
        {
            "prompt": ["ask"] * 4,
            "response": [call, "sunny", call, "맑아요"],
            "split": ["train"] + ["test"] * 3,
        }
    )
    chat = {"messages_column": "messages"}
    metric = "test_tool_call_exact_match"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    trained, _ = _sweep_of(tmp_path / "a", metric, splits, {}, chat, tokenizer)
    assert trained == ["m-01", "m-02"]

    def capped_data(i: int) -> pd.DataFrame:  # a call and a text answer in the test split
        return pd.DataFrame(
            {"prompt": f"ask {i}", "response": [call, call, "sunny"], "split": ["train", "test", "test"]}
        )

    capped = next(  # the first whose one answer scored (max_samples 1, a hash of each pair) is the text
        data for data in map(capped_data, range(100)) if reference_pairs(data, 1)["response"].item() != call
    )
    with pytest.raises(ConfigError, match="no test answer the runs are scored on calls a tool") as raised:
        _sweep_of(tmp_path / "b", metric, capped, {"references": {"max_samples": 1}}, chat, tokenizer)
    assert "report.references.max_samples 1 of them" in str(raised.value)
    assert "raise report.references.max_samples (null: every test answer)" in str(raised.value)
