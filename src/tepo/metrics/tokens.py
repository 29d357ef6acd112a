"""Per-token rollout records (``samples/step_XXXXXX.json``), written by the trainer for the token view in
:mod:`tepo.report.tokens`: each response token with its entropy and its advantage.

File format (``format: 1``)::

    {"format": 1, "step": 12,
     "samples": [{"row": 0, "group": 0, "reward": 1.0,
                  "tokens": ["The", " answer", ...], "entropy": [2.31, 0.12, ...], "advantage": [0.87, ...]}]}

Only tokens under the response mask are kept (the first EOS included, padding dropped). A sequence-level
advantage (``[N]``) is repeated over the sequence's tokens; a token-level one (``[N, T]``) is kept per token.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tepo.files import atomic_write_text

SAMPLES_DIR = "samples"
FORMAT = 1


def _rows(value, name: str) -> list:
    """A tensor / array / nested list as nested Python lists."""
    if hasattr(value, "detach"):
        value = value.detach().float().cpu().tolist()
    elif hasattr(value, "tolist"):
        value = value.tolist()
    if not isinstance(value, list | tuple):
        raise ValueError(
            f"record_rollout_tokens: {name} must be a tensor or a list, got {type(value).__name__}"
        )
    return list(value)


def _finite(x) -> float | None:
    x = float(x)
    return round(x, 5) if math.isfinite(x) else None


def record_rollout_tokens(
    run_dir,
    step: int,
    tokens: list[list[str]],
    entropy,
    advantages,
    mask,
    rewards,
    *,
    max_rows: int | None = None,
) -> Path:
    """Write ``<run_dir>/samples/step_XXXXXX.json`` for one training step.

    ``tokens``: per response row, the decoded response tokens (``len >= `` the row's masked length; see
    :func:`response_token_strings`); ``entropy`` ``[N, T]``; ``advantages`` ``[N]`` or ``[N, T]``; ``mask``
    ``[N, T]`` (1 on response tokens); ``rewards`` ``[N]``. ``max_rows`` keeps the first rows only (whole groups
    first, as rows are grouped). The file is written to a temporary name and renamed, so it is whole or absent.
    """
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"record_rollout_tokens: step must be an int >= 0, got {step!r}")
    ent, adv, msk, rew = (
        _rows(entropy, "entropy"),
        _rows(advantages, "advantages"),
        _rows(mask, "mask"),
        _rows(rewards, "rewards"),
    )
    n = len(msk)
    for name, value in (("tokens", tokens), ("entropy", ent), ("advantages", adv), ("rewards", rew)):
        if len(value) != n:
            raise ValueError(
                f"record_rollout_tokens: {name} has {len(value)} rows; mask has {n} (one per response)"
            )
    samples = []
    for i in range(n if max_rows is None else min(n, max_rows)):
        keep = [t for t, m in enumerate(msk[i]) if m]
        row_tokens = list(tokens[i])
        if len(row_tokens) < len(keep) or len(ent[i]) < len(msk[i]):
            raise ValueError(
                f"record_rollout_tokens: row {i} has {len(keep)} masked tokens but {len(row_tokens)} token strings "
                f"and {len(ent[i])} entropy values (expected at least as many as the mask's width {len(msk[i])})"
            )
        token_adv = adv[i] if isinstance(adv[i], list) else [adv[i]] * len(msk[i])
        samples.append(
            {
                "row": i,
                "reward": _finite(rew[i]),
                "tokens": [str(row_tokens[t]) for t in keep],
                "entropy": [_finite(ent[i][t]) for t in keep],
                "advantage": [_finite(token_adv[t]) for t in keep],
            }
        )
    out_dir = Path(run_dir) / SAMPLES_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"step_{step:06d}.json"
    atomic_write_text(path, json.dumps({"format": FORMAT, "step": step, "samples": samples}))
    return path


def record_step_samples(
    run_dir, step: int, tokenizer, response_ids, entropy, advantages, mask, rewards, *, max_rows: int | None
) -> Path:
    """:func:`record_rollout_tokens` for a training step, decoding only the rows the file keeps.

    Decoding is one tokenizer call per token; the file keeps the first ``max_rows`` rows, so every tensor is sliced
    to those rows first (decoding and copying the whole batch to the host only to drop most of it cost a GPU run
    128 rows x 1k tokens of single-id decodes per recorded step).
    """
    keep = slice(None) if max_rows is None else slice(0, max_rows)
    return record_rollout_tokens(
        run_dir,
        step,
        response_token_strings(tokenizer, response_ids[keep], mask[keep]),
        entropy[keep],
        advantages[keep],
        mask[keep],
        rewards[keep],
        max_rows=max_rows,
    )


def response_token_strings(tokenizer, response_ids, mask) -> list[list[str]]:
    """Each response token decoded on its own (masked positions as ``""``), for :func:`record_rollout_tokens`.

    Decoding one id at a time shows token boundaries; a character split across tokens shows as U+FFFD.
    """
    ids, msk = _rows(response_ids, "response_ids"), _rows(mask, "mask")
    return [
        [tokenizer.decode([int(t)]) if m else "" for t, m in zip(row, mrow)] for row, mrow in zip(ids, msk)
    ]
