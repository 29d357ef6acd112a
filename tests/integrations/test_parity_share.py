"""The parity guard's arithmetic (tepo.rollout.parity), without an engine: the update share on hand-checkable
vectors, the guard's decisions on scripted readings, and the weights the trainer scores the probe with (those the
engine was sent, rounded to its dtype, LoRA merged) put back bit for bit."""

from __future__ import annotations

import math

import pytest
import torch

from helpers import tiny_llama
from tepo.rollout.parity import ParityError, ParityGuard, engine_weights, update_share


def test_update_share_closed_form():
    before_e, before_c = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 1.0])
    now_c = torch.tensor([2.0, 3.0, 1.0])  # dc = (1, 2, 0): dc.dc = 5, rms = sqrt(5/3)
    current = update_share(before_e, before_c, torch.tensor([1.0, 2.0, 0.0]), now_c)
    assert current == pytest.approx((1.0, math.sqrt(5 / 3), 0.0))
    stale = update_share(before_e, before_c, before_e.clone(), now_c)  # de = 0
    assert stale == pytest.approx((0.0, math.sqrt(5 / 3), math.sqrt(5 / 3)))
    half = update_share(before_e, before_c, torch.tensor([0.5, 1.0, 0.0]), now_c)
    assert half[0] == pytest.approx(0.5)
    # de = (1, 0, 3): de.dc = 1, share 1/5; residual rms of (0, -2, 3) = sqrt(13/3)
    other = update_share(before_e, before_c, torch.tensor([1.0, 0.0, 3.0]), now_c)
    assert other == pytest.approx((0.2, math.sqrt(5 / 3), math.sqrt(13 / 3)))
    assert update_share(before_e, before_c, before_e, before_c)[0] is None  # no move: no share


class _ScriptedGuard(ParityGuard):
    """ParityGuard.check's decisions on given (engine, trainer) log-prob vectors instead of scored ones."""

    def __init__(self, readings, **kw):
        super().__init__(0.5, **kw)
        self.readings = iter(readings)
        self.probe = object()  # any probe: both scorers are scripted below

    def check(self, rollout=None):
        import tepo.rollout.parity as parity

        engine, trainer = next(self.readings)
        real = parity.engine_probe_logprobs, parity.trainer_probe_logprobs
        parity.engine_probe_logprobs = lambda *_: torch.tensor(engine, dtype=torch.float64)
        parity.trainer_probe_logprobs = lambda *_: torch.tensor(trainer, dtype=torch.float64)
        try:
            return super().check(type("R", (), {"model": None, "tokenizer": None})())
        finally:
            parity.engine_probe_logprobs, parity.trainer_probe_logprobs = real


def test_guard_stops_an_engine_that_did_not_follow_the_update_and_counts_undecided_checks():
    start = ([-1.0, -2.0], [-1.01, -2.02])
    moved = ([-1.2, -1.8], [-1.21, -1.82])  # engine and trainer both moved by (-0.2, +0.2)
    # 4th: the trainer moved by (-0.29, +0.32), the engine by (+0.01, -0.01): share = -0.0061 / 0.1865
    off = ([-1.19, -1.81], [-1.5, -1.5])
    guard = _ScriptedGuard([start, moved, moved, off], min_shift=0.05)
    assert guard.check().decided is False  # first check: no previous reading
    reading = guard.check()
    assert reading.decided and reading.share == pytest.approx(1.0)
    # Nothing moved since (bit-identical weights): undecided, counted, not stopped.
    assert guard.check().decided is False and guard.undecided == 1
    # The trainer moved again, the engine only a little, the other way: share < 0.5 -> stop, saying how far.
    with pytest.raises(ParityError, match=r"followed -0\.03 of that move"):
        guard.check()
    assert guard.last.share == pytest.approx(-0.0061 / 0.1865) and not guard.last.frozen


def test_guard_stops_a_frozen_engine_however_small_the_update():
    """Bit-identical engine scores while the sent weights changed: stale, even far below the noise floor."""
    start = ([-1.0, -2.0], [-1.0, -2.0])
    tiny = ([-1.0, -2.0], [-1.001, -1.999])  # trainer moved 0.001 rms, engine not at all
    guard = _ScriptedGuard([start, tiny], min_shift=0.003)
    guard.check()
    with pytest.raises(ParityError, match="bit-identical"):
        guard.check()
    assert guard.last.frozen and not guard.last.decided


def test_guard_below_the_noise_floor_is_undecided_not_stopped():
    start = ([-1.0, -2.0], [-1.0, -2.0])
    noisy = ([-0.999, -2.0], [-1.001, -1.999])  # trainer moved 0.001 rms, engine by noise, not along it
    guard = _ScriptedGuard([start, noisy], min_shift=0.003)
    guard.check()
    reading = guard.check()
    assert reading.share < 0.5 and not reading.decided and not reading.frozen and guard.undecided == 1


def test_guard_stops_a_gross_gap_at_the_first_check():
    guard = _ScriptedGuard([([-1.0, -2.0], [-3.0, -4.0])])
    with pytest.raises(ParityError, match=r"differ from the trainer.s by 2\.0000"):
        guard.check()


@pytest.mark.parametrize("lora", [False, True])
def test_engine_weights_are_the_sent_weights_rounded_and_are_put_back(lora):
    from tepo.config import LoraConfig
    from tepo.lora import apply_lora, merged_state_dict

    model = tiny_llama(tie=True)
    if lora:
        model = apply_lora(model, LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # B != 0: the merged weights differ from the base ones
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    originals = {n: (p.data_ptr(), p.data.clone(), p._version) for n, p in model.named_parameters()}
    sent = {n: t.to(torch.bfloat16).float() for n, t in merged_state_dict(model).items()}
    ids = torch.tensor([[3, 5, 7, 9, 11]])

    # The reference: a plain model loaded with the sent (merged, bf16-rounded) weights.
    plain = tiny_llama(tie=True)
    plain.load_state_dict(sent, strict=False)
    plain.tie_weights()
    expected = plain(input_ids=ids).logits
    with engine_weights(model, torch.bfloat16):
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not torch.equal(model(input_ids=ids).logits, got)  # outside, the float32 (unmerged) weights again
    for name, p in model.named_parameters():
        storage, values, version = originals[name]
        assert p.data_ptr() == storage and torch.equal(p.data, values) and p._version == version, name


def test_guard_state_survives_a_checkpoint_and_catches_a_frozen_engine_at_the_first_check_after(tmp_path):
    """A resumed run's guard keeps the probe and the last scores: its first check is a full one, not gap-only."""
    from tepo.rollout.base import RolloutBatch
    from tepo.rollout.parity import Probe

    start = ([-1.0, -2.0], [-1.0, -2.0])
    guard = _ScriptedGuard([start])
    guard.probe = Probe(
        RolloutBatch(
            input_ids=torch.tensor([[0, 5, 6, 7], [4, 5, 6, 0]]),
            attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]]),
            response_mask=torch.tensor([[1.0, 1.0], [1.0, 0.0]]),
            response_len=2,
            prompt_index=torch.tensor([0, 1]),
            texts=["a", "b"],
            truncated=torch.tensor([False, False]),
            gen_seconds=1.0,
            num_generated_tokens=3,
        )
    )
    guard.check()
    torch.save(guard.state_dict(), tmp_path / "state.pt")
    state = torch.load(tmp_path / "state.pt", weights_only=True)  # as tepo.checkpoint loads it

    # The sent weights moved, the engine's scores did not: stale, caught at the first check after resuming.
    resumed = _ScriptedGuard([([-1.0, -2.0], [-1.1, -1.9])])
    resumed.load_state_dict(state)
    assert resumed.checks == 1 and resumed.probe.sequences == guard.probe.sequences
    assert resumed.probe.starts == [1, 2] and resumed.probe.sequences == [[5, 6, 7], [4, 5, 6]]
    with pytest.raises(ParityError, match="bit-identical"):
        resumed.check()
    # Without the state (a checkpoint from before 2026-12-04) the same reading passes: gap-only.
    fresh = _ScriptedGuard([([-1.0, -2.0], [-1.1, -1.9])])
    assert fresh.check().frozen is False


def test_each_check_reaches_one_metrics_row_and_a_restored_guard_has_logged_its_checks():
    """The step asks the guard for the metrics of checks not yet in a row (the trainer keeps no counter)."""
    start = ([-1.0, -2.0], [-1.01, -2.02])
    moved = ([-1.2, -1.8], [-1.21, -1.82])
    guard = _ScriptedGuard([start, moved, moved], min_shift=0.05)
    assert guard.unlogged_metrics() is None  # no check yet
    guard.check()
    first = guard.unlogged_metrics()
    assert first is not None and first["parity_undecided_total"] == 0
    assert guard.unlogged_metrics() is None  # the same check is not logged twice
    guard.check()
    assert guard.unlogged_metrics()["parity_share"] == pytest.approx(1.0)
    guard.check()  # nothing moved: undecided
    guard.probe = None  # the scripted guard has no real probe to save
    state = guard.state_dict()
    restored = _ScriptedGuard([], min_shift=0.05)
    restored.load_state_dict(state)
    assert restored.checks == 3 and restored.unlogged_metrics() is None  # in the resumed run's kept rows
