"""Answer classes for majority vote (cons@k): which sampled answers of a problem are the same answer.

Two answers are the same vote when math-verify judges them equal, as it judges an answer against the gold one
(``RewardPool`` with ``answer_format="raw"``: the later answer is verified against the earlier as gold), so
``\\frac{1}{2}`` and ``0.5`` vote together. Classes of one problem's ``n`` samples (``votes[i]``, an int, or None):

- every sample judged correct is in class 0 (they all equal the gold answer);
- the other samples with an extracted answer are grouped by the transitive closure of the pairwise verdicts over
  their distinct answer strings (one pool batch for all pairs of all problems; a timeout or error counts as "not
  equal"), numbered 1, 2, ... in order of first appearance;
- a sample without an answer does not vote (None).

Samples judged ``timeout``/``error`` are not correct, so they vote with the wrong answers even when their string
equals a correct one. `tepo.passk.cons_at_k` turns the classes into cons@k.
"""

from __future__ import annotations

from collections.abc import Sequence


def answer_votes(extracted: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], pool) -> list:
    """``votes[p][i]`` for problem ``p``'s samples (see the module doc): 0 correct, 1.. wrong classes, None none."""
    distinct: list[list[str]] = []
    pairs: list[tuple[int, int, int]] = []  # (problem, i, j): answer j verified against answer i as gold
    for answers, oks in zip(extracted, correct, strict=True):
        seen: list[str] = []
        for answer, ok in zip(answers, oks, strict=True):
            if answer is not None and not ok and answer not in seen:
                seen.append(answer)
        pairs.extend((len(distinct), i, j) for j in range(len(seen)) for i in range(j))
        distinct.append(seen)
    same = set()
    if pairs:
        verdicts = pool.score(
            [distinct[p][j] for p, _, j in pairs], [distinct[p][i] for p, i, _ in pairs], answer_format="raw"
        )
        same = {pair for pair, v in zip(pairs, verdicts) if v.status == "correct"}
    out = []
    for p, (answers, oks) in enumerate(zip(extracted, correct)):
        parent = list(range(len(distinct[p])))
        for j in range(len(distinct[p])):
            for i in range(j):
                if (p, i, j) in same:
                    a, b = _root(parent, i), _root(parent, j)
                    parent[max(a, b)] = min(a, b)
        number: dict[int, int] = {}
        votes: list[int | None] = []
        for answer, ok in zip(answers, oks):
            if ok:
                votes.append(0)
            elif answer is None:
                votes.append(None)
            else:
                votes.append(number.setdefault(_root(parent, distinct[p].index(answer)), len(number) + 1))
        out.append(votes)
    return out


def _root(parent: list[int], a: int) -> int:
    while parent[a] != a:
        a = parent[a]
    return a


def record_votes(record: dict) -> tuple[list, list[bool]]:
    """``(votes, correct)`` of one ``samples.jsonl`` record: its stored ``vote`` fields, or, in records written
    before votes were stored, classes by exact extracted string (correct samples in one class)."""
    responses = record["responses"]
    correct = [r["status"] == "correct" for r in responses]
    if all("vote" in r for r in responses):
        return [r["vote"] for r in responses], correct
    return [
        0 if ok else (None if r.get("extracted") is None else "=" + r["extracted"])
        for r, ok in zip(responses, correct)
    ], correct
