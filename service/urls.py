"""Checks of the service's connection URLs (ledger database, Redis), before anything connects.

Each check returns the URL unchanged or raises ``ValueError`` with one line saying what to
write instead; the CLI turns that into an error naming the flag, the settings into one naming
the ``PPR_*`` variable.
"""

from __future__ import annotations

#: Database backends the ledger runs on (its migrations and locking are written for these).
DATABASE_BACKENDS = ("sqlite", "postgresql")
DATABASE_EXAMPLES = "sqlite:///./ppr-ledger.db or postgresql+psycopg://USER@HOST:5432/DB"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def check_database_url(url: str) -> str:
    """``url`` if it names a SQLite or PostgreSQL database whose driver is installed."""
    # SQLAlchemy when a URL is checked, not when the module is imported: the command line's
    # argument types come from here, and most commands never open a database.
    from sqlalchemy import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ValueError(f"not a database URL: {url!r}; expected {DATABASE_EXAMPLES}") from None
    backend = parsed.get_backend_name()
    if backend == "postgres":
        raise ValueError(
            "write 'postgresql://' (or 'postgresql+psycopg://'), not 'postgres://'"
        ) from None
    if backend not in DATABASE_BACKENDS:
        raise ValueError(
            f"unsupported database {backend!r}: the ledger runs on SQLite or PostgreSQL "
            f"({DATABASE_EXAMPLES})"
        )
    try:
        parsed.get_dialect().import_dbapi()
    except (ImportError, NoSuchModuleError):
        driver = parsed.get_driver_name()
        raise ValueError(
            f"the database driver {driver!r} is not installed; use {DATABASE_EXAMPLES}"
        ) from None
    return url


def check_redis_url(url: str) -> str:
    """``url`` if it has a scheme the Redis client accepts."""
    if not url.startswith(REDIS_SCHEMES):
        raise ValueError(
            f"not a Redis URL: {url!r}; expected one starting with {', '.join(REDIS_SCHEMES)}"
        )
    return url
