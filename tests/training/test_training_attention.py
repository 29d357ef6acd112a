"""model.train_attention: which attention kernel the log-prob passes use, and that switching it changes nothing
but float rounding (values and gradients), on the real embedded model."""

from __future__ import annotations

import pytest
import torch

from tepo.logprobs import response_logprobs
from tepo.models import EAGER_ATTENTION_MAX_COLUMNS, attention_implementation, training_attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.model
def test_auto_picks_eager_for_narrow_cpu_batches_only(embedded_model):
    model, _ = embedded_model
    assert training_attention(model, "auto", 122) == "eager"
    assert training_attention(model, "auto", EAGER_ATTENTION_MAX_COLUMNS) == "eager"
    assert training_attention(model, "auto", EAGER_ATTENTION_MAX_COLUMNS + 1) is None
    assert training_attention(model, "sdpa", 10) == "sdpa"
    assert training_attention(model, "eager", 10_000) == "eager"
    assert training_attention(model, "model", 10) is None


@pytest.mark.model
def test_switching_is_scoped_and_restored_even_on_error(embedded_model):
    model, _ = embedded_model
    before = model.config._attn_implementation
    other = "eager" if before != "eager" else "sdpa"
    with attention_implementation(model, other):
        assert model.config._attn_implementation == other
    assert model.config._attn_implementation == before
    with pytest.raises(RuntimeError, match="boom"), attention_implementation(model, other):
        raise RuntimeError("boom")
    assert model.config._attn_implementation == before
    with attention_implementation(model, None):
        assert model.config._attn_implementation == before


@pytest.mark.model
def test_eager_and_sdpa_give_the_same_logprobs_and_gradients(embedded_model):
    """Left padding, right padding after EOS and a response: the masks must mean the same to both kernels."""
    model, _ = embedded_model
    torch.manual_seed(0)
    ids = torch.randint(100, 5000, (3, 14))
    att = torch.ones_like(ids)
    att[0, :4] = 0  # left-padded prompt
    att[1, -3:] = 0  # response ended early
    att[2, :2] = 0
    att[2, -1:] = 0
    params = [model.model.layers[0].self_attn.q_proj.weight, model.model.layers[-1].mlp.down_proj.weight]
    results = {}
    for impl in ("sdpa", "eager"):
        model.zero_grad(set_to_none=True)
        with attention_implementation(model, impl):
            logp, entropy, _ = response_logprobs(model, ids, att, 6)
        (logp.sum() + 0.1 * entropy.sum()).backward()
        results[impl] = (logp.detach(), entropy.detach(), [p.grad.clone() for p in params])
    model.zero_grad(set_to_none=True)
    (lp_s, ent_s, grads_s), (lp_e, ent_e, grads_e) = results["sdpa"], results["eager"]
    assert (lp_s != 0).sum() == 3 * 6 - 3 - 1  # the masked positions are really masked
    torch.testing.assert_close(lp_e, lp_s, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent_e, ent_s, atol=1e-4, rtol=1e-4)
    for g_e, g_s in zip(grads_e, grads_s):
        torch.testing.assert_close(g_e, g_s, atol=1e-4, rtol=1e-3)
