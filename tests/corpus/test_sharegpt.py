"""Chats given as ShareGPT turns (``{from, value}``) are read as the role/content turns they stand for, as
axolotl's chat_template strategy maps its speakers; a speaker outside that mapping, or a turn that names its
speaker or its text twice, refuses the data in one line."""

import numpy as np
import pandas as pd
import pytest

from fastlm.corpus.prompts import clean_messages
from fastlm.corpus.sharegpt import SHAREGPT_ROLES, role_content_chats
from fastlm.errors import InputDataError
from tests.support.chat_templates import sharegpt_chat, tool_chat

PARAMETER = "split.messages_column ('conversations')"
ROLES = ("user", "assistant", "system", "tool")
SAME = {"system": ["system"], "tool": ["tool"]}  # speakers read as the role of their own name
CHATS = [
    [
        {"role": "system", "content": "상담원입니다."},
        {"role": "user", "content": " 배송은 언제 오나요? "},
        {"role": "assistant", "content": "내일 도착합니다."},
        {"role": "user", "content": "고마워요"},
        {"role": "assistant", "content": "천만에요."},
    ],
    tool_chat("서울", answer="서울은 2도입니다."),
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
]


def _cleaned(values) -> list:
    kept, drops = clean_messages(pd.Series(values, dtype=object))
    return [kept.to_dict("records"), drops]


def test_sharegpt_chats_clean_and_key_exactly_as_the_same_role_content_chats(tmp_path):
    given = pd.Series([sharegpt_chat(chat) for chat in CHATS], dtype=object)
    read, count = role_content_chats(given, PARAMETER)
    assert count == len(CHATS)
    assert _cleaned(list(read)) == _cleaned(CHATS)
    # read back from Parquet (each chat an array of mappings) they are the same chats too
    pd.DataFrame({"conversations": list(given)}).to_parquet(tmp_path / "chats.parquet")
    stored = pd.read_parquet(tmp_path / "chats.parquet")["conversations"]
    assert isinstance(stored.iloc[0], np.ndarray)
    assert _cleaned(list(role_content_chats(stored, PARAMETER)[0])) == _cleaned(CHATS)


def test_role_content_chats_and_other_values_are_left_as_they_are():
    values = pd.Series([CHATS[0], None, "user: hi", [{"role": "user"}, "hi"]], dtype=object)
    read, count = role_content_chats(values, PARAMETER)
    assert count == 0 and read is values


def test_every_speaker_of_the_mapping_and_a_chat_mixing_both_forms_read_alike(tmp_path):
    """``user`` / ``assistant`` are speakers too (axolotl's mapping, TRL's key renaming); a chat of both
    forms, turn by turn (TRL converts each turn alone), and Parquet's struct column filling the keys of the
    other form with nulls, read as the role/content chat."""
    speakers_read = {role: sorted(s for s, r in SHAREGPT_ROLES.items() if r == role) for role in ROLES}
    assert speakers_read == {"user": ["human", "user"], "assistant": ["assistant", "gpt"], **SAME}
    chat = CHATS[0]
    speakers = [{"from": m["role"], "value": m["content"]} for m in chat]  # user / assistant / system
    keyed = [{"from": m["from"], "content": m["value"]} for m in sharegpt_chat(chat)]  # TRL keeps content
    mixed = [sharegpt_chat([m])[0] if at % 2 else m for at, m in enumerate(chat)]
    pd.DataFrame({"c": [mixed, chat]}).to_parquet(tmp_path / "mixed.parquet")  # {role, content, from, value}
    filled = pd.read_parquet(tmp_path / "mixed.parquet")["c"]
    assert set(filled.iloc[0][0]) == {"role", "content", "from", "value"}
    read, count = role_content_chats(pd.Series([speakers, keyed, mixed, *filled], dtype=object), PARAMETER)
    assert count == 4  # the last: role/content turns, their from and value null
    for value in read:
        assert _cleaned([value]) == _cleaned([chat])


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        ({"from": "observation", "value": "{}"}, r"row 2, message 3: the speaker 'observation' \(from\)"),
        ({"from": "function_call", "value": "{}"}, r"row 2, message 3: the speaker 'function_call'"),
        ({"from": 3, "value": "x"}, r"row 2, message 3: the speaker 3 \(from\)"),
        ({"from": "gpt", "role": "assistant", "value": "x"}, r"row 2, message 3 gives both from and role"),
        ({"from": "gpt", "value": "x", "content": "y"}, r"row 2, message 3 gives both value and content"),
    ],
)
def test_a_turn_the_mapping_does_not_read_refuses_the_data_in_one_line(turn, expected):
    chats = [sharegpt_chat(CHATS[2]), [*sharegpt_chat(CHATS[2]), turn, {"from": "gpt", "value": "ok"}]]
    with pytest.raises(
        InputDataError, match=rf"^split\.messages_column \('conversations'\): {expected}"
    ) as caught:
        role_content_chats(pd.Series(chats, dtype=object), PARAMETER)
    assert "\n" not in str(caught.value) and "Fix:" in str(caught.value)
