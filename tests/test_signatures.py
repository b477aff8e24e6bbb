"""No function in src/ takes 10 or more named parameters: arguments that travel together become one small
typed object (``EvalOptions``, ``LadderSettings``, ``CompileProbe``, ``StreamLayout``, ``SaveOptions``,
``ReportInputs``, ``TrainRequest``, a validated parameter group).

Counted: the named parameters (positional and keyword-only, ``self``/``cls`` left out); ``*args`` /
``**kwargs`` pass-throughs are not a list of arguments that travel together and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 10

# Functions allowed to keep their long signature, each with the reason.
ALLOWED = {
    # Kedro nodes: Kedro passes each catalog input as its own argument.
    "write_report": "Kedro node of the report pipeline; groups its inputs into ReportInputs at once",
    "run_sweep": "Kedro node of the sweep pipeline; each argument is a catalog input or parameter group",
    # Signatures set outside the project.
    "torch_varlen_attention": "a transformers attention function: transformers calls it with these keywords",
    "sdpa_varlen_attention": "a transformers attention function: transformers calls it with these keywords",
    # The engine's public entry point, kept as it is for its callers (launch, benchmarks, tests); it groups
    # its arguments into build.TrainRequest on its first line.
    "train": "engine.train.loop.train's public signature",
}


def _named_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = function.args
    names = [arg.arg for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    return len(names) - (1 if names[:1] in (["self"], ["cls"]) else 0)


def _long_signatures() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and _named_parameters(node) >= LIMIT:
                found.setdefault(node.name, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_no_function_in_src_takes_ten_or_more_parameters():
    offenders = {name: where for name, where in _long_signatures().items() if name not in ALLOWED}
    assert not offenders, (
        f"functions with >= {LIMIT} named parameters (group the ones that travel together "
        f"into a frozen dataclass, or list the function in ALLOWED with the reason): {offenders}"
    )


def test_every_allowed_long_signature_still_exists():
    """A function taken off the list when it is fixed: the list names only what is still long."""
    assert set(ALLOWED) <= set(_long_signatures())


def test_the_count_sees_keyword_only_parameters_and_leaves_self_and_kwargs_out():
    source = "class A:\n    def f(self, a, b, /, c, *args, d, e, **kwargs): ...\n"
    function = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef))
    assert _named_parameters(function) == 5
