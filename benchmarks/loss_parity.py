"""Loss per target token: fastlm's packed training step against the Hugging Face Trainer, same batches (issue
16).

Speed may not be bought with another objective. This trains the issue's 5.2 M shape (``issue16_ab.SHAPE``)
from one set of initial weights (``torch.manual_seed(0)``) on the realistic short-review profile
(``train_speed.prepare``) in two ways, step for step on the SAME samples:

* ``trainer``: ``transformers.Trainer`` with ``train_sampling_strategy="group_by_length"`` (its best simple
  set-up), batches of ``--batch-size`` samples, ``DataCollatorForLanguageModeling(mlm=False)`` with the EOS
  labels put back (this tokenizer's pad is its EOS, and the stock collator drops every EOS label,
  transformers#23530, so the stock Trainer never learns to end a text; fastlm scores EOS). Its loss per step
  is recorded from ``compute_loss`` (the loss it backpropagates: summed over the batch's target tokens / their
  number).
* ``fastlm``: the engine's own path for each of those batches: ``PackedCollator`` packs the same samples into
  rows (block-diagonal attention, positions restarting per sample, labels cut at sample boundaries:
  ``inputs.to_device``), then ``step.train_step`` (token-normalised loss, clipping, AdamW). Once in fp32 and
  once in bf16 autocast (what ``runtime.precision: auto`` picks on this CPU for the default 10,240-token
  micro-batch; ``train_speed.py`` prints the choice).
* ``trainer seed 1``: the Trainer again, same batches, from other initial weights (``torch.manual_seed(1)``):
  the gap between two honest runs, i.e. the noise the differences above are read against.
* ``trainer stock collator`` (``--stock``): the Trainer with the unmodified collator, for what the usual
  set-up actually optimises (no EOS targets: a different, smaller set of tokens per step).

Both sides: AdamW (betas 0.9 / 0.999, eps 1e-8, no weight decay), constant learning rate ``--lr``, gradients
clipped at 1.0, fp32 master weights, ``--threads`` torch threads. Printed: the loss per target token every
``--every`` steps, the mean and largest absolute gap of each curve from the Trainer's, and PASS/FAIL lines
(fastlm's mean gap below the seed-to-seed gap; in fp32 also below 1e-3: the same objective up to the order of
float sums). Nothing is asserted.

    python benchmarks/loss_parity.py --workdir /tmp/ab16 --steps 60
    python benchmarks/loss_parity.py --workdir /tmp/ab16 --steps 60 --stock
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from contender_process import OFFLINE_ENV  # noqa: E402

os.environ.update(
    {**OFFLINE_ENV, "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false"}
)

import torch  # noqa: E402
from issue16_ab import SHAPE, add_curve_arguments, initial_model, load_prepared  # noqa: E402

from fastlm.engine.config import parse_train_params  # noqa: E402
from fastlm.engine.data import PackedCollator  # noqa: E402
from fastlm.engine.data.packing import TokenBudget, choose_row_length  # noqa: E402
from fastlm.engine.model.attention.inputs import to_device  # noqa: E402
from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime  # noqa: E402
from fastlm.engine.train.step import make_optimization, train_step  # noqa: E402

FP32_EXACT = 1e-3  # fp32 on the same batches: the same objective differs only by the order of float sums
BETAS, EPS, CLIP = (0.9, 0.999), 1e-8, 1.0


class RecordingCollator:
    """The Trainer's collator, recording each batch's samples (their real tokens) in the order it trains them.

    ``keep_eos``: labels = input_ids on every real token (the collator's pad == EOS masking undone)."""

    def __init__(self, inner, keep_eos: bool) -> None:
        self.inner, self.keep_eos, self.batches = inner, keep_eos, []

    def __call__(self, features):
        batch = self.inner(features)
        if self.keep_eos:
            batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        self.batches.append([list(feature["input_ids"]) for feature in features])
        return batch


def trainer_curve(model, dataset, tokenizer, args, keep_eos: bool = True) -> tuple[list[float], list[list]]:
    """The Trainer's loss per step (what it backpropagates) and the samples of each step."""
    import datasets
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    datasets.disable_progress_bars()
    losses: list[float] = []

    class LossRecordingTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            losses.append(float((loss[0] if return_outputs else loss).detach()))
            return loss

    collator = RecordingCollator(DataCollatorForLanguageModeling(tokenizer, mlm=False), keep_eos)
    training_args = TrainingArguments(
        output_dir=str(Path(args.workdir) / "loss_parity_trainer"),
        per_device_train_batch_size=args.batch_size,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        adam_epsilon=EPS,
        max_grad_norm=CLIP,
        train_sampling_strategy="group_by_length",
        report_to=[],
        save_strategy="no",
        logging_steps=10**9,
        disable_tqdm=True,
        use_cpu=True,
        dataloader_num_workers=0,
        seed=0,
    )
    trainer = LossRecordingTrainer(
        model=model,
        args=training_args,
        train_dataset=dataset,
        data_collator=collator,
        processing_class=tokenizer,
    )
    trainer.train()
    # its loader collates ahead: only the batches it trained on
    return losses, collator.batches[: len(losses)]


def fastlm_curve(
    model, batches: list[list], pad_id: int, row_length: int, args, precision: str
) -> list[float]:
    """fastlm's packed step on each recorded batch (its samples packed into rows of ``row_length``)."""
    runtime = setup_runtime(
        RuntimeConfig(device="cpu", precision=precision, num_threads=args.threads, seed=0)
    )
    params = parse_train_params(
        {
            "model": {"attn_implementation": "sdpa", **SHAPE},
            "optimizer": {
                "lr": args.lr,
                "weight_decay": 0.0,
                "beta1": BETAS[0],
                "beta2": BETAS[1],
                "eps": EPS,
                "grad_clip": CLIP,
                "warmup_steps": 0,
                "decay": "constant",
            },
            "runtime": {"device": "cpu", "precision": precision, "num_threads": args.threads},
        }
    )
    optimization = make_optimization(model, params, runtime, total_steps=len(batches))
    collator = PackedCollator(
        pad_id=pad_id,
        budget=TokenBudget(row_length, rows_per_batch=args.batch_size),
        pad_to_multiple_of=1,
        attention_mask_format="none",
    )
    losses = []
    for samples in batches:
        batch = to_device(collator([{"input_ids": ids} for ids in samples]), runtime.device, "sdpa")
        result = train_step(model, [batch], optimization, runtime=runtime)
        losses.append(float(result.loss_sum) / result.target_tokens)
    return losses


def gaps(curve: list[float], reference: list[float]) -> list[float]:
    return [abs(a - b) for a, b in zip(curve, reference, strict=True)]


def main(argv=None) -> None:
    import datasets
    import pyarrow as pa
    from datasets.table import InMemoryTable

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_curve_arguments(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per step (both sides)")
    parser.add_argument(
        "--stock", action="store_true", help="also the Trainer with its stock collator (no EOS)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, sequences = load_prepared(Path(args.workdir), args.max_length)
    pad_id = int(tokenizer.pad_token_id)
    table = pa.table(
        {
            "input_ids": pa.ListArray.from_arrays(
                pa.array(sequences.offsets.astype("int32")), pa.array(sequences.values, type=pa.int32())
            )
        }
    )
    dataset = datasets.Dataset(InMemoryTable(table))
    row_length = choose_row_length(sequences.lengths, args.max_length)

    curves: dict[str, list[float]] = {}
    curves["trainer"], batches = trainer_curve(
        initial_model(tokenizer, 0, args.max_length), dataset, tokenizer, args
    )
    curves["fastlm fp32"] = fastlm_curve(
        initial_model(tokenizer, 0, args.max_length), batches, pad_id, row_length, args, "fp32"
    )
    curves["fastlm bf16"] = fastlm_curve(
        initial_model(tokenizer, 0, args.max_length), batches, pad_id, row_length, args, "bf16"
    )
    control, control_batches = trainer_curve(
        initial_model(tokenizer, 1, args.max_length), dataset, tokenizer, args
    )
    if control_batches != batches:
        raise RuntimeError(
            "the seed-control Trainer run saw other batches: its gap would not be seed noise alone"
        )
    curves["trainer seed 1"] = control
    if args.stock:
        curves["trainer stock collator"], _ = trainer_curve(
            initial_model(tokenizer, 0, args.max_length), dataset, tokenizer, args, keep_eos=False
        )

    samples = sum(len(batch) for batch in batches)
    print(
        f"{args.steps} steps of {args.batch_size} samples (the Trainer's group_by_length batches, {samples} "
        f"samples), fastlm rows of {row_length} tokens; AdamW lr {args.lr} constant, clip {CLIP}, "
        f"{torch.get_num_threads()} threads, torch {torch.__version__}"
    )
    names = list(curves)
    print("step  " + "  ".join(f"{name:>22}" for name in names))
    for step in range(args.every - 1, args.steps, args.every):
        print(f"{step + 1:4d}  " + "  ".join(f"{curves[name][step]:22.5f}" for name in names))
    reference = curves["trainer"]
    summary = {name: gaps(curves[name], reference) for name in names if name != "trainer"}
    half = args.steps // 2
    print("gap from the Trainer's curve (loss per target token):")
    for name, values in summary.items():
        print(
            f"  {name:<24} mean {statistics.fmean(values):.5f}  largest {max(values):.5f}  "
            f"second half mean {statistics.fmean(values[half:]):.5f}"
        )
    noise = statistics.fmean(summary["trainer seed 1"])
    for name in ("fastlm fp32", "fastlm bf16"):
        gap = statistics.fmean(summary[name])
        print(
            f"{'PASS' if gap < noise else 'FAIL'}  {name}: mean gap {gap:.5f} < seed-to-seed gap {noise:.5f}"
        )
    exact = statistics.fmean(summary["fastlm fp32"])
    print(
        f"{'PASS' if exact < FP32_EXACT else 'FAIL'}  fastlm fp32: mean gap {exact:.2e} < {FP32_EXACT:g} "
        "(the same objective)"
    )


if __name__ == "__main__":
    main()
