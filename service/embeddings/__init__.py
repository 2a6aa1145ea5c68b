"""Node embeddings: InstantEmbedding of PPR vectors (Epasto et al., Algorithm 4), the DP-IE
mechanism (PushFlowCap, then InstantEmbedding, then Laplace noise) and the free embedding of
an already released vector. Pure math; the serving path and the ledger live elsewhere."""
