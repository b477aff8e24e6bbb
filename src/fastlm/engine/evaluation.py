"""Evaluation of a trained causal LM on a tokenized split, with error analysis, and sample generations.

``evaluate_split`` batches the split exactly like training (``loop.make_batching``: packed by default, the
inputs of the model's attention path from ``attention.to_device``), in a fixed order (seed 0), under
``torch.no_grad()`` and the runtime's autocast. Everything is accumulated on the device and read back once at the end:

* loss (mean over target tokens, the ``loss.causal_lm_loss_sum`` definition: position t predicts label t+1,
  -100 ignored), perplexity, next-token accuracy (argmax == target), top-k accuracy (target among the k
  largest logits), target tokens, samples, wall seconds and real tokens / s;
* the most frequent wrong predictions, as (target, predicted) token pairs: each wrong position adds one to
  the bin ``target * vocab + predicted`` of a dense count table (a sync-free ``index_add_`` bincount) while
  that table is small, else the pair ids are kept on the device and merged with ``torch.unique``;
* the samples of highest mean token loss: per-token losses are summed per sample with ``index_add_`` over
  segment ids (``sequence_ids`` of packed rows, where padding tails are segments without targets; the row
  of padded batches), the batch's ``worst`` are kept with ``torch.topk`` and merged into a running top list.

A sample of a single token has no target, hence no mean loss: it never appears among the worst samples.
The i-th segment having targets is the i-th sample of the batch with at least 2 tokens (collators keep the
sampler's order), so sample indices are resolved on the host at the end, with no per-sample loop.

``generate_samples`` decodes a few prompts under several decoding settings (greedy, seeded sampling), in
batches with left padding, and returns the continuations as a DataFrame.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from fastlm.engine.attention import generation_attention, to_device
from fastlm.engine.config import TrainParams
from fastlm.engine.data.collators import pad_id_of
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.generation import continuation_start, is_encoder_decoder
from fastlm.engine.loop import make_batching, seq2seq_batching
from fastlm.engine.loss import IGNORE_INDEX, forward_logits, shift_labels
from fastlm.engine.runtime import Runtime

__all__ = ["DENSE_PAIR_TABLE_MAX", "EvaluationReport", "evaluate_split", "generate_samples"]

# Largest vocab**2 counted in a dense table (int64: 256 MiB). The hard limit would be 2**31 (int32 bin ids),
# but a 32k vocabulary would then need an 8 GiB table; larger vocabularies use the torch.unique path.
DENSE_PAIR_TABLE_MAX = 2**25
_COMPACT_EVERY = 2**24  # pending pair ids (unique path) merged once they exceed this many elements
WRONG_PAIR_COLUMNS = ["target_id", "predicted_id", "target", "predicted", "target_text", "predicted_text",
                      "count", "share_of_errors"]
WORST_COLUMNS = ["sample", "loss", "length", "text", "anomaly_score"]


@dataclass
class EvaluationReport:
    """``metrics``: loss, perplexity, accuracy, top5_accuracy, target_tokens, samples, seconds,
    real_tokens_per_s. ``wrong_pairs``: the most frequent (target, predicted) mistakes (``target`` /
    ``predicted`` are the tokens, ``*_text`` their decoded text, ``*_id`` their ids). ``worst_samples``: the
    samples of highest mean token loss, worst first (``sample`` is the index in the split; ``anomaly_score`` the
    fraction of its target positions whose target is not among the model's top k: on log-key data, the share
    of next keys the model did not expect)."""

    metrics: dict
    wrong_pairs: pd.DataFrame
    worst_samples: pd.DataFrame


class _PairCounter:
    """Counts (target, predicted) pairs on the device; a dense table for small vocabularies."""

    def __init__(self, vocab: int, device: torch.device):
        self.vocab, self.device = vocab, device
        self.dense = vocab * vocab <= min(DENSE_PAIR_TABLE_MAX, 2**31)
        self.table = torch.zeros(vocab * vocab + 1, dtype=torch.int64, device=device) if self.dense else None
        self.ids = torch.empty(0, dtype=torch.int64, device=device)  # unique path: merged ids and counts
        self.counts = torch.empty(0, dtype=torch.int64, device=device)
        self.pending: list[torch.Tensor] = []
        self.pending_size = 0

    def add(self, targets: torch.Tensor, predicted: torch.Tensor, wrong: torch.Tensor) -> None:
        pair = targets.clamp(min=0) * self.vocab + predicted
        if self.dense:  # the last bin collects the positions that are not mistakes
            pair = torch.where(wrong, pair, self.vocab * self.vocab).reshape(-1)
            self.table.index_add_(0, pair, torch.ones_like(pair))
            return
        self.pending.append(torch.where(wrong, pair, -1).reshape(-1))
        self.pending_size += self.pending[-1].numel()
        if self.pending_size > _COMPACT_EVERY:
            self._compact()

    def _compact(self) -> None:
        if not self.pending:
            return
        ids = torch.cat([self.ids, *self.pending])
        weights = torch.cat([self.counts, *(torch.ones_like(p) for p in self.pending)])
        self.ids, inverse = torch.unique(ids, return_inverse=True)
        self.counts = torch.zeros_like(self.ids).index_add_(0, inverse, weights)
        self.pending, self.pending_size = [], 0

    def top(self, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The k most frequent pair ids, their counts (zeros possible: drop them) and the total mistakes."""
        if self.dense:
            counts = self.table[:-1]
            top = torch.topk(counts, min(k, counts.numel()))
            return top.indices, top.values, counts.sum()
        self._compact()
        counts = torch.where(self.ids >= 0, self.counts, 0)
        top = torch.topk(counts, min(k, counts.numel()))
        return self.ids[top.indices], top.values, counts.sum()


def evaluate_split(model, tokenizer, dataset: TokenSequences, *, params: TrainParams, runtime: Runtime,
                   max_length: int, attn: str, max_batches: int | None = None, top_k: int = 5, worst: int = 10,
                   pairs: int = 20) -> EvaluationReport:
    """Metrics and error analysis of ``model`` on ``dataset`` (see the module docstring)."""
    device = runtime.device
    sides = seq2seq_batching(model, dataset)  # encoder-decoder: each side padded to its own maximum, unpacked
    sampler, collator = make_batching(params, dataset.lengths, pad_id=pad_id_of(tokenizer),
                                      max_length=max_length, attn=attn, seed=0, **sides)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collator)
    packed = params.batching.mode == "packed" and not sides
    zero = torch.zeros((), dtype=torch.int64, device=device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    n_targets, n_correct, n_topk = zero.clone(), zero.clone(), zero.clone()
    worst_loss = torch.empty(0, dtype=torch.float32, device=device)
    worst_key = torch.empty(0, dtype=torch.int64, device=device)
    worst_score = torch.empty(0, dtype=torch.float32, device=device)
    counter: _PairCounter | None = None
    scored: list[np.ndarray] = []  # per batch, in order: indices of its samples with a target (>= 2 tokens)
    n_scored = real_tokens = samples = 0
    was_training = model.training
    model.eval()
    start = perf_counter()
    try:
        with torch.no_grad():
            # The sampler yields the same batches again (an epoch's order is cached): zip gives each batch's indices.
            for index, (indices, batch) in enumerate(zip(sampler, loader, strict=True)):
                if max_batches is not None and index >= max_batches:
                    break
                host = batch
                batch = to_device(batch, device, attn)
                with runtime.autocast_context():
                    logits = forward_logits(model, batch)
                targets = shift_labels(batch["labels"])
                valid = targets != IGNORE_INDEX
                vocab = logits.size(-1)
                token_loss = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1),
                                             ignore_index=IGNORE_INDEX, reduction="none").view_as(targets)
                loss_sum += token_loss.sum(dtype=torch.float64)
                n_targets += valid.sum()
                predicted = logits.argmax(dim=-1)
                n_correct += ((predicted == targets) & valid).sum()
                top = logits.topk(min(top_k, vocab), dim=-1).indices
                in_top = (top == targets.unsqueeze(-1)).any(dim=-1) & valid
                n_topk += in_top.sum()
                if counter is None:
                    counter = _PairCounter(vocab, device)
                counter.add(targets, predicted, valid & (predicted != targets))

                # Per-sample losses: segment ids are host tensors (no sync to size them).
                if packed:
                    segment_ids = host["sequence_ids"].to(device=device, dtype=torch.int64, non_blocking=True)
                    n_segments = int(host["sequence_ids"][-1, -1]) + 1  # row-major increasing ids
                else:
                    rows, length = targets.shape
                    segment_ids = torch.arange(rows, device=device).unsqueeze(1).expand(rows, length)
                    n_segments = rows
                segment_ids = segment_ids.reshape(-1)
                seg_loss = torch.zeros(n_segments, dtype=torch.float32, device=device)
                seg_loss.index_add_(0, segment_ids, token_loss.reshape(-1))
                seg_count = torch.zeros(n_segments, dtype=torch.int64, device=device)
                seg_count.index_add_(0, segment_ids, valid.reshape(-1).to(torch.int64))
                seg_miss = torch.zeros(n_segments, dtype=torch.float32, device=device)
                seg_miss.index_add_(0, segment_ids, (valid & ~in_top).reshape(-1).to(torch.float32))
                has_target = seg_count > 0
                mean = torch.where(has_target, seg_loss / seg_count.clamp(min=1), -math.inf)
                rank = torch.cumsum(has_target, 0) - 1 + n_scored  # global rank among scored samples
                best = torch.topk(mean, min(worst, n_segments))
                worst_loss = torch.cat([worst_loss, best.values])
                worst_key = torch.cat([worst_key, rank[best.indices]])
                worst_score = torch.cat([worst_score, seg_miss[best.indices] / seg_count[best.indices].clamp(min=1)])
                if worst_loss.numel() > worst:
                    keep = torch.topk(worst_loss, worst).indices
                    worst_loss, worst_key, worst_score = worst_loss[keep], worst_key[keep], worst_score[keep]

                indices = np.asarray(indices, dtype=np.int64)
                indices = indices[dataset.lengths[indices] >= 2]
                scored.append(indices)
                n_scored += indices.size
                real_tokens += int(host["num_real_tokens"])
                samples += int(host["num_samples"])
        # The one read-back of the evaluation.
        summary = torch.stack([loss_sum, n_targets.double(), n_correct.double(), n_topk.double()]).tolist()
        if counter is not None:
            pair_ids, pair_counts, errors = (t.tolist() for t in counter.top(pairs))
        else:
            pair_ids, pair_counts, errors = [], [], 0
        order = torch.argsort(worst_loss, descending=True, stable=True)
        worst_values, worst_keys = worst_loss[order].tolist(), worst_key[order].tolist()
        worst_scores = worst_score[order].tolist()
    finally:
        model.train(was_training)
    seconds = perf_counter() - start

    total_loss, targets_count, correct, in_top = summary
    targets_count = int(targets_count)
    loss = total_loss / targets_count if targets_count else math.nan
    metrics = {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)) if targets_count else math.nan,
        "accuracy": correct / targets_count if targets_count else math.nan,
        "top5_accuracy": in_top / targets_count if targets_count else math.nan,
        "target_tokens": targets_count,
        "samples": samples,
        "seconds": seconds,
        "real_tokens_per_s": real_tokens / seconds if seconds > 0 else math.nan,
    }
    vocab = counter.vocab if counter is not None else 1
    wrong = [(pair // vocab, pair % vocab, count) for pair, count in zip(pair_ids, pair_counts, strict=True)
             if count > 0]
    wrong_pairs = pd.DataFrame(
        [{"target_id": t, "predicted_id": p, "target": _token(tokenizer, t), "predicted": _token(tokenizer, p),
          "target_text": tokenizer.decode([t]), "predicted_text": tokenizer.decode([p]), "count": count,
          "share_of_errors": count / errors} for t, p, count in wrong],
        columns=WRONG_PAIR_COLUMNS,
    )
    all_scored = np.concatenate(scored) if scored else np.empty(0, dtype=np.int64)
    worst_rows = []
    for value, key, score in zip(worst_values, worst_keys, worst_scores, strict=True):
        if not math.isfinite(value):
            continue  # fewer scored samples than ``worst``
        sample = int(all_scored[key])
        ids = dataset[sample]
        worst_rows.append({"sample": sample, "loss": value, "length": int(ids.size),
                           "text": tokenizer.decode(ids.tolist()), "anomaly_score": score})
    return EvaluationReport(metrics=metrics, wrong_pairs=wrong_pairs,
                            worst_samples=pd.DataFrame(worst_rows, columns=WORST_COLUMNS))


def _token(tokenizer, token_id: int) -> str:
    token = tokenizer.convert_ids_to_tokens(int(token_id))
    return token if token is not None else f"<{token_id}>"


def _describe(setting: dict) -> str:
    """``{"name": "sampled", "do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": 0}`` ->
    ``"temperature=0.8, top_p=0.95"``."""
    return ", ".join(f"{key}={value}" for key, value in setting.items() if key not in ("name", "do_sample", "seed"))


def generate_samples(model, tokenizer, prompts: Sequence[str], *, settings: Sequence[dict],
                     max_new_tokens: int = 40, runtime: Runtime, batch_size: int = 32) -> pd.DataFrame:
    """Continuations of ``prompts`` under each decoding setting: rows prompt, setting, settings, output.

    A setting is ``model.generate`` keyword arguments plus ``name`` and an optional ``seed`` (default 0, set
    with ``torch.manual_seed`` before each setting's generations, in a forked RNG state). Prompts are
    batched with LEFT padding (the tokenizer's padding side is restored afterwards); an empty prompt starts
    from BOS, or EOS when the tokenizer has no BOS. ``output`` is the continuation only, special tokens
    skipped. The model runs in eval mode with the KV cache on, and gets its training mode back.
    """
    device = runtime.device
    pad_id = pad_id_of(tokenizer)
    start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    encoded = []
    for prompt in prompts:
        ids = tokenizer(prompt)["input_ids"] if prompt else []
        encoded.append({"input_ids": list(ids) or [start_id]})
    rows = []
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "right" if is_encoder_decoder(model) else "left"  # see engine.generation
    try:
        for setting in settings:
            name = setting.get("name", _describe(setting) or "default")
            kwargs = {key: value for key, value in setting.items() if key not in ("name", "seed")}
            devices = [device.index if device.index is not None else torch.cuda.current_device()] \
                if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), torch.no_grad(), generation_attention(model):
                torch.manual_seed(int(setting.get("seed", 0)))
                for begin in range(0, len(encoded), batch_size):
                    chunk = encoded[begin : begin + batch_size]
                    inputs = tokenizer.pad(chunk, padding=True, return_tensors="pt").to(device)
                    with runtime.autocast_context():
                        output = model.generate(
                            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                            max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                            eos_token_id=tokenizer.eos_token_id, use_cache=True, **kwargs,
                        )
                    continuations = output[:, continuation_start(model, inputs["input_ids"]) :].tolist()
                    for offset, ids in enumerate(continuations):
                        rows.append({"prompt": prompts[begin + offset], "setting": name,
                                     "settings": _describe(setting),
                                     "output": tokenizer.decode(ids, skip_special_tokens=True)})
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return pd.DataFrame(rows, columns=["prompt", "setting", "settings", "output"])
