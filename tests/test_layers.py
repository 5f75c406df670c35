"""The tree's layers, read from the source: which package may import which, and no import cycles.

Every ``import`` and ``from ... import`` of the project's own modules is counted, those inside functions
too (a lazy import is still a dependency). The layers, lowest first:

    packed_ss (engine core) <- packed_ss.bench, packed_ss.training <- serve <- components <- tabs <- app
    packed_ss.sandbox (imports nothing of the project) <- packed_ss.evals (and packed_ss.bench) <- serve
    packed_ss.bench.files <- packed_ss.lmeval (lm-eval's model; nothing of the project imports it)

with ``packed_ss.schedules`` and ``packed_ss.any_order`` side by side (only ``packed_ss.registry`` and the
engine see both), ``packed_ss.models`` below the schedules, and ``packed_ss.bench.cli`` the one front door of
both command lines (its ``--task`` hands over to ``packed_ss.evals.cli``).
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("packed_ss", "serve", "components", "tabs")

# group -> groups it must never import (directly, at any depth of the file)
FORBIDDEN = {
    "packed_ss.models": {"packed_ss.schedules", "packed_ss.any_order", "packed_ss.engine", "packed_ss.bench",
                         "packed_ss.training", "serve", "components", "tabs", "app"},
    "packed_ss.schedules": {"packed_ss.any_order", "packed_ss.engine", "packed_ss.registry", "packed_ss.bench",
                            "packed_ss.training", "serve", "components", "tabs", "app"},
    "packed_ss.any_order": {"packed_ss.schedules", "packed_ss.engine", "packed_ss.registry", "packed_ss.bench",
                            "packed_ss.training", "serve", "components", "tabs", "app"},
    "packed_ss": {"packed_ss.bench", "packed_ss.evals", "packed_ss.sandbox", "packed_ss.training", "packed_ss.lmeval",
                  "serve", "components", "tabs", "app"},
    "packed_ss.sandbox": {"packed_ss", "serve", "components", "tabs", "app"},
    "packed_ss.bench": {"packed_ss.evals", "packed_ss.sandbox", "packed_ss.training", "packed_ss.lmeval", "serve",
                        "components", "tabs", "app"},
    "packed_ss.evals": {"packed_ss.training", "packed_ss.lmeval", "serve", "components", "tabs", "app"},
    # lm-eval's model: the engine behind lm-eval's command line; nothing of the project imports it
    "packed_ss.lmeval": {"packed_ss.evals", "packed_ss.sandbox", "packed_ss.training", "serve", "components", "tabs",
                         "app"},
    "packed_ss.training": {"packed_ss.lmeval", "serve", "components", "tabs", "app"},
    "serve": {"packed_ss.lmeval", "components", "tabs", "app"},
    "components": {"packed_ss.lmeval", "tabs", "app"},
    "tabs": {"packed_ss.lmeval", "app"},
}
ENTRY_POINTS = {"packed_ss.train", "packed_ss.bench.__main__", "packed_ss.lmeval.__main__"}  # documented commands: thin entry points
# The benchmark's command line takes --task and hands it to the harness's: its one way up.
FRONT_DOOR = {("packed_ss.bench.cli", "packed_ss.evals.cli"), ("packed_ss.bench.cli", "packed_ss.evals.tasks")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def group(module: str) -> str:
    """The layer a module belongs to (the most specific group of FORBIDDEN that contains it)."""
    if module == "app":
        return "app"
    for name in sorted(FORBIDDEN, key=len, reverse=True):
        if module == name or module.startswith(name + "."):
            return name
    raise AssertionError(f"module {module} is in no layer")


def forbidden(module: str, dependency: str) -> bool:
    """Whether ``module``'s layer may not import ``dependency`` (it is, or lies inside, a forbidden group; a layer's
    own modules never are)."""
    own = group(module)
    if dependency == own or dependency.startswith(own + "."):
        return False
    return any(dependency == f or dependency.startswith(f + ".") for f in FORBIDDEN.get(group(module), ()))


def project_modules() -> dict[str, Path]:
    found = {"app": ROOT / "app.py"}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The project modules a file imports (the longest known prefix of each imported name)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")
            for cut in range(len(parts), 0, -1):
                if ".".join(parts[:cut]) in known:
                    out.add(".".join(parts[:cut]))
                    break
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = project_modules()
    known = set(modules)
    return {name: imports_of(path, known) - {name} for name, path in modules.items()}


def test_no_layer_imports_a_layer_above_it(graph):
    wrong = sorted(f"{m} imports {d}" for m, deps in graph.items() if m not in ENTRY_POINTS
                   for d in deps if forbidden(m, d) and (m, d) not in FRONT_DOOR)
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules(graph):
    # A package's __init__ that imports its own submodules is not a cycle with them.
    edges = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


def test_the_scanner_sees_lazy_imports_and_layers(tmp_path):
    """The checks above can fail: a function-level import is found, and an upward one is a violation."""
    path = tmp_path / "engine_like.py"
    path.write_text("import packed_ss.layout\n\ndef f():\n    from serve.models import ModelStore\n", encoding="utf-8")
    found = imports_of(path, {"packed_ss.layout", "serve.models", "serve"})
    assert found == {"packed_ss.layout", "serve.models"}
    assert forbidden("packed_ss.engine", "serve.models")
    assert forbidden("packed_ss.models.scripted", "packed_ss.engine")
    assert forbidden("packed_ss.schedules.packed", "packed_ss.any_order.session")
    assert not forbidden("tabs.step", "serve.step") and not forbidden("packed_ss.engine", "packed_ss.any_order")
    assert forbidden("packed_ss.sandbox.runner", "packed_ss.evals.task")  # the sandbox knows no task
    assert forbidden("packed_ss.sandbox.runner", "packed_ss.inputs") and not forbidden("packed_ss.sandbox", "packed_ss.sandbox.names")
    assert forbidden("packed_ss.bench.run", "packed_ss.evals.harness")


MAX_FUNCTION_LINES = 80  # above the engine (serve, components, tabs, app.py): a function reads on one screen


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:line name (n lines)`` of every function or method in ``path`` longer than ``limit`` lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno} {node.name} "
            f"({node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > limit]


def test_no_function_above_the_engine_is_longer_than_a_screen():
    files = [ROOT / "app.py", *(p for d in ("serve", "components", "tabs") for p in sorted((ROOT / d).rglob("*.py")))]
    assert len(files) > 10
    assert not [f for path in files for f in long_functions(path)]


def test_the_length_check_counts_a_long_function(tmp_path):
    path = tmp_path / "long.py"
    path.write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 80, encoding="utf-8")
    assert long_functions(path) == ["long.py:5 long (81 lines)"]
