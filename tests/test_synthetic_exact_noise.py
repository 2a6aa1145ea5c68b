"""Every synthetic generator draws its releases with the project's exact samplers.

Each method runs end to end (the release path ``synthesize`` and the admin job take, and the
evaluation's) with its release draws taken from a generator whose every method but
``bit_generator`` raises: no ``laplace``, ``normal``, ``random``, ``exponential``, ``gumbel``,
``uniform``, ``standard_*`` or any other float sampler touches a number computed from the
graph. The public choices and the post-processing (node orders, walks, the random rounding and
placement of edges) draw from an ordinary generator: chosen without the data, or functions of the
releases. The words-only generator is checked to have been read, so a release that bypassed it
would be caught too. Before, ``communities`` drew numpy's ``Generator.laplace`` for its counts
and ``privdpr`` ``Generator.normal`` for its gradient noise.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import scipy.sparse as sp

import service.serving.rankings as rankings
from service.evaluation.options import SYNTHETIC_METHODS
from service.evaluation.synthetic import SyntheticSettings, synthesize
from service.graph.generate import generate_graph
from service.ledger import Ledger
from service.serving.rankings import DegreeReleases, degree_release_name
from service.synthetic.privdpr import PrivdprParams
from service.synthetic.release import METHODS, Request, synthesize_release

TINY_PRIVDPR = PrivdprParams(
    embedding_dim=8, hidden_dim=4, start_nodes=4, walks=1, walk_length=3, epochs=1,
    score_rounds=1,
)  # fmt: skip


class WordsOnly(np.random.Generator):  # numpy's type is immutable: subclass it
    """Only its raw 64-bit words may be read (the exact samplers' sole input)."""

    def __getattribute__(self, attribute: str) -> Any:
        if attribute != "bit_generator":
            raise AssertionError(f"a float sampler drew a release: Generator.{attribute}")
        return super().__getattribute__(attribute)


class Made:
    """The words-only generators handed out, to check that each was read."""

    def __init__(self) -> None:
        self.generators: list[tuple[WordsOnly, dict[str, Any]]] = []

    def __call__(self) -> np.random.Generator:
        bits = np.random.PCG64DXSM()
        made = WordsOnly(bits)
        self.generators.append((made, bits.state))
        return made

    def all_read(self) -> bool:
        return bool(self.generators) and all(
            gen.bit_generator.state != start for gen, start in self.generators
        )


def _graph() -> Any:
    return generate_graph(80, 400, seed=3)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("ledger_url", ["sqlite"], indirect=True)
def test_every_published_method_draws_its_releases_from_raw_words(
    method: str, ledger: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph = _graph()
    made = Made()
    degrees = None
    if method == "chung_lu":  # its one release is the version's degree release
        monkeypatch.setattr(rankings, "fresh_generator", made)
        releases = DegreeReleases(ledger, 0.5)

        def degrees() -> tuple[np.ndarray, str]:
            return releases.get(graph).values, degree_release_name(releases.plan.scale)

    request = Request(method, 1.0, privdpr=TINY_PRIVDPR)
    out = tmp_path / "synthetic.txt"
    release = synthesize_release(
        ledger, graph, request, out, cap=None, degrees=degrees,
        rng_factory=np.random.default_rng, noise_factory=made,
    )  # fmt: skip
    assert release.edges > 0 and out.read_bytes()
    assert made.all_read()  # the releases were drawn from the words-only generator


@pytest.mark.parametrize("method", SYNTHETIC_METHODS)
def test_every_evaluated_method_draws_its_releases_from_raw_words(method: str) -> None:
    graph = _graph()
    csr = sp.csr_matrix((np.ones(graph.indices.size), graph.indices, graph.indptr))
    made = Made()
    settings = SyntheticSettings(privdpr=TINY_PRIVDPR)
    u, v = synthesize(method, csr, 1.0, settings, np.random.default_rng(1), noise=made())
    assert u.size > 0 and np.all(u < v)
    assert made.all_read()


def test_the_guard_catches_a_float_sampler() -> None:
    """The control: a release drawn with ``Generator.laplace`` (what ``communities`` did)."""
    with pytest.raises(AssertionError, match=r"Generator\.laplace"):
        WordsOnly(np.random.PCG64DXSM()).laplace(0.0, 1.0, 3)
