"""Where a run's answers go: a Parquet file, a Redis hash per user, or a SQL table.

Every answer written here was stored in the ledger first (its release is durable), so a sink
that fails loses nothing: a rerun with the same run id replays the stored releases for free and
writes them again. Writes are idempotent per (run, user): the Parquet file is written whole
under a temporary name (mode 0600; removed on any exit, or by the next run with the same run id
after a driver was killed) and renamed at the end, a Redis hash and a table row are overwritten.

``--out`` forms:

* ``FILE.parquet`` or ``parquet:FILE`` - one row per user (pyarrow);
* ``redis://HOST:PORT/DB?prefix=ppr:recs:&ttl=SECONDS`` (also ``rediss://``, ``unix://``) -
  a hash per user under ``<prefix><user>`` (default prefix ``ppr:recs:``; no TTL by default);
* ``postgresql+psycopg://USER@HOST/DB?table=NAME`` (or ``sqlite:///FILE?table=NAME``) - rows
  upserted by (run_id, user) into table NAME (default ``ppr_recommendations``), created if
  missing.

A run with ``--output embeddings`` writes each user's DP-IE embedding instead of a ranking,
with the release's metadata on every row (graph version, hash salt, epsilon, mode, sigma, k,
grid): Parquet column ``embedding`` of type ``fixed_size_list<double>[k]``; Redis field
``embedding``, a JSON array, under the default prefix ``ppr:emb:``; SQL column ``embedding``,
``float8[]`` on PostgreSQL (a JSON array on SQLite), in the default table ``ppr_embeddings``.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from service.atomic_files import replace_durably
from service.batch.spec import SeedOutcome
from service.errors import InvalidParameter, ServiceError

DEFAULT_REDIS_PREFIX = "ppr:recs:"
DEFAULT_TABLE = "ppr_recommendations"
#: ``--output embeddings``: where embeddings go unless the URL names a prefix or table.
EMBEDDING_REDIS_PREFIX = "ppr:emb:"
EMBEDDING_TABLE = "ppr_embeddings"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_SQL_SCHEMES = ("postgresql", "postgresql+psycopg", "postgresql+psycopg2", "sqlite")
_REDIS_SCHEMES = ("redis", "rediss", "unix")
SINK_EXAMPLES = (
    "recs.parquet, redis://127.0.0.1:6379/0 or postgresql+psycopg://USER@HOST/DB?table=NAME"
)


class SinkUnavailable(ServiceError):
    """The sink named by --out cannot be opened or written."""

    code = "sink_unavailable"
    status = 503
    exit_code = 2


@dataclass(frozen=True)
class RunInfo:
    """What every written answer is labelled with."""

    run_id: str
    graph_version: str
    mode: str
    epsilon: float
    k: int
    output: str = "rankings"  # or "embeddings" (DP-IE, dimension k)
    sigma: float = 0.0  # embeddings: PushFlowCap's sigma

    @property
    def embeddings(self) -> bool:
        return self.output == "embeddings"


class Sink(Protocol):
    description: str

    def write(self, outcomes: Sequence[SeedOutcome]) -> None: ...

    def close(self) -> None:
        """Make everything written durable (and visible, for the Parquet file)."""

    def abort(self) -> None:
        """Give up: release resources (a Parquet file is not made visible)."""


def _results_json(outcome: SeedOutcome) -> str:
    return json.dumps(
        [{"node": node, "score": score} for node, score in outcome.results],
        separators=(",", ":"),
        allow_nan=False,
    )


def _embedding_labels(info: RunInfo, outcome: SeedOutcome) -> dict[str, Any]:
    """What an embedding row carries beside the vector (the run's labels are added apart)."""
    return {
        "mechanism": "dp_instant_embedding",
        "sigma": info.sigma,
        "hash_salt": outcome.hash_salt,
        "score_grid": outcome.score_grid,
    }


# -- Parquet ---------------------------------------------------------------------------------------


class ParquetSink:
    """One Parquet file, written whole under a temporary name beside it and renamed at the end.

    The temporary file ``.<name>.<run id>.<pid>.tmp`` is created readable and writable by its
    owner only (mode 0600: it holds users' recommendations), and so is the final file (the same
    file, renamed). It is removed on every exit the driver sees (an error, Ctrl-C, SIGTERM,
    SIGHUP); a driver killed outright (SIGKILL, a lost machine) cannot remove it, so the next
    run with the same run id finds it and removes it. The writer holds an exclusive ``flock``
    on it while it writes: a temporary file whose lock can be taken belongs to a dead driver.
    """

    def __init__(self, path: Path, info: RunInfo) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.path = path
        self.description = f"Parquet file {path}"
        self.info = info
        if not path.parent.is_dir():
            raise SinkUnavailable(f"--out: the directory {str(path.parent)!r} does not exist")
        remove_stale_outputs(path, info.run_id)
        self._tmp = path.with_name(f"{_tmp_prefix(path, info.run_id)}{os.getpid()}.tmp")
        self._pa = pa
        if info.embeddings:
            answer = ("embedding", pa.list_(pa.float64(), info.k))  # fixed_size_list<double>[k]
        else:
            answer = (
                "recommendations",
                pa.list_(pa.struct([("node", pa.string()), ("score", pa.float64())])),
            )
        labels = [
            ("run_id", pa.string()),
            ("graph_version", pa.string()),
            ("mode", pa.string()),
            ("epsilon", pa.float64()),
        ]
        if info.embeddings:
            labels += [
                ("k", pa.int32()),
                ("mechanism", pa.string()),
                ("sigma", pa.float64()),
                ("hash_salt", pa.string()),
                ("score_grid", pa.float64()),
            ]
        self._schema = pa.schema([("user", pa.string()), answer, *labels])
        try:
            self._file = _create_private(self._tmp)
        except OSError as exc:
            raise SinkUnavailable(f"--out: cannot write {str(path)!r}: {exc}") from exc
        try:
            self._writer = pq.ParquetWriter(self._file, self._schema, compression="zstd")
        except BaseException:
            self._discard()
            raise

    def write(self, outcomes: Sequence[SeedOutcome]) -> None:
        if not outcomes:
            return
        info, n = self.info, len(outcomes)
        columns: dict[str, list[Any]] = {"user": [o.node for o in outcomes]}
        if info.embeddings:
            columns["embedding"] = [list(o.embedding) for o in outcomes]
        else:
            columns["recommendations"] = [
                [{"node": node, "score": score} for node, score in o.results] for o in outcomes
            ]
        columns["run_id"] = [info.run_id] * n
        columns["graph_version"] = [info.graph_version] * n
        columns["mode"] = [info.mode] * n
        columns["epsilon"] = [info.epsilon] * n
        if info.embeddings:
            columns["k"] = [info.k] * n
            labels = [_embedding_labels(info, o) for o in outcomes]
            for name in ("mechanism", "sigma", "hash_salt", "score_grid"):
                columns[name] = [row[name] for row in labels]
        self._writer.write_table(self._pa.table(columns, schema=self._schema))

    def close(self) -> None:
        try:
            self._writer.close()
            # fsync, rename, fsync of the directory; still locked: no other run removes it
            replace_durably(self._tmp, self.path, file=self._file)
        except BaseException:
            self._discard()
            raise
        self._file.close()

    def abort(self) -> None:
        try:
            self._writer.close()
        finally:
            self._discard()

    def _discard(self) -> None:
        self._tmp.unlink(missing_ok=True)
        self._file.close()


def _tmp_prefix(path: Path, run_id: str) -> str:
    return f".{path.name}.{run_id}."


def _create_private(path: Path) -> BinaryIO:
    """Create ``path`` (mode 0600, never through a symlink), locked for as long as it is open."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise


def remove_stale_outputs(path: Path, run_id: str) -> list[Path]:
    """Remove the temporary files that killed drivers of run ``run_id`` left beside ``path``
    (those whose lock can be taken: their writer is gone); return what was removed."""
    prefix = _tmp_prefix(path, run_id)
    removed: list[Path] = []
    try:
        names = os.listdir(path.parent)
    except OSError:
        return removed
    for name in names:
        rest = name[len(prefix) : -len(".tmp")]
        if not (name.startswith(prefix) and name.endswith(".tmp") and rest.isdigit()):
            continue
        candidate = path.parent / name
        try:
            fd = os.open(candidate, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue  # a live driver of this run id is writing it
        try:
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
        finally:
            os.close(fd)
    return removed


# -- Redis -----------------------------------------------------------------------------------------


class RedisSink:
    def __init__(self, url: str, info: RunInfo) -> None:
        import redis

        parts = urlsplit(url)
        query = dict(parse_qsl(parts.query))
        default_prefix = EMBEDDING_REDIS_PREFIX if info.embeddings else DEFAULT_REDIS_PREFIX
        self.prefix = query.pop("prefix", default_prefix)
        ttl = query.pop("ttl", None)
        try:
            self.ttl = None if ttl is None else int(ttl)
        except ValueError:
            raise InvalidParameter("--out", f"ttl must be whole seconds, got {ttl!r}") from None
        if self.ttl is not None and self.ttl <= 0:
            raise InvalidParameter("--out", f"ttl must be > 0 seconds, got {ttl!r}")
        clean = urlunsplit(parts._replace(query=urlencode(query)))
        self.description = f"Redis hashes {self.prefix}<user> at {parts.hostname or parts.path}"
        self.info = info
        try:
            self._client = redis.Redis.from_url(clean, socket_timeout=10)
            self._client.ping()
        except (redis.RedisError, ValueError) as exc:
            where = f"{parts.hostname}:{parts.port or 6379}" if parts.hostname else parts.path
            raise SinkUnavailable(f"--out: cannot reach Redis at {where}: {exc}") from exc
        self._error = redis.RedisError

    def write(self, outcomes: Sequence[SeedOutcome]) -> None:
        info = self.info
        now = datetime.now(UTC).isoformat()
        pipe = self._client.pipeline(transaction=False)
        for outcome in outcomes:
            key = f"{self.prefix}{outcome.node}"
            fields: dict[Any, Any] = {}
            if info.embeddings:
                vector = json.dumps(list(outcome.embedding), allow_nan=False)
                labels = _embedding_labels(info, outcome)
                fields["embedding"] = vector
                fields.update({name: _redis_text(value) for name, value in labels.items()})
            else:
                fields["results"] = _results_json(outcome)
            fields |= {
                "run_id": info.run_id,
                "graph_version": info.graph_version,
                "mode": info.mode,
                "epsilon": repr(info.epsilon),
                "k": str(info.k),
                "written_at": now,
            }
            pipe.delete(key)  # a user's hash holds one run's answer, never a mix
            pipe.hset(key, mapping=fields)
            if self.ttl is not None:
                pipe.expire(key, self.ttl)
        try:
            pipe.execute()
        except self._error as exc:
            raise SinkUnavailable(f"writing to Redis failed: {exc}") from exc

    def close(self) -> None:
        self._client.close()

    def abort(self) -> None:
        self._client.close()


def _redis_text(value: object) -> str:
    """A label as a Redis field: floats exactly (repr), None as the empty string."""
    if value is None:
        return ""
    return repr(value) if isinstance(value, float) else str(value)


# -- SQL (PostgreSQL; SQLite too) ------------------------------------------------------------------


class SqlSink:
    def __init__(self, url: str, info: RunInfo) -> None:
        from sqlalchemy import (
            ARRAY,
            JSON,
            Column,
            DateTime,
            Double,
            Integer,
            MetaData,
            String,
            Table,
            create_engine,
            make_url,
        )
        from sqlalchemy.exc import SQLAlchemyError

        parsed = make_url(url)
        query = dict(parsed.query)
        default_table = EMBEDDING_TABLE if info.embeddings else DEFAULT_TABLE
        table_name = str(query.pop("table", default_table))
        if not _IDENTIFIER.fullmatch(table_name):
            raise InvalidParameter(
                "--out", f"table must be a plain SQL identifier, got {table_name!r}"
            )
        parsed = parsed.set(query=query)
        self.info = info
        self.description = f"table {table_name} in {parsed.render_as_string(hide_password=True)}"
        self.table = Table(
            table_name,
            MetaData(),
            Column("run_id", String(64), primary_key=True),
            Column("user_node", String, primary_key=True),
            Column("graph_version", String(64), nullable=False),
            Column("mode", String(16), nullable=False),
            Column("epsilon", Double, nullable=False),
            Column("k", Integer, nullable=False),
            *(
                [
                    Column("mechanism", String(64), nullable=False),
                    Column("sigma", Double, nullable=False),
                    Column("hash_salt", String(64), nullable=False),
                    Column("score_grid", Double, nullable=True),
                    # float8[] on PostgreSQL; SQLite has no arrays: a JSON array there
                    Column("embedding", ARRAY(Double).with_variant(JSON, "sqlite"), nullable=False),
                ]
                if info.embeddings
                else [Column("results", JSON, nullable=False)]
            ),
            Column("written_at", DateTime(timezone=True), nullable=False),
        )
        self._error = SQLAlchemyError
        try:
            self.engine = create_engine(parsed, pool_pre_ping=True)
            self.table.metadata.create_all(self.engine, checkfirst=True)
        except SQLAlchemyError as exc:
            where = parsed.render_as_string(hide_password=True)
            raise SinkUnavailable(f"--out: cannot use the database {where}: {exc.args[0]}") from exc
        if self.engine.dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as pg_insert

            self._insert: Any = pg_insert
        else:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            self._insert = sqlite_insert

    def write(self, outcomes: Sequence[SeedOutcome]) -> None:
        if not outcomes:
            return
        info = self.info
        now = datetime.now(UTC)
        rows = [
            {
                "run_id": info.run_id,
                "user_node": o.node,
                "graph_version": info.graph_version,
                "mode": info.mode,
                "epsilon": info.epsilon,
                "k": info.k,
                **(
                    {**_embedding_labels(info, o), "embedding": list(o.embedding)}
                    if info.embeddings
                    else {"results": [{"node": node, "score": score} for node, score in o.results]}
                ),
                "written_at": now,
            }
            for o in outcomes
        ]
        stmt = self._insert(self.table)
        keys = ("run_id", "user_node")
        stmt = stmt.on_conflict_do_update(
            index_elements=list(keys),
            set_={c.name: stmt.excluded[c.name] for c in self.table.columns if c.name not in keys},
        )
        try:
            with self.engine.begin() as conn:
                conn.execute(stmt, rows)
        except self._error as exc:
            raise SinkUnavailable(f"writing to {self.description} failed: {exc}") from exc

    def close(self) -> None:
        self.engine.dispose()

    def abort(self) -> None:
        self.engine.dispose()


def open_sink(target: str, info: RunInfo) -> Sink:
    """The sink ``target`` names (see the module docstring); nothing is charged before this."""
    if target.startswith("parquet:"):
        return ParquetSink(Path(target.removeprefix("parquet:")).expanduser().resolve(), info)
    scheme = urlsplit(target).scheme.lower() if "://" in target else ""
    if scheme in _REDIS_SCHEMES:
        return RedisSink(target, info)
    if scheme in _SQL_SCHEMES:
        from service.urls import check_database_url

        try:
            check_database_url(target)
        except ValueError as exc:
            raise InvalidParameter("--out", str(exc)) from None
        return SqlSink(target, info)
    if scheme:
        raise InvalidParameter(
            "--out", f"unsupported sink {scheme + '://'!r}; expected {SINK_EXAMPLES}"
        )
    if target.endswith(".parquet"):
        return ParquetSink(Path(target).expanduser().resolve(), info)
    raise InvalidParameter("--out", f"not a sink: {target!r}; expected {SINK_EXAMPLES}")
