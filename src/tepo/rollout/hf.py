"""Rollout with transformers' ``generate``: the default backend, and the only one that runs without a GPU."""

from __future__ import annotations

import contextlib
import time

import torch
from torch import Tensor

from tepo.rollout.base import RolloutBatch

# Measured on the embedded model (SmolLM2-135M, float32 weights), 32 prompts x 64 new tokens, temperature 1, on the
# shared 2-core CPU machine (other engineers' jobs running; "slots" = rows x generated steps per second):
#   torch default 2 threads: float32 17.6 / 56.9 slot-tok/s, bf16 autocast 7.6 / 15.3 (two runs): bf16 2.3-3.7x slower
#   1 thread (torch.set_num_threads(1)): float32 63 slot-tok/s, bf16 autocast 122 (median of 2): bf16 1.9x faster
# With the default thread count float32 is faster, and it also keeps the sampler identical to a float32 trainer,
# so the CPU default is float32; pass autocast_bf16=True when running torch on one thread. On CUDA bf16 is the
# usual win (not measured here: no GPU).
_BF16_AUTOCAST_DEFAULT = {"cpu": False, "cuda": True}


class HFRollout:
    """Batched sampling with ``model.generate``: all prompts x samples at once (or ``max_batch_size`` rows at a time).

    Prompts arrive as token ids with the chat template already applied. They are left-padded with the
    tokenizer's pad token, generated with the KV cache, and stop at EOS (any of the model's EOS ids); tokens after
    a row's first EOS are replaced by the pad token and masked out.

    Sampling uses exactly ``temperature`` and ``top_p`` (``top_k`` is disabled, and so is every other default of
    the model's generation config such as repetition penalties), so the sampling distribution is
    ``softmax(logits / temperature)`` restricted to the top-p nucleus, the one :func:`tepo.logprobs.response_logprobs`
    scores with the same temperature (exactly when ``top_p == 1``).

    Reproducibility: with ``seed`` set, generation runs inside ``torch.random.fork_rng`` after
    ``torch.manual_seed(seed)``, so the same prompts, seed and ``max_batch_size`` give the same samples and the
    caller's global RNG state is left exactly as it was. With ``seed=None`` the global RNG is used (and advanced).
    Samples depend on how rows are batched (padding changes float rounding), not only on the seed.

    ``autocast_bf16=None`` picks the faster setting measured for the model's device type (CPU: off, CUDA: on);
    see the measurements above ``_BF16_AUTOCAST_DEFAULT``. Under bf16 autocast the sampler's distribution
    differs slightly from the float32 policy that :func:`tepo.logprobs.response_logprobs` scores.
    """

    def __init__(
        self, model, tokenizer, *, autocast_bf16: bool | None = None, max_batch_size: int | None = None
    ):
        if max_batch_size is not None and (not isinstance(max_batch_size, int) or max_batch_size < 1):
            raise ValueError(f"max_batch_size must be a positive int or None; got {max_batch_size!r}")
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no pad token; load it with tepo.models.load_model_and_tokenizer"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        device_type = self.device.type
        self.autocast_bf16 = (
            _BF16_AUTOCAST_DEFAULT.get(device_type, False) if autocast_bf16 is None else bool(autocast_bf16)
        )
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_ids = _eos_ids(model, tokenizer)

    def weights_updated(self) -> None:
        """Nothing to do: this backend samples from the trainer's own model object."""

    def close(self) -> None:
        """Nothing to release (the model belongs to the caller)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

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
        """``num_samples`` responses per prompt, rows grouped by prompt. ``return_logprobs`` also returns the
        sampler's own log-probabilities of the chosen tokens (from ``output_scores``: after temperature and
        top-p, renormalised) as ``RolloutBatch.rollout_logp``."""
        vocab_size = self.model.get_input_embeddings().weight.shape[0]
        _check_request(prompt_ids, num_samples, max_new_tokens, temperature, top_p, greedy, vocab_size)
        rows = [list(map(int, p)) for p in prompt_ids for _ in range(num_samples)]
        prompt_width = max(map(len, rows))
        prompts = torch.full((len(rows), prompt_width), self.pad_token_id, dtype=torch.long)
        prompt_mask = torch.zeros_like(prompts)
        for i, ids in enumerate(rows):
            prompts[i, prompt_width - len(ids) :] = torch.tensor(ids)
            prompt_mask[i, prompt_width - len(ids) :] = 1

        step = self.max_batch_size or len(rows)
        pieces = []
        was_training = self.model.training
        self.model.eval()
        start = time.perf_counter()
        try:
            with _seeded(seed, self.device), torch.no_grad():
                for lo in range(0, len(rows), step):
                    pieces.append(
                        self._generate_rows(
                            prompts[lo : lo + step],
                            prompt_mask[lo : lo + step],
                            max_new_tokens=max_new_tokens,
                            temperature=temperature,
                            top_p=top_p,
                            greedy=greedy,
                            return_logprobs=return_logprobs,
                        )
                    )
        finally:
            self.model.train(was_training)
        gen_seconds = time.perf_counter() - start

        response_len = max(max(int(mask.sum(1).max()), 1) for _, mask, _ in pieces)
        responses = torch.cat([_pad_right(r, response_len, self.pad_token_id) for r, _, _ in pieces])
        response_mask = torch.cat([_pad_right(m, response_len, 0) for _, m, _ in pieces])
        truncated = ~torch.cat([_has_eos(r, m, self.eos_token_ids) for r, m, _ in pieces])
        rollout_logp = None
        if return_logprobs:
            rollout_logp = torch.cat([_pad_right(lp, response_len, 0.0) for _, _, lp in pieces])
        texts = self.tokenizer.batch_decode(
            [r[m.bool()].tolist() for r, m in zip(responses, response_mask)], skip_special_tokens=True
        )
        return RolloutBatch(
            input_ids=torch.cat([prompts, responses], 1),
            attention_mask=torch.cat([prompt_mask, response_mask], 1),
            response_mask=response_mask.float(),
            response_len=response_len,
            prompt_index=torch.arange(len(prompt_ids)).repeat_interleave(num_samples),
            texts=texts,
            truncated=truncated,
            gen_seconds=gen_seconds,
            num_generated_tokens=int(response_mask.sum()),
            rollout_logp=rollout_logp,
        )

    def _generate_rows(
        self, prompts, prompt_mask, *, max_new_tokens, temperature, top_p, greedy, return_logprobs
    ):
        """Generate for one group of rows; returns (responses [n, t] with pad after EOS, mask [n, t], logp | None)."""
        from transformers import GenerationConfig

        keep = prompt_mask.any(0).nonzero()[0, 0]  # drop columns that are padding in every row of this group
        prompts, prompt_mask = prompts[:, keep:], prompt_mask[:, keep:]
        sampling = {} if greedy else {"temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            **sampling,
            num_beams=1,
            repetition_penalty=1.0,
            use_cache=True,
            pad_token_id=self.pad_token_id,
            eos_token_id=self.eos_token_ids,
            return_dict_in_generate=True,
            output_scores=return_logprobs,
        )
        device = self.device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
            out = self.model.generate(
                input_ids=prompts.to(device), attention_mask=prompt_mask.to(device), generation_config=config
            )
        responses = out.sequences[:, prompts.shape[1] :].cpu()
        is_eos = torch.isin(responses, torch.tensor(self.eos_token_ids))
        # Everything strictly after a row's first EOS is padding.
        after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        responses = responses.masked_fill(after_eos, self.pad_token_id)
        mask = (~after_eos).long()
        logp = None
        if return_logprobs:
            logp = torch.stack(
                [
                    torch.log_softmax(score.float().cpu(), -1).gather(1, responses[:, t : t + 1]).squeeze(1)
                    for t, score in enumerate(out.scores)
                ],
                1,
            ).masked_fill(after_eos, 0.0)
        return responses, mask, logp


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model's generation config nor the tokenizer defines an EOS token")
    return sorted(set(int(i) for i in ids))


def _has_eos(responses: Tensor, mask: Tensor, eos_ids: list[int]) -> Tensor:
    return (torch.isin(responses, torch.tensor(eos_ids)) & mask.bool()).any(1)


def _pad_right(x: Tensor, width: int, value) -> Tensor:
    if x.shape[1] >= width:
        return x[:, :width]
    return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)


@contextlib.contextmanager
def _seeded(seed: int | None, device: torch.device):
    """Seed torch's RNG for the block and restore the caller's RNG state afterwards (no-op for ``None``)."""
    if seed is None:
        yield
        return
    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _check_request(prompt_ids, num_samples, max_new_tokens, temperature, top_p, greedy, vocab_size) -> None:
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
