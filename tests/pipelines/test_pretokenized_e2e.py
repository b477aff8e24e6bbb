"""Issue 18: pre-tokenized log-key sequences through split -> train -> report in one KedroSession project."""

import json

import pandas as pd
import pytest
from demo_data.logkeys import VOCAB_SIZE, write_demo_logkeys

from tests.support.e2e import TRAIN as BASE_TRAIN
from tests.support.e2e import own_experiment
from tests.support.project import run_pipeline

pytestmark = pytest.mark.e2e
TRAIN = {**BASE_TRAIN, "max_steps": 3, "eval_every": None, "save_every": None}
SPLIT = {"pretokenized": True, "vocab_size": VOCAB_SIZE, "max_length": 48}
REPORT = {
    "max_new_tokens": 4,
    "prompts": ["9 10"],
    "worst_samples": 5,
    "error_pairs": 5,
    "decoding": [{"name": "greedy"}],
}


def test_pretokenized_logkeys_split_train_report(kedro_project):
    own_experiment(kedro_project, "pretokenized")
    raw = write_demo_logkeys(kedro_project / "data/01_raw/logkeys.jsonl", n=300, seed=0)
    params = {
        "raw_path": str(raw.relative_to(kedro_project)),
        "split": SPLIT,
        "train": TRAIN,
        "report": REPORT,
    }
    for pipeline in ("split", "train", "report"):
        run_pipeline(kedro_project, pipeline, params)

    splits = pd.read_parquet(kedro_project / "data/03_primary/corpus_splits.parquet")
    rows = [json.loads(line)["ids"] for line in raw.read_text().splitlines()]
    assert set(splits["text"]) == {" ".join(map(str, ids)) for ids in rows}  # every row kept once
    fingerprint = json.loads(
        (kedro_project / "data/05_model_input/tokenized_corpus_fingerprint.json").read_text()
    )
    assert fingerprint["params"]["data_format"] == {
        "kind": "pretokenized",
        "ids_column": "ids",
        "vocab_size": VOCAB_SIZE,
        "eos_id": VOCAB_SIZE - 1,
        "pad_id": VOCAB_SIZE - 1,
    }
    config = json.loads((kedro_project / "data/06_models/model/config.json").read_text())
    assert config["vocab_size"] == VOCAB_SIZE and config["eos_token_id"] == VOCAB_SIZE - 1
    worst = pd.read_csv(kedro_project / "data/08_reporting/worst_samples.csv")
    assert len(worst) == 5 and worst["anomaly_score"].between(0, 1).all()
    for text in worst["text"]:  # the decoded ids, EOS last
        assert text.split()[-1] == str(VOCAB_SIZE - 1)
    metrics = json.loads((kedro_project / "data/08_reporting/test_metrics.json").read_text())
    assert 0 <= metrics["accuracy"] <= metrics["top5_accuracy"] <= 1

    # a file shaped like the training data (its ids column of lists) is predicted with no column named
    predict = {"input": params["raw_path"], "max_new_tokens": 3, "batch_size": 64}
    run_pipeline(kedro_project, "predict", {**params, "predict": predict})
    table = pd.read_csv(kedro_project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert table["input"].tolist() == [" ".join(map(str, ids)) for ids in rows]
    summary = json.loads((kedro_project / "data/08_reporting/predict_summary.json").read_text())
    limit = summary["input_limit"]  # the training length less max_new_tokens: longer rows keep their last ids
    assert (table["refused"] == "").all() and summary["input_column"] == "ids"
    assert table["input_tokens"].tolist() == [min(len(ids), limit) for ids in rows]
