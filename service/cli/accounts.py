"""``accounts``: create accounts and API keys, set budgets, revoke keys, show spend.

Every action is written to the ledger's audit log with no actor (the operator at the command
line). The database must already be migrated (``python -m service db upgrade``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from service.bounds import ACCOUNT_TYPES, BUDGET_PERIODS
from service.cli import arg_types
from service.cli.arg_types import budget_delta, cap_epsilon, positive_float
from service.cli.common import print_json, print_table
from service.cli.db import Handler, add_database_argument, database_url
from service.errors import InvalidParameter

if TYPE_CHECKING:
    from service.ledger.ledger import Ledger
    from service.ledger.records import AccountRecord, BudgetView


@contextmanager
def _ledger(args: argparse.Namespace) -> Iterator[Ledger]:
    from service.ledger.ledger import Ledger

    ledger = Ledger.from_url(database_url(args), auto_migrate=False)
    try:
        yield ledger
    finally:
        ledger.dispose()


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "accounts",
        help="manage accounts, API keys and budgets",
        description="Manage the ledger's accounts, API keys and privacy budgets.",
    )
    actions = parser.add_subparsers(dest="accounts_action", metavar="ACTION", required=True)

    def action(name: str, text: str, handler: Handler) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(name, help=text, description=text)
        add_database_argument(sub)
        sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(handler=handler)
        return sub

    create = action("create", "create an account and print its first API key (once)", _create)
    create.add_argument("--type", choices=ACCOUNT_TYPES, required=True, help="account type")
    create.add_argument("--node", metavar="ID", help="the user's seed node (user accounts only)")
    create.add_argument(
        "--cap", type=cap_epsilon, help="budget cap epsilon; default PPR_DEFAULT_CAP_EPSILON"
    )
    create.add_argument(
        "--delta",
        type=budget_delta,
        help="budget delta; default PPR_DEFAULT_DELTA (1e-6), or 1/PPR_EDGE_COUNT_BOUND if lower",
    )
    create.add_argument("--label", type=arg_types.label, help="a free-text label (printable)")
    create.add_argument(
        "--may-create-seed-accounts",
        action="store_true",
        help="a service account may create a seed user's account on its first charge",
    )
    add_scope_arguments(create)
    create.add_argument(
        "--graph",
        type=Path,
        metavar="FILE",
        help="edge-list file the node must be in; default PPR_GRAPH_PATH or the demo graph",
    )

    listing = action("list", "list accounts with their budgets", _list)
    listing.add_argument("--type", choices=ACCOUNT_TYPES, help="only accounts of this type")
    listing.add_argument("--limit", type=arg_types.limit, default=100, help="1..1000")
    listing.add_argument("--offset", type=arg_types.offset, default=0)

    set_budget = action(
        "set-budget", "change an account's cap and/or delta, and its budget period", _set_budget
    )
    set_budget.add_argument("account_id", type=arg_types.account_id, metavar="ACCOUNT_ID")
    set_budget.add_argument("--cap", type=cap_epsilon, help="new cap epsilon")
    set_budget.add_argument("--delta", type=budget_delta, help="new delta")
    set_budget.add_argument(
        "--period", choices=BUDGET_PERIODS,
        help="a cap per UTC day, week or month on top of the lifetime cap (with --period-cap)",
    )  # fmt: skip
    set_budget.add_argument(
        "--period-cap", type=cap_epsilon, help="the cap per period (epsilon at the delta)"
    )
    set_budget.add_argument(
        "--clear-period", action="store_true", help="remove the budget period (lifetime cap alone)"
    )

    scopes = action(
        "set-scopes", "change a service account's modes, seed-account right and quota", _set_scopes
    )
    scopes.add_argument("account_id", type=arg_types.account_id, metavar="ACCOUNT_ID")
    add_scope_arguments(scopes)
    scopes.add_argument(
        "--may-create-seed-accounts",
        action="store_true",
        help="grant the right to create a seed user's account on its first charge",
    )
    scopes.add_argument(
        "--no-create-seed-accounts",
        action="store_true",
        help="take back the right to create seed users' accounts",
    )
    scopes.add_argument(
        "--default-quota", action="store_true", help="use PPR_SERVICE_QUOTA_EPSILON again"
    )
    scopes.add_argument(
        "--read-cap-epsilon",
        type=positive_float,
        metavar="EPS",
        help="cap on what the service account's answers reveal (its read figure); default "
        "PPR_SERVICE_READ_CAP_EPSILON (unset: no cap)",
    )
    scopes.add_argument(
        "--default-read-cap",
        action="store_true",
        help="use PPR_SERVICE_READ_CAP_EPSILON again",
    )

    reads = action(
        "reads",
        "show what a service account's answers reveal: its read figure, composed over every "
        "distinct release it received, and the cap on it",
        _reads,
    )
    reads.add_argument("account_id", type=arg_types.account_id, metavar="ACCOUNT_ID")

    revoke = action("revoke-key", "revoke an API key (idempotent)", _revoke_key)
    revoke.add_argument("key_id", type=arg_types.key_id, metavar="KEY_ID")

    new_key = action("new-key", "create another API key for an account", _new_key)
    new_key.add_argument("account_id", type=arg_types.account_id, metavar="ACCOUNT_ID")

    keys = action("keys", "list an account's API keys (prefixes only)", _keys)
    keys.add_argument("account_id", type=arg_types.account_id, metavar="ACCOUNT_ID")

    budget = action("budget", "show an account's spend and remaining budget", _budget)
    budget.add_argument("account_id", type=arg_types.account_id, metavar="ACCOUNT_ID")


def _modes(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def add_scope_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--modes",
        type=_modes,
        metavar="MODES",
        help="service accounts: comma-separated modes it may query (default: edge); "
        "'edge,personalized' lets it charge seed users' budgets",
    )
    parser.add_argument(
        "--quota-epsilon",
        type=positive_float,
        metavar="EPS",
        help="service accounts: eps it may charge to other accounts per rolling 24 h; "
        "default PPR_SERVICE_QUOTA_EPSILON",
    )


def _account_dict(account: AccountRecord, budget: BudgetView | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "account_id": account.account_id,
        "type": account.type,
        "node_id": account.node_id,
        "label": account.label,
        "may_create_seed_accounts": account.may_create_seed_accounts,
        "modes": list(account.modes),
        "quota_epsilon": account.quota_epsilon,
        "read_cap_epsilon": account.read_cap_epsilon,
        "created_at": account.created_at,
    }
    if budget is not None:
        body["budget"] = budget.to_dict()
    return body


def _print_budget(budget: BudgetView) -> None:
    print_table(
        ["field", "value"],
        [
            [key, f"{value:.6g}" if isinstance(value, float) else str(value)]
            for key, value in budget.to_dict().items()
        ],
    )


def _create(args: argparse.Namespace) -> int:
    if args.type == "user" and not args.node:
        raise InvalidParameter("--node", "a user account needs --node, the seed node it owns")
    if args.type != "user" and args.node is not None:
        raise InvalidParameter("--node", f"only user accounts have a node, not {args.type}")
    if args.type != "service" and (
        args.modes is not None or args.quota_epsilon is not None or args.may_create_seed_accounts
    ):
        raise InvalidParameter(
            "--modes/--quota-epsilon/--may-create-seed-accounts",
            "only service accounts have scopes",
        )
    from service.config import Settings

    settings = Settings()
    with _ledger(args) as ledger:
        if args.node is not None:
            from service.graph.configured import load_configured_graph

            graph = load_configured_graph(
                args.graph or settings.graph_path, nodes_path=settings.nodes_path
            )
            graph.index_of(args.node)  # UnknownNode if the graph does not have it
        opened = ledger.open_account(
            args.type,
            defaults=settings,
            node_id=args.node,
            cap_epsilon=args.cap,
            delta=args.delta,
            label=args.label,
            may_create_seed_accounts=args.may_create_seed_accounts,
            modes=args.modes,
            quota_epsilon=args.quota_epsilon,
        )
    account, api_key, key = opened.account, opened.api_key, opened.key
    cap, delta = opened.cap_epsilon, opened.delta
    if args.json:
        print_json(
            {
                "account_id": account.account_id,
                "type": account.type,
                "node_id": account.node_id,
                "cap_epsilon": cap,
                "delta": delta,
                "key_id": key.key_id,
                "api_key": api_key,
            }
        )
    else:
        node = f", node {account.node_id!r}" if account.node_id is not None else ""
        print(
            f"created account {account.account_id} ({account.type}{node}): cap {cap:g}, "
            f"delta {delta:g}"
        )
        print(f"API key {key.key_id} (shown only now; store it safely):")
        print(api_key)
    return 0


def _list(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        accounts = ledger.accounts.list_accounts(
            type=args.type, limit=args.limit, offset=args.offset
        )
        rows = [(account, ledger.budgets.budget(account.account_id)) for account in accounts]
    if args.json:
        print_json([_account_dict(account, budget) for account, budget in rows])
        return 0
    print_table(
        ["id", "type", "node", "label", "spent", "cap", "remaining", "delta", "charges"],
        [
            [
                str(a.account_id),
                a.type,
                a.node_id or "-",
                a.label or "-",
                f"{b.spent_epsilon:.4g}",
                f"{b.cap_epsilon:.4g}",
                f"{b.remaining_epsilon:.4g}",
                f"{b.delta:.3g}",
                str(b.charges),
            ]
            for a, b in rows
        ],
    )
    return 0


def _set_scopes(args: argparse.Namespace) -> int:
    if args.may_create_seed_accounts and args.no_create_seed_accounts:
        raise InvalidParameter(
            "--may-create-seed-accounts", "cannot be given with --no-create-seed-accounts"
        )
    if args.quota_epsilon is not None and args.default_quota:
        raise InvalidParameter("--quota-epsilon", "cannot be given with --default-quota")
    if args.read_cap_epsilon is not None and args.default_read_cap:
        raise InvalidParameter("--read-cap-epsilon", "cannot be given with --default-read-cap")
    may_create: bool | None = None
    if args.may_create_seed_accounts or args.no_create_seed_accounts:
        may_create = bool(args.may_create_seed_accounts)
    with _ledger(args) as ledger:
        account = ledger.budgets.set_scopes(
            args.account_id,
            modes=args.modes,
            may_create_seed_accounts=may_create,
            quota_epsilon=args.quota_epsilon,
            clear_quota=args.default_quota,
            read_cap_epsilon=args.read_cap_epsilon,
            clear_read_cap=args.default_read_cap,
        )
    if args.json:
        print_json(_account_dict(account))
    else:
        quota = "default" if account.quota_epsilon is None else f"{account.quota_epsilon:g}"
        read_cap = (
            "default" if account.read_cap_epsilon is None else f"{account.read_cap_epsilon:g}"
        )
        print(
            f"account {account.account_id}: modes {','.join(account.modes)}, may create seed "
            f"accounts {account.may_create_seed_accounts}, quota {quota}, read cap {read_cap}"
        )
    return 0


def _reads(args: argparse.Namespace) -> int:
    from service.config import Settings

    default_cap = Settings().service_read_cap_epsilon
    with _ledger(args) as ledger:
        if ledger.accounts.get_account(args.account_id).type != "service":
            raise InvalidParameter("ACCOUNT_ID", "only service accounts have a read figure")
        view = ledger.read_figures.read_view(args.account_id, default_cap_epsilon=default_cap)
    if args.json:
        print_json(view.to_dict())
    else:
        cap = "none" if view.cap_epsilon is None else f"{view.cap_epsilon:.6g}"
        print(
            f"account {view.account_id}: read epsilon {view.epsilon:.6g} at delta "
            f"{view.delta:g} over {view.releases} distinct releases; read cap {cap}"
        )
    return 0


def _set_budget(args: argparse.Namespace) -> int:
    changes = (args.cap, args.delta, args.period, args.period_cap)
    if all(value is None for value in changes) and not args.clear_period:
        raise InvalidParameter(
            "--cap/--delta/--period", "give a new cap, delta, period or period cap"
        )
    with _ledger(args) as ledger:
        budget = ledger.budgets.set_budget(
            args.account_id, cap_epsilon=args.cap, delta=args.delta, period=args.period,
            period_cap_epsilon=args.period_cap, clear_period=args.clear_period,
        )  # fmt: skip
    if args.json:
        print_json(budget.to_dict())
    else:
        _print_budget(budget)
    return 0


def _revoke_key(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        key = ledger.api_keys.revoke_api_key(args.key_id)
    if args.json:
        print_json(asdict(key))
    else:
        print(f"revoked API key {key.key_id} ({key.prefix}...) of account {key.account_id}")
    return 0


def _new_key(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        api_key, key = ledger.api_keys.create_api_key(args.account_id)
    if args.json:
        print_json({"account_id": key.account_id, "key_id": key.key_id, "api_key": api_key})
    else:
        print(f"API key {key.key_id} for account {key.account_id} (shown only now; store it):")
        print(api_key)
    return 0


def _keys(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        keys = ledger.api_keys.list_api_keys(args.account_id)
    if args.json:
        print_json([asdict(k) for k in keys])
    else:
        print_table(
            ["key_id", "prefix", "created_at", "revoked_at"],
            [[str(k.key_id), k.prefix, k.created_at, k.revoked_at or "-"] for k in keys],
        )
    return 0


def _budget(args: argparse.Namespace) -> int:
    with _ledger(args) as ledger:
        budget = ledger.budgets.budget(args.account_id)
    if args.json:
        print_json(budget.to_dict())
    else:
        _print_budget(budget)
    return 0
