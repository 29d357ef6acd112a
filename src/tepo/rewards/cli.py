"""``tepo reward check [LABEL=]FILE:NAME --data ROWS.jsonl [--responses RESPONSES.jsonl]``: a reward function of
your own scored on data rows with no model, in the same sandboxed worker pool training uses (so what passes
here passes there): each row's reward, or the failure and its reason, then a summary per function.

Each row is scored against one response: the matching line of ``--responses`` (a JSON string, or an object with
a ``response`` or ``text`` field), else the row's reference answer itself (what a perfect response would say).
The function gets what training gives it (``ground_truth`` the answer field, ``data_source``, ``extra_info``
the row's other fields; docs/rewards.md). Exit status: 0 when every call scored, 1 when some
failed, 2 for a bad file or function.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAX_SHOWN = 200  # rows printed one per line; the summary counts them all


def register(subparsers) -> None:
    reward = subparsers.add_parser(
        "reward", help="check a reward function of your own on data rows, no model"
    )
    commands = reward.add_subparsers(dest="reward_command", required=True)
    p = commands.add_parser(
        "check",
        help="score data rows with your reward function(s) in the sandboxed workers, no model",
        description=__doc__.replace("``", "`"),
    )
    p.add_argument(
        "functions", nargs="+", metavar="[LABEL=]FILE:NAME", help="e.g. my_reward.py:compute_score"
    )
    p.add_argument("--data", required=True, help="JSONL/Parquet file of rows (problem and answer fields)")
    p.add_argument("--responses", help="JSONL, one response per data row (default: each row's answer)")
    p.add_argument("--problem-field", default="problem", help="field of the problem text (default: problem)")
    p.add_argument("--answer-field", default="answer", help="field of the reference answer (default: answer)")
    p.add_argument("--limit", type=int, default=None, help="the first N rows only")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per call, as reward.timeout_s (5)")
    p.set_defaults(func=run_check)


def read_responses(path: Path, count: int) -> list[str]:
    """One response per line of ``path``: a JSON string or an object with ``response`` or ``text``; DataError
    naming the file and line otherwise, or when there are fewer lines than rows."""
    from tepo.data import DataError

    responses = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: cannot be read ({err})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as err:
            raise DataError(f"{path}:{number}: not JSON ({err.args[0]})") from None
        if isinstance(value, dict):
            value = value.get("response", value.get("text"))
        if not isinstance(value, str):
            raise DataError(f"{path}:{number}: expected a JSON string or an object with a 'response' field")
        responses.append(value)
    if len(responses) < count:
        raise DataError(f"{path}: {len(responses)} responses for {count} data rows; expected one per row")
    return responses[:count]


def run_check(args) -> int:
    from tepo.data import load_problems
    from tepo.rewards import RewardFailures, RewardPool, reward_functions_from_specs, score_responses

    try:
        functions = reward_functions_from_specs(args.functions)
    except ValueError as err:
        print(
            f"tepo reward check: error: {str(err).replace('--reward-function', 'function')}", file=sys.stderr
        )
        return 2
    problems = load_problems(
        args.data, problem_field=args.problem_field, answer_field=args.answer_field, limit=args.limit
    )
    if args.responses:
        texts = read_responses(Path(args.responses), len(problems))
    else:
        texts = [p.answer for p in problems]
    labels = [f.label for f in functions]
    with RewardPool(
        num_workers=2,
        timeout_s=args.timeout,
        functions=[f.for_pool() for f in functions],
        failures=RewardFailures(None, stop_share=None, log=lambda _: None),
    ) as pool:
        scored = score_responses(pool, labels, texts, problems, 1)
    print(check_report(labels, problems, scored, source=args.responses or "each row's answer"))
    return 1 if any(scored.errors.values()) or any(scored.timeouts.values()) else 0


def check_report(labels, problems, scored, *, source: str) -> str:
    """One line per row (its id, then each function's reward or failure), then one summary line per function."""
    lines = [f"{len(problems)} rows; responses: {source}"]
    for i, problem in enumerate(problems[:MAX_SHOWN]):
        cells = []
        for label, column in zip(labels, scored.columns):
            status = scored.statuses[label][i]
            value = f"{column[i]:.4g}" if status == "scored" else f"{status}: {scored.details[label][i]}"
            cells.append(f"{label} {value}" if len(labels) > 1 else value)
        lines.append(f"row {i + 1} ({problem.id}): " + "; ".join(cells))
    if len(problems) > MAX_SHOWN:
        lines.append(f"... {len(problems) - MAX_SHOWN} more rows (in the summary)")
    for label, column in zip(labels, scored.columns):
        statuses = scored.statuses[label]
        ok = [v for v, s in zip(column, statuses) if s == "scored"]
        mean = f", mean {sum(ok) / len(ok):.4g}" if ok else ""
        errors, timeouts = statuses.count("error"), statuses.count("timeout")
        lines.append(
            f"{label}: {len(ok)} of {len(statuses)} scored{mean}; {errors} errors, {timeouts} timeouts"
        )
    return "\n".join(lines)
