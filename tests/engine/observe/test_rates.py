"""timed_rate: total amount over total time of the timed windows, the warm-up window left out."""

from __future__ import annotations

import math

import pytest

from fastlm.engine.observe.rates import timed_rate


def test_warm_up_window_is_left_out_and_windows_weigh_their_duration():
    records = [
        {"step": 1, "step_time_s": 9.0, "real_tokens_per_s": 1.0},  # warm-up: compile
        {"step": 5, "step_time_s": 1.0, "real_tokens_per_s": 100.0},  # 4 steps, 4 s
        {"step": 6, "step_time_s": 2.0, "real_tokens_per_s": 400.0},  # 1 step, 2 s
    ]
    assert timed_rate(records) == pytest.approx((100 * 4 + 400 * 2) / 6)


def test_a_lone_window_counts_and_nothing_measured_is_none():
    assert timed_rate([{"step": 3, "step_time_s": 0.5, "samples_per_s": 8.0}], "samples_per_s") == 8.0
    assert timed_rate([]) is None
    records = [
        {"step": 1, "step_time_s": 1.0, "real_tokens_per_s": 5.0},
        {"step": 2, "step_time_s": math.nan, "real_tokens_per_s": 5.0},
        {"step": 3, "step_time_s": 1.0, "real_tokens_per_s": None},
    ]
    assert timed_rate(records) is None
