"""Host syncs in the update (issue #35, item 5).

On a GPU every ``.item()`` / ``float(tensor)`` / ``bool(tensor)`` / ``nonzero()`` waits for the queued kernels to
finish. The CPU cannot show the stall, but it can count the reads: a ``TorchFunctionMode`` sees each one. The
update reads the host once per optimizer step (plus one read per micro-batch to trim its columns, whose shape
depends on the data), whatever the number of micro-batches; the metrics it returns are unchanged, and a
non-finite loss still skips and counts the step.
"""

from __future__ import annotations

import contextlib
import copy
import os
import traceback
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import tepo
from helpers import random_rollout_batch, tiny_llama
from tepo.losses import compute_policy_loss
from tepo.losses._common import deferred_metrics, resolve_values
from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings
from tepo.training.plan import UpdatePlan, UpdateSettings
from tepo.training.update import RowTensors, update_policy

pytestmark = pytest.mark.usefixtures("one_torch_thread")

GROUPS, G, PROMPT, RESPONSE = 4, 4, 3, 6

_READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__float__,
    torch.Tensor.__int__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
}


# The package's own folder, not any path containing "/tepo/": in a checkout named tepo, the virtualenv's
# transformers lives under .../tepo/.venv/ too, and its reads were counted as tepo's.
_TEPO_SOURCE = str(Path(tepo.__file__).parent) + os.sep


class CountReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # tepo's own reads only: transformers' attention-mask helpers read the padding mask (fast_all) in every
        # forward of a padded batch, which is not tepo's to change.
        if func in _READS and traceback.extract_stack(limit=2)[0].filename.startswith(_TEPO_SOURCE):
            self.count += 1
        return func(*args, **(kwargs or {}))


def _batch() -> RolloutBatch:
    return random_rollout_batch(GROUPS, G, PROMPT, RESPONSE, seed=1)


def _update(micro: int, advantages=None, loss="tepo", count=False):
    model = copy.deepcopy(tiny_llama(0).train())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _u: 1.0)
    if advantages is None:
        advantages = torch.linspace(-1.5, 1.5, GROUPS * G)
    settings = UpdateSettings(
        loss=loss,
        loss_options={"kl_coef": 0.1, "entropy_coef": 0.01},
        epochs=1,
        mini_batch_groups=GROUPS,
        group_size=G,
        max_grad_norm=1.0,
        max_len=float(RESPONSE),
    )
    logprob = LogprobSettings(
        micro_batch_size=micro,
        temperature=1.0,
        autocast_bf16=False,
        share_prompt_prefix=False,
        train_attention="model",
    )
    batch = _batch()
    ref = torch.zeros(GROUPS * G, RESPONSE) - 3.0
    counter = CountReads()
    with counter if count else contextlib.nullcontext():
        out = update_policy(
            model,
            optimizer,
            scheduler,
            batch,
            RowTensors(advantages=advantages, mask=batch.response_mask, ref_logp=ref),
            UpdatePlan(settings, logprob),
            generator=torch.Generator().manual_seed(0),
        )
    return out, counter.count, model


def test_host_reads_do_not_grow_with_the_number_of_micro_batches():
    _, one_micro, _ = _update(GROUPS * G, count=True)  # 1 micro-batch
    _, eight_micro, _ = _update(2, count=True)  # 8 micro-batches
    assert one_micro > 0, "the counter must see tepo's own reads (else this test passes vacuously)"
    per_extra_micro = (eight_micro - one_micro) / 7
    # One read per micro-batch remains: trimming its columns needs their count on the host. Before the fix each
    # micro-batch read 37 values here (counted on the former code: the loss check, each metric's sums and counts,
    # token and entropy sums, the default token counts, the mask check, two nonzero()).
    assert per_extra_micro <= 1, (one_micro, eight_micro)


@pytest.mark.parametrize("loss", ["tepo", "grpo", "gspo_token", "cispo"])
def test_deferred_metrics_equal_the_eager_floats(loss):
    gen = torch.Generator().manual_seed(3)
    n, t = 6, 7
    mask = (torch.rand(n, t, generator=gen) > 0.3).float()
    mask[2] = 0  # an empty row
    logp = -torch.rand(n, t, generator=gen) * 3
    kwargs = dict(
        logp=logp.requires_grad_(),
        old_logp=logp.detach() + 0.2 * torch.randn(n, t, generator=gen),
        advantages=torch.randn(n, generator=gen),
        mask=mask,
        ref_logp=logp.detach() - 0.1,
        entropy=torch.rand(n, t, generator=gen),
        old_entropy=torch.rand(n, t, generator=gen),
        kl_coef=0.1,
        entropy_coef=0.01,
    )
    try:
        eager_loss, eager = compute_policy_loss(loss, **kwargs)
    except (ValueError, KeyError):
        pytest.skip(f"{loss} takes other options")
    with deferred_metrics():
        lazy_loss, lazy = compute_policy_loss(loss, **kwargs)
    assert torch.equal(eager_loss, lazy_loss)
    assert list(lazy) == list(eager)
    resolved = dict(zip(lazy, resolve_values(list(lazy.values()))))
    assert resolved == eager  # exactly the same python floats, key by key
    # nothing empty: an all-masked call gives the eager path's "empty" values too
    kwargs["mask"] = torch.zeros(n, t)
    _, eager = compute_policy_loss(loss, **kwargs)
    with deferred_metrics():
        _, lazy = compute_policy_loss(loss, **kwargs)
    assert dict(zip(lazy, resolve_values(list(lazy.values())))) == eager


def test_a_non_finite_loss_still_skips_and_counts_the_step():
    advantages = torch.linspace(-1.5, 1.5, GROUPS * G)
    advantages[9] = float("nan")  # the fifth of eight micro-batches of 2 rows
    before = torch.cat([p.detach().flatten() for p in tiny_llama(0).parameters()])
    out, _, model = _update(2, advantages=advantages)
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert out.metrics["update/skipped_updates"] == 1 and out.metrics["update/optimizer_updates"] == 0
    assert torch.equal(before, after)  # nothing applied
    # The early-stop rule: the token views cover the micro-batches up to and including the bad one, no later one.
    assert out.token_entropy[:10].abs().sum() > 0
    assert out.token_entropy[10:].abs().sum() == 0
    # Metrics: the four micro-batches before the bad one (finite values only).
    assert all(
        v == v
        for k, v in out.metrics.items()
        if isinstance(v, float) and k not in ("update/grad_norm", "update/grad_norm_max")
    )
    mask = _batch().response_mask[:8]
    before_bad = float((out.token_entropy[:8] * mask).sum() / mask.sum())
    assert out.metrics["update/entropy_mean"] == pytest.approx(before_bad, rel=1e-5)
