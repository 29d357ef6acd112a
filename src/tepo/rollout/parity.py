"""Parity guard: does the rollout engine sample the weights being trained? (``rollout.parity.check``)

At a synchronous weight sync (the first two, then every ``rollout.parity.every``-th: :meth:`ParityGuard.due`) the
engine and the trainer score one fixed probe: ``len(PROBE_QUESTIONS)`` chat prompts and the responses the engine
sampled for them at the first check (seeded, temperature 1, so the tokens are not all near-certain ones whose
log-prob cannot move). The probe's tokens never change afterwards.

- The engine scores them under the weights it holds (``score_tokens``: one prefill, ``prompt_logprobs``): ``e``.
- The trainer scores them in float32 *at the weights the engine was sent*: the exported (LoRA-merged) tensors
  rounded to the engine's dtype (:func:`engine_weights`): ``c``. Why not the trainer's own float32 weights: a bf16
  engine cannot represent an update smaller than half a bf16 step of a weight. Measured on the embedded model
  (lr 2e-5, weights loaded from a bf16 checkpoint), the first update left every bf16 weight bit-identical, so a
  correct engine's log-probs did not move at all while the float32 trainer's moved by 0.05 per token: against
  the float32 weights a correct sync looks exactly like a stale one.

Three tests:

1. **Gross gap** (every check): ``gap = mean_t |e_t - c_t|`` above ``rollout.parity.max_gap`` stops the run. The
   engine holds the sent weights up to its own arithmetic (bf16 against float32): 0.03-0.04 per token measured.
2. **Frozen engine** (from the second check on): the sent weights changed (``c`` moved) but the engine's scores
   are *bit-identical* to the previous check's: it is still on the previous weights. The engine is
   deterministic for one request (same weights, same tokens, one prefill: measured bit-identical at every
   check), and no real change of its weights leaves all of the probe's log-probs unchanged, so this never fires
   on a correct sync and catches a skipped one whatever the size of the update.
3. **Update share** (for engines whose scores are not reproducible bit for bit, and syncs that load only part of
   the weights): with ``de = e_k - e_{k-1}`` and ``dc = c_k - c_{k-1}`` the changes since the previous check,

       share = (de . dc) / (dc . dc)

   is near 1 for an engine that reloaded and 0 for one that kept the previous weights. It is noisy (the engine's
   arithmetic: ``|share - 1|`` measured up to about 0.025 / rms(dc)), so it decides only when the update moved the
   probe by ``rms(dc) >= rollout.parity.min_shift``; then ``share < rollout.parity.min_share`` (0.5: nearer the previous weights
   than the current ones) stops the run. Otherwise the check is counted as undecided, not stopped.

Every check's numbers are in :attr:`ParityGuard.last` and go to the step's metrics row (``parity_*``). The
calibration of both thresholds on the embedded model, LoRA and full fine-tuning: ``benchmarks/calibrate_parity.py``
and docs/performance.md ("The parity guard").

Staged syncs (``rollout.async_steps=1``) are not checked (the model is mid-update in another thread by then); the
next check then spans several updates, which the share test handles the same way.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

PROBE_QUESTIONS = (
    "What is 17 + 25? Give the final answer as a number.",
    "Tom has 12 apples and buys 9 more. How many apples does he have?",
    "A box holds 6 rows of 7 eggs. How many eggs are in the box?",
    "What is 83 - 47? Give the final answer as a number.",
    "Sara reads 15 pages a day. How many pages does she read in 4 days?",
    "A train travels 60 miles in one hour. How far does it go in 3 hours?",
    "There are 48 cookies shared equally among 6 children. How many does each child get?",
    "What is 9 times 8, plus 5?",
)
# Sampled per probe prompt, once. More tokens average the engine's arithmetic noise down in the share
# (about 1/sqrt(tokens)); eight 64-token responses cost one small prefill and forward pass a sync.
PROBE_TOKENS = 64
PROBE_SEED = 1234


class ParityError(RuntimeError):
    """The rollout engine's log-probs do not match the trained policy's: it is not sampling the trained weights."""


def parity_config_errors(parity) -> list[str]:
    """Problems with the ``rollout.parity.*`` keys (a :class:`tepo.config.ParityConfig`), one message each."""
    errors = []
    if not parity.max_gap > 0:
        errors.append(f"rollout.parity.max_gap: must be > 0, got {parity.max_gap}")
    if not parity.min_shift > 0:
        errors.append(f"rollout.parity.min_shift: must be > 0, got {parity.min_shift}")
    if not 0 < parity.min_share < 1:
        errors.append(f"rollout.parity.min_share: must be in (0, 1), got {parity.min_share}")
    if isinstance(parity.every, bool) or not isinstance(parity.every, int) or parity.every < 1:
        errors.append(f"rollout.parity.every: must be an integer >= 1, got {parity.every!r}")
    return errors


def probe_prompt_ids(tokenizer, question: str = PROBE_QUESTIONS[0]) -> list[int]:
    messages = [{"role": "user", "content": question}]
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return [int(t) for t in tokenizer(question)["input_ids"]]


@contextlib.contextmanager
def engine_weights(model, dtype: torch.dtype):
    """Inside, ``model`` computes with the weights an engine of ``dtype`` was sent: its exported (LoRA-merged)
    tensors (:func:`tepo.lora.merged_state_dict`, as :func:`tepo.rollout.weight_sync.write_weights` writes them) rounded
    to ``dtype`` and back to the parameters' dtype. A LoRA model runs with its adapters off and the merged weights
    in its base layers. The parameters' own tensors are put back untouched on exit (the swap replaces ``.data``,
    never writes into it), so training continues bit for bit. Costs one transient copy of the weights."""
    from tepo.lora import is_lora, merged_state_dict

    base = model.get_base_model() if is_lora(model) else model
    params = dict(base.named_parameters())
    rounded = {}
    with torch.no_grad():
        for name, tensor in merged_state_dict(model).items():
            target = name if name in params else name.replace(".weight", ".base_layer.weight")
            if target in params:
                p = params[target]
                rounded[target] = tensor.detach().to(dtype).to(p.dtype)
    saved = {name: params[name].data for name in rounded}
    adapters_off = model.disable_adapter() if is_lora(model) else contextlib.nullcontext()
    try:
        for name, tensor in rounded.items():
            params[name].data = tensor
        with adapters_off:
            yield model
    finally:
        for name, tensor in saved.items():
            params[name].data = tensor


class Probe:
    """The fixed probe: the engine's sampled batch (laid out for :func:`tepo.logprobs.response_logprobs`), and the
    same rows as full token lists (prompt + response) with where each response starts, for the engine's scorer.
    Rows with an empty response are left out of the lists; they have no token to score on either side."""

    def __init__(self, batch):
        self.batch = batch
        prompt_width = batch.input_ids.shape[1] - batch.response_len
        self.sequences, self.starts = [], []
        for i in range(batch.input_ids.shape[0]):
            kept = batch.input_ids[i][batch.attention_mask[i].bool()].tolist()
            start = int(batch.attention_mask[i, :prompt_width].sum())
            if len(kept) > start:
                self.sequences.append(kept)
                self.starts.append(start)


def sample_probe(rollout, tokenizer) -> Probe:
    """Draw the probe's responses with the engine, once (seeded: the same probe for the same start weights)."""
    prompts = [probe_prompt_ids(tokenizer, q) for q in PROBE_QUESTIONS]
    batch = rollout.generate(
        prompts, num_samples=1, max_new_tokens=PROBE_TOKENS, temperature=1.0, top_p=1.0, seed=PROBE_SEED
    )
    probe = Probe(batch)
    if not probe.sequences:
        raise ParityError("the parity probe is empty: the engine answered every probe prompt with no token")
    return probe


def trainer_probe_logprobs(model, probe: Probe, dtype: torch.dtype) -> torch.Tensor:
    """The probe's response log-probs, flat, in float32 at the weights an engine of ``dtype`` was sent."""
    from tepo.logprobs import response_logprobs

    batch = probe.batch
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()  # no dropout (LoRA's): the policy the engine was given
    try:
        with torch.no_grad(), engine_weights(model, dtype):
            logp = response_logprobs(
                model,
                batch.input_ids.to(device),
                batch.attention_mask.to(device),
                response_len=batch.response_len,
                compute_entropy=False,
            ).logp
    finally:
        model.train(was_training)
    return logp.float().cpu()[batch.response_mask.bool()].double()


def engine_probe_logprobs(rollout, probe: Probe) -> torch.Tensor:
    rows = rollout.score_tokens(probe.sequences, probe.starts)
    # On the host, as the trainer's side (trainer_probe_logprobs): the comparison is a few hundred numbers.
    return torch.tensor([v for row in rows for v in row], dtype=torch.float64, device="cpu")


def update_share(
    engine_before: torch.Tensor,
    trainer_before: torch.Tensor,
    engine_now: torch.Tensor,
    trainer_now: torch.Tensor,
) -> tuple[float | None, float, float]:
    """``(share, shift, residual)`` of the same tokens' log-probs scored at two checks, with ``de``/``dc`` the
    engine's/trainer's change between them: ``share = (de . dc) / (dc . dc)`` (None when ``dc = 0``),
    ``shift = rms(dc)`` and ``residual = rms(de - dc)`` (the engine's arithmetic noise when it is current; by
    Cauchy-Schwarz ``|share - 1| <= residual / shift``)."""
    de = (engine_now - engine_before).double()
    dc = (trainer_now - trainer_before).double()
    n = max(dc.numel(), 1)
    squared = float(dc @ dc)
    shift = math.sqrt(squared / n)
    residual = math.sqrt(float((de - dc) @ (de - dc)) / n)
    return (float(de @ dc) / squared if squared > 0 else None), shift, residual


@dataclass
class ParityReading:
    gap: float  # mean |engine - trainer| per probe token, now
    share: float | None  # the engine's share of the trainer's change since the last check (None: first check)
    shift: float | None  # rms per token of the trainer's change since the last check
    residual: float | None  # rms per token of (engine's change - trainer's change)
    decided: bool  # the share test applied (shift >= min_shift)
    frozen: bool = False  # the sent weights changed, the engine's scores did not (bit for bit)

    def metrics(self) -> dict:
        out = {"parity_gap": self.gap, "parity_decided": int(self.decided), "parity_frozen": int(self.frozen)}
        if self.shift is not None:
            out["parity_shift"] = self.shift
            out["parity_residual"] = self.residual
        if self.share is not None:
            out["parity_share"] = self.share
        return out


def parity_guard_from_config(parity_config, engine_dtype: torch.dtype) -> ParityGuard | None:
    """The guard ``rollout.parity`` asks for (a `tepo.config.ParityConfig`), None when ``check`` is off: built
    with the backend that syncs weights to an engine of its own, and handed to it (``VLLMRollout.from_config``)."""
    if not parity_config.check:
        return None
    return ParityGuard(
        parity_config.max_gap,
        min_shift=parity_config.min_shift,
        min_share=parity_config.min_share,
        engine_dtype=engine_dtype,
        every=parity_config.every,
    )


class ParityGuard:
    """Called by the engine after each weight sync (see :meth:`tepo.rollout.vllm.VLLMRollout.sync_weights`)."""

    def __init__(
        self,
        max_gap: float,
        *,
        min_shift: float = 0.08,
        min_share: float = 0.5,
        engine_dtype: torch.dtype = torch.bfloat16,
        every: int = 1,
    ):
        self.max_gap = float(max_gap)
        self.every = int(every)
        self.syncs = 0  # syncs offered to :meth:`due` by this process (a resumed run counts from 0 again)
        self.min_shift = float(min_shift)
        self.min_share = float(min_share)
        self.engine_dtype = engine_dtype
        self.probe: Probe | None = None
        self._previous: tuple[torch.Tensor, torch.Tensor] | None = None
        self.last: ParityReading | None = None
        self.checks = 0
        self.undecided = 0
        self.logged = 0  # checks already in a metrics row (unlogged_metrics)

    @property
    def last_gap(self) -> float | None:
        return None if self.last is None else self.last.gap

    # ---- checkpointed with the run, so that a resumed run's first check still compares against the last one --

    def state_dict(self) -> dict:
        """The probe's tokens, the last check's two score vectors and the counters: a few thousand numbers.

        Without them a resumed run would draw a new probe from its current weights, and its first check could
        test only the gross gap: a sync that fails right after a resume would go unseen for one more update."""
        batch = None if self.probe is None else self.probe.batch
        return {
            "probe": None
            if batch is None
            else {
                "input_ids": batch.input_ids,
                "attention_mask": batch.attention_mask,
                "response_mask": batch.response_mask,
                "response_len": int(batch.response_len),
                "prompt_index": batch.prompt_index,
                "truncated": batch.truncated,
            },
            "previous": None if self._previous is None else list(self._previous),
            "checks": self.checks,
            "undecided": self.undecided,
        }

    def load_state_dict(self, state: dict) -> None:
        from tepo.rollout.base import RolloutBatch

        probe = state["probe"]
        if probe is None:
            self.probe = None
        else:
            n = probe["input_ids"].shape[0]
            self.probe = Probe(
                RolloutBatch(
                    **probe,
                    texts=[""] * n,  # the scorers read tokens only
                    gen_seconds=0.0,
                    num_generated_tokens=int(probe["response_mask"].sum()),
                )
            )
        previous = state["previous"]
        self._previous = None if previous is None else (previous[0], previous[1])
        self.checks = int(state["checks"])
        self.undecided = int(state["undecided"])
        self.logged = self.checks  # a resumed run's kept metrics rows hold them already

    def unlogged_metrics(self) -> dict | None:
        """The last check's metrics (the gap, the share of the last update, the undecided total) once per new
        check, for the step's metrics row; None when no check happened since the last call."""
        if self.last is None or self.checks <= self.logged:
            return None
        self.logged = self.checks
        return {**self.last.metrics(), "parity_undecided_total": self.undecided}

    def due(self) -> bool:
        """Count one more synchronous sync; True if it is to be checked: the first two this process makes (so a
        resumed run's first checks are full ones, and the frozen-engine test has its pair at once), then every
        ``every``-th. A check spans all the updates since the previous one: the frozen-engine and share tests
        compare with that check, so an engine that stopped taking syncs is caught at the next check."""
        self.syncs += 1
        return self.syncs <= 2 or self.syncs % self.every == 0

    def check(self, rollout) -> ParityReading:
        if self.probe is None:
            self.probe = sample_probe(rollout, rollout.tokenizer)
        engine = engine_probe_logprobs(rollout, self.probe)
        trainer = trainer_probe_logprobs(rollout.model, self.probe, self.engine_dtype)
        if engine.shape != trainer.shape:
            raise ParityError(
                f"the engine scored {engine.numel()} probe tokens and the trainer {trainer.numel()}: they did not "
                "read the same tokens"
            )
        gap = float((engine - trainer).abs().mean())
        share = shift = residual = None
        frozen = False
        if self._previous is not None:
            share, shift, residual = update_share(*self._previous, engine, trainer)
            frozen = shift > 0 and torch.equal(engine, self._previous[0])
        decided = shift is not None and share is not None and shift >= self.min_shift
        self._previous = (engine, trainer)
        self.last = ParityReading(gap, share, shift, residual, decided, frozen)
        self.checks += 1
        self.undecided += int(shift is not None and not decided)
        if not gap <= self.max_gap:
            raise ParityError(
                f"the rollout engine is not sampling the trained weights: on a fixed probe its log-probs differ "
                f"from the trainer's by {gap:.4f} per token on average, above rollout.parity.max_gap="
                f"{self.max_gap} (a correct sync differs only by the engine's dtype). Check the weight sync "
                "(tepo.rollout.weight_sync.write_weights); set rollout.parity.check=false only to debug."
            )
        if frozen:
            raise ParityError(
                "the rollout engine is not sampling the latest weights: the weights it was sent changed since the "
                f"last sync (the trainer's log-probs on a fixed probe moved by {shift:.4f} per token, rms) but the "
                "engine's log-probs of the probe are bit-identical to the last check's, so it still holds the "
                "previous weights: the last weight sync did not reach the engine. Set rollout.parity.check=false "
                "only to debug."
            )
        if decided and not share >= self.min_share:
            raise ParityError(
                f"the rollout engine is not sampling the latest weights: since the last sync the trainer's "
                f"log-probs on a fixed probe moved by {shift:.4f} per token (rms), and the engine's followed "
                f"{share:.2f} of that move, below rollout.parity.min_share={self.min_share} (a reloaded engine "
                "follows about 1, one that kept the previous weights 0). The last weight sync did not reach the "
                "engine; set rollout.parity.check=false only to debug."
            )
        return self.last
