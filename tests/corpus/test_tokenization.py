import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from fastlm.corpus.tokenization import tokenize_texts


def test_every_sample_ends_with_one_eos_and_respects_max_length(bpe_tokenizer, sample_texts):
    tokens = tokenize_texts(sample_texts, bpe_tokenizer, max_length=16, num_proc=1)
    eos = bpe_tokenizer.eos_token_id
    lengths = tokens.lengths
    assert len(lengths) == len(sample_texts) and lengths.max() <= 16 and lengths.min() >= 1
    ends = tokens.offsets[1:] - 1
    assert np.all(tokens.values[ends] == eos)
    assert np.count_nonzero(tokens.values == eos) == len(sample_texts)  # no other EOS anywhere
    full = [bpe_tokenizer(text)["input_ids"] for text in sample_texts]
    assert list(tokens.truncated) == [len(ids) > 15 for ids in full]
    for row, ids in enumerate(full[:50]):
        assert list(tokens.values[tokens.offsets[row] : tokens.offsets[row + 1]]) == ids[:15] + [eos]


def test_pool_gives_the_same_ids_as_one_process(bpe_tokenizer, sample_texts):
    one = tokenize_texts(sample_texts, bpe_tokenizer, max_length=32, batch_size=50, num_proc=1)
    two = tokenize_texts(sample_texts, bpe_tokenizer, max_length=32, batch_size=50, num_proc=2)
    assert np.array_equal(one.values, two.values) and np.array_equal(one.offsets, two.offsets)


def test_eos_added_by_the_tokenizer_itself_is_not_doubled():
    backend = Tokenizer(models.WordLevel({"a": 0, "b": 1, "</s>": 2, "<s>": 3}, unk_token="a"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 3), ("</s>", 2)]
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", bos_token="<s>")
    tokens = tokenize_texts(["a b", "b b b b b b"], tokenizer, max_length=4, num_proc=1)
    rows = [list(tokens.values[s:e]) for s, e in zip(tokens.offsets[:-1], tokens.offsets[1:], strict=True)]
    assert rows == [[3, 0, 1, 2], [3, 1, 1, 2]]
    assert list(tokens.truncated) == [False, True]


def test_arrow_table_has_ids_and_lengths(bpe_tokenizer):
    tokens = tokenize_texts(["hello", "world again"], bpe_tokenizer, max_length=8, num_proc=1)
    table = tokens.to_arrow(np.array([1]))
    assert table.column_names == ["input_ids", "length"]
    row = table.to_pylist()[0]
    assert row["length"] == len(row["input_ids"]) and row["input_ids"][-1] == bpe_tokenizer.eos_token_id


@pytest.mark.parametrize("texts", [[], [""]])
def test_edge_inputs(bpe_tokenizer, texts):
    tokens = tokenize_texts(texts, bpe_tokenizer, max_length=4, num_proc=1)
    assert len(tokens.lengths) == len(texts)
    assert all(length == 1 for length in tokens.lengths)  # an empty text is just EOS
