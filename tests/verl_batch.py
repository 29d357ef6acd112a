"""The padded batch of the verl checks that run a real model forward (the script of
tests/integrations/test_integration_verl_actor.py and tests/verl_engine_check.py): random prompts left-padded,
random responses right-padded, as verl's driver holds a batch before ``left_right_2_no_padding``.

It imports torch only: both checks run in ``.venv-verl`` with tests/ on ``PYTHONPATH``.
"""

from __future__ import annotations

import torch


def padded_batch(prompt_lens: list[int], resp_lens: list[int], P: int, R: int, vocab_size: int, gen):
    """Row i: ``prompt_lens[i]`` random ids (1 .. ``vocab_size`` - 1) at the end of ``P`` prompt columns, then
    ``resp_lens[i]`` random ids at the start of ``R`` response columns, 0 elsewhere; drawn from ``gen`` row by
    row, prompt first. Returns ``prompts`` [B, P], ``responses`` [B, R], ``attention_mask`` [B, P + R],
    ``input_ids`` (prompts then responses), ``position_ids`` (counting from 0 at each row's first token; 0 on
    the left padding) and ``response_mask`` [B, R]."""
    B = len(prompt_lens)
    prompts = torch.zeros(B, P, dtype=torch.long)
    responses = torch.zeros(B, R, dtype=torch.long)
    attn = torch.zeros(B, P + R, dtype=torch.long)
    for i in range(B):
        prompts[i, P - prompt_lens[i] :] = torch.randint(1, vocab_size, (prompt_lens[i],), generator=gen)
        responses[i, : resp_lens[i]] = torch.randint(1, vocab_size, (resp_lens[i],), generator=gen)
        attn[i, P - prompt_lens[i] : P + resp_lens[i]] = 1
    input_ids = torch.cat([prompts, responses], 1)
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    return prompts, responses, attn, input_ids, position_ids, attn[:, P:].clone()
