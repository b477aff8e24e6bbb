"""The train pipeline end to end through a KedroSession: split -> train on a tiny config."""

import json

import pandas as pd
import pytest

from fastlm.errors import ConfigError, StaleDataError, find_user_error
from tests.support.e2e import SPLIT, TRAIN
from tests.support.project import run_pipeline

pytestmark = pytest.mark.e2e


def test_train_writes_a_loadable_model_histories_summary_and_live_mlflow_metrics(kedro_project):
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    run_pipeline(kedro_project, "train", {"split": SPLIT, "train": TRAIN})

    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    folder = kedro_project / "data/06_models/model"
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert (folder / "model.safetensors").is_file() and model.config.vocab_size == len(tokenizer)
    generated = pipeline("text-generation", model=model, tokenizer=tokenizer)(
        "배송", max_new_tokens=5, do_sample=False
    )
    assert generated[0]["generated_text"].startswith("배송")
    # batched, as a user's pipeline generates (it pads a decoder-only model's rows on the left): each row is
    # what it is alone
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompts = ["배송", "The battery lasted all"]
    alone = [generator(prompt, max_new_tokens=4, do_sample=False)[0]["generated_text"] for prompt in prompts]
    batched = generator(prompts, max_new_tokens=4, do_sample=False, batch_size=2)
    assert [out[0]["generated_text"] for out in batched] == alone

    history = pd.read_csv(kedro_project / "data/07_model_output/train_history.csv")
    assert list(history["step"])[-1] == 6 and history["loss"].notna().all()
    evals = pd.read_csv(kedro_project / "data/07_model_output/eval_history.csv")
    assert list(evals["step"]) == [3, 6] and (evals["val_perplexity"] > 1).all()
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert summary["steps"] == 6 and summary["batching"] == "packed" and summary["tokens_seen"] > 0
    assert (
        kedro_project / "data/06_models/checkpoints" / summary["run_name"] / "checkpoint-00000006/COMPLETE"
    ).is_file()

    import mlflow

    client = mlflow.MlflowClient()
    runs = client.search_runs(
        client.get_experiment_by_name("fastlm").experiment_id,
        filter_string="tags.`mlflow.runName` LIKE 'train-%'",
        max_results=1,
    )
    run = runs[0]
    # every history row reaches MLflow, the one flushed before the step-3 checkpoint included
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == list(history["step"])
    assert list(history["step"]) == [1, 2, 3, 4, 6]
    assert run.data.params["train.batching.mode"] == "packed" and "runtime.precision" in run.data.params
    artifacts = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"model", "train_summary.json"} <= artifacts


@pytest.mark.parametrize(
    ("train", "split_override", "error", "expected"),
    [
        ({}, {"max_length": 64}, StaleDataError, "max_length 48 -> 64"),
        ({"batching": {"mode": "padded"}}, {}, ConfigError, "train.batching.mode"),
        ({"model": {"name_or_path": "./no/model"}}, {}, ConfigError, "train.model.name_or_path"),
    ],
)
def test_bad_train_input_is_one_clear_error(kedro_project, train, split_override, error, expected):
    run_pipeline(kedro_project, "split", {"split": SPLIT})
    with pytest.raises(Exception) as raised:
        run_pipeline(
            kedro_project, "train", {"split": {**SPLIT, **split_override}, "train": {**TRAIN, **train}}
        )
    user_error = find_user_error(raised.value)
    assert isinstance(user_error, error) and expected in str(user_error)
    assert not (kedro_project / "data/06_models/model").exists()
