"""One update phase (``update_policy``) run on a tiny Llama and a random batch, for the tests that compare updates
(tests/training/test_training_update*.py; their ``model`` and ``batch`` fixtures are in tests/training/conftest.py):
the batch's shape, the log-prob settings, the parameters after one SGD step, and a batch with sampler log-probs."""

from __future__ import annotations

import copy

import torch

from tepo.rollout.base import RolloutBatch
from tepo.training.logprob_pass import LogprobSettings, batch_logprobs
from tepo.training.plan import UpdatePlan, UpdateSettings
from tepo.training.update import RowTensors, update_policy

GROUPS, G, PROMPT, RESPONSE = 8, 4, 3, 6


def logprob_settings(micro: int, tokens: int | None = None) -> LogprobSettings:
    return LogprobSettings(
        micro_batch_size=micro,
        temperature=1.0,
        autocast_bf16=False,
        share_prompt_prefix=False,
        train_attention="model",
        micro_batch_tokens=tokens,
    )


def updated_params(
    model,
    batch,
    loss,
    micro,
    *,
    loss_options=None,
    mini_groups=GROUPS,
    tokens=None,
    correction=None,
    **tensors,
) -> torch.Tensor:
    """Parameters after one step of update_policy with plain SGD (lr 1): the summed gradient, exactly applied.
    ``tensors``: RowTensors fields beside the advantages (``loss_mask`` as ``mask``)."""
    model = copy.deepcopy(model)
    torch.manual_seed(123)  # clip_cov draws its token set from torch's RNG: the same draw for every size
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    advantages = tensors.pop("advantages", torch.linspace(-1.5, 1.5, GROUPS * G))
    mask = tensors.pop("loss_mask", None)
    settings = UpdateSettings(
        loss=loss,
        loss_options=loss_options or {},
        epochs=1,
        mini_batch_groups=mini_groups,
        group_size=G,
        max_grad_norm=1e9,
        max_len=float(RESPONSE),
    )
    plan = UpdatePlan(settings, logprob_settings(micro, tokens), correction)
    mask = batch.response_mask if mask is None else mask
    apply_update(model, optimizer, batch, plan, advantages=advantages, mask=mask, **tensors)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def apply_update(model, optimizer, batch, plan: UpdatePlan, *, scheduler=None, **rows) -> dict:
    """``update_policy`` of ``model`` on ``batch`` with ``RowTensors(**rows)`` (``rollout_logp``: the batch's unless
    given), a constant learning rate unless ``scheduler``, and the mini-batch order drawn from a generator seeded
    0; returns its metrics."""
    if scheduler is None:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _u: 1.0)
    rows.setdefault("rollout_logp", batch.rollout_logp)
    generator = torch.Generator().manual_seed(0)
    return update_policy(model, optimizer, scheduler, batch, RowTensors(**rows), plan, generator=generator)


def with_sampler_logp(batch: RolloutBatch, model) -> RolloutBatch:
    """The batch with made-up sampler log-probs: the trainer's own, shifted per token (some beyond 2x)."""
    logp = batch_logprobs(model, batch, logprob_settings(32), entropy=False).logp
    shift = torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)
    out = copy.copy(batch)
    out.rollout_logp = (logp + shift) * batch.response_mask
    return out
