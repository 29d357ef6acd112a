"""The shared-prompt pass of the log-prob computation: each group's prompt run once, its keys and values shared.

The G samples of one prompt share their prompt block. :func:`shared_prompt_hidden` runs that block once per
group with the model's cache on and runs each row's response against its group's keys/values, through a cache
that stores nothing (:class:`_FrozenPrefixLayer`), so activation checkpointing's recomputation sees the same
prefix. ``tepo.logprobs.response_logprobs`` uses it when asked (``prompt_groups``) and when
:func:`checkpointed_cache_allowed` says this transformers version keeps the cache through checkpointed layers.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint
from transformers.cache_utils import DynamicCache, DynamicLayer


class _FrozenPrefixLayer(DynamicLayer):
    """One layer's cache holding a fixed prompt prefix; ``update`` returns prefix + new keys/values, storing nothing.

    Functional on purpose: activation checkpointing runs each layer again in backward, and a cache that appended
    (transformers' ``DynamicLayer``) would then hand the recomputation a prefix with the response in it twice.
    """

    def __init__(self, keys: Tensor, values: Tensor):
        super().__init__()
        self.keys, self.values = keys, values
        self.device = keys.device
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        return torch.cat([self.keys, key_states], -2), torch.cat([self.values, value_states], -2)


def checkpointed_cache_allowed(body) -> bool:
    """Whether the shared-prompt cache survives the layers' gradient checkpointing in this transformers version.

    :func:`shared_prompt_hidden` sets transformers' private ``GradientCheckpointingLayer._can_checkpoint_with_cache``
    on each layer so a checkpointed layer keeps the prefix cache. A version without that attribute (the device
    machine has transformers 5.17; this was written against 5.25) may drop the cache under checkpointing and the
    response rows would attend to no prompt at all, silently. There, with checkpointing active, the plain
    (unshared) pass is used: the same values up to float rounding, only slower.
    """
    layers = list(getattr(body, "layers", []))
    checkpointing = torch.is_grad_enabled() and any(
        getattr(layer, "gradient_checkpointing", False) and layer.training for layer in layers
    )
    return not checkpointing or all(hasattr(type(layer), "_can_checkpoint_with_cache") for layer in layers)


def shared_prompt_hidden(body, input_ids, attention_mask, prompt_len: int, prompt_groups: Tensor) -> Tensor:
    """Hidden states that predict the response tokens, ``[N, T, H]``, with each group's prompt computed once.

    The prompt pass runs on one row per group with the model's cache on, then each row's response runs against its
    group's keys/values (an ``index_select``, so gradients flow back into the one prompt pass). When the model's
    layers are checkpointed and a graph is being built, the prompt pass is checkpointed too, as one block (see
    the comment at the call). It saves the prompt's share of the work G - 1 times over (docs/performance.md).
    """
    groups, inverse = torch.unique(prompt_groups, return_inverse=True)
    # Each group's first row, as the smallest row index holding its id: one scatter instead of a nonzero() (a
    # GPU sync) per group.
    row_ids = torch.arange(len(prompt_groups), device=prompt_groups.device)
    first_rows = torch.full_like(groups, len(prompt_groups)).scatter_reduce(
        0, inverse, row_ids, reduce="amin"
    )
    prompt_ids, prompt_mask = input_ids[:, :prompt_len], attention_mask[:, :prompt_len]
    if not (
        torch.equal(prompt_ids, prompt_ids[first_rows][inverse])
        and torch.equal(prompt_mask, prompt_mask[first_rows][inverse])
    ):
        raise ValueError("prompt_groups puts rows whose prompt columns differ in one group")
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    layers = list(getattr(body, "layers", []))
    prompt_args = (prompt_ids[first_rows], prompt_mask[first_rows], position_ids[first_rows, :prompt_len])
    if torch.is_grad_enabled() and any(getattr(layer, "gradient_checkpointing", False) for layer in layers):
        # Checkpointed as one block when the model's layers are. Else its activations, and the bf16 weight copies
        # its matmuls save under autocast (about 0.2 GB for the embedded model), stay alive through the whole
        # backward, its peak included. It is recomputed once, at the end of backward (1/G of the rows).
        # Reentrant on purpose: every weight is used by the prompt pass and by the response pass, and in one graph
        # autograd holds each weight's response-pass gradient in a buffer until the prompt pass's gradient, the
        # last to come, is added to it: a second whole-model float32 gradient (0.5 GB) at the backward's peak.
        # The reentrant block runs its own backward, which adds straight into .grad. Its price: such a graph
        # supports .backward() but not torch.autograd.grad(); the anchor (an empty tensor that requires grad)
        # makes the block's outputs require grad, since none of its tensor inputs (token ids, masks) does.
        anchor = torch.empty(0, requires_grad=True, device=input_ids.device)
        prompt_hidden, *keys_values = checkpoint(
            _anchored_prompt_pass, body, anchor, *prompt_args, use_reentrant=True
        )
    else:
        prompt_hidden, *keys_values = _prompt_pass(body, *prompt_args)
    half = len(keys_values) // 2
    cache = DynamicCache()
    cache.layers = [
        _FrozenPrefixLayer(keys.index_select(0, inverse), values.index_select(0, inverse))
        for keys, values in zip(keys_values[:half], keys_values[half:])
    ]
    for layer in layers:
        # The cache is functional, so checkpoint recomputation sees the same prefix: let it through.
        layer._can_checkpoint_with_cache = True
    try:
        response_out = body(
            input_ids=input_ids[:, prompt_len:],
            attention_mask=attention_mask,
            position_ids=position_ids[:, prompt_len:],
            use_cache=False,
            # transformers 5 renamed past_key_values to cache (the old name still works, with a warning).
            **{_cache_argument(body): cache},
        )
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache
    # The last prompt position predicts the first response token; response column t predicts column t + 1.
    last_prompt = prompt_hidden.index_select(0, inverse)[:, -1:]
    return torch.cat([last_prompt, response_out.last_hidden_state[:, :-1]], 1)


def _prompt_pass(body, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> tuple[Tensor, ...]:
    """The prompt rows through the body with the cache on: (last hidden state, keys of every layer, values of every
    layer). Eval mode inside, also when checkpointing recomputes it in backward (with the body back in training
    mode by then): transformers' checkpointed layers drop the cache in training mode."""
    was_training = body.training
    body.train(False)
    try:
        out = body(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=True
        )
    finally:
        body.train(was_training)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    return (
        out.last_hidden_state,
        *[layer.keys for layer in cache.layers],
        *[layer.values for layer in cache.layers],
    )


def _anchored_prompt_pass(body, _anchor, *args):
    return _prompt_pass(body, *args)


def _cache_argument(body) -> str:
    import inspect

    return "cache" if "cache" in inspect.signature(body.forward).parameters else "past_key_values"
