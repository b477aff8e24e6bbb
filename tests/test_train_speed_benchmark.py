"""benchmarks/train_speed.py: the realistic length profile, the issue-16 verdicts and a CPU smoke run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import background

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture()
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import length_profile
    import train_speed

    return length_profile, train_speed


def test_realistic_texts_match_the_real_review_statistics(bench):
    length_profile, _ = bench
    texts = length_profile.realistic_texts(20_000, seed=0)
    stats = length_profile.text_statistics(texts)
    # The real corpus: median 27, p90 75, p99 139, max 147 characters, 2.5 % exact duplicates, a few empty
    # rows.
    assert stats["chars_median"] == 27
    assert 73 <= stats["chars_p90"] <= 77
    assert 137 <= stats["chars_p99"] <= 141
    assert 135 <= stats["chars_max"] <= 147
    assert stats["empty_rows"] == length_profile.EMPTY_ROWS
    assert 0.02 <= stats["duplicate_share"] <= 0.03
    assert length_profile.realistic_texts(2_000, seed=0) == length_profile.realistic_texts(2_000, seed=0)
    assert length_profile.realistic_texts(2_000, seed=1) != length_profile.realistic_texts(2_000, seed=0)


def test_realistic_texts_tokenize_like_real_reviews(bench):
    # Real short Korean reviews under the benchmark's 8k byte-level BPE: the issue measured
    # padding="max_length" (320) wasting 94 %, i.e. ~19 tokens per text of 35.6 characters on average (~0.51
    # tokens per character). Texts from a small word list tokenize to ~0.27 (whole words merge): every sample
    # was half as long in tokens as real ones, so attention, padding and the loss looked cheaper than they
    # are.
    from fastlm.corpus.tokenizer_source import train_bpe_tokenizer

    length_profile, train_speed = bench
    texts = length_profile.realistic_texts(20_000, seed=0)
    tokenizer = train_bpe_tokenizer(
        texts,
        vocab_size=train_speed.VOCAB_SIZE,
        min_frequency=train_speed.MIN_FREQUENCY,
        model_max_length=320,
    )
    tokens = sum(map(len, tokenizer(texts)["input_ids"]))
    characters = sum(map(len, texts))
    assert 0.47 <= tokens / characters <= 0.55
    assert 17.5 <= tokens / len(texts) + 1 <= 20.8  # mean tokens per sample, EOS included: 94 % +- 0.5 of 320


def test_issue16_verdicts_compare_fastlm_with_each_peer(bench):
    _, train_speed = bench
    table = {
        "fastlm": {"real_tokens_per_s": 2600.0, "padding_waste": 0.002},
        "fastlm_length_grouped": {"real_tokens_per_s": 2300.0, "padding_waste": 0.22},
        "trainer_group_by_length": {"real_tokens_per_s": 2700.0, "padding_waste": 0.03},
        "trainer": {"real_tokens_per_s": 600.0, "padding_waste": 0.7},
    }
    lines = dict(train_speed.verdicts_issue16(table))
    outcome = {text.split(":")[0]: ok for text, ok in lines.items()}
    assert outcome["fastlm / trainer_group_by_length >= 1.5x"] is False
    assert outcome["fastlm / trainer >= 4x"] is True
    assert outcome["fastlm / trl_packing >= 3x"] is None  # not run: n/a, not a pass
    assert outcome["fastlm padding waste <= 2%"] is True
    assert outcome["fastlm_length_grouped padding waste <= trainer_group_by_length's"] is False


def test_issue16_verdicts_judge_fastlm_against_each_peers_fastest_setup(bench):
    # Each peer in its best honest set-up: a faster bf16 row of the Trainer is the one fastlm must beat.
    _, train_speed = bench
    table = {
        "fastlm": {"real_tokens_per_s": 3000.0, "padding_waste": 0.002},
        "trainer_group_by_length": {"real_tokens_per_s": 2000.0, "padding_waste": 0.03},
        "trainer_group_by_length@bf16": {"real_tokens_per_s": 2700.0, "padding_waste": 0.02},
        "trainer_group_by_length@compile": {"real_tokens_per_s": None, "padding_waste": None},  # failed
        "fastlm_length_grouped": {"real_tokens_per_s": 2500.0, "padding_waste": 0.025},
    }
    assert train_speed.best_setup(table, "trainer_group_by_length") == "trainer_group_by_length@bf16"
    assert train_speed.best_setup(table, "trainer") == "trainer"  # not measured: its plain name, n/a below
    outcome = {text.split(":")[0]: ok for text, ok in train_speed.verdicts_issue16(table)}
    assert outcome["fastlm / trainer_group_by_length@bf16 (its fastest set-up) >= 1.5x"] is False
    assert outcome["fastlm / trainer >= 4x"] is None
    # fastlm's grouped waste is compared with the waste of the Trainer's fastest grouped row
    # (2 %), not the 3 %
    assert outcome["fastlm_length_grouped padding waste <= trainer_group_by_length's"] is False


def test_issue16_cpu_lead_over_the_trainers_fastest_simple_setup_needs_1_5x(bench):
    # The CPU target at defaults: fastlm >= 1.5x the Trainer's fastest group_by_length set-up. A 1.4x lead
    # (it passed the former 1.3x line) fails; 1.5x passes; the other comparisons keep their targets.
    _, train_speed = bench
    base = {"fastlm_length_grouped": {"real_tokens_per_s": 2500.0, "padding_waste": 0.01}}
    short = {
        **base,
        "fastlm": {"real_tokens_per_s": 1400.0, "padding_waste": 0.002},
        "trainer_group_by_length@bf16+compile": {"real_tokens_per_s": 1000.0, "padding_waste": 0.02},
        "trainer": {"real_tokens_per_s": 350.0, "padding_waste": 0.7},
    }
    outcome = {text.split(":")[0]: ok for text, ok in train_speed.verdicts_issue16(short)}
    assert outcome["fastlm / trainer_group_by_length@bf16+compile (its fastest set-up) >= 1.5x"] is False
    assert outcome["fastlm / trainer >= 4x"] is True
    enough = {**short, "fastlm": {"real_tokens_per_s": 1500.0, "padding_waste": 0.002}}
    outcome = {text.split(":")[0]: ok for text, ok in train_speed.verdicts_issue16(enough)}
    assert outcome["fastlm / trainer_group_by_length@bf16+compile (its fastest set-up) >= 1.5x"] is True


def test_contender_setups_parse_and_override_only_their_own_flags(bench):
    import argparse

    import speed_flags

    _, train_speed = bench
    parse = speed_flags.contender_type(train_speed.CONTENDERS)
    assert parse("trainer@bf16+compile") == "trainer@bf16+compile"
    for bad in ("trainer@fp8", "nobody", "fastlm@"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    args = argparse.Namespace(precision="auto", peer_precision=None, compile="auto")
    variant = speed_flags.with_setup(args, "trainer_group_by_length@bf16+compile")
    assert (variant.precision, variant.peer_precision, variant.compile) == ("bf16", "bf16", "on")
    assert speed_flags.peer_bf16(variant) and not speed_flags.peer_bf16(args)
    assert (args.precision, args.compile) == ("auto", "auto")  # the shared flags are untouched


def smoke_run(folder: Path) -> subprocess.CompletedProcess:
    """The benchmark on 300 texts, one timed step per contender: a job of tests/support/background.py."""
    env = background.environ(
        PYTHONPATH=os.pathsep.join(
            filter(None, [str(BENCHMARKS.parent / "src"), background.environ().get("PYTHONPATH")])
        )
    )
    return background.run(
        [
            sys.executable,
            str(BENCHMARKS / "train_speed.py"),
            "--rows",
            "300",
            "--steps",
            "1",
            "--warmup",
            "1",
            "--model",
            "5m",
            "--planned-texts",
            "300",
            # the 5m shape is the model's; 8 rows a step instead of 32 keep a step on CPU a fraction of a
            # second (what is asserted is the code path and the lines printed, not a speed)
            "--batch-size",
            "8",
            "--contenders",
            "fastlm_length_grouped",
            "trainer_group_by_length@bf16",
            "--json",
            str(folder / "out.json"),
        ],
        cwd=folder,
        env=env,
        timeout=300,
    )


@pytest.mark.background(job=smoke_run)
def test_cpu_smoke_run_with_the_5m_shape():
    out = background.result(smoke_run)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "profile realistic" in out.stdout and "model 5m (" in out.stdout
    assert "initial weights: identical" in out.stdout
    assert "fastlm_length_grouped padding waste <= trainer_group_by_length's:" in out.stdout
    assert "trainer_group_by_length@bf16 #1:" in out.stdout and ", bf16 True," in out.stdout
