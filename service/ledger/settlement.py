"""Settling a charge exactly once: its release stored, or refunded; and reconciling the stale."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from service.errors import InvalidParameter
from service.ledger.graph_releases import GraphReleases
from service.ledger.id_lists import one_of
from service.ledger.idempotency import free_bindings
from service.ledger.ledger_rows import (
    budget_view,
    release_values,
    remove_from_shard,
    set_spend,
)
from service.ledger.locked_rows import (
    CHARGES,
    RELEASE_COLUMNS,
    RELEASES,
    STORE_RELEASE_SETTLED,
    charge_last_sign,
    settle,
)
from service.ledger.quota_buckets import add_to_buckets
from service.ledger.records import (
    BudgetView,
    ChargeSettled,
    StoredRelease,
)
from service.ledger.release_rows import STORE_RELEASES_SETTLED, release_columns
from service.ledger.synthesis_jobs import SynthesisJobs
from service.ledger.tables import (
    Charge,
    Refund,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
    UnknownCharge,
)
from service.privacy.accountant import RdpCurve


class Settlement(LedgerPart):
    """Moves a charge ``admitted -> released`` (its release stored) or ``admitted -> refunded``."""

    def __init__(
        self,
        transactions: LedgerTransactions,
        graph_releases: GraphReleases,
        synthesis: SynthesisJobs,
    ) -> None:
        super().__init__(transactions)
        self._graph_releases = graph_releases
        self._synthesis = synthesis

    def refund(
        self, charge_id: int, *, reason: str, actor_account_id: int | None = None
    ) -> BudgetView:
        """Compensate a charge whose noise was provably never released (idempotent).

        Only an ``admitted`` charge can be refunded; refunding a released one raises
        :class:`ChargeSettled` (its answer may have left the process).
        """
        with self._writing() as session:
            charge = session.get(Charge, charge_id)
            if charge is None:
                raise UnknownCharge(
                    f"charge {charge_id} does not exist", details={"charge_id": charge_id}
                )
            account_id = charge.charged_account_id
            spend = self._lock_spend(session, account_id)
            budget = self._budget_row(session, account_id)
            session.refresh(charge)
            if charge.state == "refunded":
                return budget_view(budget, spend)
            if charge.state == "released":
                raise ChargeSettled(
                    f"charge {charge_id} was released: it cannot be refunded",
                    details={"charge_id": charge_id},
                )
            view = self._refund_in(session, charge, reason=reason, actor=actor_account_id)
            assert view is not None  # no stale_before: an admitted charge always moves
            return view

    def _refund_in(
        self,
        session: Session,
        charge: Charge,
        *,
        reason: str,
        actor: int | None,
        stale_before: datetime | None = None,
    ) -> BudgetView | None:
        """Refund an admitted charge inside a transaction that holds its account's spend lock.

        The state moves ``admitted -> refunded`` only if still admitted (so a concurrent
        release and a refund can never both win); the spend is recomputed as the left fold of
        the live charges, and the charge's curve leaves its exposure shard (rounded up). With
        ``stale_before`` (a reconciler), only if the charge's last sign of life is older than
        that; None if it is not (its process is still working on it: nothing changes).
        """
        account_id = charge.charged_account_id
        now = utcnow()
        moved = settle(session, charge.id, "refunded", now, stale_before=stale_before)
        spend = self._lock_spend(session, account_id)
        budget = self._budget_row(session, account_id)
        if moved != 1:
            session.refresh(charge)
            if charge.state == "released":
                raise ChargeSettled(
                    f"charge {charge.id} was released: it cannot be refunded",
                    details={"charge_id": charge.id},
                )
            if charge.state == "admitted":  # it beat since stale_before: alive
                return None
            return budget_view(budget, spend)
        session.add(Refund(charge_id=charge.id, created_at=now, reason=reason))
        free_bindings(session, charge.id, now)  # nothing was released under those keys
        curves: list[dict[str, Any]] = list(
            session.scalars(
                select(Charge.rdp)
                .where(Charge.charged_account_id == account_id, Charge.state != "refunded")
                .order_by(Charge.id)
            )
        )
        total = RdpCurve.zero()
        for data in curves:
            total = total + RdpCurve.from_json(data)
        set_spend(spend, budget, total, len(curves))
        shard = self._lock_shard(session, charge.exposure_shard)
        remove_from_shard(shard, RdpCurve.from_json(charge.rdp))
        add_to_buckets(
            session,
            [(charge.principal_account_id, account_id, charge.created_at, charge.epsilon)],
            sign=-1,
        )  # out of its principal's quota window (the last lock taken)
        self._audit(
            session,
            "charge.refund",
            actor=actor,
            target=account_id,
            details={"charge_id": charge.id, "reason": reason, "epsilon": charge.epsilon},
        )
        session.flush()
        return budget_view(budget, spend, total)

    def store_release(
        self,
        release: StoredRelease,
        *,
        idempotency_key: str | None,
        principal_account_id: int,
    ) -> None:
        """Store a released answer and mark its charge ``released``, in one transaction.

        This must commit before the answer leaves the process. Storing the same charge twice is
        a no-op; a charge already refunded (e.g. reconciled) raises :class:`ChargeSettled`, and
        the answer must then be discarded, never sent.
        """
        if not self._transactions.sqlite:
            self._store_in_one_statement(release, idempotency_key, principal_account_id)
            return
        with self._writing() as session:
            now = utcnow()
            moved = settle(session, release.charge_id, "released", now)
            if moved != 1:
                _settled_before(session, release.charge_id)
                return
            session.execute(
                insert(RELEASES),
                [release_values(release, idempotency_key, principal_account_id, now)],
            )

    def _store_in_one_statement(
        self, release: StoredRelease, idempotency_key: str | None, principal_account_id: int
    ) -> None:
        """:meth:`store_release` on PostgreSQL: the charge moved and the release inserted by
        one statement that commits on its own (:data:`STORE_RELEASE_SETTLED`), one round trip."""
        now = utcnow()
        values = release_values(release, idempotency_key, principal_account_id, now)
        params = {"s_charge_id": release.charge_id, "s_now": now}
        params.update((f"r_{name}", values[name]) for name in RELEASE_COLUMNS)
        with self._transactions.one_statement() as session:
            if session.scalar(STORE_RELEASE_SETTLED, params) is None:
                _settled_before(session, release.charge_id)

    def store_releases(
        self, releases: Sequence[tuple[StoredRelease, str | None, int]]
    ) -> list[ChargeSettled | None]:
        """Store many released answers, each with its idempotency key and principal, and mark
        their charges ``released``, in ONE transaction (on PostgreSQL one statement committed
        on its own): per release None (stored, or stored before) or :class:`ChargeSettled`
        (its charge was refunded: discard that answer).

        As :meth:`store_release` for each, and it must commit before any of them is answered.
        """
        if not releases:
            return []
        if not self._transactions.sqlite:
            return self._store_many_in_one_statement(releases)
        ids = [release.charge_id for release, _, _ in releases]
        with self._writing() as session:
            now = utcnow()
            moved = set(
                session.scalars(
                    update(CHARGES)
                    .where(one_of(session, CHARGES.c.id, ids), CHARGES.c.state == "admitted")
                    .values(state="released", settled_at=now)
                    .returning(CHARGES.c.id)
                )
            )
            states = _states(session, [charge_id for charge_id in ids if charge_id not in moved])
            outcomes: list[ChargeSettled | None] = []
            stored: set[int] = set()
            new_rows: list[dict[str, Any]] = []
            for release, idempotency_key, principal in releases:
                if release.charge_id in stored:  # listed twice: stored once, by the first
                    outcomes.append(None)
                    continue
                if release.charge_id not in moved:
                    outcomes.append(_outcome(release.charge_id, moved, states))
                    continue
                stored.add(release.charge_id)
                new_rows.append(release_values(release, idempotency_key, principal, now))
                outcomes.append(None)
            if new_rows:  # one multi-row INSERT, through Core: no ORM object per release
                session.execute(insert(RELEASES), new_rows)
        return outcomes

    def _store_many_in_one_statement(
        self, releases: Sequence[tuple[StoredRelease, str | None, int]]
    ) -> list[ChargeSettled | None]:
        """:meth:`store_releases` on PostgreSQL: every charge moved and every release inserted
        by one statement that commits on its own (:data:`STORE_RELEASES_SETTLED`); the states
        of the charges it did not move are read after it (stored before, or refunded)."""
        first: dict[int, tuple[StoredRelease, str | None, int]] = {}
        for item in releases:  # a charge listed twice: stored once, by its first release
            first.setdefault(item[0].charge_id, item)
        params = release_columns(list(first.values()), utcnow())
        with self._transactions.one_statement() as session:
            stored = session.connection().exec_driver_sql(STORE_RELEASES_SETTLED, params)
            moved: set[int] = {int(row[0]) for row in stored}
            states = _states(session, [charge_id for charge_id in first if charge_id not in moved])
        return [_outcome(release.charge_id, moved, states) for release, _, _ in releases]

    def charge_state(self, charge_id: int) -> str:
        with self._reading() as session:
            state = session.scalar(select(Charge.state).where(Charge.id == charge_id))
        if state is None:
            raise UnknownCharge(
                f"charge {charge_id} does not exist", details={"charge_id": charge_id}
            )
        return str(state)

    def beat_charges(self, charge_ids: Collection[int]) -> set[int]:
        """Refresh the heartbeat of those of ``charge_ids`` that are still ``admitted`` (the
        process answering them is alive and working on them); the ids still admitted. A charge
        missing from the answer was settled: released, or refunded by a reconciler after its
        heartbeat lapsed (its answer must then be discarded, which storing it does)."""
        ids = sorted(set(charge_ids))
        alive: set[int] = set()
        if not ids:
            return alive
        with self._writing() as session:
            now = utcnow()
            for start in range(0, len(ids), 500):
                alive.update(
                    session.scalars(
                        update(CHARGES)
                        .where(
                            CHARGES.c.id.in_(ids[start : start + 500]),
                            CHARGES.c.state == "admitted",
                        )
                        .values(heartbeat_at=now)
                        .returning(CHARGES.c.id)
                    )
                )
        return alive

    def reconcile(
        self, *, older_than_seconds: float, actor_account_id: int | None = None
    ) -> list[int]:
        """Refund every charge still ``admitted`` (no release stored) whose last sign of life
        (its heartbeat, else its admission) is older than the limit, with an audit row each,
        and settle graph-wide releases left without a payload.

        Sound because an answer leaves the process only after its release is stored, and a
        release can no longer be stored once its charge is refunded. A process still working
        on a charge refreshes its heartbeat (:meth:`beat_charges`), so the database, not any
        process's memory, tells a live charge from one whose process died: each refund is a
        conditional UPDATE that loses to a heartbeat or a release committed before it. Returns
        the refunded ids.
        """
        if not (math.isfinite(older_than_seconds) and older_than_seconds >= 0):
            raise InvalidParameter("older_than", f"must be >= 0 seconds, got {older_than_seconds}")
        cutoff = utcnow() - timedelta(seconds=older_than_seconds)
        with self._reading() as session:
            ids: list[int] = list(
                session.scalars(
                    select(CHARGES.c.id)
                    .where(
                        CHARGES.c.state == "admitted",
                        CHARGES.c.created_at < cutoff,
                        charge_last_sign < cutoff,
                    )
                    .order_by(CHARGES.c.id)
                )
            )
        reason = f"reconciled: no release stored within {older_than_seconds:g} s"
        refunded = [
            charge_id
            for charge_id in ids
            if self.refund_if_stale(charge_id, cutoff, reason=reason, actor=actor_account_id)
        ]
        # synthesis jobs first: a dead job's release is refunded with the job marked failed
        self._synthesis.reconcile_synthesis(cutoff)
        self._graph_releases.reconcile_graph_releases(cutoff)
        return refunded

    def refund_if_stale(
        self, charge_id: int, stale_before: datetime, *, reason: str, actor: int | None = None
    ) -> bool:
        """Refund charge ``charge_id`` in a transaction of its own if it is still ``admitted``
        and its last sign of life is older than ``stale_before``; whether it was refunded.
        A charge released, refunded or beating meanwhile is left as it is (never an error)."""
        try:
            with self._writing() as session:
                charge = session.get(Charge, charge_id)
                if charge is None:
                    return False
                self._lock_spend(session, charge.charged_account_id)
                session.refresh(charge)
                if charge.state != "admitted":
                    return False
                view = self._refund_in(
                    session, charge, reason=reason, actor=actor, stale_before=stale_before
                )
                return view is not None
        except ChargeSettled:  # released between the read and the refund: its answer won
            return False


def _settled_before(session: Session, charge_id: int) -> None:
    """A charge that did not move to ``released`` now: stored before (a no-op), or refunded or
    missing (:class:`ChargeSettled`: its answer is discarded, never sent)."""
    state = session.scalar(select(Charge.state).where(Charge.id == charge_id))
    if state == "released":
        return
    raise _discarded(charge_id, state)


def _states(session: Session, charge_ids: list[int]) -> dict[int, str]:
    """The states of charges a store of releases did not move (stored before, refunded or
    missing), in one read; nothing to read for none."""
    if not charge_ids:
        return {}
    rows = session.execute(
        select(CHARGES.c.id, CHARGES.c.state).where(one_of(session, CHARGES.c.id, charge_ids))
    )
    return {int(row.id): str(row.state) for row in rows}


def _outcome(charge_id: int, moved: set[int], states: dict[int, str]) -> ChargeSettled | None:
    """A release's outcome in a store of many: None when it is stored (its charge moved now,
    or released before), else the error that discards its answer."""
    if charge_id in moved:
        return None
    state = states.get(charge_id)
    return None if state == "released" else _discarded(charge_id, state)


def _discarded(charge_id: int, state: str | None) -> ChargeSettled:
    """The error of a release whose charge was not ``admitted`` when it was to be stored (and
    not released before): refunded or missing, its answer is discarded, never sent."""
    return ChargeSettled(
        f"charge {charge_id} is {state or 'missing'}: its answer is discarded",
        details={"charge_id": charge_id, "state": state},
    )
