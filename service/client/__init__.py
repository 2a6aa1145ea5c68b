"""A typed Python client of the service, sync (:class:`PprClient`) and asyncio
(:class:`AsyncPprClient`), on httpx.

It needs only httpx and pydantic (nothing of the server is imported)::

    from service.client import PprClient, BudgetExhausted

    with PprClient("http://127.0.0.1:8000", api_key) as ppr:
        answer = ppr.ppr("42", k=20, epsilon=0.1, mode="edge")

Each charged call (``ppr``, ``batch``, ``embedding``, ``embedding_batch``) carries an
Idempotency-Key (the caller's, or a fresh UUID per call) that every retry reuses, so the
service charges it at most once. Errors are typed per error code
(:mod:`service.client.errors`); :class:`RetryPolicy` says what is retried.
"""

from service.client.clients import DEFAULT_TIMEOUT, AsyncPprClient, PprClient
from service.client.embedding_models import *  # noqa: F403
from service.client.embedding_models import __all__ as _embedding_models
from service.client.errors import *  # noqa: F403
from service.client.errors import __all__ as _errors
from service.client.models import *  # noqa: F403
from service.client.models import __all__ as _models
from service.client.retry import NO_RETRY, RetryPolicy

__all__ = [
    "DEFAULT_TIMEOUT",
    "NO_RETRY",
    "AsyncPprClient",
    "PprClient",
    "RetryPolicy",
    *_errors,
    *_models,
    *_embedding_models,
]
