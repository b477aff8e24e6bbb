"""Security defaults: secrets masked in logs, MLflow and outputs; safe weight loading; no remote code;
telemetry off."""

from __future__ import annotations

import ast
import json
import logging
import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

import fastlm
from fastlm.redaction import MASK, install_log_redaction, is_secret_key, redact, redact_text
from tests.support import background
from tests.support.project import PROJECT_ROOT, copy_project, demo_texts, write_jsonl

SRC = PROJECT_ROOT / "src" / "fastlm"
HF_TOKEN = "hf_FAKEabcdefghijklmnopqrstuvwxyz0123"
SALT_TOKEN = "hf_SALTabcdefghijklmnopqrstuvwxyz"
PASSWORD = "s3cr3t-pw"
URI = f"https://alice:{PASSWORD}@example.com/traces"


# ------------------------------------------------------------------------------------------------ redaction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"token {HF_TOKEN} used", "token *** used"),
        (f"tracking at {URI}", "tracking at https://***:***@example.com/traces"),
        ("postgresql://bob@db:5432/mlflow", "postgresql://***@db:5432/mlflow"),
        ("Authorization: Bearer abcdefgh.ijklmnop", "Authorization: *** ***"),
        ("key id AKIAABCDEFGHIJKLMNOP", "key id ***"),
        ("ghp_abcdefghijklmnopqrstuvwxyz012345 and sk-abcdefghijklmnopqrstuvwx", "*** and ***"),
        ("password=hunter2 aws_secret_access_key: wJalrXUtnFEMI", "password=*** aws_secret_access_key: ***"),
        ("{'api_key': 'abc', 'vocab_size': 400}", "{'api_key': '***', 'vocab_size': 400}"),
    ],
)
def test_secret_shaped_text_is_masked(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "the tokenizer has 400 tokens; one EOS token appended to every sample",
        "max_tokens=5, train/tokens_per_s: 1200.5, pad_token=<pad>",
        "MLflow tracking URI sqlite:///mlflow.db, http://127.0.0.1:5000",
        "saved checkpoint data/06_models/checkpoints/checkpoint-00000004 (1.2 MB in 0.10 s)",
        # a fix's placeholder for a secret's value: no secret, and the fix's closing backtick was eaten
        "set it before the run (`export HF_TOKEN=...`), give it a default",
        "run `export DB_PASSWORD=<password>` first",
    ],
)
def test_ordinary_text_is_left_alone(text):
    assert redact_text(text) == text


URL_SECRETS = {  # a path-like value with credentials -> what must never be shown
    "https://alice:s3cretpw@example.com/x.jsonl": ("alice", "s3cretpw"),
    "s3://KEYID:SECRET@bucket/x.jsonl": ("KEYID", "SECRET"),
    "s3://AKIAABCDEFGHIJKLMNOP:wJalrXUtnFEMIK7MDENG@bucket/x.jsonl": (
        "AKIAABCDEFGHIJKLMNOP",
        "wJalrXUtnFEMIK7MDENG",
    ),
    "https://alice@example.com/x.jsonl": ("alice",),
    "ssh://bob:p@ss@host/x": ("bob", "p@ss"),  # an unencoded '@' in the password: masked up to the host
}


FORMS = ("as given", "posix path", "windows path", "fsspec path", "in a message")


# (a user name alone, once fsspec dropped its scheme, reads as an e-mail address: not a secret's shape)
@pytest.mark.parametrize(
    ("url", "form"),
    [
        (url, form)
        for url in sorted(URL_SECRETS)
        for form in FORMS
        if form != "fsspec path" or len(URL_SECRETS[url]) > 1
    ],
)
def test_credentials_in_path_like_values_are_masked_before_and_after_normalisation(url, form):
    """A path class turns ``//`` into ``/`` (``https:/alice:pw@host``): the credentials are masked in both."""
    from pathlib import PurePosixPath, PureWindowsPath

    from kedro.io.core import get_protocol_and_path

    value = {
        "as given": url,
        "posix path": str(PurePosixPath(url)),
        "windows path": str(PureWindowsPath(url)),
        "fsspec path": get_protocol_and_path(url)[1],  # the scheme dropped (s3: the credentials too)
        "in a message": f"raw data file {PurePosixPath(url)} does not exist. Fix: point raw_path at it.",
    }[form]
    masked = redact_text(value)
    assert not [secret for secret in URL_SECRETS[url] if secret in masked], masked
    host = url.rsplit("@", 1)[1].split("/")[0]
    assert f"{MASK}@{host}" in masked or "@" not in value, masked


def test_datasets_describe_a_location_with_its_credentials_masked_as_given():
    from fastlm.datasets import AtomicArrowDataset, TextCorpusDataset

    url = "https://alice:s3cretpw@example.com/x.jsonl"
    for dataset in (TextCorpusDataset(url), AtomicArrowDataset(path=url)):
        shown = f"{dataset._describe()} {dataset!r}"
        assert "s3cretpw" not in shown and "alice" not in shown, shown
        assert f"https://{MASK}:{MASK}@example.com/x.jsonl" in str(dataset._describe()), shown


def test_nested_parameters_are_masked_by_key_and_by_shape():
    params = {
        "hf_token": "plain-looking",
        "split": {"hash_salt": "", "tokenizer": {"vocab_size": 400}},
        "train": {"model": {"name_or_path": URI}, "keep_last": 2},
        "creds": {"password": None},
        "headers": [f"Bearer {HF_TOKEN}"],
    }
    assert redact(params) == {
        "hf_token": MASK,
        "split": {"hash_salt": "", "tokenizer": {"vocab_size": 400}},
        "train": {"model": {"name_or_path": "https://***:***@example.com/traces"}, "keep_last": 2},
        "creds": {"password": None},
        "headers": ["Bearer ***"],
    }
    assert params["hf_token"] == "plain-looking"  # a copy: the caller's values are untouched


def test_no_project_parameter_name_looks_secret():
    """Every key of conf/base/parameters_*.yml stays visible in MLflow (no false positives)."""
    keys = []

    def walk(prefix, value):
        for key, item in value.items():
            keys.append(f"{prefix}{key}")
            if isinstance(item, dict):
                walk(f"{prefix}{key}.", item)

    for file in (PROJECT_ROOT / "conf/base").glob("parameters_*.yml"):
        walk("", yaml.safe_load(file.read_text(encoding="utf-8")) or {})
    assert len(keys) > 40
    assert [key for key in keys if is_secret_key(key)] == []
    assert all(
        is_secret_key(key)
        for key in (
            "hf_token",
            "HF_TOKEN",
            "db.password",
            "apiKey",
            "client_secret",
            "aws_secret_access_key",
            "credentials",
            "key",
        )
    )


def test_every_log_record_is_masked_whatever_the_handler(caplog):
    install_log_redaction()
    install_log_redaction()  # idempotent
    with caplog.at_level(logging.INFO):
        logging.getLogger("fastlm.anything").info("MLflow at %s with %s", URI, HF_TOKEN)
        logging.getLogger("kedro.somewhere").warning("params: %s", {"hf_token": "abc"})
    assert PASSWORD not in caplog.text and HF_TOKEN not in caplog.text and "'abc'" not in caplog.text
    assert "https://***:***@example.com/traces" in caplog.text and "{'hf_token': '***'}" in caplog.text


def test_settings_replace_kedro_mlflows_hook_with_the_redacting_one():
    """One MlflowTrackingHook (the redacting hook, from the run's start) and no hook of kedro-mlflow's own in
    a session's hook manager: it takes the name of the plugin's entry point, which Kedro then does not
    load."""
    from importlib.metadata import distribution

    from kedro.framework.hooks.manager import (
        _create_hook_manager,
        _register_hooks,
        _register_hooks_entry_points,
    )
    from kedro_mlflow.framework.hooks.mlflow_hook import MlflowHook

    from fastlm import settings
    from fastlm.hooks import KEDRO_MLFLOW_HOOK, MlflowTrackingHook

    plugin = distribution("kedro_mlflow")
    assert plugin.metadata["Name"] in settings.DISABLE_HOOKS_FOR_PLUGINS
    assert [entry.name for entry in plugin.entry_points if entry.group == "kedro.hooks"] == [
        KEDRO_MLFLOW_HOOK
    ]
    assert sum(isinstance(hook, MlflowTrackingHook) for hook in settings.HOOKS) == 1
    manager = _create_hook_manager()
    _register_hooks(manager, settings.HOOKS)
    _register_hooks_entry_points(manager, settings.DISABLE_HOOKS_FOR_PLUGINS)
    assert isinstance(manager.get_plugin(KEDRO_MLFLOW_HOOK), MlflowTrackingHook)
    assert not any(isinstance(hook, MlflowHook) for hook in manager.get_plugins())


# ----------------------------------------------------------------------------------------- safe loading (AST)


def _calls(name: str):
    """(file, call) for every call of ``*.name(...)`` or ``name(...)`` under src/fastlm."""
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if called == name:
                    yield file.relative_to(PROJECT_ROOT), node


def _keyword(call: ast.Call, name: str):
    return next((kw.value for kw in call.keywords if kw.arg == name), None)


def test_every_torch_load_passes_weights_only_true():
    calls = [
        (file, call)
        for file, call in _calls("load")
        if isinstance(call.func, ast.Attribute) and getattr(call.func.value, "id", None) == "torch"
    ]
    assert calls, "expected the checkpoint loader's torch.load"
    for file, call in calls:
        value = _keyword(call, "weights_only")
        assert isinstance(value, ast.Constant) and value.value is True, f"{file}:{call.lineno}"


def test_trust_remote_code_is_never_hard_coded_on():
    """Remote code runs only when a user sets a ``trust_remote_code`` parameter: never a literal True in src/.

    Calls that do not pass it get the libraries' default, False.
    """
    found = 0
    for file in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.keyword) and node.arg == "trust_remote_code":
                value = node.value
            elif isinstance(node, ast.Dict):
                value = next(
                    (
                        v
                        for k, v in zip(node.keys, node.values, strict=True)
                        if isinstance(k, ast.Constant) and k.value == "trust_remote_code"
                    ),
                    None,
                )
            else:
                continue
            if value is not None:
                found += 1
                assert not (isinstance(value, ast.Constant) and value.value is True), f"{file}:{value.lineno}"
    assert found >= 4  # the model and tokenizer loaders pass it on


def test_defaults_keep_remote_code_off_and_weights_in_safetensors():
    from fastlm.corpus.config import parse_split_params
    from fastlm.datasets.pretrained_model import PretrainedModelDataset
    from fastlm.datasets.pretrained_tokenizer import PretrainedTokenizerDataset
    from fastlm.engine.config import parse_train_params

    assert parse_train_params({}).model.trust_remote_code is False
    assert parse_split_params({}).tokenizer.trust_remote_code is False
    for dataset in (PretrainedModelDataset("x"), PretrainedTokenizerDataset("x")):
        assert (
            dataset._load_args["trust_remote_code"] is False
            and dataset._load_args["local_files_only"] is True
        )
    source = (SRC / "datasets/pretrained_model.py").read_text(encoding="utf-8")
    assert "safe_serialization=True" in source


def test_telemetry_and_downloads_are_off_by_default(monkeypatch):
    for name in fastlm._OFFLINE_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    fastlm.apply_process_defaults()
    assert os.environ["DO_NOT_TRACK"] == "true" and os.environ["MLFLOW_DISABLE_TELEMETRY"] == "true"
    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1" and os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["HF_DATASETS_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert yaml.safe_load((PROJECT_ROOT / ".telemetry").read_text()) == {"consent": False}


def test_bitsandbytes_advice_to_fetch_a_kernel_from_the_hub_is_not_shown(caplog):
    """bitsandbytes (0.50, on CPUs with AVX-512 bf16) logs at import that it failed to load a CPU inference
    kernel from the hub and advises ``pip install kernels``, which would download it: fastlm runs offline and
    turns that kernel off (``lora.prepare_quantized``), so the advice is noise. Its other warnings show."""
    fastlm.apply_process_defaults()
    fastlm.apply_process_defaults()  # twice (the kedro hook calls it again): one filter
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")  # the logger of bitsandbytes' CPU backend
    assert len(logger.filters) == 1
    with caplog.at_level(logging.WARNING, logger="bitsandbytes"):
        logger.warning(
            "Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you already "
            "`pip install kernels` and the kernels >= 0.11.1",
            ModuleNotFoundError("No module named 'kernels'"),
        )
        logger.warning("another bitsandbytes warning")
    assert [record.getMessage() for record in caplog.records] == ["another bitsandbytes warning"]


# --------------------------------------------------------------------------------------------- end to end


@pytest.mark.e2e
@pytest.mark.parametrize(
    "url", ["https://alice:s3cretpw@example.com/x.jsonl", "s3://KEYID:SECRET@bucket/x.jsonl"]
)
def test_a_url_as_raw_path_is_one_line_without_its_credentials(kedro_project, url, caplog, capfd):
    """``--params raw_path=<url with credentials>``: the exception text itself (not only what the CLI prints)
    and every log line hold neither the user nor the password; the scheme and host stay readable."""
    from fastlm.errors import InputDataError, find_user_error
    from tests.support.project import run_pipeline

    before = sorted(path for path in (kedro_project / "data").rglob("*") if path.is_file())
    with caplog.at_level(logging.DEBUG), pytest.raises(Exception) as raised:
        run_pipeline(kedro_project, "split", {"raw_path": url})
    error = find_user_error(raised.value)
    assert isinstance(error, InputDataError), repr(raised.value)
    message = str(error)
    assert "\n" not in message and "raw_path" in message and "Fix:" in message, message
    assert f"{url.split(':')[0]}://{MASK}:{MASK}@{url.rsplit('@')[1]}" in message, message
    printed = capfd.readouterr()
    shown = "\n".join([message, str(raised.value), caplog.text, printed.out, printed.err])
    assert not [secret for secret in URL_SECRETS[url] if secret in shown]
    assert sorted(path for path in (kedro_project / "data").rglob("*") if path.is_file()) == before


def run_with_secrets_in_params(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`kedro run` (split -> train -> report) in a new project with a fake token and a URI with a password in
    --params (a job of tests/support/background.py)."""
    project = copy_project(folder / "project")
    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", list(demo_texts()))
    small = {
        "split": {"tokenizer": {"vocab_size": 400}, "max_length": 48},
        "train": {
            "max_steps": 2,
            "log_every": 1,
            "eval_every": 2,
            "save_every": 2,
            "quiet": True,
            "batching": {"micro_batch_size": 8},
            "model": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1},
        },
    }
    # hf_token: a top-level parameter of the user's own (an unknown one would be refused)
    with open(project / "conf/local/parameters_small.yml", "w") as file:
        file.write(yaml.safe_dump({**small, "hf_token": None}))
    params = f"hf_token={HF_TOKEN},split.hash_salt={SALT_TOKEN},train.profile.trace_dir={URI}"
    env = background.environ(MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}", COLUMNS="200")
    done = background.run([sys.executable, "-m", "kedro", "run", "--params", params], cwd=project, env=env)
    return project, done


@pytest.mark.e2e
@pytest.mark.background(job=run_with_secrets_in_params)
def test_secrets_in_params_reach_no_log_mlflow_or_output():
    """`kedro run` (split -> train -> report) with a fake token and a URI with a password in --params."""
    project, done = background.result(run_with_secrets_in_params)
    assert done.returncode == 0, done.stderr[-3000:]
    secrets = (HF_TOKEN, SALT_TOKEN, PASSWORD)
    for secret in secrets:
        assert secret not in done.stdout + done.stderr
    leaked = [
        str(path.relative_to(project))
        for path in project.rglob("*")
        if path.is_file() and any(s.encode() in path.read_bytes() for s in secrets)
    ]
    assert leaked == []  # outputs, checkpoints, the MLflow database and artefacts
    assert (project / "data/08_reporting/report.html").is_file() and (
        project / "data/08_reporting/train_summary.json"
    ).is_file()

    with sqlite3.connect(project / "mlflow.db") as db:  # the parameters were logged, masked
        params_logged = dict(db.execute("select key, value from params"))
        tags = [value for (value,) in db.execute("select value from tags where key = 'runtime_params'")]
    assert params_logged["split.hash_salt"] == MASK
    assert params_logged["train.profile.trace_dir"] == "https://***:***@example.com/traces"
    assert params_logged["train.max_steps"] == "2"  # ordinary parameters unchanged
    assert tags and all(json.loads(tag)["hf_token"] == "***" for tag in tags)  # tags hold values: JSON


def runs_failing_on_a_secret(folder: Path) -> tuple[Path, list[subprocess.CompletedProcess]]:
    """Two `kedro run`s in a new project refused by a node on a parameter holding a secret (a fake token as
    the split's tokenizer, a URL with a password as the model), each a full run as kedro-viz records them (a
    job of tests/support/background.py)."""
    project = copy_project(folder / "project")
    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", list(demo_texts()[:200]))
    env = background.environ(MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}", COLUMNS="200")
    kedro_run = [sys.executable, "-m", "kedro", "run", "--pipeline=split", "--params"]
    return project, [
        background.run([*kedro_run, f"split.tokenizer.source={HF_TOKEN}"], cwd=project, env=env),
        background.run([*kedro_run, f"split.tokenizer.source={URI}"], cwd=project, env=env),
    ]


@pytest.mark.e2e
@pytest.mark.background(job=runs_failing_on_a_secret)
def test_a_node_error_holding_a_secret_reaches_no_file_a_plugin_writes():
    """A node's error whose text holds a parameter's secret: the one line printed masks it, and so does every
    file of the project, kedro-viz's run events (``.viz/kedro_pipeline_events.json``, the error and its
    traceback, written by its hook from the exception) and the MLflow store included. Was: the events file
    held the token and the password in clear."""
    project, runs = background.result(runs_failing_on_a_secret)
    for done in runs:
        assert done.returncode == 2, done.stderr[-3000:]
        assert "fastlm: error: split.tokenizer.source" in done.stderr and MASK in done.stderr, done.stderr
    secrets = (HF_TOKEN, PASSWORD)
    assert not [secret for secret in secrets for done in runs if secret in done.stdout + done.stderr]
    events = project / ".viz/kedro_pipeline_events.json"
    assert events.is_file() and "on_node_error" in events.read_text()  # the plugin recorded the error
    leaked = [
        str(path.relative_to(project))
        for path in project.rglob("*")
        if path.is_file() and any(s.encode() in path.read_bytes() for s in secrets)
    ]
    assert leaked == []


def split_in_spawned_workers_with_a_secret(folder: Path) -> tuple[Path, subprocess.CompletedProcess]:
    """`kedro run --pipeline=split --runner=ParallelRunner` with spawned workers (KEDRO_MP_CONTEXT=spawn, as
    macOS starts them by default) and a fake token as the split's hash salt (a job of
    tests/support/background.py)."""
    project = copy_project(folder / "project")
    write_jsonl(project / "data/01_raw/demo_corpus.jsonl", list(demo_texts()))
    with open(project / "conf/local/parameters_small.yml", "w") as file:
        file.write(yaml.safe_dump({"split": {"tokenizer": {"vocab_size": 400}, "max_length": 48}}))
    env = background.environ(
        MLFLOW_TRACKING_URI=f"sqlite:///{project / 'mlflow.db'}", COLUMNS="200", KEDRO_MP_CONTEXT="spawn"
    )
    args = ["--pipeline=split", "--runner=ParallelRunner", "--runner-params", "max_workers=2"]
    done = background.run(
        [sys.executable, "-m", "kedro", "run", *args, "--params", f"split.hash_salt={SALT_TOKEN}"],
        cwd=project,
        env=env,
    )
    return project, done


@pytest.mark.e2e
@pytest.mark.background(job=split_in_spawned_workers_with_a_secret)
def test_spawned_parallel_runner_workers_log_the_parameters_masked_like_the_project():
    """Kedro's ParallelRunner workers started by spawn on Linux skipped the project's set-up (Kedro checks the
    default start method, fork there): no project hooks, so kedro-mlflow's own hook logged each node's
    parameters unmasked into the run (the hash salt in mlflow.db) and kedro-viz's statistics hook, without
    the catalog it gets in the main process, warned on every dataset. The workers run with the project's
    settings, as on macOS: the parameters logged masked, no such warning."""
    project, done = background.result(split_in_spawned_workers_with_a_secret)
    assert done.returncode == 0, done.stderr[-3000:]
    assert SALT_TOKEN not in done.stdout + done.stderr
    leaked = [
        str(path.relative_to(project))
        for path in project.rglob("*")
        if path.is_file() and SALT_TOKEN.encode() in path.read_bytes()
    ]
    assert leaked == []
    with sqlite3.connect(project / "mlflow.db") as db:
        params_logged = dict(db.execute("select key, value from params"))
        runs = db.execute("select count(*) from runs").fetchone()[0]
    assert (runs, params_logged["split.hash_salt"], params_logged["split.max_length"]) == (1, MASK, "48")
    assert "Unable to create statistics" not in done.stdout + done.stderr


def test_kedro_viz_fastapi_deprecation_is_not_shown():
    """kedro-viz's REST module imports FastAPI's ORJSONResponse, which FastAPI deprecated: `kedro viz build`
    printed FastAPI's advice to its maintainers as a warning, about nothing the user did.
    Other warnings show."""
    from fastapi.exceptions import FastAPIDeprecationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fastlm.apply_process_defaults()
        warnings.warn(
            "ORJSONResponse is deprecated, FastAPI now serializes data directly to JSON bytes via Pydantic",
            FastAPIDeprecationWarning,
            stacklevel=1,
        )
        warnings.warn("UJSONResponse is deprecated", FastAPIDeprecationWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["UJSONResponse is deprecated"]


def test_the_fix_for_an_unset_credentials_variable_keeps_its_command_whole_once_masked(tmp_path, monkeypatch):
    """``${oc.env:HF_TOKEN}`` in credentials.yml with HF_TOKEN not set: the line's fix, ``export
    HF_TOKEN=...``, went through the masking every printed line goes through, which took ``...`)`` for the
    token's value: the fix read ``(`export HF_TOKEN=***, give it a default``."""
    from fastlm.cli import _unset_variable_error

    monkeypatch.chdir(tmp_path)
    shown = redact_text(str(_unset_variable_error("HF_TOKEN", "hub.token")))
    assert "(`export HF_TOKEN=...`), give it a default (${oc.env:HF_TOKEN,<default>})" in shown, shown
