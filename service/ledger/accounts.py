"""Accounts: creation (a user account per seed node), lookups and listings."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from service.bounds import ACCOUNT_TYPES, AccountType
from service.errors import ECHO_MAX, InvalidParameter, echoed, shown
from service.ledger.id_lists import is_postgresql, one_of_bound
from service.ledger.ledger_rows import (
    account_record,
    valid_cap,
    valid_delta,
    valid_modes,
    valid_quota,
)
from service.ledger.periods import valid_period, valid_period_cap
from service.ledger.records import AccountRecord, UnknownAccount
from service.ledger.tables import (
    Account,
    Budget,
    Spend,
    utcnow,
)
from service.ledger.transactions import (
    AccountExists,
    LedgerPart,
)
from service.privacy.accountant import RdpCurve
from service.privacy.orders import GRID_VERSION
from service.settings.mechanism import MechanismSettings

_UNREAD = ("", 0.0)


_USER_ACCOUNTS_FOR_NODES_QUERY = select(Account.user_node_id, Account.id, Budget.delta).join(
    Budget, Budget.account_id == Account.id
)
#: By "is the dialect PostgreSQL's", built once (building it per group cost more than running
#: it): the nodes are one text array on PostgreSQL (one statement text for any number of
#: nodes, parsed once by psycopg), an expanding ``IN`` elsewhere.
_USER_ACCOUNTS_FOR_NODES = {
    postgresql: _USER_ACCOUNTS_FOR_NODES_QUERY.where(listed)
    for postgresql, listed in one_of_bound(Account.user_node_id, "nodes").items()
}


class Accounts(LedgerPart):
    """The accounts table, with each new account's budget and zero spend."""

    #: The budget period new accounts get, (period, cap) or None: PPR_DEFAULT_PERIOD and
    #: PPR_DEFAULT_PERIOD_CAP_EPSILON, read once from the environment unless the process
    #: set it from its settings (``ledger.accounts.default_period = ...``, as the server does).
    _default_period: tuple[str, float] | None = _UNREAD

    @property
    def default_period(self) -> tuple[str, float] | None:
        if self._default_period is _UNREAD:
            self._default_period = MechanismSettings().default_budget_period
        return self._default_period

    @default_period.setter
    def default_period(self, value: tuple[str, float] | None) -> None:
        self._default_period = value

    def create_account(
        self,
        type: AccountType,
        *,
        node_id: str | None = None,
        cap_epsilon: float,
        delta: float,
        label: str | None = None,
        may_create_seed_accounts: bool = False,
        modes: tuple[str, ...] | list[str] = ("edge",),
        quota_epsilon: float | None = None,
        actor_account_id: int | None = None,
    ) -> AccountRecord:
        if type not in ACCOUNT_TYPES:
            raise InvalidParameter("type", f"must be one of {', '.join(ACCOUNT_TYPES)}")
        if type == "user":
            if not node_id:
                raise InvalidParameter("node_id", "a user account is bound to a seed node")
        elif node_id is not None:
            raise InvalidParameter("node_id", f"only user accounts have a node, not {type}")
        cap = valid_cap(cap_epsilon)
        dlt = valid_delta(delta)
        period = self.default_period
        if period is not None:
            period = (valid_period(period[0]), valid_period_cap(period[1]))
        scoped = valid_modes(modes)
        quota = valid_quota(quota_epsilon)
        if type != "service" and (may_create_seed_accounts or quota is not None):
            raise InvalidParameter(
                "may_create_seed_accounts/quota_epsilon", "only service accounts have scopes"
            )
        if type == "user":
            scoped = ("personalized", "edge")  # a user queries its own node in either mode
        try:
            with self._writing() as session:
                now = utcnow()
                account = Account(
                    type=type,
                    node_id=node_id,
                    user_node_id=node_id if type == "user" else None,
                    label=label,
                    may_create_seed_accounts=bool(may_create_seed_accounts),
                    modes=",".join(scoped),
                    quota_epsilon=quota,
                    created_at=now,
                )
                session.add(account)
                session.flush()
                session.add(
                    Budget(
                        account_id=account.id,
                        cap_epsilon=cap,
                        delta=dlt,
                        updated_at=now,
                        period=None if period is None else period[0],
                        period_cap_epsilon=None if period is None else period[1],
                    )
                )
                zero = RdpCurve.zero()
                session.add(
                    Spend(
                        account_id=account.id,
                        rdp=zero.to_json(),
                        pure_epsilon=zero.pure,
                        grid_version=GRID_VERSION,
                        charges=0,
                        epsilon=0.0,
                        updated_at=now,
                    )
                )
                self._audit(
                    session,
                    "account.create",
                    actor=actor_account_id,
                    target=account.id,
                    details={
                        "type": type,
                        "node_id": node_id,
                        "label": label,
                        "cap_epsilon": cap,
                        "delta": dlt,
                        "may_create_seed_accounts": bool(may_create_seed_accounts),
                        "modes": list(scoped),
                        "quota_epsilon": quota,
                        **(
                            {}
                            if period is None
                            else {"period": period[0], "period_cap_epsilon": period[1]}
                        ),
                    },
                )
                session.flush()
                return account_record(account)
        except IntegrityError as exc:
            existing = self.account_for_node(node_id) if node_id is not None else None
            if existing is not None:
                raise AccountExists(
                    f"node {shown(node_id)} already has a user account ({existing.account_id})",
                    details={"node_id": node_id, "account_id": existing.account_id},
                ) from exc
            raise

    def get_account(self, account_id: int) -> AccountRecord:
        with self._reading() as session:
            return account_record(self._account(session, account_id))

    def list_accounts(
        self, *, type: str | None = None, limit: int = 100, offset: int = 0
    ) -> list[AccountRecord]:
        stmt = select(Account).order_by(Account.id).limit(limit).offset(offset)
        if type is not None:
            if type not in ACCOUNT_TYPES:
                raise InvalidParameter("type", f"must be one of {', '.join(ACCOUNT_TYPES)}")
            stmt = stmt.where(Account.type == type)
        with self._reading() as session:
            return [account_record(row) for row in session.scalars(stmt)]

    def account_for_node(self, node_id: str) -> AccountRecord | None:
        with self._reading() as session:
            row = session.scalars(
                select(Account).where(Account.user_node_id == node_id)
            ).one_or_none()
            return None if row is None else account_record(row)

    def user_accounts_for_nodes(self, nodes: Iterable[str]) -> dict[str, tuple[int, float]]:
        """The user account bound to each of ``nodes`` that has one, with its delta, in one
        read (a batch's seeds are looked up together, not one transaction each)."""
        wanted = sorted(set(nodes))
        found: dict[str, tuple[int, float]] = {}
        with self._reading() as session:
            statement = _USER_ACCOUNTS_FOR_NODES[is_postgresql(session)]
            for start in range(0, len(wanted), 500):
                rows = session.execute(statement, {"nodes": wanted[start : start + 500]})
                found.update({str(node): (int(acc), float(delta)) for node, acc, delta in rows})
        return found

    def user_account_for_node(
        self, node: str, *, create: bool, cap_epsilon: float, delta: float
    ) -> int:
        """The user account bound to ``node``, created on first use when ``create`` is set.

        Race-safe: of two concurrent creators one inserts, the other hits the UNIQUE
        constraint and reads the winner's account.
        """
        existing = self.account_for_node(node)
        if existing is not None:
            return existing.account_id
        if not create:
            named = node if len(node) <= ECHO_MAX else "NODE"
            raise UnknownAccount(
                f"no account for node {shown(node)}; an admin must create one "
                f"(python -m service accounts create --type user --node {named})",
                details={"node": echoed(node)},
            )
        try:
            return self.create_account(
                "user",
                node_id=node,
                cap_epsilon=cap_epsilon,
                delta=delta,
                label="created on first charge",
            ).account_id
        except AccountExists:
            existing = self.account_for_node(node)
            if existing is None:  # pragma: no cover - the constraint said it exists
                raise
            return existing.account_id
