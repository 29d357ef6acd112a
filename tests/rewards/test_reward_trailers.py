"""Answers followed by padding or end-of-text artefacts score like the bare answer, while the verifier still
sees at most ``max_chars`` characters (pure extraction, then the real math-verify pool)."""

from __future__ import annotations

import time

import pytest

from tepo.rewards import END_OF_TEXT_MARKERS, RewardPool, extract_final_answer
from tepo.rewards.answers import DEFAULT_MAX_CHARS, strip_trailer, tail
from tepo.rewards.math_items import sanitize

N = DEFAULT_MAX_CHARS + 1  # one more than the window: before the fix, this much padding hid the answer

# Trailers a decoded completion really ends with: padding, runs of newlines, special tokens decoded as text
# (once or repeated, with whitespace between), NUL/zero-width/BOM characters, Windows line ends.
TRAILERS = {
    "spaces": " " * N,
    "newlines": "\n" * N,
    "crlf_runs": "\r\n" * N,
    "tabs_and_spaces": " \t" * N,
    "unicode_spaces": "\u3000\xa0\u2028\u2009" * N,
    "nul": "\x00" * N,
    "zero_width": "\u200b\u200c\u200d\u2060\ufeff" * N,
    "endoftext_once": "<|endoftext|>" + " " * N,
    "endoftext_repeated": "<|endoftext|>" * N,
    "im_end_then_endoftext": ("<|im_end|>\n<|endoftext|>" * N),
    "eos_s_repeated": "</s>" * N,
    "eos_s_with_newlines": "</s>\n\n" * N,
    "llama3": "<|eot_id|><|end_of_text|>" * N,
    "mixed": ("\r\n<|im_end|>\x00\u200b </s>\t<|endoftext|>" * (N // 8 + 1)),
    "replacement_chars": "\ufffd" * N,  # bytes that failed to decode at the very end
}


@pytest.mark.parametrize("name", sorted(TRAILERS))
@pytest.mark.parametrize(
    ("body", "fmt", "expected"),
    [
        ("So the answer is \\boxed{42}", "boxed", "42"),
        ("So the answer is \\boxed{42}", "boxed_or_last", "42"),
        ("The answer is 42", "boxed_or_last", "42"),
        ("42", "raw", "42"),
    ],
)
def test_trailer_after_the_answer_keeps_the_answer(name, body, fmt, expected):
    assert extract_final_answer(body + TRAILERS[name], fmt) == expected


@pytest.mark.parametrize("marker", END_OF_TEXT_MARKERS)
def test_every_end_of_text_marker_is_dropped_in_raw_answers(marker):
    # A short trailer never left the window, but a raw answer used to keep the marker as part of the answer.
    assert extract_final_answer("7" + marker, "raw") == "7"
    assert extract_final_answer("7" + (marker + "\n") * 3, "raw") == "7"


def test_markers_and_spaces_inside_the_text_are_kept():
    assert strip_trailer("a </s> b </s> ") == "a </s> b"
    assert strip_trailer("x<|im_end|>y") == "x<|im_end|>y"
    assert strip_trailer("s>") == "s>"  # a partial marker is text
    assert strip_trailer("") == ""
    assert strip_trailer("</s>\n\x00") == ""


def test_every_unicode_whitespace_character_is_trailer():
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    assert strip_trailer("5" + "".join(spaces)) == "5"


def test_no_marker_is_a_suffix_of_another():
    # The scan drops markers greedily from the end; a marker that ends another would make the result depend on
    # their order in END_OF_TEXT_MARKERS.
    for a in END_OF_TEXT_MARKERS:
        for b in END_OF_TEXT_MARKERS:
            assert a == b or not b.endswith(a), (a, b)


@pytest.mark.parametrize("name", sorted(TRAILERS))
def test_the_verifier_still_gets_at_most_max_chars(name):
    text = "reasoning " * 5000 + "\\boxed{42}" + TRAILERS[name]
    for max_chars in (16, 100, DEFAULT_MAX_CHARS):
        sent = sanitize(text, max_chars)
        assert len(sent) <= max_chars
        assert len(tail(text, max_chars)) <= max_chars
    assert sanitize(text, 16).endswith("\\boxed{42}")


@pytest.mark.parametrize(
    "hostile",
    [
        "</s>" * 1_000_000 + "x",  # a backtracking regex would go quadratic here
        "</s> " * 1_000_000,
        " " * 4_000_000 + "x",
        "<|endoftext|" * 300_000,  # almost-markers, never complete
        "\u200b" * 4_000_000,
    ],
    ids=["markers_then_text", "markers_and_spaces", "spaces_then_text", "broken_markers", "zero_width"],
)
def test_stripping_is_linear_on_megabyte_trailers(hostile):
    t0 = time.perf_counter()
    out = strip_trailer(hostile)
    elapsed = time.perf_counter() - t0
    assert len(out) <= len(hostile)
    # Linear C-speed scans take tens of milliseconds on 4 MB here; quadratic ones would take hours.
    assert elapsed < 3.0, elapsed


def test_pool_scores_padded_answers_correct():
    bodies = ["Thus \\boxed{\\frac{1}{2}}", "The answer is 0.5"]
    responses = [b + t for b in bodies for t in TRAILERS.values()]
    with RewardPool(num_workers=1, timeout_s=10.0) as pool:
        results = pool.score(responses, ["\\frac{1}{2}"] * len(responses))
        wrong = pool.score(["\\boxed{3}" + TRAILERS["endoftext_repeated"]], ["\\frac{1}{2}"])
    names = [f"{i}:{t}" for i in range(len(bodies)) for t in TRAILERS]
    assert {n: r.status for n, r in zip(names, results)} == dict.fromkeys(names, "correct")
    assert all(r.reward == 1.0 for r in results)
    assert wrong[0].status == "wrong" and wrong[0].reward == 0.0
