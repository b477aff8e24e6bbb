"""The counts of docs/reliability.md, computed from the tests rather than written by hand.

    python scripts/reliability_counts.py          # collect the tests, print the counts block
    python scripts/reliability_counts.py --run    # also run them: a failing test is not counted as survived
    python scripts/reliability_counts.py --write  # put the (collected) counts block into docs/reliability.md

What is counted:

- **faults survived**: rows of the "Faults" table whose every referenced test (`tests/...py::name`) exists
  (and, with ``--run``, passes); a row whose test does not exist yet is counted as pending, not survived.
- **inputs tried**: test cases collected in ``tests/test_bad_input_matrix.py`` (parametrized cases count one
  each); *bad* ones are those that assert a one-line failure (``_fails_cleanly`` / ``_one_line_exit_2``, both
  of which compare a SHA-256 snapshot of every output before and after; ``_cli_refusal``, the background
  job's refusals, compares the same digests; a module helper that calls one of them, or compares the
  snapshot around ``pytest.raises`` itself, counts as one), the rest must work.
- **data lost**: bad-input cases that do not compare that snapshot, plus (with ``--run``) those that fail.

``tests/test_reliability_doc.py`` checks that the block in the document equals what this script computes and
that every matrix case is listed in the document.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
MATRIX = "tests/test_bad_input_matrix.py"
SNAPSHOT_CHECKS = {"_fails_cleanly", "_one_line_exit_2", "_cli_refusal"}
BEGIN, END = "<!-- counts:begin -->", "<!-- counts:end -->"
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::([\w\[\]\-.]+)`")


def section_rows(text: str, heading: str) -> list[str]:
    """The table rows (``| ... |`` lines, header and rule excluded) under ``## heading``."""
    part = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in part.splitlines() if line.startswith("|")]
    return [row for row in rows[2:] if not set(row) <= set("|- ")]


def collect(files: list[str]) -> set[str]:
    """Node ids pytest collects from ``files`` (those that exist); one collection per set of files."""
    return set(_collect(tuple(file for file in sorted(set(files)) if (ROOT / file).is_file())))


@functools.lru_cache(maxsize=8)
def _collect(present: tuple[str, ...]) -> frozenset[str]:
    if not present:
        return frozenset()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *present],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return frozenset(line.strip() for line in done.stdout.splitlines() if "::" in line)


def run(node_ids: set[str]) -> set[str]:
    """The node ids among ``node_ids`` that fail (or error) when run."""
    if not node_ids:
        return set()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", *sorted(node_ids)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return {match.group(1) for match in re.finditer(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)}


def expand(ref: tuple[str, str], collected: set[str]) -> set[str]:
    """A reference (file, name) to the collected node ids it names (a base name covers its parameters)."""
    file, name = ref
    exact = f"{file}::{name}"
    if exact in collected:
        return {exact}
    return {node for node in collected if node.startswith(f"{exact}[")}


def matrix_kinds() -> dict[str, bool]:
    """Test function name in the matrix -> True when it asserts a clean failure with the outputs snapshot,
    itself or through module helpers that do (followed to any depth)."""
    tree = ast.parse((ROOT / MATRIX).read_text(encoding="utf-8"))
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    calls = {
        node.name: {getattr(call.func, "id", None) for call in ast.walk(node) if isinstance(call, ast.Call)}
        for node in functions
    }
    raises = {
        node.name: any(
            isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "raises"
            for call in ast.walk(node)
        )
        for node in functions
    }
    checks = set(SNAPSHOT_CHECKS)
    while True:
        found = {
            name
            for name, called in calls.items()
            if not name.startswith("test_") and (called & checks or (raises[name] and "_snapshot" in called))
        } - checks
        if not found:
            break
        checks |= found
    return {
        name: bool(called & checks) or (raises[name] and "_snapshot" in called)
        for name, called in calls.items()
        if name.startswith("test_")
    }


def compute(text: str, *, execute: bool = False) -> dict:
    fault_refs = [TEST_REF.findall(row) for row in section_rows(text, "Faults")]
    # every file the document names: one collection
    files = [file for file, _ in TEST_REF.findall(text)] + [MATRIX]
    collected = collect(files)
    fault_nodes = [
        set().union(*(expand(ref, collected) for ref in refs)) if refs else set() for refs in fault_refs
    ]
    complete = [
        nodes
        for refs, nodes in zip(fault_refs, fault_nodes, strict=True)
        if refs and all(expand(ref, collected) for ref in refs)
    ]
    matrix = sorted(node for node in collected if node.startswith(f"{MATRIX}::"))
    kinds = matrix_kinds()
    bad = [node for node in matrix if kinds.get(node.split("::")[1].split("[")[0], False)]
    unchecked = [node for node in matrix if node.split("::")[1].split("[")[0] not in kinds]
    failed = run(set().union(*complete, set(matrix))) if execute else set()
    survived = [nodes for nodes in complete if not nodes & failed]
    return {
        "fault_rows": len(fault_refs),
        "faults_survived": len(survived),
        "faults_pending": len(fault_refs) - len(complete),
        "fault_tests": len(set().union(*fault_nodes)) if fault_nodes else 0,
        "inputs_tried": len(matrix),
        "bad_inputs": len(bad),
        "good_inputs": len(matrix) - len(bad),
        "bad_inputs_failing_cleanly": len([node for node in bad if node not in failed]),
        "data_lost": len(unchecked) + len([node for node in bad if node in failed]),
        "ran": execute,
        "matrix_nodes": matrix,
    }


def counts_block(counts: dict) -> str:
    how = "collected and run tests" if counts["ran"] else "collected tests (`--run` also runs them)"
    return "\n".join(
        [
            BEGIN,
            f"Computed by `python scripts/reliability_counts.py` from the {how}:",
            "",
            "| Count | Value |",
            "| --- | --- |",
            "| Faults survived (rows of the Faults table whose tests "
            f"exist{', and pass' if counts['ran'] else ''}) | {counts['faults_survived']} of "
            f"{counts['fault_rows']} ({counts['faults_pending']} pending) |",
            f"| Fault test cases | {counts['fault_tests']} |",
            f"| Inputs tried (bad-input matrix cases) | {counts['inputs_tried']} ({counts['bad_inputs']} "
            f"bad, {counts['good_inputs']} that must work) |",
            f"| Bad inputs refused with one line, non-zero exit, outputs compared | "
            f"{counts['bad_inputs_failing_cleanly']} of {counts['bad_inputs']} |",
            "| Data lost (bad-input cases whose outputs changed or were not compared) | "
            f"{counts['data_lost']} |",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run the tests too (about 2 minutes on 2 cores)")
    parser.add_argument(
        "--write", action="store_true", help="write the counts block into docs/reliability.md"
    )
    args = parser.parse_args()
    text = DOC.read_text(encoding="utf-8")
    block = counts_block(compute(text, execute=args.run))
    print(block)
    if args.write:
        start, end = text.index(BEGIN), text.index(END) + len(END)
        DOC.write_text(text[:start] + block + text[end:], encoding="utf-8")


if __name__ == "__main__":
    main()
