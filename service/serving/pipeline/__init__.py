"""The query pipeline's stages, in the order a query passes them.

``group`` is the coordinator: it runs prepare -> admit -> draw -> store -> answer for a group
of queries (a lone query is a group of one), each stage taking the previous one's output
(``items``). Each stage is one module here, readable top to bottom:

- ``prepare``: validate, find the charged account, answer from a stored release when one
  can, else plan the query (``ToAdmit``; ``popular``: ``PopularPending``);
- ``admit``: the one way into the ledger's admit-and-charge, ``popular``'s degree release
  included (``Admitter.admit``);
- ``draw``: the admitted queries' noisy releases (a group's diffusions in one engine block),
  nothing drawn before the charge is committed;
- ``store``: the releases stored (a group's in one transaction) before any answer leaves;
- ``answer``: fresh answers and ``popular`` answers;
- ``replay``: answers from stored releases, Idempotency-Key binding, waiting for a twin;
- ``reads``: a service account's read figure; ``prefixes``: the noise-free prefixes;
- ``graph_caps``: the graph-wide cap; ``policy``: what admission enforces.
"""
