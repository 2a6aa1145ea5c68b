"""The salt of each graph version's embedding hash functions, recorded once per version."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress

from sqlalchemy.exc import IntegrityError

from service.ledger.tables import EmbeddingSalt
from service.ledger.transactions import LedgerPart


class EmbeddingSalts(LedgerPart):
    """Insert-if-absent, then read back: the salt the database kept is everyone's salt."""

    def embedding_salt(self, graph_version: str, draw: Callable[[], bytes]) -> bytes:
        """The salt recorded for ``graph_version`` (its public id), else ``draw()`` recorded
        now. Workers that embed on a new version at once race to insert; each reads back the
        row the database kept, so all of them hash alike."""
        with self._reading() as session:
            row = session.get(EmbeddingSalt, graph_version)
            if row is not None:
                return bytes.fromhex(row.salt)
        fresh = EmbeddingSalt(graph_version=graph_version, salt=draw().hex())
        with suppress(IntegrityError), self._writing() as session:  # lost a race: read theirs
            session.add(fresh)
        with self._reading() as session:
            row = session.get(EmbeddingSalt, graph_version)
            if row is None:  # pragma: no cover - the insert above committed or lost a race
                raise RuntimeError("embedding salt not recorded")
            return bytes.fromhex(row.salt)
