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


class _RecordedBackend:
    """A ``tokenizers.Tokenizer`` that appends each batch call's text count and characters to ``log`` (a
    file: the fork pool's workers record there too)."""

    def __init__(self, inner, log):
        self.inner, self.log = inner, log

    def _record(self, texts):
        with open(self.log, "a", encoding="utf-8") as out:
            out.write(f"{len(texts)} {sum(map(len, texts))}\n")

    def encode_batch_fast(self, texts, **kwargs):
        self._record(texts)
        return self.inner.encode_batch_fast(texts, **kwargs)

    def encode_batch(self, texts, **kwargs):
        self._record(texts)
        return self.inner.encode_batch(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _SlowTokenizer:
    """A tokenizer without a Rust backend (as a slow one): batched ``__call__``s, recorded in ``calls``."""

    def __init__(self, inner):
        self.inner, self.eos_token_id, self.calls = inner, inner.eos_token_id, []

    def __call__(self, texts, **kwargs):
        self.calls.append((len(texts), sum(map(len, texts))))
        return self.inner(texts, **kwargs)


def _recorded_calls(monkeypatch, tmp_path):
    """Route every Rust tokenizer the corpus builds through ``_RecordedBackend``; the calls' file."""
    import tokenizers

    from fastlm.corpus import chat_spans

    log = tmp_path / "calls.txt"
    log.write_text("")

    class Recording:
        @staticmethod
        def from_str(text):
            return _RecordedBackend(Tokenizer.from_str(text), log)

    monkeypatch.setattr(tokenizers, "Tokenizer", Recording)
    monkeypatch.setattr(chat_spans, "Tokenizer", Recording)
    return log


def _over_budget(calls, budget):
    """The calls of more than one text whose characters exceed ``budget`` (a longer text is a call alone)."""
    return [(texts, chars) for texts, chars in calls if texts > 1 and chars > budget]


@pytest.mark.parametrize("path", ["text", "text_pool", "pairs", "slow"])
def test_no_tokenizer_call_exceeds_the_character_budget(
    path, bpe_tokenizer, sample_texts, monkeypatch, tmp_path
):
    """``split.batch_size`` counts texts: 20,000 texts of 100 KB in one call held ~67 GB. Each call is also
    bounded by ``MAX_CHARS_PER_CALL`` characters, with the same ids."""
    from fastlm.corpus import tokenization
    from fastlm.corpus.prompts import tokenize_pairs

    texts = [text * (1 + i % 7) for i, text in enumerate(sample_texts[:120])]
    prompts, responses = texts[::2], texts[1::2]
    spans = [f"0:{min(5, len(p))}" for p in prompts]  # earlier answers: their character map is read too

    def run(tokenizer):
        if path in ("text", "text_pool", "slow"):
            tokens = tokenize_texts(
                texts, tokenizer, max_length=64, batch_size=40, num_proc=2 if path == "text_pool" else 1
            )
            return tokens.to_arrow()
        tokens = tokenize_pairs(
            prompts, responses, tokenizer, max_length=64, batch_size=40, num_proc=1, answer_spans=spans
        )
        return tokens.to_arrow()

    whole = run(bpe_tokenizer)
    budget = 600
    monkeypatch.setattr(tokenization, "MAX_CHARS_PER_CALL", budget, raising=False)
    log = _recorded_calls(monkeypatch, tmp_path)
    slow = _SlowTokenizer(bpe_tokenizer)
    cut = run(slow if path == "slow" else bpe_tokenizer)
    calls = (
        slow.calls
        if path == "slow"
        else [tuple(map(int, line.split())) for line in log.read_text().split("\n") if line]
    )
    assert cut.equals(whole)
    assert len(calls) > -(-len(texts) // 40)  # the budget split the batches of 40 texts
    assert sum(texts for texts, _ in calls) >= len(prompts if path == "pairs" else texts)
    assert not _over_budget(calls, budget), calls


@pytest.mark.parametrize("num_proc", [1, 2], ids=["one_process", "pool"])
def test_a_special_tokens_text_in_a_plain_text_is_text_not_the_token(bpe_tokenizer, sample_texts, num_proc):
    """A plain text holding ``<|endoftext|>`` as characters (scraped model output, a page about tokenizers)
    was tokenized as the EOS token in the middle of its sample: the model learned to end a text and go on.
    It is text: the sample decodes back to the text, its one EOS last."""
    eos = bpe_tokenizer.eos_token_id
    marker = bpe_tokenizer.eos_token
    texts = [f"{text} {marker} and more" for text in sample_texts[:40]]
    tokens = tokenize_texts(texts, bpe_tokenizer, max_length=512, batch_size=10, num_proc=num_proc)
    assert np.count_nonzero(tokens.values == eos) == len(texts)  # each sample's last id alone
    for row, text in enumerate(texts[:10]):
        ids = tokens.values[tokens.offsets[row] : tokens.offsets[row + 1] - 1].tolist()
        assert bpe_tokenizer.decode(ids) == text
    assert bpe_tokenizer(f"a {marker}")["input_ids"][-1] == eos  # the tokenizer itself is left as it was
