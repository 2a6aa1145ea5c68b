"""Evaluation of private rankings against exact PPR: metrics and the mechanism comparison."""

from service.evaluation.metrics import mean_ci, ndcg_at_k, recall_at_k
from service.evaluation.runner import MECHANISMS, EvaluationRow, evaluate

__all__ = ["MECHANISMS", "EvaluationRow", "evaluate", "mean_ci", "ndcg_at_k", "recall_at_k"]
