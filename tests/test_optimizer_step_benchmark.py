"""benchmarks/optimizer_step.py runs end to end on a small shape: both AdamW kernels timed over the same
parameter groups, the kernel fastlm picks here named."""

from __future__ import annotations

import json

from tests.support.benchmark_scripts import run_main


def test_the_benchmark_times_both_kernels_and_names_fastlms(tmp_path, monkeypatch, capsys):
    # the script's main, run here: what it times and names, not how it starts
    out = tmp_path / "figures.json"
    exit_code = run_main(
        monkeypatch,
        "optimizer_step",
        ["--vocab", "512", "--hidden", "32", "--layers", "1", "--steps", "2", "--threads", "1"]
        + ["--json", str(out)],
    )
    shown = capsys.readouterr()
    assert exit_code == 0, shown.err[-2000:]
    figures = json.loads(out.read_text())
    assert figures["chosen"] == "fused"  # every parameter on the CPU: torch's fused kernel
    assert set(figures["results"]) == {"fused", "foreach"}
    assert {r["parameters"] for r in figures["results"].values()} == {512 * 32 + 32 * 128}
    assert all(r["seconds"] > 0 for r in figures["results"].values())
    assert "foreach / fused = " in shown.out
