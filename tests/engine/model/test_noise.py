"""engine/model/noise.py, NEFTune (``train.model.neftune_noise_alpha``): uniform noise on the input
embeddings while training, as the Trainer and TRL add it (transformers' own hook), none in evaluation, and the
model handed back without it."""

from __future__ import annotations

import pytest
import torch

from fastlm.engine.config import parse_train_params
from fastlm.errors import ConfigError
from tests.support.toy_training import run_toy, toy_model, toy_params

STEPS = {"max_steps": 4, "log_every": 1, "eval_every": 4}


def test_a_run_with_neftune_trains_on_noisy_embeddings_and_evaluates_and_returns_a_plain_model(tmp_path):
    plain = run_toy(toy_params(tmp_path / "plain", **STEPS))
    noisy = run_toy(toy_params(tmp_path / "noisy", model={"neftune_noise_alpha": 5.0}, **STEPS))
    # the same weights and batches: the first step's loss differs only by the embeddings' noise
    assert noisy.history[0]["loss"] != plain.history[0]["loss"]
    assert noisy.summary["neftune_noise_alpha"] == 5.0 and plain.summary["neftune_noise_alpha"] == 0.0
    # the hook is gone from the model handed back (saved, evaluated, served): its embeddings are the table's
    embeddings = noisy.model.get_input_embeddings()
    assert not embeddings._forward_hooks and not hasattr(embeddings, "neftune_noise_alpha")
    ids = torch.arange(16).view(2, 8)
    noisy.model.train()
    assert torch.equal(embeddings(ids), embeddings.weight[ids])


@pytest.mark.parametrize("adapters", [False, True], ids=["model", "lora"])
def test_the_noise_is_transformers_own_bounded_by_alpha_over_the_root_of_length_times_width(adapters):
    """In training mode each embedding entry moves by at most alpha / sqrt(row length x hidden size)
    (transformers' ``neftune_post_forward_hook``, which fastlm registers: on a LoRA model, the base model's
    embeddings), the same draws from the same generator state; in evaluation mode nothing is added."""
    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora
    from fastlm.engine.model.noise import add_neftune

    model = toy_model()
    if adapters:
        model = apply_lora(model, LoraParams(enabled=True, r=4), gradient_checkpointing=False)
    embeddings = model.get_input_embeddings()
    ids = torch.randint(0, embeddings.num_embeddings, (3, 40), generator=torch.Generator().manual_seed(0))
    clean = embeddings(ids).detach()
    remove = add_neftune(model, 5.0)
    torch.manual_seed(1)
    noisy = embeddings(ids).detach()
    bound = 5.0 / (40 * embeddings.embedding_dim) ** 0.5
    moved = (noisy - clean).abs()
    assert 0.9 * bound < moved.max() <= bound * (1 + 1e-6) and moved.mean() > 0.4 * bound
    torch.manual_seed(1)
    assert torch.equal(embeddings(ids), noisy)  # the same draws again: the same computation run twice
    model.eval()
    assert torch.equal(embeddings(ids), clean)
    remove()
    model.train()
    assert torch.equal(embeddings(ids), clean)


def test_a_negative_alpha_is_refused_in_one_line():
    refused = r"train\.model\.neftune_noise_alpha = -1 .*greater than or equal to 0"
    with pytest.raises(ConfigError, match=refused):
        parse_train_params({"model": {"neftune_noise_alpha": -1}})
