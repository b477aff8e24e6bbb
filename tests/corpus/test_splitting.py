import numpy as np
import pandas as pd

from fastlm.corpus.splitting import SPLITS, assign_splits, cap_rows, text_keys


def _splits(texts, salt=""):
    keys = text_keys(texts, salt)
    return dict(zip(texts, (SPLITS[code] for code in assign_splits(keys[:, 0], 0.8, 0.1, 0.1)), strict=True))


def test_appending_rows_never_moves_an_existing_row(sample_texts):
    before = _splits(sample_texts[:300])
    after = _splits(sample_texts[:300][::-1] + sample_texts[300:])  # reordered and appended
    assert all(after[text] == split for text, split in before.items())


def test_ratios_are_respected_and_salt_redraws():
    texts = [f"text number {i}" for i in range(20_000)]
    counts = np.bincount(assign_splits(text_keys(texts)[:, 0], 0.8, 0.1, 0.1), minlength=3) / len(texts)
    assert np.allclose(counts, [0.8, 0.1, 0.1], atol=0.01)
    assert _splits(texts[:2000]) != _splits(texts[:2000], salt="other")


def test_zero_ratio_gets_no_rows_even_at_the_boundary():
    keys = np.array([0.0, 0.5, 0.8999999, 0.95, 0.9999999999])
    assert set(assign_splits(keys, 0.9, 0.1, 0.0)) <= {0, 1}
    assert set(assign_splits(keys, 1.0, 0.0, 0.0)) == {0}


def test_cap_is_deterministic_and_independent_of_row_order(sample_texts):
    keys = text_keys(sample_texts)[:, 1]
    chosen = {sample_texts[i] for i in cap_rows(keys, 100)}
    reversed_texts = sample_texts[::-1]
    chosen_reversed = {reversed_texts[i] for i in cap_rows(text_keys(reversed_texts)[:, 1], 100)}
    assert len(chosen) == 100 and chosen == chosen_reversed
    assert list(cap_rows(keys, None)) == list(range(len(sample_texts)))
    positions = cap_rows(keys, 100)
    assert list(positions) == sorted(positions)  # original order kept


def test_a_text_written_with_single_spaces_keeps_its_split_and_its_variants_share_it():
    """The split key is the text with the spaces inside each line made single spaces: a text written so
    (most texts) keys on itself as before, its split unchanged; a variant (a no-break space, two spaces, a
    tab) keys on the same text and so lies in the same split."""
    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.split_steps import split_rows

    texts = [f"배송이 빨라요 {i}번째 리뷰\n둘째 줄 {i}" for i in range(200)]
    config = parse_split_params({"ratios": {"train": 0.5, "validation": 0.25, "test": 0.25}})
    splits, _, codes = split_rows(pd.DataFrame({"text": texts}), config)
    assert codes.tolist() == assign_splits(text_keys(texts)[:, 0], 0.5, 0.25, 0.25).tolist()
    variants = [text.replace(" ", "\u00a0", 1).replace(" ", "  ", 1).replace("\n", " \n\t") for text in texts]
    _, _, variant_codes = split_rows(pd.DataFrame({"text": variants}), config)
    assert variant_codes.tolist() == codes.tolist()


PAIRS = {"prompt_column": "dialogue", "response_column": "summary", "prompt_template": "{prompt}"}


def _split_pairs(rows: list[tuple[str, str]], **params) -> pd.DataFrame:
    """``rows`` (prompt, response) cleaned and split as the split pipeline does."""
    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.prompts import prompt_frame
    from fastlm.corpus.split_steps import split_rows

    ratios = {"ratios": {"train": 0.6, "validation": 0.2, "test": 0.2}}
    config = parse_split_params({**PAIRS, **ratios, **params})
    frame = pd.DataFrame(rows, columns=["dialogue", "summary"])
    clean, _ = prompt_frame(frame, config)
    return split_rows(clean, config)[0]


def _old_split(key: str) -> str:
    """The split a row keyed on ``key`` alone lands in (ratios 0.6 / 0.2 / 0.2, no salt)."""
    return SPLITS[assign_splits(text_keys([key])[:, 0], 0.6, 0.2, 0.2)[0]]


def test_pairs_sharing_a_prompt_land_in_one_split():
    """A dialogue with several reference summaries (DialogSum, SAMSum-style data) is several pairs of one
    prompt: each keyed on its whole pair, they landed one in train and another in test, so the test scored
    dialogues the model trained on. Every pair of a shared prompt now lies in the split (and, with
    split.folds, the fold) of the prompt alone, whatever the row order and whichever responses are given."""
    rows = [
        (f"#Person1#: 안녕 {i}\n#Person2#: 네 {i}", f"요약 {i} 판본 {k}")
        for i in range(150)
        for k in range(3)
    ]
    splits = _split_pairs(rows)
    assert splits.groupby("prompt")["split"].nunique().max() == 1, "a prompt lies in two splits"
    for prompt, split in splits.groupby("prompt")["split"].first().items():
        assert split == _old_split(prompt)  # keyed on the prompt alone
    assert set(splits["split"]) == set(SPLITS)
    shuffled = _split_pairs(rows[::-1][::2] + rows[::-1][1::2])
    assert (
        shuffled.set_index(["prompt", "response"])["split"]
        .sort_index()
        .equals(splits.set_index(["prompt", "response"])["split"].sort_index())
    )
    fewer = _split_pairs([row for row in rows if not row[1].endswith("판본 0")])  # one summary less each
    assert (fewer.groupby("prompt")["split"].first() == splits.groupby("prompt")["split"].first()).all()
    folds = _split_pairs(rows, folds=3)
    assert folds.groupby("prompt")["fold"].nunique().max() == 1, "a prompt lies in two folds"
    # white space inside a line compares as the split key compares it: one prompt
    spaced = [
        (prompt.replace(" ", "\u00a0", 1) if k == 1 else prompt, summary)
        for (prompt, summary), k in zip(rows, [0, 1, 2] * 150, strict=True)
    ]
    grouped = _split_pairs(spaced)
    grouped["key"] = grouped["prompt"].str.replace("\u00a0", " ")
    assert grouped.groupby("key")["split"].nunique().max() == 1


def test_a_pair_with_a_unique_prompt_keeps_its_split():
    """Stable splits: a pair whose prompt no other pair shares is keyed on its whole pair as before, so its
    split is the one it always had; only the pairs of a shared prompt move."""
    unique = [(f"질문 {i}", f"답변 {i}") for i in range(200)]
    shared = [(f"공통 질문 {i}", f"답변 {i}-{k}") for i in range(40) for k in range(2)]
    splits = _split_pairs(unique + shared)
    alone = splits[splits["prompt"].str.startswith("질문")]
    assert len(alone) == 200
    for prompt, response, split in zip(alone["prompt"], alone["response"], alone["split"], strict=True):
        assert split == _old_split(prompt + response)  # the pair's key: its prompt, then its response


def _split_chats(chats: list[list[tuple[str, str]]], **params) -> pd.DataFrame:
    """``chats`` (each a list of (role, content) turns) cleaned and split as the split pipeline does."""
    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.prompts import prompt_frame
    from fastlm.corpus.split_steps import split_rows

    ratios = {"ratios": {"train": 0.6, "validation": 0.2, "test": 0.2}}
    config = parse_split_params({"messages_column": "messages", **ratios, **params})
    messages = [[{"role": role, "content": content} for role, content in chat] for chat in chats]
    clean, _ = prompt_frame(pd.DataFrame({"messages": messages}), config)
    return split_rows(clean, config)[0]


def test_the_chats_of_one_conversation_or_one_prompt_land_in_one_split():
    """Chat data flattened one row per answer (a conversation's first exchange, its first two, ...) and chats
    asking one prompt with other answers: each row keyed on its whole chat, the row trained on ``u1 -> a1``
    could lie in train while the row asking ``u1`` lay in test. Rows where one's prompt begins another's (or
    is it) lie in one split, that of the conversation's shortest prompt alone; chats that only begin with
    the same user turn, answered otherwise, and every chat sharing nothing keep the split of their own key."""
    chats = []
    for i in range(120):
        turns = [
            ("user", f"질문 {i}"),
            ("assistant", f"답 {i}"),
            ("user", f"다음 {i}"),
            ("assistant", f"또 {i}"),
        ]
        turns += [("user", f"끝 {i}"), ("assistant", f"마지막 {i}")]
        chats += [turns[:2], turns[:4], turns, [turns[0], ("assistant", f"다른 답 {i}")]]
        chats.append([*turns[:2], ("user", f"갈림 {i}"), ("assistant", f"갈린 답 {i}")])
    apart = [
        [("user", "안녕하세요"), ("assistant", f"반가워요 {i}"), ("user", f"혼자 {i}"), ("assistant", "네")]
        for i in range(100)
    ]
    splits = _split_chats(chats + apart)
    conversation = splits["prompt"].str.extract(r"user: 질문 (\d+)", expand=False)
    grouped = splits[conversation.notna()].assign(conversation=conversation)
    assert len(grouped) == 600
    assert grouped.groupby("conversation")["split"].nunique().max() == 1, "a conversation lies in two splits"
    for number, split in grouped.groupby("conversation")["split"].first().items():
        assert split == _old_split(f"user\x1f질문 {number}")  # keyed on its shortest prompt alone
    alone = splits[conversation.isna()]
    assert len(alone) == 100 and set(alone["split"]) == set(SPLITS)
    for prompt, response, split in zip(alone["prompt"], alone["response"], alone["split"], strict=True):
        turns = [line.split(": ", 1) for line in prompt.removesuffix("\n\n### Response:\n").split("\n")]
        key = "\0".join(f"{role}\x1f{content}" for role, content in [*turns, ("assistant", response)])
        assert split == _old_split(key), prompt
    folds = _split_chats(chats, folds=3)
    folds["conversation"] = folds["prompt"].str.extract(r"user: 질문 (\d+)", expand=False)
    assert folds.groupby("conversation")["fold"].nunique().max() == 1, "a conversation lies in two folds"
