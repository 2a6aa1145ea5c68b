"""What the admissions of a group read of earlier charges and releases, read once per group.

Admitting one query reads, under its account's lock, up to four things: the charge its
Idempotency-Key is bound to, an identical query's charge still in flight (a
twin), an identical query's stored release, and (for an answer built on the degree release)
the account's charge for that release. A group admitted one query at a time would
make those reads per query, each after writing the group's charges so far so that they are
seen: up to four round trips per query while the account's row is locked. Here each is one
statement for the whole group, made after the group's locks are taken (so no charge of these
accounts can be added meanwhile), and the charges the group itself adds are kept here, so a
later query of the group finds an earlier one's exactly as a read after a write would.

A query admitted alone reads its twin and its key's newest release with one statement of the
same two lookups (:func:`twin_and_release`).

Charges of these accounts can still change state under us (a release is stored, a refund is
made), as they can between one query's reads and its commit: a twin that was released joins
as before, and one that was refunded is admitted again by the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, func, literal, select, union_all
from sqlalchemy.orm import Session

from service.ledger.idempotency import EarlierCharge, bound_charges
from service.ledger.locked_rows import NewCharge, charge_last_sign
from service.ledger.records import (
    Admission,
    BudgetView,
    ChargeReceipt,
    DegreeCharge,
    QuotaWindow,
    ReleaseKey,
)
from service.ledger.tables import DEGREE_RELEASE_CHARGE, Charge, Release, as_utc

CHARGES = cast(Table, Charge.__table__)
RELEASES = cast(Table, Release.__table__)

_TWINS = select(
    CHARGES.c.id,
    CHARGES.c.charged_account_id,
    CHARGES.c.release_key,
    charge_last_sign.label("last_sign"),
).where(
    CHARGES.c.charged_account_id.in_(bindparam("accounts", expanding=True)),
    CHARGES.c.release_key.in_(bindparam("digests", expanding=True)),
    CHARGES.c.state == "admitted",
)
_RELEASED = (
    select(
        RELEASES.c.charged_account_id,
        RELEASES.c.node,
        RELEASES.c.graph_version,
        RELEASES.c.mode,
        RELEASES.c.epsilon,
        RELEASES.c.mechanism_name,
        func.max(RELEASES.c.charge_id).label("charge_id"),
        func.max(RELEASES.c.created_at).label("released_at"),
    )
    .join(CHARGES, CHARGES.c.id == RELEASES.c.charge_id)
    .where(
        RELEASES.c.charged_account_id.in_(bindparam("accounts", expanding=True)),
        RELEASES.c.node.in_(bindparam("nodes", expanding=True)),
        CHARGES.c.state == "released",
    )
    .group_by(
        RELEASES.c.charged_account_id,
        RELEASES.c.node,
        RELEASES.c.graph_version,
        RELEASES.c.mode,
        RELEASES.c.epsilon,
        RELEASES.c.mechanism_name,
    )
)

#: The live degree-release charges of a group's accounts (``uq_charges_degree_release_live``
#: keeps one per account, version and epsilon); the exact triples are picked in Python.
_DEGREE_PAID = select(
    CHARGES.c.charged_account_id, CHARGES.c.graph_version, CHARGES.c.epsilon
).where(
    CHARGES.c.charged_account_id.in_(bindparam("accounts", expanding=True)),
    CHARGES.c.mechanism == DEGREE_RELEASE_CHARGE,
    CHARGES.c.graph_version.in_(bindparam("versions", expanding=True)),
    CHARGES.c.state != "refunded",
)

#: A lone admission's two lookups in one statement: the newest in-flight charge of an identical
#: query (``twin``: its id and last sign of life) and the newest stored release of the same key
#: (``released``: its charge and time), at most one row of each, only the columns used.
_TWIN_NEWEST = (
    select(
        literal("twin").label("kind"),
        CHARGES.c.id.label("charge_id"),
        charge_last_sign.label("at"),
    )
    .where(
        CHARGES.c.charged_account_id == bindparam("account"),
        CHARGES.c.release_key == bindparam("digest"),
        CHARGES.c.state == "admitted",
    )
    .order_by(CHARGES.c.id.desc())
    .limit(1)
    .subquery()
)
_RELEASED_NEWEST = (
    select(
        literal("released").label("kind"),
        RELEASES.c.charge_id.label("charge_id"),
        RELEASES.c.created_at.label("at"),
    )
    .join(CHARGES, CHARGES.c.id == RELEASES.c.charge_id)
    .where(
        RELEASES.c.charged_account_id == bindparam("key_account"),
        RELEASES.c.node == bindparam("node"),
        RELEASES.c.graph_version == bindparam("graph_version"),
        RELEASES.c.mode == bindparam("mode"),
        RELEASES.c.epsilon == bindparam("epsilon"),
        RELEASES.c.mechanism_name == bindparam("mechanism"),
        CHARGES.c.state == "released",
    )
    .order_by(RELEASES.c.charge_id.desc())
    .limit(1)
    .subquery()
)
_TWIN_OR_RELEASED = union_all(select(_TWIN_NEWEST), select(_RELEASED_NEWEST))


def twin_and_release(
    session: Session, account_id: int, digest: str, key: ReleaseKey
) -> tuple[EarlierCharge | None, tuple[int, datetime] | None]:
    """For one admission (under its account's lock): the newest in-flight charge of an
    identical query of ``account_id`` (release key ``digest``), and the charge and time of the
    newest stored release of ``key`` (epsilon compared exactly), in one statement."""
    twin: EarlierCharge | None = None
    released: tuple[int, datetime] | None = None
    params = {
        "account": account_id, "digest": digest, "key_account": key.account_id,
        "node": key.node, "graph_version": key.graph_version, "mode": key.mode,
        "epsilon": float(key.epsilon), "mechanism": key.mechanism,
    }  # fmt: skip
    for row in session.execute(_TWIN_OR_RELEASED, params):
        if row.kind == "twin":
            twin = EarlierCharge(int(row.charge_id), account_id, row.at)
        else:
            released = (int(row.charge_id), as_utc(row.at))
    return twin, released


@dataclass(frozen=True)
class ReceiptOfNewCharge:
    """A query of the group answered by a charge the group itself added: its id is known
    once the group's charges are written."""

    charge: NewCharge
    budget: BudgetView
    reused: bool = False
    joined: bool = False

    def receipt(self) -> ChargeReceipt:
        assert self.charge.id, "the group's charges are written before receipts are made"
        return ChargeReceipt(
            charge_id=self.charge.id, budget=self.budget, reused=self.reused, joined=self.joined
        )


class GroupReads:
    """The earlier charges and releases a group's admissions look for, and the group's own."""

    def __init__(
        self,
        twins: dict[tuple[int, str], EarlierCharge],
        released: dict[ReleaseKey, tuple[int, datetime]],  # charge and time of the newest
        by_key: dict[tuple[int, str], EarlierCharge],
        degree_paid: set[tuple[int, str, float]],
    ) -> None:
        self._twins = twins
        self._released = released
        self._by_key = by_key
        #: (account, graph version, epsilon) of the degree releases paid before the group.
        self._degree_paid = degree_paid
        self._new_twins: dict[tuple[int, str], NewCharge] = {}
        self._new_by_key: dict[tuple[int, str], NewCharge | EarlierCharge] = {}
        #: Each quota-checked principal's 24-hour window, read at its first check in the
        #: group and added to as the group charges under its lock.
        self.quota_windows: dict[int, QuotaWindow] = {}

    @classmethod
    def read(cls, session: Session, admissions: Iterable[Admission]) -> GroupReads:
        """Read, for the group, what its queries look for (call under the group's locks)."""
        digests: dict[int, set[str]] = {}
        keys: list[ReleaseKey] = []
        idempotency: set[tuple[int, str]] = set()
        degrees: set[tuple[int, str, float]] = set()
        for a in admissions:
            if a.degree is not None:
                degrees.add(a.degree.paid_key(a.charged_account_id))
            if a.release_key is not None:
                keys.append(a.release_key)
                digests.setdefault(a.charged_account_id, set()).add(a.release_key.digest())
            if a.idempotency_key is not None:
                idempotency.add((a.principal_account_id, a.idempotency_key))
        return cls(
            _read_twins(session, digests),
            _read_released(session, keys),
            _read_by_key(session, idempotency),
            _read_degree_paid(session, degrees),
        )

    def degree_paid(self, account_id: int, degree: DegreeCharge) -> bool:
        """Whether the account had a live charge for this degree release before the group
        (the group's own are on :attr:`AdmissionWrites.degree_paid`)."""
        return degree.paid_key(account_id) in self._degree_paid

    def new_twin(self, account_id: int, digest: str) -> NewCharge | None:
        """The newest charge of this group for an identical query (still in flight)."""
        return self._new_twins.get((account_id, digest))

    def twin(self, account_id: int, digest: str) -> EarlierCharge | None:
        """The newest in-flight charge made before this group for an identical query."""
        return self._twins.get((account_id, digest))

    def released(self, key: ReleaseKey, after: datetime | None = None) -> int | None:
        """The charge of the newest stored release of ``key`` (epsilon compared exactly), if
        it was made after ``after`` (None: whenever)."""
        found = self._released.get(key)
        if found is None or (after is not None and found[1] <= after):
            return None
        return found[0]

    def holder(self, principal: int, idempotency_key: str) -> NewCharge | EarlierCharge | None:
        """The charge ``idempotency_key`` of ``principal`` is bound to: by this group, else
        before it."""
        found = self._new_by_key.get((principal, idempotency_key))
        return found if found is not None else self._by_key.get((principal, idempotency_key))

    def added(self, charge: NewCharge, a: Admission, digest: str | None) -> None:
        """Remember a charge the group added, as later queries of the group would read it."""
        if digest is not None:
            self._new_twins[(a.charged_account_id, digest)] = charge

    def bound(
        self, principal: int, idempotency_key: str, charge: NewCharge | EarlierCharge
    ) -> None:
        """Remember a key the group bound (to a charge it added, or an earlier one)."""
        self._new_by_key[(principal, idempotency_key)] = charge


def _read_twins(
    session: Session, digests: dict[int, set[str]]
) -> dict[tuple[int, str], EarlierCharge]:
    if not digests:
        return {}
    wanted = {(account, digest) for account, found in digests.items() for digest in found}
    params = {"accounts": sorted(digests), "digests": sorted({d for _, d in wanted})}
    newest: dict[tuple[int, str], EarlierCharge] = {}
    for row in session.execute(_TWINS, params):
        pair = (int(row.charged_account_id), str(row.release_key))
        if pair in wanted and (pair not in newest or newest[pair].id < int(row.id)):
            newest[pair] = EarlierCharge(int(row.id), pair[0], row.last_sign)
    return newest


def _read_released(
    session: Session, keys: list[ReleaseKey]
) -> dict[ReleaseKey, tuple[int, datetime]]:
    if not keys:
        return {}
    wanted = set(keys)  # a key's fields compare exactly (epsilon as a float), as in SQL
    rows = session.execute(
        _RELEASED,
        {
            "accounts": sorted({key.account_id for key in keys}),
            "nodes": sorted({key.node for key in keys}),
        },
    )
    out: dict[ReleaseKey, tuple[int, datetime]] = {}
    for row in rows:  # one row per key: the newest release's charge and time
        key = ReleaseKey(
            int(row.charged_account_id), str(row.node), str(row.graph_version), str(row.mode),
            float(row.epsilon), str(row.mechanism_name),
        )  # fmt: skip
        if key in wanted:
            out[key] = (int(row.charge_id), as_utc(row.released_at))
    return out


def _read_by_key(
    session: Session, wanted: set[tuple[int, str]]
) -> dict[tuple[int, str], EarlierCharge]:
    return bound_charges(session, wanted) if wanted else {}


def _read_degree_paid(
    session: Session, wanted: set[tuple[int, str, float]]
) -> set[tuple[int, str, float]]:
    if not wanted:
        return set()
    params = {
        "accounts": sorted({account for account, _, _ in wanted}),
        "versions": sorted({version for _, version, _ in wanted}),
    }
    found = {
        (int(row.charged_account_id), str(row.graph_version), float(row.epsilon))
        for row in session.execute(_DEGREE_PAID, params)
    }
    return found & wanted  # epsilon compared exactly, as the lone lookup's SQL compares it
