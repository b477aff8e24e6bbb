"""notebooks/explore_splits.ipynb executed as a user runs it (a Jupyter kernel, through nbconvert), on plain
text and on prompt/response data."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.support.project import PROJECT_ROOT, copy_project, write_jsonl

nbformat = pytest.importorskip("nbformat", reason="the dev extras (jupyter, nbconvert, ipykernel)")
nbconvert = pytest.importorskip("nbconvert", reason="the dev extras (jupyter, nbconvert, ipykernel)")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def execute_notebook(project) -> list[str]:
    """Run every cell in a fresh kernel (the project's code on its path); the text outputs, in order."""
    from nbconvert.preprocessors import ExecutePreprocessor

    notebook = nbformat.read(PROJECT_ROOT / "notebooks" / "explore_splits.ipynb", as_version=4)
    os.environ["FASTLM_PROJECT_ROOT"] = str(project)
    try:
        ExecutePreprocessor(timeout=240, kernel_name="python3").preprocess(
            notebook, {"metadata": {"path": str(project)}}
        )
    finally:
        del os.environ["FASTLM_PROJECT_ROOT"]
    return [
        "".join(output.get("text", "")) + json.dumps(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.get("outputs", [])
    ]


def test_notebook_runs_on_text_and_on_prompt_response_data(tmp_path, monkeypatch, sample_texts):
    from tests.support.project import run_pipeline

    project = copy_project(tmp_path / "project")
    monkeypatch.chdir(project)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'mlflow.db'}")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    # the kernel imports this fastlm
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
    split = {"tokenizer": {"vocab_size": 400}, "max_length": 64}

    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", sample_texts[:300])
    run_pipeline(project, "split", {"split": split})
    outputs = "\n".join(execute_notebook(project))
    assert "--- train" in outputs and "--- test" in outputs

    dialogues = project / "data/01_raw/dialogues.jsonl"
    dialogues.write_text(
        "".join(
            json.dumps({"dialogue": f"A: {text}\nB: 네", "summary": text[:20]}, ensure_ascii=False) + "\n"
            for text in sample_texts[:300]
        ),
        encoding="utf-8",
    )
    run_pipeline(
        project,
        "split",
        {
            "raw_path": str(dialogues),
            "split": {**split, "prompt_column": "dialogue", "response_column": "summary"},
        },
    )
    outputs = "\n".join(execute_notebook(project))
    assert "--- train" in outputs and "### Response:" in outputs  # decoded prompt + response samples
