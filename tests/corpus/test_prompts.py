"""Prompt/response data: cleaning on the pair, chat rendering, split keys independent of the template,
tokenization with exact prompt lengths and truncation that keeps the EOS and part of the response."""

import numpy as np
import pandas as pd
import pytest
import torch

from fastlm.corpus.cleaning import clean_pairs
from fastlm.corpus.config import parse_split_params
from fastlm.corpus.prompts import (
    SYSTEM_TURN,
    clean_messages,
    prompt_frame,
    prompt_token_ids,
    render_messages,
    tokenize_pairs,
    truncate_prompt_ids,
)
from fastlm.errors import ConfigError, InputDataError
from fastlm.pipelines.split import nodes
from tests.support.chat_templates import tool_call
from tests.support.tiny_llama import llama_style_tokenizer


@pytest.fixture(scope="module")
def llama_tokenizer(sample_texts):
    return llama_style_tokenizer(sample_texts, chat_template=True)


def test_pairs_are_cleaned_and_deduplicated_as_pairs():
    kept, drops = clean_pairs(
        pd.Series(["q1 ", "q1", "q1", None, "q3", "  "]), pd.Series(["a1", "a1", "a2", "a", "", "a"])
    )
    assert kept.to_dict("records") == [{"prompt": "q1", "response": "a1"}, {"prompt": "q1", "response": "a2"}]
    assert drops == {"missing": 1, "non_string": 0, "empty": 1, "whitespace_only": 1, "duplicate": 1}


def test_messages_are_checked_cleaned_and_keyed_on_their_content():
    chats = pd.Series(
        [
            [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "hello"}],
            # duplicate after strip
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
            [{"role": "user", "content": "hi"}],  # no response
            # last is not the assistant
            [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}],
            None,
            "not a list",
            [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "q"},
                {"role": "assistant", "content": " "},
            ],
        ]
    )
    kept, drops = clean_messages(chats)
    assert len(kept) == 1 and kept.loc[0, "history"] == [{"role": "user", "content": "hi"}]
    assert drops == {
        "missing": 1,
        "non_string": 0,
        "empty": 0,
        "whitespace_only": 1,
        "malformed_messages": 3,
        "tool_calls": 0,
        "duplicate": 1,
    }


def test_split_keys_ignore_the_template_and_chat_rendering_uses_the_tokenizer(llama_tokenizer):
    raw = pd.DataFrame({"d": ["a dialogue", "another"], "s": ["sum", "mary"]})
    first, _ = prompt_frame(raw, parse_split_params({"prompt_column": "d", "response_column": "s"}))
    second, _ = prompt_frame(
        raw,
        parse_split_params(
            {"prompt_column": "d", "response_column": "s", "prompt_template": "Q: {prompt} A:"}
        ),
    )
    assert first["prompt"][0] == "a dialogue\n\n### Response:\n" and second["prompt"][0] == "Q: a dialogue A:"
    assert list(first["split_key"]) == list(second["split_key"])
    chat = pd.DataFrame({"m": [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]]})
    config = parse_split_params({"messages_column": "m"})
    rendered, _ = prompt_frame(chat, config, llama_tokenizer)
    assert rendered.loc[0, "prompt"] == "<s><|user|>hi\n<|assistant|>" and rendered.loc[0, "response"] == "yo"
    plain, _ = prompt_frame(chat, config, None)
    assert plain.loc[0, "prompt"] == "user: hi\n\n### Response:\n"
    assert (
        prompt_token_ids(llama_tokenizer, rendered.loc[0, "prompt"]).count(llama_tokenizer.bos_token_id) == 1
    )


@pytest.mark.parametrize("max_length", [2, 5, 12, 40, 400])
def test_tokenized_pairs_keep_eos_part_of_the_response_and_an_exact_prompt_length(
    llama_tokenizer, sample_texts, max_length
):
    prompts, responses = sample_texts[:40], sample_texts[40:80]
    tokens = tokenize_pairs(prompts, responses, llama_tokenizer, max_length=max_length)
    bos, eos = llama_tokenizer.bos_token_id, llama_tokenizer.eos_token_id
    for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        row = tokens.values[tokens.offsets[i] : tokens.offsets[i + 1]].tolist()
        n = int(tokens.prompt_lengths[i])
        full_prompt = prompt_token_ids(llama_tokenizer, prompt)
        full_response = llama_tokenizer(response, add_special_tokens=False)["input_ids"]
        assert len(row) <= max_length and row[-1] == eos and len(row) - n >= 2  # >= 1 response token + EOS
        assert row[:n] == truncate_prompt_ids(full_prompt, n, bos)
        assert row[n:-1] == full_response[: len(row) - n - 1]
        assert bool(tokens.truncated[i]) == (len(full_prompt) + len(full_response) + 1 > max_length)
        if len(full_prompt) + len(full_response) + 1 <= max_length:
            assert row == full_prompt + full_response + [eos]
        elif n < len(full_prompt):  # the prompt was cut first, from the left, keeping the BOS
            assert n == 0 or row[0] == bos
    if max_length == 400:
        assert not tokens.truncated.any() and np.all(tokens.prompt_lengths > 0)


def test_messages_flow_through_the_split_nodes(tmp_path, llama_tokenizer):
    llama_tokenizer.save_pretrained(tmp_path / "tok")
    chats = [
        [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        for i in range(40)
    ]
    raw = pd.DataFrame({"chat": chats})
    params = {"messages_column": "chat", "max_length": 96, "tokenizer": {"source": str(tmp_path / "tok")}}
    clean, counts = nodes.clean_corpus(raw, params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    assert list(splits.columns) == ["prompt", "response", "answer_spans", "split"]
    assert (splits["answer_spans"] == "").all()  # one-turn chats: no earlier answer
    tokenizer = nodes.build_tokenizer(splits, params)
    tokenized, fingerprint, stats = nodes.tokenize_corpus(splits, tokenizer, params)
    assert fingerprint["params"]["data_format"]["chat_template_sha256"] is not None
    row = tokenized["train"][0]
    prompt = splits[splits["split"] == "train"].iloc[0]["prompt"]
    assert row["input_ids"][: row["prompt_length"]] == prompt_token_ids(tokenizer, prompt)
    assert stats["train"]["target_tokens"] == sum(
        len(r["input_ids"]) - r["prompt_length"] for r in tokenized["train"]
    )


def test_bad_prompt_parameters_and_columns_are_one_line():
    with pytest.raises(ConfigError, match="split.prompt_column is set but split.response_column is not"):
        parse_split_params({"prompt_column": "dialogue"})
    with pytest.raises(ConfigError, match="exactly once"):
        parse_split_params({"prompt_column": "a", "response_column": "b", "prompt_template": "no slot"})
    frame = pd.DataFrame({"dialogue": ["x"]})
    frame.attrs["source_path"] = "data/01_raw/d.jsonl"
    with pytest.raises(Exception, match=r"has no column 'summary'.*split.response_column"):
        nodes.clean_corpus(frame, {"prompt_column": "dialogue", "response_column": "summary"})


# Llama-3.1/3.2/3.3's templates date their system header with the day they are rendered on.
DATED_TEMPLATE = (
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{%- endif %}Today Date: {{ date_string }}\n"
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def test_a_template_that_dates_its_prompt_renders_the_same_date_every_day(sample_texts):
    """Llama-3.2 instruct's template writes "Today Date: <the day it renders>": a chat split on one day and
    predicted on the next got another prompt than the model trained on (0 of 30 predict prompts equal the
    training prompts a day later). Chats render with the template's own fixed date on every day."""
    from fastlm.corpus.chat_template import CHAT_DATE

    tokenizer = llama_style_tokenizer(sample_texts, chat_template=True)
    tokenizer.chat_template = DATED_TEMPLATE
    prompt = render_messages([{"role": "user", "content": "배송 언제 와요?"}], "{prompt}", tokenizer)
    assert prompt.startswith(f"Today Date: {CHAT_DATE}\n") and CHAT_DATE == "26 Jul 2024"


THINK_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's generation prompt in non-thinking mode


def _chat_split(tmp_path, tokenizer, chats=None, **split):
    """The split nodes on ``chats`` (40 one-turn chats by default) with ``tokenizer`` (saved as the split's
    tokenizer folder): the chats, the splits and the fingerprint."""
    chats, splits, outputs = _chat_outputs(tmp_path, tokenizer, chats, **split)
    return chats, splits, outputs[1]


def _chat_outputs(tmp_path, tokenizer, chats=None, **split):
    """The chats, the splits and ``tokenize_corpus``'s outputs (tokenized, fingerprint, stats); ``tokenizer``
    None: the byte-level BPE the split trains (no chat template)."""
    source = "train"
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp_path / "tok")
        source = str(tmp_path / "tok")
    chats = chats or [
        [{"role": "user", "content": f"질문 {i}"}, {"role": "assistant", "content": f"답 {i}"}]
        for i in range(40)
    ]
    params = {"messages_column": "chat", "max_length": 96, "tokenizer": {"source": source}, **split}
    clean, counts = nodes.clean_corpus(pd.DataFrame({"chat": chats}), params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    tokenizer = nodes.build_tokenizer(splits, params)
    return chats, splits, (*nodes.tokenize_corpus(splits, tokenizer, params, split_counts), tokenizer)


def test_chat_template_kwargs_reach_the_template_and_the_fingerprint_and_predict_renders_alike(
    tmp_path, sample_texts
):
    """Qwen3's non-thinking mode (``enable_thinking: false``, TRL's ``chat_template_kwargs``) could not be
    set: every chat prompt ended at ``<|im_start|>assistant\\n`` and a Qwen3 fine-tune was trained and asked
    in thinking mode. ``split.chat_template_kwargs`` reaches the template (the prompt ends with its empty
    think block), is recorded with the data's chat template, and predict renders the training's prompt from
    the record."""
    from fastlm.reporting.predict_chats import chat_format
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    chats, splits, fingerprint = _chat_split(
        tmp_path, tokenizer, chat_template_kwargs={"enable_thinking": False}
    )
    assert splits["prompt"].str.endswith(THINK_OFF).all()
    trained = fingerprint["params"]["data_format"]
    assert trained["chat_template_kwargs"] == {"enable_thinking": False}
    chat = chat_format(tokenizer, {**trained, "source": "training_data.json"}, model="m")
    by_question = {chat[0]["content"]: chat[:1] for chat in chats}
    for prompt in splits["prompt"]:
        question = prompt.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        assert chat.render(by_question[question], tokenizer) == prompt
    # unset: the template's default (thinking), and a fingerprint as before (data split earlier stays fresh)
    _, default, before = _chat_split(tmp_path / "default", tokenizer)
    assert default["prompt"].str.endswith("<|im_start|>assistant\n").all()
    assert "chat_template_kwargs" not in before["params"]["data_format"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"tokenize": True}, "split.chat_template_kwargs.tokenize is set by fastlm"),
        (
            {"add_generation_prompt": False},
            "split.chat_template_kwargs.add_generation_prompt is set by fastlm",
        ),
        ({"date_string": "1 Jan 2025"}, "split.chat_template_kwargs.date_string is set by fastlm"),
        ({"return_dict": True}, "split.chat_template_kwargs.return_dict is set by fastlm"),
        ({"messages": "x"}, "split.chat_template_kwargs.messages is set by fastlm"),
        ({"enable_thinking": [False]}, "split.chat_template_kwargs.enable_thinking = [False] is not"),
        ({"enable_thinking": None}, "split.chat_template_kwargs.enable_thinking = None is not"),
        ({"enable-thinking": False}, "'enable-thinking' is not a name a template can read"),
        ({"enable_thinking": "false"}, "split.chat_template_kwargs.enable_thinking = 'false' is a text"),
        ("enable_thinking", "split.chat_template_kwargs must be a mapping"),
    ],
    ids=[
        "tokenize",
        "generation_prompt",
        "date",
        "return_dict",
        "messages",
        "list",
        "null",
        "dash",
        "quoted_false",
        "text",
    ],
)
def test_bad_chat_template_kwargs_are_one_line(value, expected):
    with pytest.raises(ConfigError) as caught:
        parse_split_params({"messages_column": "chat", "chat_template_kwargs": value})
    assert expected in str(caught.value) and "\n" not in str(caught.value) and "Fix:" in str(caught.value)


def test_good_chat_template_kwargs_keep_their_types_and_compose_their_texts():
    params = parse_split_params(
        {
            "messages_column": "chat",
            "chat_template_kwargs": {"enable_thinking": False, "n": 2, "t": 0.5, "name": "e\u0301"},
        }
    )
    assert params.chat_template_kwargs == {"enable_thinking": False, "n": 2, "t": 0.5, "name": "\u00e9"}
    assert (
        type(params.chat_template_kwargs["n"]) is int
        and params.chat_template_kwargs["enable_thinking"] is False
    )


def test_chat_template_kwargs_that_change_nothing_are_said(tmp_path, sample_texts, caplog):
    """``enable_thinking`` given to Llama-3.2's template (which has no such variable), or to data no chat
    template renders: the split says so instead of passing it on in silence."""
    from tests.support.chat_templates import llama3_style_tokenizer

    with caplog.at_level("WARNING", logger="fastlm.pipelines.split.nodes"):
        _chat_split(
            tmp_path, llama3_style_tokenizer(sample_texts), chat_template_kwargs={"enable_thinking": False}
        )
    assert "never mentions enable_thinking, so it changes nothing" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fastlm.pipelines.split.nodes"):
        nodes.clean_corpus(
            pd.DataFrame({"text": ["a", "b"]}), {"chat_template_kwargs": {"enable_thinking": False}}
        )
    assert "change nothing: the data is not chat messages" in caplog.text


def test_answers_with_reasoning_after_the_templates_empty_think_block_are_said(
    tmp_path, sample_texts, caplog
):
    """Qwen3 with ``enable_thinking: false`` ends every prompt with an empty ``<think>\n\n</think>\n\n``
    block: an answer that holds its own ``<think>...</think>`` reasoning is then trained after it, two think
    blocks in a row, which no render of the chat by the template writes. Said in one warning naming
    ``enable_thinking`` (was: trained so in silence); the same data in thinking mode is not."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    chats = [
        [
            {"role": "user", "content": f"질문 {i}"},
            {
                "role": "assistant",
                "content": (f"<think>\n생각 {i}\n</think>\n\n" if i < 5 else "") + f"답 {i}",
            },
        ]
        for i in range(40)
    ]
    tokenizer = qwen3_style_tokenizer(sample_texts)
    with caplog.at_level("WARNING", logger="fastlm"):
        _, splits, _ = _chat_split(
            tmp_path, tokenizer, chats, chat_template_kwargs={"enable_thinking": False}
        )
    doubled = splits["prompt"].str.endswith("</think>\n\n") & splits["response"].str.startswith("<think>")
    assert doubled.sum() == 5  # what is trained: the data as given, after the template's block
    said = [r.getMessage() for r in caplog.records if "<think>" in r.getMessage()]
    assert len(said) == 1 and "5 of 40" in said[0] and "enable_thinking" in said[0], caplog.text
    assert "\n" not in said[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="fastlm"):
        _chat_split(tmp_path / "thinking", tokenizer, chats)
    assert not [r for r in caplog.records if "<think>" in r.getMessage()], caplog.text


def test_train_turns_last_on_data_that_is_not_chats_is_said(caplog):
    """``split.train_turns: last`` chooses among a chat's answers: prompt/response or plain-text data has one
    answer or none, so it changes nothing there, said in one warning as chat_template_kwargs are (was:
    taken in silence). The default (all) is said nowhere."""
    pairs = pd.DataFrame({"q": ["hi", "yo"], "a": ["hello", "hey"]})
    for params, frame in (
        ({"prompt_column": "q", "response_column": "a"}, pairs),
        ({}, pd.DataFrame({"text": ["a", "b"]})),
    ):
        caplog.clear()
        with caplog.at_level("WARNING", logger="fastlm"):
            nodes.clean_corpus(frame, {**params, "train_turns": "last"})
        said = [r.getMessage() for r in caplog.records if "split.train_turns" in r.getMessage()]
        assert len(said) == 1 and "not chat messages (split.messages_column)" in said[0], caplog.text
        caplog.clear()
        with caplog.at_level("WARNING", logger="fastlm"):
            nodes.clean_corpus(frame, params)
        assert "split.train_turns" not in caplog.text


def test_a_base_tokenizers_chat_answer_ends_with_its_eos_not_the_templates_end_of_turn(sample_texts):
    """Qwen3-Base and Llama-3.2 base tokenizers: EOS ``<|endoftext|>`` / ``<|end_of_text|>`` where the
    template ends an assistant turn with ``<|im_end|>\\n`` / ``<|eot_id|>``. The answer is trained ending
    with the EOS, the id predict and the report stop at (the README says so); an instruct tokenizer's EOS is
    its end of turn."""
    from tests.support.chat_templates import llama3_style_tokenizer, qwen3_style_tokenizer

    for name, make, end in (
        ("qwen3", qwen3_style_tokenizer, "<|im_end|>"),
        ("llama3", llama3_style_tokenizer, "<|eot_id|>"),
    ):
        for base in (True, False):
            tokenizer = make(sample_texts, base=base)
            tokens = tokenize_pairs(["질문"], ["답변"], tokenizer, max_length=64, num_proc=1)
            assert tokens.values[-1] == tokenizer.eos_token_id, name
            assert (tokenizer.eos_token == end) is not base, name


def _multi_turn_chats(n: int = 80) -> list[list[dict]]:
    """Chats of a system turn and three question/answer turns (the third answer the response)."""
    return [
        [
            {"role": "system", "content": f"상담원 {i % 3}"},
            *(
                message
                for turn in range(3)
                for message in (
                    {"role": "user", "content": f"질문 {i} 번 {turn}: 배송은 언제 오나요?"},
                    {"role": "assistant", "content": f"답 {i}-{turn}: 내일 도착합니다."},
                )
            ),
        ]
        for i in range(n)
    ]


def _trained_runs(tokenized, tokenizer) -> list[list[list[int]]]:
    """Each train row's runs of trained token ids (positions a position before predicts), read through the
    training's own collator."""
    from fastlm.engine.data import DynamicPaddingCollator
    from fastlm.engine.data.token_dataset import TokenSequences

    data = TokenSequences.from_arrow(tokenized["train"])
    batch = DynamicPaddingCollator(pad_id=tokenizer.pad_token_id or 0)(data.__getitems__(range(len(data))))
    runs = []
    for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist(), strict=True):
        row, previous = [], False
        for token, label in zip(ids[1:], labels[1:], strict=True):
            if label != -100:
                (row[-1].append(token) if previous else row.append([token]))
            previous = label != -100
        runs.append(row)
    return runs


def _assert_every_answer_trained(chats, splits, tokenized, tokenizer, end: str) -> None:
    """Each train row trains each of its chat's answers in order, the earlier ones followed by ``end``."""
    answers = {
        chat[-1]["content"]: [m["content"] for m in chat if m["role"] == "assistant"] for chat in chats
    }
    runs = _trained_runs(tokenized, tokenizer)
    train = splits[splits["split"] == "train"]
    assert len(runs) == len(train) > 10
    for row, response in zip(runs, train["response"], strict=True):
        # a byte-level token may carry the space before an answer (no template: "assistant: <answer>")
        decoded = [tokenizer.decode(run, skip_special_tokens=False).lstrip(" ") for run in row]
        assert decoded[:-1] == [f"{answer}{end}" for answer in answers[response][:-1]], decoded
        assert decoded[-1] == f"{response}{tokenizer.eos_token}"


# A template whose header of an answer depends on the answer's text: a mark put in its place renders another
# header, so the answers are found by the renders of the chat around them. (A newline after a block tag is
# dropped by the chat templates' Jinja set-up: it is written as an expression.)
READS_ANSWERS = (
    "{% for m in messages %}<|im_start|>{{ m.role }}"
    "{% if m.role == 'assistant' and m.content|length > 12 %} (long){% endif %}"
    "{{ '\\n' }}{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_reads_its_answers_has_them_found_by_the_renders_around_them(tmp_path, sample_texts):
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    tokenizer.chat_template = READS_ANSWERS
    chats = _multi_turn_chats()
    chats[1][3] = {"role": "user", "content": f"you said {chats[1][2]['content']}"}  # a user turn quotes one
    _, splits, (tokenized, *_) = _chat_outputs(tmp_path, tokenizer, chats, max_length=256)
    assert splits["prompt"].str.contains("<|im_start|>assistant (long)\n", regex=False).all()
    _assert_every_answer_trained(chats, splits, tokenized, tokenizer, "<|im_end|>")


def test_an_answer_searched_for_is_never_taken_from_its_header_or_the_next_turn(sample_texts):
    """Where the render is searched for an answer (a template that reads its answers, or rewrites them), the
    first copy of its text after the turn before was taken: an answer that is also its own header's text
    trained the header in its place, and an answer the template rewrote trained the next user turn that
    quotes it. An answer whose place the search cannot tell apart is now not trained (its chat trains its
    last answer only), and the next turn is no longer searched."""
    from fastlm.corpus.chat_spans import answer_spans
    from tests.support.chat_templates import qwen3_style_tokenizer

    reads = qwen3_style_tokenizer(sample_texts)
    reads.chat_template = READS_ANSWERS
    qwen3 = qwen3_style_tokenizer(sample_texts)
    thought = "<think>\n생각\n</think>\n\n내일 도착합니다."  # Qwen3 drops an earlier answer's reasoning
    for tokenizer, history in (
        (reads, [{"role": "user", "content": "q"}, {"role": "assistant", "content": "assistant (long)"}]),
        (
            qwen3,
            [
                {"role": "user", "content": "배송은 언제 오나요?"},
                {"role": "assistant", "content": thought},
                {"role": "user", "content": f"you said {thought}"},
            ],
        ),
    ):
        prompt = render_messages(history, "", tokenizer)
        assert answer_spans(history, prompt, "", tokenizer) is None, prompt
    # a long answer the template reads is still found, the next turn quoting it or not
    history = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a long answer here"},
        {"role": "user", "content": "a long answer here, you said"},
    ]
    prompt = render_messages(history, "", reads)
    answer = "a long answer here<|im_end|>"
    start = prompt.index(f"\n{answer}") + 1
    assert answer_spans(history, prompt, "", reads) == f"{start}:{start + len(answer)}"
    # and so are two answers in a row that say the same, each in its own turn
    history = [history[0], history[1], history[1], {"role": "user", "content": "r"}]
    prompt = render_messages(history, "", reads)
    starts = [at + 1 for at in range(len(prompt)) if prompt.startswith(f"\n{answer}", at)]
    assert len(starts) == 2
    assert answer_spans(history, prompt, "", reads) == " ".join(f"{at}:{at + len(answer)}" for at in starts)


@pytest.mark.parametrize("family", ["qwen3", "qwen3_no_think", "llama3", "no_template"])
def test_every_answer_of_a_multi_turn_chat_is_trained_with_its_end_of_turn(tmp_path, sample_texts, family):
    """A multi-turn chat trained its last answer only: the earlier answers sat in the prompt as context and
    were never targets (two thirds of these chats' answers), where TRL's ``assistant_only_loss`` trains every
    answer. Each answer is now trained with the end of turn after it (the tokenizer's EOS: Qwen3's
    ``<|im_end|>``, Llama-3's ``<|eot_id|>``; no template: the answer alone), the user turns and the
    template around them stay inputs; ``split.train_turns: last`` keeps the last answer only."""
    from tests.support.chat_templates import llama3_style_tokenizer, qwen3_style_tokenizer

    chats = _multi_turn_chats()
    make = {"qwen3": qwen3_style_tokenizer, "qwen3_no_think": qwen3_style_tokenizer}
    tokenizer = make.get(family, llama3_style_tokenizer)(sample_texts) if family != "no_template" else None
    split = {"chat_template_kwargs": {"enable_thinking": False}} if family == "qwen3_no_think" else {}
    _, splits, (tokenized, fingerprint, stats, tokenizer) = _chat_outputs(
        tmp_path, tokenizer, chats, max_length=256, **split
    )
    _assert_every_answer_trained(
        chats, splits, tokenized, tokenizer, tokenizer.eos_token if family != "no_template" else ""
    )
    runs = _trained_runs(tokenized, tokenizer)
    train = splits[splits["split"] == "train"]
    assert stats["train"]["target_tokens"] == sum(len(run) for row in runs for run in row)
    assert fingerprint["params"]["data_format"]["train_turns"] == "all"
    _, _, (last_only, before, _, _) = _chat_outputs(
        tmp_path / "last",
        tokenizer if family != "no_template" else None,
        chats,
        max_length=256,
        train_turns="last",
        **split,
    )
    for row, response in zip(_trained_runs(last_only, tokenizer), train["response"], strict=True):
        assert [tokenizer.decode(run, skip_special_tokens=False) for run in row] == [
            f"{response}{tokenizer.eos_token}"
        ]
    assert before["params"]["data_format"]["train_turns"] == "last"


def test_a_chat_cut_from_the_left_trains_what_is_left_of_its_answers(tmp_path, sample_texts):
    """``max_length`` cuts a long chat's prompt from its start: the answers' ranges move with the cut, and
    an answer cut in two trains its kept end, never a token of another turn."""
    from tests.support.chat_templates import llama3_style_tokenizer

    tokenizer = llama3_style_tokenizer(sample_texts)
    chats = _multi_turn_chats()
    _, _, (whole, *_) = _chat_outputs(tmp_path / "whole", tokenizer, chats, max_length=512)
    # the prompt keeps its last 136 of 259 tokens: the first answer is cut in two, the second kept whole
    _, _, (cut, *_) = _chat_outputs(tmp_path / "cut", tokenizer, chats, max_length=160)
    from fastlm.engine.data.token_dataset import TokenSequences

    whole, cut = TokenSequences.from_arrow(whole["train"]), TokenSequences.from_arrow(cut["train"])
    assert len(whole) == len(cut)
    partly = 0
    for i in range(len(cut)):
        removed = int(whole.prompt_lengths[i] - cut.prompt_lengths[i])
        assert removed > 0 and cut[i][0] == tokenizer.bos_token_id  # the BOS stays, the prompt's start goes
        marks = np.zeros(int(whole.prompt_lengths[i]), dtype=bool)
        for start, stop in whole.answer_spans_of(i):
            marks[start:stop] = True
        kept = np.zeros(int(cut.prompt_lengths[i]), dtype=bool)
        for start, stop in cut.answer_spans_of(i):
            kept[start:stop] = True
        assert np.array_equal(kept[1:], marks[1 + removed :])  # the kept tokens keep their marks
        assert np.array_equal(
            cut[i][1 : cut.prompt_lengths[i]], whole[i][1 + removed : whole.prompt_lengths[i]]
        )
        partly += bool(kept[1] and marks[removed] and marks[1 + removed])  # the answer went on before the cut
    assert partly == len(cut)


def _trained_answers(splits, tokenized, tokenizer) -> dict[int, list[str]]:
    """Each train row's trained runs decoded, by its chat's number (``답 <i>-2`` in its response)."""
    train = splits[splits["split"] == "train"]
    numbers = train["response"].str.extract(r"답 (\d+)-2", expand=False).astype(int)
    runs = _trained_runs(tokenized, tokenizer)
    assert len(runs) == len(train) > 10
    return {
        int(number): [tokenizer.decode(run, skip_special_tokens=False) for run in row]
        for number, row in zip(numbers, runs, strict=True)
    }


def test_an_answer_qwen3s_template_strips_of_its_reasoning_stays_an_input_and_the_others_train(
    tmp_path, sample_texts, caplog
):
    """Qwen3's template drops the reasoning of earlier answers (``<think>...</think>``): such an answer is not
    in the prompt as the data gives it. It stays an input (its written, stripped form is never trained: the
    model would learn to answer without its reasoning), never a guessed range; the chat's other answers,
    which the template writes as given, train. Said in one warning with the answers' and the chats' counts.
    Was: the whole chat trained its last answer only."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    chats = _multi_turn_chats()
    for chat in chats[::2]:
        chat[2] = {"role": "assistant", "content": f"<think>\n생각\n</think>\n\n{chat[2]['content']}"}
    with caplog.at_level("WARNING", logger="fastlm.corpus.prompts"):
        _, splits, (tokenized, _, _, tokenizer) = _chat_outputs(
            tmp_path, qwen3_style_tokenizer(sample_texts), chats, max_length=256
        )
    said = [r.getMessage() for r in caplog.records if "earlier answers" in r.getMessage()]
    assert len(said) == 1 and "40 of 160 earlier answers in 40 of 80 chats" in said[0], caplog.text
    assert not splits["prompt"].str.contains("생각", regex=False).any()  # the template dropped the reasoning
    end = tokenizer.eos_token
    for number, decoded in _trained_answers(splits, tokenized, tokenizer).items():
        expected = [f"답 {number}-{turn}: 내일 도착합니다.{end}" for turn in range(3)]
        assert decoded == (expected[1:] if number % 2 == 0 else expected), (number, decoded)


# A template that rewrites an answer it marks "[x] " (drops the mark) and writes every other text as given.
REWRITES_MARKED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}{{ '\\n' }}"
    "{% if m.role == 'assistant' %}{{ m.content | replace('[x] ', '') }}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_only_the_answer_the_template_rewrites_is_left_out_of_a_three_answer_chat(
    tmp_path, sample_texts, caplog
):
    """A chat of three answers whose middle one the template rewrites: the first and the last answer train
    with their end of turn, the middle one stays an input, never its rewritten text nor the next user turn
    that quotes it as the data gave it. Was: none of the chat's earlier answers trained."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    tokenizer.chat_template = REWRITES_MARKED
    chats = _multi_turn_chats()
    for chat in chats[::2]:
        chat[4] = {"role": "assistant", "content": f"[x] {chat[4]['content']}"}
        chat[5] = {"role": "user", "content": f"you said {chat[4]['content']}"}  # quotes it as given
    with caplog.at_level("WARNING", logger="fastlm.corpus.prompts"):
        _, splits, (tokenized, _, _, tokenizer) = _chat_outputs(tmp_path, tokenizer, chats, max_length=256)
    said = [r.getMessage() for r in caplog.records if "earlier answers" in r.getMessage()]
    assert len(said) == 1 and "40 of 160 earlier answers in 40 of 80 chats" in said[0], caplog.text
    assert splits["prompt"].str.contains("you said [x] 답", regex=False).sum() == 40  # the quote, as given
    end = tokenizer.eos_token
    for number, decoded in _trained_answers(splits, tokenized, tokenizer).items():
        expected = [f"답 {number}-{turn}: 내일 도착합니다.{end}" for turn in range(3)]
        assert decoded == ([expected[0], expected[2]] if number % 2 == 0 else expected), (number, decoded)


def test_chats_rendered_in_a_pool_equal_chats_rendered_here(sample_texts, caplog):
    """Large chat corpora render in a fork pool (``split.num_proc``): the prompts, the answers' ranges and the
    warning for chats whose answers are not found are the ones rendering here gives."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    chats = _multi_turn_chats()
    for chat in chats[::4]:  # the template drops this reasoning: not found, said
        chat[2] = {"role": "assistant", "content": f"<think>\n생각\n</think>\n\n{chat[2]['content']}"}
    tokenizer = qwen3_style_tokenizer(sample_texts)
    frames = []
    for num_proc in (1, 2):
        config = parse_split_params({"messages_column": "chat", "num_proc": num_proc, "batch_size": 7})
        with caplog.at_level("WARNING", logger="fastlm.corpus.prompts"):
            frames.append(prompt_frame(pd.DataFrame({"chat": chats}), config, tokenizer)[0])
        assert "20 of 160 earlier answers in 20 of 80 chats" in caplog.text
        caplog.clear()
    pd.testing.assert_frame_equal(frames[0], frames[1])
    assert frames[0]["answer_spans"].ne("").all()  # each chat's answers the template writes as given


def test_answer_spans_read_back_as_missing_values_train_nothing_more(sample_texts):
    """pandas reads a null of corpus_splits' ``answer_spans`` back as NaN (a truthy float): tokenizing
    crashed on it. A missing value now means no earlier answer, as "" does."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    prompts = ["user: 질문\nassistant: 답변\nuser: 또"] * 4
    spans = [float("nan"), None, pd.NA, ""]
    tokens = tokenize_pairs(prompts, ["네"] * 4, tokenizer, max_length=64, num_proc=1, answer_spans=spans)
    assert tokens.answer_spans is None or len(tokens.answer_spans[0]) == 0
    found = tokenize_pairs(
        prompts, ["네"] * 4, tokenizer, max_length=64, num_proc=1, answer_spans=[*spans[:3], "20:22"]
    )
    assert np.diff(found.answer_spans[1]).tolist() == [0, 0, 0, 2]


def test_the_system_turn_every_chat_has_is_recorded_with_the_data(tmp_path, sample_texts, caplog):
    """A system turn every training chat begins with is part of how the model is asked: predict and the
    report put it before an input asked as one user turn. The split records it with the data's fingerprint;
    chats of different system turns (or none) record none."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    tokenizer = qwen3_style_tokenizer(sample_texts)
    chats = _multi_turn_chats()
    for chat in chats:
        chat[0] = {"role": "system", "content": " 당신은 상담원입니다. "}  # stripped as every content is
    _, _, (_, fingerprint, _, _) = _chat_outputs(tmp_path / "same", tokenizer, chats, max_length=256)
    assert fingerprint["system_prompt"] == "당신은 상담원입니다."
    with caplog.at_level("INFO", logger="fastlm.pipelines.split.nodes"):
        _, _, (_, mixed, _, _) = _chat_outputs(
            tmp_path / "mixed", tokenizer, _multi_turn_chats(), max_length=256
        )
    assert "system_prompt" not in mixed
    assert "begin with 3 different system turns (0 with none)" in caplog.text
    without = [chat[1:] for chat in chats]
    _, _, (_, none, _, _) = _chat_outputs(tmp_path / "none", tokenizer, without, max_length=256)
    assert "system_prompt" not in none


def test_chats_with_tool_calls_no_chat_template_renders_are_dropped_as_such_and_said(caplog):
    """A function-calling chat (an assistant turn of ``tool_calls`` with empty content, a ``tool`` turn) was
    dropped as ``empty``, as if its text were missing. Without a chat template (the split's own tokenizer:
    ``role: content`` lines cannot show a call) such chats are dropped under their own reason, counted in the
    split report and said in one warning; with one they train (tests/corpus/test_tool_calls.py)."""
    chats = _multi_turn_chats() + [
        [
            {"role": "user", "content": f"{city} 날씨 알려줘"},
            {"role": "assistant", "content": "", "tool_calls": [tool_call(city)]},
            {"role": "tool", "content": '{"temp": 3}'},
            {"role": "assistant", "content": f"{city}은 3도입니다."},
        ]
        for city in ("서울", "부산", "대구")
    ]
    with caplog.at_level("WARNING", logger="fastlm"):
        clean, counts = nodes.clean_corpus(
            pd.DataFrame({"chat": chats}), {"messages_column": "chat", "tokenizer": {"source": "train"}}
        )
    assert counts["dropped"]["tool_calls"] == 3 and counts["dropped"]["empty"] == 0
    assert len(clean) == len(_multi_turn_chats())
    assert "3 chats hold tool calls" in caplog.text and "has no chat template" in caplog.text


def test_the_system_turn_is_the_training_chats_not_the_held_out_ones(tmp_path):
    """The system turn recorded is the one every chat the model trains on (the train split, after
    split.max_samples) began with: a held-out chat without it changes nothing the model learned, while a
    training chat without it leaves none recorded."""
    system = {"role": "system", "content": "당신은 상담원입니다."}
    chats = [
        [system, {"role": "user", "content": f"질문 {i}"}, {"role": "assistant", "content": f"답 {i}"}]
        for i in range(40)
    ]
    found = {}
    for number in (0, 1):  # a chat without the system turn: hashed into train, into test
        odd = f"혼자 {number}"
        lone = [{"role": "user", "content": odd}, {"role": "assistant", "content": f"답 {number}"}]
        _, splits, (_, fingerprint, _, _) = _chat_outputs(tmp_path / odd, None, [*chats, lone])
        where = splits.loc[splits["prompt"].str.contains(odd), "split"].tolist()
        found[odd] = (where, fingerprint.get("system_prompt"))
    assert found == {"혼자 0": (["train"], None), "혼자 1": (["test"], "당신은 상담원입니다.")}


@pytest.mark.parametrize("chat_template", [False, True], ids=["chat_template_off", "no_chat_template"])
def test_a_prompt_ending_in_think_that_no_chat_template_wrote_is_not_said(chat_template, caplog):
    """Chats rendered as ``role: content`` lines (no chat template) whose user turn ends with ``</think>``:
    no template's think block ends the prompt and no enable_thinking is set, so the warning that names them
    (and tells to leave enable_thinking unset) is not said (was: said, naming ``chat_template_kwargs {}``)."""
    chats = [
        [
            {"role": "user", "content": f"Quote the tag </think> {i}: </think>"},
            {"role": "assistant", "content": f"<think>tag {i}</think> done"},
        ]
        for i in range(4)
    ]
    config = parse_split_params(
        {"messages_column": "messages", "prompt_template": "{prompt}", "chat_template": chat_template}
    )
    with caplog.at_level("WARNING", logger="fastlm"):
        frame, _ = prompt_frame(pd.DataFrame({"messages": chats}), config, None)
    assert frame["prompt"].str.endswith("</think>").all()  # the case: a prompt that ends so
    assert not [r for r in caplog.records if "<think>" in r.getMessage()], caplog.text


def test_sharegpt_chats_train_exactly_as_the_same_role_content_chats(tmp_path, sample_texts):
    """Chats given as ShareGPT turns (``{from: human | gpt | system | tool, value}``, the form of many public
    corpora) were refused as "not a list of {role, content} turns". They are read as the role/content chats
    they stand for: the same splits, ids, labels and fingerprint; a chat of them that is no chat is said
    with its own reason."""
    from fastlm.engine.data import DynamicPaddingCollator
    from fastlm.engine.data.token_dataset import TokenSequences
    from tests.support.chat_templates import sharegpt_chat, tool_calling_tokenizer, tool_chat

    chats = _multi_turn_chats(60) + [
        tool_chat(f"도시{i}", answer=f"도시{i}은 {i}도입니다.") for i in range(6)
    ]
    tokenizer = tool_calling_tokenizer(sample_texts)
    outputs = [
        _chat_outputs(tmp_path / form, tokenizer, given, max_length=256, tools_column=None)
        for form, given in (("role", chats), ("sharegpt", [sharegpt_chat(chat) for chat in chats]))
    ]
    (_, role_splits, (role_data, role_print, _, _)), (_, splits, (data, fingerprint, _, _)) = outputs
    pd.testing.assert_frame_equal(splits, role_splits)
    assert splits["prompt"].str.contains("<tool_call>").any() and len(splits) == len(chats)
    assert fingerprint == role_print
    collate = DynamicPaddingCollator(pad_id=tokenizer.pad_token_id or 0)
    for name in role_data:
        batches = [
            collate(rows.__getitems__(range(len(rows))))
            for rows in (TokenSequences.from_arrow(data[name]), TokenSequences.from_arrow(role_data[name]))
        ]
        for key in ("input_ids", "labels"):
            assert torch.equal(batches[0][key], batches[1][key]), (name, key)
    unanswered = [sharegpt_chat(chat)[:-1] for chat in chats[:2]]  # each ends with the user's question
    with pytest.raises(InputDataError, match="row 1: the last message is a 'user' turn"):
        nodes.clean_corpus(pd.DataFrame({"chat": unanswered}), {"messages_column": "chat"})


def test_chats_without_a_system_turn_count_as_none_beside_those_that_have_one(caplog):
    """Chats that begin with a system turn beside chats that begin with a user turn: under pandas 3 the
    frame's column of system turns stored the missing ones as NaN, so the split said "3 different system
    turns (0 with none)" of two turns and a majority without one, and train chats none of which had a system
    turn (a held-out chat having one) recorded NaN as the system turn every training chat began with."""
    from fastlm.corpus.split_steps import training_system_turn

    chats = [
        [
            *([{"role": "system", "content": f"상담원 {i % 2}"}] if i % 3 == 0 else []),
            {"role": "user", "content": f"질문 {i}"},
            {"role": "assistant", "content": f"답 {i}"},
        ]
        for i in range(60)
    ]
    params = {"messages_column": "chat", "tokenizer": {"source": "train"}}
    clean, counts = nodes.clean_corpus(pd.DataFrame({"chat": chats}), params)
    with caplog.at_level("INFO", logger="fastlm.pipelines.split.nodes"):
        splits, split_counts = nodes.split_corpus(clean, counts, params)
    train = splits.loc[splits["split"] == "train", "prompt"]
    with_system = train.str.startswith("system:")
    contents = {prompt.split("\n")[0] for prompt in train[with_system]}
    said = f"begin with {len(contents)} different system turns ({int((~with_system).sum())} with none)"
    assert said in caplog.text and "system_prompt" not in split_counts
    without = clean.loc[~clean["prompt"].str.startswith("system:"), SYSTEM_TURN].to_numpy()
    assert training_system_turn(without) == (None, None)


def test_a_role_the_chat_template_writes_nowhere_is_refused_naming_it(sample_texts):
    """Qwen3's template writes system, user, assistant and tool turns and skips any other role without a
    word: chats whose user turns were given as ``human`` (a ShareGPT speaker in role/content form) trained as
    ``<|im_start|>assistant\\n`` -> answer, the question gone from every prompt. Refused in one line naming
    the role and the parameter; Llama-3.2's template, which writes any role as its header, renders them."""
    from tests.support.chat_templates import llama3_style_tokenizer, qwen3_style_tokenizer

    chats = [
        [{"role": "human", "content": f"질문 {i}"}, {"role": "assistant", "content": f"답 {i}"}]
        for i in range(6)
    ]
    chats.append([{"role": "user", "content": "질문"}, {"role": "assistant", "content": "답"}])
    raw = pd.DataFrame({"chat": chats})
    config = parse_split_params({"messages_column": "chat"})
    with pytest.raises(InputDataError) as refused:
        prompt_frame(raw, config, qwen3_style_tokenizer(sample_texts))
    said = str(refused.value)
    assert "\n" not in said and "split.messages_column ('chat')" in said and "'human'" in said, said
    assert "6 chats" in said and "user" in said.split("Fix:")[1], said
    frame, _ = prompt_frame(raw, config, llama3_style_tokenizer(sample_texts))
    assert all("질문" in prompt for prompt in frame["prompt"])


def test_chats_and_prompts_writing_a_special_tokens_text_are_said_once(tmp_path, llama_tokenizer, caplog):
    """A message or prompt holding a special token's text (``</s>`` written out) is written into the prompt
    by the template, where the tokenizer reads it as that token (as Hugging Face's apply_chat_template does):
    the data's text is not what trains. Said in one warning with the count; data without any, nothing."""
    llama_tokenizer.save_pretrained(tmp_path / "tok")
    chats = [
        [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]
        for i in range(40)
    ]
    chats[3][0]["content"] = "what does </s> mean?"
    chats[9][1]["content"] = "it ends a text: </s>"
    params = {"messages_column": "chat", "max_length": 96, "tokenizer": {"source": str(tmp_path / "tok")}}
    with caplog.at_level("WARNING", logger="fastlm"):
        nodes.clean_corpus(pd.DataFrame({"chat": chats}), params)
    said = [r.getMessage() for r in caplog.records if "special token" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("2 of 40 chats write a special token's text ('</s>')"), said
    caplog.clear()
    pairs = pd.DataFrame({"q": [f"question {i}" for i in range(30)], "a": [f"answer {i}" for i in range(30)]})
    pairs.loc[4, "q"] = "after </s> comes"
    pair_params = {**params, "messages_column": None, "prompt_column": "q", "response_column": "a"}
    with caplog.at_level("WARNING", logger="fastlm"):
        nodes.clean_corpus(pairs, pair_params)
    said = [r.getMessage() for r in caplog.records if "special token" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("1 of 30 prompts write a special token's text ('</s>')"), (
        said
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="fastlm"):
        nodes.clean_corpus(pd.DataFrame({"chat": chats[10:]}), params)
    assert not [r for r in caplog.records if "special token" in r.getMessage()]


@pytest.mark.parametrize("bos_in_front", [True, False], ids=["llama_bos", "no_bos"])
@pytest.mark.parametrize(
    "template",
    ["{prompt}\n\n### Response:\n", 'Chat:\n{prompt}\n{prompt}\nA: "x" {{y}}'],
    ids=["default_template", "braces_and_quotes"],
)
def test_the_saved_tokenizer_of_chats_rendered_as_lines_renders_them_as_training_did(bos_in_front, template):
    """Chats split with ``split.chat_template: false`` (or a tokenizer whose template the split did not use)
    train on ``role: content`` lines wrapped by the prompt template, but the model folder kept the base's chat
    template: transformers' ``pipeline`` (and ``apply_chat_template``) prompted the model in a format it never
    trained on (0 of 16 rows as predict). The saved tokenizer's template renders the lines as training did,
    to the same ids, BOS included where the tokenizer puts one in front."""
    from fastlm.corpus.prompts import prompt_token_ids, render_messages, tokenizer_as_trained
    from tests.support.tiny_llama import llama_style_tokenizer

    tokenizer = llama_style_tokenizer(
        ["user: hello there", "assistant: hi", "system: be kind"], chat_template=True
    )
    if not bos_in_front:
        tokenizer.backend_tokenizer.post_processor = None
    data_format = {"kind": "messages", "chat_template_sha256": None, "prompt_template": template}
    saved = tokenizer_as_trained(tokenizer, data_format)
    assert saved is not tokenizer and tokenizer.chat_template is not None  # the run's own left alone
    chats = [
        [{"role": "user", "content": "hello there"}],
        [
            {"role": "system", "content": "be kind"},
            {"role": "user", "content": "hi\nyou"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": 'é {{ a }} "q"'},
        ],
    ]
    for chat in chats:
        trained = prompt_token_ids(tokenizer, render_messages(chat, template))
        asked = saved.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=True)
        assert list(asked["input_ids"]) == trained
    # a template the split used, and data of other kinds: the tokenizer as it is
    used = {**data_format, "chat_template_sha256": "ab12"}
    assert tokenizer_as_trained(tokenizer, used) is tokenizer
    assert tokenizer_as_trained(tokenizer, {"kind": "prompt_response"}) is tokenizer
    assert tokenizer_as_trained(tokenizer, None) is tokenizer
