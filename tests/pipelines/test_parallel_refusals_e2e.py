"""Refusals of the tokenized data (edited split files, split settings changed since) under Kedro's
ParallelRunner and ThreadRunner, through the CLI: made before any node runs, so that nodes that run before
the one that checks (the report's plots and summaries) rewrite nothing and no MLflow run is opened."""

import shutil

import pytest
import yaml

from tests.support.e2e import SPLIT, TRAIN, own_experiment
from tests.support.project import kedro_cli, run_pipeline

pytestmark = pytest.mark.e2e
REPORT = {"max_new_tokens": 5, "prompts": ["", "배송"], "worst_samples": 3, "error_pairs": 5}
EXPERIMENT = "parallel-refusals"


def _files(project):
    """Every file under data/ with its bytes and modification time (a rewrite of the same bytes counts)."""
    return {
        path: (path.read_bytes(), path.stat().st_mtime_ns)
        for path in (project / "data").rglob("*")
        if path.is_file()
    }


def _runs() -> int:
    import mlflow

    client = mlflow.MlflowClient()
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return len(client.search_runs(experiment.experiment_id)) if experiment else 0


def _refusal(project, *args) -> str:
    before, runs = _files(project), _runs()
    done = kedro_cli(project, *args)
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fastlm: error:") and "Fix:" in last, last
    changed = sorted(str(path) for path, state in _files(project).items() if before.get(path) != state)
    assert changed == [] and set(_files(project)) == set(before), changed
    assert _runs() == runs  # refused before kedro-mlflow opened a run
    assert "Running node" not in done.stderr, done.stderr[-3000:]
    return last


def test_stale_or_edited_tokenized_data_is_refused_before_any_node_under_every_runner(kedro_project):
    own_experiment(kedro_project, EXPERIMENT)
    local = {"split": SPLIT, "train": TRAIN, "report": REPORT}
    (kedro_project / "conf/local/parameters.yml").write_text(yaml.safe_dump(local), encoding="utf-8")
    for pipeline in ("split", "train", "report"):
        run_pipeline(kedro_project, pipeline)
    folder = kedro_project / "data/05_model_input/tokenized_corpus"
    arrow = "data-00000-of-00001.arrow"

    # the split settings changed since (--params): refused as stale, the report's and train's nodes unrun
    vocab = f"split.tokenizer.vocab_size={SPLIT['tokenizer']['vocab_size'] + 100}"
    for pipeline, runner in (("report", "ThreadRunner"), ("train", "ParallelRunner")):
        last = _refusal(kedro_project, f"--pipeline={pipeline}", f"--runner={runner}", "--params", vocab)
        assert "tokenized_corpus is stale" in last and "vocab_size" in last, last

    # a split file copied over another by hand
    shutil.copy(folder / "validation" / arrow, folder / "train" / arrow)
    for pipeline, runner in (
        ("report", "ParallelRunner"),
        ("report", "ThreadRunner"),
        ("train", "ThreadRunner"),
    ):
        last = _refusal(kedro_project, f"--pipeline={pipeline}", f"--runner={runner}")
        assert "was changed since the split wrote it" in last and "train split" in last, last
