"""Benchmark metrics from per-problem sample records (the lines of ``samples.jsonl``).

Everything ``results.json`` reports is computed here from the records alone, so a reader can recompute it from
``samples.jsonl``. For ``P`` problems with ``n`` responses each, ``c_j`` of them correct:

- greedy accuracy (greedy setting, ``n = 1``): ``(1/P) sum_j c_j``;
- avg@n (sampled setting): ``(1/P) sum_j c_j / n`` (TEPO 2510.09369 Sec. 4.1, "@32");
- pass@k for each requested ``k <= n``: ``(1/P) sum_j [1 - C(n - c_j, k) / C(n, k)]`` (Chen et al. 2107.03374
  Eq. 1, :mod:`tepo.passk`), all from the same ``n`` samples;
- cons@k (majority vote) for each requested ``k <= n`` and ``k = n``: the share of ``k``-subsets of a problem's
  samples whose most-voted answer is correct, averaged exactly over all ``C(n, k)`` subsets and over problems
  (:func:`tepo.passk.cons_at_k`; a tie of ``t`` answers scores ``1/t``; answers are the same vote when
  math-verify judges them equal, :mod:`tepo.evaluate.voting`, stored per response as ``vote``);
- boxed rate: share of all responses with a final, complete, non-empty ``\\boxed{}`` in the verified tail
  (ERPO 2603.28204 Table 1 "Fmt"), whatever the answer format used for judging;
- per reward function of the user's own (``tepo eval --reward-function``), under ``rewards``: its ``mean``
  over the responses it scored, and how many of them scored 0 for an ``error`` or a ``timeout``;
- mean response length in tokens (EOS included) and the share of responses truncated at ``max_new_tokens``.

A response counts as correct only with verdict status ``"correct"``; ``timeout`` and ``error`` verdicts count as
wrong and are reported in ``statuses``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tepo.evaluate.voting import record_votes
from tepo.passk import avg_at_k, mean_cons_at_k, mean_pass_at_k
from tepo.rewards import DEFAULT_MAX_CHARS, extract_final_answer


def has_final_box(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> bool:
    """Whether ``text`` ends its reasoning with a complete, non-empty ``\\boxed{...}`` (in its verified tail)."""
    return extract_final_answer(text, "boxed", max_chars=max_chars) is not None


def benchmark_metrics(records: Sequence[dict], *, greedy: bool, pass_k: Sequence[int] = ()) -> dict:
    """Metrics of one benchmark from its ``samples.jsonl`` records (see the module docstring).

    Every record must hold the same number of responses ``n``; ``pass_k`` values above ``n`` are left out.
    """
    if not records:
        return {"num_problems": 0, "accuracy": None}
    sizes = {len(r["responses"]) for r in records}
    if len(sizes) != 1:
        raise ValueError(f"records hold different numbers of responses per problem: {sorted(sizes)}")
    (n,) = sizes
    correct = [sum(resp["status"] == "correct" for resp in r["responses"]) for r in records]
    responses = [resp for r in records for resp in r["responses"]]
    out: dict = {"num_problems": len(records), "samples_per_problem": n}
    headline = avg_at_k(n, correct)
    out["accuracy"] = headline
    if greedy:
        out["greedy_accuracy"] = headline
    else:
        out[f"avg@{n}"] = headline
        out["pass@k"] = {str(k): mean_pass_at_k(n, correct, k) for k in sorted(set(pass_k)) if k <= n}
        votes = [record_votes(r) for r in records]
        out["cons@k"] = {str(k): mean_cons_at_k(votes, k) for k in sorted({*pass_k, n}) if k <= n}
    out["boxed_rate"] = sum(bool(resp["boxed"]) for resp in responses) / len(responses)
    out["mean_response_tokens"] = sum(int(resp["tokens"]) for resp in responses) / len(responses)
    out["truncated_rate"] = sum(bool(resp["truncated"]) for resp in responses) / len(responses)
    out["statuses"] = dict(Counter(resp["status"] for resp in responses))
    if any("rewards" in resp for resp in responses):
        out["rewards"] = user_reward_metrics(responses)
    return out


def user_reward_metrics(responses: Sequence[dict]) -> dict:
    """Per label of the responses' ``rewards`` (``[value, status, detail]``; files written before the detail
    was recorded hold ``[value, status]``): mean value, errors, timeouts, count."""
    by_label: dict[str, list] = {}
    for resp in responses:
        for label, (value, status, *_) in resp.get("rewards", {}).items():
            by_label.setdefault(label, []).append((float(value), status))
    return {
        label: {
            "mean": sum(v for v, _ in pairs) / len(pairs),
            "errors": sum(s == "error" for _, s in pairs),
            "timeouts": sum(s == "timeout" for _, s in pairs),
            "responses": len(pairs),
        }
        for label, pairs in by_label.items()
    }
