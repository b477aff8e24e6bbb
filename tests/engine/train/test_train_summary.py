"""The run summary's figures come from per-step values, and every history row reaches the callbacks."""

import numpy as np
import pytest

from fastlm.engine.batching import make_batching
from tests.support.toy_training import EOS, run_toy, toy_model, toy_params, toy_sequences


def test_every_history_row_reaches_the_callbacks(tmp_path):
    # save_every 3 with log_every 4: the window pending at step 3 is flushed before the checkpoint is written.
    seen = []
    params = toy_params(tmp_path, max_steps=6, log_every=4, save_every=3, eval_every=None)
    result = run_toy(
        params, callbacks=[lambda kind, record: seen.append(record) if kind == "train" else None]
    )
    assert [record["step"] for record in result.history] == [1, 3, 4, 6]
    assert seen == result.history


def test_summary_figures_are_over_steps_not_window_means(tmp_path):
    params = toy_params(
        tmp_path,
        batching={"mode": "dynamic", "micro_batch_size": 4},
        max_steps=7,
        log_every=3,
        eval_every=None,
    )
    result = run_toy(params)
    assert [record["step"] for record in result.history] == [1, 3, 6, 7]  # windows of 1, 2, 3 and 1 steps
    # The same batches the run drew: steps 2..7 (step 1 is warm-up and left out).
    sampler, collator = make_batching(
        params, toy_sequences(300, 1).lengths, pad_id=EOS, max_length=64, seed=params.seed
    )
    sampler.set_epoch(0)
    data = toy_sequences(300, 1)
    batches = [
        collator(data.__getitems__(list(indices))) for _, indices in zip(range(7), sampler, strict=False)
    ]
    real = sum(int(batch["num_real_tokens"]) for batch in batches[1:])
    computed = sum(int(batch["num_computed_tokens"]) for batch in batches[1:])
    summary = result.summary
    assert summary["padding_efficiency"] == pytest.approx(real / computed)
    step_times = result.step_times[1:]
    assert len(step_times) == 6
    assert summary["step_time_p99_s"] == pytest.approx(float(np.percentile(step_times, 99)))
    assert summary["step_time_p50_s"] == pytest.approx(float(np.percentile(step_times, 50)))
    assert summary["step_time_max_s"] == pytest.approx(max(step_times))
    assert 0 <= summary["data_wait_share"] < 1


def test_the_steady_throughput_leaves_out_the_first_step_and_the_evaluations(tmp_path, monkeypatch):
    """Each validation batch takes at least 0.2 s (a slowed forward), four validations: their time landed in
    the next step's time and its window's, so the summary's throughput (the windows' wall clock) was several
    times below the steps' own. The summary says the steady figure beside it: the real tokens of the steps
    after the first over those steps' own time, the validations set aside (``outside_steps_s``)."""
    import time

    from fastlm.engine.evaluate import evaluation

    pause, real = 0.2, evaluation.forward_logits

    def slowed(model, batch):
        time.sleep(pause)
        return real(model, batch)

    monkeypatch.setattr(evaluation, "forward_logits", slowed)
    params = toy_params(tmp_path, max_steps=12, log_every=3, eval_every=3)
    result = run_toy(params)
    summary, first = result.summary, result.history[0]
    assert first["step"] == 1 and len(result.eval_history) == 4
    first_tokens = first["real_tokens_per_s"] * first["step_time_s"]  # step 1's window: step 1 alone
    steady = (summary["tokens_seen"] - first_tokens) / sum(result.step_times[1:])
    # the same sums divided in another order: float64 rounding only
    assert summary["steady_real_tokens_per_s"] == pytest.approx(steady, rel=1e-9)
    assert summary["outside_steps_s"] >= 4 * pause  # every validation set aside, not in a step's time
    assert max(result.step_times) < pause
    assert summary["steady_real_tokens_per_s"] > 2 * summary["real_tokens_per_s"]  # the wall clock's


def test_a_resume_reads_the_checkpoint_once(tmp_path, monkeypatch):
    from pathlib import Path

    from fastlm.engine.checkpoint.layout import MARKER, STATE_FILE

    run_toy(toy_params(tmp_path, max_steps=4, save_every=2, eval_every=None))
    reads, read_text = [], Path.read_text

    def counting(self, *args, **kwargs):
        if self.name in (STATE_FILE, MARKER):
            reads.append(self.name)
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", counting)
    result = run_toy(toy_params(tmp_path, max_steps=6, save_every=None, eval_every=None, resume="auto"))
    assert result.summary["resumed_from_step"] == 4
    assert sorted(reads) == sorted([MARKER, STATE_FILE])


@pytest.mark.parametrize(("mode", "rows"), [("packed", 4), ("dynamic", 4)])
def test_the_log_and_summary_say_what_an_optimizer_step_holds(tmp_path, caplog, mode, rows):
    """A packed row holds several samples: "effective batch 8" alone would hide ~8x as many texts per step.
    The log and the summary name the rows, and the mean samples and real tokens a step holds over an epoch."""
    import logging

    caplog.set_level(logging.INFO, logger="fastlm")
    params = toy_params(
        tmp_path,
        batching={"mode": mode, "micro_batch_size": rows, "gradient_accumulation_steps": 2},
        max_steps=2,
        eval_every=None,
    )
    result = run_toy(params)
    data, summary = toy_sequences(300, 1), result.summary
    steps_per_epoch = round(summary["steps"] / summary["epochs"])
    assert summary["rows_per_step"] == summary["effective_batch"] == rows * 2
    assert summary["samples_per_step"] == pytest.approx(len(data) / steps_per_epoch, abs=0.05)  # 1 decimal
    assert summary["tokens_per_step"] == pytest.approx(int(data.lengths.sum()) / steps_per_epoch, abs=0.05)
    if mode == "packed":  # rows of 64 tokens hold ~5 toy samples each
        assert summary["samples_per_step"] > 2 * summary["rows_per_step"]
    else:
        assert summary["samples_per_step"] == pytest.approx(summary["rows_per_step"], rel=0.05)
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("Training "))
    assert f"{rows * 2} rows" in line and f"~{summary['samples_per_step']:,.0f} samples" in line
    assert f"~{summary['tokens_per_step']:,.0f} real tokens" in line


def test_label_smoothing_trains_the_smoothed_loss_and_validates_on_the_plain_one(tmp_path, monkeypatch):
    """train.loss.label_smoothing reaches every training step (the smoothed loss itself: test_loss.py); the
    validation stays plain cross-entropy (comparable across runs); the summary names the train loss's
    smoothing."""
    import fastlm.engine.train.step as step_module
    from fastlm.engine.evaluate.evaluation import evaluate

    real, seen = step_module.accumulate_gradients, []

    def recording(*args, **kwargs):
        seen.append(kwargs.get("label_smoothing"))
        return real(*args, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", recording)
    steps = {"max_steps": 3, "log_every": 1, "eval_every": 3}
    smoothed = run_toy(toy_params(tmp_path / "smoothed", loss={"label_smoothing": 0.3}, **steps))
    assert seen == [0.3] * 3 and smoothed.summary["label_smoothing"] == 0.3
    params = toy_params(tmp_path / "again", **steps)
    again = evaluate(
        smoothed.model,
        toy_sequences(40, 2),
        params=params,
        runtime=smoothed.runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
    ).metrics["loss"]
    # the same plain evaluation
    assert smoothed.eval_history[-1]["val_loss"] == pytest.approx(again, rel=1e-6)


def test_a_resumed_runs_wall_time_and_elapsed_clock_count_its_earlier_processes(tmp_path):
    """``wall_time_s`` is the run's, not the last process's: a resumed run (or a finished one entered again,
    as a sweep's second pass does: nothing to train) adds the time its checkpoint had recorded, and the
    history's ``elapsed_s`` goes on from there (the sweep's "which run reached a loss sooner" reads it)."""
    import time

    import pytest

    from fastlm.engine.checkpoint.loading import load_checkpoint

    slow = {"log_every": 1, "save_every": 4, "eval_every": None, "max_steps": 8}

    def interrupt(kind, record):
        time.sleep(0.05)  # at least 0.05 s a step
        if record["step"] == 6:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_toy(toy_params(tmp_path, **slow), callbacks=[interrupt])
    saved = load_checkpoint(tmp_path / "checkpoints" / "checkpoint-00000004", model=None, restore_rng=False)
    assert saved["elapsed_s"] >= 4 * 0.05
    resumed = run_toy(toy_params(tmp_path, **slow, resume="auto"))
    elapsed = [record["elapsed_s"] for record in resumed.history]
    assert elapsed == sorted(elapsed) and elapsed[4] >= saved["elapsed_s"]  # steps 5..8 after step 4's
    assert resumed.summary["wall_time_s"] >= elapsed[-1] > saved["elapsed_s"]
    again = run_toy(toy_params(tmp_path, **slow, resume="auto"))  # finished: nothing to train
    finished = load_checkpoint(
        tmp_path / "checkpoints" / "checkpoint-00000008", model=None, restore_rng=False
    )
    assert again.summary["steps_trained"] == 0 and again.summary["wall_time_s"] >= finished["elapsed_s"]


def test_a_resumed_process_leaves_its_first_step_out_of_the_throughput(tmp_path, monkeypatch):
    """A run stopped by train.max_steps and continued with more steps: the resuming process's first step
    (its warm-up, slowed here by 0.3 s) ran in its first logging window, which the throughput counted (only
    the history's first row was left out), so real_tokens_per_s read a fraction of the steps' speed. Each
    process's first step is now its own row, marked ``warmup`` and left out as the first process's is."""
    import time

    import fastlm.engine.train.loop as loop_module
    from fastlm.engine.observe.rates import timed_rate

    steps = {"log_every": 3, "eval_every": None, "save_every": 6}
    run_toy(toy_params(tmp_path, max_steps=6, **steps))
    real, calls = loop_module.train_step, []

    def slowed_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.3)
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", slowed_first)
    resumed = run_toy(toy_params(tmp_path, max_steps=12, resume="auto", **steps))
    history, summary = resumed.history, resumed.summary
    assert summary["resumed_from_step"] == 6
    assert [record["step"] for record in history] == [1, 3, 6, 7, 9, 12]
    assert [record["step"] for record in history if record.get("warmup")] == [1, 7]
    timed = [record for record in history if record["step"] not in (1, 7)]
    # the windows after each process's first step, weighed by their steps: the same sums in another order
    windows = list(zip(timed, [2, 3, 2, 3], strict=True))
    amount = sum(row["real_tokens_per_s"] * row["step_time_s"] * n for row, n in windows)
    seconds = sum(row["step_time_s"] * n for row, n in windows)
    assert summary["real_tokens_per_s"] == pytest.approx(amount / seconds, rel=1e-9)
    assert summary["real_tokens_per_s"] == pytest.approx(timed_rate(history), rel=1e-12)
    assert history[3]["step_time_s"] >= 0.3  # the warm-up row holds the slowed step alone


def test_a_recompile_after_the_first_step_is_left_out_of_the_throughput_and_recorded_apart(tmp_path):
    """A compiled run compiles again where a micro-batch's shape first varies (dynamo's automatic dynamic
    shapes: the second step of a length-grouped run, 19.4 s of a 0.003 s step on the toy model, cold
    caches): that time landed in its step and window, and the summary's throughput read 20.8 real tokens/s
    where the steps ran at about 14,000. The compile (here one of 0.3 s at step 3, announced by dynamo's own
    compile callbacks, as torch.compile does) is set aside: out of the step times and the windows'
    throughput, summed in the summary's ``compile_s`` and its window's row."""
    import time

    import torch

    from tests.support.toy_training import toy_model

    pause, calls = 0.3, []

    def compiles_at_step_three(module, args, kwargs):
        calls.append(1)
        if len(calls) == 3:  # one micro-batch a step
            with torch._dynamo.callback_handler.install_callbacks(
                torch._dynamo.callback.CallbackTrigger.DYNAMO, "0/1"
            ):
                time.sleep(pause)

    model = toy_model()
    model.register_forward_pre_hook(compiles_at_step_three, with_kwargs=True)
    params = toy_params(
        tmp_path,
        max_steps=8,
        log_every=4,
        eval_every=None,
        runtime={"precision": "fp32", "compile": False},  # no probe pass: one forward a step
    )
    result = run_toy(params, model=model)
    summary = result.summary
    assert len(calls) == 8
    assert max(result.step_times[1:]) < pause
    assert summary["compile_s"] >= pause
    assert [row["compile_s"] >= pause for row in result.history] == [False, True, False]
    # the windows' wall clock and the steps' own time agree once the compile is out of both (eager toy steps
    # of a few ms: the flushes and the loop's own work are what differs)
    assert summary["real_tokens_per_s"] > 0.5 * summary["steady_real_tokens_per_s"]
    assert summary["steady_real_tokens_per_s"] > summary["tokens_seen"] / pause


def test_each_evaluation_records_its_seconds_and_the_summary_their_total(tmp_path, monkeypatch):
    """Validation took time no row said: the eval history had no seconds and the summary only the evaluations
    and saves together (``outside_steps_s``). Each validation here is slowed by a pause per batch and timed
    around the call the run makes: its row's ``eval_s`` is that time (plus the loop's few microseconds), the
    summary's ``eval_s`` their sum, and neither the step times nor the steady throughput hold it."""
    import time

    from fastlm.engine.evaluate import evaluation
    from fastlm.engine.train import build

    # A pause well above a loaded 2-core host's toy step (0.036 s in CI), so that three steady steps stay
    # clear of one validation's two pauses however slowly the host runs them.
    pause, forward, evaluate = 0.3, evaluation.forward_logits, build.evaluate
    taken: list[float] = []

    def slowed(model, batch):
        time.sleep(pause)
        return forward(model, batch)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        report = evaluate(*args, **kwargs)
        taken.append(time.perf_counter() - start)
        return report

    monkeypatch.setattr(evaluation, "forward_logits", slowed)
    monkeypatch.setattr(build, "evaluate", timed)
    result = run_toy(toy_params(tmp_path, max_steps=4, log_every=2, eval_every=2, eval_max_batches=2))
    rows, summary = result.eval_history, result.summary
    assert [row["step"] for row in rows] == [2, 4] and len(taken) == 2
    for row, seconds in zip(rows, taken, strict=True):
        assert 2 * pause <= seconds <= row["eval_s"] < seconds + 0.05  # two slowed batches each
    assert summary["eval_s"] == pytest.approx(sum(row["eval_s"] for row in rows), abs=1e-3)  # rounded to ms
    assert summary["eval_s"] <= summary["outside_steps_s"] + 1e-3
    assert max(result.step_times) < pause  # no evaluation in a step's time
    steady_time = sum(result.step_times[1:])
    assert steady_time < 2 * pause


def compiled_with_eager_backend(monkeypatch) -> None:
    """``torch.compile`` with dynamo's ``eager`` backend from here on: dynamo traces, guards and recompiles as
    under inductor, without generating kernels (a compile of the toy layer in well under a second)."""
    import torch

    real_compile = torch.compile

    def eager_backend(model=None, **kwargs):
        return real_compile(model, backend="eager", dynamic=kwargs.get("dynamic"))

    torch._dynamo.reset()  # no graphs of earlier tests' models in the caches dynamo counts against its limit
    monkeypatch.setattr(torch, "compile", eager_backend)


def compiled_run(tmp_path, max_steps: int):
    """The toy Llama compiled by layers, length-grouped: each micro-batch has its own row length."""
    return toy_params(
        tmp_path,
        max_steps=max_steps,
        log_every=max_steps,
        eval_every=None,
        batching={"mode": "length_grouped", "micro_batch_size": 4},
        runtime={"precision": "fp32", "compile": True, "compile_scope": "layers"},
    )


def test_a_compiled_run_of_many_shapes_compiles_a_bounded_number_of_times(tmp_path, monkeypatch):
    """40 length-grouped steps, each micro-batch of its own row length: dynamo compiles the layer static,
    then once more with the length dynamic (automatic dynamic shapes), and no more however many lengths
    follow; the summary counts the compiles and says dynamo's recompile limit was not reached."""
    compiled_with_eager_backend(monkeypatch)
    result = run_toy(compiled_run(tmp_path, max_steps=40))
    assert result.summary["compiled"] is True
    assert 1 <= result.summary["compiles"] <= 3
    assert result.summary["recompile_limit_hit"] is False
    assert result.summary["recompile_limit_functions"] == []


def test_a_run_past_dynamos_recompile_limit_says_so_once_and_records_it(tmp_path, monkeypatch, caplog):
    """Past ``torch._dynamo.config.recompile_limit`` dynamo runs the frame eagerly for the rest of the run,
    and says so only in its own log: the run says it once, naming the function, the guard that failed and
    the fix, and the summary records it beside ``compiled``. The limit is lowered to 1 here: the second
    row length reaches it."""
    import logging

    import torch

    compiled_with_eager_backend(monkeypatch)
    with torch._dynamo.config.patch(recompile_limit=1), caplog.at_level(logging.WARNING, logger="fastlm"):
        result = run_toy(compiled_run(tmp_path, max_steps=6))
    said = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("fastlm") and "recompile" in r.getMessage()
    ]
    assert len(said) == 1
    assert "forward_with_checkpointing" in said[0] and "size mismatch" in said[0] and "Fix:" in said[0]
    assert result.summary["recompile_limit_hit"] is True
    assert result.summary["compiles"] >= 1
    assert [name.split(" ")[0] for name in result.summary["recompile_limit_functions"]] == [
        "forward_with_checkpointing"
    ]


def test_the_compile_auto_probes_compile_is_counted_in_compile_s(tmp_path, monkeypatch):
    """``compile: auto`` compiles and measures before the step clocks start: that compile (here one of 0.3 s
    announced by dynamo's compile callbacks, as torch.compile does) is the run's too, so the summary's
    ``compile_s`` holds it, and ``compile_probe_s`` says how much of it the probe took."""
    import time

    import torch

    import fastlm.engine.runtime.probe as probe

    pause = 0.3

    class Compiled(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self._orig_mod, self.calls = model, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            if self.calls == 1:  # the probe's first compiled pass compiles
                with torch._dynamo.callback_handler.install_callbacks(
                    torch._dynamo.callback.CallbackTrigger.DYNAMO, "0/0"
                ):
                    time.sleep(pause)
            return self._orig_mod(*args, **kwargs)

    real_measure = probe.forward_backward_seconds

    def measure(model, batch, runtime):  # compiled twice as fast: auto keeps it
        real_measure(model, batch, runtime)
        return 50.0 if isinstance(model, Compiled) else 100.0

    monkeypatch.setattr(probe, "forward_backward_seconds", measure)
    monkeypatch.setattr(probe, "compile_module", lambda model, scope="model", mode="default": Compiled(model))
    params = toy_params(
        tmp_path, max_steps=3, log_every=3, eval_every=None, runtime={"precision": "fp32", "compile": "auto"}
    )
    result = run_toy(params)
    assert result.runtime.compile is True and "measured" in result.runtime.compile_choice
    assert result.summary["compile_probe_s"] >= pause
    assert result.summary["compile_s"] >= result.summary["compile_probe_s"]
    assert result.summary["compile_s"] < result.summary["wall_time_s"]


def test_a_packed_runs_auto_row_length_is_said_once_and_recorded(tmp_path, caplog):
    """``row_length: auto`` chooses the packed rows' length from the data (at most ``max_length``, the bound
    the attention choice reads): the start line says the rows built, once, and the summary's ``row_length``
    is their length (None where nothing is packed)."""
    import logging

    from fastlm.engine.runtime.environment import setup_runtime
    from fastlm.engine.train.loop import train

    widths = []

    def run(params):
        model = toy_model()
        model.register_forward_pre_hook(
            lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
        )
        runtime = setup_runtime(params.runtime, seed=params.seed)
        data = toy_sequences(300, 1)
        return train(
            model, data, None, params=params, runtime=runtime, pad_id=EOS, max_length=128, attn="sdpa"
        )

    packed = toy_params(
        tmp_path, max_steps=2, eval_every=None, batching={"mode": "packed", "row_length": "auto"}
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fastlm"):
        result = run(packed)
    assert len(set(widths)) == 1 and widths[0] < 128  # shorter than max_length: chosen, not the bound
    assert result.summary["row_length"] == widths[0]
    said = [message for message in caplog.messages if f"rows of {widths[0]} tokens" in message]
    assert len(said) == 1 and "row_length auto" in said[0], caplog.messages
    grouped = toy_params(
        tmp_path / "grouped", max_steps=1, eval_every=None, batching={"mode": "length_grouped"}
    )
    assert run(grouped).summary["row_length"] is None
