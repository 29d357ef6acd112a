"""The HF backend's behaviour log-probs are taken at the step each token is sampled (issue #35, item 1).

``generate(output_scores=True)`` keeps one float32 ``[rows, vocab]`` tensor per generated token alive until the
end: about 80 GB at 128 rows x 1024 tokens x Qwen's 151,936 vocabulary. These tests pin (a) that the samples and
the log-probs are exactly those of the former ``output_scores`` path (the reference below is that code, verbatim)
and (b) that the peak memory of a generate with a large vocabulary does not grow with the number of new tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from helpers import ROOT, tiny_llama
from tepo.rollout import HFRollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class _Tokenizer(SimpleNamespace):
    def batch_decode(self, ids, skip_special_tokens=True):
        return [" ".join(map(str, row)) for row in ids]


def _tokenizer():
    return _Tokenizer(pad_token_id=0, eos_token_id=1)


def _reference(model, prompts, prompt_mask, *, max_new_tokens, temperature, top_p, greedy, eos):
    """The former implementation: ``output_scores``, then ``log_softmax`` of each step's scores on the host."""
    from transformers import GenerationConfig

    sampling = {} if greedy else {"temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=not greedy,
        **sampling,
        num_beams=1,
        repetition_penalty=1.0,
        use_cache=True,
        pad_token_id=0,
        eos_token_id=eos,
        return_dict_in_generate=True,
        output_scores=True,
    )
    out = model.generate(input_ids=prompts, attention_mask=prompt_mask, generation_config=config)
    responses = out.sequences[:, prompts.shape[1] :]
    is_eos = torch.isin(responses, torch.tensor(eos))
    after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
    responses = responses.masked_fill(after_eos, 0)
    logp = torch.stack(
        [
            torch.log_softmax(score.float().cpu(), -1).gather(1, responses[:, t : t + 1]).squeeze(1)
            for t, score in enumerate(out.scores)
        ],
        1,
    ).masked_fill(after_eos, 0.0)
    return responses, logp


@pytest.mark.parametrize(
    ("temperature", "top_p", "greedy"),
    [(1.0, 1.0, False), (0.7, 1.0, False), (0.8, 0.7, False), (1.0, 1.0, True)],
)
def test_logprobs_and_samples_equal_the_output_scores_path(temperature, top_p, greedy):
    model = tiny_llama(3, vocab_size=97)
    # Make EOS (id 1) likely enough that some rows stop early and get padded.
    with torch.no_grad():
        model.lm_head.weight[1] *= 4
    rollout = HFRollout(model, _tokenizer(), autocast_bf16=False)
    prompt_ids = [[5, 6, 7], [9, 10], [11, 12, 13, 14]]
    batch = rollout.generate(
        prompt_ids,
        num_samples=3,
        max_new_tokens=14,
        temperature=temperature,
        top_p=top_p,
        greedy=greedy,
        seed=123,
        return_logprobs=True,
    )
    rows = [p for p in prompt_ids for _ in range(3)]
    width = max(map(len, rows))
    prompts = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(prompts)
    for i, ids in enumerate(rows):
        prompts[i, width - len(ids) :] = torch.tensor(ids)
        mask[i, width - len(ids) :] = 1
    torch.manual_seed(123)
    with torch.no_grad():
        want_ids, want_logp = _reference(
            model,
            prompts,
            mask,
            max_new_tokens=14,
            temperature=temperature,
            top_p=top_p,
            greedy=greedy,
            eos=rollout.eos_token_ids,
        )
    t = batch.response_len
    assert torch.equal(batch.response_ids, want_ids[:, :t])
    assert torch.equal(batch.rollout_logp, want_logp[:, :t])  # bit-identical, not merely close
    if not greedy:
        assert batch.truncated.any() and not batch.truncated.all()  # both kinds of rows were exercised


_MEASURE = textwrap.dedent(
    """
    import json, resource, sys, torch
    from types import SimpleNamespace
    sys.path.insert(0, {tests!r})
    from helpers import tiny_llama
    from tepo.rollout import HFRollout
    torch.set_num_threads(1)

    class Tok(SimpleNamespace):
        def batch_decode(self, ids, skip_special_tokens=True):
            return ["" for _ in ids]

    model = tiny_llama(0, vocab_size=150_000)
    model.config.max_position_embeddings = 512
    with torch.no_grad():
        model.lm_head.weight[1].zero_()  # EOS never wins: every row generates every token
    rollout = HFRollout(model, Tok(pad_token_id=0, eos_token_id=1), autocast_bf16=False)
    peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB
    out = {{}}
    for tokens in (32, 32, 256):  # the first call warms up allocator and kernels
        batch = rollout.generate([[5, 6, 7]], num_samples=4, max_new_tokens=tokens, seed=0, return_logprobs=True)
        assert batch.response_len == tokens
        out[tokens] = peak()
    print(json.dumps(out))
    """
)


def test_peak_memory_does_not_grow_with_new_tokens():
    """4 rows x 150,000 vocabulary: one step's float32 scores are 2.4 MB, so keeping every step (the former
    ``output_scores`` path) adds about 540 MB between 32 and 256 tokens; the KV cache of this 2-layer model adds
    under 1 MB. The peak resident size is read in a fresh process so earlier tests cannot hide the growth."""
    code = _MEASURE.format(tests=str(ROOT / "tests"))
    # Large blocks straight from mmap (glibc's threshold otherwise rises to 32 MB after the first frees), so the
    # resident size follows the live tensors instead of the heap's fragmentation.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    peaks = json.loads(result.stdout.strip().splitlines()[-1])
    growth = peaks["256"] - peaks["32"]
    assert growth < 100, f"peak RSS grew {growth:.0f} MiB from 32 to 256 new tokens: {peaks}"
