"""What a batch run is: its parameters, each seed's Idempotency-Key, and each seed's outcome.

A run is named by its run id and pinned to one graph version. Every seed's query carries an
Idempotency-Key derived from (run id, graph version, node, mode, epsilon), under the principal
that asks (the service account, or the seed's own user account when the operator runs the
job). The ledger's unique index on (principal, Idempotency-Key) over live charges makes the
seed's charge happen at most once however often a block is retried or the run is rerun: a
retry finds the stored release and replays it for free.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Literal

from service.config import Settings
from service.errors import InvalidParameter
from service.mechanisms.registry import RankingMechanism
from service.privacy.modes import Mode
from service.serving.schemas import Principal

#: What a run id may look like: it is part of request ids and audit rows.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,63}")

#: Error codes that mean "this user has no budget left for this query" (skipped, counted).
BUDGET_CODES = frozenset({"budget_exhausted", "service_quota_exhausted", "graph_budget_exhausted"})
#: The seed's user account does not exist (and the run may not create it).
NO_ACCOUNT_CODE = "unknown_account"

Status = Literal["answered", "replayed", "skipped", "failed"]
#: What a run produces per seed: a ranking, or a DP-IE embedding (``--output embeddings``).
Output = Literal["rankings", "embeddings"]


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidParameter(
            "--run-id",
            f"must be 1-64 characters of letters, digits and . _ : - (starting with a letter or "
            f"digit), got {run_id!r}",
        )
    return run_id


def seed_idempotency_key(
    run_id: str,
    graph_version: str,
    node: str,
    mode: Mode,
    epsilon: float,
    mechanism: str | None = None,
) -> str:
    """The Idempotency-Key of ``node``'s query in run ``run_id`` on ``graph_version``.

    ``mechanism`` is None for the served default (the key is then the one runs made before a
    mechanism could be chosen, so they resume), else the mechanism the run was asked for.
    """
    parts = ["batch-run", run_id, graph_version, node, mode.value, repr(epsilon)]
    text = "\x1f".join(parts if mechanism is None else [*parts, mechanism])
    return "batchrun-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:48]


def seed_request_id(run_id: str, invocation: str, node: str) -> str:
    """The request id recorded on the seed's charge and release: names the run (and which
    invocation of it, so a release stored by a lost attempt of this same invocation counts as
    charged by it) in the audit trail."""
    return f"batch:{run_id}:{invocation}:{node}"


@dataclass(frozen=True)
class FailureInjection:
    """TEST ONLY (never reachable from the command line or HTTP): make one block's attempt
    fail after ``after`` seeds of it were stored, on the next seed, after its charge was
    admitted and its noise drawn but before its release is stored (the worst moment).

    ``kill`` ends the worker process (``os._exit``), as an OOM kill or a lost machine would;
    otherwise the attempt raises :class:`InjectedFailure`. With ``marker`` (a file path) the
    failure fires once across all attempts and processes (the first to create the file).
    """

    block: int
    after: int = 0
    kill: bool = True
    marker: str | None = None


class InjectedFailure(RuntimeError):
    """Raised by a :class:`FailureInjection` that does not kill its process."""


@dataclass(frozen=True)
class BatchSpec:
    """Everything a worker needs to answer blocks of a run (picklable, sent to every worker)."""

    run_id: str
    graph_version: str
    mode: Mode
    epsilon: float
    k: int
    settings: Settings  # ledger URL, mechanism, caches, admission policy
    #: The principal asking for every seed; None: each seed's own user account (operator run).
    service_account: Principal | None = None
    fresh: bool = False
    #: A stored release at least this old is drawn anew (the refresh policy's max_age).
    max_age_seconds: int | None = None
    exclude_neighbors: bool = False
    create_missing_accounts: bool = False
    graph_path: str | None = None  # where a local worker loads the graph from; None: demo
    #: Random per invocation of the command (reruns of a run id get new ones).
    invocation: str = "0"
    #: The ranking every seed gets (resolved: never None in a run).
    mechanism: str = RankingMechanism.NOISY_DIFFUSION.value
    #: Whether ``mechanism`` was named by the operator (else: the served default).
    mechanism_chosen: bool = False
    #: ``embeddings``: every seed gets a DP-IE embedding of dimension ``k`` at ``sigma``
    #: (``mechanism`` is then ``dp_instant_embedding``), on the embedding endpoint's path.
    output: Output = "rankings"
    sigma: float = 0.0
    failure: FailureInjection | None = field(default=None, compare=False)

    def request_id(self, node: str) -> str:
        return seed_request_id(self.run_id, self.invocation, node)

    def idempotency_key(self, node: str) -> str:
        if self.output == "embeddings":  # another k or sigma is another release, another key
            from service.embeddings.release import embedding_key_mechanism

            chosen: str | None = embedding_key_mechanism(self.k, self.sigma)
        else:
            chosen = self.mechanism if self.mechanism_chosen else None
        return seed_idempotency_key(
            self.run_id, self.graph_version, node, self.mode, self.epsilon, chosen
        )


@dataclass(frozen=True)
class SeedOutcome:
    """One seed's result: its released ranking (or embedding), or why it has none."""

    node: str
    status: Status
    results: tuple[tuple[str, float], ...] = ()
    #: ``--output embeddings``: the released coordinates, the version's hash salt (hex) and
    #: the grid every coordinate is a multiple of.
    embedding: tuple[float, ...] = ()
    hash_salt: str | None = None
    score_grid: float | None = None
    epsilon_charged: float = 0.0
    code: str | None = None  # skipped / failed: the error code
    message: str | None = None


@dataclass(frozen=True)
class BlockResult:
    """A block's outcomes, in its seeds' order, and the dead charges its attempt refunded."""

    index: int
    outcomes: list[SeedOutcome]
    reconciled: int = 0
    cpu_seconds: float = 0.0  # the worker process's CPU time for this block (all its threads)


@dataclass(frozen=True)
class BlockFailure:
    """A block that failed on every attempt: its seeds are counted failed."""

    index: int
    nodes: list[str]
    error: str
    attempts: int
