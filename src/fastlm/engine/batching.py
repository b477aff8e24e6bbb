"""Batching for training, evaluation and tuning: the sampler and collator of the configured mode, the
DataLoader settings, the endless micro-batch stream of a run, and one optimizer step's batches on the device.

``make_batching`` is the one place a batching mode (``packed``, ``length_grouped``, ``dynamic``) becomes a
batch sampler and a collator; ``seq2seq_batching`` gives its extra arguments for an encoder-decoder model.
``MicroBatches`` yields micro-batches across epochs and knows its position (for exact resume);
``MicroBatches.next_step`` fetches one optimizer step's micro-batches and moves them to the device with the
inputs of the model's attention path (``attention.inputs.to_device``). ``StepPlan`` (``step_plan``) is the
run's optimizer steps epoch by epoch: its total, and whether a checkpoint of another number of processes
continues on the same steps.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from time import perf_counter

import numpy as np
import torch
from torch.utils.data import DataLoader

from fastlm.engine.config import TrainParams
from fastlm.engine.data import (
    DynamicPaddingCollator,
    LengthGroupedSampler,
    PackedBatchSampler,
    PackedCollator,
    PackedSeq2SeqCollator,
    Seq2SeqCollator,
    TextEnds,
    seq2seq_lengths,
)
from fastlm.engine.data.packing import TokenBudget, choose_row_length
from fastlm.engine.data.samplers import LENGTH_GROUPED_MEGA_BATCHES, epoch_rng
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.model.attention.inputs import to_device
from fastlm.engine.model.encoder_decoder import (
    enable_packed_seq2seq,
    enable_target_head,
    generate_as_trained,
    packing_unavailable,
)
from fastlm.engine.runtime.environment import resolve_device, usable_cpu_count
from fastlm.engine.runtime.float8 import token_multiple
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = [
    "MicroBatches",
    "NoneIfEmpty",
    "RandomBatches",
    "Seq2SeqSides",
    "StepPlan",
    "StreamLayout",
    "backoff_pieces",
    "loader_settings",
    "make_batching",
    "micro_batches",
    "packed_budget",
    "padding_multiple",
    "say_untrained_answers",
    "seq2seq_batching",
    "step_plan",
]


@dataclass(frozen=True, eq=False)
class Seq2SeqSides:
    """An encoder-decoder model's batching (``seq2seq_batching``): each sample's prompt length, the decoder
    start id, whether ``packed`` batches pack (``packing``), and the special tokens the data's tokenizer puts
    around a text (``ends``, ``collators.TextEnds``), which the encoder and decoder rows get back."""

    prompt_lengths: object  # np.ndarray, one per sample
    decoder_start_id: int
    packing: bool = False
    ends: TextEnds = TextEnds()

    def real_lengths(self, lengths):
        """Each sample's real tokens as its batches count them (the collators' ``num_real_tokens``): its ids,
        the decoder start and the ends around both sides (``collators.seq2seq_sides``)."""
        return lengths + 1 + len(self.ends.head) + len(self.ends.tail)


def padding_multiple(params: TrainParams) -> int:
    """The multiple every padded length rounds up to: ``train.batching.pad_to_multiple_of`` (``auto``
    resolved for the run's device) and float8's alignment (``token_multiple``), as ``make_batching`` pads."""
    batching = params.batching
    device_type = resolve_device(params.runtime.device).type
    align = token_multiple(params.runtime.float8, device_type, row_length=batching.fixed_row_length())
    return batching.pad_multiple(device_type, align)


def make_batching(
    params: TrainParams,
    lengths,
    *,
    pad_id: int,
    max_length: int,
    seed: int,
    sides: Seq2SeqSides | None = None,
    configured: int | None = None,
    processes: int | None = None,
):
    """The batch sampler and collator of the configured mode (packed: ``packed_budget``). ``processes``: a
    training run's, whose micro-batches make one optimizer step with the accumulation (``length_grouped``
    groups whole steps by length, ``LengthGroupedSampler``'s ``step_batches``; the other modes' batches make
    the same steps for every split of a step into micro-batches and processes); None (an evaluation, a
    tune's trial): batches alone. ``configured``:
    micro_batch_size as configured, where an out-of-memory back-off made ``params``' smaller since: each
    configured batch is cut in ``split`` pieces (``backoff_pieces``: ``2 ** halvings``), the batches of
    every mode the configured ones cut in pieces (packed: their rows), so every sample stays in its step and
    every epoch ends on the steps planned. A batch of fewer samples (packed: rows) than ``split`` ends in
    empty pieces, positions the stream counts and skips (``NoneIfEmpty``): micro-batch 3 halved to 1 is 4
    pieces of one, the last empty. Packed rows whose pieces the last halving did not shrink (a configured
    micro-batch of 1 row in 2, 2 in 4: a piece is that one row again) cannot be cut: one line.

    Encoder-decoder models (``sides`` given, see ``seq2seq_batching``): batches grouped or packed by each
    sample's longer side, its tokenizer's ends included; ``packed`` with ``sides.packing`` (the family
    and attention path keep packed samples apart, ``seq2seq_hooks``) gives a ``PackedSeq2SeqCollator``;
    otherwise a ``Seq2SeqCollator`` pads each side to its own batch maximum and ``packed`` runs
    ``length_grouped`` (the training loop says so once, in its log and summary).
    """
    batching = params.batching
    split = backoff_pieces(configured, batching.micro_batch_size) if configured else 1
    device_type = resolve_device(params.runtime.device).type
    align = token_multiple(params.runtime.float8, device_type, row_length=batching.fixed_row_length())
    pad_multiple = padding_multiple(params)
    seq2seq = sides is not None
    mode = batching.mode
    if seq2seq:
        lengths = seq2seq_lengths(lengths, sides.prompt_lengths, sides.ends)
        if mode == "packed" and not sides.packing:
            mode = "length_grouped"
    if mode == "packed":
        if split > 1:  # the configured batches' rows, cut in pieces of at most ``rows`` rows
            whole = batching.model_copy(update={"micro_batch_size": configured or batching.micro_batch_size})
            budget = packed_budget(whole, lengths, max_length, align=align)
            if 2 * budget.rows_per_batch <= split:  # pieces of one row already in split / 2: no smaller
                raise ConfigError(
                    f"train.batching.oom_backoff cannot cut a packed micro-batch of {budget.rows_per_batch} "
                    f"row(s) of {budget.row_length} tokens in {split}: its pieces were one row already, out "
                    "of memory at its smallest.",
                    fix="set a shorter train.batching.row_length (or auto), turn on "
                    "train.model.gradient_checkpointing, or run `kedro run --pipeline=tune`.",
                )
            piece = TokenBudget(budget.row_length, -(-budget.rows_per_batch // split))
        else:
            budget = piece = packed_budget(batching, lengths, max_length, align=align)
        # Masks / varlen boundaries are made per attention path by attention.inputs.to_device, on the device.
        collator = (
            PackedSeq2SeqCollator(
                pad_id=pad_id,
                decoder_start_id=sides.decoder_start_id,
                budget=piece,
                pad_to_multiple_of=pad_multiple,
                ends=sides.ends,
            )
            if seq2seq
            else PackedCollator(
                pad_id=pad_id,
                budget=piece,
                pad_to_multiple_of=pad_multiple,
                attention_mask_format="none",
                fixed_shape=params.runtime.fixed_shapes(),  # compile_mode reduce-overhead: CUDA graphs
            )
        )
        return PackedBatchSampler(lengths, budget, seed=seed, split=split), collator
    # split > 1: the configured batches, cut in pieces of at most ``micro_batch_size`` samples (halving
    # ``configured`` h times rounding up is ``ceil(configured / 2 ** h)``: every halving shrinks a piece)
    size = configured if split > 1 else batching.micro_batch_size
    if mode == "dynamic":
        sampler = RandomBatches(lengths, size, seed=seed, split=split)
    else:
        # a step's configured batches: the configured accumulation (a back-off's doubles with its pieces)
        # x the processes
        step_batches = max(1, batching.gradient_accumulation_steps // split) * processes if processes else 1
        sampler = LengthGroupedSampler(
            lengths,
            size,
            mega_batch_mult=LENGTH_GROUPED_MEGA_BATCHES,
            seed=seed,
            split=split,
            step_batches=step_batches,
        )
    collator = (
        Seq2SeqCollator(
            pad_id=pad_id,
            decoder_start_id=sides.decoder_start_id,
            pad_to_multiple_of=pad_multiple,
            ends=sides.ends,
        )
        if seq2seq
        else DynamicPaddingCollator(pad_id=pad_id, pad_to_multiple_of=pad_multiple)
    )
    return sampler, collator


def packed_budget(batching, lengths, max_length: int, align: int = 1) -> TokenBudget:
    """Rows of ``batching.row_length`` tokens (``auto``: chosen from ``lengths``) holding together the
    micro-batch's ``micro_batch_size * max_length`` tokens. ``align``: the multiple a row's length must be
    (float8's, ``runtime.float8.token_multiple``: a full row is not padded further)."""
    row_length = batching.row_length
    if row_length == "auto":
        row_length = -(-choose_row_length(lengths, max_length) // align) * align
    elif row_length % align:
        raise ConfigError(
            f"train.batching.row_length is {row_length} tokens, and float8 matmuls (train.runtime.float8 on) "
            f"take token counts in multiples of {align} only.",
            fix=f"set train.batching.row_length to auto or {-(-row_length // align) * align}, or "
            "train.runtime.float8 to auto or off.",
        )
    longest = int(lengths.max()) if len(lengths) else 0
    if longest > row_length:
        raise ConfigError(
            f"train.batching.row_length is {row_length} tokens but the data has a sample of {longest}.",
            fix=f"set train.batching.row_length to auto or to at least {longest}.",
        )
    return TokenBudget(
        row_length=row_length, rows_per_batch=max(1, batching.micro_batch_size * max_length // row_length)
    )


def seq2seq_batching(model, dataset: TokenSequences, attn: str | None = None) -> Seq2SeqSides | None:
    """``make_batching``'s ``sides`` for ``model`` on ``dataset`` (None for a causal LM).

    The prompt feeds the encoder and the response is the decoder target, so the data must be prompt/response.
    ``attn`` given and the family able to keep packed samples apart with it (``seq2seq_hooks``): the model
    gets its packing hooks and ``packed`` batches pack (``seq2seq_packing``); without ``attn`` batches stay
    padded. The rows get the special tokens the data's tokenizer puts around a text (``dataset.text_ends``,
    BART's ``<s>`` and ``</s>``), and the model generates as it trains (``generate_as_trained``).
    """
    config = getattr(model, "config", None)
    if not getattr(config, "is_encoder_decoder", False):
        return None
    if dataset.prompt_lengths is None:
        raise ConfigError(
            f"{type(model).__name__} is an encoder-decoder model: it trains on prompt/response data "
            "(the prompt feeds the encoder, the response is the decoder target), but the tokenized split "
            "has no prompts.",
            fix="set split.prompt_column and split.response_column (or split.messages_column) and rerun "
            "`kedro run --pipeline=split`, or train a decoder-only model on plain text.",
        )
    start = getattr(config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(config, "pad_token_id", None)
    if start is None:
        raise ConfigError(
            f"{type(model).__name__} has no decoder_start_token_id in its config.json.",
            fix="set decoder_start_token_id in the model folder's config.json (BART: the EOS id, "
            "T5: the pad id).",
        )
    ends = dataset.text_ends or TextEnds()
    enable_target_head(model)  # a training step runs the LM head on target positions only
    generate_as_trained(model, int(start), ends.head)
    packing = attn is not None and packing_unavailable(model, attn) is None
    if packing:
        enable_packed_seq2seq(model)
    return Seq2SeqSides(dataset.prompt_lengths, int(start), packing, ends)


def say_untrained_answers(model, dataset: TokenSequences) -> None:
    """Say once, where a run is built, that an encoder-decoder model trains each chat's last answer only: the
    earlier answers (``answer_spans``) are its encoder's input, never a target."""
    spans = dataset.answer_spans
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False) and spans and len(spans[0]):
        log.warning(
            "%s is an encoder-decoder model: the chats' earlier answers are encoder input, so only each "
            "chat's last answer is trained (split.train_turns: last makes the data say so).",
            type(model).__name__,
        )


class RandomBatches(LengthGroupedSampler):
    """``dynamic`` mode: random batches (no length grouping), each padded to its own longest sample
    (``split``: each cut in pieces, as ``LengthGroupedSampler``'s)."""

    def _make_batches(self, rng):
        order = rng.permutation(self.lengths.size)
        return self.pieces([order[i : i + self.batch_size] for i in range(0, order.size, self.batch_size)])


def loader_settings(params: TrainParams, device: torch.device, *, announce: bool = False) -> dict:
    """Workers from the cores (none on CPU, where they would compete with the math), pinned memory on CUDA.

    ``auto`` on CUDA: half of this process's share of the cores, 2 to 8: the processes of one machine
    (``LOCAL_WORLD_SIZE``) share its cores, as their threads do (``launch.job``). ``announce``: log the
    count and why (once a run, where its stream is built)."""
    settings = params.dataloader
    workers, why = settings.num_workers, "train.dataloader.num_workers"
    if workers == "auto":
        cores, processes = usable_cpu_count(), max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        share = max(1, cores // min(processes, cores))
        workers = min(8, max(2, share // 2)) if device.type == "cuda" else 0
        why = (
            f"auto: half of this process's {share} of {cores} cores, 2 to 8"
            + (f", the machine's cores shared by its {processes} processes" if processes > 1 else "")
            if device.type == "cuda"
            else "auto: none on CPU, where loading in the training process competes with no math"
        )
    if announce:
        log.info("%d DataLoader workers per process (%s)", workers, why)
    pin = device.type == "cuda" if settings.pin_memory == "auto" else settings.pin_memory
    extra = {"persistent_workers": settings.persistent_workers, "prefetch_factor": settings.prefetch_factor}
    return {"num_workers": workers, "pin_memory": pin, **(extra if workers else {})}


class MicroBatches:
    """Endless micro-batches across epochs; ``position`` counts what the loop consumed (for exact resume).

    ``batch`` counts this rank's batches; ``position`` reports GLOBAL batches (``batch * shards``: every rank
    has consumed as many), so a checkpoint can be resumed by another number of ranks (``resume_position``).
    """

    def __init__(
        self,
        dataset: TokenSequences,
        sampler,
        collator,
        loader_kwargs: dict,
        *,
        epoch: int,
        batch: int,
        seed: int = 0,
    ):
        self.dataset, self.sampler, self.collator, self.loader_kwargs = (
            dataset,
            sampler,
            collator,
            loader_kwargs,
        )
        self.epoch, self.batch, self.seed = epoch, batch, seed
        self._loader: DataLoader | None = None  # persistent workers: the one loader every epoch iterates
        self._iterator: Iterator | None = None
        self._epoch_end = 0  # this rank's batches in the epoch being read (known once its loader starts)
        self._peeked: tuple[list[dict], float, int] | None = None
        self.step_start = (epoch, batch)  # (epoch, position) of the last fetched step's first micro-batch

    @property
    def position(self) -> dict:
        return {"epoch": self.epoch, "batch_in_epoch": self.batch * self.sampler.num_shards}

    def batches_per_epoch(self) -> int:
        self.sampler.set_epoch(self.epoch, start_batch=0)
        return len(self.sampler)

    def progress(self) -> dict:
        """``position`` for a metric record, ``epoch`` as epochs done (1.5: half-way through the second),
        counted in this stream's batches (half-size ones after an out-of-memory back-off)."""
        if self._epoch_end == 0:  # nothing read yet
            self._epoch_end = self.batches_per_epoch()
        return {**self.position, "epoch": round(self.epoch + self.batch / max(1, self._epoch_end), 4)}

    def __next__(self) -> dict:
        while True:  # an out-of-memory back-off's pieces of a short batch may be empty: counted, not returned
            batch = self._read()
            if batch is not None:
                return batch

    def _read(self) -> dict | None:
        """The next position's micro-batch (None: an empty piece)."""
        if self._iterator is None:
            # the batch sampler is iterated here, in this process: its epoch and start set before ``iter``
            # give a persistent loader's workers the epoch's batches
            self.sampler.set_epoch(self.epoch, start_batch=self.batch)
            self._epoch_end = self.batch + len(self.sampler)
            self._iterator = iter(self._loader or self._new_loader())
        try:
            batch = next(self._iterator)
        except StopIteration:
            self.epoch, self.batch, self._iterator = self.epoch + 1, 0, None
            return self._read()
        except RuntimeError as error:  # torch's watchdog: a worker process ended (the out-of-memory killer)
            if not str(error).startswith("DataLoader worker (pid"):
                raise
            self.close()
            raise ConfigError(
                f"a DataLoader worker stopped at batch {self.batch} of epoch {self.epoch}: {error} (killed, "
                "most often by the host's out-of-memory killer; each worker holds its own copy of what it "
                "touches).",
                fix="lower train.dataloader.num_workers (0 loads in the training process) or free host "
                "memory, then run the same command again (train.resume: auto continues from the last "
                "checkpoint).",
            ) from None
        self.batch += 1
        return batch

    def _new_loader(self) -> DataLoader:
        """A loader over the sampler as it is set now. With ``persistent_workers`` (and workers) it is kept:
        each later epoch iterates it again, on the same worker processes (torch resets their iterator); the
        workers' base seed (``loader_generator``) is then the first epoch's, which changes no batch (the
        collators and the dataset draw nothing at random). Without: a new loader, and new workers, an epoch.
        """
        loader = DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            collate_fn=NoneIfEmpty(self.collator),
            generator=loader_generator(self.seed, self.epoch),
            **self.loader_kwargs,
        )
        if loader.persistent_workers and loader.num_workers > 0:
            self._loader = loader
        return loader

    def close(self) -> None:
        """End the loader's worker processes (persistent ones live until then); the stream may be read again
        after, on new ones."""
        iterator, self._iterator, self._loader = self._iterator, None, None
        shutdown = getattr(iterator, "_shutdown_workers", None)  # torch's, on an iterator with workers
        if shutdown is not None:
            shutdown()

    def peek_step(self, accumulation: int, device: torch.device, attn: str) -> list[dict]:
        """The micro-batches the next ``next_step`` returns (fetched now, handed out then)."""
        if self._peeked is None:
            self._peeked = (*self.next_step(accumulation, device, attn), accumulation)
        return self._peeked[0]

    def switch_attention(self, device: torch.device, attn: str) -> None:
        """Rebuild the peeked micro-batches' model inputs for another attention path (each path needs its own:
        a bool mask on the eager path would leak)."""
        if self._peeked is not None:
            step, wait, asked = self._peeked
            self._peeked = ([to_device(batch, device, attn) for batch in step], wait, asked)

    def next_step(self, accumulation: int, device: torch.device, attn: str) -> tuple[list[dict], float]:
        """One optimizer step's micro-batches on ``device`` and the seconds spent waiting for the
        DataLoader: ``accumulation`` of them, but an epoch's last step takes only the ones left in it (as
        the Trainer's does), so each epoch trains each sample once; its loss is the mean over its own
        targets all the same (``accumulation.accumulate_gradients``). ``accumulation`` counts positions: a
        back-off's empty pieces are in them."""
        if self._peeked is not None:
            step, wait, asked = self._peeked
            self._peeked = None
            if asked != accumulation:
                raise ValueError(f"peeked {asked} micro-batches a step, asked for {accumulation}")
            return step, wait
        waited = perf_counter()
        with torch.profiler.record_function("fastlm.data"):
            # the step's first position read as any other: a rank's shard of a back-off's pieces may start a
            # step on an empty one, which ``next(self)`` would skip, sliding the step into the next one's
            first = self._read()
            self.step_start = (self.epoch, self.batch - 1)
            fetched = [first] if first is not None else []
            end = min(self.batch - 1 + accumulation, self._epoch_end)
            while self.batch < end:
                batch = self._read()
                if batch is not None:
                    fetched.append(batch)
        wait = perf_counter() - waited
        return [to_device(batch, device, attn) for batch in fetched], wait


class NoneIfEmpty:
    """A collator that gives None for an empty batch (an out-of-memory back-off's empty piece)."""

    def __init__(self, collator) -> None:
        self.collator = collator

    def __call__(self, samples: list):
        return self.collator(samples) if len(samples) else None


@dataclass(frozen=True)
class StreamLayout:
    """What a run's micro-batch stream is cut with, the same for every stream the run builds (the start, the
    resume, an out-of-memory back-off): pad id, row length, ``sides`` (``seq2seq_batching``'s, None for a
    causal LM), ``loader_kwargs`` (``loader_settings``) and this rank's shard."""

    pad_id: int
    max_length: int
    sides: Seq2SeqSides | None
    loader_kwargs: dict
    rank: int = 0
    world_size: int = 1


def micro_batches(
    dataset: TokenSequences,
    params: TrainParams,
    layout: StreamLayout,
    *,
    epoch: int = 0,
    batch: int = 0,
    configured: int | None = None,
    processes: int | None = None,
) -> MicroBatches:
    """The stream of this rank's micro-batches for ``params.batching``, from ``batch`` of ``epoch`` on, in
    the order of ``params.order_seed`` (``train.data_seed``, else ``train.seed``: each rank's shard of one
    order).
    ``configured``: the micro-batch size the run was configured with, where an out-of-memory back-off
    halved it since (the batches are the configured ones cut in pieces, ``make_batching``). ``processes``:
    the run's, whose steps the batches make (default ``layout.world_size``)."""
    sampler, collator = make_batching(
        params,
        dataset.lengths,
        pad_id=layout.pad_id,
        max_length=layout.max_length,
        seed=params.order_seed,
        configured=configured,
        sides=layout.sides,
        processes=processes or layout.world_size,
    )
    sampler.shard(layout.rank, layout.world_size)
    return MicroBatches(
        dataset, sampler, collator, layout.loader_kwargs, epoch=epoch, batch=batch, seed=params.seed
    )


def backoff_pieces(configured: int, size: int) -> int:
    """The pieces each configured batch of ``configured`` samples is cut in for micro-batches of ``size``
    (``backoff.halve_micro_batch``'s ``ceil(configured / 2 ** halvings)``): ``2 ** halvings``, the fewest
    pieces of at most ``size`` samples."""
    pieces = 1
    while -(-configured // pieces) > size:
        pieces *= 2
    return pieces


class StepPlan:
    """A run's optimizer steps, epoch by epoch.

    ``sizes(epoch)`` is an epoch's global micro-batches (all processes' together; packed epochs differ a
    little, each packed after its own shuffle). W processes train the first ``N - N mod W`` of them (the
    samplers' even shards, the rest left out), ``accumulation x W`` a step, the epoch's last step taking those
    left (``MicroBatches.next_step``): ``ceil((N - N mod W) / (accumulation x W))`` steps. ``train.epochs``
    E plans each of the first ``floor(E)`` epochs' own steps and, for a fraction, ``ceil(E x steps) -
    floor(E) x steps`` of the next one (with equal epochs: ``ceil(E x steps)``, the single-epoch formula
    planned with before); ``train.max_steps`` is the total as given.

    ``row_length``: the packed rows' length the counts come from (``row_length: auto`` resolved; None: not
    packed), which the resume digest records (the device may resolve ``auto`` otherwise).

    A checkpoint of another number of processes continues on this plan only where both numbers train the same
    micro-batches of every epoch the plan reaches the end of (``difference``): its step then sits at the same
    data position in both, and the epochs end on the same steps.
    """

    def __init__(
        self,
        sizes: Callable[[int], int],
        *,
        world_size: int,
        accumulation: int,
        epochs: float = 1.0,
        max_steps: int | None = None,
        row_length: int | None = None,
    ) -> None:
        self._sizes, self._known, self.row_length = sizes, {}, row_length
        self.world_size, self.accumulation, self.epochs, self.max_steps = (
            world_size,
            accumulation,
            epochs,
            max_steps,
        )
        self.total_steps = max_steps or self._epochs_total(world_size)

    @property
    def micro_batches_per_step(self) -> int:
        return self.accumulation * self.world_size

    def size(self, epoch: int) -> int:
        """The global micro-batches of ``epoch`` (counted once)."""
        if epoch not in self._known:
            self._known[epoch] = int(self._sizes(epoch))
        return self._known[epoch]

    def trained(self, epoch: int, world_size: int | None = None) -> int:
        """The global micro-batches ``world_size`` processes (this run's number) train of ``epoch``."""
        size = self.size(epoch)
        return size - size % (world_size or self.world_size)

    def steps(self, epoch: int, world_size: int | None = None) -> int:
        """The optimizer steps of ``epoch`` in ``world_size`` processes (this run's number)."""
        return max(1, -(-self.trained(epoch, world_size) // self.micro_batches_per_step))

    def epochs_at(self, step: int) -> float:
        """Epochs done after ``step`` steps, each epoch counted in its own steps (2.5: half of the third)."""
        epoch = 0
        while step >= self.steps(epoch):
            step, epoch = step - self.steps(epoch), epoch + 1
        return round(epoch + step / self.steps(epoch), 4)

    def _epochs_total(self, world_size: int) -> int:
        whole = math.floor(self.epochs)
        total = sum(self.steps(epoch, world_size) for epoch in range(whole))
        if self.epochs > whole:
            steps = self.steps(whole, world_size)
            total += math.ceil(self.epochs * steps) - whole * steps
        return max(1, total)

    def outline(self, world_size: int) -> list[int]:
        """The global micro-batches ``world_size`` processes train in each epoch this plan reaches (of the
        last one, those its steps reach)."""
        left, trained, epoch = self.max_steps or self._epochs_total(world_size), [], 0
        while left > 0:
            steps, count = self.steps(epoch, world_size), self.trained(epoch, world_size)
            trained.append(count if left >= steps else min(count, left * self.micro_batches_per_step))
            left, epoch = left - steps, epoch + 1
        return trained

    def difference(self, world_size: int) -> str | None:
        """Why a checkpoint of ``world_size`` processes does not continue on this plan, in words; None where
        it does (the same number, or the same micro-batches trained in every epoch)."""
        if world_size == self.world_size:
            return None
        saved, now = self.outline(world_size), self.outline(self.world_size)
        if saved == now:
            return None
        epoch = next((e for e, pair in enumerate(zip(saved, now, strict=False)) if pair[0] != pair[1]), None)
        if epoch is None:  # the same epochs as far as both go
            epoch = min(len(saved), len(now))
        theirs = saved[epoch] if epoch < len(saved) else 0
        mine = now[epoch] if epoch < len(now) else 0
        size, saved_by, run_by = self.size(epoch), _processes(world_size), _processes(self.world_size)
        return (
            f"its {saved_by} train {theirs} of epoch {epoch}'s {size} micro-batches and this run's {run_by} "
            f"{mine} (an epoch is split evenly over the processes, the rest left out), so its steps and data "
            "positions are not this run's"
        )


def _processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"


def step_plan(dataset: TokenSequences, params: TrainParams, layout: StreamLayout) -> StepPlan:
    """The run's ``StepPlan`` for ``params.batching`` and ``train.epochs`` / ``max_steps`` in
    ``layout.world_size`` processes (the epochs' micro-batches counted, not built: ``epoch_length``). Data of
    fewer micro-batches than processes in an epoch the plan reaches is refused in one line (each process's
    share would be empty; packed epochs, packed after their own shuffle, may make fewer than epoch 0)."""
    sampler = micro_batches(dataset, params, layout).sampler
    budget = getattr(sampler, "budget", None)  # packed: the rows' length, ``auto`` resolved
    plan = StepPlan(
        sampler.epoch_length,
        world_size=layout.world_size,
        accumulation=params.batching.gradient_accumulation_steps,
        epochs=params.epochs,
        max_steps=params.max_steps,
        row_length=budget.row_length if budget is not None else None,
    )
    _refuse_empty_shards(plan, len(dataset))
    return plan


def trained_samples(
    dataset: TokenSequences, params: TrainParams, layout: StreamLayout, plan: StepPlan, *, configured=None
) -> np.ndarray:
    """The samples ``layout.world_size`` processes train of epoch 0: those of its first ``plan.trained(0)``
    micro-batches (the ranks' even shards; the last ``N mod processes`` left out), every sample in one
    process. ``configured``: as ``micro_batches``'."""
    if plan.trained(0, layout.world_size) == plan.size(0):
        return np.arange(len(dataset))
    sampler = micro_batches(  # every rank's batches, in the order the run's processes share out
        dataset,
        params,
        replace(layout, rank=0, world_size=1),
        configured=configured,
        processes=layout.world_size,
    ).sampler
    batches = sampler.epoch_batches()[: plan.trained(0, layout.world_size)]
    return np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)


def _refuse_empty_shards(plan: StepPlan, samples: int) -> None:
    """One line where an epoch the plan reaches makes fewer micro-batches than the processes training it: its
    even shards would be empty, yet the plan counts a step for it and the streams would read the next
    epoch's there (epoch 0: no step could read a micro-batch). One process: every epoch has one."""
    world = plan.world_size
    if world == 1:
        return
    reached = 1 if plan.size(0) < world else len(plan.outline(world))
    epoch = next((e for e in range(reached) if plan.size(e) < world), None)
    if epoch is None:
        return
    where = "an epoch" if epoch == 0 else f"in epoch {epoch} (packed after its own shuffle; epoch 0 makes "
    where += "" if epoch == 0 else f"{plan.size(0)})"
    smaller = f"set a smaller train.batching.micro_batch_size (at most {samples // world}), "
    raise ConfigError(
        f"the training data's {samples} samples make {plan.size(epoch)} micro-batch(es) {where}, fewer than "
        f"the {world} processes training it (each takes an equal share of an epoch's micro-batches).",
        fix=f"{smaller if samples >= world else ''}train on more data, or run fewer processes.",
    )


def loader_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator a DataLoader draws its workers' base seed from, one per (seed, epoch). Without one,
    each ``iter(DataLoader)`` draws it from torch's global generator: a resumed run, which starts its
    iterator in mid-epoch after the checkpoint's generator states are back, would draw once more than the
    uninterrupted run did, and every later random draw (dropout, NEFTune's noise) would differ."""
    return torch.Generator().manual_seed(int(epoch_rng(seed, epoch).integers(2**62)))
