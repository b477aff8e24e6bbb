"""Benchmark (GPU session, first minute): a smoke matrix of every GPU lever of the engine, each for a few
optimizer steps, before any long benchmark spends the session's time on a lever that does not run.

    python benchmarks/gpu_levers.py                          # GPU: every lever, a Llama of hidden 256
    python benchmarks/gpu_levers.py --json levers.json       # the rows as JSON too
    python benchmarks/gpu_levers.py --device cpu             # the levers a CPU has; the others SKIP
    python benchmarks/gpu_levers.py --levers baseline qlora float8   # some of them (baseline always first)

Model: a Llama built by the engine from its config (``fastlm.engine.model.build.build_model``, nothing
downloaded; default hidden 256, 4 layers, 4 heads, intermediate 688, vocab 32,000, tied embeddings) after
``torch.manual_seed(0)``, saved once with ``save_pretrained`` and loaded back by every lever as a user's local
checkpoint (``train.model.name_or_path``), so all start from the same weights, LoRA and QLoRA included.

Data: random token ids (``memory_cliff.make_rows``: log-normal lengths, median a quarter of ``--seq-len``, at
most half of it, EOS last) filling about half of ``--rows`` packed rows of ``--seq-len`` tokens: each
optimizer step is the whole data set again (one micro-batch per epoch), so the loss must fall step by step.

Levers, each in a fresh Python process (``contender_process.run_contender``), through
``fastlm.engine.train.loop.train`` with the same seed and data; the baseline is plain (fused linear loss off,
liger off, AdamW, no checkpointing, eager, float8 off), bf16 autocast on CUDA and fp32 on CPU
(``--precision``), AdamW at a constant ``--lr`` without warm-up, ``--steps`` steps (default 3), a record per
step. Each other lever changes one parameter of the baseline (see ``LEVERS``).

A lever PASSes when it ran, the engine reports it in effect (its own choice line: the fused head and its
kernel, liger's patch, the LoRA/4-bit layers, the optimizer, the checkpointed layers, float8, compile, the
CUDA graphs a ``reduce-overhead`` run recorded with none of its compiled graphs run without one), every
loss is finite, the loss fell from the first step to the last, and its first-step loss (computed before any
update, so the same quantity for every lever) is within the lever's tolerance of the baseline's, and, for a
lever that computes the same training another way (kernels, recompute, compile, float8; not LoRA, QLoRA or
the 8-bit optimizers, which train other parameters or update them otherwise), so is every later step's
loss (``Lever.same_training``: the loss curves compared), relative:
fp32 1e-4 (the same math in another kernel order: a few fp32 roundings, 1e-7 each, far below it); bf16 2e-2
(bf16 keeps 8 significant bits, 2^-9 = 2e-3 per rounding: ten roundings of slack for a mean over the step's
tokens); 4-bit NF4 weights (QLoRA) and float8 matmuls (e4m3, 3 mantissa bits, 2^-4 = 6 % per rounding)
5e-2, in any precision (the quantization's own error). A lever this machine cannot run SKIPs with the
reason (no CUDA, a package not installed or, for QLoRA and 8-bit AdamW on CPU, a bitsandbytes older than
0.50, compute capability below 8.9 for float8); any exception is a FAIL with its traceback's tail, and the
matrix goes on; a lever stopped by what was left of ``--budget-s`` (not by its own ``--lever-timeout-s``) is
STOP, no verdict. Step time is
the median over the steps after the first (which holds compile and warm-up); peak memory is
``torch.cuda.max_memory_allocated`` on a GPU, peak RSS on CPU. The script always exits 0 (it is a report) and
ends with ``levers: N pass, M fail, S stopped, K skip``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import shutil
import statistics
import sys
import tempfile
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

# Sibling modules (scripts run from benchmarks/); importing train_speed also sets the offline environment.
from contender_process import run_contender
from gpu_speed import Budget, gpu_info
from memory_cliff import LORA, LORA_TARGETS, PAD, VocabOf, make_rows
from train_speed import REPO, machine

SHAPE = {"hidden": 256, "layers": 4, "heads": 4, "intermediate": 688, "vocab": 32000}
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2}
QUANTIZED_TOLERANCE = 5e-2  # bf16 runs with 4-bit NF4 weights or float8 matmuls (module docstring)
FILL = 0.5  # share of the packed rows' token slots the data fills: one micro-batch per epoch
TRACEBACK_LINES = 8


@dataclass(frozen=True)
class Lever:
    """One parameter change against the baseline: ``overrides`` merged into its ``params:train``."""

    setting: str  # as a user writes it
    overrides: dict = field(default_factory=dict)
    needs: tuple[str, ...] = ()  # keys of ``missing``
    quantized: bool = False  # the looser bf16 tolerance
    same_training: bool = True  # computes the baseline's training another way: its whole loss curve is kept


LORA_MODEL = {"enabled": True, **LORA, "target_modules": LORA_TARGETS}
GRAPHS = {"compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead"}
LEVERS = {
    "baseline": Lever("plain: fused linear off, liger off, adamw, no checkpointing, eager, float8 off"),
    "fused_linear": Lever(
        "train.loss.fused_linear: true, fused_linear_kernel: fastlm",
        {"loss": {"fused_linear": True, "fused_linear_kernel": "fastlm"}},
    ),
    "fused_linear_liger": Lever(
        "train.loss.fused_linear: true, fused_linear_kernel: liger",
        {"loss": {"fused_linear": True, "fused_linear_kernel": "liger"}},
        needs=("cuda", "liger_kernel"),
    ),
    "fused_linear_cce": Lever(
        "train.loss.fused_linear: true, fused_linear_kernel: cce",
        {"loss": {"fused_linear": True, "fused_linear_kernel": "cce"}},
        needs=("cuda", "cut_cross_entropy"),
    ),
    "liger": Lever("train.model.liger: on", {"model": {"liger": "on"}}, needs=("cuda", "liger_kernel")),
    "lora": Lever("train.model.lora: r 16, alpha 32", {"model": {"lora": LORA_MODEL}}, same_training=False),
    "qlora": Lever(
        "train.model.lora: r 16, alpha 32, load_in_4bit (NF4)",
        {"model": {"lora": {**LORA_MODEL, "load_in_4bit": True}}},
        needs=("bitsandbytes",),
        quantized=True,
        same_training=False,
    ),
    "dora": Lever(
        "train.model.lora: r 16, alpha 32, use_dora (fastlm's fused DoRA forward)",
        {"model": {"lora": {**LORA_MODEL, "use_dora": True}}},
        same_training=False,
    ),
    "qlora_dora": Lever(
        "train.model.lora: r 16, alpha 32, load_in_4bit (NF4), use_dora",
        {"model": {"lora": {**LORA_MODEL, "load_in_4bit": True, "use_dora": True}}},
        needs=("bitsandbytes",),
        quantized=True,
        same_training=False,
    ),
    "adamw_8bit": Lever(
        "train.optimizer.name: adamw_8bit",
        {"optimizer": {"name": "adamw_8bit"}},
        needs=("bitsandbytes",),
        same_training=False,
    ),
    "paged_adamw_8bit": Lever(
        "train.optimizer.name: paged_adamw_8bit",
        {"optimizer": {"name": "paged_adamw_8bit"}},
        needs=("cuda", "bitsandbytes"),
        same_training=False,
    ),
    "checkpointing_selective": Lever(
        "train.model.gradient_checkpointing: selective", {"model": {"gradient_checkpointing": "selective"}}
    ),
    "checkpointing_full": Lever(
        "train.model.gradient_checkpointing: full", {"model": {"gradient_checkpointing": "full"}}
    ),
    "float8": Lever(
        "train.runtime.float8: on",
        {"runtime": {"float8": "on"}},
        needs=("cuda", "float8_gpu", "torchao"),
        quantized=True,
    ),
    # the baseline on a GPU runs bf16 weights with fp32 masters (param_dtype auto): this is the other way
    "param_dtype_fp32": Lever(
        "train.runtime.param_dtype: fp32 (bf16 autocast over fp32 weights)",
        {"runtime": {"param_dtype": "fp32"}},
        needs=("cuda",),
    ),
    "compile": Lever("train.runtime.compile: true", {"runtime": {"compile": True}}),
    "compile_layers": Lever(
        "train.runtime.compile: true, compile_scope: layers",
        {"runtime": {"compile": True, "compile_scope": "layers"}},
    ),
    "cuda_graphs": Lever(
        "train.runtime.compile: true, compile_scope: layers, compile_mode: reduce-overhead",
        {"runtime": {**GRAPHS}},
        needs=("cuda",),
    ),
    # two micro-batches a step with no fp32 masters: each one's gradients are graph outputs the next replay
    # overwrites, owned by the step after each (engine.train.step.owning_gradients). One micro-batch holds the
    # whole data set, so a step of two is the same token mean as the baseline's: the same loss curve.
    "cuda_graphs_accumulation": Lever(
        "compile_mode: reduce-overhead (by layers), gradient_accumulation_steps: 2, param_dtype: fp32",
        {"runtime": {**GRAPHS, "param_dtype": "fp32"}, "batching": {"gradient_accumulation_steps": 2}},
        needs=("cuda",),
    ),
}


# --------------------------------------------------------------------------------------------------
# Parent: what this machine can run, the children, the verdicts
# --------------------------------------------------------------------------------------------------


def missing(on_cuda: bool) -> dict[str, str | None]:
    """Why each requirement of ``Lever.needs`` is not met here (None: met)."""
    import torch

    from fastlm.engine.config import bitsandbytes_missing

    def package(module: str, name: str) -> str | None:
        return None if importlib.util.find_spec(module) is not None else f"{name} not installed"

    capability = torch.cuda.get_device_capability() if on_cuda else None
    return {
        "cuda": None if on_cuda else "needs CUDA (this run is on cpu)",
        "liger_kernel": package("liger_kernel", "liger-kernel"),
        "cut_cross_entropy": package("cut_cross_entropy", "cut-cross-entropy"),
        "bitsandbytes": bitsandbytes_missing(),  # on CPU: its CPU backend, 0.50 or later
        "torchao": package("torchao", "torchao"),
        "float8_gpu": (
            None
            if capability is None or tuple(capability) >= (8, 9)
            else f"needs compute capability >= 8.9 for float8 (this GPU: {capability[0]}.{capability[1]})"
        ),
    }


def skip_reason(lever: Lever, unmet: dict[str, str | None]) -> str | None:
    reasons = [unmet[need] for need in lever.needs if unmet[need]]
    return "; ".join(reasons) if reasons else None


def tolerance(lever: Lever, precision: str) -> float:
    if lever.quantized:  # the quantization's own error, in whatever precision the rest computes
        return QUANTIZED_TOLERANCE
    return TOLERANCE[precision]


def shape_args(args: argparse.Namespace) -> list[str]:
    """The settings every child gets (the same model, data and run)."""
    out = []
    for name in ("hidden", "layers", "heads", "intermediate", "vocab", "rows", "seq_len", "steps", "lr"):
        out += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return out + ["--device", args.device, "--precision", args.precision]


def judge(
    name: str,
    run: dict,
    baseline_first: float | None,
    precision: str,
    *,
    baseline_curve: list[float] | None = None,
) -> dict:
    """The lever's row: PASS / FAIL with the figures and the reasons (module docstring). ``baseline_curve``:
    the baseline's losses, step by step, which a lever computing the same training (``Lever.same_training``)
    keeps within its tolerance at every step."""
    tol = tolerance(LEVERS[name], precision)
    row = {"lever": name, "setting": LEVERS[name].setting, "tolerance": tol}
    if "error" in run:
        return {
            **row,
            "status": "FAIL",
            "reasons": [run["error"]],
            "traceback": run.get("traceback") or run.get("output_tail", ""),
        }
    losses = run["losses"]
    first, last = losses[0], losses[-1]
    rel = abs(first - baseline_first) / abs(baseline_first) if baseline_first else None
    reasons = []
    if not run["applied"]:
        reasons.append(f"not in effect: {run['choice']}")
    if not all(math.isfinite(loss) for loss in losses):
        reasons.append(f"non-finite loss {losses}")
    elif not last < first:
        reasons.append(f"loss did not fall ({first:.4f} -> {last:.4f})")
    if rel is not None and not rel <= tol:
        reasons.append(f"first-step loss {rel:.1e} from the baseline's (tolerance {tol:.0e})")
    curve = None
    if LEVERS[name].same_training and baseline_curve and len(baseline_curve) == len(losses):
        apart = [abs(a - b) / abs(b) if b else math.inf for a, b in zip(losses, baseline_curve, strict=True)]
        curve = max(apart)
        worst = apart.index(curve)
        if not curve <= tol:
            reasons.append(
                f"loss curve {curve:.1e} from the baseline's at step {worst + 1} "
                f"({losses[worst]:.4f} vs {baseline_curve[worst]:.4f}; tolerance {tol:.0e})"
            )
    return {
        **row,
        **{k: run[k] for k in ("losses", "step_time_s", "peak_memory_mb", "choice", "attention", "epochs")},
        "first_loss": first,
        "last_loss": last,
        "rel_diff_first": rel,
        "rel_diff_curve": curve,
        "process_wall_s": run.get("process_wall_s"),
        "status": "FAIL" if reasons else "PASS",
        "reasons": reasons,
    }


def show(row: dict) -> None:
    name = f"{row['lever']:<24}"
    if row["status"] in ("SKIP", "STOP"):
        print(f"{row['status']}  {name}{row['reason']}", flush=True)
        return
    if "losses" not in row:
        print(f"FAIL  {name}{'; '.join(row['reasons'])}", flush=True)
        for line in row["traceback"].strip().splitlines()[-TRACEBACK_LINES:]:
            print(f"        | {line}", flush=True)
        return
    rel, curve = row["rel_diff_first"], row.get("rel_diff_curve")
    versus = f"{rel:.1e} (tol {row['tolerance']:.0e})" if rel is not None else "n/a"
    if curve is not None:
        versus += f", curve {curve:.1e}"
    peak = f"{row['peak_memory_mb']:,.0f} MiB" if row["peak_memory_mb"] is not None else "n/a"
    step = f"{row['step_time_s']:.3f} s" if row["step_time_s"] is not None else "n/a"
    print(
        f"{row['status']}  {name}loss {row['first_loss']:.4f} -> {row['last_loss']:.4f}  first vs baseline "
        f"{versus}  step {step}  peak {peak}",
        flush=True,
    )
    print(f"        {row['choice']}", flush=True)
    for reason in row["reasons"]:
        print(f"        ! {reason}", flush=True)


def run_matrix(args: argparse.Namespace, on_cuda: bool, workdir: Path) -> list[dict]:
    """The baseline alone first (the others compare with it, and it saves the common model), then the other
    levers, ``--parallel`` processes at a time (each process spends most of its time importing and starting
    CUDA: on an H100, 15-17 s a lever against 0.3 s a step), each row printed in the levers' order."""
    unmet = missing(on_cuda)
    levers = ["baseline", *[name for name in args.levers if name != "baseline"]]
    budget = Budget(args.budget_s)
    baseline: dict = {}

    def one(index: int, name: str) -> dict:
        reason = skip_reason(LEVERS[name], unmet)
        if reason is None and budget.left() < 5:
            reason = f"no time left in --budget-s {args.budget_s:.0f}"
        if reason is not None:
            return {"lever": name, "setting": LEVERS[name].setting, "status": "SKIP", "reason": reason}
        limit = min(args.lever_timeout_s, budget.left())
        run = run_contender(
            Path(__file__), name, workdir, index, shape_args(args), repo=REPO, timeout_s=limit
        )
        if run.get("timed_out") and limit < args.lever_timeout_s:  # the budget stopped it, not its own limit
            return {
                "lever": name,
                "setting": LEVERS[name].setting,
                "status": "STOP",
                "reason": (
                    f"stopped unfinished after {limit:.0f} s, what was left of --budget-s "
                    f"{args.budget_s:.0f}: no verdict "
                    f"(alone: python benchmarks/gpu_levers.py --levers {name})"
                ),
            }
        return judge(
            name, run, baseline.get("first_loss"), args.precision, baseline_curve=baseline.get("losses")
        )

    rows = [one(0, "baseline")]
    show(rows[0])
    if "first_loss" in rows[0]:
        baseline.update(rows[0])
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:  # each worker waits on its own process
        futures = [pool.submit(one, index, name) for index, name in enumerate(levers) if index > 0]
        for future in futures:
            rows.append(future.result())
            show(rows[-1])
    return rows


# --------------------------------------------------------------------------------------------------
# Child: one lever, a few steps
# --------------------------------------------------------------------------------------------------


def base_folder(args: argparse.Namespace) -> Path:
    """The common initial model, built by the engine from its config and saved once (by the first lever)."""
    import torch

    from fastlm.engine.config import ModelParams
    from fastlm.engine.model.build import build_model

    folder = Path(args.workdir) / "base"
    if not (folder / "config.json").is_file():
        params = ModelParams(
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            intermediate_size=args.intermediate,
            attn_implementation="sdpa",
        )
        torch.manual_seed(0)
        model = build_model(params, VocabOf(args.vocab), max_length=args.seq_len, attn_implementation="sdpa")
        model.save_pretrained(str(folder))
    return folder


def token_rows(args: argparse.Namespace):
    """The data (module docstring) as the engine's ``TokenSequences``."""
    import numpy as np

    from fastlm.engine.data.token_dataset import TokenSequences

    spec = SimpleNamespace(
        lengths="short", rows=8 * args.rows, median_len=max(args.seq_len // 4, 4), max_len=args.seq_len // 2
    )
    samples = make_rows(spec, args.vocab)
    ends = np.cumsum([len(s) for s in samples])
    kept = samples[: max(1, int(np.searchsorted(ends, FILL * args.rows * args.seq_len, side="right")))]
    lengths = np.array([len(s) for s in kept])
    return TokenSequences(np.concatenate(kept), np.concatenate([[0], np.cumsum(lengths)]))


def lever_params(args: argparse.Namespace, name: str, base: Path):
    """``params:train`` of the baseline with the lever's overrides merged in."""
    from fastlm.engine.config import parse_train_params

    raw = {
        "model": {
            "name_or_path": str(base),
            "liger": "off",
            "gradient_checkpointing": "off",
        },
        "loss": {"fused_linear": False, "fused_linear_kernel": "fastlm"},
        "batching": {
            "mode": "packed",
            "micro_batch_size": args.rows,
            "row_length": args.seq_len,
            "gradient_accumulation_steps": 1,
        },
        "optimizer": {"name": "adamw", "lr": args.lr, "warmup_steps": 0, "decay": "constant"},
        "runtime": {"device": args.device, "precision": args.precision, "compile": False, "float8": "off"},
        "max_steps": args.steps,
        "seed": 0,
        "log_every": 1,
        "eval_every": None,
        "save_every": None,
        "resume": "never",
        "checkpoint_dir": str(Path(args.workdir) / f"checkpoints_{name}"),
        "quiet": True,
    }
    for section, values in LEVERS[name].overrides.items():
        raw[section] = {**raw[section], **values}
    return parse_train_params(raw)


def in_effect(name: str, result, model) -> tuple[bool, str]:
    """Whether the engine ran the lever, and its own words for what it did."""
    import torch

    from fastlm.engine.model.recompute import checkpointed_layers

    summary = result.summary
    kernels = {
        "baseline": None,
        "fused_linear": "fastlm",
        "fused_linear_liger": "liger",
        "fused_linear_cce": "cce",
    }
    if name in kernels:
        kernel = kernels[name]
        return summary["fused_linear_kernel"] == kernel, summary["fused_linear_choice"]
    if name == "liger":
        return summary["liger"].startswith("liger kernels on"), summary["liger"]
    if name in ("lora", "qlora", "dora", "qlora_dora"):
        layers = {type(m).__name__ for m in model.modules()}
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in model.parameters())
        four_bit = "Linear4bit" in layers  # bitsandbytes' 4-bit layer, and peft's LoRA wrapper of it
        adapted = any("lora_A" in n for n, _ in model.named_modules()) and trainable < total
        embedding = model.get_input_embeddings().weight.dtype  # QLoRA: left in bf16 (lora.prepare_quantized)
        fp32_trainable = all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
        dora = any("lora_magnitude_vector" in n for n, _ in model.named_parameters())
        fused = sum(type(m).__name__.startswith("FusedLoraLinear") for m in model.modules())
        wanted = adapted and four_bit == name.startswith("qlora") and fp32_trainable
        return wanted and dora == name.endswith("dora"), (
            f"{trainable:,} of {total:,} parameters trainable (fp32: {'yes' if fp32_trainable else 'no'}); "
            f"4-bit layers: {'yes' if four_bit else 'no'}; embedding {str(embedding).removeprefix('torch.')}"
            + (f"; DoRA magnitudes: yes, {fused} fused LoRA layers" if dora else "")
        )
    if name in ("adamw_8bit", "paged_adamw_8bit"):
        return summary["optimizer"] == name, f"optimizer {summary['optimizer']}"
    if name.startswith("checkpointing_"):
        policy, layers = summary["gradient_checkpointing"], checkpointed_layers(model)
        return policy == name.removeprefix("checkpointing_") and bool(layers), (
            f"gradient checkpointing {policy}: layers {layers}"
        )
    if name == "float8":
        converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
        return bool(result.runtime.float8) and converted > 0, (
            f"{result.runtime.float8_choice}; {converted} Float8Linear layers"
        )
    if name == "param_dtype_fp32":
        dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
        return summary["param_dtype"].startswith("fp32 weights") and dtypes == {"float32"}, (
            f"{summary['param_dtype']}; weights {', '.join(sorted(dtypes))}"
        )
    if name == "compile":
        return bool(summary["compiled"]), f"compiled: {summary['compiled']}, attention {summary['attention']}"
    if name.startswith("cuda_graphs"):  # the run's own count: graphs recorded, none of its compiles without
        graphs = summary.get("cuda_graphs") or "none"
        recorded = re.match(r"(\d+) recorded", graphs)
        ok = recorded is not None and int(recorded.group(1)) > 0 and "ran without" not in graphs
        if name == "cuda_graphs_accumulation":
            ok = ok and summary["param_dtype"].startswith("fp32 weights")
        return ok, f"CUDA graphs: {graphs}; {summary['param_dtype']}"
    if name == "compile_layers":
        from fastlm.engine.runtime.regions import compiled_layers, repeated_layers

        layers, compiled = repeated_layers(model), compiled_layers(model)
        return bool(summary["compiled"]) and compiled == len(layers) > 0, (
            f"compiled: {summary['compiled']}, {compiled} of {len(layers)} layers compiled in place, "
            f"attention {summary['attention']}"
        )
    raise KeyError(name)


def train_lever(args: argparse.Namespace) -> dict:
    from fastlm.engine.model.attention.choice import choose_attention
    from fastlm.engine.model.build import build_model
    from fastlm.engine.runtime.environment import setup_runtime
    from fastlm.engine.train.loop import train

    base = base_folder(args)
    params = lever_params(args, args.run, base)
    runtime = setup_runtime(params.runtime, seed=params.seed)
    attn = choose_attention(params.model.attn_implementation, runtime.device, runtime.precision)
    model = build_model(params.model, VocabOf(args.vocab), max_length=args.seq_len, attn_implementation=attn)
    result = train(
        model,
        token_rows(args),
        None,
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=args.seq_len,
        attn=attn,
    )
    applied, choice = in_effect(args.run, result, result.model)
    later = [record["step_time_s"] for record in result.history[1:]]
    return {
        "losses": [record["loss"] for record in result.history],
        "step_time_s": statistics.median(later) if later else None,
        "first_step_s": result.summary.get("first_step_s"),
        "peak_memory_mb": result.summary.get("peak_memory_mb"),
        "epochs": result.summary.get("epochs"),
        "attention": result.summary.get("attention"),
        "applied": applied,
        "choice": choice,
    }


def child_main(args: argparse.Namespace) -> None:
    """One lever; an exception is the lever's result (a FAIL with its traceback), never the matrix's end."""
    result: dict = {"lever": args.run}
    try:
        result.update(train_lever(args))
    except Exception as error:
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        result.update(error=f"{type(error).__name__}: {first_line}", traceback=traceback.format_exc())
    Path(args.result).write_text(json.dumps(result, default=str))


# --------------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument(
        "--precision",
        choices=("auto", "bf16", "fp32"),
        default="auto",
        help="auto: bf16 on CUDA, fp32 on CPU",
    )
    parser.add_argument(
        "--levers", nargs="+", choices=tuple(LEVERS), default=list(LEVERS), help="default: all of them"
    )
    parser.add_argument("--hidden", type=int, default=SHAPE["hidden"])
    parser.add_argument("--layers", type=int, default=SHAPE["layers"])
    parser.add_argument("--heads", type=int, default=SHAPE["heads"])
    parser.add_argument("--intermediate", type=int, default=SHAPE["intermediate"])
    parser.add_argument("--vocab", type=int, default=SHAPE["vocab"])
    parser.add_argument("--rows", type=int, default=4, help="packed rows per step (default 4)")
    parser.add_argument("--seq-len", type=int, default=512, help="tokens per packed row (default 512)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per lever (default 3)")
    parser.add_argument("--lr", type=float, default=2e-3, help="constant learning rate (default 2e-3)")
    parser.add_argument(
        "--budget-s", type=float, default=300.0, help="the whole matrix (default 300 s); later levers SKIP"
    )
    parser.add_argument(
        "--lever-timeout-s", type=float, default=150.0, help="one lever's process at most (default 150 s)"
    )
    parser.add_argument(
        "--parallel",
        type=int,
        default=1,
        help="levers run at once after the baseline (default 1; a GPU session: 4). Above 1 the step times "
        "share the machine: the loss checks and peak memory hold, the step times are no speed A/B",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the rows to this JSON file")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder, removed")
    parser.add_argument("--run", choices=tuple(LEVERS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error("--parallel must be >= 1")
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the loss must fall from the first step to the last)")
    if args.seq_len < 16 or args.rows < 1:
        parser.error("--seq-len must be >= 16 and --rows >= 1")
    if args.hidden % args.heads:
        parser.error(f"--hidden {args.hidden} must be a multiple of --heads {args.heads}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.run:
        child_main(args)
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu_levers.py: --device cuda, but torch sees no GPU here; use --device cpu or auto",
            file=sys.stderr,
        )
        return 2
    on_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    args.device = "cuda" if on_cuda else "cpu"
    if args.precision == "auto":
        args.precision = "bf16" if on_cuda else "fp32"
    info, gpu = machine(torch.get_num_threads()), gpu_info()
    print(
        f"device {args.device} ({gpu.get('name', 'no GPU')}), precision {args.precision}; Llama hidden "
        f"{args.hidden}, {args.layers} layers, {args.heads} heads, intermediate {args.intermediate}, vocab "
        f"{args.vocab:,}; {args.rows} packed rows of {args.seq_len} tokens, {args.steps} steps per lever"
        + (f"; {args.parallel} levers at once (shared: no speed A/B)" if args.parallel > 1 else ""),
        flush=True,
    )
    print(f"versions: {json.dumps(info['versions'])}", flush=True)
    print(
        f"first-step loss vs the baseline's, relative tolerance: {TOLERANCE[args.precision]:.0e}"
        + (f" ({QUANTIZED_TOLERANCE:.0e} for 4-bit and float8)" if args.precision == "bf16" else ""),
        flush=True,
    )
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fastlm_gpu_levers_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        rows = run_matrix(args, on_cuda, workdir)
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    statuses = ("PASS", "FAIL", "STOP", "SKIP")
    counts = {status: sum(row["status"] == status for row in rows) for status in statuses}
    summary = "levers: {PASS} pass, {FAIL} fail, {STOP} stopped, {SKIP} skip".format(**counts)
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        payload = {"settings": settings, "machine": info, "gpu": gpu, "rows": rows, "summary": counts}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=1, default=str))
        print(f"wrote {args.json}", flush=True)
    print(summary, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
