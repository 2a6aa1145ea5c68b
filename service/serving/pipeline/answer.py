"""The answer stage: a fresh answer from its stored release, ``popular`` answers.

Everything here is post-processing of a release that is stored (or, for ``popular``, of the
graph version's stored degree release): the top k, without the seed's neighbours if asked.
"""

from __future__ import annotations

from service.ledger.records import ChargeReceipt, DegreeReceipt, StoredRelease
from service.mechanisms.postprocess import ranked_results
from service.mechanisms.registry import RankingMechanism
from service.serving.pipeline.items import Pending, PopularPending
from service.serving.pipeline.results import post_process
from service.serving.rankings import degree_block
from service.serving.schemas import Answer


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


def popular_answer(p: PopularPending, receipt: DegreeReceipt) -> Answer:
    """``popular``: the version's one degree release, ranked. Post-processing of a stored
    graph-wide release, which the charged account pays for once per graph version (the first
    time it receives an answer built on it: the admit stage's); nothing new is stored. Under
    an Idempotency-Key bound to this same query already (node, mode, the account's charge for
    the release) the answer is ``replayed``."""
    req, graph, seed, degrees = p.req, p.graph, p.seed, p.degrees
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
        charged_account_id=p.account_id,
        epsilon_charged=degrees.plan.epsilon if receipt.charged else 0.0,
    )
