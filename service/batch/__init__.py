"""Batch precompute of private recommendations (or DP-IE embeddings, ``--output embeddings``)
for many users (``python -m service batch``).

Every seed is answered on the API's own path (:meth:`PprQueryService.answer`: authorize, admit
and charge in one ledger transaction, fresh-noise release, stored release), exactly once per
run: see :mod:`service.batch.worker`. Engines: a local process pool or Ray
(:mod:`service.batch.engines`); sinks: Parquet, Redis, a SQL table (:mod:`service.batch.sinks`).
"""

from service.batch.run import BatchOptions, BatchSummary, run_batch, summary_lines
from service.batch.spec import BatchSpec, FailureInjection, SeedOutcome, seed_idempotency_key

__all__ = [
    "BatchOptions",
    "BatchSpec",
    "BatchSummary",
    "FailureInjection",
    "SeedOutcome",
    "run_batch",
    "seed_idempotency_key",
    "summary_lines",
]
