"""Calibrate the parity guard (tepo.rollout.parity) on the real vLLM engine: correct runs, and what a skipped sync
would have left, at every check.

    .venv/bin/python benchmarks/calibrate_parity.py --steps 30 --out docs/results/parity       # ~25 min, 2 runs
    .venv/bin/python benchmarks/calibrate_parity.py --steps 4 --variants full --out /tmp/parity  # a quick look

Each variant trains the embedded model with the default preset (full fine-tuning, lr 2e-5) or ``tepo_lora``
(rank 16, lr 2e-4) on the vLLM engine, with the guard recording and never stopping. At every weight sync it
records the guard's reading of the correct engine (gap, the update's shift of the probe, the engine's share of it,
the residual) and, from the engine's scores of the probe taken just *before* its reload, the reading a sync
skipped on purpose would have given (the engine still on the previous weights): ``stale_*``. A threshold pair
(``rollout.parity.min_shift``, ``rollout.parity.min_share``) is sound when no correct check is stopped and every decided stale
check is. Writes ``<variant>.jsonl`` (one line a check) and ``table.md`` under ``--out``, and prints the table.
The machine should be otherwise idle only for the timings, which are not reported; the readings do not depend on
load.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

import tepo.rollout.parity as parity
from tepo.config import RolloutConfig, load_config
from tepo.metrics.tables import format_table
from tepo.rollout.vllm import VLLMRollout
from tepo.training import train

VARIANTS = {
    "full": ("default", []),
    "lora": ("tepo_lora", []),
}


def record(out_path: Path):
    """Patch the guard and the engine client so every check is recorded (correct and would-be stale)."""
    state: dict = {}
    sink = out_path.open("w")
    real_call, real_check = VLLMRollout._call, parity.ParityGuard.check

    def call(self, request):
        guard = getattr(self, "parity_guard", None)
        if request["cmd"] == "reload" and guard is not None and guard.probe is not None:
            state["stale"] = parity.engine_probe_logprobs(self, guard.probe)  # the previous weights
        return real_call(self, request)

    def check(self, rollout):
        previous = self._previous
        max_gap, min_share = self.max_gap, self.min_share
        self.max_gap, self.min_share = float("inf"), float("-inf")  # record, never stop
        try:
            reading = real_check(self, rollout)
        finally:
            self.max_gap, self.min_share = max_gap, min_share
        tokens = sum(len(seq) - k for seq, k in zip(self.probe.sequences, self.probe.starts))
        row = {"check": self.checks, "probe_tokens": tokens, **reading.metrics()}
        stale = state.pop("stale", None)
        if previous is not None and stale is not None:
            trainer_now = self._previous[1]
            share, _, _ = parity.update_share(previous[0], previous[1], stale, trainer_now)
            row.update(
                stale_share=share,
                stale_gap=float((stale - trainer_now).abs().mean()),
                stale_identical=bool(torch.equal(stale, previous[0])),
            )
        sink.write(json.dumps(row) + "\n")
        sink.flush()
        return reading

    VLLMRollout._call, parity.ParityGuard.check = call, check
    return lambda: (
        setattr(VLLMRollout, "_call", real_call),
        setattr(parity.ParityGuard, "check", real_check),
        sink.close(),
    )


def summarize(name: str, rows: list[dict], min_shift: float, min_share: float, max_gap: float) -> dict:
    later = [r for r in rows if "parity_shift" in r]
    decided = [r for r in later if r["parity_shift"] >= min_shift]
    stale = [r for r in later if r.get("stale_share") is not None]
    stale_decided = [r for r in stale if r["parity_shift"] >= min_shift]
    wrong_stops = [r for r in decided if r["parity_share"] < min_share] + [
        r for r in rows if r["parity_gap"] > max_gap
    ]
    missed = [r for r in stale_decided if r["stale_share"] >= min_share]
    residual_over_shift = [r["parity_residual"] / r["parity_shift"] for r in later if r["parity_shift"] > 0]
    return {
        "variant": name,
        "checks": len(rows),
        "decided": len(decided),
        "undecided": len(later) - len(decided),
        "gap_max": max(r["parity_gap"] for r in rows),
        "shift_median": statistics.median(r["parity_shift"] for r in later) if later else None,
        "shift_min": min((r["parity_shift"] for r in later), default=None),
        "share_min": min((r["parity_share"] for r in decided), default=None),
        "share_max": max((r["parity_share"] for r in decided), default=None),
        "residual_max": max((r["parity_residual"] for r in later), default=None),
        "residual_over_shift_max": max(residual_over_shift, default=None),
        "stale_share_max": max((r["stale_share"] for r in stale_decided), default=None),
        "stale_identical": all(r.get("stale_identical") for r in stale),
        "stale_gap_max": max((r["stale_gap"] for r in stale), default=None),
        "correct_runs_stopped": len(wrong_stops),
        "stale_checks_caught": f"{len(stale_decided) - len(missed)}/{len(stale_decided)} decided "
        f"(of {len(stale)})",
    }


def table(summaries: list[dict]) -> str:
    return format_table(list(summaries[0]), [list(s.values()) for s in summaries])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--variants", default="full,lora")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reuse", action="store_true", help="summarize existing <variant>.jsonl files only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    defaults = RolloutConfig().parity
    summaries = []
    for name in args.variants.split(","):
        preset, extra = VARIANTS[name]
        path = args.out / f"{name}.jsonl"
        if not args.reuse:
            restore = record(path)
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    config = load_config(
                        preset,
                        [
                            f"train.steps={args.steps}",
                            "eval.size=0",
                            f"train.output_dir={tmp}",
                            "train.save_every=0",
                            "train.save_final=false",
                            "rollout.backend=vllm",
                            *extra,
                        ],
                    )
                    train(config, run_dir=None, log=lambda *a: print(*a, file=sys.stderr))
            finally:
                restore()
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        summaries.append(summarize(name, rows, defaults.min_shift, defaults.min_share, defaults.max_gap))
    text = (
        f"Parity guard calibration: {args.steps} steps a variant, thresholds rollout.parity.min_shift="
        f"{defaults.min_shift}, min_share={defaults.min_share}, max_gap="
        f"{defaults.max_gap} (regenerate: benchmarks/calibrate_parity.py --reuse --out {args.out})\n\n"
        + table(summaries)
        + "\n"
    )
    (args.out / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
