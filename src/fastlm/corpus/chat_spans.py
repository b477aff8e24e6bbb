"""Where a chat's earlier assistant answers are in its rendered prompt, so that ``split.train_turns: all``
trains them (``prompts.prompt_frame`` keeps them as ``answer_spans``, ``prompts.tokenize_pairs`` as token
ranges).

Finding an answer's characters (``answer_spans``), in the order tried:

1. The marked render: the chat rendered once more by its chat template with a unique mark (``ANSWER_MARK``
   around the turn's index) in place of each earlier answer. Where putting the answers back in their marks'
   places gives the prompt exactly, the marks' places are the answers'. This holds for every template that
   writes an answer as the data gives it, whatever text it puts around it.
2. Where that render is refused or differs, each answer on its own: the chat rendered with a mark in that
   answer's place alone, accepted as above (so one answer the template rewrites leaves the others found);
   else the boundary search between prefix renders (a template that reads an answer's text, e.g. a header
   that depends on it): the answer is searched between the render of the chat up to the turn before it and
   the render up to the turn after it (each a prefix of the prompt), before the next turn's content (a user
   turn that quotes it is never taken), and taken only where its text is there once (never a header that
   holds its text; identical answers in a row each in its own turn).
3. An earlier answer that calls tools (``tool_calls``): its whole rendered form (``tool_calls.rendered_turn``:
   the template's text for the turn after the chat before it with the generation prompt, the end of turn
   left out) is looked for where the prompt's render of the chat before it ends (with the generation
   prompt, else without it, only the turn's header between); found there, that text
   trains as the template writes it (the call, and the content with it), else the turn stays an input (a
   template that writes the last turn of a render otherwise than the same turn with others after it, as
   Qwen3's writes an empty think block), counted among the answers left out.
4. Otherwise the answer has no range: a template that rewrites it (Qwen3's drops its ``<think>``
   reasoning, a template that trims or changes its text). It stays an input, the chat's other answers
   train; the split says the answers left out and their chats in one warning with their counts. Its
   written form is not trained: a stripped answer as a target would teach a reasoning model to answer
   without its reasoning, and any other rewrite is the template's text, not the data's.

An answer's range takes the tokenizer's EOS after it where the template writes it there (an instruct
template's end of turn: Qwen3's ``<|im_end|>``, Llama-3's ``<|eot_id|>``). Without a chat template the
``"role: content"`` lines put each answer where its place is known.

The character ranges become token ranges through the fast tokenizer's character map
(``prompt_ids_and_answer_ranges``: the tokens that overlap a range; the prompt's ids are those of the same
encoding, so it is encoded once) and follow the prompt's truncation into the sample (``kept_answer_ranges``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence

import numpy as np
from tokenizers import Tokenizer

from fastlm.corpus.chat_template import RESPONSE_ROLE, apply_template, has_chat_template
from fastlm.corpus.tokenization import call_chunks, encode_ragged, fork_map, resolve_num_proc
from fastlm.corpus.tool_calls import rendered_turn

__all__ = ["ANSWER_MARK", "answer_spans", "kept_answer_ranges", "prompt_ids_and_answer_ranges"]

log = logging.getLogger(__name__)

# What an earlier answer is rendered as to find its place in a chat's render: characters of a private use
# plane around its index (a chat that holds them anyway is found by the slower search).
ANSWER_MARK = ("\U000f0000", "\U000f0001")
# Prompts read per call for their character maps: every chat with earlier answers went in one call, whose
# encodings (ids, offsets, masks) all stay until it returns; also bounded by MAX_CHARS_PER_CALL characters.
SPAN_CALL_TEXTS = 20_000


def answer_spans(
    history: Sequence[Mapping],
    prompt: str,
    template: str,
    tokenizer=None,
    variables: Mapping | None = None,
    tools: Sequence[Mapping] | None = None,
) -> str | None:
    """The earlier assistant answers of ``history`` in its rendered ``prompt`` (``render_messages``'s output
    for the same arguments) as ``"start:end"`` character ranges, space-separated ("" when it has none): each
    answer's content and, where the tokenizer's EOS follows it (an instruct template's end of turn), the EOS.
    An answer that is not where the render puts it as the data gives it (a template that rewrites it) has no
    range: it stays an input, the chat's other answers train. None where none of its answers is found.

    With a chat template, the chat is rendered once more with a unique mark in place of each earlier answer:
    where putting the answers back in their marks' places gives ``prompt`` exactly, the marks' places are the
    answers'. Otherwise each answer on its own: the chat rendered with a mark in its place alone, taken where
    putting it back gives ``prompt`` exactly; else (a template that reads an answer's text) it is searched
    between the renders of the chat up to the turn before it and up to the content of the turn after it,
    each a prefix of ``prompt`` (so a user turn that quotes the answer is never taken for it), and taken
    only where its text is there once (never a header that holds its text). An answer that calls tools is
    found where its whole rendered form is (``tool_calls.rendered_turn``). ``tools``: the row's function
    schemas, given to every render. Without a template, its place in the ``"role: content"`` lines is known.
    """
    answers = [index for index, message in enumerate(history) if message["role"] == RESPONSE_ROLE]
    if not answers:
        return ""
    if has_chat_template(tokenizer):
        render = _Render(tokenizer, variables or {}, tools)
        calls = [index for index in answers if history[index].get("tool_calls") is not None]
        answers = [index for index in answers if index not in calls]
        spans = _marked_answer_spans(history, prompt, render, answers) if answers else []
        if spans is None:
            spans = _each_answer_spans(history, prompt, render, answers)
        spans = sorted([*spans, *_call_spans(history, prompt, render, calls)])
        return " ".join(f"{start}:{end}" for start, end in spans) if spans else None
    if template.count("{prompt}") != 1:
        return None
    spans, at = [], template.index("{prompt}")
    for message in history:
        head = f"{message['role']}: "
        if message["role"] == RESPONSE_ROLE:
            spans.append(f"{at + len(head)}:{at + len(head) + len(message['content'])}")
        at += len(head) + len(message["content"]) + 1
    return " ".join(spans)


class _Render:
    """A chat's renders by the tokenizer's chat template, with the template ``variables`` and the row's
    ``tools``."""

    def __init__(self, tokenizer, variables: Mapping, tools):
        self.tokenizer, self.variables, self.tools = tokenizer, variables, tools

    def __call__(self, history, *, generation_prompt: bool) -> str:
        return apply_template(
            history, self.tokenizer, self.variables, generation_prompt=generation_prompt, tools=self.tools
        )

    @property
    def eos(self) -> str | None:
        return getattr(self.tokenizer, "eos_token", None)


def _call_spans(history, prompt: str, render: _Render, calls: list[int]) -> list[list[int]]:
    """The ranges of the answers that call tools (indices ``calls`` of ``history``): each one's whole rendered
    form (``rendered_turn``) where the prompt holds it after the render of the chat before it, with the EOS
    where it follows; an answer not found so has none."""
    spans = []
    for index in calls:
        try:
            found = rendered_turn(
                history[:index], history[index], render.tokenizer, render.variables, render.tools
            )
        except Exception:  # noqa: BLE001 - a template may refuse a part of a chat: no range then
            found = None
        if found is None or not found[1]:
            continue
        start = (
            len(found[0])
            if prompt.startswith(found[0] + found[1])
            else _turn_after(history, index, prompt, render, found[1])
        )
        if start is None:
            continue
        end = start + len(found[1])
        if render.eos and prompt.startswith(render.eos, end):
            end += len(render.eos)
        spans.append([start, end])
    return spans


def _turn_after(history, index: int, prompt: str, render: _Render, text: str) -> int | None:
    """Where ``text`` (turn ``index``'s rendered form) begins in ``prompt``, in the turn after the render of
    the chat before it (a prefix of ``prompt``; only the turn's header between them, no EOS), or None. The
    generation prompt may hold more than a turn's header inside a chat does: Qwen3's with ``enable_thinking:
    false`` ends with an empty think block an earlier turn is written without."""
    try:
        before = render(history[:index], generation_prompt=False)
    except Exception:  # noqa: BLE001 - a template may refuse a part of a chat: no range then
        return None
    if not prompt.startswith(before):
        return None
    at = prompt.find(text, len(before))
    if at < 0 or (render.eos and render.eos in prompt[len(before) : at]):
        return None
    return at


def _each_answer_spans(history, prompt: str, render: _Render, answers: list[int]) -> list:
    """The ranges of the answers (indices ``answers`` of ``history``) found one at a time, in order: by a
    render with a mark in that answer's place alone, else by the search between prefix renders; an answer
    found by neither (rewritten by the template, or not told apart) has none."""
    search = _answer_search(history, prompt, render)
    spans, cursor = [], 0
    for index in answers:
        marked = _marked_answer_spans(history, prompt, render, [index])
        span = marked[0] if marked else search(index, cursor)
        if span is not None and span[0] >= cursor:
            spans.append(span)
            cursor = span[1]
    return spans


def _marked_answer_spans(history, prompt: str, render: _Render, answers: list[int]) -> list | None:
    """The ranges of the answers (indices ``answers`` of ``history``) where the chat rendered with a mark in
    each of their places gives ``prompt`` once the answers are put back in them, else None."""
    marks = {index: f"{ANSWER_MARK[0]}{index}{ANSWER_MARK[1]}" for index in answers}
    marked = [
        {**message, "content": marks[index]} if index in marks else message
        for index, message in enumerate(history)
    ]
    try:
        text = render(marked, generation_prompt=True)
    except Exception:  # noqa: BLE001 - a template may refuse a mark: the slower search then
        return None
    eos = render.eos
    pieces, spans, at, size = [], [], 0, 0
    for index in answers:
        message = history[index]
        found = text.find(marks[index], at)
        if found < 0 or text.count(marks[index]) != 1:
            return None
        pieces += [text[at:found], message["content"]]
        start = size + found - at
        size = start + len(message["content"])
        spans.append([start, size])
        at = found + len(marks[index])
    pieces.append(text[at:])
    if "".join(pieces) != prompt:
        return None
    for span in spans:
        if eos and prompt.startswith(eos, span[1]):
            span[1] += len(eos)
    return spans


def _answer_search(history, prompt: str, render: _Render):
    """``find(index, cursor)``: the range of answer ``history[index]`` in ``prompt`` at or after ``cursor``,
    searched between the renders of the chat around it (renders shared by every answer), or None."""
    rendered: dict[int, int | None] = {0: 0}

    def boundary(count: int) -> int | None:  # where the render of the first ``count`` messages ends
        if count not in rendered:
            try:
                text = render(history[:count], generation_prompt=False)
            except Exception:  # noqa: BLE001 - a template may refuse a part of a chat: no range then
                text = None
            rendered[count] = len(text) if isinstance(text, str) and prompt.startswith(text) else None
        return rendered[count]

    eos = render.eos

    def find(index: int, cursor: int) -> list[int] | None:
        before = [n for n in range(index, 0, -1) if history[n - 1]["role"] != RESPONSE_ROLE][:1]
        after = [n for n in range(index + 2, len(history) + 1) if history[n - 1]["role"] != RESPONSE_ROLE][:1]
        lower = boundary(before[0]) if before else 0
        upper = boundary(after[0]) if after else len(prompt)
        if lower is None or upper is None:
            return None
        if after:  # the answer ends before the next turn's content (which may quote it)
            quoted = prompt.rfind(history[after[0] - 1]["content"], lower, upper)
            upper = quoted if quoted >= 0 else upper
        content, lower = history[index]["content"], max(lower, cursor)
        # the answers after it up to the next turn, in order: the same text there is theirs
        run = history[index + 1 : after[0] - 1] if after else history[index + 1 :]
        found = [prompt.find(content, lower, upper)]
        while found[-1] >= 0:  # every place of its text, overlapping ones too
            found.append(prompt.find(content, found[-1] + 1, upper))
        start = found[0]
        if start < 0 or len(found) - 1 != 1 + sum(m["content"] == content for m in run):
            return None  # not there, or not told apart from a header or another copy of its text
        end = start + len(content)
        if eos and prompt.startswith(eos, end) and end + len(eos) <= upper:
            end += len(eos)
        return [start, end]

    return find


def prompt_ids_and_answer_ranges(
    prompts: Sequence[str],
    spans: Sequence[str],
    shifts: np.ndarray,
    tokenizer,
    *,
    batch_size: int = 20_000,
    num_proc: int | str = "auto",
) -> tuple[tuple[np.ndarray, np.ndarray], list[np.ndarray]]:
    """The raw ids of ``prompts`` (``encode_ragged``'s values and lengths: no special tokens, no EOS, no
    truncation) and each prompt's answer ranges (``spans[i]``: ``"start:end"`` characters of its uncut text,
    ``shifts[i]`` characters cut from its start since) as ``[k, 2]`` ranges of those ids: the tokens that
    overlap a range (a byte-level token may carry the space before an answer's first word: it is that word's
    token). A prompt with ranges is encoded once, with the fast tokenizer's character map the ranges are read
    from (its ids are that encoding's); the others without one. A slow tokenizer has no map: its chats train
    their last answer only (said once)."""
    out = [np.zeros((0, 2), dtype=np.int64)] * len(prompts)
    rows = [i for i, text in enumerate(spans) if text]
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None and rows:
        log.warning(
            "%s is a slow tokenizer (no character map): %d chats train their last answer only.",
            type(tokenizer).__name__,
            len(rows),
        )
    if backend is None or not rows:
        return encode_ragged(
            prompts, tokenizer, add_special_tokens=False, batch_size=batch_size, num_proc=num_proc
        ), out
    others = [i for i, text in enumerate(spans) if not text]
    plain = encode_ragged(
        [prompts[i] for i in others],
        tokenizer,
        add_special_tokens=False,
        batch_size=batch_size,
        num_proc=num_proc,
    )
    backend = Tokenizer.from_str(backend.to_str())  # a copy: without the tokenizer.json's padding/truncation
    backend.no_padding()
    backend.no_truncation()
    # with their character maps (~80 bytes a token, the ids 4): each bounded call's read and let go
    chunks, position = [], 0
    for texts in call_chunks([prompts[i] for i in rows], SPAN_CALL_TEXTS):
        chunk_rows = rows[position : position + len(texts)]
        position += len(texts)
        chunks.append([(texts[k], spans[row], int(shifts[row])) for k, row in enumerate(chunk_rows)])
    parts = fork_map(_mapped_chunk, chunks, resolve_num_proc(num_proc, len(rows)), backend)
    mapped = (
        np.concatenate([part[0] for part in parts]),
        np.concatenate([part[1] for part in parts]),
    )
    for row, ranges in zip(rows, (ranges for part in parts for ranges in part[2]), strict=True):
        out[row] = ranges
    return _interleave(len(prompts), (others, plain), (rows, mapped)), out


def _mapped_chunk(backend, chunk) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """One call's prompts (``(text, spans, shift)``) encoded with their character maps: their ids (values,
    lengths) and answer token ranges; the encodings let go when it returns."""
    encodings = backend.encode_batch([text for text, _, _ in chunk], add_special_tokens=False)
    ids = [encoding.ids for encoding in encodings]
    lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
    ranges = [
        _answer_tokens(encoding, spans, shift, len(text), count)
        for (text, spans, shift), encoding, count in zip(chunk, encodings, lengths.tolist(), strict=True)
    ]
    return values, lengths, ranges


def _interleave(size: int, *parts) -> tuple[np.ndarray, np.ndarray]:
    """Ragged ids of ``size`` rows from ``parts``, each ``(rows, (values, lengths))``: the ids of its rows,
    in their order."""
    lengths = np.zeros(size, dtype=np.int64)
    for rows, (_, part_lengths) in parts:
        lengths[np.asarray(rows, dtype=np.int64)] = part_lengths
    starts = np.cumsum(lengths) - lengths
    values = np.empty(int(lengths.sum()), dtype=np.int32)
    for rows, (part_values, part_lengths) in parts:
        row_starts = np.repeat(starts[np.asarray(rows, dtype=np.int64)], part_lengths)
        within = np.arange(len(part_values), dtype=np.int64) - np.repeat(
            np.cumsum(part_lengths) - part_lengths, part_lengths
        )
        values[row_starts + within] = part_values
    return values, lengths


def _answer_tokens(encoding, spans: str, shift: int, size: int, count: int) -> np.ndarray:
    """The ``[k, 2]`` token ranges of one prompt's ``"start:end"`` character ranges (``shift`` characters cut
    from its start since) in its ``encoding`` of ``size`` characters into ``count`` tokens."""
    chars = np.array([pair.split(":") for pair in spans.split()], dtype=np.int64) - shift
    tokens = np.array(
        [
            (
                _token_at(encoding, max(begin, 0), size, count),
                _token_at(encoding, max(end, 0), size, count, True),
            )
            for begin, end in chars
        ],
        dtype=np.int64,
    ).reshape(-1, 2)
    return tokens[tokens[:, 1] > tokens[:, 0]]


def _token_at(encoding, char: int, size: int, count: int, after: bool = False) -> int:
    """The first token that ends after character ``char`` (``after``: the first that starts at or after it) of
    an ``encoding`` of a ``size``-character text into ``count`` tokens; characters no token covers (white
    space a tokenizer drops) are passed over."""
    while char < size:
        token = encoding.char_to_token(char)
        if token is not None:
            return token + 1 if after and encoding.token_to_chars(token)[0] < char else token
        char += 1
    return count


def kept_answer_ranges(spans: list[np.ndarray], added: np.ndarray, head: np.ndarray, cut: np.ndarray):
    """Token ranges of raw prompt ids into the kept sample: ``added`` ids put in front (a BOS), the ``cut``
    ids after the first ``head`` dropped; ranges cut away dropped, a range cut in two keeps its end, none
    starts at position 0 (nothing predicts it). As ``TokenizedTexts.answer_spans``."""
    kept = []
    for pairs, front, keep_head, removed in zip(spans, added, head, cut, strict=True):
        pairs = pairs + front
        pairs = np.maximum(pairs, keep_head + removed) - removed
        pairs[:, 0] = np.maximum(pairs[:, 0], 1)
        kept.append(pairs[pairs[:, 1] > pairs[:, 0]].reshape(-1))
    counts = np.fromiter((len(pairs) for pairs in kept), dtype=np.int64, count=len(kept))
    values = np.concatenate(kept).astype(np.int32) if kept else np.zeros(0, np.int32)
    return values, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
