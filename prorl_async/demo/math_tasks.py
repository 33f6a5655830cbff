"""Math word problems with known answers (GSM8K-like), drawn from a few templates."""

from __future__ import annotations

import random
from collections.abc import Callable

from prorl_async.demo.policy import MathScript, marker

__all__ = ["make"]

# (problem text, python expression the model runs, its value)
Template = Callable[[random.Random], tuple[str, str, int]]


def _cookies(rng: random.Random) -> tuple[str, str, int]:
    trays, per, sold = rng.randint(3, 9), rng.randint(6, 24), rng.randint(5, 40)
    text = (
        f"A baker makes {trays} trays of {per} cookies each and sells {sold} cookies. "
        "How many cookies are left?"
    )
    return text, f"{trays} * {per} - {sold}", trays * per - sold


def _marbles(rng: random.Random) -> tuple[str, str, int]:
    bags, each = rng.randint(2, 9), rng.randint(3, 12)
    start = rng.randint(5, 60)
    if (start + bags * each) % 2:
        start += 1
    text = (
        f"Tom has {start} marbles. He buys {bags} bags with {each} marbles in each bag, then "
        "gives away half of all his marbles. How many marbles does he have now?"
    )
    return text, f"({start} + {bags} * {each}) // 2", (start + bags * each) // 2


def _train(rng: random.Random) -> tuple[str, str, int]:
    v, t, w, u = rng.randint(40, 120), rng.randint(2, 5), rng.randint(30, 90), rng.randint(1, 4)
    text = (
        f"A train travels at {v} km/h for {t} hours, then at {w} km/h for {u} hours. "
        "How many kilometres does it travel in total?"
    )
    return text, f"{v} * {t} + {w} * {u}", v * t + w * u


def _change(rng: random.Random) -> tuple[str, str, int]:
    price, count = rng.randint(2, 9), rng.randint(2, 8)
    note = next(n for n in (20, 50, 100) if n > price * count)
    text = (
        f"Pens cost ${price} each. Ana buys {count} pens and pays with a ${note} note. "
        "How many dollars of change does she get?"
    )
    return text, f"{note} - {price} * {count}", note - price * count


TEMPLATES: tuple[Template, ...] = (_cookies, _marbles, _train, _change)


def make(key: str, rng: random.Random, wrong: bool) -> tuple[str, str, MathScript]:
    """(problem with its marker, reference answer, the policy's script)."""
    text, expr, value = rng.choice(TEMPLATES)(rng)
    problem = f"{marker(key)} {text}"
    return problem, str(value), MathScript(code=f"print({expr})", wrong=wrong)
