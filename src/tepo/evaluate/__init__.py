"""Evaluation: sample a model on problems, verify, and summarise (greedy accuracy, avg@k, pass@k)."""

from tepo.evaluate.core import ProblemResult, accuracy, score_problems

__all__ = ["ProblemResult", "accuracy", "score_problems"]
