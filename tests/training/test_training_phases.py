"""The training step's phases called on their own: mini-batch order, sample+score with dynamic-sampling refill,
and the batch assembly helpers they use. The verifier is the real reward pool; the rollout is a scripted backend
(the phase under test is the bookkeeping around generation, not generation itself)."""

from __future__ import annotations

import pytest
import torch

from scripted_collect import ScriptedRollout, collect_scripted, problem_stream
from tepo.batch import concat_rollouts, select_rollout_rows, trim_columns
from tepo.rewards import RewardPool
from tepo.rollout.base import RolloutBatch
from tepo.training.collect import OverlongShaping
from tepo.training.update import minibatch_rows

# --------------------------------------------------------------------------------------------------------------
# Mini-batch order
# --------------------------------------------------------------------------------------------------------------


def test_one_epoch_keeps_rollout_order_and_draws_no_randomness():
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    out = list(minibatch_rows(3, 2, epochs=1, mini_batch_groups=2, generator=gen))
    assert [(e, r.tolist()) for e, r in out] == [(0, [0, 1, 2, 3]), (0, [4, 5])]
    assert torch.equal(gen.get_state(), state)


def test_several_epochs_shuffle_whole_groups_once_per_epoch():
    out = list(
        minibatch_rows(4, 3, epochs=3, mini_batch_groups=2, generator=torch.Generator().manual_seed(0))
    )
    assert [e for e, _ in out] == [0, 0, 1, 1, 2, 2]
    orders = []
    for epoch in range(3):
        rows = torch.cat([r for e, r in out if e == epoch])
        assert sorted(rows.tolist()) == list(range(12)), "each epoch covers every row exactly once"
        groups = rows.view(-1, 3)
        assert torch.equal(groups - groups[:, :1], torch.arange(3).expand(4, 3)), (
            "a group's rows stay together"
        )
        orders.append((groups[:, 0] // 3).tolist())
    # The same generator seed gives the same order; the epochs are drawn, not all rollout order.
    again = list(
        minibatch_rows(4, 3, epochs=3, mini_batch_groups=2, generator=torch.Generator().manual_seed(0))
    )
    assert all(torch.equal(a[1], b[1]) for a, b in zip(out, again))
    assert orders != [[0, 1, 2, 3]] * 3


# --------------------------------------------------------------------------------------------------------------
# Sample + score + dynamic-sampling refill
# --------------------------------------------------------------------------------------------------------------


RIGHT, WRONG = r"\boxed{3}", r"\boxed{4}"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=1, timeout_s=10.0) as p:
        yield p


def test_dynamic_sampling_drops_equal_groups_refills_and_cuts_to_the_batch_size(pool):
    # Round 0: group 0 all right (dropped), group 1 mixed (kept). Round 1: both mixed (kept) -> 3 groups, cut to 2.
    script = [[RIGHT, RIGHT, RIGHT, WRONG], [WRONG, RIGHT, RIGHT, WRONG]]
    rollout = ScriptedRollout(script)
    stream = problem_stream(10, seed=5)
    expected_order = problem_stream(10, seed=5).take(4)
    got = collect_scripted(rollout, stream, pool, seed=100, dynamic_sampling=True, max_resample_rounds=3)
    assert rollout.seeds == [100, 101], (
        "round r samples with seed + r, and sampling stops once the batch is full"
    )
    assert got.rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert [p.id for p in got.problems] == [expected_order[1].id, expected_order[2].id]
    assert got.batch.texts == [RIGHT, WRONG, WRONG, RIGHT]
    index = got.batch.prompt_index.tolist()  # labels, not positions: rows of one prompt share one
    assert index[0] == index[1] != index[2] == index[3]
    m = got.metrics
    assert (m["rollout/rounds"], m["rollout/groups_total"], m["rollout/groups_dropped"]) == (2, 4, 1)
    assert m["rollout/frac_groups_dropped"] == 0.25
    # Reward metrics describe the first round only (the refill is biased toward mixed groups).
    assert m["reward/mean"] == 0.75 and m["reward/accuracy"] == 0.75
    assert m["time/gen_seconds"] == 1.0
    assert stream.state_dict() == {"epoch": 0, "offset": 4}


def test_dynamic_sampling_that_keeps_nothing_returns_no_batch(pool):
    rollout = ScriptedRollout([[RIGHT, RIGHT], [WRONG, WRONG]])
    got = collect_scripted(
        rollout, problem_stream(3), pool, prompts=1, dynamic_sampling=True, max_resample_rounds=1
    )
    assert got.batch is None and got.rewards is None
    assert got.metrics["rollout/groups_dropped"] == 2 and got.metrics["rollout/rounds"] == 2


def test_without_dynamic_sampling_one_round_is_taken_as_is(pool):
    rollout = ScriptedRollout([[RIGHT, RIGHT, WRONG, "no answer here"]])
    got = collect_scripted(rollout, problem_stream(4), pool, seed=9)
    assert got.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert got.statuses[3] == "no_answer" and got.metrics["reward/no_answer"] == 1
    assert "rollout/groups_total" not in got.metrics or got.metrics["rollout/groups_total"] == 0


# --------------------------------------------------------------------------------------------------------------
# Batch assembly
# --------------------------------------------------------------------------------------------------------------


def _batch(prompt: list[int], responses: list[list[int]], logp: bool = True) -> RolloutBatch:
    n, p, t = len(responses), len(prompt), max(len(r) for r in responses)
    ids = torch.full((n, p + t), 0, dtype=torch.long)
    att = torch.zeros_like(ids)
    rmask = torch.zeros(n, t)
    for i, resp in enumerate(responses):
        ids[i, :p] = torch.tensor(prompt)
        att[i, :p] = 1
        ids[i, p : p + len(resp)] = torch.tensor(resp)
        att[i, p : p + len(resp)] = 1
        rmask[i, : len(resp)] = 1
    return RolloutBatch(
        input_ids=ids,
        attention_mask=att,
        response_mask=rmask,
        response_len=t,
        prompt_index=torch.zeros(n, dtype=torch.long),
        texts=[str(r) for r in responses],
        truncated=torch.zeros(n, dtype=torch.bool),
        gen_seconds=1.0,
        num_generated_tokens=int(rmask.sum()),
        rollout_logp=-rmask * 0.5 if logp else None,
    )


def test_concat_rollouts_repads_prompts_left_and_responses_right():
    a = _batch([5, 6], [[1], [2]])
    b = _batch([7, 8, 9], [[3, 4, 4], [1, 1]])
    both = concat_rollouts([a, b], pad_token_id=0)
    assert both.response_len == 3 and both.prompt_len == 3
    assert both.input_ids.tolist() == [
        [0, 5, 6, 1, 0, 0],
        [0, 5, 6, 2, 0, 0],
        [7, 8, 9, 3, 4, 4],
        [7, 8, 9, 1, 1, 0],
    ]
    assert both.attention_mask.tolist() == [
        [0, 1, 1, 1, 0, 0],
        [0, 1, 1, 1, 0, 0],
        [1] * 6,
        [1, 1, 1, 1, 1, 0],
    ]
    assert both.response_mask.tolist() == [[1, 0, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]]
    assert both.prompt_index.tolist() == [0, 0, 1, 1]
    assert both.rollout_logp.tolist() == [[-0.5, 0, 0], [-0.5, 0, 0], [-0.5] * 3, [-0.5, -0.5, 0]]
    assert both.gen_seconds == 2.0 and both.num_generated_tokens == 7
    # A round without the sampler's log-probs means the merged batch has none (not a half-filled tensor).
    assert concat_rollouts([a, _batch([1], [[2]], logp=False)], 0).rollout_logp is None


def test_select_rows_and_trim_columns():
    batch = _batch([5, 6], [[1, 2, 3], [4], [5, 6]])
    picked = select_rollout_rows(batch, torch.tensor([1, 2]))
    assert picked.texts == ["[4]", "[5, 6]"] and picked.num_generated_tokens == 3
    assert picked.rollout_logp.tolist() == [[-0.5, 0, 0], [-0.5, -0.5, 0]]
    ids, att, t, cols = trim_columns(picked.input_ids, picked.attention_mask, picked.response_len)
    assert t == 2 and cols == slice(0, 2)
    assert ids.tolist() == [[5, 6, 4, 0], [5, 6, 5, 6]]
    assert att.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    # Prompt columns that are padding in every row are dropped too.
    left = concat_rollouts([_batch([9], [[1]]), _batch([9], [[2]])], 0)
    padded = torch.cat([torch.zeros(2, 2, dtype=torch.long), left.input_ids], 1)
    ids, _, t, _ = trim_columns(
        padded, torch.cat([torch.zeros(2, 2, dtype=torch.long), left.attention_mask], 1), 1
    )
    assert ids.tolist() == [[9, 1], [9, 2]] and t == 1


def test_overlong_shaping_adds_the_length_penalty_but_groups_are_filtered_on_correctness(pool):
    # Response lengths of the scripted rollout: 1, 2, 3, 1 tokens. Limit 3, buffer 2: penalties 0, -0.5, -1, 0.
    # Group 0 is all wrong (its shaped rewards differ by length, yet it is dropped); group 1 is mixed.
    rollout = ScriptedRollout([[WRONG, WRONG, RIGHT, WRONG]])
    overlong = OverlongShaping(max_len=3, buffer_len=2, penalty_factor=1.0)
    got = collect_scripted(rollout, problem_stream(2), pool, dynamic_sampling=True, overlong=overlong)
    assert got.rewards.tolist() == [0.0, 0.0]  # group 1 only: 1 - 1 (3 tokens) and 0 + 0 (1 token)
    assert got.batch.texts == [RIGHT, WRONG]
    assert got.metrics["rollout/groups_dropped"] == 1
    assert got.metrics["reward/mean"] == 0.25, "reward/mean stays correctness"
    assert got.metrics["reward/overlong_penalty_mean"] == -0.375
