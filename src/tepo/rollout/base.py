"""The rollout interface: what every generation backend returns, and the protocol it implements."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor


class RolloutError(RuntimeError):
    """A generation engine failed (it could not start, died, or failed a request).

    ``str(err)`` is the whole story (for a traceback with ``--debug``); :meth:`summary` is the one line the command
    line prints: what was being generated (``context``, innermost last: e.g. ["step 3's rollout", "16 prompts x 8
    samples, ..."]), the cause (the last line of the engine's own error) and where its log is.
    """

    def __init__(self, message: str, *, cause: str | None = None, log_path=None):
        super().__init__(message)
        self.cause = cause
        self.log_path = log_path
        self.context: list[str] = []

    def add_context(self, what: str) -> RolloutError:
        """Say what was being done one level further out (the caller knows the step, the backend the batch)."""
        self.context.insert(0, what)
        return self

    def summary(self) -> str:
        head = str(self.args[0]).split("\n", 1)[0].rstrip(" :;")
        where = f" while generating {'; '.join(self.context)}" if self.context else ""
        cause = f": {self.cause}" if self.cause and self.cause not in head else ""
        # A temporary log is removed with its engine: name only one that is still there to read.
        log = (
            f" (the engine's log: {self.log_path})" if self.log_path and os.path.exists(self.log_path) else ""
        )
        return f"{head}{where}{cause}{log}"


def last_error_line(text: str) -> str | None:
    """The line of a traceback (or a log's tail) that says what went wrong: the last ``SomeError: ...`` line, else
    the last non-empty one."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    for line in reversed(lines):
        name = line.split(":", 1)[0]
        if ":" in line and name.replace(".", "").isidentifier() and name.endswith(("Error", "Exception")):
            return line
    return lines[-1] if lines else None


def describe_request(prompt_ids, num_samples: int, max_new_tokens: int) -> str:
    """``16 prompts x 8 samples, 2312 prompt tokens (longest 180), up to 128 new tokens``: what a failed generate
    was asked for."""
    lengths = [len(p) for p in prompt_ids]
    return (
        f"{len(lengths)} prompts x {num_samples} samples, {sum(lengths)} prompt tokens "
        f"(longest {max(lengths, default=0)}), up to {max_new_tokens} new tokens"
    )


@dataclass
class RolloutBatch:
    """``N`` sampled responses, laid out for :func:`tepo.logprobs.response_logprobs`.

    Rows are grouped: the ``G`` samples of prompt ``g`` are rows ``g*G .. g*G+G-1`` (``prompt_index`` says so).
    ``input_ids`` is ``[N, P+T]``: the prompt left-padded to ``P`` columns, then the response right-padded to
    ``T = response_len`` columns (``T`` is the longest response in the batch, at most ``max_new_tokens``).
    ``response_mask`` is 1 on response tokens up to and including the first EOS and 0 after it; tokens after it
    are the pad token and have ``attention_mask`` 0. ``rollout_logp`` ([N, T], 0 where masked) is filled only
    when the backend was asked for it (``return_logprobs=True``): the sampler's own log-probabilities.
    A backend returns every tensor on the CPU, whatever device generated them; the trainer moves the batch to its
    device once per step (:meth:`to`).
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

    def to(self, device) -> RolloutBatch:
        """The batch with its tensors on ``device`` (itself when they are there already: no copy on the CPU)."""
        if self.input_ids.device == torch.device(device):
            return self
        moved = {
            name: getattr(self, name).to(device)
            for name in ("input_ids", "attention_mask", "response_mask", "prompt_index", "truncated")
        }
        logp = None if self.rollout_logp is None else self.rollout_logp.to(device)
        return dataclasses.replace(self, **moved, rollout_logp=logp)


class WeightSyncCheck(Protocol):
    """What the trainer and the step call on a backend's check of its weight syncs (the one check there is:
    :class:`tepo.rollout.parity.ParityGuard`, which the backend runs after each sync)."""

    def unlogged_metrics(self) -> dict | None:
        """The readings of checks no metrics row holds yet (None when there are none)."""
        ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class RolloutBackend(Protocol):
    """The whole contract of a generation engine; what the trainer and ``tepo eval`` call, and nothing else.

    A backend is built from config by :func:`tepo.rollout.make_rollout_from_config` (its class is registered in
    :mod:`tepo.rollout.registry` and has a ``from_config`` classmethod), used as a context manager or closed
    explicitly, told after each optimizer step that the weights changed, and asked for samples.

    Behaviour log-probabilities (``return_logprobs=True``): ``RolloutBatch.rollout_logp[i, t]`` is the
    log-probability the *sampler* gave the token it sampled at response position ``t`` of row ``i``, under the
    exact distribution it drew from: ``log_softmax(logits / temperature)``, and for ``top_p < 1`` the nucleus
    renormalised, i.e. ``log p_t(y) - log sum_{v in nucleus} p_t(v)`` where ``p_t = softmax(logits / temperature)``
    and the nucleus is what is left after removing, from the least likely token upwards, every token whose
    cumulative probability stays ``<= 1 - top_p`` (the most likely token is always kept; the rule of both
    transformers' ``TopPLogitsWarper`` and vLLM's sampler). With ``greedy=True`` it is ``log_softmax(logits)``.
    The logits are the engine's own (bf16 autocast or a bf16 engine round them), which is the point: these are
    the behaviour policy's numbers for off-policy corrections (docs/offpolicy.md). 0 at padding.
    """

    pad_token_id: int
    # Seconds the last ``generate`` spent sending changed weights to a separate engine (counted in its
    # ``gen_seconds``); 0.0 when nothing was sent, None for a backend that samples from the trainer's own model.
    last_sync_seconds: float | None
    # The check that a separate engine samples the trained weights (tepo.rollout.parity.ParityGuard), handed to the
    # backend when it is built from a config with rollout.parity.check; None for a backend without an engine of
    # its own. The trainer checkpoints its state and the step logs its unlogged readings.
    parity_guard: WeightSyncCheck | None

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
        return_logprobs: bool = False,
    ) -> RolloutBatch:
        """``num_samples`` responses per prompt (token ids, chat template applied), rows grouped by prompt."""
        ...

    def weights_updated(self) -> None:
        """Called by the trainer after every change of the model's weights (an engine with its own copy resyncs)."""
        ...

    # True for an engine in a process of its own, which can sample while the trainer updates the model
    # (``rollout.async_steps``); False for one that samples from the trainer's own model object.
    overlaps_training: bool

    def stage_weights(self) -> float:
        """Take the copy of the model's weights that the next ``generate`` samples from, now; seconds spent.

        For a ``generate`` that runs in another thread while the trainer changes the model: the copy is made in
        the training thread before the update starts, and that ``generate`` then loads it without reading the
        model. A backend without an engine of its own has nothing to copy (returns 0.0).
        """
        ...

    def end_staging(self) -> None:
        """After the background ``generate`` calls: sync from the model again before each ``generate``."""
        ...

    def close(self) -> None:
        """Release what the backend started (the vLLM server process); safe to call twice."""
        ...

    def __enter__(self) -> RolloutBackend: ...

    def __exit__(self, *exc) -> None:
        """Calls :meth:`close`."""
        ...


def eos_token_ids(model, tokenizer) -> list[int]:
    """Every id that ends a response: the model's generation-config EOS id(s) and the tokenizer's EOS token."""
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model's generation config nor the tokenizer defines an EOS token")
    return sorted(set(int(i) for i in ids))


def check_generate_request(
    prompt_ids, num_samples, max_new_tokens, temperature, top_p, greedy, vocab_size
) -> None:
    """One clear ``ValueError`` for a malformed ``generate`` call, before any engine work."""
    if not isinstance(prompt_ids, list | tuple) or not prompt_ids:
        raise ValueError("prompt_ids must be a non-empty list of token-id lists")
    for i, ids in enumerate(prompt_ids):
        if not isinstance(ids, list | tuple) or not ids:
            raise ValueError(f"prompt_ids[{i}] must be a non-empty list of token ids; got {ids!r:.80}")
        bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompt_ids[{i}] holds {bad[:3]!r}; expected ints in [0, {vocab_size})")
    for name, value in (("num_samples", num_samples), ("max_new_tokens", max_new_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int; got {value!r}")
    if not greedy:
        if not temperature > 0:
            raise ValueError(
                f"temperature must be > 0 for sampling (use greedy=True instead); got {temperature!r}"
            )
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1]; got {top_p!r}")


def batch_from_responses(
    prompt_ids: list[list[int]],
    responses: list[list[int]],
    *,
    num_samples: int,
    pad_token_id: int,
    eos_token_ids: list[int],
    tokenizer,
    gen_seconds: float,
    rollout_logps: list[list[float] | None] | None = None,
) -> RolloutBatch:
    """Lay out sampled token lists as a :class:`RolloutBatch` (what a backend that returns token lists uses).

    ``responses[i]`` is row ``i``'s sampled tokens (rows grouped by prompt: ``num_samples`` per prompt). A row
    ends at its first EOS (kept, masked in); anything after it is dropped. A row with no EOS is truncated.
    """
    rows = [list(map(int, p)) for p in prompt_ids for _ in range(num_samples)]
    if len(responses) != len(rows):
        raise ValueError(
            f"{len(responses)} responses for {len(rows)} rows ({len(prompt_ids)} x {num_samples})"
        )
    eos = set(eos_token_ids)
    cut, truncated = [], []
    for tokens in responses:
        end = next((i + 1 for i, t in enumerate(tokens) if t in eos), None)
        truncated.append(end is None)
        cut.append(list(tokens[: end if end is not None else len(tokens)]))
    prompt_width = max(map(len, rows))
    response_len = max(1, max(map(len, cut)))
    n = len(rows)
    host = "cpu"  # a RolloutBatch is returned on the CPU (see its docstring)
    input_ids = torch.full((n, prompt_width + response_len), pad_token_id, dtype=torch.long, device=host)
    attention_mask = torch.zeros_like(input_ids)
    response_mask = torch.zeros(n, response_len, device=host)
    rollout_logp = torch.zeros(n, response_len, device=host) if rollout_logps is not None else None
    for i, (prompt, tokens) in enumerate(zip(rows, cut)):
        input_ids[i, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt, device=host)
        attention_mask[i, prompt_width - len(prompt) : prompt_width] = 1
        if tokens:
            input_ids[i, prompt_width : prompt_width + len(tokens)] = torch.tensor(tokens, device=host)
            attention_mask[i, prompt_width : prompt_width + len(tokens)] = 1
            response_mask[i, : len(tokens)] = 1
            if rollout_logp is not None and rollout_logps[i] is not None:
                rollout_logp[i, : len(tokens)] = torch.tensor(rollout_logps[i][: len(tokens)], device=host)
    texts = tokenizer.batch_decode(cut, skip_special_tokens=True)
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        response_len=response_len,
        prompt_index=torch.arange(len(prompt_ids), device=host).repeat_interleave(num_samples),
        texts=texts,
        truncated=torch.tensor(truncated, device=host),
        gen_seconds=gen_seconds,
        num_generated_tokens=int(response_mask.sum()),
        rollout_logp=rollout_logp,
    )
