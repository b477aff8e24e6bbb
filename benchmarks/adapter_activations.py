"""Benchmark: the activations a LoRA / QLoRA step keeps for backward, per set-up, on the Llama-3.2-3B shape.

What the decoder layers save between forward and backward is the activation memory a GPU holds at its peak
(besides weights, gradients and optimizer state). It follows from the autograd graph alone, the same on a
GPU as here, except inside the attention kernel (SDPA on CPU; flash-attention saves about as much), so it is
measured on CPU: every tensor autograd saves during one bf16-autocast forward of the first ``--layers``
layers (``saved_tensors_hooks``; each storage once, parameters and the packed 4-bit weights not counted),
over ``--tokens`` tokens in one row. The loss is the mean square of the last hidden state (the LM head and
its loss are the same in every set-up: ``linear_loss_memory.py`` measures them). The CPU seconds of one
forward + backward are printed too (median of ``--steps`` after one warm-up), a CPU figure only: the
GPU's memory-bound passes weigh more there.

Set-ups (same weights, same adapters r 16 on the 7 projections, same tokens):

* ``qlora_peft_prepared``: NF4 base (bitsandbytes, double quantization, bf16 compute) prepared with
  peft's ``prepare_model_for_kbit_training`` (every 16-bit parameter that is not 4-bit cast to fp32) and
  peft's forward: Trainer + peft's documented QLoRA set-up.
* ``qlora_fp32_norms``: the NF4 base as fastlm prepared it until 2026-11-26 (frozen, norms fp32) with
  peft's forward.
* ``qlora_peft_forward``: fastlm's QLoRA base (everything frozen in bf16) with peft's forward
  (``train.model.lora.fused_forward: false``). peft's 4-bit layer skips its input casts when
  ``torch.is_autocast_enabled()`` (CUDA's autocast) says yes: on a GPU it keeps less than here, where it
  casts as its plain layer does (this figure then equals ``lora_peft_forward``'s).
* ``qlora_fastlm``: fastlm's QLoRA (``lora.apply_lora``: everything frozen in bf16, the fused forward).
* ``lora_peft_forward`` / ``lora_fastlm``: the bf16 base with peft's forward / fastlm's (with its
  shared-input groups: q/k/v and gate/up in one step, ``train.model.lora.shared_input``).
* ``lora_fastlm_own_inputs``: fastlm's forward with each LoRA layer on its own (``shared_input: false``).

    python benchmarks/adapter_activations.py                    # 3B shape, 2 layers, 2,048 tokens
    python benchmarks/adapter_activations.py --model tiny --tokens 64 --steps 1   # smoke run

Needs bitsandbytes for the QLoRA set-ups (its CPU backend; ``pip install -e .[dev]`` brings it). Nothing
is asserted; the figures are printed and, with ``--json``, written.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from time import perf_counter

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memory_cliff import LLAMA_3B, TINY  # noqa: E402

SHAPES = {"3b": LLAMA_3B, "tiny": TINY}
SETUPS = (
    "qlora_peft_prepared",
    "qlora_fp32_norms",
    "qlora_peft_forward",
    "qlora_fastlm",
    "lora_peft_forward",
    "lora_fastlm",
    "lora_fastlm_own_inputs",
)
PAIRS = [
    ("qlora_fastlm", "qlora_peft_prepared"),
    ("qlora_fastlm", "qlora_fp32_norms"),
    ("qlora_fastlm", "qlora_peft_forward"),
    ("lora_fastlm", "lora_peft_forward"),
    ("lora_fastlm", "lora_fastlm_own_inputs"),
]
MIB = 2**20


def build(setup: str, folder: Path):
    """The adapted model of ``setup`` from the bf16 base saved in ``folder``, with B drawn non-zero."""
    import torch
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    from fastlm.engine.config import LoraParams
    from fastlm.engine.model import lora

    kwargs = {"dtype": torch.bfloat16}
    if setup.startswith("qlora"):
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=torch.bfloat16,
        )
        kwargs["device_map"] = {"": "cpu"}
    base = LlamaForCausalLM.from_pretrained(folder, **kwargs)
    params = LoraParams(
        enabled=True, r=16, alpha=32, dropout=0.0, load_in_4bit=setup.startswith("qlora"), fused_forward=False
    )
    torch.manual_seed(0)
    if setup == "qlora_peft_prepared":
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

        base = prepare_model_for_kbit_training(base, use_gradient_checkpointing=False)
        config = LoraConfig(
            r=16, lora_alpha=32, lora_dropout=0.0, target_modules=lora.DEFAULT_TARGETS["llama"]
        )
        model = get_peft_model(base, config)
    else:
        model = lora.apply_lora(base, params, gradient_checkpointing="off")
        if setup == "qlora_fp32_norms":
            for parameter in model.parameters():
                if parameter.ndim <= 1 and parameter.dtype == torch.bfloat16:
                    parameter.data = parameter.data.float()
        if "fastlm" in setup:
            from fastlm.engine.model.lora_forward import fuse_lora_forward, group_shared_inputs

            fuse_lora_forward(model)
            if not setup.endswith("own_inputs"):
                group_shared_inputs(model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.01)
    return model.train()


def step(model, ids, saved: dict | None = None) -> float:
    """One forward + backward of the decoder layers; ``saved``: {storage pointer: bytes} of what autograd
    keeps, filled when given. Returns the seconds it took."""
    import torch

    frozen = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor):
        if saved is not None and isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in frozen:
                saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    decoder = model.get_base_model().model
    started = perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            hidden = decoder(input_ids=ids).last_hidden_state
        loss = hidden.float().square().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)
    return perf_counter() - started


def measure(setup: str, folder: Path, args) -> dict:
    import torch

    model = build(setup, folder)
    vocab = SHAPES[args.model]["vocab_size"]
    ids = torch.randint(0, vocab, (1, args.tokens), generator=torch.Generator().manual_seed(2))
    saved: dict[int, int] = {}
    step(model, ids, saved)
    times = [step(model, ids) for _ in range(args.steps)]
    activation = sum(saved.values())
    dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in model.parameters() if not p.requires_grad})
    return {
        "setup": setup,
        "saved_mib": activation / MIB,
        "saved_bytes_per_token_per_layer": activation / args.tokens / args.layers,
        "cpu_step_s": statistics.median(times),
        "frozen_dtypes": dtypes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", choices=tuple(SHAPES), default="3b", help="3b (default) or tiny (a smoke run)"
    )
    parser.add_argument("--layers", type=int, default=2, help="the first N layers of the shape (default 2)")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens in the one row (default 2048)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up (default 3)")
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)

    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    if any(s.startswith("qlora") for s in args.setups):
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            print(
                "adapter_activations: the QLoRA set-ups need bitsandbytes (pip install -e .[dev])",
                file=sys.stderr,
            )
            return 2
    shape = {key: value for key, value in SHAPES[args.model].items() if key != "num_hidden_layers"}
    config = LlamaConfig(
        **shape, num_hidden_layers=args.layers, max_position_embeddings=max(args.tokens, 512)
    )
    print(
        f"{'Llama-3.2-3B' if args.model == '3b' else 'tiny'} shape, first {args.layers} layers; "
        f"{args.tokens:,} tokens in one row; bf16 autocast; LoRA r 16 on the 7 projections"
    )
    results = []
    with tempfile.TemporaryDirectory(prefix="fastlm_adapter_activations_") as workdir:
        folder = Path(workdir) / "base"
        torch.manual_seed(0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
        for setup in args.setups:
            results.append(measure(setup, folder, args))
            r = results[-1]
            print(
                f"  {setup:<22} saved for backward {r['saved_mib']:9,.1f} MiB "
                f"({r['saved_bytes_per_token_per_layer']:,.0f} bytes per token per layer); "
                f"CPU step {r['cpu_step_s']:.2f} s; frozen dtypes {', '.join(r['frozen_dtypes'])}"
            )
    by_name = {r["setup"]: r for r in results}
    print("\nratios (fastlm / other; below 1: fastlm keeps less, or is faster on this CPU):")
    ratios = {}
    for ours, theirs in PAIRS:
        if ours in by_name and theirs in by_name:
            memory = by_name[ours]["saved_mib"] / by_name[theirs]["saved_mib"]
            time = by_name[ours]["cpu_step_s"] / by_name[theirs]["cpu_step_s"]
            ratios[f"{ours}/{theirs}"] = {"saved": memory, "cpu_step_time": time}
            print(f"  {ours} / {theirs}: saved activations {memory:.2f}x, CPU step time {time:.2f}x")
    machine = f"{platform.processor() or platform.machine()}, torch threads {torch.get_num_threads()}"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    try:
        import bitsandbytes
        import peft

        versions += f", peft {peft.__version__}, bitsandbytes {bitsandbytes.__version__}"
    except ImportError:
        pass
    print(f"machine: {machine}; versions: {versions}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "runs": results, "ratios": ratios}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
