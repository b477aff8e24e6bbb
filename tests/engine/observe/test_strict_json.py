"""strict_json: every file the project writes is JSON a strict parser reads, its non-finite figures null and
noted, and read back as the floats they were."""

from __future__ import annotations

import json
import math

import numpy as np

from fastlm.engine.observe import strict_json


def strict(text: str):
    """``json.loads`` refusing ``NaN`` / ``Infinity`` as jq and JavaScript's JSON.parse do."""

    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_non_finite_figures_are_null_and_noted_and_read_back_as_they_were():
    value = {
        "test_loss": float("nan"),
        "test_perplexity": float("inf"),
        "history": [{"loss": 1.5}, {"loss": np.float32("-inf")}],
        "steps": 3,
        "ok": True,
    }
    text = strict_json.dumps(value, indent=2)
    parsed = strict(text)
    assert parsed["test_loss"] is None and parsed["test_perplexity"] is None
    assert parsed["history"][1]["loss"] is None and parsed["history"][0]["loss"] == 1.5
    assert parsed[strict_json.NON_FINITE] == {
        "test_loss": "nan",
        "test_perplexity": "inf",
        "history/1/loss": "-inf",
    }
    back = strict_json.loads(text)
    assert math.isnan(back["test_loss"]) and back["test_perplexity"] == math.inf
    assert back["history"][1]["loss"] == -math.inf and back["steps"] == 3 and back["ok"] is True
    assert strict_json.NON_FINITE not in back


def test_a_finite_value_is_written_as_json_writes_it_and_an_old_file_with_nan_literals_still_reads():
    value = {"loss": 0.25, "rows": [1, 2], "name": "a"}
    assert strict_json.dumps(value, sort_keys=True) == json.dumps(value, sort_keys=True)
    assert math.isnan(strict_json.loads('{"loss": NaN}')["loss"])
    assert strict_json.loads('{"loss": null}')["loss"] is None  # a null never noted stays None, never 0
