"""The public SNAP graphs in ``shared/data`` beside the clone: the one place tests find them.

A clone without that directory skips every test that reads them, each with the same reason
(``REASON``, listed by ``pytest -ra``), and runs everything else. tests/test_readme.py checks
that no test looks for the directory any other way, so CONTRIBUTING.md's statement stays true
without a count that drifts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
REASON = "needs shared/data beside the clone"


def shared_file(name: str) -> Path:
    """``shared/data/<name>``, or skip the calling test (with ``REASON``) if it is not there."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{REASON} ({name})")
    return path


def needs_shared_file(name: str) -> pytest.MarkDecorator:
    """Skip the decorated test (with ``REASON``) unless ``shared/data/<name>`` is there."""
    return pytest.mark.skipif(not (SHARED_DATA / name).is_file(), reason=f"{REASON} ({name})")
