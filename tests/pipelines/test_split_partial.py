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

from fastlm.hooks.split_complete import SPLIT_COMPLETE, SplitCompleteHook
from fastlm.pipelines.split import create_pipeline
from tests.support.project import PROJECT_ROOT, write_jsonl


def _catalog():
    """The project's catalog (conf/base/catalog.yml), as a run builds it."""
    return DataCatalog.from_config(
        yaml.safe_load((PROJECT_ROOT / "conf/base/catalog.yml").read_text("utf-8"))
    )


def _run(hook, pipeline, run_params):
    """The hooks Kedro calls, by keyword, for a run of ``pipeline`` that succeeds (each node's outputs saved
    after it)."""
    manager = PluginManager(HOOK_NAMESPACE)
    for spec in (specs.NodeSpecs, specs.PipelineSpecs, specs.DatasetSpecs):
        manager.add_hookspecs(spec)
    manager.register(hook)
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
