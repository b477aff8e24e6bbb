"""The training run's checkpoints: which one to continue, what a checkpoint holds, and when to write one.

``Checkpointer.restore()`` applies ``train.resume`` (``resume.plan_resume``: the run digest must match), loads
the chosen checkpoint once (weights, optimizer, scheduler, grad scaler, RNG states; a sharded FSDP2 model or
a trainable-only LoRA checkpoint through their own loaders; a checkpoint of either strategy in the other, its
AdamW moments rekeyed: by parameter name under FSDP2, by position otherwise) and returns the
:class:`TrainState` to continue from (a fresh one when starting over). ``maybe_save(state, position,
force=...)`` writes a checkpoint when the step is ``due`` (every ``save_every`` steps, the last step, or
forced by a stop signal) through ``save``
(``checkpoint.save_checkpoint``: atomic, pruned to ``keep_last``); every rank calls it (FSDP2 gathers the
whole state dicts collectively), only rank 0 writes. ``ended(state, reason)``: the run ended (not a
time-budget or signal stop), marked on its last checkpoint where that checkpoint's state cannot say so.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

import safetensors.torch
import torch

from fastlm.engine.batching import StepPlan
from fastlm.engine.checkpoint.discovery import ended_in_state, finished_step
from fastlm.engine.checkpoint.files import SaveOptions, mark_finished, save_checkpoint
from fastlm.engine.checkpoint.layout import MODEL_FILE, OPTIMIZER_FILE, CheckpointError, checkpoint_dir
from fastlm.engine.checkpoint.loading import load_checkpoint, read_checkpoint_state
from fastlm.engine.checkpoint.resume import ResumePlan, data_digest, plan_resume, run_digest
from fastlm.engine.checkpoint.rng import rank_rng_state
from fastlm.engine.config import OptimizerParams, TrainParams
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import (
    Collectives,
    full_state_dicts,
    is_sharded,
    load_full_state_dicts,
    optimizer_state_by_index,
)
from fastlm.engine.model.encoder_decoder import unwrapped
from fastlm.engine.model.lora import trains_part_only
from fastlm.engine.train.schedule import AppliedStepsLR, LRSchedule, run_schedule
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import Optimization
from fastlm.errors import FastlmError

log = logging.getLogger(__name__)

__all__ = ["Checkpointer", "resume_position"]


class Checkpointer:
    """Resume and save for one run (see the module docstring); ``opt``: what the steps update, ``plan``: the
    run's steps (a checkpoint of another number of processes must continue on them)."""

    def __init__(
        self,
        params: TrainParams,
        *,
        model: torch.nn.Module,
        opt: Optimization,
        comm: Collectives,
        train_set: TokenSequences,
        max_length: int,
        plan: StepPlan,
        device: torch.device,
    ) -> None:
        self.params, self.model, self.opt, self.comm, self.step_plan = params, model, opt, comm, plan
        self.protected: Path | None = None  # early stopping's best checkpoint: kept past keep_last
        # the newest checkpoint this run resumed or wrote, and what its state says of the run's end (step,
        # total_steps, early_stopping): ``ended`` judges it without reading the checkpoint again
        self.newest: tuple[Path, dict] | None = None
        self.root, self.total_steps, self.device = Path(params.checkpoint_dir), plan.total_steps, device
        self.sharded = is_sharded(model)  # FSDP2: checkpoints hold the gathered, whole state dicts
        # LoRA: the frozen base comes from name_or_path again; checkpoints hold the trainable tensors only
        # (under FSDP2 too: only they are gathered).
        self.trainable_only = trains_part_only(model)
        self.digest = run_digest(
            model,
            params,
            max_length=max_length,
            world_size=comm.world_size,
            sharded=self.sharded,
            row_length=plan.row_length,  # ``auto`` resolved: the packing a data position means
            text_ends=_encoder_decoder_ends(model, train_set),
            # batches grouped by length: length_grouped, or an encoder-decoder's packed that cannot pack
            length_grouped=plan.row_length is None and params.batching.mode != "dynamic",
            data=data_digest(
                train_set.values, train_set.offsets, train_set.prompt_lengths, train_set.answer_spans
            ),
        )

    def restore(self) -> TrainState:
        """The state to continue from: the planned checkpoint loaded (read once), or a fresh start."""
        plan = self._agreed_plan()
        folder = plan.checkpoint
        if folder is None:
            return TrainState()
        self.newest = (folder, plan.state)
        # FSDP2's whole weights, a LoRA run's trained ones, or (unsharded) an FSDP2 checkpoint's: loaded here
        own_loader = (
            self.sharded or plan.state.get("trainable_only", False) or plan.state.get("sharded", False)
        )
        with self.opt.full_precision():  # bf16 weights: the checkpoint's fp32 weights load into the masters
            saved = self._load(folder, plan, own_loader)
        state = TrainState(
            step=saved["step"],
            tokens_seen=saved["tokens_seen"],
            epoch=saved["epoch"],
            batch_in_epoch=resume_position(saved, self.comm.world_size, folder),
            history=saved["history"],
            eval_history=saved["eval_history"],
            batching=saved.get("batching") or {},
            resumed_from=folder,
            first_step=saved["step"],
            last_good=folder,
            runtime_choice=saved.get("runtime_choice") or {},
            early_stopping=saved.get("early_stopping") or {},
            elapsed_before_s=_elapsed(saved),
        )
        self.protected = self._best_of(folder, state.early_stopping)
        _say_other_validation(saved, self.params.eval_max_batches, folder)
        log.info(
            "Resumed from %s at step %d of %d (epoch %d, micro-batch %d of this rank)",
            folder,
            state.step,
            self.total_steps,
            state.epoch,
            state.batch_in_epoch,
        )
        if state.step >= self.total_steps:
            log.warning(
                "%s already reached step %d of this run's %d: nothing to train. Raise train.max_steps (or "
                "train.epochs) to continue it, or set train.resume: never to train again from scratch.",
                folder,
                state.step,
                self.total_steps,
            )
        return state

    def _agreed_plan(self) -> ResumePlan:
        """``resume.plan_resume`` on every rank, the same checkpoint or none (CheckpointError on every rank,
        one line, before anything is loaded or trained).

        Rank 0 plans first (it may move checkpoints aside or put a cut replacement back: the others then see
        the folder as it leaves it), then the others; each rank's choice is compared in one gather. Ranks
        that do not see the same ``train.checkpoint_dir`` (each node's own disk, where only the tokenized
        data was copied to every node) chose apart: one continued step N, another started fresh, DDP averaged
        the gradients of models at different steps, learning rates and data positions, rank 0 wrote their
        mix as checkpoints, and the ranks met at no common last step (a collective then waited until
        ``train.distributed.timeout_s``)."""
        comm = self.comm

        def plan() -> ResumePlan:
            return plan_resume(
                self.root, self.params.resume, self.digest, plan=self.step_plan, move_old=comm.is_main
            )

        if comm.world_size == 1:
            return plan()
        mine, failed = _planned(plan) if comm.is_main else (None, None)
        first = comm.gather_host(_said(mine, failed, self.root))[0]  # the others wait here for rank 0's plan
        if "error" in first:
            raise failed if failed is not None else CheckpointError(first["error"])
        if not comm.is_main:
            mine, failed = _planned(plan)
        choices = comm.gather_host(_said(mine, failed, self.root))
        errors = [(rank, said["error"]) for rank, said in enumerate(choices) if "error" in said]
        if errors:
            raise failed if failed is not None else CheckpointError(f"rank {errors[0][0]}: {errors[0][1]}")
        chosen = [(said["checkpoint"] and Path(said["checkpoint"]).name, said["step"]) for said in choices]
        other = next((rank for rank, choice in enumerate(chosen) if choice != chosen[0]), None)
        if other is None:
            return mine

        def chose(rank: int) -> str:
            said = choices[rank]
            if said["checkpoint"] is None:
                return f"rank {rank} starts fresh"
            return f"rank {rank} continues {Path(said['checkpoint']).name} (step {said['step']})"

        raise CheckpointError(
            f"the {comm.world_size} ranks of this run would not continue the same checkpoint of "
            f"train.checkpoint_dir {choices[0]['root']}: {chose(0)} and {chose(other)} (its own "
            f"{choices[other]['root']}); trained together, they would update one model from other steps, "
            "optimizer states and data positions (train.resume is "
            f"{self.params.resume!r}).",
            fix="give every node the same train.checkpoint_dir (a shared filesystem), or copy rank 0's run "
            "folder to the same path on every node, then start again; or set train.resume: never to start "
            "over.",
        )

    def _best_of(self, folder: Path, record: dict) -> Path | None:
        """Early stopping's best checkpoint of the resumed ``folder``: where its ``record`` says
        (``best_checkpoint``, relative to the folder's run folder: another run's, for a run continued from
        one of its checkpoints), else beside it (a checkpoint written before the place was recorded). Gone
        while early stopping is on: refused in one line (the run would train, then fail to load the model
        it returns). None with early stopping off: the run sets the record aside (``build``), and keeps
        no best."""
        best_step = record.get("best_step")
        if best_step is None or self.params.early_stopping.patience is None:
            return None
        best = checkpoint_dir(folder.parent, best_step)
        recorded = record.get("best_checkpoint")
        if isinstance(recorded, str) and Path(recorded).name == best.name:
            best = Path(os.path.normpath(folder.parent / recorded))
        if not best.is_dir():
            raise CheckpointError(
                f"checkpoint {folder} records step {best_step} as early stopping's best, but {best} is gone: "
                "the model this run would return is not on disk.",
                fix="resume from a checkpoint whose best step's checkpoint is kept, set "
                "train.early_stopping.patience: null to continue without early stopping (the model: the "
                "last step's), or set train.resume: never.",
            )
        return best

    def _load(self, folder: Path, plan, own_loader: bool) -> dict:
        """The checkpoint's model, optimizer, scheduler and scaler states into this run's; its state. The
        optimizer keeps its moments but trains with this run's settings (``keep_settings``)."""
        given = settings_of(self.opt)
        # an FSDP2 checkpoint's AdamW moments are keyed by parameter name: rekeyed by position here
        by_name = not self.sharded and plan.state.get("sharded", False)
        saved = load_checkpoint(
            folder,
            model=None if own_loader else self.model,
            optimizer=None if self.sharded or by_name else self.opt.optimizer,
            scheduler=self.opt.scheduler,
            grad_scaler=self.opt.scaler,
            map_location=self.device,
            header=plan.header,
            rank=(self.comm.rank, self.comm.world_size),
        )
        if self.sharded:
            load_full_state_dicts(
                self.model,
                self.opt.optimizer,
                self._model_file(folder),
                torch.load(folder / OPTIMIZER_FILE, map_location="cpu", weights_only=True),
                trainable_only=self.trainable_only,
            )
        elif plan.state.get("trainable_only", False):
            self._load_trainable(folder)
        elif own_loader:
            self._load_whole(folder)
        if by_name:
            self._load_named_optimizer(folder / OPTIMIZER_FILE)
        now = {**schedule_record(self.params.optimizer, self.total_steps), "total_steps": self.total_steps}
        keep_settings(self.opt, given, folder, schedules=(recorded_schedule(saved), now))
        return saved

    def _load_whole(self, folder: Path) -> None:
        """A sharded run's whole weights (``full_state_dicts``: a tied head under its own name too, which a
        one-process save writes once) into this unsharded model."""
        file = folder / MODEL_FILE
        try:
            self.model.load_state_dict(self._model_file(folder), strict=True)
        except RuntimeError as error:
            raise CheckpointError(
                f"checkpoint file {file} does not match this model: {' '.join(str(error).split())[:300]}.",
                fix="resume with the train.model settings the checkpoint was written with, or set "
                "train.resume: never.",
            ) from error

    def _load_named_optimizer(self, file: Path) -> None:
        """A sharded run's optimizer state (``full_state_dicts``: whole moments keyed by parameter name) into
        this unsharded run's optimizer, each parameter's moments on it."""
        saved = torch.load(file, map_location=self.device, weights_only=True)
        try:
            self.opt.optimizer.load_state_dict(
                optimizer_state_by_index(self.model, self.opt.optimizer, saved)
            )
        except (ValueError, KeyError, RuntimeError) as error:
            raise CheckpointError(
                f"checkpoint file {file} does not match this run's optimizer: {error}.",
                fix="resume with the train.model settings the checkpoint was written with, or set "
                "train.resume: never.",
            ) from error

    def due(self, step: int, *, force: bool = False) -> bool:
        """Whether ``step`` ends with a checkpoint: every ``save_every`` steps, the last step, or
        ``force``."""
        every = self.params.save_every
        return force or bool(every and (step % every == 0 or step == self.total_steps))

    def save(self, state: TrainState, position: dict) -> Path:
        """Write ``state`` at the data ``position`` (``MicroBatches.position``); every rank calls it. With
        bf16 weights, their fp32 masters are what is written."""
        with self.opt.full_precision():
            return self._save(state, position)

    def _save(self, state: TrainState, position: dict) -> Path:
        model, opt = self.model, self.opt
        saved = checkpoint_dir(self.root, state.step)
        model_state, optimizer_state = (
            full_state_dicts(model, opt.optimizer, trainable_only=self.trainable_only)
            if self.sharded
            else (None, None)
        )
        # each rank draws its own numbers (dropout, noise): every rank's states, each to continue its own
        rank_rng = self.comm.gather_host(rank_rng_state()) if self.comm.world_size > 1 else None
        if self.trainable_only and not self.sharded:
            model_state = {
                name: param.detach() for name, param in model.named_parameters() if param.requires_grad
            }
        if self.comm.is_main:  # one writer (checkpoint.files removes other writers' temporaries)
            early_stopping = self._early_stopping_record(state)
            saved = save_checkpoint(
                self.root,
                state.step,
                model=model,
                optimizer=opt.optimizer,
                scheduler=opt.scheduler,
                grad_scaler=opt.scaler,
                options=SaveOptions(
                    self.params.keep_last,
                    also_keep=self.protected,
                    model_state=model_state,
                    optimizer_state=optimizer_state,
                    rank_rng=rank_rng,
                ),
                state={
                    "step": state.step,
                    "history": state.history,
                    "eval_history": state.eval_history,
                    "tokens_seen": state.tokens_seen,
                    "world_size": self.comm.world_size,
                    "sharded": self.sharded,
                    "trainable_only": self.trainable_only,
                    "total_steps": self.total_steps,
                    # a resume with another schedule or clip says what changed (keep_settings)
                    "schedule": schedule_record(self.params.optimizer, self.total_steps),
                    "digest": self.digest,
                    "batching": state.batching,
                    "runtime_choice": state.runtime_choice,
                    "early_stopping": early_stopping,
                    "eval_max_batches": self.params.eval_max_batches,  # the validation batches measured
                    "elapsed_s": state.elapsed_s(),
                    **position,
                },
            )
            self.newest = (
                saved,
                {"step": state.step, "total_steps": self.total_steps, "early_stopping": early_stopping},
            )
        state.last_good = saved
        return saved

    def _early_stopping_record(self, state: TrainState) -> dict:
        """The early-stopping bookkeeping a checkpoint keeps, with where its best checkpoint is, relative to
        this run's folder (``../<other run>/checkpoint-...`` for a run continued from another run's)."""
        if not state.early_stopping or self.protected is None:
            return state.early_stopping
        try:
            where = os.path.relpath(self.protected, self.root)
        except ValueError:  # another drive (Windows): no relative path
            where = str(Path(self.protected).absolute())
        return {**state.early_stopping, "best_checkpoint": Path(where).as_posix()}

    def maybe_save(
        self,
        state: TrainState,
        position: dict,
        *,
        force: bool = False,
        before_save: Callable[[], object] | None = None,
    ) -> Path | None:
        """``save`` when ``due`` (``before_save`` first: the loop flushes its pending metrics); None
        otherwise."""
        if not self.due(state.step, force=force):
            return None
        if before_save is not None:
            before_save()
        return self.save(state, position)

    def ended(self, state: TrainState, reason: str) -> Path | None:
        """The run ended at ``state.step`` for ``reason`` (its last step, early stopping, nothing to train):
        where the newest checkpoint of this run's folder (``state.last_good``) reads unfinished, it gets the
        ``FINISHED`` marker (``files.mark_finished``); returns the marker written, else None.

        A run entered again with nothing to train (``max_steps`` lowered to its checkpoint's step, early
        stopping judged over) writes no checkpoint, nor does one that ends between ``save_every`` steps
        with ``save_every: null`` after a resume; its newest checkpoint still read "step 12 of 30", so the
        next unnamed run (``runs.resolve_run_name``: the newest interrupted run) took its name, moved its
        checkpoints aside and wrote over its model. A checkpoint of another run's folder (``train.resume``
        naming it, nothing trained) is that run's: left alone. Only rank 0 writes (it holds the lock)."""
        folder = state.last_good
        if not self.comm.is_main or folder is None or Path(folder).parent.resolve() != self.root.resolve():
            return None
        # what the restore read or the save wrote (the resume reads a checkpoint once: its history may be
        # long); another folder (never, as last_good is one of them) is read
        saved = self.newest[1] if self.newest is not None and self.newest[0] == folder else None
        try:
            if ended_in_state(saved if saved is not None else read_checkpoint_state(folder)):
                return None  # its state says so already (saved at the last step, early stopping's stop)
        except CheckpointError:
            pass  # unreadable now: the marker says it ended
        marked = finished_step(folder)
        if marked is not None and marked >= state.step:
            return None  # entered again with nothing to train once more: marked already
        return mark_finished(folder, step=state.step, reason=reason)

    def load_weights(self, folder: Path) -> None:
        """The model's weights from checkpoint ``folder`` (early stopping's best step), nothing else."""
        with self.opt.full_precision():
            if self.sharded:  # FSDP2: the whole weights, each rank keeping its shards
                load_full_state_dicts(
                    self.model, None, self._model_file(folder), None, trainable_only=self.trainable_only
                )
            elif self.trainable_only:
                self._load_trainable(folder)
            else:
                load_checkpoint(folder, model=self.model, map_location=self.device, restore_rng=False)

    def _load_trainable(self, folder: Path) -> None:
        """A trainable-only (LoRA) checkpoint into a model in one process."""
        self.model.load_state_dict(self._model_file(folder), strict=False)

    def _model_file(self, folder: Path) -> dict:
        """The checkpoint's weights; of a trainable-only (LoRA) run, exactly the model's trainable
        parameters."""
        file = folder / MODEL_FILE
        saved = safetensors.torch.load_file(str(file))
        trainable = {name for name, param in self.model.named_parameters() if param.requires_grad}
        if self.trainable_only and set(saved) != trainable:
            raise CheckpointError(
                f"checkpoint file {file} holds {len(saved)} tensors, but this model trains {len(trainable)} "
                "(a different LoRA set-up).",
                fix="resume with the train.model.lora settings the checkpoint was written with, or set "
                "train.resume: never.",
            )
        return saved


def _planned(plan: Callable[[], ResumePlan]) -> tuple[ResumePlan | None, FastlmError | None]:
    """``plan()``'s result, or the user error it raised (which every rank then raises)."""
    try:
        return plan(), None
    except FastlmError as error:
        return None, error


def _said(plan: ResumePlan | None, failed: FastlmError | None, root: Path) -> dict:
    """What a rank tells the others of its resume plan (``Checkpointer._agreed_plan``): the checkpoint it
    continues and its step (None: fresh) in its folder ``root``, or its error's line; rank 0's alone before
    the others plan."""
    if failed is not None:
        return {"error": str(failed)}
    if plan is None or plan.checkpoint is None:
        return {"checkpoint": None, "step": None, "root": str(root)}
    return {"checkpoint": str(plan.checkpoint), "step": int(plan.state.get("step", 0)), "root": str(root)}


def _encoder_decoder_ends(model: torch.nn.Module, train_set: TokenSequences):
    """The special tokens an encoder-decoder model's rows get around the split's ids at batch time
    (``batching.seq2seq_batching``): part of the data it trains on; None for a causal LM, whose rows are the
    split's ids."""
    config = getattr(unwrapped(model), "config", None)
    return train_set.text_ends if getattr(config, "is_encoder_decoder", False) else None


def _say_other_validation(saved: dict, now: int | None, folder: Path) -> None:
    """One warning where the checkpoint validated on other batches (``train.eval_max_batches``) than this
    run will: its validation losses from the resumed step on are measured on others than those before.
    With early stopping the two are another run (the digest), so only a run without it gets here."""
    if "eval_max_batches" not in saved or saved["eval_max_batches"] == now:
        return  # the same, or a checkpoint written before it was recorded
    log.warning(
        "%s was validated with another train.eval_max_batches (%s -> %s in this run): the validation "
        "losses after step %d are measured on other batches than those before (eval_history, the "
        "report's curve)",
        folder,
        saved["eval_max_batches"],
        now,
        saved["step"],
    )


def resume_position(state: dict, world_size: int, folder: Path) -> int:
    """This rank's micro-batch to resume from: the checkpoint's global batch count split over ``world_size``.

    Every rank consumed the same number of batches, so a checkpoint written by W ranks at global batch ``b``
    resumes exactly with W' ranks when W' divides ``b`` (e.g. the same effective batch with W' * a' = W * a).
    """
    global_batch = int(state["batch_in_epoch"])
    if global_batch % world_size:
        raise CheckpointError(
            f"checkpoint {folder} was saved after global micro-batch {global_batch} of epoch "
            f"{state['epoch']} by {state.get('world_size', 1)} process(es); {world_size} processes cannot "
            "split that position evenly.",
            fix=f"resume with a number of processes that divides {global_batch} "
            f"(it was {state.get('world_size', 1)}), or set train.resume: never to start over.",
        )
    return global_batch // world_size


def _elapsed(saved: dict) -> float:
    """The run's training time a checkpoint recorded; for one saved before it did, its history's last
    ``elapsed_s`` (0 without one)."""
    if saved.get("elapsed_s") is not None:
        return float(saved["elapsed_s"])
    records = [record for record in saved.get("history") or [] if record.get("elapsed_s") is not None]
    return float(records[-1]["elapsed_s"]) if records else 0.0


# The optimizer's hyperparameters a checkpoint's state would bring back (torch's Optimizer.load_state_dict
# restores every param group's): this run's are put back over them.
SETTINGS = ("weight_decay", "betas", "eps", "lr_scale")


def settings_of(opt: Optimization) -> tuple[list[dict], list[float]]:
    """This run's optimizer settings and schedule base rates, before a checkpoint is loaded over them."""
    groups = [{key: group[key] for key in SETTINGS if key in group} for group in opt.optimizer.param_groups]
    return groups, list(opt.scheduler.base_lrs)


def schedule_record(settings: OptimizerParams, total_steps: int) -> dict:
    """The schedule and clip settings a checkpoint records (with its ``total_steps``, ``SCHEDULE``): they
    are not in the digest, a resume applies this run's from its step on, and a checkpoint keeps no other
    trace of them (LambdaLR saves its step, not its function), so only a record can say what changed. The
    warmup as the schedule ran it: ``warmup_ratio``'s, cut to the run's steps."""
    schedule = run_schedule(settings, total_steps)
    return {
        "warmup_steps": schedule.warmup_steps,
        "warmup_ratio": settings.warmup_ratio,
        "decay": schedule.decay,
        "min_lr_ratio": schedule.min_lr_ratio,
        "grad_clip": settings.grad_clip,
    }


# The schedule's settings a resume compares, named as the log says them; total_steps: the planned steps
# (train.max_steps or epochs), which every checkpoint records.
SCHEDULE = ("warmup_steps", "warmup_ratio", "decay", "min_lr_ratio", "grad_clip", "total_steps")


def recorded_schedule(state: dict) -> dict:
    """A checkpoint's ``schedule_record`` and planned steps; only the steps (or nothing) for a checkpoint
    written before the record existed."""
    recorded = state.get("schedule")
    total = {"total_steps": state["total_steps"]} if state.get("total_steps") is not None else {}
    return {**(recorded if isinstance(recorded, dict) else {}), **total}


def keep_settings(
    opt: Optimization,
    given: tuple[list[dict], list[float]],
    folder: Path,
    *,
    schedules: tuple[dict, dict] | None = None,
) -> None:
    """After a checkpoint's optimizer and scheduler states were loaded: this run's settings and its schedule
    from the checkpoint's step on (the rate of that step: base x the schedule's factor, as LambdaLR computes
    it), the moments kept; what differed from the checkpoint's is said once, in one line. ``schedules``:
    the checkpoint's ``recorded_schedule`` and this run's (warmup, decay, clip, planned steps), which no
    optimizer state holds: each change named, and the first step's rate beside the one the checkpoint's
    schedule gave it, where they differ (a new warmup drops it and warms up again; a longer run raises it)."""
    groups, base_lrs = given
    scheduler, changed = opt.scheduler, {}
    old_base = opt.optimizer.param_groups[0].get("initial_lr")  # the checkpoint's peak (x lr_scale)
    for group, settings, base in zip(opt.optimizer.param_groups, groups, base_lrs, strict=True):
        was = {key: group.get(key) for key in settings} | {"lr": group.get("initial_lr")}
        for key, value in {**settings, "lr": base}.items():
            if was[key] is not None and was[key] != value and key not in changed:
                changed[key] = (was[key], value)
        group.update(settings)
        group["initial_lr"] = base
    scheduler.base_lrs = list(base_lrs)
    factors = [factor(scheduler.last_epoch) for factor in scheduler.lr_lambdas]
    for group, base, factor in zip(opt.optimizer.param_groups, base_lrs, factors, strict=True):
        group["lr"] = base * factor
    scheduler._last_lr = [group["lr"] for group in opt.optimizer.param_groups]
    if isinstance(scheduler, AppliedStepsLR):  # fp16, fused: the rates as the device tensors the kernel reads
        scheduler.place()
    saved, now = schedules if schedules is not None else ({}, {})
    changed |= {
        key: (saved[key], now[key])
        for key in SCHEDULE
        if key in saved and key in now and saved[key] != now[key]
    }
    if not changed:
        return
    said = ", ".join(f"{key} {_shown(old)} -> {_shown(new)}" for key, (old, new) in changed.items())
    log.warning(
        "%s was written with other optimizer settings: %s; this run's apply from its step %d on (the "
        "AdamW moments kept, the rate on this run's schedule)%s",
        folder,
        said,
        scheduler.last_epoch,
        _rate_said(saved, old_base, scheduler.last_epoch, float(scheduler._last_lr[0]))
        + (
            ""
            if "decay" in saved or not now
            else "; the checkpoint recorded no schedule settings (an "
            "earlier fastlm): warmup, decay, min_lr_ratio and grad_clip not compared"
        ),
    )


def _rate_said(saved: dict, old_base: float | None, step: int, rate: float) -> str:
    """The first resumed step's rate beside the one the checkpoint's recorded schedule gives it, where they
    differ; nothing where the checkpoint recorded no schedule."""
    try:
        old = old_base * LRSchedule(
            1.0, saved["total_steps"], saved["warmup_steps"], saved["decay"], saved["min_lr_ratio"]
        ).factor_at(step)
    except (KeyError, TypeError, ValueError):  # no record (an earlier fastlm), or one no schedule takes
        return ""
    if math.isclose(old, rate, rel_tol=1e-6):
        return ""
    return (
        f"; its first step trains at learning rate {rate:.4g}, where the checkpoint's schedule gave {old:.4g}"
    )


def _shown(value) -> str:
    if isinstance(value, list | tuple):  # betas
        return str(tuple(value))
    return f"{value:g}" if isinstance(value, float | int) else str(value)
