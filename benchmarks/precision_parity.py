"""Loss curves in fp32 and in bf16 autocast on CPU, same weights, same batches, same optimizer (issue 16).

Evidence for choosing bf16 on CPUs that do bf16 natively (``torch.cpu._is_avx512_bf16_supported()`` or AMX):
speed may only be bought without changing what is learnt. The 5.2 M shape (``issue16_ab.SHAPE``) is built
from ``torch.manual_seed(0)`` twice (identical weights); one trains ``--steps`` AdamW steps in fp32 and
another the same steps under ``torch.autocast("cpu", torch.bfloat16)``, both on the engine's own packed
batches of the realistic short-review profile (``train_speed.prepare``; one epoch is about 19 batches,
repeated for more steps) and the engine's loss (``accumulation.accumulate_gradients``: summed
per-token cross-entropy over the step's target tokens, computed in fp32). Printed: the loss per target token
every ``--every`` steps for both, the mean and largest absolute difference, the batch-to-batch noise of the
fp32 curve (standard deviation of consecutive-step differences over the second half), and seconds per step.
With ``--seed-control`` a third curve, fp32 from ``torch.manual_seed(1)`` weights on the same batches, gives
the seed-to-seed gap of two honest fp32 runs: the noise floor the bf16 gap is read against. With
``--bf16-weights`` another curve: the same bf16 autocast over bf16 weights whose fp32 masters AdamW updates
(``train.runtime.param_dtype: bf16``, engine/train/master_weights.py), against fp32 and against autocast over
fp32 weights. Nothing is asserted.

    python benchmarks/precision_parity.py --workdir /tmp/ab16 --steps 60
    python benchmarks/precision_parity.py --workdir /tmp/ab16 --steps 60 --seed-control
    python benchmarks/precision_parity.py --workdir /tmp/ab16 --steps 60 --bf16-weights
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from issue16_ab import SHAPE, add_curve_arguments, batches_for, initial_model, load_prepared  # noqa: E402

from fastlm.engine.model.accumulation import accumulate_gradients  # noqa: E402
from fastlm.engine.train.master_weights import MasterWeights  # noqa: E402


def curve(model, batches, autocast, lr: float, *, bf16_weights: bool = False) -> tuple[list[float], float]:
    """``bf16_weights``: the model in bf16, AdamW on its fp32 masters (``MasterWeights``)."""
    masters = MasterWeights(model) if bf16_weights else None
    trained = [masters.master_of(p) for p in model.parameters()] if masters else list(model.parameters())
    optimizer = torch.optim.AdamW(trained, lr=lr)
    losses, start = [], time.perf_counter()
    for batch in batches:
        loss_sum, targets = accumulate_gradients(model, [batch], autocast=autocast)
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if masters is not None:
            masters.publish()
        losses.append(float(loss_sum) / targets)
    return losses, (time.perf_counter() - start) / len(batches)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_curve_arguments(parser)
    parser.add_argument("--rows", type=int, default=32, help="micro-batch token budget = rows x --max-length")
    parser.add_argument(
        "--seed-control", action="store_true", help="also fp32 from other initial weights (seed 1)"
    )
    parser.add_argument(
        "--bf16-weights", action="store_true", help="also bf16 weights with fp32 masters (param_dtype: bf16)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, dataset = load_prepared(Path(args.workdir), args.max_length)
    params = {
        "model": {"attn_implementation": "sdpa", **SHAPE},
        "batching": {"mode": "packed", "micro_batch_size": args.rows},
    }
    batches = batches_for(dataset, params, int(tokenizer.pad_token_id), args.max_length, args.steps)
    epoch = len(batches)  # one epoch of packed batches (about 19 for 20,000 texts): later steps run it again
    batches = [batches[step % epoch] for step in range(args.steps)]

    def initial(seed: int):
        return initial_model(tokenizer, seed, args.max_length)

    fp32, fp32_s = curve(initial(0), batches, contextlib.nullcontext, args.lr)
    bf16, bf16_s = curve(initial(0), batches, lambda: torch.autocast("cpu", dtype=torch.bfloat16), args.lr)
    print(
        f"{args.steps} steps, {len(batches[0]['input_ids'])} rows x {batches[0]['input_ids'].shape[1]} "
        f"tokens, AdamW lr {args.lr}, {torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    print("step   fp32 loss   bf16 loss   difference")
    for step in range(args.every - 1, args.steps, args.every):
        print(f"{step + 1:4d}   {fp32[step]:9.4f}   {bf16[step]:9.4f}   {bf16[step] - fp32[step]:+.4f}")
    differences = [abs(b - f) for f, b in zip(fp32, bf16, strict=True)]
    half = fp32[args.steps // 2 :]
    noise = (
        statistics.stdev(b - a for a, b in zip(half, half[1:], strict=False))
        if len(half) > 2
        else float("nan")
    )
    print(
        f"mean |bf16 - fp32| {statistics.fmean(differences):.4f}, largest {max(differences):.4f}; "
        f"fp32 batch-to-batch noise (stdev of consecutive differences, second half) {noise:.4f}"
    )
    if args.seed_control:
        control, _ = curve(initial(1), batches, contextlib.nullcontext, args.lr)
        gaps = [abs(c - f) for f, c in zip(fp32, control, strict=True)]
        print(
            "seed control (fp32, seed 1 weights): "
            + ", ".join(
                f"step {step + 1} {control[step]:.4f}"
                for step in range(args.every - 1, args.steps, args.every)
            )
        )
        print(
            f"mean |fp32 seed 1 - fp32 seed 0| {statistics.fmean(gaps):.4f}, largest {max(gaps):.4f} "
            f"(second half: mean {statistics.fmean(gaps[args.steps // 2 :]):.4f}); bf16 second half: mean "
            f"{statistics.fmean(differences[args.steps // 2 :]):.4f}"
        )
    print(f"seconds per step: fp32 {fp32_s:.3f}, bf16 {bf16_s:.3f} ({fp32_s / bf16_s:.2f}x)")
    if args.bf16_weights:
        autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
        weights, weights_s = curve(initial(0), batches, autocast, args.lr, bf16_weights=True)
        print("step   fp32 loss   bf16 autocast   bf16 weights + fp32 masters")
        for step in range(args.every - 1, args.steps, args.every):
            print(f"{step + 1:4d}   {fp32[step]:9.4f}   {bf16[step]:13.4f}   {weights[step]:13.4f}")
        to_fp32 = [abs(w - f) for f, w in zip(fp32, weights, strict=True)]
        to_bf16 = [abs(w - b) for b, w in zip(bf16, weights, strict=True)]
        print(
            f"bf16 weights: mean |- fp32| {statistics.fmean(to_fp32):.4f}, largest {max(to_fp32):.4f}; "
            f"mean |- bf16 autocast| {statistics.fmean(to_bf16):.4f}, largest {max(to_bf16):.4f}; "
            f"seconds per step {weights_s:.3f} ({bf16_s / weights_s:.2f}x bf16 autocast's)"
        )


if __name__ == "__main__":
    main()
