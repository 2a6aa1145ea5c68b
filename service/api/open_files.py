"""The open-file limit a server process needs for its connection bound.

Every connection is a file descriptor, so a worker allowed ``PPR_HTTP_MAX_CONNECTIONS``
connections needs at least that many descriptors plus those it holds anyway (ledger pool,
Redis, the graph snapshot and prefix tables, logs, the listening socket). The limit is per
process; the supervisor raises its own soft limit before it forks its workers, who inherit it.
"""

from __future__ import annotations

import logging
import resource

from service.config import Settings

log = logging.getLogger(__name__)

#: Descriptors a worker holds besides its HTTP connections (a generous bound).
RESERVED_FILES = 256


def files_needed(settings: Settings) -> int:
    return settings.http_max_connections + RESERVED_FILES


def ensure_open_file_limit(settings: Settings) -> str | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to what ``settings`` need when the hard
    limit allows it; return a warning (also logged) when it does not, else None."""
    needed = files_needed(settings)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    if hard == resource.RLIM_INFINITY or hard >= needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        log.info("raised the open-file limit from %d to %d (PPR_HTTP_MAX_CONNECTIONS + %d)",
                 soft, needed, RESERVED_FILES)  # fmt: skip
        return None
    if hard > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    warning = (
        f"the open-file limit (RLIMIT_NOFILE) is {hard}, below the {needed} that "
        f"PPR_HTTP_MAX_CONNECTIONS={settings.http_max_connections} needs per worker "
        f"(+{RESERVED_FILES} for the ledger, caches and files): raise it (ulimit -n, "
        "LimitNOFILE=, docker --ulimit nofile=) or lower PPR_HTTP_MAX_CONNECTIONS, else "
        "new connections fail with 'Too many open files' before the bound answers 503"
    )
    log.warning(warning)
    return warning
