"""Behaviour log-probs: ``rollout_logp`` is the sampler's own log-probability of each sampled token, under the
distribution it sampled from (temperature, and the renormalised top-p nucleus).

The reference (helpers.nucleus_logprobs) is written from the definition (docs/offpolicy.md), checked by hand on
a 4-token example, then compared with what the HF backend returns for the real embedded model. The vLLM engine's values are
compared with the same reference in tests/rollout/test_rollout_vllm.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from helpers import chat_prompt_ids, check_rollout_logp, nucleus_logprobs
from tepo.rollout import HFRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_reference_by_hand():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = p.log() + 1.7  # a shift changes nothing
    # T = 1, top_p = 0.75: ascending cumulative 0.05, 0.2, 0.5, 1.0; 0.05 and 0.2 are <= 0.25 -> {0.5, 0.3} kept.
    got = nucleus_logprobs(logits, 1.0, 0.75)
    want = torch.tensor([math.log(0.5 / 0.8), math.log(0.3 / 0.8), -math.inf, -math.inf])
    torch.testing.assert_close(got, want)
    # T = 2: probabilities proportional to sqrt(p) = .7071 .5477 .3873 .2236 (sum 1.8657), i.e. .379 .294 .208
    # .120; only .120 is <= 0.25 -> three tokens kept, renormalised over sqrt(.5)+sqrt(.3)+sqrt(.15).
    got = nucleus_logprobs(logits, 2.0, 0.75)
    kept = math.sqrt(0.5) + math.sqrt(0.3) + math.sqrt(0.15)
    want = torch.tensor([math.log(math.sqrt(x) / kept) for x in (0.5, 0.3, 0.15)] + [-math.inf])
    torch.testing.assert_close(got, want)
    # top_p = 1 keeps everything: plain log_softmax(logits / T).
    torch.testing.assert_close(nucleus_logprobs(logits, 2.0, 1.0), torch.log_softmax(logits / 2.0, -1))


@pytest.fixture(scope="module")
def prompts(embedded_model):
    _, tokenizer = embedded_model
    return chat_prompt_ids(
        tokenizer, ["What is 2+3? Reply with the number only.", "Write a long story about a dragon."]
    )


@pytest.mark.model
@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (0.8, 0.7)])
def test_hf_rollout_logp_is_the_sampling_distribution(embedded_model, prompts, temperature, top_p):
    model, tokenizer = embedded_model
    rollout = HFRollout(model, tokenizer, autocast_bf16=False)
    sampling = dict(temperature=temperature, top_p=top_p, seed=11, return_logprobs=True)
    batch = rollout.generate(prompts, num_samples=3, max_new_tokens=12, **sampling)
    logits, tokens, mask = check_rollout_logp(model, batch, temperature, top_p, atol=2e-4)
    plain = torch.log_softmax(logits / temperature, -1).gather(-1, tokens).squeeze(-1)
    if top_p < 1:
        # Renormalising over the nucleus raises every kept token's log-prob by -log(nucleus mass) >= 0, and
        # strictly wherever the nucleus dropped anything: these are not the untruncated log-probs.
        gap = batch.rollout_logp[mask] - plain[mask]
        assert (gap > -2e-4).all() and gap.max() > 0.05
    else:
        torch.testing.assert_close(batch.rollout_logp[mask], plain[mask], atol=2e-4, rtol=0)
