"""Tune with ``train.model.gradient_checkpointing: auto``: more recompute is measured only while memory
stopped the micro-batch ladder, and the fastest (policy, mode, size) wins."""

from __future__ import annotations

import pytest

from fastlm.engine.train import tune

SIZES = [1, 2, 4, 8]
# Peak memory per micro-batch size under each policy (more recompute, less memory) and tokens/s (recompute
# costs ~1/3 of a layer's forward+backward).
MEMORY = {
    "off": {1: 30, 2: 60, 4: 120, 8: 240},
    "selective": {1: 20, 2: 40, 4: 80, 8: 160},
    "full": {1: 10, 2: 20, 4: 40, 8: 80},
}
SPEED = {"off": 1.0, "selective": 0.85, "full": 0.75}
FAST = {1: 100, 2: 190, 4: 350, 8: 600}  # tokens/s per size without recompute: larger is faster


@pytest.fixture(autouse=True)
def no_collection(monkeypatch):
    """The fake trials allocate nothing: skip the garbage collection between them (seconds in a big
    process)."""
    monkeypatch.setattr(tune, "release_memory", lambda: None)


def runner(applied: list[str], tokens_per_size: dict[int, float], limit: float | None = 100):
    def run_modes() -> list[tune.ModeLadder]:
        policy = applied[-1]

        def measure(size: int) -> tune.Measurement:
            speed = tokens_per_size[size] * SPEED[policy]
            return tune.Measurement(speed, 1 / speed, MEMORY[policy][size])

        trials = tune.run_ladder(measure, SIZES, memory_limit_mb=limit, headroom=0.1, cliff_tolerance=0.05)
        return [tune.ModeLadder("packed", trials, tune.choose(trials))]

    return run_modes


def test_auto_measures_more_recompute_while_memory_stops_the_ladder_and_keeps_the_fastest():
    applied: list[str] = []
    results = tune.tune_checkpointing(runner(applied, FAST), applied.append, "auto")
    assert applied == ["off", "selective", "full"]  # off stops at 4 (120 MB > 90), selective at 8
    assert [r.best.chosen.micro_batch_size for r in results] == [2, 4, 8]
    best = tune.best_policy(results)
    assert best.policy == "full" and best.best.chosen.real_tokens_per_s == 600 * 0.75


def test_auto_stops_adding_recompute_once_memory_no_longer_limits():
    applied: list[str] = []
    results = tune.tune_checkpointing(
        runner(applied, {1: 100, 2: 190, 4: 350, 8: 400}, limit=None), applied.append, "auto"
    )
    assert applied == ["off"] and tune.best_policy(results).policy == "off"


def test_a_set_policy_is_measured_alone():
    applied: list[str] = []
    results = tune.tune_checkpointing(runner(applied, FAST), applied.append, "selective")
    assert applied == ["selective"] and [r.policy for r in results] == ["selective"]
    text = tune.explain_checkpointing(results, tune.best_policy(results))
    assert text == ""  # nothing to choose between: the usual explanation says it all
    applied.clear()
    results = tune.tune_checkpointing(runner(applied, FAST), applied.append, "auto")
    text = tune.explain_checkpointing(results, tune.best_policy(results))
    assert "off: micro-batch 2" in text and "Gradient checkpointing full" in text


def test_auto_adds_no_recompute_policy_past_the_time_limit(monkeypatch):
    """Memory stopped the ladder without recompute, but the time limit has passed: no further policy is
    measured, and what was measured is chosen from."""
    monkeypatch.setattr(tune, "perf_counter", lambda: 1000.0)
    applied: list[str] = []
    results = tune.tune_checkpointing(runner(applied, FAST), applied.append, "auto", deadline=100.0)
    assert applied == ["off"] and tune.best_policy(results).policy == "off"
    text = tune.explain_checkpointing(results, tune.best_policy(results))
    assert "tune.max_minutes" in text and "selective" in text


def test_under_cuda_graphs_auto_measures_no_recompute_and_says_why():
    """``train.runtime.compile_mode: reduce-overhead``: a checkpointed layer runs its forward again in the
    backward, which CUDA graph trees do not replay (the config refuses a set policy); tune's ``auto`` measures
    ``off`` alone even where memory stopped its ladder, and the explanation names the reason."""
    applied: list[str] = []
    results = tune.tune_checkpointing(runner(applied, FAST), applied.append, "auto", cuda_graphs=True)
    assert applied == ["off"] and tune.best_policy(results).policy == "off"
    text = tune.explain_checkpointing(results, tune.best_policy(results))
    assert "compile_mode reduce-overhead" in text and "recompute" in text and "\n" not in text
    applied.clear()  # where memory does not stop the ladder there is nothing to explain
    results = tune.tune_checkpointing(
        runner(applied, FAST, limit=None), applied.append, "auto", cuda_graphs=True
    )
    assert applied == ["off"] and tune.explain_checkpointing(results, tune.best_policy(results)) == ""
