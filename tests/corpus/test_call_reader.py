"""The tool calls of a generated answer, read in the call format the chat template writes (learned from a
probe call it renders), against transformers' own response parsing with TRL's response templates."""

from __future__ import annotations

import json

import pytest

from fastlm.corpus.call_reader import CallReader
from tests.support.chat_templates import (
    NO_TOOL_CALLS_TEMPLATE,
    WEATHER_TOOL,
    llama3_style_tokenizer,
    qwen3_style_tokenizer,
    tool_calling_tokenizer,
)

TEXTS = ["서울 날씨 알려줘 get_weather city 맑음 sunny"] * 5
SEOUL = {"name": "get_weather", "arguments": {"city": "서울"}}
BUSAN = {"name": "get_weather", "arguments": {"city": "부산", "days": 2}}


def _qwen3_answers():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "서울"}}\n</tool_call>'
    second = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "부산", "days": 2}}\n</tool_call>'
    return {
        call: [SEOUL],
        f"{call}\n{second}": [SEOUL, BUSAN],
        "맑음입니다.": [],
        '<tool_call>\n{"name": "get_weather", "argum': None,  # cut by max_new_tokens
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "서울"}}\n': None,  # never closed
    }


def _qwen3_thinking_answers():
    """Qwen3 with thinking on: its reasoning comes first (a call drafted there is no call), and an argument
    may hold the call markup and braces in its text."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "서울"}}\n</tool_call>'
    marked = {"name": "get_weather", "arguments": {"city": "a}b <tool_call> c"}}
    return {
        f"<think>\n서울 날씨를 찾아야 한다.\n</think>\n\n{call}": [SEOUL],
        f"<think>\n{call} 를 쓸까?\n</think>\n\n맑음입니다.": [],
        f"<think>\n\n</think>\n\n<tool_call>\n{json.dumps(marked)}\n</tool_call>": [marked],
    }


def _llama3_answers():
    return {
        '{"name": "get_weather", "parameters": {"city": "서울"}}': [SEOUL],
        "맑음입니다.": [],
        '{"name": "get_weather", "param': None,
    }


@pytest.mark.parametrize("family", ["qwen3", "qwen3-thinking", "llama32"])
def test_calls_are_read_as_the_tokenizers_own_response_parsing_reads_them(family):
    """Two computations: the call format learned from the template's render of a probe call, and the
    response parsing transformers runs with TRL's response template of the same family (``parse_response``
    on the answer with the template's end of turn after it, as generation wrote it)."""
    trl_templates = pytest.importorskip("trl.chat_template_utils")
    if family.startswith("qwen3"):
        thinking = family == "qwen3-thinking"
        tokenizer, variables = qwen3_style_tokenizer(TEXTS), {"enable_thinking": thinking}
        answers = _qwen3_thinking_answers() if thinking else _qwen3_answers()
        schema = trl_templates.qwen3_template
    else:
        tokenizer, variables = llama3_style_tokenizer(TEXTS), None
        answers, schema = _llama3_answers(), trl_templates.llama3_template
    reader = CallReader.of(tokenizer, variables)
    assert reader is not None and not reader.parses
    tokenizer.response_template = schema
    declared = CallReader.of(tokenizer, variables)
    assert declared.parses
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "서울 날씨"}],
        tools=[WEATHER_TOOL],
        add_generation_prompt=True,
        tokenize=False,
        **(variables or {}),
    )
    prompt = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    for answer, expected in answers.items():
        ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        ended = expected is not None  # a cut answer never reached its end of turn
        ours = reader.calls(ids, tokenizer, prompt=prompt, ended=ended)
        theirs = declared.calls(ids, tokenizer, prompt=prompt, ended=ended, tools=[WEATHER_TOOL])
        assert ours == expected, answer
        if expected is not None:  # transformers refuses what it cannot read; we say None
            assert theirs == expected, answer


def test_the_qwen_style_format_reads_calls_written_on_one_line_after_content():
    reader = CallReader.of(tool_calling_tokenizer(TEXTS))
    assert (reader.opener, reader.closer, reader.arguments_key) == (
        "<tool_call>",
        "</tool_call>",
        "arguments",
    )
    arguments = '"{\\"city\\": \\"서울\\"}"'
    text = f'날씨를 볼게요.\n<tool_call>{{"name": "get_weather", "arguments": {arguments}}}</tool_call>'
    assert reader.calls_in(text) == [SEOUL]  # arguments given as a JSON text are read as the mapping
    assert reader.calls_in('<tool_call>{"arguments": {"city": "서울"}}</tool_call>') is None  # no name
    marked = {"name": "get_weather", "arguments": {"city": "<tool_call>}</tool_call>"}}
    twice = f"<tool_call>{json.dumps(marked)}</tool_call>\n<tool_call>{json.dumps(SEOUL)}</tool_call>"
    assert reader.calls_in(twice + "\n맑음입니다.") == [marked, SEOUL]  # the markup in an argument's text


def test_a_template_that_writes_no_calls_has_no_call_format():
    assert CallReader.of(tool_calling_tokenizer(TEXTS, template=NO_TOOL_CALLS_TEMPLATE)) is None
    tokenizer = tool_calling_tokenizer(TEXTS)
    tokenizer.chat_template = None
    assert CallReader.of(tokenizer) is None


def test_a_llama31_call_after_its_python_tag_is_read_as_the_bare_call():
    """Llama-3.1 often begins a call with ``<|python_tag|>``, a special token its tokenizer does not list
    among its named special tokens: it is left out of the text, as a plain prediction decodes it, and the call
    after it read as the same call written bare (it was read as no call)."""
    from tokenizers import AddedToken

    tokenizer = llama3_style_tokenizer(TEXTS)
    tokenizer.add_tokens([AddedToken("<|python_tag|>", special=True, normalized=False)])
    reader = CallReader.of(tokenizer)
    bare = tokenizer('{"name": "get_weather", "parameters": {"city": "서울"}}', add_special_tokens=False)
    tagged = [tokenizer.convert_tokens_to_ids("<|python_tag|>"), *bare["input_ids"]]
    assert reader.calls(tagged, tokenizer) == reader.calls(bare["input_ids"], tokenizer) == [SEOUL]
    assert reader.text(tagged, tokenizer) == tokenizer.decode(tagged, skip_special_tokens=True)
