"""Answer extraction and comparison for the ``math`` task.

The grader is deliberately conservative: it normalises notation (LaTeX wrappers, units,
thousands separators, fractions, scientific notation) but never evaluates arithmetic, so
``16 - 3 - 4`` is not accepted for ``9``. Numbers compare as exact fractions; a tight
relative tolerance applies only when a side is not an integer. Nothing here raises on odd
input: an answer that cannot be read is simply wrong.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

import msgspec

__all__ = [
    "GradeResult",
    "extract_answer",
    "grade",
    "last_boxed",
    "normalize",
    "parse_number",
    "reference_answer",
]

Method = Literal["numeric", "string", "none"]

#: Relative tolerance for comparing non-integers (e.g. ``0.30000000000000004`` vs ``0.3``).
REL_TOL = Fraction(1, 10**9)
# Inputs past these sizes are compared as strings only, so a hostile answer cannot make
# Fraction build a gigantic integer.
_MAX_NUMERIC_CHARS = 200
_MAX_EXPONENT = 400
_MAX_ANSWER_CHARS = 2000
_MAX_BOXES = 64
_MAX_SHOWN_CHARS = 256  # normalised answers are echoed in eval details; keep them short


class GradeResult(msgspec.Struct, frozen=True):
    """Outcome of comparing one predicted answer with a reference (the job's eval details)."""

    correct: bool
    predicted_normalized: str | None
    reference_normalized: str | None
    method: Method


# --------------------------------------------------------------------------- extraction


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Content of the ``{...}`` opening at ``text[start]`` and the index after it."""
    if start >= len(text) or text[start] != "{":
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + 1 : i], i + 1
    return None


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (balanced braces) or ``\\boxed x`` in ``text``."""
    for match in list(_BOXED.finditer(text))[::-1][:_MAX_BOXES]:
        inner = _braced(text, match.end())
        if inner is not None:
            return inner[0].strip()
        bare = re.match(r"[^\s${}]+", text[match.end() :])
        if bare and match.end() > match.start() + len("\\boxed"):
            return bare.group(0)
    return None


_HASH_LINE = re.compile(r"^[ \t]*####[ \t]*(\S.*?)[ \t]*$", re.MULTILINE)


def _hash_answer(text: str) -> str | None:
    found = _HASH_LINE.findall(text)
    return found[-1] if found else None


def extract_answer(text: str, finish_answer: str | None) -> str | None:
    """The model's final answer.

    The ``finish`` tool's answer wins when given (its last ``\\boxed{}`` if it has one);
    otherwise the last balanced ``\\boxed{...}`` in ``text``, else the last GSM8K
    ``#### x`` line, else ``None``.
    """
    if finish_answer is not None and finish_answer.strip():
        return last_boxed(finish_answer) or finish_answer.strip()
    if not text:
        return None
    return last_boxed(text) or _hash_answer(text)


def reference_answer(ref: str) -> str:
    """The final answer inside a reference: a GSM8K solution's ``#### x``, a ``\\boxed{}``
    in a worked solution, or the reference itself when it is a plain answer."""
    return _hash_answer(ref) or last_boxed(ref) or ref.strip()


# --------------------------------------------------------------------------- normalisation

_TEXT_MACROS = re.compile(r"\\(?:textbf|textit|textrm|text|mathrm|mathbf|mbox|operatorname)\s*")
_DROP = re.compile(
    r"\\left|\\right|\\displaystyle|\\[,;:! ]|\{,\}|\\\$|\$|\\%|%|\^\s*\{?\\circ\}?|°|"
    r"\\(?:degree|circ)\b|[€£¥]|\\euro\b|\\pounds\b"
)
_MINUS = re.compile("[\u2212\u2012\u2013\u2014\ufe63\uff0d]")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_ASSIGN = re.compile(r"^\s*\\?[A-Za-z][A-Za-z0-9_]*(?:\s*\([A-Za-z, ]*\))?\s*(?:=|\\approx)")
_PREFIX = re.compile(r"^(?:the\s+)?(?:final\s+)?answer\s*(?:is|:)\s*", re.IGNORECASE)
# Units that may be written glued to the number ("5cm", "3kg"); any other word needs a space.
_GLUED_UNITS = (
    r"(?:mm|cm|km|m|kg|g|mg|lbs?|oz|ft|in|mi|mph|kph|km/h|m/s|hrs?|h|min|mins|s|secs?|"
    r"ml|l|cups?|pts?|yrs?|usd|dollars?|cents?)"
)
_UNIT_TAIL = re.compile(
    rf"(?:\s*{_GLUED_UNITS}\b|\s+[A-Za-z][A-Za-z'.]+)"
    # Separators and word characters are disjoint so the repetition cannot backtrack
    # exponentially on a long run of letters.
    r"(?:[\s/\-]+[A-Za-z][A-Za-z'.]*|\^\{?[23]\}?)*$",
    re.IGNORECASE,
)


def _unwrap_macro_args(text: str, macro: re.Pattern[str]) -> str:
    """Replace ``\\macro{arg}`` by ``arg`` (balanced braces) for every match of ``macro``."""
    out: list[str] = []
    pos = 0
    for _ in range(len(text)):
        match = macro.search(text, pos)
        if match is None:
            break
        inner = _braced(text, match.end())
        out.append(text[pos : match.start()])
        if inner is None:
            pos = match.end()
            continue
        out.append(inner[0])
        pos = inner[1]
    out.append(text[pos:])
    return "".join(out)


def _frac_arg(text: str, pos: int) -> tuple[str, int] | None:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    if pos >= len(text):
        return None
    if text[pos] == "{":
        return _braced(text, pos)
    return (text[pos], pos + 1) if text[pos] != "}" else None


def _expand_fracs(text: str) -> str:
    """``\\frac{a}{b}``, ``\\dfrac``, ``\\tfrac``, ``\\frac12`` -> ``(a)/(b)``."""
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    for _ in range(text.count("\\frac")):
        start = text.rfind("\\frac")  # innermost-last first, so nested fracs expand
        num = _frac_arg(text, start + len("\\frac"))
        den = _frac_arg(text, num[1]) if num else None
        if num is None or den is None:
            return text
        # A leading space keeps a mixed number ``1\frac{1}{2}`` readable as ``1 (1)/(2)``.
        text = f"{text[:start]} ({num[0]})/({den[0]}){text[den[1] :]}"
    return text


def _strip_math_delimiters(text: str) -> str:
    for left, right in (("$$", "$$"), ("\\(", "\\)"), ("\\[", "\\]"), ("$", "$")):
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
            return text[len(left) : -len(right)].strip()
    return text


def _strip_assignment(text: str) -> str:
    # Only a single ``x = 5``: ``a = 1, b = 2`` must not collapse to ``2``.
    if _ASSIGN.match(text) and len(re.findall(r"=|\\approx", text)) == 1:
        return re.split(r"=|\\approx", text)[-1].strip()
    return text


def _strip_units(text: str) -> str:
    """Drop trailing unit words, but only when what remains reads as a number."""
    match = _UNIT_TAIL.search(text)
    if match and match.start() > 0 and parse_number(text[: match.start()]) is not None:
        return text[: match.start()].strip()
    return text


def normalize(answer: str) -> str:
    """Canonical text of an answer: LaTeX wrappers, currency, percent, units, thousands
    separators and assignments removed; fractions expanded to ``(a)/(b)``."""
    if len(answer) > _MAX_ANSWER_CHARS:
        return re.sub(r"\s+", " ", answer).strip()  # no answer is this long; keep it cheap
    text = _MINUS.sub("-", answer.strip())
    text = _PREFIX.sub("", text).strip()
    text = _strip_math_delimiters(text.rstrip(".").strip())
    text = _unwrap_macro_args(text, _BOXED)
    text = _unwrap_macro_args(text, _TEXT_MACROS)
    text = _DROP.sub("", text)
    text = _strip_assignment(text)
    text = _expand_fracs(text)
    text = _THOUSANDS.sub("", text)
    text = re.sub(r"\s+", " ", text).strip().rstrip(".").strip()
    return _strip_units(text)


# --------------------------------------------------------------------------- numbers

_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_PLAIN = re.compile(rf"({_DECIMAL})(?:[eE]([+-]?\d+))?")
_SCI = re.compile(rf"({_DECIMAL})\s*(?:\\times|\\cdot|×|\*|x)\s*10\s*\^\s*\{{?\s*([+-]?\d+)\s*\}}?")
_POW10 = re.compile(r"([+-]?)10\s*\^\s*\{?\s*([+-]?\d+)\s*\}?")
_RATIO = re.compile(r"([+-]?)\s*\(?\s*([^()/]+?)\s*\)?\s*/\s*\(?\s*([^()/]+?)\s*\)?")
_MIXED = re.compile(r"([+-]?)(\d+) \(?(\d+)\)?\s*/\s*\(?(\d+)\)?")


def _scaled(mantissa: str, exponent: str | None) -> Fraction | None:
    power = int(exponent) if exponent else 0
    if abs(power) > _MAX_EXPONENT:
        return None
    return Fraction(mantissa) * Fraction(10) ** power


def _simple_number(text: str) -> Fraction | None:
    """A decimal, ``1e3``, ``1.5 \\times 10^{3}`` or ``10^{3}``."""
    text = text.strip()
    text = text[1:-1].strip() if text.startswith("(") and text.endswith(")") else text
    if match := _PLAIN.fullmatch(text):
        return _scaled(match.group(1), match.group(2))
    if match := _SCI.fullmatch(text):
        return _scaled(match.group(1), match.group(2))
    if match := _POW10.fullmatch(text):
        value = _scaled("1", match.group(2))
        return -value if value is not None and match.group(1) == "-" else value
    return None


def _mixed(text: str) -> Fraction | None:
    """``2 1/2`` (a proper fraction after a whole number)."""
    if (match := _MIXED.fullmatch(text)) is None:
        return None
    whole, num, den = (int(match.group(i)) for i in (2, 3, 4))
    if den == 0 or num >= den:
        return None
    value = whole + Fraction(num, den)
    return -value if match.group(1) == "-" else value


def _ratio(text: str) -> Fraction | None:
    if (mixed := _mixed(text)) is not None:
        return mixed
    if (match := _RATIO.fullmatch(text)) is None:
        return None
    top, bottom = _simple_number(match.group(2)), _simple_number(match.group(3))
    if top is None or bottom is None or bottom == 0:
        return None
    return -(top / bottom) if match.group(1) == "-" else top / bottom


def parse_number(text: str) -> Fraction | None:
    """The exact value of a normalised numeric answer, or ``None`` if it is not one."""
    if len(text) > _MAX_NUMERIC_CHARS:
        return None
    try:
        value = _simple_number(text)
        return value if value is not None else _ratio(text.strip())
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _numbers_match(a: Fraction, b: Fraction) -> bool:
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False  # integers compare exactly, however large
    return abs(a - b) <= REL_TOL * max(abs(a), abs(b))


def _show(value: Fraction) -> str:
    """``18``, ``0.25`` or ``1/3``: a decimal when the value has a finite one."""
    den = value.denominator
    for factor in (2, 5):
        while den % factor == 0:
            den //= factor
    if den != 1 or value.denominator == 1:
        return str(value)
    places = 0
    while (value * 10**places).denominator != 1:
        places += 1
    digits = str(abs(value.numerator * 10**places // value.denominator)).rjust(places + 1, "0")
    sign = "-" if value < 0 else ""
    return f"{sign}{digits[:-places]}.{digits[-places:]}"


def _string_key(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


def grade(predicted: str | None, reference: str | None) -> GradeResult:
    """Compare a predicted answer with a reference answer (both already extracted).

    Numbers compare as exact fractions (integers exactly; other values within
    ``REL_TOL`` relative); anything else compares as normalised text, ignoring case
    and whitespace. A missing or empty side is wrong with method ``"none"``.
    """
    try:
        return _grade(predicted, reference)
    except Exception:  # grading must never fail a job on odd input
        return GradeResult(False, None, None, "none")


def _grade(predicted: str | None, reference: str | None) -> GradeResult:
    pred = normalize(predicted) if predicted is not None else ""
    ref = normalize(reference) if reference is not None else ""
    if not pred or not ref:
        shown_pred, shown_ref = pred[:_MAX_SHOWN_CHARS], ref[:_MAX_SHOWN_CHARS]
        return GradeResult(False, shown_pred or None, shown_ref or None, "none")
    pred_value, ref_value = parse_number(pred), parse_number(ref)
    if pred_value is not None and ref_value is not None:
        correct = _numbers_match(pred_value, ref_value)
        return GradeResult(correct, _show(pred_value), _show(ref_value), "numeric")
    pred_key, ref_key = _string_key(pred), _string_key(ref)
    shown_pred, shown_ref = pred_key[:_MAX_SHOWN_CHARS], ref_key[:_MAX_SHOWN_CHARS]
    return GradeResult(pred_key == ref_key, shown_pred, shown_ref, "string")
