"""notebooks/explore_splits.ipynb executed as a user runs it (a Jupyter kernel, through nbconvert), on plain
text and on prompt/response data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import background
from tests.support.project import PROJECT_ROOT, demo_texts
from tests.support.split_project import copy_of_the_split_project

nbformat = pytest.importorskip("nbformat", reason="the dev extras (jupyter, nbconvert, ipykernel)")
nbconvert = pytest.importorskip("nbconvert", reason="the dev extras (jupyter, nbconvert, ipykernel)")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
NOTEBOOK = PROJECT_ROOT / "notebooks" / "explore_splits.ipynb"
KERNEL_PATH = os.pathsep.join(p for p in sys.path if p)  # the kernel imports this fastlm
SPLIT = {"split.tokenizer.vocab_size": 400, "split.max_length": 64}


def _split(project: Path, env: dict[str, str], **params) -> subprocess.CompletedProcess:
    given = ",".join(f"{key}={value}" for key, value in {**SPLIT, **params}.items())
    command = [sys.executable, "-m", "kedro", "run", "--pipeline=split", "--params", given]
    return background.run(command, cwd=project, env=env)


def _execute(project: Path, env: dict[str, str], name: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`jupyter nbconvert --execute` of the notebook in ``project`` (its kernel starts there): every cell in a
    fresh kernel; the text outputs, in order."""
    command = [
        *(sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute"),
        *("--ExecutePreprocessor.timeout=240", "--ExecutePreprocessor.kernel_name=python3"),
        *("--output", name, "explore_splits.ipynb"),
    ]
    done = background.run(command, cwd=project, env=env, timeout=280)
    if done.returncode != 0:
        return done, []
    with open(project / f"{name}.ipynb", encoding="utf-8") as file:
        cells = json.load(file)["cells"]
    return done, [
        "".join(output.get("text", "")) + json.dumps(output.get("data", {}).get("text/plain", ""))
        for cell in cells
        if cell["cell_type"] == "code"
        for output in cell.get("outputs", [])
    ]


def notebook_on_text_then_on_dialogues(folder: Path) -> list[tuple[str, subprocess.CompletedProcess, list]]:
    """In a project split by `kedro run --pipeline=split` on plain text (a copy of tests/support/
    split_project.py's, an MLflow store of its own), the notebook executed; a split of prompt/response
    dialogues, the notebook executed again (a job of tests/support/background.py). Each step's name, its
    process and the notebook's outputs."""
    project = folder / "project"
    steps = [("split text", copy_of_the_split_project(project), [])]
    if steps[0][1].returncode != 0:
        return steps
    shutil.copyfile(NOTEBOOK, project / NOTEBOOK.name)
    env = background.environ(
        FASTLM_PROJECT_ROOT=str(project),
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}",
        MPLBACKEND="Agg",
        PYTHONPATH=KERNEL_PATH,
    )
    steps.append(("notebook on text", *_execute(project, env, "on_text")))
    dialogues = project / "data/01_raw/dialogues.jsonl"
    with open(dialogues, "w", encoding="utf-8") as file:
        file.write(
            "".join(
                json.dumps({"dialogue": f"A: {text}\nB: 네", "summary": text[:20]}, ensure_ascii=False) + "\n"
                for text in demo_texts()[:300]
            )
        )
    columns = {"split.prompt_column": "dialogue", "split.response_column": "summary"}
    steps.append(("split dialogues", _split(project, env, raw_path=str(dialogues), **columns), []))
    steps.append(("notebook on dialogues", *_execute(project, env, "on_dialogues")))
    return steps


@pytest.mark.background(job=notebook_on_text_then_on_dialogues)
def test_notebook_runs_on_text_and_on_prompt_response_data():
    steps = background.result(notebook_on_text_then_on_dialogues)
    for name, done, _ in steps:
        assert done.returncode == 0, f"{name}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    outputs = {name: "\n".join(texts) for name, _, texts in steps}
    assert "--- train" in outputs["notebook on text"] and "--- test" in outputs["notebook on text"]
    dialogues = outputs["notebook on dialogues"]
    assert "--- train" in dialogues and "### Response:" in dialogues  # decoded prompt + response samples
