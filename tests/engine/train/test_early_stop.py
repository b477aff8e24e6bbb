"""train.early_stopping: stop at a step boundary once the validation loss stops improving, keep the best
checkpoint, write the best model, say which, and resume with the same bookkeeping."""

import math

import pytest
import torch

from fastlm.engine.checkpoint.discovery import latest_checkpoint
from fastlm.engine.config import parse_train_params
from fastlm.engine.train.early_stop import EarlyStopping
from fastlm.errors import ConfigError
from tests.support.tolerances import BF16_MODEL_LOSS_REL
from tests.support.toy_training import run_toy, toy_params

pytestmark = pytest.mark.kernels  # bf16 weights' run evaluated again under autocast over its fp32 masters


def test_patience_counts_evaluations_without_an_improvement_of_min_delta():
    early = EarlyStopping(patience=2, min_delta=0.1)
    assert early.update(10, 3.0) and early.best == 3.0 and early.best_step == 10
    assert not early.update(20, 2.95) and not early.should_stop  # better, but by less than min_delta
    assert early.update(30, 2.5) and early.bad_evals == 0
    assert not early.update(40, 2.6) and not early.update(50, 2.7) and early.should_stop
    # what a checkpoint keeps
    assert EarlyStopping.from_record(early.record(), patience=2, min_delta=0.1) == early
    assert not early.update(60, math.nan)  # a NaN never counts as best


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
    best = min(range(len(losses)), key=losses.__getitem__)
    if "min_delta" in early_stopping:  # the first evaluation is the best: no later one is min_delta lower
        best = 0
    assert summary["stopped_by"] == "early stopping" and summary["steps"] < 30
    assert len(losses) == best + 1 + 2  # two evaluations without an improvement after the best one
    early = summary["early_stopping"]
    assert early["best_step"] == evals[best]["step"] and early["best_val_loss"] == losses[best]
    assert early["model_from_step"] == early["best_step"]
    best_folder = tmp_path / "checkpoints" / f"checkpoint-{early['best_step']:08d}"
    assert early["best_checkpoint"] == str(best_folder) and best_folder.is_dir()  # kept despite keep_last 1
    assert latest_checkpoint(tmp_path / "checkpoints").name == f"checkpoint-{summary['steps']:08d}"
    from fastlm.engine.evaluate.evaluation import evaluate
    from fastlm.engine.runtime.environment import RuntimeConfig, setup_runtime
    from tests.support.toy_training import EOS, toy_sequences

    # the model returned is the best one, not the last (bf16 weights: evaluated on them in the run, here on
    # the fp32 masters in fp32: a bf16 model's loss against the fp32 one's)
    fp32 = setup_runtime(RuntimeConfig(device="cpu", precision="fp32", num_threads=1))
    again = evaluate(
        result.model,
        toy_sequences(40, 2),
        params=toy_params(tmp_path / "x"),
        runtime=fp32 if runtime else result.runtime,
        pad_id=EOS,
        max_length=64,
        attn="sdpa",
    ).metrics["loss"]
    assert again == pytest.approx(losses[best], rel=BF16_MODEL_LOSS_REL if runtime else 1e-6)
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
