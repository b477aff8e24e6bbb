"""TrainState: a fresh run starts at zero with empty, unshared records, and what a checkpoint saves of it
comes back the same."""

from __future__ import annotations

import dataclasses
import json

from fastlm.engine.train.state import TrainState


def test_a_fresh_state_starts_at_zero_with_its_own_records():
    first, second = TrainState(), TrainState()
    assert (first.step, first.tokens_seen, first.epoch, first.batch_in_epoch, first.first_step) == (
        0,
        0,
        0,
        0,
        0,
    )
    assert first.resumed_from is None and first.last_good is None
    first.history.append({"step": 1, "loss": 2.0})
    first.batching["micro_batch_size"] = 2
    assert second.history == [] and second.batching == {}  # no list or dict shared between runs


def test_the_saved_fields_survive_a_json_round_trip():
    state = TrainState(
        step=7,
        tokens_seen=900,
        epoch=1,
        batch_in_epoch=3,
        history=[{"step": 5, "loss": 1.5}],
        eval_history=[{"step": 5, "eval_loss": 1.7}],
        batching={"micro_batch_size": 2, "accumulation_factor": 4},
        backoffs=[{"step": 4, "micro_batch_size": 2}],
        early_stopping={"best": 1.7, "bad_evals": 0},
    )
    saved = {
        key: value
        for key, value in dataclasses.asdict(state).items()
        if key not in ("resumed_from", "last_good")  # paths of this process, not saved
    }
    assert TrainState(**json.loads(json.dumps(saved))) == state
