"""Final-answer extraction and one-item verification with math-verify.

This module runs inside the reward worker processes (see ``_worker.py``), so it imports only the standard
library at module level and ``math_verify`` lazily; it must not import ``tepo`` (whose ``__init__`` may pull in
torch) nor anything relative, because the worker loads it as a plain script sibling.

Answer formats (``answer_format``):

- ``"boxed"``: only the content of the *last* ``\\boxed{...}`` (or ``\\fbox{...}``) counts, as papers do for
  MATH-style benchmarks. No box -> ``no_answer``.
- ``"boxed_or_last"``: the last box if there is one, else the last number in the text. Small models often answer
  arithmetic word problems in prose: "The answer is 15." -> ``15``; "7 + 8 = 15" -> ``15``; "-3" -> ``-3``;
  "1,000" -> ``1000``; "3/4" -> ``3/4``; a sentence-final period is not a decimal point.
- ``"raw"``: the whole text is the answer (or its last box, if it has one). For comparing two answer strings
  (``math_equal``), not for model completions.

``ANSWER_FORMATS`` is the one list of format names; ``COMPLETION_ANSWER_FORMATS`` are those that make sense for
model completions (training rewards, ``tepo eval``), i.e. all but ``"raw"``.

Trailer: what follows the final answer and carries no content is dropped first (``strip_trailer``): whitespace
(any Unicode space, ``\\r\\n`` runs), control characters (NUL, ...), zero-width and direction marks, U+FFFD left
by bytes that failed to decode, and end-of-text strings that a decode without ``skip_special_tokens`` or a model
writing them as text leaves (``END_OF_TEXT_MARKERS``: ``<|endoftext|>``, ``<|im_end|>``, ``</s>``, ...), in any
mix and number. Only the very end is touched; a marker inside the text stays.

Size cap: then only the last ``max_chars`` characters of the completion are considered (the final answer is at
the end of a completion; the head is reasoning), so the verifier never sees more than ``max_chars`` characters
however long the input. If the cut falls inside a box, that box is lost and an earlier box (or, in
``boxed_or_last``, the last number) is used; ``DEFAULT_MAX_CHARS`` leaves ample room for real answers. Dropping
the trailer before the cut is what keeps an answer followed by more padding than ``max_chars`` (a model that
fills its length budget with newlines or EOS strings) from scoring 0. The trailer scan is linear in the
trailer's length and runs at C speed (a regular expression without backtracking on the reversed end).
"""

from __future__ import annotations

import re

# The one registry of answer formats (config validation, the pool, ``tepo eval`` and its --help read it).
ANSWER_FORMAT_DESCRIPTIONS = {
    "boxed": "only a final \\boxed{} answer counts",
    "boxed_or_last": "the last \\boxed{} answer, else the last number in the text",
    "raw": "the whole text is the answer (comparing two answers, not model completions)",
}
ANSWER_FORMATS = tuple(ANSWER_FORMAT_DESCRIPTIONS)
COMPLETION_ANSWER_FORMATS = tuple(f for f in ANSWER_FORMATS if f != "raw")
DEFAULT_MAX_CHARS = 8192

# End-of-text strings of common tokenizers, as they appear in decoded text. None ends another (tested), so the
# greedy scan from the end cannot depend on their order.
END_OF_TEXT_MARKERS = (
    "<|endoftext|>",  # GPT-2, Qwen, SmolLM
    "<|im_end|>",  # ChatML (Qwen, SmolLM2 instruct)
    "<|eot_id|>",  # Llama 3
    "<|end_of_text|>",  # Llama 3
    "</s>",  # Llama 2, Mistral
    "<eos>",  # Gemma
    "<end_of_turn>",  # Gemma
    "<|end|>",  # Phi-3
    "<|return|>",  # gpt-oss
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek
    "<pad>",
    "<|pad|>",
    "[PAD]",
)
# Characters without content at the end of a completion: every Unicode space (str.isspace; the highest is U+3000),
# C0/C1 controls and DEL, zero-width and direction marks, the BOM, U+FFFD and lone surrogates (undecodable bytes).
_TRAILER_CHARS = (
    "".join(c for c in map(chr, range(0x3001)) if c.isspace())
    + "".join(map(chr, range(0x20)))
    + "".join(map(chr, range(0x7F, 0xA0)))
    + "\u180e\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e"
    + "\u2060\u2061\u2062\u2063\u2064\u2066\u2067\u2068\u2069\ufeff\ufffd"
)
# Matched against the reversed end of the text: one possessive run of trailer characters and reversed markers.
# Possessive (no backtracking) and anchored at the start, so each character is looked at once.
_REVERSED_TRAILER = re.compile(
    "(?:["
    + "".join(re.escape(c) for c in _TRAILER_CHARS)
    + "\ud800-\udfff]|"
    + "|".join(re.escape(m[::-1]) for m in END_OF_TEXT_MARKERS)
    + ")*+"
)
_LONGEST_MARKER = max(map(len, END_OF_TEXT_MARKERS))

# A backslash escapes the next character (so ``\{`` and ``\}`` are literal set braces, not groups), and bare
# braces open/close groups. Scanning only these tokens keeps extraction linear in the text length.
_BRACE_TOKENS = re.compile(r"\\.|[{}]", re.DOTALL)
_BOX_OPENER = re.compile(r"\\(?:boxed|fbox)\s*\{")
# A number not glued to a word or to a preceding decimal point; thousands separators "1,000"; decimals need a
# digit after the point (so "15." is 15); an optional "/d" makes a simple fraction "3/4".
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?(?![\w])")


def strip_trailer(text: str) -> str:
    """``text`` without its trailer: trailing whitespace, invisible characters and end-of-text markers, in any
    mix and number (see the module docstring). Text before the last content character is untouched.

    Linear in the trailer's length: the end is reversed in windows that grow 4x, and the window only grows when
    the trailer reaches (to within one marker's length) its far edge, so a marker cut by the window edge is
    never mistaken for text.
    """
    n = len(text)
    window = 256
    while True:
        window = min(window, n)
        cut = _REVERSED_TRAILER.match(text[n - window :][::-1]).end()
        if window == n or window - cut >= _LONGEST_MARKER:
            return text[: n - cut]
        window *= 4


def tail(text: str, max_chars: int | None) -> str:
    """The last ``max_chars`` characters of ``text`` once its trailer is dropped (all of it when ``max_chars`` is
    None). At most ``max_chars`` characters, whatever the input."""
    text = strip_trailer(text)
    if max_chars is None or len(text) <= max_chars:
        return text
    return text[-max_chars:]


def last_boxed(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}``/``\\fbox{...}`` in ``text``, nested braces included.

    Linear time: one pass pairs every group brace, then the last opener with a matching close wins. An
    unbalanced last box (e.g. cut off by the generation limit) is skipped in favour of an earlier complete one.
    """
    openers = [m.end() - 1 for m in _BOX_OPENER.finditer(text)]
    if not openers:
        return None
    close_of: dict[int, int] = {}
    stack: list[int] = []
    for m in _BRACE_TOKENS.finditer(text):
        token = m.group()
        if token == "{":
            stack.append(m.start())
        elif token == "}" and stack:
            close_of[stack.pop()] = m.start()
    for brace in reversed(openers):
        close = close_of.get(brace)
        if close is not None:
            return text[brace + 1 : close].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` as a plain string ("1,000" -> "1000"), or None."""
    last = None
    for last in _NUMBER.finditer(text):  # noqa: B007 - we want the final match
        pass
    if last is None:
        return None
    return last.group().replace(",", "")


def extract_final_answer(
    text: str, answer_format: str = "boxed_or_last", *, max_chars: int | None = DEFAULT_MAX_CHARS
) -> str | None:
    """The final answer of a completion under ``answer_format`` (see module docstring), or None if it has none.

    Only the last ``max_chars`` characters are looked at.
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format={answer_format!r} is not one of {ANSWER_FORMATS}")
    if not isinstance(text, str):
        raise TypeError(f"extract_final_answer expects a str, got {type(text).__name__}")
    text = tail(text, max_chars)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed or None
    if answer_format == "boxed_or_last":
        return last_number(text)
    if answer_format == "raw":
        return text.strip() or None
    return None


def normalize_gold(gold: str) -> str:
    """A dataset answer as a bare expression: its last box if it has one, without surrounding ``$``."""
    boxed = last_boxed(gold)
    answer = boxed if boxed is not None else gold
    return answer.strip().strip("$").strip()


def _latex_config():
    from math_verify import LatexExtractionConfig

    # Only the LaTeX parser (latex2sympy) ever sees model output: math-verify's ExprExtractionConfig goes through
    # sympy's parse_expr, which evaluates Python code. We hand it a single box, so priority 0 is the box.
    return [LatexExtractionConfig(boxed_match_priority=0)]


def parse_answer(answer: str) -> list:
    """math-verify's parse of one bare answer (wrapped in a box), without math-verify's own signal timeouts:
    the worker enforces a deadline for the whole item instead (one SIGALRM timer cannot serve both)."""
    from math_verify import parse

    return parse("\\boxed{" + answer + "}", extraction_config=_latex_config(), parsing_timeout=None)


def is_symbolic(parsed: list) -> bool:
    """Whether math-verify turned the answer into a sympy object (else it only kept the raw string)."""
    from sympy import Basic, MatrixBase

    return any(isinstance(p, (Basic, MatrixBase)) for p in parsed)


def verify_item(
    gold: str,
    response: str,
    answer_format: str = "boxed_or_last",
    max_chars: int | None = DEFAULT_MAX_CHARS,
    gold_cache: dict | None = None,
) -> dict:
    """Score one completion against one gold answer; returns plain data only.

    Keys: ``status`` ("correct" | "wrong" | "no_answer" | "error"), ``extracted`` (str or None),
    ``parse_failure`` (the extracted answer did not parse to a sympy object), ``detail`` (str).
    No time limit here: the caller (the worker) owns the deadline.
    """
    from math_verify import verify

    extracted = extract_final_answer(response, answer_format, max_chars=max_chars)
    if extracted is None:
        return {"status": "no_answer", "extracted": None, "parse_failure": False, "detail": ""}
    gold_parsed = gold_cache.get(gold) if gold_cache is not None else None
    if gold_parsed is None:
        gold_parsed = parse_answer(normalize_gold(gold))
        if gold_cache is not None:
            if len(gold_cache) >= 4096:
                gold_cache.clear()
            gold_cache[gold] = gold_parsed
    if not gold_parsed:
        return {
            "status": "error",
            "extracted": extracted,
            "parse_failure": False,
            "detail": f"gold answer {gold[:200]!r} could not be parsed by math-verify",
        }
    pred_parsed = parse_answer(extracted)
    parse_failure = not is_symbolic(pred_parsed)
    correct = bool(pred_parsed) and verify(gold_parsed, pred_parsed, timeout_seconds=None)
    return {
        "status": "correct" if correct else "wrong",
        "extracted": extracted,
        "parse_failure": parse_failure,
        "detail": "",
    }
