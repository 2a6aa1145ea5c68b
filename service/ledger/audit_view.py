"""The admin's view of the audit log: newest first, filtered by action (exactly or by a
prefix such as ``budget.``), actor and target, with every action that occurs in the log."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, or_, select

from service.ledger.admin_records import AuditPage, escape_like
from service.ledger.tables import AuditLog, iso
from service.ledger.transactions import LedgerPart


class AuditView(LedgerPart):
    """Pages of the audit log (each call one read transaction)."""

    def audit_page(
        self,
        *,
        action: str | None = None,
        actor_account_id: int | None = None,
        target_account_id: int | None = None,
        account_id: int | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> AuditPage:
        """Audit rows, newest first. ``action`` matches exactly or as a prefix ending in '.'
        (``budget.`` finds every budget action); ``account_id`` matches actor or target."""
        where: list[Any] = []
        if action:
            if action.endswith("."):
                where.append(AuditLog.action.like(f"{escape_like(action)}%", escape="\\"))
            else:
                where.append(AuditLog.action == action)
        if actor_account_id is not None:
            where.append(AuditLog.actor_account_id == actor_account_id)
        if target_account_id is not None:
            where.append(AuditLog.target_account_id == target_account_id)
        if account_id is not None:
            where.append(
                or_(
                    AuditLog.actor_account_id == account_id,
                    AuditLog.target_account_id == account_id,
                )
            )
        with self._reading() as session:
            total = int(session.scalar(select(func.count(AuditLog.id)).where(*where)) or 0)
            rows = session.scalars(
                select(AuditLog)
                .where(*where)
                .order_by(AuditLog.id.desc())
                .limit(limit)
                .offset(offset)
            )
            items = [
                {
                    "id": row.id,
                    "created_at": iso(row.created_at) or "",
                    "actor_account_id": row.actor_account_id,
                    "action": row.action,
                    "target_account_id": row.target_account_id,
                    "details": row.details,
                }
                for row in rows
            ]
            actions = [
                str(a)
                for a in session.scalars(
                    select(AuditLog.action).distinct().order_by(AuditLog.action)
                )
            ]
        return AuditPage(total, limit, offset, items, actions)
