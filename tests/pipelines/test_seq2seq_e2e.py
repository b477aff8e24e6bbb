"""split -> train -> report with a tiny BART folder (issue 19): the dialogue feeds the encoder, the summary is
the decoder target; the report's evaluation loss and ROUGE come from the model's own decoding, and the run
sits in the same comparison table as decoder-only runs."""

import json

import pandas as pd
import pytest

from tests.support.dialogues import RAW, REPORT, SPLIT, TOPICS, write_dialogues
from tests.support.project import run_pipeline

pytestmark = pytest.mark.e2e
MODEL = "models/bart"
TRAIN = {
    "max_steps": 25,
    "log_every": 5,
    "eval_every": 25,
    "save_every": 25,
    "quiet": True,
    "batching": {"micro_batch_size": 8},
    "optimizer": {"lr": 1e-2, "warmup_steps": 2},
    "model": {"name_or_path": f"./{MODEL}"},
}
PARAMS = {
    "raw_path": RAW,
    "split": SPLIT,
    "train": TRAIN,
    "report": {
        **REPORT,
        "references": {
            **REPORT["references"],
            "num_beams": 2,
            "no_repeat_ngram_size": 3,
            "length_penalty": 1.2,
        },
    },
}


def save_tiny_bart(project, vocab_from: str = "data/06_models/tokenizer"):
    """A tiny BART over the split's tokenizer, saved with that tokenizer (its own), as save_pretrained
    writes."""
    import torch
    from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(project / vocab_from, local_files_only=True)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    torch.manual_seed(0)
    model = BartForConditionalGeneration(
        BartConfig(
            vocab_size=len(tokenizer),
            d_model=32,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=64,
            decoder_ffn_dim=64,
            max_position_embeddings=64,
            pad_token_id=pad,
            eos_token_id=eos,
            bos_token_id=tokenizer.bos_token_id,
            decoder_start_token_id=eos,
            forced_eos_token_id=None,
            dropout=0.0,
        )
    )
    model.save_pretrained(project / MODEL)
    tokenizer.save_pretrained(project / MODEL)


def test_bart_trains_on_dialogues_and_is_scored_with_rouge_beside_decoder_runs(kedro_project):
    write_dialogues(kedro_project / RAW)
    run_pipeline(kedro_project, "split", PARAMS)
    save_tiny_bart(kedro_project)
    run_pipeline(kedro_project, "train", PARAMS)
    run_pipeline(kedro_project, "report", PARAMS)

    trained = json.loads((kedro_project / "data/06_models/model/config.json").read_text())
    assert trained["architectures"] == ["BartForConditionalGeneration"]
    history = pd.read_csv(kedro_project / "data/07_model_output/train_history.csv")
    assert history["loss"].iloc[-1] < history["loss"].iloc[0] - 1.0
    summary = json.loads((kedro_project / "data/08_reporting/train_summary.json").read_text())
    assert (
        summary["batching"] == "packed"
    )  # the default: BART packs exactly on sdpa (tests/engine/data/test_seq2seq_packing.py)
    out = kedro_project / "data/08_reporting"
    metrics = json.loads((out / "test_metrics.json").read_text())
    assert metrics["loss"] > 0 and metrics["perplexity"] > 1
    assert metrics["rouge_decoding"].startswith("beam search, num_beams=2")
    assert "length_penalty=1.2" in metrics["rouge_decoding"]
    predictions = pd.read_csv(out / "reference_predictions.csv", keep_default_na=False)
    assert len(predictions) == 12 and set(predictions["reference"]) <= set(TOPICS.values())
    assert metrics["rouge1"] == pytest.approx(predictions["rouge1_f1"].mean())
    assert metrics["rouge1"] > 0.5, predictions[["reference", "prediction"]]
    runs = pd.read_csv(out / "run_comparison.csv")
    assert runs["test_rouge1"].iloc[0] == pytest.approx(metrics["rouge1"])


INPUTS = ["summarize the dialogue please", "a short summary of it", "please summarize"]


def _save_bart_style(folder):
    """A tiny BART from a config, saved with a tokenizer that frames a text as BART's does (``<s> text
    </s>``), as a model folder from elsewhere is."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    from tests.support.tiny_seq2seq import SMALL_BART_LAYERS, bart_style_tokenizer

    tokenizer = bart_style_tokenizer()
    torch.manual_seed(0)
    model = BartForConditionalGeneration(
        BartConfig(
            vocab_size=len(tokenizer),
            **SMALL_BART_LAYERS,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            decoder_start_token_id=tokenizer.eos_token_id,
            forced_eos_token_id=None,
            init_std=0.2,
        )
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def test_predict_counts_the_input_tokens_a_bart_encoder_is_fed(kedro_project):
    """``input_tokens`` of a BART-style model is the encoder row it was fed: ``tokenizer(text)``, ``<s> text
    </s>``, as Hugging Face's summarization recipe encodes a source. Was: the row without the ``</s>`` that
    generation adds after each prompt (one token short)."""
    tokenizer = _save_bart_style(kedro_project / "data/06_models/model")
    (kedro_project / "data/01_raw/inputs.jsonl").write_text(
        "".join(json.dumps({"text": text}) + "\n" for text in INPUTS), encoding="utf-8"
    )
    run_pipeline(
        kedro_project,
        "predict",
        {
            "predict": {"input": "data/01_raw/inputs.jsonl", "max_new_tokens": 3},
            "train": {"runtime": {"device": "cpu", "precision": "fp32"}},
        },
    )
    table = pd.read_csv(kedro_project / "data/07_model_output/predictions.csv", keep_default_na=False)
    assert table["refused"].tolist() == [""] * len(INPUTS)
    fed = [len(tokenizer(text)["input_ids"]) for text in INPUTS]
    assert table["input_tokens"].tolist() == fed, table[["input", "input_tokens"]]


def test_the_reports_reference_generations_count_the_prompt_tokens_a_bart_encoder_is_fed(tmp_path):
    """The report's ``prompt_tokens`` of a BART-style model: the encoder row its reference generation was fed
    (``<s> prompt </s>``), the count predict gives the same prompt. Was: without the ``</s>``."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.reporting.params import ReferenceParams
    from fastlm.reporting.references import score_test_generations

    _save_bart_style(tmp_path / "bart")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "bart").eval()
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "bart")
    pairs = pd.DataFrame(
        {"sample": range(len(INPUTS)), "prompt": INPUTS, "response": ["a summary"] * len(INPUTS)}
    )
    table, _ = score_test_generations(
        model,
        tokenizer,
        pairs,
        references=ReferenceParams(max_new_tokens=3, batch_size=2, num_beams=1, do_sample=False),
        max_length=32,
        runtime=setup_runtime(RuntimeConfig(device="cpu", precision="fp32")),
    )
    fed = [len(tokenizer(prompt)["input_ids"]) for prompt in INPUTS]
    assert table["prompt_tokens"].tolist() == fed
