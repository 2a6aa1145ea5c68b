"""A service account's reads counted by the admission that charges them
(``service/ledger/admission_reads.py``), on SQLite and on PostgreSQL: counted in the same
transaction as the charge, refused past the read cap with nothing charged and the refusal
kept, in a group item by item in order, and for a service account charging another account
(its own row locked for the read)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.ledger import Ledger, ReadCapExhausted
from service.ledger.admission_reads import AdmissionReads
from service.ledger.json_text import EncodedJson
from service.ledger.locked_rows import NewCharge
from service.ledger.records import Admission, ChargeReceipt, ReadAsk
from service.ledger.tables import Charge, Refusal, ServiceRead
from service.privacy.curves import laplace_curve

DELTA = 1e-6


def _ask(principal: int, charged: int, i: int, **fields: Any) -> Admission:
    values: dict[str, Any] = {
        "charged_account_id": charged, "principal_account_id": principal, "seed": f"n{i}",
        "mechanism": "noisy_diffusion", "mode": "edge", "params": {"i": i},
        "query_curve": laplace_curve(0.1), "query_epsilon": 0.1, "graph_version": "g1",
        "request_id": f"r{i}", "read": ReadAsk(default_cap_epsilon=None),
    }  # fmt: skip
    values.update(fields)
    return Admission(**values)


def _count(ledger: Ledger, what: Any) -> int:
    with ledger.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(what)).scalar_one())


def test_an_admission_counts_its_readers_read_in_its_own_transaction(ledger: Ledger) -> None:
    service = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    receipt = ledger.admission.admit_and_charge(_ask(service, service, 0))
    view = ledger.read_figures.read_view(service)
    assert view.releases == 1 and view.epsilon == pytest.approx(0.1, rel=1e-4)
    with ledger.engine.connect() as conn:
        read_charges = conn.execute(select(ServiceRead.charge_id)).scalars().all()
    assert read_charges == [receipt.charge_id]
    # a replay of it (the figure's own path) adds nothing: it was counted
    ledger.read_figures.record_reads(service, charge_ids=[receipt.charge_id])
    assert ledger.read_figures.read_view(service).releases == 1
    assert ledger.reports.verify().ok


def test_past_the_read_cap_nothing_is_charged_and_the_refusal_is_kept(ledger: Ledger) -> None:
    service = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    cap_ask = ReadAsk(default_cap_epsilon=0.25)
    ledger.admission.admit_and_charge(_ask(service, service, 0, read=cap_ask))
    ledger.admission.admit_and_charge(_ask(service, service, 1, read=cap_ask))
    with pytest.raises(ReadCapExhausted):
        ledger.admission.admit_and_charge(_ask(service, service, 2, read=cap_ask))
    assert _count(ledger, Charge) == 2 and ledger.read_figures.read_view(service).releases == 2
    with ledger.engine.connect() as conn:
        reasons = conn.execute(select(Refusal.reason)).scalars().all()
    assert reasons == ["read_cap_exhausted"]
    assert ledger.budgets.budget(service).spent_epsilon == pytest.approx(0.2, rel=1e-4)


def test_a_group_counts_its_reads_in_order_up_to_the_cap(ledger: Ledger) -> None:
    """A service account charging four users in one group transaction, its read cap room for
    two: the first two are charged and counted, the last two refused with nothing written;
    its own spend row is locked for the reads (it is charged nothing itself)."""
    service = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    users = [
        ledger.accounts.create_account("user", cap_epsilon=10.0, delta=DELTA, node_id=str(i))
        .account_id
        for i in range(4)
    ]  # fmt: skip
    cap_ask = ReadAsk(default_cap_epsilon=0.25)
    outcomes = ledger.admission.admit_and_charge_many(
        [_ask(service, user, i, read=cap_ask, mode="personalized") for i, user in enumerate(users)]
    )
    kinds = [type(o).__name__ for o in outcomes]
    assert kinds == ["ChargeReceipt", "ChargeReceipt", "ReadCapExhausted", "ReadCapExhausted"]
    admitted = [o.charge_id for o in outcomes if isinstance(o, ChargeReceipt)]
    with ledger.engine.connect() as conn:
        read_charges = sorted(conn.execute(select(ServiceRead.charge_id)).scalars())
    assert read_charges == sorted(admitted) and _count(ledger, Charge) == 2
    assert ledger.read_figures.read_view(service).releases == 2
    assert ledger.reports.verify().ok


def test_a_checked_read_is_written_only_once_kept(ledger: Ledger) -> None:
    """:class:`AdmissionReads` alone: a read checked but not kept (its query refused later in
    the admission) writes nothing; kept, it is written naming its charge, the figure with it."""
    service = ledger.accounts.create_account("service", cap_epsilon=10.0, delta=DELTA).account_id
    receipt = ledger.admission.admit_and_charge(_ask(service, service, 0, read=None))
    curve = laplace_curve(0.1)
    with Session(ledger.engine) as session, session.begin():
        figures = AdmissionReads()
        figures.check(session, service, ReadAsk(None), curve, 0.1, EncodedJson("{}"))
        figures.write(session)  # checked, never kept
    assert ledger.read_figures.read_view(service).releases == 0
    with Session(ledger.engine) as session, session.begin():
        figures = AdmissionReads()
        pending = figures.check(session, service, ReadAsk(None), curve, 0.1, EncodedJson("{}"))
        charge = NewCharge({})
        charge.id = receipt.charge_id
        figures.keep(pending, charge)
        figures.write(session)
    view = ledger.read_figures.read_view(service)
    assert view.releases == 1 and view.epsilon == pytest.approx(0.1, rel=1e-4)
