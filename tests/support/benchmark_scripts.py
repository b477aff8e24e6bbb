"""Run a benchmark script's ``main`` in the test's own process: for a test that checks what the script
computes, not how it starts (a fresh process importing torch, transformers and peft costs 5-10 s of CPU).

    def test_it(monkeypatch, capsys):
        exit_code = run_main(monkeypatch, "optimizer_step", ["--steps", "2"])
        shown = capsys.readouterr().out

The script is imported from benchmarks/ (its folder on sys.path for this test only); the torch threads and
the global RNG state it sets are put back after it, so that the tests after it run as they would have.
"""

from __future__ import annotations

import importlib
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_main(monkeypatch, script: str, argv: list[str]):
    """``benchmarks/<script>.py``'s ``main(argv)`` here; its return value, or the code it exits with."""
    import torch

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module(script)
    threads, rng = torch.get_num_threads(), torch.get_rng_state()
    try:
        return module.main(argv)
    except SystemExit as stop:
        return stop.code
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
