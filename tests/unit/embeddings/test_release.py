"""The embedding release's stored form, key and statement (service/embeddings/release.py)."""

from __future__ import annotations

import math

import numpy as np

from service.embeddings.dp import plan_dp_instant_embedding
from service.embeddings.hashing import embedding_hashes
from service.embeddings.release import (
    DP_IE,
    embedding_key_mechanism,
    free_embedding_of,
    is_embedding_release,
    mechanism_block,
    released_vector,
    stored_embedding,
    stored_values,
)
from service.ledger.release_format import decode_results, encode_results
from service.mechanisms.postprocess import RankedNode, score_grid
from service.privacy.modes import Mode
from tests.graph_helpers import graph_from_edges


def test_the_stored_form_keeps_every_coordinate_bit_for_bit() -> None:
    values = np.array([0.1, -3.25, 1e-300, -0.0, 7.0, math.pi])
    stored = decode_results(encode_results(stored_embedding(values)))
    assert np.asarray(stored_values(stored)).tobytes() == values.tobytes()


def test_the_release_key_names_k_and_sigma_exactly() -> None:
    keys = {embedding_key_mechanism(k, s) for k in (8, 256) for s in (1e-3, 1.0000001e-3, 0.1)}
    assert len(keys) == 6
    assert all(is_embedding_release(k) for k in keys) and is_embedding_release(DP_IE)
    assert not is_embedding_release("noisy_diffusion")


def test_the_statement_gives_delta_zero_for_the_exact_sampler() -> None:
    plan = plan_dp_instant_embedding(0.5, 1e-3, 1000, rounds=100, degree_bound=10_000)
    block = mechanism_block(plan, Mode.EDGE, 1e-3, 64, 0.9, 100, "ab" * 16)
    assert block["name"] == DP_IE and block["mode"] == "edge" and block["dimension"] == 64
    assert block["noise_scale"] == plan.scale and block["score_grid"] == score_grid(plan.scale)
    assert block["delta"] == 0.0  # exact noise on the snapped vector: pure eps-DP
    assert block["sensitivity"] == plan.sensitivity > 1e-3 * 1000
    assert math.isclose(block["alpha"], 0.1)


def test_the_free_embedding_reads_the_stored_entries_only_and_never_the_seed() -> None:
    graph = graph_from_edges(((0, 1), (1, 2), (2, 3), (3, 4)), 6)
    stored = [RankedNode("2", 0.5), RankedNode("4", -0.2), RankedNode("0", 9.0)]
    vector = released_vector(graph, stored, graph.index_of("0"))
    expected = np.zeros(6)
    expected[graph.index_of("2")] = 0.5
    expected[graph.index_of("4")] = -0.2
    np.testing.assert_array_equal(vector, expected)
    hashes = embedding_hashes([str(v) for v in graph.external_ids(np.arange(6))], bytes(16), 4)
    w = free_embedding_of(graph, stored, graph.index_of("0"), hashes, normalize=False)
    z = np.log(6 * 0.5)  # only node 2 is above 1/n once clipped
    assert np.abs(w).sum() == z and w[hashes.buckets[graph.index_of("2")]] == (
        hashes.signs[graph.index_of("2")] * z
    )
