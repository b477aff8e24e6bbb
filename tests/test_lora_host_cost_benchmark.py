"""benchmarks/lora_host_cost.py on 2 layers: every set-up measured, and the shared-input groups dispatch fewer
aten ops per step than each layer on its own, which dispatches fewer than peft's forward, and bf16 adapters
with fp32 masters cast no adapter (exact counts, no timing asserted)."""

import json

from tests.support.benchmark_scripts import run_main


def test_the_groups_dispatch_fewer_ops_than_each_layer_alone_and_peft(tmp_path, monkeypatch, capsys):
    # the ops are counted in the script's main, run here: what it counts, not how it starts
    out = tmp_path / "host.json"
    exit_code = run_main(monkeypatch, "lora_host_cost", ["--layers", "2", "--steps", "1", "--json", str(out)])
    shown = capsys.readouterr()
    assert exit_code == 0, shown.out[-3000:] + shown.err[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["fp32", "bf16 autocast"]
    for label, figures in runs.items():
        ops = {name: figures[name]["aten_ops_per_step"] for name in ("groups", "own", "peft")}
        assert ops["groups"] < ops["own"] < ops["peft"], (label, ops)
        assert all(figures[name]["host_ms_per_step"] > 0 for name in ops)
    # bf16 adapters with fp32 masters: no adapter cast each way (4 per layer and projection) in the bf16 run
    autocast = runs["bf16 autocast"]
    casts = 2 * 2 * 7 * 2  # A and B, forward and backward, 7 projections, 2 layers
    fewer = autocast["groups"]["aten_ops_per_step"] - autocast["bf16_adapters"]["aten_ops_per_step"]
    assert fewer >= casts - 2  # less the two foreach ops: the gradients' move, the masters' copy
    assert "bf16_adapters" not in runs["fp32"]
    assert "groups / own: aten ops" in shown.out
