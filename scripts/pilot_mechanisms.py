"""The mechanisms of a pilot, one row per setting and method: where TEPO's sequence ratios lie against its clip
band, how often that clip and GRPO's token clip fire, TEPO v2's mask share and the size of its KL term, the
truncated share and whether the run collapsed (tepo.compare.measures.COLLAPSE_RULE).

    python scripts/pilot_mechanisms.py docs/results/tepo-decided/pilot

Reads every ``<setting>/<method>/seed<k>/`` run under the directory (each setting a `tepo compare` directory), from
its metrics.jsonl, eval_before.json and summary.json. Per-step values are the logged ones (a loss metric is the
token-weighted mean over the step's micro-batches); "p50 of steps" is the median over the steps of the logged
per-update quantile, "max"/"min" the extreme over the steps.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

COLUMNS = (
    "setting", "method", "steps", "updates/step", "seq ratio p10 / p50 / p90", "seq ratio min / max",
    "seq clip fire", "token clip share", "v2 mask share", "v2 KL term mean / max", "truncated (last 1/3)",
    "held-out before -> after", "collapsed",
)  # fmt: skip


def _series(rows: list[dict], name: str) -> list[float]:
    from tepo.compare.measures import _number

    return [float(r[name]) for r in rows if _number(r.get(name)) is not None]


def _summed(rows: list[dict], names: tuple[str, str]) -> list[float]:
    """Per step, the sum of the named shares that the step logged (a step that logged neither is left out)."""
    from tepo.compare.measures import _number

    out = []
    for row in rows:
        present = [float(row[n]) for n in names if _number(row.get(n)) is not None]
        if present:
            out.append(sum(present))
    return out


def _fmt(values: list[float], how=statistics.median, digits: int = 3) -> str:
    return "-" if not values else f"{how(values):.{digits}f}"


def run_row(setting: str, method: str, run_dir: Path) -> list[str]:
    """One run's mechanisms as table cells (see the module docstring)."""
    from tepo.compare.measures import EVAL_BEFORE_FILE, _read_json, collapsed, truncated_last_third
    from tepo.metrics import read_metrics

    rows = read_metrics(run_dir / "metrics.jsonl")
    s = lambda name: _series(rows, f"update/{name}")  # noqa: E731
    fire = _summed(rows, ("update/seq_clip_frac_low", "update/seq_clip_frac_high"))
    token = _summed(rows, ("update/clip_frac_low", "update/clip_frac_high"))
    before = (_read_json(run_dir / EVAL_BEFORE_FILE) or {}).get("eval_greedy_accuracy")
    after = ((_read_json(run_dir / "summary.json") or {}).get("after") or {}).get("eval_greedy_accuracy")
    truncated = truncated_last_third(rows)
    collapse = collapsed(before, after, truncated)
    fired = (
        f"{_fmt(fire, statistics.fmean, 4)} ({sum(f > 0 for f in fire)}/{len(fire)} steps)" if fire else "-"
    )
    return [
        setting,
        method,
        str(len(rows)),
        _fmt(s("optimizer_updates"), statistics.fmean, 1),
        " / ".join(_fmt(s(f"seq_ratio_p{q}")) for q in (10, 50, 90)),
        f"{_fmt(s('seq_ratio_min'), min)} / {_fmt(s('seq_ratio_max'), max)}",
        fired,
        f"{_fmt(token, statistics.fmean, 4)} (max {_fmt(token, max, 4)})" if token else "-",
        _fmt(s("tepo_kl_mask_frac"), statistics.fmean),
        f"{_fmt(s('tepo_kl_mask'), statistics.fmean, 4)} / {_fmt(s('tepo_kl_mask'), max, 4)}",
        "-" if truncated is None else f"{truncated:.2f}",
        "-" if before is None or after is None else f"{before:.3f} -> {after:.3f}",
        "-" if collapse is None else ("yes" if collapse else "no"),
    ]


def mechanism_rows(root: Path) -> list[list[str]]:
    from tepo.compare.record import discover_runs, run_state

    out = []
    for setting in sorted(p for p in root.iterdir() if p.is_dir()):
        for method, seeds in discover_runs(setting).items():
            for seed, run_dir in sorted(seeds.items()):
                if run_state(run_dir) == "finished":
                    name = method if len(seeds) == 1 else f"{method} seed {seed}"
                    out.append(run_row(setting.name, name, run_dir))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the pilot's directory of `tepo compare` settings")
    args = parser.parse_args(argv)
    if not args.directory.is_dir():
        print(f"{args.directory}: not a directory", file=sys.stderr)
        return 2
    from tepo.metrics.tables import format_table

    rows = mechanism_rows(args.directory)
    if not rows:
        print(f"{args.directory}: no finished run yet", file=sys.stderr)
        return 2
    print(format_table(list(COLUMNS), rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
