"""`kedro run --config FILE` with `--params`: the file's parameters and the command line's, merged."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from fastlm import cli
from tests.support.project import cli_refusal


@pytest.fixture
def given(monkeypatch, tmp_path):
    """The keyword arguments Kedro's own run receives from fastlm's ``run`` (nothing runs)."""
    seen = {}
    monkeypatch.setattr(cli.kedro_run, "callback", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(cli, "check_env", lambda *args, **kwargs: None)
    monkeypatch.setattr(cli, "in_project_folder", lambda: None)
    # a refused run ends the process's logging before its one line: not the test session's handlers
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)
    monkeypatch.chdir(tmp_path)
    return seen


def _run(tmp_path, params, *args: str):
    config = tmp_path / "best.yml"
    config.write_text(yaml.safe_dump({"run": {"pipeline": "train", "params": params}}))
    done = CliRunner().invoke(cli.run, ["--config", str(config), *args])
    assert done.exit_code == 0, done.output
    return config


def test_params_on_the_command_line_add_to_the_config_files_not_replace_them(given, tmp_path):
    """The sweep's best setting trained longer: `kedro run --config sweep_best_run.yml --params
    train.max_steps=1000`. Was: the file's parameters dropped whole (click's command line over its default
    map), the default setting trained under the sweep's run name, silently."""
    best = {"run_name": "s-best", "train": {"optimizer": {"lr": 0.003, "warmup_steps": 0}, "max_steps": 30}}
    _run(tmp_path, best, "--params", "train.max_steps=1000,train.optimizer.lr=0.002")
    assert given["params"] == {
        "run_name": "s-best",
        "train": {"optimizer": {"lr": 0.002, "warmup_steps": 0}, "max_steps": 1000},
    }
    assert given["pipelines"] == ["train"]


def test_a_config_files_dotted_keys_are_the_parameters_they_name(given, tmp_path):
    """A config file's ``params`` as a mapping of dotted keys (as `--params` writes them) is nested as
    `--params` nests them. Was: refused as an unknown parameter ``split.max_length``."""
    _run(tmp_path, {"split.max_length": 64, "train.optimizer.lr": 0.003, "train.seed": 1})
    assert given["params"] == {"split": {"max_length": 64}, "train": {"optimizer": {"lr": 0.003}, "seed": 1}}
    _run(tmp_path, "split.max_length=64,train.seed=1", "--params", "train.seed=2")
    assert given["params"] == {"split": {"max_length": 64}, "train": {"seed": 2}}


def test_without_a_config_file_the_command_lines_params_are_kedros(given, tmp_path):
    done = CliRunner().invoke(cli.run, ["--pipeline=split", "--params", "split.max_length=64"])
    assert done.exit_code == 0, done.output
    assert given["params"] == {"split": {"max_length": 64}} and given["pipelines"] == ["split"]


# A list or mapping typed in --params: Kedro cut the text at every comma, so a list of two items was refused
# as "Item `v_proj]` must contain a key and a value separated by `=`" (kedro-org/kedro#2552), a message
# naming half a value. The commas inside brackets, braces or quotes belong to the value.
LISTS = (
    (
        "train.model.lora.target_modules=[q_proj,v_proj],train.seed=1",
        {"train": {"model": {"lora": {"target_modules": ["q_proj", "v_proj"]}}, "seed": 1}},
    ),
    ('report.prompts=["Hello, world", "배송"]', {"report": {"prompts": ["Hello, world", "배송"]}}),
    (
        "train.optimizer={lr: 0.002, weight_decay: 0.0},run_name=x",
        {"train": {"optimizer": {"lr": 0.002, "weight_decay": 0.0}}, "run_name": "x"},
    ),
    ("split.prompt_template='Q, then A: {prompt}',train.seed=2", None),
    ("run_name=a[b,train.seed=1", {"run_name": "a[b", "train": {"seed": 1}}),  # no list: cut as Kedro cuts
    ("run_name=it's,train.seed=1", {"run_name": "it's", "train": {"seed": 1}}),
)


@pytest.mark.parametrize(("typed", "expected"), LISTS)
def test_a_list_or_mapping_in_params_keeps_the_commas_inside_it(given, tmp_path, typed, expected):
    done = CliRunner().invoke(cli.run, ["--pipeline=train", "--params", typed])
    assert done.exit_code == 0, done.output
    if expected is None:
        expected = {"split": {"prompt_template": "Q, then A: {prompt}"}, "train": {"seed": 2}}
    assert given["params"] == expected


def test_a_config_files_params_text_keeps_the_commas_of_its_lists(given, tmp_path):
    _run(tmp_path, "train.model.lora.target_modules=[q_proj,v_proj]", "--params", "train.seed=2")
    assert given["params"] == {
        "train": {"model": {"lora": {"target_modules": ["q_proj", "v_proj"]}}, "seed": 2}
    }


def test_an_item_without_a_value_in_params_is_still_refused_by_kedro(given, tmp_path):
    done = CliRunner().invoke(cli.run, ["--pipeline=train", "--params", "train.seed=1,oops"])
    assert done.exit_code == 2 and "Item `oops` must contain a key and a value" in done.output, done.output
    assert given == {}


def test_a_key_given_as_a_value_and_as_a_group_is_refused_as_a_config_error():
    """``train: 5`` beside ``train.max_steps: 3`` names no parameter: a ConfigError (the CLI's one line and
    exit 2, as for every ConfigError: tests/test_bad_input_matrix.py), not a traceback."""
    from fastlm.errors import ConfigError

    for params in ({"train": 5, "train.max_steps": 3}, {"train.max_steps": 3, "train": 5}):
        with pytest.raises(ConfigError, match="train is given a value \\(5\\) and parameters under it"):
            cli.run_params(params, None)
        with pytest.raises(ConfigError, match="train is given a value \\(5\\) and parameters under it"):
            cli.run_params(None, params)


def test_the_best_run_files_header_says_params_are_merged_as_the_cli_merges_them(given, tmp_path):
    """sweep_best_run.yml's header said a ``--params`` given with ``--config`` "replaces these parameters";
    the CLI merges them key by key (``run_params``): the header says so, and the run it heads does so."""
    from fastlm.sweep_training import best_run_header

    header = best_run_header("lr", "lr-2", "final_val_loss", "kedro run --config best.yml")
    assert "replaces" not in header and "key by key" in header
    best = {"run_name": "lr-best", "train": {"optimizer": {"lr": 0.003}, "max_steps": 30}}
    config = tmp_path / "best.yml"
    config.write_text(header + yaml.safe_dump({"run": {"pipeline": "train", "params": best}}))
    done = CliRunner().invoke(cli.run, ["--config", str(config), "--params", "train.max_steps=1000"])
    assert done.exit_code == 0, done.output
    # the one key given changes; the file's other parameters stay, as the header says
    assert given["params"] == {**best, "train": {**best["train"], "max_steps": 1000}}


# A value typed with ' #' in it (a folder or file named "ckpt #2"): Kedro reads --params values as YAML, where
# ' #' starts a comment. Was: the value silently cut before it (run_name 실험 #3 trained, resumed and reported
# as run 실험; a checkpoint_dir "ckpt #2" wrote into "ckpt").
COMMENTED = ("run_name=실험 #3", "train.checkpoint_dir=data/06_models/ckpt #2", "predict.input=#in.txt")


@pytest.mark.parametrize("item", COMMENTED)
def test_a_params_value_cut_by_a_yaml_comment_is_refused(item):
    from kedro.framework.cli.utils import _split_params

    key, _, typed = item.partition("=")
    parsed = cli.run_params(None, _split_params(None, None, item))
    for part in key.split("."):
        parsed = parsed[part]
    assert parsed != typed  # what Kedro alone would run with
    with pytest.raises(cli.ConfigError) as raised:
        cli.check_params_text(item)
    said, fix = str(raised.value).split("Fix:")
    assert "\n" not in said and key in said and typed in said, said
    assert f"{key}='{typed}'" in fix, fix


@pytest.mark.parametrize(
    "item", ["run_name='실험 #3'", 'run_name="a #b"', "run_name=a#b", "train.max_steps=30"]
)
def test_a_quoted_or_uncommented_params_value_is_taken_as_typed(given, tmp_path, item):
    CliRunner().invoke(cli.run, ["--pipeline=train", "--params", item])
    key, _, typed = item.partition("=")
    value = given["params"]
    for part in key.split("."):
        value = value[part]
    assert value == yaml.safe_load(typed)


def test_a_params_value_cut_by_a_comment_is_one_line_and_status_2(kedro_project):
    last = cli_refusal(kedro_project, "--pipeline=report", "--params", "run_name=실험 #3")
    assert "run_name" in last and "실험 #3" in last, last


def test_the_sweeps_command_names_the_best_run_file_relative_to_the_project(tmp_path, monkeypatch):
    """The command a sweep writes into sweep.md and sweep_best_run.yml names the file as the catalog gives
    it, relative to the project folder (the working folder of a run); a file outside it keeps its absolute
    path. (The catalog's absolute path was written: a sweep folder moved to another checkout or machine
    named a file that is not there.)"""
    from fastlm.sweeps import best_run_command

    monkeypatch.chdir(tmp_path)
    inside = tmp_path / "data/08_reporting/sweep_best_run.yml"
    assert best_run_command(str(inside)) == "kedro run --config data/08_reporting/sweep_best_run.yml"
    outside = tmp_path.parent / "elsewhere.yml"
    assert best_run_command(str(outside)) == f"kedro run --config {outside}"


def test_a_config_file_named_from_the_project_is_found_from_a_subfolder_or_refused_in_one_line(
    given, tmp_path, monkeypatch
):
    """`kedro run --config data/08_reporting/sweep_best_run.yml` (as the sweep writes it) started in a
    subfolder of the project reads the project's file; a file neither here nor in the project is one line
    naming it (both places where they differ), exit 2. (Click refused the path before the run moved to the
    project folder.)"""
    (tmp_path / "pyproject.toml").write_text('[tool.kedro]\npackage_name = "fastlm"\nproject_name = "x"\n')
    best = tmp_path / "data/08_reporting/sweep_best_run.yml"
    best.parent.mkdir(parents=True)
    best.write_text(yaml.safe_dump({"run": {"pipeline": "train", "params": {"run_name": "s-best"}}}))
    (tmp_path / "notebooks").mkdir()
    monkeypatch.chdir(tmp_path / "notebooks")
    done = CliRunner().invoke(cli.run, ["--config", "data/08_reporting/sweep_best_run.yml"])
    assert done.exit_code == 0, done.output
    assert given["params"] == {"run_name": "s-best"} and given["pipelines"] == ["train"], given
    done = CliRunner().invoke(cli.run, ["--config", "data/08_reporting/missing.yml"])
    assert done.exit_code == 2, done.output
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastlm: error: --config data/08_reporting/missing.yml"), (
        lines
    )
    assert f"in {tmp_path / 'notebooks'} nor in the project folder {tmp_path}." in lines[0], lines
    monkeypatch.chdir(tmp_path)  # the project folder itself: named once
    line = CliRunner().invoke(cli.run, ["--config", "missing.yml"]).output.strip()
    assert f"no such file in {tmp_path}. Fix:" in line and "nor" not in line, line
