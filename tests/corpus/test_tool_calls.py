"""Function-calling chats (assistant turns of ``tool_calls``, ``tool`` turns, a per-row ``tools`` column):
kept by the split, rendered with their tools, the final turn's call trained as the chat template writes it,
keyed on the calls and tools, refused in one line where the tools are malformed or the template writes no
call."""

import json
import logging
import unicodedata

import numpy as np
import pandas as pd
import pytest

from fastlm.corpus.chat_template import CHAT_DATE
from fastlm.corpus.config import parse_split_params
from fastlm.corpus.prompts import prompt_frame
from fastlm.corpus.tool_calls import parse_tools
from fastlm.errors import ConfigError, InputDataError
from fastlm.pipelines.split import nodes
from tests.support.chat_templates import (
    LLAMA32_CHAT_TEMPLATE,
    NO_TOOL_CALLS_TEMPLATE,
    QWEN3_CHAT_TEMPLATE,
    WEATHER_TOOL,
    llama3_style_tokenizer,
    tool_call,
    tool_calling_tokenizer,
    tool_chat,
    tool_chat_rows,
)

EMPTY_THINK = "<think>\n\n</think>\n\n"


def _split(tmp_path, tokenizer, rows, **split):
    """``rows`` (``{"messages", "tools"}``) through the split's nodes: the splits and the tokenized data."""
    tokenizer.save_pretrained(tmp_path / "tok")
    params = {
        "messages_column": "messages",
        "max_length": 2048,
        "tokenizer": {"source": str(tmp_path / "tok")},
        "ratios": {"train": 0.6, "validation": 0.2, "test": 0.2},
    }
    params.update(split)
    clean, counts = nodes.clean_corpus(pd.DataFrame(rows), params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    tokenizer = nodes.build_tokenizer(splits, params)
    tokenized, *_ = nodes.tokenize_corpus(splits, tokenizer, params, split_counts)
    return counts, splits, tokenized


def _template_target(tokenizer, chat: list, tools, variables: dict) -> str:
    """The final turn as the template writes it, by the tokenizer's own renders: the whole chat less the
    render of its history with the generation prompt, up to the tokenizer's EOS (the instruct template's end
    of turn)."""
    render = {"tokenize": False, "tools": tools, "date_string": CHAT_DATE, **variables}
    whole = tokenizer.apply_chat_template(chat, add_generation_prompt=False, **render)
    prompt = tokenizer.apply_chat_template(chat[:-1], add_generation_prompt=True, **render)
    assert whole.startswith(prompt)
    tail = whole[len(prompt) :]
    return tail[: tail.index(tokenizer.eos_token)]


@pytest.mark.parametrize(
    ("template", "variables"),
    [
        ("qwen_style", {}),
        (QWEN3_CHAT_TEMPLATE, {}),
        (QWEN3_CHAT_TEMPLATE, {"enable_thinking": False}),
        (LLAMA32_CHAT_TEMPLATE, {}),
    ],
    ids=["qwen_style", "qwen3", "qwen3_no_thinking", "llama32"],
)
def test_tool_chats_are_kept_and_the_final_call_trains_as_the_template_writes_it(
    tmp_path, sample_texts, template, variables
):
    """Chats with tool calls were dropped (``tool_calls``). They are kept, rendered with their row's tools;
    a final turn that calls a tool trains the template's own text for it and the EOS (its end of turn), and a
    final answer after the tool's result trains as any answer."""
    tokenizer = tool_calling_tokenizer(sample_texts)
    if template == LLAMA32_CHAT_TEMPLATE:
        tokenizer = llama3_style_tokenizer(sample_texts)
    elif template != "qwen_style":
        tokenizer.chat_template = template
    rows = tool_chat_rows(24)
    split = {"chat_template_kwargs": variables, "train_turns": "last"}
    counts, splits, tokenized = _split(tmp_path, tokenizer, rows, **split)
    assert sum(counts["dropped"].values()) == 0 and len(splits) == len(rows)
    by_prompt = {}
    for row in rows:
        chat = row["messages"]
        prompt = tokenizer.apply_chat_template(
            chat[:-1],
            add_generation_prompt=True,
            tokenize=False,
            tools=row["tools"],
            date_string=CHAT_DATE,
            **variables,
        )
        by_prompt[prompt] = row
    samples = [sample for name in ("train", "validation", "test") for sample in tokenized[name]]
    texts = [tokenizer.decode(s["input_ids"][: s["prompt_length"]]) for s in samples]
    eos = tokenizer.eos_token_id
    calls = 0
    for sample, text in zip(samples, texts, strict=True):
        row = next(row for prompt, row in by_prompt.items() if text.endswith(prompt))
        chat = row["messages"]
        if chat[-1].get("tool_calls"):
            target = _template_target(tokenizer, chat, row["tools"], variables)
            if template == QWEN3_CHAT_TEMPLATE and not variables:
                # the empty think block Qwen3's template writes for a chat's last turn alone: trained without
                # it, as a plain answer is (the generation prompt ends at the header)
                assert target.startswith(EMPTY_THINK)
                target = target.removeprefix(EMPTY_THINK)
            assert "get_weather" in target and "근교" in target
            calls += 1
        else:
            target = chat[-1]["content"]
        expected = tokenizer(target, add_special_tokens=False)["input_ids"] + [eos]
        assert sample["input_ids"][sample["prompt_length"] :] == expected
    assert calls == len(rows) // 2


def test_chats_that_differ_only_in_their_call_or_tools_stay_two_rows(sample_texts):
    tokenizer = tool_calling_tokenizer(sample_texts)
    chat = tool_chat("서울")
    other_arguments = [*chat[:-1], {**chat[-1], "tool_calls": [tool_call("서울 북부")]}]
    other_tool = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "description": "Another"}}
    raw = pd.DataFrame(
        {
            "messages": [chat, other_arguments, chat, chat],
            "tools": [[WEATHER_TOOL], [WEATHER_TOOL], [other_tool], [WEATHER_TOOL]],
        }
    )
    frame, drops = prompt_frame(raw, parse_split_params({"messages_column": "messages"}), tokenizer)
    assert len(frame) == 3 and frame["split_key"].nunique() == 3 and drops["duplicate"] == 1
    # as a JSON string, the same tools are the same row
    raw["tools"] = [json.dumps([WEATHER_TOOL])] * 4
    frame, drops = prompt_frame(raw, parse_split_params({"messages_column": "messages"}), tokenizer)
    assert len(frame) == 2 and drops["duplicate"] == 2


@pytest.mark.parametrize(
    "value",
    ["{not json", [{"type": "function", "function": {"description": "no name"}}], {"name": "x"}, [3]],
    ids=["bad_json", "no_name", "not_a_list", "not_a_mapping"],
)
def test_a_malformed_tools_value_is_refused_in_one_line_naming_the_row_and_the_column(sample_texts, value):
    tokenizer = tool_calling_tokenizer(sample_texts)
    raw = pd.DataFrame(
        {
            "messages": [tool_chat("서울"), tool_chat("부산")],
            "calls": pd.Series([[WEATHER_TOOL], value], dtype=object),
        }
    )
    config = parse_split_params({"messages_column": "messages", "tools_column": "calls"})
    with pytest.raises(InputDataError) as caught:
        prompt_frame(raw, config, tokenizer)
    line = str(caught.value)
    assert "\n" not in line and "row 2" in line and "split.tools_column ('calls')" in line


def test_tools_values_are_read_as_lists_of_function_schemas():
    """A missing value is no tools; a JSON string or a list (a numpy array, as Parquet gives it) of
    schemas is the same list."""
    expected = [WEATHER_TOOL]
    found = parse_tools(
        pd.Series([None, json.dumps(expected), np.array(expected, dtype=object), [], float("nan")]),
        "split.tools_column ('tools')",
    )
    assert found == [None, expected, expected, None, None]


def test_a_template_that_does_not_write_tool_calls_is_refused_in_one_line(sample_texts):
    tokenizer = tool_calling_tokenizer(sample_texts, template=NO_TOOL_CALLS_TEMPLATE)
    raw = pd.DataFrame(tool_chat_rows(4))
    with pytest.raises(ConfigError) as caught:
        prompt_frame(raw, parse_split_params({"messages_column": "messages"}), tokenizer)
    line = str(caught.value)
    assert "\n" not in line and "does not render tool calls" in line and "get_weather" in line


def test_earlier_tool_calls_train_as_the_chat_writes_them(sample_texts, monkeypatch):
    """With ``train_turns: all``, an earlier assistant turn that calls a tool trains as the prompt writes it
    (found after the render of the chat before it). Qwen3's template writes a chat's last turn with an empty
    think block it writes no turn inside a chat with: an earlier call is found all the same, with no warning
    of answers left out (was: it stayed an input, every one counted in that warning)."""
    from fastlm.corpus import prompts

    said = logging.Logger("tool-chats", logging.WARNING)
    seen = []
    said.addHandler(logging.Handler())
    said.handlers[0].emit = lambda record: seen.append(record.getMessage())
    monkeypatch.setattr(prompts, "log", said)
    rows = [{"messages": tool_chat(f"도시{i}", answer=f"{i}도"), "tools": [WEATHER_TOOL]} for i in range(3)]
    tokenizer = tool_calling_tokenizer(sample_texts)
    for template in (tokenizer.chat_template, QWEN3_CHAT_TEMPLATE):
        tokenizer.chat_template = template
        frame, _ = prompt_frame(
            pd.DataFrame(rows), parse_split_params({"messages_column": "messages"}), tokenizer
        )
        for row, (prompt, spans) in zip(
            rows, zip(frame["prompt"], frame["answer_spans"], strict=True), strict=True
        ):
            chat, tools = row["messages"], row["tools"]
            render = {"tokenize": False, "tools": tools, "date_string": CHAT_DATE}
            before = tokenizer.apply_chat_template(chat[:1], add_generation_prompt=True, **render)
            after = tokenizer.apply_chat_template(chat[:3], add_generation_prompt=False, **render)
            turn = after[len(before) :]
            turn = turn[: turn.index(tokenizer.eos_token) + len(tokenizer.eos_token)]
            (start, end) = map(int, spans.split(":"))
            assert prompt[start:end] == turn and "get_weather" in turn
    assert not [line for line in seen if "earlier answers" in line], seen


TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ["KST", "UTC"]}},
            "required": ["zone"],
        },
    },
}


def _call(name: str, arguments, call_id: str | None = None) -> dict:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return {**call, "id": call_id} if call_id else call


def _rounds_chat(city: str, *, final_call: bool) -> list[dict]:
    """user -> call -> result -> call -> result -> answer (or a third call, ``final_call``), the results
    answering their call ids."""
    chat = [
        {"role": "user", "content": f"{city} 날씨와 시간"},
        {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": city}, "c1")]},
        {"role": "tool", "content": '{"temp": 3}', "tool_call_id": "c1", "name": "get_weather"},
        {
            "role": "assistant",
            "content": "확인할게요.",
            "tool_calls": [_call("get_time", {"zone": "KST"}, "c2")],
        },
        {"role": "tool", "content": '{"time": "9시"}', "tool_call_id": "c2", "name": "get_time"},
    ]
    if final_call:
        return [
            *chat,
            {"role": "assistant", "content": "", "tool_calls": [_call("get_weather", {"city": "부산"})]},
        ]
    return [*chat, {"role": "assistant", "content": f"{city}은 3도, 9시입니다."}]


def _tokenizer(kind: str, texts):
    if kind == "llama32":
        return llama3_style_tokenizer(texts), {}
    tokenizer = tool_calling_tokenizer(texts)
    if kind != "qwen_style":
        tokenizer.chat_template = QWEN3_CHAT_TEMPLATE
    return tokenizer, ({"enable_thinking": False} if kind == "qwen3_no_thinking" else {})


def _in_chat(tokenizer, chat: list, tools, variables: dict, index: int) -> str:
    """Turn ``index`` of ``chat`` as the template writes it inside the chat (the chat rendered up to the turn
    after it, less the render of the turns before it, header and end of turn included)."""
    render = {"tokenize": False, "tools": tools, "date_string": CHAT_DATE, **variables}
    before = tokenizer.apply_chat_template(chat[:index], add_generation_prompt=False, **render)
    after = tokenizer.apply_chat_template(chat[: index + 2], add_generation_prompt=False, **render)
    return after[len(before) :]


def test_json_text_arguments_train_as_the_mapping_they_hold(sample_texts):
    """OpenAI-style data gives a call's arguments as a JSON text (``json.dumps``: ASCII-escaped). Templates
    write a mapping as JSON (Qwen3: ``tojson``, not escaped) and a text as it is (Qwen3) or quoted again
    (Llama-3.x: ``"parameters": "{\\"city\\": ...}"``); a model asked with tools writes the mapping. The
    target of a call given as a JSON text is the target of the same call given as the mapping."""
    for kind in ("qwen3", "llama32"):
        tokenizer, variables = _tokenizer(kind, sample_texts)
        as_mapping = tool_chat("서울")
        as_text = [
            *as_mapping[:-1],
            {**as_mapping[-1], "tool_calls": [_call("get_weather", json.dumps({"city": "서울 근교"}))]},
        ]
        raw = pd.DataFrame({"messages": [as_text], "tools": [[WEATHER_TOOL]]})
        config = parse_split_params({"messages_column": "messages", "chat_template_kwargs": variables})
        frame, _ = prompt_frame(raw, config, tokenizer)
        expected = _template_target(tokenizer, as_mapping, [WEATHER_TOOL], variables)
        given = pd.DataFrame({"messages": [as_mapping], "tools": [[WEATHER_TOOL]]})
        assert frame["response"].tolist() == prompt_frame(given, config, tokenizer)[0]["response"].tolist()
        assert expected.endswith(frame["response"][0]) and "서울 근교" in frame["response"][0], kind


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_tools_and_calls_read_from_a_file_render_as_the_data_gives_them(tmp_path, sample_texts, suffix):
    """Arrow (the Parquet reader, and the JSON Lines reader) reads a column of mappings as one struct type:
    each row's mapping gets every key any row has, null where it has none, so a call to ``get_time`` read
    back carries ``"city": null`` and the weather tool's schema a ``"zone": null`` property. The file's rows
    render as the rows written to it."""
    from fastlm.corpus.readers import read_text_table

    tokenizer, _ = _tokenizer("qwen3", sample_texts)
    rows = [
        {"messages": _rounds_chat(f"도시{i}", final_call=i % 2 == 0), "tools": [WEATHER_TOOL, TIME_TOOL]}
        for i in range(4)
    ]
    rows.append({"messages": tool_chat("대전"), "tools": [WEATHER_TOOL]})
    rows.append({"messages": [{"role": "user", "content": "안녕"}, {"role": "assistant", "content": "네"}]})
    path = tmp_path / f"chats.{suffix}"
    if suffix == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    config = parse_split_params({"messages_column": "messages"})
    read, _ = prompt_frame(read_text_table(path), config, tokenizer)
    given, _ = prompt_frame(pd.DataFrame(rows), config, tokenizer)
    assert len(read) == len(rows)
    for column in ("prompt", "response", "answer_spans", "split_key"):
        assert read[column].tolist() == given[column].tolist(), column
    for row, prompt in zip(rows, read["prompt"], strict=True):
        expected = tokenizer.apply_chat_template(
            row["messages"][:-1], tools=row.get("tools"), add_generation_prompt=True, tokenize=False
        )
        assert prompt == expected


ASSISTANT_HEADER = {
    "qwen": "<|im_start|>assistant\n",
    "llama32": "<|start_header_id|>assistant<|end_header_id|>\n\n",
}


@pytest.mark.parametrize("kind", ["qwen_style", "qwen3", "qwen3_no_thinking", "llama32"])
def test_the_loss_scores_each_call_and_answer_as_the_chat_writes_it_and_nothing_else(
    tmp_path, sample_texts, kind
):
    """Multi-round chats (call -> result -> content and call -> result -> answer or a third call),
    ``train_turns: all``: the tokens scored are, token for token, each assistant turn as the template writes
    it inside the chat (after its header, up to and with its end of turn, the EOS) and no token of the system
    turn's tool schemas, the user turns, the tool results or the headers. A final turn trains as the same turn
    is written once the chat goes on (the template's text for the next round's prompt): Qwen3's template adds
    an empty think block to a chat's last turn alone, which a plain answer is trained without."""
    tokenizer, variables = _tokenizer(kind, sample_texts)
    header = ASSISTANT_HEADER["llama32" if kind == "llama32" else "qwen"]
    end = tokenizer.eos_token
    tools = [WEATHER_TOOL, TIME_TOOL]
    rows = [{"messages": _rounds_chat(f"도시{i}", final_call=i % 2 == 0), "tools": tools} for i in range(10)]
    _, _, tokenized = _split(tmp_path, tokenizer, rows, chat_template_kwargs=variables, train_turns="all")
    render = {"tokenize": False, "tools": tools, "date_string": CHAT_DATE, **variables}
    samples = [sample for name in ("train", "validation", "test") for sample in tokenized[name]]
    assert len(samples) == len(rows)
    for row in rows:
        chat = row["messages"]
        prompt = tokenizer.apply_chat_template(chat[:-1], add_generation_prompt=True, **render)
        ids = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        sample = next(s for s in samples if s["input_ids"][: s["prompt_length"]] == ids["input_ids"])
        follower = {"role": "tool", "content": "{}"} if chat[-1].get("tool_calls") else {"role": "user"}
        going_on = tokenizer.apply_chat_template([*chat, {"content": "네", **follower}], **render)
        # each assistant turn's target: after its header where the chat before it ends, up to its end of turn
        targets = []
        for index in [i for i, m in enumerate(chat) if m["role"] == "assistant"]:
            before = tokenizer.apply_chat_template(chat[:index], **render)
            text = going_on if index == len(chat) - 1 else prompt
            assert text.startswith(before + header), (kind, index)
            start = len(before) + len(header)
            targets.append((start, text.index(end, start) + len(end)))
        *earlier, (start, stop) = targets
        scored = np.zeros(len(ids["input_ids"]), dtype=bool)
        for first, last in earlier:
            scored |= [first <= a and b <= last for a, b in ids["offset_mapping"]]
        found = np.zeros_like(scored)
        pairs = list(sample.get("answer_spans") or [])  # flat: start, end, start, end, ...
        for first, last in zip(pairs[::2], pairs[1::2], strict=True):
            found[first:last] = True
        assert found.tolist() == scored.tolist(), (kind, going_on)
        assert tokenizer.decode(np.asarray(ids["input_ids"])[scored]) == "".join(
            prompt[first:last] for first, last in earlier
        )
        response = going_on[start : stop - len(end)]
        expected = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        assert sample["input_ids"][sample["prompt_length"] :] == expected, (kind, response)


@pytest.mark.parametrize("last", [True, False], ids=["last_turn", "earlier_turn"])
def test_a_chat_the_template_refuses_is_refused_in_one_line_naming_the_column(sample_texts, last):
    """Llama-3.x's template takes one call per turn (``raise_exception``): a chat with two calls in one turn
    is refused in one line naming split.messages_column, the chat and the template's words (was: jinja's
    TemplateError and its traceback)."""
    tokenizer = llama3_style_tokenizer(sample_texts)
    chat = tool_chat("서울", answer=None if last else "맑아요")
    chat[1 if not last else -1] = {**chat[1], "tool_calls": [tool_call("서울"), tool_call("부산")]}
    raw = pd.DataFrame({"messages": [tool_chat("대전"), chat], "tools": [[WEATHER_TOOL]] * 2})
    with pytest.raises(InputDataError) as caught:
        prompt_frame(raw, parse_split_params({"messages_column": "messages"}), tokenizer)
    line = str(caught.value)
    assert "\n" not in line and "split.messages_column" in line and "single tool-calls" in line
    assert "서울 날씨" in line


def test_tool_chats_of_data_without_the_tools_column_are_said_in_one_warning(sample_texts, monkeypatch):
    """Chats that call tools in a file without the tools column (forgotten, or named otherwise: `functions`)
    train their calls without the function schemas a model is asked with: one warning names the column
    looked for and the count (they trained so silently). Data with the column, or without tool chats, says
    nothing."""
    import logging

    from fastlm.corpus import prompts

    lines: list[str] = []
    logger = logging.Logger("split-test")
    logger.addHandler(type("H", (logging.Handler,), {"emit": lambda self, r: lines.append(r.getMessage())})())
    monkeypatch.setattr(prompts, "log", logger)
    tokenizer = tool_calling_tokenizer(sample_texts)
    config = parse_split_params({"messages_column": "messages"})
    chats = [
        tool_chat("서울"),
        tool_chat("부산", answer="맑아요."),
        [*tool_chat("대구")[:1], {"role": "assistant", "content": "네."}],
    ]
    prompt_frame(pd.DataFrame({"messages": chats, "functions": [[WEATHER_TOOL]] * 3}), config, tokenizer)
    said = [line for line in lines if "tools column" in line]
    assert len(said) == 1 and "2 of 3 chats" in said[0] and "'tools'" in said[0], lines
    assert "split.tools_column" in said[0]
    lines.clear()
    prompt_frame(pd.DataFrame({"messages": chats, "tools": [[WEATHER_TOOL]] * 3}), config, tokenizer)
    prompt_frame(pd.DataFrame({"messages": chats[2:]}), config, tokenizer)
    assert not [line for line in lines if "tools column" in line], lines


def test_the_split_report_records_the_chats_that_call_tools_and_the_tools_column(tmp_path, sample_texts):
    """The split report records how many chats call tools and how many were given their tools from
    ``split.tools_column``, for the report's training summary to say (it said "Chats" alone)."""
    tokenizer = tool_calling_tokenizer(sample_texts)
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = tool_chat_rows(8)
    rows += [
        {"messages": row["messages"][:1] + [{"role": "assistant", "content": f"답 {i}"}], "tools": []}
        for i, row in enumerate(tool_chat_rows(4))
    ]
    params = {
        "messages_column": "messages",
        "max_length": 2048,
        "tokenizer": {"source": str(tmp_path / "tok")},
    }
    _, counts = nodes.clean_corpus(pd.DataFrame(rows), params)
    calling = sum(
        any(turn.get("tool_calls") or turn["role"] == "tool" for turn in row["messages"]) for row in rows
    )
    given = sum(bool(row["tools"]) for row in rows)
    assert 0 < calling < len(rows) and 0 < given < len(rows)
    assert counts["tool_use"] == {
        "tools_column": "tools",
        "chats_with_tools": given,
        "chats_calling_tools": calling,
    }
    fingerprint = {"fingerprint": "f", "params": {"max_length": 2048, "data_format": {"kind": "messages"}}}
    report, _ = nodes.report_split({**counts, "capped_by_max_samples": 0}, {}, fingerprint)
    assert report["tool_use"] == counts["tool_use"]
    plain_rows = [{"messages": row["messages"]} for row in rows[8:]]
    assert "tool_use" not in nodes.clean_corpus(pd.DataFrame(plain_rows), params)[1]  # plain chats: none


def test_call_arguments_and_tools_are_cleaned_as_contents_by_the_split_and_predict(sample_texts):
    """A chat's contents are NFC with the invisible marks removed; its calls' arguments (a mapping or a JSON
    text) and its tools' schemas were given to the template as they came: decomposed (NFD) Hangul and a
    zero-width space reached the prompt and the trained call, while every content was composed. They are
    cleaned by the same rule (``normalize_text``, not stripped), keys kept in order, by the split and by
    predict alike: the marked chat trains and is asked exactly as the clean one."""
    from fastlm.reporting.predict_chats import ChatFormat
    from tests.support.reporting import chat_rows

    def nfd(text: str) -> str:
        return unicodedata.normalize("NFD", text)

    tokenizer = tool_calling_tokenizer(sample_texts)
    tool = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "description": "도시의 날씨"}}
    clean = tool_chat("서울")
    clean[1]["tool_calls"] = [_call("get_weather", {"city": "서울", "unit": "섭씨"})]
    marked_tool = {**tool, "function": {**tool["function"], "description": nfd("도시의\u200b 날씨")}}
    marked = [dict(turn) for turn in clean]
    marked[1]["tool_calls"] = [
        _call("get_weather", json.dumps({"city": nfd("서울\u200b"), "unit": nfd("섭씨")}))
    ]
    marked[3]["tool_calls"] = [_call("get_weather", {"city": nfd("서울 근교") + "\u2060"})]
    config = parse_split_params({"messages_column": "messages"})
    frames = [
        prompt_frame(pd.DataFrame({"messages": [chat], "tools": [[given]]}), config, tokenizer)[0]
        for chat, given in ((clean, tool), (marked, marked_tool))
    ]
    columns = ["prompt", "response", "split_key", "answer_spans"]
    assert frames[1][columns].to_dict("records") == frames[0][columns].to_dict("records")
    assert '"unit": "섭씨"' in frames[0].loc[0, "prompt"] and "도시의 날씨" in frames[0].loc[0, "prompt"]
    asked = chat_rows(
        pd.DataFrame({"messages": [clean[:3], marked[:3]], "tools": [[tool], [marked_tool]]}),
        tokenizer,
        ChatFormat(),
        source="chats.jsonl",
    )
    assert asked["ids"].iloc[1] == asked["ids"].iloc[0]
    assert asked["tools"].iloc[1] == asked["tools"].iloc[0]


def test_keys_that_are_one_once_cleaned_drop_the_chat_or_refuse_the_tools_never_merge(sample_texts):
    """Cleaning a mapping's keys (NFC, invisible marks removed) made ``city`` and ``city`` + a zero-width
    space, or an NFD and an NFC key, one key: one value was silently lost. A call whose arguments hold two
    such keys makes its chat malformed (a ``malformed_messages`` drop at the split, a refused row at
    predict); a tools value holding two is refused in one line naming its row and the keys."""
    from fastlm.reporting.predict_chats import ChatFormat
    from tests.support.reporting import chat_rows

    tokenizer = tool_calling_tokenizer(sample_texts)
    clashing = tool_chat("서울")
    clashing[1] = {
        **clashing[1],
        "tool_calls": [_call("get_weather", {"city": "서울", "city\u200b": "부산"})],
    }
    nfd = unicodedata.normalize("NFD", "도시")
    text_arguments = tool_chat("부산")
    text_arguments[-1] = {
        **text_arguments[-1],
        "tool_calls": [_call("get_weather", json.dumps({"도시": "부산", nfd: "대구"}, ensure_ascii=False))],
    }
    config = parse_split_params({"messages_column": "messages"})
    raw = pd.DataFrame(
        {"messages": [clashing, text_arguments, tool_chat("광주")], "tools": [[WEATHER_TOOL]] * 3}
    )
    frame, drops = prompt_frame(raw, config, tokenizer)
    assert len(frame) == 1 and drops["malformed_messages"] == 2
    asked = chat_rows(
        pd.DataFrame({"messages": [clashing[:3], tool_chat("광주")[:3]]}), tokenizer, ChatFormat()
    )
    assert asked["refused"].fillna("").tolist()[0].startswith("malformed_messages (tool_calls")
    assert asked["refused"].fillna("").tolist()[1] == "" and asked["ids"].notna().tolist() == [False, True]
    properties = {"city": {"type": "string"}, "city\u2060": {"type": "integer"}}
    bad_tool = {
        **WEATHER_TOOL,
        "function": {**WEATHER_TOOL["function"], "parameters": {"properties": properties}},
    }
    raw = pd.DataFrame(
        {"messages": [tool_chat("서울"), tool_chat("부산")], "tools": [[WEATHER_TOOL], [bad_tool]]}
    )
    with pytest.raises(InputDataError) as caught:
        prompt_frame(raw, config, tokenizer)
    line = str(caught.value)
    assert "\n" not in line and "row 2" in line and "city\\u2060" in line, line


def test_a_key_written_twice_in_a_json_text_drops_the_chat_or_refuses_the_tools(sample_texts):
    """Python's ``json`` keeps the last value of a key an object writes twice: arguments given as the JSON
    text ``{"city": "서울", "city": "부산"}`` were read as a call to 부산 alone, a tools JSON text writing a
    property twice as a schema the data never held. Such a call makes its chat malformed (a
    ``malformed_messages`` drop at the split, a refused row at predict); such a tools text is refused in one
    line naming its row and the key."""
    from fastlm.reporting.predict_chats import ChatFormat
    from tests.support.reporting import chat_rows

    tokenizer = tool_calling_tokenizer(sample_texts)
    twice = tool_chat("서울")
    twice[1] = {**twice[1], "tool_calls": [_call("get_weather", '{"city": "서울", "city": "부산"}')]}
    config = parse_split_params({"messages_column": "messages"})
    raw = pd.DataFrame({"messages": [twice, tool_chat("광주")], "tools": [[WEATHER_TOOL]] * 2})
    frame, drops = prompt_frame(raw, config, tokenizer)
    assert len(frame) == 1 and drops["malformed_messages"] == 1
    asked = chat_rows(pd.DataFrame({"messages": [twice[:3], tool_chat("광주")[:3]]}), tokenizer, ChatFormat())
    assert asked["refused"].fillna("").tolist()[0].startswith("malformed_messages (tool_calls")
    assert asked["ids"].notna().tolist() == [False, True]
    schema = json.dumps([WEATHER_TOOL], ensure_ascii=False)
    properties = '"properties": {"city": {"type": "string"}, "city": {"type": "integer"}}'
    doubled = schema.replace('"properties": {"city": {"type": "string"}}', properties)
    assert doubled != schema
    raw = pd.DataFrame({"messages": [tool_chat("서울"), tool_chat("부산")], "tools": [schema, doubled]})
    with pytest.raises(InputDataError) as caught:
        prompt_frame(raw, config, tokenizer)
    line = str(caught.value)
    assert "\n" not in line and "row 2" in line and "'city'" in line and "twice" in line, line
