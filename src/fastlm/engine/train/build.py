"""The training run's set-up, kept apart from the loop that uses it so that ``loop.train`` reads top to bottom
like torchtitan's ``Trainer.train``: build the parts, run the steps, finish.

``settle_request`` checks what can be checked before anything is read or written (the attention path, the
batching an encoder-decoder model can use); ``build_training`` then makes, in this order: the model on the
device (sharded for FSDP2), the step plan, the optimizer (which casts bf16 weights, ``param_dtype``), the
model wrapped for DDP (its buckets in the dtype of the weights it reduces), the checkpointer and the
restore of a resumed run, the micro-batch stream from the resumed position, the runtime probe (precision
and compile ``auto`` on CPU, float8 ``auto`` where its rule allows it) and the attention switch of a
compiled model, the metrics, recorder, profiler and validation, then the early stopping and the time
budget. What the loop uses comes back as one ``TrainingParts``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from time import perf_counter

import numpy as np
import torch

from fastlm.engine.batching import (
    MicroBatches,
    Seq2SeqSides,
    StepPlan,
    StreamLayout,
    loader_settings,
    micro_batches,
    padding_multiple,
    say_untrained_answers,
    seq2seq_batching,
    step_plan,
    trained_samples,
)
from fastlm.engine.config import OptimizerParams, TrainParams
from fastlm.engine.data.token_dataset import TokenSequences
from fastlm.engine.distributed.parallel import Collectives, SingleProcess, gradient_sync, wrap_model
from fastlm.engine.evaluate.evaluation import EvalOptions, EvaluationReport, evaluate
from fastlm.engine.model.accumulation import FusedHead
from fastlm.engine.model.attention.choice import attention_path, attention_when_compiled
from fastlm.engine.model.attention.inputs import packed_inputs, to_device
from fastlm.engine.model.attention.kernels import VARLEN_ONLY
from fastlm.engine.model.attention.windows import packing_leak
from fastlm.engine.model.encoder_decoder import packing_unavailable, unwrapped
from fastlm.engine.model.lora import model_parameters, parameter_count
from fastlm.engine.model.noise import add_neftune
from fastlm.engine.observe.metrics import StepMetrics, device_peak_flops, flops_per_token
from fastlm.engine.observe.profiling import step_profiler
from fastlm.engine.observe.progress import Progress
from fastlm.engine.runtime.environment import Runtime
from fastlm.engine.runtime.float8 import apply_float8, float8_decision, float8_layers
from fastlm.engine.runtime.probe import CompileProbe, Float8Probe, probe_float8, probe_runtime
from fastlm.engine.runtime.regions import CompileClock, GraphCensus, cuda_graph_census
from fastlm.engine.runtime.remembered import RememberedChoices
from fastlm.engine.train.backoff import batching_record, resumed_batching
from fastlm.engine.train.early_stop import EarlyStopping
from fastlm.engine.train.master_weights import choose_param_dtype
from fastlm.engine.train.persistence import Checkpointer
from fastlm.engine.train.records import Callback, Recorder, step_contents
from fastlm.engine.train.schedule import asked_warmup
from fastlm.engine.train.state import TrainState
from fastlm.engine.train.step import Optimization, make_optimization
from fastlm.engine.train.time_limit import TimeLimit
from fastlm.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["TrainRequest", "TrainingParts", "build_training", "settle_request"]


@dataclass(frozen=True)
class TrainRequest:
    """``loop.train``'s arguments as one object (``train`` keeps its public signature); ``sides``:
    ``seq2seq_batching``'s arguments, set by ``settle_request``."""

    model: torch.nn.Module
    train_set: TokenSequences
    eval_set: TokenSequences | None
    params: TrainParams
    runtime: Runtime
    pad_id: int
    max_length: int
    attn: str
    callbacks: Sequence[Callback] = ()
    comm: Collectives = field(default_factory=SingleProcess)
    sides: Seq2SeqSides | None = None
    runtime_choices: Path | None = None  # the precisions measured before (engine.runtime.remembered)


@dataclass
class TrainingParts:
    """What the loop uses. ``params`` is the batching in force (an out-of-memory back-off halves it and swaps
    ``stream``); ``configured`` the parameters as given; ``runtime`` and ``attn`` as the probe settled them;
    ``model`` is what steps (wrapped, maybe compiled), ``raw_model`` what is saved and returned; ``validate``
    is None without a validation split."""

    params: TrainParams
    configured: TrainParams
    runtime: Runtime
    attn: str
    raw_model: torch.nn.Module
    model: torch.nn.Module
    opt: Optimization
    sync: Callable
    comm: Collectives
    state: TrainState
    checkpointer: Checkpointer
    layout: StreamLayout
    stream: MicroBatches
    plan: StepPlan  # the steps epoch by epoch (packed epochs hold slightly different micro-batch counts)
    steps_per_epoch: int  # the first epoch's
    total_steps: int
    metrics: StepMetrics
    recorder: Recorder
    profiler: object
    validate: Callable[[], dict] | None
    holds: dict
    budget: TimeLimit
    early: EarlyStopping | None
    started: float
    graphs_at_start: GraphCensus | None = None  # compile_mode reduce-overhead: the CUDA graphs before the run
    compile_clock: CompileClock = field(default_factory=CompileClock)  # every compile, the probes' included

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    @property
    def world(self) -> int:
        return self.comm.world_size

    @property
    def accumulation(self) -> int:
        return self.params.batching.gradient_accumulation_steps

    def position(self) -> dict:
        """Where the stream is, for a metric record (``MicroBatches.progress``)."""
        return self.stream.progress()


def settle_request(request: TrainRequest) -> TrainRequest:
    """``request`` checked before any data is read or anything written: an unknown attention implementation
    fails here, an encoder-decoder model on plain text is refused, and one whose family or attention path
    cannot keep packed samples apart batches ``length_grouped`` instead of ``packed``, said once. What the
    model is compiled in is the parameters' (``train.runtime.compile_scope`` / ``compile_mode``), whatever
    runtime the caller set up (``Runtime.compile_model`` reads it from the runtime)."""
    packed_inputs(request.attn)
    params, model = request.params, request.model
    request = replace(request, runtime=request.runtime.compiling_as(params.runtime))
    _check_attention_trains(request.attn, model, request.runtime.device)
    sides = seq2seq_batching(model, request.train_set, request.attn)  # None for a causal LM
    if sides is None:
        _refuse_data_without_targets(request.train_set)
    say_untrained_answers(model, request.train_set)
    why = None
    if params.batching.mode == "packed":
        if sides is not None and not sides.packing:
            why = packing_unavailable(model, request.attn) + " (each side padded to its own batch maximum)"
        elif sides is None:
            why = packing_leak(unwrapped(model).config)
    if why is not None:
        log.warning(
            "train.batching.mode packed is not available here: %s; batching length_grouped instead", why
        )
        params = params.model_copy(
            update={"batching": params.batching.model_copy(update={"mode": "length_grouped"})}
        )
    return replace(request, params=params, sides=sides)


def _refuse_data_without_targets(train_set) -> None:
    """One line for training data of a causal LM without a single target token (every sample one token
    long, or prompt tokens only): each step's loss would be undefined and nothing learnt."""
    if len(train_set.lengths) and train_set.num_target_tokens == 0:
        raise ConfigError(
            f"the training data has no target token: its {len(train_set.lengths):,} samples are each one "
            "token long (nothing after it to predict) or hold prompt tokens only, so no step would have a "
            "loss and the run would learn nothing.",
            fix="split data whose samples hold at least two tokens (a text and its EOS; a prompt and a "
            "response), then train again.",
        )


def _check_attention_trains(attn: str, model, device: torch.device) -> None:
    """One line for an attention path that cannot train ``model`` here: flex_attention has no CPU backward,
    and the varlen kernels take packed causal rows, which an encoder-decoder model never gets."""
    fix = "set train.model.attn_implementation: auto (or sdpa / eager)."
    if attn == "flex_attention" and device.type == "cpu":
        raise ConfigError(
            "train.model.attn_implementation: flex_attention cannot train on a CPU (torch has no CPU "
            "backward for it).",
            fix=fix,
        )
    if attn in VARLEN_ONLY and getattr(
        getattr(unwrapped(model), "config", None), "is_encoder_decoder", False
    ):
        raise ConfigError(
            f"train.model.attn_implementation: {attn} takes packed causal rows only; "
            f"{type(unwrapped(model)).__name__} is an encoder-decoder model, which packs its "
            "rows on sdpa or eager.",
            fix=fix,
        )


def build_training(request: TrainRequest, cleanup: ExitStack) -> TrainingParts:
    """The run's parts, a resumed run's state restored (see the module docstring for the order). ``cleanup``
    takes what must be put back when training ends (the attention path of a compiled model)."""
    started, comm, configured, device = perf_counter(), request.comm, request.params, request.runtime.device
    graphs = configured.runtime.compile_mode == "reduce-overhead"  # the summary says what they did
    graphs_at_start = cuda_graph_census(device) if graphs else None
    request = replace(request, model=request.model.to(device))  # the raw model: saved, returned
    raw_model = request.model
    if configured.model.neftune_noise_alpha:  # before any wrapping; taken off when training ends
        cleanup.callback(add_neftune(raw_model, configured.model.neftune_noise_alpha))
        log.info(
            "NEFTune: training on input embeddings with uniform noise of at most %g / sqrt(sample length x "
            "hidden size) (train.model.neftune_noise_alpha); evaluation without",
            configured.model.neftune_noise_alpha,
        )
    sharded = comm.world_size > 1 and configured.distributed.strategy == "fsdp"
    if configured.distributed.strategy == "fsdp" and not sharded:
        log.info(
            "train.distributed.strategy: fsdp in one process: nothing to shard, the model trains unsharded "
            "(as ddp would; its checkpoints resume in one process, under ddp or sharded under fsdp)"
        )
    wrapped, float8_choice = raw_model, None
    if sharded:  # FSDP2 before the optimizer, which is built on its DTensors; it casts its gathered weights
        # float8 layers first: a sharded layer keeps the modules it was given (engine/runtime/float8.py)
        float8_choice = apply_float8(
            raw_model,
            configured.runtime.float8,
            device,
            strategy="fsdp",
            row_length=configured.batching.fixed_row_length(),
        )
        weights = choose_param_dtype(
            configured.runtime.param_dtype,
            raw_model,
            autocast_dtype=request.runtime.autocast_dtype,
            world_size=comm.world_size,
            device=device,
            strategy=configured.distributed.strategy,
            adapters=configured.model.lora.enabled,
        )[0]
        wrapped = wrap_model(raw_model, comm, device=device, param_dtype=weights, **_wrapping(configured))
    layout = StreamLayout(
        request.pad_id,
        request.max_length,
        request.sides,
        loader_settings(configured, device, announce=comm.is_main),
        rank=comm.rank,
        world_size=comm.world_size,
    )
    plan = step_plan(request.train_set, configured, layout)  # each epoch's own steps
    steps_per_epoch, total_steps = plan.steps(0), plan.total_steps
    opt = make_optimization(
        raw_model,
        configured,
        request.runtime,
        total_steps,
        float8_measured_later=True,
        float8_choice=float8_choice,
        world_size=comm.world_size,
    )
    cleanup.callback(opt.release)  # bf16 weights: the run returns (or leaves, on an error) fp32 masters
    if not sharded:  # DDP over the weights the step trains: bf16 ones (cast above) reduce into their masters
        wrapped = wrap_model(raw_model, comm, device=device, **_wrapping(configured))
        if opt.masters is not None and wrapped is not raw_model:
            opt.masters.reduce_under(wrapped)
    checkpointer = Checkpointer(
        configured,
        model=raw_model,
        opt=opt,
        comm=comm,
        train_set=request.train_set,
        max_length=request.max_length,
        plan=plan,
        device=device,
    )
    state = checkpointer.restore()
    resumed_choice = dict(state.runtime_choice)  # the probes overwrite it with this run's choice
    params = resumed_batching(configured, state.batching, state.resumed_from)
    state.batching = batching_record(params, configured)
    stream = micro_batches(
        request.train_set,
        params,
        layout,
        epoch=state.epoch,
        batch=state.batch_in_epoch,
        configured=configured.batching.micro_batch_size,  # a resumed back-off cuts the configured batches
    )
    cleanup.callback(stream.close)  # its workers end with the run, a failed build's too
    # compiles from here on, the probes' (compile and float8 auto) included: apart from the step times
    compile_clock = cleanup.enter_context(CompileClock())
    runtime, attn, model = _probed_runtime(request, params, state, stream, wrapped, total_steps, cleanup)
    runtime = probe_float8(  # float8 auto: measured on the same first micro-batch, through the stepping model
        runtime,
        raw_model,
        stream.peek_step(params.batching.gradient_accumulation_steps, device, attn)[0]
        if state.step < total_steps
        else None,
        Float8Probe(
            params.runtime.float8 if not sharded else ("on" if float8_layers(raw_model) else "off"),
            params.distributed.strategy,
            applied=opt.float8_choice,
            row_length=params.batching.fixed_row_length(),
            stepping=model if comm.world_size == 1 else None,
            choices=_choices(request),
        ),
        world_size=comm.world_size,
        resumed=resumed_choice,
    )
    state.runtime_choice = {**state.runtime_choice, "float8": runtime.float8}  # a resumed run keeps it
    opt.float8_choice = runtime.float8_choice
    metrics = _step_metrics(
        raw_model,
        device,
        comm,
        total_steps=total_steps,
        max_length=request.max_length,
        compile_seconds=compile_clock,
        sides=(request.sides, request.train_set),
    )
    recorder = _recorder(
        state, metrics, raw_model, params, opt, request.callbacks, comm, total_steps=total_steps
    )
    profiler = step_profiler(params.profile, device, enabled=comm.is_main)
    validate = _validation(request, model, params=params, runtime=runtime, attn=attn, fused=opt.fused_head)
    lengths = request.train_set.lengths
    # the samples the ranks train of an epoch: several processes leave its last ``N mod processes`` out
    trained = trained_samples(
        request.train_set, params, layout, plan, configured=configured.batching.micro_batch_size
    )
    lengths = lengths if request.sides is None else request.sides.real_lengths(lengths)  # as the steps count
    holds = step_contents(
        lengths[trained],
        steps_per_epoch=steps_per_epoch,
        rows_per_step=(
            params.batching.micro_batch_size * params.batching.gradient_accumulation_steps * comm.world_size
        ),
    )
    holds["row_length"] = plan.row_length  # the packed rows' length, auto resolved (None: not packed)
    holds["pad_to_multiple_of"] = padding_multiple(params)  # what padded lengths round up to, auto resolved
    _log_start(params, total_steps, steps_per_epoch, comm.world_size, holds)
    if comm.is_main:
        _warn_whole_run_warmup(params.optimizer, total_steps)
        _say_unread_settings(params, steps_per_epoch)
    log.info("loss: %s", opt.fused_choice)
    budget = TimeLimit(params.max_minutes)  # train.max_minutes: a stop at a step boundary
    early = _early_stopping(params, state, total_steps)  # train.early_stopping (engine/train/early_stop.py)
    state.clock_start = perf_counter()
    metrics.start(
        elapsed_before_s=state.elapsed_before_s
    )  # a resumed run's clock goes on from its checkpoint
    return TrainingParts(
        params,
        configured,
        runtime,
        attn,
        raw_model,
        model,
        opt,
        gradient_sync(getattr(model, "_orig_mod", model)),
        comm,
        state,
        checkpointer,
        layout,
        stream,
        plan,
        steps_per_epoch,
        total_steps,
        metrics,
        recorder,
        profiler,
        validate,
        holds,
        budget,
        early,
        started,
        graphs_at_start,
        compile_clock,
    )


def _probed_runtime(
    request: TrainRequest,
    params: TrainParams,
    state: TrainState,
    stream: MicroBatches,
    wrapped: torch.nn.Module,
    total_steps: int,
    cleanup: ExitStack,
) -> tuple[Runtime, str, torch.nn.Module]:
    """The runtime the steps run with (``probe.probe_runtime`` on the first micro-batch, its choice kept in
    ``state``), the attention path they run on and the model that steps: the probe's compiled model where it
    kept one (compiled from the raw model: one process, nothing wrapped), else
    ``runtime.compile_model(wrapped)``."""
    raw_model, attn, device, world = (
        request.model,
        request.attn,
        request.runtime.device,
        request.comm.world_size,
    )
    accumulation = params.batching.gradient_accumulation_steps
    first = stream.peek_step(accumulation, device, attn)[0] if state.step < total_steps else None
    # A compiled model may train on another attention path (attention_when_compiled); the probe measures that.
    compiled_attn = (
        attention_when_compiled(attn, params.model.attn_implementation, device) if world == 1 else attn
    )
    compile_probe = CompileProbe(
        params.runtime.compile,
        micro_batches_left=(total_steps - state.step) * accumulation,
        seconds_left=None if params.max_minutes is None else params.max_minutes * 60.0,
        batch=(
            to_device(first, device, compiled_attn) if first is not None and compiled_attn != attn else None
        ),
        context=partial(attention_path, raw_model, compiled_attn),
        scope=params.runtime.compile_scope,
        mode=params.runtime.compile_mode,
        float8=_float8_may_train(params, raw_model, device),
    )
    runtime, probed = probe_runtime(
        request.runtime,
        params.runtime.precision,
        raw_model,
        first,
        world_size=world,
        resumed=state.runtime_choice,
        compile_probe=compile_probe,
        choices=_choices(request),
    )
    state.runtime_choice = probed.record()
    if runtime.compile and compiled_attn != attn:
        log.info(
            "attention %s -> %s: compiled on %s, the additive-mask path fuses (attention_when_compiled)",
            attn,
            compiled_attn,
            device.type,
        )
        cleanup.enter_context(attention_path(raw_model, compiled_attn))  # put back when training ends
        attn = compiled_attn
        stream.switch_attention(device, attn)
    model = (
        probed.compiled
        if probed.compiled is not None and wrapped is raw_model
        else runtime.compile_model(wrapped)
    )
    return runtime, attn, model


def _choices(request: TrainRequest) -> RememberedChoices | None:
    """Where the probes keep what they measured (``engine.runtime.remembered``): one process only (several
    follow the rules, each rank alike)."""
    if request.runtime_choices is None or request.comm.world_size > 1:
        return None
    return RememberedChoices(Path(request.runtime_choices))


def _float8_may_train(params: TrainParams, model: torch.nn.Module, device: torch.device) -> bool:
    """Whether float8 layers may train in this CUDA run (``float8: on``, or ``auto`` where its rule allows):
    compile ``auto`` then compiles, torchao's float8 casts fusing only compiled."""
    if device.type != "cuda":
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return float8_decision(
        params.runtime.float8,
        base,
        device,
        strategy=params.distributed.strategy,
        row_length=params.batching.fixed_row_length(),
    )[0]


def _validation(
    request: TrainRequest,
    model: torch.nn.Module,
    *,
    params: TrainParams,
    runtime: Runtime,
    attn: str,
    fused: FusedHead | None = None,
) -> Callable[[], dict] | None:
    """The validation metrics' function (``evaluation.evaluate``, loss only, ``train.eval_max_batches``
    batches); None without a validation split. FSDP's forward is collective: every rank evaluates the wrapped
    model in as many forwards (``EvalOptions.collective_forward``); DDP's is not needed to evaluate (the raw
    model). Either way the ranks evaluate the batches one process does, the remainder of an uneven split
    too. An evaluation that backed off to a
    smaller micro-batch (out of memory, ``train.batching.oom_backoff``) leaves it to the next ones
    (``_Validation``).

    The attention path: the steps' (``attn``) where the model evaluated is the compiled one (FSDP's wrapper,
    or ``compile_scope: layers``, the raw model's layers compiled in place: another path would compile them
    again). With ``compile_scope: model`` the raw model evaluates uncompiled, so it evaluates on the run's
    choice before the compiled switch (``request.attn``): the additive mask ``attention_when_compiled`` trains
    on pays only compiled; uncompiled it took 3.6x SDPA's time on rows of 2,048 (docs/benchmarks.md, "The
    compiled CPU step's regions").

    ``fused``: the steps' fused LM head (``Optimization.fused_head``): the validation's loss runs through it
    too (``EvalOptions.fused_head``), no ``[tokens x vocab]`` logits; under FSDP2 too: the root group (the
    head's) does not reshard after an evaluation forward either (``reshard_after_forward=False``), so the
    loss reads the whole weight, as the steps' does."""
    if request.eval_set is None:
        return None
    fsdp = params.distributed.strategy == "fsdp"
    options = EvalOptions(
        max_batches=params.eval_max_batches,
        comm=request.comm,
        collective_forward=fsdp,
        fused_head=fused,
    )
    evaluated = model if fsdp else request.model
    on = attn if fsdp or (runtime.compile and runtime.compile_scope == "layers") else request.attn
    return _Validation(
        partial(
            evaluate,
            evaluated,
            request.eval_set,
            params=params,
            runtime=runtime,
            pad_id=request.pad_id,
            max_length=request.max_length,
            attn=on,
        ),
        options,
        path=partial(attention_path, evaluated, on) if on != attn else nullcontext,
    )


class _Validation:
    """Training's validation: ``evaluate`` (all but its options bound) with ``options``; the micro-batch an
    evaluation finished with after an out-of-memory back-off is where the next one starts (the configured
    one would fail again first). ``path``: the attention path it evaluates on meanwhile (``_validation``)."""

    def __init__(
        self,
        run: Callable[..., EvaluationReport],
        options: EvalOptions,
        path: Callable[[], AbstractContextManager] = nullcontext,
    ) -> None:
        self.run, self.options, self.path = run, options, path

    def __call__(self) -> dict:
        with self.path():
            report = self.run(options=self.options)
        if report.micro_batch_size != self.options.micro_batch_size:
            self.options = replace(self.options, micro_batch_size=report.micro_batch_size)
        return report.metrics


def _wrapping(params: TrainParams) -> dict:
    """``distributed.wrap_model``'s settings from ``train.distributed``."""
    settings = params.distributed
    return {
        "strategy": settings.strategy,
        "find_unused_parameters": settings.find_unused_parameters,
        "bucket_cap_mb": settings.bucket_cap_mb,
    }


def _step_metrics(
    raw_model,
    device: torch.device,
    comm: Collectives,
    *,
    total_steps: int,
    max_length: int,
    compile_seconds: Callable[[], float],
    sides: tuple[Seq2SeqSides | None, TokenSequences] | None = None,
) -> StepMetrics:
    # The whole model's parameters on every strategy: FSDP2's DTensors report their global numel.
    n_params, config, peak = (
        model_parameters(raw_model),  # a QLoRA base's 4-bit weights unpacked
        raw_model.config.get_text_config(),  # a multimodal model's language model (Gemma 3 4B and up)
        device_peak_flops(device),
    )
    per_token = (
        encoder_decoder_flops_per_token(raw_model, *sides, seq_len=max_length)
        if sides is not None and sides[0] is not None
        else flops_per_token(n_params, config.num_hidden_layers, config.hidden_size, max_length)
    )
    return StepMetrics(
        device,
        total_steps=total_steps,
        peak_flops=peak * comm.world_size if peak else None,
        flops_per_token=per_token,
        reduce_loss_sum=comm.sum_device_ if comm.world_size > 1 else None,
        compile_seconds=compile_seconds,
    )


def encoder_decoder_flops_per_token(raw_model, sides: Seq2SeqSides, data: TokenSequences, *, seq_len: int):
    """An encoder-decoder's training FLOPs per real token (a step's real tokens are both sides'): an encoder
    token runs through the encoder stack (6 N_enc + 12 L_enc d S: ``metrics.flops_per_token``), a decoder
    token through the decoder stack, the LM head and its token table (6 N_dec + 12 (2 L_dec) d S: self- and
    cross-attention), weighted by the tokens each side of ``data``'s rows gets (``collators.seq2seq_sides``:
    the prompt and the tokenizer's tail; the decoder start, its head and the response)."""
    base = unwrapped(raw_model)
    encoder, decoder = base.get_encoder(), base.get_decoder()
    head = base.get_output_embeddings()  # its token table: the encoder's too where tied (BART, T5)
    on_decoder = {
        id(param) for param in (*decoder.parameters(), *(head.parameters() if head is not None else ()))
    }
    n_encoder = parameter_count(param for param in encoder.parameters() if id(param) not in on_decoder)
    n_decoder = model_parameters(raw_model) - n_encoder
    width = base.config.get_text_config().hidden_size
    per_encoder = flops_per_token(n_encoder, _stack_layers(encoder, base.config), width, seq_len)
    per_decoder = flops_per_token(n_decoder, 2 * _stack_layers(decoder, base.config), width, seq_len)
    prompts = np.asarray(data.prompt_lengths, dtype=np.int64)
    encoder_tokens = int(prompts.sum()) + len(sides.ends.tail) * len(data)
    decoder_tokens = int((data.lengths - prompts).sum()) + (1 + len(sides.ends.head)) * len(data)
    total = encoder_tokens + decoder_tokens
    return (encoder_tokens * per_encoder + decoder_tokens * per_decoder) / total if total else per_decoder


def _stack_layers(stack, config) -> int:
    """The transformer layers of an encoder or decoder stack (BART's ``layers``, T5's ``block``)."""
    layers = getattr(stack, "layers", None)
    if layers is None:
        layers = getattr(stack, "block", None)
    return len(layers) if layers is not None else config.get_text_config().num_hidden_layers


def _recorder(
    state: TrainState,
    metrics: StepMetrics,
    raw_model,
    params: TrainParams,
    opt: Optimization,
    callbacks: Sequence[Callback],
    comm: Collectives,
    *,
    total_steps: int,
) -> Recorder:
    """Rows, progress bar and callbacks on rank 0; the other ranks keep the same rows quietly. An fp16 run's
    rows are judged with its grad scaler's scale (an overflowed step it skipped is no stop)."""
    progress = Progress(
        total_steps,
        initial=state.step,
        quiet=params.quiet or not comm.is_main,
        label_smoothing=params.loss.label_smoothing,  # the step lines name the smoothed loss so
    )
    return Recorder(
        state,
        metrics,
        progress,
        callbacks if comm.is_main else (),
        log_every=params.log_every,
        total_steps=total_steps,
        main=comm.is_main,
        loss_scale=opt.scaler.get_scale if opt.scaler.is_enabled() else None,
        first_loss={
            # through an adapter's wrapper (LoRA on the embedding: peft's layer holds the Embedding)
            "len_vocab": raw_model.get_input_embeddings().weight.shape[0],
            "from_scratch": getattr(raw_model.config, "_name_or_path", "") == "",
        },
    )


def _early_stopping(params: TrainParams, state: TrainState, total_steps: int) -> EarlyStopping | None:
    """The run's early stopping (None: off); a warning where the run evaluates too few times for it to act:
    the first evaluation sets the best and ``patience`` more can end the run, before its last step only.

    Off in a run resumed from a checkpoint that holds early stopping's record: the record is set aside, said
    once (this run's evaluations and weights are none of its count, and its best checkpoint is no longer
    kept), so its checkpoints carry none and a later run that turns early stopping on again counts from its
    own first evaluation, as one turning it on for the first time does."""
    settings = params.early_stopping
    if settings.patience is None:
        if state.early_stopping:
            record, state.early_stopping = state.early_stopping, {}
            best = record.get("best_step")
            log.info(
                "train.early_stopping is off for this run: the early-stopping record of %s (%s) is set "
                "aside, and its best checkpoint no longer kept past train.keep_last; the model is the last "
                "step's. Turned on again in a later run, early stopping counts from that run's first "
                "evaluation.",
                state.resumed_from,
                f"best step {best}" if best is not None else "no best yet",
            )
        return None
    every = params.eval_every or total_steps
    evaluations = total_steps // every + (1 if total_steps % every else 0)
    if evaluations <= settings.patience + 1:
        log.warning(
            "train.early_stopping cannot stop this run: it has %d evaluation%s (train.eval_every %s over %d "
            "steps) and stops only after %d more without an improvement, before the last; lower "
            "train.eval_every or the patience",
            evaluations,
            "" if evaluations == 1 else "s",
            params.eval_every,
            total_steps,
            settings.patience,
        )
    early = EarlyStopping.from_record(
        state.early_stopping,
        patience=settings.patience,
        min_delta=settings.min_delta,
        evaluations=state.eval_history,
    )
    counted = state.early_stopping.get("min_delta")
    if counted is not None and counted != settings.min_delta:  # said: the stop (or not) it decides
        log.info(
            "train.early_stopping.min_delta %g -> %g: the %d evaluations so far counted again under it, %d "
            "in a row without an improvement (was %s)",
            counted,
            settings.min_delta,
            len(state.eval_history),
            early.bad_evals,
            state.early_stopping.get("bad_evals"),
        )
    return early


def _warn_whole_run_warmup(settings: OptimizerParams, total_steps: int) -> None:
    """One warning where the warmup (``train.optimizer.warmup_steps``, or ``warmup_ratio``'s ceil(ratio x the
    run's steps)) is not below the run's steps: the schedule cuts the warmup to the run's steps
    (``schedule.run_schedule``), so the rate reaches ``lr`` at the last step and a decay asked for never
    starts; a constant rate's warmup is cut short."""
    warmup, decay = asked_warmup(settings, total_steps), settings.decay
    if warmup < total_steps or (decay == "constant" and warmup == total_steps):
        return
    what = (
        f"warms up over {total_steps} steps, not {warmup}"
        if decay == "constant"
        else f"rises to train.optimizer.lr at its last step and the {decay} decay never starts"
    )
    ratio = settings.warmup_ratio
    asked, fix = (
        (
            f"train.optimizer.warmup_steps {warmup} is",
            f"warmup_steps below {total_steps} (a tenth of the steps is usual: {max(1, total_steps // 10)})",
        )
        if ratio is None
        else (
            f"train.optimizer.warmup_ratio {ratio:g} gives {warmup} warmup steps,",
            f"warmup_ratio at most {math.floor(1000 * (total_steps - 1) / total_steps) / 1000:g} "
            "(0.1 is usual)",
        )
    )
    log.warning(
        "%s not below this run's %d optimizer steps: the rate %s. Set %s for the schedule asked for.",
        asked,
        total_steps,
        what,
        fix,
    )


def _say_unread_settings(params: TrainParams, steps_per_epoch: int) -> None:
    """One warning naming the train settings changed from their defaults that this run never reads, and why
    (as the split says of its own): ``train.epochs`` beside ``train.max_steps``, which sets the run's length,
    and ``train.early_stopping.min_delta`` with early stopping off."""
    defaults = TrainParams()
    unread = []
    if params.max_steps is not None and params.epochs != defaults.epochs:
        unread.append(
            f"train.epochs = {params.epochs:g} (train.max_steps = {params.max_steps} sets the run's length: "
            f"{params.max_steps} optimizer steps, about {params.max_steps / steps_per_epoch:.3g} epochs of "
            f"{steps_per_epoch} steps; set train.max_steps: null to train {params.epochs:g} epochs)"
        )
    stopping = params.early_stopping
    if stopping.patience is None and stopping.min_delta != defaults.early_stopping.min_delta:
        unread.append(
            f"train.early_stopping.min_delta = {stopping.min_delta:g} (early stopping is off: "
            "train.early_stopping.patience is null; set it to stop after that many evaluations without an "
            "improvement of more than min_delta)"
        )
    if unread:
        log.warning("train settings that change nothing for this run: %s", "; ".join(unread))


def _log_start(params: TrainParams, total_steps: int, steps_per_epoch: int, world: int, holds: dict) -> None:
    batching = params.batching
    log.info(
        "Training %d steps (%d per epoch); each optimizer step holds %d rows (%d micro-batch x %d "
        "accumulation x %d process%s), ~%s samples and ~%s real tokens on average; batching %s",
        total_steps,
        steps_per_epoch,
        holds["rows_per_step"],
        batching.micro_batch_size,
        batching.gradient_accumulation_steps,
        world,
        "es" if world > 1 else "",
        f"{holds['samples_per_step']:,.0f}",
        f"{holds['tokens_per_step']:,.0f}",
        batching.mode
        + (
            f", rows of {holds['row_length']} tokens"
            + (" (row_length auto)" if batching.row_length == "auto" else "")
            if holds["row_length"] is not None
            else ""
        ),
    )
