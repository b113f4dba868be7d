"""Dependencies run one way: no import circle even counting the imports inside functions
and under ``TYPE_CHECKING``, and no lower layer imports a higher one, not even for a type."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "scheduler"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere: at the top, in a function,
    under ``TYPE_CHECKING``."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    target = node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in modules else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


GRAPH = _graph()


def _imports_of(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in GRAPH.items() if m == prefix or m.startswith(prefix + ".")}


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_no_import_circle_counting_every_import():
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(node):], node]))
        if node in done:
            return
        for dep in sorted(GRAPH[node]):
            visit(dep, [*path, node])
        done.add(node)

    for node in sorted(GRAPH):
        visit(node, [])


# The layers above the store: what uses it (the producer's rules, the recurring API, the
# clients, the poller and everything built on them).
ABOVE_THE_STORE = ("scheduler.recurring", "scheduler.producer", "scheduler.repair", "scheduler.client",
                   "scheduler.aclient", "scheduler.poller", "scheduler.runner", "scheduler.fleet",
                   "scheduler.cli", "scheduler.cli_common", "scheduler.cli_admin", "scheduler.cli_ops",
                   "scheduler.cli_recurring", "scheduler.cli_console", "scheduler.console")


@pytest.mark.parametrize("layer,above", [
    ("scheduler.store", ABOVE_THE_STORE),
    # The pure schedule types sit below both the store and the recurring API.
    ("scheduler.schedule", ("scheduler.store", *ABOVE_THE_STORE)),
    ("scheduler.rule", ("scheduler.store", *ABOVE_THE_STORE)),
    # The client builds ``Recurring``; the recurring API never sees the client.
    ("scheduler.recurring", ("scheduler.client", "scheduler.aclient", "scheduler.poller")),
    # The poller writes occurrences through a Producer it builds from what it holds,
    # not through the public Client (which reads the environment's settings).
    ("scheduler.poller", ("scheduler.client", "scheduler.aclient")),
])
def test_no_lower_layer_imports_a_higher_one(layer, above):
    wrong = {f"{m} -> {d}" for m, deps in _imports_of(layer).items() for d in deps if _under(d, above)}
    assert not wrong, f"{layer} imports a layer above it: {sorted(wrong)}"
