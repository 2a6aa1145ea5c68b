"""service/ledger/accounts.py: a group's seed users are looked up in one read per 500 nodes,
on SQLite and on PostgreSQL: each node bound to a user account maps to that account and its
delta, whatever its characters; a node without one, or bound to a service account, is absent."""

from __future__ import annotations

from service.ledger import Ledger
from service.ledger.accounts import Accounts


def test_user_accounts_for_nodes_finds_each_bound_node_and_only_those(ledger: Ledger) -> None:
    accounts: Accounts = ledger.accounts
    bound = {"n1": 1e-6, "ñ 2": 1e-7, "z999": 1e-5}  # "z999" sorts after every unbound node
    ids = {
        node: accounts.create_account("user", node_id=node, cap_epsilon=1.0, delta=delta).account_id
        for node, delta in bound.items()
    }
    accounts.create_account("service", cap_epsilon=1.0, delta=1e-6)
    asked = [*bound, "n1", *(f"u{i:04d}" for i in range(1200))]  # three reads of 500
    found = accounts.user_accounts_for_nodes(asked)
    assert found == {node: (ids[node], delta) for node, delta in bound.items()}
    assert accounts.user_accounts_for_nodes([]) == {}
    assert accounts.user_accounts_for_nodes(["u0001"]) == {}
