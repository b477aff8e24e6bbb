"""notebooks/explore_splits.ipynb runs top to bottom, without Jupyter, on a small split run in a throw-away
project."""

from __future__ import annotations

import json
import os
import random
import sys
import unicodedata
import warnings
from pathlib import Path

import pytest

from tests.support.project import copy_project

PROJECT_ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = PROJECT_ROOT / "notebooks" / "explore_splits.ipynb"
SPLITS = ["train", "validation", "test"]
WORDS = (
    "the a small large red blue quick slow model data token split train test river mountain city night "
    "morning reads writes counts sees finds builds runs walks over under near into from with "
    "about after before"
).split()


def _texts(count: int = 300) -> list[str]:
    rng = random.Random(7)
    return [
        f"{i}. " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 14))) + "." for i in range(count)
    ]


def _code_cells() -> list[str]:
    notebook = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert all(not cell.get("outputs") and cell.get("execution_count") is None for cell in cells), (
        "outputs stored"
    )
    return ["".join(cell["source"]) for cell in cells]


def _execute(cells: list[str]) -> dict:
    """Run the cells in one namespace, as a kernel would (matplotlib on Agg, plt.show() a no-op)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    namespace: dict = {"__name__": "__main__"}
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-interactive.*", category=UserWarning)
            for index, source in enumerate(cells):
                exec(compile(source, f"{NOTEBOOK.name}[code cell {index}]", "exec"), namespace)
    finally:
        plt.close("all")
    return namespace


@pytest.fixture
def small_project(tmp_path, monkeypatch) -> Path:
    """conf/ and pyproject.toml copied to tmp_path (the cwd), an empty src/ (the code is the installed
    fastlm)."""
    project = copy_project(tmp_path / "project")
    monkeypatch.chdir(project)
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # bootstrap_project prepends <project>/src to sys.path and PYTHONPATH: undo both afterwards.
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    return project


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_notebook_runs_on_a_small_split(small_project, monkeypatch):
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    texts = _texts()
    junk = [
        texts[0],  # exact duplicate
        f"  {texts[1]}\n",  # duplicate after strip
        unicodedata.normalize("NFD", "café " + texts[2]),  # duplicate of the next row after NFC
        "café " + texts[2],
        "",
        "",  # empty
        "   ",
        "\t",  # whitespace only
        None,  # missing
        7,  # not a string
    ]
    kept = texts + ["café " + texts[2]]
    raw = small_project / "data" / "01_raw" / "small.jsonl"
    raw.parent.mkdir(parents=True)
    raw.write_text("".join(json.dumps({"text": row}) + "\n" for row in texts + junk), encoding="utf-8")

    bootstrap_project(small_project)
    runtime_params = {"raw_path": str(raw), "split": {"tokenizer": {"vocab_size": 500}}}
    with KedroSession.create(project_path=small_project, runtime_params=runtime_params) as session:
        session.run(pipeline_names=["split"])
    report = json.loads((small_project / "data/08_reporting/split_report.json").read_text(encoding="utf-8"))
    assert report["kept_rows"] == len(kept)
    assert report["source"] == "data/01_raw/small.jsonl"  # the raw file, named relative to the project

    monkeypatch.setenv("FASTLM_PROJECT_ROOT", str(small_project))
    # the notebook must not depend on the cwd when the variable is set
    monkeypatch.chdir(small_project / "src")
    ns = _execute(_code_cells())
    ns["session"].close()

    assert ns["project_root"] == small_project.resolve()
    assert ns["split_names"] == SPLITS
    rows = ns["split_rows"]
    assert sum(rows.values()) == report["kept_rows"] == len(ns["corpus_splits"])
    assert rows == {name: report["splits"][name]["rows"] for name in SPLITS}
    assert all(rows[name] > 0 for name in SPLITS), rows
    assert ns["rows_per_split"]["corpus_splits"].to_dict() == rows

    samples = ns["decoded_samples"]
    assert sorted(samples) == sorted(SPLITS)
    for name in SPLITS:
        assert len(samples[name]) == min(ns["SAMPLES_PER_SPLIT"], rows[name])
        for text in samples[name]:
            assert isinstance(text, str) and text.strip(), (name, text)
            assert text in kept, f"{text!r} does not round-trip to an input text"

    stats = ns["length_stats"]
    assert stats["count"].to_dict() == {name: float(rows[name]) for name in SPLITS}
    assert stats["tokens"].to_dict() == {name: report["splits"][name]["tokens"] for name in SPLITS}
    assert (stats["min"] >= 2).all()  # at least one token and EOS

    assert ns["drop_counts"].to_dict() == {
        "missing": 1,
        "non_string": 1,
        "empty": 2,
        "whitespace_only": 2,
        "duplicate": 3,
    }
    assert (small_project / "mlflow.db").is_file()  # MLflow wrote into the throw-away project, not the repo
    assert not (PROJECT_ROOT / "notebooks" / "mlflow.db").exists()


@pytest.mark.parametrize("cwd", [".", "notebooks"])
def test_notebook_finds_the_project_root_from_its_folder_or_the_root(cwd, monkeypatch):
    monkeypatch.delenv("FASTLM_PROJECT_ROOT", raising=False)
    monkeypatch.chdir(PROJECT_ROOT / cwd)
    ns = _execute(_code_cells()[:1])  # the set-up cell only: finds the root and changes into it
    assert ns["project_root"] == PROJECT_ROOT.resolve()
    assert Path.cwd() == PROJECT_ROOT.resolve()
