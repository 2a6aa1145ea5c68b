"""DP-IE's public parameters: the paper's defaults and the bounds a request may ask for.

Plain numbers, importable without the mechanism's numerical code: the settings and the
command line (``--help``) read them; :mod:`service.embeddings.dp` uses them.
"""

from __future__ import annotations

#: The paper's dimension (Section 6).
DEFAULT_K = 256
#: Default sigma, chosen by the sweep in docs/embeddings.md: on email-Eu-core at eps 5,
#: personalized DP-IE scores Micro-F1 0.137 +- 0.027 at 1e-3 and 0.147 +- 0.107 at 1e-2 (random
#: 0.041; 1e-4 and 1e-1 at random); 1e-3 has 10x less noise and the narrower interval. The
#: paper's 1e-6 empties the embedding (no node but the seed carries n p_v > 1).
DEFAULT_EMBEDDING_SIGMA = 1e-3
#: Largest dimension accepted (a k-vector per answer; the noise does not grow with k).
MAX_K = 4096
#: The paper's lazy teleport alpha = a_std / (2 - a_std) with a_std = 0.15 (footnote 4), as
#: the service's beta = 1 - alpha.
EMBEDDING_BETA = 1.0 - 0.15 / (2.0 - 0.15)
#: The paper's R = 100 rounds.
EMBEDDING_ROUNDS = 100
#: PushFlowCap's floor: a node keeps the first EMBEDDING_FLOOR / n of PPR mass it receives
#: before it pushes any (service.mechanisms.floored_pushflowcap; the same sensitivity sigma as
#: the paper's Algorithm 2, docs/privacy.md). InstantEmbedding reads only p_v > 1 / n; at 0.25
#: the flow stays near the seed (on a generated 100k-node / 2M-edge graph it reads about 3% of
#: the edge entries Algorithm 2 reads) and the noise-free embedding keeps cosine 0.99 to the
#: paper's (docs/embeddings.md). 0 is the paper's Algorithm 2.
EMBEDDING_FLOOR = 0.25
#: Bounds on sigma: below ~1e-5 nothing but the seed enters the embedding on graphs of a few
#: thousand nodes (spec-embeddings.md, finding 1); above 1 the cap never binds on PPR mass.
MIN_SIGMA = 1e-7
MAX_SIGMA = 1.0
