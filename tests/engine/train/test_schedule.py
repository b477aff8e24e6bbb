"""Learning-rate schedule: warmup start, peak, decay shape and end value; LambdaLR follows lr_at."""

from __future__ import annotations

import math

import pytest
import torch

from fastlm.engine.train.schedule import LRSchedule, make_lr_scheduler

PEAK = 1e-3


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_warmup_peak_and_end_value(decay):
    schedule = LRSchedule(peak_lr=PEAK, total_steps=110, warmup_steps=10, decay=decay, min_lr_ratio=0.1)
    curve = [schedule.lr_at(step) for step in range(131)]

    assert curve[0] == pytest.approx(PEAK / 10)  # warmup starts above zero: the first update counts
    assert curve[9] == curve[10] == pytest.approx(PEAK)  # peak at the end of warmup
    assert max(curve) == pytest.approx(PEAK)
    assert all(a < b for a, b in zip(curve[:10], curve[1:10], strict=False))  # rising during warmup
    assert all(a >= b for a, b in zip(curve[10:], curve[11:], strict=False))  # never rising afterwards
    assert curve[60] == pytest.approx(PEAK * (0.1 + 0.9 * 0.5))  # halfway: both shapes agree
    assert curve[110] == pytest.approx(PEAK * 0.1)  # the end value
    assert curve[130] == pytest.approx(PEAK * 0.1)  # and it stays there


def test_cosine_and_linear_shapes_differ_at_a_quarter():
    quarter = 10 + 25
    cosine = LRSchedule(peak_lr=PEAK, total_steps=110, warmup_steps=10, decay="cosine", min_lr_ratio=0.0)
    linear = LRSchedule(peak_lr=PEAK, total_steps=110, warmup_steps=10, decay="linear", min_lr_ratio=0.0)
    assert cosine.lr_at(quarter) == pytest.approx(PEAK * 0.5 * (1 + math.cos(math.pi / 4)))
    assert linear.lr_at(quarter) == pytest.approx(PEAK * 0.75)


def test_no_warmup_and_constant_decay():
    assert LRSchedule(peak_lr=PEAK, total_steps=10).lr_at(0) == pytest.approx(PEAK)
    constant = LRSchedule(peak_lr=PEAK, total_steps=10, warmup_steps=4, decay="constant")
    assert [constant.lr_at(s) for s in (0, 3, 4, 9, 20)] == pytest.approx([PEAK / 4, PEAK, PEAK, PEAK, PEAK])


def test_lambda_lr_follows_lr_at():
    schedule = LRSchedule(peak_lr=PEAK, total_steps=20, warmup_steps=5, decay="cosine", min_lr_ratio=0.2)
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([param], lr=123.0)  # the factory sets the peak
    scheduler = make_lr_scheduler(optimizer, schedule)
    for step in range(25):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(schedule.lr_at(step)), step
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(total_steps=0),
        dict(total_steps=10, warmup_steps=11),
        dict(total_steps=10, decay="exponential"),
        dict(total_steps=10, min_lr_ratio=1.5),
    ],
)
def test_invalid_schedules_are_rejected(kwargs):
    with pytest.raises(ValueError):
        LRSchedule(peak_lr=PEAK, **kwargs)


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
@pytest.mark.parametrize("warmup", [0, 3, 10])
def test_the_device_factor_is_the_host_factor(decay, warmup):
    """``factor_of`` (float64 on the device, for the fp16 fused path) against ``factor_at`` (Python floats)
    over every step and past the end: the same arithmetic, a few ulps apart in cos."""
    schedule = LRSchedule(1e-3, total_steps=10, warmup_steps=warmup, decay=decay, min_lr_ratio=0.1)
    steps = torch.arange(13, dtype=torch.float64)
    expected = [schedule.factor_at(step) for step in range(13)]
    torch.testing.assert_close(schedule.factor_of(steps).tolist(), expected, rtol=1e-12, atol=1e-15)
