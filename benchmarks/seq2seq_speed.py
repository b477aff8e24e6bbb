"""Benchmark: encoder-decoder training throughput, fastlm's engine against ``Seq2SeqTrainer``, same model and
data.

Data: the demo dialogues (``data/01_raw/demo_dialogues.jsonl``, dialogue -> summary), the first ``--rows``
with a non-empty dialogue and summary.
A byte-level BPE (``train_bpe_tokenizer``, vocab 8000) is trained on them once; each sample is the dialogue's
ids (truncated at ``--max-length``) as the prompt and the summary's ids + EOS as the response, the same ids
for both contenders. Model: a BART built from a config (d_model 128, 2 + 2 layers, 4 heads, ffn 344, vocab =
len(tokenizer)) after ``torch.manual_seed(0)``, saved with ``save_pretrained`` to a temporary folder; both
contenders load it from there (identical initial weights), SDPA attention, fp32, ``torch.set_num_threads``.

The demo dialogues' lengths follow SAMSum's utterance counts (a quarter each in 3-6, 7-12, 13-18 and 19-30
utterances; ``scripts/demo_data/dialogues.py``): prompts of 40-340 tokens (median ~130), summaries 13-89.

* ``fastlm_packed``: ``fastlm.engine.train.loop.train`` with ``build_model`` on the folder, batching
  ``packed`` (``PackedSeq2SeqCollator``: a token budget of ``--packed-rows`` x ``--max-length`` per step, by
  default the mean real tokens of ``--batch-size`` samples, so every contender trains on about as many tokens
  per step; several samples per encoder and decoder row, block-diagonal / causal / same-sample cross-attention
  masks, BART positions restarted per sample).
* ``fastlm``: the same with batching ``length_grouped`` (``Seq2SeqCollator``: encoder and decoder each padded
  to their own batch maximum, rounded up to 8).
* ``trainer``: ``transformers.Seq2SeqTrainer`` in its usual set-up: ``DataCollatorForSeq2Seq(tokenizer,
  model)`` (dynamic padding, labels padded with -100, decoder inputs by the model's own shift),
  ``Seq2SeqTrainingArguments(per_device_train_batch_size=batch, max_steps=warmup + steps, report_to=[],
  save_strategy="no", use_cpu=True, dataloader_num_workers=0, seed=0)``, everything else default.
* ``trainer_group_by_length``: the same with ``train_sampling_strategy="group_by_length"`` (transformers 5's
  length grouping: megabatches sorted by encoder length), the Trainer's best set-up for this data.

Real tokens: prompt + response + EOS tokens of the samples a step trains on (padding and the decoder start
token left out) — for fastlm its records' ``real_tokens_per_s`` minus ``samples_per_s`` (its decoder row holds
one start token per sample), over the timed windows (``timed_rate``); for the Trainer, counted from each
collated batch (``attention_mask.sum() + (labels != -100).sum()``), over the wall time from the end of step
``warmup`` to the end of the last step (a ``TrainerCallback``). Nothing is asserted: figures and the ratios of
both fastlm rows to the Trainer are printed with PASS/FAIL against the issue's 2x target (and written with
``--json``). On a shared machine the load changes from one contender to the next: ``--repeat N`` runs N rounds
of the three, in an order rotated round by round, and reports the medians and the median of each round's
ratio, both by wall time and per CPU second of this process (``time.process_time`` over the same timed steps:
less sensitive to other processes, though not immune to them).

    python benchmarks/seq2seq_speed.py                       # 3 warm-up + 20 timed steps each, batch 32
    python benchmarks/seq2seq_speed.py --repeat 4            # four rotated rounds, medians
    python benchmarks/seq2seq_speed.py --steps 3 --warmup 1 --rows 300   # smoke run
    # fastlm packed vs length_grouped steps alternated
    python benchmarks/seq2seq_speed.py --interleaved 10
    # bf16 autocast / torch.compile, every contender
    python benchmarks/seq2seq_speed.py --precision bf16 --compile on
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from statistics import median
from time import perf_counter, process_time

# speed_flags: a sibling module (the script runs from benchmarks/)
from speed_flags import COMPILE_FLAGS, add_speed_flags, peer_bf16

for _name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("DO_NOT_TRACK", "true")

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("fastlm_packed", "fastlm", "trainer", "trainer_group_by_length")


def load_samples(rows: int, max_length: int, workdir: Path):
    from fastlm.corpus.tokenizer_source import train_bpe_tokenizer

    lines = (ROOT / "data/01_raw/demo_dialogues.jsonl").open(encoding="utf-8")
    pairs = [
        row
        for row in map(json.loads, lines)  # the demo file holds a few dirty rows on purpose: skipped
        if isinstance(row.get("dialogue"), str)
        and row["dialogue"].strip()
        and isinstance(row.get("summary"), str)
        and row["summary"].strip()
    ][:rows]
    tokenizer = train_bpe_tokenizer(
        [p["dialogue"] for p in pairs] + [p["summary"] for p in pairs],
        vocab_size=8000,
        min_frequency=2,
        model_max_length=max_length,
    )
    tokenizer.save_pretrained(workdir / "model")
    eos = tokenizer.eos_token_id
    samples = [
        (
            tokenizer(p["dialogue"])["input_ids"][:max_length],
            tokenizer(p["summary"])["input_ids"][: max_length - 1] + [eos],
        )
        for p in pairs
    ]
    return tokenizer, samples


def save_model(tokenizer, folder: Path) -> None:
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(0)
    BartForConditionalGeneration(
        BartConfig(
            vocab_size=len(tokenizer),
            d_model=128,
            encoder_layers=2,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=344,
            decoder_ffn_dim=344,
            max_position_embeddings=512,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id,
            decoder_start_token_id=tokenizer.eos_token_id,
            forced_eos_token_id=None,
        )
    ).save_pretrained(folder)


def run_fastlm(tokenizer, samples, folder: Path, args, mode: str = "length_grouped", tag: str = "") -> dict:
    import numpy as np

    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.collators import pad_id_of
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.model.build import build_model
    from fastlm.engine.observe.rates import timed_rate
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from fastlm.engine.train.loop import train

    rows = [prompt + response for prompt, response in samples]
    lengths = np.array([len(r) for r in rows])
    data = TokenSequences(
        np.concatenate(rows),
        np.concatenate([[0], np.cumsum(lengths)]),
        np.array([len(prompt) for prompt, _ in samples]),
    )
    params = parse_train_params(
        {
            "model": {"name_or_path": str(folder)},
            "batching": {
                "mode": mode,
                "micro_batch_size": args.packed_rows if mode == "packed" else args.batch_size,
            },
            "max_steps": args.warmup + args.steps,
            "log_every": args.warmup,
            "eval_every": None,
            "save_every": None,
            "quiet": True,
            "checkpoint_dir": str(folder.parent / f"checkpoints-{mode}{tag}"),
            "resume": "never",
            "runtime": {
                "device": "cpu",
                "num_threads": args.threads,
                "precision": args.precision,
                "compile": COMPILE_FLAGS[args.compile],
            },
            "profile": {"enabled": False},
        }
    )
    runtime = setup_runtime(RuntimeConfig(**params.runtime.model_dump(), seed=params.seed))
    model = build_model(params.model, tokenizer, max_length=args.max_length, attn_implementation="sdpa")
    cpu: dict[int, float] = {}  # process CPU seconds at the end of each logged step

    def clock(kind: str, record: dict) -> None:
        if kind == "train":
            cpu[record["step"]] = process_time()

    result = train(
        model,
        data,
        None,
        params=params,
        runtime=runtime,
        pad_id=pad_id_of(tokenizer),
        max_length=args.max_length,
        attn="sdpa",
        callbacks=[clock],
    )
    # Records end at step 1, every warmup steps and the last: timed_rate leaves out the first record it gets,
    # so from the record of step ``warmup`` on, the windows it counts are exactly the timed steps.
    records = result.history[1:] if args.warmup > 1 else result.history
    real = timed_rate(records) - timed_rate(records, "samples_per_s")
    assert result.summary["batching"] == mode, result.summary["batching"]
    timed = [r for r in result.history if r["step"] > args.warmup]
    steps = [
        r["step"] - p["step"]
        for p, r in zip(result.history, result.history[1:], strict=False)
        if r["step"] > args.warmup
    ]
    tokens = sum(
        (r["real_tokens_per_s"] - r["samples_per_s"]) * n * r["step_time_s"]
        for r, n in zip(timed, steps, strict=True)
    )
    last = args.warmup + args.steps
    return {
        "real_tokens_per_s": real,
        "real_tokens_per_cpu_s": tokens / (cpu[last] - cpu[args.warmup]),
        "padding_efficiency": result.summary["padding_efficiency"],
        "final_loss": result.history[-1]["loss"],
    }


def interleaved(tokenizer, samples, folder: Path, args) -> dict:
    """fastlm packed vs length_grouped, their training steps alternated in one process (``--interleaved N``).

    The same model and weights run N steps of each batching in turn (forward, loss, backward; the collated
    batches are made beforehand, the masks by ``to_device`` inside the timed step), so both see the same
    machine load; returns microseconds of wall and CPU time per real token (prompt + response + EOS) for each.
    """
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from fastlm.engine.batching import make_batching, seq2seq_batching
    from fastlm.engine.config import parse_train_params
    from fastlm.engine.data.collators import pad_id_of
    from fastlm.engine.data.token_dataset import TokenSequences
    from fastlm.engine.model.attention.inputs import to_device
    from fastlm.engine.model.build import build_model
    from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits

    torch.set_num_threads(args.threads)
    rows = [prompt + response for prompt, response in samples]
    data = TokenSequences(
        np.concatenate(rows),
        np.concatenate([[0], np.cumsum([len(r) for r in rows])]),
        np.array([len(prompt) for prompt, _ in samples]),
    )
    params = parse_train_params({"model": {"name_or_path": str(folder)}})
    model = build_model(
        params.model, tokenizer, max_length=args.max_length, attn_implementation="sdpa"
    ).train()
    batches = {}
    for mode, size in (("packed", args.packed_rows), ("length_grouped", args.batch_size)):
        mode_params = params.model_copy(
            update={"batching": params.batching.model_copy(update={"mode": mode, "micro_batch_size": size})}
        )
        sampler, collator = make_batching(
            mode_params,
            data.lengths,
            pad_id=pad_id_of(tokenizer),
            max_length=args.max_length,
            seed=0,
            sides=seq2seq_batching(model, data, "sdpa"),
        )
        sampler.set_epoch(0)
        loader = DataLoader(data, batch_sampler=sampler, collate_fn=collator)
        batches[mode] = [batch for _, batch in zip(range(args.interleaved + 1), loader, strict=False)]
    totals = {mode: [0.0, 0.0, 0] for mode in batches}  # wall s, CPU s, real tokens
    for index in range(args.interleaved + 1):  # the first step of each is a warm-up
        for mode, mode_batches in batches.items():
            wall, cpu = perf_counter(), process_time()
            batch = to_device(mode_batches[index], torch.device("cpu"), "sdpa")
            loss_sum, targets = causal_lm_loss_sum(forward_logits(model, batch), batch["labels"])
            (loss_sum / targets).backward()
            model.zero_grad(set_to_none=True)
            if index:
                total = totals[mode]
                total[0] += perf_counter() - wall
                total[1] += process_time() - cpu
                total[2] += int(batch["num_real_tokens"]) - int(batch["num_samples"])
    return {
        mode: {
            "wall_us_per_real_token": 1e6 * wall / real,
            "cpu_us_per_real_token": 1e6 * cpu / real,
            "real_tokens_per_step": real / args.interleaved,
        }
        for mode, (wall, cpu, real) in totals.items()
    }


def run_trainer(tokenizer, samples, folder: Path, args, tag: str = "", group_by_length: bool = False) -> dict:
    import datasets
    import torch
    from transformers import (
        AutoModelForSeq2SeqLM,
        DataCollatorForSeq2Seq,
        Seq2SeqTrainer,
        Seq2SeqTrainingArguments,
        TrainerCallback,
    )

    torch.set_num_threads(args.threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="sdpa", dtype=torch.float32)
    dataset = datasets.Dataset.from_dict(
        {
            "input_ids": [p for p, _ in samples],
            "attention_mask": [[1] * len(p) for p, _ in samples],
            "labels": [r for _, r in samples],
        }
    )
    collate = DataCollatorForSeq2Seq(tokenizer, model=model)
    counted: list[tuple[int, int]] = []  # (real, computed) tokens of each batch

    def counting(features):
        batch = collate(features)
        counted.append(
            (
                int(batch["attention_mask"].sum() + (batch["labels"] != -100).sum()),
                batch["input_ids"].numel() + batch["labels"].numel(),
            )
        )
        return batch

    marks: dict[int, float] = {}
    cpu: dict[int, float] = {}

    class Clock(TrainerCallback):
        def on_step_end(self, arguments, state, control, **kwargs):
            marks[state.global_step] = perf_counter()
            cpu[state.global_step] = process_time()

    trainer = Seq2SeqTrainer(
        model=model,
        train_dataset=dataset,
        data_collator=counting,
        processing_class=tokenizer,
        callbacks=[Clock()],
        args=Seq2SeqTrainingArguments(
            output_dir=str(folder.parent / f"trainer{tag}"),
            per_device_train_batch_size=args.batch_size,
            max_steps=args.warmup + args.steps,
            report_to=[],
            save_strategy="no",
            logging_steps=10**9,
            disable_tqdm=True,
            use_cpu=True,
            dataloader_num_workers=0,
            seed=0,
            bf16=peer_bf16(args),
            torch_compile=args.compile == "on",
            train_sampling_strategy="group_by_length" if group_by_length else "random",
        ),
    )
    output = trainer.train()
    last = args.warmup + args.steps
    seconds = marks[last] - marks[args.warmup]
    timed = counted[args.warmup : last]
    real, computed = sum(r for r, _ in timed), sum(c for _, c in timed)
    return {
        "real_tokens_per_s": real / seconds,
        "real_tokens_per_cpu_s": real / (cpu[last] - cpu[args.warmup]),
        "padding_efficiency": real / computed,
        "final_loss": output.training_loss,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--packed-rows",
        type=int,
        default=None,
        help="packed token budget per step, in rows of --max-length tokens (default: the mean real "
        "tokens of --batch-size samples, rounded up)",
    )
    parser.add_argument("--max-length", type=int, default=320)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds; each runs the three contenders, in an order rotated round by round",
    )
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument(
        "--interleaved",
        type=int,
        default=0,
        help="only compare fastlm packed and length_grouped, N steps each alternated in one process",
    )
    add_speed_flags(parser, "the Trainer's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        tokenizer, samples = load_samples(args.rows, args.max_length, workdir)
        save_model(tokenizer, workdir / "model")
        mean_tokens = sum(len(prompt) + len(response) + 1 for prompt, response in samples) / len(samples)
        if args.packed_rows is None:  # the packed token budget: the real tokens of --batch-size samples
            args.packed_rows = -(-round(args.batch_size * mean_tokens) // args.max_length)
        print(
            f"{len(samples)} samples, {mean_tokens:.1f} tokens each on average (prompt + decoder start + "
            f"response + EOS); packed budget {args.packed_rows} x {args.max_length} tokens per step",
            flush=True,
        )
        if args.interleaved:
            figures = interleaved(tokenizer, samples, workdir / "model", args)
            for mode, row in figures.items():
                print(f"{mode:15s} " + "   ".join(f"{key} {value:.1f}" for key, value in row.items()))
            ratio = (
                figures["length_grouped"]["wall_us_per_real_token"]
                / figures["packed"]["wall_us_per_real_token"]
            )
            print(f"packed / length_grouped real tokens per second (interleaved): {ratio:.2f}x")
            if args.json:
                args.json.write_text(json.dumps({"interleaved": figures, "ratio": ratio}, indent=2))
            return
        folder = workdir / "model"
        contenders = {
            "fastlm_packed": lambda tag: run_fastlm(tokenizer, samples, folder, args, "packed", tag),
            "fastlm": lambda tag: run_fastlm(tokenizer, samples, folder, args, "length_grouped", tag),
            "trainer": lambda tag: run_trainer(tokenizer, samples, folder, args, tag),
            "trainer_group_by_length": lambda tag: run_trainer(
                tokenizer, samples, folder, args, tag, group_by_length=True
            ),
        }
        names = [name for name in CONTENDERS if name in args.contenders]
        rounds: list[dict] = []
        for index in range(args.repeat):
            order = names[index % len(names) :] + names[: index % len(names)]
            rounds.append({name: contenders[name](f"-{index}") for name in order})
            print(
                f"round {index + 1} ({' -> '.join(order)}): "
                + "   ".join(f"{name} {rounds[-1][name]['real_tokens_per_s']:.0f}" for name in names)
                + " real tokens/s",
                flush=True,
            )
    results = {name: {key: median(r[name][key] for r in rounds) for key in rounds[0][name]} for name in names}
    ratios = {
        f"{name} / {peer}": {
            unit: median(r[name][unit] / r[peer][unit] for r in rounds)
            for unit in ("real_tokens_per_s", "real_tokens_per_cpu_s")
        }
        for name in names
        if name.startswith("fastlm")
        for peer in names
        if peer.startswith("trainer")
    }
    print(f"medians over {args.repeat} round(s):")
    for name, figures in results.items():
        print(
            f"{name:23s} real tokens/s {figures['real_tokens_per_s']:10.1f}   "
            + "   ".join(f"{key} {value:.4g}" for key, value in figures.items() if key != "real_tokens_per_s")
        )
    for pair, ratio in ratios.items():
        wall, cpu = ratio["real_tokens_per_s"], ratio["real_tokens_per_cpu_s"]
        target = (
            f" ({'PASS' if wall >= 2 else 'FAIL'} against the 2x target)"
            if pair.endswith("/ trainer")
            else ""
        )
        print(
            f"ratio {pair}: {wall:.2f}x wall{target}, {cpu:.2f}x per CPU second (median of the "
            "rounds' ratios)"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "medians": results,
                    "ratios": ratios,
                    "rounds": rounds,
                    "args": {k: str(v) for k, v in vars(args).items()},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
