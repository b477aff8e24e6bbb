"""Dialogue -> summary data with LoRA, end to end through KedroSession: split on prompt/response columns with
a local Llama-style model's tokenizer, LoRA fine-tuning from that local folder (offline), the adapter saved
and loaded back, merged into a full model by the merge command, and stale data refused."""

import json

import datasets
import pandas as pd
import pytest
import torch
from demo_data.dialogues import make_dialogues

from fastlm.corpus.prompts import prompt_token_ids, truncate_prompt_ids
from fastlm.errors import StaleDataError, find_user_error
from tests.support.project import run_pipeline
from tests.support.tiny_llama import llama_style_tokenizer, save_tiny_llama
from tests.support.tolerances import MERGED_ADAPTER_ATOL

pytestmark = [pytest.mark.e2e, pytest.mark.kernels]  # kernels: the merged adapter vs the unmerged one
TEMPLATE = "{prompt}\n\nSummary:\n"


@pytest.fixture
def dialogue_project(kedro_project):
    rows = make_dialogues(160, seed=1)
    path = kedro_project / "data/01_raw/dialogues.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tokenizer = llama_style_tokenizer([r["dialogue"] + "\n" + r["summary"] for r in rows], vocab_size=600)
    save_tiny_llama(kedro_project / "base", tokenizer)
    return kedro_project


def split_params(project, **overrides):
    return {
        "prompt_column": "dialogue",
        "response_column": "summary",
        "prompt_template": TEMPLATE,
        "max_length": 256,
        "tokenizer": {"source": str(project / "base")},
        **overrides,
    }


def train_params(project):
    return {
        "max_steps": 4,
        "log_every": 1,
        "eval_every": 2,
        "save_every": 2,
        "quiet": True,
        "batching": {"micro_batch_size": 4},
        "optimizer": {"lr": 1e-2, "warmup_steps": 1},
        "model": {
            "name_or_path": str(project / "base"),
            "gradient_checkpointing": True,
            "lora": {"enabled": True, "r": 4, "alpha": 8},
        },
    }


def test_dialogue_summary_lora_run_saves_an_adapter_that_loads_and_merges(dialogue_project):
    project = dialogue_project
    raw = {"raw_path": "data/01_raw/dialogues.jsonl"}
    run_pipeline(project, "split", {**raw, "split": split_params(project)})

    splits = pd.read_parquet(project / "data/03_primary/corpus_splits.parquet")
    assert list(splits.columns) == ["prompt", "response", "split"]
    assert (
        splits["prompt"].str.endswith("\n\nSummary:\n").all()
        and not splits["response"].str.endswith("</s>").any()
    )
    tokenized = datasets.load_from_disk(str(project / "data/05_model_input/tokenized_corpus"))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(project / "base", local_files_only=True)
    train_rows = splits[splits["split"] == "train"].reset_index(drop=True)
    index = next(
        i
        for i, row in train_rows.iterrows()  # a dialogue short enough not to be truncated
        if len(prompt_token_ids(tokenizer, row["prompt"]))
        + len(tokenizer(row["response"], add_special_tokens=False)["input_ids"])
        + 1
        <= 256
    )
    first, row = tokenized["train"][index], train_rows.iloc[index]
    prompt_ids = prompt_token_ids(tokenizer, row["prompt"])
    assert first["input_ids"][: first["prompt_length"]] == prompt_ids
    assert truncate_prompt_ids(prompt_ids, 10, tokenizer.bos_token_id) == [prompt_ids[0], *prompt_ids[-9:]]
    assert (
        first["input_ids"][first["prompt_length"] : -1]
        == tokenizer(row["response"], add_special_tokens=False)["input_ids"]
    )
    assert (
        first["input_ids"][-1] == tokenizer.eos_token_id and first["input_ids"][0] == tokenizer.bos_token_id
    )

    run_pipeline(project, "train", {**raw, "split": split_params(project), "train": train_params(project)})
    folder = project / "data/06_models/model"
    assert (folder / "adapter_config.json").is_file() and (folder / "adapter_model.safetensors").is_file()
    assert (folder / "tokenizer_config.json").is_file() and not (folder / "model.safetensors").exists()
    summary = json.loads((project / "data/08_reporting/train_summary.json").read_text())
    assert summary["lora"] is True and summary["batching"] == "packed"
    assert 0 < summary["trainable_parameters"] < summary["total_parameters"]
    assert (
        project / "data/06_models/checkpoints" / summary["run_name"] / "checkpoint-00000004/COMPLETE"
    ).is_file()

    from fastlm.__main__ import merge_adapter_command
    from fastlm.datasets import PretrainedModelDataset

    loaded = PretrainedModelDataset(filepath=str(folder)).load()
    assert merge_adapter_command(["--adapter", str(folder), "--out", str(project / "merged")]) == 0
    assert merge_adapter_command(["--adapter", str(folder), "--out", str(project / "merged")]) == 2  # kept
    # how its training data was made travels with the merged model (predict reads it)
    record = (folder / "training_data.json").read_text()
    assert json.loads(record)["data_format"]["kind"] == "prompt_response"
    assert (project / "merged" / "training_data.json").read_text() == record
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(project / "merged", local_files_only=True).eval()
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        unmerged = loaded["model"].eval()(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, unmerged, rtol=0, atol=MERGED_ADAPTER_ATOL)
        generated = merged.generate(ids, max_new_tokens=4, do_sample=False)
    assert generated.shape[1] > ids.shape[1]

    with pytest.raises(Exception) as raised:  # another template: the tokenized data no longer fits
        run_pipeline(
            project,
            "train",
            {
                **raw,
                "split": split_params(project, prompt_template="Q: {prompt}\nA:"),
                "train": train_params(project),
            },
        )
    error = find_user_error(raised.value)
    assert isinstance(error, StaleDataError) and "prompt_template changed" in str(error)
