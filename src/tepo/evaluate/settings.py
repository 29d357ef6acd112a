"""How each benchmark is decoded and judged: one ``EvalSetting`` per benchmark, and named protocols.

A setting is either greedy (one response per problem: greedy accuracy) or sampled (``num_samples`` responses at
``temperature``/``top_p``: avg@n and pass@k). Protocol ``tepo`` is the TEPO paper's (arXiv 2510.09369, Sec. 4):
"For AIME and AMC we used temperature 0.6; for the others we used greedy decoding. The maximum generation length
was 8192 tokens. AIME, AIME25, and AMC results were reported with 32 samples per problem (@32)". The paper does not
state top-p; we read it as 1.0 (no nucleus truncation). Omni-MATH, its seventh benchmark, is one of the greedy ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tepo.rewards import COMPLETION_ANSWER_FORMATS

BENCHMARK_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DEFAULT_ANSWER_FORMAT = "boxed"
DEFAULT_MAX_NEW_TOKENS = 1024
DEFAULT_PASS_K = (1, 2, 4, 8, 16, 32, 64, 128)

PROTOCOLS = ("tepo",)
TEPO_BENCHMARKS = ("math500", "aime24", "aime25", "amc23", "omni_math", "minerva", "olympiadbench")
TEPO_MAX_NEW_TOKENS = 8192
TEPO_SAMPLED = {"aime24", "aime25", "amc23"}
TEPO_TEMPERATURE = 0.6
TEPO_SAMPLES = 32


class EvalError(ValueError):
    """Bad evaluation request or output directory; the message says what, where and what was expected."""


@dataclass(frozen=True)
class EvalSetting:
    """Decoding and judging of one benchmark. ``greedy`` means one response per problem, argmax decoding."""

    greedy: bool = True
    num_samples: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    seed: int = 0
    instruction: str = BENCHMARK_INSTRUCTION
    answer_format: str = DEFAULT_ANSWER_FORMAT

    def __post_init__(self) -> None:
        if not isinstance(self.num_samples, int) or self.num_samples < 1:
            raise EvalError(f"number of samples must be an integer >= 1, got {self.num_samples!r}")
        if self.greedy and self.num_samples != 1:
            raise EvalError(
                f"greedy decoding gives one response per problem, got num_samples={self.num_samples}; "
                "set a temperature > 0 to draw several samples"
            )
        if not self.greedy and not self.temperature > 0:
            raise EvalError(f"sampling needs a temperature > 0, got {self.temperature!r} (0 means greedy)")
        if not 0 < self.top_p <= 1:
            raise EvalError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise EvalError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.answer_format not in COMPLETION_ANSWER_FORMATS:
            raise EvalError(
                f"answer format {self.answer_format!r} is not one of {list(COMPLETION_ANSWER_FORMATS)}"
            )

    @property
    def label(self) -> str:
        return "greedy" if self.greedy else f"T={self.temperature:g}, n={self.num_samples}"

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def make_setting(
    *,
    temperature: float = 0.0,
    num_samples: int | None = None,
    top_p: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    seed: int = 0,
    instruction: str = BENCHMARK_INSTRUCTION,
    answer_format: str = DEFAULT_ANSWER_FORMAT,
) -> EvalSetting:
    """Temperature 0 is greedy (one response); a temperature > 0 samples ``num_samples`` responses (default 1)."""
    greedy = temperature == 0
    return EvalSetting(
        greedy=greedy,
        num_samples=1 if num_samples is None else num_samples,
        temperature=float(temperature),
        top_p=float(top_p),
        max_new_tokens=max_new_tokens,
        seed=seed,
        instruction=instruction,
        answer_format=answer_format,
    )


def protocol_settings(
    protocol: str,
    benchmarks: list[str],
    *,
    max_new_tokens: int | None = None,
    num_samples: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int = 0,
    instruction: str = BENCHMARK_INSTRUCTION,
    answer_format: str = DEFAULT_ANSWER_FORMAT,
) -> dict[str, EvalSetting]:
    """Settings of a named protocol for ``benchmarks``. Given overrides apply as follows: ``max_new_tokens`` to
    every benchmark; ``num_samples``, ``temperature`` and ``top_p`` to the benchmarks the protocol samples (the
    greedy ones stay greedy). Benchmarks the protocol does not name (a JSONL path) are decoded greedily."""
    if protocol not in PROTOCOLS:
        raise EvalError(f"unknown protocol {protocol!r}; expected one of {list(PROTOCOLS)}")
    max_new = max_new_tokens or TEPO_MAX_NEW_TOKENS
    out = {}
    for name in benchmarks:
        if name in TEPO_SAMPLED:
            out[name] = EvalSetting(
                greedy=False,
                num_samples=num_samples or TEPO_SAMPLES,
                temperature=TEPO_TEMPERATURE if temperature is None else float(temperature),
                top_p=1.0 if top_p is None else float(top_p),
                max_new_tokens=max_new,
                seed=seed,
                instruction=instruction,
                answer_format=answer_format,
            )
        else:
            out[name] = EvalSetting(
                max_new_tokens=max_new, seed=seed, instruction=instruction, answer_format=answer_format
            )
    return out
