"""Nodes are adapters between the catalog and the Kedro-free packages: no file paths, no working-directory
checks, no MLflow and no plotting of their own. Paths and the run's tracker reach them through the catalog,
filled by hooks before any node runs."""

import ast
from pathlib import Path

import pytest
import yaml
from kedro.io import DataCatalog, MemoryDataset
from kedro.pipeline import Node, Pipeline
from kedro_datasets.json import JSONDataset
from kedro_datasets.yaml import YAMLDataset

from fastlm.hooks import DatasetPathsHook, RunTrackerHook, TunedParametersHook
from fastlm.tracking import RunTracker

PIPELINES = Path(__file__).resolve().parents[2] / "src" / "fastlm" / "pipelines"
ADAPTERS = ["train", "report", "tune", "split", "sweep", "predict"]


def _problems(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom | ast.Import):
            modules = (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            )
            names = [alias.name for alias in node.names] if isinstance(node, ast.ImportFrom) else []
            found += [f"imports {m}" for m in modules if m.split(".")[0] in ("mlflow", "matplotlib", "os")]
            module = getattr(node, "module", None)
            if module == "fastlm.tracking":
                found += [f"imports fastlm.tracking.{n}" for n in names if n != "RunTracker"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(("data/", "conf/", "./data", "./conf")):
                found.append(f"path constant {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in (
            "is_file",
            "is_dir",
            "exists",
            "cwd",
            "getcwd",
        ):
            found.append(f"file-system check .{node.attr}")
        elif isinstance(node, ast.Attribute) and node.attr in (
            "search_training_runs",
            "log_metrics",
            "start_run",
        ):
            found.append(f"MLflow call .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in ("Figure", "plt"):
            found.append(f"draws with {node.id}")
    return found


@pytest.mark.parametrize("pipeline", ADAPTERS)
def test_nodes_hold_no_path_no_tracking_call_and_no_plotting(pipeline):
    assert _problems((PIPELINES / pipeline / "nodes.py").read_text(encoding="utf-8")) == []


def test_the_check_itself_finds_each_kind_of_problem():
    source = (
        "import mlflow\nfrom matplotlib.figure import Figure\nfrom fastlm.tracking import MlflowMetrics\n"
        'X = "data/05_model_input/x"\nPath(X).is_file()\ncomparison.search_training_runs()\n'
    )
    assert len(_problems(source)) == 6


def _catalog(tmp_path) -> DataCatalog:
    return DataCatalog(
        {
            "raw": JSONDataset(filepath=str(tmp_path / "raw.json")),
            "out": JSONDataset(filepath=str(tmp_path / "out" / "out.json")),
            "dataset_paths": MemoryDataset(),
            "run_tracker": MemoryDataset(copy_mode="assign"),
        }
    )


def test_hooks_hand_the_nodes_the_catalogs_paths_and_one_tracker(tmp_path):
    catalog = _catalog(tmp_path)
    pipeline = Pipeline(
        [Node(lambda raw, paths, tracker: raw, ["raw", "dataset_paths", "run_tracker"], "out")]
    )
    DatasetPathsHook().before_pipeline_run({}, pipeline, catalog)
    RunTrackerHook().before_pipeline_run({}, pipeline, catalog)
    assert catalog.load("dataset_paths") == {
        "raw": str(tmp_path / "raw.json"),
        "out": str(tmp_path / "out/out.json"),
    }
    tracker = catalog.load("run_tracker")
    assert isinstance(tracker, RunTracker) and catalog.load("run_tracker") is tracker  # one object per run


def test_a_pipeline_that_does_not_ask_gets_neither(tmp_path):
    catalog = _catalog(tmp_path)
    pipeline = Pipeline([Node(lambda raw: raw, "raw", "out")])
    DatasetPathsHook().before_pipeline_run({}, pipeline, catalog)
    RunTrackerHook().before_pipeline_run({}, pipeline, catalog)
    assert not catalog.exists("dataset_paths") and not catalog.exists("run_tracker")


def _tuned_file(batching: dict) -> str:
    """A tuned parameters file setting ``batching``, measured on the defaults' settings on this machine."""
    from fastlm.corpus.config import parse_split_params
    from fastlm.engine.config import TrainParams
    from fastlm.pipelines.tune.record import RECORD_KEY, device_description, measured_on

    record = measured_on(
        TrainParams(),
        max_length=parse_split_params({}).max_length,
        data=None,
        device=device_description("auto"),
    )
    return yaml.safe_dump({"train": {"batching": batching}, RECORD_KEY: record})


def test_a_training_run_says_that_the_tuned_parameters_file_is_in_effect(tmp_path, caplog):
    tuned = tmp_path / "parameters_tuned.yml"
    catalog = DataCatalog(
        {
            "tuned_parameters": YAMLDataset(filepath=str(tuned)),
            "params:train": MemoryDataset({"batching": {"micro_batch_size": 6}}),
            "params:split": MemoryDataset({}),
        }
    )
    training = Pipeline([Node(lambda train: train, "params:train", "trained_model")])
    with caplog.at_level("INFO", logger="fastlm.hooks"):
        TunedParametersHook().before_pipeline_run({}, training, catalog)  # no file yet: nothing to say
        tuned.write_text(_tuned_file({"micro_batch_size": 6}))
        TunedParametersHook().before_pipeline_run(
            {}, Pipeline([Node(lambda t: t, "params:train", "x")]), catalog
        )
        TunedParametersHook().before_pipeline_run({}, training, catalog)
    assert [record.getMessage() for record in caplog.records] == [
        f"{tuned} is in effect (from `kedro run --pipeline=tune`): micro_batch_size=6; delete it to go back "
        "to conf/base"
    ]


def test_the_tuned_file_is_said_to_be_in_effect_only_where_it_is(tmp_path, caplog):
    """Under another environment (``--env quick`` reads conf/base and conf/quick, not conf/local) the tuned
    file is not in effect; where a value given elsewhere (``--params``) overrides it, the line names the
    file's value and the one in effect (it printed the effective settings as the file's)."""
    tuned = tmp_path / "local" / "parameters_tuned.yml"
    tuned.parent.mkdir()
    tuned.write_text(_tuned_file({"micro_batch_size": 4, "gradient_accumulation_steps": 2}))
    catalog = DataCatalog(
        {
            "tuned_parameters": YAMLDataset(filepath=str(tuned)),
            "params:train": MemoryDataset(
                {"batching": {"micro_batch_size": 16, "gradient_accumulation_steps": 2}}
            ),
            "params:split": MemoryDataset({}),
        }
    )
    training = Pipeline([Node(lambda train: train, "params:train", "trained_model")])
    with caplog.at_level("INFO", logger="fastlm.hooks"):
        TunedParametersHook().before_pipeline_run({"env": "quick"}, training, catalog)
        quick = [record.getMessage() for record in caplog.records]
        caplog.clear()
        TunedParametersHook().before_pipeline_run({"env": None}, training, catalog)
        local = [record.getMessage() for record in caplog.records]
    assert len(quick) == 1 and "not read under --env quick" in quick[0] and "not used" in quick[0]
    assert len(local) == 1 and "micro_batch_size=4" in local[0] and "micro_batch_size=16" in local[0]
    assert "overrides" in local[0]


def test_a_tune_run_under_another_environment_says_train_will_not_read_its_file(tmp_path, caplog):
    """``kedro run --pipeline=tune --env quick`` writes conf/local/parameters_tuned.yml, which a train run
    under the same ``--env quick`` does not read: said once the file is written (it said "the train pipeline
    picks them up")."""
    tuned = tmp_path / "local" / "parameters_tuned.yml"
    tuned.parent.mkdir()
    tuned.write_text("train: {batching: {micro_batch_size: 4}}\n")
    catalog = DataCatalog({"tuned_parameters": YAMLDataset(filepath=str(tuned))})
    tuning = Pipeline([Node(lambda: {}, None, "tuned_parameters")])
    with caplog.at_level("INFO", logger="fastlm.hooks"):
        TunedParametersHook().after_pipeline_run({"env": "quick"}, tuning, catalog)
        quick = [record.getMessage() for record in caplog.records]
        caplog.clear()
        TunedParametersHook().after_pipeline_run({"env": None}, tuning, catalog)
        local = [record.getMessage() for record in caplog.records]
    assert len(quick) == 1 and "--env quick" in quick[0] and "not read" in quick[0]
    assert "kedro run --pipeline=train" in quick[0]
    assert local == []  # the default environment reads conf/local: the tune node's own line says so


def test_a_sweep_does_not_apply_a_tuned_file_measured_on_other_settings(tmp_path, caplog):
    """A sweep trains from ``params:train`` as a train run does: a tuned file measured on another split
    (here another ``split.max_length``) is not applied to its runs either, said in one warning (it was
    applied silently: the check ran for pipelines writing ``trained_model`` only)."""
    from fastlm.corpus.config import parse_split_params

    tuned = tmp_path / "local" / "parameters_tuned.yml"
    tuned.parent.mkdir()
    tuned.write_text(_tuned_file({"micro_batch_size": 4}))
    other_length = parse_split_params({}).max_length // 2
    catalog = DataCatalog(
        {
            "tuned_parameters": YAMLDataset(filepath=str(tuned)),
            "params:train": MemoryDataset({"batching": {"micro_batch_size": 4}}),  # the file merged in
            "params:split": MemoryDataset({"max_length": other_length}),
        }
    )
    sweep = Pipeline([Node(lambda train: train, "params:train", "sweep_comparison")])
    with caplog.at_level("INFO", logger="fastlm.hooks"):  # no conf folder there: the defaults
        TunedParametersHook().before_pipeline_run(
            {"env": None, "project_path": str(tmp_path)}, sweep, catalog
        )
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and "is not applied" in lines[0] and "split.max_length" in lines[0], lines
    assert "micro_batch_size" not in (catalog.load("params:train").get("batching") or {})


@pytest.mark.parametrize("text", ["", "{}\n", "train: {}\n", "train:\n  batching: {}\n"])
def test_a_tuned_file_that_sets_nothing_says_nothing(tmp_path, caplog, text):
    """An empty tuned file (emptied by hand, or ``{}``) sets no train setting: nothing to apply or refuse, and
    ``params:train`` is as the other files give it (it warned that the file 'was measured on other settings
    ... written by an older version')."""
    tuned = tmp_path / "local" / "parameters_tuned.yml"
    tuned.parent.mkdir()
    tuned.write_text(text)
    train = {"batching": {"micro_batch_size": 6}}
    catalog = DataCatalog(
        {
            "tuned_parameters": YAMLDataset(filepath=str(tuned)),
            "params:train": MemoryDataset(train),
            "params:split": MemoryDataset({}),
        }
    )
    training = Pipeline([Node(lambda train: train, "params:train", "trained_model")])
    with caplog.at_level("INFO", logger="fastlm.hooks"):
        TunedParametersHook().before_pipeline_run({"env": None}, training, catalog)
    assert [record.getMessage() for record in caplog.records] == []
    assert catalog.load("params:train") == train
