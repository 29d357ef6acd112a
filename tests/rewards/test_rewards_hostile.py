"""Hostile completions through the real reward pool: bounded time, reward 0 (or the right verdict),
no code execution, bounded parent memory, pool alive and fast afterwards."""

from __future__ import annotations

import gc
import json
import time

import pytest

from hostile_corpus import default_subset, hostile_corpus
from tepo.rewards import RewardPool

TIMEOUT_S = 1.0
# A result may arrive a little after the deadline: the parent notices the overrun on its next wake-up and the
# kill/reap takes a few milliseconds; the machine is shared.
SLACK_S = 0.5


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def _run_corpus(cases, marker_dir):
    with RewardPool(num_workers=2, timeout_s=TIMEOUT_S) as pool:
        warm = pool.score(["\\boxed{1}"] * 20, ["1"] * 20)
        assert all(r.status == "correct" for r in warm)
        gc.collect()
        rss_before = _rss_mb()
        t0 = time.perf_counter()
        results = pool.score([c.response for c in cases], [c.gold for c in cases])
        wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        after = pool.score([f"\\boxed{{{i}}}" for i in range(60)], [str(i) for i in range(60)])
        after_rate = 60 / (time.perf_counter() - t1)
        stats = pool.stats
        gc.collect()
        rss_after = _rss_mb()

    failures = []
    for case, r in zip(cases, results):
        if r.seconds > TIMEOUT_S + SLACK_S:
            failures.append(f"{case.name}: took {r.seconds:.2f} s")
        if r.reward != (1.0 if r.status == "correct" else 0.0):
            failures.append(f"{case.name}: reward {r.reward} with status {r.status}")
        if r.reward and not case.may_be_correct:
            failures.append(f"{case.name}: scored correct (extracted {r.extracted!r:.80})")
        if case.must_be_correct and r.status != "correct":
            failures.append(f"{case.name}: a right answer before padding scored {r.status}")
    assert not failures, "\n".join(failures)
    assert not list(marker_dir.iterdir()), "a completion executed code"
    assert all(r.status == "correct" for r in after), "pool broken after the hostile corpus"
    # The parent holds only the inputs and small results: a leak of worker output or of megabyte strings would
    # show here. The corpus itself is allocated before the first measurement.
    assert rss_after - rss_before < 64, (rss_before, rss_after)
    summary = {
        "cases": len(cases),
        "wall_s": round(wall, 2),
        "items_per_s_after": round(after_rate, 1),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_after": round(rss_after, 1),
        "statuses": {s: sum(r.status == s for r in results) for s in sorted({r.status for r in results})},
        **stats.as_dict(),
    }
    print("hostile corpus:", json.dumps(summary))  # counters in the test log (pytest -s)
    return stats, wall


@pytest.fixture
def marker_dir(tmp_path):
    d = tmp_path / "markers"
    d.mkdir()
    return d


def test_corpus_is_large_and_varied(marker_dir):
    corpus = hostile_corpus(marker_dir)
    assert len(corpus) >= 200
    assert sum(c.injection for c in corpus) >= 50
    assert max(len(c.response) for c in corpus) >= 1 << 20
    assert any(
        "\udc80" <= ch <= "\udcff" for c in corpus for ch in c.response[:5000]
    )  # surrogate-escaped bytes
    assert any("\ufffd" in c.response for c in corpus)  # bytes decoded with errors="replace"
    assert sum(c.must_be_correct for c in corpus) >= 10  # right answers behind megabytes of padding/markers


def test_hostile_subset(marker_dir):
    cases = default_subset(hostile_corpus(marker_dir))
    assert len(cases) == 34
    stats, wall = _run_corpus(cases, marker_dir)
    assert stats.items == len(cases) + 20 + 60
    assert stats.timeouts >= 1  # the subset includes real verifier hangs (9^9^9^9, (10!)!, ...)
    # Two workers, each hostile item costs at most one timeout (+slack).
    assert wall < len(cases) * (TIMEOUT_S + SLACK_S) / 2 + 5


@pytest.mark.slow
def test_full_hostile_corpus(marker_dir):
    cases = hostile_corpus(marker_dir)
    stats, wall = _run_corpus(cases, marker_dir)
    assert stats.items == len(cases) + 80
    assert stats.timeouts >= 10
    assert wall < len(cases) * (TIMEOUT_S + SLACK_S) / 2 + 10
