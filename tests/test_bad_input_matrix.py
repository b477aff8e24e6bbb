"""Issue 7: the bad-input matrix. Each case is one test: one line naming the file or parameter and the fix,
a non-zero exit (2 from the CLI), and every existing output left byte for byte as it was.

One module-scoped project is built once (split + a 2-step train with a checkpoint); each test works on a
copy of it. Cases that must *work* (NaN/None texts, 1 MB texts, only duplicates) check the split report.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import namedtuple
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from fastlm.engine.checkpoint.layout import CheckpointError
from fastlm.engine.checkpoint.storage import StorageError
from fastlm.errors import ConfigError, FastlmError, InputDataError, StaleDataError, find_user_error
from tests.support import background
from tests.support.project import (
    PROJECT_ROOT,
    kedro_cli,
    make_kedro_project,
    run_pipeline,
    without_import_times,
    write_jsonl,
)
from tests.support.split_project import SHARED_SPLIT, copy_of_the_split_project
from tests.support.tiny_llama import save_project_llama
from tests.support.tiny_seq2seq import SMALL_BART_LAYERS

pytestmark = pytest.mark.e2e

SPLIT = {"tokenizer": {"vocab_size": 400}, "max_length": 48}
assert SPLIT == SHARED_SPLIT  # a background job trains in a copy of the split project, split so
TRAIN = {
    "max_steps": 2,
    "log_every": 1,
    "eval_every": None,
    "save_every": 2,
    "quiet": True,
    "batching": {"micro_batch_size": 8},
    "model": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_hidden_layers": 1},
}
CHECKPOINT = "data/06_models/checkpoints/matrix/checkpoint-00000002"  # run_name: matrix (conf/local)
Usage = namedtuple("Usage", "total used free")


@pytest.fixture(scope="module")
def base_project(tmp_path_factory, sample_texts, mlflow_uri) -> Path:
    """A project with split and train outputs (and one checkpoint), built once for the module.

    The small split/train settings live in conf/local (soft-merged over conf/base), so CLI runs use them too.
    """
    project = make_kedro_project(tmp_path_factory.mktemp("matrix") / "project", sample_texts)
    (project / "conf/local/parameters_matrix.yml").write_text(
        yaml.safe_dump({"split": SPLIT, "train": TRAIN, "run_name": "matrix"})
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project)
        patch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
        run_pipeline(project, "split")
        run_pipeline(project, "train")
    assert (project / CHECKPOINT / "COMPLETE").is_file()
    return project


@pytest.fixture
def project(base_project, tmp_path, monkeypatch, mlflow_uri) -> Path:
    """A fresh copy of the built project (cwd)."""
    copy = tmp_path / "project"
    shutil.copytree(base_project, copy, symlinks=True)
    monkeypatch.chdir(copy)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    return copy


def _snapshot(project: Path) -> dict[str, str]:
    """SHA-256 of every output file (everything under data/ but the raw inputs the tests write, and the
    output locks of a run this process stopped by KeyboardInterrupt: Kedro calls no hook for it, and the
    locks go when the process exits; a `kedro run` process exits, shown in tests/test_quiet_output.py)."""
    return {
        str(path.relative_to(project)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted((project / "data").rglob("*"))
        if path.is_file() and "01_raw" not in path.parts and not _own_output_lock(path)
    }


def _own_output_lock(path: Path) -> bool:
    """An output lock held by this process (hooks.output_lock_file, its record naming this PID)."""
    if not (path.name.startswith(".") and path.name.endswith(".lock")):
        return False
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("pid") == os.getpid()
    except (OSError, ValueError, AttributeError):
        return False


def _fails_cleanly(project: Path, pipeline: str, params: dict, error: type[FastlmError], *expected: str):
    """Run ``pipeline``: it must raise ``error`` (one line, naming ``expected``, with a fix) and write
    nothing."""
    before = _snapshot(project)
    assert before, "the module project should have outputs to protect"
    with pytest.raises(Exception) as raised:
        run_pipeline(project, pipeline, params)
    user_error = find_user_error(raised.value)
    assert isinstance(user_error, error), repr(raised.value)
    message = str(user_error)
    assert "\n" not in message and "Fix:" in message, message
    for part in expected:
        assert part in message, message
    assert _snapshot(project) == before
    return message


def _report(project: Path) -> dict:
    return json.loads((project / "data/08_reporting/split_report.json").read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------------------------- split: files


def test_missing_raw_file(project):
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/missing.jsonl"},
        InputDataError,
        "data/01_raw/missing.jsonl does not exist",
        "raw_path",
    )


def test_empty_raw_file(project):
    (project / "data/01_raw/empty.jsonl").write_bytes(b"")
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/empty.jsonl"},
        InputDataError,
        "data/01_raw/empty.jsonl is empty",
        "raw_path",
    )


def test_unknown_extension(project):
    (project / "data/01_raw/corpus.docx").write_bytes(b"PK\x03\x04 a word document")
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/corpus.docx"},
        InputDataError,
        "data/01_raw/corpus.docx: unknown extension '.docx'",
        ".jsonl",
    )


def test_missing_text_column(project):
    message = _fails_cleanly(
        project,
        "split",
        {"split": {"text_column": "body"}},
        InputDataError,
        "has no column 'body'",
        "split.text_column",
    )
    # the file named as the README's example names it: relative to the project
    assert message.startswith("data/01_raw/demo_corpus.jsonl has no column 'body'"), message


def test_invalid_utf8_bytes_in_csv(project):
    # Korean CP949 is now read (see round two); bytes of another legacy encoding are still refused
    (project / "data/01_raw/legacy.csv").write_bytes(
        b"text\nhello\n" + "Très bien café crème\n".encode("latin-1")
    )
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/legacy.csv"},
        InputDataError,
        "data/01_raw/legacy.csv is not valid UTF-8",
        "iconv",
    )


# ------------------------------------------------------------------------------------------- split: contents


@pytest.mark.parametrize("extension", ["jsonl", "parquet"])
def test_a_column_of_numbers(project, extension):
    path = project / f"data/01_raw/numbers.{extension}"
    if extension == "jsonl":
        write_jsonl(path, list(range(40)))
    else:
        pd.DataFrame({"text": np.arange(40, dtype=np.int64)}).to_parquet(path)
    _fails_cleanly(
        project,
        "split",
        {"raw_path": str(path.relative_to(project))},
        InputDataError,
        f"data/01_raw/numbers.{extension} after cleaning 40 rows",
        "'non_string': 40",
        "split.text_column",
    )


def test_all_nan_and_none_texts(project):
    pd.DataFrame({"text": [None, float("nan")] * 20}, dtype=object).to_parquet(
        project / "data/01_raw/nan.parquet"
    )
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/nan.parquet"},
        InputDataError,
        "data/01_raw/nan.parquet after cleaning 40 rows",
        "'missing': 40",
        "split.text_column",
    )


def test_all_rows_empty_after_cleaning(project):
    write_jsonl(project / "data/01_raw/blank.jsonl", ["", "   ", "\t\n", "\u3000"])
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/blank.jsonl"},
        InputDataError,
        "data/01_raw/blank.jsonl after cleaning 4 rows",
        "'whitespace_only': 3",
        "split.text_column",
    )


def test_ratios_not_summing_to_one(project):
    _fails_cleanly(
        project,
        "split",
        {"split": {"ratios": {"train": 0.5, "validation": 0.1, "test": 0.1}}},
        ConfigError,
        "parameters split.ratios.train = 0.5, split.ratios.validation = 0.1 and split.ratios.test = 0.1",
        "must sum to 1",
        "--params split.ratios.train=",
    )


def test_nan_and_none_texts_are_dropped_and_counted(project, sample_texts):
    rows = sample_texts[:200] + [None, float("nan"), None]
    pd.DataFrame({"text": rows}, dtype=object).to_parquet(project / "data/01_raw/some_nan.parquet")
    run_pipeline(project, "split", {"raw_path": "data/01_raw/some_nan.parquet"})
    report = _report(project)
    assert report["raw_rows"] == 203 and report["dropped"]["missing"] == 3
    assert report["kept_rows"] == len(set(sample_texts[:200]))


def test_one_megabyte_texts_are_truncated_not_refused(project, sample_texts):
    body = " ".join(sample_texts)
    huge = [(body * (1_000_000 // len(body) + 1))[:1_000_000], ("x" + body) * (1_000_000 // len(body) + 1)]
    write_jsonl(project / "data/01_raw/huge.jsonl", sample_texts[:100] + huge)
    run_pipeline(project, "split", {"raw_path": "data/01_raw/huge.jsonl"})
    report = _report(project)
    assert report["kept_rows"] == 102
    assert sum(split.get("truncated_rows", 0) for split in report["splits"].values()) >= 2
    assert max(split["max_length"] for split in report["splits"].values()) == SPLIT["max_length"]


def test_only_duplicates_keep_one(project):
    # one text is kept; since round two (issue 15) a corpus that leaves a split empty is refused before
    # writing
    text = "배송이 빠르고 포장도 꼼꼼해요. The battery lasts all day."
    write_jsonl(project / "data/01_raw/dupes.jsonl", [text] * 30)
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/dupes.jsonl"},
        InputDataError,
        "split would be empty: 1 text with",
        "give more texts",
    )


# ----------------------------------------------------------------------------------------- train: parameters


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({"batching": {"micro_batch_size": 0}}, "train.batching.micro_batch_size = 0"),
        ({"batching": {"micro_batch_size": -4}}, "train.batching.micro_batch_size = -4"),
        ({"batching": {"gradient_accumulation_steps": 0}}, "train.batching.gradient_accumulation_steps = 0"),
        (
            {"batching": {"gradient_accumulation_steps": -1}},
            "train.batching.gradient_accumulation_steps = -1",
        ),
        ({"max_steps": 0}, "train.max_steps = 0"),
        ({"max_steps": -5}, "train.max_steps = -5"),
        ({"max_minutes": 0}, "train.max_minutes = 0"),
        ({"batching": {"mode": "padded"}}, "train.batching.mode = 'padded'"),
        ({"optimizer": {"lr": 0.0}}, "train.optimizer.lr = 0.0"),
        ({"optimizer": {"lr": -0.001}}, "train.optimizer.lr = -0.001"),
        ({"loss": {"label_smoothing": 1.0}}, "train.loss.label_smoothing = 1.0"),
        ({"loss": {"label_smoothing": -0.1}}, "train.loss.label_smoothing = -0.1"),
        (
            {"early_stopping": {"patience": 2}, "eval_every": None},
            "early stopping needs evaluations every N steps",
        ),
        ({"model": {"lora": {"loraplus_lr_ratio": 16}}}, "loraplus_lr_ratio sets the LoRA B matrices"),
        ({"model": {"lora": {"enabled": True, "loraplus_lr_ratio": 0}}}, "loraplus_lr_ratio = 0"),
        # was a full fine-tune of every weight in full precision, saved as a whole model, without a word
        ({"model": {"lora": {"load_in_4bit": True}}}, "load_in_4bit quantizes the frozen base of LoRA"),
    ],
    ids=[
        "micro_batch_0",
        "micro_batch_neg",
        "accumulation_0",
        "accumulation_neg",
        "max_steps_0",
        "max_steps_neg",
        "max_minutes_0",
        "batching_mode",
        "lr_0",
        "lr_neg",
        "label_smoothing_1",
        "label_smoothing_neg",
        "early_stopping_without_evaluations",
        "loraplus_without_lora",
        "loraplus_0",
        "qlora_without_lora",
    ],
)
def test_bad_train_parameter(project, train, expected):
    _fails_cleanly(project, "train", {"train": train}, ConfigError, expected, "--params")


def test_model_path_that_does_not_exist(project):
    _fails_cleanly(
        project,
        "train",
        {"train": {"model": {"name_or_path": "./no/such/model"}}},
        ConfigError,
        "train.model.name_or_path = './no/such/model' is not a model directory",
    )


def test_pretrained_weights_without_a_tokenizer_on_data_of_the_splits_own_tokenizer(project):
    """Weights without tokenizer files, data tokenized by the tokenizer the split trained: nothing to compare,
    the sizes fit, and the pretrained embeddings would read ids that mean something else (exit 0)."""
    path = save_project_llama(project, with_tokenizer=False)
    _fails_cleanly(
        project,
        "train",
        {"train": {"model": {"name_or_path": path}}},
        ConfigError,
        "a tokenizer the split trained",
        "holds no tokenizer",
        "split.tokenizer.source",
    )


def test_max_length_above_the_models_positions(project):
    path = save_project_llama(project, max_positions=32)
    _fails_cleanly(
        project,
        "train",
        {"train": {"model": {"name_or_path": path}}},
        ConfigError,
        "split.max_length = 48 exceeds the model's max_position_embeddings (32)",
        "split.max_length <= 32",
    )


def test_tokenizer_and_model_vocabularies_disagree(project):
    path = save_project_llama(project, vocab_size=50)  # its own tokenizer is larger
    _fails_cleanly(
        project,
        "train",
        {"train": {"model": {"name_or_path": path}}},
        ConfigError,
        "the model's embedding has 50",
        "train.model.resize_embeddings: true",
    )


# ------------------------------------------------------------------------------------ train: stale or broken


def test_stale_tokenized_data_after_a_max_length_change(project):
    _fails_cleanly(
        project,
        "train",
        {"split": {"max_length": 64}},
        StaleDataError,
        "data/05_model_input/tokenized_corpus is stale",
        "max_length 48 -> 64",
        "kedro run --pipeline=split",
    )


def test_stale_tokenized_data_after_a_tokenizer_change(project, bpe_tokenizer):
    folder = project / "data/06_models/tokenizer"
    shutil.rmtree(folder)
    bpe_tokenizer.save_pretrained(folder)
    _fails_cleanly(
        project,
        "train",
        {},
        StaleDataError,
        "is stale",
        "the tokenizer changed",
        "kedro run --pipeline=split",
    )


def _corrupt_checkpoint(project: Path) -> Path:
    model_file = project / CHECKPOINT / "model.safetensors"
    model_file.write_bytes(b"\x5a" * model_file.stat().st_size)  # same size: the manifest check passes
    return model_file


def test_corrupted_checkpoint_names_the_file(project):
    model_file = _corrupt_checkpoint(project)
    _fails_cleanly(
        project,
        "train",
        {"train": {"resume": "auto"}},
        CheckpointError,
        f"checkpoint file {model_file.relative_to(project)} is unreadable",
        "train.resume: never",
    )


# ------------------------------------------------------------------------------------------- the real CLI


def _one_line_exit_2(project: Path, *args: str) -> str:
    before = _snapshot(project)
    done = kedro_cli(project, *args)
    return _refused_in_one_line(done, before, _snapshot(project))


def _refused_in_one_line(done, before: dict, after: dict) -> str:
    """``done`` (a `kedro run`) exited 2 without a traceback, its last line one ``fastlm: error:`` with a fix,
    said once, and the outputs under data/ are as they were (``before``, ``after``)."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fastlm: error:") and "Fix:" in last, last
    said = last.removeprefix("fastlm: error:").strip().split(". Fix:")[0]
    assert (done.stdout + done.stderr).count(said) == 1, done.stdout[-3000:]  # said once, not by Kedro too
    assert after == before
    return last


# The module's project built in a fresh process (a copy of the split project trained as base_project trains
# it), with a tiny Llama for the project's tokenizer (save_project_llama) one of whose tensors is then
# removed; prints the Llama's folder as train.model.name_or_path takes it.
BUILD = """
import json, sys
from pathlib import Path
sys.path[:0] = [{repo!r}, {scripts!r}]  # tests.support; demo_data (pytest's pythonpath)


def main():
    from safetensors.torch import load_file, save_file

    from tests.support.project import run_pipeline
    from tests.support.tiny_llama import save_project_llama

    project = Path.cwd()
    run_pipeline(project, "train")
    folder = project / save_project_llama(project)
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.0.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={{"format": "pt"}})
    print(json.dumps({{"llama": f"./{{folder.relative_to(project)}}"}}))


if __name__ == "__main__":
    main()
"""
REMOVED_TENSOR = "model.layers.0.mlp.up_proj.weight"


def _digests(project: Path) -> dict[str, str]:
    """_snapshot with the built-in open (a background job's: tests patch Path.open)."""
    digests = {}
    for folder, _, names in os.walk(project / "data"):
        for name in names:
            path = Path(folder) / name
            if "01_raw" not in path.parts:
                with open(path, "rb") as file:
                    digests[str(path.relative_to(project))] = hashlib.sha256(file.read()).hexdigest()
    return dict(sorted(digests.items()))


def cli_refusals_in_a_built_project(folder: Path) -> dict:
    """The module's project (its conf/local parameters, an MLflow store of its own: the split project's,
    tests/support/split_project.py, copied with it and split as the module splits) built in a fresh process,
    then in a copy each: `kedro run` with a misspelled parameter key, on a corrupted checkpoint, and on a
    pretrained folder with a removed tensor; each run's copy, the digests of data/ before and after, the
    run, and when it started, and the modules it imported (the misspelled key's run alone lists them; a job
    of tests/support/background.py)."""
    project = folder / "built"
    split = copy_of_the_split_project(project)
    if split.returncode != 0:
        return {"build": split}
    shutil.move(project / "mlflow.db", folder / "mlflow.db")  # the store the copies below share
    if os.path.exists(project / "mlruns"):
        shutil.move(project / "mlruns", folder / "mlruns")  # its artefacts, beside it
    with open(project / "conf/local/parameters_matrix.yml", "w") as file:
        file.write(yaml.safe_dump({"split": SPLIT, "train": TRAIN, "run_name": "matrix"}))
    env = background.environ(
        DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=f"sqlite:///{folder / 'mlflow.db'}"
    )
    script = BUILD.format(repo=str(PROJECT_ROOT), scripts=str(PROJECT_ROOT / "scripts"))
    build = background.run([sys.executable, "-c", script], cwd=project, env=env)
    runs = {"build": build, "mlflow": folder / "mlflow.db"}
    if build.returncode != 0:
        return runs
    llama = json.loads(build.stdout.strip().splitlines()[-1])["llama"]
    runs["llama"] = llama
    for name, args in {
        "misspelled": ("--pipeline=split", "--params", "split.max_lenght=64"),
        "corrupted": ("--pipeline=train", "--params", "train.resume=auto"),
        "removed_tensor": ("--pipeline=train", "--params", f"train.model.name_or_path={llama}"),
    }.items():
        copy = folder / name
        shutil.copytree(project, copy, symlinks=True)
        if name == "corrupted":  # as _corrupt_checkpoint
            model_file = copy / CHECKPOINT / "model.safetensors"
            size = os.path.getsize(model_file)
            with open(model_file, "wb") as file:
                file.write(b"\x5a" * size)
        before, started_ms = _digests(copy), int(time.time() * 1000)
        timed = {**env, "PYTHONPROFILEIMPORTTIME": "1"} if name == "misspelled" else env  # what it imports
        done = background.run([sys.executable, "-m", "kedro", "run", *args], cwd=copy, env=timed)
        done, runs[f"{name}_imported"] = without_import_times(done)
        runs[name] = (copy, before, done, _digests(copy), started_ms)
    return runs


def _cli_refusal(name: str) -> tuple[Path, str, dict]:
    """The project copy of the job's ``name`` run, the line it was refused with (_refused_in_one_line), and
    every run of the job."""
    runs = background.result(cli_refusals_in_a_built_project)
    assert runs["build"].returncode == 0, runs["build"].stderr[-3000:]
    copy, before, done, after, _ = runs[name]
    assert before, "the built project should have outputs to protect"
    return copy, _refused_in_one_line(done, before, after), runs


@pytest.mark.background(job=cli_refusals_in_a_built_project)
def test_cli_misspelled_parameter_key():
    _, last, runs = _cli_refusal("misspelled")
    assert "unknown parameter split.max_lenght (did you mean split.max_length?)" in last
    # refused before MLflow is set up (seconds a refusal would wait): neither kedro-mlflow's hook nor MLflow's
    # SQL store imported (Kedro's CLI imports MLflow itself, for kedro-mlflow's `kedro mlflow` commands)
    imported = runs["misspelled_imported"]
    assert "kedro" in imported and "kedro_mlflow.framework.hooks.mlflow_hook" not in imported
    assert "mlflow.store.tracking.sqlalchemy_store" not in imported
    said = runs["misspelled"][2].stdout + runs["misspelled"][2].stderr
    assert "UserWarning" not in said, said[-3000:]


@pytest.mark.background(job=cli_refusals_in_a_built_project)
def test_cli_corrupted_checkpoint():
    copy, last, _ = _cli_refusal("corrupted")
    model_file = copy / CHECKPOINT / "model.safetensors"
    assert f"checkpoint file {model_file.relative_to(copy)} is unreadable" in last


# ------------------------------------------------------------------------------- storage and --params keys


def _deny_writes_under(monkeypatch, folder: Path) -> None:
    """Creating a file under ``folder`` fails as in a read-only folder (chmod does not stop root)."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve().is_relative_to(folder.resolve()):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


def test_disk_full_before_training(project, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 4096, 4096))
    _fails_cleanly(
        project,
        "train",
        {},
        StorageError,
        "not enough free disk space",
        "train.checkpoint_dir",
        "4.1 KB is free",
        "lower train.keep_last",
    )


def test_unwritable_checkpoint_folder(project, monkeypatch):
    _deny_writes_under(monkeypatch, project / "data/06_models/checkpoints")
    _fails_cleanly(
        project, "train", {}, StorageError, "train.checkpoint_dir", "is not writable", "Permission denied"
    )


def test_unwritable_split_output_folder(project, monkeypatch):
    _deny_writes_under(monkeypatch, project / "data/05_model_input")
    _fails_cleanly(
        project, "split", {}, StorageError, "tokenized_corpus", "data/05_model_input is not writable"
    )


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"raw_pth": "data/01_raw/mine.jsonl"}, "unknown parameter raw_pth (did you mean raw_path?)"),
        ({"trian": {"max_steps": 3}}, "unknown parameter trian.max_steps (did you mean train.max_steps?)"),
    ],
    ids=["raw_pth", "trian"],
)
def test_misspelled_top_level_params_key_is_refused(project, sample_texts, params, expected):
    """Refused before any node runs, as a misspelled key inside a group is: a warning let the split re-split
    the demo corpus over the outputs while the user's own file was ignored."""
    write_jsonl(project / "data/01_raw/mine.jsonl", sample_texts[:50])
    _fails_cleanly(project, "split", params, ConfigError, expected, "--params")


# --------------------------------------------------------- train: pretrained folders (issues 21 and 15)


def _save_tiny_pretrained(project: Path, kind: str) -> str:
    """A tiny BART, T5 or BERT masked-LM folder for the project's tokenizer (save_pretrained, no hub)."""
    from transformers import (
        AutoTokenizer,
        BartConfig,
        BartForConditionalGeneration,
        BertConfig,
        BertForMaskedLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    tokenizer = AutoTokenizer.from_pretrained(project / "data/06_models/tokenizer", local_files_only=True)
    vocab = len(tokenizer)
    model = {
        "bart": lambda: BartForConditionalGeneration(
            BartConfig(
                vocab_size=vocab,
                **SMALL_BART_LAYERS,
            )
        ),
        "t5": lambda: T5ForConditionalGeneration(
            T5Config(vocab_size=vocab, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2)
        ),
        "bert": lambda: BertForMaskedLM(
            BertConfig(
                vocab_size=vocab,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                max_position_embeddings=64,
            )
        ),
    }[kind]()
    folder = project / "models" / kind
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)  # its own tokenizer: the data's
    return f"./{folder.relative_to(project)}"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("bart", "encoder-decoder model: it trains on prompt/response data"),
        ("t5", "encoder-decoder model: it trains on prompt/response data"),
        ("bert", "fastlm trains causal and seq2seq LMs"),
    ],
    ids=["bart_on_plain_text", "t5_on_plain_text", "bert_masked_lm"],
)
def test_pretrained_folder_that_is_not_a_causal_lm(project, kind, expected):
    """BART and T5 train as seq2seq, but only on prompt/response data: the matrix project's corpus is plain
    text."""
    path = _save_tiny_pretrained(project, kind)
    _fails_cleanly(
        project,
        "train",
        {"train": {"model": {"name_or_path": path}}},
        ConfigError,
        expected,
        *(
            [f"model type {kind}", path]
            if kind == "bert"
            else ["ForConditionalGeneration", "split.prompt_column"]
        ),
    )


def _break_model_folder(folder: Path, how: str) -> str:
    if how == "empty_folder":
        shutil.rmtree(folder)
        folder.mkdir()
        return "config.json"
    name = "config.json" if how == "cut_config" else "model.safetensors"
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[: len(data) // 2])
    return name


@pytest.mark.parametrize("how", ["empty_folder", "cut_config", "cut_safetensors"])
def test_broken_pretrained_folder_names_the_file(project, how):
    path = save_project_llama(project)
    name = _break_model_folder(project / path, how)
    _fails_cleanly(
        project, "train", {"train": {"model": {"name_or_path": path}}}, ConfigError, f"{path}/{name}"
    )


@pytest.mark.background(job=cli_refusals_in_a_built_project)
def test_cli_pretrained_folder_with_a_removed_tensor():
    """A cut or edited safetensors (one tensor gone) is refused before training, and no run is FINISHED."""
    _, last, runs = _cli_refusal("removed_tensor")
    path, started_ms = runs["llama"], runs["removed_tensor"][-1]
    assert REMOVED_TENSOR in last and path in last, last
    with contextlib.closing(sqlite3.connect(runs["mlflow"])) as store:
        started = store.execute("select name, status from runs where start_time >= ?", (started_ms,))
        runs_since = started.fetchall()
    assert all(status != "FINISHED" for _, status in runs_since), runs_since


# ------------------------------------------------------------------------------------- round two (issue 15)


@pytest.mark.parametrize(
    ("split", "expected"),
    [
        ({"ratios": {"train": 0.8, "validation": 0.1, "test": 0.1}}, "split.ratios"),
        ({"hash_salt": "again"}, "split.hash_salt"),
        ({"max_samples": 100}, "split.max_samples"),
    ],
    ids=["ratios", "hash_salt", "max_samples"],
)
def test_stale_tokenized_data_after_a_split_parameter_change(project, split, expected):
    _fails_cleanly(
        project,
        "train",
        {"split": split},
        StaleDataError,
        "data/05_model_input/tokenized_corpus is stale",
        expected,
        "kedro run --pipeline=split",
    )


def test_an_empty_test_split_is_refused_before_writing(project):
    ratios = {"train": 0.95, "validation": 0.05, "test": 0.0}
    _fails_cleanly(
        project,
        "split",
        {"split": {"ratios": ratios}},
        InputDataError,
        "the test split would be empty",
        "split.ratios.test",
    )


def test_a_two_row_corpus_is_refused_before_writing(project, sample_texts):
    write_jsonl(project / "data/01_raw/two.jsonl", sample_texts[:2])
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/two.jsonl"},
        InputDataError,
        "split would be empty",
        "2 texts",
    )


@pytest.mark.timeout(120)
def test_a_named_pipe_as_the_raw_file_is_refused(project):
    os.mkfifo(project / "data/01_raw/pipe.jsonl")
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/pipe.jsonl"},
        InputDataError,
        "data/01_raw/pipe.jsonl is not a regular file",
        "raw_path",
    )


def _korean_rows(sample_texts) -> list[str]:
    """Korean review-like texts that EUC-KR can encode (the sample texts hold emoji, which it cannot)."""
    words = [
        "배송이",
        "빠르고",
        "포장도",
        "꼼꼼해요",
        "가격",
        "대비",
        "만족합니다",
        "재구매",
        "의사",
        "있어요",
    ]
    return [
        " ".join(words[(index + shift) % len(words)] for shift in range(1 + index % 7)) + f" {index}번째 후기"
        for index in range(120)
    ]


@pytest.mark.parametrize(
    ("encoding", "extension"), [("euc-kr", "jsonl"), ("cp949", "jsonl"), ("cp949", "csv")]
)
def test_korean_legacy_encodings_are_read(project, sample_texts, encoding, extension):
    rows = (
        _korean_rows(sample_texts) + ["똠방각하 뷁 햏"] if encoding == "cp949" else _korean_rows(sample_texts)
    )
    if extension == "jsonl":
        lines = "".join(json.dumps({"text": row}, ensure_ascii=False) + "\n" for row in rows)
    else:
        lines = pd.DataFrame({"text": rows}).to_csv(index=False)
    (project / f"data/01_raw/korean.{extension}").write_bytes(lines.encode(encoding))
    run_pipeline(project, "split", {"raw_path": f"data/01_raw/korean.{extension}"})
    assert _report(project)["kept_rows"] == len(rows)
    splits = pd.read_parquet(project / "data/03_primary/corpus_splits.parquet")
    assert set(splits["text"]) == set(rows)


@pytest.mark.parametrize("encoding", ["latin-1", "utf-16"])
def test_other_encodings_are_named_in_the_hint(project, encoding):
    """The hint names an encoding that really reads the file back (never cp949, never a Central European guess
    that turns a French è into č)."""
    rows = ["Le café est très bon, merci beaucoup à vous. Ça va très bien, à bientôt !"] * 3
    text = "text\n" + "\n".join(rows) + "\n"
    (project / "data/01_raw/other.csv").write_bytes(text.encode(encoding))
    message = _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/other.csv"},
        InputDataError,
        "data/01_raw/other.csv is not valid UTF-8",
        "iconv -f ",
    )
    named = message.split("iconv -f ", 1)[1].split()[0]
    assert "cp949" not in message.lower()
    assert (project / "data/01_raw/other.csv").read_bytes().decode(named) == text, named


def test_a_json_array_file_is_read(project, sample_texts):
    rows = sample_texts[:150]
    (project / "data/01_raw/array.json").write_text(
        json.dumps([{"text": row} for row in rows]), encoding="utf-8"
    )
    run_pipeline(project, "split", {"raw_path": "data/01_raw/array.json"})
    assert _report(project)["kept_rows"] == len(set(rows))


def test_a_malformed_jsonl_line_is_named_by_number(project):
    lines = ['{"text": "one"}', '{"text": "two"}', '{"text": "three"', '{"text": "four"}']
    (project / "data/01_raw/broken.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/broken.jsonl"},
        InputDataError,
        "data/01_raw/broken.jsonl line 3",
        "not valid JSON",
    )


def test_a_huge_max_length_is_refused_at_validation(project):
    _fails_cleanly(
        project,
        "split",
        {"split": {"max_length": 1_000_000_000}},
        ConfigError,
        "split.max_length = 1000000000",
        "--params split.max_length",
    )


def test_a_long_line_is_cut_by_characters_before_tokenizing(bpe_tokenizer, monkeypatch):
    from fastlm.corpus import tokenization

    seen = []
    real = tokenization.cut_long_texts

    def spy(*args, **kwargs):  # what reaches the tokenizer
        texts, cut = real(*args, **kwargs)
        seen.extend(len(text) for text in texts)
        return texts, cut

    monkeypatch.setattr(tokenization, "cut_long_texts", spy)
    long_text = "배송 빠름 fast delivery " * 100_000  # 2 MB of text on one line
    tokens = tokenization.tokenize_texts(
        [long_text, "short"], bpe_tokenizer, max_length=48, batch_size=10, num_proc=1
    )
    assert max(seen) <= 48 * tokenization.MAX_CHARS_PER_TOKEN < len(long_text) // 100
    assert tokens.lengths.tolist()[0] == 48 and bool(tokens.truncated[0]) and not bool(tokens.truncated[1])


@pytest.mark.parametrize(
    ("runtime", "expected"),
    [
        ({"device": "cuda"}, "train.runtime.device = 'cuda'"),
        ({"device": "gpu"}, "train.runtime.device = 'gpu'"),
        ({"device": "cpu", "precision": "fp16"}, "train.runtime.precision = 'fp16'"),
    ],
    ids=["cuda", "gpu", "fp16"],
)
def test_a_device_or_precision_this_machine_lacks(project, runtime, expected):
    import torch

    if torch.cuda.is_available() and runtime.get("device") != "gpu":
        pytest.skip("this machine has CUDA")
    _fails_cleanly(project, "train", {"train": {"runtime": runtime}}, ConfigError, expected)


@pytest.mark.parametrize(
    ("path", "pipeline"),
    [
        ("data/05_model_input/tokenized_corpus_fingerprint.json", "train"),
        ("data/05_model_input/tokenized_corpus/train/data-00000-of-00001.arrow", "train"),
        ("data/08_reporting/train_summary.json", "report"),
        ("data/06_models/model/model.safetensors", "report"),
        ("data/06_models/model/config.json", "report"),
    ],
    ids=["fingerprint", "arrow", "train_summary", "model_weights", "model_config"],
)
def test_a_cut_off_output_is_named_with_the_pipeline_to_rerun(project, path, pipeline):
    cut = project / path
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    producer = "split" if "05_model_input" in path else "train"
    _fails_cleanly(
        project,
        pipeline,
        {},
        InputDataError,
        f"{path} is cut off or corrupt",
        f"kedro run --pipeline={producer}",
    )


@pytest.mark.parametrize(
    ("content", "what"), [("{}", "an empty object"), ("null", "null")], ids=["empty_object", "null"]
)
def test_a_train_summary_that_is_no_training_summary_is_refused_before_the_report(project, content, what):
    path = "data/08_reporting/train_summary.json"
    (project / path).write_text(content, encoding="utf-8")
    _fails_cleanly(
        project, "report", {}, InputDataError, f"{path} holds {what}", "kedro run --pipeline=train"
    )


def _arrow_buffer_span(arrow: Path, column: str, buffer: int) -> tuple[int, int]:
    """Where one buffer of ``column`` (1: a list's offsets, 3: its values) lies in the Arrow IPC file."""
    import pyarrow as pa

    with pa.memory_map(str(arrow)) as source:
        base = source.read_buffer(8).address  # a zero-length read has no address
        source.seek(0)
        batch = next(iter(pa.ipc.open_stream(source)))
        found = batch.column(column).buffers()[buffer]
        return found.address - base, found.size


@pytest.mark.parametrize("buffer", [1, 3], ids=["offsets", "token_ids"])
def test_garbage_inside_an_arrow_body_is_named_with_the_pipeline_to_rerun(project, buffer):
    """Bytes overwritten inside the file (its size unchanged: no cut): offsets pointing anywhere failed with
    an IndexError deep in a collator; token ids of -1 trained without a word."""
    arrow = project / "data/05_model_input/tokenized_corpus/train/data-00000-of-00001.arrow"
    start, size = _arrow_buffer_span(arrow, "input_ids", buffer)
    body = bytearray(arrow.read_bytes())
    body[start + size // 4 : start + size // 2] = b"\xff" * (size // 2 - size // 4)
    arrow.write_bytes(bytes(body))
    _fails_cleanly(
        project,
        "train",
        {},
        InputDataError,
        "data/05_model_input/tokenized_corpus/train/data-00000-of-00001.arrow is cut off or corrupt",
        "kedro run --pipeline=split",
    )


@pytest.mark.timeout(60)
def test_a_named_pipe_in_place_of_a_saved_arrow_file_is_refused_without_hanging(project):
    arrow = project / "data/05_model_input/tokenized_corpus/train/data-00000-of-00001.arrow"
    arrow.unlink()
    os.mkfifo(arrow)
    _fails_cleanly(
        project,
        "train",
        {},
        InputDataError,
        "data/05_model_input/tokenized_corpus/train/data-00000-of-00001.arrow is not a regular file",
        "kedro run --pipeline=split",
    )


@pytest.mark.parametrize("stopped_in", ["split_corpus", "build_tokenizer", "tokenize_corpus", "report_split"])
def test_a_split_stopped_part_way_leaves_outputs_no_pipeline_uses(project, stopped_in):
    """A re-split with another hash_salt stopped inside a node (as by kill -9 or a full disk): new splits or a
    new tokenizer beside the old tokenized data. The report used them (its ROUGE prompts were training rows);
    now every pipeline reading split outputs refuses until a split finishes."""
    from fastlm.pipelines.split import nodes

    def stopped(*args, **kwargs):
        # what the process sees of a kill is nothing at all: nothing may rely on cleanup
        raise KeyboardInterrupt

    report = {
        "report": {
            "prompts": ["배송"],
            "max_new_tokens": 2,
            "eval_max_batches": 1,
            "decoding": [{"name": "greedy"}],
            "references": {"enabled": False},
        }
    }
    before = _snapshot(project)
    # a patch of its own: undoing the fixture's monkeypatch would also drop MLFLOW_TRACKING_URI, and every
    # later run would create MLflow's schema afresh in the project folder (seconds each time)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(nodes, stopped_in, stopped)
        run_pipeline(project, "split", {"split": {**SPLIT, "hash_salt": "another salt"}})
    if _snapshot(project) == before:  # stopped before its first save: the old, whole split is still in use
        assert stopped_in == "split_corpus"
        run_pipeline(project, "report", report)
        return
    for pipeline in ("report", "train"):
        _fails_cleanly(project, pipeline, {}, InputDataError, "did not finish", "kedro run --pipeline=split")
    run_pipeline(project, "split")  # a split that finishes makes its outputs usable again
    run_pipeline(project, "report", report)


def test_disk_full_while_split_saves(project):
    import datasets

    def disk_full(self, path, *args, **kwargs):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "partial.arrow").write_bytes(b"\0" * 64)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))

    before = _snapshot(project)
    with pytest.MonkeyPatch.context() as patch, pytest.raises(Exception) as raised:  # keeps the fixture's env
        patch.setattr(datasets.DatasetDict, "save_to_disk", disk_full)
        run_pipeline(project, "split", {})
    message = str(find_user_error(raised.value))
    assert isinstance(find_user_error(raised.value), StorageError) and "\n" not in message, message
    assert "data/05_model_input/tokenized_corpus" in message and "the disk is full" in message
    # The tokenized data stays whole (written aside, never half); the splits and tokenizer before it were
    # saved again, so the split is unfinished: its marker is gone and the pipelines reading it refuse (next
    # test).
    after = _snapshot(project)
    assert {k: v for k, v in before.items() if not k.endswith("split_complete.json")} == after
    _fails_cleanly(project, "train", {}, InputDataError, "did not finish", "kedro run --pipeline=split")


def test_mistyped_env(project):
    """What ``kedro run --env quik`` meets first in the project CLI (``fastlm.cli``), before Kedro starts."""
    from fastlm.cli import check_env

    before = _snapshot(project)
    with pytest.raises(ConfigError) as raised:
        check_env("quik", None)
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message
    assert "--env quik" in message and "conf/quik" in message and "quick" in message
    assert _snapshot(project) == before


def _conf_file_refusal(project, name: str, text: str) -> str:
    """The one line the project CLI makes of Kedro's error for ``conf/local/<name>`` holding ``text``, a split
    run refused with nothing under the project changed."""
    from fastlm.cli import config_file_error

    (project / "conf/local" / name).write_text(text)
    before = _snapshot(project)
    with pytest.raises(Exception) as raised:
        run_pipeline(project, "split")
    message = str(config_file_error(raised.value))
    assert "\n" not in message and "Fix:" in message
    assert _snapshot(project) == before
    return message


def test_yaml_syntax_error_names_file_and_line(project):
    """Kedro's own error for a broken conf file, as the project CLI turns it into one line."""
    message = _conf_file_refusal(
        project, "parameters_typo.yml", "split:\n  max_length: 48\n  ratios: {train: 0.9\n"
    )
    assert "conf/local/parameters_typo.yml line 4" in message and "invalid YAML" in message


def test_a_tuned_file_cut_short_says_to_delete_it_and_tune_again(project):
    """conf/local/parameters_tuned.yml cut part way (a copy or a sync stopped, an edit saved half done: the
    tune itself replaces it whole) stops every run, the tune that would write it again included: the line
    names the file and says it is the tune's, to delete and tune again, besides correcting the YAML. (It
    said only to correct the indentation, a ':' or a quote in a file no user wrote.)"""
    message = _conf_file_refusal(
        project,
        "parameters_tuned.yml",
        "train:\n  batching:\n    micro_batch_size: 4\ntune_measured_on:\n  device: cpu (24\n  split.max_len",
    )
    assert "conf/local/parameters_tuned.yml line" in message and "invalid YAML" in message, message
    fix = message[message.index("Fix:") :]
    assert "delete conf/local/parameters_tuned.yml" in fix and "kedro run --pipeline=tune" in fix, message


def test_a_key_written_twice_in_a_conf_file_names_the_file_line_and_key(project):
    """Kedro's loader (OmegaConf's) refuses a key a conf file's mapping writes twice, but its error names no
    file (``<file>``) and the one line said to fix the indentation or a quote: it names the file, the line and
    the key, and says to keep one of the two."""
    message = _conf_file_refusal(
        project,
        "parameters_tuned.yml",
        "train:\n  batching:\n    micro_batch_size: 4\n    micro_batch_size: 8\n",
    )
    assert "conf/local/parameters_tuned.yml line 4" in message and "'micro_batch_size' twice" in message, (
        message
    )


def test_kedro_env_variable_naming_no_folder(project, monkeypatch):
    """``KEDRO_ENV=doesnotexist kedro run``: Kedro reads the variable itself, so the project CLI checks it as
    it checks ``--env`` (it was a MissingConfigException traceback, exit 1)."""
    monkeypatch.setenv("KEDRO_ENV", "doesnotexist")
    last = _one_line_exit_2(project, "--pipeline=split")
    assert "KEDRO_ENV=doesnotexist" in last and "conf/doesnotexist" in last and "local, quick" in last, last


def test_missing_configuration_is_one_line(project):
    """Kedro's own MissingConfigException (here an environment reached past the CLI's check), as the project
    CLI turns it into one line."""
    from fastlm.cli import config_file_error

    before = _snapshot(project)
    with pytest.raises(Exception) as raised:
        run_pipeline(project, "split", env="doesnotexist")
    message = str(config_file_error(raised.value))
    assert "\n" not in message and "Fix:" in message, message
    assert "conf/doesnotexist" in message and "local, quick" in message, message
    assert _snapshot(project) == before


def test_the_same_key_in_two_files_of_one_environment_is_one_line(project):
    """Two files of conf/local setting one key: Kedro's ``ValueError: Duplicate keys`` as one line naming both
    files and the key."""
    from fastlm.cli import config_file_error

    (project / "conf/local/parameters_mine.yml").write_text("report:\n  max_new_tokens: 8\n")
    (project / "conf/local/parameters_yours.yml").write_text("report:\n  max_new_tokens: 16\n")
    before = _snapshot(project)
    with pytest.raises(Exception) as raised:
        run_pipeline(project, "split")
    message = str(config_file_error(raised.value))
    assert "\n" not in message and "Fix:" in message, message
    assert "conf/local/parameters_mine.yml" in message, message
    assert "conf/local/parameters_yours.yml" in message, message
    assert "report.max_new_tokens" in message, message
    assert _snapshot(project) == before


SECRET_URI = "http://alice:S3cretPassw0rdXYZ@127.0.0.1:9"


def train_with_the_store_then_with_the_server_down(folder: Path) -> dict:
    """A project like the module's (its conf/local parameters, an MLflow store of its own), split by the CLI
    (a copy of tests/support/split_project.py's, split as the module splits); then `kedro run
    --pipeline=train` tracked, and again (its model removed) with a closed local port as the tracking server,
    each timed (a job of tests/support/background.py)."""
    project = folder / "project"
    runs = {"split": copy_of_the_split_project(project)}
    if runs["split"].returncode != 0:
        return {"project": project, **runs}
    with open(project / "conf/local/parameters_matrix.yml", "w") as file:
        file.write(yaml.safe_dump({"split": SPLIT, "train": TRAIN, "run_name": "matrix"}))
    env = background.environ(
        DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}"
    )
    kedro_run = [sys.executable, "-m", "kedro", "run"]
    params = ("--params", "train.resume=never,train.save_every=null")
    start = time.monotonic()
    runs["tracked"] = background.run([*kedro_run, "--pipeline=train", *params], cwd=project, env=env)
    runs["with_store"] = time.monotonic() - start
    if runs["tracked"].returncode == 0:
        os.remove(project / "data/06_models/model/model.safetensors")
    start = time.monotonic()
    down = background.environ(DO_NOT_TRACK="true", COLUMNS="200", MLFLOW_TRACKING_URI=SECRET_URI)
    runs["down"] = background.run([*kedro_run, "--pipeline=train", *params], cwd=project, env=down)
    runs["without_store"] = time.monotonic() - start
    return {"project": project, **runs}


@pytest.mark.background(job=train_with_the_store_then_with_the_server_down)
def test_cli_tracking_server_down_training_finishes_fast():
    """A closed local port as the tracking server: one warning, the run completes, no secret printed."""
    runs = background.result(train_with_the_store_then_with_the_server_down)
    assert runs["split"].returncode == 0, runs["split"].stderr[-3000:]
    project, tracked, down = runs["project"], runs["tracked"], runs["down"]
    assert tracked.returncode == 0, tracked.stderr[-3000:]
    output = down.stdout + down.stderr
    assert down.returncode == 0, output[-3000:]
    assert (project / "data/06_models/model/model.safetensors").is_file()
    assert runs["without_store"] <= runs["with_store"] + 30, (runs["with_store"], runs["without_store"])
    # Rich wraps lines
    assert "S3cretPassw0rdXYZ" not in "".join(output.split()) and "Traceback" not in output
    words = " ".join(output.split())
    assert words.count("training and local outputs continue without tracking") == 1, output[-3000:]


def test_a_corrupt_tracking_database_does_not_stop_training(project, monkeypatch):
    (project / "broken.db").write_bytes(b"this is not a sqlite database" * 100)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{project / 'broken.db'}")
    run_pipeline(project, "train", {"train": {"resume": "never"}})
    summary = json.loads((project / "data/08_reporting/train_summary.json").read_text())
    assert summary["steps"] == TRAIN["max_steps"]


def test_a_tracking_database_missing_a_table_warns_once_without_tracebacks(
    project, mlflow_uri, monkeypatch, capfd, caplog
):
    """A database whose metrics table was dropped: training completes (as with a corrupt file), and the
    store's failure is one warning naming the file and the fix, not a traceback per failed call."""
    import sqlite3

    database = project / "dropped.db"
    shutil.copyfile(mlflow_uri.removeprefix("sqlite:///"), database)
    with sqlite3.connect(database) as connection:
        connection.execute("DROP TABLE metrics")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{database}")
    run_pipeline(project, "train", {"train": {"resume": "never"}})
    summary = json.loads((project / "data/08_reporting/train_summary.json").read_text())
    assert summary["steps"] == TRAIN["max_steps"]
    printed = capfd.readouterr()
    shown = printed.out + printed.err + caplog.text
    assert "Traceback" not in shown, shown[-3000:]
    assert shown.count("without tracking") == 1, shown[-3000:]  # the one warning
    words = " ".join(shown.split())  # Rich wraps lines
    assert "dropped.db is not a complete MLflow store (a set-up was cut: table metrics missing)" in words
    assert "mv dropped.db dropped.db.broken" in words


def test_cli_secrets_are_masked_in_tracebacks(monkeypatch):
    from click.testing import CliRunner

    from fastlm import cli

    def crash(**kwargs):
        raise RuntimeError(f"could not reach {SECRET_URI}/api")

    monkeypatch.setattr(cli.kedro_run, "callback", crash)
    result = CliRunner().invoke(cli.cli, ["run", "--pipeline=train"])
    assert isinstance(result.exception, RuntimeError)
    assert "S3cretPassw0rdXYZ" not in str(result.exception) and "127.0.0.1:9" in str(result.exception)


# a report that runs in seconds: one evaluation batch, one prompt, a few greedy tokens, no ROUGE
SMALL_REPORT = {
    "eval_max_batches": 1,
    "prompts": ["배송"],
    "max_new_tokens": 4,
    "decoding": [{"name": "greedy"}],
    "references": {"enabled": False},
}


def test_report_after_training_without_evaluation(project):
    """eval_every: null (the module's training) leaves an evaluation table without rows; report works."""
    run_pipeline(project, "report", {"report": SMALL_REPORT})
    training = pd.read_csv(project / "data/08_reporting/training_summary.csv")
    assert training["final_val_loss"].isna().all()
    assert (project / "data/08_reporting/test_metrics.json").is_file()


# ------------------------------------------------------------------------- pre-tokenized data (issue 18)

LOGKEYS = {"pretokenized": True, "vocab_size": 10}


def _logkeys(project: Path, bad_row) -> dict:
    """A pre-tokenized raw file whose third line holds ``bad_row``; the parameters that split it."""
    rows = [[1, 2, 3], [4, 5], bad_row, [6, 7, 8]]
    path = project / "data/01_raw/logkeys.jsonl"
    path.write_text("".join(json.dumps({"ids": row}) + "\n" for row in rows), encoding="utf-8")
    return {"raw_path": "data/01_raw/logkeys.jsonl", "split": LOGKEYS}


@pytest.mark.parametrize(
    ("bad_row", "expected"),
    [
        ([1, 10], "id 10 in split.ids_column ('ids') is not below split.vocab_size (10)"),
        ([1, -1], "id -1 in split.ids_column ('ids') is negative"),
        ([1, 2.5], "split.ids_column ('ids') holds 2.5, not an integer id"),
        ([], "split.ids_column ('ids') is an empty list"),
    ],
    ids=["id_at_vocab_size", "negative_id", "non_integer_id", "empty_list"],
)
def test_pretokenized_bad_id_row(project, bad_row, expected):
    _fails_cleanly(
        project,
        "split",
        _logkeys(project, bad_row),
        InputDataError,
        "data/01_raw/logkeys.jsonl row 3:",
        expected,
    )


def test_pretokenized_without_vocab_size(project):
    params = _logkeys(project, [1, 2])
    _fails_cleanly(
        project,
        "split",
        {**params, "split": {"pretokenized": True}},
        ConfigError,
        "split.pretokenized is true but split.vocab_size is not set",
        "--params split.vocab_size=",
    )


def test_a_report_on_splits_made_after_the_model_was_trained_is_refused_before_any_node(project):
    """Re-split with another hash_salt after training (the same tokenizer, or one trained again): the new test
    split holds rows the model trained on. The report refuses before any node runs (a score on them, logged
    onto the training run, would look like a held-out one), with the fix that works: train again (a re-split
    cannot make the model's data come back)."""
    run_pipeline(project, "split", {"split": {"hash_salt": "again"}})
    _fails_cleanly(
        project,
        "report",
        {"split": {"hash_salt": "again"}},
        StaleDataError,
        "model was trained on other data than",
        "tokenized_corpus holds now",
        "kedro run --pipeline=train",
    )


def test_a_report_top_k_not_below_the_vocabulary_is_refused_before_any_node(project):
    """``report.top_k`` at or above the vocabulary the model predicts over: every id is among the top k, and
    the report would print a top-k accuracy of 1.000 as a figure of the model."""
    vocab = json.loads((project / "data/06_models/model/config.json").read_text())["vocab_size"]
    _fails_cleanly(
        project,
        "report",
        {"report": {"top_k": vocab}},
        ConfigError,
        f"report.top_k = {vocab}",
        f"vocabulary of {vocab:,} token ids",
        "--params report.top_k=",
    )


def test_raw_path_in_a_parameters_file_is_refused_not_ignored(project):
    """The catalog reads ``raw_path`` from ``--params`` only (``${runtime_params:raw_path}``): set in a
    parameters file it was dropped, and the split re-split the demo corpus over the outputs, exit 0."""
    (project / "conf/local/parameters_mine.yml").write_text("raw_path: data/01_raw/mine.jsonl\n")
    _fails_cleanly(
        project,
        "split",
        {},
        ConfigError,
        "raw_path = 'data/01_raw/mine.jsonl'",
        "conf/local/parameters_mine.yml",
        "--params raw_path=data/01_raw/mine.jsonl",
    )


def test_a_report_on_other_texts_with_the_models_own_tokenizer_is_refused_before_any_node(project):
    """Round six: a split of other texts whose tokenizer and parameters are the model's (a model folder's
    tokenizer, pre-tokenized ids: nothing in the fingerprint depends on the texts) was taken for the
    model's data: the report scored a model on splits it never saw and said it trained on them. Simulated by
    the split record of the same tokenizer and settings with another texts' digest."""
    record = project / "data/05_model_input/tokenized_corpus_fingerprint.json"
    stored = json.loads(record.read_text())
    stored["data_sha256"] = "0" * 64
    record.write_text(json.dumps(stored))
    _fails_cleanly(
        project,
        "report",
        {},
        StaleDataError,
        "model was trained on other data than",
        "kedro run --pipeline=train",
    )


@pytest.fixture
def kept_logging():
    """The process's logging as it was before the test: a run started from a subfolder applies the project's
    conf/logging.yml in this process, with handlers on the streams CliRunner swaps in and closes after it."""
    root = logging.getLogger()
    loggers = [
        root,
        *(lg for lg in logging.root.manager.loggerDict.values() if isinstance(lg, logging.Logger)),
    ]
    state = [(lg, lg.level, list(lg.handlers), list(lg.filters), lg.propagate, lg.disabled) for lg in loggers]
    disabled, factory = logging.root.manager.disable, logging.getLogRecordFactory()
    yield
    for lg, level, handlers, filters, propagate, off in state:
        lg.setLevel(level)
        lg.handlers[:], lg.filters[:], lg.propagate, lg.disabled = handlers, filters, propagate, off
    logging.disable(disabled)
    logging.setLogRecordFactory(factory)


def test_kedro_run_from_a_subfolder_runs_in_the_project_folder(kedro_project, monkeypatch, kept_logging):
    """Round six: `kedro run` started in a subfolder of the project (Kedro finds the project above it and
    makes the catalog's paths the project's) kept train.checkpoint_dir and the MLflow store relative to the
    subfolder: a run there did not resume its checkpoint (data/data/06_models/...), wrote a second
    mlflow.db, and predict later read an older model. The run moves to the project folder first and says
    so; a --conf-source given relative to the subfolder still names the same folder."""
    from click.testing import CliRunner

    from fastlm import cli

    seen = {}

    def record(**kwargs):
        seen.update(cwd=Path.cwd(), conf_source=kwargs.get("conf_source"))

    monkeypatch.setattr(cli.kedro_run, "callback", record)
    monkeypatch.setattr(cli, "project_logging", lambda: None)  # its own test below
    (kedro_project / "notebooks").mkdir()
    monkeypatch.chdir(kedro_project / "notebooks")
    result = CliRunner().invoke(cli.cli, ["run", "--pipeline=train", "--conf-source", "../conf"])
    assert result.exit_code == 0, result.output
    assert seen["cwd"] == kedro_project.resolve()
    assert Path(seen["conf_source"]) == (kedro_project / "conf").resolve()
    assert "running in the project folder" in result.output and "(started in notebooks)" in result.output


def test_kedro_run_from_a_subfolder_logs_as_the_projects_logging_yml_says(
    kedro_project, monkeypatch, kept_logging
):
    """Round nineteen: `kedro run` started in a subfolder ran with Kedro's default logging configuration
    (Kedro looks for conf/logging.yml in the working folder, at start-up): every dataset load and save as an
    INFO line, the project's levels for transformers and torchao lost, and Rich's wrapped lines in a
    redirected log. The run reads the project's conf/logging.yml when it moves to the project folder."""
    import yaml
    from click.testing import CliRunner
    from kedro.framework.project import LOGGING

    from fastlm import cli

    configured = []
    monkeypatch.delenv("KEDRO_LOGGING_CONFIG", raising=False)
    monkeypatch.setattr(LOGGING, "configure", configured.append)
    monkeypatch.setattr(cli.kedro_run, "callback", lambda **kwargs: None)
    (kedro_project / "notebooks").mkdir()
    monkeypatch.chdir(kedro_project / "notebooks")
    result = CliRunner().invoke(cli.cli, ["run", "--pipeline=train"])
    assert result.exit_code == 0, result.output
    project_logging = yaml.safe_load((kedro_project / "conf/logging.yml").read_text(encoding="utf-8"))
    assert configured == [project_logging]
    assert configured[0]["loggers"]["kedro.io.data_catalog"]["level"] == "WARNING"


@pytest.mark.parametrize("start", ["notebooks", "."])
def test_a_key_written_twice_in_conf_logging_yml_is_refused_naming_the_file_line_and_key(
    kedro_project, monkeypatch, kept_logging, start
):
    """Round twenty-two: conf/logging.yml was read with PyYAML's safe loader (by Kedro at start-up in the
    project folder, by the run itself from a subfolder), which keeps the last value of a key a mapping writes
    twice: a logger's settings written twice (``kedro.io.data_catalog`` at WARNING, then again at INFO)
    applied the last, every dataset load and save an INFO line, with no word of the first. The run is refused
    in one line naming the file, the line and the key, before Kedro's session starts."""
    from click.testing import CliRunner

    from fastlm import cli

    logging_yml = kedro_project / "conf/logging.yml"
    text = logging_yml.read_text(encoding="utf-8")
    again = "  kedro.io.data_catalog:\n    level: INFO\n"
    text = text.replace("  fastlm:\n    level: INFO\n", "  fastlm:\n    level: INFO\n" + again, 1)
    assert text.count("kedro.io.data_catalog:") == 2
    logging_yml.write_text(text, encoding="utf-8")
    line = text[: text.index(again)].count("\n") + 1
    ran = []
    monkeypatch.delenv("KEDRO_LOGGING_CONFIG", raising=False)
    monkeypatch.setattr(cli.kedro_run, "callback", lambda **kwargs: ran.append(kwargs))
    # the refusal's logging.shutdown() would close the test session's handlers, absl's among them with the
    # stream pytest captures into (absl closes a stream that is not sys.stderr, and CliRunner swapped it)
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)
    (kedro_project / "notebooks").mkdir()
    monkeypatch.chdir(kedro_project / start)
    result = CliRunner().invoke(cli.cli, ["run", "--pipeline=train"])
    assert result.exit_code == 2, result.output
    assert not ran
    message = result.output.strip().splitlines()[-1]
    assert message.startswith("fastlm: error: "), result.output
    assert f"conf/logging.yml line {line}" in message and "'kedro.io.data_catalog' twice" in message, message
    assert "Traceback" not in result.output


def test_a_session_opened_from_a_subfolder_works_in_the_project_folder(kedro_project, monkeypatch, caplog):
    """Round seven: a KedroSession opened in a subfolder (a notebook in notebooks/, a script) read the catalog
    relative to the project but train.checkpoint_dir and the MLflow store (sqlite:///mlflow.db) relative to
    the subfolder: checkpoints and a second mlflow.db under notebooks/, which no run from the project
    folder resumes or lists. The session moves to the project folder when its context is made, and says so."""
    from kedro.framework.session import KedroSession

    from tests.support.project import bootstrap

    (kedro_project / "notebooks").mkdir()
    monkeypatch.chdir(kedro_project / "notebooks")
    bootstrap(kedro_project)
    with caplog.at_level(logging.INFO, logger="fastlm"):
        with KedroSession.create(project_path=kedro_project) as session:
            session.load_context()
            assert Path.cwd() == kedro_project.resolve()
    assert "working in the project folder" in caplog.text and "(opened in notebooks)" in caplog.text


def test_a_raw_file_changed_since_the_split_is_refused_by_a_pipeline_that_reads_the_split(project):
    """Round six: the raw file edited (or replaced) after the split, then `kedro run --pipeline=train` (or
    report): it trained on the old splits, exit 0. The split records the raw file it read (size, time and
    SHA-256); a pipeline reading the split without making it refuses a changed file."""
    raw = project / "data/01_raw/demo_corpus.jsonl"
    with raw.open("a", encoding="utf-8") as file:
        file.write(json.dumps({"text": "새로 들어온 리뷰입니다"}, ensure_ascii=False) + "\n")
    _fails_cleanly(
        project,
        "report",
        {},
        StaleDataError,
        "data/01_raw/demo_corpus.jsonl changed since the split",
        "kedro run --pipeline=split",
    )


def test_a_raw_file_rewritten_with_its_size_and_time_kept_is_refused(project):
    """A raw text replaced by another of as many bytes, the file's modification time put back (``touch -r``,
    ``cp -p`` or ``rsync -t`` of another version): the report ran on the old splits, exit 0 (the record's
    size and time alone were compared)."""
    raw = project / "data/01_raw/demo_corpus.jsonl"
    before = raw.stat()
    lines = raw.read_text(encoding="utf-8").splitlines(keepends=True)
    text = json.loads(lines[0])["text"]
    lines[0] = json.dumps({"text": text[::-1]}, ensure_ascii=False) + "\n"
    raw.write_text("".join(lines), encoding="utf-8")
    os.utime(raw, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (raw.stat().st_size, raw.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    _fails_cleanly(
        project,
        "report",
        {},
        StaleDataError,
        "data/01_raw/demo_corpus.jsonl changed since the split",
        "same size",
        "kedro run --pipeline=split",
    )


def test_a_shard_with_other_columns_is_refused_naming_it(project, sample_texts):
    """Raw data as a folder of shards: a shard whose columns differ from the first's is one line naming it."""
    write_jsonl(project / "data/01_raw/shards/part-00000.jsonl", sample_texts[:60])
    (project / "data/01_raw/shards/part-00001.jsonl").write_text('{"body": "x"}\n', encoding="utf-8")
    _fails_cleanly(
        project,
        "split",
        {"raw_path": "data/01_raw/shards"},
        InputDataError,
        "data/01_raw/shards/part-00001.jsonl has other columns than part-00000.jsonl",
        "['body']",
    )


def test_a_shard_added_since_the_split_is_refused_by_a_pipeline_that_reads_the_split(project, sample_texts):
    """The split of a glob of shards records each shard: one added since is stale data, as a changed file."""
    for index in range(3):
        write_jsonl(
            project / f"data/01_raw/shards/part-{index}.jsonl", sample_texts[index * 60 : index * 60 + 60]
        )
    run_pipeline(project, "split", {"raw_path": "data/01_raw/shards/*.jsonl"})
    assert _report(project)["raw_rows"] == 180
    write_jsonl(project / "data/01_raw/shards/part-3.jsonl", ["새로 들어온 리뷰입니다"])
    _fails_cleanly(
        project,
        "report",
        {},
        StaleDataError,
        "data/01_raw/shards/*.jsonl changed since the split",
        "data/01_raw/shards/part-3.jsonl added",
        "kedro run --pipeline=split",
    )


def test_another_raw_path_for_a_pipeline_that_does_not_split_is_refused(project):
    """Round six: `--params raw_path=<other file>` given to a pipeline that reads the split (train, report):
    it went on with the split of the first file, exit 0."""
    shutil.copy(project / "data/01_raw/demo_corpus.jsonl", project / "data/01_raw/other.jsonl")
    _fails_cleanly(
        project,
        "report",
        {"raw_path": "data/01_raw/other.jsonl"},
        ConfigError,
        "raw_path",
        "data/01_raw/other.jsonl",
        "--pipeline=split",
    )


def test_a_raw_file_touched_but_not_changed_is_the_same_file(project):
    """The must-work side: a raw file whose time changed but not its bytes (copied back, touched) is the
    file the split read."""
    raw = project / "data/01_raw/demo_corpus.jsonl"
    os.utime(raw, (1_000_000_000, 1_000_000_000))
    run_pipeline(project, "report", {"report": SMALL_REPORT})
    assert (project / "data/08_reporting/test_metrics.json").is_file()
