"""The package's layers, checked on its source: no import circle among the modules of
``service/``, and no module importing from a floor above its own.

The floors, top to bottom (docs/architecture.md, "The shape to reach"): the entry points
(``cli/``, ``service/__main__.py``) on top; ``api/``; ``serving/``; ``ledger/``; then the pure
parts, ``mechanisms/`` over ``graph/`` and ``privacy/``, and ``privacy/`` depends on nothing of
ours but ``errors``. The rules below are what that means for imports.

* An **import circle** is one among module-level imports, ``if TYPE_CHECKING:`` blocks
  included (mypy and readers follow those too); an import inside a function runs later and
  does not count. Importing ``a.b.c`` also runs the ``__init__`` of ``a.b`` (unless the
  importer lives inside ``a.b``), so that counts as an import of the package too.
* The **layer rules** count every import, inside functions too: a lazy import is still a
  dependency on the floor it names.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICE = REPO / "service"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (a module of service/, or a name outside it)
    line: int
    module_level: bool  # at import time (TYPE_CHECKING blocks included), not in a function

    def __str__(self) -> str:
        where = "" if self.module_level else " (in a function)"
        return f"{self.source}:{self.line} imports {self.target}{where}"


def _resolve(module: str, name: str | None) -> str:
    """``from module import name``: the submodule when ``name`` is one, else the module."""
    if name is not None and f"{module}.{name}" in MODULES:
        return f"{module}.{name}"
    return module


def imports_of(source: str, text: str, *, is_package: bool = False) -> list[Import]:
    """Every import statement of a module's source, resolved to module names."""
    package = source if is_package else source.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append(Import(source, alias.name, node.lineno, module_level))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                found.append(
                    Import(source, _resolve(module, alias.name), node.lineno, module_level)
                )
        inner = module_level and not isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        )
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    visit(ast.parse(text), True)
    return found


@cache
def all_imports() -> list[Import]:
    """Every import of a module of service/ by one, read once per process when a test asks
    (not at collection, which every xdist worker does: 0.8 CPU-s each)."""
    return [
        i
        for name, path in MODULES.items()
        for i in imports_of(name, path.read_text(), is_package=path.name == "__init__.py")
        if i.target == "service" or i.target.startswith("service.")
    ]


def _known(target: str) -> str | None:
    """The module of service/ an import names (``service.x.Name`` -> ``service.x``)."""
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target or None


def _run_on_import(imp: Import) -> Iterator[str]:
    """The modules an import runs: the module named, and the ``__init__`` of each package
    above it that the importer is not already inside."""
    target = _known(imp.target)
    if target is None:
        return
    yield target
    parent = target.rpartition(".")[0]
    while parent:
        if parent != imp.source and not imp.source.startswith(parent + "."):
            yield parent
        parent = parent.rpartition(".")[0]


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_no_import_circle_among_the_modules_of_service() -> None:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    lines: dict[tuple[str, str], int] = {}
    for imp in all_imports():
        if not imp.module_level:
            continue
        for target in _run_on_import(imp):
            if target != imp.source:
                edges[imp.source].add(target)
                lines.setdefault((imp.source, target), imp.line)
    circles = _circles(edges)
    described = [
        "; ".join(f"{a}:{lines[a, b]} -> {b}" for a in c for b in sorted(edges[a]) if b in c)
        for c in circles
    ]
    assert circles == [], "import circles:\n" + "\n".join(described)


# -- the layer rules -----------------------------------------------------------------------------


def floor(module: str) -> str:
    """The package directly under service/ (``service.api.routes.ppr`` -> ``api``), or the
    module's own name for a module directly in it (``service.errors`` -> ``errors``)."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


#: Entry points: they sit on top, and may import any floor.
ENTRY_POINTS = {"cli", "__main__"}


@dataclass(frozen=True)
class Rule:
    name: str
    applies: Callable[[str], bool]  # to the importing module's floor
    allows: Callable[[str], bool]  # the imported module (of service/)


RULES = [
    Rule(
        "nothing below api/ imports api/ (only api/ and the entry points above it)",
        lambda source: source not in {"api", *ENTRY_POINTS},
        lambda target: floor(target) != "api",
    ),
    Rule(
        "privacy/ imports only privacy/ and service.errors",
        lambda source: source == "privacy",
        lambda target: floor(target) == "privacy" or target == "service.errors",
    ),
    Rule(
        "graph/, privacy/ and mechanisms/ import nothing from serving/, ledger/, api/, cli/",
        lambda source: source in {"graph", "privacy", "mechanisms"},
        lambda target: floor(target) not in {"serving", "ledger", "api", "cli"},
    ),
    Rule(
        "graph/ imports nothing from mechanisms/ (mechanisms/ sits above graph/)",
        lambda source: source == "graph",
        lambda target: floor(target) != "mechanisms",
    ),
    Rule(
        "ledger/ imports nothing from serving/, api/, cli/",
        lambda source: source == "ledger",
        lambda target: floor(target) not in {"serving", "api", "cli"},
    ),
    Rule(
        "serving/ imports nothing from api/, cli/",
        lambda source: source == "serving",
        lambda target: floor(target) not in {"api", "cli"},
    ),
    Rule(
        "only cli/ and service/__main__.py import cli/",
        lambda source: source not in ENTRY_POINTS,
        lambda target: floor(target) != "cli",
    ),
]


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_no_module_imports_from_a_floor_above_its_own(rule: Rule) -> None:
    broken = [
        str(imp)
        for imp in all_imports()
        if rule.applies(floor(imp.source))
        and (target := _known(imp.target)) is not None
        and not rule.allows(target)
    ]
    assert broken == [], f"{rule.name}:\n" + "\n".join(broken)


# -- the checker itself --------------------------------------------------------------------------


def test_the_checker_sees_type_checking_relative_and_lazy_imports() -> None:
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from service.serving import pipeline\n"
        "from .replay import Replayer\n"
        "if TYPE_CHECKING:\n"
        "    from service.ledger.ledger import Ledger\n"
        "def f():\n"
        "    import service.api.app\n"
        "class C:\n"
        "    from service.errors import ServiceError\n"
    )
    found = imports_of("service.serving.pipeline.answer", source)
    seen = {(i.target, i.module_level) for i in found}
    assert ("service.serving.pipeline", True) in seen
    assert ("service.serving.pipeline.replay", True) in seen
    assert ("service.ledger.ledger", True) in seen  # TYPE_CHECKING counts for circles
    assert ("service.api.app", False) in seen  # a lazy import: layers only
    assert ("service.errors", True) in seen
    assert _circles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]


def test_the_checker_reads_the_whole_package() -> None:
    assert len(MODULES) > 200 and "service.api.app" in MODULES
    assert any(
        i.source == "service.api.app" and _known(i.target) == "service.config"
        for i in all_imports()
    )
