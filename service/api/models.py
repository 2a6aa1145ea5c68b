"""Response and request bodies of the HTTP API (pydantic; they are the OpenAPI schema)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from service.api.figures import ComposedFigure
from service.api.params import (
    BoolField,
    CapEpsilonField,
    DeltaField,
    GraphFileField,
    LabelField,
    NodeIdField,
    QuotaEpsilonField,
)
from service.bounds import BudgetPeriod
from service.ledger.records import (
    AccountRecord,
    ApiKeyRecord,
    BudgetView,
    ChargeRecord,
    ReadView,
)
from service.serving.embedding_query import EmbeddingAnswer
from service.serving.schemas import Answer, ChargedAnswer


class Result(BaseModel):
    node: str = Field(description="External node id, as in the edge list.")
    score: float = Field(
        description="Released score: noisy, clipped at 0, an integer multiple of "
        "`mechanism.score_grid`."
    )


class Mechanism(BaseModel):
    """What produced the answer, with its parameters. Fields that do not apply to a mechanism
    are absent."""

    name: Literal[
        "noisy_diffusion",
        "popular",
        "common_neighbours",
        "friends_of_friends",
        "blended",
        "synthetic_exact",
    ] = Field(
        description="`noisy_diffusion` (the diffusion of the spec), `popular` (the graph "
        "version's one DP degree release, ranked), `common_neighbours` (|N(s) & N(v)| + "
        "Laplace(2/eps) on every node, personalized only), `friends_of_friends` (the same "
        "counts with Laplace(2/eps) on the seed's friends and Laplace(1/eps) on everyone else, "
        "friends first, personalized only) or `blended` (those two-scale counts and the "
        "degrees blended by a hold-out check on the seed's own friends, personalized only); "
        "see docs/ranking.md. `synthetic_exact` only in a sandbox: exact PPR on a synthetic "
        "release (docs/synthetic.md)."
    )
    mode: Literal["personalized", "edge"]
    epsilon: float = Field(
        description="The guarantee this answer's noise gives at `delta` (for `popular`: the "
        "degree release's, paid once per graph version by the graph-wide exposure; for "
        "`synthetic_exact`: the synthetic release's, paid once by each account that receives "
        "an answer computed from it)."
    )
    delta: float = Field(
        description="The delta of this answer's guarantee; for the Laplace count releases, "
        "what the float64 sampler adds (tiny; docs/privacy.md)."
    )
    beta: float | None = Field(None, description="noisy_diffusion: diffusion weight.")
    steps: int | None = Field(None, description="noisy_diffusion: diffusion steps K.")
    noisy_steps: int | None = Field(
        None, description="noisy_diffusion: steps that carry noise (the last L of `steps`)."
    )
    eta: float | None = Field(None, description="noisy_diffusion: threshold per unit degree.")
    noise_scale: float = Field(
        description="Laplace scale b: per node per noisy step (noisy_diffusion), of the "
        "common-neighbour counts (common_neighbours; for friends_of_friends and blended: of "
        "the seed's friends' counts) or of the degrees (popular)."
    )
    sensitivity: float | None = Field(
        None,
        description="Laplace mechanisms: the l1 sensitivity b is calibrated to (2; for "
        "friends_of_friends and blended: of the friends' counts).",
    )
    friend_noise_scale: float | None = Field(
        None,
        description="friends_of_friends, blended: Laplace scale of the seed's friends' counts "
        "(2/eps, the common_neighbours scale).",
    )
    candidate_noise_scale: float | None = Field(
        None,
        description="friends_of_friends, blended: Laplace scale of every other node's count "
        "(half the friends' scale: one protected edge moves one such count by 1, or two "
        "friends' counts, never both).",
    )
    candidate_sensitivity: float | None = Field(
        None,
        description="friends_of_friends, blended: l1 sensitivity of the candidates' counts (1).",
    )
    degree_epsilon: float | None = Field(
        None, description="popular, blended: epsilon of the graph version's degree release."
    )
    degree_noise_scale: float | None = Field(
        None, description="popular, blended: Laplace scale of the degree release."
    )
    degree_delta: float | None = Field(
        None,
        description="popular, blended: delta of the degree release (what the float64 Laplace "
        "sampler adds; docs/privacy.md).",
    )
    degree_release: str | None = Field(
        None, description="popular, blended: how the degree release is charged."
    )
    release: str | None = Field(
        None, description="synthetic_exact: the synthetic release the answer is computed from."
    )
    privacy_unit: str | None = Field(
        None, description="synthetic_exact: what the release protects (`edge` or `node`)."
    )
    release_charge: str | None = Field(
        None, description="synthetic_exact: how the release is charged to the accounts."
    )
    weight: float | None = Field(
        None, description="blended: weight of the common-neighbour signal the hold-out chose."
    )
    reliability_counts: float | None = Field(
        None,
        description="blended: share of the top candidates' counts that is signal (above what "
        "pure noise would give).",
    )
    reliability_degrees: float | None = Field(
        None,
        description="blended: share of the degree release's spread that is signal (public, "
        "one value per graph version).",
    )
    counts_signal: bool | None = Field(
        None,
        description="blended: whether the counts carry signal among the candidates (a 5% "
        "test on the largest candidate count); without it the weight of the counts is at most "
        "0.5.",
    )
    score_grid: float | None = Field(
        default=None,
        description="Every released score is an exact integer multiple of this power of two "
        "(about 1/256 of the Laplace scale behind the scores, in their units), so no "
        "low-order bit of a floating-point noise sample is released. Absent only on answers "
        "released before rounding was introduced.",
    )


Period = BudgetPeriod
#: The budget's fields present only when the account has a budget period.
PERIOD_FIELDS = (
    "period", "period_cap_epsilon", "period_spent_epsilon", "period_remaining_epsilon",
    "period_started_at", "period_resets_at",
)  # fmt: skip


class Budget(BaseModel):
    """An account's budget: the lifetime figure (``spent_epsilon``, every live charge
    composed) and, only when the account has a budget period, the current period's."""

    account_id: int
    spent_epsilon: ComposedFigure = Field(
        description="Composed by the RDP accountant at `delta` (null: infinite)."
    )
    cap_epsilon: float
    remaining_epsilon: float
    delta: float
    charges: int
    period: Period | None = Field(
        None, description="Budget period (UTC windows); absent: none, the lifetime cap alone."
    )
    period_cap_epsilon: float | None = Field(None, description="Cap per period.")
    period_spent_epsilon: ComposedFigure | None = Field(
        None, description="The live charges of the current period composed at `delta`."
    )
    period_remaining_epsilon: float | None = None
    period_started_at: str | None = Field(None, description="ISO 8601, UTC.")
    period_resets_at: str | None = Field(
        None, description="When the period cap renews (ISO 8601, UTC)."
    )

    # No return annotation: with one, pydantic would describe the serialized budget by it (an
    # empty schema for Any) instead of by the fields above.
    @model_serializer(mode="wrap")
    def _period_only_if_set(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data = handler(self)
        if self.period is None and isinstance(data, dict):
            for name in PERIOD_FIELDS:
                data.pop(name, None)
        return data

    @classmethod
    def of(cls, view: BudgetView) -> Budget:
        return cls(**view.to_dict())


class Reads(BaseModel):
    """What a service account's answers reveal: the composition, on the ledger's RDP grid, of
    every distinct release it received (fresh or replayed; the degree release once per graph
    version), converted at the account's delta."""

    account_id: int
    read_epsilon: ComposedFigure = Field(
        description="Composed by the RDP accountant at `delta` (null: infinite)."
    )
    delta: float
    releases: int = Field(description="Distinct releases counted.")
    read_cap_epsilon: float | None = Field(description="The cap in force; null: no cap.")

    @classmethod
    def of(cls, view: ReadView) -> Reads:
        return cls(**view.to_dict())


class PprAnswer(BaseModel):
    node: str
    graph_version: str
    results: list[Result]
    mechanism: Mechanism
    budget: Budget
    replayed: bool = Field(description="True: a stored earlier release, nothing charged.")
    request_id: str
    epsilon_charged: float = Field(description="Per-query epsilon charged now (0 on replays).")
    synthetic: bool | None = Field(
        None,
        description="Present (true) only in a sandbox: the answer is exact PPR on a synthetic "
        "release, which each account receiving one pays for once (docs/synthetic.md).",
    )

    released_at: str | None = Field(
        None, description="On a replay: when its stored release was made (ISO 8601, UTC)."
    )
    age_seconds: float | None = Field(
        None, description="On a replay: the stored release's age in seconds."
    )

    @classmethod
    def of(cls, answer: Answer) -> PprAnswer:
        # validated in one call into pydantic from plain data, the nested models included (a
        # model built per result took a sixth of a replay's endpoint); the same fields
        return cls.model_validate(
            {
                "node": answer.node,
                "graph_version": answer.graph_version,
                "budget": answer.budget.to_dict(),
                "replayed": answer.replayed,
                "request_id": answer.request_id,
                "epsilon_charged": answer.epsilon_charged,
                "results": [{"node": r.node, "score": r.score} for r in answer.results],
                "mechanism": answer.mechanism,
                "released_at": answer.extra.get("released_at"),
                "age_seconds": answer.extra.get("age_seconds"),
            }
        )


def _charged_fields(answer: ChargedAnswer) -> dict[str, Any]:
    """The fields every answer charged to an account shows (a ranking, an embedding)."""
    return {
        "node": answer.node,
        "graph_version": answer.graph_version,
        "budget": Budget.of(answer.budget),
        "replayed": answer.replayed,
        "request_id": answer.request_id,
        "epsilon_charged": answer.epsilon_charged,
    }


class ErrorBody(BaseModel):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Account(BaseModel):
    account_id: int
    type: Literal["user", "service", "admin"]
    node_id: str | None
    label: str | None
    may_create_seed_accounts: bool
    modes: list[Literal["personalized", "edge"]] = Field(
        description="Service accounts: the modes they may query."
    )
    quota_epsilon: float | None = Field(
        description="Service accounts: eps per rolling 24 h they may charge to other accounts "
        "(null: the configured default)."
    )
    read_cap_epsilon: float | None = Field(
        None,
        description="Service accounts: cap on their read figure (null: the configured "
        "default, PPR_SERVICE_READ_CAP_EPSILON; unset there: no cap).",
    )
    created_at: str

    @classmethod
    def of(cls, record: AccountRecord) -> Account:
        return cls(**{**record.__dict__, "modes": list(record.modes)})


class AccountWithBudget(Account):
    budget: Budget


class ApiKey(BaseModel):
    key_id: int
    account_id: int
    prefix: str
    created_at: str
    revoked_at: str | None

    @classmethod
    def of(cls, record: ApiKeyRecord) -> ApiKey:
        return cls(**record.__dict__)


class NewApiKey(ApiKey):
    api_key: str = Field(description="Shown once; only its hash is stored.")


class CreateAccount(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["user", "service", "admin"]
    node_id: NodeIdField | None = None
    cap_epsilon: CapEpsilonField | None = None
    delta: DeltaField | None = None
    label: LabelField | None = None
    may_create_seed_accounts: BoolField = False
    modes: list[Literal["personalized", "edge"]] | None = Field(
        None, min_length=1, max_length=2, description="Service accounts only; default edge only."
    )
    quota_epsilon: QuotaEpsilonField | None = Field(
        None, description="Service accounts only; default the configured quota."
    )


class SetScopes(BaseModel):
    model_config = ConfigDict(extra="forbid")

    modes: list[Literal["personalized", "edge"]] | None = Field(None, min_length=1, max_length=2)
    may_create_seed_accounts: BoolField | None = None
    quota_epsilon: QuotaEpsilonField | None = None
    default_quota: BoolField = Field(False, description="Use the configured default quota again.")
    read_cap_epsilon: QuotaEpsilonField | None = Field(
        None, description="Cap on the account's read figure (what its answers reveal)."
    )
    default_read_cap: BoolField = Field(
        False, description="Use the configured default read cap again."
    )


class ModeExposure(BaseModel):
    """One mode's share of the graph-wide exposure."""

    epsilon: ComposedFigure
    charges: int


class ExposurePoint(BaseModel):
    at: str
    epsilon: ComposedFigure
    charges: int


class Exposure(BaseModel):
    """What all accounts together can have learned about any one edge (composed bound; a
    figure is null when infinite)."""

    epsilon: ComposedFigure
    delta: float
    charges: int
    graph_releases: int
    cap_epsilon: float | None
    by_mode: dict[str, ModeExposure]
    series: list[ExposurePoint]
    shards_epsilon: ComposedFigure


class CreatedAccount(AccountWithBudget):
    key: NewApiKey


class SetBudget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cap_epsilon: CapEpsilonField | None = None
    delta: DeltaField | None = None
    period: Period | None = Field(
        None,
        description="Give the account a cap per UTC day, week or month on top of its lifetime "
        "cap (with `period_cap_epsilon`, or alone to change the period of the cap it has).",
    )
    period_cap_epsilon: CapEpsilonField | None = Field(
        None, description="The cap per period (alone: change the cap of the period it has)."
    )
    clear_period: bool = Field(
        False, description="Remove the account's budget period (the lifetime cap alone)."
    )


class Charge(BaseModel):
    charge_id: int
    created_at: str
    charged_account_id: int
    principal_account_id: int
    seed: str
    mechanism: str
    mode: str
    epsilon: float
    graph_version: str
    request_id: str
    idempotency_key: str | None
    refunded: bool
    state: Literal["admitted", "released", "refunded"]

    @classmethod
    def of(cls, record: ChargeRecord) -> Charge:
        fields = {k: v for k, v in record.__dict__.items() if k != "params"}
        return cls(**fields)


class ReloadGraph(BaseModel):
    """What ``POST /v1/admin/graph/reload`` may carry: nothing (reload the current file), or
    the name of a file inside ``PPR_GRAPH_DIR`` to load instead."""

    model_config = ConfigDict(extra="forbid")
    path: GraphFileField | None = Field(
        None,
        description="A graph file inside PPR_GRAPH_DIR, relative to it (e.g. "
        "`2026-11/edges.txt.gz`); absent: reload the current file.",
    )


class GraphInfo(BaseModel):
    version: str = Field(description="The public id callers see (random, not a hash of edges)")
    fingerprint: str = Field(
        "", description="The content hash of the graph (admins only; never shown to callers)"
    )
    node_set: str = Field(
        "", description="listed (PPR_NODES_PATH), fixed (demo graph) or derived_from_edges"
    )
    max_degree_bound: int | None = Field(
        None, description="The public degree bound the graph was checked against"
    )
    source: str
    nodes: int
    edges: int
    degree_min: int
    degree_mean: float
    degree_max: int
    loaded_at: float
    load_seconds: float


class SimilarNode(BaseModel):
    node: str
    similarity: float = Field(description="Cosine similarity of the two released vectors.")


class EmbeddingReleaseInfo(BaseModel):
    """The all-node embedding release the answer is computed from."""

    name: str = Field(description="The release's name in the ledger (its graph releases).")
    graph_version: str
    method: str = Field(
        description="`dp_instant_embedding` (PushFlowCap, InstantEmbedding, Laplace)."
    )
    mode: str = Field(description="`edge`: every edge protected, any node's vector.")
    privacy_unit: str = Field(description="`edge`: neighbouring graphs differ in one edge.")
    nodes: int = Field(description="How many nodes' embeddings the release holds.")
    epsilon_per_node: float = Field(description="Epsilon of each node's embedding.")
    epsilon: float = Field(
        description="Pure epsilon charged once to the graph-wide exposure for the whole release "
        "(the composition over its nodes)."
    )
    k: int = Field(description="Embedding dimension.")
    sigma: float = Field(description="PushFlowCap's sensitivity parameter.")


class SimilarAnswer(BaseModel):
    node: str
    graph_version: str
    results: list[SimilarNode] = Field(description="Nearest other nodes, most similar first.")
    release: EmbeddingReleaseInfo
    index: str = Field(description="How the neighbours were found (approximate: HNSW).")
    epsilon_charged: float = Field(
        description="Always 0: post-processing of a release already charged when it was made."
    )
    cost: str
    request_id: str


class EmbeddingMechanism(BaseModel):
    """What produced an embedding, with its parameters (fields that do not apply are absent)."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["dp_instant_embedding", "instant_embedding_of_release"] = Field(
        description="`dp_instant_embedding` (DP-IE: PushFlowCap, InstantEmbedding, Laplace "
        "noise of scale sigma n / eps on the k coordinates; charged) or "
        "`instant_embedding_of_release` (the InstantEmbedding of a stored ranking release the "
        "caller may replay; post-processing, charged nothing); see docs/embeddings.md."
    )
    mode: Literal["personalized", "edge"] = Field(
        description="`personalized`: joint DP, for the seed user only (the seed's own edges "
        "are not protected); `edge`: every edge protected."
    )
    epsilon: float = Field(description="The guarantee this answer's noise gives (0: free).")
    delta: float = Field(
        description="DP-IE: what the float64 Laplace sampler adds, once per coordinate "
        "(docs/privacy.md); 0 for the free embedding (its release states its own)."
    )
    dimension: int = Field(description="k, the number of coordinates.")
    hash_salt: str = Field(
        description="Hex salt of the graph version's hash functions h_k, h_sgn (random, drawn "
        "once per graph version: embeddings of one version are comparable)."
    )
    sigma: float | None = Field(None, description="DP-IE: PushFlowCap's sensitivity sigma.")
    sensitivity: float | None = Field(None, description="DP-IE: l1 sensitivity sigma n.")
    noise_scale: float | None = Field(None, description="DP-IE: Laplace scale sigma n / eps.")
    score_grid: float | None = Field(
        None, description="DP-IE: every coordinate is an integer multiple of this power of two."
    )
    alpha: float | None = Field(None, description="DP-IE: PushFlowCap's lazy teleport alpha.")
    rounds: int | None = Field(None, description="DP-IE: PushFlowCap's rounds R.")
    floor: float | None = Field(
        None,
        description="DP-IE: PushFlowCap's floor: a node keeps the first floor / n of PPR mass "
        "it receives before it pushes any (0: the paper's Algorithm 2; docs/privacy.md).",
    )
    normalized: bool | None = Field(
        None,
        description="Free embedding: the clipped scores were scaled to sum 1 (scores that are "
        "not PPR mass).",
    )
    entries: int | None = Field(
        None, description="Free embedding: the stored entries it was computed from."
    )
    store_top: int | None = Field(
        None,
        description="Free embedding: PPR_REPLAY_STORE_TOP, the most entries a stored release "
        "keeps (every other entry counts as 0).",
    )


class EmbeddingSource(BaseModel):
    """The stored release a free embedding was computed from."""

    release_request_id: str = Field(description="The request id of the release's answer.")
    node: str
    mode: Literal["personalized", "edge"]
    epsilon: float
    mechanism: Mechanism = Field(description="The release's own mechanism block.")
    graph_version: str


class EmbeddingAnswerModel(BaseModel):
    node: str
    graph_version: str
    embedding: list[float] = Field(description="The k coordinates.")
    mechanism: EmbeddingMechanism
    budget: Budget
    replayed: bool = Field(
        description="True: built from a stored earlier release, nothing charged."
    )
    request_id: str
    epsilon_charged: float = Field(description="Epsilon charged now (0 on replays, and free).")
    source: EmbeddingSource | None = Field(
        None, description="Free embedding: the stored release it was computed from."
    )

    @classmethod
    def of(cls, answer: EmbeddingAnswer) -> EmbeddingAnswerModel:
        source = None
        if answer.source is not None:
            source = EmbeddingSource(
                **{**answer.source, "mechanism": Mechanism(**answer.source["mechanism"])}
            )
        return cls(
            **_charged_fields(answer),
            embedding=answer.embedding,
            mechanism=EmbeddingMechanism(**answer.mechanism),
            source=source,
        )
