"""Packed attention on the REAL kernels of this machine (issue 13): every sample of a packed micro-batch must
get the logits and gradients it gets alone, on every attention path fastlm can run here. Not a timing script.

For each path (CUDA: sdpa, eager, flex_attention, torch_varlen, flash_attention_2/3 when installed; CPU: sdpa,
eager), a small Llama (hidden 256, 4 layers, 8 heads, 2 KV heads: GQA) gets one packed micro-batch of several
rows with several samples each, built by the engine's own ``PackedCollator`` and ``inputs.to_device``, and:

* forward: ``|| packed logits - alone logits || / || alone logits ||`` over all samples' real positions, where
  "alone" is each sample run by itself (batch of one, no mask, no padding, SDPA);
* backward: the same relative error on the gradient of the summed loss, over all parameters (the packed
  batch's summed loss is the sum of the samples' own summed losses, so the gradients must agree).

Precisions: fp32 (TF32 off: exact arithmetic, tolerance 1e-4) and bf16 autocast (tolerance 2e-2), fresh random
weights and tokens per run. A negative control shows the check can see a leak: the same packed batch through
SDPA with plain causal attention over each row (no document mask) must FAIL. Prints a table and PASS/FAIL per
path.

``--family mistral|gemma3|gemma2``: the same check on a model with sliding-window (local) layers, its window
(64 tokens) shorter than the samples (``attention.windows``): every local layer must keep each packed sample
to its window on every path the class supports (Gemma2, which caps its attention logits, has no varlen
kernel and no SDPA path: ``attention.kernels.unsupported_terms``); "alone" runs on eager where the class has
no SDPA.

    python benchmarks/gpu_attention_check.py                # CUDA when present, else CPU
    python benchmarks/gpu_attention_check.py --json out.json
    python benchmarks/gpu_attention_check.py --family gemma3 --seeds 1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from fastlm.engine.data.collators import PackedCollator  # noqa: E402
from fastlm.engine.data.packing import TokenBudget  # noqa: E402
from fastlm.engine.data.schema import MODEL_INPUTS  # noqa: E402
from fastlm.engine.model.attention.choice import torch_varlen_available  # noqa: E402
from fastlm.engine.model.attention.inputs import PACKED_INPUTS, VARLEN, to_device  # noqa: E402
from fastlm.engine.model.attention.kernels import VARLEN_ONLY, unsupported_terms  # noqa: E402
from fastlm.engine.model.attention.windows import enable_packed_windows  # noqa: E402
from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits  # noqa: E402

VOCAB, PAD, EOS = 512, 0, 2
TOL = {"fp32": 1e-4, "bf16": 2e-2}
LEAK = "sdpa_causal_only (negative control)"


def paths(device: torch.device) -> list[str]:
    found = ["sdpa", "eager"]
    if device.type == "cuda":
        found.append("flex_attention")
        if torch_varlen_available(device):
            found.append("torch_varlen")
        if importlib.util.find_spec("flash_attn") is not None:
            found.append("flash_attention_2")
        if importlib.util.find_spec("flash_attn_interface") is not None:
            found.append("flash_attention_3")
    return found


WINDOW = 64  # --family: the local layers' window, shorter than the longest samples (row_length / 3)
FAMILIES = ("llama", "mistral", "gemma3", "gemma2")


def make_model(device: torch.device, seed: int, family: str = "llama"):
    import transformers as t

    shape = {
        "vocab_size": VOCAB,
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "pad_token_id": PAD,
        "eos_token_id": EOS,
    }
    local = {"sliding_window": WINDOW}
    config = {
        "llama": lambda: t.LlamaConfig(**shape),
        "mistral": lambda: t.MistralConfig(**shape, **local),  # every layer local
        "gemma3": lambda: t.Gemma3TextConfig(**shape, **local, head_dim=32, sliding_window_pattern=2),
        "gemma2": lambda: t.Gemma2Config(**shape, **local, head_dim=32),  # local / global, softcapping
    }[family]()
    torch.manual_seed(seed)
    model = t.AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(device)
    model.config.use_cache = False
    return model


def alone_path(model) -> str:
    return "sdpa" if getattr(type(model), "_supports_sdpa", False) else "eager"


def family_paths(model, device: torch.device) -> list[str]:
    """The paths of ``paths`` that the model's class supports and whose kernels compute its attention."""
    flags = {"sdpa": "_supports_sdpa", "flex_attention": "_supports_flex_attn"}
    kept = []
    for attn in paths(device):
        if attn in flags and not getattr(type(model), flags[attn], False):
            continue
        if attn.startswith("flash_attention") and not getattr(type(model), "_supports_flash_attn", False):
            continue
        if attn in VARLEN_ONLY and unsupported_terms(model.config):
            continue
        kept.append(attn)
    return kept


def make_samples(seed: int, rows: int, row_length: int) -> list[np.ndarray]:
    """Samples of 2..row_length/3 tokens, enough to fill about ``rows`` rows (several per row)."""
    rng = np.random.default_rng(seed)
    samples, total = [], 0
    while total < rows * row_length * 0.9:
        n = int(rng.integers(2, row_length // 3))
        ids = rng.integers(3, VOCAB, size=n)
        ids[-1] = EOS
        samples.append(ids)
        total += n
    return samples


def grads(model) -> torch.Tensor:
    return torch.cat([p.grad.detach().float().reshape(-1) for p in model.parameters() if p.grad is not None])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    value = float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))
    return value if np.isfinite(value) else float("inf")


def run_path(model, attn: str, host_batch: dict, device: torch.device, precision: str, leak: bool = False):
    """Logits per real position (in sample order) and the gradient of the summed loss, for the packed
    batch."""
    model.zero_grad(set_to_none=True)
    model.config._attn_implementation = attn
    batch = to_device(host_batch, device, attn)
    if leak:  # plain causal attention over each row (an all-ones 2D mask: transformers then infers no packing
        # from the restarting position ids): samples see their neighbours, positions unchanged
        batch[MODEL_INPUTS] = {
            "input_ids": batch["input_ids"],
            "position_ids": batch["position_ids"],
            "attention_mask": torch.ones_like(batch["input_ids"]),
        }
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = forward_logits(model, batch)
        loss_sum, _ = causal_lm_loss_sum(logits, batch["labels"])
    loss_sum.backward()
    real = (host_batch["input_ids"] != PAD).to(device)
    return logits.detach()[real].float(), grads(model)


def alone(model, samples, device, precision):
    model.zero_grad(set_to_none=True)
    model.config._attn_implementation = alone_path(model)
    outs = []
    for ids in samples:
        tensor = torch.as_tensor(ids, dtype=torch.long, device=device)[None]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=tensor).logits
            loss_sum, _ = causal_lm_loss_sum(logits, tensor)
        loss_sum.backward()
        outs.append(logits.detach()[0].float())
    return torch.cat(outs), grads(model)


def check(
    device: torch.device, precision: str, seed: int, rows: int, row_length: int, family: str = "llama"
) -> dict:
    model = make_model(device, seed, family)
    enable_packed_windows(model, max_length=row_length)  # local layers: each packed sample to its window
    samples = make_samples(seed, rows, row_length)
    collator = PackedCollator(
        pad_id=PAD,
        budget=TokenBudget(row_length=row_length, rows_per_batch=2 * rows),
        attention_mask_format="none",
    )
    host = collator([{"input_ids": ids} for ids in samples])
    ref_logits, ref_grads = alone(model, samples, device, precision)
    ids = host["input_ids"]
    real = ids != PAD  # samples use ids >= 3; padding tails are PAD
    # Samples are packed in order (next-fit), so the real positions, row-major, are the samples concatenated.
    if not torch.equal(ids[real], torch.as_tensor(np.concatenate(samples))):
        raise AssertionError("the collator did not keep the samples in order")
    rows_used = int(ids.shape[0])
    result = {
        "samples": len(samples),
        "rows": rows_used,
        "row_length": row_length,
        "tokens": int(real.sum()),
        "paths": {},
    }
    for attn in [*family_paths(model, device), LEAK]:
        leak = attn == LEAK
        if (
            precision == "fp32"
            and device.type == "cuda"
            and PACKED_INPUTS[attn if not leak else "sdpa"] == VARLEN
        ):
            result["paths"][attn] = {"skipped": "bf16/fp16 only (flash kernel)", "ok": True}
            continue
        try:
            path = alone_path(model) if leak else attn
            logits, grad = run_path(model, path, host, device, precision, leak=leak)
            entry = {"logits_rel": rel(logits, ref_logits), "grad_rel": rel(grad, ref_grads)}
            within = max(entry["logits_rel"], entry["grad_rel"]) <= TOL[precision]
            entry["ok"] = (not within) if leak else within
        except Exception as error:  # a kernel this machine cannot run (dtype, arch): reported as a failure
            entry = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:160]}", "ok": False}
        result["paths"][attn] = entry
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--row-length", type=int, default=512)
    parser.add_argument("--seeds", type=int, default=2, help="fresh weights and tokens per seed")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--family", choices=FAMILIES, default="llama", help="local layers: mistral, gemma3, gemma2"
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    import transformers

    print(
        f"{args.family}: torch {torch.__version__}, transformers {transformers.__version__}, device "
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}"
    )
    results, failed = [], 0
    print(f"{'precision':9} {'seed':>4} {'path':38} {'logits rel':>11} {'grad rel':>11}  verdict")
    for precision in ("fp32", "bf16"):
        for seed in range(args.seeds):
            outcome = check(device, precision, seed, args.rows, args.row_length, args.family)
            outcome.update(precision=precision, seed=seed)
            results.append(outcome)
            for attn, entry in outcome["paths"].items():
                failed += not entry["ok"]
                verdict = "PASS" if entry["ok"] else "FAIL"
                if attn == LEAK:
                    verdict += " (a leak must be seen)" if entry["ok"] else " (the check cannot see a leak)"
                if "skipped" in entry:
                    print(f"{precision:9} {seed:>4} {attn:38} n/a: {entry['skipped']}")
                elif "error" in entry:
                    print(f"{precision:9} {seed:>4} {attn:38} {entry['error']}  FAIL")
                else:
                    print(
                        f"{precision:9} {seed:>4} {attn:38} {entry['logits_rel']:11.2e} "
                        f"{entry['grad_rel']:11.2e}"
                        f"  {verdict}"
                    )
    print(
        f"tolerances: {TOL}; {results[0]['samples']} samples in {results[0]['rows']} rows of "
        f"{args.row_length} tokens; {'ALL PASS' if not failed else f'{failed} FAIL'}"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
