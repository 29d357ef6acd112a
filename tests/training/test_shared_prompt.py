"""Shared prompt prefix in the log-prob passes: one prompt pass per group, the same values and gradients as the
unshared pass (real embedded model, activation checkpointing on, both attention kernels)."""

from __future__ import annotations

import copy

import pytest
import torch

from tepo.logprobs import response_logprobs
from tepo.models import attention_implementation

pytestmark = pytest.mark.usefixtures("one_torch_thread")

G, P, T = 3, 9, 6


@pytest.fixture(scope="module")
def checkpointed_model(embedded_model):
    model, _ = embedded_model
    model = copy.deepcopy(model).train()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    return model


def _batch():
    torch.manual_seed(0)
    prompt_a, prompt_b = torch.randint(100, 5000, (1, P)), torch.randint(100, 5000, (1, P))
    ids = torch.cat([prompt_a.repeat(G, 1), prompt_b.repeat(G, 1)])
    ids = torch.cat([ids, torch.randint(100, 5000, (2 * G, T))], 1)
    mask = torch.ones_like(ids)
    mask[G:, :3] = 0  # the second prompt is shorter: left padding
    mask[1, -2:] = 0  # responses that ended early
    mask[G + 1, -4:] = 0
    groups = torch.tensor([0] * G + [1] * G)
    return ids, mask, groups


def _logprobs_and_grads(model, ids, mask, groups, kernel):
    params = [
        model.model.layers[0].self_attn.k_proj.weight,
        model.model.layers[15].mlp.up_proj.weight,
        model.model.embed_tokens.weight,  # tied to the output head
    ]
    model.zero_grad(set_to_none=True)
    # The kernel is held through backward, as the trainer does (checkpointing recomputes layers there).
    with attention_implementation(model, kernel):
        logp, entropy, _ = response_logprobs(model, ids, mask, T, prompt_groups=groups)
        (logp.sum() + 0.1 * entropy.sum()).backward()
    grads = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    return logp.detach(), entropy.detach(), grads


@pytest.mark.model
@pytest.mark.parametrize("kernel", ["eager", "sdpa"])
def test_shared_prompt_equals_the_unshared_pass(checkpointed_model, kernel):
    ids, mask, groups = _batch()
    logp, entropy, grads = _logprobs_and_grads(checkpointed_model, ids, mask, groups, kernel)
    logp_ref, entropy_ref, grads_ref = _logprobs_and_grads(checkpointed_model, ids, mask, None, kernel)
    assert int((logp != 0).sum()) == 2 * G * T - 2 - 4
    torch.testing.assert_close(logp, logp_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, entropy_ref, atol=1e-5, rtol=1e-5)
    # Gradients: the two passes sum in another order (the G rows' prompt gradients meet in one index_select
    # backward), so in float32 they differ by rounding, and by how much depends on the CPU's kernels (1.3e-5
    # relative was seen on an AVX2 Zen 3, under 1e-5 on AVX-512 machines). Bound it by float32's own reordering
    # noise on this machine: the same unshared pass with its rows' gradients accumulated in two halves (another
    # summation order, nothing else). (A float64 reference is no use here: transformers' float64 padding mask
    # turns left-padded rows into NaN.) A wrong prefix (positions, mask, a missing row) is off by O(1).
    halves = [torch.zeros_like(g) for g in grads_ref]
    for rows in (slice(0, G), slice(G, 2 * G)):
        _, _, part = _logprobs_and_grads(checkpointed_model, ids[rows], mask[rows], None, kernel)
        halves = [h + g for h, g in zip(halves, part)]
    for grad, grad_ref, half in zip(grads, grads_ref, halves):
        assert grad_ref.norm() > 0
        reorder_noise = float((half - grad_ref).norm() / grad_ref.norm())
        difference = float((grad - grad_ref).norm() / grad_ref.norm())
        assert difference <= max(1e-5, 4 * reorder_noise), (difference, reorder_noise)


@pytest.mark.model
def test_groups_of_one_and_no_grad_also_match(checkpointed_model):
    ids, mask, _ = _batch()
    singletons = torch.arange(ids.shape[0])  # nothing to share: the plain pass
    mixed = torch.tensor([0, 0, 1, 2, 2, 3])  # groups split across what sharing sees
    with torch.no_grad():
        ref, _, _ = response_logprobs(checkpointed_model, ids, mask, T)
        for groups in (singletons, mixed):
            logp, _, _ = response_logprobs(checkpointed_model, ids, mask, T, prompt_groups=groups)
            torch.testing.assert_close(logp, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.model
def test_rows_with_different_prompts_in_one_group_are_refused(checkpointed_model):
    ids, mask, _ = _batch()
    with torch.no_grad(), pytest.raises(ValueError, match="prompt columns differ"):
        response_logprobs(
            checkpointed_model, ids, mask, T, prompt_groups=torch.zeros(ids.shape[0], dtype=torch.long)
        )


@pytest.mark.model
def test_the_prompt_pass_keeps_no_weight_copies_for_backward(checkpointed_model):
    """Under bf16 autocast each matmul saves its bf16 weight copy for backward. The layers and the lm_head chunks
    are checkpointed, and so is the shared prompt pass: nothing weight-shaped is kept from forward to backward."""
    ids, mask, groups = _batch()
    weight_shapes = {tuple(p.shape) for p in checkpointed_model.parameters() if p.dim() == 2}
    saved = []

    def pack(tensor):
        saved.append(tuple(tensor.shape))
        return tensor

    with (
        torch.autocast("cpu", dtype=torch.bfloat16),
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
    ):
        logp, _, _ = response_logprobs(checkpointed_model, ids, mask, T, prompt_groups=groups)
    assert saved and logp.requires_grad
    assert not [shape for shape in saved if shape in weight_shapes]


@pytest.mark.model
def test_response_pass_gradients_reach_grad_without_waiting_for_the_prompt_pass(checkpointed_model):
    """Each weight is used by the prompt pass and by the response pass. The prompt pass's own backward (reentrant
    checkpoint) means the response pass's gradient is added to .grad as soon as it is computed, and the prompt
    pass's later: two accumulations, not one sum held back in a buffer until the end of the backward."""
    ids, mask, groups = _batch()
    weight = checkpointed_model.model.layers[10].mlp.down_proj.weight
    accumulations = []
    handle = weight.register_post_accumulate_grad_hook(lambda p: accumulations.append(p.grad.clone()))
    try:
        checkpointed_model.zero_grad(set_to_none=True)
        with attention_implementation(checkpointed_model, "eager"):
            logp, entropy, _ = response_logprobs(checkpointed_model, ids, mask, T, prompt_groups=groups)
            (logp.sum() + 0.1 * entropy.sum()).backward()
    finally:
        handle.remove()
        checkpointed_model.zero_grad(set_to_none=True)
    assert len(accumulations) == 2
    assert accumulations[0].norm() > 0 and not torch.equal(accumulations[0], accumulations[1])


def test_the_recomputed_prompt_pass_runs_under_the_forwards_autocast(monkeypatch):
    """The reentrant checkpoint recomputes the prompt pass in backward: under the same bf16 autocast as the
    forward (else the keys/values it differentiates would not be the ones the responses attended to)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import tepo.prompt_cache

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2,
    )  # fmt: skip
    model = LlamaForCausalLM(config).train()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls, real = [], tepo.prompt_cache._prompt_pass

    def spy(*args):
        calls.append(
            (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), torch.is_grad_enabled())
        )
        return real(*args)

    monkeypatch.setattr(tepo.prompt_cache, "_prompt_pass", spy)
    ids = torch.randint(1, 97, (4, 10))
    ids[1:, :5] = ids[0, :5]
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        logp, _, _ = response_logprobs(
            model, ids, torch.ones_like(ids), 5, prompt_groups=torch.zeros(4, dtype=torch.long)
        )
    logp.sum().backward()
    # Forward without a graph (the checkpoint), then the recomputation in backward with one, both in bf16.
    assert calls == [(True, torch.bfloat16, False), (True, torch.bfloat16, True)]
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0
