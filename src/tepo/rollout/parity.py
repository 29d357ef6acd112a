"""Parity guard: does the rollout engine sample the weights being trained? (``rollout.parity_check``)

At each weight sync the engine decodes a short fixed probe greedily (one chat prompt, ``PROBE_TOKENS`` tokens; its
reported log-probs are then the plain ``log_softmax`` of its logits) and the trainer
scores the same tokens with :func:`tepo.logprobs.response_logprobs` in float32. The gap is

    gap = mean_t | log pi_engine(y_t | x, y_<t) - log pi_trainer(y_t | x, y_<t) |

over the probe's tokens. An engine holding the trainer's weights differs only by its numerics (bf16 against
float32); an engine that kept old weights (a broken sync) differs by what the updates changed. A gap above
``rollout.parity_max_gap`` stops the run with :class:`ParityError` (measured gaps and the threshold's calibration:
docs/performance.md).
"""

from __future__ import annotations

import torch

PROBE_QUESTION = "What is 17 + 25? Give the final answer as a number."
PROBE_TOKENS = 24


class ParityError(RuntimeError):
    """The rollout engine's log-probs do not match the trained policy's: it is not sampling the trained weights."""


def probe_prompt_ids(tokenizer) -> list[int]:
    messages = [{"role": "user", "content": PROBE_QUESTION}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(PROBE_QUESTION)["input_ids"]]


def parity_gap(rollout, model, tokenizer) -> float:
    """Mean absolute log-prob gap between ``rollout``'s engine and ``model`` (float32) on the fixed probe."""
    from tepo.logprobs import response_logprobs

    batch = rollout.generate(
        [probe_prompt_ids(tokenizer)],
        num_samples=1,
        max_new_tokens=PROBE_TOKENS,
        temperature=1.0,
        top_p=1.0,
        seed=0,
        greedy=True,
        return_logprobs=True,
    )
    was_training = model.training
    model.eval()  # no dropout (LoRA's): the policy the engine was given
    try:
        with torch.no_grad():
            logp, _ = response_logprobs(
                model, batch.input_ids, batch.attention_mask, response_len=batch.response_len
            )
    finally:
        model.train(was_training)
    mask = batch.response_mask.bool()
    return float((logp.float() - batch.rollout_logp.float()).abs()[mask].mean())


class ParityGuard:
    """Called by the engine after each weight sync (see :meth:`tepo.rollout.vllm.VLLMRollout.sync_weights`)."""

    def __init__(self, max_gap: float):
        self.max_gap = float(max_gap)
        self.last_gap: float | None = None
        self.checks = 0

    def check(self, rollout) -> float:
        gap = parity_gap(rollout, rollout.model, rollout.tokenizer)
        self.last_gap = gap
        self.checks += 1
        if not gap <= self.max_gap:
            raise ParityError(
                f"the rollout engine is not sampling the trained weights: on a fixed probe its log-probs differ "
                f"from the trainer's by {gap:.4f} per token on average, above rollout.parity_max_gap="
                f"{self.max_gap} (a correct sync differs only by the engine's dtype). Check the weight sync "
                "(tepo.rollout.vllm.write_weights); set rollout.parity_check=false only to debug."
            )
        return gap
