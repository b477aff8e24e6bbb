"""The architecture, checked: the engine's sub-packages form layers (a lower one never imports a higher one,
lazy imports inside functions included), nothing under src/ imports in a circle, MLflow is imported only by
the tracking module, and no two modules share a look-alike name."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# The engine's layers, lowest first: a module may import its own layer and the layers before it, never after.
ENGINE_LAYERS = (
    "paths",  # paths named relative to the project
    "config",  # the validated train.* parameters
    "data",  # datasets, the batch schema, labels, packing, collators, samplers
    "observe",  # metrics, rates, health checks, progress, profiling
    "distributed",  # ranks, process groups, DDP / FSDP2 wrapping
    "model",  # building, pretrained folders, LoRA, attention, the encoder-decoder hooks, the losses
    "runtime",  # device, precision, threads; the first-steps runtime probe
    "batching",  # the micro-batch stream of a batching mode
    "checkpoint",  # checkpoint files, the lock, which checkpoint to resume, disk space
    "evaluate",  # evaluation and generation
    "train",  # the loop and its components: step, optimizer, schedule, state, saving, records, tune
    "launch",  # one job, one or several processes
)
# The one module that talks to MLflow (hooks hand its tracker to the nodes).
MLFLOW_MODULES = {"fastlm.tracking"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in SRC.rglob("*.py")}


def imports(name: str) -> set[str]:
    """The fastlm modules ``name`` imports anywhere in its file (function-level imports too), each resolved to
    a module (``from package import module`` names the module, ``from module import name`` the module)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            )
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {module for module in found if module.startswith("fastlm") and module != name}


def _external_imports(name: str) -> set[str]:
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def engine_layer(name: str) -> int | None:
    parts = name.split(".")
    if parts[:2] != ["fastlm", "engine"] or len(parts) < 3:
        return None
    assert parts[2] in ENGINE_LAYERS, f"{name}: its sub-package is in no layer of ENGINE_LAYERS"
    return ENGINE_LAYERS.index(parts[2])


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_each_engine_module_lives_in_a_layer_and_imports_no_higher_layer():
    wrong = []
    for name in MODULES:
        layer = engine_layer(name)
        if layer is None:
            continue
        wrong += [
            f"{name} ({ENGINE_LAYERS[layer]}) imports {other} ({ENGINE_LAYERS[engine_layer(other)]})"
            for other in sorted(imports(name))
            if (engine_layer(other) or -1) > layer
        ]
    assert not wrong, "\n".join(wrong)


def test_the_engine_root_holds_only_its_layers():
    root = SRC / "fastlm/engine"
    names = {path.stem for path in root.iterdir() if path.suffix == ".py" or path.is_dir()} - {
        "__init__",
        "__pycache__",
    }
    assert names == set(ENGINE_LAYERS)


def test_nothing_under_src_imports_in_a_circle():
    graph = {name: {other for other in imports(name) if other in MODULES} for name in MODULES}
    assert cycles(graph) == []


def test_only_the_tracking_side_imports_mlflow():
    users = {
        name
        for name in MODULES
        if any(module == "mlflow" or module.startswith("mlflow.") for module in _external_imports(name))
    }
    assert users <= MLFLOW_MODULES, sorted(users - MLFLOW_MODULES)


def test_no_two_modules_share_a_look_alike_name():
    """One concept per name: no module or package is named like another with a suffix (checkpoint /
    checkpointer), and one "config" per package. Kedro's pipeline folders (``pipelines/<name>``) follow
    Kedro's naming and are left out."""
    stems = {}
    for name in (name for name in MODULES if not name.startswith("fastlm.pipelines.")):
        stem = name.rpartition(".")[2]
        stems.setdefault(stem, []).append(name)
    look_alike = [
        (a, b)
        for a in stems
        for b in stems
        if a != b
        and not a.startswith("_")
        and len(a) >= 4
        and b.startswith(a)
        and b[len(a) :] in {"er", "ing", "s", "_hooks", "_probe"}
    ]
    assert not look_alike, look_alike
    configs = [name for name in MODULES if name.rpartition(".")[2] in {"config", "params", "parameters"}]
    packages = [name.rpartition(".")[0] for name in configs]
    assert len(packages) == len(set(packages)), configs


@pytest.mark.parametrize(
    "graph, expected",
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}, "c": {"a"}}, [["a", "b"]]),
    ],
)
def test_the_circle_check_finds_circles(graph, expected):
    assert cycles(graph) == expected


def test_the_import_reader_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    package = tmp_path / "fastlm" / "engine" / "model"
    package.mkdir(parents=True)
    (package / "lazy.py").write_text(
        "def f():\n    from fastlm.engine.train import loop\nfrom . import other\n", encoding="utf-8"
    )
    monkeypatch.setitem(MODULES, "fastlm.engine.model.lazy", package / "lazy.py")
    monkeypatch.setitem(MODULES, "fastlm.engine.train.loop", package / "lazy.py")
    monkeypatch.setitem(MODULES, "fastlm.engine.model.other", package / "lazy.py")
    assert imports("fastlm.engine.model.lazy") == {"fastlm.engine.train.loop", "fastlm.engine.model.other"}
