"""The token sample file of a step decodes only the rows it keeps (issue #35, item 5: it decoded every row of the
batch one id at a time, then kept the first ``log.samples_rows``)."""

from __future__ import annotations

import json

import torch

from tepo.metrics.tokens import record_rollout_tokens, record_step_samples, response_token_strings


class CountingTokenizer:
    def __init__(self):
        self.calls = 0

    def decode(self, ids):
        self.calls += 1
        return f"<{ids[0]}>"


def _batch(rows=32, width=10):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(2, 50, (rows, width), generator=gen)
    mask = torch.ones(rows, width)
    mask[:, 7:] = 0
    return (
        ids,
        torch.rand(rows, width, generator=gen),
        torch.randn(rows, generator=gen),
        mask,
        torch.rand(rows),
    )


def test_only_the_kept_rows_are_decoded_and_the_file_is_unchanged(tmp_path):
    ids, entropy, adv, mask, rewards = _batch()
    tok = CountingTokenizer()
    path = record_step_samples(tmp_path / "a", 3, tok, ids, entropy, adv, mask, rewards, max_rows=4)
    assert tok.calls == 4 * 7  # 4 rows x 7 response tokens, not 32 rows
    # the same file as decoding everything and keeping the first rows (the former way)
    whole = CountingTokenizer()
    before = record_rollout_tokens(
        tmp_path / "b", 3, response_token_strings(whole, ids, mask), entropy, adv, mask, rewards, max_rows=4
    )
    assert whole.calls == 32 * 7
    assert json.loads(path.read_text()) == json.loads(before.read_text())


def test_no_limit_keeps_every_row(tmp_path):
    ids, entropy, adv, mask, rewards = _batch(rows=3)
    tok = CountingTokenizer()
    path = record_step_samples(tmp_path, 1, tok, ids, entropy, adv, mask, rewards, max_rows=None)
    assert tok.calls == 3 * 7 and len(json.loads(path.read_text())["samples"]) == 3
