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
``--precision bf16``: the forward under bf16 autocast, the weight and hidden states fp32 (a mixed-precision
full fine-tune's head: the plain head's matmul runs in bf16 there, and so do the fused head's products).

``--device cuda``: on a GPU, the peak is ``torch.cuda.max_memory_allocated`` above the inputs, the time the
median of ``--repeats`` forward + backward passes after one warm-up (Triton's compiles), and ``--kernels liger
cce`` adds the GPU libraries' fused kernels (``engine.model.liger`` / ``engine.model.cce``, as training calls
them) beside ours: the A/B of ``train.loss.fused_linear_kernel``. A kernel that cannot run here is reported
as skipped, with the reason.

    python benchmarks/linear_loss_memory.py                       # 8,192 x 128,256, hidden 512
    python benchmarks/linear_loss_memory.py --tokens 1024 --vocab 32000 --hidden 64   # smoke run
    python benchmarks/linear_loss_memory.py --chunk-tokens 130 523   # the fused path at other chunk sizes too
    python benchmarks/linear_loss_memory.py --vocab-blocks 2048   # its weight gradient by vocabulary blocks
    python benchmarks/linear_loss_memory.py --precision bf16 --hidden 3072 --tokens 1024   # a 3B head, bf16
    python benchmarks/linear_loss_memory.py --device cuda --precision bf16 --hidden 3072 --kernels liger cce

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


def measure(path: str, args, chunk: int | None = None) -> dict:
    """Run in this process: allocate the inputs, then forward + backward of ``path`` (``chunk``: the fused
    path's tokens per chunk; None: the engine's default) at ``args``' shape, device, threads and precision:
    once on CPU (the peak resident set is a high-water mark), after a warm-up and ``args.repeats`` times on
    CUDA."""
    import statistics

    import torch

    from fastlm.engine.model.cce import cce_linear_cross_entropy_sum
    from fastlm.engine.model.liger import liger_linear_cross_entropy_sum
    from fastlm.engine.model.linear_loss import linear_cross_entropy_sum, reference_linear_cross_entropy_sum

    function = {
        "plain": reference_linear_cross_entropy_sum,
        "fused": lambda *a: linear_cross_entropy_sum(*a, chunk_tokens=chunk, vocab_block=args.block),
        "liger": liger_linear_cross_entropy_sum,
        "liger_function": lambda *a: _liger_function()(*a),
        "cce": cce_linear_cross_entropy_sum,
    }[path]
    tokens, vocab, hidden = args.tokens, args.vocab, args.hidden
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    generator = torch.Generator().manual_seed(0)
    states = torch.randn(tokens, hidden, generator=generator).to(device).requires_grad_()
    # scaled in place: a temporary as large as the weight would raise the baseline high-water mark
    weight = torch.randn(vocab, hidden, generator=generator).div_(hidden**0.5).to(device).requires_grad_()
    targets = torch.randint(0, vocab, (tokens,), generator=generator)
    targets[: tokens // 10] = -100  # a prompt share, as in SFT data
    targets = targets.to(device)

    def step():
        states.grad = weight.grad = None
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = function(states, weight, targets)
        (loss / tokens).backward()
        return loss

    if cuda:
        step()  # Triton's compiles, cuBLAS' workspaces
        states.grad = weight.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    times = []
    for _ in range(args.repeats if cuda else 1):
        started = perf_counter()
        loss = step()
        if cuda:
            torch.cuda.synchronize()
        times.append(perf_counter() - started)
    peak = (
        torch.cuda.max_memory_allocated()
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {
        "path": path,
        "loss": float(loss),
        "seconds": statistics.median(times),
        "peak_above_inputs_mb": (peak - baseline) / 2**20,
        "logits_fp32_mb": tokens * vocab * 4 / 2**20,
        "grad_norm": float(weight.grad.norm()),
    }


def _liger_function():
    """liger's own autograd function for the head, as the engine called it until 2026-11-27 (its host syncs,
    the weight's gradient summed chunk by chunk): ``gpu_speed.liger_function_cross_entropy_sum``."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_speed import liger_function_cross_entropy_sum

    return liger_function_cross_entropy_sum


def kernel_unavailable(kernel: str, device, precision: str) -> str | None:
    """Why ``kernel`` (liger, liger_function, cce) cannot run at this device and precision (None: it can)."""
    from fastlm.engine.model.cce import cce_unavailable
    from fastlm.engine.model.liger import liger_unavailable

    if kernel == "cce" and precision != "bf16":
        return "cut-cross-entropy's backward computes in bf16 or fp16 only (--precision bf16)"
    return (liger_unavailable if kernel.startswith("liger") else cce_unavailable)(device)


def facts(args) -> dict:
    """What the parent prints of torch and the engine at ``args``: torch's version, the fused path's elements
    per chunk, whether its weight gradient goes by vocabulary blocks, and why each kernel asked for cannot run
    here (None: it can). The plain path's child reports them after its figures, so that the parent, which
    only starts the children, does not import torch too."""
    import torch

    from fastlm.engine.model.linear_loss import LINEAR_CE_CHUNK_ELEMENTS, weight_gradient_by_block

    device = torch.device(args.device)
    compute = torch.bfloat16 if args.precision == "bf16" else torch.float32
    return {
        "torch": str(torch.__version__),
        "chunk_elements": LINEAR_CE_CHUNK_ELEMENTS,
        "by_block": weight_gradient_by_block(compute, device),
        "unavailable": {name: kernel_unavailable(name, device, args.precision) for name in args.kernels},
    }


def run_child(path: str, args, chunk: int | None = None, block: int | None = None) -> dict:
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
        "--precision",
        args.precision,
        "--device",
        args.device,
        "--repeats",
        str(args.repeats),
        *(("--chunk", str(chunk)) if chunk else ()),
        *(("--block", str(block)) if block else ()),
        *(("--kernels", *args.kernels) if args.kernels else ()),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="bf16: the forward under bf16 autocast, fp32 weight and hidden states (default fp32)",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--kernels",
        nargs="*",
        choices=["liger", "liger_function", "cce"],
        default=[],
        help="also run these fused kernels (CUDA; liger-kernel's in fastlm's loop, liger's own function, "
        "cut-cross-entropy's) beside ours",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed passes on CUDA, after a warm-up")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument(
        "--chunk-tokens",
        type=int,
        nargs="*",
        default=[],
        help="also run the fused path with these tokens per chunk (the A/B of its chunk size)",
    )
    parser.add_argument(
        "--child", choices=["plain", "fused", "liger", "liger_function", "cce"], help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--vocab-blocks",
        type=int,
        nargs="*",
        default=[],
        help="also run the fused path with its weight gradient by blocks of these many vocabulary rows (the "
        "A/B of weight_gradient_by_block where the engine sums chunk by chunk)",
    )
    parser.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = measure(args.child, args, args.chunk)
        if args.child == "plain":  # the first child: the parent's facts too, once its figures are taken
            result["facts"] = facts(args)
        print(json.dumps(result))
        return 0
    results = {"plain": run_child("plain", args)}
    known = results["plain"].pop("facts")
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
        f"{known['torch']},"
        f" python {platform.python_version()}; {args.threads} threads"
    )
    print(
        f"shape: {args.tokens:,} tokens x vocabulary {args.vocab:,}, hidden {args.hidden}: fp32 logits "
        f"{args.tokens * args.vocab * 4 / 2**20:,.0f} MB; fused: the engine's "
        f"{max(1, known['chunk_elements'] // args.vocab):,} tokens per chunk"
    )
    blocks = f"by blocks of {max(1, known['chunk_elements'] // args.tokens):,} vocabulary rows"
    print(
        f"precision: {'bf16 autocast, fp32 weights' if args.precision == 'bf16' else 'fp32'}; the fused "
        f"path's weight gradient {blocks if known['by_block'] else 'summed chunk by chunk'}"
    )
    results["fused"] = run_child("fused", args)
    results.update({f"fused@{chunk}": run_child("fused", args, chunk) for chunk in args.chunk_tokens})
    results.update({f"blocks@{n}": run_child("fused", args, block=n) for n in args.vocab_blocks})
    skipped = {}
    for kernel in args.kernels:
        problem = known["unavailable"][kernel]
        if problem is None:
            results[kernel] = run_child(kernel, args)
        else:
            skipped[kernel] = problem
            print(f"{kernel:>11}: skipped: {problem}")
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
    for kernel in args.kernels:
        if kernel in results:
            other = results[kernel]
            memory = other["peak_above_inputs_mb"] / max(fused["peak_above_inputs_mb"], 1e-9)
            gap = abs(other["loss"] - plain["loss"]) / abs(plain["loss"])
            print(
                f"{kernel}: time / fastlm's = {other['seconds'] / fused['seconds']:.2f}x, "
                f"memory / fastlm's = {memory:.2f}x; loss relative difference {gap:.1e}"
            )
    if args.json:
        figures = {
            "args": vars(args),
            "results": results,
            "skipped": skipped,
            "ratio": ratio,
            "verdict": verdict,
        }
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(figures, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
