"""The token view of the per-token rollout records (written by :mod:`tepo.metrics.tokens`): each response token
coloured by its entropy and by its advantage, the view of ERPO's Figure 1 (2603.28204): high-entropy "decision
pivots" stand out, and the advantage colour says whether the update pushed that token's probability up (positive)
or down. This module reads and checks the records, picks samples to show and defines the colours.
"""

from __future__ import annotations

import json
from pathlib import Path

from tepo.metrics.tokens import FORMAT, SAMPLES_DIR

__all__ = [
    "FORMAT",
    "SAMPLES_DIR",
    "advantage_colour",
    "colour_scales",
    "entropy_colour",
    "list_sample_files",
    "load_samples",
    "pick_samples",
    "visible_token",
]


def list_sample_files(run_dir) -> list[Path]:
    return sorted((Path(run_dir) / SAMPLES_DIR).glob("step_*.json"))


def load_samples(path) -> dict:
    """A samples file, checked: one clear error naming the file and what is wrong."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not a readable samples file ({err})") from None
    if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
        raise ValueError(f"{path}: expected an object with a 'samples' list (format {FORMAT})")
    for i, s in enumerate(data["samples"]):
        if not isinstance(s, dict) or not all(
            isinstance(s.get(k), list) for k in ("tokens", "entropy", "advantage")
        ):
            raise ValueError(f"{path}: sample {i} needs 'tokens', 'entropy' and 'advantage' lists")
        if not len(s["tokens"]) == len(s["entropy"]) == len(s["advantage"]):
            raise ValueError(f"{path}: sample {i}: tokens, entropy and advantage differ in length")
    return data


def pick_samples(data: dict, count: int = 4) -> list[dict]:
    """A few samples worth looking at: alternate the best- and worst-rewarded, ties by row order."""
    samples = list(data["samples"])
    ranked = sorted(samples, key=lambda s: (-(s.get("reward") or 0.0), s.get("row", 0)))
    picked, lo, hi = [], 0, len(ranked) - 1
    while len(picked) < min(count, len(ranked)):
        picked.append(ranked[lo])
        lo += 1
        if len(picked) < count and lo <= hi:
            picked.append(ranked[hi])
            hi -= 1
    return sorted(picked, key=lambda s: s.get("row", 0))


# --------------------------------------------------------------------------------------------------------------
# Colours (shared by the HTML view and the PNG view)
# --------------------------------------------------------------------------------------------------------------


def entropy_colour(value: float | None, high: float) -> tuple[int, int, int]:
    """White (0 nats) to red (``high`` nats and above)."""
    if value is None or high <= 0:
        return (235, 235, 235)
    t = max(0.0, min(1.0, value / high))
    return (255, round(255 - 190 * t), round(255 - 200 * t))


def advantage_colour(value: float | None, scale: float) -> tuple[int, int, int]:
    """Diverging: blue (negative: pushed down) - white (0) - green (positive: pushed up), saturating at ``scale``."""
    if value is None or scale <= 0:
        return (235, 235, 235)
    t = max(-1.0, min(1.0, value / scale))
    if t >= 0:
        return (round(255 - 180 * t), round(255 - 55 * t), round(255 - 180 * t))
    t = -t
    return (round(255 - 190 * t), round(255 - 130 * t), 255)


def colour_scales(samples: list[dict]) -> tuple[float, float]:
    """(entropy high end, advantage scale): the 95th percentile of |value| over the shown tokens, at least 1e-6."""

    def p95(values):
        vals = sorted(abs(v) for v in values if v is not None)
        return max(vals[min(len(vals) - 1, int(0.95 * len(vals)))], 1e-6) if vals else 1.0

    ent = [v for s in samples for v in s["entropy"]]
    adv = [v for s in samples for v in s["advantage"]]
    return p95(ent), p95(adv)


def visible_token(text: str) -> str:
    """Whitespace made visible (newline as a return arrow, tab as an arrow), other control characters dropped."""
    out = text.replace("\n", "\u21b5").replace("\t", "\u2192")
    return "".join(ch for ch in out if ch.isprintable() or ch == " ")
