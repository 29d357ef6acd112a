"""The TEPO facts of ALGORITHMS.md: Algorithm 1's gradient, dapo on one-token responses, the gspo weighting."""

from __future__ import annotations

import torch

from tepo.losses import compute_policy_loss


def _batch(seed, lengths, width, spread=0.05, token_adv=False):
    gen = torch.Generator().manual_seed(seed)
    n = len(lengths)
    mask = torch.tensor([[1] * k + [0] * (width - k) for k in lengths])
    old = -torch.rand(n, width, generator=gen, dtype=torch.float64) * 3
    logp = (old + spread * torch.randn(n, width, generator=gen, dtype=torch.float64)).requires_grad_(True)
    shape = (n, width) if token_adv else (n,)
    adv = torch.randn(*shape, generator=gen, dtype=torch.float64)
    return {"logp": logp, "old_logp": old, "advantages": adv, "mask": mask}


def _loss_and_grad(name, inputs, **options):
    logp = inputs["logp"].detach().clone().requires_grad_(True)
    loss, _ = compute_policy_loss(name, **{**inputs, "logp": logp}, **options)
    loss.backward()
    return loss.detach(), logp.grad


def test_algorithm1_gradient_sequence_advantage():
    lengths = [5, 2, 4, 1]
    inputs = _batch(0, lengths, 5)
    _, grad = _loss_and_grad("tepo", inputs, eps=10.0)  # wide clip: the unclipped branch everywhere
    t_tot = sum(lengths)
    m = inputs["mask"].bool()
    s = torch.exp(((inputs["logp"] - inputs["old_logp"]) * m).sum(-1) / m.sum(-1))
    for i, length in enumerate(lengths):
        expected = -s[i] * inputs["advantages"][i] / t_tot  # Algorithm 1, lines 8-10
        torch.testing.assert_close(grad[i, :length], expected.detach().expand(length), rtol=1e-12, atol=1e-14)
        assert torch.all(grad[i, length:] == 0)


def test_algorithm1_gradient_token_advantage():
    lengths = [3, 4, 2]
    inputs = _batch(1, lengths, 4, token_adv=True)
    _, grad = _loss_and_grad("tepo", inputs, eps=10.0)
    t_tot = sum(lengths)
    adv = inputs["advantages"]
    for i, length in enumerate(lengths):
        d = (inputs["logp"][i, :length] - inputs["old_logp"][i, :length]).detach()
        s_i = torch.exp(d.mean())
        # -m * s_i * (sum_t' m*A[i,t']) / (|o_i| * T_tot)
        expected = -s_i * adv[i, :length].sum() / (length * t_tot)
        torch.testing.assert_close(grad[i, :length], expected.expand(length), rtol=1e-12, atol=1e-14)


def test_tepo_equals_dapo_with_symmetric_eps_on_one_token_responses():
    # Spread 0.4 puts some ratios outside [0.8, 1.2], so both the clipped and unclipped branches are compared.
    inputs = _batch(2, [1] * 8, 1, spread=0.4)
    ratios = torch.exp(inputs["logp"] - inputs["old_logp"]).detach()
    assert bool(((ratios > 1.2) | (ratios < 0.8)).any()) and bool(((ratios < 1.2) & (ratios > 0.8)).any())
    for eps in (0.2, 0.1):
        tepo_loss, tepo_grad = _loss_and_grad("tepo", inputs, eps=eps)
        dapo_loss, dapo_grad = _loss_and_grad("dapo", inputs, eps_low=eps, eps_high=eps)
        torch.testing.assert_close(tepo_loss, dapo_loss, rtol=1e-14, atol=0)
        torch.testing.assert_close(tepo_grad, dapo_grad, rtol=1e-14, atol=0)


def test_tepo_weighs_sequences_by_length_where_gspo_weighs_them_equally():
    """Derivation. Let g_i = -min(s_i*A_i, clip(s_i)*A_i) (same eps in both). tepo's term is g_i on every token and
    token-mean gives  tepo = sum_i |o_i| g_i / T_tot;  gspo's seq-mean-token-mean gives  gspo = sum_i g_i / N.
    Hence, row by row, d tepo / d logp[i] = (|o_i| * N / T_tot) * d gspo / d logp[i], and both coincide when every
    |o_i| = T_tot / N."""
    lengths = [6, 1, 3, 2]
    inputs = _batch(3, lengths, 6, spread=0.3)  # some sequences clipped at eps 0.2, some not
    n, t_tot = len(lengths), sum(lengths)
    tepo_loss, tepo_grad = _loss_and_grad("tepo", inputs)
    gspo_loss, gspo_grad = _loss_and_grad("gspo", inputs, eps=0.2)
    g = []
    for i in range(n):  # g_i from gspo itself, one sequence per call
        row = {k: v[i : i + 1] for k, v in inputs.items()}
        g.append(_loss_and_grad("gspo", row, eps=0.2)[0])
    g = torch.stack(g)
    weights = torch.tensor(lengths, dtype=torch.float64)
    torch.testing.assert_close(tepo_loss, (weights * g).sum() / t_tot, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(gspo_loss, g.sum() / n, rtol=1e-13, atol=1e-15)
    factor = (weights * n / t_tot).unsqueeze(-1)
    torch.testing.assert_close(tepo_grad, factor * gspo_grad, rtol=1e-12, atol=1e-15)
    assert not torch.allclose(tepo_loss, gspo_loss)  # the lengths differ, so the losses must too

    equal = _batch(4, [3, 3, 3], 3, spread=0.3)
    torch.testing.assert_close(_loss_and_grad("tepo", equal)[0], _loss_and_grad("gspo", equal, eps=0.2)[0])
