"""Benchmark: document-masked attention paths on CPU, on the project's default data and shape.

The measurement behind ``attn_implementation: auto`` on CPU (engine/attention.py). Default: the split
pipeline's tokenized corpus (``kedro run --pipeline=split`` first: the demo corpus, ``split.max_length`` 320),
the default tiny Llama (``ModelParams()``), packed batches of ``micro_batch_size`` 32 rows of 320 tokens, fp32.
For each path, the engine's own input builder (``attention.to_device``: dense bool mask for ``sdpa``, a
document-causal ``BlockMask`` for ``flex_attention``) and model call (``loss.forward_logits``):

* forward (no_grad, what evaluation runs): seconds per batch, mask building included, after ``--warmup``
  batches (flex_attention's first call compiles its kernel: that time is reported separately);
* forward + backward (training): flex_attention raises on CPU in torch 2.13 ("does not support backward on
  CPU"): reported as such.

    python benchmarks/attention_cpu.py                       # 3 warm-up + 10 timed batches per path
    python benchmarks/attention_cpu.py --batches 2 --warmup 1 --rows 4   # smoke run

Nothing is asserted; the figures are printed and, with ``--json``, written.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from time import perf_counter

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from fastlm.engine.attention import to_device  # noqa: E402
from fastlm.engine.config import ModelParams, parse_train_params  # noqa: E402
from fastlm.engine.data import pad_id_of  # noqa: E402
from fastlm.engine.data.token_dataset import TokenSequences  # noqa: E402
from fastlm.engine.loop import make_batching  # noqa: E402
from fastlm.engine.loss import causal_lm_loss_sum, forward_logits  # noqa: E402
from fastlm.engine.model import build_model  # noqa: E402


def _data(folder: Path):
    import datasets
    from transformers import AutoTokenizer

    tokenized = datasets.load_from_disk(str(folder / "data/05_model_input/tokenized_corpus"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "data/06_models/tokenizer"))
    return TokenSequences.from_arrow(tokenized["train"]), tokenizer


def _time(fn, warmup: int, batches: list) -> tuple[float, list[float]]:
    start = perf_counter()
    fn(batches[0])
    first = perf_counter() - start
    for batch in batches[1:warmup]:
        fn(batch)
    times = []
    for batch in batches[warmup:]:
        start = perf_counter()
        fn(batch)
        times.append(perf_counter() - start)
    return first, times


def measure(attn: str, dataset, tokenizer, *, rows: int, max_length: int, warmup: int, batches: int) -> dict:
    params = parse_train_params({"batching": {"mode": "packed", "micro_batch_size": rows}})
    sampler, collator = make_batching(params, dataset.lengths, pad_id=pad_id_of(tokenizer), max_length=max_length,
                                      attn=attn, seed=0)
    sampler.set_epoch(0)
    chosen = [collator(dataset.__getitems__(indices)) for _, indices in zip(range(warmup + batches), sampler,
                                                                               strict=False)]
    torch.manual_seed(0)
    model = build_model(ModelParams(), tokenizer, max_length=max_length, attn_implementation=attn)
    cpu = torch.device("cpu")

    def forward(batch):
        model.eval()
        with torch.no_grad():
            forward_logits(model, to_device(batch, cpu, attn))

    def train_step(batch):
        model.train()
        batch = to_device(batch, cpu, attn)
        loss, targets = causal_lm_loss_sum(forward_logits(model, batch), batch["labels"])
        (loss / targets).backward()
        model.zero_grad(set_to_none=True)

    record = {"attn": attn, "rows": rows, "row_length": max_length,
              "real_tokens_per_batch": statistics.fmean(int(b["num_real_tokens"]) for b in chosen)}
    first, times = _time(forward, warmup, chosen)
    record.update(forward_first_s=round(first, 3), forward_s=round(statistics.median(times), 4))
    try:
        first, times = _time(train_step, warmup, chosen)
        record.update(train_first_s=round(first, 3), train_step_s=round(statistics.median(times), 4))
    except NotImplementedError as error:
        record["train_step_s"] = f"not supported: {str(error).splitlines()[0]}"
    return record


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="folder holding data/05_model_input")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--paths", nargs="+", default=["sdpa", "flex_attention"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    dataset, tokenizer = _data(args.project)
    results = []
    for attn in args.paths:
        result = measure(attn, dataset, tokenizer, rows=args.rows, max_length=args.max_length, warmup=args.warmup,
                         batches=args.batches)
        results.append(result)
        print(json.dumps(result), flush=True)
    by = {r["attn"]: r for r in results}
    if {"sdpa", "flex_attention"} <= by.keys():
        ratio = by["flex_attention"]["forward_s"] / by["sdpa"]["forward_s"]
        print(f"forward, {args.rows} rows x {args.max_length}: flex_attention {by['flex_attention']['forward_s']} s "
              f"vs sdpa dense mask {by['sdpa']['forward_s']} s per batch (flex/sdpa = {ratio:.2f}); "
              f"flex first call (compile) {by['flex_attention']['forward_first_s']} s; "
              f"training: flex {by['flex_attention']['train_step_s']}, sdpa {by['sdpa']['train_step_s']} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
