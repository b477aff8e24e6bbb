"""`${oc.env:...}` or an unknown resolver in a parameters file: one line naming the file, the parameter and
the resolver to use (Kedro resolves ``oc.env`` in credentials only), not omegaconf's traceback."""

from __future__ import annotations

import pytest

from fastlm.cli import config_file_error
from tests.support.project import run_pipeline


def _one_line(project, pipeline: str) -> str:
    """The one line the CLI says of the error that running ``pipeline`` in ``project`` raises."""
    with pytest.raises(Exception) as raised:
        run_pipeline(project, pipeline)
    error = config_file_error(raised.value)
    assert error is not None, repr(raised.value)
    message = str(error)
    assert "\n" not in message and "Fix:" in message, message
    return message


def _message(project, text: str) -> str:
    (project / "conf/local/parameters_env.yml").write_text(f"report:\n  top_k: {text}\n", encoding="utf-8")
    message = _one_line(project, "report")
    assert "conf/local/parameters_env.yml" in message and "report.top_k" in message, message
    return message


def test_oc_env_in_parameters_names_the_projects_resolver(kedro_project, monkeypatch):
    monkeypatch.setenv("FASTLM_TOPK", "4")
    message = _message(kedro_project, "${oc.env:FASTLM_TOPK}")
    assert "oc.env" in message and "credentials" in message and "${env_or:FASTLM_TOPK" in message, message


def test_a_misspelled_resolver_names_the_close_one(kedro_project):
    message = _message(kedro_project, "${runtime_param:topk, 5}")
    assert "runtime_param" in message and "did you mean runtime_params?" in message, message


def test_an_unset_variable_in_credentials_is_one_line_naming_it(kedro_project, monkeypatch):
    """Round nineteen: ``${oc.env:NAME}`` in conf/local/credentials.yml (Kedro's way to read a token there)
    with NAME not set was omegaconf's InterpolationResolutionError traceback, exit 1."""
    monkeypatch.delenv("FASTLM_UNSET_TOKEN", raising=False)
    (kedro_project / "conf/local/credentials.yml").write_text(
        "hub:\n  token: ${oc.env:FASTLM_UNSET_TOKEN}\n  db: postgresql://bob:CREDPW7@db.example.com/x\n",
        encoding="utf-8",
    )
    message = _one_line(kedro_project, "report")
    assert "conf/local/credentials.yml" in message and "hub.token" in message, message
    assert "FASTLM_UNSET_TOKEN" in message and "CREDPW7" not in message, message


def test_a_catalog_entry_kedro_cannot_make_is_one_line_naming_it(kedro_project):
    """Round nineteen: a catalog entry on a file system whose package is not installed (an ``s3://`` path,
    keys in it, without s3fs) was Kedro's DatasetError traceback, exit 1."""
    (kedro_project / "conf/local/catalog.yml").write_text(
        "split_summary:\n  type: pandas.CSVDataset\n"
        "  filepath: s3://AKIAKEYID12345:CATSECRET77@bucket/split_summary.csv\n",
        encoding="utf-8",
    )
    message = _one_line(kedro_project, "split")
    assert "split_summary" in message and "s3fs" in message, message
    assert "CATSECRET77" not in message and "AKIAKEYID12345" not in message, message
