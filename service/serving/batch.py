"""Many seeds in one call: each item is admitted, charged and answered with the same checks
as a single query, all items in one admission transaction and one storing transaction
(:meth:`PprQueryService.answer_many`), their draws concurrently, so that they share the engine
with each other and with single queries; a failing item becomes that item's error, never the
call's.

One Idempotency-Key for the batch gives every item its own key, derived from the batch key,
the item's position and its node, bound like a single query's key to the item's first answer
(charged or replayed); a retried batch therefore charges each item at most once and answers
every item with the release it first returned.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from service.errors import Forbidden, ServiceError
from service.privacy.modes import Mode
from service.serving.ppr_query import PprQueryService
from service.serving.schemas import Answer, Principal, QueryRequest

log = logging.getLogger(__name__)


def item_idempotency_key(batch_key: str, index: int, node: str) -> str:
    """The Idempotency-Key of item ``index`` (seed ``node``) of a batch sent with ``batch_key``:
    deterministic, distinct per position and node, and within the single-query key's limits."""
    digest = hashlib.sha256(f"{batch_key}\x00{index}\x00{node}".encode()).hexdigest()
    return f"batch-{digest[:48]}"


@dataclass(frozen=True)
class BatchRequest:
    principal: Principal
    nodes: Sequence[str]
    k: int
    epsilon: float | None
    mode: Mode
    fresh: bool = False
    exclude_neighbors: bool = False
    idempotency_key: str | None = None
    request_id: str = ""
    mechanism: str | None = None
    max_age_seconds: int | None = None  # the refresh policy's (service.serving.refresh)

    def item(self, index: int) -> QueryRequest:
        node = self.nodes[index]
        key = self.idempotency_key
        return QueryRequest(
            principal=self.principal,
            node=node,
            k=self.k,
            epsilon=self.epsilon,
            mode=self.mode,
            fresh=self.fresh,
            exclude_neighbors=self.exclude_neighbors,
            idempotency_key=None if key is None else item_idempotency_key(key, index, node),
            request_id=f"{self.request_id}.{index}",
            mechanism=self.mechanism,
            max_age_seconds=self.max_age_seconds,
        )


A = TypeVar("A")


@dataclass(frozen=True)
class BatchItem(Generic[A]):
    """One item's outcome: an answer (a ranking's, an embedding's), or the error it alone
    failed with."""

    node: str
    answer: A | None = None
    error: ServiceError | None = None


class InternalItemError(ServiceError):
    code = "internal_error"
    status = 500


def batch_items(
    nodes: Sequence[str], request_id: str, outcomes: Sequence[A | BaseException]
) -> list[BatchItem[A]]:
    """The items of a batch from its queries' outcomes, in order: an unexpected failure is
    logged and becomes that item's ``internal_error``, naming the item's request id."""
    items: list[BatchItem[A]] = []
    for index, (node, outcome) in enumerate(zip(nodes, outcomes, strict=True)):
        if isinstance(outcome, ServiceError):
            items.append(BatchItem(node, error=outcome))
        elif isinstance(outcome, BaseException):
            log.error(
                "batch item failed", exc_info=outcome, extra={"request_id": f"{request_id}.{index}"}
            )
            error = InternalItemError(
                "this item failed unexpectedly and returned no answer. Quote request id "
                f"{request_id}.{index} to the operator"
            )
            items.append(BatchItem(node, error=error))
        else:
            items.append(BatchItem(node, answer=outcome))
    return items


class BatchQueryService:
    """Answers the items of a batch on a bounded pool of threads shared by all batches."""

    def __init__(self, queries: PprQueryService, *, concurrency: int) -> None:
        self.queries = queries
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="ppr-batch")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run_all(self, thunks: list[Callable[[], Any]]) -> list[Any]:
        """Each thunk's result or exception, in order, run on the shared pool (so the engine
        computes them together)."""

        def guarded(thunk: Callable[[], Any]) -> Any:
            try:
                return thunk()
            except Exception as exc:
                return exc

        futures = [self._pool.submit(guarded, thunk) for thunk in thunks]
        return [future.result() for future in futures]

    def answer(self, request: BatchRequest) -> list[BatchItem[Answer]]:
        """Every item's outcome, in the order of ``request.nodes``.

        All items are admitted and charged in one ledger transaction and their releases are
        stored in one (:meth:`PprQueryService.answer_many`); the draws run concurrently.
        """
        if not request.nodes:
            return []
        if request.principal.type == "admin":
            raise Forbidden("admin accounts manage budgets and cannot query")
        # Parameters shared by every item are checked once, so a bad k or epsilon is one
        # error for the whole call rather than one per item.
        self.queries.validate(request.item(0))
        items = [request.item(i) for i in range(len(request.nodes))]
        outcomes = self.queries.answer_many(items, self.run_all)
        return batch_items(request.nodes, request.request_id, outcomes)
