"""Earlier answers' token ranges: read from the fast tokenizer's character map, one bounded call at a time."""

import weakref

import numpy as np
from tokenizers import Tokenizer

from fastlm.corpus import chat_spans
from fastlm.corpus.chat_spans import answer_token_ranges
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
    whole = answer_token_ranges(prompts, spans, shifts, tokenizer, encoded)

    held_at_calls = []

    class Watching:
        @staticmethod
        def from_str(text):
            return _WatchedBackend(Tokenizer.from_str(text), held_at_calls)

    monkeypatch.setattr(chat_spans, "Tokenizer", Watching)
    monkeypatch.setattr(chat_spans, "SPAN_CALL_TEXTS", 4)
    cut = answer_token_ranges(prompts, spans, shifts, tokenizer, encoded)

    assert len(held_at_calls) == -(-len(prompts) // 4)
    assert max(held_at_calls) <= 4, held_at_calls  # one call's encodings at most, not every earlier one
    assert sum(len(ranges) for ranges in whole) == len(prompts)
    assert all(np.array_equal(a, b) for a, b in zip(whole, cut, strict=True))
