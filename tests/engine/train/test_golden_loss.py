"""The tiny model's loss curve against a committed golden file: a fixed-seed run (CPU, fp32, one thread) whose
per-step losses and learning rates must match within a tolerance, so that a silent change in the labels, the
masking (packed samples, padding, completion-only prompts) or the schedule fails here, not only "the loss
falls". Regenerate on purpose only, after checking the change is meant:

    FASTLM_UPDATE_GOLDEN=1 PYTHONPATH=$PWD/src python3 -m pytest -q tests/engine/train/test_golden_loss.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.support.toy_training import run_toy, toy_params

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

GOLDEN = Path(__file__).resolve().parent / "golden" / "tiny_loss_curve.json"
STEPS = 16
# fp32 on one CPU thread repeats bit for bit on one machine; the tolerance leaves room for another CPU's
# kernels. One label shifted by a token, one mask changed or one schedule step moved moves a loss by far more.
RTOL, ATOL = 1e-4, 1e-4
MODES = ("packed", "dynamic")


def loss_curve(tmp_path, mode: str) -> dict[str, list[float]]:
    params = toy_params(
        tmp_path / mode,
        batching={"mode": mode},
        max_steps=STEPS,
        log_every=1,
        eval_every=None,
        optimizer={"warmup_steps": 4, "decay": "cosine"},
        runtime={"precision": "fp32", "compile": False},
    )
    history = run_toy(params).history
    assert [row["step"] for row in history] == list(range(1, STEPS + 1))
    return {"loss": [row["loss"] for row in history], "lr": [row["lr"] for row in history]}


@pytest.fixture(scope="module")
def curves(tmp_path_factory) -> dict[str, dict[str, list[float]]]:
    folder = tmp_path_factory.mktemp("golden")
    measured = {mode: loss_curve(folder, mode) for mode in MODES}
    if os.environ.get("FASTLM_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(json.dumps(measured, indent=1) + "\n", encoding="utf-8")
    return measured


@pytest.mark.parametrize("mode", MODES)
def test_the_tiny_models_loss_curve_matches_the_golden_file(curves, mode):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))[mode]
    for key in ("lr", "loss"):
        got, want = np.array(curves[mode][key]), np.array(golden[key])
        bad = np.flatnonzero(~np.isclose(got, want, rtol=RTOL, atol=ATOL))
        assert bad.size == 0, (
            f"{mode} {key} differs from {GOLDEN.name} from step {bad[0] + 1} on: "
            f"{got[bad[:3]].tolist()} != {want[bad[:3]].tolist()} (see this file's docstring)"
        )
