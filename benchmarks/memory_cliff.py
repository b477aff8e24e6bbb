"""Benchmark (GPU issue): the memory cliff of a QLoRA fine-tune on a 24 GB budget, and fastlm's ``tune``
ladder choosing a set-up on its fast side.

The issue's report: QLoRA with the Hugging Face ``Trainer`` + peft on a 24 GB card, gradient checkpointing
and mixed precision off, micro-batch 16 took 2.4x longer per step than micro-batch 8 (twice the rows, so
1.2x fewer tokens/s: memory near the card's limit, the caching allocator freeing and retrying). This script
rebuilds that situation on any larger GPU and measures it; then it runs the tune pipeline's ladder on the
same budget and prints what it chooses.

    python benchmarks/memory_cliff.py                 # GPU: Llama-3.2-3B shape, 24 GiB cap, the issue's run
    python benchmarks/memory_cliff.py --lengths full --max-len 2048   # 2048-token rows, not short texts
    python benchmarks/memory_cliff.py --dry-run       # CPU, tiny config, seconds: the same code path

Model: a Llama-3.2-3B shape built from its config, nothing downloaded (``LlamaConfig``: hidden 3072, 28
layers, 24 heads, 8 KV heads, intermediate 8192, vocab 128256, tied embeddings, rope theta 500000), random
weights (``torch.manual_seed(0)``, built in bf16) saved once with ``save_pretrained`` in the work folder and
loaded back by each contender as a user's local checkpoint. ``--tiny`` / ``--dry-run``: hidden 64, 2 layers,
4 heads, 2 KV heads, intermediate 128, vocab 512.

Budget: ``torch.cuda.set_per_process_memory_fraction(budget / total)`` (``--budget-gib``, default 24), set
after the base is saved and before the first trial: allocations past it raise out-of-memory as on a 24 GB card
(the allocator frees its cache and retries first, the cliff's mechanism). CPU: no cap.

Data: ``--lengths short`` (default), the users' short texts: token-id rows with log-normal lengths (median
``--median-len`` 96 tokens, at most ``--max-len`` 512), EOS last, random ids; ``--lengths full``: every row
``--max-len`` tokens (pass ``--max-len 2048`` for the 2048-token rows; at fp32 without checkpointing a
micro-batch of 8 such rows needs far more than 24 GB of activations on this shape, so it only shows the
out-of-memory side). Not timed.

1. The cliff (Trainer + peft, the usual QLoRA set-up): ``BitsAndBytesConfig`` NF4 4-bit base with fp32
   compute (mixed precision off) where bitsandbytes is there (CUDA, or CPU from its version 0.50), else LoRA
   on an fp32 base (labelled);
   ``prepare_model_for_kbit_training(use_gradient_checkpointing=False)``, ``get_peft_model`` LoRA r 16,
   alpha 32, no dropout on the attention and MLP projections; ``TrainingArguments`` defaults (no gradient
   checkpointing, AdamW) with ``bf16=False``, ``fp16=False``, dynamic padding (each batch padded to its
   longest row, random order), ``--warmup`` untimed then ``--timed`` timed steps per micro-batch size of
   ``--batches`` (default 8,16), each on a freshly loaded model in this process (the previous trial's memory
   freed and the peak statistics reset). Per step: wall time between ``on_step_begin`` and ``on_step_end``,
   both after ``torch.cuda.synchronize``; real (non-padding) tokens/s over the timed steps; peak allocated and
   reserved memory; the allocator's ``num_alloc_retries`` during the trial.
2. fastlm's choice: ``fastlm.engine.train.tune`` as ``kedro run --pipeline=tune`` runs it (``tune_modes`` over
   ``--modes``, default ``packed`` and ``length_grouped``; ``tune_checkpointing`` with ``--checkpointing``,
   ``best_policy``, ``explain_modes``) on the same base folder (``train.model.lora``, 4-bit where the Trainer
   was), same data and the same budget as ``memory_limit_mb`` less the 10 % headroom, micro-batch sizes
   1 .. ``--max-size``, fastlm's own runtime defaults (``--fastlm-precision`` auto: bf16 on a GPU that has it;
   ``--fastlm-compile`` auto), ``--tune-max-minutes`` as ``tune.max_minutes`` (none by default). The H100 run
   of 2026-11-26 (docs/gpu-runs, h100-c) spent more than 150 s in the ladder at these defaults without
   finishing; each phase's line now starts with the seconds elapsed.

What a step holds differs: the Trainer's micro-batch is N short texts padded to the longest (about N x
median real tokens), fastlm's packed micro-batch N rows of ``--max-len`` token slots (several texts each).
Compare real tokens/s, not step times across the two; the cliff itself is read within the Trainer (step time
16 vs 8).

Targets (printed as PASS/FAIL, never asserted): the cliff reproduced (the largest ``--batches`` size at least
5 % fewer real tokens/s than the one before, or out of memory); fastlm's choice on the fast side (its real
tokens/s at least the Trainer's on the cliff side, its peak memory within the budget less the headroom).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Sibling module (scripts run from benchmarks/); importing train_speed also sets the offline environment.
from train_speed import machine

LLAMA_3B = {
    "hidden_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
}
TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 512,
    "tie_word_embeddings": True,
}
PAD, BOS, EOS = 0, 1, 2
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA = {"r": 16, "alpha": 32, "dropout": 0.0}
HEADROOM = 0.10  # conf/base/parameters_tune.yml
CLIFF_TOLERANCE = 0.05
OOM = "out of memory"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="the tiny config instead of the 3B shape")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="--device cpu --tiny, small sizes and steps: the code path only",
    )
    parser.add_argument(
        "--budget-gib", type=float, default=24.0, help="GPU memory cap (per-process fraction)"
    )
    parser.add_argument("--batches", default="8,16", help="the Trainer's micro-batch sizes, in order")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per trial")
    parser.add_argument("--timed", type=int, default=4, help="timed steps per trial")
    parser.add_argument("--lengths", default="short", choices=["short", "full"])
    parser.add_argument("--median-len", type=int, default=96)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--rows", type=int, default=4096, help="texts in the data set")
    parser.add_argument("--max-size", type=int, default=64, help="fastlm tune: largest micro-batch tried")
    parser.add_argument("--checkpointing", default="auto", choices=["off", "selective", "full", "auto"])
    parser.add_argument("--fastlm-precision", default="auto", choices=["auto", "bf16", "fp16", "fp32"])
    parser.add_argument(
        "--fastlm-compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="fastlm's train.runtime.compile in the tune ladder (off: eager, as the Trainer side runs)",
    )
    parser.add_argument(
        "--tune-max-minutes",
        type=float,
        default=None,
        help="fastlm's tune.max_minutes: no new trial, mode or checkpointing policy after this long",
    )
    parser.add_argument(
        "--modes",
        default="packed,length_grouped",
        help="fastlm's batching modes the tune ladder measures, comma-separated",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary folder, removed")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.device, args.tiny = "cpu", True
        args.batches, args.warmup, args.timed = "2,4", 1, 1
        args.rows, args.max_len, args.median_len, args.max_size = 96, 64, 16, 4
    return args


def versions_and_device(args, device) -> dict:
    import torch

    info = {"machine": machine(torch.get_num_threads()), "device": str(device)}
    info["versions"] = {**info["machine"].pop("versions"), "bitsandbytes": _version("bitsandbytes")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_total_gib=props.total_memory / 2**30, cuda=torch.version.cuda)
    return info


def _version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def quantized_available(device) -> bool:
    """bitsandbytes' 4-bit weights on this device: CUDA, or CPU from bitsandbytes 0.50 (its CPU backend: the
    dry run then takes the GPU run's QLoRA path)."""
    from fastlm.engine.config import bitsandbytes_missing

    return device.type in ("cuda", "cpu") and bitsandbytes_missing() is None


def make_rows(args, vocab: int) -> list[list[int]]:
    """The data (module docstring): short log-normal lengths or full rows; EOS last, ids past the specials."""
    import numpy as np

    rng = np.random.default_rng(0)
    if args.lengths == "full":
        lengths = np.full(args.rows, args.max_len)
    else:
        lengths = np.clip(rng.lognormal(math.log(args.median_len), 0.6, args.rows), 4, args.max_len)
    return [[*rng.integers(3, vocab, int(n) - 1).tolist(), EOS] for n in lengths.astype(int)]


def save_base(args, folder: Path, device) -> dict:
    """The 3B (or tiny) Llama from its config, random bf16 weights, saved as a user's local checkpoint."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = TINY if args.tiny else LLAMA_3B
    config = LlamaConfig(
        **shape,
        max_position_embeddings=max(args.max_len, 2048),
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        use_cache=False,
    )
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # 6.4 GB instead of 12.9 for the 3B shape; init is faster
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(folder))
    del model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {"parameters": n_params, "shape": shape}


def cap_memory(args, device) -> float | None:
    """The per-process cap (MB), or None on CPU."""
    import torch

    if device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, args.budget_gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction * total / 2**20


class PaddingCollator:
    """Dynamic padding (each batch to its longest row), labels -100 on padding; counts the real tokens."""

    def __init__(self) -> None:
        self.real_tokens: list[int] = []

    def __call__(self, features: list[dict]) -> dict:
        import torch

        longest = max(len(f["input_ids"]) for f in features)
        ids = torch.full((len(features), longest), PAD, dtype=torch.long)
        mask = torch.zeros((len(features), longest), dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature["input_ids"])
            ids[row, :n] = torch.tensor(feature["input_ids"])
            mask[row, :n] = 1
        self.real_tokens.append(int(mask.sum()))
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def trainer_trial(args, base: Path, rows, batch: int, device, quantized: bool, workdir: Path) -> dict:
    """One micro-batch size with the Trainer + peft (module docstring, 1.); out of memory is a result."""
    import torch
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    on_cuda = device.type == "cuda"
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            if on_cuda:
                torch.cuda.synchronize(device)
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            if on_cuda:
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - self.start)

    load: dict = {"dtype": torch.float32}
    if quantized:
        from transformers import BitsAndBytesConfig

        load["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        )
        load["device_map"] = {"": device.index or 0} if on_cuda else {"": "cpu"}
    collator = PaddingCollator()
    model = trainer = None
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
        retries_before = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), attn_implementation="sdpa", **load)
        if quantized:
            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
        model = get_peft_model(
            model,
            LoraConfig(
                r=LORA["r"],
                lora_alpha=LORA["alpha"],
                lora_dropout=LORA["dropout"],
                target_modules=LORA_TARGETS,
                task_type="CAUSAL_LM",
            ),
        )
        training = TrainingArguments(
            output_dir=str(workdir / f"trainer_{batch}"),
            per_device_train_batch_size=batch,
            max_steps=args.warmup + args.timed,
            bf16=False,
            fp16=False,
            learning_rate=2e-4,
            logging_strategy="no",
            save_strategy="no",
            report_to="none",
            dataloader_num_workers=0,
            use_cpu=not on_cuda,
            disable_tqdm=True,
            seed=0,
        )
        data = [{"input_ids": ids} for ids in rows]
        trainer = Trainer(
            model=model, args=training, train_dataset=data, data_collator=collator, callbacks=[StepTimer()]
        )
        trainer.remove_callback(PrinterCallback)  # its end-of-training dict: the figures are printed below
        trainer.train()
        status = "ok"
    except torch.OutOfMemoryError as error:
        status, times = OOM, []
        print(f"  micro-batch {batch}: {str(error).splitlines()[0][:160]}", flush=True)
    finally:
        del trainer, model
        gc.collect()
    result = {"micro_batch_size": batch, "status": status}
    if on_cuda:
        result.update(
            peak_memory_mb=torch.cuda.max_memory_allocated(device) / 2**20,
            peak_reserved_mb=torch.cuda.max_memory_reserved(device) / 2**20,
            alloc_retries=torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries_before,
        )
        torch.cuda.empty_cache()
    timed = times[args.warmup :]
    if status == "ok" and timed:
        # the collator runs one batch ahead at most; the real tokens of the timed steps are theirs
        tokens = collator.real_tokens[args.warmup : args.warmup + len(timed)]
        result.update(
            step_time_s=statistics.median(timed),
            real_tokens_per_s=sum(tokens) / sum(timed),
            real_tokens_per_step=sum(tokens) / len(tokens),
        )
    return result


class VocabOf:
    """What ``build_model`` reads from a tokenizer: its length and special ids (no tokenizer is needed)."""

    bos_token_id, eos_token_id, pad_token_id = BOS, EOS, PAD

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def fastlm_tune(args, base: Path, rows, device, quantized: bool, limit_mb: float | None, vocab: int) -> dict:
    """The tune pipeline's ladder on the same base, data and budget (module docstring, 2.)."""
    import functools

    import numpy as np

    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.model.attention.choice import choose_attention
    from fastlm.engine.model.build import build_model
    from fastlm.engine.model.recompute import enable_checkpointing
    from fastlm.engine.runtime.environment import setup_runtime
    from fastlm.engine.train import tune

    params = parse_train_params(
        {
            "model": {
                "name_or_path": str(base),
                "lora": {"enabled": True, **LORA, "target_modules": LORA_TARGETS, "load_in_4bit": quantized},
                "gradient_checkpointing": args.checkpointing,
            },
            "runtime": {
                "device": device.type,
                "precision": args.fastlm_precision,
                "compile": {"auto": "auto", "on": True, "off": False}[args.fastlm_compile],
            },
            "quiet": True,
        }
    )
    runtime = setup_runtime(params.runtime, seed=params.seed)
    attn = choose_attention(
        params.model.attn_implementation,
        runtime.device,
        runtime.precision,
        row_length=params.batching.longest_row(args.max_len),
    )
    model = build_model(params.model, VocabOf(vocab), max_length=args.max_len, attn_implementation=attn)
    lengths = np.array([len(r) for r in rows])
    train_set = TokenSequences(np.concatenate(rows), np.concatenate([[0], np.cumsum(lengths)]))
    settings = tune.LadderSettings(
        warmup=args.warmup,
        timed=args.timed,
        sizes=tune.ladder(1, args.max_size),
        memory_limit_mb=limit_mb,
        headroom=HEADROOM,
        cliff_tolerance=CLIFF_TOLERANCE,
        deadline=tune.deadline_after(args.tune_max_minutes),
    )
    run_modes = functools.partial(
        tune.tune_modes,
        model,
        train_set,
        args.modes.split(","),
        params=params,
        runtime=runtime,
        pad_id=PAD,
        max_length=args.max_len,
        attn=attn,
        settings=settings,
    )
    policies = tune.tune_checkpointing(
        run_modes,
        functools.partial(enable_checkpointing, model),
        args.checkpointing,
        deadline=settings.deadline,
    )
    picked = tune.best_policy(policies) or policies[0]
    best = tune.best_mode(picked.ladders)
    explanation = tune.explain_modes(
        picked.ladders, best, current_accumulation=1, target=None, headroom=HEADROOM, memory_limit_mb=limit_mb
    )
    explanation = " ".join(filter(None, [explanation, tune.explain_checkpointing(policies, picked)]))
    del model
    gc.collect()
    return {
        "precision": runtime.precision,
        "compile": runtime.compile,
        "attention": attn,
        "trials": [
            {"checkpointing": p.policy, "mode": ladder.mode, **trial.as_row()}
            for p in policies
            for ladder in p.ladders
            for trial in ladder.trials
        ],
        "chosen": (
            {"checkpointing": picked.policy, "mode": best.mode, **best.chosen.as_row()} if best else None
        ),
        "explanation": explanation,
    }


def verdicts(trainer: list[dict], chosen: dict | None, limit_mb: float | None) -> list[tuple[str, bool, str]]:
    """The two targets (module docstring) as (name, passed, figures)."""
    before, last = trainer[-2], trainer[-1]
    if last["status"] == OOM:
        cliff, figures = True, f"micro-batch {last['micro_batch_size']} ran out of memory"
    elif before.get("real_tokens_per_s") and last.get("real_tokens_per_s"):
        ratio = last["step_time_s"] / before["step_time_s"]
        drop = 1 - last["real_tokens_per_s"] / before["real_tokens_per_s"]
        cliff = drop >= CLIFF_TOLERANCE
        figures = (
            f"step {last['micro_batch_size']} / {before['micro_batch_size']}: {ratio:.2f}x the time, "
            f"{-drop:+.1%} real tokens/s (the issue: 2.4x the time, -17 %)"
        )
    else:
        cliff, figures = False, "nothing measured"
    fast_side, why = False, "tune chose nothing"
    if chosen is not None:
        cliff_side = last.get("real_tokens_per_s") or 0.0
        within = limit_mb is None or chosen["peak_memory_mb"] <= limit_mb * (1 - HEADROOM)
        fast_side = within and chosen["real_tokens_per_s"] >= cliff_side
        why = (
            f"{chosen['real_tokens_per_s']:,.0f} real tokens/s at {chosen['peak_memory_mb']:,.0f} MB against "
            f"the Trainer's {cliff_side:,.0f} at micro-batch {last['micro_batch_size']}"
        )
        fitted = [row for row in trainer if row.get("real_tokens_per_s")]
        if fitted:  # the user's fastest set-up short of the cliff, for scale
            best = max(fitted, key=lambda row: row["real_tokens_per_s"])
            why += (
                f"; its fastest that ran: {best['real_tokens_per_s']:,.0f} at micro-batch "
                f"{best['micro_batch_size']} ({chosen['real_tokens_per_s'] / best['real_tokens_per_s']:.1f}x)"
            )
    return [
        ("the cliff reproduced with the Trainer", cliff, figures),
        ("tune chose a set-up on the fast side of it", fast_side, why),
    ]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    batches = [int(b) for b in args.batches.split(",")]
    if len(batches) < 2:
        print("--batches needs two sizes or more (e.g. 8,16)", file=sys.stderr)
        return 2
    started = time.perf_counter()

    def stamp() -> str:  # seconds since the start: where a stopped run spent its time
        return f"[+{time.perf_counter() - started:.0f} s]"

    info = versions_and_device(args, device)
    print(json.dumps(info, indent=1), flush=True)
    if args.dry_run or device.type == "cpu":
        print("CPU run: no memory cap, the figures say nothing of a GPU; the code path only.", flush=True)
    quantized = quantized_available(device)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="memory_cliff_"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        base = workdir / "base"
        built = save_base(args, base, device)
        shape = built["shape"]
        print(
            f"{stamp()} model: Llama {shape}, {built['parameters']:,} parameters, saved to {base}", flush=True
        )
        limit_mb = cap_memory(args, device)
        if limit_mb is not None:
            print(f"memory cap: {limit_mb / 1024:.1f} GiB (set_per_process_memory_fraction)", flush=True)
        rows = make_rows(args, shape["vocab_size"])
        lengths = [len(r) for r in rows]
        print(
            f"data: {len(rows):,} rows ({args.lengths}), median {statistics.median(lengths):.0f} tokens, "
            f"max {max(lengths)}",
            flush=True,
        )
        adapter = (
            "QLoRA (NF4 4-bit base, fp32 compute)" if quantized else "LoRA on an fp32 base (no 4-bit here)"
        )
        print(f"{stamp()} Trainer + peft, {adapter}, checkpointing off, mixed precision off:", flush=True)
        trainer = []
        for batch in batches:
            result = trainer_trial(args, base, rows, batch, device, quantized, workdir)
            trainer.append(result)
            print(f"  {stamp()} {json.dumps(result)}", flush=True)
        print(
            f"{stamp()} fastlm tune ladder on the same budget (modes {args.modes}, micro-batch 1 .. "
            f"{args.max_size}, compile {args.fastlm_compile}, checkpointing {args.checkpointing}, "
            f"at most {args.tune_max_minutes or 'unlimited'} minutes):",
            flush=True,
        )
        tuned = fastlm_tune(args, base, rows, device, quantized, limit_mb, shape["vocab_size"])
        for trial in tuned["trials"]:
            print(f"  {json.dumps(trial)}", flush=True)
        print(f"{stamp()} tune: {tuned['explanation']}", flush=True)
        print(
            "What a step holds differs: the Trainer's micro-batch is N padded short texts, fastlm's packed "
            f"one N rows of {args.max_len} token slots; compare real tokens/s, not step times.",
            flush=True,
        )
        results = verdicts(trainer, tuned["chosen"], limit_mb)
        for name, passed, figures in results:
            print(f"{'PASS' if passed else 'FAIL'}: {name} ({figures})", flush=True)
        if args.json:
            record = {**info, "trainer": trainer, "fastlm": tuned, "targets": {n: p for n, p, _ in results}}
            args.json.write_text(json.dumps(record, indent=1, default=str))
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
