"""The parameter-group registry (fastlm.parameters): each conf/base parameters file parses to its schema's
defaults, every group a node reads is registered, and the hook validates through the registry."""

from pathlib import Path

import pytest
import yaml

from fastlm.errors import ConfigError
from fastlm.parameters import GROUPS, parse_group

CONF = Path(__file__).resolve().parents[1] / "conf" / "base"


def _group_value(name: str):
    loaded = yaml.safe_load((CONF / f"parameters_{name}.yml").read_text(encoding="utf-8"))
    assert set(loaded) == {name}, f"parameters_{name}.yml must hold only the {name} group"
    return loaded[name]


@pytest.mark.parametrize("name", [name for name, group in GROUPS.items() if group.schema is not None])
def test_each_parameters_file_parses_to_its_schema_defaults(name):
    assert parse_group(name, _group_value(name)) == GROUPS[name].defaults()


def test_the_sweep_parameter_names_a_loadable_sweep_file(monkeypatch):
    monkeypatch.chdir(CONF.parents[1])  # the sweep path is relative to the project root, as in a kedro run
    assert parse_group("sweep", _group_value("sweep")).plan()


def test_every_parameters_file_is_a_registered_group_and_every_group_has_its_file():
    files = {path.stem.removeprefix("parameters_") for path in CONF.glob("parameters_*.yml")}
    assert files == set(GROUPS)
    assert all(GROUPS[name].source == f"conf/base/parameters_{name}.yml" for name in GROUPS)


def test_every_params_input_of_a_node_is_registered_or_a_plain_value():
    from fastlm.hooks import all_pipelines

    read = {name.removeprefix("params:") for pipeline in all_pipelines().values() for name in pipeline.inputs()
            if name.startswith("params:")}
    assert read - set(GROUPS) == {"run_name"}  # resolved by RunNameHook, not a group


def test_a_bad_value_is_one_config_error_naming_its_file():
    with pytest.raises(ConfigError, match="parameters_tune.yml"):
        parse_group("tune", {"min_micro_batch_size": 0})
