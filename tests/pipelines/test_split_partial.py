"""A run of the split's first nodes only (`kedro run --pipeline=split --to-nodes=tokenize_corpus`, or
`--nodes`, `--from-nodes` leaving out the nodes that finish it): the split is left unfinished, and the run
says so at its end, with the command that finishes it."""

import logging

import pytest
import yaml
from kedro.framework.hooks import specs
from kedro.framework.hooks.markers import HOOK_NAMESPACE
from kedro.io import DataCatalog
from pluggy import PluginManager

from fastlm.errors import InputDataError
from fastlm.hooks import OnlyMissingOutputsHook
from fastlm.hooks.split_complete import SPLIT_COMPLETE, SplitCompleteHook
from fastlm.pipelines import train
from fastlm.pipelines.split import create_pipeline
from tests.support.project import PROJECT_ROOT, write_jsonl


def _catalog():
    """The project's catalog (conf/base/catalog.yml), as a run builds it."""
    return DataCatalog.from_config(
        yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text("utf-8"))
    )


def _run(hook, pipeline, run_params, *more_hooks):
    """The hooks Kedro calls, by keyword, for a run of ``pipeline`` that succeeds (each node's outputs saved
    after it; the nodes of ``pipeline`` as the hooks leave it, as Kedro's runner runs them)."""
    manager = PluginManager(HOOK_NAMESPACE)
    for spec in (specs.NodeSpecs, specs.PipelineSpecs, specs.DatasetSpecs):
        manager.add_hookspecs(spec)
    for each in (hook, *more_hooks):
        manager.register(each)
    catalog = _catalog()
    manager.hook.before_pipeline_run(run_params=run_params, pipeline=pipeline, catalog=catalog)
    for node in pipeline.nodes:
        manager.hook.after_node_run(
            node=node, catalog=catalog, inputs={}, outputs={}, is_async=False, run_id=None
        )
        for output in node.outputs:
            manager.hook.before_dataset_saved(dataset_name=output, data=None, node=node)
            manager.hook.after_dataset_saved(dataset_name=output, data=None, node=node)
    manager.hook.after_pipeline_run(run_params=run_params, run_result={}, pipeline=pipeline, catalog=catalog)


@pytest.mark.parametrize(
    ("selection", "left_out"),
    [
        ({"to_nodes": ["tokenize_corpus"]}, "report_split"),
        ({"to_nodes": ["build_tokenizer"]}, "tokenize_corpus, report_split"),
    ],
)
def test_a_partial_split_run_says_at_its_end_that_the_split_is_unfinished(
    tmp_path, monkeypatch, caplog, sample_texts, selection, left_out
):
    """Was: exit 0 and nothing said; train then refused the split as one that did not finish."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data/05_model_input").mkdir(parents=True)
    write_jsonl(tmp_path / "data/01_raw/demo_corpus.jsonl", sample_texts[:20])
    params = {"env": "quick", "runtime_params": {"split": {"max_length": 24}}}
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        _run(SplitCompleteHook(), create_pipeline().filter(**selection), params)
    said = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(said) == 1, said
    assert "split is not complete" in said[0] and left_out in said[0], said[0]
    assert "kedro run --pipeline=split --env quick" in said[0] and "--params" in said[0], said[0]
    assert not (tmp_path / "data/05_model_input" / SPLIT_COMPLETE).exists()

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        _run(SplitCompleteHook(), create_pipeline(), {})  # the whole split: finished, nothing said
    assert not [record for record in caplog.records if record.levelno == logging.WARNING]
    assert (tmp_path / "data/05_model_input" / SPLIT_COMPLETE).exists()


# Every file output of a finished split, as the catalog names it (what ``exists`` looks for)
_SPLIT_FILES = {
    "corpus_splits": "data/03_primary/corpus_splits.parquet",
    "split_counts": "data/02_intermediate/split_counts.json",
    "tokenizer": "data/06_models/tokenizer/tokenizer_config.json",
    "tokenized_corpus": "data/05_model_input/tokenized_corpus/dataset_dict.json",
    "tokenized_corpus_fingerprint": "data/05_model_input/tokenized_corpus_fingerprint.json",
    "split_report": "data/08_reporting/split_report.json",
    "split_summary": "data/08_reporting/split_summary.csv",
}


def _split_outputs(root, *, missing=(), finished=True):
    for name, path in _SPLIT_FILES.items():
        if name not in missing:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text("{}", encoding="utf-8")
    (root / "data/05_model_input").mkdir(parents=True, exist_ok=True)
    if finished:
        (root / "data/05_model_input" / SPLIT_COMPLETE).write_text('{"outputs": [], "raw": null}\n', "utf-8")


def test_only_missing_outputs_on_a_finished_split_runs_its_later_nodes_and_keeps_it_finished(
    tmp_path, monkeypatch, caplog
):
    """`kedro run --pipeline=split --only-missing-outputs` with split_report.json gone: Kedro runs
    tokenize_corpus and report_split (the length stats are held in memory), as `--from-nodes tokenize_corpus`.
    Was: the hooks were handed the whole split, so the marker was removed and never written again (train then
    refused the finished split) and the run warned "this run left out , so ..."."""
    monkeypatch.chdir(tmp_path)
    _split_outputs(tmp_path, missing=("split_report",))
    pipeline = create_pipeline()
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        _run(OnlyMissingOutputsHook(), pipeline, {"only_missing_outputs": True}, SplitCompleteHook())
    assert sorted(node.name for node in pipeline.nodes) == ["report_split", "tokenize_corpus"]
    assert not [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert (tmp_path / "data/05_model_input" / SPLIT_COMPLETE).exists()


def test_only_missing_outputs_does_not_train_on_an_unfinished_split(tmp_path, monkeypatch):
    """`kedro run --only-missing-outputs` (split, then train) with the split's outputs all there but its
    marker missing (a split stopped part way): Kedro skips the split's nodes and trains. Was: the hooks saw
    the split's nodes in the run and let train read the unfinished split; now refused in one line, as
    `--pipeline=train` is."""
    monkeypatch.chdir(tmp_path)
    _split_outputs(tmp_path, finished=False)
    pipeline = create_pipeline() + train.create_pipeline()
    with pytest.raises(InputDataError, match="split that did not finish"):
        _run(OnlyMissingOutputsHook(), pipeline, {"only_missing_outputs": True}, SplitCompleteHook())
    assert [node.name for node in pipeline.nodes] == ["train_model"]


def test_an_unfinished_split_refused_under_an_env_names_the_split_of_that_env(tmp_path, monkeypatch):
    """`kedro run --pipeline=train --env quick` on an unfinished split. Was: the fix named `kedro run
    --pipeline=split`, a split of conf/local's settings, whose data the quick train then refused as stale."""
    monkeypatch.chdir(tmp_path)
    _split_outputs(tmp_path, finished=False)
    with pytest.raises(InputDataError, match="split that did not finish") as refused:
        _run(SplitCompleteHook(), train.create_pipeline(), {"env": "quick"})
    assert "kedro run --pipeline=split --env quick`" in str(refused.value), str(refused.value)
