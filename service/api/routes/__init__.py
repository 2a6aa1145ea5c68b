"""HTTP routes, one module per audience: queries, the caller's own budget, admin, operations."""
