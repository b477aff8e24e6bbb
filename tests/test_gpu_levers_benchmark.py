"""benchmarks/gpu_levers.py and benchmarks/gpu_session.sh stay runnable without a GPU: the lever matrix runs
the levers a CPU has on a tiny shape (each in its own process) and SKIPs the others with the reason; its
verdicts catch a lever off the baseline, one that did not train or did not take effect, and an exception; the
session script's plan prints without running anything."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from tests.support import background

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY = ["--hidden", "32", "--layers", "2", "--heads", "4", "--intermediate", "64", "--vocab", "512"]
TINY += ["--rows", "2", "--seq-len", "64"]


@pytest.fixture()
def levers(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_levers

    return gpu_levers


CPU_LEVERS = ["fused_linear", "checkpointing_full", "compile_layers", "liger", "fused_linear_liger", "qlora"]
CPU_LEVERS += ["float8", "cuda_graphs", "dora"]


def cpu_lever_matrix(folder: Path) -> subprocess.CompletedProcess:
    """The lever matrix on CPU, two levers at once, its JSON in ``folder`` (a job of
    tests/support/background.py)."""
    return background.run(
        [sys.executable, str(BENCHMARKS / "gpu_levers.py"), "--device", "cpu", *TINY, "--levers", *CPU_LEVERS]
        + ["--json", str(folder / "levers.json"), "--parallel", "2"],
        cwd=folder,
        timeout=240,
    )


@pytest.mark.background(job=cpu_lever_matrix)
def test_cpu_matrix_passes_the_cpu_levers_and_skips_the_gpu_ones_with_the_reason():
    done = background.result(cpu_lever_matrix)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out, shown, chosen = Path(done.args[done.args.index("--json") + 1]), done.stdout, CPU_LEVERS
    rows = {row["lever"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["baseline", *chosen]  # the baseline first, always
    baseline = rows["baseline"]
    assert baseline["status"] == "PASS" and baseline["last_loss"] < baseline["first_loss"]
    assert baseline["epochs"] == 3.0  # one micro-batch per epoch: every step sees the same data
    fused = rows["fused_linear"]
    assert fused["status"] == "PASS", fused["reasons"]
    assert fused["tolerance"] == 1e-4 and fused["rel_diff_first"] <= fused["tolerance"]
    assert "fused LM head" in fused["choice"]  # the engine's own words: the lever was in effect
    checkpointing = rows["checkpointing_full"]
    assert checkpointing["status"] == "PASS" and checkpointing["rel_diff_first"] <= checkpointing["tolerance"]
    layers = rows["compile_layers"]  # inductor against eager: within the fp32 lever tolerance, curve too
    assert layers["status"] == "PASS", layers["reasons"]
    assert "2 of 2 layers compiled in place" in layers["choice"] and layers["rel_diff_curve"] <= 1e-4
    # QLoRA runs on CPU through bitsandbytes' CPU backend (0.50 or later), as the engine allows it there
    qlora = rows["qlora"]
    assert qlora["status"] == "PASS", qlora.get("reasons") or qlora.get("reason")
    # 4-bit weights' own error (16 levels per block), whatever the precision computes in: not fp32's 1e-4
    assert "4-bit layers: yes" in qlora["choice"] and qlora["tolerance"] == 5e-2
    for name in ("liger", "fused_linear_liger", "float8", "cuda_graphs"):
        assert rows[name]["status"] == "SKIP" and "needs CUDA" in rows[name]["reason"]
    assert "liger-kernel not installed" in rows["liger"]["reason"] or "liger_kernel" in sys.modules
    assert "2 levers at once" in shown.splitlines()[0]
    # DoRA through the fused forward: its magnitudes trained, its first loss the base model's (B starts at 0)
    dora = rows["dora"]
    assert dora["status"] == "PASS", dora.get("reasons") or dora.get("reason")
    assert "DoRA magnitudes: yes, 14 fused LoRA layers" in dora["choice"]
    assert shown.strip().splitlines()[-1] == "levers: 6 pass, 0 fail, 0 stopped, 4 skip"


def _run(losses, applied=True, choice="in effect"):
    return {
        "losses": losses,
        "applied": applied,
        "choice": choice,
        "step_time_s": 0.1,
        "peak_memory_mb": 100.0,
        "attention": "sdpa",
        "epochs": 3.0,
    }


def test_judge_fails_a_lever_off_the_baseline_one_that_did_not_train_or_take_effect(levers):
    good = levers.judge("compile", _run([10.0, 9.0, 8.0]), 10.0, "bf16")
    assert good["status"] == "PASS" and good["rel_diff_first"] == 0.0 and good["tolerance"] == 2e-2
    off = levers.judge("compile", _run([10.5, 9.0, 8.0]), 10.0, "bf16")  # 5e-2 from the baseline's
    assert off["status"] == "FAIL" and "from the baseline's" in off["reasons"][0]
    assert levers.judge("qlora", _run([10.3, 9.0, 8.0]), 10.0, "bf16")["status"] == "PASS"  # 4-bit: 5e-2
    flat = levers.judge("lora", _run([10.0, 10.0, 10.0]), 10.0, "fp32")
    assert flat["status"] == "FAIL" and "did not fall" in flat["reasons"][0]
    nan = levers.judge("lora", _run([10.0, float("nan"), 9.0]), 10.0, "fp32")
    assert nan["status"] == "FAIL" and "non-finite" in nan["reasons"][0]
    unapplied = levers.judge(
        "liger", _run([10.0, 9.0, 8.0], applied=False, choice="liger kernels off"), 10.0, "bf16"
    )
    assert unapplied["status"] == "FAIL" and unapplied["reasons"] == ["not in effect: liger kernels off"]


def test_an_exception_in_a_lever_is_its_fail_with_the_traceback(levers, monkeypatch, tmp_path, capsys):
    def broken(args):
        raise RuntimeError("float8 matmul needs dimensions divisible by 16\nsecond line")

    monkeypatch.setattr(levers, "train_lever", broken)
    result = tmp_path / "result.json"
    levers.child_main(Namespace(run="float8", result=str(result)))
    run = json.loads(result.read_text())
    assert run["error"] == "RuntimeError: float8 matmul needs dimensions divisible by 16"
    assert "Traceback" in run["traceback"] and "broken" in run["traceback"]
    row = levers.judge("float8", run, 10.0, "bf16")
    assert row["status"] == "FAIL"
    levers.show(row)
    shown = capsys.readouterr().out
    assert shown.startswith("FAIL  float8") and "| RuntimeError: float8 matmul" in shown


def test_a_lever_stopped_by_what_was_left_of_the_budget_is_unfinished_not_a_fail(levers, monkeypatch, capsys):
    """On the H200 (2026-11-28) the matrix ran in the 87 s a session had left: compile, fp32 parameters and
    float8 were stopped after 7-16 s and printed FAIL, as if the levers were broken. A lever the budget
    stopped is STOP (no verdict, how to rerun it named); one past its own --lever-timeout-s is a FAIL."""
    clock = {"left": 100.0, "after_baseline": 20.0}

    class Budget:
        def __init__(self, seconds):
            self.seconds = seconds

        def left(self):
            return clock["left"]

    def fake_run(script, name, workdir, index, extra, *, repo, timeout_s):
        if name == "baseline":
            clock["left"] = clock["after_baseline"]  # the baseline used most of the budget
            return {
                "losses": [10.0, 9.0],
                "step_time_s": 0.1,
                "peak_memory_mb": 1.0,
                "choice": "plain",
                "attention": "sdpa",
                "epochs": 1,
                "applied": True,
            }
        return {"contender": name, "error": f"did not finish in {timeout_s:.0f} s", "timed_out": True}

    monkeypatch.setattr(levers, "Budget", Budget)
    monkeypatch.setattr(levers, "run_contender", fake_run)
    monkeypatch.setattr(levers, "missing", lambda on_cuda: {})
    argv = [
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--levers",
        "baseline",
        "fused_linear",
        "--budget-s",
        "100",
    ]
    args = levers.parse_args(argv)
    rows = levers.run_matrix(args, False, Path("."))
    assert [row["status"] for row in rows] == ["PASS", "STOP"]
    assert rows[1]["reason"] == (
        "stopped unfinished after 20 s, what was left of --budget-s 100: no verdict "
        "(alone: python benchmarks/gpu_levers.py --levers fused_linear)"
    )
    assert "STOP  fused_linear" in capsys.readouterr().out
    clock["after_baseline"] = 1000.0  # its own --lever-timeout-s stopped it: the lever is too slow, a FAIL
    rows = levers.run_matrix(args, False, Path("."))
    assert [row["status"] for row in rows] == ["PASS", "FAIL"]


def session(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(BENCHMARKS / "gpu_session.sh"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "OUT": str(tmp_path)},
    )


def test_gpu_session_parses_and_its_dry_run_prints_the_plan_in_order(tmp_path):
    assert subprocess.run(["bash", "-n", str(BENCHMARKS / "gpu_session.sh")]).returncode == 0
    done = session(tmp_path, "--dry-run", "--budget-s", "10000")
    assert done.returncode == 0, done.stderr
    plan = [line for line in done.stdout.splitlines() if line.startswith("[")]
    names = [line[1 : line.index("]")] for line in plan]
    assert names == [
        "full_trainer_compiled_liger",
        "full_inductor_ab",
        "full_profile_eager",
        "full_profile_compiled",
        "full_profile_inductor",
        "gpu_speed_lora_compiled",
        "lora_compiled_ab",
        "qlora_compiled_ab",
        "lora_reviews",
        "lora_dora",
        "gpu_speed_full",
        "full_accum4",
        "gpu_speed_full_eager",
        "in_backward_3b",
        "head_kernels",
        "gpu_speed_full_3b",
        "full_eager_b16",
        "memory_cliff",
        "lora_usual",
        "qlora_forward_ab",
        "lora_own_head",
        "weights_ab_compiled",
        "full_cudagraphs",
        "liger_on",
        "liger_off",
        "compile_scope",
        "levers",
        "weights_ab",
        "lora_variants",
        "gpu_speed_lora",
        "lora_cudagraphs",
        "full_compiled_ab",
        "gpu_speed_qlora",
        "lora_ab",
        "full_trainer_compiled",
        "qlora_checkpointed",
        "full_b16",
    ]
    step = dict(zip(names, plan, strict=True))
    # fastlm's full fine-tune alone, eager and compiled by layers, each profiled whatever its verdicts (the
    # kernel time by kind of each), in few steps: a run and its profile in one step's cap
    for name, compile_ in (
        ("full_profile_eager", "--compile off"),
        ("full_profile_compiled", "--compile-scope"),
    ):
        contender = "fastlm_eager" if name.endswith("eager") else "fastlm_compile"
        assert f"--model 0.5b --contenders {contender} --profile always --warmup 3 --steps 6" in step[name]
        assert compile_ in step[name]
    # compiled by layers, liger's norm/rotary/SwiGLU kernels inside each layer against inductor's own, one run
    inductor = "--model 0.5b --contenders fastlm_compile fastlm_compile_inductor_layers"
    inductor += " --compile-scope layers"
    assert inductor in step["full_inductor_ab"] and "at most 180 s" in step["full_inductor_ab"]
    assert "--profile never" in step["full_inductor_ab"]
    # its inductor side profiled: fastlm_compile with liger's layer kernels off, the head's kernel at auto
    profiled = "--contenders fastlm_compile --liger off --fused-kernel auto --profile always --warmup 3"
    assert profiled in step["full_profile_inductor"]
    assert "--compile-scope layers" in step["full_profile_inductor"]
    # the full fine-tune's 1.3x target against the Trainer's best set-up, both eager (its torch_compile had
    # not finished in 107 s on the H100)
    assert "--model 0.5b --contenders fastlm_eager trainer_best --compile off" in step["gpu_speed_full_eager"]
    # the LoRA target is on the 3B shape, against Trainer + peft's best and TRL's (the usual set-up,
    # more than 79 s, in a step of its own)
    lora = "fastlm_lora trainer_lora_best trl_lora_best"
    assert f"--model 3b --contenders {lora} --compile off" in step["gpu_speed_lora"]
    assert "--contenders fastlm_lora trainer_lora_usual --compile off" in step["lora_usual"]
    # the cliff's tune ladder eager and packed (at its defaults it had not finished in 150 s on the H100)
    cliff = step["memory_cliff"]
    assert "memory_cliff.py --fastlm-compile off --modes packed --max-size 32" in cliff and "timeout" in cliff
    # bf16 adapters with fp32 masters (param_dtype auto on a GPU) against fp32 adapters under autocast
    assert "--model 3b --contenders fastlm_lora fastlm_lora_fp32_adapters --compile off" in step["lora_ab"]
    assert "at most 200 s" in step["lora_ab"]
    # CUDA graphs of the compiled layers (compile_mode reduce-overhead) against eager and the Trainer + peft's
    # best set-up in one run: the contender compiles whatever --compile says, the others stay eager; it runs
    # last, with what the eager contenders left of the step (a layer's compile, then the graphs' recording)
    graphs = "--model 3b --contenders fastlm_lora trainer_lora_best fastlm_lora_cudagraphs --compile off"
    assert graphs in step["lora_cudagraphs"] and "at most 300 s" in step["lora_cudagraphs"]
    full_graphs = "--model 0.5b --contenders fastlm_compile trainer_best --compile-scope layers"
    assert (
        full_graphs in step["full_cudagraphs"] and "--compile-mode reduce-overhead" in step["full_cudagraphs"]
    )
    # fastlm's loop over liger's kernel against liger's own function, the shared-input groups against each
    # LoRA layer on its own, fastlm's LoRA forward against peft's
    variants = "fastlm_lora fastlm_lora_liger_function fastlm_lora_own_inputs fastlm_lora_peft_forward"
    assert f"--model 3b --contenders {variants} --compile off" in step["lora_variants"]
    assert "at most 320 s" in step["lora_variants"]
    assert "--contenders fastlm_lora fastlm_lora_own_head --compile off" in step["lora_own_head"]
    # DoRA on every side: fastlm's fused DoRA forward against peft's and Trainer + peft's best set-up
    dora = "--model 3b --lora-variant dora --contenders fastlm_lora fastlm_lora_peft_forward"
    dora += " trainer_lora_best"
    assert dora in step["lora_dora"] and "at most 330 s" in step["lora_dora"]
    # a 3B model's LM head + loss on the GPU: fastlm's kernel, liger's, cut-cross-entropy's, the plain head
    head = "linear_loss_memory.py --device cuda --precision bf16 --hidden 3072"
    head += " --kernels liger liger_function cce"
    assert head in step["head_kernels"] and "at most 200 s" in step["head_kernels"]
    # QLoRA in fewer steps (the usual set-up's 20 did not fit in its share on the H100)
    # the usual set-up last: each contender's share is what is left over those still to run
    qlora = "--model 3b --contenders fastlm_qlora trainer_qlora_best trl_qlora_best trainer_qlora_usual"
    assert f"{qlora} --compile off --warmup 3" in step["gpu_speed_qlora"]
    assert "at most 300 s" in step["gpu_speed_qlora"]  # its 4 contenders, the usual set-up about 5 s a step
    # fastlm's QLoRA checkpointed against the usual set-up's (peft's default, every layer): the peak memory
    checkpointed = "--model 3b --contenders fastlm_qlora trainer_qlora_usual --checkpointing selective"
    assert f"{checkpointed} --compile off" in step["qlora_checkpointed"]
    assert "--contenders fastlm_qlora fastlm_qlora_peft_forward --compile off" in step["qlora_forward_ab"]
    # the LoRA run on one short text per document, the real reviews' lengths
    reviews = "--model 3b --texts reviews --contenders fastlm_lora trainer_lora_usual trainer_lora_best"
    assert f"{reviews} trl_lora_best --compile off" in step["lora_reviews"]
    # the bf16 weights' A/B compiled by layers: each contender took more than 119 s on a fresh H100
    compiled_ab = step["weights_ab_compiled"]
    assert "--contenders fastlm_compile fastlm_compile_fp32_weights" in compiled_ab
    assert "at most 360 s" in compiled_ab
    # the full fine-tune against the Trainer's best set-up, compiled by layers
    assert "--model 0.5b --contenders fastlm_compile trainer_best" in step["gpu_speed_full"]
    # a real fine-tune's tokens per optimizer step: 4 micro-batches on both sides, eager
    accumulated = "--model 0.5b --contenders fastlm_eager trainer_best --accumulation 4 --compile off"
    assert accumulated in step["full_accum4"] and "at most 260 s" in step["full_accum4"]
    # the ratio at twice the micro-batch tokens, both eager, the same tokens per optimizer step
    b16 = "--model 0.5b --contenders fastlm_eager trainer_best --batch-size 16 --compile off"
    assert b16 in step["full_b16"]
    # fastlm's MFU at twice the micro-batch tokens, alone, eager
    assert "--model 0.5b --contenders fastlm_eager --batch-size 16 --compile off" in step["full_eager_b16"]
    # the full fine-tune of the 3B shape, both eager, checkpointing on both sides to fit 80 GB
    full_3b = "--model 3b --contenders fastlm_eager trainer_best --batch-size 2 --checkpointing selective"
    assert f"{full_3b} --compile off" in step["gpu_speed_full_3b"]
    eager = (
        "full_b16",
        "full_eager_b16",
        "full_accum4",
        "gpu_speed_full_eager",
        "gpu_speed_lora",
        "lora_ab",
        "lora_variants",
        "gpu_speed_qlora",
        "lora_usual",
        "weights_ab",
    )
    assert all("--compile off" in step[name] for name in eager)
    # what compile auto weighs on a run's first micro-batch, as whole runs (eager, compiled by layers), and
    # the Trainer's best set-up compiled without Liger (with Liger its compile did not finish, then failed)
    full_ab = "--model 0.5b --contenders fastlm_eager fastlm_compile trainer_best --trainer-liger off"
    assert full_ab in step["full_compiled_ab"] and "at most 320 s" in step["full_compiled_ab"]
    # the Trainer's compiled best against fastlm eager, its compile try given most of the step (a first
    # compile of 61 s and a second one at the next token count on the H200)
    trainer_compiled = "--model 0.5b --contenders fastlm_eager trainer_best --trainer-liger off"
    first = step["full_trainer_compiled"]
    assert trainer_compiled in first and "at most 380 s" in first
    # the same with the Trainer's Liger kernels (the target's "best with Liger"), its own step
    with_liger = step["full_trainer_compiled_liger"]
    assert "--model 0.5b --contenders fastlm_eager trainer_best --compile-scope layers" in with_liger
    compiled = (
        "full_trainer_compiled",
        "full_trainer_compiled_liger",
        "full_inductor_ab",
        "full_compiled_ab",
        "weights_ab_compiled",
        "gpu_speed_full",
        "liger_on",
        "liger_off",
        "gpu_speed_lora_compiled",
        "full_cudagraphs",
    )
    assert all("--compile-scope layers" in step[n] and "--compile off" not in step[n] for n in compiled)
    lora_compiled = "--model 3b --contenders fastlm_lora trainer_lora_best --trainer-liger off"
    assert lora_compiled in step["gpu_speed_lora_compiled"]  # with Liger its compile did not finish in 93 s
    # fastlm's adapters eager and compiled by layers beside the peer's best eager set-up (with Liger), one run
    for adapter, steps in (("lora", "--warmup 5 --steps 15"), ("qlora", "--warmup 3 --steps 8")):
        ab = f"--model 3b --contenders fastlm_{adapter} fastlm_{adapter}_compiled trainer_{adapter}_best"
        assert f"{ab} --compile off {steps}" in step[f"{adapter}_compiled_ab"]
    assert "--liger on" in step["liger_on"] and "--liger off" in step["liger_off"]
    assert (
        "compile_scope.py --hidden 1536 --heads 16 --intermediate 4096 --vocab 32000" in step["compile_scope"]
    )
    # every lever again: each one passed on the H100 of 2026-11-26
    assert f"gpu_levers.py --parallel 4 --json {tmp_path}/levers.json" in step["levers"]
    # the 3B full fine-tune's peak memory with the masters updated in the backward, one eager run
    in_backward = "--model 3b --contenders fastlm_eager fastlm_eager_in_backward --batch-size 2"
    assert f"{in_backward} --checkpointing selective --compile off" in step["in_backward_3b"]
    # the bf16 weights' eager A/B again, last (1.15x on the H100 of 2026-11-27)
    assert "--model 0.5b --contenders fastlm_eager fastlm_eager_fp32_weights" in step["weights_ab"]
    # the gpu_speed.py steps share the session's cache of prepared data and base model, the others need none
    for name, line in step.items():
        assert ("--cache-dir /tmp/fastlm_gpu_cache" in line) == ("gpu_speed.py" in line), name
    assert [path.name for path in tmp_path.iterdir()] == ["session.log"]  # nothing ran
    assert (tmp_path / "session.log").read_text() == done.stdout


def test_gpu_session_skips_what_the_budget_cannot_hold_and_says_how_to_run_it_later(tmp_path):
    done = session(tmp_path, "--dry-run", "--budget-s", "560")
    assert "[full_trainer_compiled_liger] at most 260 s" in done.stdout
    assert "[full_inductor_ab] at most 180 s" in done.stdout
    # what the first two left (the dry run counts its own seconds too, as a session counts its set-up)
    eager = re.search(r"\[full_profile_eager\] at most (\d+) s", done.stdout)
    assert eager and 110 <= int(eager.group(1)) <= 120, done.stdout
    assert re.search(r"\[full_profile_compiled\] skipped: -?[0-9] s left of 560, it needs 160", done.stdout)
    assert "bash benchmarks/gpu_session.sh --only full_profile_compiled" in done.stdout
    only = session(tmp_path, "--dry-run", "--only", "liger_on,liger_off")
    assert [line[1:9] for line in only.stdout.splitlines() if line.startswith("[")] == [
        "liger_on",
        "liger_of",
    ]


def test_gpu_session_refuses_an_unknown_step_in_one_line(tmp_path):
    done = session(tmp_path, "--only", "memory")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "is not a step" in done.stderr


def test_a_lever_that_trains_the_same_model_keeps_the_baselines_whole_loss_curve(levers):
    """Kernels, recompute, compile, float8 change how the same training is computed: every step's loss stays
    within the tolerance of the baseline's, not only the first. LoRA, QLoRA and the 8-bit optimizers train
    something else (other parameters, another update): their first step only."""
    baseline = [10.0, 9.0, 8.5]
    drifted = _run([10.0, 9.0, 8.0])  # the first step agrees, the third is 6 % off
    row = levers.judge("fused_linear", drifted, 10.0, "bf16", baseline_curve=baseline)
    assert row["status"] == "FAIL" and any("step 3" in reason for reason in row["reasons"])
    assert row["rel_diff_curve"] == pytest.approx(0.5 / 8.5)
    assert levers.judge("lora", drifted, 10.0, "bf16", baseline_curve=baseline)["status"] == "PASS"
    assert levers.judge("adamw_8bit", drifted, 10.0, "bf16", baseline_curve=baseline)["status"] == "PASS"
    close = levers.judge("compile", _run([10.0, 9.05, 8.55]), 10.0, "bf16", baseline_curve=baseline)
    assert close["status"] == "PASS" and close["rel_diff_curve"] < 2e-2


def test_the_cuda_graph_levers_are_in_effect_only_where_the_run_recorded_graphs_and_skipped_none(
    levers, tmp_path
):
    """A run under ``reduce-overhead`` says what its CUDA graphs did (its summary's ``cuda_graphs``): the
    levers pass only where it recorded some and ran no compiled graph without one (a compile that silently
    fell back to plain kernels would look like a slow graph); the accumulation lever also needs the fp32
    weights that leave the gradients in the graphs' memory."""
    from types import SimpleNamespace

    def summary(graphs, param_dtype="bf16 weights, fp32 masters in the optimizer (param_dtype auto)"):
        return SimpleNamespace(summary={"cuda_graphs": graphs, "param_dtype": param_dtype})

    assert levers.in_effect("cuda_graphs", summary("8 recorded"), None)[0]
    applied, choice = levers.in_effect(
        "cuda_graphs", summary("0 recorded; 4 compiled graphs ran without one"), None
    )
    assert not applied and "ran without" in choice
    assert not levers.in_effect(
        "cuda_graphs", summary("8 recorded; 1 compiled graphs ran without one"), None
    )[0]
    assert not levers.in_effect("cuda_graphs", summary(None), None)[0]
    fp32 = "fp32 weights under autocast (train.runtime.param_dtype: fp32)"
    assert levers.in_effect("cuda_graphs_accumulation", summary("8 recorded", fp32), None)[0]
    assert not levers.in_effect("cuda_graphs_accumulation", summary("8 recorded"), None)[0]
    shape = {"rows": 2, "seq_len": 64, "lr": 1e-3, "steps": 3, "workdir": str(tmp_path)}
    on_gpu = Namespace(**shape, device="auto", precision="bf16")  # cuda where there is one
    params = levers.lever_params(on_gpu, "cuda_graphs_accumulation", tmp_path)
    assert params.batching.gradient_accumulation_steps == 2 and params.runtime.param_dtype == "fp32"
    assert params.runtime.compile_mode == "reduce-overhead" and params.runtime.compile_scope == "layers"
