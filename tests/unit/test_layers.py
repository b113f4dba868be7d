"""Dependencies run one way: no import circle even counting the imports inside functions
and under ``TYPE_CHECKING``, and no lower layer imports a higher one, not even for a type."""

from __future__ import annotations

import ast
from pathlib import Path

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


# The layers, lowest first. A module may import its own layer and the layers below it,
# never one above, not even for a type or inside a function. The root modules have a place
# too: ``errors`` is below everything, ``settings`` reads the domain's types, ``logs`` uses
# the fault log; ``scheduler`` itself (the public API) and ``__main__`` sit on top, with the CLI.
LAYERS = (
    ("scheduler.errors",),
    ("scheduler.security", "scheduler.diagnose"),
    ("scheduler.domain",),
    ("scheduler.recurring",),
    ("scheduler.settings",),
    ("scheduler.store",),
    ("scheduler.fleet",),
    ("scheduler.observe",),
    ("scheduler.logs",),
    ("scheduler.producer",),
    ("scheduler.poller",),
    ("scheduler.runtime",),
    ("scheduler.console", "scheduler.api"),
    # The CLI reads the version from the package; the package's public API never imports
    # the CLI.
    ("scheduler.cli", "scheduler", "scheduler.__main__"),
)

# What may sit at the package root: the five every package of this shape has, plus the two
# the design page explains (connections' security options and their failure diagnosis,
# which both the store and the fleet's ZooKeeper client use).
ROOT_MODULES = {"scheduler", "scheduler.__main__", "scheduler.errors", "scheduler.settings",
                "scheduler.logs", "scheduler.security", "scheduler.diagnose"}


def _rank(module: str) -> int:
    best, rank = -1, -1
    for i, layer in enumerate(LAYERS):
        for prefix in layer:
            if (module == prefix or (prefix != "scheduler" and module.startswith(prefix + "."))) \
                    and len(prefix) > best:
                best, rank = len(prefix), i
    assert rank >= 0, f"{module} is in no layer: add it to LAYERS"
    return rank


def test_every_module_has_a_layer_and_the_root_holds_only_the_listed_modules():
    for module in GRAPH:
        _rank(module)
    root = {m for m in GRAPH if m.count(".") <= 1 and not _is_package(m)} | {"scheduler"}
    assert root <= ROOT_MODULES, f"modules at the package root: {sorted(root - ROOT_MODULES)}"


def _is_package(module: str) -> bool:
    return (ROOT.parent.joinpath(*module.split(".")) / "__init__.py").exists()


def test_no_lower_layer_imports_a_higher_one():
    wrong = sorted(f"{m} -> {d}" for m, deps in GRAPH.items() for d in deps if _rank(d) > _rank(m))
    assert not wrong, f"imports of a higher layer: {wrong}"


def test_the_poller_writes_occurrences_without_the_public_client():
    """The poller builds a Producer from what it holds, not the public Client (which reads
    the environment's settings)."""
    client = ("scheduler.producer.client", "scheduler.producer.aclient", "scheduler.settings")
    wrong = sorted(f"{m} -> {d}" for m, deps in _imports_of("scheduler.poller").items()
                   for d in deps if _under(d, client))
    assert not wrong, wrong


def test_the_store_reads_no_settings():
    """The store is given its options (security included); it never reads the environment."""
    wrong = sorted(f"{m} -> {d}" for m, deps in _imports_of("scheduler.store").items()
                   for d in deps if _under(d, ("scheduler.settings",)))
    assert not wrong, wrong
