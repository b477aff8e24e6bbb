"""Fixtures of the engine tests."""

import pytest


@pytest.fixture
def memory_for_rows(monkeypatch):
    """Make any micro-batch with more than ``limit`` rows fail like a CUDA out-of-memory error."""
    import torch

    import fastlm.engine.train.step as step_module

    real = step_module.accumulate_gradients
    seen: list[int] = []

    def limited(limit):
        def accumulate(model, micro_batches, **kwargs):
            rows = max(batch["input_ids"].shape[0] for batch in micro_batches)
            seen.append(rows)
            if rows > limit:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return real(model, micro_batches, **kwargs)

        monkeypatch.setattr(step_module, "accumulate_gradients", accumulate)
        return seen

    return limited
