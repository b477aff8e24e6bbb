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
from tests.support.project import demo_texts, make_kedro_project, run_pipeline, write_jsonl

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


def test_the_split_retokenizes_from_its_tokenize_node(kedro_project):
    """`kedro run --pipeline=split --from-nodes tokenize_corpus` (a new max_length, the same splits): the
    counts of the earlier nodes are read back, not asked of the run (was: Kedro's "Pipeline input(s)
    {'split_counts'} not found" traceback)."""
    run_pipeline(kedro_project, "split", SMALL)
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


def test_appending_rows_keeps_every_existing_row_in_its_split(kedro_project, sample_texts):
    run_pipeline(kedro_project, "split", SMALL)
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
def test_bad_input_leaves_existing_outputs_untouched(kedro_project, params, error, expected):
    run_pipeline(kedro_project, "split", SMALL)
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
