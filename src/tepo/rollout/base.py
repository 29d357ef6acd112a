"""The rollout interface: what every generation backend returns, and the protocol it implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from torch import Tensor


@dataclass
class RolloutBatch:
    """``N`` sampled responses, laid out for :func:`tepo.logprobs.response_logprobs`.

    Rows are grouped: the ``G`` samples of prompt ``g`` are rows ``g*G .. g*G+G-1`` (``prompt_index`` says so).
    ``input_ids`` is ``[N, P+T]``: the prompt left-padded to ``P`` columns, then the response right-padded to
    ``T = response_len`` columns (``T`` is the longest response in the batch, at most ``max_new_tokens``).
    ``response_mask`` is 1 on response tokens up to and including the first EOS and 0 after it; tokens after it
    are the pad token and have ``attention_mask`` 0. ``rollout_logp`` ([N, T], 0 where masked) is filled only
    when the backend was asked for it (``return_logprobs=True``): the sampler's own log-probabilities.
    All tensors are on the CPU, whatever device generated them.
    """

    input_ids: Tensor  # long [N, P+T]
    attention_mask: Tensor  # long [N, P+T]
    response_mask: Tensor  # float [N, T]
    response_len: int
    prompt_index: Tensor  # long [N]
    texts: list[str]
    truncated: Tensor  # bool [N]: reached max_new_tokens without EOS
    gen_seconds: float
    num_generated_tokens: int
    rollout_logp: Tensor | None = None  # float [N, T], optional

    def __post_init__(self) -> None:
        n, width = self.input_ids.shape
        expected = {
            "attention_mask": (self.attention_mask.shape, (n, width)),
            "response_mask": (self.response_mask.shape, (n, self.response_len)),
            "prompt_index": (self.prompt_index.shape, (n,)),
            "truncated": (self.truncated.shape, (n,)),
        }
        if self.rollout_logp is not None:
            expected["rollout_logp"] = (self.rollout_logp.shape, (n, self.response_len))
        for name, (got, want) in expected.items():
            if tuple(got) != want:
                raise ValueError(f"RolloutBatch.{name} has shape {tuple(got)}; expected {want}")
        if len(self.texts) != n:
            raise ValueError(f"RolloutBatch.texts has {len(self.texts)} entries; expected {n}")
        if not 0 < self.response_len < width:
            raise ValueError(f"RolloutBatch.response_len={self.response_len} must be in [1, {width - 1}]")

    @property
    def prompt_len(self) -> int:
        """``P``: columns of (left-padded) prompt before the response."""
        return self.input_ids.shape[1] - self.response_len

    @property
    def response_ids(self) -> Tensor:
        """``[N, T]`` response tokens (pad after EOS)."""
        return self.input_ids[:, self.prompt_len :]

    @property
    def response_lengths(self) -> Tensor:
        """``[N]`` number of response tokens per row, EOS included."""
        return self.response_mask.sum(-1).long()

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class RolloutBackend(Protocol):
    """A generation engine: ``num_samples`` responses for each prompt (given as token ids, chat template applied)."""

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        num_samples: int,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int | None = None,
        greedy: bool = False,
    ) -> RolloutBatch: ...
