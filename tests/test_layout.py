"""The test suite's own layout: helpers shared between test files live in tests/support (no test file imports
another test file or a conftest), and fixtures live only in conftest files."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_test_files_import_shared_helpers_only_from_tests_support():
    wrong = {
        f"{path.relative_to(TESTS)}: {module}"
        for path in TESTS.rglob("*.py")
        for module in _imported_modules(path)
        if module.startswith("tests.") and not module.startswith("tests.support")
    }
    assert not wrong, sorted(wrong)


def test_tests_support_defines_no_fixture():
    shared = [
        path for path in (TESTS / "support").rglob("*.py") if "pytest.fixture" in path.read_text("utf-8")
    ]
    assert not shared, shared


def test_a_file_comparing_two_computations_runs_under_other_cpu_kernel_sets_too():
    """Tolerances for two different computations come from tests/support/tolerances; a file using them is
    marked ``kernels``, which scripts/check_cpu_kernels.sh (and CI) run under other CPU kernel sets."""
    unmarked = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if "tests.support.tolerances" in _imported_modules(path)
        and "pytest.mark.kernels" not in path.read_text(encoding="utf-8")
    ]
    assert not unmarked, unmarked


def test_every_engine_module_has_its_own_test_file():
    """Tests follow the engine's layout: ``src/fastlm/engine/<package>/<module>.py`` is tested in
    ``tests/engine/<package>/test_<module>.py``, so a module's tests are found (and a module without any is
    seen) by its path alone; tests of the loop as a whole may stay elsewhere besides."""
    engine = TESTS.parent / "src" / "fastlm" / "engine"
    missing = [
        str(Path("tests", "engine", module.parent.relative_to(engine), f"test_{module.name}"))
        for module in sorted(engine.rglob("*.py"))
        if module.name != "__init__.py"
        and not (TESTS / "engine" / module.parent.relative_to(engine) / f"test_{module.name}").is_file()
    ]
    assert not missing, missing
