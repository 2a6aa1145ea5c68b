"""A service account's read figure: what it has received, counted before it is sent."""

from __future__ import annotations

from service.ledger.ledger import Ledger
from service.ledger.records import ReadCapExhausted
from service.serving.pipeline.policy import AdmissionPolicy
from service.serving.pipeline.refusals import RefusalLog
from service.serving.schemas import QueryRequest


class ReadFigure:
    """Counts releases into a service account's read figure (refused past its read cap)."""

    def __init__(self, ledger: Ledger, policy: AdmissionPolicy, refusals: RefusalLog) -> None:
        self.ledger = ledger
        self.policy = policy
        self.refusals = refusals
        #: Reads a service account already has in its read figure (the database only ever adds
        #: them, and a counted release is never refused), so a replay of one needs no write.
        self._known_reads: set[tuple[int, str, int | None, str | None]] = set()

    def record(
        self, req: QueryRequest, version: str, charge_id: int | None, degree_release: str | None
    ) -> None:
        """Count what a service account is about to receive in its read figure (refused past
        its read cap with ``read_cap_exhausted``): the query's release, and the version's
        degree release when the answer is built on it."""
        known = (req.principal.account_id, version, charge_id, degree_release)
        if known in self._known_reads:
            return
        try:
            self.ledger.read_figures.record_reads(
                req.principal.account_id,
                charge_ids=() if charge_id is None else (charge_id,),
                graph_release=None if degree_release is None else (version, degree_release),
                default_cap_epsilon=self.policy.service_read_cap_epsilon,
            )
        except ReadCapExhausted as refusal:
            self.refusals.record(
                refusal.code, principal_account_id=req.principal.account_id, mode=req.mode.value
            )
            raise
        self._remember(known)

    def counted(
        self, req: QueryRequest, version: str, charge_id: int, degree_release: str | None
    ) -> None:
        """Note a read its admission counted (the release of a charge admitted with a
        :class:`~service.ledger.records.ReadAsk`), so a replay of it writes nothing."""
        self._remember((req.principal.account_id, version, charge_id, degree_release))

    def _remember(self, known: tuple[int, str, int | None, str | None]) -> None:
        if len(self._known_reads) > 100_000:
            self._known_reads.clear()
        self._known_reads.add(known)
