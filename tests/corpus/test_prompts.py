"""Prompt/response data: cleaning on the pair, chat rendering, split keys independent of the template,
tokenization with exact prompt lengths and truncation that keeps the EOS and part of the response."""

import numpy as np
import pandas as pd
import pytest

from fastlm.corpus.cleaning import clean_pairs
from fastlm.corpus.config import parse_split_params
from fastlm.corpus.prompts import (
    clean_messages,
    prompt_frame,
    prompt_token_ids,
    render_messages,
    tokenize_pairs,
    truncate_prompt_ids,
)
from fastlm.errors import ConfigError
from fastlm.pipelines.split import nodes
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
    assert list(splits.columns) == ["prompt", "response", "split"]
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
    from fastlm.corpus.prompts import CHAT_DATE

    tokenizer = llama_style_tokenizer(sample_texts, chat_template=True)
    tokenizer.chat_template = DATED_TEMPLATE
    prompt = render_messages([{"role": "user", "content": "배송 언제 와요?"}], "{prompt}", tokenizer)
    assert prompt.startswith(f"Today Date: {CHAT_DATE}\n") and CHAT_DATE == "26 Jul 2024"


THINK_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # Qwen3's generation prompt in non-thinking mode


def _chat_split(tmp_path, tokenizer, **split):
    """The split nodes on 40 one-turn chats with ``tokenizer`` (saved as the split's tokenizer folder)."""
    tokenizer.save_pretrained(tmp_path / "tok")
    chats = [
        [{"role": "user", "content": f"질문 {i}"}, {"role": "assistant", "content": f"답 {i}"}]
        for i in range(40)
    ]
    params = {
        "messages_column": "chat",
        "max_length": 96,
        "tokenizer": {"source": str(tmp_path / "tok")},
        **split,
    }
    clean, counts = nodes.clean_corpus(pd.DataFrame({"chat": chats}), params)
    splits, _ = nodes.split_corpus(clean, counts, params)
    _, fingerprint, _ = nodes.tokenize_corpus(splits, nodes.build_tokenizer(splits, params), params)
    return chats, splits, fingerprint


def test_chat_template_kwargs_reach_the_template_and_the_fingerprint_and_predict_renders_alike(
    tmp_path, sample_texts
):
    """Qwen3's non-thinking mode (``enable_thinking: false``, TRL's ``chat_template_kwargs``) could not be
    set: every chat prompt ended at ``<|im_start|>assistant\\n`` and a Qwen3 fine-tune was trained and asked
    in thinking mode. ``split.chat_template_kwargs`` reaches the template (the prompt ends with its empty
    think block), is recorded with the data's chat template, and predict renders the training's prompt from
    the record."""
    from fastlm.reporting.predictions import chat_format
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
