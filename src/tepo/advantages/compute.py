"""`compute_advantages`: validate, hand an estimator exactly the inputs it declared, check its output."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tepo.advantages._common import validate_rewards
from tepo.advantages.registry import INPUT_SHAPES, TENSOR_INPUTS, get_advantage_estimator


def compute_advantages(
    name: str,
    rewards: Tensor,
    group_size: int,
    *,
    logp: Tensor | None = None,
    old_logp: Tensor | None = None,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    mask: Tensor | None = None,
    sum_pi_squared: Tensor | None = None,
    reward_components: Tensor | None = None,
    reward_weights: Tensor | None = None,
    **options: Any,
) -> Tensor:
    """Advantages of estimator ``name`` for ``rewards`` ``[N]`` grouped by ``group_size``.

    Pass every per-token tensor available (``[N, T]``; None for those not computed), and with several reward
    functions ``reward_components`` ``[N, K]`` (rewards = their weighted sum) and ``reward_weights`` ``[K]``
    (GDPO reads them): the estimator receives
    only those it declared (`tepo.advantages.estimator_requires`), detached; a declared one that is None raises
    ValueError. ``options`` are the estimator's own. Returns ``[N]`` (sequence-level) or ``[N, T]``
    (token-level), detached, in float32 unless rewards are float64. Unknown names or options raise ValueError
    listing the valid ones.
    """
    est = get_advantage_estimator(name)
    est.check_options(options)
    rewards, group_size = validate_rewards(rewards, group_size)
    needed = est.requires_for(options)
    available = {
        "logp": logp,
        "old_logp": old_logp,
        "ref_logp": ref_logp,
        "entropy": entropy,
        "mask": mask,
        "sum_pi_squared": sum_pi_squared,
        "reward_components": reward_components,
        "reward_weights": reward_weights,
    }
    if "mask" in needed and mask is None and est.token_level:
        raise ValueError(f"advantage estimator {name!r} is token-level and needs mask=[N, T] (got none)")
    missing = [key for key in TENSOR_INPUTS if key in needed and available[key] is None]
    if missing:
        shapes = ", ".join(f"{key}={INPUT_SHAPES.get(key, '[N, T]')}" for key in missing)
        raise ValueError(
            f"advantage estimator {name!r} needs {shapes} but "
            f"{'it was' if len(missing) == 1 else 'they were'} not given (with these options it reads "
            f"{', '.join(k for k in TENSOR_INPUTS if k in needed)}; see tepo.advantages.estimator_requires)"
        )
    inputs = {key: _detached(value) for key, value in available.items() if key in needed}

    out_dtype = torch.float64 if rewards.dtype == torch.float64 else torch.float32
    adv = est.fn(rewards.to(torch.float64), group_size, **inputs, **options)
    if not isinstance(adv, Tensor):
        raise TypeError(f"advantage estimator {name!r} returned {type(adv).__name__}, expected a Tensor")
    n = rewards.shape[0]
    expected = "[N, T]" if est.token_level else "[N]"
    if adv.shape[:1] != (n,) or adv.dim() != (2 if est.token_level else 1):
        raise ValueError(
            f"advantage estimator {name!r} returned shape {tuple(adv.shape)}, expected {expected} with N={n}"
        )
    if est.token_level and "mask" in inputs and adv.shape != inputs["mask"].shape:
        raise ValueError(
            f"advantage estimator {name!r} returned shape {tuple(adv.shape)}, expected the mask's shape "
            f"{tuple(inputs['mask'].shape)}"
        )
    return adv.detach().to(out_dtype)


def _detached(value: Any) -> Any:
    return value.detach() if isinstance(value, Tensor) else value
