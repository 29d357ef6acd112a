"""Verifiable rewards: math answers checked by math-verify in a pool of sandboxed worker processes.

See ``pool.py`` for the safety design and ``answers.py`` for how the final answer is taken from a completion.
"""

from .answers import ANSWER_FORMATS, DEFAULT_MAX_CHARS, extract_final_answer
from .pool import STATUSES, MathRewardPool, RewardFuture, RewardResult, RewardStats
from .single import math_equal

__all__ = [
    "ANSWER_FORMATS",
    "DEFAULT_MAX_CHARS",
    "STATUSES",
    "MathRewardPool",
    "RewardFuture",
    "RewardResult",
    "RewardStats",
    "extract_final_answer",
    "math_equal",
]
