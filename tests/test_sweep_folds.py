"""A sweep over folds (``folds: auto``): one run per fold of the split (per parameter set of a grid), and the
mean and spread of each metric over the folds in the sweep's report."""

import pytest
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.checkpoint.resume import digest_differences, run_digest
from fastlm.engine.config import parse_train_params
from fastlm.errors import ConfigError
from fastlm.reporting.sweep_view import comparison_table, fold_spread, sweep_document, verdict
from fastlm.sweeps import load_sweep, load_sweep_runs


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
