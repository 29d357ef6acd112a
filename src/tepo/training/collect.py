"""Phases 1-2 of a step: sample G responses per prompt, score them, and (dynamic sampling) refill the batch.

A plain function of its parts (rollout backend, prompt stream, reward pool), so a test can call it alone.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tepo.advantages import filter_groups
from tepo.batch import concat_rollouts, select_rollout_rows
from tepo.data import Problem, PromptStream, build_prompt_ids
from tepo.rewards.functions import score_responses
from tepo.rewards.shaping import overlong_penalty
from tepo.rollout.base import RolloutBatch


@dataclass(frozen=True)
class SamplerSettings:
    """What the rollout is asked for: G samples per prompt under the training sampler."""

    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    instruction: str
    return_logprobs: bool = False  # the sampler's own log-probs of the sampled tokens (off-policy metrics)


@dataclass(frozen=True)
class OverlongShaping:
    """DAPO's soft overlong punishment (``tepo.rewards.shaping.overlong_penalty``) added to the rewards."""

    max_len: int
    buffer_len: int
    penalty_factor: float


@dataclass
class Collected:
    """A step's training batch: rows grouped by prompt (G contiguous rows each), with verified rewards."""

    batch: RolloutBatch | None  # None when dynamic sampling kept no group
    rewards: Tensor | None  # what advantages are computed from: reward.functions' weighted sum plus shaping
    # [N, K]: each reward function's reward per row (reward.functions order; GDPO reads it); None when no batch
    reward_components: Tensor | None = None
    statuses: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    metrics: dict = field(default_factory=dict)


def sample(
    rollout, tokenizer, problems: Sequence[Problem], settings: SamplerSettings, seed: int
) -> RolloutBatch:
    """G responses for each problem, prompts chat-formatted with the run's instruction."""
    prompt_ids = build_prompt_ids(tokenizer, problems, settings.instruction)
    kwargs = {"return_logprobs": True} if settings.return_logprobs else {}
    return rollout.generate(
        prompt_ids,
        num_samples=settings.group_size,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        seed=seed,
        **kwargs,
    )


def collect_rollouts(
    rollout,
    tokenizer,
    stream: PromptStream,
    pool,
    settings: SamplerSettings,
    *,
    prompts: int,
    seed: int,
    dynamic_sampling: bool = False,
    max_resample_rounds: int = 0,
    overlong: OverlongShaping | None = None,
    reward_functions: Sequence[tuple[str, float]] = (("correctness", 1.0),),
    step: int | None = None,
) -> Collected:
    """Sample and score ``prompts`` prompts; with dynamic sampling, drop all-equal groups and refill.

    Round ``r`` samples with seed ``seed + r``. Dynamic sampling (DAPO; TEPO Eq. 10) keeps only groups whose
    rewards differ and draws up to ``max_resample_rounds`` more prompt batches until ``prompts`` groups are kept;
    the batch is then cut to exactly ``prompts`` groups (DAPO trains on the batch size when refills overshoot).
    Reward metrics describe the first round only: later rounds are a biased refill.

    With ``overlong`` shaping the returned rewards are correctness plus the length penalty, while dynamic
    sampling still keeps or drops a group by its correctness rewards (verl's DAPO filters on ``acc``): a group
    that is all wrong stays uninformative about correctness however its lengths differ. ``reward/mean`` and
    ``reward/accuracy`` stay correctness, so runs with and without shaping compare on the same scale.

    ``reward_functions``: ``(name, weight)`` pairs (``tepo.rewards.functions``); the rewards are
    ``sum_k weight_k * reward_k`` (plus shaping), ``reward_components`` holds each ``reward_k`` as a column, and
    ``reward/<name>_mean`` each one's mean over the first round. The default, correctness with weight 1, gives the
    correctness reward itself. Dynamic sampling still filters on correctness. A function of the user's own
    also logs ``reward/<name>_errors`` and ``reward/<name>_timeouts`` (responses that scored 0 for a failed
    call, over every round). When the functions are the user's own and exclude correctness, math-verify is not
    run and the weighted sum stands for correctness in ``reward_mean``, ``accuracy`` and dynamic sampling
    (``tepo.rewards.functions``); math-verify's counters (``reward/errors``, ``reward/timeouts``,
    ``reward/no_answer``) are then not logged. ``step`` names the step in the record of the user's functions'
    failures (``tepo.rewards.failures``).
    """
    names = [name for name, _ in reward_functions]
    weights = torch.tensor([float(w) for _, w in reward_functions], dtype=torch.float32)
    g = settings.group_size
    kept = _KeptRows()
    stats = defaultdict(float)
    rounds = 1 + (max_resample_rounds if dynamic_sampling else 0)
    first_rewards = None
    for round_index in range(rounds):
        problems = stream.take(prompts)
        batch = sample(rollout, tokenizer, problems, settings, seed + round_index)
        scored = _score_round(pool, batch, problems, names, weights, g, overlong, stats, step)
        if first_rewards is None:
            first_rewards = scored.rewards
            for name, column in zip(names, scored.components.T):
                stats[f"reward/{name}_mean"] = float(column.mean())
        if scored.verified:  # math-verify's counters only where it ran
            stats["reward/timeouts"] += scored.statuses.count("timeout")
            stats["reward/errors"] += scored.statuses.count("error")
            stats["reward/no_answer"] += scored.statuses.count("no_answer")
        for name, count in scored.function_errors.items():
            stats[f"reward/{name}_errors"] += count
            stats[f"reward/{name}_timeouts"] += scored.function_timeouts[name]
        stats["rollout/rounds"] += 1
        if dynamic_sampling:
            _keep_varied_groups(kept, batch, problems, scored, g, stats)
        else:
            kept.add(batch, problems, scored)
        if kept.num_rows >= prompts * g:
            break
    stats.update(_first_round_summary(first_rewards, stats, overlong))
    return kept.collected(prompts, g, rollout.pad_token_id, dict(stats))


@dataclass(frozen=True)
class _ScoredRound:
    """One round's scores: ``rewards`` the correctness reward (what dynamic sampling filters on and the reward
    metrics describe; the functions' weighted sum when they are the user's own and exclude correctness),
    ``shaped`` what advantages are computed from (the functions' weighted sum plus shaping), ``components``
    ``[N, K]`` each function's reward, ``statuses`` each response's verifier status, and the user's functions'
    failed calls by name."""

    rewards: Tensor
    shaped: Tensor
    components: Tensor
    statuses: list[str]
    function_errors: dict[str, int]
    function_timeouts: dict[str, int]
    verified: bool = True  # math-verify scored the round (False: the user's functions alone)


def _score_round(
    pool, batch: RolloutBatch, problems, names, weights: Tensor, g: int, overlong, stats: dict, step=None
) -> _ScoredRound:
    """Score one round's responses with every reward function (``tepo.rewards.functions.score_responses``) and
    weigh them (with the overlong penalty where shaping is on); adds the round's time and token counts to
    ``stats``."""
    start = time.perf_counter()
    scored = score_responses(pool, names, batch.texts, problems, g, step=step)
    stats["time/reward_seconds"] += time.perf_counter() - start
    stats["time/gen_seconds"] += batch.gen_seconds
    stats["rollout/gen_tokens"] += batch.num_generated_tokens
    device = batch.input_ids.device
    components = torch.tensor(scored.columns, dtype=torch.float32, device=device).T
    weighted = components @ weights.to(device)
    if scored.verdicts is None:
        # A task of the user's own: its functions' weighted sum stands for correctness.
        rewards, statuses = weighted, ["scored"] * len(weighted)
    else:
        rewards = torch.tensor([v.reward for v in scored.verdicts], dtype=torch.float32, device=device)
        statuses = [v.status for v in scored.verdicts]
    shaped = weighted
    if overlong is not None:
        penalty = overlong_penalty(
            batch.response_lengths,
            max_len=overlong.max_len,
            buffer_len=overlong.buffer_len,
            penalty_factor=overlong.penalty_factor,
        )
        shaped = shaped + penalty
        stats["overlong_penalty_sum"] += float(penalty.sum())
        stats["overlong_penalty_rows"] += len(penalty)
    return _ScoredRound(
        rewards,
        shaped,
        components,
        statuses,
        dict(scored.errors),
        dict(scored.timeouts),
        verified=scored.verdicts is not None,
    )


@dataclass
class _KeptRows:
    """The rows kept over the rounds, in order (whole groups of G rows)."""

    batches: list[RolloutBatch] = field(default_factory=list)
    rewards: list[Tensor] = field(default_factory=list)
    components: list[Tensor] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    @property
    def num_rows(self) -> int:
        return sum(len(r) for r in self.rewards)

    def add(self, batch: RolloutBatch, problems, scored: _ScoredRound) -> None:
        self.batches.append(batch)
        self.rewards.append(scored.shaped)
        self.components.append(scored.components)
        self.statuses += scored.statuses
        self.problems += problems

    def collected(self, prompts: int, g: int, pad_token_id: int, metrics: dict) -> Collected:
        """The kept rows cut to exactly ``prompts`` groups (DAPO trains on the batch size when refills
        overshoot); no batch when nothing was kept."""
        if not self.batches:
            return Collected(batch=None, rewards=None, metrics=metrics)
        batch = concat_rollouts(self.batches, pad_token_id)
        rewards, components = torch.cat(self.rewards), torch.cat(self.components)
        statuses, problems = self.statuses, self.problems
        limit = prompts * g
        if len(rewards) > limit:
            batch = select_rollout_rows(batch, torch.arange(limit, device=batch.input_ids.device))
            rewards, statuses, problems = rewards[:limit], statuses[:limit], problems[:prompts]
            components = components[:limit]
        return Collected(
            batch=batch,
            rewards=rewards,
            statuses=statuses,
            problems=problems,
            metrics=metrics,
            reward_components=components,
        )


def _keep_varied_groups(
    kept: _KeptRows, batch: RolloutBatch, problems, scored: _ScoredRound, g: int, stats
) -> None:
    """Dynamic sampling: keep the round's groups whose correctness rewards differ, count the dropped ones."""
    result = filter_groups(scored.rewards, g)
    stats["rollout/groups_total"] += result.metrics["groups_total"]
    stats["rollout/groups_dropped"] += result.metrics["groups_total"] - result.metrics["groups_kept"]
    keep_rows = result.keep_mask.nonzero().squeeze(1)
    if not len(keep_rows):
        return
    kept.batches.append(select_rollout_rows(batch, keep_rows))
    kept.rewards.append(scored.shaped[keep_rows])
    kept.components.append(scored.components[keep_rows])
    kept.statuses += [scored.statuses[i] for i in keep_rows.tolist()]
    kept.problems += [problems[int(i) // g] for i in keep_rows[::g].tolist()]


def _first_round_summary(first_rewards: Tensor, stats: dict, overlong) -> dict:
    """The reward metrics of the first round (later rounds are a biased refill), the mean overlong penalty over
    every round, and the share of groups dynamic sampling dropped."""
    out = {
        "reward/mean": float(first_rewards.mean()),
        "reward/std": float(first_rewards.std()) if len(first_rewards) > 1 else 0.0,
        "reward/accuracy": float((first_rewards > 0.5).float().mean()),
    }
    if overlong is not None:
        out["reward/overlong_penalty_mean"] = stats.pop("overlong_penalty_sum") / stats.pop(
            "overlong_penalty_rows"
        )
    out["rollout/frac_groups_dropped"] = (
        stats["rollout/groups_dropped"] / stats["rollout/groups_total"]
        if stats["rollout/groups_total"]
        else 0.0
    )
    return out
