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
        labels = batch["labels"]
        for sample, span, ids in samples_of(batch, data):
            prompt = int(data.prompt_lengths[sample])
            assert (span[:prompt] == IGNORE_INDEX).all()
            assert (span[prompt:] == ids[prompt:]).all()
            assert span[-1] == EOS
            seen += 1
        assert int(batch["num_target_tokens"]) == int((labels[:, 1:] != IGNORE_INDEX).sum())
    assert seen == len(data)
    total = sum(int(batch["num_target_tokens"]) for batch in batches(data, mode))
    assert total == int((data.lengths - data.prompt_lengths).sum()) == data.num_target_tokens


def samples_of(batch: dict, data: TokenSequences):
    """(sample index, its labels, its ids) of each sample of a batch: packed rows restart position ids per
    sample, padded rows hold one (a padding tail is no sample)."""
    labels, ids = batch["labels"], batch["input_ids"]
    starts = (batch["position_ids"] == 0) if "position_ids" in batch else None
    for row in range(ids.shape[0]):
        bounds = torch.nonzero(starts[row]).flatten().tolist() if starts is not None else [0]
        for start in bounds:
            sample = _identify(data, ids[row, start:])
            if sample is not None:
                end = start + int(data.lengths[sample])
                yield sample, labels[row, start:end], ids[row, start:end]


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


def chat_samples(seed: int = 1, n: int = 12) -> TokenSequences:
    """Prompt/response samples whose prompts hold 0-2 earlier answers (``answer_spans``, trained too)."""
    rng = np.random.default_rng(seed)
    rows, prompts, spans = [], [], []
    for _ in range(n):
        prompt, response = int(rng.integers(6, 15)), int(rng.integers(1, 7))
        rows.append(np.concatenate([rng.integers(3, VOCAB, size=prompt + response), [EOS]]))
        prompts.append(prompt)
        cuts = np.sort(rng.choice(np.arange(1, prompt + 1), size=2 * int(rng.integers(0, 3)), replace=False))
        spans.append(cuts.astype(np.int32))
    offsets = np.concatenate([[0], np.cumsum([len(row) for row in rows])])
    span_offsets = np.concatenate([[0], np.cumsum([len(pairs) for pairs in spans])])
    return TokenSequences(
        np.concatenate(rows), offsets, np.array(prompts), answer_spans=(np.concatenate(spans), span_offsets)
    )


def _trained_alone(data: TokenSequences, index: int) -> np.ndarray:
    """The positions of sample ``index`` a position before it is trained to predict (its answers inside the
    prompt, its response, its EOS), from the sample alone: an independent reading of the data."""
    length, prompt = int(data.lengths[index]), int(data.prompt_lengths[index])
    trained = np.zeros(length, dtype=bool)
    trained[max(prompt, 1) :] = True
    for start, end in data.answer_spans_of(index):
        trained[start:end] = True
    trained[0] = False
    return trained


@pytest.mark.parametrize("mode", MODES)
def test_earlier_answers_inside_the_prompt_are_trained_in_every_mode(model, mode):
    """A chat's earlier assistant answers sit inside its prompt: they were never trained (only the last
    answer was), where TRL's assistant_only_loss trains every answer. Each batching mode now trains exactly
    the answers, the response and the EOS, and the batched loss is the samples' losses alone."""
    data = chat_samples()
    assert sum(len(data.answer_spans_of(i)) for i in range(len(data))) >= 8
    with torch.no_grad():
        expected = torch.zeros((), dtype=torch.float64)
        for index in range(len(data)):
            ids = torch.as_tensor(data[index], dtype=torch.int64)[None]
            logits = model(input_ids=ids).logits[0, :-1]
            trained = torch.from_numpy(_trained_alone(data, index))[1:]
            expected += F.cross_entropy(logits[trained], ids[0, 1:][trained], reduction="sum")
        got, targets, seen = torch.zeros((), dtype=torch.float64), 0, 0
        for batch in batches(data, mode):
            labels = batch["labels"]
            for sample, span, _ in samples_of(batch, data):
                assert np.array_equal((span != IGNORE_INDEX).numpy(), _trained_alone(data, sample))
                seen += 1
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
            loss_sum, count = causal_lm_loss_sum(model(**inputs).logits, labels)
            got, targets = got + loss_sum, targets + int(count)
            assert int(batch["num_target_tokens"]) == int(count)
    assert seen == len(data)
    assert (
        targets == data.num_target_tokens == sum(int(_trained_alone(data, i).sum()) for i in range(len(data)))
    )
    # batched (packed or padded rows) vs each sample alone: another kernel layout, then a reordered sum
    assert float(got) == pytest.approx(float(expected), rel=OTHER_FP32_KERNEL["rtol"])


def test_token_sequences_read_answer_spans_from_arrow_and_refuse_spans_outside_the_prompt():
    import pyarrow as pa

    data = chat_samples()
    spans = [data.answer_spans_of(i).reshape(-1).tolist() for i in range(len(data))]
    table = pa.table(
        {
            "input_ids": [data[i].tolist() for i in range(len(data))],
            "prompt_length": pa.array(data.prompt_lengths, type=pa.int32()),
            "answer_spans": pa.array(spans, type=pa.list_(pa.int32())),
        }
    )
    loaded = TokenSequences.from_arrow(table)
    for index in (0, 5, len(data) - 1):
        assert np.array_equal(loaded.answer_spans_of(index), data.answer_spans_of(index))
        feature = loaded.__getitems__([index])[0]
        assert np.array_equal(feature.get("answer_spans", np.zeros((0, 2))), data.answer_spans_of(index))
    picked = TokenSequences.from_arrow(table.take(pa.array([7, 2])))
    assert np.array_equal(picked.answer_spans_of(1), data.answer_spans_of(2))
    outside = np.array([0, int(data.prompt_lengths[0]) + 1], dtype=np.int32)  # into the response
    span_offsets = np.array([0] + [2] * len(data))  # the first sample's one span, no other
    with pytest.raises(ValueError, match="inside its prompt"):
        TokenSequences(data.values, data.offsets, data.prompt_lengths, answer_spans=(outside, span_offsets))


def test_answer_spans_without_prompt_lengths_are_refused_not_dropped():
    """Spans inside a prompt need the prompt: data with ``answer_spans`` but no ``prompt_length`` (made by
    hand: the split writes both) is refused, not trained as plain text without its answers."""
    import pyarrow as pa

    data = chat_samples()
    table = pa.table(
        {
            "input_ids": [data[i].tolist() for i in range(len(data))],
            "answer_spans": pa.array(
                [data.answer_spans_of(i).reshape(-1).tolist() for i in range(len(data))], pa.list_(pa.int32())
            ),
        }
    )
    with pytest.raises(ValueError, match="answer_spans need prompt_lengths"):
        TokenSequences.from_arrow(table)
