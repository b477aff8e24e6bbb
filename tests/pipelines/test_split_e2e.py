"""The split pipeline end to end: through a KedroSession in-process, and through the real CLI."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import datasets
import pandas as pd
import pytest

from fastlm.errors import ConfigError, InputDataError
from tests.support import background
from tests.support.project import (
    copy_split_data,
    demo_texts,
    make_kedro_project,
    run_pipeline,
    split_once,
    write_jsonl,
)
from tests.support.runner_jobs import runs_under_the_parallel_and_thread_runners

pytestmark = pytest.mark.e2e
OUTPUTS = [
    "data/03_primary/corpus_splits.parquet",
    "data/05_model_input/tokenized_corpus",
    "data/05_model_input/tokenized_corpus_fingerprint.json",
    "data/06_models/tokenizer",
    "data/08_reporting/split_report.json",
    "data/08_reporting/split_summary.csv",
]
SMALL = {"split": {"tokenizer": {"vocab_size": 400}, "max_length": 48}}


@pytest.fixture(scope="module")
def split_small(tmp_path_factory, sample_texts, mlflow_uri) -> Path:
    """The kedro_project fixture's project split once (SMALL) for the module, through a KedroSession."""
    return split_once(tmp_path_factory.mktemp("split_once"), sample_texts, mlflow_uri, SMALL)


@pytest.fixture
def split_done(split_small, kedro_project) -> Path:
    """kedro_project as `run_pipeline(kedro_project, "split", SMALL)` leaves it."""
    return copy_split_data(split_small, kedro_project)


def _snapshot(project):
    digest = {}
    for output in OUTPUTS:
        path = project / output
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        digest[output] = hashlib.sha256(b"".join(_read(p) for p in files)).hexdigest()
    return digest


def _read(path) -> bytes:
    with open(
        path, "rb"
    ) as file:  # the built-in open: a background job reads with it (tests patch Path.open)
        return file.read()


def test_session_run_writes_every_output(kedro_project):
    run_pipeline(kedro_project, "split", SMALL)
    report = json.loads((kedro_project / "data/08_reporting/split_report.json").read_text())
    assert report["dropped"]["empty"] == 1 and report["dropped"]["whitespace_only"] == 1
    assert report["dropped"]["missing"] == 1 and report["dropped"]["non_string"] == 1
    tokenized = datasets.load_from_disk(str(kedro_project / "data/05_model_input/tokenized_corpus"))
    assert sum(len(part) for part in tokenized.values()) == report["kept_rows"]
    assert max(max(part["length"]) for part in tokenized.values()) <= 48
    splits = pd.read_parquet(kedro_project / "data/03_primary/corpus_splits.parquet")
    assert splits["split"].value_counts().to_dict() == {name: len(part) for name, part in tokenized.items()}
    summary = pd.read_csv(kedro_project / "data/08_reporting/split_summary.csv")
    assert summary["rows"].sum() == report["kept_rows"]


@pytest.mark.usefixtures("split_done")
def test_the_split_retokenizes_from_its_tokenize_node(kedro_project):
    """`kedro run --pipeline=split --from-nodes tokenize_corpus` (a new max_length, the same splits): the
    counts of the earlier nodes are read back, not asked of the run (was: Kedro's "Pipeline input(s)
    {'split_counts'} not found" traceback)."""
    before = json.loads((kedro_project / "data/08_reporting/split_report.json").read_text())
    shorter = {"split": {**SMALL["split"], "max_length": 24}}
    run_pipeline(kedro_project, "split", shorter, from_nodes=["tokenize_corpus"])
    after = json.loads((kedro_project / "data/08_reporting/split_report.json").read_text())
    fingerprint = json.loads(
        (kedro_project / "data/05_model_input/tokenized_corpus_fingerprint.json").read_text()
    )
    assert after["max_length"] == fingerprint["params"]["max_length"] == 24
    for kept in ("raw_rows", "dropped", "capped_by_max_samples", "kept_rows", "source"):
        assert after[kept] == before[kept], kept
    tokenized = datasets.load_from_disk(str(kedro_project / "data/05_model_input/tokenized_corpus"))
    assert max(max(part["length"]) for part in tokenized.values()) == 24
    # every node after the first one run ran, on the outputs of a finished split: the split is whole again
    marker = json.loads((kedro_project / "data/05_model_input/split_complete.json").read_text())
    assert marker["raw"]["path"] == "data/01_raw/demo_corpus.jsonl"
    run_pipeline(kedro_project, "split", SMALL, from_nodes=["build_tokenizer"])
    run_pipeline(kedro_project, "split", shorter, node_names=["tokenize_corpus"])  # report_split did not run
    assert not (kedro_project / "data/05_model_input/split_complete.json").exists()
    with pytest.raises(Exception, match="come from a split that did not finish"):
        run_pipeline(kedro_project, "train", SMALL)


@pytest.mark.usefixtures("split_done")
def test_appending_rows_keeps_every_existing_row_in_its_split(kedro_project, sample_texts):
    before = pd.read_parquet(kedro_project / "data/03_primary/corpus_splits.parquet")
    write_jsonl(
        kedro_project / "data/01_raw/demo_corpus.jsonl", sample_texts + [f"new row {i}" for i in range(200)]
    )
    run_pipeline(kedro_project, "split", SMALL)
    after = pd.read_parquet(kedro_project / "data/03_primary/corpus_splits.parquet").set_index("text")[
        "split"
    ]
    assert len(after) == len(before) + 200
    assert (after.loc[before["text"]].to_numpy() == before["split"].to_numpy()).all()


@pytest.mark.parametrize(
    ("params", "error", "expected"),
    [
        ({"raw_path": "data/01_raw/missing.csv"}, InputDataError, "does not exist"),
        ({"split": {"text_column": "body"}}, InputDataError, "its columns are ['text']"),
        ({"split": {"ratios": {"train": 0.7}}}, ConfigError, "must sum to 1"),
        ({"split": {"max_length": 1}}, ConfigError, "split.max_length = 1"),
        ({"split": {"tokenizer": {"source": "./no/tokenizer"}}}, ConfigError, "split.tokenizer.source"),
    ],
)
@pytest.mark.usefixtures("split_done")
def test_bad_input_leaves_existing_outputs_untouched(kedro_project, params, error, expected):
    before = _snapshot(kedro_project)
    with pytest.raises(Exception) as raised:
        run_pipeline(kedro_project, "split", params)
    from fastlm.errors import find_user_error

    user_error = find_user_error(raised.value)
    assert isinstance(user_error, error) and expected in str(user_error)
    assert _snapshot(kedro_project) == before


def test_zero_rows_after_cleaning_is_refused(kedro_project):
    write_jsonl(kedro_project / "data/01_raw/demo_corpus.jsonl", ["", "  ", None, 3])
    with pytest.raises(Exception) as raised:
        run_pipeline(kedro_project, "split")
    assert "no usable text left" in str(raised.value)
    assert not (kedro_project / "data/05_model_input/tokenized_corpus").exists()


def _kedro(project, *args):
    env = background.environ(DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=None)
    return background.run([sys.executable, "-m", "kedro", *args], cwd=project, env=env, timeout=300)


def split_then_bad_split(
    folder: Path,
) -> tuple[Path, subprocess.CompletedProcess, dict, subprocess.CompletedProcess]:
    """In a new project (the kedro_project fixture's, with an MLflow store of its own): `kedro run
    --pipeline=split`, the digests of its outputs, then `kedro run --pipelines=split` on a raw file that does
    not exist (a job of tests/support/background.py)."""
    project = make_kedro_project(folder / "project", list(demo_texts()))
    done = _kedro(project, "run", "--pipeline=split", "--params", "split.tokenizer.vocab_size=400")
    before = _snapshot(project) if done.returncode == 0 else {}
    failed = _kedro(project, "run", "--pipelines=split", "--params", "raw_path=data/01_raw/nope.tsv")
    return project, done, before, failed


@pytest.mark.background(job=split_then_bad_split)
def test_cli_singular_pipeline_flag_runs_and_bad_input_is_one_line():
    project, done, before, failed = background.result(split_then_bad_split)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "deprecated" not in done.stderr.lower()
    assert failed.returncode == 2
    last = failed.stderr.strip().splitlines()[-1]
    assert last.startswith("fastlm: error:") and "nope.tsv does not exist" in last and "Fix:" in last
    assert "Traceback" not in failed.stderr
    assert _snapshot(project) == before


@pytest.mark.usefixtures("split_done")
def test_a_later_node_run_refuses_settings_the_splits_were_not_made_with(kedro_project):
    """`--from-nodes tokenize_corpus` tokenizes the splits a finished split made: a setting of its earlier
    nodes (the cap, the ratios, the salt, the columns, the templates) changed on that run is refused in one
    line. Was: the fingerprint recorded the new setting over the old rows (``max_samples: 30`` over every
    row), so a train run asking for it took the uncapped data as fresh."""
    marker = kedro_project / "data/05_model_input/split_complete.json"
    fingerprint = kedro_project / "data/05_model_input/tokenized_corpus_fingerprint.json"
    before = fingerprint.read_bytes()
    capped = {"split": {**SMALL["split"], "max_samples": 30}}
    with pytest.raises(ConfigError, match=r"split\.max_samples.*kedro run --pipeline=split"):
        run_pipeline(kedro_project, "split", capped, from_nodes=["tokenize_corpus"])
    assert fingerprint.read_bytes() == before and marker.exists()
    salted = {"split": {**SMALL["split"], "hash_salt": "other"}}
    with pytest.raises(ConfigError, match=r"split\.hash_salt changed") as raised:
        run_pipeline(kedro_project, "split", salted, from_nodes=["build_tokenizer"])
    assert fingerprint.read_bytes() == before and marker.exists()
    assert "->" not in str(raised.value).split("split.hash_salt")[1][:20]  # its digests are no help to read
    assert "other" not in (kedro_project / "data/02_intermediate/split_counts.json").read_text()


@pytest.mark.usefixtures("split_done")
def test_a_later_node_run_on_a_split_without_its_counts_is_one_line(kedro_project):
    """A split finished before ``split_counts.json`` was kept: its later nodes cannot run alone (the counts
    are the earlier nodes'): one line asking for the whole split, not Kedro's traceback."""
    (kedro_project / "data/02_intermediate/split_counts.json").unlink()
    with pytest.raises(InputDataError, match=r"split_counts\.json.*kedro run --pipeline=split"):
        run_pipeline(kedro_project, "split", SMALL, from_nodes=["tokenize_corpus"])
    assert (kedro_project / "data/05_model_input/split_complete.json").exists()


@pytest.mark.parametrize(
    ("selection", "held"),
    [
        ({"from_nodes": ["split_corpus"]}, "clean_corpus"),
        ({"node_names": ["report_split"]}, "token_length_stats"),
    ],
)
@pytest.mark.usefixtures("split_done")
def test_a_later_node_run_from_a_node_reading_memory_only_data_is_one_line(kedro_project, selection, held):
    """`--from-nodes split_corpus` reads the cleaned rows, `--nodes report_split` the length stats: the split
    holds them in memory only, so a run cannot start there: one line naming where one can. Was: Kedro's
    "Pipeline input(s) {...} not found in the DataCatalog" traceback."""
    with pytest.raises(ConfigError, match=rf"{held}.*in memory.*--from-nodes"):
        run_pipeline(kedro_project, "split", SMALL, **selection)
    assert (kedro_project / "data/05_model_input/split_complete.json").exists()


@pytest.mark.background(job=runs_under_the_parallel_and_thread_runners)
@pytest.mark.parametrize("start", ["spawn", "fork"])
def test_a_split_under_the_parallel_runner_is_finished_as_a_sequential_one_is(start):
    """`kedro run --pipeline=split --runner=ParallelRunner`: Kedro calls the node and dataset hooks in its
    worker processes (fresh hooks when they are spawned, the main process's copied when forked), each seeing
    the nodes it ran, none all of them; the marker a finished split leaves is the sequential run's. Was: no
    marker (spawned workers, or forked ones sharing the nodes), so train and report refused the split as one
    that did not finish; or, spawned, the earlier split's marker left beside the new outputs."""
    done = background.result(runs_under_the_parallel_and_thread_runners)
    for run in ("sequential", start):
        assert done["runs"][run]["returncode"] == 0, done["runs"][run]["stderr"][-3000:]
    assert done["markers"]["sequential"] is not None
    assert done["markers"][start] == done["markers"]["sequential"], done["runs"][start]["stderr"][-3000:]
