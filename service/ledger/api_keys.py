"""API keys: creation, revocation and authentication (with the per-process cache)."""

from __future__ import annotations

import threading
import time

from sqlalchemy import select

from service.ledger.keys import generate_api_key, hash_api_key, key_prefix
from service.ledger.ledger_rows import (
    account_record,
    key_record,
)
from service.ledger.records import (
    AccountRecord,
    ApiKeyRecord,
)
from service.ledger.tables import (
    Account,
    ApiKey,
    utcnow,
)
from service.ledger.transactions import (
    LedgerPart,
    LedgerTransactions,
    UnknownApiKey,
)

#: Most API keys a process keeps authenticated lookups for (cleared when full).
_AUTH_CACHE_ENTRIES = 10_000


class ApiKeys(LedgerPart):
    """An account's API keys, and the lookups that authenticate a request by its key."""

    def __init__(self, transactions: LedgerTransactions) -> None:
        super().__init__(transactions)
        # key hash -> (account, read at monotonic, generation); see authenticate_cached
        self._auth_cache: dict[str, tuple[AccountRecord, float, int]] = {}
        self._auth_generation = 0  # bumped by this process's key/scope changes
        # key hash -> the lock its database lookup is made under (one lookup per key at once)
        self._lookup_locks: dict[str, threading.Lock] = {}
        self._lookup_locks_guard = threading.Lock()

    def create_api_key(
        self, account_id: int, *, actor_account_id: int | None = None
    ) -> tuple[str, ApiKeyRecord]:
        """A new key for the account; the plaintext is returned here and never stored."""
        api_key = generate_api_key()
        with self._writing() as session:
            self._account(session, account_id)
            row = ApiKey(
                account_id=account_id,
                key_hash=hash_api_key(api_key),
                prefix=key_prefix(api_key),
                created_at=utcnow(),
            )
            session.add(row)
            session.flush()
            self._audit(
                session,
                "api_key.create",
                actor=actor_account_id,
                target=account_id,
                details={"key_id": row.id, "prefix": row.prefix},
            )
            return api_key, key_record(row)

    def authenticate_cached(self, api_key: str, max_age_seconds: float) -> AccountRecord | None:
        """As :meth:`authenticate`, reusing a successful lookup for up to ``max_age_seconds``.

        The staleness bound: a key revoked (or an account's scopes changed) by another process
        is still accepted here, with the old scopes, for at most ``max_age_seconds``; a change
        made through this process's ledger takes effect at once. Admission (budget, quota,
        caps) is never cached: it always runs in the database.
        """
        if not isinstance(api_key, str) or not api_key:
            return None
        digest = hash_api_key(api_key)
        hit = self._recent_authentication(digest, max_age_seconds)
        if hit is not None:
            return hit
        # One lookup per key at a time: the requests that find the entry expired together
        # (every connection of a busy backend, once per max_age_seconds) wait for the first
        # one's lookup and take its result, rather than each reading the database.
        with self._lookup_lock(digest):
            hit = self._recent_authentication(digest, max_age_seconds)
            if hit is not None:
                return hit
            now = time.monotonic()
            generation = self._auth_generation
            account = self.authenticate(api_key)
            if account is None:
                self._auth_cache.pop(digest, None)
                return None
            if len(self._auth_cache) >= _AUTH_CACHE_ENTRIES:
                self._auth_cache.clear()
            self._auth_cache[digest] = (account, now, generation)
            return account

    def _lookup_lock(self, digest: str) -> threading.Lock:
        with self._lookup_locks_guard:
            lock = self._lookup_locks.get(digest)
            if lock is None:
                if len(self._lookup_locks) >= _AUTH_CACHE_ENTRIES:
                    self._lookup_locks.clear()  # a lock in use stays with its holders
                lock = self._lookup_locks[digest] = threading.Lock()
            return lock

    def recent_authentication(self, api_key: str, max_age_seconds: float) -> AccountRecord | None:
        """The account of a key this process authenticated successfully in the last
        ``max_age_seconds`` (see :meth:`authenticate_cached`), else None. Touches no
        database, so an event loop may call it."""
        if not isinstance(api_key, str) or not api_key:
            return None
        return self._recent_authentication(hash_api_key(api_key), max_age_seconds)

    def _recent_authentication(self, digest: str, max_age_seconds: float) -> AccountRecord | None:
        hit = self._auth_cache.get(digest)
        if (
            hit is not None
            and max_age_seconds > 0
            and time.monotonic() - hit[1] <= max_age_seconds
            and hit[2] == self._auth_generation
        ):
            return hit[0]
        return None

    def forget_authentications(self) -> None:
        self._auth_generation += 1
        self._auth_cache.clear()

    def authenticate(self, api_key: str) -> AccountRecord | None:
        if not isinstance(api_key, str) or not api_key:
            return None
        with self._reading() as session:
            row = session.scalars(
                select(Account)
                .join(ApiKey, ApiKey.account_id == Account.id)
                .where(ApiKey.key_hash == hash_api_key(api_key), ApiKey.revoked_at.is_(None))
            ).one_or_none()
            return None if row is None else account_record(row)

    def revoke_api_key(self, key_id: int, *, actor_account_id: int | None = None) -> ApiKeyRecord:
        self.forget_authentications()
        try:
            return self._revoke_api_key(key_id, actor_account_id)
        finally:
            self.forget_authentications()  # also a lookup that raced the commit

    def _revoke_api_key(self, key_id: int, actor_account_id: int | None) -> ApiKeyRecord:
        with self._writing() as session:
            row = session.get(ApiKey, key_id)
            if row is None:
                raise UnknownApiKey(f"API key {key_id} does not exist", details={"key_id": key_id})
            if row.revoked_at is None:
                row.revoked_at = utcnow()
                self._audit(
                    session,
                    "api_key.revoke",
                    actor=actor_account_id,
                    target=row.account_id,
                    details={"key_id": row.id, "prefix": row.prefix},
                )
                session.flush()
            return key_record(row)

    def list_api_keys(self, account_id: int) -> list[ApiKeyRecord]:
        with self._reading() as session:
            self._account(session, account_id)
            rows = session.scalars(
                select(ApiKey).where(ApiKey.account_id == account_id).order_by(ApiKey.id)
            )
            return [key_record(row) for row in rows]
