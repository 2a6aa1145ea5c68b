"""Build step that ships the top-level ``migrations/`` inside the wheel as ``service/migrations``.

``migrations/`` stays the one source of the ledger's Alembic migrations (``alembic.ini`` and a
source checkout use it in place); a wheel must carry them, since ``db upgrade`` and ``serve``
run them from an installed package. Everything else is in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
PACKAGED_AS = ("service", "migrations")


class BuildPyWithMigrations(build_py):
    """``build_py`` that also copies ``migrations/`` into the built package (not editable)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, where migrations/ is found
        target = Path(self.build_lib).joinpath(*PACKAGED_AS)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(
            MIGRATIONS, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")
        )


setup(cmdclass={"build_py": BuildPyWithMigrations})
