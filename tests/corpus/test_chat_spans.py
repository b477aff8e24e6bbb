"""Earlier answers' token ranges: read from the fast tokenizer's character map, one bounded call at a time."""

import weakref
from collections import Counter

import numpy as np
from tokenizers import Tokenizer

from fastlm.corpus import chat_spans
from fastlm.corpus.chat_spans import prompt_ids_and_answer_ranges
from fastlm.corpus.tokenization import encode_ragged


class _Encoding:
    """An encoding that can be watched (a weak reference) and reads as the one it wraps."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)


class _WatchedBackend:
    """A Rust tokenizer whose ``encode_batch`` counts, at each call, earlier calls' encodings still held."""

    def __init__(self, inner, held_at_calls):
        self.inner, self.held_at_calls, self.returned = inner, held_at_calls, []

    def encode_batch(self, texts, **kwargs):
        self.held_at_calls.append(sum(ref() is not None for ref in self.returned))
        encodings = [_Encoding(encoding) for encoding in self.inner.encode_batch(texts, **kwargs)]
        self.returned.extend(weakref.ref(encoding) for encoding in encodings)
        return encodings

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_the_character_maps_are_held_one_call_at_a_time(sample_texts, monkeypatch):
    """An encoding with its character map weighs ~80 bytes a token: holding every chat's until the last call
    returned made the split's peak grow with the corpus (+1.2 GiB for 40,000 chats of 8.7 M tokens). Each
    call's maps are read and let go before the next call; the ranges are those of one call for all."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    texts = sample_texts[:90]
    prompts = [
        f"user: {a}\nassistant: {b}\nuser: {c}"
        for a, b, c in zip(texts[0::3], texts[1::3], texts[2::3], strict=True)
    ]
    spans = []  # the middle line (the first answer, after "assistant: ") of each prompt
    for prompt in prompts:
        first, second, _ = prompt.split("\n")
        spans.append(f"{len(first) + 12}:{len(first) + 1 + len(second)}")
    shifts = np.zeros(len(prompts), dtype=np.int64)
    encoded = encode_ragged(prompts, tokenizer, add_special_tokens=False, num_proc=1)
    whole_ids, whole = prompt_ids_and_answer_ranges(prompts, spans, shifts, tokenizer)

    held_at_calls = []

    class Watching:
        @staticmethod
        def from_str(text):
            return _WatchedBackend(Tokenizer.from_str(text), held_at_calls)

    monkeypatch.setattr(chat_spans, "Tokenizer", Watching)
    monkeypatch.setattr(chat_spans, "SPAN_CALL_TEXTS", 4)
    cut_ids, cut = prompt_ids_and_answer_ranges(prompts, spans, shifts, tokenizer)

    assert len(held_at_calls) == -(-len(prompts) // 4)
    assert max(held_at_calls) <= 4, held_at_calls  # one call's encodings at most, not every earlier one
    assert sum(len(ranges) for ranges in whole) == len(prompts)
    assert all(np.array_equal(a, b) for a, b in zip(whole, cut, strict=True))
    for ids in (whole_ids, cut_ids):  # the ids of the encodings with their maps: those of the prompts alone
        assert all(np.array_equal(a, b) for a, b in zip(ids, encoded, strict=True))


class _CountingBackend:
    """A Rust tokenizer that records every text it encodes, whichever encode method reads it."""

    def __init__(self, inner, encoded):
        self.inner, self.encoded = inner, encoded

    def encode_batch(self, texts, **kwargs):
        self.encoded.extend(texts)
        return self.inner.encode_batch(texts, **kwargs)

    def encode_batch_fast(self, texts, **kwargs):
        self.encoded.extend(texts)
        return self.inner.encode_batch_fast(texts, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_each_chats_prompt_is_encoded_once(sample_texts, monkeypatch):
    """A chat with earlier answers had its prompt encoded twice: once for its ids, once more for the
    character map its answers' token ranges are read from (about a quarter of the split's tokenize step).
    One encoding with the character map now gives both; the ids and ranges are those of the prompt alone."""
    import pandas as pd
    import tokenizers

    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.prompts import prompt_frame, tokenize_pairs
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    texts = [text[:50] for text in sample_texts[:24]]
    chats = [  # chats of one, two and three question/answer turns: the last two have earlier answers
        [
            message
            for turn in range(i % 3 + 1)
            for message in (
                {"role": "user", "content": texts[(i + turn) % 24]},
                {"role": "assistant", "content": texts[(i + turn + 12) % 24]},
            )
        ]
        for i in range(12)
    ]
    frame, _ = prompt_frame(
        pd.DataFrame({"chat": chats}), parse_split_params({"messages_column": "chat"}), tokenizer
    )
    prompts, responses, spans = (frame[name].tolist() for name in ("prompt", "response", "answer_spans"))
    assert sum(bool(text) for text in spans) == 8

    encoded = []

    class Counting:
        @staticmethod
        def from_str(text):
            return _CountingBackend(Tokenizer.from_str(text), encoded)

    monkeypatch.setattr(tokenizers, "Tokenizer", Counting)  # the tokenizer's copies, wherever made
    monkeypatch.setattr(chat_spans, "Tokenizer", Counting)
    tokens = tokenize_pairs(prompts, responses, tokenizer, max_length=512, num_proc=1, answer_spans=spans)

    assert Counter(encoded) == Counter(prompts + responses)  # each text once
    eos = tokenizer.eos_token_id
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        ids = tokens.values[tokens.offsets[row] : tokens.offsets[row + 1]].tolist()
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        assert ids == prompt_ids + tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        assert tokens.prompt_lengths[row] == len(prompt_ids)
    values, offsets = tokens.answer_spans
    for row, text in enumerate(spans):  # every earlier answer's tokens, read back, are its text
        pairs = values[offsets[row] : offsets[row + 1]].reshape(-1, 2)
        assert len(pairs) == len(text.split())
        row_ids = tokens.values[tokens.offsets[row] :]
        for (start, end), span in zip(pairs, text.split(), strict=True):
            begin, stop = map(int, span.split(":"))
            assert tokenizer.decode(row_ids[start:end]) == prompts[row][begin:stop]
