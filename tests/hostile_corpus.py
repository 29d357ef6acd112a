"""Programmatically generated adversarial completions for the reward pool.

``hostile_corpus(marker_dir)`` returns ``HostileCase`` items. Every case must come back within the pool's
timeout and must not score 1.0 unless ``may_be_correct`` (a valid answer wrapped in junk, where "correct" is the
right verdict). Injection cases try to run ``touch <marker_dir>/pwned_<n>``; the test asserts no marker appears.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

MB = 1 << 20


@dataclass(frozen=True)
class HostileCase:
    name: str
    response: str
    # absent from the hostile text: only cases marked may_be_correct (gold "5") can score 1. Not an integer: the
    # injection payloads carry a temporary path (pytest-42/...), whose numbers the prose extractor may read.
    gold: str = "7.25"
    may_be_correct: bool = False
    injection: bool = False
    must_be_correct: bool = (
        False  # a right answer followed by padding/markers: anything but "correct" is a bug
    )


def _boxed(s: str) -> str:
    return "The final answer is \\boxed{" + s + "}"


def _nesting() -> list[HostileCase]:
    cases = []
    for n in (10, 100, 1000, 5000, 20000):
        cases.append(
            HostileCase(f"nested_braces_{n}", _boxed("{" * n + "5" + "}" * n), gold="5", may_be_correct=True)
        )
        cases.append(HostileCase(f"unbalanced_open_{n}", _boxed("{" * n + "5")))
        cases.append(HostileCase(f"unbalanced_close_{n}", _boxed("5" + "}" * n)))
        cases.append(HostileCase(f"boxed_chain_open_{n}", "\\boxed{" * n + "5"))
        cases.append(
            HostileCase(f"nested_parens_{n}", _boxed("(" * n + "5" + ")" * n), gold="5", may_be_correct=True)
        )
        cases.append(HostileCase(f"nested_left_right_{n}", _boxed("\\left(" * n + "5" + "\\right)" * n)))
        cases.append(HostileCase(f"nested_sqrt_{n}", _boxed("\\sqrt{" * n + "5" + "}" * n)))
        cases.append(
            HostileCase(f"nested_boxed_{n}", "\\boxed{" * n + "5" + "}" * n, gold="5", may_be_correct=True)
        )
        cases.append(HostileCase(f"escaped_braces_{n}", _boxed("\\{" * n + "5" + "\\}" * n)))
        cases.append(HostileCase(f"many_empty_boxes_{n}", "\\boxed{}" * n))
    return cases


def _megabytes() -> list[HostileCase]:
    rng = random.Random(0)
    latex_tokens = [
        "\\frac{",
        "}",
        "{",
        "^",
        "_",
        "\\sqrt",
        "\\left(",
        "\\right)",
        "x",
        "9",
        "+",
        "\\cdot",
        "!",
    ]
    junk = "".join(rng.choice(latex_tokens) for _ in range(MB // 3))
    return [
        HostileCase("mb_digits", "9" * MB),
        HostileCase("mb_digits_boxed", _boxed("9" * MB)),
        HostileCase("mb_letters", "a" * MB),
        HostileCase("mb_sum_boxed", _boxed("+".join(["x"] * (MB // 2)))),
        HostileCase("mb_frac_openers", "\\frac{" * (MB // 6)),
        HostileCase("mb_random_latex", junk),
        HostileCase("mb_random_latex_boxed", _boxed(junk)),
        HostileCase(
            "mb_reasoning_then_answer",
            "Let me think. " * (MB // 14) + "\\boxed{5}",
            gold="5",
            may_be_correct=True,
        ),
        HostileCase("mb_answer_then_reasoning", "\\boxed{5}" + " and so on" * (MB // 10)),
        HostileCase("mb_decimal", _boxed("0." + "9" * MB)),
        HostileCase("mb_number_commas", "1," * (MB // 2) + "1"),
        HostileCase("mb_minus_signs", "-" * MB + "1"),
        HostileCase("mb_backslashes", "\\" * MB),
        HostileCase("mb_newlines", "\n" * MB + "\\boxed{4}"),
        HostileCase("mb_dollars", "$" * MB),
    ]


def _powers_and_factorials() -> list[HostileCase]:
    exprs = [
        "9^{9^{9^{9}}}",
        "9^9^9^9",
        "10^{10^{10}}",
        "10^{10^{100}}",
        "2^{2^{2^{2^{2^{2}}}}}",
        "(10^{100})^{10^{100}}",
        "e^{e^{e^{100}}}",
        "99999^{99999^{99999}}",
        "3^{10^{7}}",
        "7^{123456789}",
        "(3^{10^{6}})^{100}",
        "3^{2000000}\\cdot 7^{3000000}",
        "2.5^{10^{9}}",
        "(-1)^{10^{100}}",
        "i^{10^{100}}",
        "100000!",
        "(10!)!",
        "((5!)!)!",
        "3000000!",
        "10^{6}!",
        "\\Gamma(10^{10})",
        "\\binom{10^{9}}{10^{8}}",
        "(10^{10})!!",
        "\\sum_{i=1}^{10^{10}} i^{i}",
        "\\sum_{i=1}^{10^{9}} i",
        "\\prod_{k=1}^{10^{9}} k",
        "\\prod_{k=1}^{10^{6}} (1+\\frac{1}{k})",
        "\\lim_{n\\to\\infty} (1+\\frac{1}{n})^{n^{n^{n}}}",
        "\\int_0^{10^{10}} x^{x^{x}} dx",
        "\\sqrt[10^{10}]{2}",
        "\\log_{2}(2^{10^{10}})",
        "10^{-10^{10}}",
        "\\frac{1}{0}",
        "0^{0}",
        "\\log(0)",
        "\\infty - \\infty",
        "\\frac{\\infty}{\\infty}",
        "5 + 10^{10^{10}} - 10^{10^{10}}",
    ]
    cases = [HostileCase(f"bomb_{i}", _boxed(e)) for i, e in enumerate(exprs)]
    cases += [
        HostileCase(f"bomb_prose_{i}", f"We compute {e}, so the result is {e}.") for i, e in enumerate(exprs)
    ]
    return cases


def _fraction_bombs() -> list[HostileCase]:
    cases = []
    for n in (50, 200, 1000):
        cases.append(HostileCase(f"frac_nest_{n}", _boxed("\\frac{1}{" * n + "2" + "}" * n)))
        cases.append(HostileCase(f"frac_cont_{n}", _boxed("1+\\frac{1}{1+" * n + "1" + "}" * n)))
        cases.append(HostileCase(f"dfrac_chain_{n}", _boxed("\\dfrac{9^{9}}{" * n + "7" + "}" * n)))
        cases.append(
            HostileCase(f"frac_sum_{n}", _boxed("+".join(f"\\frac{{1}}{{{k}}}" for k in range(1, n))))
        )
        cases.append(HostileCase(f"pow_tower_{n}", _boxed("2^{" * n + "2" + "}" * n)))
        cases.append(HostileCase(f"x_poly_{n}", _boxed("(x+1)^{" + str(n * 100) + "}")))
        cases.append(HostileCase(f"matrix_{n}", _boxed(_matrix(min(n, 300)))))
        cases.append(HostileCase(f"sum_x_{n}", _boxed("+".join(["x"] * (n * 10)))))
    return cases


def _matrix(n: int) -> str:
    row = " & ".join(["x"] * n)
    return "\\begin{pmatrix}" + " \\\\ ".join([row] * n) + "\\end{pmatrix}"


def _control_and_encoding() -> list[HostileCase]:
    cases = []
    for c in range(32):
        ch = chr(c)
        cases.append(HostileCase(f"ctrl_{c:02x}_inside", _boxed("5" + ch), gold="5", may_be_correct=True))
    cases += [
        HostileCase(
            "ctrl_all_prefix",
            "".join(map(chr, range(32))) * 100 + "\\boxed{5}",
            gold="5",
            may_be_correct=True,
        ),
        HostileCase("ctrl_ansi", "\x1b[2J\x1b[31m\\boxed{\x1b[0m6}"),
        HostileCase("ctrl_del", "\x7f" * 1000 + "\\boxed{6}"),
        HostileCase("nul_everywhere", "\x00".join("\\boxed{5}"), gold="5", may_be_correct=True),
        HostileCase("rtl_override", "\\boxed{\u202e5\u202c}", gold="5", may_be_correct=True),
        HostileCase("zero_width", "\\boxed{5\u200b\u200d}", gold="5", may_be_correct=True),
        HostileCase("bom", "\ufeff\\boxed{5}", gold="5", may_be_correct=True),
        HostileCase("fullwidth_digits", "\\boxed{\uff15}", gold="5", may_be_correct=True),
        HostileCase("arabic_digits", "\\boxed{\u0665}", gold="5", may_be_correct=True),
        HostileCase("combining_marks", "\\boxed{5" + "\u0301" * 10000 + "}"),
        HostileCase("emoji_flood", "\U0001f600" * 100000),
        HostileCase("private_use", "\\boxed{\ue000\uf8ff}"),
        HostileCase("noncharacters", "\\boxed{\ufffe\uffff}"),
        HostileCase("gold_with_control", "\\boxed{5}", gold="5\x00", may_be_correct=True),
    ]
    rng = random.Random(1)
    for i in range(12):
        raw = bytes(rng.randrange(256) for _ in range(4096)) + b"\\boxed{5}" + bytes([0xFF, 0xFE, 0xC0, 0x80])
        cases.append(
            HostileCase(
                f"bad_utf8_surrogateescape_{i}",
                raw.decode("utf-8", "surrogateescape"),
                gold="5",
                may_be_correct=True,
            )
        )
        cases.append(
            HostileCase(
                f"bad_utf8_replace_{i}", raw.decode("utf-8", "replace"), gold="5", may_be_correct=True
            )
        )
    cases.append(HostileCase("lone_surrogates_in_box", "\\boxed{\udc80\ud800}"))
    cases.append(HostileCase("lone_surrogate_gold", "\\boxed{5}", gold="5\udcff", may_be_correct=True))
    return cases


def _trailers() -> list[HostileCase]:
    """A right answer followed by more padding or end-of-text artefacts than the verifier's window (8192
    characters): must score correct, in bounded time. And floods of markers with no answer: must not."""
    right = "So the answer is \\boxed{5}"
    floods = {
        "spaces": " " * MB,
        "newlines": "\n" * MB,
        "crlf": "\r\n" * (MB // 2),
        "nul": "\x00" * MB,
        "zero_width": "\u200b\ufeff" * (MB // 2),
        "endoftext": "<|endoftext|>" * (MB // 13),
        "im_end_endoftext": "<|im_end|>\n<|endoftext|>" * (MB // 24),
        "eos_s_newlines": "</s>\n" * (MB // 5),
        "mixed": "\r\n<|im_end|>\x00\u200b </s>\t<|eot_id|>" * (MB // 32),
    }
    cases = [
        HostileCase(f"trailer_{name}", right + flood, gold="5", may_be_correct=True, must_be_correct=True)
        for name, flood in floods.items()
    ]
    cases += [
        HostileCase(
            "trailer_number_then_eos",
            "The answer is 5" + "</s>" * (MB // 4),
            gold="5",
            may_be_correct=True,
            must_be_correct=True,
        ),
        HostileCase("markers_then_text", "</s>" * (MB // 4) + "x"),
        HostileCase("broken_markers", "<|endoftext|" * (MB // 12)),
        HostileCase("answer_then_markers_then_text", "\\boxed{42}" + "</s>" * (MB // 4) + "done"),
    ]
    return cases


def _injections(marker_dir: Path) -> list[HostileCase]:
    payloads = [
        "__import__('os').system('touch {m}')",
        '__import__("os").system("touch {m}")',
        "eval(\"__import__('os').system('touch {m}')\")",
        "exec(\"import os; os.system('touch {m}')\")",
        "(lambda: __import__('os').system('touch {m}'))()",
        "().__class__.__bases__[0].__subclasses__() or __import__('os').system('touch {m}')",
        "open('{m}', 'w').write('x')",
        "__import__('subprocess').call(['touch', '{m}'])",
        "__import__('pathlib').Path('{m}').touch()",
        "compile(\"open('{m}','w')\", 'x', 'exec')",
        "Symbol('x').__class__.__init__.__globals__['__builtins__']['__import__']('os').system('touch {m}')",
        "sympify(\"__import__('os').system('touch {m}')\")",
    ]
    wrappers = [
        ("boxed", lambda p: _boxed(p)),
        ("boxed_text", lambda p: _boxed("\\text{" + p + "}")),
        ("prose", lambda p: "The answer is " + p),
        ("dollars", lambda p: "$" + p + "$"),
        ("last_line", lambda p: "Final answer:\n" + p + "\n"),
        ("boxed_mathrm", lambda p: _boxed("\\mathrm{" + p + "}")),
    ]
    cases = []
    n = 0
    for pi, payload in enumerate(payloads):
        for wname, wrap in wrappers:
            marker = marker_dir / f"pwned_{n}"
            n += 1
            cases.append(HostileCase(f"inject_{pi}_{wname}", wrap(payload.format(m=marker)), injection=True))
    # The gold answer comes from a dataset, but a poisoned dataset must not run code either.
    marker = marker_dir / f"pwned_{n}"
    cases.append(
        HostileCase(
            "inject_gold", "\\boxed{5}", gold=f"__import__('os').system('touch {marker}')", injection=True
        )
    )
    return cases


def hostile_corpus(marker_dir: Path) -> list[HostileCase]:
    """All hostile cases; injection markers would be created under ``marker_dir``."""
    corpus = (
        _nesting()
        + _megabytes()
        + _powers_and_factorials()
        + _fraction_bombs()
        + _control_and_encoding()
        + _trailers()
        + _injections(Path(marker_dir))
    )
    names = [c.name for c in corpus]
    assert len(names) == len(set(names)), "hostile case names must be unique"
    return corpus


def default_subset(corpus: list[HostileCase], size: int = 34) -> list[HostileCase]:
    """A fixed, representative slice for the default (fast) suite: every category, all cheap-to-verify kinds."""
    wanted = [
        "nested_braces_5000",
        "unbalanced_open_20000",
        "boxed_chain_open_20000",
        "nested_parens_1000",
        "many_empty_boxes_20000",
        "mb_digits",
        "mb_digits_boxed",
        "mb_sum_boxed",
        "mb_random_latex",
        "mb_reasoning_then_answer",
        "mb_answer_then_reasoning",
        "mb_number_commas",
        "bomb_0",
        "bomb_15",
        "bomb_16",
        "bomb_22",
        "bomb_prose_0",
        "frac_nest_200",
        "pow_tower_200",
        "matrix_200",
        "ctrl_00_inside",
        "ctrl_ansi",
        "rtl_override",
        "bad_utf8_surrogateescape_0",
        "bad_utf8_replace_0",
        "lone_surrogates_in_box",
        "inject_0_boxed",
        "inject_0_prose",
        "inject_11_boxed_text",
        "inject_gold",
        "trailer_spaces",
        "trailer_endoftext",
        "trailer_mixed",
        "markers_then_text",
    ]
    by_name = {c.name: c for c in corpus}
    return [by_name[n] for n in wanted[:size]]
