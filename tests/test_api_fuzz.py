"""Schemathesis over every endpoint with a user, a service and an admin key, on the embedded
default (SQLite, in-process caches) and on PostgreSQL + Redis: no 5xx, and every response as
the schema documents it. Here: one generated example per operation, mode and key on each backend,
and every boundary-value (coverage) case once, on one of the two backends (the operations taken
in turn), each with one key the operation is not refused to. ``make fuzz``
(``PPR_FUZZ_EXAMPLES`` set) sends every coverage case on both backends with every key, and many
more examples."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from tests.api_fuzz import fuzz_app
from tests.api_support import Backend, running_app
from tests.conftest import SUMMARY_PROPERTY
from tests.test_api import Accounts, backend  # fixtures by name

EXAMPLES = int(os.environ.get("PPR_FUZZ_EXAMPLES", "1"))
#: ``make fuzz``: every coverage case with every key, not only with one the operation allows.
FULL = "PPR_FUZZ_EXAMPLES" in os.environ
#: Which operations send their coverage cases on each backend: (i, parts), the operations
#: numbered i modulo parts (``make fuzz``: all of them on both).
COVERAGE_SHARES = {"sqlite": (0, 2), "postgres+redis": (1, 2)}


@pytest.mark.slow
# Schemathesis's own strategies use the random module; not this project's code.
@pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning")
def test_no_5xx_and_every_response_matches_the_schema(
    backend: Backend, record_property: Callable[[str, object], None]
) -> None:
    # A generous rate limit of its own keeps the generated traffic from being mostly 429s.
    with running_app(backend, rate_limit_per_second=0) as client:
        accounts = Accounts(client)
        _, user_key = accounts.user("5", cap_epsilon=1000.0)
        _, service_key = accounts.service(modes=["edge", "personalized"])
        keys = {"user": user_key, "service": service_key, "admin": accounts.admin_key}
        report = fuzz_app(
            client,
            keys,
            examples=EXAMPLES,
            own_nodes={"user": "5", "service": "7"},
            coverage_with_every_key=FULL,
            coverage_share=(0, 1) if FULL else COVERAGE_SHARES[backend.name],
        )
    coverage = (
        "every coverage case with every key"
        if FULL
        else "coverage cases of every other operation with one key"
    )
    title = (
        f"schemathesis on {backend.name}, {EXAMPLES} examples per operation, mode and key, "
        f"{coverage}"
    )
    record_property(SUMMARY_PROPERTY, report.table(title))
    assert report.requests > 0
    assert report.server_errors == 0, report.table(backend.name)
    assert not report.failures, report.table(backend.name)
