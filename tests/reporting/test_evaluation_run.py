"""The report's test-split evaluation (``reporting.evaluation_run``): the attention path it runs on."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig, LlamaForCausalLM

from fastlm.engine.config import parse_train_params
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime


@pytest.mark.parametrize(("max_length", "expected"), [(4096, "sdpa_varlen"), (320, "sdpa")])
def test_the_report_evaluates_long_rows_on_the_path_training_took(monkeypatch, max_length, expected):
    """A trained model loads on transformers' default path (``sdpa`` on CPU), and the report's test-split
    pass built the dense ``[rows, 1, T, T]`` mask whatever the rows' length (quadratic: 0.7 GiB a
    8,192-token row in training, ~10 GiB at 32,768), where training now takes ``sdpa_varlen`` for long CPU
    rows. The report runs on the path ``auto`` gives its rows, and the model is put back after."""
    from fastlm.engine.data.collators import TextEnds
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.evaluate import evaluation
    from fastlm.reporting.evaluation_run import evaluate_on_test

    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32,
        max_position_embeddings=max_length,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"  # as from_pretrained loads it on a CPU
    seen = {}

    def spy(model, dataset, **kwargs):
        seen["attn"], seen["model"] = kwargs["attn"], model.config._attn_implementation
        return "report"

    monkeypatch.setattr(evaluation, "evaluate", spy)
    monkeypatch.setattr(TokenSequences, "from_arrow", classmethod(lambda cls, *a, **k: None))
    monkeypatch.setattr(TextEnds, "of", classmethod(lambda cls, tokenizer: None))
    params = parse_train_params({"runtime": {"device": "cpu"}})
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    result = evaluate_on_test(
        model, None, {"test": None}, settings=(params, max_length, runtime), options=evaluation.EvalOptions()
    )
    assert result == "report"
    assert seen == {"attn": expected, "model": expected}
    assert model.config._attn_implementation == "sdpa"


def test_the_report_logs_no_attention_choice_it_does_not_evaluate_on(caplog):
    """Off a CPU the report evaluates on the path the model loaded with, but asked ``auto``'s choice anyway,
    which logged it: a GPU run's report said ``attention auto -> flex_attention`` (or flash-attention, or
    ``torch_varlen``) and then evaluated on ``sdpa``. No choice is logged there now, and the path is the
    loaded one."""
    import logging

    import torch

    from fastlm.reporting.evaluation_run import report_attention

    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32,
        max_position_embeddings=4096,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    params = parse_train_params({})
    with caplog.at_level(logging.INFO):
        attn = report_attention(model, params, 4096, torch.device("cuda"))
    assert attn == "sdpa"
    assert [r.getMessage() for r in caplog.records if "attention auto" in r.getMessage()] == []


@pytest.mark.parametrize(
    ("split", "checked"),
    [({"prompt_column": "dialogue", "response_column": "summary"}, True), ({}, False)],
    ids=["prompt_response", "plain_text"],
)
def test_reference_generations_that_leave_no_room_are_refused_before_the_first_report_file(
    monkeypatch, split, checked
):
    """``report.references.max_new_tokens`` at or past the model's positions: refused in evaluate_model,
    the report's first node, before its evaluation (and before its files are written). Was: refused in
    generate_on_references, after evaluate_model had rewritten error_pairs.csv, worst_samples.csv and
    sample_generations.csv. Plain-text data, which generates on no references, is not refused for it."""
    from fastlm.errors import ConfigError
    from fastlm.parameters import parse_group
    from fastlm.reporting import evaluation_run

    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32,
        max_position_embeddings=32,
    )  # fmt: skip
    evaluated = []

    def evaluate(*args, **kwargs):
        evaluated.append(True)
        raise RuntimeError("evaluated")

    monkeypatch.setattr(evaluation_run, "evaluate_on_test", evaluate)
    report = parse_group("report", {"max_new_tokens": 4, "references": {"max_new_tokens": 40}})
    settings = (parse_train_params({}), parse_group("split", {"max_length": 32, **split}), None)
    with pytest.raises(ConfigError if checked else RuntimeError) as refused:
        evaluation_run.evaluate_test_split(
            {"model": LlamaForCausalLM(config), "tokenizer": None},
            {"test": [0]},
            {},
            settings=settings,
            report=report,
            fingerprint_source="fingerprint.json",
        )
    if checked:
        assert "report.references.max_new_tokens = 40" in str(refused.value) and not evaluated


def test_references_required_of_plain_text_data_are_refused_before_the_first_report_file(monkeypatch):
    """``report.references.enabled: true`` on data without prompt/response columns (plain text,
    pre-tokenized ids): refused in evaluate_model, before its evaluation and files. Was: refused in
    generate_on_references, after evaluate_model had rewritten error_pairs.csv, worst_samples.csv and
    sample_generations.csv."""
    from fastlm.errors import InputDataError
    from fastlm.parameters import parse_group
    from fastlm.reporting import evaluation_run

    config = LlamaConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, vocab_size=32,
        max_position_embeddings=32,
    )  # fmt: skip
    monkeypatch.setattr(evaluation_run, "evaluate_on_test", lambda *a, **k: pytest.fail("evaluated"))
    report = parse_group("report", {"references": {"enabled": True, "max_new_tokens": 4}})
    settings = (parse_train_params({}), parse_group("split", {"max_length": 32}), None)
    with pytest.raises(InputDataError) as refused:
        evaluation_run.evaluate_test_split(
            {"model": LlamaForCausalLM(config), "tokenizer": None},
            {"test": [0]},
            {},
            settings=settings,
            report=report,
            fingerprint_source="fingerprint.json",
        )
    message = str(refused.value)
    assert "report.references.enabled is true" in message and "plain text" in message and "\n" not in message
