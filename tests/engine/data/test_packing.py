import numpy as np
import pytest
import torch

from fastlm.engine.data import (
    TokenBudget,
    assign_rows,
    block_causal_mask,
    epoch_rng,
    pack_by_token_budget,
    pack_rows,
    packed_batch_count,
    packed_layout,
    to_additive_mask,
)


def heavy_tailed_lengths(n: int = 20_000, seed: int = 0) -> np.ndarray:
    """Lognormal lengths clipped to 1..320 (median ~55, mean ~83, a long tail up to the clip)."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(4.0, 1.0, n)), 1, 320).astype(np.int64)


@pytest.mark.parametrize("budget", [TokenBudget.flat(4096), TokenBudget(row_length=512, rows_per_batch=8)])
def test_budget_holds_every_sample_once_and_efficiency_is_high(budget):
    lengths = heavy_tailed_lengths()
    packing = pack_by_token_budget(lengths, budget, rng=epoch_rng(0, 0))
    seen = np.concatenate(packing.batches)
    assert np.array_equal(np.sort(seen), np.arange(lengths.size))  # every sample exactly once
    for batch in packing.batches:
        assert lengths[batch].sum() <= budget.tokens_per_batch
        rows = assign_rows(lengths[batch].tolist(), budget.row_length)  # what the collator will lay out
        assert len(rows) <= budget.rows_per_batch
    assert packing.num_real_tokens == lengths.sum()
    assert packing.efficiency > 0.97, packing.efficiency  # measured: 0.99 (flat 4096) and 0.999 (8 x 512)
    assert packing.efficiency == lengths.sum() / (packing.num_batches * budget.tokens_per_batch)


def test_packing_is_deterministic_per_generator_and_differs_across_epochs():
    lengths = heavy_tailed_lengths(3000)
    budget = TokenBudget.flat(2048)

    def batches(epoch):
        return [b.tolist() for b in pack_by_token_budget(lengths, budget, rng=epoch_rng(7, epoch)).batches]

    assert batches(0) == batches(0)
    assert batches(0) != batches(1)
    unshuffled = pack_by_token_budget(lengths, budget, window=len(lengths))
    assert unshuffled.efficiency > 0.99


def test_best_fit_decreasing_fills_rows_exactly_when_it_can():
    lengths = np.array([6, 4, 5, 5, 3, 7, 10])
    rows = pack_rows(lengths, np.arange(lengths.size), row_length=10)
    assert sorted(sorted(lengths[row].tolist()) for row in rows) == [[3, 7], [4, 6], [5, 5], [10]]


def test_a_sample_longer_than_a_row_is_an_error():
    with pytest.raises(ValueError, match="does not fit"):
        pack_by_token_budget([3, 9], TokenBudget(row_length=8, rows_per_batch=2))
    with pytest.raises(ValueError, match="does not fit"):
        assign_rows([3, 9], row_length=8)


def test_next_fit_rows_follow_the_packer_order():
    assert assign_rows([3, 4, 5, 2, 6], row_length=8) == [[0, 1], [2, 3], [4]]
    assert assign_rows([8, 1, 7], row_length=8) == [[0], [1, 2]]


def test_layout_restarts_positions_and_gives_varlen_boundaries():
    layout = packed_layout([[3, 2], [4], []], seq_len=6)
    assert layout.position_ids.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 4, 5]]
    assert layout.real_mask.tolist() == [[True] * 5 + [False], [True] * 4 + [False] * 2, [False] * 6]
    assert layout.sequence_ids.tolist() == [[0, 0, 0, 1, 1, 2], [3, 3, 3, 3, 4, 4], [5] * 6]
    # Boundaries of the row-major [1, 18] view: samples and padding tails are segments.
    assert layout.cu_seq_lens.tolist() == [0, 3, 5, 6, 10, 12, 18]
    assert layout.cu_seq_lens.dtype == torch.int32 and layout.max_seqlen == 6
    flat_starts = torch.nonzero(layout.position_ids.reshape(-1) == 0).flatten().tolist()
    assert flat_starts == layout.cu_seq_lens[:-1].tolist()  # what transformers derives from position_ids


def test_block_causal_mask_is_block_diagonal_and_never_empty():
    layout = packed_layout([[2, 3]], seq_len=6)
    mask = block_causal_mask(layout.sequence_ids)
    assert mask.shape == (1, 1, 6, 6) and mask.dtype == torch.bool
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],  # the padding tail only sees itself
    ]
    assert mask[0, 0].int().tolist() == expected
    additive = to_additive_mask(mask)
    assert additive.dtype == torch.float32
    assert torch.equal(additive == 0, mask) and torch.all(additive[~mask] == torch.finfo(torch.float32).min)


def test_budget_validation():
    assert TokenBudget(512, 8).tokens_per_batch == 4096 and TokenBudget.flat(4096).rows_per_batch == 1
    with pytest.raises(ValueError):
        TokenBudget(0, 1)


def row_fill(lengths: np.ndarray, row_length: int) -> float:
    rows = pack_by_token_budget(lengths, TokenBudget(row_length=row_length), window=4096).num_rows
    return lengths.sum() / (rows * row_length)


def test_auto_row_length_is_as_short_as_short_samples_allow_and_fills_rows_as_well():
    from fastlm.engine.data.packing import choose_row_length

    rng = np.random.default_rng(0)
    short = np.clip(np.round(rng.lognormal(np.log(8), 0.6, 20_000)), 1, 44).astype(np.int64)  # short reviews
    assert choose_row_length(short, 320) == 64
    assert row_fill(short, 64) >= row_fill(short, 320) - 0.01
    # samples of 33 tokens: one per 64-token row (half padding); longer rows are needed to fill as well
    uniform = np.full(5000, 33)
    chosen = choose_row_length(uniform, 320)
    assert chosen > 64 and row_fill(uniform, chosen) >= row_fill(uniform, 320) - 0.01
    tail = heavy_tailed_lengths()
    chosen = choose_row_length(tail, 512)
    assert tail.max() <= chosen < 512 and row_fill(tail, chosen) >= row_fill(tail, 512) - 0.01
    assert choose_row_length(np.append(tail, 512), 512) == 512  # a sample needs the whole row
    assert choose_row_length(np.array([3, 5]), 40) == 40  # nothing shorter than the 64-token step


def test_packed_batches_keep_their_token_budget_with_shorter_auto_rows():
    from fastlm.engine.batching import make_batching
    from fastlm.engine.config import parse_train_params

    lengths = np.clip(np.round(np.random.default_rng(1).lognormal(np.log(8), 0.6, 5000)), 1, 44).astype(
        np.int64
    )
    auto = parse_train_params({"batching": {"micro_batch_size": 32}, "runtime": {"device": "cpu"}})
    sampler, collator = make_batching(auto, lengths, pad_id=0, max_length=320, seed=0)
    assert (sampler.budget.row_length, sampler.budget.rows_per_batch) == (64, 160)
    assert sampler.budget.tokens_per_batch == 32 * 320 and collator.budget == sampler.budget
    fixed = parse_train_params({"batching": {"micro_batch_size": 32, "row_length": 320}})
    sampler, _ = make_batching(fixed, lengths, pad_id=0, max_length=320, seed=0)
    assert (sampler.budget.row_length, sampler.budget.rows_per_batch) == (320, 32)


def test_a_row_length_shorter_than_a_sample_is_refused_naming_the_parameter():
    from fastlm.engine.batching import make_batching
    from fastlm.engine.config import parse_train_params
    from fastlm.errors import ConfigError

    params = parse_train_params({"batching": {"row_length": 16}})
    with pytest.raises(
        ConfigError, match="train.batching.row_length is 16 tokens but the data has a sample of 44"
    ):
        make_batching(params, np.array([5, 44, 9]), pad_id=0, max_length=64, seed=0)


@pytest.mark.parametrize(
    ("budget", "window", "spread"),
    [
        (TokenBudget(row_length=64, rows_per_batch=8), 500, (1, 64)),  # short texts, rows exactly full too
        (TokenBudget(row_length=320, rows_per_batch=3), 4096, (1, 320)),
        (TokenBudget.flat(512), 97, (0, 40)),  # empty samples; many small windows
        (TokenBudget(row_length=48, rows_per_batch=1), 1000, (24, 48)),  # one sample a row, or two halves
    ],
)
def test_the_batch_count_from_lengths_alone_is_the_packers(budget, window, spread):
    """``packed_batch_count`` (a step plan counts every epoch's batches before training) counts what
    ``pack_by_token_budget`` packs for the same generator, without building a batch."""
    for seed in range(6):
        lengths = np.random.default_rng(seed).integers(*spread, size=3000, endpoint=True)
        packed = pack_by_token_budget(lengths, budget, rng=epoch_rng(seed, 1), window=window)
        assert (
            packed_batch_count(lengths, budget, rng=epoch_rng(seed, 1), window=window) == packed.num_batches
        )
    lengths = heavy_tailed_lengths(9000)
    for epoch in range(4):
        packed = pack_by_token_budget(lengths, TokenBudget(320, 4), rng=epoch_rng(0, epoch))
        assert packed_batch_count(lengths, TokenBudget(320, 4), rng=epoch_rng(0, epoch)) == packed.num_batches
    assert packed_batch_count(np.array([], dtype=np.int64), budget, rng=epoch_rng(0, 0)) == 0


def test_split_cuts_each_batchs_rows_in_consecutive_pieces():
    """``split``: the batches of the same packing, each one's rows cut in pieces of at most half its rows
    (the budget a piece gets); the pieces together are the batches, in order."""
    lengths = np.random.default_rng(3).integers(1, 40, size=500)
    budget = TokenBudget(row_length=48, rows_per_batch=5)
    whole = pack_by_token_budget(lengths, budget, rng=np.random.default_rng(7))
    halves = pack_by_token_budget(lengths, budget, rng=np.random.default_rng(7), split=2)
    assert halves.budget == TokenBudget(row_length=48, rows_per_batch=3)
    pieces = iter(halves.batches)
    for batch in whole.batches:
        rows = len(assign_rows(lengths[batch].tolist(), 48))
        joined = np.concatenate([next(pieces) for _ in range(2)])  # a one-row batch: its second is empty
        assert rows > 0
        np.testing.assert_array_equal(joined, batch)
    assert next(pieces, None) is None
    assert all(len(assign_rows(lengths[piece].tolist(), 48)) <= 3 for piece in halves.batches)
