"""The open-file limit a server process runs with.

Every connection is a file descriptor. At start-up ``serve`` raises its soft
``RLIMIT_NOFILE`` to the hard limit (the workers inherit it): raising it costs nothing, and
what a worker cannot open it cannot answer. Each worker then holds at most its connection bound
(``PPR_HTTP_MAX_CONNECTIONS``, or fewer when the file limit leaves room for fewer, after the
descriptors it holds and ``PPR_HTTP_RESERVED_FILES``: see
:func:`service.api.http_protocol.connection_bound`), so it never runs out of descriptors,
whatever a flood of connections does.
"""

from __future__ import annotations

import logging
import resource

from service.config import Settings

log = logging.getLogger(__name__)


def files_needed(settings: Settings) -> int:
    """Descriptors a worker needs to hold ``PPR_HTTP_MAX_CONNECTIONS`` connections."""
    return settings.http_max_connections + settings.http_reserved_files


def ensure_open_file_limit(settings: Settings) -> str | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to its hard limit; return a warning (also
    logged) when even the hard limit is below what ``settings`` need, else None."""
    needed = files_needed(settings)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, needed)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # an infinite hard limit above the kernel's nr_open
            target = max(soft, needed)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target > soft:
            log.info("raised the open-file limit from %d to %d (the hard limit)", soft, target)
        soft = target
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return None
    warning = (
        f"the open-file limit (RLIMIT_NOFILE) is {soft}, below the {needed} that "
        f"PPR_HTTP_MAX_CONNECTIONS={settings.http_max_connections} needs per worker "
        f"(+{settings.http_reserved_files} PPR_HTTP_RESERVED_FILES for the ledger, caches and "
        "files): each worker holds fewer connections (beyond them it sheds the oldest "
        "half-sent ones, or answers 503 overloaded); raise the limit (ulimit -n, "
        "LimitNOFILE=, docker --ulimit nofile=) or lower PPR_HTTP_MAX_CONNECTIONS"
    )
    log.warning(warning)
    return warning
