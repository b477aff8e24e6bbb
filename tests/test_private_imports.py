"""No module under src/ (nor a benchmark or script) uses another module's private (``_name``) names: what
crosses a file is public."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def private_uses(path: Path) -> list[str]:
    """``module._name`` for each private name ``path`` imports from, or reads off, another fastlm module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fastlm"):
            found += [f"{node.module}.{alias.name}" for alias in node.names if _private(alias.name)]
        elif isinstance(node, ast.Import):
            modules.update(
                {
                    alias.asname or alias.name.split(".")[0]: alias.name
                    for alias in node.names
                    if alias.name.startswith("fastlm")
                }
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
        ):
            found.append(f"{modules[node.value.id]}.{node.attr}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_imports_another_modules_private_names():
    files = [path for folder in ("src", "benchmarks", "scripts") for path in (ROOT / folder).rglob("*.py")]
    uses = {(path.relative_to(ROOT).as_posix(), name) for path in files for name in private_uses(path)}
    assert uses == set()


def test_the_check_sees_both_forms(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from fastlm.engine.train.loop import _hidden, public\nimport fastlm.engine.train.step as step\n"
        "step._inner(1)\nfrom __future__ import annotations\n",
        encoding="utf-8",
    )
    assert private_uses(module) == ["fastlm.engine.train.loop._hidden", "fastlm.engine.train.step._inner"]
