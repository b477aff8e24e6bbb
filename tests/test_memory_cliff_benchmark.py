"""benchmarks/memory_cliff.py stays runnable without a GPU: ``--help`` works on CPU and ``--dry-run`` runs the
whole code path (base saved from a config, Trainer + peft trials at two micro-batch sizes, fastlm's tune
ladder, the PASS/FAIL lines) on a tiny config in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import background

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(*args: str, cwd: Path) -> str:
    done = background.run([sys.executable, str(BENCHMARKS / "memory_cliff.py"), *args], cwd=cwd, timeout=300)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def help_text(folder: Path) -> str:
    """``--help`` (a job of tests/support/background.py)."""
    return run("--help", cwd=folder)


def dry_run(folder: Path) -> tuple[str, Path]:
    """``--dry-run`` (a job of tests/support/background.py): what it printed, and its folder."""
    return run(
        "--dry-run", "--json", str(folder / "figures.json"), "--workdir", str(folder / "work"), cwd=folder
    ), folder


@pytest.mark.background(job=help_text)
def test_help_runs_on_cpu():
    shown = background.result(help_text)
    assert "--budget-gib" in shown and "--dry-run" in shown and "--lengths" in shown


@pytest.mark.background(job=dry_run)
def test_dry_run_measures_both_sides_and_prints_the_verdicts():
    shown, folder = background.result(dry_run)
    figures = json.loads((folder / "figures.json").read_text())
    trainer = figures["trainer"]
    assert [t["micro_batch_size"] for t in trainer] == [2, 4]
    assert all(t["status"] == "ok" and t["real_tokens_per_s"] > 0 for t in trainer)
    tuned = figures["fastlm"]
    assert {t["mode"] for t in tuned["trials"]} == {"packed", "length_grouped"}
    assert tuned["chosen"]["status"] == "ok" and tuned["chosen"]["micro_batch_size"] in (1, 2, 4)
    assert set(figures["targets"]) == {
        "the cliff reproduced with the Trainer",
        "tune chose a set-up on the fast side of it",
    }
    assert "torch" in figures["versions"] and "bitsandbytes" in figures["versions"]
    if figures["versions"]["bitsandbytes"]:  # the dev install: the GPU run's 4-bit path, on CPU
        assert "QLoRA (NF4 4-bit base" in shown, shown[:2000]
    verdicts = [line for line in shown.splitlines() if line.startswith(("PASS: ", "FAIL: "))]
    assert len(verdicts) == 2 and "What a step holds differs" in shown
    assert (folder / "work" / "base" / "config.json").exists()  # built from a config, saved, loaded back


def test_where_the_cliff_ran_out_of_memory_the_verdict_names_the_fastest_set_up_that_ran():
    """The H200 of 2026-11-27 ran micro-batch 16 out of memory: the verdict compared tune's choice with the
    Trainer's 0 there; it now also names the Trainer's fastest set-up that ran, and the ratio."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import memory_cliff
    finally:
        sys.path.remove(str(BENCHMARKS))
    trainer = [
        {"micro_batch_size": 4, "status": "ok", "real_tokens_per_s": 700.0, "step_time_s": 0.5},
        {"micro_batch_size": 8, "status": "ok", "real_tokens_per_s": 1300.0, "step_time_s": 0.55},
        {"micro_batch_size": 16, "status": memory_cliff.OOM},
    ]
    chosen = {"real_tokens_per_s": 26000.0, "peak_memory_mb": 7000.0}
    (_, cliff, _), (_, fast, why) = memory_cliff.verdicts(trainer, chosen, limit_mb=24576.0)
    assert cliff and fast
    assert "the Trainer's 0 at micro-batch 16; its fastest that ran: 1,300 at micro-batch 8 (20.0x)" in why
