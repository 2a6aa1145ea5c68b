"""Stored releases and the charges and releases an Idempotency-Key is bound to."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select, tuple_

from service.ledger.idempotency import (
    bound_charges,
    insert_unless_bound,
)
from service.ledger.ledger_rows import (
    charge_record,
    release_record,
)
from service.ledger.records import (
    ChargeRecord,
    ReleaseKey,
    StoredRelease,
)
from service.ledger.tables import (
    Charge,
    IdempotencyBinding,
    Release,
    utcnow,
)
from service.ledger.transactions import LedgerPart


class StoredReleases(LedgerPart):
    """Lookups of stored releases (by key, charge, Idempotency-Key) and key bindings of replays."""

    def find_release(self, key: ReleaseKey) -> StoredRelease | None:
        """The newest release for ``key`` (epsilon compared exactly)."""
        with self._reading() as session:
            row = self._release_row(session, key)
            return None if row is None else release_record(row)

    def release_for_charge(self, charge_id: int) -> StoredRelease | None:
        with self._reading() as session:
            row = session.get(Release, charge_id)
            return None if row is None else release_record(row)

    def release_for_idempotency_key(
        self, principal_account_id: int, idempotency_key: str
    ) -> StoredRelease | None:
        """The release the key is bound to, once stored (None: the key is free, or bound to a
        charge still in flight)."""
        stmt = (
            select(Release)
            .join(IdempotencyBinding, IdempotencyBinding.charge_id == Release.charge_id)
            .join(Charge, Charge.id == Release.charge_id)
            .where(
                IdempotencyBinding.principal_account_id == principal_account_id,
                IdempotencyBinding.idempotency_key == idempotency_key,
                IdempotencyBinding.freed_at.is_(None),
                Charge.state == "released",
            )
        )
        with self._reading() as session:
            row = session.scalars(stmt).one_or_none()
            return None if row is None else release_record(row)

    def bind_idempotency_keys(self, bindings: Sequence[tuple[int, str, int]]) -> list[int]:
        """Bind each ``(principal, idempotency key)`` to the released charge given, unless the
        key is bound already, in ONE transaction; per binding the charge the key is bound to
        after it: the one given, or the charge an earlier (or concurrent) request bound it to.

        For a keyed query answered from a stored release before admission: the release it
        returns must be the one the key is bound to. Only charges already ``released`` may be
        given (a stored release's), so the binding is permanent."""
        if not bindings:
            return []
        with self._writing() as session:
            now = utcnow()
            session.execute(
                insert_unless_bound(self._transactions.sqlite),
                [
                    {
                        "principal_account_id": principal, "idempotency_key": key,
                        "charge_id": charge_id, "kind": "replayed", "created_at": now,
                    }
                    for principal, key, charge_id in bindings
                ],
            )  # fmt: skip
            bound = bound_charges(session, {(p, k) for p, k, _ in bindings})
        return [bound[(principal, key)].id for principal, key, _ in bindings]

    def admitted_charges_for_keys(self, keys: list[tuple[int, str]]) -> list[ChargeRecord]:
        """The charges still ``admitted`` (no release stored) under any of the
        ``(principal_account_id, idempotency_key)`` pairs, oldest first.

        A batch job calls it for the seeds of a block whose previous attempt ended (its worker
        died, or the attempt failed): those charges can no longer be released by anyone, so
        they may be refunded.
        """
        if not keys:
            return []
        pairs = list(dict.fromkeys((int(p), str(k)) for p, k in keys))
        records: list[ChargeRecord] = []
        with self._reading() as session:
            for start in range(0, len(pairs), 500):
                chunk = pairs[start : start + 500]
                rows = session.scalars(
                    select(Charge)
                    .where(
                        tuple_(Charge.principal_account_id, Charge.idempotency_key).in_(chunk),
                        Charge.state == "admitted",
                    )
                    .order_by(Charge.id)
                )
                records.extend(charge_record(row, False) for row in rows)
        return records
