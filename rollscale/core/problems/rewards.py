"""0/1 verifiers for rollouts (science §2: "Reward is 0/1 from the verifier").

Three built-in verifiers (plus a user's ``module:function``), never partial credit:

- ``numeric_reward``: GSM8K-style final-number match, exact rational comparison.
- ``math_reward``: last ``\\boxed{}`` answer compared to the gold answer with
  math-verify (symbolic equivalence).
- ``exact_reward``: final answer (last ``\\boxed{}`` or whole completion) equals
  the gold as whitespace-normalised text.

reasoning-gym's own ``score_answer`` gives partial credit to some wrong answers
(e.g. right number, wrong format), so it is deliberately not used here.

Canonical number form (``extract_number`` / ``canonical_number``): the exact
rational value written as an integer when it is one (``"1234"``, ``"-3"``), else
as a terminating decimal with no trailing zeros when one exists (``"3.5"``,
``"-0.75"``; so ``"3/4"`` becomes ``"0.75"``), else as a reduced fraction
(``"1/3"``, ``"-2/3"``). Every rational has exactly one canonical string, and
``normalize_number(canonical_number(x)) == x``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from rollscale.core.problems.timed_worker import TimedWorker
from rollscale.plugins import import_reference, is_reference
from rollscale.registry import Registry

logger = logging.getLogger(__name__)

__all__ = [
    "canonical_number",
    "exact_reward",
    "extract_number",
    "is_reward_name",
    "last_boxed",
    "math_reward",
    "normalize_number",
    "numeric_reward",
    "reward_fn",
    "VERIFIERS",
]

# One number as it appears in prose. A sign counts only when it is not glued to
# a preceding operand, so "5-3" reads as the numbers 5 and 3, not 5 and -3.
# Alternatives are tried in order: a simple fraction "3/4", then a number with
# comma thousands separators "1,234.5", then a plain "1234.5", then ".5".
# A trailing "." (end of sentence, "42.") is never part of the number.
_NUMBER_BODY = (
    r"(?:(?P<fnum>\d+)/(?P<fden>\d+)(?![\d.]\d)"
    r"|(?P<dec>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+))"
)
_SIGN = r"(?P<sign>[-+\u2212])"
_NUMBER_RE = re.compile(r"(?:(?<![\w)\]}])" + _SIGN + r")?\$?" + _NUMBER_BODY)
# A whole string that is exactly one number: optional sign, optional "$",
# optional trailing "." (e.g. "42."), surrounding whitespace.
_FULL_NUMBER_RE = re.compile(r"\s*\$?\s*" + _SIGN + r"?\s*\$?\s*" + _NUMBER_BODY + r"\.?\s*")

_GSM8K_MARKER = "####"


def _match_value(m: re.Match[str]) -> Fraction | None:
    """Exact value of a number match; None for a zero denominator or a digit
    string too long for int() (Python's 4300-digit limit)."""
    try:
        if m.group("fnum") is not None:
            den = int(m.group("fden"))
            if den == 0:
                return None
            value = Fraction(int(m.group("fnum")), den)
        else:
            value = Fraction(m.group("dec").replace(",", ""))
    except ValueError:
        return None
    if m.group("sign") in ("-", "\u2212"):
        value = -value
    return value


def normalize_number(s: str) -> Fraction | None:
    """Exact value of a string that is a single number, else None.

    Accepts commas as thousands separators (``"1,234"``), a ``$`` prefix, a sign
    (``"-3"``, ``"+3"``, ``"-$3"``), decimals (``"3.50"``), simple fractions
    (``"3/4"``) and a trailing ``"."``. Anything else around the number (words,
    units, a second number) gives None: use ``extract_number`` to find a number
    inside text. Science §2 (0/1 verifier).
    """
    if not isinstance(s, str):
        raise ValueError(f"normalize_number: s must be a str, got {type(s).__name__}")
    m = _FULL_NUMBER_RE.fullmatch(s)
    if m is None:
        return None
    return _match_value(m)


def canonical_number(value: Fraction) -> str:
    """The one canonical string of an exact rational (see module docstring)."""
    if not isinstance(value, Fraction):
        raise ValueError(f"canonical_number: value must be a Fraction, got {type(value).__name__}")
    num, den = value.numerator, value.denominator
    if den == 1:
        return str(num)
    # Terminating decimal iff the reduced denominator has no prime factors
    # other than 2 and 5; then den divides 10**k for k = max(power of 2, of 5).
    twos = fives = 0
    d = den
    while d % 2 == 0:
        d //= 2
        twos += 1
    while d % 5 == 0:
        d //= 5
        fives += 1
    if d != 1:
        return f"{num}/{den}"
    k = max(twos, fives)
    scaled = abs(num) * (10**k // den)
    digits = str(scaled).rjust(k + 1, "0")
    text = f"{digits[:-k]}.{digits[-k:]}".rstrip("0")
    return ("-" if num < 0 else "") + text


def _extract_value(text: str) -> Fraction | None:
    marker = text.rfind(_GSM8K_MARKER)
    if marker >= 0:
        # A declared final answer: the first number after the last "####".
        # If the declaration holds no number there is no answer (no fallback
        # to earlier numbers in the reasoning).
        for m in _NUMBER_RE.finditer(text, marker + len(_GSM8K_MARKER)):
            value = _match_value(m)
            if value is not None:
                return value
        return None
    last = None
    for m in _NUMBER_RE.finditer(text):
        value = _match_value(m)
        if value is not None:
            last = value
    return last


def extract_number(text: str) -> str | None:
    """The final numeric answer in ``text``, in canonical form, or None.

    GSM8K convention: the first number after the last ``####`` if the text has
    a ``####``, else the last number in the text. Science §2 (0/1 verifier).
    """
    if not isinstance(text, str):
        raise ValueError(f"extract_number: text must be a str, got {type(text).__name__}")
    value = _extract_value(text)
    return None if value is None else canonical_number(value)


RewardFn = Callable[[str, str], float]
# the built-in verifiers by name (science §2); a user's own is "package.module:function"
VERIFIERS: Registry = Registry("verifier")


@VERIFIERS.register("numeric")
def numeric_reward(completion: str, gold: str) -> float:
    """1.0 iff the completion's final number equals the gold number exactly, else 0.0.

    ``gold`` may be a bare number (``"18"``, ``"1,234"``, ``"3/4"``) or a full
    GSM8K answer ending in ``#### N``; both are read with ``extract_number``.
    Values are compared as exact rationals (``"3.50"`` == ``"7/2"``), so float
    rounding never turns a wrong answer right. Science §2 (0/1 verifier).

    Raises ValueError when ``gold`` holds no number (a data error, not a wrong
    answer).
    """
    if not isinstance(completion, str):
        raise ValueError(f"numeric_reward: completion must be a str, got {type(completion).__name__}")
    if not isinstance(gold, str):
        raise ValueError(f"numeric_reward: gold must be a str, got {type(gold).__name__}")
    gold_value = _extract_value(gold)
    if gold_value is None:
        raise ValueError(f"numeric_reward: gold {gold[:80]!r} holds no number")
    pred_value = _extract_value(completion)
    return 1.0 if pred_value is not None and pred_value == gold_value else 0.0


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` or ``\\fbox{...}`` in ``text`` (braces
    balanced), or None if there is none or its braces never close."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    if not starts:
        return None
    start = starts[-1]
    depth = 1
    for i in range(start, len(text)):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def _boxed_for_parse(content: str) -> str:
    # Re-wrap so math-verify's LaTeX extraction reads exactly this answer.
    return "\\boxed{" + content + "}"


def _math_verify_score(completion: str, gold: str, op_timeout_s: int | None) -> float:
    """math_reward's check itself; runs in the math-verify worker process."""
    # Imported here: math-verify pulls in sympy and its LaTeX grammar (~1 s).
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    gold_box = last_boxed(gold)
    gold_text = _boxed_for_parse(gold_box if gold_box is not None else gold.strip())
    pred_box = last_boxed(completion)
    try:
        gold_parsed = parse(gold_text, parsing_timeout=op_timeout_s)
        if not gold_parsed:
            logger.debug("math_reward: math-verify could not parse gold %r", gold[:200])
            return 0.0
        if pred_box is not None:
            pred_parsed = parse(_boxed_for_parse(pred_box), parsing_timeout=op_timeout_s)
        else:
            pred_parsed = parse(completion, parsing_timeout=op_timeout_s)
            if not pred_parsed:
                last_number = extract_number(completion)
                if last_number is not None:
                    pred_parsed = parse(_boxed_for_parse(last_number), parsing_timeout=op_timeout_s)
        if not pred_parsed:
            return 0.0
        return 1.0 if verify(gold_parsed, pred_parsed, timeout_seconds=op_timeout_s) else 0.0
    except (Exception, TimeoutException):
        # math-verify's TimeoutException derives from BaseException.
        logger.debug("math_reward: math-verify failed", exc_info=True)
        return 0.0


def _import_math_verify() -> None:
    import math_verify  # noqa: F401  (the worker pays the ~1 s import once, at start)


_MATH_VERIFY_WORKER = TimedWorker(_import_math_verify)


@VERIFIERS.register("math")
def math_reward(completion: str, gold: str, *, timeout_s: float = 15.0) -> float:
    """1.0 iff the completion's final answer is mathematically equal to ``gold``
    according to math-verify, else 0.0. Science §2 (0/1 verifier).

    The completion's answer is its last ``\\boxed{}`` / ``\\fbox{}``; without
    one, math-verify's own extraction on the whole completion, and failing that
    the last number in it. ``gold`` may be a bare answer (``\\frac{1}{2}``) or
    contain ``\\boxed{}`` (its last one is used). Any math-verify error, and any
    check taking longer than ``timeout_s`` seconds, scores 0.0.

    Safe to call from any thread, and from a script without a main guard: the
    check runs in a worker process (started on first use, about two seconds)
    that is killed when it overruns; see :class:`rollscale.core.problems.timed_worker.TimedWorker`.
    """
    if not isinstance(completion, str):
        raise ValueError(f"math_reward: completion must be a str, got {type(completion).__name__}")
    if not isinstance(gold, str):
        raise ValueError(f"math_reward: gold must be a str, got {type(gold).__name__}")
    if not gold.strip():
        raise ValueError("math_reward: gold is empty")
    if not timeout_s > 0:
        raise ValueError(f"math_reward: timeout_s must be > 0, got {timeout_s!r}")
    # math-verify's per-operation signal timeout: whole seconds, within the
    # overall bound (one call parses twice and compares once).
    op_timeout_s = max(1, int(timeout_s / 3))
    return float(_MATH_VERIFY_WORKER.call(_math_verify_score, (completion, gold, op_timeout_s), timeout_s, 0.0))


@VERIFIERS.register("exact")
def exact_reward(completion: str, gold: str) -> float:
    """1.0 iff the completion's final answer equals ``gold`` as text, else 0.0.

    The final answer is the content of the completion's last ``\\boxed{}``
    when it has one, else the whole completion; both sides are compared with
    surrounding whitespace trimmed and inner runs of whitespace collapsed.
    For answers that are labels or strings (science §2, 0/1 verifier).
    """
    if not isinstance(completion, str) or not isinstance(gold, str):
        raise ValueError("exact_reward: completion and gold must be str")
    boxed = last_boxed(completion)
    answer = completion if boxed is None else boxed
    return 1.0 if " ".join(answer.split()) == " ".join(gold.split()) else 0.0


def is_reward_name(name: object) -> bool:
    """True for a built-in verifier name or a ``module:function`` reference
    (not imported here; :func:`reward_fn` imports it)."""
    return VERIFIERS.is_valid(name) or is_reference(name)


def reward_fn(name: str) -> RewardFn:
    """The verifier ``(completion, gold) -> 0.0 | 1.0`` called ``name``:
    "numeric", "math", "exact", or a user's ``module:function``. Science §2."""
    if VERIFIERS.is_valid(name):
        return VERIFIERS.get(name)
    if not is_reward_name(name):
        raise ValueError(
            f"reward_fn: name must be one of {', '.join(VERIFIERS.names())} or 'module:function'; got {name!r}"
        )
    # a user's verifier: "package.module:function", a callable (completion, gold) -> 0.0 | 1.0
    try:
        return import_reference(name, "verifier")
    except ValueError as err:
        raise ValueError(f"reward_fn: {err}") from None
