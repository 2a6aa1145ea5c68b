"""When a query draws new noise rather than replaying its stored release: the refresh policy.

A backend that asks for the same seed every day should pay only when there is something new.
Within one graph version, a repeated query replays its stored release for nothing (it is
post-processing of a release the account already paid for); the policy says when a new draw
is worth its charge:

* ``on_new_version`` (the default): replay within the graph version; the first query after a
  reload draws (the release key includes the version);
* ``max_age:<n><unit>`` (``s``, ``m``, ``h``, ``d``, ``w``; e.g. ``max_age:7d``): as
  ``on_new_version``, and also draw once the stored release is older than that;
* ``always``: draw every time (as ``fresh=true``, which wins over any policy).

The policy reads only public facts (the graph version, the release's time), never the edges.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from service.errors import InvalidParameter

ON_NEW_VERSION = "on_new_version"
ALWAYS = "always"
MAX_AGE = "max_age"

#: What the ``refresh`` parameter accepts (also its JSON Schema pattern).
REFRESH_PATTERN = r"^(on_new_version|always|max_age:[1-9][0-9]{0,8}[smhdw])$"

_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
#: The longest max_age in effect: ten years. A longer one (any the pattern allows is a valid
#: request) is read as this: a release that old is due either way, and the date arithmetic
#: stays in range.
MAX_AGE_LIMIT_SECONDS = 10 * 365 * 86_400

REFRESH_HELP = (
    "When to draw new noise instead of replaying the stored release: `on_new_version` "
    "(default: replay within a graph version), `max_age:<n><s|m|h|d|w>` (also draw once the "
    "stored release is older, e.g. `max_age:7d`) or `always` (as `fresh=true`)."
)


@dataclass(frozen=True)
class RefreshPolicy:
    """A parsed ``refresh``: ``max_age_seconds`` is set only for ``max_age``."""

    kind: str = ON_NEW_VERSION
    max_age_seconds: int | None = None

    @property
    def always(self) -> bool:
        return self.kind == ALWAYS

    def __str__(self) -> str:
        if self.kind != MAX_AGE:
            return self.kind
        seconds = self.max_age_seconds or 0
        for unit in ("w", "d", "h", "m"):
            if seconds % _UNIT_SECONDS[unit] == 0:
                return f"{MAX_AGE}:{seconds // _UNIT_SECONDS[unit]}{unit}"
        return f"{MAX_AGE}:{seconds}s"


def replayable_after(max_age_seconds: int | None) -> datetime | None:
    """Under a max age, a stored release made at or before this time is due (drawn anew) and
    one made after it is replayed or joined; None: any release, whatever its age."""
    if max_age_seconds is None:
        return None
    return datetime.now(UTC) - timedelta(seconds=max_age_seconds)


def parse_refresh(text: str | None, *, fresh: bool = False, name: str = "refresh") -> RefreshPolicy:
    """The policy named by ``text`` (None: the default); ``always`` whatever it says with
    ``fresh`` (``fresh=true`` asks for new noise, the strongest request, and every combination
    the API's schema allows is a valid request)."""
    if text is None:
        return RefreshPolicy(ALWAYS) if fresh else RefreshPolicy()
    if not isinstance(text, str) or re.fullmatch(REFRESH_PATTERN, text) is None:
        raise InvalidParameter(
            name, "must be on_new_version, always or max_age:<n><s|m|h|d|w> (e.g. max_age:7d)"
        )
    if text.startswith(MAX_AGE):
        amount = text.split(":", 1)[1]
        seconds = min(int(amount[:-1]) * _UNIT_SECONDS[amount[-1]], MAX_AGE_LIMIT_SECONDS)
        policy = RefreshPolicy(MAX_AGE, seconds)
    else:
        policy = RefreshPolicy(text)
    return RefreshPolicy(ALWAYS) if fresh else policy
