"""Verifiable rewards: math answers checked by math-verify in a pool of sandboxed worker processes.

See ``pool.py`` for the pool (``sandbox.py`` its workers and the safety design, ``math_items.py`` and
``call_items.py`` its two kinds of request), ``answers.py`` for how the final answer is taken from a completion (and
the one list of answer-format names, ``ANSWER_FORMATS``), ``functions.py`` for the named reward functions of
``reward.functions`` (correctness, format, and the user's own by path: ``user_functions.py`` loads and calls
them in the workers), and ``shaping.py`` for DAPO's overlong reward shaping.
"""

from .answers import (
    ANSWER_FORMAT_DESCRIPTIONS,
    ANSWER_FORMATS,
    COMPLETION_ANSWER_FORMATS,
    DEFAULT_MAX_CHARS,
    END_OF_TEXT_MARKERS,
    extract_final_answer,
    strip_trailer,
)
from .call_items import CALL_STATUSES
from .failures import FAILURES_FILE, RewardFailures, RewardFunctionsFailing
from .functions import (
    DEFAULT_REWARD_FUNCTIONS,
    REWARD_FUNCTIONS,
    ScoredResponses,
    UserRewardFunction,
    format_reward,
    parse_reward_functions,
    reward_columns,
    reward_functions_from_specs,
    score_responses,
    user_reward_function_errors,
    user_reward_functions,
)
from .math_items import STATUSES
from .pool import RewardPool
from .results import RewardFuture, RewardResult, RewardStats
from .single import math_equal

# The shaping functions need torch; the pool and extraction do not (a process that only verifies answers should not
# pay for importing torch), so they are loaded on first use.
_SHAPING = ("mask_truncated", "overlong_filter_mask", "overlong_penalty")


def __getattr__(name: str):
    if name in _SHAPING:
        from . import shaping

        return getattr(shaping, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ANSWER_FORMATS",
    "ANSWER_FORMAT_DESCRIPTIONS",
    "CALL_STATUSES",
    "COMPLETION_ANSWER_FORMATS",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_REWARD_FUNCTIONS",
    "END_OF_TEXT_MARKERS",
    "FAILURES_FILE",
    "REWARD_FUNCTIONS",
    "STATUSES",
    "RewardFailures",
    "RewardFunctionsFailing",
    "RewardFuture",
    "RewardPool",
    "RewardResult",
    "RewardStats",
    "ScoredResponses",
    "UserRewardFunction",
    "extract_final_answer",
    "format_reward",
    "mask_truncated",
    "math_equal",
    "overlong_filter_mask",
    "overlong_penalty",
    "parse_reward_functions",
    "reward_columns",
    "reward_functions_from_specs",
    "score_responses",
    "strip_trailer",
    "user_reward_function_errors",
    "user_reward_functions",
]
