"""tepo report: per-token sample records, figures of the expected size, a self-contained HTML page that renders in a
real headless browser (Debian's chromium) with no console errors."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from tepo.metrics.tokens import record_rollout_tokens, response_token_strings
from tepo.report.plots import (
    METRIC_DPI,
    METRIC_FIGSIZE,
    TOKEN_DPI,
    TOKEN_FIG_WIDTH_IN,
    informative_comparison_curves,
    plot_metric_by_method,
    plot_token_view,
    seed_band,
    token_figure_height,
)
from tepo.report.tokens import load_samples, pick_samples

HOSTILE = "<script>alert('x')</script>"


def _image(path: Path):
    from PIL import Image

    with Image.open(path) as img:
        img.load()
        return img.convert("RGB")


def _distinct_colours(img) -> int:
    return len(img.resize((200, 200)).getcolors(200 * 200))


# --------------------------------------------------------------------------------------------------------------
# Synthetic runs with per-token samples
# --------------------------------------------------------------------------------------------------------------


def _record(run_dir: Path, step: int, token_level: bool = False) -> Path:
    tokens = [
        ["The", " answer", " is", " 1", "2", "<|im_end|>", "", ""],
        ["I", " think", "\n", HOSTILE, "<|im_end|>", "", "", ""],
    ]
    mask = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0]], dtype=torch.float32)
    entropy = torch.tensor(
        [[0.1, 0.2, 0.3, 2.5, 1.0, 0.0, 9.0, 9.0], [3.0, 0.5, 0.1, 1.5, 0.2, 9.0, 9.0, 9.0]]
    )
    adv = torch.tensor([0.7, -0.7])
    if token_level:
        adv = adv[:, None] * torch.linspace(0.5, 1.5, 8)[None, :]
    return record_rollout_tokens(run_dir, step, tokens, entropy, adv, mask, torch.tensor([1.0, 0.0]))


def _make_run(run_dir: Path, *, greedy: float, rewards, entropy0=1.0, samples=True) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "step": i + 1,
            "reward_mean": r,
            "accuracy": r,
            "entropy_mean": entropy0 - 0.05 * i,
            "grad_norm": 0.5 + 0.1 * i,
            "clip_frac_high": 0.01,
            "clip_frac_low": 0.0,
            "approx_kl": 1e-4,
            "response_length_mean": 30 + i,
            "step_seconds": 12.0,
        }
        for i, r in enumerate(rewards)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text("{}\n")
    (run_dir / "summary.json").write_text(
        json.dumps(
            {
                "before": {"eval_greedy_accuracy": 0.2, "eval_sampled_accuracy": 0.05},
                "after": {"eval_greedy_accuracy": greedy, "eval_sampled_accuracy": greedy / 2},
                "reward_last_third": rewards[-1],
            }
        )
    )
    if samples:
        _record(run_dir, 1)
        _record(run_dir, len(rewards), token_level=True)
    return run_dir


@pytest.fixture(scope="module")
def comparison(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("report") / "cmp"
    for seed in range(3):
        _make_run(
            d / "grpo" / f"seed{seed}", greedy=0.2 + 0.2 * seed, rewards=[0.1, 0.2 + 0.05 * seed, 0.3, 0.4]
        )
        _make_run(
            d / "tepo" / f"seed{seed}", greedy=0.5, rewards=[0.1, 0.3, 0.4 + 0.05 * seed, 0.5], entropy0=1.2
        )
    return d


# --------------------------------------------------------------------------------------------------------------
# Token records
# --------------------------------------------------------------------------------------------------------------


def test_record_rollout_tokens_keeps_masked_tokens(tmp_path):
    path = _record(tmp_path, 7)
    assert path == tmp_path / "samples" / "step_000007.json"
    data = load_samples(path)
    assert data["step"] == 7 and data["format"] == 1
    first, second = data["samples"]
    assert first["tokens"] == ["The", " answer", " is", " 1", "2", "<|im_end|>"]  # padding dropped
    assert first["entropy"] == [0.1, 0.2, 0.3, 2.5, 1.0, 0.0]
    assert first["advantage"] == [0.7] * 6 and second["advantage"] == [-0.7] * 5  # [N] repeated over tokens
    assert (first["reward"], second["reward"]) == (1.0, 0.0)
    token_level = load_samples(_record(tmp_path, 8, token_level=True))["samples"][0]["advantage"]
    expected = (0.7 * torch.linspace(0.5, 1.5, 8))[:6].tolist()
    assert token_level == pytest.approx(expected, abs=1e-5)


def test_record_rollout_tokens_rejects_mismatched_shapes(tmp_path):
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="rewards has 1 rows; mask has 2"):
        record_rollout_tokens(tmp_path, 1, [["a"] * 3] * 2, torch.zeros(2, 3), torch.zeros(2), mask, [1.0])
    with pytest.raises(ValueError, match="row 0 has 3 masked tokens but 2 token strings"):
        record_rollout_tokens(
            tmp_path, 1, [["a"] * 2] * 2, torch.zeros(2, 3), torch.zeros(2), mask, [1.0, 0.0]
        )
    with pytest.raises(ValueError, match="step must be an int"):
        record_rollout_tokens(
            tmp_path, -1, [["a"] * 3] * 2, torch.zeros(2, 3), torch.zeros(2), mask, [1.0, 0.0]
        )
    bad = tmp_path / "samples" / "step_000009.json"
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text(json.dumps({"samples": [{"tokens": ["a"], "entropy": [], "advantage": [0.0]}]}))
    with pytest.raises(ValueError, match="differ in length"):
        load_samples(bad)


def test_response_token_strings_decodes_each_token(embedded_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    ids = tokenizer("The answer is 12", add_special_tokens=False)["input_ids"]
    strings = response_token_strings(
        tokenizer, torch.tensor([[*ids, 0]]), torch.tensor([[1] * len(ids) + [0]])
    )
    assert "".join(strings[0]) == "The answer is 12" and strings[0][-1] == ""


def test_pick_samples_alternates_best_and_worst():
    data = {"samples": [{"row": i, "reward": r} for i, r in enumerate([0.0, 1.0, 0.5, 1.0, 0.0])]}
    assert [s["row"] for s in pick_samples(data, 2)] == [1, 4]


# --------------------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------------------


def test_seed_band_hand_checked():
    runs = [[{"step": 1, "x": 1.0}, {"step": 2, "x": 3.0}], [{"step": 1, "x": 2.0}], [{"step": 1, "x": 6.0}]]
    steps, mean, low, high, count = seed_band(runs, "x")
    assert (
        steps == [1, 2]
        and mean == [3.0, 3.0]
        and low == [1.0, 3.0]
        and high == [6.0, 3.0]
        and count == [3, 1]
    )


def test_metric_png_has_expected_size_and_content(comparison, tmp_path):
    runs = {
        m: [
            [json.loads(x) for x in (comparison / m / f"seed{s}" / "metrics.jsonl").read_text().splitlines()]
            for s in range(3)
        ]
        for m in ("grpo", "tepo")
    }
    png = plot_metric_by_method(runs, "reward_mean", "batch reward", tmp_path / "r.png")
    img = _image(png)
    assert img.size == (round(METRIC_FIGSIZE[0] * METRIC_DPI), round(METRIC_FIGSIZE[1] * METRIC_DPI))
    assert _distinct_colours(img) > 20  # lines, bands, text: not a blank canvas


def test_token_png_has_expected_size(tmp_path):
    samples = load_samples(_record(tmp_path, 1))["samples"]
    img = _image(plot_token_view(samples, tmp_path / "t.png", title="t"))
    assert img.size == (
        round(TOKEN_FIG_WIDTH_IN * TOKEN_DPI),
        round(token_figure_height(samples) * TOKEN_DPI),
    )
    colours = {c for _, c in img.resize((300, 100)).getcolors(300 * 100)}
    assert any(r > 200 and g < 170 for r, g, b in colours)  # the red of the high-entropy token is there


# --------------------------------------------------------------------------------------------------------------
# The HTML page
# --------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def comparison_report(comparison):
    from tepo.report.html import build_report

    return build_report(comparison, threshold=0.3)


def test_comparison_report_is_self_contained(comparison, comparison_report):
    result = comparison_report
    assert result.kind == "comparison"
    page = result.html_path.read_text()
    assert "<script" not in page.lower()  # no script at all, and the model's "<script>" token is escaped
    assert html_escaped(HOSTILE) in page
    assert "Content-Security-Policy" in page
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # every image inline, no links out
    assert "http://" not in page and "https://" not in page
    # One curve per metric that is not 0 throughout (clip_frac_low is: folded into a note), two of the held-out
    # accuracy (greedy and sampled, step 0 and final); token views are text.
    assert page.count("data:image/png;base64,") == 10
    assert "Held-out accuracy during training" in page
    assert "0 at every step of every run, not drawn: clip fraction, tokens (low)" in page
    assert "curve_clip_frac_low.png" not in {p.name for p in result.figures}
    assert '0.400 <span class="ci">[-0.097, 0.897]</span>' in page and "<strong>0.500</strong>" in page
    assert "<h2>Paired tests</h2>" in page and "sign-flip p" in page  # the tests behind every difference
    names = {p.name for p in result.figures}
    assert {"curves.png", "curve_reward_mean.png", "tokens_grpo_seed_0_step000004.png"} <= names
    for png in result.figures:
        assert _image(png).size[0] > 100
    assert (comparison / "table.md").exists()


def html_escaped(text: str) -> str:
    import html

    return html.escape(text)


def test_run_report_cli_without_samples(tmp_path, capsys):
    from tepo.cli import main

    run_dir = _make_run(tmp_path / "run", greedy=0.3, rewards=[0.1, 0.2], samples=False)
    assert main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"report: {run_dir / 'report' / 'index.html'}" in out
    page = (run_dir / "report" / "index.html").read_text()
    assert "Held-out accuracy" in page and "<td>0.200</td><td>0.300</td>" in page
    assert "No per-token samples were recorded" in page
    assert main(["report", str(tmp_path / "nowhere")]) == 2


# --------------------------------------------------------------------------------------------------------------
# A real browser
# --------------------------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium not installed (Debian: apt-get install -y chromium); browser check skipped",
)


def render_in_chromium(page: Path, out_png: Path, tmp_path: Path, size=(1200, 900)) -> tuple[int, str]:
    """Screenshot ``page`` headless; returns (exit code, the browser's log, where console messages go)."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--enable-logging=stderr",
        "--v=0",
        f"--window-size={size[0]},{size[1]}",
        f"--screenshot={out_png}",
        page.resolve().as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


def console_errors(log: str) -> list[str]:
    return [
        line
        for line in log.splitlines()
        if "Uncaught" in line
        or ("CONSOLE" in line and "ERROR" in line)
        or "Refused to" in line
        or "Failed to load" in line
        or "Not allowed to load" in line
    ]


@needs_chromium
def test_console_error_detection_works(tmp_path):
    # The check below is only worth something if it can fail: a page that throws must be caught.
    page = tmp_path / "bad.html"
    page.write_text(
        "<!DOCTYPE html><html><body><p>x</p><script>throw new Error('boom-42')</script></body></html>"
    )
    rc, log = render_in_chromium(page, tmp_path / "bad.png", tmp_path)
    assert rc == 0
    assert any("boom-42" in line for line in console_errors(log)), log[-2000:]


@needs_chromium
def test_report_renders_in_headless_chromium(comparison_report, tmp_path):
    page = comparison_report.html_path
    shot = tmp_path / "shot.png"
    rc, log = render_in_chromium(page, shot, tmp_path)
    assert rc == 0, log[-2000:]
    assert console_errors(log) == [], log[-2000:]
    img = _image(shot)
    assert img.size == (1200, 900)
    assert _distinct_colours(img) > 50  # text, table and figures drew, not a blank page


def test_training_curves_drop_identically_zero_panels():
    from tepo.report.plots import _informative_curves

    on_policy = [
        {
            "step": s,
            "reward/mean": 0.1 * s,
            "update/entropy_mean": 2.0,
            "update/clip_frac_high": 0.0,
            "update/approx_kl": 0.0,
            "update/grad_norm": 1.0,
            "rollout/response_length_mean": 40.0,
            "rollout/frac_truncated": 0.5,
            "time/step_seconds": 9.0,
        }
        for s in (1, 2, 3)
    ]
    keys = [key for key, _ in _informative_curves(on_policy)]
    assert keys == [
        "reward/mean",
        "update/entropy_mean",
        "update/grad_norm",
        "rollout/response_length_mean",
        "rollout/frac_truncated",
        "time/step_seconds",
    ]
    clipped = [{**row, "update/clip_frac_high": 0.02 * row["step"]} for row in on_policy]
    assert "update/clip_frac_high" in [key for key, _ in _informative_curves(clipped)]


def test_token_and_sequence_clip_fractions_get_separate_panels():
    """clip_frac_* is a share of tokens, seq_clip_frac_* a share of responses (sequence-ratio losses only): each
    gets its own panel, and one that is 0 in every run is folded like any other."""
    runs = {
        "grpo": [[{"step": 1, "update/clip_frac_high": 0.05, "update/clip_frac_low": 0.0}]],
        "tepo": [
            [
                {
                    "step": 1,
                    "update/clip_frac_high": 0.2,
                    "update/clip_frac_low": 0.0,
                    "update/seq_clip_frac_high": 0.125,
                    "update/seq_clip_frac_low": 0.0,
                }
            ]
        ],
    }
    kept, zero, absent = informative_comparison_curves(runs)
    assert ("update/clip_frac_high", "clip fraction, tokens (high)") in kept
    assert ("update/seq_clip_frac_high", "clip fraction, sequences (high)") in kept
    assert ("update/clip_frac_low", "clip fraction, tokens (low)") in zero
    assert ("update/seq_clip_frac_low", "clip fraction, sequences (low)") in zero
    assert ("update/approx_kl", "approx. KL old->new (k3)") in absent


def test_training_curves_without_held_out_scores_draw_no_empty_legend(tmp_path):
    """A run with eval.size=0 has no before/after points: no legend, so matplotlib has nothing to warn about."""
    import warnings

    from tepo.report.plots import plot_training_curves

    rows = [{"step": s, "reward/mean": 0.1 * s} for s in (1, 2)]
    marks = {"greedy acc. before": (0, None), "greedy acc. after": (2, None)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found" is a UserWarning
        png = plot_training_curves(rows, tmp_path / "curves.png", title="r", extra_points=marks)
    assert Path(png).stat().st_size > 0
