"""Read-only views of the ledger for admins: the accounts table, usage per hour, refusals by
reason, an account's composed curve, a service account's charges to others, the audit log.

Everything here is computed in SQL where it can be (sorting, filtering, paging, grouping by
hour) so it stays fast with many accounts; only an account's own curve is composed in Python,
by the same RDP accountant that admission uses.

:class:`AdminViews` is a facade over parts that each own one view and its SQL, on the
ledger's transactions (one read transaction per call), in the style of the ledger's own
facade: the accounts table (``account_listing``), the activity overview and the charges in
flight (``admin_activity``), one account's page (``account_views``), the audit log
(``audit_view``) and when accounts run out at their recent rate (``run_out``). The records
they return are in ``admin_records`` (the run-out's in ``run_out``).
"""

from __future__ import annotations

from service.ledger.account_listing import AccountListing
from service.ledger.account_views import AccountViews
from service.ledger.admin_activity import Activity
from service.ledger.admin_records import ACCOUNT_SORTS as ACCOUNT_SORTS
from service.ledger.admin_records import CURVE_POINTS_MAX as CURVE_POINTS_MAX
from service.ledger.admin_records import AccountCurve as AccountCurve
from service.ledger.admin_records import AccountFilter as AccountFilter
from service.ledger.admin_records import AccountRow as AccountRow
from service.ledger.admin_records import AccountSort as AccountSort
from service.ledger.admin_records import AccountStatus as AccountStatus
from service.ledger.admin_records import AuditPage as AuditPage
from service.ledger.admin_records import BudgetPreview as BudgetPreview
from service.ledger.admin_records import CurvePoint as CurvePoint
from service.ledger.admin_records import HourUsage as HourUsage
from service.ledger.admin_records import Page as Page
from service.ledger.admin_records import ServiceUsage as ServiceUsage
from service.ledger.audit_view import AuditView
from service.ledger.ledger import Ledger
from service.ledger.run_out import RunOutView


class AdminViews:
    """The admin's read-only views over one ledger (each call one read transaction)."""

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        transactions = ledger.transactions
        self.listing = AccountListing(transactions)
        self.activity = Activity(transactions)
        self.account = AccountViews(transactions)
        self.audit = AuditView(transactions)
        self.run_outs = RunOutView(transactions)

    # the accounts table
    # overview and health
    # one account
    # the audit log
    # when accounts run out at their recent rate
