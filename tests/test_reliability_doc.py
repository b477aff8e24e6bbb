"""docs/reliability.md: its counts are what scripts/reliability_counts.py computes, and it lists every
case."""

from __future__ import annotations

import importlib.util

import pytest

from tests.support.project import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "reliability_counts.py"


def _counts_module():
    spec = importlib.util.spec_from_file_location("reliability_counts", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _collect_in_this_session(counts, collected: dict[str, frozenset[str]]) -> None:
    """``counts.collect`` runs ``pytest --collect-only`` in a subprocess, which imports every test module
    again (seconds); where this session collected every file it is asked for (the whole suite), the node ids
    are this session's collection of them, the same pytest collection. Otherwise it collects as before."""
    in_a_subprocess = counts.collect

    def collect(files: list[str]) -> set[str]:
        present = {file for file in files if (counts.ROOT / file).is_file()}
        if present and present <= collected.keys():
            return set().union(*(collected[file] for file in present))
        return in_a_subprocess(files)

    counts.collect = collect


@pytest.fixture(scope="module")
def computed(collected_node_ids):
    counts = _counts_module()
    _collect_in_this_session(counts, collected_node_ids)
    return (
        counts,
        counts.DOC.read_text(encoding="utf-8"),
        counts.compute(counts.DOC.read_text(encoding="utf-8")),
    )


def test_counts_in_the_document_are_the_computed_ones(computed):
    counts, text, computed = computed
    block = text[text.index(counts.BEGIN) : text.index(counts.END) + len(counts.END)]
    assert block == counts.counts_block(computed), "run: python scripts/reliability_counts.py --write"
    assert computed["inputs_tried"] >= 20 and computed["bad_inputs"] >= 20
    assert computed["data_lost"] == 0
    assert computed["faults_survived"] >= 10


def test_a_matrix_case_refusing_through_a_shared_helper_counts_as_bad(tmp_path, monkeypatch):
    """A matrix test that calls a module helper which compares the outputs snapshot around a refusal is a bad
    input as much as one that compares it itself; a helper that only runs a job is not."""
    counts = _counts_module()
    (tmp_path / "tests").mkdir()
    (tmp_path / counts.MATRIX).write_text(
        "import pytest\n"
        "def _refused(project):\n"
        "    before = _snapshot(project)\n"
        "    with pytest.raises(Exception):\n"
        "        run_pipeline(project)\n"
        "    assert _snapshot(project) == before\n"
        "def _refused_again(project):\n"
        "    return _refused(project)\n"
        "def _runs(project):\n"
        "    run_pipeline(project)\n"
        "def test_direct(project):\n"
        "    _fails_cleanly(project)\n"
        "def test_through_helper(project):\n"
        "    _refused(project)\n"
        "def test_through_two_helpers(project):\n"
        "    _refused_again(project)\n"
        "def test_works(project):\n"
        "    _runs(project)\n"
    )
    monkeypatch.setattr(counts, "ROOT", tmp_path)
    assert counts.matrix_kinds() == {
        "test_direct": True,
        "test_through_helper": True,
        "test_through_two_helpers": True,
        "test_works": False,
    }


def test_every_matrix_case_and_every_referenced_test_is_real(computed):
    counts, text, computed = computed
    listed = {f"{file}::{name}" for file, name in counts.TEST_REF.findall(text)}
    missing = [
        node for node in computed["matrix_nodes"] if node not in listed and node.split("[")[0] not in listed
    ]
    assert missing == [], "matrix cases missing from docs/reliability.md"
    referenced = {file for file, _ in counts.TEST_REF.findall(text)}
    collected = counts.collect(sorted(referenced))
    pending = "tests/engine/train/test_backoff.py"  # the one row allowed to wait for its test
    unknown = [
        ref
        for ref in listed
        if not ref.startswith(pending) and not counts.expand(tuple(ref.split("::")), collected)
    ]
    assert unknown == [], "docs/reliability.md names tests that do not exist"


def test_no_merge_left_its_conflict_marks_in_the_docs():
    """Rows added on two branches meet at the end of the Faults table: a merge that kept its conflict marks
    would leave them in the page (and between table rows, cut the table in two)."""
    marks = ("<<<<<<< ", ">>>>>>> ", "=======")
    found = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}"
        for path in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line.startswith(marks[:2]) or line == marks[2]
    ]
    assert found == []
