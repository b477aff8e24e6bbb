"""Benchmark: the report pipeline on the current project's last run, and evaluation vs training throughput.

    kedro run            # once: split -> train -> report on the demo data (the default run)
    python benchmarks/report_speed.py

Runs ``kedro run --pipeline=report`` in a fresh process (as a user does) and prints its wall time against the
one-minute target (printed, not asserted), then the test-split evaluation's real tokens/s beside the
training's real tokens/s from the same run's outputs (evaluation is forward-only, so it should be faster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from cpu_usage import busy_cpu_s, children_cpu_s  # sibling module: scripts run from benchmarks/

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def main() -> None:
    env = {**os.environ, "DO_NOT_TRACK": "true", "HF_HUB_OFFLINE": "1"}
    busy, own = busy_cpu_s(), children_cpu_s()
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "kedro", "run", "--pipeline=report"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"kedro run --pipeline=report failed:\n{done.stderr[-3000:]}")
    foreign = max(busy_cpu_s() - busy - (children_cpu_s() - own), 0.0) / wall
    out = ROOT / "data/08_reporting"
    test = json.loads((out / "test_metrics.json").read_text())
    efficiency = pd.read_csv(out / "efficiency_summary.csv").iloc[0]
    train_speed, eval_speed = float(efficiency["real_tokens_per_s"]), float(test["real_tokens_per_s"])
    print(f"machine: {os.cpu_count()} cores; other processes kept {foreign:.2f} cores busy meanwhile")
    print(
        f"report pipeline wall (process start to exit): {wall:.1f} s   target <= {TARGET_S:.0f} s: "
        f"{'PASS' if wall <= TARGET_S else 'FAIL'}"
    )
    print(
        f"test evaluation: {test['target_tokens']:,} target tokens, {test['samples']:,} samples in "
        f"{test['seconds']:.2f} s = {eval_speed:,.0f} real tokens/s"
    )
    print(
        f"training (same run): {train_speed:,.0f} real tokens/s;  evaluation / training = "
        f"{eval_speed / train_speed:.2f}x"
    )


if __name__ == "__main__":
    main()
