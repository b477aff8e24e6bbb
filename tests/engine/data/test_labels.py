import numpy as np
import torch
from tokenizers import Tokenizer, models
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

from fastlm.engine.data import (
    IGNORE_INDEX,
    DynamicPaddingCollator,
    causal_lm_labels,
    count_target_tokens,
    packed_causal_lm_labels,
    packed_layout,
    real_token_mask,
)

EOS = 2  # also the pad id below


def _tokenizer_with_pad_equal_eos() -> PreTrainedTokenizerFast:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": EOS, **{f"w{i}": i + 3 for i in range(20)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", unk_token="<unk>")
    tokenizer.pad_token = tokenizer.eos_token
    assert tokenizer.pad_token_id == tokenizer.eos_token_id == EOS
    return tokenizer


SAMPLES = [[5, 6, 7, EOS], [8, EOS], [9, 10, 11, 12, 13, EOS]]


def test_eos_is_a_target_when_pad_equals_eos_unlike_transformers_lm_collator():
    tokenizer = _tokenizer_with_pad_equal_eos()
    ours = DynamicPaddingCollator.from_tokenizer(tokenizer)(SAMPLES)
    theirs = DataCollatorForLanguageModeling(tokenizer, mlm=False, pad_to_multiple_of=8)(
        [{"input_ids": ids} for ids in SAMPLES]
    )
    assert torch.equal(ours["input_ids"], theirs["input_ids"])  # same padded ids: pad = EOS = 2
    eos_positions = [(row, len(ids) - 1) for row, ids in enumerate(SAMPLES)]
    for row, col in eos_positions:
        assert ours["labels"][row, col] == EOS  # the EOS that ends each sample is learned
        # transformers sets -100 on every id equal to the pad id: the EOS is never learned.
        assert theirs["labels"][row, col] == IGNORE_INDEX
    assert torch.equal(ours["labels"] == IGNORE_INDEX, ours["attention_mask"] == 0)  # -100 exactly on padding
    assert int(ours["num_target_tokens"]) == sum(len(ids) - 1 for ids in SAMPLES)
    assert int(count_target_tokens(theirs["labels"])) == sum(len(ids) - 2 for ids in SAMPLES)


def test_padded_labels_come_from_the_mask_not_from_token_values():
    input_ids = torch.tensor([[4, EOS, EOS, 7, EOS, 0, 0, 0]])  # a real EOS and a real 0 inside the sample
    mask = real_token_mask(torch.tensor([5]), 8)
    labels = causal_lm_labels(input_ids, mask)
    assert labels.tolist() == [[4, EOS, EOS, 7, EOS, -100, -100, -100]]
    assert int(count_target_tokens(labels)) == 4  # label 0 of a row is never predicted


def test_packed_labels_drop_padding_and_every_cross_sample_transition():
    lengths = [3, 2, 4]
    layout = packed_layout([lengths], 12)
    input_ids = torch.tensor([[11, 12, EOS, 21, EOS, 31, 32, 33, EOS, EOS, EOS, EOS]])  # pad = EOS
    labels = packed_causal_lm_labels(input_ids, layout.position_ids, layout.real_mask)
    # Position t predicts label t + 1: the labels at sample starts (3, 5) would be predicted from the previous
    # sample's EOS; they are -100, as are the padding positions, while each sample's EOS stays a target.
    assert labels.tolist() == [[-100, 12, EOS, -100, EOS, -100, 32, 33, EOS, -100, -100, -100]]
    assert int(count_target_tokens(labels)) == sum(n - 1 for n in lengths)
    assert int(count_target_tokens(labels)) == int((labels != IGNORE_INDEX).sum())


def test_labels_accept_numpy_built_batches_of_any_int_dtype():
    input_ids = torch.from_numpy(np.array([[3, 4, EOS, 0]], dtype=np.int32))
    labels = causal_lm_labels(input_ids, torch.tensor([[1, 1, 1, 0]]))
    assert labels.dtype == torch.int32 and labels.tolist() == [[3, 4, EOS, -100]]
