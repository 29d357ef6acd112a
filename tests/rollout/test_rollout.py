"""tepo.rollout: HF generate backend on the real embedded model; batch layout, EOS, seeds, score alignment."""

from __future__ import annotations

import pytest
import torch

from tepo.logprobs import response_logprobs
from tepo.rollout import HFRollout, RolloutBatch, make_rollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


QUESTIONS = ["What is 2+3? Reply with the number only.", "Write a long story about a dragon and a castle."]


@pytest.fixture(scope="module")
def prompts(embedded_model):
    _, tokenizer = embedded_model
    return [
        list(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
            )["input_ids"]
        )
        for q in QUESTIONS
    ]


@pytest.fixture(scope="module")
def rollout(embedded_model):
    model, tokenizer = embedded_model
    return HFRollout(model, tokenizer)


def assert_well_formed(batch: RolloutBatch, prompts, num_samples, max_new_tokens, rollout):
    n = len(prompts) * num_samples
    t = batch.response_len
    p = batch.prompt_len
    assert batch.input_ids.shape == batch.attention_mask.shape == (n, p + t)
    assert batch.input_ids.dtype == batch.attention_mask.dtype == torch.long
    assert batch.response_mask.shape == (n, t) and batch.response_mask.dtype == torch.float32
    assert 1 <= t <= max_new_tokens
    assert batch.prompt_index.tolist() == [g for g in range(len(prompts)) for _ in range(num_samples)]
    assert batch.num_generated_tokens == int(batch.response_mask.sum())
    assert batch.gen_seconds > 0
    eos = set(rollout.eos_token_ids)
    pad = rollout.pad_token_id
    for i in range(n):
        prompt = prompts[int(batch.prompt_index[i])]
        # Prompt: left-padded, attention 1 exactly on the prompt tokens.
        assert batch.input_ids[i, p - len(prompt) : p].tolist() == prompt
        assert batch.attention_mask[i, :p].tolist() == [0] * (p - len(prompt)) + [1] * len(prompt)
        # Response: mask is 1...1 0...0, equal to the attention mask there; pad after it.
        mask = batch.response_mask[i].long()
        length = int(mask.sum())
        assert mask.tolist() == [1] * length + [0] * (t - length)
        assert batch.attention_mask[i, p:].tolist() == mask.tolist()
        response = batch.response_ids[i].tolist()
        assert all(tok == pad for tok in response[length:])
        kept = response[:length]
        # EOS only possibly as the last kept token; without it the row is truncated at max_new_tokens.
        assert not eos & set(kept[:-1])
        if kept[-1] in eos:
            assert not batch.truncated[i]
        else:
            assert batch.truncated[i] and length == max_new_tokens
        assert batch.texts[i] == rollout.tokenizer.decode(kept, skip_special_tokens=True)


@pytest.mark.model
def test_greedy_layout_eos_truncation_and_determinism(rollout, prompts):
    first = rollout.generate(prompts, num_samples=2, max_new_tokens=16, greedy=True)
    assert_well_formed(first, prompts, 2, 16, rollout)
    # The short arithmetic answer ends with EOS; the long story is cut at max_new_tokens.
    assert first.truncated.tolist() == [False, False, True, True]
    assert "5" in first.texts[0]
    # Greedy: both samples of a prompt are identical, and a second call repeats the first exactly.
    assert torch.equal(first.input_ids[0], first.input_ids[1])
    again = rollout.generate(prompts, num_samples=2, max_new_tokens=16, greedy=True)
    assert torch.equal(first.input_ids, again.input_ids) and first.texts == again.texts


@pytest.mark.model
def test_seeded_sampling_is_reproducible_and_leaves_global_rng_alone(rollout, prompts):
    rng_before = torch.get_rng_state()
    a = rollout.generate(prompts, num_samples=3, max_new_tokens=10, seed=123)
    assert torch.equal(torch.get_rng_state(), rng_before)
    b = rollout.generate(prompts, num_samples=3, max_new_tokens=10, seed=123)
    c = rollout.generate(prompts, num_samples=3, max_new_tokens=10, seed=124)
    assert_well_formed(a, prompts, 3, 10, rollout)
    assert torch.equal(a.input_ids, b.input_ids) and a.texts == b.texts
    assert not torch.equal(a.input_ids, c.input_ids)
    # Sampling at temperature 1 gives different responses among the samples of the story prompt.
    assert len({a.texts[i] for i in range(3, 6)}) > 1


@pytest.mark.model
@pytest.mark.parametrize(("temperature", "max_batch_size"), [(1.0, None), (0.7, 4)])
def test_rescoring_matches_generation_scores(embedded_model, prompts, temperature, max_batch_size):
    # response_logprobs on the assembled batch must reproduce the sampler's own per-token log-probabilities:
    # this pins the prompt/response alignment, left padding, position ids and masking end to end.
    model, tokenizer = embedded_model
    rollout = HFRollout(model, tokenizer, autocast_bf16=False, max_batch_size=max_batch_size)
    batch = rollout.generate(
        prompts, num_samples=3, max_new_tokens=12, temperature=temperature, seed=7, return_logprobs=True
    )
    assert_well_formed(batch, prompts, 3, 12, rollout)
    with torch.no_grad():
        logp, _, _ = response_logprobs(
            model, batch.input_ids, batch.attention_mask, batch.response_len, temperature=temperature
        )
    mask = batch.response_mask.bool()
    assert (batch.rollout_logp[~mask] == 0).all()
    assert (batch.rollout_logp[mask] < 0).any()
    torch.testing.assert_close(logp[mask], batch.rollout_logp[mask], atol=2e-4, rtol=0)


@pytest.mark.model
def test_bf16_autocast_generation_is_well_formed(embedded_model, prompts):
    model, tokenizer = embedded_model
    rollout = HFRollout(model, tokenizer, autocast_bf16=True)
    assert_well_formed(
        rollout.generate(prompts, num_samples=1, max_new_tokens=6, seed=0), prompts, 1, 6, rollout
    )


@pytest.mark.model
def test_make_rollout_and_bad_requests(embedded_model, prompts):
    model, tokenizer = embedded_model
    backend = make_rollout("hf", model, tokenizer, max_batch_size=8)
    assert isinstance(backend, HFRollout) and backend.max_batch_size == 8
    assert backend.autocast_bf16 is False  # measured faster on CPU with default threads (see hf.py)
    from tepo.rollout.vllm import VLLMServerError

    with pytest.raises(VLLMServerError, match="does not exist"):
        make_rollout("vllm", model, tokenizer, python="/nonexistent/bin/python")
    with pytest.raises(ValueError, match="unknown rollout backend 'sglang'"):
        make_rollout("sglang", model, tokenizer)
    bad = [
        ({"prompt_ids": []}, "non-empty list"),
        ({"prompt_ids": [[]]}, r"prompt_ids\[0\] must be a non-empty"),
        ({"prompt_ids": [[1, 10**7]]}, r"prompt_ids\[0\] holds \[10000000\]"),
        ({"num_samples": 0}, "num_samples must be a positive int"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive int"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"top_p": 1.5}, "top_p must be in"),
    ]
    for override, message in bad:
        kwargs = {"prompt_ids": prompts, "num_samples": 1, "max_new_tokens": 2, **override}
        with pytest.raises(ValueError, match=message):
            backend.generate(kwargs.pop("prompt_ids"), **kwargs)
    with pytest.raises(ValueError, match="max_batch_size must be a positive int"):
        HFRollout(model, tokenizer, max_batch_size=0)


def test_rollout_batch_rejects_inconsistent_shapes():
    good = {
        "input_ids": torch.zeros(2, 5, dtype=torch.long),
        "attention_mask": torch.ones(2, 5, dtype=torch.long),
        "response_mask": torch.ones(2, 3),
        "response_len": 3,
        "prompt_index": torch.tensor([0, 0]),
        "texts": ["a", "b"],
        "truncated": torch.tensor([False, True]),
        "gen_seconds": 0.1,
        "num_generated_tokens": 6,
    }
    batch = RolloutBatch(**good)
    assert batch.prompt_len == 2 and len(batch) == 2 and batch.response_lengths.tolist() == [3, 3]
    with pytest.raises(ValueError, match=r"response_mask has shape \(2, 4\); expected \(2, 3\)"):
        RolloutBatch(**{**good, "response_mask": torch.ones(2, 4)})
    with pytest.raises(ValueError, match="texts has 1 entries; expected 2"):
        RolloutBatch(**{**good, "texts": ["a"]})
