"""`kedro run` in a locale whose encoding is not UTF-8 (EUC-KR, or ASCII: ``LC_ALL=C PYTHONUTF8=0``): a
project folder, a conf/ file or a ``--params`` value the run cannot read as it is named or written is
refused in one line, before any node runs."""

from __future__ import annotations

import codecs
from pathlib import Path

import pytest

from fastlm import cli
from tests.support import background
from tests.support.project import demo_texts, make_kedro_project, refusal_in_background, refused_line

KOREAN_FOLDER = "내 프로젝트"


# The C locale, without Python's UTF-8 mode
ASCII_LOCALE = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": None}


def locale_refusals(folder: Path) -> dict:
    """A background job: the CLI refusals of this file, each in a new project."""
    texts = list(demo_texts())
    korean = make_kedro_project(folder / KOREAN_FOLDER / "fastlm", texts)
    euc_kr = make_kedro_project(folder / "euc-kr" / "fastlm", texts)
    with open(euc_kr / "conf/local/parameters_split.yml", "wb") as file:
        file.write('split:\n  hash_salt: "소금"\n'.encode("euc-kr"))
    params = make_kedro_project(folder / "params" / "fastlm", texts)
    return {
        "korean_folder": (korean, refusal_in_background(korean, "--pipeline=split", **ASCII_LOCALE)),
        "euc_kr_conf": (euc_kr, refusal_in_background(euc_kr, "--pipeline=split")),
        "params": (
            params,
            refusal_in_background(params, "--pipeline=split", "--params", "run_name=실험", **ASCII_LOCALE),
        ),
    }


@pytest.mark.background(job=locale_refusals)
def test_a_non_ascii_project_folder_in_an_ascii_locale_is_one_line_and_status_2():
    """Was: the split wrote corpus_splits.parquet, then pyarrow opened its path as UTF-8 (the file system's
    encoding being ASCII) and the next node failed with a traceback."""
    project, refusal = background.result(locale_refusals)["korean_folder"]
    last = refused_line(refusal)
    escaped = str(project).encode("ascii", "backslashreplace").decode("ascii")
    assert (str(project) in last or escaped in last) and "ASCII" in last, last
    assert "LC_ALL=C.UTF-8" in last and "PYTHONUTF8=1" in last, last
    assert not list((project / "data/03_primary").iterdir())


@pytest.mark.parametrize("encoding", ["euc-kr", "ascii", "latin-1"])
def test_a_non_ascii_folder_is_refused_where_its_bytes_are_not_utf8(encoding):
    """The folder made in a UTF-8 locale, its name as Python reads it in the locale of ``encoding``."""
    folder = Path("/tmp") / KOREAN_FOLDER / "fastlm"
    seen = str(folder).encode("utf-8").decode(encoding, "surrogateescape")
    with pytest.raises(cli.ConfigError) as raised:
        cli.check_project_folder(Path(seen), encoding=encoding)
    said, fix = str(raised.value).split("Fix:")
    named = codecs.lookup(encoding).name.replace("_", "-")
    assert str(folder) in said and named in said.lower() and "\n" not in said, said
    assert "LC_ALL=C.UTF-8" in fix and "PYTHONUTF8=1" in fix, fix


@pytest.mark.parametrize("encoding", ["euc-kr", "ascii", "utf-8"])
def test_an_ascii_folder_runs_in_any_locale(encoding):
    cli.check_project_folder(Path("/tmp/project folder/fastlm"), encoding=encoding)


def test_a_non_ascii_folder_runs_in_a_utf8_locale():
    cli.check_project_folder(Path("/tmp") / KOREAN_FOLDER / "fastlm", encoding="utf-8")


@pytest.mark.background(job=locale_refusals)
def test_a_conf_file_saved_in_euc_kr_is_one_line_naming_it():
    """Was: UnicodeDecodeError's traceback from Kedro's config loader, which names no file."""
    last = refused_line(background.result(locale_refusals)["euc_kr_conf"][1])
    assert "conf/local/parameters_split.yml" in last and "UTF-8" in last, last
    assert "iconv -f euc-kr -t utf-8" in last, last


@pytest.mark.background(job=locale_refusals)
def test_a_params_value_the_locale_cannot_decode_is_one_line():
    """UTF-8 bytes typed in an ASCII locale reach sys.argv as surrogate escapes. Was: UnicodeEncodeError's
    traceback from Kedro's parsing of --params."""
    last = refused_line(background.result(locale_refusals)["params"][1])
    escaped = "run_name=실험".encode("ascii", "backslashreplace").decode("ascii")
    assert ("run_name=실험" in last or escaped in last) and "ASCII" in last, last
    assert "LC_ALL=C.UTF-8" in last and "PYTHONUTF8=1" in last, last


def test_undecodable_params_text_is_refused_before_parsing():
    typed = "run_name=" + "실험".encode().decode("ascii", "surrogateescape")
    with pytest.raises(cli.ConfigError) as raised:
        cli.check_params_text(typed)
    assert "run_name=실험" in str(raised.value), raised.value


def test_params_text_as_the_c_library_decoded_it_in_euc_kr_is_shown_as_typed(monkeypatch):
    """In an EUC-KR locale Python decodes sys.argv with the C library, which reads a stray byte as U+0080 to
    U+00FF (not a surrogate escape): UTF-8 '실험' arrived as this text."""
    monkeypatch.setattr(cli.sys, "getfilesystemencoding", lambda: "euc_kr")
    with pytest.raises(cli.ConfigError) as raised:
        cli.check_params_text("run_name=\udcec\x8b\u317d\x97\x98")
    assert "run_name=실험" in str(raised.value) and "EUC-KR" in str(raised.value), raised.value


def _decode_in(module: str, data: bytes):
    """``data`` decoded as UTF-8 by code whose module is ``module`` (the frame the error is raised in)."""
    exec("data.decode('utf-8')", {"__name__": module, "data": data})


def test_a_conf_file_not_utf8_is_found_under_conf_when_the_loader_names_none(kedro_project):
    """Kedro's loader keeps the file it reads in ``config_filepath``; without it, the files under conf/ that
    are not UTF-8 are named. A UnicodeDecodeError raised outside the config loader is not a conf/ error."""
    saved = 'split:\n  hash_salt: "소금"\n'.encode("euc-kr")
    (kedro_project / "conf/local/parameters_split.yml").write_bytes(saved)
    with pytest.raises(UnicodeDecodeError) as raised:
        _decode_in("kedro.config.omegaconf_config", saved)
    said = str(cli.config_file_error(raised.value))
    assert "conf/local/parameters_split.yml" in said and "conf/base" not in said, said
    with pytest.raises(UnicodeDecodeError) as elsewhere:
        _decode_in("fastlm.corpus.readers", saved)
    assert cli.config_file_error(elsewhere.value) is None
