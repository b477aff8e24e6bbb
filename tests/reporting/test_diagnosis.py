"""Each diagnosis rule on synthetic histories: triggers when it should, stays quiet when it should not."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from fastlm.reporting.diagnosis import (
    COMPILE_BOUND,
    COMPUTE_BOUND,
    EVAL_BOUND,
    EVAL_BOUND_SHARE,
    HOST_SYNC_BOUND,
    INPUT_BOUND,
    MEMORY_SATURATED,
    MIN_TIMED_STEPS,
    NOT_JUDGED,
    PADDING_BOUND,
    RECOMPILE_LIMIT,
    Finding,
    diagnose,
    epoch_eta,
    format_duration,
)
from fastlm.reporting.summaries import efficiency_summary
from tests.support import reporting

KINDS = [
    INPUT_BOUND,
    PADDING_BOUND,
    HOST_SYNC_BOUND,
    MEMORY_SATURATED,
    EVAL_BOUND,
    COMPILE_BOUND,
    RECOMPILE_LIMIT,
    COMPUTE_BOUND,
]


def make_history(n: int, **columns) -> pd.DataFrame:
    """``n`` healthy logging rows (step 1 alone first) at a flat loss; ``columns`` override a value or give a
    list."""
    return reporting.make_history(n, **{"loss": 3.0, "tokens_per_s": 1100.0, **columns})


def cpu(**extra) -> dict:
    return {
        "batching": "dynamic",
        "dataloader_workers": 2,
        "device_memory_mb": 16000.0,
        "runtime": {"device": "cpu", "num_threads": 8},
        **extra,
    }


def cuda(**extra) -> dict:
    return {
        "batching": "packed",
        "dataloader_workers": 2,
        "device_memory_mb": 80000.0,
        "runtime": {"device": "cuda:0", "device_name": "H100", "precision": "bf16"},
        **extra,
    }


def by_kind(findings: list[Finding]) -> dict[str, Finding]:
    return {finding.kind: finding for finding in findings}


def triggered(findings: list[Finding]) -> set[str]:
    return {finding.kind for finding in findings if finding.triggered}


def test_every_rule_reports_a_frozen_finding():
    findings = diagnose(cpu(), make_history(6))
    assert [finding.kind for finding in findings] == KINDS
    with pytest.raises(dataclasses.FrozenInstanceError):
        findings[0].triggered = True  # type: ignore[misc]


def test_input_bound_triggers_with_the_figure_and_doubled_workers():
    finding = by_kind(diagnose(cpu(), make_history(6, data_wait_share=0.34)))[INPUT_BOUND]
    assert finding.triggered and finding.figure == "34 %"
    assert "34 %" in finding.message and "from 2 to 4" in finding.advice
    assert "pin_memory" not in finding.advice  # CPU run


def test_input_bound_quiet_on_low_data_wait():
    finding = by_kind(diagnose(cpu(), make_history(6, data_wait_share=0.01)))[INPUT_BOUND]
    assert not finding.triggered and finding.figure == "1 %"


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        (0, "from 0 (loading in the training process) to 2"),
        (1, "from 1 to 2"),
        (4, "from 4 to 8"),
    ],
)
def test_input_bound_worker_advice(workers, expected):
    finding = by_kind(diagnose(cpu(dataloader_workers=workers), make_history(4, data_wait_share=0.5)))[
        INPUT_BOUND
    ]
    assert expected in finding.advice


def test_input_bound_on_cuda_mentions_pin_memory_and_prefetch():
    finding = by_kind(diagnose(cuda(), make_history(4, data_wait_share=0.3, mfu=0.4)))[INPUT_BOUND]
    assert finding.triggered and "pin_memory" in finding.advice and "prefetch" in finding.advice


def test_input_bound_ignores_the_warm_up_row():
    history = make_history(5, data_wait_share=[0.9, 0.01, 0.01, 0.01, 0.01])
    assert INPUT_BOUND not in triggered(diagnose(cpu(), history))


def test_padding_bound_names_the_current_mode():
    finding = by_kind(diagnose(cpu(), make_history(6, padding_efficiency=0.6)))[PADDING_BOUND]
    assert finding.triggered and finding.figure == "60 %"
    assert "switch train.batching.mode from dynamic to packed (or length_grouped)" in finding.advice
    assert "kedro run --pipeline=tune" in finding.advice  # which of the two is faster: measured
    assert not by_kind(diagnose(cpu(), make_history(6, padding_efficiency=0.85)))[PADDING_BOUND].triggered


def test_a_packed_runs_padding_advice_follows_what_padded_it():
    """Packed rows pad where a row is not filled, by the multiple lengths round up to, and, for an
    encoder-decoder, on the shorter side of each pair (rows are packed by the longer). Was: "lower
    train.batching.pad_to_multiple_of" for every packed run, one already at 1 (CPU's auto) included, and
    for an encoder-decoder's."""
    history = make_history(6, padding_efficiency=0.6)

    def advice(**summary) -> str:
        finding = by_kind(diagnose(cpu(batching="packed", **summary), history))[PADDING_BOUND]
        assert finding.triggered
        return finding.advice

    assert "lower train.batching.pad_to_multiple_of (8 now)" in advice(pad_to_multiple_of=8)
    one = advice(pad_to_multiple_of=1)
    assert "pad_to_multiple_of" not in one and "train.batching.row_length" in one, one
    pairs = advice(pad_to_multiple_of=1, encoder_decoder=True)
    assert "pad_to_multiple_of" not in pairs and "shorter side" in pairs, pairs
    assert "pad_to_multiple_of" in advice()  # a summary without the figure (an older run's): as before


def test_compute_bound_only_when_nothing_else_triggers():
    healthy = diagnose(cpu(), make_history(6))
    assert triggered(healthy) == {COMPUTE_BOUND}
    finding = by_kind(healthy)[COMPUTE_BOUND]
    assert finding.message == "the run is compute-bound: 1,000 real tokens/s on 8 CPU threads"
    assert "GPU" in finding.advice
    slow_input = diagnose(cpu(), make_history(6, data_wait_share=0.34))
    assert triggered(slow_input) == {INPUT_BOUND}
    assert INPUT_BOUND in by_kind(slow_input)[COMPUTE_BOUND].message


def test_too_few_timed_steps_conclude_nothing():
    """A run of two steps (``train.max_steps=2``) has one timed step after the warm-up: no verdict from it,
    and the message says how long a run is needed."""
    short = diagnose(cpu(), make_history(2, step=[1, 2]))
    assert triggered(short) == set()
    finding = by_kind(short)[COMPUTE_BOUND]
    assert "1 timed step" in finding.message
    assert f"train.max_steps >= {MIN_TIMED_STEPS + 1}" in finding.message
    from fastlm.reporting.report_document import check_line

    line = check_line(dataclasses.asdict(finding))  # said not judged, not "not compute-bound"
    assert line.startswith("? throughput") and line.endswith(f": {finding.message}")
    enough = make_history(2, step=[1, MIN_TIMED_STEPS + 1])
    assert triggered(diagnose(cpu(), enough)) == {COMPUTE_BOUND}


def short_and_long(n: int, **columns) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The same ``n`` logging rows over fewer than MIN_TIMED_STEPS timed steps (one row per step of a run too
    short to judge) and over enough of them (the rows ten steps apart)."""
    short_steps = list(range(1, n + 1))
    assert short_steps[-1] - 1 < MIN_TIMED_STEPS
    return make_history(n, step=short_steps, **columns), make_history(n, **columns)


def test_too_few_timed_steps_judge_no_steady_state_rule():
    """A run of ``train.max_steps=2..5`` has too few timed steps for any verdict from step timing: the data
    wait, the host stalls, the step time rising under full memory, the evaluations' share of the wall time
    and the epoch ETA are said not judged; the padding efficiency (token counts, no timing) and a memory peak
    below the threshold (no timing needed) are judged; the same rows over a long run judge as before."""
    wait_short, wait_long = short_and_long(4, data_wait_share=0.34, padding_efficiency=0.5)
    wall = {"wall_time_s": 10.0, "outside_steps_s": 6.0}
    for history, judged in ((wait_short, False), (wait_long, True)):
        findings = by_kind(diagnose(cpu(**wall), history))
        for kind in (INPUT_BOUND, EVAL_BOUND):
            assert findings[kind].triggered is judged, (kind, findings[kind])
            assert findings[kind].message.startswith(NOT_JUDGED) is not judged, (kind, findings[kind])
        assert findings[PADDING_BOUND].triggered  # real / computed tokens: judged from any step
    spike_short, spike_long = short_and_long(4, step_time_s=0.1, step_time_max_s=0.5, mfu=0.4)
    assert not by_kind(diagnose(cuda(), spike_short))[HOST_SYNC_BOUND].triggered
    assert by_kind(diagnose(cuda(), spike_short))[HOST_SYNC_BOUND].message.startswith(NOT_JUDGED)
    assert by_kind(diagnose(cuda(), spike_long))[HOST_SYNC_BOUND].triggered
    rising = [1.0, 0.10, 0.12, 0.14]
    full = cpu(device_memory_mb=1000.0)
    memory_short, memory_long = short_and_long(4, peak_memory_mb=950.0, step_time_s=rising)
    assert by_kind(diagnose(full, memory_short))[MEMORY_SATURATED].message.startswith(NOT_JUDGED)
    assert by_kind(diagnose(full, memory_long))[MEMORY_SATURATED].triggered
    roomy_short, _ = short_and_long(4, peak_memory_mb=500.0, step_time_s=rising)
    roomy = by_kind(diagnose(full, roomy_short))[MEMORY_SATURATED]
    assert not roomy.triggered and not roomy.message.startswith(NOT_JUDGED)  # below the threshold: judged
    tokens = {"train_tokens": 4_000_000}
    short_eta, long_eta = epoch_eta(tokens, wait_short), epoch_eta(tokens, wait_long)
    assert short_eta["seconds"] is None and short_eta["human"] is None
    assert short_eta["not_judged"].startswith(NOT_JUDGED)
    assert long_eta["not_judged"] is None
    assert long_eta["seconds"] == pytest.approx(tokens["train_tokens"] / long_eta["real_tokens_per_s"])
    from fastlm.reporting.report_document import check_line

    line = check_line(dataclasses.asdict(by_kind(diagnose(cpu(), wait_short))[INPUT_BOUND]))
    assert line.startswith("? data wait 34 %: " + NOT_JUDGED)


def test_compute_bound_on_cuda_reports_mfu():
    findings = diagnose(cuda(), make_history(6, mfu=0.45))
    assert triggered(findings) == {COMPUTE_BOUND}
    finding = by_kind(findings)[COMPUTE_BOUND]
    assert "at MFU 45 %" in finding.message


def test_evaluations_and_saves_taking_most_of_the_wall_time_are_the_limit_not_the_math():
    # a CPU run with train.eval_every=1: 14.4 s of its 20.8 s went to the validations between steps, whose
    # own steps ran at 7,947 real tokens/s; the windows' wall clock (1,635 real tokens/s) holds them
    wall, outside, steady = 20.8, 14.4, 7947.0
    summary = cpu(wall_time_s=wall, outside_steps_s=outside, steady_real_tokens_per_s=steady)
    findings = diagnose(summary, make_history(4))
    assert triggered(findings) == {EVAL_BOUND}
    finding = by_kind(findings)[EVAL_BOUND]
    assert finding.figure == f"{outside / wall * 100:.0f} %"
    assert f"{outside:.1f} s" in finding.message and f"{wall:.1f} s" in finding.message
    assert f"{steady:,.0f} real tokens/s" in finding.message
    assert "train.eval_every" in finding.advice and "train.save_every" in finding.advice
    assert EVAL_BOUND in by_kind(findings)[COMPUTE_BOUND].message
    # the default cadence's final validation and save: a small share, the math is the limit
    quiet_share = EVAL_BOUND_SHARE / 4
    quiet = diagnose(cpu(wall_time_s=wall, outside_steps_s=wall * quiet_share), make_history(4))
    assert triggered(quiet) == {COMPUTE_BOUND}
    assert by_kind(quiet)[EVAL_BOUND].figure == f"{quiet_share * 100:.0f} %"
    # a resumed run's outside time is its last process's, its wall time the whole run's: not compared
    resumed = cpu(wall_time_s=wall, outside_steps_s=outside, resumed_from_step=40)
    assert not by_kind(diagnose(resumed, make_history(4)))[EVAL_BOUND].triggered


LEVERS_ON = {
    "runtime": {
        "device": "cuda:0",
        "device_name": "H100",
        "precision": "bf16",
        "compile": True,
        "float8_choice": "float8 auto, measured on the first micro-batch: fp8 0.110 s vs bf16 0.100 s "
        "(0.91x; float8 needs 1.1x)",
    },
    "liger": "liger kernels on the llama model: rope, rms_norm, swiglu (train.model.liger: auto)",
    "param_dtype": "bf16 weights, fp32 masters in the optimizer (param_dtype auto)",
    "peak_memory_mb": 70000.0,
}


def test_compute_bound_on_cuda_names_only_the_speed_levers_this_run_left_unused():
    """The advice of a compute-bound GPU run comes from its own decisions: nothing it already had, each lever
    it left off where its summary says so (a missing key says nothing)."""
    history = make_history(6, mfu=0.45)

    def advice(runtime: dict | None = None, **extra) -> str:
        summary = {**LEVERS_ON, "runtime": {**LEVERS_ON["runtime"], **(runtime or {})}, **extra}
        return by_kind(diagnose(cuda(**summary), history))[COMPUTE_BOUND].advice

    everything = advice()
    for named in ("train.runtime.", "pip install", "micro_batch_size", "param_dtype"):
        assert named not in everything, everything
    assert "no speed lever left unused" in everything
    assert "train.runtime.precision: bf16" in advice({"precision": "fp32"})
    assert "train.runtime.precision: bf16" in advice({"precision": "fp16"})  # where the GPU has it: said
    assert "train.runtime.compile: true" in advice({"compile": False})
    float8_missing = "float8 off (auto): torchao is not installed (`pip install torchao`)"
    assert "pip install torchao" in advice({"float8_choice": float8_missing})
    narrow = (
        "float8 off (auto): hidden size 1536 < 2048 (the float8 casts cost more than the faster matmuls save)"
    )
    assert "torchao" not in advice({"float8_choice": narrow})  # the rule's, not the package's
    liger_missing = "liger kernels off (auto: liger-kernel is not installed (`pip install liger-kernel`))"
    assert "pip install liger-kernel" in advice(liger=liger_missing)
    assert "liger-kernel" not in advice(liger="liger kernels off (train.model.liger: off)")  # user's choice
    roomy = advice(peak_memory_mb=20000.0)
    assert "micro_batch_size" in roomy and "25 % of 80,000 MB" in roomy and "--pipeline=tune" in roomy
    fp32 = advice(param_dtype="fp32 weights under autocast (train.runtime.param_dtype: fp32)")
    assert "train.runtime.param_dtype: auto" in fp32


def test_compute_bound_on_cuda_names_bf16_weights_where_the_run_kept_fp32_ones():
    """A GPU full fine-tune that ran autocast over fp32 weights (param_dtype fp32, or auto under DDP before
    DDP had bf16 weights) is told of bf16 weights with fp32 masters; a run that had them, or LoRA (its base is
    bf16 already), is not."""
    fp32 = "fp32 weights under autocast (train.runtime.param_dtype: fp32)"
    ddp = "fp32 weights under autocast (param_dtype auto: DDP reduces gradients in the weights' dtype ...)"
    bf16 = "bf16 weights, fp32 masters in the optimizer (param_dtype auto)"
    lora = "fp32 weights under autocast (param_dtype auto: some weights are frozen (LoRA ...))"
    history = make_history(6, mfu=0.45)

    def advice(choice: str) -> str:
        return by_kind(diagnose({**cuda(), "param_dtype": choice}, history))[COMPUTE_BOUND].advice

    assert "train.runtime.param_dtype: auto" in advice(fp32) and "fp32 residual stream" in advice(fp32)
    assert "train.runtime.param_dtype: auto" in advice(ddp)  # auto takes them under DDP now
    assert "param_dtype" not in advice(bf16) and "param_dtype" not in advice(lora)


def test_host_sync_triggers_on_cuda_step_time_spikes():
    history = make_history(6, step_time_s=0.1, step_time_max_s=0.5, mfu=0.4)
    finding = by_kind(diagnose(cuda(), history))[HOST_SYNC_BOUND]
    assert finding.triggered and "5.0x" in finding.figure
    assert "log_every" in finding.advice and ".item()" in finding.advice
    assert COMPUTE_BOUND not in triggered(diagnose(cuda(), history))


def test_host_sync_advice_no_longer_sends_a_liger_head_run_to_another_kernel():
    """liger-kernel's own fused linear cross-entropy read back three times per micro-batch (45 syncs in 15
    steps of the H100's LoRA run, docs/gpu-runs/2026-11-27-h100-gpu_speed_lora.log) and the advice told such
    a run to take fastlm's kernel. The head now runs liger's kernel in fastlm's loop, which reads back
    nothing (tests/engine/model/test_liger.py): the advice names no head kernel."""
    history = make_history(6, step_time_s=0.1, step_time_max_s=0.5, mfu=0.4)
    liger = {
        **cuda(),
        "fused_linear": True,
        "fused_linear_choice": "fused LM head + loss: no [tokens x 128,256] logits (train.loss.fused_linear: "
        "auto), liger-kernel's cross-entropy kernel in fastlm's chunk loop (train.loss.fused_linear_kernel: "
        "auto)",
    }
    finding = by_kind(diagnose(liger, history))[HOST_SYNC_BOUND]
    assert finding.triggered and "fused_linear_kernel" not in finding.advice and ".item()" in finding.advice


def test_host_sync_triggers_on_low_mfu_with_low_wait_and_padding():
    assert HOST_SYNC_BOUND in triggered(diagnose(cuda(), make_history(6, mfu=0.05)))
    # padding or input would explain the low MFU instead
    assert HOST_SYNC_BOUND not in triggered(
        diagnose(cuda(), make_history(6, mfu=0.05, padding_efficiency=0.7))
    )
    assert HOST_SYNC_BOUND not in triggered(diagnose(cuda(), make_history(6, mfu=0.05, data_wait_share=0.3)))


def test_host_sync_never_on_cpu():
    history = make_history(6, step_time_s=0.1, step_time_max_s=0.5, mfu=0.05)
    finding = by_kind(diagnose(cpu(), history))[HOST_SYNC_BOUND]
    assert not finding.triggered and "CUDA only" in finding.message


def test_host_sync_quiet_on_a_healthy_cuda_run():
    assert not by_kind(diagnose(cuda(), make_history(6, mfu=0.4)))[HOST_SYNC_BOUND].triggered


RISING = [1.0, 0.10, 0.10, 0.11, 0.12, 0.13, 0.14]  # warm-up, then 0.10 -> 0.135 (x1.35)


def test_memory_saturated_needs_full_memory_and_rising_step_time():
    summary = cpu(device_memory_mb=1000.0)
    both = by_kind(diagnose(summary, make_history(7, peak_memory_mb=950.0, step_time_s=RISING)))[
        MEMORY_SATURATED
    ]
    assert both.triggered and both.figure.startswith("95 %")
    assert "kedro run --pipeline=tune" in both.advice and "gradient_checkpointing" in both.advice
    # each parameter by its full name, as a user writes it in --params or the parameters file
    assert "lower train.batching.micro_batch_size" in both.advice
    assert "raise train.batching.gradient_accumulation_steps" in both.advice
    memory_only = diagnose(summary, make_history(7, peak_memory_mb=950.0))
    assert MEMORY_SATURATED not in triggered(memory_only)
    assert "does not rise" in by_kind(memory_only)[MEMORY_SATURATED].message
    rising_only = diagnose(summary, make_history(7, peak_memory_mb=500.0, step_time_s=RISING))
    assert MEMORY_SATURATED not in triggered(rising_only)


def test_full_memory_over_too_few_logging_windows_to_see_a_rise_does_not_say_step_time_does_not_rise():
    """The rise is the last third of the timed logging windows against the first: two windows (20 steps at
    train.log_every 10: steps 2-10 and 11-20) have no third. Full memory there is not judged (the report's
    "?" line), with the fix (a lower train.log_every). Was: "peak memory is 95 % of 1,000 MB, but step time
    does not rise", a rise nobody measured."""
    from fastlm.reporting.report_document import check_line

    summary = cpu(device_memory_mb=1000.0)
    history = make_history(3, step=[1, 10, 20], peak_memory_mb=950.0, step_time_s=[0.1, 0.1, 0.4])
    finding = by_kind(diagnose(summary, history))[MEMORY_SATURATED]
    assert not finding.triggered and "does not rise" not in finding.message
    assert finding.message.startswith(f"{NOT_JUDGED}: peak memory is 95 % of 1,000 MB")
    assert "(2 here: a lower train.log_every gives more)" in finding.message
    assert check_line(dataclasses.asdict(finding)).startswith("? peak memory 95 % of 1,000 MB: ")


def test_memory_saturated_names_the_memory_levers_this_run_left_unused():
    """The run's own lever decisions (train_summary.json): only the levers it did not use are advised, the
    next checkpointing policy after the one it ran, an 8-bit optimizer only on CUDA."""
    history = make_history(7, peak_memory_mb=76000.0, step_time_s=RISING)
    plain = cuda(
        fused_linear=False,
        fused_linear_choice="plain LM head (train.loss.fused_linear: false)",
        gradient_checkpointing="off",
        optimizer="adamw",
    )
    advice = by_kind(diagnose(plain, history))[MEMORY_SATURATED].advice
    assert "train.loss.fused_linear: true" in advice
    assert "gradient_checkpointing: selective" in advice and "adamw_8bit" in advice
    used = cuda(
        fused_linear=True,
        fused_linear_choice="fused LM head + loss: no [tokens x 128,256] logits",
        gradient_checkpointing="selective",
        optimizer="paged_adamw_8bit",
    )
    advice = by_kind(diagnose(used, history))[MEMORY_SATURATED].advice
    assert "fused_linear" not in advice and "adamw_8bit" not in advice
    assert "gradient_checkpointing: full" in advice and "gradient_checkpointing: selective" not in advice
    structural = cuda(
        fused_linear=False,
        fused_linear_choice="plain LM head: an encoder-decoder model (its head adds a bias or a scale)",
        gradient_checkpointing="full",
        optimizer="adamw",
    )
    advice = by_kind(diagnose(structural, history))[MEMORY_SATURATED].advice
    assert "fused_linear" not in advice and "gradient_checkpointing" not in advice  # nothing more to turn on
    on_cpu = by_kind(
        diagnose(
            cpu(device_memory_mb=1000.0, optimizer="adamw"),
            make_history(7, peak_memory_mb=950.0, step_time_s=RISING),
        )
    )[MEMORY_SATURATED].advice
    assert "adamw_8bit" not in on_cpu  # bitsandbytes' optimizers: CUDA only


def test_memory_saturated_names_fsdp_for_a_multi_process_ddp_run():
    """Several DDP processes each hold the whole model, its gradients and AdamW states (and, with bf16
    weights, DDP's bf16 buckets beside the fp32 masters' gradients): FSDP2 shards them. Not advised to one
    process, nor to a run already sharded."""
    history = make_history(7, peak_memory_mb=76000.0, step_time_s=RISING)
    ddp = cuda(world_size=4, distributed_strategy="ddp")
    advice = by_kind(diagnose(ddp, history))[MEMORY_SATURATED].advice
    assert "train.distributed.strategy: fsdp" in advice and "4 processes" in advice
    for summary in (
        cuda(world_size=1, distributed_strategy="ddp"),
        cuda(world_size=4, distributed_strategy="fsdp"),
    ):
        assert "strategy: fsdp" not in by_kind(diagnose(summary, history))[MEMORY_SATURATED].advice


def test_memory_saturated_names_updates_in_the_backward_where_the_run_could_take_them():
    """A full fine-tune whose AdamW updates fp32 masters of bf16 weights, or FSDP2's shards, can update each
    weight in the backward and free its gradient (train.optimizer.in_backward); not a run that did, not LoRA
    (its adapters' gradients are small), not an 8-bit optimizer, not fp32 weights under autocast."""
    history = make_history(7, peak_memory_mb=76000.0, step_time_s=RISING)
    masters = "bf16 weights, fp32 masters in the optimizer (param_dtype auto)"

    def advice(**extra) -> str:
        summary = cuda(**{"optimizer": "adamw", "param_dtype": masters, "lora": False, **extra})
        return by_kind(diagnose(summary, history))[MEMORY_SATURATED].advice

    assert "train.optimizer.in_backward: true" in advice() and "grad_clip: null" in advice()
    fsdp = "fp32 weights under autocast (...); FSDP2 gathers the weights in its shards' dtype"
    assert "in_backward" in advice(param_dtype=fsdp, distributed_strategy="fsdp", world_size=2)
    for other in (
        {"param_dtype": masters + "; each master updated in the backward (train.optimizer.in_backward)"},
        {"lora": True},
        {"optimizer": "adamw_8bit"},
        {"param_dtype": "fp32 weights under autocast (train.runtime.param_dtype: fp32)"},
    ):
        assert "in_backward" not in advice(**other), other


def test_missing_keys_and_columns_are_tolerated():
    findings = diagnose({}, make_history(4)[["step", "loss"]])
    assert [finding.kind for finding in findings] == KINDS
    assert triggered(findings) == {COMPUTE_BOUND}
    assert by_kind(findings)[INPUT_BOUND].figure == "n/a"
    assert [finding.kind for finding in diagnose({}, pd.DataFrame())] == KINDS
    # no history: the summary's figure, judged over the summary's steps
    finding = by_kind(diagnose({"data_wait_share": 0.5, "steps_trained": 10}, pd.DataFrame()))[INPUT_BOUND]
    assert finding.triggered and "num_workers" in finding.advice
    unknown = by_kind(diagnose({"data_wait_share": 0.5}, pd.DataFrame()))[INPUT_BOUND]
    assert not unknown.triggered and unknown.message.startswith(NOT_JUDGED)


def test_epoch_eta_is_train_tokens_over_real_tokens_per_s():
    history = make_history(5, real_tokens_per_s=[1.0, 1000.0, 1000.0, 1000.0, 1000.0])
    eta = epoch_eta({"train_tokens": 4_320_000}, history)
    assert eta["seconds"] == pytest.approx(4320.0) and eta["human"] == "1 h 12 min"
    assert eta["real_tokens_per_s"] == pytest.approx(1000.0) and eta["train_tokens"] == 4_320_000


def test_epoch_eta_unknown_fields_are_none():
    assert epoch_eta({}, make_history(3)) == {
        "seconds": None,
        "human": None,
        "train_tokens": None,
        "real_tokens_per_s": pytest.approx(1000.0),
        "not_judged": None,
    }
    assert epoch_eta({"train_tokens": 10}, pd.DataFrame())["seconds"] is None
    from_summary = {"train_tokens": 5000, "real_tokens_per_s": 100.0, "steps_trained": 10}
    assert epoch_eta(from_summary, pd.DataFrame())["human"] == "50 s"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.2, "< 1 s"),
        (45, "45 s"),
        (200, "3 min 20 s"),
        (4320, "1 h 12 min"),
        (1800, "30 min"),
        (183600, "2 d 3 h"),
        (None, None),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def compiled(scope: str | None, first_step_s: float, wall_time_s: float) -> dict:
    runtime = {"device": "cuda:0", "device_name": "H100", "precision": "bf16", "compile": True}
    if scope is not None:  # runs before compile_scope existed have none: the whole model was compiled
        runtime["compile_scope"] = scope
    return cuda(runtime=runtime, first_step_s=first_step_s, wall_time_s=wall_time_s)


def test_compile_bound_names_compile_scope_layers_when_the_compile_takes_much_of_the_run():
    findings = diagnose(compiled("model", 120.0, 300.0), make_history(6, mfu=0.45))
    finding = by_kind(findings)[COMPILE_BOUND]
    assert finding.triggered and finding.figure == "40 %"
    assert finding.message == (
        "compiling took 120 s, 40 % of the run's 300 s (the first step, compile included)"
    )
    assert "train.runtime.compile_scope: layers" in finding.advice
    # a steady state in the math is still compute-bound: the compile is a start-up cost, not the step's
    assert triggered(findings) == {COMPILE_BOUND, COMPUTE_BOUND}
    old_run = by_kind(diagnose(compiled(None, 120.0, 300.0), make_history(6, mfu=0.45)))[COMPILE_BOUND]
    assert old_run.triggered and "compile_scope: layers" in old_run.advice


def test_compile_bound_by_layers_already_says_the_run_is_too_short_to_repay_it():
    finding = by_kind(diagnose(compiled("layers", 40.0, 60.0), make_history(6)))[COMPILE_BOUND]
    assert finding.triggered and "train.runtime.compile: false" in finding.advice
    assert "compile_scope" not in finding.advice


@pytest.mark.parametrize(
    "summary",
    [
        compiled("model", 20.0, 300.0),  # under the share
        cuda(runtime={"device": "cuda:0", "compile": False}, first_step_s=120.0, wall_time_s=300.0),
        cuda(runtime={"device": "cuda:0", "compile": True}),  # no figures: an older summary
    ],
)
def test_compile_bound_quiet_when_the_compile_is_small_absent_or_unknown(summary):
    finding = by_kind(diagnose(summary, make_history(6, mfu=0.45)))[COMPILE_BOUND]
    assert not finding.triggered


def test_the_report_line_of_compile_bound_names_its_measure():
    from fastlm.reporting.report_document import check_line

    finding = by_kind(diagnose(compiled("model", 120.0, 300.0), make_history(6, mfu=0.45)))[COMPILE_BOUND]
    line = check_line(dataclasses.asdict(finding))
    assert line == "⚠ compile share of the wall time 40 %: compile-bound"


def test_host_sync_reads_a_gpu_profile_where_the_run_recorded_one():
    """A profiled GPU run (train.profile) measured where its GPU waited: at HOST_BOUND_IDLE_SHARE or more of
    the window waiting for the host it triggers with the figure, the phase, the launching operator and the
    host sync the profile names, on step times and MFU that say nothing; below, it stays quiet."""
    from fastlm.engine.observe.gpu_idle import idle_breakdown
    from fastlm.engine.observe.profiling import PHASES
    from fastlm.reporting.diagnosis import HOST_BOUND_IDLE_SHARE
    from tests.support.traces import hand_built_trace

    idle = idle_breakdown(hand_built_trace(), steps=2, phases=PHASES)  # 91 of 230 us waiting for the host
    history = make_history(6, mfu=0.4)
    profiled = {**cuda(), "profile": {"recorded": True, "gpu_idle": idle}}
    finding = by_kind(diagnose(profiled, history))[HOST_SYNC_BOUND]
    assert finding.triggered and "GPU waiting for the host 39.6 %" in finding.figure
    assert "backward" in finding.message and "aten::item" in finding.message
    assert "aten::item" in finding.advice
    assert COMPUTE_BOUND not in triggered(diagnose(profiled, history))
    share = idle["host_bound_ms_per_step"] / idle["window_ms_per_step"]
    quiet = {**idle, "host_bound_ms_per_step": idle["window_ms_per_step"] * HOST_BOUND_IDLE_SHARE * 0.9}
    assert share > HOST_BOUND_IDLE_SHARE
    finding = by_kind(diagnose({**cuda(), "profile": {"recorded": True, "gpu_idle": quiet}}, history))
    assert (
        not finding[HOST_SYNC_BOUND].triggered
        and "GPU waiting for the host 9.0 %" in finding[HOST_SYNC_BOUND].figure
    )


def test_host_sync_advice_names_the_cuda_graph_setting_this_run_did_not_use():
    """A host-bound CUDA run is told which of its own settings stand between it and fewer launches: compile
    (fused kernels) where it ran eager, then CUDA graphs of its layers (``train.runtime.compile_mode:
    reduce-overhead``: one launch per layer) as an A/B to run, not as a lever known to pay: on the one GPU run
    that measured them (a 3B LoRA on an H100, 2026-11-28) they were slower than eager. A run whose graphs ran
    is not told to turn them on, and one whose compiled graphs ran without them is told how to see why."""
    history = make_history(6, step_time_s=0.1, step_time_max_s=0.5, mfu=0.4)

    def advice(runtime: dict, **summary) -> str:
        run = cuda(**summary)
        run["runtime"] = {**run["runtime"], **runtime}
        finding = by_kind(diagnose(run, history))[HOST_SYNC_BOUND]
        assert finding.triggered
        return finding.advice

    eager = advice({"compile": False, "compile_scope": "model", "compile_mode": "default"})
    assert "set train.runtime.compile: true (fused kernels, fewer launches)" in eager
    assert "then A/B compile_scope: layers, compile_mode: reduce-overhead" in eager
    whole = advice({"compile": True, "compile_scope": "model", "compile_mode": "default"})
    assert "A/B train.runtime.compile_scope: layers, compile_mode: reduce-overhead" in whole
    layers = advice({"compile": True, "compile_scope": "layers", "compile_mode": "default"})
    assert "A/B train.runtime.compile_mode: reduce-overhead" in layers and "compile_scope" not in layers
    for told in (eager, whole, layers):  # graphs as a measurement to make, with the one that was made
        assert "slower than eager where measured (docs/benchmarks.md)" in told
    # what CUDA graphs also need, from this run's own batching and checkpointing
    needs = advice(
        {"compile": True, "compile_scope": "layers", "compile_mode": "default"},
        batching="dynamic",
        gradient_checkpointing="selective",
    )
    assert "train.batching.mode: packed" in needs and "train.model.gradient_checkpointing: off" in needs
    graphs = {"compile": True, "compile_scope": "layers", "compile_mode": "reduce-overhead"}
    ran = advice(graphs, cuda_graphs="56 recorded")
    assert "reduce-overhead" not in ran and ".item()" in ran
    skipped = advice(graphs, cuda_graphs="0 recorded; 4 compiled graphs ran without one (TORCH_LOGS=...)")
    assert "4 compiled graphs ran without one" in skipped and "TORCH_LOGS=cudagraphs" in skipped
    # FSDP2 gathers each layer's weights around it, which a layer's graph cannot hold: the config refuses it
    sharded = advice({"compile": False}, distributed_strategy="fsdp", world_size=2)
    assert "reduce-overhead" not in sharded and ".item()" in sharded


def test_the_diagnosis_judges_the_data_wait_and_padding_the_efficiency_table_shows():
    # the run's own figures over its single steps (total wait over the steps' time, real over computed
    # tokens); the logging windows' means are diluted by the validations and saves their wall clock holds
    summary = cpu(data_wait_share=0.15, padding_efficiency=0.7, steps=60, steps_trained=60)
    history = make_history(6, data_wait_share=0.05, padding_efficiency=0.85)
    table = efficiency_summary(summary, history).iloc[0]
    findings = by_kind(diagnose(summary, history))
    assert findings[INPUT_BOUND].figure == f"{table['data_wait_share'] * 100:.0f} %" == "15 %"
    assert findings[INPUT_BOUND].triggered
    assert findings[PADDING_BOUND].figure == f"{table['padding_efficiency'] * 100:.0f} %" == "70 %"
    assert findings[PADDING_BOUND].triggered


def test_a_resumed_runs_timed_steps_are_the_steps_its_rate_covers():
    """A run of 6 steps resumed at step 3 (each process's first step, 1 and 4, a ``warmup`` row left out of
    the rate) has 4 timed steps (2-3 and 5-6), not its last step - 1 = 5: too few to judge, as a fresh run
    of 5 steps is; a fresh run of 6 steps (5 timed steps) is judged."""
    resumed = make_history(5, step=[1, 2, 3, 4, 6], warmup=[1, 0, 0, 1, 0])
    finding = by_kind(diagnose(cpu(), resumed))[COMPUTE_BOUND]
    assert not finding.triggered
    assert "4 timed steps" in finding.message
    assert epoch_eta(cpu(train_tokens=1000), resumed)["seconds"] is None
    fresh = make_history(5, step=[1, 2, 3, 4, 6])
    assert triggered(diagnose(cpu(), fresh)) == {COMPUTE_BOUND}
    assert epoch_eta(cpu(train_tokens=1000), fresh)["seconds"] == pytest.approx(1.0, rel=1e-12)


def test_the_not_judged_message_names_every_warm_up_step_left_out():
    """A resumed run leaves out each process's first step (1 and 4 here), not one: its message said "after
    the warm-up step" all the same. A fresh run's says the one warm-up step; a resumed run's, how many."""
    resumed = make_history(5, step=[1, 2, 3, 4, 6], warmup=[1, 0, 0, 1, 0])
    message = by_kind(diagnose(cpu(), resumed))[COMPUTE_BOUND].message
    assert "4 timed steps" in message and "2 warm-up steps (each process's first) left out" in message, (
        message
    )
    assert epoch_eta(cpu(train_tokens=1000), resumed)["not_judged"] == message
    fresh = make_history(4, step=[1, 2, 3, 4])
    message = by_kind(diagnose(cpu(), fresh))[COMPUTE_BOUND].message
    assert "3 timed steps after the warm-up step (" in message, message


def test_the_not_judged_message_asks_for_what_the_run_lacked_not_a_max_steps_it_had():
    """ "(a run of train.max_steps >= 6 is judged)" was said of every run too short to judge: of a run of
    train.max_steps 300 stopped by its time budget at step 4, and of a run of 6 steps resumed at step 3 (2
    warm-up steps left out: 4 timed), both of which had that train.max_steps. Each now names what stopped it
    or how far to go on; a fresh run's message is as before."""
    budget = cpu(stopped_by="time budget", planned_steps=300, steps=4)
    message = by_kind(diagnose(budget, make_history(3, step=[1, 2, 4])))[COMPUTE_BOUND].message
    assert (
        "train.max_steps >=" not in message
        and "train.max_minutes stopped this run at step 4 of 300" in message
    )
    assert "raise train.max_minutes" in message, message
    early = cpu(stopped_by="early stopping", planned_steps=16, steps=4)
    message = by_kind(diagnose(early, make_history(3, step=[1, 2, 4])))[COMPUTE_BOUND].message
    assert "early stopping ended this run at step 4 of 16" in message and "train.max_steps >=" not in message
    resumed = make_history(5, step=[1, 2, 3, 4, 6], warmup=[1, 0, 0, 1, 0])
    message = by_kind(diagnose(cpu(steps=6, planned_steps=6), resumed))[COMPUTE_BOUND].message
    assert (
        f"train.max_steps >= 7 going on with this run (train.resume: auto), or >= {MIN_TIMED_STEPS + 1} "
        "in one process" in message
    ), message
    fresh = by_kind(diagnose(cpu(), make_history(4, step=[1, 2, 3, 4])))[COMPUTE_BOUND].message
    assert fresh.endswith(f"(a run of train.max_steps >= {MIN_TIMED_STEPS + 1} is judged)"), fresh


def test_compile_bound_judges_from_all_the_compile_seconds_recompiles_included():
    """The summary's ``compile_s`` counts every compile (a recompile after the first step included, left out
    of the step times); the finding judges from it and says so. Was: from ``first_step_s`` alone, a 22 s
    first step (compile included) of a run whose second step recompiled 19.4 s: 22 %, not triggered."""
    summary = {**compiled("model", 22.0, 100.0), "compile_s": 41.4}
    finding = by_kind(diagnose(summary, make_history(6, mfu=0.45)))[COMPILE_BOUND]
    assert finding.triggered and finding.figure == "41 %"
    assert finding.message == (
        "compiling took 41 s, 41 % of the run's 100 s (all of torch.compile's compiles, recompiles included: "
        "the summary's compile_s)"
    )


def test_a_run_past_dynamos_recompile_limit_is_a_finding():
    """A compiled run that reached ``torch._dynamo.config.recompile_limit`` ran those functions eagerly for
    the rest of the run (the summary's ``recompile_limit_hit``): slower than compiled, so not compute-bound
    yet, with the fix the run's warning gave. Was: no finding; the run read as compute-bound."""
    from fastlm.reporting.report_document import check_line

    functions = ["forward (modeling_llama.py:9): size mismatch at index 1", "forward (layers.py:89): x"]
    hit = {
        **compiled("layers", 1.0, 300.0),
        "recompile_limit_hit": True,
        "recompile_limit_functions": functions,
    }
    findings = diagnose(hit, make_history(6, mfu=0.45))
    finding = by_kind(findings)[RECOMPILE_LIMIT]
    assert finding.triggered and finding.figure == "2", finding
    assert "forward (modeling_llama.py:9)" in finding.message and "eager" in finding.message, finding
    assert (
        "train.batching.mode: packed" in finding.advice and "train.runtime.compile: false" in finding.advice
    )
    assert triggered(findings) == {RECOMPILE_LIMIT}  # not compute-bound: part of the model ran eagerly
    line = check_line(dataclasses.asdict(finding))
    assert line == "⚠ functions run eagerly past dynamo's recompile limit 2: recompile-limit", line

    within = by_kind(
        diagnose(
            {**hit, "recompile_limit_hit": False, "recompile_limit_functions": []}, make_history(6, mfu=0.45)
        )
    )
    assert not within[RECOMPILE_LIMIT].triggered and within[RECOMPILE_LIMIT].figure == "0"
    assert within[COMPUTE_BOUND].triggered
    for quiet in (cuda(), compiled("layers", 1.0, 300.0)):  # not compiled; a summary from before the record
        assert by_kind(diagnose(quiet, make_history(6)))[RECOMPILE_LIMIT].figure == "n/a"
