"""Benchmark: ``train.runtime.compile_scope`` = ``model`` against ``layers``: the cold start (the first
optimizer step, compile included) and the steady step of a deep Llama, each scope in a fresh process with
inductor's caches off, so that neither reuses the other's compiled code.

    python benchmarks/compile_scope.py                         # 24 layers of hidden 256, 8 rows of 256 tokens
    python benchmarks/compile_scope.py --layers 2 --hidden 64 --seq-len 64 --steps 2   # a smoke run
    python benchmarks/compile_scope.py --backend aot_eager     # dynamo + AOTAutograd, no inductor kernels
    python benchmarks/compile_scope.py --hidden 1536 --heads 16 --intermediate 4096 --vocab 32000 \
        --seq-len 2048 --steps 10                      # GPU: the 0.73 B Llama of gpu_speed.py --model 0.5b

Model: ``LlamaForCausalLM`` from its config (nothing downloaded), ``torch.manual_seed(0)``, ``use_cache``
off as the engine trains (``engine/model/build.py``), the attention a compiled run takes (``eager``'s additive
mask on CPU, SDPA on CUDA); bf16 autocast where the CPU has native
bf16 (or on CUDA), fp32 otherwise; AdamW; random token ids. ``model``: ``torch.compile(model)``; ``layers``:
``fastlm.engine.runtime.regions.compile_in_scope(model, "layers")`` (each transformer layer in place). Both
compute the same training: the script prints each scope's last loss, and their relative difference.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def child(args: argparse.Namespace) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fastlm.engine.runtime.probe import cpu_has_native_bf16
    from fastlm.engine.runtime.regions import compile_in_scope

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate or int(args.hidden * 2.6875),
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        vocab_size=args.vocab,
        max_position_embeddings=max(args.seq_len, 128),
        use_cache=False,
    )
    # the path a compiled run trains on: the additive mask on CPU (attention_when_compiled), SDPA on CUDA
    config._attn_implementation = "sdpa" if device.type == "cuda" else "eager"
    model = LlamaForCausalLM(config).to(device)
    bf16 = device.type == "cuda" or cpu_has_native_bf16()
    started = time.perf_counter()
    run = compile_in_scope(model, args.run, backend=args.backend)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, args.vocab, (args.rows, args.seq_len), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)

    def step() -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = run(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()
    synchronize()
    first = time.perf_counter() - started
    step()  # a second shape-stable step before timing
    synchronize()
    timed = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    synchronize()
    seconds = (time.perf_counter() - timed) / args.steps
    return {
        "scope": args.run,
        "first_step_s": first,
        "step_s": seconds,
        "tokens_per_s": args.rows * args.seq_len / seconds,
        "last_loss": float(loss),
        "precision": "bf16" if bf16 else "fp32",
        "backend": args.backend,
        "device": str(device),
        "torch": torch.__version__,
    }


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--intermediate", type=int, default=None, help="default: 2.6875 x hidden")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8, help="timed steps after the first two (default 8)")
    parser.add_argument(
        "--backend",
        choices=("inductor", "aot_eager"),
        default="inductor",
        help="torch.compile's backend (default inductor, what runs train with; aot_eager: the tracing alone)",
    )
    parser.add_argument("--run", choices=("model", "layers"), help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None, help="write both results to this JSON file")
    args = parser.parse_args(argv)
    if args.hidden % args.heads or args.layers < 1 or args.steps < 1:
        parser.error("--hidden must be a multiple of --heads, --layers and --steps at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.run:
        print(json.dumps(child(args)))
        return 0
    env = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "src"), env.get("PYTHONPATH")]))
    names = ("layers", "hidden", "heads", "vocab", "rows") + (("intermediate",) if args.intermediate else ())
    shape = [f"--{k}={getattr(args, k)}" for k in names]
    shape += [f"--seq-len={args.seq_len}", f"--steps={args.steps}", f"--backend={args.backend}"]
    results = {}
    for scope in ("model", "layers"):
        done = subprocess.run(
            [sys.executable, __file__, "--run", scope, *shape], env=env, capture_output=True, text=True
        )
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            print(f"compile_scope.py: the {scope} run failed (exit {done.returncode})", file=sys.stderr)
            return 1
        results[scope] = json.loads(done.stdout.strip().splitlines()[-1])
    model, layers = results["model"], results["layers"]
    print(
        f"Llama {args.layers} layers, hidden {args.hidden}, {args.heads} heads, vocab {args.vocab}; "
        f"{args.rows} rows of {args.seq_len} tokens; {model['precision']} on {model['device']}, "
        f"torch {model['torch']}; torch.compile backend {args.backend}, inductor caches off"
    )
    print(f"{'compile_scope':<14}{'first step s':>14}{'step ms':>10}{'tokens/s':>11}{'last loss':>11}")
    for row in (model, layers):
        print(
            f"{row['scope']:<14}{row['first_step_s']:>14.1f}{row['step_s'] * 1e3:>10.1f}"
            f"{row['tokens_per_s']:>11,.0f}{row['last_loss']:>11.4f}"
        )
    print(
        f"layers / model: first step {layers['first_step_s'] / model['first_step_s']:.2f}x the time, steady "
        f"speed {layers['tokens_per_s'] / model['tokens_per_s']:.2f}x; last losses differ by "
        f"{abs(layers['last_loss'] - model['last_loss']) / abs(model['last_loss']):.1e} relative"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
