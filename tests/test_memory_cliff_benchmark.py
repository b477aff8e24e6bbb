"""benchmarks/memory_cliff.py stays runnable without a GPU: ``--help`` works on CPU and ``--dry-run`` runs the
whole code path (base saved from a config, Trainer + peft trials at two micro-batch sizes, fastlm's tune
ladder, the PASS/FAIL lines) on a tiny config in seconds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def run(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(
        [sys.executable, str(BENCHMARKS / "memory_cliff.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=cwd,
    ).stdout


def test_help_runs_on_cpu():
    shown = run("--help")
    assert "--budget-gib" in shown and "--dry-run" in shown and "--lengths" in shown


def test_dry_run_measures_both_sides_and_prints_the_verdicts(tmp_path):
    shown = run("--dry-run", "--json", str(tmp_path / "figures.json"), "--workdir", str(tmp_path / "work"))
    figures = json.loads((tmp_path / "figures.json").read_text())
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
    verdicts = [line for line in shown.splitlines() if line.startswith(("PASS: ", "FAIL: "))]
    assert len(verdicts) == 2 and "What a step holds differs" in shown
    assert (tmp_path / "work" / "base" / "config.json").exists()  # built from a config, saved, loaded back
