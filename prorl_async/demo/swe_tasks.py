"""Small repositories with a planted bug and pytest tests (fail_to_pass / pass_to_pass)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from prorl_async.demo.policy import SweScript, marker

__all__ = ["REPOS", "TEST_COMMAND", "make"]

# Plugin autoloading costs ~1 s of CPU per run on a dev install; these repos need none.
TEST_COMMAND = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python -m pytest -q -p no:cacheprovider"


@dataclass(frozen=True)
class BuggyRepo:
    """A repository, its bug report, the failing and passing tests, the fix and a wrong fix."""

    files: dict[str, str]
    path: str
    issue: str
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    old: str
    fix: str
    wrong_fix: str


def _tests(module: str, body: str) -> str:
    return f"from {module} import *  # noqa: F403\n\n\n{body}"


REPOS = (
    BuggyRepo(
        files={
            "stats/__init__.py": "",
            "stats/core.py": (
                "def mean(xs):\n"
                '    """Arithmetic mean of a non-empty list."""\n'
                "    return sum(xs) / (len(xs) - 1)\n\n\n"
                "def median(xs):\n"
                "    s = sorted(xs)\n    mid = len(s) // 2\n"
                "    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2\n"
            ),
            "tests/test_core.py": _tests(
                "stats.core",
                "def test_mean_of_three():\n    assert mean([1, 2, 3]) == 2\n\n\n"
                "def test_mean_fraction():\n    assert mean([1, 2]) == 1.5\n\n\n"
                "def test_median_odd():\n    assert median([3, 1, 2]) == 2\n\n\n"
                "def test_median_even():\n    assert median([4, 1, 3, 2]) == 2.5\n",
            ),
        },
        path="stats/core.py",
        issue="mean() is wrong: mean([1, 2, 3]) returns 3.0 instead of 2.0.",
        fail_to_pass=[
            "tests/test_core.py::test_mean_of_three",
            "tests/test_core.py::test_mean_fraction",
        ],
        pass_to_pass=[
            "tests/test_core.py::test_median_odd",
            "tests/test_core.py::test_median_even",
        ],
        old="return sum(xs) / (len(xs) - 1)",
        fix="return sum(xs) / len(xs)",
        wrong_fix="return sum(xs) // len(xs)",
    ),
    BuggyRepo(
        files={
            "textkit/__init__.py": "",
            "textkit/words.py": (
                "def word_count(text):\n"
                '    """Number of whitespace-separated words."""\n'
                '    return len(text.split(" "))\n\n\n'
                "def capitalize_words(text):\n"
                '    return " ".join(w.capitalize() for w in text.split())\n'
            ),
            "tests/test_words.py": _tests(
                "textkit.words",
                'def test_count_extra_spaces():\n    assert word_count("a  b   c") == 3\n\n\n'
                'def test_count_empty():\n    assert word_count("") == 0\n\n\n'
                "def test_capitalize():\n"
                '    assert capitalize_words("hello big world") == "Hello Big World"\n',
            ),
        },
        path="textkit/words.py",
        issue='word_count() miscounts: word_count("a  b   c") is 6, it should be 3.',
        fail_to_pass=[
            "tests/test_words.py::test_count_extra_spaces",
            "tests/test_words.py::test_count_empty",
        ],
        pass_to_pass=["tests/test_words.py::test_capitalize"],
        old='return len(text.split(" "))',
        fix="return len(text.split())",
        wrong_fix='return len(text.strip().split(" "))',
    ),
    BuggyRepo(
        files={
            "ranges/__init__.py": "",
            "ranges/clamp.py": (
                "def clamp(x, lo, hi):\n"
                '    """x limited to the interval [lo, hi]."""\n'
                "    return max(lo, min(x, lo))\n\n\n"
                "def lerp(a, b, t):\n    return a + (b - a) * t\n"
            ),
            "tests/test_clamp.py": _tests(
                "ranges.clamp",
                "def test_inside():\n    assert clamp(5, 0, 10) == 5\n\n\n"
                "def test_above():\n    assert clamp(15, 0, 10) == 10\n\n\n"
                "def test_below():\n    assert clamp(-3, 0, 10) == 0\n\n\n"
                "def test_lerp():\n    assert lerp(0, 10, 0.5) == 5\n",
            ),
        },
        path="ranges/clamp.py",
        issue="clamp(5, 0, 10) returns 0; values inside the range should come back unchanged.",
        fail_to_pass=["tests/test_clamp.py::test_inside", "tests/test_clamp.py::test_above"],
        pass_to_pass=["tests/test_clamp.py::test_below", "tests/test_clamp.py::test_lerp"],
        old="return max(lo, min(x, lo))",
        fix="return max(lo, min(x, hi))",
        wrong_fix="return max(lo, min(x, hi - 1))",
    ),
    BuggyRepo(
        files={
            "shop/__init__.py": "",
            "shop/cart.py": (
                "def total(items):\n"
                '    """Total price of (unit_price, quantity) pairs."""\n'
                "    return sum(price for price, qty in items)\n\n\n"
                "def apply_discount(amount, percent):\n"
                "    return round(amount * (100 - percent) / 100, 2)\n"
            ),
            "tests/test_cart.py": _tests(
                "shop.cart",
                "def test_total_counts_quantities():\n"
                "    assert total([(2.5, 2), (1.0, 3)]) == 8.0\n\n\n"
                "def test_total_empty():\n    assert total([]) == 0\n\n\n"
                "def test_discount():\n    assert apply_discount(80.0, 25) == 60.0\n",
            ),
        },
        path="shop/cart.py",
        issue="total() ignores quantities: two items at 2.5 should cost 5.0, not 2.5.",
        fail_to_pass=["tests/test_cart.py::test_total_counts_quantities"],
        pass_to_pass=["tests/test_cart.py::test_total_empty", "tests/test_cart.py::test_discount"],
        old="return sum(price for price, qty in items)",
        fix="return sum(price * qty for price, qty in items)",
        wrong_fix="return sum(price + qty for price, qty in items)",
    ),
)


def make(key: str, rng: random.Random, wrong: bool) -> tuple[dict[str, Any], SweScript]:
    """A ``swe`` instance and the policy's script (the planted bug's fix, or a wrong one)."""
    repo = rng.choice(REPOS)
    instance = {
        "repo": {"files": dict(repo.files)},
        "problem_statement": f"{marker(key)} {repo.issue}",
        "test_command": TEST_COMMAND,
        "fail_to_pass": list(repo.fail_to_pass),
        "pass_to_pass": list(repo.pass_to_pass),
        "max_turns": 10,
    }
    new = repo.wrong_fix if wrong else repo.fix
    script = SweScript(path=repo.path, old=repo.old, new=new, test_command=TEST_COMMAND)
    return instance, script
