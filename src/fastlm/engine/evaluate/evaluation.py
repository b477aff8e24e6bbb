"""THE evaluation of a causal LM (or an encoder-decoder model) on a tokenized split: training's validation,
the report's test metrics and error analysis, the benchmarks' checks all call :func:`evaluate`.

``evaluate`` batches the split exactly like training (``batching.make_batching``: packed by default, the
inputs of the model's attention path from ``attention.inputs.to_device``), in a fixed order (seed 0), under
``torch.no_grad()`` and the runtime's autocast. Everything is accumulated on the device and read back once at
the end:

* always: loss (mean over target tokens, the ``loss.causal_lm_loss_sum`` definition: position t predicts label
  t+1, -100 ignored), perplexity, target tokens, samples, wall seconds and real tokens / s; summed over the
  ranks of a data-parallel run; without the analysis, through training's fused LM head where it has one
  (``EvalOptions.fused_head``: no ``[tokens x vocab]`` logits in a validation either);
* with ``analysis=True``: next-token accuracy (argmax == target), top-k accuracy (target among the k largest
  logits), and
* the most frequent wrong predictions, as (target, predicted) token pairs: each wrong position adds one to
  the bin ``target * vocab + predicted`` of a dense count table (a sync-free ``index_add_`` bincount) while
  that table is small, else the pair ids are kept on the device and merged with ``torch.unique``;
* the samples of highest mean token loss: per-token losses are summed per sample with ``index_add_`` over
  segment ids (``sequence_ids`` of packed rows, where padding tails are segments without targets; the row
  of padded batches), the batch's ``worst`` are kept with ``torch.topk`` and merged into a running top list.

A causal LM's sample of a single token has no target, hence no mean loss: it never appears among the worst
samples; an encoder-decoder's always has one (its decoder row: the tokenizer's head and the response, at
least its EOS). The i-th segment having targets is the i-th sample of the batch that has one (collators keep
the sampler's order), so sample indices are resolved on the host at the end, with no per-sample loop.

Sample generations (the report's decoding settings) are ``generation.generate_samples``.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass
from time import perf_counter

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from fastlm.engine.batching import (
    NoneIfEmpty,
    Seq2SeqSides,
    backoff_pieces,
    loader_generator,
    make_batching,
    seq2seq_batching,
)
from fastlm.engine.config import TrainParams
from fastlm.engine.data.collators import pad_id_of
from fastlm.engine.data.schema import IGNORE_INDEX, shift_labels
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import Collectives, SingleProcess
from fastlm.engine.evaluate.line_ends import lf_line_ends
from fastlm.engine.model.accumulation import FusedHead
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.attention.windows import enable_packed_windows, packing_leak
from fastlm.engine.model.encoder_decoder import unwrapped
from fastlm.engine.model.liger import fused_linear_cross_entropy_sum
from fastlm.engine.model.linear_loss import head_operands, head_returns_hidden
from fastlm.engine.model.loss import causal_lm_loss_sum, forward_logits
from fastlm.engine.runtime.environment import Runtime
from fastlm.errors import OutOfMemory

log = logging.getLogger(__name__)

__all__ = ["DENSE_PAIR_TABLE_MAX", "EvalOptions", "EvaluationReport", "evaluate", "perplexity"]

# Largest vocab**2 counted in a dense table (int64: 256 MiB). The hard limit would be 2**31 (int32 bin ids),
# but a 32k vocabulary would then need an 8 GiB table; larger vocabularies use the torch.unique path.
DENSE_PAIR_TABLE_MAX = 2**25
_COMPACT_EVERY = 2**24  # pending pair ids (unique path) merged once they exceed this many elements
WRONG_PAIR_COLUMNS = [
    "target_id",
    "predicted_id",
    "target",
    "predicted",
    "target_text",
    "predicted_text",
    "count",
    "share_of_errors",
]
WORST_COLUMNS = ["sample", "loss", "length", "text", "anomaly_score"]
SCORED_COLUMNS = ["scored_tokens", "scored_text"]  # prompt/response data: what each sample's loss covers


@dataclass
class EvaluationReport:
    """``metrics``: loss, perplexity, target_tokens, samples, seconds, real_tokens_per_s (and accuracy,
    ``top<k>_accuracy`` with the analysis). With the analysis only (None otherwise): ``wrong_pairs``: the most
    frequent (target, predicted) mistakes (``target`` / ``predicted`` are the tokens, ``*_text`` their decoded
    text, ``*_id`` their ids). ``worst_samples``: the samples of highest mean token loss, worst first
    (``sample`` is the index in the split; ``anomaly_score`` the fraction of its target positions whose target
    is not among the model's top k: on log-key data, the share of next keys the model did not expect; on
    prompt/response data ``scored_tokens`` / ``scored_text`` say what its loss covers). Tokens
    and texts have LF line ends (``lf_line_ends``: a CR would split their rows in the CSVs)."""

    metrics: dict
    wrong_pairs: pd.DataFrame | None
    worst_samples: pd.DataFrame | None
    micro_batch_size: int | None = None  # what it finished with: smaller than params' after a back-off


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


@dataclass(frozen=True)
class EvalOptions:
    """How much of the split to evaluate, on which ranks, and what to compute beyond the loss: the settings
    that travel together from training's validation, the report and the benchmarks to :func:`evaluate`.

    ``max_batches``: the split's first batches, at most this many (split between ranks: the ones one process
    takes; None: all). ``comm`` / ``collective_forward``: a data-parallel run's view
    (``engine.distributed.parallel``); each rank evaluates every ``world_size``-th batch (the remainder of an
    uneven split too) and the sums are added once, at the end; ``collective_forward`` for FSDP, whose forward
    gathers the weights from every rank: a rank with one batch fewer runs one forward more, on a batch of its
    own, whose result is not counted. ``analysis``: the error
    analysis (one process, needs the tokenizer): accuracy, ``top_k`` accuracy, the ``pairs`` most frequent
    wrong predictions and the ``worst`` samples. ``micro_batch_size``: the micro-batch to evaluate in where
    an earlier evaluation backed off to a smaller one than ``params``' (its
    ``EvaluationReport.micro_batch_size``; None: ``params``').
    """

    analysis: bool = False
    max_batches: int | None = None
    comm: Collectives | None = None
    collective_forward: bool = False
    top_k: int = 5
    worst: int = 10
    pairs: int = 20
    micro_batch_size: int | None = None
    # training's fused LM head (``accumulation.FusedHead``): the loss without the error analysis runs through
    # it, as the steps' does: no [tokens x vocab] logits (None: the plain head's logits)
    fused_head: FusedHead | None = None


def perplexity(loss: float) -> float:
    """exp(loss), as the Trainer's examples and the report's summaries give it: inf where it is past the
    float range (a loss above ~709.78), NaN for a NaN loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def evaluate(
    model,
    dataset: TokenSequences,
    *,
    params: TrainParams,
    runtime: Runtime,
    max_length: int,
    attn: str,
    pad_id: int | None = None,
    tokenizer=None,
    options: EvalOptions | None = None,
) -> EvaluationReport:
    """Loss of ``model`` on ``dataset`` and, with ``options.analysis``, the error analysis (module docstring).

    ``metrics`` always hold loss, perplexity, target_tokens, samples, seconds and real_tokens_per_s; with the
    analysis (needs ``tokenizer``, one process) also accuracy and the top-k accuracy (``top<k>_accuracy``,
    :func:`top_k_metric`), and the report's
    ``wrong_pairs`` and ``worst_samples`` are filled (None otherwise). ``pad_id``: the tokenizer's by default.

    Out of memory (``torch.OutOfMemoryError``, the CUDA caching allocator's): with
    ``train.batching.oom_backoff`` the pass is run again with half the micro-batch (``_halved``, one
    warning; the configured batches cut in pieces, so the same samples and the same token-weighted loss), and
    the report says the size it finished with (``micro_batch_size``), which training's later validations
    start from; without it, one line (``errors.OutOfMemory``), as a training step's.
    """
    options = options or EvalOptions()
    analysis = options.analysis
    comm = options.comm or SingleProcess()
    if pad_id is None and tokenizer is None:
        raise ValueError("evaluate needs the pad id or the tokenizer")
    if analysis and (tokenizer is None or comm.world_size > 1):
        raise ValueError("the error analysis needs the tokenizer and runs in one process")
    device = runtime.device
    enable_packed_windows(unwrapped(model), max_length=max_length)  # a model not built here (the report's)
    if params.batching.mode == "packed" and packing_leak(unwrapped(model).config) is not None:
        # its samples on padded rows, one a row (training says why once)
        params = params.model_copy(
            update={"batching": params.batching.model_copy(update={"mode": "length_grouped"})}
        )
    setting = _Pass(
        runtime=runtime,
        max_length=max_length,
        attn=attn,
        pad_id=pad_id if pad_id is not None else pad_id_of(tokenizer),
        sides=seq2seq_batching(model, dataset),  # encoder-decoder: each side padded to its own maximum
        options=options,
        comm=comm,
    )
    configured = params.batching.micro_batch_size
    size = min(options.micro_batch_size or configured, configured)
    while True:
        try:
            sums = _one_pass(model, dataset, params, setting, size=size)
        except torch.OutOfMemoryError as error:  # nothing of the failed pass is kept: evaluate again smaller
            size = _halved(error, params, size, samples=len(dataset), world=comm.world_size, device=device)
        else:
            break
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the failed pass's blocks (freed with its error) back to the allocator
    total_loss, targets_count, real_tokens, samples, found, seconds = sums
    targets_count = int(targets_count)
    loss = total_loss / targets_count if targets_count else math.nan
    metrics = {
        "loss": loss,
        "perplexity": perplexity(loss),
        "target_tokens": targets_count,
        "samples": samples,
        "seconds": seconds,
        "real_tokens_per_s": real_tokens / seconds if seconds > 0 else math.nan,
    }
    if found is None:
        return EvaluationReport(metrics=metrics, wrong_pairs=None, worst_samples=None, micro_batch_size=size)
    correct, in_top = found["correct"], found["in_top"]
    metrics["accuracy"] = correct / targets_count if targets_count else math.nan
    metrics[top_k_metric(options.top_k)] = in_top / targets_count if targets_count else math.nan
    return EvaluationReport(
        metrics=metrics,
        wrong_pairs=_wrong_pairs_frame(tokenizer, found),
        worst_samples=_worst_frame(tokenizer, dataset, found, setting.sides),
        micro_batch_size=size,
    )


def top_k_metric(k: int) -> str:
    """The name of the top-``k`` accuracy among an evaluation's metrics: ``top5_accuracy`` for k 5 (a figure
    named by another k than its own would be compared with other runs' real ones)."""
    return f"top{k}_accuracy"


@dataclass(frozen=True)
class _Pass:
    """What one pass over the split runs with besides the model, the data and the batching."""

    runtime: Runtime
    max_length: int
    attn: str
    pad_id: int
    sides: Seq2SeqSides | None
    options: EvalOptions
    comm: Collectives


def _one_pass(model, dataset: TokenSequences, params: TrainParams, setting: _Pass, *, size: int) -> tuple:
    """One pass over ``dataset`` in micro-batches of ``size`` (smaller than ``params``' after an
    out-of-memory back-off: the configured batches cut in pieces, ``batching.backoff_pieces``, and
    ``max_batches`` counted in configured batches, so the same samples are evaluated): (loss sum, target
    tokens, real tokens, samples, the analysis' read-back or None, seconds)."""
    options, comm, device = setting.options, setting.comm, setting.runtime.device
    configured = params.batching.micro_batch_size
    cut = size < configured
    pieces = backoff_pieces(configured, size) if cut else 1
    if cut:
        params = params.model_copy(
            update={"batching": params.batching.model_copy(update={"micro_batch_size": size})}
        )
    sampler, collator = make_batching(
        params,
        dataset.lengths,
        max_length=setting.max_length,
        seed=0,
        sides=setting.sides,
        pad_id=setting.pad_id,
        configured=configured if cut else None,
    )
    sampler.shard(comm.rank, comm.world_size, even=False)
    # the split's first batches (max_batches, counted in configured batches), dealt out as the sampler deals
    # them: this rank's and the busiest rank's (rank 0's) counts
    limit = len(sampler.epoch_batches())
    if options.max_batches is not None:
        limit = min(limit, options.max_batches * pieces)
    own, rounds = len(range(comm.rank, limit, comm.world_size)), len(range(0, limit, comm.world_size))
    # its own generator: an evaluation draws nothing from the global one (a resumed run draws as the first)
    loader = DataLoader(
        dataset, batch_sampler=sampler, collate_fn=NoneIfEmpty(collator), generator=loader_generator(0, 0)
    )
    errors = (
        _ErrorAnalysis(
            dataset, device, top_k=options.top_k, worst=options.worst, seq2seq=setting.sides is not None
        )
        if options.analysis
        else None
    )
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    n_targets = torch.zeros((), dtype=torch.int64, device=device)
    real_tokens = samples = 0
    filler = None  # a batch of this rank's, for the forwards a collective forward needs of it beyond its own
    was_training = model.training
    model.eval()
    start = perf_counter()
    try:
        with torch.no_grad():
            # The sampler yields the same batches again (an epoch's order is cached): zip gives each batch's
            # indices.
            for index, (indices, host) in enumerate(zip(sampler, loader, strict=True)):
                if index >= own:
                    break
                if host is None:  # a back-off's empty piece of a short batch
                    continue
                batch = filler = to_device(host, device, setting.attn)
                if errors is None and options.fused_head is not None:
                    with setting.runtime.autocast_context():
                        batch_sum, batch_targets = _fused_loss_sum(model, batch, options.fused_head)
                    loss_sum += batch_sum
                    n_targets += batch_targets
                    real_tokens += int(host["num_real_tokens"])
                    samples += int(host["num_samples"])
                    continue
                with setting.runtime.autocast_context():
                    logits = forward_logits(model, batch)
                if errors is None:
                    batch_sum, batch_targets = causal_lm_loss_sum(logits, batch["labels"])
                else:
                    # the batch as the model saw it (a varlen path: one row of real tokens, its own segments)
                    batch_sum, batch_targets = errors.add(logits, batch["labels"], batch, indices)
                loss_sum += batch_sum
                n_targets += batch_targets
                real_tokens += int(host["num_real_tokens"])
                samples += int(host["num_samples"])
            if options.collective_forward:  # as many forwards as the busiest rank: their results not counted
                fused = options.fused_head if errors is None else None  # with it: no logits for them either
                for _ in range(rounds - own):
                    filler = (
                        filler if filler is not None else _first_batch(dataset, sampler, collator, setting)
                    )
                    hidden_only = head_returns_hidden(fused.head) if fused is not None else nullcontext()
                    with setting.runtime.autocast_context(), hidden_only:
                        forward_logits(model, filler)
        sums = torch.stack(
            [
                loss_sum,
                n_targets.double(),
                *torch.tensor([real_tokens, samples], dtype=torch.float64, device=device),
            ]
        )
        if comm.world_size > 1:  # every rank's sums: the targets, real tokens and samples of the whole split
            comm.sum_device_(sums)
        total_loss, targets_count, real_tokens, samples = sums.tolist()  # the one read-back
        targets_count, real_tokens, samples = (
            round(value) for value in (targets_count, real_tokens, samples)
        )
        found = errors.read_back(options.pairs) if errors is not None else None
    finally:
        model.train(was_training)
    return total_loss, targets_count, real_tokens, samples, found, perf_counter() - start


def _first_batch(dataset: TokenSequences, sampler, collator, setting: _Pass) -> dict:
    """The split's first batch on the device: the forward a rank with no batch of its own runs (a split of
    fewer batches than ranks) where the forward is collective."""
    indices = sampler.epoch_batches()[0]
    return to_device(
        collator([dataset[int(index)] for index in indices]), setting.runtime.device, setting.attn
    )


def _halved(error: BaseException, params: TrainParams, size: int, *, samples: int, world: int, device) -> int:
    """The micro-batch an evaluation that ran out of memory at ``size`` is run again with (``ceil(size /
    2)``, as training's back-off, said in one warning), or one line: without ``train.batching.oom_backoff``,
    in a multi-process run (every rank would have to agree) or at micro-batch 1."""
    batching = params.batching
    where = f"evaluating {samples} samples with micro_batch_size {size}"
    if not batching.oom_backoff or world > 1 or size == 1:
        raise OutOfMemory(
            f"the {device.type.upper()} device ran out of memory {where} (batching {batching.mode}).",
            fix="set a smaller train.batching.micro_batch_size (evaluation batches as training does)"
            + (
                ", or set train.batching.oom_backoff: true to halve it automatically"
                if world == 1 and size > 1
                else ""
            )
            + ", or a shorter train.batching.row_length.",
        ) from error
    smaller = -(-size // 2)
    configured = batching.micro_batch_size
    log.warning(
        "Out of memory %s: evaluating again with micro_batch_size %d (the configured micro-batches of %d cut "
        "in %d pieces: the same samples, the same loss); this run's later evaluations keep it.",
        where,
        smaller,
        configured,
        backoff_pieces(configured, smaller),
    )
    return smaller


class _ErrorAnalysis:
    """Accuracy, top-k accuracy, wrong pairs and worst samples, accumulated on the device batch by batch."""

    def __init__(
        self, dataset: TokenSequences, device: torch.device, *, top_k: int, worst: int, seq2seq: bool = False
    ):
        self.dataset, self.device, self.top_k, self.worst = dataset, device, top_k, worst
        # an encoder-decoder's decoder row always has a target; a causal LM's sample from its second token
        self.min_length = 1 if seq2seq else 2
        zero = torch.zeros((), dtype=torch.int64, device=device)
        self.n_correct, self.n_topk = zero.clone(), zero.clone()
        self.worst_loss = torch.empty(0, dtype=torch.float32, device=device)
        self.worst_key = torch.empty(0, dtype=torch.int64, device=device)
        self.worst_score = torch.empty(0, dtype=torch.float32, device=device)
        self.counter: _PairCounter | None = None
        # per batch, in order: indices of its samples with a target (``min_length`` tokens or more)
        self.scored: list[np.ndarray] = []
        self.n_scored = 0

    def add(
        self, logits: torch.Tensor, labels: torch.Tensor, batch: dict, indices
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch; returns its loss sum and target count (per-token losses: the same definition)."""
        device, worst = self.device, self.worst
        targets = shift_labels(labels)
        valid = targets != IGNORE_INDEX
        vocab = logits.size(-1)
        token_loss = F.cross_entropy(
            logits.float().reshape(-1, vocab),
            targets.reshape(-1),
            ignore_index=IGNORE_INDEX,
            reduction="none",
        ).view_as(targets)
        predicted = logits.argmax(dim=-1)
        self.n_correct += ((predicted == targets) & valid).sum()
        top = logits.topk(min(self.top_k, vocab), dim=-1).indices
        in_top = (top == targets.unsqueeze(-1)).any(dim=-1) & valid
        self.n_topk += in_top.sum()
        if self.counter is None:
            self.counter = _PairCounter(vocab, device)
        self.counter.add(targets, predicted, valid & (predicted != targets))

        # Per-sample losses: segment ids are host tensors (no sync to size them).
        if (
            "sequence_ids" in batch
        ):  # packed rows, or a varlen path's one row (attention.inputs.without_padding)
            segment_ids = batch["sequence_ids"].to(device=device, dtype=torch.int64, non_blocking=True)
            n_segments = int(batch["sequence_ids"][-1, -1]) + 1  # row-major increasing ids
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
        rank = torch.cumsum(has_target, 0) - 1 + self.n_scored  # global rank among scored samples
        best = torch.topk(mean, min(worst, n_segments))
        self.worst_loss = torch.cat([self.worst_loss, best.values])
        self.worst_key = torch.cat([self.worst_key, rank[best.indices]])
        self.worst_score = torch.cat(
            [self.worst_score, seg_miss[best.indices] / seg_count[best.indices].clamp(min=1)]
        )
        if self.worst_loss.numel() > worst:
            keep = torch.topk(self.worst_loss, worst).indices
            self.worst_loss, self.worst_key, self.worst_score = (
                self.worst_loss[keep],
                self.worst_key[keep],
                self.worst_score[keep],
            )

        indices = np.asarray(indices, dtype=np.int64)
        indices = indices[self.dataset.lengths[indices] >= self.min_length]
        self.scored.append(indices)
        self.n_scored += indices.size
        return token_loss.sum(dtype=torch.float64), valid.sum()

    def read_back(self, pairs: int) -> dict:
        """Everything on the host (after the evaluation's loop)."""
        correct, in_top = torch.stack([self.n_correct, self.n_topk]).tolist()
        if self.counter is not None:
            pair_ids, pair_counts, errors = (t.tolist() for t in self.counter.top(pairs))
        else:
            pair_ids, pair_counts, errors = [], [], 0
        order = torch.argsort(self.worst_loss, descending=True, stable=True)
        return {
            "correct": correct,
            "in_top": in_top,
            "pair_ids": pair_ids,
            "pair_counts": pair_counts,
            "errors": errors,
            "vocab": self.counter.vocab if self.counter is not None else 1,
            "worst_values": self.worst_loss[order].tolist(),
            "worst_keys": self.worst_key[order].tolist(),
            "worst_scores": self.worst_score[order].tolist(),
            "scored": np.concatenate(self.scored) if self.scored else np.empty(0, dtype=np.int64),
        }


def _wrong_pairs_frame(tokenizer, found: dict) -> pd.DataFrame:
    vocab, errors = found["vocab"], found["errors"]
    wrong = [
        (pair // vocab, pair % vocab, count)
        for pair, count in zip(found["pair_ids"], found["pair_counts"], strict=True)
        if count > 0
    ]
    return pd.DataFrame(
        [
            {
                "target_id": t,
                "predicted_id": p,
                "target": _token(tokenizer, t),
                "predicted": _token(tokenizer, p),
                "target_text": lf_line_ends(tokenizer.decode([t])),
                "predicted_text": lf_line_ends(tokenizer.decode([p])),
                "count": count,
                "share_of_errors": count / errors,
            }
            for t, p, count in wrong
        ],
        columns=WRONG_PAIR_COLUMNS,
    )


def _worst_frame(tokenizer, dataset: TokenSequences, found: dict, sides: Seq2SeqSides | None) -> pd.DataFrame:
    rows = []
    for value, key, score in zip(
        found["worst_values"], found["worst_keys"], found["worst_scores"], strict=True
    ):
        if not math.isfinite(value):
            continue  # fewer scored samples than ``worst``
        sample = int(found["scored"][key])
        ids = dataset[sample]
        row = {
            "sample": sample,
            "loss": value,
            "length": int(ids.size),
            "text": lf_line_ends(tokenizer.decode(ids.tolist())),
            "anomaly_score": score,
        }
        if dataset.prompt_lengths is not None:
            row.update(_scored(tokenizer, dataset, sample, sides))
        rows.append(row)
    columns = WORST_COLUMNS + (SCORED_COLUMNS if dataset.prompt_lengths is not None else [])
    return pd.DataFrame(rows, columns=columns)


def _scored(tokenizer, dataset: TokenSequences, sample: int, sides: Seq2SeqSides | None) -> dict:
    """What a prompt/response sample's loss covers: its earlier answers, then its response (decoded apart,
    joined by `` ⋯ ``; the prompt's other tokens are inputs only). An encoder-decoder model's (``sides``):
    its decoder row's targets, the tokenizer's head (BART's ``<s>``, ``collators.seq2seq_sides``) and the
    response; the whole prompt, earlier answers included, is encoder input."""
    ids = dataset[sample]
    prompt = int(dataset.prompt_lengths[sample])
    if sides is not None:
        pieces = [np.concatenate([np.asarray(sides.ends.head, dtype=ids.dtype), ids[prompt:]])]
    else:
        pieces = [
            *(ids[start:end] for start, end in dataset.answer_spans_of(sample)),
            ids[max(prompt, 1) :],
        ]
    return {
        "scored_tokens": sum(len(piece) for piece in pieces),
        "scored_text": lf_line_ends(" ⋯ ".join(tokenizer.decode(piece.tolist()) for piece in pieces)),
    }


def _token(tokenizer, token_id: int) -> str:
    token = tokenizer.convert_ids_to_tokens(int(token_id))
    return lf_line_ends(token) if token is not None else f"<{token_id}>"


def _fused_loss_sum(model, batch: dict, fused: FusedHead) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's summed loss (fp32, no label smoothing) and target count through training's fused head
    (``EvalOptions.fused_head``): the model's hidden states before the head, then its matmul and the loss
    chunk by chunk (``liger.fused_linear_cross_entropy_sum``, the run's kernel). The weight is detached: under
    ``no_grad`` an autograd function still sees its inputs' ``requires_grad`` and would compute gradients."""
    head = fused.head
    with head_returns_hidden(head):
        hidden = forward_logits(model, batch)
    targets = shift_labels(batch["labels"], IGNORE_INDEX).reshape(-1)
    weight, bias, up = (x.detach() if x is not None else None for x in head_operands(head))
    loss_sum = fused_linear_cross_entropy_sum(
        fused.kernel, hidden.reshape(-1, hidden.size(-1)).detach(), weight, targets, bias, up=up
    )
    return loss_sum, (targets != IGNORE_INDEX).sum()
