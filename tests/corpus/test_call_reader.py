"""The tool calls of a generated answer, read in the call format the chat template writes (learned from a
probe call it renders), against transformers' own response parsing with TRL's response templates."""

from __future__ import annotations

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


def _llama3_answers():
    return {
        '{"name": "get_weather", "parameters": {"city": "서울"}}': [SEOUL],
        "맑음입니다.": [],
        '{"name": "get_weather", "param': None,
    }


@pytest.mark.parametrize("family", ["qwen3", "llama32"])
def test_calls_are_read_as_the_tokenizers_own_response_parsing_reads_them(family):
    """Two computations: the call format learned from the template's render of a probe call, and the
    response parsing transformers runs with TRL's response template of the same family (``parse_response``
    on the answer with the template's end of turn after it, as generation wrote it)."""
    trl_templates = pytest.importorskip("trl.chat_template_utils")
    if family == "qwen3":
        tokenizer, variables = qwen3_style_tokenizer(TEXTS), {"enable_thinking": False}
        answers, schema = _qwen3_answers(), trl_templates.qwen3_template
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


def test_a_template_that_writes_no_calls_has_no_call_format():
    assert CallReader.of(tool_calling_tokenizer(TEXTS, template=NO_TOOL_CALLS_TEMPLATE)) is None
    tokenizer = tool_calling_tokenizer(TEXTS)
    tokenizer.chat_template = None
    assert CallReader.of(tokenizer) is None
