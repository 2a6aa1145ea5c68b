"""The graph version every worker and replica serves, and the public ids of graph versions."""

from __future__ import annotations

import secrets
from contextlib import suppress

from sqlalchemy.exc import IntegrityError

from service.ledger.tables import (
    META_CURRENT_GRAPH_CONFIGURATION,
    META_CURRENT_GRAPH_PATH,
    META_CURRENT_GRAPH_VERSION,
    GraphVersion,
    LedgerMeta,
)
from service.ledger.transactions import LedgerPart


def new_public_graph_id() -> str:
    """A fresh public graph id: 80 random bits from the OS entropy source, as 20 hex digits
    (the shape of the ids recorded before graph ids were random)."""
    return secrets.token_hex(10)


class GraphVersions(LedgerPart):
    """The served graph version (in ``ledger_meta``) and the public id of each graph fingerprint."""

    def current_graph_version(self) -> str | None:
        """The graph version the service should serve (set by a load or reload), if any."""
        with self._reading() as session:
            row = session.get(LedgerMeta, META_CURRENT_GRAPH_VERSION)
            return None if row is None else row.value

    def current_graph_path(self) -> str | None:
        """The file the recorded graph version was loaded from (None: each worker's own
        configured location, e.g. the demo graph)."""
        with self._reading() as session:
            row = session.get(LedgerMeta, META_CURRENT_GRAPH_PATH)
            return None if row is None or not row.value else row.value

    def current_graph_configuration(self) -> str | None:
        """The configured graph location (PPR_GRAPH_PATH, "" for the demo graph) of the
        deployment that recorded the current version."""
        with self._reading() as session:
            row = session.get(LedgerMeta, META_CURRENT_GRAPH_CONFIGURATION)
            return None if row is None else row.value

    def set_current_graph_version(
        self, version: str, path: str | None = None, configured: str | None = None
    ) -> None:
        """Record ``version`` (loaded from ``path``, by a deployment configured with
        ``configured``) as the one to serve: every worker follows it (GraphHolder).

        Workers that start together may both find no row and insert it: the loser of that
        race retries once, and then updates the row the other inserted."""
        for attempt in (1, 2):
            try:
                with self._writing() as session:
                    for key, value in (
                        (META_CURRENT_GRAPH_VERSION, version),
                        (META_CURRENT_GRAPH_PATH, path or ""),
                        (META_CURRENT_GRAPH_CONFIGURATION, configured or ""),
                    ):
                        row = session.get(LedgerMeta, key)
                        if row is None:
                            session.add(LedgerMeta(key=key, value=value))
                        elif row.value != value:
                            row.value = value
                return
            except IntegrityError:
                if attempt == 2:
                    raise

    def public_graph_version(self, fingerprint: str) -> str:
        """The public id of the graph whose content fingerprint is ``fingerprint``: the one
        recorded, else a new random one, recorded now (insert-if-absent, then read back, so
        that workers loading the same graph at once agree on the id the database kept)."""
        with self._reading() as session:
            row = session.get(GraphVersion, fingerprint)
            if row is not None:
                return row.public_id
        fresh = GraphVersion(fingerprint=fingerprint, public_id=new_public_graph_id())
        # another worker may insert it first (IntegrityError): then read theirs
        with suppress(IntegrityError), self._writing() as session:
            session.add(fresh)
        with self._reading() as session:
            row = session.get(GraphVersion, fingerprint)
            if row is None:  # pragma: no cover - the insert above committed or lost a race
                raise RuntimeError("graph version not recorded")
            return row.public_id
