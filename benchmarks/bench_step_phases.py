"""Where one default step's time goes, phase by phase, with the vLLM rollout's pieces apart (issue #54).

    .venv/bin/python benchmarks/bench_step_phases.py                      # the default run's first 5 steps
    .venv/bin/python benchmarks/bench_step_phases.py rollout.parity.every=1 --steps 4
    .venv/bin/python benchmarks/bench_step_phases.py --fixed-length 64 --threads 1   # bench_vs_trl's setting

Runs the default config (plus any overrides) for ``--steps`` steps in this process, with timers wrapped around the
rollout backend's calls: the whole generation phase (``time/gen_seconds``), the engine's own seconds for each
command it ran (``generate``, ``reload``, ``score``: the server measures them), the parity guard's check and its
float32 probe pass in the trainer, and the update; ``gen rest`` is what the generation phase spent outside the
sync and the engine's generate: on a step whose sync the parity guard checks, the check's scoring (the engine's
and the trainer's float32 pass; sampling the probe, on the first check, is in ``engine generate``), else the
pipe, JSON and building the batch. One row per step. Step 1 has no weight sync before it; the
first parity check also samples the guard's probe. Nothing is changed in what the step computes.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import bind_engine_cores, set_threads


def timed(owner, name: str, key: str, totals: dict) -> None:
    """Wrap ``owner.name`` so that each call adds its seconds to ``totals[key]``."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0.0) + time.perf_counter() - start

    setattr(owner, name, wrapper)


COLUMNS = [
    "step",
    "tokens",
    "generation",
    "sync",
    "engine reload",
    "engine generate",
    "gen rest",
    "parity check",
    "parity: trainer fp32 pass",
    "engine score",
    "update",
    "step s",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="config overrides, as tepo train takes them")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument(
        "--fixed-length",
        type=int,
        default=0,
        help="every response exactly this many tokens (bench_vs_trl's mode)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads, trainer and engine (0: all cores)"
    )
    return parser


def instrument(totals: dict) -> None:
    """Timers around the parity guard, its float32 pass and every engine command (the server's own seconds)."""
    import tepo.rollout.parity as parity
    import tepo.rollout.vllm as vllm

    timed(parity.ParityGuard, "check", "parity check", totals)
    timed(parity, "trainer_probe_logprobs", "parity: trainer fp32 pass", totals)
    call = vllm.VLLMRollout._call

    def engine_call(self, request):
        reply = call(self, request)
        key = f"engine {request['cmd']}"
        totals[key] = totals.get(key, 0.0) + float(reply.get("seconds", 0.0))
        return reply

    vllm.VLLMRollout._call = engine_call


def phase_row(step: int, row: dict, totals: dict, seconds: float) -> dict:
    """One table row from the step's metrics and the timers' totals."""
    sync = row.get("time/rollout_sync_seconds") or 0.0
    return {
        "step": step,
        "tokens": row["rollout/gen_tokens"],
        "generation": row["time/gen_seconds"],
        "sync": sync,
        **totals,
        "gen rest": row["time/gen_seconds"] - sync - totals.get("engine generate", 0.0),
        "update": row["time/update_seconds"],
        "step s": seconds,
    }


def run_steps(args, totals: dict) -> list[dict]:
    """The default config's first ``args.steps`` steps in this process, one phase row each."""
    from tepo.config import load_config
    from tepo.rewards import RewardPool
    from tepo.training import Trainer
    from tepo.training.step import train_step

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        fixed = [f"train.output_dir={tmp}", "eval.size=0", "train.save_every=0", "train.save_final=false"]
        config = load_config("default", [*fixed, "log.progress=false", *args.overrides])
        trainer = Trainer(config, Path(tmp) / "run", log=lambda *_: None).setup()
        if args.fixed_length:
            trainer.rollout.min_new_tokens = args.fixed_length  # as bench_vs_trl's use_fixed_length
        pool = RewardPool(num_workers=config.reward.num_workers, timeout_s=config.reward.timeout_s)
        with pool, trainer.rollout:
            for _ in range(args.steps):
                totals.clear()
                start = time.perf_counter()  # the trainer's loop adds time/step_seconds, not train_step
                row = train_step(trainer.parts, trainer.plan, pool, trainer.step, trainer.next_batch(pool))
                seconds = time.perf_counter() - start
                trainer.counters.step += 1
                rows.append(phase_row(trainer.counters.step, row, totals, seconds))
    return rows


def print_table(rows: list[dict]) -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in rows:
        cells = [f"{row[k]:.0f}" if k in ("step", "tokens") else f"{row.get(k, 0.0):.2f}" for k in COLUMNS]
        print("| " + " | ".join(cells) + " |")


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads:
        set_threads(args.threads)
        bind_engine_cores(args.threads)
    totals: dict[str, float] = {}
    instrument(totals)
    print_table(run_steps(args, totals))


if __name__ == "__main__":
    main()
