"""Unit tests for math answer extraction and normalisation, one rule at a time."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from prorl_async.grading.math import (
    GradeResult,
    extract_answer,
    grade,
    last_boxed,
    normalize,
    parse_number,
    reference_answer,
)


def accepts(predicted: str, reference: str) -> bool:
    return grade(predicted, reference).correct


# --------------------------------------------------------------------------- extraction


def test_finish_answer_wins_over_text() -> None:
    assert extract_answer("so \\boxed{3}", "7") == "7"


def test_finish_answer_boxed_is_unwrapped() -> None:
    assert extract_answer("", "The answer is \\boxed{12}.") == "12"


def test_blank_finish_answer_falls_back_to_text() -> None:
    assert extract_answer("thus \\boxed{5}", "   ") == "5"


def test_nested_braces_in_boxed() -> None:
    assert extract_answer("\\boxed{\\frac{1}{\\sqrt{2}}}", None) == "\\frac{1}{\\sqrt{2}}"


def test_multiple_boxed_takes_last() -> None:
    assert extract_answer("first \\boxed{1}, then \\boxed{2}, finally \\boxed{3}.", None) == "3"


def test_unbalanced_last_boxed_falls_back_to_previous() -> None:
    assert extract_answer("\\boxed{4} and then \\boxed{5", None) == "4"


def test_boxed_without_braces() -> None:
    assert last_boxed("so the answer is \\boxed 42 .") == "42"


def test_fbox() -> None:
    assert extract_answer("\\fbox{9}", None) == "9"


def test_gsm8k_hash_line() -> None:
    assert extract_answer("He has 3+4=7 apples.\n#### 7", None) == "7"


def test_last_hash_line_wins() -> None:
    assert extract_answer("#### 1\nwait, no\n#### 2\n", None) == "2"


def test_boxed_beats_hash_line() -> None:
    assert extract_answer("#### 1\n\\boxed{2}", None) == "2"


@pytest.mark.parametrize("text", ["", "no answer here", "#### ", "\\boxed{", "\\boxed {1"])
def test_nothing_to_extract(text: str) -> None:
    assert extract_answer(text, None) is None


def test_reference_full_solution() -> None:
    assert reference_answer("2+3=<<2+3=5>>5\nSo 5 more.\n#### 1,250") == "1,250"


def test_reference_plain_answer() -> None:
    assert reference_answer("  42 ") == "42"


def test_reference_worked_solution_with_boxed() -> None:
    assert reference_answer("We get $x = \\boxed{\\frac{3}{4}}$.") == "\\frac{3}{4}"


# --------------------------------------------------------------------------- normalisation rules


@pytest.mark.parametrize(
    ("predicted", "reference"),
    [
        ("1,000", "1000"),  # thousands separators
        ("1,234,567.5", "1234567.5"),
        ("1{,}000", "1000"),  # LaTeX thousands separator
        ("1\\,000", "1000"),
        ("$18", "18"),  # currency
        ("\\$18.00", "18"),
        ("€5", "5"),
        ("45%", "45"),  # percent
        ("45\\%", "45"),
        ("18 dollars", "18"),  # unit words
        ("50 cents", "50"),
        ("3 hours", "3"),
        ("15 minutes", "15"),
        ("100 meters", "100"),
        ("12 cm", "12"),
        ("12cm", "12"),
        ("7 kg", "7"),
        ("5 pounds", "5"),
        ("26 miles", "26"),
        ("12 apples", "12"),
        ("$18 per hour", "18"),
        ("60 km/h", "60"),
        ("20 sq. ft", "20"),
        ("9 m^2", "9"),
        ("90^\\circ", "90"),
        ("90°", "90"),
        ("3/4", "0.75"),  # fractions
        ("-3/4", "-0.75"),
        ("(3)/(4)", "0.75"),
        ("\\frac{3}{4}", "3/4"),
        ("\\dfrac{3}{4}", "0.75"),
        ("\\tfrac{3}{4}", "0.75"),
        ("\\frac12", "0.5"),
        ("\\frac{1}2", "0.5"),
        ("-\\frac{1}{2}", "-0.5"),
        ("\\frac{-1}{2}", "-0.5"),
        ("2 1/2", "2.5"),  # mixed numbers
        ("2\\frac{1}{2}", "5/2"),
        ("0.5", ".5"),  # decimals
        ("18.0", "18"),  # trailing .0
        ("18.000", "18"),
        ("18.", "18"),
        ("1e3", "1000"),  # scientific notation
        ("1.5E-2", "0.015"),
        ("1.5 \\times 10^{3}", "1500"),
        ("1.5\\cdot10^3", "1500"),
        ("2 x 10^3", "2000"),
        ("10^{6}", "1000000"),
        ("-10", "−10"),  # unicode minus
        ("–4", "-4"),  # en dash used as a minus
        ("+5", "5"),
        ("\\text{5 apples}", "5"),  # \text
        ("\\textbf{7}", "7"),
        ("\\mathrm{8}", "8"),
        ("\\left(3\\right)", "3"),  # \left \right
        ("$7$", "7"),  # surrounding math delimiters
        ("$$7$$", "7"),
        ("\\(7\\)", "7"),
        ("\\[7\\]", "7"),
        ("x = 5", "5"),  # assignments
        ("y=\\frac{1}{2}", "0.5"),
        ("f(x) = 3", "3"),
        ("x \\approx 2.5", "2.5"),
        ("The answer is 42.", "42"),
        ("Answer: 42", "42"),
        ("\\boxed{42}", "42"),
        ("0.30000000000000004", "0.3"),  # float noise within the relative tolerance
        ("0.333333333333", "\\frac{1}{3}"),
    ],
)
def test_equivalent_forms_are_accepted(predicted: str, reference: str) -> None:
    result = grade(predicted, reference)
    assert result.correct, result
    assert result.method == "numeric"


@pytest.mark.parametrize(
    ("predicted", "reference"),
    [
        ("1,2", "12"),  # a comma not in thousands position is not a separator
        ("1,0000", "10000"),
        ("19", "18"),
        ("1.8", "18"),
        ("-18", "18"),
        ("0.333", "1/3"),  # too coarse for the tolerance
        ("1000000000001", "1000000000000"),  # integers compare exactly, however large
        ("16 - 3 - 4", "9"),  # arithmetic is not evaluated
        ("2x", "2"),  # a variable is not a unit
        ("5 apples and 3 oranges", "5"),
        ("a = 1, b = 2", "2"),
        ("1e3", "1"),  # the e of an exponent is not a unit word
        ("3/0", "3"),
    ],
)
def test_different_answers_are_rejected(predicted: str, reference: str) -> None:
    assert not accepts(predicted, reference)


@pytest.mark.parametrize(
    ("predicted", "reference"),
    [
        ("Yes", "yes"),
        ("\\text{(B)}", "(B)"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("\\sqrt{2}", "\\sqrt{2}"),
        ("\\frac{\\pi}{2}", "\\dfrac{\\pi}{2}"),
    ],
)
def test_non_numeric_answers_compare_as_normalised_strings(predicted: str, reference: str) -> None:
    result = grade(predicted, reference)
    assert result.correct, result
    assert result.method == "string"


def test_non_numeric_mismatch() -> None:
    assert grade("\\sqrt{3}", "\\sqrt{2}") == GradeResult(False, "\\sqrt{3}", "\\sqrt{2}", "string")


def test_fractions_compare_exactly() -> None:
    assert parse_number(normalize("\\frac{2}{6}")) == Fraction(1, 3)
    assert accepts("2/6", "\\frac{1}{3}")


def test_numeric_result_shows_canonical_values() -> None:
    assert grade("$1,250.50", "1250.5") == GradeResult(True, "1250.5", "1250.5", "numeric")
    assert grade("\\frac{1}{3}", "1/3") == GradeResult(True, "1/3", "1/3", "numeric")


@pytest.mark.parametrize(
    ("predicted", "reference"), [(None, "5"), ("", "5"), ("  ", "5"), ("5", "")]
)
def test_missing_side_is_wrong_with_method_none(predicted: str | None, reference: str) -> None:
    result = grade(predicted, reference)
    assert not result.correct
    assert result.method == "none"


def test_huge_exponent_is_not_expanded() -> None:
    assert parse_number("1e999999999") is None
    assert not accepts("1e999999999", "1")


def test_overlong_answer_is_cheap_and_wrong() -> None:
    assert not accepts("5 " + "ab " * 5000, "5")


_ALPHABET = "0123456789.,-+/\\{}()[]$%^_ =eExabcfrtdsqo \u2212\u00b0\n"
_TOKENS = ["\\frac", "\\boxed", "\\text", "\\left", "\\right", "\\times", "10^", "{", "}", "####"]


def test_never_raises_on_random_input() -> None:
    rng = random.Random(1234)
    for _ in range(5000):
        pieces = [rng.choice(_TOKENS) if rng.random() < 0.2 else rng.choice(_ALPHABET)]
        pieces += [rng.choice(_ALPHABET) for _ in range(rng.randrange(0, 30))]
        rng.shuffle(pieces)
        text = "".join(pieces)
        # normalize/parse_number have no catch-all of their own, so this exercises them.
        parse_number(normalize(text))
        assert grade(text, text).method in ("numeric", "string", "none")
        extract_answer(text, None)
        reference_answer(text)
