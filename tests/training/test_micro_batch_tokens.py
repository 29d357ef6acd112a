"""Token-budget micro-batches (``train.micro_batch_tokens``, `tepo.training.micro_batches`).

The planner by hand (sorted next-fit on the padded area), and the update's gradient in float64: every registered
loss, TEPO's sequence aggregations and the mini-batch-statistics options give the same parameters with
fixed-row micro-batches in rollout order and with token-budget micro-batches (rows permuted, uneven counts).
"""

from __future__ import annotations

import copy
import re

import pytest
import torch

from helpers import rollout_batch_of, tiny_llama
from tepo.losses import list_policy_losses
from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings, batch_logprobs
from tepo.training.micro_batches import MicroBatchLayout, RowLengths, split_rows
from tepo.training.plan import UpdatePlan, UpdateSettings
from tepo.training.update import RowTensors, update_policy

GROUPS, G, PROMPT, RESPONSE = 4, 4, 5, 9


def _batch(prompt_lengths, response_lengths, *, prompt=PROMPT, response=RESPONSE, seed=1) -> RolloutBatch:
    """Left-padded prompts, right-padded responses of the given real lengths (one prompt per group of G)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(response_lengths)
    p_len = torch.tensor(prompt_lengths).repeat_interleave(G)[:n]
    r_len = torch.tensor(response_lengths)
    p_mask = torch.arange(prompt)[None] >= (prompt - p_len)[:, None]
    r_mask = torch.arange(response)[None] < r_len[:, None]
    prompts = torch.randint(1, 90, (n // G + 1, prompt), generator=gen).repeat_interleave(G, 0)[:n]
    ids = torch.cat([prompts * p_mask, torch.randint(1, 90, (n, response), generator=gen) * r_mask], 1)
    return rollout_batch_of(ids, torch.cat([p_mask, r_mask], 1).long(), r_mask.float(), G)


# ---- the planner ------------------------------------------------------------------------------------------------


def test_sorted_next_fit_by_hand():
    # Rows (prompt + response): 0: 2+1, 1: 2+9, 2: 2+4, 3: 2+8, 4: 3+2, 5: 3+9, 6: 3+3, 7: 3+1.
    batch = _batch([2, 3], [1, 9, 4, 8, 2, 9, 3, 1])
    lengths = RowLengths.of(batch)
    assert lengths.prompt.tolist() == [2, 2, 2, 2, 3, 3, 3, 3]
    # Sorted by response, then prompt, longest first: 5 (3+9), 1 (2+9), 3, 2, 6, 4, 7 (3+1), 0 (2+1).
    # Budget 24: {5, 1} is 2 x (3 + 9) = 24; adding 3 would be 36. {3, 2}: 2 x (2 + 8) = 20; + 6: 3 x (3 + 8) = 33.
    # {6, 4, 7, 0}: 4 x (3 + 3) = 24.
    got = split_rows(torch.arange(8), MicroBatchLayout(rows=16, tokens=24), lengths)
    assert [m.tolist() for m in got] == [[5, 1], [3, 2], [6, 4, 7, 0]]
    computed, real = lengths.padded_tokens(got)
    assert (computed, real) == (24 + 20 + 24, 12 + 11 + 10 + 6 + 6 + 5 + 4 + 3)
    # Fixed rows in rollout order: 4 x (2 + 9) = 44 and 4 x (3 + 9) = 48 computed for the same 57 real tokens.
    fixed = split_rows(torch.arange(8), MicroBatchLayout(rows=4))
    assert [m.tolist() for m in fixed] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert lengths.padded_tokens(fixed) == (92, 57)


def test_a_row_over_the_budget_runs_alone_and_every_row_runs_once():
    batch = _batch([2, 3, 5, 1], [9, 1, 2, 3, 9, 9, 4, 5, 6, 7, 8, 1, 1, 1, 2, 9])
    lengths = RowLengths.of(batch)
    rows = torch.tensor([8, 9, 10, 11, 0, 1, 2, 3])  # a mini-batch: two groups, not in index order
    for budget in (1, 7, 13, 30, 1000):
        got = split_rows(rows, MicroBatchLayout(rows=2, tokens=budget), lengths)
        assert sorted(torch.cat(got).tolist()) == sorted(rows.tolist())
        for micro in got:
            area = lengths.padded_tokens([micro])[0]
            assert area <= budget or len(micro) == 1, (budget, micro, area)
    assert len(split_rows(rows, MicroBatchLayout(rows=2, tokens=1000), lengths)) == 1


def test_the_layout_is_checked():
    with pytest.raises(ValueError, match="rows must be >= 1"):
        MicroBatchLayout(rows=0)
    with pytest.raises(ValueError, match="token budget"):
        MicroBatchLayout(rows=4, tokens=0)
    with pytest.raises(ValueError, match="RowLengths"):
        split_rows(torch.arange(4), MicroBatchLayout(rows=4, tokens=8))


# ---- the update's gradient, float64 -----------------------------------------------------------------------------

# Prompt lengths per group and response lengths per row: uneven, so the token budget reorders and splits.
PROMPTS = [5, 2, 4, 3]
RESPONSES = [9, 1, 4, 7, 2, 9, 3, 5, 6, 8, 1, 2, 9, 4, 7, 3]
# Fixed rows: 3 per micro-batch in rollout order. Budget 26: micro-batches of 1 to 4 rows, sorted by length.
FIXED, BUDGET = 3, 26


@pytest.fixture(scope="module")
def model64():
    return tiny_llama(0).double().train()


@pytest.fixture(scope="module")
def batch64(model64):
    batch = _batch(PROMPTS, RESPONSES)
    settings = LogprobSettings(16, 1.0, False, False, "model")
    logp = batch_logprobs(model64, batch, settings, entropy=False).logp
    shift = torch.linspace(-0.8, 0.8, logp.numel(), dtype=logp.dtype).view_as(logp)
    batch.rollout_logp = (logp + shift) * batch.response_mask  # a sampler off the trainer's policy
    return batch


def _tensors(model, batch, *, with_old: bool) -> RowTensors:
    settings = LogprobSettings(16, 1.0, False, False, "model")
    mask = batch.response_mask  # float32, as in a run (the log-probs are float64)
    old_logp = old_entropy = None
    if with_old:  # the old policy shifted off ratio 1, as after an earlier update
        old_logp, old_entropy, _ = batch_logprobs(model, batch, settings, entropy=True)
        signs = torch.sign(torch.randn(old_logp.shape, generator=torch.Generator().manual_seed(3)))
        old_logp = (old_logp + 0.2 * signs.double()) * mask
    return RowTensors(
        advantages=torch.linspace(-1.5, 1.5, len(RESPONSES), dtype=torch.float64),
        mask=mask,
        old_logp=old_logp,
        old_entropy=old_entropy,
        ref_logp=(batch.rollout_logp - 0.3) * mask,
        rollout_logp=batch.rollout_logp,
    )


def _params_after(
    model, batch, tensors, loss, options, *, micro, tokens, mini_groups=GROUPS // 2, share=False
):
    model = copy.deepcopy(model)
    torch.manual_seed(123)  # clip_cov draws its token set from torch's RNG: the same draw for both layouts
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _u: 1.0)
    passes = LogprobSettings(micro, 1.0, False, share, "model", micro_batch_tokens=tokens)
    settings = UpdateSettings(loss, options, 1, mini_groups, G, 1e9, float(RESPONSE))
    out = update_policy(
        model,
        optimizer,
        scheduler,
        batch,
        tensors,
        UpdatePlan(settings, passes),
        generator=torch.Generator().manual_seed(0),
    )
    return torch.cat([p.detach().flatten() for p in model.parameters()]), out


CASES = [(name, {}, False) for name in list_policy_losses()] + [
    # TEPO's sequence aggregations (the normaliser is the mini-batch's sequence count or length bound).
    ("tepo", {"agg": "seq-mean-token-mean"}, False),
    ("tepo", {"agg": "seq-mean-token-sum-norm"}, False),
    ("tepo", {"agg": "seq-mean-token-sum"}, True),
    # Batch-wide selections (mini_batch_stats), from the old pass and from a no-grad pass at the current weights.
    ("tepo", {"top_entropy_quantile": 0.3}, False),
    ("tepo", {"top_entropy_quantile": 0.3, "agg": "seq-mean-token-mean"}, True),
    ("dapo", {"m2po_threshold": 0.05}, False),
    ("clip_cov", {"clip_cov_ratio": 0.3, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0}, True),
    ("kl_cov", {"kl_cov_ratio": 0.2, "top_entropy_quantile": 0.5, "m2po_threshold": 0.1}, True),
    # Regularisers with their own counts: KL to the reference and the entropy bonus.
    ("grpo", {"kl_coef": 0.1, "entropy_coef": 0.01}, True),
]


@pytest.mark.parametrize(("loss", "options", "with_old"), CASES, ids=lambda v: str(v))
def test_token_budget_gives_the_fixed_row_gradient_for_every_loss(model64, batch64, loss, options, with_old):
    tensors = _tensors(model64, batch64, with_old=with_old)
    start = torch.cat([p.detach().flatten() for p in model64.parameters()])
    fixed, _ = _params_after(model64, batch64, tensors, loss, options, micro=FIXED, tokens=None)
    budget, out = _params_after(model64, batch64, tensors, loss, options, micro=FIXED, tokens=BUDGET)
    step = (fixed - start).abs().max()
    assert step > 1e-6, f"{loss} {options}: the update changed nothing, the comparison would be vacuous"
    # float64: the two layouts differ only in the order of the gradient sums.
    torch.testing.assert_close(budget, fixed, rtol=1e-10, atol=1e-12 * float(step))
    assert 0 <= out.metrics["update/padding_share"] < 1


def test_the_budget_actually_regroups_the_rows(batch64):
    lengths = RowLengths.of(batch64)
    rows = torch.arange(2 * G)  # the first mini-batch of the test above
    budget = split_rows(rows, MicroBatchLayout(FIXED, BUDGET), lengths)
    fixed = split_rows(rows, MicroBatchLayout(FIXED))
    assert [m.tolist() for m in budget] != [m.tolist() for m in fixed]
    assert len({len(m) for m in budget}) > 1  # uneven micro-batches
    assert lengths.padded_tokens(budget)[0] < lengths.padded_tokens(fixed)[0]


def test_shared_prompt_with_a_token_budget_keeps_the_gradient(model64, batch64):
    # The prompt is shared by the rows of its group that land in one micro-batch (any subset of the group).
    # The shared-prompt pass itself differs from the plain one at float32 level even in a float64 model (1.3e-8
    # of a 0.18 step here, with fixed rows too: tests/training/test_shared_prompt.py); a budget adds nothing beyond that.
    tensors = _tensors(model64, batch64, with_old=True)
    start = torch.cat([p.detach().flatten() for p in model64.parameters()])
    plain, _ = _params_after(model64, batch64, tensors, "tepo", {}, micro=FIXED, tokens=None)
    step = float((plain - start).abs().max())
    shared_fixed, _ = _params_after(
        model64, batch64, tensors, "tepo", {}, micro=FIXED, tokens=None, share=True
    )
    shared, _ = _params_after(model64, batch64, tensors, "tepo", {}, micro=FIXED, tokens=BUDGET, share=True)
    torch.testing.assert_close(shared_fixed, plain, rtol=0, atol=1e-6 * step)
    torch.testing.assert_close(shared, plain, rtol=0, atol=1e-6 * step)


# ---- train.micro_batch_tokens: auto ------------------------------------------------------------------------------


def test_auto_resolves_by_response_length():
    """auto: fixed rows below AUTO_FROM_NEW_TOKENS new tokens (the default run's 64 included), the sorted
    AUTO_BUDGET_TOKENS budget from there on; an explicit value or None is kept as given."""
    from tepo.training.micro_batches import (
        AUTO_BUDGET_TOKENS,
        AUTO_FROM_NEW_TOKENS,
        resolve_micro_batch_tokens,
    )

    # The measured choice (docs/performance.md).
    assert (AUTO_FROM_NEW_TOKENS, AUTO_BUDGET_TOKENS) == (512, 4096)
    assert resolve_micro_batch_tokens("auto", 64) is None
    assert resolve_micro_batch_tokens("auto", 256) is None
    assert resolve_micro_batch_tokens("auto", 511) is None
    assert resolve_micro_batch_tokens("auto", 512) == 4096
    assert resolve_micro_batch_tokens("auto", 8192) == 4096
    assert resolve_micro_batch_tokens(None, 8192) is None
    assert resolve_micro_batch_tokens(2048, 64) == 2048


def _plan(overrides):
    from tepo.config import load_config
    from tepo.training.plan import plan_step

    return plan_step(load_config("default", overrides), backend="hf")


def test_the_default_run_keeps_fixed_rows_and_long_responses_get_the_budget():
    """The default config says auto; at its 64 new tokens the step runs today's fixed rows (its metrics stay
    bit-identical), at 512 the log-prob passes and the update get the 4096-token budget."""
    from tepo.config import load_config

    assert load_config("default", []).train.micro_batch_tokens == "auto"
    short = _plan([]).update.passes
    assert short.micro_batch_tokens is None and short.layout == MicroBatchLayout(16, None)
    long = _plan(["rollout.max_new_tokens=512"])
    assert long.update.passes.layout == MicroBatchLayout(16, 4096)
    assert long.update.layout == MicroBatchLayout(16, 4096)
    forced = _plan(["rollout.max_new_tokens=1024", "train.micro_batch_tokens=null"])
    assert forced.update.layout == MicroBatchLayout(16, None)


@pytest.mark.parametrize(
    "value, message",
    [
        ("fast", "must be an int >= 1, auto or null, got 'fast'"),
        (0, "must be an int >= 1, auto or null, got 0"),
        (-5, "must be an int >= 1, auto or null, got -5"),
        (2.5, "expected int | str | None, got 2.5"),  # refused by type, before the value check
        (True, "expected int | str | None, got True"),
    ],
)
def test_a_bad_budget_is_one_clear_message(value, message):
    from tepo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=re.escape(f"train.micro_batch_tokens: {message}")):
        load_config("default", [f"train.micro_batch_tokens={str(value).lower()}"])
