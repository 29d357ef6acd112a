"""The shared evaluation step: generate for a list of problems, verify every response, keep per-problem records.

Used by the trainer's held-out evaluation (before/after training and every ``eval.every`` steps) and by
``tepo eval``. Generation goes through the same rollout backend as training, verification through the same
reward pool, so "accuracy" means the same thing everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tepo.data import Problem, build_prompt_ids
from tepo.rewards import RewardPool, RewardResult, score_responses


@dataclass
class ProblemResult:
    problem: Problem
    responses: list[str] = field(default_factory=list)
    verdicts: list[RewardResult] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)
    votes: list[int | None] = field(default_factory=list)  # answer classes for cons@k (tepo.evaluate.voting)
    # per response, the value and status of each of the user's reward functions: label -> (value, status)
    rewards: list[dict[str, tuple[float, str]]] = field(default_factory=list)

    @property
    def num_correct(self) -> int:
        return sum(v.status == "correct" for v in self.verdicts)

    @property
    def num_samples(self) -> int:
        return len(self.verdicts)


def engine_batch_prompts(backend, num_samples: int, default: int) -> int:
    """Prompts per generate call that keep ``backend`` at its throughput: an engine that schedules requests itself
    (vLLM: continuous batching) says how many rows it runs at once (``preferred_batch_rows``), and is fed that many
    rows per call; a backend without one (HF ``generate`` pads a call into one dense batch) keeps ``default``."""
    rows = getattr(backend, "preferred_batch_rows", None)
    if not rows:
        return default
    return max(1, int(rows) // max(1, int(num_samples)))


def score_problems(
    backend,
    tokenizer,
    problems: Sequence[Problem],
    pool: RewardPool,
    *,
    instruction: str,
    num_samples: int = 1,
    greedy: bool = False,
    max_new_tokens: int = 64,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_prompts: int = 16,
    on_batch: Callable[[list[ProblemResult]], None] | None = None,
    answer_format: str | None = None,
    reward_functions: Sequence[str] = (),
) -> list[ProblemResult]:
    """``num_samples`` responses per problem (one if ``greedy``), verified; batches of ``batch_prompts`` prompts.

    Each batch's seed is ``seed + batch index`` so results do not depend on which batches ran before (a resumed
    evaluation gives the same samples). ``on_batch`` receives each finished batch (for progress and resume logs).
    ``answer_format`` overrides the pool's own for these verdicts (``tepo eval`` judges benchmarks with "boxed").
    ``reward_functions``: labels of the user's reward functions loaded in ``pool``, scored beside the verdicts
    (accuracy stays math-verify's); each response's value and status go in ``ProblemResult.rewards``.
    """
    samples = 1 if greedy else num_samples
    results: list[ProblemResult] = []
    for index, start in enumerate(range(0, len(problems), batch_prompts)):
        chunk = list(problems[start : start + batch_prompts])
        prompt_ids = build_prompt_ids(tokenizer, chunk, instruction)
        batch = backend.generate(
            prompt_ids,
            num_samples=samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed + index,
            greedy=greedy,
        )
        answers = [p.answer for p in chunk for _ in range(samples)]
        verdicts = pool.score(batch.texts, answers, answer_format=answer_format)
        user = (
            score_responses(pool, reward_functions, batch.texts, chunk, samples) if reward_functions else None
        )
        lengths = batch.response_mask.sum(1).long().tolist()
        votes = _votes(verdicts, len(chunk), samples, pool)
        chunk_results = []
        for j, problem in enumerate(chunk):
            rows = range(j * samples, (j + 1) * samples)
            chunk_results.append(
                ProblemResult(
                    problem=problem,
                    responses=[batch.texts[r] for r in rows],
                    verdicts=[verdicts[r] for r in rows],
                    lengths=[lengths[r] for r in rows],
                    truncated=[bool(batch.truncated[r]) for r in rows],
                    votes=list(votes[j]),
                    rewards=[_user_rewards(user, reward_functions, r) for r in rows] if user else [],
                )
            )
        results.extend(chunk_results)
        if on_batch is not None:
            on_batch(chunk_results)
    return results


def _votes(verdicts, problems: int, samples: int, pool) -> list:
    """Each problem's vote classes of its ``samples`` verdicts (rows ``j * samples ...`` of problem ``j``)."""
    if samples > 1:  # majority-vote classes (cons@k): equivalent answers by math-verify
        from tepo.evaluate.voting import answer_votes

        rows_of = [range(j * samples, (j + 1) * samples) for j in range(problems)]
        return answer_votes(
            [[verdicts[r].extracted for r in rows] for rows in rows_of],
            [[verdicts[r].status == "correct" for r in rows] for rows in rows_of],
            pool,
        )
    # One sample: it wins its own vote (class 0 when correct; a wrong one is a lone class 1, or None without
    # an answer).
    return [
        [
            0 if v.status == "correct" else (None if v.extracted is None else 1)
            for v in verdicts[j * samples :][:1]
        ]
        for j in range(problems)
    ]


def _user_rewards(scored, labels: Sequence[str], row: int) -> dict[str, tuple[float, str, str]]:
    """Per function, one response's value, status and (for a failure) its reason."""
    return {
        label: (column[row], scored.statuses[label][row], scored.details[label][row])
        for label, column in zip(labels, scored.columns)
    }


def accuracy(results: Sequence[ProblemResult]) -> float:
    """Mean over problems of the share of correct responses (avg@k; greedy accuracy when k = 1)."""
    if not results:
        return float("nan")
    return sum(r.num_correct / max(r.num_samples, 1) for r in results) / len(results)
