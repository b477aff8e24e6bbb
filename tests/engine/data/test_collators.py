import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from torch.utils.data import DataLoader

from fastlm.engine.data import (
    IGNORE_INDEX,
    DynamicPaddingCollator,
    LengthGroupedSampler,
    PackedBatchSampler,
    PackedCollator,
    TokenBudget,
    assign_rows,
    packed_layout,
    pad_id_of,
)
from tests.support.tiny_models import PACKING_EOS as EOS
from tests.support.tiny_models import PACKING_VOCAB as VOCAB
from tests.support.tiny_models import packing_llama

REL_TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    return packing_llama("sdpa")


def make_samples(lengths, seed=0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    samples = [rng.integers(3, VOCAB, size=n) for n in lengths]
    for ids in samples:
        ids[-1] = EOS
    return samples


SAMPLES = make_samples([7, 13, 3, 20, 9, 1, 16, 11])


def summed_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum over target tokens of the next-token cross-entropy: logits[t] against labels[t + 1]."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).double(),
        labels[:, 1:].reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )


def unpacked_loss(model, samples) -> torch.Tensor:
    """Each sample alone (batch of 1, no padding), losses summed over all samples."""
    with torch.no_grad():
        total = torch.zeros((), dtype=torch.float64)
        for ids in samples:
            ids = torch.as_tensor(ids)[None]
            total += summed_token_loss(model(input_ids=ids).logits, ids)
    return total


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs() / b.abs())


def max_logit_error(model, packed_logits: torch.Tensor, budget: TokenBudget, samples) -> float:
    """Largest |packed - alone| logit over the sample tokens (rows rebuilt as the collator lays them out)."""
    lengths = [len(ids) for ids in samples]
    rows = [[lengths[i] for i in row] for row in assign_rows(lengths, budget.row_length)]
    real = packed_layout(rows, packed_logits.shape[1]).real_mask
    with torch.no_grad():
        alone = torch.cat([model(input_ids=torch.as_tensor(ids)[None]).logits[0] for ids in samples])
    return float((packed_logits[real] - alone).abs().max())


@pytest.mark.parametrize(
    "budget", [TokenBudget.flat(96), TokenBudget(row_length=32, rows_per_batch=4)], ids=["flat", "rows"]
)
def test_packed_loss_equals_unpacked_loss(model, budget):
    batch = PackedCollator(pad_id=EOS, budget=budget)(SAMPLES)
    assert batch["attention_mask"].dtype == torch.bool and batch["attention_mask"].ndim == 4
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
        hf_mean = model(
            **{k: batch[k] for k in ("input_ids", "attention_mask", "position_ids", "labels")}
        ).loss
    packed = summed_token_loss(logits, batch["labels"])
    reference = unpacked_loss(model, SAMPLES)
    assert rel_diff(packed, reference) < REL_TOL  # measured: ~1e-8
    assert max_logit_error(model, logits, budget, SAMPLES) < 1e-5  # exact per-sample logits
    # The labels work with the model's internal shift, and num_target_tokens is its divisor.
    assert int(batch["num_target_tokens"]) == sum(len(ids) - 1 for ids in SAMPLES)
    assert rel_diff(hf_mean.double() * batch["num_target_tokens"], reference) < REL_TOL


@pytest.mark.parametrize("leaky_mask", ["none", "2d_ones"])
def test_without_the_block_mask_attention_leaks_across_samples(model, leaky_mask):
    batch = PackedCollator(pad_id=EOS, budget=TokenBudget.flat(96), pad_to_multiple_of=None)(SAMPLES)
    assert not batch["labels"].eq(IGNORE_INDEX).all(dim=0)[-1]  # the row is full: no padding tail
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if leaky_mask == "2d_ones":  # what a naive collator sends: "every token is real"
        inputs["attention_mask"] = torch.ones_like(batch["input_ids"])
    with torch.no_grad():
        logits = model(**inputs).logits
    packed = summed_token_loss(logits, batch["labels"])
    # Restarting position_ids are not enough: later samples attend to earlier ones.
    assert rel_diff(packed, unpacked_loss(model, SAMPLES)) > 1e-3
    assert max_logit_error(model, logits, TokenBudget.flat(96), SAMPLES) > 0.1


def test_eager_attention_needs_the_additive_mask():
    eager = packing_llama("eager")
    reference = unpacked_loss(eager, SAMPLES)
    budget = TokenBudget(row_length=32, rows_per_batch=4)
    results, errors = {}, {}
    for fmt in ("additive", "bool"):
        batch = PackedCollator(pad_id=EOS, budget=budget, attention_mask_format=fmt)(SAMPLES)
        with torch.no_grad():
            logits = eager(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"],
            ).logits
        results[fmt] = rel_diff(summed_token_loss(logits, batch["labels"]), reference)
        errors[fmt] = max_logit_error(eager, logits, budget, SAMPLES)
    assert results["additive"] < REL_TOL and errors["additive"] < 1e-5
    # Eager adds the mask to the scores: a bool True adds 1 and nothing is masked.
    assert results["bool"] > 1e-4 and errors["bool"] > 0.1


def test_packed_batch_layout_and_counts():
    lengths = [len(ids) for ids in SAMPLES]
    budget = TokenBudget(row_length=32, rows_per_batch=4)
    batch = PackedCollator(pad_id=EOS, budget=budget)(SAMPLES)
    # next-fit rows: [7, 13, 3] = 23, [20, 9, 1] = 30, [16, 11] = 27 -> 3 rows, padded to 32 (multiple of 8)
    assert batch["input_ids"].shape == (3, 32) and batch["attention_mask"].shape == (3, 1, 32, 32)
    assert batch["position_ids"][0, :24].tolist() == [*range(7), *range(13), *range(3), 0]
    assert int(batch["num_real_tokens"]) == sum(lengths)
    assert int(batch["num_computed_tokens"]) == 3 * 32
    assert int(batch["num_target_tokens"]) == int((batch["labels"] != IGNORE_INDEX).sum()) == sum(lengths) - 8
    assert batch["cu_seq_lens"].tolist()[-1] == 96 and int(batch["max_seqlen"]) == 20
    assert batch["input_ids"][0, :23].tolist() == np.concatenate(SAMPLES[:3]).tolist()  # row 0: samples 0-2

    fixed = PackedCollator(pad_id=EOS, budget=budget, fixed_shape=True, attention_mask_format="none")(SAMPLES)
    assert fixed["input_ids"].shape == (4, 32) and "attention_mask" not in fixed
    assert (fixed["labels"][3] == IGNORE_INDEX).all() and (fixed["input_ids"][3] == EOS).all()
    assert int(fixed["num_computed_tokens"]) == budget.tokens_per_batch

    with pytest.raises(ValueError, match="rows"):
        PackedCollator(pad_id=EOS, budget=TokenBudget(row_length=32, rows_per_batch=2))(SAMPLES)


def test_dynamic_padding_pads_to_a_multiple_of_8_and_counts_right(model):
    samples = SAMPLES[:5]  # lengths 7, 13, 3, 20, 9
    batch = DynamicPaddingCollator(pad_id=EOS)(samples)
    lengths = torch.tensor([len(ids) for ids in samples])
    assert batch["input_ids"].shape == (5, 24) and batch["attention_mask"].shape == (5, 24)
    assert torch.equal(batch["attention_mask"].sum(1), lengths)
    assert torch.equal(batch["labels"] == IGNORE_INDEX, batch["attention_mask"] == 0)  # exactly the padding
    assert int(batch["num_real_tokens"]) == 52 and int(batch["num_computed_tokens"]) == 5 * 24
    assert int(batch["num_target_tokens"]) == 52 - 5
    assert DynamicPaddingCollator(pad_id=0, pad_to_multiple_of=None)(samples)["input_ids"].shape == (5, 20)
    with torch.no_grad():  # right padding with a 2D mask is exact too
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    assert rel_diff(summed_token_loss(logits, batch["labels"]), unpacked_loss(model, samples)) < REL_TOL


def test_collators_accept_lists_arrays_and_dicts_and_pickle():
    as_lists = [ids.tolist() for ids in SAMPLES]
    as_dicts = [{"input_ids": ids, "length": len(ids)} for ids in as_lists]
    for collator in (
        DynamicPaddingCollator(pad_id=EOS),
        PackedCollator(pad_id=EOS, budget=TokenBudget(row_length=32, rows_per_batch=4)),
    ):
        clone = pickle.loads(pickle.dumps(collator))
        assert clone == collator
        outputs = [clone(SAMPLES), collator(as_lists), collator(as_dicts)]
        for out in outputs[1:]:
            assert out.keys() == outputs[0].keys()
            assert all(torch.equal(out[key], outputs[0][key]) for key in out)


class _Tokenizer:
    def __init__(self, pad, eos):
        self.pad_token_id, self.eos_token_id = pad, eos


def test_pad_id_comes_from_the_tokenizer():
    assert pad_id_of(_Tokenizer(0, EOS)) == 0
    assert pad_id_of(_Tokenizer(None, EOS)) == EOS
    assert DynamicPaddingCollator.from_tokenizer(_Tokenizer(5, EOS)).pad_id == 5
    assert PackedCollator.from_tokenizer(_Tokenizer(None, EOS), TokenBudget.flat(64)).pad_id == EOS


def test_dataloader_over_a_split_dataset():
    lengths = [len(ids) for ids in SAMPLES] * 4
    dataset = Dataset.from_dict({"input_ids": [ids.tolist() for ids in SAMPLES] * 4, "length": lengths})
    grouped = DataLoader(
        dataset,
        batch_sampler=LengthGroupedSampler(dataset["length"], batch_size=4, seed=1),
        collate_fn=DynamicPaddingCollator(pad_id=EOS),
    )
    packed = DataLoader(
        dataset,
        batch_sampler=PackedBatchSampler(
            dataset["length"], TokenBudget(row_length=32, rows_per_batch=2), seed=1
        ),
        collate_fn=PackedCollator(pad_id=EOS, budget=TokenBudget(row_length=32, rows_per_batch=2)),
    )
    for loader in (grouped, packed):
        batches = list(loader)
        assert len(batches) == len(loader)
        assert sum(int(b["num_real_tokens"]) for b in batches) == sum(lengths)
        assert sum(int(b["num_target_tokens"]) for b in batches) == sum(lengths) - len(lengths)
