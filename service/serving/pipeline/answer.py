"""Answering: a fresh answer from its stored release, ``popular`` answers, post-processing.

Everything here is post-processing of a release that is stored (or, for ``popular``, of the
graph version's stored degree release): the top k, without the seed's neighbours if asked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from service.graph.model import Graph
from service.ledger.ledger import Ledger
from service.ledger.records import ChargeReceipt, DegreeCharge, StoredRelease
from service.mechanisms.postprocess import ranked_results
from service.mechanisms.registry import RankingMechanism
from service.serving.pipeline.admit import Admitter
from service.serving.pipeline.errors import IdempotencyKeyReused
from service.serving.pipeline.items import Pending
from service.serving.pipeline.reads import ReadFigure
from service.serving.pipeline.results import post_process
from service.serving.rankings import DegreeReleases, degree_block, degree_release_name
from service.serving.schemas import Answer, QueryRequest

if TYPE_CHECKING:
    from service.serving.pipeline.replay import Replayer


def fresh_answer(p: Pending, receipt: ChargeReceipt, stored: StoredRelease) -> Answer:
    """The answer of this query's own release, once stored."""
    return Answer(
        node=p.req.node,
        graph_version=p.graph.version,
        results=post_process(stored.results, p.req, p.graph, p.seed),
        mechanism=stored.mechanism,
        budget=receipt.budget,
        replayed=False,
        request_id=p.req.request_id,
        charged_account_id=p.account_id,
        epsilon_charged=p.plan.epsilon + receipt.degree_epsilon,
    )


class PopularAnswers:
    """``popular``: the graph version's one degree release, ranked."""

    def __init__(
        self,
        *,
        ledger: Ledger,
        degree_releases: DegreeReleases,
        reads: ReadFigure,
        admitter: Admitter,
        replayer: Replayer,
    ) -> None:
        self.ledger = ledger
        self.degree_releases = degree_releases
        self.reads = reads
        self.admitter = admitter
        self.replayer = replayer

    def answer(self, req: QueryRequest, graph: Graph, seed: int, account_id: int) -> Answer:
        """``popular``: the version's one degree release, ranked. Post-processing of a stored
        graph-wide release, which the charged account pays for once per graph version (the
        first time it receives an answer built on it; refused past its cap like any charge);
        nothing new is stored. An Idempotency-Key is bound in that admission's transaction to
        this query (node, mode, the account's charge for the release): a retry is the same
        ranking of the same release, ``replayed``; any other query under the key is 422."""
        if req.idempotency_key is not None:
            stored = self.replayer.release_for_idempotency_key(req)
            if stored is not None:  # the key belongs to a charged query
                raise IdempotencyKeyReused()
        degrees = self.degree_releases.get(graph, self.admitter.graph_cap(graph))
        if req.principal.type == "service":
            self.reads.record(req, graph.version, None, degree_release_name(degrees.plan.scale))
        receipt = self.ledger.quota_and_degree.admit_degree_release(
            charged_account_id=account_id,
            principal_account_id=req.principal.account_id,
            seed=req.node,
            mode=req.mode.value,
            degree=DegreeCharge(graph.version, degrees.plan.epsilon, degrees.curve),
            request_id=req.request_id,
            quota_epsilon=self.admitter.quota_for(req.principal, account_id),
            idempotency_key=req.idempotency_key,
        )
        extra = int(graph.degrees[seed]) if req.exclude_neighbors else 0
        results = ranked_results(
            graph, seed, degrees.values, req.k + extra, grid=degrees.grid,
            exclude_neighbors=req.exclude_neighbors,
        )  # fmt: skip
        mechanism = {
            "name": RankingMechanism.POPULAR.value,
            "mode": req.mode.value,
            "epsilon": degrees.plan.epsilon,
            "delta": degrees.delta,
            "sensitivity": degrees.plan.sensitivity,
            "noise_scale": degrees.plan.scale,
            "score_grid": degrees.grid,
            **degree_block(degrees),
        }
        return Answer(
            node=req.node,
            graph_version=graph.version,
            results=results[: req.k],
            mechanism=mechanism,
            budget=receipt.budget,
            replayed=receipt.replayed,
            request_id=req.request_id,
            charged_account_id=account_id,
            epsilon_charged=degrees.plan.epsilon if receipt.charged else 0.0,
        )
