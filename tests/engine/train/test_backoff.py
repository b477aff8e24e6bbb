"""Out of memory in a training step: opt-in back-off (half micro-batch, double accumulation) or one clear
line.

A real CUDA OOM cannot happen on the CPU machines that run the suite, so the step raises
``torch.OutOfMemoryError`` (what PyTorch raises on CUDA) whenever a micro-batch holds more rows than a budget.
"""

import multiprocessing

import pytest

from fastlm.engine.train.backoff import OutOfMemory
from tests.support.toy_training import run_toy, toy_params


@pytest.mark.parametrize("mode", ["packed", "dynamic"])
def test_backoff_halves_the_micro_batch_keeps_the_effective_batch_and_finishes(
    tmp_path, memory_for_rows, mode, caplog
):
    seen = memory_for_rows(2)
    params = toy_params(
        tmp_path, batching={"mode": mode, "micro_batch_size": 8, "oom_backoff": True}, max_steps=12
    )
    with caplog.at_level("WARNING"):
        result = run_toy(params)
    assert result.summary["oom_backoffs"] == [
        {"step": 1, "micro_batch_size": 4, "gradient_accumulation_steps": 2},
        {"step": 1, "micro_batch_size": 2, "gradient_accumulation_steps": 4},
    ]
    assert result.summary["effective_batch"] == 8 and result.summary["steps"] == 12
    assert [r["step"] for r in result.history][-1] == 12 and max(seen[2:]) <= 2
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert "effective batch is unchanged" in caplog.text


def test_a_backoff_ends_the_old_streams_persistent_workers(tmp_path, memory_for_rows):
    """The back-off's stream (the batches cut in pieces) starts its own loader workers: the old stream's
    persistent ones end then, and the last stream's with the run."""
    memory_for_rows(4)
    params = toy_params(
        tmp_path,
        batching={"mode": "dynamic", "micro_batch_size": 8, "oom_backoff": True},
        dataloader={"num_workers": 2, "persistent_workers": True, "prefetch_factor": 2},
        max_steps=4,
        log_every=1,
        eval_every=None,
    )
    before = {child.pid for child in multiprocessing.active_children()}
    alive = []  # the run's processes at each step

    def children(kind, record):
        alive.append({child.pid for child in multiprocessing.active_children()} - before)

    result = run_toy(params, callbacks=[children])
    assert len(result.summary["oom_backoffs"]) == 1 and result.summary["steps"] == 4
    assert alive and all(len(pids) == 2 for pids in alive)  # the back-off's 2 workers, the old ones ended
    assert {child.pid for child in multiprocessing.active_children()} == before


def test_without_backoff_out_of_memory_is_one_line_pointing_to_tune(tmp_path, memory_for_rows):
    memory_for_rows(2)
    with pytest.raises(
        OutOfMemory,
        match=r"ran out of memory at step 1 with micro_batch_size 4 .*pipeline=tune.*"
        r"oom_backoff: true",
    ) as caught:
        run_toy(toy_params(tmp_path, batching={"micro_batch_size": 4}))
    assert "\n" not in str(caught.value)


def test_backoff_stops_at_one_row(tmp_path, memory_for_rows):
    memory_for_rows(0)
    with pytest.raises(OutOfMemory, match="micro_batch_size 1"):
        run_toy(toy_params(tmp_path, batching={"micro_batch_size": 2, "oom_backoff": True}))


def _each_sample_trained_once_an_epoch_of_two(trained: list, result) -> None:
    from collections import Counter

    from tests.support.toy_training import toy_sequences

    data = toy_sequences(300, 1)
    samples = Counter(
        tuple(int(token) for token in data.values[start:end])
        for start, end in zip(data.offsets[:-1], data.offsets[1:], strict=True)
    )
    assert Counter(trained) == samples + samples
    assert result.history[-1]["epoch"] == 2.0 and result.summary["epochs"] == 2.0


def _two_epochs_backing_off(tmp_path, batching: dict):
    """Two epochs of ``batching`` with the out-of-memory back-off on, a history record every step."""
    return toy_params(
        tmp_path,
        batching={**batching, "oom_backoff": True},
        max_steps=None,
        epochs=2,
        eval_every=None,
        log_every=1,
    )


def _out_of_memory_once_at(monkeypatch, call: int, trained: list):
    """The ``call``-th step runs out of memory once; ``trained`` gets each trained sample's tokens."""
    import torch

    import fastlm.engine.train.step as step_module

    real, calls = step_module.accumulate_gradients, [0]

    def accumulate(model, micro_batches, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for batch in micro_batches:
            for row, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), strict=True):
                trained.append(
                    tuple(token for token, real_token in zip(row, mask, strict=True) if real_token)
                )
        return real(model, micro_batches, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", accumulate)


@pytest.mark.parametrize("call", [3, 10], ids=["a_step", "the_epochs_short_last_step"])
def test_an_out_of_memory_step_is_redone_with_its_own_samples(tmp_path, monkeypatch, call):
    """length_grouped, 38 micro-batches of 8 an epoch, accumulation 4 (step 10 holds the last 2): the retry
    rebuilt the epoch's batches at half the size, which the sampler partitions otherwise (its mega-batches
    are counted in batches), so 56 samples were trained twice and 56 never (8 and 12 at the short step,
    whose micro-batches the restart also miscounted). The retry cuts the configured batches in halves:
    each sample of the epoch is trained once."""
    from collections import Counter

    from tests.support.toy_training import toy_sequences

    trained = []
    _out_of_memory_once_at(monkeypatch, call, trained)
    batching = {"mode": "length_grouped", "micro_batch_size": 8, "gradient_accumulation_steps": 4}
    params = toy_params(
        tmp_path, batching={**batching, "oom_backoff": True}, max_steps=None, epochs=1, eval_every=None
    )
    result = run_toy(params)
    assert result.summary["oom_backoffs"][0]["micro_batch_size"] == 4
    data = toy_sequences(300, 1)
    samples = Counter(
        tuple(int(token) for token in data.values[start:end])
        for start, end in zip(data.offsets[:-1], data.offsets[1:], strict=True)
    )
    assert Counter(trained) == samples


def test_the_history_counts_epochs_in_the_batches_it_reads_after_a_back_off(tmp_path, memory_for_rows):
    """After a back-off the stream counts half-size batches: the history's epoch divided them by the
    configured epoch's batches (1.92 at the end of the first of two epochs, 2.92 at the end)."""
    memory_for_rows(2)
    params = _two_epochs_backing_off(tmp_path, {"micro_batch_size": 4, "gradient_accumulation_steps": 3})
    result = run_toy(params)
    assert result.summary["oom_backoffs"]
    epochs = [row["epoch"] for row in result.history]
    assert epochs == sorted(epochs) and epochs[-1] == 2.0 and 1.0 in epochs


def _packed_samples(batch: dict) -> list[tuple]:
    """The tokens of each sample a packed micro-batch holds (its segments of real tokens)."""
    ids, segments, real = batch["input_ids"], batch["sequence_ids"], batch["real_mask"]
    return [
        tuple(ids[row][(segments[row] == segment) & real[row]].tolist())
        for row in range(ids.shape[0])
        for segment in segments[row][real[row]].unique().tolist()
    ]


@pytest.mark.parametrize("call", [3, 10], ids=["a_step", "the_epochs_short_last_step"])
def test_a_packed_out_of_memory_step_is_redone_with_its_own_samples(tmp_path, monkeypatch, call):
    """packed, rows of 48 tokens: micro-batches of 4 x 64 tokens hold 5 rows; halved, the retry packed
    2-row batches again, so 20 samples were trained twice and 80 never in two epochs, and the history's epoch
    ended at 1.7059. The retry cuts the configured batches' rows in halves (3 and 2): each sample is trained
    once an epoch and the epochs end on the planned steps."""

    import torch

    import fastlm.engine.train.step as step_module

    real, calls, trained = step_module.accumulate_gradients, [0], []

    def accumulate(model, micro_batches, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        trained.extend(sample for batch in micro_batches for sample in _packed_samples(batch))
        return real(model, micro_batches, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", accumulate)
    batching = {"mode": "packed", "micro_batch_size": 4, "gradient_accumulation_steps": 3, "row_length": 48}
    params = _two_epochs_backing_off(tmp_path, batching)
    result = run_toy(params)
    assert result.summary["oom_backoffs"][0]["micro_batch_size"] == 2
    _each_sample_trained_once_an_epoch_of_two(trained, result)


def test_backoff_refuses_a_packed_micro_batch_of_one_row(tmp_path, memory_for_rows):
    """Rows of 96 tokens: a micro-batch of 2 x 64 tokens is one row, which halving cannot shrink (the retry
    ran the same row with twice the accumulation: twice the effective batch)."""
    from fastlm.errors import ConfigError

    memory_for_rows(0)
    batching = {"mode": "packed", "micro_batch_size": 2, "row_length": 96, "oom_backoff": True}
    with pytest.raises(ConfigError, match=r"oom_backoff cannot cut a packed micro-batch of 1 row") as caught:
        run_toy(toy_params(tmp_path, batching=batching))
    assert "\n" not in str(caught.value)


def _fail_above_and_record(monkeypatch, limit: int, packed: bool, trained: list) -> None:
    """A step of a micro-batch of more than ``limit`` rows runs out of memory; ``trained`` gets each sample a
    step that ran trained."""
    import torch

    import fastlm.engine.train.step as step_module

    real = step_module.accumulate_gradients

    def accumulate(model, micro_batches, **kwargs):
        if max(batch["input_ids"].shape[0] for batch in micro_batches) > limit:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        for batch in micro_batches:
            if packed:
                trained.extend(_packed_samples(batch))
                continue
            for row, mask in zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist(), strict=True):
                trained.append(tuple(token for token, keep in zip(row, mask, strict=True) if keep))
        return real(model, micro_batches, **kwargs)

    monkeypatch.setattr(step_module, "accumulate_gradients", accumulate)


@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
@pytest.mark.parametrize(
    ("micro", "limit", "sizes"), [(6, 2, [3, 2]), (8, 1, [4, 2, 1])], ids=["six", "eight_to_one"]
)
def test_backoff_of_any_micro_batch_trains_each_sample_once_an_epoch(
    tmp_path, monkeypatch, mode, micro, limit, sizes, caplog
):
    """Micro-batch 6 halved twice: it went to 3 and 1 (rounded down) while the stream cut each configured
    batch in 6 // 1 = 6 pieces and the accumulation grew 4 times, so a step covered 4/6 of its batches and
    the run ended on the planned steps with part of the data never trained. The pieces are 2 ** halvings,
    each at most ceil(6 / 4) = 2 samples (packed: rows), the accumulation x 4. Micro-batch 8 halved three
    times: the epoch's short batch (4 samples) is cut in 8 pieces too, some of them empty."""

    trained: list = []
    _fail_above_and_record(monkeypatch, limit, mode == "packed", trained)
    batching = {"mode": mode, "micro_batch_size": micro, "gradient_accumulation_steps": 3}
    if mode == "packed":  # rows of 64 tokens: the micro-batch's 6 (8) x 64 tokens are 6 (8) rows
        batching["row_length"] = 64
    params = _two_epochs_backing_off(tmp_path, batching)
    with caplog.at_level("WARNING"):
        result = run_toy(params)
    _each_sample_trained_once_an_epoch_of_two(trained, result)
    assert [row["micro_batch_size"] for row in result.summary["oom_backoffs"]] == sizes
    assert [row["gradient_accumulation_steps"] for row in result.summary["oom_backoffs"]] == [
        3 * 2 ** (h + 1) for h in range(len(sizes))
    ]
    assert result.summary["effective_batch"] == micro * 3
    if mode != "packed":
        assert f"micro_batch_size {sizes[-1]} x gradient_accumulation_steps" in caplog.text


def _losses_at_one_row(tmp_path, monkeypatch, mode: str, micro: int, **settings):
    """Per-step losses of ``mode`` at micro-batch ``micro`` (packed: rows of 64 tokens, ``micro`` rows), 2
    micro-batches a step, a history row every step: an unlimited run, and a run whose every micro-batch of
    more than one row runs out of memory; each with the samples its trained steps held."""
    batching = {
        "mode": mode,
        "micro_batch_size": micro,
        "gradient_accumulation_steps": 2,
        "oom_backoff": True,
    }
    if mode == "packed":
        batching["row_length"] = 64
    params = toy_params(tmp_path, batching=batching, max_steps=8, eval_every=None, log_every=1, **settings)
    everything: list = []
    _fail_above_and_record(monkeypatch, 2 * micro, mode == "packed", everything)
    unlimited = run_toy(params)
    monkeypatch.undo()  # the real step again, under the limited one
    trained: list = []
    _fail_above_and_record(monkeypatch, 1, mode == "packed", trained)
    return (unlimited, everything), (run_toy(params), trained)


@pytest.mark.kernels  # per-step losses of two batchings compared with a tolerance
@pytest.mark.parametrize("mode", ["packed", "length_grouped", "dynamic"])
@pytest.mark.parametrize(("micro", "sizes"), [(3, [2, 1]), (6, [3, 2, 1])], ids=["three", "six"])
def test_backoff_of_a_micro_batch_of_fewer_rows_than_pieces_reaches_one_with_the_same_losses(
    tmp_path, monkeypatch, mode, micro, sizes, caplog
):
    """Micro-batch 3 (6) out of memory at every size above 1: halved to 2 then 1 (3, 2, 1), each configured
    batch cut in 4 (8) pieces of one sample (packed: row), the last piece(s) of each empty, counted as
    positions and skipped. Was: refused at the last halving (`cannot cut a micro-batch of 3 samples in 4`,
    packed `... of 3 row(s) ... in 4`) though micro-batch 1 was never tried. Each step trains the
    configured step's samples with the same token-weighted mean loss as the unlimited run."""
    from collections import Counter

    from tests.support.tolerances import TRAINED_FP32_LOSS_REL

    with caplog.at_level("WARNING"):
        (unlimited, everything), (backed_off, trained) = _losses_at_one_row(
            tmp_path, monkeypatch, mode, micro
        )
    pieces = 2 ** len(sizes)
    assert f"cut in {pieces} pieces of at most 1, the last {pieces - micro} empty, skipped" in caplog.text
    assert [row["micro_batch_size"] for row in backed_off.summary["oom_backoffs"]] == sizes
    assert backed_off.summary["oom_backoffs"][-1]["gradient_accumulation_steps"] == 2 * 2 ** len(sizes)
    assert backed_off.summary["effective_batch"] == unlimited.summary["effective_batch"] == 2 * micro
    assert [row["step"] for row in backed_off.history] == [row["step"] for row in unlimited.history]
    assert list(range(1, 9)) == [row["step"] for row in unlimited.history]
    for row, reference in zip(backed_off.history, unlimited.history, strict=True):
        assert (row["lr"], row["epoch"]) == (reference["lr"], reference["epoch"])
        assert row["loss"] == pytest.approx(reference["loss"], rel=TRAINED_FP32_LOSS_REL)
    assert Counter(trained) == Counter(everything) and len(everything) >= 8 * 2 * micro // 2


@pytest.mark.parametrize("mode", ["packed", "dynamic"])
def test_a_checkpoint_saved_at_micro_batch_one_of_three_resumes_onto_the_same_samples(
    tmp_path, monkeypatch, mode
):
    """Micro-batch 3 backed off to 1 (4 pieces a configured batch, one empty) and saved every 2 steps; a run
    stopped after step 3 resumes from step 2's checkpoint at micro-batch 1 onto the same samples: the same
    per-step losses as the run that went straight through (the same computation: exact)."""
    batching = {"mode": mode, "micro_batch_size": 3, "gradient_accumulation_steps": 2, "oom_backoff": True}
    if mode == "packed":
        batching["row_length"] = 64
    settings = {"batching": batching, "max_steps": 6, "eval_every": None, "log_every": 1, "save_every": 2}
    _fail_above_and_record(monkeypatch, 1, mode == "packed", [])
    straight = run_toy(toy_params(tmp_path / "straight", **settings))
    assert [row["micro_batch_size"] for row in straight.summary["oom_backoffs"]] == [2, 1]

    def interrupt(kind, record):
        if record["step"] == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_toy(toy_params(tmp_path / "stopped", **settings), callbacks=[interrupt])
    resumed = run_toy(toy_params(tmp_path / "stopped", **settings, resume="auto"))
    assert resumed.summary["resumed_from_step"] == 2 and resumed.summary["oom_backoffs"] == []
    later = [row for row in straight.history if row["step"] > 2]
    assert [row["step"] for row in resumed.history if row["step"] > 2] == [3, 4, 5, 6]
    for row, reference in zip([r for r in resumed.history if r["step"] > 2], later, strict=True):
        assert (row["epoch"], row["loss"]) == (reference["epoch"], reference["loss"])


@pytest.mark.kernels  # the validation losses of two batchings compared with a tolerance
def test_a_validation_out_of_memory_backs_off_on_its_own_and_later_validations_keep_it(
    tmp_path, monkeypatch, caplog
):
    """Validation (packed, 4 rows a micro-batch) runs out of memory above 2 rows: with the back-off on, the
    run goes on, the first validation evaluates again at micro-batch 2, the second starts there (one failed
    attempt in all), and the losses are the ones the validation would have measured in full batches."""
    import torch

    from fastlm.engine.evaluate import evaluation
    from tests.support.tolerances import OTHER_FP32_MODEL

    params = toy_params(tmp_path, batching={"micro_batch_size": 4, "oom_backoff": True})
    full = run_toy(params)
    real, failed = evaluation.forward_logits, []

    def limited(model, batch):
        if batch["input_ids"].shape[0] > 2:
            failed.append(batch["input_ids"].shape[0])
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, batch)

    monkeypatch.setattr(evaluation, "forward_logits", limited)
    with caplog.at_level("WARNING"):
        result = run_toy(params)
    assert failed == [4]
    assert caplog.text.count("evaluating again with micro_batch_size 2") == 1
    assert result.summary["oom_backoffs"] == []  # training never ran out of memory
    assert [r["step"] for r in result.eval_history] == [r["step"] for r in full.eval_history] == [15, 30]
    for backed_off, reference in zip(result.eval_history, full.eval_history, strict=True):
        assert backed_off["val_target_tokens"] == reference["val_target_tokens"]
        assert backed_off["val_loss"] == pytest.approx(reference["val_loss"], rel=OTHER_FP32_MODEL["rtol"])


def test_a_step_that_ran_out_of_memory_keeps_its_failed_attempt_out_of_the_step_times(tmp_path, monkeypatch):
    """Step 3's first attempt ran 0.3 s, then out of memory, and was redone at half the micro-batch: its
    time landed in the redone step's (``step_time_max_s``, the percentiles, the steady throughput). The
    failed attempt's time is counted apart and named (``oom_failed_s``)."""
    import time

    import torch

    import fastlm.engine.train.loop as loop_module

    pause, real, calls = 0.3, loop_module.train_step, []

    def third_runs_out(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            time.sleep(pause)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, **kwargs)

    monkeypatch.setattr(loop_module, "train_step", third_runs_out)
    params = toy_params(
        tmp_path, batching={"micro_batch_size": 4, "oom_backoff": True}, max_steps=6, eval_every=None
    )
    result = run_toy(params)
    summary = result.summary
    assert [backoff["step"] for backoff in summary["oom_backoffs"]] == [3] and len(result.step_times) == 6
    assert max(result.step_times) < pause and summary["step_time_max_s"] < pause
    assert summary["oom_failed_s"] >= pause
