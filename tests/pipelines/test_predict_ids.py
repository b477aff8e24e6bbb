"""`kedro run --pipeline=predict` on a model trained on pre-tokenized ids (``split.pretokenized``): its
tokenizer reads any word that is not one of its ids as its EOS id, so an input row whose ids the model
cannot be asked as given (an id past its vocabulary, a negative one, a word that is no whole number, the EOS
id that ends every training sample) is refused with its reason, never asked as another sequence; an input
shaped like the training data (the training's ``split.ids_column`` of id lists) is read as it is."""

import json
import shutil

import pandas as pd
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import data_format_params, make_fingerprint
from fastlm.corpus.pretokenized import id_tokenizer
from fastlm.errors import ConfigError, InputDataError, find_user_error
from fastlm.reporting.params import check_id_prompts
from tests.support.project import run_pipeline
from tests.support.tiny_llama import save_tiny_llama

pytestmark = [pytest.mark.e2e]
CPU = {"runtime": {"device": "cpu", "precision": "fp32"}}
VOCAB, EOS = 40, 39
GOOD = ["3 17 5", "4 4 12 0"]
BAD = {  # a row of space-separated ids, and the reason it is refused
    "3 40 5": "unknown_id",  # past the vocabulary: read as EOS
    "-1 4": "unknown_id",  # negative: read as EOS
    "12a 4": "malformed_ids",  # no whole number: read as EOS
    "3.5 4": "malformed_ids",
    "3 39 5": "eos_id",  # EOS inside a row: the model learned it ends a sample
    "007 4": "malformed_ids",  # leading zeros: not how the split writes an id, read as EOS
}


@pytest.fixture(scope="module")
def id_model(tmp_path_factory):
    tokenizer = id_tokenizer(VOCAB, eos_id=EOS, pad_id=EOS, model_max_length=64)
    return save_tiny_llama(tmp_path_factory.mktemp("ids_model"), tokenizer, hidden_size=32, layers=2)


@pytest.fixture
def project(kedro_project, id_model):
    """The project's model folder as the train pipeline writes it after pre-tokenized data (its
    ``training_data.json`` says so)."""
    folder = kedro_project / "data/06_models/model"
    shutil.copytree(id_model, folder)
    split = parse_split_params({"pretokenized": True, "vocab_size": VOCAB, "max_length": 48})
    stored = make_fingerprint(
        AutoTokenizer.from_pretrained(folder), 48, data_format=data_format_params(split, None)
    )
    record = {"fingerprint": stored["fingerprint"], "data_format": stored["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps({**record, "max_length": 48}))
    return kedro_project


def _predicted(project, **predict):
    run_pipeline(project, "predict", {"predict": {"max_new_tokens": 5, **predict}, "train": CPU})
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False, dtype=str)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    return table, summary


def _alone(folder, rows: list[list[int]], max_new_tokens: int = 5) -> list[str]:
    """One greedy ``model.generate`` per row of ids, decoded as predict decodes a continuation."""
    model, tokenizer = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    texts = []
    for ids in rows:
        tensor = torch.tensor([ids])
        out = model.generate(
            tensor,
            attention_mask=torch.ones_like(tensor),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=EOS,
        )
        texts.append(tokenizer.decode(out[0, tensor.shape[1] :], skip_special_tokens=True))
    return texts


def _write_jsonl(path, rows: list[dict]):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_rows_of_ids_the_model_cannot_be_asked_as_given_are_refused_with_their_reason(project):
    """A row with an id past the vocabulary, a negative id, a word that is no whole number or the EOS id was
    asked as another sequence (each such word read as the EOS id), without a word. Each is refused with its
    reason; the good rows are predicted as the model continues their ids."""
    inputs = [GOOD[0], *BAD, GOOD[1]]
    _write_jsonl(project / "data/01_raw/ids.jsonl", [{"text": text} for text in inputs])
    table, summary = _predicted(project, input="data/01_raw/ids.jsonl", text_column="text")
    assert table["input"].tolist() == inputs
    reasons = [reason.split(" ")[0] for reason in table["refused"]]
    assert reasons == ["", *BAD.values(), ""], table["refused"].tolist()
    assert "40" in table["refused"].iloc[1] and str(VOCAB) in table["refused"].iloc[1]
    assert "-1" in table["refused"].iloc[2] and "12a" in table["refused"].iloc[3]
    assert "3.5" in table["refused"].iloc[4] and str(EOS) in table["refused"].iloc[5]
    assert "'007'" in table["refused"].iloc[6]
    good = table[table["refused"] == ""]
    folder = project / "data/06_models/model"
    assert good["prediction"].tolist() == _alone(folder, [[3, 17, 5], [4, 4, 12, 0]])
    assert good["input_tokens"].tolist() == ["3", "4"]
    assert summary["refused_by_reason"] == {"unknown_id": 2, "malformed_ids": 3, "eos_id": 1}
    assert summary["predicted"] == 2
    assert summary["input_format"] == "ids" and summary["input_column"] == "text"  # was: "text"
    check_id_prompts(GOOD, VOCAB)  # the report's prompts: the same rows taken and refused
    for text, reason in BAD.items():
        if reason != "eos_id":  # a report prompt may start from EOS ("" is EOS alone)
            with pytest.raises(ConfigError, match="is not an id of the pre-tokenized data"):
                check_id_prompts([text], VOCAB)


def test_an_input_of_ids_none_of_which_can_be_asked_is_refused_in_one_line(project):
    """Every row holds an id the model cannot be asked: refused in one line naming the reasons and what a
    row must hold (the model's ids), nothing written."""
    _write_jsonl(project / "data/01_raw/bad.jsonl", [{"text": "3 40"}, {"text": "7 x"}])
    before = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    with pytest.raises(Exception) as caught:
        _predicted(project, input="data/01_raw/bad.jsonl", text_column="text")
    found = find_user_error(caught.value)
    assert isinstance(found, InputDataError), caught.value
    message = str(found)
    assert (
        "none of the 2 rows" in message and "'unknown_id': 1" in message and "'malformed_ids': 1" in message
    )
    assert f"0 .. {VOCAB - 1}" in message.split("Fix:")[1] and "\n" not in message, message
    assert {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()} == before


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_an_input_shaped_like_the_training_data_is_read_from_its_ids_column(project, suffix):
    """A file of the training's ``split.ids_column`` (``ids``) holding id lists, as the split reads them,
    with no column named: it was refused (no column 'text'; named, each list was refused as no text). Its
    lists are read with the checks of space-separated ids, shown space-joined and continued as the model
    continues their ids."""
    lists = [[3, 17, 5], [3, 40], [4, 4, 12, 0], [3, EOS], []]
    rows = [{"ids": ids, "key": f"k{i}"} for i, ids in enumerate(lists)]
    path = project / f"data/01_raw/new_ids{suffix}"
    if suffix == ".jsonl":
        _write_jsonl(path, rows)
    else:
        pd.DataFrame(rows).to_parquet(path)
    table, summary = _predicted(project, input=str(path.relative_to(project)), id_column="key")
    assert summary["input_column"] == "ids" and summary["input_format"] == "ids"
    assert table["input"].tolist() == ["3 17 5", "3 40", "4 4 12 0", f"3 {EOS}", ""]
    reasons = [reason.split(" ")[0] for reason in table["refused"]]
    assert reasons == ["", "unknown_id", "", "eos_id", "empty"], table["refused"].tolist()
    folder = project / "data/06_models/model"
    good = table[table["refused"] == ""]
    assert good["prediction"].tolist() == _alone(folder, [[3, 17, 5], [4, 4, 12, 0]])
    assert good["id"].tolist() == ["k0", "k2"]


@pytest.mark.parametrize("huge", [2**63 + 5, 2**64 + 5, -(2**63) - 5])
@pytest.mark.parametrize("words", [True, False])
def test_an_id_beyond_64_bits_in_a_jsonl_input_is_a_refused_row(tmp_path, huge, words):
    """A JSON Lines input of ids where one id, and one row's id, do not fit 64 bits: with a row of words
    (Arrow's reader gives way to pandas') the file was refused with pandas' ``Value is too big! at position
    <n>`` (a byte offset); with lists alone Arrow read every id and row id as a float (the row ids 1.0, the
    big ones rounded in the reason and the table). It reads as written: that row is refused with the reason
    its ids give, the others are asked as their ids, every row keeps its id."""
    from fastlm.corpus.pretokenized import input_ids
    from fastlm.corpus.readers import read_text_table
    from fastlm.datasets.predict_sources import PARAMETER
    from fastlm.reporting.predict_inputs import IdVocabulary, id_input_rows

    last = "4 4 12" if words else [4, 4, 12]
    rows = [{"id": 1, "ids": [3, 17, 5]}, {"id": huge, "ids": [4, huge]}, {"id": 3, "ids": last}]
    path = _write_jsonl(tmp_path / "ids.jsonl", rows)
    found = id_input_rows(
        read_text_table(path, PARAMETER),
        column=("predict.text_column", "ids"),
        vocabulary=IdVocabulary(vocab_size=VOCAB, eos_id=EOS),
        id_column="id",
        limit=None,
        too_long="truncate",
        source=str(path),
    )
    expected = [input_ids(row["ids"], vocab_size=VOCAB, eos_id=EOS) for row in rows]
    assert found["refused"].tolist() == [reason for _, reason in expected]
    assert found["ids"].tolist() == [ids for ids, _ in expected]
    assert [str(value) for value in found["id"]] == [str(row["id"]) for row in rows]
    assert str(huge) in found["refused"].iloc[1], found["refused"].iloc[1]
