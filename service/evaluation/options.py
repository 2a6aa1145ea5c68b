"""What an evaluation may be asked for, and its defaults: plain names and numbers, importable
without the evaluation's numerical code (``python -m service evaluate --help`` shows them and
imports no numpy or scipy). The runners use them from here."""

from __future__ import annotations

#: The ranking comparison's rows (:mod:`service.evaluation.runner`).
MECHANISMS = (
    "blended",
    "noisy_diffusion",
    "popular",
    "common_neighbours",
    "friends_of_friends",
    "pushflowcap",
    "neighbours_only",
    "random",
    "edge_flipping",
    "default",
)
#: The link-prediction rows (:mod:`service.evaluation.links`): the private rankings, the
#: degree release, the non-private references and the floor.
LINK_ROWS = (
    "blended",
    "noisy_diffusion",
    "friends_of_friends",
    "common_neighbours",
    "pushflowcap",
    "popular",
    "exact_ppr",
    "common_neighbours_exact",
    "random",
    "default",
)
#: The spec's evaluation setting: eta = 1e-7 with beta = 0.8, K = 100.
DEFAULT_ETA = 1e-7
#: Epsilon of the one graph-wide degree release behind ``popular``.
DEFAULT_POPULAR_EPSILON = 0.1

#: The embedding comparison's rows (:mod:`service.evaluation.embeddings`).
ROWS = (
    "random",
    "instant_embedding",
    "dp_ie_edge",
    "dp_ie_personalized",
    "free_noisy_diffusion",
    "free_blended",
)
#: Training fractions of the classification protocol: 10% to 90%
#: (:mod:`service.evaluation.classification`).
DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: Random train/test splits per fraction.
DEFAULT_SPLITS = 10

#: The synthetic-graph generators compared by ``evaluate --task synthetic``
#: (``service.evaluation.synthetic.METHODS`` is this tuple).
SYNTHETIC_METHODS = ("privdpr", "communities", "chung_lu", "erdos_renyi")
