"""The parameter-group registry (fastlm.parameters): each conf/base parameters file parses to its schema's
defaults, every group a node reads is registered, and the hook validates through the registry."""

import re
from pathlib import Path

import click
import pytest
import yaml

from fastlm.cli import RAW_PARAMS
from fastlm.errors import ConfigError
from fastlm.parameters import GROUPS, parse_group
from fastlm.runs import validate_run_name

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

    read = {
        name.removeprefix("params:")
        for pipeline in all_pipelines().values()
        for name in pipeline.inputs()
        if name.startswith("params:")
    }
    assert read - set(GROUPS) == {"run_name"}  # resolved by RunNameHook, not a group


def test_a_bad_value_is_one_config_error_naming_its_file():
    with pytest.raises(ConfigError, match="parameters_tune.yml"):
        parse_group("tune", {"min_micro_batch_size": 0})


def test_top_level_parameters_the_project_or_the_user_defines_are_known(tmp_path):
    """What --params may name at the top: the groups, run_name, raw_path (read by the catalog), and any key a
    parameters file of any environment defines (any Kedro parameters file name or folder, .yml, .yaml, .json)
    or a conf file reads through ${runtime_params:...}."""
    from fastlm.parameters import known_top_level_params
    from tests.support.project import copy_project

    conf = copy_project(tmp_path / "project") / "conf"
    (conf / "local/parameters_mine.yml").write_text("my_threshold: 0.5\n")
    (conf / "base/parameters").mkdir()
    (conf / "base/parameters/extra.yaml").write_text("extra_group: {a: 1}\n")
    (conf / "quick/nested").mkdir()
    (conf / "quick/nested/parameters_more.json").write_text('{"from_json": 1}')
    (conf / "local/catalog_mine.yml").write_text(
        "mine:\n  type: json.JSONDataset\n  filepath: ${runtime_params:my_path, data/x.json}\n"
    )
    known = known_top_level_params(conf)
    assert {"split", "train", "report", "tune", "sweep", "run_name", "raw_path"} <= known
    assert {"my_threshold", "extra_group", "from_json", "my_path"} <= known
    assert "max_steps" not in known and "a" not in known  # nested keys are not top-level ones


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ({"raw_pth": "data/01_raw/x.jsonl"}, "unknown parameter raw_pth (did you mean raw_path?)"),
        ({"trian": {"max_steps": 3}}, "unknown parameter trian.max_steps (did you mean train.max_steps?)"),
        ({"zzz": 1}, "unknown parameter zzz in --params"),
    ],
    ids=["raw_pth", "trian", "no_suggestion"],
)
def test_an_unknown_top_level_parameter_is_one_config_error(given, expected):
    from fastlm.parameters import check_top_level_params

    known = {"split", "train", "report", "tune", "sweep", "run_name", "raw_path"}
    with pytest.raises(ConfigError, match=re.escape(expected)) as raised:
        check_top_level_params({"split": {"max_length": 48}, **given}, known)
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message and "parameters" in message, message
    assert not [value for value in given.values() if isinstance(value, str) and value in message]  # no values
    check_top_level_params({"split": {}, "run_name": "a", "raw_path": "x"}, known)  # known keys pass


def test_lora_target_modules_as_a_string_names_the_parameter_and_asks_for_a_list():
    from fastlm.engine.config import parse_train_params

    with pytest.raises(ConfigError) as raised:
        parse_train_params({"model": {"lora": {"enabled": True, "target_modules": "q_proj"}}})
    message = str(raised.value)
    assert message.startswith("parameter train.model.lora.target_modules = 'q_proj' is invalid:"), message
    assert "a list such as [q_proj]" in message and "'auto' or 'all-linear'" in message, message
    assert "list[str]" not in message and "literal[" not in message and "\n" not in message, message
    assert "--params 'train.model.lora.target_modules=[q_proj]'" in message, message


def _union_schema():
    from typing import Annotated, Literal

    from pydantic import AfterValidator

    from fastlm.validation import Params

    def at_least_one(value):
        if value < 1:
            raise ValueError("must be at least 1")
        return value

    class Inner(Params):
        size: int = 1

    class Outer(Params):
        count: int | Literal["auto"] = "auto"
        checked: Annotated[int, AfterValidator(at_least_one)] | Literal["auto"] = "auto"
        items: list[int | Literal["auto"]] = []
        named: dict[str, int | Literal["auto"]] = {}
        inner: Inner | Literal["off"] = "off"
        number: int | float | None = None

    return Outer


@pytest.mark.parametrize(
    ("raw", "key", "expected"),
    [
        ({"count": "x"}, "parameter grp.count = 'x' is invalid", "Input should be a valid integer or 'auto'"),
        ({"checked": 0}, "parameter grp.checked = 0 is invalid", "must be at least 1 (or 'auto')"),
        (
            {"items": [1, "x"]},
            "parameter grp.items.1 = 'x' is invalid",
            "Input should be a valid integer or 'auto'",
        ),
        (
            {"named": {"k": "x"}},
            "parameter grp.named.k = 'x' is invalid",
            "Input should be a valid integer or 'auto'",
        ),
        ({"inner": {"sise": 2}}, "unknown parameter grp.inner.sise (did you mean grp.inner.size?)", ""),
        (
            {"inner": {"size": "x"}},
            "parameter grp.inner.size = 'x' is invalid",
            "Input should be a valid integer",
        ),
        ({"number": "x"}, "parameter grp.number = 'x' is invalid", "a valid integer or a valid number"),
    ],
    ids=[
        "int_or_literal",
        "function_after",
        "list_item",
        "dict_value",
        "model_branch_unknown_key",
        "model_branch_value",
        "int_or_float",
    ],
)
def test_union_branch_names_never_reach_a_parameter_path(raw, key, expected):
    """pydantic puts the name of each union branch it tried into the error location (``list[str]``, ``int``,
    ``function-after[...]``, a model's class name): the message names the parameter, and says what each branch
    accepts."""
    from fastlm.validation import parse_params

    with pytest.raises(ConfigError) as raised:
        parse_params(_union_schema(), raw, prefix="grp", source="conf/base/parameters_grp.yml")
    message = str(raised.value)
    assert message.startswith(key) and expected in message, message
    named = message.split(" = ")[0].split(" (")[0]
    assert not any(tag in named for tag in ("[", "int", "float", "literal", "function", "Inner")), message


@pytest.mark.parametrize(
    ("group", "raw", "name"),
    [
        ("predict", {"prompt_template": {"Summary": None}}, "predict.prompt_template"),
        ("split", {"prompt_template": {"Q": "{prompt}"}}, "split.prompt_template"),
        ("split", {"text_column": {"body": None}}, "split.text_column"),
    ],
    ids=["colon_at_the_end", "braces", "colon_in_a_column_name"],
)
def test_a_text_parameter_read_as_a_mapping_asks_for_quotes_not_a_sub_key(group, raw, name):
    """``--params split.prompt_template=Q: {prompt}`` reaches the schema as a mapping (YAML reads ``key:
    value`` and ``{...}``): the fix is to quote the text, not to set ``<name>.<key>``, which does not
    exist."""
    with pytest.raises(ConfigError) as error:
        parse_group(group, raw)
    message = str(error.value)
    assert f"parameter {name} = " in message and "<key>" not in message and "\n" not in message
    fix = message.split("Fix:")[1]
    assert "quote" in fix and f"'{name}=\"" in fix


@pytest.mark.parametrize(
    ("group", "raw", "name", "quoted"),
    [
        ("split", {"hash_salt": 42}, "split.hash_salt", "'split.hash_salt=\"<text as written>\"'"),
        ("split", {"text_column": 2024}, "split.text_column", "'split.text_column=\"<text as written>\"'"),
        ("split", {"hash_salt": 1.5}, "split.hash_salt", "'split.hash_salt=\"<text as written>\"'"),
        ("split", {"hash_salt": True}, "split.hash_salt", "'split.hash_salt=\"<text as written>\"'"),
    ],
    ids=["salt", "column", "float", "boolean"],
)
def test_a_text_parameter_typed_as_a_number_asks_for_quotes(group, raw, name, quoted):
    """``--params split.hash_salt=42`` (a salt, a seed-like number) reaches the schema as the number 42 (YAML
    reads it so), and a column named ``2024`` likewise: the fix is to quote the value, in --params as
    ``'split.hash_salt="42"'``. Was: the fix said ``pass --params split.hash_salt=<value>``, which gives the
    same number again and is refused the same way. Where the text typed is not known (no --params, no file
    writing it) the fix says to quote it as written: the number read may not be it (``0042`` is 34)."""
    with pytest.raises(ConfigError) as error:
        parse_group(group, raw)
    message = str(error.value)
    assert f"parameter {name} = " in message and "\n" not in message
    assert "read as a number" in message or "read as true or false" in message, message
    fix = message.split("Fix:")[1]
    assert "quote" in fix and quoted in fix, fix


@pytest.mark.parametrize(
    ("given", "group", "raw", "quoted"),
    [
        ("split.hash_salt=0042", "split", {"hash_salt": 34}, "'split.hash_salt=\"0042\"'"),
        ("split.text_column=007,train.seed=1", "split", {"text_column": 7}, "'split.text_column=\"007\"'"),
        ("split.hash_salt=1.50", "split", {"hash_salt": 1.5}, "'split.hash_salt=\"1.50\"'"),
        ("run_name=007", "run_name", 7, "'run_name=\"007\"'"),
        ("run_name=1.50", "run_name", 1.5, "'run_name=\"1.50\"'"),
    ],
    ids=["octal_salt", "leading_zeros_column", "float_salt", "run_name", "run_name_float"],
)
def test_a_text_parameter_typed_as_a_number_is_quoted_as_typed_in_params(given, group, raw, quoted):
    """``--params split.hash_salt=0042`` reaches the schema as 34 (YAML 1.1 reads a leading 0 as octal),
    ``run_name=007`` as 7, ``1.50`` as 1.5: the fix quotes the text typed in --params, not the number read.
    Was: ``'split.hash_salt="34"'``, ``'run_name="7"'``, which run with another salt or name."""
    with click.Context(click.Command("run")) as context:
        context.meta[RAW_PARAMS] = given
        with pytest.raises(ConfigError) as error:
            validate_run_name(raw) if group == "run_name" else parse_group(group, raw)
    message = str(error.value)
    assert "\n" not in message and quoted in message.split("Fix:")[1], message
    wrong = f'="{raw}"' if group == "run_name" else f'="{next(iter(raw.values()))}"'
    assert wrong not in message, message


@pytest.mark.parametrize(
    ("file", "text", "group", "raw", "quoted"),
    [
        (
            "base/parameters_split.yml",
            "split:\n  hash_salt: 0042  # salt\n",
            "split",
            {"hash_salt": 34},
            "0042",
        ),
        ("local/parameters.yml", "run_name: 007\n", "run_name", 7, "007"),
        ("local/parameters.yml", "split:\n  hash_salt: 1.50\n", "split", {"hash_salt": 1.5}, "1.50"),
    ],
    ids=["octal_salt", "run_name", "float_salt"],
)
def test_a_text_parameter_typed_as_a_number_is_quoted_as_its_file_writes_it(
    tmp_path, monkeypatch, file, text, group, raw, quoted
):
    """A parameters file writing ``hash_salt: 0042`` unquoted: the fix quotes the file's text, ``0042``, not
    the number YAML read (34)."""
    path = tmp_path / "conf" / file
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as error:
        validate_run_name(raw) if group == "run_name" else parse_group(group, raw)
    fix = str(error.value).split("Fix:")[1]
    name = "run_name" if group == "run_name" else "split.hash_salt"
    assert f"'{name}=\"{quoted}\"'" in fix, fix


@pytest.mark.parametrize(
    ("group", "raw", "name"),
    [
        ("train", {"fold": True}, "train.fold"),
        ("train", {"max_steps": True}, "train.max_steps"),
        ("train", {"early_stopping": {"patience": True}}, "train.early_stopping.patience"),
        ("train", {"optimizer": {"lr": True}}, "train.optimizer.lr"),
        ("report", {"top_k": False}, "report.top_k"),
    ],
    ids=["fold", "max_steps", "patience", "lr", "top_k"],
)
def test_true_or_false_where_a_number_is_expected_is_refused(group, raw, name):
    """YAML reads ``true`` as a boolean and pydantic's lax mode took it as 1: ``--params train.fold=true``
    trained fold 1, ``train.max_steps=true`` one step, and MLflow recorded 'True'."""
    with pytest.raises(ConfigError) as error:
        parse_group(group, raw)
    message = str(error.value)
    assert message.startswith(f"parameter {name} = ") and "true or false" in message, message


@pytest.mark.parametrize(
    ("group", "raw", "name"),
    [
        ("train", {"optimizer": {"lr": float("inf")}}, "train.optimizer.lr"),
        ("train", {"epochs": float("inf"), "max_steps": None}, "train.epochs"),
        (
            "train",
            {"early_stopping": {"patience": 2, "min_delta": float("inf")}},
            "train.early_stopping.min_delta",
        ),
        ("predict", {"num_beams": 2, "length_penalty": float("nan")}, "predict.length_penalty"),
        ("predict", {"temperature": float("inf")}, "predict.temperature"),
        ("train", {"seed": -1}, "train.seed"),
        ("train", {"dataloader": {"num_workers": -1}}, "train.dataloader.num_workers"),
        ("train", {"dataloader": {"num_workers": 100000}}, "train.dataloader.num_workers"),
        ("train", {"runtime": {"num_threads": 10**12}}, "train.runtime.num_threads"),
    ],
    ids=[
        "lr_inf",
        "epochs_inf",
        "min_delta_inf",
        "length_penalty_nan",
        "temperature_inf",
        "seed",
        "workers",
        "workers_past_the_cap",
        "threads",
    ],
)
def test_values_the_run_cannot_use_are_one_line_before_it_starts(group, raw, name):
    """Each was accepted: a NaN length penalty ranked beams arbitrarily and wrote NaN into a JSON summary; an
    infinite learning rate trained until the loss became NaN; a negative seed, a negative worker count, an
    infinite epoch count or a huge thread count stopped the run with a Python traceback; 100000 DataLoader
    workers were taken and started as many processes."""
    with pytest.raises(ConfigError) as error:
        parse_group(group, raw)
    message = str(error.value)
    assert message.startswith(f"parameter {name} = ") and "\n" not in message, message
    assert "Fix: " in message, message


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ({"checkpoint_dir": ""}, "train.checkpoint_dir"),
        ({"profile": {"enabled": True, "trace_dir": ""}}, "train.profile.trace_dir"),
        ({"model": {"name_or_path": ""}}, "train.model.name_or_path"),
    ],
    ids=["checkpoint_dir", "trace_dir", "name_or_path"],
)
def test_an_empty_folder_parameter_is_refused_in_one_line(raw, name):
    """An empty folder (``--params train.checkpoint_dir=`` to leave it out) was the project folder itself: the
    run's checkpoints went to ``./<run_name>/`` and ``runtime_choices.json`` beside conf/, the profile's
    traces likewise, exit 0; an empty model folder read ``/config.json``."""
    with pytest.raises(ConfigError) as error:
        parse_group("train", raw)
    message = str(error.value)
    assert message.startswith(f"parameter {name} = '' is invalid") and "\n" not in message, message
    assert "Fix: " in message, message


def test_a_value_given_for_a_group_of_parameters_names_its_keys():
    """``--params train.loss=0.1``: train.loss is a group; the message said "a valid dictionary or instance of
    LossParams" (a class name) and offered ``train.loss=<value>`` as the fix."""
    with pytest.raises(ConfigError) as error:
        parse_group("train", {"loss": 0.1})
    message = str(error.value)
    assert message.startswith("parameter train.loss = 0.1 is invalid: train.loss is a group of parameters")
    assert "LossParams" not in message and "train.loss.label_smoothing" in message, message
    assert "train.loss=<value>" not in message


def test_a_check_across_a_groups_keys_names_those_keys_not_the_whole_group():
    """``hidden_size`` not a multiple of ``num_attention_heads`` (a check of ``train.model`` as a whole): the
    line printed the whole group's mapping (about 900 characters) and offered ``train.model.<key>`` as the
    fix; it names the keys the check read and their values."""
    with pytest.raises(ConfigError) as error:
        parse_group("train", {"model": {"hidden_size": 32, "num_attention_heads": 5}})
    message = str(error.value)
    assert message.startswith(
        "parameters train.model.hidden_size = 32 and train.model.num_attention_heads = 5 are invalid together"
    ), message
    assert "must be a multiple of num_attention_heads 5" in message and "\n" not in message
    assert "{" not in message and "train.model.<key>" not in message and len(message) < 400, message


def test_texts_given_as_parameters_are_composed_as_the_training_texts_are():
    """The split composes every text (Unicode NFC), so a prompt template or report prompt saved decomposed (a
    conf file written on macOS, NFD Hangul jamo) was tokenized as other, never-trained characters."""
    import unicodedata

    template = unicodedata.normalize("NFD", "질문: {prompt}\n\n### 응답:\n")
    prompt = unicodedata.normalize("NFD", "배송")
    assert template != unicodedata.normalize("NFC", template)
    composed = unicodedata.normalize("NFC", template)
    assert parse_group("split", {"prompt_template": template}).prompt_template == composed
    assert parse_group("predict", {"input": "x.csv", "prompt_template": template}).prompt_template == composed
    assert parse_group("report", {"prompts": [prompt, ""]}).prompts == ["배송", ""]


def _conf(tmp_path, env: str, files: dict[str, dict]) -> Path:
    """A conf folder: conf/base/parameters_train.yml's defaults and ``files`` (name -> content) in ``env``."""
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "base" / "parameters_train.yml").write_text(yaml.safe_dump({"train": {"max_steps": 10}}))
    (conf / env).mkdir(exist_ok=True)
    for name, content in files.items():
        (conf / env / name).write_text(yaml.safe_dump(content))
    return conf


@pytest.mark.parametrize("env", ["quick", None])
def test_a_bad_value_set_under_an_environment_names_that_environments_file(tmp_path, env):
    """A value set in conf/<env>/ (``kedro run --env quick``) or conf/local/ overrides conf/base: the fix
    named conf/base/parameters_train.yml, where editing it changes nothing. It names the file that set it;
    a key that file does not hold keeps conf/base's."""
    from types import SimpleNamespace

    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Node, Pipeline

    from fastlm.hooks import ParametersValidHook

    folder = env or "local"
    conf = _conf(tmp_path, folder, {"parameters_train.yml": {"train": {"optimizer": {"lr": -1}}}})
    pipeline = Pipeline([Node(lambda train: train, "params:train", "out")])

    def refusal(train: dict, *, loader: bool) -> str:
        hook = ParametersValidHook()
        if loader:
            config = OmegaConfigLoader(str(conf), env=env, base_env="base", default_run_env="local")
            hook.after_context_created(SimpleNamespace(config_loader=config))
        catalog = DataCatalog({"params:train": MemoryDataset(train)})
        with pytest.raises(ConfigError) as raised:
            hook.before_pipeline_run({"env": env, "project_path": str(tmp_path)}, pipeline, catalog)
        return str(raised.value)

    for loader in (False, True):
        said = refusal({"max_steps": 10, "optimizer": {"lr": -1}}, loader=loader)
        assert f"set train.optimizer.lr in {conf / folder / 'parameters_train.yml'} " in said, said
        assert "conf/base" not in said
        said = refusal({"max_steps": 0}, loader=loader)  # a value the environment does not set: base's
        assert "train.max_steps" in said and "set train.max_steps in conf/base/parameters_train.yml" in said


@pytest.mark.parametrize("where", ["local", "base"])
def test_a_misspelled_key_names_the_file_that_writes_it(tmp_path, where):
    """``train: {optimzer: {lr: 0.001}}`` in conf/local/parameters_x.yml (or in conf/base/parameters.yml):
    the fix named conf/base/parameters_train.yml, a file without the key (the message names the misspelled
    group, ``train.optimzer``, not a value of it). It names the file that writes it; given in --params, the
    fix says to change it there first, as for a misspelled value."""
    from types import SimpleNamespace

    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Node, Pipeline

    from fastlm.hooks import ParametersValidHook

    name = "parameters_x.yml" if where == "local" else "parameters.yml"
    conf = _conf(tmp_path, where, {name: {"train": {"optimzer": {"lr": 0.001}}}})
    (conf / "local").mkdir(exist_ok=True)
    pipeline = Pipeline([Node(lambda train: train, "params:train", "out")])

    def fix(given: dict) -> str:
        hook = ParametersValidHook()
        config = OmegaConfigLoader(str(conf), base_env="base", default_run_env="local", runtime_params=given)
        hook.after_context_created(SimpleNamespace(config_loader=config))
        catalog = DataCatalog({"params:train": MemoryDataset({"optimzer": {"lr": 0.001}})})
        run = {"env": None, "project_path": str(tmp_path), "runtime_params": given}
        with pytest.raises(ConfigError) as raised:
            hook.before_pipeline_run(run, pipeline, catalog)
        said = str(raised.value)
        assert "\n" not in said and "unknown parameter train.optimzer (did you mean train.optimizer?)" in said
        return said.split(" Fix: ")[1]

    said = fix({})
    assert f"remove or correct it in {conf / where / name} " in said, said
    assert "parameters_train.yml" not in said, said
    said = fix({"train": {"optimzer": {"lr": 0.001}}})
    assert said.startswith("change train.optimzer.lr in this run's --params first"), said


def test_a_misspelled_key_given_with_params_alone_is_fixed_there_alone(tmp_path):
    """``kedro run --params train.optimzer.lr=1`` with no parameters file writing it: the fix said to change
    it in --params first, then "remove or correct it in conf/base/parameters_train.yml", a file without the
    key. It names --params alone."""
    from types import SimpleNamespace

    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Node, Pipeline

    from fastlm.hooks import ParametersValidHook

    conf = _conf(tmp_path, "local", {"parameters_train.yml": {"train": {"max_steps": 3}}})

    def refusal(given: dict) -> str:
        hook = ParametersValidHook()
        config = OmegaConfigLoader(str(conf), base_env="base", default_run_env="local", runtime_params=given)
        hook.after_context_created(SimpleNamespace(config_loader=config))
        pipeline = Pipeline([Node(lambda train: train, "params:train", "out")])
        catalog = DataCatalog({"params:train": MemoryDataset({"max_steps": 3, **given["train"]})})
        run = {"env": None, "project_path": str(tmp_path), "runtime_params": given}
        with pytest.raises(ConfigError) as raised:
            hook.before_pipeline_run(run, pipeline, catalog)
        return str(raised.value)

    said = refusal({"train": {"optimzer": {"lr": 1}}})
    assert "unknown parameter train.optimzer (did you mean train.optimizer?)" in said, said
    fix = said.split(" Fix: ")[1]
    assert fix == "correct train.optimzer.lr in this run's --params: no parameters file writes it.", fix
    # the key suggested is written in conf/local: that file does not write the misspelled one
    said = refusal({"train": {"max_step": 5}})
    assert "unknown parameter train.max_step (did you mean train.max_steps?)" in said, said
    fix = said.split(" Fix: ")[1]
    assert fix == "correct train.max_step in this run's --params: no parameters file writes it.", fix


def test_a_bad_key_of_a_sweep_file_given_with_params_is_fixed_in_the_file(tmp_path):
    """``--params sweep=conf/local/sweeps/bad.yml`` whose file writes ``max_step: 2``: the fix said "change
    sweep in this run's --params first (a --params value overrides every parameters file: editing one changes
    nothing while it is given)", as if the file's key were a --params value; editing the file is the fix."""
    from types import SimpleNamespace

    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Node, Pipeline

    from fastlm.hooks import ParametersValidHook

    conf = _conf(tmp_path, "local", {})
    sweep = tmp_path / "bad.yml"
    sweep.write_text("name: bad\nmax_step: 2\ngrid:\n  train.optimizer.lr: [0.1]\n", encoding="utf-8")
    given = {"sweep": str(sweep)}
    hook = ParametersValidHook()
    config = OmegaConfigLoader(str(conf), base_env="base", default_run_env="local", runtime_params=given)
    hook.after_context_created(SimpleNamespace(config_loader=config))
    pipeline = Pipeline([Node(lambda sweep: sweep, "params:sweep", "out")])
    catalog = DataCatalog({"params:sweep": MemoryDataset(str(sweep))})
    run = {"env": None, "project_path": str(tmp_path), "runtime_params": given}
    with pytest.raises(ConfigError) as raised:
        hook.before_pipeline_run(run, pipeline, catalog)
    said = str(raised.value)
    assert "unknown parameter max_step (did you mean max_steps?)" in said, said
    fix = said.split(" Fix: ")[1]
    assert "--params" not in fix and f"remove or correct it in sweep file {sweep}" in fix, fix


def test_a_bad_value_given_with_params_is_to_be_changed_there_first(tmp_path):
    """``kedro run --params train.optimizer.lr=-1``: the fix named a parameters file to set it in, though
    the --params value overrides every file (editing one changed nothing while it was given). It says to
    change the --params value first, in an environment whose file sets the key too and in one whose does
    not (or in the --config file whose run.params reached the run as --params do); a value that came from a
    file alone keeps the fix naming that file."""
    from types import SimpleNamespace

    import click
    from kedro.config import OmegaConfigLoader
    from kedro.io import DataCatalog, MemoryDataset
    from kedro.pipeline import Node, Pipeline

    from fastlm.hooks import ParametersValidHook

    conf = _conf(tmp_path, "local", {"parameters_train.yml": {"train": {"max_steps": 0}}})
    pipeline = Pipeline([Node(lambda train: train, "params:train", "out")])

    def fix(train: dict, given: dict) -> str:
        hook = ParametersValidHook()
        config = OmegaConfigLoader(str(conf), base_env="base", default_run_env="local", runtime_params=given)
        hook.after_context_created(SimpleNamespace(config_loader=config))
        catalog = DataCatalog({"params:train": MemoryDataset(train)})
        run = {"env": None, "project_path": str(tmp_path), "runtime_params": given}
        with pytest.raises(ConfigError) as raised:
            hook.before_pipeline_run(run, pipeline, catalog)
        said = str(raised.value)
        assert "\n" not in said
        return said.split(" Fix: ")[1]

    said = fix({"max_steps": 10, "optimizer": {"lr": -1}}, {"train": {"optimizer": {"lr": -1}}})
    assert said.startswith("change train.optimizer.lr in this run's --params first"), said
    said = fix({"max_steps": -3}, {"train": {"max_steps": -3}})  # conf/local sets it too: --params wins
    assert said.startswith("change train.max_steps in this run's --params first"), said
    with click.Context(click.Command("run"), default_map={"params": {"train": {"max_steps": -3}}}):
        said = fix({"max_steps": -3}, {"train": {"max_steps": -3}})  # kedro run --config FILE
    assert said.startswith(
        "change train.max_steps in this run's --params (or its --config file's run.params) first"
    ), said
    said = fix({"max_steps": 0}, {"train": {"optimizer": {"lr": 0.1}}})  # another key given: the file's
    assert said.startswith(f"set train.max_steps in {conf / 'local' / 'parameters_train.yml'} "), said


@pytest.mark.parametrize(
    ("name", "renamed"),
    [
        ("parameter_split.yml", "parameters_split.yml"),
        ("params.yml", "parameters.yml"),
        ("Parameters_split.yaml", "parameters_split.yaml"),
        ("split.yml", "parameters_split.yml"),
    ],
)
def test_a_parameters_file_kedro_does_not_read_is_refused_naming_the_name_it_reads(tmp_path, name, renamed):
    """``conf/local/parameter_split.yml`` (or ``params.yml``, a capital P): Kedro reads parameters from files
    named ``parameters*`` alone, so its ``split.max_samples: 99`` was dropped without a word and the split
    ran on the defaults, over the outputs. Refused before any node runs, naming the file, what it sets and
    the name Kedro reads; such a file of another environment, a sweep file and a catalog are left alone."""
    from types import SimpleNamespace

    from kedro.config import OmegaConfigLoader

    from fastlm.engine.paths import project_name
    from fastlm.hooks import UnknownRuntimeParamsHook

    conf = _conf(tmp_path, "local", {name: {"split": {"max_samples": 99}, "run_name": "x"}})
    _conf_extra = {
        "quick/params.yml": {"split": {"max_samples": 5}},  # another environment: not this run's
        "base/sweeps/mine.yml": {"name": "mine", "train": {"seed": 1}},
        "local/catalog_extra.yml": {"train": {"type": "pandas.CSVDataset", "filepath": "x.csv"}},
    }
    for path, content in _conf_extra.items():
        (conf / path).parent.mkdir(parents=True, exist_ok=True)
        (conf / path).write_text(yaml.safe_dump(content))

    def run(env, file_name=None):
        hook = UnknownRuntimeParamsHook()
        loader = OmegaConfigLoader(str(conf), env=env, base_env="base", default_run_env="local")
        hook.after_context_created(SimpleNamespace(config_loader=loader, params={}))
        hook.before_pipeline_run({"env": env, "project_path": str(tmp_path)}, None, None)

    with pytest.raises(ConfigError) as raised:
        run(None)
    said = str(raised.value)
    assert said.startswith(f"{project_name(conf / 'local' / name)} is not read") and "\n" not in said, said
    assert "run_name, split" in said and f"rename it to {project_name(conf / 'local' / renamed)}" in said
    (conf / "local" / name).unlink()
    run(None)  # nothing else refused: the other environment's file, the sweep file, the catalog


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ({"spilt": {"max_samples": 99}}, "sets spilt, which no node reads (did you mean split?)"),
        ({"split.max_samples": 99}, "sets split.max_samples, which no node reads"),
        ({"Train": {"max_steps": 3}}, "sets Train, which no node reads (did you mean train?)"),
    ],
    ids=["misspelled_group", "dotted_key", "capital"],
)
def test_a_misspelled_top_level_key_in_a_parameters_file_is_refused(tmp_path, content, said):
    """``spilt: {max_samples: 99}`` in conf/local/parameters.yml (or ``split.max_samples: 99``, one key with a
    dot in its name, not a path): the --params spelling is refused, the file's was taken as a parameter of
    its own that no node reads, and the split ran on the defaults, exit 0. A name of the user's own that is
    no near miss of one fastlm reads, or one a conf file interpolates, is left alone."""
    from types import SimpleNamespace

    from kedro.config import OmegaConfigLoader

    from fastlm.hooks import UnknownRuntimeParamsHook

    conf = _conf(tmp_path, "local", {"parameters.yml": content})

    def run():
        hook = UnknownRuntimeParamsHook()
        loader = OmegaConfigLoader(str(conf), base_env="base", default_run_env="local")
        hook.after_context_created(SimpleNamespace(config_loader=loader, params={}))
        hook.before_pipeline_run({"env": None, "project_path": str(tmp_path)}, None, None)

    with pytest.raises(ConfigError) as raised:
        run()
    message = str(raised.value)
    assert said in message and "parameters.yml" in message and "\n" not in message, message
    own = {"experiment_notes": "baseline", "max_len": 48, "split": {"max_length": "${max_len}"}}
    (conf / "local" / "parameters.yml").write_text(yaml.safe_dump(own))
    run()
