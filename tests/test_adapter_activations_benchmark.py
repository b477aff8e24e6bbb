"""benchmarks/adapter_activations.py on the tiny shape: each set-up measured, and fastlm's LoRA and QLoRA keep
fewer activations for backward than peft's forward and peft's 4-bit preparation (what the benchmark exists
to show on the 3B shape)."""

import json

import pytest

from tests.support.benchmark_scripts import run_main

pytest.importorskip("bitsandbytes", reason="the dev install brings it: pip install -e .[dev]")


def test_fastlm_keeps_fewer_activations_than_peft_forward_and_preparation(tmp_path, monkeypatch, capsys):
    # the script's main, run here: the activations it counts, not how it starts
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    out = tmp_path / "activations.json"
    argv = ["--model", "tiny", "--tokens", "64", "--steps", "1", "--json", str(out)]
    exit_code = run_main(monkeypatch, "adapter_activations", argv)
    shown = capsys.readouterr()
    assert exit_code == 0, shown.out[-3000:] + shown.err[-3000:]
    figures = json.loads(out.read_text())
    saved = {run["setup"]: run["saved_mib"] for run in figures["runs"]}
    assert len(saved) == 7 and all(value > 0 for value in saved.values())
    # the shared-input groups change which passes run, not what backward keeps
    assert saved["lora_fastlm"] == saved["lora_fastlm_own_inputs"]
    # the same activations over a 4-bit or a bf16 base: the packed weights are not activations
    assert saved["qlora_fastlm"] == saved["lora_fastlm"]
    assert saved["lora_fastlm"] < saved["lora_peft_forward"]
    # fp32 norms (peft's preparation, or fastlm's before) turn the activations fp32
    assert saved["qlora_fastlm"] < saved["qlora_peft_forward"] < saved["qlora_fp32_norms"]
    assert saved["qlora_fp32_norms"] <= saved["qlora_peft_prepared"]
    frozen = {run["setup"]: run["frozen_dtypes"] for run in figures["runs"]}
    assert frozen["qlora_fastlm"] == ["bfloat16", "uint8"] and "float32" in frozen["qlora_peft_prepared"]
    assert "qlora_fastlm / qlora_peft_prepared: saved activations" in shown.out
