"""A service account's quota window, read without reading the day's charges: its live charges
to other accounts summed by the minute.

The quota counts the epsilon of a service account's live charges to other accounts made in
the last 24 hours (``service/ledger/quota_and_degree.py``). Summing those charges costs one
row per charge, under the account's lock, and a busy backend makes hundreds of thousands a
day. Here every such charge is also added to its bucket, ``(principal, bucket_start)`` with
``bucket_start`` its ``created_at`` rounded down to :data:`QUOTA_BUCKET`, in the transaction
that inserts it (``AdmissionWrites.write_charges``); a refund takes it out again in the
transaction that refunds it (``Settlement``). Charges never change principal, time or
epsilon, and are never deleted, so a bucket is always the sum of its live charges (up to
floating-point rounding of the additions; ``ledger verify`` compares them).

The window ``(since, now]`` is then the buckets that start at or after the end of the bucket
holding ``since`` (at most 1,440 rows), plus the charges of that one bucket made after
``since``, read exactly from the charges: the same set of charges as the plain sum, so the
quota's decisions do not change. What is read is 1,440 small rows and one minute's charges,
not the day's: at 100 charged queries a second, 6,000 charges instead of 8.6 million.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Select,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.ledger.id_lists import is_postgresql
from service.ledger.tables import Charge, QuotaBucket

#: The width of a bucket. The partial bucket at the window's start is read from the charges,
#: so a narrower bucket reads fewer charges and more buckets (24 h / 1 min = 1,440).
QUOTA_BUCKET = timedelta(minutes=1)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

#: One charge as a bucket counts it: (principal, charged account, created_at, epsilon).
ChargeFigures = tuple[int, int, datetime, float]


def bucket_start(moment: datetime) -> datetime:
    """The start of the bucket that holds ``moment`` (aware UTC; a naive value is UTC)."""
    at = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    width = QUOTA_BUCKET // timedelta(microseconds=1)
    elapsed = (at - _EPOCH) // timedelta(microseconds=1)
    return _EPOCH + timedelta(microseconds=elapsed - elapsed % width)


def charges_to_others(principal: int | BindParameter[int]) -> ColumnElement[bool]:
    """A service account's live charges to other accounts: what its quota counts."""
    return and_(
        Charge.principal_account_id == principal,
        Charge.charged_account_id != principal,
        Charge.state != "refunded",
    )


def exact_window_sum(session: Session, principal: int, since: datetime) -> float:
    """The epsilon of ``principal``'s live charges to other accounts made after ``since``,
    summed over the charges themselves (one row per charge: the reference the buckets are
    checked against)."""
    used = session.scalar(
        select(func.coalesce(func.sum(Charge.epsilon), 0.0)).where(
            charges_to_others(principal), Charge.created_at > since
        )
    )
    return float(used or 0.0)


def window_sum(session: Session, principal: int, since: datetime) -> float:
    """The same sum as :func:`exact_window_sum`, from the buckets after the one holding
    ``since`` and the charges of that bucket made after ``since``."""
    first_whole = bucket_start(since) + QUOTA_BUCKET
    row = session.execute(
        _WINDOW_SUM, {"principal": principal, "since": since, "first_whole": first_whole}
    ).one()  # one round trip for both
    return float(row[0] or 0.0) + float(row[1] or 0.0)


def _window_sum() -> Select[Any]:
    """:func:`window_sum`'s statement, built once (building it per call cost more than
    running it): the whole buckets' sum and the partial bucket's charges' sum."""
    principal: BindParameter[int] = bindparam("principal")
    first_whole: BindParameter[datetime] = bindparam("first_whole")
    whole = (
        select(func.coalesce(func.sum(QuotaBucket.epsilon), 0.0))
        .where(
            QuotaBucket.principal_account_id == principal,
            QuotaBucket.bucket_start >= first_whole,
        )
        .scalar_subquery()
    )
    partial = (
        select(func.coalesce(func.sum(Charge.epsilon), 0.0))
        .where(
            charges_to_others(principal),
            Charge.created_at > bindparam("since"),
            Charge.created_at < first_whole,
        )
        .scalar_subquery()
    )
    return select(whole, partial)


_WINDOW_SUM = _window_sum()


def oldest_freeing(
    session: Session, principal: int, since: datetime, excess: float
) -> datetime | None:
    """When the charge was made at which the window's charges, oldest first, add up to
    ``excess`` (None: the whole window is less), reading the one minute's charges the window
    starts in, the buckets in order, and the charges of the one bucket where the sum is
    reached: what a refused query's ``Retry-After`` needs, without reading the day's charges.
    Where rounding keeps a bucket's charges just short of its sum, the bucket's end is the
    answer (a wait a moment longer, never shorter)."""
    first_whole = bucket_start(since) + QUOTA_BUCKET
    freed = 0.0

    def walk(after: ColumnElement[bool], before: datetime) -> datetime | None:
        nonlocal freed
        rows = session.execute(
            select(Charge.created_at, Charge.epsilon)
            .where(charges_to_others(principal), after, Charge.created_at < before)
            .order_by(Charge.created_at, Charge.id)
        )
        for created_at, epsilon in rows:
            freed += float(epsilon)
            if freed >= excess:
                return created_at
        return None

    found = walk(Charge.created_at > since, first_whole)
    if found is not None:
        return found
    buckets = session.execute(
        select(QuotaBucket.bucket_start, QuotaBucket.epsilon)
        .where(
            QuotaBucket.principal_account_id == principal,
            QuotaBucket.bucket_start >= first_whole,
        )
        .order_by(QuotaBucket.bucket_start)
    ).all()
    for start, epsilon in buckets:
        if freed + float(epsilon) < excess:
            freed += float(epsilon)
            continue
        end = bucket_start(start) + QUOTA_BUCKET
        found = walk(Charge.created_at >= start, end)
        return found if found is not None else end
    return None


def bucket_totals(
    charges: Iterable[ChargeFigures], *, sign: int = 1
) -> dict[tuple[int, datetime], tuple[float, int]]:
    """``sign`` times the epsilon and the count of the charges to others, by
    ``(principal, bucket_start)`` (a charge to its own principal counts in no quota)."""
    totals: dict[tuple[int, datetime], tuple[float, int]] = {}
    for principal, charged, created_at, epsilon in charges:
        if principal == charged:
            continue
        key = (int(principal), bucket_start(created_at))
        eps, count = totals.get(key, (0.0, 0))
        totals[key] = (eps + sign * float(epsilon), count + sign)
    return totals


def add_to_buckets(session: Session, charges: Iterable[ChargeFigures], *, sign: int = 1) -> None:
    """Add (``sign`` 1: new charges) or take out (-1: refunded ones) charges' epsilon in their
    principals' buckets; a charge to its own principal counts in no quota and is skipped.
    One upsert per bucket, in ascending key order (so that concurrent transactions touching
    several buckets always lock them in one order)."""
    totals = bucket_totals(charges, sign=sign)
    if not totals:
        return
    upsert = _ADD_TO_BUCKET[is_postgresql(session)]
    for (principal, start), (eps, count) in sorted(totals.items()):
        session.execute(
            upsert,
            {"b_principal": principal, "b_start": start, "b_epsilon": eps, "b_charges": count},
        )


def _add_to_bucket(dialect: Any) -> Any:
    """The upsert of one bucket's addition, built once per dialect (building it per call,
    ``excluded`` and all, cost more than executing it)."""
    statement = dialect.insert(QuotaBucket).values(
        principal_account_id=bindparam("b_principal"),
        bucket_start=bindparam("b_start"),
        epsilon=bindparam("b_epsilon"),
        charges=bindparam("b_charges"),
    )
    return statement.on_conflict_do_update(
        index_elements=[QuotaBucket.principal_account_id, QuotaBucket.bucket_start],
        set_={
            "epsilon": QuotaBucket.epsilon + statement.excluded.epsilon,
            "charges": QuotaBucket.charges + statement.excluded.charges,
        },
    )


#: By "is the dialect PostgreSQL's": its upsert, else SQLite's.
_ADD_TO_BUCKET = {True: _add_to_bucket(postgresql), False: _add_to_bucket(sqlite)}


def buckets_from_charges(session: Session) -> dict[tuple[int, datetime], tuple[float, int]]:
    """Every bucket as the live charges to others make it (``ledger verify``'s reference)."""
    rows = session.execute(
        select(
            Charge.principal_account_id, Charge.charged_account_id, Charge.created_at,
            Charge.epsilon,
        )
        .where(Charge.principal_account_id != Charge.charged_account_id)
        .where(Charge.state != "refunded")
        .execution_options(yield_per=5000)
    )  # fmt: skip
    return bucket_totals(rows)


def stored_buckets(session: Session) -> dict[tuple[int, datetime], tuple[float, int]]:
    """Every stored bucket, keyed as :func:`buckets_from_charges` keys them."""
    return {
        (int(row.principal_account_id), bucket_start(row.bucket_start)): (
            float(row.epsilon),
            int(row.charges),
        )
        for row in session.scalars(select(QuotaBucket))
    }


def rebuild_buckets(session: Session) -> int:
    """Write every bucket again from the charges (after charges were changed by hand, as a
    benchmark or a test that places charges in time does); the number of buckets."""
    session.execute(delete(QuotaBucket))
    rows = [
        {"principal_account_id": p, "bucket_start": start, "epsilon": eps, "charges": count}
        for (p, start), (eps, count) in sorted(buckets_from_charges(session).items())
    ]
    if rows:
        session.execute(insert(QuotaBucket), rows)
    return len(rows)
