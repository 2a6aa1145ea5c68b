"""Every module's tests can be found without grep (issue 32), checked on the files alone.

A module ``service/<package path>/<module>.py`` has its unit tests at the mirrored path
``tests/unit/<package path>/test_<module>.py``, which imports it; a module without one is listed
in ``tests/covering_suites.py`` with the suite(s) that cover it. An ``__init__.py`` that defines
no function or class (it only re-exports) needs neither. The map has no stale entry: each key is
a module of ``service/`` and each suite it names exists; and every ``test_*.py`` under
``tests/unit/`` mirrors a module. A module may have both (a mirrored file and an entry naming the
suites that cover the rest of it).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

from tests.covering_suites import COVERING_SUITES

REPO = Path(__file__).resolve().parents[1]


def needs_tests(module: Path) -> bool:
    """False only for an ``__init__.py`` with no function or class in it (a re-export list)."""
    if module.name != "__init__.py":
        return True
    tree = ast.parse(module.read_text(), filename=str(module))
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for node in ast.walk(tree)
    )


def mirror(module: str) -> str | None:
    """``service/a/b.py`` -> ``tests/unit/a/test_b.py``; a package's ``__init__.py`` has none."""
    parts = module.split("/")
    if parts[-1] == "__init__.py":
        return None
    return "/".join(["tests", "unit", *parts[1:-1], f"test_{parts[-1]}"])


def mirrored_module(test_file: str) -> str:
    """The inverse of :func:`mirror`: ``tests/unit/a/test_b.py`` -> ``service/a/b.py``."""
    parts = test_file.split("/")
    return "/".join(["service", *parts[2:-1], parts[-1].removeprefix("test_")])


def imports_module(test_file: Path, module: str) -> bool:
    """Whether ``test_file`` imports the module at path ``module`` by its dotted name (``import
    a.b``, ``from a.b import x`` or ``from a import b``), at any depth of the file."""
    dotted = module.removesuffix(".py").replace("/", ".")
    package, _, name = dotted.rpartition(".")
    for node in ast.walk(ast.parse(test_file.read_text(), filename=str(test_file))):
        if isinstance(node, ast.Import) and any(a.name == dotted for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == dotted:
                return True
            if node.module == package and any(a.name == name for a in node.names):
                return True
    return False


def layout_problems(root: Path, covering: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Every way the tree at ``root`` breaks the rule, one line each (empty when it holds)."""
    problems = []
    modules = sorted(p.relative_to(root).as_posix() for p in (root / "service").rglob("*.py"))
    for module in modules:
        if not needs_tests(root / module):
            continue
        mirrored = mirror(module)
        if (mirrored is None or not (root / mirrored).exists()) and module not in covering:
            problems.append(
                f"{module}: no unit tests at {mirrored or '(a package has no mirror)'} and no "
                "entry in tests/covering_suites.py"
            )
    for module, suites in sorted(covering.items()):
        if module not in modules:
            problems.append(f"{module}: in tests/covering_suites.py but no such module")
        if not suites:
            problems.append(f"{module}: its entry in tests/covering_suites.py names no suite")
        for suite in suites:
            if not (suite.startswith("tests/") and Path(suite).name.startswith("test_")):
                problems.append(f"{module}: {suite} is not a test file under tests/")
            elif not (root / suite).is_file():
                problems.append(f"{module}: covering suite {suite} does not exist")
    for path in sorted((root / "tests" / "unit").rglob("test_*.py")):
        test_file = path.relative_to(root).as_posix()
        module = mirrored_module(test_file)
        if module not in modules:
            problems.append(f"{test_file}: mirrors no module ({module} does not exist)")
        elif not imports_module(path, module):
            problems.append(f"{test_file}: does not import the module it mirrors, {module}")
    return problems


def test_every_module_has_mirrored_unit_tests_or_a_covering_suite() -> None:
    problems = layout_problems(REPO, COVERING_SUITES)
    assert not problems, "\n".join(problems)


def test_the_map_is_sorted_and_names_each_module_and_suite_once() -> None:
    """The map is read by people: keys sorted, no module twice (a dict literal would keep the
    last of two), each suite once per entry."""
    source = (REPO / "tests" / "covering_suites.py").read_text()
    keys = [
        key.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Dict)
        for key in node.keys
        if isinstance(key, ast.Constant)
    ]
    assert keys == sorted(keys) and len(keys) == len(set(keys)) == len(COVERING_SUITES)
    for module, suites in COVERING_SUITES.items():
        assert len(suites) == len(set(suites)), module


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_checker_reports_each_break_of_the_rule(tmp_path: Path) -> None:
    """The control: a planted tree that keeps the rule passes; each planted break is reported."""
    _write(
        tmp_path,
        {
            "service/__init__.py": '"""Re-exports only."""\nfrom service.pkg.kept import f\n',
            "service/pkg/__init__.py": "",
            "service/pkg/kept.py": "def f() -> int:\n    return 1\n",
            "service/pkg/listed.py": "X = 1\n",
            "tests/unit/pkg/__init__.py": "",
            "tests/unit/pkg/test_kept.py": "from service.pkg import kept\n",
            "tests/test_listed.py": "import service.pkg.listed\n",
        },
    )
    good = {"service/pkg/listed.py": ("tests/test_listed.py",)}
    assert layout_problems(tmp_path, good) == []

    # A made-up module with neither a mirror nor an entry, and a package __init__ that defines
    # a function (so it is a module to test, not a re-export list).
    _write(
        tmp_path,
        {
            "service/pkg/made_up.py": "def g() -> None:\n    pass\n",
            "service/pkg/__init__.py": "def h() -> None:\n    pass\n",
        },
    )
    found = layout_problems(tmp_path, good)
    assert found == [
        "service/pkg/__init__.py: no unit tests at (a package has no mirror) and no entry in "
        "tests/covering_suites.py",
        "service/pkg/made_up.py: no unit tests at tests/unit/pkg/test_made_up.py and no entry in "
        "tests/covering_suites.py",
    ]
    _write(tmp_path, {"service/pkg/__init__.py": ""})
    (tmp_path / "service/pkg/made_up.py").unlink()

    # Stale and broken entries in the map.
    broken = {
        "service/pkg/listed.py": ("tests/test_listed.py", "tests/test_gone.py"),
        "service/pkg/removed.py": ("tests/test_listed.py",),
        "service/pkg/kept.py": (),
        "service/__init__.py": ("tests/helpers.py",),
    }
    assert layout_problems(tmp_path, broken) == [
        "service/__init__.py: tests/helpers.py is not a test file under tests/",
        "service/pkg/kept.py: its entry in tests/covering_suites.py names no suite",
        "service/pkg/listed.py: covering suite tests/test_gone.py does not exist",
        "service/pkg/removed.py: in tests/covering_suites.py but no such module",
    ]

    # A mirrored file that does not import its module, and one that mirrors nothing.
    _write(
        tmp_path,
        {
            "tests/unit/pkg/test_kept.py": "from service.pkg.listed import X\n",
            "tests/unit/pkg/test_nothing.py": "import service.pkg.kept\n",
        },
    )
    assert layout_problems(tmp_path, good) == [
        "tests/unit/pkg/test_kept.py: does not import the module it mirrors, service/pkg/kept.py",
        "tests/unit/pkg/test_nothing.py: mirrors no module (service/pkg/nothing.py does not exist)",
    ]


def test_an_import_counts_in_each_of_its_forms(tmp_path: Path) -> None:
    path = tmp_path / "test_x.py"
    for text, imports in (
        ("import service.pkg.mod\n", True),
        ("import service.pkg.mod as m\n", True),
        ("from service.pkg.mod import f\n", True),
        ("from service.pkg import mod\n", True),
        ("def test() -> None:\n    from service.pkg import mod\n", True),
        ("from service.pkg import other\n", False),
        ("from service.pkg.module import f\n", False),
        ("import service.pkg\n", False),
    ):
        path.write_text(text)
        assert imports_module(path, "service/pkg/mod.py") is imports, text
