"""Health checks on logged records: NaN/inf stops in one line naming the good checkpoint, a first loss far
from ln(vocab) and a gradient-norm jump over 10x its median warn."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest

from fastlm.engine.observe.health import GradNormWatch, NonFiniteLossError, check_finite, check_first_loss


def test_a_finite_record_passes_and_a_nan_loss_or_inf_norm_stops_naming_the_checkpoint():
    check_finite({"loss": 2.0, "grad_norm": 1.0}, 3, None)
    check_finite({"loss": 2.0}, 3, None)  # no norm logged
    good = Path("runs/x/checkpoint-00000004")
    with pytest.raises(NonFiniteLossError) as raised:
        check_finite({"loss": math.nan, "grad_norm": 1.0}, 6, good)
    message = str(raised.value)
    assert "loss became nan by step 6" in message and str(good) in message and "\n" not in message
    with pytest.raises(NonFiniteLossError, match="gradient norm became inf by step 2; training stopped."):
        check_finite({"loss": 2.0, "grad_norm": math.inf}, 2, None)


def test_an_inf_norm_the_fp16_grad_scaler_skipped_is_no_stop_unless_it_overflowed_unscaled():
    """Under loss scaling a non-finite norm is an update ``GradScaler`` skipped while its scale is at least 1
    (the gradients fit unscaled); below 1, or with a NaN loss, the run diverged: the stop as without it."""
    check_finite({"loss": 2.0, "grad_norm": math.inf}, 3, None, loss_scale=32768.0)
    check_finite({"loss": 2.0, "grad_norm": math.nan}, 3, None, loss_scale=1.0)
    with pytest.raises(NonFiniteLossError, match="gradient norm became inf by step 3"):
        check_finite({"loss": 2.0, "grad_norm": math.inf}, 3, None, loss_scale=0.5)
    with pytest.raises(NonFiniteLossError, match="loss became nan by step 3"):
        check_finite({"loss": math.nan, "grad_norm": math.inf}, 3, None, loss_scale=32768.0)
    watch = GradNormWatch.from_history([{"grad_norm": 1.0}, {"grad_norm": math.inf}, {"grad_norm": 2.0}])
    watch.check({"step": 4, "grad_norm": math.inf})  # a skipped update: no norm to compare or keep
    assert watch.seen == [1.0, 2.0]


def test_first_loss_far_from_ln_vocab_warns(caplog):
    uniform = math.log(1000)
    with caplog.at_level(logging.WARNING):
        check_first_loss(uniform, len_vocab=1000, from_scratch=True)
        check_first_loss(0.3 * uniform, len_vocab=1000, from_scratch=False)  # a pretrained model knows more
        assert not caplog.records
        check_first_loss(2 * uniform, len_vocab=1000, from_scratch=False)
        check_first_loss(0.3 * uniform, len_vocab=1000, from_scratch=True)
    assert len(caplog.records) == 2 and "far from ln(vocab)" in caplog.records[0].getMessage()


def test_grad_norm_jump_over_ten_times_the_median_warns_after_three(caplog):
    watch = GradNormWatch.from_history([{"grad_norm": 1.0}, {"grad_norm": None}, {"grad_norm": 2.0}])
    assert watch.seen == [1.0, 2.0]
    with caplog.at_level(logging.WARNING):
        watch.check({"step": 3, "grad_norm": 50.0})  # only two seen: no verdict yet
        watch.check({"step": 4, "grad_norm": None})
        assert not caplog.records
        watch.check({"step": 5, "grad_norm": 25.0})  # median of 1, 2, 50 is 2: 25 > 20
    assert len(caplog.records) == 1 and "at step 5" in caplog.records[0].getMessage()
