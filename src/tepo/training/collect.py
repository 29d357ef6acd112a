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
) -> Collected:
    """Sample and score ``prompts`` prompts; with dynamic sampling, drop all-equal groups and refill.

    Round ``r`` samples with seed ``seed + r``. Dynamic sampling (DAPO; TEPO Eq. 10) keeps only groups whose
    rewards differ and draws up to ``max_resample_rounds`` more prompt batches until ``prompts`` groups are kept;
    the batch is then cut to exactly ``prompts`` groups (DAPO trains on the batch size when refills overshoot).
    Reward metrics describe the first round only: later rounds are a biased refill.

    With ``overlong`` shaping the returned rewards are correctness plus the length penalty, while dynamic
    sampling still keeps or drops a group by its correctness rewards (verl's DAPO filters on ``acc``): a group
    that is all wrong stays uninformative about correctness however its lengths differ. ``reward_mean`` and
    ``accuracy`` stay correctness, so runs with and without shaping compare on the same scale.

    ``reward_functions``: ``(name, weight)`` pairs (``tepo.rewards.functions``); the rewards are
    ``sum_k weight_k * reward_k`` (plus shaping), ``reward_components`` holds each ``reward_k`` as a column, and
    ``reward/<name>_mean`` each one's mean over the first round. The default, correctness with weight 1, gives the
    correctness reward itself. Dynamic sampling still filters on correctness. A function of the user's own
    also logs ``reward/<name>_errors`` and ``reward/<name>_timeouts`` (responses that scored 0 for a failed
    call, over every round). When the functions are the user's own and exclude correctness, math-verify is not
    run and the weighted sum stands for correctness in ``reward_mean``, ``accuracy`` and dynamic sampling
    (``tepo.rewards.functions``).
    """
    names = [name for name, _ in reward_functions]
    weights = torch.tensor([float(w) for _, w in reward_functions], dtype=torch.float32)
    g = settings.group_size
    kept_batches, kept_rewards, kept_status, kept_problems, kept_components = [], [], [], [], []
    stats = defaultdict(float)
    rounds = 1 + (max_resample_rounds if dynamic_sampling else 0)
    first_rewards = None
    for round_index in range(rounds):
        problems = stream.take(prompts)
        batch = sample(rollout, tokenizer, problems, settings, seed + round_index)
        start = time.perf_counter()
        scored = score_responses(pool, names, batch.texts, problems, g)
        stats["reward_seconds"] += time.perf_counter() - start
        stats["gen_seconds"] += batch.gen_seconds
        stats["gen_tokens"] += batch.num_generated_tokens
        device = batch.input_ids.device
        components = torch.tensor(scored.columns, dtype=torch.float32, device=device).T
        weighted = components @ weights.to(device)
        verdicts = scored.verdicts
        if verdicts is None:  # a task of the user's own: its functions' weighted sum stands for correctness
            rewards, statuses = weighted, ["scored"] * len(weighted)
        else:
            rewards = torch.tensor([v.reward for v in verdicts], dtype=torch.float32, device=device)
            statuses = [v.status for v in verdicts]
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
        if first_rewards is None:
            first_rewards = rewards
            for name, column in zip(names, components.T):
                stats[f"reward/{name}_mean"] = float(column.mean())
        stats["reward_timeouts"] += statuses.count("timeout")
        stats["reward_errors"] += statuses.count("error")
        stats["no_answer"] += statuses.count("no_answer")
        for name in scored.errors:
            stats[f"reward/{name}_errors"] += scored.errors[name]
            stats[f"reward/{name}_timeouts"] += scored.timeouts[name]
        stats["rounds"] += 1
        if dynamic_sampling:
            result = filter_groups(rewards, g)
            stats["groups_total"] += result.metrics["groups_total"]
            stats["groups_dropped"] += result.metrics["groups_total"] - result.metrics["groups_kept"]
            keep_rows = result.keep_mask.nonzero().squeeze(1)
            if len(keep_rows):
                kept_batches.append(select_rollout_rows(batch, keep_rows))
                kept_rewards.append(shaped[keep_rows])
                kept_components.append(components[keep_rows])
                kept_status += [statuses[i] for i in keep_rows.tolist()]
                kept_problems += [problems[int(i) // g] for i in keep_rows[::g].tolist()]
        else:
            kept_batches.append(batch)
            kept_rewards.append(shaped)
            kept_components.append(components)
            kept_status += statuses
            kept_problems += problems
        if sum(len(r) for r in kept_rewards) >= prompts * g:
            break
    stats["reward_mean"] = float(first_rewards.mean())
    stats["reward_std"] = float(first_rewards.std()) if len(first_rewards) > 1 else 0.0
    stats["accuracy"] = float((first_rewards > 0.5).float().mean())
    if overlong is not None:
        stats["overlong_penalty_mean"] = stats.pop("overlong_penalty_sum") / stats.pop(
            "overlong_penalty_rows"
        )
    stats["frac_groups_dropped"] = (
        stats["groups_dropped"] / stats["groups_total"] if stats["groups_total"] else 0.0
    )
    if not kept_batches:
        return Collected(batch=None, rewards=None, metrics=dict(stats))
    batch = concat_rollouts(kept_batches, rollout.pad_token_id)
    rewards, components = torch.cat(kept_rewards), torch.cat(kept_components)
    limit = prompts * g
    if len(rewards) > limit:
        batch = select_rollout_rows(batch, torch.arange(limit, device=batch.input_ids.device))
        rewards, kept_status, kept_problems = rewards[:limit], kept_status[:limit], kept_problems[:prompts]
        components = components[:limit]
    return Collected(
        batch=batch,
        rewards=rewards,
        statuses=kept_status,
        problems=kept_problems,
        metrics=dict(stats),
        reward_components=components,
    )
