"""Benchmark: peak memory and time of the LM head + loss, fused chunk by chunk vs the plain full-logits path.

The shape a 128k-vocabulary model (Llama-3.2 / Qwen3 class) trains with: ``--tokens`` 8,192 target tokens per
micro-batch, ``--vocab`` 128,256, hidden size ``--hidden`` (512 by default so that a 2-core CPU finishes in
minutes; the logits, the memory at stake, do not depend on it; 3,072 is a 3B model's). Each path runs in a
fresh process: it allocates the inputs (hidden states, head weight, targets), records its resident set size,
then runs forward + backward once; the figure is the peak RSS above that baseline (``ru_maxrss``), i.e. what
the head + loss add, with its gradients:

* ``plain``: ``F.linear`` then ``F.cross_entropy`` on fp32 logits (what a model's head + loss does),
* ``fused``: ``engine.model.linear_loss.linear_cross_entropy_sum`` (no ``[tokens x vocab]`` buffer).

Both must give the same loss (printed with its relative difference). Target: fused peak <= plain / 4.

    python benchmarks/linear_loss_memory.py                       # 8,192 x 128,256, hidden 512
    python benchmarks/linear_loss_memory.py --tokens 1024 --vocab 32000 --hidden 64   # smoke run
    python benchmarks/linear_loss_memory.py --chunk-tokens 130 523   # the fused path at other chunk sizes too

Nothing is asserted; the figures are printed and, with ``--json``, written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
from time import perf_counter

TARGET_RATIO = 4.0


def measure(path: str, tokens: int, vocab: int, hidden: int, threads: int, chunk: int | None = None) -> dict:
    """Run in this process: allocate the inputs, then one forward + backward of ``path`` (``chunk``: the fused
    path's tokens per chunk; None: the engine's default)."""
    import torch

    from fastlm.engine.model.linear_loss import linear_cross_entropy_sum, reference_linear_cross_entropy_sum

    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(tokens, hidden, generator=generator).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) / hidden**0.5).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    targets[: tokens // 10] = -100  # a prompt share, as in SFT data
    baseline_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = perf_counter()
    if path == "fused":
        loss = linear_cross_entropy_sum(states, weight, targets, chunk_tokens=chunk)
    else:
        loss = reference_linear_cross_entropy_sum(states, weight, targets)
    (loss / tokens).backward()
    seconds = perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "path": path,
        "loss": float(loss),
        "seconds": seconds,
        "peak_above_inputs_mb": (peak_kb - baseline_kb) / 1024,
        "logits_fp32_mb": tokens * vocab * 4 / 2**20,
        "grad_norm": float(weight.grad.norm()),
    }


def run_child(path: str, args, chunk: int | None = None) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        path,
        "--tokens",
        str(args.tokens),
        "--vocab",
        str(args.vocab),
        "--hidden",
        str(args.hidden),
        "--threads",
        str(args.threads),
        *(("--chunk", str(chunk)) if chunk else ()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        nargs="*",
        default=[],
        help="also run the fused path with these tokens per chunk (the A/B of its chunk size)",
    )
    parser.add_argument("--child", choices=["plain", "fused"], help=argparse.SUPPRESS)
    parser.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.tokens, args.vocab, args.hidden, args.threads, args.chunk)))
        return 0
    import torch

    from fastlm.engine.model.linear_loss import LINEAR_CE_CHUNK_ELEMENTS

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__},"
        f" python {platform.python_version()}; {args.threads} threads"
    )
    print(
        f"shape: {args.tokens:,} tokens x vocabulary {args.vocab:,}, hidden {args.hidden}: fp32 logits "
        f"{args.tokens * args.vocab * 4 / 2**20:,.0f} MB; fused: the engine's "
        f"{max(1, LINEAR_CE_CHUNK_ELEMENTS // args.vocab):,} tokens per chunk"
    )
    results = {path: run_child(path, args) for path in ("plain", "fused")}
    results.update({f"fused@{chunk}": run_child("fused", args, chunk) for chunk in args.chunk_tokens})
    for path, result in results.items():
        print(
            f"{path:>11}: peak above inputs {result['peak_above_inputs_mb']:9,.0f} MB, "
            f"{result['seconds']:7.2f} s, "
            f"loss {result['loss']:.6f}"
        )
    plain, fused = results["plain"], results["fused"]
    ratio = plain["peak_above_inputs_mb"] / max(fused["peak_above_inputs_mb"], 1e-9)
    gap = abs(fused["loss"] - plain["loss"]) / abs(plain["loss"])
    verdict = "PASS" if ratio >= TARGET_RATIO else "FAIL"
    print(
        f"memory: plain / fused = {ratio:.1f}x (target >= {TARGET_RATIO:g}x): {verdict}; "
        f"time: fused / plain = {fused['seconds'] / plain['seconds']:.2f}x; loss relative difference "
        f"{gap:.1e}"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(
                {"args": vars(args), "results": results, "ratio": ratio, "verdict": verdict}, handle, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
