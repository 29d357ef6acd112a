"""Fakes for calling the step's sample-and-score phase (``tepo.training.collect``) without a model: a character
tokenizer, a rollout backend that returns scripted texts, problems whose answer is 3, sampler settings, and
`collect_scripted`, the phase called with them. Used by tests/training/test_training_phases.py and test_gdpo.py."""

from __future__ import annotations

import torch

from helpers import rollout_batch_of
from tepo.data import Problem, PromptStream
from tepo.training.collect import SamplerSettings, collect_rollouts


class CharTokenizer:
    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(ch) % 50 + 1 for ch in text[:6]]}


class ScriptedRollout:
    """Returns, call by call, the scripted response texts (one list of N texts per call)."""

    pad_token_id = 0

    def __init__(self, script: list[list[str]]):
        self.script = list(script)
        self.seeds: list[int] = []

    def generate(self, prompt_ids, *, num_samples, max_new_tokens, temperature, top_p, seed, **_):
        texts = self.script.pop(0)
        n = len(prompt_ids) * num_samples
        assert len(texts) == n
        self.seeds.append(seed)
        width_p = max(len(p) for p in prompt_ids)
        lengths = [1 + i % 3 for i in range(n)]
        t = max(lengths)
        ids = torch.zeros(n, width_p + t, dtype=torch.long)
        att = torch.zeros_like(ids)
        rmask = torch.zeros(n, t)
        for row in range(n):
            prompt = prompt_ids[row // num_samples]
            ids[row, width_p - len(prompt) : width_p] = torch.tensor(prompt)
            att[row, width_p - len(prompt) : width_p] = 1
            ids[row, width_p : width_p + lengths[row]] = 7 + row
            att[row, width_p : width_p + lengths[row]] = 1
            rmask[row, : lengths[row]] = 1
        return rollout_batch_of(ids, att, rmask, num_samples, texts=list(texts), gen_seconds=0.5)


def problems(count: int) -> list[Problem]:
    return [Problem(id=f"p{i}", problem=f"question {i}", answer="3") for i in range(count)]


def sampler_settings(g: int) -> SamplerSettings:
    return SamplerSettings(group_size=g, max_new_tokens=4, temperature=1.0, top_p=1.0, instruction="")


def problem_stream(count: int, seed: int = 0) -> PromptStream:
    """A prompt stream of ``problems(count)``, shuffled with ``seed``."""
    return PromptStream(problems(count), seed=seed)


def collect_scripted(
    rollout: ScriptedRollout, stream: PromptStream, pool, *, prompts: int = 2, seed: int = 0, **options
):
    """``collect_rollouts`` of ``prompts`` prompts from ``stream`` with groups of 2, the scripted ``rollout``
    sampling, the character tokenizer and the reward ``pool``; ``options`` are its other keywords."""
    return collect_rollouts(
        rollout, CharTokenizer(), stream, pool, sampler_settings(2), prompts=prompts, seed=seed, **options
    )
