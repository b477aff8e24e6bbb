"""Paths named relative to the project (the working folder of every run), absolute outside it."""

import os
from pathlib import Path

from fastlm.engine.paths import project_name, project_relative


def test_a_folder_in_the_project_is_named_relative_to_it_and_one_outside_absolutely(tmp_path, monkeypatch):
    project, outside = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data" / "06_models").mkdir(parents=True)
    outside.mkdir()
    monkeypatch.chdir(project)
    assert project_relative("data/06_models") == "data/06_models"
    assert project_relative(project / "data" / "06_models") == "data/06_models"
    assert project_relative(project / "data" / ".." / "data" / "06_models") == "data/06_models"
    assert project_relative(outside) is None
    assert project_name(outside) == str(outside.resolve())
    assert project_name(project / "data") == "data"


def test_a_symbolic_link_into_the_project_is_named_as_the_folder_it_points_to(tmp_path, monkeypatch):
    project = tmp_path / "project"
    (project / "models" / "base").mkdir(parents=True)
    link = tmp_path / "link"
    os.symlink(project / "models", link)
    monkeypatch.chdir(project)
    assert project_relative(link / "base") == "models/base"
    assert Path(project_name(link / "base")) == Path("models/base")
