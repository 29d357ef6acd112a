"""``seq_mask`` and ``mis``' kept tokens against verl 0.9.1's real ``rollout_corr_helper.compute_rollout_rejection_mask``
(issue #36 item 1), in ``.venv-verl`` (built once by the session fixture of tests/integrations/conftest.py; slow).

The threshold mapping, written here once: verl's k1 statistic is ``-log rho`` (``rho = pi_old / pi_sampler``,
log-ratio clamped to [-20, 20]), kept when it lies in ``[log lower, log upper]``; tepo's ``seq_mask`` keeps a row
when ``c_low <= exp(mean_t log rho) <= c_high``. So

    tepo (c_low, c_high) = verl (1 / upper, 1 / lower)        (verl_threshold="lower_upper" applies it)

and the same numbers in both keep mirror-image rows. The script feeds the same float64 log-ratios to verl's
function (``rollout_rs="seq_mean_k1"`` and ``"token_k1"``) and to ``rollout_correction_weights`` and asserts:
the kept rows / tokens are equal under the mapping (as numbers and as verl's pasted string, for ``"0.999_1.001"``,
``"0.5_1.5"`` and the single number ``"1.2"``, i.e. ``1/1.2_1.2``); the unmapped numbers keep a different set
(the issue's four rows: tepo [T, T, F, F], verl [F, F, T, T]); both clamp a token's log-ratio at +-20 (a row whose
clamped mean is inside and unclamped mean is outside is kept by both); tepo's default equals verl's
``RolloutCorrectionConfig.decoupled_geo_rs()`` preset.
"""

from __future__ import annotations

import textwrap

import pytest

from verl_runner import SCRIPT_PRELUDE, run_verl_script

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent(
    r"""
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo import rollout_corr_helper as rc
    from tepo.losses import rollout_correction_weights
    from tepo.losses.rollout_correction import MODE_OPTIONS

    gen = torch.Generator().manual_seed(0)
    report = {}

    def verl_keep(log_ratio, mask, option, spec):
        kept, _ = rc.compute_rollout_rejection_mask(log_ratio, mask.to(F64), rollout_rs=option,
                                                    rollout_rs_threshold=spec)
        return kept.bool() & mask

    def tepo_keep(log_ratio, mask, mode, **options):
        old = -torch.rand(log_ratio.shape, generator=gen, dtype=F64) - 0.5
        _, keep, _ = rollout_correction_weights(old, old - log_ratio, mask, mode=mode, **options)
        return keep

    def reciprocal(spec):
        lower, _, upper = spec.partition("_")
        upper = float(upper or lower)
        lower = float(lower) if "_" in spec else 1.0 / upper
        return 1.0 / upper, 1.0 / lower

    # 1. the issue's rows: mean log-ratios just inside / outside +-log(1.001), one token each
    rows = torch.tensor([[-0.0010003], [-0.0009998], [0.0009998], [0.0010003]], dtype=F64)
    one = torch.ones_like(rows, dtype=torch.bool)
    verl_rows = verl_keep(rows, one, "seq_mean_k1", "0.999_1.001")[:, 0].tolist()
    same_numbers = tepo_keep(rows, one, "seq_mask", c_low=0.999, c_high=1.001)[:, 0].tolist()
    assert verl_rows == [False, False, True, True], verl_rows
    assert same_numbers == [True, True, False, False], same_numbers
    assert tepo_keep(rows, one, "seq_mask", verl_threshold="0.999_1.001")[:, 0].tolist() == verl_rows
    assert tepo_keep(rows, one, "seq_mask")[:, 0].tolist() == verl_rows  # the default = verl's preset
    report["issue rows"] = {"verl": verl_rows, "tepo same numbers": same_numbers}

    # 2. random rows of varied length, around each threshold
    N, T = 64, 7
    lengths = torch.randint(1, T + 1, (N,), generator=gen)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    for spec, scale in [("0.999_1.001", 2e-3), ("0.5_1.5", 0.6), ("1.2", 0.3)]:
        d = torch.where(mask, scale * torch.randn(N, T, generator=gen, dtype=F64), torch.zeros((), dtype=F64))
        want = verl_keep(d, mask, "seq_mean_k1", spec)
        assert 0 < int(want[:, 0].sum()) < N, (spec, int(want[:, 0].sum()))  # the bounds bite on both sides
        c_low, c_high = reciprocal(spec)
        assert torch.equal(tepo_keep(d, mask, "seq_mask", c_low=c_low, c_high=c_high), want), spec
        assert torch.equal(tepo_keep(d, mask, "seq_mask", verl_threshold=spec), want), spec
        # mis' kept tokens: verl token_k1 with the same string
        want_tok = verl_keep(d, mask, "token_k1", spec)
        assert torch.equal(tepo_keep(d, mask, "mis", verl_threshold=spec), want_tok), spec
        report[f"seq_mean_k1 {spec}: rows kept by verl"] = int(want[:, 0].sum())
        if "_" in spec:  # verl's numbers taken as tepo's c_low / c_high, unmapped
            lower, upper = (float(x) for x in spec.split("_"))
            unmapped = tepo_keep(d, mask, "seq_mask", c_low=lower, c_high=upper)
            report[f"seq_mean_k1 {spec}: rows the unmapped numbers keep differently"] = int(
                (unmapped[:, 0] != want[:, 0]).sum())
    assert report["seq_mean_k1 0.5_1.5: rows the unmapped numbers keep differently"] > 0

    # 3. the +-20 clamp on each token before the mean: [30, -29.99] has mean 0.005 unclamped, 0 clamped
    far = torch.tensor([[30.0, -29.99], [0.0, 0.0]], dtype=F64)
    both = torch.ones_like(far, dtype=torch.bool)
    want = verl_keep(far, both, "seq_mean_k1", "0.999_1.001")
    assert want.all(), want
    assert torch.equal(tepo_keep(far, both, "seq_mask", verl_threshold="0.999_1.001"), want)

    # 4. tepo's default is verl's Geo-RS preset mapped
    preset = RolloutCorrectionConfig.decoupled_geo_rs()
    assert preset.rollout_rs == "seq_mean_k1", preset.rollout_rs
    c_low, c_high = reciprocal(str(preset.rollout_rs_threshold))
    assert (MODE_OPTIONS["seq_mask"]["c_low"], MODE_OPTIONS["seq_mask"]["c_high"]) == (c_low, c_high)
    report["decoupled_geo_rs"] = str(preset.rollout_rs_threshold)
    print(json.dumps(report))
    """
)


def test_seq_mask_and_mis_keep_what_verls_k1_rejection_keeps(verl_python, tmp_path):
    report = run_verl_script(verl_python, tmp_path, SCRIPT_PRELUDE + SCRIPT)
    assert report["issue rows"] == {
        "verl": [False, False, True, True],
        "tepo same numbers": [True, True, False, False],
    }
    assert report["decoupled_geo_rs"] == "0.999_1.001"
