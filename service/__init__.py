"""Differentially private personalized PageRank, served with a durable Renyi-DP budget ledger."""

__version__ = "0.1.0"
