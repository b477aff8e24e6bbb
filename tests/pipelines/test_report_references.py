"""The report's reference nodes on frames built here: plain text gives nothing, prompt/response data gives
predictions and ROUGE; test metrics are merged and logged to MLflow on this run and on the training run."""

import mlflow
import pandas as pd
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.errors import ConfigError, InputDataError
from fastlm.pipelines.report.nodes import collect_test_metrics, compare_training_runs, generate_on_references
from fastlm.reporting.references import PREDICTION_COLUMNS
from tests.support.reporting import pair_frame

TRAIN = {"runtime": {"device": "cpu", "precision": "fp32"}}
REPORT = {"references": {"max_samples": 5, "max_new_tokens": 4, "batch_size": 2}}


@pytest.fixture(scope="module")
def trained(bpe_tokenizer):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(bpe_tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        pad_token_id=0,
        eos_token_id=0,
        use_cache=False,
    )
    return {"model": LlamaForCausalLM(config), "tokenizer": bpe_tokenizer}


def test_plain_text_data_gives_no_predictions_and_no_metrics(trained):
    plain = pd.DataFrame({"text": ["a", "b"], "split": ["train", "test"]})
    table, metrics = generate_on_references(trained, plain, TRAIN, {}, REPORT)
    assert table.empty and list(table.columns) == PREDICTION_COLUMNS and metrics == {}


def test_prompt_response_data_gives_predictions_and_rouge(trained):
    table, metrics = generate_on_references(trained, pair_frame(), TRAIN, {}, REPORT)
    assert (
        len(table) == 5 == metrics["rouge_samples"] and table["reference"].str.startswith("배송 문의").all()
    )
    assert 0 <= metrics["rougeL"] <= 1 and metrics["rouge_tokenizer"] == "unicode"
    assert metrics["rouge1"] == pytest.approx(table["rouge1_f1"].mean())


def test_references_can_be_switched_off_or_required(trained):
    off = {"references": {**REPORT["references"], "enabled": False}}
    assert generate_on_references(trained, pair_frame(), TRAIN, {}, off)[1] == {}
    required = {"references": {"enabled": True}}
    with pytest.raises(InputDataError, match="report.references.enabled is true but .* no prompt/response"):
        generate_on_references(trained, pd.DataFrame({"text": ["a"], "split": ["test"]}), TRAIN, {}, required)
    with pytest.raises(ConfigError, match="report.references.num_beams"):
        generate_on_references(trained, pair_frame(), TRAIN, {}, {"references": {"num_beams": 0}})
    no_test = pair_frame().assign(split="train")
    with pytest.raises(InputDataError, match="test split .* is empty"):
        generate_on_references(trained, no_test, TRAIN, {}, REPORT)


@pytest.fixture
def experiment(mlflow_uri, tmp_path):
    """An experiment of its own in the session's tracking store; the global tracking URI reset afterwards."""
    mlflow.set_tracking_uri(mlflow_uri)
    mlflow.set_experiment(f"references-{tmp_path.name}")
    yield
    mlflow.set_tracking_uri(None)


def test_test_metrics_reach_this_run_and_the_training_run_and_the_comparison(experiment):
    with mlflow.start_run(run_name="train") as train_run:
        mlflow.log_metrics({"train/real_tokens_per_s": 100.0, "train/loss": 2.0})
    with mlflow.start_run(run_name="report") as report_run:
        merged = collect_test_metrics(
            {"loss": 2.5, "perplexity": 12.2},
            {"rouge1": 0.4, "rouge2": 0.1, "rougeL": 0.3, "rouge_tokenizer": "unicode"},
            {"mlflow_run_id": train_run.info.run_id},
        )
        runs = compare_training_runs({}, merged)
    assert merged["rouge1"] == 0.4 and merged["loss"] == 2.5 and merged["rouge_tokenizer"] == "unicode"
    client = mlflow.MlflowClient()
    for run in (train_run, report_run):
        logged = client.get_run(run.info.run_id).data.metrics
        assert (
            logged["test_rouge1"] == 0.4
            and logged["test_loss"] == 2.5
            and "test_rouge_tokenizer" not in logged
        )
        # how the ROUGE was scored: a tag beside the figures, which the comparison reads
        assert client.get_run(run.info.run_id).data.tags["test_rouge_tokenizer"] == "unicode"
    assert len(runs) == 1 and runs["test_rougeL"].tolist() == [0.3] and runs["test_loss"].tolist() == [2.5]


def test_quick_mode_keeps_every_report_feature_on_with_fewer_samples():
    from kedro.config import OmegaConfigLoader

    from fastlm.reporting.params import parse_report_params
    from fastlm.settings import CONFIG_LOADER_ARGS
    from tests.support.project import PROJECT_ROOT

    def report(env):
        loader = OmegaConfigLoader(str(PROJECT_ROOT / "conf"), env=env, **CONFIG_LOADER_ARGS)
        return parse_report_params(loader["parameters"]["report"])

    base, quick = report("local"), report("quick")
    assert quick.references.enabled == base.references.enabled == "auto"
    assert quick.references.max_samples < base.references.max_samples
    assert quick.eval_max_batches is not None and base.eval_max_batches is None
    assert quick.decoding == base.decoding and quick.prompts == base.prompts  # the same sections, shorter
    assert quick.references.decoding() == base.references.decoding()
