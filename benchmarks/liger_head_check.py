"""The fused LM head through liger's Triton kernel in fastlm's loop against fastlm's own chunked kernel, on
one device: the same loss and gradients within bf16's tolerance, or FAIL. A few seconds at the start of a GPU
session (``benchmarks/gpu_session.sh`` runs it before its plan), so that every later LoRA/QLoRA figure, whose
head runs liger's kernel at ``auto``, is known to come from a correct head.

    python benchmarks/liger_head_check.py              # CUDA, 4,096 tokens x 32,768, hidden 1,024
    TRITON_INTERPRET=1 python benchmarks/liger_head_check.py --device cpu --tokens 256 --vocab 2048 \
        --hidden 64

Prints ``SKIP`` (exit 0) where liger-kernel or Triton is missing; ``--device cpu`` needs Triton's interpreter
(``TRITON_INTERPRET=1``). Exit 1 on FAIL.
"""

from __future__ import annotations

import argparse
import sys

# bf16 products on both sides, summed in another order: the loss's relative gap and each gradient's largest
# gap relative to its largest value (bf16's epsilon is 2**-7)
LOSS_RTOL = 2e-3
GRAD_RTOL = 2**-5


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32_768)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args(argv)
    try:
        import triton  # noqa: F401
        from liger_kernel.ops import cross_entropy  # noqa: F401
    except ImportError as error:
        print(f"SKIP  liger head check: {error}")
        return 0
    import torch

    from fastlm.engine.model.liger import liger_linear_cross_entropy_sum
    from fastlm.engine.model.linear_loss import linear_cross_entropy_sum

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("SKIP  liger head check: no CUDA device")
        return 0
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=generator).to(device, torch.bfloat16)
    weight = (torch.randn(args.vocab, args.hidden, generator=generator) / args.hidden**0.5).to(
        device, torch.bfloat16
    )
    targets = torch.randint(0, args.vocab, (args.tokens,), generator=generator)
    targets[: args.tokens // 10] = -100  # a prompt share, as in SFT data
    targets = targets.to(device)
    results = []
    for function in (linear_cross_entropy_sum, liger_linear_cross_entropy_sum):
        leaves = [hidden.clone().requires_grad_(), weight.clone().requires_grad_()]
        loss = function(*leaves[:2], targets, label_smoothing=0.1)
        (loss / args.tokens).backward()
        results.append((float(loss.detach()), [leaf.grad.float() for leaf in leaves]))
    (want, want_grads), (got, got_grads) = results
    gaps = [abs(got - want) / abs(want)]
    gaps += [float((g - w).abs().max() / w.abs().max()) for g, w in zip(got_grads, want_grads, strict=True)]
    passed = gaps[0] <= LOSS_RTOL and max(gaps[1:]) <= GRAD_RTOL
    print(
        f"{'PASS' if passed else 'FAIL'}  liger head check on {device.type} ({args.tokens:,} tokens x "
        f"{args.vocab:,}, hidden {args.hidden}, bf16, label smoothing 0.1): loss {got:.6g} vs fastlm's "
        f"{want:.6g} (relative gap {gaps[0]:.2e}, tol {LOSS_RTOL:g}); hidden-state gradient gap "
        f"{gaps[1]:.2e}, weight gradient gap {gaps[2]:.2e} of their largest values (tol {GRAD_RTOL:g})"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
