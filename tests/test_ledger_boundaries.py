"""The ledger's parts talk through public methods, checked on the source.

* No module imports an underscore name from another module of ``service/`` (and nothing in
  ``tests/`` or ``benchmarks/`` imports one from ``service.ledger``): what a module shares,
  it names publicly.
* No module reaches into the ledger's transactions through another object
  (``ledger._transactions``); a part uses its own (``self._transactions``) and others get
  them as ``part.transactions``.
* Inside ``service/ledger/``, a part never calls a private method of a collaborator it holds
  (``self._rules._admit_locked(...)``) nor a private name of a class or module it imported
  (``Settlement._refund(...)``).

The checker runs on source text, so the tests at the end plant each violation in a string and
show that it is caught.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVICE = REPO / "service"

#: Underscore attributes that are public APIs of other libraries (namedtuple, SQLAlchemy rows).
LIBRARY_API = frozenset({"_asdict", "_replace", "_fields", "_make", "_mapping", "_meta"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_of(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def boundary_violations(module: str, text: str) -> list[str]:
    """The boundary rules ``module`` (a dotted name, e.g. ``service.ledger.admission``)
    breaks in its source ``text``, one message each."""
    tree = ast.parse(text)
    in_service = module.startswith("service.")
    in_ledger = module.startswith("service.ledger.")
    found: list[str] = []
    imported: set[str] = set()  # names bound by `from service... import`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            source = node.module
            if not source.startswith("service.") or source == module:
                continue
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if not _private(alias.name):
                    continue
                if in_service or source.startswith("service.ledger"):
                    found.append(f"{module}:{node.lineno} imports {alias.name} from {source}")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not _private(node.attr):
            continue
        value = node.value
        on_self = isinstance(value, ast.Name) and value.id in ("self", "cls")
        where = f"{module}:{node.lineno} reads {ast.unparse(node)}"
        if node.attr == "_transactions" and not on_self:
            found.append(f"{where} (another object's transactions)")
        elif in_ledger and node.attr not in LIBRARY_API:
            held = (
                isinstance(value, ast.Attribute)
                and isinstance(value.value, ast.Name)
                and value.value.id == "self"
            )
            if held or (isinstance(value, ast.Name) and value.id in imported):
                found.append(f"{where} (a private name of another part)")
    return found


def _sources(*roots: Path) -> list[tuple[str, Path]]:
    return [(_module_of(p), p) for root in roots for p in sorted(root.rglob("*.py"))]


def test_no_module_crosses_a_boundary() -> None:
    violations = [
        message
        for module, path in _sources(SERVICE, REPO / "tests", REPO / "benchmarks")
        for message in boundary_violations(module, path.read_text())
    ]
    assert violations == []


# --- the checker catches what it is for -------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "text"),
    [
        ("service.ledger.admission", "from service.ledger.ledger_rows import _view\n"),
        ("service.serving.draw", "from service.mechanisms.engine import (a, _kernel)\n"),
        ("tests.test_x", "from service.ledger.ledger_rows import _subtract_up\n"),
        ("service.ledger.admin_views", "def f(ledger):\n    return ledger._transactions\n"),
        ("service.api.runtime", "x = runtime.ledger._transactions.engine\n"),
        (
            "service.ledger.admission",
            "class A:\n    def f(self):\n        return self._rules._admit_locked(1)\n",
        ),
        (
            "service.ledger.settlement",
            "from service.ledger.admission import Admissions\nAdmissions._admit(None)\n",
        ),
    ],
)
def test_a_planted_violation_is_caught(module: str, text: str) -> None:
    assert len(boundary_violations(module, text)) == 1


@pytest.mark.parametrize(
    ("module", "text"),
    [
        ("service.ledger.admission", "from service.ledger.ledger_rows import budget_view\n"),
        ("service.ledger.ledger_rows", "from service.ledger.ledger_rows import _view\n"),
        ("tests.test_x", "from service.graph.generate import _format_int_pairs\n"),
        ("service.ledger.parts", "class P:\n    def f(self):\n        return self._transactions\n"),
        ("service.ledger.reports", "def f(row):\n    return row._asdict(), row._secret\n"),
        (
            "service.ledger.admission",
            "class A:\n    def f(self):\n        return self._rules.admit_locked(1)\n",
        ),
    ],
)
def test_what_the_rules_allow_passes(module: str, text: str) -> None:
    assert boundary_violations(module, text) == []
