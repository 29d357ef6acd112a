"""tepo.logprobs: chunked response log-probs/entropy against closed forms and a naive full-logits computation."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import tiny_llama
from tepo.logprobs import _ChunkScorer, _TargetLogpAndEntropy, default_chunk_size, response_logprobs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def make_batch(prompt_lens, response_lens, prompt_width, response_width, vocab=97, seed=1):
    """Left-padded prompts then right-padded responses, as a rollout produces them."""
    gen = torch.Generator().manual_seed(seed)
    n = len(prompt_lens)
    ids = torch.zeros(n, prompt_width + response_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        ids[i, prompt_width - p : prompt_width + r] = torch.randint(1, vocab, (p + r,), generator=gen)
        mask[i, prompt_width - p : prompt_width + r] = 1
    return ids, mask


def naive_logprobs(model, ids, mask, response_len, temperature=1.0):
    """The obvious computation: full [N, L, V] logits, log_softmax, gather; the reference for the chunked one."""
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids).logits.float() / temperature
    log_probs = torch.log_softmax(logits[:, -response_len - 1 : -1], dim=-1)
    targets = ids[:, -response_len:]
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    valid = mask[:, -response_len:].float()
    return logp * valid, entropy * valid


# ---------------------------------------------------------------- closed form on the per-chunk math


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_chunk_scorer_closed_form(temperature):
    # lm_head maps h = (1, 0) to logits (0, ln 3): p = softmax((0, ln3)/tau).
    head = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]]))
    logp, entropy = _ChunkScorer(head, temperature, True)(torch.tensor([[1.0, 0.0]]), torch.tensor([1]))
    # tau = 1: p = (1/4, 3/4). tau = 2: p proportional to (1, sqrt 3).
    p1 = 0.75 if temperature == 1.0 else math.sqrt(3) / (1 + math.sqrt(3))
    p0 = 1 - p1
    assert logp.item() == pytest.approx(math.log(p1), abs=1e-6)
    assert entropy.item() == pytest.approx(-(p0 * math.log(p0) + p1 * math.log(p1)), abs=1e-6)


def test_chunk_scorer_gradient_closed_form():
    # d logp(y) / d z = onehot(y) - p ;  d H / d z = -p * (log p + H).
    head = torch.nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    z = torch.tensor([[0.5, -1.0, 2.0]], requires_grad=True)
    logp, entropy = _ChunkScorer(head, 1.0, True)(z, torch.tensor([0]))
    (g_logp,) = torch.autograd.grad(logp.sum(), z, retain_graph=True)
    (g_ent,) = torch.autograd.grad(entropy.sum(), z)
    p = torch.softmax(z.detach(), -1)
    h = -(p * p.log()).sum()
    torch.testing.assert_close(g_logp, torch.tensor([[1.0, 0.0, 0.0]]) - p, atol=1e-6, rtol=0)
    torch.testing.assert_close(g_ent, -p * (p.log() + h), atol=1e-6, rtol=0)


def _autograd_reference(logits, targets, temperature):
    """The plain autograd formulation the hand-written backward replaces."""
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, -(log_probs.exp() * log_probs).sum(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy", [True, False])
def test_hand_written_backward_passes_gradcheck(temperature, entropy):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 11, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 11, (5,), generator=gen)

    def fn(x):
        logp, ent = _TargetLogpAndEntropy.apply(x, targets, temperature, entropy)
        return (logp, ent) if entropy else logp

    assert torch.autograd.gradcheck(fn, (logits,), eps=1e-6, atol=1e-8)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_hand_written_backward_equals_autograd_and_values_are_bitwise_equal(temperature, monkeypatch):
    # Several backward row blocks (3 rows each here) and the closed form of the class docstring.
    monkeypatch.setattr("tepo.logprobs._BLOCK_ELEMENTS", 3 * 50)
    gen = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(8, 50, generator=gen)).requires_grad_()
    targets = torch.randint(0, 50, (8,), generator=gen)
    a, b = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    logp, ent = _TargetLogpAndEntropy.apply(logits, targets, temperature, True)
    ref_logp, ref_ent = _autograd_reference(logits, targets, temperature)
    assert torch.equal(logp, ref_logp) and torch.equal(ent, ref_ent)
    (grad,) = torch.autograd.grad((logp * a).sum() + (ent * b).sum(), logits)
    (ref_grad,) = torch.autograd.grad((ref_logp * a).sum() + (ref_ent * b).sum(), logits)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)
    p = torch.softmax(logits.detach() / temperature, -1)
    closed = -p * (a[:, None] + b[:, None] * (p.log() + ref_ent.detach()[:, None]))
    closed[torch.arange(8), targets] += a
    torch.testing.assert_close(grad, closed / temperature, atol=1e-6, rtol=1e-5)


def test_bf16_logits_get_a_bf16_gradient_equal_to_autograds():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 40, generator=gen).bfloat16().requires_grad_()
    targets = torch.randint(0, 40, (6,), generator=gen)
    logp, ent = _TargetLogpAndEntropy.apply(logits, targets, 1.0, True)
    (grad,) = torch.autograd.grad(logp.sum() + 0.3 * ent.sum(), logits)
    ref_logp, ref_ent = _autograd_reference(logits, targets, 1.0)
    (ref_grad,) = torch.autograd.grad(ref_logp.sum() + 0.3 * ref_ent.sum(), logits)
    assert grad.dtype == torch.bfloat16 and logp.dtype == torch.float32
    torch.testing.assert_close(grad.float(), ref_grad.float(), atol=1e-2, rtol=1e-2)


def test_only_the_log_probs_are_kept_for_backward():
    """The memory claim: of the [rows, V] tensors, backward keeps exactly one (the log-probs)."""
    logits = torch.randn(7, 300, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _TargetLogpAndEntropy.apply(logits, torch.zeros(7, dtype=torch.long), 1.0, True)
    assert sum(t.numel() >= 7 * 300 for t in saved) == 1
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        _autograd_reference(logits, torch.zeros(7, dtype=torch.long), 1.0)
    assert sum(t.numel() >= 7 * 300 for t in saved) >= 3  # what the autograd formulation keeps


# ---------------------------------------------------------------- chunked == naive on a tiny real Llama


@pytest.mark.parametrize("chunk_size", [1, 3, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tie", [False, True])
def test_matches_naive_values(chunk_size, temperature, tie):
    model = tiny_llama(tie=tie)
    ids, mask = make_batch([3, 5, 1], [4, 2, 6], prompt_width=5, response_width=6)
    with torch.no_grad():
        logp, entropy, _ = response_logprobs(
            model, ids, mask, 6, chunk_size=chunk_size, temperature=temperature
        )
        ref_logp, ref_entropy = naive_logprobs(model, ids, mask, 6, temperature)
    assert logp.dtype == entropy.dtype == torch.float32
    assert logp.shape == entropy.shape == (3, 6)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=0)
    # Padding after the response is exactly 0, real tokens are not.
    assert (logp[0, 4:] == 0).all() and (entropy[1, 2:] == 0).all()
    assert (logp[2] < 0).all() and (entropy[2] > 0).all()


def test_matches_naive_gradients_params_and_hidden():
    model = tiny_llama()
    ids, mask = make_batch([3, 5, 2, 4], [4, 2, 6, 5], prompt_width=5, response_width=6)
    weights = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))

    def grads(fn):
        captured = {}

        def keep_hidden(_module, _inputs, out):  # returns None, so the output is left unchanged
            out.retain_grad()
            captured["hidden"] = out

        handle = model.model.norm.register_forward_hook(keep_hidden)
        model.zero_grad()
        logp, entropy, *_ = fn()
        ((logp * weights).sum() + (entropy * weights.flip(0)).sum()).backward()
        handle.remove()
        return {n: p.grad.clone() for n, p in model.named_parameters()}, captured["hidden"].grad

    chunked_params, chunked_hidden = grads(lambda: response_logprobs(model, ids, mask, 6, chunk_size=4))
    naive_params, naive_hidden = grads(lambda: naive_logprobs(model, ids, mask, 6))
    torch.testing.assert_close(chunked_hidden, naive_hidden, atol=1e-5, rtol=1e-4)
    for name, grad in naive_params.items():
        assert grad.abs().sum() > 0, name  # every parameter is on the path
        torch.testing.assert_close(chunked_params[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_full_logits_never_materialised_forward_or_backward():
    # Every lm_head call, in forward and in the backward recomputation, sees at most chunk_size positions.
    model = tiny_llama()
    ids, mask = make_batch([3] * 4, [6] * 4, prompt_width=3, response_width=6)
    rows_seen = []
    model.lm_head.register_forward_hook(lambda _m, inp, _o: rows_seen.append(inp[0].shape[0]))
    logp, entropy, _ = response_logprobs(model, ids, mask, 6, chunk_size=5)
    forward_calls = len(rows_seen)
    (logp.sum() + entropy.sum()).backward()
    assert forward_calls == math.ceil(24 / 5)
    assert len(rows_seen) == 2 * forward_calls  # backward recomputed each chunk
    assert max(rows_seen) == 5


def test_left_padding_does_not_change_results():
    model = tiny_llama()
    ids, mask = make_batch([3], [4], prompt_width=3, response_width=4)
    padded = torch.cat([torch.zeros(1, 4, dtype=torch.long), ids], 1)
    padded_mask = torch.cat([torch.zeros(1, 4, dtype=torch.long), mask], 1)
    with torch.no_grad():
        a, _, _ = response_logprobs(model, ids, mask, 4)
        b, _, _ = response_logprobs(model, padded, padded_mask, 4)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_no_entropy_and_no_grad_paths():
    model = tiny_llama()
    ids, mask = make_batch([2, 3], [3, 1], prompt_width=3, response_width=3)
    logp, entropy, _ = response_logprobs(model, ids, mask, 3, compute_entropy=False)
    assert entropy is None and logp.requires_grad
    with torch.no_grad():
        logp2, _, _ = response_logprobs(model, ids, mask, 3)
    assert not logp2.requires_grad
    torch.testing.assert_close(logp.detach(), logp2)


def test_default_chunk_size():
    assert default_chunk_size(49_152) == 682
    assert default_chunk_size(10**9) == 1


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"response_len": 0}, "response_len must be in"),
        ({"response_len": 9}, "response_len must be in"),
        ({"response_len": 2.0}, "response_len must be an int"),
        ({"chunk_size": 0}, "chunk_size must be a positive int"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"attention_mask": torch.ones(2, 8, dtype=torch.long)}, "same shape as input_ids"),
        ({"input_ids": torch.zeros(2, 9)}, "2-D torch.long"),
    ],
)
def test_bad_input_is_rejected_clearly(kwargs, message):
    model = tiny_llama()
    args = {
        "input_ids": torch.ones(2, 9, dtype=torch.long),
        "attention_mask": torch.ones(2, 9, dtype=torch.long),
    }
    args["response_len"] = 3
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        response_logprobs(
            model,
            args["input_ids"],
            args["attention_mask"],
            args["response_len"],
            **{k: v for k, v in args.items() if k in ("chunk_size", "temperature")},
        )


def test_non_causal_lm_is_rejected():
    with pytest.raises(TypeError, match="causal LM"):
        response_logprobs(torch.nn.Linear(2, 2), torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3), 1)


# ---------------------------------------------------------------- the real embedded model


@pytest.mark.model
def test_embedded_model_matches_naive_and_bf16_autocast_is_close(embedded_model):
    model, tokenizer = embedded_model
    prompts = [tokenizer("What is 2+3?")["input_ids"], tokenizer("Name a colour.")["input_ids"]]
    responses = [tokenizer(" It is 5.<|im_end|>")["input_ids"], tokenizer(" Blue<|im_end|>")["input_ids"]]
    p_width, r_width = max(map(len, prompts)), max(map(len, responses))
    pad = tokenizer.pad_token_id
    ids = torch.tensor(
        [[pad] * (p_width - len(p)) + p + r + [pad] * (r_width - len(r)) for p, r in zip(prompts, responses)]
    )
    mask = torch.tensor(
        [
            [0] * (p_width - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_width - len(r))
            for p, r in zip(prompts, responses)
        ]
    )
    with torch.no_grad():
        logp, entropy, _ = response_logprobs(model, ids, mask, r_width, chunk_size=3)
        ref_logp, ref_entropy = naive_logprobs(model, ids, mask, r_width)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf_logp, bf_entropy, _ = response_logprobs(model, ids, mask, r_width)
    torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, atol=1e-5, rtol=1e-5)
    assert bf_logp.dtype == bf_entropy.dtype == torch.float32
    valid = mask[:, -r_width:].bool()
    assert (bf_logp - logp)[valid].abs().max() < 0.25
    assert (bf_entropy - entropy)[valid].abs().max() < 0.25
    assert (bf_logp - logp)[valid].abs().mean() < 0.08


def test_bf16_autocast_forward_and_backward_run_and_stay_close():
    model = tiny_llama()
    ids, mask = make_batch([3, 5], [4, 6], prompt_width=5, response_width=6)
    ref_logp, ref_entropy, _ = response_logprobs(model, ids, mask, 6, chunk_size=4)
    ref_logp.sum().backward()
    ref_grad = model.lm_head.weight.grad.clone()
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, entropy, _ = response_logprobs(model, ids, mask, 6, chunk_size=4)
    assert logp.dtype == entropy.dtype == torch.float32
    logp.sum().backward()  # backward outside autocast recomputes the chunks under bf16 autocast again
    torch.testing.assert_close(logp, ref_logp.detach(), atol=0.05, rtol=0)
    torch.testing.assert_close(entropy, ref_entropy.detach(), atol=0.05, rtol=0)
    assert torch.isfinite(model.lm_head.weight.grad).all()
    torch.testing.assert_close(model.lm_head.weight.grad, ref_grad, atol=0.05, rtol=0.05)
