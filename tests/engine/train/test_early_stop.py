"""train.early_stopping: stop at a step boundary once the validation loss stops improving, keep the best
checkpoint, write the best model, say which, and resume with the same bookkeeping."""

import math

import pytest
import torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.config import parse_train_params
from fastlm.engine.train.early_stop import EarlyStopping
from fastlm.errors import ConfigError
from tests.support.toy_training import run_toy, toy_params

pytestmark = (
    pytest.mark.kernels
)  # bf16 weights trained and evaluated again: run under other CPU kernel sets too


def test_patience_counts_evaluations_without_an_improvement_of_min_delta():
    early = EarlyStopping(patience=2, min_delta=0.1)
    assert early.update(10, 3.0) and early.best == 3.0 and early.best_step == 10
    # better by less than min_delta: the best model (the one kept), but a step of patience used
    assert early.update(20, 2.95) and early.best_step == 20 and early.bad_evals == 1 and not early.should_stop
    assert early.update(30, 2.5) and early.bad_evals == 0  # min_delta below 3.0, the last reset
    assert not early.update(40, 2.6) and not early.update(50, 2.7) and early.should_stop
    assert (early.best, early.best_step) == (2.5, 30)
    # what a checkpoint keeps
    assert EarlyStopping.from_record(early.record(), patience=2, min_delta=0.1) == early
    assert not early.update(60, math.nan)  # a NaN never counts as best


def test_the_stop_names_the_improvement_min_delta_asks_for():
    """Patience ran out on evaluations of which the last was the lowest loss (better by less than min_delta):
    the stop said "no validation-loss improvement in 2 evaluations; the best was step 15", the best step one
    of those evaluations. It names the improvement counted: more than min_delta (none: any)."""
    early = EarlyStopping(patience=2, min_delta=0.005)
    for step, loss in ((6, 6.3413), (9, 6.3336), (12, 6.3339), (15, 6.3322)):
        early.update(step, loss)
    assert early.should_stop and early.best_step == 15
    said = early.without_improvement()
    assert (
        f"improvement of more than {early.min_delta:g}" in said
        and f"in {early.bad_evals} evaluations" in said
    )
    plain = EarlyStopping(patience=1)
    plain.update(1, 2.0), plain.update(2, 2.0)
    assert plain.without_improvement() == f"no validation-loss improvement in {plain.bad_evals} evaluations"


def test_the_model_kept_is_the_lowest_loss_even_when_min_delta_stops_the_run():
    """min_delta decides when patience runs out, not which model is kept: a run whose last evaluations
    improved, each by less than min_delta, keeps (and writes, and reports) the lowest validation loss, as
    the Trainer's load_best_model_at_end does; improvements add up against min_delta from the last reset."""
    early = EarlyStopping(patience=2, min_delta=0.6)
    for step, loss in ((40, 3.4), (45, 2.6795), (50, 2.5238), (55, 2.4298)):
        early.update(step, loss)
    assert early.should_stop and (early.best_step, early.best) == (55, 2.4298)
    slow = EarlyStopping(patience=3, min_delta=0.25)
    for step, loss in enumerate((3.0, 2.9, 2.8, 2.7), start=1):  # 0.3 below 3.0 after three evaluations
        slow.update(step, loss)
    assert slow.bad_evals == 0 and not slow.should_stop and slow.best_step == 4


def test_a_checkpoint_of_the_former_bookkeeping_resumes_with_its_best_as_the_reference():
    """A checkpoint written before the reference was kept apart from the best: its best is both."""
    early = EarlyStopping.from_record(
        {"best": 2.5, "best_step": 30, "bad_evals": 1}, patience=3, min_delta=0.1
    )
    assert early.reference == 2.5
    assert early.update(40, 2.45) and early.bad_evals == 2 and early.best_step == 40
    assert early.update(50, 2.35) and early.bad_evals == 0 and early.reference == 2.35


def test_a_run_resumed_with_another_min_delta_recounts_its_evaluations_under_it():
    """A run early stopping ended, entered again with another ``min_delta``, said "nothing to train" from
    the counter kept under the old one. The checkpoint holds every evaluation and now records the min_delta
    it counted under (and the evaluations that used no patience): the count is redone under this run's, so
    a looser min_delta lets the run continue; a checkpoint that recorded none keeps its count."""
    early = EarlyStopping(patience=2, min_delta=0.1)
    evaluations = [
        {"step": step, "val_loss": loss} for step, loss in ((10, 3.0), (20, 2.95), (25, 2.9), (30, 2.92))
    ]
    for row in evaluations:
        early.update(row["step"], row["val_loss"], scheduled=row["step"] != 25)  # 25: a time-budget stop's
    assert early.should_stop and early.best_step == 25
    looser = EarlyStopping.from_record(early.record(), patience=2, min_delta=0.01, evaluations=evaluations)
    assert (looser.bad_evals, looser.reference, looser.best_step) == (0, 2.92, 25) and not looser.should_stop
    same = EarlyStopping.from_record(early.record(), patience=2, min_delta=0.1, evaluations=evaluations)
    assert same == early
    unrecorded = {
        key: value for key, value in early.record().items() if key in ("best", "best_step", "bad_evals")
    }
    older = EarlyStopping.from_record(unrecorded, patience=2, min_delta=0.01, evaluations=evaluations)
    assert older.bad_evals == 2 and older.should_stop


def run(tmp_path, attn: str = "sdpa", **overrides):
    settings = {
        "max_steps": 30,
        "log_every": 1,
        "eval_every": 2,
        "save_every": 10,
        "keep_last": 1,
        "optimizer": {"lr": 0.3, "warmup_steps": 0, "decay": "constant"},  # too high: it gets worse
        "early_stopping": {"patience": 2},
        **overrides,
    }
    return run_toy(toy_params(tmp_path, **settings), attn=attn)


@pytest.mark.parametrize(
    ("runtime", "early_stopping"),
    [
        ({}, {"patience": 2}),
        # bf16 weights: the best step's fp32 masters come back. Whether lr 0.3 makes bf16 training worse
        # depends on the CPU's bf16 kernels (on ATen's default set it kept improving): a min_delta no
        # evaluation reaches after the first makes the first one the best, on every kernel set
        ({"precision": "bf16", "param_dtype": "bf16"}, {"patience": 2, "min_delta": 100.0}),
    ],
    ids=["fp32", "bf16-weights"],
)
def test_a_run_stops_once_patience_runs_out_and_writes_the_best_model(tmp_path, runtime, early_stopping):
    # bf16: the eager attention path (run_toy's docstring)
    result = run(
        tmp_path, runtime=runtime, early_stopping=early_stopping, attn="eager" if runtime else "sdpa"
    )
    summary, evals = result.summary, result.eval_history
    losses = [record["val_loss"] for record in evals]
    best = min(range(len(losses)), key=losses.__getitem__)  # the model kept: the lowest loss
    assert summary["stopped_by"] == "early stopping" and summary["steps"] < 30
    if "min_delta" in early_stopping:  # no evaluation is min_delta below the first: patience runs out at 3
        assert len(losses) == 3
    else:
        assert len(losses) == best + 1 + 2  # two evaluations without an improvement after the best one
    early = summary["early_stopping"]
    assert early["best_step"] == evals[best]["step"] and early["best_val_loss"] == losses[best]
    assert early["model_from_step"] == early["best_step"]
    # the figures of the model the run returns (the report's, the sweep's and the run comparison's)
    assert summary["final_val_loss"] == losses[best] and summary["last_val_loss"] == losses[-1]
    assert summary["final_val_perplexity"] == evals[best]["val_perplexity"]
    # the kept step's train loss beside it (the end-of-run line pairs them); final_train_loss the last step's
    losses_by_step = {record["step"]: record["loss"] for record in result.history}
    assert summary["model_train_loss"] == losses_by_step[early["best_step"]]
    assert summary["final_train_loss"] == result.history[-1]["loss"]
    assert result.history[-1]["step"] == summary["steps"]
    from fastlm.reporting.summaries import end_of_run_losses

    said = end_of_run_losses(summary)
    if early["best_step"] < summary["steps"]:  # two pairs, each named by its step
        assert (
            said.startswith(f"the model is step {early['best_step']}'s")
            and f"step, {summary['steps']}:" in said
        )
    else:  # the best is the last step: one pair
        assert said == f"train loss {summary['final_train_loss']:.4f}, validation loss {losses[best]:.4f}"
    best_folder = tmp_path / "checkpoints" / f"checkpoint-{early['best_step']:08d}"
    assert early["best_checkpoint"] == str(best_folder) and best_folder.is_dir()  # kept despite keep_last 1
    assert latest_checkpoint(tmp_path / "checkpoints").name == f"checkpoint-{summary['steps']:08d}"
    from fastlm.engine.evaluate.evaluation import evaluate
    from tests.support.toy_training import EOS, toy_sequences

    # the model returned is the best one: evaluated again as the run evaluated it (bf16 weights: its fp32
    # masters cast to bf16 as the run's weights were, the run's autocast and attention path), the best loss
    evaluated = result.model
    if runtime:
        import copy

        evaluated = copy.deepcopy(result.model)
        for param in evaluated.parameters():
            param.data = param.data.to(torch.bfloat16)
    again = evaluate(
        evaluated,
        toy_sequences(40, 2),
        params=toy_params(tmp_path / "x"),
        runtime=result.runtime,
        pad_id=EOS,
        max_length=64,
        attn="eager" if runtime else "sdpa",
    ).metrics["loss"]
    assert again == pytest.approx(losses[best], rel=1e-6)  # the same computation
    import safetensors.torch

    saved = safetensors.torch.load_file(str(best_folder / "model.safetensors"))
    for name, param in result.model.named_parameters():
        assert param.dtype == torch.float32 and torch.equal(param.detach(), saved[name]), name


def test_a_resumed_run_keeps_the_best_so_far(tmp_path):
    straight = run(tmp_path / "a", save_every=4, runtime={"deterministic": True})

    def interrupt(kind, record):
        if kind == "train" and record["step"] == 4:  # before step 4's evaluation and save
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_toy(
            toy_params(
                tmp_path / "b",
                max_steps=30,
                log_every=1,
                eval_every=2,
                save_every=4,
                keep_last=1,
                optimizer={"lr": 0.3, "warmup_steps": 0, "decay": "constant"},
                early_stopping={"patience": 2},
                runtime={"deterministic": True},
            ),
            callbacks=[interrupt],
        )
    resumed = run(tmp_path / "b", save_every=4, resume="auto", runtime={"deterministic": True})
    # step 4 was interrupted before its save: step 2, the best
    assert resumed.summary["resumed_from_step"] == 2
    assert resumed.summary["early_stopping"]["best_step"] == straight.summary["early_stopping"]["best_step"]
    assert resumed.summary["steps"] == straight.summary["steps"]
    for a, b in zip(straight.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # deterministic mode: the same computation


def test_an_early_stopped_run_is_finished_for_resume_and_for_the_next_unnamed_run(tmp_path, caplog):
    """Early stopping ends a run: asked again (``resume: auto``, the same settings) it trains nothing and
    returns its best model, as a run at its last step does; and it is no "interrupted run" whose name a
    later unnamed run takes (that run superseded its checkpoints and wrote over its model). A larger
    patience continues it."""
    from fastlm.engine.checkpoint.discovery import unfinished_runs

    stopped = run(tmp_path / "runs" / "mine")
    assert stopped.summary["stopped_by"] == "early stopping"
    assert unfinished_runs(tmp_path / "runs" / "mine") == []  # its run folder: checkpoints/
    caplog.set_level("INFO", logger="fastlm")
    again = run(tmp_path / "runs" / "mine", resume="auto")
    assert again.summary["steps_trained"] == 0 and again.summary["steps"] == stopped.summary["steps"]
    assert again.summary["stopped_by"] == "early stopping"
    assert again.summary["early_stopping"]["best_step"] == stopped.summary["early_stopping"]["best_step"]
    for a, b in zip(stopped.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the best step's weights, read back from the same checkpoint
    said = [r.getMessage() for r in caplog.records if "nothing to train" in r.getMessage()]
    assert len(said) == 1 and "early stopping" in said[0] and "train.early_stopping.patience" in said[0]
    longer = run(tmp_path / "runs" / "mine", resume="auto", early_stopping={"patience": 50})
    assert longer.summary["steps_trained"] > 0


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"early_stopping": {"patience": 0}}, "train.early_stopping.patience = 0"),
        (
            {"early_stopping": {"patience": 2}, "eval_every": None},
            "early stopping needs evaluations every N steps",
        ),
    ],
)
def test_bad_early_stopping_settings_are_one_line(settings, expected):
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.")) as raised:
        parse_train_params(settings)
    assert "\n" not in str(raised.value)


def test_a_run_with_too_few_evaluations_to_stop_early_says_so(tmp_path, caplog):
    """eval_every 50 over 6 steps: one evaluation (the last step's), never more than the patience: early
    stopping cannot act, and the run says so at its start (it said nothing)."""
    caplog.set_level("WARNING", logger="fastlm")
    run(tmp_path, max_steps=6, eval_every=50)
    said = [r.getMessage() for r in caplog.records if "cannot stop this run" in r.getMessage()]
    assert len(said) == 1 and "1 evaluation" in said[0] and "train.eval_every" in said[0], said
    caplog.clear()  # patience 2 + the first evaluation: 3 can only stop at the last step, which stops nothing
    run(tmp_path / "just", max_steps=6, eval_every=2)
    assert [r for r in caplog.records if "cannot stop this run" in r.getMessage()]
    caplog.clear()
    run(tmp_path / "enough", max_steps=6, eval_every=1)
    assert not [r for r in caplog.records if "cannot stop this run" in r.getMessage()]


def test_a_time_budget_stop_between_evaluations_uses_no_patience(tmp_path, monkeypatch):
    """train.max_minutes spent between two scheduled evaluations: the stop step is evaluated (a final
    validation loss) and may be the best model, but it is no step of patience. Counted, one worse loss there
    ran patience 1 out: the checkpoint said early stopping ended the run, and ``resume: auto`` trained
    nothing, where the same run without the stop went on to its last step."""
    import itertools

    import fastlm.engine.train.time_limit as budget

    settings = {
        "max_steps": 30,
        "eval_every": 6,
        "save_every": 6,
        "optimizer": {"lr": 0.05, "warmup_steps": 0, "decay": "constant"},
        "early_stopping": {"patience": 1},
        "runtime": {"deterministic": True},
    }
    straight = run(tmp_path / "a", **settings)
    ticks = itertools.count(0.0, 4.0)  # start 0 s, after step k: 4k s; the budget (56 s) spent at step 14
    monkeypatch.setattr(budget, "monotonic", lambda: next(ticks))
    stopped = run(tmp_path / "b", max_minutes=56 / 60, **settings)
    assert stopped.summary["stopped_by"] == "time budget" and stopped.summary["steps"] == 14
    assert [record["step"] for record in stopped.eval_history] == [6, 12, 14]
    losses = {record["step"]: record["val_loss"] for record in stopped.eval_history}
    assert stopped.summary["early_stopping"]["best_step"] == min(losses, key=losses.get)
    assert stopped.summary["final_val_loss"] == min(losses.values())
    monkeypatch.setattr(budget, "monotonic", lambda: 0.0)  # a new budget
    resumed = run(tmp_path / "b", resume="auto", **settings)
    assert resumed.summary["resumed_from_step"] == 14
    assert resumed.summary["steps"] == straight.summary["steps"]
    assert resumed.summary["stopped_by"] == straight.summary["stopped_by"]
    scheduled = [record for record in resumed.eval_history if record["step"] != 14]
    assert [(r["step"], r["val_loss"]) for r in scheduled] == [
        (r["step"], r["val_loss"]) for r in straight.eval_history
    ]  # deterministic mode: the same computation


def test_a_time_budget_stop_before_the_first_scheduled_evaluation_resumes_counting_as_without_it(
    tmp_path, monkeypatch
):
    """The time budget spent at step 4 of a run evaluated every 6 steps: the stop's evaluation is the best so
    far but no reference for the patience (no scheduled evaluation had a loss yet). Resumed, the first
    scheduled evaluation (step 6) sets the reference as in the run without the stop, so both stop at the same
    step with the same model. Was: the checkpoint's empty reference was read as one of the former
    bookkeeping and replaced by the best (step 4's loss), so step 6, not better by min_delta, used the
    patience and the resumed run stopped there, at step 6 instead of 12."""
    import itertools

    import fastlm.engine.train.time_limit as budget

    settings = {
        "max_steps": 30,
        "eval_every": 6,
        "save_every": 6,
        "optimizer": {"lr": 0.05, "warmup_steps": 0, "decay": "constant"},
        "early_stopping": {"patience": 1, "min_delta": 100.0},  # no evaluation beats its reference
        "runtime": {"deterministic": True},
    }
    straight = run(tmp_path / "a", **settings)
    assert straight.summary["stopped_by"] == "early stopping" and straight.summary["steps"] == 12
    ticks = itertools.count(0.0, 4.0)  # after step k: 4k s; the budget (16 s) spent at step 4
    monkeypatch.setattr(budget, "monotonic", lambda: next(ticks))
    stopped = run(tmp_path / "b", max_minutes=16 / 60, **settings)
    assert stopped.summary["stopped_by"] == "time budget" and stopped.summary["steps"] == 4
    monkeypatch.setattr(budget, "monotonic", lambda: 0.0)  # a new budget
    resumed = run(tmp_path / "b", resume="auto", **settings)
    assert resumed.summary["resumed_from_step"] == 4
    assert (resumed.summary["stopped_by"], resumed.summary["steps"]) == ("early stopping", 12)
    scheduled = [(r["step"], r["val_loss"]) for r in resumed.eval_history if r["step"] != 4]
    assert scheduled == [(r["step"], r["val_loss"]) for r in straight.eval_history]


def test_a_record_without_a_reference_yet_keeps_none_and_an_older_one_takes_its_best():
    """``reference`` None in a record (no scheduled evaluation had a finite loss: the best is an off-schedule
    one's) stays None, as the bookkeeping that wrote it holds it; a record without the key at all (written
    before the reference was kept) takes its best."""
    early = EarlyStopping(patience=2, min_delta=0.1)
    early.update(4, 2.0, scheduled=False)  # a time-budget stop's evaluation
    resumed = EarlyStopping.from_record(early.record(), patience=2, min_delta=0.1)
    assert resumed == early and resumed.reference is None
    for row in ((6, 1.95), (12, 1.9)):  # the same evaluations, into both
        assert resumed.update(*row) == early.update(*row)
    assert (resumed.bad_evals, resumed.reference) == (early.bad_evals, early.reference) == (1, 1.95)
    older = EarlyStopping.from_record(
        {"best": 2.0, "best_step": 4, "bad_evals": 0}, patience=2, min_delta=0.1
    )
    assert older.reference == 2.0


def test_a_run_whose_every_evaluation_is_nan_says_so_when_patience_runs_out(tmp_path, monkeypatch, caplog):
    """Every validation loss NaN (a validation split overflowing in fp16, or without targets): patience runs
    out as the Trainer's does, and the stop line says no evaluation had a finite loss. Was: the line named
    ``the best was step None`` and failed to format (a logging traceback in its place)."""
    import fastlm.engine.train.records as records

    evaluation = records.Recorder.evaluation

    def nan_evaluation(self, metrics, **timing):
        return evaluation(self, {**metrics, "loss": math.nan, "perplexity": math.nan}, **timing)

    monkeypatch.setattr(records.Recorder, "evaluation", nan_evaluation)
    caplog.set_level("INFO", logger="fastlm")
    result = run(tmp_path, max_steps=8, save_every=None)
    assert result.summary["stopped_by"] == "early stopping" and result.summary["steps"] == 4
    assert result.summary["early_stopping"]["best_step"] is None
    said = [r.getMessage() for r in caplog.records if "early stopping at step" in r.msg]
    assert said == [
        "early stopping at step 4 of 8: no validation-loss improvement in 2 evaluations; no evaluation had a "
        "finite validation loss (NaN or inf): the model is the last step's"
    ]


def test_a_run_continued_from_another_runs_checkpoint_returns_that_runs_best_model(tmp_path):
    """``train.resume: <a checkpoint folder of another run>`` with early stopping: its best step's checkpoint
    is beside it, in that run's folder. The continued run looked for it in its own folder and, having
    trained, ended in a CheckpointError (``.../b/checkpoints/checkpoint-<best> does not exist``): no model
    written, and the same again on every resume. The best model comes from the folder it is in."""
    stopped = run(tmp_path / "a")
    best = stopped.summary["early_stopping"]["best_step"]
    assert stopped.summary["stopped_by"] == "early stopping" and best < stopped.summary["steps"]
    last = latest_checkpoint(tmp_path / "a" / "checkpoints")
    again = run(tmp_path / "b", resume=str(last))
    early = again.summary["early_stopping"]
    assert again.summary["steps_trained"] == 0 and early["model_from_step"] == best
    assert early["best_checkpoint"] == str(tmp_path / "a" / "checkpoints" / f"checkpoint-{best:08d}")
    for a, b in zip(stopped.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the best step's weights, read back from the same checkpoint


def test_a_run_continued_from_another_runs_checkpoint_resumes_again_with_that_runs_best(tmp_path):
    """The run continued from another run's checkpoint (larger patience: it trains on) writes checkpoints of
    its own whose best step is still the other run's. Resumed again (a stop, or the same command asked
    again), it looked for that best beside its own checkpoint and was refused in one line naming a folder
    that never existed (``.../b/checkpoints/checkpoint-<best> is gone``): it could neither continue nor be
    asked again. Each checkpoint records where its best is."""
    stopped = run(tmp_path / "a")
    best = stopped.summary["early_stopping"]["best_step"]
    best_folder = tmp_path / "a" / "checkpoints" / f"checkpoint-{best:08d}"
    last = latest_checkpoint(tmp_path / "a" / "checkpoints")
    # lr 3 (from 0.3) makes it worse: evaluations none better, then a stop at patience 3, a checkpoint each
    steeper = {"lr": 3.0, "warmup_steps": 0, "decay": "constant"}
    continued = run(
        tmp_path / "b", resume=str(last), early_stopping={"patience": 3}, save_every=2, optimizer=steeper
    )
    assert continued.summary["steps_trained"] > 0
    assert continued.summary["early_stopping"]["best_step"] == best  # still the other run's
    assert continued.summary["early_stopping"]["best_checkpoint"] == str(best_folder)
    again = run(
        tmp_path / "b", resume="auto", early_stopping={"patience": 3}, save_every=2, optimizer=steeper
    )
    assert again.summary["steps_trained"] == 0 and again.summary["early_stopping"]["model_from_step"] == best
    assert again.summary["early_stopping"]["best_checkpoint"] == str(best_folder)
    for a, b in zip(stopped.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)  # the best step's weights, read back from the same checkpoint
    longer = run(
        tmp_path / "b", resume="auto", early_stopping={"patience": 50}, save_every=2, optimizer=steeper
    )
    assert longer.summary["steps_trained"] > 0  # a larger patience continues it


def test_early_stopping_resumed_on_another_validation_subset_starts_fresh_or_is_refused(tmp_path, caplog):
    """``train.eval_max_batches`` changed on resume with early stopping: the best so far was measured on
    other validation batches than the losses to come (1 batch, then all), and was compared with them as if
    they were one measure. ``auto`` starts fresh and says why; a folder named is refused in one line."""
    first = run(tmp_path / "a", max_steps=8, early_stopping={"patience": 50}, eval_max_batches=1)
    assert first.summary["steps"] == 8
    caplog.set_level("INFO", logger="fastlm")
    again = run(tmp_path / "a", max_steps=12, early_stopping={"patience": 50}, resume="auto")
    assert again.summary["steps_trained"] == 12  # from the first step
    (line,) = [r.getMessage() for r in caplog.records if "starting fresh" in r.getMessage()]
    assert "eval_max_batches 1 -> None" in line
    from fastlm.engine.checkpoint.layout import CheckpointError

    last = latest_checkpoint(tmp_path / "a" / "checkpoints")
    with pytest.raises(CheckpointError, match="eval_max_batches"):
        run(
            tmp_path / "b",
            max_steps=12,
            early_stopping={"patience": 50},
            eval_max_batches=2,
            resume=str(last),
        )
    # without early stopping nothing compares them: the run resumes, its validation curve said to change
    plain = run(tmp_path / "c", max_steps=8, early_stopping={"patience": None}, eval_max_batches=1)
    caplog.clear()
    more = run(tmp_path / "c", max_steps=12, early_stopping={"patience": None}, resume="auto")
    assert plain.summary["steps"] == 8 and more.summary["steps_trained"] == 4
    (said,) = [r.getMessage() for r in caplog.records if "eval_max_batches" in r.getMessage()]
    assert "1 -> None" in said and "after step 8" in said and "\n" not in said


def test_a_run_early_stopping_judges_over_when_asked_again_is_finished_for_the_next_unnamed_run(tmp_path):
    """A run stopped by a signal (its checkpoint: not stopped, some evaluations without an improvement),
    asked again with a patience those evaluations use up, trains nothing and returns its best model: it
    finished. Its checkpoint still read "step 12 of 30, not stopped", so the next unnamed run took its name
    and wrote over its model. Now it is finished; a larger patience, by name, still continues it."""
    import os
    import signal

    from fastlm.engine.checkpoint.discovery import unfinished_runs
    from fastlm.engine.train.signals import TrainingInterrupted

    def terminate(kind, record):
        if kind == "train" and record["step"] == 12:
            os.kill(os.getpid(), signal.SIGTERM)

    settings = {
        "max_steps": 30,
        "log_every": 1,
        "eval_every": 2,
        "save_every": 10,
        "optimizer": {"lr": 0.3, "warmup_steps": 0, "decay": "constant"},  # too high: it gets worse
        "resume": "auto",
    }
    base = tmp_path / "ms1"
    with pytest.raises(TrainingInterrupted):
        run_toy(toy_params(base, early_stopping={"patience": 50}, **settings), callbacks=[terminate])
    assert unfinished_runs(base) == [base / "checkpoints"]
    again = run_toy(toy_params(base, early_stopping={"patience": 1}, **settings))
    assert again.summary["steps_trained"] == 0 and again.summary["stopped_by"] == "early stopping"
    assert unfinished_runs(base) == []
    longer = run_toy(toy_params(base, early_stopping={"patience": 50}, **{**settings, "max_steps": 14}))
    assert longer.summary["resumed_from_step"] == 12 and longer.summary["steps_trained"] == 2


def test_early_stopping_off_for_a_resume_and_on_again_counts_from_its_own_evaluations(tmp_path, caplog):
    """Early stopping on (steps 1-4), off for a resumed run (5-8), on again for a later one (9-12): the run
    without it trains and evaluates what early stopping never counted, so the record it was resumed with is
    set aside (its checkpoints keep none, its best checkpoint no longer kept) and said; the run that turns it
    on again counts from its own first evaluation, as a run turning it on for the first time does. Was: the
    record of step 4 came back: its best (step 4) and count judged the evaluations of steps 10-12 as if the
    4 steps between had not been trained, ended the run at step 10 without an improvement, and returned
    step 4's weights."""
    from fastlm.engine.checkpoint.loading import read_checkpoint_state

    first = run(tmp_path, max_steps=4, save_every=2, early_stopping={"patience": 5})
    assert first.summary["early_stopping"]["best_step"] == 4
    caplog.set_level("INFO", logger="fastlm")
    run(tmp_path, max_steps=8, save_every=2, resume="auto", early_stopping={"patience": None})
    (said,) = [r.getMessage() for r in caplog.records if "set aside" in r.getMessage()]
    assert "train.early_stopping" in said and "step 4" in said and "\n" not in said, said
    assert read_checkpoint_state(latest_checkpoint(tmp_path / "checkpoints"))["early_stopping"] == {}
    assert not (tmp_path / "checkpoints" / "checkpoint-00000004").exists()  # keep_last 1: no best kept
    steeper = {"lr": 3.0, "warmup_steps": 0, "decay": "constant"}  # step 10's loss above step 4's
    again = run(
        tmp_path, max_steps=12, save_every=2, resume="auto", early_stopping={"patience": 1}, optimizer=steeper
    )
    assert again.summary["steps_trained"] == 4 and again.summary["stopped_by"] is None
    kept = again.summary["early_stopping"]
    losses = {row["step"]: row["val_loss"] for row in again.eval_history}
    assert losses[10] > losses[4]  # what the stale record judged as no improvement
    assert kept["best_step"] == min((10, 12), key=losses.get) == kept["model_from_step"]


def test_a_run_continued_past_a_last_step_off_the_eval_schedule_stops_where_the_longer_run_does(tmp_path):
    """A 10-step run evaluated every 6 steps also evaluates its last step, 10, off the schedule; continued to
    24 steps (``--params train.max_steps=24``, ``resume: auto``), it must stop where the 24-step run does
    (evaluations at 6, 12, 18 and 24; patience 2 and a min_delta no evaluation reaches: stopped at 18). Was:
    step 10's evaluation used a step of patience as a scheduled one, and the continued run stopped at step
    12, one evaluation early."""
    settings = {
        "eval_every": 6,
        "save_every": 6,
        "optimizer": {"lr": 0.05, "warmup_steps": 0, "decay": "constant"},
        "early_stopping": {"patience": 2, "min_delta": 100.0},  # no evaluation beats its reference
        "runtime": {"deterministic": True},
    }
    straight = run(tmp_path / "a", max_steps=24, **settings)
    assert (straight.summary["stopped_by"], straight.summary["steps"]) == ("early stopping", 18)
    shorter = run(tmp_path / "b", max_steps=10, **settings)
    assert [record["step"] for record in shorter.eval_history] == [6, 10]
    assert shorter.summary["stopped_by"] is None and shorter.summary["steps"] == 10
    losses = {record["step"]: record["val_loss"] for record in shorter.eval_history}
    assert shorter.summary["early_stopping"]["best_step"] == min(losses, key=losses.get)  # 10 may be the best
    continued = run(tmp_path / "b", max_steps=24, resume="auto", **settings)
    assert continued.summary["resumed_from_step"] == 10
    assert (continued.summary["stopped_by"], continued.summary["steps"]) == ("early stopping", 18)
    scheduled = [(r["step"], r["val_loss"]) for r in continued.eval_history if r["step"] != 10]
    assert scheduled == [(r["step"], r["val_loss"]) for r in straight.eval_history]
