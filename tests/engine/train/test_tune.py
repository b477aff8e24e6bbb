"""Autotune ladder: cliff, out-of-memory, headroom, accumulation; and a real short run on CPU."""

import gc
import weakref
from dataclasses import replace

import pytest
import torch

from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
from fastlm.engine.train import tune
from tests.support.toy_training import EOS, toy_model, toy_params, toy_sequences


def fake(speeds: dict[int, float], memory: dict[int, float], oom_at: int | None = None, calls=None):
    def measure(size: int) -> tune.Measurement:
        if calls is not None:
            calls.append(size)
        if oom_at is not None and size >= oom_at:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return tune.Measurement(speeds[size], 1.0 / speeds[size], memory[size])

    return measure


SIZES = [1, 2, 4, 8, 16, 32]
MEMORY = {1: 10, 2: 20, 4: 40, 8: 70, 16: 95, 32: 100}


def test_cliff_stops_the_ladder_and_the_fastest_before_it_is_chosen():
    speeds = {1: 100, 2: 190, 4: 350, 8: 400, 16: 170, 32: 999}  # 16: near the memory limit, 2.4x slower
    calls = []
    trials = tune.run_ladder(
        fake(speeds, MEMORY, calls=calls), SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05
    )
    assert [t.status for t in trials] == ["ok", "ok", "ok", "ok", "cliff"]
    assert calls == [1, 2, 4, 8, 16, 16]  # the cliff measured twice: a slowdown that holds
    assert tune.choose(trials).micro_batch_size == 8


def test_a_slowdown_measured_once_is_measured_again_before_it_counts_as_the_cliff():
    """Size 4's first trial ran while something else took the cores (150 tok/s, below size 2's 190); its
    second runs at its speed (350): the ladder goes on to the real cliff, and size 4's figure is the second.
    Was: one noisy trial of two timed steps (CPU, a shared machine) ended the ladder at size 2."""
    speeds = {1: [100], 2: [190], 4: [150, 350], 8: [400], 16: [170, 175], 32: [999]}
    calls = []

    def measure(size: int) -> tune.Measurement:
        calls.append(size)
        speed = speeds[size][min(calls.count(size), len(speeds[size])) - 1]
        return tune.Measurement(speed, 1.0 / speed, MEMORY[size])

    trials = tune.run_ladder(measure, SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05)
    assert [t.status for t in trials] == ["ok", "ok", "ok", "ok", "cliff"]
    assert calls == [1, 2, 4, 4, 8, 16, 16]
    assert trials[2].real_tokens_per_s == 350 and trials[4].real_tokens_per_s == 175
    assert tune.choose(trials).micro_batch_size == 8


def test_out_of_memory_is_caught_recorded_and_the_process_goes_on():
    speeds = {size: 100.0 * size for size in SIZES}
    trials = tune.run_ladder(
        fake(speeds, MEMORY, oom_at=16), SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05
    )
    assert trials[-1].status == tune.OOM and "out of memory" in trials[-1].error
    assert tune.choose(trials).micro_batch_size == 8


def test_headroom_is_respected():
    speeds = {size: 100.0 * size for size in SIZES}  # always faster: only memory stops it
    trials = tune.run_ladder(
        fake(speeds, MEMORY), SIZES, memory_limit_mb=100, headroom=0.2, cliff_tolerance=0.05
    )
    assert [t.status for t in trials][-1] == tune.OVER and trials[-1].micro_batch_size == 16  # 95 > 80
    assert tune.choose(trials).micro_batch_size == 8


class _Cycle:
    """An object only the cyclic garbage collector frees (it refers to itself), as a failed trial's traceback
    and frames are, with the tensors they hold."""

    def __init__(self) -> None:
        self.me = self
        self.activations = torch.ones(256)


def test_between_trials_the_collector_frees_their_cycles_and_scans_only_what_they_made():
    """``release_memory`` runs a full garbage collection after each trial. In a process holding torch,
    transformers, Kedro and MLflow that scans hundreds of thousands of objects, twice a trial, unless the
    objects alive before the ladder wait in the collector's permanent generation (``gc.freeze``) meanwhile;
    they are put back after it, and what a trial left in reference cycles is still freed before the next
    one."""
    assert gc.get_freeze_count() == 0, "the ladder leaves a process that froze objects itself as it is"
    before = _Cycle()
    del before.me  # no cycle: alive before the ladder
    cycles, frozen = [], []

    def measure(size: int) -> tune.Measurement:
        frozen.append(gc.get_freeze_count())
        for made in cycles:
            assert made() is None, "the previous trial's cycle outlived release_memory"
        cycles.append(weakref.ref(_Cycle()))
        if size == 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return tune.Measurement(100.0 * size, 0.01, 1.0)

    trials = tune.run_ladder(measure, SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05)
    assert [t.status for t in trials] == ["ok", "ok", "ok", tune.OOM]
    assert all(made() is None for made in cycles)
    assert min(frozen) > 1000  # the test process's objects, this test's `before` among them
    assert gc.get_freeze_count() == 0
    before.me, alive = before, weakref.ref(before)  # put back: a cycle of it is collectable again
    del before
    gc.collect()
    assert alive() is None


def test_other_errors_are_not_swallowed():
    def broken(size):
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        tune.run_ladder(broken, [1], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05)


def test_accumulation_keeps_the_effective_batch_and_the_explanation_has_the_figures():
    assert tune.accumulation_for(256, 24) == 11 and tune.accumulation_for(64, 16, world_size=2) == 2
    assert tune.accumulation_for(None, 16, current=3) == 3
    assert tune.ladder(1, 48) == [1, 2, 4, 8, 16, 32, 48]
    speeds = {1: 100, 2: 190, 4: 350, 8: 400, 16: 170, 32: 1}
    trials = tune.run_ladder(
        fake(speeds, MEMORY), SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05
    )
    text = tune.explain(
        trials, tune.choose(trials), accumulation=4, target=32, headroom=0.1, memory_limit_mb=None
    )
    assert "micro-batch 8 (400 real tokens/s" in text and "the cliff" in text and "holds 32 rows" in text


def toy_measurer(params, runtime, *, timed: int):
    """``tune.real_step_measurer`` on the toy model and 300 toy sequences, one warm-up step."""
    return tune.real_step_measurer(
        toy_model(),
        toy_sequences(300, 1),
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
        warmup=1,
        timed=timed,
    )


def test_real_short_run_on_cpu(tmp_path):
    params = toy_params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    measure = toy_measurer(params, runtime, timed=2)
    trials = tune.run_ladder(
        measure, tune.ladder(1, 4), memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.5
    )
    assert [t.micro_batch_size for t in trials] == [1, 2, 4]
    assert all(t.real_tokens_per_s > 0 and t.peak_memory_mb > 0 and t.step_time_s > 0 for t in trials)


def test_allocator_retries_without_a_speed_gain_mark_the_cliff():
    def measure(size):
        retries = 3 if size == 8 else 0
        return tune.Measurement(
            100.0 * min(size, 4),
            0.1,
            MEMORY[size],
            alloc_retries=retries,
            peak_reserved_mb=MEMORY[size] * 1.2,
        )

    trials = tune.run_ladder(measure, SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05)
    assert [t.status for t in trials] == ["ok", "ok", "ok", "cliff"] and trials[-1].alloc_retries == 3
    assert trials[0].peak_reserved_mb == pytest.approx(12.0) and tune.choose(trials).micro_batch_size == 4


def test_the_measured_step_is_the_training_step(tmp_path, monkeypatch):
    """tune times ``step.train_step`` with the run's clipping and learning-rate schedule, as training does."""
    from fastlm.engine.train import step as step_module

    seen, real = [], step_module.train_step

    def spying(model, micro, opt, **kwargs):
        before = opt.scheduler.last_epoch
        result = real(model, micro, opt, **kwargs)
        seen.append((opt.clip, opt.scheduler.last_epoch - before, result.lr))
        return result

    monkeypatch.setattr(step_module, "train_step", spying)
    params = toy_params(tmp_path, optimizer={"grad_clip": 0.5, "warmup_steps": 2})
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    measure = toy_measurer(params, runtime, timed=2)
    measure(2)
    assert [(clip, advanced) for clip, advanced, _ in seen] == [(0.5, 1)] * 3
    assert seen[0][2] < seen[1][2]  # warm-up: the rate grows step by step


@pytest.mark.parametrize(("requested", "compiled"), [("auto", False), (True, True)])
def test_tune_measures_compile_auto_eagerly_as_the_run_may_train(tmp_path, monkeypatch, requested, compiled):
    """``compile: auto`` resolves to compiled on CUDA until the run's first micro-batch measures it
    (runtime_probe), and the run may then train eager: tune times and sizes the eager step there (a compiled
    step usually holds less activation memory: the safer size), as it does on a CPU. A runtime that compiles
    (what CUDA's ``auto`` resolves to) is built here; the compiler is a stand-in that only wraps the model."""
    from dataclasses import replace

    from fastlm.engine.runtime import environment
    from fastlm.engine.train import step as step_module

    class Compiled(torch.nn.Module):
        def __init__(self, model, *args):
            super().__init__()
            self._orig_mod = model

        def forward(self, *args, **kwargs):
            return self._orig_mod(*args, **kwargs)

    stepped, real = [], step_module.train_step

    def spying(model, micro, opt, **kwargs):
        stepped.append(isinstance(model, Compiled))
        return real(model, micro, opt, **kwargs)

    monkeypatch.setattr(step_module, "train_step", spying)
    monkeypatch.setattr(environment, "compile_in_scope", lambda model, *args: Compiled(model))
    params = toy_params(tmp_path, runtime={"device": "cpu", "num_threads": 1, "compile": requested})
    runtime = replace(setup_runtime(params.runtime), compile=True)
    measure = toy_measurer(params, runtime, timed=1)
    measure(2)
    assert stepped == [compiled, compiled]


def test_every_batching_mode_gets_its_ladder_and_the_fastest_mode_wins(tmp_path):
    """``tune.modes``: each mode is measured over the sizes on the real step; the choice is across modes."""
    params = toy_params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    ladders = tune.tune_modes(
        toy_model(),
        toy_sequences(300, 1),
        ["packed", "length_grouped"],
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
        settings=tune.LadderSettings(
            warmup=1,
            timed=2,
            sizes=tune.ladder(1, 2),
            memory_limit_mb=None,
            headroom=0.1,
            cliff_tolerance=0.9,
        ),
    )
    assert [ladder.mode for ladder in ladders] == ["packed", "length_grouped"]
    assert all([t.micro_batch_size for t in ladder.trials] == [1, 2] for ladder in ladders)
    best = tune.best_mode(ladders)
    fastest = max((t.real_tokens_per_s, ladder.mode) for ladder in ladders for t in ladder.trials)
    assert (best.chosen.real_tokens_per_s, best.mode) == fastest
    text = tune.explain_modes(
        ladders, best, current_accumulation=1, target=None, headroom=0.1, memory_limit_mb=None
    )
    assert f"fastest: batching {best.mode}, micro-batch {best.chosen.micro_batch_size}" in text.lower()
    assert "packed:" in text and "length_grouped:" in text


def test_a_mode_the_model_cannot_train_in_is_skipped_with_the_reason(tmp_path, monkeypatch):
    params = toy_params(tmp_path)
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))

    def never(*args, **kwargs):
        raise AssertionError("measured a mode that was refused")

    monkeypatch.setattr(
        tune, "unavailable_modes", lambda model, dataset, attn: lambda mode: "no packing here"
    )
    monkeypatch.setattr(tune, "real_step_measurer", never)
    ladders = tune.tune_modes(
        toy_model(),
        toy_sequences(300, 1),
        ["packed"],
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
        settings=tune.LadderSettings(
            warmup=1, timed=2, sizes=[1], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.9
        ),
    )
    assert (
        ladders[0].trials == []
        and ladders[0].skipped == "no packing here"
        and tune.best_mode(ladders) is None
    )


def test_a_packed_trial_counts_the_samples_its_rows_hold(tmp_path):
    """Packed rows of 64 tokens hold several toy samples: the trial says how many per micro-batch."""
    params = toy_params(tmp_path)  # packed
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    measure = toy_measurer(params, runtime, timed=1)
    trials = tune.run_ladder(measure, [2], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.5)
    assert trials[0].samples_per_micro_batch > 2 * 2  # 2 rows, several samples each


def test_the_target_effective_batch_counts_samples_not_packed_rows():
    """tune.target_effective_batch is samples per optimizer step: a micro-batch of 4 packed rows holding ~60
    samples reaches 256 samples in 5 accumulation steps, not 64; the explanation says rows and samples."""
    assert tune.accumulation_for(256, 4, samples_per_micro_batch=60.0) == 5
    assert tune.accumulation_for(256, 4) == 64  # one sample per row (dynamic, length_grouped)
    trials = [tune.Trial(4, tune.OK, 1000.0, 0.1, 10.0, samples_per_micro_batch=60.0)]
    text = tune.explain(trials, trials[0], accumulation=5, target=256, headroom=0.1, memory_limit_mb=None)
    assert "20 rows" in text and "~300 samples" in text and "target 256 samples" in text


def test_the_time_limit_stops_the_ladder_before_the_next_size_and_says_so(monkeypatch):
    """``tune.max_minutes``: no trial starts past the deadline (a 3B model's trial can take a minute); the
    sizes measured keep their choice, and the explanation names the limit and the size not measured."""
    clock = [0.0]
    monkeypatch.setattr(tune, "perf_counter", lambda: clock[0])
    speeds = {size: 100.0 * size for size in SIZES}

    def measure(size: int) -> tune.Measurement:
        clock[0] += 40.0  # each trial takes 40 s
        return tune.Measurement(speeds[size], 1.0 / speeds[size], MEMORY[size])

    trials = tune.run_ladder(
        measure, SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05, deadline=100.0
    )
    assert [(t.micro_batch_size, t.status) for t in trials] == [
        (1, "ok"),
        (2, "ok"),
        (4, "ok"),
        (8, tune.TIME),
    ]
    assert tune.choose(trials).micro_batch_size == 4
    text = tune.explain(
        trials, tune.choose(trials), accumulation=1, target=None, headroom=0.1, memory_limit_mb=None
    )
    assert "tune.max_minutes" in text and "micro-batch 8" in text
    # the first size of a ladder always runs, also past the deadline: a mode measured has a choice
    clock[0] = 500.0
    first = tune.run_ladder(
        measure, SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05, deadline=100.0
    )
    assert [t.status for t in first] == ["ok", tune.TIME]


def test_max_minutes_is_validated_in_one_line():
    from fastlm.errors import ConfigError
    from fastlm.pipelines.tune.params import parse_tune_params

    assert (
        parse_tune_params({}).max_minutes is None
        and parse_tune_params({"max_minutes": 2.5}).max_minutes == 2.5
    )
    with pytest.raises(ConfigError, match="tune.max_minutes"):
        parse_tune_params({"max_minutes": 0})


def test_under_cuda_graphs_tune_measures_the_packed_mode_alone_and_says_why():
    """``compile_mode: reduce-overhead`` replays packed micro-batches of one shape (train refuses another
    mode): the other modes of ``tune.modes`` (conf/base lists length_grouped) are left out, named once."""
    modes, note = tune.modes_to_measure(["packed", "length_grouped"], "reduce-overhead")
    assert modes == ["packed"] and "length_grouped" in note and "reduce-overhead" in note
    assert tune.modes_to_measure(["dynamic"], "reduce-overhead")[0] == ["packed"]
    assert tune.modes_to_measure(["packed", "length_grouped"], "default") == (
        ["packed", "length_grouped"],
        "",
    )
    assert tune.modes_to_measure(["packed"], "reduce-overhead") == (["packed"], "")


def test_each_mode_is_explained_with_its_own_accumulation_for_the_target():
    """tune.target_effective_batch: every mode's paragraph gives the accumulation its own chosen size needs
    (a packed row holds several samples, a length-grouped row one), and the chosen mode's is the one written.
    Was: every mode said the chosen mode's accumulation, so length_grouped at micro-batch 1 read "2
    accumulation steps ... ~2 samples (target 16 samples)"."""
    packed = tune.Trial(8, tune.OK, 8000.0, 0.05, 600.0, samples_per_micro_batch=9.0)
    grouped = tune.Trial(1, tune.OK, 4000.0, 0.01, 600.0, samples_per_micro_batch=1.0)
    ladders = [
        tune.ModeLadder("packed", [packed], packed),
        tune.ModeLadder("length_grouped", [grouped], grouped),
    ]
    best = tune.best_mode(ladders)
    target = 16
    text = tune.explain_modes(
        ladders, best, current_accumulation=1, target=target, headroom=0.1, memory_limit_mb=None
    )
    paragraphs = dict(zip(["packed", "length_grouped"], text.split("length_grouped: "), strict=True))
    for ladder in ladders:
        accumulation = tune.mode_accumulation(ladder, target, current=1)
        chosen = ladder.chosen
        assert accumulation == tune.accumulation_for(
            target, chosen.micro_batch_size, samples_per_micro_batch=chosen.samples_per_micro_batch
        )
        samples = chosen.samples_per_micro_batch * accumulation
        assert samples >= target
        assert f"With {accumulation} accumulation step(s)" in paragraphs[ladder.mode]
        assert f"~{samples:,.0f} samples) (target {target} samples)" in paragraphs[ladder.mode]
    assert tune.mode_accumulation(ladders[0], target, current=1) != tune.mode_accumulation(
        ladders[1], target, current=1
    )


def test_the_explanation_counts_the_packed_rows_a_micro_batch_held(tmp_path):
    """A packed micro-batch of 3 holds 3 x max_length (64) tokens in rows of train.batching.row_length (48):
    4 rows, not 3. Was: the explanation said an optimizer step of 2 accumulation steps holds 6 rows."""
    params = toy_params(tmp_path, batching={"row_length": 48})
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    trials = tune.run_ladder(
        toy_measurer(params, runtime, timed=2), [3], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.5
    )
    rows = trials[0].rows_per_micro_batch
    assert 3 < rows <= 3 * 64 // 48  # the packer's budget: 4 rows of 48 tokens, each filled in turn
    text = tune.explain(trials, trials[0], accumulation=2, target=None, headroom=0.1, memory_limit_mb=None)
    assert f"holds {2 * rows:,.0f} rows" in text, text


def test_a_size_the_data_holds_too_few_batches_of_ends_the_ladder_with_what_was_measured(tmp_path):
    """20 toy samples, one warm-up and two timed steps: micro-batch 16 makes fewer than 3 batches. The ladder
    stops there, recorded and said, and the fastest size measured before it is chosen. (The whole tune
    stopped with a ValueError traceback, the sizes measured lost.)"""
    params = toy_params(tmp_path)
    params = params.model_copy(
        update={"batching": params.batching.model_copy(update={"mode": "length_grouped"})}
    )
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    measure = tune.real_step_measurer(
        toy_model(),
        toy_sequences(20, 1),
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
        warmup=1,
        timed=2,
    )
    trials = tune.run_ladder(measure, [4, 16, 32], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.9)
    assert [t.micro_batch_size for t in trials] == [4, 16]
    assert trials[0].status == tune.OK and trials[1].status != tune.OK and trials[1].real_tokens_per_s is None
    chosen = tune.choose(trials)
    assert chosen is not None and chosen.micro_batch_size == 4
    text = tune.explain(trials, chosen, accumulation=1, target=None, headroom=0.1, memory_limit_mb=None)
    assert "micro-batch 16 leaves fewer than 3 batches" in text, text


@pytest.mark.parametrize("mode", ["length_grouped", "dynamic"])
def test_a_padded_trial_runs_the_epochs_largest_batch_where_the_runs_peak_memory_comes_from(
    tmp_path, monkeypatch, mode
):
    """length_grouped and dynamic micro-batches are padded to their longest sample, so their memory grows
    with it: a trial of the epoch's first batches (short ones, for short texts with a long tail) measured
    a peak the run then passes at its longest batch, where a size chosen under the headroom runs out of
    memory. The trial's warm-up step is the epoch's largest batch (most padded tokens), its timed steps the
    epoch's first batches as before; packed micro-batches are one token budget and stay as they were."""
    from fastlm.engine.batching import make_batching
    from fastlm.engine.train import step as step_module

    shapes: list[tuple[int, int]] = []
    real = step_module.train_step

    def recorded(model, micro, opt, **kwargs):
        shapes.append(tuple(micro[0]["input_ids"].shape))
        return real(model, micro, opt, **kwargs)

    monkeypatch.setattr(step_module, "train_step", recorded)
    params = toy_params(tmp_path)
    params = params.model_copy(update={"batching": params.batching.model_copy(update={"mode": mode})})
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    measure = tune.real_step_measurer(
        toy_model(),
        toy_sequences(300, 1),
        params=params,
        runtime=runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
        warmup=1,
        timed=2,
    )
    measure(4)
    trial = params.model_copy(update={"batching": params.batching.model_copy(update={"micro_batch_size": 4})})
    sampler, collator = make_batching(
        trial, toy_sequences(300, 1).lengths, pad_id=EOS, max_length=64, seed=params.order_seed
    )
    sampler.set_epoch(0)
    epoch = [tuple(collator(toy_sequences(300, 1).__getitems__(b))["input_ids"].shape) for b in sampler]
    largest = max(epoch, key=lambda shape: (shape[0] * shape[1], shape[1]))
    assert largest not in epoch[:3], "the toy's first batches already hold its largest: no check"
    assert shapes == [largest, *epoch[1:3]], (shapes, largest, epoch[:3])


@pytest.mark.skipif(not tune.reset_peak_rss(), reason="no per-process peak RSS to reset (Linux only)")
def test_a_cpu_trials_peak_memory_holds_what_its_steps_freed_before_they_ended():
    """On a CPU a step's activations are allocated and freed within it, and large blocks go back to the
    system at once: the resident memory sampled after each step missed them (a 4-layer model's ladder
    measured 2,628 MB at micro-batch 512 where the process peaked at 3,268 MB), so the 10 % headroom did not
    hold. The trial's peak is the process's high-water mark, reset as the trial starts: a step holding
    256 MB for a moment shows in it, and a later trial's peak is its own."""
    held_mb = 256

    def step(index: int) -> int:
        block = torch.ones(held_mb * 2**20 // 4)  # written: resident, freed as the step returns
        del block
        return 1

    before = tune.current_rss_mb()
    measured = tune.measure_training_step(step, device=torch.device("cpu"), warmup=1, timed=2)
    assert measured.peak_memory_mb >= before + 0.9 * held_mb, (measured.peak_memory_mb, before)
    idle = tune.measure_training_step(lambda index: 1, device=torch.device("cpu"), warmup=1, timed=2)
    assert idle.peak_memory_mb < before + 0.5 * held_mb, (idle.peak_memory_mb, before)


FEW_ERROR = "micro-batch 4 leaves fewer than 8 batches in the training data"


def _nothing_fit(*ladders: tune.ModeLadder) -> list[tune.PolicyLadders]:
    return [tune.PolicyLadders("off", list(ladders), None)]


@pytest.mark.parametrize(
    ("ladders", "said", "memory"),
    [
        (
            [tune.ModeLadder("packed", [tune.Trial(4, tune.FEW, error=FEW_ERROR)], None)],
            "micro-batch 4 leaves fewer than 8",
            False,
        ),
        (
            [tune.ModeLadder("packed", [], None, skipped="the model cannot train packed rows on eager")],
            "packed: not measured (the model cannot train packed rows on eager)",
            False,
        ),
        (
            [
                tune.ModeLadder("packed", [], None, skipped="the model cannot train packed rows on eager"),
                tune.ModeLadder("padded", [tune.Trial(4, tune.OOM, error="CUDA out of memory")], None),
            ],
            "packed: not measured (the model cannot train packed rows on eager)",
            True,
        ),
        (
            [tune.ModeLadder("padded", [tune.Trial(4, tune.OOM, error="CUDA out of memory")], None)],
            "micro-batch 4 ran out of memory",
            True,
        ),
        (
            [tune.ModeLadder("padded", [tune.Trial(4, tune.OVER, 10.0, 1.0, 95.0)], None)],
            "micro-batch 4 needed 95 MB",
            True,
        ),
    ],
    ids=["too-few-batches", "mode-skipped", "skipped-then-oom", "oom", "over-headroom"],
)
def test_when_no_size_fit_the_error_says_the_first_failure_and_memory_advice_only_for_memory(
    ladders, said, memory
):
    """Every size of every ladder failed: the one line names the first failure as it happened, and gives
    memory advice (free memory, gradient checkpointing, a smaller model) only where memory stopped a ladder.
    (It always said to free device memory, also where the training data held too few batches for the trial
    or the model could not train in the batching mode.)"""
    error = tune.no_fit_error(
        _nothing_fit(*ladders),
        min_size=4,
        headroom=0.1,
        memory_limit_mb=100.0,
        tuned_file="conf/local/parameters_tuned.yml",
    )
    message = str(error)
    assert said in message and "\n" not in message, message
    assert message.index(said) < message.index("Fix:"), message
    assert ("free device memory" in message) is memory, message
    assert "conf/local/parameters_tuned.yml was left as it was" in message, message


@pytest.mark.parametrize("status", [tune.OVER, tune.OOM])
def test_when_nothing_fit_under_a_memory_limit_the_fix_names_the_limit_and_what_would_fit(status):
    """``tune.memory_limit_gb: 0.1`` where the smallest micro-batch needed 658 MB: the one line's fix names
    the limit the trials ran under (raise it, or null for the whole device) and, where a peak was measured,
    the least limit under which that size fits with the headroom. (It said to free device memory, turn on
    gradient checkpointing or use a smaller model: the user's own 0.1 GB was the cause, never named.)"""
    trial = tune.Trial(1, status, 15.0, 1.0, 658.0) if status == tune.OVER else tune.Trial(1, status)
    message = str(
        tune.no_fit_error(
            _nothing_fit(tune.ModeLadder("packed", [trial], None)),
            min_size=1,
            headroom=0.1,
            memory_limit_mb=0.1 * 1024,
            limit_gb=0.1,
            tuned_file="conf/local/parameters_tuned.yml",
        )
    )
    fix = message[message.index("Fix:") :]
    assert "\n" not in message and "tune.memory_limit_gb" in fix and "0.1" in fix, message
    assert ("tune.memory_limit_gb: 0.72" in fix) is (status == tune.OVER), message  # 658 / 0.9 / 1024
    assert fix.index("tune.memory_limit_gb") < fix.index("free device memory"), message
    without = str(
        tune.no_fit_error(
            _nothing_fit(tune.ModeLadder("packed", [trial], None)),
            min_size=1,
            headroom=0.1,
            memory_limit_mb=24 * 1024,
            tuned_file="conf/local/parameters_tuned.yml",
        )
    )
    assert "tune.memory_limit_gb" not in without and "free device memory" in without, without


class _CountedReads(torch.Tensor):
    """A tensor that counts the reads of its value into Python (``bool``, ``item``, ...): each one is a device
    sync on a GPU. What is computed from it is one as well, and counted."""

    reads = 0
    READS = ("__bool__", "item", "__float__", "__int__", "tolist", "__index__")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in cls.READS:
            _CountedReads.reads += 1
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_trial_whose_loss_diverges_fails_in_one_read_of_the_device_and_is_not_chosen(tmp_path, monkeypatch):
    """``train.optimizer.lr`` 1e30: the toy's loss is NaN from the second step. The trial fails ("loss not
    finite"), is not chosen, and its ladder ends there; the loss is read from the device once for the trial,
    not at each step. (A diverged trial counted as a speed measurement and could be chosen.)"""
    from dataclasses import replace

    from fastlm.engine.train import step as step_module

    real = step_module.train_step

    def counted(model, micro, opt, **kwargs):
        result = real(model, micro, opt, **kwargs)
        return replace(result, loss_sum=result.loss_sum.as_subclass(_CountedReads))

    monkeypatch.setattr(step_module, "train_step", counted)
    monkeypatch.setattr(_CountedReads, "reads", 0)
    params = toy_params(tmp_path, optimizer={"lr": 1e30, "warmup_steps": 0})
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    measure = toy_measurer(params, runtime, timed=4)
    trials = tune.run_ladder(measure, [1, 2, 4], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.9)
    assert [(t.micro_batch_size, t.status) for t in trials] == [(1, tune.NONFINITE)]
    assert _CountedReads.reads == 1, f"{_CountedReads.reads} reads of the loss for one trial of 5 steps"
    assert tune.choose(trials) is None


def test_a_diverged_size_between_finite_ones_is_not_chosen_and_ends_its_ladder():
    speeds = {size: 100.0 * size for size in SIZES}  # always faster: the diverged size would win

    def measure(size):
        return tune.Measurement(speeds[size], 1.0 / speeds[size], MEMORY[size], loss_finite=size < 4)

    trials = tune.run_ladder(measure, SIZES, memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.05)
    assert [t.status for t in trials] == [tune.OK, tune.OK, tune.NONFINITE]
    assert tune.choose(trials).micro_batch_size == 2
    text = tune.explain(
        trials, tune.choose(trials), accumulation=1, target=None, headroom=0.1, memory_limit_mb=None
    )
    assert "micro-batch 4's loss was not finite" in text, text


def test_every_trial_starts_from_the_weights_the_model_was_built_with(tmp_path):
    """Each trial trains the model a few steps (warm-up and timed); the next trial, the next batching mode's
    ladder and the next checkpointing policy's start again from the weights the model was built with. At a
    learning rate the toy diverges at after some steps (100), a trial continuing the earlier trials' weights
    diverged at the ladder's second size, and the weights it left (NaN) failed every trial of the next mode
    ("length_grouped: micro-batch 1's loss was not finite"): figures of the sizes tried before, not of the
    size. Now a size's status and loss are its own: the same as measured alone, first on a fresh model."""
    params = toy_params(tmp_path, optimizer={"lr": 100.0, "warmup_steps": 20})
    runtime = setup_runtime(RuntimeConfig(device="cpu", num_threads=1))
    settings = tune.LadderSettings(
        warmup=1, timed=2, sizes=[1, 2, 4], memory_limit_mb=None, headroom=0.1, cliff_tolerance=0.99
    )

    def statuses(modes, sizes, model):
        ladders = tune.tune_modes(
            model,
            toy_sequences(300, 1),
            modes,
            params=params,
            runtime=runtime,
            pad_id=EOS,
            max_length=64,
            attn="sdpa",
            settings=replace(settings, sizes=sizes),
        )
        return {ladder.mode: [(t.micro_batch_size, t.status) for t in ladder.trials] for ladder in ladders}

    model = toy_model()
    built = {name: p.detach().clone() for name, p in model.named_parameters()}
    both = statuses(["packed", "length_grouped"], [1, 2, 4], model)
    for name, p in model.named_parameters():  # the same tensors restored: exactly the built ones
        assert torch.equal(p, built[name]), name
    for mode, trials in both.items():
        for size, status in trials:
            assert statuses([mode], [size], toy_model())[mode] == [(size, status)], (mode, size, both)


def test_when_every_trial_diverged_the_one_line_says_so_and_names_the_learning_rate_and_precision():
    ladders = [
        tune.ModeLadder(mode, [tune.Trial(1, tune.NONFINITE, 10.0, 1.0, 5.0)], None)
        for mode in ("packed", "length_grouped")
    ]
    message = str(
        tune.no_fit_error(
            _nothing_fit(*ladders),
            min_size=1,
            headroom=0.1,
            memory_limit_mb=None,
            tuned_file="conf/local/parameters_tuned.yml",
        )
    )
    assert "\n" not in message and "micro-batch 1's loss was not finite" in message, message
    assert "train.optimizer.lr" in message and "train.runtime.precision" in message, message
    assert "free device memory" not in message, message
