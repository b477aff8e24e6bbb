"""Benchmark: document-masked attention paths on CPU, on the project's default data and shape.

The measurement behind ``attn_implementation: auto`` on CPU (engine/model/attention/). Default: the split
pipeline's tokenized corpus (``kedro run --pipeline=split`` first: the demo corpus, ``split.max_length`` 320),
the default tiny Llama (``ModelParams()``), packed batches of ``micro_batch_size`` 32 rows of 320 tokens,
fp32. For each path, the engine's own input builder (``attention.inputs.to_device``: dense bool mask for
``sdpa``, a document-causal ``BlockMask`` for ``flex_attention``) and model call (``loss.forward_logits``):

* forward (no_grad, what evaluation runs): median seconds per batch, mask building included, after
  ``--warmup`` batches (flex_attention's first call compiles its kernel: that time is reported separately),
  the paths interleaved batch by batch (a shared machine's load then hits them alike);
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

from fastlm.engine.batching import make_batching  # noqa: E402
from fastlm.engine.config import ModelParams, parse_train_params  # noqa: E402
from fastlm.engine.data import pad_id_of  # noqa: E402
from fastlm.engine.data.token_dataset import TokenSequences  # noqa: E402
from fastlm.engine.model.attention.inputs import to_device  # noqa: E402
from fastlm.engine.model.build import build_model  # noqa: E402
from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits  # noqa: E402


def _data(folder: Path):
    import datasets
    from transformers import AutoTokenizer

    tokenized = datasets.load_from_disk(str(folder / "data/05_model_input/tokenized_corpus"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "data/06_models/tokenizer"))
    return TokenSequences.from_arrow(tokenized["train"]), tokenizer


class Path_:
    """One attention path: its batches (the engine's collator), its model (same initial weights) and steps."""

    def __init__(self, attn: str, dataset, tokenizer, *, rows: int, max_length: int, count: int) -> None:
        params = parse_train_params({"batching": {"mode": "packed", "micro_batch_size": rows}})
        sampler, collator = make_batching(
            params, dataset.lengths, pad_id=pad_id_of(tokenizer), max_length=max_length, seed=0
        )
        sampler.set_epoch(0)
        self.attn, self.rows, self.max_length = attn, rows, max_length
        self.batches = [
            collator(dataset.__getitems__(indices)) for _, indices in zip(range(count), sampler, strict=False)
        ]
        torch.manual_seed(0)
        self.model = build_model(ModelParams(), tokenizer, max_length=max_length, attn_implementation=attn)
        self.cpu = torch.device("cpu")

    def forward(self, batch) -> None:
        self.model.eval()
        with torch.no_grad():
            forward_logits(self.model, to_device(batch, self.cpu, self.attn))

    def train_step(self, batch) -> None:
        self.model.train()
        batch = to_device(batch, self.cpu, self.attn)
        loss, targets = causal_lm_loss_sum(forward_logits(self.model, batch), batch["labels"])
        (loss / targets).backward()
        self.model.zero_grad(set_to_none=True)


def _timed(fn, batch) -> float:
    start = perf_counter()
    fn(batch)
    return perf_counter() - start


def measure(paths: list[Path_], warmup: int, train: bool = True) -> list[dict]:
    """Warm-up (first call apart: compile), then the timed batches, the paths interleaved batch by batch so
    that a change of load on a shared machine hits them alike."""
    records = []
    for path in paths:
        record = {
            "attn": path.attn,
            "rows": path.rows,
            "row_length": path.max_length,
            "real_tokens_per_batch": statistics.fmean(int(b["num_real_tokens"]) for b in path.batches),
            "forward_first_s": round(_timed(path.forward, path.batches[0]), 3),
        }
        for batch in path.batches[1:warmup]:
            path.forward(batch)
        if not train:
            record["train_step_s"] = "not measured (--forward-only)"
            records.append(record)
            continue
        try:
            record["train_first_s"] = round(_timed(path.train_step, path.batches[0]), 3)
            for batch in path.batches[1:warmup]:
                path.train_step(batch)
        except NotImplementedError as error:
            record["train_step_s"] = f"not supported: {str(error).splitlines()[0]}"
        records.append(record)
    forward = {path.attn: [] for path in paths}
    steps = {path.attn: [] for path in paths}
    for index in range(warmup, len(paths[0].batches)):
        for path, record in zip(paths, records, strict=True):
            forward[path.attn].append(_timed(path.forward, path.batches[index]))
            if "train_step_s" not in record:
                steps[path.attn].append(_timed(path.train_step, path.batches[index]))
    for path, record in zip(paths, records, strict=True):
        record["forward_s"] = round(statistics.median(forward[path.attn]), 4)
        if steps[path.attn]:
            record["train_step_s"] = round(statistics.median(steps[path.attn]), 4)
    return records


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--project", type=Path, default=ROOT, help="folder holding data/05_model_input")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--paths", nargs="+", default=["sdpa", "flex_attention"])
    parser.add_argument("--forward-only", action="store_true", help="no training steps (forward only)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    dataset, tokenizer = _data(args.project)
    paths = [
        Path_(
            attn,
            dataset,
            tokenizer,
            rows=args.rows,
            max_length=args.max_length,
            count=args.warmup + args.batches,
        )
        for attn in args.paths
    ]
    results = measure(paths, args.warmup, train=not args.forward_only)
    for result in results:
        print(json.dumps(result), flush=True)
    by = {r["attn"]: r for r in results}
    if {"sdpa", "flex_attention"} <= by.keys():
        ratio = by["flex_attention"]["forward_s"] / by["sdpa"]["forward_s"]
        print(
            f"forward, {args.rows} rows x {args.max_length}: flex_attention "
            f"{by['flex_attention']['forward_s']} s "
            f"vs sdpa dense mask {by['sdpa']['forward_s']} s per batch (flex/sdpa = {ratio:.2f}); "
            f"flex first call (compile) {by['flex_attention']['forward_first_s']} s; "
            f"training: flex {by['flex_attention']['train_step_s']}, sdpa {by['sdpa']['train_step_s']} s"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
