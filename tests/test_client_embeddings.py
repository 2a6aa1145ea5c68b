"""The typed client's embedding calls against the real service (``serve`` in a subprocess on
PostgreSQL + Redis, over real TCP, through a proxy that drops an answer where a test needs a
failure): DP-IE for one seed and many, the free embedding of a release, similar nodes; typed
answers and errors; a dropped answer retried with the same Idempotency-Key is charged once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from service.cli.common import served_graph_and_cap
from service.client import (
    AsyncPprClient,
    BudgetExhausted,
    EmbeddingAnswer,
    EmbeddingBatchAnswer,
    Forbidden,
    InvalidParameter,
    ModeNotAllowed,
    NoEmbeddingRelease,
    NoRelease,
    PprClient,
    SimilarAnswer,
    UnknownNode,
)
from service.config import Settings
from service.embeddings.all_node_release import EmbeddingRequest, release_embeddings
from tests.api_support import open_ledger
from tests.tcp_proxy import FlakyProxy
from tests.test_client import FAST, Service, running_service

# one server for the module (service): its tests run on one xdist worker
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.xdist_group("test_client_embeddings"),
]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, Path]]:
    tmp = tmp_path_factory.mktemp("client-embeddings")
    releases = tmp / "releases"
    releases.mkdir()
    env = {"PPR_EMBEDDING_RELEASE_DIR": str(releases)}
    with running_service(tmp, "postgres+redis", extra_env=env) as running:
        yield running, releases


def test_dp_ie_single_and_batch_are_typed_charged_once_and_replayed(
    service: tuple[Service, Path],
) -> None:
    running, _ = service
    account_id, key = running.service_account(modes=["edge"])
    with PprClient(running.url, key, retry=FAST) as ppr:
        first = ppr.embedding("7", k=8, epsilon=0.2, mode="edge")
        assert isinstance(first, EmbeddingAnswer) and len(first.embedding) == 8
        assert first.mechanism.name == "dp_instant_embedding" and first.mechanism.dimension == 8
        assert first.mechanism.sigma == 1e-3 and first.mechanism.score_grid is not None
        # the achieved epsilon, at most 0.2 and a hair below it: the scale (sigma n + the
        # snapping slack) / eps is rounded up to six significant digits
        assert 0.2 * (1 - 2.0**-10) <= first.epsilon_charged <= 0.2 and not first.replayed
        again = ppr.embedding(7, k=8, epsilon=0.2, mode="edge")
        assert again.replayed and again.embedding == first.embedding

        batch = ppr.embedding_batch(
            ["7", "8", "no-such-node"], k=8, epsilon=0.2, mode="edge", idempotency_key="emb-1"
        )
        assert isinstance(batch, EmbeddingBatchAnswer)
        seven, eight, missing = batch.items
        assert seven.ok and seven.replayed and seven.embedding == first.embedding
        assert eight.ok and not eight.replayed and eight.embedding is not None
        assert (
            eight.mechanism is not None and eight.mechanism.hash_salt == first.mechanism.hash_salt
        )
        assert batch.epsilon_charged == pytest.approx(first.epsilon_charged)
        assert not missing.ok and isinstance(missing.exception(), UnknownNode)
        with pytest.raises(UnknownNode):
            missing.raise_for_error()
        retried = ppr.embedding_batch(
            ["7", "8", "no-such-node"], k=8, epsilon=0.2, mode="edge", idempotency_key="emb-1"
        )
        assert [item.replayed for item in retried.items[:2]] == [True, True]
        assert retried.items[1].embedding == eight.embedding
        assert retried.epsilon_charged == 0.0
    charges = running.charges(account_id)
    assert sorted(c.seed for c in charges) == ["7", "8"]
    assert {c.mechanism for c in charges} == {"dp_instant_embedding"}


def test_a_dropped_answer_is_retried_with_the_same_key_and_charged_once(
    service: tuple[Service, Path],
) -> None:
    running, _ = service
    account_id, key = running.service_account(modes=["edge"])
    with (
        FlakyProxy(running.url, drop_answers=1) as proxy,
        PprClient(proxy.base_url, key, retry=FAST) as ppr,
    ):
        single = ppr.embedding("30", k=4, epsilon=0.1, mode="edge", fresh=True)
    assert single.replayed and single.epsilon_charged == 0  # the first attempt's release
    assert proxy.connections == 2 and len(proxy.dropped) == 1
    with (
        FlakyProxy(running.url, drop_answers=1) as proxy,
        PprClient(proxy.base_url, key, retry=FAST) as ppr,
    ):
        batch = ppr.embedding_batch(["31", "32"], k=4, epsilon=0.1, mode="edge", fresh=True)
    assert [item.replayed for item in batch.items] == [True, True]
    assert sorted(c.seed for c in running.charges(account_id)) == ["30", "31", "32"]


def test_the_free_embedding_and_its_errors(service: tuple[Service, Path]) -> None:
    running, _ = service
    with running.admin() as admin:
        user = admin.create_account("user", node_id="40", cap_epsilon=0.5)
    with PprClient(running.url, user.key.api_key, retry=FAST) as ppr:
        with pytest.raises(NoRelease):
            ppr.free_embedding("40", epsilon=0.1, mechanism="noisy_diffusion")
        ranked = ppr.ppr("40", epsilon=0.1, mechanism="noisy_diffusion")
        free = ppr.free_embedding("40", epsilon=0.1, mechanism="noisy_diffusion", k=16)
        assert free.mechanism.name == "instant_embedding_of_release"
        assert free.epsilon_charged == 0.0 and len(free.embedding) == 16
        assert free.source is not None and free.source.release_request_id == ranked.request_id
        with pytest.raises(Forbidden):
            ppr.embedding("41")  # another user's node
        with pytest.raises(InvalidParameter) as bad_k:
            ppr.embedding("40", k=0)
        assert bad_k.value.parameter == "k"
        with pytest.raises(InvalidParameter) as bad_sigma:
            ppr.embedding("40", sigma=5.0)
        assert bad_sigma.value.parameter == "sigma"
        ppr.embedding("40", epsilon=0.3, k=4)
        with pytest.raises(BudgetExhausted):
            ppr.embedding("40", epsilon=0.3, k=4, fresh=True)
    assert len(running.charges(user.account_id)) == 2  # the ranking and one embedding


def test_similar_nodes_from_an_all_node_release(service: tuple[Service, Path]) -> None:
    running, releases = service
    _, key = running.service_account(modes=["edge"])
    _, personalized_only = running.service_account(modes=["personalized"])
    with PprClient(running.url, key, retry=FAST) as ppr:
        with pytest.raises(NoEmbeddingRelease):
            ppr.similar("3")
        settings = Settings(database_url=running.backend.database_url)
        with open_ledger(running.backend.database_url) as ledger:
            graph, _ = served_graph_and_cap(running.backend.graph_path, settings, ledger)
            release_embeddings(
                ledger, graph, EmbeddingRequest(1.0, 16, 1e-2, 3), releases,
                cap=None, rng_factory=np.random.default_rng,
            )  # fmt: skip
        answer = ppr.similar("3", k=5)
        assert isinstance(answer, SimilarAnswer) and len(answer.results) == 5
        assert answer.release.mode == "edge" and answer.release.k == 16
        assert answer.epsilon_charged == 0.0
        with pytest.raises(UnknownNode):
            ppr.similar("no-such-node")
    with PprClient(running.url, personalized_only) as ppr, pytest.raises(ModeNotAllowed):
        ppr.similar("3")


def test_the_async_client_has_the_same_embedding_calls(service: tuple[Service, Path]) -> None:
    running, _ = service
    account_id, key = running.service_account(modes=["edge"])

    async def calls() -> tuple[EmbeddingAnswer, EmbeddingBatchAnswer]:
        async with AsyncPprClient(running.url, key, retry=FAST) as ppr:
            return await ppr.embedding("50", k=4, mode="edge"), await ppr.embedding_batch(
                ["51"], k=4, mode="edge"
            )

    import asyncio

    single, batch = asyncio.run(calls())
    assert len(single.embedding) == 4 and batch.items[0].ok
    assert len(running.charges(account_id)) == 2
