"""Rollout with transformers' ``generate`` on the trainer's own model: runs anywhere (``auto``'s fallback)."""

from __future__ import annotations

import contextlib
import time

import torch
from torch import Tensor

from tepo.precision import native_bf16, standalone_generate_autocast
from tepo.rollout.base import RolloutBatch, check_generate_request, eos_token_ids


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

    ``autocast_bf16=None`` (or ``"auto"``) asks :func:`tepo.precision.standalone_generate_autocast` (CPU: off,
    CUDA: on where the GPU computes bf16 natively). Under bf16 autocast the sampler's distribution
    differs slightly from the float32 policy that :func:`tepo.logprobs.response_logprobs` scores.

    Behaviour log-probs (``return_logprobs=True``): ``log_softmax`` of the scores ``generate`` sampled from
    (the logits after the temperature and top-p processors, the tokens outside the nucleus at ``-inf``), gathered
    at the sampled tokens; so ``rollout_logp`` is ``log_softmax(logits / temperature)`` at ``top_p == 1`` and the
    renormalised nucleus log-probability below it, computed from the same (possibly bf16-autocast) logits that
    were sampled from. See :class:`tepo.rollout.base.RolloutBackend`. They are taken at the step each token is
    sampled (:class:`_SampledLogprobs`), not from ``output_scores``, which would keep one float32
    ``[rows, vocab]`` tensor per generated token alive until the end (about 80 GB at 128 rows x 1024 tokens x a
    151,936 vocabulary).
    """

    @classmethod
    def from_config(
        cls, rollout_config, model, tokenizer, *, seed: int, run_dir=None, log=print
    ) -> HFRollout:
        """The backend for ``rollout.backend=hf`` (``seed``, ``run_dir``, ``log``: nothing to use them for)."""
        del seed, run_dir, log
        autocast = rollout_config.autocast_bf16
        if autocast == "auto":  # a run config's auto: the hardware's choice, as tepo.training resolves it
            autocast = native_bf16(str(next(model.parameters()).device)).native
        return cls(
            model,
            tokenizer,
            autocast_bf16=autocast,  # None: the standalone default (tepo eval)
            max_batch_size=rollout_config.hf.max_batch_size,
        )

    @classmethod
    def availability(cls, rollout_config) -> tuple[bool, str]:
        """Always available: it runs the trainer's own model with transformers."""
        del rollout_config
        return True, "transformers generate on the trainer's own model"

    @classmethod
    def config_errors(cls, rollout_config) -> list[str]:
        """Problems with this backend's keys of ``rollout`` (one message each)."""
        rows = rollout_config.hf.max_batch_size
        if rows is not None and (isinstance(rows, bool) or rows < 1):
            return [f"rollout.hf.max_batch_size: must be >= 1 (or null for all rows at once), got {rows}"]
        return []

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
        # None/"auto": tepo.precision decides (float32 on the CPU, bf16 on a GPU that computes it natively); the
        # trainer passes its resolved rollout.autocast_bf16.
        self.autocast_bf16 = (
            standalone_generate_autocast(str(self.device))
            if autocast_bf16 is None or autocast_bf16 == "auto"
            else bool(autocast_bf16)
        )
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_ids = eos_token_ids(model, tokenizer)
        self.last_sync_seconds = None  # no engine of its own: nothing is ever synced

    overlaps_training = False  # it samples from the trainer's own model object, in the trainer's process
    parity_guard = None  # no engine of its own, so nothing to check (tepo.rollout.parity)

    def weights_updated(self) -> None:
        """Nothing to do: this backend samples from the trainer's own model object."""

    def stage_weights(self) -> float:
        """Nothing to copy: this backend samples from the trainer's own model object."""
        return 0.0

    def end_staging(self) -> None:
        """Nothing to do (see :meth:`stage_weights`)."""

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
        sampler's own log-probabilities of the chosen tokens as ``RolloutBatch.rollout_logp`` (from
        ``output_scores``: after temperature and top-p, the nucleus renormalised; see the class docstring)."""
        vocab_size = self.model.get_input_embeddings().weight.shape[0]
        check_generate_request(
            prompt_ids, num_samples, max_new_tokens, temperature, top_p, greedy, vocab_size
        )
        rows = [list(map(int, p)) for p in prompt_ids for _ in range(num_samples)]
        prompt_width = max(map(len, rows))
        # Laid out on the CPU (the batch is returned there); each group of rows goes to the model's device to generate.
        prompts = torch.full((len(rows), prompt_width), self.pad_token_id, dtype=torch.long, device="cpu")
        prompt_mask = torch.zeros_like(prompts)
        for i, ids in enumerate(rows):
            prompts[i, prompt_width - len(ids) :] = torch.tensor(ids, device="cpu")
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
            prompt_index=torch.arange(len(prompt_ids), device="cpu").repeat_interleave(num_samples),
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
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList

        keep = prompt_mask.any(0).nonzero()[0, 0]  # drop columns that are padding in every row of this group
        prompts, prompt_mask = prompts[:, keep:], prompt_mask[:, keep:]
        sampling = {} if greedy else {"temperature": float(temperature), "top_p": float(top_p), "top_k": 0}
        recorder = None
        extra = {}
        if return_logprobs:
            # generate runs caller-supplied processors *before* its own temperature/top-p warpers, so a recorder
            # passed alongside them would see the logits before temperature. The warpers move into the caller's
            # list instead (the same classes, in generate's order: temperature, then top-p) and generate is told
            # temperature=1, top_p=1 so it adds none of its own: the scores sampled from are the same tensor
            # values as without the recorder, and so are the samples for a fixed seed.
            recorder = _SampledLogprobs()
            warpers = [] if greedy else _sampling_warpers(float(temperature), float(top_p))
            extra = {
                "logits_processor": LogitsProcessorList([*warpers, recorder.processor]),
                "stopping_criteria": StoppingCriteriaList([recorder.criterion]),
            }
            if not greedy:
                sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
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
        )
        device = self.device
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=self.autocast_bf16):
            out = self.model.generate(
                input_ids=prompts.to(device),
                attention_mask=prompt_mask.to(device),
                generation_config=config,
                **extra,
            )
        responses = out.sequences[:, prompts.shape[1] :].cpu()
        is_eos = torch.isin(responses, torch.tensor(self.eos_token_ids, device=responses.device))
        # Everything strictly after a row's first EOS is padding.
        after_eos = (is_eos.long().cumsum(1) - is_eos.long()) > 0
        responses = responses.masked_fill(after_eos, self.pad_token_id)
        mask = (~after_eos).long()
        logp = None
        if return_logprobs:
            # One column per generated token; generate may run (and then undo) an extra step on CUDA when it
            # defers its stop check, so keep only as many columns as it returned tokens.
            logp = recorder.logprobs()[:, : responses.shape[1]].cpu().masked_fill(after_eos, 0.0)
        return responses, mask, logp


def _sampling_warpers(temperature: float, top_p: float) -> list:
    """generate's own warpers for these settings, in its order (``_get_logits_processor``: temperature, top-k
    (disabled here), top-p), with the ``min_tokens_to_keep=1`` it uses for single-beam sampling."""
    from transformers import TemperatureLogitsWarper, TopPLogitsWarper

    warpers = []
    if temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(temperature))
    if top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=top_p, min_tokens_to_keep=1))
    return warpers


class _SampledLogprobs:
    """Records each sampled token's log-probability at the step it is sampled, keeping one ``[rows]`` column per
    step instead of a ``[rows, vocab]`` tensor.

    ``processor`` goes last in the logits processors: it sees the final scores (the tensor ``generate`` samples
    from) and holds a reference to them. ``criterion`` goes in the stopping criteria, which ``generate`` calls right
    after the token is chosen and appended to ``input_ids``: it gathers ``log_softmax(scores)`` at that token and
    drops the reference, so no full-vocabulary tensor outlives its step. The values are those the former
    ``output_scores`` path computed: ``log_softmax(score.float())`` at the sampled token (the pad token for rows
    that already finished; the caller masks those).
    """

    def __init__(self):
        self._scores: Tensor | None = None
        self._columns: list[Tensor] = []
        self.processor = _HoldScores(self)
        self.criterion = _GatherSampled(self)

    def logprobs(self) -> Tensor:
        """``[rows, steps]`` log-probs of the sampled tokens."""
        return torch.stack(self._columns, 1)


class _HoldScores:
    def __init__(self, owner: _SampledLogprobs):
        self.owner = owner

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self.owner._scores = scores
        return scores


class _GatherSampled:
    def __init__(self, owner: _SampledLogprobs):
        self.owner = owner

    def __call__(self, input_ids: Tensor, scores, **kwargs) -> Tensor:
        held, self.owner._scores = self.owner._scores, None
        self.owner._columns.append(
            torch.log_softmax(held.float(), -1).gather(1, input_ids[:, -1:]).squeeze(1)
        )
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def _has_eos(responses: Tensor, mask: Tensor, eos_ids: list[int]) -> Tensor:
    return (torch.isin(responses, torch.tensor(eos_ids, device=responses.device)) & mask.bool()).any(1)


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
