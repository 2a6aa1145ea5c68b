"""A throw-away PostgreSQL cluster (own data directory and port) that a test may stop and
start at will; the shared server at 127.0.0.1:5432 is never touched."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

_ROOT = Path("/usr/lib/postgresql")


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, or None."""
    if not _ROOT.is_dir():
        return None
    versions = sorted(os.listdir(_ROOT))
    found = _ROOT / versions[-1] / "bin" if versions else None
    return found if found is not None and (found / "initdb").exists() else None


def can_run() -> bool:
    """Whether this machine can start a private cluster (binaries, and root to run them as
    the postgres user)."""
    return postgres_bin() is not None and os.geteuid() == 0 and shutil.which("runuser") is not None


class OwnPostgres:
    def __init__(self, port: int) -> None:
        bin_dir = postgres_bin()
        assert bin_dir is not None
        self.bin = bin_dir
        self.port = port
        self.dir = Path(tempfile.mkdtemp(prefix="ppr-test-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        self.log = self.dir / "pg.log"

    def _as_postgres(self, *args: str) -> None:
        subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True,
                       capture_output=True, text=True, timeout=120)  # fmt: skip

    def init(self) -> None:
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres",
                          "--auth", "trust")  # fmt: skip
        self.start()

    def start(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.log),
                          "-o", f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
                          "-w", "start")  # fmt: skip

    def stop(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w",
                          "stop")  # fmt: skip

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        from sqlalchemy import create_engine

        admin = create_engine(self.url(), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        finally:
            admin.dispose()
        return self.url(name)
