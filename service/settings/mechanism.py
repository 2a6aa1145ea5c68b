"""The mechanism's settings: how the noisy diffusion runs on this deployment's graph, the
bounds a query's epsilon and k must lie in and their defaults, the ranking a query gets when
it names none, the embeddings' default dimension and sigma bounds, the public bounds on the
graph (degree, edge count) and the budget of new accounts. Per deployment (one graph), never
taken from clients. :class:`MechanismSettings` also stands alone
(``MechanismSettings().account_delta``) where only these are needed."""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from service.bounds import CAP_EPSILON_MAX, CAP_EPSILON_MIN, DELTA_MAX, DELTA_MIN, BudgetPeriod
from service.embeddings.parameters import DEFAULT_EMBEDDING_SIGMA
from service.embeddings.parameters import DEFAULT_K as DP_IE_DEFAULT_K
from service.embeddings.parameters import MAX_K as DP_IE_MAX_K
from service.embeddings.parameters import MAX_SIGMA as DP_IE_MAX_SIGMA
from service.embeddings.parameters import MIN_SIGMA as DP_IE_MIN_SIGMA
from service.graph.public_bounds import DEFAULT_MAX_DEGREE_BOUND, MAX_DEGREE_BOUND_LIMIT
from service.mechanisms.registry import DEFAULT_MECHANISM, RankingMechanism


class MechanismSettings(BaseSettings):
    """How the noisy diffusion runs on this deployment's graph (clients cannot change these)."""

    model_config = SettingsConfigDict(env_prefix="PPR_", extra="ignore")

    beta: float = Field(0.8, gt=0.0, lt=1.0, description="Diffusion weight (teleport 1 - beta).")
    steps: int = Field(100, ge=1, le=10_000, description="Diffusion steps K.")
    eta: float = Field(1e-7, gt=0.0, description="Threshold per unit degree: t_i = eta d_i.")
    epsilon_min: float = Field(0.01, gt=0.0, description="Smallest epsilon a query may ask for.")
    epsilon_max: float = Field(2.0, gt=0.0, description="Largest epsilon a query may ask for.")
    default_epsilon: float = Field(0.1, gt=0.0, description="Epsilon of a query that names none.")
    default_delta: float = Field(
        1e-6, ge=DELTA_MIN, lt=DELTA_MAX,
        description="Delta of new accounts' budgets and of the query calibration (never "
        "derived from the graph; see PPR_EDGE_COUNT_BOUND).",
    )  # fmt: skip
    edge_count_bound: int | None = Field(
        None, ge=1,
        description="A public bound on the number of edges: when set, delta is "
        "min(PPR_DEFAULT_DELTA, 1 / this), and a graph with more edges is refused at load.",
    )  # fmt: skip
    max_degree_bound: int = Field(
        DEFAULT_MAX_DEGREE_BOUND, ge=1, le=MAX_DEGREE_BOUND_LIMIT,
        description="A public bound on every node's degree: the float64 margins of the "
        "diffusion's noise (kappa) and of DP-IE's sensitivity are computed from it, never from "
        "the graph's own largest degree; a graph with a node of higher degree is refused at load.",
    )  # fmt: skip
    default_cap_epsilon: float = Field(
        1.0, ge=CAP_EPSILON_MIN, le=CAP_EPSILON_MAX, description="Budget cap of new accounts."
    )
    default_period: BudgetPeriod | None = Field(
        None,
        description="Budget period of new accounts (UTC windows): with "
        "PPR_DEFAULT_PERIOD_CAP_EPSILON, a cap per period on top of the lifetime cap; unset: "
        "no period (the lifetime cap alone).",
    )
    default_period_cap_epsilon: float | None = Field(
        None, ge=CAP_EPSILON_MIN, le=CAP_EPSILON_MAX,
        description="Cap per PPR_DEFAULT_PERIOD of new accounts (set both or neither).",
    )  # fmt: skip
    max_k: int = Field(1000, ge=1, le=10_000, description="Largest k a query may ask for.")
    default_k: int = Field(20, ge=1, description="k of a query that names none.")
    default_mechanism: RankingMechanism = Field(
        DEFAULT_MECHANISM,
        description="Ranking of a query that names none (personalized mode); a "
        "personalized-only default is noisy_diffusion in edge mode.",
    )
    popular_epsilon: float = Field(
        0.1, gt=0.0, le=10.0,
        description="Epsilon of the one DP degree release per graph version behind `popular` "
        "and `blended` (counted once in the graph-wide exposure; each account receiving an "
        "answer built on it is charged it once per graph version).",
    )  # fmt: skip

    embedding_default_k: int = Field(
        DP_IE_DEFAULT_K, ge=1, le=DP_IE_MAX_K,
        description="Dimension k of an embedding request that names none (the paper's 256); "
        "k is bounded by PPR_MAX_K, as a ranking's, and by 4096.",
    )  # fmt: skip
    embedding_default_sigma: float = Field(
        DEFAULT_EMBEDDING_SIGMA, ge=DP_IE_MIN_SIGMA, le=DP_IE_MAX_SIGMA,
        description="PushFlowCap sensitivity sigma of a DP-IE request that names none (chosen "
        "by the sweep in docs/embeddings.md).",
    )  # fmt: skip
    embedding_min_sigma: float = Field(
        1e-5, ge=DP_IE_MIN_SIGMA, le=DP_IE_MAX_SIGMA,
        description="Smallest sigma a DP-IE request may ask for (below ~1e-5 only the seed "
        "enters the embedding on graphs of thousands of nodes).",
    )  # fmt: skip
    embedding_max_sigma: float = Field(
        DP_IE_MAX_SIGMA, ge=DP_IE_MIN_SIGMA, le=DP_IE_MAX_SIGMA,
        description="Largest sigma a DP-IE request may ask for (the noise scale is sigma n / eps).",
    )  # fmt: skip

    @model_validator(mode="after")
    def _ranges_agree(self) -> MechanismSettings:
        if self.epsilon_min > self.epsilon_max:
            raise ValueError("PPR_EPSILON_MIN must not exceed PPR_EPSILON_MAX")
        if not self.epsilon_min <= self.default_epsilon <= self.epsilon_max:
            raise ValueError("PPR_DEFAULT_EPSILON must lie in [PPR_EPSILON_MIN, PPR_EPSILON_MAX]")
        if self.default_k > self.max_k:
            raise ValueError("PPR_DEFAULT_K must not exceed PPR_MAX_K")
        if (self.default_period is None) != (self.default_period_cap_epsilon is None):
            raise ValueError("PPR_DEFAULT_PERIOD and PPR_DEFAULT_PERIOD_CAP_EPSILON go together")
        if self.embedding_default_k > self.max_k:
            raise ValueError("PPR_EMBEDDING_DEFAULT_K must not exceed PPR_MAX_K")
        if not (
            self.embedding_min_sigma <= self.embedding_default_sigma <= self.embedding_max_sigma
        ):
            raise ValueError(
                "PPR_EMBEDDING_DEFAULT_SIGMA must lie in "
                "[PPR_EMBEDDING_MIN_SIGMA, PPR_EMBEDDING_MAX_SIGMA]"
            )
        return self

    @property
    def default_budget_period(self) -> tuple[str, float] | None:
        """(period, cap) of new accounts, or None (no period)."""
        if self.default_period is None or self.default_period_cap_epsilon is None:
            return None
        return (self.default_period, self.default_period_cap_epsilon)

    @property
    def account_delta(self) -> float:
        """Delta of new accounts and of calibration: from configuration only, never the graph."""
        if self.edge_count_bound is None:
            return self.default_delta
        return min(self.default_delta, 1.0 / self.edge_count_bound)
