"""Refusals of the tokenized data (edited split files, split settings changed since) under Kedro's
ParallelRunner and ThreadRunner, through the CLI: made before any node runs, so that nodes that run before
the one that checks (the report's plots and summaries) rewrite nothing and no MLflow run is opened."""

import pytest

from tests.support import background
from tests.support.runner_jobs import runs_under_the_parallel_and_thread_runners

pytestmark = pytest.mark.e2e


@pytest.mark.background(job=runs_under_the_parallel_and_thread_runners)
def test_stale_or_edited_tokenized_data_is_refused_before_any_node_under_every_runner():
    done = background.result(runs_under_the_parallel_and_thread_runners)  # split, train, report, then these
    for run in done["runs"].values():
        assert run["returncode"] == 0, run["stderr"][-3000:]
    kinds = [kind for kind, _ in done["refusals"]]
    # each refusal under each runner, each pipeline under both (the check is the same for both kinds)
    assert kinds == ["stale", "stale", "edited", "edited"]
    for kind, refusal in done["refusals"]:
        assert refusal["returncode"] == 2, (refusal["args"], refusal["stderr"][-3000:])
        last = refusal["stderr"].strip().splitlines()[-1]
        assert last.startswith("fastlm: error:") and "Fix:" in last, last
        if (
            kind == "stale"
        ):  # the split settings changed since (--params): the report's and train's nodes unrun
            assert "tokenized_corpus is stale" in last and "vocab_size" in last, last
        else:  # a split file copied over another by hand
            assert "was changed since the split wrote it" in last and "train split" in last, last
        # nothing under data/ written (nor rewritten with the same bytes), no file added or removed
        assert refusal["changed"] == [] and refusal["same_files"], (refusal["args"], refusal["changed"])
        before, after = refusal["runs"]
        assert after == before, refusal["args"]  # refused before kedro-mlflow opened a run
        assert "Running node" not in refusal["stderr"], refusal["stderr"][-3000:]
