"""`kedro run` node and runner selection: a name that is not there is one line naming the option, the close
match and the names there are (was: Kedro's ValueError / AttributeError traceback, status 1)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kedro.framework.project import configure_project, pipelines
from kedro.utils import load_obj

from fastlm.cli import check_runner_params, selection_error
from fastlm.errors import ConfigError
from fastlm.hooks import load_versions_error
from tests.support import background
from tests.support.project import demo_texts, make_kedro_project, refusal_in_background, refused_line


@pytest.fixture(autouse=True)
def project():
    """The project's pipelines, as `kedro run` configures them before it selects nodes."""
    configure_project("fastlm")


def register_pipelines():
    return pipelines


def _raised(call, *args, **kwargs) -> Exception:
    with pytest.raises(Exception) as raised:
        call(*args, **kwargs)
    return raised.value


@pytest.mark.parametrize(
    ("option", "keyword", "value"),
    [
        ("--nodes", "node_names", ("plot_trainig",)),
        ("--from-nodes", "from_nodes", ["plot_trainig"]),
        ("--to-nodes", "to_nodes", ["plot_trainig"]),
    ],
)
def test_an_unknown_node_name_is_one_line_naming_the_option_and_the_close_match(option, keyword, value):
    report = register_pipelines()["report"]
    exc = _raised(report.filter, **{keyword: list(value)})
    error = selection_error(exc, {"pipelines": ["report"], keyword: value})
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert f"{option} plot_trainig" in str(error) and "did you mean plot_training?" in str(error)
    assert all(node.name in str(error) for node in report.nodes)  # the names there are


def test_an_unknown_dataset_or_namespace_or_runner_is_one_line():
    report = register_pipelines()["report"]
    exc = _raised(report.filter, to_outputs=["loss_plt"])
    error = selection_error(exc, {"pipelines": ["report"], "to_outputs": ["loss_plt"]})
    assert "--to-outputs loss_plt" in str(error) and "did you mean loss_plot?" in str(error)

    exc = _raised(register_pipelines()["__default__"].filter, node_namespaces=["train"])
    error = selection_error(exc, {"pipelines": [], "namespaces": ["train"]})
    assert "--namespaces train" in str(error) and "--tags train" in str(error)

    exc = _raised(load_obj, "ThreadRuner", "kedro.runner")
    error = selection_error(exc, {"runner": "ThreadRuner"})
    assert "--runner ThreadRuner" in str(error) and "did you mean ThreadRunner?" in str(error)
    assert "\n" not in str(error)


def test_other_errors_are_not_selection_errors():
    assert selection_error(ValueError("something else"), {"pipelines": ["report"]}) is None
    assert selection_error(AttributeError("module 'torch' has no attribute 'x'"), {"runner": None}) is None


def test_a_runner_named_by_its_module_path_is_one_line_too():
    """``--runner kedro.runner.ThreadRuner`` (Kedro takes a runner's full path too): its AttributeError was
    not read as an unknown runner, so the run ended in a traceback, status 1."""
    exc = _raised(load_obj, "kedro.runner.ThreadRuner", "kedro.runner")
    error = selection_error(exc, {"runner": "kedro.runner.ThreadRuner"})
    assert isinstance(error, ConfigError), exc
    assert "--runner kedro.runner.ThreadRuner" in str(error) and "did you mean ThreadRunner?" in str(error)


def test_an_unknown_tag_is_one_line_naming_it_and_the_tags_there_are():
    """``kedro run --pipeline=report --tags reprot``: said as a pipeline without nodes in this version, with
    the fix to run the split, naming neither the tag nor the tags there are."""
    exc = _raised(register_pipelines()["report"].filter, tags=["reprot"])
    error = selection_error(exc, {"pipelines": ["report"], "tags": ("reprot",)})
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert "--tags reprot" in str(error) and "did you mean report?" in str(error)
    assert "--pipeline=split" not in str(error)


@pytest.mark.parametrize(
    ("runner", "given", "named", "accepted"),
    [
        ("ParallelRunner", {"max_workers": "two"}, "max_workers=two", "max_workers"),
        (None, {"max_workers": 2}, "max_workers", "is_async"),
        ("ThreadRunner", {"workers": 2}, "workers", "max_workers"),
        (None, {"is_async": "maybe"}, "is_async=maybe", "is_async"),
    ],
    ids=["workers_not_a_number", "sequential_has_no_workers", "unknown_name", "async_not_bool"],
)
def test_bad_runner_params_are_one_line_naming_the_option_and_what_the_runner_accepts(
    runner, given, named, accepted
):
    """``--runner-params`` (as Kedro parses them) naming what the runner does not take, or a value it cannot
    use: Kedro's traceback, status 1, or ``is_async=maybe`` taken as true. One line naming
    ``--runner-params``, the value and what the runner accepts."""
    with pytest.raises(ConfigError) as raised:
        check_runner_params(runner, given)
    said, fix = str(raised.value).split("Fix:")
    assert "\n" not in said and "--runner-params" in said and named in said, said
    assert accepted in fix, fix


def selection_refusals(folder: Path) -> dict:
    """A background job: the CLI refusals of this file, one after the other in one new project."""
    project = make_kedro_project(folder / "project", list(demo_texts()))
    runs = {
        "runner_params": (
            "--pipeline=report",
            "--runner",
            "ThreadRunner",
            "--runner-params",
            "max_workers=0",
        ),
        "load_versions": ("--pipeline=split", "--load-versions", f"split_report:{VERSION}"),
        "to_outputs": ("--pipeline=report", "--to-outputs", "loss_plt"),
    }
    return {name: refusal_in_background(project, *args) for name, args in runs.items()}


@pytest.mark.background(job=selection_refusals)
def test_bad_runner_params_on_the_command_line_are_one_line_and_status_2():
    """``kedro run --runner ThreadRunner --runner-params max_workers=0``: one line, status 2 (``refused_line``
    asserts both and that nothing was written), naming the option and what the runner accepts."""
    last = refused_line(background.result(selection_refusals)["runner_params"])
    said, fix = last.split("Fix:")
    assert "--runner-params" in said and "max_workers=0" in said, last
    assert "max_workers" in fix, last


VERSION = "2024-01-01T00.00.00.000Z"
NOTES = {"type": "text.TextDataset", "filepath": "data/08_reporting/notes.txt", "versioned": True}


@pytest.mark.parametrize("versioned", [False, True], ids=["none_versioned", "one_versioned"])
def test_load_versions_of_a_dataset_that_is_not_versioned_is_refused_naming_it(versioned):
    """``--load-versions split_report:<version>`` on a dataset without ``versioned: true``: Kedro ignored
    it, the run read the latest data, not the version asked, without a word. Refused in one line naming the
    dataset, that it is not versioned and the datasets that are (if any)."""
    catalog = {"split_report": {"type": "json.JSONDataset", "filepath": "data/08_reporting/split.json"}}
    if versioned:  # a versioned entry no node uses: named as the one that can be given a version
        catalog["notes"] = NOTES
    error = load_versions_error({"split_report": VERSION}, catalog)
    said, fix = str(error).split("Fix:")
    assert "\n" not in said and "--load-versions split_report" in said and "not versioned" in said, said
    assert ("notes" in fix) == versioned and ("no dataset" in fix) != versioned, fix
    assert load_versions_error({"notes": VERSION}, {"notes": NOTES}) is None


def test_load_versions_of_an_unknown_dataset_is_one_line_with_the_close_match():
    """An unknown name: Kedro's DatasetNotFoundError traceback, status 1. One line, with the close match."""
    error = load_versions_error({"split_reprot": VERSION}, {"split_report": {"type": "json.JSONDataset"}})
    assert "--load-versions split_reprot" in str(error) and "did you mean split_report?" in str(error)


@pytest.mark.background(job=selection_refusals)
def test_load_versions_on_the_command_line_is_refused_before_any_node_runs():
    """The hook refuses ``--load-versions`` of the project's unversioned ``split_report`` in a real CLI
    run: one line, status 2, nothing written."""
    refusal = background.result(selection_refusals)["load_versions"]
    last = refused_line(refusal)
    assert "Running node" not in refusal["done"].stderr, refusal["done"].stderr[-3000:]
    assert "--load-versions split_report" in last and "not versioned" in last, last


@pytest.mark.background(job=selection_refusals)
def test_an_unknown_to_outputs_name_lists_only_the_datasets_nodes_output():
    """``--to-outputs`` with a name the pipeline does not output: the names there are listed every dataset,
    ``params:*`` entries and inputs no node writes among them. Only what the pipeline's nodes output."""
    report = register_pipelines()["report"]
    last = refused_line(background.result(selection_refusals)["to_outputs"])
    listed = last.split("use one of:")[1].strip().rstrip(".").split(", ")
    assert sorted(listed) == sorted(report.all_outputs()), last
    assert "--to-outputs loss_plt" in last and "did you mean loss_plot?" in last, last


def test_a_misspelled_pipeline_is_one_line_with_the_close_match():
    """``kedro run --pipeline=trian``: refused in one line naming the pipelines there are, but without the
    close match a misspelled ``--env`` gets."""
    exc = ValueError(
        "Failed to find the pipeline named 'trian'. It needs to be generated and returned by the "
        "'register_pipelines' function."
    )
    error = selection_error(exc, {"pipelines": ["trian"]})
    assert isinstance(error, ConfigError) and "\n" not in str(error)
    assert "unknown pipeline 'trian' (did you mean train?)" in str(error), error
    assert "use one of: predict, report, split, sweep, train, tune" in str(error)

    error = selection_error(ValueError("Failed to find the pipeline named 'xyz'."), {"pipelines": ["xyz"]})
    assert "unknown pipeline 'xyz'." in str(error) and "did you mean" not in str(error), error


def test_a_misspelled_pipeline_is_refused_before_kedro_starts_its_session(monkeypatch):
    """``kedro run --pipeline=trian`` was refused only after Kedro had made its session and failed to read the
    parameters of the unknown pipeline (a "Could not import pipelines" warning above the refusal): now it is
    refused before Kedro's run starts, in the same one line."""
    from click.testing import CliRunner

    from fastlm import cli

    started = []
    monkeypatch.setattr(cli.kedro_run, "callback", lambda **kwargs: started.append(kwargs))
    monkeypatch.setattr(cli, "in_project_folder", lambda: None)
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)  # the test session's handlers stay
    done = CliRunner().invoke(cli.run, ["--pipeline=trian"])
    assert done.exit_code != 0 and not started, (done.exit_code, started)
    assert "unknown pipeline 'trian' (did you mean train?)" in done.output, done.output
    assert CliRunner().invoke(cli.run, ["--pipeline=report,train"]).exit_code == 0 and started
