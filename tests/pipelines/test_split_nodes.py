import json

import numpy as np
import pandas as pd
import pytest

from fastlm.corpus.fingerprint import check_fresh
from fastlm.errors import InputDataError
from fastlm.pipelines.split import nodes

PARAMS = {
    "ratios": {"train": 0.8, "validation": 0.1, "test": 0.1},
    "max_length": 24,
    "tokenizer": {"vocab_size": 400},
}


@pytest.fixture
def raw(sample_texts):
    frame = pd.DataFrame(
        {"body": sample_texts + ["", None, sample_texts[0]], "id": range(len(sample_texts) + 3)}
    )
    frame.attrs["source_path"] = "data/01_raw/reviews.csv"
    return frame


def test_clean_corpus_names_the_file_and_lists_columns(raw):
    with pytest.raises(InputDataError) as error:
        nodes.clean_corpus(raw, {})
    assert "data/01_raw/reviews.csv has no column 'text'; its columns are ['body', 'id']" in str(error.value)


def test_a_column_named_with_white_space_around_it_or_decomposed_is_the_column_asked_for(tmp_path, caplog):
    """A CSV header written `id, text` names its column ' text' (which --params cannot give: the value is
    stripped), a header saved on macOS names '본문' decomposed (NFD), while the parameter is typed composed:
    the split refused them with `has no column 'text'; its columns are ['id', ' text']` (or two names that
    look the same) and a fix naming the parameter. Each is read as the column asked for, said once; a CSV
    column of numbers alone is still read as written ('007')."""
    import logging
    import unicodedata

    from fastlm.corpus.readers import read_text_table

    path = tmp_path / "rows.csv"
    path.write_text("id, text\n1,007\n2,2024\n3,007\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        clean, counts = nodes.clean_corpus(read_text_table(path), {})
    assert clean["text"].tolist() == ["007", "2024"] and counts["dropped"]["duplicate"] == 1
    said = [record.getMessage() for record in caplog.records if "split.text_column" in record.getMessage()]
    assert len(said) == 1 and "' text'" in said[0], said
    decomposed = unicodedata.normalize("NFD", "질문"), unicodedata.normalize("NFD", "답변")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({decomposed[0]: f"질문 {i}", decomposed[1]: f"답변 {i}"}, ensure_ascii=False) + "\n"
            for i in range(3)
        ),
        encoding="utf-8",
    )
    clean, _ = nodes.clean_corpus(
        read_text_table(pairs),
        {"prompt_column": "질문", "response_column": "답변", "prompt_template": "{prompt}"},
    )
    assert clean["response"].tolist() == ["답변 0", "답변 1", "답변 2"]


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"vocab_size": 1000}, ["split.vocab_size = 1000"]),
        ({"eos_id": 5, "ids_column": "x"}, ["split.ids_column = 'x'", "split.eos_id = 5"]),
        ({"prompt_template": "Q: {prompt} A:"}, ["split.prompt_template = 'Q: {prompt} A:'"]),
        (
            {"chat_template": False, "tools_column": "tt"},
            ["split.chat_template = False", "tools_column = 'tt'"],
        ),
        (
            {"tokenizer": {"source": "models/x", "vocab_size": 500}, "pretokenized": True, "vocab_size": 9},
            ["split.tokenizer.source = 'models/x'", "split.tokenizer.vocab_size = 500"],
        ),
    ],
    ids=["vocab_size", "ids_settings", "prompt_template", "chat_settings", "tokenizer_of_ids"],
)
def test_split_settings_the_data_format_never_reads_are_said(params, said, caplog):
    """``split.vocab_size=1000`` meant for the BPE (``split.tokenizer.vocab_size``) on text data, the ids'
    EOS on texts, a prompt template or chat settings on plain text, a tokenizer for pre-tokenized ids: each
    was taken without a word and changed nothing. One warning names them and why, as for
    ``split.train_turns`` and ``split.chat_template_kwargs``."""
    import logging

    frame = pd.DataFrame({"text": ["a b", "c d"], "ids": [[1, 2], [3, 4]]})
    with caplog.at_level(logging.WARNING):
        nodes.clean_corpus(frame, params)
    warned = [record.getMessage() for record in caplog.records if "change" in record.getMessage()]
    assert len(warned) == 1 and all(part in warned[0] for part in said), warned
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        nodes.clean_corpus(frame, {"pretokenized": True, "vocab_size": 9, "eos_id": 8})  # read: nothing said
        nodes.clean_corpus(frame, {"tokenizer": {"vocab_size": 500, "min_frequency": 3}})
    assert not [record for record in caplog.records if "change" in record.getMessage()], caplog.text


def test_clean_corpus_refuses_an_empty_result(raw):
    frame = pd.DataFrame({"text": ["", "  ", None]})
    with pytest.raises(InputDataError, match="no usable text left"):
        nodes.clean_corpus(frame, {})


def test_nodes_chain_into_tokenized_splits_and_a_report(raw, sample_texts):
    params = {**PARAMS, "text_column": "body"}
    clean, counts = nodes.clean_corpus(raw, params)
    assert counts["dropped"]["empty"] == 1 and counts["dropped"]["missing"] == 1
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    assert set(splits["split"].unique()) == {"train", "validation", "test"}
    assert len(splits) == len(set(sample_texts))
    tokenizer = nodes.build_tokenizer(splits, params)
    tokenized, fingerprint, stats = nodes.tokenize_corpus(splits, tokenizer, params)
    assert {name: len(part) for name, part in tokenized.items()} == splits["split"].value_counts().to_dict()
    lengths = np.array(tokenized["train"]["length"])
    assert lengths.max() <= 24 and np.all(lengths == [len(ids) for ids in tokenized["train"]["input_ids"]])
    check_fresh(fingerprint, tokenizer, 24, where="tokenized")
    report, table = nodes.report_split(split_counts, stats, fingerprint)
    assert report["kept_rows"] == len(splits) and report["dropped"]["total"] == 3
    assert list(table["split"]) == ["train", "validation", "test"]
    assert table["truncated_share"].between(0, 1).all()


def test_max_samples_caps_deterministically(raw):
    params = {**PARAMS, "text_column": "body", "max_samples": 50}
    clean, counts = nodes.clean_corpus(raw, params)
    first, first_counts = nodes.split_corpus(clean, counts, params)
    second, _ = nodes.split_corpus(
        clean.sample(frac=1, random_state=1).reset_index(drop=True), counts, params
    )
    assert len(first) == 50 and set(first["text"]) == set(second["text"])
    assert first_counts["capped_by_max_samples"] == len(clean) - 50


def _wordpiece(words: list[str]):
    """A BERT-style WordPiece tokenizer of English words only (as a foreign model folder's may be)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(["[PAD]", "[UNK]", "[SEP]", *words])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="[UNK]", pad_token="[PAD]", eos_token="[SEP]"
    )


def test_a_tokenizer_that_cannot_write_the_corpus_is_measured_and_said(caplog):
    """Round six: a foreign tokenizer without Korean (a BERT WordPiece folder as split.tokenizer.source) made
    95 % of the Korean rows [UNK]s, exit 0, no warning, no figure in the split report. Each split's
    unknown-token share is in the report; a share of 1 % or more is said with the fix."""
    english = ["fast", "delivery", "great", "product", "very", "good"]
    texts = [f"{a} {b}" for a in english for b in english] + ["배송 빨라요", "정말 좋아요 good", "최고"] * 4
    splits = pd.DataFrame({"text": texts, "split": pd.Categorical(["train"] * len(texts), nodes.SPLITS)})
    caplog.set_level("WARNING", logger="fastlm")
    _, fingerprint, stats = nodes.tokenize_corpus(splits, _wordpiece(english), {**PARAMS, "max_length": 16})
    train = stats["train"]
    assert train["unknown_tokens"] == 4 * (2 + 2 + 1) and train["rows_with_unknown"] == 12
    assert train["unknown_token_share"] == round(train["unknown_tokens"] / train["tokens"], 6)
    said = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
    assert len(said) == 1 and "train" in said[0] and "split.tokenizer.source" in said[0], said
    report, table = nodes.report_split(
        {"raw_rows": len(texts), "dropped": {}, "capped_by_max_samples": 0, "source": "x"}, stats, fingerprint
    )
    assert report["splits"]["train"]["unknown_token_share"] > 0.01 and "unknown_token_share" in table


def test_every_split_a_tokenizer_cannot_write_is_named_with_its_share(caplog):
    """The warning named the worst split alone: a user whose test split was as bad as the train split read
    that training was the problem. Each split at 1 % or more is named with its share, in one warning."""
    english = ["fast", "delivery", "great", "product", "very", "good"]
    texts = [f"{a} {b}" for a in english for b in english] + ["배송 빨라요", "정말 좋아요 good", "최고"] * 4
    names = ["train", "test"] * (len(texts) // 2)
    splits = pd.DataFrame({"text": texts, "split": pd.Categorical(names, nodes.SPLITS)})
    caplog.set_level("WARNING", logger="fastlm")
    _, _, stats = nodes.tokenize_corpus(splits, _wordpiece(english), {**PARAMS, "max_length": 16})
    said = [r.getMessage() for r in caplog.records if "[UNK]" in r.getMessage()]
    assert len(said) == 1, said
    for name in ("train", "test"):
        assert f"{name} {100 * stats[name]['unknown_token_share']:.1f} %" in said[0], said
    assert "validation" not in said[0], said


def test_a_tokenizer_whose_unknown_token_is_its_eos_is_not_counted_unknown(caplog):
    """GPT-2 style tokenizers name one token `<|endoftext|>` unknown, EOS, BOS and pad: every row's EOS was
    counted unknown and the split said so ("3.4 % ... unknown token"). Such a tokenizer has no unknown token
    of its own: nothing is counted; the count itself runs on the flat token array with little extra
    memory."""
    from fastlm.corpus.statistics import unknown_per_row

    tokenizer = _wordpiece(["fast", "delivery"])
    tokenizer.unk_token = tokenizer.eos_token = "[SEP]"
    texts = ["fast delivery", "delivery fast", "fast"] * 4
    splits = pd.DataFrame({"text": texts, "split": pd.Categorical(["train"] * len(texts), nodes.SPLITS)})
    caplog.set_level("WARNING", logger="fastlm")
    _, _, stats = nodes.tokenize_corpus(splits, tokenizer, {**PARAMS, "max_length": 16})
    assert "unknown_tokens" not in stats["train"]
    assert not [r for r in caplog.records if "unknown token" in r.getMessage()]
    values, offsets = np.array([5, 1, 1, 7, 1, 2], dtype=np.int32), np.array([0, 3, 4, 6])
    assert unknown_per_row(values, offsets, 1).tolist() == [2, 0, 1]


def test_a_tokenizer_without_pad_is_warned_about_once_per_split(tmp_path, sample_texts, caplog):
    """clean_corpus loads the tokenizer to render chats, build_tokenizer loads it again for the data: the
    missing pad token is one fact of the split, said in one line."""
    import logging

    from tests.support.chat_templates import llama3_style_tokenizer

    llama3_style_tokenizer(sample_texts, vocab_size=400).save_pretrained(tmp_path / "tok")
    chats = [
        [{"role": "user", "content": question[:40]}, {"role": "assistant", "content": answer[:40]}]
        for question, answer in zip(sample_texts[:40], sample_texts[40:80], strict=True)
    ]
    params = {**PARAMS, "messages_column": "messages", "tokenizer": {"source": str(tmp_path / "tok")}}
    with caplog.at_level(logging.WARNING, logger="fastlm"):
        clean, counts = nodes.clean_corpus(pd.DataFrame({"messages": chats}), params)
        splits, _ = nodes.split_corpus(clean, counts, params)
        tokenizer = nodes.build_tokenizer(splits, params)
    assert tokenizer.pad_token == "<|eot_id|>"
    said = [r.getMessage() for r in caplog.records if "no pad token" in r.getMessage()]
    assert len(said) == 1, said


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (json.dumps([{"role": "user", "content": "hi"}]), "row 1 is a str, not a list"),
        ([{"role": "user", "content": "hi"}], "the last message is a 'user' turn, not the assistant's"),
        ([{"role": "user", "content": "hi"}, "hello"], "not a list of {role, content} turns"),
        (  # content parts (a multimodal chat format): no text fastlm reads
            [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": "ok"},
            ],
            "row 1: the content of message 1 ('user') is a list, not a text",
        ),
        (  # as a .jsonl file reads them: the lists are arrays
            [{"role": "user", "content": np.array([{"type": "text", "text": "hi"}])}, {"role": "assistant"}],
            "row 1: the content of message 1 ('user') is a list, not a text",
        ),
    ],
)
def test_chats_that_are_all_malformed_are_refused_saying_why(value, said):
    message = _refused_chats(value)
    assert "data/01_raw/chats.jsonl" in message and "split.messages_column" in message
    assert said in message and "\n" not in message, message


def test_a_max_length_that_cuts_many_training_rows_is_said(raw, caplog):
    """``split.max_length`` shorter than much of the corpus: most rows were cut (a prompt/response pair's
    answer too), counted only in the split report. From 5 % of the train rows it is said in one warning
    naming ``split.max_length``; a length that cuts none says nothing."""
    for max_length, said in ((8, True), (512, False)):
        params = {**PARAMS, "text_column": "body", "max_length": max_length}
        clean, counts = nodes.clean_corpus(raw, params)
        splits, _ = nodes.split_corpus(clean, counts, params)
        caplog.clear()
        with caplog.at_level("WARNING", logger="fastlm.pipelines.split.nodes"):
            _, _, stats = nodes.tokenize_corpus(splits, nodes.build_tokenizer(splits, params), params)
        warned = [r.getMessage() for r in caplog.records if "split.max_length" in r.getMessage()]
        assert len(warned) == int(said), warned
        if said:
            share = stats["train"]["truncated_share"]
            assert share >= 0.05 and f"{100 * share:.0f} % of the train split's rows" in warned[0]


def _refused_chats(value) -> str:
    """The one line the split refuses a file of three copies of the chat ``value`` with."""
    frame = pd.DataFrame({"messages": [value] * 3})
    frame.attrs["source_path"] = "data/01_raw/chats.jsonl"
    with pytest.raises(InputDataError) as error:
        nodes.clean_corpus(frame, {"messages_column": "messages"})
    return str(error.value)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (  # a role holding a newline and a long text: quoted, escaped and cut (was: printed raw, 2 lines)
            [{"role": "us\ner " + "x" * 500, "content": 7}, {"role": "assistant", "content": "ok"}],
            "the content of message 1 ('us\\ner xxx",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "no\nte " + "y" * 500, "content": "ok"}],
            "the last message is a 'no\\nte yyy",
        ),
    ],
    ids=["content_of_a_long_role", "last_turn_of_a_long_role"],
)
def test_a_malformed_chats_role_is_said_on_one_line_and_cut(value, said):
    message = _refused_chats(value)
    assert said in message and "\n" not in message, message
    assert "x" * 100 not in message and "y" * 100 not in message, message


def test_a_chat_whose_content_is_nan_is_said_missing_not_a_float():
    """A NaN content is a missing text (the drops count it ``missing``): not named a float that is no text."""
    chat = [{"role": "user", "content": float("nan")}, {"role": "assistant", "content": "ok"}]
    frame = pd.DataFrame({"messages": [chat] * 3})
    with pytest.raises(InputDataError) as error:
        nodes.clean_corpus(frame, {"messages_column": "messages"})
    message = str(error.value)
    assert "'missing': 3" in message and "float" not in message, message


def test_the_malformed_chat_named_is_counted_from_one_as_the_files_lines():
    """The row named is the file's line, counted from 1 as the split's other row errors are (was: from 0, so
    "row 1" was the second line)."""
    blank = [{"role": "user", "content": " "}, {"role": "assistant", "content": "ok"}]
    frame = pd.DataFrame({"messages": [blank, "Noah: hi", "Amy: yo"]})
    with pytest.raises(InputDataError) as error:
        nodes.clean_corpus(frame, {"messages_column": "messages"})
    assert "row 2 is a str, not a list" in str(error.value), error.value


def test_the_split_report_carries_the_data_format_the_report_says():
    data_format = {"kind": "messages", "messages_column": "messages", "train_turns": "all"}
    counts = {
        "raw_rows": 2,
        "dropped": {},
        "capped_by_max_samples": 0,
        "source": "x",
        "system_prompt": "Be brief.",
    }
    stats = {"train": {"rows": 2}}
    fingerprint = {"fingerprint": "f", "params": {"max_length": 8, "data_format": data_format}}
    report, _ = nodes.report_split(counts, stats, fingerprint)
    assert report["data_format"] == data_format and report["system_prompt"] == "Be brief."
    text, _ = nodes.report_split(counts, stats, {"fingerprint": "f", "params": {"max_length": 8}})
    assert "data_format" not in text


@pytest.mark.parametrize(
    ("changed", "said"),
    [
        ({"vocab_size": 500}, "split.tokenizer.vocab_size 400 -> 500"),
        ({"min_frequency": 5}, "split.tokenizer.min_frequency 2 -> 5"),
        ({"training_samples": 10}, "split.tokenizer.training_samples 200000 -> 10"),
        ({"source": "models/other"}, "split.tokenizer.source 'train' -> 'models/other'"),
    ],
)
def test_tokenizer_settings_changed_since_the_split_are_refused(raw, tmp_path, changed, said):
    from transformers import AutoTokenizer

    from fastlm.errors import ConfigError, StaleDataError
    from fastlm.parameters import parse_group

    params = {**PARAMS, "text_column": "body"}
    clean, counts = nodes.clean_corpus(raw, params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    nodes.build_tokenizer(splits, params, split_counts).save_pretrained(tmp_path)
    saved = AutoTokenizer.from_pretrained(tmp_path)  # as train and a later split node read it
    _, fingerprint, _ = nodes.tokenize_corpus(splits, saved, params, split_counts)
    check_fresh(fingerprint, saved, parse_group("split", params), where="tokenized")
    other = {**params, "tokenizer": {**params["tokenizer"], **changed}}
    with pytest.raises(StaleDataError) as error:  # train: the tokenizer saved was not built with these
        check_fresh(fingerprint, saved, parse_group("split", other), where="tokenized")
    assert said in str(error.value)
    with pytest.raises(ConfigError) as error:  # --from-nodes tokenize_corpus: the tokenizer is not rebuilt
        nodes.tokenize_corpus(splits, saved, other, split_counts)
    assert said in str(error.value)


def test_a_tokenized_split_replaced_or_edited_by_hand_is_refused(raw, tmp_path):
    import datasets

    from fastlm.corpus.fingerprint import check_tokenized

    params = {**PARAMS, "text_column": "body"}
    clean, counts = nodes.clean_corpus(raw, params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    tokenizer = nodes.build_tokenizer(splits, params, split_counts)
    tokenized, fingerprint, _ = nodes.tokenize_corpus(splits, tokenizer, params, split_counts)
    tokenized.save_to_disk(tmp_path / "tokenized", num_shards={"train": 3, "validation": 1, "test": 1})
    saved = datasets.load_from_disk(tmp_path / "tokenized")  # as train reads it: memory-mapped, in pieces
    assert saved["train"].data.column("input_ids").num_chunks > 1  # a large split is read in several
    check_tokenized(fingerprint, saved, where="data/05_model_input/tokenized_corpus")
    swapped = datasets.DatasetDict({**saved, "train": saved["validation"]})  # a file copied over another
    with pytest.raises(InputDataError) as error:
        check_tokenized(fingerprint, swapped, where="data/05_model_input/tokenized_corpus")
    assert f"its train split holds {len(saved['validation'])} rows" in str(error.value)
    assert f"the split wrote {len(saved['train'])}" in str(error.value)
    first = saved["train"][0]["input_ids"]
    edited = saved["train"].map(
        lambda row, index: {"input_ids": row["input_ids"][::-1]} if index == 0 else row, with_indices=True
    )
    assert edited[0]["input_ids"] != first and len(edited) == len(saved["train"])
    with pytest.raises(InputDataError, match="its train split's tokens are not those the split wrote"):
        check_tokenized(fingerprint, datasets.DatasetDict({**saved, "train": edited}), where="tokenized")
    check_tokenized({k: v for k, v in fingerprint.items() if k != "splits"}, swapped, where="tokenized")


def test_a_split_run_while_the_data_was_read_is_named_as_the_likely_cause(raw, tmp_path):
    """Kedro loads the tokenized data, then its fingerprint: a split run in between (another salt, other
    rows) has the old data checked against the new record. The refusal names that likely cause and its fix
    (wait for the split, run the command again), not only files edited or copied by hand."""
    import datasets

    from fastlm.corpus.fingerprint import check_tokenized

    def split(salt: str):
        params = {**PARAMS, "text_column": "body", "hash_salt": salt}
        clean, counts = nodes.clean_corpus(raw, params)
        splits, split_counts = nodes.split_corpus(clean, counts, params)
        tokenizer = nodes.build_tokenizer(splits, params, split_counts)
        return nodes.tokenize_corpus(splits, tokenizer, params, split_counts)[:2]

    tokenized, _ = split("first")
    tokenized.save_to_disk(tmp_path / "tokenized")
    read = datasets.load_from_disk(tmp_path / "tokenized")  # the train command's load of the data
    _, written_meanwhile = split("second")  # then the split's new fingerprint, read next
    with pytest.raises(InputDataError) as error:
        check_tokenized(written_meanwhile, read, where="data/05_model_input/tokenized_corpus")
    said = str(error.value)
    assert "\n" not in said and "split (`kedro run --pipeline=split`) ran while this command read" in said, (
        said
    )
    assert "wait for it to finish, then run this command again" in said, said


def test_tokenizer_training_texts_are_hash_selected_whatever_the_row_order(raw):
    """split.tokenizer.training_samples below the train rows: the BPE learns from the same texts (and so is
    the same tokenizer) however the raw file's rows are ordered, as the splits are."""
    params = {**PARAMS, "text_column": "body", "tokenizer": {"vocab_size": 400, "training_samples": 40}}
    shuffled = raw.sample(frac=1.0, random_state=3).reset_index(drop=True)
    shuffled.attrs = raw.attrs
    built = []
    for frame in (raw, shuffled):
        clean, counts = nodes.clean_corpus(frame, params)
        splits, split_counts = nodes.split_corpus(clean, counts, params)
        assert (splits["split"] == "train").sum() > 40  # the cap chooses among the train rows
        built.append(nodes.build_tokenizer(splits, params, split_counts))
    first, second = (tokenizer.backend_tokenizer.to_str() for tokenizer in built)
    assert first == second


def test_the_bpe_line_counts_the_train_rows_it_was_trained_on(caplog):
    """Prompt/response data with `split.tokenizer.training_samples=10`: the BPE trains on 10 train rows (their
    prompts and their responses). The line said "Trained a byte-level BPE on 20 train texts", twice the
    parameter's cap and twice the rows; it counts the rows, as the parameter and the split's counts do."""
    rows = 30
    splits = pd.DataFrame(
        {
            "prompt": [f"question {i} about the river and the stone" for i in range(rows)],
            "response": [f"answer {i} about the cloud" for i in range(rows)],
            "split": pd.Categorical(["train"] * rows, nodes.SPLITS),
        }
    )
    params = {
        **PARAMS,
        "prompt_column": "q",
        "response_column": "a",
        "tokenizer": {"vocab_size": 300, "training_samples": 10},
    }
    caplog.set_level("INFO", logger="fastlm")
    nodes.build_tokenizer(splits, params)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Trained a byte-level BPE")]
    assert len(said) == 1 and "on 10 train rows (their prompts and responses)" in said[0], said


def test_a_bpe_smaller_than_the_vocab_size_asked_says_why(caplog):
    """`split.tokenizer.vocab_size: 128000` on a few thousand reviews learns a fraction of it; the line said
    only the count learned, and users read the model's smaller embedding as a fault. It says what was asked
    and why it stopped."""
    from fastlm.corpus.tokenizer_source import train_bpe_tokenizer

    caplog.set_level("INFO", logger="fastlm")
    texts = [f"question {i} about the river and the stone" for i in range(30)]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=128_000, min_frequency=2, model_max_length=64)
    said = [r.getMessage() for r in caplog.records if "split.tokenizer.vocab_size asks" in r.getMessage()]
    assert len(said) == 1 and f"learned {len(tokenizer)} of the 128000 tokens" in said[0], said
    assert "split.tokenizer.min_frequency" in said[0]
    caplog.clear()
    train_bpe_tokenizer(texts, vocab_size=260, min_frequency=2, model_max_length=64)
    assert not [r for r in caplog.records if "vocab_size asks" in r.getMessage()]


# A CSV cell is text as written: answers that are numbers alone, as math word problems have them.
WRITTEN_ANSWERS = ["42", "1e3", "007", "-3.50", "0", "12", "1000", "2.0", "99", "5"]


def _read_raw(path):
    from fastlm.datasets import TextCorpusDataset

    return TextCorpusDataset(str(path)).load()


def test_a_csv_answer_column_of_numbers_alone_splits_as_the_file_writes_it(tmp_path):
    """Math word problems whose answers are numbers (42, 1e3, 007): pandas read the answer column as numbers,
    every row was dropped as non_string and the split refused for no data; a column mixing words and numbers
    kept "007" as text, so the same answer trained from one file and not from another. A cell is the text
    the file writes, as predict reads a prompt column of numbers."""
    questions = [f"How much is item {i} in the ledger?" for i in range(40)]
    answers = [WRITTEN_ANSWERS[i % len(WRITTEN_ANSWERS)] for i in range(40)]
    pd.DataFrame({"question": questions + ["What is left?"], "answer": answers + [""]}).to_csv(
        tmp_path / "numbers.csv", index=False
    )
    mixed = answers[:-1] + ["forty-two"]
    pd.DataFrame({"question": questions, "answer": mixed}).to_csv(tmp_path / "mixed.csv", index=False)
    params = {**PARAMS, "prompt_column": "question", "response_column": "answer"}
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / "numbers.csv"), params)
    assert counts["dropped"]["non_string"] == 0 and counts["dropped"]["missing"] == 1, counts["dropped"]
    assert list(clean["response"]) == answers
    splits, _ = nodes.split_corpus(clean, counts, params)
    assert sorted(splits["response"]) == sorted(answers)
    mixed_clean, _ = nodes.clean_corpus(_read_raw(tmp_path / "mixed.csv"), params)
    assert list(mixed_clean["response"][:-1]) == answers[:-1]


def test_a_tsv_text_column_of_numbers_alone_splits_as_the_file_writes_it(tmp_path):
    """A TSV whose text column holds numbers alone (years, codes) kept none of them (non_string); each is
    now the text the file writes, an empty cell still missing."""
    texts = [f"{1900 + i}" for i in range(30)] + ["007", "1e3", "3.10", "-0", ""]
    (tmp_path / "years.tsv").write_text("id\ttext\n" + "".join(f"{i}\t{t}\n" for i, t in enumerate(texts)))
    params = {**PARAMS, "text_column": "text"}
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / "years.tsv"), params)
    assert list(clean["text"]) == texts[:-1]
    assert counts["dropped"]["non_string"] == 0 and counts["dropped"]["missing"] == 1, counts["dropped"]


def test_json_numbers_where_texts_are_asked_stay_non_string(tmp_path):
    """A JSON number is no text: a JSON Lines response written as 42 (not "42") is dropped as non_string,
    counted, and a file of such rows alone refused."""
    rows = [{"q": f"question {i}", "a": i} for i in range(6)] + [{"q": "question x", "a": "42"}]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    params = {**PARAMS, "prompt_column": "q", "response_column": "a"}
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / "qa.jsonl"), params)
    assert list(clean["response"]) == ["42"] and counts["dropped"]["non_string"] == 6
    (tmp_path / "numbers.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:-1]))
    with pytest.raises(InputDataError, match="'non_string': 6"):
        nodes.clean_corpus(_read_raw(tmp_path / "numbers.jsonl"), params)


@pytest.mark.parametrize(("suffix", "encoding"), [("csv", "utf-8"), ("tsv", "utf-8"), ("csv", "cp949")])
def test_a_csv_line_of_spaces_is_a_raw_row_counted_blank(tmp_path, suffix, encoding):
    """pandas skips a line holding only spaces or tabs (skip_blank_lines): the split report counted 4,998 raw
    rows of 5,000 lines written, those rows neither kept nor dropped. Every line of the file is a raw row, one
    of white space alone dropped as whitespace_only (as a JSON Lines text of spaces); an empty line is no
    row (the trailing one of a file either), and a quoted text holding such lines stays one row. A Korean
    CP949 file (read from a UTF-8 copy in memory) likewise."""
    word = "리뷰 번호" if encoding == "cp949" else "review number"
    texts = [f"{word} {i} of the shop" for i in range(12)]
    blank = " \t " if suffix == "csv" else "  "
    body = [*texts[:4], "   ", texts[4], blank, *texts[5:], '"two lines\n   \nquoted"']
    (tmp_path / f"spaces.{suffix}").write_text("text\n" + "\n".join(body) + "\n\n", encoding=encoding)
    (tmp_path / f"plain.{suffix}").write_text("text\n" + "\n".join(texts) + "\n", encoding=encoding)
    params = {**PARAMS, "text_column": "text"}
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / f"spaces.{suffix}"), params)
    assert counts["raw_rows"] == len(body) == 15, counts
    assert counts["dropped"]["whitespace_only"] == 2 and sum(counts["dropped"].values()) == 2, counts
    assert list(clean["text"]) == [*texts, "two lines\n   \nquoted"]
    plain, plain_counts = nodes.clean_corpus(_read_raw(tmp_path / f"plain.{suffix}"), params)
    assert list(plain["text"]) == texts and plain_counts["raw_rows"] == len(texts)


def test_a_line_of_spaces_in_a_csv_of_numbers_is_one_row_read_as_written(tmp_path):
    """The cells re-read as the file writes them (a column of numbers) are the rows of the table read: a line
    of spaces is one row in both, before and after the header's blank lines alike."""
    (tmp_path / "years.csv").write_text("\n  \nyear,id\n1990,1\n  \n2001,2\n\n007,3\n", encoding="utf-8")
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / "years.csv"), {**PARAMS, "text_column": "year"})
    assert list(clean["text"]) == ["1990", "2001", "007"]
    assert counts["raw_rows"] == 4 and counts["dropped"]["whitespace_only"] == 1, counts


def test_the_character_budget_per_tokenizer_call_changes_no_byte_of_the_data(raw, monkeypatch):
    """Bounding each tokenizer call by characters (``MAX_CHARS_PER_CALL``) as well as texts changes only the
    batching: the tokenized Arrow tables and the fingerprint are the same with a budget that splits every
    batch."""
    from fastlm.corpus import tokenization

    params = {**PARAMS, "text_column": "body", "batch_size": 64}
    clean, counts = nodes.clean_corpus(raw, params)
    splits, _ = nodes.split_corpus(clean, counts, params)
    tokenizer = nodes.build_tokenizer(splits, params)
    whole, whole_fingerprint, _ = nodes.tokenize_corpus(splits, tokenizer, params)
    monkeypatch.setattr(tokenization, "MAX_CHARS_PER_CALL", 300, raising=False)
    calls = []
    chunks = tokenization.call_chunks
    monkeypatch.setattr(
        tokenization, "call_chunks", lambda *a: calls.append(chunks(*a)) or calls[-1], raising=False
    )
    cut, cut_fingerprint, _ = nodes.tokenize_corpus(splits, tokenizer, params)
    assert len(calls[0]) > -(-len(splits) // 64)  # the budget split the batches
    assert cut_fingerprint == whole_fingerprint
    assert set(cut) == set(whole)
    assert all(cut[name].data.table.equals(whole[name].data.table) for name in whole)


@pytest.mark.parametrize("name", ["lines.txt", "lines.txt.gz"])
def test_a_txt_file_splits_one_text_a_line_as_the_same_lines_in_json_lines(tmp_path, name):
    """A plain-text corpus (one text a line, as Hugging Face's ``text`` loader reads it) is raw data: each
    line a text (split at newlines alone, CRLF and a leading BOM dropped, U+2028 kept inside its line), a
    blank line counted as ``empty`` or ``whitespace_only``; the kept texts and their splits are those of the
    same lines written as JSON Lines. Was: refused as an unknown extension, though predict read .txt."""
    import gzip

    lines = [f"배송이 빨라요 {i}번째 리뷰입니다" for i in range(30)] + [
        "a line\u2028with a separator",
        "",
        "  ",
    ]
    lines += ["배송이 빨라요 3번째 리뷰입니다"]
    data = ("\ufeff" + "\r\n".join(lines) + "\r\n").encode("utf-8")
    (tmp_path / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    (tmp_path / "same.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / name), PARAMS)
    same, same_counts = nodes.clean_corpus(_read_raw(tmp_path / "same.jsonl"), PARAMS)
    assert list(clean["text"]) == list(same["text"]) == lines[:31]
    assert counts["dropped"] == same_counts["dropped"]
    assert counts["dropped"]["empty"] == 1 and counts["dropped"]["whitespace_only"] == 1
    assert counts["dropped"]["duplicate"] == 1
    splits, _ = nodes.split_corpus(clean, counts, PARAMS)
    same_splits, _ = nodes.split_corpus(same, same_counts, PARAMS)
    pd.testing.assert_frame_equal(splits, same_splits)


@pytest.mark.parametrize("ends", ["\r", "mixed"])
def test_a_txt_file_whose_lines_end_in_a_lone_cr_reads_one_text_a_line(tmp_path, ends):
    """A .txt saved with classic Mac line ends (a lone CR, as old Mac editors and Excel's "Text (Macintosh)"
    write), or a file joined from such and LF ones, holds one text a line, as Python's universal newlines
    and Hugging Face's ``text`` loader read it, and as the CSV reader reads the same lines. Was: a lone CR
    ended no line, so the whole file (or each run of such lines) became one text of many lines."""
    lines = [f"배송이 빨라요 {i}번째 리뷰입니다" for i in range(30)]
    if ends == "\r":
        data = "\r".join(lines) + "\r"
    else:
        data = "\n".join(lines[:10]) + "\r" + "\r".join(lines[10:20]) + "\r\n" + "\n".join(lines[20:]) + "\n"
    (tmp_path / "lines.txt").write_bytes(data.encode("utf-8"))
    (tmp_path / "same.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    clean, counts = nodes.clean_corpus(_read_raw(tmp_path / "lines.txt"), PARAMS)
    same, _ = nodes.clean_corpus(_read_raw(tmp_path / "same.jsonl"), PARAMS)
    assert counts["raw_rows"] == len(lines)
    assert list(clean["text"]) == list(same["text"]) == lines


def test_a_txt_file_for_another_text_column_or_for_pairs_names_its_one_column(tmp_path):
    (tmp_path / "lines.txt").write_text("one\ntwo\n", encoding="utf-8")
    for params in (
        {**PARAMS, "text_column": "body"},
        {**PARAMS, "prompt_column": "q", "response_column": "a"},
    ):
        with pytest.raises(InputDataError) as error:
            nodes.clean_corpus(_read_raw(tmp_path / "lines.txt"), params)
        assert "its columns are ['text']" in str(error.value)


def test_a_txt_file_that_is_a_table_of_tabs_is_refused_naming_tsv(tmp_path):
    """NSMC's ratings_train.txt and its like: a .txt whose every line holds the same number of tabs is a
    table, not one text a line (its header and every id and label would train as text). Refused, naming the
    .tsv it is; lines with tabs in varying numbers (code, aligned notes) are texts."""
    table = "id\tdocument\tlabel\n9976970\t아 더빙.. 진짜 짜증나네요 목소리\t0\n"
    table += "3819312\t흠...포스터보고 초딩영화줄\t1\n"
    (tmp_path / "ratings_train.txt").write_text(table, encoding="utf-8")
    from fastlm.corpus.shards import read_raw_table

    with pytest.raises(InputDataError) as error:
        read_raw_table(tmp_path / "ratings_train.txt")
    message = str(error.value)
    assert "ratings_train.txt looks like a table" in message and "2 tabs" in message, message
    assert "rename it to ratings_train.tsv" in message and "\n" not in message
    code = "def f():\n\treturn 1\nplain line\n\t\tdeeper\n"
    (tmp_path / "code.txt").write_text(code, encoding="utf-8")
    clean, _ = nodes.clean_corpus(_read_raw(tmp_path / "code.txt"), PARAMS)
    assert list(clean["text"]) == ["def f():", "return 1", "plain line", "deeper"]


def test_a_txt_file_of_json_objects_is_refused_naming_jsonl(tmp_path):
    """A JSON Lines export saved as .txt (``corpus.txt`` of ``{"text": ...}`` lines): read a line a text,
    every text would train as its JSON, keys, quotes and ``\\uXXXX`` escapes included. Refused, naming the
    .jsonl it is, for the split and for predict; a text that merely holds braces is a text."""
    from fastlm.corpus.shards import read_raw_table
    from fastlm.datasets.predict_sources import PredictSources

    rows = [{"text": f"배송이 빨라요 {i}", "label": i % 2} for i in range(5)]
    path = tmp_path / "corpus.txt"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    for read in (
        read_raw_table,
        lambda file: PredictSources(tmp_path / "m", tmp_path / "r", tmp_path / "p").read_input(str(file)),
    ):
        with pytest.raises(InputDataError) as error:
            read(path)
        message = str(error.value)
        assert "corpus.txt looks like JSON Lines" in message, message
        assert "rename it to corpus.jsonl" in message and "\n" not in message
    braces = '{braces} are fine\n{"not": json\n'
    (tmp_path / "braces.txt").write_text(braces, encoding="utf-8")
    clean, _ = nodes.clean_corpus(_read_raw(tmp_path / "braces.txt"), PARAMS)
    assert list(clean["text"]) == ["{braces} are fine", '{"not": json']


def test_a_response_holding_a_special_tokens_text_trains_it_as_text(sample_texts):
    """A prompt/response pair whose response writes ``<|endoftext|>`` out (an answer quoting a model's
    output) trained the EOS token in the middle of the answer: the model learned to stop there. The
    response is text, its one EOS the one appended; a prompt template's own tokens stay tokens."""
    params = {**PARAMS, "max_length": 200, "prompt_column": "q", "response_column": "a"}
    marker = "<|endoftext|>"
    frame = pd.DataFrame(
        {
            "q": [f"question {i}: {text}" for i, text in enumerate(sample_texts[:80])],
            "a": sample_texts[80:160],
        }
    )
    frame.loc[:39, "a"] = [f"{answer} {marker} then more" for answer in frame["a"][:40]]
    frame.attrs["source_path"] = "data/01_raw/pairs.jsonl"
    clean, counts = nodes.clean_corpus(frame, params)
    splits, split_counts = nodes.split_corpus(clean, counts, params)
    tokenizer = nodes.build_tokenizer(splits, params)
    assert tokenizer.eos_token == marker
    tokenized, fingerprint, _ = nodes.tokenize_corpus(splits, tokenizer, params)
    eos = tokenizer.eos_token_id
    for part in tokenized.values():
        for ids, prompt_length in zip(part["input_ids"], part["prompt_length"], strict=True):
            assert ids[-1] == eos and eos not in ids[prompt_length:-1]
    assert fingerprint["params"]["data_format"]["response_special_tokens"] == "as_text"


def test_the_split_says_once_how_many_pairs_it_grouped_by_a_shared_prompt(sample_texts, caplog):
    """Pairs sharing a prompt are split as one (``split_steps.split_rows``): one line says how many, the
    split counts and the split report hold it, and the splits are recorded as so made: splits made before
    (by an older fastlm: their counts record nothing of it) are refused by a run of the later nodes, and data
    tokenized before is stale, each saying why."""
    import logging

    from fastlm.corpus.config import parse_split_params
    from fastlm.corpus.fingerprint import make_fingerprint
    from fastlm.errors import ConfigError, StaleDataError

    params = {**PARAMS, "max_length": 64, "prompt_column": "dialogue", "response_column": "summary"}
    dialogues = [f"대화 {i}: {text}" for i, text in enumerate(sample_texts[:60])]
    rows = [(dialogue, f"요약 {k}: {dialogue[:30]}") for dialogue in dialogues[:40] for k in range(3)]
    rows += [(dialogue, f"요약: {dialogue[:30]}") for dialogue in dialogues[40:]]
    frame = pd.DataFrame(rows, columns=["dialogue", "summary"])
    frame.attrs["source_path"] = "data/01_raw/dialogsum.jsonl"
    clean, counts = nodes.clean_corpus(frame, params)
    with caplog.at_level(logging.INFO):
        splits, split_counts = nodes.split_corpus(clean, counts, params)
    said = [record.getMessage() for record in caplog.records if "share their prompt" in record.getMessage()]
    assert len(said) == 1, caplog.text
    assert said[0].startswith("120 of 140 pairs share their prompt with another pair (40 prompts)"), said
    assert split_counts["grouped_by_prompt"] == {"rows": 120, "prompts": 40}
    assert splits.groupby("prompt")["split"].nunique().max() == 1
    tokenizer = nodes.build_tokenizer(splits, params, split_counts)
    _, fingerprint, stats = nodes.tokenize_corpus(splits, tokenizer, params, split_counts)
    report, _ = nodes.report_split(split_counts, stats, fingerprint)
    assert report["grouped_by_prompt"] == {"rows": 120, "prompts": 40}
    assert fingerprint["params"]["data_format"]["split_groups"] == "shared_prompt"
    older = {**split_counts, "made_with": dict(split_counts["made_with"])}
    del older["made_with"]["split_groups"]
    with pytest.raises(ConfigError, match="split by an older fastlm, which could put pairs sharing a prompt"):
        nodes.tokenize_corpus(splits, tokenizer, params, older)
    stale = json.loads(json.dumps(fingerprint))
    del stale["params"]["data_format"]["split_groups"]
    stale["fingerprint"] = make_fingerprint(
        tokenizer,
        64,
        **{"data_format": stale["params"]["data_format"], "selection": stale["params"]["selection"]},
    )["fingerprint"]
    with pytest.raises(StaleDataError) as error:  # train: the data an older fastlm split
        check_fresh(
            stale, tokenizer, parse_split_params(params), where="data/05_model_input/tokenized_corpus"
        )
    assert "split by an older fastlm, which could put pairs sharing a prompt in two splits" in str(
        error.value
    )
    assert "kedro run --pipeline=split" in str(error.value)
    plain = nodes.split_corpus(*nodes.clean_corpus(pd.DataFrame({"text": sample_texts[:50]}), PARAMS), PARAMS)
    assert "grouped_by_prompt" not in plain[1]
    # two prompts split as two groups cannot fill three splits: the refusal says why
    few = pd.DataFrame(
        {"dialogue": [f"대화 {i % 2}" for i in range(60)], "summary": [f"요약 {i}" for i in range(60)]}
    )
    with pytest.raises(
        InputDataError, match="60 of them lie in 2 groups sharing a prompt, each group in one split"
    ):
        nodes.split_corpus(*nodes.clean_corpus(few, params), params)
