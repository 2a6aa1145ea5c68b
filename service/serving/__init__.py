"""The application layer between the HTTP API (or a batch job) and the engine and ledger."""
