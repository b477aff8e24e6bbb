"""Benchmark: one AdamW step, torch's fused kernel (``engine.train.optim.make_adamw``'s) against foreach.

fastlm's AdamW runs torch's ``fused=True`` kernel where every parameter is on one CPU or on CUDA (one pass
over each parameter, its gradient and its two moments); the multi-tensor ``foreach=True`` kernels make several
passes. On a CPU a full fine-tune's optimizer step is bound by that memory traffic: with a 128k-vocabulary
model's tied embedding (``--vocab`` x ``--hidden``: 0.39 B fp32 parameters for a 3B Llama) the step is a large
share of the training step. Parameters: an embedding-shaped matrix (no decay) and ``--layers`` of square
``--hidden`` matrices (decay), fp32, random gradients; each kernel's first step (the moments' allocation) is
not timed, then the median of ``--steps``.

    python benchmarks/optimizer_step.py                       # 128,256 x 3,072 + 2 layers of 3,072^2 x 4
    python benchmarks/optimizer_step.py --vocab 4096 --hidden 64 --steps 3   # smoke run

Nothing is asserted; the figures are printed and, with ``--json``, written.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from time import perf_counter


def model(vocab: int, hidden: int, layers: int):
    import torch

    class Shapes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(vocab, hidden)
            self.layers = torch.nn.ModuleList(
                torch.nn.Linear(hidden, 4 * hidden, bias=False) for _ in range(layers)
            )

    return Shapes()


def seconds_per_step(kernel: str, args) -> tuple[float, int]:
    """The median seconds of one AdamW step with torch's ``kernel`` (``fused`` / ``foreach``) over
    ``make_adamw``'s parameter groups and settings, and the parameter count."""
    import torch

    from fastlm.engine.train.optim import parameter_groups

    torch.manual_seed(0)
    net = model(args.vocab, args.hidden, args.layers)
    params = [p for p in net.parameters() if p.requires_grad]
    for p in params:
        p.grad = torch.randn_like(p).mul_(1e-3)
    groups = [g for g in parameter_groups(net, weight_decay=0.1) if g["params"]]
    optimizer = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, **{kernel: True})
    optimizer.step()  # the moments' allocation
    times = []
    for _ in range(args.steps):
        started = perf_counter()
        optimizer.step()
        times.append(perf_counter() - started)
    return statistics.median(times), sum(p.numel() for p in params)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    import torch

    from fastlm.engine.train.optim import make_adamw

    torch.set_num_threads(args.threads)
    chosen = next(k for k in ("fused", "foreach") if make_adamw(model(2, 2, 0), lr=1e-4).defaults.get(k))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}, python {platform.python_version()}; {args.threads} threads; make_adamw's "
        f"kernel here: {chosen}"
    )
    results = {}
    for kernel in ("fused", "foreach"):
        seconds, count = seconds_per_step(kernel, args)
        results[kernel] = {"seconds": seconds, "parameters": count}
        print(f"{kernel:>8}: {seconds * 1e3:9.1f} ms per step, {count / 1e9:.3f} B fp32 parameters")
    ratio = results["foreach"]["seconds"] / results["fused"]["seconds"]
    print(f"foreach / fused = {ratio:.2f}x (above 1: fused is faster); fastlm runs {chosen}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"args": vars(args), "results": results, "chosen": chosen, "ratio": ratio}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
