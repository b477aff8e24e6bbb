"""`kedro run --conf-source <archive>`: a packed conf (.tar.gz, .zip) is checked before Kedro starts, as a
conf folder is: the folder Kedro reads in it, its base/ and the run's environment, each refusal naming the
archive."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from fastlm.cli import check_env
from fastlm.errors import ConfigError

FOLDERS = ("base", "local", "quick")


def _conf(root: Path, folders=FOLDERS) -> Path:
    conf = root / "conf"
    for name in folders:
        (conf / name).mkdir(parents=True)
        (conf / name / "parameters.yml").write_text(f"{name}: 1\n", encoding="utf-8")
    return conf


def _tar(conf: Path, archive: Path, *, top: bool = True) -> Path:
    with tarfile.open(archive, "w:gz") as packed:
        if top:  # as `kedro package` packs it: the folder conf/ itself
            packed.add(conf, arcname=conf.name)
        else:  # its contents at the top: `tar -czf conf.tar.gz -C conf .`
            packed.add(conf, arcname=".")
    return archive


def _zip(conf: Path, archive: Path) -> Path:
    return Path(shutil.make_archive(str(archive.with_suffix("")), "zip", conf.parent, conf.name))


@pytest.fixture(autouse=True)
def _no_kedro_env(monkeypatch):
    monkeypatch.delenv("KEDRO_ENV", raising=False)


def _refused(env, archive: Path, *, variable: bool = False) -> str:
    with pytest.raises(ConfigError) as raised:
        check_env(env, str(archive), variable=variable)
    message = str(raised.value)
    assert "\n" not in message and "Fix:" in message and str(archive) in message, message
    return message


@pytest.mark.parametrize(("pack", "name"), [(_tar, "conf.tar.gz"), (_zip, "conf.zip")], ids=["tar.gz", "zip"])
def test_a_conf_packed_as_kedro_packs_it_passes_for_its_environments(tmp_path, pack, name):
    archive = pack(_conf(tmp_path), tmp_path / name)
    for env in (None, "quick", "local"):
        check_env(env, str(archive))


def test_an_archive_of_the_conf_folders_contents_names_how_to_pack_it(tmp_path):
    """Kedro reads the last entry at the top of a packed conf as the conf folder: an archive of conf/'s
    contents made it read quick/ as the conf folder ("quick/base" not found), or ``./`` whose ``base`` it did
    not find, and the project's own folders were offered as environments."""
    conf = _conf(tmp_path)
    tar = _tar(conf, tmp_path / "contents.tar.gz", top=False)
    zipped = Path(shutil.make_archive(str(tmp_path / "contents"), "zip", conf))
    for archive in (tar, zipped):
        message = _refused(None, archive)
        assert "base" in message and "tar -czf conf.tar.gz conf" in message, message
        assert "benchmarks" not in message and "there is no" not in message, message


def test_an_archive_without_the_runs_environment_names_the_archives_folders(tmp_path):
    archive = _tar(_conf(tmp_path, ("base", "quick")), tmp_path / "conf.tar.gz")
    message = _refused(None, archive)
    assert "local" in message and "quick" in message, message
    message = _refused("nope", archive)
    assert "--env nope" in message and "quick" in message and "conf/nope" in message, message
