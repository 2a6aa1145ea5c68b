"""The query pipeline's stages, in the order a query passes them.

:class:`~service.serving.ppr_query.PprQueryService` is the coordinator; each stage is one
module here, readable top to bottom:

- ``prepare``: validate, find the charged account, answer from a stored release when one
  can, else plan the query (``Pending``);
- ``admit``: the ledger's admit-and-charge, alone, group-committed or for a whole group;
- ``draw``: the admitted query's noisy release (alone, or a group's diffusions in one engine
  block), nothing drawn before the charge is committed;
- ``store``: the release stored (alone or together) before its answer may leave;
- ``answer``: fresh answers, ``popular`` answers and post-processing;
- ``replay``: answers from stored releases, Idempotency-Key binding, waiting for a twin;
- ``reads``: a service account's read figure; ``prefixes``: the noise-free prefixes;
- ``items``: what passes between the stages; ``policy``: what admission enforces.
"""
