"""Benchmark: the host's share of a LoRA step, per forward set-up: aten ops dispatched and host time per step.

On a GPU each aten op is a kernel launch the host pays for whether the kernel is large or tiny; where the
host falls behind, the GPU waits (engine/observe/gpu_idle.py measures that in a profile). This measures the
host side on CPU with a model whose sizes make the arithmetic negligible (hidden 32, 16 tokens) and whose
depth is the real one (``--layers``, 28 as Llama-3.2-3B): what is left is dispatch and Python, per step of
forward + backward, LoRA r 4 on the 7 projections, dropout 0.

Set-ups (same weights):

* ``groups``: fastlm's LoRA forward with its shared-input groups (``train.model.lora.shared_input``, the
  default): q/k/v and gate/up in one autograd step each.
* ``own``: fastlm's LoRA forward, each layer on its own (``shared_input: false``).
* ``peft``: peft's own forward (``fused_forward: false``).
* ``bf16_adapters`` (the bf16 autocast run only): ``groups`` with bf16 adapters and fp32 masters
  (``train.runtime.param_dtype``, auto on a GPU: engine/train/master_weights.py), the step's gradient move
  into the masters and the masters' copy into the adapters included: no adapter cast per micro-batch.

    python benchmarks/lora_host_cost.py                  # 28 layers, fp32 and bf16 autocast, 15 timed steps
    python benchmarks/lora_host_cost.py --layers 2 --steps 2   # smoke run

Figures: aten ops per step (counted once, exact) and the median host milliseconds per step (a CPU figure of
this machine; timing noise applies). Nothing is asserted; with ``--json`` the figures are written.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

SETUPS = {"groups": {}, "own": {"shared_input": False}, "peft": {"fused_forward": False}}


def build(layers: int, dtype, **lora):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from fastlm.engine.config import LoraParams
    from fastlm.engine.model.lora import apply_lora

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).to(dtype)
    return apply_lora(model, LoraParams(enabled=True, r=4, dropout=0.0, **lora), gradient_checkpointing=False)


def measure(layers: int, steps: int, autocast: bool) -> dict:
    import contextlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from fastlm.engine.train.master_weights import MasterWeights

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            return func(*args, **(kwargs or {}))

    ids = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))

    masters = {}  # model -> its MasterWeights (bf16_adapters)

    def step(model):
        held = masters.get(model)
        with held.collecting()(True) if held is not None else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        if held is not None:  # as train_step: the optimizer's masters, their copy into the bf16 adapters
            for _, master in held.pairs:
                master.grad = None
            held.publish()
        for parameter in model.parameters():
            parameter.grad = None

    dtype = torch.bfloat16 if autocast else torch.float32
    models = {name: build(layers, dtype, **lora) for name, lora in SETUPS.items()}
    if autocast:
        models["bf16_adapters"] = build(layers, dtype)
        adapted = models["bf16_adapters"]
        masters[adapted] = MasterWeights(adapted, torch.bfloat16, batched=True)
    results = {}
    for name, model in models.items():
        for _ in range(2):
            step(model)
        with Count() as count:
            step(model)
        results[name] = {"aten_ops_per_step": count.ops, "host_ms": []}
    for _ in range(steps):  # interleaved: a load change touches every set-up alike
        for name, model in models.items():
            started = time.perf_counter()
            step(model)
            results[name]["host_ms"].append((time.perf_counter() - started) * 1e3)
    for figures in results.values():
        figures["host_ms_per_step"] = statistics.median(figures.pop("host_ms"))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28, help="decoder layers (default 28, as Llama-3.2-3B)")
    parser.add_argument("--steps", type=int, default=15, help="timed steps per set-up (default 15)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    report = {"layers": args.layers, "steps": args.steps, "runs": {}}
    for label, autocast in (("fp32", False), ("bf16 autocast", True)):
        runs = measure(args.layers, args.steps, autocast)
        report["runs"][label] = runs
        print(f"{label}, {args.layers} layers, LoRA r 4 on 7 projections, 16 tokens, 1 thread:")
        for name, figures in runs.items():
            print(
                f"  {name:13s} aten ops per step {figures['aten_ops_per_step']:6,d}   "
                f"host ms per step (median of {args.steps}) {figures['host_ms_per_step']:8.2f}"
            )
        own = runs["own"]
        for name in ("groups", "peft", "bf16_adapters")[: len(runs) - 1]:
            ops = runs[name]["aten_ops_per_step"] / own["aten_ops_per_step"]
            host = runs[name]["host_ms_per_step"] / own["host_ms_per_step"]
            print(f"  {name} / own: aten ops {ops:.3f}x, host time {host:.2f}x")
    import peft
    import transformers

    versions = f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}"
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}; versions: {versions}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
