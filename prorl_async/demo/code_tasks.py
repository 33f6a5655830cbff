"""Code problems in both styles the ``code`` task takes, with hidden tests.

Each family has a reference implementation (run here, on the host, to compute the hidden
tests' expected outputs), the solution the scripted model writes, and a buggy variant it
writes when it errs. Hidden cases always include one the bug gets wrong.
"""

from __future__ import annotations

import random
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prorl_async.demo.policy import SOLUTION_FILE, CodeScript, marker

__all__ = ["FUNCTION_FAMILIES", "STDIO_FAMILIES", "make_function", "make_stdio"]

_HIDDEN_CASES = 4


@dataclass(frozen=True)
class StdioFamily:
    statement: str
    solution: str
    buggy: str
    reference: Callable[[str], str]
    case: Callable[[random.Random], str]
    tricky: str  # an input the buggy solution gets wrong


def _ints(rng: random.Random, lo: int, hi: int) -> str:
    xs = [rng.randint(lo, hi) for _ in range(rng.randint(3, 8))]
    return f"{len(xs)}\n{' '.join(map(str, xs))}\n"


def _nums(text: str) -> list[int]:
    return list(map(int, text.split("\n")[1].split()))


_READ = "n = int(input())\nxs = list(map(int, input().split()))\n"
_WORDS = ["Apple", "orange", "Umbrella", "sky", "idea", "cloud", "Eagle", "tree", "moon"]
STDIO_FAMILIES = (
    StdioFamily(
        "Read n, then n integers on one line. Print their sum.",
        _READ + "print(sum(xs))\n",
        _READ + "print(sum(xs[1:]))\n",
        lambda s: str(sum(_nums(s))),
        lambda rng: _ints(rng, 1, 99),
        "3\n5 1 2\n",
    ),
    StdioFamily(
        "Read n, then n integers on one line. Print the largest minus the smallest.",
        _READ + "print(max(xs) - min(xs))\n",
        _READ + "print(max(xs) - min(xs) + 1)\n",
        lambda s: str(max(_nums(s)) - min(_nums(s))),
        lambda rng: _ints(rng, -50, 50),
        "2\n4 9\n",
    ),
    StdioFamily(
        "Read one line of words. Print how many vowels (a, e, i, o, u, any case) it has.",
        "s = input()\nprint(sum(c in 'aeiou' for c in s.lower()))\n",
        "s = input()\nprint(sum(c in 'aeiou' for c in s))\n",
        lambda s: str(sum(c in "aeiou" for c in s.strip().lower())),
        lambda rng: " ".join(rng.sample(_WORDS, 4)) + "\n",
        "Apple Eagle\n",
    ),
    StdioFamily(
        "Read one line of words. Print the words in reverse order, separated by one space.",
        "print(' '.join(reversed(input().split())))\n",
        "print(input()[::-1])\n",
        lambda s: " ".join(reversed(s.split())),
        lambda rng: " ".join(rng.sample(_WORDS, 3)) + "\n",
        "sky tree\n",
    ),
)


@dataclass(frozen=True)
class FunctionFamily:
    entry_point: str
    prompt: str
    solution: str
    buggy: str
    reference: Callable[[Any], Any]
    case: Callable[[random.Random], Any]
    tricky: Any


def _running_max(xs: list[int]) -> list[int]:
    out: list[int] = []
    for x in xs:
        out.append(x if not out else max(out[-1], x))
    return out


def _fizz(n: int) -> int:
    return sum(1 for k in range(1, n) if k % 3 == 0 or k % 5 == 0)


def _palindrome(s: str) -> bool:
    clean = [c.lower() for c in s if c.isalnum()]
    return clean == clean[::-1]


FUNCTION_FAMILIES = (
    FunctionFamily(
        "running_max",
        'def running_max(xs: list[int]) -> list[int]:\n    """The largest value seen so far '
        'at each position: running_max([1, 3, 2]) == [1, 3, 3]."""\n',
        "def running_max(xs):\n    out = []\n    for x in xs:\n"
        "        out.append(x if not out else max(out[-1], x))\n    return out\n",
        "def running_max(xs):\n    out, best = [], 0\n    for x in xs:\n"
        "        best = max(best, x)\n        out.append(best)\n    return out\n",
        _running_max,
        lambda rng: [rng.randint(-20, 20) for _ in range(rng.randint(2, 7))],
        [-5, -7, -1],
    ),
    FunctionFamily(
        "count_multiples",
        'def count_multiples(n: int) -> int:\n    """How many k with 1 <= k < n are divisible '
        'by 3 or 5: count_multiples(10) == 4."""\n',
        "def count_multiples(n):\n"
        "    return sum(1 for k in range(1, n) if k % 3 == 0 or k % 5 == 0)\n",
        "def count_multiples(n):\n"
        "    return sum(1 for k in range(1, n + 1) if k % 3 == 0 or k % 5 == 0)\n",
        _fizz,
        lambda rng: rng.randint(1, 60),
        15,
    ),
    FunctionFamily(
        "is_palindrome",
        'def is_palindrome(s: str) -> bool:\n    """True when s reads the same backwards, '
        'ignoring case and anything but letters and digits."""\n',
        "def is_palindrome(s):\n    clean = [c.lower() for c in s if c.isalnum()]\n"
        "    return clean == clean[::-1]\n",
        "def is_palindrome(s):\n    return s.lower() == s.lower()[::-1]\n",
        _palindrome,
        lambda rng: rng.choice(["Level", "abc", "No lemon, no melon", "Was it a cat I saw?", "xy"]),
        "A man, a plan, a canal: Panama",
    ),
)


def _comment(key: str) -> str:
    return f"# {marker(key)}\n"


def make_stdio(key: str, rng: random.Random, wrong: bool) -> tuple[dict[str, Any], CodeScript]:
    """A stdin/stdout instance (example shown, hidden tests kept) and the policy's script."""
    fam = rng.choice(STDIO_FAMILIES)
    example = fam.case(rng)
    inputs = [fam.tricky] + [fam.case(rng) for _ in range(_HIDDEN_CASES - 1)]
    tests = [{"input": i, "output": fam.reference(i) + "\n"} for i in inputs]
    problem = (
        f"{marker(key)} {fam.statement}\n\nExample input:\n{example}\n"
        f"Example output:\n{fam.reference(example)}\n"
    )
    command = f"printf %s {shlex.quote(example)} | python {SOLUTION_FILE}"
    script = CodeScript(solution=fam.buggy if wrong else fam.solution, example_command=command)
    return {"problem": problem, "tests": tests, "time_limit_s": 10.0}, script


def make_function(key: str, rng: random.Random, wrong: bool) -> tuple[dict[str, Any], CodeScript]:
    """A HumanEval-style instance (``check(candidate)`` hidden) and the policy's script."""
    fam = rng.choice(FUNCTION_FAMILIES)
    args = [fam.tricky] + [fam.case(rng) for _ in range(_HIDDEN_CASES - 1)]
    lines = [f"    assert candidate({a!r}) == {fam.reference(a)!r}" for a in args]
    test = "def check(candidate):\n" + "\n".join(lines) + "\n"
    example = fam.case(rng)
    call = f"from solution import {fam.entry_point}; print({fam.entry_point}({example!r}))"
    script = CodeScript(
        solution=fam.buggy if wrong else fam.solution,
        example_command=f"python -c {shlex.quote(call)}",
    )
    instance = {"prompt": _comment(key) + fam.prompt, "test": test, "entry_point": fam.entry_point}
    return instance, script
