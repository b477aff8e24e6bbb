"""Out of memory in a training step: opt-in back-off (half micro-batch, double accumulation) or one clear
line.

A real CUDA OOM cannot happen on the CPU machines that run the suite, so the step raises
``torch.OutOfMemoryError`` (what PyTorch raises on CUDA) whenever a micro-batch holds more rows than a budget.
"""

import pytest

from fastlm.engine.train.backoff import OutOfMemory
from tests.support.toy_training import run_toy, toy_params


@pytest.mark.parametrize("mode", ["packed", "dynamic"])
def test_backoff_halves_the_micro_batch_keeps_the_effective_batch_and_finishes(
    tmp_path, memory_for_rows, mode, caplog
):
    seen = memory_for_rows(2)
    params = toy_params(
        tmp_path, batching={"mode": mode, "micro_batch_size": 8, "oom_backoff": True}, max_steps=12
    )
    with caplog.at_level("WARNING"):
        result = run_toy(params)
    assert result.summary["oom_backoffs"] == [
        {"step": 1, "micro_batch_size": 4, "gradient_accumulation_steps": 2},
        {"step": 1, "micro_batch_size": 2, "gradient_accumulation_steps": 4},
    ]
    assert result.summary["effective_batch"] == 8 and result.summary["steps"] == 12
    assert [r["step"] for r in result.history][-1] == 12 and max(seen[2:]) <= 2
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert "effective batch is unchanged" in caplog.text


def test_without_backoff_out_of_memory_is_one_line_pointing_to_tune(tmp_path, memory_for_rows):
    memory_for_rows(2)
    with pytest.raises(
        OutOfMemory,
        match=r"ran out of memory at step 1 with micro_batch_size 4 .*pipeline=tune.*"
        r"oom_backoff: true",
    ) as caught:
        run_toy(toy_params(tmp_path, batching={"micro_batch_size": 4}))
    assert "\n" not in str(caught.value)


def test_backoff_stops_at_one_row(tmp_path, memory_for_rows):
    memory_for_rows(0)
    with pytest.raises(OutOfMemory, match="micro_batch_size 1"):
        run_toy(toy_params(tmp_path, batching={"micro_batch_size": 2, "oom_backoff": True}))


def test_an_out_of_memory_epoch_end_step_is_redone_with_its_own_samples(tmp_path, monkeypatch):
    """An epoch's last step may hold fewer micro-batches than the accumulation: the retry restarted as if it
    held them all, so it trained samples of the step before again. Each sample of the epoch is trained once,
    the failed short step's included."""
    import torch

    import fastlm.engine.train.step as step_module

    real, trained, failed = step_module.accumulate_gradients, [], []

    def accumulate(model, micro_batches, **kwargs):
        rows = [batch["input_ids"].shape[0] for batch in micro_batches]
        if not failed and len(micro_batches) < 4:  # the epoch's short last step, once
            failed.append(rows)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        trained.append(sum(rows))
        return real(model, micro_batches, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", accumulate)
    batching = {"mode": "length_grouped", "micro_batch_size": 4, "gradient_accumulation_steps": 4}
    params = toy_params(tmp_path, batching={**batching, "oom_backoff": True}, max_steps=None, epochs=1)
    result = run_toy(params)
    assert failed and result.summary["oom_backoffs"][0]["micro_batch_size"] == 2
    assert sum(trained) == 300  # toy_sequences(300): each sample once
