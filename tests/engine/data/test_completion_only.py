"""Completion-only loss: prompt tokens are inputs but never targets, in every batching mode.

The checks: the labels of prompt tokens are -100 and the first response token and the closing EOS stay
targets; the gradient of the loss reaches no logit that predicts a prompt token and does reach the one that
predicts the EOS; and a packed batch's summed loss equals the sum of its samples' losses run one at a time.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from fastlm.engine.batching import make_batching
from fastlm.engine.config import TrainParams
from fastlm.engine.data import IGNORE_INDEX, DynamicPaddingCollator, PackedCollator, TokenBudget
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.model.loss import causal_lm_loss_sum
from tests.support.tiny_models import PACKING_EOS as EOS
from tests.support.tiny_models import PACKING_VOCAB as VOCAB
from tests.support.tiny_models import packing_llama
from tests.support.tolerances import OTHER_FP32_KERNEL

pytestmark = pytest.mark.kernels  # compares two computations: run under other CPU kernel sets too

PAD = 0
MODES = ("packed", "length_grouped", "dynamic")


def prompt_samples(seed: int = 0, n: int = 12) -> TokenSequences:
    """Samples of prompt + response + EOS with prompt lengths (1..9) and response lengths (1..7)."""
    rng = np.random.default_rng(seed)
    prompts, rows = [], []
    for _ in range(n):
        prompt, response = rng.integers(1, 10), rng.integers(1, 8)
        rows.append(np.concatenate([rng.integers(3, VOCAB, size=prompt + response), [EOS]]))
        prompts.append(prompt)
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows])])
    return TokenSequences(np.concatenate(rows), offsets, np.array(prompts))


@pytest.fixture(scope="module")
def model():
    return packing_llama("sdpa")


@pytest.fixture(scope="module")
def data():
    return prompt_samples()


def batches(data: TokenSequences, mode: str, micro_batch_size: int = 4) -> list[dict]:
    params = TrainParams.model_validate({"batching": {"mode": mode, "micro_batch_size": micro_batch_size}})
    sampler, collator = make_batching(params, data.lengths, pad_id=PAD, max_length=32, seed=0)
    if mode == "packed":  # the loop builds the block mask on the device; here the collator builds it
        collator = PackedCollator(pad_id=PAD, budget=collator.budget, attention_mask_format="bool")
    return list(DataLoader(data, batch_sampler=sampler, collate_fn=collator))


def alone_loss(model, ids: np.ndarray, prompt_length: int) -> torch.Tensor:
    """Summed loss of one sample run alone, scored only on positions after its prompt (an independent
    check)."""
    input_ids = torch.as_tensor(ids, dtype=torch.int64)[None]
    logits = model(input_ids=input_ids).logits[0, :-1]
    first_target = max(prompt_length, 1)
    return F.cross_entropy(logits[first_target - 1 :], input_ids[0, first_target:], reduction="sum")


@pytest.mark.parametrize("mode", MODES)
def test_prompt_labels_are_ignored_and_response_and_eos_are_targets(data, mode):
    seen = 0
    for batch in batches(data, mode):
        labels, ids = batch["labels"], batch["input_ids"]
        starts = (batch["position_ids"] == 0) if "position_ids" in batch else None
        for row in range(ids.shape[0]):
            # Walk the row's samples: packed rows restart position ids per sample; padded rows hold one.
            bounds = torch.nonzero(starts[row]).flatten().tolist() if starts is not None else [0]
            for start in bounds:
                sample = _identify(data, ids[row, start:])
                if sample is None:
                    continue  # a padding tail
                length, prompt = int(data.lengths[sample]), int(data.prompt_lengths[sample])
                span = labels[row, start : start + length]
                assert (span[:prompt] == IGNORE_INDEX).all()
                assert (span[prompt:] == ids[row, start + prompt : start + length]).all()
                assert span[-1] == EOS
                seen += 1
        assert int(batch["num_target_tokens"]) == int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert seen == len(data)
    total = sum(int(batch["num_target_tokens"]) for batch in batches(data, mode))
    assert total == int((data.lengths - data.prompt_lengths).sum()) == data.num_target_tokens


def _identify(data: TokenSequences, tail: torch.Tensor) -> int | None:
    for index in range(len(data)):
        ids = data[index]
        if len(tail) >= len(ids) and np.array_equal(tail[: len(ids)].numpy(), ids):
            return index
    return None


@pytest.mark.parametrize("mode", MODES)
def test_batched_loss_equals_the_sum_of_samples_alone_scored_after_the_prompt(model, data, mode):
    with torch.no_grad():
        expected = sum(alone_loss(model, data[i], int(data.prompt_lengths[i])) for i in range(len(data)))
        got, targets = torch.zeros((), dtype=torch.float64), 0
        for batch in batches(data, mode):
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
            loss_sum, n = causal_lm_loss_sum(model(**inputs).logits, batch["labels"])
            got, targets = got + loss_sum, targets + int(n)
    assert targets == data.num_target_tokens
    # batched (packed or padded rows) vs each sample alone: another kernel layout, then a reordered sum
    assert float(got) == pytest.approx(float(expected), rel=OTHER_FP32_KERNEL["rtol"])


@pytest.mark.parametrize(
    "collator", [DynamicPaddingCollator(pad_id=PAD), PackedCollator(pad_id=PAD, budget=TokenBudget(64, 2))]
)
def test_prompt_tokens_get_no_gradient_and_the_eos_does(model, data, collator):
    features = data.__getitems__(range(4))
    batch = collator(features)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    logits = model(**inputs).logits.detach().requires_grad_(True)
    loss_sum, _ = causal_lm_loss_sum(logits, batch["labels"])
    loss_sum.backward()
    grad_norm = logits.grad.norm(dim=-1)  # per position: the logit that predicts the next token
    predicts = batch["labels"][:, 1:]  # position t predicts labels[t + 1]
    ids = batch["input_ids"][:, 1:]
    prompt_positions = (predicts == IGNORE_INDEX) & (ids != PAD)
    assert prompt_positions.any() and (grad_norm[:, :-1][prompt_positions] == 0).all()
    eos_positions = predicts == EOS
    assert int(eos_positions.sum()) == 4 and (grad_norm[:, :-1][eos_positions] > 0).all()


def test_prompt_token_inputs_still_condition_the_response(model, data):
    """Changing a prompt token's *input* may change the loss (the response is conditioned on it);
    the prompt's own labels never count."""
    collator = DynamicPaddingCollator(pad_id=PAD)
    features = data.__getitems__([0])
    changed = dict(features[0], input_ids=features[0]["input_ids"].copy())
    changed["input_ids"][0] = (changed["input_ids"][0] + 1) % VOCAB or 3
    with torch.no_grad():
        losses = []
        for feature in (features[0], changed):
            batch = collator([feature])
            losses.append(
                causal_lm_loss_sum(
                    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits,
                    batch["labels"],
                )[0]
            )
    assert batch["labels"][0, 0] == IGNORE_INDEX
    assert float(losses[0]) != float(losses[1])


def test_token_sequences_reads_prompt_lengths_from_arrow(data):
    import pyarrow as pa

    table = pa.table(
        {
            "input_ids": [data[i].tolist() for i in range(len(data))],
            "prompt_length": pa.array(data.prompt_lengths, type=pa.int32()),
        }
    )
    loaded = TokenSequences.from_arrow(table)
    assert np.array_equal(loaded.prompt_lengths, data.prompt_lengths)
    assert loaded.__getitems__([1])[0]["prompt_length"] == data.prompt_lengths[1]
    with pytest.raises(ValueError, match="shorter than its sample"):
        TokenSequences(data.values, data.offsets, data.lengths)
