"""benchmarks/lora_host_cost.py on 2 layers: every set-up measured, and the shared-input groups dispatch fewer
aten ops per step than each layer on its own, which dispatches fewer than peft's forward (exact counts, no
timing asserted)."""

import json
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "lora_host_cost.py"


def test_the_groups_dispatch_fewer_ops_than_each_layer_alone_and_peft(tmp_path):
    out = tmp_path / "host.json"
    shown = subprocess.run(
        [sys.executable, str(BENCHMARK), "--layers", "2", "--steps", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stdout[-3000:] + shown.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["fp32", "bf16 autocast"]
    for label, figures in runs.items():
        ops = {name: figures[name]["aten_ops_per_step"] for name in ("groups", "own", "peft")}
        assert ops["groups"] < ops["own"] < ops["peft"], (label, ops)
        assert all(figures[name]["host_ms_per_step"] > 0 for name in ops)
    assert "groups / own: aten ops" in shown.stdout
