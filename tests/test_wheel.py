"""The wheel, installed outside the repository, runs the ledger's migrations and serves.

The wheel is built from a copy of the files a release is built from (no checkout around it),
installed into a fresh virtual environment in a temporary directory (``--no-deps``: the
dependencies come from this environment's site-packages through a ``.pth`` line, so the test
stays quick and needs no network), and run from a directory with no ``migrations/`` in sight:
``db upgrade``, ``accounts create`` and one query over HTTP.

The installed copy runs its numba kernels as plain Python (``NUMBA_DISABLE_JIT``): compiled,
they would all be compiled again for the new path (about 8 CPU seconds); their compiled code is
tested in the checkout, and what this test checks is what the wheel carries.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.api_support import bearer, free_port, wait_until_ready

REPO = Path(__file__).resolve().parents[1]
#: What a release is built from (the sdist's contents).
RELEASE_FILES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "alembic.ini")
RELEASE_DIRS = ("service", "migrations")


def _run(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 180) -> str:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _build_wheel(tmp_path: Path) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    for name in RELEASE_FILES:
        shutil.copy2(REPO / name, source / name)
    for name in RELEASE_DIRS:
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
         "--outdir", str(out), str(source)],
        cwd=tmp_path, env=dict(os.environ),
    )  # fmt: skip
    (wheel,) = out.glob("dp_ppr_service-*.whl")
    return wheel


def _fresh_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()
    )  # fmt: skip
    # The dependencies, from this environment (appended after the venv's own site-packages, and
    # without running this environment's .pth files, so its editable checkout stays invisible).
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "--quiet", str(wheel)],
        cwd=tmp_path, env=dict(os.environ),
    )  # fmt: skip
    return python


@pytest.mark.slow
def test_the_wheel_migrates_creates_accounts_and_serves(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert "service/migrations/env.py" in names
    assert any(n.startswith("service/migrations/versions/0001_") for n in names)

    python = _fresh_venv(tmp_path, wheel)
    work = tmp_path / "elsewhere"  # no migrations/ here nor above
    work.mkdir()
    env = {
        key: value for key, value in os.environ.items()
        if not key.startswith("PPR_") and key not in ("PYTHONPATH", "PROMETHEUS_MULTIPROC_DIR")
    }  # fmt: skip
    env["PPR_DATABASE_URL"] = f"sqlite:///{work / 'ledger.db'}"
    env["NUMBA_DISABLE_JIT"] = "1"

    where = _run([str(python), "-c", "import service; print(service.__file__)"], cwd=work, env=env)
    assert Path(where.strip()).is_relative_to(tmp_path / "venv"), where

    _run([str(python), "-m", "service", "db", "upgrade"], cwd=work, env=env)
    _run([str(python), "-m", "service", "db", "check"], cwd=work, env=env)
    dp_ppr = python.parent / "dp-ppr"
    command = [str(dp_ppr), "accounts", "create", "--type", "user", "--node", "42", "--json"]
    created = json.loads(_run(command, cwd=work, env=env))
    key = created["api_key"]

    port = free_port()
    log_path = work / "serve.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [str(python), "-m", "service", "serve", "--port", str(port)],
            cwd=work, env={**env, "PPR_STEPS": "30"}, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_until_ready(server, base, log_path, seconds=120)
        answer = httpx.get(
            f"{base}/v1/ppr/42", params={"k": 5, "epsilon": 0.1}, headers=bearer(key), timeout=60
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["node"] == "42" and len(body["results"]) == 5
        # the default ranking (friends_of_friends): one charge, the query's
        assert body["mechanism"]["name"] == "friends_of_friends"
        assert body["budget"]["charges"] == 1
        # blended reads the degree release: its first answer on a version is two charges more,
        # the query's and the release's
        blended = httpx.get(
            f"{base}/v1/ppr/42", params={"k": 5, "epsilon": 0.1, "mechanism": "blended"},
            headers=bearer(key), timeout=60,
        )  # fmt: skip
        assert blended.status_code == 200, blended.text
        assert blended.json()["mechanism"]["name"] == "blended"
        assert blended.json()["budget"]["charges"] == 3
    finally:
        server.terminate()
        server.wait(timeout=30)
