"""`kedro run --pipeline=predict` on a tiny Llama-style model in a throw-away project: one prediction per
input row in input order, refused rows kept and reported, greedy predictions equal to a per-row
``model.generate``, bad parameters refused in one line with nothing written, atomic outputs, an interrupted
run continued."""

import gzip
import json
import logging
import shutil

import kedro.framework.project  # noqa: F401 (configures logging: see below)
import pandas as pd
import pytest
import torch
from kedro.io import DatasetError
from transformers import AutoModelForCausalLM, AutoTokenizer

from fastlm.corpus.config import parse_split_params
from fastlm.corpus.fingerprint import data_format_params, make_fingerprint
from fastlm.corpus.prompts import prompt_token_ids, render_prompt
from fastlm.datasets.atomic_file import AtomicCSVDataset, AtomicJSONDataset
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.errors import ConfigError, InputDataError, StaleDataError, find_user_error
from fastlm.reporting.predict_inputs import input_rows
from fastlm.reporting.predictions import (
    PredictionJob,
    PredictionParts,
    check_prediction_pair,
    predict_rows,
)
from tests.support.e2e import own_experiment
from tests.support.project import catalog_dataset, run_pipeline
from tests.support.tiny_llama import (
    CHAT_TEMPLATE,
    llama_style_tokenizer,
    rewrite_weights_keeping_time,
    save_tiny_llama,
)
from tests.support.tiny_seq2seq import SMALL_BART_LAYERS

# kernels: batched left-padded generation against one row at a time (as
# tests/engine/evaluate/test_generation.py)
pytestmark = [pytest.mark.e2e, pytest.mark.kernels]
# kedro.framework.project configures logging when first imported (its dictConfig replaces the root logger's
# handlers): imported with this module, before pytest attaches caplog's handler, so that a test run alone
# captures the records of its first run too
CPU = {"runtime": {"device": "cpu", "precision": "fp32"}}
TEMPLATE = "{prompt}\n\n### Response:\n"
DIALOGUES = [
    "Mina: Can I book a table?\nNoah: Sure, for how many?",
    "Noah: hi",
    "Mina: The battery died again.",
    "Noah: Could you send me the report later?\nMina: Sure, I'll send it tonight.\nNoah: Thanks!",
    "Mina: ok",
    "Noah: 배송 문의 드립니다",
    "Mina: Any preference for the menu?\nNoah: vegetarian set",
]
BAD = ["", "   ", None]
SYSTEM, USER = {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Can I book a table?"}
MULTI_TURN = [USER, {"role": "assistant", "content": "How many?"}, {"role": "user", "content": "Two"}]
CHATS = [  # rows of a messages column, and the turns the model is given for the usable ones
    ([USER], [USER]),
    (  # the last assistant turn is the reference answer: not given
        [
            SYSTEM,
            {"role": "user", "content": " The battery died again. "},
            {"role": "assistant", "content": "Sorry"},
        ],
        [SYSTEM, {"role": "user", "content": "The battery died again."}],
    ),
    (MULTI_TURN, MULTI_TURN),  # ends with a user turn: all of it
    ("Noah: hi", "malformed_messages (not a list of {role, content} turns)"),
    ([{"role": "assistant", "content": "ok"}], "malformed_messages (no user turn)"),
    ([{"role": "user", "content": "   "}], "whitespace_only"),
    (None, "missing"),
]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory, sample_texts):
    tokenizer = llama_style_tokenizer(sample_texts + DIALOGUES, vocab_size=300)
    return save_tiny_llama(tmp_path_factory.mktemp("model"), tokenizer, hidden_size=32, layers=2)


@pytest.fixture
def project(kedro_project, model_folder):
    shutil.copytree(model_folder, kedro_project / "data/06_models/model")
    rows = [{"dialogue": text, "key": f"k{i}"} for i, text in enumerate(DIALOGUES[:3] + BAD + DIALOGUES[3:])]
    (kedro_project / "data/01_raw/inputs.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return kedro_project


def _run(project, **predict):
    return run_pipeline(project, "predict", {"predict": predict, "train": CPU})


def _alone(folder, prompts, max_new_tokens, model=None):
    """The usual way: one ``model.generate`` per row, in file order, greedy."""
    model = model if model is not None else AutoModelForCausalLM.from_pretrained(folder)
    tokenizer, texts = AutoTokenizer.from_pretrained(folder), []
    for prompt in prompts:
        ids = torch.tensor([prompt_token_ids(tokenizer, prompt)])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.eos_token_id,
        )
        texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip())
    return texts


def test_predictions_in_input_order_refused_rows_reported_greedy_equal_per_row_generate(
    project, model_folder, mlflow_uri
):
    own_experiment(project, "predict-e2e")
    _run(
        project,
        input="data/01_raw/inputs.jsonl",
        prompt_column="dialogue",
        id_column="key",
        max_new_tokens=8,
        batch_size=2,
    )
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    order = DIALOGUES[:3] + ["", "   ", ""] + DIALOGUES[3:]
    assert table["id"].tolist() == [f"k{i}" for i in range(len(order))] and table["input"].tolist() == order
    assert table["refused"].tolist() == [""] * 3 + ["empty", "whitespace_only", "missing"] + [""] * 4
    good = table[table["refused"] == ""]
    assert good["prediction"].tolist() == _alone(
        model_folder, [render_prompt(t, TEMPLATE) for t in good["input"]], 8
    )
    assert (good["new_tokens"] > 0).all() and (table.loc[table["refused"] != "", "prediction"] == "").all()
    assert set(table["decoding"]) == {"greedy, max_new_tokens=8"}
    assert summary["rows"] == 10 and summary["predicted"] == 7 and summary["refused"] == 3
    assert summary["refused_by_reason"] == {"empty": 1, "whitespace_only": 1, "missing": 1}
    assert [r["id"] for r in summary["refused_rows"]] == ["k3", "k4", "k5"]
    assert summary["samples_per_s"] > 0 and summary["generated_tokens_per_s"] > 0
    import mlflow  # the predict run keeps its summary (which model, what was refused) beside its parameters

    mlflow.set_tracking_uri(mlflow_uri)
    run = mlflow.search_runs(experiment_names=["predict-e2e"]).iloc[0]
    logged = {item.path for item in mlflow.MlflowClient().list_artifacts(run["run_id"], "predict")}
    assert logged == {"predict/predict_summary.json"}, logged
    assert summary["model"] == "data/06_models/model" and summary["precision"] == "fp32"
    assert summary["decoding_settings"]["num_beams"] == 1 and summary["truncated"] == 0


def test_chat_messages_are_rendered_with_the_training_chat_template_up_to_the_last_user_turn(project):
    folder = project / "data/06_models/model"
    tokenizer, fingerprint = _chat_model(project)
    (project / "data/05_model_input/tokenized_corpus_fingerprint.json").write_text(json.dumps(fingerprint))
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"messages": chat}) + "\n" for chat, _ in CHATS), encoding="utf-8"
    )
    _run(project, input="data/01_raw/chats.jsonl", max_new_tokens=6)  # no column named: the training's
    csv, summary_file = (
        project / "data/07_model_output/predictions.csv",
        project / "data/08_reporting/predict_summary.json",
    )
    table, summary = pd.read_csv(csv, keep_default_na=False), check_prediction_pair(csv, summary_file)
    given = [turns for _, turns in CHATS if isinstance(turns, list)]
    assert table["refused"].tolist() == [""] * len(given) + [r for _, r in CHATS if isinstance(r, str)]
    prompts = [tokenizer.apply_chat_template(t, tokenize=False, add_generation_prompt=True) for t in given]
    assert all(p.endswith("<|assistant|>") for p in prompts) and "Sorry" not in prompts[1]
    assert table["prediction"].tolist()[: len(given)] == _alone(folder, prompts, 6)
    assert table["input_tokens"].tolist()[: len(given)] == [
        len(prompt_token_ids(tokenizer, p)) for p in prompts
    ]
    assert json.loads(table["input"].iloc[1]) == CHATS[1][0]  # the row as given, reference included
    assert summary["input_column"] == "messages" and summary["input_format"] == "messages"
    assert summary["chat_template_sha256"] == fingerprint["params"]["data_format"]["chat_template_sha256"]
    assert summary["refused_by_reason"] == {"malformed_messages": 2, "whitespace_only": 1, "missing": 1}
    tokenizer.chat_template = CHAT_TEMPLATE.replace("<|assistant|>", "<|bot|>")  # edited since training
    tokenizer.save_pretrained(folder)
    with pytest.raises(Exception) as caught:
        _run(project, input="data/01_raw/chats.jsonl", max_new_tokens=6)
    found = find_user_error(caught.value)
    assert isinstance(found, StaleDataError) and "is not the one its training data was rendered with" in str(
        found
    )
    assert "\n" not in str(found) and check_prediction_pair(csv, summary_file) == summary  # nothing rewritten


def test_chat_messages_are_rendered_as_the_models_own_training_data_not_the_projects_latest_split(project):
    """A model folder written by the train pipeline records how its training data was rendered
    (``training_data.json``): predict follows it, not the project's split fingerprint, which a later split
    may have changed (here: the model was trained on ``role: content`` lines, the project re-split with the
    tokenizer's chat template, which the tokenizer still has)."""
    from fastlm.corpus.prompts import render_messages

    folder = project / "data/06_models/model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    now = make_fingerprint(
        tokenizer, 64, data_format=data_format_params(parse_split_params({"messages_column": "m"}), tokenizer)
    )
    (project / "data/05_model_input/tokenized_corpus_fingerprint.json").write_text(json.dumps(now))
    lines = parse_split_params({"messages_column": "m", "chat_template": False})
    then = make_fingerprint(tokenizer, 64, data_format=data_format_params(lines, tokenizer))
    record = {"fingerprint": then["fingerprint"], "data_format": then["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps(record))
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"m": chat}) + "\n" for chat, _ in CHATS[:3]), encoding="utf-8"
    )
    _run(project, input="data/01_raw/chats.jsonl", max_new_tokens=6)
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    prompts = [render_messages(turns, lines.prompt_template) for _, turns in CHATS[:3]]
    assert "<|assistant|>" not in "".join(prompts)  # role: content lines, not the template's
    assert table["prediction"].tolist() == _alone(folder, prompts, 6)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["input_column"] == "m" and summary["chat_template_sha256"] is None


def test_chat_template_kwargs_of_the_training_render_the_prompts_and_another_set_is_refused(
    project, sample_texts
):
    """A Qwen3 fine-tune trained in non-thinking mode (``split.chat_template_kwargs: {enable_thinking:
    false}``): predict renders each chat as the split did, the template's empty think block included, from
    the model's own record; ``predict.chat_template_kwargs`` other than the training's is refused in one line
    (nothing written); a model from elsewhere takes the ones given."""
    from tests.support.chat_templates import qwen3_style_tokenizer

    folder = project / "data/06_models/model"
    shutil.rmtree(folder)
    tokenizer = qwen3_style_tokenizer(sample_texts + DIALOGUES, vocab_size=300)
    save_tiny_llama(folder, tokenizer, hidden_size=32, layers=2)
    split = parse_split_params(
        {"messages_column": "messages", "chat_template_kwargs": {"enable_thinking": False}}
    )
    fingerprint = make_fingerprint(tokenizer, 64, data_format=data_format_params(split, tokenizer))
    record = {"fingerprint": fingerprint["fingerprint"], "data_format": fingerprint["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps(record))
    given = [turns for _, turns in CHATS[:3]]
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"messages": chat}) + "\n" for chat, _ in CHATS[:3]), encoding="utf-8"
    )
    _run(project, input="data/01_raw/chats.jsonl", max_new_tokens=6)
    csv = project / "data/07_model_output/predictions.csv"
    table = pd.read_csv(csv, keep_default_na=False)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    from fastlm.corpus.prompts import prompt_frame

    trained, _ = prompt_frame(  # what the split made of the same chats (answered, as training rows are)
        pd.DataFrame({"messages": [[*turns, {"role": "assistant", "content": "ok"}] for turns in given]}),
        split,
        tokenizer,
    )
    prompts = trained["prompt"].tolist()
    assert all(p.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for p in prompts)
    assert table["input_tokens"].tolist() == [len(prompt_token_ids(tokenizer, p)) for p in prompts]
    assert table["prediction"].tolist() == _alone(folder, prompts, 6)
    assert summary["chat_template_kwargs"] == {"enable_thinking": False}
    before = csv.read_bytes()
    with pytest.raises(Exception) as caught:
        _run(
            project,
            input="data/01_raw/chats.jsonl",
            max_new_tokens=6,
            chat_template_kwargs={"enable_thinking": True},
        )
    found = find_user_error(caught.value)
    assert isinstance(found, ConfigError) and "\n" not in str(found)
    assert 'predict.chat_template_kwargs {"enable_thinking": true} is not what' in str(found)
    assert 'with {"enable_thinking": false}' in str(found) and csv.read_bytes() == before
    _run(  # the training's own, given again: the same predictions
        project,
        input="data/01_raw/chats.jsonl",
        max_new_tokens=6,
        chat_template_kwargs={"enable_thinking": False},
    )
    assert pd.read_csv(csv, keep_default_na=False)["prediction"].tolist() == table["prediction"].tolist()
    (folder / "training_data.json").unlink()  # a model from elsewhere: the variables given, or none
    _run(
        project,
        input="data/01_raw/chats.jsonl",
        max_new_tokens=6,
        messages_column="messages",
        chat_template_kwargs={"enable_thinking": False},
    )
    assert pd.read_csv(csv, keep_default_na=False)["input_tokens"].tolist() == table["input_tokens"].tolist()
    _run(project, input="data/01_raw/chats.jsonl", max_new_tokens=6, messages_column="messages")
    plain = [tokenizer.apply_chat_template(t, tokenize=False, add_generation_prompt=True) for t in given]
    assert pd.read_csv(csv, keep_default_na=False)["input_tokens"].tolist() == [
        len(prompt_token_ids(tokenizer, p)) for p in plain
    ]


def test_txt_input_a_run_name_as_model_and_too_long_rows_refused_or_truncated(project, model_folder):
    """... and the summary names the training that made the model (its id, from the folder's
    training_data.json, and its run's name, from that training's summary): the folder alone said nothing
    once later trainings had run."""
    shutil.copytree(model_folder, project / "data/06_models/runs/first/model")
    record = {"fingerprint": None, "data_format": None, "max_length": 48, "training_id": "t-first"}
    (project / "data/06_models/runs/first/model/training_data.json").write_text(json.dumps(record))
    (project / "data/08_reporting/runs/first").mkdir(parents=True)
    first = {"run_name": "first", "training_id": "t-first"}
    (project / "data/08_reporting/runs/first/train_summary.json").write_text(json.dumps(first))
    with gzip.open(project / "data/01_raw/lines.txt.gz", "wt", encoding="utf-8") as handle:
        handle.write("The battery\n\nshort\n" + "word " * 40 + "\n")
    _run(
        project,
        input="data/01_raw/lines.txt.gz",
        model="first",
        max_new_tokens=4,
        max_input_tokens=12,
        too_long="refuse",
    )
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert table["id"].tolist() == [0, 1, 2, 3] and table["refused"].iloc[1] == "empty"
    assert table["refused"].iloc[3].startswith("too_long (") and summary["refused_by_reason"]["too_long"] == 1
    assert summary["model"].endswith("runs/first/model")
    assert summary["training_id"] == "t-first" and summary["training_run"] == "first", summary
    _run(project, input="data/01_raw/lines.txt.gz", model="first", max_new_tokens=4, max_input_tokens=12)
    truncated = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert truncated["refused"].tolist() == ["", "empty", "", ""] and truncated["input_tokens"].iloc[3] == 12
    assert json.loads((project / "data/08_reporting/predict_summary.json").read_text())["truncated"] == 1


@pytest.mark.parametrize(
    ("predict", "error", "message"),
    [
        ({}, ConfigError, "parameter predict.input is not set"),
        (
            {"input": "data/01_raw/nope.jsonl"},
            InputDataError,
            "predict.input data/01_raw/nope.jsonl does not exist",
        ),
        (
            {"input": "data/01_raw/inputs.jsonl", "prompt_column": "dialog"},
            InputDataError,
            "has no column 'dialog' (predict.prompt_column)",
        ),
        ({"input": "data/01_raw/inputs.jsonl", "top_p": 1.5}, ConfigError, "predict.top_p"),
        ({"input": "data/01_raw/inputs.jsonl", "num_beams": 0}, ConfigError, "predict.num_beams"),
        (
            {"input": "data/01_raw/inputs.jsonl", "temperatur": 0.5},
            ConfigError,
            "did you mean predict.temperature",
        ),
        (
            {"input": "data/01_raw/inputs.jsonl", "model": "no-such-run"},
            InputDataError,
            "predict.model 'no-such-run' is neither a model folder",
        ),
        (
            {"input": "data/01_raw/inputs.jsonl", "messages_column": "dialogue", "prompt_column": "dialogue"},
            ConfigError,
            "predict.messages_column and predict.prompt_column are both set",
        ),
        (
            {"input": "data/01_raw/inputs.jsonl", "messages_column": "dialogue"},
            InputDataError,
            "has no chat template to render the messages with",
        ),
        (  # 500 + 64 of the model's 512 positions: generated past its last position, no word said
            {"input": "data/01_raw/inputs.jsonl", "max_input_tokens": 500, "max_new_tokens": 64},
            ConfigError,
            "predict.max_input_tokens = 500 and predict.max_new_tokens = 64 need 564 positions",
        ),
        # torch reads -1 as 2**64 - 1, and seed + chunk made seed -1's second chunk sample as seed 0's first
        (
            {"input": "data/01_raw/inputs.jsonl", "prompt_column": "dialogue", "seed": -1},
            ConfigError,
            "predict.seed = -1 is invalid",
        ),
        # a seed past 64 bits (or one that seed + chunk takes past it): a ValueError traceback from torch
        (
            {"input": "data/01_raw/inputs.jsonl", "prompt_column": "dialogue", "seed": 2**64},
            ConfigError,
            "predict.seed = 18446744073709551616",
        ),
        # vLLM's and the OpenAI API's greedy decoding: refused with pydantic's "greater than 0" alone
        (
            {"input": "data/01_raw/inputs.jsonl", "prompt_column": "dialogue", "temperature": 0},
            ConfigError,
            "predict.temperature = 0 is invalid: a temperature must be above 0 (a temperature of 0, greedy "
            "decoding in vLLM and the OpenAI API, is do_sample: false here, the default)",
        ),
    ],
    ids=[
        "missing_input",
        "unknown_file",
        "unknown_column",
        "top_p",
        "num_beams",
        "misspelled",
        "unknown_model",
        "two_input_columns",
        "no_chat_template",
        "max_input_tokens_past_positions",
        "negative_seed",
        "seed_past_64_bits",
        "temperature_zero",
    ],
)
def test_bad_parameters_are_refused_in_one_line_and_nothing_is_written(project, predict, error, message):
    before = sorted(p for p in (project / "data").rglob("*") if p.is_file())
    with pytest.raises(Exception) as caught:
        _run(project, **predict)
    found = find_user_error(caught.value)
    assert (
        isinstance(found, error) and message in str(found) and "\n" not in str(found) and "Fix:" in str(found)
    )
    assert sorted(p for p in (project / "data").rglob("*") if p.is_file()) == before


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {"temperature": 0.7, "top_p": 0.9},
            "predict.temperature = 0.7 and predict.top_p = 0.9 change nothing",
        ),
        ({"top_k": 5, "length_penalty": 2.0}, "predict.top_k = 5 changes nothing"),
    ],
    ids=["temperature_top_p", "top_k_length_penalty"],
)
def test_decoding_settings_the_decoding_never_reads_are_said_in_one_warning(project, caplog, settings, named):
    """vLLM and the OpenAI API sample at the temperature given; here a sampling setting without
    predict.do_sample (or a length penalty without beams) was dropped before ``generate``, which then never
    gave transformers' own warning: greedy predictions, the setting recorded beside them, no word said."""
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=3, **settings)
    warned = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "nothing" in r.getMessage()
    ]
    assert len(warned) == len(settings) - ("top_p" in settings)  # the sampling ones in one line
    assert named in warned[0] and "predict.do_sample=true" in warned[0]
    if "length_penalty" in settings:
        assert (
            "predict.length_penalty = 2.0 changes nothing" in warned[1] and "predict.num_beams" in warned[1]
        )
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["decoding"].startswith("greedy")
    caplog.clear()
    sampled = {"do_sample": True, "num_beams": 2}  # beam sampling: each setting read
    _run(
        project,
        input="data/01_raw/inputs.jsonl",
        prompt_column="dialogue",
        max_new_tokens=3,
        **sampled,
        **settings,
    )
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "nothing" in r.getMessage()]


def test_a_failed_save_leaves_the_previous_file_whole_and_no_partial_file(tmp_path, monkeypatch):
    dataset = AtomicCSVDataset(filepath=str(tmp_path / "predictions.csv"))
    dataset.save(pd.DataFrame({"id": [0], "prediction": ["old"]}))

    def killed(_fd):
        raise OSError("killed while writing")

    monkeypatch.setattr("os.fsync", killed)
    with pytest.raises(DatasetError, match="killed while writing"):
        dataset.save(pd.DataFrame({"id": range(1000), "prediction": ["new"] * 1000}))
    assert dataset.load()["prediction"].tolist() == ["old"] and [p.name for p in tmp_path.iterdir()] == [
        "predictions.csv"
    ]


def test_a_kill_between_the_csv_and_the_summary_leaves_a_pair_that_does_not_check(project, monkeypatch):
    (project / "data/01_raw/lines.txt").write_text("The battery\nshort\n", encoding="utf-8")
    csv, summary = (
        project / "data/07_model_output/predictions.csv",
        project / "data/08_reporting/predict_summary.json",
    )
    _run(project, input="data/01_raw/lines.txt", max_new_tokens=2)
    assert check_prediction_pair(csv, summary)["predictions_rows"] == 2  # a finished run's pair checks
    save = AtomicJSONDataset.save

    def killed_before_the_summary(self, data):
        if str(self._filepath).endswith("predict_summary.json"):
            raise OSError("killed between the two writes")
        save(self, data)

    monkeypatch.setattr(AtomicJSONDataset, "save", killed_before_the_summary)
    (project / "data/01_raw/lines.txt").write_text("The battery\nshort\nok\n", encoding="utf-8")
    with pytest.raises(Exception, match="killed between the two writes"):
        _run(project, input="data/01_raw/lines.txt", max_new_tokens=2)
    assert len(pd.read_csv(csv)) == 3 and json.loads(summary.read_text())["rows"] == 2  # new CSV, old summary
    with pytest.raises(StaleDataError) as caught:
        check_prediction_pair(csv, summary)
    assert "predict_summary.json" in str(caught.value) and "\n" not in str(caught.value)


def test_an_interrupted_run_continues_where_it_stopped_with_the_same_predictions(
    model_folder, tmp_path, caplog
):
    model, tokenizer = (
        AutoModelForCausalLM.from_pretrained(model_folder),
        AutoTokenizer.from_pretrained(model_folder),
    )
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32"))
    texts = pd.DataFrame({"text": [f"{t} {i}" for i in range(6) for t in DIALOGUES[:3]]})
    rows = input_rows(
        texts,
        tokenizer,
        column=("predict.text_column", "text"),
        template=None,
        id_column=None,
        limit=None,
        too_long="truncate",
        source="inputs",
    )
    job = PredictionJob(
        decoding={"do_sample": True, "temperature": 0.9}, max_new_tokens=5, batch_size=2, seed=3
    )
    whole, _ = predict_rows(model, tokenizer, rows, job, runtime=runtime)
    parts, generate, calls = PredictionParts(tmp_path / "parts"), model.generate, []

    def killed_on_second_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) > 4:  # batches of 2, 4 batches a chunk: the second chunk's first batch
            raise KeyboardInterrupt
        return generate(*args, **kwargs)

    model.generate = killed_on_second_chunk
    with pytest.raises(KeyboardInterrupt):
        predict_rows(model, tokenizer, rows, job, runtime=runtime, parts=parts, model_identity="m")
    model.generate = generate
    (part,) = (tmp_path / "parts").glob("*.jsonl")
    part.write_text(part.read_text() + '{"chunk": 1, "contin')  # a line cut off by the kill
    resumed, summary = predict_rows(
        model, tokenizer, rows, job, runtime=runtime, parts=parts, model_identity="m"
    )
    assert summary["resumed_rows"] == 8 and summary["generated_rows"] == 10
    pd.testing.assert_frame_equal(resumed, whole)
    with caplog.at_level("INFO", logger="fastlm.reporting.predictions"):  # a finished job asked again
        again, summary = predict_rows(
            model, tokenizer, rows, job, runtime=runtime, parts=parts, model_identity="m"
        )
    assert summary["resumed_rows"] == 18 and summary["generated_rows"] == 0
    assert "all 18 rows were generated by an earlier run of the same job" in caplog.text
    assert "interrupted" not in caplog.text
    pd.testing.assert_frame_equal(again, whole)
    other, summary = predict_rows(
        model, tokenizer, rows, job, runtime=runtime, parts=parts, model_identity="new"
    )
    assert summary["resumed_rows"] == 0  # other weights: nothing reused


def _small_bart(tokenizer, **config):
    """A small BART on ``tokenizer``'s vocabulary, its end token its start tokens; ``config`` overrides."""
    from transformers import BartConfig, BartForConditionalGeneration

    eos = tokenizer.eos_token_id
    settings = {
        **SMALL_BART_LAYERS,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": eos,
        "bos_token_id": eos,
        "decoder_start_token_id": eos,
        **config,
    }
    return BartForConditionalGeneration(BartConfig(vocab_size=len(tokenizer), **settings))


def test_an_encoder_decoder_model_predicts_each_row_as_it_does_alone(bpe_tokenizer):
    """Each row's greedy ``max_new_tokens`` tokens, as ``model.generate`` gives them alone. The token BART
    forces at the last position (``forced_eos_token_id``, BartConfig's default 2, here no end id of the
    tokenizer's) is generated after them and is no part of the prediction. Was: it took the last token's
    place, its text ('"') ending every prediction the limit cut."""
    torch.manual_seed(0)
    model = _small_bart(bpe_tokenizer, init_std=0.2).eval()
    texts = pd.DataFrame(
        {"text": ["The battery", "배송 문의 드립니다 빨리 보내 주세요", "ok", "가격 대비 좋아요"] * 2}
    )
    rows = input_rows(
        texts,
        bpe_tokenizer,
        column=("predict.text_column", "text"),
        template=None,
        id_column=None,
        limit=64,
        too_long="truncate",
        source="inputs",
    )
    job = PredictionJob(decoding={"num_beams": 1, "do_sample": False}, max_new_tokens=6, batch_size=3)
    table, _ = predict_rows(
        model, bpe_tokenizer, rows, job, runtime=setup_runtime(RuntimeConfig(device="cpu", precision="fp32"))
    )
    alone = []
    for ids in rows["ids"]:
        ids = torch.tensor([ids])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=6,
            do_sample=False,
            num_beams=1,
            forced_eos_token_id=None,  # greedy's own 6 tokens
        )
        alone.append(bpe_tokenizer.decode(out[0, 1:], skip_special_tokens=True).strip())
    assert model.generation_config.forced_eos_token_id == 2 != bpe_tokenizer.eos_token_id
    assert table["prediction"].tolist() == alone and (table["new_tokens"] > 0).any()
    assert not any(text.endswith(bpe_tokenizer.decode([2])) for text in alone)


def test_an_encoder_decoder_asked_more_new_tokens_than_its_decoder_positions_is_refused(
    kedro_project, bpe_tokenizer
):
    """A BART of 32 positions asked 40 new tokens: its decoder rows ran past its last position and the run
    stopped with an IndexError traceback ('index out of range in self') once a row did not end sooner.
    Refused in one line before anything is written; 31 new tokens (the decoder start and 31 tokens fill
    the 32 positions) are still asked."""

    from fastlm.reporting.predict_inputs import input_limit

    model = _small_bart(bpe_tokenizer, max_position_embeddings=32)
    assert input_limit(model, max_new_tokens=31, max_input_tokens=None) == 31
    folder = kedro_project / "data/06_models/bart"
    model.save_pretrained(folder)
    bpe_tokenizer.save_pretrained(folder)
    (kedro_project / "data/01_raw/texts.txt").write_text("The battery\nok\n", encoding="utf-8")
    before = sorted(p for p in (kedro_project / "data").rglob("*") if p.is_file())
    with pytest.raises(Exception) as raised:
        run_pipeline(
            kedro_project,
            "predict",
            {
                "predict": {"input": "data/01_raw/texts.txt", "model": str(folder), "max_new_tokens": 40},
                "train": CPU,
            },
        )
    error = find_user_error(raised.value)
    assert isinstance(error, ConfigError) and "\n" not in str(error), repr(raised.value)
    assert "predict.max_new_tokens = 40" in str(error) and "32 positions" in str(error)
    assert sorted(p for p in (kedro_project / "data").rglob("*") if p.is_file()) == before


def test_a_lora_adapter_folder_predicts_as_its_merged_model(project, model_folder):
    from fastlm.datasets.pretrained_model import PretrainedModelDataset
    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora

    torch.manual_seed(1)
    adapted = apply_lora(
        AutoModelForCausalLM.from_pretrained(model_folder),
        LoraParams(enabled=True, r=4),
        gradient_checkpointing=False,
    )
    with torch.no_grad():
        for name, weight in adapted.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.5)  # B starts at zero: make the adapter change the outputs
    PretrainedModelDataset(filepath=str(project / "data/06_models/runs/lora/model")).save(
        {"model": adapted, "tokenizer": AutoTokenizer.from_pretrained(model_folder)}
    )
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", model="lora", max_new_tokens=6)
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    good = table[table["refused"] == ""]
    prompts = [render_prompt(t, TEMPLATE) for t in good["input"]]
    merged = adapted.merge_and_unload().eval()
    assert good["prediction"].tolist() == _alone(model_folder, prompts, 6, merged)
    assert good["prediction"].tolist() != _alone(model_folder, prompts, 6)  # the adapter is in effect


def test_a_qlora_adapter_saved_without_its_quantization_is_said_to_merge_into_full_precision(
    project, model_folder, monkeypatch
):
    """A QLoRA adapter folder saved before ``base_digest.json`` recorded the quantization merges into the base
    folder's full-precision weights, not the 4-bit ones it trained on: where its train summary (the one of
    its ``training_id``) says QLoRA, predict and the report (the catalog's ``trained_model``) say so, once,
    naming the folder and the fix; a LoRA run's summary, or no matching summary, says nothing. Was: silent."""
    import logging

    from fastlm.datasets import pretrained_model
    from fastlm.datasets.predict_sources import PredictSources
    from fastlm.datasets.pretrained_model import PretrainedModelDataset
    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.adapter_folder import BASE_DIGEST
    from fastlm.engine.model.lora import apply_lora

    lines = []
    logger = logging.Logger("qlora-record", logging.INFO)
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger.addHandler(handler)
    monkeypatch.setattr(pretrained_model, "log", logger)
    adapted = apply_lora(
        AutoModelForCausalLM.from_pretrained(model_folder),
        LoraParams(enabled=True, r=4),
        gradient_checkpointing=False,
    )
    folder = project / "data/06_models/runs/q/model"
    PretrainedModelDataset(filepath=str(folder)).save(
        {
            "model": adapted,
            "tokenizer": AutoTokenizer.from_pretrained(model_folder),
            "training_data": {"training_id": "t"},
        }
    )
    digest = json.loads((folder / BASE_DIGEST).read_text())
    del digest["quantized"]  # as a fastlm before the record saved it
    (folder / BASE_DIGEST).write_text(json.dumps(digest))
    summary = project / "data/08_reporting/runs/q/train_summary.json"
    summary.parent.mkdir(parents=True, exist_ok=True)

    def loaded(adapter: str, training_id: str = "t") -> list[str]:
        summary.write_text(json.dumps({"adapter": adapter, "lora": True, "training_id": training_id}))
        lines.clear()
        monkeypatch.setattr(pretrained_model, "_said_unrecorded", set())
        sources = PredictSources(
            str(project / "data/06_models/model"),
            str(project / "data/06_models/runs"),
            str(project / "data/07_model_output/predict_parts"),
            train_summaries=str(project / "data/08_reporting"),
        )
        for _ in range(2):
            sources.load_model("q")
        monkeypatch.chdir(project)  # the report: the catalog's trained_model, its paths the project's
        catalog_dataset("trained_model", folder).load()
        return [line for line in lines if "full-precision" in line]

    said = loaded("QLoRA (r 4, alpha 8, NF4 base)")
    assert len(said) == 1 and str(folder) in said[0] and "4-bit" in said[0] and "again" in said[0], said
    assert loaded("LoRA (r 4, alpha 8)") == []
    assert loaded("QLoRA (r 4, alpha 8, NF4 base)", training_id="another training") == []


@pytest.mark.parametrize("suffix", [".txt", ".txt.gz", ".txt.bz2"])
def test_a_txt_input_is_one_row_per_newline_without_a_bom(tmp_path, suffix):
    """One input a line, as the README says: split at newlines alone (CRLF too), not at the form feeds,
    U+2028 and the like that ``str.splitlines`` also takes for line ends; a UTF-8 BOM is not part of row 0."""
    import bz2

    from fastlm.datasets.predict_sources import PredictSources

    lines = ["first", "second\u2028part", "page\x0cbreak", "next\x85line", "group\x1csep", "crlf", "", "last"]
    data = ("\ufeff" + "\n".join(lines[:5]) + "\n" + "\r\n".join(lines[5:]) + "\n").encode("utf-8")
    path = tmp_path / f"inputs{suffix}"
    path.write_bytes(
        gzip.compress(data)
        if suffix.endswith(".gz")
        else bz2.compress(data)
        if suffix.endswith(".bz2")
        else data
    )
    table = PredictSources(tmp_path / "model", tmp_path / "runs", tmp_path / "parts").read_input(str(path))
    assert table["text"].tolist() == lines


ROW_IDS = ["007", "0012", "1e3", "", "5"]  # as a CSV writes them: leading zeros, an exponent, none


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".csv.gz", ".jsonl", ".parquet"])
def test_the_id_column_keeps_its_ids_as_the_file_writes_them(tmp_path, suffix):
    """``predict.id_column`` values come back as written: a CSV's "007" is not the number 7.0, a JSON
    integer beside a row without one is not a float, a missing id is empty (the predictions' ``id`` and the
    summary's refused rows name the file's rows)."""
    import csv
    import io

    from fastlm.datasets.predict_sources import PredictSources

    path = tmp_path / f"inputs{suffix}"
    if ".csv" in suffix or suffix == ".tsv":
        sep = "\t" if suffix == ".tsv" else ","
        text = f"key{sep}prompt\n" + "".join(f"{key}{sep}row {i}\n" for i, key in enumerate(ROW_IDS))
        path.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
        written = [row["key"] for row in csv.DictReader(io.StringIO(text), delimiter=sep)]
    else:
        values = [7, None, 1000, 12, -3]
        rows = [{"prompt": f"row {i}", **({"key": v} if v is not None else {})} for i, v in enumerate(values)]
        if suffix == ".jsonl":
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        else:  # as Arrow writers other than pandas write it (no pandas metadata)
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({"prompt": [r["prompt"] for r in rows], "key": values}), path)
        written = [str(v) if v is not None else "" for v in values]
    table = PredictSources(tmp_path / "model", tmp_path / "runs", tmp_path / "parts").read_input(
        str(path), id_column="key"
    )
    tokenizer = llama_style_tokenizer([f"row {i}" for i in range(len(ROW_IDS))], vocab_size=60)
    rows = input_rows(
        table, tokenizer, column=("predict.prompt_column", "prompt"), template=TEMPLATE, id_column="key",
        limit=None, too_long="truncate", source=str(path),
    )  # fmt: skip
    shown = pd.read_csv(io.StringIO(rows[["id"]].to_csv(index=False)), dtype=str, keep_default_na=False)
    assert shown["id"].tolist() == written


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_ids_that_repeat_or_rows_without_one_are_said_in_one_warning(tmp_path, caplog, suffix):
    """``predict.id_column`` names each prediction's row, to join it back: ids that repeat ("a" twice; the
    JSON 3 and "3", written alike in the predictions) or rows without one gave predictions whose id names
    two rows, or none, and no word was said. Ids of one row each say nothing."""
    from fastlm.datasets.predict_sources import PredictSources

    path = tmp_path / f"inputs{suffix}"
    tokenizer = llama_style_tokenizer([f"row {i}" for i in range(6)], vocab_size=60)
    sources = PredictSources(tmp_path / "model", tmp_path / "runs", tmp_path / "parts")

    def warned(keys, id_column="key"):
        if suffix == ".csv":
            lines = [f"{key if key is not None else ''},row {i}\n" for i, key in enumerate(keys)]
            path.write_text("key,prompt\n" + "".join(lines))
        else:
            rows = [
                {"prompt": f"row {i}", **({"key": key} if key is not None else {})}
                for i, key in enumerate(keys)
            ]
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        caplog.clear()
        table = sources.read_input(str(path), id_column=id_column)
        with caplog.at_level(logging.WARNING):
            input_rows(
                table, tokenizer, column=("predict.prompt_column", "prompt"), template=TEMPLATE,
                id_column=id_column, limit=None, too_long="truncate", source=str(path),
            )  # fmt: skip
        return [r.getMessage() for r in caplog.records if "predict.id_column" in r.getMessage()]

    said = warned(["a", "a", None, 3, "3", "b"])
    assert len(said) == 1, said
    assert f"predict.id_column 'key' of {path}" in said[0]
    assert "4 rows share an id with another row ('a': rows 0 and 1; '3': rows 3 and 4)" in said[0]
    assert "1 row has no id (row 2)" in said[0] and "predict.id_column unset" in said[0]
    assert warned(["a", "a", None, 3, "3", "b"], id_column=None) == []  # the row numbers
    assert warned(["a", "007", "7", 3, "b"]) == []


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("empty.csv", b"", "is empty"),
        ("latin.csv", "text\ncaf\u00e9\n".encode("cp1252"), "not valid UTF-8"),
        ("latin.txt", "caf\u00e9\n".encode("cp1252"), "not valid UTF-8"),
        ("folder", None, "not a datasets.save_to_disk folder"),
        ("inputs.xlsx", b"x", "unknown extension '.xlsx'"),
    ],
    ids=["empty", "not_utf8", "txt_not_utf8", "folder", "unknown_extension"],
)
def test_an_unreadable_input_file_names_predict_input_in_its_fix(project, name, content, expected):
    path = project / "data/01_raw" / name
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    before = sorted(p for p in (project / "data").rglob("*") if p.is_file())
    with pytest.raises(Exception) as caught:
        _run(project, input=f"data/01_raw/{name}")
    found = find_user_error(caught.value)
    message = str(found)
    assert isinstance(found, InputDataError) and expected in message and "\n" not in message
    assert "predict.input" in message.split("Fix:")[1] and "raw_path" not in message
    assert sorted(p for p in (project / "data").rglob("*") if p.is_file()) == before


TRAINED_TEMPLATE = "Dialogue\n{prompt}\nSummary\n"


def _trained_on_prompts(project, template):
    """The project's model folder as the train pipeline writes it after prompt/response data wrapped by
    ``template`` (its ``training_data.json``)."""
    folder = project / "data/06_models/model"
    split = parse_split_params(
        {"prompt_column": "dialogue", "response_column": "summary", "prompt_template": template}
    )
    stored = make_fingerprint(
        AutoTokenizer.from_pretrained(folder), 64, data_format=data_format_params(split, None)
    )
    record = {"fingerprint": stored["fingerprint"], "data_format": stored["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps(record))
    return folder


def test_prompts_are_wrapped_by_the_template_the_model_was_trained_with(project, caplog):
    """predict.prompt_template unset: the template of the model's own training data, not the default one."""
    folder = _trained_on_prompts(project, TRAINED_TEMPLATE)
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=6)
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    good = table[table["refused"] == ""]
    prompts = [render_prompt(text, TRAINED_TEMPLATE) for text in good["input"]]
    assert good["prediction"].tolist() == _alone(folder, prompts, 6)
    assert good["input_tokens"].tolist() == [
        len(prompt_token_ids(folder_tokenizer, p))
        for folder_tokenizer in [AutoTokenizer.from_pretrained(folder)]
        for p in prompts
    ]
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["prompt_template"] == TRAINED_TEMPLATE
    assert summary["prompt_template_source"].endswith("training_data.json")
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "prompt_template" in r.getMessage()]


def test_a_prompt_template_other_than_the_trained_one_is_used_and_warned_about(project, caplog):
    folder = _trained_on_prompts(project, TRAINED_TEMPLATE)
    _run(
        project,
        input="data/01_raw/inputs.jsonl",
        prompt_column="dialogue",
        max_new_tokens=6,
        prompt_template=TEMPLATE,
    )
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    good = table[table["refused"] == ""]
    assert good["prediction"].tolist() == _alone(
        folder, [render_prompt(t, TEMPLATE) for t in good["input"]], 6
    )
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and "prompt_template" in r.getMessage()
    ]
    assert len(warned) == 1 and repr(TRAINED_TEMPLATE) in warned[0] and "training_data.json" in warned[0]
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert (
        summary["prompt_template"] == TEMPLATE
        and summary["prompt_template_source"] == "predict.prompt_template"
    )


def test_a_model_without_a_record_of_its_prompts_takes_the_default_template(project, model_folder):
    """A model folder from elsewhere (no training_data.json): the split's default template, as before."""
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=4)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["prompt_template"] == TEMPLATE and summary["prompt_template_source"] == "default"


@pytest.mark.parametrize("template", ["Summary", "{prompt} and {prompt}"])
def test_a_prompt_template_without_one_prompt_placeholder_is_refused(project, template):
    before = sorted(p for p in (project / "data").rglob("*") if p.is_file())
    with pytest.raises(Exception) as caught:
        _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", prompt_template=template)
    found = find_user_error(caught.value)
    message = str(found)
    assert (
        isinstance(found, ConfigError)
        and "predict.prompt_template must hold {prompt} exactly once" in message
    )
    assert "\n" not in message and "Fix:" in message and "parameter predict =" not in message
    assert sorted(p for p in (project / "data").rglob("*") if p.is_file()) == before


def test_a_model_folder_without_a_tokenizer_is_refused_not_predicted_empty(tmp_path):
    """``predict.model`` pointing at weights without tokenizer files: transformers built an empty tokenizer
    from config.json and every row was predicted as '' with 0 input tokens, exit 0."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from fastlm.datasets.pretrained_model import PretrainedModelDataset

    config = Qwen3Config(
        vocab_size=500, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(tmp_path / "weights_only")
    with pytest.raises(Exception) as raised:
        PretrainedModelDataset(filepath=str(tmp_path / "weights_only")).load()
    error = find_user_error(raised.value)
    assert isinstance(error, ConfigError) and "holds no tokenizer" in str(error), repr(raised.value)
    assert str(tmp_path / "weights_only") in str(error) and "\n" not in str(error)


def test_a_model_folder_whose_tokenizer_has_ids_past_its_embedding_is_refused_in_one_line(project):
    """``predict.model`` a folder holding another model's tokenizer (300 tokens for an embedding of 100 rows):
    the prompts' ids beyond the embedding stopped the run with an IndexError traceback ('index out of range
    in self') instead of one line naming the folder and the fix."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = project / "data/06_models/small"
    config = LlamaConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=512,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(project / "data/06_models/model").save_pretrained(folder)
    before = sorted(p for p in (project / "data").rglob("*") if p.is_file())
    error = _refused_with(project, folder)
    assert str(folder) in str(error) and "100" in str(error) and "predict.model" in str(error)
    assert sorted(p for p in (project / "data").rglob("*") if p.is_file()) == before


@pytest.mark.parametrize("pad", [False, True], ids=["no_pad", "pad"])
def test_a_model_folder_whose_tokenizer_has_no_eos_is_refused_in_one_line_leaving_data_whole(project, pad):
    """``predict.model`` a folder whose tokenizer defines no EOS token (a tokenizer saved without its special
    tokens): refused in one line naming the folder and the fix, before anything is written, as the split
    refuses such a tokenizer. Was: a ValueError traceback from the padding (no pad either) or a TypeError from
    the end ids (a pad but no EOS), after the kept chunks of the earlier predict job had been dropped."""
    folder = project / "data/06_models/no_eos"
    shutil.copytree(project / "data/06_models/model", folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("eos_token", "pad_token", "bos_token"):
        config.pop(key, None)
    if pad:
        config["pad_token"] = "<s>"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token_id is None and (tokenizer.pad_token_id is not None) == pad
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=2)
    before = {p: p.read_bytes() for p in sorted((project / "data").rglob("*")) if p.is_file()}
    assert any("predict_parts" in str(p) for p in before)  # the earlier job's kept chunks
    error = _refused_with(project, folder)
    assert str(folder) in str(error) and "no EOS token" in str(error) and "Fix: set eos_token" in str(error)
    assert {p: p.read_bytes() for p in sorted((project / "data").rglob("*")) if p.is_file()} == before


def test_a_tokenizer_whose_pad_token_the_model_lacks_predicts_padded_with_its_eos(project):
    """``predict.model`` a folder whose tokenizer was given a pad token the model's embedding lacks
    (``tokenizer.add_special_tokens({"pad_token": "[PAD]"})`` saved without ``resize_token_embeddings``): the
    padding is masked and never generated, so its rows are padded with the EOS and predicted as those of the
    same model whose tokenizer has no pad. Was: refused as "the tokenizer is not the model's", though every
    input id is the model's."""
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=5, batch_size=4)
    csv = project / "data/07_model_output/predictions.csv"
    expected = pd.read_csv(csv, keep_default_na=False)
    folder = project / "data/06_models/padded"
    shutil.copytree(project / "data/06_models/model", folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_special_tokens({"pad_token": "[PAD]"})
    tokenizer.save_pretrained(folder)
    embedding = AutoModelForCausalLM.from_pretrained(folder).get_input_embeddings().num_embeddings
    assert tokenizer.pad_token_id == embedding == len(tokenizer) - 1
    _run(
        project,
        input="data/01_raw/inputs.jsonl",
        prompt_column="dialogue",
        max_new_tokens=5,
        batch_size=4,
        model=str(folder),
    )
    table = pd.read_csv(csv, keep_default_na=False)
    assert len(set(table["input_tokens"])) > 2  # rows of several lengths batched together: padded
    columns = ["id", "prediction", "refused", "input_tokens", "new_tokens", "finish_reason"]
    pd.testing.assert_frame_equal(table[columns], expected[columns])


def _predicted(project, **predict):
    _run(project, max_new_tokens=6, **predict)
    table = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    return table, summary


def _warned(caplog) -> list[str]:
    """fastlm's warnings (not kedro's own)."""
    records = [r for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("fastlm")]
    return [r.getMessage() for r in records]


def test_a_prompt_model_reads_a_txt_or_text_column_as_prompts_as_it_was_trained(project, caplog):
    """A model trained on prompt/response data, given a .txt or a table with a ``text`` column and no input
    column named: each input is a prompt wrapped by its training's template and answered, as it trained
    (was: continued raw, no template, its output read as a continuation). Its greedy predictions are those of
    the same inputs named as ``predict.prompt_column``; a table's ``text`` column is said in one warning."""
    folder = _trained_on_prompts(project, TRAINED_TEMPLATE)
    lines = [text for text in DIALOGUES if "\n" not in text]
    (project / "data/01_raw/lines.txt").write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
    pd.DataFrame({"text": lines}).to_csv(project / "data/01_raw/texts.csv", index=False)
    pd.DataFrame({"dialogue": lines}).to_csv(project / "data/01_raw/dialogues.csv", index=False)
    asked, _ = _predicted(project, input="data/01_raw/dialogues.csv", prompt_column="dialogue")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = [prompt_token_ids(tokenizer, render_prompt(text, TRAINED_TEMPLATE)) for text in lines]
    assert asked["input_tokens"].tolist() == [len(ids) for ids in prompts]

    caplog.clear()
    table, summary = _predicted(project, input="data/01_raw/lines.txt")
    assert table["prediction"].tolist() == asked["prediction"].tolist()
    assert table["input_tokens"].tolist() == asked["input_tokens"].tolist()
    assert summary["input_format"] == "prompt" and summary["prompt_template"] == TRAINED_TEMPLATE
    assert not _warned(caplog)

    caplog.clear()
    table, summary = _predicted(project, input="data/01_raw/texts.csv")
    assert table["prediction"].tolist() == asked["prediction"].tolist()
    assert table["input_tokens"].tolist() == asked["input_tokens"].tolist()
    assert summary["input_format"] == "prompt" and summary["input_column"] == "text"
    warned = _warned(caplog)
    assert len(warned) == 1 and "predict.text_column" in warned[0] and "\n" not in warned[0], warned

    caplog.clear()  # the training's prompt column, unnamed: read as it was trained, without a warning
    table, summary = _predicted(project, input="data/01_raw/dialogues.csv")
    assert table["prediction"].tolist() == asked["prediction"].tolist()
    assert summary["input_column"] == "dialogue" and summary["input_format"] == "prompt"
    assert not _warned(caplog)


def test_a_prompt_model_continues_raw_text_only_when_text_column_is_named_and_says_so(project, caplog):
    """``predict.text_column`` on a prompt/response model: the texts are continued as written (no template),
    as asked, with one warning that this is not how the model was trained."""
    folder = _trained_on_prompts(project, TRAINED_TEMPLATE)
    lines = [text for text in DIALOGUES if "\n" not in text]
    (project / "data/01_raw/lines.txt").write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
    table, summary = _predicted(project, input="data/01_raw/lines.txt", text_column="text")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert table["input_tokens"].tolist() == [len(prompt_token_ids(tokenizer, text)) for text in lines]
    assert summary["input_format"] == "text" and "prompt_template" not in summary
    warned = _warned(caplog)
    assert len(warned) == 1 and "predict.text_column" in warned[0] and "prompt" in warned[0], warned


def test_a_prompt_model_given_neither_its_prompt_column_nor_text_names_the_prompt_column(project):
    _trained_on_prompts(project, TRAINED_TEMPLATE)
    pd.DataFrame({"question": ["Noah: hi"]}).to_csv(project / "data/01_raw/questions.csv", index=False)
    before = sorted(p for p in (project / "data").rglob("*") if p.is_file())
    with pytest.raises(Exception) as caught:
        _run(project, input="data/01_raw/questions.csv")
    found = find_user_error(caught.value)
    message = str(found)
    assert isinstance(found, InputDataError) and "'dialogue' (split.prompt_column" in message, message
    assert "predict.prompt_column is unset" in message.split("Fix:")[0], message
    assert "\n" not in message and "predict.prompt_column=" in message.split("Fix:")[1]
    assert sorted(p for p in (project / "data").rglob("*") if p.is_file()) == before


def test_a_chat_model_given_neither_its_messages_column_nor_text_names_split_messages_column(project):
    """A chat model asked a file with neither its training's messages column nor ``text``, no column named:
    the refusal named ``predict.messages_column``, which was never set (the column was the training's
    ``split.messages_column``). It names the parameter that chose the column, and both fixes."""
    _trained_on_chats(project)
    pd.DataFrame({"question": ["Noah: hi"]}).to_csv(project / "data/01_raw/questions.csv", index=False)
    message = _refusal(project, input="data/01_raw/questions.csv")
    said, fix = message.split("Fix:")
    assert "'messages' (split.messages_column" in said and "predict.messages_column is unset" in said, said
    assert "predict.messages_column=" in fix and "'messages' column" in fix, fix


def _chat_model(project):
    """The project's model folder's tokenizer given ``CHAT_TEMPLATE`` (saved there), and the fingerprint of
    chat data (``split.messages_column: messages``) rendered with it."""
    folder = project / "data/06_models/model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    split = parse_split_params({"messages_column": "messages"})
    return tokenizer, make_fingerprint(tokenizer, 64, data_format=data_format_params(split, tokenizer))


def _trained_on_chats(project):
    """The project's model folder as the train pipeline writes it after chat data (``split.messages_column:
    messages``) rendered with the tokenizer's chat template."""
    folder = project / "data/06_models/model"
    _, stored = _chat_model(project)
    record = {"fingerprint": stored["fingerprint"], "data_format": stored["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps(record))
    return folder


def test_chats_asked_without_the_training_system_turn_are_counted_among_the_chats_asked(project, caplog):
    """Every training chat began with one system turn: the chats given without it are counted
    (``chats_without_system_turn``) and said in one warning among those asked, as given; a chat refused (no
    user turn, blank content) is asked neither way. Was: refused chats counted too ("4 of 6 chats ... they
    are asked as given" where 2 of the 3 chats asked lacked it)."""
    folder = _trained_on_chats(project)
    record = json.loads((folder / "training_data.json").read_text())
    (folder / "training_data.json").write_text(json.dumps({**record, "system_prompt": SYSTEM["content"]}))
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"messages": chat}) + "\n" for chat, _ in CHATS), encoding="utf-8"
    )
    table, summary = _predicted(project, input="data/01_raw/chats.jsonl")
    asked = table[table["refused"] == ""]
    lacking = [json.loads(text)[0]["role"] != "system" for text in asked["input"]]
    assert len(asked) == 3 and sum(lacking) == 2 == summary["chats_without_system_turn"]
    assert summary["refused"] == 4
    said = [text for text in _warned(caplog) if "begin without the system turn" in text]
    assert len(said) == 1 and "2 of 3 chats" in said[0], said


def test_a_chat_model_asks_a_txt_a_text_or_a_prompt_column_as_one_user_turn(project, caplog):
    """A model trained on chat messages, given a .txt, a table with a ``text`` column (no column named) or a
    ``predict.prompt_column``: each input is one user turn in its training's chat format, as the report asks
    its prompts (was: the .txt and text refused for want of a messages column, a prompt column wrapped by the
    default prompt template, which the model never saw). Its greedy predictions are those of the same turns
    given as messages."""
    folder = _trained_on_chats(project)
    lines = [text for text in DIALOGUES if "\n" not in text]
    (project / "data/01_raw/lines.txt").write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
    pd.DataFrame({"text": lines}).to_csv(project / "data/01_raw/texts.csv", index=False)
    pd.DataFrame({"question": lines}).to_csv(project / "data/01_raw/questions.csv", index=False)
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in lines),
        encoding="utf-8",
    )
    asked, _ = _predicted(project, input="data/01_raw/chats.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    rendered = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in lines
    ]
    assert asked["input_tokens"].tolist() == [len(prompt_token_ids(tokenizer, p)) for p in rendered]
    for predict, warnings in (
        ({"input": "data/01_raw/lines.txt"}, 0),
        ({"input": "data/01_raw/texts.csv"}, 1),
        ({"input": "data/01_raw/questions.csv", "prompt_column": "question"}, 0),
    ):
        caplog.clear()
        table, summary = _predicted(project, **predict)
        assert table["prediction"].tolist() == asked["prediction"].tolist(), predict
        assert table["input_tokens"].tolist() == asked["input_tokens"].tolist(), predict
        assert table["input"].tolist() == lines and summary["input_format"] == "prompt"
        assert summary["chat_template_sha256"] is not None and "prompt_template" not in summary
        warned = _warned(caplog)
        assert len(warned) == warnings and all("predict.text_column" in w for w in warned), warned


def test_chat_template_kwargs_that_render_nothing_or_a_template_never_reads_are_said_in_one_warning(
    project, sample_texts, caplog
):
    """``predict.chat_template_kwargs`` that change nothing were taken silently, where the split says so in
    one warning: a Llama-3.2 model from elsewhere given Qwen3's ``enable_thinking`` (its template never reads
    it), and a prompt/response model whose prompts no chat template renders. Each now says so in one
    warning; the predictions are those without them."""
    from tests.support.chat_templates import llama3_style_tokenizer

    folder = project / "data/06_models/model"
    shutil.rmtree(folder)
    save_tiny_llama(folder, llama3_style_tokenizer(sample_texts + DIALOGUES, vocab_size=300))
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"messages": chat}) + "\n" for chat, _ in CHATS[:3]), encoding="utf-8"
    )
    _kwargs_change_nothing_and_are_warned_once(
        project, caplog, "enable_thinking", input="data/01_raw/chats.jsonl", messages_column="messages"
    )
    _trained_on_prompts(project, TRAINED_TEMPLATE)
    _kwargs_change_nothing_and_are_warned_once(
        project, caplog, "predict.prompt_column", input="data/01_raw/inputs.jsonl", prompt_column="dialogue"
    )


def _kwargs_change_nothing_and_are_warned_once(project, caplog, named: str, **asked) -> None:
    """Predictions with ``enable_thinking: false`` are those without, and one warning line names ``named``."""
    plain, _ = _predicted(project, **asked)
    caplog.clear()
    given, _ = _predicted(project, **asked, chat_template_kwargs={"enable_thinking": False})
    assert given["prediction"].tolist() == plain["prediction"].tolist()
    warned = [w for w in _warned(caplog) if "predict.chat_template_kwargs" in w]
    assert len(warned) == 1 and named in warned[0] and "\n" not in warned[0], _warned(caplog)


def test_a_chat_model_whose_prompts_are_wrapped_by_predict_prompt_template_is_warned_about(project, caplog):
    """A chat model's prompts wrapped by an explicit ``predict.prompt_template`` are not the chats it
    learned: said in one warning, as a prompt model's other template is (was: silent). The line that says how
    the .txt's lines are read names the template too (was: "each one user turn in its training's chat
    format ..., as the model was trained", contradicted by the warning after it)."""
    _trained_on_chats(project)
    lines = [text for text in DIALOGUES if "\n" not in text]
    (project / "data/01_raw/lines.txt").write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
    caplog.set_level(logging.INFO, logger="fastlm")
    table, summary = _predicted(project, input="data/01_raw/lines.txt", prompt_template=TEMPLATE)
    assert summary["prompt_template"] == TEMPLATE and "chat_template_sha256" not in summary
    warned = [w for w in _warned(caplog) if "predict.prompt_template" in w]
    assert len(warned) == 1 and "chat" in warned[0] and "\n" not in warned[0], _warned(caplog)
    read = [r.getMessage() for r in caplog.records if "lines.txt is a prompt" in r.getMessage()]
    assert len(read) == 1 and "wrapped by predict.prompt_template" in read[0], read
    assert "chat format" not in read[0] and "as the model was trained" not in read[0], read


def test_a_text_model_asked_prompts_says_it_never_saw_the_template(project, caplog):
    """``predict.prompt_column`` on a model trained here on plain text: each prompt is wrapped by the default
    prompt template, which the model never saw, and read as a response. Asked, it is done, said in one warning
    naming ``predict.text_column``; a model from elsewhere (no record) is asked without a warning."""
    folder = project / "data/06_models/model"
    lines = [text for text in DIALOGUES if "\n" not in text]
    (project / "data/01_raw/lines.txt").write_text("".join(f"{t}\n" for t in lines), encoding="utf-8")
    _predicted(project, input="data/01_raw/lines.txt", prompt_column="text")
    assert _warned(caplog) == []
    stored = make_fingerprint(AutoTokenizer.from_pretrained(folder), 64)
    record = {"fingerprint": stored["fingerprint"], "data_format": None, "max_length": 64}
    (folder / "training_data.json").write_text(json.dumps(record))  # as the train pipeline writes it
    caplog.clear()
    table, summary = _predicted(project, input="data/01_raw/lines.txt", prompt_column="text")
    assert summary["input_format"] == "prompt" and len(table) == len(lines)
    warned = _warned(caplog)
    assert len(warned) == 1 and "plain text" in warned[0] and "predict.text_column" in warned[0], warned


@pytest.mark.parametrize("template", [None, "{prompt}"])
def test_a_model_trained_on_ids_asked_prompts_is_refused_in_one_line(project, template):
    """``predict.prompt_column`` on a model trained on pre-tokenized ids (``split.ids_column``): each prompt
    was wrapped by the default prompt template, whose words are no ids of its vocabulary (each read as its
    EOS id: ``3 17 5`` asked as ``3 17 5 <eos> <eos>``), and the outputs read as responses it never learned,
    without a word. Refused in one line naming ``predict.text_column`` (rows of space-separated ids,
    continued as it was trained), nothing written, whatever template is given; the text column predicts."""
    folder = project / "data/06_models/model"
    split = parse_split_params({"pretokenized": True, "ids_column": "ids", "vocab_size": 300})
    stored = make_fingerprint(
        AutoTokenizer.from_pretrained(folder), 64, data_format=data_format_params(split, None)
    )
    assert stored["params"]["data_format"]["kind"] == "pretokenized"
    record = {"fingerprint": stored["fingerprint"], "data_format": stored["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps(record))  # as the train pipeline writes it
    (project / "data/01_raw/ids.jsonl").write_text(
        "".join(json.dumps({"text": text}) + "\n" for text in ["3 17 5", "4 4"]), encoding="utf-8"
    )
    asked = {"prompt_template": template} if template else {}
    message = _refusal(project, input="data/01_raw/ids.jsonl", prompt_column="text", **asked)
    assert "predict.prompt_column 'text'" in message and "pre-tokenized ids" in message, message
    assert "predict.text_column" in message.split("Fix:")[1], message
    table, summary = _predicted(project, input="data/01_raw/ids.jsonl", text_column="text")
    assert summary["input_format"] == "ids" and table["refused"].tolist() == ["", ""]


@pytest.mark.parametrize(
    ("rows", "predict", "said"),
    [
        (
            [{"messages": "Noah: hi"}, {"messages": "Amy: yo"}],
            {"messages_column": "messages"},
            "malformed_messages",
        ),
        ([{"dialogue": " "}, {"dialogue": ""}], {"prompt_column": "dialogue"}, "whitespace_only"),
    ],
    ids=["chats_as_strings", "blank_prompts"],
)
def test_an_input_of_which_no_row_can_be_asked_is_refused_in_one_line(project, rows, predict, said):
    """Every row refused (a messages column of strings, blank prompts): predict wrote a table of refusals and
    exited 0, the reason only in the CSV. Refused in one line naming the file, the column and the reasons,
    nothing written."""
    if "messages_column" in predict:
        _trained_on_chats(project)
    (project / "data/01_raw/bad.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8"
    )
    before = sorted(p for p in (project / "data").rglob("*") if p.is_file())
    with pytest.raises(Exception) as caught:
        _run(project, input="data/01_raw/bad.jsonl", **predict)
    found = find_user_error(caught.value)
    message = str(found)
    assert isinstance(found, InputDataError) and "none of the 2 rows" in message and said in message, message
    assert "bad.jsonl" in message and "\n" not in message and "Fix:" in message
    assert sorted(p for p in (project / "data").rglob("*") if p.is_file()) == before


@pytest.mark.parametrize(
    ("rows", "predict", "fix"),
    [
        ([{"dialogue": 2024}, {"dialogue": 42}], {"prompt_column": "dialogue"}, "JSON strings"),
        (
            [
                {"messages": [{"role": "user", "content": 2024}]},
                {"messages": [{"role": "user", "content": 7}]},
            ],
            {"messages_column": "messages"},
            "each turn's content as a JSON string",
        ),
    ],
    ids=["prompts", "chat_contents"],
)
def test_an_input_of_numbers_where_texts_are_asked_names_json_strings_in_its_fix(project, rows, predict, fix):
    """JSON Lines prompts (or chat contents) written as JSON numbers (``{"dialogue": 2024}``) are each refused
    as ``non_string``; the whole input's refusal told to give ``a non-empty text a row``, which the rows
    already read as to a person. Its fix now says to write them as JSON strings (``"2024"``)."""
    if "messages_column" in predict:
        _trained_on_chats(project)
    (project / "data/01_raw/numbers.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = _refusal(project, input="data/01_raw/numbers.jsonl", max_new_tokens=2, **predict)
    assert "'non_string': 2" in message, message
    assert fix in message.split("Fix:")[1] and '"2024"' in message.split("Fix:")[1], message


def _refusal(project, **predict) -> str:
    """The one line a predict run that refuses its input says, checked to leave everything under data/ as it
    was."""
    before = {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()}
    with pytest.raises(Exception) as caught:
        _run(project, **predict)
    found = find_user_error(caught.value)
    assert isinstance(found, InputDataError), caught.value
    assert {p: p.read_bytes() for p in (project / "data").rglob("*") if p.is_file()} == before
    message = str(found)
    assert "\n" not in message and "Fix:" in message, message
    return message


def test_an_input_of_no_row_is_refused_in_one_line_leaving_the_last_predictions(project):
    """A table of no row (a CSV of its header only, a Parquet file of none) has no row to ask: it was written
    as an empty predictions table over the last run's, exit 0. Refused in one line, the last ones kept."""
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=2)
    (project / "data/01_raw/none.csv").write_text("dialogue\n", encoding="utf-8")
    message = _refusal(project, input="data/01_raw/none.csv", prompt_column="dialogue", max_new_tokens=2)
    assert "none.csv" in message and "no row" in message, message


@pytest.mark.parametrize(("name", "content"), [("blank.jsonl", "\n"), ("none.json", "[]")])
@pytest.mark.parametrize("column", [{"prompt_column": "dialogue"}, {}], ids=["named", "the-models"])
def test_an_input_of_no_row_and_no_column_is_refused_as_no_row(project, name, content, column):
    """A JSON Lines file of a blank line or a JSON file of an empty list: no row, so no column either. It
    was refused as having no column ``'dialogue'``, ``its columns are []``, with the fix to name one of
    them (there are none); it is refused as holding no row, before the model is loaded."""
    (project / "data/01_raw" / name).write_text(content, encoding="utf-8")
    message = _refusal(project, input=f"data/01_raw/{name}", max_new_tokens=2, **column)
    assert name in message and "no row" in message and "column" not in message, message


def test_an_input_separated_by_semicolons_names_its_separator(project):
    """A CSV exported with semicolons reads as one column named after its whole header: the fix said to
    name one of its columns (``text;label``). The separator is named instead."""
    (project / "data/01_raw/semi.csv").write_text("dialogue;label\nhello there;1\n", encoding="utf-8")
    message = _refusal(project, input="data/01_raw/semi.csv", prompt_column="dialogue", max_new_tokens=2)
    assert "has no column 'dialogue'" in message and "looks separated by ';', not ','" in message, message
    assert "save it with commas between columns" in message and "one of them" not in message


def test_a_txt_input_that_is_a_table_of_tabs_is_refused_naming_tsv(project):
    """A .txt whose every line holds the same number of tabs (a table: NSMC's ratings_test.txt) would have
    its header, ids and labels asked as inputs. Refused, naming the .tsv to rename it to and the column to
    ask."""
    table = "id\tdocument\tlabel\n1\t좋아요\t1\n2\t별로예요\t0\n"
    (project / "data/01_raw/ratings_test.txt").write_text(table, encoding="utf-8")
    message = _refusal(project, input="data/01_raw/ratings_test.txt", max_new_tokens=2)
    assert "ratings_test.txt looks like a table" in message and "rename it to ratings_test.tsv" in message
    assert "predict.text_column" in message and "split.text_column" not in message


def test_an_input_refused_for_lengths_and_blanks_names_both_fixes(project):
    """Every row refused, some too long and some blank: the fix named only the blanks' (a non-empty text),
    which leaves the long ones refused. It names both."""
    rows = [{"dialogue": "word " * 40}, {"dialogue": " "}, {"dialogue": "word " * 40}]
    (project / "data/01_raw/bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = _refusal(
        project,
        input="data/01_raw/bad.jsonl",
        prompt_column="dialogue",
        max_input_tokens=12,
        too_long="refuse",
        max_new_tokens=2,
    )
    assert "'too_long': 2" in message and "'whitespace_only': 1" in message, message
    assert "predict.too_long" in message and "non-empty text" in message, message


def test_an_input_of_no_askable_row_shows_its_first_id_on_one_line_and_cut(project):
    """predict.id_column's value of the first row is the user's own text: quoted on one line and cut (was:
    printed as it is, a newline inside it breaking the line)."""
    rows = [{"dialogue": " ", "key": "line one\nline two " + "z" * 300}, {"dialogue": "", "key": "b"}]
    (project / "data/01_raw/bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = _refusal(
        project, input="data/01_raw/bad.jsonl", prompt_column="dialogue", id_column="key", max_new_tokens=2
    )
    assert "'line one\\nline two" in message and "z" * 100 not in message, message


@pytest.mark.parametrize("given", ["folder", "glob"])
def test_predict_input_of_shards_says_it_reads_one_file(tmp_path, given):
    from fastlm.datasets.predict_sources import PredictSources

    (tmp_path / "shards").mkdir()
    for index in range(2):
        (tmp_path / "shards" / f"part-{index}.jsonl").write_text('{"text": "hello"}\n')
    path = tmp_path / "shards" if given == "folder" else tmp_path / "shards" / "*.jsonl"
    with pytest.raises(InputDataError) as raised:
        PredictSources(tmp_path / "model", tmp_path / "runs", tmp_path / "parts").read_input(str(path))
    message = str(raised.value)
    assert f"predict.input {path}" in message and "one file" in message and "\n" not in message, message


def test_a_model_trained_here_before_its_training_record_cuts_prompts_as_its_report_does(project):
    """A model folder the train pipeline wrote before it recorded its rows' length (no
    ``training_data.json``): its prompts are cut at what the project's split fingerprint's
    ``split.max_length`` leaves beside ``max_new_tokens`` (what its report's reference generations give it),
    as for the same model with the record (was: at what its positions leave, prompts far longer than any row
    it trained on, said in the summary alone)."""
    from fastlm.reporting.references import prompt_budget

    folder = project / "data/06_models/model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    length, new_tokens = 16, 6
    split = parse_split_params({"prompt_column": "dialogue", "response_column": "summary"})
    stored = make_fingerprint(tokenizer, length, data_format=data_format_params(split, None))
    (project / "data/05_model_input/tokenized_corpus_fingerprint.json").write_text(json.dumps(stored))
    asked = {"input": "data/01_raw/inputs.jsonl", "prompt_column": "dialogue", "resume": False}
    _run(project, max_new_tokens=new_tokens, **asked)  # nothing ties the fingerprint to the folder
    untied = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert "positions" in untied["input_limit_source"] and untied["truncated"] == 0
    summary_file = project / "data/08_reporting/train_summary.json"  # written with the model, as then
    summary_file.write_text(json.dumps({"fingerprint": stored["fingerprint"]}))
    _run(project, max_new_tokens=new_tokens, **asked)  # the older folder: no record
    older = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    older_summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    record = {"fingerprint": stored["fingerprint"], "data_format": stored["params"]["data_format"]}
    (folder / "training_data.json").write_text(json.dumps({**record, "max_length": length}))
    _run(project, max_new_tokens=new_tokens, **asked)
    recorded = pd.read_csv(project / "data/07_model_output/predictions.csv", keep_default_na=False)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["input_limit"] == prompt_budget(length, new_tokens) and summary["truncated"] > 0
    assert older_summary["input_limit"] == summary["input_limit"], older_summary["input_limit_source"]
    assert older_summary["truncated"] == summary["truncated"]
    assert f"split.max_length {length}" in older_summary["input_limit_source"]
    assert "tokenized_corpus_fingerprint.json" in older_summary["input_limit_source"]
    assert older[["input_tokens", "prediction"]].equals(recorded[["input_tokens", "prediction"]])


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_a_prompt_column_of_numbers_in_a_csv_is_asked_as_the_text_it_writes(tmp_path, model_folder, suffix):
    """A CSV's cells are text: a prompt column holding only numbers (``2024``, ``007``) is asked as written,
    as a column mixing numbers and words always was (it was refused row by row as ``non_string``, the file
    then as having no askable row)."""
    from fastlm.datasets.predict_sources import PredictSources
    from fastlm.pipelines.predict.nodes import predict_file

    sep = "\t" if suffix == ".tsv" else ","
    written = ["2024", "42", "007", "1e3", "0.50", "-3"]  # pandas alone: 2024.0, ..., 7.0, 1000.0, 0.5
    path = tmp_path / f"numbers{suffix}"
    lines = [f"key{sep}question"] + [f"k{row}{sep}{value}" for row, value in enumerate(written)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sources = PredictSources(model_folder, tmp_path / "runs", tmp_path / "parts")
    predict = {"input": str(path), "prompt_column": "question", "max_new_tokens": 1, "resume": False}
    table, summary = predict_file(sources, predict, CPU)
    assert table["input"].tolist() == written, table
    assert summary["refused"] == 0 and table["refused"].tolist() == [""] * len(written), table
    assert (table["new_tokens"] == 1).all()


def test_a_prompt_of_a_json_number_is_still_refused_as_no_text(tmp_path):
    """A JSON number is no text (unlike a CSV cell): JSON Lines prompts written as numbers stay refused as
    ``non_string``, beside a prompt written as a string."""
    from fastlm.datasets.predict_sources import PredictSources

    path = tmp_path / "numbers.jsonl"
    rows = [{"question": 2024}, {"question": "2024"}, {"question": 7.5}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    sources = PredictSources(tmp_path / "model", tmp_path / "runs", tmp_path / "parts")
    table = sources.read_input(str(path))
    tokenizer = llama_style_tokenizer(["2024"], vocab_size=60)
    asked = input_rows(
        table, tokenizer, column=("predict.prompt_column", "question"), template=TEMPLATE, id_column=None,
        limit=None, too_long="truncate", source=str(path),
    )  # fmt: skip
    assert asked["refused"].tolist()[0::2] == ["non_string", "non_string"] and pd.isna(asked["refused"][1])


def test_a_model_rewritten_with_its_time_put_back_is_another_model_and_a_copy_the_same(
    tmp_path, model_folder
):
    """Round twenty: the model's identity (which keys the resumable prediction parts) digested file names,
    sizes and modification times: weights rewritten with their size and time put back (``cp -p``, ``rsync
    -t``) were the same model, and an interrupted predict continued with the old model's predictions. It is
    the weights' content now (sampled as ``base_digest.json`` samples them): a copy of the folder is the same
    model, the rewrite another."""
    from fastlm.datasets.predict_sources import PredictSources

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    sources = PredictSources(folder, tmp_path / "runs", tmp_path / "parts")
    before = sources.load_model(None)["identity"]
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert sources.load_model(str(copy))["identity"] == before
    rewrite_weights_keeping_time(folder)
    assert sources.load_model(None)["identity"] != before


def test_an_unknown_model_names_the_newest_runs_and_how_many_there_are(tmp_path):
    """``predict.model`` naming no folder and no run: the fix listed the last 10 run names in alphabetical
    order with no word of the others (runs trained a moment before were left out). It lists the 10 newest,
    newest first, says how many there are, and suggests a close name."""
    import os

    from fastlm.datasets.predict_sources import PredictSources
    from fastlm.errors import InputDataError

    runs = tmp_path / "runs"
    names = [f"run{i:02d}" for i in range(12)] + ["lora1"]
    for age, name in enumerate(reversed(names)):  # lora1 the newest, run00 the oldest
        (runs / name / "model").mkdir(parents=True)
        os.utime(runs / name / "model", (1e9 - age * 100, 1e9 - age * 100))
    sources = PredictSources(str(tmp_path / "model"), str(runs), str(tmp_path / "parts"))
    with pytest.raises(InputDataError) as caught:
        sources.load_model("lora2")
    said = str(caught.value)
    assert "the 10 newest of 13" in said and "lora1, run11, run10" in said and "run00" not in said
    assert "the closest to it: lora1." in said and "\n" not in said


@pytest.mark.parametrize("trained_on", ["prompt_response", "text"])
def test_a_model_not_trained_on_chats_asked_chats_says_it_never_saw_them(project, caplog, trained_on):
    """``predict.messages_column`` on a model trained here on prompt/response pairs or plain text: the chats
    are rendered with its tokenizer's chat template, a format it never trained on, and answered without a
    word (as a text model asked prompts is warned). Asked, it is done, said in one warning naming the input
    the model was trained on; a model from elsewhere (no record) is asked without a warning."""
    folder = project / "data/06_models/model"
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    (project / "data/01_raw/chats.jsonl").write_text(
        "".join(json.dumps({"messages": chat}) + "\n" for chat, _ in CHATS[:2]), encoding="utf-8"
    )
    _predicted(project, input="data/01_raw/chats.jsonl", messages_column="messages")
    assert _warned(caplog) == []
    pairs = parse_split_params({"prompt_column": "dialogue", "response_column": "summary"})
    data_format = data_format_params(pairs, tokenizer) if trained_on == "prompt_response" else None
    stored = make_fingerprint(tokenizer, 64, data_format=data_format)
    record = {"fingerprint": stored["fingerprint"], "data_format": data_format, "max_length": 64}
    (folder / "training_data.json").write_text(json.dumps(record))  # as the train pipeline writes it
    caplog.clear()
    table, summary = _predicted(project, input="data/01_raw/chats.jsonl", messages_column="messages")
    assert summary["input_format"] == "messages" and len(table) == 2
    warned = _warned(caplog)
    assert len(warned) == 1 and "never trained on chat" in warned[0], warned
    expected = "predict.prompt_column" if trained_on == "prompt_response" else "predict.text_column"
    assert expected in warned[0], warned


def test_the_summary_names_the_dtype_the_models_weights_generate_in(project):
    """A model folder saved in bf16 (``merge-adapter --dtype bfloat16``), predicted with
    ``train.runtime.precision: fp32``: autocast is off, and the weights compute in bf16; the summary says
    both. Was: ``"precision": "fp32"`` alone, as though generation ran in fp32."""
    folder = project / "data/06_models/model"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    _run(project, input="data/01_raw/inputs.jsonl", prompt_column="dialogue", max_new_tokens=2)
    summary = json.loads((project / "data/08_reporting/predict_summary.json").read_text())
    assert summary["precision"] == "fp32" and summary["weights_dtype"] == "bfloat16", summary


def _refused_with(project, folder):
    """The one-line InputDataError of a predict job on the inputs with ``predict.model`` ``folder``."""
    with pytest.raises(Exception) as raised:
        _run(
            project,
            input="data/01_raw/inputs.jsonl",
            prompt_column="dialogue",
            model=str(folder),
            max_new_tokens=4,
        )
    error = find_user_error(raised.value)
    assert isinstance(error, InputDataError) and "\n" not in str(error), repr(raised.value)
    return error
