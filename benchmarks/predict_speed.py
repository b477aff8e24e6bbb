"""Benchmark: the predict pipeline's generation path against the usual way, same model, same inputs.

Data: the first ``--rows`` demo dialogues (``data/01_raw/demo_dialogues.jsonl``) in file order, each wrapped
by the default prompt template. A byte-level BPE (``train_bpe_tokenizer``, vocab 2000) is trained on them; the
model is a Llama built from a config (hidden 128, 2 layers, 4 heads, vocab = len(tokenizer)) after
``torch.manual_seed(0)``, fp32, SDPA, ``torch.set_num_threads(--threads)``. Both contenders get the same
prompt ids (``prompt_token_ids``) and decode greedily ``--max-new-tokens`` tokens (stopping at EOS).

* ``fastlm``: ``fastlm.reporting.predict_inputs.input_rows`` + ``predictions.predict_rows`` (what ``kedro run
  --pipeline=predict`` runs without Kedro): rows sorted by length, batches of ``--batch-size``, left padding,
  KV cache, put back in input order.
* ``usual``: one ``model.generate`` per row in file order (batch of one, KV cache on, no padding).

The texts must be identical (greedy): PASS/FAIL is printed for that and for the speed target (fastlm >= 3x
the usual way's samples/s on CPU), with the machine, the other processes' CPU load and the versions.

    python benchmarks/predict_speed.py                  # 96 rows, 32 new tokens, batch 16
    python benchmarks/predict_speed.py --rows 24 --max-new-tokens 8    # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch
import transformers
from cpu_usage import busy_cpu_s  # sibling module: scripts run from benchmarks/

from fastlm.corpus.prompts import prompt_token_ids, render_prompt
from fastlm.corpus.tokenizer_source import train_bpe_tokenizer
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.reporting.predict_inputs import input_rows
from fastlm.reporting.predictions import PredictionJob, predict_rows

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "{prompt}\n\n### Response:\n"
TARGET = 3.0


def build(dialogues: list[str], folder: Path):
    tokenizer = train_bpe_tokenizer(dialogues, vocab_size=2000, min_frequency=2, model_max_length=1024)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=1024,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return transformers.AutoModelForCausalLM.from_pretrained(folder).eval(), tokenizer


def run_fastlm(model, tokenizer, dialogues, args, runtime) -> tuple[list[str], float]:
    start = time.perf_counter()
    rows = input_rows(
        pd.DataFrame({"dialogue": dialogues}),
        tokenizer,
        column=("predict.prompt_column", "dialogue"),
        template=TEMPLATE,
        id_column=None,
        limit=None,
        too_long="truncate",
        source="demo",
    )
    job = PredictionJob(
        decoding={"num_beams": 1, "do_sample": False},
        max_new_tokens=args.max_new_tokens,
        batch_size=args.batch_size,
    )
    table, _ = predict_rows(model, tokenizer, rows, job, runtime=runtime)
    return table["prediction"].tolist(), time.perf_counter() - start


def run_usual(model, tokenizer, dialogues, args) -> tuple[list[str], float]:
    start, texts = time.perf_counter(), []
    with torch.inference_mode():
        for dialogue in dialogues:
            ids = torch.tensor([prompt_token_ids(tokenizer, render_prompt(dialogue, TEMPLATE))])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=args.max_new_tokens,
                do_sample=False,
                pad_token_id=tokenizer.pad_token_id,
                use_cache=True,
            )
            texts.append(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).strip())
    return texts, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    lines = (ROOT / "data/01_raw/demo_dialogues.jsonl").read_text(encoding="utf-8").splitlines()
    dialogues = [json.loads(line)["dialogue"] for line in lines[: args.rows]]
    runtime = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=args.threads))
    with tempfile.TemporaryDirectory() as folder:
        model, tokenizer = build(dialogues, Path(folder))
    run_fastlm(model, tokenizer, dialogues[:4], args, runtime)  # warm-up: first-call costs out of both
    busy, own, wall_start = busy_cpu_s(), time.process_time(), time.perf_counter()
    usual, usual_s = run_usual(model, tokenizer, dialogues, args)
    fastlm, fastlm_s = run_fastlm(model, tokenizer, dialogues, args, runtime)
    foreign = max(busy_cpu_s() - busy - (time.process_time() - own), 0.0) / (time.perf_counter() - wall_start)
    ratio = usual_s / fastlm_s
    same = sum(a == b for a, b in zip(fastlm, usual, strict=True))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch threads "
        f"{torch.get_num_threads()}; other processes kept {foreign:.2f} cores busy meanwhile"
    )
    print(
        f"versions: python {sys.version.split()[0]}, torch {torch.__version__}, transformers "
        f"{transformers.__version__}"
    )
    print(
        f"{len(dialogues)} dialogues, greedy, max_new_tokens {args.max_new_tokens}, batch {args.batch_size}"
    )
    print(
        f"usual (model.generate per row, file order): {usual_s:.2f} s = "
        f"{len(dialogues) / usual_s:.2f} samples/s"
    )
    print(
        f"fastlm predict (sorted batches, left padding): {fastlm_s:.2f} s = {len(dialogues) / fastlm_s:.2f} "
        "samples/s"
    )
    print(f"identical greedy outputs: {same}/{len(dialogues)} {'PASS' if same == len(dialogues) else 'FAIL'}")
    print(
        f"fastlm / usual = {ratio:.2f}x   target >= {TARGET:.0f}x on CPU: "
        f"{'PASS' if ratio >= TARGET else 'FAIL'}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": len(dialogues),
                    "usual_s": usual_s,
                    "fastlm_s": fastlm_s,
                    "ratio": ratio,
                    "identical": same,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
