"""Interleaved A/B timings of the issue-16 speed levers on the 5.2 M shape (one process, alternating).

Each lever is timed as whole training steps (forward, backward, AdamW step) on the engine's own packed
batches of the realistic short-text profile, A and B alternated ``--rounds`` times, ``--steps`` steps each
time, and the medians of the per-step times compared. Measuring A and B in the same process, interleaved,
keeps a shared machine's load from favouring one side; the absolute figures still move with the load.

    python benchmarks/issue16_ab.py --workdir WORK --lever loss        # full log-softmax vs chunked CE
    python benchmarks/issue16_ab.py --workdir WORK --lever loss --row-length 320  # the same on 32 x 320 rows
    python benchmarks/issue16_ab.py --workdir WORK --lever row_length  # rows of 320 vs 128 vs 64 tokens
    # dense mask vs sdpa_varlen
    python benchmarks/issue16_ab.py --workdir WORK --lever attention --precision bf16
    # every logit vs targets only
    python benchmarks/issue16_ab.py --workdir WORK --lever logits --precision bf16
    python benchmarks/issue16_ab.py --workdir WORK --lever logits --prompt-share 0.6   # the same, as SFT data
    # each compiled
    python benchmarks/issue16_ab.py --workdir WORK --lever attention --precision bf16 --compile

``--compile``: every variant trains its own ``torch.compile``d copy of the same initial model (compiled during
the warm-up, which is not timed). The attention lever compares ``sdpa`` (the bool block-causal mask),
``eager`` (the same mask, additive) and ``sdpa_varlen``.

``--prompt-share F`` makes the first ``F`` of every text's tokens its prompt (no loss on them), as
prompt/response data has: the texts stay the same, only which tokens are targets changes.

Every variant keeps the micro-batch's token budget (``--rows`` x ``--max-length`` tokens).

``WORK`` holds ``tokens.npz`` and ``tokenizer/`` from ``train_speed.prepare`` (20,000 realistic texts, the
5.2 M shape's tokenizer); a folder without them is prepared first.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fastlm.engine.batching import make_batching
from fastlm.engine.config import ModelParams, parse_train_params
from fastlm.engine.data import schema
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.model import accumulation
from fastlm.engine.model import loss as loss_module
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.build import build_model

SHAPE = {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4, "num_attention_heads": 4}


def full_log_softmax_loss_sum(logits, targets, ignore_index=schema.IGNORE_INDEX, **_):
    """The loss before issue 16 (``loss.cross_entropy_sum``'s signature): one full fp32 log-softmax over
    [tokens x vocab] and its gradient."""
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index, reduction="sum")


def batches_for(
    dataset, params, pad_id: int, max_length: int, count: int, attn: str = "sdpa", **batching
) -> list[dict]:
    params = parse_train_params({**params, "batching": {**params["batching"], **batching}})
    sampler, collator = make_batching(params, dataset.lengths, pad_id=pad_id, max_length=max_length, seed=0)
    chosen = sampler.epoch_batches()[:count]
    return [
        to_device(collator(dataset.__getitems__(batch.tolist())), torch.device("cpu"), attn)
        for batch in chosen
    ]


def load_prepared(work: Path, max_length: int = 320):
    """The tokenizer and token sequences in ``work`` (``train_speed.prepare``: 20,000 realistic texts, the
    5.2 M shape's tokenizer), prepared there first when missing."""
    from transformers import AutoTokenizer

    if not (work / "tokens.npz").is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from train_speed import prepare

        work.mkdir(parents=True, exist_ok=True)
        print(
            f"preparing {work} (train_speed.prepare: 20,000 realistic texts, 5.2 M tokenizer) ...", flush=True
        )
        prepare(work, 20000, max_length, "realistic", "5m")
    tokenizer = AutoTokenizer.from_pretrained(str(work / "tokenizer"))
    with np.load(work / "tokens.npz") as data:
        return tokenizer, TokenSequences(data["values"], data["offsets"])


def initial_model(tokenizer, seed: int, max_length: int = 320):
    """The 5.2 M shape in training mode, from ``torch.manual_seed(seed)`` (the same weights for the same
    seed)."""
    torch.manual_seed(seed)
    return build_model(
        ModelParams(attn_implementation="sdpa", **SHAPE),
        tokenizer,
        max_length=max_length,
        attn_implementation="sdpa",
    ).train()


def add_curve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options the loss-curve scripts share (precision_parity, loss_parity)."""
    parser.add_argument("--workdir", required=True, help="train_speed.prepare output (prepared when missing)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=2)


def timed_steps(model, optimizer, batches, steps: int, autocast=contextlib.nullcontext) -> tuple[float, int]:
    """Seconds per step (median over ``steps``) and real tokens per step (mean)."""
    times, real = [], 0
    for index in range(steps):
        batch = batches[index % len(batches)]
        start = time.perf_counter()
        accumulation.accumulate_gradients(model, [batch], autocast=autocast)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        real += int(batch["num_real_tokens"])
    return statistics.median(times), real // steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--lever", choices=("loss", "row_length", "attention", "logits"), required=True)
    parser.add_argument(
        "--prompt-share",
        type=float,
        default=0.0,
        help="this share of each text's tokens is its prompt (no loss), as in prompt/response data",
    )
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="bf16: autocast on CPU around forward and loss, as runtime.precision bf16",
    )
    parser.add_argument(
        "--model",
        choices=("5m", "tiny"),
        default="5m",
        help="5m: the issue's shape; tiny: the project default (hidden 128, 2 layers)",
    )
    parser.add_argument("--compile", action="store_true", help="each variant on its own compiled model copy")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--row-length", default="auto", help="packed row length of the loss lever (auto or N)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, dataset = load_prepared(Path(args.workdir))
    if args.prompt_share:
        prompts = np.minimum((dataset.lengths * args.prompt_share).astype(np.int64), dataset.lengths - 1)
        dataset = TokenSequences(dataset.values, dataset.offsets, np.maximum(prompts, 0))
    torch.manual_seed(0)
    shape = SHAPE if args.model == "5m" else {}
    model = build_model(
        ModelParams(attn_implementation="sdpa", **shape),
        tokenizer,
        max_length=args.max_length,
        attn_implementation="sdpa",
    ).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    params = {
        "model": {"attn_implementation": "sdpa", **shape},
        "batching": {"mode": "packed", "micro_batch_size": args.rows},
    }
    pad_id = int(tokenizer.pad_token_id)
    new_loss = loss_module.cross_entropy_sum
    if args.lever == "loss":
        row_length = args.row_length if args.row_length == "auto" else int(args.row_length)
        batches = batches_for(dataset, params, pad_id, args.max_length, args.steps, row_length=row_length)
        variants = {"full_log_softmax": (full_log_softmax_loss_sum, batches), "chunked": (new_loss, batches)}
    elif args.lever == "logits":  # the same packed rows; the LM head on every position vs on targets only
        batches = batches_for(dataset, params, pad_id, args.max_length, args.steps)
        every = [
            {key: value for key, value in batch.items() if key != schema.TARGET_POSITIONS}
            for batch in batches
        ]
        variants = {"every logit": (new_loss, every), "target logits only": (new_loss, batches)}
    elif (
        args.lever == "attention"
    ):  # the same packed rows; the dense bool / additive mask vs per-sample buckets
        variants = {
            attn: (new_loss, batches_for(dataset, params, pad_id, args.max_length, args.steps, attn=attn))
            for attn in ("sdpa", "eager", "sdpa_varlen")
        }
    else:
        variants = {}
        budget = args.rows * args.max_length
        for length in (args.max_length, 128, 64):
            rows = budget // length
            variants[f"rows {rows} x {length}"] = (
                new_loss,
                batches_for(dataset, params, pad_id, args.max_length, args.steps, row_length=length),
            )
    autocast = (
        functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
        if args.precision == "bf16"
        else contextlib.nullcontext
    )

    compiled = {}  # --compile: name -> (compiled copy, its optimizer); the copies start from the same weights
    for name in variants if args.compile else ():
        torch.manual_seed(0)
        copy = build_model(
            ModelParams(attn_implementation="sdpa", **shape),
            tokenizer,
            max_length=args.max_length,
            attn_implementation="sdpa",
        ).train()
        copy.config._attn_implementation = name if args.lever == "attention" else "sdpa"
        compiled[name] = (torch.compile(copy), torch.optim.AdamW(copy.parameters(), lr=1e-4))

    def use(name: str, function):
        accumulation.cross_entropy_sum = function
        model.config._attn_implementation = name if args.lever == "attention" else "sdpa"
        return compiled.get(name, (model, optimizer))

    results: dict[str, list[float]] = {name: [] for name in variants}
    real_tokens: dict[str, int] = {}
    for name, (function, batches) in variants.items():  # warm-up (and compile), untimed
        timed_steps(*use(name, function), batches, 2, autocast)
    for _ in range(args.rounds):
        for name, (function, batches) in variants.items():
            seconds, real_tokens[name] = timed_steps(*use(name, function), batches, args.steps, autocast)
            results[name].append(seconds)
    accumulation.cross_entropy_sum = new_loss
    first = next(iter(results))
    base = real_tokens[first] / statistics.median(results[first])
    print(
        f"lever {args.lever}: model {args.model}, {args.precision}{', compiled' if args.compile else ''}, "
        f"{args.rounds} rounds x {args.steps} steps, "
        f"{torch.get_num_threads()} threads (medians)"
    )
    for name, times in results.items():
        rate = real_tokens[name] / statistics.median(times)
        print(
            f"  {name:<20} step {statistics.median(times):.3f} s  real tok/s {rate:,.0f}  "
            f"x{rate / base:.2f} vs {first}   (steps: {', '.join(f'{t:.3f}' for t in times)})"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
